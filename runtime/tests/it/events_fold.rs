//! Domain events: the fold, replay, and the event/snapshot codecs.

use crate::common;

use std::sync::Arc;

use common::*;
use proptest::prelude::*;
use spool_runtime::actions::{SendMessage, SessionAction};
use spool_runtime::agent_loop::{ScriptedLoopFactory, ScriptedTurn};
use spool_runtime::session::{
    decode_event, decode_snapshot, encode_event, encode_snapshot, AgentSession, AgentState,
    CodecError, ExecutionStatus, FoldError, ModelConfig, SessionEvent, SessionStatus, Task,
    TaskStatus, EVENT_SCHEMA, SNAPSHOT_SCHEMA,
};
use spool_runtime::transcript::{ContentBlock, Entry, EntryKind, Message, Usage};

fn user(text: &str) -> EntryKind {
    EntryKind::Message {
        message: Message::User {
            content: vec![ContentBlock::text(text)],
        },
    }
}

/// A session that has been through every kind of event, and its events.
fn busy_session() -> (AgentSession, Vec<SessionEvent>) {
    let seed = AgentState::new().with_metadata("seeded", serde_json::json!([1, 2]));
    let mut s = AgentSession::new(definition("busy"), Some(seed));
    let root = s.append(user("root")).unwrap();
    s.append(user("a")).unwrap();
    s.move_leaf(Some(root.clone())).unwrap();
    s.append(user("b")).unwrap();
    s.set_status(SessionStatus::Suspended).unwrap();
    s.set_status(SessionStatus::Active).unwrap();
    s.set_system_prompt("new prompt").unwrap();
    s.set_model(ModelConfig::new("x", "y").with_param("t", serde_json::json!(0.5)))
        .unwrap();
    s.write_metadata("k", serde_json::json!({"deep": {"er": null}}))
        .unwrap();
    s.write_metadata("gone", serde_json::json!(1)).unwrap();
    s.remove_metadata("gone").unwrap();
    s.set_tasks(vec![Task::new("t", "task", TaskStatus::InProgress)])
        .unwrap();
    let f = Arc::new(ScriptedLoopFactory::new([
        ScriptedTurn::ToolRound {
            tool: "grep".into(),
            arguments: serde_json::json!({"q": "x"}),
            result: "found".into(),
            reply: "done".into(),
        },
        ScriptedTurn::Fail("nope".into()),
    ]));
    SendMessage::new("go", f.clone()).execute(&mut s).unwrap();
    SendMessage::new("again", f).execute(&mut s).unwrap();
    let kept: Vec<Entry> = s.state().transcript.entries()[..1].to_vec();
    let leaf = Some(kept[0].id.clone());
    s.rewrite_history(kept, leaf).unwrap();
    s.clear_state().unwrap();
    s.append(user("after clear")).unwrap();
    s.touch();
    let fork = s.fork(None).unwrap();
    let mut fork_events = fork.pending_events().to_vec();
    assert_eq!(fork_events.remove(0).kind(), "created");
    assert_eq!(fork_events[0].kind(), "forked");
    s.mark_deleted().unwrap();
    let events = s.pending_events().to_vec();
    (s, events)
}

#[test]
fn a_session_is_the_fold_of_its_events() {
    let (s, events) = busy_session();
    let kinds: std::collections::BTreeSet<_> = events.iter().map(SessionEvent::kind).collect();
    for k in [
        "created",
        "entry_appended",
        "leaf_moved",
        "status_changed",
        "system_prompt_changed",
        "model_changed",
        "metadata_written",
        "metadata_removed",
        "task_updated",
        "state_cleared",
        "execution_started",
        "execution_finished",
        "history_rewritten",
        "deleted",
        "touched",
    ] {
        assert!(kinds.contains(k), "busy_session lacks {k}");
    }
    let replayed = AgentSession::replay(&events).unwrap();
    assert_eq!(replayed, s.clone().reconstitute(0, s.info().created_at_ms));
    assert_eq!(replayed.status(), SessionStatus::Deleted);
}

