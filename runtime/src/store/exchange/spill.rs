//! The commits an import's check pass encoded, kept for its write pass in an
//! unnamed temporary file, so that the source is parsed once: the check pass
//! parses, folds and encodes every commit (it must encode them to know each
//! fits the store's record limit), and the write pass appends what it wrote
//! here instead of parsing and encoding the source again.
//!
//! A commit is one frame, little-endian (the file lives as long as the
//! import, in no other process): `body_bytes u32 | crc32(body) u32 | body`,
//! the body `session u32 | version u64 | timestamp_ms i64 | commit_id [16] |
//! events u32`, then per event `kind_bytes u16 | kind | payload_bytes u32 |
//! payload`. `session` is the session's ordinal in the source. The reader
//! trusts nothing it reads: a frame longer than the longest one written, a
//! checksum that does not match or a body that does not parse is an error.
//!
//! The file takes about the size of the log the import writes (on the
//! store's file system when it can hold one), and memory holds one frame
//! plus a buffer of [`BUFFER_BYTES`] each way.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Seek, Write};
use std::path::{Path, PathBuf};

use spool_engine::{EventData, Uuid};

/// Buffer of the writer and of the reader.
const BUFFER_BYTES: usize = 256 << 10;
/// Bytes of a frame's length and checksum.
const FRAME_HEAD_BYTES: usize = 8;

/// One commit as the check pass encoded it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spilled {
    /// The session's ordinal in the source (from 0).
    pub(crate) session: u32,
    pub(crate) version: u64,
    pub(crate) timestamp_ms: i64,
    pub(crate) commit_id: Uuid,
    pub(crate) events: Vec<EventData>,
}

/// Writes the check pass's commits; [`SpillWriter::finish`] turns it into
/// their reader.
pub(crate) struct SpillWriter {
    /// Where the file goes (the system's temporary directory when this one
    /// refuses it).
    dir: PathBuf,
    /// Made at the first commit: a source that fails before it needs none.
    out: Option<BufWriter<File>>,
    body: Vec<u8>,
    /// The longest body written: the reader's bound.
    body_bytes_max: u32,
    commits: u64,
}

impl SpillWriter {
    /// A writer into an unnamed temporary file in `dir`, or in the system's
    /// temporary directory when `dir` refuses one, made at the first commit.
    pub(crate) fn new(dir: &Path) -> SpillWriter {
        SpillWriter {
            dir: dir.to_path_buf(),
            out: None,
            body: Vec::new(),
            body_bytes_max: 0,
            commits: 0,
        }
    }

    /// Appends one commit.
    pub(crate) fn push(
        &mut self,
        session: u32,
        version: u64,
        timestamp_ms: i64,
        commit_id: Uuid,
        events: &[EventData],
    ) -> io::Result<()> {
        let b = &mut self.body;
        b.clear();
        b.extend_from_slice(&session.to_le_bytes());
        b.extend_from_slice(&version.to_le_bytes());
        b.extend_from_slice(&timestamp_ms.to_le_bytes());
        b.extend_from_slice(commit_id.as_bytes());
        b.extend_from_slice(&len_u32(events.len())?.to_le_bytes());
        for e in events {
            let kind = u16::try_from(e.kind.len()).map_err(|_| too_long("an event kind"))?;
            b.extend_from_slice(&kind.to_le_bytes());
            b.extend_from_slice(e.kind.as_bytes());
            b.extend_from_slice(&len_u32(e.payload.len())?.to_le_bytes());
            b.extend_from_slice(&e.payload);
        }
        let body_bytes = len_u32(b.len())?;
        let out = match &mut self.out {
            Some(out) => out,
            None => {
                let file = tempfile::tempfile_in(&self.dir).or_else(|_| tempfile::tempfile())?;
                self.out
                    .insert(BufWriter::with_capacity(BUFFER_BYTES, file))
            }
        };
        out.write_all(&body_bytes.to_le_bytes())?;
        out.write_all(&crc32fast::hash(b).to_le_bytes())?;
        out.write_all(b)?;
        self.body_bytes_max = self.body_bytes_max.max(body_bytes);
        self.commits += 1;
        Ok(())
    }

    /// The commits written, to be read back from the first (the last of
    /// them written out first: an error here is a failed write).
    pub(crate) fn finish(self) -> io::Result<SpillReader> {
        let input = match self.out {
            None => None,
            Some(out) => {
                let mut file = out.into_inner().map_err(|e| e.into_error())?;
                file.rewind()?;
                Some(BufReader::with_capacity(BUFFER_BYTES, file))
            }
        };
        Ok(SpillReader {
            input,
            body: Vec::new(),
            body_bytes_max: self.body_bytes_max,
            left: self.commits,
            offset: 0,
        })
    }
}

