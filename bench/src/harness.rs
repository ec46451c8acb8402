//! The harness every subject runs through: the same generated records
//! ([`crate::data`]), the same threads, the same timer, the same repetitions
//! ([`crate::stats`]), interleaved across subjects ([`rounds`]), and the
//! same answer checks. Each subject's budgets count its own unit
//! ([`SubjectStore::entry_cost`]).
//!
//! [`run`] creates the scratch directories, starts the PostgreSQL peer's
//! server on first use, runs each selected workload
//! ([`crate::workloads`]) and removes everything it created.

use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::{Duration, Instant};

use crate::data::{self, Record};
use crate::error::{io_err, BenchError};
use crate::peers;
use crate::report::{self, Machine, Report, RunInfo};
use crate::stats::{self, Samples};
use crate::subject::{
    ContextSummary, Durability, PageSummary, SessionData, SessionSpec, SpoolSubject, SubjectStore,
};
use crate::workloads::{self, select_workloads, Workload};

/// Byte budget of the model context built by `open` and `fork`.
pub const CONTEXT_BUDGET: usize = 64 * 1024;

/// Byte budget of one page in the `page` workload.
pub const PAGE_BUDGET: usize = 64 * 1024;

/// Records every session of the `list` workload holds, so that session
/// files and tables have realistic sizes.
pub const LIST_ENTRIES_PER_SESSION: usize = 4;

/// One MB in the MB/s figures: 10^6 bytes.
pub const MB: f64 = 1_000_000.0;

/// What a run was asked to do.
#[derive(Clone, Debug)]
pub struct BenchConfig {
    /// Small sizes and fewer repetitions: seconds instead of minutes.
    pub quick: bool,
    /// The `store` workload's sizes in commits, instead of the default ones.
    pub store_commits: Option<Vec<u64>>,
    /// Workload names (see [`crate::workloads`]); empty means all.
    pub workloads: Vec<String>,
    /// Scratch directory on the disk to measure. The harness creates
    /// subdirectories in it and removes them when a workload is done.
    pub dir: PathBuf,
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
    /// History lengths of `execute`.
    pub execute_histories: Vec<usize>,
    /// Turns each measuring process of `execute` runs and times.
    pub execute_turns: usize,
    /// Target commits of each `store` size (about 100 entries per session).
    pub store_commits: Vec<u64>,
    /// Repetitions of each `store` read and owner open (a fresh process
    /// each, a few milliseconds: a median of few would follow the shared
    /// machine's moments rather than the subjects).
    pub store_read_repetitions: usize,
    /// Repetitions of the `store` import (a fresh store each).
    pub store_import_repetitions: usize,
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
            execute_histories: vec![1_000, 10_000, 50_000],
            execute_turns: 20,
            store_commits: vec![10_000, 100_000, 1_000_000],
            store_read_repetitions: 21,
            store_import_repetitions: 3,
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
            execute_histories: vec![200, 1_000],
            execute_turns: 5,
            store_commits: vec![1_000, 2_000],
            store_read_repetitions: 4,
            store_import_repetitions: 1,
            min_time: Duration::from_millis(30),
            max_iters: 1_000,
        }
    }

    pub fn for_config(config: &BenchConfig) -> Self {
        let mut sizes = if config.quick {
            Sizes::quick()
        } else {
            Sizes::full()
        };
        if let Some(c) = &config.store_commits {
            sizes.store_commits = c.clone();
        }
        sizes
    }
}

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
        let mut rows = workloads::run(w, &mut h, spool)?;
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

pub fn remove_dir(dir: &Path) -> Result<(), BenchError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err("harness", dir, e)),
    }
}

pub fn create_dir(dir: &Path) -> Result<(), BenchError> {
    remove_dir(dir)?;
    std::fs::create_dir_all(dir).map_err(|e| io_err("harness", dir, e))
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
pub struct Loaded<'s> {
    pub subject: &'s dyn SpoolSubject,
    pub dir: PathBuf,
    pub store: Box<dyn SubjectStore>,
}

impl Loaded<'_> {
    pub fn name(&self) -> &str {
        self.subject.name()
    }
}

/// Closes every loaded store and removes its directory.
pub fn close_all(loaded: Vec<Loaded<'_>>) -> Result<(), BenchError> {
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
pub fn rounds(
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

pub struct Harness<'a> {
    pub dir: &'a Path,
    pub sizes: &'a Sizes,
    pub progress: &'a mut dyn FnMut(&str),
    /// The PostgreSQL peer (its server starts on first use).
    pub pg: &'a peers::postgres::PostgresPeer,
}

impl Harness<'_> {
    pub fn subject_dir(&self, subject: &str, variant: &str) -> PathBuf {
        let v: String = variant
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        self.dir.join(format!("{subject}-{v}"))
    }

    /// Appends per-writer records with `writers` threads into a fresh
    /// store of each subject, in interleaved rounds (see [`rounds`]);
    /// returns each subject's commit rates and payload byte rates.
    pub fn append_rounds(
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

    /// Loads `sessions` into a fresh store of `subject`, closes it and
    /// opens it again for the timed part.
    pub fn loaded_store<'s>(
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
    pub fn load_all<'s>(
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

    pub fn peers_for(&self, workload: Workload) -> Vec<Box<dyn SpoolSubject>> {
        let all: Vec<Box<dyn SpoolSubject>> = vec![
            Box::new(peers::sqlite::SqlitePeer),
            Box::new(peers::jsonl::JsonlPeer),
            Box::new(peers::json_file::JsonFilePeer),
        ];
        all.into_iter().filter(|p| p.supports(workload)).collect()
    }
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

pub fn check_context(
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

pub fn wrong(
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

    /// A spool subject that takes part in nothing: the harness runs the peers
    /// only and reports the spool figures as `null`.
    #[derive(Clone, Copy, Debug, Default)]
    pub struct NoSpool;

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
            store_commits: None,
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
            "execute" => &["sqlite", "jsonl"],
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
        for n in &q.execute_histories {
            want.push(("execute".into(), format!("history={n}"), "executes/s"));
        }
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
    fn expected_context_takes_the_newest_that_fit() {
        let recs = data::transcript(data::DEFAULT_SEED, 0, 300);
        let c = expected_context(&recs, CONTEXT_BUDGET, |r, _| r.bytes());
        let tail = &recs[recs.len() - c.entries as usize..];
        assert_eq!(data::total_bytes(tail), c.bytes);
        assert!(c.bytes <= CONTEXT_BUDGET as u64);
        let next = &recs[recs.len() - c.entries as usize - 1];
        assert!(c.bytes + next.bytes() as u64 > CONTEXT_BUDGET as u64);
    }
}
