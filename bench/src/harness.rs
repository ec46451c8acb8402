//! `spool bench`: the standard workloads, run against spool and against the
//! peers people would pick instead, side by side in one run.
//!
//! Every subject — spool and each peer — implements [`SpoolSubject`], so all
//! of them go through the same harness code: the same generated records
//! ([`data`]), the same threads, the same timer, the same repetitions
//! ([`stats`]), interleaved across subjects ([`rounds`]), and the same
//! answer checks. The spool subject
//! ([`spool::Spool`]) drives the runtime's public handle API over the log
//! store; each subject's budgets count its own unit
//! ([`SubjectStore::entry_cost`]).
//!
//! Workloads (names as given to `--workload`; a name without its suffix,
//! such as `append`, selects every workload that starts with `append-`):
//!
//! | workload          | variants                        | unit        | peers                          |
//! |-------------------|---------------------------------|-------------|--------------------------------|
//! | `append-durable`  | `writers=1`, `writers=16`       | commits/s   | sqlite, postgres, jsonl, raw, raw-append |
//! | `append-buffered` | `writers=1`                     | commits/s, MB/s | sqlite, jsonl, raw         |
//! | `open`            | `history=2000/10000/50000`      | opens/s     | sqlite, postgres, jsonl        |
//! | `page`            | `history=50000`                 | MB/s        | sqlite, jsonl                  |
//! | `list`            | `sessions=10000`                | lists/s     | sqlite, json-file              |
//! | `fork`            | `history=10000`                 | forks/s     | sqlite                         |
//!
//! `--quick` runs the same variants at small sizes (the variant names carry
//! the sizes actually used) and fewer repetitions, so it finishes in seconds.

pub mod data;
pub mod peers;
pub mod report;
pub mod spool;
pub mod stats;

use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use data::Record;
use report::{Machine, Report, ResultRow, RunInfo};
use stats::Samples;

/// Byte budget of the model context built by `open` and `fork`.
pub const CONTEXT_BUDGET: usize = 64 * 1024;

/// Byte budget of one page in the `page` workload.
pub const PAGE_BUDGET: usize = 64 * 1024;

/// Records every session of the `list` workload holds, so that session
/// files and tables have realistic sizes.
pub const LIST_ENTRIES_PER_SESSION: usize = 4;

/// One MB in the MB/s figures: 10^6 bytes.
pub const MB: f64 = 1_000_000.0;

/// What `spool bench` was asked to do.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Small sizes and fewer repetitions: seconds instead of minutes.
    pub quick: bool,
    /// Workload names (see the module docs); empty means all.
    pub workloads: Vec<String>,
    /// Scratch directory on the disk to measure. The harness creates
    /// subdirectories in it and removes them when a workload is done.
    pub dir: PathBuf,
}

/// Errors of the benchmark harness, its peers and the spool subject.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("{subject}: I/O error on {}: {source}", path.display())]
    Io {
        subject: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{subject}: SQLite error while {context}: {source}")]
    Sqlite {
        subject: String,
        context: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{subject}: bad JSON in {} at line {line}: {source}", path.display())]
    Json {
        subject: String,
        path: PathBuf,
        line: u64,
        #[source]
        source: serde_json::Error,
    },
    /// The subject's own error (the spool subject reports engine or
    /// runtime errors through this).
    #[error("{subject}: {message}")]
    Subject { subject: String, message: String },
    /// A subject was asked for an operation it does not implement.
    #[error("{subject} does not support {operation}")]
    Unsupported {
        subject: String,
        operation: &'static str,
    },
    /// A subject's answer differs from the expected one: its figure would
    /// not measure the same work as the others'.
    #[error("{subject} answered {got} for {workload} {variant}, expected {expected}")]
    WrongAnswer {
        subject: String,
        workload: &'static str,
        variant: String,
        got: String,
        expected: String,
    },
    #[error(
        "unknown workload {0:?} (known: append-durable, append-buffered, open, page, list, fork)"
    )]
    UnknownWorkload(String),
}

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

/// A workload of the standard set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    AppendDurable,
    AppendBuffered,
    Open,
    Page,
    List,
    Fork,
}

impl Workload {
    pub const ALL: [Workload; 6] = [
        Workload::AppendDurable,
        Workload::AppendBuffered,
        Workload::Open,
        Workload::Page,
        Workload::List,
        Workload::Fork,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::AppendDurable => "append-durable",
            Workload::AppendBuffered => "append-buffered",
            Workload::Open => "open",
            Workload::Page => "page",
            Workload::List => "list",
            Workload::Fork => "fork",
        }
    }

    /// Whether the name given to `--workload` selects this workload: the
    /// full name, or its prefix before a `-` (`append`).
    pub fn matches(self, name: &str) -> bool {
        let full = self.name();
        full == name || full.split('-').next() == Some(name)
    }
}

/// The workloads a config selects, in the standard order.
pub fn select_workloads(names: &[String]) -> Result<Vec<Workload>, BenchError> {
    if names.is_empty() {
        return Ok(Workload::ALL.to_vec());
    }
    for n in names {
        if !Workload::ALL.iter().any(|w| w.matches(n)) {
            return Err(BenchError::UnknownWorkload(n.clone()));
        }
    }
    Ok(Workload::ALL
        .into_iter()
        .filter(|w| names.iter().any(|n| w.matches(n)))
        .collect())
}

/// A subject of the benchmark: spool, or one of its peers.
///
/// spool implements it on the real engine and runtime; the peers in
/// [`peers`] implement it too, so that every subject runs through the same
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
    /// an already open session (issue 4's `first_page_us`). Optional: the
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

