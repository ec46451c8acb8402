use super::*;

fn ev(i: u64) -> Vec<EventData> {
    vec![EventData::new("e", i.to_le_bytes().to_vec())]
}

/// The active segment is read through a map of its acknowledged prefix once the end
/// has moved a slack past the map; reads after the map, and a record that straddles
/// its end, go to the file; a sealed segment is then mapped whole.
#[test]
fn the_active_segment_is_read_through_a_map_of_its_acknowledged_prefix() {
    use crate::segment::ACTIVE_MAP_SLACK_BYTES;
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default()
        .durability(Durability::Buffered)
        .segment_bytes_max(8 << 20);
    let s = Store::open(dir.path(), opts).unwrap();
    // Segments grow from 1 MiB: fill segments 1 to 3 so the one under test (id 4) has
    // the full 8 MiB.
    let mut f = 0;
    while s
        .inner
        .segments
        .read()
        .unwrap()
        .values()
        .last()
        .unwrap()
        .capacity
        < 8 << 20
    {
        let o = s
            .append(NewCommit::new(
                "fill",
                ExpectedVersion::Exact(f),
                vec![EventData::new("e", vec![0; 256 << 10])],
            ))
            .unwrap();
        assert!(matches!(o, AppendOutcome::Committed(_)));
        f += 1;
    }
    let mut written: Vec<(LogPosition, Vec<u8>)> = Vec::new();
    fn append(s: &Store, i: u64, written: &mut Vec<(LogPosition, Vec<u8>)>) {
        // 3,000 to 5,000 bytes, so records straddle page and map boundaries.
        let len = 3000 + (i * 7919 % 2000) as usize;
        let payload: Vec<u8> = (0..len).map(|j| (i as usize * 31 + j) as u8).collect();
        let o = s
            .append(NewCommit::new(
                "s",
                ExpectedVersion::Exact(i),
                vec![EventData::new("e", payload.clone())],
            ))
            .unwrap();
        let AppendOutcome::Committed(info) = o else {
            panic!("append {i}: {o:?}")
        };
        written.push((info.position, payload));
    }
    let check = |s: &Store, written: &[(LogPosition, Vec<u8>)]| {
        for (i, (pos, payload)) in written.iter().enumerate() {
            let got = s
                .visit_at(*pos, |c| c.event(0).map(|e| e.payload.to_vec()))
                .unwrap();
            assert_eq!(got.as_deref(), Some(&payload[..]), "record {i} at {pos}");
        }
    };
    let active = |s: &Store| s.segment_at(written_first(s)).unwrap();
    fn written_first(s: &Store) -> LogPosition {
        LogPosition {
            segment: *s.inner.segments.read().unwrap().keys().nth(3).unwrap(),
            offset: SEGMENT_HEADER_BYTES,
        }
    }
    // Under the slack: reads go to the file, nothing is mapped.
    let mut i = 0u64;
    while active(&s).end.load(Ordering::Acquire) < ACTIVE_MAP_SLACK_BYTES / 2 {
        append(&s, i, &mut written);
        i += 1;
    }
    check(&s, &written);
    assert_eq!(active(&s).map_state(), None);
    // Past it: the first read maps exactly the acknowledged prefix.
    while active(&s).end.load(Ordering::Acquire) < ACTIVE_MAP_SLACK_BYTES * 3 / 2 {
        append(&s, i, &mut written);
        i += 1;
    }
    let end = active(&s).end.load(Ordering::Acquire);
    check(&s, &written);
    assert_eq!(active(&s).map_state(), Some((end, false)));
    // Records after the map (its end is a record boundary, in the middle of a page
    // the writer goes on writing) are read from the file, as is a span reaching past
    // the map; the map stays until the next slack.
    let before = written.len();
    for _ in 0..20 {
        append(&s, i, &mut written);
        i += 1;
    }
    check(&s, &written);
    assert_eq!(active(&s).map_state(), Some((end, false)));
    let span = s.read_span(written[before - 1].0, 64 << 10).unwrap();
    for (pos, payload) in &written[before - 1..before + 5] {
        let got = span
            .visit(*pos, |c| c.event(0).map(|e| e.payload.to_vec()))
            .unwrap()
            .unwrap();
        assert_eq!(got.as_deref(), Some(&payload[..]), "span read at {pos}");
    }
    // Past the next slack: mapped again, longer.
    while active(&s).end.load(Ordering::Acquire) < end + ACTIVE_MAP_SLACK_BYTES + (end / 4) {
        append(&s, i, &mut written);
        i += 1;
    }
    let end2 = active(&s).end.load(Ordering::Acquire);
    check(&s, &written);
    assert_eq!(active(&s).map_state(), Some((end2, false)));
    // Sealed (the log moved on to the next segment): the next read maps it whole.
    let first = written_first(&s).segment;
    while written.last().unwrap().0.segment == first {
        append(&s, i, &mut written);
        i += 1;
    }
    check(&s, &written);
    let sealed = s.segment_at(written_first(&s)).unwrap();
    let (len, whole) = sealed.map_state().unwrap();
    assert!(
        whole && len == 8 << 20,
        "sealed map: {len} bytes, whole {whole}"
    );
    drop(s);
    // And reopened, everything reads back the same.
    let s = Store::open(
        dir.path(),
        Options::default()
            .durability(Durability::Buffered)
            .segment_bytes_max(8 << 20),
    )
    .unwrap();
    check(&s, &written);
}

