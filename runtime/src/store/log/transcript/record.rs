//! The transcript index's values for one session and one entry:
//! [`TranscriptMeta`] and [`EntryRecord`] with their binary encoding, and
//! reading and writing an entry's record in an index batch (its `e` key,
//! else its seed table record). The bytes are laid out in docs/format.md,
//! "Indexer `transcript`".

use serde::{Deserialize, Serialize};
use spool_engine::{IndexBatch, IndexError, LogPosition};

use super::keys::entry_key;
use super::keys::TRANSCRIPT_INDEXER;
use super::seed_table::{find_in_seed_bucket, seed_bucket, seed_key, seed_lookup, SeedLookup};
use crate::transcript::{Anchor, EntryId, PathFacts, PathMarker, TranscriptVersion};

/// Where a decoded entry came from in the log: commit position, event
/// index in the commit, entry index in the event.
pub(super) type EntryKey = (LogPosition, u32, u32);

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
    /// [`entry_size`](crate::transcript::entry_size) of the entry with its current parent.
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
    pub(super) fn position(&self) -> LogPosition {
        LogPosition {
            segment: self.segment,
            offset: self.offset,
        }
    }
}

/// Format byte that starts every encoded [`EntryRecord`] (a record of
/// another format is malformed: the index layout version rebuilds old
/// indexes before they are read); the record's layout is in
/// docs/format.md, "Indexer `transcript`".
pub(super) const RECORD_FORMAT: u8 = 2;

/// Appends the big-endian, length-prefixed fields of an index value.
pub(super) struct Writer(pub(super) Vec<u8>);

impl Writer {
    pub(super) fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_be_bytes());
    }
    pub(super) fn u64(&mut self, v: u64) {
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
    pub(super) fn opt_id(&mut self, id: Option<&EntryId>) {
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
    /// The record's index value: its format byte (`RECORD_FORMAT`), then its
    /// fields; the bytes are laid out in docs/format.md, "Indexer
    /// `transcript`", entry record. The child count and the only child come first, so a
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

/// `id`'s record bytes, resolved through `get` (a batch's or the
/// index's) and, when its `e` key is absent, `in_seed` (the same store's
/// in-place read of the id's seed bucket, through [`seed_lookup`]:
/// buckets are large, so only the record is copied out). An `e` key
/// shadows the seed table: a record written after the seed (any change)
/// is an `e` key, and an entry removed from a seed leaves an empty `e`
/// value (a tombstone: no record).
pub(super) fn locate_record<E>(
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
pub(super) fn get_record_bytes(
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
pub(super) fn remove_record(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
) -> Result<(), IndexError> {
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

pub(super) fn encode<T: Serialize>(what: &str, v: &T) -> Result<Vec<u8>, IndexError> {
    // The meta (encoded once per commit) is ~60 bytes plus its leaf id: a
    // buffer of that size from the start, instead of growth from empty.
    let mut out = Vec::with_capacity(ENCODE_BYTES_HINT);
    rmp_serde::encode::write(&mut out, v)
        .map_err(|e| IndexError::indexer(TRANSCRIPT_INDEXER, format!("{what}: {e}")))?;
    Ok(out)
}

/// The starting capacity of [`encode`]'s buffer.
const ENCODE_BYTES_HINT: usize = 128;

pub(super) fn decode<'a, T: Deserialize<'a>>(what: &str, b: &'a [u8]) -> Result<T, IndexError> {
    rmp_serde::from_slice(b).map_err(|e| IndexError::Malformed(format!("{what}: {e}")))
}

pub(super) fn get_record(
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

pub(super) fn put_record(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
    r: &EntryRecord,
) -> Result<(), IndexError> {
    batch.insert_vec(&entry_key(sid, id), r.encode());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
