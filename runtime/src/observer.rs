//! Observer events of the runtime pipelines and their sinks.
//!
//! Sequences (see [`crate::runtime`]): create emits `[SessionSaved]`;
//! execute emits `[SessionLoaded, SessionActionExecuted, SessionSaved]`;
//! a missing session `[SessionLoadFailed]`; a stale save
//! `[SessionLoaded, SessionActionExecuted, SessionSaveFailed]`; a failed
//! create `[SessionSaveFailed]`. A failing action adds
//! `SessionActionFailed`, a failing hook `SessionHookFailed`. An execute
//! refused because a writer handle is open emits `[SessionActionFailed]`
//! (or, when the handle opened while the action ran, ends in
//! `SessionSaveFailed` instead of the save). A committed handle write
//! emits `[SessionSaved]`; one a hook rejects, `[SessionHookFailed]`
//! (stage `before_handle_write`). Each step a loop commits during an execute
//! adds one `SessionSaved` between `SessionLoaded` and
//! `SessionActionExecuted`.

use std::sync::{Mutex, RwLock};

use serde::Serialize;

use crate::hooks::HookStage;
use crate::session::{SessionId, SessionStatus};

/// Something the runtime did, for dashboards, audit logs and tests.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "event", rename_all = "snake_case")]
#[non_exhaustive]
pub enum RuntimeEvent {
    SessionLoaded {
        session_id: SessionId,
        version: u64,
        status: SessionStatus,
    },
    /// Emitted after the action and the AfterAction/BeforeSave hooks, just
    /// before the save. `before_version` is the loaded version;
    /// `after_version` is the version the save produces (`before + 1`,
    /// plus one per step the turn committed).
    SessionActionExecuted {
        session_id: SessionId,
        action: String,
        before_version: u64,
        after_version: u64,
        before_status: SessionStatus,
        after_status: SessionStatus,
    },
    SessionSaved {
        session_id: SessionId,
        version: u64,
        status: SessionStatus,
    },
    SessionLoadFailed {
        session_id: SessionId,
        error: String,
        error_kind: String,
    },
    SessionSaveFailed {
        session_id: SessionId,
        error: String,
        error_kind: String,
    },
    /// The action refused or failed (including any action on a deleted
    /// session); nothing was saved.
    SessionActionFailed {
        session_id: SessionId,
        action: String,
        error: String,
        error_kind: String,
    },
    SessionHookFailed {
        session_id: SessionId,
        stage: HookStage,
        hook: String,
        error: String,
    },
}

impl RuntimeEvent {
    /// The event's name (`SessionLoaded`, ...), handy for asserting sequences.
    pub fn name(&self) -> &'static str {
        match self {
            RuntimeEvent::SessionLoaded { .. } => "SessionLoaded",
            RuntimeEvent::SessionActionExecuted { .. } => "SessionActionExecuted",
            RuntimeEvent::SessionSaved { .. } => "SessionSaved",
            RuntimeEvent::SessionLoadFailed { .. } => "SessionLoadFailed",
            RuntimeEvent::SessionSaveFailed { .. } => "SessionSaveFailed",
            RuntimeEvent::SessionActionFailed { .. } => "SessionActionFailed",
            RuntimeEvent::SessionHookFailed { .. } => "SessionHookFailed",
        }
    }

    pub fn session_id(&self) -> &SessionId {
        match self {
            RuntimeEvent::SessionLoaded { session_id, .. }
            | RuntimeEvent::SessionActionExecuted { session_id, .. }
            | RuntimeEvent::SessionSaved { session_id, .. }
            | RuntimeEvent::SessionLoadFailed { session_id, .. }
            | RuntimeEvent::SessionSaveFailed { session_id, .. }
            | RuntimeEvent::SessionActionFailed { session_id, .. }
            | RuntimeEvent::SessionHookFailed { session_id, .. } => session_id,
        }
    }
}

/// Receives runtime events. Called synchronously on the runtime's thread;
/// keep it cheap.
pub trait EventSink: Send + Sync {
    fn emit(&self, event: &RuntimeEvent);
}

/// Discards every event.
#[derive(Clone, Copy, Debug, Default)]
pub struct NullSink;

impl EventSink for NullSink {
    fn emit(&self, _event: &RuntimeEvent) {}
}

type Listener = Box<dyn Fn(&RuntimeEvent) + Send + Sync>;

/// Fans events out to listeners, in registration order.
#[derive(Default)]
pub struct EventDispatcher {
    listeners: RwLock<Vec<Listener>>,
}

impl EventDispatcher {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add_listener(&self, f: impl Fn(&RuntimeEvent) + Send + Sync + 'static) {
        self.listeners
            .write()
            .unwrap_or_else(|p| p.into_inner())
            .push(Box::new(f));
    }
}

impl EventSink for EventDispatcher {
    fn emit(&self, event: &RuntimeEvent) {
        for l in self
            .listeners
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            l(event);
        }
    }
}

/// Keeps every event in memory (tests, the demo).
#[derive(Debug, Default)]
pub struct RecordingSink {
    events: Mutex<Vec<RuntimeEvent>>,
}

impl RecordingSink {
    pub fn new() -> Self {
        Self::default()
    }

    /// A copy of the events so far.
    pub fn events(&self) -> Vec<RuntimeEvent> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The names of the events so far.
    pub fn names(&self) -> Vec<&'static str> {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(RuntimeEvent::name)
            .collect()
    }

    /// Removes and returns the events so far.
    pub fn take(&self) -> Vec<RuntimeEvent> {
        std::mem::take(&mut *self.events.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl EventSink for RecordingSink {
    fn emit(&self, event: &RuntimeEvent) {
        self.events
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(event.clone());
    }
}
