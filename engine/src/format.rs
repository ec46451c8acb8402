//! The on-disk format: segment header, record frame and commit payload.
//!
//! Everything is little-endian with explicit widths; the byte map is in docs/format.md at
//! the repository root ("Segment header", "Record frame", "Commit payload").

use crate::types::{CommitInfo, EventData, ExpectedVersion, LogPosition, RecordedCommit};
use uuid::Uuid;

/// Magic bytes at the start of every segment.
pub const SEGMENT_MAGIC: [u8; 8] = *b"SPOOLSEG";
/// The segment format version this build writes and reads.
pub const SEGMENT_FORMAT_VERSION: u32 = 1;
/// Size of the segment header in bytes.
pub const SEGMENT_HEADER_BYTES: u64 = 32;
/// Header flag of a segment written by log compaction (GC): the header is followed by a
/// [`COMPACTED_EXT_BYTES`] extension naming the seq range the segment replaces.
pub const SEGMENT_FLAG_COMPACTED: u32 = 1;
/// Size of the compacted-segment header extension: first seq u64, last seq u64,
/// reserved u32, crc u32.
pub const COMPACTED_EXT_BYTES: u64 = 24;
/// Size of a record frame's header: len u32 + crc u32 + kind u8.
pub const FRAME_HEADER_BYTES: u64 = 9;
/// Record kind of a commit.
pub const RECORD_KIND_COMMIT: u8 = 1;

/// Default maximum record payload size (16 MiB).
pub const RECORD_BYTES_MAX_DEFAULT: u32 = 16 << 20;
/// Hard cap for [`crate::Options::record_bytes_max`] (256 MiB).
pub const RECORD_BYTES_HARD_CAP: u32 = 256 << 20;
/// Default largest segment size (64 MiB): segments grow to it (see
/// [`crate::Options::segment_bytes_max`]).
pub const SEGMENT_BYTES_MAX_DEFAULT: u64 = 64 << 20;
/// Capacity of a store's first segment (1 MiB, or `segment_bytes_max` if smaller); each
/// next segment doubles the capacity of the one before, up to `segment_bytes_max`, so a
/// small store stays small on disk.
pub const SEGMENT_BYTES_START: u64 = 1 << 20;
/// Smallest accepted segment size (a record larger than a segment gets one of its own).
pub const SEGMENT_BYTES_MIN: u64 = 4096;

/// Capacity of a new segment that follows a segment of capacity `prev` (`None`: the
/// store has none yet): double `prev`, at least [`SEGMENT_BYTES_START`] and at most
/// `max` (`max` wins over the start). A record larger than this gets a segment sized for
/// it, by the caller.
pub(crate) fn next_segment_capacity(prev: Option<u64>, max: u64) -> u64 {
    let start = SEGMENT_BYTES_START.min(max);
    match prev {
        None => start,
        Some(p) => p.saturating_mul(2).clamp(start, max.max(start)),
    }
}
/// Largest number of events in one commit.
pub const EVENTS_PER_COMMIT_MAX: usize = 65_536;
/// Longest stream id in bytes (stream ids are 1..=255 bytes of UTF-8).
pub const STREAM_ID_BYTES_MAX: usize = 255;
/// Longest event kind in bytes.
pub const EVENT_KIND_BYTES_MAX: usize = 255;

const CRC_MASK_DELTA: u32 = 0xa282_ead8;

/// LevelDB-style masking, so that a CRC stored inside data does not validate as data.
pub fn mask_crc(crc: u32) -> u32 {
    crc.rotate_right(15).wrapping_add(CRC_MASK_DELTA)
}

/// The masked record checksum over `segment_id LE ++ kind ++ payload`.
pub fn record_crc(segment_id: u64, kind: u8, payload: &[u8]) -> u32 {
    // The segment id and the kind in one update: a CRC of a concatenation
    // is the same however it is split, and each update of a few bytes
    // pays the hasher's dispatch.
    let mut prefix = [0u8; 9];
    prefix[..8].copy_from_slice(&segment_id.to_le_bytes());
    prefix[8] = kind;
    let mut h = crc32fast::Hasher::new();
    h.update(&prefix);
    h.update(payload);
    mask_crc(h.finalize())
}

