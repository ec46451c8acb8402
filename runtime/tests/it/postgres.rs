//! The PostgreSQL store against a real, throwaway server (see
//! `postgres_support`): the store conformance suite, version fences across
//! processes, idempotent retry by commit id, server restarts mid-workload,
//! schema migration, purge and snapshots.

#![cfg(feature = "postgres")]

use crate::postgres_support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use postgres_support::PgServer;
use spool_runtime::store::conformance::{self, StoreFixture};
use spool_runtime::store::postgres::{PostgresOptions, PostgresStore, SCHEMA_VERSION};
use spool_runtime::store::{open_store, SessionStore, StoreError};
use spool_runtime::{AgentDefinition, AgentSession, ModelConfig, SessionId};
use uuid::Uuid;

fn fresh(agent: &str) -> AgentSession {
    let def = AgentDefinition::new(agent, "postgres test agent", "You are a test agent.")
        .with_model(ModelConfig::new("scripted", "m1"));
    AgentSession::new(def, None)
}

fn connect(conn: &str) -> PostgresStore {
    PostgresStore::connect(conn).unwrap_or_else(|e| panic!("connect {conn}: {e}"))
}

fn sql(server_conn: &str) -> postgres::Client {
    postgres::Client::connect(server_conn, postgres::NoTls).expect("connect for SQL checks")
}

/// Every `open()` connects a new store to the same fresh schema.
struct PgFixture(String);

impl StoreFixture for PgFixture {
    fn open(&self) -> Arc<dyn SessionStore> {
        Arc::new(connect(&self.0))
    }
}

#[test]
fn postgres_store_conforms() {
    let Some(server) = PgServer::start_or_skip("postgres_store_conforms") else {
        return;
    };
    conformance::run_all(&|| Box::new(PgFixture(server.fresh_schema())));
}

/// A retry with the same commit id returns the original result and lands
/// nothing; a new commit id after that is a normal write.
#[test]
fn postgres_retry_by_commit_id_is_idempotent() {
    let Some(server) = PgServer::start_or_skip("postgres_retry_by_commit_id_is_idempotent") else {
        return;
    };
    let store = connect(&server.fresh_schema());
    let s = fresh("idem");
    let create_id = Uuid::new_v4();
    let created = store.create_with_commit_id(s.clone(), create_id).unwrap();
    let again = store.create_with_commit_id(s.clone(), create_id).unwrap();
    assert_eq!(again, created, "a create retry returns the original result");
    // A create with a new commit id is a real duplicate.
    assert!(matches!(
        store.create(s),
        Err(StoreError::Conflict {
            expected: 0,
            actual: 1,
            ..
        })
    ));

    let mut edit = created.clone();
    edit.write_metadata("k", serde_json::json!(1)).unwrap();
    let save_id = Uuid::new_v4();
    let saved = store.save_with_commit_id(edit.clone(), save_id).unwrap();
    assert_eq!(saved.version(), 2);
    let retried = store.save_with_commit_id(edit.clone(), save_id).unwrap();
    assert_eq!(retried, saved, "a save retry returns the original result");

    // Move on, then retry the old commit: still the original result.
    let mut next = saved.clone();
    next.write_metadata("k", serde_json::json!(2)).unwrap();
    let next = store.save(next).unwrap();
    assert_eq!(next.version(), 3);
    let late = store.save_with_commit_id(edit.clone(), save_id).unwrap();
    assert_eq!(late.version(), 2);
    // The same edit under a new commit id is stale.
    assert!(matches!(
        store.save_with_commit_id(edit, Uuid::new_v4()),
        Err(StoreError::Conflict {
            expected: 1,
            actual: 3,
            ..
        })
    ));

    let commits = store.commits(created.id()).unwrap();
    assert_eq!(
        commits
            .iter()
            .map(|c| (c.version, c.commit_id))
            .take(2)
            .collect::<Vec<_>>(),
        vec![(1, create_id), (2, save_id)]
    );
    assert_eq!(commits.len(), 3, "every commit landed exactly once");
    assert_eq!(store.commit(save_id).unwrap().map(|c| c.version), Some(2));
    assert_eq!(store.load(created.id()).unwrap().unwrap(), next);

    // A commit id that belongs to another session is refused.
    let other = store.create(fresh("idem")).unwrap();
    let mut o = other.clone();
    o.write_metadata("x", serde_json::json!(0)).unwrap();
    match store.save_with_commit_id(o, save_id) {
        Err(StoreError::InvalidSession { id, .. }) => assert_eq!(&id, other.id()),
        r => panic!("reusing another session's commit id must fail, got {r:?}"),
    }
}

