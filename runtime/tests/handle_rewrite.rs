//! Version-fenced reads and prepared rewrites on handles: continuations
//! after a rewrite or an append, owner loss, cancellation, publication
//! failure, rewrite slots, truncation.

mod handle_support;

use std::sync::Arc;

use handle_support::*;
use spool_runtime::handle::{HandleError, HandleOptions, HistorySelection, SessionHandle};
use spool_runtime::transcript::{
    select_resident, Budget, CancelToken, ContentBlock, EntryKind, Message, PageBudget, PageOrder,
    ReadResult, Replacement,
};

fn page(
    h: &SessionHandle,
    leaf: &spool_runtime::transcript::EntryId,
    cursor: Option<spool_runtime::transcript::Continuation>,
) -> ReadResult<spool_runtime::handle::HistoryValue> {
    h.read(
        &HistorySelection::BranchPage {
            leaf: leaf.clone(),
            order: PageOrder::LeafFirst,
            cursor,
            budget: PageBudget::new(1 << 20, 10),
        },
        &CancelToken::new(),
    )
    .unwrap()
}

#[test]
fn continuations_taken_before_a_rewrite_conflict_and_history_stays_readable() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let h = writer(&rt, &id, 4096);
    let ids = h
        .append_entries((0..60).map(|i| sized(i, 200)).collect())
        .unwrap();
    let leaf = ids[59].clone();
    let first = page(&h, &leaf, None);
    let cont = first.continuation().cloned().expect("a first page");
    assert_eq!(first.value().unwrap().as_page().unwrap().entries.len(), 10);
    let version_before = h.snapshot().version;
    let session_before = h.snapshot().session_version;
    // Redact every "u1" (a rewrite: new generation).
    let done = h
        .redact(&|s| s.replace("u1", "[redacted]"), &CancelToken::new())
        .unwrap()
        .expect("something to redact");
    assert!(done.written);
    assert_eq!(done.version.generation, version_before.generation + 1);
    // The old continuation is a version conflict, never a different page.
    match page(&h, &leaf, Some(cont)) {
        ReadResult::VersionConflict { expected, actual } => {
            assert_eq!(expected, version_before);
            assert_eq!(actual, done.version);
        }
        other => panic!("expected a version conflict, got {other:?}"),
    }
    // The context after the rewrite is right.
    let t = full_transcript(&*store, &id);
    let s = h.snapshot();
    assert_eq!(
        s.selection,
        select_resident(&t, t.leaf(), Budget::new(4096, 1024)).unwrap()
    );
    assert!(t
        .entries()
        .iter()
        .all(|e| !format!("{:?}", e.kind).contains("u1")));
    // The old generation is still readable as history.
    let old = store.load_at(&id, Some(session_before)).unwrap().unwrap();
    let old_text = format!("{:?}", old.state().transcript.get(&ids[10]).unwrap().kind);
    assert!(old_text.contains("u10"), "{old_text}");
    // Paging the new generation from the start works to the end.
    let mut cursor = None;
    let mut seen = 0;
    loop {
        let r = page(&h, &leaf, cursor.take());
        seen += r.value().unwrap().as_page().unwrap().entries.len();
        match r {
            ReadResult::Page { continuation, .. } => cursor = Some(continuation),
            ReadResult::Complete { .. } => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, 60);
}

#[test]
fn a_revision_change_between_pages_is_a_version_conflict() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let h = writer(&rt, &id, 4096);
    let ids = h
        .append_entries((0..30).map(|i| sized(i, 100)).collect())
        .unwrap();
    let reader = rt.open_handle(&id, HandleOptions::reader()).unwrap();
    let first = page(&reader, &ids[29], None);
    let cont = first.continuation().cloned().unwrap();
    h.append(user("more")).unwrap();
    assert!(matches!(
        page(&reader, &ids[29], Some(cont)),
        ReadResult::VersionConflict { .. }
    ));
    // A prepared read is bound to its version too.
    let prepared = reader.prepare_read().unwrap();
    h.append(user("even more")).unwrap();
    let r = prepared
        .read(
            &HistorySelection::Entry { id: ids[0].clone() },
            &CancelToken::new(),
        )
        .unwrap();
    assert!(matches!(r, ReadResult::VersionConflict { .. }), "{r:?}");
}

#[test]
fn owner_loss_after_a_read_was_prepared() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let h = writer(&rt, &id, 4096);
    let a = h.append(user("hello")).unwrap();
    let sel = HistorySelection::Entry { id: a.clone() };
    let prepared = h.prepare_read().unwrap();
    assert!(matches!(
        prepared.read(&sel, &CancelToken::new()).unwrap(),
        ReadResult::Complete { .. }
    ));
    // Closing the owner: the capability reports owner lost, never data.
    drop(h);
    assert_eq!(
        prepared.read(&sel, &CancelToken::new()).unwrap(),
        ReadResult::OwnerLost
    );
    // A replaced owner (a new writer) does not revive it.
    let h2 = writer(&rt, &id, 4096);
    assert_eq!(
        prepared.read(&sel, &CancelToken::new()).unwrap(),
        ReadResult::OwnerLost
    );
    // A preparation of rewrite is bound to its owner as well.
    let v = h2.snapshot().version;
    let p = h2
        .prepare_rewrite(
            vec![(a.clone(), Replacement::Remove)],
            v,
            &CancelToken::new(),
        )
        .unwrap();
    let h2_owner = h2.owner();
    drop(h2);
    let h3 = writer(&rt, &id, 4096);
    assert_ne!(h3.owner(), h2_owner);
    assert!(matches!(
        h3.commit_rewrite(p, &CancelToken::new()),
        Err(HandleError::ForeignPreparation { .. })
    ));
    assert!(h3.entry(&a).unwrap().is_some());
    // Cancellation is reported as such.
    let c = CancelToken::new();
    c.cancel();
    assert_eq!(h3.read(&sel, &c).unwrap(), ReadResult::Cancelled);
}

