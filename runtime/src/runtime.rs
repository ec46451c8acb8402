//! [`SessionRuntime`]: the create / read / execute boundary.
//!
//! # Create pipeline (`create`, and `fork` after loading the source)
//! 1. Build the session ([`SessionFactory`] rules; for `fork`,
//!    [`ForkSession::fork_owned`]: the loaded source is consumed and the
//!    kept path's entries move into the fork).
//! 2. BeforeCreate hooks. 3. BeforeSave hooks.
//! 4. `store.create` (version 0 → 1). On failure: `SessionSaveFailed`,
//!    the store error is returned.
//! 5. AfterSave hooks. 6. AfterCreate hooks.
//! 7. `SessionSaved`.
//!
//! # Execute pipeline (`execute`, `delete`)
//! 0. Writer check: while a writer handle is open on the session in this
//!    process (the one-writer-per-session registry of [`crate::handle`]),
//!    the pipeline refuses at once with `WriterHeld` and emits
//!    `[SessionActionFailed]` (kind `writer_held`); nothing is loaded or
//!    stored.
//! 1. Load, bounded (see "Bounded sessions"). Missing or failing:
//!    `SessionLoadFailed`, error returned. An execution the stored session
//!    shows in progress (a turn whose process died after some of its
//!    steps were committed) is finished as `Interrupted` first, with
//!    [`INTERRUPTED_ERROR`], in this execute's commit.
//! 2. AfterLoad hooks. 3. `SessionLoaded`.
//! 4. The action (a deleted session fails here with `SessionDeleted`).
//!    A `SendMessage` loop may commit steps here (see "Durable steps").
//! 5. AfterAction hooks. 6. BeforeSave hooks.
//! 7. `SessionActionExecuted` (the loaded version as `before_version`,
//!    the version the final save produces as `after_version`).
//! 8. The writer check again (a writer handle opened while the action
//!    ran): `WriterHeld`, reported as `SessionSaveFailed`, nothing stored.
//!    Then `store.save` (optimistic: a stale version is `Conflict`). On
//!    failure: `SessionSaveFailed`, error returned.
//! 9. AfterSave hooks. 10. `SessionSaved`.
//!
//! # Bounded sessions
//! On a store whose transcript backend has a settings fold (the log and
//! PostgreSQL stores), `execute` and `fork` at an entry never load a
//! session whole: the session is the fold of its non-transcript events
//! (header, definition, settings, execution bookkeeping; cached)
//! plus, as its transcript, the resident working set of the leaf's
//! context under [`SessionRuntime::with_resident_budget`] — the selection
//! a [`SessionHandle`] publishes, built by the same code. Hooks, actions
//! and the caller get that session; [`AgentSession::is_bounded`] tells,
//! [`AgentSession::history`] reads older entries, and navigation to an
//! entry beyond the working set reads it through the index (see
//! [`AgentSession::is_bounded`]). A session whose whole transcript is one
//! resident chain is loaded whole. What still loads whole: `get_session`
//! (on purpose), `fork(id, None)` (it copies every branch), an action
//! whose [`SessionAction::needs_whole_session`] is true (none of the
//! built-ins), and every execute on stores without a settings fold
//! (memory, file).
//!
//! # Durable steps
//! A `SendMessage` loop hands each produced entry to its step sink
//! ([`crate::agent_loop::StepSink`]); each hand-over is one commit under
//! the session version fence holding the events recorded so far (the
//! first one carries the user's message and `ExecutionStarted`), reported
//! to the observer as `SessionSaved` (or `SessionSaveFailed`, after which
//! the action fails with the store's error and nothing more is written).
//! Hooks do not run per step: the AfterLoad hooks ran before the first
//! step, and AfterAction, BeforeSave and AfterSave run once at the end of
//! the turn on the session whose steps are already committed (its pending
//! list holds only what came after the last step). A hook that rejects
//! the turn at BeforeSave therefore stores nothing *more*, but the steps
//! stay, and the execution reads as in progress until the next execute
//! records it `Interrupted`. A crash mid-turn leaves the same: the
//! acknowledged steps in order under the user's message, the execution in
//! progress. The version fence orders step commits against every other
//! writer: a concurrent execute or handle write makes the next step a
//! `Conflict`.
//!
//! # Fixes to the seed's contract
//! - `SessionActionExecuted` carries the loaded version as
//!   `before_version` and the version the save produces as `after_version`.
//! - A failing action emits `SessionActionFailed`; a failing hook emits
//!   `SessionHookFailed`; both return an error and (before the save) store
//!   nothing.
//! - Changes a post-persist hook (AfterSave, AfterCreate) makes are
//!   committed in one follow-up save after `SessionSaved`, reported by a
//!   second `SessionSaved` (or `SessionSaveFailed`); post-persist hooks do
//!   not run for the follow-up. A post-persist hook failure is reported
//!   (`SessionHookFailed`, then `SessionSaved` for the commit that did
//!   happen) and returned as `HookFailed { persisted_version: Some(v) }`.
//! - Status policy: see [`SessionStatus`]; Deleted is terminal.
//!   `delete` tombstones through the execute pipeline; `purge` removes.
//! - Reads (`get_session`, `session_info`, `list_sessions`) run no hooks
//!   and persist nothing. `get_session` reports `SessionLoaded` /
//!   `SessionLoadFailed`; `session_info` never loads state.
//!
//! # Writers: executes and handles
//! An execute does not take the writer slot: concurrent executes on one
//! session stay fenced by the session version alone (the loser gets
//! `Conflict`), and `open_handle` with a writer succeeds while an execute
//! runs. The execute then refuses at its second writer check, or, when the
//! handle opened between that check and the commit, the commit lands and
//! the handle's next write meets `HandleError::Conflict` (its snapshot is
//! older; `refresh` republishes). Nothing is ever lost or merged silently.
//! Executes from another process, or through another store instance,
//! are not in the registry: the version fence alone orders them.
//!
//! # Handle writes and hooks
//! Writes through a [`SessionHandle`] opened with
//! [`open_handle`](SessionRuntime::open_handle) (appends, leaf moves,
//! branches, labels, rewrites — `spool compact` among them) commit
//! transcript events without loading the session. Before each commit they
//! run this runtime's hooks at one stage, [`HookStage::BeforeHandleWrite`]
//! ([`SessionHook::on_handle_write`](crate::SessionHook::on_handle_write)),
//! by the same priority order: a hook sees the operation, the events about
//! to be committed and the session version they are fenced on, and may
//! reject the write but not change it. A rejection or failure commits
//! nothing, emits `SessionHookFailed` (stage `before_handle_write`) and
//! returns `HandleError::HookFailed`; the handle keeps its snapshot. No
//! other stage runs for handle writes: each hands a hook the loaded
//! `&mut AgentSession` (definition, settings, working set), and a handle
//! write never loads the session. Every committed handle write is
//! reported to this runtime's event sink as exactly one `SessionSaved`
//! with the committed session version and the session's status, after
//! the handle's replacement snapshot is published (also when that
//! publication fails: the commit happened); a refused, rejected or
//! conflicting write commits nothing and emits no `SessionSaved`. To act
//! after handle writes, listen for `SessionSaved` or subscribe to the
//! handle ([`SessionHandle::subscribe`]); for hooks that see or change the
//! session, move the leaf, branch or label through `execute` with
//! [`MoveLeaf`](crate::handle::MoveLeaf),
//! [`BranchWithSummary`](crate::handle::BranchWithSummary) or
//! [`SetLabel`](crate::handle::SetLabel), where every pipeline stage runs.

