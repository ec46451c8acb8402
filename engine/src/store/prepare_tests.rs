use super::*;
use crate::index::IndexBatch;
use crate::vfs::{FaultKind, FaultVfs, OsVfs};
use crate::Indexer;
use std::time::Duration;

const LINED_UP: usize = 8;

/// Writes one key per commit (its seq) after checking that the previous commit's
/// key is there: a group prepared against an index missing an earlier group fails.
/// Panics on a commit to the stream "boom".
struct Chain;

impl Indexer for Chain {
    fn name(&self) -> &'static str {
        "chain"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        assert!(c.info.stream != "boom", "the chain indexer met stream boom");
        let seq = c.info.seq;
        if seq > 1 && batch.get(&(seq - 1).to_be_bytes())?.is_none() {
            return Err(IndexError::indexer(
                "chain",
                format!(
                    "commit {seq} prepared before commit {} was visible",
                    seq - 1
                ),
            ));
        }
        batch.insert(&seq.to_be_bytes(), c.info.stream.as_bytes());
        Ok(())
    }
}

fn open(dir: &Path) -> (Arc<Store>, FaultVfs) {
    open_polling(dir, Options::default().index_thread_poll)
}

fn open_polling(dir: &Path, poll: Duration) -> (Arc<Store>, FaultVfs) {
    let vfs = FaultVfs::new(Arc::new(OsVfs));
    let opts = Options::default()
        .durability(Durability::Immediate)
        .segment_bytes_max(1 << 20)
        .vfs(Arc::new(vfs.clone()))
        .next_segment(NextSegment::Inline)
        .index_thread_poll(poll)
        .indexer(Arc::new(Chain));
    (Arc::new(Store::open(dir, opts).unwrap()), vfs)
}

/// With the longest poll window allowed: a commit up to 10 ms after the one
/// before still counts as back to back, even on a loaded machine.
fn open_polling_longest(dir: &Path) -> (Arc<Store>, FaultVfs) {
    open_polling(dir, Duration::from_micros(crate::INDEX_THREAD_POLL_MAX_US))
}

/// A lone writer appending back to back: its one-commit groups go to the index
/// thread, which polls for them. The window is the longest allowed, so a commit
/// up to 10 ms after the one before keeps the thread polling even on a loaded
/// machine; no assertion counts on more than one such pair in 200 commits.
#[test]
fn a_lone_writers_back_to_back_groups_are_prepared_during_their_fdatasync() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _vfs) = open_polling_longest(dir.path());
    let n = 200u64;
    for i in 0..n {
        append(&s, &format!("s{i}")).unwrap();
    }
    let st = s.stats();
    assert_eq!(st.write_groups, n, "{st:?}");
    assert!(st.groups_prepared_ahead >= 1, "{st:?}");
    assert!(st.groups_polled >= 1, "{st:?}");
    assert!(st.groups_polled <= st.groups_prepared_ahead, "{st:?}");
    // Each commit was prepared against an index holding the one before (the
    // chain indexer fails otherwise) and is visible once acknowledged.
    assert_eq!(s.index().applied_seq().unwrap(), n);
    for seq in 1..=n {
        assert!(
            s.index()
                .get("chain", &seq.to_be_bytes())
                .unwrap()
                .is_some(),
            "{seq}"
        );
    }
}

/// A failed fdatasync of a lone writer's group, whichever thread prepares it:
/// nothing of the group is published and the store refuses writes.
#[test]
fn a_lone_writers_failed_fdatasync_publishes_nothing_while_the_thread_polls() {
    let dir = tempfile::tempdir().unwrap();
    let (s, vfs) = open_polling_longest(dir.path());
    for i in 0..5 {
        append(&s, &format!("s{i}")).unwrap();
    }
    vfs.fail_nth(FaultKind::Sync, 1, false);
    assert!(matches!(append(&s, "lost"), Err(Error::Io { .. })));
    assert!(s.is_poisoned());
    assert_eq!(s.index().applied_seq().unwrap(), 5);
    assert!(s
        .index()
        .get("chain", &6u64.to_be_bytes())
        .unwrap()
        .is_none());
    assert!(s.read_stream("lost", 1, 10).unwrap().is_empty());
    assert!(matches!(append(&s, "later"), Err(Error::Poisoned { .. })));
}

