//! The transcript index of the PostgreSQL store and the [`EntrySource`]
//! that reads entries through it (schema version 2).
//!
//! The same index as the log store's
//! (`store::log::transcript`), kept in tables:
//!
//! | where | key | holds |
//! | --- | --- | --- |
//! | `spool_entries` | `(session_id, entry_id)` | one row per entry of the current generation: append `seq`, `parent_id`, `kind`, [`PathMarker`] and [`PathFacts`] (MessagePack `bytea`), `size_bytes` ([`entry_size`]), `summary`, custom-list ordinals (`custom_type`, `custom_ordinal`, `custom_all`), label target and value, and `payload` (the entry as an [`encode_event`]-encoded `entry_appended` event) |
//! | `spool_custom_types` | `(session_id, custom_type)` | next ordinal of that custom type |
//! | `spool_sessions.tx_*` | `id` | [`TranscriptMeta`]: generation, raw seq, updated at, leaf, entries, next seq, next any-type custom ordinal |
//!
//! Indexes: `(session_id, parent_id, seq)` (children in append order),
//! `(session_id, custom_type, custom_ordinal)` and
//! `(session_id, custom_all)` (custom-entry pages),
//! `(session_id, label_target, seq)` (last label wins). So every lookup a
//! handle makes is one index probe or one index range of what it returns.
//!
//! The index is maintained by [`TxIndex::apply`] in the SAME transaction
//! as the commit row it derives from (after the version fence was won), so
//! it is never ahead of or behind `spool_commits`; migration 2 builds it
//! for existing sessions by replaying their commits ([`backfill`]). The
//! events read and the semantics are the log indexer's: `created` (a
//! fork's seed transcript), `entry_appended`, `leaf_moved`,
//! `history_rewritten`, `transcript_rewritten` and `state_cleared`; a
//! purge is the removal of the session row (`ON DELETE CASCADE`). Only the
//! current generation is indexed: the old generation of a rewritten
//! history stays readable from the commits (`load_at`).
//!
//! Differences from the log index, none visible through [`EntrySource`]:
//! entry payloads are copied into `spool_entries` instead of pointing into
//! the commit (a read is one row, never the decoding of a whole `created`
//! or `history_rewritten` event), and child counts and removed custom
//! entries are derived from the rows (`count(*)`, absent rows) instead of
//! kept as counters and tombstones.

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::{HashMap, HashSet};

use postgres::{Client, Row, Statement, Transaction};

use super::{Fail, PostgresStore};
use crate::session::{decode_event, encode_event, SessionEvent, SessionId};
use crate::store::log::transcript::TranscriptMeta;
use crate::store::StoreError;
use crate::transcript::{
    entry_size, entry_summary, first_kept_depth, ChildLinks, CustomRef, Entry, EntryFacts, EntryId,
    EntryKind, EntrySource, PathFacts, PathMarker, ResidentError, TranscriptVersion,
    TREE_SUMMARY_CHARS_MAX,
};

/// Entry records cached by one indexing transaction before the cache is
/// emptied (it only saves round trips; every write goes to the database
/// at once). Bounds the memory of indexing a huge commit or backfill.
pub(crate) const INDEX_CACHE_ENTRIES_MAX: usize = 4096;

/// Commits read per query while backfilling the index.
const BACKFILL_BATCH_COMMITS: i64 = 64;

/// Columns of an entry row read into a [`Rec`], in this order.
const REC_COLS: &str = "seq, parent_id, kind, marker, facts, size_bytes, \
                        custom_type, custom_ordinal, custom_all, label_target";

/// A fault while maintaining or reading the index.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexFault {
    #[error(transparent)]
    Pg(#[from] postgres::Error),
    /// Stored index data that does not decode, or an entry that cannot be
    /// encoded.
    #[error("transcript index of session {session}: {reason}")]
    Corrupt { session: String, reason: String },
}

impl IndexFault {
    pub(super) fn into_fail(self, id: &SessionId) -> Fail {
        match self {
            IndexFault::Pg(e) => Fail::Pg(e),
            IndexFault::Corrupt { reason, .. } => Fail::Store(StoreError::Corrupt {
                id: id.clone(),
                reason: format!("transcript index: {reason}"),
            }),
        }
    }
}

fn corrupt(sid: &str, reason: impl Into<String>) -> IndexFault {
    IndexFault::Corrupt {
        session: sid.to_string(),
        reason: reason.into(),
    }
}

