use super::{
    prefix_end, with_joined, Index, IndexBatch, IndexError, Indexer, JOINED_KEY_STACK_BYTES,
    MEM_BYTES_MOVE, MEM_COMMITS_MAX, MEM_COMMITS_MOVE,
};
use crate::checkpoint::CheckpointFile;
use crate::types::{CommitInfo, ExpectedVersion, LogPosition, RecordedCommit};
use crate::vfs::OsVfs;
use std::sync::Arc;

thread_local! {
    /// Makes the next open of an index on this thread panic inside its sled section,
    /// as sled 0.34 does on some damaged files.
    pub(super) static PANIC_IN_SLED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// sled panics on some damaged index files instead of returning an error; the store's
/// open and verify went down with it. A panic while opening the index is caught at the
/// index's boundary: the index is wiped and built again (empty, to be caught up from the
/// log), and nothing of the damaged one is served.
#[test]
fn a_panic_inside_sled_while_opening_wipes_and_rebuilds_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index");
    let (index, fresh) = Index::open(Some(&path), Vec::new()).unwrap();
    assert!(fresh);
    apply_commits(&index, 10, 0);
    index.flush().unwrap();
    drop(index);
    let (index, fresh) = Index::open(Some(&path), Vec::new()).unwrap();
    assert!(!fresh);
    assert_eq!(index.applied_seq().unwrap(), 10);
    drop(index);
    PANIC_IN_SLED.with(|p| p.set(true));
    let (index, fresh) = Index::open(Some(&path), Vec::new()).unwrap();
    assert!(fresh, "a damaged index must be rebuilt");
    assert_eq!(index.applied_seq().unwrap(), 0);
    assert_eq!(index.stream_head("s").unwrap(), None);
    drop(index);
    PANIC_IN_SLED.with(|p| p.set(true));
    let existing = Index::open_existing(&path, &path, crate::INDEX_CACHE_BYTES_MAX);
    assert!(
        existing.is_err(),
        "verify's open reports the panic as an error"
    );
}

/// Rewrites one key with a 64 KiB value on every commit, as the transcript indexer
/// rewrites the last block of the active path on every append.
struct OneBigKey;

impl Indexer for OneBigKey {
    fn name(&self) -> &'static str {
        "one-big-key"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        batch.insert(b"k", &vec![c.info.seq as u8; 64 << 10]);
        Ok(())
    }
}

/// Found by reading the memtable's accounting: a key rewritten by every commit
/// counted its whole value each time, so the memtable moved into sled long
/// before it held `MEM_BYTES_MOVE` bytes.
#[test]
fn a_rewritten_key_counts_its_value_once_in_the_memtable() {
    let (index, _) = Index::open(None, vec![Arc::new(OneBigKey)]).unwrap();
    // 256 commits × 64 KiB = 16 MiB written, twice the memtable's move bound.
    for seq in 1..=256u64 {
        index.apply(&[commit_to("s", seq, seq)]).unwrap();
        let bytes = index.mem_bytes();
        // The value once, plus the stream's head and version block (~40 bytes per
        // version); counting every rewrite would pass 128 KiB at the second commit.
        assert!(bytes < (80 << 10), "commit {seq}: {bytes} bytes counted");
    }
    assert!(index.mem_bytes() < MEM_BYTES_MOVE);
}

/// Appends each commit's seq to one value: in place when the group being
/// prepared wrote it already (as the transcript indexer extends a path block),
/// else read and written whole. A key it writes and removes is not pending.
#[derive(Default)]
struct Growing {
    in_place: std::sync::atomic::AtomicU64,
}

impl Indexer for Growing {
    fn name(&self) -> &'static str {
        "growing"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let seq = c.info.seq as u8;
        match batch.pending_mut(b"grow") {
            Some(v) => {
                v.push(seq);
                self.in_place
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            None => {
                let mut v = batch.get(b"grow")?.unwrap_or_default();
                v.push(seq);
                batch.insert_vec(b"grow", v);
            }
        }
        batch.insert(b"gone", b"x");
        batch.remove(b"gone");
        assert!(batch.pending_mut(b"gone").is_none());
        Ok(())
    }
}

