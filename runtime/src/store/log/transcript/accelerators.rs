//! Index values the log store's transcript sources read, kept on the
//! reading thread while the index's change mark stands.
//!
//! Why: a reader paging through a branch asks page after page for the same
//! few index values: the leaf's entry record (its depth), the active-path
//! block that holds the leaf (is the leaf still on the path?), and the block
//! the previous page ended in. Each is a lookup through the memtables and
//! sled's tree, and a source lives for one read only, so its own caches
//! start empty at every page. Here the last few such values outlive the
//! source, on the thread that read them.
//!
//! Why a kept value is current: every change to the index's entries moves
//! its [`ChangeMark`] (a publish under the memtable's write lock, a rebuild
//! before and after it; a move into sled changes where an entry is kept,
//! not what it is). A value is kept under the mark taken *before* it was
//! read, and answered only while the index's mark still equals that one:
//! then no change was published after the mark was taken, so none could
//! have been missed by the read or made since. A mark that is not settled
//! (a rebuild is running) keeps nothing.
//!
//! Bounds: per thread, one session's values, at most [`BLOCKS_MAX`] path
//! blocks (each at most 64 links of at most ~300 bytes) and [`RECORDS_MAX`]
//! entry records. A thread reading another session, or another store
//! (marks of different index instances never compare equal), or after any
//! change, starts again from nothing. No lock: nothing is shared between
//! threads.

use std::cell::RefCell;
use std::sync::Arc;

use spool_engine::ChangeMark;

use super::indexer::EntryRecord;
use crate::transcript::EntryId;

/// Path blocks kept per thread: a root-first page of at most 64 entries
/// spans at most two blocks of 64 depths, and the leaf's block is asked for
/// at every page.
pub(crate) const BLOCKS_MAX: usize = 4;

/// Entry records kept per thread: a page asks for its leaf's.
pub(crate) const RECORDS_MAX: usize = 4;

/// At most `N` keyed values, the oldest replaced first.
struct Slots<K, V, const N: usize> {
    slots: Vec<(K, V)>,
    /// The slot the next insertion replaces once all `N` are in use.
    next: usize,
}

impl<K: PartialEq, V: Clone, const N: usize> Slots<K, V, N> {
    const fn new() -> Self {
        Self {
            slots: Vec::new(),
            next: 0,
        }
    }

    fn get(&self, key: &K) -> Option<V> {
        self.slots
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.clone())
    }

    fn put(&mut self, key: K, value: V) {
        if let Some(slot) = self.slots.iter_mut().find(|(k, _)| *k == key) {
            slot.1 = value;
            return;
        }
        if self.slots.len() < N {
            self.slots.push((key, value));
            return;
        }
        if let Some(slot) = self.slots.get_mut(self.next) {
            *slot = (key, value);
        }
        self.next = (self.next + 1) % N;
    }

    fn clear(&mut self) {
        self.slots.clear();
        self.next = 0;
    }
}

struct Memo {
    /// The mark every kept value was read after; `None`: nothing kept.
    mark: Option<ChangeMark>,
    /// The session every kept value is of.
    sid: String,
    blocks: Slots<u64, Option<Arc<[u8]>>, BLOCKS_MAX>,
    records: Slots<EntryId, Option<Arc<EntryRecord>>, RECORDS_MAX>,
}

impl Memo {
    const fn new() -> Self {
        Self {
            mark: None,
            sid: String::new(),
            blocks: Slots::new(),
            records: Slots::new(),
        }
    }

    /// Whether the kept values are `sid`'s and current at `now`.
    fn holds(&self, now: ChangeMark, sid: &str) -> bool {
        self.mark == Some(now) && self.sid == sid
    }

    /// Makes the memo `sid`'s under `mark` (the mark taken before the read
    /// whose value is about to be kept), dropping whatever it held under
    /// another mark or session.
    fn keep_under(&mut self, mark: ChangeMark, sid: &str) {
        if self.mark != Some(mark) || self.sid != sid {
            self.mark = Some(mark);
            self.sid.clear();
            self.sid.push_str(sid);
            self.blocks.clear();
            self.records.clear();
        }
    }
}

thread_local! {
    static MEMO: RefCell<Memo> = const { RefCell::new(Memo::new()) };
}

