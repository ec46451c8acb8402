//! Simulated power loss under the session runtime.
//!
//! The log store runs on the engine over `SimVfs` (an in-memory file system
//! with a live and a durable image; a crash keeps the synced bytes plus a
//! seeded prefix of unsynced writes, the last possibly torn and followed by
//! garbage). A seeded session workload runs, the file system crashes at the
//! k-th sync point, for every k, and the reopened store must hold every
//! acknowledged save, nothing half-visible, contiguous versions, headers
//! equal to the folds, and a listing that survives deleting the index.
//!
//! Seeded: `SPOOL_TEST_SEED` replays a run; `SPOOL_CRASH_SEEDS` sets how
//! many crash seeds are tried per sync point (default 3).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use spool_engine::vfs::SimVfs;
use spool_engine::{verify, Durability, Store};
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_tests::seed::{env_usize, test_seed, Rng};
use spool_tests::workload::{capturing_runtime, check_recovered, list_all, run_workload, Tracker};

const STORE: &str = "/store";
const STEPS: usize = 60;

fn opts(sim: &SimVfs, ix: &Path, durability: Durability) -> spool_engine::Options {
    LogStoreOptions {
        durability,
        segment_bytes_max: Some(4096),
        ..LogStoreOptions::default()
    }
    .engine_options()
    .vfs(Arc::new(sim.clone()))
    // The spare segment is built at a fixed point: sync points stay reproducible.
    .next_segment(spool_engine::NextSegment::Inline)
    .index_dir(ix.join("index"))
    // No background flushes: with Buffered, only explicit flushes sync.
    .buffered_flush_interval(std::time::Duration::from_secs(3600))
}

fn open(sim: &SimVfs, ix: &Path, d: Durability) -> Result<LogStore, spool_engine::Error> {
    Store::open(PathBuf::from(STORE), opts(sim, ix, d)).map(LogStore::from_engine)
}

/// Runs the workload on a fresh SimVfs that crashes at sync point `k`
/// (0 = no planned crash: it crashes after the workload). Returns the
/// tracker and the number of sync points the run reached.
fn crashed_run(
    seed: u64,
    k: u64,
    crash_seed: u64,
    d: Durability,
    ix: &Path,
) -> (SimVfs, Tracker, u64) {
    let sim = SimVfs::new();
    if k > 0 {
        sim.crash_at_sync(k, crash_seed);
    }
    let mut tracker = Tracker::default();
    let mut rng = Rng::new(seed);
    if let Ok(store) = open(&sim, ix, d) {
        let store = Arc::new(store);
        let (rt, capture) = capturing_runtime(store.clone() as Arc<dyn SessionStore>);
        let mut flushes = 0u64;
        let res = run_workload(&rt, &capture, &mut tracker, &mut rng, STEPS, |t| match d {
            Durability::Immediate => t.mark_durable(),
            _ => {
                flushes += 1;
                if flushes.is_multiple_of(5)
                    && store.engine().expect("engine handle").flush().is_ok()
                {
                    t.mark_durable();
                }
            }
        });
        if let Err(e) = res {
            panic!("workload (seed {seed}, crash at sync {k}): {e}");
        }
        drop(rt);
    }
    let syncs = sim.sync_count();
    if sim.crash_count() == 0 {
        sim.crash(crash_seed);
    }
    (sim.after_crash(), tracker, syncs)
}

fn check_after_crash(sim: &SimVfs, ix: &Path, d: Durability, tracker: &Tracker, ctx: &str) {
    let store = open(sim, ix, d).unwrap_or_else(|e| panic!("{ctx}: reopen failed: {e}"));
    if let Err(e) = check_recovered(&store, tracker) {
        panic!("{ctx}: {e}");
    }
    let before = list_all(&store).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    // The store keeps working after recovery.
    let (rt, _) = capturing_runtime(Arc::new(store) as Arc<dyn SessionStore>);
    let s = rt
        .create(spool_tests::ops::definition(0), None)
        .unwrap_or_else(|e| panic!("{ctx}: create after recovery: {e}"));
    rt.purge(s.id())
        .unwrap_or_else(|e| panic!("{ctx}: purge after recovery: {e}"));
    drop(rt);
    // The log verifies, and a rebuilt index lists the same sessions.
    let report = verify(STORE, opts(sim, &ix.join("verify"), d)).expect("verify runs");
    assert!(report.ok, "{ctx}: verify: {report:?}");
    std::fs::remove_dir_all(ix.join("index")).expect("remove index");
    // From the log alone (an index found empty would otherwise start from the
    // checkpoint the closes wrote).
    let store = Store::open(PathBuf::from(STORE), opts(sim, ix, d).index_from_log(true))
        .map(LogStore::from_engine)
        .unwrap_or_else(|e| panic!("{ctx}: reopen without index: {e}"));
    let after = list_all(&store).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert_eq!(
        before, after,
        "{ctx}: listing differs after an index rebuild"
    );
    if let Err(e) = check_recovered(&store, tracker) {
        panic!("{ctx} (rebuilt index): {e}");
    }
}

fn crash_at_every_sync_point(d: Durability) {
    let seed = test_seed(&format!("crash_sim {d:?}"), 0xC4A5_0001);
    let crash_seeds = env_usize("SPOOL_CRASH_SEEDS", 3) as u64;
    let probe_ix = spool_tests::seed::scratch_dir();
    let (_, probe, syncs) = crashed_run(seed, 0, 0, d, probe_ix.path());
    assert!(
        probe.acked >= STEPS as u64 / 2,
        "the workload acknowledged only {}",
        probe.acked
    );
    assert!(syncs > 10, "only {syncs} sync points");
    let mut points = 0u64;
    let mut with_inflight = 0u64;
    for k in 1..=syncs {
        for c in 0..crash_seeds {
            let crash_seed = seed ^ (k << 16) ^ c;
            let ctx =
                format!("{d:?} seed {seed} crash at sync {k}/{syncs} crash seed {crash_seed}");
            let ix = spool_tests::seed::scratch_dir();
            let (sim, tracker, _) = crashed_run(seed, k, crash_seed, d, ix.path());
            if tracker.inflight.is_some() {
                with_inflight += 1;
            }
            check_after_crash(&sim, ix.path(), d, &tracker, &ctx);
            points += 1;
        }
    }
    eprintln!(
        "crash_sim {d:?}: {points} crash points simulated over {syncs} sync points, \
         {with_inflight} with a save in flight; {} operations acknowledged in the full run",
        probe.acked
    );
    assert!(with_inflight > 0, "no crash hit a save in flight");
}

#[test]
fn runtime_crash_at_every_sync_point_immediate() {
    crash_at_every_sync_point(Durability::Immediate);
}

#[test]
fn runtime_crash_at_every_sync_point_buffered() {
    crash_at_every_sync_point(Durability::Buffered);
}
