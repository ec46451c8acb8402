//! The spool subject: the public handle API of the runtime over the log
//! store, used as an embedding application uses it.
//!
//! - `append-*`: every writer thread holds one writer [`SessionHandle`]
//!   per session (opened untimed, with the 64 KiB default budget) and calls
//!   [`SessionHandle::append_entry`] once per record: one commit per
//!   record under the session's version fence, followed by the
//!   publication of the handle's replacement snapshot. `Durable` is the
//!   engine's `Immediate` (fdatasync, group commit); `Buffered` is
//!   `Buffered`.
//! - `open`: [`SessionRuntime::open_handle`] with a read-only handle and a
//!   byte budget, then its snapshot's model context.
//! - `page`: a read-only handle whose snapshot holds nothing (budget 0),
//!   then [`HistorySelection::BranchPage`] root first, in pages of the
//!   page budget, until the read is complete.
//! - `list`: `SessionStore::list_headers` with a status filter, answered by
//!   the log store's header index (no session is loaded).
//! - `fork`: [`SessionRuntime::fork`] at the middle entry (durable), then
//!   the fork opened as in `open`.
//!
//! Loading (untimed, on a buffered store) commits each entry as its own
//! `entry_appended` commit through the store's transcript backend — the
//! log layout the appends of an application leave — or, for sessions of
//! at most [`LOAD_IN_CREATE_MAX`] entries (the `list` workload), inside
//! the `created` event.
//!
//! **Units.** spool's budgets count [`entry_size`] (the length of the
//! entry's compact JSON), so [`SubjectStore::entry_cost`] is that size of
//! the entry this subject stores; the harness derives spool's expected
//! context and page contents from it. Page byte figures are text bytes,
//! like every subject's.
//!
//! **Tool results** become custom messages (`tool_output`, shown, sent to
//! the model): the generated records carry no tool calls, so a tool-result
//! message would answer no call, and the context builder drops an orphan
//! tool result. A custom message is what the context keeps as is.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use spool_runtime::handle::{HandleOptions, HistorySelection, SessionHandle};
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::session::{
    AgentDefinition, AgentSession, SessionEvent, SessionId, SessionStatus,
};
use spool_runtime::store::TranscriptBackend;
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::transcript::{
    entry_size, Budget, CancelToken, ContentBlock, Entry, EntryId, EntryKind, Message, PageBudget,
    PageOrder, ReadResult, StopReason, Usage, DEFAULT_RESIDENT_EVENTS_MAX,
};
use spool_runtime::{ListQuery, SessionRuntime};

use crate::data::{Record, Role};
use crate::error::BenchError;
use crate::subject::{
    ContextSummary, Durability, PageSummary, SessionData, SessionSpec, SpoolSubject, Status,
    SubjectStore,
};
use crate::workloads::Workload;

/// Sessions with at most this many entries are created with their
/// transcript inside the `created` event (the `list` workload's sessions).
pub const LOAD_IN_CREATE_MAX: usize = 64;

/// Entries per branch page at most. A root-first page is found from its
/// last entry (the active-path index) and walked back over this many
/// entries' index records, so the count bounds the work per page; 64
/// entries hold about 90 KB of the generated mix on average, so the
/// 64 KiB byte budget binds on most pages.
pub const PAGE_EVENTS_MAX: u64 = 64;

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

fn entry_id(seq: u64) -> Result<EntryId, BenchError> {
    EntryId::parse(&format!("e{seq}")).map_err(subject_err)
}

/// The transcript entry a record becomes. Entry ids are `e<seq>`; each
/// entry's parent is the previous one. Tool results become custom
/// messages (see the module docs).
pub fn entry_for(seq: u64, record: &Record) -> Result<Entry, BenchError> {
    let id = entry_id(seq)?;
    let parent = match seq.checked_sub(1) {
        Some(p) => Some(entry_id(p)?),
        None => None,
    };
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
    Ok(Entry {
        id,
        parent_id: parent,
        timestamp_ms: crate::data::BASE_TIMESTAMP_MS + seq as i64,
        kind,
    })
}

/// Text bytes of an entry built by [`entry_for`] (what the harness counts
/// for every subject).
fn text_bytes(e: &Entry) -> u64 {
    let blocks = match &e.kind {
        EntryKind::Message {
            message: Message::User { content },
        }
        | EntryKind::Message {
            message: Message::Assistant { content, .. },
        }
        | EntryKind::CustomMessage { content, .. } => content.as_slice(),
        _ => &[],
    };
    blocks
        .iter()
        .map(|b| match b {
            ContentBlock::Text { text } => text.len() as u64,
            _ => 0,
        })
        .sum()
}

fn definition() -> AgentDefinition {
    AgentDefinition::new("bench-agent", "benchmark sessions", "You are benchmarked.")
}

