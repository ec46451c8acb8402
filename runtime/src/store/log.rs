//! The log store: sessions event-sourced on the spool engine (the default store).
//!
//! Each session is one engine stream whose id is the session id. `create`
//! and `save` commit the session's pending events as ONE engine commit
//! under the session's version fence (`NoStream` for create, `Exact(v)` for
//! save), so a save is all-or-nothing and a stale save writes nothing.
//! Events are encoded with [`encode_event`]; each engine event's kind is
//! `session.<event kind>` (e.g. `session.entry_appended`).
//!
//! # Derived indexes (engine indexer `sessions`)
//!
//! Maintained from the log by [`SessionIndexer`], in the same atomic sled
//! batch as the engine's own stream heads, and rebuilt from the log like
//! them (deleting `DIR/index/` loses nothing):
//!
//! | key | value | use |
//! | --- | --- | --- |
//! | `h` ++ id | MessagePack `AgentSessionInfo` | `header`, listing |
//! | `s` ++ status byte ++ id | empty | listing by status |
//! | `p` ++ u8 len ++ parent id ++ id | empty | listing children |
//! | `x` ++ id | u64 BE stream version of the purge | purged sessions |
//!
//! Only `created`, `status_changed`, `forked` and `deleted` events are
//! decoded by the indexer; every session commit updates the header's
//! version and `updated_at_ms` (the commit's timestamp).
//!
//! A second indexer, [`TranscriptIndexer`] (`transcript`), keeps per-entry
//! records, children, custom-entry lists, labels and the transcript
//! version; see [`super::transcript_index`]. With it the store implements
//! [`TranscriptBackend`]: session handles open, read and write without
//! loading the session.
//!
//! # Failed writes
//!
//! A failed engine write poisons the engine (its outcome is unknown);
//! [`LogStore::recover`] reopens it in place, which recovers the log, and
//! the handle write path does so before its next commit. The version
//! fence then tells whether the failed write landed; nothing is replayed.
//! [`LogStoreOptions::vfs`] passes a fault-injecting file system in tests.
//!
//! # Snapshots
//!
//! A snapshot is the fold of a session at some version, kept in the
//! engine's index *cache* area (key `snap` ++ id; value: u64 BE stream
//! version, i64 BE updated-at, then [`encode_snapshot`] bytes). Policy: a
//! `load` that replayed at least [`SNAPSHOT_TAIL_COMMITS`] commits beyond
//! the snapshot it started from (or from the start) writes a new one, so
//! the next load costs the snapshot plus a short tail. A snapshot that
//! fails to decode, has another schema, or does not fit the stream is
//! ignored and the events are replayed. Snapshots are a cache: a rebuild
//! drops them.
//!
//! # Versions and purge
//!
//! A session's version is the number of commits of its current
//! incarnation. `delete` (the store-level, physical removal) appends a
//! `spool.purge` marker; the session then reads as absent, and a later
//! `create` of the same id starts a new incarnation at version 1 (stream
//! versions are offset by the purge's version). Log compaction reclaims
//! purged records.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use spool_engine::vfs::Vfs;
use spool_engine::{
    AppendOutcome, Durability, EventData, ExpectedVersion, IndexBatch, IndexError, Indexer,
    NewCommit, Options, RecordedCommit, Store,
};

use super::transcript_index::{self, LogTranscriptSource, TranscriptIndexer};
use super::{ListQuery, LoadCounter, SessionStore, StoreError, StoreStats};
use crate::handle::{AppendReceipt, BoxedSource, TranscriptBackend, TranscriptHead};
use crate::session::{
    decode_event, decode_snapshot, encode_event, encode_snapshot, AgentSession, AgentSessionInfo,
    SessionEvent, SessionId, SessionInfoList, SessionStatus, SkippedSession,
};
use crate::transcript::EntryId;

/// Name of the engine indexer that keeps session headers.
pub const SESSION_INDEXER: &str = "sessions";
/// Version of the session index layout; bumping it rebuilds the index.
pub const SESSION_INDEX_VERSION: u32 = 1;
/// Prefix of the engine event kinds of session events.
pub const SESSION_EVENT_PREFIX: &str = "session.";
/// Engine event kind of the store-level purge marker.
pub const PURGE_EVENT_KIND: &str = "spool.purge";
/// A load that replays at least this many commits writes a snapshot.
pub const SNAPSHOT_TAIL_COMMITS: u64 = 64;
/// How long `close` waits for operations in flight to let go of the engine.
const CLOSE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);
/// Commits read from the engine per batch while loading.
const LOAD_BATCH_COMMITS: usize = 256;

