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

/// Deleting the log store's derived indexes (`DIR/index/`) and reopening
/// rebuilds them from the log: identical listings and sessions.
#[test]
fn log_store_index_deletion_gives_identical_answers() {
    use spool_runtime::session::{AgentDefinition, AgentSession, SessionStatus};
    use spool_runtime::transcript::{ContentBlock, EntryKind, Message};
    use spool_runtime::ListQuery;

    let dir = tempfile::tempdir().unwrap();
    let queries = [
        ListQuery::all().including_deleted(),
        ListQuery::all().with_status(SessionStatus::Suspended),
        ListQuery::all().with_agent("b"),
    ];
    let (listings, sessions) = {
        let store = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
        let mut ids = Vec::new();
        for i in 0..30 {
            let agent = if i % 2 == 0 { "a" } else { "b" };
            let mut s = AgentSession::new(AgentDefinition::new(agent, "d", "p"), None);
            s.append(EntryKind::Message {
                message: Message::User {
                    content: vec![ContentBlock::text(format!("m{i}"))],
                },
            })
            .unwrap();
            let mut s = store.create(s).unwrap();
            if i % 3 == 0 {
                s.set_status(SessionStatus::Suspended).unwrap();
                s = store.save(s).unwrap();
            }
            if i % 7 == 0 {
                let fork = s.fork(None).unwrap();
                ids.push(store.create(fork).unwrap().id().clone());
            }
            ids.push(s.id().clone());
        }
        store.delete(&ids[1]).unwrap();
        let listings: Vec<_> = queries
            .iter()
            .map(|q| store.list_headers(q).unwrap())
            .collect();
        let sessions: Vec<_> = ids.iter().map(|id| store.load(id).unwrap()).collect();
        store.close().unwrap();
        (listings, sessions)
    };
    std::fs::remove_dir_all(dir.path().join("index")).unwrap();
    // From the log alone: without the checkpoints too.
    let _ = std::fs::remove_dir_all(dir.path().join("checkpoints"));
    let store = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    for (q, before) in queries.iter().zip(&listings) {
        assert_eq!(&store.list_headers(q).unwrap(), before, "{q:?}");
    }
    for s in sessions.iter().flatten() {
        assert_eq!(store.load(s.id()).unwrap().as_ref(), Some(s));
    }
}

/// A read-only open of a log store with a checkpoint (written by the owner's close)
/// and a tail after it lists sessions and loads them (headers and transcripts)
/// exactly as a read-only open that rebuilds every index from the whole log.
#[test]
fn log_store_read_only_from_a_checkpoint_gives_identical_answers() {
    use spool_runtime::session::{AgentDefinition, AgentSession, SessionStatus};
    use spool_runtime::transcript::{ContentBlock, EntryKind, Message};
    use spool_runtime::ListQuery;

    fn add(store: &LogStore, i: usize, ids: &mut Vec<spool_runtime::session::SessionId>) {
        let agent = if i.is_multiple_of(2) { "a" } else { "b" };
        let mut s = AgentSession::new(AgentDefinition::new(agent, "d", "p"), None);
        for j in 0..(1 + i % 4) {
            s.append(EntryKind::Message {
                message: Message::User {
                    content: vec![ContentBlock::text(format!("m{i}.{j}"))],
                },
            })
            .unwrap();
        }
        let mut s = store.create(s).unwrap();
        if i.is_multiple_of(3) {
            s.set_status(SessionStatus::Suspended).unwrap();
            s = store.save(s).unwrap();
        }
        if i.is_multiple_of(7) {
            let fork = s.fork(None).unwrap();
            ids.push(store.create(fork).unwrap().id().clone());
        }
        ids.push(s.id().clone());
    }

    let dir = tempfile::tempdir().unwrap();
    let mut ids = Vec::new();
    let store = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    for i in 0..40 {
        add(&store, i, &mut ids);
    }
    store.delete(&ids[1]).unwrap();
    store.close().unwrap();
    // A tail after the checkpoint, beside the live owner.
    let owner = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    for i in 40..47 {
        add(&owner, i, &mut ids);
    }
    owner.delete(&ids[2]).unwrap();

    let queries = [
        ListQuery::all().including_deleted(),
        ListQuery::all().with_status(SessionStatus::Suspended),
        ListQuery::all().with_agent("b").limit(5),
    ];
    let answers = |store: &LogStore| {
        let listings: Vec<_> = queries
            .iter()
            .map(|q| store.list_headers(q).unwrap())
            .collect();
        let sessions: Vec<_> = ids.iter().map(|id| store.load(id).unwrap()).collect();
        (listings, sessions)
    };
    let ro = LogStore::open_read_only(dir.path()).unwrap();
    let stats = ro.engine().unwrap().stats();
    assert!(stats.open_checkpoint_seq.is_some(), "{stats:?}");
    assert!(stats.open_records_decoded < stats.last_seq, "{stats:?}");
    let from_checkpoint = answers(&ro);

    let copy = tempfile::tempdir().unwrap();
    for e in std::fs::read_dir(dir.path()).unwrap() {
        let e = e.unwrap();
        if e.file_type().unwrap().is_file() && e.file_name() != "LOCK" {
            std::fs::copy(e.path(), copy.path().join(e.file_name())).unwrap();
        }
    }
    let full = LogStore::open_read_only(copy.path()).unwrap();
    assert_eq!(full.engine().unwrap().stats().open_checkpoint_seq, None);
    assert_eq!(from_checkpoint, answers(&full));
    assert_eq!(from_checkpoint, answers(&owner));
    // Every session but the two deleted ones loads.
    let loaded = from_checkpoint.1.iter().filter(|s| s.is_some()).count();
    assert_eq!(loaded, ids.len() - 2);
}
