use crate::common;
use common::*;
use spool_engine::*;

#[test]
fn append_read_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), small_opts()).unwrap();
    let a = committed(
        s.append(commit("a", ExpectedVersion::NoStream, b"one"))
            .unwrap(),
    );
    assert_eq!((a.version, a.seq), (1, 1));
    let b = committed(
        s.append(commit("a", ExpectedVersion::Exact(1), b"two"))
            .unwrap(),
    );
    assert_eq!((b.version, b.seq), (2, 2));
    let c = committed(
        s.append(commit("b", ExpectedVersion::Any, b"three"))
            .unwrap(),
    );
    assert_eq!((c.version, c.seq), (1, 3));
    assert_eq!(s.stream_version("a").unwrap(), Some(2));
    assert_eq!(s.stream_version("zz").unwrap(), None);
    let r = s.read_stream("a", 1, 10).unwrap();
    assert_eq!(r.len(), 2);
    assert_eq!(r[1].events[0].payload, b"two");
    assert_eq!(s.read_stream("a", 2, 10).unwrap().len(), 1);
    assert_eq!(s.read_stream("a", 1, 1).unwrap().len(), 1);
    assert_eq!(s.read_at(c.position).unwrap().info, c);
    // Many commits: rolls segments.
    for i in 0..200u64 {
        s.append(commit("big", ExpectedVersion::Exact(i), &[7u8; 100]))
            .unwrap();
    }
    assert!(s.stats().segments > 3, "{:?}", s.stats());
    let before = log_contents(&s);
    assert_eq!(before.len(), 203);
    s.close().unwrap();
    let s = Store::open(dir.path(), small_opts()).unwrap();
    assert_eq!(log_contents(&s), before);
    assert_eq!(s.stream_version("big").unwrap(), Some(200));
    // Pages across position blocks (64 versions each).
    let page: Vec<u64> = s
        .read_stream("big", 62, 5)
        .unwrap()
        .iter()
        .map(|c| c.info.version)
        .collect();
    assert_eq!(page, vec![62, 63, 64, 65, 66]);
    let tail: Vec<u64> = s
        .read_stream("big", 198, 10)
        .unwrap()
        .iter()
        .map(|c| c.info.version)
        .collect();
    assert_eq!(tail, vec![198, 199, 200]);
    assert!(s.read_stream("big", 201, 10).unwrap().is_empty());
    assert!(s.read_stream("big", 5, 0).unwrap().is_empty());
    assert_eq!(
        s.index().stream_position("big", 129).unwrap(),
        Some(s.read_stream("big", 129, 1).unwrap()[0].info.position)
    );
    assert_eq!(s.index().stream_position("big", 201).unwrap(), None);
    assert_eq!(s.last_seq(), 203);
    assert_eq!(
        s.streams().unwrap(),
        vec![("a".into(), 2), ("b".into(), 1), ("big".into(), 200)]
    );
    let from = s.scan(150).unwrap().next().unwrap().unwrap();
    assert_eq!(from.info.seq, 150);
    let d = committed(
        s.append(commit("a", ExpectedVersion::Exact(2), b"x"))
            .unwrap(),
    );
    assert_eq!((d.version, d.seq), (3, 204));
}

#[test]
fn conflicts_write_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    s.append(commit("a", ExpectedVersion::NoStream, b"1"))
        .unwrap();
    let o = s
        .append(commit("a", ExpectedVersion::NoStream, b"2"))
        .unwrap();
    assert_eq!(
        o,
        AppendOutcome::Conflict {
            expected: ExpectedVersion::NoStream,
            actual: Some(1)
        }
    );
    let o = s
        .append(commit("b", ExpectedVersion::Exact(3), b"2"))
        .unwrap();
    assert_eq!(
        o,
        AppendOutcome::Conflict {
            expected: ExpectedVersion::Exact(3),
            actual: None
        }
    );
    assert_eq!(s.last_seq(), 1);
}

