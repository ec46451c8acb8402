//! Sessions: identity, definition and state, event-sourced.
//!
//! An [`AgentSession`] is a header ([`AgentSessionInfo`]), an
//! [`AgentDefinition`] and an [`AgentState`]. It is exactly the fold of its [`SessionEvent`]s: every
//! mutation method validates its input, applies the event through the same
//! pure fold used for replay ([`AgentSession::apply`]), and records the
//! event on the session's *pending* list. A store commits the pending
//! events (event-sourced stores) or the folded session (whole-state stores)
//! and hands back a session with an empty pending list.
//!
//! Versions and `updated_at_ms` belong to the store: `create` persists
//! version 1, every `save` +1 (see [`crate::store::SessionStore`]).
//!
//! The status policy is documented on [`SessionStatus`].

pub mod codec;
mod definition;
mod events;
mod fold;
mod id;
mod info;
pub(crate) mod link;
mod state;

use serde::{Deserialize, Serialize};

pub(crate) use codec::encoded_event_len;
pub use codec::{
    decode_appended_entry, decode_event, decode_snapshot, encode_event, encode_snapshot,
    CodecError, EVENT_SCHEMA, MAX_CODEC_INPUT, SNAPSHOT_SCHEMA,
};
pub use definition::{AgentDefinition, Budget, ModelConfig};
pub use events::SessionEvent;
pub use fold::FoldError;
pub(crate) use fold::{check_rewrite_with, Need};
pub use id::{InvalidSessionId, SessionId, SESSION_ID_LEN_MAX};
pub use info::{AgentSessionInfo, SessionInfoList, SessionStatus, SkippedSession, UnknownStatus};
pub use link::{HistoryReader, HISTORY_PAGE_MAX};
pub use state::{
    validate_tasks, AgentState, ExecutionStatus, Task, TaskListError, TaskStatus,
    MAX_METADATA_KEY_LEN, MAX_TASKS, MAX_TASK_DESCRIPTION_LEN, MAX_TASK_ID_LEN,
};

use crate::transcript::{
    now_ms, Entry, EntryId, EntryKind, Json, Navigation, RewritePlan, Transcript, TranscriptError,
    Usage,
};

/// A session mutation was refused. Nothing was recorded.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum SessionError {
    #[error("session {id} is deleted; deleted sessions accept no changes")]
    Deleted { id: SessionId },
    #[error("session {id}: status change {from} -> {to} is not allowed")]
    InvalidTransition {
        id: SessionId,
        from: SessionStatus,
        to: SessionStatus,
    },
    #[error("session {id}: transcript: {source}")]
    Transcript {
        id: SessionId,
        source: TranscriptError,
    },
    #[error("session {id}: task list: {source}")]
    Tasks {
        id: SessionId,
        source: TaskListError,
    },
    #[error("session {id}: invalid metadata key: {reason}")]
    InvalidMetadataKey { id: SessionId, reason: &'static str },
    #[error("session {id}: entry {entry} is not in the transcript")]
    UnknownEntry { id: SessionId, entry: EntryId },
    #[error("session {id}: {source}")]
    Fold { id: SessionId, source: FoldError },
    /// Reading entries beyond a bounded session's working set failed.
    #[error("session {id}: reading the stored history failed: {reason}")]
    History { id: SessionId, reason: String },
}

/// One persistent agent conversation: header, definition and state, plus
/// the events recorded since it was loaded (the pending list).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AgentSession {
    info: AgentSessionInfo,
    definition: AgentDefinition,
    state: AgentState,
    #[serde(skip)]
    pending: Vec<SessionEvent>,
    /// The runtime's link while an execute holds the session (see
    /// [`link`]); ignored by equality and serialization.
    #[serde(skip)]
    link: link::Link,
}

/// Builds fresh sessions from a definition (the seed's `SessionFactory`).
///
/// Rules: the definition's system prompt overrides the seed state's when
/// it is non-empty (an empty definition prompt keeps the seed's); likewise
/// the definition's model overrides the seed's unless it is the empty
/// default; the label is the definition's label, falling back to its name.
#[derive(Clone, Copy, Debug, Default)]
pub struct SessionFactory;

