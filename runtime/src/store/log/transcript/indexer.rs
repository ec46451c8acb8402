//! The transcript index of the log store (engine indexer `transcript`)
//! and the [`EntrySource`] that reads entries through it.
//!
//! Maintained from the log by [`TranscriptIndexer`] in the same memtable
//! (and move into sled) as the engine's own indexes, and rebuilt from the log like
//! them (deleting `DIR/index/` loses nothing). Every key starts with a tag
//! byte, the session id's length (u8) and the session id:
//!
//! | tag | rest of the key | value |
//! | --- | --- | --- |
//! | `m` | — | [`TranscriptMeta`]: generation, raw seq, updated at, leaf, counters |
//! | `e` | entry id | [`EntryRecord`] in its binary encoding ([`EntryRecord::encode`]): number of children and the only child's id when there is exactly one, where the entry is in the log, size, kind, parent, [`PathMarker`], [`PathFacts`], append seq, summary; empty: a tombstone over the entry's seed table record (the entry was removed) |
//! | `E` | u8 bucket | the seed table: the records of a `created` event's seed transcript, spread over at most [`SEED_BUCKETS`] (256) keys by a hash of the id (`seed_bucket`), as [`encode_seed_bucket`] writes it: a format byte (2), a u32 BE record count, a u32 BE offset per record, then the records sorted by id, each a u8 id length, the id, a u32 BE record length and the record. An `e` key shadows a seed record: any later change to a seeded entry writes its record there |
//! | `c` | u8 len ++ parent id ++ u64 BE seq | child id (children in append order), only for a parent with two or more children |
//! | `n` | parent id | only for a parent without an `e` record (an orphan's absent parent): u64 BE number of children, then the only child's id when there is exactly one |
//! | `t` | u32 BE len ++ custom type ++ u64 BE ordinal | custom entry id (empty = removed) |
//! | `T` | custom type | u64 BE next ordinal of that type |
//! | `a` | u64 BE ordinal | custom entry id of any type (empty = removed) |
//! | `l` | u8 len ++ target id ++ u64 BE seq | MessagePack `Option<String>` of a label entry |
//! | `p` | u64 BE block (`depth >> 6`) | the active path's depths `64 × block ..` (up to 64 of them, fewer only in the last block), in depth order, each a u16 BE length then its link: the entry at that depth on the current leaf's path with its log position (u64 BE segment, u64 BE offset, u32 BE event, u32 BE entry index), `entry_size` (u64 BE), id (u8 length + bytes), and for an orphan at depth 0 the id of its absent parent (see `path_value`); a link is 33 to `PATH_LINK_BYTES_MAX` (289) bytes, a block value at most `PATH_BLOCK_BYTES_MAX` (18,624) bytes |
//!
//! Events read: `created` (the seed transcript of a fork), `entry_appended`,
//! `leaf_moved`, `history_rewritten` (whole form), `transcript_rewritten`
//! (delta form), `state_cleared` and the `spool.purge` marker. Costs per
//! event: an append is O(1) index operations (one parent lookup, about five
//! writes) plus, for a compaction, the walk from its parent to its first
//! kept entry ([`first_kept_depth`]). Of its writes only the entry's own
//! `e` record is a new key for a chain append (one under the leaf whose
//! parent had no child): the parent's `e` record (which holds its child
//! count), the last `p` block and the `m` meta are rewrites of keys the
//! appends before wrote, which the index's memtable coalesces (one value
//! per key) before they move into sled, and a parent's first child writes
//! no `c` key. A second child writes the `c` links of both. The new
//! entry's `n` key is probed (a missing key: answered by the index's key
//! filter) in case orphans named it as their parent before it existed.
//! A leaf move is O(1); a delta rewrite is proportional to what it names plus
//! the subtrees whose path facts change (re-parented entries, entries whose
//! [`PathMarker`] changed); a whole rewrite, a state clear and a purge are
//! O(entries of the session).
//! A `created` event's seed transcript (a fork's path) is indexed in one
//! in-memory pass (`index_seed`): the same records, links, lists and path
//! as appending its entries one by one, without reading the index back
//! (each record written once, with its child count). The records go into
//! the seed table, at most 256 keys whatever the seed's size, instead of
//! one `e` key per entry: the index's memtable moves every key into sled
//! at a cost per key, and a fork of a 10k-entry session at its middle
//! would otherwise move 5k of them. A lookup by id reads the `e` key and,
//! on a miss, the id's seed bucket (a session's [`TranscriptMeta::seed_table`]
//! tells an append whether its new-id check needs that second read).
//!
//! **Active path.** The `p` keys hold the root→leaf path of the current
//! leaf by depth, in blocks of 64 depths per key (exactly the depths
//! `0..path_len` of [`TranscriptMeta`] exist: every block but the last is
//! full, and no block lies past the path), so
//! [`EntrySource::ancestor_at_depth`] answers with one or two `get`s and a
//! root-first branch page costs what it returns: its depth range is read
//! from the blocks from the one holding its first depth's parent, one
//! lookup each ([`EntrySource::path_range`]: two keys for up to 64 depths,
//! where one key per depth cost a sled iterator step each; blocks and
//! records are kept on the reading thread while the index is unchanged,
//! see `store/read_memo.rs`), and since each link
//! carries the entry's log position and size (the parent is the entry one
//! depth up), the page's entries are read from the log without index
//! record lookups. A block's framing (lengths, link count, size) is
//! checked whenever it is read and a link's contents when it is used: a
//! damaged block fails the read with an [`IndexError`] naming the session
//! and the depth; a block shorter than the path (a write racing the read)
//! is not the path, and the caller walks parents. The links are kept in
//! step with the records: every path write compares the whole link, and a
//! delta rewrite refreshes the links of the path entries it moved in the
//! log. Writers read, change and write back whole blocks (`PathBlocks`:
//! each block decoded once per event and written once). An append under
//! the leaf rewrites only the last block (a new block at a multiple of 64
//! is written without a read; the index's memtable keeps one value per
//! key, so the appends into one block coalesce before they reach sled); a
//! leaf move (or an append elsewhere) rewrites the blocks below the common
//! ancestor of the old and the new leaf, truncates the block holding the
//! new length and removes the blocks past it: O(distance to the common
//! ancestor) links. A delta rewrite rewrites from the new leaf up to the
//! shallowest entry whose parent it changed (its ancestry above stays
//! valid); whole rewrites, clears and fork seeds rebuild the path with the
//! entries (a seed writes one key per 64 depths).
//!
//! An entry is read back ([`LogTranscriptSource`]) by reading the commit
//! at its position and decoding only the event that holds it (an appended
//! entry is decoded alone, without the event enum's buffering); the parent
//! comes from the index (a re-parented entry's stored bytes are never
//! rewritten, only its parent link). A fork's seed transcript lives in its
//! `created` event: reading one of its entries decodes that whole event
//! (cached for the source's lifetime). Decoded entries read more than once
//! are kept in the engine's bounded, scan-resistant [`EntryCache`], keyed
//! by log position. Child links cost one lookup of the entry's `e` record
//! (only its leading child count and only child are decoded) for an entry
//! with at most one child (a chain), a prefix scan for more.
//!
//! **Child counts.** A parent's child count lives in its `e` record, so a
//! chain append changes a key that already exists instead of adding one.
//! A parent without a record (the absent parent of an orphan: whole
//! transcripts of rewrites, fork seeds and raw imports can hold orphans)
//! keeps its count in an `n` key; when an entry with that id is indexed
//! later (appending an entry whose id an orphan names as its parent is
//! allowed), its new record takes the count over and the `n` key is
//! removed, so an id never has both. Every writer of counts goes through
//! one place (`ChildCount`).
//!
//! Resolved labels are the last label entry (in append order) of a target;
//! removing a label entry by a rewrite restores the previous one.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex, Weak};

use serde::{Deserialize, Serialize};
use spool_engine::{
    CommitRef, Index, IndexBatch, IndexError, Indexer, LogPosition, LogSpan, RecordedCommit, Store,
};

use super::accelerators as read_memo;
use crate::session::codec::{
    decode_appended_entry, decode_appended_entry_as, decode_entry_at, decode_event_split,
    event_entry_offsets, TranscriptParts,
};
use crate::session::{decode_event, SessionEvent, SessionId};
use crate::store::log::{PURGE_EVENT_KIND, SESSION_EVENT_PREFIX};
use crate::store::StoreError;
use crate::transcript::entry::ENTRY_ID_LEN_MAX;
use crate::transcript::{
    entry_size, entry_summary, first_kept_depth, Anchor, ChildLinks, CustomRef, Entry, EntryFacts,
    EntryId, EntryKind, EntrySource, PathFacts, PathMarker, ResidentError, TranscriptVersion,
    TREE_SUMMARY_CHARS_MAX,
};

/// Name of the engine indexer that keeps transcripts.
pub const TRANSCRIPT_INDEXER: &str = "transcript";
/// Version of the transcript index layout; bumping it rebuilds the index.
pub const TRANSCRIPT_INDEX_VERSION: u32 = 9;

const TAG_META: u8 = b'm';
const TAG_ENTRY: u8 = b'e';
const TAG_CHILD: u8 = b'c';
const TAG_COUNT: u8 = b'n';
const TAG_CUSTOM: u8 = b't';
const TAG_CUSTOM_NEXT: u8 = b'T';
const TAG_CUSTOM_ALL: u8 = b'a';
const TAG_LABEL: u8 = b'l';
const TAG_PATH: u8 = b'p';
const TAG_SEED: u8 = b'E';
/// Every per-entry tag (what a clear or purge removes).
const ENTRY_TAGS: [u8; 9] = [
    TAG_ENTRY,
    TAG_SEED,
    TAG_CHILD,
    TAG_COUNT,
    TAG_CUSTOM,
    TAG_CUSTOM_NEXT,
    TAG_CUSTOM_ALL,
    TAG_LABEL,
    TAG_PATH,
];

/// Per-session transcript facts kept by the index.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TranscriptMeta {
    /// Bumped by every rewrite and state clear.
    pub generation: u64,
    /// Transcript events committed (appends, leaf moves, rewrites,
    /// clears) over the session's incarnation; never decreases.
    pub raw_seq: u64,
    /// Commit time of the latest transcript event.
    pub updated_at_ms: i64,
    pub leaf: Option<EntryId>,
    /// Entries in the current generation.
    pub entries: u64,
    /// Next append sequence number (per session, never reused).
    pub next_seq: u64,
    /// Next ordinal of the any-type custom-entry list.
    pub custom_next: u64,
    /// Entries on the active path (the leaf's depth + 1; 0 without a
    /// leaf): the `p` blocks hold exactly the depths `0..path_len`.
    #[serde(default)]
    pub path_len: u64,
    /// The current generation's records include a seed table (`E` keys):
    /// an id without an `e` key may still have a record there. Without
    /// one, an append's check that its id is new is one lookup.
    #[serde(default)]
    pub seed_table: bool,
}

impl TranscriptMeta {
    /// The transcript version these facts describe.
    pub fn version(&self) -> TranscriptVersion {
        TranscriptVersion {
            generation: self.generation,
            raw_seq: self.raw_seq,
            updated_at_ms: self.updated_at_ms,
        }
    }
}

/// What the index knows about one entry (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EntryRecord {
    /// Number of children (entries whose parent is this one, duplicates
    /// of an id not counted). Kept in the record, not in a key of its own,
    /// so that a chain append, which rewrites its parent's record (still
    /// in the index's memtable from the append before), leaves one new
    /// key only: its own record.
    pub children: u64,
    /// The only child when `children` is 1 (a chain's child list is then
    /// this record alone, no scan); `None` otherwise.
    pub only_child: Option<EntryId>,
    /// Commit holding the entry's bytes.
    pub segment: u64,
    pub offset: u64,
    /// Index of the event in the commit.
    pub event: u32,
    /// Index of the entry in the event's entry list (0 for an append).
    pub sub: u32,
    /// [`entry_size`] of the entry with its current parent.
    pub size: u64,
    pub kind: String,
    pub parent: Option<EntryId>,
    pub marker: PathMarker,
    pub facts: PathFacts,
    /// Append sequence number (children and labels are ordered by it).
    pub seq: u64,
    /// For custom entries: type, ordinal in that type, ordinal among all.
    pub custom: Option<(String, u64, u64)>,
    /// For label entries: the target.
    pub label_target: Option<EntryId>,
    pub summary: String,
}

impl EntryRecord {
    fn position(&self) -> LogPosition {
        LogPosition {
            segment: self.segment,
            offset: self.offset,
        }
    }
}

// ---------------------------------------------------------------------------
// Binary record encoding
// ---------------------------------------------------------------------------

/// Format byte that starts every encoded [`EntryRecord`] (a record of
/// another format is malformed: the index layout version rebuilds old
/// indexes before they are read).
const RECORD_FORMAT: u8 = 2;

/// Appends the big-endian, length-prefixed fields of an index value.
struct Writer(Vec<u8>);

impl Writer {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    /// A string: u32 BE byte length, then its UTF-8 bytes (strings longer
    /// than `u32::MAX` bytes never reach the index: entries are bounded
    /// far below that by the log's commit limit).
    fn str(&mut self, s: &str) {
        self.bytes(s.as_bytes());
    }
    /// Bytes written as [`Writer::str`] writes a string's (an id's bytes are
    /// its string's).
    fn bytes(&mut self, b: &[u8]) {
        self.u32(u32::try_from(b.len()).unwrap_or(u32::MAX));
        self.0.extend_from_slice(b);
    }
    fn opt_id(&mut self, id: Option<&EntryId>) {
        match id {
            None => self.u8(0),
            Some(id) => {
                self.u8(1);
                self.bytes(id.as_bytes());
            }
        }
    }
    fn anchor(&mut self, a: &Anchor) {
        self.bytes(a.id.as_bytes());
        self.u64(a.depth);
    }
    fn opt_anchor(&mut self, a: Option<&Anchor>) {
        match a {
            None => self.u8(0),
            Some(a) => {
                self.u8(1);
                self.anchor(a);
            }
        }
    }
}

/// Reads what [`Writer`] wrote; every read is bounds-checked (hostile
/// bytes give an error, never a panic).
struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

type ReadRes<T> = Result<T, String>;

