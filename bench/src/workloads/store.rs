//! `store`: the store as a whole, each question asked in a fresh process
//! as a user's command asks it: `sessions --limit 20`, `context ID`,
//! `show ID`, an owner open, and `import` of the whole store's export.
//!
//! For each size a spool store of that many commits is built once through
//! the library (buffered, one `created` commit and then one commit per
//! entry, [`ENTRIES_PER_SESSION`] entries per session) and exported to a
//! `spool-export` file; the SQLite and JSONL-directory peers are loaded
//! from that file by their own import. Everything the building wrote is
//! synced to disk before the first question, so its writeback does not fall
//! on the reads of the largest size. Every question then runs in a child
//! process (this binary re-executed in [`crate::store_child`]'s mode),
//! subjects interleaved within each round; the parent times the child from
//! spawn to exit and checks its answer, and the child reports its own
//! peak RSS. Imports go into a fresh store each repetition. The reads
//! and the owner open repeat more often than the import
//! ([`crate::harness::Sizes::store_read_repetitions`]): a process of a
//! few milliseconds is at the mercy of the shared machine's moment. They
//! all run before the first import, whose writeback and deletions would
//! otherwise fall on the reads after it.
//!
//! The goals are computed from the run, never assumed: each spool read at
//! the largest size within [`FLAT_FACTOR`] of its time at the smallest,
//! each read at least as fast as SQLite, the listing at least
//! [`LIST_JSONL_FACTOR`] times as fast as the JSONL directory at the
//! largest size, spool's peak RSS at the largest size within
//! [`FLAT_FACTOR`] of the smallest, and import at least as fast as SQLite.
//!
//! Not part of the default set (building a million-commit store takes
//! minutes): run it with `--workload store`.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use spool_runtime::session::{AgentDefinition, AgentSession, SessionEvent, SessionId};
use spool_runtime::store::exchange::ExportWriter;
use spool_runtime::store::TranscriptBackend;
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};

use crate::data;
use crate::error::{io_err, BenchError};
use crate::harness::{create_dir, remove_dir, wrong, Harness};
use crate::report::ResultRow;
use crate::stats::Samples;
use crate::store_child::{self, entries_answer, import_answer, list_answer, OPEN_ANSWER};
use crate::workloads::Workload;

/// Entries per session.
pub const ENTRIES_PER_SESSION: usize = 100;

/// Text bytes per entry at most: the generated records are cut to this,
/// so a store's log is about 0.6 KiB per commit.
pub const ENTRY_TEXT_MAX: usize = 512;

/// "Flat": the largest size's figure at most this many times the
/// smallest's.
pub const FLAT_FACTOR: f64 = 1.5;

/// The listing goal over the JSONL directory at the largest size.
pub const LIST_JSONL_FACTOR: f64 = 10.0;

/// The subjects, in the order each round runs them.
pub const SUBJECTS: [&str; 3] = ["spool", "sqlite", "jsonl"];

/// The questions, in report order.
pub const QUESTIONS: [Question; 5] = [
    Question::List,
    Question::Context,
    Question::Show,
    Question::Open,
    Question::Import,
];

/// One question of the workload.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Question {
    List,
    Context,
    Show,
    Open,
    Import,
}

impl Question {
    /// The child mode's name of the question.
    pub fn name(self) -> &'static str {
        match self {
            Question::List => "list",
            Question::Context => "context",
            Question::Show => "show",
            Question::Open => "open",
            Question::Import => "import",
        }
    }

    /// The command it stands for.
    pub fn command(self) -> &'static str {
        match self {
            Question::List => "sessions --limit 20",
            Question::Context => "context ID",
            Question::Show => "show ID",
            Question::Open => "owner open",
            Question::Import => "import FILE",
        }
    }

    fn is_read(self) -> bool {
        !matches!(self, Question::Open | Question::Import)
    }
}

/// The store figures of one row (one question at one size).
#[derive(Clone, Debug, Serialize)]
pub struct StoreFigures {
    pub question: &'static str,
    pub command: &'static str,
    pub commits: u64,
    pub sessions: u64,
    /// Median wall seconds of the child process, by subject.
    pub seconds: BTreeMap<String, f64>,
    /// Highest peak RSS of the child over the repetitions, by subject.
    pub peak_rss_bytes: BTreeMap<String, u64>,
    /// Bytes on disk of each subject's store after it was built, and of
    /// spool's parts (`spool log`, `spool index`, `spool checkpoints`).
    pub disk_bytes: BTreeMap<String, u64>,
    /// The goals this row decides (rows of the largest size only).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub goals: Vec<Goal>,
}