/// The spool subject until the engine and runtime are plugged in: takes
/// part in nothing, so the harness runs the peers only and reports the
/// spool figures as `null`.
#[derive(Clone, Copy, Debug, Default)]
#[cfg(test)]
pub struct NoSpool;

#[cfg(test)]
impl SpoolSubject for NoSpool {
    fn name(&self) -> &str {
        "spool"
    }

    fn supports(&self, _workload: Workload) -> bool {
        false
    }

    fn open_store(
        &self,
        _dir: &Path,
        _durability: Durability,
        _writers: usize,
    ) -> Result<Box<dyn SubjectStore>, BenchError> {
        Err(BenchError::Unsupported {
            subject: "spool".into(),
            operation: "open_store",
        })
    }
}

/// Sizes of one run.
#[derive(Clone, Debug)]
pub struct Sizes {
    pub repetitions: usize,
    /// Commits per writer in `append-durable` with one writer.
    pub durable_commits_1: usize,
    /// Commits per writer in `append-durable` with 16 writers.
    pub durable_commits_16: usize,
    /// Commits in `append-buffered`.
    pub buffered_commits: usize,
    pub open_histories: Vec<usize>,
    pub page_history: usize,
    pub list_sessions: usize,
    pub fork_history: usize,
    /// Read workloads repeat their operation for at least this long per
    /// repetition...
    pub min_time: Duration,
    /// ...or at most this many times.
    pub max_iters: u64,
}

impl Sizes {
    pub fn full() -> Self {
        Sizes {
            repetitions: 5,
            durable_commits_1: 5_000,
            durable_commits_16: 500,
            buffered_commits: 50_000,
            open_histories: vec![2_000, 10_000, 50_000],
            page_history: 50_000,
            list_sessions: 10_000,
            fork_history: 10_000,
            min_time: Duration::from_millis(500),
            max_iters: 100_000,
        }
    }

    pub fn quick() -> Self {
        Sizes {
            repetitions: 3,
            durable_commits_1: 100,
            durable_commits_16: 10,
            buffered_commits: 1_000,
            open_histories: vec![200, 1_000, 5_000],
            page_history: 5_000,
            list_sessions: 500,
            fork_history: 1_000,
            min_time: Duration::from_millis(30),
            max_iters: 1_000,
        }
    }

    pub fn for_config(config: &BenchConfig) -> Self {
        if config.quick {
            Sizes::quick()
        } else {
            Sizes::full()
        }
    }
}

/// At most this many forks per repetition of `fork` (each copies half of
/// the source's history, so the store grows with every fork).
pub const FORKS_PER_REPETITION_MAX: u64 = 10;

/// The concurrent writer counts of `append-durable`.
pub const DURABLE_WRITERS: [usize; 2] = [1, 16];

/// Runs the selected workloads against `spool` and every peer, reporting
/// progress lines through `progress`.
pub fn run(
    config: &BenchConfig,
    spool: &dyn SpoolSubject,
    progress: &mut dyn FnMut(&str),
) -> Result<Report, BenchError> {
    let sizes = Sizes::for_config(config);
    run_with_sizes(config, &sizes, spool, progress)
}

/// [`run`] with explicit sizes.
pub fn run_with_sizes(
    config: &BenchConfig,
    sizes: &Sizes,
    spool: &dyn SpoolSubject,
    progress: &mut dyn FnMut(&str),
) -> Result<Report, BenchError> {
    let workloads = select_workloads(&config.workloads)?;
    std::fs::create_dir_all(&config.dir).map_err(|e| io_err("harness", &config.dir, e))?;
    let root = config.dir.join("spool-bench-scratch");
    let machine = Machine::detect(&config.dir);
    let mut results = Vec::new();
    let mut rss_reset = true;
    // One PostgreSQL server for the run, on the scratch disk; stopped and
    // removed when `pg` is dropped below.
    let pg = peers::postgres::PostgresPeer::new(&root);
    for w in workloads {
        progress(&format!("workload {}", w.name()));
        rss_reset &= report::reset_peak_rss();
        let wdir = root.join(w.name());
        let mut h = Harness {
            dir: &wdir,
            sizes,
            progress: &mut *progress,
            pg: &pg,
        };
        let mut rows = match w {
            Workload::AppendDurable => h.append_durable(spool)?,
            Workload::AppendBuffered => h.append_buffered(spool)?,
            Workload::Open => h.open(spool)?,
            Workload::Page => h.page(spool)?,
            Workload::List => h.list(spool)?,
            Workload::Fork => h.fork(spool)?,
        };
        remove_dir(&wdir)?;
        let peak = report::peak_rss_bytes();
        for r in &mut rows {
            r.peak_rss_bytes = peak;
        }
        results.extend(rows);
    }
    drop(pg);
    remove_dir(&root)?;
    Ok(Report {
        machine,
        run: RunInfo {
            quick: config.quick,
            repetitions: sizes.repetitions,
            seed: data::DEFAULT_SEED,
            context_budget: CONTEXT_BUDGET as u64,
            page_budget: PAGE_BUDGET as u64,
            peak_rss_per_workload: rss_reset,
        },
        results,
    })
}

fn remove_dir(dir: &Path) -> Result<(), BenchError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("harness", dir, e)),
    }
}

fn create_dir(dir: &Path) -> Result<(), BenchError> {
    remove_dir(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| io_err("harness", dir, e))
}