impl<'a> Reader<'a> {
    fn new(b: &'a [u8]) -> Self {
        Reader { b, at: 0 }
    }
    fn take(&mut self, n: usize) -> ReadRes<&'a [u8]> {
        let end = self
            .at
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("truncated at byte {} (wanted {n} more)", self.at))?;
        let s = self.b.get(self.at..end).ok_or("truncated")?;
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> ReadRes<u8> {
        Ok(self.take(1)?.first().copied().unwrap_or(0))
    }
    fn u32(&mut self) -> ReadRes<u32> {
        let b: [u8; 4] = self.take(4)?.try_into().map_err(|_| "truncated u32")?;
        Ok(u32::from_be_bytes(b))
    }
    fn u64(&mut self) -> ReadRes<u64> {
        let b: [u8; 8] = self.take(8)?.try_into().map_err(|_| "truncated u64")?;
        Ok(u64::from_be_bytes(b))
    }
    fn bool(&mut self) -> ReadRes<bool> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            t => Err(format!("bad flag {t} at byte {}", self.at - 1)),
        }
    }
    /// A u32 BE length, then that many bytes.
    fn bytes(&mut self) -> ReadRes<&'a [u8]> {
        let n = usize::try_from(self.u32()?).map_err(|_| "string length")?;
        self.take(n)
    }
    fn str(&mut self) -> ReadRes<&'a str> {
        let at = self.at.saturating_add(4);
        std::str::from_utf8(self.bytes()?).map_err(|_| format!("invalid UTF-8 at byte {at}"))
    }
    fn string(&mut self) -> ReadRes<String> {
        Ok(self.str()?.to_string())
    }
    fn id(&mut self) -> ReadRes<EntryId> {
        let at = self.at;
        // A valid id is ASCII: no separate UTF-8 check (`str` would make one).
        EntryId::parse_bytes(self.bytes()?).map_err(|_| format!("invalid entry id at byte {at}"))
    }
    fn opt_id(&mut self) -> ReadRes<Option<EntryId>> {
        Ok(if self.bool()? { Some(self.id()?) } else { None })
    }
    fn anchor(&mut self) -> ReadRes<Anchor> {
        Ok(Anchor {
            id: self.id()?,
            depth: self.u64()?,
        })
    }
    fn opt_anchor(&mut self) -> ReadRes<Option<Anchor>> {
        Ok(if self.bool()? {
            Some(self.anchor()?)
        } else {
            None
        })
    }
    fn end(&self) -> ReadRes<()> {
        if self.at == self.b.len() {
            Ok(())
        } else {
            Err(format!("{} trailing bytes", self.b.len() - self.at))
        }
    }
}

const MARKER_PLAIN: u8 = 0;
const MARKER_RESET: u8 = 1;
const MARKER_COMPACTION: u8 = 2;
const MARKER_MODEL: u8 = 3;
const MARKER_THINKING: u8 = 4;

impl EntryRecord {
    /// The record's index value: its format byte (`RECORD_FORMAT`), then its fields in
    /// declaration order (integers u64/u32 BE, strings u32 BE length +
    /// UTF-8, options a 0/1 byte then the value, the marker a tag byte then
    /// its fields). The child count and the only child come first, so a
    /// children lookup reads them without decoding the rest
    /// ([`EntryRecord::decode_children`]).
    pub fn encode(&self) -> Vec<u8> {
        debug_assert!(
            self.only_child.is_none() || self.children == 1,
            "an only child with a count of {}",
            self.children
        );
        let mut w = Writer(Vec::with_capacity(
            96 + self.kind.len() + self.summary.len() + 4 * 40,
        ));
        w.u8(RECORD_FORMAT);
        w.u64(self.children);
        w.opt_id(self.only_child.as_ref());
        w.u64(self.segment);
        w.u64(self.offset);
        w.u32(self.event);
        w.u32(self.sub);
        w.u64(self.size);
        w.str(&self.kind);
        w.opt_id(self.parent.as_ref());
        match &self.marker {
            PathMarker::Plain => w.u8(MARKER_PLAIN),
            PathMarker::Reset => w.u8(MARKER_RESET),
            PathMarker::Compaction {
                first_kept_entry_id,
            } => {
                w.u8(MARKER_COMPACTION);
                w.bytes(first_kept_entry_id.as_bytes());
            }
            PathMarker::Model { provider, model_id } => {
                w.u8(MARKER_MODEL);
                w.str(provider);
                w.str(model_id);
            }
            PathMarker::ThinkingLevel { thinking_level } => {
                w.u8(MARKER_THINKING);
                w.str(thinking_level);
            }
        }
        let f = &self.facts;
        w.u64(f.depth);
        w.anchor(&f.context_start);
        w.opt_anchor(f.reset.as_ref());
        w.opt_anchor(f.compaction.as_ref());
        w.u8(u8::from(f.compaction_keeps_prefix));
        match &f.model {
            None => w.u8(0),
            Some((p, m)) => {
                w.u8(1);
                w.str(p);
                w.str(m);
            }
        }
        match &f.thinking_level {
            None => w.u8(0),
            Some(t) => {
                w.u8(1);
                w.str(t);
            }
        }
        w.u64(self.seq);
        match &self.custom {
            None => w.u8(0),
            Some((t, ordinal, all)) => {
                w.u8(1);
                w.str(t);
                w.u64(*ordinal);
                w.u64(*all);
            }
        }
        w.opt_id(self.label_target.as_ref());
        w.str(&self.summary);
        w.0
    }

    /// Decodes [`EntryRecord::encode`]'s bytes; anything else (truncated,
    /// flipped, trailing bytes, another format) is an error describing
    /// where it failed.
    pub fn decode(b: &[u8]) -> Result<EntryRecord, String> {
        let mut r = Reader::new(b);
        let (children, only_child) = Self::read_children(&mut r)?;
        let segment = r.u64()?;
        let offset = r.u64()?;
        let event = r.u32()?;
        let sub = r.u32()?;
        let size = r.u64()?;
        let kind = r.string()?;
        let parent = r.opt_id()?;
        let marker = match r.u8()? {
            MARKER_PLAIN => PathMarker::Plain,
            MARKER_RESET => PathMarker::Reset,
            MARKER_COMPACTION => PathMarker::Compaction {
                first_kept_entry_id: r.id()?,
            },
            MARKER_MODEL => PathMarker::Model {
                provider: r.string()?,
                model_id: r.string()?,
            },
            MARKER_THINKING => PathMarker::ThinkingLevel {
                thinking_level: r.string()?,
            },
            t => return Err(format!("unknown path marker {t}")),
        };
        let depth = r.u64()?;
        let context_start = r.anchor()?;
        let reset = r.opt_anchor()?;
        let compaction = r.opt_anchor()?;
        let compaction_keeps_prefix = r.bool()?;
        let model = if r.bool()? {
            Some((r.string()?, r.string()?))
        } else {
            None
        };
        let thinking_level = if r.bool()? { Some(r.string()?) } else { None };
        let seq = r.u64()?;
        let custom = if r.bool()? {
            Some((r.string()?, r.u64()?, r.u64()?))
        } else {
            None
        };
        let label_target = r.opt_id()?;
        let summary = r.string()?;
        r.end()?;
        Ok(EntryRecord {
            children,
            only_child,
            segment,
            offset,
            event,
            sub,
            size,
            kind,
            parent,
            marker,
            facts: PathFacts {
                depth,
                context_start,
                reset,
                compaction,
                compaction_keeps_prefix,
                model,
                thinking_level,
            },
            seq,
            custom,
            label_target,
            summary,
        })
    }
}

impl EntryRecord {
    /// The child count and only child of an encoded record, without
    /// decoding the rest (checked as [`EntryRecord::decode`] checks them;
    /// the rest is not checked).
    pub fn decode_children(b: &[u8]) -> Result<(u64, Option<EntryId>), String> {
        Self::read_children(&mut Reader::new(b))
    }

    /// The format byte, the child count and the only child. An only child
    /// with a count other than 1 is malformed (a count of 1 without one is
    /// not: its child is then found by a scan of the `c` links).
    fn read_children(r: &mut Reader<'_>) -> ReadRes<(u64, Option<EntryId>)> {
        let format = r.u8()?;
        if format != RECORD_FORMAT {
            return Err(format!("unknown entry record format {format}"));
        }
        let children = r.u64()?;
        let only_child = r.opt_id()?;
        if only_child.is_some() && children != 1 {
            return Err(format!("an only child with a child count of {children}"));
        }
        Ok((children, only_child))
    }
}

fn sk(tag: u8, sid: &str) -> Vec<u8> {
    // Session ids are at most 128 bytes (SESSION_ID_LEN_MAX).
    let mut k = Vec::with_capacity(2 + sid.len() + 16);
    k.push(tag);
    k.push(sid.len().min(255) as u8);
    k.extend_from_slice(sid.as_bytes());
    k
}

fn meta_key(sid: &str) -> Vec<u8> {
    sk(TAG_META, sid)
}

fn entry_key(sid: &str, id: &EntryId) -> Vec<u8> {
    let mut k = sk(TAG_ENTRY, sid);
    k.extend_from_slice(id.as_bytes());
    k
}

/// Buckets of a seed table: a seed's records are spread over at most this
/// many `E` keys, whatever its size (a bucket is one byte of the key).
pub const SEED_BUCKETS: u32 = 256;
/// Format byte of a seed bucket value.
const SEED_BUCKET_FORMAT: u8 = 2;

/// The seed bucket of an entry id: FNV-1a (64-bit) over the id's bytes,
/// mixed by the SplitMix64 finalizer, top 8 bits. Stored data depends on
/// it: changing it is a layout change.
fn seed_bucket(id: &EntryId) -> u8 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in id.as_bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^= h >> 31;
    (h >> 56) as u8
}

fn seed_key(sid: &str, bucket: u8) -> Vec<u8> {
    let mut k = sk(TAG_SEED, sid);
    k.push(bucket);
    k
}

/// One record of a seed bucket: (id bytes, record bytes).
pub type SeedRecord<'v> = (&'v [u8], &'v [u8]);

/// Encodes a seed bucket value from its records: format byte (2), u32 BE
/// record count, one u32 BE offset per record (where it starts in the
/// value), then the records sorted by id bytes, each a u8 id length, the
/// id, a u32 BE record length and the record. The sorted offset table
/// lets a lookup binary-search the bucket instead of walking it (a new
/// id, which every append checks, is a miss that would read the whole
/// bucket). Ids are at most 255 bytes and records at most `u32::MAX`
/// bytes (entry ids are at most 128 bytes; a record is bounded by the
/// commit it indexes); a duplicate id keeps its first record.
pub fn encode_seed_bucket(records: &[SeedRecord<'_>]) -> Vec<u8> {
    let mut sorted: Vec<SeedRecord<'_>> = Vec::with_capacity(records.len());
    for r in records {
        debug_assert!(r.0.len() <= usize::from(u8::MAX));
        debug_assert!(u32::try_from(r.1.len()).is_ok());
        sorted.push(*r);
    }
    // Stable: the first of equal ids stays first, and is the one kept.
    sorted.sort_by(|a, b| a.0.cmp(b.0));
    sorted.dedup_by(|later, first| later.0 == first.0);
    let n = sorted.len();
    let dir_end = 1 + 4 + 4 * n;
    let body: usize = sorted.iter().map(|(id, r)| 5 + id.len() + r.len()).sum();
    let mut v = Vec::with_capacity(dir_end + body);
    v.push(SEED_BUCKET_FORMAT);
    v.extend_from_slice(&(n as u32).to_be_bytes());
    let mut at = dir_end;
    for (id, r) in &sorted {
        v.extend_from_slice(&(at as u32).to_be_bytes());
        at += 5 + id.len() + r.len();
    }
    for (id, r) in &sorted {
        v.push(id.len().min(usize::from(u8::MAX)) as u8);
        v.extend_from_slice(id);
        v.extend_from_slice(&u32::try_from(r.len()).unwrap_or(u32::MAX).to_be_bytes());
        v.extend_from_slice(r);
    }
    debug_assert_eq!(v.len(), at);
    v
}

/// A seed bucket's header: its record count and offset table, checked
/// against the value's length before anything is read through them.
fn seed_bucket_dir(v: &[u8]) -> Result<(usize, &[u8]), String> {
    let Some((&format, rest)) = v.split_first() else {
        return Err("empty seed bucket".into());
    };
    if format != SEED_BUCKET_FORMAT {
        return Err(format!(
            "seed bucket format {format}, expected {SEED_BUCKET_FORMAT}"
        ));
    }
    let n = rest
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or("seed bucket truncated in its record count")?;
    // Every record takes at least 5 bytes besides its 4-byte offset.
    if n > rest.len().saturating_sub(4) / 9 {
        return Err(format!(
            "seed bucket of {} bytes claims {n} records",
            v.len()
        ));
    }
    Ok((n, &rest[4..4 + 4 * n]))
}

/// The record starting at byte `at` of a seed bucket value, and where the
/// next one starts.
fn seed_record_at(v: &[u8], at: usize) -> Result<(SeedRecord<'_>, usize), String> {
    let truncated = || format!("seed bucket record truncated at byte {at}");
    let id_len = usize::from(*v.get(at).ok_or_else(truncated)?);
    let id = v.get(at + 1..at + 1 + id_len).ok_or_else(truncated)?;
    let len = v
        .get(at + 1 + id_len..at + 5 + id_len)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(truncated)?;
    let start = at + 5 + id_len;
    let end = start.checked_add(len).ok_or_else(truncated)?;
    let record = v.get(start..end).ok_or_else(truncated)?;
    Ok(((id, record), end))
}

fn dir_offset(dir: &[u8], i: usize) -> usize {
    let b = &dir[4 * i..4 * i + 4];
    u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize
}

/// The records of a seed bucket value, in order: (id bytes, record
/// bytes), borrowed from `v`. The whole value is checked: the offsets
/// name the records in sequence, the ids strictly increase and nothing
/// follows the last record. Hostile bytes give an error naming the byte
/// offset, never a panic or an allocation the value's length does not
/// bound.
pub fn seed_bucket_records(v: &[u8]) -> Result<Vec<SeedRecord<'_>>, String> {
    let (n, dir) = seed_bucket_dir(v)?;
    let mut out: Vec<SeedRecord<'_>> = Vec::with_capacity(n);
    let mut at = 5 + 4 * n;
    for i in 0..n {
        if dir_offset(dir, i) != at {
            return Err(format!("seed bucket offset {i} does not name byte {at}"));
        }
        let (r, next) = seed_record_at(v, at)?;
        if out.last().is_some_and(|p| p.0 >= r.0) {
            return Err(format!("seed bucket ids out of order at byte {at}"));
        }
        out.push(r);
        at = next;
    }
    if at != v.len() {
        return Err(format!(
            "seed bucket has {} bytes past its last record",
            v.len() - at
        ));
    }
    Ok(out)
}

