//! Helpers shared by the transcript index's unit tests: stores, sessions
//! and a checker of the active-path keys against the loaded transcript.

use std::sync::Arc;

use spool_engine::Index;

use super::keys::TRANSCRIPT_INDEXER;
use super::keys::{child_prefix, count_key, sk, TAG_PATH};
use super::path_blocks::{
    block_links, decode_path_link, path_block_key, path_slot, path_value, PATH_BLOCK_DEPTHS,
};
use super::record::EntryRecord;
use super::source::LogTranscriptSource;
use super::source::{entry_records, read_meta};
use crate::handle::{HandleOptions, SessionHandle};
use crate::hooks::SessionHookStack;
use crate::observer::NullSink;
use crate::session::AgentDefinition;
use crate::session::{SessionEvent, SessionId};
use crate::store::log::common::SESSION_EVENT_PREFIX;
use crate::store::TranscriptBackend;
use crate::store::{LogStore, LogStoreOptions, SessionStore};
use crate::transcript::{entry_size, EntryId, EntryKind, EntrySource};
use crate::transcript::{ContentBlock, Message};
use crate::SessionRuntime;

pub(super) fn session_event(ev: &SessionEvent) -> spool_engine::EventData {
    spool_engine::EventData::new(
        format!("{SESSION_EVENT_PREFIX}{}", ev.kind()),
        crate::session::encode_event(ev).unwrap(),
    )
}

/// An entry's record as the index resolves it (its `e` key or its
/// seed table record).
pub(super) fn stored_record(index: &Index, sid: &SessionId, e: &EntryId) -> EntryRecord {
    let (_, b) = entry_records(index, sid)
        .unwrap()
        .into_iter()
        .find(|(id, _)| id == e)
        .unwrap_or_else(|| panic!("no record of {e}"));
    EntryRecord::decode(&b).unwrap()
}

/// The child count and only child an entry's index record holds.
pub(super) fn record_count(
    store: &LogStore,
    id: &SessionId,
    e: &EntryId,
) -> (u64, Option<EntryId>) {
    let src = LogTranscriptSource::new(store.engine().unwrap(), id.clone());
    let r = src.record(e).unwrap().unwrap();
    (r.children, r.only_child)
}

/// The per-entry keys of one tag of a session.
pub(super) fn tag_keys(store: &LogStore, id: &SessionId, tag: u8) -> Vec<Vec<u8>> {
    store
        .engine()
        .unwrap()
        .index()
        .scan_prefix(TRANSCRIPT_INDEXER, &sk(tag, id.as_str()))
        .map(|kv| kv.unwrap().0)
        .collect()
}

pub(super) fn append_n(h: &SessionHandle, n: usize, tag: &str) -> Vec<EntryId> {
    (0..n)
        .map(|i| h.append(user(&format!("{tag}{i}"))).unwrap())
        .collect()
}

