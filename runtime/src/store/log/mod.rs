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
//! | `h` ++ id | header record | `header`, the append pre-check, listing all |
//! | `s` ++ status byte ++ id | header record | listing by status |
//! | `p` ++ u8 len ++ parent id ++ id | header record | listing children |
//! | `x` ++ id | u64 BE stream version of the purge | purged sessions |
//! | `k` ++ id | reason | sessions whose events do not decode |
//!
//! A header record (see `encode_record`) is a fixed binary encoding of
//! the header without its id (the key has it) plus the stream version base
//! of the incarnation, so `header` and the store's version fences cost one
//! index read, and every listing is one prefix scan with no lookup per
//! session. A session with a header is never broken: the indexer removes
//! the header when it records `k`.
//!
//! Only `created`, `status_changed`, `forked` and `deleted` events (and the
//! purge marker) are decoded by the indexer. Every session commit updates
//! the header's version and `updated_at_ms` (the commit's timestamp); a
//! commit without those events (an appended entry, a touch) patches these
//! two fields of the stored record in place and rewrites it under the same
//! keys. A purge inside a commit sets the base for the rest of it.
//!
//! A second indexer, [`TranscriptIndexer`] (`transcript`), keeps per-entry
//! records, children, custom-entry lists, labels and the transcript
//! version; see [`transcript`]. With it the store implements
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
//! engine's index *cache* area (key `s` ++ id; value: u64 BE stream
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

pub mod transcript;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use spool_engine::vfs::Vfs;
use spool_engine::{
    AppendOutcome, Durability, EventData, ExpectedVersion, IndexBatch, IndexError, Indexer,
    Options, RecordedCommit, Store,
};

use self::transcript::{DecodeMemo, LogTranscriptSource, TranscriptIndexer};
use super::{ListQuery, LoadCounter, SessionStore, StoreError, StoreStats};
use crate::handle::{AppendReceipt, BoxedSource, ChangeMark, TranscriptBackend, TranscriptHead};
use crate::session::codec::decode_event_without_transcript;
use crate::session::{
    decode_event, decode_snapshot, encode_event, encode_snapshot, AgentSession, AgentSessionInfo,
    SessionEvent, SessionId, SessionInfoList, SessionStatus, SkippedSession,
};
use crate::transcript::resident::entry_size;
use crate::transcript::{EntryId, TranscriptVersion};

/// Name of the engine indexer that keeps session headers.
pub const SESSION_INDEXER: &str = "sessions";
/// Version of the session index layout; bumping it rebuilds the index.
pub const SESSION_INDEX_VERSION: u32 = 2;
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
/// Tag of a snapshot in the cache area (its own key space: `s` there is not the
/// status listing key of the index proper).
const CACHE_SNAPSHOT: u8 = b's';

fn key(tag: u8, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + id.len());
    k.push(tag);
    k.extend_from_slice(id.as_bytes());
    k
}

