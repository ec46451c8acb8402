//! The JSON file store: one `{id}.json` per session in a directory.
//!
//! # Layout
//!
//! Each file is one JSON object written in a fixed two-line layout:
//!
//! ```text
//! {"format":1,"header":{...AgentSessionInfo...},
//! "definition":{...},"state":{...}}
//! ```
//!
//! Compact JSON never contains a raw newline, so the first line holds the
//! whole header. Header reads (`header`, `list_headers`, and the version
//! check inside `save`) read only that first line — at most
//! [`MAX_HEADER_LINE`] bytes — so listing N sessions costs N file opens
//! and N small reads, independent of transcript sizes, and never counts
//! as a full load. A file edited into another layout (pretty-printed, say)
//! is still accepted: the header read then falls back to parsing the whole
//! file, skipping the state without building it.
//!
//! # Crash safety and concurrency
//!
//! - The directory is created with mode 0700, files with 0600.
//! - `create`, `save` and `delete` hold an exclusive `flock` on
//!   `{id}.lock` (waiting up to [`FileStoreOptions::lock_timeout`], then
//!   `LockTimeout`). Lock files are left in place after a delete: removing
//!   a lock file others may be waiting on would break mutual exclusion.
//! - Writes go to a hidden temp file, which is fsynced, renamed over
//!   `{id}.json`, and the directory is fsynced. A reader therefore sees the
//!   old or the new file, never a mix, and needs no lock.
//! - A corrupt or unreadable file is `InvalidSessionFile { path, reason }`
//!   on load; listing skips it and reports it in `skipped`.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{ListQuery, LoadCounter, SessionStore, StoreError, StoreStats};
use crate::session::{
    AgentDefinition, AgentSession, AgentSessionInfo, AgentState, SessionId, SessionInfoList,
    SkippedSession,
};
use crate::transcript::now_ms;

/// The `format` value this store writes and reads.
pub const FILE_FORMAT: u32 = 1;
/// Longest first (header) line read by a header-only read (64 KiB).
pub const MAX_HEADER_LINE: usize = 64 << 10;
/// Largest session file `load` reads (1 GiB).
pub const MAX_SESSION_FILE: u64 = 1 << 30;
/// Default time to wait for a session's lock.
pub const DEFAULT_LOCK_TIMEOUT: Duration = Duration::from_secs(5);

/// How a [`FileStore`] behaves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileStoreOptions {
    /// How long `create`/`save`/`delete` wait for the session's lock.
    pub lock_timeout: Duration,
    /// fsync each written file and the directory. Turning this off keeps
    /// atomicity (rename) but loses durability on power failure; meant for
    /// bulk imports and tests only.
    pub fsync: bool,
}

impl Default for FileStoreOptions {
    fn default() -> Self {
        FileStoreOptions {
            lock_timeout: DEFAULT_LOCK_TIMEOUT,
            fsync: true,
        }
    }
}

/// Sessions as JSON files in one directory. See the module docs.
#[derive(Debug)]
pub struct FileStore {
    dir: PathBuf,
    opts: FileStoreOptions,
    loads: LoadCounter,
    tmp_seq: AtomicU64,
}

#[derive(Deserialize)]
struct HeaderOnly {
    format: u32,
    header: AgentSessionInfo,
}

#[derive(Deserialize)]
struct WholeFile {
    format: u32,
    header: AgentSessionInfo,
    definition: AgentDefinition,
    state: AgentState,
}

/// Holds a session's `flock` until dropped (closing the file releases it).
struct LockGuard {
    _file: File,
}

fn io_err(path: &Path, source: io::Error) -> StoreError {
    StoreError::Io {
        path: path.to_path_buf(),
        source,
    }
}

fn invalid(path: &Path, reason: impl Into<String>) -> StoreError {
    StoreError::InvalidSessionFile {
        path: path.to_path_buf(),
        reason: reason.into(),
    }
}

impl FileStore {
    /// Opens (creating if needed, mode 0700) a store directory with
    /// default options.
    pub fn open(dir: impl AsRef<Path>) -> Result<FileStore, StoreError> {
        Self::open_with(dir, FileStoreOptions::default())
    }

