//! Session handles on every store with native transcript indexes (the log
//! store, and the PostgreSQL store against a throwaway server, skipped
//! loudly without server binaries except under CI): one body per scenario,
//! run for each backend. Every snapshot equals the selection over the fully
//! loaded transcript, and the handle never loads a session.
//!
//! - bounded open: 2,000 entries appended in chunks stay within the budget
//!   and a fresh reader opens the same bounded context;
//! - navigation to an omitted branch, the persisted leaf, navigation facts
//!   and branch pages to completion;
//! - the retained-data scenario: a handle with a 4,096-byte budget appends
//!   an aborted assistant then a large custom payload;
//!   `remove_trailing_entries` removes the assistant, preserves the payload
//!   byte-exact and repairs its parent, continuations taken before conflict
//!   after it, and a new store instance sees the same. On the log store,
//!   faults injected mid-commit leave storage and the handle unchanged and
//!   a retry succeeds.
//! - hooks on handle writes: each write (append, label, leaf move,
//!   rewrite) runs the BeforeHandleWrite stage by priority with its
//!   operation, events and fenced version; a rejection commits nothing,
//!   is reported, and the handle writes again once the hook allows;
//!   hooks of the pipeline stages only are not called.

use crate::handle_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use handle_support::*;
use serde_json::{json, Value};
use spool_runtime::handle::{
    HandleError, HandleOptions, HistorySelection, HistoryValue, SessionHandle,
};
use spool_runtime::hooks::{
    FnHandleWriteHook, FnHook, HandleWrite, HookError, HookStage, SessionHook, SessionHookStack,
};
use spool_runtime::observer::{RecordingSink, RuntimeEvent};
use spool_runtime::session::{AgentSession, SessionEvent, SessionId};
use spool_runtime::store::SessionStore;
use spool_runtime::transcript::{
    select_resident, Budget, CancelToken, Continuation, Entry, EntryFacts, EntryId, EntryKind,
    Message, PageBudget, PageOrder, ReadResult, Replacement, StopReason, Transcript,
};
use spool_runtime::SessionRuntime;

/// A store location under test and the one store instance open on it.
trait Backend {
    /// The open instance.
    fn store(&self) -> Arc<dyn SessionStore>;
    /// Closes the instance and opens the location again, as a new process
    /// would. Every runtime and handle on the old instance must be gone.
    fn reopen(&self);
    /// The session as of version `upto` (history), by a full load.
    fn load_at(&self, id: &SessionId, upto: u64) -> AgentSession;
    /// Loads counted by the reference loads below, which the instance's
    /// `full_loads` includes.
    fn reference_loads(&self) -> &AtomicU64;

    /// The whole transcript by a full load, for reference: counted apart,
    /// so [`Backend::handle_loads`] sees only what the handles loaded.
    fn reference(&self, id: &SessionId) -> Transcript {
        let store = self.store();
        let before = store.stats().full_loads;
        let t = full_transcript(&*store, id);
        let loads = store.stats().full_loads - before;
        self.reference_loads().fetch_add(loads, Ordering::Relaxed);
        t
    }

    /// Full loads of the open instance other than the reference loads.
    fn handle_loads(&self) -> u64 {
        self.store().stats().full_loads - self.reference_loads().load(Ordering::Relaxed)
    }
}

/// The log store in a temporary directory.
struct Log {
    dir: tempfile::TempDir,
    store: Mutex<Option<Arc<spool_runtime::store::LogStore>>>,
    reference_loads: AtomicU64,
}

impl Log {
    fn new() -> Log {
        let dir = tempfile::tempdir().unwrap();
        let store = open_log(dir.path());
        Log::with(dir, store)
    }

    fn with(dir: tempfile::TempDir, store: Arc<spool_runtime::store::LogStore>) -> Log {
        Log {
            dir,
            store: Mutex::new(Some(store)),
            reference_loads: AtomicU64::new(0),
        }
    }

    fn log_store(&self) -> Arc<spool_runtime::store::LogStore> {
        self.store.lock().unwrap().clone().expect("open")
    }
}

impl Backend for Log {
    fn store(&self) -> Arc<dyn SessionStore> {
        self.log_store()
    }