/// A value a group of commits wrote changes in place for the group's later
/// commits, and is published as changed; the next group reads it whole.
#[test]
fn a_pending_value_changes_in_place_within_its_group_only() {
    let growing = Arc::new(Growing::default());
    let (index, _) = Index::open(None, vec![growing.clone()]).unwrap();
    index.apply(&[commit(1), commit(2), commit(3)]).unwrap();
    index.apply(&[commit(4)]).unwrap();
    assert_eq!(
        index.get("growing", b"grow").unwrap(),
        Some(vec![1, 2, 3, 4])
    );
    assert_eq!(index.get("growing", b"gone").unwrap(), None);
    // Commits 2 and 3 in place; 1 and 4 each began a group.
    let in_place = growing.in_place.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!(in_place, 2);
}

/// A key per commit, `c/<seq>`, holding the seq.
struct KeyPerCommit;

impl Indexer for KeyPerCommit {
    fn name(&self) -> &'static str {
        "key-per-commit"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let seq = c.info.seq;
        batch.insert(format!("c/{seq:08}").as_bytes(), &seq.to_be_bytes());
        Ok(())
    }
}

/// While a move into sled runs, the memtable takes commits past the move bound
/// instead of waiting for it, and waits for it only at `MEM_COMMITS_MAX`. Every
/// commit stays readable throughout, from sled, the frozen memtable or the live one.
#[test]
fn the_memtable_grows_while_a_move_runs_and_waits_for_it_only_at_its_bound() {
    let dir = tempfile::tempdir().unwrap();
    let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(KeyPerCommit)]).unwrap();
    let index = Arc::new(index);
    let (step, max) = (MEM_COMMITS_MOVE as u64, MEM_COMMITS_MAX as u64);
    let readable = |index: &Index, seqs: std::ops::RangeInclusive<u64>| {
        for seq in seqs {
            let v = index
                .get("key-per-commit", format!("c/{seq:08}").as_bytes())
                .unwrap();
            assert_eq!(v, Some(seq.to_be_bytes().to_vec()), "seq {seq}");
        }
    };
    // Opens the gate however the test ends: a failed assertion with the move held
    // would otherwise hang in the index's drop, which joins the move.
    struct OpenOnDrop(Arc<super::MoveGate>);
    impl Drop for OpenOnDrop {
        fn drop(&mut self) {
            self.0.set_closed(false);
        }
    }
    let _open = OpenOnDrop(index.move_gate.clone());
    index.move_gate.set_closed(true);
    // No move runs yet: the first freeze comes at the move bound, and its move is
    // held at its start.
    for seq in 1..=step {
        index.apply(&[commit(seq)]).unwrap();
    }
    assert_eq!(index.mem_commits_for_tests(), 0);
    // The next memtable grows past the move bound, up to one commit short of the
    // bound, without waiting (on another thread, so that a wait fails the test
    // instead of hanging it).
    let last = step + max - 1;
    let (done, finished) = std::sync::mpsc::channel();
    let applier = {
        let index = index.clone();
        std::thread::spawn(move || {
            for seq in step + 1..=last {
                index.apply(&[commit(seq)]).unwrap();
            }
            done.send(()).unwrap();
        })
    };
    let waited = finished
        .recv_timeout(std::time::Duration::from_secs(120))
        .is_err();
    index.move_gate.set_closed(!waited);
    assert!(!waited, "an apply below the bound waited for the held move");
    applier.join().unwrap();
    assert_eq!(index.mem_commits_for_tests(), (max - 1) as usize);
    assert_eq!(
        index.mem_is_empty_for_tests(),
        None,
        "the move is still held"
    );
    readable(&index, 1..=last);
    // At the bound, the apply waits for the move, then freezes all `max` commits.
    index.move_gate.set_closed(false);
    index.apply(&[commit(last + 1)]).unwrap();
    assert_eq!(index.mem_commits_for_tests(), 0);
    readable(&index, 1..=last + 1);
    index.flush_mem().unwrap();
    assert_eq!(index.mem_is_empty_for_tests(), Some(true));
    readable(&index, 1..=last + 1);
}

/// Per commit: a key of its own, a rewrite of one shared key, and the removal of
/// the key of the commit three before: a move holds inserts, rewrites and removes.
struct Churn;

