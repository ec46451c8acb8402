//! Segment files on disk: creating one (preallocation, header, fsyncs), zeroing a
//! torn tail, and opening and mapping every segment of a directory in log order
//! for open, verify, GC and salvage.

use super::*;

/// Create segment `id`: preallocate, header, fsync the file, fsync the directory.
pub(super) fn create_segment(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    id: u64,
    capacity: u64,
) -> Result<Arc<Segment>, Error> {
    let name = format::segment_file_name(id);
    let path = dir.join(&name);
    let file = vfs
        .open(&path, OpenMode::CreateNew)
        .map_err(|e| Error::io(&path, "create", e))?;
    init_segment_file(
        &*file,
        &path,
        opts.preallocate.resolve(opts.durability),
        id,
        capacity,
    )?;
    vfs.sync_dir(dir)
        .map_err(|e| Error::io(dir, "sync_dir", e))?;
    Ok(Arc::new(
        Segment::new(id, file, SEGMENT_HEADER_BYTES, capacity, 0).at(path),
    ))
}

/// Preallocate (`preallocate` resolved: not `Auto`), write the header and fsync.
pub(crate) fn init_segment_file(
    file: &dyn VfsFile,
    path: &Path,
    preallocate: Preallocate,
    id: u64,
    capacity: u64,
) -> Result<(), Error> {
    file.set_len(capacity)
        .map_err(|e| Error::io(path, "set_len", e))?;
    // The header goes first, on its own: a crash before the `sync_all` keeps a prefix of
    // these writes in order (possibly torn), so an unfinished creation has nonzero bytes
    // in the header region only, which tells it from a file that is not spool's (see
    // `segment::is_unfinished_creation`).
    file.write_at(&format::encode_header(id), 0)
        .map_err(|e| Error::io(path, "write_at", e))?;
    if preallocate == Preallocate::ZeroFill {
        let chunk = ZERO_FILL_CHUNK_BYTES as u64;
        let zeros = vec![0u8; ZERO_FILL_CHUNK_BYTES.min(capacity as usize)];
        let mut off = SEGMENT_HEADER_BYTES.min(capacity);
        while off < capacity {
            // Up to the next chunk boundary, so that every later write is aligned.
            let n = (capacity - off).min(chunk - off % chunk) as usize;
            file.write_at(&zeros[..n], off)
                .map_err(|e| Error::io(path, "write_at", e))?;
            off += n as u64;
        }
    }
    file.sync_all().map_err(|e| Error::io(path, "sync_all", e))
}

/// Zero `from..to` of a segment and fdatasync: the truncation of a torn tail that keeps
/// the preallocated size.
pub(super) fn zero_range(file: &dyn VfsFile, path: &Path, from: u64, to: u64) -> Result<(), Error> {
    let zeros = vec![0u8; ZERO_FILL_CHUNK_BYTES.min((to - from) as usize)];
    let mut off = from;
    while off < to {
        let n = (to - off).min(zeros.len() as u64) as usize;
        file.write_at(&zeros[..n], off)
            .map_err(|e| Error::io(path, "write_at", e))?;
        off += n as u64;
    }
    file.sync_data()
        .map_err(|e| Error::io(path, "sync_data", e))
}

/// A segment file opened by the first pass of a log scan.
pub(crate) struct OpenedSegment {
    pub id: u64,
    /// Where the file is (a `.seg`, or a `.seg.gc` a read-only view rolls forward).
    pub path: PathBuf,
    pub name: String,
    pub file: Arc<dyn VfsFile>,
    /// The file's size when it was opened.
    pub len: u64,
    pub header: Result<format::SegmentHeader, format::HeaderProblem>,
    /// Position in log order (see `Segment::order_key`); `u64::MAX` when unknown.
    pub key: u64,
}

