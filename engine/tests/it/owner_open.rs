//! The owner's open from a checkpoint: with a checkpoint the log backs and a sled
//! index holding at least its commits, only the log after the checkpoint's record is
//! read, and everything answers as after an open that reads the whole log. An index
//! that holds fewer commits than the checkpoint, or none, or whose base checkpoint is
//! gone, is replaced by the checkpoint; a checkpoint or an index that does not fit
//! otherwise means the whole log.

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
/// of the index of step `index` (a new one: `None`) with the checkpoint it is a delta
/// over (its own step's); the copy's index directory.
fn arrange(st: &Steps, to: &Path, ck: Option<usize>, index: Option<usize>) -> PathBuf {
    copy_dir(&st.dir, to, &[CHECKPOINT_DIR, "LOCK"]);
    let cdir = to.join(CHECKPOINT_DIR);
    for i in ck.into_iter().chain(index) {
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
    // An index over an older checkpoint than the newest (each index is a delta over
    // its own step's checkpoint): the newest is its base, the tail after it is read.
    // An index behind the newest checkpoint: the checkpoint replaces it.
    // Index and checkpoint at the end of the log: nothing decoded.
    for (ck, index) in [(1, 2), (0, 1), (0, 2), (2, 2), (1, 1), (2, 0), (2, 1)] {
        let ctx = format!("checkpoint of step {ck}, index of step {index}");
        let from = ck.max(index);
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let ix = arrange(&st, &dir, Some(ck), Some(index));
        let s = Store::open(&dir, owner_opts(&ix)).unwrap();
        let stats = s.stats();
        assert_eq!(stats.open_checkpoint_seq, Some(st.seqs[from]), "{ctx}");
        assert_eq!(stats.open_checkpoint_fallback, None, "{ctx}");
        assert_eq!(stats.open_records_decoded, last - st.seqs[from], "{ctx}");
        let want = rebuilt(&dir);
        assert_eq!(answers(&s).unwrap(), want, "{ctx}");
        assert_eq!(s.last_seq(), last, "{ctx}");

        // An owner of a copy without checkpoints reads the whole log: the same
        // answers, and the same outcomes for the next appends.
        let full_dir = tmp.path().join("full");
        let full_ix = arrange(&st, &full_dir, None, None);
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

    // No index at all: the newest checkpoint is its base (no fallback).
    let dir = fresh();
    let ix = arrange(&st, &dir, Some(1), None);
    let s = Store::open(&dir, owner_opts(&ix)).unwrap();
    assert_eq!(s.stats().open_checkpoint_seq, Some(st.seqs[1]));
    assert_eq!(s.stats().open_checkpoint_fallback, None);
    assert_eq!(answers(&s).unwrap(), rebuilt(&dir), "no index");
    drop(s);

    // A damaged checkpoint (the index's base).
    let dir = fresh();
    let ix = arrange(&st, &dir, Some(1), Some(2));
    let ck = checkpoints(&dir).pop().unwrap();
    let mut b = std::fs::read(&ck).unwrap();
    b[30] ^= 1;
    std::fs::write(&ck, &b).unwrap();
    check_fallback(&dir, &ix, &ck.to_string_lossy(), "damaged checkpoint");

    // A checkpoint of another store (its record is not in this log).
    let dir = fresh();
    let ix = arrange(&st, &dir, None, None);
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

    // The index of another history, with its base checkpoint, of a higher seq than
    // this store's (the open resumes from neither) or of the same (it replaces this
    // store's): the whole log, and the index rebuilt.
    for other_n in [420, 300] {
        let dir = fresh();
        let ix = arrange(&st, &dir, Some(0), None);
        let other = fresh();
        let other_ix = other.with_extension("index");
        let s = Store::open(&other, owner_opts(&other_ix)).unwrap();
        workload(&s, &mut Rng(99), other_n);
        s.close().unwrap();
        copy_dir(&other_ix, &ix, &[]);
        let other_ck = checkpoints(&other).pop().unwrap();
        std::fs::copy(
            &other_ck,
            dir.join(CHECKPOINT_DIR).join(other_ck.file_name().unwrap()),
        )
        .unwrap();
        check_fallback(
            &dir,
            &ix,
            "",
            &format!("index of another history ({other_n})"),
        );
    }
    // The same index without its base: it is dropped, this store's checkpoint
    // becomes the base of a new one, and the drop is reported.
    let dir = fresh();
    let ix = arrange(&st, &dir, Some(0), None);
    let other = fresh();
    let other_ix = other.with_extension("index");
    let s = Store::open(&other, owner_opts(&other_ix)).unwrap();
    workload(&s, &mut Rng(99), 420);
    s.close().unwrap();
    copy_dir(&other_ix, &ix, &[]);
    let s = Store::open(&dir, owner_opts(&ix)).unwrap();
    let why = s.stats().open_checkpoint_fallback.clone().unwrap();
    assert!(why.contains("base checkpoint"), "{why}");
    assert_eq!(s.stats().open_checkpoint_seq, Some(st.seqs[0]));
    assert_eq!(
        answers(&s).unwrap(),
        rebuilt(&dir),
        "index without its base"
    );
    drop(s);

    // Entries lost from the index after its base (as a move into sled cut short
    // could leave them): the last version of stream s0 shorter than the base's.
    let dir = fresh();
    let ix = arrange(&st, &dir, Some(0), Some(2));
    {
        let base = checkpoints(&dir).pop().unwrap();
        let ro = Store::open_read_only(&dir, opts()).unwrap();
        assert_eq!(ro.stats().open_checkpoint_seq, Some(st.seqs[2]), "{base:?}");
        let key = b"\x01v\x02s0\0\0\0\0\0\0\0\0";
        let (_, block) = ro
            .index()
            .entries()
            .map(Result::unwrap)
            .find(|(k, _)| k == key)
            .unwrap();
        drop(ro);
        let db = open_sled(&ix.join(INDEX_SLED_DIR));
        let mut tagged = vec![0u8];
        tagged.extend_from_slice(&block[..block.len() - 40]);
        db.insert(key, tagged).unwrap();
        db.flush().unwrap();
    }
    check_fallback(
        &dir,
        &ix,
        "lacks version entries",
        "entries lost after the base",
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
    assert_eq!(s.stats().open_checkpoint_seq, Some(st.seqs[2]));
    assert_eq!(s.stats().open_records_decoded, 0);
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

/// A store in `tmp` with `n` commits of the workload seeded `seed`, closed; its
/// directory and last seq.
fn closed_store(tmp: &tempfile::TempDir, seed: u64, n: u64) -> (PathBuf, u64) {
    let dir = tmp.path().join("store");
    let s = Store::open(&dir, opts()).unwrap();
    workload(&s, &mut Rng(seed), n);
    let last = s.last_seq();
    s.close().unwrap();
    (dir, last)
}

/// The entries of the sled in the index directory `ix` that are not its meta keys
/// (first byte 0), and the names of its trees.
fn delta_entries(ix: &Path) -> usize {
    let db = open_sled(&ix.join(INDEX_SLED_DIR));
    db.iter()
        .map(Result::unwrap)
        .filter(|(k, _)| k.first() != Some(&0))
        .count()
}

/// A clean close makes the checkpoint it writes the base of a new, empty sled: the
/// next owner open reads nothing of the log, its sled holds no entry, one checkpoint
/// is left, and everything answers as a rebuild; again after more commits, and the
/// cache's small values stay.
#[test]
fn a_clean_close_makes_its_checkpoint_the_base_of_an_empty_index() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("store");
    let mut rng = Rng(0xba5e);
    for round in 0..3u64 {
        let s = Store::open(&dir, opts()).unwrap();
        if round > 0 {
            assert_eq!(s.stats().open_records_decoded, 0, "round {round}");
            assert_eq!(s.stats().open_checkpoint_fallback, None, "round {round}");
            assert_eq!(
                s.index().get_cache("snap", b"k").unwrap(),
                Some(round.to_be_bytes().to_vec()),
                "round {round}: the cache kept"
            );
        }
        workload(&s, &mut rng, 150 + 100 * round);
        s.index()
            .put_cache("snap", b"k", &(round + 1).to_be_bytes())
            .unwrap();
        let last = s.last_seq();
        s.close().unwrap();
        assert_eq!(delta_entries(&dir.join(INDEX_DIR)), 0, "round {round}");
        let cks = checkpoints(&dir);
        assert_eq!(cks.len(), 1, "round {round}: {cks:?}");
        let s = Store::open(&dir, opts()).unwrap();
        assert_eq!(s.stats().open_checkpoint_seq, Some(last), "round {round}");
        assert_eq!(answers(&s).unwrap(), rebuilt(&dir), "round {round}");
        s.close().unwrap();
    }
}

/// A close cut between its steps: the next sled half built, or the directories half
/// swapped (no sled at all). The open removes what is left over, takes the newest
/// checkpoint as its base, reads nothing of the log, and answers as a rebuild.
#[test]
fn a_close_cut_while_it_replaces_sled_loses_nothing() {
    for cut in ["next built", "current moved away"] {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, last) = closed_store(&tmp, 0xc07, 300);
        let ix = dir.join(INDEX_DIR);
        match cut {
            "next built" => copy_dir(&ix.join(INDEX_SLED_DIR), &ix.join("delta.next"), &[]),
            _ => std::fs::rename(ix.join(INDEX_SLED_DIR), ix.join("delta.old")).unwrap(),
        }
        let s = Store::open(&dir, opts()).unwrap();
        assert_eq!(s.stats().open_checkpoint_seq, Some(last), "{cut}");
        assert_eq!(s.stats().open_records_decoded, 0, "{cut}");
        assert_eq!(answers(&s).unwrap(), rebuilt(&dir), "{cut}");
        assert!(!ix.join("delta.next").exists(), "{cut}");
        assert!(!ix.join("delta.old").exists(), "{cut}");
        workload(&s, &mut Rng(0xc08), 50);
        let got = answers(&s).unwrap();
        s.close().unwrap();
        assert_eq!(got, rebuilt(&dir), "{cut}");
    }
}

/// The checkpoints an owner writes in the background never remove the one its sled
/// is a delta over (the next open needs it); the close's removes it once it is the
/// next base.
#[test]
fn background_checkpoints_keep_the_base_of_the_index() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, _) = closed_store(&tmp, 0xb0, 200);
    let base = checkpoints(&dir).pop().unwrap();
    let s = Store::open(&dir, opts().checkpoint_commits_min(1)).unwrap();
    for i in 0..12_000u64 {
        let stream = format!("s{}", i % 7);
        committed(append_next(&s, &stream, ev(b"x")));
    }
    s.flush().unwrap();
    assert!(s.stats().checkpoints_written > 0, "{:?}", s.stats());
    let cks = checkpoints(&dir);
    assert!(cks.contains(&base), "{cks:?}");
    assert!(cks.len() >= 2, "{cks:?}");
    let got = answers(&s).unwrap();
    s.close().unwrap();
    assert_eq!(checkpoints(&dir).len(), 1);
    assert_eq!(got, rebuilt(&dir));
}