#[test]
fn every_event_round_trips_through_the_codec() {
    let (s, events) = busy_session();
    let fork = AgentSession::new(definition("x"), None).fork(None).unwrap();
    for ev in events.iter().chain(fork.pending_events()) {
        let bytes = encode_event(ev).unwrap();
        assert_eq!(bytes[0], EVENT_SCHEMA);
        assert_eq!(&decode_event(&bytes).unwrap(), ev, "{}", ev.kind());
    }
    let decoded: Vec<_> = events
        .iter()
        .map(|e| decode_event(&encode_event(e).unwrap()).unwrap())
        .collect();
    assert_eq!(
        AgentSession::replay(&decoded).unwrap(),
        AgentSession::replay(&events).unwrap()
    );
    let _ = s;
}

#[test]
fn snapshot_plus_tail_equals_full_replay() {
    let (_s, events) = busy_session();
    for cut in [1, 5, events.len() / 2, events.len()] {
        let head = AgentSession::replay(&events[..cut]).unwrap();
        let snap = encode_snapshot(&head).unwrap();
        assert_eq!(snap[0], SNAPSHOT_SCHEMA);
        let restored = decode_snapshot(&snap).unwrap();
        assert_eq!(restored, head);
        let full = restored.replay_onto(&events[cut..]).unwrap();
        assert_eq!(full, AgentSession::replay(&events).unwrap());
    }
}

#[test]
fn old_schema_or_corrupt_snapshots_are_errors_not_panics() {
    let (_s, events) = busy_session();
    let head = AgentSession::replay(&events[..3]).unwrap();
    let mut snap = encode_snapshot(&head).unwrap();
    snap[0] = SNAPSHOT_SCHEMA.wrapping_add(1);
    assert!(matches!(
        decode_snapshot(&snap),
        Err(CodecError::UnsupportedSchema { .. })
    ));
    snap[0] = SNAPSHOT_SCHEMA;
    snap.truncate(snap.len() / 2);
    assert!(matches!(
        decode_snapshot(&snap),
        Err(CodecError::Malformed { .. })
    ));
    assert!(matches!(
        decode_snapshot(&[]),
        Err(CodecError::Empty { .. })
    ));
    assert!(matches!(decode_event(&[]), Err(CodecError::Empty { .. })));
    // An event is not a snapshot.
    let ev = encode_event(&events[1]).unwrap();
    assert!(decode_snapshot(&ev).is_err());
}

#[test]
fn replay_refuses_broken_histories() {
    let (_s, events) = busy_session();
    assert!(matches!(
        AgentSession::replay(std::iter::empty()),
        Err(FoldError::Empty)
    ));
    assert!(matches!(
        AgentSession::replay(&events[1..]),
        Err(FoldError::NotCreated { .. })
    ));
    let twice = [events[0].clone(), events[0].clone()];
    assert!(matches!(
        AgentSession::replay(&twice),
        Err(FoldError::AlreadyCreated)
    ));
    // An entry whose parent is unknown.
    let orphan = SessionEvent::EntryAppended {
        entry: Entry::new(
            Some(spool_runtime::transcript::EntryId::parse("ghost").unwrap()),
            user("x"),
        ),
    };
    assert!(matches!(
        AgentSession::replay([&events[0], &orphan]),
        Err(FoldError::Transcript { .. })
    ));
}

#[test]
fn refused_mutations_record_nothing() {
    let mut s = AgentSession::new(definition("a"), None);
    let n = s.pending_events().len();
    let ghost = spool_runtime::transcript::EntryId::parse("ghost").unwrap();
    assert!(s
        .append_entry(Entry::new(Some(ghost.clone()), user("x")))
        .is_err());
    assert!(s.move_leaf(Some(ghost)).is_err());
    assert!(s
        .set_tasks(vec![
            Task::new("a", "", TaskStatus::InProgress),
            Task::new("b", "", TaskStatus::InProgress),
        ])
        .is_err());
    s.set_status(SessionStatus::Completed).unwrap();
    assert!(s.set_status(SessionStatus::Suspended).is_err());
    assert_eq!(s.pending_events().len(), n + 1);
    s.mark_deleted().unwrap();
    assert!(s.write_metadata("k", serde_json::json!(1)).is_err());
    assert!(s.set_status(SessionStatus::Active).is_err());
    assert!(s.fork(None).is_err());
    assert_eq!(s.pending_events().len(), n + 2);
}

