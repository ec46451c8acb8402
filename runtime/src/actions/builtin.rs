//! Built-in actions other than `SendMessage`.

use super::{ActionError, SessionAction};
use crate::session::{AgentSession, ModelConfig, SessionStatus, Task, TaskStatus};
use crate::transcript::EntryId;

/// Sets the status to `Suspended` (from Active; a no-op if already
/// suspended).
#[derive(Clone, Copy, Debug, Default)]
pub struct SuspendSession;

impl SessionAction for SuspendSession {
    fn name(&self) -> &str {
        "suspend_session"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.set_status(SessionStatus::Suspended)?;
        Ok(())
    }
}

/// Sets the status back to `Active` (from Suspended, or reopens a
/// Completed/Failed session; a no-op if already active).
#[derive(Clone, Copy, Debug, Default)]
pub struct ResumeSession;

impl SessionAction for ResumeSession {
    fn name(&self) -> &str {
        "resume_session"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.set_status(SessionStatus::Active)?;
        Ok(())
    }
}

/// Marks the session `Completed`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CompleteSession;

impl SessionAction for CompleteSession {
    fn name(&self) -> &str {
        "complete_session"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.set_status(SessionStatus::Completed)?;
        Ok(())
    }
}

/// Marks the session `Failed`, recording `reason` under the metadata key
/// `failure_reason` when given.
#[derive(Clone, Debug, Default)]
pub struct FailSession {
    pub reason: Option<String>,
}

impl SessionAction for FailSession {
    fn name(&self) -> &str {
        "fail_session"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        if let Some(r) = &self.reason {
            session.write_metadata("failure_reason", serde_json::Value::String(r.clone()))?;
        }
        session.set_status(SessionStatus::Failed)?;
        Ok(())
    }
}

/// Tombstones the session (status `Deleted`, terminal). Used by
/// `SessionRuntime::delete`.
#[derive(Clone, Copy, Debug, Default)]
pub struct DeleteSession;

impl SessionAction for DeleteSession {
    fn name(&self) -> &str {
        "delete_session"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.mark_deleted()?;
        Ok(())
    }
}

/// Resets the agent state for the next execution
/// ([`crate::session::AgentState::for_next_execution`]): empty transcript
/// (new generation), no tasks, execution Pending. Identity, definition,
/// status, metadata, system prompt and model are kept.
#[derive(Clone, Copy, Debug, Default)]
pub struct ClearSession;

impl SessionAction for ClearSession {
    fn name(&self) -> &str {
        "clear_session"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.clear_state()?;
        Ok(())
    }
}

/// Replaces the session's system prompt.
#[derive(Clone, Debug)]
pub struct ChangeSystemPrompt(pub String);

impl ChangeSystemPrompt {
    pub fn new(prompt: impl Into<String>) -> Self {
        ChangeSystemPrompt(prompt.into())
    }
}

impl SessionAction for ChangeSystemPrompt {
    fn name(&self) -> &str {
        "change_system_prompt"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.set_system_prompt(self.0.clone())?;
        Ok(())
    }
}

/// Swaps the model configuration the next execution's loop is built with.
#[derive(Clone, Debug)]
pub struct ChangeModel(pub ModelConfig);

impl ChangeModel {
    pub fn new(model: ModelConfig) -> Self {
        ChangeModel(model)
    }
}

impl SessionAction for ChangeModel {
    fn name(&self) -> &str {
        "change_model"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.set_model(self.0.clone())?;
        Ok(())
    }
}

/// Writes one metadata key.
#[derive(Clone, Debug)]
pub struct WriteMetadata {
    pub key: String,
    pub value: crate::transcript::Json,
}

impl WriteMetadata {
    pub fn new(key: impl Into<String>, value: impl Into<serde_json::Value>) -> Self {
        WriteMetadata {
            key: key.into(),
            value: crate::transcript::Json::from(value.into()),
        }
    }
}

impl SessionAction for WriteMetadata {
    fn name(&self) -> &str {
        "write_metadata"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.write_metadata(self.key.clone(), self.value.clone())?;
        Ok(())
    }
}

/// Removes one metadata key (absent keys are a no-op).
#[derive(Clone, Debug)]
pub struct RemoveMetadata {
    pub key: String,
}

impl RemoveMetadata {
    pub fn new(key: impl Into<String>) -> Self {
        RemoveMetadata { key: key.into() }
    }
}

impl SessionAction for RemoveMetadata {
    fn name(&self) -> &str {
        "remove_metadata"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.remove_metadata(&self.key)?;
        Ok(())
    }
}

/// Changes the bounded task list (at most
/// [`crate::session::MAX_TASKS`] tasks, at most one `InProgress`; a change
/// breaking either rule fails with a task-list error).
#[derive(Clone, Debug)]
pub enum UpdateTask {
    /// Insert the task, or replace the task with the same id in place.
    Upsert(Task),
    /// Remove the task with this id (absent ids are a no-op).
    Remove(String),
    /// Replace the whole list.
    Replace(Vec<Task>),
}

impl UpdateTask {
    /// Adds a new pending task with a generated id.
    pub fn add(description: impl Into<String>) -> Self {
        UpdateTask::Upsert(Task::new(
            EntryId::generate().as_str(),
            description,
            TaskStatus::Pending,
        ))
    }

    /// Inserts or replaces a task.
    pub fn set(id: impl Into<String>, description: impl Into<String>, status: TaskStatus) -> Self {
        UpdateTask::Upsert(Task::new(id, description, status))
    }
}

impl SessionAction for UpdateTask {
    fn name(&self) -> &str {
        "update_task"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        match self {
            UpdateTask::Upsert(t) => session.upsert_task(t.clone())?,
            UpdateTask::Remove(id) => {
                session.remove_task(id)?;
            }
            UpdateTask::Replace(tasks) => session.set_tasks(tasks.clone())?,
        }
        Ok(())
    }
}

/// Builds a fork of a session: a new session (fresh id, version 0) whose
/// parent is the source, with the source's definition and state, and the
/// transcript cut to the root→`at` path (whole when `at` is `None`).
///
/// It is not a [`SessionAction`] because it makes a new session instead of
/// changing the source; `SessionRuntime::fork` persists the result through
/// the create pipeline.
#[derive(Clone, Debug, Default)]
pub struct ForkSession {
    pub at: Option<EntryId>,
}

impl ForkSession {
    /// Fork the whole session.
    pub fn whole() -> Self {
        ForkSession { at: None }
    }

    /// Fork at an entry.
    pub fn at(entry: EntryId) -> Self {
        ForkSession { at: Some(entry) }
    }

    pub fn fork(&self, source: &AgentSession) -> Result<AgentSession, ActionError> {
        Ok(source.fork(self.at.as_ref())?)
    }

    /// [`ForkSession::fork`] consuming the source: the kept transcript
    /// entries are moved into the fork, not copied.
    pub fn fork_owned(&self, source: AgentSession) -> Result<AgentSession, ActionError> {
        Ok(source.into_fork(self.at.as_ref())?)
    }
}