use std::path::Path;
use std::sync::Arc;

use crate::actions::{ActionError, DeleteSession, ForkSession, SessionAction};
use crate::error::RuntimeError;
use crate::handle::{
    load_bounded, writer_holder, writer_identity, HandleError, HandleOptions, SessionHandle,
};
use crate::hooks::{HookStage, SessionHookStack};
use crate::observer::{EventSink, NullSink, RuntimeEvent};
use crate::session::link::{save_linked, SessionLink};
use crate::session::{
    AgentDefinition, AgentSession, AgentSessionInfo, AgentState, ExecutionStatus, SessionFactory,
    SessionId, SessionInfoList, SessionStatus,
};
use crate::store::{ListQuery, LogStore, LogStoreOptions, SessionStore, StoreError};
use crate::transcript::{Budget, EntryId, Usage};

/// The error an execute records for an execution it found unfinished.
pub const INTERRUPTED_ERROR: &str =
    "the execution ended before it finished (the process stopped or a step could not be committed)";

/// Creates sessions, executes actions, applies hooks, emits events.
#[derive(Clone)]
pub struct SessionRuntime {
    store: Arc<dyn SessionStore>,
    events: Arc<dyn EventSink>,
    hooks: SessionHookStack,
    budget: Budget,
}

impl std::fmt::Debug for SessionRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRuntime")
            .field("hooks", &self.hooks)
            .finish_non_exhaustive()
    }
}