/// Open every segment of the log (read only), check its header, and sort them into log
/// order (see `segment::sort_in_log_order`). Returns the segments and the largest segment
/// id in the directory. Nothing is mapped: a segment a caller reads through is mapped by
/// [`OpenedSegment::map`], one a checkpoint covers only when a read reaches it.
pub(crate) fn open_segments_in_order(
    vfs: &dyn Vfs,
    dir: &Path,
    max: u32,
    read_only: bool,
) -> Result<(Vec<OpenedSegment>, u64), Error> {
    let files = crate::gc::segment_files(vfs, dir, read_only)?;
    let max_id = files.iter().map(|(id, _)| *id).max().unwrap_or(0);
    let mut out = Vec::with_capacity(files.len());
    for (id, file_name) in files {
        out.push(open_segment(vfs, dir, id, &file_name, max)?);
    }
    sort_opened(&mut out);
    Ok((out, max_id))
}

/// [`open_segments_in_order`] for a read-only open over a checkpoint: the segments
/// `listed` (each sealed segment before the checkpoint's record's, with its first seq,
/// end and header; a listing without headers only for a log no GC has rewritten, whose
/// segments are all plain) are not opened. Their names must be in the directory; each
/// is taken as the segment listed, and opened and checked (header, id, size) by the
/// first read that reaches it ([`ListedSegment`]). The others are opened as
/// `open_segments_in_order` opens them, so a segment a GC wrote since shows in the
/// layout and the checkpoint is refused.
pub(crate) fn open_segments_over(
    vfs: &Arc<dyn Vfs>,
    dir: &Path,
    max: u32,
    listed: &[crate::checkpoint::SegmentEnd],
) -> Result<(Vec<OpenedSegment>, u64), Error> {
    let files = crate::gc::segment_files(&**vfs, dir, true)?;
    let max_id = files.iter().map(|(id, _)| *id).max().unwrap_or(0);
    let listed: std::collections::HashMap<u64, &crate::checkpoint::SegmentEnd> =
        listed.iter().map(|t| (t.id, t)).collect();
    let mut out = Vec::with_capacity(files.len());
    for (id, file_name) in files {
        let Some(t) = listed.get(&id) else {
            out.push(open_segment(&**vfs, dir, id, &file_name, max)?);
            continue;
        };
        let path = dir.join(&file_name);
        // A checkpoint of an older format names no header: the caller takes it only
        // for a log no GC rewrote, whose segments are all plain.
        let header = t.header.unwrap_or(format::SegmentHeader {
            data_start: SEGMENT_HEADER_BYTES,
            compacted: None,
        });
        let file = Arc::new(ListedSegment {
            vfs: vfs.clone(),
            path: path.clone(),
            id,
            end: t.end,
            header,
            file: std::sync::OnceLock::new(),
        });
        // The key an open of the file finds (`read_header_and_key`): the start of a GC
        // segment's range, a plain one's first seq, or none for a segment without
        // records (which the checkpoint lists with first seq 0).
        let key = match (header.compacted, t.first_seq) {
            (Some((first, _)), _) => first,
            (None, 0) => u64::MAX,
            (None, seq) => seq,
        };
        out.push(OpenedSegment {
            id,
            path,
            name: format::segment_file_name(id),
            file,
            len: t.end,
            header: Ok(header),
            key,
        });
    }
    sort_opened(&mut out);
    Ok((out, max_id))
}

/// Open segment `id` (file `file_name` in `dir`) and read its header and first record.
fn open_segment(
    vfs: &dyn Vfs,
    dir: &Path,
    id: u64,
    file_name: &str,
    max: u32,
) -> Result<OpenedSegment, Error> {
    let path = dir.join(file_name);
    let file = vfs
        .open(&path, OpenMode::Read)
        .map_err(|e| Error::io(&path, "open", e))?;
    let len = file.len().map_err(|e| Error::io(&path, "len", e))?;
    // The header and the first record are read, not mapped: mapping and unmapping
    // every segment of a large log is most of what a reader's open spends on the
    // segments a checkpoint covers, and a first touch of a file mapping faults in a
    // whole folio around it, where a read copies the bytes asked for.
    let (header, key) =
        read_header_and_key(&*file, len, id, max).map_err(|e| Error::io(&path, "read_at", e))?;
    Ok(OpenedSegment {
        id,
        path,
        name: format::segment_file_name(id),
        file,
        len,
        header,
        key,
    })
}