impl SessionFactory {
    /// A fresh root session (version 0) whose pending list holds `Created`.
    pub fn create(definition: AgentDefinition, seed: Option<AgentState>) -> AgentSession {
        AgentSession::new(definition, seed)
    }
}

impl AgentSession {
    /// A fresh root session (version 0, status Active) whose pending list
    /// holds its `Created` event. See [`SessionFactory`] for the rules.
    pub fn new(definition: AgentDefinition, seed: Option<AgentState>) -> AgentSession {
        Self::new_with_id(SessionId::generate(), definition, seed)
    }

    /// Like [`AgentSession::new`], with a caller-chosen (validated) id:
    /// for importers and applications that name their sessions.
    pub fn new_with_id(
        id: SessionId,
        definition: AgentDefinition,
        seed: Option<AgentState>,
    ) -> AgentSession {
        let mut state = seed.unwrap_or_default();
        if !definition.system_prompt.is_empty() {
            state.system_prompt = definition.system_prompt.clone();
        }
        if definition.model != ModelConfig::default() {
            state.model = definition.model.clone();
        }
        let now = now_ms();
        Self::from_created_event(SessionEvent::Created {
            id,
            parent_id: None,
            agent_name: definition.name.clone(),
            label: definition.effective_label(),
            created_at_ms: now,
            definition: Box::new(definition),
            state: Box::new(state),
        })
    }

    fn from_created_event(ev: SessionEvent) -> AgentSession {
        // `fold::created` only fails for non-Created events.
        match fold::session_from_created(&ev) {
            Ok(mut s) => {
                s.pending.push(ev);
                s
            }
            Err(_) => unreachable!("from_created_event is only called with Created"),
        }
    }

    /// A new session forked from this one: a fresh id, `parent_id` = this
    /// session, the same definition, and this state with the transcript cut
    /// to the root→`at` path (or the whole transcript when `at` is `None`).
    /// Its pending list holds `Created` and `Forked`; version 0, status
    /// Active. Deleted sessions cannot be forked. Copies only what the fork
    /// keeps (the path's entries, not the whole transcript); see
    /// [`AgentSession::into_fork`] to move them instead.
    ///
    /// A bounded session forks at an entry by reading the path through the
    /// store's index; forking it whole needs the whole transcript, which
    /// it does not hold: load the session whole for that.
    pub fn fork(&self, at: Option<&EntryId>) -> Result<AgentSession, SessionError> {
        self.guard()?;
        if self.is_bounded() {
            let Some(at) = at else {
                return Err(SessionError::Fold {
                    id: self.info.id.clone(),
                    source: FoldError::BadRewrite {
                        reason: "a bounded session cannot be forked whole; load it whole".into(),
                    },
                });
            };
            let mut t = Transcript::new();
            t.replace_all(self.path_to(at)?, Some(at.clone()));
            return self.fork_with(t, Some(at));
        }
        let transcript = match at {
            None => self.state.transcript.clone(),
            Some(at) => {
                let mut t = Transcript::new();
                t.replace_all(self.path_to(at)?, Some(at.clone()));
                t
            }
        };
        self.fork_with(transcript, at)
    }

    /// [`AgentSession::fork`] consuming this session: the fork's transcript
    /// entries are moved out of it instead of copied (what a caller that
    /// loaded the source only to fork it wants).
    pub fn into_fork(mut self, at: Option<&EntryId>) -> Result<AgentSession, SessionError> {
        self.guard()?;
        if self.is_bounded() {
            return self.fork(at);
        }
        let transcript = std::mem::take(&mut self.state.transcript);
        let transcript = match at {
            None => transcript,
            Some(at) => transcript
                .into_complete_path(at)
                .map_err(|e| self.path_error(at, e))?,
        };
        self.fork_with(transcript, at)
    }