impl Indexer for Churn {
    fn name(&self) -> &'static str {
        "churn"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let seq = c.info.seq;
        batch.insert(format!("c/{seq:06}").as_bytes(), &seq.to_be_bytes());
        batch.insert(b"last", &vec![seq as u8; 300]);
        if seq > 3 {
            batch.remove(format!("c/{:06}", seq - 3).as_bytes());
        }
        Ok(())
    }
}

/// Commit `seq` of the log, version `version` of `stream`, without events.
fn commit_to(stream: &str, version: u64, seq: u64) -> RecordedCommit {
    RecordedCommit {
        info: CommitInfo {
            stream: stream.into(),
            version,
            seq,
            position: LogPosition {
                segment: 1,
                offset: seq * 100,
            },
            timestamp_ms: 0,
            commit_id: uuid::Uuid::from_u128(u128::from(seq)),
        },
        expected: ExpectedVersion::Any,
        events: Vec::new(),
        record_bytes: 100,
    }
}

/// Commit `seq` of three streams taking turns.
fn commit(seq: u64) -> RecordedCommit {
    commit_to(&format!("s{}", seq % 3), seq.div_ceil(3), seq)
}

/// Applies commits `1..=n` to `index`, moving the memtable into sled after
/// `move_after` of them.
fn apply_commits(index: &Index, n: u64, move_after: u64) {
    for seq in 1..=n {
        index.apply(&[commit(seq)]).unwrap();
        if seq == move_after {
            index.flush_mem().unwrap();
        }
    }
}

/// The index of commits `1..=n`, moved into sled after `first` of them and at the
/// end; its entries.
fn whole_index(dir: &std::path::Path, first: u64, n: u64) -> Vec<super::KeyValue> {
    let (index, created) = Index::open(Some(dir), vec![Arc::new(Churn)]).unwrap();
    assert!(created);
    apply_commits(&index, n, first);
    index.flush().unwrap();
    index.dump().unwrap()
}

/// A crash inside a move into sled, at every point from before its first write to
/// after its last (the marker still there): the next open finishes the move from
/// the redo log and finds exactly the index of a move that was never cut. Before
/// the crash, a dump already is that index (a dump that kept the move's marker made
/// `losing_the_memtable_is_caught_up_from_the_log` fail when its dump overlapped
/// the background move).
#[test]
fn a_move_cut_short_is_finished_from_the_redo_log_on_open() {
    let want = whole_index(tempfile::tempdir().unwrap().path(), 40, 100);
    // The second move: 60 commits, a key each, less the 57 removed, plus `last`
    // and the engine's keys (heads, version blocks, the applied marker).
    for cut in [0, 1, 2, 7, 30, 60, 10_000] {
        let dir = tempfile::tempdir().unwrap();
        {
            let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
            apply_commits(&index, 100, 40);
            index.cut_move_for_tests(cut);
            assert!(index.sled_moving_for_tests(), "cut {cut}");
            // Mid-move (the frozen memtable still in front of sled), a dump is
            // the whole index: the move's marker is not an entry.
            assert_eq!(index.dump().unwrap(), want, "cut {cut}: mid-move dump");
        }
        let (index, created) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
        assert!(!created, "cut {cut}: the index was rebuilt, not finished");
        assert!(!index.sled_moving_for_tests(), "cut {cut}");
        assert_eq!(index.applied_seq().unwrap(), 100, "cut {cut}");
        assert_eq!(index.dump().unwrap(), want, "cut {cut}");
        let redo = dir.path().join(crate::index::redo::REDO_FILE);
        assert_eq!(std::fs::metadata(&redo).unwrap().len(), 0, "cut {cut}");
    }
}

/// A move cut short whose redo record is gone (a power loss that kept sled's pages
/// but not the redo log's) or damaged: the index cannot be trusted, and opening it
/// starts it empty for a rebuild instead of serving keys of two states.
#[test]
fn a_move_cut_short_without_its_record_empties_the_index() {
    for damage in ["missing", "flipped"] {
        let dir = tempfile::tempdir().unwrap();
        {
            let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
            apply_commits(&index, 50, 0);
            index.cut_move_for_tests(5);
        }
        let redo = dir.path().join(crate::index::redo::REDO_FILE);
        let mut bytes = std::fs::read(&redo).unwrap();
        assert!(bytes.len() > 100, "{damage}");
        match damage {
            "missing" => bytes.clear(),
            _ => {
                let mid = bytes.len() / 2;
                bytes[mid] ^= 0x40;
            }
        }
        std::fs::write(&redo, &bytes).unwrap();
        let (index, created) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
        assert!(created, "{damage}: the index was kept");
        assert_eq!(index.applied_seq().unwrap(), 0, "{damage}");
        assert!(!index.sled_moving_for_tests(), "{damage}");
    }
}

