//! The read accelerators of the log store: values kept only so that work
//! is not done twice. [`DecodeMemo`] hands decodings from the writer and the
//! session indexer to the transcript indexer; [`EntryCache`] keeps decoded
//! entries per engine (in a process-wide registry); the per-thread memo
//! keeps index values while the index's change mark stands. None of them is
//! ever the only copy of anything: each answers exactly what the log or the
//! index would.
//!
//! # Per-thread index values
//!
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
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use spool_engine::{LogPosition, RecordedCommit, Store};

use super::record::{EntryKey, EntryRecord};
use crate::session::codec::{decode_event_split, TranscriptParts};
use crate::session::{SessionEvent, SessionId};
use crate::store::ChangeMark;
use crate::transcript::{Entry, EntryId};

/// Decodings handed to the transcript indexer so that it does not make
/// them again: a `created` event's from the session indexer, and an
/// appended entry from the writer that encoded it.
///
/// **Appended entries.** The log store's writer hands each
/// `entry_appended` event's entry, its JSON size ([`entry_size`]) and the
/// bytes it was encoded to (`DecodeMemo::hand_over`) before it commits,
/// and withdraws what is left once the append returns, whatever its
/// outcome (`HandedOver`'s drop). The transcript indexer takes an entry
/// only for the very bytes it is indexing, of the same session
/// (`DecodeMemo::take_appended`): it then neither decodes the event nor
/// measures the entry (a large part of an append's instructions). Anything else
/// (a rebuild, a replay, bytes that differ) decodes as before. The bytes
/// are the entry's encoding, and decoding an encoding gives the entry
/// back (the codec's round-trip tests and fuzz target), so the index is
/// the same either way; debug builds decode anyway and assert it. The
/// memo holds at most the entries of the appends in flight, one list per
/// writer.
///
/// **Seeds.** A `created` event's decoding is handed from the session
/// indexer to the transcript indexer of the same commit, so that a fork's
/// seed (most of its bytes) is decoded once per commit instead of twice:
/// the session
/// indexer must decode it whole anyway, to mark a session whose event does
/// not decode broken, and the transcript indexer needs its entries.
///
/// The engine runs a store's indexers one after the other on each commit,
/// on one thread, in registration order (session, then transcript; the
/// [`Indexer`] trait promises it), so the slot holds at most one decoding,
/// from the commit being indexed.
/// A decoding is taken only for the very bytes it came from (the
/// commit's log position, the event's index, the payload's address and
/// length): anything else makes the transcript indexer decode the event
/// itself, with the same function the session indexer uses, so the index
/// is the same with or without the memo (a rebuild replays the log through
/// the same pair).
#[derive(Debug, Default)]
pub struct DecodeMemo {
    slot: Mutex<Option<SeedDecoded>>,
    appends: Mutex<HandedAppends>,
}

/// The appended entries writers handed over, per append in flight.
#[derive(Debug, Default)]
struct HandedAppends {
    next_ticket: u64,
    commits: Vec<HandedCommit>,
}

/// One append's handed entries.
#[derive(Debug)]
struct HandedCommit {
    ticket: u64,
    stream: String,
    entries: Vec<HandedEntry>,
}

/// An appended entry, its JSON size and the payload it was encoded to
/// (`entry` is `None` once the indexer took it).
#[derive(Debug)]
struct HandedEntry {
    payload: Vec<u8>,
    entry: Option<Entry>,
    size: u64,
}

/// An append's registration in a [`DecodeMemo`]: dropping it withdraws
/// the entries the indexer did not take.
#[derive(Debug)]
pub(crate) struct HandedOver<'a> {
    memo: &'a DecodeMemo,
    ticket: u64,
}

impl Drop for HandedOver<'_> {
    fn drop(&mut self) {
        let mut appends = self.memo.appends.lock().unwrap_or_else(|p| p.into_inner());
        appends.commits.retain(|c| c.ticket != self.ticket);
    }
}

/// The session indexer's decoding of one `created` event (`None`: the
/// event did not decode).
#[derive(Debug)]
struct SeedDecoded {
    key: SeedKey,
    decoded: Option<(SessionEvent, Option<TranscriptParts>)>,
}

/// What identifies the bytes a [`SeedDecoded`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct SeedKey {
    position: LogPosition,
    event: usize,
    payload_addr: usize,
    payload_len: usize,
}

