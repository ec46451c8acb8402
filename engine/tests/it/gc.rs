//! Log compaction (GC): plans, the swap, crash safety, readers of retired segments.
use crate::common;
use common::*;
use spool_engine::vfs::{FaultKind, FaultVfs, OsVfs, SimVfs, Vfs};
use spool_engine::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Records every commit's position and a running count per stream, so that an index
/// that kept stale positions after a GC differs from a rebuild.
struct PosIndexer;

impl Indexer for PosIndexer {
    fn name(&self) -> &'static str {
        "pos"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let mut k = b"p/".to_vec();
        k.extend_from_slice(c.info.stream.as_bytes());
        k.extend_from_slice(&c.info.version.to_be_bytes());
        batch.insert(&k, &c.info.position.to_bytes());
        let mut ck = b"n/".to_vec();
        ck.extend_from_slice(c.info.stream.as_bytes());
        let n = match batch.get(&ck)? {
            Some(v) => u64::from_be_bytes(
                v.try_into()
                    .map_err(|_| IndexError::indexer("pos", "bad count"))?,
            ),
            None => 0,
        };
        batch.insert(&ck, &(n + 1).to_be_bytes());
        Ok(())
    }
}

fn gc_opts() -> Options {
    Options::default()
        .segment_bytes_max(4096)
        .next_segment(spool_engine::NextSegment::Inline)
        .indexer(Arc::new(PosIndexer))
}

/// Streams `live-0..3` and `dead-0..2`, interleaved, 120-byte payloads: many segments.
/// Payload = stream name + version, so that contents are checkable.
fn fill(s: &Store, rounds: u64) {
    for r in 0..rounds {
        for name in ["live-0", "dead-0", "live-1", "dead-1", "live-2", "dead-2"] {
            let v = s.stream_version(name).unwrap().unwrap_or(0);
            let mut payload = format!("{name}:{}:", v + 1).into_bytes();
            payload.resize(120, (r % 251) as u8);
            committed(
                s.append(commit(name, ExpectedVersion::Exact(v), &payload))
                    .unwrap(),
            );
        }
    }
}

fn is_live(c: &RecordedCommit) -> bool {
    !c.info.stream.starts_with("dead")
}

/// Every commit of the log: (seq, stream, version, commit id, timestamp, events).
type Full = Vec<(u64, String, u64, Uuid, i64, Vec<EventData>)>;

fn full_log(s: &Store) -> Full {
    s.scan(1)
        .unwrap()
        .map(|r| {
            let r = r.unwrap();
            (
                r.info.seq,
                r.info.stream,
                r.info.version,
                r.info.commit_id,
                r.info.timestamp_ms,
                r.events,
            )
        })
        .collect()
}