/// A counter from the database (never negative when written by us).
fn u64_col(sid: &str, what: &str, v: i64) -> Result<u64, IndexFault> {
    u64::try_from(v).map_err(|_| corrupt(sid, format!("negative {what} {v}")))
}

/// A counter for the database. Counters grow by one per event, so they
/// never reach `i64::MAX`; saturate rather than fail if one did.
fn i64_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn entry_id_col(sid: &str, s: &str) -> Result<EntryId, IndexFault> {
    EntryId::parse(s).map_err(|e| corrupt(sid, format!("entry id {s:?}: {e}")))
}

fn pack<T: serde::Serialize>(sid: &str, what: &str, v: &T) -> Result<Vec<u8>, IndexFault> {
    rmp_serde::to_vec_named(v).map_err(|e| corrupt(sid, format!("encoding {what}: {e}")))
}

fn unpack<T: serde::de::DeserializeOwned>(
    sid: &str,
    what: &str,
    b: &[u8],
) -> Result<T, IndexFault> {
    rmp_serde::from_slice(b).map_err(|e| corrupt(sid, format!("{what}: {e}")))
}

/// The stored payload of an entry: an `entry_appended` event, so it uses
/// the event codec (schema-tagged, like the commits).
fn encode_entry(sid: &str, entry: &Entry) -> Result<Vec<u8>, IndexFault> {
    encode_event(&SessionEvent::EntryAppended {
        entry: entry.clone(),
    })
    .map_err(|e| corrupt(sid, format!("encoding entry {}: {e}", entry.id)))
}

fn decode_entry(sid: &str, id: &EntryId, b: &[u8]) -> Result<Entry, IndexFault> {
    match decode_event(b) {
        Ok(SessionEvent::EntryAppended { entry }) if &entry.id == id => Ok(entry),
        Ok(_) => Err(corrupt(
            sid,
            format!("the payload of entry {id} is another entry"),
        )),
        Err(e) => Err(corrupt(sid, format!("payload of entry {id}: {e}"))),
    }
}

/// Bytes of a parent id in an entry's JSON encoding (`"id"` or `null`).
fn parent_json_len(p: &Option<EntryId>) -> u64 {
    match p {
        Some(id) => u64::try_from(id.as_str().len())
            .unwrap_or(u64::MAX)
            .saturating_add(2),
        None => 4,
    }
}

fn label_value(entry: &Entry) -> Option<(EntryId, Option<String>)> {
    match &entry.kind {
        EntryKind::Label { target_id, label } => {
            Some((target_id.clone(), label.clone().filter(|l| !l.is_empty())))
        }
        _ => None,
    }
}

fn custom_type(entry: &Entry) -> Option<&str> {
    match &entry.kind {
        EntryKind::Custom { custom_type, .. } => Some(custom_type),
        _ => None,
    }
}

/// What indexing needs of one entry row (no payload).
#[derive(Clone, Debug, PartialEq)]
struct Rec {
    seq: u64,
    parent: Option<EntryId>,
    kind: String,
    marker: PathMarker,
    facts: PathFacts,
    size: u64,
    /// Custom type, ordinal in that type, ordinal among all.
    custom: Option<(String, u64, u64)>,
    label_target: Option<EntryId>,
}

fn rec_from_row(sid: &str, row: &Row) -> Result<Rec, IndexFault> {
    let parent: Option<&str> = row.try_get(1)?;
    let marker: &[u8] = row.try_get(3)?;
    let facts: &[u8] = row.try_get(4)?;
    let ctype: Option<String> = row.try_get(6)?;
    let ord: Option<i64> = row.try_get(7)?;
    let all: Option<i64> = row.try_get(8)?;
    let target: Option<&str> = row.try_get(9)?;
    let custom = match (ctype, ord, all) {
        (Some(t), Some(o), Some(a)) => Some((
            t,
            u64_col(sid, "custom ordinal", o)?,
            u64_col(sid, "custom ordinal", a)?,
        )),
        (None, None, None) => None,
        _ => return Err(corrupt(sid, "partial custom-list columns")),
    };
    Ok(Rec {
        seq: u64_col(sid, "seq", row.try_get(0)?)?,
        parent: parent.map(|p| entry_id_col(sid, p)).transpose()?,
        kind: row.try_get(2)?,
        marker: unpack(sid, "path marker", marker)?,
        facts: unpack(sid, "path facts", facts)?,
        size: u64_col(sid, "size", row.try_get(5)?)?,
        custom,
        label_target: target.map(|t| entry_id_col(sid, t)).transpose()?,
    })
}

