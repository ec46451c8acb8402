//! Segments: scanning (recovery, verification) and reading records.

use crate::error::Error;
use crate::format::CommitRef;
use crate::format::{self, FrameCheck, FRAME_HEADER_BYTES, SEGMENT_HEADER_BYTES};
use crate::types::{LogPosition, RecordedCommit};
use crate::vfs::{Mapped, VfsFile};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One segment file of an open store.
#[derive(Debug)]
pub(crate) struct Segment {
    pub id: u64,
    pub name: String,
    /// Where the file is, for the I/O errors of reads: the store directory joined with
    /// the file's name (see [`Segment::at`]). The name alone until then.
    path: Arc<Path>,
    pub file: Arc<dyn VfsFile>,
    /// End of the acknowledged records: reads never go past it.
    pub end: AtomicU64,
    /// File size reserved for records (preallocated length).
    pub capacity: u64,
    /// Seq of the first record in the segment, 0 while it has none.
    pub first_seq: AtomicU64,
    /// Offset of the first record (after the header and any extension).
    pub data_start: u64,
    /// For a segment written by GC: the seq range it stands for.
    pub compacted: Option<(u64, u64)>,
    /// Memory map: of the whole file, made on first read once the segment is sealed (or
    /// read-only); of a prefix below the acknowledged end while the segment is active
    /// (see [`ACTIVE_MAP_SLACK_BYTES`]).
    /// The flag says whether the map is of the whole file.
    map: Mutex<Option<(Arc<Mapped>, bool)>>,
    /// Whether the segment is sealed (or read-only): no byte of it is written again, and
    /// reads map the whole file.
    pub mappable: std::sync::atomic::AtomicBool,
}