pub(crate) fn io_err(subject: &str, path: &Path, source: std::io::Error) -> BenchError {
    BenchError::Io {
        subject: subject.to_string(),
        path: path.to_path_buf(),
        source,
    }
}

/// The context a subject must build from `records` (a linear branch,
/// sequence numbers from 0): the newest records whose costs fit in
/// `budget` together, costed by `cost(record, seq)`.
pub fn expected_context(
    records: &[Record],
    budget: usize,
    cost: impl Fn(&Record, u64) -> usize,
) -> ContextSummary {
    let mut entries = 0;
    let mut bytes = 0u64;
    for (seq, r) in records.iter().enumerate().rev() {
        let b = cost(r, seq as u64) as u64;
        if bytes + b > budget as u64 {
            break;
        }
        bytes += b;
        entries += 1;
    }
    ContextSummary {
        entries,
        bytes,
        resident_bytes: None,
    }
}

/// The first page a subject must return from `records` under
/// `page_budget`: the oldest records whose costs fit together (a larger
/// first record alone). `bytes` are text bytes, as page reads report.
pub fn expected_first_page(
    records: &[Record],
    page_budget: usize,
    cost: impl Fn(&Record, u64) -> usize,
) -> PageSummary {
    let mut used = 0u64;
    let mut page = PageSummary::default();
    for (seq, r) in records.iter().enumerate() {
        let c = cost(r, seq as u64) as u64;
        if page.entries > 0 && used + c > page_budget as u64 {
            break;
        }
        used += c;
        page.entries += 1;
        page.bytes += r.bytes() as u64;
        if used > page_budget as u64 {
            break;
        }
    }
    page.pages = u64::from(page.entries > 0);
    page
}

/// A subject's store, loaded for a read workload.
struct Loaded<'s> {
    subject: &'s dyn SpoolSubject,
    dir: PathBuf,
    store: Box<dyn SubjectStore>,
}

impl Loaded<'_> {
    fn name(&self) -> &str {
        self.subject.name()
    }
}

/// Closes every loaded store and removes its directory.
fn close_all(loaded: Vec<Loaded<'_>>) -> Result<(), BenchError> {
    for l in loaded {
        l.store.close()?;
        remove_dir(&l.dir)?;
    }
    Ok(())
}