fn seg_bytes(dir: &Path) -> u64 {
    seg_files(dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .sum()
}

fn streams_of(s: &Store) -> BTreeMap<String, Vec<RecordedCommit>> {
    s.streams()
        .unwrap()
        .into_iter()
        .map(|(name, _)| {
            let rs = s.read_stream(&name, 1, usize::MAX).unwrap();
            (name, rs)
        })
        .collect()
}

#[test]
fn gc_removes_dead_streams_and_keeps_live_ones_byte_for_byte() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), gc_opts()).unwrap();
    fill(&s, 40);
    let before = full_log(&s);
    let live_before: Full = before
        .iter()
        .filter(|c| !c.1.starts_with("dead"))
        .cloned()
        .collect();
    let bytes_before = seg_bytes(dir.path());
    let last_seq = s.last_seq();

    let plan = s.plan_gc(&is_live).unwrap();
    assert!(!plan.is_empty());
    assert!(plan.dead_commits > 0 && plan.dead_bytes > 0);
    assert!(plan.reclaimed_bytes > 0, "{plan:?}");
    assert_eq!(
        plan.dead_bytes + plan.live_bytes,
        plan.segments
            .iter()
            .map(|g| g.live_bytes + g.dead_bytes)
            .sum::<u64>()
    );
    // The dead commits in the active segment stay: the plan says so.
    let dead_total = before.iter().filter(|c| c.1.starts_with("dead")).count() as u64;
    assert_eq!(plan.dead_commits + plan.kept_dead_commits, dead_total);
    assert!(plan.streams_removed.is_empty(), "active segment keeps some");

    let report = s.run_gc(plan.clone()).unwrap();
    assert_eq!(report.commits_removed, plan.dead_commits);
    assert_eq!(report.retire_pending, 0);
    assert!(!report.segments_written.is_empty());
    let max_old = report.segments_removed.iter().max().unwrap();
    assert!(report.segments_written.iter().all(|id| id > max_old));

    // Live streams read identically; the log keeps seq order with gaps only for dead.
    let after = full_log(&s);
    let after_live: Full = after
        .iter()
        .filter(|c| !c.1.starts_with("dead"))
        .cloned()
        .collect();
    assert_eq!(after_live, live_before);
    assert_eq!(
        after.len() as u64,
        before.len() as u64 - report.commits_removed
    );
    assert!(after.windows(2).all(|w| w[0].0 < w[1].0));
    assert_eq!(s.last_seq(), last_seq);
    let bytes_after = seg_bytes(dir.path());
    assert!(
        bytes_after + plan.reclaimed_bytes / 2 < bytes_before,
        "{bytes_before} -> {bytes_after}"
    );
    for name in ["live-0", "live-1", "live-2"] {
        assert_eq!(s.stream_version(name).unwrap(), Some(40));
        let rs = s.read_stream(name, 1, 1000).unwrap();
        assert_eq!(rs.len(), 40);
        for (i, r) in rs.iter().enumerate() {
            assert!(r.events[0]
                .payload
                .starts_with(format!("{name}:{}:", i + 1).as_bytes()));
        }
    }
    // Dead streams lost a prefix: their remaining versions still read.
    for name in ["dead-0", "dead-1", "dead-2"] {
        let rs = s.read_stream(name, 1, 1000).unwrap();
        assert!(rs.len() < 40 && !rs.is_empty(), "{name}: {}", rs.len());
        assert_eq!(rs.last().unwrap().info.version, 40);
        assert!(rs
            .windows(2)
            .all(|w| w[0].info.version + 1 == w[1].info.version));
    }
    let streams = streams_of(&s);
    let dump = s.index().dump().unwrap();

    // Appends continue (new segments above the GC's ids), the store reopens, verifies,
    // and a rebuilt index equals the one GC left.
    fill(&s, 3);
    let streams = {
        let mut st = streams;
        for (k, v) in streams_of(&s) {
            st.insert(k, v);
        }
        st
    };
    let dump2 = s.index().dump().unwrap();
    assert_ne!(dump, dump2);
    s.close().unwrap();
    let r = verify(dir.path(), Options::default()).unwrap();
    assert!(r.ok, "{:?}", r.errors);
    let s = Store::open(dir.path(), gc_opts()).unwrap();
    assert_eq!(streams_of(&s), streams);
    assert_eq!(s.index().dump().unwrap(), dump2);
    s.close().unwrap();
    std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    let s = Store::open(dir.path(), gc_opts().index_from_log(true)).unwrap();
    assert_eq!(s.stats().open_checkpoint_seq, None);
    assert_eq!(s.index().dump().unwrap(), dump2);
    assert_eq!(streams_of(&s), streams);
}