/// A stale write hits the (session, version) primary key; the store reports
/// it as a conflict, and the table keeps exactly one commit per version.
#[test]
fn postgres_stale_write_is_a_conflict_from_the_version_key() {
    let Some(server) =
        PgServer::start_or_skip("postgres_stale_write_is_a_conflict_from_the_version_key")
    else {
        return;
    };
    let conn = server.fresh_schema();
    let store = connect(&conn);
    let s = store.create(fresh("fence")).unwrap();
    let mut a = s.clone();
    a.write_metadata("w", serde_json::json!("a")).unwrap();
    store.save(a).unwrap();
    let mut b = s.clone();
    b.write_metadata("w", serde_json::json!("b")).unwrap();
    let err = store.save(b).unwrap_err();
    assert!(
        matches!(
            err,
            StoreError::Conflict {
                expected: 1,
                actual: 2,
                ..
            }
        ),
        "{err:?}"
    );
    // The fence is the primary key: a direct duplicate insert is a unique
    // violation.
    let mut c = sql(&conn);
    let dup = c.execute(
        "INSERT INTO spool_commits (session_id, version, commit_id, created_at_ms, kinds, payloads)
         VALUES ($1, 2, $2, 0, '{}', '{}')",
        &[&s.id().as_str(), &Uuid::new_v4()],
    );
    let e = dup.expect_err("a second commit at version 2 must be refused");
    assert_eq!(e.code(), Some(&postgres::error::SqlState::UNIQUE_VIOLATION));
    let versions: Vec<i64> = c
        .query(
            "SELECT version FROM spool_commits WHERE session_id = $1 ORDER BY version",
            &[&s.id().as_str()],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(versions, vec![1, 2]);
}

/// Stores connecting at once to an empty schema migrate it exactly once;
/// a schema newer than the build is refused.
#[test]
fn postgres_schema_is_versioned_and_migrated_once() {
    let Some(server) = PgServer::start_or_skip("postgres_schema_is_versioned_and_migrated_once")
    else {
        return;
    };
    let conn = server.fresh_schema();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| connect(&conn).schema_version().unwrap()))
            .collect();
        for h in handles {
            assert_eq!(h.join().unwrap(), SCHEMA_VERSION);
        }
    });
    let mut c = sql(&conn);
    let rows: Vec<i32> = c
        .query(
            "SELECT version FROM spool_schema_version ORDER BY version",
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(rows, (1..=SCHEMA_VERSION).collect::<Vec<_>>());
    c.execute(
        "INSERT INTO spool_schema_version VALUES ($1, 0)",
        &[&(SCHEMA_VERSION + 1)],
    )
    .unwrap();
    match PostgresStore::connect(&conn) {
        Err(e @ StoreError::Backend(_)) => {
            assert!(e.to_string().contains("newer"), "{e}")
        }
        other => panic!("a newer schema must be refused, got {other:?}"),
    }
}

/// `open_store` picks PostgreSQL for a `postgres://` URL and the log
/// store for a directory.
#[test]
fn postgres_open_store_selects_by_location() {
    let Some(server) = PgServer::start_or_skip("postgres_open_store_selects_by_location") else {
        return;
    };
    let store = open_store(&server.url()).expect("open postgres:// location");
    let s = store.create(fresh("open")).unwrap();
    // The same database through another handle sees it.
    let other = connect(&server.conn_str());
    assert_eq!(other.load(s.id()).unwrap().unwrap(), s);
    let dir = tempfile::tempdir().unwrap();
    let log = open_store(dir.path().to_str().unwrap()).expect("open a directory");
    assert!(!log.exists(s.id()).unwrap());
    assert!(matches!(
        open_store("postgres://127.0.0.1:1/x?connect_timeout=bogus"),
        Err(StoreError::Backend(_))
    ));
}