/// A failed map of the active segment's prefix fails that read with an I/O error
/// naming the segment's full path, poisons nothing (reads never do), and the next read maps it.
#[test]
fn a_failed_prefix_map_fails_the_read_and_the_next_read_maps() {
    use crate::vfs::{FaultKind, FaultVfs, OsVfs};
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultVfs::new(Arc::new(OsVfs));
    let s = Store::open(
        dir.path(),
        Options::default()
            .durability(Durability::Buffered)
            // No thread building the next segment beside the test's reads.
            .next_segment(NextSegment::Inline)
            .vfs(Arc::new(vfs.clone())),
    )
    .unwrap();
    let mut last = None;
    // Past the 1 MiB first segment and more than the slack into the 2 MiB second one.
    for i in 0..700u64 {
        let o = s
            .append(NewCommit::new(
                "s",
                ExpectedVersion::Exact(i),
                vec![EventData::new("e", vec![i as u8; 4000])],
            ))
            .unwrap();
        last = o.info().map(|c| c.position);
    }
    let pos = last.unwrap();
    let seg = s.segment_at(pos).unwrap();
    assert!(seg.end.load(Ordering::Acquire) > crate::ACTIVE_MAP_SLACK_BYTES);
    assert_eq!(seg.map_state(), None);
    // The next read call is the map of the prefix.
    vfs.reset_counts();
    vfs.fail_nth(FaultKind::Read, 1, false);
    let err = s.visit_at(pos, |c| c.seq).unwrap_err();
    assert_io_error_at(&err, "map", &dir.path().join(&seg.name));
    assert_eq!(vfs.injected(), 1);
    assert_eq!(seg.map_state(), None);
    // Not poisoned; the next read maps the prefix and reads the record.
    assert_eq!(s.visit_at(pos, |c| c.seq).unwrap(), 700);
    assert!(matches!(seg.map_state(), Some((_, false))));
    let o = s
        .append(NewCommit::new(
            "s",
            ExpectedVersion::Exact(700),
            vec![EventData::new("e", vec![1])],
        ))
        .unwrap();
    assert!(matches!(o, AppendOutcome::Committed(_)));
}

/// `err` is an I/O error of `op` on the file at `path` (a segment's full path).
#[track_caller]
fn assert_io_error_at(err: &Error, op: &str, path: &Path) {
    match err {
        Error::Io { path: p, op: o, .. } => {
            assert_eq!(*o, op, "{err}");
            assert_eq!(p, path, "{err}");
        }
        other => panic!(
            "expected an I/O error naming {}, got {other}",
            path.display()
        ),
    }
}

/// A read of the active segment below the map slack goes to the file: a failure of it
/// names the file's full path.
#[test]
fn a_failed_read_of_an_unmapped_segment_names_its_full_path() {
    use crate::vfs::{FaultKind, FaultVfs, OsVfs};
    let dir = tempfile::tempdir().unwrap();
    let vfs = FaultVfs::new(Arc::new(OsVfs));
    let s = Store::open(
        dir.path(),
        Options::default()
            .durability(Durability::Buffered)
            .vfs(Arc::new(vfs.clone())),
    )
    .unwrap();
    let o = s
        .append(NewCommit::new("s", ExpectedVersion::Exact(0), ev(0)))
        .unwrap();
    let pos = o.info().unwrap().position;
    let seg = s.segment_at(pos).unwrap();
    vfs.fail_nth(FaultKind::Read, 1, false);
    let err = s.visit_at(pos, |c| c.seq).unwrap_err();
    assert_io_error_at(&err, "read_at", &dir.path().join(&seg.name));
    assert_eq!(vfs.injected(), 1);
    assert_eq!(seg.map_state(), None);
    assert_eq!(s.visit_at(pos, |c| c.seq).unwrap(), 1);
}

