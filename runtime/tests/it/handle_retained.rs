//! The retained-data scenario end to end through the log store: a handle
//! with a 4,096-byte budget appends an aborted assistant then a large
//! custom payload; `remove_trailing_entries` removes the assistant,
//! preserves the payload byte-exact and repairs its parent; failures
//! injected mid-commit leave storage and the handle unchanged and a retry
//! succeeds.

use crate::handle_support;

use std::sync::Arc;

use handle_support::*;
use serde_json::{json, Value};
use spool_engine::vfs::{FaultKind, FaultVfs, OsVfs};
use spool_engine::Durability;
use spool_runtime::handle::{HandleError, HandleOptions, SessionHandle};
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::transcript::{
    Budget, CancelToken, Entry, EntryFacts, EntryId, EntryKind, Message, StopReason,
};

fn is_aborted_assistant(e: &Entry) -> bool {
    matches!(
        &e.kind,
        EntryKind::Message {
            message: Message::Assistant {
                stop_reason: StopReason::Aborted | StopReason::Error,
                ..
            }
        }
    )
}

fn is_custom(f: &EntryFacts) -> bool {
    f.kind == "custom"
}

fn data_of(e: &Entry) -> Vec<u8> {
    match &e.kind {
        EntryKind::Custom { data, .. } => serde_json::to_vec(data).unwrap(),
        other => panic!("not a custom entry: {other:?}"),
    }
}

/// A string of exactly `n` bytes mixing ASCII and multi-byte characters.
fn text(n: usize) -> String {
    let unit = "spool-é-\u{1F980}-0123456789\n";
    let mut s = unit.repeat(n / unit.len() + 1);
    while s.len() > n {
        s.pop();
    }
    s
}

fn fault_store(dir: &std::path::Path, fault: &Arc<FaultVfs>) -> Arc<LogStore> {
    let opts = LogStoreOptions {
        durability: Durability::Immediate,
        vfs: Some(fault.clone()),
        ..LogStoreOptions::default()
    };
    Arc::new(LogStore::open(dir, opts).expect("open log store"))
}

fn remove(h: &SessionHandle) -> Result<spool_runtime::handle::TrailingOutcome, HandleError> {
    h.remove_trailing_entries(&is_aborted_assistant, &is_custom, &CancelToken::new())
}

