//! The stores called from async code: from inside a tokio runtime of
//! either flavour, directly (blocking the task's thread for the call) and
//! through `spawn_blocking` (the documented pattern). The PostgreSQL
//! store's blocking client cannot run on a thread inside a runtime, so it
//! moves its work off such threads; the log store is plain blocking I/O.

use crate::postgres_support;

use std::sync::Arc;

use postgres_support::PgServer;
use spool_runtime::store::{open_store, ListQuery, LogStore, LogStoreOptions, SessionStore};
use spool_runtime::{AgentDefinition, AgentSession};

/// Create, load, save, list, the transcript head, delete: each store
/// call a user makes, on whatever thread this runs.
fn exercise(store: &dyn SessionStore, agent: &str) {
    let def = AgentDefinition::new(agent, "async test agent", "Be brief.");
    let s = store.create(AgentSession::new(def, None)).expect("create");
    let id = s.id().clone();
    let mut loaded = store.load(&id).expect("load").expect("present");
    loaded.touch();
    let saved = store.save(loaded).expect("save");
    assert_eq!(saved.version(), 2);
    let listed = store
        .list_headers(&ListQuery::all().with_agent(agent))
        .expect("list");
    assert_eq!(listed.headers.len(), 1);
    if let Some(tx) = store.transcript_backend() {
        assert!(tx.head(&id).expect("transcript head").is_some());
    }
    assert!(store.delete(&id).expect("delete"));
}

/// A PostgreSQL store opened inside the runtime, called directly and from
/// `spawn_blocking`, then dropped inside the runtime (closing its pooled
/// connections there).
async fn postgres_in_runtime(test: &str) {
    let Some(server) = PgServer::start_or_skip(test) else {
        return;
    };
    let store = open_store(&server.url()).expect("open inside a runtime");
    exercise(store.as_ref(), "direct");
    let s = Arc::clone(&store);
    tokio::task::spawn_blocking(move || exercise(s.as_ref(), "spawn_blocking"))
        .await
        .expect("spawn_blocking task");
    // A task of its own, directly.
    let s = Arc::clone(&store);
    tokio::spawn(async move { exercise(s.as_ref(), "task") })
        .await
        .expect("task");
    drop(store);
}

#[tokio::test(flavor = "current_thread")]
async fn postgres_store_inside_a_current_thread_runtime() {
    postgres_in_runtime("postgres_store_inside_a_current_thread_runtime").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_store_inside_a_multi_thread_runtime() {
    postgres_in_runtime("postgres_store_inside_a_multi_thread_runtime").await;
}

async fn log_store_in_runtime() {
    let dir = tempfile::tempdir().unwrap();
    let store: Arc<dyn SessionStore> =
        Arc::new(LogStore::open(dir.path(), LogStoreOptions::default()).expect("open"));
    exercise(store.as_ref(), "direct");
    let s = Arc::clone(&store);
    tokio::task::spawn_blocking(move || exercise(s.as_ref(), "spawn_blocking"))
        .await
        .expect("spawn_blocking task");
    drop(store);
}

#[tokio::test(flavor = "current_thread")]
async fn log_store_inside_a_current_thread_runtime() {
    log_store_in_runtime().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_store_inside_a_multi_thread_runtime() {
    log_store_in_runtime().await;
}
