//! A bulk load (`Options::index_bulk_load`): the owner's index spills full memtables
//! to sorted runs beside sled instead of moving them into it, and the clean close's
//! checkpoint of everything becomes sled's next base. It answers as the whole log
//! while it runs and after; a crash in the middle (the runs lost with the process)
//! costs the next open a read of the log after sled's mark, never an answer.

use crate::checkpoint::{answers, copy_dir, opts, rebuilt, workload, Rng};
use spool_engine::*;
use std::path::Path;

/// The runs the bulk load keeps in `dir`'s index directory.
fn runs(dir: &Path) -> usize {
    match std::fs::read_dir(dir.join(INDEX_DIR).join("spill")) {
        Ok(rd) => rd.count(),
        Err(_) => 0,
    }
}

/// A bulk load of 20 rounds of 40 commits onto a closed store of 300, each round
/// spilled (so that runs are merged): every round answers as a rebuild from the
/// log; the close leaves no run, and the next open reads none of the log, its sled
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
        let last = s.last_seq();
        let got = answers(&s).unwrap();
        s.close().unwrap();
        assert_eq!(runs(&dir), 0, "load {load}: no run outlives the close");
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
/// the load, and answers as a rebuild; so does a bulk load opened on it.
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
        assert_eq!(runs(&cut), 0, "bulk {bulk}: the open removes the runs");
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