#[test]
fn whole_dead_streams_vanish_and_can_start_again() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), gc_opts()).unwrap();
    fill(&s, 30);
    // Push the dead streams' last commits out of the active segment.
    for i in 0..40u64 {
        let v = s.stream_version("live-0").unwrap().unwrap_or(0);
        s.append(commit("live-0", ExpectedVersion::Exact(v), &[i as u8; 200]))
            .unwrap();
    }
    let plan = s.plan_gc(&is_live).unwrap();
    assert_eq!(plan.streams_removed, vec!["dead-0", "dead-1", "dead-2"]);
    assert_eq!(plan.kept_dead_commits, 0);
    s.run_gc(plan).unwrap();
    for name in ["dead-0", "dead-1", "dead-2"] {
        assert_eq!(s.stream_version(name).unwrap(), None);
        assert!(s.read_stream(name, 1, 10).unwrap().is_empty());
    }
    assert_eq!(
        s.streams().unwrap(),
        vec![
            ("live-0".to_string(), 70),
            ("live-1".to_string(), 30),
            ("live-2".to_string(), 30)
        ]
    );
    // A removed stream starts again at version 1.
    let info = committed(
        s.append(commit("dead-1", ExpectedVersion::NoStream, b"again"))
            .unwrap(),
    );
    assert_eq!(info.version, 1);
    drop(s);
    let s = Store::open(dir.path(), gc_opts()).unwrap();
    assert_eq!(s.stream_version("dead-1").unwrap(), Some(1));
    assert_eq!(s.stream_version("dead-0").unwrap(), None);
    // A second GC over already compacted segments (removing the live-0 prefix).
    let plan = s
        .plan_gc(&|c: &RecordedCommit| !(c.info.stream == "live-0" && c.info.version <= 20))
        .unwrap();
    assert_eq!(plan.dead_commits, 20);
    s.run_gc(plan).unwrap();
    assert_eq!(s.read_stream("live-0", 1, 1000).unwrap().len(), 50);
    assert_eq!(s.read_stream("live-0", 1, 1).unwrap()[0].info.version, 21);
    s.close().unwrap();
    let r = verify(dir.path(), Options::default()).unwrap();
    assert!(r.ok, "{:?}", r.errors);
}

#[test]
fn only_a_prefix_of_each_stream_is_removed() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), gc_opts()).unwrap();
    fill(&s, 30);
    // live-1: versions 1..=5 dead, 6 live, 7..=10 dead again.
    let keep = |c: &RecordedCommit| {
        c.info.stream != "live-1" || (c.info.version == 6 || c.info.version > 10)
    };
    let plan = s.plan_gc(&keep).unwrap();
    assert_eq!(plan.dead_commits, 5);
    assert_eq!(plan.kept_dead_commits, 4);
    s.run_gc(plan).unwrap();
    let rs = s.read_stream("live-1", 1, 1000).unwrap();
    assert_eq!(rs.first().unwrap().info.version, 6);
    assert_eq!(rs.len(), 25);
    assert_eq!(s.index().stream_position("live-1", 3).unwrap(), None);
    assert!(s.index().stream_position("live-1", 6).unwrap().is_some());
    // Appending continues the stream's versions.
    let info = committed(
        s.append(commit("live-1", ExpectedVersion::Exact(30), b"next"))
            .unwrap(),
    );
    assert_eq!(info.version, 31);
    drop(s);
    let s = Store::open(dir.path(), gc_opts()).unwrap();
    assert_eq!(s.stream_version("live-1").unwrap(), Some(31));
    assert_eq!(s.read_stream("live-1", 1, 1000).unwrap().len(), 26);
}

#[test]
fn a_plan_is_refused_once_a_stream_it_removes_from_moved() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), gc_opts()).unwrap();
    fill(&s, 20);
    let before = full_log(&s);
    let plan = s.plan_gc(&is_live).unwrap();
    s.append(commit("dead-0", ExpectedVersion::Exact(20), b"moved"))
        .unwrap();
    let e = s.run_gc(plan.clone()).unwrap_err();
    assert!(matches!(e, Error::GcPlanStale(_)), "{e}");
    assert_eq!(full_log(&s).len(), before.len() + 1);
    assert!(!s.is_poisoned());
    // No leftovers of the refused attempt.
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names
        .iter()
        .all(|n| !n.ends_with(".gc") && !n.ends_with(".manifest")));
    // A fresh plan works; a plan made before another GC does not.
    let stale = s.plan_gc(&is_live).unwrap();
    let fresh = s.plan_gc(&is_live).unwrap();
    s.run_gc(fresh).unwrap();
    assert!(matches!(s.run_gc(stale), Err(Error::GcPlanStale(_))));
}

