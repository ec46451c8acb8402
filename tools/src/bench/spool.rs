//! The spool subject: the real engine and runtime under the harness.
//!
//! - `append-*`: each record is one commit of one `entry_appended` session
//!   event (the same bytes the log store writes for a transcript append)
//!   under the session's exact version fence, through the engine the log
//!   store owns. `Durable` is `Immediate` (fdatasync, group commit);
//!   `Buffered` is `Buffered`.
//! - `list`: `SessionStore::list_headers` with a status filter, answered by
//!   the log store's header index (no session is loaded).

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use spool_runtime::session::{
    encode_event, AgentDefinition, AgentSession, SessionEvent, SessionId, SessionStatus,
};
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::transcript::{
    ContentBlock, Entry, EntryId, EntryKind, Message, StopReason, Usage,
};
use spool_runtime::ListQuery;

use spool_engine::{AppendOutcome, EventData, ExpectedVersion, NewCommit};

use super::data::{Record, Role};
use super::{
    BenchError, Durability, SessionData, SessionSpec, SpoolSubject, Status, SubjectStore, Workload,
};

/// spool itself.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spool;

fn subject_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Subject {
        subject: "spool".into(),
        message: e.to_string(),
    }
}

fn status_of(s: Status) -> SessionStatus {
    match s {
        Status::Active => SessionStatus::Active,
        Status::Suspended => SessionStatus::Suspended,
        Status::Completed => SessionStatus::Completed,
        Status::Failed => SessionStatus::Failed,
    }
}

/// The transcript entry a record becomes. Entry ids are `e<seq>`; each
/// entry's parent is the previous one. Tool results become custom
/// messages (sent to the model, like a tool's output) because the
/// generated records carry no tool call to pair them with.
pub fn entry_for(seq: u64, record: &Record) -> Entry {
    let id = EntryId::parse(&format!("e{seq}")).expect("generated ids are valid");
    let parent = (seq > 0).then(|| EntryId::parse(&format!("e{}", seq - 1)).expect("valid"));
    let text = vec![ContentBlock::text(record.text.clone())];
    let kind = match record.role {
        Role::User => EntryKind::Message {
            message: Message::User { content: text },
        },
        Role::Assistant => EntryKind::Message {
            message: Message::Assistant {
                content: text,
                stop_reason: StopReason::Stop,
                usage: Usage::default(),
                model: None,
                error_message: None,
            },
        },
        Role::ToolResult => EntryKind::CustomMessage {
            custom_type: "tool_output".into(),
            content: text,
            display: true,
            details: None,
        },
    };
    Entry {
        id,
        parent_id: parent,
        timestamp_ms: super::data::BASE_TIMESTAMP_MS + seq as i64,
        kind,
    }
}

fn definition() -> AgentDefinition {
    AgentDefinition::new("bench-agent", "benchmark sessions", "You are benchmarked.")
}

impl SpoolSubject for Spool {
    fn name(&self) -> &str {
        "spool"
    }

    fn supports(&self, workload: Workload) -> bool {
        matches!(
            workload,
            Workload::AppendDurable | Workload::AppendBuffered | Workload::List
        )
    }

    fn open_store(
        &self,
        dir: &Path,
        durability: Durability,
        writers: usize,
    ) -> Result<Box<dyn SubjectStore>, BenchError> {
        let opts = LogStoreOptions {
            durability: match durability {
                Durability::Durable => spool_engine::Durability::Immediate,
                Durability::Buffered => spool_engine::Durability::Buffered,
            },
            ..LogStoreOptions::default()
        };
        let store = LogStore::open(dir, opts).map_err(subject_err)?;
        Ok(Box::new(SpoolStore {
            store: Arc::new(store),
            heads: (0..writers.max(1))
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }))
    }
}

struct SpoolStore {
    store: Arc<LogStore>,
    /// Per writer thread: session id -> stream version it last wrote.
    heads: Vec<Mutex<HashMap<String, u64>>>,
}

impl SpoolStore {
    fn heads(&self, writer: usize) -> &Mutex<HashMap<String, u64>> {
        &self.heads[writer % self.heads.len()]
    }

    fn session_for(spec: &SessionSpec, records: &[Record]) -> Result<AgentSession, BenchError> {
        let id = SessionId::parse(&spec.id()).map_err(subject_err)?;
        let mut s = AgentSession::new_with_id(id, definition(), None);
        for (seq, r) in records.iter().enumerate() {
            s.append_entry(entry_for(seq as u64, r))
                .map_err(subject_err)?;
        }
        if spec.status != Status::Active {
            s.set_status(status_of(spec.status)).map_err(subject_err)?;
        }
        Ok(s)
    }
}

impl SubjectStore for SpoolStore {
    fn create_session(&self, writer: usize, session: &SessionSpec) -> Result<(), BenchError> {
        let s = Self::session_for(session, &[])?;
        let created = self.store.create(s).map_err(subject_err)?;
        self.heads(writer)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.id(), created.version());
        Ok(())
    }

    fn append(
        &self,
        writer: usize,
        session: &SessionSpec,
        seq: u64,
        record: &Record,
    ) -> Result<u64, BenchError> {
        let id = session.id();
        let mut heads = self.heads(writer).lock().unwrap_or_else(|p| p.into_inner());
        let version = *heads
            .get(&id)
            .ok_or_else(|| subject_err(format!("session {id} was not created")))?;
        let event = SessionEvent::EntryAppended {
            entry: entry_for(seq, record),
        };
        let payload = encode_event(&event).map_err(subject_err)?;
        let engine = self.store.engine().map_err(subject_err)?;
        let outcome = engine
            .append(NewCommit {
                stream: id.clone(),
                expected: ExpectedVersion::Exact(version),
                commit_id: uuid::Uuid::new_v4(),
                events: vec![EventData::new("session.entry_appended", payload)],
            })
            .map_err(subject_err)?;
        match outcome {
            AppendOutcome::Committed(info) => {
                heads.insert(id, info.version);
                Ok(record.bytes() as u64)
            }
            other => Err(subject_err(format!("unexpected append outcome {other:?}"))),
        }
    }

    fn load(&self, sessions: &[SessionData<'_>]) -> Result<(), BenchError> {
        for s in sessions {
            let session = Self::session_for(s.spec, s.records)?;
            self.store.create(session).map_err(subject_err)?;
        }
        Ok(())
    }

    fn list_by_status(&self, status: Status) -> Result<u64, BenchError> {
        let list = self
            .store
            .list_headers(&ListQuery::all().with_status(status_of(status)))
            .map_err(subject_err)?;
        Ok(list.headers.len() as u64)
    }

    fn close(self: Box<Self>) -> Result<(), BenchError> {
        let store =
            Arc::try_unwrap(self.store).map_err(|_| subject_err("store still shared at close"))?;
        store.close().map_err(subject_err)
    }

    fn subject(&self) -> &str {
        "spool"
    }
}
