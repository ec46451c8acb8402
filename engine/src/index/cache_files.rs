//! The cache of an index with a directory (snapshots and other values written outside
//! commits, [`Index::put_cache`]): a value of [`CACHE_FILE_BYTES_MIN`] or more is a file
//! of its own in `<index dir>/cache/`, a smaller one an entry of sled's `cache` tree.
//! sled kept the pages of large values — snapshots, each written once by a load and
//! read a few times — in memory far past its cache size: an owner that loaded the 10 k
//! sessions of a million-commit store grew by over 600 MiB (BENCHMARKS.md, Decisions).
//! A file's bytes live in the OS page cache, which the kernel reclaims. Small values
//! stay in sled: a file costs a create and a rename (an import writes a small settings
//! snapshot per session, and 10 k files made it seconds slower).
//!
//! A file is a cache entry, trusted only if whole: magic, key length u32, value length
//! u64, CRC-32 of key and value (all little-endian), then the key and the value
//! (docs/format.md, "Cache files"). It is written under a temporary name and renamed,
//! never fsynced: a crash may leave it damaged or empty, which reads as absent (and
//! removes it). Its name is the FNV-1a hash of its key, so that any key fits a file
//! name; the key inside tells the rare two keys of one hash apart (the later write
//! wins; the other reads as absent).

use super::{sled_err, KeyValue};
use crate::error::Error;
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// The directory of cache files inside the index directory.
pub(crate) const CACHE_DIR: &str = "cache";
/// What a clear renames the cache directory to (then `<pid>.<ns>.<n>`) before removing
/// it.
const TRASH_PREFIX: &str = "cache.trash.";
const MAGIC: [u8; 8] = *b"spoolce1";
const HEADER_BYTES: u64 = 8 + 4 + 8 + 4;
const SUFFIX: &str = ".entry";
const TMP_SUFFIX: &str = ".tmp";

/// Largest cache value written or read: a file whose header claims more is absent.
pub const CACHE_VALUE_BYTES_MAX: u64 = 1 << 30;
/// Largest cache key (namespace included).
const CACHE_KEY_BYTES_MAX: u32 = 64 << 10;
/// Smallest cache value kept in a file rather than in sled.
pub(crate) const CACHE_FILE_BYTES_MIN: usize = 16 << 10;

/// Whether `name`, in the index directory, is the cache directory or one a clear is
/// removing: many files of the cache's, which `verify`'s copy and the permission walk
/// skip.
pub(crate) fn is_cache_dir_name(name: &std::ffi::OsStr) -> bool {
    name.to_str()
        .is_some_and(|n| n == CACHE_DIR || n.starts_with(TRASH_PREFIX))
}

/// The cache of an index with a directory: sled's `cache` tree for small values,
/// [`CacheFiles`] for large ones. A key is in at most one of them after a write of it;
/// a read looks in sled first.
pub(super) struct DirCache {
    pub(super) tree: sled::Tree,
    pub(super) files: CacheFiles,
}

impl DirCache {
    pub(super) fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        if value.len() >= CACHE_FILE_BYTES_MIN {
            self.files.put(key, value)?;
            self.tree.remove(key).map_err(sled_err)?;
        } else {
            self.tree.insert(key, value).map_err(sled_err)?;
            self.files.remove(key)?;
        }
        Ok(())
    }

    pub(super) fn get_with<R>(
        &self,
        key: &[u8],
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, Error> {
        if let Some(v) = self.tree.get(key).map_err(sled_err)? {
            return Ok(Some(read(&v)));
        }
        let mut read = Some(read);
        let found = self.files.get_with(key, |v| read.take().map(|r| r(v)))?;
        if let Some(r) = found.flatten() {
            return Ok(Some(r));
        }
        // A small value written over a large one meanwhile goes to sled before the file
        // goes: look in sled again rather than miss both.
        match (self.tree.get(key).map_err(sled_err)?, read) {
            (Some(v), Some(read)) => Ok(Some(read(&v))),
            _ => Ok(None),
        }
    }

    pub(super) fn remove(&self, key: &[u8]) -> Result<(), Error> {
        self.tree.remove(key).map_err(sled_err)?;
        self.files.remove(key)
    }

    pub(super) fn clear(&self) -> Result<(), Error> {
        self.tree.clear().map_err(sled_err)?;
        self.files.clear()
    }

    /// How many keys start with `prefix`, in either place (a key in both counted once).
    pub(super) fn count(&self, prefix: &[u8]) -> Result<u64, Error> {
        let in_files = self.files.keys_with_prefix(prefix)?;
        let mut n = in_files.len() as u64;
        for kv in self.tree.scan_prefix(prefix) {
            let (k, _) = kv.map_err(sled_err)?;
            if in_files
                .binary_search_by(|(f, _)| f.as_slice().cmp(&k))
                .is_err()
            {
                n += 1;
            }
        }
        Ok(n)
    }

    /// The entries whose keys start with `prefix`, in key order, from both places.
    pub(super) fn scan(&self, prefix: &[u8]) -> Result<CacheScan, Error> {
        let keys = self.files.keys_with_prefix(prefix)?;
        Ok(CacheScan {
            sled: self.tree.scan_prefix(prefix).peekable(),
            files: self.files.scan(keys).peekable(),
            failed: false,
        })
    }
}

