//! Pipeline hooks (the seed's session controllers).
//!
//! A hook sees the session at one of six [`HookStage`]s and may change it
//! through its mutation methods (which record events like any action).
//! [`SessionHookStack`] runs hooks by priority: higher first; equal
//! priorities keep registration order. A failing hook stops the pipeline,
//! is reported as `SessionHookFailed`, and the runtime returns
//! `RuntimeError::HookFailed`.
//!
//! Changes made at AfterSave / AfterCreate (after the commit) are not
//! dropped: the runtime commits them in one follow-up save (reported by a
//! second `SessionSaved`). Post-persist hooks do not run again for that
//! follow-up commit.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::session::{AgentSession, SessionError};

/// Where in a pipeline a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookStage {
    /// Create only: before anything is persisted.
    BeforeCreate,
    /// Create only: after the session was persisted (and AfterSave ran).
    AfterCreate,
    /// Execute only: after the session was loaded, before the action.
    AfterLoad,
    /// Execute only: after the action ran.
    AfterAction,
    /// Create and execute: last chance to change the session before it is
    /// persisted.
    BeforeSave,
    /// Create and execute: after a successful persist.
    AfterSave,
}

impl HookStage {
    pub fn as_str(self) -> &'static str {
        match self {
            HookStage::BeforeCreate => "before_create",
            HookStage::AfterCreate => "after_create",
            HookStage::AfterLoad => "after_load",
            HookStage::AfterAction => "after_action",
            HookStage::BeforeSave => "before_save",
            HookStage::AfterSave => "after_save",
        }
    }
}

impl std::fmt::Display for HookStage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A hook refused the session or failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HookError {
    #[error("rejected: {reason}")]
    Rejected { reason: String },
    #[error(transparent)]
    Session(#[from] SessionError),
    #[error(transparent)]
    Other(Box<dyn std::error::Error + Send + Sync>),
}

impl HookError {
    pub fn rejected(reason: impl Into<String>) -> Self {
        HookError::Rejected {
            reason: reason.into(),
        }
    }
}

/// Intercepts the runtime pipelines (the seed's `CanControlAgentSession`).
pub trait SessionHook: Send + Sync {
    /// A name for error messages and observer events.
    fn name(&self) -> &str;
    /// Sees (and may change) the session at `stage`. Stages a hook does not
    /// care about should return `Ok(())`.
    fn on_stage(&self, stage: HookStage, session: &mut AgentSession) -> Result<(), HookError>;
}

/// A hook made from a closure.
pub struct FnHook<F> {
    name: String,
    f: F,
}

impl<F> FnHook<F>
where
    F: Fn(HookStage, &mut AgentSession) -> Result<(), HookError> + Send + Sync,
{
    pub fn new(name: impl Into<String>, f: F) -> Self {
        FnHook {
            name: name.into(),
            f,
        }
    }
}

impl<F> SessionHook for FnHook<F>
where
    F: Fn(HookStage, &mut AgentSession) -> Result<(), HookError> + Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn on_stage(&self, stage: HookStage, session: &mut AgentSession) -> Result<(), HookError> {
        (self.f)(stage, session)
    }
}

/// The seed's pass-through controller: changes nothing at any stage.
#[derive(Clone, Copy, Debug, Default)]
pub struct PassThroughHook;

impl SessionHook for PassThroughHook {
    fn name(&self) -> &str {
        "pass-through"
    }
    fn on_stage(&self, _stage: HookStage, _session: &mut AgentSession) -> Result<(), HookError> {
        Ok(())
    }
}

/// A failure inside a [`SessionHookStack`]: which hook, and why.
#[derive(Debug)]
pub struct StackFailure {
    pub hook: String,
    pub error: HookError,
}

/// Hooks ordered by priority (higher first; equal priorities keep
/// registration order). The empty stack is the pass-through controller.
#[derive(Clone, Default)]
pub struct SessionHookStack {
    hooks: Vec<(i32, Arc<dyn SessionHook>)>,
}

impl std::fmt::Debug for SessionHookStack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.hooks.iter().map(|(p, h)| (p, h.name().to_string())))
            .finish()
    }
}

impl SessionHookStack {
    /// No hooks: every stage passes the session through unchanged.
    pub fn empty() -> Self {
        Self::default()
    }

    /// Adds a hook (builder form).
    pub fn with(mut self, hook: impl SessionHook + 'static, priority: i32) -> Self {
        self.push(Arc::new(hook), priority);
        self
    }

    /// Adds a shared hook after every hook of priority >= `priority`.
    pub fn push(&mut self, hook: Arc<dyn SessionHook>, priority: i32) {
        let at = self
            .hooks
            .iter()
            .position(|(p, _)| *p < priority)
            .unwrap_or(self.hooks.len());
        self.hooks.insert(at, (priority, hook));
    }

    pub fn len(&self) -> usize {
        self.hooks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hooks.is_empty()
    }

    /// Hook names in run order.
    pub fn names(&self) -> Vec<String> {
        self.hooks
            .iter()
            .map(|(_, h)| h.name().to_string())
            .collect()
    }

    /// Runs every hook for `stage` in order; stops at the first failure.
    pub fn run(&self, stage: HookStage, session: &mut AgentSession) -> Result<(), StackFailure> {
        for (_, h) in &self.hooks {
            h.on_stage(stage, session).map_err(|error| StackFailure {
                hook: h.name().to_string(),
                error,
            })?;
        }
        Ok(())
    }
}

impl SessionHook for SessionHookStack {
    fn name(&self) -> &str {
        "hook-stack"
    }
    fn on_stage(&self, stage: HookStage, session: &mut AgentSession) -> Result<(), HookError> {
        self.run(stage, session).map_err(|f| HookError::Rejected {
            reason: format!("hook {} failed: {}", f.hook, f.error),
        })
    }
}