// ---------------------------------------------------------------------------
// Maintenance (inside the commit's transaction)
// ---------------------------------------------------------------------------

/// The index of one session, maintained inside one transaction.
pub(super) struct TxIndex<'a, 't> {
    tx: RefCell<&'a mut Transaction<'t>>,
    sid: &'a str,
    cache: RefCell<HashMap<EntryId, Option<Rec>>>,
    stmts: RefCell<HashMap<&'static str, Statement>>,
}

impl<'a, 't> TxIndex<'a, 't> {
    pub(super) fn new(tx: &'a mut Transaction<'t>, sid: &'a str) -> Self {
        TxIndex {
            tx: RefCell::new(tx),
            sid,
            cache: RefCell::new(HashMap::new()),
            stmts: RefCell::new(HashMap::new()),
        }
    }

    /// A statement prepared once per transaction (saves a round trip per
    /// use when a commit indexes many entries).
    fn stmt(&self, sql: &'static str) -> Result<Statement, IndexFault> {
        if let Some(s) = self.stmts.borrow().get(sql) {
            return Ok(s.clone());
        }
        let s = self.tx.borrow_mut().prepare(sql)?;
        self.stmts.borrow_mut().insert(sql, s.clone());
        Ok(s)
    }

    fn cache_put(&self, id: &EntryId, rec: Option<Rec>) {
        let mut c = self.cache.borrow_mut();
        if c.len() >= INDEX_CACHE_ENTRIES_MAX && !c.contains_key(id) {
            c.clear();
        }
        c.insert(id.clone(), rec);
    }

    fn get(&self, id: &EntryId) -> Result<Option<Rec>, IndexFault> {
        if let Some(r) = self.cache.borrow().get(id) {
            return Ok(r.clone());
        }
        let st = self.stmt(
            "SELECT seq, parent_id, kind, marker, facts, size_bytes, \
             custom_type, custom_ordinal, custom_all, label_target \
             FROM spool_entries WHERE session_id = $1 AND entry_id = $2",
        )?;
        let row = self
            .tx
            .borrow_mut()
            .query_opt(&st, &[&self.sid, &id.as_str()])?;
        let rec = row.map(|r| rec_from_row(self.sid, &r)).transpose()?;
        self.cache_put(id, rec.clone());
        Ok(rec)
    }

    /// Writes every column of an entry row (insert or full update).
    fn put_full(
        &self,
        id: &EntryId,
        r: &Rec,
        label: Option<&str>,
        summary: &str,
        payload: &[u8],
        insert: bool,
    ) -> Result<(), IndexFault> {
        let sql = if insert {
            "INSERT INTO spool_entries (session_id, entry_id, seq, parent_id, kind, marker, \
             facts, size_bytes, custom_type, custom_ordinal, custom_all, label_target, label, \
             summary, payload) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, \
             $14, $15)"
        } else {
            "UPDATE spool_entries SET seq = $3, parent_id = $4, kind = $5, marker = $6, \
             facts = $7, size_bytes = $8, custom_type = $9, custom_ordinal = $10, \
             custom_all = $11, label_target = $12, label = $13, summary = $14, payload = $15 \
             WHERE session_id = $1 AND entry_id = $2"
        };
        let st = self.stmt(sql)?;
        let marker = pack(self.sid, "path marker", &r.marker)?;
        let facts = pack(self.sid, "path facts", &r.facts)?;
        let (ctype, ord, all) = match &r.custom {
            Some((t, o, a)) => (Some(t.as_str()), Some(i64_of(*o)), Some(i64_of(*a))),
            None => (None, None, None),
        };
        self.tx.borrow_mut().execute(
            &st,
            &[
                &self.sid,
                &id.as_str(),
                &i64_of(r.seq),
                &r.parent.as_ref().map(|p| p.as_str()),
                &r.kind,
                &marker,
                &facts,
                &i64_of(r.size),
                &ctype,
                &ord,
                &all,
                &r.label_target.as_ref().map(|t| t.as_str()),
                &label,
                &summary,
                &payload,
            ],
        )?;
        self.cache_put(id, Some(r.clone()));
        Ok(())
    }

