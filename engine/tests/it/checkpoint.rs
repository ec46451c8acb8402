//! Checkpoints of the index: a read-only open from one answers exactly as a rebuild
//! from the whole log, reads only the log after it, and falls back to the whole log
//! (never a wrong answer, never a panic) when the checkpoint is damaged, missing,
//! from another store or ahead of the log, or a crash cut its write short.

use crate::common::*;
use spool_engine::vfs::{FaultKind, FaultVfs, OsVfs, SimVfs};
use spool_engine::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// An indexer that inserts, overwrites and removes keys (removals over a checkpoint's
/// keys are what a layered read can get wrong).
struct Kv;

impl Indexer for Kv {
    fn name(&self) -> &'static str {
        "kv"
    }
    fn version(&self) -> u32 {
        3
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let v = c.info.version;
        let s = &c.info.stream;
        batch.insert(format!("k/{s}/{}", v % 7).as_bytes(), &c.events[0].payload);
        if v.is_multiple_of(5) {
            batch.remove(format!("k/{s}/{}", (v + 3) % 7).as_bytes());
        }
        let n = batch
            .get(format!("n/{s}").as_bytes())?
            .map_or(0, |b| u64::from_be_bytes(b.try_into().unwrap_or_default()));
        batch.insert(format!("n/{s}").as_bytes(), &(n + 1).to_be_bytes());
        Ok(())
    }
}

/// A second indexer: one key per commit.
struct PerCommit;

impl Indexer for PerCommit {
    fn name(&self) -> &'static str {
        "percommit"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        batch.insert(&c.info.seq.to_be_bytes(), c.info.stream.as_bytes());
        Ok(())
    }
}

pub(crate) fn opts() -> Options {
    small_opts()
        .indexer(Arc::new(Kv))
        .indexer(Arc::new(PerCommit))
        .checkpoint_commits_min(0)
}

/// Deterministic xorshift.
pub(crate) struct Rng(pub u64);
impl Rng {
    pub(crate) fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
}

fn seed() -> u64 {
    let seed = std::env::var("SPOOL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0x5eed_c4e7);
    println!("seed {seed} (SPOOL_TEST_SEED)");
    seed
}

/// `n` commits on up to 12 streams with payloads of random length.
pub(crate) fn workload(s: &Store, rng: &mut Rng, n: u64) {
    for _ in 0..n {
        let stream = format!("s{}", rng.next() % 12);
        let len = (rng.next() % 300) as usize;
        let payload: Vec<u8> = (0..len).map(|i| (i as u64 ^ rng.next()) as u8).collect();
        append_next(s, &stream, vec![EventData::new("t", payload)]);
    }
}

/// Everything a reader can ask, in one comparable value.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Answers {
    dump: Vec<(Vec<u8>, Vec<u8>)>,
    streams: Vec<(String, u64)>,
    log: Vec<(String, u64, Vec<u8>)>,
    gets: Vec<Option<Vec<u8>>>,
    scans: Vec<Vec<(Vec<u8>, Vec<u8>)>>,
    visits: Vec<(Vec<u8>, Vec<u8>)>,
    pub(crate) last_seq: u64,
}

pub(crate) fn answers(s: &Store) -> Result<Answers, Error> {
    let ix = s.index();
    let streams = ix.streams()?;
    let mut gets = Vec::new();
    let mut scans = Vec::new();
    for k in 0..14 {
        let stream = format!("s{k}");
        for i in 0..7 {
            gets.push(ix.get("kv", format!("k/{stream}/{i}").as_bytes())?);
        }
        gets.push(ix.get("kv", format!("n/{stream}").as_bytes())?);
        if let Some(h) = ix.stream_head(&stream)? {
            gets.push(Some(h.version.to_be_bytes().to_vec()));
            gets.push(Some(h.seq.to_be_bytes().to_vec()));
        }
        scans.push(
            ix.scan_prefix("kv", format!("k/{stream}/").as_bytes())
                .collect::<Result<Vec<_>, _>>()?,
        );
    }
    scans.push(
        ix.scan_prefix("percommit", b"")
            .collect::<Result<Vec<_>, _>>()?,
    );
    let mut visits = Vec::new();
    ix.visit_range("kv", b"k/", b"k/s3/", |k, v| {
        visits.push((k.to_vec(), v.to_vec()));
        visits.len() < 40
    })?;
    let mut log = Vec::new();
    for r in s.scan(1)? {
        let r = r?;
        log.push((
            r.info.stream.clone(),
            r.info.version,
            r.events[0].payload.clone(),
        ));
    }
    Ok(Answers {
        dump: ix.dump()?,
        streams,
        log,
        gets,
        scans,
        visits,
        last_seq: s.last_seq(),
    })
}

