//! The owner's open from a checkpoint: with a checkpoint the log backs and a sled
//! index holding at least its commits, only the log after the checkpoint's record is
//! read, and everything answers as after an open that reads the whole log; anything
//! that does not fit (the checkpoint or the index) means the whole log.

use crate::checkpoint::{answers, checkpoints, copy_dir, opts, rebuilt, workload, Answers, Rng};
use crate::common::*;
use spool_engine::*;
use std::path::{Path, PathBuf};
use uuid::Uuid;

/// A store built in three closed steps (300, 550 and 750 commits), its sled index
/// kept outside the store directory, with copies of the checkpoint and of the index
/// each close left.
struct Steps {
    _tmp: tempfile::TempDir,
    dir: PathBuf,
    /// Per step: the checkpoint file's name and bytes, and a copy of the index.
    cks: Vec<(std::ffi::OsString, Vec<u8>)>,
    indexes: Vec<PathBuf>,
    seqs: Vec<u64>,
}

fn owner_opts(index: &Path) -> Options {
    opts().index_dir(index.to_path_buf())
}

fn steps() -> Steps {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let index = tmp.path().join("index");
    let mut rng = Rng(0x0e1e);
    let mut st = Steps {
        dir: dir.clone(),
        _tmp: tmp,
        cks: Vec::new(),
        indexes: Vec::new(),
        seqs: Vec::new(),
    };
    for (i, n) in [300, 250, 200].into_iter().enumerate() {
        let s = Store::open(&dir, owner_opts(&index)).unwrap();
        workload(&s, &mut rng, n);
        let seq = s.last_seq();
        s.close().unwrap();
        let ck = checkpoints(&dir).pop().unwrap();
        st.cks
            .push((ck.file_name().unwrap().into(), std::fs::read(&ck).unwrap()));
        let copy = st._tmp.path().join(format!("index-{i}"));
        copy_dir(&index, &copy, &[]);
        st.indexes.push(copy);
        st.seqs.push(seq);
    }
    st
}

/// A copy of the store with the checkpoint of step `ck` (none: `None`) and a copy
/// of the index of step `index` (a new one: `None`); the copy's index directory.
fn arrange(st: &Steps, to: &Path, ck: Option<usize>, index: Option<usize>) -> PathBuf {
    copy_dir(&st.dir, to, &[CHECKPOINT_DIR, "LOCK"]);
    if let Some(i) = ck {
        let cdir = to.join(CHECKPOINT_DIR);
        std::fs::create_dir_all(&cdir).unwrap();
        std::fs::write(cdir.join(&st.cks[i].0), &st.cks[i].1).unwrap();
    }
    let ix = to.with_extension("index");
    if let Some(i) = index {
        copy_dir(&st.indexes[i], &ix, &[]);
    }
    ix
}

/// Appends one commit to each of 14 streams (two of them new) at their heads, a
/// stale one that must conflict, and more on the same streams (all with fixed ids):
/// the outcomes, without their times.
fn next_appends(s: &Store) -> Vec<String> {
    let mut out = Vec::new();
    for i in 0..56u128 {
        let stream = format!("s{}", i % 14);
        let head = s.stream_version(&stream).unwrap();
        let o = s
            .append(NewCommit {
                stream: stream.clone(),
                expected: ExpectedVersion::Exact(head.unwrap_or(0)),
                commit_id: Uuid::from_u128(0xabc0 + i),
                events: ev(stream.as_bytes()),
            })
            .unwrap();
        let c = committed(o);
        assert_eq!(c.version, head.unwrap_or(0) + 1, "{stream}");
        out.push(format!(
            "{} {} {} {:?} {}",
            c.stream, c.version, c.seq, c.position, c.commit_id
        ));
        if let Some(h) = head {
            let o = s
                .append(commit(&stream, ExpectedVersion::Exact(h), b"stale"))
                .unwrap();
            assert!(matches!(o, AppendOutcome::Conflict { .. }), "{o:?}");
            out.push(format!("{o:?}"));
        }
    }
    out
}