/// Interleaved repetitions: round `r` runs repetition `r` of every subject
/// in turn, each followed by its [`SubjectStore::settle`] (untimed). On a
/// shared machine a slow stretch then falls on every subject's samples
/// alike instead of on all of one subject's, which would move the ratio.
/// `rep(i, loaded)` times one repetition of subject `i`.
fn rounds(
    reps: usize,
    loaded: &[Loaded<'_>],
    mut rep: impl FnMut(usize, &Loaded<'_>) -> Result<f64, BenchError>,
) -> Result<Vec<(String, Samples)>, BenchError> {
    let mut samples: Vec<Samples> = loaded.iter().map(|_| Samples::default()).collect();
    for _ in 0..reps {
        for (i, (l, out)) in loaded.iter().zip(samples.iter_mut()).enumerate() {
            let r = rep(i, l)?;
            l.store.settle()?;
            out.rates.push(r);
        }
    }
    Ok(loaded
        .iter()
        .zip(samples)
        .map(|(l, s)| (l.name().to_string(), s))
        .collect())
}

struct Harness<'a> {
    dir: &'a Path,
    sizes: &'a Sizes,
    progress: &'a mut dyn FnMut(&str),
    /// The PostgreSQL peer (its server starts on first use).
    pg: &'a peers::postgres::PostgresPeer,
}

impl Harness<'_> {
    fn subject_dir(&self, subject: &str, variant: &str) -> PathBuf {
        let v: String = variant
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.dir.join(format!("{subject}-{v}"))
    }

    /// Appends per-writer records with `writers` threads into a fresh
    /// store of each subject, in interleaved rounds (see [`rounds`]);
    /// returns each subject's commit rates and payload byte rates.
    fn append_rounds(
        &mut self,
        subjects: &[&dyn SpoolSubject],
        durability: Durability,
        variant: &str,
        per_writer: &[Vec<Record>],
    ) -> Result<Vec<(String, Samples, Samples)>, BenchError> {
        let mut out: Vec<(String, Samples, Samples)> = subjects
            .iter()
            .map(|s| (s.name().to_string(), Samples::default(), Samples::default()))
            .collect();
        for rep in 0..self.sizes.repetitions {
            (self.progress)(&format!(
                "  {variant} round {}/{}",
                rep + 1,
                self.sizes.repetitions
            ));
            for (s, (_, commits, bytes)) in subjects.iter().zip(out.iter_mut()) {
                let dir = self.subject_dir(s.name(), &format!("{variant}-{rep}"));
                create_dir(&dir)?;
                // The store is closed inside: nothing of it runs on.
                let (c, b) = append_once(*s, &dir, durability, per_writer)?;
                remove_dir(&dir)?;
                commits.rates.push(c);
                bytes.rates.push(b / MB);
            }
        }
        Ok(out)
    }

    fn append_durable(&mut self, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
        let mut rows = Vec::new();
        for writers in DURABLE_WRITERS {
            let n = if writers == 1 {
                self.sizes.durable_commits_1
            } else {
                self.sizes.durable_commits_16
            };
            let per_writer: Vec<Vec<Record>> = (0..writers)
                .map(|w| data::transcript(data::DEFAULT_SEED, w as u64, n))
                .collect();
            let variant = format!("writers={writers}");
            let sqlite = peers::sqlite::SqlitePeer;
            let jsonl = peers::jsonl::JsonlPeer;
            let raw = peers::raw::RawPeer::in_place(n);
            let raw_append = peers::raw::RawPeer::appending();
            let pg_missing = self.pg.available().err();
            let mut subjects: Vec<&dyn SpoolSubject> = vec![spool, &sqlite];
            if pg_missing.is_none() {
                subjects.push(self.pg);
            }
            subjects.extend([&jsonl as &dyn SpoolSubject, &raw, &raw_append]);
            subjects.retain(|s| s.supports(Workload::AppendDurable));
            let measured =
                self.append_rounds(&subjects, Durability::Durable, &variant, &per_writer)?;
            let mut row = ResultRow::from_measured(
                Workload::AppendDurable.name(),
                &variant,
                "commits/s",
                measured.into_iter().map(|(name, c, _)| (name, c)),
            );
            if let Some(note) = pg_missing {
                row.missing_peer(self.pg.name(), &note);
            }
            rows.push(row);
        }
        Ok(rows)
    }

    fn append_buffered(&mut self, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
        let records = vec![data::transcript(
            data::DEFAULT_SEED,
            0,
            self.sizes.buffered_commits,
        )];
        let variant = "writers=1".to_string();
        let sqlite = peers::sqlite::SqlitePeer;
        let jsonl = peers::jsonl::JsonlPeer;
        let raw = peers::raw::RawPeer::sequential_buffered();
        let mut subjects: Vec<&dyn SpoolSubject> = vec![spool, &sqlite, &jsonl, &raw];
        subjects.retain(|s| s.supports(Workload::AppendBuffered));
        let mut commits = Vec::new();
        let mut mbs = Vec::new();
        for (name, c, b) in
            self.append_rounds(&subjects, Durability::Buffered, &variant, &records)?
        {
            commits.push((name.clone(), c));
            mbs.push((name, b));
        }
        let w = Workload::AppendBuffered.name();
        Ok(vec![
            ResultRow::from_measured(w, &variant, "commits/s", commits),
            ResultRow::from_measured(w, &variant, "MB/s", mbs),
        ])
    }

    /// Loads `sessions` into a fresh store of `subject`, closes it and
    /// opens it again for the timed part.
    fn loaded_store<'s>(
        &mut self,
        subject: &'s dyn SpoolSubject,
        variant: &str,
        durability: Durability,
        sessions: &[SessionData<'_>],
    ) -> Result<Loaded<'s>, BenchError> {
        (self.progress)(&format!("  {} {variant}", subject.name()));
        let dir = self.subject_dir(subject.name(), variant);
        create_dir(&dir)?;
        // Loading is untimed setup: buffered, flushed by the close.
        let store = subject.open_store(&dir, Durability::Buffered, 1)?;
        store.load(sessions)?;
        store.close()?;
        let store = subject.open_store(&dir, durability, 1)?;
        Ok(Loaded {
            subject,
            dir,
            store,
        })
    }

    /// [`Harness::loaded_store`] for every subject that supports `workload`.
    fn load_all<'s>(
        &mut self,
        subjects: &[&'s dyn SpoolSubject],
        workload: Workload,
        variant: &str,
        sessions: &[SessionData<'_>],
    ) -> Result<Vec<Loaded<'s>>, BenchError> {
        let mut loaded = Vec::new();
        for s in subjects.iter().filter(|s| s.supports(workload)) {
            loaded.push(self.loaded_store(*s, variant, Durability::Durable, sessions)?);
        }
        Ok(loaded)
    }

    fn peers_for(&self, workload: Workload) -> Vec<Box<dyn SpoolSubject>> {
        let all: Vec<Box<dyn SpoolSubject>> = vec![
            Box::new(peers::sqlite::SqlitePeer),
            Box::new(peers::jsonl::JsonlPeer),
            Box::new(peers::json_file::JsonFilePeer),
        ];
        all.into_iter().filter(|p| p.supports(workload)).collect()
    }

    fn open(&mut self, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
        let mut rows = Vec::new();
        for &n in &self.sizes.open_histories.clone() {
            let records = data::transcript(data::DEFAULT_SEED, 0, n);
            let spec = SessionSpec::new(0);
            let variant = format!("history={n}");
            let peers = self.peers_for(Workload::Open);
            let pg_missing = self.pg.available().err();
            let mut subjects: Vec<&dyn SpoolSubject> = vec![spool];
            subjects.extend(peers.iter().map(|p| p.as_ref()));
            if pg_missing.is_none() {
                subjects.push(self.pg);
            }
            let sessions = [SessionData {
                spec: &spec,
                records: &records,
            }];
            let loaded = self.load_all(&subjects, Workload::Open, &variant, &sessions)?;
            // Each subject's answer in its own unit.
            let expected: Vec<ContextSummary> = loaded
                .iter()
                .map(|l| {
                    expected_context(&records, CONTEXT_BUDGET, |r, q| l.store.entry_cost(r, q))
                })
                .collect();
            let mut resident = None;
            let (min_time, max_iters) = (self.sizes.min_time, self.sizes.max_iters);
            let measured = rounds(self.sizes.repetitions, &loaded, |i, l| {
                stats::rate_loop(min_time, max_iters, || {
                    let got = l.store.open_context(&spec, CONTEXT_BUDGET)?;
                    check_context(l.name(), Workload::Open, &variant, got, expected[i])?;
                    if got.resident_bytes.is_some() {
                        resident = got.resident_bytes;
                    }
                    Ok(1)
                })
            })?;
            let mut first_page = None;
            for l in loaded.iter().filter(|l| l.name() == "spool") {
                first_page =
                    self.first_page(l.subject, l.store.as_ref(), &spec, &records, &variant)?;
            }
            close_all(loaded)?;
            let mut row =
                ResultRow::from_measured(Workload::Open.name(), &variant, "opens/s", measured);
            if let Some(note) = pg_missing {
                row.missing_peer(self.pg.name(), &note);
            }
            let micros = |rate: Option<f64>| rate.filter(|r| *r > 0.0).map(|r| 1e6 / r);
            row.history = Some(n as u64);
            row.open_us = micros(row.spool);
            row.resident_bytes = resident;
            row.first_page_us = first_page;
            row.jsonl_open_us = micros(row.peer("jsonl"));
            rows.push(row);
        }
        Ok(rows)
    }

    /// Median microseconds of one first page read on `store`, checked
    /// against the expected page; `None` when the subject has no such
    /// read.
    fn first_page(
        &mut self,
        s: &dyn SpoolSubject,
        store: &dyn SubjectStore,
        spec: &SessionSpec,
        records: &[Record],
        variant: &str,
    ) -> Result<Option<f64>, BenchError> {
        let expected = expected_first_page(records, PAGE_BUDGET, |r, q| store.entry_cost(r, q));
        match store.first_page(spec, PAGE_BUDGET) {
            Err(BenchError::Unsupported { .. }) => return Ok(None),
            Err(e) => return Err(e),
            Ok(_) => {}
        }
        let samples = stats::repeat(self.sizes.repetitions, |_| {
            stats::rate_loop(self.sizes.min_time, self.sizes.max_iters, || {
                let got = store.first_page(spec, PAGE_BUDGET)?;
                if got != expected {
                    return Err(wrong(
                        s.name(),
                        Workload::Open,
                        variant,
                        format!("first page {got:?}"),
                        format!("{expected:?}"),
                    ));
                }
                Ok(1)
            })
        })?;
        Ok(samples
            .summary()
            .map(|m| m.median)
            .filter(|r| *r > 0.0)
            .map(|r| 1e6 / r))
    }

    fn page(&mut self, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
        let n = self.sizes.page_history;
        let records = data::transcript(data::DEFAULT_SEED, 0, n);
        let total = data::total_bytes(&records);
        let spec = SessionSpec::new(0);
        let variant = format!("history={n}");
        let peers = self.peers_for(Workload::Page);
        let mut subjects: Vec<&dyn SpoolSubject> = vec![spool];
        subjects.extend(peers.iter().map(|p| p.as_ref()));
        let sessions = [SessionData {
            spec: &spec,
            records: &records,
        }];
        let loaded = self.load_all(&subjects, Workload::Page, &variant, &sessions)?;
        let (min_time, max_iters) = (self.sizes.min_time, self.sizes.max_iters);
        let measured = rounds(self.sizes.repetitions, &loaded, |_, l| {
            let r = stats::rate_loop(min_time, max_iters, || {
                let got = l.store.read_branch(&spec, PAGE_BUDGET)?;
                if got.entries != n as u64 || got.bytes != total || got.pages == 0 {
                    return Err(wrong(
                        l.name(),
                        Workload::Page,
                        &variant,
                        format!("{got:?}"),
                        format!("{n} entries, {total} bytes"),
                    ));
                }
                Ok(got.bytes)
            })?;
            Ok(r / MB)
        })?;
        close_all(loaded)?;
        Ok(vec![ResultRow::from_measured(
            Workload::Page.name(),
            &variant,
            "MB/s",
            measured,
        )])
    }

    fn list(&mut self, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
        let n = self.sizes.list_sessions;
        let specs = list_sessions(n);
        let records: Vec<Vec<Record>> = (0..n)
            .map(|i| data::transcript(data::DEFAULT_SEED, i as u64, LIST_ENTRIES_PER_SESSION))
            .collect();
        let sessions: Vec<SessionData<'_>> = specs
            .iter()
            .zip(&records)
            .map(|(spec, records)| SessionData { spec, records })
            .collect();
        let expected = specs.iter().filter(|s| s.status == Status::Active).count() as u64;
        let variant = format!("sessions={n}");
        let peers = self.peers_for(Workload::List);
        let mut subjects: Vec<&dyn SpoolSubject> = vec![spool];
        subjects.extend(peers.iter().map(|p| p.as_ref()));
        let loaded = self.load_all(&subjects, Workload::List, &variant, &sessions)?;
        let (min_time, max_iters) = (self.sizes.min_time, self.sizes.max_iters);
        let measured = rounds(self.sizes.repetitions, &loaded, |_, l| {
            stats::rate_loop(min_time, max_iters, || {
                let got = l.store.list_by_status(Status::Active)?;
                if got != expected {
                    return Err(wrong(
                        l.name(),
                        Workload::List,
                        &variant,
                        got.to_string(),
                        expected.to_string(),
                    ));
                }
                Ok(1)
            })
        })?;
        close_all(loaded)?;
        Ok(vec![ResultRow::from_measured(
            Workload::List.name(),
            &variant,
            "lists/s",
            measured,
        )])
    }

    fn fork(&mut self, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
        let n = self.sizes.fork_history;
        let records = data::transcript(data::DEFAULT_SEED, 0, n);
        let at = (n / 2) as u64;
        let forked = &records[..=(at as usize).min(n.saturating_sub(1))];
        let source = SessionSpec::new(0);
        let variant = format!("history={n}");
        let peers = self.peers_for(Workload::Fork);
        let mut subjects: Vec<&dyn SpoolSubject> = vec![spool];
        subjects.extend(peers.iter().map(|p| p.as_ref()));
        let sessions = [SessionData {
            spec: &source,
            records: &records,
        }];
        let loaded = self.load_all(&subjects, Workload::Fork, &variant, &sessions)?;
        let expected: Vec<ContextSummary> = loaded
            .iter()
            .map(|l| expected_context(forked, CONTEXT_BUDGET, |r, q| l.store.entry_cost(r, q)))
            .collect();
        // Fork keys are unique across the run (each store only sees its own).
        let mut next_key = 1u64;
        // Every fork copies half the history; cap the count so the store
        // stays within a few times the source's size per repetition.
        let max_iters = self.sizes.max_iters.min(FORKS_PER_REPETITION_MAX);
        let min_time = self.sizes.min_time;
        let measured = rounds(self.sizes.repetitions, &loaded, |i, l| {
            stats::rate_loop(min_time, max_iters, || {
                let fork = SessionSpec {
                    parent: Some(source.key),
                    ..SessionSpec::new(next_key)
                };
                next_key += 1;
                let got = l.store.fork_and_open(&source, at, &fork, CONTEXT_BUDGET)?;
                check_context(l.name(), Workload::Fork, &variant, got, expected[i])?;
                Ok(1)
            })
        })?;
        close_all(loaded)?;
        Ok(vec![ResultRow::from_measured(
            Workload::Fork.name(),
            &variant,
            "forks/s",
            measured,
        )])
    }
}