/// An index in the layout before sled became a delta (sled's files directly in the
/// index directory) is replaced: the newest checkpoint becomes the base of a new one.
#[test]
fn an_index_of_the_layout_before_deltas_is_replaced_by_the_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, last) = closed_store(&tmp, 0x01d, 300);
    let ix = dir.join(INDEX_DIR);
    for e in std::fs::read_dir(ix.join(INDEX_SLED_DIR)).unwrap() {
        let e = e.unwrap();
        std::fs::rename(e.path(), ix.join(e.file_name())).unwrap();
    }
    std::fs::remove_dir(ix.join(INDEX_SLED_DIR)).unwrap();
    let s = Store::open(&dir, opts()).unwrap();
    assert_eq!(s.stats().open_checkpoint_seq, Some(last));
    assert_eq!(s.stats().open_records_decoded, 0);
    assert_eq!(answers(&s).unwrap(), rebuilt(&dir));
    drop(s);
    assert!(!ix.join("db").exists() && !ix.join("conf").exists());
}

/// A closed store whose base checkpoint has a flipped bit in a data block; its
/// directory and the checkpoint's path.
fn base_with_a_flipped_block_bit(tmp: &tempfile::TempDir) -> (PathBuf, PathBuf) {
    let (dir, _) = closed_store(tmp, 0xb17, 600);
    let ck = checkpoints(&dir).pop().unwrap();
    let mut bytes = std::fs::read(&ck).unwrap();
    let at = 400 + (bytes.len() - 1000) / 2;
    bytes[at] ^= 0x10;
    std::fs::write(&ck, &bytes).unwrap();
    (dir, ck)
}