#[test]
fn an_owner_open_from_a_checkpoint_reads_only_the_tail_and_answers_as_the_whole_log() {
    let st = steps();
    let last = st.seqs[2];
    // The index at the end of the log, the checkpoint at the close before: the tail
    // between them is checked against the index, nothing applied.
    // The index in between: the rest of the tail is applied to it.
    // Index and checkpoint at the same record: nothing decoded.
    for (ck, index) in [(1, 2), (0, 1), (0, 2), (2, 2), (1, 1)] {
        let ctx = format!("checkpoint of step {ck}, index of step {index}");
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let ix = arrange(&st, &dir, Some(ck), Some(index));
        let s = Store::open(&dir, owner_opts(&ix)).unwrap();
        let stats = s.stats();
        assert_eq!(stats.open_checkpoint_seq, Some(st.seqs[ck]), "{ctx}");
        assert_eq!(stats.open_checkpoint_fallback, None, "{ctx}");
        assert_eq!(stats.open_records_decoded, last - st.seqs[ck], "{ctx}");
        let want = rebuilt(&dir);
        assert_eq!(answers(&s).unwrap(), want, "{ctx}");
        assert_eq!(s.last_seq(), last, "{ctx}");

        // An owner of a copy without checkpoints reads the whole log: the same
        // answers, and the same outcomes for the next appends.
        let full_dir = tmp.path().join("full");
        let full_ix = arrange(&st, &full_dir, None, Some(index));
        let full = Store::open(&full_dir, owner_opts(&full_ix)).unwrap();
        assert_eq!(full.stats().open_records_decoded, last, "{ctx}");
        assert_eq!(full.stats().open_checkpoint_seq, None, "{ctx}");
        assert_eq!(answers(&full).unwrap(), want, "{ctx}");
        assert_eq!(next_appends(&s), next_appends(&full), "{ctx}");
        let got = answers(&s).unwrap();
        assert_eq!(got, answers(&full).unwrap(), "{ctx}");
        s.close().unwrap();
        full.close().unwrap();
        assert_eq!(rebuilt(&dir), got, "{ctx}");
        // The close wrote a checkpoint of everything: the next open reads nothing.
        let s = Store::open(&dir, owner_opts(&ix)).unwrap();
        assert_eq!(s.stats().open_checkpoint_seq, Some(got.last_seq), "{ctx}");
        assert_eq!(s.stats().open_records_decoded, 0, "{ctx}");
        assert_eq!(answers(&s).unwrap(), got, "{ctx}");
    }
}

/// What an open of `dir` with the index `ix` must give when it cannot resume: the
/// whole log read (plus, when it resumed first, the tail), the answers of a rebuild.
fn check_fallback(dir: &Path, ix: &Path, want_reason: &str, ctx: &str) -> Answers {
    let want = rebuilt(dir);
    let s = Store::open(dir, owner_opts(ix)).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    let stats = s.stats();
    assert_eq!(stats.open_checkpoint_seq, None, "{ctx}");
    let why = stats
        .open_checkpoint_fallback
        .clone()
        .unwrap_or_else(|| panic!("{ctx}: no fallback"));
    assert!(why.contains(want_reason), "{ctx}: {why}");
    assert!(
        stats.open_records_decoded >= want.last_seq,
        "{ctx}: {stats:?}"
    );
    let got = answers(&s).unwrap();
    assert_eq!(got, want, "{ctx}");
    got
}