/// Every finished move leaves no marker, and a flush empties the redo log.
#[test]
fn whole_moves_leave_no_marker_and_a_flush_empties_the_redo_log() {
    let dir = tempfile::tempdir().unwrap();
    let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
    for seq in 1..=30 {
        index.apply(&[commit(seq)]).unwrap();
        index.flush_mem().unwrap();
        assert!(!index.sled_moving_for_tests(), "seq {seq}");
    }
    let redo = dir.path().join(crate::index::redo::REDO_FILE);
    assert!(std::fs::metadata(&redo).unwrap().len() > 0);
    index.flush().unwrap();
    assert_eq!(std::fs::metadata(&redo).unwrap().len(), 0);
}

/// The change mark moves with every publish and with a clear, and only
/// then: a move into sled, a flush and reads leave it where it was. Two
/// opens never share marks.
#[test]
fn the_change_mark_moves_with_every_publish_and_clear_and_only_then() {
    let dir = tempfile::tempdir().unwrap();
    let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
    let mut mark = index.change_mark();
    assert!(mark.is_settled());
    for seq in 1..=20 {
        index.apply(&[commit(seq)]).unwrap();
        let now = index.change_mark();
        assert_ne!(now, mark, "seq {seq}: a publish moves the mark");
        assert!(now.is_settled(), "seq {seq}");
        mark = now;
        if seq % 5 == 0 {
            index.flush_mem().unwrap();
            assert_eq!(index.change_mark(), mark, "seq {seq}: a move into sled");
        }
        assert!(index.get("churn", b"last").unwrap().is_some());
        assert_eq!(index.applied_seq().unwrap(), seq);
        assert_eq!(index.change_mark(), mark, "seq {seq}: reads");
    }
    index.flush().unwrap();
    assert_eq!(index.change_mark(), mark, "a flush");
    // An empty group publishes nothing.
    index.apply(&[]).unwrap();
    assert_eq!(index.change_mark(), mark, "an empty group");
    index.clear(0).unwrap();
    let cleared = index.change_mark();
    assert_ne!(cleared, mark, "a clear moves the mark");
    assert!(cleared.is_settled(), "a finished clear is settled");
    let (other, _) = Index::open(None, vec![Arc::new(Churn)]).unwrap();
    assert_ne!(
        other.change_mark(),
        Index::open(None, vec![]).unwrap().0.change_mark()
    );
    assert_ne!(other.change_mark(), cleared);
}

#[test]
fn joined_keys_are_the_concatenation_on_and_off_the_stack() {
    for n in [
        0,
        1,
        JOINED_KEY_STACK_BYTES - 3,
        JOINED_KEY_STACK_BYTES + 1,
        1000,
    ] {
        let a = vec![1u8; 3];
        let b: Vec<u8> = (0..n).map(|i| i as u8).collect();
        let want = [a.as_slice(), b.as_slice()].concat();
        assert_eq!(with_joined(&[&a, &b], |k| k.to_vec()), want, "n={n}");
        assert_eq!(with_joined(&[&b, &[], &a], |k| k.len()), n + 3);
    }
}

#[test]
fn prefix_end_is_the_least_key_after_the_prefix() {
    assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
    assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
    assert_eq!(prefix_end(b"\x01\xff\xff"), Some(b"\x02".to_vec()));
    assert_eq!(prefix_end(b"\xff\xff"), None);
    assert_eq!(prefix_end(b""), None);
}

