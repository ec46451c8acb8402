//! [`LogTranscriptSource`]: the read side, an [`EntrySource`] over one
//! session that answers from the transcript index and reads entries from
//! the log at the positions the index gives. It never writes the index.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use spool_engine::{CommitRef, Index, LogPosition, LogSpan, RecordedCommit, Store};

use super::accelerators::{self, CachedEntry, EntryCache, ENTRY_CACHE_OVERHEAD_BYTES};
use super::keys::{
    child_prefix, count_key, custom_all_key, custom_key, label_prefix, meta_key, sk, TAG_ENTRY,
    TAG_SEED, TRANSCRIPT_INDEXER,
};
use super::path_blocks::{
    block_link, block_links, decode_path_link, path_block_key, path_damage, path_link_id,
    path_slot, PATH_BLOCK_DEPTHS,
};
use super::record::{locate_record, EntryKey, EntryRecord, TranscriptMeta};
use super::seed_table::{seed_bucket_records, seed_lookup};
use crate::session::codec::{decode_appended_entry_as, decode_entry_at, event_entry_offsets};
use crate::session::{decode_event, SessionEvent, SessionId};
use crate::store::log::common::{be_u64, engine_err, index_mark, SESSION_EVENT_PREFIX};
use crate::store::StoreError;
use crate::transcript::{
    ChildLinks, CustomRef, Entry, EntryFacts, EntryId, EntrySource, PathFacts,
};

type CommitCache = Option<(LogPosition, Arc<RecordedCommit>)>;

type EventCache = Option<((LogPosition, u32), Arc<SessionEvent>)>;

/// Where the entries of a whole-transcript event start in its payload
/// (`None`: not found that way, the event is decoded whole).
type OffsetCache = Option<((LogPosition, u32), Option<Arc<[usize]>>)>;

/// Index records a [`LogTranscriptSource`] keeps decoded during its one
/// operation (a page walk asks for an entry's facts, size and payload in
/// turn; each is one index lookup and decode without the cache). When full
/// the cache is emptied, so its memory stays bounded whatever the
/// operation reads.
pub const SOURCE_RECORD_CACHE_MAX: usize = 4096;

/// An entry as [`LogTranscriptSource::load_logged`] found it.
enum Loaded {
    /// From the [`EntryCache`] (or just admitted to it): shared, its
    /// parent the one it was cached with.
    Shared(Arc<Entry>),
    /// Read from the log and not cached: owned, its parent not yet set.
    Read(Entry),
}

/// Bytes read past a page's last commit position, for that commit: its
/// entry's size (the JSON form, which MessagePack does not exceed by much)
/// plus this much for the commit's header, event kind and stream id.
const SPAN_RECORD_SLACK: u64 = 1024;

/// A page's commits are read in one span only when the span is at most
/// this many times the page's entry bytes plus [`SPAN_BYTES_FREE`]: commits
/// of other sessions between them are read along, so spread-out commits
/// are read one by one instead.
const SPAN_SPREAD_MAX: u64 = 2;

/// See [`SPAN_SPREAD_MAX`].
const SPAN_BYTES_FREE: u64 = 64 << 10;

/// Where the log bytes holding the commits `hints` name are, to be read
/// at once (one `pread` from the active segment, a borrow of a sealed
/// one's map) when they are in one segment and close together (see
/// [`SPAN_SPREAD_MAX`]); `None` otherwise (each entry is then read on its
/// own). A record the span does not wholly hold is read on its own too, so
/// the span is an optimisation only. Nothing is read here: the span is
/// read at the first entry the entry cache misses (an open of a session
/// whose entries are cached reads no log bytes).
fn page_span_plan<'h>(
    hints: impl Iterator<Item = &'h PathHint>,
    bytes: u64,
) -> Option<(LogPosition, u64)> {
    let mut segment = None;
    let (mut lo, mut hi, mut last_size) = (u64::MAX, 0u64, 0u64);
    // Appended entries (entry index 0) only: entries of a whole-transcript
    // event are read through that event (see `read_entry`).
    for h in hints.filter(|h| h.key.2 == 0) {
        let pos = h.key.0;
        if *segment.get_or_insert(pos.segment) != pos.segment {
            return None;
        }
        lo = lo.min(pos.offset);
        if pos.offset >= hi {
            hi = pos.offset;
            last_size = h.size;
        }
    }
    let segment = segment?;
    let len = (hi - lo)
        .saturating_add(last_size)
        .saturating_add(SPAN_RECORD_SLACK);
    let allowed = bytes
        .saturating_mul(SPAN_SPREAD_MAX)
        .saturating_add(SPAN_BYTES_FREE)
        .min(spool_engine::LOG_SPAN_BYTES_MAX);
    if len > allowed {
        return None;
    }
    Some((
        LogPosition {
            segment,
            offset: lo,
        },
        len,
    ))
}

/// An [`EntrySource`] over the log store's transcript index for one
/// session: facts, sizes, path facts, children, labels, summaries, the
/// active path and custom lists come from the index; an entry's payload is
/// read from the commit at its position, through the engine's shared
/// [`EntryCache`]. The last commit read, the last event decoded, where the
/// entries of the last whole-transcript event read by entry start, and up to
/// [`SOURCE_RECORD_CACHE_MAX`] index records are cached for the source's
/// lifetime, which is one operation (callers re-check the transcript
/// version after it).
pub struct LogTranscriptSource {
    engine: Arc<Store>,
    sid: SessionId,
    commit: RefCell<CommitCache>,
    event: RefCell<EventCache>,
    offsets: RefCell<OffsetCache>,
    records: RefCell<HashMap<EntryId, Arc<EntryRecord>>>,
    /// The entries of the last [`EntrySource::path_range`] answer: where
    /// each is in the log, its size and parent (read from the path links,
    /// so loading them needs no index record).
    pub(super) path_hints: RefCell<PathHints>,
    /// Where the log bytes holding the commits of the last `path_range`
    /// answer are, when they are close together (see [`page_span_plan`]),
    /// until the first entry-cache miss reads them into `span`.
    span_plan: RefCell<Option<(LogPosition, u64)>>,
    /// Those bytes, once read.
    span: RefCell<Option<LogSpan>>,
    entries: Arc<EntryCache>,
}

