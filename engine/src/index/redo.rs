//! The redo log of the index's moves into sled: `DIR/index/moves.redo`.
//!
//! A move writes a full memtable into sled key by key, in key order. That
//! costs sled less than one `apply_batch` of the same writes (see
//! BENCHMARKS.md, Decisions; a batch holds sled's log reservation open and builds a hash map of
//! copies of every write), but it is not atomic: sled recovers a prefix of
//! its own log after a crash, and a prefix that ends inside a move leaves
//! some keys with the move's values and others with the values before it.
//! No catch-up from the engine's log repairs that (indexers read the values
//! they change), so every move is written here first:
//!
//! 1. the move's writes are appended to this file as one record (no fsync);
//! 2. `MOVING` (`\x00meta:moving`) is inserted into sled, naming the record
//!    (its body's length and CRC-32);
//! 3. the writes go into sled one by one, in key order;
//! 4. `MOVING` is removed from sled.
//!
//! Whatever prefix of sled's log survives a crash, a `MOVING` key in it
//! means the move it names was cut short, and every earlier move is whole.
//! On open, that record's writes are applied again (each sets a key to its
//! final value, so applying them twice is harmless), `MOVING` is removed and
//! sled is flushed; only then is the file emptied. An open that finds no
//! `MOVING` key but records (a kill between whole moves, whose sled pages
//! may still be in the page cache only) flushes sled before emptying the
//! file too. A record that cannot be found (a power loss that kept some of
//! sled's pages but not this file's, which is never fsynced) leaves the
//! index unusable as it is, and the store rebuilds it from the log.
//!
//! The file is emptied whenever sled has been flushed (every record then
//! describes a move sled holds whole), and sled is flushed early when the
//! file passes [`REDO_FILE_BYTES_MAX`]. Under a steady stream of writes a
//! record is emptied about a second after it is written, where the kernel
//! (by default) writes a dirty page back once it is 30 s old or the dirty
//! pages pass their threshold: how many of its pages reach the disk was not
//! measured.
//!
//! The record layout is in docs/format.md, "The redo log of moves into
//! sled". A reader checks every length against the bytes left before using it, so
//! hostile bytes fail the read with the file and the offset named, and an
//! open holds no more than one record's body (at most
//! [`REDO_RECORD_BYTES_MAX`] and never more than the file) while it
//! applies it in place.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use crate::error::IndexError;
use crate::index::memtable::Value;

/// Name of the redo log in the index directory.
pub(crate) const REDO_FILE: &str = "moves.redo";

/// The redo log's size past which a move flushes sled (and so empties the
/// file) at once instead of waiting for the flush interval.
pub(crate) const REDO_FILE_BYTES_MAX: u64 = 64 << 20;

/// Largest record body a reader accepts (a move holds one memtable: about
/// `MEM_BYTES_MAX` plus one group's writes; a larger length is damage).
pub(crate) const REDO_RECORD_BYTES_MAX: u64 = 1 << 30;

const RECORD_FORMAT: u8 = 1;
const RECORD_HEADER_BYTES: u64 = 8;
const KIND_REMOVE: u8 = 0;
const KIND_INSERT: u8 = 1;

/// The value of sled's `MOVING` key for a record body.
pub(crate) fn marker(body: &[u8]) -> [u8; 12] {
    let mut m = [0u8; 12];
    m[..8].copy_from_slice(&(body.len() as u64).to_le_bytes());
    m[8..].copy_from_slice(&crc32(body).to_le_bytes());
    m
}

fn crc32(b: &[u8]) -> u32 {
    crc32fast::hash(b)
}

/// The body of a record holding `writes` (sorted by key by the caller); an error if
/// it would pass [`REDO_RECORD_BYTES_MAX`] (which also keeps every length and the
/// count within a u32).
pub(crate) fn encode_body(writes: &[(&[u8], &Value)]) -> Result<Vec<u8>, IndexError> {
    let bytes: usize = writes
        .iter()
        .map(|(k, v)| 5 + k.len() + v.as_ref().map_or(0, |v| 4 + v.len()))
        .sum::<usize>()
        + 5;
    if bytes as u64 > REDO_RECORD_BYTES_MAX {
        return Err(IndexError::MoveTooLarge {
            writes: writes.len() as u64,
            bytes: bytes as u64,
            max: REDO_RECORD_BYTES_MAX,
        });
    }
    let mut b = Vec::with_capacity(bytes);
    b.push(RECORD_FORMAT);
    b.extend_from_slice(&(writes.len() as u32).to_le_bytes());
    for (k, v) in writes {
        match v {
            Some(v) => {
                b.push(KIND_INSERT);
                b.extend_from_slice(&(k.len() as u32).to_le_bytes());
                b.extend_from_slice(k);
                b.extend_from_slice(&(v.len() as u32).to_le_bytes());
                b.extend_from_slice(v);
            }
            None => {
                b.push(KIND_REMOVE);
                b.extend_from_slice(&(k.len() as u32).to_le_bytes());
                b.extend_from_slice(k);
            }
        }
    }
    debug_assert_eq!(b.len(), bytes);
    Ok(b)
}

