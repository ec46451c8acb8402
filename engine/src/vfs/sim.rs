//! An in-memory file system with a crash model.
//!
//! Every file has a live image (what reads see) and a durable image (what survives a
//! crash): `sync_data`/`sync_all` copy live to durable. Directory entries (creations,
//! renames, removals) become durable on `sync_dir` of their parent directory.
//!
//! A crash keeps the durable images plus, chosen by a seed, an in-order prefix of each
//! file's unsynced writes, the last kept write possibly torn (only a prefix of its bytes
//! lands, and the bytes after the torn point may be garbage). Unsynced directory changes
//! are kept or dropped per entry by the seed. Writes land in order within a file: a later
//! unsynced write never survives without the earlier ones (this is the model the log's
//! torn-tail rule is designed for; see ARCHITECTURE.md).
//!
//! After a crash every handle from before it (files, locks and the `SimVfs` value itself)
//! fails with an error; [`SimVfs::after_crash`] gives a handle onto the crashed image.

use super::{Mapped, OpenMode, Vfs, VfsFile, VfsLock};
use std::collections::{HashMap, HashSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

#[derive(Debug, Clone)]
enum PendingOp {
    Write { offset: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Default, Clone)]
struct Inode {
    live: Vec<u8>,
    durable: Vec<u8>,
    pending: Vec<PendingOp>,
}

#[derive(Debug, Default)]
struct SimState {
    generation: u64,
    next_inode: u64,
    inodes: HashMap<u64, Inode>,
    /// Live directory entries: path -> inode.
    entries: HashMap<PathBuf, u64>,
    /// Durable directory entries.
    durable_entries: HashMap<PathBuf, u64>,
    dirs: HashSet<PathBuf>,
    locks: HashSet<PathBuf>,
    syncs: u64,
    crash_at_sync: Option<(u64, u64)>,
    crashes: u64,
}

/// In-memory [`Vfs`] with a crash model; see the module docs.
#[derive(Debug, Clone)]
pub struct SimVfs {
    state: Arc<Mutex<SimState>>,
    generation: u64,
}

impl Default for SimVfs {
    fn default() -> Self {
        SimVfs::new()
    }
}

fn dead() -> io::Error {
    io::Error::other("simulated crash: this handle predates the crash")
}

/// splitmix64: small, deterministic, good enough to drive a crash model.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}

fn apply(buf: &mut Vec<u8>, op: &PendingOp) {
    match op {
        PendingOp::Write { offset, data } => {
            let start = *offset as usize;
            let end = start + data.len();
            if buf.len() < end {
                buf.resize(end, 0);
            }
            buf[start..end].copy_from_slice(data);
        }
        PendingOp::SetLen(len) => buf.resize(*len as usize, 0),
    }
}

impl SimVfs {
    pub fn new() -> SimVfs {
        SimVfs {
            state: Arc::new(Mutex::new(SimState::default())),
            generation: 0,
        }
    }

    fn lock_state(&self) -> io::Result<MutexGuard<'_, SimState>> {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        if st.generation != self.generation {
            return Err(dead());
        }
        Ok(st)
    }

    /// A handle onto the current (possibly crashed) image.
    pub fn after_crash(&self) -> SimVfs {
        let st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        SimVfs {
            state: self.state.clone(),
            generation: st.generation,
        }
    }

    /// Number of sync calls (`sync_data`, `sync_all`, `sync_dir`) so far.
    pub fn sync_count(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).syncs
    }

    /// Number of crashes so far.
    pub fn crash_count(&self) -> u64 {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).crashes
    }

    /// Crash (with `seed`) when the `n`th sync call from now is made, instead of syncing;
    /// that call fails.
    pub fn crash_at_sync(&self, n: u64, seed: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        st.syncs = 0;
        st.crash_at_sync = Some((n, seed));
    }

    /// Crash now; see the module docs for what survives.
    pub fn crash(&self, seed: u64) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        crash_state(&mut st, seed);
    }

    /// Crash now keeping only what was synced: no unsynced write or entry survives.
    pub fn crash_synced_only(&self) {
        let mut st = self.state.lock().unwrap_or_else(|e| e.into_inner());
        for node in st.inodes.values_mut() {
            node.pending.clear();
            node.live = node.durable.clone();
        }
        st.entries = st.durable_entries.clone();
        crash_state(&mut st, 0);
    }

    /// The live bytes of a file (for tests that inspect or damage files).
    pub fn read_file(&self, path: &Path) -> io::Result<Vec<u8>> {
        let st = self.lock_state()?;
        let ino = st.entries.get(path).ok_or_else(not_found)?;
        Ok(st
            .inodes
            .get(ino)
            .map(|i| i.live.clone())
            .unwrap_or_default())
    }

    /// Replace a file's bytes, live and durable (for tests that damage files).
    pub fn write_file_durable(&self, path: &Path, bytes: Vec<u8>) -> io::Result<()> {
        let mut st = self.lock_state()?;
        let ino = *st.entries.get(path).ok_or_else(not_found)?;
        if let Some(i) = st.inodes.get_mut(&ino) {
            i.live = bytes.clone();
            i.durable = bytes;
            i.pending.clear();
        }
        Ok(())
    }

    /// Count a sync; crash instead when planned. `Err` when it crashed.
    fn sync_point(st: &mut SimState) -> io::Result<()> {
        st.syncs += 1;
        if let Some((n, seed)) = st.crash_at_sync {
            if st.syncs == n {
                st.crash_at_sync = None;
                crash_state(st, seed);
                return Err(io::Error::other("simulated crash at sync"));
            }
        }
        Ok(())
    }
}

