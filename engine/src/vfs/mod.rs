//! The I/O seam: every file operation of the log goes through [`Vfs`] and [`VfsFile`].
//!
//! Three implementations ship:
//! - [`OsVfs`]: the real file system (pread/pwrite, fdatasync, mmap, `File::try_lock`).
//! - [`FaultVfs`]: wraps another `Vfs` and fails the Nth call of a chosen kind, once or
//!   persistently, counting every call so tests can enumerate each call site.
//! - [`SimVfs`]: an in-memory file system that keeps a live and a durable image of every
//!   file and can simulate a crash that keeps only synced bytes plus part of the rest.
//!
//! sled's own files do not go through this seam: the index is a rebuildable cache.

mod fault;
mod os;
mod sim;

use std::fmt;
use std::io;
use std::ops::Deref;
use std::path::Path;
use std::sync::Arc;

pub use fault::{FaultKind, FaultVfs};
pub use os::OsVfs;
pub use sim::SimVfs;

/// How [`Vfs::open`] opens a file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// Existing file, read only.
    Read,
    /// Existing file, read and write.
    ReadWrite,
    /// Create a new file (fails if it exists), read and write.
    CreateNew,
}

/// A file system as the log sees it.
pub trait Vfs: Send + Sync + fmt::Debug {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>>;
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    fn remove(&self, path: &Path) -> io::Result<()>;
    /// File names (not paths) of the entries directly in `dir`.
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Make the directory's entries (creations, renames, removals) durable.
    fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    fn exists(&self, path: &Path) -> io::Result<bool>;
    /// Take an exclusive, non-blocking lock on `path`. `Ok(None)` when someone else holds
    /// it. With `create == false` a missing file is `ErrorKind::NotFound`. The lock is
    /// released when the returned guard is dropped.
    fn lock(&self, path: &Path, create: bool) -> io::Result<Option<Box<dyn VfsLock>>>;
}

/// An open file. Offsets are absolute; there is no cursor.
pub trait VfsFile: Send + Sync + fmt::Debug {
    /// Fill `buf` from `offset`; a short file is `ErrorKind::UnexpectedEof`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Write all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// fdatasync.
    fn sync_data(&self) -> io::Result<()>;
    /// fsync (data and metadata).
    fn sync_all(&self) -> io::Result<()>;
    /// Truncate or extend (with zeros).
    fn set_len(&self, len: u64) -> io::Result<()>;
    fn len(&self) -> io::Result<u64>;
    fn is_empty(&self) -> io::Result<bool> {
        Ok(self.len()? == 0)
    }
    /// The whole file as bytes: a real memory map for [`OsVfs`], a copy elsewhere.
    fn map(&self) -> io::Result<Mapped>;
    /// The file's first `len` bytes, exactly that many, as [`VfsFile::map`] gives them: for
    /// a file whose first `len` bytes never change while bytes after them are still
    /// written (the active segment below its acknowledged end). Fails when the file is
    /// shorter than `len`.
    fn map_prefix(&self, len: u64) -> io::Result<Mapped> {
        let all = self.map()?;
        let n = usize::try_from(len).map_err(|_| io::Error::other("prefix longer than memory"))?;
        let prefix = all.get(..n).ok_or_else(|| {
            io::Error::new(io::ErrorKind::UnexpectedEof, "file shorter than the prefix")
        })?;
        Ok(Mapped::from_vec(prefix.to_vec()))
    }
}

/// A held lock; dropping it releases the lock.
pub trait VfsLock: Send + Sync + fmt::Debug {}

/// Bytes of a mapped file.
pub struct Mapped(MappedInner);

enum MappedInner {
    Mmap(memmap2::Mmap),
    Owned(Vec<u8>),
}

impl Mapped {
    pub fn from_mmap(map: memmap2::Mmap) -> Mapped {
        Mapped(MappedInner::Mmap(map))
    }
    pub fn from_vec(bytes: Vec<u8>) -> Mapped {
        Mapped(MappedInner::Owned(bytes))
    }
}

impl Deref for Mapped {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            MappedInner::Mmap(m) => m,
            MappedInner::Owned(v) => v,
        }
    }
}

impl fmt::Debug for Mapped {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Mapped({} bytes)", self.len())
    }
}