/// The value of `key` in the slots `slots` picks: the kept one while the
/// index's mark is still `before`, else `read()`'s, kept under `before`.
/// `before` is the index's mark taken before `read` runs.
fn kept<K: PartialEq + Clone, V: Clone, const N: usize, E>(
    slots: fn(&mut Memo) -> &mut Slots<K, V, N>,
    before: ChangeMark,
    sid: &str,
    key: &K,
    read: impl FnOnce() -> Result<V, E>,
) -> Result<V, E> {
    if let Some(hit) = MEMO.with(|m| {
        let mut m = m.borrow_mut();
        if m.holds(before, sid) {
            slots(&mut m).get(key)
        } else {
            None
        }
    }) {
        return Ok(hit);
    }
    let value = read()?;
    if before.is_settled() {
        MEMO.with(|m| {
            let mut m = m.borrow_mut();
            m.keep_under(before, sid);
            slots(&mut m).put(key.clone(), value.clone());
        });
    }
    Ok(value)
}

/// `sid`'s path block `block`, through the memo (see [`kept`]).
pub(crate) fn path_block<E>(
    before: ChangeMark,
    sid: &str,
    block: u64,
    read: impl FnOnce() -> Result<Option<Vec<u8>>, E>,
) -> Result<Option<Arc<[u8]>>, E> {
    kept(
        |m| &mut m.blocks,
        before,
        sid,
        &block,
        || read().map(|v| v.map(Arc::from)),
    )
}

/// `sid`'s entry record of `id`, through the memo (see [`kept`]).
pub(crate) fn record<E>(
    before: ChangeMark,
    sid: &str,
    id: &EntryId,
    read: impl FnOnce() -> Result<Option<Arc<EntryRecord>>, E>,
) -> Result<Option<Arc<EntryRecord>>, E> {
    kept(|m| &mut m.records, before, sid, id, read)
}

#[cfg(test)]
mod tests {
    use super::*;
    use spool_engine::{EventData, ExpectedVersion, Options, Store};

    /// `path_block` through `read`, counting the reads that ran.
    fn block(store: &Store, sid: &str, block: u64, reads: &mut u32) -> Option<Arc<[u8]>> {
        let index = store.index();
        path_block(index.change_mark(), sid, block, || -> Result<_, ()> {
            *reads += 1;
            Ok(Some(
                format!("{sid}/{block}/{:?}", index.change_mark()).into_bytes(),
            ))
        })
        .unwrap()
    }

    #[test]
    fn a_kept_value_is_answered_only_while_the_mark_stands() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(dir.path(), Options::default()).unwrap();
        let mut reads = 0;
        let first = block(&store, "s", 0, &mut reads);
        assert_eq!(block(&store, "s", 0, &mut reads), first);
        assert_eq!(reads, 1, "the mark stood: answered from the memo");
        // Another block and another session are read, not answered.
        block(&store, "s", 1, &mut reads);
        assert_eq!(reads, 2);
        block(&store, "t", 0, &mut reads);
        assert_eq!(reads, 3);
        // Another session's value replaced the memo's session.
        block(&store, "s", 0, &mut reads);
        assert_eq!(reads, 4);
        // Any publish moves the mark: the value is read again.
        store
            .append_fresh(
                "w",
                ExpectedVersion::Any,
                vec![EventData::new("k", b"x".to_vec())],
            )
            .unwrap();
        let after = block(&store, "s", 0, &mut reads);
        assert_eq!(reads, 5);
        assert_ne!(after, first, "read after the publish");
        assert_eq!(block(&store, "s", 0, &mut reads), after);
        assert_eq!(reads, 5);
        // The memo is per thread: another thread reads for itself.
        std::thread::scope(|t| {
            t.spawn(|| {
                let mut reads = 0;
                block(&store, "s", 0, &mut reads);
                assert_eq!(reads, 1);
            });
        });
        // At most BLOCKS_MAX blocks are kept.
        for b in 0..=BLOCKS_MAX as u64 {
            block(&store, "s", 10 + b, &mut reads);
        }
        let before = reads;
        block(&store, "s", 10, &mut reads);
        assert_eq!(reads, before + 1, "the oldest block was replaced");
    }

    #[test]
    fn slots_replace_the_oldest_once_full_and_update_in_place() {
        let mut s: Slots<u64, u64, 2> = Slots::new();
        s.put(1, 10);
        s.put(2, 20);
        s.put(1, 11);
        assert_eq!(s.get(&1), Some(11));
        s.put(3, 30);
        // 1 was in the first slot: replaced first.
        assert_eq!(s.get(&1), None);
        assert_eq!(s.get(&2), Some(20));
        assert_eq!(s.get(&3), Some(30));
        s.put(4, 40);
        assert_eq!(s.get(&2), None);
        assert_eq!(s.slots.len(), 2);
    }
}
