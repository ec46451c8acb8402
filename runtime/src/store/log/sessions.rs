//! The session index of the log store (engine indexer `sessions`): header
//! records keyed by id, status and parent, their binary encoding, and the
//! [`SessionIndexer`] that keeps them from the log. It never reads or
//! writes transcripts.
//!
//! # Keys
//!
//! Maintained from the log by [`SessionIndexer`], in the same atomic sled
//! batch as the engine's own stream heads, and rebuilt from the log like
//! them (deleting `DIR/index/` loses nothing). The keys (by id, status and
//! parent, purges, broken sessions) and the header record's bytes are in
//! docs/format.md, "Indexer `sessions`".
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

use std::sync::Arc;

use spool_engine::{IndexBatch, IndexError, Indexer, RecordedCommit};

use super::engine_err;
use super::transcript::DecodeMemo;
use super::{
    be_u64, PURGE_EVENT_KIND, SESSION_EVENT_PREFIX, SESSION_INDEXER, SESSION_INDEX_VERSION,
};
use crate::session::codec::{decode_event_without_transcript, is_transcript_kind};
use crate::session::{
    AgentSessionInfo, SessionEvent, SessionId, SessionInfoList, SessionStatus, SkippedSession,
};
use crate::store::{ListOrder, ListQuery, SortDirection, StoreError};

pub(super) const KEY_HEADER: u8 = b'h';

pub(super) const KEY_STATUS: u8 = b's';

const KEY_PARENT: u8 = b'p';

pub(super) const KEY_PURGED: u8 = b'x';

/// A session whose stored events do not decode: value is the reason.
pub(super) const KEY_BROKEN: u8 = b'k';

/// Headers newest first: the key orders as a listing by update time,
/// descending, does (see [`updated_key`]); the value is the header record.
pub(super) const KEY_UPDATED: u8 = b'u';

/// The number of headers with a status (`n` + status byte → u64 BE): a
/// listing's total without counting the headers.
const KEY_COUNT: u8 = b'n';

/// The key of a header under [`KEY_UPDATED`]: the update time, then the
/// id, both so that ascending keys are descending `(updated_at_ms, id)`,
/// the order `ListQuery` gives newest first (ties: greater id first).
/// Time: the sign bit flipped (signed order as unsigned), then every bit
/// inverted. Id: every byte inverted (`255 - b`), then `0xFF`; ids are
/// ASCII, so no inverted byte is `0xFF` and a shorter id that is a prefix
/// of a longer one sorts after it, as it must in descending order.
pub(super) fn updated_key(updated_at_ms: i64, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + 8 + id.len() + 1);
    k.push(KEY_UPDATED);
    let ordered = (updated_at_ms as u64) ^ (1 << 63);
    k.extend_from_slice(&(!ordered).to_be_bytes());
    k.extend(id.bytes().map(|b| 255 - b));
    k.push(0xFF);
    k
}

/// The id bytes of an [`updated_key`] (`None`: not such a key).
pub(super) fn id_of_updated_key(k: &[u8]) -> Option<Vec<u8>> {
    let inverted = k.get(9..)?.strip_suffix(&[0xFF])?;
    Some(inverted.iter().map(|b| 255 - b).collect())
}

fn count_key(s: SessionStatus) -> [u8; 2] {
    [KEY_COUNT, status_byte(s)]
}

/// The number of headers with status `s`, as the index holds it.
pub(super) fn header_count(
    index: &spool_engine::Index,
    s: SessionStatus,
) -> Result<u64, spool_engine::Error> {
    Ok(index
        .get(SESSION_INDEXER, &count_key(s))?
        .and_then(|v| be_u64(&v))
        .unwrap_or(0))
}

/// Adds `delta` to the count of headers with status `s`.
fn add_count(batch: &mut IndexBatch<'_>, s: SessionStatus, delta: i64) -> Result<(), IndexError> {
    let k = count_key(s);
    let n = batch.get(&k)?.and_then(|v| be_u64(&v)).unwrap_or(0);
    let n = n.checked_add_signed(delta).ok_or_else(|| {
        IndexError::indexer(
            SESSION_INDEXER,
            format!(
                "header count of status {} would leave 0..=u64::MAX",
                s.as_str()
            ),
        )
    })?;
    batch.insert(&k, &n.to_be_bytes());
    Ok(())
}