fn scenario(payload: Value, inject: bool) {
    let dir = tempfile::tempdir().unwrap();
    let fault = Arc::new(FaultVfs::new(Arc::new(OsVfs)));
    let store = fault_store(dir.path(), &fault);
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let h = rt
        .open_handle(
            &id,
            HandleOptions::writer().with_budget(Budget::new(4096, 1024)),
        )
        .unwrap();
    let question = h.append(user("question")).unwrap();
    let aborted = h.append(assistant("partial", StopReason::Aborted)).unwrap();
    let blob = h.append(custom("blob", payload.clone())).unwrap();
    let want = serde_json::to_vec(&payload).unwrap();
    let snap = h.snapshot();
    assert!(snap.resident_bytes() <= 4096);
    if want.len() > 4096 {
        assert!(snap.get(&blob).is_none());
        assert_eq!(snap.selection.omitted.len(), 1);
        assert_eq!(snap.selection.omitted[0].id, blob);
    }
    // Entry lookup agrees with storage before the cleanup.
    let stored = full_transcript(&*store, &id);
    assert_eq!(h.entry(&blob).unwrap().as_ref(), stored.get(&blob));
    assert_eq!(data_of(&h.entry(&blob).unwrap().unwrap()), want);

    if inject {
        {
            // A failed write (nothing of the commit reaches the log).
            let kind = FaultKind::Write;
            let before = h.snapshot();
            let stream_before = store.engine().unwrap().stream_version(id.as_str()).unwrap();
            fault.fail_nth(kind, 1, false);
            let err = remove(&h).expect_err("the injected fault fails the commit");
            assert!(matches!(err, HandleError::Store(_)), "{err}");
            // The engine refuses writes until a reopen recovers it; the
            // retry below goes through that recovery.
            assert!(store.engine().unwrap().is_poisoned());
            fault.clear();
            // The handle is unchanged (same snapshot), storage too.
            assert!(Arc::ptr_eq(&before, &h.snapshot()));
            assert!(h.is_open());
            assert!(h.entry(&aborted).unwrap().is_some());
            assert_eq!(
                store.engine().unwrap().stream_version(id.as_str()).unwrap(),
                stream_before
            );
            let t = full_transcript(&*store, &id);
            assert!(t.get(&aborted).is_some());
            assert_eq!(t.get(&blob).unwrap().parent_id.as_ref(), Some(&aborted));
            // An append fails the same way and leaves everything as it was.
            fault.fail_nth(kind, 1, false);
            assert!(h.append(user("lost")).is_err());
            fault.clear();
            assert!(Arc::ptr_eq(&before, &h.snapshot()));
        }
    }

    // The cleanup (a retry after the faults).
    let out = remove(&h).unwrap();
    assert_eq!(out.removed, vec![aborted.clone()]);
    assert_eq!(out.scan.preserved, vec![blob.clone()]);
    assert_eq!(out.scan.boundary.as_ref(), Some(&question));
    let committed = out.committed.unwrap();
    assert_eq!(
        committed.reparented,
        vec![(blob.clone(), Some(question.clone()))]
    );
    assert_eq!(committed.version.generation, 1);
    // The rewrite logged a delta, not the payload.
    let engine = store.engine().unwrap();
    let head = engine.stream_version(id.as_str()).unwrap().unwrap();
    let last = engine.read_stream(id.as_str(), head, 1).unwrap();
    assert!(
        last[0].record_bytes < 4096,
        "{} bytes",
        last[0].record_bytes
    );
    drop(engine);

    // Payload byte-exact, parent repaired, assistant gone: through the
    // handle, through a full load, and after a reopen.
    let check = |h: &SessionHandle, store: &dyn SessionStore| {
        let e = h.entry(&blob).unwrap().unwrap();
        assert_eq!(data_of(&e), want);
        assert_eq!(e.parent_id.as_ref(), Some(&question));
        assert!(h.entry(&aborted).unwrap().is_none());
        let t = full_transcript(store, &id);
        assert_eq!(t.get(&blob), Some(&e));
        assert!(t.get(&aborted).is_none());
        assert_eq!(t.leaf(), Some(&blob));
        let s = h.snapshot();
        assert_eq!(s.leaf.as_ref(), Some(&blob));
        assert!(s.resident_bytes() <= 4096);
        assert_eq!(s.counts().path_entries, 2);
        assert_eq!(s.context().messages, t.context().unwrap().messages);
    };
    check(&h, &*store);
    drop(h);
    drop(rt);
    Arc::try_unwrap(store).unwrap().close().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let h = rt
        .open_handle(
            &id,
            HandleOptions::reader().with_budget(Budget::new(4096, 1024)),
        )
        .unwrap();
    check(&h, &*store);
    // The old generation is still history in the log.
    let old = store.load_at(&id, Some(4)).unwrap().unwrap();
    assert!(old.state().transcript.get(&aborted).is_some());
    let _: EntryId = question;
}

#[test]
fn retained_data_five_mib_payload() {
    scenario(Value::String(text(5 << 20)), false);
}

#[test]
fn retained_data_three_mib_object_payload() {
    scenario(
        json!({ "blob": text(3 << 20), "n": [1, 2.5, null, true] }),
        false,
    );
}

#[test]
fn retained_data_null_and_true_payloads() {
    scenario(Value::Null, false);
    scenario(Value::Bool(true), false);
}

#[test]
fn faults_mid_commit_leave_storage_and_handle_unchanged_and_a_retry_succeeds() {
    scenario(Value::String(text(5 << 20)), true);
    scenario(Value::Null, true);
}