    pub fn open_with(
        dir: impl AsRef<Path>,
        opts: FileStoreOptions,
    ) -> Result<FileStore, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&dir)
            .map_err(|e| io_err(&dir, e))?;
        Ok(FileStore {
            dir,
            opts,
            loads: LoadCounter::default(),
            tmp_seq: AtomicU64::new(0),
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// `{dir}/{id}.json`. Safe: a `SessionId` is never a path separator or
    /// a dot-name.
    pub fn session_path(&self, id: &SessionId) -> PathBuf {
        self.dir.join(format!("{}.json", id.as_str()))
    }

    fn lock_path(&self, id: &SessionId) -> PathBuf {
        self.dir.join(format!("{}.lock", id.as_str()))
    }

    fn lock(&self, id: &SessionId) -> Result<LockGuard, StoreError> {
        let path = self.lock_path(id);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        let start = Instant::now();
        let mut backoff = Duration::from_millis(1);
        loop {
            match file.try_lock() {
                Ok(()) => return Ok(LockGuard { _file: file }),
                Err(fs::TryLockError::WouldBlock) => {
                    let waited = start.elapsed();
                    if waited >= self.opts.lock_timeout {
                        return Err(StoreError::LockTimeout {
                            path,
                            waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                        });
                    }
                    std::thread::sleep(backoff.min(self.opts.lock_timeout - waited));
                    backoff = (backoff * 2).min(Duration::from_millis(20));
                }
                Err(fs::TryLockError::Error(e)) => return Err(io_err(&path, e)),
            }
        }
    }

    fn check_header(
        path: &Path,
        id: &SessionId,
        h: HeaderOnly,
    ) -> Result<AgentSessionInfo, StoreError> {
        if h.format != FILE_FORMAT {
            return Err(invalid(
                path,
                format!(
                    "format {} is not supported (expected {FILE_FORMAT})",
                    h.format
                ),
            ));
        }
        if &h.header.id != id {
            return Err(invalid(
                path,
                format!("header id {} does not match the file name", h.header.id),
            ));
        }
        Ok(h.header)
    }

    /// Reads only the header of `{id}.json`; `None` if the file is absent.
    fn read_header_at(
        &self,
        path: &Path,
        id: &SessionId,
    ) -> Result<Option<AgentSessionInfo>, StoreError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(path, e)),
        };
        let mut line = Vec::new();
        BufReader::new(file)
            .take(MAX_HEADER_LINE as u64 + 1)
            .read_until(b'\n', &mut line)
            .map_err(|e| io_err(path, e))?;
        // Fast path: the first line is `{"format":1,"header":{...},`.
        if let Some(head) = line.strip_suffix(b",\n") {
            let mut doc = head.to_vec();
            doc.push(b'}');
            if let Ok(h) = serde_json::from_slice::<HeaderOnly>(&doc) {
                return Self::check_header(path, id, h).map(Some);
            }
        }
        // Other layouts: parse the whole file, skipping definition and
        // state without building them.
        let file = File::open(path).map_err(|e| io_err(path, e))?;
        let h: HeaderOnly = serde_json::from_reader(BufReader::new(file.take(MAX_SESSION_FILE)))
            .map_err(|e| invalid(path, e.to_string()))?;
        Self::check_header(path, id, h).map(Some)
    }

    fn read_whole(&self, path: &Path, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(path, e)),
        };
        let len = file.metadata().map_err(|e| io_err(path, e))?.len();
        if len > MAX_SESSION_FILE {
            return Err(invalid(
                path,
                format!("{len} bytes exceeds the {MAX_SESSION_FILE}-byte limit"),
            ));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(len).unwrap_or(0));
        file.take(MAX_SESSION_FILE)
            .read_to_end(&mut bytes)
            .map_err(|e| io_err(path, e))?;
        let w: WholeFile =
            serde_json::from_slice(&bytes).map_err(|e| invalid(path, e.to_string()))?;
        let info = Self::check_header(
            path,
            id,
            HeaderOnly {
                format: w.format,
                header: w.header,
            },
        )?;
        Ok(Some(AgentSession::from_parts(info, w.definition, w.state)))
    }

    fn encode(session: &AgentSession) -> Result<Vec<u8>, StoreError> {
        let enc = |e: serde_json::Error| StoreError::InvalidSession {
            id: session.id().clone(),
            reason: format!("cannot encode as JSON: {e}"),
        };
        let mut out = format!("{{\"format\":{FILE_FORMAT},\"header\":").into_bytes();
        serde_json::to_writer(&mut out, session.info()).map_err(enc)?;
        out.extend_from_slice(b",\n\"definition\":");
        serde_json::to_writer(&mut out, session.definition()).map_err(enc)?;
        out.extend_from_slice(b",\"state\":");
        serde_json::to_writer(&mut out, session.state()).map_err(enc)?;
        out.extend_from_slice(b"}\n");
        Ok(out)
    }

    fn sync_dir(&self) -> Result<(), StoreError> {
        if self.opts.fsync {
            File::open(&self.dir)
                .and_then(|d| d.sync_all())
                .map_err(|e| io_err(&self.dir, e))?;
        }
        Ok(())
    }

    /// temp file + fsync + rename + directory fsync.
    fn write_atomic(&self, session: &AgentSession) -> Result<(), StoreError> {
        let bytes = Self::encode(session)?;
        let target = self.session_path(session.id());
        let tmp = self.dir.join(format!(
            ".{}.json.tmp-{}-{}",
            session.id().as_str(),
            std::process::id(),
            self.tmp_seq.fetch_add(1, Ordering::Relaxed)
        ));
        let write = || -> io::Result<()> {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)?;
            f.write_all(&bytes)?;
            if self.opts.fsync {
                f.sync_all()?;
            }
            Ok(())
        };
        if let Err(e) = write() {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(&tmp, e));
        }
        if let Err(e) = fs::rename(&tmp, &target) {
            let _ = fs::remove_file(&tmp);
            return Err(io_err(&target, e));
        }
        self.sync_dir()
    }
}

