//! [`TranscriptIndexer`]: the engine indexer that keeps the transcript
//! index in step with the log, one session commit at a time (appends, fork
//! seeds, leaf moves, delta and whole rewrites, clears, purges). It writes
//! the index; it never reads entries back from the log.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};

use spool_engine::{IndexBatch, IndexError, Indexer, LogPosition, RecordedCommit};

use super::accelerators::DecodeMemo;
use super::child_counts::{
    add_child, add_child_read, batch_children, count_value, remove_child, take_absent_count,
};
use super::keys::{
    child_key, count_key, custom_all_key, custom_key, custom_next_key, entry_key, label_key,
    meta_key, sk, ENTRY_TAGS,
};
use super::keys::{TRANSCRIPT_INDEXER, TRANSCRIPT_INDEX_VERSION};
use super::path_blocks::{
    append_path_link, path_link_id, path_value, write_path_blocks, PathBlocks,
};
use super::record::{
    decode, encode, get_record, get_record_bytes, put_record, remove_record, EntryRecord,
    TranscriptMeta,
};
use super::seed_table::{encode_seed_bucket, seed_bucket, seed_key, SeedRecord, SEED_BUCKETS};
use crate::session::codec::{decode_appended_entry, decode_event_split, TranscriptParts};
use crate::session::{decode_event, SessionEvent};
use crate::store::log::common::{be_u64, PURGE_EVENT_KIND, SESSION_EVENT_PREFIX};
use crate::transcript::{
    custom_type, entry_size, entry_summary, first_kept_depth, label_value, parent_json_len,
    ChildLinks, Entry, EntryFacts, EntryId, EntrySource, PathFacts, PathMarker, ResidentError,
    TREE_SUMMARY_CHARS_MAX,
};

/// Maintains the transcript index from the log. See the module docs.
///
/// [`TranscriptIndexer::default`] decodes every event itself;
/// [`TranscriptIndexer::with_memo`] takes a `created` event's decoding
/// from a session indexer sharing the memo
/// ([`SessionIndexer::with_memo`](crate::store::log::sessions::SessionIndexer::with_memo)).
#[derive(Debug, Default)]
pub struct TranscriptIndexer {
    memo: Option<Arc<DecodeMemo>>,
    /// What the last commit wrote, decoded (see [`WrittenMemo`]).
    written: Mutex<WrittenMemo>,
}

impl TranscriptIndexer {
    /// A transcript indexer taking `created` decodings from `memo`.
    pub fn with_memo(memo: Arc<DecodeMemo>) -> Self {
        TranscriptIndexer {
            memo: Some(memo),
            written: Mutex::new(WrittenMemo::default()),
        }
    }
}

/// Index values the last commit wrote, kept decoded with their bytes: the
/// next commit reads those bytes back (the next append's parent record, the
/// session's meta) and takes the decoded value instead of decoding them
/// (a visible part of an append). Only bytes equal to the
/// kept ones are answered from it, so it answers what decoding them would,
/// whatever was written or discarded in between.
#[derive(Debug, Default)]
struct WrittenMemo {
    record: Option<LastRecord>,
    meta: Option<(Vec<u8>, TranscriptMeta)>,
}

/// The entry record an append wrote, with its bytes (see [`WrittenMemo`]).
#[derive(Debug)]
struct LastRecord {
    bytes: Vec<u8>,
    record: EntryRecord,
}

/// A parent's record as an append read it: decoded, with the bytes it was
/// decoded from (its child count is then written back by splicing them,
/// [`splice_child_count`], instead of encoding the whole record again).
struct ReadRecord {
    record: EntryRecord,
    bytes: Vec<u8>,
}

/// `id`'s record from the batch, taken from `last` when its bytes are the
/// ones `last` holds.
fn get_record_read(
    batch: &IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
    last: &mut Option<LastRecord>,
) -> Result<Option<ReadRecord>, IndexError> {
    let Some(bytes) = get_record_bytes(batch, sid, id)? else {
        return Ok(None);
    };
    let record = match last.take() {
        Some(l) if l.bytes == bytes => {
            debug_assert_eq!(
                EntryRecord::decode(&bytes).ok().as_ref(),
                Some(&l.record),
                "a record is the decoding of its bytes"
            );
            l.record
        }
        _ => EntryRecord::decode(&bytes)
            .map_err(|e| IndexError::Malformed(format!("entry record of {id}: {e}")))?,
    };
    Ok(Some(ReadRecord { record, bytes }))
}

/// The read side of a batch as an [`EntrySource`] of facts (for
/// [`first_kept_depth`] at append time; payloads are never needed).
struct BatchSource<'a, 'b> {
    batch: &'a IndexBatch<'b>,
    sid: &'a str,
}

impl EntrySource for BatchSource<'_, '_> {
    type Error = IndexError;

    fn entry(&self, _id: &EntryId) -> Result<Option<Cow<'_, Entry>>, IndexError> {
        // Only facts are read while indexing.
        Ok(None)
    }

    fn children(&self, _id: &EntryId, _limit: usize) -> Result<ChildLinks, IndexError> {
        Ok(ChildLinks::default())
    }

    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, IndexError> {
        Ok(get_record(self.batch, self.sid, id)?.map(|r| EntryFacts {
            parent_id: r.parent,
            kind: r.kind,
            marker: r.marker,
        }))
    }

    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, IndexError> {
        Ok(get_record(self.batch, self.sid, id)?.map(|r| r.size))
    }

    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, IndexError> {
        Ok(get_record(self.batch, self.sid, id)?.map(|r| r.facts))
    }
}

