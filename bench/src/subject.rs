//! What the harness measures: a subject (spool or a peer) and its open
//! store, with the sessions, durabilities and answers they exchange.
//!
//! Every subject implements [`SpoolSubject`] and [`SubjectStore`], so all of
//! them go through the same harness code and the same answer checks.

use std::path::Path;

use crate::data::{self, Record};
use crate::error::BenchError;
use crate::workloads::Workload;

/// How commits reach the disk.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Durability {
    /// Acknowledged after the data is on stable storage (fdatasync or
    /// equivalent). spool: `Immediate`; SQLite: `synchronous=FULL`.
    Durable,
    /// Acknowledged from the page cache. spool: `Buffered`; SQLite:
    /// `synchronous=OFF`.
    Buffered,
}

/// The status of a session header, for the `list` workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Status {
    Active,
    Suspended,
    Completed,
    Failed,
}

impl Status {
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Active => "active",
            Status::Suspended => "suspended",
            Status::Completed => "completed",
            Status::Failed => "failed",
        }
    }
}

/// A session as the harness names it. Subjects map it to their own ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionSpec {
    /// Unique within a store.
    pub key: u64,
    /// The session this one was forked from.
    pub parent: Option<u64>,
    pub status: Status,
    /// Milliseconds since the Unix epoch (fixed, from the generator).
    pub updated_ms: i64,
}

impl SessionSpec {
    /// A fresh active session.
    pub fn new(key: u64) -> Self {
        SessionSpec {
            key,
            parent: None,
            status: Status::Active,
            updated_ms: data::BASE_TIMESTAMP_MS + key as i64,
        }
    }

    /// The session id every subject uses: `s` and 16 hex digits (letters
    /// and digits only, so valid as a spool `SessionId` and a file name).
    pub fn id(&self) -> String {
        session_id(self.key)
    }

    pub fn agent(&self) -> &'static str {
        "bench-agent"
    }
}

/// The session id for `key`.
pub fn session_id(key: u64) -> String {
    format!("s{key:016x}")
}

/// One session and its records, for untimed loading.
#[derive(Clone, Copy, Debug)]
pub struct SessionData<'a> {
    pub spec: &'a SessionSpec,
    pub records: &'a [Record],
}

/// What opening a session produced: the model context under a budget.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ContextSummary {
    /// Entries in the context.
    pub entries: u64,
    /// Their payload bytes ([`Record::bytes`]).
    pub bytes: u64,
    /// Memory the session handle keeps resident, if the subject knows it
    /// (spool's resident snapshot); `None` for peers.
    pub resident_bytes: Option<u64>,
}

/// What reading a whole branch in pages produced.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PageSummary {
    pub pages: u64,
    pub entries: u64,
    /// Payload bytes of all entries read.
    pub bytes: u64,
}

/// A subject of the benchmark: spool, or one of its peers.
///
/// spool implements it on the real engine and runtime; the peers in
/// [`crate::peers`] implement it too, so that every subject runs through the same
/// harness code. A subject says which workloads it takes part in
/// ([`SpoolSubject::supports`]); the harness only calls the operations of
/// those workloads.
pub trait SpoolSubject: Sync {
    /// The key of this subject's figures: `spool`, or a peer key
    /// (`sqlite`, `jsonl`, `json-file`, `raw`, `raw-append`).
    fn name(&self) -> &str;

    /// Whether this subject takes part in `workload`.
    fn supports(&self, workload: Workload) -> bool;

    /// Opens (creating it if needed) a store in the directory `dir`, which
    /// the harness creates empty and removes afterwards. `writers` is the
    /// number of threads that will call [`SubjectStore::append`]
    /// concurrently (at least 1). The harness may close the store and open
    /// the same directory again: reads are measured on a reopened store.
    fn open_store(
        &self,
        dir: &Path,
        durability: Durability,
        writers: usize,
    ) -> Result<Box<dyn SubjectStore>, BenchError>;
}

/// An open store of a subject.
///
/// Timed operations: `append` (append workloads), `open_context` (open),
/// `read_branch` (page), `list_by_status` (list), `fork_and_open` (fork).
/// Everything else is setup and not timed. Operations a subject does not
/// support keep the default, which returns [`BenchError::Unsupported`].
pub trait SubjectStore: Send + Sync {
    /// Creates an empty session (untimed). `writer` is the thread that will
    /// append to it.
    fn create_session(&self, writer: usize, session: &SessionSpec) -> Result<(), BenchError>;

