//! Session actions: the [`SessionAction`] trait and the built-ins.
//!
//! An action changes a loaded session through its mutation methods (each
//! records a domain event); the runtime then saves the session, committing
//! those events. Actions should be pure transformations of the session;
//! side effects belong in hooks or observers. If an action returns an
//! error, nothing is saved.
//!
//! Status rules (see [`SessionStatus`](crate::session::SessionStatus) for the full policy):
//! `SendMessage` needs an `Active` session (resume a suspended or finished
//! one first); the settings actions (prompt, model, metadata, tasks,
//! clear) work on any non-deleted session; every action on a deleted
//! session fails with `SessionDeleted`.

mod builtin;
mod send;

pub use builtin::{
    ChangeModel, ChangeSystemPrompt, ClearSession, CompleteSession, DeleteSession, FailSession,
    ForkSession, RemoveMetadata, ResumeSession, SuspendSession, UpdateTask, WriteMetadata,
};
pub use send::SendMessage;

use crate::session::{AgentSession, SessionError};

/// An action refused or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ActionError {
    /// The session refused a mutation (deleted, bad transition, bad task
    /// list, bad transcript entry, ...).
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The action is not allowed in the session's current condition.
    #[error("not allowed: {reason}")]
    NotAllowed { reason: String },
    /// A commit the action made while it ran (a durable step of
    /// `SendMessage`) failed: a conflict with another writer, or a store
    /// fault.
    #[error(transparent)]
    Store(crate::store::StoreError),
    /// A custom action's own failure.
    #[error(transparent)]
    Custom(Box<dyn std::error::Error + Send + Sync>),
}

impl ActionError {
    pub fn not_allowed(reason: impl Into<String>) -> Self {
        ActionError::NotAllowed {
            reason: reason.into(),
        }
    }
}

/// Something the runtime can execute on a session (the seed's
/// `CanExecuteSessionAction`). Implement it for custom actions.
pub trait SessionAction: Send + Sync {
    /// A short name for events and errors (`send_message`, ...).
    fn name(&self) -> &str;
    /// Changes the session through its mutation methods.
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError>;
    /// Whether this action needs the whole session (every entry of every
    /// branch in `state().transcript`) rather than the bounded working set
    /// the runtime loads by default on stores with transcript indexes.
    /// `true` makes `execute` load the session whole (one full load, its
    /// cost following the history). No built-in action needs it.
    fn needs_whole_session(&self) -> bool {
        false
    }
}