/// A flipped bit in a data block of the base (which an open does not read): the
/// owner's reads that reach the block fail, naming the file, and the base is set
/// aside, so that the next owner open starts from the log (or another checkpoint)
/// and answers as a rebuild.
#[test]
fn a_damaged_block_of_the_base_fails_its_reads_and_the_next_open_recovers() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, ck) = base_with_a_flipped_block_bit(&tmp);
    let s = Store::open(&dir, opts()).unwrap();
    let e = answers(&s).expect_err("a read of the damaged block");
    assert!(e.to_string().contains(&*ck.to_string_lossy()), "{e}");
    drop(s);
    assert!(!ck.exists());
    let mut aside = ck.clone().into_os_string();
    aside.push(".damaged");
    assert!(Path::new(&aside).exists());
    let s = Store::open(&dir, opts()).unwrap();
    assert!(
        s.stats().open_checkpoint_fallback.is_some(),
        "{:?}",
        s.stats()
    );
    assert_eq!(answers(&s).unwrap(), rebuilt(&dir));
    workload(&s, &mut Rng(0xb18), 50);
    let got = answers(&s).unwrap();
    s.close().unwrap();
    assert_eq!(got, rebuilt(&dir));
}

/// A close whose checkpoint a background one already wrote (nothing applied since)
/// still makes it the base of an empty sled.
#[test]
fn a_close_after_a_background_checkpoint_of_everything_rebases_on_it() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, _) = closed_store(&tmp, 0xbac, 100);
    let s = Store::open(&dir, opts().checkpoint_commits_min(1)).unwrap();
    // Past a memtable's move bound: the move writes a checkpoint of everything.
    for i in 0..4096u64 {
        committed(append_next(&s, &format!("s{}", i % 5), ev(b"x")));
    }
    let last = s.last_seq();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !checkpoints(&dir)
        .iter()
        .any(|p| p.ends_with(format!("{last:016x}.ckpt")))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "no background checkpoint"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    s.close().unwrap();
    assert_eq!(delta_entries(&dir.join(INDEX_DIR)), 0);
    let s = Store::open(&dir, opts()).unwrap();
    assert_eq!(s.stats().open_checkpoint_seq, Some(last));
    assert_eq!(s.stats().open_records_decoded, 0);
    assert_eq!(answers(&s).unwrap(), rebuilt(&dir));
}