/// The active-path keys agree with the fully loaded transcript's
/// current path: exactly its depths exist, `ancestor_at_depth` answers
/// from the leaf and from a mid-path entry, and an off-path entry gets
/// no answer (the caller walks).
pub(super) fn check_path(store: &LogStore, id: &SessionId) -> Vec<EntryId> {
    let t = store.load(id).unwrap().unwrap().state().transcript.clone();
    let path: Vec<EntryId> = t
        .current_path()
        .unwrap()
        .into_iter()
        .map(|e| e.id.clone())
        .collect();
    let engine = store.engine().unwrap();
    let meta = read_meta(engine.index(), id).unwrap().unwrap();
    assert_eq!(meta.path_len, path.len() as u64, "path_len of {id}");
    let keys = engine
        .index()
        .scan_prefix(TRANSCRIPT_INDEXER, &sk(TAG_PATH, id.as_str()))
        .count();
    assert_eq!(
        keys as u64,
        (path.len() as u64).div_ceil(PATH_BLOCK_DEPTHS),
        "active-path blocks of {id}"
    );
    // Child links: the count in every entry's record (an entry with a
    // record has no `n` key) and its children are the transcript's,
    // and `c` keys exist only for a parent with two or more children
    // (a single child is named by the record alone).
    let src = store.source(id).unwrap();
    for e in t.entries() {
        let mut want = t.children_ids(&e.id);
        let got = src.children(&e.id, usize::MAX).unwrap();
        assert_eq!(got.total, want.len() as u64, "child count of {}", e.id);
        let mut got = got.ids;
        got.sort();
        want.sort();
        assert_eq!(got, want, "children of {}", e.id);
        let links = engine
            .index()
            .scan_prefix(TRANSCRIPT_INDEXER, &child_prefix(id.as_str(), &e.id))
            .count();
        let expect = if want.len() >= 2 { want.len() } else { 0 };
        assert_eq!(links, expect, "child links of {}", e.id);
        let r = stored_record(engine.index(), id, &e.id);
        let only = match t.children_ids(&e.id).as_slice() {
            [one] => Some(one.clone()),
            _ => None,
        };
        assert_eq!(
            (r.children, r.only_child),
            (want.len() as u64, only),
            "count in the record of {}",
            e.id
        );
        assert_eq!(
            engine
                .index()
                .get(TRANSCRIPT_INDEXER, &count_key(id.as_str(), &e.id))
                .unwrap(),
            None,
            "`n` key of {}",
            e.id
        );
    }
    // Every path link names the entry at its depth with the log
    // position and size of its current index record.
    for (d, e) in path.iter().enumerate() {
        let (block, slot) = path_slot(d as u64);
        let value = engine
            .index()
            .get(TRANSCRIPT_INDEXER, &path_block_key(id.as_str(), block))
            .unwrap()
            .unwrap();
        let links: Vec<&[u8]> = block_links(&value).map(Result::unwrap).collect();
        // Exactly the path's depths: full blocks, then the rest.
        let held = (path.len() as u64 - block * PATH_BLOCK_DEPTHS).min(PATH_BLOCK_DEPTHS);
        assert_eq!(links.len() as u64, held, "links of block {block}");
        let v = links[slot];
        let link = decode_path_link(v).unwrap();
        let r = stored_record(engine.index(), id, e);
        assert_eq!(&link.id, e, "depth {d}");
        assert_eq!(link.key, (r.position(), r.event, r.sub), "{e} at {d}");
        assert_eq!(link.size, r.size, "size of {e}");
        assert_eq!(v, path_value(e, &r).as_slice());
    }
    // Ranges of the path, read from the path links, give the entries
    // (payload and parent) the loaded transcript has.
    for (start, end) in [(0, 0), (0, 63), (1, 64), (30, 70), (63, 64), (5, 140)] {
        let Some(leaf) = path.last() else { break };
        let leaf_depth = path.len() as u64 - 1;
        let end = end.min(leaf_depth);
        if start > end {
            continue;
        }
        let src = store.source(id).unwrap();
        let got = src
            .path_range(leaf, leaf_depth, start, end, u64::MAX)
            .unwrap()
            .unwrap();
        let want: Vec<(EntryId, u64)> = path[start as usize..=end as usize]
            .iter()
            .map(|i| (i.clone(), entry_size(t.get(i).unwrap())))
            .collect();
        assert_eq!(got, want, "range {start}..={end}");
        // With a byte bound: the prefix up to the first entry that takes
        // the sum past it.
        for bytes_max in [0, 1, want[0].1, want.iter().map(|w| w.1).sum::<u64>() / 2] {
            let bounded = src
                .path_range(leaf, leaf_depth, start, end, bytes_max)
                .unwrap()
                .unwrap();
            let mut sum = 0u64;
            let n = want
                .iter()
                .position(|w| {
                    sum += w.1;
                    sum > bytes_max
                })
                .map_or(want.len(), |i| i + 1);
            assert_eq!(bounded, want[..n], "range {start}..={end} in {bytes_max}");
        }
        let got = src
            .path_range(leaf, leaf_depth, start, end, u64::MAX)
            .unwrap()
            .unwrap();
        for (i, _) in &got {
            assert_eq!(src.entry(i).unwrap().as_deref(), t.get(i), "{i}");
        }
    }
    let src = store.source(id).unwrap();
    if let Some(leaf) = path.last() {
        for (d, want) in path.iter().enumerate() {
            let got = src.ancestor_at_depth(leaf, d as u64).unwrap();
            assert_eq!(got.as_ref(), Some(want), "depth {d} from the leaf");
        }
        assert_eq!(
            src.ancestor_at_depth(leaf, path.len() as u64).unwrap(),
            None
        );
        let mid = &path[path.len() / 2];
        assert_eq!(
            src.ancestor_at_depth(mid, 0).unwrap().as_ref(),
            path.first()
        );
        assert_eq!(
            src.ancestor_at_depth(mid, path.len() as u64 / 2 + 1)
                .unwrap(),
            None
        );
    }
    for e in t.entries() {
        if !path.contains(&e.id) {
            assert_eq!(src.ancestor_at_depth(&e.id, 0).unwrap(), None, "{}", e.id);
        }
        // Child links (the count names an only child) agree with the
        // loaded transcript, with and without a limit.
        for limit in [0, 1, 64] {
            assert_eq!(
                src.children(&e.id, limit).unwrap(),
                EntrySource::children(&t, &e.id, limit).unwrap(),
                "children of {} (limit {limit})",
                e.id
            );
        }
    }
    path
}

pub(super) fn user(text: &str) -> EntryKind {
    EntryKind::Message {
        message: Message::User {
            content: vec![ContentBlock::text(text)],
        },
    }
}

pub(super) fn open(dir: &std::path::Path) -> (Arc<LogStore>, SessionRuntime) {
    let store = Arc::new(
        LogStore::open(
            dir,
            LogStoreOptions {
                durability: spool_engine::Durability::Buffered,
                ..LogStoreOptions::default()
            },
        )
        .unwrap(),
    );
    let rt = SessionRuntime::new(store.clone(), Arc::new(NullSink), SessionHookStack::empty());
    (store, rt)
}

/// A `created` event whose initial state holds `transcript` (a seed
/// written straight to the engine, as a fork or an import would).
pub(super) fn seeded_created(
    sid: &SessionId,
    transcript: crate::transcript::Transcript,
) -> SessionEvent {
    SessionEvent::Created {
        id: sid.clone(),
        parent_id: None,
        agent_name: "a".into(),
        label: "a".into(),
        created_at_ms: 1,
        definition: Box::new(AgentDefinition::new("a", "seed test", "")),
        state: Box::new(crate::session::AgentState {
            transcript,
            ..Default::default()
        }),
    }
}

/// A new empty session and a writer handle on it.
pub(super) fn writer_session(rt: &SessionRuntime) -> (SessionId, SessionHandle) {
    let id = rt
        .create(AgentDefinition::default(), None)
        .unwrap()
        .id()
        .clone();
    let h = rt.open_handle(&id, HandleOptions::writer()).unwrap();
    (id, h)
}
