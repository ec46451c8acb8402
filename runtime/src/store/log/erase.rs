//! What an erasing log GC replaces: the transcript content a later rewrite
//! superseded.
//!
//! A rewrite (`compact --redact`, `--truncate-tool-results`,
//! `--drop-aborted`) appends a `transcript_rewritten` event that writes the
//! entries' new content (same ids) or removes them; the old content stays in
//! the earlier events of the stream. Walking a session's events in order,
//! every place an entry's content was logged is an *occurrence*: an
//! `entry_appended` event, an entry of a `transcript_rewritten` event's
//! `written` list, of a `history_rewritten` event's `entries`, or of a fork's
//! seed transcript in its `created` event. An occurrence is **superseded**
//! when a later rewrite writes or removes the same entry id (a whole-form
//! rewrite supersedes every occurrence before it), and every occurrence of a
//! purged incarnation is superseded by the purge marker (a session purged
//! and created again). A `state_cleared` event ends the walk's memory:
//! occurrences before it are history, not superseded content, and stay
//! (unless a purge follows).
//!
//! Each commit holding a superseded occurrence is replaced
//! ([`spool_engine::GcAction::Replace`]) by the same events with every
//! superseded entry turned into an erased placeholder ([`erased_entry`]):
//! same id, parent and timestamp, kind `custom` with custom type
//! [`ERASED_CUSTOM_TYPE`] and the original kind's name as data. The commit's
//! place in the stream (version, seq, commit id) stays, so every fold still
//! runs: the placeholder holds the entry's place in the tree until the
//! rewrite that superseded it replaces or removes it, so the head state is
//! unchanged; a fold at an older version shows the placeholder
//! (`replay --at-version` reports it as erased).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use serde_json::json;
use spool_engine::{EventData, Store};

use super::common::{engine_err, PURGE_EVENT_KIND, SESSION_EVENT_PREFIX};
use super::stored_kind;
use crate::session::{decode_event, encode_event, SessionEvent};
use crate::store::StoreError;
use crate::transcript::{Entry, EntryId, EntryKind};

/// The `custom_type` of an erased placeholder entry.
pub const ERASED_CUSTOM_TYPE: &str = "spool.erased";

/// Whether `e` is an erased placeholder.
pub fn is_erased_entry(e: &Entry) -> bool {
    matches!(&e.kind, EntryKind::Custom { custom_type, .. } if custom_type == ERASED_CUSTOM_TYPE)
}

/// The placeholder that takes a superseded entry's place: its id, parent and
/// timestamp, none of its content.
pub(crate) fn erased_entry(e: &Entry) -> Entry {
    Entry {
        id: e.id.clone(),
        parent_id: e.parent_id.clone(),
        timestamp_ms: e.timestamp_ms,
        kind: EntryKind::Custom {
            custom_type: ERASED_CUSTOM_TYPE.to_string(),
            data: json!({ "kind": e.kind_name() }).into(),
        },
    }
}

/// Where an entry's content was logged: the event of a commit, and the slot
/// in it (0 for `entry_appended`; the index in `written`, `entries` or the
/// seed transcript otherwise).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Occurrence {
    version: u64,
    event: usize,
    slot: usize,
}

/// Commits read per batch.
const READ_BATCH: usize = 256;

