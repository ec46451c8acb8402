//! Domain events: every mutation of a session is one of these.
//!
//! A session is exactly the fold of its events ([`super::AgentSession::replay`]).
//! Events are persisted (MessagePack through [`super::codec`]) so they are
//! only ever extended: new variants and new optional fields, never renames.

use serde::{Deserialize, Serialize};

use crate::transcript::Json;

use super::definition::{AgentDefinition, ModelConfig};
use super::id::SessionId;
use super::info::SessionStatus;
use super::state::{AgentState, ExecutionStatus, Task};
use crate::transcript::{Entry, EntryId, Usage};

/// One change to a session.
///
/// Decoded without buffering (see `transcript::tagged`); the twin
/// `SessionEventDe` below lists the same variants.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum SessionEvent {
    /// The first event of every session: its identity, definition and
    /// initial state (the seed state, or the copied state of a fork).
    Created {
        id: SessionId,
        parent_id: Option<SessionId>,
        agent_name: String,
        label: String,
        created_at_ms: i64,
        definition: Box<AgentDefinition>,
        state: Box<AgentState>,
    },
    /// An entry was appended to the transcript and became the leaf.
    EntryAppended {
        entry: Entry,
    },
    /// The transcript leaf moved (navigation).
    LeafMoved {
        leaf: Option<EntryId>,
    },
    StatusChanged {
        from: SessionStatus,
        to: SessionStatus,
    },
    SystemPromptChanged {
        system_prompt: String,
    },
    ModelChanged {
        model: ModelConfig,
    },
    MetadataWritten {
        key: String,
        value: Json,
    },
    MetadataRemoved {
        key: String,
    },
    /// The whole task list after an update.
    TaskUpdated {
        tasks: Vec<Task>,
    },
    /// The state was reset for the next execution
    /// (see [`AgentState::for_next_execution`]).
    StateCleared,
    /// An execution began; `execution` is its 1-based number.
    ExecutionStarted {
        execution: u64,
    },
    ExecutionFinished {
        status: ExecutionStatus,
        usage: Usage,
        error: Option<String>,
    },
    /// The transcript was replaced by a rewrite as generation `generation`
    /// (whole-transcript form, kept readable; new rewrites are written as
    /// [`SessionEvent::TranscriptRewritten`]).
    HistoryRewritten {
        generation: u64,
        entries: Vec<Entry>,
        leaf: Option<EntryId>,
    },
    /// A rewrite as a delta (the form every rewrite is written in now;
    /// `HistoryRewritten` stays readable): generation `generation` of the
    /// transcript keeps every entry not named here unchanged, replaces
    /// `written` (same ids, new content and possibly a repaired parent),
    /// relinks `reparented` entries to a new parent without re-logging
    /// their payload, drops `removed`, and moves the leaf to `leaf`. Its
    /// size is proportional to what changed, not to the transcript.
    TranscriptRewritten {
        generation: u64,
        written: Vec<Entry>,
        reparented: Vec<(EntryId, Option<EntryId>)>,
        removed: Vec<EntryId>,
        leaf: Option<EntryId>,
    },
    /// This session was forked from `from` (whole, or at `at_entry`).
    /// Follows `Created` in a fork's first commit.
    Forked {
        from: SessionId,
        at_entry: Option<EntryId>,
    },
    /// The session was deleted (tombstoned). Terminal.
    Deleted,
    /// A save that changed nothing but must still advance the version.
    Touched,
}

// The externally tagged twin of `SessionEvent` (same variants, checked by
// the compiler), decoding the fields that follow the tag.
#[derive(Deserialize)]
#[serde(remote = "SessionEvent", rename_all = "snake_case")]
enum SessionEventDe {
    Created {
        id: SessionId,
        parent_id: Option<SessionId>,
        agent_name: String,
        label: String,
        created_at_ms: i64,
        definition: Box<AgentDefinition>,
        state: Box<AgentState>,
    },
    EntryAppended {
        entry: Entry,
    },
    LeafMoved {
        leaf: Option<EntryId>,
    },
    StatusChanged {
        from: SessionStatus,
        to: SessionStatus,
    },
    SystemPromptChanged {
        system_prompt: String,
    },
    ModelChanged {
        model: ModelConfig,
    },
    MetadataWritten {
        key: String,
        value: Json,
    },
    MetadataRemoved {
        key: String,
    },
    TaskUpdated {
        tasks: Vec<Task>,
    },
    StateCleared,
    ExecutionStarted {
        execution: u64,
    },
    ExecutionFinished {
        status: ExecutionStatus,
        usage: Usage,
        error: Option<String>,
    },
    HistoryRewritten {
        generation: u64,
        entries: Vec<Entry>,
        leaf: Option<EntryId>,
    },
    TranscriptRewritten {
        generation: u64,
        written: Vec<Entry>,
        reparented: Vec<(EntryId, Option<EntryId>)>,
        removed: Vec<EntryId>,
        leaf: Option<EntryId>,
    },
    Forked {
        from: SessionId,
        at_entry: Option<EntryId>,
    },
    Deleted,
    Touched,
}

crate::transcript::tagged_by!(
    SessionEvent,
    SessionEventDe,
    "type",
    "a session event tagged by `type`"
);

impl SessionEvent {
    /// A short stable name of the event kind (`created`, `entry_appended`, ...).
    pub fn kind(&self) -> &'static str {
        match self {
            SessionEvent::Created { .. } => "created",
            SessionEvent::EntryAppended { .. } => "entry_appended",
            SessionEvent::LeafMoved { .. } => "leaf_moved",
            SessionEvent::StatusChanged { .. } => "status_changed",
            SessionEvent::SystemPromptChanged { .. } => "system_prompt_changed",
            SessionEvent::ModelChanged { .. } => "model_changed",
            SessionEvent::MetadataWritten { .. } => "metadata_written",
            SessionEvent::MetadataRemoved { .. } => "metadata_removed",
            SessionEvent::TaskUpdated { .. } => "task_updated",
            SessionEvent::StateCleared => "state_cleared",
            SessionEvent::ExecutionStarted { .. } => "execution_started",
            SessionEvent::ExecutionFinished { .. } => "execution_finished",
            SessionEvent::HistoryRewritten { .. } => "history_rewritten",
            SessionEvent::TranscriptRewritten { .. } => "transcript_rewritten",
            SessionEvent::Forked { .. } => "forked",
            SessionEvent::Deleted => "deleted",
            SessionEvent::Touched => "touched",
        }
    }
}