/// Session headers of the `list` workload: a fixed mix of statuses (about
/// 25 % active, 10 % suspended, 55 % completed, 10 % failed).
pub fn list_sessions(n: usize) -> Vec<SessionSpec> {
    let mut rng = data::SplitMix64::new(data::DEFAULT_SEED ^ 0x11575);
    (0..n as u64)
        .map(|key| {
            let status = match rng.range(0, 99) {
                0..=24 => Status::Active,
                25..=34 => Status::Suspended,
                35..=89 => Status::Completed,
                _ => Status::Failed,
            };
            SessionSpec {
                status,
                updated_ms: data::BASE_TIMESTAMP_MS + rng.range(0, 86_400_000) as i64,
                ..SessionSpec::new(key)
            }
        })
        .collect()
}

fn append_once(
    subject: &dyn SpoolSubject,
    dir: &Path,
    durability: Durability,
    per_writer: &[Vec<Record>],
) -> Result<(f64, f64), BenchError> {
    let writers = per_writer.len().max(1);
    let store = subject.open_store(dir, durability, writers)?;
    let specs: Vec<SessionSpec> = (0..per_writer.len() as u64).map(SessionSpec::new).collect();
    for (w, s) in specs.iter().enumerate() {
        store.create_session(w, s)?;
    }
    let barrier = Barrier::new(per_writer.len() + 1);
    let store_ref: &dyn SubjectStore = store.as_ref();
    let (elapsed, outcome) = std::thread::scope(|scope| {
        let handles: Vec<_> = per_writer
            .iter()
            .zip(&specs)
            .enumerate()
            .map(|(w, (records, spec))| {
                let barrier = &barrier;
                scope.spawn(move || -> Result<(u64, u64), BenchError> {
                    barrier.wait();
                    let mut bytes = 0;
                    for (seq, r) in records.iter().enumerate() {
                        bytes += store_ref.append(w, spec, seq as u64, r)?;
                    }
                    Ok((records.len() as u64, bytes))
                })
            })
            .collect();
        barrier.wait();
        let start = Instant::now();
        let mut total = Ok((0u64, 0u64));
        for h in handles {
            let r = h.join().unwrap_or_else(|_| {
                Err(BenchError::Subject {
                    subject: subject.name().to_string(),
                    message: "a writer thread panicked".into(),
                })
            });
            total = match (total, r) {
                (Ok((c, b)), Ok((c2, b2))) => Ok((c + c2, b + b2)),
                (Err(e), _) | (_, Err(e)) => Err(e),
            };
        }
        (start.elapsed(), total)
    });
    let (commits, bytes) = outcome?;
    store.close()?;
    Ok((
        stats::rate(commits as f64, elapsed),
        stats::rate(bytes as f64, elapsed),
    ))
}