/// A goal and what the run measured for it.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub goal: String,
    /// The measured ratio, oriented so that higher is better.
    pub ratio: f64,
    /// The ratio the goal asks for at least.
    pub target: f64,
    pub met: bool,
}

/// One question at one size: (question, commits, sessions, by subject
/// the rates of its repetitions and its highest peak RSS).
type Measured = (
    Question,
    u64,
    u64,
    BTreeMap<String, (Samples, u64)>,
    BTreeMap<String, u64>,
);

/// What one child reported.
struct ChildRun {
    seconds: f64,
    rss: u64,
}

/// One size's stores and files.
struct Built {
    commits: u64,
    sessions: u64,
    /// The session the per-session questions ask about.
    probe: String,
    export: PathBuf,
    dirs: BTreeMap<&'static str, PathBuf>,
    expected_list: String,
    disk_bytes: BTreeMap<String, u64>,
}

/// Runs the workload: one row per question and size.
pub fn run(h: &mut Harness<'_>) -> Result<Vec<ResultRow>, BenchError> {
    let exe = std::env::current_exe().map_err(|e| io_err("store", Path::new("."), e))?;
    let sizes = h.sizes.store_commits.clone();
    let reps = h.sizes.store_read_repetitions;
    let import_reps = h.sizes.store_import_repetitions;
    let mut figures: Vec<Measured> = Vec::new();
    for &target in &sizes {
        // `target` commits of entries; each session adds its `created`
        // commit.
        let sessions = (target / ENTRIES_PER_SESSION as u64).max(1);
        (h.progress)(&format!("  building {sessions} sessions"));
        let built = build(h.dir, sessions, &exe)?;
        // What the building wrote goes to disk before any question is
        // timed: otherwise its writeback (gigabytes at the largest size,
        // the export written through the page cache) falls on the reads.
        sync_tree(&built.export)?;
        for d in built.dirs.values() {
            sync_tree(d)?;
        }
        let variant = format!("commits={}", built.commits);
        let mut per_q: Vec<BTreeMap<String, (Samples, u64)>> =
            QUESTIONS.iter().map(|_| BTreeMap::new()).collect();
        // The reads first, then the imports: an import leaves gigabytes to
        // write back and to delete, which would fall on the reads of the
        // rounds after it (and on the subject asked first most).
        let phases = [(false, reps, "reads"), (true, import_reps, "import")];
        for (import, n, name) in phases {
            for rep in 0..n {
                (h.progress)(&format!("  {variant} {name} round {}/{n}", rep + 1));
                for (qi, &q) in QUESTIONS.iter().enumerate() {
                    if (q == Question::Import) != import {
                        continue;
                    }
                    for subject in SUBJECTS {
                        let r = ask(&exe, &built, subject, q, &variant)?;
                        let e = per_q[qi]
                            .entry(subject.to_string())
                            .or_insert_with(|| (Samples::default(), 0));
                        e.0.rates.push(1.0 / r.seconds.max(1e-9));
                        e.1 = e.1.max(r.rss);
                    }
                }
            }
        }
        for (qi, m) in per_q.into_iter().enumerate() {
            figures.push((
                QUESTIONS[qi],
                built.commits,
                built.sessions,
                m,
                built.disk_bytes.clone(),
            ));
        }
        for d in built.dirs.values() {
            remove_dir(d)?;
        }
        std::fs::remove_file(&built.export).map_err(|e| io_err("store", &built.export, e))?;
    }
    let largest = figures.iter().map(|f| f.1).max().unwrap_or(0);
    let smallest = figures.iter().map(|f| f.1).min().unwrap_or(0);
    let mut rows = Vec::new();
    for (q, commits, sessions, m, disk) in &figures {
        let measured: Vec<(String, Samples)> = SUBJECTS
            .iter()
            .filter_map(|s| m.get(*s).map(|(x, _)| (s.to_string(), x.clone())))
            .collect();
        let mut row = ResultRow::from_measured(
            Workload::Store.name(),
            &format!("{} commits={commits}", q.name()),
            "runs/s",
            measured,
        );
        let seconds: BTreeMap<String, f64> = m
            .iter()
            .filter_map(|(s, (x, _))| Some((s.clone(), 1.0 / x.summary()?.median)))
            .collect();
        let peak_rss_bytes = m.iter().map(|(s, (_, r))| (s.clone(), *r)).collect();
        let mut f = StoreFigures {
            question: q.name(),
            command: q.command(),
            commits: *commits,
            sessions: *sessions,
            seconds,
            peak_rss_bytes,
            disk_bytes: disk.clone(),
            goals: Vec::new(),
        };
        if *commits == largest {
            f.goals = goals(*q, &f, &figures, smallest);
        }
        row.store = Some(f);
        rows.push(row);
    }
    Ok(rows)
}