/// See [`DirCache::scan`]: sled's entries merged with the files', in key order.
pub(crate) struct CacheScan {
    sled: std::iter::Peekable<sled::Iter>,
    files: std::iter::Peekable<CacheFileScan>,
    failed: bool,
}

impl Iterator for CacheScan {
    type Item = Result<KeyValue, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        let peeked = super::sled_guard("scanning the cache", || Ok(self.sled.peek().is_some()));
        if let Err(e) = peeked {
            self.failed = true;
            return Some(Err(Error::Index(e)));
        }
        let order = match (self.sled.peek(), self.files.peek()) {
            (None, None) => return None,
            (Some(Err(_)), _) | (Some(Ok(_)), None) => std::cmp::Ordering::Less,
            (_, Some(Err(_))) | (None, Some(Ok(_))) => std::cmp::Ordering::Greater,
            (Some(Ok((a, _))), Some(Ok((b, _)))) => a.as_ref().cmp(b.as_slice()),
        };
        if order == std::cmp::Ordering::Equal {
            // Written small after it was written large: the file is stale.
            self.files.next();
        }
        match order {
            std::cmp::Ordering::Greater => self.files.next(),
            _ => match super::sled_guard("scanning the cache", || Ok(self.sled.next())) {
                Ok(next) => next.map(|kv| match kv {
                    Ok((k, v)) => Ok((k.to_vec(), v.to_vec())),
                    Err(e) => Err(sled_err(e)),
                }),
                // A panic inside sled ends the scan with it.
                Err(e) => {
                    self.failed = true;
                    Some(Err(Error::Index(e)))
                }
            },
        }
    }
}

/// The cache files of one index directory.
#[derive(Debug)]
pub(super) struct CacheFiles {
    dir: PathBuf,
}

/// Makes temporary names unique among the writers of one process (the index
/// directory has one owning process).
static NEXT_TMP: AtomicU64 = AtomicU64::new(0);

/// FNV-1a, 64 bits: a name that stays the same across builds and versions.
fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

impl CacheFiles {
    /// The cache directory of the index at `index_dir`, created if missing. The cache
    /// directory is not listed (it holds a file per cached snapshot): temporary files
    /// a crash left are never read as entries, a later put of the same name overwrites
    /// one, and the next clear removes them with the directory.
    pub(super) fn open(index_dir: &Path) -> Result<CacheFiles, Error> {
        let dir = index_dir.join(CACHE_DIR);
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| Error::io(&dir, "create_dir", e))?;
        let files = CacheFiles { dir };
        // What a clear that could not remove it left.
        if let Ok(rd) = std::fs::read_dir(index_dir) {
            for e in rd.flatten() {
                if e.file_name()
                    .to_str()
                    .is_some_and(|n| n.starts_with(TRASH_PREFIX))
                {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            }
        }
        Ok(files)
    }

    /// The names in the cache directory; none while a clear has it renamed away.
    fn names(&self) -> Result<Vec<String>, Error> {
        let rd = match std::fs::read_dir(&self.dir) {
            Ok(rd) => rd,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(Error::io(&self.dir, "read_dir", e)),
        };
        let mut out = Vec::new();
        for entry in rd {
            let entry = entry.map_err(|e| Error::io(&self.dir, "read_dir", e))?;
            if let Ok(name) = entry.file_name().into_string() {
                out.push(name);
            }
        }
        Ok(out)
    }

    fn path_of(&self, key: &[u8]) -> PathBuf {
        self.dir.join(format!("{:016x}{SUFFIX}", fnv1a(key)))
    }