pub(crate) fn copy_dir(from: &Path, to: &Path, skip: &[&str]) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if skip.iter().any(|s| name == *s) {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(&name), skip);
        } else {
            std::fs::copy(e.path(), to.join(&name)).unwrap();
        }
    }
}

/// The answers of a read-only open of a copy of `dir` without its checkpoints: the
/// whole log rebuilt into a temporary index.
pub(crate) fn rebuilt(dir: &Path) -> Answers {
    let copy = tempfile::tempdir().unwrap();
    copy_dir(dir, copy.path(), &[CHECKPOINT_DIR, INDEX_DIR, "LOCK"]);
    let ro = Store::open_read_only(copy.path(), opts()).unwrap();
    assert_eq!(ro.stats().open_checkpoint_seq, None);
    answers(&ro).unwrap()
}

pub(crate) fn checkpoints(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = match std::fs::read_dir(dir.join(CHECKPOINT_DIR)) {
        Ok(rd) => rd.map(|e| e.unwrap().path()).collect(),
        Err(_) => Vec::new(),
    };
    v.sort();
    v
}

#[test]
fn a_read_only_open_from_a_checkpoint_answers_as_a_rebuild_and_reads_only_the_tail() {
    let mut rng = Rng(seed());
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), opts()).unwrap();
    workload(&s, &mut rng, 700);
    let at_close = s.last_seq();
    s.close().unwrap();
    assert_eq!(
        checkpoints(dir.path()).len(),
        1,
        "one checkpoint after a close"
    );

    // Nothing after it: nothing read from the log.
    let ro = Store::open_read_only(dir.path(), opts()).unwrap();
    let st = ro.stats();
    assert_eq!(st.open_checkpoint_seq, Some(at_close));
    assert_eq!(st.open_checkpoint_fallback, None);
    assert_eq!(st.open_records_decoded, 0);
    assert_eq!(answers(&ro).unwrap(), rebuilt(dir.path()));
    // No sled under it: cache entries live in memory, and behave as sled's would.
    let ix = ro.index();
    ix.put_cache("snap", b"k1", b"v1").unwrap();
    ix.put_cache("snap", b"k2", b"v2").unwrap();
    ix.put_cache("other", b"k1", b"x").unwrap();
    assert_eq!(
        ix.get_cache("snap", b"k1").unwrap().as_deref(),
        Some(&b"v1"[..])
    );
    let listed: Vec<_> = ix
        .scan_cache_prefix("snap", b"k")
        .map(|kv| kv.unwrap())
        .collect();
    assert_eq!(
        listed,
        vec![
            (b"k1".to_vec(), b"v1".to_vec()),
            (b"k2".to_vec(), b"v2".to_vec())
        ]
    );
    ix.remove_cache("snap", b"k1").unwrap();
    assert_eq!(ix.get_cache("snap", b"k1").unwrap(), None);
    assert_eq!(
        ix.get_cache("other", b"k1").unwrap().as_deref(),
        Some(&b"x"[..])
    );
    drop(ro);

    // A tail beside a live owner: only the tail is read.
    let owner = Store::open(dir.path(), opts()).unwrap();
    let tail = 1 + rng.next() % 90;
    workload(&owner, &mut rng, tail);
    let ro = Store::open_read_only(dir.path(), opts()).unwrap();
    let st = ro.stats();
    assert_eq!(st.open_checkpoint_seq, Some(at_close));
    assert!(
        st.open_records_decoded <= tail,
        "{} records decoded, the tail is {tail}",
        st.open_records_decoded
    );
    let got = answers(&ro).unwrap();
    assert_eq!(got, rebuilt(dir.path()));
    assert_eq!(got, answers(&owner).unwrap());
    // The full path reads the whole log.
    let copy = tempfile::tempdir().unwrap();
    copy_dir(
        dir.path(),
        copy.path(),
        &[CHECKPOINT_DIR, INDEX_DIR, "LOCK"],
    );
    let full = Store::open_read_only(copy.path(), opts()).unwrap();
    assert_eq!(full.stats().open_records_decoded, at_close + tail);
}

