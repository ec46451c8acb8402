//! The store conformance suite: one function per property every
//! [`SessionStore`] must have. Run it for a new store with [`run_all`];
//! `runtime/tests/conformance.rs` runs it for the memory and file stores.
//!
//! The functions panic (with a message naming the property) when the
//! store misbehaves — they are test code. Each expects an empty store.

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};

use super::{ListOrder, ListQuery, SessionStore, SortDirection, StoreError};
use crate::session::{
    AgentDefinition, AgentSession, AgentState, ModelConfig, SessionId, SessionStatus, Task,
    TaskStatus,
};
use crate::transcript::{ContentBlock, EntryKind, Message};

/// Opens the store under test. Calling `open` again after every handle
/// from the previous call was dropped must reopen the same data (for a
/// volatile store it may return the same instance).
pub trait StoreFixture {
    fn open(&self) -> Arc<dyn SessionStore>;
}

/// Threads used by the concurrency properties.
pub const THREADS: usize = 16;
/// Successful saves each thread performs in [`concurrent_saves`].
pub const SAVES_PER_THREAD: usize = 5;
/// Entries in [`big_transcript_round_trip`].
pub const BIG_TRANSCRIPT: usize = 1000;

/// Runs every property, each against a fresh fixture.
pub fn run_all(new_fixture: &dyn Fn() -> Box<dyn StoreFixture>) {
    type Prop = fn(&dyn SessionStore);
    let props: &[(&str, Prop)] = &[
        ("create_persists_version_one", create_persists_version_one),
        ("create_requires_version_zero", create_requires_version_zero),
        ("duplicate_create_conflicts", duplicate_create_conflicts),
        ("save_increments_version", save_increments_version),
        ("stale_save_conflicts", stale_save_conflicts),
        (
            "save_of_missing_session_is_not_found",
            save_of_missing_session_is_not_found,
        ),
        ("load_exists_delete", load_exists_delete),
        (
            "returned_sessions_have_no_pending_events",
            returned_sessions_have_no_pending_events,
        ),
        (
            "header_and_listing_do_not_load_state",
            header_and_listing_do_not_load_state,
        ),
        ("listing_filters", listing_filters),
        ("listing_orders_and_pages", listing_orders_and_pages),
        (
            "deleted_sessions_hidden_by_default",
            deleted_sessions_hidden_by_default,
        ),
        (
            "metadata_and_transcript_round_trip",
            metadata_and_transcript_round_trip,
        ),
        ("big_transcript_round_trip", big_transcript_round_trip),
        (
            "fork_is_listed_under_its_parent",
            fork_is_listed_under_its_parent,
        ),
        ("concurrent_saves", concurrent_saves),
        ("concurrent_duplicate_creates", concurrent_duplicate_creates),
    ];
    for (name, prop) in props {
        let fixture = new_fixture();
        let store = fixture.open();
        eprintln!("conformance: {name}");
        prop(store.as_ref());
    }
    eprintln!("conformance: reopen_gives_identical_sessions");
    reopen_gives_identical_sessions(new_fixture().as_ref());
}

fn definition(agent: &str) -> AgentDefinition {
    AgentDefinition::new(agent, "conformance agent", "You are a test agent.")
        .with_model(ModelConfig::new("scripted", "m1"))
}

fn fresh(agent: &str) -> AgentSession {
    AgentSession::new(definition(agent), None)
}

fn user(text: &str) -> EntryKind {
    EntryKind::Message {
        message: Message::User {
            content: vec![ContentBlock::text(text)],
        },
    }
}

fn create(store: &dyn SessionStore, s: AgentSession) -> AgentSession {
    match store.create(s) {
        Ok(s) => s,
        Err(e) => panic!("create failed: {e}"),
    }
}

fn save(store: &dyn SessionStore, s: AgentSession) -> AgentSession {
    match store.save(s) {
        Ok(s) => s,
        Err(e) => panic!("save failed: {e}"),
    }
}