    /// The fork of this session with `transcript` (already cut).
    fn fork_with(
        &self,
        transcript: Transcript,
        at: Option<&EntryId>,
    ) -> Result<AgentSession, SessionError> {
        let s = &self.state;
        // Every field named: a new state field must decide how it forks.
        let state = AgentState {
            transcript,
            generation: s.generation,
            metadata: s.metadata.clone(),
            system_prompt: s.system_prompt.clone(),
            model: s.model.clone(),
            execution_count: s.execution_count,
            execution: ExecutionStatus::Pending,
            last_error: None,
            usage: Usage::default(),
            total_usage: s.total_usage,
            tasks: s.tasks.clone(),
        };
        let mut f = Self::from_created_event(SessionEvent::Created {
            id: SessionId::generate(),
            parent_id: Some(self.info.id.clone()),
            agent_name: self.info.agent_name.clone(),
            label: self.info.label.clone(),
            created_at_ms: now_ms(),
            definition: Box::new(self.definition.clone()),
            state: Box::new(state),
        });
        f.record(SessionEvent::Forked {
            from: self.info.id.clone(),
            at_entry: at.cloned(),
        })?;
        Ok(f)
    }

    /// A path error of the transcript as this session reports it.
    fn path_error(&self, at: &EntryId, e: TranscriptError) -> SessionError {
        SessionError::UnknownEntry {
            id: self.info.id.clone(),
            entry: match e {
                TranscriptError::UnknownEntry(missing) => missing,
                // A cycle can only come from a corrupt document.
                _ => at.clone(),
            },
        }
    }

    /// The entries on the path root → `at`, root first. Errors with
    /// `UnknownEntry` naming `at` when it is absent (or its parents form a
    /// cycle), or naming the first missing parent.
    ///
    /// A bounded session (see [`AgentSession::is_bounded`]) reads the path through the store's
    /// transcript index.
    pub fn path_to(&self, at: &EntryId) -> Result<Vec<Entry>, SessionError> {
        if self.is_bounded() {
            return match self.history().path_to(at) {
                Ok(Some(path)) => Ok(path),
                Ok(None) => Err(SessionError::UnknownEntry {
                    id: self.info.id.clone(),
                    entry: at.clone(),
                }),
                Err(e) => Err(self.read_failed(e)),
            };
        }
        self.state
            .transcript
            .complete_path(at)
            .map_err(|e| self.path_error(at, e))
    }

    /// A failed read through the store, as a session error.
    fn read_failed(&self, e: crate::store::StoreError) -> SessionError {
        SessionError::History {
            id: self.info.id.clone(),
            reason: e.to_string(),
        }
    }

    /// For a bounded session, makes `id` part of the working set when it
    /// is stored beyond it (navigation then folds); whole sessions are
    /// unchanged.
    fn know(&mut self, id: &EntryId) -> Result<(), SessionError> {
        if self.is_bounded() {
            self.know_entry(id).map_err(|e| self.read_failed(e))?;
        }
        Ok(())
    }

    // ---- accessors -------------------------------------------------------

    pub fn info(&self) -> &AgentSessionInfo {
        &self.info
    }
    pub fn definition(&self) -> &AgentDefinition {
        &self.definition
    }
    pub fn state(&self) -> &AgentState {
        &self.state
    }
    pub fn id(&self) -> &SessionId {
        &self.info.id
    }
    pub fn version(&self) -> u64 {
        self.info.version
    }
    pub fn status(&self) -> SessionStatus {
        self.info.status
    }
    pub fn parent_id(&self) -> Option<&SessionId> {
        self.info.parent_id.as_ref()
    }
    pub fn is_deleted(&self) -> bool {
        self.info.status == SessionStatus::Deleted
    }

    /// Events recorded since this session was created or loaded.
    pub fn pending_events(&self) -> &[SessionEvent] {
        &self.pending
    }

    /// Removes and returns the pending events.
    pub fn take_pending(&mut self) -> Vec<SessionEvent> {
        std::mem::take(&mut self.pending)
    }

    /// Reassembles a session from its persisted parts (empty pending
    /// list). For whole-state store implementations: the caller vouches
    /// that `state` is what the session's events fold to.
    pub fn from_parts(
        info: AgentSessionInfo,
        definition: AgentDefinition,
        state: AgentState,
    ) -> AgentSession {
        AgentSession {
            info,
            definition,
            state,
            pending: Vec::new(),
            link: link::Link::default(),
        }
    }