#[test]
fn background_checkpoints_follow_the_log_and_readers_use_them() {
    let mut rng = Rng(seed());
    let dir = tempfile::tempdir().unwrap();
    let o = opts()
        .checkpoint_commits_min(64)
        .durability(Durability::Buffered);
    let s = Store::open(dir.path(), o.clone()).unwrap();
    // Enough commits for moves into sled (each may write a checkpoint).
    workload(&s, &mut rng, 9000);
    s.flush().unwrap();
    s.flush_index().unwrap();
    workload(&s, &mut rng, 5000);
    assert!(s.stats().checkpoints_written >= 1, "{:?}", s.stats());
    assert_eq!(s.stats().checkpoint_failure, None);
    s.flush().unwrap();
    let ro = Store::open_read_only(dir.path(), opts()).unwrap();
    let st = ro.stats();
    assert!(st.open_checkpoint_seq.is_some(), "{st:?}");
    assert!(st.open_records_decoded < st.last_seq, "{st:?}");
    assert_eq!(answers(&ro).unwrap(), rebuilt(dir.path()));
    drop(ro);
    s.close().unwrap();
    assert_eq!(
        checkpoints(dir.path()).len(),
        1,
        "older checkpoints are removed"
    );
}

#[test]
fn deferred_checkpoints_wait_for_the_guard_and_a_close_still_writes_one() {
    let mut rng = Rng(seed());
    let dir = tempfile::tempdir().unwrap();
    let o = opts()
        .checkpoint_commits_min(64)
        .durability(Durability::Buffered);
    let s = Store::open(dir.path(), o).unwrap();
    {
        let _outer = s.defer_checkpoints();
        let _inner = s.defer_checkpoints();
        // The same load that writes background checkpoints in the test above.
        workload(&s, &mut rng, 9000);
        s.flush().unwrap();
        s.flush_index().unwrap();
        drop(_inner);
        workload(&s, &mut rng, 5000);
        s.flush().unwrap();
        assert_eq!(s.stats().checkpoints_written, 0, "{:?}", s.stats());
        assert!(checkpoints(dir.path()).is_empty());
    }
    workload(&s, &mut rng, 14000);
    assert!(s.stats().checkpoints_written >= 1, "{:?}", s.stats());
    s.close().unwrap();
    let ro = Store::open_read_only(dir.path(), opts()).unwrap();
    assert!(ro.stats().open_checkpoint_seq.is_some(), "{:?}", ro.stats());
    assert_eq!(answers(&ro).unwrap(), rebuilt(dir.path()));
}

/// A store of `n` commits built in `sim` (deterministic), still open.
fn sim_store(sim: &SimVfs, dir: &Path, n: u64) -> Store {
    let s = Store::open(dir, opts().vfs(Arc::new(sim.clone()))).unwrap();
    workload(&s, &mut Rng(77), n);
    s
}