    /// Writes the parent, size and path facts of a row.
    fn put_links(&self, id: &EntryId, r: &Rec) -> Result<(), IndexFault> {
        let st = self.stmt(
            "UPDATE spool_entries SET parent_id = $3, size_bytes = $4, facts = $5 \
             WHERE session_id = $1 AND entry_id = $2",
        )?;
        let facts = pack(self.sid, "path facts", &r.facts)?;
        self.tx.borrow_mut().execute(
            &st,
            &[
                &self.sid,
                &id.as_str(),
                &r.parent.as_ref().map(|p| p.as_str()),
                &i64_of(r.size),
                &facts,
            ],
        )?;
        self.cache_put(id, Some(r.clone()));
        Ok(())
    }

    fn remove(&self, id: &EntryId) -> Result<(), IndexFault> {
        let st = self.stmt("DELETE FROM spool_entries WHERE session_id = $1 AND entry_id = $2")?;
        self.tx
            .borrow_mut()
            .execute(&st, &[&self.sid, &id.as_str()])?;
        self.cache_put(id, None);
        Ok(())
    }

    /// Children of `id` in append order.
    fn child_ids(&self, id: &EntryId) -> Result<Vec<EntryId>, IndexFault> {
        let st = self.stmt(
            "SELECT entry_id FROM spool_entries WHERE session_id = $1 AND parent_id = $2 \
             ORDER BY seq",
        )?;
        let rows = self
            .tx
            .borrow_mut()
            .query(&st, &[&self.sid, &id.as_str()])?;
        rows.iter()
            .map(|r| entry_id_col(self.sid, r.try_get(0)?))
            .collect()
    }

    /// Allocates the next ordinal of a custom type.
    fn next_custom_ordinal(&self, t: &str) -> Result<u64, IndexFault> {
        let st = self.stmt(
            "INSERT INTO spool_custom_types (session_id, custom_type, next_ordinal) \
             VALUES ($1, $2, 1) ON CONFLICT (session_id, custom_type) \
             DO UPDATE SET next_ordinal = spool_custom_types.next_ordinal + 1 \
             RETURNING next_ordinal - 1",
        )?;
        let row = self.tx.borrow_mut().query_one(&st, &[&self.sid, &t])?;
        u64_col(self.sid, "custom ordinal", row.try_get(0)?)
    }

    /// Removes every entry row and custom counter of the session.
    fn clear_entries(&self) -> Result<(), IndexFault> {
        let mut tx = self.tx.borrow_mut();
        tx.execute(
            "DELETE FROM spool_entries WHERE session_id = $1",
            &[&self.sid],
        )?;
        tx.execute(
            "DELETE FROM spool_custom_types WHERE session_id = $1",
            &[&self.sid],
        )?;
        self.cache.borrow_mut().clear();
        Ok(())
    }

    fn read_meta(&self) -> Result<TranscriptMeta, IndexFault> {
        let row = self.tx.borrow_mut().query_opt(
            "SELECT tx_generation, tx_raw_seq, tx_updated_at_ms, tx_leaf, tx_entries, \
             tx_next_seq, tx_custom_next FROM spool_sessions WHERE id = $1",
            &[&self.sid],
        )?;
        let Some(row) = row else {
            return Ok(TranscriptMeta::default());
        };
        let sid = self.sid;
        let leaf: Option<&str> = row.try_get(3)?;
        Ok(TranscriptMeta {
            generation: u64_col(sid, "generation", row.try_get(0)?)?,
            raw_seq: u64_col(sid, "raw seq", row.try_get(1)?)?,
            updated_at_ms: row.try_get(2)?,
            leaf: leaf.map(|l| entry_id_col(sid, l)).transpose()?,
            entries: u64_col(sid, "entries", row.try_get(4)?)?,
            next_seq: u64_col(sid, "next seq", row.try_get(5)?)?,
            custom_next: u64_col(sid, "custom next", row.try_get(6)?)?,
            // The active-path depth index is the log store's; PostgreSQL
            // answers `ancestor_at_depth` by walking parents.
            path_len: 0,
            // The seed table is the log store's too.
            seed_table: false,
        })
    }

    fn write_meta(&self, m: &TranscriptMeta) -> Result<(), IndexFault> {
        self.tx.borrow_mut().execute(
            "UPDATE spool_sessions SET tx_generation = $2, tx_raw_seq = $3, \
             tx_updated_at_ms = $4, tx_leaf = $5, tx_entries = $6, tx_next_seq = $7, \
             tx_custom_next = $8 WHERE id = $1",
            &[
                &self.sid,
                &i64_of(m.generation),
                &i64_of(m.raw_seq),
                &m.updated_at_ms,
                &m.leaf.as_ref().map(|l| l.as_str()),
                &i64_of(m.entries),
                &i64_of(m.next_seq),
                &i64_of(m.custom_next),
            ],
        )?;
        Ok(())
    }

