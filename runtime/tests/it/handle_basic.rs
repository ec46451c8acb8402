//! Session handles over the log store: 1,000 appends within the budget,
//! writer exclusion, index rebuild, the memory-store adapter, observers.
//! The scenarios every indexed store runs (bounded open, omitted-branch
//! navigation, retained data) are in `handle_backends`.

use crate::handle_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use handle_support::*;
use spool_runtime::handle::{
    BranchWithSummary, HandleError, HandleEvent, HandleOptions, HistorySelection, MoveLeaf,
    SetLabel,
};
use spool_runtime::observer::RuntimeEvent;
use spool_runtime::store::{MemoryStore, SessionStore};
use spool_runtime::transcript::{
    select_resident, Budget, CancelToken, EntryId, OversizedPolicy, PageBudget, PageOrder,
    ReadResult,
};

fn reference(
    store: &dyn SessionStore,
    id: &spool_runtime::SessionId,
    leaf: Option<&EntryId>,
    budget: Budget,
) -> spool_runtime::transcript::ResidentSelection {
    let t = full_transcript(store, id);
    select_resident(&t, leaf, budget).expect("reference selection")
}

#[test]
fn a_thousand_appends_stay_within_the_budget() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, sink) = runtime(store.clone());
    let id = new_session(&rt);
    let budget = Budget::new(16 * 1024, 64);
    let h = rt
        .open_handle(&id, HandleOptions::writer().with_budget(budget))
        .unwrap();
    sink.take();
    let mut max_bytes = 0;
    for i in 0..1000 {
        h.append(sized(i, 300 + (i * 37) % 900)).unwrap();
        let s = h.snapshot();
        assert!(s.resident_bytes() <= budget.bytes_max, "after {i}");
        assert!(s.resident_events() <= budget.events_max, "after {i}");
        assert_eq!(s.counts().path_entries, i as u64 + 1);
        max_bytes = max_bytes.max(s.resident_bytes());
    }
    let s = h.snapshot();
    assert_eq!(s.session_version, 1001);
    assert_eq!(s.revision, 1001);
    // Every commit was reported once, with its version.
    let saved: Vec<u64> = sink
        .events()
        .iter()
        .filter_map(|e| match e {
            RuntimeEvent::SessionSaved { version, .. } => Some(*version),
            _ => None,
        })
        .collect();
    assert_eq!(saved, (2..=1001).collect::<Vec<_>>());
    // The incremental snapshot equals a fresh selection of the whole
    // transcript.
    assert_eq!(
        s.selection,
        reference(&*store, &id, s.leaf.as_ref(), budget)
    );
    assert!(max_bytes <= budget.bytes_max);
}

#[test]
fn one_writer_per_session_readers_unlimited() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let w = rt.open_handle(&id, HandleOptions::writer()).unwrap();
    match rt.open_handle(&id, HandleOptions::writer()) {
        Err(HandleError::WriterBusy { holder, .. }) => assert_eq!(holder, w.owner()),
        other => panic!("expected WriterBusy, got {other:?}"),
    }
    match rt.open_handle(
        &id,
        HandleOptions::writer().waiting(Duration::from_millis(20)),
    ) {
        Err(HandleError::WriterTimeout { holder, .. }) => assert_eq!(holder, w.owner()),
        other => panic!("expected WriterTimeout, got {other:?}"),
    }
    let readers: Vec<_> = (0..5)
        .map(|_| rt.open_handle(&id, HandleOptions::reader()).unwrap())
        .collect();
    assert!(matches!(
        readers[0].append(user("no")),
        Err(HandleError::ReadOnly { .. })
    ));
    // A waiting writer gets the slot once the first closes.
    let rt2 = rt.clone();
    let id2 = id.clone();
    let waiter = std::thread::spawn(move || {
        rt2.open_handle(
            &id2,
            HandleOptions::writer().waiting(Duration::from_secs(60)),
        )
        .map(|h| h.owner())
    });
    std::thread::sleep(Duration::from_millis(20));
    let first = w.owner();
    w.close();
    let second = waiter.join().unwrap().unwrap();
    assert_ne!(first, second);
    // Another session has its own slot.
    let other = new_session(&rt);
    rt.open_handle(&other, HandleOptions::writer()).unwrap();
}