#[test]
fn invalid_input() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    let e = s
        .append(NewCommit::new("a", ExpectedVersion::Any, vec![]))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    let e = s
        .append(commit("", ExpectedVersion::Any, b"x"))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    let e = s
        .append(commit(&"x".repeat(256), ExpectedVersion::Any, b"x"))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    let e = s
        .append(NewCommit::new(
            "a",
            ExpectedVersion::Any,
            vec![EventData::new("k".repeat(256), vec![])],
        ))
        .unwrap_err();
    assert!(matches!(e, Error::InvalidInput(_)), "{e}");
    assert_eq!(s.last_seq(), 0);
}

#[test]
fn idempotent_retry_also_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    let c = commit("a", ExpectedVersion::NoStream, b"1");
    let first = committed(s.append(c.clone()).unwrap());
    assert_eq!(
        s.append(c.clone()).unwrap(),
        AppendOutcome::AlreadyCommitted(first.clone())
    );
    let mut other = c.clone();
    other.stream = "b".into();
    assert!(matches!(
        s.append(other.clone()),
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(s.last_seq(), 1);
    drop(s);
    let s = Store::open(dir.path(), test_opts()).unwrap();
    assert_eq!(s.append(c).unwrap(), AppendOutcome::AlreadyCommitted(first));
    assert!(matches!(s.append(other), Err(Error::InvalidInput(_))));
    assert_eq!(s.last_seq(), 1);
}

/// `append_fresh` draws a new id for every commit and skips the retry lookup,
/// but still records the id: a later `append` with it is a retry, before and
/// after a reopen, while the commit is pending and once it is done.
#[test]
fn a_fresh_commits_id_is_new_and_a_retry_with_it_is_recognized() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    let mut ids = std::collections::HashSet::new();
    let mut infos = Vec::new();
    for v in 0..300u64 {
        let expected = if v == 0 {
            ExpectedVersion::NoStream
        } else {
            ExpectedVersion::Exact(v)
        };
        let info = committed(
            s.append_fresh("a", expected, vec![EventData::new("e", vec![v as u8])])
                .unwrap(),
        );
        assert_eq!(info.version, v + 1);
        assert_eq!(info.commit_id.get_version_num(), 4);
        assert!(ids.insert(info.commit_id), "a drawn id repeated");
        infos.push(info);
    }
    // The fence still holds.
    assert!(matches!(
        s.append_fresh(
            "a",
            ExpectedVersion::Exact(1),
            vec![EventData::new("e", vec![])]
        )
        .unwrap(),
        AppendOutcome::Conflict { .. }
    ));
    let retry = |s: &Store, info: &CommitInfo| {
        s.append(NewCommit {
            stream: "a".into(),
            expected: ExpectedVersion::Exact(info.version - 1),
            commit_id: info.commit_id,
            events: vec![EventData::new("e", vec![(info.version - 1) as u8])],
        })
        .unwrap()
    };
    for info in [&infos[0], &infos[150], &infos[299]] {
        assert_eq!(
            retry(&s, info),
            AppendOutcome::AlreadyCommitted(info.clone())
        );
    }
    assert_eq!(s.last_seq(), 300);
    drop(s);
    let s = Store::open(dir.path(), test_opts()).unwrap();
    for info in [&infos[0], &infos[299]] {
        assert_eq!(
            retry(&s, info),
            AppendOutcome::AlreadyCommitted(info.clone())
        );
    }
    assert_eq!(s.last_seq(), 300);
}

/// Closes `s` on another thread `ms` milliseconds after that thread started
/// (returns once it has).
fn close_after(s: Store, ms: u64) -> std::thread::JoinHandle<()> {
    let (tx, rx) = std::sync::mpsc::channel();
    let holder = std::thread::spawn(move || {
        tx.send(()).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(ms));
        s.close().unwrap();
    });
    rx.recv().unwrap();
    holder
}

/// Regression (a flaky `compact_cli` test): a store closed and reopened while
/// another thread spawned a child process found its own released lock still held
/// by the child's inherited descriptor until its `exec`. An open now waits up to
/// `LOCK_WAIT_MAX_MS` for a lock that is being released.
#[test]
fn an_open_waits_for_a_lock_that_is_being_released() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    s.append(commit("a", ExpectedVersion::NoStream, b"1"))
        .unwrap();
    // Well within the wait: the owner is on its way out.
    let holder = close_after(s, LOCK_WAIT_MAX_MS / 10);
    let reopened = Store::open(dir.path(), test_opts()).expect("the released lock is taken");
    assert_eq!(reopened.stream_version("a").unwrap(), Some(1));
    holder.join().unwrap();
}

