//! Closing the index: sled's snapshot, written by the close that made it stale rather
//! than by the next open.
//!
//! sled 0.34 writes its snapshot (its page table, at a log position) only while it
//! opens: it reads the last snapshot, replays its log from there, and writes the new
//! one. Nothing writes one while a database is open. So the first open after a
//! process that moved many commits into sled replays all of them, in time and in
//! memory (the page table of everything that process wrote), however little the
//! opening process then reads. A clean owner close that moved enough since its open
//! therefore opens sled once more after closing it, still under the store's lock, and
//! leaves that replay to itself: the next open starts from a current snapshot. This is
//! what SQLite does with its WAL when the last connection closes.

use super::*;

/// A close opens sled again to write its snapshot when at least this many bytes of
/// keys and values were moved into sled since the open (half a memtable move; sled
/// writes several times that to its log). Below it, the next open's replay is short
/// and the reopen would cost more than it saves: an open reads sled's whole snapshot,
/// which grows with the store.
pub(super) const SNAPSHOT_AT_CLOSE_BYTES_MIN: u64 = MEM_BYTES_MOVE as u64 / 2;

impl Index {
    /// Let the drop of this index write sled's snapshot (see the module's docs). Called
    /// by a clean owner close, once everything is in sled and flushed.
    pub(crate) fn snapshot_at_close(&self) {
        self.snapshot_at_close.store(true, Ordering::Release);
    }

    /// Bytes of keys and values moved into sled since the open.
    pub(crate) fn moved_bytes(&self) -> u64 {
        self.moved_bytes.load(Ordering::Relaxed)
    }

    /// Close sled and open it once more, which replays sled's log and writes its
    /// snapshot, when [`Index::snapshot_at_close`] asked for it and enough was moved.
    /// A failure costs only the next open's replay, as without it; a damaged index is
    /// found and rebuilt by the next open.
    pub(super) fn write_sled_snapshot(&mut self) {
        let asked = self.snapshot_at_close.load(Ordering::Acquire);
        if !asked || self.moved_bytes() < SNAPSHOT_AT_CLOSE_BYTES_MIN {
            return;
        }
        let Some(path) = self.path.clone() else {
            return;
        };
        // Nothing else holds sled now: the move and the key scan are joined, and every
        // other user borrows the index. The cache's tree holds sled open too.
        drop(self.cache_dir.take());
        drop(self.sled.take());
        for _ in 0..SLED_LOCK_WAIT_TRIES {
            let opened = sled_guard("writing the index's snapshot", || {
                Index::open_db(Some(&path), self.cache_bytes).map_err(IndexError::Sled)
            });
            match opened {
                Err(IndexError::Sled(e)) if is_sled_lock_error(&e) => {
                    std::thread::sleep(std::time::Duration::from_millis(50));
                }
                _ => return,
            }
        }
    }
}
