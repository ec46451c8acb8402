//! Shared helpers of the handle tests.
#![allow(dead_code)]

use std::path::Path;
use std::sync::Arc;

use spool_engine::Durability;
use spool_runtime::handle::{HandleOptions, SessionHandle};
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::RecordingSink;
use spool_runtime::session::{AgentDefinition, SessionId};
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::transcript::{
    ContentBlock, Entry, EntryKind, Message, StopReason, Transcript, Usage,
};
use spool_runtime::SessionRuntime;

pub fn log_options() -> LogStoreOptions {
    LogStoreOptions {
        // Tests need atomicity, not durability across power loss.
        durability: Durability::Buffered,
        ..LogStoreOptions::default()
    }
}

pub fn open_log(dir: &Path) -> Arc<LogStore> {
    Arc::new(LogStore::open(dir, log_options()).expect("open log store"))
}

pub fn runtime(store: Arc<dyn SessionStore>) -> (SessionRuntime, Arc<RecordingSink>) {
    let sink = Arc::new(RecordingSink::new());
    (
        SessionRuntime::new(store, sink.clone(), SessionHookStack::empty()),
        sink,
    )
}

pub fn new_session(rt: &SessionRuntime) -> SessionId {
    let def = AgentDefinition {
        name: "tester".into(),
        ..AgentDefinition::default()
    };
    rt.create(def, None).expect("create").id().clone()
}

pub fn writer(rt: &SessionRuntime, id: &SessionId, bytes: u64) -> SessionHandle {
    rt.open_handle(
        id,
        HandleOptions::writer().with_budget(spool_runtime::transcript::Budget::new(bytes, 1024)),
    )
    .expect("open writer handle")
}

pub fn user(text: impl Into<String>) -> EntryKind {
    EntryKind::Message {
        message: Message::User {
            content: vec![ContentBlock::text(text)],
        },
    }
}

pub fn assistant(text: impl Into<String>, stop: StopReason) -> EntryKind {
    EntryKind::Message {
        message: Message::Assistant {
            content: vec![ContentBlock::text(text)],
            stop_reason: stop,
            usage: Usage::default(),
            model: Some("prov/model-a".into()),
            error_message: None,
        },
    }
}

pub fn custom(custom_type: &str, data: serde_json::Value) -> EntryKind {
    EntryKind::Custom {
        custom_type: custom_type.into(),
        data: data.into(),
    }
}

/// A message of about `bytes` bytes (entry size a bit more).
pub fn sized(i: usize, bytes: usize) -> EntryKind {
    let filler = "x".repeat(bytes.saturating_sub(40));
    if i.is_multiple_of(2) {
        user(format!("u{i} {filler}"))
    } else {
        assistant(format!("a{i} {filler}"), StopReason::Stop)
    }
}

/// The whole transcript as stored (a full load).
pub fn full_transcript(store: &dyn SessionStore, id: &SessionId) -> Transcript {
    store
        .load(id)
        .expect("load")
        .expect("session exists")
        .state()
        .transcript
        .clone()
}

/// The resident suffix of the full path: the context entries of `leaf`
/// restricted to the ids of `resident`.
pub fn path_entries(t: &Transcript) -> Vec<Entry> {
    t.current_path()
        .expect("path")
        .into_iter()
        .cloned()
        .collect()
}