/// One write of a record: a key and its new value (`None`: removed).
pub(crate) type RedoWrite = (Vec<u8>, Value);

/// Calls `f` with each write of a record body, in order, borrowing the key
/// and the value from the body (nothing is allocated per write, so a body
/// of many tiny writes costs no more memory than its bytes). `Err` names
/// what is wrong and where in the body (an offset from its start); the
/// writes before it have been handed to `f` by then.
pub(crate) fn for_each_write(
    b: &[u8],
    mut f: impl FnMut(&[u8], Option<&[u8]>),
) -> Result<(), (u64, String)> {
    let mut at = 0usize;
    let take = |at: &mut usize, n: usize| -> Result<&[u8], (u64, String)> {
        let end = at.checked_add(n).filter(|&e| e <= b.len()).ok_or_else(|| {
            (
                *at as u64,
                format!("{n} bytes needed, {} left", b.len() - *at),
            )
        })?;
        let s = &b[*at..end];
        *at = end;
        Ok(s)
    };
    let u32_at = |at: &mut usize| -> Result<u32, (u64, String)> {
        let s = take(at, 4)?;
        Ok(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
    };
    let format = take(&mut at, 1)?[0];
    if format != RECORD_FORMAT {
        return Err((0, format!("unknown record format {format}")));
    }
    let count = u32_at(&mut at)?;
    // Every write takes at least 5 bytes: a count the body cannot hold is
    // refused before any write is read.
    if u64::from(count) * 5 > (b.len() - at) as u64 {
        return Err((1, format!("{count} writes cannot fit in {} bytes", b.len())));
    }
    for _ in 0..count {
        let start = at as u64;
        let kind = take(&mut at, 1)?[0];
        let klen = u32_at(&mut at)? as usize;
        let key = take(&mut at, klen)?;
        let value = match kind {
            KIND_INSERT => {
                let vlen = u32_at(&mut at)? as usize;
                Some(take(&mut at, vlen)?)
            }
            KIND_REMOVE => None,
            other => return Err((start, format!("unknown write kind {other}"))),
        };
        f(key, value);
    }
    if at != b.len() {
        return Err((
            at as u64,
            format!("{} bytes after the last write", b.len() - at),
        ));
    }
    Ok(())
}

/// The writes of a record body, copied out (tests and the fuzz target; an
/// open applies them in place with [`for_each_write`]).
pub(crate) fn decode_body(b: &[u8]) -> Result<Vec<RedoWrite>, (u64, String)> {
    let mut out = Vec::new();
    for_each_write(b, |k, v| out.push((k.to_vec(), v.map(<[u8]>::to_vec))))?;
    Ok(out)
}

/// The redo log file of one index directory.
pub(crate) struct RedoLog {
    path: PathBuf,
    file: File,
    /// Bytes appended since the file was last emptied.
    bytes: u64,
}

impl RedoLog {
    /// Open (or create) the redo log of the index directory `dir`.
    pub(crate) fn open(dir: &Path) -> Result<RedoLog, IndexError> {
        let path = dir.join(REDO_FILE);
        let file = OpenOptions::new()
            .read(true)
            .append(true)
            .create(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| IndexError::redo(&path, "open", 0, e))?;
        let bytes = file
            .metadata()
            .map_err(|e| IndexError::redo(&path, "stat", 0, e))?
            .len();
        Ok(RedoLog { path, file, bytes })
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the file holds nothing (as far as this handle knows: what it
    /// found on open, plus what it appended since).
    pub(crate) fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Append one record holding `body`; whether the file has passed
    /// [`REDO_FILE_BYTES_MAX`].
    pub(crate) fn append(&mut self, body: &[u8]) -> Result<bool, IndexError> {
        let mut header = [0u8; RECORD_HEADER_BYTES as usize];
        header[..4].copy_from_slice(&(body.len() as u32).to_le_bytes());
        header[4..].copy_from_slice(&crc32(body).to_le_bytes());
        let at = self.bytes;
        (|| {
            self.file.write_all(&header)?;
            self.file.write_all(body)
        })()
        .map_err(|e| IndexError::redo(&self.path, "write", at, e))?;
        self.bytes += RECORD_HEADER_BYTES + body.len() as u64;
        Ok(self.bytes > REDO_FILE_BYTES_MAX)
    }

    /// Empty the file (sled holds every move it describes durably).
    pub(crate) fn clear(&mut self) -> Result<(), IndexError> {
        if self.bytes == 0 {
            return Ok(());
        }
        self.file
            .set_len(0)
            .map_err(|e| IndexError::redo(&self.path, "truncate", 0, e))?;
        self.bytes = 0;
        Ok(())
    }

    /// The body of the record that sled's `MOVING` value `marker` names:
    /// `Ok(None)` if the file holds no such record (or no whole one).
    pub(crate) fn find(&mut self, marker: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        if marker.len() != 12 {
            return Err(IndexError::Malformed(format!(
                "the index's move marker has {} bytes, not 12",
                marker.len()
            )));
        }
        let want_len = u64::from_le_bytes(marker[..8].try_into().unwrap_or([0; 8]));
        let want_crc = u32::from_le_bytes(marker[8..].try_into().unwrap_or([0; 4]));
        let file_len = self
            .file
            .metadata()
            .map_err(|e| IndexError::redo(&self.path, "stat", 0, e))?
            .len();
        let mut at = 0u64;
        while at + RECORD_HEADER_BYTES <= file_len {
            let mut header = [0u8; RECORD_HEADER_BYTES as usize];
            self.read_at(at, &mut header)?;
            let len = u64::from(u32::from_le_bytes([
                header[0], header[1], header[2], header[3],
            ]));
            let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
            let body_at = at + RECORD_HEADER_BYTES;
            if len > REDO_RECORD_BYTES_MAX || body_at + len > file_len {
                // A torn last record (a crash while appending it): its move never
                // started, so it cannot be the one named.
                return Ok(None);
            }
            if len == want_len && crc == want_crc {
                // The length was checked against the file: no allocation past it.
                let mut body = vec![0u8; len as usize];
                self.read_at(body_at, &mut body)?;
                if crc32(&body) != want_crc {
                    return Err(IndexError::Malformed(format!(
                        "{} at offset {at}: the record fails its checksum",
                        self.path.display()
                    )));
                }
                return Ok(Some(body));
            }
            at = body_at + len;
        }
        Ok(None)
    }

    fn read_at(&mut self, at: u64, buf: &mut [u8]) -> Result<(), IndexError> {
        self.file
            .seek(SeekFrom::Start(at))
            .and_then(|_| self.file.read_exact(buf))
            .map_err(|e| IndexError::redo(&self.path, "read", at, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn writes_strategy() -> impl Strategy<Value = Vec<RedoWrite>> {
        proptest::collection::vec(
            (
                proptest::collection::vec(any::<u8>(), 0..40),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..300)),
            ),
            0..40,
        )
    }

    proptest! {
        #[test]
        fn a_body_decodes_to_its_writes(writes in writes_strategy()) {
            let refs: Vec<(&[u8], &Value)> = writes.iter().map(|(k, v)| (k.as_slice(), v)).collect();
            let body = encode_body(&refs).unwrap();
            prop_assert_eq!(decode_body(&body).unwrap(), writes);
        }

        #[test]
        fn hostile_bodies_fail_without_panicking(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            if let Ok(w) = decode_body(&b) {
                // What decodes re-encodes to the same bytes: one encoding per record.
                let refs: Vec<(&[u8], &Value)> = w.iter().map(|(k, v)| (k.as_slice(), v)).collect();
                prop_assert_eq!(encode_body(&refs).unwrap(), b);
            }
        }
    }

    #[test]
    fn a_count_larger_than_the_body_is_refused_before_allocating() {
        let mut b = vec![RECORD_FORMAT];
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        let (at, what) = decode_body(&b).unwrap_err();
        assert_eq!(at, 1, "{what}");
    }

    #[test]
    fn the_named_record_is_found_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RedoLog::open(dir.path()).unwrap();
        let a_val: Value = Some(b"1".to_vec());
        let b_val: Value = None;
        let first = encode_body(&[(b"a", &a_val)]).unwrap();
        let second = encode_body(&[(b"b", &b_val)]).unwrap();
        log.append(&first).unwrap();
        log.append(&second).unwrap();
        assert_eq!(log.find(&marker(&second)).unwrap(), Some(second.clone()));
        assert_eq!(log.find(&marker(&first)).unwrap(), Some(first.clone()));
        let other = encode_body(&[]).unwrap();
        assert_eq!(log.find(&marker(&other)).unwrap(), None);
        // Reopened, the file still holds both; emptied, neither.
        drop(log);
        let mut log = RedoLog::open(dir.path()).unwrap();
        assert_eq!(log.find(&marker(&second)).unwrap(), Some(second.clone()));
        log.clear().unwrap();
        assert_eq!(log.find(&marker(&second)).unwrap(), None);
        assert_eq!(std::fs::metadata(log.path()).unwrap().len(), 0);
    }

    #[test]
    fn a_torn_last_record_is_not_found_and_a_damaged_one_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = RedoLog::open(dir.path()).unwrap();
        let v: Value = Some(vec![7; 100]);
        let body = encode_body(&[(b"key", &v)]).unwrap();
        log.append(&body).unwrap();
        let path = log.path().to_path_buf();
        drop(log);
        let full = std::fs::read(&path).unwrap();
        // Torn: the record's tail never reached the file.
        std::fs::write(&path, &full[..full.len() - 10]).unwrap();
        let mut log = RedoLog::open(dir.path()).unwrap();
        assert_eq!(log.find(&marker(&body)).unwrap(), None);
        drop(log);
        // Damaged: a byte of the body flipped under a whole header.
        let mut bad = full.clone();
        let last = bad.len() - 1;
        bad[last] ^= 0xff;
        std::fs::write(&path, &bad).unwrap();
        let mut log = RedoLog::open(dir.path()).unwrap();
        let e = log.find(&marker(&body)).unwrap_err().to_string();
        assert!(e.contains("moves.redo at offset 0"), "{e}");
    }
}