    fn reopen(&self) {
        let mut slot = self.store.lock().unwrap();
        let old = slot.take().expect("open");
        Arc::try_unwrap(old)
            .unwrap_or_else(|_| panic!("the store is still shared"))
            .close()
            .unwrap();
        *slot = Some(open_log(self.dir.path()));
        self.reference_loads.store(0, Ordering::Relaxed);
    }

    fn load_at(&self, id: &SessionId, upto: u64) -> AgentSession {
        let store = self.log_store();
        let before = store.stats().full_loads;
        let s = store.load_at(id, Some(upto)).unwrap().unwrap();
        let loads = store.stats().full_loads - before;
        self.reference_loads.fetch_add(loads, Ordering::Relaxed);
        s
    }

    fn reference_loads(&self) -> &AtomicU64 {
        &self.reference_loads
    }
}

/// Runs `body` on a fresh log store.
fn on_log(body: impl FnOnce(&dyn Backend)) {
    body(&Log::new());
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use crate::postgres_support::PgServer;
    use spool_runtime::store::postgres::PostgresStore;

    /// A fresh schema on a throwaway server.
    pub(super) struct Pg {
        conn: String,
        store: Mutex<Arc<PostgresStore>>,
        reference_loads: AtomicU64,
    }

    fn connect(conn: &str) -> Arc<PostgresStore> {
        Arc::new(PostgresStore::connect(conn).unwrap_or_else(|e| panic!("connect {conn}: {e}")))
    }

    impl Backend for Pg {
        fn store(&self) -> Arc<dyn SessionStore> {
            self.store.lock().unwrap().clone()
        }

        fn reopen(&self) {
            let mut slot = self.store.lock().unwrap();
            slot.close();
            *slot = connect(&self.conn);
            self.reference_loads.store(0, Ordering::Relaxed);
        }

        fn load_at(&self, id: &SessionId, upto: u64) -> AgentSession {
            let store = self.store.lock().unwrap().clone();
            let before = store.stats().full_loads;
            let s = store.load_at(id, Some(upto)).unwrap().unwrap();
            let loads = store.stats().full_loads - before;
            self.reference_loads.fetch_add(loads, Ordering::Relaxed);
            s
        }

        fn reference_loads(&self) -> &AtomicU64 {
            &self.reference_loads
        }
    }

    /// Runs `body` on a fresh schema of a new server (skipped when the
    /// machine cannot run one, see `postgres_support`).
    pub(super) fn on_postgres(test: &str, body: impl FnOnce(&dyn Backend)) {
        let Some(server) = PgServer::start_or_skip(test) else {
            return;
        };
        let conn = server.fresh_schema();
        let store = connect(&conn);
        body(&Pg {
            conn,
            store: Mutex::new(store),
            reference_loads: AtomicU64::new(0),
        });
        drop(server);
    }
}

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

/// All entries of the branch ending at `leaf`, leaf first, in pages of
/// `per_page`.
fn branch_to_root(h: &SessionHandle, leaf: &EntryId, per_page: u64) -> Vec<EntryId> {
    let mut cursor = None;
    let mut seen = Vec::new();
    loop {
        let r = branch_page(h, leaf, cursor.take(), per_page);
        let page = r.value().unwrap().as_page().unwrap();
        seen.extend(page.entries.iter().map(|e| e.id.clone()));
        match r {
            ReadResult::Page { continuation, .. } => cursor = Some(continuation),
            ReadResult::Complete { .. } => break,
            other => panic!("{other:?}"),
        }
    }
    seen
}

fn branch_page(
    h: &SessionHandle,
    leaf: &EntryId,
    cursor: Option<Continuation>,
    per_page: u64,
) -> ReadResult<HistoryValue> {
    h.read(
        &HistorySelection::BranchPage {
            leaf: leaf.clone(),
            order: PageOrder::LeafFirst,
            cursor,
            // Room for the largest payload: pages are cut by count here.
            budget: PageBudget::new(64 << 20, per_page),
        },
        &CancelToken::new(),
    )
    .unwrap()
}

