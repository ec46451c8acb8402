//! Snapshots: [`encode_snapshot`] and [`decode_snapshot`] (the fold of a
//! session at some version), by the hand reader first and serde otherwise.

use super::msgpack;
use serde::{Deserialize, Serialize};

use super::event::{entries_bytes_hint, fast_body};
use super::{decode, encode, CodecError, SNAPSHOT_SCHEMA};
use crate::session::definition::AgentDefinition;
use crate::session::info::AgentSessionInfo;
use crate::session::state::AgentState;
use crate::session::AgentSession;

#[derive(Serialize)]
struct SnapshotRef<'a> {
    info: &'a AgentSessionInfo,
    definition: &'a AgentDefinition,
    state: &'a AgentState,
}

#[derive(Deserialize)]
struct SnapshotOwned {
    info: AgentSessionInfo,
    definition: AgentDefinition,
    state: AgentState,
}

/// Encodes a session (header, definition, state; never the pending list)
/// as a snapshot: `[SNAPSHOT_SCHEMA] ++ msgpack(named)`.
pub fn encode_snapshot(session: &AgentSession) -> Result<Vec<u8>, CodecError> {
    encode(
        "snapshot",
        SNAPSHOT_SCHEMA,
        &SnapshotRef {
            info: &session.info,
            definition: &session.definition,
            state: &session.state,
        },
        entries_bytes_hint(session.state.transcript.entries()),
    )
}

/// Decodes a snapshot. Any error means "ignore the snapshot and replay".
///
/// The layout [`encode_snapshot`] writes is read by hand (the state as in
/// [`decode_event`](crate::session::decode_event)); any other shape goes through serde. Both give the
/// same value.
pub fn decode_snapshot(bytes: &[u8]) -> Result<AgentSession, CodecError> {
    if let Some(body) = fast_body(SNAPSHOT_SCHEMA, bytes) {
        if let Some((info, definition, state)) = msgpack::snapshot(body) {
            return Ok(AgentSession::from_parts(info, definition, state));
        }
    }
    decode_snapshot_serde(bytes)
}

/// [`decode_snapshot`] through serde alone: the reference the hand reader
/// is checked against (tests, the `event_decode` fuzz target).
pub fn decode_snapshot_serde(bytes: &[u8]) -> Result<AgentSession, CodecError> {
    let s: SnapshotOwned = decode("snapshot", SNAPSHOT_SCHEMA, bytes)?;
    Ok(AgentSession::from_parts(s.info, s.definition, s.state))
}

#[cfg(test)]
mod tests {
    use super::super::event::{
        decode_event, decode_event_serde, decode_event_split, decode_event_without_transcript,
        encode_event, TranscriptParts,
    };
    use super::super::msgpack;
    use super::super::test_support::{
        created, for_each_damage, has_json, samples, state_of, transcripts,
    };
    use super::super::{encode, EVENT_SCHEMA, SNAPSHOT_SCHEMA};
    use super::*;
    use crate::session::events::SessionEvent;
    use crate::transcript::Entry;

    fn snapshot_of(state: AgentState) -> AgentSession {
        let mut s = AgentSession::new(AgentDefinition::new("agent", "d", "sp"), None);
        s.state = state;
        s.pending.clear();
        s
    }

    /// What [`decode_event_split`] answers for `ev`.
    fn split(mut ev: SessionEvent) -> (SessionEvent, Option<TranscriptParts>) {
        let parts = match &mut ev {
            SessionEvent::Created { state, .. } => {
                let t = std::mem::take(&mut state.transcript);
                Some((t.entries().to_vec(), t.leaf().cloned()))
            }
            _ => None,
        };
        (ev, parts)
    }

    fn without_transcript(mut ev: SessionEvent) -> SessionEvent {
        if let SessionEvent::Created { state, .. } = &mut ev {
            state.transcript = crate::transcript::Transcript::new();
        }
        ev
    }