/// A closed store whose index went wrong (an entry that is not what the log says)
/// and whose last close wrote that into its checkpoint; its directory and last seq.
fn wrong_index_in_its_checkpoint(tmp: &tempfile::TempDir) -> (PathBuf, u64) {
    let (dir, _) = closed_store(tmp, 0x7a3, 200);
    {
        let db = open_sled(&dir.join(INDEX_DIR).join(INDEX_SLED_DIR));
        db.insert(&b"\x02\x02kvk/s1/0"[..], &b"\0planted"[..])
            .unwrap();
        db.flush().unwrap();
    }
    let _ = std::fs::remove_file(dir.join(INDEX_DIR).join("keys.filter"));
    let s = Store::open(&dir, opts()).unwrap();
    workload(&s, &mut Rng(0x7a4), 1);
    let last = s.last_seq();
    s.close().unwrap();
    (dir, last)
}

/// An index rebuilt from the log (`index_from_log`, what `spool replay` does) is
/// never rebased at its close on a checkpoint written from the old index: the close
/// writes its own, and the rebuilt index keeps answering as the log.
#[test]
fn a_rebuild_from_the_log_is_not_rebased_on_a_checkpoint_of_the_old_index() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, _) = wrong_index_in_its_checkpoint(&tmp);
    let want = rebuilt(&dir);
    let fresh = tmp.path().join("rebuilt-index");
    let s = Store::open(&dir, opts().index_dir(fresh.clone()).index_from_log(true)).unwrap();
    assert_eq!(answers(&s).unwrap(), want, "the rebuild answers as the log");
    s.close().unwrap();
    let s = Store::open(&dir, opts().index_dir(fresh.clone())).unwrap();
    let got = s.index().get("kv", b"k/s1/0").unwrap();
    assert_ne!(
        got.as_deref(),
        Some(&b"planted"[..]),
        "the old index's entry came back"
    );
    assert_eq!(
        answers(&s).unwrap(),
        want,
        "the rebuilt index after its close"
    );
    drop(s);
    // Readers use the checkpoint of the rebuilt index too.
    let ro = Store::open_read_only(&dir, opts()).unwrap();
    assert!(ro.stats().open_checkpoint_seq.is_some());
    assert_eq!(answers(&ro).unwrap(), want, "a reader after the rebuild");
}

