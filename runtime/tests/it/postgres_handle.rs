//! Session handles on the PostgreSQL store, against a real throwaway
//! server (see `postgres_support`; skipped loudly without server binaries
//! except under CI): the store's native transcript index serves opens,
//! appends, navigation, history pages and rewrites without a single full
//! load, and every answer equals the log store's for the same operations.

#![cfg(feature = "postgres")]

use crate::handle_support;
use crate::postgres_support;

use std::sync::Arc;

use handle_support::*;
use postgres_support::PgServer;
use serde_json::{json, Value};
use spool_runtime::handle::{HandleOptions, HistorySelection, SessionHandle};
use spool_runtime::store::postgres::PostgresStore;
use spool_runtime::store::SessionStore;
use spool_runtime::transcript::{
    select_resident, Budget, CancelToken, Entry, EntryFacts, EntryId, EntryKind, Message,
    PageBudget, PageOrder, ReadResult, StopReason,
};
use spool_runtime::SessionRuntime;

fn connect(conn: &str) -> Arc<PostgresStore> {
    Arc::new(PostgresStore::connect(conn).unwrap_or_else(|e| panic!("connect {conn}: {e}")))
}

/// Replaces the digits after each `key` (clock readings differ between
/// two runs of the same operations).
fn scrub_numbers(s: &str, key: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(key) {
        let (head, tail) = rest.split_at(i + key.len());
        out.push_str(head);
        let digits = tail
            .find(|c: char| !(c.is_ascii_digit() || c == '-'))
            .unwrap_or(tail.len());
        out.push('_');
        rest = &tail[digits..];
    }
    out.push_str(rest);
    out
}

/// An answer with generated entry ids replaced by their position in
/// `ids` and clock readings blanked: comparable across two runs.
fn normalize(s: &str, ids: &[EntryId]) -> String {
    let mut s = s.to_string();
    for (k, id) in ids.iter().enumerate() {
        s = s.replace(id.as_str(), &format!("#{k}"));
    }
    let s = scrub_numbers(&s, "timestamp_ms: ");
    scrub_numbers(&s, "updated_at_ms: ")
}

/// Everything a reader handle answers about a session (as in the log
/// store's index-rebuild test).
fn answers(rt: &SessionRuntime, id: &spool_runtime::SessionId, ids: &[EntryId]) -> Vec<String> {
    let h = rt
        .open_handle(
            id,
            HandleOptions::reader().with_budget(Budget::new(6000, 64)),
        )
        .unwrap();
    let c = CancelToken::new();
    let snap = h.snapshot();
    let mut out = vec![
        format!("{:?}", snap.selection),
        format!("{:?} {:?}", snap.version, snap.leaf),
        format!("{:?}", snap.context().messages),
    ];
    let leaf = snap.leaf.clone().unwrap();
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
        out.push(match &r {
            ReadResult::Complete { value, .. } => format!("complete {value:?}"),
            ReadResult::Page { value, .. } => format!("page {value:?}"),
            other => format!("{other:?}"),
        });
    }
    out
}

/// One mixed workload: appends, custom entries, labels (set twice), a
/// branch with a summary, navigation to an omitted entry, a redaction and
/// a trailing removal. Returns the session and the ids it produced, in
/// operation order.
fn workload(rt: &SessionRuntime) -> (spool_runtime::SessionId, Vec<EntryId>) {
    let id = new_session(rt);
    let h = writer(rt, &id, 6000);
    let mut ids = h
        .append_entries((0..40).map(|i| sized(i, 200)).collect())
        .unwrap();
    ids.push(h.append(custom("state", json!({"n": 1}))).unwrap());
    ids.push(h.set_label(&ids[3], Some("three".into())).unwrap());
    ids.push(h.set_label(&ids[3], Some("trois".into())).unwrap());
    ids.push(h.branch_with_summary(Some(ids[5].clone()), "left").unwrap());
    ids.push(h.append(custom("state", json!({"n": 2}))).unwrap());
    ids.push(h.append(custom("other", Value::Null)).unwrap());
    ids.push(h.append(user("tail")).unwrap());
    // Back to the omitted main branch, then to the side branch again.
    h.move_leaf(Some(ids[39].clone())).unwrap();
    h.move_leaf(Some(ids[ids.len() - 1].clone())).unwrap();
    h.redact(&|s| s.replace("u2", "[r]"), &CancelToken::new())
        .unwrap()
        .unwrap();
    ids.push(h.append(assistant("oops", StopReason::Aborted)).unwrap());
    let out = h
        .remove_trailing_entries(
            &|e| e.kind_name() == "message",
            &|f| f.kind == "custom",
            &CancelToken::new(),
        )
        .unwrap();
    assert_eq!(out.removed.len(), 2);
    drop(h);
    (id, ids)
}