/// `Options::lock_wait` sets how long an open waits for the owner lock: zero
/// reports `Locked` on the first attempt, and a wait longer than the default
/// outlasts an owner that closes after the default wait would have given up.
#[test]
fn the_lock_wait_is_an_option() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    s.append(commit("a", ExpectedVersion::NoStream, b"1"))
        .unwrap();
    let zero = Store::open(dir.path(), test_opts().lock_wait(std::time::Duration::ZERO));
    assert!(matches!(zero, Err(Error::Locked { .. })), "{zero:?}");
    // Past the default wait: an open with the default gets `Locked`.
    let holder = close_after(s, LOCK_WAIT_MAX_MS * 3 / 2);
    let waited = Store::open(
        dir.path(),
        test_opts().lock_wait(std::time::Duration::from_millis(LOCK_WAIT_MAX_MS * 20)),
    )
    .expect("the lock released within the longer wait is taken");
    assert_eq!(waited.stream_version("a").unwrap(), Some(1));
    holder.join().unwrap();
}

#[test]
fn locked_and_read_only() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts()).unwrap();
    s.append(commit("a", ExpectedVersion::NoStream, b"1"))
        .unwrap();
    match Store::open(dir.path(), test_opts()) {
        Err(Error::Locked { path }) => assert!(path.ends_with(LOCK_FILE)),
        other => panic!("expected Locked, got {other:?}"),
    }
    let ro = Store::open_read_only(dir.path(), test_opts()).unwrap();
    assert_eq!(ro.stream_version("a").unwrap(), Some(1));
    assert!(matches!(
        ro.append(commit("a", ExpectedVersion::Any, b"2")),
        Err(Error::ReadOnly)
    ));
    drop(ro);
    drop(s);
    // After the owner is gone, a new owner gets in.
    let s = Store::open(dir.path(), test_opts()).unwrap();
    assert_eq!(s.stream_version("a").unwrap(), Some(1));
}

#[test]
fn five_mib_payload_round_trips() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts().segment_bytes_max(1 << 20)).unwrap();
    let payload: Vec<u8> = (0..5 * 1024 * 1024u32)
        .map(|i| (i * 31 % 251) as u8)
        .collect();
    let info = committed(
        s.append(commit("big", ExpectedVersion::NoStream, &payload))
            .unwrap(),
    );
    s.append(commit("small", ExpectedVersion::NoStream, b"after"))
        .unwrap();
    assert_eq!(s.read_at(info.position).unwrap().events[0].payload, payload);
    drop(s);
    let s = Store::open(dir.path(), test_opts().segment_bytes_max(1 << 20)).unwrap();
    assert_eq!(
        s.read_stream("big", 1, 1).unwrap()[0].events[0].payload,
        payload
    );
    assert_eq!(
        s.read_stream("small", 1, 1).unwrap()[0].events[0].payload,
        b"after"
    );
    let too_big = vec![0u8; (RECORD_BYTES_MAX_DEFAULT + 1) as usize];
    assert!(matches!(
        s.append(commit("x", ExpectedVersion::Any, &too_big)),
        Err(Error::RecordTooLarge { .. })
    ));
}

#[test]
fn buffered_flush_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || small_opts().durability(Durability::Buffered);
    let s = Store::open(dir.path(), opts()).unwrap();
    for i in 0..50u64 {
        s.append(commit("a", ExpectedVersion::Exact(i), b"x"))
            .unwrap();
    }
    s.flush().unwrap();
    assert!(s.stats().fsyncs >= 1);
    s.close().unwrap();
    let s = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(s.stream_version("a").unwrap(), Some(50));
}

