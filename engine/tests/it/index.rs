//! Derived indexes: rebuild, catch-up, indexers, cache.
use crate::common;
use common::*;
use spool_engine::*;
use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Counts events per stream: key = stream, value = u64 BE.
struct EventCounter {
    version: AtomicU32,
}

impl Indexer for EventCounter {
    fn name(&self) -> &'static str {
        "evcount"
    }
    fn version(&self) -> u32 {
        self.version.load(Ordering::SeqCst)
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let key = c.info.stream.as_bytes();
        let prev = match batch.get(key)? {
            Some(v) => u64::from_be_bytes(
                v.try_into()
                    .map_err(|_| IndexError::indexer("evcount", "bad value"))?,
            ),
            None => 0,
        };
        batch.insert(key, &(prev + c.events.len() as u64).to_be_bytes());
        Ok(())
    }
}

fn opts(ix: &Arc<EventCounter>) -> Options {
    small_opts().indexer(ix.clone())
}

fn count(s: &Store, stream: &str) -> Option<u64> {
    s.index()
        .get("evcount", stream.as_bytes())
        .unwrap()
        .map(|v| u64::from_be_bytes(v.try_into().unwrap()))
}

fn fill(s: &Store, from: u64, to: u64) {
    for i in from..to {
        let events = (0..=(i % 3))
            .map(|k| EventData::new("e", vec![k as u8; 20]))
            .collect();
        append_next(s, &format!("s{}", i % 4), events);
    }
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &to.join(e.file_name()));
        } else {
            std::fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }
}

#[test]
fn deleting_the_index_rebuilds_identical_answers() {
    let dir = tempfile::tempdir().unwrap();
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    fill(&s, 0, 60);
    let heads = s.streams().unwrap();
    let dump = s.index().dump().unwrap();
    let c0 = count(&s, "s0");
    assert!(c0.unwrap() > 15);
    s.close().unwrap();
    // Without the checkpoints too: an index found empty would take the newest as its base.
    std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    std::fs::remove_dir_all(dir.path().join(CHECKPOINT_DIR)).unwrap();
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    assert_eq!(s.stats().open_records_decoded, s.last_seq());
    assert_eq!(s.streams().unwrap(), heads);
    assert_eq!(count(&s, "s0"), c0);
    assert_eq!(s.index().dump().unwrap(), dump);
    // Garbage in place of the index directory is rebuilt too.
    s.close().unwrap();
    std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    std::fs::remove_dir_all(dir.path().join(CHECKPOINT_DIR)).unwrap();
    std::fs::create_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    std::fs::write(dir.path().join(INDEX_DIR).join("conf"), b"\xff\xfe garbage").unwrap();
    std::fs::write(dir.path().join(INDEX_DIR).join("db"), b"\x01\x02 garbage").unwrap();
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    assert_eq!(s.streams().unwrap(), heads);
    assert_eq!(s.index().dump().unwrap(), dump);
}

#[test]
fn an_index_behind_the_log_catches_up() {
    let dir = tempfile::tempdir().unwrap();
    let old = tempfile::tempdir().unwrap();
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    fill(&s, 0, 20);
    s.close().unwrap();
    copy_dir(&dir.path().join(INDEX_DIR), old.path());
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    fill(&s, 20, 50);
    let heads = s.streams().unwrap();
    let dump = s.index().dump().unwrap();
    s.close().unwrap();
    std::fs::remove_dir_all(dir.path().join(INDEX_DIR)).unwrap();
    copy_dir(old.path(), &dir.path().join(INDEX_DIR));
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    assert_eq!(s.index().applied_seq().unwrap(), 50);
    assert_eq!(s.streams().unwrap(), heads);
    assert_eq!(s.index().dump().unwrap(), dump);
    let r = verify(dir.path(), opts(&ix));
    drop(s);
    assert!(r.unwrap().ok);
    let r = verify(dir.path(), opts(&ix)).unwrap();
    assert!(r.ok, "{r:?}");
    assert_eq!(r.index, IndexCheck::Checked { applied_seq: 50 });
}