#[test]
fn losing_the_memtable_is_caught_up_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || {
        Options::default()
            .durability(Durability::Buffered)
            .segment_bytes_max(1 << 20)
    };
    let s = Store::open(dir.path(), opts()).unwrap();
    // More than one memtable's worth: one background move into sled, then the rest.
    let n = 5000u64;
    for i in 0..n {
        let stream = format!("s{}", i % 7);
        let v = s.stream_version(&stream).unwrap().unwrap_or(0);
        let o = s
            .append(NewCommit::new(stream, ExpectedVersion::Exact(v), ev(i)))
            .unwrap();
        assert!(matches!(o, AppendOutcome::Committed(_)));
    }
    let heads = s.streams().unwrap();
    let dump = s.index().dump().unwrap();
    s.flush().unwrap();
    s.inner.index.forget_memtable();
    let behind = s.index().applied_seq().unwrap();
    assert!(behind > 0 && behind < n, "applied {behind}");
    drop(s);
    let s = Store::open(dir.path(), opts()).unwrap();
    assert_eq!(s.index().applied_seq().unwrap(), n);
    assert_eq!(s.streams().unwrap(), heads);
    assert_eq!(s.index().dump().unwrap(), dump);
    assert_eq!(s.read_stream("s3", 700, 10).unwrap().len(), 10);
}

/// sled fails inside a move into it (as on a full disk: sled's writes bypass the
/// `Vfs`): the failure reaches a later append as an error and poisons the store, no
/// acknowledged commit is ever missing from what readers see, and after a reopen every
/// acknowledged commit is in the index and `verify` passes.
#[test]
fn a_sled_write_failing_inside_a_move_loses_no_acknowledged_commit() {
    let dir = tempfile::tempdir().unwrap();
    let stream = format!("sled-fault-{}", Uuid::new_v4());
    let opts = || Options::default().durability(Durability::Buffered);
    let s = Store::open(dir.path(), opts()).unwrap();
    let mut acked: Vec<CommitInfo> = Vec::new();
    let mut failed = None;
    // Enough commits for several moves; the fault is armed after the first.
    for i in 0..40_000u64 {
        if i == 5_000 {
            *crate::index::FAIL_SLED_WRITES_OF.lock().unwrap() = Some(stream.as_bytes().to_vec());
        }
        match s.append(NewCommit::new(&stream, ExpectedVersion::Exact(i), ev(i))) {
            Ok(AppendOutcome::Committed(info)) => acked.push(info),
            Ok(o) => panic!("append {i}: {o:?}"),
            Err(e) => {
                failed = Some(e);
                break;
            }
        }
        // What readers see never lacks an acknowledged commit, failure or not.
        if i % 997 == 0 {
            let seen = s.read_stream(&stream, 1, usize::MAX).unwrap();
            assert_eq!(seen.len(), acked.len(), "after append {i}");
        }
    }
    *crate::index::FAIL_SLED_WRITES_OF.lock().unwrap() = None;
    let e = failed.expect("the injected sled failure reaches an append");
    let text = crate::error::chain_text(&e);
    assert!(text.contains("no space left"), "{text}");
    // Poisoned: writes are refused until reopened.
    assert!(s
        .append(NewCommit::new(&stream, ExpectedVersion::Any, ev(0)))
        .is_err());
    let seen = s.read_stream(&stream, 1, usize::MAX).unwrap();
    assert!(seen.len() >= acked.len());
    drop(s);

    let s = Store::open(dir.path(), opts()).unwrap();
    let seen = s.read_stream(&stream, 1, usize::MAX).unwrap();
    assert!(
        seen.len() >= acked.len(),
        "{} of {}",
        seen.len(),
        acked.len()
    );
    for a in &acked {
        let e = s.inner.index.stream_entry(&stream, a.version).unwrap();
        let e = e.unwrap_or_else(|| panic!("version {} missing from the index", a.version));
        assert_eq!((e.seq, e.commit_id), (a.seq, a.commit_id));
    }
    drop(s);
    let report = crate::verify(dir.path(), opts()).unwrap();
    assert!(report.ok, "{:?}", report.errors);
}