/// File name of a segment: 16 lowercase hex digits + `.seg`.
pub fn segment_file_name(id: u64) -> String {
    format!("{id:016x}.seg")
}

/// Segment id from a file name, `None` when it is not a segment file name.
pub fn parse_segment_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".seg")?;
    if hex.len() != 16
        || !hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

/// Encode a segment header.
pub fn encode_header(segment_id: u64) -> [u8; SEGMENT_HEADER_BYTES as usize] {
    let mut h = [0u8; SEGMENT_HEADER_BYTES as usize];
    h[0..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
    // 12..16 flags, 0.
    h[16..24].copy_from_slice(&segment_id.to_le_bytes());
    // 24..28 reserved, 0.
    let crc = mask_crc(crc32fast::hash(&h[0..28]));
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h
}

/// Encode the header of a segment written by log compaction: the plain header with
/// [`SEGMENT_FLAG_COMPACTED`] set, then the extension: `first_seq` and `last_seq` (the
/// seq range this segment stands for: every commit in it has a seq in the range, and a
/// seq of the range that is not in it was removed by GC), 4 reserved zero bytes, and a
/// masked crc32 of the 52 bytes before it.
pub fn encode_compacted_header(
    segment_id: u64,
    first_seq: u64,
    last_seq: u64,
) -> [u8; (SEGMENT_HEADER_BYTES + COMPACTED_EXT_BYTES) as usize] {
    let mut h = [0u8; (SEGMENT_HEADER_BYTES + COMPACTED_EXT_BYTES) as usize];
    h[0..8].copy_from_slice(&SEGMENT_MAGIC);
    h[8..12].copy_from_slice(&SEGMENT_FORMAT_VERSION.to_le_bytes());
    h[12..16].copy_from_slice(&SEGMENT_FLAG_COMPACTED.to_le_bytes());
    h[16..24].copy_from_slice(&segment_id.to_le_bytes());
    let crc = mask_crc(crc32fast::hash(&h[0..28]));
    h[28..32].copy_from_slice(&crc.to_le_bytes());
    h[32..40].copy_from_slice(&first_seq.to_le_bytes());
    h[40..48].copy_from_slice(&last_seq.to_le_bytes());
    // 48..52 reserved, 0.
    let crc = mask_crc(crc32fast::hash(&h[0..52]));
    h[52..56].copy_from_slice(&crc.to_le_bytes());
    h
}

/// A validated segment header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentHeader {
    /// Offset of the first record (after the header and any extension).
    pub data_start: u64,
    /// For a segment written by GC: the seq range it stands for (inclusive).
    pub compacted: Option<(u64, u64)>,
}

/// Why a header did not validate.
#[derive(Debug, PartialEq, Eq)]
pub enum HeaderProblem {
    /// All zero (or shorter than a header): a segment whose creation did not complete.
    Blank,
    /// Written by a newer format.
    FutureVersion(u32),
    /// Names another segment id than the file name.
    WrongId(u64),
    /// Anything else.
    Invalid(String),
}

