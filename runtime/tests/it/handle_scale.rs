//! 2k / 10k / 50k-entry histories (about 1 KiB per entry): a handle opened
//! with a 64 KiB budget holds the right context (the selection over the
//! fully loaded transcript) and resident bytes stay within the budget at
//! every size (the histories are built with 1,000-entry commits, so the
//! whole test takes seconds).

use crate::handle_support;

use handle_support::*;
use spool_runtime::handle::HandleOptions;
use spool_runtime::store::SessionStore;
use spool_runtime::transcript::{select_resident, Budget, EntryKind};

/// Entries per commit while building a history.
const CHUNK: usize = 1000;

fn check(n: usize) -> (u64, u64) {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    {
        let h = writer(&rt, &id, 64 * 1024);
        let mut i = 0;
        while i < n {
            let kinds: Vec<EntryKind> = (i..(i + CHUNK).min(n)).map(|k| sized(k, 1024)).collect();
            i += kinds.len();
            h.append_entries(kinds).unwrap();
        }
        let s = h.snapshot();
        assert_eq!(s.counts().path_entries, n as u64);
        assert!(s.resident_bytes() <= 64 * 1024);
    }
    let budget = Budget::new(64 * 1024, 1024);
    let h = rt
        .open_handle(&id, HandleOptions::reader().with_budget(budget))
        .unwrap();
    let s = h.snapshot();
    let t = full_transcript(&*store, &id);
    assert_eq!(t.len(), n);
    assert_eq!(s.selection, select_resident(&t, t.leaf(), budget).unwrap());
    let full = t.context().unwrap().messages;
    let part = s.context().messages;
    assert_eq!(&full[full.len() - part.len()..], &part[..]);
    assert!(s.resident_bytes() <= budget.bytes_max);
    assert!(s.resident_events() <= budget.events_max);
    assert!(!s.is_complete());
    assert_eq!(store.stats().full_loads, 1, "only the reference load");
    (s.resident_bytes(), s.counts().resident_entries)
}

#[test]
fn resident_bytes_stay_flat_from_2k_to_50k_entries() {
    let sizes = [2_000, 10_000, 50_000];
    let results: Vec<(u64, u64)> = sizes.iter().map(|&n| check(n)).collect();
    let (bytes_2k, entries_2k) = results[0];
    for (n, (bytes, entries)) in sizes.iter().zip(&results) {
        // The same bounded working set at every size (entry texts grow by
        // a few digits with the history, hence the small byte slack).
        assert_eq!(*entries, entries_2k, "resident entries at {n}");
        assert!(
            bytes.abs_diff(bytes_2k) * 100 <= bytes_2k,
            "resident bytes at {n}: {bytes} vs {bytes_2k}"
        );
    }
}