    /// Commits one record at sequence number `seq` (0, 1, 2, ... per
    /// session; each entry's parent is the previous one) as one commit,
    /// with the store's durability. Called concurrently from `writers`
    /// threads; thread `writer` only ever appends to its own session.
    /// Returns the payload bytes committed (normally `record.bytes()`).
    fn append(
        &self,
        writer: usize,
        session: &SessionSpec,
        seq: u64,
        record: &Record,
    ) -> Result<u64, BenchError>;

    /// Loads whole sessions (untimed setup, on a store opened
    /// [`Durability::Buffered`]): afterwards each session must be as if
    /// created and appended to record by record, and complete for a store
    /// reopened on the same directory once [`SubjectStore::close`]
    /// returns. Subjects may use a faster path (one transaction, a batch)
    /// than `append` when it stores the same layout.
    fn load(&self, sessions: &[SessionData<'_>]) -> Result<(), BenchError> {
        for s in sessions {
            self.create_session(0, s.spec)?;
            for (seq, r) in s.records.iter().enumerate() {
                self.append(0, s.spec, seq as u64, r)?;
            }
        }
        Ok(())
    }

    /// What `record`, stored at sequence number `seq`, costs against this
    /// subject's context and page budgets. The default is its text bytes
    /// ([`Record::bytes`]); spool counts the compact JSON size of the
    /// entry it stores. The harness computes each subject's expected
    /// context and first page in the subject's own unit.
    fn entry_cost(&self, record: &Record, seq: u64) -> usize {
        let _ = seq;
        record.bytes()
    }

    /// Opens the session as a program starting to work on it would and
    /// builds its model context: the newest entries whose costs
    /// ([`SubjectStore::entry_cost`]) fit in `budget` together (stop at
    /// the first that does not fit), oldest first, with their text in
    /// memory. Returns the entry count and the sum of their costs. Must
    /// not reuse a session handle cached by an earlier call; the store
    /// itself stays open, as SQLite's connection does.
    fn open_context(
        &self,
        _session: &SessionSpec,
        _budget: usize,
    ) -> Result<ContextSummary, BenchError> {
        Err(self.unsupported("open_context"))
    }

    /// Reads the whole branch (every entry, oldest first, text in memory)
    /// in pages of at most `page_budget` payload bytes (a single larger
    /// entry forms a page alone).
    fn read_branch(
        &self,
        _session: &SessionSpec,
        _page_budget: usize,
    ) -> Result<PageSummary, BenchError> {
        Err(self.unsupported("read_branch"))
    }

    /// Reads the first page (oldest entries first) of the session's branch
    /// under `page_budget` (costs as in [`SubjectStore::entry_cost`]) on
    /// an already open session (the `open` rows' `first_page_us`). Optional: the
    /// default is unsupported.
    fn first_page(
        &self,
        _session: &SessionSpec,
        _page_budget: usize,
    ) -> Result<PageSummary, BenchError> {
        Err(self.unsupported("first_page"))
    }

    /// Lists the headers (id, parent, status, agent, version, updated
    /// time) of every session with `status`, newest update first, and
    /// returns how many there are.
    fn list_by_status(&self, _status: Status) -> Result<u64, BenchError> {
        Err(self.unsupported("list_by_status"))
    }

    /// Durably forks `source` at entry `at_seq` (the fork holds entries
    /// `0..=at_seq`) into the new session `fork`, then opens the fork as
    /// [`SubjectStore::open_context`] does.
    fn fork_and_open(
        &self,
        _source: &SessionSpec,
        _at_seq: u64,
        _fork: &SessionSpec,
        _budget: usize,
    ) -> Result<ContextSummary, BenchError> {
        Err(self.unsupported("fork_and_open"))
    }

    /// Finishes the background work the timed operations left behind
    /// (untimed, after each repetition), so that it is not done during
    /// another subject's repetition. The default does nothing: SQLite and
    /// the file peers leave none (SQLite checkpoints inside its commits);
    /// PostgreSQL's server processes write in the background on their own
    /// schedule, which a client cannot wait for.
    fn settle(&self) -> Result<(), BenchError> {
        Ok(())
    }

    /// Flushes and closes the store (untimed).
    fn close(self: Box<Self>) -> Result<(), BenchError>;

    /// The subject's name, for errors.
    fn subject(&self) -> &str;

    /// The error of an unsupported operation.
    fn unsupported(&self, operation: &'static str) -> BenchError {
        BenchError::Unsupported {
            subject: self.subject().to_string(),
            operation,
        }
    }
}