#[test]
fn indexer_version_bump_rebuilds_and_drops_cache() {
    let dir = tempfile::tempdir().unwrap();
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    fill(&s, 0, 10);
    s.index().put_cache("snap", b"k", b"v").unwrap();
    assert_eq!(
        s.index().get_cache("snap", b"k").unwrap(),
        Some(b"v".to_vec())
    );
    assert_eq!(
        s.index().with_cache("snap", b"k", |v| v == b"v").unwrap(),
        Some(true)
    );
    assert_eq!(
        s.index().with_cache("snap", b"x", <[u8]>::len).unwrap(),
        None
    );
    let c = count(&s, "s1");
    s.close().unwrap();
    // Same version: the cache survives a reopen.
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    assert_eq!(
        s.index().get_cache("snap", b"k").unwrap(),
        Some(b"v".to_vec())
    );
    s.close().unwrap();
    ix.version.store(2, Ordering::SeqCst);
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    assert_eq!(s.index().get_cache("snap", b"k").unwrap(), None);
    assert_eq!(count(&s, "s1"), c);
    let scanned: Vec<_> = s
        .index()
        .scan_prefix("evcount", b"s")
        .map(|r| r.unwrap().0)
        .collect();
    assert_eq!(
        scanned,
        vec![
            b"s0".to_vec(),
            b"s1".to_vec(),
            b"s2".to_vec(),
            b"s3".to_vec()
        ]
    );
}

struct Failing;
impl Indexer for Failing {
    fn name(&self) -> &'static str {
        "failing"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, _: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        if c.events[0].payload == b"boom" {
            return Err(IndexError::indexer("failing", "boom"));
        }
        Ok(())
    }
}

#[test]
fn indexer_failure_poisons_writes_but_the_commit_is_durable() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts().indexer(Arc::new(Failing))).unwrap();
    s.append(commit("a", ExpectedVersion::NoStream, b"ok"))
        .unwrap();
    assert!(matches!(
        s.append(commit("a", ExpectedVersion::Exact(1), b"boom")),
        Err(Error::Index(_))
    ));
    assert!(s.is_poisoned());
    drop(s);
    // Reopening with the failing indexer fails (the log holds the commit) ...
    assert!(matches!(
        Store::open(dir.path(), test_opts().indexer(Arc::new(Failing))),
        Err(Error::Index(_))
    ));
    // ... and without it the commit is there.
    let s = Store::open(dir.path(), test_opts()).unwrap();
    assert_eq!(s.stream_version("a").unwrap(), Some(2));
}

/// The key prefix of `stream`'s entries in the indexers below: `stream \0`.
fn stream_prefix(stream: &str) -> Vec<u8> {
    let mut p = stream.as_bytes().to_vec();
    p.push(0);
    p
}

/// The key of commit `c` in the indexers below: `stream \0 version` (u64 BE).
fn version_key(c: &RecordedCommit) -> Vec<u8> {
    let mut k = stream_prefix(&c.info.stream);
    k.extend_from_slice(&c.info.version.to_be_bytes());
    k
}

/// Keeps, per stream, only the kinds of its last 2 commits: inserts and removes.
struct LastKinds;
impl Indexer for LastKinds {
    fn name(&self) -> &'static str {
        "lastkinds"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        batch.insert(&version_key(c), c.events[0].kind.as_bytes());
        let existing = batch.scan_prefix(&stream_prefix(&c.info.stream))?;
        if existing.len() > 2 {
            batch.remove(&existing[0].0);
        }
        Ok(())
    }
}