/// The facts of an entry whose parent is `parent` (read from the batch).
fn facts_for(
    batch: &IndexBatch<'_>,
    sid: &str,
    entry_parent: Option<&EntryId>,
    entry: &Entry,
) -> Result<PathFacts, IndexError> {
    let parent = match entry_parent {
        Some(p) => get_record(batch, sid, p)?,
        None => None,
    };
    facts_under(batch, sid, parent.as_ref(), entry)
}

/// The facts of an entry whose parent's record is `parent` (`None`: a
/// root, or an orphan).
fn facts_under(
    batch: &IndexBatch<'_>,
    sid: &str,
    parent: Option<&EntryRecord>,
    entry: &Entry,
) -> Result<PathFacts, IndexError> {
    Ok(match parent {
        None => PathFacts::root(entry),
        Some(pr) => {
            let view = BatchSource { batch, sid };
            let kept = match first_kept_depth(&view, entry, pr.facts.depth) {
                Ok(k) => k,
                Err(ResidentError::Source(e)) => return Err(e),
                // A damaged parent chain: the compaction keeps nothing.
                Err(_) => None,
            };
            PathFacts::child(&pr.facts, entry, kept)
        }
    })
}

/// Facts for a stored entry recomputed from its record alone (no
/// payload): [`PathFacts::child`] only needs the marker and the id.
fn facts_from_record(
    batch: &IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
    r: &EntryRecord,
) -> Result<PathFacts, IndexError> {
    // A stand-in entry with the same id, parent and path marker.
    let stand_in = r.marker.stand_in_entry(id.clone(), r.parent.clone());
    facts_for(batch, sid, r.parent.as_ref(), &stand_in)
}

struct Locator {
    position: LogPosition,
    event: u32,
}

/// The record of a new entry, with its custom-list and label keys written
/// and the entry counted in `meta`; the caller writes the record (with its
/// child count set) and the child count and child links of its parent.
/// `next_ordinal` hands out the next ordinal of a custom type (read from
/// the index for an append, from memory for a seed).
#[allow(clippy::too_many_arguments)]
fn new_entry_record(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    meta: &mut TranscriptMeta,
    entry: &Entry,
    loc: &Locator,
    sub: u32,
    facts: PathFacts,
    size: u64,
    next_ordinal: &mut dyn FnMut(&mut IndexBatch<'_>, &str) -> Result<u64, IndexError>,
) -> Result<EntryRecord, IndexError> {
    let seq = meta.next_seq;
    meta.next_seq = meta.next_seq.saturating_add(1);
    let custom = match custom_type(entry) {
        Some(t) => {
            let ordinal = next_ordinal(batch, t)?;
            let all = meta.custom_next;
            meta.custom_next = meta.custom_next.saturating_add(1);
            batch.insert(&custom_key(sid, t, ordinal), entry.id.as_bytes());
            batch.insert(&custom_all_key(sid, all), entry.id.as_bytes());
            Some((t.to_string(), ordinal, all))
        }
        None => None,
    };
    let label_target = match label_value(entry) {
        Some((target, label)) => {
            batch.insert(&label_key(sid, &target, seq), &encode("label", &label)?);
            Some(target)
        }
        None => None,
    };
    let record = EntryRecord {
        children: 0,
        only_child: None,
        segment: loc.position.segment,
        offset: loc.position.offset,
        event: loc.event,
        sub,
        size,
        kind: entry.kind_name().to_string(),
        parent: entry.parent_id.clone(),
        marker: PathMarker::of(entry),
        facts,
        seq,
        custom,
        label_target,
        summary: entry_summary(entry, TREE_SUMMARY_CHARS_MAX).0,
    };
    meta.entries = meta.entries.saturating_add(1);
    Ok(record)
}

/// `last` is the record the previous call wrote (see [`LastRecord`]); this
/// call leaves its own there.
#[allow(clippy::too_many_arguments)]
fn index_entry(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    meta: &mut TranscriptMeta,
    entry: &Entry,
    loc: &Locator,
    sub: u32,
    known_size: Option<u64>,
    last: &mut Option<LastRecord>,
) -> Result<Option<(u64, Vec<u8>)>, IndexError> {
    let exists = if meta.seed_table {
        get_record_bytes(batch, sid, &entry.id)?.is_some()
    } else {
        batch.get(&entry_key(sid, &entry.id))?.is_some()
    };
    if exists {
        // A duplicate id (only in whole-transcript events): the first
        // occurrence stays authoritative, as in `Transcript`.
        return Ok(None);
    }
    // The parent's record is read once: for the facts, then changed to
    // count the new child (a chain append rewrites it, so its only new
    // key is the entry's own record).
    let parent = match &entry.parent_id {
        Some(p) => get_record_read(batch, sid, p, last)?,
        None => None,
    };
    let facts = facts_under(batch, sid, parent.as_ref().map(|r| &r.record), entry)?;
    let depth = facts.depth;
    if let Some(p) = &entry.parent_id {
        // Counted before the entry's record exists, so a parent that is
        // the entry itself (a cycle in damaged data) is counted in an `n`
        // key, which the record then takes over like any orphan's count.
        let read = parent.map(|r| (r.record, Some(r.bytes)));
        add_child_read(batch, sid, p, read, &entry.id, meta.next_seq)?;
    }
    let size = known_size.unwrap_or_else(|| entry_size(entry));
    let mut record = new_entry_record(
        batch,
        sid,
        meta,
        entry,
        loc,
        sub,
        facts,
        size,
        &mut |batch, t| {
            let nk = custom_next_key(sid, t);
            let ordinal = batch.get(&nk)?.and_then(|b| be_u64(&b)).unwrap_or(0);
            batch.insert(&nk, &ordinal.saturating_add(1).to_be_bytes());
            Ok(ordinal)
        },
    )?;
    // Children that arrived first (orphans whose absent parent this entry
    // is): their count moves from the `n` key into the record.
    (record.children, record.only_child) = take_absent_count(batch, sid, &entry.id)?;
    let bytes = record.encode();
    batch.insert(&entry_key(sid, &entry.id), &bytes);
    let path = path_value(&entry.id, &record);
    *last = Some(LastRecord { bytes, record });
    Ok(Some((depth, path)))
}

/// The seed's entries indexed so far, as an [`EntrySource`] of facts (for
/// [`first_kept_depth`]): entry id → position of its record.
struct SeedSource<'a> {
    at: &'a foldhash::HashMap<&'a EntryId, usize>,
    records: &'a [EntryRecord],
}