    /// The facts of `entry` whose parent is `entry_parent` (as the log
    /// indexer computes them).
    fn facts_for(
        &self,
        entry_parent: Option<&EntryId>,
        entry: &Entry,
    ) -> Result<PathFacts, IndexFault> {
        let parent = match entry_parent {
            Some(p) => self.get(p)?,
            None => None,
        };
        Ok(match parent {
            None => PathFacts::root(entry),
            Some(pr) => {
                let kept = match first_kept_depth(self, entry, pr.facts.depth) {
                    Ok(k) => k,
                    Err(ResidentError::Source(e)) => return Err(e),
                    // A damaged parent chain: the compaction keeps nothing.
                    Err(_) => None,
                };
                PathFacts::child(&pr.facts, entry, kept)
            }
        })
    }

    /// Facts for a stored entry recomputed from its row alone:
    /// [`PathFacts::child`] only needs the marker and the id.
    fn facts_from_rec(&self, id: &EntryId, r: &Rec) -> Result<PathFacts, IndexFault> {
        let stand_in = r.marker.stand_in_entry(id.clone(), r.parent.clone());
        self.facts_for(r.parent.as_ref(), &stand_in)
    }

    /// Indexes one entry; `false` for a duplicate id (the first occurrence
    /// stays authoritative, as in `Transcript`). `payload` is the entry's
    /// encoded `entry_appended` event when the caller has it.
    fn index_entry(
        &self,
        meta: &mut TranscriptMeta,
        entry: &Entry,
        payload: Option<&[u8]>,
    ) -> Result<bool, IndexFault> {
        if self.get(&entry.id)?.is_some() {
            return Ok(false);
        }
        let facts = self.facts_for(entry.parent_id.as_ref(), entry)?;
        let seq = meta.next_seq;
        meta.next_seq = meta.next_seq.saturating_add(1);
        let custom = match custom_type(entry) {
            Some(t) => {
                let ordinal = self.next_custom_ordinal(t)?;
                let all = meta.custom_next;
                meta.custom_next = meta.custom_next.saturating_add(1);
                Some((t.to_string(), ordinal, all))
            }
            None => None,
        };
        let (label_target, label) = match label_value(entry) {
            Some((t, l)) => (Some(t), l),
            None => (None, None),
        };
        let rec = Rec {
            seq,
            parent: entry.parent_id.clone(),
            kind: entry.kind_name().to_string(),
            marker: PathMarker::of(entry),
            facts,
            size: entry_size(entry),
            custom,
            label_target,
        };
        let encoded;
        let payload = match payload {
            Some(p) => p,
            None => {
                encoded = encode_entry(self.sid, entry)?;
                &encoded
            }
        };
        let summary = entry_summary(entry, TREE_SUMMARY_CHARS_MAX).0;
        self.put_full(&entry.id, &rec, label.as_deref(), &summary, payload, true)?;
        meta.entries = meta.entries.saturating_add(1);
        Ok(true)
    }

    fn apply_delta_rewrite(
        &self,
        meta: &mut TranscriptMeta,
        written: &[Entry],
        reparented: &[(EntryId, Option<EntryId>)],
        removed: &[EntryId],
    ) -> Result<(), IndexFault> {
        let mut stale: Vec<EntryId> = Vec::new();
        for id in removed {
            if self.get(id)?.is_none() {
                continue;
            }
            // Child links and counts are derived from the rows, and the
            // custom lists skip absent rows: removing the row is all.
            self.remove(id)?;
            meta.entries = meta.entries.saturating_sub(1);
        }
        for (id, new_parent) in reparented {
            let Some(mut r) = self.get(id)? else {
                continue;
            };
            r.size = r
                .size
                .saturating_sub(parent_json_len(&r.parent))
                .saturating_add(parent_json_len(new_parent));
            r.parent = new_parent.clone();
            self.put_links(id, &r)?;
            stale.push(id.clone());
        }
        for w in written {
            let Some(mut r) = self.get(&w.id)? else {
                continue;
            };
            let marker = PathMarker::of(w);
            let is_stale = r.parent != w.parent_id || marker != r.marker;
            // Custom lists: same type keeps its place; a new type goes last.
            let new_custom = match (custom_type(w), &r.custom) {
                (Some(t), Some((old_t, ordinal, all))) if t == old_t => {
                    Some((t.to_string(), *ordinal, *all))
                }
                (Some(t), _) => {
                    let ordinal = self.next_custom_ordinal(t)?;
                    let all = meta.custom_next;
                    meta.custom_next = meta.custom_next.saturating_add(1);
                    Some((t.to_string(), ordinal, all))
                }
                (None, _) => None,
            };
            let (label_target, label) = match label_value(w) {
                Some((t, l)) => (Some(t), l),
                None => (None, None),
            };
            r.size = entry_size(w);
            r.kind = w.kind_name().to_string();
            r.parent = w.parent_id.clone();
            r.marker = marker;
            r.custom = new_custom;
            r.label_target = label_target;
            let payload = encode_entry(self.sid, w)?;
            let summary = entry_summary(w, TREE_SUMMARY_CHARS_MAX).0;
            self.put_full(&w.id, &r, label.as_deref(), &summary, &payload, false)?;
            if is_stale {
                stale.push(w.id.clone());
            }
        }
        self.recompute_facts(&stale)
    }

