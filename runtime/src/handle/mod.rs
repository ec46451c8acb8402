//! Live session handles: a bounded resident snapshot, transcript-level
//! writes without loading the session, version-fenced history reads and
//! prepared rewrites.
//!
//! A [`SessionHandle`] is opened with
//! [`SessionRuntime::open_handle`](crate::SessionRuntime::open_handle). It
//! holds one [`ResidentSnapshot`] (behind an `Arc`, swapped whole): the
//! header, model and thinking settings, boundary counts, the resident
//! selection of the current context bounded by a [`Budget`] of bytes and
//! events, the transcript version, the leaf, the owner incarnation and a
//! local revision. Memory held by a handle is bounded by the budget, not
//! by the history (exceptions: the navigation links of resident entries,
//! at most [`CHILD_LINKS_MAX`](crate::transcript::CHILD_LINKS_MAX) ids
//! each, and one small record per omitted oversized entry, which uses an
//! event of the budget; with the [`FullLoadBackend`](crate::store::FullLoadBackend) of the memory and file
//! stores the backend's cache also holds the whole session).
//!
//! # Writes
//! Appends (any entry kind, single or batched in one commit), leaf moves,
//! branches with a summary, labels and rewrites are transcript-level: the
//! handle builds the events itself, checks them against the store's
//! indexes (the parent exists, the id is new, the session is not deleted)
//! and commits them under the session version fence of its snapshot
//! through [`TranscriptBackend::append_events`](crate::store::TranscriptBackend::append_events) — without loading the
//! session. After the commit it publishes a replacement snapshot. For
//! plain appends of a chain under the leaf that committed as the very next
//! session version (the fence guarantees nothing came in between), the
//! snapshot is extended from the previous one in memory
//! ([`ResidentSelection::extended`](crate::transcript::ResidentSelection::extended):
//! the new entries join, the oldest held ones leave until the budget
//! holds) after one head read that confirms the commit and gives the
//! transcript version; no entry is read back. Otherwise (a compaction,
//! an append elsewhere in the tree, a leaf move, a rewrite, or a head that
//! shows another commit) it is rebuilt through the backend from the
//! previous resident entries plus the new ones, trimmed to the budget
//! (cost proportional to the budget). Only then the handle notifies the
//! handle's subscribers and emits `SessionSaved` on the runtime's event
//! sink (so observers see every commit: exactly one `SessionSaved` per
//! committed write, with the committed session version).
//!
//! # Hooks
//! Before every commit, a handle opened by
//! [`SessionRuntime::open_handle`](crate::SessionRuntime::open_handle) runs
//! the runtime's hooks at one stage,
//! [`HookStage::BeforeHandleWrite`]:
//! each sees the operation, the events about to be committed and the
//! version they are fenced on ([`HandleWrite`](crate::hooks::HandleWrite))
//! and may reject them, not change them. A rejection commits nothing, is
//! reported as `SessionHookFailed` and returned as
//! [`HandleError::HookFailed`]; the handle keeps its snapshot and stays
//! usable. No other stage runs: they hand hooks the loaded session, and a
//! handle write never loads it (see "Handle writes and hooks" in
//! [`crate::runtime`]; the navigation actions [`MoveLeaf`],
//! [`BranchWithSummary`] and [`SetLabel`] run the whole pipeline through
//! `execute`). A handle opened with [`SessionHandle::open`] runs no hooks.
//!
//! A failed write keeps the old snapshot. A committed write whose
//! publication fails invalidates the handle ([`HandleError::PublicationFailed`],
//! then [`HandleError::OwnerLost`] for every later call); the write is
//! never replayed.
//!
//! # Writers and owners
//! At most one writer handle per (store, session) in a process (a
//! process-wide registry keyed by the backend's identity and the session
//! id): a second writer is refused ([`HandleError::WriterBusy`]) or waits
//! ([`HandleOptions::wait_for_writer`]). Read-only handles are unlimited.
//! The runtime's session pipeline honours the registry too: while a writer
//! handle is open, `execute` and `delete` on that session refuse with
//! `RuntimeError::WriterHeld` and store nothing.
//! Closing or dropping a handle releases its writer slot; reads and
//! rewrites prepared on a closed, invalidated or replaced handle report
//! owner lost.
//!
//! # Reads
//! See [`reads`]: five selections, each validated against the live
//! transcript version and the owner, cancellable, with opaque
//! continuations. Each read result is owned by its caller: nothing read
//! is installed in the handle.
//!
//! # Rewrites
//! See [`rewrite`]: `prepare_rewrite` / `commit_rewrite` and the helpers
//! built on them.

mod bounded;
mod live;
mod navigation;
pub mod reads;
mod registry;
pub mod rewrite;
mod snapshot;

use std::time::Duration;

pub(crate) use bounded::load_bounded;
pub(crate) use live::{writer_holder, writer_identity};
pub use live::{HandleEvent, SessionHandle};
pub use navigation::{BranchWithSummary, MoveLeaf, SetLabel};
pub use reads::{HistoryRead, HistorySelection, HistoryValue};
pub use rewrite::{PreparedRewrite, RewriteCommitted, TrailingOutcome};
pub use snapshot::ResidentSnapshot;

use crate::hooks::{HookError, HookStage};
use crate::session::SessionId;
use crate::store::StoreError;
use crate::transcript::{
    Budget, EntryId, ReadError, ResidentError, RewriteError, TranscriptVersion,
};