/// The engine event kind of a session event: [`SESSION_EVENT_PREFIX`] and
/// [`SessionEvent::kind`], built without the formatting machinery (one
/// per appended event: `format!` cost ~700 instructions of an append's
/// ~65 thousand).
pub(crate) fn stored_kind(ev: &SessionEvent) -> String {
    let kind = ev.kind();
    let mut s = String::with_capacity(SESSION_EVENT_PREFIX.len() + kind.len());
    s.push_str(SESSION_EVENT_PREFIX);
    s.push_str(kind);
    s
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
    let mut k = Vec::with_capacity(2 + id.len());
    k.extend_from_slice(&[KEY_STATUS, status_byte(s)]);
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

/// Format byte that starts every header record.
const RECORD_FORMAT: u8 = 1;
/// Offsets in a header record (see [`encode_record`]).
const REC_STATUS: usize = 1;
const REC_FLAGS: usize = 2;
const REC_VERSION: usize = 3;
const REC_BASE: usize = 11;
const REC_CREATED: usize = 19;
const REC_UPDATED: usize = 27;
/// Length of the fixed part, before the parent id.
const REC_FIXED: usize = 35;
/// Flag bit: the record holds a parent id.
const FLAG_PARENT: u8 = 1;

fn status_from_byte(b: u8) -> Option<SessionStatus> {
    SessionStatus::ALL
        .into_iter()
        .find(|s| status_byte(*s) == b)
}

/// The fields of a session header the indexer carries from commit to
/// commit (the version and update time come from each commit).
#[derive(Clone, Debug)]
struct Fields {
    status: SessionStatus,
    parent: Option<String>,
    agent_name: String,
    label: String,
    created_at_ms: i64,
}

/// Encodes a session header record: the header without its id (which is
/// in every key that holds a record) plus the stream version base of its
/// incarnation.
///
/// | bytes | field |
/// | --- | --- |
/// | 1 | format ([`RECORD_FORMAT`]) |
/// | 1 | status byte |
/// | 1 | flags (bit 0: has a parent) |
/// | 8 | u64 BE session version |
/// | 8 | u64 BE stream version base (the purge that ended the previous incarnation, or 0) |
/// | 8 | i64 BE created at (ms) |
/// | 8 | i64 BE updated at (ms) |
/// | 1 + n | u8 length, parent id (only with the parent flag) |
/// | 4 + n | u32 BE length, agent name |
/// | 4 + n | u32 BE length, label |
fn encode_record(
    f: &Fields,
    version: u64,
    updated_at_ms: i64,
    base: u64,
) -> Result<Vec<u8>, String> {
    let agent = f.agent_name.as_bytes();
    let label = f.label.as_bytes();
    let parent = f.parent.as_deref().map(str::as_bytes);
    let len32 = |b: &[u8], what: &str| {
        u32::try_from(b.len()).map_err(|_| format!("{what} of {} bytes is too long", b.len()))
    };
    let (agent_len, label_len) = (len32(agent, "agent name")?, len32(label, "label")?);
    let mut r = Vec::with_capacity(
        REC_FIXED + 1 + parent.map_or(0, <[u8]>::len) + 8 + agent.len() + label.len(),
    );
    r.push(RECORD_FORMAT);
    r.push(status_byte(f.status));
    r.push(if parent.is_some() { FLAG_PARENT } else { 0 });
    r.extend_from_slice(&version.to_be_bytes());
    r.extend_from_slice(&base.to_be_bytes());
    r.extend_from_slice(&f.created_at_ms.to_be_bytes());
    r.extend_from_slice(&updated_at_ms.to_be_bytes());
    if let Some(p) = parent {
        // Session ids are at most SESSION_ID_LEN_MAX (128) bytes.
        let n = u8::try_from(p.len()).map_err(|_| format!("parent id of {} bytes", p.len()))?;
        r.push(n);
        r.extend_from_slice(p);
    }
    r.extend_from_slice(&agent_len.to_be_bytes());
    r.extend_from_slice(agent);
    r.extend_from_slice(&label_len.to_be_bytes());
    r.extend_from_slice(label);
    Ok(r)
}

/// A header record's fields, borrowed from its bytes.
struct RecordView<'a> {
    status: SessionStatus,
    version: u64,
    base: u64,
    created_at_ms: i64,
    updated_at_ms: i64,
    parent: Option<&'a str>,
    agent: &'a str,
    label: &'a str,
}

fn be_i64_at(b: &[u8], at: usize) -> Option<i64> {
    Some(i64::from_be_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads a header record's variable part front to back.
struct Cursor<'a>(&'a [u8]);

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, tail) = self.0.split_at(n);
        self.0 = tail;
        Some(head)
    }

    fn len32(&mut self) -> Option<usize> {
        let a: [u8; 4] = self.take(4)?.try_into().ok()?;
        usize::try_from(u32::from_be_bytes(a)).ok()
    }
}

fn utf8<'a>(s: &'a [u8], what: &str) -> Result<&'a str, String> {
    std::str::from_utf8(s).map_err(|e| format!("header record {what}: {e}"))
}

fn decode_view(b: &[u8]) -> Result<RecordView<'_>, String> {
    let short = || format!("header record of {} bytes is truncated", b.len());
    if b.len() < REC_FIXED {
        return Err(short());
    }
    if b[0] != RECORD_FORMAT {
        return Err(format!(
            "header record format {} (expected {RECORD_FORMAT})",
            b[0]
        ));
    }
    let status = status_from_byte(b[REC_STATUS])
        .ok_or_else(|| format!("header record status byte {}", b[REC_STATUS]))?;
    let flags = b[REC_FLAGS];
    if flags & !FLAG_PARENT != 0 {
        // Only the writer's flags: a record reads back as exactly one
        // encoding (the `index_values` fuzz body checks it byte for byte).
        return Err(format!("header record flags {flags:#04x}"));
    }
    let version = be_u64(&b[REC_VERSION..]).ok_or_else(short)?;
    let base = be_u64(&b[REC_BASE..]).ok_or_else(short)?;
    let created_at_ms = be_i64_at(b, REC_CREATED).ok_or_else(short)?;
    let updated_at_ms = be_i64_at(b, REC_UPDATED).ok_or_else(short)?;
    let mut r = Cursor(&b[REC_FIXED..]);
    let parent = if flags & FLAG_PARENT != 0 {
        let n = r.take(1).ok_or_else(short)?[0] as usize;
        Some(utf8(r.take(n).ok_or_else(short)?, "parent id")?)
    } else {
        None
    };
    let n = r.len32().ok_or_else(short)?;
    let agent = utf8(r.take(n).ok_or_else(short)?, "agent name")?;
    let n = r.len32().ok_or_else(short)?;
    let label = utf8(r.take(n).ok_or_else(short)?, "label")?;
    if !r.0.is_empty() {
        return Err(format!(
            "header record of {} bytes has {} trailing bytes",
            b.len(),
            r.0.len()
        ));
    }
    Ok(RecordView {
        status,
        version,
        base,
        created_at_ms,
        updated_at_ms,
        parent,
        agent,
        label,
    })
}