/// Everything a handle answers, for comparing two index states.
fn answers(
    rt: &spool_runtime::SessionRuntime,
    id: &spool_runtime::SessionId,
    ids: &[EntryId],
) -> Vec<String> {
    let h = rt
        .open_handle(
            &id.clone(),
            HandleOptions::reader().with_budget(Budget::new(6000, 64)),
        )
        .unwrap();
    let c = CancelToken::new();
    let mut out = vec![format!("{:?}", h.snapshot().selection)];
    let leaf = h.snapshot().leaf.clone().unwrap();
    let mut sels = vec![
        HistorySelection::Context {
            budget: Budget::new(3000, 10),
        },
        HistorySelection::CustomPage {
            custom_type: Some("state".into()),
            cursor: None,
            budget: PageBudget::new(1 << 20, 3),
        },
        HistorySelection::CustomPage {
            custom_type: None,
            cursor: None,
            budget: PageBudget::new(1 << 20, 100),
        },
        HistorySelection::BranchPage {
            leaf: leaf.clone(),
            order: PageOrder::RootFirst,
            cursor: None,
            budget: PageBudget::new(1 << 20, 1000),
        },
    ];
    for i in ids {
        sels.push(HistorySelection::Entry { id: i.clone() });
        sels.push(HistorySelection::Navigation {
            from: Some(leaf.clone()),
            target: i.clone(),
        });
    }
    for s in &sels {
        let r = h.read(s, &c).unwrap();
        let v = match &r {
            ReadResult::Complete { value, .. } => format!("complete {value:?}"),
            ReadResult::Page { value, .. } => format!("page {value:?}"),
            other => format!("{other:?}"),
        };
        out.push(v);
    }
    out
}

#[test]
fn rebuilt_index_gives_identical_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (id, ids, before) = {
        let store = open_log(dir.path());
        let (rt, _) = runtime(store.clone());
        let id = new_session(&rt);
        let h = writer(&rt, &id, 6000);
        let mut ids = h
            .append_entries((0..30).map(|i| sized(i, 200)).collect())
            .unwrap();
        ids.push(
            h.append(custom("state", serde_json::json!({"n": 1})))
                .unwrap(),
        );
        h.set_label(&ids[3], Some("three".into())).unwrap();
        h.set_label(&ids[3], Some("trois".into())).unwrap();
        ids.push(h.branch_with_summary(Some(ids[5].clone()), "left").unwrap());
        ids.push(
            h.append(custom("state", serde_json::json!({"n": 2})))
                .unwrap(),
        );
        ids.push(h.append(custom("other", serde_json::json!(null))).unwrap());
        ids.push(h.append(user("tail")).unwrap());
        // A rewrite (redaction) and a trailing removal.
        h.redact(&|s| s.replace("u2", "[r]"), &CancelToken::new())
            .unwrap()
            .unwrap();
        ids.push(
            h.append(assistant(
                "oops",
                spool_runtime::transcript::StopReason::Aborted,
            ))
            .unwrap(),
        );
        let out = h
            .remove_trailing_entries(
                &|e| e.kind_name() == "message",
                &|f| f.kind == "custom",
                &CancelToken::new(),
            )
            .unwrap();
        assert_eq!(out.removed.len(), 2);
        drop(h);
        let before = answers(&rt, &id, &ids);
        (id, ids, before)
    };
    // Drop the whole index; reopening rebuilds it from the log.
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    // From the log alone: without the checkpoints too.
    let _ = std::fs::remove_dir_all(dir.path().join("checkpoints"));
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let after = answers(&rt, &id, &ids);
    assert_eq!(before, after);
    // And the indexed answers agree with the fully loaded transcript.
    let h = rt
        .open_handle(
            &id,
            HandleOptions::reader().with_budget(Budget::new(6000, 64)),
        )
        .unwrap();
    let t = full_transcript(&*store, &id);
    assert_eq!(
        h.snapshot().selection,
        select_resident(&t, t.leaf(), Budget::new(6000, 64)).unwrap()
    );
    assert_eq!(t.label(&ids[3]), Some("trois"));
}

