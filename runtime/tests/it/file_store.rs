//! JSON file store specifics: corrupt files, layout, locks, permissions.

use crate::common;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use spool_runtime::observer::RecordingSink;
use spool_runtime::session::{AgentSession, SessionId};
use spool_runtime::store::{FileStore, FileStoreOptions, ListQuery, SessionStore, StoreError};
use spool_runtime::{RuntimeError, SessionRuntime};

fn store() -> (tempfile::TempDir, FileStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path().join("sessions")).unwrap();
    (dir, store)
}

fn created(store: &FileStore) -> AgentSession {
    store
        .create(AgentSession::new(definition("a"), None))
        .unwrap()
}

#[test]
fn corrupt_json_is_invalid_session_file_with_path_and_reason() {
    let (_d, store) = store();
    let s = created(&store);
    let path = store.session_path(s.id());
    fs::write(&path, b"{\"format\":1,\"header\":{ this is not json").unwrap();
    match store.load(s.id()) {
        Err(StoreError::InvalidSessionFile { path: p, reason }) => {
            assert_eq!(p, path);
            assert!(!reason.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        store.header(s.id()),
        Err(StoreError::InvalidSessionFile { .. })
    ));
    // The error message names the file.
    let msg = store.load(s.id()).unwrap_err().to_string();
    assert!(msg.contains(&path.display().to_string()), "{msg}");
}

#[test]
fn missing_header_fields_are_invalid() {
    let (_d, store) = store();
    let s = created(&store);
    let path = store.session_path(s.id());
    let doc = format!(
        "{{\"format\":1,\"header\":{{\"id\":\"{}\",\"status\":\"active\"}},\n\"definition\":{{}},\"state\":{{}}}}\n",
        s.id()
    );
    fs::write(&path, doc).unwrap();
    for r in [
        store.load(s.id()).map(|_| ()),
        store.header(s.id()).map(|_| ()),
    ] {
        match r {
            Err(StoreError::InvalidSessionFile { reason, .. }) => {
                assert!(reason.contains("missing field"), "{reason}")
            }
            other => panic!("{other:?}"),
        }
    }
    // No header at all.
    fs::write(&path, b"{\"format\":1,\"definition\":{},\"state\":{}}").unwrap();
    assert!(matches!(
        store.load(s.id()),
        Err(StoreError::InvalidSessionFile { .. })
    ));
}

#[test]
fn header_id_must_match_the_file_name() {
    let (_d, store) = store();
    let a = created(&store);
    let b = created(&store);
    fs::copy(store.session_path(a.id()), store.session_path(b.id())).unwrap();
    match store.load(b.id()) {
        Err(StoreError::InvalidSessionFile { reason, .. }) => {
            assert!(reason.contains("does not match"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn unsupported_format_is_refused() {
    let (_d, store) = store();
    let s = created(&store);
    let path = store.session_path(s.id());
    let doc = fs::read_to_string(&path)
        .unwrap()
        .replacen("\"format\":1", "\"format\":99", 1);
    fs::write(&path, doc).unwrap();
    match store.load(s.id()) {
        Err(StoreError::InvalidSessionFile { reason, .. }) => assert!(reason.contains("99")),
        other => panic!("{other:?}"),
    }
}

#[test]
fn duplicate_create_and_missing_session_save() {
    let (_d, store) = store();
    let fresh = AgentSession::new(definition("a"), None);
    store.create(fresh.clone()).unwrap();
    assert!(matches!(
        store.create(fresh),
        Err(StoreError::Conflict {
            expected: 0,
            actual: 1,
            ..
        })
    ));
    let never = AgentSession::new(definition("a"), None);
    assert!(matches!(
        store.save(never),
        Err(StoreError::NotFound { .. })
    ));
}

#[test]
fn listing_skips_and_reports_corrupt_files() {
    let (_d, store) = store();
    let good = created(&store);
    let bad = created(&store);
    fs::write(store.session_path(bad.id()), b"garbage").unwrap();
    fs::write(store.dir().join("not a valid id.json"), b"{}").unwrap();
    fs::write(store.dir().join("notes.txt"), b"ignored").unwrap();
    let list = store.list_headers(&ListQuery::all()).unwrap();
    assert_eq!(list.ids(), vec![good.id().clone()]);
    assert_eq!(list.skipped.len(), 2, "{:?}", list.skipped);
    assert!(list
        .skipped
        .iter()
        .any(|s| s.location.ends_with(&format!("{}.json", bad.id()))));

    // Through the runtime too.
    let rt = SessionRuntime::new(
        Arc::new(FileStore::open(store.dir()).unwrap()),
        Arc::new(RecordingSink::new()),
        Default::default(),
    );
    let l = rt.list_sessions(&ListQuery::all()).unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(l.skipped.len(), 2);
    // Executing on the corrupt one reports a load failure.
    let err = rt
        .execute(bad.id(), &spool_runtime::actions::SuspendSession)
        .unwrap_err();
    assert!(matches!(
        err,
        RuntimeError::Store(StoreError::InvalidSessionFile { .. })
    ));
}

#[test]
fn files_are_single_json_documents_with_a_header_first_line() {
    let (_d, store) = store();
    let s = created(&store);
    let text = fs::read_to_string(store.session_path(s.id())).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(doc["header"]["version"], serde_json::json!(1));
    assert_eq!(doc["header"]["id"], serde_json::json!(s.id().as_str()));
    let first = text.lines().next().unwrap();
    assert!(first.starts_with("{\"format\":1,\"header\":{"), "{first}");
    assert_eq!(text.lines().count(), 2);
}

#[test]
fn a_pretty_printed_file_still_reads() {
    let (_d, store) = store();
    let s = created(&store);
    let path = store.session_path(s.id());
    let doc: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    fs::write(&path, serde_json::to_string_pretty(&doc).unwrap()).unwrap();
    assert_eq!(store.header(s.id()).unwrap().as_ref(), Some(s.info()));
    assert_eq!(store.load(s.id()).unwrap().unwrap(), s);
    // And saving rewrites it in the standard layout.
    let saved = store.save(s).unwrap();
    assert_eq!(saved.version(), 2);
    assert_eq!(fs::read_to_string(&path).unwrap().lines().count(), 2);
}

#[test]
fn directory_and_files_are_owner_only() {
    let (_d, store) = store();
    let s = created(&store);
    let mode = |p: &std::path::Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(store.dir()), 0o700);
    assert_eq!(mode(&store.session_path(s.id())), 0o600);
    assert_eq!(mode(&store.dir().join(format!("{}.lock", s.id()))), 0o600);
}

#[test]
fn no_temp_files_are_left_behind() {
    let (_d, store) = store();
    let mut s = created(&store);
    for i in 0..5 {
        s.write_metadata("i", serde_json::json!(i)).unwrap();
        s = store.save(s).unwrap();
    }
    let names: Vec<String> = fs::read_dir(store.dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert!(names.iter().all(|n| !n.contains("tmp")), "{names:?}");
}

#[test]
fn a_held_lock_times_out_with_lock_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open_with(
        dir.path(),
        FileStoreOptions {
            lock_timeout: Duration::from_millis(50),
            fsync: true,
        },
    )
    .unwrap();
    let s = created(&store);
    let lock_path = dir.path().join(format!("{}.lock", s.id()));
    let holder = fs::File::open(&lock_path).unwrap();
    holder.lock().unwrap();
    match store.save(s.clone()) {
        Err(StoreError::LockTimeout { path, .. }) => assert_eq!(path, lock_path),
        other => panic!("{other:?}"),
    }
    holder.unlock().unwrap();
    assert_eq!(store.save(s).unwrap().version(), 2);
}

#[test]
fn ids_are_never_used_unchecked_as_paths() {
    for bad in ["../escape", "a/b", ".hidden", "x.json"] {
        assert!(SessionId::parse(bad).is_err(), "{bad}");
    }
    // A header carrying a hostile id does not deserialize.
    let (_d, store) = store();
    let s = created(&store);
    let path = store.session_path(s.id());
    let doc = fs::read_to_string(&path)
        .unwrap()
        .replacen(s.id().as_str(), "../../etc/passwd", 1);
    fs::write(&path, doc).unwrap();
    assert!(matches!(
        store.header(s.id()),
        Err(StoreError::InvalidSessionFile { .. })
    ));
}