/// The commits a settings fold reads (see [`is_settings_kind`]): `c`, the
/// id, a zero byte (never in an id), then a block number (u64 BE) → a bitmap
/// of the block's 64 stream versions (u64 BE; bit `i` is version
/// `64 · block + 1 + i`). A block with none has no key, so a session written
/// by transcript appends alone has one key, for its `created` commit.
pub(super) const KEY_SETTINGS_COMMITS: u8 = b'c';

/// Stream versions per [`KEY_SETTINGS_COMMITS`] key.
pub(super) const SETTINGS_BLOCK_VERSIONS: u64 = 64;

/// Whether a settings fold reads an event of engine kind `kind`: a session
/// event that is not a transcript event.
pub(super) fn is_settings_kind(kind: &str) -> bool {
    kind.strip_prefix(SESSION_EVENT_PREFIX)
        .is_some_and(|k| !is_transcript_kind(k))
}

/// The prefix of session `id`'s [`KEY_SETTINGS_COMMITS`] keys.
pub(super) fn settings_commits_prefix(id: &str) -> Vec<u8> {
    let mut k = key(KEY_SETTINGS_COMMITS, id);
    k.push(0);
    k
}

/// The [`KEY_SETTINGS_COMMITS`] key of the block holding `version` (from 1),
/// and the version's bit in it.
pub(super) fn settings_commits_key(id: &str, version: u64) -> (Vec<u8>, u64) {
    let at = version.saturating_sub(1);
    let mut k = settings_commits_prefix(id);
    k.extend_from_slice(&(at / SETTINGS_BLOCK_VERSIONS).to_be_bytes());
    (k, 1 << (at % SETTINGS_BLOCK_VERSIONS))
}

/// Marks `commit` in its session's [`KEY_SETTINGS_COMMITS`] bitmap when it
/// holds an event a settings fold reads.
fn note_settings_commit(
    commit: &RecordedCommit,
    batch: &mut IndexBatch<'_>,
) -> Result<(), IndexError> {
    if !commit.events.iter().any(|e| is_settings_kind(&e.kind)) {
        return Ok(());
    }
    let (k, bit) = settings_commits_key(&commit.info.stream, commit.info.version);
    let bits = batch.get(&k)?.and_then(|v| be_u64(&v)).unwrap_or(0);
    batch.insert(&k, &(bits | bit).to_be_bytes());
    Ok(())
}

pub(super) fn key(tag: u8, id: &str) -> Vec<u8> {
    let mut k = Vec::with_capacity(1 + id.len());
    k.push(tag);
    k.extend_from_slice(id.as_bytes());
    k
}

/// The engine event kind of a session event: [`SESSION_EVENT_PREFIX`] and
/// [`SessionEvent::kind`], built without the formatting machinery (one
/// per appended event, where `format!` was a visible part of an append).
pub(crate) fn stored_kind(ev: &SessionEvent) -> String {
    let kind = ev.kind();
    let mut s = String::with_capacity(SESSION_EVENT_PREFIX.len() + kind.len());
    s.push_str(SESSION_EVENT_PREFIX);
    s.push_str(kind);
    s
}