/// A clean close saves the key filter beside the index; the next owner open takes it
/// (the file is gone while the store is open) and answers as before. A read-only open
/// leaves it alone.
#[test]
fn a_clean_close_saves_the_key_filter_and_the_next_open_takes_it() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("index").join("keys.filter");
    let opts = || Options::default().durability(Durability::Buffered);
    let s = Store::open(dir.path(), opts()).unwrap();
    for i in 0..100u64 {
        let o = s
            .append(NewCommit::new("s", ExpectedVersion::Exact(i), ev(i)))
            .unwrap();
        assert!(matches!(o, AppendOutcome::Committed(_)));
    }
    s.close().unwrap();
    assert!(file.exists(), "no key filter saved at close");
    let r = Store::open_read_only(dir.path(), opts()).unwrap();
    assert_eq!(r.read_stream("s", 1, 200).unwrap().len(), 100);
    drop(r);
    assert!(file.exists(), "a read-only open took the key filter");
    let s = Store::open(dir.path(), opts()).unwrap();
    assert!(!file.exists(), "the open left the key filter file in place");
    assert_eq!(s.stream_version("s").unwrap(), Some(100));
    assert_eq!(s.read_stream("s", 1, 200).unwrap().len(), 100);
    s.close().unwrap();
    assert!(file.exists());
}

/// A store at `dir` holding `n` commits of one 64 KiB event each on stream `s`,
/// closed (so a checkpoint covers them); the commits' positions.
fn closed_with_64k_commits(dir: &Path, opts: Options, n: u64) -> Vec<LogPosition> {
    let s = Store::open(dir, opts).unwrap();
    let positions = (0..n)
        .map(|i| {
            let event = EventData::new("e", vec![i as u8; 64 << 10]);
            let o = s
                .append(NewCommit::new("s", ExpectedVersion::Exact(i), vec![event]))
                .unwrap();
            let AppendOutcome::Committed(info) = o else {
                panic!("append {i}: {o:?}")
            };
            info.position
        })
        .collect();
    s.close().unwrap();
    positions
}

/// The store at `dir` opened read-only or as its owner.
fn open_as(dir: &Path, opts: Options, read_only: bool) -> Store {
    match read_only {
        true => Store::open_read_only(dir, opts).unwrap(),
        false => Store::open(dir, opts).unwrap(),
    }
}

/// An open from a checkpoint maps none of the segments the checkpoint covers: each is
/// mapped whole by the first read that reaches it, and reads back what was written.
#[test]
fn an_open_from_a_checkpoint_maps_a_covered_segment_only_when_read() {
    let dir = tempfile::tempdir().unwrap();
    let opts = || Options::default().durability(Durability::Buffered);
    // Segments of 1, 2 and 4 MiB fill, the fourth holds the rest.
    let positions = closed_with_64k_commits(dir.path(), opts(), 120);
    for read_only in [true, false] {
        let s = open_as(dir.path(), opts(), read_only);
        assert_eq!(
            s.stats().open_checkpoint_seq,
            Some(120),
            "read-only {read_only}"
        );
        let first = positions[0];
        assert_ne!(first.segment, positions[119].segment);
        let segs: Vec<Arc<Segment>> = s.inner.segments.read().unwrap().values().cloned().collect();
        assert!(segs.len() >= 3, "{} segments", segs.len());
        let covered = |seg: &Segment| seg.id != positions[119].segment;
        for seg in segs.iter().filter(|g| covered(g)) {
            assert_eq!(
                seg.map_state(),
                None,
                "segment {} (read-only {read_only})",
                seg.id
            );
        }
        let got = s
            .visit_at(first, |c| c.event(0).map(|e| e.payload.to_vec()))
            .unwrap()
            .unwrap();
        assert_eq!(got, vec![0u8; 64 << 10]);
        let seg = s.segment_at(first).unwrap();
        assert!(
            matches!(seg.map_state(), Some((_, true))),
            "read-only {read_only}"
        );
        for seg in segs.iter().filter(|g| covered(g) && g.id != first.segment) {
            assert_eq!(
                seg.map_state(),
                None,
                "segment {} (read-only {read_only})",
                seg.id
            );
        }
        drop(s);
    }
}

