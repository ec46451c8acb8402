//! Shared test helpers.
#![allow(dead_code)]

use std::sync::{Arc, Mutex};

use spool_runtime::hooks::{HookError, HookStage, SessionHook, SessionHookStack};
use spool_runtime::observer::{EventSink, RecordingSink, RuntimeEvent};
use spool_runtime::session::{AgentDefinition, AgentSession, ModelConfig};
use spool_runtime::store::{MemoryStore, SessionStore};
use spool_runtime::SessionRuntime;

pub fn definition(name: &str) -> AgentDefinition {
    AgentDefinition::new(name, "test agent", "You are helpful.")
        .with_model(ModelConfig::new("scripted", "base"))
}

/// A shared trace of hook calls and observer events, in order.
#[derive(Clone, Default)]
pub struct Trace(pub Arc<Mutex<Vec<String>>>);

impl Trace {
    pub fn push(&self, s: impl Into<String>) {
        self.0.lock().unwrap().push(s.into());
    }
    pub fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

impl EventSink for Trace {
    fn emit(&self, e: &RuntimeEvent) {
        self.push(format!("event:{}", e.name()));
    }
}

/// A hook that records `name:stage` into a trace.
pub struct TraceHook {
    pub name: String,
    pub trace: Trace,
}

impl SessionHook for TraceHook {
    fn name(&self) -> &str {
        &self.name
    }
    fn on_stage(&self, stage: HookStage, _s: &mut AgentSession) -> Result<(), HookError> {
        self.trace.push(format!("{}:{}", self.name, stage));
        Ok(())
    }
}

pub fn memory_runtime() -> (SessionRuntime, Arc<MemoryStore>, Arc<RecordingSink>) {
    memory_runtime_with(SessionHookStack::empty())
}

pub fn memory_runtime_with(
    hooks: SessionHookStack,
) -> (SessionRuntime, Arc<MemoryStore>, Arc<RecordingSink>) {
    let store = Arc::new(MemoryStore::new());
    let sink = Arc::new(RecordingSink::new());
    let rt = SessionRuntime::new(store.clone() as Arc<dyn SessionStore>, sink.clone(), hooks);
    (rt, store, sink)
}