impl RecordView<'_> {
    fn to_fields(&self) -> Fields {
        Fields {
            status: self.status,
            parent: self.parent.map(str::to_owned),
            agent_name: self.agent.to_owned(),
            label: self.label.to_owned(),
            created_at_ms: self.created_at_ms,
        }
    }

    /// The header of session `id` (and its stream version base).
    fn to_header(&self, id: SessionId) -> Result<(AgentSessionInfo, u64), String> {
        let parent_id = match self.parent {
            Some(p) => Some(SessionId::parse(p).map_err(|e| format!("header record: {e}"))?),
            None => None,
        };
        Ok((
            AgentSessionInfo {
                id,
                parent_id,
                status: self.status,
                version: self.version,
                agent_name: self.agent.to_owned(),
                label: self.label.to_owned(),
                created_at_ms: self.created_at_ms,
                updated_at_ms: self.updated_at_ms,
            },
            self.base,
        ))
    }
}

/// Decodes the header record of session `id`.
fn decode_record(id: SessionId, b: &[u8]) -> Result<(AgentSessionInfo, u64), String> {
    decode_view(b)?.to_header(id)
}

/// A session header record decoded and encoded again, for the
/// `index_values` fuzz body (`spool-tests`): the record is a value of the
/// sled index, bytes on disk, and its encoding is canonical (what decodes
/// re-encodes to the same bytes). It also converts the record to a header,
/// which parses the parent id, for panics only: a parent that does not
/// parse fails that conversion, not this function. Not an API.
#[doc(hidden)]
pub fn header_record_reencoded(b: &[u8]) -> Result<Vec<u8>, String> {
    let v = decode_view(b)?;
    let id = SessionId::parse("fuzz").map_err(|e| e.to_string())?;
    let _ = v.to_header(id);
    encode_record(&v.to_fields(), v.version, v.updated_at_ms, v.base)
}

/// Decodes a header record found under a key whose id part is `id_bytes`.
fn decode_keyed_record(id_bytes: &[u8], b: &[u8]) -> Result<AgentSessionInfo, String> {
    let id = std::str::from_utf8(id_bytes)
        .map_err(|e| format!("session id in the key: {e}"))
        .and_then(|s| SessionId::parse(s).map_err(|e| e.to_string()))?;
    Ok(decode_record(id, b)?.0)
}

pub(crate) fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

/// Maintains the session header index from the log. See the module docs.
///
/// [`SessionIndexer::default`] checks a `created` event's transcript
/// without keeping it; [`SessionIndexer::with_memo`] keeps its decoding
/// for the transcript indexer that shares the memo
/// ([`TranscriptIndexer::with_memo`]), which then does not decode it
/// again. Register the pair in that order, as
/// [`LogStoreOptions::engine_options`] does.
#[derive(Debug, Default)]
pub struct SessionIndexer {
    memo: Option<Arc<DecodeMemo>>,
}

impl SessionIndexer {
    /// A session indexer handing `created` decodings to `memo`.
    pub fn with_memo(memo: Arc<DecodeMemo>) -> Self {
        SessionIndexer { memo: Some(memo) }
    }
}

/// Whether an event of kind `kind` can change a session header beyond its
/// version and update time (the indexer decodes only these).
fn changes_header(kind: &str) -> bool {
    kind == PURGE_EVENT_KIND
        || matches!(
            kind.strip_prefix(SESSION_EVENT_PREFIX),
            Some("created" | "status_changed" | "forked" | "deleted")
        )
}