    #[test]
    fn created_events_and_snapshots_are_read_by_hand_as_serde_reads_them() {
        for (i, entries) in transcripts().into_iter().enumerate() {
            let ev = created(state_of(entries.clone()), i % 2 == 0);
            let bytes = encode_event(&ev).unwrap();
            // The written layout is taken by hand, JSON entries included.
            assert_eq!(msgpack::event(&bytes[1..], true).as_ref(), Some(&ev));
            assert_eq!(decode_event_serde(&bytes).unwrap(), ev);
            assert_eq!(decode_event(&bytes).unwrap(), ev);
            let bare = msgpack::event(&bytes[1..], false).unwrap();
            assert_eq!(bare, without_transcript(ev.clone()));
            assert_eq!(decode_event_without_transcript(&bytes).unwrap(), bare);
            assert_eq!(decode_event_split(&bytes).unwrap(), split(ev.clone()));
            assert!(msgpack::event_with(&bytes[1..], msgpack::Keep::Entries).is_some());

            // An appended entry, every kind of it: by hand when the entry reader
            // takes it, by serde from the entry's bytes when it does not.
            for e in &entries {
                let appended = SessionEvent::EntryAppended { entry: e.clone() };
                let bytes = encode_event(&appended).unwrap();
                assert_eq!(msgpack::event(&bytes[1..], true).as_ref(), Some(&appended));
                assert_eq!(decode_event_serde(&bytes).unwrap(), appended);
                assert_eq!(decode_event(&bytes).unwrap(), appended);
            }

            let rewritten = SessionEvent::HistoryRewritten {
                generation: 9,
                leaf: entries.first().map(|e| e.id.clone()),
                entries: entries.clone(),
            };
            let bytes = encode_event(&rewritten).unwrap();
            assert_eq!(msgpack::event(&bytes[1..], true).as_ref(), Some(&rewritten));
            assert_eq!(decode_event_serde(&bytes).unwrap(), rewritten);
            assert_eq!(decode_event(&bytes).unwrap(), rewritten);

            let snap = snapshot_of(state_of(entries));
            let bytes = encode_snapshot(&snap).unwrap();
            assert!(msgpack::snapshot(&bytes[1..]).is_some());
            assert_eq!(decode_snapshot_serde(&bytes).unwrap(), snap);
            assert_eq!(decode_snapshot(&bytes).unwrap(), snap);
        }
        // Other events are serde's, unchanged by the variant decoder.
        let moved = encode_event(&SessionEvent::LeafMoved { leaf: None }).unwrap();
        assert!(msgpack::event(&moved[1..], true).is_none());
        assert_eq!(
            decode_event_without_transcript(&moved).unwrap(),
            decode_event_serde(&moved).unwrap()
        );
        assert_eq!(
            decode_event_split(&moved).unwrap(),
            (decode_event_serde(&moved).unwrap(), None)
        );
    }