    /// The persisted form a store hands back: `version` and `updated_at_ms`
    /// set by the store, pending list emptied. For store implementations.
    pub fn reconstitute(mut self, version: u64, updated_at_ms: i64) -> AgentSession {
        self.info.version = version;
        self.info.updated_at_ms = updated_at_ms;
        self.pending.clear();
        self
    }

    // ---- mutations (validate, fold, record) -----------------------------

    fn guard(&self) -> Result<(), SessionError> {
        if self.is_deleted() {
            return Err(SessionError::Deleted {
                id: self.info.id.clone(),
            });
        }
        Ok(())
    }

    /// Applies `ev` and records it as pending. The fold's own checks
    /// (transcript integrity) run first, so a refused event leaves no trace.
    fn record(&mut self, ev: SessionEvent) -> Result<(), SessionError> {
        self.apply(&ev).map_err(|source| match source {
            FoldError::Transcript { source, .. } => SessionError::Transcript {
                id: self.info.id.clone(),
                source,
            },
            other => SessionError::Fold {
                id: self.info.id.clone(),
                source: other,
            },
        })?;
        if matches!(
            ev,
            SessionEvent::StateCleared | SessionEvent::HistoryRewritten { .. }
        ) {
            self.unbound();
        }
        self.pending.push(ev);
        Ok(())
    }

    /// Appends an entry (its parent must exist, its id must be new); it
    /// becomes the leaf.
    ///
    /// A bounded session reads a parent beyond its working set through
    /// the index, and refuses an id stored beyond it as a duplicate.
    pub fn append_entry(&mut self, entry: Entry) -> Result<(), SessionError> {
        self.guard()?;
        if self.is_bounded() {
            let taken = self
                .stored_beyond(&entry.id)
                .map_err(|e| self.read_failed(e))?;
            if taken {
                return Err(SessionError::Transcript {
                    id: self.info.id.clone(),
                    source: TranscriptError::DuplicateEntry(entry.id),
                });
            }
            if let Some(p) = &entry.parent_id {
                self.know(p)?;
            }
        }
        self.record(SessionEvent::EntryAppended { entry })
    }

    /// Appends a new entry of `kind` under the current leaf, with a
    /// generated id and the current time. Returns its id.
    pub fn append(&mut self, kind: EntryKind) -> Result<EntryId, SessionError> {
        let mut entry = Entry::new(self.state.transcript.leaf().cloned(), kind);
        // A bounded session holds only part of its ids: draw again while
        // the store knows the drawn one (rare: ids are random).
        const DRAWS_MAX: usize = 16;
        self.guard()?;
        let mut draws = 0;
        while self.id_taken_in_store(&entry.id) {
            draws += 1;
            if draws == DRAWS_MAX {
                return Err(SessionError::Transcript {
                    id: self.info.id.clone(),
                    source: TranscriptError::DuplicateEntry(entry.id),
                });
            }
            entry.id = EntryId::generate();
        }
        // The leaf (the parent) is always held, so the fold checks the rest.
        let id = entry.id.clone();
        self.record(SessionEvent::EntryAppended { entry })?;
        Ok(id)
    }

    /// Moves the transcript leaf (navigation is an event, not memory state).
    pub fn move_leaf(&mut self, leaf: Option<EntryId>) -> Result<(), SessionError> {
        self.guard()?;
        if let Some(l) = &leaf {
            self.know(l)?;
        }
        if self.state.transcript.leaf() == leaf.as_ref() {
            return Ok(());
        }
        self.record(SessionEvent::LeafMoved { leaf })
    }

    /// Changes the status following the policy on [`SessionStatus`]. Returns whether
    /// anything changed (same status is a no-op). Use
    /// [`AgentSession::mark_deleted`] to delete.
    pub fn set_status(&mut self, to: SessionStatus) -> Result<bool, SessionError> {
        self.guard()?;
        let from = self.info.status;
        if from == to {
            return Ok(false);
        }
        if to == SessionStatus::Deleted {
            self.mark_deleted()?;
            return Ok(true);
        }
        if !from.can_transition_to(to) {
            return Err(SessionError::InvalidTransition {
                id: self.info.id.clone(),
                from,
                to,
            });
        }
        self.record(SessionEvent::StatusChanged { from, to })?;
        Ok(true)
    }