#[test]
fn a_crash_at_every_sync_of_a_checkpoint_write_opens_with_the_same_answers() {
    let mut crashed_at = 0;
    for n in 1.. {
        let sim = SimVfs::new();
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("store");
        let s = sim_store(&sim, &dir, 250);
        let want = answers(&s).unwrap();
        sim.crash_at_sync(n, n);
        drop(s);
        if sim.crash_count() == 0 {
            // The close made fewer than `n` syncs: every point was tried.
            assert!(n > 2, "the checkpoint write syncs");
            break;
        }
        crashed_at = n;
        let vfs = sim.after_crash();
        let o = || opts().vfs(Arc::new(vfs.clone()));
        let ro = Store::open_read_only(&dir, o()).unwrap();
        assert_eq!(
            answers(&ro).unwrap(),
            want,
            "read-only after a crash at sync {n}"
        );
        drop(ro);
        let owner = Store::open(&dir, o()).unwrap();
        assert_eq!(
            answers(&owner).unwrap(),
            want,
            "owner after a crash at sync {n}"
        );
        owner.close().unwrap();
        let ro = Store::open_read_only(&dir, o()).unwrap();
        assert_eq!(ro.stats().open_checkpoint_fallback, None);
        assert_eq!(ro.stats().open_checkpoint_seq, Some(want.last_seq));
        assert_eq!(
            answers(&ro).unwrap(),
            want,
            "read-only after the next close"
        );
    }
    assert!(crashed_at >= 2);
}

#[test]
fn a_failed_checkpoint_write_is_not_a_store_fault() {
    for kind in [
        FaultKind::Write,
        FaultKind::Sync,
        FaultKind::Rename,
        FaultKind::Meta,
    ] {
        let dir = tempfile::tempdir().unwrap();
        let fault = FaultVfs::new(Arc::new(OsVfs));
        let o = || opts().vfs(Arc::new(fault.clone()));
        let s = Store::open(dir.path(), o()).unwrap();
        workload(&s, &mut Rng(5), 120);
        let want = answers(&s).unwrap();
        fault.reset_counts();
        // Every call of the kind from now fails: the close's checkpoint write.
        fault.fail_nth(kind, 1, true);
        assert!(s.close().is_ok(), "{kind:?}");
        fault.clear();
        let ro = Store::open_read_only(dir.path(), o()).unwrap();
        assert_eq!(answers(&ro).unwrap(), want, "{kind:?}");
        drop(ro);
        // The next owner writes it.
        Store::open(dir.path(), o()).unwrap().close().unwrap();
        let ro = Store::open_read_only(dir.path(), o()).unwrap();
        assert_eq!(
            ro.stats().open_checkpoint_seq,
            Some(want.last_seq),
            "{kind:?}"
        );
        assert_eq!(answers(&ro).unwrap(), want, "{kind:?}");
    }
}

/// A closed store with a checkpoint of all of it, and its rebuilt answers.
fn closed_store() -> (tempfile::TempDir, PathBuf, Answers) {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), opts()).unwrap();
    workload(&s, &mut Rng(11), 600);
    s.close().unwrap();
    let ck = checkpoints(dir.path()).pop().unwrap();
    let want = rebuilt(dir.path());
    (dir, ck, want)
}

/// A read-only open of `dir` after damage: it must not panic; it falls back (or, for
/// damage inside a data block, which is checked when read, fails that read naming
/// the checkpoint), and whatever it answers equals `want`.
fn check_damaged(dir: &Path, want: &Answers, what: &str) {
    let ro = Store::open_read_only(dir, opts()).unwrap_or_else(|e| panic!("{what}: {e}"));
    match answers(&ro) {
        Ok(got) => assert_eq!(&got, want, "{what}"),
        Err(e) => {
            assert!(
                ro.stats().open_checkpoint_seq.is_some() && e.to_string().contains("checkpoint"),
                "{what}: {e}"
            );
        }
    }
}