#[test]
fn without_a_poll_window_a_lone_writer_indexes_its_own_groups() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _vfs) = open_polling(dir.path(), Duration::ZERO);
    for i in 0..20 {
        append(&s, &format!("s{i}")).unwrap();
    }
    let st = s.stats();
    assert_eq!(
        (st.groups_prepared_ahead, st.groups_polled),
        (0, 0),
        "{st:?}"
    );
    assert!(lock(&s.inner.w).preparer.is_none());
    assert_eq!(s.index().applied_seq().unwrap(), 20);
}

/// A group of at least `PREPARE_THREAD_BYTES_MIN` bytes goes to the index thread
/// even alone and without a poll window (a fork's one large commit).
#[test]
fn a_large_group_is_prepared_during_its_fdatasync_even_alone() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _vfs) = open_polling(dir.path(), Duration::ZERO);
    append(&s, "small").unwrap();
    append_big(&s, "big");
    let st = s.stats();
    assert_eq!(
        (st.groups_prepared_ahead, st.groups_polled),
        (1, 0),
        "{st:?}"
    );
    assert_eq!(s.index().applied_seq().unwrap(), 2);
    assert_eq!(s.read_stream("big", 1, 10).unwrap().len(), 1);
}

/// After a large group the index thread sleeps instead of polling: the small
/// group right after it reaches the thread by a wake-up, not a poll (with a poll
/// after every group of one commit, it was taken polling).
#[test]
fn the_index_thread_does_not_poll_after_a_large_group() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _vfs) = open_polling_longest(dir.path());
    append(&s, "small").unwrap();
    append_big(&s, "big");
    append(&s, "after").unwrap();
    let st = s.stats();
    assert!(st.groups_prepared_ahead >= 1, "{st:?}");
    assert_eq!(st.groups_polled, 0, "{st:?}");
    assert_eq!(s.index().applied_seq().unwrap(), 3);
}

fn append_big(s: &Store, stream: &str) {
    let big = vec![7u8; PREPARE_THREAD_BYTES_MIN];
    let r = s.append(NewCommit::new(
        stream,
        ExpectedVersion::Exact(0),
        vec![EventData::new("e", big)],
    ));
    assert!(matches!(r, Ok(AppendOutcome::Committed(_))), "{r:?}");
}

/// Sixteen durable writers, each waiting for the group that acknowledges its commit
/// or leading the next one: every one of them is woken, every commit is
/// indexed in seq order (the chain indexer checks), and each stream has all of its
/// versions. A wake-up that went missing would leave a writer waiting forever: the
/// test fails on a deadline instead of hanging.
#[test]
fn every_waiting_writer_is_woken_by_the_group_that_acknowledges_it() {
    const WRITERS: usize = 16;
    const COMMITS: u64 = 40;
    let dir = tempfile::tempdir().unwrap();
    let (s, _vfs) = open(dir.path());
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let threads: Vec<_> = (0..WRITERS)
        .map(|w| {
            let s = s.clone();
            let done_tx = done_tx.clone();
            std::thread::spawn(move || {
                let stream = format!("w{w}");
                for v in 0..COMMITS {
                    let r = s.append(NewCommit::new(
                        stream.as_str(),
                        ExpectedVersion::Exact(v),
                        vec![EventData::new("e", vec![w as u8; 64])],
                    ));
                    assert!(matches!(r, Ok(AppendOutcome::Committed(_))), "{r:?}");
                }
                done_tx.send(w).unwrap();
            })
        })
        .collect();
    drop(done_tx);
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    for _ in 0..WRITERS {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match done_rx.recv_timeout(left) {
            Ok(_) => {}
            Err(e) => panic!("a writer never finished ({e}): a wake-up went missing"),
        }
    }
    for t in threads {
        t.join().unwrap();
    }
    let total = WRITERS as u64 * COMMITS;
    assert_eq!(s.last_seq(), total);
    assert_eq!(s.index().applied_seq().unwrap(), total);
    for w in 0..WRITERS {
        assert_eq!(s.stream_version(&format!("w{w}")).unwrap(), Some(COMMITS));
    }
    assert!(!s.is_poisoned());
}