    /// Tombstones the session. Terminal: every later mutation is refused.
    pub fn mark_deleted(&mut self) -> Result<(), SessionError> {
        self.guard()?;
        self.record(SessionEvent::Deleted)
    }

    pub fn set_system_prompt(&mut self, prompt: impl Into<String>) -> Result<(), SessionError> {
        self.guard()?;
        let system_prompt = prompt.into();
        if system_prompt == self.state.system_prompt {
            return Ok(());
        }
        self.record(SessionEvent::SystemPromptChanged { system_prompt })
    }

    /// Changes the model the next execution's loop is built with.
    pub fn set_model(&mut self, model: ModelConfig) -> Result<(), SessionError> {
        self.guard()?;
        if model == self.state.model {
            return Ok(());
        }
        self.record(SessionEvent::ModelChanged { model })
    }

    /// Writes one metadata key (1..=[`MAX_METADATA_KEY_LEN`] bytes).
    pub fn write_metadata(
        &mut self,
        key: impl Into<String>,
        value: impl Into<Json>,
    ) -> Result<(), SessionError> {
        self.guard()?;
        let key = key.into();
        if key.is_empty() || key.len() > MAX_METADATA_KEY_LEN {
            return Err(SessionError::InvalidMetadataKey {
                id: self.info.id.clone(),
                reason: "length must be 1..=256 bytes",
            });
        }
        self.record(SessionEvent::MetadataWritten {
            key,
            value: value.into(),
        })
    }

    /// Removes one metadata key; returns whether it was present (an absent
    /// key records nothing).
    pub fn remove_metadata(&mut self, key: &str) -> Result<bool, SessionError> {
        self.guard()?;
        if !self.state.metadata.contains_key(key) {
            return Ok(false);
        }
        self.record(SessionEvent::MetadataRemoved {
            key: key.to_string(),
        })?;
        Ok(true)
    }

    /// Replaces the whole task list (validated by [`validate_tasks`]).
    pub fn set_tasks(&mut self, tasks: Vec<Task>) -> Result<(), SessionError> {
        self.guard()?;
        validate_tasks(&tasks).map_err(|source| SessionError::Tasks {
            id: self.info.id.clone(),
            source,
        })?;
        self.record(SessionEvent::TaskUpdated { tasks })
    }

    /// Inserts a task, or replaces the task with the same id in place.
    pub fn upsert_task(&mut self, task: Task) -> Result<(), SessionError> {
        let mut tasks = self.state.tasks.clone();
        match tasks.iter_mut().find(|t| t.id == task.id) {
            Some(t) => *t = task,
            None => tasks.push(task),
        }
        self.set_tasks(tasks)
    }

    /// Removes a task by id; returns whether it was present.
    pub fn remove_task(&mut self, id: &str) -> Result<bool, SessionError> {
        self.guard()?;
        if !self.state.tasks.iter().any(|t| t.id == id) {
            return Ok(false);
        }
        let tasks = self
            .state
            .tasks
            .iter()
            .filter(|t| t.id != id)
            .cloned()
            .collect();
        self.set_tasks(tasks)?;
        Ok(true)
    }

    /// Resets the state for the next execution
    /// ([`AgentState::for_next_execution`]); identity and definition stay.
    pub fn clear_state(&mut self) -> Result<(), SessionError> {
        self.guard()?;
        self.record(SessionEvent::StateCleared)
    }

    /// Starts an execution; returns its 1-based number.
    pub fn start_execution(&mut self) -> Result<u64, SessionError> {
        self.guard()?;
        let execution = self.state.execution_count.saturating_add(1);
        self.record(SessionEvent::ExecutionStarted { execution })?;
        Ok(execution)
    }

    /// Ends the current execution with `status`, its usage and error.
    pub fn finish_execution(
        &mut self,
        status: ExecutionStatus,
        usage: Usage,
        error: Option<String>,
    ) -> Result<(), SessionError> {
        self.guard()?;
        self.record(SessionEvent::ExecutionFinished {
            status,
            usage,
            error,
        })
    }

