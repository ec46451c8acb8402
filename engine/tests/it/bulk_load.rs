//! A bulk load (`Options::index_bulk_load`): the owner's index spills full memtables
//! to sorted runs beside sled instead of moving them into it, and the clean close's
//! checkpoint of everything becomes sled's next base. It answers as the whole log
//! while it runs and after; a crash in the middle (the runs lost with the process)
//! costs the next open a read of the log after sled's mark, never an answer.

use crate::checkpoint::{answers, copy_dir, opts, rebuilt, workload, Rng};
use spool_engine::vfs::{FaultKind, FaultVfs, OsVfs};
use spool_engine::*;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// The runs the bulk load keeps in `dir`'s index directory.
fn runs(dir: &Path) -> usize {
    match std::fs::read_dir(dir.join(INDEX_DIR).join("spill")) {
        Ok(rd) => rd.count(),
        Err(_) => 0,
    }
}

/// `dir` and every file in it are the owner's alone, as everything the store creates.
fn assert_owner_only(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(dir) & 0o077, 0, "{}", dir.display());
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        assert_eq!(mode(&p) & 0o077, 0, "{}", p.display());
    }
}

/// A bulk load of 20 rounds of 40 commits onto a closed store of 300, each round
/// spilled (so that runs are merged), its runs owner-only: every round answers as a
/// rebuild from the log; the close leaves no run, and the next open reads none of the log, its sled
/// empty over the close's checkpoint, and answers the same. A second bulk load over
/// that base does too.
#[test]
fn a_bulk_load_answers_as_the_whole_log_while_it_runs_and_after() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let s = Store::open(&dir, opts()).unwrap();
    workload(&s, &mut Rng(0xb01c), 300);
    s.close().unwrap();
    for load in 0..2u64 {
        let s = Store::open(&dir, opts().index_bulk_load(true)).unwrap();
        let mut rng = Rng(0xb01d + load);
        for round in 0..20 {
            workload(&s, &mut rng, 40);
            s.flush_index().unwrap();
            if round % 7 == 6 {
                assert_eq!(
                    answers(&s).unwrap(),
                    rebuilt(&dir),
                    "load {load} round {round}"
                );
            }
        }
        assert!(runs(&dir) > 0, "load {load}: the memtables went to runs");
        assert_owner_only(&dir.join(INDEX_DIR).join("spill"));
        let last = s.last_seq();
        let got = answers(&s).unwrap();
        s.close().unwrap();
        assert_eq!(runs(&dir), 0, "load {load}: no run outlives the close");
        // The next sled's meta keys are the load's (read through its runs), not
        // those sled held before it.
        let ix = Index::open_existing(&dir.join(INDEX_DIR), &dir, INDEX_CACHE_BYTES_MAX)
            .unwrap()
            .unwrap();
        assert_eq!(ix.applied_seq().unwrap(), last, "load {load}");
        drop(ix);
        let s = Store::open(&dir, opts()).unwrap();
        assert_eq!(s.stats().open_checkpoint_seq, Some(last), "load {load}");
        assert_eq!(s.stats().open_records_decoded, 0, "load {load}");
        assert_eq!(answers(&s).unwrap(), got, "load {load}");
        s.close().unwrap();
        assert_eq!(got, rebuilt(&dir), "load {load}");
    }
}

/// A bulk load cut by a crash (a copy of the store taken while it runs, runs and
/// all): the next open removes the runs, reads the log after what sled held before
/// the load, and answers as a rebuild; so does a bulk load opened on it, which
/// spills what it reads into a run of its own.
#[test]
fn a_bulk_load_cut_by_a_crash_is_read_from_the_log_again() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let s = Store::open(&dir, opts()).unwrap();
    workload(&s, &mut Rng(0xc0c0), 200);
    s.close().unwrap();
    let s = Store::open(&dir, opts().index_bulk_load(true)).unwrap();
    let mut rng = Rng(0xc0c1);
    for _ in 0..10 {
        workload(&s, &mut rng, 30);
        s.flush_index().unwrap();
    }
    for bulk in [false, true] {
        let cut = tmp.path().join(format!("cut-{bulk}"));
        copy_dir(&dir, &cut, &["LOCK"]);
        assert!(runs(&cut) > 0);
        let c = Store::open(&cut, opts().index_bulk_load(bulk)).unwrap();
        // The open removes the load's runs; a bulk open spills its own catch-up.
        assert_eq!(runs(&cut), usize::from(bulk), "bulk {bulk}");
        assert_eq!(c.stats().open_records_decoded, 300, "bulk {bulk}");
        assert_eq!(answers(&c).unwrap(), rebuilt(&cut), "bulk {bulk}");
        workload(&c, &mut Rng(0xc0c2), 50);
        c.flush_index().unwrap();
        let got = answers(&c).unwrap();
        c.close().unwrap();
        assert_eq!(got, rebuilt(&cut), "bulk {bulk}");
    }
    s.close().unwrap();
}