/// The goals a question's row at the largest size decides.
fn goals(q: Question, f: &StoreFigures, all: &[Measured], smallest: u64) -> Vec<Goal> {
    let secs = |commits: u64, subject: &str| -> Option<f64> {
        let (_, _, _, m, _) = all
            .iter()
            .find(|(x, c, _, _, _)| *x == q && *c == commits)?;
        Some(1.0 / m.get(subject)?.0.summary()?.median)
    };
    let rss = |commits: u64| -> Option<u64> {
        let (_, _, _, m, _) = all
            .iter()
            .find(|(x, c, _, _, _)| *x == q && *c == commits)?;
        Some(m.get("spool")?.1)
    };
    let mut out = Vec::new();
    let mut push = |goal: String, ratio: Option<f64>, target: f64| {
        if let Some(ratio) = ratio.filter(|r| r.is_finite()) {
            out.push(Goal {
                goal,
                ratio,
                target,
                met: ratio >= target,
            });
        }
    };
    let big = f.commits;
    let flat_target = 1.0 / FLAT_FACTOR;
    if q.is_read() {
        push(
            format!("spool time flat ({big} vs {smallest} commits, smallest ÷ largest)"),
            secs(smallest, "spool")
                .zip(secs(big, "spool"))
                .map(|(s, b)| s / b),
            flat_target,
        );
    }
    if q != Question::Import {
        push(
            format!("spool peak RSS flat ({big} vs {smallest} commits, smallest ÷ largest)"),
            rss(smallest)
                .zip(rss(big))
                .map(|(s, b)| s as f64 / b.max(1) as f64),
            flat_target,
        );
    }
    if q.is_read() || q == Question::Import {
        push(
            "spool ≥ 1× SQLite (SQLite time ÷ spool time)".into(),
            secs(big, "sqlite")
                .zip(secs(big, "spool"))
                .map(|(p, s)| p / s),
            1.0,
        );
    }
    if q == Question::List {
        push(
            format!("spool ≥ {LIST_JSONL_FACTOR}× the JSONL directory (JSONL time ÷ spool time)"),
            secs(big, "jsonl")
                .zip(secs(big, "spool"))
                .map(|(p, s)| p / s),
            LIST_JSONL_FACTOR,
        );
    }
    out
}