#[test]
fn memory_store_handles_work_through_the_full_load_adapter() {
    let store: Arc<dyn SessionStore> = Arc::new(MemoryStore::new());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let budget = Budget::new(4000, 100);
    let h = rt
        .open_handle(&id, HandleOptions::writer().with_budget(budget))
        .unwrap();
    let ids = h
        .append_entries((0..40).map(|i| sized(i, 300)).collect())
        .unwrap();
    h.move_leaf(Some(ids[20].clone())).unwrap();
    h.append(user("branch")).unwrap();
    let s = h.snapshot();
    assert_eq!(
        s.selection,
        reference(&*store, &id, s.leaf.as_ref(), budget)
    );
    let out = h
        .remove_trailing_entries(
            &|e| e.kind_name() == "message",
            &|_| false,
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(out.removed.len(), 22);
    let t = full_transcript(&*store, &id);
    assert_eq!(t.len(), 40 - 21);
    assert_eq!(h.snapshot().leaf, None);
}

#[test]
fn navigation_actions_run_through_the_session_pipeline() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let ids = {
        let h = writer(&rt, &id, 64 * 1024);
        h.append_entries((0..5).map(|i| sized(i, 100)).collect())
            .unwrap()
    };
    rt.execute(
        &id,
        &MoveLeaf {
            to: Some(ids[1].clone()),
        },
    )
    .unwrap();
    rt.execute(
        &id,
        &BranchWithSummary {
            target: Some(ids[2].clone()),
            summary: "tried something".into(),
        },
    )
    .unwrap();
    rt.execute(
        &id,
        &SetLabel {
            target: ids[0].clone(),
            label: Some("start".into()),
        },
    )
    .unwrap();
    assert!(rt
        .execute(
            &id,
            &MoveLeaf {
                to: Some(EntryId::parse("nope").unwrap())
            }
        )
        .is_err());
    let t = full_transcript(&*store, &id);
    let h = rt.open_handle(&id, HandleOptions::reader()).unwrap();
    let s = h.snapshot();
    assert_eq!(s.leaf.as_ref(), t.leaf());
    assert_eq!(s.counts().path_entries, 5);
    let nav = h
        .read(
            &HistorySelection::Navigation {
                from: None,
                target: ids[0].clone(),
            },
            &CancelToken::new(),
        )
        .unwrap();
    let nav = nav.value().and_then(|v| v.as_navigation()).unwrap().clone();
    assert_eq!(nav.target_label.as_deref(), Some("start"));
    assert_eq!(nav.children_total, 1);
}

#[test]
fn subscribers_see_the_new_snapshot_before_session_saved() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, sink) = runtime(store.clone());
    let id = new_session(&rt);
    let h = Arc::new(writer(&rt, &id, 64 * 1024));
    let seen = Arc::new(Mutex::new(Vec::new()));
    let (seen2, sink2) = (seen.clone(), sink.clone());
    h.subscribe(move |ev| {
        let HandleEvent::Published { snapshot, cause } = ev else {
            return;
        };
        let saved_before = sink2
            .events()
            .iter()
            .filter(|e| e.name() == "SessionSaved")
            .count();
        seen2
            .lock()
            .unwrap()
            .push((snapshot.session_version, *cause, saved_before));
    });
    sink.take();
    let a = h.append(user("one")).unwrap();
    h.move_leaf(None).unwrap();
    h.move_leaf(Some(a)).unwrap();
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen,
        vec![(2, "append", 0), (3, "move_leaf", 1), (4, "move_leaf", 2)]
    );
    assert_eq!(sink.names(), vec!["SessionSaved"; 3]);
}