/// Memtables spilled by the write path on the index's thread (12,000 buffered
/// commits, no `flush_index`), merged while a reader reads every stream's head, and
/// background checkpoints written from the runs: a crash copy opens from the newest
/// such checkpoint and answers as a rebuild; the clean close answers the same and
/// leaves nothing to read from the log.
#[test]
fn a_bulk_load_spills_and_checkpoints_in_the_background() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let o = || {
        opts()
            .segment_bytes_max(1 << 20)
            .durability(Durability::Buffered)
            .checkpoint_commits_min(4096)
    };
    let s = Store::open(&dir, o()).unwrap();
    workload(&s, &mut Rng(0xb0b0), 300);
    s.close().unwrap();
    let s = Arc::new(Store::open(&dir, o().index_bulk_load(true)).unwrap());
    let stop = Arc::new(AtomicBool::new(false));
    let reader = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                for k in 0..12 {
                    let stream = format!("s{k}");
                    if let Some(h) = s.index().stream_head(&stream).unwrap() {
                        let v = s.stream_version(&stream).unwrap().unwrap();
                        assert!(v >= h.version, "{stream}: head {} after {v}", h.version);
                    }
                }
            }
        })
    };
    let mut rng = Rng(0xb0b1);
    for _ in 0..3 {
        workload(&s, &mut rng, 4000);
    }
    stop.store(true, Ordering::Relaxed);
    reader.join().unwrap();
    assert!(runs(&dir) > 0);
    assert!(s.stats().checkpoints_written > 0, "{:?}", s.stats());
    let got = answers(&s).unwrap();
    assert_eq!(got, rebuilt(&dir), "while it runs");
    s.flush().unwrap();
    let cut = tmp.path().join("cut");
    copy_dir(&dir, &cut, &["LOCK"]);
    let c = Store::open(&cut, o()).unwrap();
    assert!(c.stats().open_checkpoint_seq > Some(300), "{:?}", c.stats());
    assert_eq!(answers(&c).unwrap(), got, "the crash copy");
    c.close().unwrap();
    let s = Arc::try_unwrap(s).ok().unwrap();
    s.close().unwrap();
    let s = Store::open(&dir, o()).unwrap();
    assert_eq!(s.stats().open_records_decoded, 0);
    assert_eq!(answers(&s).unwrap(), got, "reopened");
    s.close().unwrap();
}

/// A GC during a bulk load rebuilds the index, runs and all: it answers as a rebuild
/// after the GC, after more commits, and after a reopen.
#[test]
fn a_gc_during_a_bulk_load_rebuilds_its_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let s = Store::open(&dir, opts()).unwrap();
    workload(&s, &mut Rng(0x6c), 300);
    s.close().unwrap();
    let s = Store::open(&dir, opts().index_bulk_load(true)).unwrap();
    let mut rng = Rng(0x6d);
    let mut rounds = |s: &Store| {
        for _ in 0..5 {
            workload(s, &mut rng, 40);
            s.flush_index().unwrap();
        }
    };
    rounds(&s);
    let plan = s
        .plan_gc(&|c: &RecordedCommit| c.info.stream != "s3" || c.info.version > 10)
        .unwrap();
    s.run_gc(plan).unwrap();
    assert_eq!(answers(&s).unwrap(), rebuilt(&dir), "after the GC");
    rounds(&s);
    let got = answers(&s).unwrap();
    assert_eq!(got, rebuilt(&dir), "after the GC and more");
    s.close().unwrap();
    let s = Store::open(&dir, opts()).unwrap();
    assert_eq!(answers(&s).unwrap(), got, "reopened");
    s.close().unwrap();
}

/// A bulk load whose close cannot write its checkpoint (a write, a sync or the
/// rename fails): no run is left, and the next read-only and owner opens answer as
/// before the close, from the log.
#[test]
fn a_bulk_load_whose_close_cannot_checkpoint_loses_nothing() {
    for kind in [FaultKind::Write, FaultKind::Sync, FaultKind::Rename] {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let fault = FaultVfs::new(Arc::new(OsVfs));
        let o = || opts().vfs(Arc::new(fault.clone()));
        let s = Store::open(&dir, o()).unwrap();
        workload(&s, &mut Rng(0xfa), 300);
        s.close().unwrap();
        let s = Store::open(&dir, o().index_bulk_load(true)).unwrap();
        let mut rng = Rng(0xfb);
        for _ in 0..10 {
            workload(&s, &mut rng, 30);
            s.flush_index().unwrap();
        }
        let want = answers(&s).unwrap();
        fault.reset_counts();
        fault.fail_nth(kind, 1, true);
        let _ = s.close();
        fault.clear();
        assert_eq!(runs(&dir), 0, "{kind:?}");
        let ro = Store::open_read_only(&dir, o()).unwrap();
        assert_eq!(answers(&ro).unwrap(), want, "{kind:?}: read-only");
        drop(ro);
        let s = Store::open(&dir, o()).unwrap();
        assert_eq!(answers(&s).unwrap(), want, "{kind:?}: owner");
        s.close().unwrap();
    }
}