#[test]
fn execution_events_track_usage() {
    let mut s = AgentSession::new(definition("a"), None);
    assert_eq!(s.start_execution().unwrap(), 1);
    let u = Usage {
        input_tokens: 5,
        output_tokens: 2,
        ..Default::default()
    };
    s.finish_execution(ExecutionStatus::Completed, u, None)
        .unwrap();
    assert_eq!(s.start_execution().unwrap(), 2);
    assert_eq!(s.state().execution, ExecutionStatus::InProgress);
    assert_eq!(s.state().usage, Usage::default());
    s.finish_execution(ExecutionStatus::Stopped, u, None)
        .unwrap();
    assert_eq!(s.state().total_usage.input_tokens, 10);
    assert_eq!(s.state().execution, ExecutionStatus::Stopped);
}

#[derive(Debug, Clone)]
enum Op {
    Append(String),
    MoveLeafBack(usize),
    Meta(String, i64),
    Unmeta(String),
    Status(u8),
    Prompt(String),
    Clear,
    Exec(bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => "[a-z]{0,12}".prop_map(Op::Append),
        1 => (0usize..20).prop_map(Op::MoveLeafBack),
        2 => ("[a-c]", any::<i64>()).prop_map(|(k, v)| Op::Meta(k, v)),
        1 => "[a-c]".prop_map(Op::Unmeta),
        1 => (0u8..4).prop_map(Op::Status),
        1 => "[a-z ]{0,20}".prop_map(Op::Prompt),
        1 => Just(Op::Clear),
        1 => any::<bool>().prop_map(Op::Exec),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Any sequence of mutations: replaying the (encoded, decoded) pending
    /// events gives back the same session.
    #[test]
    fn replay_of_any_mutation_sequence_matches(ops in proptest::collection::vec(op(), 0..60)) {
        let mut s = AgentSession::new(definition("p"), None);
        for o in ops {
            // Refusals are fine; they must just leave no trace.
            let _ = match o {
                Op::Append(t) => s.append(user(&t)).map(|_| ()),
                Op::MoveLeafBack(n) => {
                    let e = s.state().transcript.entries();
                    let target = e.len().checked_sub(n + 1).map(|i| e[i].id.clone());
                    s.move_leaf(target)
                }
                Op::Meta(k, v) => s.write_metadata(k, serde_json::json!(v)),
                Op::Unmeta(k) => s.remove_metadata(&k).map(|_| ()),
                Op::Status(i) => s.set_status([
                    SessionStatus::Active,
                    SessionStatus::Suspended,
                    SessionStatus::Completed,
                    SessionStatus::Failed,
                ][i as usize]).map(|_| ()),
                Op::Prompt(p) => s.set_system_prompt(p),
                Op::Clear => s.clear_state(),
                Op::Exec(ok) => s.start_execution().and_then(|_| s.finish_execution(
                    if ok { ExecutionStatus::Completed } else { ExecutionStatus::Failed },
                    Usage { output_tokens: 1, ..Default::default() },
                    (!ok).then(|| "x".to_string()),
                )),
            };
        }
        let decoded: Vec<SessionEvent> = s
            .pending_events()
            .iter()
            .map(|e| decode_event(&encode_event(e).unwrap()).unwrap())
            .collect();
        let replayed = AgentSession::replay(&decoded).unwrap();
        prop_assert_eq!(replayed, s.clone().reconstitute(0, s.info().created_at_ms));
    }

    /// Hostile bytes never panic the decoders.
    #[test]
    fn hostile_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
        let mut ev = vec![EVENT_SCHEMA];
        ev.extend_from_slice(&body);
        let _ = decode_event(&ev);
        let mut snap = vec![SNAPSHOT_SCHEMA];
        snap.extend_from_slice(&body);
        let _ = decode_snapshot(&snap);
        let _ = decode_event(&body);
    }

    /// Flipping any byte of a valid encoding gives an error or some event,
    /// never a panic.
    #[test]
    fn mutated_encodings_never_panic(idx in any::<prop::sample::Index>(), byte in any::<u8>()) {
        let (_s, events) = busy_session();
        for e in events.iter().take(8) {
            let mut b = encode_event(e).unwrap();
            let i = idx.index(b.len());
            b[i] = byte;
            let _ = decode_event(&b);
        }
    }
}