#[test]
fn an_owner_open_falls_back_to_the_whole_log_when_checkpoint_or_index_do_not_fit() {
    let st = steps();
    let tmp = tempfile::tempdir().unwrap();
    let n = std::sync::atomic::AtomicU32::new(0);
    let fresh = || {
        tmp.path().join(format!(
            "s{}",
            n.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ))
    };

    // The index behind the checkpoint (an older copy, or none at all).
    let dir = fresh();
    let ix = arrange(&st, &dir, Some(2), Some(0));
    check_fallback(&dir, &ix, "before the checkpoint", "index behind");
    let dir = fresh();
    let ix = arrange(&st, &dir, Some(1), None);
    check_fallback(&dir, &ix, "before the checkpoint", "no index");

    // A damaged checkpoint.
    let dir = fresh();
    let ix = arrange(&st, &dir, Some(1), Some(2));
    let ck = checkpoints(&dir).pop().unwrap();
    let mut b = std::fs::read(&ck).unwrap();
    b[30] ^= 1;
    std::fs::write(&ck, &b).unwrap();
    check_fallback(&dir, &ix, &ck.to_string_lossy(), "damaged checkpoint");

    // A checkpoint of another store (its record is not in this log).
    let dir = fresh();
    let ix = arrange(&st, &dir, None, Some(2));
    let other = tmp.path().join("other");
    let s = Store::open(&other, opts()).unwrap();
    workload(&s, &mut Rng(12), 500);
    s.close().unwrap();
    let foreign = checkpoints(&other).pop().unwrap();
    let planted = dir.join(CHECKPOINT_DIR).join(foreign.file_name().unwrap());
    std::fs::create_dir_all(planted.parent().unwrap()).unwrap();
    std::fs::copy(&foreign, &planted).unwrap();
    check_fallback(&dir, &ix, &planted.to_string_lossy(), "foreign checkpoint");
    // The open removed it; the close wrote this store's own.
    let cks = checkpoints(&dir);
    assert_eq!(cks.len(), 1, "{cks:?}");
    assert_ne!(cks[0], planted);

    // A checkpoint ahead of the log: the log cut back inside a record of the last
    // step (with a new index, which holds no evidence of those commits).
    let dir = fresh();
    let ix = arrange(&st, &dir, Some(2), None);
    let last = seg_files(&dir).pop().unwrap();
    let b = std::fs::read(&last).unwrap();
    let end = b.iter().rposition(|x| *x != 0).unwrap();
    std::fs::write(&last, &b[..end - 3]).unwrap();
    let got = check_fallback(&dir, &ix, "", "checkpoint ahead of the log");
    assert!(got.last_seq < st.seqs[2]);

    // The index of another history: its version entries are not the checkpoint's,
    // or its applied marker names another commit at the checkpoint's seq.
    for (other_n, what) in [(420, "lacks version entries"), (300, "another commit")] {
        let dir = fresh();
        let ix = arrange(&st, &dir, Some(0), None);
        let other = fresh();
        let other_ix = other.with_extension("index");
        let s = Store::open(&other, owner_opts(&other_ix)).unwrap();
        workload(&s, &mut Rng(99), other_n);
        s.close().unwrap();
        copy_dir(&other_ix, &ix, &[]);
        check_fallback(
            &dir,
            &ix,
            what,
            &format!("index of another history ({other_n})"),
        );
    }

    // Entries lost from the index after the checkpoint (as a move into sled cut short
    // could leave them): the last version of stream s0, found in the tail.
    let dir = fresh();
    let ix = arrange(&st, &dir, Some(0), Some(2));
    {
        let db = sled::open(&ix).unwrap();
        let key = b"\x01v\x02s0\0\0\0\0\0\0\0\0";
        let block = db.get(key).unwrap().unwrap();
        db.insert(key, &block[..block.len() - 40]).unwrap();
        db.flush().unwrap();
    }
    check_fallback(
        &dir,
        &ix,
        "the index disagrees",
        "entries lost after the checkpoint",
    );
}