const KEY_HEADER: u8 = b'h';
const KEY_STATUS: u8 = b's';
const KEY_PARENT: u8 = b'p';
const KEY_PURGED: u8 = b'x';
/// A session whose stored events do not decode: value is the reason.
const KEY_BROKEN: u8 = b'k';
const CACHE_SNAPSHOT: &[u8] = b"snap";

fn key(tag: u8, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + id.len());
    k.push(tag);
    k.extend_from_slice(id.as_bytes());
    k
}

fn status_byte(s: SessionStatus) -> u8 {
    match s {
        SessionStatus::Active => 1,
        SessionStatus::Suspended => 2,
        SessionStatus::Completed => 3,
        SessionStatus::Failed => 4,
        SessionStatus::Deleted => 5,
    }
}

fn status_key(s: SessionStatus, id: &str) -> Vec<u8> {
    let mut k = vec![KEY_STATUS, status_byte(s)];
    k.extend_from_slice(id.as_bytes());
    k
}

fn parent_prefix(parent: &str) -> Vec<u8> {
    // Session ids are at most 128 bytes, so the length fits a u8.
    let mut k = vec![KEY_PARENT, parent.len().min(255) as u8];
    k.extend_from_slice(parent.as_bytes());
    k
}

fn parent_key(parent: &str, id: &str) -> Vec<u8> {
    let mut k = parent_prefix(parent);
    k.extend_from_slice(id.as_bytes());
    k
}

fn encode_header(h: &AgentSessionInfo) -> Result<Vec<u8>, String> {
    rmp_serde::to_vec_named(h).map_err(|e| e.to_string())
}

fn decode_header(bytes: &[u8]) -> Result<AgentSessionInfo, String> {
    rmp_serde::from_slice(bytes).map_err(|e| e.to_string())
}

fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

/// Maintains the session header index from the log. See the module docs.
#[derive(Debug, Default)]
pub struct SessionIndexer;

impl SessionIndexer {
    fn apply_session_commit(
        &self,
        commit: &RecordedCommit,
        batch: &mut IndexBatch<'_>,
    ) -> Result<(), IndexError> {
        let id = commit.info.stream.as_str();
        let hkey = key(KEY_HEADER, id);
        let mut header = match batch.get(&hkey)? {
            Some(b) => Some(decode_header(&b).map_err(|e| {
                IndexError::indexer(SESSION_INDEXER, format!("header of {id}: {e}"))
            })?),
            None => None,
        };
        let old = header.clone();
        let base = match batch.get(&key(KEY_PURGED, id))? {
            Some(b) => be_u64(&b).unwrap_or(0),
            None => 0,
        };
        let bkey = key(KEY_BROKEN, id);
        let mut broken = batch.get(&bkey)?.is_some();
        for ev in &commit.events {
            if ev.kind == PURGE_EVENT_KIND {
                header = None;
                broken = false;
                batch.remove(&bkey);
                batch.insert(&key(KEY_PURGED, id), &commit.info.version.to_be_bytes());
                continue;
            }
            if broken {
                continue;
            }
            let Some(kind) = ev.kind.strip_prefix(SESSION_EVENT_PREFIX) else {
                continue;
            };
            if !matches!(kind, "created" | "status_changed" | "forked" | "deleted") {
                continue;
            }
            let decoded = match decode_event(&ev.payload) {
                Ok(d) => d,
                Err(e) => {
                    // One undecodable event (a foreign writer, a newer
                    // schema) makes only its own session unreadable: it is
                    // reported by `header`, `load` and listings, and every
                    // other session stays reachable.
                    let reason = format!(
                        "stream version {} event {}: {e}",
                        commit.info.version, ev.kind
                    );
                    batch.insert(&bkey, reason.as_bytes());
                    broken = true;
                    header = None;
                    continue;
                }
            };
            match decoded {
                SessionEvent::Created {
                    id: sid,
                    parent_id,
                    agent_name,
                    label,
                    created_at_ms,
                    ..
                } => {
                    header = Some(AgentSessionInfo {
                        id: sid,
                        parent_id,
                        status: SessionStatus::Active,
                        version: 0,
                        agent_name,
                        label,
                        created_at_ms,
                        updated_at_ms: created_at_ms,
                    });
                }
                SessionEvent::StatusChanged { to, .. } => {
                    if let Some(h) = header.as_mut() {
                        h.status = to;
                    }
                }
                SessionEvent::Forked { from, .. } => {
                    if let Some(h) = header.as_mut() {
                        h.parent_id = Some(from);
                    }
                }
                SessionEvent::Deleted => {
                    if let Some(h) = header.as_mut() {
                        h.status = SessionStatus::Deleted;
                    }
                }
                _ => {}
            }
        }
        if let Some(h) = header.as_mut() {
            h.version = commit.info.version.saturating_sub(base);
            h.updated_at_ms = commit.info.timestamp_ms;
        }
        // Replace the secondary keys of the old header by those of the new.
        if let Some(o) = &old {
            batch.remove(&status_key(o.status, id));
            if let Some(p) = &o.parent_id {
                batch.remove(&parent_key(p.as_str(), id));
            }
        }
        match &header {
            Some(h) => {
                let bytes = encode_header(h).map_err(|e| {
                    IndexError::indexer(SESSION_INDEXER, format!("header of {id}: {e}"))
                })?;
                batch.insert(&hkey, &bytes);
                batch.insert(&status_key(h.status, id), &[]);
                if let Some(p) = &h.parent_id {
                    batch.insert(&parent_key(p.as_str(), id), &[]);
                }
            }
            None => batch.remove(&hkey),
        }
        Ok(())
    }
}

