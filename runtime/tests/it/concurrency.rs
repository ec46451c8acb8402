//! 16 threads executing against one session through the runtime.

use crate::common;

use std::sync::{Arc, Barrier};

use common::*;
use spool_runtime::actions::WriteMetadata;
use spool_runtime::observer::{RecordingSink, RuntimeEvent};
use spool_runtime::store::{FileStore, MemoryStore, SessionStore};
use spool_runtime::{RuntimeError, SessionRuntime};

const THREADS: usize = 16;
const PER_THREAD: usize = 4;

fn hammer(store: Arc<dyn SessionStore>) {
    let sink = Arc::new(RecordingSink::new());
    let rt = SessionRuntime::new(store.clone(), sink.clone(), Default::default());
    let id = rt.create(definition("c"), None).unwrap().id().clone();
    sink.take();
    let barrier = Barrier::new(THREADS);
    let per_thread: Vec<(Vec<u64>, usize)> = std::thread::scope(|scope| {
        let hs: Vec<_> = (0..THREADS)
            .map(|t| {
                let (rt, id, barrier) = (&rt, &id, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    let mut versions = Vec::new();
                    let mut conflicts = 0;
                    let mut attempts = 0;
                    while versions.len() < PER_THREAD {
                        attempts += 1;
                        assert!(attempts < 100_000, "thread {t} starved");
                        let k = versions.len();
                        match rt.execute(id, &WriteMetadata::new(format!("t{t}-{k}"), k)) {
                            Ok(s) => versions.push(s.version()),
                            Err(e @ RuntimeError::Store(_)) if e.is_conflict() => conflicts += 1,
                            Err(e) => panic!("thread {t}: unexpected error {e}"),
                        }
                    }
                    (versions, conflicts)
                })
            })
            .collect();
        hs.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let conflicts: usize = per_thread.iter().map(|(_, c)| c).sum();
    let mut versions: Vec<u64> = per_thread.into_iter().flat_map(|(v, _)| v).collect();
    versions.sort_unstable();
    let n = (THREADS * PER_THREAD) as u64;
    assert_eq!(versions, (2..=n + 1).collect::<Vec<_>>(), "gaps or repeats");

    // Every conflict was reported to the observer, and nothing else failed.
    let events = sink.events();
    let save_failed: Vec<_> = events
        .iter()
        .filter_map(|e| match e {
            RuntimeEvent::SessionSaveFailed { error_kind, .. } => Some(error_kind.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(save_failed.len(), conflicts);
    assert!(save_failed.iter().all(|k| *k == "conflict"));
    let saved = events.iter().filter(|e| e.name() == "SessionSaved").count();
    assert_eq!(saved as u64, n);

    // No successful execute's effect was lost.
    let fin = rt.get_session(&id).unwrap();
    assert_eq!(fin.version(), n + 1);
    for t in 0..THREADS {
        for k in 0..PER_THREAD {
            assert_eq!(
                fin.state().metadata.get(&format!("t{t}-{k}")),
                Some(&serde_json::json!(k).into()),
                "lost update t{t}-{k}"
            );
        }
    }
    eprintln!("{n} executes, {conflicts} conflicts reported and retried");
}

#[test]
fn sixteen_threads_on_one_session_memory() {
    hammer(Arc::new(MemoryStore::new()));
}

#[test]
fn sixteen_threads_on_one_session_file() {
    let dir = tempfile::tempdir().unwrap();
    hammer(Arc::new(FileStore::open(dir.path()).unwrap()));
}