/// The key filter saved at a clean close spares the next open its scan of sled, but
/// only beside the sled state it was saved with: a file of an earlier state (one whose
/// removal a crash undid) or a damaged one is refused and the open scans. A used
/// filter that missed keys written since would answer "absent" for them. The file is
/// removed by every open.
#[test]
fn a_saved_key_filter_is_used_only_beside_the_state_it_was_saved_with() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index");
    let file = path.join(super::key_file::KEY_FILTER_FILE);
    let open = || {
        Index::open(Some(&path), vec![Arc::new(KeyPerCommit)])
            .unwrap()
            .0
    };
    let scanned = |ix: &Index| ix.key_scan.lock().unwrap().is_some();
    let readable = |ix: &Index, n: u64| {
        for seq in 1..=n {
            let v = ix
                .get("key-per-commit", format!("c/{seq:08}").as_bytes())
                .unwrap();
            assert_eq!(v, Some(seq.to_be_bytes().to_vec()), "seq {seq}");
        }
        let never = ix.get("key-per-commit", b"c/99999999").unwrap();
        assert_eq!(never, None);
    };
    let save_when_complete = |ix: &Index| {
        let t0 = std::time::Instant::now();
        while !ix.keys.read().unwrap().complete {
            assert!(t0.elapsed().as_secs() < 60, "the key scan never ended");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        ix.flush().unwrap();
        assert!(ix.save_key_filter().unwrap());
    };
    let ix = open();
    for seq in 1..=100 {
        ix.apply(&[commit_to("s", seq, seq)]).unwrap();
    }
    save_when_complete(&ix);
    drop(ix);
    let saved = std::fs::read(&file).unwrap();

    // Used: no scan, the file is gone, the filter complete at once.
    let ix = open();
    assert!(!scanned(&ix), "the saved filter was not used");
    assert!(!file.exists());
    assert!(ix.keys.read().unwrap().complete);
    readable(&ix, 100);
    // More commits reach sled; the process then ends without a save.
    for seq in 101..=200 {
        ix.apply(&[commit_to("s", seq, seq)]).unwrap();
    }
    ix.flush().unwrap();
    drop(ix);

    // The earlier file is back: refused, removed, and every key readable.
    std::fs::write(&file, &saved).unwrap();
    let ix = open();
    assert!(scanned(&ix), "a file of an earlier state was used");
    assert!(!file.exists());
    readable(&ix, 200);
    save_when_complete(&ix);
    drop(ix);

    // Damage anywhere, or a truncation, is refused.
    let good = std::fs::read(&file).unwrap();
    let n = good.len();
    let mut cases: Vec<Vec<u8>> = [0, 9, 13, 17, 40, n / 2, n - 5, n - 1]
        .iter()
        .map(|&at| {
            let mut bad = good.clone();
            bad[at] ^= 0x10;
            bad
        })
        .collect();
    cases.push(good[..n - 1].to_vec());
    cases.push(Vec::new());
    for (i, bad) in cases.iter().enumerate() {
        std::fs::write(&file, bad).unwrap();
        let ix = open();
        assert!(scanned(&ix), "damaged file {i} was used");
        assert!(!file.exists());
        readable(&ix, 200);
        drop(ix);
    }
    // Whole again: used.
    std::fs::write(&file, &good).unwrap();
    let ix = open();
    assert!(!scanned(&ix));
    readable(&ix, 200);
}

/// A fresh 64 KiB value per commit, under `c/<seq>`.
struct BigValuePerCommit;

impl Indexer for BigValuePerCommit {
    fn name(&self) -> &'static str {
        "big-value-per-commit"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let seq = c.info.seq;
        batch.insert(format!("c/{seq:08}").as_bytes(), &vec![seq as u8; 64 << 10]);
        Ok(())
    }
}

/// sled's snapshot files in `dir`, finished ones only, in name (log position) order.
fn sled_snapshots(dir: &std::path::Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir.join(super::INDEX_SLED_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("snap.") && !n.ends_with(".generating"))
        .collect();
    names.sort();
    names
}