impl SessionIndexer {
    fn apply_session_commit(
        &self,
        commit: &RecordedCommit,
        batch: &mut IndexBatch<'_>,
    ) -> Result<(), IndexError> {
        let id = commit.info.stream.as_str();
        let bad = |e: String| IndexError::indexer(SESSION_INDEXER, format!("header of {id}: {e}"));
        let hkey = key(KEY_HEADER, id);
        let stored = batch.get(&hkey)?;
        if let Some(mut rec) = stored {
            if !commit.events.iter().any(|e| changes_header(&e.kind)) {
                // Most commits (appended entries, touches) change only the
                // version and the update time: patch the stored record and
                // write it under the same keys (status and parent unchanged).
                let (skey, pkey, base) = {
                    let view = decode_view(&rec).map_err(bad)?;
                    (
                        status_key(view.status, id),
                        view.parent.map(|p| parent_key(p, id)),
                        view.base,
                    )
                };
                let version = commit.info.version.saturating_sub(base);
                rec[REC_VERSION..REC_VERSION + 8].copy_from_slice(&version.to_be_bytes());
                rec[REC_UPDATED..REC_UPDATED + 8]
                    .copy_from_slice(&commit.info.timestamp_ms.to_be_bytes());
                batch.insert(&skey, &rec);
                if let Some(pk) = pkey {
                    batch.insert(&pk, &rec);
                }
                batch.insert(&hkey, &rec);
                return Ok(());
            }
            let view = decode_view(&rec).map_err(bad)?;
            let fields = view.to_fields();
            // A session with a header is not broken (breaking removes it),
            // and its record holds the version base.
            return self.apply_events(commit, batch, Some(fields), view.base, false);
        }
        let base = match batch.get(&key(KEY_PURGED, id))? {
            Some(b) => be_u64(&b).unwrap_or(0),
            None => 0,
        };
        let broken = batch.get(&key(KEY_BROKEN, id))?.is_some();
        self.apply_events(commit, batch, None, base, broken)
    }