fn sort_opened(out: &mut Vec<OpenedSegment>) {
    segment::sort_in_log_order(out, |s| {
        (
            s.id,
            matches!(&s.header, Ok(h) if h.compacted.is_some()),
            s.key,
        )
    });
}

/// A sealed segment a checkpoint lists, opened by the first read that reaches it: an
/// open over a checkpoint then costs the same whatever the number of segments before
/// its record. The first use opens the file and checks what the open took on the
/// checkpoint's word: a segment header naming this id, the one the checkpoint lists
/// (plain, or written by GC for the same seq range), and at least `end` bytes.
/// A file that fails the check is a [`SegmentDamage`] error (the engine reports it as
/// `Error::Corrupt`); a failed I/O call is returned as it is, a file removed since the
/// open (by the owner's GC) as `NotFound` saying so. Neither is remembered: only a
/// file that passed is kept, so the next use tries again.
#[derive(Debug)]
struct ListedSegment {
    vfs: Arc<dyn Vfs>,
    path: PathBuf,
    id: u64,
    end: u64,
    header: format::SegmentHeader,
    file: std::sync::OnceLock<Arc<dyn VfsFile>>,
}

impl ListedSegment {
    fn file(&self) -> std::io::Result<&Arc<dyn VfsFile>> {
        if let Some(f) = self.file.get() {
            return Ok(f);
        }
        let opened = self.open()?;
        Ok(self.file.get_or_init(|| opened))
    }

    fn open(&self) -> std::io::Result<Arc<dyn VfsFile>> {
        let damage = |offset: u64, problem: String| {
            std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                SegmentDamage { offset, problem },
            )
        };
        let file = self.vfs.open(&self.path, OpenMode::Read).map_err(|e| {
            if e.kind() != std::io::ErrorKind::NotFound {
                return e;
            }
            // The open took the segment from the directory listing; it is gone now.
            std::io::Error::new(
                std::io::ErrorKind::NotFound,
                "removed since the store was opened read-only (the owner's GC rewrote the \
                 log): reopen the store to read the log as it is now",
            )
        })?;
        let len = file.len()?;
        if len < self.end {
            return Err(damage(
                len,
                format!(
                    "{len} bytes, the checkpoint the store was opened from read {} of it",
                    self.end
                ),
            ));
        }
        // The header and, in a segment GC wrote, its extension.
        let head_bytes = SEGMENT_HEADER_BYTES + format::COMPACTED_EXT_BYTES;
        let mut head = vec![0u8; head_bytes.min(len) as usize];
        file.read_at(&mut head, 0)?;
        match format::check_header(&head, self.id) {
            Ok(h) if h == self.header => Ok(file),
            Ok(h) => Err(damage(
                0,
                format!(
                    "{}, where the checkpoint the store was opened from has {}",
                    describe(&h),
                    describe(&self.header)
                ),
            )),
            Err(format::HeaderProblem::Blank) => Err(damage(0, "blank segment header".into())),
            Err(format::HeaderProblem::FutureVersion(v)) => Err(damage(
                0,
                format!("segment format version {v}, newer than this build"),
            )),
            Err(format::HeaderProblem::WrongId(found)) => Err(damage(
                16,
                format!("header names segment id {found}, the file name {}", self.id),
            )),
            Err(format::HeaderProblem::Invalid(p)) => Err(damage(0, p)),
        }
    }
}

impl VfsFile for ListedSegment {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
        self.file()?.read_at(buf, offset)
    }
    fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
        Err(read_only())
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Err(read_only())
    }
    fn sync_all(&self) -> std::io::Result<()> {
        Err(read_only())
    }
    fn set_len(&self, _: u64) -> std::io::Result<()> {
        Err(read_only())
    }
    fn len(&self) -> std::io::Result<u64> {
        self.file()?.len()
    }
    fn map(&self) -> std::io::Result<Mapped> {
        self.file()?.map()
    }
}

/// A segment header in words, for a damage report.
fn describe(h: &format::SegmentHeader) -> String {
    match h.compacted {
        Some((first, last)) => format!("a segment GC wrote for seqs {first}..={last}"),
        None => "a plain segment".into(),
    }
}