/// The entries of a path range, in depth order. A root-first page
/// consumes them in that order ([`PathHints::take`]: a hint serves the
/// load of the entry after the last one taken only, and an entry loaded
/// otherwise goes through its index record); a newest-first walk looks
/// them up from the back ([`PathHints::get`]). The ids are kept in one
/// buffer (one allocation per range, not one per entry): the parent of a
/// hint's entry is the entry of the hint before it.
#[derive(Default)]
pub(super) struct PathHints {
    pub(super) hints: Vec<PathHint>,
    /// The hints' ids' bytes, concatenated in hint order (each was
    /// validated as an [`EntryId`] when the link was decoded: ASCII).
    ids: Vec<u8>,
    /// The parent of the first hint's entry (one depth above the range,
    /// or an orphan's parent at depth 0).
    first_parent: Option<EntryId>,
    /// How many hints [`PathHints::take`] consumed.
    taken: usize,
    /// Where [`PathHints::get`] found its last id: a newest-first walk
    /// asks for the hint before it next.
    last_get: usize,
}

/// An id the index gave (validated when it was decoded), owned.
fn owned_id(id: Option<&str>) -> Option<EntryId> {
    id.map(EntryId::from_decoded_str)
}

/// Where an entry of a path range is, from its path link.
pub(super) struct PathHint {
    pub(super) key: EntryKey,
    size: u64,
    /// The entry as the [`EntryCache`] held it when the range was read
    /// ([`EntryCache::peek_hints`]), checked like a lookup's hit when used.
    pub(super) cached: Option<Arc<CachedEntry>>,
    /// End of its id in [`PathHints::ids`] (it starts where the previous
    /// hint's ends).
    id_end: usize,
}

impl PathHints {
    fn clear(&mut self) {
        self.hints.clear();
        self.ids.clear();
        self.first_parent = None;
        self.taken = 0;
        self.last_get = 0;
    }

    /// Adds the hint of the entry one depth below the last one (the first
    /// one's parent is `first_parent`).
    fn push(&mut self, id: &EntryId, key: EntryKey, size: u64) {
        self.ids.extend_from_slice(id.as_bytes());
        self.hints.push(PathHint {
            key,
            size,
            cached: None,
            id_end: self.ids.len(),
        });
    }

    /// The id of hint `i`, as bytes (compared and copied as bytes: no
    /// UTF-8 check on the way).
    fn id(&self, i: usize) -> Option<&[u8]> {
        let from = match i.checked_sub(1) {
            Some(before) => self.hints.get(before)?.id_end,
            None => 0,
        };
        self.ids.get(from..self.hints.get(i)?.id_end)
    }

    /// The parent of hint `i`'s entry: the one given for the first hint,
    /// else the entry of the hint before it.
    fn parent(&self, i: usize) -> Option<Option<&str>> {
        match i.checked_sub(1) {
            Some(before) => Some(Some(std::str::from_utf8(self.id(before)?).ok()?)),
            None => Some(self.first_parent.as_ref().map(EntryId::as_str)),
        }
    }

    /// The hint of `id` (its position and cached entry) with its parent
    /// when it is the next one.
    #[allow(clippy::type_complexity)]
    fn take(
        &mut self,
        id: &EntryId,
    ) -> Option<(EntryKey, Option<Arc<CachedEntry>>, Option<EntryId>)> {
        let i = self.taken;
        if self.id(i)? != id.as_bytes() {
            return None;
        }
        let h = self.hints.get_mut(i)?;
        let (key, cached) = (h.key, h.cached.take());
        let parent = match i {
            0 => self.first_parent.take(),
            // Validated when its link was decoded.
            _ => Some(EntryId::from_decoded_ascii(self.id(i - 1)?)?),
        };
        self.taken = i + 1;
        Some((key, cached, parent))
    }

    /// The hint of `id` among those not taken, left in place (a
    /// newest-first walk reads the range from its back), with its parent
    /// borrowed. `None` when `id` has no hint.
    fn get(&mut self, id: &EntryId) -> Option<(EntryKey, u64, Option<&str>)> {
        let want = id.as_bytes();
        // The hint before the last one found first (a newest-first walk),
        // else any from the back.
        let guess = self
            .last_get
            .checked_sub(1)
            .filter(|g| *g >= self.taken && self.id(*g) == Some(want));
        let i = match guess {
            Some(g) => g,
            None => (self.taken..self.hints.len())
                .rev()
                .find(|i| self.id(*i) == Some(want))?,
        };
        self.last_get = i;
        let h = self.hints.get(i)?;
        Some((h.key, h.size, self.parent(i)?))
    }
}

impl std::fmt::Debug for LogTranscriptSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogTranscriptSource")
            .field("session", &self.sid)
            .finish_non_exhaustive()
    }
}

impl LogTranscriptSource {
    pub fn new(engine: Arc<Store>, sid: SessionId) -> Self {
        LogTranscriptSource {
            entries: EntryCache::of(&engine),
            engine,
            sid,
            commit: RefCell::new(None),
            event: RefCell::new(None),
            offsets: RefCell::new(None),
            records: RefCell::new(HashMap::new()),
            path_hints: RefCell::new(PathHints::default()),
            span_plan: RefCell::new(None),
            span: RefCell::new(None),
        }
    }

    fn corrupt(&self, reason: String) -> StoreError {
        StoreError::Corrupt {
            id: self.sid.clone(),
            reason,
        }
    }

    /// The index record of an entry.
    #[cfg(test)]
    pub fn record(&self, id: &EntryId) -> Result<Option<EntryRecord>, StoreError> {
        Ok(self.cached_record(id)?.map(|r| (*r).clone()))
    }

