//! The real file system (std only; the memory map is the one `unsafe` call).

use super::{Mapped, OpenMode, Vfs, VfsFile, VfsLock};
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::Path;
use std::sync::Arc;

/// [`Vfs`] over the operating system's files.
#[derive(Debug, Default, Clone, Copy)]
pub struct OsVfs;

impl OsVfs {
    pub fn new() -> OsVfs {
        OsVfs
    }
}

#[derive(Debug)]
struct OsFile {
    file: File,
}

#[derive(Debug)]
struct OsLock {
    // Keeping the descriptor open keeps the flock; closing it releases the lock.
    _file: File,
}
impl VfsLock for OsLock {}

impl Vfs for OsVfs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        let mut o = OpenOptions::new();
        // Files the log creates are the owner's alone.
        o.mode(0o600);
        match mode {
            OpenMode::Read => o.read(true),
            OpenMode::ReadWrite => o.read(true).write(true),
            OpenMode::CreateNew => o.read(true).write(true).create_new(true),
        };
        Ok(Arc::new(OsFile {
            file: o.open(path)?,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        std::fs::remove_file(path)
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(dir)? {
            let entry = entry?;
            if let Ok(name) = entry.file_name().into_string() {
                names.push(name);
            }
        }
        Ok(names)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        // Directories the store creates are the owner's alone.
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        File::open(dir)?.sync_all()
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        path.try_exists()
    }

    fn lock(&self, path: &Path, create: bool) -> io::Result<Option<Box<dyn VfsLock>>> {
        let file = OpenOptions::new()
            .mode(0o600)
            .read(true)
            .write(true)
            .create(create)
            .truncate(false)
            .open(path)?;
        // std's exclusive, non-blocking file lock (flock(2) on Linux): it belongs to the
        // open file description, so a second open of the same file in this process
        // conflicts as well as one in another process.
        match file.try_lock() {
            Ok(()) => Ok(Some(Box::new(OsLock { _file: file }))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        }
    }
}

impl VfsFile for OsFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.file.read_exact_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }

    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn sync_all(&self) -> io::Result<()> {
        self.file.sync_all()
    }

    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }

    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }

    fn map(&self) -> io::Result<Mapped> {
        if self.file.metadata()?.len() == 0 {
            return Ok(Mapped::from_vec(Vec::new()));
        }
        // SAFETY: the engine maps only sealed segments, which it never writes again while
        // the store is open (segments are append-only and replaced only by rename), and
        // the saved key filter, which is written whole under another name and renamed,
        // never written in place; the owner lock keeps other spool writers out. Every length read from the map is
        // validated against the map's length before use, so a file changed behind our back
        // yields errors, not undefined reads beyond the mapping.
        let map = unsafe { memmap2::Mmap::map(&self.file)? };
        Ok(Mapped::from_mmap(map))
    }

    fn map_prefix(&self, len: u64) -> io::Result<Mapped> {
        if len == 0 {
            return Ok(Mapped::from_vec(Vec::new()));
        }
        if self.file.metadata()?.len() < len {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shorter than the prefix",
            ));
        }
        let n = usize::try_from(len).map_err(|_| io::Error::other("prefix longer than memory"))?;
        // SAFETY: the engine maps a prefix only of the active segment, and only below its
        // acknowledged end: the writer writes at and after that end, never before it, while
        // the store is open (segments are append-only; a torn tail is zeroed at open,
        // before any read), and the owner lock keeps other spool writers out. The map is
        // exactly `len` bytes long, so no slice of it covers the bytes still being
        // written (the kernel maps the last page whole, but nothing here reads past
        // `len`). Lengths read from the map are validated as for `map`.
        let map = unsafe { memmap2::MmapOptions::new().len(n).map(&self.file)? };
        Ok(Mapped::from_mmap(map))
    }
}