impl Indexer for SessionIndexer {
    fn name(&self) -> &'static str {
        SESSION_INDEXER
    }

    fn version(&self) -> u32 {
        SESSION_INDEX_VERSION
    }

    fn apply(&self, commit: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        let is_session = commit
            .events
            .iter()
            .any(|e| e.kind == PURGE_EVENT_KIND || e.kind.starts_with(SESSION_EVENT_PREFIX));
        if !is_session {
            return Ok(());
        }
        self.apply_session_commit(commit, batch)
    }
}

/// Options of a [`LogStore`].
#[derive(Clone, Debug)]
pub struct LogStoreOptions {
    pub durability: Durability,
    /// Segment size in bytes (engine default when `None`).
    pub segment_bytes_max: Option<u64>,
    /// Largest commit record in bytes (engine default when `None`).
    pub record_bytes_max: Option<u32>,
    /// The I/O seam of the log's files (the engine's [`spool_engine::vfs::OsVfs`]
    /// when `None`); tests pass a [`spool_engine::vfs::FaultVfs`] to inject
    /// failures.
    pub vfs: Option<Arc<dyn Vfs>>,
}

impl Default for LogStoreOptions {
    fn default() -> Self {
        LogStoreOptions {
            durability: Durability::Immediate,
            segment_bytes_max: None,
            record_bytes_max: None,
            vfs: None,
        }
    }
}

impl LogStoreOptions {
    /// Engine options with the session and transcript indexers registered.
    pub fn engine_options(&self) -> Options {
        let mut o = Options::default()
            .durability(self.durability)
            .indexer(Arc::new(SessionIndexer))
            .indexer(Arc::new(TranscriptIndexer));
        if let Some(s) = self.segment_bytes_max {
            o = o.segment_bytes_max(s);
        }
        if let Some(r) = self.record_bytes_max {
            o = o.record_bytes_max(r);
        }
        if let Some(v) = &self.vfs {
            o = o.vfs(v.clone());
        }
        o
    }
}

/// Sessions event-sourced on the spool engine. See the module docs.
///
/// The engine sits behind a lock so that [`LogStore::recover`] can reopen
/// it in place after a failed write poisoned it (the engine refuses writes
/// until a reopen recovers the log).
pub struct LogStore {
    engine: RwLock<Option<Arc<Store>>>,
    dir: PathBuf,
    opts: LogStoreOptions,
    read_only: bool,
    loads: LoadCounter,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

fn engine_err(e: spool_engine::Error) -> StoreError {
    StoreError::Engine(e)
}

impl LogStore {
    /// Opens (creating if needed) the store in `dir` as its single owner.
    pub fn open(dir: impl AsRef<Path>, opts: LogStoreOptions) -> Result<LogStore, StoreError> {
        let engine = Store::open(dir.as_ref(), opts.engine_options()).map_err(engine_err)?;
        Ok(LogStore::wrap(engine, opts, false))
    }

