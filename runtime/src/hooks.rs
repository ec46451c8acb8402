//! Pipeline hooks (the seed's session controllers).
//!
//! A hook sees the session at six of the [`HookStage`]s of the create and
//! execute pipelines ([`SessionHook::on_stage`]) and may change it through
//! its mutation methods (which record events like any action).
//! [`SessionHookStack`] runs hooks by priority: higher first; equal
//! priorities keep registration order. A failing hook stops the pipeline,
//! is reported as `SessionHookFailed`, and the runtime returns
//! `RuntimeError::HookFailed`.
//!
//! Changes made at AfterSave / AfterCreate (after the commit) are not
//! dropped: the runtime commits them in one follow-up save (reported by a
//! second `SessionSaved`). Post-persist hooks do not run again for that
//! follow-up commit.
//!
//! Writes through a [`SessionHandle`](crate::SessionHandle) opened by the
//! runtime run one stage, [`HookStage::BeforeHandleWrite`]
//! ([`SessionHook::on_handle_write`]), in the same order, before anything
//! is committed: a hook sees the events about to be committed
//! ([`HandleWrite`]) and may reject them, not change them. A handle never
//! loads the session, so no other stage runs for its writes. A rejection
//! commits nothing, is reported as `SessionHookFailed`, and the handle
//! returns `HandleError::HookFailed`.

use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::session::{AgentSession, SessionError, SessionEvent, SessionId};

/// Where in a pipeline a hook runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
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
    /// Handle writes only: before a write through a handle is committed
    /// (see [`SessionHook::on_handle_write`]).
    BeforeHandleWrite,
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
            HookStage::BeforeHandleWrite => "before_handle_write",
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

/// A write through a session handle, about to be committed: what a hook
/// sees at [`HookStage::BeforeHandleWrite`].
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct HandleWrite<'a> {
    pub session_id: &'a SessionId,
    /// The handle operation: `append`, `branch_with_summary`, `set_label`,
    /// `move_leaf` or `rewrite`.
    pub cause: &'static str,
    /// The events the write commits, in order, all or none.
    pub events: &'a [SessionEvent],
    /// The session version the write is fenced on: the commit succeeds
    /// only if the stored session is still at this version (and produces
    /// the next one).
    pub expected_version: u64,
}