/// The record bytes of `id` in a seed bucket value: a binary search over
/// its offset table (only the records it visits are read and checked).
fn find_in_seed_bucket<'v>(v: &'v [u8], id: &EntryId) -> Result<Option<&'v [u8]>, String> {
    let id = id.as_bytes();
    let (n, dir) = seed_bucket_dir(v)?;
    let (mut lo, mut hi) = (0, n);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        let ((k, r), _) = seed_record_at(v, dir_offset(dir, mid))?;
        match k.cmp(id) {
            std::cmp::Ordering::Equal => return Ok(Some(r)),
            std::cmp::Ordering::Less => lo = mid + 1,
            std::cmp::Ordering::Greater => hi = mid,
        }
    }
    Ok(None)
}

/// What a seed bucket holds for one id: its record (copied out), or an
/// error naming what is wrong with the bucket.
type SeedLookup = Result<Option<Vec<u8>>, String>;

/// The lookup of `id` in a seed bucket value handed over in place
/// (`None`: no such bucket).
fn seed_lookup(v: Option<&[u8]>, id: &EntryId) -> SeedLookup {
    match v {
        None => Ok(None),
        Some(v) => find_in_seed_bucket(v, id).map(|r| r.map(<[u8]>::to_vec)),
    }
}

/// `id`'s record bytes, resolved through `get` (a batch's or the
/// index's) and, when its `e` key is absent, `in_seed` (the same store's
/// in-place read of the id's seed bucket, through [`seed_lookup`]:
/// buckets are large, so only the record is copied out). An `e` key
/// shadows the seed table: a record written after the seed (any change)
/// is an `e` key, and an entry removed from a seed leaves an empty `e`
/// value (a tombstone: no record).
fn locate_record<E>(
    sid: &str,
    id: &EntryId,
    get: impl Fn(&[u8]) -> Result<Option<Vec<u8>>, E>,
    in_seed: impl Fn(&[u8]) -> Result<SeedLookup, E>,
    malformed: impl Fn(String) -> E,
) -> Result<Option<Vec<u8>>, E> {
    if let Some(b) = get(&entry_key(sid, id))? {
        return Ok((!b.is_empty()).then_some(b));
    }
    let bucket = seed_bucket(id);
    in_seed(&seed_key(sid, bucket))?.map_err(|e| malformed(format!("seed bucket {bucket}: {e}")))
}

/// `id`'s record bytes as the batch sees them.
fn get_record_bytes(
    batch: &IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
) -> Result<Option<Vec<u8>>, IndexError> {
    locate_record(
        sid,
        id,
        |k| batch.get(k),
        |k| batch.get_with(k, |v| seed_lookup(v, id)),
        IndexError::Malformed,
    )
}

/// Removes `id`'s record: its `e` key, or a tombstone over its seed
/// table record.
fn remove_record(batch: &mut IndexBatch<'_>, sid: &str, id: &EntryId) -> Result<(), IndexError> {
    let in_seed = batch
        .get_with(&seed_key(sid, seed_bucket(id)), |v| match v {
            Some(v) => find_in_seed_bucket(v, id).map(|r| r.is_some()),
            None => Ok(false),
        })?
        .map_err(|e| IndexError::Malformed(format!("seed bucket of {id}: {e}")))?;
    if in_seed {
        batch.insert(&entry_key(sid, id), &[]);
    } else {
        batch.remove(&entry_key(sid, id));
    }
    Ok(())
}

fn child_prefix(sid: &str, parent: &EntryId) -> Vec<u8> {
    // Entry ids are at most 128 bytes (ENTRY_ID_LEN_MAX).
    let mut k = sk(TAG_CHILD, sid);
    k.push(parent.as_bytes().len().min(255) as u8);
    k.extend_from_slice(parent.as_bytes());
    k
}

fn child_key(sid: &str, parent: &EntryId, seq: u64) -> Vec<u8> {
    let mut k = child_prefix(sid, parent);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

fn count_key(sid: &str, parent: &EntryId) -> Vec<u8> {
    let mut k = sk(TAG_COUNT, sid);
    k.extend_from_slice(parent.as_bytes());
    k
}

fn custom_prefix(sid: &str, custom_type: &str) -> Vec<u8> {
    let mut k = sk(TAG_CUSTOM, sid);
    let len = u32::try_from(custom_type.len()).unwrap_or(u32::MAX);
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(custom_type.as_bytes());
    k
}

fn custom_key(sid: &str, custom_type: &str, ordinal: u64) -> Vec<u8> {
    let mut k = custom_prefix(sid, custom_type);
    k.extend_from_slice(&ordinal.to_be_bytes());
    k
}

fn custom_next_key(sid: &str, custom_type: &str) -> Vec<u8> {
    let mut k = sk(TAG_CUSTOM_NEXT, sid);
    k.extend_from_slice(custom_type.as_bytes());
    k
}

fn custom_all_key(sid: &str, ordinal: u64) -> Vec<u8> {
    let mut k = sk(TAG_CUSTOM_ALL, sid);
    k.extend_from_slice(&ordinal.to_be_bytes());
    k
}

fn label_prefix(sid: &str, target: &EntryId) -> Vec<u8> {
    let mut k = sk(TAG_LABEL, sid);
    k.push(target.as_bytes().len().min(255) as u8);
    k.extend_from_slice(target.as_bytes());
    k
}

fn label_key(sid: &str, target: &EntryId, seq: u64) -> Vec<u8> {
    let mut k = label_prefix(sid, target);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

/// Depths of the active path are grouped in blocks of
/// [`PATH_BLOCK_DEPTHS`] under one `p` key each; keys sort by block, so a
/// root-first page (a depth range) is one `get` or one short range scan.
const PATH_BLOCK_BITS: u32 = 6;

/// Depths per `p` block (`1 << PATH_BLOCK_BITS`).
const PATH_BLOCK_DEPTHS: u64 = 1 << PATH_BLOCK_BITS;

/// The block holding `depth`, and the depth's slot in it.
fn path_slot(depth: u64) -> (u64, usize) {
    // The slot is below PATH_BLOCK_DEPTHS (64): it fits any usize.
    (
        depth >> PATH_BLOCK_BITS,
        (depth & (PATH_BLOCK_DEPTHS - 1)) as usize,
    )
}

/// The `p` key of one block of depths: u64 BE `depth >> PATH_BLOCK_BITS`.
fn path_block_key(sid: &str, block: u64) -> Vec<u8> {
    let mut k = sk(TAG_PATH, sid);
    k.extend_from_slice(&block.to_be_bytes());
    k
}

/// Bytes of a path link before the entry id.
const PATH_LINK_HEADER: usize = 8 + 8 + 4 + 4 + 8 + 1;

/// Most bytes of one path link: the header, an entry id and an orphan's
/// parent id (each at most [`ENTRY_ID_LEN_MAX`] bytes).
const PATH_LINK_BYTES_MAX: usize = PATH_LINK_HEADER + 2 * ENTRY_ID_LEN_MAX;

/// Bytes of a link's length prefix in a block value (u16 BE).
const PATH_LINK_LEN_BYTES: usize = 2;

/// Most bytes of one `p` block value: [`PATH_BLOCK_DEPTHS`] links, each
/// with its length prefix (18,624 bytes). A longer value is damaged.
const PATH_BLOCK_BYTES_MAX: usize =
    PATH_BLOCK_DEPTHS as usize * (PATH_LINK_LEN_BYTES + PATH_LINK_BYTES_MAX);

/// The path link of an entry on the active path: where its bytes are in
/// the log (u64 BE segment, u64 BE offset, u32 BE event, u32 BE entry
/// index), its size (u64 BE), its id (u8 length + bytes) and, only for an
/// orphan at depth 0 (a parent the index does not know), that parent's
/// id; a root-first page is answered from these links alone (the parent
/// of the entry at depth `d > 0` is the entry at `d - 1`). A block value
/// is its depths' links in depth order, each after its u16 BE length.
fn path_value(id: &EntryId, r: &EntryRecord) -> Vec<u8> {
    let key = (
        LogPosition {
            segment: r.segment,
            offset: r.offset,
        },
        r.event,
        r.sub,
    );
    let orphan_parent = match (r.facts.depth, &r.parent) {
        (0, Some(p)) => Some(p),
        _ => None,
    };
    encode_path_link(key, r.size, id, orphan_parent)
}

/// The bytes of one path link ([`path_value`]'s layout; the inverse of
/// [`decode_path_link`]).
fn encode_path_link(
    key: EntryKey,
    size: u64,
    id: &EntryId,
    orphan_parent: Option<&EntryId>,
) -> Vec<u8> {
    let (position, event, sub) = key;
    let mut v = Vec::with_capacity(PATH_LINK_HEADER + 2 * id.as_bytes().len());
    v.extend_from_slice(&position.segment.to_be_bytes());
    v.extend_from_slice(&position.offset.to_be_bytes());
    v.extend_from_slice(&event.to_be_bytes());
    v.extend_from_slice(&sub.to_be_bytes());
    v.extend_from_slice(&size.to_be_bytes());
    // Entry ids are at most 128 bytes (ENTRY_ID_LEN_MAX).
    v.push(id.as_bytes().len().min(255) as u8);
    v.extend_from_slice(id.as_bytes());
    if let Some(p) = orphan_parent {
        v.extend_from_slice(p.as_bytes());
    }
    debug_assert!(v.len() <= PATH_LINK_BYTES_MAX);
    v
}

/// Appends `link` to a block value, after its u16 BE length.
fn push_block_link(block: &mut Vec<u8>, link: &[u8]) {
    // A link is at most PATH_LINK_BYTES_MAX (289) bytes: its length fits.
    debug_assert!(link.len() <= PATH_LINK_BYTES_MAX);
    block.extend_from_slice(&(link.len().min(usize::from(u16::MAX)) as u16).to_be_bytes());
    block.extend_from_slice(link);
}

/// A block value's links in depth order; a malformed value yields one
/// `Err` with the slot of the first link it cannot take (a length past
/// the end, a length outside a link's bounds, more than
/// [`PATH_BLOCK_DEPTHS`] links) and ends.
struct BlockLinks<'a> {
    rest: &'a [u8],
    slot: usize,
    failed: bool,
}

fn block_links(v: &[u8]) -> BlockLinks<'_> {
    BlockLinks {
        rest: v,
        slot: 0,
        failed: v.len() > PATH_BLOCK_BYTES_MAX,
    }
}

impl<'a> Iterator for BlockLinks<'a> {
    /// The link, or the slot where the value is malformed.
    type Item = Result<&'a [u8], usize>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            // Reported once, then the iteration ends.
            self.failed = false;
            self.rest = &[];
            return Some(Err(self.slot));
        }
        if self.rest.is_empty() {
            return None;
        }
        let link = match self.rest {
            [a, b, rest @ ..] if self.slot < PATH_BLOCK_DEPTHS as usize => {
                let n = usize::from(u16::from_be_bytes([*a, *b]));
                if (PATH_LINK_HEADER..=PATH_LINK_BYTES_MAX).contains(&n) {
                    rest.split_at_checked(n)
                } else {
                    None
                }
            }
            _ => None,
        };
        match link {
            Some((link, rest)) => {
                self.rest = rest;
                self.slot += 1;
                Some(Ok(link))
            }
            None => {
                self.rest = &[];
                Some(Err(self.slot))
            }
        }
    }
}

/// The link at `slot` of a block value (`None` past its links), the
/// whole value checked to be well formed (`Err`: the first bad slot).
fn block_link(v: &[u8], slot: usize) -> Result<Option<&[u8]>, usize> {
    let mut found = None;
    for (i, link) in block_links(v).enumerate() {
        let link = link?;
        if i == slot {
            found = Some(link);
        }
    }
    Ok(found)
}

/// The typed error of a damaged active-path block (or one that disagrees
/// with the session's path length): names the session and the depth.
fn path_damage(sid: &str, depth: u64, what: &str) -> IndexError {
    IndexError::Malformed(format!(
        "transcript active path of session {sid}, depth {depth}: {what}"
    ))
}

/// A block's links, owned (for writers), checked to be well formed.
fn decode_block(sid: &str, block: u64, v: &[u8]) -> Result<Vec<Option<Vec<u8>>>, IndexError> {
    let base = block.saturating_mul(PATH_BLOCK_DEPTHS);
    block_links(v)
        .map(|l| match l {
            Ok(link) => Ok(Some(link.to_vec())),
            Err(slot) => Err(path_damage(
                sid,
                base.saturating_add(slot as u64),
                "malformed block value",
            )),
        })
        .collect()
}

/// The number of links of a block value (checked to be well formed).
fn block_len(sid: &str, block: u64, v: &[u8]) -> Result<u64, IndexError> {
    let mut n = 0u64;
    for l in block_links(v) {
        if let Err(slot) = l {
            let depth = block
                .saturating_mul(PATH_BLOCK_DEPTHS)
                .saturating_add(slot as u64);
            return Err(path_damage(sid, depth, "malformed block value"));
        }
        n += 1;
    }
    Ok(n)
}

/// Adds the link of the new leaf at `depth`, the path's length before it
/// (an append under the leaf): only the last block is rewritten (the
/// index's memtable keeps the latest value of a key, so repeated appends
/// into one block coalesce before they reach sled). The block must hold
/// exactly the depths before `depth`.
fn append_path_link(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    depth: u64,
    link: &[u8],
) -> Result<(), IndexError> {
    let (block, slot) = path_slot(depth);
    let key = path_block_key(sid, block);
    let mut v = if slot == 0 {
        // A new block: nothing to read.
        Vec::with_capacity(PATH_LINK_LEN_BYTES + link.len())
    } else {
        let v = batch.get(&key)?.unwrap_or_default();
        let n = block_len(sid, block, &v)?;
        if n != slot as u64 {
            return Err(path_damage(
                sid,
                depth,
                &format!("the block holds {n} depths, the path's length says {slot}"),
            ));
        }
        v
    };
    push_block_link(&mut v, link);
    batch.insert_vec(&key, v);
    Ok(())
}