/// `visit_prefix` sees what `scan_prefix` yields (memtables merged over sled), and stops
/// when asked to.
fn assert_visit_equals_scan(s: &Store) {
    for prefix in [&b""[..], b"s", b"s0\0", b"s3\0", b"s9"] {
        let scanned: Vec<_> = s
            .index()
            .scan_prefix("lastkinds", prefix)
            .map(|r| r.unwrap())
            .collect();
        let mut visited = Vec::new();
        s.index()
            .visit_prefix("lastkinds", prefix, |k, v| {
                visited.push((k.to_vec(), v.to_vec()));
                true
            })
            .unwrap();
        assert_eq!(visited, scanned, "prefix {prefix:?}");
        let mut first = Vec::new();
        s.index()
            .visit_prefix("lastkinds", prefix, |k, _| {
                first.push(k.to_vec());
                false
            })
            .unwrap();
        assert_eq!(first.len(), scanned.len().min(1), "prefix {prefix:?}");
        // `visit_range` sees the scan's entries from `from` on: starts inside the
        // prefix (at a key, between keys), below it (everything) and past it (nothing).
        let mut froms: Vec<Vec<u8>> = scanned.iter().map(|(k, _)| k.clone()).collect();
        froms.extend(scanned.iter().map(|(k, _)| {
            let mut k = k.clone();
            k.push(0);
            k
        }));
        froms.push(Vec::new());
        let mut past = prefix.to_vec();
        match past.last_mut() {
            Some(b) if *b < u8::MAX => *b += 1,
            _ => past.push(u8::MAX),
        }
        froms.push(past);
        for from in froms.iter().step_by(7).chain(froms.iter().rev().take(2)) {
            let want: Vec<_> = scanned
                .iter()
                .filter(|(k, _)| k.as_slice() >= from.as_slice())
                .cloned()
                .collect();
            let mut got = Vec::new();
            s.index()
                .visit_range("lastkinds", prefix, from, |k, v| {
                    got.push((k.to_vec(), v.to_vec()));
                    true
                })
                .unwrap();
            assert_eq!(got, want, "prefix {prefix:?} from {from:?}");
        }
    }
}

/// Writes one new key per commit, `stream \0 version`, and never removes one.
struct EveryVersion;
impl Indexer for EveryVersion {
    fn name(&self) -> &'static str {
        "everyversion"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        batch.insert(&version_key(c), c.events[0].kind.as_bytes());
        Ok(())
    }
}

/// Prefix scans from other threads while one thread appends through several
/// memtables (each new key waits unsorted in its memtable until a range read, and
/// a frozen memtable's keys are sorted by whichever of the move and a reader comes
/// first): every scan is in key order and holds every version the stream had
/// before the scan began.
#[test]
fn scans_during_appends_and_moves_see_every_acknowledged_key_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(
        dir.path(),
        test_opts()
            .indexer(Arc::new(EveryVersion))
            .durability(Durability::Buffered),
    )
    .unwrap();
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        for r in 0..2u64 {
            let (s, done) = (&s, &done);
            scope.spawn(move || {
                let mut scans = 0u64;
                while !done.load(Ordering::Acquire) || scans < 3 {
                    let stream = format!("s{}", (scans + r) % 3);
                    let before = s.stream_version(&stream).unwrap().unwrap_or(0);
                    let prefix = stream_prefix(&stream);
                    let keys: Vec<Vec<u8>> = s
                        .index()
                        .scan_prefix("everyversion", &prefix)
                        .map(|kv| kv.unwrap().0)
                        .collect();
                    assert!(
                        keys.windows(2).all(|w| w[0] < w[1]),
                        "scan of {stream} out of order"
                    );
                    assert!(
                        keys.len() as u64 >= before,
                        "scan of {stream}: {} keys, {before} versions acknowledged",
                        keys.len()
                    );
                    for (i, k) in keys.iter().take(before as usize).enumerate() {
                        let v = u64::from_be_bytes(k[prefix.len()..].try_into().unwrap());
                        assert_eq!(v, i as u64 + 1, "scan of {stream}");
                    }
                    scans += 1;
                }
            });
        }
        // More than two memtables' worth (a memtable moves after 4,096 commits, or after
        // up to 8,192 while the previous move runs): one or two moves during the appends.
        for i in 0..10_000u64 {
            append_next(
                &s,
                &format!("s{}", i % 3),
                vec![EventData::new(format!("k{i}"), vec![1])],
            );
        }
        done.store(true, Ordering::Release);
    });
    for stream in ["s0", "s1", "s2"] {
        let n = s
            .index()
            .scan_prefix("everyversion", &stream_prefix(stream))
            .count() as u64;
        assert_eq!(Some(n), s.stream_version(stream).unwrap());
    }
}