fn not_found() -> io::Error {
    io::Error::new(io::ErrorKind::NotFound, "no such file")
}

fn crash_state(st: &mut SimState, seed: u64) {
    let mut rng = Rng(seed ^ 0x5EED_0FC4_A5A5);
    st.generation += 1;
    st.crashes += 1;
    st.locks.clear();
    st.crash_at_sync = None;
    // Directory entries: durable ones stay; each unsynced change lands or not.
    let mut entries = st.durable_entries.clone();
    let mut live: Vec<(PathBuf, u64)> = st.entries.iter().map(|(p, i)| (p.clone(), *i)).collect();
    live.sort();
    for (p, ino) in live {
        if entries.get(&p) != Some(&ino) && rng.below(2) == 0 {
            entries.insert(p, ino);
        }
    }
    let mut durable: Vec<PathBuf> = st.durable_entries.keys().cloned().collect();
    durable.sort();
    for p in durable {
        if !st.entries.contains_key(&p) && rng.below(2) == 0 {
            entries.remove(&p);
        }
    }
    // File contents: durable image plus an in-order prefix of the pending operations.
    let mut inos: Vec<u64> = st.inodes.keys().copied().collect();
    inos.sort_unstable();
    for ino in inos {
        let Some(node) = st.inodes.get_mut(&ino) else {
            continue;
        };
        let mut img = node.durable.clone();
        let keep = rng.below(node.pending.len() as u64 + 1) as usize;
        for op in node.pending.iter().take(keep) {
            apply(&mut img, op);
        }
        // The next operation may be torn: a prefix of its bytes, then maybe garbage.
        if let Some(PendingOp::Write { offset, data }) = node.pending.get(keep) {
            if !data.is_empty() && rng.below(2) == 0 {
                let cut = rng.below(data.len() as u64) as usize;
                let mut torn = data[..cut].to_vec();
                if rng.below(2) == 0 {
                    let garbage = rng.below((data.len() - cut) as u64 + 1) as usize;
                    for _ in 0..garbage {
                        torn.push(rng.next() as u8);
                    }
                }
                apply(
                    &mut img,
                    &PendingOp::Write {
                        offset: *offset,
                        data: torn,
                    },
                );
            }
        }
        node.live = img.clone();
        node.durable = img;
        node.pending.clear();
    }
    st.entries = entries.clone();
    st.durable_entries = entries;
    let referenced: HashSet<u64> = st.entries.values().copied().collect();
    st.inodes.retain(|ino, _| referenced.contains(ino));
}

#[derive(Debug)]
struct SimFile {
    vfs: SimVfs,
    ino: u64,
    writable: bool,
}

#[derive(Debug)]
struct SimLock {
    vfs: SimVfs,
    path: PathBuf,
}
impl VfsLock for SimLock {}
impl Drop for SimLock {
    fn drop(&mut self) {
        if let Ok(mut st) = self.vfs.lock_state() {
            st.locks.remove(&self.path);
        }
    }
}

fn parent_exists(st: &SimState, path: &Path) -> bool {
    match path.parent() {
        None => true,
        Some(p) if p.as_os_str().is_empty() => true,
        Some(p) => st.dirs.contains(p),
    }
}