fn load(store: &dyn SessionStore, id: &SessionId) -> AgentSession {
    match store.load(id) {
        Ok(Some(s)) => s,
        Ok(None) => panic!("session {id} not found"),
        Err(e) => panic!("load {id} failed: {e}"),
    }
}

fn list(store: &dyn SessionStore, q: &ListQuery) -> crate::session::SessionInfoList {
    match store.list_headers(q) {
        Ok(l) => l,
        Err(e) => panic!("list_headers failed: {e}"),
    }
}

/// `create` persists a fresh session as version 1 and returns it.
pub fn create_persists_version_one(store: &dyn SessionStore) {
    let s = fresh("a");
    assert_eq!(s.version(), 0);
    let id = s.id().clone();
    let created = create(store, s.clone());
    assert_eq!(created.version(), 1, "create must persist version 1");
    assert_eq!(created.definition(), s.definition());
    assert_eq!(created.state(), s.state());
    assert!(created.info().updated_at_ms >= created.info().created_at_ms);
    let loaded = load(store, &id);
    assert_eq!(loaded, created, "load must return what create returned");
}

/// `create` refuses a session whose version is not 0, storing nothing.
pub fn create_requires_version_zero(store: &dyn SessionStore) {
    let s = fresh("a");
    let id = s.id().clone();
    let not_fresh = s.reconstitute(3, 0);
    let err = store
        .create(not_fresh)
        .expect_err("create of version 3 must fail");
    assert!(
        matches!(err, StoreError::InvalidSession { .. }),
        "unexpected error {err:?}"
    );
    assert!(!store.exists(&id).unwrap_or(true), "nothing may be stored");
}

/// A second `create` of the same id is `Conflict { expected: 0, actual }`.
pub fn duplicate_create_conflicts(store: &dyn SessionStore) {
    let s = fresh("a");
    let created = create(store, s.clone());
    let saved = save(store, created);
    match store.create(s) {
        Err(StoreError::Conflict {
            id,
            expected,
            actual,
        }) => {
            assert_eq!(&id, saved.id());
            assert_eq!(expected, 0);
            assert_eq!(actual, 2, "actual must be the stored version");
        }
        other => panic!("duplicate create must conflict, got {other:?}"),
    }
    assert_eq!(
        load(store, saved.id()),
        saved,
        "the stored session is untouched"
    );
}

/// `save` persists version + 1, keeps `created_at`, never moves
/// `updated_at` backwards.
pub fn save_increments_version(store: &dyn SessionStore) {
    let mut s = create(store, fresh("a"));
    for expected in 2..=5u64 {
        let before = s.info().clone();
        s.write_metadata("n", serde_json::json!(expected)).unwrap();
        s = save(store, s);
        assert_eq!(s.version(), expected);
        assert_eq!(s.info().created_at_ms, before.created_at_ms);
        assert!(s.info().updated_at_ms >= before.updated_at_ms);
        assert_eq!(load(store, s.id()), s);
        assert_eq!(store.header(s.id()).unwrap().as_ref(), Some(s.info()));
    }
}

/// A save with a stale version is `Conflict { expected, actual }` and
/// changes nothing.
pub fn stale_save_conflicts(store: &dyn SessionStore) {
    let created = create(store, fresh("a"));
    let mut a = created.clone();
    let mut b = created;
    a.write_metadata("who", serde_json::json!("a")).unwrap();
    let a = save(store, a);
    b.write_metadata("who", serde_json::json!("b")).unwrap();
    match store.save(b) {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!(expected, 1);
            assert_eq!(actual, 2);
        }
        other => panic!("stale save must conflict, got {other:?}"),
    }
    assert_eq!(load(store, a.id()), a, "the losing save must not land");
}

/// Saving a session that was never created is `NotFound`.
pub fn save_of_missing_session_is_not_found(store: &dyn SessionStore) {
    let s = fresh("a");
    let id = s.id().clone();
    match store.save(s) {
        Err(StoreError::NotFound { id: got }) => assert_eq!(got, id),
        other => panic!("save of a missing session must be NotFound, got {other:?}"),
    }
    assert!(!store.exists(&id).unwrap());
}