/// sled writes its snapshot only while it opens, so the first open after a process
/// that moved much into sled replayed all of it. A clean close that moved at least
/// `SNAPSHOT_AT_CLOSE_BYTES_MIN` opens sled once more and leaves a newer snapshot; a
/// close that moved less, or that was not asked to, leaves sled's files as they were.
#[test]
fn a_close_that_moved_enough_leaves_sled_a_newer_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index");
    let indexers = || -> Vec<Arc<dyn Indexer>> { vec![Arc::new(BigValuePerCommit)] };
    let bytes_per_commit = 64 << 10;
    let enough = super::close::SNAPSHOT_AT_CLOSE_BYTES_MIN / bytes_per_commit + 1;
    let mut seq = 0;
    let mut close_after = |commits: u64, asked: bool| {
        let (index, _) = Index::open(Some(&path), indexers()).unwrap();
        let before = sled_snapshots(&path);
        for _ in 0..commits {
            seq += 1;
            index.apply(&[commit_to("s", seq, seq)]).unwrap();
        }
        index.flush().unwrap();
        assert!(index.moved_bytes() >= commits * bytes_per_commit);
        if asked {
            index.snapshot_at_close();
        }
        drop(index);
        (before, sled_snapshots(&path))
    };
    let (before, after) = close_after(2, true);
    assert_eq!(before, after, "a short close leaves the snapshot alone");
    let (before, after) = close_after(enough, false);
    assert_eq!(
        before, after,
        "a close not asked to leaves the snapshot alone"
    );
    // The open above replayed the unasked close's moves and wrote a snapshot of them.
    let (before, after) = close_after(enough, true);
    assert!(
        after.last() > before.last(),
        "a close that moved {enough} commits of 64 KiB left {after:?} (before: {before:?})"
    );
    let (index, fresh) = Index::open(Some(&path), indexers()).unwrap();
    assert!(!fresh);
    for s in 1..=seq {
        let v = index
            .get("big-value-per-commit", format!("c/{s:08}").as_bytes())
            .unwrap();
        assert_eq!(v.map(|v| v.len()), Some(64 << 10), "seq {s}");
    }
}

/// The state a crash can leave in the middle of a clear: sled's main tree cleared (its
/// writes reach its files without a flush of ours) and the cache not. The next open
/// finds an empty index and must not serve the cache of the one it replaced, small
/// values (sled) or large (files).
#[test]
fn an_index_found_empty_has_no_cache_of_the_one_before() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("index");
    let (index, _) = Index::open(Some(&path), Vec::new()).unwrap();
    apply_commits(&index, 10, 0);
    index
        .put_cache("ns", b"large", &vec![7u8; 20 << 10])
        .unwrap();
    index.put_cache("ns", b"small", b"v").unwrap();
    index.flush().unwrap();
    let tree = index.sled("test").unwrap().tree.clone();
    tree.clear().unwrap();
    tree.flush().unwrap();
    drop(tree);
    drop(index);
    let (index, fresh) = Index::open(Some(&path), Vec::new()).unwrap();
    assert!(fresh, "an empty index is a fresh one");
    assert_eq!(index.applied_seq().unwrap(), 0);
    for key in [&b"large"[..], b"small"] {
        assert_eq!(index.get_cache("ns", key).unwrap(), None, "{key:?}");
    }
}

/// The checkpoint of `index` (its entries below the memtables, which the caller has
/// moved into sled) in the store directory `store`, as the owner writes one, opened.
fn checkpoint_of(index: &Index, store: &std::path::Path, seq: u64) -> Arc<CheckpointFile> {
    use crate::checkpoint::format::{Header, SegmentEnd};
    let header = Header {
        index_format: super::INDEX_FORMAT_VERSION,
        layout: 0,
        seq,
        commit_id: uuid::Uuid::from_u128(u128::from(seq)),
        segment: 1,
        offset: seq * 100,
        last_ts: 0,
        entries: 0,
        indexers: vec![("churn".into(), 1)],
        segments: vec![SegmentEnd {
            id: 1,
            first_seq: 1,
            end: seq * 100 + 100,
            header: Some(crate::format::SegmentHeader {
                data_start: crate::format::SEGMENT_HEADER_BYTES,
                compacted: None,
            }),
        }],
    };
    let entries = index.sled_view().unwrap().iter().filter(|kv| {
        !matches!(kv, Ok((k, _)) if k == super::META_MOVING || k == super::META_SYNCED || k == super::META_BASE)
    });
    let path =
        crate::checkpoint::write::write_checkpoint(&OsVfs, store, header, entries, 0).unwrap();
    Arc::new(CheckpointFile::open(&OsVfs, &path).unwrap())
}