#[test]
fn a_retry_of_a_commit_before_the_checkpoint_is_recognised_after_an_owner_open_from_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), opts()).unwrap();
    let mut early = Vec::new();
    for i in 0..200u128 {
        let stream = format!("r{}", i % 5);
        let v = s.stream_version(&stream).unwrap().unwrap_or(0);
        let o = s
            .append(NewCommit {
                stream,
                expected: ExpectedVersion::Exact(v),
                commit_id: Uuid::from_u128(0x5000 + i),
                events: ev(&i.to_be_bytes()),
            })
            .unwrap();
        early.push(committed(o));
    }
    workload(&s, &mut Rng(4), 100);
    s.close().unwrap();
    let retry = |s: &Store, info: &CommitInfo, stream: &str| {
        s.append(NewCommit {
            stream: stream.into(),
            expected: ExpectedVersion::Any,
            commit_id: info.commit_id,
            events: ev(b"again"),
        })
    };

    // Appends with ids the store draws need no old ids; a lookup by id comes first.
    let s = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(s.stats().open_records_decoded, 0);
    assert!(s.stats().open_checkpoint_seq.is_some());
    committed(
        s.append_fresh("r0", ExpectedVersion::Any, ev(b"fresh"))
            .unwrap(),
    );
    assert_eq!(
        s.commit_by_id(early[7].commit_id).unwrap(),
        Some(early[7].clone())
    );
    assert_eq!(s.commit_by_id(Uuid::from_u128(0x4fff)).unwrap(), None);
    match retry(&s, &early[3], &early[3].stream).unwrap() {
        AppendOutcome::AlreadyCommitted(i) => assert_eq!(i, early[3]),
        o => panic!("{o:?}"),
    }
    s.close().unwrap();

    // A retry comes first.
    let s = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(s.stats().open_records_decoded, 0);
    let last = s.last_seq();
    match retry(&s, &early[0], &early[0].stream).unwrap() {
        AppendOutcome::AlreadyCommitted(i) => assert_eq!(i, early[0]),
        o => panic!("{o:?}"),
    }
    // On another stream it is refused.
    let other = if early[1].stream == "r0" { "r1" } else { "r0" };
    assert!(matches!(
        retry(&s, &early[1], other),
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(s.last_seq(), last, "nothing written");
    assert_eq!(
        s.commit_by_id(early[199].commit_id).unwrap(),
        Some(early[199].clone())
    );
    // A new caller-chosen id still commits.
    committed(
        s.append(NewCommit {
            stream: "r0".into(),
            expected: ExpectedVersion::Any,
            commit_id: Uuid::from_u128(0x9999),
            events: ev(b"new"),
        })
        .unwrap(),
    );
    drop(s);

    // A read-only open (from the checkpoint) finds old commits by id too.
    let ro = Store::open_read_only(dir.path(), opts()).unwrap();
    assert_eq!(
        ro.commit_by_id(early[5].commit_id).unwrap(),
        Some(early[5].clone())
    );
    assert!(ro.commit_by_id(Uuid::from_u128(0x9999)).unwrap().is_some());
    assert_eq!(ro.commit_by_id(Uuid::from_u128(0x4fff)).unwrap(), None);
}

#[test]
fn a_torn_tail_after_the_checkpoint_is_repaired_by_an_owner_open_from_it() {
    let st = steps();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let ix = arrange(&st, &dir, Some(1), Some(2));
    // A write in flight at a crash: part of a frame after the last record.
    let last = seg_files(&dir).pop().unwrap();
    let mut b = std::fs::read(&last).unwrap();
    let end = b.iter().rposition(|x| *x != 0).unwrap() + 1;
    let torn = [0x51u8, 0, 0, 0, 0xde, 0xad, 0xbe, 0xef, 1, 2, 3];
    b[end..end + torn.len()].copy_from_slice(&torn);
    std::fs::write(&last, &b).unwrap();
    let s = Store::open(&dir, owner_opts(&ix)).unwrap();
    assert_eq!(s.stats().open_checkpoint_seq, Some(st.seqs[1]));
    assert_eq!(s.stats().open_records_decoded, st.seqs[2] - st.seqs[1]);
    assert_eq!(s.last_seq(), st.seqs[2]);
    // Zeroed on disk.
    let after = std::fs::read(&last).unwrap();
    assert!(after[end..end + torn.len()].iter().all(|x| *x == 0));
    let info = committed(append_next(&s, "s1", ev(b"after the tear")));
    assert_eq!(info.seq, st.seqs[2] + 1);
    let got = answers(&s).unwrap();
    s.close().unwrap();
    assert_eq!(rebuilt(&dir), got);
    let r = verify(&dir, opts()).unwrap();
    assert!(r.ok && r.torn_tail_bytes == 0, "{r:?}");
}

#[test]
fn an_owner_open_from_a_checkpoint_does_not_read_the_segments_before_it() {
    let st = steps();
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let ix = arrange(&st, &dir, Some(2), Some(2));
    // A flipped payload byte in the first segment, long before the checkpoint's
    // record: the open never reads it (verify, which reads the whole log, does).
    let first = seg_files(&dir).remove(0);
    let mut b = std::fs::read(&first).unwrap();
    b[200] ^= 0x20;
    std::fs::write(&first, &b).unwrap();
    let s = Store::open(&dir, owner_opts(&ix)).unwrap();
    assert_eq!(s.stats().open_checkpoint_seq, Some(st.seqs[2]));
    assert_eq!(s.stats().open_records_decoded, 0);
    drop(s);
    let r = verify(&dir, owner_opts(&ix)).unwrap();
    assert!(!r.ok, "{r:?}");
}