/// Writes the active path of a session without `p` keys (a cleared one)
/// from its links in depth order (depth 0 first): one key per block.
fn write_path_blocks<'v>(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    links: impl Iterator<Item = &'v [u8]>,
) {
    let mut block = 0u64;
    let mut v: Vec<u8> = Vec::new();
    let mut n = 0u64;
    for link in links {
        push_block_link(&mut v, link);
        n += 1;
        if n == PATH_BLOCK_DEPTHS {
            batch.insert(&path_block_key(sid, block), &v);
            v.clear();
            n = 0;
            block += 1;
        }
    }
    if n > 0 {
        batch.insert(&path_block_key(sid, block), &v);
    }
}

/// A block's links by slot (`None`: a depth not set yet), and whether
/// the event changed the block.
type LoadedBlock = (Vec<Option<Vec<u8>>>, bool);

/// The active path's blocks one index event changes: each read and
/// decoded once, changed in memory, written back once by
/// [`PathBlocks::finish`]. Before the event the blocks hold exactly the
/// depths `0..old_len`; a depth not yet written by the event is `None`.
struct PathBlocks<'s> {
    sid: &'s str,
    old_len: u64,
    /// Block → its links by slot, and whether the event changed it.
    blocks: std::collections::BTreeMap<u64, LoadedBlock>,
}

impl<'s> PathBlocks<'s> {
    fn new(sid: &'s str, old_len: u64) -> Self {
        PathBlocks {
            sid,
            old_len,
            blocks: std::collections::BTreeMap::new(),
        }
    }

    fn load(&mut self, batch: &IndexBatch<'_>, block: u64) -> Result<&mut LoadedBlock, IndexError> {
        let sid = self.sid;
        let old_len = self.old_len;
        match self.blocks.entry(block) {
            std::collections::btree_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::btree_map::Entry::Vacant(e) => {
                let links = match batch.get(&path_block_key(sid, block))? {
                    Some(v) => decode_block(sid, block, &v)?,
                    None => Vec::new(),
                };
                // Exactly the depths `0..old_len` exist.
                let base = block.saturating_mul(PATH_BLOCK_DEPTHS);
                let want = old_len.saturating_sub(base).min(PATH_BLOCK_DEPTHS);
                if links.len() as u64 != want {
                    return Err(path_damage(
                        sid,
                        base.saturating_add(want.min(links.len() as u64)),
                        &format!(
                            "the block holds {} depths, the path's length says {want}",
                            links.len()
                        ),
                    ));
                }
                Ok(e.insert((links, false)))
            }
        }
    }

    /// The link at `depth`, `None` when the path does not reach it.
    fn get(&mut self, batch: &IndexBatch<'_>, depth: u64) -> Result<Option<&[u8]>, IndexError> {
        let (block, slot) = path_slot(depth);
        let (links, _) = self.load(batch, block)?;
        Ok(links.get(slot).and_then(|l| l.as_deref()))
    }

    fn set(&mut self, batch: &IndexBatch<'_>, depth: u64, link: Vec<u8>) -> Result<(), IndexError> {
        let (block, slot) = path_slot(depth);
        let (links, dirty) = self.load(batch, block)?;
        if links.len() <= slot {
            links.resize(slot + 1, None);
        }
        if let Some(l) = links.get_mut(slot) {
            *l = Some(link);
            *dirty = true;
        }
        Ok(())
    }

    /// Writes the changed blocks back for a path of `len` depths (every
    /// depth below `len` is set or was there before the event) and
    /// removes the blocks past it.
    fn finish(mut self, batch: &mut IndexBatch<'_>, len: u64) -> Result<(), IndexError> {
        let sid = self.sid;
        let (kept_block, kept_slot) = path_slot(len);
        if len < self.old_len && kept_slot > 0 {
            // The last kept block loses its deeper depths.
            self.load(batch, kept_block)?;
        }
        // Blocks wholly past `len` that held depths go.
        let first_gone = kept_block.saturating_add(u64::from(kept_slot > 0));
        let old_blocks = self.old_len.div_ceil(PATH_BLOCK_DEPTHS);
        for block in first_gone..old_blocks {
            if !self.blocks.contains_key(&block) {
                batch.remove(&path_block_key(sid, block));
            }
        }
        for (block, (mut links, mut dirty)) in self.blocks {
            let base = block.saturating_mul(PATH_BLOCK_DEPTHS);
            // At most PATH_BLOCK_DEPTHS (64): fits any usize.
            let n = len.saturating_sub(base).min(PATH_BLOCK_DEPTHS) as usize;
            if n == 0 {
                if base < self.old_len {
                    batch.remove(&path_block_key(sid, block));
                }
                continue;
            }
            if let Some(slot) = (0..n).find(|&s| links.get(s).is_none_or(Option::is_none)) {
                return Err(path_damage(
                    sid,
                    base.saturating_add(slot as u64),
                    "a depth of the path has no link",
                ));
            }
            if n < links.len() {
                links.truncate(n);
                dirty = true;
            }
            if !dirty {
                continue;
            }
            let mut v = Vec::with_capacity(n * (PATH_LINK_LEN_BYTES + PATH_LINK_HEADER + 40));
            for l in links.iter().flatten() {
                push_block_link(&mut v, l);
            }
            batch.insert(&path_block_key(sid, block), &v);
        }
        Ok(())
    }
}

/// A decoded path link (see [`path_value`]).
#[derive(Debug)]
struct PathLink {
    id: EntryId,
    key: EntryKey,
    size: u64,
    orphan_parent: Option<EntryId>,
}

fn decode_path_link(v: &[u8]) -> Option<PathLink> {
    let segment = be_u64(v)?;
    let offset = be_u64(v.get(8..)?)?;
    let event = u32::from_be_bytes(v.get(16..20)?.try_into().ok()?);
    let sub = u32::from_be_bytes(v.get(20..24)?.try_into().ok()?);
    let size = be_u64(v.get(24..)?)?;
    let n = usize::from(*v.get(32)?);
    let id = v.get(PATH_LINK_HEADER..PATH_LINK_HEADER.checked_add(n)?)?;
    let id = EntryId::parse_bytes(id).ok()?;
    let rest = v.get(PATH_LINK_HEADER + n..)?;
    let orphan_parent = if rest.is_empty() {
        None
    } else {
        Some(EntryId::parse_bytes(rest).ok()?)
    };
    Some(PathLink {
        id,
        key: (LogPosition { segment, offset }, event, sub),
        size,
        orphan_parent,
    })
}

/// The decoders of the transcript index's other values (active-path
/// blocks and their links, `n` child counts, the meta record), for the
/// `index_values` fuzz body (`spool-tests`): index values are bytes on
/// disk, read back as they are. Not an API.
#[doc(hidden)]
pub mod fuzzing {
    use super::{
        be_u64, block_len, block_link, block_links, count_value, decode, decode_block,
        decode_path_link, encode, encode_path_link, only_child, path_link_id, EntryId,
        TranscriptMeta,
    };

    /// A record's bytes with its child count and only child replaced, as an
    /// append writes its parent's count back (`None`: the bytes do not start
    /// like a record).
    pub fn splice_child_count(
        bytes: &[u8],
        children: u64,
        only: Option<&EntryId>,
    ) -> Option<Vec<u8>> {
        super::splice_child_count(bytes, children, only)
    }

    /// The links of a `p` block value in depth order, or the slot of the
    /// first malformed one.
    pub fn path_block_links(v: &[u8]) -> Result<Vec<&[u8]>, usize> {
        block_links(v).collect()
    }

    /// The number of links a writer and a reader of the block count.
    pub fn path_block_len(v: &[u8]) -> Result<u64, String> {
        block_len("fuzz", 0, v).map_err(|e| e.to_string())
    }

    /// The links as a writer takes them over (owned).
    pub fn path_block_decoded(v: &[u8]) -> Result<usize, String> {
        decode_block("fuzz", 0, v)
            .map(|links| links.len())
            .map_err(|e| e.to_string())
    }

    /// The link at `slot` as a point read finds it.
    pub fn path_block_link(v: &[u8], slot: usize) -> Result<Option<&[u8]>, usize> {
        block_link(v, slot)
    }

    /// A link decoded and encoded again (`None`: it does not decode).
    pub fn path_link_reencoded(v: &[u8]) -> Option<Vec<u8>> {
        let l = decode_path_link(v)?;
        Some(encode_path_link(
            l.key,
            l.size,
            &l.id,
            l.orphan_parent.as_ref(),
        ))
    }

    /// The id bytes a link names, as the leaf check reads them in place.
    pub fn path_link_id_bytes(v: &[u8]) -> Option<&[u8]> {
        path_link_id(v)
    }

    /// An `n` value's count and only child, as readers take them.
    pub fn count_value_parts(v: &[u8]) -> (Option<u64>, Option<EntryId>) {
        (be_u64(v), only_child(v))
    }

    /// [`count_value_parts`]'s inverse, as the writer encodes it.
    pub fn count_value_bytes(count: u64, only: Option<&EntryId>) -> Vec<u8> {
        count_value(count, only)
    }

    /// The `m` record decoded.
    pub fn decode_meta(b: &[u8]) -> Result<TranscriptMeta, String> {
        decode("transcript meta", b).map_err(|e| e.to_string())
    }

    /// The `m` record as the indexer writes it.
    pub fn encode_meta(m: &TranscriptMeta) -> Result<Vec<u8>, String> {
        encode("transcript meta", m).map_err(|e| e.to_string())
    }
}

/// The entry id a path link names.
fn path_link_id(v: &[u8]) -> Option<&[u8]> {
    let n = usize::from(*v.get(PATH_LINK_HEADER - 1)?);
    v.get(PATH_LINK_HEADER..PATH_LINK_HEADER.checked_add(n)?)
}

fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

fn encode<T: Serialize>(what: &str, v: &T) -> Result<Vec<u8>, IndexError> {
    // The meta (encoded once per commit) is ~60 bytes plus its leaf id: a
    // buffer of that size from the start, instead of growth from empty.
    let mut out = Vec::with_capacity(ENCODE_BYTES_HINT);
    rmp_serde::encode::write(&mut out, v)
        .map_err(|e| IndexError::indexer(TRANSCRIPT_INDEXER, format!("{what}: {e}")))?;
    Ok(out)
}

/// The starting capacity of [`encode`]'s buffer.
const ENCODE_BYTES_HINT: usize = 128;

fn decode<'a, T: Deserialize<'a>>(what: &str, b: &'a [u8]) -> Result<T, IndexError> {
    rmp_serde::from_slice(b).map_err(|e| IndexError::Malformed(format!("{what}: {e}")))
}

/// Bytes of a parent id in an entry's JSON encoding (`"id"` or `null`).
fn parent_json_len(p: &Option<EntryId>) -> u64 {
    match p {
        Some(id) => u64::try_from(id.as_bytes().len())
            .unwrap_or(u64::MAX)
            .saturating_add(2),
        None => 4,
    }
}

fn label_value(entry: &Entry) -> Option<(EntryId, Option<String>)> {
    match &entry.kind {
        EntryKind::Label { target_id, label } => {
            Some((target_id.clone(), label.clone().filter(|l| !l.is_empty())))
        }
        _ => None,
    }
}

fn custom_type(entry: &Entry) -> Option<&str> {
    match &entry.kind {
        EntryKind::Custom { custom_type, .. } => Some(custom_type),
        _ => None,
    }
}

// ---------------------------------------------------------------------------
// The indexer
// ---------------------------------------------------------------------------

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
/// measures the entry (~10 % of an append's instructions). Anything else
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