#[test]
fn a_scan_holding_retired_segments_keeps_reading_them() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), gc_opts()).unwrap();
    fill(&s, 30);
    let before = full_log(&s);
    let mut scan = s.scan(1).unwrap();
    let mut seen = Vec::new();
    for _ in 0..10 {
        seen.push(scan.next().unwrap().unwrap().info.seq);
    }
    let plan = s.plan_gc(&is_live).unwrap();
    let report = s.run_gc(plan).unwrap();
    assert!(report.retire_pending > 0);
    // The old files are still there while the scan holds them.
    for id in &report.segments_removed {
        assert!(dir.path().join(format!("{id:016x}.seg")).exists());
    }
    for r in scan.by_ref() {
        seen.push(r.unwrap().info.seq);
    }
    let all: Vec<u64> = before.iter().map(|c| c.0).collect();
    assert_eq!(seen, all, "the scan reads the log as it was");
    drop(scan);
    assert_eq!(s.retire_segments().unwrap(), 0);
    for id in &report.segments_removed {
        assert!(!dir.path().join(format!("{id:016x}.seg")).exists());
    }
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.ends_with(".manifest")), "{names:?}");
}

/// The last seq before the active (last) segment: commits up to it are sealed.
fn sealed_bound(s: &Store) -> u64 {
    let recs: Vec<RecordedCommit> = s.scan(1).unwrap().map(|r| r.unwrap()).collect();
    let last_seg = recs.iter().map(|r| r.info.position.segment).max().unwrap();
    recs.iter()
        .filter(|r| r.info.position.segment == last_seg)
        .map(|r| r.info.seq)
        .min()
        .unwrap()
        - 1
}

/// A store on `vfs` with the index in `index_dir`, filled; returns it, the full log,
/// the log a GC with [`keep_until`]`(bound)` leaves, and the bound.
fn setup(opts: Options, dir: &Path) -> (Store, Full, Full, u64) {
    let s = Store::open(dir, opts).unwrap();
    fill(&s, 12);
    let all = full_log(&s);
    let bound = sealed_bound(&s);
    let live = all
        .iter()
        .filter(|c| !c.1.starts_with("dead") || c.0 > bound)
        .cloned()
        .collect();
    (s, all, live, bound)
}

/// Dead: the `dead-*` streams' commits up to `bound` (all sealed, a prefix of each).
fn keep_until(bound: u64) -> impl Fn(&RecordedCommit) -> bool {
    move |c: &RecordedCommit| is_live(c) || c.info.seq > bound
}

fn sim_store_opts(vfs: Arc<dyn vfs::Vfs>, index_dir: &Path) -> Options {
    gc_opts().vfs(vfs).index_dir(index_dir)
}