#[test]
fn forks_clears_and_purges_are_indexed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let budget = Budget::new(3000, 100);
    let ids = {
        let h = writer(&rt, &id, 3000);
        let ids = h
            .append_entries((0..40).map(|i| sized(i, 200)).collect())
            .unwrap();
        h.set_label(&ids[5], Some("five".into())).unwrap();
        ids
    };
    // A fork at entry 30: its seed transcript lives in its `created` event.
    let fork = rt.fork(&id, Some(ids[30].clone())).unwrap();
    let f = rt
        .open_handle(fork.id(), HandleOptions::writer().with_budget(budget))
        .unwrap();
    assert_eq!(
        f.snapshot().selection,
        reference(&*store, fork.id(), f.snapshot().leaf.as_ref(), budget)
    );
    assert_eq!(f.snapshot().counts().path_entries, 31);
    assert_eq!(
        f.entry(&ids[0]).unwrap(),
        full_transcript(&*store, fork.id()).get(&ids[0]).cloned()
    );
    f.append(user("in the fork")).unwrap();
    assert_eq!(
        f.snapshot().selection,
        reference(&*store, fork.id(), f.snapshot().leaf.as_ref(), budget)
    );
    // A state clear empties the transcript and bumps the generation.
    let before = rt
        .open_handle(&id, HandleOptions::reader())
        .unwrap()
        .snapshot();
    rt.execute(&id, &spool_runtime::actions::ClearSession)
        .unwrap();
    let h = rt.open_handle(&id, HandleOptions::writer()).unwrap();
    let s = h.snapshot();
    assert_eq!(s.leaf, None);
    assert_eq!(s.transcript_entries, 0);
    assert_eq!(s.version.generation, before.version.generation + 1);
    assert!(h.entry(&ids[0]).unwrap().is_none());
    let a = h.append(user("fresh start")).unwrap();
    assert_eq!(h.snapshot().counts().path_entries, 1);
    drop(h);
    // A purge removes the session's transcript index; a new incarnation
    // starts empty.
    assert!(rt.purge(&id).unwrap());
    assert!(matches!(
        rt.open_handle(&id, HandleOptions::reader()),
        Err(HandleError::NotFound { .. })
    ));
    let engine = store.engine().unwrap();
    assert!(spool_runtime::test_hooks::read_meta(engine.index(), &id)
        .unwrap()
        .is_none());
    drop(engine);
    let f2 = rt.open_handle(fork.id(), HandleOptions::reader()).unwrap();
    assert_eq!(f2.snapshot().counts().path_entries, 32);
    let _ = a;
}