#[test]
fn handle_answers_equal_the_log_stores_without_full_loads() {
    let Some(server) =
        PgServer::start_or_skip("handle_answers_equal_the_log_stores_without_full_loads")
    else {
        return;
    };
    let conn = server.fresh_schema();
    let pg = connect(&conn);
    let (rt, _) = runtime(pg.clone());
    let (pid, pids) = workload(&rt);
    let pg_answers = answers(&rt, &pid, &pids);
    assert_eq!(pg.stats().full_loads, 0, "the handle never loads a session");

    let dir = tempfile::tempdir().unwrap();
    let log = open_log(dir.path());
    let (lrt, _) = runtime(log.clone());
    let (lid, lids) = workload(&lrt);
    let log_answers = answers(&lrt, &lid, &lids);

    assert_eq!(pg_answers.len(), log_answers.len());
    for (k, (p, l)) in pg_answers.iter().zip(&log_answers).enumerate() {
        assert_eq!(normalize(p, &pids), normalize(l, &lids), "answer {k}");
    }
    // And they agree with the fully loaded transcript (a second store
    // instance does the reference load, so the first one's count stays 0).
    let reference = connect(&conn);
    let t = full_transcript(&*reference, &pid);
    let h = rt
        .open_handle(
            &pid,
            HandleOptions::reader().with_budget(Budget::new(6000, 64)),
        )
        .unwrap();
    assert_eq!(
        h.snapshot().selection,
        select_resident(&t, t.leaf(), Budget::new(6000, 64)).unwrap()
    );
    assert_eq!(t.label(&pids[3]), Some("trois"));
    assert_eq!(pg.stats().full_loads, 0);
}

#[test]
fn two_thousand_entries_open_with_the_log_stores_bounded_context() {
    let Some(server) =
        PgServer::start_or_skip("two_thousand_entries_open_with_the_log_stores_bounded_context")
    else {
        return;
    };
    const N: usize = 2000;
    const CHUNK: usize = 500;
    let budget = Budget::new(64 * 1024, 1024);
    let build = |rt: &SessionRuntime| {
        let id = new_session(rt);
        let h = writer(rt, &id, 64 * 1024);
        let mut ids = Vec::new();
        let mut i = 0;
        while i < N {
            let kinds: Vec<EntryKind> = (i..(i + CHUNK).min(N)).map(|k| sized(k, 1024)).collect();
            i += kinds.len();
            ids.extend(h.append_entries(kinds).unwrap());
            assert!(h.snapshot().resident_bytes() <= budget.bytes_max);
        }
        drop(h);
        let h = rt
            .open_handle(&id, HandleOptions::reader().with_budget(budget))
            .unwrap();
        let s = h.snapshot();
        assert_eq!(s.counts().path_entries, N as u64);
        assert!(s.resident_bytes() <= budget.bytes_max);
        assert!(s.resident_events() <= budget.events_max);
        assert!(!s.is_complete());
        (id, ids, s)
    };
    let conn = server.fresh_schema();
    let pg = connect(&conn);
    let (rt, _) = runtime(pg.clone());
    let (pid, pids, ps) = build(&rt);
    assert_eq!(
        pg.stats().full_loads,
        0,
        "opening reads only the working set"
    );

    let dir = tempfile::tempdir().unwrap();
    let log = open_log(dir.path());
    let (lrt, _) = runtime(log.clone());
    let (_, lids, ls) = build(&lrt);
    assert_eq!(
        normalize(&format!("{:?}", ps.selection), &pids),
        normalize(&format!("{:?}", ls.selection), &lids)
    );
    assert_eq!(
        normalize(&format!("{:?}", ps.context().messages), &pids),
        normalize(&format!("{:?}", ls.context().messages), &lids)
    );
    assert_eq!(ps.version.generation, ls.version.generation);
    assert_eq!(ps.version.raw_seq, ls.version.raw_seq);

    let reference = connect(&conn);
    let t = full_transcript(&*reference, &pid);
    assert_eq!(t.len(), N);
    assert_eq!(ps.selection, select_resident(&t, t.leaf(), budget).unwrap());
    assert_eq!(pg.stats().full_loads, 0);
}