#[test]
fn a_crash_at_every_sync_of_a_gc_leaves_the_old_or_the_new_log() {
    let mut outcomes = (0, 0);
    for seed in 0..3u64 {
        let mut n = 1;
        loop {
            let tmp = tempfile::tempdir().unwrap();
            let sim = SimVfs::new();
            let (s, all, live, bound) = setup(
                sim_store_opts(Arc::new(sim.clone()), &tmp.path().join("ix")),
                Path::new("/store"),
            );
            let plan = s.plan_gc(&keep_until(bound)).unwrap();
            assert!(!plan.is_empty());
            sim.crash_at_sync(n, seed);
            let res = s.run_gc(plan);
            let crashed = sim.crash_count() > 0;
            drop(s);
            if !crashed {
                res.unwrap();
                break;
            }
            assert!(
                res.is_err(),
                "seed {seed} sync {n}: a crashed GC reports an error"
            );
            let after = sim.after_crash();
            let opts = sim_store_opts(Arc::new(after.clone()), &tmp.path().join("ix"));
            let s = Store::open("/store", opts.clone())
                .unwrap_or_else(|e| panic!("seed {seed} sync {n}: reopen failed: {e}"));
            let got = full_log(&s);
            if got == all {
                outcomes.0 += 1;
            } else {
                assert_eq!(got, live, "seed {seed} sync {n}: neither old nor new");
                outcomes.1 += 1;
            }
            // The index agrees with the log, and the store takes writes.
            for (name, v) in s.streams().unwrap() {
                let rs = s.read_stream(&name, 1, 1000).unwrap();
                assert_eq!(rs.last().unwrap().info.version, v);
            }
            s.append(commit("live-0", ExpectedVersion::Exact(12), b"after"))
                .unwrap();
            s.close().unwrap();
            let names = after.read_dir(Path::new("/store")).unwrap();
            assert!(
                names
                    .iter()
                    .all(|n| !n.ends_with(".gc") && !n.ends_with(".manifest")),
                "seed {seed} sync {n}: leftovers {names:?}"
            );
            let r = verify("/store", opts).unwrap();
            assert!(r.ok, "seed {seed} sync {n}: {:?}", r.errors);
            n += 1;
        }
        assert!(n > 4, "the GC has several sync points");
    }
    // Both sides of the commit point were exercised.
    assert!(outcomes.0 > 0 && outcomes.1 > 0, "{outcomes:?}");
}

#[test]
fn a_fault_at_every_io_call_of_a_gc_leaves_a_consistent_store() {
    // Count the calls of one GC.
    let probe = |fault: Option<u64>| {
        let tmp = tempfile::tempdir().unwrap();
        let fv = FaultVfs::new(Arc::new(OsVfs));
        let (s, all, live, bound) = setup(gc_opts().vfs(Arc::new(fv.clone())), tmp.path());
        let plan = s.plan_gc(&keep_until(bound)).unwrap();
        fv.reset_counts();
        if let Some(k) = fault {
            fv.fail_nth(FaultKind::Any, k, false);
        }
        let res = s.run_gc(plan);
        let calls = fv.count(FaultKind::Any);
        let injected = fv.injected() > 0;
        fv.clear();
        // In the store the GC failed in, a stream read fails or gives the stream
        // as the old or the new log holds it, never a part of it.
        let versions = |log: &Full, name: &str| -> Vec<u64> {
            log.iter().filter(|c| c.1 == name).map(|c| c.2).collect()
        };
        for name in ["live-0", "dead-0", "live-1", "dead-1", "live-2", "dead-2"] {
            if let Ok(read) = s.read_stream(name, 1, 1000) {
                let read: Vec<u64> = read.iter().map(|c| c.info.version).collect();
                assert!(
                    read == versions(&all, name) || read == versions(&live, name),
                    "fault {fault:?}: {name} read as {read:?}"
                );
            }
            // The index's own scans (what the runtime's listings use) likewise.
            let prefix = format!("p/{name}");
            let scanned: Result<Vec<_>, _> =
                s.index().scan_prefix("pos", prefix.as_bytes()).collect();
            if let Ok(scanned) = scanned {
                let n = scanned.len();
                assert!(
                    n == versions(&all, name).len() || n == versions(&live, name).len(),
                    "fault {fault:?}: {name} scanned as {n} entries"
                );
            }
        }
        drop(s);
        let s = Store::open(tmp.path(), gc_opts()).unwrap();
        let got = full_log(&s);
        assert!(
            got == all || got == live,
            "fault {fault:?}: neither old nor new"
        );
        if injected {
            assert!(res.is_err(), "fault {fault:?}: an injected fault surfaces");
        } else {
            res.unwrap();
            assert_eq!(got, live);
        }
        for (name, v) in s.streams().unwrap() {
            assert_eq!(
                s.read_stream(&name, 1, 1000)
                    .unwrap()
                    .last()
                    .unwrap()
                    .info
                    .version,
                v
            );
        }
        s.close().unwrap();
        let r = verify(tmp.path(), Options::default()).unwrap();
        assert!(r.ok, "fault {fault:?}: {:?}", r.errors);
        calls
    };
    let calls = probe(None);
    assert!(calls > 10, "{calls}");
    for k in 1..=calls {
        probe(Some(k));
    }
}

