//! The store conformance suite against the memory and JSON file stores.

use std::sync::Arc;

use spool_runtime::store::conformance::{self, StoreFixture};
use spool_runtime::store::{FileStore, MemoryStore, SessionStore};

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