#[test]
fn many_commits_through_memtable_and_sled_equal_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || {
        test_opts()
            .indexer(Arc::new(LastKinds))
            .durability(Durability::Buffered)
    };
    let s = Store::open(dir.path(), opts()).unwrap();
    for i in 0..9000u64 {
        let kind = format!("k{i}");
        append_next(
            &s,
            &format!("s{}", i % 5),
            vec![EventData::new(kind, vec![1])],
        );
        if i % 1000 == 999 {
            // Mid-way reads see every acknowledged commit.
            assert_eq!(s.index().scan_prefix("lastkinds", b"s0\0").count(), 2);
            assert_visit_equals_scan(&s);
            assert_eq!(
                s.read_stream("s0", 1, usize::MAX).unwrap().len() as u64,
                (i + 5) / 5
            );
        }
    }
    let last: Vec<_> = s
        .index()
        .scan_prefix("lastkinds", b"s4\0")
        .map(|r| r.unwrap().1)
        .collect();
    assert_eq!(last, vec![b"k8994".to_vec(), b"k8999".to_vec()]);
    assert_visit_equals_scan(&s);
    let dump = s.index().dump().unwrap();
    s.close().unwrap();
    let ro = Store::open_read_only(dir.path(), opts()).unwrap();
    assert_eq!(ro.index().dump().unwrap(), dump);
    drop(ro);
    let s = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(s.index().dump().unwrap(), dump);
    // Everything in sled, nothing in the memtables.
    assert_visit_equals_scan(&s);
    assert_eq!(s.index().scan_prefix("lastkinds", b"s").count(), 10);
}

#[test]
fn an_index_in_use_elsewhere_is_not_wiped() {
    let a = tempfile::tempdir().unwrap();
    let b = tempfile::tempdir().unwrap();
    let ix = tempfile::tempdir().unwrap();
    let opts = || test_opts().index_dir(ix.path().join("index"));
    let s = Store::open(a.path(), opts()).unwrap();
    s.append(commit("a", ExpectedVersion::NoStream, b"1"))
        .unwrap();
    // Another store pointed at the same (open) sled directory must fail, not wipe it.
    assert!(matches!(
        Store::open(b.path(), opts()),
        Err(Error::Index(_))
    ));
    assert_eq!(s.stream_version("a").unwrap(), Some(1));
    s.close().unwrap();
    let s = Store::open(a.path(), opts()).unwrap();
    assert_eq!(s.index().applied_seq().unwrap(), 1);
}

/// A durable group reaches the index only after its fdatasync succeeded: a commit whose
/// fsync failed is never visible through the index, and the store is poisoned.
#[test]
fn a_commit_whose_fsync_failed_never_reaches_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let fv = vfs::FaultVfs::new(Arc::new(vfs::OsVfs));
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    let s = Store::open(
        dir.path(),
        opts(&ix)
            .durability(Durability::Immediate)
            .vfs(Arc::new(fv.clone())),
    )
    .unwrap();
    s.append(commit("a", ExpectedVersion::NoStream, b"1"))
        .unwrap();
    assert_eq!(count(&s, "a"), Some(1));
    fv.fail_nth(vfs::FaultKind::Sync, 1, false);
    assert!(matches!(
        s.append(commit("a", ExpectedVersion::Exact(1), b"2")),
        Err(Error::Io {
            op: "sync_data",
            ..
        })
    ));
    assert!(s.is_poisoned());
    assert_eq!(
        count(&s, "a"),
        Some(1),
        "the unsynced commit is not indexed"
    );
    assert_eq!(s.stream_version("a").unwrap(), Some(1));
}

/// Concurrent durable writers on one stream: every commit's indexer sees the earlier
/// groups and the earlier commits of its own group (the counter misses none).
#[test]
fn durable_groups_index_every_commit_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    let s = Arc::new(Store::open(dir.path(), opts(&ix).durability(Durability::Immediate)).unwrap());
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..40u8 {
                    s.append(commit("shared", ExpectedVersion::Any, &[t, i]))
                        .unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(count(&s, "shared"), Some(8 * 40));
    let stats = s.stats();
    assert_eq!(stats.commits, 8 * 40);
    println!("{} commits in {} groups", stats.commits, stats.write_groups);
}