    /// `id`'s record bytes: its `e` key or its seed table record.
    fn record_bytes(&self, id: &EntryId) -> Result<Option<Vec<u8>>, StoreError> {
        let index = self.engine.index();
        locate_record(
            self.sid.as_str(),
            id,
            |k| index.get(TRANSCRIPT_INDEXER, k).map_err(engine_err),
            |k| {
                index
                    .get_with(TRANSCRIPT_INDEXER, k, |v| seed_lookup(v, id))
                    .map_err(engine_err)
            },
            |e| self.corrupt(e),
        )
    }

    /// The index record of an entry, through the per-operation cache.
    fn cached_record(&self, id: &EntryId) -> Result<Option<Arc<EntryRecord>>, StoreError> {
        if let Some(r) = self.records.borrow().get(id) {
            return Ok(Some(r.clone()));
        }
        let index = self.engine.index();
        let read = || -> Result<Option<Arc<EntryRecord>>, StoreError> {
            let Some(b) = self.record_bytes(id)? else {
                return Ok(None);
            };
            Ok(Some(Arc::new(EntryRecord::decode(&b).map_err(|e| {
                self.corrupt(format!("index record of entry {id}: {e}"))
            })?)))
        };
        let Some(r) = accelerators::record(index_mark(index), self.sid.as_str(), id, read)? else {
            return Ok(None);
        };
        let mut cache = self.records.borrow_mut();
        if cache.len() >= SOURCE_RECORD_CACHE_MAX {
            cache.clear();
        }
        cache.insert(id.clone(), r.clone());
        Ok(Some(r))
    }

    /// The `p` block value holding depths `block << PATH_BLOCK_BITS` on,
    /// kept on this thread while the index is unchanged
    /// ([`accelerators`]).
    fn path_block(&self, block: u64) -> Result<Option<Arc<[u8]>>, StoreError> {
        let index = self.engine.index();
        let sid = self.sid.as_str();
        accelerators::path_block(index_mark(index), sid, block, || {
            index
                .get(TRANSCRIPT_INDEXER, &path_block_key(sid, block))
                .map_err(engine_err)
        })
    }

    /// A damaged active path: the read fails with an [`IndexError`]
    /// naming the session and the depth.
    fn path_damage(&self, depth: u64, what: &str) -> StoreError {
        StoreError::Engine(path_damage(self.sid.as_str(), depth, what).into())
    }

    /// The entry at `depth` on the active path, from the value of the
    /// block holding it (`None` when the block ends before it).
    fn link_id_at(&self, block: &[u8], depth: u64) -> Result<Option<EntryId>, StoreError> {
        let (_, slot) = path_slot(depth);
        let base = depth - slot as u64;
        match block_link(block, slot) {
            Ok(None) => Ok(None),
            Err(bad) => Err(self.path_damage(base + bad as u64, "malformed block value")),
            Ok(Some(link)) => path_link_id(link)
                .and_then(|b| EntryId::parse_bytes(b).ok())
                .map(Some)
                .ok_or_else(|| self.path_damage(depth, "malformed link")),
        }
    }

    /// Whether the link at `depth` on the active path names `id`, compared
    /// in place (no id is decoded or copied); `false` when the path ends
    /// before `depth`. A malformed block or link is damage, as for
    /// [`LogTranscriptSource::path_at`].
    fn path_names(&self, depth: u64, id: &EntryId) -> Result<bool, StoreError> {
        let (block, slot) = path_slot(depth);
        let Some(v) = self.path_block(block)? else {
            return Ok(false);
        };
        let base = depth - slot as u64;
        match block_link(&v, slot) {
            Ok(None) => Ok(false),
            Err(bad) => Err(self.path_damage(base + bad as u64, "malformed block value")),
            Ok(Some(link)) => match path_link_id(link) {
                // Equal to a valid id: a valid link.
                Some(b) if b == id.as_bytes() => Ok(true),
                // Another entry (rare: the leaf is off the active path),
                // checked as `path_at` would.
                Some(b) if EntryId::parse_bytes(b).is_ok() => Ok(false),
                _ => Err(self.path_damage(depth, "malformed link")),
            },
        }
    }

    /// The entry at `depth` on the active path (the current leaf's path).
    fn path_at(&self, depth: u64) -> Result<Option<EntryId>, StoreError> {
        match self.path_block(path_slot(depth).0)? {
            Some(v) => self.link_id_at(&v, depth),
            None => Ok(None),
        }
    }

    /// The commit at `pos` (the last one read is kept), checked to belong
    /// to this session.
    fn commit_at(&self, pos: LogPosition) -> Result<Arc<RecordedCommit>, StoreError> {
        let cached = self
            .commit
            .borrow()
            .as_ref()
            .filter(|(p, _)| *p == pos)
            .map(|(_, c)| c.clone());
        let commit = match cached {
            Some(c) => c,
            None => {
                let c = Arc::new(self.engine.read_at(pos).map_err(engine_err)?);
                *self.commit.borrow_mut() = Some((pos, c.clone()));
                c
            }
        };
        if commit.info.stream != self.sid.as_str() {
            return Err(self.corrupt(format!(
                "the index points at {pos}, a commit of stream {:?}",
                commit.info.stream
            )));
        }
        Ok(commit)
    }

    fn event_at(&self, pos: LogPosition, idx: u32) -> Result<Arc<SessionEvent>, StoreError> {
        if let Some((k, ev)) = &*self.event.borrow() {
            if *k == (pos, idx) {
                return Ok(ev.clone());
            }
        }
        let commit = self.commit_at(pos)?;
        let raw = usize::try_from(idx)
            .ok()
            .and_then(|i| commit.events.get(i))
            .ok_or_else(|| self.corrupt(format!("no event {idx} in the commit at {pos}")))?;
        let ev = Arc::new(
            decode_event(&raw.payload)
                .map_err(|e| self.corrupt(format!("event {idx} of the commit at {pos}: {e}")))?,
        );
        *self.event.borrow_mut() = Some(((pos, idx), ev.clone()));
        Ok(ev)
    }

