//! Listing 10,000 sessions loads no session state (the `full_loads`
//! counter stays 0), for the memory, file and log stores.

use crate::common;

use std::sync::Arc;

use common::*;
use spool_runtime::observer::NullSink;
use spool_runtime::session::{AgentSession, SessionStatus};
use spool_runtime::store::{
    FileStore, FileStoreOptions, ListOrder, ListQuery, MemoryStore, SessionStore, SortDirection,
};
use spool_runtime::transcript::{ContentBlock, EntryKind, Message};
use spool_runtime::SessionRuntime;

const SESSIONS: usize = 10_000;

fn fill(store: &dyn SessionStore) {
    for i in 0..SESSIONS {
        let agent = ["planner", "coder", "reviewer"][i % 3];
        let mut s = AgentSession::new(definition(agent), None);
        // Some state, so a full load would be visible work.
        s.append(EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(format!("message {i}"))],
            },
        })
        .unwrap();
        if i % 10 == 0 {
            s.set_status(SessionStatus::Suspended).unwrap();
        }
        store.create(s).unwrap();
    }
}

fn check(store: Arc<dyn SessionStore>) {
    let rt = SessionRuntime::new(store.clone(), Arc::new(NullSink), Default::default());
    let before = store.stats().full_loads;
    let all = rt
        .list_sessions(&ListQuery::all().order_by(ListOrder::CreatedAt, SortDirection::Ascending))
        .unwrap();
    assert_eq!(all.total as usize, SESSIONS);
    assert_eq!(all.len(), SESSIONS);
    let suspended = rt
        .list_sessions(&ListQuery::all().with_status(SessionStatus::Suspended))
        .unwrap();
    assert_eq!(suspended.total as usize, SESSIONS / 10);
    let page = rt
        .list_sessions(&ListQuery::all().with_agent("coder").limit(50))
        .unwrap();
    assert_eq!(page.len(), 50);
    assert!(page.next_cursor.is_some());
    for h in page.iter().take(10) {
        assert_eq!(&rt.session_info(&h.id).unwrap(), h);
    }
    let loads = store.stats().full_loads - before;
    eprintln!("listed {SESSIONS} sessions 3 times + 10 headers: {loads} full loads");
    assert_eq!(loads, 0, "listing must not load session state");
    // The counter does move on a real load (so the check above can fail).
    rt.get_session(&page.headers[0].id).unwrap();
    assert_eq!(store.stats().full_loads - before, 1);
}

#[test]
fn listing_ten_thousand_sessions_memory_loads_no_state() {
    let store = Arc::new(MemoryStore::new());
    fill(store.as_ref());
    check(store);
}

#[test]
fn listing_ten_thousand_sessions_file_loads_no_state() {
    let dir = tempfile::tempdir().unwrap();
    // fsync off: this test is about reads; durability is tested elsewhere.
    let store = Arc::new(
        FileStore::open_with(
            dir.path(),
            FileStoreOptions {
                fsync: false,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    fill(store.as_ref());
    check(store);
}

#[test]
fn listing_ten_thousand_sessions_log_loads_no_state() {
    let dir = tempfile::tempdir().unwrap();
    // Buffered: this test is about reads; durability is tested elsewhere.
    let store = Arc::new(
        spool_runtime::store::LogStore::open(
            dir.path(),
            spool_runtime::store::LogStoreOptions {
                durability: spool_engine::Durability::Buffered,
                ..Default::default()
            },
        )
        .unwrap(),
    );
    fill(store.as_ref());
    check(store);
}
