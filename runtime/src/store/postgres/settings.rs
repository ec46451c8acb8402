//! The settings fold of the PostgreSQL store: a session at its head folded
//! without its transcript ([`TranscriptBackend::settings`]), which the
//! runtime's execute pairs with the handles' resident working set instead
//! of a full load.
//!
//! The fold reads `spool_commits` in version ranges of
//! [`LOAD_BATCH_COMMITS`] commits inside one read-only REPEATABLE READ
//! transaction (so a concurrent commit is either wholly in it or not at
//! all), and the server drops the transcript events
//! ([`TRANSCRIPT_EVENT_KINDS`], the same the log store's settings fold
//! skips) from each commit's `payloads` before sending them: only the
//! other events cross the connection and are decoded
//! ([`decode_event_without_transcript`], which drops a `created` event's
//! seed transcript). The stored snapshots hold transcripts, so the fold
//! does not start from them; it starts from the store's in-process cache
//! of the last folds ([`SettingsCache`]) when the commit the cached fold
//! ends at is still there, else from the first commit.
//!
//! [`TranscriptBackend::settings`]: crate::store::backend::TranscriptBackend::settings

use std::collections::HashMap;
use std::sync::Mutex;

use postgres::{Client, IsolationLevel};
use uuid::Uuid;

use super::{version_from_sql, Fail, PostgresStore, LOAD_BATCH_COMMITS};
use crate::session::codec::{decode_event_without_transcript, TRANSCRIPT_EVENT_KINDS};
use crate::session::{AgentSession, SessionId};
use crate::store::StoreError;

/// Sessions whose last settings fold a store keeps.
const SETTINGS_CACHE_SESSIONS: usize = 64;

/// One session's settings fold at `version`, the commit of that version.
#[derive(Clone)]
struct Cached {
    version: i64,
    commit: Uuid,
    updated_at_ms: i64,
    session: AgentSession,
}

/// The last settings folds of a store, at most
/// [`SETTINGS_CACHE_SESSIONS`] sessions (settings only, no transcripts).
/// A cached fold is used only while the commit it ends at (session,
/// version, commit id) is stored, the rule the store's snapshots follow:
/// commits are never changed in place, and a purged session's commits are
/// gone with it.
#[derive(Default)]
pub(super) struct SettingsCache {
    folds: Mutex<HashMap<SessionId, Cached>>,
}

impl SettingsCache {
    fn get(&self, id: &SessionId) -> Option<Cached> {
        let folds = self.folds.lock().unwrap_or_else(|e| e.into_inner());
        folds.get(id).cloned()
    }

    fn put(&self, id: &SessionId, fold: Cached) {
        let mut folds = self.folds.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(old) = folds.get(id) {
            if old.version >= fold.version {
                return;
            }
        } else if folds.len() >= SETTINGS_CACHE_SESSIONS {
            // Any one goes: the cache saves time only.
            if let Some(k) = folds.keys().next().cloned() {
                folds.remove(&k);
            }
        }
        folds.insert(id.clone(), fold);
    }
}

impl PostgresStore {
    /// The session at its head folded without its transcript: header,
    /// definition and state with an empty transcript (its `generation` is
    /// left as folded from the non-transcript events; the transcript index
    /// knows the real one), at the head's version and `updated_at_ms`. Not
    /// a full load (see the module docs of `settings`): transcript events
    /// never leave the server. `None` if absent.
    pub fn load_settings(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        let cached = self.settings.get(id);
        let folded = self.run("settings", &format!("session {id}"), |client| {
            settings_in_transaction(client, id, cached.as_ref())
        })?;
        let Some(fold) = folded else {
            return Ok(None);
        };
        let version = version_from_sql(id, fold.version, "commit")?;
        let session = fold
            .session
            .clone()
            .reconstitute(version, fold.updated_at_ms);
        self.settings.put(id, fold);
        Ok(Some(session))
    }
}

/// The settings fold of `id` at its head, from `cached` when it still
/// holds, in one read-only REPEATABLE READ transaction.
fn settings_in_transaction(
    client: &mut Client,
    id: &SessionId,
    cached: Option<&Cached>,
) -> Result<Option<Cached>, Fail> {
    let sid = id.as_str();
    let mut tx = client
        .build_transaction()
        .isolation_level(IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()?;
    let Some(head) = tx.query_opt("SELECT version FROM spool_sessions WHERE id = $1", &[&sid])?
    else {
        return Ok(None);
    };
    let head: i64 = head.try_get(0)?;
    if head < 1 {
        return Ok(None);
    }
    let mut start = None;
    if let Some(c) = cached.filter(|c| c.version >= 1 && c.version <= head) {
        let still = tx.query_opt(
            "SELECT 1 FROM spool_commits
             WHERE session_id = $1 AND version = $2 AND commit_id = $3",
            &[&sid, &c.version, &c.commit],
        )?;
        if still.is_some() {
            start = Some(c.clone());
        }
    }
    let (mut session, mut version, mut updated, mut commit) = match start {
        Some(c) => (Some(c.session), c.version, c.updated_at_ms, c.commit),
        None => (None, 0i64, 0i64, Uuid::nil()),
    };
    let skip: Vec<&str> = TRANSCRIPT_EVENT_KINDS.to_vec();
    let batch = tx.prepare(
        "SELECT c.version, c.created_at_ms, c.commit_id,
                ARRAY(SELECT e.payload
                      FROM unnest(c.kinds, c.payloads) WITH ORDINALITY AS e(kind, payload, ord)
                      WHERE e.kind <> ALL($4::text[])
                      ORDER BY e.ord)
         FROM spool_commits c
         WHERE c.session_id = $1 AND c.version > $2 AND c.version <= $3
         ORDER BY c.version",
    )?;
    while version < head {
        let upto = head.min(version.saturating_add(LOAD_BATCH_COMMITS));
        let rows = tx.query(&batch, &[&sid, &version, &upto, &skip])?;
        for row in &rows {
            let v: i64 = row.try_get(0)?;
            if v != version + 1 {
                return Err(Fail::Store(StoreError::Corrupt {
                    id: id.clone(),
                    reason: format!("commit {} is missing (next stored is {v})", version + 1),
                }));
            }
            let payloads: Vec<&[u8]> = row.try_get(3)?;
            for (i, p) in payloads.iter().enumerate() {
                let ev = decode_event_without_transcript(p).map_err(|source| {
                    Fail::Store(StoreError::Encoding {
                        context: format!("session {id}, version {v}, settings event {i}"),
                        source,
                    })
                })?;
                let folded = match session.take() {
                    Some(s) => s.replay_onto(std::iter::once(&ev)),
                    None => AgentSession::replay(std::iter::once(&ev)),
                };
                session = Some(folded.map_err(|e| {
                    Fail::Store(StoreError::Corrupt {
                        id: id.clone(),
                        reason: format!("version {v}: {e}"),
                    })
                })?);
            }
            version = v;
            updated = row.try_get(1)?;
            commit = row.try_get(2)?;
        }
        if version < upto {
            break;
        }
    }
    tx.commit()?;
    match session {
        Some(session) if version == head => Ok(Some(Cached {
            version,
            commit,
            updated_at_ms: updated,
            session,
        })),
        _ => Err(Fail::Store(StoreError::Corrupt {
            id: id.clone(),
            reason: format!("commits end at version {version}, the header says {head}"),
        })),
    }
}