impl SeedKey {
    fn of(commit: &RecordedCommit, event: usize, payload: &[u8]) -> Self {
        SeedKey {
            position: commit.info.position,
            event,
            payload_addr: payload.as_ptr() as usize,
            payload_len: payload.len(),
        }
    }
}

impl DecodeMemo {
    /// Empties the slot (the session indexer, before each commit: a
    /// decoding never outlives the commit it came from).
    pub(crate) fn clear(&self) {
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    /// Decodes `payload`, event `event` of `commit` (a `created` event), as
    /// the transcript indexer will need it, keeps the decoding for it, and
    /// returns the event without its transcript, as
    /// [`decode_event_without_transcript`](crate::session::codec::decode_event_without_transcript)
    /// does: both fail exactly when [`decode_event`] fails.
    pub(crate) fn decode_created(
        &self,
        commit: &RecordedCommit,
        event: usize,
        payload: &[u8],
    ) -> Result<SessionEvent, crate::session::CodecError> {
        let key = SeedKey::of(commit, event, payload);
        let (decoded, result) = match decode_event_split(payload) {
            Ok((ev, parts)) => {
                // The event's state holds an empty transcript here: the
                // copy is the header's few fields.
                let header = ev.clone();
                (Some((ev, parts)), Ok(header))
            }
            Err(e) => (None, Err(e)),
        };
        *self.slot.lock().unwrap_or_else(|p| p.into_inner()) = Some(SeedDecoded { key, decoded });
        result
    }

    /// Hands the entries of one append to `stream` to the transcript
    /// indexer: each with its JSON size and the event payload it was
    /// encoded to. They stay until the returned registration drops.
    pub(crate) fn hand_over(
        &self,
        stream: &str,
        entries: impl IntoIterator<Item = (Vec<u8>, Entry, u64)>,
    ) -> HandedOver<'_> {
        let entries: Vec<HandedEntry> = entries
            .into_iter()
            .map(|(payload, entry, size)| HandedEntry {
                payload,
                entry: Some(entry),
                size,
            })
            .collect();
        let mut appends = self.appends.lock().unwrap_or_else(|p| p.into_inner());
        let ticket = appends.next_ticket;
        appends.next_ticket = appends.next_ticket.wrapping_add(1);
        if !entries.is_empty() {
            appends.commits.push(HandedCommit {
                ticket,
                stream: stream.to_string(),
                entries,
            });
        }
        HandedOver { memo: self, ticket }
    }

    /// The entry a writer handed over for `stream` with exactly these
    /// payload bytes, and its JSON size; taken, so it serves one event.
    pub(super) fn take_appended(&self, stream: &str, payload: &[u8]) -> Option<(Entry, u64)> {
        let mut appends = self.appends.lock().unwrap_or_else(|p| p.into_inner());
        appends
            .commits
            .iter_mut()
            .filter(|c| c.stream == stream)
            .flat_map(|c| c.entries.iter_mut())
            .find(|e| e.entry.is_some() && e.payload == payload)
            .and_then(|e| Some((e.entry.take()?, e.size)))
    }

    /// Entries handed over and not withdrawn (tests).
    #[cfg(test)]
    fn handed_entries(&self) -> usize {
        let appends = self.appends.lock().unwrap_or_else(|p| p.into_inner());
        appends.commits.iter().map(|c| c.entries.len()).sum()
    }

    /// The kept decoding of `payload`, event `event` of `commit`, if the
    /// session indexer made it from these bytes: `Some(None)` when the
    /// event did not decode.
    pub(super) fn take(
        &self,
        commit: &RecordedCommit,
        event: usize,
        payload: &[u8],
    ) -> Option<Option<(SessionEvent, Option<TranscriptParts>)>> {
        let key = SeedKey::of(commit, event, payload);
        let mut slot = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match slot.take() {
            Some(d) if d.key == key => Some(d.decoded),
            other => {
                *slot = other;
                None
            }
        }
    }
}

/// Bytes of decoded entries the [`EntryCache`] of one engine holds at
/// most, counted as the entries' [`entry_size`] plus
/// [`ENTRY_CACHE_OVERHEAD_BYTES`] each (the entry size is the length of
/// its compact JSON, close to the heap its decoded form holds).
pub const ENTRY_CACHE_BYTES_MAX: u64 = 8 << 20;