/// Validate a segment header against the id its file name gives.
pub fn check_header(bytes: &[u8], expected_id: u64) -> Result<SegmentHeader, HeaderProblem> {
    let Some(h) = bytes.get(..SEGMENT_HEADER_BYTES as usize) else {
        return if bytes.iter().all(|&b| b == 0) {
            Err(HeaderProblem::Blank)
        } else {
            Err(HeaderProblem::Invalid(
                "file shorter than a segment header".into(),
            ))
        };
    };
    if h.iter().all(|&b| b == 0) {
        return Err(HeaderProblem::Blank);
    }
    if h[0..8] != SEGMENT_MAGIC {
        return Err(HeaderProblem::Invalid("bad magic".into()));
    }
    let version = le_u32(&h[8..12]);
    let crc = le_u32(&h[28..32]);
    if crc != mask_crc(crc32fast::hash(&h[0..28])) {
        return Err(HeaderProblem::Invalid("header checksum mismatch".into()));
    }
    if version > SEGMENT_FORMAT_VERSION {
        return Err(HeaderProblem::FutureVersion(version));
    }
    if version == 0 {
        return Err(HeaderProblem::Invalid("format version 0".into()));
    }
    let id = le_u64(&h[16..24]);
    if id != expected_id {
        return Err(HeaderProblem::WrongId(id));
    }
    let flags = le_u32(&h[12..16]);
    if flags & !SEGMENT_FLAG_COMPACTED != 0 {
        return Err(HeaderProblem::Invalid(format!(
            "unknown header flags {flags:#x}"
        )));
    }
    if flags & SEGMENT_FLAG_COMPACTED == 0 {
        return Ok(SegmentHeader {
            data_start: SEGMENT_HEADER_BYTES,
            compacted: None,
        });
    }
    let end = (SEGMENT_HEADER_BYTES + COMPACTED_EXT_BYTES) as usize;
    let Some(x) = bytes.get(..end) else {
        return Err(HeaderProblem::Invalid(
            "file shorter than a compacted segment header".into(),
        ));
    };
    if le_u32(&x[52..56]) != mask_crc(crc32fast::hash(&x[0..52])) {
        return Err(HeaderProblem::Invalid(
            "compacted header checksum mismatch".into(),
        ));
    }
    let (first, last) = (le_u64(&x[32..40]), le_u64(&x[40..48]));
    if first == 0 || first > last {
        return Err(HeaderProblem::Invalid(format!(
            "compacted header seq range {first}..={last} is empty"
        )));
    }
    Ok(SegmentHeader {
        data_start: end as u64,
        compacted: Some((first, last)),
    })
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}
fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Encoded size of a commit payload, `None` on overflow.
pub fn commit_payload_len(stream: &str, events: &[EventData]) -> Option<u64> {
    // stream len + stream + expected kind + expected value + new version + commit id
    // + timestamp + seq + event count
    let mut n: u64 = 2 + stream.len() as u64 + 1 + 8 + 8 + 16 + 8 + 8 + 4;
    for e in events {
        n = n.checked_add(1 + e.kind.len() as u64 + 4 + e.payload.len() as u64)?;
    }
    Some(n)
}

/// Fields of a commit that are not the events.
pub struct CommitHead<'a> {
    pub stream: &'a str,
    pub expected: ExpectedVersion,
    pub version: u64,
    pub commit_id: Uuid,
    pub timestamp_ms: i64,
    pub seq: u64,
}

/// Append a whole frame (header + commit payload) for `segment_id` to `out`.
/// The caller has validated lengths (stream, kinds, event count, total size).
pub fn encode_commit_frame(
    out: &mut Vec<u8>,
    segment_id: u64,
    head: &CommitHead<'_>,
    events: &[EventData],
    payload_len: u32,
) {
    // The whole frame at once: a commit of megabytes (a fork's seed) would
    // otherwise grow `out` by doubling, copying and faulting in its bytes
    // again at every step.
    out.reserve(FRAME_HEADER_BYTES as usize + payload_len as usize);
    let frame_start = out.len();
    out.extend_from_slice(&payload_len.to_le_bytes());
    out.extend_from_slice(&[0u8; 4]); // crc, filled in below
    out.push(RECORD_KIND_COMMIT);
    let payload_start = out.len();
    out.extend_from_slice(&(head.stream.len() as u16).to_le_bytes());
    out.extend_from_slice(head.stream.as_bytes());
    let (ek, ev) = match head.expected {
        ExpectedVersion::Any => (0u8, 0u64),
        ExpectedVersion::NoStream => (1, 0),
        ExpectedVersion::Exact(n) => (2, n),
    };
    out.push(ek);
    out.extend_from_slice(&ev.to_le_bytes());
    out.extend_from_slice(&head.version.to_le_bytes());
    out.extend_from_slice(head.commit_id.as_bytes());
    out.extend_from_slice(&head.timestamp_ms.to_le_bytes());
    out.extend_from_slice(&head.seq.to_le_bytes());
    out.extend_from_slice(&(events.len() as u32).to_le_bytes());
    for e in events {
        out.push(e.kind.len() as u8);
        out.extend_from_slice(e.kind.as_bytes());
        out.extend_from_slice(&(e.payload.len() as u32).to_le_bytes());
        out.extend_from_slice(&e.payload);
    }
    debug_assert_eq!(out.len() - payload_start, payload_len as usize);
    let crc = record_crc(segment_id, RECORD_KIND_COMMIT, &out[payload_start..]);
    out[frame_start + 4..frame_start + 8].copy_from_slice(&crc.to_le_bytes());
}