/// `load`/`exists`/`header` see a created session; `delete` removes it
/// and reports whether it existed.
pub fn load_exists_delete(store: &dyn SessionStore) {
    let missing = SessionId::generate();
    assert!(store.load(&missing).unwrap().is_none());
    assert!(!store.exists(&missing).unwrap());
    assert!(store.header(&missing).unwrap().is_none());
    assert!(!store.delete(&missing).unwrap());

    let s = create(store, fresh("a"));
    let keep = create(store, fresh("a"));
    assert!(store.exists(s.id()).unwrap());
    assert!(store.delete(s.id()).unwrap());
    assert!(!store.exists(s.id()).unwrap());
    assert!(store.load(s.id()).unwrap().is_none());
    assert!(store.header(s.id()).unwrap().is_none());
    assert!(
        !store.delete(s.id()).unwrap(),
        "second delete reports absence"
    );
    assert_eq!(
        list(store, &ListQuery::all()).ids(),
        vec![keep.id().clone()]
    );
}

/// Sessions returned by create, save and load have no pending events.
pub fn returned_sessions_have_no_pending_events(store: &dyn SessionStore) {
    let mut s = create(store, fresh("a"));
    assert!(s.pending_events().is_empty());
    s.append(user("hi")).unwrap();
    assert_eq!(s.pending_events().len(), 1);
    let s = save(store, s);
    assert!(s.pending_events().is_empty());
    assert!(load(store, s.id()).pending_events().is_empty());
}

/// `header` and `list_headers` never count a full load; `load` does.
pub fn header_and_listing_do_not_load_state(store: &dyn SessionStore) {
    let mut ids = Vec::new();
    for i in 0..20 {
        let mut s = fresh(if i % 2 == 0 { "even" } else { "odd" });
        s.append(user(&"x".repeat(1000))).unwrap();
        ids.push(create(store, s).id().clone());
    }
    let before = store.stats().full_loads;
    for id in &ids {
        assert!(store.header(id).unwrap().is_some());
    }
    assert_eq!(list(store, &ListQuery::all()).len(), 20);
    assert_eq!(list(store, &ListQuery::all().with_agent("odd")).len(), 10);
    assert_eq!(
        store.stats().full_loads,
        before,
        "header/list_headers must not load state"
    );
    let _ = load(store, &ids[0]);
    assert_eq!(store.stats().full_loads, before + 1, "load counts");
}

/// Filters by status, agent and parent combine with AND; `total` counts
/// matches before paging.
pub fn listing_filters(store: &dyn SessionStore) {
    let a1 = create(store, fresh("alpha"));
    let _a2 = create(store, fresh("alpha"));
    let b1 = create(store, fresh("beta"));
    let mut s = a1.clone();
    s.set_status(SessionStatus::Suspended).unwrap();
    let a1 = save(store, s);
    let mut s = b1;
    s.set_status(SessionStatus::Completed).unwrap();
    let b1 = save(store, s);

    let q = ListQuery::all().with_agent("alpha");
    let l = list(store, &q);
    assert_eq!(l.total, 2);
    assert!(l.iter().all(|h| h.agent_name == "alpha"));
    let l = list(
        store,
        &ListQuery::all().with_status(SessionStatus::Suspended),
    );
    assert_eq!(l.ids(), vec![a1.id().clone()]);
    let l = list(
        store,
        &ListQuery::all()
            .with_status(SessionStatus::Completed)
            .with_agent("beta"),
    );
    assert_eq!(l.ids(), vec![b1.id().clone()]);
    let l = list(
        store,
        &ListQuery::all()
            .with_status(SessionStatus::Completed)
            .with_agent("alpha"),
    );
    assert!(l.is_empty());
    assert_eq!(l.total, 0);
    assert_eq!(
        store.header(a1.id()).unwrap().map(|h| h.status),
        Some(SessionStatus::Suspended)
    );
}