/// The replacement events of every commit of `stream` (a session) that
/// holds superseded content, keyed by seq. Already erased placeholders are
/// not counted again.
fn superseded_in(
    engine: &Store,
    stream: &str,
) -> Result<BTreeMap<u64, Vec<EventData>>, StoreError> {
    let decode = |e: &EventData, version: u64, i: usize| {
        decode_event(&e.payload).map_err(|source| StoreError::Encoding {
            context: format!("stream {stream:?}, version {version}, event {i}"),
            source,
        })
    };
    let mut live: HashMap<EntryId, Vec<Occurrence>> = HashMap::new();
    let mut erase: BTreeSet<Occurrence> = BTreeSet::new();
    // Every occurrence since the last purge marker (the current incarnation).
    let mut incarnation: Vec<Occurrence> = Vec::new();
    let supersede = |live: &mut HashMap<EntryId, Vec<Occurrence>>,
                     erase: &mut BTreeSet<Occurrence>,
                     id: &EntryId| {
        if let Some(v) = live.remove(id) {
            erase.extend(v);
        }
    };
    let mut from = 1;
    loop {
        let batch = engine
            .read_stream(stream, from, READ_BATCH)
            .map_err(engine_err)?;
        let Some(last) = batch.last() else { break };
        from = last.info.version + 1;
        for c in &batch {
            let version = c.info.version;
            for (i, e) in c.events.iter().enumerate() {
                if e.kind == PURGE_EVENT_KIND {
                    live.clear();
                    erase.extend(incarnation.drain(..));
                    continue;
                }
                if !e.kind.starts_with(SESSION_EVENT_PREFIX) {
                    continue;
                }
                let at = |slot| Occurrence {
                    version,
                    event: i,
                    slot,
                };
                let mut add = |live: &mut HashMap<EntryId, Vec<Occurrence>>, en: &Entry, slot| {
                    if !is_erased_entry(en) {
                        live.entry(en.id.clone()).or_default().push(at(slot));
                        incarnation.push(at(slot));
                    }
                };
                match decode(e, version, i)? {
                    SessionEvent::Created { state, .. } => {
                        for (k, en) in state.transcript.entries().iter().enumerate() {
                            add(&mut live, en, k);
                        }
                    }
                    SessionEvent::EntryAppended { entry } => add(&mut live, &entry, 0),
                    SessionEvent::TranscriptRewritten {
                        written, removed, ..
                    } => {
                        for id in removed.iter().chain(written.iter().map(|w| &w.id)) {
                            supersede(&mut live, &mut erase, id);
                        }
                        for (k, w) in written.iter().enumerate() {
                            add(&mut live, w, k);
                        }
                    }
                    SessionEvent::HistoryRewritten { entries, .. } => {
                        for (_, v) in live.drain() {
                            erase.extend(v);
                        }
                        for (k, en) in entries.iter().enumerate() {
                            add(&mut live, en, k);
                        }
                    }
                    SessionEvent::StateCleared => live.clear(),
                    _ => {}
                }
            }
        }
        if batch.len() < READ_BATCH {
            break;
        }
    }
    // Per commit version: its events with the superseded slots.
    let mut by_commit: BTreeMap<u64, BTreeMap<usize, Vec<usize>>> = BTreeMap::new();
    for o in erase {
        by_commit
            .entry(o.version)
            .or_default()
            .entry(o.event)
            .or_default()
            .push(o.slot);
    }
    let mut out = BTreeMap::new();
    for (version, events) in by_commit {
        let Some(c) = engine
            .read_stream(stream, version, 1)
            .map_err(engine_err)?
            .into_iter()
            .next()
        else {
            continue;
        };
        let mut new = c.events.clone();
        for (i, slots) in events {
            let Some(e) = c.events.get(i) else { continue };
            let erased = erase_slots(decode(e, version, i)?, &slots);
            let payload = encode_event(&erased).map_err(|source| StoreError::Encoding {
                context: format!("erasing stream {stream:?}, version {version}, event {i}"),
                source,
            })?;
            new[i] = EventData::new(stored_kind(&erased), payload);
        }
        out.insert(c.info.seq, new);
    }
    Ok(out)
}

/// `ev` with the entries at `slots` replaced by placeholders.
fn erase_slots(ev: SessionEvent, slots: &[usize]) -> SessionEvent {
    let erase_in = |entries: &mut Vec<Entry>| {
        for &k in slots {
            if let Some(en) = entries.get_mut(k) {
                *en = erased_entry(en);
            }
        }
    };
    match ev {
        SessionEvent::EntryAppended { entry } => SessionEvent::EntryAppended {
            entry: erased_entry(&entry),
        },
        SessionEvent::TranscriptRewritten {
            generation,
            mut written,
            reparented,
            removed,
            leaf,
        } => {
            erase_in(&mut written);
            SessionEvent::TranscriptRewritten {
                generation,
                written,
                reparented,
                removed,
                leaf,
            }
        }
        SessionEvent::HistoryRewritten {
            generation,
            mut entries,
            leaf,
        } => {
            erase_in(&mut entries);
            SessionEvent::HistoryRewritten {
                generation,
                entries,
                leaf,
            }
        }
        SessionEvent::Created {
            id,
            parent_id,
            agent_name,
            label,
            created_at_ms,
            definition,
            mut state,
        } => {
            let mut entries = state.transcript.entries().to_vec();
            erase_in(&mut entries);
            let leaf = state.transcript.leaf().cloned();
            state.transcript.replace_all(entries, leaf);
            SessionEvent::Created {
                id,
                parent_id,
                agent_name,
                label,
                created_at_ms,
                definition,
                state,
            }
        }
        other => other,
    }
}

/// The replacement events of every commit in the log that holds superseded
/// transcript content, keyed by seq. Only streams with a rewrite event or a
/// purge marker are decoded.
pub(super) fn superseded(engine: &Store) -> Result<BTreeMap<u64, Vec<EventData>>, StoreError> {
    let rewrite_kinds = [
        format!("{SESSION_EVENT_PREFIX}transcript_rewritten"),
        format!("{SESSION_EVENT_PREFIX}history_rewritten"),
        PURGE_EVENT_KIND.to_string(),
    ];
    let mut streams: BTreeSet<String> = BTreeSet::new();
    for c in engine.scan(1).map_err(engine_err)? {
        let c = c.map_err(engine_err)?;
        if !streams.contains(&c.info.stream)
            && c.events.iter().any(|e| rewrite_kinds.contains(&e.kind))
        {
            streams.insert(c.info.stream);
        }
    }
    let mut out = BTreeMap::new();
    for s in &streams {
        out.append(&mut superseded_in(engine, s)?);
    }
    Ok(out)
}
