//! The raw peers: the disk's physical limit, no format at all. Every commit
//! is one 1 KiB `pwrite` ([`RAW_RECORD_BYTES`], the record's text cut or
//! zero-padded to that size), so their MB/s count 1 KiB per commit.
//!
//! - `raw` in `append-durable`: a preallocated file overwritten in place,
//!   `pwrite` + `fdatasync` per commit. The file is preallocated by writing
//!   zeros ([`PREALLOC_CHUNK`] at a time) and fsyncing before the timed part
//!   (not `fallocate`, whose unwritten extents would make the first
//!   overwrite of each block a metadata change). As the file's size and
//!   extents never change, `fdatasync` has no metadata to commit: the
//!   fastest durable single writer the disk allows. With N writers, each
//!   thread has its own file.
//! - `raw-append` in `append-durable`: the same loop appending to a growing
//!   file, so every `fdatasync` also commits the new file size, as any
//!   append-only log must.
//! - `raw` in `append-buffered`: sequential 1 KiB writes to a growing file,
//!   no sync.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::sync_dir;
use crate::data::Record;
use crate::error::{io_err, BenchError};
use crate::subject::{Durability, SessionSpec, SpoolSubject, SubjectStore};
use crate::workloads::Workload;

/// Bytes written per commit by the raw peers.
pub const RAW_RECORD_BYTES: usize = 1024;

/// Chunk size used to write the zeros of a preallocated file: the engine's, so the
/// loop's file is filled as spool's segments are. The page-cache folios a write
/// creates are as large as the write, and each later small `pwrite` and its
/// `fdatasync` walk the blocks of the folio they land in, so larger fill writes
/// make every later commit of the loop cost more CPU.
pub const PREALLOC_CHUNK: usize = spool_engine::ZERO_FILL_CHUNK_BYTES;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// Overwrite in place within a preallocated file of this many bytes.
    InPlace { capacity: u64 },
    /// Append to a growing file.
    Append,
}

/// A raw peer; see the module docs for the three configurations.
#[derive(Clone, Copy, Debug)]
pub struct RawPeer {
    name: &'static str,
    mode: Mode,
    workload: Workload,
}

impl RawPeer {
    /// `raw` for `append-durable`: each session file preallocated for
    /// `commits` records and overwritten in place.
    pub fn in_place(commits: usize) -> Self {
        RawPeer {
            name: "raw",
            mode: Mode::InPlace {
                capacity: (commits.max(1) * RAW_RECORD_BYTES) as u64,
            },
            workload: Workload::AppendDurable,
        }
    }

    /// `raw-append` for `append-durable`: appends to a growing file.
    pub fn appending() -> Self {
        RawPeer {
            name: "raw-append",
            mode: Mode::Append,
            workload: Workload::AppendDurable,
        }
    }

    /// `raw` for `append-buffered`: sequential writes, no sync.
    pub fn sequential_buffered() -> Self {
        RawPeer {
            name: "raw",
            mode: Mode::Append,
            workload: Workload::AppendBuffered,
        }
    }
}

impl SpoolSubject for RawPeer {
    fn name(&self) -> &str {
        self.name
    }

    fn supports(&self, workload: Workload) -> bool {
        workload == self.workload
    }

    fn open_store(
        &self,
        dir: &Path,
        durability: Durability,
        writers: usize,
    ) -> Result<Box<dyn SubjectStore>, BenchError> {
        Ok(Box::new(RawStore {
            name: self.name,
            mode: self.mode,
            durability,
            dir: dir.to_path_buf(),
            writers: (0..writers.max(1))
                .map(|_| Mutex::new(HashMap::new()))
                .collect(),
        }))
    }
}

struct RawFile {
    file: File,
    path: PathBuf,
    offset: u64,
    buf: Box<[u8; RAW_RECORD_BYTES]>,
}

/// An open raw store: one file per session.
pub struct RawStore {
    name: &'static str,
    mode: Mode,
    durability: Durability,
    dir: PathBuf,
    writers: Vec<Mutex<HashMap<u64, RawFile>>>,
}

impl RawStore {
    fn lock(
        &self,
        writer: usize,
    ) -> Result<std::sync::MutexGuard<'_, HashMap<u64, RawFile>>, BenchError> {
        self.writers
            .get(writer)
            .ok_or_else(|| BenchError::Subject {
                subject: self.name.into(),
                message: format!("writer {writer} out of range"),
            })?
            .lock()
            .map_err(|_| BenchError::Subject {
                subject: self.name.into(),
                message: "a writer's lock was poisoned by a panicking thread".into(),
            })
    }
}

impl SubjectStore for RawStore {
    fn subject(&self) -> &str {
        self.name
    }

    fn create_session(&self, writer: usize, session: &SessionSpec) -> Result<(), BenchError> {
        let path = self.dir.join(format!("{}.raw", session.id()));
        let io = |e| io_err(self.name, &path, e);
        let mut file = OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(&path)
            .map_err(io)?;
        if let Mode::InPlace { capacity } = self.mode {
            let zeros = vec![0u8; PREALLOC_CHUNK];
            let mut left = capacity;
            while left > 0 {
                let n = left.min(PREALLOC_CHUNK as u64) as usize;
                file.write_all(&zeros[..n]).map_err(io)?;
                left -= n as u64;
            }
        }
        file.sync_all().map_err(io)?;
        sync_dir(self.name, &self.dir)?;
        self.lock(writer)?.insert(
            session.key,
            RawFile {
                file,
                path: path.clone(),
                offset: 0,
                buf: Box::new([0u8; RAW_RECORD_BYTES]),
            },
        );
        Ok(())
    }

    fn append(
        &self,
        writer: usize,
        session: &SessionSpec,
        _seq: u64,
        record: &Record,
    ) -> Result<u64, BenchError> {
        let mut files = self.lock(writer)?;
        let f = files
            .get_mut(&session.key)
            .ok_or_else(|| BenchError::Subject {
                subject: self.name.into(),
                message: format!("session {} is not open on writer {writer}", session.id()),
            })?;
        let text = record.text.as_bytes();
        let n = text.len().min(RAW_RECORD_BYTES);
        f.buf[..n].copy_from_slice(&text[..n]);
        f.buf[n..].fill(0);
        if let Mode::InPlace { capacity } = self.mode {
            // Wrap around rather than grow: the file must never change size.
            if f.offset + RAW_RECORD_BYTES as u64 > capacity {
                f.offset = 0;
            }
        }
        f.file
            .write_all_at(&f.buf[..], f.offset)
            .map_err(|e| io_err(self.name, &f.path, e))?;
        if self.durability == Durability::Durable {
            f.file
                .sync_data()
                .map_err(|e| io_err(self.name, &f.path, e))?;
        }
        f.offset += RAW_RECORD_BYTES as u64;
        Ok(RAW_RECORD_BYTES as u64)
    }

    fn close(self: Box<Self>) -> Result<(), BenchError> {
        Ok(())
    }
}