impl SeedSource<'_> {
    fn record(&self, id: &EntryId) -> Option<&EntryRecord> {
        self.at.get(id).and_then(|&i| self.records.get(i))
    }
}

impl EntrySource for SeedSource<'_> {
    type Error = std::convert::Infallible;

    fn entry(&self, _id: &EntryId) -> Result<Option<Cow<'_, Entry>>, Self::Error> {
        // Only facts are read while indexing.
        Ok(None)
    }

    fn children(&self, _id: &EntryId, _limit: usize) -> Result<ChildLinks, Self::Error> {
        Ok(ChildLinks::default())
    }

    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, Self::Error> {
        Ok(self.record(id).map(|r| EntryFacts {
            parent_id: r.parent.clone(),
            kind: r.kind.clone(),
            marker: r.marker.clone(),
        }))
    }

    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, Self::Error> {
        Ok(self.record(id).map(|r| r.size))
    }

    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, Self::Error> {
        Ok(self.record(id).map(|r| r.facts.clone()))
    }
}

/// Indexes a whole seed transcript (a `created` event's) into a session
/// whose per-entry keys were just cleared: the same keys and values as
/// [`index_entry`] for each entry in order followed by [`sync_path`], but
/// computed in memory. Every lookup of an earlier entry (duplicates,
/// parents' facts, child counts, custom ordinals, the path walk) is
/// answered from the records this seed built — after the clear the
/// session has nothing else — so no index read is made and no record is
/// decoded again; child counts and custom ordinals are written once with
/// their final values.
fn index_seed(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    meta: &mut TranscriptMeta,
    entries: &[Entry],
    leaf: Option<&EntryId>,
    loc: &Locator,
) -> Result<(), IndexError> {
    debug_assert_eq!(meta.entries, 0, "a seed is indexed into a cleared session");
    // foldhash: std's SipHash over thousands of ids was a visible part of a fork.
    let mut at: foldhash::HashMap<&EntryId, usize> =
        foldhash::HashMap::with_capacity_and_hasher(entries.len(), Default::default());
    let mut records: Vec<EntryRecord> = Vec::with_capacity(entries.len());
    // The id of each record (records are written once, with their child
    // counts, after every entry is seen).
    let mut ids: Vec<&EntryId> = Vec::with_capacity(entries.len());
    // Per parent: the number of children and the first child with its seq
    // (the only one when the count stays 1, which the count then names;
    // the second child writes the links of both, as `add_child` does).
    let mut child_counts: foldhash::HashMap<&EntryId, (u64, &EntryId, u64)> =
        foldhash::HashMap::default();
    let mut custom_next: HashMap<String, u64> = HashMap::new();
    for (k, entry) in entries.iter().enumerate() {
        if at.contains_key(&entry.id) {
            // A duplicate id: the first occurrence stays authoritative.
            continue;
        }
        let parent = entry
            .parent_id
            .as_ref()
            .and_then(|p| at.get(p))
            .and_then(|&i| records.get(i));
        let facts = match parent {
            None => PathFacts::root(entry),
            Some(pr) => {
                let view = SeedSource {
                    at: &at,
                    records: &records,
                };
                // A damaged parent chain: the compaction keeps nothing.
                let kept = first_kept_depth(&view, entry, pr.facts.depth)
                    .ok()
                    .flatten();
                PathFacts::child(&pr.facts, entry, kept)
            }
        };
        let sub = u32::try_from(k).unwrap_or(u32::MAX);
        let size = entry_size(entry);
        let record = new_entry_record(
            batch,
            sid,
            meta,
            entry,
            loc,
            sub,
            facts,
            size,
            &mut |_, t| {
                let next = custom_next.entry(t.to_string()).or_insert(0);
                let ordinal = *next;
                *next = next.saturating_add(1);
                Ok(ordinal)
            },
        )?;
        if let Some(p) = &entry.parent_id {
            let n = child_counts.entry(p).or_insert((0, &entry.id, record.seq));
            if n.0 == 1 {
                batch.insert(&child_key(sid, p, n.2), n.1.as_bytes());
            }
            if n.0 >= 1 {
                batch.insert(&child_key(sid, p, record.seq), entry.id.as_bytes());
            }
            n.0 = n.0.saturating_add(1);
        }
        at.insert(&entry.id, records.len());
        records.push(record);
        ids.push(&entry.id);
    }
    // Each count goes into its parent's record, or into an `n` key for a
    // parent the seed does not hold (as appending one by one leaves them:
    // a parent that comes after its children takes their `n` count over).
    for (parent, (n, first, _)) in child_counts {
        match at.get(parent).and_then(|&i| records.get_mut(i)) {
            Some(r) => {
                r.children = n;
                r.only_child = (n == 1).then(|| first.clone());
            }
            None => batch.insert(&count_key(sid, parent), &count_value(n, Some(first))),
        }
    }
    // The records go into the seed table: a few hundred keys at most
    // instead of one per entry (the index's memtable moves each key into
    // sled at a cost per key).
    let encoded: Vec<Vec<u8>> = records.iter().map(EntryRecord::encode).collect();
    let mut buckets: Vec<Vec<SeedRecord<'_>>> = vec![Vec::new(); SEED_BUCKETS as usize];
    for (id, r) in ids.iter().zip(&encoded) {
        buckets[usize::from(seed_bucket(id))].push((id.as_bytes(), r));
    }
    for (bucket, records) in buckets.iter().enumerate() {
        if !records.is_empty() {
            batch.insert(&seed_key(sid, bucket as u8), &encode_seed_bucket(records));
            meta.seed_table = true;
        }
    }
    for (t, next) in custom_next {
        batch.insert(&custom_next_key(sid, &t), &next.to_be_bytes());
    }
    // The active path, as `sync_path` writes it into a session without
    // path keys: from the leaf up while the entries are known and their
    // depths fall by one.
    meta.leaf = leaf.cloned();
    meta.path_len = 0;
    let mut cur = leaf;
    let mut expect_depth: Option<u64> = None;
    // Links from the leaf up; the walk reaches depth 0 unless the chain is
    // broken, and then the session has no path (as `sync_path` keeps only
    // the run that reaches what existed before: nothing here).
    let mut links: Vec<Vec<u8>> = Vec::new();
    while let Some(id) = cur {
        let Some(r) = at.get(id).and_then(|&i| records.get(i)) else {
            break;
        };
        let d = r.facts.depth;
        match expect_depth {
            None => {}
            Some(e) if e != d => break,
            Some(_) => {}
        }
        links.push(path_value(id, r));
        if d == 0 {
            meta.path_len = links.len() as u64;
            break;
        }
        expect_depth = Some(d - 1);
        cur = r.parent.as_ref();
    }
    if meta.path_len > 0 {
        write_path_blocks(batch, sid, links.iter().rev().map(Vec::as_slice));
    }
    Ok(())
}