#[test]
fn the_delta_rewrite_event_folds_like_the_plan_and_round_trips() {
    use spool_runtime::session::{decode_event, encode_event, AgentSession, SessionEvent};
    use spool_runtime::transcript::{Replacement, RewritePlan, TranscriptVersion};
    let mut s = AgentSession::new(spool_runtime::AgentDefinition::default(), None);
    let a = s.append(user("a")).unwrap();
    let b = s
        .append(assistant(
            "b",
            spool_runtime::transcript::StopReason::Aborted,
        ))
        .unwrap();
    let c = s.append(custom("blob", serde_json::json!([1, 2]))).unwrap();
    let d = s.append(user("d")).unwrap();
    let t = s.state().transcript.clone();
    let plan = RewritePlan::prepare(
        &t,
        t.leaf(),
        &[
            (b.clone(), Replacement::Remove),
            (d.clone(), Replacement::Replace(user("D"))),
        ],
        TranscriptVersion::default(),
    )
    .unwrap();
    let want = plan.apply_to(&t).unwrap();
    assert_eq!(s.rewrite_transcript(&plan).unwrap(), 1);
    assert_eq!(s.state().transcript, want);
    assert_eq!(
        s.state().transcript.get(&c).unwrap().parent_id.as_ref(),
        Some(&a)
    );
    // Replay (through the codec) gives the same session.
    let events: Vec<SessionEvent> = s
        .pending_events()
        .iter()
        .map(|e| decode_event(&encode_event(e).unwrap()).unwrap())
        .collect();
    assert_eq!(events.last().unwrap().kind(), "transcript_rewritten");
    let replayed = AgentSession::replay(events.iter()).unwrap();
    assert_eq!(replayed.state(), s.state());
    // A rewrite naming an unknown entry is refused and changes nothing.
    let mut bad = s.clone();
    let err = bad.record_transcript_event(SessionEvent::TranscriptRewritten {
        generation: 2,
        written: vec![],
        reparented: vec![],
        removed: vec![b.clone()],
        leaf: None,
    });
    assert!(err.is_err());
    assert_eq!(bad.state(), s.state());
}

/// Root-first pages of two sessions whose commits interleave in the log
/// (so a page's commits are spread out), with entries from a few bytes to
/// well over a read-ahead, give the path of the fully loaded transcript,
/// page after page, with the active segment read by `pread` and after a
/// reopen; and the continuation lands exactly after the last entry.
#[test]
fn root_first_pages_of_interleaved_sessions_give_the_loaded_path() {
    let dir = tempfile::tempdir().unwrap();
    let sizes = [10usize, 300, 4_000, 1_100, 20_000, 60];
    let ids = {
        let store = open_log(dir.path());
        let (rt, _) = runtime(store.clone());
        let a = new_session(&rt);
        let b = new_session(&rt);
        let ha = writer(&rt, &a, 6000);
        let hb = writer(&rt, &b, 6000);
        for i in 0..240 {
            ha.append(sized(i, sizes[i % sizes.len()])).unwrap();
            if i % 3 != 0 {
                hb.append(sized(i, sizes[(i + 2) % sizes.len()])).unwrap();
            }
        }
        // A run of b's commits alone: its pages' commits are adjacent.
        hb.append_entries((0..90).map(|i| sized(i, sizes[i % 4])).collect())
            .unwrap();
        vec![a, b]
    };
    for reopen in 0..2 {
        let store = open_log(dir.path());
        let (rt, _) = runtime(store.clone());
        for id in &ids {
            let want = path_entries(&full_transcript(&*store, id));
            for (bytes, events) in [(1u64, 64u64), (5_000, 64), (65_536, 64), (1 << 20, 7)] {
                let h = rt
                    .open_handle(id, HandleOptions::reader().with_budget(Budget::new(0, 0)))
                    .unwrap();
                let leaf = h.snapshot().leaf.clone().unwrap();
                let (mut got, mut cursor) = (Vec::new(), None);
                loop {
                    let sel = HistorySelection::BranchPage {
                        leaf: leaf.clone(),
                        order: PageOrder::RootFirst,
                        cursor: cursor.take(),
                        budget: PageBudget::new(bytes, events)
                            .with_oversized(OversizedPolicy::Alone),
                    };
                    let r = h.read(&sel, &CancelToken::new()).unwrap();
                    let (page, next) = match r {
                        ReadResult::Complete { value, .. } => (value, None),
                        ReadResult::Page {
                            value,
                            continuation,
                        } => (value, Some(continuation)),
                        other => panic!("{other:?}"),
                    };
                    let page = page.as_page().unwrap().clone();
                    assert!(!page.entries.is_empty());
                    got.extend(page.entries);
                    match next {
                        Some(c) => cursor = Some(c),
                        None => break,
                    }
                }
                assert_eq!(got, want, "reopen {reopen}, session {id}, {bytes} bytes");
            }
        }
    }
}