impl SessionRuntime {
    /// Opens the log store in `dir` (created if missing; this process
    /// becomes its single owner) with default options, and a runtime over
    /// it with no hooks and no observer. Add those with
    /// [`with_hooks`](Self::with_hooks) and [`with_events`](Self::with_events);
    /// other stores go through [`with_store`](Self::with_store).
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, RuntimeError> {
        let store = LogStore::open(dir.as_ref(), LogStoreOptions::default())?;
        Ok(Self::with_store(Arc::new(store)))
    }

    /// A runtime over `store` with no hooks and no observer.
    pub fn with_store(store: Arc<dyn SessionStore>) -> Self {
        Self::new(store, Arc::new(NullSink), SessionHookStack::empty())
    }

    /// This runtime with `events` as its observer.
    pub fn with_events(mut self, events: Arc<dyn EventSink>) -> Self {
        self.events = events;
        self
    }

    /// This runtime with `hooks` as its hook stack.
    pub fn with_hooks(mut self, hooks: SessionHookStack) -> Self {
        self.hooks = hooks;
        self
    }

    /// A runtime over `store` reporting to `events` and running `hooks`.
    pub fn new(
        store: Arc<dyn SessionStore>,
        events: Arc<dyn EventSink>,
        hooks: SessionHookStack,
    ) -> Self {
        SessionRuntime {
            store,
            events,
            hooks,
            budget: Budget::default(),
        }
    }

    /// This runtime with `budget` as the resident budget of the sessions
    /// `execute` and `fork` load bounded (default: [`Budget::default`]).
    pub fn with_resident_budget(mut self, budget: Budget) -> Self {
        self.budget = budget;
        self
    }

    /// The resident budget of bounded loads.
    pub fn resident_budget(&self) -> Budget {
        self.budget
    }

    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    pub fn hooks(&self) -> &SessionHookStack {
        &self.hooks
    }

    fn emit(&self, e: RuntimeEvent) {
        self.events.emit(&e);
    }

    fn run_hooks(
        &self,
        stage: HookStage,
        session: &mut AgentSession,
        persisted_version: Option<u64>,
    ) -> Result<(), RuntimeError> {
        self.hooks.run(stage, session).map_err(|f| {
            self.emit(RuntimeEvent::SessionHookFailed {
                session_id: session.id().clone(),
                stage,
                hook: f.hook.clone(),
                error: f.error.to_string(),
            });
            RuntimeError::HookFailed {
                id: session.id().clone(),
                stage,
                hook: f.hook,
                persisted_version,
                source: Box::new(f.error),
            }
        })
    }

    fn save_failed(&self, id: &SessionId, e: StoreError) -> RuntimeError {
        self.emit(RuntimeEvent::SessionSaveFailed {
            session_id: id.clone(),
            error: e.to_string(),
            error_kind: e.kind().to_string(),
        });
        RuntimeError::Store(e)
    }

    fn saved(&self, s: &AgentSession) {
        self.saved_as(s.id(), s.version(), s.status());
    }

    fn saved_as(&self, id: &SessionId, version: u64, status: SessionStatus) {
        self.emit(RuntimeEvent::SessionSaved {
            session_id: id.clone(),
            version,
            status,
        });
    }

    /// Runs post-persist hooks, emits `SessionSaved`, and commits any
    /// changes the hooks made in one follow-up save.
    fn after_persist(
        &self,
        mut session: AgentSession,
        stages: &[HookStage],
    ) -> Result<AgentSession, RuntimeError> {
        // What was committed, for the report (hooks may change the
        // session; its id and version are the store's).
        let (id, version, status) = (session.id().clone(), session.version(), session.status());
        for &stage in stages {
            if let Err(e) = self.run_hooks(stage, &mut session, Some(version)) {
                self.saved_as(&id, version, status);
                return Err(e);
            }
        }
        self.saved_as(&id, version, status);
        if session.pending_events().is_empty() {
            return Ok(session);
        }
        let id = session.id().clone();
        let follow_up = save_linked(&self.store, session).map_err(|e| self.save_failed(&id, e))?;
        self.saved(&follow_up);
        Ok(follow_up)
    }

    /// The create pipeline for an already built fresh session.
    fn create_session(&self, mut session: AgentSession) -> Result<AgentSession, RuntimeError> {
        self.run_hooks(HookStage::BeforeCreate, &mut session, None)?;
        self.run_hooks(HookStage::BeforeSave, &mut session, None)?;
        let id = session.id().clone();
        let persisted = self
            .store
            .create(session)
            .map_err(|e| self.save_failed(&id, e))?;
        self.after_persist(persisted, &[HookStage::AfterSave, HookStage::AfterCreate])
    }