#[test]
fn navigation_to_an_omitted_branch_and_branch_pages_to_completion() {
    let Some(server) =
        PgServer::start_or_skip("navigation_to_an_omitted_branch_and_branch_pages_to_completion")
    else {
        return;
    };
    let conn = server.fresh_schema();
    let pg = connect(&conn);
    let (rt, _) = runtime(pg.clone());
    let id = new_session(&rt);
    let budget = Budget::new(8 * 1024, 1024);
    let h = rt
        .open_handle(&id, HandleOptions::writer().with_budget(budget))
        .unwrap();
    let main = h
        .append_entries((0..120).map(|i| sized(i, 500)).collect())
        .unwrap();
    h.move_leaf(Some(main[10].clone())).unwrap();
    let side = h
        .append_entries((0..40).map(|i| sized(1000 + i, 500)).collect())
        .unwrap();
    h.move_leaf(Some(main[119].clone())).unwrap();
    assert!(h.snapshot().get(&side[20]).is_none(), "not resident");
    let nav = h.move_leaf(Some(side[20].clone())).unwrap();
    assert_eq!(nav.leaf.as_ref(), Some(&side[20]));
    assert_eq!(nav.counts().path_entries, 11 + 21);
    assert!(nav.get(&side[20]).is_some());
    assert!(nav.get(&main[119]).is_none());
    assert!(nav.resident_bytes() <= budget.bytes_max);
    drop(h);
    // The leaf is persisted.
    let r = rt.open_handle(&id, HandleOptions::reader()).unwrap();
    assert_eq!(r.snapshot().leaf.as_ref(), Some(&side[20]));
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
    let mut cursor = None;
    let mut seen: Vec<EntryId> = Vec::new();
    loop {
        let r = r
            .read(
                &HistorySelection::BranchPage {
                    leaf: main[119].clone(),
                    order: PageOrder::LeafFirst,
                    cursor: cursor.take(),
                    budget: PageBudget::new(1 << 20, 7),
                },
                &CancelToken::new(),
            )
            .unwrap();
        let page = r.value().unwrap().as_page().unwrap();
        seen.extend(page.entries.iter().map(|e| e.id.clone()));
        match r {
            ReadResult::Page { continuation, .. } => cursor = Some(continuation),
            ReadResult::Complete { .. } => break,
            other => panic!("{other:?}"),
        }
    }
    let want: Vec<EntryId> = main.iter().rev().cloned().collect();
    assert_eq!(seen, want);
    // The side branch's selection equals the one over the full transcript.
    let reference = connect(&conn);
    let t = full_transcript(&*reference, &id);
    assert_eq!(
        nav.selection,
        select_resident(&t, Some(&side[20]), budget).unwrap()
    );
    assert_eq!(pg.stats().full_loads, 0);
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

fn branch_page(
    h: &SessionHandle,
    leaf: &EntryId,
    cursor: Option<spool_runtime::transcript::Continuation>,
) -> ReadResult<spool_runtime::handle::HistoryValue> {
    h.read(
        &HistorySelection::BranchPage {
            leaf: leaf.clone(),
            order: PageOrder::LeafFirst,
            cursor,
            // Room for the largest payload: pages are cut by count here.
            budget: PageBudget::new(64 << 20, 2),
        },
        &CancelToken::new(),
    )
    .unwrap()
}

/// The retained-data scenario: an aborted assistant then a large custom
/// payload under a 4,096-byte budget; `remove_trailing_entries` removes
/// the assistant, keeps the payload byte-exact and repairs its parent;
/// continuations taken before conflict after it.
fn retained(conn: &str, payload: Value) {
    let pg = connect(conn);
    let (rt, _) = runtime(pg.clone());
    let id = new_session(&rt);
    let h = rt
        .open_handle(
            &id,
            HandleOptions::writer().with_budget(Budget::new(4096, 1024)),
        )
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
    }
    assert_eq!(data_of(&h.entry(&blob).unwrap().unwrap()), want);
    // A continuation taken before the rewrite.
    let before = branch_page(&h, &blob, None);
    let cont = before.continuation().cloned().expect("a first page");
    let version_before = h.snapshot().version;
    let session_before = h.snapshot().session_version;

    let out = h
        .remove_trailing_entries(&is_aborted_assistant, &is_custom, &CancelToken::new())
        .unwrap();
    assert_eq!(out.removed, vec![aborted.clone()]);
    assert_eq!(out.scan.preserved, vec![blob.clone()]);
    let committed = out.committed.unwrap();
    assert_eq!(
        committed.reparented,
        vec![(blob.clone(), Some(question.clone()))]
    );
    assert_eq!(committed.version.generation, version_before.generation + 1);
    match branch_page(&h, &blob, Some(cont)) {
        ReadResult::VersionConflict { expected, actual } => {
            assert_eq!(expected, version_before);
            assert_eq!(actual, committed.version);
        }
        other => panic!("expected a version conflict, got {other:?}"),
    }
    assert_eq!(pg.stats().full_loads, 0);

    let reference = connect(conn);
    let check = |h: &SessionHandle| {
        let e = h.entry(&blob).unwrap().unwrap();
        assert_eq!(data_of(&e), want);
        assert_eq!(e.parent_id.as_ref(), Some(&question));
        assert!(h.entry(&aborted).unwrap().is_none());
        let t = full_transcript(&*reference, &id);
        assert_eq!(t.get(&blob), Some(&e));
        assert!(t.get(&aborted).is_none());
        assert_eq!(t.leaf(), Some(&blob));
        let s = h.snapshot();
        assert_eq!(s.leaf.as_ref(), Some(&blob));
        assert!(s.resident_bytes() <= 4096);
        assert_eq!(s.counts().path_entries, 3);
        assert_eq!(s.context().messages, t.context().unwrap().messages);
        assert_eq!(
            s.selection,
            select_resident(&t, t.leaf(), Budget::new(4096, 1024)).unwrap()
        );
    };
    check(&h);
    // Paging the new generation from the start reaches the root.
    let mut cursor = None;
    let mut seen = Vec::new();
    loop {
        let r = branch_page(&h, &blob, cursor.take());
        seen.extend(
            r.value()
                .unwrap()
                .as_page()
                .unwrap()
                .entries
                .iter()
                .map(|e| e.id.clone()),
        );
        match r {
            ReadResult::Page { continuation, .. } => cursor = Some(continuation),
            ReadResult::Complete { .. } => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, vec![blob.clone(), question.clone(), first.clone()]);
    drop(h);
    // A new store instance (a new process) sees the same.
    let pg2 = connect(conn);
    let (rt2, _) = runtime(pg2.clone());
    let h2 = rt2
        .open_handle(
            &id,
            HandleOptions::reader().with_budget(Budget::new(4096, 1024)),
        )
        .unwrap();
    check(&h2);
    assert_eq!(pg2.stats().full_loads, 0);
    assert_eq!(pg.stats().full_loads, 0);
    // The old generation is still history in the commits.
    let old = reference
        .load_at(&id, Some(session_before))
        .unwrap()
        .unwrap();
    assert!(old.state().transcript.get(&aborted).is_some());
}

#[test]
fn retained_data_rewrite_keeps_the_payload_and_fences_old_continuations() {
    let Some(server) = PgServer::start_or_skip(
        "retained_data_rewrite_keeps_the_payload_and_fences_old_continuations",
    ) else {
        return;
    };
    let big: String = "spool-é-\u{1F980}-0123456789\n".repeat((5 << 20) / 26);
    retained(&server.fresh_schema(), Value::String(big));
    retained(&server.fresh_schema(), Value::Null);
    retained(&server.fresh_schema(), Value::Bool(true));
}

/// Migration 2 builds the index of sessions written before it by
/// replaying their commits: simulated by dropping the index and the
/// migration record, then connecting again.
#[test]
fn migration_backfills_the_index_from_the_commits() {
    let Some(server) = PgServer::start_or_skip("migration_backfills_the_index_from_the_commits")
    else {
        return;
    };
    let conn = server.fresh_schema();
    let pg = connect(&conn);
    let (rt, _) = runtime(pg.clone());
    let (id, ids) = workload(&rt);
    let before = answers(&rt, &id, &ids);
    drop(rt);
    pg.close();
    drop(pg);
    let mut c = postgres::Client::connect(&conn, postgres::NoTls).unwrap();
    c.batch_execute(
        "DROP TABLE spool_entries, spool_custom_types;
         ALTER TABLE spool_sessions DROP COLUMN tx_generation, DROP COLUMN tx_raw_seq,
             DROP COLUMN tx_updated_at_ms, DROP COLUMN tx_leaf, DROP COLUMN tx_entries,
             DROP COLUMN tx_next_seq, DROP COLUMN tx_custom_next;
         DELETE FROM spool_schema_version WHERE version = 2;",
    )
    .unwrap();
    let pg = connect(&conn);
    assert_eq!(pg.schema_version().unwrap(), 2);
    let n: i64 = c
        .query_one("SELECT count(*) FROM spool_entries", &[])
        .unwrap()
        .get(0);
    assert!(n > 40, "the backfill indexed the entries ({n})");
    let (rt, _) = runtime(pg.clone());
    let after = answers(&rt, &id, &ids);
    assert_eq!(before.len(), after.len());
    for (k, (b, a)) in before.iter().zip(&after).enumerate() {
        assert_eq!(b, a, "answer {k}");
    }
    assert_eq!(pg.stats().full_loads, 0);
}
