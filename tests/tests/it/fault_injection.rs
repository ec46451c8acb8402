//! SQLite-style fault injection under the session runtime.
//!
//! A fixed, seeded session workload runs on the log store over `FaultVfs`
//! (real files). First a clean run counts the I/O calls; then for every N
//! the N-th call fails — once, then persistently from N on. After each
//! run: if the store was poisoned (a failed write or fsync), no save after
//! the failure is acknowledged; the store reopens (without faults) with
//! every acknowledged save present, nothing half-visible, contiguous
//! versions, a clean `verify`, and the same listing after an index rebuild.

use std::path::Path;
use std::sync::Arc;

use serde_json::json;
use spool_engine::vfs::{FaultKind, FaultVfs, OsVfs};
use spool_engine::{verify, Durability, Store, INDEX_DIR};
use spool_runtime::actions::WriteMetadata;
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore, StoreError};
use spool_tests::seed::{test_seed, Rng};
use spool_tests::workload::{capturing_runtime, check_recovered, list_all, run_workload, Tracker};

/// Operations in the workload (`SPOOL_FAULT_STEPS` raises it for a long run).
fn steps() -> usize {
    spool_tests::seed::env_usize("SPOOL_FAULT_STEPS", 24)
}

fn opts(fv: Option<&FaultVfs>) -> spool_engine::Options {
    let o = LogStoreOptions {
        durability: Durability::Immediate,
        segment_bytes_max: Some(4096),
        ..LogStoreOptions::default()
    }
    .engine_options();
    match fv {
        // Inline: the spare segment's file operations come at fixed points.
        Some(fv) => o
            .vfs(Arc::new(fv.clone()))
            .next_segment(spool_engine::NextSegment::Inline),
        None => o,
    }
}

struct RunResult {
    tracker: Tracker,
    failed: bool,
    poisoned: bool,
    acks_after_failure: u64,
}

fn faulty_run(dir: &Path, fv: &FaultVfs, seed: u64) -> RunResult {
    let mut r = RunResult {
        tracker: Tracker::default(),
        failed: false,
        poisoned: false,
        acks_after_failure: 0,
    };
    let store = match Store::open(dir, opts(Some(fv))) {
        Ok(s) => Arc::new(LogStore::from_engine(s)),
        Err(_) => {
            r.failed = true;
            return r;
        }
    };
    let (rt, capture) = capturing_runtime(store.clone() as Arc<dyn SessionStore>);
    let mut rng = Rng::new(seed);
    let err = run_workload(&rt, &capture, &mut r.tracker, &mut rng, steps(), |t| {
        t.mark_durable()
    })
    .unwrap_or_else(|e| panic!("workload: {e}"));
    let Some(err) = err else {
        return r;
    };
    r.failed = true;
    r.poisoned = store.engine().expect("engine handle").is_poisoned();
    // A failed fsync or write must poison the store.
    if let Some(StoreError::Engine(spool_engine::Error::Io { op, .. })) = err.as_store() {
        if op.starts_with("sync") || *op == "write_at" {
            assert!(r.poisoned, "a failed {op} did not poison the store: {err}");
        }
    }
    if r.poisoned {
        // Nothing is acknowledged after the failure, even once I/O works again.
        fv.clear();
        let live: Vec<_> = r.tracker.sessions.keys().cloned().collect();
        for id in live.iter().take(3) {
            if rt
                .execute(id, &WriteMetadata::new("after", json!(1)))
                .is_ok()
            {
                r.acks_after_failure += 1;
            }
        }
        if rt.create(spool_tests::ops::definition(1), None).is_ok() {
            r.acks_after_failure += 1;
        }
    }
    r
}

fn check_reopened(dir: &Path, tracker: &Tracker, ctx: &str) {
    let store = LogStore::from_engine(
        Store::open(dir, opts(None)).unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}")),
    );
    check_recovered(&store, tracker).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let before = list_all(&store).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    store
        .close()
        .unwrap_or_else(|e| panic!("{ctx}: close: {e}"));
    let report = verify(dir, opts(None)).expect("verify runs");
    assert!(report.ok, "{ctx}: verify: {report:?}");
    std::fs::remove_dir_all(dir.join(INDEX_DIR)).expect("remove index");
    let store = LogStore::from_engine(
        // From the log alone (an index found empty would otherwise start from the
        // checkpoint the close wrote).
        Store::open(dir, opts(None).index_from_log(true))
            .unwrap_or_else(|e| panic!("{ctx}: reopen without index: {e}")),
    );
    assert_eq!(
        list_all(&store).unwrap_or_else(|e| panic!("{ctx}: {e}")),
        before,
        "{ctx}: listing differs after an index rebuild"
    );
}

#[test]
fn runtime_fault_at_every_io_call_once_then_persistently() {
    let seed = test_seed("fault_injection", 0xFA17_0001);
    let probe = spool_tests::seed::scratch_dir();
    let fv = FaultVfs::new(Arc::new(OsVfs));
    let clean = faulty_run(probe.path(), &fv, seed);
    assert!(!clean.failed, "the clean run failed");
    let total = fv.count(FaultKind::Any);
    assert!(total > 50, "only {total} I/O calls");
    check_reopened(probe.path(), &clean.tracker, "clean run");
    let mut points = 0u64;
    let mut failed_runs = 0u64;
    let mut poisoned_runs = 0u64;
    for persistent in [false, true] {
        for n in 1..=total {
            let ctx =
                format!("seed {seed}: fault at I/O call {n}/{total} (persistent {persistent})");
            let dir = spool_tests::seed::scratch_dir();
            let fv = FaultVfs::new(Arc::new(OsVfs));
            fv.fail_nth(FaultKind::Any, n, persistent);
            let r = faulty_run(dir.path(), &fv, seed);
            assert!(fv.injected() > 0, "{ctx}: the fault was never injected");
            assert_eq!(
                r.acks_after_failure, 0,
                "{ctx}: a save was acknowledged after the store was poisoned"
            );
            failed_runs += u64::from(r.failed);
            poisoned_runs += u64::from(r.poisoned);
            check_reopened(dir.path(), &r.tracker, &ctx);
            points += 1;
        }
    }
    eprintln!(
        "fault_injection: {points} fault-injection points ({total} I/O calls x once/persistent), \
         {failed_runs} runs saw an error, {poisoned_runs} poisoned; {} operations per clean run",
        clean.tracker.acked
    );
    assert!(poisoned_runs > 0);
}