/// Brings the active path (`p` blocks) in line with `meta.leaf`: walks up
/// from the leaf setting each entry's link at its depth, and stops at the
/// first entry shallower than `stable_below` that is already at its depth
/// (its ancestry is unchanged, so every link above it is right); then
/// drops the depths the new path no longer has. The blocks touched are
/// read once and written once ([`PathBlocks`]). `stable_below` is the
/// shallowest depth whose ancestry a rewrite may have changed (`u64::MAX`
/// when nothing was re-parented: a leaf move). Cost: the entries below the
/// common ancestor of the old and the new path, plus one removal per
/// block past the new path.
fn sync_path(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    meta: &mut TranscriptMeta,
    stable_below: u64,
) -> Result<(), IndexError> {
    let old_len = meta.path_len;
    let mut blocks = PathBlocks::new(sid, old_len);
    let mut new_len = 0;
    // The shallowest depth the walk reached (written, or found in place).
    let mut top = u64::MAX;
    let mut cur = meta.leaf.clone();
    let mut expect_depth: Option<u64> = None;
    while let Some(id) = cur {
        let Some(r) = get_record(batch, sid, &id)? else {
            // A leaf or parent the index does not know: keep what was
            // found so far (see below).
            break;
        };
        let d = r.facts.depth;
        match expect_depth {
            None => new_len = d.saturating_add(1),
            // Depths fall by one per parent in a consistent index; stop
            // rather than loop on a damaged chain.
            Some(e) if e != d => break,
            Some(_) => {}
        }
        let value = path_value(&id, &r);
        let placed = blocks.get(batch, d)? == Some(value.as_slice());
        top = d;
        if placed && d < stable_below {
            break;
        }
        if !placed {
            blocks.set(batch, d, value)?;
        }
        if d == 0 {
            break;
        }
        expect_depth = Some(d - 1);
        cur = r.parent;
    }
    // Exactly the depths `0..path_len` exist: the walk's run joins what
    // was there when it reaches the old path (always, in a consistent
    // index); a run that stops short of it (a broken chain) is dropped,
    // and the old path's depths above stay (their ancestry is intact).
    let len = if top <= old_len {
        new_len
    } else {
        old_len.min(new_len)
    };
    blocks.finish(batch, len)?;
    meta.path_len = len;
    Ok(())
}

/// Rewrites the path links of those of `ids` that are on the active path
/// (at their depth) to their current records: what a delta rewrite
/// changes for an entry whose ancestry it kept (log position, size).
fn refresh_path_links<'i>(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    meta: &TranscriptMeta,
    ids: impl Iterator<Item = &'i EntryId>,
) -> Result<(), IndexError> {
    let mut blocks = PathBlocks::new(sid, meta.path_len);
    for id in ids {
        let Some(r) = get_record(batch, sid, id)? else {
            continue;
        };
        let d = r.facts.depth;
        if d >= meta.path_len {
            continue;
        }
        let Some(cur) = blocks.get(batch, d)? else {
            continue;
        };
        if path_link_id(cur) == Some(id.as_bytes()) {
            let value = path_value(id, &r);
            if cur != value.as_slice() {
                blocks.set(batch, d, value)?;
            }
        }
    }
    blocks.finish(batch, meta.path_len)
}

/// [`clear_entries`], skipped when the session is `keyless` (a scan of
/// every entry tag's prefix through every index layer, for a new session
/// most of a first commit's index work).
fn clear_entries_unless(
    keyless: bool,
    batch: &mut IndexBatch<'_>,
    sid: &str,
) -> Result<(), IndexError> {
    if !keyless {
        return clear_entries(batch, sid);
    }
    debug_assert!(
        ENTRY_TAGS
            .iter()
            .all(|&tag| batch.scan_prefix(&sk(tag, sid)).is_ok_and(|v| v.is_empty())),
        "a session without a transcript meta has entry keys"
    );
    Ok(())
}

/// Removes every per-entry key of a session.
fn clear_entries(batch: &mut IndexBatch<'_>, sid: &str) -> Result<(), IndexError> {
    for tag in ENTRY_TAGS {
        for (k, _) in batch.scan_prefix(&sk(tag, sid))? {
            batch.remove(&k);
        }
    }
    Ok(())
}