#[test]
fn a_committed_but_unfinished_gc_is_seen_by_readers_and_finished_by_the_owner() {
    let tmp = tempfile::tempdir().unwrap();
    let fv = FaultVfs::new(Arc::new(OsVfs));
    let (s, _all, live, bound) = setup(gc_opts().vfs(Arc::new(fv.clone())), tmp.path());
    let plan = s.plan_gc(&keep_until(bound)).unwrap();
    // Every rename fails: the GC stops right after its commit point.
    fv.fail_nth(FaultKind::Rename, 1, true);
    assert!(s.run_gc(plan).is_err());
    assert!(s.is_poisoned());
    drop(s);
    let names = |d: &Path| {
        let mut v: Vec<String> = std::fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        v.sort();
        v
    };
    let before = names(tmp.path());
    assert!(before.iter().any(|n| n.ends_with(".manifest")));
    assert!(before.iter().any(|n| n.ends_with(".seg.gc")));
    // A read-only open and verify see the new log, and write nothing.
    let ro = Store::open_read_only(tmp.path(), gc_opts()).unwrap();
    assert_eq!(full_log(&ro), live);
    drop(ro);
    let r = verify(tmp.path(), Options::default()).unwrap();
    assert!(r.ok, "{:?}", r.errors);
    assert_eq!(names(tmp.path()), before);
    // The owner finishes it.
    let s = Store::open(tmp.path(), gc_opts()).unwrap();
    assert_eq!(full_log(&s), live);
    drop(s);
    assert!(names(tmp.path())
        .iter()
        .all(|n| !n.ends_with(".manifest") && !n.ends_with(".gc")));
}

/// A GC that moves a stream's records while `visit_stream` walks it: the visit
/// goes on from the first version it has not handed out, each version once, and
/// every commit reads as it did before the GC.
#[test]
fn visit_stream_follows_a_gc_that_moves_the_stream_it_visits() {
    use std::ops::ControlFlow;
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), gc_opts()).unwrap();
    fill(&s, 40);
    let before = s.read_stream("live-0", 1, usize::MAX).unwrap();
    let mut plan = Some(s.plan_gc(&is_live).unwrap());
    let mut seen = Vec::new();
    s.visit_stream("live-0", 1, usize::MAX, |c| {
        seen.push(c.to_owned());
        if c.version == 5 {
            if let Some(p) = plan.take() {
                s.run_gc(p).unwrap();
            }
        }
        ControlFlow::Continue(())
    })
    .unwrap();
    assert!(plan.is_none(), "the GC ran during the visit");
    let after = s.read_stream("live-0", 1, usize::MAX).unwrap();
    let moved = before
        .iter()
        .zip(&after)
        .filter(|(b, a)| b.info.position != a.info.position)
        .count();
    assert!(moved > 30, "the GC moved the stream's records: {moved}");
    let content = |c: &RecordedCommit| (c.info.version, c.info.commit_id, c.events.clone());
    assert_eq!(
        seen.iter().map(content).collect::<Vec<_>>(),
        before.iter().map(content).collect::<Vec<_>>()
    );
}

/// Appends `stream`'s next version: a 120-byte payload naming the stream and version.
fn append_named(s: &Store, stream: &str) -> CommitInfo {
    let v = s.stream_version(stream).unwrap().unwrap_or(0);
    let mut payload = format!("{stream}:{}:", v + 1).into_bytes();
    payload.resize(120, 0);
    committed(
        s.append(commit(stream, ExpectedVersion::Exact(v), &payload))
            .unwrap(),
    )
}