/// A segment an open from a checkpoint leaves unmapped is mapped by the first read that
/// reaches it: a failure of that map names the file by its full path, as every other
/// I/O error does, so the message says which store's file failed.
#[test]
fn a_failed_lazy_map_of_a_covered_segment_names_its_full_path() {
    use crate::vfs::{FaultKind, FaultVfs, OsVfs};
    let dir = tempfile::tempdir().unwrap();
    let opts = || Options::default().durability(Durability::Buffered);
    // The first segments fill and are covered by the close's checkpoint.
    let positions = closed_with_64k_commits(dir.path(), opts(), 40);
    let first = positions[0];
    assert_ne!(first.segment, positions[39].segment);
    for read_only in [true, false] {
        let vfs = FaultVfs::new(Arc::new(OsVfs));
        let o = opts().vfs(Arc::new(vfs.clone()));
        let s = open_as(dir.path(), o, read_only);
        assert_eq!(s.stats().open_checkpoint_seq, Some(40));
        let seg = s.segment_at(first).unwrap();
        assert_eq!(seg.map_state(), None, "read-only {read_only}");
        // The read's first call of the kind is the segment's open (its header, for a
        // read-only open, which took the segment from the checkpoint), then the map of
        // the whole segment; a failure of either is the map's.
        vfs.fail_nth(FaultKind::Read, 1, false);
        let err = s.visit_at(first, |c| c.seq).unwrap_err();
        assert_io_error_at(&err, "map", &dir.path().join(&seg.name));
        assert_eq!(vfs.injected(), 1);
        vfs.clear();
        assert_eq!(s.visit_at(first, |c| c.seq).unwrap(), 1);
        drop(s);
    }
}

/// Copies the directory tree `from` to `to` but the lock file, as a crash leaves it.
fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let (src, dst) = (e.path(), to.join(e.file_name()));
        if e.file_name() == "LOCK" {
            continue;
        }
        if e.file_type().unwrap().is_dir() {
            copy_tree(&src, &dst);
        } else {
            std::fs::copy(&src, &dst).unwrap();
        }
    }
}

/// A bulk load cut by a crash, opened again for a bulk load: the commits it left to
/// read from the log go to runs too, not into sled (whose applied seq stays where
/// the first load found it).
#[test]
fn a_bulk_open_reads_what_a_crashed_load_left_into_runs() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("s");
    let opts = || Options::default().durability(Durability::Buffered);
    let append = |s: &Store, versions: std::ops::Range<u64>| {
        for v in versions {
            let o = s.append(NewCommit::new("a", ExpectedVersion::Exact(v), ev(v)));
            assert!(matches!(o.unwrap(), AppendOutcome::Committed(_)));
        }
    };
    let s = Store::open(&dir, opts()).unwrap();
    append(&s, 0..100);
    s.close().unwrap();
    let s = Store::open(&dir, opts().index_bulk_load(true)).unwrap();
    append(&s, 100..5000);
    s.flush().unwrap();
    s.flush_index().unwrap();
    assert_eq!(s.index().sled_applied_seq_for_tests(), Some(100));
    let cut = tmp.path().join("cut");
    copy_tree(&dir, &cut);
    drop(s);
    let c = Store::open(&cut, opts().index_bulk_load(true)).unwrap();
    assert_eq!(c.stats().open_records_decoded, 4900);
    assert_eq!(c.index().applied_seq().unwrap(), 5000);
    assert_eq!(c.index().sled_applied_seq_for_tests(), Some(100));
}