/// Purge removes commits and snapshot; a new incarnation of the same id
/// starts at version 1 and never sees the old snapshot. A long session
/// gets a snapshot and loads identically from it.
#[test]
fn postgres_purge_and_snapshots() {
    let Some(server) = PgServer::start_or_skip("postgres_purge_and_snapshots") else {
        return;
    };
    let conn = server.fresh_schema();
    let store = connect(&conn);
    let mut c = sql(&conn);
    let snapshot_version = |c: &mut postgres::Client, id: &SessionId| -> Option<i64> {
        c.query_opt(
            "SELECT version FROM spool_snapshots WHERE session_id = $1",
            &[&id.as_str()],
        )
        .unwrap()
        .map(|r| r.get(0))
    };
    let original = fresh("snap");
    let id = original.id().clone();
    let commits = spool_runtime::store::log::SNAPSHOT_TAIL_COMMITS + 6;
    let mut s = store.create(original.clone()).unwrap();
    for i in 1..commits {
        s.write_metadata("i", serde_json::json!(i)).unwrap();
        s.write_metadata(format!("first-{i}"), serde_json::json!(true))
            .unwrap();
        s = store.save(s).unwrap();
    }
    assert_eq!(s.version(), commits);
    assert_eq!(snapshot_version(&mut c, &id), None);
    let loaded = store.load(&id).unwrap().unwrap();
    assert_eq!(loaded, s);
    assert_eq!(
        snapshot_version(&mut c, &id),
        Some(commits as i64),
        "a long replay stores a snapshot"
    );
    // Loads from the snapshot (plus a tail) give the same session.
    let mut t = loaded.clone();
    t.write_metadata("tail", serde_json::json!(1)).unwrap();
    let t = store.save(t).unwrap();
    assert_eq!(store.load(&id).unwrap().unwrap(), t);
    assert_eq!(
        store.load_at(&id, Some(3)).unwrap().unwrap().version(),
        3,
        "time travel below the snapshot replays from the start"
    );

    // Purge.
    assert!(store.delete(&id).unwrap());
    assert!(store.load(&id).unwrap().is_none());
    assert!(store.header(&id).unwrap().is_none());
    let left: i64 = c
        .query_one(
            "SELECT (SELECT count(*) FROM spool_commits WHERE session_id = $1)
                  + (SELECT count(*) FROM spool_snapshots WHERE session_id = $1)",
            &[&id.as_str()],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "purge removes commits and snapshot");

    // A new incarnation with the same id.
    let mut n = store.create(original).unwrap();
    assert_eq!(n.version(), 1);
    for i in 1..commits {
        n.write_metadata(format!("second-{i}"), serde_json::json!(i))
            .unwrap();
        n = store.save(n).unwrap();
    }
    // Plant a snapshot of the old incarnation at the new head's version
    // (as a load racing the purge could): it names a commit id that is
    // not in this incarnation, so it must be ignored.
    c.execute(
        "INSERT INTO spool_snapshots (session_id, version, commit_id, updated_at_ms, bytes)
         VALUES ($1, $2, $3, 0, $4)
         ON CONFLICT (session_id) DO UPDATE SET version = EXCLUDED.version,
             commit_id = EXCLUDED.commit_id, bytes = EXCLUDED.bytes",
        &[
            &id.as_str(),
            &(commits as i64),
            &Uuid::new_v4(),
            &spool_runtime::session::encode_snapshot(&loaded).unwrap(),
        ],
    )
    .unwrap();
    let reloaded = store.load(&id).unwrap().unwrap();
    assert_eq!(reloaded, n, "a foreign snapshot must not be applied");
    assert!(!reloaded.state().metadata.contains_key("first-1"));
}

