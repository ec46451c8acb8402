//! Segments grow: a store's first segment is small (`SEGMENT_BYTES_START`), each next
//! one doubles the one before up to `segment_bytes_max`, and a record larger than the
//! capacity due gets a segment sized for it.

use crate::common;

use common::*;
use spool_engine::*;
use std::path::Path;

const MIB: u64 = 1 << 20;

/// The length of every segment file in `dir`, in id order.
fn seg_lens(dir: &Path) -> Vec<u64> {
    seg_files(dir)
        .iter()
        .map(|p| std::fs::metadata(p).unwrap().len())
        .collect()
}

/// Appends one commit of `bytes` payload bytes to stream `a` (its next version).
fn append_bytes(s: &Store, bytes: usize, fill: u8) -> CommitInfo {
    committed(append_next(s, "a", ev(&vec![fill; bytes])))
}

/// The payload lengths and first bytes of every commit, in order.
fn shapes(s: &Store) -> Vec<(usize, u8)> {
    log_contents(s)
        .into_iter()
        .map(|(_, _, p)| (p.len(), p[0]))
        .collect()
}

#[test]
fn a_new_store_starts_with_a_small_first_segment() {
    assert_eq!(SEGMENT_BYTES_START, MIB);
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), Options::default()).unwrap();
    append_bytes(&s, 100, 1);
    assert_eq!(seg_lens(dir.path()), vec![SEGMENT_BYTES_START]);
    drop(s);

    // A maximum below the starting size wins over it.
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), Options::default().segment_bytes_max(64 * 1024)).unwrap();
    append_bytes(&s, 100, 1);
    assert_eq!(seg_lens(dir.path()), vec![64 * 1024]);
}

#[test]
fn segments_grow_by_doubling_up_to_the_maximum() {
    for mode in [NextSegment::Background, NextSegment::OnDemand] {
        let dir = tempfile::tempdir().unwrap();
        let opts = Options::default()
            .segment_bytes_max(4 * MIB)
            .durability(Durability::Buffered)
            .preallocate(Preallocate::Sparse)
            .next_segment(mode);
        let s = Store::open(dir.path(), opts.clone()).unwrap();
        // 150 commits of 64 KiB: 15 fill the first segment, 31 the second, 63 the
        // third, and the rest go to a fourth of the same maximum size.
        for i in 0..150u32 {
            append_bytes(&s, 64 * 1024, i as u8);
        }
        assert_eq!(
            seg_lens(dir.path()),
            vec![MIB, 2 * MIB, 4 * MIB, 4 * MIB],
            "{mode:?}"
        );
        let st = s.stats();
        assert_eq!(st.segments_created, 3, "{mode:?}: {st:?}");
        if mode == NextSegment::Background {
            // The spare built ahead had the capacity each roll needed.
            assert_eq!(st.segments_from_spare, 3, "{mode:?}: {st:?}");
        }
        let want: Vec<(usize, u8)> = (0..150u32).map(|i| (64 * 1024, i as u8)).collect();
        assert_eq!(shapes(&s), want, "{mode:?}");
        drop(s);
        let v = verify(dir.path(), opts.clone()).unwrap();
        assert!(v.ok, "{mode:?}: {v:?}");
        let s = Store::open(dir.path(), opts).unwrap();
        assert_eq!(shapes(&s), want, "{mode:?}");
    }
}

#[test]
fn a_record_larger_than_the_capacity_due_lands_in_a_segment_sized_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default()
        .segment_bytes_max(4 * MIB)
        .durability(Durability::Buffered)
        .preallocate(Preallocate::Sparse)
        .next_segment(NextSegment::Inline);
    let s = Store::open(dir.path(), opts.clone()).unwrap();
    // Fill the 1 MiB first segment past half: a 2 MiB spare is built for the next.
    for i in 0..10u8 {
        append_bytes(&s, 64 * 1024, i);
    }
    assert_eq!(s.stats().segments_created, 0);
    // 3 MiB: more than the 2 MiB due, so its segment is sized for it, just fitting.
    let big = append_bytes(&s, 3 * MIB as usize, 0xbb);
    assert_eq!(big.position.segment, 2);
    let lens = seg_lens(dir.path());
    assert_eq!(lens.len(), 2);
    assert!(
        lens[1] > 3 * MIB && lens[1] < 3 * MIB + 4096,
        "sized for the record: {lens:?}"
    );
    let st = s.stats();
    assert_eq!(st.segments_created, 1, "{st:?}");
    assert_eq!(
        st.segments_from_spare, 0,
        "the 2 MiB spare was passed by: {st:?}"
    );
    // The next segments double that one, capped at the maximum (63 of these commits
    // fill one), and are again built ahead: the spare of the wrong size was dropped,
    // not kept for ever.
    for i in 0..70u8 {
        append_bytes(&s, 64 * 1024, i);
    }
    let lens = seg_lens(dir.path());
    assert_eq!(lens[2..], [4 * MIB, 4 * MIB], "{lens:?}");
    let st = s.stats();
    assert_eq!(st.segments_created, 3, "{st:?}");
    assert_eq!(st.segments_from_spare, 2, "{st:?}");
    let mut want: Vec<(usize, u8)> = (0..10u8).map(|i| (64 * 1024, i)).collect();
    want.push((3 * MIB as usize, 0xbb));
    want.extend((0..70u8).map(|i| (64 * 1024, i)));
    assert_eq!(shapes(&s), want);
    drop(s);
    let v = verify(dir.path(), opts.clone()).unwrap();
    assert!(v.ok, "{v:?}");
    let s = Store::open(dir.path(), opts).unwrap();
    assert_eq!(shapes(&s), want);
}

#[test]
fn reopening_a_store_whose_active_segment_is_small_continues_in_it() {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options::default().next_segment(NextSegment::Inline);
    let s = Store::open(dir.path(), opts.clone()).unwrap();
    for i in 0..5u8 {
        append_bytes(&s, 1000, i);
    }
    drop(s);
    let s = Store::open(dir.path(), opts.clone()).unwrap();
    let more = append_bytes(&s, 1000, 5);
    assert_eq!(more.position.segment, 1, "written into the small segment");
    assert_eq!(seg_lens(dir.path()), vec![SEGMENT_BYTES_START]);
    // Filling it rolls into a segment of double its capacity.
    for i in 6..20u8 {
        append_bytes(&s, 100 * 1024, i);
    }
    assert_eq!(
        seg_lens(dir.path()),
        vec![SEGMENT_BYTES_START, 2 * SEGMENT_BYTES_START]
    );
    drop(s);
    // Reopened with its active segment grown, the next roll doubles again.
    let s = Store::open(dir.path(), opts).unwrap();
    for i in 20..40u8 {
        append_bytes(&s, 100 * 1024, i);
    }
    assert_eq!(
        seg_lens(dir.path()),
        vec![
            SEGMENT_BYTES_START,
            2 * SEGMENT_BYTES_START,
            4 * SEGMENT_BYTES_START
        ]
    );
    let mut want: Vec<(usize, u8)> = (0..6u8).map(|i| (1000, i)).collect();
    want.extend((6..40u8).map(|i| (100 * 1024, i)));
    assert_eq!(shapes(&s), want);
}
