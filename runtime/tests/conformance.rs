//! The store conformance suite against the memory and JSON file stores.

use std::sync::Arc;

use spool_runtime::store::conformance::{self, StoreFixture};
use spool_runtime::store::{FileStore, LogStore, LogStoreOptions, MemoryStore, SessionStore};

struct MemoryFixture(Arc<MemoryStore>);

impl StoreFixture for MemoryFixture {
    fn open(&self) -> Arc<dyn SessionStore> {
        self.0.clone()
    }
}

struct FileFixture(tempfile::TempDir);

impl StoreFixture for FileFixture {
    fn open(&self) -> Arc<dyn SessionStore> {
        Arc::new(FileStore::open(self.0.path()).expect("open file store"))
    }
}

#[test]
fn memory_store_conforms() {
    conformance::run_all(&|| Box::new(MemoryFixture(Arc::new(MemoryStore::new()))));
}

#[test]
fn file_store_conforms() {
    conformance::run_all(&|| Box::new(FileFixture(tempfile::tempdir().expect("tempdir"))));
}

/// The log store reopens the same directory on every `open()`; the
/// previous handle is dropped first (the engine has a single owner).
struct LogFixture {
    dir: tempfile::TempDir,
    current: std::sync::Mutex<Option<Arc<LogStore>>>,
}

impl StoreFixture for LogFixture {
    fn open(&self) -> Arc<dyn SessionStore> {
        let mut cur = self.current.lock().unwrap();
        if let Some(prev) = cur.take() {
            // Wait until every other holder let go, so the lock is free.
            let prev = Arc::try_unwrap(prev).expect("previous log store still shared");
            prev.close().expect("close log store");
        }
        let store = Arc::new(
            LogStore::open(self.dir.path(), LogStoreOptions::default()).expect("open log store"),
        );
        *cur = Some(store.clone());
        store
    }
}

#[test]
fn log_store_conforms() {
    conformance::run_all(&|| {
        Box::new(LogFixture {
            dir: tempfile::tempdir().expect("tempdir"),
            current: std::sync::Mutex::new(None),
        })
    });
}