fn sorted_by(headers: &[crate::session::AgentSessionInfo], q: &ListQuery) -> bool {
    let key = |h: &crate::session::AgentSessionInfo| {
        let p = match q.order {
            ListOrder::UpdatedAt => h.updated_at_ms,
            ListOrder::CreatedAt => h.created_at_ms,
            ListOrder::Id => 0,
        };
        (p, h.id.clone())
    };
    headers.windows(2).all(|w| match q.direction {
        SortDirection::Ascending => key(&w[0]) < key(&w[1]),
        SortDirection::Descending => key(&w[0]) > key(&w[1]),
    })
}

/// Every order is total (ties broken by id); cursor pages and offset pages
/// both reassemble the full listing exactly.
pub fn listing_orders_and_pages(store: &dyn SessionStore) {
    let mut all = BTreeSet::new();
    for i in 0..23 {
        let mut s = create(store, fresh("p"));
        if i % 3 == 0 {
            s.write_metadata("touched", serde_json::json!(true))
                .unwrap();
            s = save(store, s);
        }
        all.insert(s.id().clone());
    }
    for order in [ListOrder::UpdatedAt, ListOrder::CreatedAt, ListOrder::Id] {
        for dir in [SortDirection::Ascending, SortDirection::Descending] {
            let q = ListQuery::all().order_by(order, dir);
            let full = list(store, &q);
            assert_eq!(full.total, 23);
            assert_eq!(full.len(), 23);
            assert!(full.next_cursor.is_none());
            assert!(sorted_by(&full.headers, &q), "{order:?} {dir:?} not sorted");
            assert_eq!(full.ids().into_iter().collect::<BTreeSet<_>>(), all);
            if order == ListOrder::Id {
                let mut ids: Vec<_> = all.iter().cloned().collect();
                if dir == SortDirection::Descending {
                    ids.reverse();
                }
                assert_eq!(full.ids(), ids);
            }
            // Cursor paging.
            let mut got = Vec::new();
            let mut cursor: Option<String> = None;
            for _ in 0..10 {
                let mut pq = q.clone().limit(5);
                pq.cursor = cursor.clone();
                let page = list(store, &pq);
                assert!(page.len() <= 5);
                assert_eq!(page.total, 23);
                got.extend(page.ids());
                cursor = page.next_cursor.clone();
                if cursor.is_none() {
                    break;
                }
            }
            assert_eq!(got, full.ids(), "cursor pages must reassemble the listing");
            // Offset paging.
            let mut got = Vec::new();
            for off in (0..25).step_by(4) {
                got.extend(list(store, &q.clone().page(off, 4)).ids());
            }
            assert_eq!(got, full.ids(), "offset pages must reassemble the listing");
        }
    }
    // A cursor from another order is refused, not misread.
    let page = list(
        store,
        &ListQuery::all()
            .order_by(ListOrder::Id, SortDirection::Ascending)
            .limit(3),
    );
    let c = page.next_cursor.expect("more pages");
    let bad = ListQuery::all()
        .order_by(ListOrder::CreatedAt, SortDirection::Ascending)
        .after(c);
    assert!(matches!(
        store.list_headers(&bad),
        Err(StoreError::InvalidQuery { .. })
    ));
}

/// Tombstoned (status Deleted) sessions are left out of listings unless
/// asked for.
pub fn deleted_sessions_hidden_by_default(store: &dyn SessionStore) {
    let live = create(store, fresh("a"));
    let mut gone = create(store, fresh("a"));
    gone.mark_deleted().unwrap();
    let gone = save(store, gone);
    assert_eq!(
        list(store, &ListQuery::all()).ids(),
        vec![live.id().clone()]
    );
    assert_eq!(list(store, &ListQuery::all().including_deleted()).len(), 2);
    assert_eq!(
        list(store, &ListQuery::all().with_status(SessionStatus::Deleted)).ids(),
        vec![gone.id().clone()]
    );
    assert_eq!(load(store, gone.id()).status(), SessionStatus::Deleted);
}