/// One key per commit (`stream/version`), so most index reads are of keys never written.
struct PerCommit;

impl Indexer for PerCommit {
    fn name(&self) -> &'static str {
        "percommit"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let key = format!("{}/{}", c.info.stream, c.info.version);
        // A read of a key never written (the filter answers it once complete).
        if batch.get(key.as_bytes())?.is_some() {
            return Err(IndexError::indexer("percommit", "key written twice"));
        }
        batch.insert(key.as_bytes(), &c.info.seq.to_be_bytes());
        Ok(())
    }
}

fn per_commit(s: &Store, stream: &str, version: u64) -> Option<u64> {
    s.index()
        .get("percommit", format!("{stream}/{version}").as_bytes())
        .unwrap()
        .map(|v| u64::from_be_bytes(v.try_into().unwrap()))
}

#[test]
fn the_key_filter_never_hides_a_key_before_or_after_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || small_opts().indexer(Arc::new(PerCommit));
    // Enough commits that the memtable moves into sled more than once.
    let n = 9_000u64;
    let append = |s: &Store, i: u64| {
        append_next(
            s,
            &format!("s{}", i % 3),
            vec![EventData::new("e", vec![1])],
        );
    };
    let check = |s: &Store, upto: u64| {
        for i in 0..upto {
            let (stream, version) = (format!("s{}", i % 3), i / 3 + 1);
            assert!(
                per_commit(s, &stream, version).is_some(),
                "{stream}/{version}"
            );
        }
        for stream in ["s0", "s1", "s2"] {
            assert_eq!(per_commit(s, stream, upto / 3 + 2), None);
        }
        assert_eq!(per_commit(s, "s9", 1), None);
    };
    {
        let s = Store::open(dir.path(), opts()).unwrap();
        for i in 0..n {
            append(&s, i);
        }
        check(&s, n);
        s.close().unwrap();
    }
    // Reopened: sled holds every key; the filter is filled in the background, so reads
    // run both before and after it is complete, and while new keys arrive.
    let s = Store::open(dir.path(), opts()).unwrap();
    check(&s, n);
    for i in n..n + 300 {
        append(&s, i);
    }
    check(&s, n + 300);
    s.close().unwrap();
}

/// Per commit, sets or removes one key per stream (`k/<stream>`): a removal at
/// versions 1, 4, 7, ... (so the first write of every key is a removal of a key never
/// written), the version as its value otherwise.
struct Toggle;

impl Toggle {
    /// The key's value after `version` commits of its stream: the newest write wins.
    fn expected(version: u64) -> Option<u64> {
        (version % 3 != 1).then_some(version)
    }
}

impl Indexer for Toggle {
    fn name(&self) -> &'static str {
        "toggle"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let key = format!("k/{}", c.info.stream);
        if c.info.version % 3 == 1 {
            batch.remove(key.as_bytes());
        } else {
            batch.insert(key.as_bytes(), &c.info.version.to_be_bytes());
        }
        Ok(())
    }
}

/// The memtable puts a key into the key filter only when the key gains a value
/// there (a key it already holds with a value is in the filter): a key whose
/// memtable write goes from a removal to a value must still be found, in the
/// memtable, after it moved into sled, and after a reopen.
#[test]
fn a_key_set_after_its_removal_in_one_memtable_is_never_hidden_by_the_filter() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || small_opts().indexer(Arc::new(Toggle));
    let get = |s: &Store, stream: &str| {
        s.index()
            .get("toggle", format!("k/{stream}").as_bytes())
            .unwrap()
            .map(|v| u64::from_be_bytes(v.try_into().unwrap()))
    };
    // Fresh streams keep arriving, so the first write of some keys (a removal) and
    // their first value land in every memtable, including the ones moved into sled
    // (a memtable moves after 4,096 commits, or up to 8,192 while the previous move runs).
    let streams = |i: u64| format!("s{}", i % 7 + (i / 2_000) * 7);
    let check = |s: &Store, upto: u64| {
        let mut versions = std::collections::HashMap::new();
        for i in 0..upto {
            *versions.entry(streams(i)).or_insert(0u64) += 1;
        }
        for (stream, v) in versions {
            assert_eq!(get(s, &stream), Toggle::expected(v), "{stream} at {v}");
        }
    };
    let n = 10_000u64;
    {
        let s = Store::open(dir.path(), opts()).unwrap();
        for i in 0..n {
            append_next(&s, &streams(i), vec![EventData::new("e", vec![1])]);
            if i % 997 == 0 {
                check(&s, i + 1);
            }
        }
        check(&s, n);
        s.close().unwrap();
    }
    let s = Store::open(dir.path(), opts()).unwrap();
    check(&s, n);
    s.close().unwrap();
}