    /// The entry as the log holds it, read and decoded from the commit the
    /// record names; its parent is left to the caller (it may be `None`
    /// or the parent as written: the index's is the current one). An
    /// appended entry is decoded alone
    /// ([`decode_appended_entry`](crate::session::decode_appended_entry));
    /// an entry of a
    /// whole-transcript event decodes that event (kept for the next entry
    /// of the same event).
    fn read_entry(&self, id: &EntryId, at: EntryKey) -> Result<Entry, StoreError> {
        let (pos, event, sub) = at;
        let misplaced = || {
            self.corrupt(format!(
                "entry {id} is not where the index says ({pos}, event {event}, #{sub})"
            ))
        };
        if sub == 0 {
            // Read in place: the commit is checked (stream, event) and only
            // the appended entry is decoded, from the segment's bytes (the
            // page's span when it holds the record).
            if self.span.borrow().is_none() {
                if let Some((from, len)) = self.span_plan.borrow_mut().take() {
                    // Best effort: a failed span read leaves each entry to
                    // its own read, which reports what is wrong with it.
                    *self.span.borrow_mut() = self.engine.read_span(from, len).ok();
                }
            }
            let in_span = self
                .span
                .borrow()
                .as_ref()
                .and_then(|s| s.visit(pos, |c| self.appended_in(c, event)));
            let appended = match in_span {
                Some(r) => r.map_err(engine_err)??,
                None => self
                    .engine
                    .visit_at(pos, |c| self.appended_in(c, event))
                    .map_err(engine_err)??,
            };
            if let Some(e) = appended {
                return if &e.id == id { Ok(e) } else { Err(misplaced()) };
            }
        }
        let sub = usize::try_from(sub).unwrap_or(usize::MAX);
        if let Some(e) = self.entry_by_offset(pos, event, sub)? {
            return if &e.id == id { Ok(e) } else { Err(misplaced()) };
        }
        let ev = self.event_at(pos, event)?;
        let found = match &*ev {
            SessionEvent::EntryAppended { entry } if sub == 0 => Some(entry),
            SessionEvent::Created { state, .. } => state.transcript.entries().get(sub),
            SessionEvent::HistoryRewritten { entries, .. } => entries.get(sub),
            SessionEvent::TranscriptRewritten { written, .. } => written.get(sub),
            _ => None,
        };
        found.filter(|e| &e.id == id).cloned().ok_or_else(misplaced)
    }

    /// Entry `sub` of a whole-transcript event (a `created` event's
    /// transcript, a `history_rewritten` event's entries) decoded alone: the
    /// event's layout is walked once to find where its entries start (kept
    /// for the next entry of the same event), then only this entry is
    /// decoded. A fork's first open reads a few seed entries out of a
    /// `created` event holding thousands. `None` when the event was
    /// already decoded whole, is of another kind or shape, or the entry is
    /// not there: the caller decodes the whole event, which gives the
    /// answer and the error.
    fn entry_by_offset(
        &self,
        pos: LogPosition,
        idx: u32,
        sub: usize,
    ) -> Result<Option<Entry>, StoreError> {
        if matches!(&*self.event.borrow(), Some((k, _)) if *k == (pos, idx)) {
            return Ok(None);
        }
        let commit = self.commit_at(pos)?;
        let Some(raw) = usize::try_from(idx).ok().and_then(|i| commit.events.get(i)) else {
            return Ok(None);
        };
        let cached = match &*self.offsets.borrow() {
            Some((k, o)) if *k == (pos, idx) => Some(o.clone()),
            _ => None,
        };
        let offsets = match cached {
            Some(o) => o,
            None => {
                let o = event_entry_offsets(&raw.payload).map(Arc::from);
                *self.offsets.borrow_mut() = Some(((pos, idx), o.clone()));
                o
            }
        };
        Ok(offsets
            .and_then(|o| o.get(sub).copied())
            .and_then(|at| decode_entry_at(&raw.payload, at)))
    }

    /// The entry of event `event` of `c` when that event is an
    /// `entry_appended` one (decoded alone, its parent not copied);
    /// `None` for another event; an error when the commit is not this
    /// session's or has no such event.
    fn appended_in(&self, c: CommitRef<'_>, event: u32) -> Result<Option<Entry>, StoreError> {
        let pos = c.position;
        if c.stream != self.sid.as_str() {
            return Err(self.corrupt(format!(
                "the index points at {pos}, a commit of stream {:?}",
                c.stream
            )));
        }
        let raw = usize::try_from(event)
            .ok()
            .and_then(|i| c.event(i))
            .ok_or_else(|| self.corrupt(format!("no event {event} in the commit at {pos}")))?;
        if raw.kind.strip_prefix(SESSION_EVENT_PREFIX) != Some("entry_appended") {
            return Ok(None);
        }
        // The parent is the index's (the caller sets it): not copied.
        decode_appended_entry_as(raw.payload, false)
            .map(Some)
            .map_err(|e| self.corrupt(format!("event {event} of the commit at {pos}: {e}")))
    }

    /// The entry with its current parent (from the index), through the
    /// engine's [`EntryCache`].
    fn load(&self, id: &EntryId, r: &EntryRecord) -> Result<Entry, StoreError> {
        let key = (r.position(), r.event, r.sub);
        self.load_at(id, key, r.size, r.parent.clone())
    }

    /// The entry at `key` with `parent`, through the engine's
    /// [`EntryCache`] (`size` is its [`entry_size`], the cache's cost).
    fn load_at(
        &self,
        id: &EntryId,
        key: EntryKey,
        size: u64,
        parent: Option<EntryId>,
    ) -> Result<Entry, StoreError> {
        let mut e = match self.load_logged(id, key, size, parent.as_ref().map(EntryId::as_str))? {
            Loaded::Read(e) => e,
            Loaded::Shared(shared) => Arc::try_unwrap(shared).unwrap_or_else(|a| (*a).clone()),
        };
        e.parent_id = parent;
        Ok(e)
    }