fn check_context(
    subject: &str,
    workload: Workload,
    variant: &str,
    got: ContextSummary,
    expected: ContextSummary,
) -> Result<(), BenchError> {
    if got.entries == expected.entries && got.bytes == expected.bytes {
        Ok(())
    } else {
        Err(wrong(
            subject,
            workload,
            variant,
            format!("{} entries / {} bytes", got.entries, got.bytes),
            format!("{} entries / {} bytes", expected.entries, expected.bytes),
        ))
    }
}

fn wrong(
    subject: &str,
    workload: Workload,
    variant: &str,
    got: String,
    expected: String,
) -> BenchError {
    BenchError::WrongAnswer {
        subject: subject.to_string(),
        workload: workload.name(),
        variant: variant.to_string(),
        got,
        expected,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;
    use std::sync::{Arc, Mutex};

    /// A store that only records its `settle` calls into a shared log.
    struct Recorder {
        name: &'static str,
        log: Arc<Mutex<Vec<String>>>,
    }

    impl SubjectStore for Recorder {
        fn create_session(&self, _: usize, _: &SessionSpec) -> Result<(), BenchError> {
            Ok(())
        }
        fn append(&self, _: usize, _: &SessionSpec, _: u64, _: &Record) -> Result<u64, BenchError> {
            Ok(0)
        }
        fn settle(&self) -> Result<(), BenchError> {
            self.log
                .lock()
                .unwrap()
                .push(format!("settle {}", self.name));
            Ok(())
        }
        fn close(self: Box<Self>) -> Result<(), BenchError> {
            Ok(())
        }
        fn subject(&self) -> &str {
            self.name
        }
    }

    #[test]
    fn rounds_interleave_the_subjects_and_settle_each_after_its_repetition() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let loaded: Vec<Loaded<'_>> = ["a", "b"]
            .into_iter()
            .map(|name| Loaded {
                subject: &NoSpool,
                dir: PathBuf::from(name),
                store: Box::new(Recorder {
                    name,
                    log: log.clone(),
                }),
            })
            .collect();
        let mut next = 0.0;
        let out = rounds(3, &loaded, |i, l| {
            log.lock()
                .unwrap()
                .push(format!("rep {}", l.store.subject()));
            next += 1.0;
            Ok(next * 10.0 + i as f64)
        })
        .unwrap();
        let order: Vec<String> = log.lock().unwrap().clone();
        let mut want = Vec::new();
        for _ in 0..3 {
            for s in ["a", "b"] {
                want.push(format!("rep {s}"));
                want.push(format!("settle {s}"));
            }
        }
        assert_eq!(order, want);
        // Each subject's samples are its own repetitions, in round order.
        assert_eq!(out[0].1.rates, vec![10.0, 30.0, 50.0]);
        assert_eq!(out[1].1.rates, vec![21.0, 41.0, 61.0]);
    }

    fn quick_config(dir: &Path, workloads: &[&str]) -> BenchConfig {
        BenchConfig {
            quick: true,
            workloads: workloads.iter().map(|s| s.to_string()).collect(),
            dir: dir.to_path_buf(),
        }
    }

    /// The peers each workload must report.
    fn expected_peers(workload: &str) -> &'static [&'static str] {
        match workload {
            "append-durable" => &["sqlite", "postgres", "jsonl", "raw", "raw-append"],
            "append-buffered" => &["sqlite", "jsonl", "raw"],
            "open" => &["sqlite", "postgres", "jsonl"],
            "page" => &["sqlite", "jsonl"],
            "list" => &["sqlite", "json-file"],
            "fork" => &["sqlite"],
            other => panic!("unexpected workload {other}"),
        }
    }

    #[test]
    fn quick_run_without_spool_reports_every_peer() {
        let tmp = tempfile::tempdir().unwrap();
        let report = run(&quick_config(tmp.path(), &[]), &NoSpool, &mut |_| {}).unwrap();
        let json: Value = serde_json::from_str(&report::to_json(&report)).unwrap();

        let machine = &json["machine"];
        assert!(machine["cpus"].as_u64().unwrap() >= 1);
        assert!(machine["os"].is_string());
        let results = json["results"].as_array().unwrap();
        let rows: Vec<(String, String, String)> = results
            .iter()
            .map(|r| {
                (
                    r["workload"].as_str().unwrap().to_string(),
                    r["variant"].as_str().unwrap().to_string(),
                    r["unit"].as_str().unwrap().to_string(),
                )
            })
            .collect();
        let q = Sizes::quick();
        let mut want = vec![
            (
                "append-durable".to_string(),
                "writers=1".to_string(),
                "commits/s",
            ),
            ("append-durable".into(), "writers=16".into(), "commits/s"),
            ("append-buffered".into(), "writers=1".into(), "commits/s"),
            ("append-buffered".into(), "writers=1".into(), "MB/s"),
        ];
        for n in &q.open_histories {
            want.push(("open".into(), format!("history={n}"), "opens/s"));
        }
        want.push(("page".into(), format!("history={}", q.page_history), "MB/s"));
        want.push((
            "list".into(),
            format!("sessions={}", q.list_sessions),
            "lists/s",
        ));
        want.push((
            "fork".into(),
            format!("history={}", q.fork_history),
            "forks/s",
        ));
        let want: Vec<(String, String, String)> = want
            .into_iter()
            .map(|(w, v, u)| (w, v, u.to_string()))
            .collect();
        assert_eq!(rows, want);

        for r in results {
            let w = r["workload"].as_str().unwrap();
            assert!(
                r["spool"].is_null(),
                "{w}: spool must be null without spool"
            );
            assert_eq!(r["ratios"].as_object().unwrap().len(), 0);
            let peers = r["peers"].as_object().unwrap();
            let mut keys: Vec<&str> = peers.keys().map(|k| k.as_str()).collect();
            keys.sort_unstable();
            let mut expected = expected_peers(w).to_vec();
            expected.sort_unstable();
            assert_eq!(keys, expected, "{w}");
            for (k, v) in peers {
                if v.is_null() && k == "postgres" && !spool_pgserver::binaries_available() {
                    // No server on this machine: null with a note.
                    assert!(r["notes"][k].is_string(), "{w}: {k} null without a note");
                    continue;
                }
                let f = v.as_f64().unwrap();
                assert!(f.is_finite() && f > 0.0, "{w} {k}: {f}");
                let spread = r["spread"][k].as_array().unwrap();
                let (lo, hi) = (spread[0].as_f64().unwrap(), spread[1].as_f64().unwrap());
                assert!(lo <= f && f <= hi, "{w} {k}: {lo} <= {f} <= {hi}");
            }
            assert_eq!(r["repetitions"].as_u64(), Some(q.repetitions as u64));
        }
        // The scratch directory is cleaned up.
        assert!(!tmp.path().join("spool-bench-scratch").exists());

        let md = report::to_markdown(&report);
        assert!(md.contains(
            "| workload | variant | unit | spool | sqlite | postgres | jsonl | json-file | raw | raw-append |"
        ));
        assert_eq!(md.matches("\n| append-durable |").count(), 2);
        assert!(md.contains("## Subject and peer configurations"));
    }

    /// A stand-in spool: the SQLite peer under the name `spool`, to check
    /// that a subject plugged in as spool gets figures and ratios.
    struct FakeSpool;

    impl SpoolSubject for FakeSpool {
        fn name(&self) -> &str {
            "spool"
        }
        fn supports(&self, w: Workload) -> bool {
            w != Workload::AppendDurable
        }
        fn open_store(
            &self,
            dir: &Path,
            d: Durability,
            writers: usize,
        ) -> Result<Box<dyn SubjectStore>, BenchError> {
            peers::sqlite::SqlitePeer.open_store(dir, d, writers)
        }
    }

    #[test]
    fn a_spool_subject_gets_figures_and_ratios() {
        let tmp = tempfile::tempdir().unwrap();
        let cfg = quick_config(tmp.path(), &["open", "list", "append-durable"]);
        let report = run(&cfg, &FakeSpool, &mut |_| {}).unwrap();
        assert_eq!(
            report.results.len(),
            3 + Sizes::quick().open_histories.len()
        );
        for r in &report.results {
            if r.workload == "append-durable" {
                // Not supported by this subject: no figure, no ratios.
                assert_eq!(r.spool, None);
                assert!(r.ratios.is_empty());
                continue;
            }
            let sp = r.spool.unwrap();
            assert!(r.spread.contains_key("spool"));
            assert_eq!(r.ratios.len(), r.peers.len(), "{}", r.workload);
            for (k, ratio) in &r.ratios {
                let p = r.peer(k).unwrap();
                assert!((ratio * p - sp).abs() <= 1e-9 * sp.max(1.0));
            }
        }
    }

    /// A subject whose answers are wrong is refused, so a figure always
    /// measures the same work as the others'.
    struct WrongContext;
    struct WrongStore(Box<dyn SubjectStore>);

    impl SpoolSubject for WrongContext {
        fn name(&self) -> &str {
            "spool"
        }
        fn supports(&self, w: Workload) -> bool {
            w == Workload::Open
        }
        fn open_store(
            &self,
            dir: &Path,
            d: Durability,
            writers: usize,
        ) -> Result<Box<dyn SubjectStore>, BenchError> {
            Ok(Box::new(WrongStore(
                peers::sqlite::SqlitePeer.open_store(dir, d, writers)?,
            )))
        }
    }

    impl SubjectStore for WrongStore {
        fn create_session(&self, w: usize, s: &SessionSpec) -> Result<(), BenchError> {
            self.0.create_session(w, s)
        }
        fn append(&self, w: usize, s: &SessionSpec, q: u64, r: &Record) -> Result<u64, BenchError> {
            self.0.append(w, s, q, r)
        }
        fn load(&self, sessions: &[SessionData<'_>]) -> Result<(), BenchError> {
            self.0.load(sessions)
        }
        fn open_context(
            &self,
            s: &SessionSpec,
            budget: usize,
        ) -> Result<ContextSummary, BenchError> {
            // Skips the newest entry: less work than asked for.
            let mut c = self.0.open_context(s, budget)?;
            c.entries -= 1;
            Ok(c)
        }
        fn close(self: Box<Self>) -> Result<(), BenchError> {
            self.0.close()
        }
        fn subject(&self) -> &str {
            "spool"
        }
    }

    #[test]
    fn a_wrong_answer_fails_the_run() {
        let tmp = tempfile::tempdir().unwrap();
        let err = run(
            &quick_config(tmp.path(), &["open"]),
            &WrongContext,
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                BenchError::WrongAnswer {
                    workload: "open",
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn workload_names_select_and_reject() {
        let names =
            |v: &[&str]| select_workloads(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(names(&[]).unwrap(), Workload::ALL.to_vec());
        assert_eq!(
            names(&["append"]).unwrap(),
            vec![Workload::AppendDurable, Workload::AppendBuffered]
        );
        assert_eq!(
            names(&["fork", "open"]).unwrap(),
            vec![Workload::Open, Workload::Fork]
        );
        assert!(matches!(
            names(&["nope"]),
            Err(BenchError::UnknownWorkload(n)) if n == "nope"
        ));
    }

    #[test]
    fn expected_context_takes_the_newest_that_fit() {
        let recs = data::transcript(data::DEFAULT_SEED, 0, 300);
        let c = expected_context(&recs, CONTEXT_BUDGET, |r, _| r.bytes());
        let tail = &recs[recs.len() - c.entries as usize..];
        assert_eq!(data::total_bytes(tail), c.bytes);
        assert!(c.bytes <= CONTEXT_BUDGET as u64);
        let next = &recs[recs.len() - c.entries as usize - 1];
        assert!(c.bytes + next.bytes() as u64 > CONTEXT_BUDGET as u64);
    }

    #[test]
    fn list_statuses_follow_the_documented_mix() {
        let s = list_sessions(10_000);
        let active = s.iter().filter(|x| x.status == Status::Active).count();
        assert!((2_300..2_700).contains(&active), "{active}");
        assert_eq!(s, list_sessions(10_000));
    }
}