#[test]
fn bit_flips_truncation_and_deletion_of_a_checkpoint_fall_back_with_the_same_answers() {
    let (dir, ck, want) = closed_store();
    let bytes = std::fs::read(&ck).unwrap();
    let len = bytes.len();
    // Every byte of the header, the block index and the footer, and bytes spread
    // over the data blocks.
    let mut offsets: Vec<usize> = (0..len.min(400)).collect();
    offsets.extend((len.saturating_sub(600)..len).filter(|o| *o >= 400));
    offsets.extend((400..len).step_by(97));
    offsets.sort();
    offsets.dedup();
    let mut fell_back = 0;
    for (i, off) in offsets.iter().enumerate() {
        let mut b = bytes.clone();
        b[*off] ^= 1 << (i % 8);
        std::fs::write(&ck, &b).unwrap();
        check_damaged(dir.path(), &want, &format!("bit flip at {off}"));
        let ro = Store::open_read_only(dir.path(), opts()).unwrap();
        if ro.stats().open_checkpoint_fallback.is_some() {
            fell_back += 1;
        }
    }
    assert!(
        fell_back > 400,
        "{fell_back} of {} flips fell back",
        offsets.len()
    );
    for cut in [0, 1, 16, 40, len / 3, len / 2, len - 33, len - 32, len - 1] {
        std::fs::write(&ck, &bytes[..cut]).unwrap();
        check_damaged(dir.path(), &want, &format!("truncated to {cut}"));
        let ro = Store::open_read_only(dir.path(), opts()).unwrap();
        assert!(
            ro.stats().open_checkpoint_fallback.is_some(),
            "truncated to {cut}"
        );
    }
    std::fs::remove_file(&ck).unwrap();
    let ro = Store::open_read_only(dir.path(), opts()).unwrap();
    assert_eq!(ro.stats().open_checkpoint_seq, None);
    assert_eq!(ro.stats().open_checkpoint_fallback, None);
    assert_eq!(answers(&ro).unwrap(), want);
}

#[test]
fn a_checkpoint_from_another_store_or_other_indexers_falls_back() {
    let (dir, ck, want) = closed_store();
    // Another store with a longer log: its checkpoint is the newest by name.
    let other = tempfile::tempdir().unwrap();
    let s = Store::open(other.path(), opts()).unwrap();
    workload(&s, &mut Rng(12), 650);
    s.close().unwrap();
    let foreign = checkpoints(other.path()).pop().unwrap();
    let planted = dir
        .path()
        .join(CHECKPOINT_DIR)
        .join(foreign.file_name().unwrap());
    std::fs::copy(&foreign, &planted).unwrap();
    let ro = Store::open_read_only(dir.path(), opts()).unwrap();
    let why = ro
        .stats()
        .open_checkpoint_fallback
        .expect("a foreign checkpoint is refused");
    assert!(why.contains(&*planted.to_string_lossy()), "{why}");
    assert_eq!(answers(&ro).unwrap(), want);
    drop(ro);
    // The owner removes what the log does not back, then writes its own on close.
    Store::open(dir.path(), opts()).unwrap().close().unwrap();
    assert_eq!(checkpoints(dir.path()), vec![ck.clone()]);
    // Other indexers than the checkpoint's: not used.
    let ro = Store::open_read_only(dir.path(), opts().indexer(Arc::new(EventCount))).unwrap();
    let why = ro.stats().open_checkpoint_fallback.expect("other indexers");
    assert!(why.contains("indexers"), "{why}");
    drop(ro);
    // An owner with those indexers rebuilds its index and replaces the checkpoint at
    // close, although the log did not grow: readers with them use it from then on.
    let with_count = || opts().indexer(Arc::new(EventCount));
    Store::open(dir.path(), with_count())
        .unwrap()
        .close()
        .unwrap();
    assert_eq!(checkpoints(dir.path()).len(), 1);
    let ro = Store::open_read_only(dir.path(), with_count()).unwrap();
    assert_eq!(ro.stats().open_checkpoint_fallback, None);
    assert!(ro.stats().open_checkpoint_seq.is_some());
}

struct EventCount;
impl Indexer for EventCount {
    fn name(&self) -> &'static str {
        "count"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, _: &RecordedCommit, _: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        Ok(())
    }
}