/// A frame header as read from disk (not yet validated).
#[derive(Debug, Clone, Copy)]
pub struct FrameHeader {
    pub len: u32,
    pub crc: u32,
    pub kind: u8,
}

impl FrameHeader {
    pub fn parse(b: &[u8; FRAME_HEADER_BYTES as usize]) -> FrameHeader {
        FrameHeader {
            len: le_u32(&b[0..4]),
            crc: le_u32(&b[4..8]),
            kind: b[8],
        }
    }
    pub fn is_zero(b: &[u8]) -> bool {
        b.iter().all(|&x| x == 0)
    }
}

/// Outcome of looking at the bytes at one offset of a segment.
#[derive(Debug)]
pub enum FrameCheck<'a> {
    /// A valid frame; `payload` is its payload, `total` its size including the header.
    Valid {
        kind: u8,
        payload: &'a [u8],
        total: u64,
    },
    /// A zero frame header: the clean, never-written tail.
    Zero,
    /// Not a valid frame; why.
    Invalid(String),
}

/// Check the frame at the start of `bytes` (the rest of the segment's data).
/// Never trusts the length field: it is checked against `bytes.len()` and `max_len`.
pub fn check_frame(bytes: &[u8], segment_id: u64, max_len: u32) -> FrameCheck<'_> {
    let Some(hb) = bytes.get(..FRAME_HEADER_BYTES as usize) else {
        if FrameHeader::is_zero(bytes) {
            return FrameCheck::Zero;
        }
        return FrameCheck::Invalid("truncated frame header".into());
    };
    if FrameHeader::is_zero(hb) {
        return FrameCheck::Zero;
    }
    let mut a = [0u8; FRAME_HEADER_BYTES as usize];
    a.copy_from_slice(hb);
    let h = FrameHeader::parse(&a);
    if h.kind != RECORD_KIND_COMMIT {
        return FrameCheck::Invalid(format!("unknown record kind {}", h.kind));
    }
    if h.len > max_len {
        return FrameCheck::Invalid(format!(
            "record length {} exceeds the maximum {max_len}",
            h.len
        ));
    }
    let end = FRAME_HEADER_BYTES + u64::from(h.len);
    let Some(payload) = usize::try_from(end)
        .ok()
        .and_then(|e| bytes.get(FRAME_HEADER_BYTES as usize..e))
    else {
        return FrameCheck::Invalid(format!(
            "record length {} runs past the end of the segment",
            h.len
        ));
    };
    if record_crc(segment_id, h.kind, payload) != h.crc {
        return FrameCheck::Invalid("record checksum mismatch".into());
    }
    FrameCheck::Valid {
        kind: h.kind,
        payload,
        total: end,
    }
}