/// 2,000 entries appended in chunks: the incrementally published snapshot
/// and a freshly opened one both equal the selection over the fully loaded
/// transcript, within the budget, without a full load.
fn bounded_open(b: &dyn Backend) {
    const N: usize = 2000;
    const CHUNK: usize = 500;
    let budget = Budget::new(64 * 1024, 1024);
    let (rt, _) = runtime(b.store());
    let id = new_session(&rt);
    let h = writer(&rt, &id, budget.bytes_max);
    let mut i = 0;
    while i < N {
        let kinds: Vec<EntryKind> = (i..(i + CHUNK).min(N)).map(|k| sized(k, 1024)).collect();
        i += kinds.len();
        h.append_entries(kinds).unwrap();
        assert!(h.snapshot().resident_bytes() <= budget.bytes_max);
    }
    let t = b.reference(&id);
    assert_eq!(t.len(), N);
    let want = select_resident(&t, t.leaf(), budget).unwrap();
    assert_eq!(h.snapshot().selection, want);
    drop(h);
    let r = rt
        .open_handle(&id, HandleOptions::reader().with_budget(budget))
        .unwrap();
    let snap = r.snapshot();
    assert_eq!(snap.selection, want);
    assert!(!snap.is_complete());
    assert!(snap.resident_bytes() <= budget.bytes_max);
    assert!(snap.resident_bytes() > budget.bytes_max / 2);
    assert!(snap.resident_events() <= budget.events_max);
    assert_eq!(snap.counts().path_entries, N as u64);
    assert_eq!(snap.transcript_entries, N as u64);
    // The resident context is the tail of the full context.
    let full = t.context().unwrap().messages;
    let part = snap.context().messages;
    assert!(!part.is_empty() && part.len() < full.len());
    assert_eq!(&full[full.len() - part.len()..], &part[..]);
    assert_eq!(
        snap.model(),
        Some(&("prov".to_string(), "model-a".to_string()))
    );
    assert_eq!(b.handle_loads(), 0, "opening reads only the working set");
}

/// Navigating to an entry of an omitted side branch publishes its bounded
/// snapshot; the leaf is persisted; navigation facts and branch pages of
/// the main branch to completion.
fn omitted_branch_navigation(b: &dyn Backend) {
    let (rt, _) = runtime(b.store());
    let id = new_session(&rt);
    let budget = Budget::new(8 * 1024, 1024);
    let h = rt
        .open_handle(&id, HandleOptions::writer().with_budget(budget))
        .unwrap();
    let main = h
        .append_entries((0..120).map(|i| sized(i, 500)).collect())
        .unwrap();
    // A side branch from entry 10, then back to the main leaf.
    h.move_leaf(Some(main[10].clone())).unwrap();
    let side = h
        .append_entries((0..40).map(|i| sized(1000 + i, 500)).collect())
        .unwrap();
    h.move_leaf(Some(main[119].clone())).unwrap();
    assert!(
        h.snapshot().get(&side[20]).is_none(),
        "the side branch is not resident"
    );
    // Navigate to an entry in the middle of the omitted branch.
    let nav = h.move_leaf(Some(side[20].clone())).unwrap();
    assert_eq!(nav.leaf.as_ref(), Some(&side[20]));
    assert_eq!(nav.counts().path_entries, 11 + 21);
    assert!(nav.get(&side[20]).is_some());
    assert!(nav.get(&main[119]).is_none());
    assert!(nav.resident_bytes() <= budget.bytes_max);
    // The leaf is persisted: a new handle opens there.
    drop(h);
    let r = rt.open_handle(&id, HandleOptions::reader()).unwrap();
    assert_eq!(r.snapshot().leaf.as_ref(), Some(&side[20]));
    // Navigation facts: the common ancestor is entry 10.
    let res = r
        .read(
            &HistorySelection::Navigation {
                from: Some(main[119].clone()),
                target: side[20].clone(),
            },
            &CancelToken::new(),
        )
        .unwrap();
    let facts = res.value().and_then(|v| v.as_navigation()).unwrap().clone();
    assert_eq!(facts.common_ancestor.as_ref(), Some(&main[10]));
    assert_eq!(facts.steps_up, 109);
    assert_eq!(facts.steps_down, 21);
    // The main branch in pages of 7, leaf first, to the end.
    let want: Vec<EntryId> = main.iter().rev().cloned().collect();
    assert_eq!(branch_to_root(&r, &main[119], 7), want);
    // The side branch's selection equals the one over the full transcript.
    let t = b.reference(&id);
    assert_eq!(
        nav.selection,
        select_resident(&t, Some(&side[20]), budget).unwrap()
    );
    assert_eq!(b.handle_loads(), 0);
}