#[test]
fn retry_of_an_old_commit_in_a_long_stream_is_found() {
    // Commit ids live only in the stream's version blocks (64 versions per block):
    // a retry is found across blocks, memtable and sled, before and after reopen.
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), test_opts().durability(Durability::Buffered)).unwrap();
    let mut sent = Vec::new();
    for v in 0..5000u64 {
        let c = commit("long", ExpectedVersion::Exact(v), &v.to_le_bytes());
        let info = committed(s.append(c.clone()).unwrap());
        sent.push((c, info));
    }
    for i in [0usize, 3, 63, 64, 4095, 4999] {
        let (c, info) = &sent[i];
        assert_eq!(
            s.append(c.clone()).unwrap(),
            AppendOutcome::AlreadyCommitted(info.clone()),
            "version {}",
            i + 1
        );
    }
    drop(s);
    let s = Store::open(dir.path(), test_opts().durability(Durability::Buffered)).unwrap();
    for i in [0usize, 100, 4999] {
        let (c, info) = &sent[i];
        assert_eq!(
            s.append(c.clone()).unwrap(),
            AppendOutcome::AlreadyCommitted(info.clone())
        );
        let mut other = c.clone();
        other.stream = "elsewhere".into();
        assert!(matches!(s.append(other), Err(Error::InvalidInput(_))));
    }
    assert_eq!(s.last_seq(), 5000);
}

/// `visit_at` decodes in place exactly what `read_at` copies out: from sealed (mapped)
/// segments and the active one (read), records shorter and longer than one read-ahead,
/// several events, and after a reopen; a position holding no record is an error.
#[test]
fn visit_at_sees_what_read_at_reads() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || test_opts().durability(Durability::Buffered);
    let s = Store::open(dir.path(), opts()).unwrap();
    let mut positions = Vec::new();
    for i in 0..60u64 {
        // Sizes around the read-ahead (8 KiB) and the 64 KiB segments.
        let len = [10usize, 8 * 1024 - 40, 8 * 1024 + 100, 20_000, 300][(i % 5) as usize];
        let events = (0..=(i % 3))
            .map(|k| EventData::new(format!("kind{k}"), vec![(i + k) as u8; len]))
            .collect();
        let c = committed(
            s.append(NewCommit::new(
                format!("s{}", i % 2),
                ExpectedVersion::Any,
                events,
            ))
            .unwrap(),
        );
        positions.push(c.position);
    }
    let check = |s: &Store| {
        for &pos in &positions {
            let copied = s.read_at(pos).unwrap();
            let visited = s.visit_at(pos, |c| c.to_owned()).unwrap();
            assert_eq!(visited, copied, "{pos}");
            let first = s
                .visit_at(pos, |c| {
                    c.event(0).map(|e| (e.kind.to_string(), e.payload.len()))
                })
                .unwrap();
            assert_eq!(
                first,
                Some((
                    copied.events[0].kind.clone(),
                    copied.events[0].payload.len()
                ))
            );
        }
        // Spans: every record wholly inside is read from the span as `read_at` reads
        // it; one that is not (before the start, past the end, another segment) is
        // left to the caller.
        for (i, &from) in positions.iter().enumerate() {
            for len in [0u64, 100, 30_000, u64::MAX] {
                let span = s.read_span(from, len).unwrap();
                for &pos in &positions[i.saturating_sub(1)..] {
                    let got = span.visit(pos, |c| c.to_owned());
                    let whole = pos.segment == from.segment
                        && pos.offset >= from.offset
                        && pos.offset + u64::from(s.read_at(pos).unwrap().record_bytes)
                            <= from.offset.saturating_add(len);
                    match got {
                        Some(r) => {
                            assert!(whole || len == u64::MAX, "{pos} in {from}+{len}");
                            assert_eq!(r.unwrap(), s.read_at(pos).unwrap(), "{pos}");
                        }
                        None => assert!(!whole, "{pos} in {from}+{len}"),
                    }
                }
            }
        }
        let last = positions[positions.len() - 1];
        let nowhere = LogPosition {
            segment: last.segment,
            offset: last.offset + 1,
        };
        assert!(s.visit_at(nowhere, |_| ()).is_err());
    };
    assert!(s.stats().segments > 3, "{:?}", s.stats());
    check(&s);
    s.close().unwrap();
    let s = Store::open(dir.path(), opts()).unwrap();
    check(&s);
}