    /// Opens the store read-only from the log alone (no lock, nothing written).
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<LogStore, StoreError> {
        let opts = LogStoreOptions::default();
        let engine = Store::open_read_only(dir, opts.engine_options()).map_err(engine_err)?;
        Ok(LogStore::wrap(engine, opts, true))
    }

    /// Wraps an engine opened with [`LogStoreOptions::engine_options`] (it
    /// must have the [`SessionIndexer`] and [`TranscriptIndexer`]
    /// registered). [`LogStore::recover`] reopens it with default options.
    pub fn from_engine(engine: Store) -> LogStore {
        let read_only = engine.is_read_only();
        LogStore::wrap(engine, LogStoreOptions::default(), read_only)
    }

    fn wrap(engine: Store, opts: LogStoreOptions, read_only: bool) -> LogStore {
        LogStore {
            dir: engine.dir().to_path_buf(),
            engine: RwLock::new(Some(Arc::new(engine))),
            opts,
            read_only,
            loads: LoadCounter::default(),
        }
    }

    /// The engine underneath. Fails only after a [`LogStore::recover`]
    /// that could not reopen it.
    pub fn engine(&self) -> Result<Arc<Store>, StoreError> {
        self.engine
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or_else(|| StoreError::Io {
                path: self.dir.clone(),
                source: std::io::Error::other("the log store is closed (a recovery failed)"),
            })
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Reopens the engine if a failed write poisoned it: the reopen
    /// recovers the log (a torn tail is truncated, the indexes catch up),
    /// after which writes are accepted again. Returns whether it reopened.
    /// A write whose outcome was unknown is then either in the log or not;
    /// callers reconcile through the session version fence, never by
    /// replaying it. Fails (and leaves the poisoned engine in place) while
    /// another thread still holds the engine.
    pub fn recover(&self) -> Result<bool, StoreError> {
        let mut guard = self.engine.write().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(e) if !e.is_poisoned() => return Ok(false),
            _ => {}
        }
        if let Some(old) = guard.take() {
            match Arc::try_unwrap(old) {
                Ok(store) => {
                    // Closing a poisoned engine may report the failure
                    // again; the reopen below is what recovers.
                    let _ = store.close();
                }
                Err(shared) => {
                    *guard = Some(shared);
                    return Err(StoreError::Io {
                        path: self.dir.clone(),
                        source: std::io::Error::other(
                            "cannot recover the log store while its engine is in use",
                        ),
                    });
                }
            }
        }
        let engine = if self.read_only {
            Store::open_read_only(&self.dir, self.opts.engine_options())
        } else {
            Store::open(&self.dir, self.opts.engine_options())
        }
        .map_err(engine_err)?;
        *guard = Some(Arc::new(engine));
        Ok(true)
    }

    /// Flushes and closes the engine.
    pub fn close(self) -> Result<(), StoreError> {
        let engine = self.engine.into_inner().unwrap_or_else(|e| e.into_inner());
        let Some(mut e) = engine else {
            return Ok(());
        };
        // Operations in flight (a handle read on another thread) hold the
        // engine briefly; wait for them so that a successful close means
        // the owner lock is free. Never report success while it is held.
        let deadline = std::time::Instant::now() + CLOSE_WAIT_MAX;
        loop {
            match Arc::try_unwrap(e) {
                Ok(store) => return store.close().map_err(engine_err),
                Err(shared) if std::time::Instant::now() < deadline => {
                    e = shared;
                    std::thread::sleep(std::time::Duration::from_millis(1));
                }
                Err(_) => {
                    return Err(StoreError::Backend(
                        "the store is still in use by another holder of its engine; \
                         it closes when the last one is dropped"
                            .into(),
                    ))
                }
            }
        }
    }