/// Metadata, settings, tasks, usage and a branching transcript with its
/// leaf survive a round trip exactly.
pub fn metadata_and_transcript_round_trip(store: &dyn SessionStore) {
    let seed = AgentState::new()
        .with_metadata("ticket", serde_json::json!("OPS-142"))
        .with_metadata(
            "nested",
            serde_json::json!({"a": [1, 2.5, null, "ü"], "b": {"c": true}}),
        );
    let mut s = create(store, AgentSession::new(definition("rt"), Some(seed)));
    let root = s.append(user("hello")).unwrap();
    let _a = s.append(user("branch one")).unwrap();
    s.move_leaf(Some(root.clone())).unwrap();
    let b = s.append(user("branch two")).unwrap();
    s.append(EntryKind::Custom {
        custom_type: "plugin".into(),
        data: serde_json::json!({"bytes": "\u{0}\u{1f}\"\\"}).into(),
    })
    .unwrap();
    s.move_leaf(Some(b)).unwrap();
    s.write_metadata("priority", serde_json::json!("high"))
        .unwrap();
    s.set_system_prompt("Be brief.").unwrap();
    s.set_model(ModelConfig::new("p", "m2").with_param("temperature", serde_json::json!(0.25)))
        .unwrap();
    s.set_tasks(vec![
        Task::new("t1", "first", TaskStatus::Completed),
        Task::new("t2", "second", TaskStatus::InProgress),
    ])
    .unwrap();
    s.start_execution().unwrap();
    s.finish_execution(
        crate::session::ExecutionStatus::Failed,
        crate::transcript::Usage {
            input_tokens: 7,
            output_tokens: 3,
            ..Default::default()
        },
        Some("boom".into()),
    )
    .unwrap();
    let saved = save(store, s);
    let loaded = load(store, saved.id());
    assert_eq!(loaded, saved);
    assert_eq!(loaded.state().transcript.len(), 4);
    assert_eq!(
        loaded.state().metadata["ticket"],
        serde_json::json!("OPS-142")
    );
}

/// A transcript of [`BIG_TRANSCRIPT`] entries round-trips.
pub fn big_transcript_round_trip(store: &dyn SessionStore) {
    let mut s = create(store, fresh("big"));
    for i in 0..BIG_TRANSCRIPT {
        s.append(user(&format!("message {i}"))).unwrap();
    }
    let saved = save(store, s);
    let loaded = load(store, saved.id());
    assert_eq!(loaded.state().transcript.len(), BIG_TRANSCRIPT);
    assert_eq!(loaded, saved);
}

/// A fork is stored with its parent and listed under it.
pub fn fork_is_listed_under_its_parent(store: &dyn SessionStore) {
    let mut parent = create(store, fresh("f"));
    let first = parent.append(user("one")).unwrap();
    parent.append(user("two")).unwrap();
    let parent = save(store, parent);
    let whole = create(store, parent.fork(None).unwrap());
    let at = create(store, parent.fork(Some(&first)).unwrap());
    assert_eq!(whole.parent_id(), Some(parent.id()));
    assert_eq!(whole.state().transcript.len(), 2);
    assert_eq!(at.state().transcript.len(), 1);
    let kids: BTreeSet<_> = list(store, &ListQuery::all().children_of(parent.id().clone()))
        .ids()
        .into_iter()
        .collect();
    assert_eq!(
        kids,
        [whole.id().clone(), at.id().clone()].into_iter().collect()
    );
    assert_eq!(load(store, at.id()), at);
}