    /// The general path: folds the header-changing events of `commit` onto
    /// the stored header `old` and replaces its records and secondary keys.
    fn apply_events(
        &self,
        commit: &RecordedCommit,
        batch: &mut IndexBatch<'_>,
        old: Option<Fields>,
        mut base: u64,
        mut broken: bool,
    ) -> Result<(), IndexError> {
        let id = commit.info.stream.as_str();
        let bkey = key(KEY_BROKEN, id);
        let mut header = old.clone();
        for (i, ev) in commit.events.iter().enumerate() {
            if ev.kind == PURGE_EVENT_KIND {
                header = None;
                broken = false;
                batch.remove(&bkey);
                batch.insert(&key(KEY_PURGED, id), &commit.info.version.to_be_bytes());
                // A later incarnation counts its versions from here.
                base = commit.info.version;
                continue;
            }
            if broken || !changes_header(&ev.kind) {
                continue;
            }
            // Only a `created` event's header is read here: its
            // transcript (most of a fork's bytes) is checked, and kept only
            // for the transcript indexer of this commit.
            let is_created = ev.kind.strip_prefix(SESSION_EVENT_PREFIX) == Some("created");
            let result = match &self.memo {
                // Decoded whole once, for the transcript indexer too.
                Some(memo) if is_created => memo.decode_created(commit, i, &ev.payload),
                _ => decode_event_without_transcript(&ev.payload),
            };
            let decoded = match result {
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
                    parent_id,
                    agent_name,
                    label,
                    created_at_ms,
                    ..
                } => {
                    header = Some(Fields {
                        status: SessionStatus::Active,
                        parent: parent_id.map(String::from),
                        agent_name,
                        label,
                        created_at_ms,
                    });
                }
                SessionEvent::StatusChanged { to, .. } => {
                    if let Some(h) = header.as_mut() {
                        h.status = to;
                    }
                }
                SessionEvent::Forked { from, .. } => {
                    if let Some(h) = header.as_mut() {
                        h.parent = Some(from.into());
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
        let new_skey = header.as_ref().map(|h| status_key(h.status, id));
        let new_pkey = header
            .as_ref()
            .and_then(|h| h.parent.as_deref().map(|p| parent_key(p, id)));
        // Remove the secondary keys of the old header the new one does not keep.
        if let Some(o) = &old {
            let skey = status_key(o.status, id);
            if new_skey.as_ref() != Some(&skey) {
                batch.remove(&skey);
            }
            if let Some(p) = &o.parent {
                let pkey = parent_key(p, id);
                if new_pkey.as_ref() != Some(&pkey) {
                    batch.remove(&pkey);
                }
            }
        }
        let hkey = key(KEY_HEADER, id);
        match &header {
            Some(h) => {
                let version = commit.info.version.saturating_sub(base);
                let rec =
                    encode_record(h, version, commit.info.timestamp_ms, base).map_err(|e| {
                        IndexError::indexer(SESSION_INDEXER, format!("header of {id}: {e}"))
                    })?;
                batch.insert(&hkey, &rec);
                if let Some(k) = &new_skey {
                    batch.insert(k, &rec);
                }
                if let Some(k) = &new_pkey {
                    batch.insert(k, &rec);
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
        if let Some(memo) = &self.memo {
            memo.clear();
        }
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
    /// How long an open waits for another owner to release the store
    /// (engine default, [`spool_engine::LOCK_WAIT_MAX_MS`], when `None`;
    /// zero fails at once with the engine's `Locked`).
    pub lock_wait: Option<std::time::Duration>,
    /// How long the engine's index thread polls for a lone durable writer's
    /// next commit before it sleeps (engine default when `None`: zero, never).
    /// With a window (200 µs was measured) a lone writer's indexers run
    /// during its fdatasync, for a second core kept busy while it commits
    /// back to back. See [`spool_engine::Options::index_thread_poll`].
    pub index_thread_poll: Option<std::time::Duration>,
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
        }
    }
}

impl LogStoreOptions {
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

pub(crate) fn engine_err(e: spool_engine::Error) -> StoreError {
    StoreError::Engine(e)
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

    /// Wraps an engine opened with [`LogStoreOptions::engine_options`] (it
    /// must have the [`SessionIndexer`] and [`TranscriptIndexer`]
    /// registered). [`LogStore::recover`] reopens it with default options.
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
        self.engine()?
            .append_fresh(id.as_str(), expected, events)
            .map_err(engine_err)
    }

    fn read_snapshot(
        &self,
        id: &SessionId,
        base: u64,
        head: u64,
    ) -> Option<(u64, i64, AgentSession)> {
        let decoded = |bytes: &[u8]| {
            let version = be_u64(bytes.get(..8)?)?;
            let updated = i64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
            if version <= base || version > head {
                return None;
            }
            let session = decode_snapshot(bytes.get(16..)?).ok()?;
            Some((version, updated, session))
        };
        let (version, updated, session) = self
            .engine()
            .ok()?
            .index()
            .with_cache(SESSION_INDEXER, &key(CACHE_SNAPSHOT, id.as_str()), decoded)
            .ok()?
            .flatten()?;
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
                    &key(CACHE_SNAPSHOT, session.id().as_str()),
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
        let Some((_, base)) = self.record(id)? else {
            return Ok(None);
        };
        if head <= base {
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
        let meta = transcript::read_meta(engine.index(), id)?.unwrap_or_default();
        Ok(Some(TranscriptHead {
            header,
            version: meta.version(),
            leaf: meta.leaf,
            entries: meta.entries,
        }))
    }

    /// The engine index's change mark: every commit's publication to the
    /// index (before any reader can see it) and every rebuild move it, and
    /// a recovered engine is a new open with marks of its own. `None`
    /// while a rebuild runs or with the store closed.
    fn change_mark(&self) -> Option<ChangeMark> {
        let mark = self.engine().ok()?.index().change_mark();
        mark.is_settled()
            .then(|| ChangeMark::new(mark.instance(), mark.changes()))
    }

    fn source(&self, id: &SessionId) -> Result<BoxedSource<'_>, StoreError> {
        Ok(Box::new(LogTranscriptSource::new(
            self.engine()?,
            id.clone(),
        )))
    }

    fn entry_ids(&self, id: &SessionId) -> Result<Vec<EntryId>, StoreError> {
        transcript::entry_ids(self.engine()?.index(), id)
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
        self.append_transcript_events(id, expected_version, None, events)
    }

    /// The receipt's transcript version follows from `at` and the events
    /// (see `transcript_after`): no index read.
    fn append_events_at(
        &self,
        id: &SessionId,
        expected_version: u64,
        at: TranscriptVersion,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        self.append_transcript_events(id, expected_version, Some(at), events)
    }
}

/// What a commit of `events` does to a session's transcript version, as
/// the transcript indexer records it: every appended entry, leaf move and
/// rewrite counts one raw event and stamps the commit time; a rewrite sets
/// its generation. `None` for commits with other transcript events (their
/// effect is left to a head read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TranscriptStep {
    raw_events: u64,
    generation: Option<u64>,
}

impl TranscriptStep {
    fn of(events: &[SessionEvent]) -> Option<TranscriptStep> {
        let mut step = TranscriptStep {
            raw_events: 0,
            generation: None,
        };
        for ev in events {
            match ev {
                SessionEvent::EntryAppended { .. } | SessionEvent::LeafMoved { .. } => {}
                SessionEvent::TranscriptRewritten { generation, .. } => {
                    step.generation = Some(*generation)
                }
                SessionEvent::Created { .. }
                | SessionEvent::HistoryRewritten { .. }
                | SessionEvent::StateCleared => return None,
                _ => continue,
            }
            step.raw_events = step.raw_events.saturating_add(1);
        }
        Some(step)
    }

    /// The transcript version after the commit, at `timestamp_ms`, onto a
    /// session whose transcript version was `at`.
    fn after(self, at: TranscriptVersion, timestamp_ms: i64) -> TranscriptVersion {
        let mut v = at;
        if let Some(g) = self.generation {
            v.generation = g;
        }
        if self.raw_events > 0 {
            v.raw_seq = v.raw_seq.saturating_add(self.raw_events);
            v.updated_at_ms = timestamp_ms;
        }
        v
    }
}

impl LogStore {
    /// [`TranscriptBackend::append_events`]; `at`: the transcript version
    /// at `expected_version`, when the caller knows it.
    fn append_transcript_events(
        &self,
        id: &SessionId,
        expected_version: u64,
        at: Option<TranscriptVersion>,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        if self.engine()?.is_poisoned() {
            self.recover()?;
        }
        // One index read: the header and the version base. Races with other
        // writers are settled by the version fence of the commit.
        let record = self.record(id)?;
        super::check_append(id, record.as_ref().map(|(h, _)| h), events.is_empty())?;
        let base = record.map_or(0, |(_, base)| base);
        let data = Self::encode_event_list(id, &events)?;
        let step = TranscriptStep::of(&events);
        // The appended entries go to the transcript indexer with their
        // sizes and encodings (see `DecodeMemo`): it indexes them without
        // decoding or measuring them again. The registration is withdrawn
        // when `_handed` drops, whatever the append's outcome.
        let mut entry_sizes = Vec::new();
        let mut handed = Vec::new();
        for (ev, d) in events.into_iter().zip(&data) {
            if let SessionEvent::EntryAppended { entry } = ev {
                let size = entry_size(&entry);
                entry_sizes.push(size);
                handed.push((d.payload.clone(), entry, size));
            }
        }
        let _handed = self.memo.hand_over(id.as_str(), handed);
        match self.append(id, ExpectedVersion::Exact(base + expected_version), data)? {
            AppendOutcome::Committed(info) => Ok(AppendReceipt {
                session_version: info.version - base,
                updated_at_ms: info.timestamp_ms,
                // The fence held: the commit applied to the state at
                // `expected_version`, whose transcript version was `at`.
                transcript: at
                    .zip(step)
                    .map(|(at, step)| step.after(at, info.timestamp_ms)),
                entry_sizes,
            }),
            AppendOutcome::AlreadyCommitted(info) => Ok(AppendReceipt {
                session_version: info.version - base,
                updated_at_ms: info.timestamp_ms,
                transcript: None,
                entry_sizes,
            }),
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
            let events = vec![EventData::new(PURGE_EVENT_KIND, Vec::new())];
            match self.append(id, ExpectedVersion::Exact(base + h.version), events)? {
                AppendOutcome::Committed(_) | AppendOutcome::AlreadyCommitted(_) => {
                    let _ = self
                        .engine()?
                        .index()
                        .remove_cache(SESSION_INDEXER, &key(CACHE_SNAPSHOT, id.as_str()));
                    return Ok(true);
                }
                // A concurrent save moved the head: purge the newer version.
                AppendOutcome::Conflict { .. } => continue,
                #[allow(unreachable_patterns)]
                _ => return Ok(false),
            }
        }
    }

    /// One prefix scan: the status, parent and header keys all hold the
    /// header record, so no header is looked up by id.
    fn list_headers(&self, query: &ListQuery) -> Result<SessionInfoList, StoreError> {
        let engine = self.engine()?;
        let index = engine.index();
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
        // Sessions whose stored events do not decode are reported, not listed.
        for kv in index.scan_prefix(SESSION_INDEXER, &[KEY_BROKEN]) {
            let (k, v) = kv.map_err(engine_err)?;
            skipped.push(SkippedSession {
                location: format!(
                    "log:{}",
                    String::from_utf8_lossy(k.get(1..).unwrap_or_default())
                ),
                reason: String::from_utf8_lossy(&v).into_owned(),
            });
        }
        let mut list = query.apply(headers)?;
        list.skipped.extend(skipped);
        Ok(list)
    }

    fn header(&self, id: &SessionId) -> Result<Option<AgentSessionInfo>, StoreError> {
        Ok(self.record(id)?.map(|(h, _)| h))
    }

    fn stats(&self) -> StoreStats {
        self.loads.stats()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What every reader of the log matches on: the prefix, then the kind.
    #[test]
    fn a_stored_kind_is_the_prefix_then_the_event_kind() {
        for ev in [
            SessionEvent::Touched,
            SessionEvent::Deleted,
            SessionEvent::StateCleared,
        ] {
            assert_eq!(
                stored_kind(&ev),
                format!("{SESSION_EVENT_PREFIX}{}", ev.kind())
            );
        }
        assert_eq!(stored_kind(&SessionEvent::Touched), "session.touched");
    }

    fn fields(parent: Option<&str>) -> Fields {
        Fields {
            status: SessionStatus::Suspended,
            parent: parent.map(str::to_owned),
            agent_name: "planner".into(),
            label: "Plan the trip ✈".into(),
            created_at_ms: -5,
        }
    }

    #[test]
    fn header_records_round_trip() {
        for parent in [None, Some("p-1"), Some(&"x".repeat(128)[..])] {
            let f = fields(parent);
            let rec = encode_record(&f, 7, i64::MAX, 3).unwrap();
            let id = SessionId::parse("s-1").unwrap();
            let (h, base) = decode_record(id.clone(), &rec).unwrap();
            assert_eq!(base, 3);
            assert_eq!(
                h,
                AgentSessionInfo {
                    id,
                    parent_id: parent.map(|p| SessionId::parse(p).unwrap()),
                    status: SessionStatus::Suspended,
                    version: 7,
                    agent_name: "planner".into(),
                    label: "Plan the trip ✈".into(),
                    created_at_ms: -5,
                    updated_at_ms: i64::MAX,
                }
            );
            let v = decode_view(&rec).unwrap();
            assert_eq!(v.parent, parent);
            assert_eq!(v.to_fields().label, f.label);
        }
    }

    /// The layout is fixed (big-endian, explicit lengths): a change of it
    /// must come with a new SESSION_INDEX_VERSION.
    #[test]
    fn header_record_layout_is_stable() {
        let rec = encode_record(&fields(Some("p")), 0x0102, 0x0304, 0x0506).unwrap();
        let mut want = vec![RECORD_FORMAT, 2, FLAG_PARENT];
        want.extend_from_slice(&0x0102u64.to_be_bytes());
        want.extend_from_slice(&0x0506u64.to_be_bytes());
        want.extend_from_slice(&(-5i64).to_be_bytes());
        want.extend_from_slice(&0x0304i64.to_be_bytes());
        want.extend_from_slice(&[1, b'p']);
        want.extend_from_slice(&7u32.to_be_bytes());
        want.extend_from_slice(b"planner");
        want.extend_from_slice(&("Plan the trip ✈".len() as u32).to_be_bytes());
        want.extend_from_slice("Plan the trip ✈".as_bytes());
        assert_eq!(rec, want);
    }

    #[test]
    fn damaged_header_records_are_errors_not_panics() {
        let rec = encode_record(&fields(Some("parent")), 1, 2, 0).unwrap();
        let id = || SessionId::parse("s").unwrap();
        // Every truncation, and one trailing byte.
        for n in 0..rec.len() {
            assert!(decode_record(id(), &rec[..n]).is_err(), "truncated to {n}");
        }
        let mut long = rec.clone();
        long.push(0);
        assert!(decode_record(id(), &long).is_err());
        // Another format, an unknown status, an unknown flag, an oversized
        // length, bad UTF-8, a parent that is not a session id.
        let mut bad = rec.clone();
        bad[0] = RECORD_FORMAT + 1;
        assert!(decode_record(id(), &bad).is_err());
        for flag in 1..8 {
            let mut bad = rec.clone();
            bad[REC_FLAGS] |= 1 << flag;
            assert!(decode_record(id(), &bad).is_err(), "flag bit {flag}");
        }
        let mut bad = rec.clone();
        bad[REC_STATUS] = 0;
        assert!(decode_record(id(), &bad).is_err());
        let agent_len = REC_FIXED + 1 + "parent".len();
        let mut bad = rec.clone();
        bad[agent_len..agent_len + 4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_record(id(), &bad).is_err());
        let mut bad = rec.clone();
        bad[agent_len + 4] = 0xff;
        assert!(decode_record(id(), &bad).is_err());
        let mut bad = rec.clone();
        bad[REC_FIXED + 1] = b' ';
        assert!(decode_record(id(), &bad).is_err());
        // Flipping any single byte never panics.
        for i in 0..rec.len() {
            let mut b = rec.clone();
            b[i] ^= 0xa5;
            let _ = decode_record(id(), &b);
        }
        // A key whose id part is not a session id.
        assert!(decode_keyed_record(b"not an id", &rec).is_err());
        assert!(decode_keyed_record(&[0xff], &rec).is_err());
    }

    #[test]
    fn only_header_events_take_the_general_path() {
        for k in ["created", "status_changed", "forked", "deleted"] {
            assert!(changes_header(&format!("{SESSION_EVENT_PREFIX}{k}")));
        }
        assert!(changes_header(PURGE_EVENT_KIND));
        for k in ["entry_appended", "touched", "leaf_moved", "model_changed"] {
            assert!(!changes_header(&format!("{SESSION_EVENT_PREFIX}{k}")));
        }
        assert!(!changes_header("created"));
    }

    fn user(text: &str) -> crate::transcript::EntryKind {
        use crate::transcript::{ContentBlock, EntryKind, Message};
        EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(text)],
            },
        }
    }

    /// Every listing path (all headers, by status, by parent) answers
    /// with exactly what `header` answers, through appends (the patched
    /// record), saves, status changes, tombstones, purges and re-creates.
    fn assert_listings_match_headers(store: &LogStore, ids: &[&SessionId]) {
        let all = store
            .list_headers(&ListQuery::all().including_deleted())
            .unwrap();
        assert!(all.skipped.is_empty(), "{:?}", all.skipped);
        let mut listed = 0;
        for id in ids {
            let Some(h) = store.header(id).unwrap() else {
                assert!(all.headers.iter().all(|l| &l.id != *id));
                continue;
            };
            listed += 1;
            assert_eq!(all.headers.iter().find(|l| &l.id == *id), Some(&h));
            for st in SessionStatus::ALL {
                let by_status = store
                    .list_headers(&ListQuery::all().with_status(st))
                    .unwrap();
                let found = by_status.headers.iter().find(|l| &l.id == *id);
                assert_eq!(found, (h.status == st).then_some(&h), "status {st}");
            }
            if let Some(p) = &h.parent_id {
                let kids = store
                    .list_headers(&ListQuery::all().children_of(p.clone()).including_deleted())
                    .unwrap();
                assert_eq!(kids.headers.iter().find(|l| &l.id == *id), Some(&h));
            }
        }
        assert_eq!(all.headers.len(), listed);
    }

    #[test]
    fn secondary_keys_follow_every_header_change() {
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
        let def = crate::session::AgentDefinition::new("a", "d", "p");
        let mut parent = AgentSession::new(def, None);
        parent.append(user("one")).unwrap();
        let parent = store.create(parent).unwrap();
        let child = store.create(parent.fork(None).unwrap()).unwrap();
        let (pid, cid) = (parent.id().clone(), child.id().clone());
        assert_listings_match_headers(&store, &[&pid, &cid]);
        // Appends: only the version and update time change.
        let mut v = child.version();
        for i in 0..5 {
            v = store
                .append_events(&cid, v, vec![SessionEvent::Touched, SessionEvent::Touched])
                .unwrap()
                .session_version;
            assert_eq!(v, 2 + i);
            assert_listings_match_headers(&store, &[&pid, &cid]);
        }
        // A status change moves the status key.
        let mut c = store.load(&cid).unwrap().unwrap();
        c.set_status(SessionStatus::Completed).unwrap();
        let c = store.save(c).unwrap();
        assert_listings_match_headers(&store, &[&pid, &cid]);
        assert!(store
            .list_headers(&ListQuery::all().with_status(SessionStatus::Active))
            .unwrap()
            .ids()
            .iter()
            .all(|id| id != &cid));
        // A tombstone, then appends are refused.
        let mut c = c;
        c.set_status(SessionStatus::Deleted).unwrap();
        let c = store.save(c).unwrap();
        assert_listings_match_headers(&store, &[&pid, &cid]);
        assert!(matches!(
            store.append_events(&cid, c.version(), vec![SessionEvent::Touched]),
            Err(StoreError::InvalidSession { .. })
        ));
        assert!(matches!(
            store.append_events(&cid, c.version() - 1, vec![SessionEvent::Touched]),
            Err(StoreError::InvalidSession { .. })
        ));
        // A purge removes every key; a re-create counts versions from 1
        // again, with fences on the new incarnation.
        assert!(store.delete(&cid).unwrap());
        assert_eq!(store.header(&cid).unwrap(), None);
        assert!(matches!(
            store.append_events(&cid, 1, vec![SessionEvent::Touched]),
            Err(StoreError::NotFound { .. })
        ));
        assert_listings_match_headers(&store, &[&pid, &cid]);
        let again = store.create(parent.fork(None).unwrap()).unwrap();
        let def = crate::session::AgentDefinition::new("b", "d", "p");
        let reborn = store
            .create(AgentSession::new_with_id(cid.clone(), def, None))
            .unwrap();
        assert_eq!(reborn.version(), 1);
        let r = store
            .append_events(&cid, 1, vec![SessionEvent::Touched])
            .unwrap();
        assert_eq!(r.session_version, 2);
        assert!(matches!(
            store.append_events(&cid, 1, vec![SessionEvent::Touched]),
            Err(StoreError::Conflict {
                expected: 1,
                actual: 2,
                ..
            })
        ));
        let h = store.header(&cid).unwrap().unwrap();
        assert_eq!(
            (h.version, h.parent_id.as_ref(), h.agent_name.as_str()),
            (2, None, "b")
        );
        assert_eq!(store.load(&cid).unwrap().unwrap().version(), 2);
        assert_listings_match_headers(&store, &[&pid, &cid, again.id()]);
        // The rebuilt index answers the same.
        let before = store
            .list_headers(&ListQuery::all().including_deleted())
            .unwrap();
        store.close().unwrap();
        std::fs::remove_dir_all(dir.path().join(spool_engine::INDEX_DIR)).unwrap();
        let store = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
        assert_eq!(
            store
                .list_headers(&ListQuery::all().including_deleted())
                .unwrap(),
            before
        );
        assert_listings_match_headers(&store, &[&pid, &cid, again.id()]);
    }
}
