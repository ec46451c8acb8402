//! The session pipeline and writer handles: one writer per session per
//! process (an open writer handle refuses `execute` and `delete`), and
//! what handle writes promise instead of hooks (one `SessionSaved` per
//! commit, with the committed version; no hook stage runs).

use crate::handle_support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use handle_support::*;
use spool_runtime::actions::WriteMetadata;
use spool_runtime::handle::{HandleError, HandleOptions, SessionHandle};
use spool_runtime::hooks::{FnHook, HookStage, SessionHookStack};
use spool_runtime::observer::{NullSink, RecordingSink, RuntimeEvent};
use spool_runtime::session::{SessionId, SessionStatus};
use spool_runtime::store::{MemoryStore, SessionStore};
use spool_runtime::transcript::{CancelToken, Replacement};
use spool_runtime::{RuntimeError, SessionRuntime};

/// The log store (its own backend) and the memory store (the full-load
/// adapter): the registry key differs, the rule does not.
fn stores(dir: &std::path::Path) -> Vec<(&'static str, Arc<dyn SessionStore>)> {
    vec![
        ("log", open_log(dir) as Arc<dyn SessionStore>),
        ("memory", Arc::new(MemoryStore::new())),
    ]
}

fn version(rt: &SessionRuntime, id: &SessionId) -> u64 {
    rt.session_info(id).unwrap().version
}

#[test]
fn execute_and_delete_are_refused_while_a_writer_handle_is_open() {
    let dir = tempfile::tempdir().unwrap();
    for (name, store) in stores(dir.path()) {
        let (rt, sink) = runtime(store);
        let id = new_session(&rt);
        let h = writer(&rt, &id, 64 * 1024);
        h.append(user("through the handle")).unwrap();
        let before = version(&rt, &id);
        sink.take();

        let err = rt
            .execute(&id, &WriteMetadata::new("k", 1))
            .expect_err(name);
        assert!(
            matches!(&err, RuntimeError::WriterHeld { id: i, holder } if *i == id && *holder == h.owner()),
            "{name}: {err:?}"
        );
        assert_eq!(err.kind(), "writer_held");
        assert!(!err.is_conflict());
        let events = sink.take();
        assert_eq!(events.len(), 1, "{name}: {events:?}");
        assert!(
            matches!(&events[0], RuntimeEvent::SessionActionFailed { session_id, action, error_kind, .. }
                if *session_id == id && action == "write_metadata" && error_kind == "writer_held"),
            "{name}: {events:?}"
        );
        let err = rt.delete(&id).expect_err(name);
        assert!(matches!(err, RuntimeError::WriterHeld { .. }), "{name}");
        assert_eq!(sink.names(), ["SessionActionFailed"], "{name}");
        // Nothing was written: same version, not deleted, no metadata.
        assert_eq!(version(&rt, &id), before, "{name}");
        assert_eq!(rt.status(&id).unwrap(), SessionStatus::Active, "{name}");
        assert!(!rt
            .get_session(&id)
            .unwrap()
            .state()
            .metadata
            .contains_key("k"));
        // The handle still writes.
        h.append(user("still the writer")).unwrap();
        assert_eq!(version(&rt, &id), before + 1, "{name}");

        // A reader handle does not hold the slot.
        drop(h);
        let r = rt.open_handle(&id, HandleOptions::reader()).unwrap();
        let s = rt.execute(&id, &WriteMetadata::new("k", 2)).unwrap();
        assert_eq!(s.version(), before + 2, "{name}");
        drop(r);
        // Closing the writer frees the session for the pipeline.
        let h = writer(&rt, &id, 64 * 1024);
        assert!(rt.delete(&id).is_err());
        h.close();
        assert_eq!(rt.delete(&id).unwrap().status(), SessionStatus::Deleted);
    }
}

/// A writer handle opened while an execute runs is granted (executes do
/// not take the slot); the execute then stores nothing and reports its
/// save as failed. After the execute, writer handles open as usual.
#[test]
fn a_writer_handle_opened_during_an_execute_wins_and_the_execute_stores_nothing() {
    let dir = tempfile::tempdir().unwrap();
    for (name, store) in stores(dir.path()) {
        let opened: Arc<Mutex<Option<Result<SessionHandle, HandleError>>>> =
            Arc::new(Mutex::new(None));
        let hook = {
            let (store, opened) = (store.clone(), opened.clone());
            FnHook::new("open-writer", move |stage, session| {
                if stage == HookStage::AfterAction {
                    let h = SessionHandle::open(
                        store.clone(),
                        Arc::new(NullSink),
                        session.id(),
                        HandleOptions::writer(),
                    );
                    *opened.lock().unwrap() = Some(h);
                }
                Ok(())
            })
        };
        let sink = Arc::new(RecordingSink::new());
        let rt = SessionRuntime::new(
            store.clone(),
            sink.clone(),
            SessionHookStack::empty().with(hook, 0),
        );
        let id = new_session(&rt);
        let before = version(&rt, &id);
        sink.take();

        let err = rt
            .execute(&id, &WriteMetadata::new("k", 1))
            .expect_err(name);
        let h = opened
            .lock()
            .unwrap()
            .take()
            .expect("the hook ran")
            .expect("a writer handle opens during an execute");
        assert!(
            matches!(&err, RuntimeError::WriterHeld { holder, .. } if *holder == h.owner()),
            "{name}: {err:?}"
        );
        assert_eq!(
            sink.names(),
            [
                "SessionLoaded",
                "SessionActionExecuted",
                "SessionSaveFailed"
            ],
            "{name}"
        );
        assert!(matches!(
            &sink.events()[2],
            RuntimeEvent::SessionSaveFailed { error_kind, .. } if error_kind == "writer_held"
        ));
        assert_eq!(version(&rt, &id), before, "{name}");
        // The handle opened during the execute is the writer.
        h.append(user("the handle's write")).unwrap();
        assert_eq!(version(&rt, &id), before + 1, "{name}");
        drop(h);

        // With no handle open the same execute commits (the hook opens a
        // handle again, so it is refused again: executes do not hold the
        // slot). A pipeline without that hook commits, and a writer handle
        // opens after it.
        let plain = SessionRuntime::new(store.clone(), sink.clone(), SessionHookStack::empty());
        let s = plain.execute(&id, &WriteMetadata::new("k", 2)).unwrap();
        assert_eq!(s.version(), before + 2, "{name}");
        let h = plain.open_handle(&id, HandleOptions::writer()).unwrap();
        assert_eq!(h.snapshot().session_version, before + 2, "{name}");
    }
}