/// [`THREADS`] threads each land [`SAVES_PER_THREAD`] saves on one session
/// by load-modify-save with retry: every conflict is reported as
/// `Conflict` with `expected < actual`, no successful save is lost, and
/// the successful versions are exactly 2..=N+1 (no gaps, no repeats).
pub fn concurrent_saves(store: &dyn SessionStore) {
    let id = create(store, fresh("c")).id().clone();
    let barrier = Barrier::new(THREADS);
    let results: Vec<(Vec<u64>, usize)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|t| {
                let id = id.clone();
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    let mut versions = Vec::new();
                    let mut conflicts = 0usize;
                    let mut attempts = 0usize;
                    while versions.len() < SAVES_PER_THREAD {
                        attempts += 1;
                        assert!(attempts < 100_000, "thread {t} starved");
                        let mut s = load(store, &id);
                        let n = versions.len();
                        s.write_metadata(format!("t{t}-{n}"), serde_json::json!(n))
                            .unwrap();
                        let expected = s.version();
                        match store.save(s) {
                            Ok(saved) => {
                                assert_eq!(saved.version(), expected + 1);
                                versions.push(saved.version());
                            }
                            Err(StoreError::Conflict {
                                expected: e,
                                actual,
                                ..
                            }) => {
                                assert_eq!(e, expected);
                                assert!(actual > e, "conflict must report a newer stored version");
                                conflicts += 1;
                            }
                            Err(other) => panic!("thread {t}: unexpected error {other}"),
                        }
                    }
                    (versions, conflicts)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("a saver thread panicked"))
            })
            .collect()
    });
    let mut all: Vec<u64> = results
        .iter()
        .flat_map(|(v, _)| v.iter().copied())
        .collect();
    all.sort_unstable();
    let n = (THREADS * SAVES_PER_THREAD) as u64;
    assert_eq!(
        all,
        (2..=n + 1).collect::<Vec<_>>(),
        "versions must have no gaps"
    );
    let fin = load(store, &id);
    assert_eq!(fin.version(), n + 1);
    for t in 0..THREADS {
        for k in 0..SAVES_PER_THREAD {
            assert!(
                fin.state().metadata.contains_key(&format!("t{t}-{k}")),
                "update t{t}-{k} was lost"
            );
        }
    }
}

/// [`THREADS`] threads create the same session: exactly one wins, the
/// others get `Conflict { expected: 0, actual: 1 }`.
pub fn concurrent_duplicate_creates(store: &dyn SessionStore) {
    let s = fresh("dup");
    let barrier = Barrier::new(THREADS);
    let results: Vec<Result<AgentSession, StoreError>> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..THREADS)
            .map(|_| {
                let s = s.clone();
                let barrier = &barrier;
                scope.spawn(move || {
                    barrier.wait();
                    store.create(s)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| panic!("a creator thread panicked"))
            })
            .collect()
    });
    let ok = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(ok, 1, "exactly one create must win");
    for r in &results {
        if let Err(e) = r {
            assert!(
                matches!(
                    e,
                    StoreError::Conflict {
                        expected: 0,
                        actual: 1,
                        ..
                    }
                ),
                "unexpected {e:?}"
            );
        }
    }
}

/// Closing and reopening the store returns identical sessions and
/// identical listings.
pub fn reopen_gives_identical_sessions(fixture: &dyn StoreFixture) {
    let (sessions, listing) = {
        let store = fixture.open();
        let store = store.as_ref();
        let mut out = Vec::new();
        for i in 0..5 {
            let mut s = create(store, fresh(&format!("agent{}", i % 2)));
            for j in 0..=i {
                s.append(user(&format!("m{j}"))).unwrap();
            }
            s.write_metadata("i", serde_json::json!(i)).unwrap();
            if i == 3 {
                s.set_status(SessionStatus::Suspended).unwrap();
            }
            let s = save(store, s);
            out.push(s);
        }
        let fork = create(store, out[4].fork(None).unwrap());
        out.push(fork);
        let listing = list(store, &ListQuery::all().including_deleted());
        (out, listing)
    };
    let store = fixture.open();
    for s in &sessions {
        assert_eq!(
            &load(store.as_ref(), s.id()),
            s,
            "session differs after reopen"
        );
        assert_eq!(store.header(s.id()).unwrap().as_ref(), Some(s.info()));
    }
    assert_eq!(
        list(store.as_ref(), &ListQuery::all().including_deleted()),
        listing,
        "listing differs after reopen"
    );
}