    /// Stream version of the purge that ended the previous incarnation of
    /// `id`, or 0.
    fn base(&self, id: &SessionId) -> Result<u64, StoreError> {
        Ok(self
            .engine()?
            .index()
            .get(SESSION_INDEXER, &key(KEY_PURGED, id.as_str()))
            .map_err(engine_err)?
            .and_then(|b| be_u64(&b))
            .unwrap_or(0))
    }

    fn encode_events(session: &AgentSession) -> Result<Vec<EventData>, StoreError> {
        Self::encode_event_list(session.id(), session.pending_events())
    }

    fn encode_event_list(
        id: &SessionId,
        events: &[SessionEvent],
    ) -> Result<Vec<EventData>, StoreError> {
        events
            .iter()
            .map(|ev| {
                let payload = encode_event(ev).map_err(|source| StoreError::Encoding {
                    context: format!("event {} of session {id}", ev.kind()),
                    source,
                })?;
                Ok(EventData::new(
                    format!("{SESSION_EVENT_PREFIX}{}", ev.kind()),
                    payload,
                ))
            })
            .collect()
    }

    fn append(
        &self,
        id: &SessionId,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        self.engine()?
            .append(NewCommit {
                stream: id.as_str().to_string(),
                expected,
                commit_id: uuid::Uuid::new_v4(),
                events,
            })
            .map_err(engine_err)
    }

    fn read_snapshot(
        &self,
        id: &SessionId,
        base: u64,
        head: u64,
    ) -> Option<(u64, i64, AgentSession)> {
        let bytes = self
            .engine()
            .ok()?
            .index()
            .get_cache(SESSION_INDEXER, &key(CACHE_SNAPSHOT[0], id.as_str()))
            .ok()??;
        let version = be_u64(bytes.get(..8)?)?;
        let updated = i64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
        if version <= base || version > head {
            return None;
        }
        let session = decode_snapshot(bytes.get(16..)?).ok()?;
        if session.id() != id {
            return None;
        }
        Some((version, updated, session))
    }

    fn write_snapshot(&self, session: &AgentSession, stream_version: u64) {
        // A snapshot is a cache entry: failing to write one costs only time.
        if let Ok(bytes) = encode_snapshot(session) {
            let mut v = Vec::with_capacity(16 + bytes.len());
            v.extend_from_slice(&stream_version.to_be_bytes());
            v.extend_from_slice(&session.info().updated_at_ms.to_be_bytes());
            v.extend_from_slice(&bytes);
            if let Ok(engine) = self.engine() {
                let _ = engine.index().put_cache(
                    SESSION_INDEXER,
                    &key(CACHE_SNAPSHOT[0], session.id().as_str()),
                    &v,
                );
            }
        }
    }

    /// Streams a log GC may remove whole: sessions whose current
    /// incarnation is deleted (status `Deleted`), and purged sessions that
    /// were not created again. A purged session that was created again
    /// keeps its history: the session index derives the new incarnation's
    /// version base from the purge marker. Non-session streams are live.
    pub fn gc_dead_streams(&self) -> Result<std::collections::BTreeSet<String>, StoreError> {
        let engine = self.engine()?;
        let index = engine.index();
        let mut dead = std::collections::BTreeSet::new();
        let deleted = [KEY_STATUS, status_byte(SessionStatus::Deleted)];
        for kv in index.scan_prefix(SESSION_INDEXER, &deleted) {
            let (k, _) = kv.map_err(engine_err)?;
            dead.insert(String::from_utf8_lossy(&k[deleted.len()..]).into_owned());
        }
        for kv in index.scan_prefix(SESSION_INDEXER, &[KEY_PURGED]) {
            let (k, v) = kv.map_err(engine_err)?;
            let id = String::from_utf8_lossy(&k[1..]).into_owned();
            let base = be_u64(&v).unwrap_or(0);
            if engine.stream_version(&id).map_err(engine_err)? == Some(base) {
                dead.insert(id);
            }
        }
        Ok(dead)
    }

    /// Plans a log GC that removes the streams of [`LogStore::gc_dead_streams`].
    pub fn plan_gc(&self) -> Result<spool_engine::GcPlan, StoreError> {
        let dead = self.gc_dead_streams()?;
        self.engine()?
            .plan_gc(&|c: &RecordedCommit| !dead.contains(&c.info.stream))
            .map_err(engine_err)
    }