// ---- two processes ---------------------------------------------------

const CHILD_ENV_CONN: &str = "SPOOL_PG_CHILD_CONN";
const CHILD_ENV_SESSIONS: &str = "SPOOL_PG_CHILD_SESSIONS";
const CHILD_ENV_TAG: &str = "SPOOL_PG_CHILD_TAG";
const CHILD_ENV_GO: &str = "SPOOL_PG_CHILD_GO";
/// Successful saves each child lands on each session.
const CHILD_SAVES: u64 = 25;
const CHILD_SESSIONS: usize = 3;
const CHILD_TEST: &str = "postgres::postgres_child_writer";

/// Entry point of the writer processes of
/// [`postgres_two_processes_write_the_same_sessions`]: the parent runs this
/// test binary with `--ignored --exact postgres_child_writer` and the
/// `SPOOL_PG_CHILD_*` variables. Without them it does nothing.
#[test]
#[ignore = "child process of postgres_two_processes_write_the_same_sessions"]
fn postgres_child_writer() {
    let Ok(conn) = std::env::var(CHILD_ENV_CONN) else {
        return;
    };
    let tag = std::env::var(CHILD_ENV_TAG).expect("tag");
    let go = std::env::var(CHILD_ENV_GO).expect("go file");
    let ids: Vec<SessionId> = std::env::var(CHILD_ENV_SESSIONS)
        .expect("sessions")
        .split(',')
        .map(|s| SessionId::parse(s).expect("session id"))
        .collect();
    let store = connect(&conn);
    // Start together: the parent creates the go file once both children
    // are connected.
    println!("READY {tag}");
    let mut waited = 0u32;
    while !std::path::Path::new(&go).exists() {
        waited += 1;
        assert!(waited < 60_000, "child {tag}: no go signal");
        std::thread::sleep(Duration::from_millis(5));
    }
    for k in 0..CHILD_SAVES {
        for id in &ids {
            let mut attempts = 0u32;
            loop {
                attempts += 1;
                assert!(attempts < 100_000, "child {tag} starved on {id}");
                let mut s = store.load(id).unwrap().expect("session exists");
                s.write_metadata(format!("{tag}-{k}"), serde_json::json!(k))
                    .unwrap();
                let expected = s.version();
                match store.save(s) {
                    Ok(saved) => {
                        println!("SAVED {id} {expected} {}", saved.version());
                        break;
                    }
                    Err(StoreError::Conflict {
                        expected: e,
                        actual,
                        ..
                    }) => println!("CONFLICT {id} {e} {actual}"),
                    Err(other) => panic!("child {tag}: unexpected error {other}"),
                }
            }
        }
    }
}