#[test]
fn a_checkpoint_ahead_of_the_log_falls_back() {
    let (dir, _ck, _) = closed_store();
    // The log loses its last records behind the checkpoint (as buffered writes lost
    // in a power loss would): the last segment is cut inside its last record.
    let last = seg_files(dir.path()).pop().unwrap();
    let b = std::fs::read(&last).unwrap();
    let end = b.iter().rposition(|x| *x != 0).unwrap();
    std::fs::write(&last, &b[..end - 3]).unwrap();
    let want = rebuilt(dir.path());
    let ro = Store::open_read_only(dir.path(), opts()).unwrap();
    let why = ro
        .stats()
        .open_checkpoint_fallback
        .expect("ahead of the log");
    assert!(why.contains("does not hold its record"), "{why}");
    assert_eq!(answers(&ro).unwrap(), want);
    assert!(want.last_seq < 600);
}

#[test]
fn hostile_checkpoint_files_never_panic_or_allocate_beyond_the_file() {
    let (dir, ck, want) = closed_store();
    let good = std::fs::read(&ck).unwrap();
    let mut rng = Rng(99);
    for round in 0..40 {
        let mut b = good.clone();
        match round % 4 {
            // Huge lengths in the header's length field and the footer's fields.
            0 => b[12..16].copy_from_slice(&u32::MAX.to_le_bytes()),
            1 => {
                let n = b.len();
                b[n - 32..n - 24].copy_from_slice(&(rng.next() >> 1).to_le_bytes());
            }
            2 => {
                let n = b.len();
                b[n - 24..n - 16].copy_from_slice(&u64::MAX.to_le_bytes());
            }
            _ => {
                for _ in 0..8 {
                    let i = (rng.next() as usize) % b.len();
                    b[i] = rng.next() as u8;
                }
            }
        }
        std::fs::write(&ck, &b).unwrap();
        check_damaged(dir.path(), &want, &format!("hostile round {round}"));
    }
}

/// Where a checkpoint file's data blocks end: at its first block index chunk, which
/// the top index's first entry (after the chunk count and the first key) gives.
fn blocks_end(b: &[u8]) -> usize {
    let n = b.len();
    let top = u64::from_le_bytes(b[n - 32..n - 24].try_into().unwrap()) as usize;
    let key_len = u32::from_le_bytes(b[top + 4..top + 8].try_into().unwrap()) as usize;
    let at = top + 8 + key_len;
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap()) as usize
}

#[test]
fn verify_compares_the_checkpoint_with_a_rebuild_and_reports_a_damaged_block() {
    let (dir, ck, _) = closed_store();
    let r = verify(dir.path(), opts()).unwrap();
    assert!(r.ok, "{:?}", r.errors);
    assert_eq!(r.checkpoint, CheckpointCheck::Checked { seq: 600 });
    // Other indexers than the checkpoint's: not used, not an error.
    let r = verify(dir.path(), small_opts()).unwrap();
    assert!(r.ok, "{:?}", r.errors);
    assert!(
        matches!(r.checkpoint, CheckpointCheck::Unused { .. }),
        "{:?}",
        r.checkpoint
    );
    // A flipped bit inside the last data block (which the open does not read): reads
    // from the checkpoint would fail, so verify reports it, naming the file. (Damage
    // in a block the open reads, e.g. the first with the meta keys, makes the open
    // fall back.)
    let mut b = std::fs::read(&ck).unwrap();
    let blocks_end = blocks_end(&b);
    b[blocks_end - 10] ^= 4;
    std::fs::write(&ck, &b).unwrap();
    let r = verify(dir.path(), opts()).unwrap();
    assert!(!r.ok);
    assert!(
        r.errors
            .iter()
            .any(|p| p.problem.contains(&*ck.to_string_lossy())),
        "{:?}",
        r.errors
    );
    // A flipped header byte: read-only opens do not use it; not an error.
    let mut b = std::fs::read(&ck).unwrap();
    b[blocks_end - 10] ^= 4;
    b[30] ^= 1;
    std::fs::write(&ck, &b).unwrap();
    let r = verify(dir.path(), opts()).unwrap();
    assert!(r.ok, "{:?}", r.errors);
    assert!(
        matches!(r.checkpoint, CheckpointCheck::Unused { .. }),
        "{:?}",
        r.checkpoint
    );
}