impl SpoolSubject for Spool {
    fn name(&self) -> &str {
        "spool"
    }

    fn supports(&self, _workload: Workload) -> bool {
        true
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
        let store = Arc::new(LogStore::open(dir, opts).map_err(subject_err)?);
        let runtime =
            SessionRuntime::new(store.clone(), Arc::new(NullSink), SessionHookStack::empty());
        Ok(Box::new(SpoolStore {
            store,
            runtime,
            writers: (0..writers.max(1))
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
            page_reader: Mutex::new(None),
        }))
    }
}

struct SpoolStore {
    store: Arc<LogStore>,
    runtime: SessionRuntime,
    /// Per writer thread: its writer handles by session id.
    writers: Vec<Mutex<HashMap<String, SessionHandle>>>,
    /// A read-only handle kept open for first-page reads.
    page_reader: Mutex<Option<SessionHandle>>,
}

impl SpoolStore {
    fn writers(&self, writer: usize) -> &Mutex<HashMap<String, SessionHandle>> {
        &self.writers[writer % self.writers.len()]
    }

    fn new_session(spec: &SessionSpec, records: &[Record]) -> Result<AgentSession, BenchError> {
        let id = SessionId::parse(&spec.id()).map_err(subject_err)?;
        let mut s = AgentSession::new_with_id(id, definition(), None);
        for (seq, r) in records.iter().enumerate() {
            s.append_entry(entry_for(seq as u64, r)?)
                .map_err(subject_err)?;
        }
        if spec.status != Status::Active {
            s.set_status(status_of(spec.status)).map_err(subject_err)?;
        }
        Ok(s)
    }

    fn session_id(spec: &SessionSpec) -> Result<SessionId, BenchError> {
        SessionId::parse(&spec.id()).map_err(subject_err)
    }

    /// Opens a read-only handle with `budget` bytes and builds the model
    /// context from its snapshot.
    fn open_id(&self, id: &SessionId, budget: usize) -> Result<ContextSummary, BenchError> {
        let h = self
            .runtime
            .open_handle(
                id,
                HandleOptions::reader()
                    .with_budget(Budget::new(budget as u64, DEFAULT_RESIDENT_EVENTS_MAX)),
            )
            .map_err(subject_err)?;
        let snap = h.snapshot();
        let context = snap.context();
        Ok(ContextSummary {
            entries: context.messages.len() as u64,
            bytes: snap.resident_bytes(),
            resident_bytes: Some(snap.resident_bytes()),
        })
    }

    /// Reads one root-first branch page of `h` after `cursor`.
    fn page(
        h: &SessionHandle,
        leaf: &EntryId,
        cursor: Option<spool_runtime::transcript::Continuation>,
        page_budget: usize,
    ) -> Result<(Vec<Entry>, Option<spool_runtime::transcript::Continuation>), BenchError> {
        let selection = HistorySelection::BranchPage {
            leaf: leaf.clone(),
            order: PageOrder::RootFirst,
            cursor,
            budget: PageBudget::new(page_budget as u64, PAGE_EVENTS_MAX),
        };
        let result = h
            .read(&selection, &CancelToken::new())
            .map_err(subject_err)?;
        let (value, next) = match result {
            ReadResult::Complete { value, .. } => (value, None),
            ReadResult::Page {
                value,
                continuation,
            } => (value, Some(continuation)),
            other => return Err(subject_err(format!("branch page read: {other:?}"))),
        };
        let page = value
            .into_page()
            .ok_or_else(|| subject_err("a branch read returned no page"))?;
        Ok((page.entries, next))
    }

    fn page_summary(entries: &[Entry], s: &mut PageSummary) {
        s.pages += 1;
        s.entries += entries.len() as u64;
        s.bytes += entries.iter().map(text_bytes).sum::<u64>();
    }
}

impl SubjectStore for SpoolStore {
    fn create_session(&self, writer: usize, session: &SessionSpec) -> Result<(), BenchError> {
        let s = Self::new_session(session, &[])?;
        let created = self.store.create(s).map_err(subject_err)?;
        let h = self
            .runtime
            .open_handle(created.id(), HandleOptions::writer())
            .map_err(subject_err)?;
        self.writers(writer)
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(session.id(), h);
        Ok(())
    }

    fn append(
        &self,
        writer: usize,
        session: &SessionSpec,
        seq: u64,
        record: &Record,
    ) -> Result<u64, BenchError> {
        let entry = entry_for(seq, record)?;
        let handles = self
            .writers(writer)
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let h = handles
            .get(&session.id())
            .ok_or_else(|| subject_err(format!("session {} was not created", session.id())))?;
        h.append_entry(entry).map_err(subject_err)?;
        Ok(record.bytes() as u64)
    }