    /// Writes `value` under `key` (replacing what was there). A value over
    /// [`CACHE_VALUE_BYTES_MAX`] is not written, and what the key held is removed.
    pub(super) fn put(&self, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let path = self.path_of(key);
        if value.len() as u64 > CACHE_VALUE_BYTES_MAX
            || key.len() as u64 > u64::from(CACHE_KEY_BYTES_MAX)
        {
            return self.remove(key);
        }
        let mut crc = crc32fast::Hasher::new();
        crc.update(key);
        crc.update(value);
        let mut header = Vec::with_capacity(HEADER_BYTES as usize);
        header.extend_from_slice(&MAGIC);
        header.extend_from_slice(&(key.len() as u32).to_le_bytes());
        header.extend_from_slice(&(value.len() as u64).to_le_bytes());
        header.extend_from_slice(&crc.finalize().to_le_bytes());
        let n = NEXT_TMP.fetch_add(1, Ordering::Relaxed);
        let tmp = self
            .dir
            .join(format!("{:016x}.{n}{TMP_SUFFIX}", fnv1a(key)));
        let write = || -> std::io::Result<()> {
            // Unique in this process; a file of that name can only be a crash's leftover.
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&header)?;
            f.write_all(key)?;
            f.write_all(value)?;
            std::fs::rename(&tmp, &path)
        };
        write().map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            Error::io(&path, "write", e)
        })
    }

    /// `read` of the value under `key`; `None` when there is none, or the file is
    /// damaged (then it is removed) or holds another key.
    pub(super) fn get_with<R>(
        &self,
        key: &[u8],
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, Error> {
        let path = self.path_of(key);
        Ok(read_entry(&path)?
            .filter(|(k, _)| k == key)
            .map(|(_, v)| read(&v)))
    }

    /// Removes the value under `key`, if any.
    pub(super) fn remove(&self, key: &[u8]) -> Result<(), Error> {
        let path = self.path_of(key);
        // Only this key's: a file of another key of the same hash stays.
        match read_key(&path)? {
            Some(k) if k != key => Ok(()),
            _ => match std::fs::remove_file(&path) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    Err(Error::io(&path, "remove", e))
                }
                _ => Ok(()),
            },
        }
    }

    /// Every key starting with `prefix` and the file holding it, in key order (each
    /// file's header read).
    pub(super) fn keys_with_prefix(&self, prefix: &[u8]) -> Result<Vec<(Vec<u8>, PathBuf)>, Error> {
        let mut keys = Vec::new();
        for name in self.names()? {
            if !name.ends_with(SUFFIX) {
                continue;
            }
            let path = self.dir.join(&name);
            if let Some(key) = read_key(&path)? {
                if key.starts_with(prefix) {
                    keys.push((key, path));
                }
            }
        }
        keys.sort();
        Ok(keys)
    }

    /// A scan of the entries `keys` lists (from [`CacheFiles::keys_with_prefix`]), each
    /// read when reached; one removed, replaced by another key's or damaged meanwhile
    /// is skipped.
    pub(super) fn scan(&self, keys: Vec<(Vec<u8>, PathBuf)>) -> CacheFileScan {
        CacheFileScan {
            keys: keys.into_iter(),
        }
    }

    /// Removes every entry (the index was cleared): the directory is renamed away,
    /// the rename made durable (a crash must not bring back entries of an index that
    /// was cleared), and the directory made again. An entry that cannot be removed
    /// must not fail the clear, which the index's rebuild waits on: the renamed
    /// directory is removed as far as it can be, and the rest by the next open.
    pub(super) fn clear(&self) -> Result<(), Error> {
        // Nothing to clear (a fresh index's).
        if std::fs::read_dir(&self.dir).is_ok_and(|mut rd| rd.next().is_none()) {
            return Ok(());
        }
        let parent = self.dir.parent().unwrap_or(Path::new("."));
        // Unique among processes too: a trash an earlier process could not remove may
        // still be there, and a rename onto it would fail (the pid alone repeats, in a
        // container every run is pid 1).
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let n = NEXT_TMP.fetch_add(1, Ordering::Relaxed);
        let trash = parent.join(format!("{TRASH_PREFIX}{}.{nanos}.{n}", std::process::id()));
        match std::fs::rename(&self.dir, &trash) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(Error::io(&self.dir, "rename", e));
            }
            _ => {}
        }
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(|e| Error::io(parent, "sync_dir", e))?;
        std::fs::DirBuilder::new()
            .mode(0o700)
            .create(&self.dir)
            .map_err(|e| Error::io(&self.dir, "create_dir", e))?;
        let _ = std::fs::remove_dir_all(&trash);
        Ok(())
    }
}

