//! Erasing log GC through the log store: content a truncation superseded (in
//! appended entries and in a fork's seed) and a deleted session leave no byte
//! in the store directory; sessions read as before; older versions show
//! erased placeholders.

use crate::handle_support;

use handle_support::*;
use spool_runtime::store::log::is_erased_entry;
use spool_runtime::store::SessionStore;
use spool_runtime::transcript::{CancelToken, ContentBlock, EntryKind, Message};

fn files_containing(dir: &std::path::Path, needle: &str) -> Vec<std::path::PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if std::fs::read(&p)
                .unwrap()
                .windows(needle.len())
                .any(|w| w == needle.as_bytes())
            {
                hits.push(p);
            }
        }
    }
    hits
}

const TAIL: &str = "TAIL-0f-a-long-result";
const GONE: &str = "said-in-a-deleted-session";

fn long_result() -> EntryKind {
    let mut text = "head of the result\n".repeat(20);
    text.push_str(&"middle\n".repeat(2000));
    text.push_str(TAIL);
    EntryKind::Message {
        message: Message::ToolResult {
            tool_call_id: "c1".into(),
            tool_name: "read".into(),
            content: vec![ContentBlock::text(text)],
            is_error: false,
        },
    }
}

#[test]
fn gc_erases_truncated_content_and_deleted_sessions_from_every_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let h = writer(&rt, &id, 1 << 20);
    h.append_entries(vec![user("read it"), long_result(), user("thanks")])
        .unwrap();
    let appended_at = store.header(&id).unwrap().unwrap().version;
    drop(h);
    // A fork copies the long result into its seed (its `created` event).
    let fork = rt.fork(&id, None).unwrap().id().clone();
    for s in [&id, &fork] {
        let h = writer(&rt, s, 1 << 20);
        let done = h
            .truncate_tool_results(1000, &CancelToken::new())
            .unwrap()
            .expect("a result to cut");
        assert_eq!(done.rewritten.len(), 1);
    }
    let gone = new_session(&rt);
    let h = writer(&rt, &gone, 1 << 20);
    h.append(user(GONE)).unwrap();
    drop(h);
    rt.delete(&gone).unwrap();

    let before = full_transcript(&*store, &id);
    let fork_before = full_transcript(&*store, &fork);
    let versions = (
        store.header(&id).unwrap().unwrap().version,
        store.header(&fork).unwrap().unwrap().version,
    );
    assert!(!files_containing(dir.path(), TAIL).is_empty());
    assert!(!files_containing(dir.path(), GONE).is_empty());

    let plan = store.plan_gc().unwrap();
    assert!(plan.replaced_commits >= 2, "{plan:?}");
    assert_eq!(plan.streams_removed, vec![gone.to_string()]);
    let report = store.run_gc(plan).unwrap();
    assert!(report.index_wipe_pending);
    assert!(store.finish_erasure().unwrap());
    assert!(!store.finish_erasure().unwrap(), "done once");

    assert_eq!(
        files_containing(dir.path(), TAIL),
        Vec::<std::path::PathBuf>::new()
    );
    assert_eq!(
        files_containing(dir.path(), GONE),
        Vec::<std::path::PathBuf>::new()
    );
    assert_eq!(full_transcript(&*store, &id), before);
    assert_eq!(full_transcript(&*store, &fork), fork_before);
    assert_eq!(store.header(&id).unwrap().unwrap().version, versions.0);
    assert_eq!(store.header(&fork).unwrap().unwrap().version, versions.1);
    assert!(store.header(&gone).unwrap().is_none());
    // The version before the truncation shows the result as erased.
    let old = store.load_at(&id, Some(appended_at)).unwrap().unwrap();
    let t = &old.state().transcript;
    assert_eq!(t.len(), 3);
    assert_eq!(t.entries().iter().filter(|e| is_erased_entry(e)).count(), 1);
    let fork_old = store.load_at(&fork, Some(1)).unwrap().unwrap();
    assert_eq!(
        fork_old
            .state()
            .transcript
            .entries()
            .iter()
            .filter(|e| is_erased_entry(e))
            .count(),
        1
    );
    // The store takes writes on top.
    let h = writer(&rt, &id, 1 << 20);
    h.append(user("after the GC")).unwrap();
    drop(h);
    drop(rt);
    std::sync::Arc::try_unwrap(store).unwrap().close().unwrap();
    let r = spool_engine::verify(dir.path(), spool_engine::Options::default()).unwrap();
    assert!(r.ok, "{:?}", r.errors);
}