    /// Recomputes the path facts of each stale entry and, where they
    /// changed, of its descendants.
    fn recompute_facts(&self, stale: &[EntryId]) -> Result<(), IndexFault> {
        let mut visited: HashSet<EntryId> = HashSet::new();
        for root in stale {
            let mut queue: Vec<(EntryId, bool)> = vec![(root.clone(), true)];
            while let Some((id, force)) = queue.pop() {
                let Some(mut r) = self.get(&id)? else {
                    continue;
                };
                let facts = self.facts_from_rec(&id, &r)?;
                let changed = facts != r.facts;
                if changed {
                    r.facts = facts;
                    self.put_links(&id, &r)?;
                }
                // A cycle cannot come from a valid rewrite; never loop on one.
                if (changed || force) && visited.insert(id.clone()) {
                    for child in self.child_ids(&id)? {
                        queue.push((child, false));
                    }
                }
            }
        }
        Ok(())
    }

    /// Applies the transcript events of one commit stamped `stamp`.
    /// `payloads`, when given, are the events' [`encode_event`] bytes
    /// (same order), reused as entry payloads for appends. Returns the
    /// transcript version written, or `None` when the commit had no
    /// transcript events (the version is then unchanged and unread).
    pub(super) fn apply(
        &self,
        events: &[SessionEvent],
        payloads: Option<&[Vec<u8>]>,
        stamp: i64,
    ) -> Result<Option<TranscriptVersion>, IndexFault> {
        let relevant = |ev: &SessionEvent| {
            matches!(
                ev,
                SessionEvent::Created { .. }
                    | SessionEvent::EntryAppended { .. }
                    | SessionEvent::LeafMoved { .. }
                    | SessionEvent::HistoryRewritten { .. }
                    | SessionEvent::TranscriptRewritten { .. }
                    | SessionEvent::StateCleared
            )
        };
        if !events.iter().any(relevant) {
            return Ok(None);
        }
        let mut m = self.read_meta()?;
        for (i, ev) in events.iter().enumerate() {
            match ev {
                SessionEvent::Created { state, .. } => {
                    self.clear_entries()?;
                    m = TranscriptMeta {
                        generation: state.generation,
                        raw_seq: m.raw_seq,
                        ..TranscriptMeta::default()
                    };
                    for e in state.transcript.entries() {
                        self.index_entry(&mut m, e, None)?;
                    }
                    m.leaf = state.transcript.leaf().cloned();
                }
                SessionEvent::EntryAppended { entry } => {
                    let p = payloads.and_then(|p| p.get(i)).map(Vec::as_slice);
                    self.index_entry(&mut m, entry, p)?;
                    m.leaf = Some(entry.id.clone());
                }
                SessionEvent::LeafMoved { leaf } => m.leaf = leaf.clone(),
                SessionEvent::HistoryRewritten {
                    generation,
                    entries,
                    leaf,
                } => {
                    self.clear_entries()?;
                    m.entries = 0;
                    for e in entries {
                        self.index_entry(&mut m, e, None)?;
                    }
                    m.generation = *generation;
                    m.leaf = leaf.clone();
                }
                SessionEvent::TranscriptRewritten {
                    generation,
                    written,
                    reparented,
                    removed,
                    leaf,
                } => {
                    self.apply_delta_rewrite(&mut m, written, reparented, removed)?;
                    m.generation = *generation;
                    m.leaf = leaf.clone();
                }
                SessionEvent::StateCleared => {
                    self.clear_entries()?;
                    m.entries = 0;
                    m.generation = m.generation.saturating_add(1);
                    m.leaf = None;
                }
                _ => continue,
            }
            m.raw_seq = m.raw_seq.saturating_add(1);
            m.updated_at_ms = stamp;
        }
        self.write_meta(&m)?;
        Ok(Some(m.version()))
    }
}