    /// Runs a planned log GC (copy live records, swap, retire; crash-safe,
    /// see the engine). Snapshots are dropped with the rebuilt index.
    pub fn run_gc(&self, plan: spool_engine::GcPlan) -> Result<spool_engine::GcReport, StoreError> {
        self.engine()?.run_gc(plan).map_err(engine_err)
    }

    /// Loads the session as of stream version `upto` (inclusive), or its
    /// head when `None`. Used by `load` and by time travel.
    pub fn load_at(
        &self,
        id: &SessionId,
        upto: Option<u64>,
    ) -> Result<Option<AgentSession>, StoreError> {
        let Some(head) = self
            .engine()?
            .stream_version(id.as_str())
            .map_err(engine_err)?
        else {
            return Ok(None);
        };
        let base = self.base(id)?;
        if head <= base || self.header(id)?.is_none() {
            return Ok(None);
        }
        let target = match upto {
            Some(v) => base.saturating_add(v).min(head),
            None => head,
        };
        if target <= base {
            return Ok(None);
        }
        self.loads.bump();
        let snapshot = if upto.is_none() {
            self.read_snapshot(id, base, head)
        } else {
            None
        };
        let (mut session, mut from, mut version, mut updated) = match snapshot {
            Some((v, u, s)) => (Some(s), v + 1, v, u),
            None => (None, base + 1, base, 0),
        };
        let mut replayed = 0u64;
        while from <= target {
            let want = (target - from + 1).min(LOAD_BATCH_COMMITS as u64) as usize;
            let batch = self
                .engine()?
                .read_stream(id.as_str(), from, want)
                .map_err(engine_err)?;
            if batch.is_empty() {
                break;
            }
            for c in &batch {
                let mut events = Vec::with_capacity(c.events.len());
                for (i, e) in c.events.iter().enumerate() {
                    if !e.kind.starts_with(SESSION_EVENT_PREFIX) {
                        continue;
                    }
                    events.push(decode_event(&e.payload).map_err(|source| {
                        StoreError::Encoding {
                            context: format!(
                                "session {id}, stream version {}, event {i}",
                                c.info.version
                            ),
                            source,
                        }
                    })?);
                }
                let folded = match session.take() {
                    Some(s) => s.replay_onto(events.iter()),
                    None => AgentSession::replay(events.iter()),
                };
                session = Some(folded.map_err(|e| StoreError::Corrupt {
                    id: id.clone(),
                    reason: format!("stream version {}: {e}", c.info.version),
                })?);
                version = c.info.version;
                updated = c.info.timestamp_ms;
                from = c.info.version + 1;
                replayed += 1;
            }
        }
        let Some(session) = session else {
            return Ok(None);
        };
        let session = session.reconstitute(version - base, updated);
        if upto.is_none() && replayed >= SNAPSHOT_TAIL_COMMITS {
            self.write_snapshot(&session, version);
        }
        Ok(Some(session))
    }
}

impl TranscriptBackend for LogStore {
    /// The store directory: one engine owns a directory at a time.
    fn identity(&self) -> String {
        let dir = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        format!("log:{}", dir.display())
    }

    /// Two index reads: the session header and the transcript meta.
    fn head(&self, id: &SessionId) -> Result<Option<TranscriptHead>, StoreError> {
        let Some(header) = self.header(id)? else {
            return Ok(None);
        };
        let engine = self.engine()?;
        let meta = transcript_index::read_meta(engine.index(), id)?.unwrap_or_default();
        Ok(Some(TranscriptHead {
            header,
            version: meta.version(),
            leaf: meta.leaf,
            entries: meta.entries,
        }))
    }

    fn source(&self, id: &SessionId) -> Result<BoxedSource<'_>, StoreError> {
        Ok(Box::new(LogTranscriptSource::new(
            self.engine()?,
            id.clone(),
        )))
    }

    fn entry_ids(&self, id: &SessionId) -> Result<Vec<EntryId>, StoreError> {
        transcript_index::entry_ids(self.engine()?.index(), id)
    }

