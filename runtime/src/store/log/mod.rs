//! The log store: sessions event-sourced on the spool engine (the default store).
//!
//! Each session is one engine stream whose id is the session id. `create`
//! and `save` commit the session's pending events as ONE engine commit
//! under the session's version fence (`NoStream` for create, `Exact(v)` for
//! save), so a save is all-or-nothing and a stale save writes nothing.
//! Events are encoded with [`encode_event`]; each engine event's kind is
//! `session.<event kind>` (e.g. `session.entry_appended`).
//!
//! # Failed writes
//!
//! A failed engine write poisons the engine (its outcome is unknown);
//! [`LogStore::recover`] reopens it in place, which recovers the log, and
//! the handle write path does so before its next commit. The version
//! fence then tells whether the failed write landed; nothing is replayed.
//! [`LogStoreOptions::vfs`] passes a fault-injecting file system in tests.
//!
//! # Versions and purge
//!
//! A session's version is the number of commits of its current
//! incarnation. `delete` (the store-level, physical removal) appends a
//! `spool.purge` marker; the session then reads as absent, and a later
//! `create` of the same id starts a new incarnation at version 1 (stream
//! versions are offset by the purge's version). Log compaction reclaims
//! purged records.
//!
//! # Layout
//!
//! `sessions.rs` holds the session index and its indexer; `snapshots.rs`
//! the snapshot cache and loads; `backend.rs` the [`TranscriptBackend`]
//! over the `transcript/` index. This file holds the store itself:
//! options, open and recovery, and [`SessionStore`].

mod backend;
mod common;
pub(crate) mod sessions;
mod snapshots;
pub(crate) mod transcript;

pub(crate) use sessions::stored_kind;

pub(crate) use common::{be_u64, engine_err};
pub use common::{PURGE_EVENT_KIND, SESSION_EVENT_PREFIX};
pub(crate) use sessions::SessionIndexer;

mod erase;
pub use erase::{is_erased_entry, ERASED_CUSTOM_TYPE};

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use spool_engine::vfs::Vfs;
use spool_engine::{
    AppendOutcome, Durability, EventData, ExpectedVersion, GcAction, GcOptions, Options,
    RecordedCommit, Store,
};

use self::sessions::{
    decode_keyed_record, decode_record, key, parent_prefix, status_byte, KEY_BROKEN, KEY_HEADER,
    KEY_PURGED, KEY_STATUS,
};
pub(crate) use self::snapshots::{SettingsFold, SETTINGS_TAIL_COMMITS};
use self::snapshots::{CACHE_SETTINGS, CACHE_SNAPSHOT};
use self::transcript::{DecodeMemo, TranscriptIndexer};
use crate::session::{
    encode_event, AgentSession, AgentSessionInfo, SessionEvent, SessionId, SessionInfoList,
    SessionStatus, SkippedSession,
};
use crate::store::TranscriptBackend;
use crate::store::{ListQuery, LoadCounter, SessionStore, StoreError, StoreStats};

/// Name of the engine indexer that keeps session headers.
pub const SESSION_INDEXER: &str = "sessions";

/// Version of the session index layout; bumping it rebuilds the index.
pub const SESSION_INDEX_VERSION: u32 = 4;

/// A load that replays at least this many commits writes a snapshot.
pub const SNAPSHOT_TAIL_COMMITS: u64 = 64;

/// How long `close` waits for operations in flight to let go of the engine.
const CLOSE_WAIT_MAX: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// How long an open waits for another owner to release the store
    /// (engine default, [`spool_engine::LOCK_WAIT_MAX_MS`], when `None`;
    /// zero fails at once with the engine's `Locked`).
    pub lock_wait: Option<std::time::Duration>,
    /// How long the engine's index thread polls for a lone durable writer's
    /// next commit before it sleeps (engine default when `None`: zero, never).
    /// With a window a lone writer's indexers run
    /// during its fdatasync, for a second core kept busy while it commits
    /// back to back. See [`spool_engine::Options::index_thread_poll`].
    pub index_thread_poll: Option<std::time::Duration>,
    /// Most bytes of the index's sled page cache (engine default,
    /// [`spool_engine::INDEX_CACHE_BYTES_MAX`], when `None`). See
    /// [`spool_engine::Options::index_cache_bytes_max`].
    pub index_cache_bytes_max: Option<u64>,
    /// Open the index for a bulk load (default false; set by
    /// [`LogStoreOptions::bulk_load`]). See
    /// [`spool_engine::Options::index_bulk_load`].
    pub index_bulk_load: bool,
}

