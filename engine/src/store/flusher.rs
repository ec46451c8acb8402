//! Flushing and closing: `flush` (fdatasync of buffered appends), the background
//! flusher thread of [`Options::flush_interval`](crate::Options), and the shutdown run
//! on close and drop.

use super::*;

/// The writer lock once no write group is in flight (no leader); `Poisoned` when
/// the store refuses writes.
pub(super) fn lock_idle(inner: &Inner) -> Result<MutexGuard<'_, Writer>, Error> {
    let mut w = lock(&inner.w);
    while w.leader {
        w = wait_writer(inner, w);
    }
    if inner.poisoned.load(Ordering::Acquire) {
        return Err(inner.poisoned_error());
    }
    Ok(w)
}

pub(super) fn flush_inner(inner: &Inner) -> Result<(), Error> {
    if inner.read_only {
        return Ok(());
    }
    let mut w = lock_idle(inner)?;
    if !w.dirty {
        return Ok(());
    }
    w.dirty = false;
    let active = w.active.clone();
    // Idle: every commit up to here is written and published; the sync below covers
    // them (earlier segments were synced when sealed).
    let written = w.done_seq;
    drop(w);
    inner.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = active.file.sync_data() {
        let e = Error::io(inner.dir.join(&active.name), "sync_data", e);
        inner.poison(&e);
        return Err(e);
    }
    inner.index.mark_synced(written);
    Ok(())
}

pub(super) fn shutdown(inner: &Inner) -> Result<(), Error> {
    if inner.closed.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    *lock(&inner.stop) = true;
    inner.stop_cond.notify_all();
    if let Some(h) = lock(&inner.flusher).take() {
        let _ = h.join();
    }
    let res = if inner.poisoned.load(Ordering::Acquire) {
        Ok(())
    } else {
        flush_inner(inner)
    };
    // Old segments of a GC: no reader is left once the store is closed (scans borrow
    // it). What fails here is finished by the next open's GC recovery.
    if !inner.read_only {
        let _ = crate::gc::retire(inner);
        // An unused spare: the next open would remove it anyway.
        let mut slot = lock(&inner.spare);
        slot.finish();
        *slot = spare::Slot::Empty;
        let _ = spare::remove(&*inner.opts.vfs, &inner.dir);
    }
    let flushed = inner.index.flush();
    if !inner.read_only && flushed.is_ok() && !inner.poisoned.load(Ordering::Acquire) {
        // Sled now holds every commit applied: the checkpoint readers open from, and
        // the key filter the next owner open starts from (a cache: a failure costs
        // that open a scan).
        // The checkpoint becomes the base of a new, empty sled (see `index/delta.rs`).
        if let Some(ck) = inner.checkpoints.on_close(&inner.segments, &inner.index) {
            let _ = inner.index.prepare_rebase(&ck);
        }
        let _ = inner.index.save_key_filter();
        // sled's snapshot, written when the index is dropped (before the lock).
        inner.index.snapshot_at_close();
    }
    // The lock is released when `Inner` is dropped, after the index.
    res
}

pub(super) fn flusher_loop(inner: Weak<Inner>, interval: std::time::Duration) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        {
            let stop = lock(&strong.stop);
            if *stop {
                return;
            }
            let (stop, _) = strong
                .stop_cond
                .wait_timeout(stop, interval)
                .unwrap_or_else(|e| e.into_inner());
            if *stop {
                return;
            }
        }
        // A failure poisons the store; the next append reports it.
        let _ = flush_inner(&strong);
    }
}