impl Segment {
    pub fn new(
        id: u64,
        file: Arc<dyn VfsFile>,
        end: u64,
        capacity: u64,
        first_seq: u64,
    ) -> Segment {
        let name = format::segment_file_name(id);
        Segment {
            id,
            path: Arc::from(Path::new(&name)),
            name,
            file,
            end: AtomicU64::new(end),
            capacity,
            first_seq: AtomicU64::new(first_seq),
            data_start: SEGMENT_HEADER_BYTES,
            compacted: None,
            map: Mutex::new(None),
            mappable: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Set where the file is, so its I/O errors name the full path as every other I/O
    /// error of the engine does. The segment carries it because its maps and reads
    /// happen long after the open, where no caller knows the directory (a segment a
    /// checkpoint covers is mapped by the first read that reaches it).
    pub fn at(mut self, path: impl Into<PathBuf>) -> Segment {
        self.path = Arc::from(path.into());
        self
    }

    /// Set what the header says (data start, compacted range).
    pub fn with_header(mut self, h: format::SegmentHeader) -> Segment {
        self.data_start = h.data_start;
        self.compacted = h.compacted;
        self
    }

    /// Where the segment sits in log order: segments are ordered by this key, then id.
    /// A compacted segment by the start of its seq range, any other by its first seq; an
    /// empty one (the active segment before its first write) comes last.
    pub fn order_key(&self) -> u64 {
        match self.compacted {
            Some((first, _)) => first,
            None => match self.first_seq.load(Ordering::Acquire) {
                0 => u64::MAX,
                s => s,
            },
        }
    }

    /// Mark the segment sealed (no byte of it is written again): its first read maps
    /// the whole file.
    pub fn sealed(self) -> Segment {
        self.mappable.store(true, Ordering::Release);
        self
    }

    pub fn with_map(self, map: Arc<Mapped>) -> Segment {
        *self.map.lock().unwrap_or_else(|e| e.into_inner()) = Some((map, true));
        self.mappable.store(true, Ordering::Release);
        self
    }

    /// The length of the segment's map and whether it is of the whole file, if it has one.
    #[cfg(test)]
    pub(crate) fn map_state(&self) -> Option<(u64, bool)> {
        let g = self.map.lock().unwrap_or_else(|e| e.into_inner());
        g.as_ref().map(|(m, whole)| (m.len() as u64, *whole))
    }

    /// A map holding at least the bytes before `stop` (at most the acknowledged end), or
    /// `None` when reads of them go to the file.
    ///
    /// A sealed segment is mapped whole, once. The active segment's bytes before its
    /// acknowledged end never change either (the writer writes at and after the end), so
    /// a map of exactly that prefix serves reads below it: it is made again when the end
    /// has moved [`ACTIVE_MAP_SLACK_BYTES`] (or a quarter of the mapped length, whichever
    /// is more) past it, and until then reads of the newest records go to the file. So a
    /// store that appends and reads in turn maps again at most once per slack, and one
    /// smaller than the slack is never mapped while active.
    fn mapped_for(&self, stop: u64) -> Result<Option<Arc<Mapped>>, Error> {
        let sealed = self.mappable.load(Ordering::Acquire);
        let mut g = self.map.lock().unwrap_or_else(|e| e.into_inner());
        let covered = g.as_ref().map_or(0, |(m, _)| m.len() as u64);
        if let Some((m, whole)) = g.as_ref() {
            if *whole || covered >= stop {
                return Ok(Some(m.clone()));
            }
        }
        if sealed {
            // The whole file (a prefix map made while the segment was active is replaced).
            let m = Arc::new(
                self.file
                    .map()
                    .map_err(|e| Error::io(&*self.path, "map", e))?,
            );
            *g = Some((m.clone(), true));
            return Ok(Some(m));
        }
        let end = self.end.load(Ordering::Acquire);
        if end.saturating_sub(covered) < ACTIVE_MAP_SLACK_BYTES.max(covered / 4) {
            return Ok(None);
        }
        let m = Arc::new(
            self.file
                .map_prefix(end)
                .map_err(|e| Error::io(&*self.path, "map", e))?,
        );
        debug_assert_eq!(m.len() as u64, end, "a prefix map is exactly the prefix");
        *g = Some((m.clone(), false));
        Ok((end >= stop).then_some(m))
    }

    /// Read and decode the record at `offset`. Lengths are checked against the segment's
    /// acknowledged end and `max_len` before anything is allocated.
    pub fn read(&self, offset: u64, max_len: u32) -> Result<RecordedCommit, Error> {
        self.visit(offset, max_len, |c| c.to_owned())
    }

    /// Read the record at `offset`, decode it in place and hand it to `f`: borrowed from
    /// the segment's map when it has one, else from one read into a buffer the calling
    /// thread reuses (a second read only for a record longer than
    /// [`READ_AHEAD_BYTES`]). The checks are [`Segment::read`]'s.
    pub fn visit<R>(
        &self,
        offset: u64,
        max_len: u32,
        f: impl FnOnce(CommitRef<'_>) -> R,
    ) -> Result<R, Error> {
        let end = self.end.load(Ordering::Acquire);
        if offset < self.data_start || offset >= end {
            return Err(Error::NotFound(format!("{}@{offset}", self.name)));
        }
        let pos = LogPosition {
            segment: self.id,
            offset,
        };
        // A map holding the frame's header; the frame is checked to lie inside it.
        let want = end.min(offset.saturating_add(FRAME_HEADER_BYTES));
        if let Some(map) = self.mapped_for(want)? {
            let covered = (end as usize).min(map.len());
            let bytes = map.get(offset as usize..covered).ok_or_else(|| {
                Error::corrupt(&self.name, offset, "segment shorter than its end")
            })?;
            let check = format::check_frame(bytes, self.id, max_len);
            // A map of the active segment's prefix may end inside the record: anything
            // but a valid frame wholly inside it is left to the read below, which gives
            // the answer of the file.
            if covered as u64 >= end || matches!(check, FrameCheck::Valid { .. }) {
                return match check {
                    FrameCheck::Valid { payload, .. } => format::decode_commit_ref(payload, pos)
                        .map(f)
                        .map_err(|p| Error::corrupt(&self.name, offset, p)),
                    FrameCheck::Zero => Err(Error::corrupt(
                        &self.name,
                        offset,
                        "no record here (zero bytes)",
                    )),
                    FrameCheck::Invalid(p) => Err(Error::corrupt(&self.name, offset, p)),
                };
            }
        }
        let mut buf = READ_BUF.with(|b| std::mem::take(&mut *b.borrow_mut()));
        let res = self.visit_read(offset, end, max_len, pos, &mut buf, f);
        if buf.capacity() <= READ_BUF_KEEP_BYTES {
            READ_BUF.with(|b| *b.borrow_mut() = buf);
        }
        res
    }

    /// [`Segment::visit`] of an unmapped segment, reading into `buf`.
    fn visit_read<R>(
        &self,
        offset: u64,
        end: u64,
        max_len: u32,
        pos: LogPosition,
        buf: &mut Vec<u8>,
        f: impl FnOnce(CommitRef<'_>) -> R,
    ) -> Result<R, Error> {
        // The frame header and, for most records, the whole payload in one read;
        // never past the acknowledged end.
        let first = (end - offset).min(READ_AHEAD_BYTES);
        buf.clear();
        buf.resize(first as usize, 0);
        self.file
            .read_at(buf, offset)
            .map_err(|e| Error::io(&*self.path, "read_at", e))?;
        let mut hb = [0u8; FRAME_HEADER_BYTES as usize];
        let head = buf
            .get(..FRAME_HEADER_BYTES as usize)
            .ok_or_else(|| Error::corrupt(&self.name, offset, "truncated frame header"))?;
        hb.copy_from_slice(head);
        let h = format::FrameHeader::parse(&hb);
        let total = FRAME_HEADER_BYTES + u64::from(h.len);
        if h.len > max_len || offset + total > end {
            return Err(Error::corrupt(
                &self.name,
                offset,
                format!("record length {} exceeds the segment or the maximum", h.len),
            ));
        }
        if total > first {
            // Checked above: `total` is at most `max_len` plus the header.
            buf.resize(total as usize, 0);
            let rest = buf.get_mut(first as usize..).unwrap_or(&mut []);
            self.file
                .read_at(rest, offset + first)
                .map_err(|e| Error::io(&*self.path, "read_at", e))?;
        }
        let payload = buf
            .get(FRAME_HEADER_BYTES as usize..total as usize)
            .unwrap_or(&[]);
        if h.kind != format::RECORD_KIND_COMMIT
            || format::record_crc(self.id, h.kind, payload) != h.crc
        {
            return Err(Error::corrupt(
                &self.name,
                offset,
                "record checksum mismatch",
            ));
        }
        format::decode_commit_ref(payload, pos)
            .map(f)
            .map_err(|p| Error::corrupt(&self.name, offset, p))
    }
}

/// The bytes of a segment from `start` on, read once for several records (see
/// `Segment::span`).
#[derive(Debug)]
pub struct LogSpan {
    segment: u64,
    name: String,
    start: u64,
    max_len: u32,
    bytes: SpanBytes,
}

#[derive(Debug)]
enum SpanBytes {
    /// A range of the segment's map.
    Mapped(Arc<Mapped>, std::ops::Range<usize>),
    /// Read from the file.
    Read(Vec<u8>),
}

impl LogSpan {
    fn bytes(&self) -> &[u8] {
        match &self.bytes {
            SpanBytes::Mapped(m, r) => m.get(r.clone()).unwrap_or(&[]),
            SpanBytes::Read(v) => v,
        }
    }

    /// The record at `pos`, checked and decoded in place as `Segment::visit` does,
    /// handed to `f`; `None` when the record is not wholly inside the span (the caller
    /// reads it on its own).
    pub fn visit<R>(
        &self,
        pos: LogPosition,
        f: impl FnOnce(CommitRef<'_>) -> R,
    ) -> Option<Result<R, Error>> {
        if pos.segment != self.segment || pos.offset < self.start {
            return None;
        }
        let at = usize::try_from(pos.offset - self.start).ok()?;
        let bytes = self.bytes().get(at..)?;
        let mut hb = [0u8; FRAME_HEADER_BYTES as usize];
        hb.copy_from_slice(bytes.get(..FRAME_HEADER_BYTES as usize)?);
        let h = format::FrameHeader::parse(&hb);
        let total = usize::try_from(FRAME_HEADER_BYTES + u64::from(h.len)).ok()?;
        if h.len <= self.max_len && total > bytes.len() {
            return None;
        }
        // The frame is inside the span (or its length is refused): the checks of a
        // read, on exactly its bytes.
        let frame = bytes.get(..total.min(bytes.len()))?;
        Some(
            match format::check_frame(frame, self.segment, self.max_len) {
                FrameCheck::Valid { payload, .. } => format::decode_commit_ref(payload, pos)
                    .map(f)
                    .map_err(|p| Error::corrupt(&self.name, pos.offset, p)),
                FrameCheck::Zero => Err(Error::corrupt(
                    &self.name,
                    pos.offset,
                    "no record here (zero bytes)",
                )),
                FrameCheck::Invalid(p) => Err(Error::corrupt(&self.name, pos.offset, p)),
            },
        )
    }
}

impl Segment {
    /// The segment's acknowledged bytes from `offset` on, at most `len` of them:
    /// borrowed from the map when the segment has one, else read with one `pread`.
    /// For reading several nearby records ([`LogSpan::visit`]) at the cost of one read.
    pub fn span(&self, offset: u64, len: u64, max_len: u32) -> Result<LogSpan, Error> {
        let end = self.end.load(Ordering::Acquire);
        if offset < self.data_start || offset >= end {
            return Err(Error::NotFound(format!("{}@{offset}", self.name)));
        }
        let stop = offset.saturating_add(len).min(end);
        let bytes = match self.mapped_for(stop)? {
            Some(map) => {
                let r = offset as usize..(stop as usize).min(map.len());
                if r.start > r.end {
                    return Err(Error::corrupt(
                        &self.name,
                        offset,
                        "segment shorter than its end",
                    ));
                }
                SpanBytes::Mapped(map, r)
            }
            None => {
                let n = usize::try_from(stop - offset)
                    .map_err(|_| Error::corrupt(&self.name, offset, "span longer than memory"))?;
                let mut v = vec![0u8; n];
                self.file
                    .read_at(&mut v, offset)
                    .map_err(|e| Error::io(&*self.path, "read_at", e))?;
                SpanBytes::Read(v)
            }
        };
        Ok(LogSpan {
            segment: self.id,
            name: self.name.clone(),
            start: offset,
            max_len,
            bytes,
        })
    }
}

/// Bytes read at once from an unmapped segment: the frame header and the payload of
/// most records (a longer record takes a second read for the rest).
pub const READ_AHEAD_BYTES: u64 = 8 << 10;

/// How far the active segment's acknowledged end moves past its map (or a quarter of
/// the mapped length, when that is more) before a read maps the prefix again; reads of
/// the bytes after the map go to the file until then. Bounds the remaps of a store that
/// appends and reads in turn (each costs a `mmap` and the page faults of what is read
/// through it), and keeps a store smaller than this unmapped while active.
pub const ACTIVE_MAP_SLACK_BYTES: u64 = 1 << 20;

/// A thread's read buffer is kept for its next read only up to this capacity, so one
/// large record does not pin its size in every reading thread.
const READ_BUF_KEEP_BYTES: usize = 1 << 20;

thread_local! {
    /// The read buffer of [`Segment::visit`] for unmapped segments. Taken out while in
    /// use, so a nested read (from inside `f`) gets a fresh one rather than a conflict.
    static READ_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Segments in log order (see [`sort_in_log_order`]).
pub(crate) fn in_log_order<'a>(
    segs: impl IntoIterator<Item = &'a Arc<Segment>>,
) -> Vec<Arc<Segment>> {
    let mut v: Vec<Arc<Segment>> = segs.into_iter().cloned().collect();
    sort_in_log_order(&mut v, |s| (s.id, s.compacted.is_some(), s.order_key()));
    v
}

/// Sort segments into log order. `info` gives (id, written by GC, key): the key of a GC
/// segment is the start of its seq range, that of another segment its first seq, or
/// `u64::MAX` when it has no (readable) first record. Segments the writer made are in id
/// order; one without a key goes right before the next one that has one (an empty
/// sealed segment: the first record was too large for it), or last. GC segments go
/// where their range starts.
pub(crate) fn sort_in_log_order<T>(v: &mut Vec<T>, info: impl Fn(&T) -> (u64, bool, u64)) {
    let mut plain: Vec<(u64, usize)> = v
        .iter()
        .enumerate()
        .filter(|(_, t)| !info(t).1)
        .map(|(i, t)| (info(t).0, i))
        .collect();
    plain.sort_unstable();
    let mut keys: Vec<u64> = v.iter().map(|t| info(t).2).collect();
    let mut next = u64::MAX;
    for &(_, i) in plain.iter().rev() {
        if keys[i] != u64::MAX {
            next = keys[i];
        }
        keys[i] = next;
    }
    let mut idx: Vec<usize> = (0..v.len()).collect();
    idx.sort_by_key(|&i| (keys[i], info(&v[i]).0));
    let mut taken: Vec<Option<T>> = v.drain(..).map(Some).collect();
    for i in idx {
        if let Some(t) = taken.get_mut(i).and_then(Option::take) {
            v.push(t);
        }
    }
}

/// How the records of a segment end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Tail {
    /// Only zeros (or nothing) after the last valid record.
    Clean,
    /// Bytes after the last valid record that are neither zero nor a valid record, and no
    /// valid record follows them: a torn write. `written_end` is one past the last nonzero
    /// byte.
    Torn { problem: String, written_end: u64 },
    /// An invalid frame followed by a valid record at `valid_at` (past the bytes the
    /// invalid frame's header claims): corruption.
    Corrupt { problem: String, valid_at: u64 },
    /// An invalid frame whose header claims bytes that hold a valid-looking frame at
    /// `inner_at`, and no valid frame after them. The inner frame is never taken for a
    /// record (message text is stored verbatim and may hold a frame); whether the outer
    /// record was the last write, torn, or a record whose length field was damaged cannot
    /// be told from the bytes, so it is corruption, not a torn tail.
    Enclosed { problem: String, inner_at: u64 },
}

/// Result of scanning one segment's bytes.
#[derive(Debug)]
pub(crate) struct SegmentScan {
    /// One past the last valid record (where the next record goes).
    pub end: u64,
    pub tail: Tail,
}

/// One past the last nonzero byte of `bytes` (0 if all zero).
pub(crate) fn written_end(bytes: &[u8]) -> u64 {
    // Word-wise from the back: the zero tail of a preallocated segment can be large.
    let mut end = bytes.len();
    while end >= 8 {
        let mut w = [0u8; 8];
        w.copy_from_slice(&bytes[end - 8..end]);
        if u64::from_ne_bytes(w) != 0 {
            break;
        }
        end -= 8;
    }
    while end > 0 && bytes[end - 1] == 0 {
        end -= 1;
    }
    end as u64
}

/// Whether a segment file whose header does not validate can be one whose creation did
/// not complete (a crash before its header was durable): a creation writes the header
/// before any record, so nothing after the header region was ever written. A file with
/// any nonzero byte past the header (random bytes, another program's file, a segment
/// whose header was damaged later) is not spool's to reformat: it is damage.
pub(crate) fn is_unfinished_creation(bytes: &[u8]) -> bool {
    written_end(bytes) <= SEGMENT_HEADER_BYTES
}

/// Where the bytes claimed by the frame header at `off` end, when that header is
/// plausible (a commit frame within the length limit, not all zero): a valid-looking
/// frame inside them is part of that record (e.g. planted in message text), never a
/// record of its own.
pub(crate) fn claimed_end(bytes: &[u8], off: u64, max_len: u32) -> Option<u64> {
    let head = bytes.get(off as usize..(off + FRAME_HEADER_BYTES) as usize)?;
    let head: &[u8; FRAME_HEADER_BYTES as usize] = head.try_into().ok()?;
    if format::FrameHeader::is_zero(head) {
        return None;
    }
    let h = format::FrameHeader::parse(head);
    (h.kind == format::RECORD_KIND_COMMIT && h.len <= max_len)
        .then(|| off + FRAME_HEADER_BYTES + u64::from(h.len))
}

/// Where the search for the next record after the invalid frame at `off` starts: past
/// the bytes its header claims when it is plausible (see [`claimed_end`]), else the next
/// byte.
pub(crate) fn resume_after_invalid(bytes: &[u8], off: u64, max_len: u32) -> u64 {
    claimed_end(bytes, off, max_len).unwrap_or(off + 1)
}

/// Find the first offset in `from..to` where a valid frame starts.
pub(crate) fn find_valid_frame(
    bytes: &[u8],
    seg_id: u64,
    max_len: u32,
    from: u64,
    to: u64,
) -> Option<u64> {
    let to = to.min(bytes.len() as u64);
    let mut off = from;
    while off < to {
        let rest = &bytes[off as usize..];
        // Cheap filter before the checksum: the kind byte.
        if rest.len() > FRAME_HEADER_BYTES as usize && rest[8] == format::RECORD_KIND_COMMIT {
            if let FrameCheck::Valid { .. } = format::check_frame(rest, seg_id, max_len) {
                return Some(off);
            }
        }
        off += 1;
    }
    None
}

/// Whether the invalid frame a reader found at `off` of the last segment of its view was
/// the live writer's write in flight: a fresh read of the file at `off` now finds a valid
/// frame there.
///
/// The rule for readers beside a writer: the writer only appends, in offset order, and
/// never rewrites a byte it wrote. A reader that found an invalid (or zero) frame at `off`
/// and then a valid frame after it looks at `off` once more: if a valid frame is there
/// now, the first look raced the writer, and the reader's view ends at `off` (every record
/// before it is complete and valid, so the view is a prefix of the log). If the bytes at
/// `off` are still not a valid frame, they were final before the later frame was written:
/// that is damage, reported as such. No timing is involved.
pub(crate) fn frame_landed_since(
    file: &dyn VfsFile,
    seg_id: u64,
    max_len: u32,
    off: u64,
) -> std::io::Result<bool> {
    Ok(
        read_plausible_frame(file, off, max_len)?.is_some_and(|frame| {
            matches!(
                format::check_frame(&frame, seg_id, max_len),
                FrameCheck::Valid { .. }
            )
        }),
    )
}

/// The bytes of the frame at `off`, read with `pread`, when its header is plausible
/// (not zero, its length within `max_len`) and the file holds all of it; `None`
/// otherwise. The caller checks the frame.
pub(crate) fn read_plausible_frame(
    file: &dyn VfsFile,
    off: u64,
    max_len: u32,
) -> std::io::Result<Option<Vec<u8>>> {
    let read = |buf: &mut [u8]| match file.read_at(buf, off) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    };
    let mut head = [0u8; FRAME_HEADER_BYTES as usize];
    if !read(&mut head)? {
        return Ok(None);
    }
    let h = format::FrameHeader::parse(&head);
    if format::FrameHeader::is_zero(&head) || h.len > max_len {
        return Ok(None);
    }
    let mut frame = vec![0u8; FRAME_HEADER_BYTES as usize + h.len as usize];
    Ok(read(&mut frame)?.then_some(frame))
}

/// [`read_plausible_frame`] answered from `prefix`, the file's bytes from offset 0,
/// when they settle it: `Some(None)` for a zero or too long header, `Some(Some(frame))`
/// for a frame they hold whole, `None` when the frame reaches past them (read the file
/// then; it also tells a frame the file cuts short).
pub(crate) fn plausible_frame_in(prefix: &[u8], off: u64, max_len: u32) -> Option<Option<&[u8]>> {
    let start = usize::try_from(off).ok()?;
    let head: &[u8; FRAME_HEADER_BYTES as usize] = prefix
        .get(start..start.checked_add(FRAME_HEADER_BYTES as usize)?)?
        .try_into()
        .ok()?;
    let h = format::FrameHeader::parse(head);
    if format::FrameHeader::is_zero(head) || h.len > max_len {
        return Some(None);
    }
    let end = start
        .checked_add(FRAME_HEADER_BYTES as usize)?
        .checked_add(usize::try_from(h.len).ok()?)?;
    prefix.get(start..end).map(Some)
}

/// How a scan judges a zero frame header: the never-written preallocation, or a
/// zeroed header with written bytes after it (a torn write, or damage).
#[derive(Clone, Copy, Debug)]
pub(crate) enum ZeroHeader<'a> {
    /// Look at every byte after it in the scanned bytes (verify, salvage).
    CheckMapped,
    /// Look at every byte after it through `pread` (an owner's open): the same answer
    /// without faulting the zero tail of the mapping in, which would make the whole
    /// preallocated segment resident.
    CheckFile(&'a dyn VfsFile, &'a Path),
    /// It ends the records (a reader's view): what may follow is a write in flight or a
    /// torn tail, which a reader never judges; damage there is the owner's open's and
    /// `verify`'s to report (RELIABILITY.md, "Beside a live writer").
    EndsView,
}

/// One past the last nonzero byte of `file` at or after `from` (`from` if there is
/// none), read backwards from `len` in fixed chunks: a bounded buffer, never a mapping.
pub(crate) fn written_end_of_file(file: &dyn VfsFile, from: u64, len: u64) -> std::io::Result<u64> {
    const CHUNK_BYTES: u64 = 256 * 1024;
    let mut buf = vec![0u8; CHUNK_BYTES.min(len.saturating_sub(from)) as usize];
    let mut end = len;
    while end > from {
        let n = (end - from).min(CHUNK_BYTES);
        let chunk = &mut buf[..n as usize];
        file.read_at(chunk, end - n)?;
        if let Some(i) = chunk.iter().rposition(|b| *b != 0) {
            return Ok(end - n + i as u64 + 1);
        }
        end -= n;
    }
    Ok(from)
}

/// Scan the records of a segment (`bytes` is the whole file, header included, already
/// validated). `on_record` gets each valid record's offset and payload; an error from it
/// stops the scan. `zero` says how a zero frame header is judged.
pub(crate) fn scan_segment(
    bytes: &[u8],
    seg_id: u64,
    max_len: u32,
    start: u64,
    zero: ZeroHeader<'_>,
    mut on_record: impl FnMut(u64, &[u8]) -> Result<(), Error>,
) -> Result<SegmentScan, Error> {
    let mut off = start;
    loop {
        let rest = bytes.get(off as usize..).unwrap_or(&[]);
        if rest.is_empty() {
            return Ok(SegmentScan {
                end: off,
                tail: Tail::Clean,
            });
        }
        let problem = match format::check_frame(rest, seg_id, max_len) {
            FrameCheck::Valid { payload, total, .. } => {
                on_record(off, payload)?;
                off += total;
                continue;
            }
            FrameCheck::Zero => {
                let we = match zero {
                    ZeroHeader::CheckMapped => written_end(bytes),
                    ZeroHeader::CheckFile(file, path) => {
                        written_end_of_file(file, off, bytes.len() as u64)
                            .map_err(|e| Error::io(path, "read_at", e))?
                    }
                    ZeroHeader::EndsView => off,
                };
                if we <= off {
                    return Ok(SegmentScan {
                        end: off,
                        tail: Tail::Clean,
                    });
                }
                "zero frame header followed by nonzero bytes".to_string()
            }
            FrameCheck::Invalid(p) => p,
        };
        let we = written_end(bytes);
        let resume = resume_after_invalid(bytes, off, max_len);
        let tail = match find_valid_frame(bytes, seg_id, max_len, resume, we) {
            Some(valid_at) => Tail::Corrupt { problem, valid_at },
            None => match find_valid_frame(bytes, seg_id, max_len, off + 1, resume.min(we)) {
                Some(inner_at) => Tail::Enclosed { problem, inner_at },
                None => Tail::Torn {
                    problem,
                    written_end: we,
                },
            },
        };
        return Ok(SegmentScan { end: off, tail });
    }
}

/// Checks that the log's records form a valid history.
///
/// Without GC: seqs dense from 1, every stream's versions contiguous from 1, expected
/// versions consistent. GC removes commits, so: inside a compacted segment (entered with
/// [`HistoryCheck::enter_segment`]) seqs only need to increase within the segment's
/// range, and after it the history continues from the range's end; once a compacted
/// segment has been seen, a stream's first commit may have a version above 1 (GC removed
/// a prefix of it). Everything else stays strict.
#[derive(Debug, Default)]
pub(crate) struct HistoryCheck {
    pub last_seq: u64,
    pub heads: foldhash::HashMap<String, u64>,
    /// The seq range of the compacted segment being checked.
    range: Option<(u64, u64)>,
    /// A compacted segment came before (stream prefixes may be missing).
    compacted_seen: bool,
}

impl HistoryCheck {
    /// Start checking the records of a segment (`compacted`: its header's seq range).
    pub fn enter_segment(&mut self, compacted: Option<(u64, u64)>) -> Result<(), String> {
        self.leave_segment();
        if let Some((first, last)) = compacted {
            if first <= self.last_seq {
                return Err(format!(
                    "compacted segment starts at seq {first}, not after {}",
                    self.last_seq
                ));
            }
            self.range = Some((first, last));
            self.compacted_seen = true;
        }
        Ok(())
    }

    /// Continue a history checked up to `last_seq` elsewhere (a checkpoint); the
    /// caller supplies each stream's head as it first meets the stream.
    pub fn resume(&mut self, last_seq: u64, compacted_seen: bool) {
        self.last_seq = last_seq;
        self.compacted_seen = compacted_seen;
    }

    /// Done with the current segment: a compacted one accounts for its whole range.
    pub fn leave_segment(&mut self) {
        if let Some((_, last)) = self.range.take() {
            self.last_seq = self.last_seq.max(last);
        }
    }

    /// `Err(problem)` when `rec` does not continue the history.
    pub fn check(&mut self, rec: &RecordedCommit) -> Result<(), String> {
        let i = &rec.info;
        match self.range {
            Some((first, last)) => {
                if i.seq <= self.last_seq || i.seq < first || i.seq > last {
                    return Err(format!(
                        "sequence number {} is outside the compacted range {first}..={last} \
                         or does not increase from {}",
                        i.seq, self.last_seq
                    ));
                }
            }
            None => {
                if i.seq != self.last_seq + 1 {
                    return Err(format!(
                        "sequence number {} does not follow {}",
                        i.seq, self.last_seq
                    ));
                }
            }
        }
        let mut prev = self.heads.get(&i.stream).copied();
        if prev.is_none() && i.version > 1 && self.compacted_seen {
            // GC removed the stream's first versions.
            prev = Some(i.version - 1);
        }
        let prev_v = prev.unwrap_or(0);
        if i.version != prev_v + 1 {
            return Err(format!(
                "stream {:?} version {} does not follow {prev_v}",
                i.stream, i.version
            ));
        }
        if !rec.expected.matches(prev) {
            return Err(format!(
                "stream {:?} commit expected {:?} but the stream was at {prev_v}",
                i.stream, rec.expected
            ));
        }
        self.accept(rec);
        Ok(())
    }

    /// Take `rec` as the new state without checking (to go on after a reported problem).
    pub fn accept(&mut self, rec: &RecordedCommit) {
        let i = &rec.info;
        self.last_seq = i.seq;
        match self.heads.get_mut(&i.stream) {
            Some(v) => *v = i.version,
            None => {
                self.heads.insert(i.stream.clone(), i.version);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vfs::{OpenMode, OsVfs, Vfs};

    /// A frame found in a file's first bytes is the one a read of the file finds, and
    /// whatever those bytes do not settle is left to the read.
    #[test]
    fn a_frame_in_a_files_first_bytes_is_the_one_read_from_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let max = 1000;
        // (the frame header, or `None` for a zero one; bytes of the frame in the file)
        let cases: [(Option<u32>, usize); 7] = [
            (None, 0),
            (Some(0), 0),
            (Some(5), 5),
            (Some(100), 100),
            (Some(100), 40),
            (Some(900), 900),
            (Some(5000), 5000),
        ];
        for (i, (declared, present)) in cases.into_iter().enumerate() {
            let mut bytes = vec![0xa5u8; 32];
            match declared {
                Some(len) => {
                    bytes.extend_from_slice(&len.to_le_bytes());
                    bytes.extend_from_slice(&[1, 2, 3, 4, 5]);
                }
                None => bytes.extend_from_slice(&[0; FRAME_HEADER_BYTES as usize]),
            }
            bytes.extend((0..present).map(|b| b as u8));
            let path = dir.path().join(format!("f{i}"));
            std::fs::write(&path, &bytes).unwrap();
            let file = OsVfs.open(&path, OpenMode::Read).unwrap();
            let read = read_plausible_frame(&*file, 32, max).unwrap();
            for cut in 0..=bytes.len() {
                if let Some(found) = plausible_frame_in(&bytes[..cut], 32, max) {
                    assert_eq!(found, read.as_deref(), "case {i}, first {cut} bytes");
                }
            }
            // The whole file settles every case but a frame it cuts short.
            let cut_short = declared.is_some_and(|len| len <= max && (present as u32) < len);
            assert_eq!(
                plausible_frame_in(&bytes, 32, max).is_none(),
                cut_short,
                "case {i}"
            );
        }
    }
}