/// Bytes counted per cached entry on top of its size (map slot, key,
/// allocation headers).
pub const ENTRY_CACHE_OVERHEAD_BYTES: u64 = 128;

/// Positions of recently read, not cached entries the [`EntryCache`]
/// remembers (in two generations of half as many): an entry is cached
/// when it is read again while remembered.
pub const ENTRY_CACHE_GHOSTS_MAX: usize = 8192;

/// A decoded log entry as cached: the stream (session) of its commit and
/// the entry as the log holds it, except its parent, which is the one the
/// index gave the reader that cached it (readers always take the parent
/// from the index: a reader with another index parent copies the entry).
pub(super) struct CachedEntry {
    pub(super) sid: SessionId,
    /// Shared with the resident snapshots that hold the entry (when their
    /// index parent is the cached one).
    pub(super) entry: Arc<Entry>,
    pub(super) cost: u64,
}

/// A bounded cache of decoded transcript entries, shared by every
/// [`LogTranscriptSource`] of one engine (a block cache one level up: it
/// saves the log read, the checksum, the commit and event decoding of an
/// entry read again, e.g. the newest entries of a session opened by
/// several handles).
///
/// **Correctness.** Keys are log positions (segment id, offset, event,
/// entry index). A record at a position never changes: appends only add
/// records; rewrites write new records at new positions (the index then
/// points there); log compaction (GC) copies live records into segments
/// with ids above every existing one and retires the old ids, so no
/// position is ever reused for other bytes within one engine (the cache
/// belongs to one engine instance; a store reopened on its directory gets
/// a new engine and a new cache). A hit is checked against the reader's
/// session and entry id like a log read.
///
/// **Admission (scan resistance).** A first read of a position only
/// remembers the position (a "ghost", [`ENTRY_CACHE_GHOSTS_MAX`]); a read
/// of a remembered position caches the entry. A one-pass read of a long
/// branch (an export) therefore never fills the cache nor pays for
/// copying entries into it, while entries read again soon (the newest
/// entries of a session opened again) are cached on their second read.
/// The entries of a branch page are looked up only, never remembered nor
/// admitted: a page hands its entries to the caller, so a hit saves the
/// log read and decoding but still copies the entry, and paging through
/// a long branch would otherwise replace every remembered position of
/// the other reads (and pay the bookkeeping) for nothing. They are looked
/// up together, under one lock (`EntryCache::peek_hints`).
///
/// **Bound.** [`ENTRY_CACHE_BYTES_MAX`] in two generations: entries go to
/// the young one; when it reaches half the bound it becomes the old one
/// (the previous old one is dropped), and a hit in the old generation
/// moves the entry back to the young one. Memory never exceeds the bound
/// plus the ghosts (a few dozen bytes each); lookups and inserts are O(1).
#[derive(Default)]
pub struct EntryCache {
    inner: Mutex<EntryCacheInner>,
}

#[derive(Default)]
struct EntryCacheInner {
    young: HashMap<EntryKey, Arc<CachedEntry>, KeyHash>,
    young_bytes: u64,
    old: HashMap<EntryKey, Arc<CachedEntry>, KeyHash>,
    ghosts_young: HashSet<EntryKey, KeyHash>,
    ghosts_old: HashSet<EntryKey, KeyHash>,
}

/// The cache's hasher: keys are log positions chosen by the engine, not by
/// callers, so a multiply-rotate mix of the integers (no flooding
/// resistance needed) replaces SipHash, which cost more than the lookup.
type KeyHash = std::hash::BuildHasherDefault<KeyHasher>;

#[derive(Default)]
struct KeyHasher(u64);

impl std::hash::Hasher for KeyHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x517c_c1b7_2722_0a95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

impl EntryCacheInner {
    fn insert(&mut self, key: EntryKey, v: Arc<CachedEntry>) {
        let cost = v.cost;
        if cost > ENTRY_CACHE_BYTES_MAX / 2 {
            return; // larger than a generation: never cached
        }
        if self.young_bytes.saturating_add(cost) > ENTRY_CACHE_BYTES_MAX / 2 {
            self.old = std::mem::take(&mut self.young);
            self.young_bytes = 0;
        }
        self.young_bytes = self.young_bytes.saturating_add(cost);
        if let Some(prev) = self.young.insert(key, v) {
            self.young_bytes = self.young_bytes.saturating_sub(prev.cost);
        }
    }