/// A handle write as a hook saw it: session, operation, events, fenced
/// version.
type Seen = (SessionId, &'static str, Vec<SessionEvent>, u64);

/// A hook on handle writes: records each write it sees (session,
/// operation, events, fenced version) and its name in the run order shared
/// by the hooks of a stack; rejects while `reject` is set.
struct Gate {
    name: &'static str,
    order: Arc<Mutex<Vec<&'static str>>>,
    seen: Mutex<Vec<Seen>>,
    reject: AtomicBool,
}

impl Gate {
    fn new(name: &'static str, order: &Arc<Mutex<Vec<&'static str>>>) -> Arc<Gate> {
        Arc::new(Gate {
            name,
            order: order.clone(),
            seen: Mutex::new(Vec::new()),
            reject: AtomicBool::new(false),
        })
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

impl SessionHook for Gate {
    fn name(&self) -> &str {
        self.name
    }
    fn on_stage(&self, _: HookStage, _: &mut AgentSession) -> Result<(), HookError> {
        Ok(())
    }
    fn on_handle_write(&self, w: &HandleWrite<'_>) -> Result<(), HookError> {
        self.order.lock().unwrap().push(self.name);
        self.seen.lock().unwrap().push((
            w.session_id.clone(),
            w.cause,
            w.events.to_vec(),
            w.expected_version,
        ));
        if self.reject.load(Ordering::SeqCst) {
            return Err(HookError::rejected("no writes now"));
        }
        Ok(())
    }
}

fn appended(h: &SessionHandle, ids: &[EntryId]) -> Vec<SessionEvent> {
    ids.iter()
        .map(|id| SessionEvent::EntryAppended {
            entry: h.entry(id).unwrap().unwrap(),
        })
        .collect()
}

/// Handle writes run the runtime's BeforeHandleWrite stage: by priority
/// (ties in registration order), with the operation, the events and the
/// fenced version; a rejection stops the stage, commits nothing, is
/// reported as `SessionHookFailed` and returned, and the handle writes
/// again once the hook allows. Pipeline-stage hooks are not called; a
/// handle opened without the runtime runs no hooks.
fn handle_write_hooks(b: &dyn Backend) {
    let order = Arc::new(Mutex::new(Vec::new()));
    let gate = Gate::new("gate", &order);
    let audit = Gate::new("audit", &order);
    let stages = Arc::new(AtomicU64::new(0));
    let mut hooks = SessionHookStack::empty();
    hooks.push(audit.clone(), 0);
    let tail_order = order.clone();
    hooks.push(
        Arc::new(FnHandleWriteHook::new(
            "tail",
            move |_: &HandleWrite<'_>| {
                tail_order.lock().unwrap().push("tail");
                Ok(())
            },
        )),
        0,
    );
    hooks.push(gate.clone(), 10);
    let counted = stages.clone();
    hooks.push(
        Arc::new(FnHook::new("stages", move |stage, _: &mut AgentSession| {
            counted.fetch_add(1, Ordering::SeqCst);
            if stage == HookStage::AfterAction {
                return Err(HookError::rejected("no actions"));
            }
            Ok(())
        })),
        20,
    );
    let sink = Arc::new(RecordingSink::new());
    let rt = SessionRuntime::new(b.store(), sink.clone(), hooks);
    let id = new_session(&rt);
    let stage_calls = stages.load(Ordering::SeqCst);
    assert!(stage_calls > 0, "the create pipeline ran the stages");
    let h = writer(&rt, &id, 64 * 1024);
    sink.take();

    // Each write, seen before it is committed.
    let v0 = h.snapshot().session_version;
    // The entries as committed (the rewrite below changes one).
    let a = h.append(user("a")).unwrap();
    let a_events = appended(&h, std::slice::from_ref(&a));
    let bc = h.append_entries(vec![user("b"), user("c")]).unwrap();
    let bc_events = appended(&h, &bc);
    let label = h.set_label(&a, Some("start".into())).unwrap();
    let label_events = appended(&h, std::slice::from_ref(&label));
    let moved = h.move_leaf(Some(a.clone())).unwrap();
    let p = h
        .prepare_rewrite(
            vec![(bc[1].clone(), Replacement::Replace(user("c2")))],
            moved.version,
            &CancelToken::new(),
        )
        .unwrap();
    h.commit_rewrite(p, &CancelToken::new()).unwrap();
    let seen = audit.seen();
    let causes: Vec<&str> = seen.iter().map(|w| w.1).collect();
    assert_eq!(
        causes,
        ["append", "append", "set_label", "move_leaf", "rewrite"]
    );
    assert!(seen.iter().all(|w| w.0 == id));
    let fences: Vec<u64> = seen.iter().map(|w| w.3).collect();
    assert_eq!(fences, (v0..v0 + 5).collect::<Vec<_>>());
    assert_eq!(seen[0].2, a_events);
    assert_eq!(seen[1].2, bc_events);
    assert_eq!(seen[2].2, label_events);
    assert_eq!(
        seen[3].2,
        [SessionEvent::LeafMoved {
            leaf: Some(a.clone())
        }]
    );
    match &seen[4].2[..] {
        [SessionEvent::TranscriptRewritten {
            written,
            removed,
            leaf,
            ..
        }] => {
            assert_eq!(written.len(), 1);
            assert_eq!(written[0].id, bc[1]);
            assert_eq!(written[0].kind, user("c2"));
            assert!(removed.is_empty());
            assert_eq!(leaf.as_ref(), Some(&a));
        }
        other => panic!("a rewrite commits one TranscriptRewritten: {other:?}"),
    }
    assert_eq!(gate.seen().len(), 5);
    // By priority, ties in registration order, for every write.
    assert_eq!(*order.lock().unwrap(), ["gate", "audit", "tail"].repeat(5));
    // One SessionSaved per committed write; the stage hook never ran.
    let saved: Vec<u64> = sink
        .take()
        .iter()
        .map(|e| match e {
            RuntimeEvent::SessionSaved { version, .. } => *version,
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    assert_eq!(saved, (v0 + 1..=v0 + 5).collect::<Vec<_>>());
    assert_eq!(stages.load(Ordering::SeqCst), stage_calls);

    // A rejecting hook: nothing is committed, the rest of the stack does
    // not run, each refusal is reported and returned.
    gate.reject.store(true, Ordering::SeqCst);
    order.lock().unwrap().clear();
    let before = h.snapshot();
    let stored = rt.session_info(&id).unwrap().version;
    assert_eq!(stored, v0 + 5);
    let t_before = b.reference(&id);
    let err = h.append(user("refused")).unwrap_err();
    match &err {
        HandleError::HookFailed {
            id: at,
            stage,
            hook,
            source,
            ..
        } => {
            assert_eq!(at, &id);
            assert_eq!(*stage, HookStage::BeforeHandleWrite);
            assert_eq!(hook, "gate");
            assert!(matches!(**source, HookError::Rejected { .. }), "{source}");
        }
        other => panic!("expected HookFailed, got {other}"),
    }
    assert_eq!(err.kind(), "hook_failed");
    assert_eq!(
        err.to_string(),
        format!("session {id}: before_handle_write hook gate failed; nothing was written")
    );
    assert!(matches!(
        h.move_leaf(Some(bc[1].clone())),
        Err(HandleError::HookFailed { .. })
    ));
    let p = h
        .prepare_rewrite(
            vec![(a.clone(), Replacement::Replace(user("a2")))],
            before.version,
            &CancelToken::new(),
        )
        .unwrap();
    assert!(matches!(
        h.commit_rewrite(p, &CancelToken::new()),
        Err(HandleError::HookFailed { .. })
    ));
    assert_eq!(*order.lock().unwrap(), ["gate"; 3]);
    assert_eq!(audit.seen().len(), 5);
    assert!(Arc::ptr_eq(&before, &h.snapshot()));
    assert!(h.is_open());
    assert_eq!(rt.session_info(&id).unwrap().version, stored);
    let t_after = b.reference(&id);
    assert_eq!(t_after.len(), t_before.len());
    assert_eq!(t_after.leaf(), t_before.leaf());
    assert_eq!(path_entries(&t_after), path_entries(&t_before));
    let events = sink.take();
    assert_eq!(events.len(), 3);
    for e in &events {
        match e {
            RuntimeEvent::SessionHookFailed {
                session_id,
                stage,
                hook,
                error,
            } => {
                assert_eq!(session_id, &id);
                assert_eq!(*stage, HookStage::BeforeHandleWrite);
                assert_eq!(hook, "gate");
                assert_eq!(error, "rejected: no writes now");
            }
            other => panic!("unexpected event {other:?}"),
        }
    }

    // Allowed again: the same handle writes.
    gate.reject.store(false, Ordering::SeqCst);
    let d = h.append(user("d")).unwrap();
    assert_eq!(h.snapshot().session_version, stored + 1);
    assert_eq!(rt.session_info(&id).unwrap().version, stored + 1);
    assert_eq!(b.reference(&id).leaf(), Some(&d));
    assert_eq!(sink.names(), ["SessionSaved"]);
    assert_eq!(audit.seen().len(), 6);
    assert_eq!(stages.load(Ordering::SeqCst), stage_calls);

    // A handle opened without the runtime runs no hooks.
    drop(h);
    gate.reject.store(true, Ordering::SeqCst);
    let plain = SessionHandle::open(b.store(), sink.clone(), &id, HandleOptions::writer()).unwrap();
    plain.append(user("e")).unwrap();
    assert_eq!(gate.seen().len(), 5 + 3 + 1);
    assert_eq!(b.handle_loads(), 0);
}

/// Checks run between the appends and the cleanup of [`retained`] (the
/// log store injects faults there), given the handle, the session, the
/// aborted assistant and the payload entry.
type BeforeCleanup<'a> = &'a dyn Fn(&dyn Backend, &SessionHandle, &SessionId, &EntryId, &EntryId);

/// The retained-data scenario with `payload`; returns the session.
fn retained(b: &dyn Backend, payload: Value, before_cleanup: BeforeCleanup<'_>) -> SessionId {
    let budget = Budget::new(4096, 1024);
    let (rt, _) = runtime(b.store());
    let id = new_session(&rt);
    let h = rt
        .open_handle(&id, HandleOptions::writer().with_budget(budget))
        .unwrap();
    let first = h.append(user("first")).unwrap();
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
    let stored = b.reference(&id);
    assert_eq!(h.entry(&blob).unwrap().as_ref(), stored.get(&blob));
    assert_eq!(data_of(&h.entry(&blob).unwrap().unwrap()), want);
    // A continuation taken before the rewrite.
    let cont = branch_page(&h, &blob, None, 2)
        .continuation()
        .cloned()
        .expect("a first page");
    let version_before = h.snapshot().version;
    let session_before = h.snapshot().session_version;

    before_cleanup(b, &h, &id, &aborted, &blob);

    let out = h
        .remove_trailing_entries(&is_aborted_assistant, &is_custom, &CancelToken::new())
        .unwrap();
    assert_eq!(out.removed, vec![aborted.clone()]);
    assert_eq!(out.scan.preserved, vec![blob.clone()]);
    assert_eq!(out.scan.boundary.as_ref(), Some(&question));
    let committed = out.committed.unwrap();
    assert_eq!(
        committed.reparented,
        vec![(blob.clone(), Some(question.clone()))]
    );
    assert_eq!(committed.version.generation, version_before.generation + 1);
    match branch_page(&h, &blob, Some(cont), 2) {
        ReadResult::VersionConflict { expected, actual } => {
            assert_eq!(expected, version_before);
            assert_eq!(actual, committed.version);
        }
        other => panic!("expected a version conflict, got {other:?}"),
    }

    // Payload byte-exact, parent repaired, assistant gone: through the
    // handle, through a full load, and in a new store instance.
    let check = |h: &SessionHandle| {
        let e = h.entry(&blob).unwrap().unwrap();
        assert_eq!(data_of(&e), want);
        assert_eq!(e.parent_id.as_ref(), Some(&question));
        assert!(h.entry(&aborted).unwrap().is_none());
        let t = b.reference(&id);
        assert_eq!(t.get(&blob), Some(&e));
        assert!(t.get(&aborted).is_none());
        assert_eq!(t.leaf(), Some(&blob));
        let s = h.snapshot();
        assert_eq!(s.leaf.as_ref(), Some(&blob));
        assert!(s.resident_bytes() <= 4096);
        assert_eq!(s.counts().path_entries, 3);
        assert_eq!(s.context().messages, t.context().unwrap().messages);
        assert_eq!(s.selection, select_resident(&t, t.leaf(), budget).unwrap());
    };
    check(&h);
    // Paging the new generation from the start reaches the root.
    assert_eq!(
        branch_to_root(&h, &blob, 2),
        vec![blob.clone(), question.clone(), first.clone()]
    );
    assert_eq!(b.handle_loads(), 0);
    drop(h);
    drop(rt);
    b.reopen();
    let (rt, _) = runtime(b.store());
    let h = rt
        .open_handle(&id, HandleOptions::reader().with_budget(budget))
        .unwrap();
    check(&h);
    assert_eq!(b.handle_loads(), 0);
    // The old generation is still history.
    let old = b.load_at(&id, session_before);
    assert!(old.state().transcript.get(&aborted).is_some());
    id
}

fn no_checks(_: &dyn Backend, _: &SessionHandle, _: &SessionId, _: &EntryId, _: &EntryId) {}

/// A payload of 5 MiB, one of 3 MiB in an object, and two tiny ones.
fn retained_payloads() -> [Value; 4] {
    [
        Value::String(text(5 << 20)),
        json!({ "blob": text(3 << 20), "n": [1, 2.5, null, true] }),
        Value::Null,
        Value::Bool(true),
    ]
}

mod log {
    use std::sync::Arc;

    use serde_json::Value;
    use spool_engine::vfs::{FaultKind, FaultVfs, OsVfs};
    use spool_engine::Durability;
    use spool_runtime::handle::{HandleError, SessionHandle};
    use spool_runtime::session::SessionId;
    use spool_runtime::store::{LogStore, LogStoreOptions};
    use spool_runtime::transcript::{CancelToken, EntryId};

    use super::*;

    #[test]
    fn bounded_open_equals_the_full_selection() {
        on_log(bounded_open);
    }

    #[test]
    fn omitted_branch_navigation_and_branch_pages() {
        on_log(omitted_branch_navigation);
    }

    #[test]
    fn handle_writes_run_the_before_handle_write_hooks() {
        on_log(handle_write_hooks);
    }

    /// The rewrite's commit (the session's last) holds a delta, not the
    /// payload.
    fn assert_delta_logged(b: &Log, id: &SessionId) {
        let engine = b.log_store().engine().unwrap();
        let head = engine.stream_version(id.as_str()).unwrap().unwrap();
        let last = engine.read_stream(id.as_str(), head, 1).unwrap();
        assert!(
            last[0].record_bytes < 4096,
            "{} bytes",
            last[0].record_bytes
        );
    }

    /// The scenario on a fresh log store, then the delta check.
    fn retained_on_log(payload: Value) {
        let b = Log::new();
        let id = retained(&b, payload, &no_checks);
        assert_delta_logged(&b, &id);
    }

    #[test]
    fn retained_data_five_mib_payload() {
        let [five, ..] = retained_payloads();
        retained_on_log(five);
    }

    #[test]
    fn retained_data_three_mib_object_payload() {
        let [_, three, ..] = retained_payloads();
        retained_on_log(three);
    }

    #[test]
    fn retained_data_null_and_true_payloads() {
        let [_, _, null, yes] = retained_payloads();
        retained_on_log(null);
        retained_on_log(yes);
    }

    /// A log store whose file system fails on demand, synced commits.
    fn faulty() -> (Log, Arc<FaultVfs>) {
        let dir = tempfile::tempdir().unwrap();
        let fault = Arc::new(FaultVfs::new(Arc::new(OsVfs)));
        let opts = LogStoreOptions {
            durability: Durability::Immediate,
            vfs: Some(fault.clone()),
            ..LogStoreOptions::default()
        };
        let store = Arc::new(LogStore::open(dir.path(), opts).expect("open log store"));
        (Log::with(dir, store), fault)
    }

    /// A failed write and a failed append before the cleanup: nothing of
    /// either commit reaches the log, the handle keeps its snapshot, and
    /// the cleanup then succeeds (after the engine's recovery).
    fn inject(
        fault: &FaultVfs,
        b: &Log,
        h: &SessionHandle,
        id: &SessionId,
        aborted: &EntryId,
        blob: &EntryId,
    ) {
        let engine = || b.log_store().engine().unwrap();
        let kind = FaultKind::Write;
        let before = h.snapshot();
        let stream_before = engine().stream_version(id.as_str()).unwrap();
        fault.fail_nth(kind, 1, false);
        let err = h
            .remove_trailing_entries(&is_aborted_assistant, &is_custom, &CancelToken::new())
            .expect_err("the injected fault fails the commit");
        assert!(matches!(err, HandleError::Store(_)), "{err}");
        // The engine refuses writes until a reopen recovers it; the retry
        // goes through that recovery.
        assert!(engine().is_poisoned());
        fault.clear();
        // The handle is unchanged (same snapshot), storage too.
        assert!(Arc::ptr_eq(&before, &h.snapshot()));
        assert!(h.is_open());
        assert!(h.entry(aborted).unwrap().is_some());
        assert_eq!(engine().stream_version(id.as_str()).unwrap(), stream_before);
        let t = b.reference(id);
        assert!(t.get(aborted).is_some());
        assert_eq!(t.get(blob).unwrap().parent_id.as_ref(), Some(aborted));
        // An append fails the same way and leaves everything as it was.
        fault.fail_nth(kind, 1, false);
        assert!(h.append(user("lost")).is_err());
        fault.clear();
        assert!(Arc::ptr_eq(&before, &h.snapshot()));
    }

    #[test]
    fn faults_mid_commit_leave_storage_and_handle_unchanged_and_a_retry_succeeds() {
        let [five, _, null, _] = retained_payloads();
        for payload in [five, null] {
            let (b, fault) = faulty();
            let id = retained(&b, payload, &|_, h, id, aborted, blob| {
                inject(&fault, &b, h, id, aborted, blob)
            });
            assert_delta_logged(&b, &id);
        }
    }
}

#[cfg(feature = "postgres")]
mod postgres {
    use super::pg::on_postgres;
    use super::*;

    #[test]
    fn bounded_open_equals_the_full_selection() {
        on_postgres("bounded_open_equals_the_full_selection", bounded_open);
    }

    #[test]
    fn omitted_branch_navigation_and_branch_pages() {
        on_postgres(
            "omitted_branch_navigation_and_branch_pages",
            omitted_branch_navigation,
        );
    }

    #[test]
    fn handle_writes_run_the_before_handle_write_hooks() {
        on_postgres(
            "handle_writes_run_the_before_handle_write_hooks",
            handle_write_hooks,
        );
    }

    #[test]
    fn retained_data_five_mib_payload() {
        let [five, ..] = retained_payloads();
        on_postgres("retained_data_five_mib_payload", |b| {
            retained(b, five, &no_checks);
        });
    }

    #[test]
    fn retained_data_three_mib_object_payload() {
        let [_, three, ..] = retained_payloads();
        on_postgres("retained_data_three_mib_object_payload", |b| {
            retained(b, three, &no_checks);
        });
    }

    #[test]
    fn retained_data_null_and_true_payloads() {
        let [_, _, null, yes] = retained_payloads();
        on_postgres("retained_data_null_and_true_payloads", |b| {
            retained(b, null, &no_checks);
            retained(b, yes, &no_checks);
        });
    }
}