/// Every committed handle write (append, batch, leaf move, branch, label,
/// rewrite as `spool compact` commits it, truncation, redaction, trailing
/// removal) reaches the runtime's sink as exactly one `SessionSaved` with
/// the committed version; no hook stage runs for it; a refused write emits
/// nothing.
#[test]
fn every_handle_commit_is_one_session_saved_and_runs_no_hook() {
    let dir = tempfile::tempdir().unwrap();
    for (name, store) in stores(dir.path()) {
        let calls = Arc::new(AtomicUsize::new(0));
        let hook = {
            let calls = calls.clone();
            FnHook::new("count", move |_, _| {
                calls.fetch_add(1, Ordering::SeqCst);
                Ok(())
            })
        };
        let sink = Arc::new(RecordingSink::new());
        let rt = SessionRuntime::new(
            store.clone(),
            sink.clone(),
            SessionHookStack::empty().with(hook, 0),
        );
        let id = new_session(&rt);
        assert!(
            calls.load(Ordering::SeqCst) > 0,
            "the create pipeline ran hooks"
        );
        calls.store(0, Ordering::SeqCst);
        sink.take();
        let h = writer(&rt, &id, 64 * 1024);
        let mut expected = version(&rt, &id);
        let mut check = |what: &str| {
            expected += 1;
            assert_eq!(h.snapshot().session_version, expected, "{name} {what}");
            assert_eq!(version(&rt, &id), expected, "{name} {what}");
            assert_eq!(
                sink.take(),
                vec![RuntimeEvent::SessionSaved {
                    session_id: id.clone(),
                    version: expected,
                    status: SessionStatus::Active,
                }],
                "{name} {what}"
            );
        };

        let first = h.append(user("a secret")).unwrap();
        check("append");
        let ids = h
            .append_entries(vec![
                assistant(
                    "long tool talk",
                    spool_runtime::transcript::StopReason::Stop,
                ),
                user("more"),
            ])
            .unwrap();
        check("append_entries");
        h.move_leaf(Some(first.clone())).unwrap();
        check("move_leaf");
        h.move_leaf(Some(ids[1].clone())).unwrap();
        check("move_leaf back");
        h.branch_with_summary(Some(first.clone()), "elsewhere")
            .unwrap();
        check("branch_with_summary");
        h.set_label(&first, Some("start".into())).unwrap();
        check("set_label");
        // The route `spool compact` takes: prepare, then commit.
        let cancel = CancelToken::new();
        let prepared = h
            .prepare_rewrite(
                vec![(ids[1].clone(), Replacement::Replace(user("rewritten")))],
                h.snapshot().version,
                &cancel,
            )
            .unwrap();
        let committed = h.commit_rewrite(prepared, &cancel).unwrap();
        assert!(committed.written);
        assert_eq!(committed.session_version, h.snapshot().session_version);
        check("commit_rewrite");
        let redacted = h
            .redact(&|s: &str| s.replace("secret", "[redacted]"), &cancel)
            .unwrap();
        assert!(redacted.is_some(), "{name}: redaction found the text");
        check("redact");
        let trailing = h
            .remove_trailing_entries(&|_| true, &|_| false, &cancel)
            .unwrap();
        assert!(trailing.committed.is_some(), "{name}");
        check("remove_trailing_entries");

        // Nothing to do: nothing committed, nothing reported.
        assert!(h.truncate_tool_results(1, &cancel).unwrap().is_none());
        // A refused write (a stale fence after another writer committed)
        // commits nothing and emits nothing.
        let mut other = rt.store().load(&id).unwrap().unwrap();
        other.append(user("from elsewhere")).unwrap();
        rt.store().save(other).unwrap();
        sink.take();
        assert!(matches!(
            h.append(user("stale")),
            Err(HandleError::Conflict { .. })
        ));
        assert!(sink.take().is_empty(), "{name}");
        assert_eq!(calls.load(Ordering::SeqCst), 0, "{name}: no hook ran");
    }
}