/// `verify` (no lock, a private copy of the index over the store's base) reports a
/// damaged block of the base and never renames the store's checkpoint.
#[test]
fn verify_never_sets_the_stores_base_aside() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, ck) = base_with_a_flipped_block_bit(&tmp);
    let r = verify(&dir, opts()).unwrap();
    assert!(ck.exists(), "verify renamed {}", ck.display());
    assert!(!r.ok, "{r:?}");
}

/// Drops the first ten versions of stream s0 by GC.
fn gc_s0_prefix(s: &Store) {
    let plan = s
        .plan_gc(&|c: &RecordedCommit| !(c.info.stream == "s0" && c.info.version <= 10))
        .unwrap();
    let report = s.run_gc(plan).unwrap();
    assert!(!report.segments_written.is_empty(), "{report:?}");
}

/// An owner that resumed from its base, or wrote a background checkpoint, runs a GC
/// and closes without a commit in between: the close writes a checkpoint of the new
/// log layout, which readers and the next owner open use.
#[test]
fn a_close_after_a_gc_leaves_a_checkpoint_of_the_new_layout() {
    for background in [false, true] {
        let tmp = tempfile::tempdir().unwrap();
        let (dir, last) = closed_store(&tmp, 0x6c1, 600);
        let s = Store::open(&dir, opts().checkpoint_commits_min(1)).unwrap();
        assert_eq!(s.stats().open_checkpoint_seq, Some(last));
        if background {
            let written = s.stats().checkpoints_written;
            for i in 0..4096u64 {
                committed(append_next(&s, &format!("s{}", i % 5), ev(b"x")));
            }
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            while s.stats().checkpoints_written == written {
                assert!(
                    std::time::Instant::now() < deadline,
                    "no background checkpoint"
                );
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
        gc_s0_prefix(&s);
        s.close().unwrap();
        let want = rebuilt(&dir);
        let ro = Store::open_read_only(&dir, opts()).unwrap();
        assert!(ro.stats().open_checkpoint_seq.is_some(), "{:?}", ro.stats());
        assert_eq!(answers(&ro).unwrap(), want, "background {background}");
        drop(ro);
        let s = Store::open(&dir, opts()).unwrap();
        assert_eq!(s.stats().open_records_decoded, 0, "background {background}");
        assert_eq!(answers(&s).unwrap(), want, "background {background}");
    }
}

/// A rebuild from the log (what `spool replay` does) whose close cannot write its
/// checkpoint (a directory in the way of its temporary file, as a full disk would
/// fail it) leaves no checkpoint of the old index for readers, and the next close
/// that can writes the rebuilt index's.
#[test]
fn a_rebuild_whose_close_cannot_write_leaves_readers_no_checkpoint_of_the_old_index() {
    let tmp = tempfile::tempdir().unwrap();
    let (dir, last) = wrong_index_in_its_checkpoint(&tmp);
    let want = rebuilt(&dir);
    let fresh = tmp.path().join("rebuilt-index");
    let obstacle = dir
        .join(CHECKPOINT_DIR)
        .join(format!("{last:016x}.ckpt.tmp"));
    std::fs::create_dir_all(obstacle.join("x")).unwrap();
    let s = Store::open(&dir, opts().index_dir(fresh.clone()).index_from_log(true)).unwrap();
    assert_eq!(answers(&s).unwrap(), want, "the rebuild answers as the log");
    s.close().unwrap();
    let ro = Store::open_read_only(&dir, opts()).unwrap();
    assert_eq!(
        answers(&ro).unwrap(),
        want,
        "a reader after the failed write"
    );
    drop(ro);
    std::fs::remove_dir_all(&obstacle).unwrap();
    let s = Store::open(&dir, opts().index_dir(fresh.clone())).unwrap();
    assert_eq!(answers(&s).unwrap(), want, "the owner");
    s.close().unwrap();
    let ro = Store::open_read_only(&dir, opts()).unwrap();
    assert!(ro.stats().open_checkpoint_seq.is_some(), "{:?}", ro.stats());
    assert_eq!(answers(&ro).unwrap(), want, "a reader after the next close");
}