/// Regression (kill -9 loop, `tools/tests/cli.rs`): a process killed while sled wrote a
/// snapshot leaves `index/snap.<lsn>.generating`, which sled 0.34 then takes for its
/// newest snapshot and refuses as corrupt. Verify called the store corrupt, and the
/// owner's open wiped and rebuilt the whole index. The unfinished snapshot is now
/// removed and sled recovers from its previous snapshot and log.
#[test]
fn an_unfinished_sled_snapshot_neither_fails_verify_nor_costs_a_rebuild() {
    let dir = tempfile::tempdir().unwrap();
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    fill(&s, 0, 10);
    // Entries of the cache tree do not come from the log: a rebuild drops them.
    s.index().put_cache("snap", b"k", b"v").unwrap();
    let c = count(&s, "s1");
    s.close().unwrap();
    // What a kill in the middle of sled's snapshot write leaves: a name that sorts
    // after every finished snapshot, and bytes that fail sled's checksum.
    let unfinished = dir
        .path()
        .join(INDEX_DIR)
        .join(INDEX_SLED_DIR)
        .join("snap.FFFFFFFFFFFFFFFF.generating");
    std::fs::write(&unfinished, vec![0x5Au8; 100]).unwrap();

    let v = verify(dir.path(), opts(&ix)).unwrap();
    assert!(v.ok, "{v:?}");
    assert!(matches!(v.index, IndexCheck::Checked { .. }), "{v:?}");
    assert!(unfinished.exists(), "verify repairs only its private copy");

    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    assert!(!unfinished.exists());
    assert_eq!(
        s.index().get_cache("snap", b"k").unwrap(),
        Some(b"v".to_vec()),
        "the index was not rebuilt"
    );
    assert_eq!(count(&s, "s1"), c);
}

/// An index sled cannot open at all is rebuilt by the next open: verify reports it as
/// the index's state, not as a problem of the store.
#[test]
fn an_unreadable_index_is_reported_and_rebuilt_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    fill(&s, 0, 10);
    let c = count(&s, "s1");
    s.close().unwrap();
    // A finished snapshot name with bytes that fail sled's checksum.
    std::fs::write(
        dir.path()
            .join(INDEX_DIR)
            .join(INDEX_SLED_DIR)
            .join("snap.FFFFFFFFFFFFFFFF"),
        vec![0x5Au8; 100],
    )
    .unwrap();
    let v = verify(dir.path(), opts(&ix)).unwrap();
    assert!(v.ok, "{v:?}");
    assert!(v.errors.is_empty(), "{v:?}");
    assert!(
        matches!(&v.index, IndexCheck::Unreadable { problem } if !problem.is_empty()),
        "{v:?}"
    );
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    assert_eq!(count(&s, "s1"), c);
    drop(s);
    let v = verify(dir.path(), opts(&ix)).unwrap();
    assert!(matches!(v.index, IndexCheck::Checked { .. }), "{v:?}");
}

/// One indexer call: the commit's seq, the indexer, the calling thread.
type Call = (u64, &'static str, std::thread::ThreadId);

/// Records which indexer saw which commit, on which thread, in call order.
struct CallLog {
    name: &'static str,
    calls: Arc<std::sync::Mutex<Vec<Call>>>,
}

impl Indexer for CallLog {
    fn name(&self) -> &'static str {
        self.name
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, _: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        self.calls
            .lock()
            .unwrap()
            .push((c.info.seq, self.name, std::thread::current().id()));
        Ok(())
    }
}

