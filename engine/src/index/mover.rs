//! The move of a frozen memtable into sled, key by key in key order, recorded in the
//! redo log first so that a crash in the middle loses nothing; and sled's flush and
//! epoch reclamation after a move.

use super::*;

/// Apply `writes` to sled, then stop showing them from `frozen` (sled holds identical
/// values by then, so readers never see a gap: while the keys go in one by one, the
/// frozen memtable in front of sled still answers for every one of them).
///
/// The writes go in one by one, in key order, with the move recorded in the redo log
/// first (see [`crate::index::redo`] for why a crash in the middle loses nothing). One
/// `apply_batch` of the same writes cost sled more per key (see BENCHMARKS.md,
/// Decisions).
pub(super) fn move_into_sled(
    view: &SledView,
    frozen: &RwLock<Option<Arc<MemTable>>>,
    flushed_at: &Mutex<std::time::Instant>,
    redo: Option<&Mutex<RedoLog>>,
    writes: &MemTable,
) -> Result<(), IndexError> {
    if let Some(runs) = &view.runs {
        // A bulk load: the writes become a run, which readers see before the frozen
        // memtable stops showing them (see `spill.rs`).
        runs.spill(writes)?;
        *frozen.write().unwrap_or_else(|e| e.into_inner()) = None;
        return Ok(());
    }
    let tree = &view.tree;
    let redo_full = write_move(view, redo, writes, None)?;
    *frozen.write().unwrap_or_else(|e| e.into_inner()) = None;
    // Make the batches durable in sled's own log at most once per interval, as sled's
    // flusher thread (now off) did. The engine's log is the source of truth; this only
    // bounds what the next open catches up on after a power loss. A flush per move
    // (an fsync of up to a memtable's bytes) held the next freeze, which waits for
    // the move: buffered appends fell to 0.59-0.88x SQLite from 0.87-0.93x in three
    // paired runs.
    let mut last = flushed_at.lock().unwrap_or_else(|e| e.into_inner());
    if redo_full || last.elapsed() >= SLED_FLUSH_INTERVAL {
        flush_sled(tree)?;
        *last = std::time::Instant::now();
        // sled now holds every recorded move durably.
        if let Some(redo) = redo {
            redo.lock().unwrap_or_else(|e| e.into_inner()).clear()?;
        }
    }
    drop(last);
    reclaim_sled_garbage(writes.len());
    Ok(())
}

/// The writes of a move into sled over its base (see [`move_into_sled`] and
/// `delta.rs`): the redo record and the
/// `MOVING` marker first when there is a redo log, then the writes in key order, then
/// the marker's removal. Tests cut it short after `cut_after` writes, as a crash would
/// (the marker stays). Whether the redo log has passed its bound.
pub(super) fn write_move(
    view: &SledView,
    redo: Option<&Mutex<RedoLog>>,
    writes: &MemTable,
    cut_after: Option<usize>,
) -> Result<bool, IndexError> {
    // Neighbouring keys share sled's tree nodes: in key order each node is found and
    // changed while it is still in the CPU's caches. The memtable's range read sorts
    // its pending keys once, for this move and for its readers meanwhile.
    let sorted: Vec<(&[u8], &Value)> = writes.range(Bound::Unbounded, Bound::Unbounded).collect();
    debug_assert_eq!(sorted.len(), writes.len());
    let tree = &view.tree;
    let mut redo_full = false;
    if let Some(redo) = redo {
        let body = redo::encode_body(&sorted)?;
        redo_full = redo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .append(&body)?;
        tree.insert(META_MOVING, &redo::marker(&body)[..])?;
    }
    for (k, v) in sorted.iter().take(cut_after.unwrap_or(usize::MAX)) {
        #[cfg(test)]
        injected_sled_fault(k)?;
        super::delta::write_entry(tree, k, v.as_deref(), view.base.is_some())?;
    }
    if redo.is_some() && cut_after.is_none() {
        tree.remove(META_MOVING)?;
    }
    Ok(redo_full)
}

/// Tests: a sled write of a key that contains these bytes fails, as a full disk
/// under sled would (sled does its own I/O, outside the `Vfs`). Keyed by content, so
/// a test that arms it with its own stream name disturbs no other test.
#[cfg(test)]
pub(crate) static FAIL_SLED_WRITES_OF: Mutex<Option<Vec<u8>>> = Mutex::new(None);

#[cfg(test)]
fn injected_sled_fault(key: &[u8]) -> Result<(), sled::Error> {
    let armed = FAIL_SLED_WRITES_OF
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    match armed.as_deref() {
        Some(needle) if key.windows(needle.len()).any(|w| w == needle) => Err(sled::Error::Io(
            std::io::Error::other("injected: no space left on device"),
        )),
        _ => Ok(()),
    }
}

/// `Tree::flush` (any tree flushes the whole database) inside an epoch pin: an IO
/// buffer another thread retires meanwhile is then not freed before this flush has
/// taken its own reference (see `open_db_inner`).
pub(super) fn flush_sled(tree: &sled::Tree) -> Result<(), sled::Error> {
    let _pinned = sled::pin();
    tree.flush()?;
    Ok(())
}

/// Free what a batch of `writes` left to sled's epoch-based reclamation, on the calling
/// (background) thread. sled replaces tree nodes on every insert and defers freeing
/// the old ones until no thread can still see them; deferred frees are run only when
/// some thread pins the epoch (a few bags per 128 pins). Left alone, that work falls
/// on whichever threads read sled next — the committing threads, where it was about a
/// fifth of an append's CPU — and when they rarely read sled, memory grows without
/// bound instead. Each flush tries to advance the epoch and frees up to 8 bags of up to
/// 64 deferred frees, so this bounds the loop by what the batch can have produced
/// (a few nodes per write) plus the two epoch advances a bag must wait for.
pub(crate) fn reclaim_sled_garbage(writes: usize) {
    let rounds = writes / 64 + 64;
    for _ in 0..rounds {
        sled::pin().flush();
    }
}