/// A bounds-checked little-endian reader over a payload.
struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self
            .pos
            .checked_add(n)
            .filter(|&e| e <= self.b.len())
            .ok_or_else(|| format!("{what}: needs {n} bytes, {} left", self.b.len() - self.pos))?;
        let s = &self.b[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, String> {
        let s = self.take(2, what)?;
        Ok(u16::from_le_bytes([s[0], s[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        Ok(le_u32(self.take(4, what)?))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        Ok(le_u64(self.take(8, what)?))
    }
}

/// Decode a commit payload. Every length is checked against the remaining bytes before
/// anything is allocated.
pub fn decode_commit(payload: &[u8], position: LogPosition) -> Result<RecordedCommit, String> {
    Ok(decode_commit_ref(payload, position)?.to_owned())
}

/// The seq field of a commit payload, read without decoding the rest (`None` if short).
pub fn peek_seq(payload: &[u8]) -> Option<u64> {
    let slen = u16::from_le_bytes([*payload.first()?, *payload.get(1)?]) as usize;
    // stream len (2) + stream + expected (1 + 8) + version (8) + id (16) + timestamp (8)
    let off = 2 + slen + 1 + 8 + 8 + 16 + 8;
    let b: [u8; 8] = payload.get(off..off + 8)?.try_into().ok()?;
    Some(u64::from_le_bytes(b))
}

/// Like [`decode_commit`] but without copying the events out (`events` is empty): every
/// field and length is still validated. Recovery uses it for records it only checks.
pub fn decode_commit_head(payload: &[u8], position: LogPosition) -> Result<RecordedCommit, String> {
    let c = decode_commit_ref(payload, position)?;
    Ok(RecordedCommit {
        info: c.info(),
        expected: c.expected,
        events: Vec::new(),
        record_bytes: c.record_bytes,
    })
}

/// A commit decoded in place: every field and length checked exactly as
/// [`decode_commit`] checks them, the stream id and the events borrowed from the
/// payload. Reading one event of a commit this way allocates nothing.
#[derive(Debug, Clone, Copy)]
pub struct CommitRef<'a> {
    pub stream: &'a str,
    pub expected: ExpectedVersion,
    /// The stream's new head version.
    pub version: u64,
    pub seq: u64,
    pub position: LogPosition,
    pub timestamp_ms: i64,
    pub commit_id: Uuid,
    /// Bytes the record occupies in the log (frame header + payload).
    pub record_bytes: u32,
    /// The events' bytes (kind length, kind, payload length, payload; repeated),
    /// already validated.
    events: &'a [u8],
    count: usize,
    /// Event 0, kept from the validation walk: most commits hold one event,
    /// and a reader of one asks for it by index (walking to it again would
    /// check its kind's UTF-8 a second time).
    first: EventRef<'a>,
}

/// One event of a [`CommitRef`], borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EventRef<'a> {
    pub kind: &'a str,
    pub payload: &'a [u8],
}

impl<'a> CommitRef<'a> {
    /// Number of events (1..=[`EVENTS_PER_COMMIT_MAX`]).
    pub fn event_count(&self) -> usize {
        self.count
    }

    /// The events in order.
    pub fn events(&self) -> impl Iterator<Item = EventRef<'a>> {
        let mut r = Reader {
            b: self.events,
            pos: 0,
        };
        // The bytes were validated by `decode_commit_ref`: every step succeeds. The
        // count ends the walk (a step past the last event would build an error).
        let mut left = self.count;
        std::iter::from_fn(move || {
            left = left.checked_sub(1)?;
            next_event(&mut r).ok()
        })
    }

    /// Event `i`, `None` past the last one.
    pub fn event(&self, i: usize) -> Option<EventRef<'a>> {
        if i == 0 {
            return Some(self.first);
        }
        self.events().nth(i)
    }

    /// What the commit is, owned.
    pub fn info(&self) -> CommitInfo {
        CommitInfo {
            stream: self.stream.to_string(),
            version: self.version,
            seq: self.seq,
            position: self.position,
            timestamp_ms: self.timestamp_ms,
            commit_id: self.commit_id,
        }
    }

    /// The commit with its events copied out.
    pub fn to_owned(&self) -> RecordedCommit {
        let mut events = Vec::with_capacity(self.count);
        events.extend(self.events().map(|e| EventData {
            kind: e.kind.to_string(),
            payload: e.payload.to_vec(),
        }));
        debug_assert_eq!(events.len(), self.count);
        RecordedCommit {
            info: self.info(),
            expected: self.expected,
            events,
            record_bytes: self.record_bytes,
        }
    }
}