fn len_u32(n: usize) -> io::Result<u32> {
    u32::try_from(n).map_err(|_| too_long("a commit"))
}

fn too_long(what: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("{what} is too long for the import's temporary file"),
    )
}

/// Reads back what a [`SpillWriter`] wrote, in order.
pub(crate) struct SpillReader {
    /// `None` when no commit was written.
    input: Option<BufReader<File>>,
    body: Vec<u8>,
    body_bytes_max: u32,
    /// Commits written and not yet read.
    left: u64,
    /// Where the next frame starts (for errors).
    offset: u64,
}

impl SpillReader {
    /// The next commit, `None` after the last one written.
    pub(crate) fn next_commit(&mut self) -> io::Result<Option<Spilled>> {
        let Some(input) = self.input.as_mut().filter(|_| self.left > 0) else {
            return Ok(None);
        };
        let mut head = [0u8; FRAME_HEAD_BYTES];
        let at = self.offset;
        let read_failed = |e: io::Error| {
            io::Error::new(
                e.kind(),
                format!("reading the import's temporary file at offset {at}: {e}"),
            )
        };
        input.read_exact(&mut head).map_err(read_failed)?;
        let (len, crc) = (le_u32(&head[..4]), le_u32(&head[4..]));
        if len > self.body_bytes_max {
            return Err(self.damaged(format!(
                "a frame of {len} bytes, longer than any written ({})",
                self.body_bytes_max
            )));
        }
        self.body.resize(len as usize, 0);
        input.read_exact(&mut self.body).map_err(read_failed)?;
        if crc32fast::hash(&self.body) != crc {
            return Err(self.damaged("a checksum mismatch".into()));
        }
        let spilled = parse_body(&self.body).ok_or_else(|| self.damaged("a bad body".into()))?;
        self.left -= 1;
        self.offset += (FRAME_HEAD_BYTES as u64) + u64::from(len);
        Ok(Some(spilled))
    }

    fn damaged(&self, what: String) -> io::Error {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "the import's temporary file is damaged at offset {}: {what}",
                self.offset
            ),
        )
    }
}

fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

/// Reads a body; `None` when it does not parse to its last byte.
fn parse_body(b: &[u8]) -> Option<Spilled> {
    let mut r = Cursor { b };
    let session = u32::from_le_bytes(r.take_array()?);
    let version = u64::from_le_bytes(r.take_array()?);
    let timestamp_ms = i64::from_le_bytes(r.take_array()?);
    let commit_id = Uuid::from_bytes(r.take_array()?);
    let n = u32::from_le_bytes(r.take_array()?);
    // Each event takes at least six bytes: a count beyond what is left is
    // refused before anything is allocated for it.
    if u64::from(n) * 6 > r.b.len() as u64 {
        return None;
    }
    let mut events = Vec::with_capacity(n as usize);
    for _ in 0..n {
        let kind_bytes = u16::from_le_bytes(r.take_array()?);
        let kind = std::str::from_utf8(r.take(kind_bytes as usize)?).ok()?;
        let payload_bytes = u32::from_le_bytes(r.take_array()?);
        let payload = r.take(payload_bytes as usize)?;
        events.push(EventData::new(kind, payload));
    }
    r.b.is_empty().then_some(Spilled {
        session,
        version,
        timestamp_ms,
        commit_id,
        events,
    })
}