pub(super) fn status_byte(s: SessionStatus) -> u8 {
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

pub(super) fn parent_prefix(parent: &str) -> Vec<u8> {
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
/// incarnation. The layout (starting with [`RECORD_FORMAT`]) is in
/// docs/format.md, "Indexer `sessions`", header record.
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
pub(super) fn decode_record(id: SessionId, b: &[u8]) -> Result<(AgentSessionInfo, u64), String> {
    decode_view(b)?.to_header(id)
}

/// A session header record decoded and encoded again, for the
/// `index_values` fuzz body (`spool-tests`): the record is a value of the
/// sled index, bytes on disk, and its encoding is canonical (what decodes
/// re-encodes to the same bytes). It also converts the record to a header,
/// which parses the parent id, for panics only: a parent that does not
/// parse fails that conversion, not this function. Not an API.
#[cfg_attr(not(feature = "fuzzing"), allow(dead_code))]
pub fn header_record_reencoded(b: &[u8]) -> Result<Vec<u8>, String> {
    let v = decode_view(b)?;
    let id = SessionId::parse("fuzz").map_err(|e| e.to_string())?;
    let _ = v.to_header(id);
    encode_record(&v.to_fields(), v.version, v.updated_at_ms, v.base)
}

/// Decodes a header record found under a key whose id part is `id_bytes`.
pub(super) fn decode_keyed_record(id_bytes: &[u8], b: &[u8]) -> Result<AgentSessionInfo, String> {
    let id = std::str::from_utf8(id_bytes)
        .map_err(|e| format!("session id in the key: {e}"))
        .and_then(|s| SessionId::parse(s).map_err(|e| e.to_string()))?;
    Ok(decode_record(id, b)?.0)
}

/// A listing newest first (by update time, descending) without a status,
/// agent or parent filter, the default and the one `spool sessions` asks:
/// one range scan of [`KEY_UPDATED`] from the cursor that stops after the
/// page, and the total from the per-status counts, so its cost is the
/// page's, not the number of sessions. `Ok(None)` for every other query,
/// which takes the scan of its filter's prefix (a status filter reads only
/// that status's headers there, where this scan would step over every
/// other status's). Answers exactly as `ListQuery::apply` over all headers
/// would (tested against it).
pub(super) fn list_newest_first(
    index: &spool_engine::Index,
    query: &ListQuery,
) -> Result<Option<SessionInfoList>, StoreError> {
    if query.order != ListOrder::UpdatedAt
        || query.direction != SortDirection::Descending
        || query.status.is_some()
        || query.agent.is_some()
        || query.parent.is_some()
    {
        return Ok(None);
    }
    let after = query.checked_after()?;
    let mut total = 0u64;
    for s in SessionStatus::ALL {
        if s != SessionStatus::Deleted || query.include_deleted {
            total = total.saturating_add(header_count(index, s).map_err(engine_err)?);
        }
    }
    let from = match &after {
        Some((t, id)) => updated_key(*t, id),
        None => vec![KEY_UPDATED],
    };
    let mut skip = query.offset;
    let want = query.limit.unwrap_or(u64::MAX);
    let mut list = SessionInfoList {
        total,
        ..SessionInfoList::default()
    };
    let mut more = false;
    index
        .visit_range(SESSION_INDEXER, &[KEY_UPDATED], &from, |k, v| {
            if after.is_some() && k == from.as_slice() {
                // The cursor's own header: the page starts after it.
                return true;
            }
            let id = id_of_updated_key(k).unwrap_or_default();
            let h = match decode_keyed_record(&id, v) {
                Ok(h) => h,
                Err(reason) => {
                    list.skipped.push(SkippedSession {
                        location: format!("index:{}", String::from_utf8_lossy(&id)),
                        reason,
                    });
                    return true;
                }
            };
            if !query.matches(&h) {
                return true;
            }
            if skip > 0 {
                skip -= 1;
                return true;
            }
            if list.headers.len() as u64 >= want {
                more = true;
                return false;
            }
            list.headers.push(h);
            true
        })
        .map_err(engine_err)?;
    if more && !list.headers.is_empty() {
        list.next_cursor = list.headers.last().map(|h| query.encode_cursor(h));
    }
    Ok(Some(list))
}

/// Maintains the session header index from the log. See the module docs.
///
/// [`SessionIndexer::default`] checks a `created` event's transcript
/// without keeping it; [`SessionIndexer::with_memo`] keeps its decoding
/// for the transcript indexer that shares the memo
/// ([`TranscriptIndexer::with_memo`](crate::store::log::transcript::TranscriptIndexer::with_memo)), which then does not decode it
/// again. Register the pair in that order, as
/// [`LogStoreOptions::engine_options`](crate::store::LogStoreOptions::engine_options) does.
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
                let (skey, pkey, base, old_updated) = {
                    let view = decode_view(&rec).map_err(bad)?;
                    (
                        status_key(view.status, id),
                        view.parent.map(|p| parent_key(p, id)),
                        view.base,
                        view.updated_at_ms,
                    )
                };
                let version = commit.info.version.saturating_sub(base);
                let updated = commit.info.timestamp_ms;
                rec[REC_VERSION..REC_VERSION + 8].copy_from_slice(&version.to_be_bytes());
                rec[REC_UPDATED..REC_UPDATED + 8].copy_from_slice(&updated.to_be_bytes());
                batch.insert(&skey, &rec);
                if let Some(pk) = pkey {
                    batch.insert(&pk, &rec);
                }
                if old_updated != updated {
                    batch.remove(&updated_key(old_updated, id));
                }
                batch.insert(&updated_key(updated, id), &rec);
                batch.insert(&hkey, &rec);
                return Ok(());
            }
            let view = decode_view(&rec).map_err(bad)?;
            let old = (view.to_fields(), view.updated_at_ms);
            // A session with a header is not broken (breaking removes it),
            // and its record holds the version base.
            return self.apply_events(commit, batch, Some(old), view.base, false);
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
        old: Option<(Fields, i64)>,
        mut base: u64,
        mut broken: bool,
    ) -> Result<(), IndexError> {
        let id = commit.info.stream.as_str();
        let bkey = key(KEY_BROKEN, id);
        let old_updated = old.as_ref().map(|(_, u)| *u);
        let old = old.map(|(f, _)| f);
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
            if let Some(u) =
                old_updated.filter(|u| header.is_none() || *u != commit.info.timestamp_ms)
            {
                batch.remove(&updated_key(u, id));
            }
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
                batch.insert(&updated_key(commit.info.timestamp_ms, id), &rec);
                if let Some(k) = &new_skey {
                    batch.insert(k, &rec);
                }
                if let Some(k) = &new_pkey {
                    batch.insert(k, &rec);
                }
            }
            None => batch.remove(&hkey),
        }
        let (was, now) = (
            old.as_ref().map(|o| o.status),
            header.as_ref().map(|h| h.status),
        );
        if was != now {
            if let Some(s) = was {
                add_count(batch, s, -1)?;
            }
            if let Some(s) = now {
                add_count(batch, s, 1)?;
            }
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
        note_settings_commit(commit, batch)?;
        self.apply_session_commit(commit, batch)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::AgentSession;
    use crate::store::log::{LogStore, LogStoreOptions};
    use crate::store::TranscriptBackend;
    use crate::store::{ListQuery, SessionStore, StoreError};

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

    /// A delete of a session whose stream another writer went on with (a
    /// commit that is not the session's after its last) fails saying so,
    /// instead of retrying its purge for ever, and purges nothing.
    #[test]
    fn a_delete_refuses_a_stream_another_writer_went_on_with() {
        use spool_engine::{AppendOutcome, EventData, ExpectedVersion, NewCommit};
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
        let def = crate::session::AgentDefinition::new("a", "d", "p");
        let id = store
            .create(AgentSession::new(def, None))
            .unwrap()
            .id()
            .clone();
        let engine = store.engine().unwrap();
        let head = engine.stream_version(id.as_str()).unwrap().unwrap();
        let foreign = NewCommit::new(
            id.as_str(),
            ExpectedVersion::Exact(head),
            vec![EventData::new("foreign", b"x".to_vec())],
        );
        assert!(matches!(
            engine.append(foreign).unwrap(),
            AppendOutcome::Committed(_)
        ));
        match store.delete(&id) {
            Err(StoreError::InvalidSession { reason, .. }) => {
                assert!(reason.contains("not the session's"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
        assert!(store.header(&id).unwrap().is_some());
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
        assert_newest_first_listing_matches(store, ids);
    }

    /// The newest-first listing (a range scan of `u` keys, totals from the
    /// counts) answers every query exactly as `ListQuery::apply` over every
    /// header: pages, offsets, totals, cursors followed to the end.
    fn assert_newest_first_listing_matches(store: &LogStore, ids: &[&SessionId]) {
        let headers: Vec<AgentSessionInfo> = ids
            .iter()
            .filter_map(|id| store.header(id).unwrap())
            .collect();
        let index_owner = store.engine().unwrap();
        let index = index_owner.index();
        assert!(
            list_newest_first(index, &ListQuery::all().with_status(SessionStatus::Active))
                .unwrap()
                .is_none()
        );
        for q in [ListQuery::all(), ListQuery::all().including_deleted()] {
            for (offset, limit) in [(0, None), (0, Some(1)), (1, Some(2)), (3, Some(3))] {
                let mut q = q.clone();
                q.offset = offset;
                q.limit = limit;
                let mut pages = 0;
                loop {
                    let want = q.apply(headers.clone()).unwrap();
                    let got = list_newest_first(index, &q).unwrap().expect("fast path");
                    assert_eq!(got, want, "{q:?}");
                    match want.next_cursor {
                        Some(c) => {
                            q.offset = 0;
                            q.cursor = Some(c);
                        }
                        None => break,
                    }
                    pages += 1;
                    assert!(pages <= ids.len(), "cursors do not advance: {q:?}");
                }
            }
        }
    }

    /// Random header changes with many update-time ties (commits in the
    /// same millisecond) and ids that are prefixes of one another: the
    /// newest-first listing always answers as `apply` does, also after the
    /// index is rebuilt from the log.
    #[test]
    fn the_newest_first_listing_answers_as_a_sort_of_every_header() {
        for seed in [1u64, 7, 0x5eed] {
            println!("seed {seed:#x}");
            let mut rng = seed;
            let mut next = |n: u64| {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (rng >> 33) % n
            };
            let dir = tempfile::tempdir().unwrap();
            let store = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
            let names = ["a", "ab", "abc", "b", "b-", "B", "z_9", "a0", "ab-x"];
            let ids: Vec<SessionId> = names.iter().map(|n| SessionId::parse(n).unwrap()).collect();
            let refs: Vec<&SessionId> = ids.iter().collect();
            for step in 0..120 {
                let id = &ids[next(ids.len() as u64) as usize];
                let Some(h) = store.header(id).unwrap() else {
                    let def = crate::session::AgentDefinition::new("a", "d", "p");
                    let _ = store.create(AgentSession::new_with_id(id.clone(), def, None));
                    continue;
                };
                match next(8) {
                    0..=3 => {
                        let _ = store.append_events(id, h.version, vec![SessionEvent::Touched]);
                    }
                    4 | 5 => {
                        let mut sess = store.load(id).unwrap().unwrap();
                        let to = SessionStatus::ALL[next(4) as usize];
                        if sess.set_status(to).is_ok() {
                            let _ = store.save(sess);
                        }
                    }
                    6 => {
                        let mut sess = store.load(id).unwrap().unwrap();
                        if sess.set_status(SessionStatus::Deleted).is_ok() {
                            let _ = store.save(sess);
                        }
                    }
                    _ => {
                        store.delete(id).unwrap();
                    }
                }
                if step % 10 == 9 {
                    assert_newest_first_listing_matches(&store, &refs);
                }
            }
            assert_newest_first_listing_matches(&store, &refs);
            store.close().unwrap();
            std::fs::remove_dir_all(dir.path().join(spool_engine::INDEX_DIR)).unwrap();
            std::fs::remove_dir_all(dir.path().join(spool_engine::CHECKPOINT_DIR)).unwrap();
            let store = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
            assert_newest_first_listing_matches(&store, &refs);
        }
    }

    #[test]
    fn updated_keys_order_as_a_newest_first_listing() {
        let mut pairs = vec![
            (i64::MIN, "a"),
            (-1, "a"),
            (0, "a"),
            (0, "ab"),
            (0, "b"),
            (1, "A"),
            (i64::MAX, "z"),
        ];
        // Descending (time, id) is ascending key order.
        pairs.sort_by(|a, b| (b.0, b.1).cmp(&(a.0, a.1)));
        let keys: Vec<Vec<u8>> = pairs.iter().map(|(t, id)| updated_key(*t, id)).collect();
        assert!(keys.windows(2).all(|w| w[0] < w[1]), "{pairs:?}");
        for ((_, id), k) in pairs.iter().zip(&keys) {
            assert_eq!(id_of_updated_key(k).unwrap(), id.as_bytes());
        }
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
        std::fs::remove_dir_all(dir.path().join(spool_engine::CHECKPOINT_DIR)).unwrap();
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