/// Drops the custom-list and label keys of a record (custom lists keep a
/// tombstone so ordinals stay dense for paging).
fn unlink_payload_keys(batch: &mut IndexBatch<'_>, sid: &str, r: &EntryRecord) {
    if let Some((t, ordinal, all)) = &r.custom {
        batch.insert(&custom_key(sid, t, *ordinal), &[]);
        batch.insert(&custom_all_key(sid, *all), &[]);
    }
    if let Some(target) = &r.label_target {
        batch.remove(&label_key(sid, target, r.seq));
    }
}

/// Moves the entry `id` (whose record, as read from the batch, is `r`)
/// from its old parent's children to `new_parent`'s. A parent removed by
/// this rewrite only loses the link ([`remove_child`]). `r`'s own child
/// count is kept current (the entry may be its own old or new parent in
/// damaged data), so the caller can write `r` back.
fn relink(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
    r: &mut EntryRecord,
    new_parent: &Option<EntryId>,
) -> Result<(), IndexError> {
    if let Some(old) = &r.parent {
        let old_record = get_record(batch, sid, old)?;
        remove_child(batch, sid, old, old_record, r.seq)?;
    }
    if let Some(p) = new_parent {
        let record = get_record(batch, sid, p)?;
        add_child(batch, sid, p, record, id, r.seq)?;
    }
    if r.parent.as_ref() == Some(id) || new_parent.as_ref() == Some(id) {
        if let Some(cur) = get_record(batch, sid, id)? {
            r.children = cur.children;
            r.only_child = cur.only_child;
        }
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn apply_delta_rewrite(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    meta: &mut TranscriptMeta,
    loc: &Locator,
    written: &[Entry],
    reparented: &[(EntryId, Option<EntryId>)],
    removed: &[EntryId],
) -> Result<u64, IndexError> {
    let mut stale: Vec<EntryId> = Vec::new();
    // Entries whose parent link changed: the ancestry of their subtrees.
    let mut relinked: Vec<EntryId> = Vec::new();
    let removed_set: HashSet<&EntryId> = removed.iter().collect();
    for id in removed {
        let Some(r) = get_record(batch, sid, id)? else {
            continue;
        };
        unlink_payload_keys(batch, sid, &r);
        if let Some(p) = &r.parent {
            if removed_set.contains(p) {
                batch.remove(&child_key(sid, p, r.seq));
            } else {
                let parent = get_record(batch, sid, p)?;
                remove_child(batch, sid, p, parent, r.seq)?;
            }
        }
        // Its child count goes with its record (an entry with a record has
        // no `n` key); its kept children are relinked below (their old
        // parent is gone, so no count of a removed entry is touched again).
        remove_record(batch, sid, id)?;
        meta.entries = meta.entries.saturating_sub(1);
    }
    for (id, new_parent) in reparented {
        let Some(mut r) = get_record(batch, sid, id)? else {
            continue;
        };
        relink(batch, sid, id, &mut r, new_parent)?;
        r.size = r
            .size
            .saturating_sub(parent_json_len(&r.parent))
            .saturating_add(parent_json_len(new_parent));
        r.parent = new_parent.clone();
        put_record(batch, sid, id, &r)?;
        stale.push(id.clone());
        relinked.push(id.clone());
    }
    for (k, w) in written.iter().enumerate() {
        let Some(mut r) = get_record(batch, sid, &w.id)? else {
            continue;
        };
        let mut is_stale = false;
        if r.parent != w.parent_id {
            relink(batch, sid, &w.id, &mut r, &w.parent_id)?;
            is_stale = true;
            relinked.push(w.id.clone());
        }
        let marker = PathMarker::of(w);
        if marker != r.marker {
            is_stale = true;
        }
        // Custom lists: same type keeps its place; a new type goes last.
        let new_custom = match (custom_type(w), &r.custom) {
            (Some(t), Some((old_t, ordinal, all))) if t == old_t => {
                Some((t.to_string(), *ordinal, *all))
            }
            (new_t, _) => {
                unlink_payload_keys(
                    batch,
                    sid,
                    &EntryRecord {
                        label_target: None,
                        ..r.clone()
                    },
                );
                match new_t {
                    Some(t) => {
                        let nk = custom_next_key(sid, t);
                        let ordinal = batch.get(&nk)?.and_then(|b| be_u64(&b)).unwrap_or(0);
                        batch.insert(&nk, &ordinal.saturating_add(1).to_be_bytes());
                        let all = meta.custom_next;
                        meta.custom_next = meta.custom_next.saturating_add(1);
                        batch.insert(&custom_key(sid, t, ordinal), w.id.as_bytes());
                        batch.insert(&custom_all_key(sid, all), w.id.as_bytes());
                        Some((t.to_string(), ordinal, all))
                    }
                    None => None,
                }
            }
        };
        if let Some(target) = &r.label_target {
            batch.remove(&label_key(sid, target, r.seq));
        }
        let label_target = match label_value(w) {
            Some((target, label)) => {
                batch.insert(&label_key(sid, &target, r.seq), &encode("label", &label)?);
                Some(target)
            }
            None => None,
        };
        r.segment = loc.position.segment;
        r.offset = loc.position.offset;
        r.event = loc.event;
        r.sub = u32::try_from(k).unwrap_or(u32::MAX);
        r.size = entry_size(w);
        r.kind = w.kind_name().to_string();
        r.parent = w.parent_id.clone();
        r.marker = marker;
        r.custom = new_custom;
        r.label_target = label_target;
        r.summary = entry_summary(w, TREE_SUMMARY_CHARS_MAX).0;
        put_record(batch, sid, &w.id, &r)?;
        if is_stale {
            stale.push(w.id.clone());
        }
    }
    recompute_facts(batch, sid, &stale)?;
    // The shallowest (new) depth whose ancestry changed: above it every
    // entry keeps its ancestors, so the active path above it stays valid.
    let mut stable_below = u64::MAX;
    for id in &relinked {
        if let Some(r) = get_record(batch, sid, id)? {
            stable_below = stable_below.min(r.facts.depth);
        }
    }
    Ok(stable_below)
}

/// Recomputes the path facts of each stale entry and, where they changed,
/// of its descendants (children in append order, breadth first).
fn recompute_facts(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    stale: &[EntryId],
) -> Result<(), IndexError> {
    let mut visited: HashSet<EntryId> = HashSet::new();
    for root in stale {
        let mut queue: Vec<(EntryId, bool)> = vec![(root.clone(), true)];
        while let Some((id, force)) = queue.pop() {
            let Some(mut r) = get_record(batch, sid, &id)? else {
                continue;
            };
            let facts = facts_from_record(batch, sid, &id, &r)?;
            let changed = facts != r.facts;
            if changed {
                r.facts = facts;
                put_record(batch, sid, &id, &r)?;
            }
            // A cycle cannot come from a valid rewrite; never loop on one.
            if (changed || force) && visited.insert(id.clone()) {
                for child in batch_children(batch, sid, &id, Some(&r))? {
                    queue.push((child, false));
                }
            }
        }
    }
    Ok(())
}

/// The session events the transcript index reads (after the `session.`
/// prefix); every other kind leaves it unchanged.
fn indexes_kind(kind: &str) -> bool {
    matches!(
        kind,
        "created"
            | "entry_appended"
            | "leaf_moved"
            | "history_rewritten"
            | "transcript_rewritten"
            | "state_cleared"
    )
}

/// A session event as the indexer decoded it (or was handed it), with what
/// the decoding gave along: a `created` event's seed, an appended entry's
/// JSON size.
struct DecodedEvent {
    event: SessionEvent,
    seed: Option<TranscriptParts>,
    known_size: Option<u64>,
}

/// Forgets every entry of the session's current generation in `m` (its
/// keys are cleared by the caller).
fn reset_entries(m: &mut TranscriptMeta) {
    m.entries = 0;
    m.path_len = 0;
    m.seed_table = false;
}

impl TranscriptIndexer {
    fn apply_session_commit(
        &self,
        commit: &RecordedCommit,
        batch: &mut IndexBatch<'_>,
    ) -> Result<(), IndexError> {
        let sid = commit.info.stream.as_str();
        let mkey = meta_key(sid);
        // Commits are indexed one at a time (under the engine's writer), so this
        // lock is never contended; a poisoned one only held a memo.
        let mut written = self.written.lock().unwrap_or_else(|e| e.into_inner());
        let WrittenMemo {
            record: last,
            meta: last_meta,
        } = &mut *written;
        let mut meta = read_meta_through(batch, &mkey, last_meta)?;
        let mut dirty = false;
        for (i, ev) in commit.events.iter().enumerate() {
            if ev.kind == PURGE_EVENT_KIND {
                clear_entries_unless(meta.is_none(), batch, sid)?;
                batch.remove(&mkey);
                meta = None;
                dirty = false;
                continue;
            }
            let Some(kind) = ev.kind.strip_prefix(SESSION_EVENT_PREFIX) else {
                continue;
            };
            if !indexes_kind(kind) {
                continue;
            }
            // An undecodable event fails only its own session: the session
            // indexer marks it broken (its header, loads and handles report
            // the damage); the transcript index skips the event.
            let Some(decoded) = self.decode(commit, i, sid, kind, &ev.payload) else {
                continue;
            };
            let loc = Locator {
                position: commit.info.position,
                event: u32::try_from(i).unwrap_or(u32::MAX),
            };
            // No meta, no entry keys: both are written by the same commit
            // and removed together by a purge.
            let keyless = meta.is_none();
            let m = meta.get_or_insert_with(TranscriptMeta::default);
            if !apply_event(batch, sid, m, keyless, decoded, &loc, last)? {
                continue;
            }
            m.raw_seq = m.raw_seq.saturating_add(1);
            m.updated_at_ms = commit.info.timestamp_ms;
            dirty = true;
        }
        if let (true, Some(m)) = (dirty, meta) {
            let bytes = encode("transcript meta", &m)?;
            batch.insert(&mkey, &bytes);
            *last_meta = Some((bytes, m));
        }
        Ok(())
    }

    /// The event `i` of `commit` (of kind `kind`), from the memo when it
    /// holds its decoding, else decoded; `None` when it does not decode
    /// (or the session indexer found that it does not).
    ///
    /// An append (almost every event) decodes its entry alone, as readers
    /// do, without the event enum's buffering. A created event's seed is
    /// walked, never queried: it comes back as entries, without the
    /// transcript's in-memory indexes.
    fn decode(
        &self,
        commit: &RecordedCommit,
        i: usize,
        sid: &str,
        kind: &str,
        payload: &[u8],
    ) -> Option<DecodedEvent> {
        let plain = |event| DecodedEvent {
            event,
            seed: None,
            known_size: None,
        };
        match kind {
            "entry_appended" => self.decode_appended(sid, payload),
            "created" => {
                let handed = self.memo.as_ref().and_then(|m| m.take(commit, i, payload));
                let (event, seed) = match handed {
                    // The session indexer's decoding of these bytes.
                    Some(Some(decoded)) => decoded,
                    Some(None) => return None,
                    None => decode_event_split(payload).ok()?,
                };
                Some(DecodedEvent {
                    event,
                    seed,
                    known_size: None,
                })
            }
            _ => decode_event(payload).ok().map(plain),
        }
    }

    /// An `entry_appended` event: the writer's entry when it handed the
    /// one encoded to these bytes, else decoded.
    fn decode_appended(&self, sid: &str, payload: &[u8]) -> Option<DecodedEvent> {
        let handed = self
            .memo
            .as_ref()
            .and_then(|m| m.take_appended(sid, payload));
        let (entry, known_size) = match handed {
            Some((entry, size)) => {
                debug_assert_eq!(
                    decode_appended_entry(payload).ok().as_ref(),
                    Some(&entry),
                    "a handed entry is the decoding of its bytes"
                );
                debug_assert_eq!(size, entry_size(&entry));
                (entry, Some(size))
            }
            None => (decode_appended_entry(payload).ok()?, None),
        };
        Some(DecodedEvent {
            event: SessionEvent::EntryAppended { entry },
            seed: None,
            known_size,
        })
    }
}

/// The session's meta from the batch, taken from `last_meta` when its
/// bytes are the ones `last_meta` holds.
fn read_meta_through(
    batch: &IndexBatch<'_>,
    mkey: &[u8],
    last_meta: &mut Option<(Vec<u8>, TranscriptMeta)>,
) -> Result<Option<TranscriptMeta>, IndexError> {
    let Some(b) = batch.get(mkey)? else {
        return Ok(None);
    };
    Ok(Some(match last_meta.take() {
        Some((bytes, m)) if bytes == b => {
            debug_assert_eq!(
                decode::<TranscriptMeta>("transcript meta", &b)
                    .ok()
                    .as_ref(),
                Some(&m),
                "a meta is the decoding of its bytes"
            );
            m
        }
        _ => decode("transcript meta", &b)?,
    }))
}

/// Indexes one decoded session event into `m` and the batch; false when
/// the event does not change the transcript (the meta is then left as is).
/// `keyless`: the session has no transcript keys yet (no meta), so nothing
/// needs clearing; a session's first event is its creation.
fn apply_event(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    m: &mut TranscriptMeta,
    keyless: bool,
    decoded: DecodedEvent,
    loc: &Locator,
    last: &mut Option<LastRecord>,
) -> Result<bool, IndexError> {
    let DecodedEvent {
        event,
        seed,
        known_size,
    } = decoded;
    match &event {
        SessionEvent::Created { state, .. } => {
            clear_entries_unless(keyless, batch, sid)?;
            *m = TranscriptMeta {
                generation: state.generation,
                raw_seq: m.raw_seq,
                ..TranscriptMeta::default()
            };
            let (entries, leaf) = match &seed {
                Some((entries, leaf)) => (entries.as_slice(), leaf.as_ref()),
                None => (state.transcript.entries(), state.transcript.leaf()),
            };
            index_seed(batch, sid, m, entries, leaf, loc)?;
        }
        SessionEvent::EntryAppended { entry } => {
            apply_append(batch, sid, m, entry, loc, known_size, last)?;
        }
        SessionEvent::LeafMoved { leaf } => {
            m.leaf = leaf.clone();
            sync_path(batch, sid, m, u64::MAX)?;
        }
        SessionEvent::HistoryRewritten {
            generation,
            entries,
            leaf,
        } => {
            clear_entries_unless(keyless, batch, sid)?;
            reset_entries(m);
            for (k, e) in entries.iter().enumerate() {
                let k = u32::try_from(k).unwrap_or(u32::MAX);
                index_entry(batch, sid, m, e, loc, k, None, last)?;
            }
            m.generation = *generation;
            m.leaf = leaf.clone();
            sync_path(batch, sid, m, u64::MAX)?;
        }
        SessionEvent::TranscriptRewritten {
            generation,
            written,
            reparented,
            removed,
            leaf,
        } => {
            let stable_below =
                apply_delta_rewrite(batch, sid, m, loc, written, reparented, removed)?;
            m.generation = *generation;
            m.leaf = leaf.clone();
            sync_path(batch, sid, m, stable_below)?;
            // Written entries above the rewritten part of the path
            // moved in the log: their path links follow.
            let changed = written.iter().map(|w| &w.id);
            refresh_path_links(
                batch,
                sid,
                m,
                changed.chain(reparented.iter().map(|r| &r.0)),
            )?;
        }
        SessionEvent::StateCleared => {
            clear_entries_unless(keyless, batch, sid)?;
            reset_entries(m);
            m.generation = m.generation.saturating_add(1);
            m.leaf = None;
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// An appended entry: its records, then the active path (one link more in
/// the common case of an append under the leaf, O(1)).
fn apply_append(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    m: &mut TranscriptMeta,
    entry: &Entry,
    loc: &Locator,
    known_size: Option<u64>,
    last: &mut Option<LastRecord>,
) -> Result<(), IndexError> {
    let under_leaf = entry.parent_id == m.leaf;
    let indexed = index_entry(batch, sid, m, entry, loc, 0, known_size, last)?;
    m.leaf = Some(entry.id.clone());
    match indexed {
        Some((d, value)) if under_leaf && d == m.path_len => {
            append_path_link(batch, sid, d, &value)?;
            m.path_len = d.saturating_add(1);
        }
        _ => sync_path(batch, sid, m, u64::MAX)?,
    }
    Ok(())
}

impl Indexer for TranscriptIndexer {
    fn name(&self) -> &'static str {
        TRANSCRIPT_INDEXER
    }

    fn version(&self) -> u32 {
        TRANSCRIPT_INDEX_VERSION
    }

    fn apply(&self, commit: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let is_session = commit
            .events
            .iter()
            .any(|e| e.kind == PURGE_EVENT_KIND || e.kind.starts_with(SESSION_EVENT_PREFIX));
        if !is_session {
            return Ok(());
        }
        self.apply_session_commit(commit, batch)
    }
}

#[cfg(test)]
mod tests {
    use super::super::entry_ids;
    use super::super::keys::{TAG_CHILD, TAG_COUNT, TAG_ENTRY, TAG_PATH, TAG_SEED};
    use super::super::test_support::{
        check_path, open, record_count, tag_keys, user, writer_session,
    };
    use super::*;
    use crate::session::SessionId;

    /// Appends written as one group (an import's batches) extend the active
    /// path's last block in place across the group: the path is the
    /// transcript's, over three blocks, and the keys are those of a rebuild
    /// from the log.
    #[test]
    fn grouped_appends_write_the_path_of_a_rebuild() {
        use crate::store::exchange::{import_sessions, read_export, ExportWriter, ImportOptions};
        let a = tempfile::tempdir().unwrap();
        let (sa, rta) = open(a.path());
        let (id, h) = writer_session(&rta);
        for i in 0..150 {
            h.append(user(&format!("c{i}"))).unwrap();
        }
        drop(h);
        let mut w = ExportWriter::new(Vec::new()).unwrap();
        w.session(&sa, &id).unwrap();
        let sessions = read_export(&w.finish().unwrap().0[..]).unwrap();
        let b = tempfile::tempdir().unwrap();
        let (sb, _rtb) = open(b.path());
        import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {}).unwrap();
        assert_eq!(check_path(&sb, &id).len(), 150);
        let keys = tag_keys(&sb, &id, TAG_PATH);
        assert_eq!(keys.len(), 3);
        let values = |s: &crate::store::LogStore| -> Vec<Option<Vec<u8>>> {
            let engine = s.engine().unwrap();
            let index = engine.index();
            keys.iter()
                .map(|k| index.get(TRANSCRIPT_INDEXER, k).unwrap())
                .collect()
        };
        let grouped = values(&sb);
        drop((sb, _rtb));
        std::fs::remove_dir_all(b.path().join("index")).unwrap();
        let _ = std::fs::remove_dir_all(b.path().join("checkpoints"));
        let (sb, _rtb) = open(b.path());
        assert_eq!(values(&sb), grouped);
        check_path(&sb, &id);
    }

    /// A chain append leaves exactly one new per-entry key (its own `e`
    /// record): its parent's child count is a rewrite of the parent's
    /// record, never an `n` or `c` key. A fork's seed of a chain is one
    /// record per entry in the seed table (at most one key per bucket).
    #[test]
    fn chain_appends_add_one_key_per_entry_and_chain_seeds_fill_the_seed_table() {
        let dir = tempfile::tempdir().unwrap();
        let (store, rt) = open(dir.path());
        let (id, h) = writer_session(&rt);
        let per_entry = |id: &SessionId| -> std::collections::BTreeSet<Vec<u8>> {
            [TAG_ENTRY, TAG_SEED, TAG_COUNT, TAG_CHILD]
                .into_iter()
                .flat_map(|tag| tag_keys(&store, id, tag))
                .collect()
        };
        let mut before = per_entry(&id);
        let mut chain = Vec::new();
        for i in 0..70 {
            let e = h.append(user(&format!("c{i}"))).unwrap();
            let after = per_entry(&id);
            assert!(before.is_subset(&after), "append {i} removed a key");
            let new: Vec<&Vec<u8>> = after.difference(&before).collect();
            assert_eq!(new, vec![&entry_key(id.as_str(), &e)], "append {i}");
            before = after;
            chain.push(e);
        }
        assert_eq!(tag_keys(&store, &id, TAG_ENTRY).len(), 70);
        assert!(tag_keys(&store, &id, TAG_COUNT).is_empty());
        assert!(tag_keys(&store, &id, TAG_CHILD).is_empty());
        for (i, e) in chain.iter().enumerate() {
            let want = match chain.get(i + 1) {
                Some(next) => (1, Some(next.clone())),
                None => (0, None),
            };
            assert_eq!(record_count(&store, &id, e), want, "count of {e}");
        }
        check_path(&store, &id);
        drop(h);
        // A fork of the chain's first 50 entries: 50 records with their
        // counts in the seed table, no other per-entry key.
        let fork = rt.fork(&id, Some(chain[49].clone())).unwrap();
        let fork_id = fork.id().clone();
        assert!(tag_keys(&store, &fork_id, TAG_ENTRY).is_empty());
        let buckets = tag_keys(&store, &fork_id, TAG_SEED).len();
        assert!((1..=50).contains(&buckets), "{buckets} seed buckets");
        let mut want = chain[..50].to_vec();
        want.sort_by(|a, b| a.as_bytes().cmp(b.as_bytes()));
        assert_eq!(
            entry_ids(store.engine().unwrap().index(), &fork_id).unwrap(),
            want
        );
        assert!(tag_keys(&store, &fork_id, TAG_COUNT).is_empty());
        assert!(tag_keys(&store, &fork_id, TAG_CHILD).is_empty());
        assert_eq!(
            record_count(&store, &fork_id, &chain[48]),
            (1, Some(chain[49].clone()))
        );
        assert_eq!(record_count(&store, &fork_id, &chain[49]), (0, None));
        assert_eq!(check_path(&store, &fork_id).len(), 50);
        // Rebuilt from the log: the same keys.
        let keys = (per_entry(&id), per_entry(&fork_id));
        drop((store, rt, fork));
        std::fs::remove_dir_all(dir.path().join("index")).unwrap();
        // From the log alone: without the checkpoints too.
        let _ = std::fs::remove_dir_all(dir.path().join("checkpoints"));
        let (store, _rt) = open(dir.path());
        let per_entry = |id: &SessionId| -> std::collections::BTreeSet<Vec<u8>> {
            [TAG_ENTRY, TAG_SEED, TAG_COUNT, TAG_CHILD]
                .into_iter()
                .flat_map(|tag| tag_keys(&store, id, tag))
                .collect()
        };
        assert_eq!((per_entry(&id), per_entry(&fork_id)), keys);
    }
}