/// Bytes read from the front of a body.
struct Cursor<'a> {
    b: &'a [u8],
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Some(head)
    }

    fn take_array<const N: usize>(&mut self) -> Option<[u8; N]> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(N)?);
        Some(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn commit(i: u64, events: usize) -> Spilled {
        Spilled {
            session: (i / 3) as u32,
            version: i % 3 + 1,
            timestamp_ms: -(i as i64) * 1_000,
            commit_id: Uuid::from_u128(u128::from(i) * 0x9E37_79B9_7F4A_7C15 + 1),
            events: (0..events)
                .map(|k| {
                    EventData::new(
                        format!("session.kind{k}"),
                        vec![k as u8; k * 37 + i as usize],
                    )
                })
                .collect(),
        }
    }

    fn write(commits: &[Spilled]) -> SpillWriter {
        let mut w = SpillWriter::new(&std::env::temp_dir());
        for c in commits {
            w.push(c.session, c.version, c.timestamp_ms, c.commit_id, &c.events)
                .unwrap();
        }
        w
    }

    fn file(r: &SpillReader) -> &File {
        r.input.as_ref().unwrap().get_ref()
    }

    fn file_mut(r: &mut SpillReader) -> &mut File {
        r.input.as_mut().unwrap().get_mut()
    }

    fn read_all(r: &mut SpillReader) -> io::Result<Vec<Spilled>> {
        let mut out = Vec::new();
        while let Some(c) = r.next_commit()? {
            out.push(c);
        }
        Ok(out)
    }

    /// Every commit comes back as written, in order, then `None` (also for
    /// none written, and for commits larger than the buffers).
    #[test]
    fn commits_come_back_as_written() {
        for (n, events) in [(0u64, 0usize), (1, 1), (300, 4), (3, 3_000)] {
            let commits: Vec<Spilled> = (0..n).map(|i| commit(i, events)).collect();
            let mut r = write(&commits).finish().unwrap();
            assert_eq!(
                read_all(&mut r).unwrap(),
                commits,
                "{n} commits of {events}"
            );
            assert_eq!(r.next_commit().unwrap(), None);
        }
    }

    /// A damaged byte anywhere in the file is an error naming the file and
    /// an offset, never a commit other than the one written and never a
    /// panic; a file cut short is an error too.
    #[test]
    fn damage_is_an_error() {
        let commits: Vec<Spilled> = (0..4).map(|i| commit(i, 2)).collect();
        let len = {
            let r = write(&commits).finish().unwrap();
            file(&r).metadata().unwrap().len()
        };
        for at in 0..len {
            let mut r = write(&commits).finish().unwrap();
            let file = file_mut(&mut r);
            let mut byte = [0u8; 1];
            std::os::unix::fs::FileExt::read_at(file, &mut byte, at).unwrap();
            std::os::unix::fs::FileExt::write_at(file, &[byte[0] ^ 0x10], at).unwrap();
            let got = read_all(&mut r);
            match got {
                Err(e) => {
                    let text = e.to_string();
                    assert!(
                        text.contains("temporary file") && text.contains("offset"),
                        "byte {at}: {text}"
                    );
                }
                Ok(back) => panic!("byte {at} flipped, read back {} commits", back.len()),
            }
        }
        let mut r = write(&commits).finish().unwrap();
        file_mut(&mut r).set_len(len - 1).unwrap();
        let e = read_all(&mut r).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
        assert!(e.to_string().contains("at offset"), "{e}");
    }

    /// A frame length beyond the longest frame written is refused before
    /// anything is allocated for it (a flipped high bit would otherwise ask
    /// for gigabytes), and a body with bytes after its last event is refused.
    #[test]
    fn a_length_beyond_any_written_and_trailing_bytes_are_refused() {
        let commits: Vec<Spilled> = (0..2).map(|i| commit(i, 1)).collect();
        let mut r = write(&commits).finish().unwrap();
        let longest = r.body_bytes_max;
        std::os::unix::fs::FileExt::write_at(file(&r), &(longest + 1).to_le_bytes(), 0).unwrap();
        let e = r.next_commit().unwrap_err();
        assert!(e.to_string().contains("longer than any written"), "{e}");
        assert!(r.body.capacity() < longest as usize + 1);
        let mut body = Vec::new();
        let c = commit(7, 1);
        let mut w = write(std::slice::from_ref(&c));
        std::mem::swap(&mut body, &mut w.body);
        assert_eq!(parse_body(&body), Some(c));
        body.push(0);
        assert_eq!(parse_body(&body), None);
    }

    /// No commit, no file: the reader ends at once.
    #[test]
    fn no_commit_makes_no_file() {
        let w = SpillWriter::new(Path::new("/nonexistent/for/sure"));
        assert!(w.out.is_none());
        let mut r = w.finish().unwrap();
        assert_eq!(r.next_commit().unwrap(), None);
    }

    /// A body whose event count claims more than it holds is refused before
    /// anything is allocated for it.
    #[test]
    fn a_count_beyond_the_body_is_refused() {
        // session, version, time, commit id, then the event count.
        let mut body = vec![0u8; 4 + 8 + 8 + 16 + 4];
        body[36..40].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(parse_body(&body), None);
        assert_eq!(parse_body(&body[..10]), None);
    }
}