/// `rounds` times: 60 commits of the dead stream `dead-0`, then a GC that drops
/// them, rebuilding the index under whoever reads it.
fn gc_rounds(s: &Store, rounds: u32) {
    for _ in 0..rounds {
        for _ in 0..60 {
            append_named(s, "dead-0");
        }
        let plan = s.plan_gc(&is_live).unwrap();
        s.run_gc(plan).unwrap();
    }
}

/// Clears its flag when dropped (when the thread holding it ends, even by a panic).
struct Stop(Arc<std::sync::atomic::AtomicBool>);

impl Drop for Stop {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// A GC on another thread (dropping other streams' commits, so the index is
/// rebuilt under the readers) never makes `visit_stream` or `read_stream` hand
/// out less than the whole stream, a stream with gaps, or an error, nor
/// `stream_version`, `streams` or `commit_by_id` miss what the stream holds: a
/// read made while the index was rebuilt is made again.
#[test]
fn stream_reads_beside_a_gc_on_another_thread_see_the_whole_stream() {
    use std::ops::ControlFlow;
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(Store::open(dir.path(), gc_opts()).unwrap());
    const VERSIONS: u64 = 300;
    let infos: Vec<_> = (0..VERSIONS).map(|_| append_named(&s, "long")).collect();
    let gc_running = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let gc = {
        let s = s.clone();
        let gc_running = gc_running.clone();
        std::thread::spawn(move || {
            let _done = Stop(gc_running);
            gc_rounds(&s, 40);
        })
    };
    // The cheap reads on a thread of their own, in a tight loop: the visits
    // below wait for each GC to end, and a commit-id lookup takes the writer
    // lock a GC holds, so reads made after them rarely overlap a rebuild.
    let quick = {
        let s = s.clone();
        let gc_running = gc_running.clone();
        std::thread::spawn(move || {
            let mut probes = 0usize;
            loop {
                let running = gc_running.load(std::sync::atomic::Ordering::Acquire);
                let head = s.stream_version("long").unwrap();
                assert_eq!(head, Some(VERSIONS), "head, probe {probes}");
                let streams = s.streams().unwrap();
                assert!(
                    streams.contains(&("long".to_string(), VERSIONS)),
                    "streams, probe {probes}: {streams:?}"
                );
                probes += 1;
                if !running {
                    return probes;
                }
            }
        })
    };
    let want: Vec<u64> = (1..=VERSIONS).collect();
    let mut reads = 0u64;
    while !gc.is_finished() {
        let mut seen = Vec::new();
        s.visit_stream("long", 1, usize::MAX, |c| {
            seen.push(c.version);
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(seen, want, "visit {reads}");
        let read: Vec<u64> = s
            .read_stream("long", 1, usize::MAX)
            .unwrap()
            .iter()
            .map(|c| c.info.version)
            .collect();
        assert_eq!(read, want, "read {reads}");
        let probe = &infos[(reads as usize * 97) % infos.len()];
        let found = s.commit_by_id(probe.commit_id).unwrap();
        assert_eq!(found.map(|c| c.version), Some(probe.version), "id {reads}");
        reads += 1;
    }
    gc.join().unwrap();
    quick.join().unwrap();
    assert!(reads > 0);
}

/// The index's public reads (`Store::index()`, as the runtime's header, listing and
/// transcript reads use it) beside GCs on another thread: never an answer from a part-
/// rebuilt index. Each probe reads a stream's count entry, scans and visits its
/// per-version entries, and reads its head and the stream list.
#[test]
fn index_reads_beside_a_gc_on_another_thread_see_every_entry() {
    let dir = tempfile::tempdir().unwrap();
    let s = Arc::new(Store::open(dir.path(), gc_opts()).unwrap());
    const VERSIONS: u64 = 300;
    for _ in 0..VERSIONS {
        append_named(&s, "long");
    }
    let gc = {
        let s = s.clone();
        std::thread::spawn(move || {
            gc_rounds(&s, 40);
        })
    };
    let mut probes = 0u64;
    loop {
        let running = !gc.is_finished();
        let ix = s.index();
        let count = ix.get("pos", b"n/long").unwrap();
        assert_eq!(
            count,
            Some(VERSIONS.to_be_bytes().to_vec()),
            "get, probe {probes}"
        );
        let with = ix
            .get_with("pos", b"n/long", |v| v.map(<[u8]>::len))
            .unwrap();
        assert_eq!(with, Some(8), "get_with, probe {probes}");
        // The scan and the visit pause half way, so that GCs begin in the middle of
        // them: each must go on from where it was, in the rebuilt index.
        let mut scan = ix.scan_prefix("pos", b"p/long");
        let mut keys: Vec<Vec<u8>> = scan.by_ref().take(150).map(|kv| kv.unwrap().0).collect();
        std::thread::sleep(std::time::Duration::from_micros(300));
        keys.extend(scan.map(|kv| kv.unwrap().0));
        let want: Vec<Vec<u8>> = (1..=VERSIONS)
            .map(|v| [&b"p/long"[..], &v.to_be_bytes()].concat())
            .collect();
        assert_eq!(keys, want, "scan, probe {probes}");
        let mut visited = Vec::new();
        ix.visit_prefix("pos", b"p/long", |k, _| {
            if visited.len() == 150 {
                std::thread::sleep(std::time::Duration::from_micros(300));
            }
            visited.push(k.to_vec());
            true
        })
        .unwrap();
        assert_eq!(visited, want, "visit, probe {probes}");
        let head = ix.stream_head("long").unwrap().map(|h| h.version);
        assert_eq!(head, Some(VERSIONS), "head, probe {probes}");
        let streams = ix.streams().unwrap();
        assert!(
            streams.contains(&("long".to_string(), VERSIONS)),
            "streams, probe {probes}: {streams:?}"
        );
        probes += 1;
        if !running {
            break;
        }
    }
    gc.join().unwrap();
    assert!(probes > 1);
}

/// A GC's rebuild drops the index's cache, large values (files) and small (sled)
/// alike, and an entry in the cache directory that cannot be removed (here a
/// directory) fails neither the GC nor a later open: the cache is disposable.
#[test]
fn a_gc_drops_the_cache_even_an_entry_that_cannot_be_removed() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s = Store::open(dir, gc_opts()).unwrap();
    fill(&s, 30);
    s.index()
        .put_cache("snap", b"large", &vec![7u8; 20 << 10])
        .unwrap();
    s.index().put_cache("snap", b"small", b"v").unwrap();
    let cache_dir = dir.join(INDEX_DIR).join("cache");
    std::fs::create_dir(cache_dir.join("stray")).unwrap();
    std::fs::write(cache_dir.join("stray").join("f"), b"x").unwrap();
    let plan = s.plan_gc(&is_live).unwrap();
    assert!(!plan.segments.is_empty());
    s.run_gc(plan).unwrap();
    assert!(!s.is_poisoned());
    for key in [&b"large"[..], b"small"] {
        assert_eq!(s.index().get_cache("snap", key).unwrap(), None);
    }
    assert_eq!(s.index().scan_cache_prefix("snap", b"").count(), 0);
    assert!(cache_dir.is_dir() && !cache_dir.join("stray").exists());
    s.index()
        .put_cache("snap", b"large", &vec![8u8; 20 << 10])
        .unwrap();
    s.close().unwrap();
    let s = Store::open(dir, gc_opts()).unwrap();
    assert_eq!(
        s.index().get_cache("snap", b"large").unwrap(),
        Some(vec![8u8; 20 << 10])
    );
    s.close().unwrap();
}