/// Builds the spool store of `sessions` sessions, exports it, and loads
/// the peers from the export (through their own import, in a child).
fn build(dir: &Path, sessions: u64, exe: &Path) -> Result<Built, BenchError> {
    let spool_dir = dir.join(format!("spool-{sessions}"));
    create_dir(&spool_dir)?;
    let export = dir.join(format!("export-{sessions}.jsonl"));
    let opts = LogStoreOptions {
        durability: spool_engine::Durability::Buffered,
        ..LogStoreOptions::default()
    };
    let store = Arc::new(LogStore::open(&spool_dir, opts).map_err(subject_err)?);
    let mut ids = Vec::with_capacity(sessions as usize);
    let mut commits = 0u64;
    for key in 0..sessions {
        let id = SessionId::parse(&crate::subject::session_id(key)).map_err(subject_err)?;
        let def = AgentDefinition::new("bench-agent", "store benchmark", "You are benchmarked.");
        let created = store
            .create(AgentSession::new_with_id(id.clone(), def, None))
            .map_err(subject_err)?;
        let mut version = created.version();
        commits += 1;
        for (seq, mut r) in data::transcript(data::DEFAULT_SEED, key, ENTRIES_PER_SESSION)
            .into_iter()
            .enumerate()
        {
            // ASCII text: any byte offset is a character boundary.
            r.text.truncate(ENTRY_TEXT_MAX);
            let entry = crate::spool::entry_for(seq as u64, &r)?;
            version = store
                .append_events(&id, version, vec![SessionEvent::EntryAppended { entry }])
                .map_err(subject_err)?
                .session_version;
            commits += 1;
        }
        ids.push(id);
    }
    let f = File::create(&export).map_err(|e| io_err("store", &export, e))?;
    let mut w = ExportWriter::new(BufWriter::new(f)).map_err(subject_err)?;
    for id in &ids {
        w.session(&store, id).map_err(subject_err)?;
    }
    let (mut out, _) = w.finish().map_err(subject_err)?;
    out.flush().map_err(|e| io_err("store", &export, e))?;
    drop(out);
    let store = Arc::try_unwrap(store).map_err(|_| subject_err("store still shared"))?;
    store.close().map_err(subject_err)?;

    let mut dirs = BTreeMap::new();
    dirs.insert("spool", spool_dir);
    for peer in ["sqlite", "jsonl"] {
        let d = dir.join(format!("{peer}-{sessions}"));
        remove_dir(&d)?;
        let (line, _) = child(exe, peer, Question::Import, &d, &export.to_string_lossy())?;
        let want = import_answer(sessions, sessions * ENTRIES_PER_SESSION as u64);
        if line != want {
            return Err(wrong(peer, Workload::Store, "load", line, want));
        }
        dirs.insert(peer, d);
    }
    // The newest LIST_LIMIT updates, from the export's commit times (the
    // peers' `updated_at`, and spool's header times, which the export
    // carries).
    let expected_list = expected_list(&export)?;
    let mut disk_bytes = BTreeMap::new();
    for (name, d) in &dirs {
        disk_bytes.insert(name.to_string(), dir_bytes(d)?);
    }
    let spool_dir = &dirs["spool"];
    let (mut log, mut other) = (0u64, 0u64);
    for e in std::fs::read_dir(spool_dir).map_err(|e| io_err("store", spool_dir, e))? {
        let e = e.map_err(|e| io_err("store", spool_dir, e))?;
        let p = e.path();
        if p.extension().is_some_and(|x| x == "seg") {
            log += dir_bytes(&p)?;
        } else if p.is_file() {
            other += dir_bytes(&p)?;
        }
    }
    disk_bytes.insert("spool log".into(), log);
    disk_bytes.insert("spool other files".into(), other);
    disk_bytes.insert(
        "spool index".into(),
        dir_bytes(&spool_dir.join(spool_engine::INDEX_DIR))?,
    );
    disk_bytes.insert(
        "spool checkpoints".into(),
        dir_bytes(&spool_dir.join(spool_engine::CHECKPOINT_DIR))?,
    );
    Ok(Built {
        commits,
        sessions,
        probe: crate::subject::session_id(sessions / 2),
        export,
        dirs,
        expected_list,
        disk_bytes,
    })
}

/// Bytes allocated on disk under `p` (a file or a directory tree; 0 if
/// absent): what a user's `du` would count.
fn dir_bytes(p: &Path) -> Result<u64, BenchError> {
    use std::os::unix::fs::MetadataExt;
    let meta = match std::fs::symlink_metadata(p) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(io_err("store", p, e)),
    };
    if !meta.is_dir() {
        return Ok(meta.blocks() * 512);
    }
    let mut total = 0;
    for e in std::fs::read_dir(p).map_err(|e| io_err("store", p, e))? {
        let e = e.map_err(|e| io_err("store", p, e))?;
        total += dir_bytes(&e.path())?;
    }
    Ok(total)
}

/// Makes every file and directory under `p` durable (`fsync`), so that none
/// of it is left to write back while later questions are timed.
fn sync_tree(p: &Path) -> Result<(), BenchError> {
    let meta = std::fs::symlink_metadata(p).map_err(|e| io_err("store", p, e))?;
    if meta.is_dir() {
        for e in std::fs::read_dir(p).map_err(|e| io_err("store", p, e))? {
            let e = e.map_err(|e| io_err("store", p, e))?;
            sync_tree(&e.path())?;
        }
    } else if !meta.is_file() {
        return Ok(());
    }
    File::open(p)
        .and_then(|f| f.sync_all())
        .map_err(|e| io_err("store", p, e))
}