    /// [`LogTranscriptSource::load_at`] as a shared value: the cached
    /// entry itself when its parent is `parent` (always, unless a rewrite
    /// relinked it after it was cached), so nothing is copied.
    fn load_shared_at(
        &self,
        id: &EntryId,
        key: EntryKey,
        size: u64,
        parent: Option<&str>,
    ) -> Result<Arc<Entry>, StoreError> {
        let shared = match self.load_logged(id, key, size, parent)? {
            Loaded::Read(mut e) => {
                e.parent_id = owned_id(parent);
                return Ok(Arc::new(e));
            }
            Loaded::Shared(shared) => shared,
        };
        if shared.parent_id.as_ref().map(EntryId::as_str) == parent {
            return Ok(shared);
        }
        let mut e = Arc::try_unwrap(shared).unwrap_or_else(|a| (*a).clone());
        e.parent_id = owned_id(parent);
        Ok(Arc::new(e))
    }

    /// The entry at `key` from the engine's [`EntryCache`] (its parent the
    /// one the index gave when it was cached), or read from the log (the
    /// written parent is never decoded: the index's replaces it) and, when
    /// admitted, cached with `parent`. One cache lock for the lookup and
    /// the admission decision. An entry read and not admitted (every entry
    /// of a one-pass scan) is handed back owned, without its parent: the
    /// caller sets it, so it is neither copied nor boxed for sharing.
    fn load_logged(
        &self,
        id: &EntryId,
        key: EntryKey,
        size: u64,
        parent: Option<&str>,
    ) -> Result<Loaded, StoreError> {
        let (hit, admit) = self.entries.lookup(key);
        if let Some(c) = hit.filter(|c| c.sid == self.sid && &c.entry.id == id) {
            return Ok(Loaded::Shared(c.entry.clone()));
        }
        let mut e = self.read_entry(id, key)?;
        if !admit {
            return Ok(Loaded::Read(e));
        }
        e.parent_id = owned_id(parent);
        let e = Arc::new(e);
        self.entries.insert(
            key,
            Arc::new(CachedEntry {
                sid: self.sid.clone(),
                entry: e.clone(),
                cost: size.saturating_add(ENTRY_CACHE_OVERHEAD_BYTES),
            }),
        );
        Ok(Loaded::Shared(e))
    }
}

impl EntrySource for LogTranscriptSource {
    type Error = StoreError;

    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, StoreError> {
        // A hint serves one load (a page reads each entry once; a second
        // read of the same id goes through its record). Hints are taken
        // here by branch pages only: looked up in the cache, not admitted.
        let hint = self.path_hints.borrow_mut().take(id);
        if let Some((key, cached, parent)) = hint {
            // The cache was looked up when the range was read: a hit is
            // copied, a miss read from the log (not admitted).
            let mut e = match cached.filter(|c| c.sid == self.sid && &c.entry.id == id) {
                Some(c) => Entry::clone(&c.entry),
                None => self.read_entry(id, key)?,
            };
            e.parent_id = parent;
            return Ok(Some(Cow::Owned(e)));
        }
        match self.cached_record(id)? {
            Some(r) => Ok(Some(Cow::Owned(self.load(id, &r)?))),
            None => Ok(None),
        }
    }

    fn shared_entry(&self, id: &EntryId) -> Result<Option<Arc<Entry>>, StoreError> {
        {
            // Held while the entry loads (loading never uses the hints):
            // the parent is compared in place, not copied.
            let mut hints = self.path_hints.borrow_mut();
            if let Some((key, size, parent)) = hints.get(id) {
                return Ok(Some(self.load_shared_at(id, key, size, parent)?));
            }
        }
        match self.cached_record(id)? {
            Some(r) => Ok(Some(self.load_shared_at(
                id,
                (r.position(), r.event, r.sub),
                r.size,
                r.parent.as_ref().map(EntryId::as_str),
            )?)),
            None => Ok(None),
        }
    }

    /// From the transcript meta (one lookup): the session's entries are
    /// its active path when their count is the path's length and `leaf`
    /// is the current leaf (every entry counted has an index record, and
    /// the path holds distinct entries, so none is off the path).
    fn single_chain(&self, leaf: &EntryId, path_entries: u64) -> Result<Option<bool>, StoreError> {
        let Some(meta) = read_meta(self.engine.index(), &self.sid)? else {
            return Ok(Some(false));
        };
        Ok(Some(
            meta.leaf.as_ref() == Some(leaf)
                && meta.path_len == path_entries
                && meta.entries == path_entries,
        ))
    }

    /// One lookup of the entry's record, whose leading child count names
    /// the only child of an entry with one (a chain), decoded without the
    /// rest of the record; a scan of the child links for more. An id
    /// without a record (an orphan's absent parent) has its count in an
    /// `n` key. Never from the source's record cache: appends change a
    /// parent's count while its other fields stay.
    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, StoreError> {
        let sid = self.sid.as_str();
        let index = self.engine.index();
        let in_record = match self.record_bytes(id)? {
            Some(b) => Some(EntryRecord::decode_children(&b).map_err(|e| {
                self.corrupt(format!(
                    "child count in the index record of entry {id}: {e}"
                ))
            })?),
            None => None,
        };
        let (total, only) = match in_record {
            Some(c) => c,
            None => match index
                .get(TRANSCRIPT_INDEXER, &count_key(sid, id))
                .map_err(engine_err)?
            {
                None => (0, None),
                Some(b) => {
                    let total = be_u64(&b)
                        .ok_or_else(|| self.corrupt(format!("malformed child count of {id}")))?;
                    let only = match b.get(8..) {
                        Some(rest) if !rest.is_empty() => {
                            Some(EntryId::parse_bytes(rest).ok().ok_or_else(|| {
                                self.corrupt(format!("malformed only-child link of {id}"))
                            })?)
                        }
                        _ => None,
                    };
                    (total, only)
                }
            },
        };
        if total == 0 || limit == 0 {
            return Ok(ChildLinks {
                ids: Vec::new(),
                total,
            });
        }
        if let (1, Some(only)) = (total, only) {
            return Ok(ChildLinks {
                ids: vec![only],
                total,
            });
        }
        let mut ids = Vec::new();
        for kv in index.scan_prefix(TRANSCRIPT_INDEXER, &child_prefix(sid, id)) {
            let (_, v) = kv.map_err(engine_err)?;
            let child = EntryId::parse_bytes(&v)
                .ok()
                .ok_or_else(|| self.corrupt(format!("malformed child link of {id}")))?;
            ids.push(child);
            if ids.len() >= limit {
                break;
            }
        }
        Ok(ChildLinks { ids, total })
    }

    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, StoreError> {
        Ok(self.cached_record(id)?.map(|r| EntryFacts {
            parent_id: r.parent.clone(),
            kind: r.kind.clone(),
            marker: r.marker.clone(),
        }))
    }

    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, StoreError> {
        Ok(self.cached_record(id)?.map(|r| r.size))
    }

    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, StoreError> {
        Ok(self.cached_record(id)?.map(|r| r.facts.clone()))
    }