impl Default for LogStoreOptions {
    fn default() -> Self {
        LogStoreOptions {
            durability: Durability::Immediate,
            segment_bytes_max: None,
            record_bytes_max: None,
            vfs: None,
            lock_wait: None,
            index_thread_poll: None,
            index_cache_bytes_max: None,
            index_bulk_load: false,
        }
    }
}

impl LogStoreOptions {
    /// Options for a bulk load such as an import (what `spool import` opens
    /// the store with): buffered appends, which
    /// [`import_from`](crate::store::exchange::import_from) syncs once
    /// before it reports success, and the index's bulk load: moves spilled
    /// to sorted files instead of sled
    /// ([`spool_engine::Options::index_bulk_load`]), with sled's bulk-load
    /// page cache ([`spool_engine::INDEX_CACHE_BYTES_BULK`]).
    pub fn bulk_load() -> Self {
        LogStoreOptions {
            durability: Durability::Buffered,
            index_cache_bytes_max: Some(spool_engine::INDEX_CACHE_BYTES_BULK),
            index_bulk_load: true,
            ..LogStoreOptions::default()
        }
    }

    /// Engine options with the session and transcript indexers registered.
    pub fn engine_options(&self) -> Options {
        self.engine_options_with(Arc::new(DecodeMemo::default()))
    }