    /// One engine commit under `Exact(expected)`. A poisoned engine (a
    /// failed earlier write) is recovered first ([`LogStore::recover`]):
    /// the fence then tells whether that earlier write landed.
    fn append_events(
        &self,
        id: &SessionId,
        expected_version: u64,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        if self.engine()?.is_poisoned() {
            self.recover()?;
        }
        let Some(h) = self.header(id)? else {
            return Err(StoreError::NotFound { id: id.clone() });
        };
        if h.status == SessionStatus::Deleted {
            return Err(StoreError::InvalidSession {
                id: id.clone(),
                reason: "the session is deleted".into(),
            });
        }
        if events.is_empty() {
            return Err(StoreError::InvalidSession {
                id: id.clone(),
                reason: "an append needs at least one event".into(),
            });
        }
        let base = self.base(id)?;
        let data = Self::encode_event_list(id, &events)?;
        match self.append(id, ExpectedVersion::Exact(base + expected_version), data)? {
            AppendOutcome::Committed(info) | AppendOutcome::AlreadyCommitted(info) => {
                Ok(AppendReceipt {
                    session_version: info.version - base,
                    updated_at_ms: info.timestamp_ms,
                })
            }
            AppendOutcome::Conflict { actual, .. } => match actual {
                Some(a) if a > base => Err(StoreError::Conflict {
                    id: id.clone(),
                    expected: expected_version,
                    actual: a - base,
                }),
                _ => Err(StoreError::NotFound { id: id.clone() }),
            },
            #[allow(unreachable_patterns)]
            _ => Err(StoreError::InvalidSession {
                id: id.clone(),
                reason: "unexpected append outcome".into(),
            }),
        }
    }
}

impl SessionStore for LogStore {
    fn transcript_backend(&self) -> Option<&dyn TranscriptBackend> {
        Some(self)
    }

    fn create(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        if session.version() != 0 {
            return Err(StoreError::InvalidSession {
                id: session.id().clone(),
                reason: format!("create needs version 0, got {}", session.version()),
            });
        }
        let id = session.id().clone();
        if let Some(h) = self.header(&id)? {
            return Err(StoreError::Conflict {
                id,
                expected: 0,
                actual: h.version,
            });
        }
        let head = self
            .engine()?
            .stream_version(id.as_str())
            .map_err(engine_err)?;
        let base = self.base(&id)?;
        let expected = match head {
            None => ExpectedVersion::NoStream,
            // A purged earlier incarnation: the new one continues the stream.
            Some(h) if h == base => ExpectedVersion::Exact(h),
            Some(h) => {
                return Err(StoreError::Conflict {
                    id,
                    expected: 0,
                    actual: h - base,
                })
            }
        };
        let events = Self::encode_events(&session)?;
        match self.append(&id, expected, events)? {
            AppendOutcome::Committed(info) | AppendOutcome::AlreadyCommitted(info) => {
                Ok(session.reconstitute(info.version - base, info.timestamp_ms))
            }
            AppendOutcome::Conflict { actual, .. } => Err(StoreError::Conflict {
                id,
                expected: 0,
                actual: actual.unwrap_or(0).saturating_sub(base),
            }),
            #[allow(unreachable_patterns)]
            _ => Err(StoreError::InvalidSession {
                id,
                reason: "unexpected append outcome".into(),
            }),
        }
    }

    fn save(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        let id = session.id().clone();
        let version = session.version();
        let Some(current) = self.header(&id)? else {
            return Err(StoreError::NotFound { id });
        };
        if version == 0 {
            return Err(StoreError::Conflict {
                id,
                expected: 0,
                actual: current.version,
            });
        }
        let base = self.base(&id)?;
        let mut events = Self::encode_events(&session)?;
        if events.is_empty() {
            let touched =
                encode_event(&SessionEvent::Touched).map_err(|source| StoreError::Encoding {
                    context: format!("touch of session {id}"),
                    source,
                })?;
            events.push(EventData::new(
                format!("{SESSION_EVENT_PREFIX}touched"),
                touched,
            ));
        }
        match self.append(&id, ExpectedVersion::Exact(base + version), events)? {
            AppendOutcome::Committed(info) | AppendOutcome::AlreadyCommitted(info) => {
                Ok(session.reconstitute(info.version - base, info.timestamp_ms))
            }
            AppendOutcome::Conflict { actual, .. } => match actual {
                Some(a) if a > base => Err(StoreError::Conflict {
                    id,
                    expected: version,
                    actual: a - base,
                }),
                _ => Err(StoreError::NotFound { id }),
            },
            #[allow(unreachable_patterns)]
            _ => Err(StoreError::InvalidSession {
                id,
                reason: "unexpected append outcome".into(),
            }),
        }
    }

