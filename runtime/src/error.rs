//! Errors of the runtime boundary.

use crate::actions::ActionError;
use crate::hooks::{HookError, HookStage};
use crate::session::{SessionError, SessionId, SessionStatus};
use crate::store::StoreError;

/// A [`crate::SessionRuntime`] call failed. Every failure is also reported
/// to the observer (see [`crate::observer::RuntimeEvent`]) before it is
/// returned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RuntimeError {
    /// The store refused or failed (`NotFound`, `Conflict`, I/O, ...).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The session is deleted; deleted sessions accept no action.
    #[error("session {id} is deleted; deleted sessions accept no actions")]
    SessionDeleted { id: SessionId },
    /// The action asked for a status change the policy forbids.
    #[error("session {id}: status change {from} -> {to} is not allowed")]
    InvalidTransition {
        id: SessionId,
        from: SessionStatus,
        to: SessionStatus,
    },
    /// The action refused or failed; nothing was saved.
    #[error("session {id}: action {action} failed")]
    ActionFailed {
        id: SessionId,
        action: String,
        #[source]
        source: Box<ActionError>,
    },
    /// A writer handle (owner `holder`) is open on the session in this
    /// process, so the session pipeline refuses to run; nothing was
    /// stored. Close the handle (or write through it) and retry.
    #[error("session {id}: a writer handle (owner {holder}) is open in this process; close it before executing actions")]
    WriterHeld { id: SessionId, holder: u64 },
    /// A hook failed. `persisted_version` is `Some(v)` when the failure
    /// came after version `v` was durably stored (AfterSave, AfterCreate);
    /// `None` means nothing was stored.
    #[error("session {id}: {stage} hook {hook} failed")]
    HookFailed {
        id: SessionId,
        stage: HookStage,
        hook: String,
        persisted_version: Option<u64>,
        #[source]
        source: Box<HookError>,
    },
}

impl RuntimeError {
    /// A short stable name of the error kind, for observer events and
    /// machine-readable output. Store errors use [`StoreError::kind`].
    pub fn kind(&self) -> &'static str {
        match self {
            RuntimeError::Store(e) => e.kind(),
            RuntimeError::SessionDeleted { .. } => "session_deleted",
            RuntimeError::InvalidTransition { .. } => "invalid_transition",
            RuntimeError::ActionFailed { .. } => "action_failed",
            RuntimeError::HookFailed { .. } => "hook_failed",
            RuntimeError::WriterHeld { .. } => "writer_held",
        }
    }

    /// The store error inside, if this is one.
    pub fn as_store(&self) -> Option<&StoreError> {
        match self {
            RuntimeError::Store(e) => Some(e),
            _ => None,
        }
    }

    pub fn is_conflict(&self) -> bool {
        self.as_store().is_some_and(StoreError::is_conflict)
    }

    pub fn is_not_found(&self) -> bool {
        self.as_store().is_some_and(StoreError::is_not_found)
    }

    /// Maps an action's failure, surfacing the status-policy refusals as
    /// their own variants.
    pub(crate) fn from_action(id: &SessionId, action: &str, e: ActionError) -> RuntimeError {
        match e {
            ActionError::Session(SessionError::Deleted { id }) => {
                RuntimeError::SessionDeleted { id }
            }
            ActionError::Session(SessionError::InvalidTransition { id, from, to }) => {
                RuntimeError::InvalidTransition { id, from, to }
            }
            ActionError::Store(e) => RuntimeError::Store(e),
            source => RuntimeError::ActionFailed {
                id: id.clone(),
                action: action.to_string(),
                source: Box::new(source),
            },
        }
    }
}

/// `e` and each of its causes, joined by ": ", for events and reports that
/// keep an error as text (a `Display` shows only its own level).
pub(crate) fn chain_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