/// Two OS processes land load-modify-save updates on the same sessions:
/// every stale save is reported as a conflict with a newer stored version,
/// no update is lost, and the versions have no gaps or repeats.
#[test]
fn postgres_two_processes_write_the_same_sessions() {
    let Some(server) = PgServer::start_or_skip("postgres_two_processes_write_the_same_sessions")
    else {
        return;
    };
    let conn = server.fresh_schema();
    let store = connect(&conn);
    let ids: Vec<SessionId> = (0..CHILD_SESSIONS)
        .map(|_| store.create(fresh("multi")).unwrap().id().clone())
        .collect();
    let stale = store.load(&ids[0]).unwrap().unwrap();
    let go_dir = tempfile::tempdir().unwrap();
    let go = go_dir.path().join("go");
    let exe = std::env::current_exe().expect("test binary path");
    let joined = ids.iter().map(|i| i.as_str()).collect::<Vec<_>>().join(",");
    let children: Vec<_> = ["p0", "p1"]
        .iter()
        .map(|tag| {
            std::process::Command::new(&exe)
                .args([
                    "--ignored",
                    "--exact",
                    CHILD_TEST,
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env(CHILD_ENV_CONN, &conn)
                .env(CHILD_ENV_SESSIONS, &joined)
                .env(CHILD_ENV_TAG, tag)
                .env(CHILD_ENV_GO, &go)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .expect("spawn a writer process")
        })
        .collect();
    std::fs::write(&go, b"go").unwrap();
    let mut saved: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    let mut conflicts = 0usize;
    for (n, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().expect("wait for a writer");
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "writer {n} failed:\n{stdout}");
        assert!(
            stdout.contains("READY"),
            "writer {n} did not run the workload:\n{stdout}"
        );
        for line in stdout.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            match f.as_slice() {
                ["SAVED", id, expected, version] => {
                    let (e, v): (u64, u64) = (expected.parse().unwrap(), version.parse().unwrap());
                    assert_eq!(v, e + 1);
                    saved.entry(id.to_string()).or_default().push(v);
                }
                ["CONFLICT", _id, expected, actual] => {
                    let (e, a): (u64, u64) = (expected.parse().unwrap(), actual.parse().unwrap());
                    assert!(a > e, "a conflict must report a newer stored version");
                    conflicts += 1;
                }
                _ => {}
            }
        }
    }
    eprintln!("two processes: {conflicts} conflicts reported");
    let per_session = 2 * CHILD_SAVES;
    for id in &ids {
        let mut versions = saved.remove(id.as_str()).unwrap_or_default();
        versions.sort_unstable();
        assert_eq!(
            versions,
            (2..=per_session + 1).collect::<Vec<_>>(),
            "session {id}: versions must have no gaps or repeats"
        );
        let s = store.load(id).unwrap().unwrap();
        assert_eq!(s.version(), per_session + 1);
        for tag in ["p0", "p1"] {
            for k in 0..CHILD_SAVES {
                assert!(
                    s.state().metadata.contains_key(&format!("{tag}-{k}")),
                    "session {id}: update {tag}-{k} was lost"
                );
            }
        }
        let commits = store.commits(id).unwrap();
        assert_eq!(
            commits.iter().map(|c| c.version).collect::<Vec<_>>(),
            (1..=per_session + 1).collect::<Vec<_>>()
        );
    }
    // A copy loaded before the children ran is stale now.
    match store.save(stale) {
        Err(StoreError::Conflict {
            expected, actual, ..
        }) => {
            assert_eq!((expected, actual), (1, per_session + 1));
        }
        other => panic!("the stale copy must conflict, got {other:?}"),
    }
}

// ---- server restarts -------------------------------------------------

/// Saves each worker lands before the restart is triggered, and after it.
const RESTART_SAVES_BEFORE: usize = 30;
const RESTART_SAVES_AFTER: usize = 30;
/// Upper bound of a worker's saves (the workload ends on its own even if
/// the restart never comes).
const RESTART_SAVES_MAX: usize = 5_000;
const RESTART_WORKERS: usize = 2;
/// Attempts of one commit across the restart (20 ms apart).
const RESTART_RETRIES_MAX: u32 = 3_000;

struct Worker {
    id: SessionId,
    /// (commit id, version) of every acknowledged commit, create first.
    acked: Vec<(Uuid, u64)>,
    /// Failed attempts that were retried with the same commit id.
    failures: usize,
}