/// See [`CacheFiles::scan`].
pub(crate) struct CacheFileScan {
    keys: std::vec::IntoIter<(Vec<u8>, PathBuf)>,
}

impl Iterator for CacheFileScan {
    type Item = Result<KeyValue, Error>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let (key, path) = self.keys.next()?;
            match read_entry(&path) {
                Ok(Some((k, v))) if k == key => return Some(Ok((k, v))),
                Ok(_) => continue,
                Err(e) => return Some(Err(e)),
            }
        }
    }
}

/// What the file at `path` holds.
enum Opened {
    Absent,
    /// Not an entry: too short, another magic, lengths over the limits or not the
    /// file's size.
    Damaged,
    /// An entry's file, read up to its key, with its key length, value length and crc.
    Entry(std::fs::File, u32, u64, u32),
}

fn open_entry(path: &Path) -> Result<Opened, Error> {
    let mut f = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Opened::Absent),
        Err(e) => return Err(Error::io(path, "open", e)),
    };
    let len = f
        .metadata()
        .map_err(|e| Error::io(path, "metadata", e))?
        .len();
    let mut h = [0u8; HEADER_BYTES as usize];
    if len < HEADER_BYTES {
        return Ok(Opened::Damaged);
    }
    f.read_exact(&mut h)
        .map_err(|e| Error::io(path, "read", e))?;
    let key_len = u32::from_le_bytes([h[8], h[9], h[10], h[11]]);
    let value_len = u64::from_le_bytes([h[12], h[13], h[14], h[15], h[16], h[17], h[18], h[19]]);
    let crc = u32::from_le_bytes([h[20], h[21], h[22], h[23]]);
    if h[..8] != MAGIC
        || key_len > CACHE_KEY_BYTES_MAX
        || value_len > CACHE_VALUE_BYTES_MAX
        || len != HEADER_BYTES + u64::from(key_len) + value_len
    {
        return Ok(Opened::Damaged);
    }
    Ok(Opened::Entry(f, key_len, value_len, crc))
}

/// The key of the entry at `path`, its crc unchecked (whoever reads the value checks
/// it); `None` if the file is absent or not an entry.
fn read_key(path: &Path) -> Result<Option<Vec<u8>>, Error> {
    let Opened::Entry(mut f, key_len, _, _) = open_entry(path)? else {
        return Ok(None);
    };
    let mut key = vec![0u8; key_len as usize];
    f.read_exact(&mut key)
        .map_err(|e| Error::io(path, "read", e))?;
    Ok(Some(key))
}