/// How a handle is opened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HandleOptions {
    /// Bound of the resident snapshot (default 64 KiB / 1024 events).
    pub budget: Budget,
    /// Whether the handle may write (one writer per session per process).
    pub writer: bool,
    /// For a writer: wait up to this long for the current writer to close
    /// (`None`: refuse at once with [`HandleError::WriterBusy`]).
    pub wait_for_writer: Option<Duration>,
}

impl Default for HandleOptions {
    /// A read-only handle with the default budget.
    fn default() -> Self {
        HandleOptions {
            budget: Budget::default(),
            writer: false,
            wait_for_writer: None,
        }
    }
}

impl HandleOptions {
    /// A writer handle with the default budget.
    pub fn writer() -> Self {
        HandleOptions {
            writer: true,
            ..Self::default()
        }
    }

    /// A read-only handle with the default budget.
    pub fn reader() -> Self {
        Self::default()
    }

    pub fn with_budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    pub fn waiting(mut self, wait: Duration) -> Self {
        self.wait_for_writer = Some(wait);
        self
    }
}

/// A handle operation failed. Version conflicts, absence, owner loss and
/// cancellation are expected outcomes; the rest are faults.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HandleError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("session {id} not found")]
    NotFound { id: SessionId },
    #[error("session {id} is deleted; deleted sessions accept no changes")]
    Deleted { id: SessionId },
    #[error("session {id}: another writer handle (owner {holder}) is open in this process")]
    WriterBusy { id: SessionId, holder: u64 },
    #[error(
        "session {id}: writer handle (owner {holder}) still open after waiting {waited_ms} ms"
    )]
    WriterTimeout {
        id: SessionId,
        holder: u64,
        waited_ms: u64,
    },
    #[error("session {id}: this handle is read-only")]
    ReadOnly { id: SessionId },
    /// The handle was closed, invalidated, or is no longer the session's
    /// writer.
    #[error("session {id}: the handle's owner was closed or replaced")]
    OwnerLost { id: SessionId },
    #[error("session {id}: transcript version conflict (expected {expected:?}, live {actual:?})")]
    VersionConflict {
        id: SessionId,
        expected: TranscriptVersion,
        actual: TranscriptVersion,
    },
    /// The session moved past the handle's snapshot (another writer
    /// committed); [`SessionHandle::refresh`] republishes from the store.
    #[error("session {id}: version conflict (handle at version {expected}, stored {actual})")]
    Conflict {
        id: SessionId,
        expected: u64,
        actual: u64,
    },
    #[error("session {id}: entry {entry} is not in the transcript")]
    UnknownEntry { id: SessionId, entry: EntryId },
    #[error("session {id}: entry {entry} already exists")]
    DuplicateEntry { id: SessionId, entry: EntryId },
    #[error("session {id}: cancelled; nothing was written")]
    Cancelled { id: SessionId },
    #[error("session {id}: a prepared rewrite is already open on this handle")]
    RewriteBusy { id: SessionId },
    #[error("session {id}: the prepared rewrite belongs to another handle")]
    ForeignPreparation { id: SessionId },
    #[error("session {id}: planning the rewrite failed")]
    RewritePlan {
        id: SessionId,
        #[source]
        source: RewriteError<StoreError>,
    },
    #[error("session {id}: building the resident selection failed")]
    Selection {
        id: SessionId,
        #[source]
        source: ResidentError<StoreError>,
    },
    #[error("session {id}: history read failed")]
    Read {
        id: SessionId,
        #[source]
        source: ReadError<StoreError>,
    },
    /// The session kept changing while a snapshot was built.
    #[error("session {id}: the session kept changing while a snapshot was built")]
    Raced { id: SessionId },
    /// The write is committed (`committed_version`); the handle could not
    /// publish its replacement snapshot and is invalidated. Do not retry
    /// the write: reopen a handle and reconcile with what is stored.
    #[error(
        "session {id}: version {committed_version} was committed but its snapshot could not be published ({reason}); the handle is invalidated"
    )]
    PublicationFailed {
        id: SessionId,
        committed_version: u64,
        reason: String,
    },
    /// A hook rejected the write or failed (at `stage`,
    /// [`HookStage::BeforeHandleWrite`]); nothing was committed and the
    /// handle keeps its snapshot.
    #[error("session {id}: {stage} hook {hook} failed; nothing was written")]
    HookFailed {
        id: SessionId,
        stage: HookStage,
        hook: String,
        #[source]
        source: Box<HookError>,
    },
}

impl HandleError {
    /// A short stable name of the error kind.
    pub fn kind(&self) -> &'static str {
        match self {
            HandleError::Store(e) => e.kind(),
            HandleError::NotFound { .. } => "not_found",
            HandleError::Deleted { .. } => "session_deleted",
            HandleError::WriterBusy { .. } => "writer_busy",
            HandleError::WriterTimeout { .. } => "writer_timeout",
            HandleError::ReadOnly { .. } => "read_only",
            HandleError::OwnerLost { .. } => "owner_lost",
            HandleError::VersionConflict { .. } => "version_conflict",
            HandleError::Conflict { .. } => "conflict",
            HandleError::UnknownEntry { .. } => "unknown_entry",
            HandleError::DuplicateEntry { .. } => "duplicate_entry",
            HandleError::Cancelled { .. } => "cancelled",
            HandleError::RewriteBusy { .. } => "rewrite_busy",
            HandleError::ForeignPreparation { .. } => "foreign_preparation",
            HandleError::RewritePlan { .. } => "rewrite_plan",
            HandleError::Selection { .. } => "selection",
            HandleError::Read { .. } => "read",
            HandleError::Raced { .. } => "raced",
            HandleError::PublicationFailed { .. } => "publication_failed",
            HandleError::HookFailed { .. } => "hook_failed",
        }
    }
}