/// Intercepts the runtime pipelines (the seed's `CanControlAgentSession`).
pub trait SessionHook: Send + Sync {
    /// A name for error messages and observer events.
    fn name(&self) -> &str;
    /// Sees (and may change) the session at `stage` of the create and
    /// execute pipelines. Stages a hook does not care about should return
    /// `Ok(())`.
    fn on_stage(&self, stage: HookStage, session: &mut AgentSession) -> Result<(), HookError>;
    /// Sees a write through a handle opened by the runtime before it is
    /// committed ([`HookStage::BeforeHandleWrite`]); an error rejects it
    /// and nothing is committed. Runs with the handle's write lock held:
    /// it must not write through that handle. Default: accepts.
    fn on_handle_write(&self, write: &HandleWrite<'_>) -> Result<(), HookError> {
        let _ = write;
        Ok(())
    }
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

/// A hook made from a closure that sees handle writes only
/// ([`SessionHook::on_handle_write`]); it passes every pipeline stage.
pub struct FnHandleWriteHook<F> {
    name: String,
    f: F,
}

impl<F> FnHandleWriteHook<F>
where
    F: Fn(&HandleWrite<'_>) -> Result<(), HookError> + Send + Sync,
{
    pub fn new(name: impl Into<String>, f: F) -> Self {
        FnHandleWriteHook {
            name: name.into(),
            f,
        }
    }
}

impl<F> SessionHook for FnHandleWriteHook<F>
where
    F: Fn(&HandleWrite<'_>) -> Result<(), HookError> + Send + Sync,
{
    fn name(&self) -> &str {
        &self.name
    }
    fn on_stage(&self, _stage: HookStage, _session: &mut AgentSession) -> Result<(), HookError> {
        Ok(())
    }
    fn on_handle_write(&self, write: &HandleWrite<'_>) -> Result<(), HookError> {
        (self.f)(write)
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

    /// Runs every hook's [`SessionHook::on_handle_write`] in order; stops
    /// at the first failure.
    pub fn run_handle_write(&self, write: &HandleWrite<'_>) -> Result<(), StackFailure> {
        for (_, h) in &self.hooks {
            h.on_handle_write(write).map_err(|error| StackFailure {
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
    fn on_handle_write(&self, write: &HandleWrite<'_>) -> Result<(), HookError> {
        self.run_handle_write(write)
            .map_err(|f| HookError::Rejected {
                reason: format!("hook {} failed: {}", f.hook, f.error),
            })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// Records its name on every handle write; `reject`: refuses them.
    struct Probe {
        name: &'static str,
        ran: Arc<Mutex<Vec<&'static str>>>,
        reject: bool,
    }

    impl SessionHook for Probe {
        fn name(&self) -> &str {
            self.name
        }
        fn on_stage(&self, _: HookStage, _: &mut AgentSession) -> Result<(), HookError> {
            Ok(())
        }
        fn on_handle_write(&self, _: &HandleWrite<'_>) -> Result<(), HookError> {
            self.ran.lock().unwrap().push(self.name);
            if self.reject {
                return Err(HookError::rejected("refused"));
            }
            Ok(())
        }
    }

    fn probe(name: &'static str, ran: &Arc<Mutex<Vec<&'static str>>>, reject: bool) -> Probe {
        Probe {
            name,
            ran: ran.clone(),
            reject,
        }
    }

    #[test]
    fn handle_writes_run_by_priority_and_stop_at_the_first_failure() {
        let id = SessionId::generate();
        let write = HandleWrite {
            session_id: &id,
            cause: "append",
            events: &[],
            expected_version: 3,
        };
        let ran = Arc::new(Mutex::new(Vec::new()));
        let stack = SessionHookStack::empty()
            .with(probe("low", &ran, false), -1)
            .with(probe("first", &ran, false), 5)
            .with(PassThroughHook, 7)
            .with(
                FnHook::new("stages", |_, _: &mut AgentSession| {
                    Err(HookError::rejected("stage"))
                }),
                9,
            )
            .with(probe("second", &ran, false), 5);
        stack.run_handle_write(&write).unwrap();
        assert_eq!(*ran.lock().unwrap(), ["first", "second", "low"]);

        ran.lock().unwrap().clear();
        let stack = stack.with(probe("gate", &ran, true), 6);
        let failure = stack.run_handle_write(&write).unwrap_err();
        assert_eq!(failure.hook, "gate");
        assert!(matches!(failure.error, HookError::Rejected { .. }));
        assert_eq!(*ran.lock().unwrap(), ["gate"]);
        // A stack nested as a hook reports the inner hook's failure.
        let err = stack.on_handle_write(&write).unwrap_err();
        assert_eq!(
            err.to_string(),
            "rejected: hook gate failed: rejected: refused"
        );
    }

    #[test]
    fn a_closure_hook_sees_handle_writes() {
        let id = SessionId::generate();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let s = seen.clone();
        let hook = FnHandleWriteHook::new("audit", move |w: &HandleWrite<'_>| {
            s.lock()
                .unwrap()
                .push((w.session_id.clone(), w.cause, w.expected_version));
            Ok(())
        });
        let write = HandleWrite {
            session_id: &id,
            cause: "move_leaf",
            events: &[SessionEvent::LeafMoved { leaf: None }],
            expected_version: 8,
        };
        SessionHookStack::empty()
            .with(hook, 0)
            .run_handle_write(&write)
            .unwrap();
        assert_eq!(*seen.lock().unwrap(), [(id, "move_leaf", 8)]);
    }

    #[test]
    fn the_stage_name_is_its_serialized_name() {
        let stage = HookStage::BeforeHandleWrite;
        assert_eq!(stage.to_string(), "before_handle_write");
        assert_eq!(
            serde_json::to_value(stage).unwrap(),
            serde_json::json!("before_handle_write")
        );
    }
}