    /// Whether `key` was remembered (it is forgotten then); else it is
    /// remembered now.
    fn seen_before(&mut self, key: EntryKey) -> bool {
        if self.ghosts_young.remove(&key) || self.ghosts_old.remove(&key) {
            return true;
        }
        if self.ghosts_young.len() >= ENTRY_CACHE_GHOSTS_MAX / 2 {
            self.ghosts_old = std::mem::take(&mut self.ghosts_young);
        }
        self.ghosts_young.insert(key);
        false
    }
}

impl EntryCache {
    /// The cached entry at `key`, or on a miss whether the entry read
    /// there should be cached (see the admission rule): one lock.
    pub(super) fn lookup(&self, key: EntryKey) -> (Option<Arc<CachedEntry>>, bool) {
        let mut c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = c.young.get(&key) {
            return (Some(v.clone()), false);
        }
        if let Some(v) = c.old.remove(&key) {
            c.insert(key, v.clone());
            return (Some(v), false);
        }
        (None, c.seen_before(key))
    }

    /// The cached entries of a branch page's hints, under one lock:
    /// looked up only (see the admission rule), their generations left as
    /// they are. A hit is kept in its hint (the entry is immutable; a
    /// later eviction only drops the cache's reference), a miss read from
    /// the log when the entry is loaded.
    pub(super) fn peek_hints<'h>(
        &self,
        hints: impl IntoIterator<Item = (EntryKey, &'h mut Option<Arc<CachedEntry>>)>,
    ) {
        let c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if c.young.is_empty() && c.old.is_empty() {
            return;
        }
        for (key, cached) in hints {
            *cached = c.young.get(&key).or_else(|| c.old.get(&key)).cloned();
        }
    }