/// The read side of an indexing transaction: facts only (what
/// [`first_kept_depth`] needs; payloads are never read while indexing).
impl EntrySource for TxIndex<'_, '_> {
    type Error = IndexFault;

    fn entry(&self, _id: &EntryId) -> Result<Option<Cow<'_, Entry>>, IndexFault> {
        Ok(None)
    }

    fn children(&self, _id: &EntryId, _limit: usize) -> Result<ChildLinks, IndexFault> {
        Ok(ChildLinks::default())
    }

    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, IndexFault> {
        Ok(self.get(id)?.map(|r| EntryFacts {
            parent_id: r.parent,
            kind: r.kind,
            marker: r.marker,
        }))
    }

    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, IndexFault> {
        Ok(self.get(id)?.map(|r| r.size))
    }

    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, IndexFault> {
        Ok(self.get(id)?.map(|r| r.facts))
    }
}

/// Builds the index of every stored session by replaying its commits
/// (migration 2, inside the migration's transaction). Undecodable events
/// are skipped, as the log indexer skips them: loading such a session
/// reports the damage.
pub(super) fn backfill(tx: &mut Transaction<'_>) -> Result<(), IndexFault> {
    let ids: Vec<String> = tx
        .query("SELECT id FROM spool_sessions ORDER BY id", &[])?
        .iter()
        .map(|r| r.try_get(0))
        .collect::<Result<_, _>>()?;
    for sid in &ids {
        let mut after: i64 = 0;
        loop {
            let rows = tx.query(
                "SELECT version, created_at_ms, payloads FROM spool_commits \
                 WHERE session_id = $1 AND version > $2 ORDER BY version LIMIT $3",
                &[sid, &after, &BACKFILL_BATCH_COMMITS],
            )?;
            if rows.is_empty() {
                break;
            }
            let mut commits = Vec::with_capacity(rows.len());
            for row in &rows {
                after = row.try_get(0)?;
                let stamp: i64 = row.try_get(1)?;
                let payloads: Vec<&[u8]> = row.try_get(2)?;
                let events: Vec<SessionEvent> = payloads
                    .iter()
                    .filter_map(|p| decode_event(p).ok())
                    .collect();
                commits.push((stamp, events));
            }
            let idx = TxIndex::new(tx, sid);
            for (stamp, events) in &commits {
                idx.apply(events, None, *stamp)?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

/// An [`EntrySource`] over the PostgreSQL transcript index of one session:
/// every answer is one indexed query of what it returns.
pub(super) struct PgTranscriptSource<'a> {
    store: &'a PostgresStore,
    sid: SessionId,
}

impl<'a> PgTranscriptSource<'a> {
    pub(super) fn new(store: &'a PostgresStore, sid: SessionId) -> Self {
        PgTranscriptSource { store, sid }
    }

    fn query<T: Send>(
        &self,
        op: &'static str,
        f: impl Fn(&mut Client, &str) -> Result<T, IndexFault> + Send + Sync,
    ) -> Result<T, StoreError> {
        let sid = self.sid.as_str();
        self.store.run(op, &format!("session {sid}"), |client| {
            f(client, sid).map_err(|e| e.into_fail(&self.sid))
        })
    }

    fn record(&self, id: &EntryId) -> Result<Option<Rec>, StoreError> {
        self.query("transcript record", |c, sid| {
            c.query_opt(
                &format!(
                    "SELECT {REC_COLS} FROM spool_entries \
                     WHERE session_id = $1 AND entry_id = $2"
                ),
                &[&sid, &id.as_str()],
            )?
            .map(|r| rec_from_row(sid, &r))
            .transpose()
        })
    }
}

impl EntrySource for PgTranscriptSource<'_> {
    type Error = StoreError;

    /// The stored payload with the indexed parent (a re-parented entry's
    /// payload is not rewritten, only its link).
    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, StoreError> {
        self.query("transcript entry", |c, sid| {
            let Some(row) = c.query_opt(
                "SELECT payload, parent_id FROM spool_entries \
                 WHERE session_id = $1 AND entry_id = $2",
                &[&sid, &id.as_str()],
            )?
            else {
                return Ok(None);
            };
            let payload: &[u8] = row.try_get(0)?;
            let parent: Option<&str> = row.try_get(1)?;
            let mut e = decode_entry(sid, id, payload)?;
            e.parent_id = parent.map(|p| entry_id_col(sid, p)).transpose()?;
            Ok(Some(Cow::Owned(e)))
        })
    }

    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, StoreError> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query("transcript children", |c, sid| {
            let mut tx = c.transaction()?;
            let rows = tx.query(
                "SELECT entry_id FROM spool_entries WHERE session_id = $1 AND parent_id = $2 \
                 ORDER BY seq LIMIT $3",
                &[&sid, &id.as_str(), &limit],
            )?;
            let total: i64 = tx
                .query_one(
                    "SELECT count(*) FROM spool_entries \
                     WHERE session_id = $1 AND parent_id = $2",
                    &[&sid, &id.as_str()],
                )?
                .try_get(0)?;
            tx.commit()?;
            let ids = rows
                .iter()
                .map(|r| entry_id_col(sid, r.try_get(0)?))
                .collect::<Result<Vec<_>, _>>()?;
            Ok(ChildLinks {
                ids,
                total: u64_col(sid, "child count", total)?,
            })
        })
    }

    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, StoreError> {
        Ok(self.record(id)?.map(|r| EntryFacts {
            parent_id: r.parent,
            kind: r.kind,
            marker: r.marker,
        }))
    }

    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, StoreError> {
        Ok(self.record(id)?.map(|r| r.size))
    }

    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, StoreError> {
        Ok(self.record(id)?.map(|r| r.facts))
    }

    /// Ordinals only grow (a removed entry's ordinal is never reused), so
    /// a page is one index range after `after_seq`.
    fn custom_entries_after(
        &self,
        custom_type: Option<&str>,
        after_seq: Option<u64>,
        limit: usize,
    ) -> Result<Option<Vec<CustomRef>>, StoreError> {
        let after = after_seq.map_or(-1, i64_of);
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        self.query("transcript custom entries", |c, sid| {
            let rows = match custom_type {
                Some(t) => c.query(
                    "SELECT custom_ordinal, entry_id FROM spool_entries \
                     WHERE session_id = $1 AND custom_type = $2 AND custom_ordinal > $3 \
                     ORDER BY custom_ordinal LIMIT $4",
                    &[&sid, &t, &after, &limit],
                )?,
                None => c.query(
                    "SELECT custom_all, entry_id FROM spool_entries \
                     WHERE session_id = $1 AND custom_all > $2 \
                     ORDER BY custom_all LIMIT $3",
                    &[&sid, &after, &limit],
                )?,
            };
            let out = rows
                .iter()
                .map(|r| {
                    Ok(CustomRef {
                        seq: u64_col(sid, "custom ordinal", r.try_get(0)?)?,
                        id: entry_id_col(sid, r.try_get(1)?)?,
                    })
                })
                .collect::<Result<Vec<_>, IndexFault>>()?;
            Ok(Some(out))
        })
    }

    /// The label of the last label entry (append order) naming `id`.
    fn label(&self, id: &EntryId) -> Result<Option<String>, StoreError> {
        self.query("transcript label", |c, sid| {
            Ok(c.query_opt(
                "SELECT label FROM spool_entries WHERE session_id = $1 AND label_target = $2 \
                 ORDER BY seq DESC LIMIT 1",
                &[&sid, &id.as_str()],
            )?
            .map(|r| r.try_get::<_, Option<String>>(0))
            .transpose()?
            .flatten())
        })
    }

    fn summary(&self, id: &EntryId) -> Result<Option<String>, StoreError> {
        self.query("transcript summary", |c, sid| {
            Ok(c.query_opt(
                "SELECT summary FROM spool_entries WHERE session_id = $1 AND entry_id = $2",
                &[&sid, &id.as_str()],
            )?
            .map(|r| r.try_get(0))
            .transpose()?)
        })
    }
}

/// Every entry id of the session's current generation, in id order (the
/// log index's order).
pub(super) fn entry_ids(client: &mut Client, sid: &str) -> Result<Vec<EntryId>, IndexFault> {
    client
        .query(
            "SELECT entry_id FROM spool_entries WHERE session_id = $1 ORDER BY entry_id",
            &[&sid],
        )?
        .iter()
        .map(|r| entry_id_col(sid, r.try_get(0)?))
        .collect()
}