/// A whole-form rewrite supersedes every occurrence since the last state
/// clear; what a clear ended is history and stays.
#[test]
fn a_whole_rewrite_supersedes_everything_since_the_last_clear_only() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let mut s = store.load(&id).unwrap().unwrap();
    s.append(user("BEFORE-CLEAR-1")).unwrap();
    s.append(user("BEFORE-CLEAR-2")).unwrap();
    store.save(s).unwrap();
    let mut s = store.load(&id).unwrap().unwrap();
    s.clear_state().unwrap();
    let c = s.append(user("AFTER-CLEAR")).unwrap();
    store.save(s).unwrap();
    let mut s = store.load(&id).unwrap().unwrap();
    let mut entry = s.state().transcript.get(&c).unwrap().clone();
    entry.kind = user("REWRITTEN");
    s.rewrite_history(vec![entry], Some(c)).unwrap();
    let s = store.save(s).unwrap();
    let before = full_transcript(&*store, &id);

    let plan = store.plan_gc().unwrap();
    assert_eq!(plan.replaced_commits, 1, "{plan:?}");
    store.run_gc(plan).unwrap();
    store.finish_erasure().unwrap();
    let hits = |t: &str| !files_containing(dir.path(), t).is_empty();
    assert!(!hits("AFTER-CLEAR"));
    assert!(hits("REWRITTEN"));
    assert!(hits("BEFORE-CLEAR-1") && hits("BEFORE-CLEAR-2"));
    assert_eq!(full_transcript(&*store, &id), before);
    assert_eq!(store.load(&id).unwrap().unwrap().version(), s.version());
}

/// A session purged and created again: the purged incarnation's transcript
/// content is erased, the new incarnation reads as before.
#[test]
fn gc_erases_the_transcript_of_a_purged_incarnation() {
    use spool_runtime::session::AgentSession;
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let mut s = store.load(&id).unwrap().unwrap();
    s.append(user("FIRST-INCARNATION")).unwrap();
    store.save(s).unwrap();
    rt.delete(&id).unwrap();
    assert!(rt.purge(&id).unwrap());
    let again = AgentSession::new_with_id(id.clone(), Default::default(), None);
    store.create(again).unwrap();
    let mut s = store.load(&id).unwrap().unwrap();
    s.append(user("SECOND-INCARNATION")).unwrap();
    store.save(s).unwrap();
    let before = full_transcript(&*store, &id);
    let version = store.load(&id).unwrap().unwrap().version();

    let plan = store.plan_gc().unwrap();
    assert_eq!(plan.replaced_commits, 1, "{plan:?}");
    store.run_gc(plan).unwrap();
    store.finish_erasure().unwrap();
    assert_eq!(
        files_containing(dir.path(), "FIRST-INCARNATION"),
        Vec::<std::path::PathBuf>::new()
    );
    assert!(!files_containing(dir.path(), "SECOND-INCARNATION").is_empty());
    assert_eq!(full_transcript(&*store, &id), before);
    assert_eq!(store.load(&id).unwrap().unwrap().version(), version);
}

/// An embedding that runs GCs beside its readers: listings, headers and whole
/// loads on another thread never answer from the index while a GC rebuilds it
/// (a session missing, or at another version).
#[test]
fn reads_beside_gcs_on_another_thread_see_every_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let mut kept = Vec::new();
    for i in 0..4 {
        let id = new_session(&rt);
        let h = writer(&rt, &id, 1 << 20);
        h.append_entries(vec![
            user(format!("question {i}")),
            user(format!("more {i}")),
        ])
        .unwrap();
        drop(h);
        let version = store.header(&id).unwrap().unwrap().version;
        kept.push((id.clone(), version, full_transcript(&*store, &id)));
    }
    let rt = std::sync::Arc::new(rt);
    let gc = {
        let (rt, store) = (rt.clone(), store.clone());
        std::thread::spawn(move || {
            for round in 0..25 {
                let gone = new_session(&rt);
                let h = writer(&rt, &gone, 1 << 20);
                h.append(user(format!("{GONE} {round}"))).unwrap();
                drop(h);
                rt.delete(&gone).unwrap();
                let plan = store.plan_gc().unwrap();
                store.run_gc(plan).unwrap();
            }
        })
    };
    let mut probes = 0u64;
    loop {
        let running = !gc.is_finished();
        let listed = store
            .list_headers(&spool_runtime::store::ListQuery::default())
            .unwrap();
        for (id, version, transcript) in &kept {
            let found = listed.headers.iter().find(|h| &h.id == id);
            assert_eq!(
                found.map(|h| h.version),
                Some(*version),
                "list, probe {probes}"
            );
            let header = store.header(id).unwrap().map(|h| h.version);
            assert_eq!(header, Some(*version), "header, probe {probes}");
            assert_eq!(
                &full_transcript(&*store, id),
                transcript,
                "load, probe {probes}"
            );
        }
        probes += 1;
        if !running {
            break;
        }
    }
    gc.join().unwrap();
    assert!(probes > 1);
}