/// The listing's answer from the export: each session's last commit time,
/// newest first, [`store_child::LIST_LIMIT`] of them.
fn expected_list(export: &Path) -> Result<String, BenchError> {
    let text = std::fs::read_to_string(export).map_err(|e| io_err("store", export, e))?;
    let mut last: BTreeMap<String, i64> = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        let v: serde_json::Value =
            serde_json::from_str(line).map_err(|source| BenchError::Json {
                subject: "store".into(),
                path: export.to_path_buf(),
                line: i as u64 + 1,
                source,
            })?;
        if let (Some(s), Some(t)) = (
            v.get("session").and_then(|s| s.as_str()),
            v.get("timestamp_ms").and_then(|t| t.as_i64()),
        ) {
            last.insert(s.to_string(), t);
        }
    }
    let mut times: Vec<i64> = last.into_values().collect();
    times.sort_unstable_by(|a, b| b.cmp(a));
    times.truncate(store_child::LIST_LIMIT);
    Ok(list_answer(times))
}

/// Asks `subject` one question in a fresh process and checks the answer.
fn ask(
    exe: &Path,
    b: &Built,
    subject: &'static str,
    q: Question,
    variant: &str,
) -> Result<ChildRun, BenchError> {
    let dir = &b.dirs[subject];
    let per_session = entries_answer(ENTRIES_PER_SESSION as u64);
    let (arg, want) = match q {
        Question::List => (String::new(), b.expected_list.clone()),
        Question::Context | Question::Show => (b.probe.clone(), per_session),
        Question::Open => (String::new(), OPEN_ANSWER.to_string()),
        Question::Import => (
            b.export.to_string_lossy().into_owned(),
            import_answer(b.sessions, b.sessions * ENTRIES_PER_SESSION as u64),
        ),
    };
    let target = if q == Question::Import {
        let t = dir.with_extension("import");
        remove_dir(&t)?;
        if subject == "spool" {
            create_dir(&t)?;
        }
        t
    } else {
        dir.clone()
    };
    let start = Instant::now();
    let (line, rss) = child(exe, subject, q, &target, &arg)?;
    let seconds = start.elapsed().as_secs_f64();
    if q == Question::Import {
        remove_dir(&target)?;
    }
    if line != want {
        return Err(wrong(
            subject,
            Workload::Store,
            &format!("{} {variant}", q.name()),
            line,
            want,
        ));
    }
    Ok(ChildRun { seconds, rss })
}

/// Runs one child; returns its answer line and its peak RSS.
fn child(
    exe: &Path,
    subject: &str,
    q: Question,
    dir: &Path,
    arg: &str,
) -> Result<(String, u64), BenchError> {
    let mut cmd = Command::new(exe);
    cmd.arg(store_child::CHILD_ARG)
        .arg(subject)
        .arg(q.name())
        .arg(dir);
    if !arg.is_empty() {
        cmd.arg(arg);
    }
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| io_err(subject, exe, e))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        return Err(BenchError::Subject {
            subject: subject.to_string(),
            message: format!(
                "{} in a child process failed ({}): {}",
                q.name(),
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ),
        });
    }
    let line = stdout.trim_end();
    let (answer, rss) = line.rsplit_once('\t').unwrap_or((line, "0"));
    Ok((answer.to_string(), rss.parse().unwrap_or(0)))
}

fn subject_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Subject {
        subject: "spool".into(),
        message: e.to_string(),
    }
}

fn fmt_secs(s: f64) -> String {
    if s >= 10.0 {
        format!("{s:.1} s")
    } else if s >= 1.0 {
        format!("{s:.2} s")
    } else {
        format!("{:.1} ms", s * 1e3)
    }
}

fn fmt_mib(b: u64) -> String {
    format!("{:.0} MiB", b as f64 / (1024.0 * 1024.0))
}