    /// From the active-path index: answered when `from` is on the current
    /// leaf's path (the link at its depth names it), else `None` and the
    /// caller walks. O(1): `from`'s record and one or two block lookups.
    fn ancestor_at_depth(&self, from: &EntryId, depth: u64) -> Result<Option<EntryId>, StoreError> {
        let Some(r) = self.cached_record(from)? else {
            return Ok(None);
        };
        let from_depth = r.facts.depth;
        if depth > from_depth {
            return Ok(None);
        }
        let (from_block, _) = path_slot(from_depth);
        let Some(v) = self.path_block(from_block)? else {
            return Ok(None);
        };
        if self.link_id_at(&v, from_depth)?.as_ref() != Some(from) {
            return Ok(None);
        }
        if path_slot(depth).0 == from_block {
            self.link_id_at(&v, depth)
        } else {
            self.path_at(depth)
        }
    }

    /// From the active-path index when `leaf` is on the current leaf's
    /// path: one lookup of each `p` block from the one holding the
    /// range's first depth's parent to the one holding its last (a block
    /// holds 64 depths; the links carry each entry's log position and
    /// size, and the parent is the entry one depth up), no per-entry
    /// record lookups. Loading the returned entries then reads the log
    /// directly.
    fn path_range(
        &self,
        leaf: &EntryId,
        leaf_depth: u64,
        start: u64,
        end: u64,
        bytes_max: u64,
    ) -> Result<Option<Vec<(EntryId, u64)>>, StoreError> {
        let mut hints = self.path_hints.borrow_mut();
        hints.clear();
        *self.span.borrow_mut() = None;
        *self.span_plan.borrow_mut() = None;
        if start > end || end > leaf_depth {
            return Ok(None);
        }
        let (leaf_block, leaf_slot) = path_slot(leaf_depth);
        let (end_block, _) = path_slot(end);
        // Whether the link at the leaf's depth names the leaf: checked
        // during the scan when the leaf's block is the range's last one.
        let mut leaf_here: Option<bool> = None;
        if leaf_block != end_block {
            if !self.path_names(leaf_depth, leaf)? {
                return Ok(None);
            }
            leaf_here = Some(true);
        }
        // From the parent of the first entry.
        let from = start.saturating_sub(1);
        let (from_block, _) = path_slot(from);
        let cap = usize::try_from(end - start)
            .unwrap_or(0)
            .saturating_add(1)
            .min(1 << 12);
        let mut out: Vec<(EntryId, u64)> = Vec::with_capacity(cap);
        // The hints of the range, allocated once (ids about the leaf's
        // length; at most `cap` of them, itself bounded), not grown link
        // by link: growing them by doubling, entry by entry, cost a page
        // more than the reservation.
        hints.hints.reserve(cap);
        hints.ids.reserve(cap.saturating_mul(leaf.as_bytes().len()));
        let mut damage: Option<(u64, &str)> = None;
        let mut parent: Option<EntryId> = None;
        let mut bytes = 0u64;
        // The blocks from `from`'s on, one lookup each (kept on this thread
        // while the index is unchanged: consecutive pages share blocks),
        // taking depths up to `end`, stopping after the entry that takes
        // the sizes past `bytes_max`, or at a missing block or a short
        // block before the last (a write raced the read).
        let mut next = from;
        let mut visit = |block: u64, v: &[u8]| -> bool {
            let Some(base) = block.checked_mul(PATH_BLOCK_DEPTHS) else {
                damage = Some((next, "block past the deepest depth"));
                return false;
            };
            if block > from_block && base != next {
                return false;
            }
            let mut taking = true;
            // Every link of the block is checked (a damaged block
            // fails the read even past the depths taken).
            for (slot, link) in block_links(v).enumerate() {
                let depth = base + slot as u64;
                let link = match link {
                    Ok(l) => l,
                    Err(bad) => {
                        damage = Some((base + bad as u64, "malformed block value"));
                        return false;
                    }
                };
                if block == leaf_block && slot == leaf_slot {
                    leaf_here = Some(path_link_id(link) == Some(leaf.as_bytes()));
                }
                if !taking || depth < from {
                    continue;
                }
                if depth > end {
                    taking = false;
                    continue;
                }
                let Some(link) = decode_path_link(link) else {
                    damage = Some((depth, "malformed link"));
                    return false;
                };
                next = depth + 1;
                if depth >= start {
                    // The first entry's parent is given; every
                    // later one's is the entry before it.
                    if depth == 0 {
                        hints.first_parent = link.orphan_parent;
                    } else if depth == start {
                        hints.first_parent = parent.take();
                    }
                    bytes = bytes.saturating_add(link.size);
                    hints.push(&link.id, link.key, link.size);
                    out.push((link.id, link.size));
                    if bytes > bytes_max {
                        taking = false;
                    }
                } else {
                    parent = Some(link.id);
                }
            }
            taking && block < end_block
        };
        let mut block = from_block;
        loop {
            let Some(v) = self.path_block(block)? else {
                break;
            };
            if !visit(block, &v) {
                break;
            }
            block = match block.checked_add(1) {
                Some(b) => b,
                None => break,
            };
        }
        if let Some((depth, what)) = damage {
            hints.clear();
            return Err(self.path_damage(depth, what));
        }
        if leaf_here.is_none() {
            // The scan stopped before the leaf's depth (the bytes ran out).
            leaf_here = Some(self.path_names(leaf_depth, leaf)?);
        }
        // Exactly the depths `start..next` were taken, in order; short of
        // `end` without passing the bytes (a depth is missing: a write
        // raced the read, which the caller's version check reports) is
        // left to the walk, as is a leaf off the active path.
        if leaf_here != Some(true) || next <= start || (next <= end && bytes <= bytes_max) {
            hints.clear();
            return Ok(None);
        }
        let slots = hints.hints.iter_mut().map(|h| (h.key, &mut h.cached));
        self.entries.peek_hints(slots);
        *self.span_plan.borrow_mut() = page_span_plan(hints.hints.iter(), bytes);
        Ok(Some(out))
    }