fn read_only() -> std::io::Error {
    std::io::Error::new(
        std::io::ErrorKind::PermissionDenied,
        "a segment a read-only open took from a checkpoint is never written",
    )
}

/// What the first use of a [`ListedSegment`] found wrong with the file: the source of
/// an `io::Error` that [`Error::io`] turns into `Error::Corrupt` naming the segment.
#[derive(Debug, thiserror::Error)]
#[error("{problem}")]
pub(crate) struct SegmentDamage {
    pub offset: u64,
    pub problem: String,
}

impl OpenedSegment {
    /// A map of the whole file, for scanning its records.
    pub(crate) fn map(&self) -> Result<Mapped, Error> {
        self.file.map().map_err(|e| Error::io(&self.path, "map", e))
    }
}

/// Bytes a segment's open reads from its start in one `pread`: its header and, unless
/// it is larger, its first record (one read per segment where three were made: a large
/// log's reader opens every segment).
const SEGMENT_HEAD_READ_BYTES: u64 = 4096;

/// A segment's header check and its position in log order (`OpenedSegment::key`), from
/// the file's first bytes and first record, read with `pread` (`len`: the file's size).
fn read_header_and_key(
    file: &dyn VfsFile,
    len: u64,
    id: u64,
    max: u32,
) -> std::io::Result<(Result<format::SegmentHeader, format::HeaderProblem>, u64)> {
    const _: () =
        assert!(SEGMENT_HEAD_READ_BYTES >= SEGMENT_HEADER_BYTES + format::COMPACTED_EXT_BYTES);
    let mut head = vec![0u8; len.min(SEGMENT_HEAD_READ_BYTES) as usize];
    file.read_at(&mut head, 0)?;
    let header = format::check_header(&head, id);
    let h = match &header {
        Ok(h) => *h,
        Err(_) => return Ok((header, u64::MAX)),
    };
    if let Some((first, _)) = h.compacted {
        return Ok((header, first));
    }
    // A frame longer than the rest of the file is not read (nor allocated).
    let in_file = len.saturating_sub(h.data_start + FRAME_HEADER_BYTES);
    let cap = u32::try_from(in_file).unwrap_or(u32::MAX).min(max);
    let read;
    let frame = match segment::plausible_frame_in(&head, h.data_start, cap) {
        Some(found) => found,
        None => {
            read = segment::read_plausible_frame(file, h.data_start, cap)?;
            read.as_deref()
        }
    };
    let key = match frame {
        Some(frame) => match format::check_frame(frame, id, max) {
            format::FrameCheck::Valid { payload, .. } => {
                format::peek_seq(payload).unwrap_or(u64::MAX)
            }
            _ => u64::MAX,
        },
        None => u64::MAX,
    };
    Ok((header, key))
}

/// Segments not written by GC must appear in log order by ascending id (the writer only
/// ever creates higher ids); `Err` names the first one out of place.
pub(crate) fn check_plain_order(segs: &[OpenedSegment]) -> Result<(), Error> {
    let mut prev: Option<u64> = None;
    for s in segs {
        let compacted = matches!(&s.header, Ok(h) if h.compacted.is_some());
        if compacted {
            continue;
        }
        if let Some(p) = prev {
            if s.id < p {
                return Err(Error::corrupt(
                    &s.name,
                    SEGMENT_HEADER_BYTES,
                    format!(
                        "holds seqs after those of the later segment {}",
                        format::segment_file_name(p)
                    ),
                ));
            }
        }
        prev = Some(s.id);
    }
    Ok(())
}

/// The log's layout id: the largest id of a segment written by GC (0 if none). Every GC
/// writes a segment with a new, larger id, so the index records the layout it was built
/// from and is rebuilt when it differs.
pub(crate) fn layout_of<'a>(segs: impl IntoIterator<Item = &'a OpenedSegment>) -> u64 {
    segs.into_iter()
        .filter(|s| matches!(&s.header, Ok(h) if h.compacted.is_some()))
        .map(|s| s.id)
        .max()
        .unwrap_or(0)
}