/// The checkpoint, in the store directory `store`, of an index of commits 1..=50.
fn base_of_50(store: &std::path::Path) -> Arc<CheckpointFile> {
    let (index, _) = Index::open(Some(&store.join("a")), vec![Arc::new(Churn)]).unwrap();
    apply_commits(&index, 50, 0);
    index.flush().unwrap();
    checkpoint_of(&index, store, 50)
}

/// An index whose sled is a delta over a checkpoint of commits 1..=50 and holds
/// commits 51..=100 (moved in two parts): every entry as the whole index has it,
/// the base's keys that later commits removed hidden by the delta's removals, in
/// point reads, scans and dumps; after a reopen (the base found by its name); after
/// a move into the delta cut short at every point and finished from the redo log;
/// and a delta over the checkpoint of itself answers the same again.
#[test]
fn a_delta_over_a_base_answers_as_the_whole_index() {
    let want = whole_index(tempfile::tempdir().unwrap().path(), 40, 100);
    let store = tempfile::tempdir().unwrap();
    let base = base_of_50(store.path());
    let reopen = |path: &std::path::Path| {
        let (index, created) = Index::open(Some(path), vec![Arc::new(Churn)]).unwrap();
        assert!(!created);
        let id = index.base_id().unwrap().expect("a base");
        let ck = crate::checkpoint::open_base(&OsVfs, store.path(), &id).unwrap();
        index.attach_base(Arc::new(ck), true);
        index
    };
    let removed = super::keys::user_key("churn", format!("c/{:06}", 49).as_bytes());
    for cut in [None, Some(0), Some(1), Some(9), Some(40), Some(10_000)] {
        let path = store.path().join(format!("b{cut:?}"));
        {
            let (index, created) = Index::open(Some(&path), vec![Arc::new(Churn)]).unwrap();
            assert!(created);
            index.adopt_base(base.clone()).unwrap();
            for seq in 51..=100 {
                index.apply(&[commit(seq)]).unwrap();
                if seq == 75 {
                    index.flush_mem().unwrap();
                }
            }
            match cut {
                Some(n) => index.cut_move_for_tests(n),
                None => {
                    index.flush().unwrap();
                    assert_eq!(index.dump().unwrap(), want, "in place");
                    assert_eq!(index.read_key(&removed).unwrap(), None);
                    assert!(base.get(&removed).unwrap().is_some(), "the base has it");
                }
            }
        }
        let index = reopen(&path);
        assert_eq!(index.applied_seq().unwrap(), 100, "cut {cut:?}");
        assert_eq!(index.dump().unwrap(), want, "cut {cut:?}");
        assert_eq!(index.read_key(&removed).unwrap(), None, "cut {cut:?}");
        let scanned: Vec<_> = index
            .scan_prefix("churn", b"c/")
            .map(|kv| kv.unwrap().0)
            .collect();
        let wanted: Vec<_> = want
            .iter()
            .filter_map(|(k, _)| k.strip_prefix(super::keys::user_key("churn", b"").as_slice()))
            .filter(|k| k.starts_with(b"c/"))
            .map(<[u8]>::to_vec)
            .collect();
        assert_eq!(scanned, wanted, "cut {cut:?}");
        assert!(index.delta_extends_base().unwrap(), "cut {cut:?}");
        // The delta's own checkpoint as the base of a new, empty delta.
        let other = tempfile::tempdir().unwrap();
        let again = checkpoint_of(&index, other.path(), 100);
        let path = store.path().join(format!("c{cut:?}"));
        let (next, _) = Index::open(Some(&path), vec![Arc::new(Churn)]).unwrap();
        next.adopt_base(again).unwrap();
        assert_eq!(next.dump().unwrap(), want, "cut {cut:?}: rebased");
    }
}

/// A version block of the delta shorter than the base's (entries lost after the
/// base) or removed is found by the check an owner's open makes.
#[test]
fn a_delta_that_lost_version_entries_of_its_base_is_found() {
    let store = tempfile::tempdir().unwrap();
    let base = base_of_50(store.path());
    let key = super::keys::version_block_key("s1", 1);
    let block = base.get(&key).unwrap().unwrap();
    for stored in [[&[0u8][..], &block[..block.len() - 40]].concat(), vec![1u8]] {
        let dir = tempfile::tempdir().unwrap();
        let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
        index.adopt_base(base.clone()).unwrap();
        assert!(index.delta_extends_base().unwrap());
        index
            .sled("test")
            .unwrap()
            .tree
            .insert(&key, stored)
            .unwrap();
        assert!(!index.delta_extends_base().unwrap());
    }
}