    /// Ordinals are dense per list (removed entries leave tombstones), so
    /// a page is a run of point lookups from `after_seq + 1`: O(page plus
    /// removed entries in it), never a scan from the start.
    fn custom_entries_after(
        &self,
        custom_type: Option<&str>,
        after_seq: Option<u64>,
        limit: usize,
    ) -> Result<Option<Vec<CustomRef>>, StoreError> {
        let sid = self.sid.as_str();
        let index = self.engine.index();
        let mut out = Vec::new();
        let mut ordinal = after_seq.map_or(0, |s| s.saturating_add(1));
        while out.len() < limit {
            let key = match custom_type {
                Some(t) => custom_key(sid, t, ordinal),
                None => custom_all_key(sid, ordinal),
            };
            let Some(v) = index.get(TRANSCRIPT_INDEXER, &key).map_err(engine_err)? else {
                break;
            };
            if !v.is_empty() {
                let id = EntryId::parse_bytes(&v)
                    .ok()
                    .ok_or_else(|| self.corrupt("malformed custom-entry link".into()))?;
                out.push(CustomRef { seq: ordinal, id });
            }
            ordinal = match ordinal.checked_add(1) {
                Some(o) => o,
                None => break,
            };
        }
        Ok(Some(out))
    }

    fn label(&self, id: &EntryId) -> Result<Option<String>, StoreError> {
        let mut last: Option<Option<String>> = None;
        for kv in self
            .engine
            .index()
            .scan_prefix(TRANSCRIPT_INDEXER, &label_prefix(self.sid.as_str(), id))
        {
            let (_, v) = kv.map_err(engine_err)?;
            last = Some(
                rmp_serde::from_slice(&v)
                    .map_err(|e| self.corrupt(format!("label of {id}: {e}")))?,
            );
        }
        Ok(last.flatten())
    }

    fn summary(&self, id: &EntryId) -> Result<Option<String>, StoreError> {
        Ok(self.cached_record(id)?.map(|r| r.summary.clone()))
    }
}

/// The transcript meta of a session, `None` if it has none.
pub fn read_meta(index: &Index, sid: &SessionId) -> Result<Option<TranscriptMeta>, StoreError> {
    match index
        .get(TRANSCRIPT_INDEXER, &meta_key(sid.as_str()))
        .map_err(engine_err)?
    {
        Some(b) => rmp_serde::from_slice(&b)
            .map(Some)
            .map_err(|e| StoreError::Corrupt {
                id: sid.clone(),
                reason: format!("transcript meta index entry: {e}"),
            }),
        None => Ok(None),
    }
}

/// Every entry id of a session's current generation, in id byte order.
pub fn entry_ids(index: &Index, sid: &SessionId) -> Result<Vec<EntryId>, StoreError> {
    Ok(entry_records(index, sid)?
        .into_iter()
        .map(|(id, _)| id)
        .collect())
}