/// A read-only open over a checkpoint does not open the segments before the one
/// holding its record: its file-system calls are the same for a log of four segments
/// and of six, and a segment is opened (once) by the first read that reaches it.
#[test]
fn a_read_only_open_over_a_checkpoint_opens_no_segment_before_its_record() {
    let opts = || Options::default().durability(Durability::Buffered);
    let calls = |dir: &Path, positions: &[LogPosition]| {
        // The first record is in the first segment, which the checkpoint covers.
        assert_ne!(positions[0].segment, positions[positions.len() - 1].segment);
        let reads = [(positions[0], 1), (positions[1], 2)];
        let (at_open, ck) = reader_open_calls(dir, opts(), reads);
        assert_eq!(ck, Some(positions.len() as u64));
        at_open
    };
    let (small, large) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    // Segments of 1, 2, 4, ... MiB: 120 commits of 64 KiB fill three and start a
    // fourth, 1,000 fill five and most of a sixth.
    let few = closed_with_64k_commits(small.path(), opts(), 120);
    let many = closed_with_64k_commits(large.path(), opts(), 1000);
    assert_eq!(
        (segment_files(small.path()), segment_files(large.path())),
        (4, 6)
    );
    assert_eq!(calls(small.path(), &few), calls(large.path(), &many));
}

/// The `.seg` files in `dir`.
fn segment_files(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| e.as_ref().unwrap().path().extension() == Some("seg".as_ref()))
        .count()
}

/// A read-only open of `dir` through a counting file system, then `reads` (each a
/// position and the seq found there): the first read opens its segment (one call),
/// the second, in the same segment, opens nothing. Returns the calls the open made
/// (metadata, reads) and the checkpoint it was opened from.
fn reader_open_calls(
    dir: &Path,
    opts: Options,
    reads: [(LogPosition, u64); 2],
) -> ((u64, u64), Option<u64>) {
    use crate::vfs::{FaultKind, FaultVfs, OsVfs};
    let vfs = FaultVfs::new(Arc::new(OsVfs));
    let s = Store::open_read_only(dir, opts.vfs(Arc::new(vfs.clone()))).unwrap();
    let at_open = (vfs.count(FaultKind::Meta), vfs.count(FaultKind::Read));
    let [(first, first_seq), (second, second_seq)] = reads;
    assert_eq!(first.segment, second.segment);
    s.visit_at(first, |c| assert_eq!(c.seq, first_seq)).unwrap();
    assert_eq!(vfs.count(FaultKind::Meta), at_open.0 + 1, "its open");
    s.visit_at(second, |c| assert_eq!(c.seq, second_seq))
        .unwrap();
    assert_eq!(vfs.count(FaultKind::Meta), at_open.0 + 1, "opened once");
    (at_open, s.stats().open_checkpoint_seq)
}

/// A segment a read-only open took from its checkpoint unopened is checked by the
/// first read that reaches it: a damaged header or a file shorter than the checkpoint
/// says is `Corrupt`, naming the segment, and reads of the other segments go on.
#[test]
fn a_damaged_segment_a_checkpoint_covers_is_found_by_the_read_that_reaches_it() {
    let opts = || Options::default().durability(Durability::Buffered);
    for damage in ["header", "short"] {
        let dir = tempfile::tempdir().unwrap();
        let positions = closed_with_64k_commits(dir.path(), opts(), 120);
        let (first, second) = (positions[0], positions[119]);
        let name = format::segment_file_name(first.segment);
        let path = dir.path().join(&name);
        let f = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
        let want_offset = match damage {
            "header" => {
                use std::os::unix::fs::FileExt;
                f.write_all_at(b"X", 0).unwrap();
                0
            }
            _ => {
                f.set_len(first.offset + 10).unwrap();
                first.offset + 10
            }
        };
        drop(f);
        let s = Store::open_read_only(dir.path(), opts()).unwrap();
        assert_eq!(s.stats().open_checkpoint_seq, Some(120), "{damage}");
        for _ in 0..2 {
            match s.visit_at(first, |c| c.seq).unwrap_err() {
                Error::Corrupt {
                    segment, offset, ..
                } => assert_eq!((segment.as_str(), offset), (name.as_str(), want_offset)),
                other => panic!("{damage}: {other}"),
            }
        }
        assert_eq!(s.visit_at(second, |c| c.seq).unwrap(), 120, "{damage}");
        // The owner opens every segment: the damage stops its open.
        assert!(
            matches!(Store::open(dir.path(), opts()), Err(Error::Corrupt { .. })),
            "{damage}"
        );
    }
    // A covered segment removed after the open (as the owner's GC retires one) fails
    // the read that reaches it as an I/O error saying so, and the rest reads on.
    let dir = tempfile::tempdir().unwrap();
    let positions = closed_with_64k_commits(dir.path(), opts(), 120);
    let s = Store::open_read_only(dir.path(), opts()).unwrap();
    let path = dir
        .path()
        .join(format::segment_file_name(positions[0].segment));
    std::fs::remove_file(&path).unwrap();
    match s.visit_at(positions[0], |c| c.seq).unwrap_err() {
        Error::Io {
            path: p, source, ..
        } => {
            assert_eq!((p, source.kind()), (path, std::io::ErrorKind::NotFound));
            assert!(source.to_string().contains("removed since"), "{source}");
        }
        other => panic!("{other}"),
    }
    assert_eq!(s.visit_at(positions[119], |c| c.seq).unwrap(), 120);
}

