//! What an agent has done: the per-session state.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::definition::ModelConfig;
use crate::transcript::{Json, Transcript, Usage};

/// Maximum number of tasks in a session's task list.
pub const MAX_TASKS: usize = 64;
/// Maximum length of a task id in bytes.
pub const MAX_TASK_ID_LEN: usize = 128;
/// Maximum length of a task description in bytes.
pub const MAX_TASK_DESCRIPTION_LEN: usize = 4096;
/// Maximum length of a metadata key in bytes.
pub const MAX_METADATA_KEY_LEN: usize = 256;

/// The status of the current (or last) execution — one run of the agent
/// loop. Independent of the session status: a session can be `Active`
/// while its last execution `Failed`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ExecutionStatus {
    /// No execution has started since creation or the last clear.
    #[default]
    Pending,
    InProgress,
    Completed,
    /// The loop stopped early (budget, a stop condition) without an error.
    Stopped,
    Failed,
    /// The execution never finished: the process ended (or a step could
    /// not be committed) after some of its steps were stored. Recorded by
    /// the next execute of the session.
    Interrupted,
}

impl ExecutionStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ExecutionStatus::Pending => "pending",
            ExecutionStatus::InProgress => "in_progress",
            ExecutionStatus::Completed => "completed",
            ExecutionStatus::Stopped => "stopped",
            ExecutionStatus::Failed => "failed",
            ExecutionStatus::Interrupted => "interrupted",
        }
    }
}

/// The status of one task in the task list.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TaskStatus {
    #[default]
    Pending,
    InProgress,
    Completed,
    Cancelled,
}

/// One item of the session's task list.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Task {
    pub id: String,
    pub description: String,
    pub status: TaskStatus,
}

impl Task {
    pub fn new(id: impl Into<String>, description: impl Into<String>, status: TaskStatus) -> Self {
        Task {
            id: id.into(),
            description: description.into(),
            status,
        }
    }
}

/// Why a task list was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskListError {
    #[error("task list holds at most {MAX_TASKS} tasks")]
    TooMany,
    #[error("at most one task may be in progress (found {0})")]
    SeveralInProgress(usize),
    #[error("task id must be 1..={MAX_TASK_ID_LEN} bytes")]
    BadId,
    #[error("task description must be at most {MAX_TASK_DESCRIPTION_LEN} bytes")]
    DescriptionTooLong,
    #[error("task id {0:?} appears twice")]
    DuplicateId(String),
}

/// Checks the task-list invariants: at most [`MAX_TASKS`] tasks, unique
/// ids within bounds, bounded descriptions, at most one `InProgress`.
pub fn validate_tasks(tasks: &[Task]) -> Result<(), TaskListError> {
    if tasks.len() > MAX_TASKS {
        return Err(TaskListError::TooMany);
    }
    let mut seen = std::collections::BTreeSet::new();
    for t in tasks {
        if t.id.is_empty() || t.id.len() > MAX_TASK_ID_LEN {
            return Err(TaskListError::BadId);
        }
        if t.description.len() > MAX_TASK_DESCRIPTION_LEN {
            return Err(TaskListError::DescriptionTooLong);
        }
        if !seen.insert(t.id.as_str()) {
            return Err(TaskListError::DuplicateId(t.id.clone()));
        }
    }
    let in_progress = tasks
        .iter()
        .filter(|t| t.status == TaskStatus::InProgress)
        .count();
    if in_progress > 1 {
        return Err(TaskListError::SeveralInProgress(in_progress));
    }
    Ok(())
}

/// The agent's state inside a session: transcript, metadata, settings,
/// execution bookkeeping and the task list.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct AgentState {
    pub transcript: Transcript,
    /// Transcript generation: bumped by every history rewrite.
    pub generation: u64,
    pub metadata: BTreeMap<String, Json>,
    pub system_prompt: String,
    /// The model the next execution's loop is built with.
    pub model: ModelConfig,
    /// How many executions have started in this session (never reset).
    pub execution_count: u64,
    /// Status of the current or last execution.
    pub execution: ExecutionStatus,
    /// Error of the last execution, when it failed.
    pub last_error: Option<String>,
    /// Usage of the current or last execution.
    pub usage: Usage,
    /// Usage summed over every execution (never reset by a clear).
    pub total_usage: Usage,
    pub tasks: Vec<Task>,
}

impl AgentState {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn with_system_prompt(mut self, prompt: impl Into<String>) -> Self {
        self.system_prompt = prompt.into();
        self
    }

    pub fn with_model(mut self, model: ModelConfig) -> Self {
        self.model = model;
        self
    }

    pub fn with_metadata(mut self, key: impl Into<String>, value: impl Into<Json>) -> Self {
        self.metadata.insert(key.into(), value.into());
        self
    }

    /// The state prepared for the next execution, as `ClearSession` leaves
    /// it: an empty transcript (new generation), no tasks, execution
    /// `Pending` with zero usage and no error. Kept: metadata, system
    /// prompt, model, execution count and total usage.
    pub fn for_next_execution(&self) -> AgentState {
        AgentState {
            transcript: Transcript::new(),
            generation: self.generation.saturating_add(1),
            metadata: self.metadata.clone(),
            system_prompt: self.system_prompt.clone(),
            model: self.model.clone(),
            execution_count: self.execution_count,
            execution: ExecutionStatus::Pending,
            last_error: None,
            usage: Usage::default(),
            total_usage: self.total_usage,
            tasks: Vec::new(),
        }
    }

    /// The task currently in progress, if any.
    pub fn current_task(&self) -> Option<&Task> {
        self.tasks
            .iter()
            .find(|t| t.status == TaskStatus::InProgress)
    }
}
