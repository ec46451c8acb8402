#![allow(dead_code)]

use spool_engine::vfs::{self, Vfs};
use spool_engine::*;
use std::path::Path;
use std::sync::Arc;

pub fn ev(payload: &[u8]) -> Vec<EventData> {
    vec![EventData::new("test", payload.to_vec())]
}

pub fn commit(stream: &str, expected: ExpectedVersion, payload: &[u8]) -> NewCommit {
    NewCommit::new(stream, expected, ev(payload))
}

/// Appends `events` to `stream` at its current version (a fence that holds for a
/// single writer).
pub fn append_next(s: &Store, stream: &str, events: Vec<EventData>) -> AppendOutcome {
    let v = s.stream_version(stream).unwrap().unwrap_or(0);
    s.append(NewCommit::new(stream, ExpectedVersion::Exact(v), events))
        .unwrap()
}

pub fn small_opts() -> Options {
    Options::default().segment_bytes_max(4096)
}

pub fn committed(o: AppendOutcome) -> CommitInfo {
    match o {
        AppendOutcome::Committed(i) => i,
        other => panic!("expected Committed, got {other:?}"),
    }
}

/// Every commit in the log, in order, as (stream, version, payload of the first event).
pub fn log_contents(store: &Store) -> Vec<(String, u64, Vec<u8>)> {
    store
        .scan(1)
        .unwrap()
        .map(|r| {
            let r = r.unwrap();
            (
                r.info.stream.clone(),
                r.info.version,
                r.events[0].payload.clone(),
            )
        })
        .collect()
}

pub fn seg_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "seg"))
        .collect();
    v.sort();
    v
}

/// Default options but with 64 KiB segments: every segment is preallocated, and tests
/// that copy or rewrite segment files should not move 64 MiB each time.
pub fn test_opts() -> Options {
    // Inline: the tests that count file operations see them at fixed points.
    Options::default()
        .segment_bytes_max(64 * 1024)
        .next_segment(spool_engine::NextSegment::Inline)
}

/// The OS file system with every `open` going through a hook, which may fail,
/// panic, or wrap the file it opens (with [`os_open`]).
pub struct OpenHook<F>(pub F);

/// What [`OpenHook`]'s hook calls to open a file for real.
pub fn os_open(path: &Path, mode: vfs::OpenMode) -> std::io::Result<Arc<dyn vfs::VfsFile>> {
    vfs::OsVfs::new().open(path, mode)
}

impl<F> std::fmt::Debug for OpenHook<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("OpenHook")
    }
}

impl<F> vfs::Vfs for OpenHook<F>
where
    F: Fn(&Path, vfs::OpenMode) -> std::io::Result<Arc<dyn vfs::VfsFile>> + Send + Sync,
{
    fn open(&self, path: &Path, mode: vfs::OpenMode) -> std::io::Result<Arc<dyn vfs::VfsFile>> {
        (self.0)(path, mode)
    }
    fn rename(&self, from: &Path, to: &Path) -> std::io::Result<()> {
        vfs::OsVfs::new().rename(from, to)
    }
    fn remove(&self, path: &Path) -> std::io::Result<()> {
        vfs::OsVfs::new().remove(path)
    }
    fn read_dir(&self, dir: &Path) -> std::io::Result<Vec<String>> {
        vfs::OsVfs::new().read_dir(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> std::io::Result<()> {
        vfs::OsVfs::new().create_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> std::io::Result<()> {
        vfs::OsVfs::new().sync_dir(dir)
    }
    fn exists(&self, path: &Path) -> std::io::Result<bool> {
        vfs::OsVfs::new().exists(path)
    }
    fn lock(&self, path: &Path, create: bool) -> std::io::Result<Option<Box<dyn vfs::VfsLock>>> {
        vfs::OsVfs::new().lock(path, create)
    }
}

/// Opens the sled database at `path` as a test inspects or damages it. A store
/// that just closed may still hold sled's lock for a moment (sled's own threads
/// drop it last), as the engine's own opens allow for: retried on that error
/// alone, for up to five seconds.
pub fn open_sled(path: &Path) -> sled::Db {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        match sled::open(path) {
            Ok(db) => return db,
            Err(sled::Error::Io(e))
                if e.to_string().contains("could not acquire lock")
                    && std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            Err(e) => panic!("opening {}: {e}", path.display()),
        }
    }
}