/// The next event at `r`: kind length, kind (UTF-8), payload length, payload.
fn next_event<'a>(r: &mut Reader<'a>) -> Result<EventRef<'a>, String> {
    let klen = r.u8("event kind length")? as usize;
    let kind = r.take(klen, "event kind")?;
    let kind = std::str::from_utf8(kind).map_err(|_| "event kind: not UTF-8".to_string())?;
    let plen = r.u32("event payload length")? as usize;
    let payload = r.take(plen, "event payload")?;
    Ok(EventRef { kind, payload })
}

/// Decode a commit payload in place (see [`CommitRef`]): the checks of
/// [`decode_commit`], no allocation.
pub fn decode_commit_ref(payload: &[u8], position: LogPosition) -> Result<CommitRef<'_>, String> {
    let mut r = Reader { b: payload, pos: 0 };
    let slen = r.u16("stream length")? as usize;
    if slen == 0 || slen > STREAM_ID_BYTES_MAX {
        return Err(format!("stream length {slen} out of range"));
    }
    let stream = std::str::from_utf8(r.take(slen, "stream id")?)
        .map_err(|_| "stream id: not UTF-8".to_string())?;
    let ek = r.u8("expected kind")?;
    let ev = r.u64("expected version")?;
    let expected = match ek {
        0 => ExpectedVersion::Any,
        1 => ExpectedVersion::NoStream,
        2 => ExpectedVersion::Exact(ev),
        k => return Err(format!("unknown expected-version kind {k}")),
    };
    let version = r.u64("new version")?;
    let mut id = [0u8; 16];
    id.copy_from_slice(r.take(16, "commit id")?);
    let timestamp_ms = r.u64("timestamp")? as i64;
    let seq = r.u64("seq")?;
    let count = r.u32("event count")? as usize;
    if count == 0 || count > EVENTS_PER_COMMIT_MAX {
        return Err(format!("event count {count} out of range"));
    }
    // Each event needs at least 5 bytes: a count the bytes cannot hold is refused
    // before walking them.
    let remaining = payload.len() - r.pos;
    if count > remaining / 5 {
        return Err(format!(
            "event count {count} exceeds what {remaining} bytes can hold"
        ));
    }
    let events_at = r.pos;
    // `count` is at least 1 (checked above).
    let first = next_event(&mut r)?;
    for _ in 1..count {
        next_event(&mut r)?;
    }
    if r.pos != payload.len() {
        return Err(format!(
            "{} trailing bytes after the events",
            payload.len() - r.pos
        ));
    }
    Ok(CommitRef {
        stream,
        expected,
        version,
        seq,
        position,
        timestamp_ms,
        commit_id: Uuid::from_bytes(id),
        record_bytes: u32::try_from(payload.len() as u64 + FRAME_HEADER_BYTES).unwrap_or(u32::MAX),
        events: payload.get(events_at..).unwrap_or(&[]),
        count,
        first,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> (Vec<u8>, Vec<EventData>) {
        let events = vec![
            EventData::new("a", b"first".to_vec()),
            EventData::new("kind-2", vec![]),
            EventData::new("", vec![7u8; 300]),
        ];
        let head = CommitHead {
            stream: "stream-1",
            expected: ExpectedVersion::Exact(4),
            version: 5,
            commit_id: Uuid::from_u128(99),
            timestamp_ms: 1_700_000_000_000,
            seq: 42,
        };
        let len = commit_payload_len(head.stream, &events).unwrap() as u32;
        let mut frame = Vec::new();
        encode_commit_frame(&mut frame, 3, &head, &events, len);
        (frame, events)
    }

    #[test]
    fn record_crc_covers_segment_id_kind_and_payload_in_that_order() {
        let mut bytes = 7u64.to_le_bytes().to_vec();
        bytes.push(2);
        bytes.extend_from_slice(b"payload");
        assert_eq!(
            record_crc(7, 2, b"payload"),
            mask_crc(crc32fast::hash(&bytes))
        );
        assert_ne!(record_crc(7, 2, b"payload"), record_crc(7, 3, b"payload"));
        assert_ne!(record_crc(7, 2, b"payload"), record_crc(8, 2, b"payload"));
    }

    #[test]
    fn frame_round_trips() {
        let (frame, events) = sample();
        let pos = LogPosition {
            segment: 3,
            offset: 32,
        };
        let FrameCheck::Valid { payload, total, .. } = check_frame(&frame, 3, 1 << 20) else {
            panic!("frame does not validate");
        };
        assert_eq!(total, frame.len() as u64);
        let rec = decode_commit(payload, pos).unwrap();
        assert_eq!(rec.events, events);
        assert_eq!(rec.info.seq, 42);
        assert_eq!(rec.info.version, 5);
        assert_eq!(rec.expected, ExpectedVersion::Exact(4));
        assert_eq!(rec.record_bytes as usize, frame.len());
        assert_eq!(peek_seq(payload), Some(42));
        let head = decode_commit_head(payload, pos).unwrap();
        assert_eq!(head.info, rec.info);
        assert!(head.events.is_empty());
        // In place: the same fields, the events borrowed, one by index.
        let r = decode_commit_ref(payload, pos).unwrap();
        assert_eq!(r.info(), rec.info);
        assert_eq!(r.to_owned(), rec);
        assert_eq!(r.event_count(), events.len());
        let borrowed: Vec<EventRef<'_>> = r.events().collect();
        assert_eq!(borrowed.len(), events.len());
        for (i, (b, e)) in borrowed.iter().zip(&events).enumerate() {
            assert_eq!((b.kind, b.payload), (e.kind.as_str(), e.payload.as_slice()));
            assert_eq!(r.event(i), Some(*b), "event {i} by index");
        }
        assert_eq!(r.event(events.len()), None);
        // The checksum binds the segment id: the same bytes in another segment fail.
        assert!(matches!(
            check_frame(&frame, 4, 1 << 20),
            FrameCheck::Invalid(_)
        ));
        // And the length limit is enforced before anything else.
        assert!(matches!(check_frame(&frame, 3, 10), FrameCheck::Invalid(_)));
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let pos = LogPosition { segment: 1, offset: 32 };
            let _ = decode_commit(&bytes, pos);
            let _ = decode_commit_head(&bytes, pos);
            if let Ok(r) = decode_commit_ref(&bytes, pos) {
                prop_assert_eq!(r.events().count(), r.event_count());
            }
            let _ = peek_seq(&bytes);
            let _ = check_frame(&bytes, 1, RECORD_BYTES_HARD_CAP);
            let _ = check_header(&bytes, 1);
        }

        #[test]
        fn damaged_payloads_fail_cleanly(i in 0usize..400, x in 1u8..=255) {
            let (frame, _) = sample();
            let mut payload = frame[FRAME_HEADER_BYTES as usize..].to_vec();
            let i = i % payload.len();
            payload[i] ^= x;
            let pos = LogPosition { segment: 3, offset: 32 };
            // Either an error or a record; never a panic or a huge allocation.
            if let Ok(r) = decode_commit(&payload, pos) {
                prop_assert!(r.record_bytes as usize <= frame.len());
            }
            // In place: accepted exactly when the copying decode accepts.
            prop_assert_eq!(
                decode_commit_ref(&payload, pos).ok().map(|r| r.to_owned()),
                decode_commit(&payload, pos).ok()
            );
        }
    }
}