/// A poll window past the limit is clamped to it.
#[test]
fn the_poll_window_is_clamped() {
    let o = Options::default().index_thread_poll(Duration::from_secs(5));
    assert_eq!(
        o.index_thread_poll_window(),
        Duration::from_micros(crate::INDEX_THREAD_POLL_MAX_US)
    );
}

#[test]
fn flush_index_leaves_nothing_in_memory_and_the_applied_marker_in_sled() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _vfs) = open(dir.path());
    for i in 0..20 {
        append(&s, &format!("s{i}")).unwrap();
    }
    let index = &s.inner.index;
    assert!(index.mem_is_empty_for_tests() == Some(false));
    s.flush_index().unwrap();
    assert_eq!(index.mem_is_empty_for_tests(), Some(true));
    assert_eq!(index.sled_applied_seq_for_tests(), Some(20));
    // Everything stays readable, and appends go on.
    assert_eq!(
        index.get("chain", &20u64.to_be_bytes()).unwrap().as_deref(),
        Some(&b"s19"[..])
    );
    append(&s, "after").unwrap();
    assert_eq!(index.applied_seq().unwrap(), 21);
}

#[test]
fn flush_index_on_a_poisoned_store_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (s, vfs) = open(dir.path());
    append(&s, "a").unwrap();
    vfs.fail_nth(FaultKind::Sync, 1, false);
    assert!(append(&s, "b").is_err());
    assert!(matches!(s.flush_index(), Err(Error::Poisoned { .. })));
}

fn append(s: &Store, stream: &str) -> Result<AppendOutcome, Error> {
    s.append(NewCommit::new(
        stream,
        ExpectedVersion::Exact(0),
        vec![EventData::new("e", stream.as_bytes().to_vec())],
    ))
}

