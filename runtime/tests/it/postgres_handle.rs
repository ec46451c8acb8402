//! Session handles on the PostgreSQL store, against a real throwaway
//! server (see `postgres_support`; skipped loudly without server binaries
//! except under CI): every answer equals the log store's for the same
//! operations, without a single full load, also after the migration that
//! backfills the index. The scenarios every indexed store runs are in
//! `handle_backends`.

#![cfg(feature = "postgres")]

use crate::handle_support;
use crate::postgres_support;

use std::sync::Arc;

use handle_support::*;
use postgres_support::PgServer;
use serde_json::{json, Value};
use spool_runtime::handle::{HandleOptions, HistorySelection};
use spool_runtime::store::postgres::PostgresStore;
use spool_runtime::store::SessionStore;
use spool_runtime::transcript::{
    select_resident, Budget, CancelToken, EntryId, PageBudget, PageOrder, ReadResult, StopReason,
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