/// The key and value of the entry at `path`; `None` if it is absent, or damaged (the
/// file is then removed: it is a cache entry, and a write of the key replaces it).
fn read_entry(path: &Path) -> Result<Option<KeyValue>, Error> {
    let (mut f, key_len, value_len, crc) = match open_entry(path)? {
        Opened::Absent => return Ok(None),
        Opened::Damaged => {
            let _ = std::fs::remove_file(path);
            return Ok(None);
        }
        Opened::Entry(f, k, v, c) => (f, k, v, c),
    };
    // Both lengths are within their limits, and the file's size is what they add up to.
    let mut key = vec![0u8; key_len as usize];
    let mut value = vec![0u8; value_len as usize];
    f.read_exact(&mut key)
        .map_err(|e| Error::io(path, "read", e))?;
    f.read_exact(&mut value)
        .map_err(|e| Error::io(path, "read", e))?;
    let mut h = crc32fast::Hasher::new();
    h.update(&key);
    h.update(&value);
    if h.finalize() != crc {
        let _ = std::fs::remove_file(path);
        return Ok(None);
    }
    Ok(Some((key, value)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(files: &CacheFiles, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        let keys = files.keys_with_prefix(prefix).unwrap();
        files.scan(keys).map(Result::unwrap).collect()
    }

    #[test]
    fn entries_are_written_read_replaced_scanned_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let files = CacheFiles::open(dir.path()).unwrap();
        assert_eq!(files.get_with(b"a1", <[u8]>::to_vec).unwrap(), None);
        files.put(b"a1", b"one").unwrap();
        files.put(b"a2", &[]).unwrap();
        files.put(b"b1", &vec![7u8; 100_000]).unwrap();
        files.put(b"a1", b"uno").unwrap();
        assert_eq!(
            files.get_with(b"a1", <[u8]>::to_vec).unwrap(),
            Some(b"uno".to_vec())
        );
        assert_eq!(files.get_with(b"a2", <[u8]>::len).unwrap(), Some(0));
        assert_eq!(files.get_with(b"b1", <[u8]>::len).unwrap(), Some(100_000));
        assert_eq!(
            entries(&files, b"a"),
            vec![
                (b"a1".to_vec(), b"uno".to_vec()),
                (b"a2".to_vec(), Vec::new())
            ]
        );
        files.remove(b"a1").unwrap();
        files.remove(b"never written").unwrap();
        assert_eq!(files.get_with(b"a1", <[u8]>::to_vec).unwrap(), None);
        assert_eq!(entries(&files, b"").len(), 2);
        files.clear().unwrap();
        assert!(entries(&files, b"").is_empty());
        // What a crash left under a temporary name is no entry, is overwritten by a put
        // of that name, and goes with the next clear.
        files.put(b"kept", b"v").unwrap();
        let n = NEXT_TMP.load(Ordering::Relaxed);
        let leftover = |n: u64| {
            let name = format!("{:016x}.{n}{TMP_SUFFIX}", fnv1a(b"next"));
            files.dir.join(name)
        };
        for k in n..n + 64 {
            std::fs::write(leftover(k), b"half").unwrap();
        }
        let files = CacheFiles::open(dir.path()).unwrap();
        assert_eq!(
            entries(&files, b""),
            vec![(b"kept".to_vec(), b"v".to_vec())]
        );
        files.put(b"next", &[9; 100]).unwrap();
        assert_eq!(files.get_with(b"next", <[u8]>::len).unwrap(), Some(100));
        files.clear().unwrap();
        assert!(files.names().unwrap().is_empty());
    }

    /// Every cut of an entry's file, and every flipped bit, reads as absent (and the
    /// file is then gone), never as another value and never with a panic.
    #[test]
    fn a_damaged_or_cut_file_reads_as_absent() {
        let dir = tempfile::tempdir().unwrap();
        let files = CacheFiles::open(dir.path()).unwrap();
        files.put(b"key", b"the value").unwrap();
        let path = files.path_of(b"key");
        let whole = std::fs::read(&path).unwrap();
        let mut cases: Vec<Vec<u8>> = (0..whole.len()).map(|n| whole[..n].to_vec()).collect();
        for bit in 0..whole.len() * 8 {
            let mut b = whole.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            cases.push(b);
        }
        for (i, bytes) in cases.iter().enumerate() {
            std::fs::write(&path, bytes).unwrap();
            let got = files.get_with(b"key", <[u8]>::to_vec).unwrap();
            // A flip in the key's bytes names another key: absent for this one, kept.
            assert_eq!(got, None, "case {i}");
            let left = std::fs::read(&path).ok();
            assert!(
                left.is_none() || left.as_deref() == Some(bytes.as_slice()),
                "case {i}"
            );
        }
        std::fs::write(&path, &whole).unwrap();
        assert_eq!(
            files.get_with(b"key", <[u8]>::to_vec).unwrap(),
            Some(b"the value".to_vec())
        );
    }

    /// A value goes to sled or to a file by its size; a key written in both sizes in
    /// turn reads as its last write, and a scan lists each key once, in order.
    #[test]
    fn small_values_live_in_sled_and_large_ones_in_files() {
        let dir = tempfile::tempdir().unwrap();
        let db = sled::Config::new().temporary(true).open().unwrap();
        let cache = DirCache {
            tree: db.open_tree("cache").unwrap(),
            files: CacheFiles::open(dir.path()).unwrap(),
        };
        let large = vec![1u8; CACHE_FILE_BYTES_MIN];
        let small = vec![2u8; CACHE_FILE_BYTES_MIN - 1];
        let get = |k: &[u8]| cache.get_with(k, <[u8]>::to_vec).unwrap();
        cache.put(b"k1", &large).unwrap();
        cache.put(b"k2", &small).unwrap();
        assert!(cache.tree.get(b"k1").unwrap().is_none());
        assert!(cache.files.path_of(b"k1").exists());
        assert!(cache.tree.get(b"k2").unwrap().is_some());
        assert!(!cache.files.path_of(b"k2").exists());
        assert_eq!(get(b"k1"), Some(large.clone()));
        assert_eq!(get(b"k2"), Some(small.clone()));
        // Each key written in the other size.
        cache.put(b"k1", &small).unwrap();
        cache.put(b"k2", &large).unwrap();
        assert_eq!(get(b"k1"), Some(small.clone()));
        assert_eq!(get(b"k2"), Some(large.clone()));
        assert!(!cache.files.path_of(b"k1").exists());
        assert!(cache.tree.get(b"k2").unwrap().is_none());
        cache.put(b"k3", &small).unwrap();
        let scanned: Vec<KeyValue> = cache.scan(b"k").unwrap().map(Result::unwrap).collect();
        assert_eq!(
            scanned,
            vec![
                (b"k1".to_vec(), small.clone()),
                (b"k2".to_vec(), large.clone()),
                (b"k3".to_vec(), small.clone()),
            ]
        );
        assert_eq!(cache.count(b"k").unwrap(), 3);
        // A stale file under a key sled holds (a crash between the two writes) is
        // shadowed, in reads, scans and counts.
        cache.files.put(b"k3", &large).unwrap();
        assert_eq!(get(b"k3"), Some(small.clone()));
        assert_eq!(cache.scan(b"k3").unwrap().count(), 1);
        assert_eq!(cache.count(b"k").unwrap(), 3);
        cache.remove(b"k3").unwrap();
        assert_eq!(get(b"k3"), None);
        cache.clear().unwrap();
        assert_eq!(cache.scan(b"").unwrap().count(), 0);
    }

    /// A trash directory that an earlier process could not remove fails no later clear,
    /// whatever its name, and the next open removes it.
    #[test]
    fn a_trash_left_by_an_earlier_process_fails_no_clear() {
        let dir = tempfile::tempdir().unwrap();
        let pid = std::process::id();
        // Names an earlier process of this pid would have used for the next clears.
        let next = NEXT_TMP.load(Ordering::Relaxed);
        let stale: Vec<PathBuf> = (next..next + 64)
            .map(|n| dir.path().join(format!("{TRASH_PREFIX}{pid}.{n}")))
            .chain([dir.path().join(format!("{TRASH_PREFIX}1.0"))])
            .collect();
        for t in &stale {
            std::fs::create_dir_all(t.join("d")).unwrap();
        }
        // Opened before the stale trash appeared: nothing removed it yet.
        let files = CacheFiles {
            dir: dir.path().join(CACHE_DIR),
        };
        std::fs::create_dir_all(&files.dir).unwrap();
        for round in 0..3 {
            files.put(b"k", &[round; 10]).unwrap();
            files.clear().unwrap();
            assert_eq!(files.get_with(b"k", <[u8]>::len).unwrap(), None);
        }
        assert!(stale.iter().all(|t| t.exists()));
        CacheFiles::open(dir.path()).unwrap();
        assert!(stale.iter().all(|t| !t.exists()));
    }

    /// Between a clear's rename and the new directory, a count or scan on another
    /// thread sees an empty cache, never an error.
    #[test]
    fn a_count_beside_clears_never_fails() {
        let dir = tempfile::tempdir().unwrap();
        let files = std::sync::Arc::new(CacheFiles::open(dir.path()).unwrap());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let clearer = {
            let (files, stop) = (files.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = files.put(b"k", &[1; 10]);
                    files.clear().unwrap();
                }
            })
        };
        for _ in 0..5_000 {
            files.keys_with_prefix(b"").unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        clearer.join().unwrap();
    }

    /// A header that claims more than the limits allows nothing to be allocated for it.
    #[test]
    fn a_header_claiming_a_huge_value_reads_as_absent() {
        let dir = tempfile::tempdir().unwrap();
        let files = CacheFiles::open(dir.path()).unwrap();
        let path = files.path_of(b"k");
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&1u32.to_le_bytes());
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes());
        b.push(b'k');
        std::fs::write(&path, &b).unwrap();
        assert_eq!(files.get_with(b"k", <[u8]>::len).unwrap(), None);
        assert!(files.keys_with_prefix(b"").unwrap().is_empty());
    }

    /// Two keys of one file name: the file holds the last one written, and neither
    /// reads nor removes the other's.
    #[test]
    fn a_file_of_another_key_is_neither_read_nor_removed() {
        let dir = tempfile::tempdir().unwrap();
        let files = CacheFiles::open(dir.path()).unwrap();
        files.put(b"first", b"1").unwrap();
        // As if "second" hashed to the name of "first".
        std::fs::rename(files.path_of(b"first"), files.path_of(b"second")).unwrap();
        assert_eq!(files.get_with(b"second", <[u8]>::to_vec).unwrap(), None);
        files.remove(b"second").unwrap();
        assert!(files.path_of(b"second").exists());
        assert_eq!(
            entries(&files, b""),
            vec![(b"first".to_vec(), b"1".to_vec())]
        );
    }
}