    /// Replaces the transcript with `entries` as a new generation. Every
    /// parent must precede its child; ids must be unique; `leaf` must be
    /// one of the entries. Returns the new generation.
    pub fn rewrite_history(
        &mut self,
        entries: Vec<Entry>,
        leaf: Option<EntryId>,
    ) -> Result<u64, SessionError> {
        self.guard()?;
        let generation = self.state.generation.saturating_add(1);
        self.record(SessionEvent::HistoryRewritten {
            generation,
            entries,
            leaf,
        })?;
        Ok(generation)
    }

    /// Records a prepared rewrite as a new transcript generation in its
    /// delta form ([`SessionEvent::TranscriptRewritten`]). The plan must
    /// have been prepared against this transcript (its entries exist).
    /// Returns the new generation.
    pub fn rewrite_transcript(&mut self, plan: &RewritePlan) -> Result<u64, SessionError> {
        self.guard()?;
        let generation = self.state.generation.saturating_add(1);
        self.record(SessionEvent::TranscriptRewritten {
            generation,
            written: plan.written.clone(),
            reparented: plan.reparented.clone(),
            removed: plan.removed.clone(),
            leaf: plan.new_leaf.clone(),
        })?;
        Ok(generation)
    }

    /// Appends a branch summary under `target` (`None`: a new root) that
    /// records the current leaf as the branch left; it becomes the leaf.
    /// Returns its id.
    pub fn branch_with_summary(
        &mut self,
        target: Option<&EntryId>,
        summary: impl Into<String>,
    ) -> Result<EntryId, SessionError> {
        self.guard()?;
        if let Some(t) = target {
            self.know(t)?;
        }
        let nav = self
            .state
            .transcript
            .plan_branch_with_summary(target, summary, now_ms())
            .map_err(|source| SessionError::Transcript {
                id: self.info.id.clone(),
                source,
            })?;
        self.record_navigation(nav)
    }

    /// Sets (`Some`, non-empty) or clears the label of `target` with a
    /// label entry appended under the leaf. Returns the label entry's id.
    pub fn set_label(
        &mut self,
        target: &EntryId,
        label: Option<String>,
    ) -> Result<EntryId, SessionError> {
        self.guard()?;
        self.know(target)?;
        let nav = self
            .state
            .transcript
            .plan_label(target, label, now_ms())
            .map_err(|source| SessionError::Transcript {
                id: self.info.id.clone(),
                source,
            })?;
        self.record_navigation(nav)
    }

    /// Records a planned append (branch summaries and labels are always
    /// appends).
    fn record_navigation(&mut self, nav: Navigation) -> Result<EntryId, SessionError> {
        match nav {
            Navigation::Append { entry } => {
                let id = entry.id.clone();
                self.record(SessionEvent::EntryAppended { entry })?;
                Ok(id)
            }
            other => Err(SessionError::Fold {
                id: self.info.id.clone(),
                source: FoldError::BadRewrite {
                    reason: format!("expected an append, planned {other:?}"),
                },
            }),
        }
    }

    /// Records a transcript-level event built outside the session (by a
    /// session handle committing without a full load, replayed here by
    /// stores that keep whole sessions). Only `EntryAppended`,
    /// `LeafMoved` and `TranscriptRewritten` are accepted; the fold checks
    /// them like any other event, so a refused event leaves no trace.
    pub fn record_transcript_event(&mut self, ev: SessionEvent) -> Result<(), SessionError> {
        self.guard()?;
        match &ev {
            SessionEvent::EntryAppended { .. }
            | SessionEvent::LeafMoved { .. }
            | SessionEvent::TranscriptRewritten { .. } => self.record(ev),
            other => Err(SessionError::Fold {
                id: self.info.id.clone(),
                source: FoldError::NotTranscript {
                    found: other.kind(),
                },
            }),
        }
    }

    /// Records a no-change event so a save still advances the version.
    pub fn touch(&mut self) {
        self.pending.push(SessionEvent::Touched);
    }
}