/// The Markdown of the `store` rows: a table per question (time and peak
/// RSS of the child per size and subject), then the goals.
pub fn markdown(rows: &[&ResultRow]) -> String {
    let mut out = String::new();
    let figs: Vec<&StoreFigures> = rows.iter().filter_map(|r| r.store.as_ref()).collect();
    if figs.is_empty() {
        return out;
    }
    let reps = |import: bool| {
        rows.iter()
            .filter(|r| {
                r.store
                    .as_ref()
                    .is_some_and(|f| (f.question == Question::Import.name()) == import)
            })
            .map(|r| r.repetitions)
            .max()
            .unwrap_or(0)
    };
    let (read_reps, import_reps) = (reps(false), reps(true));
    let _ = writeln!(
        out,
        "\nThe store as a whole, each question in a fresh process (median wall time of \
         the process over {read_reps} repetitions of each read and owner open and \
         then {import_reps} of the import, interleaved by subject within each round; \
         highest peak RSS of the process; {ENTRIES_PER_SESSION} entries \
         per session, one commit each after the session's `created` commit; every file \
         the building wrote synced to disk before the first question). spool: \
         the library as the `spool` command uses it (a read-only `LogStore` for the reads; \
         `show` the session's settings fold and transcript head, not its entries; an \
         owner `LogStore::open` and close, and `import_from` over the file (a check pass reading \
         it a commit at a time and keeping them encoded in a temporary file, then a pass \
         appending a session's commits in batches) into a \
         fresh store, buffered with one sync, as `spool import` \
         does). `sqlite`: sessions(id, header columns, leaf, \
         definition) with an index on updated_at, entries keyed by (session, seq) with the \
         entry id, parent id and JSON content, a unique index on (session, id); listing \
         `ORDER BY updated_at DESC LIMIT 20`, context the recursive root-to-leaf path, \
         show the header row and an entry count, owner open the connection with \
         `BEGIN IMMEDIATE`, import the export file in one transaction (WAL, \
         synchronous=FULL). `jsonl`: one file per session, its first line the header; \
         listing reads every first line, context and show read one file, owner open takes a \
         lock file and lists the directory, import writes and syncs one file per session."
    );
    for q in QUESTIONS {
        let qf: Vec<&&StoreFigures> = figs.iter().filter(|f| f.question == q.name()).collect();
        if qf.is_empty() {
            continue;
        }
        let _ = writeln!(out, "\n`{}`:\n", q.command());
        let mut header = String::from("| commits | sessions |");
        let mut rule = String::from("|---:|---:|");
        for s in SUBJECTS {
            let _ = write!(header, " {s} time | {s} RSS |");
            rule.push_str("---:|---:|");
        }
        let _ = writeln!(out, "{header}\n{rule}");
        for f in &qf {
            let mut line = format!("| {} | {} |", f.commits, f.sessions);
            for s in SUBJECTS {
                let t = f.seconds.get(s).map_or("—".into(), |v| fmt_secs(*v));
                let r = f.peak_rss_bytes.get(s).map_or("—".into(), |v| fmt_mib(*v));
                let _ = write!(line, " {t} | {r} |");
            }
            let _ = writeln!(out, "{line}");
        }
    }
    let _ = writeln!(
        out,
        "\nDisk after building (allocated bytes, as `du` counts them):\n\n\
         | commits | spool | spool log | spool index | spool checkpoints | sqlite | jsonl |\n\
         |---:|---:|---:|---:|---:|---:|---:|"
    );
    let mut seen = std::collections::BTreeSet::new();
    for f in &figs {
        if !seen.insert(f.commits) {
            continue;
        }
        let d = |k: &str| f.disk_bytes.get(k).map_or("—".into(), |v| fmt_mib(*v));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            f.commits,
            d("spool"),
            d("spool log"),
            d("spool index"),
            d("spool checkpoints"),
            d("sqlite"),
            d("jsonl")
        );
    }
    let goals: Vec<(&str, &Goal)> = figs
        .iter()
        .flat_map(|f| f.goals.iter().map(move |g| (f.command, g)))
        .collect();
    if !goals.is_empty() {
        let _ = writeln!(
            out,
            "\nGoals (ratios from this run, higher is better):\n\n\
             | command | goal | measured | target | met |\n|---|---|---:|---:|---|"
        );
        for (c, g) in goals {
            let _ = writeln!(
                out,
                "| `{c}` | {} | {:.2} | {:.2} | {} |",
                g.goal,
                g.ratio,
                g.target,
                if g.met { "yes" } else { "no" }
            );
        }
    }
    out
}