/// The order the `Indexer` trait promises (indexers may share work done
/// for one commit on it): a commit's indexers are called one after the
/// other in registration order, on one thread, before the next commit's,
/// in seq order; for group commits of many writers and for a rebuild.
#[test]
fn a_commits_indexers_run_back_to_back_in_registration_order() {
    let dir = tempfile::tempdir().unwrap();
    let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
    let opts = || {
        test_opts()
            .indexer(Arc::new(CallLog {
                name: "first",
                calls: calls.clone(),
            }))
            .indexer(Arc::new(CallLog {
                name: "second",
                calls: calls.clone(),
            }))
    };
    let check = |what: &str, n: u64| {
        let calls = std::mem::take(&mut *calls.lock().unwrap());
        assert_eq!(calls.len() as u64, 2 * n, "{what}");
        for (i, pair) in calls.chunks(2).enumerate() {
            assert_eq!(pair[0].0, i as u64 + 1, "{what}: {calls:?}");
            assert_eq!(
                (pair[0].0, pair[0].1, pair[1].1),
                (pair[1].0, "first", "second"),
                "{what}: {calls:?}"
            );
            assert_eq!(pair[0].2, pair[1].2, "{what}: one thread per commit");
        }
    };
    {
        let s = Arc::new(Store::open(dir.path(), opts()).unwrap());
        // Sixteen writers: commits land in groups, some prepared on the
        // index thread.
        let threads: Vec<_> = (0..16)
            .map(|w| {
                let s = s.clone();
                std::thread::spawn(move || {
                    for v in 0..25u64 {
                        let expected = match v {
                            0 => ExpectedVersion::NoStream,
                            _ => ExpectedVersion::Exact(v),
                        };
                        committed(s.append(commit(&format!("w{w}"), expected, b"x")).unwrap());
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        check("appends", 400);
    }
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    let s = Store::open(dir.path(), opts().index_from_log(true)).unwrap();
    check("rebuild", 400);
    drop(s);
}

/// Each stream's versions and payloads as the log has them.
fn all_streams(s: &Store) -> Vec<(String, Vec<Vec<u8>>)> {
    let mut streams = s.streams().unwrap();
    streams.sort();
    streams
        .into_iter()
        .map(|(name, _)| {
            let commits = s.read_stream(&name, 1, usize::MAX).unwrap();
            let payloads = commits
                .iter()
                .map(|c| c.events[0].payload.clone())
                .collect();
            (name, payloads)
        })
        .collect()
}

/// Damage of `index/db` for `seed`: a single bit flip, or an 8-byte burst of noise.
fn damage_index_db(path: &Path, seed: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let at = (next() % bytes.len() as u64) as usize;
    if seed.is_multiple_of(2) {
        bytes[at] ^= 1 << (next() % 8);
    } else {
        for b in bytes.iter_mut().skip(at).take(8) {
            *b = next() as u8;
        }
    }
    std::fs::write(path, bytes).unwrap();
}

/// Bit flips and bursts in `index/db` (sled panicked inside verify and every writer open
/// on some, "tried to serialize Uninitialized"): verify and an owner open must return,
/// never panic, and the open must answer exactly as the log says. Prints its seeds. The
/// panic itself is caught at the index's boundary; `index::tests` forces one there.
#[test]
fn a_damaged_index_file_is_rebuilt_never_a_panic() {
    let base = tempfile::tempdir().unwrap();
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    let s = Store::open(base.path(), opts(&ix)).unwrap();
    fill(&s, 0, 3000);
    let expected = all_streams(&s);
    s.close().unwrap();
    let seeds = std::env::var("SPOOL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse::<u64>().ok())
        .map_or(0..40, |s| s..s + 1);
    for seed in seeds {
        eprintln!("index damage seed {seed}");
        let dir = tempfile::tempdir().unwrap();
        copy_dir(base.path(), dir.path());
        damage_index_db(
            &dir.path().join(INDEX_DIR).join(INDEX_SLED_DIR).join("db"),
            seed,
        );
        let v = std::panic::catch_unwind(|| verify(dir.path(), opts(&ix)));
        let v = v.unwrap_or_else(|_| panic!("seed {seed}: verify panicked"));
        v.unwrap_or_else(|e| panic!("seed {seed}: verify failed: {e}"));
        let opened = std::panic::catch_unwind(|| {
            let s = Store::open(dir.path(), opts(&ix))?;
            let got = all_streams(&s);
            s.close()?;
            Ok::<_, Error>(got)
        });
        let got = opened
            .unwrap_or_else(|_| panic!("seed {seed}: the open panicked"))
            .unwrap_or_else(|e| panic!("seed {seed}: the open failed: {e}"));
        assert!(got == expected, "seed {seed}: answers differ from the log");
        let v = verify(dir.path(), opts(&ix)).unwrap();
        assert!(v.ok, "seed {seed}: {v:?}");
    }
}

/// Found on a full disk: a move into sled cut by ENOSPC left thousands of consecutive
/// versions missing from a published index, and every later open accepted it (it
/// checked only the applied mark). An open checks the index against the log (the last
/// version of every full 64-version block, and every stream's last version), finds a
/// gap and rebuilds: every answer is the log's again.
#[test]
fn a_gap_in_the_index_is_found_by_the_next_open_and_rebuilt() {
    let dir = tempfile::tempdir().unwrap();
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    let s = Store::open(dir.path(), opts(&ix)).unwrap();
    fill(&s, 0, 1200);
    let expected = all_streams(&s);
    s.close().unwrap();
    // Take one block of versions out of the index (stream "s2", versions 65..=128)
    // and, in another copy, the last block of stream "s1", as a move that failed
    // part way would leave them.
    for (stream, block) in [("s2", 1u64), ("s1", 4u64)] {
        let copy = tempfile::tempdir().unwrap();
        copy_dir(dir.path(), copy.path());
        {
            // The delta over the close's checkpoint (see `index/delta.rs`) hides the
            // block: a removal under a base is stored as the tag 1 alone.
            let db = open_sled(&copy.path().join(INDEX_DIR).join(INDEX_SLED_DIR));
            let mut key = b"\x01v".to_vec();
            key.push(stream.len() as u8);
            key.extend_from_slice(stream.as_bytes());
            key.extend_from_slice(&block.to_be_bytes());
            assert!(
                db.insert(&key, &[1u8][..]).unwrap().is_none(),
                "block {block} of {stream} already in the delta"
            );
            db.flush().unwrap();
        }
        let s = Store::open(copy.path(), opts(&ix)).unwrap();
        assert!(
            all_streams(&s) == expected,
            "{stream}: answers differ from the log"
        );
        drop(s);
        let v = verify(copy.path(), opts(&ix)).unwrap();
        assert!(v.ok, "{stream}: {v:?}");
    }
}

/// sled refuses a page cache under 256 bytes (it panics): a smaller setting is raised
/// to `INDEX_CACHE_BYTES_MIN`, and an index with the smallest cache answers as any.
#[test]
fn an_index_cache_setting_below_the_minimum_is_raised_to_it() {
    let dir = tempfile::tempdir().unwrap();
    let ix = Arc::new(EventCounter {
        version: AtomicU32::new(1),
    });
    // `fill`'s events of stream `s0` among its first `n` commits.
    let want = |n: u64| {
        (0..n)
            .filter(|i| i % 4 == 0)
            .map(|i| i % 3 + 1)
            .sum::<u64>()
    };
    for round in 0..2u64 {
        let s = Store::open(dir.path(), opts(&ix).index_cache_bytes_max(0)).unwrap();
        fill(&s, round * 500, (round + 1) * 500);
        assert_eq!(count(&s, "s0"), Some(want((round + 1) * 500)));
        s.close().unwrap();
    }
    let small = opts(&ix).index_cache_bytes_max(INDEX_CACHE_BYTES_MIN);
    let s = Store::open(dir.path(), small).unwrap();
    assert_eq!(count(&s, "s0"), Some(want(1000)));
}