    /// Creates and persists a new root session (version 1) from a
    /// definition and an optional seed state.
    pub fn create(
        &self,
        definition: AgentDefinition,
        seed: Option<AgentState>,
    ) -> Result<AgentSession, RuntimeError> {
        self.create_session(SessionFactory::create(definition, seed))
    }

    /// Headers from the store's header index: filtered, ordered, paged.
    /// Never loads a session's state.
    pub fn list_sessions(&self, query: &ListQuery) -> Result<SessionInfoList, RuntimeError> {
        Ok(self.store.list_headers(query)?)
    }

    /// One header, never a full load. Missing: `NotFound`.
    pub fn session_info(&self, id: &SessionId) -> Result<AgentSessionInfo, RuntimeError> {
        self.store
            .header(id)?
            .ok_or_else(|| RuntimeError::Store(StoreError::NotFound { id: id.clone() }))
    }

    fn load(&self, id: &SessionId) -> Result<AgentSession, RuntimeError> {
        let result = match self.store.load(id) {
            Ok(Some(s)) => return Ok(s),
            Ok(None) => StoreError::NotFound { id: id.clone() },
            Err(e) => e,
        };
        self.emit(RuntimeEvent::SessionLoadFailed {
            session_id: id.clone(),
            error: result.to_string(),
            error_kind: result.kind().to_string(),
        });
        Err(RuntimeError::Store(result))
    }

    /// Loads a session for an execute (or a fork at an entry): bounded
    /// when the store can ([`load_bounded`]), else whole; linked either
    /// way. Failures are reported as `SessionLoadFailed`.
    fn load_linked(&self, id: &SessionId, whole: bool) -> Result<AgentSession, RuntimeError> {
        let bounded = if whole {
            Ok(None)
        } else {
            load_bounded(&self.store, &self.events, id, self.budget)
        };
        match bounded {
            Ok(Some(s)) => Ok(s),
            Ok(None) => {
                let mut s = self.load(id)?;
                let loaded_entries = s.state().transcript.len();
                s.set_link(SessionLink {
                    store: Arc::downgrade(&self.store),
                    events: self.events.clone(),
                    bounded: None,
                    loaded_entries,
                });
                Ok(s)
            }
            Err(e) => {
                let e = match e {
                    StoreError::NotFound { .. } => StoreError::NotFound { id: id.clone() },
                    other => other,
                };
                self.emit(RuntimeEvent::SessionLoadFailed {
                    session_id: id.clone(),
                    error: e.to_string(),
                    error_kind: e.kind().to_string(),
                });
                Err(RuntimeError::Store(e))
            }
        }
    }

    fn loaded(&self, s: &AgentSession) {
        self.emit(RuntimeEvent::SessionLoaded {
            session_id: s.id().clone(),
            version: s.version(),
            status: s.status(),
        });
    }

    /// The whole session (a full load). Runs no hooks, persists nothing.
    pub fn get_session(&self, id: &SessionId) -> Result<AgentSession, RuntimeError> {
        let s = self.load(id)?;
        self.loaded(&s);
        Ok(s)
    }

    fn action_failed(&self, id: &SessionId, action: &str, e: ActionError) -> RuntimeError {
        let err = RuntimeError::from_action(id, action, e);
        self.emit(RuntimeEvent::SessionActionFailed {
            session_id: id.clone(),
            action: action.to_string(),
            error: err.to_string(),
            error_kind: err.kind().to_string(),
        });
        err
    }