    /// [`LogStoreOptions::engine_options`] with the indexers sharing
    /// `memo`: a [`LogStore`] keeps it to hand its appended entries over.
    fn engine_options_with(&self, memo: Arc<DecodeMemo>) -> Options {
        // One memo per store: a fork's seed is decoded once per commit, an
        // appended entry not at all.
        let mut o = Options::default()
            .durability(self.durability)
            .indexer(Arc::new(SessionIndexer::with_memo(memo.clone())))
            .indexer(Arc::new(TranscriptIndexer::with_memo(memo)));
        if let Some(s) = self.segment_bytes_max {
            o = o.segment_bytes_max(s);
        }
        if let Some(r) = self.record_bytes_max {
            o = o.record_bytes_max(r);
        }
        if let Some(v) = &self.vfs {
            o = o.vfs(v.clone());
        }
        if let Some(w) = self.lock_wait {
            o = o.lock_wait(w);
        }
        if let Some(p) = self.index_thread_poll {
            o = o.index_thread_poll(p);
        }
        if let Some(c) = self.index_cache_bytes_max {
            o = o.index_cache_bytes_max(c);
        }
        o.index_bulk_load(self.index_bulk_load)
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
    /// The memo the engine's indexers share (a fresh one, unused by them,
    /// for an engine opened by the caller: [`LogStore::from_engine`]).
    memo: Arc<DecodeMemo>,
}

impl std::fmt::Debug for LogStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogStore")
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl LogStore {
    /// Opens (creating if needed) the store in `dir` as its single owner.
    pub fn open(dir: impl AsRef<Path>, opts: LogStoreOptions) -> Result<LogStore, StoreError> {
        let memo = Arc::new(DecodeMemo::default());
        let engine = Store::open(dir.as_ref(), opts.engine_options_with(memo.clone()))
            .map_err(engine_err)?;
        Ok(LogStore::wrap(engine, opts, false, memo))
    }

    /// Opens the store read-only from the log alone (no lock, nothing written).
    pub fn open_read_only(dir: impl AsRef<Path>) -> Result<LogStore, StoreError> {
        let opts = LogStoreOptions::default();
        let memo = Arc::new(DecodeMemo::default());
        let engine = Store::open_read_only(dir, opts.engine_options_with(memo.clone()))
            .map_err(engine_err)?;
        Ok(LogStore::wrap(engine, opts, true, memo))
    }

    /// Wraps an engine opened with [`LogStoreOptions::engine_options`]
    /// (which registers the log store's session and transcript indexers). [`LogStore::recover`] reopens it with default options.
    pub fn from_engine(engine: Store) -> LogStore {
        let read_only = engine.is_read_only();
        LogStore::wrap(
            engine,
            LogStoreOptions::default(),
            read_only,
            Arc::new(DecodeMemo::default()),
        )
    }

    fn wrap(
        engine: Store,
        opts: LogStoreOptions,
        read_only: bool,
        memo: Arc<DecodeMemo>,
    ) -> LogStore {
        LogStore {
            dir: engine.dir().to_path_buf(),
            engine: RwLock::new(Some(Arc::new(engine))),
            opts,
            read_only,
            loads: LoadCounter::default(),
            memo,
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
        self.reopen(false)
    }

    /// Finishes an erasing log GC ([`LogStore::run_gc`]): while the engine's
    /// erase marker is in the store directory, reopens the engine, whose
    /// open deletes the index directory (the index's files still hold the
    /// values the GC erased from the log) and rebuilds every index from the
    /// log. Returns whether it reopened. Fails while another thread still
    /// holds the engine.
    pub fn finish_erasure(&self) -> Result<bool, StoreError> {
        let marker = self.dir.join(spool_engine::ERASE_MARKER_FILE);
        let pending = match &self.opts.vfs {
            Some(vfs) => vfs.exists(&marker),
            None => marker.try_exists(),
        }
        .map_err(|source| StoreError::Io {
            path: marker.clone(),
            source,
        })?;
        if self.read_only || !pending {
            return Ok(false);
        }
        self.reopen(true)
    }

    fn reopen(&self, always: bool) -> Result<bool, StoreError> {
        let mut guard = self.engine.write().unwrap_or_else(|e| e.into_inner());
        match guard.as_ref() {
            Some(e) if !always && !e.is_poisoned() => return Ok(false),
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
        let options = self.opts.engine_options_with(self.memo.clone());
        let engine = if self.read_only {
            Store::open_read_only(&self.dir, options)
        } else {
            Store::open(&self.dir, options)
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

    /// The header of `id` and the stream version base of its incarnation
    /// (see [`LogStore::base`]): one index read for a session that has a
    /// header; a session whose events do not decode is `Corrupt`.
    fn record(&self, id: &SessionId) -> Result<Option<(AgentSessionInfo, u64)>, StoreError> {
        let engine = self.engine()?;
        let index = engine.index();
        if let Some(b) = index
            .get(SESSION_INDEXER, &key(KEY_HEADER, id.as_str()))
            .map_err(engine_err)?
        {
            // The indexer removes the header of a session it marks broken,
            // so a session with a header is readable.
            return decode_record(id.clone(), &b)
                .map(Some)
                .map_err(|reason| StoreError::Corrupt {
                    id: id.clone(),
                    reason: format!("header index entry: {reason}"),
                });
        }
        match index
            .get(SESSION_INDEXER, &key(KEY_BROKEN, id.as_str()))
            .map_err(engine_err)?
        {
            Some(reason) => Err(StoreError::Corrupt {
                id: id.clone(),
                reason: String::from_utf8_lossy(&reason).into_owned(),
            }),
            None => Ok(None),
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
                Ok(EventData::new(stored_kind(ev), payload))
            })
            .collect()
    }

    fn append(
        &self,
        id: &SessionId,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, StoreError> {
        // A commit id the engine draws: no retry can carry it, so the engine
        // skips the lookup that recognizes retries.
        let outcome = self
            .engine()?
            .append_fresh(id.as_str(), expected, events)
            .map_err(engine_err)?;
        if let AppendOutcome::Committed(info) = &outcome {
            self.refresh_settings(id, info.version);
        }
        Ok(outcome)
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

    /// Plans an erasing log GC: it removes the streams of
    /// [`LogStore::gc_dead_streams`] and replaces the transcript content a
    /// later rewrite superseded with erased placeholders (entries for which [`is_erased_entry`] holds),
    /// in every segment including the active one (which planning seals
    /// first when it holds such content).
    pub fn plan_gc(&self) -> Result<spool_engine::GcPlan, StoreError> {
        self.plan_erasing_gc(GcOptions::erasing())
    }

    /// The plan of [`LogStore::plan_gc`] without sealing the active segment
    /// (nothing is written): what its commits would lose is counted in
    /// [`spool_engine::GcPlan::kept_dead_commits`]. For a dry run.
    pub fn plan_gc_preview(&self) -> Result<spool_engine::GcPlan, StoreError> {
        self.plan_erasing_gc(GcOptions::erasing().include_active(false))
    }

    fn plan_erasing_gc(&self, opts: GcOptions) -> Result<spool_engine::GcPlan, StoreError> {
        let dead = self.gc_dead_streams()?;
        let engine = self.engine()?;
        let replace = erase::superseded(&engine)?;
        engine
            .plan_gc_with(opts, &|c: &RecordedCommit| {
                if dead.contains(&c.info.stream) {
                    GcAction::Drop
                } else if let Some(events) = replace.get(&c.info.seq) {
                    GcAction::Replace(events.clone())
                } else {
                    GcAction::Keep
                }
            })
            .map_err(engine_err)
    }

    /// Runs a planned log GC (copy live records, swap, retire; crash-safe,
    /// see the engine). Snapshots are dropped with the rebuilt index. The
    /// index's files still hold the old values until
    /// [`LogStore::finish_erasure`] (or the next open) deletes and rebuilds
    /// them.
    pub fn run_gc(&self, plan: spool_engine::GcPlan) -> Result<spool_engine::GcReport, StoreError> {
        self.engine()?.run_gc(plan).map_err(engine_err)
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
        let Some((current, base)) = self.record(&id)? else {
            return Err(StoreError::NotFound { id });
        };
        if version == 0 {
            return Err(StoreError::Conflict {
                id,
                expected: 0,
                actual: current.version,
            });
        }
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
            let Some((h, base)) = self.record(id)? else {
                return Ok(false);
            };
            let expected = base + h.version;
            let events = vec![EventData::new(PURGE_EVENT_KIND, Vec::new())];
            match self.append(id, ExpectedVersion::Exact(expected), events)? {
                AppendOutcome::Committed(_) | AppendOutcome::AlreadyCommitted(_) => {
                    let _ = self
                        .engine()?
                        .index()
                        .remove_cache(SESSION_INDEXER, &key(CACHE_SNAPSHOT, id.as_str()));
                    let _ = self
                        .engine()?
                        .index()
                        .remove_cache(SESSION_INDEXER, &key(CACHE_SETTINGS, id.as_str()));
                    return Ok(true);
                }
                // A concurrent save moved the head: purge the newer version. The
                // head is published with the session's header, so a published
                // head past a header that has not moved is a commit that is not
                // the session's (another writer of the stream): no retry ends.
                AppendOutcome::Conflict { .. } => {
                    let head = self.engine()?.stream_version(id.as_str());
                    let head = head.map_err(engine_err)?.unwrap_or(0);
                    let moved = self.record(id)?.map(|(h, b)| b + h.version);
                    if head > expected && moved == Some(expected) {
                        return Err(StoreError::InvalidSession {
                            id: id.clone(),
                            reason: format!(
                                "its stream goes on to version {head} past the session's \
                                 {expected} with commits that are not the session's; \
                                 nothing was purged"
                            ),
                        });
                    }
                }
                #[allow(unreachable_patterns)]
                _ => return Ok(false),
            }
        }
    }

    /// Newest first without a filter: a range scan that
    /// stops after the page (`sessions::list_newest_first`). Otherwise one
    /// prefix scan: the status, parent and header keys all hold the header
    /// record, so no header is looked up by id.
    fn list_headers(&self, query: &ListQuery) -> Result<SessionInfoList, StoreError> {
        let engine = self.engine()?;
        let index = engine.index();
        let mut list = match sessions::list_newest_first(index, query)? {
            Some(list) => list,
            None => {
                let mut skipped = Vec::new();
                let mut headers = Vec::new();
                // Pick the narrowest index for the query's filters.
                let prefix: Vec<u8> = if let Some(p) = &query.parent {
                    parent_prefix(p.as_str())
                } else if let Some(s) = query.status {
                    vec![KEY_STATUS, status_byte(s)]
                } else {
                    vec![KEY_HEADER]
                };
                index
                    .visit_prefix(SESSION_INDEXER, &prefix, |k, v| {
                        let id = k.get(prefix.len()..).unwrap_or_default();
                        match decode_keyed_record(id, v) {
                            Ok(h) => headers.push(h),
                            Err(reason) => skipped.push(SkippedSession {
                                location: format!("index:{}", String::from_utf8_lossy(id)),
                                reason,
                            }),
                        }
                        true
                    })
                    .map_err(engine_err)?;
                let mut list = query.apply(headers)?;
                list.skipped.extend(skipped);
                list
            }
        };
        // Sessions whose stored events do not decode are reported, not listed.
        for kv in index.scan_prefix(SESSION_INDEXER, &[KEY_BROKEN]) {
            let (k, v) = kv.map_err(engine_err)?;
            list.skipped.push(SkippedSession {
                location: format!(
                    "log:{}",
                    String::from_utf8_lossy(k.get(1..).unwrap_or_default())
                ),
                reason: String::from_utf8_lossy(&v).into_owned(),
            });
        }
        Ok(list)
    }

    fn header(&self, id: &SessionId) -> Result<Option<AgentSessionInfo>, StoreError> {
        Ok(self.record(id)?.map(|(h, _)| h))
    }

    fn stats(&self) -> StoreStats {
        self.loads.stats()
    }
}