/// A bulk load's runs (see `spill.rs`) over sled and over a base: commits 1..=40
/// (over a base: 1..=50) in sled, then every later memtable spilled to a run, a few
/// commits each, so that runs are merged into levels 1 and 2; every entry answers
/// as the whole index has it (keys removed after sled or the base had them too), in
/// point reads, scans and dumps, and no more runs are kept than the levels allow.
/// A clear drops the runs; a drop leaves no run behind and sled as it was.
#[test]
fn a_bulk_loads_runs_answer_as_the_whole_index() {
    let n = 700;
    let want = whole_index(tempfile::tempdir().unwrap().path(), 40, n);
    let store = tempfile::tempdir().unwrap();
    let base = base_of_50(store.path());
    for over_base in [false, true] {
        let path = store.path().join(format!("b{over_base}"));
        let (index, created) = Index::open(Some(&path), vec![Arc::new(Churn)]).unwrap();
        assert!(created);
        let first = if over_base {
            index.adopt_base(base.clone()).unwrap();
            51
        } else {
            apply_commits(&index, 40, 0);
            index.flush().unwrap();
            41
        };
        index.start_spill().unwrap();
        let runs = index.spill.get().unwrap().clone();
        for seq in first..=n {
            index.apply(&[commit(seq)]).unwrap();
            if seq % 3 == 0 {
                index.flush_mem().unwrap();
            }
            let levels = runs.levels();
            assert!(levels.windows(2).all(|w| w[0] >= w[1]), "{levels:?}");
            for l in 0..3 {
                let at_l = levels.iter().filter(|&&x| x == l).count();
                assert!(at_l < super::spill::RUNS_PER_LEVEL_MAX, "{levels:?}");
            }
        }
        index.flush_mem().unwrap();
        assert_eq!(runs.levels().first(), Some(&2), "merged twice over");
        assert_eq!(index.dump().unwrap(), want, "over a base: {over_base}");
        for removed in [10, 45, 300, n - 3] {
            let k = super::keys::user_key("churn", format!("c/{removed:06}").as_bytes());
            assert_eq!(index.read_key(&k).unwrap(), None, "c/{removed}");
        }
        let kept = super::keys::user_key("churn", format!("c/{:06}", n - 1).as_bytes());
        assert_eq!(
            index.read_key(&kept).unwrap(),
            Some((n - 1).to_be_bytes().to_vec())
        );
        let scanned: Vec<_> = index
            .scan_prefix("churn", b"c/")
            .map(|kv| kv.unwrap().0)
            .collect();
        let wanted: Vec<_> = want
            .iter()
            .filter_map(|(k, _)| k.strip_prefix(super::keys::user_key("churn", b"").as_slice()))
            .filter(|k| k.starts_with(b"c/"))
            .map(<[u8]>::to_vec)
            .collect();
        assert_eq!(scanned, wanted, "over a base: {over_base}");
        assert_eq!(
            index.sled_view().unwrap().get(super::META_APPLIED).unwrap(),
            index.read_key(super::META_APPLIED).unwrap().map(Into::into),
            "the checkpoint's view has the runs' applied mark"
        );
        assert_eq!(
            index.sled_applied_seq_for_tests(),
            Some(first - 1),
            "nothing moved into sled"
        );
        drop(index);
        assert!(!path.join(super::spill::SPILL_DIR).exists());
        let (index, _) = Index::open(Some(&path), vec![Arc::new(Churn)]).unwrap();
        assert_eq!(index.applied_seq().unwrap(), first - 1, "sled as it was");
        index.start_spill().unwrap();
        apply_commits(&index, 30, 0);
        index.flush_mem().unwrap();
        assert!(!index.spill.get().unwrap().levels().is_empty());
        index.clear(0).unwrap();
        assert!(index.spill.get().unwrap().levels().is_empty());
        assert_eq!(index.applied_seq().unwrap(), 0);
    }
}
