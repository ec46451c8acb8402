//! Version-fenced reads and prepared rewrites on handles: continuations
//! after a rewrite or an append, owner loss, cancellation, publication
//! failure, rewrite slots, truncation.

use crate::handle_support;

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use handle_support::*;
use spool_runtime::handle::{HandleError, HandleOptions, HistorySelection, SessionHandle};
use spool_runtime::session::{
    AgentSession, AgentSessionInfo, SessionEvent, SessionId, SessionInfoList,
};
use spool_runtime::store::{
    AppendReceipt, BoxedSource, ChangeMark, ListQuery, LogStore, SessionStore, StoreError,
    StoreStats, TranscriptBackend, TranscriptHead,
};
use spool_runtime::transcript::{
    select_resident, Budget, CancelToken, ContentBlock, Entry, EntryId, EntryKind, Message,
    PageBudget, PageOrder, ReadResult, Replacement,
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
    assert_eq!(read_branch(&h, &leaf), 60);
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

/// The log store behind a wrapper that counts head reads, can hide the
/// store's change marks, and can land a write of its own when a read takes
/// its source (a write racing the read).
struct Probed {
    log: Arc<LogStore>,
    heads: AtomicU64,
    marks: AtomicBool,
    /// The session to append one entry to at the next `source`.
    race: Mutex<Option<SessionId>>,
    raced: AtomicU64,
}

impl Probed {
    fn new(log: Arc<LogStore>) -> Arc<Self> {
        Arc::new(Probed {
            log,
            heads: AtomicU64::new(0),
            marks: AtomicBool::new(true),
            race: Mutex::new(None),
            raced: AtomicU64::new(0),
        })
    }

    fn heads(&self) -> u64 {
        self.heads.swap(0, Ordering::SeqCst)
    }

    /// Appends an entry under the current leaf, straight through the store.
    fn land_write(&self, id: &SessionId) -> Result<(), StoreError> {
        let head = self.log.head(id)?.expect("the session");
        let entry = Entry {
            id: EntryId::parse(&format!(
                "raced-{}",
                self.raced.fetch_add(1, Ordering::SeqCst)
            ))
            .unwrap(),
            parent_id: head.leaf,
            timestamp_ms: 1,
            kind: user("raced"),
        };
        self.log.append_events(
            id,
            head.header.version,
            vec![SessionEvent::EntryAppended { entry }],
        )?;
        Ok(())
    }
}

impl TranscriptBackend for Probed {
    fn identity(&self) -> String {
        self.log.identity()
    }
    fn head(&self, id: &SessionId) -> Result<Option<TranscriptHead>, StoreError> {
        self.heads.fetch_add(1, Ordering::SeqCst);
        self.log.head(id)
    }
    fn change_mark(&self) -> Option<ChangeMark> {
        self.marks
            .load(Ordering::SeqCst)
            .then(|| self.log.change_mark())
            .flatten()
    }
    fn source(&self, id: &SessionId) -> Result<BoxedSource<'_>, StoreError> {
        let race = self.race.lock().unwrap().take();
        if let Some(sid) = race {
            self.land_write(&sid)?;
        }
        self.log.source(id)
    }
    fn entry_ids(&self, id: &SessionId) -> Result<Vec<EntryId>, StoreError> {
        self.log.entry_ids(id)
    }
    fn append_events(
        &self,
        id: &SessionId,
        expected_version: u64,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        self.log.append_events(id, expected_version, events)
    }
}

impl SessionStore for Probed {
    fn create(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        self.log.create(session)
    }
    fn save(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        self.log.save(session)
    }
    fn load(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        self.log.load(id)
    }
    fn exists(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.log.exists(id)
    }
    fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.log.delete(id)
    }
    fn list_headers(&self, query: &ListQuery) -> Result<SessionInfoList, StoreError> {
        self.log.list_headers(query)
    }
    fn header(&self, id: &SessionId) -> Result<Option<AgentSessionInfo>, StoreError> {
        self.log.header(id)
    }
    fn stats(&self) -> StoreStats {
        self.log.stats()
    }
    fn transcript_backend(&self) -> Option<&dyn TranscriptBackend> {
        Some(self)
    }
}