fn wait_for(counter: &AtomicUsize, at_least: usize, what: &str) {
    let mut polls = 0u32;
    while counter.load(Ordering::SeqCst) < at_least {
        polls += 1;
        assert!(polls < 24_000, "gave up waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// The server crashes and restarts while workers commit with explicit
/// commit ids and no internal reconnects; each failed commit is retried by
/// the caller with the same id. Every acknowledged commit survives, and
/// the stored commits are exactly the acknowledged ones, each once.
#[test]
fn postgres_restart_mid_workload_retry_by_commit_id() {
    let Some(server) = PgServer::start_or_skip("postgres_restart_mid_workload_retry_by_commit_id")
    else {
        return;
    };
    let conn = server.fresh_schema();
    let store = PostgresStore::connect_with(
        &conn,
        PostgresOptions::default()
            .reconnect_attempts(0)
            .connect_timeout(Duration::from_secs(5)),
    )
    .unwrap();
    let acked_total = AtomicUsize::new(0);
    let restarted = AtomicBool::new(false);
    let after = AtomicUsize::new(0);
    let workers: Vec<Worker> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..RESTART_WORKERS)
            .map(|w| {
                let (store, acked_total, restarted, after) =
                    (&store, &acked_total, &restarted, &after);
                scope.spawn(move || {
                    let mut failures = 0usize;
                    let mut acked = Vec::new();
                    let create_id = Uuid::new_v4();
                    let mut s = retry_commit(&mut failures, || {
                        store.create_with_commit_id(fresh("restart"), create_id)
                    });
                    acked.push((create_id, s.version()));
                    let mut saves_after = 0usize;
                    for k in 0..RESTART_SAVES_MAX {
                        if saves_after >= RESTART_SAVES_AFTER {
                            break;
                        }
                        let was_restarted = restarted.load(Ordering::SeqCst);
                        s.write_metadata(format!("w{w}-{k}"), serde_json::json!(k))
                            .unwrap();
                        let cid = Uuid::new_v4();
                        let before = s.version();
                        let pending = s.clone();
                        s = retry_commit(&mut failures, || {
                            store.save_with_commit_id(pending.clone(), cid)
                        });
                        assert_eq!(s.version(), before + 1, "worker {w}: commit {k}");
                        acked.push((cid, s.version()));
                        acked_total.fetch_add(1, Ordering::SeqCst);
                        if was_restarted {
                            saves_after += 1;
                            after.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    Worker {
                        id: s.id().clone(),
                        acked,
                        failures,
                    }
                })
            })
            .collect();
        wait_for(
            &acked_total,
            RESTART_WORKERS * RESTART_SAVES_BEFORE,
            "saves before the restart",
        );
        server.crash_restart();
        restarted.store(true, Ordering::SeqCst);
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    assert!(
        after.load(Ordering::SeqCst) >= RESTART_WORKERS * RESTART_SAVES_AFTER,
        "the workload must go on after the restart"
    );
    let failures: usize = workers.iter().map(|w| w.failures).sum();
    eprintln!("restart: {failures} failed attempts retried by commit id");
    assert!(
        failures > 0,
        "the restart must have broken the pooled connections"
    );
    let check = connect(&conn);
    for w in &workers {
        let stored: Vec<(Uuid, u64)> = check
            .commits(&w.id)
            .unwrap()
            .iter()
            .map(|c| (c.commit_id, c.version))
            .collect();
        assert_eq!(
            stored, w.acked,
            "session {}: stored commits must be exactly the acknowledged ones",
            w.id
        );
        let s = check.load(&w.id).unwrap().unwrap();
        assert_eq!(s.version(), w.acked.len() as u64);
    }
}

/// Retries `f` (one commit with a fixed commit id) while it fails with a
/// backend (connection) error, counting the failures.
fn retry_commit(
    failures: &mut usize,
    mut f: impl FnMut() -> Result<AgentSession, StoreError>,
) -> AgentSession {
    let mut attempts = 0u32;
    loop {
        match f() {
            Ok(s) => return s,
            Err(StoreError::Backend(e)) => {
                attempts += 1;
                *failures += 1;
                assert!(attempts < RESTART_RETRIES_MAX, "commit kept failing: {e}");
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(other) => panic!("unexpected error across a restart: {other}"),
        }
    }
}

/// The server crashes and restarts while workers save through the plain
/// `SessionStore` API: the store reconnects and retries on its own, no
/// save fails, and every acknowledged update is there exactly once.
#[test]
fn postgres_restart_mid_workload_reconnects() {
    let Some(server) = PgServer::start_or_skip("postgres_restart_mid_workload_reconnects") else {
        return;
    };
    let conn = server.fresh_schema();
    let store = PostgresStore::connect_with(
        &conn,
        PostgresOptions::default()
            .reconnect_attempts(600)
            .reconnect_delay(Duration::from_millis(50)),
    )
    .unwrap();
    let acked_total = AtomicUsize::new(0);
    let restarted = AtomicBool::new(false);
    let after = AtomicUsize::new(0);
    let sessions: Vec<(SessionId, BTreeSet<String>, u64)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..RESTART_WORKERS)
            .map(|w| {
                let (store, acked_total, restarted, after) =
                    (&store, &acked_total, &restarted, &after);
                scope.spawn(move || {
                    let mut s = store.create(fresh("reconnect")).unwrap();
                    let mut keys = BTreeSet::new();
                    let mut saves_after = 0usize;
                    for k in 0..RESTART_SAVES_MAX {
                        if saves_after >= RESTART_SAVES_AFTER {
                            break;
                        }
                        let was_restarted = restarted.load(Ordering::SeqCst);
                        let key = format!("w{w}-{k}");
                        s.write_metadata(key.clone(), serde_json::json!(k)).unwrap();
                        let before = s.version();
                        s = store
                            .save(s)
                            .unwrap_or_else(|e| panic!("worker {w}: save {k} failed: {e}"));
                        assert_eq!(s.version(), before + 1);
                        keys.insert(key);
                        acked_total.fetch_add(1, Ordering::SeqCst);
                        if was_restarted {
                            saves_after += 1;
                            after.fetch_add(1, Ordering::SeqCst);
                        }
                    }
                    (s.id().clone(), keys, s.version())
                })
            })
            .collect();
        wait_for(
            &acked_total,
            RESTART_WORKERS * RESTART_SAVES_BEFORE,
            "saves before the restart",
        );
        server.crash_restart();
        restarted.store(true, Ordering::SeqCst);
        handles
            .into_iter()
            .map(|h| h.join().expect("worker panicked"))
            .collect()
    });
    assert!(after.load(Ordering::SeqCst) >= RESTART_WORKERS * RESTART_SAVES_AFTER);
    for (id, keys, version) in &sessions {
        let s = store.load(id).unwrap().unwrap();
        assert_eq!(s.version(), *version, "session {id}: head version");
        assert_eq!(
            store.commits(id).unwrap().len() as u64,
            *version,
            "session {id}: one commit per version"
        );
        for k in keys {
            assert!(s.state().metadata.contains_key(k), "session {id}: {k} lost");
        }
    }
}

// ---- the runtime on PostgreSQL ----------------------------------------

fn user(text: &str) -> spool_runtime::transcript::EntryKind {
    use spool_runtime::transcript::{ContentBlock, EntryKind, Message};
    EntryKind::Message {
        message: Message::User {
            content: vec![ContentBlock::text(text)],
        },
    }
}

/// `SessionRuntime` runs unchanged on the PostgreSQL store: create,
/// actions, fork, tombstone, purge; a history rewrite round-trips.
#[test]
fn postgres_runs_the_session_runtime() {
    use spool_runtime::actions::WriteMetadata;
    use spool_runtime::hooks::SessionHookStack;
    use spool_runtime::observer::NullSink;
    use spool_runtime::session::SessionStatus;
    use spool_runtime::store::ListQuery;
    use spool_runtime::transcript::Entry;
    use spool_runtime::SessionRuntime;

    let Some(server) = PgServer::start_or_skip("postgres_runs_the_session_runtime") else {
        return;
    };
    let store: Arc<dyn SessionStore> = Arc::new(connect(&server.fresh_schema()));
    let rt = SessionRuntime::new(store.clone(), Arc::new(NullSink), SessionHookStack::empty());
    let def = AgentDefinition::new("rt", "runtime on postgres", "Be brief.")
        .with_model(ModelConfig::new("scripted", "m1"));
    let s = rt.create(def, None).unwrap();
    let s2 = rt
        .execute(s.id(), &WriteMetadata::new("ticket", "OPS-1"))
        .unwrap();
    assert_eq!(s2.version(), 2);
    assert_eq!(rt.get_session(s.id()).unwrap(), s2);

    // A history rewrite is one more event: it survives save and load.
    let mut h = rt.get_session(s.id()).unwrap();
    h.append(user("one")).unwrap();
    h.append(user("two")).unwrap();
    let h = store.save(h).unwrap();
    let mut r = h.clone();
    let summary = Entry::new(None, user("summary of one and two"));
    let leaf = summary.id.clone();
    let generation = r.rewrite_history(vec![summary], Some(leaf)).unwrap();
    let r = store.save(r).unwrap();
    let back = store.load(s.id()).unwrap().unwrap();
    assert_eq!(back, r);
    assert_eq!(back.state().generation, generation);
    assert_eq!(back.state().transcript.len(), 1);

    let fork = rt.fork(s.id(), None).unwrap();
    assert_eq!(fork.parent_id(), Some(s.id()));
    assert_eq!(
        rt.list_sessions(&ListQuery::all().children_of(s.id().clone()))
            .unwrap()
            .ids(),
        vec![fork.id().clone()]
    );
    rt.delete(fork.id()).unwrap();
    assert_eq!(rt.status(fork.id()).unwrap(), SessionStatus::Deleted);
    assert_eq!(rt.list_sessions(&ListQuery::all()).unwrap().len(), 1);
    assert!(rt.purge(fork.id()).unwrap());
    assert!(!store.exists(fork.id()).unwrap());
}

/// An import into PostgreSQL is one transaction: commits keep their ids
/// and times, and a failure in the write pass (here the source changes
/// between the check and the write, after the first session is written)
/// leaves nothing behind.
#[test]
fn postgres_import_keeps_commit_times_and_is_all_or_nothing() {
    use spool_runtime::store::exchange::{
        ExchangeError, ImportCommit, ImportOptions, ImportSession, ImportSource,
    };
    let Some(server) =
        PgServer::start_or_skip("postgres_import_keeps_commit_times_and_is_all_or_nothing")
    else {
        return;
    };
    let store = connect(&server.conn_str());
    let session = |agent: &str, stamp: i64| {
        let s = fresh(agent);
        ImportSession {
            id: s.id().clone(),
            commits: vec![ImportCommit {
                version: 1,
                commit_id: Uuid::new_v4(),
                timestamp_ms: stamp,
                events: s.pending_events().to_vec(),
                lines: Vec::new(),
            }],
        }
    };
    let a = session("a", 1_000);
    let b = session("b", 2_000);
    let imported = store
        .import_from(
            &mut &[a.clone(), b.clone()][..],
            &ImportOptions::default(),
            &mut |_| {},
        )
        .expect("import");
    assert_eq!(imported.len(), 2);
    let commits = store.commits(&b.id).unwrap();
    assert_eq!(commits.len(), 1);
    assert_eq!(commits[0].created_at_ms, 2_000);
    assert_eq!(commits[0].commit_id, b.commits[0].commit_id);
    assert_eq!(store.header(&a.id).unwrap().unwrap().updated_at_ms, 1_000);

    /// Yields `first` on the check pass and `second` on the write pass.
    struct Changing {
        first: Vec<ImportSession>,
        second: Vec<ImportSession>,
        calls: usize,
    }
    impl ImportSource for Changing {
        fn for_each_commit(
            &mut self,
            f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
        ) -> Result<(), ExchangeError> {
            self.calls += 1;
            let list = if self.calls == 1 {
                &self.first
            } else {
                &self.second
            };
            (&mut list.as_slice()).for_each_commit(f)
        }
    }
    let c = session("c", 3_000);
    let d = session("d", 4_000);
    let e = session("e", 5_000);
    let mut source = Changing {
        first: vec![c.clone(), d],
        second: vec![c.clone(), e],
        calls: 0,
    };
    let err = store
        .import_from(&mut source, &ImportOptions::default(), &mut |_| {})
        .expect_err("the source changed");
    assert!(matches!(err, ExchangeError::ImportFailed { .. }), "{err}");
    assert!(store.header(&c.id).unwrap().is_none(), "rolled back");
    assert!(store.commits(&c.id).unwrap().is_empty(), "rolled back");
}