#[test]
fn cancellation_before_commit_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let h = writer(&rt, &id, 4096);
    let ids = h
        .append_entries((0..5).map(|i| sized(i, 100)).collect())
        .unwrap();
    let before = h.snapshot();
    let stream = store.engine().unwrap().stream_version(id.as_str()).unwrap();
    let cancel = CancelToken::new();
    let p = h
        .prepare_rewrite(
            vec![(ids[4].clone(), Replacement::Remove)],
            before.version,
            &cancel,
        )
        .unwrap();
    assert_eq!(p.entries_delta(), -1);
    assert!(p.bytes_delta() < 0);
    assert_eq!(p.mapping().len(), 1);
    // The slot is held: a second preparation is refused.
    assert!(matches!(
        h.prepare_rewrite(vec![], before.version, &CancelToken::new()),
        Err(HandleError::RewriteBusy { .. })
    ));
    cancel.cancel();
    assert!(matches!(
        h.commit_rewrite(p, &cancel),
        Err(HandleError::Cancelled { .. })
    ));
    assert_eq!(
        store.engine().unwrap().stream_version(id.as_str()).unwrap(),
        stream
    );
    assert!(Arc::ptr_eq(&before, &h.snapshot()));
    assert!(h.entry(&ids[4]).unwrap().is_some());
    // The cancelled preparation released the slot; a stale one conflicts.
    let p = h
        .prepare_rewrite(
            vec![(ids[4].clone(), Replacement::Remove)],
            before.version,
            &CancelToken::new(),
        )
        .unwrap();
    h.append(user("moved on")).unwrap();
    assert!(matches!(
        h.commit_rewrite(p, &CancelToken::new()),
        Err(HandleError::VersionConflict { .. })
    ));
}

#[test]
fn a_commit_whose_publication_fails_stays_committed_and_invalidates_the_handle() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, sink) = runtime(store.clone());
    let id = new_session(&rt);
    let h = writer(&rt, &id, 4096);
    h.append(user("one")).unwrap();
    let before = h.snapshot();
    sink.take();
    h.fail_next_publication();
    let err = h.append(user("two")).unwrap_err();
    let HandleError::PublicationFailed {
        committed_version, ..
    } = err
    else {
        panic!("expected PublicationFailed, got {err:?}");
    };
    assert_eq!(committed_version, before.session_version + 1);
    // Committed exactly once (never replayed); observers were told.
    let t = full_transcript(&*store, &id);
    assert_eq!(t.len(), 2);
    assert_eq!(
        rt.session_info(&id).unwrap().version,
        before.session_version + 1
    );
    assert_eq!(sink.names(), vec!["SessionSaved"]);
    // The handle is invalidated: owner lost from now on; nothing replays.
    assert!(!h.is_open());
    assert!(matches!(
        h.append(user("three")),
        Err(HandleError::OwnerLost { .. })
    ));
    assert!(matches!(
        h.read(
            &HistorySelection::Context {
                budget: Budget::default()
            },
            &CancelToken::new()
        )
        .unwrap(),
        ReadResult::OwnerLost
    ));
    assert_eq!(full_transcript(&*store, &id).len(), 2);
    // Its writer slot is free: a new handle sees the committed write.
    let h2 = writer(&rt, &id, 4096);
    assert_eq!(h2.snapshot().counts().path_entries, 2);
}

#[test]
fn tool_results_are_truncated_across_the_transcript() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let h = writer(&rt, &id, 64 * 1024);
    let result = |n: usize| EntryKind::Message {
        message: Message::ToolResult {
            tool_call_id: "c1".into(),
            tool_name: "read".into(),
            content: vec![ContentBlock::text("r".repeat(n))],
            is_error: false,
        },
    };
    let ids = h
        .append_entries(vec![user("go"), result(10_000), result(50)])
        .unwrap();
    let done = h
        .truncate_tool_results(1000, &CancelToken::new())
        .unwrap()
        .unwrap();
    assert_eq!(done.rewritten, vec![ids[1].clone()]);
    assert!(done.bytes_delta < -8000);
    let e = h.entry(&ids[1]).unwrap().unwrap();
    let size = spool_runtime::transcript::entry_size(&e);
    assert!(size < 1300, "{size}");
    assert!(format!("{:?}", e.kind).contains("[truncated"));
    // Idempotent: nothing more to cut.
    assert!(h
        .truncate_tool_results(1000, &CancelToken::new())
        .unwrap()
        .is_none());
    let t = full_transcript(&*store, &id);
    assert_eq!(t.get(&ids[1]), Some(&e));
}