/// The writes a fresh store's creation makes, and its first segment's
/// length, under `durability` and `preallocate`.
fn creation_writes(durability: Durability, preallocate: Preallocate) -> (u64, u64) {
    use spool_engine::vfs::{FaultKind, FaultVfs, OsVfs};
    use std::sync::Arc;
    let dir = tempfile::tempdir().unwrap();
    let fv = FaultVfs::new(Arc::new(OsVfs));
    let opts = test_opts()
        .vfs(Arc::new(fv.clone()))
        .durability(durability)
        .preallocate(preallocate);
    let s = Store::open(dir.path(), opts).unwrap();
    let writes = fv.count(FaultKind::Write);
    s.append(commit("a", ExpectedVersion::NoStream, b"x"))
        .unwrap();
    s.close().unwrap();
    let seg = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|e| e == "seg"))
        .expect("a segment");
    (writes, std::fs::metadata(seg).unwrap().len())
}

#[test]
fn auto_preallocation_zero_fills_buffered_segments_too() {
    // `Auto` writes zeros over a new segment with either durability (the
    // buffered writer's `pwrite` then lands in existing pages and blocks);
    // `Sparse` only sets the length and writes the header.
    let (immediate, len_i) = creation_writes(Durability::Immediate, Preallocate::Auto);
    let (buffered, len_b) = creation_writes(Durability::Buffered, Preallocate::Auto);
    let (zero_fill, _) = creation_writes(Durability::Buffered, Preallocate::ZeroFill);
    let (sparse, len_s) = creation_writes(Durability::Buffered, Preallocate::Sparse);
    assert_eq!(
        buffered, immediate,
        "buffered Auto zero-fills like Immediate"
    );
    assert_eq!(buffered, zero_fill);
    assert!(
        sparse < buffered,
        "sparse creation wrote {sparse} times, zero-filled {buffered}"
    );
    // Every mode keeps the segment at its full preallocated length.
    assert_eq!(len_i, 64 * 1024);
    assert_eq!(len_b, len_i);
    assert_eq!(len_s, len_i);
}

/// `visit_stream` hands its function exactly the commits `read_stream` copies
/// out, in version order, across segments and batches of positions, and
/// stops where the function breaks.
#[test]
fn visit_stream_visits_what_read_stream_reads() {
    use std::ops::ControlFlow;
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), small_opts()).unwrap();
    for i in 0..1500u64 {
        s.append(commit("v", ExpectedVersion::Exact(i), &i.to_be_bytes()))
            .unwrap();
        if i % 7 == 0 {
            s.append(commit("other", ExpectedVersion::Any, b"x"))
                .unwrap();
        }
    }
    assert!(s.stats().segments > 3, "{:?}", s.stats());
    let cases = [
        (1, usize::MAX),
        (1, 1),
        (63, 5),
        (1000, 1024),
        (1499, 10),
        (1501, 10),
        (5, 0),
    ];
    for (from, limit) in cases {
        let read = s.read_stream("v", from, limit).unwrap();
        let mut visited = Vec::new();
        s.visit_stream("v", from, limit, |c| {
            visited.push(c.to_owned());
            ControlFlow::Continue(())
        })
        .unwrap();
        assert_eq!(visited, read, "from {from}, limit {limit}");
    }
    let mut seen = Vec::new();
    s.visit_stream("v", 1, usize::MAX, |c| {
        seen.push(c.version);
        match c.version {
            1100 => ControlFlow::Break(()),
            _ => ControlFlow::Continue(()),
        }
    })
    .unwrap();
    assert_eq!(seen, (1..=1100).collect::<Vec<u64>>());
    let mut absent = 0;
    s.visit_stream("absent", 1, 10, |_| {
        absent += 1;
        ControlFlow::Continue(())
    })
    .unwrap();
    assert_eq!(absent, 0);
}