impl Vfs for SimVfs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        let mut st = self.lock_state()?;
        let ino = match (mode, st.entries.get(path).copied()) {
            (OpenMode::CreateNew, Some(_)) => {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "file exists"))
            }
            (OpenMode::CreateNew, None) => {
                if !parent_exists(&st, path) {
                    return Err(not_found());
                }
                st.next_inode += 1;
                let ino = st.next_inode;
                st.inodes.insert(ino, Inode::default());
                st.entries.insert(path.to_path_buf(), ino);
                ino
            }
            (_, Some(ino)) => ino,
            (_, None) => return Err(not_found()),
        };
        Ok(Arc::new(SimFile {
            vfs: self.clone(),
            ino,
            writable: mode != OpenMode::Read,
        }))
    }

    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        let mut st = self.lock_state()?;
        let ino = st.entries.remove(from).ok_or_else(not_found)?;
        st.entries.insert(to.to_path_buf(), ino);
        Ok(())
    }

    fn remove(&self, path: &Path) -> io::Result<()> {
        let mut st = self.lock_state()?;
        st.entries.remove(path).ok_or_else(not_found)?;
        Ok(())
    }

    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.lock_state()?;
        if !st.dirs.contains(dir) {
            return Err(not_found());
        }
        let mut names: Vec<String> = st
            .entries
            .keys()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| p.file_name()?.to_str().map(str::to_string))
            .collect();
        for d in &st.dirs {
            if d.parent() == Some(dir) {
                if let Some(n) = d.file_name().and_then(|n| n.to_str()) {
                    names.push(n.to_string());
                }
            }
        }
        names.sort();
        Ok(names)
    }

    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.lock_state()?;
        // Directories are durable at once: the crash model is about files and entries.
        for a in dir.ancestors() {
            if !a.as_os_str().is_empty() {
                st.dirs.insert(a.to_path_buf());
            }
        }
        Ok(())
    }

    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.lock_state()?;
        SimVfs::sync_point(&mut st)?;
        let live: Vec<(PathBuf, u64)> = st
            .entries
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .map(|(p, i)| (p.clone(), *i))
            .collect();
        st.durable_entries.retain(|p, _| p.parent() != Some(dir));
        st.durable_entries.extend(live);
        Ok(())
    }

    fn exists(&self, path: &Path) -> io::Result<bool> {
        let st = self.lock_state()?;
        Ok(st.entries.contains_key(path) || st.dirs.contains(path))
    }

    fn lock(&self, path: &Path, create: bool) -> io::Result<Option<Box<dyn VfsLock>>> {
        let mut st = self.lock_state()?;
        if !st.entries.contains_key(path) {
            if !create {
                return Err(not_found());
            }
            if !parent_exists(&st, path) {
                return Err(not_found());
            }
            st.next_inode += 1;
            let ino = st.next_inode;
            st.inodes.insert(ino, Inode::default());
            st.entries.insert(path.to_path_buf(), ino);
        }
        if !st.locks.insert(path.to_path_buf()) {
            return Ok(None);
        }
        Ok(Some(Box::new(SimLock {
            vfs: self.clone(),
            path: path.to_path_buf(),
        })))
    }
}

impl SimFile {
    fn with<R>(&self, f: impl FnOnce(&mut SimState, u64) -> io::Result<R>) -> io::Result<R> {
        let mut st = self.vfs.lock_state()?;
        if !st.inodes.contains_key(&self.ino) {
            return Err(not_found());
        }
        f(&mut st, self.ino)
    }
    fn check_writable(&self) -> io::Result<()> {
        if self.writable {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "opened read-only",
            ))
        }
    }
    fn mutate(&self, op: PendingOp) -> io::Result<()> {
        self.check_writable()?;
        self.with(|st, ino| {
            let node = st.inodes.get_mut(&ino).ok_or_else(not_found)?;
            apply(&mut node.live, &op);
            node.pending.push(op);
            Ok(())
        })
    }
    fn sync(&self) -> io::Result<()> {
        self.with(|st, ino| {
            SimVfs::sync_point(st)?;
            let node = st.inodes.get_mut(&ino).ok_or_else(not_found)?;
            node.durable = node.live.clone();
            node.pending.clear();
            Ok(())
        })
    }
}

impl VfsFile for SimFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.with(|st, ino| {
            let node = st.inodes.get(&ino).ok_or_else(not_found)?;
            let start = usize::try_from(offset).map_err(|_| eof())?;
            let end = start.checked_add(buf.len()).ok_or_else(eof)?;
            let src = node.live.get(start..end).ok_or_else(eof)?;
            buf.copy_from_slice(src);
            Ok(())
        })
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.mutate(PendingOp::Write {
            offset,
            data: buf.to_vec(),
        })
    }
    fn sync_data(&self) -> io::Result<()> {
        self.sync()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.sync()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.mutate(PendingOp::SetLen(len))
    }
    fn len(&self) -> io::Result<u64> {
        self.with(|st, ino| Ok(st.inodes.get(&ino).map_or(0, |n| n.live.len() as u64)))
    }
    fn map(&self) -> io::Result<Mapped> {
        self.with(|st, ino| {
            Ok(Mapped::from_vec(
                st.inodes
                    .get(&ino)
                    .map(|n| n.live.clone())
                    .unwrap_or_default(),
            ))
        })
    }
    fn map_prefix(&self, len: u64) -> io::Result<Mapped> {
        self.with(|st, ino| {
            let live = st.inodes.get(&ino).map_or(&[][..], |n| &n.live[..]);
            let prefix = usize::try_from(len)
                .ok()
                .and_then(|n| live.get(..n))
                .ok_or_else(|| {
                    io::Error::new(io::ErrorKind::UnexpectedEof, "file shorter than the prefix")
                })?;
            Ok(Mapped::from_vec(prefix.to_vec()))
        })
    }
}

fn eof() -> io::Error {
    io::Error::new(io::ErrorKind::UnexpectedEof, "read past end of file")
}