    /// Loads the session, runs `action`, saves the result (version + 1)
    /// and returns it. See the module docs for the exact pipeline.
    pub fn execute(
        &self,
        id: &SessionId,
        action: &dyn SessionAction,
    ) -> Result<AgentSession, RuntimeError> {
        // One writer per session per process: an open writer handle owns
        // the session's writes here (checked before any work and again
        // just before the save; the version fence covers what slips
        // between the second check and the commit).
        let identity = writer_identity(&self.store);
        if let Some(holder) = writer_holder(&identity, id) {
            let err = RuntimeError::WriterHeld {
                id: id.clone(),
                holder,
            };
            self.emit(RuntimeEvent::SessionActionFailed {
                session_id: id.clone(),
                action: action.name().to_string(),
                error: err.to_string(),
                error_kind: err.kind().to_string(),
            });
            return Err(err);
        }
        let mut session = self.load_linked(id, action.needs_whole_session())?;
        if !session.is_deleted() && session.state().execution == ExecutionStatus::InProgress {
            // Steps of an earlier turn were committed, its end never was.
            session
                .finish_execution(
                    ExecutionStatus::Interrupted,
                    Usage::default(),
                    Some(INTERRUPTED_ERROR.to_string()),
                )
                .map_err(|e| self.action_failed(id, action.name(), e.into()))?;
        }
        self.run_hooks(HookStage::AfterLoad, &mut session, None)?;
        self.loaded(&session);
        let before_version = session.version();
        let before_status = session.status();
        if session.is_deleted() {
            return Err(self.action_failed(
                id,
                action.name(),
                ActionError::Session(crate::session::SessionError::Deleted { id: id.clone() }),
            ));
        }
        if let Err(e) = action.execute(&mut session) {
            return Err(self.action_failed(id, action.name(), e));
        }
        self.run_hooks(HookStage::AfterAction, &mut session, None)?;
        self.run_hooks(HookStage::BeforeSave, &mut session, None)?;
        if session.pending_events().is_empty() {
            // The save still advances the version; record why.
            session.touch();
        }
        self.emit(RuntimeEvent::SessionActionExecuted {
            session_id: id.clone(),
            action: action.name().to_string(),
            before_version,
            // Past the turn's step commits, if it made any.
            after_version: session.version().saturating_add(1),
            before_status,
            after_status: session.status(),
        });
        if let Some(holder) = writer_holder(&identity, id) {
            let err = RuntimeError::WriterHeld {
                id: id.clone(),
                holder,
            };
            self.emit(RuntimeEvent::SessionSaveFailed {
                session_id: id.clone(),
                error: err.to_string(),
                error_kind: err.kind().to_string(),
            });
            return Err(err);
        }
        let persisted = save_linked(&self.store, session).map_err(|e| self.save_failed(id, e))?;
        self.after_persist(persisted, &[HookStage::AfterSave])
    }

    /// Forks a session (whole when `at` is `None`, else at that entry) into
    /// a new session with `parent_id` = `id`, persisted through the create
    /// pipeline. Children are listable with [`ListQuery::children_of`].
    ///
    /// A fork at an entry loads the source bounded where the store can
    /// (the root→`at` path is read through the transcript index, no full
    /// load); a whole fork copies every branch and loads the source whole.
    pub fn fork(&self, id: &SessionId, at: Option<EntryId>) -> Result<AgentSession, RuntimeError> {
        if let Some(entry) = &at {
            let source = self.load_linked(id, false)?;
            self.loaded(&source);
            let forked = match source.fork(Some(entry)) {
                Ok(f) => f,
                Err(e) => return Err(self.action_failed(id, "fork_session", e.into())),
            };
            return self.create_session(forked);
        }
        let source = self.load(id)?;
        self.loaded(&source);
        let action = ForkSession { at };
        // The source was loaded for this fork only: its kept entries move
        // into the fork instead of being copied.
        let forked = match action.fork_owned(source) {
            Ok(f) => f,
            Err(e) => return Err(self.action_failed(id, "fork_session", e)),
        };
        self.create_session(forked)
    }

    /// Tombstones the session (status `Deleted`, version + 1) through the
    /// execute pipeline. It stays loadable and listable with
    /// `include_deleted`; every later action fails with `SessionDeleted`.
    pub fn delete(&self, id: &SessionId) -> Result<AgentSession, RuntimeError> {
        self.execute(id, &DeleteSession)
    }

    /// Removes the session from the store entirely; returns whether it
    /// existed. No hooks run.
    pub fn purge(&self, id: &SessionId) -> Result<bool, RuntimeError> {
        Ok(self.store.delete(id)?)
    }

    /// Opens a live handle on a session (see [`crate::handle`]): a bounded
    /// resident snapshot, transcript-level writes (for a writer handle; one
    /// per session per process), history reads and prepared rewrites.
    /// Each handle write runs this runtime's hooks at
    /// [`HookStage::BeforeHandleWrite`] before it is committed (a
    /// rejection commits nothing) and is reported to this runtime's event
    /// sink as `SessionSaved` (see the module docs). While
    /// a writer handle is open, `execute` and `delete` on the session
    /// refuse with `WriterHeld`.
    pub fn open_handle(
        &self,
        id: &SessionId,
        opts: HandleOptions,
    ) -> Result<SessionHandle, HandleError> {
        SessionHandle::open_with_hooks(
            self.store.clone(),
            self.events.clone(),
            self.hooks.clone(),
            id,
            opts,
        )
    }

    /// Convenience: the status of a session from its header.
    pub fn status(&self, id: &SessionId) -> Result<SessionStatus, RuntimeError> {
        Ok(self.session_info(id)?.status)
    }
}