/// A log of `n` commits of 64 KiB on streams `keep` and `drop` in turn, the `drop`
/// commits removed by a GC (every sealed segment rewritten), then closed: the
/// positions of the `keep` commits (their seqs are odd, from 1).
fn closed_gc_log_with_64k_commits(dir: &Path, opts: Options, n: u64) -> Vec<LogPosition> {
    let s = Store::open(dir, opts.clone()).unwrap();
    for i in 0..n {
        let stream = ["keep", "drop"][(i % 2) as usize];
        let event = EventData::new("e", vec![i as u8; 64 << 10]);
        let c = NewCommit::new(stream, ExpectedVersion::Exact(i / 2), vec![event]);
        assert!(matches!(s.append(c).unwrap(), AppendOutcome::Committed(_)));
    }
    let plan = s
        .plan_gc(&|c: &RecordedCommit| c.info.stream == "keep")
        .unwrap();
    s.run_gc(plan).unwrap();
    s.close().unwrap();
    let s = Store::open_read_only(dir, opts).unwrap();
    let kept = s.read_stream("keep", 1, usize::MAX).unwrap();
    kept.iter().map(|c| c.info.position).collect()
}

/// A reader over a checkpoint of a log a GC rewrote opens no segment before the one
/// holding its record either (the checkpoint lists each segment's header): its
/// file-system calls are the same for a log of few segments and of many, a segment
/// GC wrote is opened (once) by the first read that reaches it, and one whose header
/// is not the one listed is `Corrupt` for that read.
#[test]
fn a_read_only_open_over_a_checkpoint_of_a_gc_log_opens_no_segment_before_its_record() {
    // Segments of at most 2 MiB, so that the GC writes many.
    let opts = || {
        Options::default()
            .durability(Durability::Buffered)
            .segment_bytes_max(2 << 20)
    };
    let calls = |dir: &Path, positions: &[LogPosition]| {
        let first = positions[0];
        let header = std::fs::read(dir.join(format::segment_file_name(first.segment)))
            .map(|b| format::check_header(&b, first.segment).unwrap())
            .unwrap();
        assert!(
            header.compacted.is_some(),
            "the first commit is in a GC segment"
        );
        let (at_open, ck) = reader_open_calls(dir, opts(), [(first, 1), (positions[1], 3)]);
        assert!(ck.is_some());
        at_open
    };
    let (small, large) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let few = closed_gc_log_with_64k_commits(small.path(), opts(), 240);
    let many = closed_gc_log_with_64k_commits(large.path(), opts(), 2000);
    let (n_small, n_large) = (segment_files(small.path()), segment_files(large.path()));
    assert!(n_small + 20 < n_large, "{n_small} and {n_large} segments");
    assert_eq!(calls(small.path(), &few), calls(large.path(), &many));
    // A GC segment replaced by a plain one of the same id and length: the checkpoint
    // still opens, and the read that reaches it finds the header is not the one listed.
    let name = format::segment_file_name(few[0].segment);
    let path = small.path().join(&name);
    let len = std::fs::metadata(&path).unwrap().len();
    let plain = format::encode_header(few[0].segment);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[..plain.len()].copy_from_slice(&plain);
    std::fs::write(&path, &bytes).unwrap();
    assert_eq!(std::fs::metadata(&path).unwrap().len(), len);
    let s = Store::open_read_only(small.path(), opts()).unwrap();
    assert!(s.stats().open_checkpoint_seq.is_some());
    match s.visit_at(few[0], |c| c.seq).unwrap_err() {
        Error::Corrupt { segment, .. } => assert_eq!(segment, name),
        other => panic!("{other}"),
    }
    let last = few[few.len() - 1];
    assert_eq!(s.visit_at(last, |c| c.seq).unwrap(), 239);
}