impl SessionStore for FileStore {
    fn create(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        if session.version() != 0 {
            return Err(StoreError::InvalidSession {
                id: session.id().clone(),
                reason: format!("create needs version 0, got {}", session.version()),
            });
        }
        let _lock = self.lock(session.id())?;
        let path = self.session_path(session.id());
        if let Some(h) = self.read_header_at(&path, session.id())? {
            return Err(StoreError::Conflict {
                id: session.id().clone(),
                expected: 0,
                actual: h.version,
            });
        }
        let now = now_ms().max(session.info().created_at_ms);
        let stored = session.reconstitute(1, now);
        self.write_atomic(&stored)?;
        Ok(stored)
    }

    fn save(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        let _lock = self.lock(session.id())?;
        let path = self.session_path(session.id());
        let current =
            self.read_header_at(&path, session.id())?
                .ok_or_else(|| StoreError::NotFound {
                    id: session.id().clone(),
                })?;
        if current.version != session.version() {
            return Err(StoreError::Conflict {
                id: session.id().clone(),
                expected: session.version(),
                actual: current.version,
            });
        }
        let now = now_ms().max(current.updated_at_ms);
        let version = session.version().saturating_add(1);
        let stored = session.reconstitute(version, now);
        self.write_atomic(&stored)?;
        Ok(stored)
    }

    fn load(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        let found = self.read_whole(&self.session_path(id), id)?;
        if found.is_some() {
            self.loads.bump();
        }
        Ok(found)
    }

    fn exists(&self, id: &SessionId) -> Result<bool, StoreError> {
        let path = self.session_path(id);
        match fs::metadata(&path) {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        let _lock = self.lock(id)?;
        let path = self.session_path(id);
        match fs::remove_file(&path) {
            Ok(()) => {
                self.sync_dir()?;
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    fn list_headers(&self, query: &ListQuery) -> Result<SessionInfoList, StoreError> {
        let mut headers = Vec::new();
        let mut skipped = Vec::new();
        let rd = fs::read_dir(&self.dir).map_err(|e| io_err(&self.dir, e))?;
        for ent in rd {
            let ent = ent.map_err(|e| io_err(&self.dir, e))?;
            let name = ent.file_name();
            let Some(name) = name.to_str() else {
                continue;
            };
            if name.starts_with('.') {
                continue;
            }
            let Some(stem) = name.strip_suffix(".json") else {
                continue;
            };
            let path = ent.path();
            let id = match SessionId::parse(stem) {
                Ok(id) => id,
                Err(e) => {
                    skipped.push(SkippedSession {
                        location: path.display().to_string(),
                        reason: e.to_string(),
                    });
                    continue;
                }
            };
            match self.read_header_at(&path, &id) {
                Ok(Some(h)) => {
                    if query.matches(&h) {
                        headers.push(h)
                    }
                }
                // Deleted between read_dir and open.
                Ok(None) => {}
                Err(e) => skipped.push(SkippedSession {
                    location: path.display().to_string(),
                    reason: crate::error::chain_text(&e),
                }),
            }
        }
        let mut list = query.apply(headers)?;
        skipped.sort_by(|a, b| a.location.cmp(&b.location));
        list.skipped = skipped;
        Ok(list)
    }

    fn header(&self, id: &SessionId) -> Result<Option<AgentSessionInfo>, StoreError> {
        self.read_header_at(&self.session_path(id), id)
    }

    fn stats(&self) -> StoreStats {
        self.loads.stats()
    }
}