/// A batch writes what appending its commits one by one writes, in one write
/// group across segment rolls; a batch with a commit that would not commit (a
/// conflict, a retry of a commit in the log), a commit id twice, an invalid
/// commit, or too many commits writes nothing.
#[test]
fn append_batch_writes_all_or_nothing_in_one_group() {
    let id = |n: u128| Uuid::from_u128(0x5eed_0000 + n);
    let c = |stream: &str, expected: ExpectedVersion, n: u128| NewCommit {
        stream: stream.into(),
        expected,
        commit_id: id(n),
        events: ev(&vec![n as u8; 300 + (n as usize * 37) % 500]),
    };
    let first = c("a", ExpectedVersion::NoStream, 0);
    let mut batch = Vec::new();
    for v in 1..40u64 {
        batch.push(c("a", ExpectedVersion::Exact(v), u128::from(v)));
        if v % 3 == 0 {
            batch.push(c("b", ExpectedVersion::Any, 1000 + u128::from(v)));
        }
    }
    let ts = |i: usize| 1_700_000_000_000 + i as i64;
    let pairs = |batch: &[NewCommit]| -> Vec<(NewCommit, Option<i64>)> {
        batch
            .iter()
            .enumerate()
            .map(|(i, c)| (c.clone(), Some(ts(i + 1))))
            .collect()
    };

    let one = tempfile::tempdir().unwrap();
    let s1 = Store::open(one.path(), small_opts()).unwrap();
    committed(s1.append_at(first.clone(), ts(0)).unwrap());
    let want: Vec<CommitInfo> = batch
        .iter()
        .enumerate()
        .map(|(i, c)| committed(s1.append_at(c.clone(), ts(i + 1)).unwrap()))
        .collect();

    let two = tempfile::tempdir().unwrap();
    let s2 = Store::open(two.path(), small_opts()).unwrap();
    committed(s2.append_at(first, ts(0)).unwrap());
    let nothing = |s: &Store, last: u64, got: BatchOutcome, index: usize| match got {
        BatchOutcome::Refused { index: i, outcome } => {
            assert_eq!(i, index, "{outcome:?}");
            assert_eq!(s.last_seq(), last, "nothing written");
            outcome
        }
        other => panic!("refused at {index} expected, got {other:?}"),
    };

    // A conflict, or a retry of a commit in the log, anywhere: nothing written.
    let mut conflict = batch.clone();
    conflict.insert(10, c("a", ExpectedVersion::Exact(2), 77));
    let o = nothing(&s2, 1, s2.append_batch(pairs(&conflict)).unwrap(), 10);
    assert!(
        matches!(
            o,
            AppendOutcome::Conflict {
                actual: Some(9),
                ..
            }
        ),
        "{o:?}"
    );
    let mut retry = batch.clone();
    retry.insert(30, c("a", ExpectedVersion::Exact(0), 0));
    let o = nothing(&s2, 1, s2.append_batch(pairs(&retry)).unwrap(), 30);
    assert!(matches!(o, AppendOutcome::AlreadyCommitted(i) if i.seq == 1));
    assert_eq!(s2.stats().write_groups, 1);

    // The whole batch: the log and infos of one-by-one appends, one group.
    let before = s2.stats();
    let BatchOutcome::Committed(got) = s2.append_batch(pairs(&batch)).unwrap() else {
        panic!("the batch was refused")
    };
    let after = s2.stats();
    assert_eq!(got, want);
    assert_eq!(after.write_groups - before.write_groups, 1);
    assert!(
        after.segments_created > before.segments_created,
        "{after:?}"
    );
    assert_eq!(log_contents(&s2), log_contents(&s1));

    // Invalid batches fail before any write.
    let last = s2.last_seq();
    let bad = vec![
        (c("a", ExpectedVersion::Any, 5000), None),
        (c("", ExpectedVersion::Any, 5001), None),
    ];
    assert!(matches!(s2.append_batch(bad), Err(Error::InvalidInput(_))));
    let twice = vec![
        (c("t", ExpectedVersion::Any, 6000), None),
        (c("u", ExpectedVersion::Any, 6000), None),
    ];
    assert!(matches!(
        s2.append_batch(twice),
        Err(Error::InvalidInput(_))
    ));
    let many = (0..=APPEND_BATCH_COMMITS_MAX as u128)
        .map(|n| (c("m", ExpectedVersion::Any, 9000 + n), None))
        .collect();
    assert!(matches!(s2.append_batch(many), Err(Error::InvalidInput(_))));
    assert_eq!(s2.last_seq(), last);
    assert_eq!(
        s2.append_batch(Vec::new()).unwrap(),
        BatchOutcome::Committed(Vec::new())
    );

    let contents = log_contents(&s2);
    s2.close().unwrap();
    let s2 = Store::open(two.path(), small_opts()).unwrap();
    assert_eq!(log_contents(&s2), contents);
    assert_eq!(s2.stream_version("a").unwrap(), Some(40));
}