/// The memo's name before it carried appended entries too.
#[deprecated(note = "renamed `DecodeMemo`: it also carries appended entries")]
pub type SeedMemo = DecodeMemo;

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
    fn take_appended(&self, stream: &str, payload: &[u8]) -> Option<(Entry, u64)> {
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
    fn take(
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

/// Maintains the transcript index from the log. See the module docs.
///
/// [`TranscriptIndexer::default`] decodes every event itself;
/// [`TranscriptIndexer::with_memo`] takes a `created` event's decoding
/// from a session indexer sharing the memo
/// ([`SessionIndexer::with_memo`](super::SessionIndexer::with_memo)).
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
/// (~2k and ~0.9k instructions of a ~55k append). Only bytes equal to the
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

/// The encoding of the record `bytes` encodes with its child count set to
/// `children` and its only child to `only`: the count and the only child
/// lead the record (see [`EntryRecord::encode`]), so the rest is copied as
/// it is. `None` when `bytes` does not start like a record.
fn splice_child_count(bytes: &[u8], children: u64, only: Option<&EntryId>) -> Option<Vec<u8>> {
    // Format byte, count (u64 BE), then the only child: a flag byte and,
    // when set, a u32 BE length and the id's bytes.
    let (&format, rest) = bytes.split_first()?;
    if format != RECORD_FORMAT {
        return None;
    }
    let (flag, after_count) = rest.get(8..)?.split_first()?;
    let tail = match flag {
        0 => after_count,
        1 => {
            let len = u32::from_be_bytes(after_count.get(..4)?.try_into().ok()?);
            after_count.get(4..)?.get(usize::try_from(len).ok()?..)?
        }
        _ => return None,
    };
    let mut w = Writer(Vec::with_capacity(bytes.len() + 4 + ENTRY_ID_LEN_MAX));
    w.u8(RECORD_FORMAT);
    w.u64(children);
    w.opt_id(only);
    w.0.extend_from_slice(tail);
    Some(w.0)
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

fn get_record(
    batch: &IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
) -> Result<Option<EntryRecord>, IndexError> {
    match get_record_bytes(batch, sid, id)? {
        Some(b) => Ok(Some(EntryRecord::decode(&b).map_err(|e| {
            IndexError::Malformed(format!("entry record of {id}: {e}"))
        })?)),
        None => Ok(None),
    }
}

fn put_record(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
    r: &EntryRecord,
) -> Result<(), IndexError> {
    batch.insert_vec(&entry_key(sid, id), r.encode());
    Ok(())
}

/// The `n` value: the number of children and, when there is exactly one,
/// its id (a chain's child list is then one point lookup, no scan). Only
/// for a parent without an `e` record (an orphan's absent parent): a
/// parent with a record keeps these in it ([`EntryRecord::children`]).
fn count_value(count: u64, only: Option<&EntryId>) -> Vec<u8> {
    let mut v = count.to_be_bytes().to_vec();
    if let (1, Some(id)) = (count, only) {
        v.extend_from_slice(id.as_bytes());
    }
    v
}

/// The only child named by an `n` value (a count of 1 followed by an id).
fn only_child(count: &[u8]) -> Option<EntryId> {
    let rest = count.get(8..).filter(|r| !r.is_empty())?;
    EntryId::parse_bytes(rest).ok()
}

/// A parent's child count as a writer changes it. Every writer of child
/// counts goes through it: the count lives in the parent's `e` record
/// when the parent has one, else (an orphan's absent parent) in its `n`
/// key, and a record never coexists with an `n` key of the same id (a
/// new record takes the `n` key's count over, [`take_absent_count`]).
struct ChildCount {
    /// The parent's record (the count is written back into it), or
    /// `None`: the count is the `n` key's.
    record: Option<EntryRecord>,
    /// The bytes `record` was read from, when the caller has them.
    record_bytes: Option<Vec<u8>>,
    /// Whether the count is kept anywhere (a record, or an `n` key).
    kept: bool,
    total: u64,
    /// The only child when `total` is 1.
    only: Option<EntryId>,
}

impl ChildCount {
    /// The count of `parent`, whose record (as just read from the batch)
    /// is `record`.
    fn load(
        batch: &IndexBatch<'_>,
        sid: &str,
        parent: &EntryId,
        record: Option<EntryRecord>,
    ) -> Result<Self, IndexError> {
        Ok(match record {
            Some(r) => ChildCount {
                total: r.children,
                only: r.only_child.clone(),
                record: Some(r),
                record_bytes: None,
                kept: true,
            },
            None => match batch.get(&count_key(sid, parent))? {
                Some(v) => ChildCount {
                    total: be_u64(&v).unwrap_or(0),
                    only: only_child(&v),
                    record: None,
                    record_bytes: None,
                    kept: true,
                },
                None => ChildCount {
                    record: None,
                    record_bytes: None,
                    kept: false,
                    total: 0,
                    only: None,
                },
            },
        })
    }

    /// Writes the count back where it lives (an `n` key of a count of
    /// zero is removed rather than kept).
    fn store(
        self,
        batch: &mut IndexBatch<'_>,
        sid: &str,
        parent: &EntryId,
    ) -> Result<(), IndexError> {
        let only = if self.total == 1 { self.only } else { None };
        match self.record {
            Some(mut r) => {
                r.children = self.total;
                r.only_child = only;
                match self
                    .record_bytes
                    .and_then(|b| splice_child_count(&b, r.children, r.only_child.as_ref()))
                {
                    Some(v) => {
                        debug_assert_eq!(v, r.encode(), "a splice encodes the record");
                        batch.insert_vec(&entry_key(sid, parent), v);
                    }
                    None => put_record(batch, sid, parent, &r)?,
                }
            }
            None if self.total == 0 => batch.remove(&count_key(sid, parent)),
            None => batch.insert(
                &count_key(sid, parent),
                &count_value(self.total, only.as_ref()),
            ),
        }
        Ok(())
    }
}

/// Counts `child` (appended with seq `child_seq`) as a new child of
/// `parent`, whose record is `record` (as read from the batch), and writes
/// the child links it needs. The `c` keys of a parent exist only while it
/// has two or more children: a chain's only child is named by the count
/// alone, which spares every chain append a key. So the second child
/// writes the links of both.
fn add_child(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    parent: &EntryId,
    record: Option<EntryRecord>,
    child: &EntryId,
    child_seq: u64,
) -> Result<(), IndexError> {
    add_child_read(
        batch,
        sid,
        parent,
        record.map(|record| (record, None)),
        child,
        child_seq,
    )
}

/// [`add_child`] given the parent's record with the bytes it was read from,
/// when the caller has them.
fn add_child_read(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    parent: &EntryId,
    read: Option<(EntryRecord, Option<Vec<u8>>)>,
    child: &EntryId,
    child_seq: u64,
) -> Result<(), IndexError> {
    let (record, record_bytes) = match read {
        Some((r, b)) => (Some(r), b),
        None => (None, None),
    };
    let mut count = ChildCount::load(batch, sid, parent, record)?;
    count.record_bytes = record_bytes;
    if count.total == 1 {
        if let Some(only) = &count.only {
            if let Some(r) = get_record(batch, sid, only)? {
                batch.insert(&child_key(sid, parent, r.seq), only.as_bytes());
            }
        }
    }
    if count.total >= 1 {
        batch.insert(&child_key(sid, parent, child_seq), child.as_bytes());
    }
    count.total = count.total.saturating_add(1);
    count.only = Some(child.clone());
    count.store(batch, sid, parent)
}

/// Uncounts the child of `parent` (whose record is `record`) appended with
/// seq `child_seq` and removes its link; when one child is left, its link
/// goes too (the count names it, see [`add_child`]). A parent whose count
/// is kept nowhere (one this rewrite removed) only loses the link.
fn remove_child(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    parent: &EntryId,
    record: Option<EntryRecord>,
    child_seq: u64,
) -> Result<(), IndexError> {
    let mut count = ChildCount::load(batch, sid, parent, record)?;
    if !count.kept {
        batch.remove(&child_key(sid, parent, child_seq));
        return Ok(());
    }
    let next = count.total.saturating_sub(1);
    if count.total >= 2 {
        batch.remove(&child_key(sid, parent, child_seq));
    }
    count.only = if next == 1 {
        match batch
            .scan_prefix(&child_prefix(sid, parent))?
            .into_iter()
            .next()
        {
            Some((k, v)) => {
                batch.remove(&k);
                String::from_utf8(v)
                    .ok()
                    .and_then(|s| EntryId::parse(&s).ok())
            }
            None => None,
        }
    } else {
        None
    };
    count.total = next;
    count.store(batch, sid, parent)
}

/// The child count an absent parent's `n` key kept for `id` (its orphans
/// arrived first), removed from the index: a new record of `id` takes it
/// over. One probe of a missing key per new entry otherwise (answered by
/// the index's key filter).
fn take_absent_count(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
) -> Result<(u64, Option<EntryId>), IndexError> {
    let key = count_key(sid, id);
    Ok(match batch.get(&key)? {
        Some(v) => {
            batch.remove(&key);
            let total = be_u64(&v).unwrap_or(0);
            let only = if total == 1 { only_child(&v) } else { None };
            (total, only)
        }
        None => (0, None),
    })
}

/// The children of `id` (whose record is `record`) as the batch sees
/// them: the count's only child, or the `c` links in append order.
fn batch_children(
    batch: &IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
    record: Option<&EntryRecord>,
) -> Result<Vec<EntryId>, IndexError> {
    let count = ChildCount::load(batch, sid, id, record.cloned())?;
    if count.total == 1 {
        if let Some(only) = count.only {
            return Ok(vec![only]);
        }
    }
    if count.total == 0 {
        return Ok(Vec::new());
    }
    Ok(batch
        .scan_prefix(&child_prefix(sid, id))?
        .into_iter()
        .filter_map(|(_, v)| {
            std::str::from_utf8(&v)
                .ok()
                .and_then(|s| EntryId::parse(s).ok())
        })
        .collect())
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
    // foldhash: std's SipHash over thousands of ids was ~3 % of a fork.
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
        let mut meta: Option<TranscriptMeta> = match batch.get(&mkey)? {
            Some(b) => Some(match last_meta.take() {
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
            }),
            None => None,
        };
        let mut dirty = false;
        for (i, ev) in commit.events.iter().enumerate() {
            if ev.kind == PURGE_EVENT_KIND {
                clear_entries(batch, sid)?;
                batch.remove(&mkey);
                meta = None;
                dirty = false;
                continue;
            }
            let Some(kind) = ev.kind.strip_prefix(SESSION_EVENT_PREFIX) else {
                continue;
            };
            if !matches!(
                kind,
                "created"
                    | "entry_appended"
                    | "leaf_moved"
                    | "history_rewritten"
                    | "transcript_rewritten"
                    | "state_cleared"
            ) {
                continue;
            }
            // An undecodable event fails only its own session: the session
            // indexer marks it broken (its header, loads and handles report
            // the damage); the transcript index skips the event.
            // An append (almost every event) decodes its entry alone, as
            // readers do, without the event enum's buffering.
            // A created event's seed is walked, never queried: it comes
            // back as entries, without the transcript's in-memory indexes.
            let mut seed = None;
            let mut known_size = None;
            let decoded = if kind == "entry_appended" {
                match self
                    .memo
                    .as_ref()
                    .and_then(|m| m.take_appended(sid, &ev.payload))
                {
                    // The writer's entry, encoded to these bytes.
                    Some((entry, size)) => {
                        debug_assert_eq!(
                            decode_appended_entry(&ev.payload).ok().as_ref(),
                            Some(&entry),
                            "a handed entry is the decoding of its bytes"
                        );
                        debug_assert_eq!(size, entry_size(&entry));
                        known_size = Some(size);
                        Ok(SessionEvent::EntryAppended { entry })
                    }
                    None => decode_appended_entry(&ev.payload)
                        .map(|entry| SessionEvent::EntryAppended { entry }),
                }
            } else if kind == "created" {
                match self
                    .memo
                    .as_ref()
                    .and_then(|m| m.take(commit, i, &ev.payload))
                {
                    // The session indexer's decoding of these bytes.
                    Some(Some((ev, parts))) => {
                        seed = parts;
                        Ok(ev)
                    }
                    Some(None) => continue,
                    None => decode_event_split(&ev.payload).map(|(ev, parts)| {
                        seed = parts;
                        ev
                    }),
                }
            } else {
                decode_event(&ev.payload)
            };
            let Ok(decoded) = decoded else {
                continue;
            };
            let loc = Locator {
                position: commit.info.position,
                event: u32::try_from(i).unwrap_or(u32::MAX),
            };
            let m = meta.get_or_insert_with(TranscriptMeta::default);
            match &decoded {
                SessionEvent::Created { state, .. } => {
                    clear_entries(batch, sid)?;
                    *m = TranscriptMeta {
                        generation: state.generation,
                        raw_seq: m.raw_seq,
                        ..TranscriptMeta::default()
                    };
                    let (entries, leaf) = match &seed {
                        Some((entries, leaf)) => (entries.as_slice(), leaf.as_ref()),
                        None => (state.transcript.entries(), state.transcript.leaf()),
                    };
                    index_seed(batch, sid, m, entries, leaf, &loc)?;
                }
                SessionEvent::EntryAppended { entry } => {
                    let under_leaf = entry.parent_id == m.leaf;
                    let indexed = index_entry(batch, sid, m, entry, &loc, 0, known_size, last)?;
                    m.leaf = Some(entry.id.clone());
                    match indexed {
                        // The common case, O(1): the new leaf extends the
                        // active path by one.
                        Some((d, value)) if under_leaf && d == m.path_len => {
                            append_path_link(batch, sid, d, &value)?;
                            m.path_len = d.saturating_add(1);
                        }
                        _ => sync_path(batch, sid, m, u64::MAX)?,
                    }
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
                    clear_entries(batch, sid)?;
                    m.entries = 0;
                    m.path_len = 0;
                    m.seed_table = false;
                    for (k, e) in entries.iter().enumerate() {
                        index_entry(
                            batch,
                            sid,
                            m,
                            e,
                            &loc,
                            u32::try_from(k).unwrap_or(u32::MAX),
                            None,
                            last,
                        )?;
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
                        apply_delta_rewrite(batch, sid, m, &loc, written, reparented, removed)?;
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
                    clear_entries(batch, sid)?;
                    m.entries = 0;
                    m.path_len = 0;
                    m.seed_table = false;
                    m.generation = m.generation.saturating_add(1);
                    m.leaf = None;
                }
                _ => continue,
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

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

fn engine_err(e: spool_engine::Error) -> StoreError {
    StoreError::Engine(e)
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

/// Where a decoded entry came from in the log: commit position, event
/// index in the commit, entry index in the event.
type EntryKey = (LogPosition, u32, u32);

/// A decoded log entry as cached: the stream (session) of its commit and
/// the entry as the log holds it, except its parent, which is the one the
/// index gave the reader that cached it (readers always take the parent
/// from the index: a reader with another index parent copies the entry).
struct CachedEntry {
    sid: SessionId,
    /// Shared with the resident snapshots that hold the entry (when their
    /// index parent is the cached one).
    entry: Arc<Entry>,
    cost: u64,
}

/// An entry as [`LogTranscriptSource::load_logged`] found it.
enum Loaded {
    /// From the [`EntryCache`] (or just admitted to it): shared, its
    /// parent the one it was cached with.
    Shared(Arc<Entry>),
    /// Read from the log and not cached: owned, its parent not yet set.
    Read(Entry),
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
    fn lookup(&self, key: EntryKey) -> (Option<Arc<CachedEntry>>, bool) {
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
    fn peek_hints(&self, hints: &mut [PathHint]) {
        let c = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        if c.young.is_empty() && c.old.is_empty() {
            return;
        }
        for h in hints {
            h.cached = c.young.get(&h.key).or_else(|| c.old.get(&h.key)).cloned();
        }
    }

    fn insert(&self, key: EntryKey, v: Arc<CachedEntry>) {
        self.inner
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key, v);
    }

    /// Bytes held (as counted against [`ENTRY_CACHE_BYTES_MAX`]).
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
    path_hints: RefCell<PathHints>,
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
struct PathHints {
    hints: Vec<PathHint>,
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
struct PathHint {
    key: EntryKey,
    size: u64,
    /// The entry as the [`EntryCache`] held it when the range was read
    /// ([`EntryCache::peek_hints`]), checked like a lookup's hit when used.
    cached: Option<Arc<CachedEntry>>,
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
        let Some(r) = read_memo::record(index.change_mark(), self.sid.as_str(), id, read)? else {
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
    /// (`store/read_memo.rs`).
    fn path_block(&self, block: u64) -> Result<Option<Arc<[u8]>>, StoreError> {
        let index = self.engine.index();
        let sid = self.sid.as_str();
        read_memo::path_block(index.change_mark(), sid, block, || {
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
        self.entries.peek_hints(&mut hints.hints);
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::handle::{HandleOptions, SessionHandle, TranscriptBackend};
    use crate::hooks::SessionHookStack;
    use crate::observer::NullSink;
    use crate::session::AgentDefinition;
    use crate::store::{LogStore, LogStoreOptions, SessionStore};
    use crate::transcript::{CancelToken, ContentBlock, Message, ReadResult};
    use crate::SessionRuntime;

    /// A new empty session and a writer handle on it.
    fn writer_session(rt: &SessionRuntime) -> (SessionId, SessionHandle) {
        let id = rt
            .create(AgentDefinition::default(), None)
            .unwrap()
            .id()
            .clone();
        let h = rt.open_handle(&id, HandleOptions::writer()).unwrap();
        (id, h)
    }

    /// A `created` event whose initial state holds `transcript` (a seed
    /// written straight to the engine, as a fork or an import would).
    fn seeded_created(sid: &SessionId, transcript: crate::transcript::Transcript) -> SessionEvent {
        SessionEvent::Created {
            id: sid.clone(),
            parent_id: None,
            agent_name: "a".into(),
            label: "a".into(),
            created_at_ms: 1,
            definition: Box::new(AgentDefinition::new("a", "seed test", "")),
            state: Box::new(crate::session::AgentState {
                transcript,
                ..Default::default()
            }),
        }
    }

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

    fn open(dir: &std::path::Path) -> (Arc<LogStore>, SessionRuntime) {
        let store = Arc::new(
            LogStore::open(
                dir,
                LogStoreOptions {
                    durability: spool_engine::Durability::Buffered,
                    ..LogStoreOptions::default()
                },
            )
            .unwrap(),
        );
        let rt = SessionRuntime::new(store.clone(), Arc::new(NullSink), SessionHookStack::empty());
        (store, rt)
    }

    fn user(text: &str) -> EntryKind {
        EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(text)],
            },
        }
    }

    /// The active-path keys agree with the fully loaded transcript's
    /// current path: exactly its depths exist, `ancestor_at_depth` answers
    /// from the leaf and from a mid-path entry, and an off-path entry gets
    /// no answer (the caller walks).
    fn check_path(store: &LogStore, id: &SessionId) -> Vec<EntryId> {
        let t = store.load(id).unwrap().unwrap().state().transcript.clone();
        let path: Vec<EntryId> = t
            .current_path()
            .unwrap()
            .into_iter()
            .map(|e| e.id.clone())
            .collect();
        let engine = store.engine().unwrap();
        let meta = read_meta(engine.index(), id).unwrap().unwrap();
        assert_eq!(meta.path_len, path.len() as u64, "path_len of {id}");
        let keys = engine
            .index()
            .scan_prefix(TRANSCRIPT_INDEXER, &sk(TAG_PATH, id.as_str()))
            .count();
        assert_eq!(
            keys as u64,
            (path.len() as u64).div_ceil(PATH_BLOCK_DEPTHS),
            "active-path blocks of {id}"
        );
        // Child links: the count in every entry's record (an entry with a
        // record has no `n` key) and its children are the transcript's,
        // and `c` keys exist only for a parent with two or more children
        // (a single child is named by the record alone).
        let src = store.source(id).unwrap();
        for e in t.entries() {
            let mut want = t.children_ids(&e.id);
            let got = src.children(&e.id, usize::MAX).unwrap();
            assert_eq!(got.total, want.len() as u64, "child count of {}", e.id);
            let mut got = got.ids;
            got.sort();
            want.sort();
            assert_eq!(got, want, "children of {}", e.id);
            let links = engine
                .index()
                .scan_prefix(TRANSCRIPT_INDEXER, &child_prefix(id.as_str(), &e.id))
                .count();
            let expect = if want.len() >= 2 { want.len() } else { 0 };
            assert_eq!(links, expect, "child links of {}", e.id);
            let r = stored_record(engine.index(), id, &e.id);
            let only = match t.children_ids(&e.id).as_slice() {
                [one] => Some(one.clone()),
                _ => None,
            };
            assert_eq!(
                (r.children, r.only_child),
                (want.len() as u64, only),
                "count in the record of {}",
                e.id
            );
            assert_eq!(
                engine
                    .index()
                    .get(TRANSCRIPT_INDEXER, &count_key(id.as_str(), &e.id))
                    .unwrap(),
                None,
                "`n` key of {}",
                e.id
            );
        }
        // Every path link names the entry at its depth with the log
        // position and size of its current index record.
        for (d, e) in path.iter().enumerate() {
            let (block, slot) = path_slot(d as u64);
            let value = engine
                .index()
                .get(TRANSCRIPT_INDEXER, &path_block_key(id.as_str(), block))
                .unwrap()
                .unwrap();
            let links: Vec<&[u8]> = block_links(&value).map(Result::unwrap).collect();
            // Exactly the path's depths: full blocks, then the rest.
            let held = (path.len() as u64 - block * PATH_BLOCK_DEPTHS).min(PATH_BLOCK_DEPTHS);
            assert_eq!(links.len() as u64, held, "links of block {block}");
            let v = links[slot];
            let link = decode_path_link(v).unwrap();
            let r = stored_record(engine.index(), id, e);
            assert_eq!(&link.id, e, "depth {d}");
            assert_eq!(link.key, (r.position(), r.event, r.sub), "{e} at {d}");
            assert_eq!(link.size, r.size, "size of {e}");
            assert_eq!(v, path_value(e, &r).as_slice());
        }
        // Ranges of the path, read from the path links, give the entries
        // (payload and parent) the loaded transcript has.
        for (start, end) in [(0, 0), (0, 63), (1, 64), (30, 70), (63, 64), (5, 140)] {
            let Some(leaf) = path.last() else { break };
            let leaf_depth = path.len() as u64 - 1;
            let end = end.min(leaf_depth);
            if start > end {
                continue;
            }
            let src = store.source(id).unwrap();
            let got = src
                .path_range(leaf, leaf_depth, start, end, u64::MAX)
                .unwrap()
                .unwrap();
            let want: Vec<(EntryId, u64)> = path[start as usize..=end as usize]
                .iter()
                .map(|i| (i.clone(), entry_size(t.get(i).unwrap())))
                .collect();
            assert_eq!(got, want, "range {start}..={end}");
            // With a byte bound: the prefix up to the first entry that takes
            // the sum past it.
            for bytes_max in [0, 1, want[0].1, want.iter().map(|w| w.1).sum::<u64>() / 2] {
                let bounded = src
                    .path_range(leaf, leaf_depth, start, end, bytes_max)
                    .unwrap()
                    .unwrap();
                let mut sum = 0u64;
                let n = want
                    .iter()
                    .position(|w| {
                        sum += w.1;
                        sum > bytes_max
                    })
                    .map_or(want.len(), |i| i + 1);
                assert_eq!(bounded, want[..n], "range {start}..={end} in {bytes_max}");
            }
            let got = src
                .path_range(leaf, leaf_depth, start, end, u64::MAX)
                .unwrap()
                .unwrap();
            for (i, _) in &got {
                assert_eq!(src.entry(i).unwrap().as_deref(), t.get(i), "{i}");
            }
        }
        let src = store.source(id).unwrap();
        if let Some(leaf) = path.last() {
            for (d, want) in path.iter().enumerate() {
                let got = src.ancestor_at_depth(leaf, d as u64).unwrap();
                assert_eq!(got.as_ref(), Some(want), "depth {d} from the leaf");
            }
            assert_eq!(
                src.ancestor_at_depth(leaf, path.len() as u64).unwrap(),
                None
            );
            let mid = &path[path.len() / 2];
            assert_eq!(
                src.ancestor_at_depth(mid, 0).unwrap().as_ref(),
                path.first()
            );
            assert_eq!(
                src.ancestor_at_depth(mid, path.len() as u64 / 2 + 1)
                    .unwrap(),
                None
            );
        }
        for e in t.entries() {
            if !path.contains(&e.id) {
                assert_eq!(src.ancestor_at_depth(&e.id, 0).unwrap(), None, "{}", e.id);
            }
            // Child links (the count names an only child) agree with the
            // loaded transcript, with and without a limit.
            for limit in [0, 1, 64] {
                assert_eq!(
                    src.children(&e.id, limit).unwrap(),
                    EntrySource::children(&t, &e.id, limit).unwrap(),
                    "children of {} (limit {limit})",
                    e.id
                );
            }
        }
        path
    }

    fn append_n(h: &SessionHandle, n: usize, tag: &str) -> Vec<EntryId> {
        (0..n)
            .map(|i| h.append(user(&format!("{tag}{i}"))).unwrap())
            .collect()
    }

    /// The per-entry keys of one tag of a session.
    fn tag_keys(store: &LogStore, id: &SessionId, tag: u8) -> Vec<Vec<u8>> {
        store
            .engine()
            .unwrap()
            .index()
            .scan_prefix(TRANSCRIPT_INDEXER, &sk(tag, id.as_str()))
            .map(|kv| kv.unwrap().0)
            .collect()
    }

    /// The child count and only child an entry's index record holds.
    fn record_count(store: &LogStore, id: &SessionId, e: &EntryId) -> (u64, Option<EntryId>) {
        let src = LogTranscriptSource::new(store.engine().unwrap(), id.clone());
        let r = src.record(e).unwrap().unwrap();
        (r.children, r.only_child)
    }

    /// A seed bucket value keeps its records sorted by id behind an offset
    /// table; lookups binary-search it. Any truncation, an offset or
    /// length past the end, ids out of order or another format is an
    /// error (never a panic or an allocation from a damaged length).
    #[test]
    fn seed_buckets_are_sorted_searched_and_checked() {
        let records: [SeedRecord<'_>; 4] = [
            (b"ccc", b"0123456789"),
            (b"a", b"xyz"),
            (b"bb", b""),
            (b"a", b"second a, dropped"),
        ];
        let v = encode_seed_bucket(&records);
        let got = seed_bucket_records(&v).unwrap();
        let want: Vec<SeedRecord<'_>> = vec![(b"a", b"xyz"), (b"bb", b""), (b"ccc", b"0123456789")];
        assert_eq!(got, want);
        for (id, r) in &want {
            let id = EntryId::parse(std::str::from_utf8(id).unwrap()).unwrap();
            assert_eq!(find_in_seed_bucket(&v, &id).unwrap(), Some(*r));
        }
        for absent in ["0", "b", "bbb", "d"] {
            let id = EntryId::parse(absent).unwrap();
            assert_eq!(find_in_seed_bucket(&v, &id).unwrap(), None, "{absent}");
        }
        assert_eq!(
            seed_bucket_records(&encode_seed_bucket(&[])).unwrap(),
            vec![]
        );
        for n in 0..v.len() {
            let r = seed_bucket_records(&v[..n]);
            assert!(r.is_err(), "truncated at {n}: {r:?}");
        }
        let ccc = EntryId::parse("ccc").unwrap();
        // A huge record count.
        let mut bad = v.clone();
        bad[1] = 0xff;
        assert!(seed_bucket_records(&bad).is_err());
        assert!(find_in_seed_bucket(&bad, &ccc).is_err());
        // The last offset past the end.
        let mut bad = v.clone();
        bad[5 + 8..5 + 12].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(seed_bucket_records(&bad).is_err());
        assert!(find_in_seed_bucket(&bad, &ccc).is_err());
        // The first record's length made huge.
        let mut bad = v.clone();
        let first = 5 + 4 * 3;
        bad[first + 2..first + 6].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(seed_bucket_records(&bad).is_err());
        // Ids out of order (the first id changed to sort after the second).
        let mut bad = v.clone();
        bad[first + 1] = b'z';
        assert!(seed_bucket_records(&bad).is_err());
        // Another format.
        let mut bad = v.clone();
        bad[0] = SEED_BUCKET_FORMAT + 1;
        assert!(seed_bucket_records(&bad).is_err());
        assert!(find_in_seed_bucket(&bad, &ccc).is_err());
    }

    /// An entry's record as the index resolves it (its `e` key or its
    /// seed table record).
    fn stored_record(index: &Index, sid: &SessionId, e: &EntryId) -> EntryRecord {
        let (_, b) = entry_records(index, sid)
            .unwrap()
            .into_iter()
            .find(|(id, _)| id == e)
            .unwrap_or_else(|| panic!("no record of {e}"));
        EntryRecord::decode(&b).unwrap()
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
        let (store, _rt) = open(dir.path());
        let per_entry = |id: &SessionId| -> std::collections::BTreeSet<Vec<u8>> {
            [TAG_ENTRY, TAG_SEED, TAG_COUNT, TAG_CHILD]
                .into_iter()
                .flat_map(|tag| tag_keys(&store, id, tag))
                .collect()
        };
        assert_eq!((per_entry(&id), per_entry(&fork_id)), keys);
    }

    /// The second and third child of a chain entry are both counted in its
    /// record and linked in append order; removing them by delta rewrites
    /// takes it back to one child named by the record, with no links.
    #[test]
    fn branch_counts_follow_new_children_and_delta_removals() {
        let dir = tempfile::tempdir().unwrap();
        let (store, rt) = open(dir.path());
        let (id, h) = writer_session(&rt);
        let chain = append_n(&h, 3, "a");
        let under_first = |name: &str, at: i64| {
            h.append_entry(Entry {
                id: EntryId::parse(name).unwrap(),
                parent_id: Some(chain[0].clone()),
                timestamp_ms: at,
                kind: user(name),
            })
            .unwrap()
        };
        let children = |e: &EntryId| store.source(&id).unwrap().children(e, usize::MAX).unwrap();
        let links = |e: &EntryId| {
            store
                .engine()
                .unwrap()
                .index()
                .scan_prefix(TRANSCRIPT_INDEXER, &child_prefix(id.as_str(), e))
                .count()
        };
        assert_eq!(
            record_count(&store, &id, &chain[0]),
            (1, Some(chain[1].clone()))
        );
        let b = under_first("b", 1);
        assert_eq!(
            children(&chain[0]),
            ChildLinks {
                ids: vec![chain[1].clone(), b.clone()],
                total: 2
            }
        );
        assert_eq!(record_count(&store, &id, &chain[0]), (2, None));
        assert_eq!(links(&chain[0]), 2);
        let c = under_first("c", 2);
        assert_eq!(
            children(&chain[0]),
            ChildLinks {
                ids: vec![chain[1].clone(), b.clone(), c.clone()],
                total: 3
            }
        );
        assert_eq!(record_count(&store, &id, &chain[0]), (3, None));
        check_path(&store, &id);
        // The leaf is `c`: a delta rewrite removes it (two children left).
        let only = |x: &EntryId| {
            let x = x.clone();
            move |e: &Entry| e.id == x
        };
        let out = h
            .remove_trailing_entries(&only(&c), &|_| false, &CancelToken::new())
            .unwrap();
        assert_eq!(out.removed, vec![c.clone()]);
        assert_eq!(record_count(&store, &id, &chain[0]), (2, None));
        assert_eq!(links(&chain[0]), 2);
        check_path(&store, &id);
        // Then `b`: one child left, named by the record, no links.
        h.move_leaf(Some(b.clone())).unwrap();
        let out = h
            .remove_trailing_entries(&only(&b), &|_| false, &CancelToken::new())
            .unwrap();
        assert_eq!(out.removed, vec![b.clone()]);
        assert_eq!(
            record_count(&store, &id, &chain[0]),
            (1, Some(chain[1].clone()))
        );
        assert_eq!(links(&chain[0]), 0);
        assert_eq!(
            children(&chain[0]),
            ChildLinks {
                ids: vec![chain[1].clone()],
                total: 1
            }
        );
        assert!(tag_keys(&store, &id, TAG_COUNT).is_empty());
        check_path(&store, &id);
    }

    /// Orphans (entries whose parent is absent, as imported or damaged
    /// transcripts hold) are counted in their absent parent's `n` key;
    /// when that parent is appended later, its new record takes the count
    /// over (children, append order, the only child) and the `n` key goes.
    #[test]
    fn an_absent_parents_count_moves_into_its_record_when_it_is_appended() {
        let eid = |s: &str| EntryId::parse(s).unwrap();
        let entry = |id: &str, parent: Option<&str>| Entry {
            id: eid(id),
            parent_id: parent.map(eid),
            timestamp_ms: 1,
            kind: user(id),
        };
        let sid = SessionId::parse("orphans").unwrap();
        let mut transcript = crate::transcript::Transcript::new();
        transcript.replace_all(
            vec![
                entry("r", None),
                entry("x1", Some("ghost")),
                entry("x2", Some("ghost")),
                entry("y", Some("ghost1")),
            ],
            Some(eid("r")),
        );
        let created = seeded_created(&sid, transcript);
        let dir = tempfile::tempdir().unwrap();
        let (store, rt) = open(dir.path());
        store
            .engine()
            .unwrap()
            .append(spool_engine::NewCommit::new(
                sid.as_str(),
                spool_engine::ExpectedVersion::NoStream,
                vec![session_event(&created)],
            ))
            .unwrap();
        let children = |e: &str| {
            store
                .source(&sid)
                .unwrap()
                .children(&eid(e), usize::MAX)
                .unwrap()
        };
        assert_eq!(
            children("ghost"),
            ChildLinks {
                ids: vec![eid("x1"), eid("x2")],
                total: 2
            }
        );
        assert_eq!(
            children("ghost1"),
            ChildLinks {
                ids: vec![eid("y")],
                total: 1
            }
        );
        assert_eq!(tag_keys(&store, &sid, TAG_COUNT).len(), 2);
        check_path(&store, &sid);
        // The absent parents are appended: `ghost` as a root, `ghost1`
        // under it (its third child).
        let h = rt.open_handle(&sid, HandleOptions::writer()).unwrap();
        h.append_entry(entry("ghost", None)).unwrap();
        assert_eq!(record_count(&store, &sid, &eid("ghost")), (2, None));
        h.append_entry(entry("ghost1", Some("ghost"))).unwrap();
        assert!(tag_keys(&store, &sid, TAG_COUNT).is_empty());
        assert_eq!(record_count(&store, &sid, &eid("ghost")), (3, None));
        assert_eq!(
            record_count(&store, &sid, &eid("ghost1")),
            (1, Some(eid("y")))
        );
        assert_eq!(
            children("ghost"),
            ChildLinks {
                ids: vec![eid("x1"), eid("x2"), eid("ghost1")],
                total: 3
            }
        );
        assert_eq!(
            children("ghost1"),
            ChildLinks {
                ids: vec![eid("y")],
                total: 1
            }
        );
        let before = check_path(&store, &sid);
        let all: Vec<_> = ENTRY_TAGS
            .into_iter()
            .map(|t| tag_keys(&store, &sid, t))
            .collect();
        // Rebuilt from the log: the same keys and path.
        drop((h, store, rt));
        std::fs::remove_dir_all(dir.path().join("index")).unwrap();
        let (store, _rt) = open(dir.path());
        let again: Vec<_> = ENTRY_TAGS
            .into_iter()
            .map(|t| tag_keys(&store, &sid, t))
            .collect();
        assert_eq!(again, all);
        assert_eq!(check_path(&store, &sid), before);
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
            data: serde_json::json!({"k": 1}),
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

    fn sample_records() -> Vec<EntryRecord> {
        let id = |s: &str| EntryId::parse(s).unwrap();
        let facts = PathFacts {
            depth: 7,
            context_start: Anchor {
                id: id("r"),
                depth: 0,
            },
            reset: Some(Anchor {
                id: id("z"),
                depth: 3,
            }),
            compaction: Some(Anchor {
                id: id("c"),
                depth: 5,
            }),
            compaction_keeps_prefix: true,
            model: Some(("prov".into(), "m-1".into())),
            thinking_level: Some("high".into()),
        };
        let plain = EntryRecord {
            children: 0,
            only_child: None,
            segment: 3,
            offset: u64::MAX - 1,
            event: 2,
            sub: 9,
            size: 1234,
            kind: "message".into(),
            parent: None,
            marker: PathMarker::Plain,
            facts: PathFacts {
                depth: 0,
                context_start: Anchor {
                    id: id("a"),
                    depth: 0,
                },
                reset: None,
                compaction: None,
                compaction_keeps_prefix: false,
                model: None,
                thinking_level: None,
            },
            seq: 0,
            custom: None,
            label_target: None,
            summary: String::new(),
        };
        let markers = [
            PathMarker::Reset,
            PathMarker::Compaction {
                first_kept_entry_id: id("k"),
            },
            PathMarker::Model {
                provider: "p".into(),
                model_id: "é".into(),
            },
            PathMarker::ThinkingLevel {
                thinking_level: "low".into(),
            },
        ];
        let mut out = vec![plain.clone()];
        // Child counts: one (with and without its only child, the latter
        // found by a scan), two, the most a u64 holds.
        let counts = [
            (1, Some(id("only-child"))),
            (1, None),
            (2, None),
            (u64::MAX, None),
        ];
        for (m, (children, only_child)) in markers.into_iter().zip(counts) {
            out.push(EntryRecord {
                children,
                only_child,
                parent: Some(id("parent-x")),
                marker: m,
                facts: facts.clone(),
                seq: 42,
                custom: Some(("tool_output".into(), 5, 6)),
                label_target: Some(id("t")),
                summary: "a summary — with ünïcode".into(),
                ..plain.clone()
            });
        }
        out
    }

    /// Records round-trip; every truncation, a flip of every bit of every
    /// byte and trailing bytes give an error or another valid record, never
    /// a panic (the decode is total on hostile bytes).
    #[test]
    fn entry_records_round_trip_and_hostile_bytes_fail_cleanly() {
        for r in sample_records() {
            let b = r.encode();
            assert_eq!(EntryRecord::decode(&b).unwrap(), r);
            assert_eq!(
                EntryRecord::decode_children(&b).unwrap(),
                (r.children, r.only_child.clone())
            );
            for n in 0..b.len() {
                assert!(EntryRecord::decode(&b[..n]).is_err(), "truncated to {n}");
            }
            let mut long = b.clone();
            long.push(0);
            assert!(EntryRecord::decode(&long).is_err(), "trailing byte");
            for i in 0..b.len() {
                for bit in 0..8 {
                    let mut f = b.clone();
                    f[i] ^= 1 << bit;
                    // Either an error or a record that encodes back to the
                    // flipped bytes (a flip inside an integer or a string).
                    if let Ok(d) = EntryRecord::decode(&f) {
                        assert_eq!(d.encode(), f, "byte {i} bit {bit}");
                        assert_eq!(
                            EntryRecord::decode_children(&f),
                            Ok((d.children, d.only_child)),
                            "byte {i} bit {bit}"
                        );
                    }
                }
            }
        }
        assert!(EntryRecord::decode(&[]).is_err());
        assert!(EntryRecord::decode(&[RECORD_FORMAT + 1]).is_err());
        assert!(EntryRecord::decode(&[RECORD_FORMAT - 1]).is_err());
        // A huge string length is refused without allocating: the kind's
        // (after the count, the only-child flag and 32 bytes of position
        // and size) and the only child's.
        let mut huge = vec![RECORD_FORMAT];
        huge.extend_from_slice(&[0; 8 + 1 + 32]);
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(EntryRecord::decode(&huge).is_err());
        let mut huge = vec![RECORD_FORMAT];
        huge.extend_from_slice(&1u64.to_be_bytes());
        huge.push(1);
        huge.extend_from_slice(&u32::MAX.to_be_bytes());
        assert!(EntryRecord::decode(&huge).is_err());
        assert!(EntryRecord::decode_children(&huge).is_err());
    }

    /// Malformed child counts fail the record's decode (and the count's
    /// own decode) with an error: an only child with a count other than
    /// one, a bad only-child flag, an invalid only-child id, a truncated
    /// count.
    #[test]
    fn entry_records_with_malformed_child_counts_fail_to_decode() {
        let with_only = sample_records()
            .into_iter()
            .find(|r| r.only_child.is_some())
            .unwrap();
        let b = with_only.encode();
        let bad = |f: &dyn Fn(&mut Vec<u8>), what: &str| {
            let mut v = b.clone();
            f(&mut v);
            assert!(EntryRecord::decode(&v).is_err(), "{what}");
            assert!(EntryRecord::decode_children(&v).is_err(), "{what}");
        };
        // The count is bytes 1..9, the only-child flag byte 9, then the
        // id's u32 BE length (bytes 10..14) and bytes.
        for count in [0u64, 2, 3, u64::MAX] {
            bad(
                &|v| v[1..9].copy_from_slice(&count.to_be_bytes()),
                &format!("an only child with a count of {count}"),
            );
        }
        for flag in [2u8, 0x80, 0xff] {
            bad(&|v| v[9] = flag, &format!("only-child flag {flag}"));
        }
        bad(
            &|v| v[10..14].copy_from_slice(&0u32.to_be_bytes()),
            "an empty only-child id",
        );
        bad(
            &|v| {
                let n = u32::from_be_bytes(v[10..14].try_into().unwrap()) as usize;
                v[14..14 + n].fill(0xff);
            },
            "an only-child id that is not UTF-8",
        );
        bad(&|v| v.truncate(5), "a truncated count");
        bad(&|v| v.truncate(12), "a truncated only-child length");
        // A count of one without its only child is well formed (the child
        // is found by a scan of the links).
        let mut v = b.clone();
        v.splice(9.., [0u8]);
        assert_eq!(EntryRecord::decode_children(&v), Ok((1, None)));
    }

    #[test]
    fn the_active_path_index_follows_appends_moves_rewrites_and_rebuilds() {
        let dir = tempfile::tempdir().unwrap();
        let (id, fork_id, before) = {
            let (store, rt) = open(dir.path());
            let (id, h) = writer_session(&rt);
            // Linear appends: the O(1) path.
            let main = append_n(&h, 40, "m");
            check_path(&store, &id);
            // Back to a shallow entry, then a branch: the old path's
            // deeper keys go, the branch's come.
            h.move_leaf(Some(main[9].clone())).unwrap();
            assert_eq!(check_path(&store, &id).len(), 10);
            let side = append_n(&h, 5, "s");
            assert_eq!(check_path(&store, &id).len(), 15);
            // A leaf move back down the first branch: rewrite below the
            // common ancestor only.
            h.move_leaf(Some(main[35].clone())).unwrap();
            assert_eq!(check_path(&store, &id).len(), 36);
            // An append under a non-leaf entry (a branch by append).
            h.append_entry(Entry {
                id: EntryId::parse("x-under-side").unwrap(),
                parent_id: Some(side[2].clone()),
                timestamp_ms: 1,
                kind: user("under side"),
            })
            .unwrap();
            assert_eq!(check_path(&store, &id).len(), 14);
            // A new root.
            h.append_entry(Entry {
                id: EntryId::parse("x-root").unwrap(),
                parent_id: None,
                timestamp_ms: 2,
                kind: user("new root"),
            })
            .unwrap();
            assert_eq!(check_path(&store, &id).len(), 1);
            h.move_leaf(None).unwrap();
            assert_eq!(check_path(&store, &id).len(), 0);
            // A second child of main[39] (off the path below): the rewrite
            // below takes main[39] from two children to one and back.
            h.append_entry(Entry {
                id: EntryId::parse("x-beside").unwrap(),
                parent_id: Some(main[39].clone()),
                timestamp_ms: 3,
                kind: user("beside"),
            })
            .unwrap();
            assert_eq!(check_path(&store, &id).len(), 41);
            h.move_leaf(Some(main[39].clone())).unwrap();
            // A delta rewrite that relinks: an aborted assistant is removed
            // and the custom entry after it moves up one depth.
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
                data: serde_json::json!({"k": 1}),
            })
            .unwrap();
            assert_eq!(check_path(&store, &id).len(), 42);
            let out = h
                .remove_trailing_entries(
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
            assert_eq!(out.removed.len(), 1);
            assert_eq!(check_path(&store, &id).len(), 41);
            // A rewrite that relinks nothing (redaction).
            h.redact(&|s| s.replace("m1", "[r]"), &CancelToken::new())
                .unwrap();
            check_path(&store, &id);
            // The custom entry goes too: main[39] is left with one child,
            // whose link goes with the other's.
            let out = h
                .remove_trailing_entries(
                    &|e| matches!(&e.kind, EntryKind::Custom { .. }),
                    &|_| false,
                    &CancelToken::new(),
                )
                .unwrap();
            assert_eq!(out.removed.len(), 1);
            assert_eq!(check_path(&store, &id).len(), 40);
            drop(h);
            // A fork's seed transcript is indexed with its path.
            let fork = rt.fork(&id, Some(main[20].clone())).unwrap();
            assert_eq!(check_path(&store, fork.id()).len(), 21);
            let before = (check_path(&store, &id), check_path(&store, fork.id()));
            (id, fork.id().clone(), before)
        };
        // Rebuilt from the log: the same paths.
        std::fs::remove_dir_all(dir.path().join("index")).unwrap();
        let (store, rt) = open(dir.path());
        assert_eq!(
            (check_path(&store, &id), check_path(&store, &fork_id)),
            before
        );
        // A state clear empties the path; appends start it again.
        rt.execute(&id, &crate::actions::ClearSession).unwrap();
        assert_eq!(check_path(&store, &id).len(), 0);
        let h = rt.open_handle(&id, HandleOptions::writer()).unwrap();
        append_n(&h, 3, "c");
        assert_eq!(check_path(&store, &id).len(), 3);
        // A path over several blocks of `p` keys; a rewrite of entries
        // deep in it (new log positions) keeps their path links in step.
        append_n(&h, 150, "long");
        assert_eq!(check_path(&store, &id).len(), 153);
        h.redact(&|s| s.replace("long7", "[r]"), &CancelToken::new())
            .unwrap();
        let path = check_path(&store, &id);
        assert_eq!(path.len(), 153);
        // A side branch: its leaf is off the active path (pages walk).
        h.move_leaf(Some(path[100].clone())).unwrap();
        let side = append_n(&h, 3, "side");
        h.move_leaf(path.last().cloned()).unwrap();
        assert_eq!(check_path(&store, &id), path);
        // Root-first pages from the log store (the active path's range
        // reads, or the walk off it) equal the in-memory transcript's.
        let t = store.load(&id).unwrap().unwrap().state().transcript.clone();
        let cancel = CancelToken::new();
        let scope = crate::transcript::ReadScope {
            session: id.as_str(),
            version: read_meta(store.engine().unwrap().index(), &id)
                .unwrap()
                .unwrap()
                .version(),
            cancel: &cancel,
        };
        for leaf in [path.last().unwrap(), &path[70], &side[2]] {
            for budget in [
                crate::transcript::PageBudget::new(1 << 20, 7),
                crate::transcript::PageBudget::new(1 << 20, 64),
                crate::transcript::PageBudget::new(600, 64),
            ] {
                let (mut a, mut b) = (None, None);
                let mut pages = 0;
                loop {
                    let src = store.source(&id).unwrap();
                    let order = crate::transcript::PageOrder::RootFirst;
                    let ra = crate::transcript::read_branch_page(
                        &*src,
                        &scope,
                        leaf,
                        order,
                        a.as_ref(),
                        budget,
                    )
                    .unwrap();
                    let rb = crate::transcript::read_branch_page(
                        &t,
                        &scope,
                        leaf,
                        order,
                        b.as_ref(),
                        budget,
                    )
                    .unwrap();
                    assert_eq!(ra, rb, "page {pages} of {leaf} ({budget:?})");
                    pages += 1;
                    match ra {
                        ReadResult::Page { continuation, .. } => {
                            a = Some(continuation.clone());
                            b = Some(continuation);
                        }
                        ReadResult::Complete { .. } => break,
                        other => panic!("{other:?}"),
                    }
                }
                assert!(pages > 1);
            }
        }
    }

    fn path_blocks(store: &LogStore, id: &SessionId) -> Vec<(Vec<u8>, Vec<u8>)> {
        store
            .engine()
            .unwrap()
            .index()
            .scan_prefix(TRANSCRIPT_INDEXER, &sk(TAG_PATH, id.as_str()))
            .map(Result::unwrap)
            .collect()
    }

    /// The `p` blocks across block boundaries: appends at depths 63, 64
    /// and 65, leaf moves across boundaries both ways, truncation to just
    /// below and just at one, a branch and an off-path append that cross
    /// one, a fork of a path over three blocks; and a rebuild from the
    /// log gives the same block values byte for byte.
    #[test]
    fn active_path_blocks_follow_block_boundaries_and_rebuild_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let (id, fork_id, before) = {
            let (store, rt) = open(dir.path());
            let (id, h) = writer_session(&rt);
            let mut main = append_n(&h, 63, "m");
            assert_eq!(check_path(&store, &id).len(), 63);
            assert_eq!(path_blocks(&store, &id).len(), 1);
            for (depth, tag) in [(63, "d63-"), (64, "d64-"), (65, "d65-")] {
                main.extend(append_n(&h, 1, tag));
                assert_eq!(check_path(&store, &id).len(), depth + 1);
            }
            assert_eq!(path_blocks(&store, &id).len(), 2);
            main.extend(append_n(&h, 134, "deep"));
            assert_eq!(check_path(&store, &id), main);
            assert_eq!(path_blocks(&store, &id).len(), 4);
            // Truncation to just below a boundary, then to exactly one.
            h.move_leaf(Some(main[62].clone())).unwrap();
            assert_eq!(check_path(&store, &id).len(), 63);
            assert_eq!(path_blocks(&store, &id).len(), 1);
            h.move_leaf(Some(main[63].clone())).unwrap();
            assert_eq!(check_path(&store, &id).len(), 64);
            assert_eq!(path_blocks(&store, &id).len(), 1);
            // Back down across three boundaries.
            h.move_leaf(Some(main[199].clone())).unwrap();
            assert_eq!(check_path(&store, &id), main);
            // A branch from depth 62 across the boundary: slot 63 of block
            // 0 changes, block 1 is the branch's, blocks 2 and 3 go.
            h.move_leaf(Some(main[62].clone())).unwrap();
            let side = append_n(&h, 70, "side");
            let p = check_path(&store, &id);
            assert_eq!(p.len(), 133);
            assert_eq!(p[..63], main[..63]);
            assert_eq!(p[63..], side[..]);
            // Between the branches: below the common ancestor only.
            h.move_leaf(Some(main[150].clone())).unwrap();
            assert_eq!(check_path(&store, &id), main[..151]);
            // An append under an off-path entry at depth 63 (the new leaf
            // is at depth 64): block 1 shrinks to one link, block 2 goes.
            h.append_entry(Entry {
                id: EntryId::parse("x-at-64").unwrap(),
                parent_id: Some(side[0].clone()),
                timestamp_ms: 1,
                kind: user("at 64"),
            })
            .unwrap();
            let p = check_path(&store, &id);
            assert_eq!(p.len(), 65);
            assert_eq!(p[63], side[0]);
            assert_eq!(path_blocks(&store, &id).len(), 2);
            // A delta rewrite of entries on both sides of a boundary.
            h.move_leaf(Some(main[199].clone())).unwrap();
            h.redact(&|s| s.replace("d6", "[r]"), &CancelToken::new())
                .unwrap();
            assert_eq!(check_path(&store, &id), main);
            drop(h);
            let fork = rt.fork(&id, Some(main[130].clone())).unwrap();
            assert_eq!(check_path(&store, fork.id())[..], main[..131]);
            assert_eq!(path_blocks(&store, fork.id()).len(), 3);
            let before = (path_blocks(&store, &id), path_blocks(&store, fork.id()));
            (id, fork.id().clone(), before)
        };
        std::fs::remove_dir_all(dir.path().join("index")).unwrap();
        let (store, _rt) = open(dir.path());
        assert_eq!(
            (path_blocks(&store, &id), path_blocks(&store, &fork_id)),
            before
        );
        assert_eq!(check_path(&store, &id).len(), 200);
        assert_eq!(check_path(&store, &fork_id).len(), 131);
    }

    /// Writes raw keys into the transcript index's namespace (events of
    /// kind `raw`: u16 BE key length, key, value) and indexes every
    /// commit as the transcript indexer does: damaged `p` blocks where
    /// readers and writers meet them.
    struct RawIndexer;

    impl Indexer for RawIndexer {
        fn name(&self) -> &'static str {
            TRANSCRIPT_INDEXER
        }

        fn version(&self) -> u32 {
            TRANSCRIPT_INDEX_VERSION
        }

        fn apply(
            &self,
            commit: &RecordedCommit,
            batch: &mut IndexBatch<'_>,
        ) -> Result<(), IndexError> {
            for ev in commit.events.iter().filter(|e| e.kind == "raw") {
                let n = usize::from(u16::from_be_bytes([ev.payload[0], ev.payload[1]]));
                batch.insert(&ev.payload[2..2 + n], &ev.payload[2 + n..]);
            }
            TranscriptIndexer::default().apply(commit, batch)
        }
    }

    fn raw_event(key: &[u8], value: &[u8]) -> spool_engine::EventData {
        let mut payload = (key.len() as u16).to_be_bytes().to_vec();
        payload.extend_from_slice(key);
        payload.extend_from_slice(value);
        spool_engine::EventData::new("raw", payload)
    }

    fn session_event(ev: &SessionEvent) -> spool_engine::EventData {
        spool_engine::EventData::new(
            format!("{SESSION_EVENT_PREFIX}{}", ev.kind()),
            crate::session::encode_event(ev).unwrap(),
        )
    }

    /// A damaged `p` block (lengths past the end or outside a link's
    /// bounds, too many links, an oversized value, a link with a bad id)
    /// makes the reads of the active path that meet it fail with an
    /// `IndexError` naming the session and the depth (a bad framing fails
    /// every read of the block, a bad link the reads of that link), and
    /// an append onto it fail the same way; never a panic. A block shorter than the path's length
    /// says is not read as the path (the readers fall back to walks).
    #[test]
    fn damaged_path_blocks_fail_reads_and_writes_with_index_errors() {
        let eid = |i: usize| EntryId::parse(&format!("e{i}")).unwrap();
        let sid = SessionId::parse("damaged").unwrap();
        let entries: Vec<Entry> = (0..3)
            .map(|i| Entry {
                id: eid(i),
                parent_id: i.checked_sub(1).map(eid),
                timestamp_ms: i as i64,
                kind: user(&format!("entry {i}")),
            })
            .collect();
        let mut transcript = crate::transcript::Transcript::new();
        transcript.replace_all(entries, Some(eid(2)));
        let created = seeded_created(&sid, transcript);
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(
            Store::open(
                dir.path(),
                spool_engine::Options::default().indexer(Arc::new(RawIndexer)),
            )
            .unwrap(),
        );
        let mut version = 0u64;
        let mut append = |events: Vec<spool_engine::EventData>| {
            let expected = match version {
                0 => spool_engine::ExpectedVersion::NoStream,
                v => spool_engine::ExpectedVersion::Exact(v),
            };
            let out = engine.append(spool_engine::NewCommit::new(sid.as_str(), expected, events));
            if out.is_ok() {
                version += 1;
            }
            out
        };
        append(vec![session_event(&created)]).unwrap();
        let key = path_block_key(sid.as_str(), 0);
        let good = engine
            .index()
            .get(TRANSCRIPT_INDEXER, &key)
            .unwrap()
            .unwrap();
        let src = LogTranscriptSource::new(engine.clone(), sid.clone());
        let whole = src.path_range(&eid(2), 2, 0, 2, u64::MAX).unwrap().unwrap();
        assert_eq!(whole.len(), 3);
        assert_eq!(src.ancestor_at_depth(&eid(2), 0).unwrap(), Some(eid(0)));

        let link0 = block_link(&good, 0).unwrap().unwrap().to_vec();
        let mut too_many = Vec::new();
        for _ in 0..=PATH_BLOCK_DEPTHS {
            push_block_link(&mut too_many, &link0);
        }
        let mut bad_id = good.clone();
        // The first byte of the first link's id (after the length prefix
        // and the link's header): not UTF-8.
        bad_id[PATH_LINK_LEN_BYTES + PATH_LINK_HEADER] = 0xff;
        let damaged: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", good[..good.len() - 1].to_vec()),
            ("length below a link's header", {
                let mut v = good.clone();
                v.extend_from_slice(&[0, 5, 1, 2, 3, 4, 5]);
                v
            }),
            ("length past a link's bound", {
                let mut v = good.clone();
                v.extend_from_slice(&u16::MAX.to_be_bytes());
                v.extend(std::iter::repeat_n(0u8, usize::from(u16::MAX)));
                v
            }),
            ("too many links", too_many),
            ("oversized", vec![0u8; PATH_BLOCK_BYTES_MAX + 1]),
            ("bad id", bad_id),
        ];
        for (what, value) in damaged {
            append(vec![raw_event(&key, &value)]).unwrap();
            let src = LogTranscriptSource::new(engine.clone(), sid.clone());
            let check = |r: Result<(), StoreError>| match r {
                Err(StoreError::Engine(spool_engine::Error::Index(IndexError::Malformed(m)))) => {
                    assert!(m.contains("session damaged, depth "), "{what}: {m}")
                }
                other => panic!("{what}: {other:?}"),
            };
            check(src.path_range(&eid(2), 2, 0, 2, u64::MAX).map(|_| ()));
            check(src.ancestor_at_depth(&eid(2), 0).map(|_| ()));
            if what != "bad id" {
                // The framing of the whole block is checked on every read;
                // a link's contents when it is read.
                check(src.path_range(&eid(2), 2, 2, 2, 0).map(|_| ()));
            }
        }
        // A well-formed block with fewer links than the path's length: not
        // the path (the caller walks).
        let mut short = Vec::new();
        for slot in 0..2 {
            push_block_link(&mut short, block_link(&good, slot).unwrap().unwrap());
        }
        append(vec![raw_event(&key, &short)]).unwrap();
        let src = LogTranscriptSource::new(engine.clone(), sid.clone());
        assert_eq!(src.path_range(&eid(2), 2, 0, 2, u64::MAX).unwrap(), None);
        assert_eq!(src.ancestor_at_depth(&eid(2), 0).unwrap(), None);
        // An append under the leaf onto a malformed block fails in the
        // indexer (the commit is in the log; the index refuses it).
        append(vec![raw_event(&key, &good[..good.len() - 1])]).unwrap();
        let e3 = Entry {
            id: eid(3),
            parent_id: Some(eid(2)),
            timestamp_ms: 3,
            kind: user("entry 3"),
        };
        let failed = append(vec![session_event(&SessionEvent::EntryAppended {
            entry: e3,
        })]);
        match failed {
            Err(spool_engine::Error::Index(IndexError::Malformed(m))) => {
                assert!(m.contains("session damaged, depth "), "{m}")
            }
            other => panic!("{other:?}"),
        }
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