/// Reads every page of `leaf`'s branch (leaf first, 10 entries each); the entries
/// read.
fn read_branch(h: &SessionHandle, leaf: &EntryId) -> usize {
    let mut cursor = None;
    let mut seen = 0;
    loop {
        let r = page(h, leaf, cursor.take());
        seen += r.value().unwrap().as_page().unwrap().entries.len();
        match r {
            ReadResult::Page { continuation, .. } => cursor = Some(continuation),
            ReadResult::Complete { .. } => return seen,
            other => panic!("{other:?}"),
        }
    }
}

/// A session of `n` 100-byte entries in a log store behind [`Probed`],
/// with its writer handle and the entries' ids.
fn probed_session(
    n: usize,
) -> (
    tempfile::TempDir,
    Arc<Probed>,
    spool_runtime::SessionRuntime,
    SessionId,
    SessionHandle,
    Vec<EntryId>,
) {
    let dir = tempfile::tempdir().unwrap();
    let probed = Probed::new(open_log(dir.path()));
    let (rt, _) = runtime(probed.clone());
    let id = new_session(&rt);
    let h = writer(&rt, &id, 4096);
    let ids = h
        .append_entries((0..n).map(|i| sized(i, 100)).collect())
        .unwrap();
    (dir, probed, rt, id, h, ids)
}

/// With the log store's change marks, a reader paging through a branch no
/// one writes reads the session head once, not twice a page; a write moves
/// the mark and the next read reads the head again. Without marks, every
/// page reads it twice (before and after).
#[test]
fn paging_an_unchanged_branch_reads_the_head_once_while_the_change_mark_stands() {
    let (_dir, probed, rt, id, h, ids) = probed_session(60);
    let reader = rt.open_handle(&id, HandleOptions::reader()).unwrap();
    probed.heads();
    assert_eq!(read_branch(&reader, &ids[59]), 60);
    assert_eq!(probed.heads(), 1, "six pages, one head read");
    assert_eq!(read_branch(&reader, &ids[59]), 60);
    assert_eq!(probed.heads(), 0, "the mark still stands");
    let more = h.append(user("more")).unwrap();
    probed.heads();
    assert_eq!(read_branch(&reader, &more), 61);
    assert_eq!(probed.heads(), 1, "a write moved the mark");
    // A prepared read at the current version answers from the same head.
    let prepared = reader.prepare_read().unwrap();
    assert_eq!(prepared.version(), h.snapshot().version);
    assert_eq!(probed.heads(), 0);
    probed.marks.store(false, Ordering::SeqCst);
    assert_eq!(read_branch(&reader, &more), 61);
    assert_eq!(probed.heads(), 14, "seven pages, two head reads each");
}

/// A write that lands while a read holds its source (after the version was
/// found, before the check after the read) makes the read a version
/// conflict, with and without change marks, whether the version came from
/// a head read or from the handle's last one.
#[test]
fn a_write_landing_during_a_read_is_a_version_conflict() {
    let (_dir, probed, rt, id, h, ids) = probed_session(30);
    drop(h);
    let reader = rt.open_handle(&id, HandleOptions::reader()).unwrap();
    for marks in [true, false] {
        probed.marks.store(marks, Ordering::SeqCst);
        let before = reader.prepare_read().unwrap().version();
        // The first page's version comes from the head read just made.
        *probed.race.lock().unwrap() = Some(id.clone());
        match page(&reader, &ids[29], None) {
            ReadResult::VersionConflict { expected, actual } => {
                assert_eq!(expected, before, "marks {marks}");
                assert_ne!(actual, before, "marks {marks}");
            }
            other => panic!("marks {marks}: {other:?}"),
        }
        // The next read finds the new version and reads it whole.
        let r = page(&reader, &ids[29], None);
        assert!(matches!(r, ReadResult::Page { .. }), "marks {marks}: {r:?}");
        // A prepared read too.
        let prepared = reader.prepare_read().unwrap();
        *probed.race.lock().unwrap() = Some(id.clone());
        let r = prepared
            .read(
                &HistorySelection::Entry { id: ids[0].clone() },
                &CancelToken::new(),
            )
            .unwrap();
        assert!(
            matches!(r, ReadResult::VersionConflict { .. }),
            "marks {marks}: {r:?}"
        );
    }
}