/// Commit 1 to stream "first", held in its fdatasync until `streams` (eight) have
/// lined up behind it; `before_resume` runs then. Returns both outcomes.
#[allow(clippy::type_complexity)]
fn line_up(
    s: &Arc<Store>,
    vfs: &FaultVfs,
    streams: [&'static str; LINED_UP],
    before_resume: impl FnOnce(),
) -> (
    Result<AppendOutcome, Error>,
    Vec<Result<AppendOutcome, Error>>,
) {
    vfs.pause_nth(FaultKind::Sync, 1);
    let first = {
        let s = s.clone();
        std::thread::spawn(move || append(&s, "first"))
    };
    assert!(
        vfs.wait_paused(Duration::from_secs(30)),
        "the first fdatasync never came"
    );
    let rest: Vec<_> = streams
        .into_iter()
        .map(|name| {
            let s = s.clone();
            std::thread::spawn(move || append(&s, name))
        })
        .collect();
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while lock(&s.inner.w).batch.len() < LINED_UP {
        assert!(
            std::time::Instant::now() < deadline,
            "the writers never lined up"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    before_resume();
    vfs.resume();
    let first = first.join().unwrap();
    let rest = rest.into_iter().map(|t| t.join().unwrap()).collect();
    (first, rest)
}

/// The seqs of the test's commits (1 to 9) whose chain key the index shows.
fn indexed(s: &Store) -> Vec<u64> {
    (1..=1 + LINED_UP as u64)
        .filter(|seq| {
            s.index()
                .get("chain", &seq.to_be_bytes())
                .unwrap()
                .is_some()
        })
        .collect()
}

const STREAMS: [&str; LINED_UP] = ["s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"];

#[test]
fn a_durable_group_is_prepared_during_its_fdatasync_and_published_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let (s, vfs) = open(dir.path());
    let (first, rest) = line_up(&s, &vfs, STREAMS, || {});
    assert!(
        matches!(first, Ok(AppendOutcome::Committed(_))),
        "{first:?}"
    );
    for r in &rest {
        assert!(matches!(r, Ok(AppendOutcome::Committed(_))), "{r:?}");
    }
    // The second group went through the index thread, which is kept for the next.
    assert!(lock(&s.inner.w).preparer.is_some());
    assert_eq!(s.stats().write_groups, 2);
    assert_eq!(indexed(&s), (1..=1 + LINED_UP as u64).collect::<Vec<_>>());
    for name in STREAMS {
        assert_eq!(s.read_stream(name, 1, 10).unwrap().len(), 1, "{name}");
    }
    // A reopen finds the same index (the applied seq covers the group).
    assert_eq!(s.index().applied_seq().unwrap(), 1 + LINED_UP as u64);
}

#[test]
fn a_group_whose_fdatasync_fails_publishes_nothing_it_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let (s, vfs) = open(dir.path());
    // The paused call is the first group's; the next fdatasync is the second's.
    let (first, rest) = line_up(&s, &vfs, STREAMS, || {
        vfs.fail_nth(FaultKind::Sync, 1, false)
    });
    assert!(
        matches!(first, Ok(AppendOutcome::Committed(_))),
        "{first:?}"
    );
    assert!(rest.iter().all(Result::is_err), "{rest:?}");
    assert!(
        rest.iter().any(|r| matches!(r, Err(Error::Io { .. }))),
        "{rest:?}"
    );
    assert!(s.is_poisoned());
    assert_eq!(vfs.injected(), 1);
    // The index thread prepared the group (the chain indexer saw commit 1), but
    // none of it is visible: not its keys, not its versions, not its applied seq.
    assert_eq!(indexed(&s), vec![1]);
    for name in STREAMS {
        assert!(s.read_stream(name, 1, 10).unwrap().is_empty(), "{name}");
    }
    assert_eq!(s.index().applied_seq().unwrap(), 1);
    assert!(matches!(append(&s, "later"), Err(Error::Poisoned { .. })));
}

/// Found while moving the indexers to the index thread: a panicking indexer
/// unwound through the leader, which never gave up leadership, so every later
/// append waited forever.
#[test]
fn a_panicking_indexer_fails_the_append_instead_of_stranding_the_writers() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _vfs) = open(dir.path());
    assert!(matches!(
        append(&s, "first"),
        Ok(AppendOutcome::Committed(_))
    ));
    let r = append(&s, "boom");
    assert!(
        matches!(&r, Err(Error::Index(IndexError::Indexer { name, message })) if name == "chain" && message.contains("panicked on commit 2")),
        "{r:?}"
    );
    assert!(s.is_poisoned());
    assert!(matches!(append(&s, "later"), Err(Error::Poisoned { .. })));
    assert_eq!(s.index().applied_seq().unwrap(), 1);
}

#[test]
fn an_indexer_panicking_on_the_index_thread_fails_the_group_and_poisons() {
    let dir = tempfile::tempdir().unwrap();
    let (s, vfs) = open(dir.path());
    let mut streams = STREAMS;
    streams[3] = "boom";
    let (first, rest) = line_up(&s, &vfs, streams, || {});
    assert!(
        matches!(first, Ok(AppendOutcome::Committed(_))),
        "{first:?}"
    );
    let panicked = rest
        .iter()
        .filter(|r| matches!(r, Err(Error::Index(IndexError::Indexer { name, message })) if name == "chain" && message.contains("panicked") && message.contains("boom")))
        .count();
    assert_eq!(panicked, 1, "{rest:?}");
    assert!(
        rest.iter()
            .all(|r| matches!(r, Err(Error::Poisoned { .. } | Error::Index(_)))),
        "{rest:?}"
    );
    assert!(s.is_poisoned());
    assert_eq!(s.index().applied_seq().unwrap(), 1);
    assert_eq!(indexed(&s), vec![1]);
}