    pub(super) fn insert(&self, key: EntryKey, v: Arc<CachedEntry>) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, v);
    }

    /// Bytes held (as counted against [`ENTRY_CACHE_BYTES_MAX`]).
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        let c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        c.young_bytes
            .saturating_add(c.old.values().map(|v| v.cost).sum::<u64>())
    }

    /// The cache of `engine`, created on first use. Caches are kept per
    /// engine instance in a process-wide list holding a weak reference
    /// to their engine: while the weak reference exists the engine's
    /// allocation cannot be reused by another engine, so pointer
    /// equality identifies it; caches of dropped engines are removed here.
    pub fn of(engine: &Arc<Store>) -> Arc<EntryCache> {
        static CACHES: Mutex<Vec<(Weak<Store>, Arc<EntryCache>)>> = Mutex::new(Vec::new());
        let mut all = CACHES.lock().unwrap_or_else(|p| p.into_inner());
        all.retain(|(w, _)| w.strong_count() > 0);
        let me = Arc::downgrade(engine);
        if let Some((_, c)) = all.iter().find(|(w, _)| w.ptr_eq(&me)) {
            return c.clone();
        }
        let c = Arc::new(EntryCache::default());
        all.push((me, c.clone()));
        c
    }
}

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

    /// Whether the kept values are `sid`'s and current at `now` (never
    /// at an unknown mark).
    fn holds(&self, now: Option<ChangeMark>, sid: &str) -> bool {
        now.is_some() && self.mark == now && self.sid == sid
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
/// `before` is the index's mark taken before `read` runs ([`index_mark`]:
/// `None` while the index is not settled, which keeps nothing).
fn kept<K: PartialEq + Clone, V: Clone, const N: usize, E>(
    slots: fn(&mut Memo) -> &mut Slots<K, V, N>,
    before: Option<ChangeMark>,
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
    if let Some(before) = before {
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
    before: Option<ChangeMark>,
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
    before: Option<ChangeMark>,
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

    use crate::store::log::common::index_mark;

    /// `path_block` through `read`, counting the reads that ran.
    fn block(store: &Store, sid: &str, block: u64, reads: &mut u32) -> Option<Arc<[u8]>> {
        let index = store.index();
        path_block(index_mark(index), sid, block, || -> Result<_, ()> {
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
    use super::super::source::LogTranscriptSource;
    use super::super::test_support::{append_n, open, seeded_created, user, writer_session};
    use crate::handle::HandleOptions;
    use crate::store::TranscriptBackend;
    use crate::store::{LogStore, SessionStore};
    use crate::transcript::{CancelToken, ContentBlock, Message, ReadResult};
    use crate::transcript::{EntryKind, EntrySource};

    /// A recorded commit of `events` at segment 1, offset `offset`.
    fn recorded(offset: u64, events: Vec<spool_engine::EventData>) -> RecordedCommit {
        RecordedCommit {
            info: spool_engine::CommitInfo {
                stream: "s".into(),
                version: 1,
                seq: 1,
                position: LogPosition { segment: 1, offset },
                timestamp_ms: 1,
                commit_id: spool_engine::Uuid::nil(),
            },
            expected: spool_engine::ExpectedVersion::NoStream,
            events,
            record_bytes: 0,
        }
    }

    #[test]
    fn a_handed_entry_is_taken_once_for_its_session_and_bytes_until_withdrawn() {
        let entry = |id: &str, text: &str| Entry {
            id: EntryId::parse(id).unwrap(),
            parent_id: None,
            timestamp_ms: 1,
            kind: user(text),
        };
        let (a, b) = (entry("a", "first"), entry("b", "second"));
        let memo = DecodeMemo::default();
        let handed = memo.hand_over(
            "s",
            vec![
                (b"pa".to_vec(), a.clone(), 11),
                (b"pb".to_vec(), b.clone(), 22),
            ],
        );
        assert_eq!(memo.handed_entries(), 2);
        // Another session's bytes, or other bytes: not handed over.
        assert!(memo.take_appended("t", b"pa").is_none());
        assert!(memo.take_appended("s", b"pc").is_none());
        assert!(memo.take_appended("s", b"p").is_none());
        // The right ones, in any order, each once.
        assert_eq!(memo.take_appended("s", b"pb"), Some((b, 22)));
        assert!(memo.take_appended("s", b"pb").is_none());
        // A second append in flight keeps its own entries.
        let other = memo.hand_over("t", vec![(b"pa".to_vec(), a.clone(), 33)]);
        assert_eq!(memo.take_appended("t", b"pa"), Some((a.clone(), 33)));
        drop(other);
        // Withdrawn when the append returns, taken or not.
        drop(handed);
        assert_eq!(memo.handed_entries(), 0);
        assert!(memo.take_appended("s", b"pa").is_none());
        // An append without entries registers nothing.
        let none = memo.hand_over("s", Vec::new());
        assert_eq!(memo.handed_entries(), 0);
        drop(none);
    }

    #[test]
    fn the_seed_memo_hands_a_decoding_over_once_and_only_for_its_bytes() {
        let sid = SessionId::parse("s").unwrap();
        let mut t = crate::transcript::Transcript::new();
        let e0 = Entry {
            id: EntryId::parse("e0").unwrap(),
            parent_id: None,
            timestamp_ms: 1,
            kind: user("hello"),
        };
        t.replace_all(vec![e0.clone()], Some(e0.id.clone()));
        let payload = crate::session::encode_event(&seeded_created(&sid, t)).unwrap();
        let ev = |p: Vec<u8>| spool_engine::EventData::new("session.created", p);
        let c = recorded(32, vec![ev(b"junk".to_vec()), ev(payload)]);
        let memo = DecodeMemo::default();

        let header = memo.decode_created(&c, 1, &c.events[1].payload).unwrap();
        match &header {
            SessionEvent::Created { state, .. } => assert!(state.transcript.entries().is_empty()),
            other => panic!("{other:?}"),
        }
        // Another event, or a copy of the bytes elsewhere: not these bytes.
        assert!(memo.take(&c, 0, &c.events[1].payload).is_none());
        let copy = c.clone();
        assert!(memo.take(&copy, 1, &copy.events[1].payload).is_none());
        let moved = recorded(64, c.events.clone());
        assert!(memo.take(&moved, 1, &c.events[1].payload).is_none());
        // The right bytes: taken once, with the seed's entries.
        let (taken, parts) = memo.take(&c, 1, &c.events[1].payload).unwrap().unwrap();
        assert_eq!(taken, header);
        assert_eq!(parts, Some((vec![e0.clone()], Some(e0.id.clone()))));
        assert!(memo.take(&c, 1, &c.events[1].payload).is_none());

        // An event that does not decode is handed over as such.
        assert!(memo.decode_created(&c, 0, &c.events[0].payload).is_err());
        assert!(memo.take(&c, 0, &c.events[0].payload).unwrap().is_none());

        // Cleared before the next commit.
        memo.decode_created(&c, 1, &c.events[1].payload).unwrap();
        memo.clear();
        assert!(memo.take(&c, 1, &c.events[1].payload).is_none());
    }

    /// Entries read again come from the engine's entry cache, and what a
    /// reader gets stays what the log and index say across rewrites (new
    /// positions), re-parenting (the parent comes from the index) and a
    /// reopened store (a new engine, a new cache).
    #[test]
    fn cached_entries_stay_exact_across_rewrites_and_reopens() {
        let dir = tempfile::tempdir().unwrap();
        let (store, rt) = open(dir.path());
        let (id, h) = writer_session(&rt);
        let ids = append_n(&h, 30, "m");
        let loaded =
            |store: &LogStore| store.load(&id).unwrap().unwrap().state().transcript.clone();
        let check = |store: &LogStore| {
            let t = loaded(store);
            // Three sources in turn: a miss, the admitting read, a hit.
            for _ in 0..3 {
                let src = store.source(&id).unwrap();
                for e in t.entries() {
                    assert_eq!(src.entry(&e.id).unwrap().as_deref(), Some(e), "{}", e.id);
                    // Shared from the cache, or a copy with the index's
                    // parent when a rewrite relinked the entry.
                    assert_eq!(
                        src.shared_entry(&e.id).unwrap().as_deref(),
                        Some(e),
                        "{}",
                        e.id
                    );
                }
            }
        };
        check(&store);
        let engine = store.engine().unwrap();
        let cache = EntryCache::of(&engine);
        assert!(cache.bytes() > 0, "entries read again are cached");
        assert!(cache.bytes() <= ENTRY_CACHE_BYTES_MAX);
        // A rewrite writes the entries it changes at new positions.
        h.redact(&|s| s.replace("m1", "[r]"), &CancelToken::new())
            .unwrap();
        check(&store);
        assert!(loaded(&store).get(&ids[1]).is_some_and(|e| {
            matches!(&e.kind, EntryKind::Message { message: Message::User { content } }
                if content == &vec![ContentBlock::text("[r]")])
        }));
        // Re-parenting: an aborted assistant removed from between two
        // entries; the kept entry's stored bytes name the old parent.
        h.append(EntryKind::Message {
            message: Message::Assistant {
                content: vec![ContentBlock::text("aborted")],
                stop_reason: crate::transcript::StopReason::Aborted,
                usage: Default::default(),
                model: None,
                error_message: None,
            },
        })
        .unwrap();
        h.append(EntryKind::Custom {
            custom_type: "payload".into(),
            data: serde_json::json!({"k": 1}).into(),
        })
        .unwrap();
        check(&store);
        h.remove_trailing_entries(
            &|e| {
                matches!(
                    &e.kind,
                    EntryKind::Message {
                        message: Message::Assistant { .. }
                    }
                )
            },
            &|f| f.kind == "custom",
            &CancelToken::new(),
        )
        .unwrap();
        check(&store);
        drop(h);
        drop(rt);
        drop(engine);
        drop(store);
        let (store, _rt) = open(dir.path());
        assert_eq!(EntryCache::of(&store.engine().unwrap()).bytes(), 0);
        check(&store);
    }

    /// Branch pages look entries up in the entry cache but neither admit
    /// nor remember them: paging a branch twice caches nothing and leaves
    /// no remembered position (a later read still needs two reads to be
    /// cached), while entries cached by other reads serve the pages, which
    /// stay exact either way.
    #[test]
    fn branch_pages_look_up_the_entry_cache_without_filling_it() {
        let dir = tempfile::tempdir().unwrap();
        let (store, rt) = open(dir.path());
        let (id, h) = writer_session(&rt);
        let ids = append_n(&h, 40, "p");
        let leaf = ids.last().unwrap().clone();
        let t = store.load(&id).unwrap().unwrap().state().transcript.clone();
        let want: Vec<Entry> = ids.iter().map(|i| t.get(i).unwrap().clone()).collect();
        // Reopened (a new engine, an empty cache), read by a handle that
        // keeps nothing resident: only the reads below use the cache.
        drop((h, rt, store));
        let (store, rt) = open(dir.path());
        let h = rt
            .open_handle(
                &id,
                HandleOptions::reader().with_budget(crate::transcript::Budget::new(0, 0)),
            )
            .unwrap();
        let cache = EntryCache::of(&store.engine().unwrap());
        let pages = || {
            let mut got = Vec::new();
            let mut cursor = None;
            loop {
                let sel = crate::handle::HistorySelection::BranchPage {
                    leaf: leaf.clone(),
                    order: crate::transcript::PageOrder::RootFirst,
                    cursor: cursor.take(),
                    budget: crate::transcript::PageBudget::new(1 << 20, 7),
                };
                match h.read(&sel, &CancelToken::new()).unwrap() {
                    ReadResult::Page {
                        value,
                        continuation,
                    } => {
                        got.extend(value.into_page().unwrap().entries);
                        cursor = Some(continuation);
                    }
                    ReadResult::Complete { value, .. } => {
                        got.extend(value.into_page().unwrap().entries);
                        return got;
                    }
                    other => panic!("{other:?}"),
                }
            }
        };
        let before = cache.bytes();
        assert_eq!(before, 0);
        assert_eq!(pages(), want);
        assert_eq!(pages(), want);
        assert_eq!(cache.bytes(), before, "pages admit nothing");
        // Not remembered by the pages: one read of each is not cached...
        let src = store.source(&id).unwrap();
        for e in &want {
            assert_eq!(src.entry(&e.id).unwrap().as_deref(), Some(e));
        }
        assert_eq!(cache.bytes(), before, "a first read is only remembered");
        // ...a second is, and then serves the pages.
        let src = store.source(&id).unwrap();
        for e in &want {
            assert_eq!(src.entry(&e.id).unwrap().as_deref(), Some(e));
        }
        let cached = cache.bytes();
        assert!(cached > before, "read again: cached");
        assert_eq!(pages(), want);
        assert_eq!(cache.bytes(), cached);
        // The pages found them in the cache: a range's hints carry them.
        let src = LogTranscriptSource::new(store.engine().unwrap(), id.clone());
        let depth = (want.len() - 1) as u64;
        let range = src.path_range(&leaf, depth, 0, 6, 1 << 20).unwrap();
        assert_eq!(range.map(|r| r.len()), Some(7));
        let hints = src.path_hints.borrow();
        assert_eq!(hints.hints.len(), 7);
        assert!(hints.hints.iter().all(|h| h.cached.is_some()));
    }

    /// The cache stays within its bound whatever is read, and a one-pass
    /// read fills nothing (admission needs a second read).
    #[test]
    fn the_entry_cache_is_bounded_and_scan_resistant() {
        let mut c = EntryCacheInner::default();
        let entry = Entry {
            id: EntryId::parse("x").unwrap(),
            parent_id: None,
            timestamp_ms: 0,
            kind: user("x"),
        };
        let key = |i: u64| {
            (
                LogPosition {
                    segment: 1,
                    offset: i,
                },
                0,
                0,
            )
        };
        let cost = 100_000;
        for i in 0..1000 {
            assert!(!c.seen_before(key(i)), "a first read is only remembered");
        }
        assert!(c.young.is_empty() && c.old.is_empty());
        for i in 0..1000 {
            c.insert(
                key(i),
                Arc::new(CachedEntry {
                    sid: SessionId::parse("s").unwrap(),
                    entry: Arc::new(entry.clone()),
                    cost,
                }),
            );
            let held: u64 = c.young.values().chain(c.old.values()).map(|v| v.cost).sum();
            assert!(held <= ENTRY_CACHE_BYTES_MAX, "{held} bytes held after {i}");
            assert_eq!(
                held - c.old.values().map(|v| v.cost).sum::<u64>(),
                c.young_bytes
            );
        }
        // Too large for a generation: never cached.
        c.insert(
            key(5000),
            Arc::new(CachedEntry {
                sid: SessionId::parse("s").unwrap(),
                entry: Arc::new(entry),
                cost: ENTRY_CACHE_BYTES_MAX,
            }),
        );
        assert!(!c.young.contains_key(&key(5000)));
        // Ghosts are bounded too.
        for i in 0..(ENTRY_CACHE_GHOSTS_MAX as u64 * 3) {
            c.seen_before(key(10_000 + i));
            assert!(c.ghosts_young.len() + c.ghosts_old.len() <= ENTRY_CACHE_GHOSTS_MAX);
        }
    }
}