    fn entry_cost(&self, record: &Record, seq: u64) -> usize {
        entry_for(seq, record)
            .map(|e| usize::try_from(entry_size(&e)).unwrap_or(usize::MAX))
            .unwrap_or(usize::MAX)
    }

    fn load(&self, sessions: &[SessionData<'_>]) -> Result<(), BenchError> {
        for s in sessions {
            if s.records.len() <= LOAD_IN_CREATE_MAX {
                let session = Self::new_session(s.spec, s.records)?;
                self.store.create(session).map_err(subject_err)?;
                continue;
            }
            let created = self
                .store
                .create(Self::new_session(s.spec, &[])?)
                .map_err(subject_err)?;
            let mut version = created.version();
            // One commit per entry: the log holds what an application's
            // appends leave there (reads then cost what they would).
            for (seq, r) in s.records.iter().enumerate() {
                let entry = entry_for(seq as u64, r)?;
                version = self
                    .store
                    .append_events(
                        created.id(),
                        version,
                        vec![SessionEvent::EntryAppended { entry }],
                    )
                    .map_err(subject_err)?
                    .session_version;
            }
        }
        Ok(())
    }

    fn open_context(
        &self,
        session: &SessionSpec,
        budget: usize,
    ) -> Result<ContextSummary, BenchError> {
        self.open_id(&Self::session_id(session)?, budget)
    }

    fn read_branch(
        &self,
        session: &SessionSpec,
        page_budget: usize,
    ) -> Result<PageSummary, BenchError> {
        let h = self
            .runtime
            .open_handle(
                &Self::session_id(session)?,
                HandleOptions::reader().with_budget(Budget::new(0, 0)),
            )
            .map_err(subject_err)?;
        let Some(leaf) = h.snapshot().leaf.clone() else {
            return Ok(PageSummary::default());
        };
        let mut summary = PageSummary::default();
        let mut cursor = None;
        loop {
            let (entries, next) = Self::page(&h, &leaf, cursor, page_budget)?;
            Self::page_summary(&entries, &mut summary);
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        Ok(summary)
    }

    fn first_page(
        &self,
        session: &SessionSpec,
        page_budget: usize,
    ) -> Result<PageSummary, BenchError> {
        let mut reader = self.page_reader.lock().unwrap_or_else(|p| p.into_inner());
        let id = Self::session_id(session)?;
        if reader.as_ref().is_none_or(|h| h.session_id() != &id) {
            *reader = Some(
                self.runtime
                    .open_handle(&id, HandleOptions::reader().with_budget(Budget::new(0, 0)))
                    .map_err(subject_err)?,
            );
        }
        let h = reader
            .as_ref()
            .ok_or_else(|| subject_err("no page reader"))?;
        let Some(leaf) = h.snapshot().leaf.clone() else {
            return Ok(PageSummary::default());
        };
        let (entries, _) = Self::page(h, &leaf, None, page_budget)?;
        let mut summary = PageSummary::default();
        Self::page_summary(&entries, &mut summary);
        Ok(summary)
    }

    fn list_by_status(&self, status: Status) -> Result<u64, BenchError> {
        let list = self
            .store
            .list_headers(&ListQuery::all().with_status(status_of(status)))
            .map_err(subject_err)?;
        Ok(list.headers.len() as u64)
    }

    fn fork_and_open(
        &self,
        source: &SessionSpec,
        at_seq: u64,
        _fork: &SessionSpec,
        budget: usize,
    ) -> Result<ContextSummary, BenchError> {
        // The runtime names the fork itself.
        let fork = self
            .runtime
            .fork(&Self::session_id(source)?, Some(entry_id(at_seq)?))
            .map_err(subject_err)?;
        self.open_id(fork.id(), budget)
    }

    /// The index writes of a repetition's commits (a fork's seed table)
    /// move into sled in the background: finish that now.
    fn settle(&self) -> Result<(), BenchError> {
        let engine = self.store.engine().map_err(subject_err)?;
        // A segment being built ahead (zero-fill and fsync) would otherwise
        // run on into the next subject's measurement.
        engine.wait_for_spare_segment();
        engine.flush_index().map_err(subject_err)
    }

    fn close(self: Box<Self>) -> Result<(), BenchError> {
        let SpoolStore {
            store,
            runtime,
            writers,
            page_reader,
        } = *self;
        // Handles and the runtime hold the store: release them first.
        drop(page_reader);
        drop(writers);
        drop(runtime);
        let store =
            Arc::try_unwrap(store).map_err(|_| subject_err("store still shared at close"))?;
        store.close().map_err(subject_err)
    }

    fn subject(&self) -> &str {
        "spool"
    }
}