    fn load(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        self.load_at(id, None)
    }

    fn exists(&self, id: &SessionId) -> Result<bool, StoreError> {
        Ok(self.header(id)?.is_some())
    }

    fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        loop {
            let Some(h) = self.header(id)? else {
                return Ok(false);
            };
            let base = self.base(id)?;
            let events = vec![EventData::new(PURGE_EVENT_KIND, Vec::new())];
            match self.append(id, ExpectedVersion::Exact(base + h.version), events)? {
                AppendOutcome::Committed(_) | AppendOutcome::AlreadyCommitted(_) => {
                    let _ = self
                        .engine()?
                        .index()
                        .remove_cache(SESSION_INDEXER, &key(CACHE_SNAPSHOT[0], id.as_str()));
                    return Ok(true);
                }
                // A concurrent save moved the head: purge the newer version.
                AppendOutcome::Conflict { .. } => continue,
                #[allow(unreachable_patterns)]
                _ => return Ok(false),
            }
        }
    }

    fn list_headers(&self, query: &ListQuery) -> Result<SessionInfoList, StoreError> {
        let engine = self.engine()?;
        let index = engine.index();
        let mut skipped = Vec::new();
        let mut headers = Vec::new();
        let mut push_header = |id_bytes: &[u8], value: Option<Vec<u8>>| {
            let id = String::from_utf8_lossy(id_bytes).into_owned();
            if let Some(v) = value {
                match decode_header(&v) {
                    Ok(h) => headers.push(h),
                    Err(reason) => skipped.push(SkippedSession {
                        location: format!("index:{id}"),
                        reason,
                    }),
                }
            }
        };
        // Pick the narrowest index for the query's filters.
        let secondary: Option<Vec<u8>> = if let Some(p) = &query.parent {
            Some(parent_prefix(p.as_str()))
        } else {
            query.status.map(|s| vec![KEY_STATUS, status_byte(s)])
        };
        match secondary {
            Some(prefix) => {
                for kv in index.scan_prefix(SESSION_INDEXER, &prefix) {
                    let (k, _) = kv.map_err(engine_err)?;
                    let id = &k[prefix.len()..];
                    let h = index
                        .get(
                            SESSION_INDEXER,
                            &key(KEY_HEADER, &String::from_utf8_lossy(id)),
                        )
                        .map_err(engine_err)?;
                    push_header(id, h);
                }
            }
            None => {
                for kv in index.scan_prefix(SESSION_INDEXER, &[KEY_HEADER]) {
                    let (k, v) = kv.map_err(engine_err)?;
                    push_header(&k[1..], Some(v));
                }
            }
        }
        // Sessions whose stored events do not decode are reported, not listed.
        for kv in index.scan_prefix(SESSION_INDEXER, &[KEY_BROKEN]) {
            let (k, v) = kv.map_err(engine_err)?;
            skipped.push(SkippedSession {
                location: format!("log:{}", String::from_utf8_lossy(&k[1..])),
                reason: String::from_utf8_lossy(&v).into_owned(),
            });
        }
        let mut list = query.apply(headers)?;
        list.skipped.extend(skipped);
        Ok(list)
    }

    fn header(&self, id: &SessionId) -> Result<Option<AgentSessionInfo>, StoreError> {
        let engine = self.engine()?;
        if let Some(reason) = engine
            .index()
            .get(SESSION_INDEXER, &key(KEY_BROKEN, id.as_str()))
            .map_err(engine_err)?
        {
            return Err(StoreError::Corrupt {
                id: id.clone(),
                reason: String::from_utf8_lossy(&reason).into_owned(),
            });
        }
        match engine
            .index()
            .get(SESSION_INDEXER, &key(KEY_HEADER, id.as_str()))
            .map_err(engine_err)?
        {
            Some(b) => decode_header(&b)
                .map(Some)
                .map_err(|reason| StoreError::Corrupt {
                    id: id.clone(),
                    reason: format!("header index entry: {reason}"),
                }),
            None => Ok(None),
        }
    }

    fn stats(&self) -> StoreStats {
        self.loads.stats()
    }
}