    /// Layouts the hand reader does not take (an unknown extra field,
    /// another field order, a value nested deeper than the skipper
    /// follows) decode through serde to serde's answer.
    #[test]
    fn other_layouts_of_created_events_and_snapshots_go_to_serde() {
        #[derive(Serialize)]
        struct Extra<'a> {
            info: &'a AgentSessionInfo,
            definition: &'a AgentDefinition,
            state: &'a AgentState,
            unknown: u8,
        }
        #[derive(Serialize)]
        struct Reordered<'a> {
            state: &'a AgentState,
            info: &'a AgentSessionInfo,
            definition: &'a AgentDefinition,
        }
        #[derive(Serialize)]
        struct CreatedReordered<'a> {
            #[serde(rename = "type")]
            tag: &'a str,
            state: &'a AgentState,
            id: &'a str,
            parent_id: Option<&'a str>,
            agent_name: &'a str,
            label: &'a str,
            created_at_ms: i64,
            definition: &'a AgentDefinition,
        }
        let plain: Vec<Entry> = samples().into_iter().filter(|e| !has_json(e)).collect();
        let snap = snapshot_of(state_of(plain.clone()));
        let extra = encode(
            "snapshot",
            SNAPSHOT_SCHEMA,
            &Extra {
                info: &snap.info,
                definition: &snap.definition,
                state: &snap.state,
                unknown: 7,
            },
            0,
        )
        .unwrap();
        let reordered = encode(
            "snapshot",
            SNAPSHOT_SCHEMA,
            &Reordered {
                info: &snap.info,
                definition: &snap.definition,
                state: &snap.state,
            },
            0,
        )
        .unwrap();
        for bytes in [extra, reordered] {
            assert!(msgpack::snapshot(&bytes[1..]).is_none());
            assert_eq!(decode_snapshot(&bytes).unwrap(), snap);
            assert_eq!(decode_snapshot_serde(&bytes).unwrap(), snap);
        }
        let ev = created(state_of(plain.clone()), false);
        let SessionEvent::Created {
            id,
            agent_name,
            label,
            created_at_ms,
            definition,
            state,
            ..
        } = &ev
        else {
            unreachable!()
        };
        let bytes = encode(
            "event",
            EVENT_SCHEMA,
            &CreatedReordered {
                tag: "created",
                state,
                id: id.as_str(),
                parent_id: None,
                agent_name,
                label,
                created_at_ms: *created_at_ms,
                definition,
            },
            0,
        )
        .unwrap();
        assert!(msgpack::event(&bytes[1..], true).is_none());
        assert_eq!(decode_event(&bytes).unwrap(), ev);
        assert_eq!(
            decode_event_without_transcript(&bytes).unwrap(),
            without_transcript(ev.clone())
        );
        assert_eq!(decode_event_split(&bytes).unwrap(), split(ev));
        // Metadata nested deeper than the skipper follows (but well within
        // serde's limit): serde's answer.
        let mut deep = serde_json::json!(1);
        for _ in 0..msgpack::SKIP_DEPTH_MAX + 10 {
            deep = serde_json::json!([deep]);
        }
        let ev = created(state_of(plain).with_metadata("deep", deep), true);
        let bytes = encode_event(&ev).unwrap();
        assert!(msgpack::event(&bytes[1..], true).is_none());
        assert_eq!(decode_event(&bytes).unwrap(), ev);
    }

    /// Truncated and damaged created events and snapshots: the hand
    /// readers never panic and, when they answer, answer what serde
    /// answers; the public decoders agree with serde.
    #[test]
    fn damaged_created_events_and_snapshots_decode_as_serde_decodes_them() {
        let small: Vec<Entry> = samples()
            .into_iter()
            .filter(|e| {
                encode_event(&SessionEvent::EntryAppended { entry: e.clone() })
                    .is_ok_and(|b| b.len() < 300)
            })
            .take(4)
            .collect();
        assert!(small.iter().any(has_json) && small.iter().any(|e| !has_json(e)));
        let mut state = state_of(small);
        state.system_prompt = "sp".into();
        let event = encode_event(&created(state.clone(), true)).unwrap();
        let snapshot = encode_snapshot(&snapshot_of(state)).unwrap();
        let check = |b: &[u8]| {
            let serde = decode_event_serde(b).ok();
            if let Some(body) = b.get(1..) {
                if let Some(fast) = msgpack::event(body, true) {
                    assert_eq!(Some(fast), serde, "{b:?}");
                }
                if let Some(bare) = msgpack::event(body, false) {
                    assert_eq!(Some(bare), serde.clone().map(without_transcript), "{b:?}");
                }
            }
            assert_eq!(decode_event(b).ok(), serde, "{b:?}");
            assert_eq!(
                decode_event_without_transcript(b).ok(),
                serde.clone().map(without_transcript),
                "{b:?}"
            );
            assert_eq!(decode_event_split(b).ok(), serde.map(split), "{b:?}");
            let mut s = b.to_vec();
            if let Some(x) = s.first_mut() {
                *x = SNAPSHOT_SCHEMA;
            }
            let serde = decode_snapshot_serde(&s).ok();
            if let Some(fast) = s.get(1..).and_then(msgpack::snapshot) {
                let (info, definition, state) = fast;
                let fast = AgentSession::from_parts(info, definition, state);
                assert_eq!(Some(fast), serde, "{s:?}");
            }
            assert_eq!(decode_snapshot(&s).ok(), serde, "{s:?}");
        };
        for bytes in [&event, &snapshot] {
            for_each_damage(bytes, check);
        }
    }
}