/// Every entry record of a session's current generation (the encoded
/// [`EntryRecord`]), in id byte order: the `e` keys and the seed table's
/// records that no `e` key shadows.
pub fn entry_records(
    index: &Index,
    sid: &SessionId,
) -> Result<Vec<(EntryId, Vec<u8>)>, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        id: sid.clone(),
        reason,
    };
    let parse = |b: &[u8]| {
        EntryId::parse_bytes(b)
            .ok()
            .ok_or_else(|| corrupt("malformed entry id in the transcript index".into()))
    };
    let mut out: BTreeMap<Vec<u8>, Option<(EntryId, Vec<u8>)>> = BTreeMap::new();
    let prefix = sk(TAG_SEED, sid.as_str());
    for kv in index.scan_prefix(TRANSCRIPT_INDEXER, &prefix) {
        let (k, v) = kv.map_err(engine_err)?;
        let records = seed_bucket_records(&v)
            .map_err(|e| corrupt(format!("seed bucket {:?}: {e}", k.get(prefix.len()..))))?;
        for (id, record) in records {
            // A duplicate id (damaged data): the first stays, as in `Transcript`.
            if !out.contains_key(id) {
                out.insert(id.to_vec(), Some((parse(id)?, record.to_vec())));
            }
        }
    }
    let prefix = sk(TAG_ENTRY, sid.as_str());
    for kv in index.scan_prefix(TRANSCRIPT_INDEXER, &prefix) {
        let (k, v) = kv.map_err(engine_err)?;
        let raw = k.get(prefix.len()..).unwrap_or_default();
        let record = if v.is_empty() {
            None
        } else {
            Some((parse(raw)?, v))
        };
        out.insert(raw.to_vec(), record);
    }
    Ok(out.into_values().flatten().collect())
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{append_n, open, user, writer_session};
    use super::*;
    use crate::handle::HandleOptions;
    use crate::store::SessionStore;
    use crate::store::TranscriptBackend;
    use crate::transcript::CancelToken;

    /// `single_chain` says yes exactly while every entry is on the path
    /// of the current leaf: not after a branch, nor after a leaf move up,
    /// and again once the entries off the path are removed. A handle's
    /// snapshot equals the selection over the loaded transcript (which
    /// asks for every child count) in each state.
    #[test]
    fn single_chain_follows_branches_leaf_moves_and_removals() {
        let dir = tempfile::tempdir().unwrap();
        let (store, rt) = open(dir.path());
        let (id, h) = writer_session(&rt);
        let chain = |want: bool| {
            let t = store.load(&id).unwrap().unwrap().state().transcript.clone();
            let leaf = t.leaf().cloned();
            let src = store.source(&id).unwrap();
            let path = t.current_path().unwrap().len() as u64;
            if let Some(leaf) = &leaf {
                assert_eq!(src.single_chain(leaf, path).unwrap(), Some(want));
                // Another entry than the leaf, or another length: no.
                assert_eq!(src.single_chain(leaf, path + 1).unwrap(), Some(false));
                let root = t.current_path().unwrap()[0].id.clone();
                if &root != leaf {
                    assert_eq!(src.single_chain(&root, 1).unwrap(), Some(false));
                }
            }
            let budget = crate::transcript::Budget::new(600, 64);
            let fresh = rt
                .open_handle(&id, HandleOptions::reader().with_budget(budget))
                .unwrap()
                .snapshot();
            let reference = crate::transcript::select_resident(&t, leaf.as_ref(), budget).unwrap();
            assert_eq!(fresh.selection, reference);
        };
        let ids = append_n(&h, 40, "m");
        chain(true);
        // A branch under an older entry: the new leaf's path is shorter
        // than the entry count.
        let branch = h
            .append_entry(Entry {
                id: EntryId::generate(),
                parent_id: Some(ids[20].clone()),
                timestamp_ms: 1,
                kind: user("b"),
            })
            .unwrap();
        chain(false);
        h.move_leaf(Some(ids[39].clone())).unwrap();
        chain(false);
        h.move_leaf(Some(ids[30].clone())).unwrap();
        chain(false);
        // The branch removed (the leaf goes back to its parent, the rest
        // of the chain is off the path), then the leaf moved to the end:
        // a chain again.
        h.move_leaf(Some(branch.clone())).unwrap();
        let none = |_: &crate::transcript::EntryFacts| false;
        h.remove_trailing_entries(&|e| e.id == branch, &none, &CancelToken::new())
            .unwrap();
        chain(false);
        h.move_leaf(Some(ids[39].clone())).unwrap();
        chain(true);
        // Trailing entries removed: still a chain, a shorter one.
        let tail = &ids[35..];
        h.remove_trailing_entries(&|e| tail.contains(&e.id), &none, &CancelToken::new())
            .unwrap();
        assert_eq!(h.snapshot().leaf.as_ref(), Some(&ids[34]));
        chain(true);
    }

    #[test]
    fn path_hints_give_each_entry_its_position_size_and_parent() {
        let id = |s: &str| EntryId::parse(s).unwrap();
        let key = |n: u64| {
            (
                LogPosition {
                    segment: 1,
                    offset: n,
                },
                0u32,
                0u32,
            )
        };
        let mut hints = PathHints {
            first_parent: Some(id("root")),
            ..PathHints::default()
        };
        for (n, s) in ["a", "bb", "ccc"].iter().enumerate() {
            hints.push(&id(s), key(n as u64), 10 + n as u64);
        }
        // Newest first (the walk): each found from the back, its parent
        // the entry before it, the first one's the given parent.
        let got = |h: &mut PathHints, s: &str| {
            h.get(&id(s))
                .map(|(k, size, p)| (k, size, p.map(str::to_owned)))
        };
        assert_eq!(
            got(&mut hints, "ccc"),
            Some((key(2), 12, Some("bb".into())))
        );
        assert_eq!(got(&mut hints, "bb"), Some((key(1), 11, Some("a".into()))));
        assert_eq!(
            got(&mut hints, "a"),
            Some((key(0), 10, Some("root".into())))
        );
        // Out of order and absent ids.
        assert_eq!(
            got(&mut hints, "ccc"),
            Some((key(2), 12, Some("bb".into())))
        );
        assert_eq!(got(&mut hints, "zz"), None);
        // Root first (a page): only the next one is served, each once,
        // with the cached entry found for it, if any.
        hints.hints[1].cached = Some(Arc::new(CachedEntry {
            sid: SessionId::parse("s").unwrap(),
            entry: Arc::new(Entry::new(None, crate::transcript::EntryKind::Reset)),
            cost: 1,
        }));
        let took = |h: &mut PathHints, s: &str| {
            h.take(&id(s))
                .map(|(k, cached, p)| (k, cached.is_some(), p))
        };
        assert_eq!(took(&mut hints, "bb"), None);
        assert_eq!(
            took(&mut hints, "a"),
            Some((key(0), false, Some(id("root"))))
        );
        assert_eq!(took(&mut hints, "a"), None);
        assert_eq!(took(&mut hints, "bb"), Some((key(1), true, Some(id("a")))));
        // A taken hint is no longer looked up.
        assert_eq!(got(&mut hints, "a"), None);
        assert_eq!(
            took(&mut hints, "ccc"),
            Some((key(2), false, Some(id("bb"))))
        );
        assert_eq!(took(&mut hints, "ccc"), None);
        hints.clear();
        assert_eq!(got(&mut hints, "ccc"), None);
        // An orphan range start: no parent.
        hints.push(&id("x"), key(7), 1);
        assert_eq!(took(&mut hints, "x"), Some((key(7), false, None)));
    }
}
