//! The log store's transcript index of a seed transcript (the transcript
//! inside a `created` event, as a fork writes it) is indexed in one pass
//! in memory; it must leave exactly the keys and values that indexing the
//! same entries one by one leaves (what a whole-transcript rewrite does).
//!
//! Each case writes two streams with raw engine commits: one whose
//! `created` event holds the transcript, one created empty and then given
//! the same entries and leaf by a `history_rewritten` event. Raw commits
//! (not the session fold) let the entry lists hold what only damaged or
//! imported data holds: duplicate ids, parents that come later or are
//! missing, parent cycles. The two indexes must agree key for key, except
//! for the log position inside each entry record and active-path link,
//! and for where the entry records live: a seed's go into the seed table
//! (`E` keys), the rewrite's into `e` keys, so records are compared as
//! the index resolves them, id by id.

use std::collections::BTreeMap;

use proptest::prelude::*;
use spool_engine::{EventData, ExpectedVersion, NewCommit};
use spool_runtime::session::{encode_event, AgentDefinition, AgentState, SessionEvent, SessionId};
use spool_runtime::store::log::{SESSION_EVENT_PREFIX, SESSION_INDEXER};
use spool_runtime::store::{LogStore, LogStoreOptions};
use spool_runtime::test_hooks::{
    entry_records, EntryRecord, SessionIndexer, TranscriptIndexer, TRANSCRIPT_INDEXER,
};
use spool_runtime::transcript::{ContentBlock, Entry, EntryId, EntryKind, Message, Transcript};

/// Per-entry key tags of the transcript index read key by key: everything
/// but the meta and the entry records (`e`, and the seed table `E`), which
/// are read as the index resolves them.
const TAGS: &[u8] = b"cntTalp";

fn eid(n: usize) -> EntryId {
    EntryId::parse(&format!("e{n}")).unwrap()
}

fn event(ev: &SessionEvent) -> EventData {
    EventData::new(
        format!("{SESSION_EVENT_PREFIX}{}", ev.kind()),
        encode_event(ev).unwrap(),
    )
}

fn created(id: &SessionId, state: AgentState) -> SessionEvent {
    SessionEvent::Created {
        id: id.clone(),
        parent_id: None,
        agent_name: "a".into(),
        label: "a".into(),
        created_at_ms: 1,
        definition: Box::new(AgentDefinition::new("a", "seed test", "")),
        state: Box::new(state),
    }
}

fn commit(store: &LogStore, id: &SessionId, expected: ExpectedVersion, events: Vec<EventData>) {
    commit_to(&store.engine().unwrap(), id, expected, events);
}

fn commit_to(
    engine: &spool_engine::Store,
    id: &SessionId,
    expected: ExpectedVersion,
    events: Vec<EventData>,
) {
    engine
        .append(NewCommit {
            stream: id.as_str().to_string(),
            expected,
            commit_id: spool_engine::Uuid::new_v4(),
            events,
        })
        .unwrap();
}

/// Every per-entry key of a session (without the tag's session prefix)
/// and its value; entry records and active-path values with their log
/// position cleared.
fn dump(store: &LogStore, id: &SessionId) -> BTreeMap<(u8, Vec<u8>), Vec<u8>> {
    let engine = store.engine().unwrap();
    let mut out = BTreeMap::new();
    for (eid, v) in entry_records(engine.index(), id).unwrap() {
        let mut r = EntryRecord::decode(&v).unwrap();
        (r.segment, r.offset, r.event, r.sub) = (0, 0, 0, 0);
        out.insert(
            (b'e', eid.as_str().as_bytes().to_vec()),
            format!("{r:?}").into_bytes(),
        );
    }
    for &tag in TAGS {
        let mut prefix = vec![tag, id.as_str().len() as u8];
        prefix.extend_from_slice(id.as_str().as_bytes());
        for kv in engine.index().scan_prefix(TRANSCRIPT_INDEXER, &prefix) {
            let (k, v) = kv.unwrap();
            let rest = k[prefix.len()..].to_vec();
            let v = if tag == b'p' {
                // An active-path block is its depths' links, each after a
                // u16 BE length; a link starts with the entry's log
                // position (u64 segment, u64 offset, u32 event, u32 index).
                let mut v = v;
                let mut at = 0;
                while at + 2 <= v.len() {
                    let n = usize::from(u16::from_be_bytes([v[at], v[at + 1]]));
                    v[at + 2..at + 2 + 24].fill(0);
                    at += 2 + n;
                }
                assert_eq!(at, v.len(), "block value of {:?}", k);
                v
            } else {
                v
            };
            out.insert((tag, rest), v);
        }
    }
    out
}

/// Indexes `entries` (and `leaf`) both ways and compares.
fn check(entries: Vec<Entry>, leaf: Option<EntryId>) {
    check_then(entries, leaf, Vec::new());
}

/// Indexes `entries` (and `leaf`) both ways, compares, then commits each
/// of `then` to both sessions and compares after each: records in the
/// seed table must change (an `e` key over them) and go (a tombstone)
/// exactly as records in `e` keys do.
fn check_then(entries: Vec<Entry>, leaf: Option<EntryId>, then: Vec<SessionEvent>) {
    let dir = tempfile::tempdir().unwrap();
    let store = LogStore::open(dir.path(), LogStoreOptions::default()).unwrap();
    let seeded = SessionId::parse("seeded").unwrap();
    let rewritten = SessionId::parse("rewritten").unwrap();

    let mut transcript = Transcript::new();
    transcript.replace_all(entries.clone(), leaf.clone());
    let state = AgentState {
        transcript,
        ..AgentState::default()
    };
    commit(
        &store,
        &seeded,
        ExpectedVersion::NoStream,
        vec![event(&created(&seeded, state))],
    );

    commit(
        &store,
        &rewritten,
        ExpectedVersion::NoStream,
        vec![event(&created(&rewritten, AgentState::default()))],
    );
    commit(
        &store,
        &rewritten,
        ExpectedVersion::Exact(1),
        vec![event(&SessionEvent::HistoryRewritten {
            generation: 1,
            entries,
            leaf,
        })],
    );

    let (a, b) = (dump(&store, &seeded), dump(&store, &rewritten));
    assert_eq!(a, b);
    for (i, ev) in then.iter().enumerate() {
        let v = i as u64;
        commit(
            &store,
            &seeded,
            ExpectedVersion::Exact(1 + v),
            vec![event(ev)],
        );
        commit(
            &store,
            &rewritten,
            ExpectedVersion::Exact(2 + v),
            vec![event(ev)],
        );
        let (a, b) = (dump(&store, &seeded), dump(&store, &rewritten));
        assert_eq!(a, b, "after event {i}: {ev:?}");
    }
}

fn text(s: &str) -> EntryKind {
    EntryKind::Message {
        message: Message::User {
            content: vec![ContentBlock::text(s)],
        },
    }
}

/// The kind of entry `i` from a selector and a target among the ids.
fn kind(sel: u8, target: usize) -> EntryKind {
    match sel % 9 {
        0 | 1 => text(&format!("message {target}\n  with   spaces")),
        2 => EntryKind::Custom {
            custom_type: ["plan", "todo"][target % 2].into(),
            data: serde_json::json!({ "n": target }).into(),
        },
        3 => EntryKind::CustomMessage {
            custom_type: "tool_output".into(),
            content: vec![ContentBlock::text("x".repeat(target % 200))],
            display: true,
            details: None,
        },
        4 => EntryKind::Label {
            target_id: eid(target),
            label: (!target.is_multiple_of(3)).then(|| format!("label {target}")),
        },
        5 => EntryKind::Compaction {
            summary: "compacted".into(),
            first_kept_entry_id: eid(target),
            tokens_before: 10,
        },
        6 => EntryKind::Reset,
        7 => EntryKind::ModelChange {
            provider: "p".into(),
            model_id: format!("m{target}"),
        },
        _ => EntryKind::ThinkingLevelChange {
            thinking_level: "high".into(),
        },
    }
}

/// A chain of `n` entries `e0 → e1 → …`, entry `i` of kind `kind_of(i)`.
fn chain(n: usize, kind_of: impl Fn(usize) -> EntryKind) -> Vec<Entry> {
    (0..n)
        .map(|i| Entry {
            id: eid(i),
            parent_id: i.checked_sub(1).map(eid),
            timestamp_ms: i as i64,
            kind: kind_of(i),
        })
        .collect()
}

#[test]
fn a_linear_fork_seed_is_indexed_like_its_entries_one_by_one() {
    let entries = chain(300, |i| kind((i * 7 % 11) as u8, i / 2));
    check(entries, Some(eid(299)));
}

#[test]
fn an_empty_seed_indexes_nothing() {
    check(Vec::new(), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Any entry list: trees with branches, entries whose parent is later
    /// or absent, duplicate ids, cycles, any leaf.
    #[test]
    fn any_seed_is_indexed_like_its_entries_one_by_one(
        shape in proptest::collection::vec((0usize..40, 0u8..=255, 0usize..40, 0u8..4), 0..40),
        leaf in proptest::option::of(0usize..45),
    ) {
        let n = shape.len();
        let entries: Vec<Entry> = shape
            .iter()
            .enumerate()
            .map(|(i, &(parent, sel, target, id_rule))| Entry {
                // Mostly unique ids; sometimes a repeat of an earlier one.
                id: if id_rule == 0 && i > 0 { eid(parent % i) } else { eid(i) },
                parent_id: match sel % 5 {
                    // A root.
                    0 => None,
                    // A parent anywhere (later, absent, itself: damaged data).
                    1 => Some(eid(parent)),
                    // An earlier entry (a tree).
                    _ => i.checked_sub(1).map(|m| eid(parent % (m + 1))),
                },
                timestamp_ms: i as i64,
                kind: kind(sel / 5, target % n.max(1)),
            })
            .collect();
        check(entries, leaf.map(eid));
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]

    /// Deep seeds: paths over several 64-depth blocks of the active-path
    /// index (mostly a chain, with branches back to any earlier entry and
    /// a few roots), any leaf.
    #[test]
    fn deep_seeds_are_indexed_like_their_entries_one_by_one(
        n in 129usize..400,
        branches in proptest::collection::vec((0usize..400, 0usize..400, 0u8..8), 0..12),
        leaf in 0usize..420,
    ) {
        let mut parents: Vec<Option<usize>> = (0..n).map(|i| i.checked_sub(1)).collect();
        for &(at, to, rule) in &branches {
            let at = at % n;
            parents[at] = match rule {
                0 => None,
                _ => at.checked_sub(1).map(|m| to % (m + 1)),
            };
        }
        let entries: Vec<Entry> = parents
            .iter()
            .enumerate()
            .map(|(i, p)| Entry {
                id: eid(i),
                parent_id: p.map(eid),
                timestamp_ms: i as i64,
                kind: kind((i % 7) as u8, i / 3),
            })
            .collect();
        check(entries, Some(eid(leaf)));
    }
}

/// One follow-up event from a selector and three picks among the ids
/// `e0..e{pool}` (most of them seeded, some new).
fn follow_up(sel: u8, a: usize, b: usize, c: usize, pool: usize, generation: u64) -> SessionEvent {
    let pick = |x: usize| eid(x % pool);
    match sel % 4 {
        0 => SessionEvent::EntryAppended {
            entry: Entry {
                id: eid(pool + a),
                parent_id: Some(pick(b)),
                timestamp_ms: 1,
                kind: kind((c % 9) as u8, b),
            },
        },
        1 => SessionEvent::LeafMoved {
            leaf: Some(pick(a)),
        },
        2 => SessionEvent::TranscriptRewritten {
            generation,
            written: vec![Entry {
                id: pick(a),
                parent_id: Some(pick(b)),
                timestamp_ms: 2,
                kind: text("rewritten"),
            }],
            reparented: vec![(pick(c), Some(pick(b)))],
            removed: Vec::new(),
            leaf: Some(pick(b)),
        },
        _ => SessionEvent::TranscriptRewritten {
            generation,
            written: Vec::new(),
            reparented: Vec::new(),
            removed: vec![pick(a), pick(c)],
            leaf: Some(pick(b)),
        },
    }
}

#[test]
fn a_seed_changed_after_the_fork_stays_indexed_like_its_entries_one_by_one() {
    // A chain, then: an append under a seeded entry (its record gains a
    // child), a rewrite of a seeded entry, removals of seeded entries (a
    // tombstone over the seed table), a leaf move onto a removed entry's
    // sibling, and an append reusing a removed id.
    let entries = chain(100, |i| kind((i % 9) as u8, i / 2));
    let then = vec![
        follow_up(0, 0, 40, 0, 100, 0),
        follow_up(2, 41, 39, 42, 100, 1),
        follow_up(3, 99, 97, 98, 100, 2),
        follow_up(1, 100, 0, 0, 101, 2),
        SessionEvent::EntryAppended {
            entry: Entry {
                id: eid(99),
                parent_id: Some(eid(10)),
                timestamp_ms: 3,
                kind: text("again"),
            },
        },
    ];
    check_then(entries, Some(eid(99)), then);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// A seeded chain or tree, then any sequence of appends, leaf moves,
    /// delta rewrites and removals touching seeded and new entries.
    #[test]
    fn any_seed_stays_indexed_like_its_entries_one_by_one_through_later_events(
        n in 1usize..120,
        branchy in any::<bool>(),
        ops in proptest::collection::vec((0u8..4, 0usize..200, 0usize..200, 0usize..200), 1..24),
    ) {
        let entries: Vec<Entry> = (0..n)
            .map(|i| Entry {
                id: eid(i),
                parent_id: i.checked_sub(1).map(|m| eid(if branchy { (i * 7919) % (m + 1) } else { m })),
                timestamp_ms: i as i64,
                kind: kind((i % 9) as u8, i / 2),
            })
            .collect();
        let mut generation = 0;
        let then: Vec<SessionEvent> = ops
            .iter()
            .enumerate()
            .map(|(k, &(sel, a, b, c))| {
                if sel % 4 >= 2 {
                    generation += 1;
                }
                // New ids are `e{n + a}`: the pool grows with the appends.
                follow_up(sel, a, b, c, n + k.min(a), generation)
            })
            .collect();
        check_then(entries, Some(eid(n - 1)), then);
    }
}

/// Every key and value of both runtime indexers' namespaces.
fn dump_all(index: &spool_engine::Index) -> BTreeMap<(&'static str, Vec<u8>), Vec<u8>> {
    let mut out = BTreeMap::new();
    for ns in [SESSION_INDEXER, TRANSCRIPT_INDEXER] {
        for kv in index.scan_prefix(ns, b"") {
            let (k, v) = kv.unwrap();
            out.insert((ns, k), v);
        }
    }
    out
}

/// Copies `from`'s segments (the log alone, no index) into `to`.
fn copy_log(from: &std::path::Path, to: &std::path::Path) {
    for f in std::fs::read_dir(from).unwrap() {
        let f = f.unwrap();
        if f.file_name().to_string_lossy().ends_with(".seg") {
            std::fs::copy(f.path(), to.join(f.file_name())).unwrap();
        }
    }
}

/// A store's commits: two forks' seeds, a `created` event that does not
/// decode (its session is broken), and follow-ups on a seeded session.
fn memo_case_commits(engine: &spool_engine::Store) {
    let put = |id: &SessionId, expected: ExpectedVersion, events: Vec<EventData>| {
        commit_to(engine, id, expected, events)
    };
    let seeded = |n: usize| {
        let mut transcript = Transcript::new();
        transcript.replace_all(chain(n, |i| kind((i % 9) as u8, i / 2)), Some(eid(n - 1)));
        AgentState {
            transcript,
            ..AgentState::default()
        }
    };
    let a = SessionId::parse("fork-a").unwrap();
    let b = SessionId::parse("fork-b").unwrap();
    let broken = SessionId::parse("broken").unwrap();
    put(
        &a,
        ExpectedVersion::NoStream,
        vec![event(&created(&a, seeded(80)))],
    );
    put(
        &broken,
        ExpectedVersion::NoStream,
        vec![EventData::new(
            format!("{SESSION_EVENT_PREFIX}created"),
            b"\x01not an event".to_vec(),
        )],
    );
    // Two events in one commit: the second `created` starts a new
    // generation over the first.
    put(
        &b,
        ExpectedVersion::NoStream,
        vec![
            event(&created(&b, seeded(5))),
            event(&created(&b, seeded(40))),
        ],
    );
    for (i, (sel, x, y, z)) in [(0, 1, 30, 2), (2, 5, 7, 9), (3, 60, 20, 61), (1, 3, 0, 0)]
        .into_iter()
        .enumerate()
    {
        put(
            &a,
            ExpectedVersion::Exact(1 + i as u64),
            vec![event(&follow_up(sel, x, y, z, 80, i as u64))],
        );
    }
}

/// The session indexer hands a `created` event's decoding to the
/// transcript indexer (a fork's seed is decoded once per commit). The
/// index must be the one the two indexers build decoding on their own:
/// compared byte for byte, both ways round, over one log (so positions
/// and timestamps agree): the log store's indexers (with the memo)
/// indexing as they append against a rebuild by indexers without it, and
/// the reverse.
#[test]
fn the_seed_memo_changes_no_index_key_or_value() {
    use std::sync::Arc;
    let without_memo = || {
        spool_engine::Options::default()
            .durability(spool_engine::Durability::Buffered)
            .indexer(Arc::new(SessionIndexer::default()))
            .indexer(Arc::new(TranscriptIndexer::default()))
    };
    let with_memo = LogStoreOptions {
        durability: spool_engine::Durability::Buffered,
        ..LogStoreOptions::default()
    };

    // Appended through the memo, rebuilt without it.
    let appended = tempfile::tempdir().unwrap();
    let rebuilt = tempfile::tempdir().unwrap();
    {
        let store = LogStore::open(appended.path(), with_memo.clone()).unwrap();
        memo_case_commits(&store.engine().unwrap());
    }
    copy_log(appended.path(), rebuilt.path());
    let a = LogStore::open(appended.path(), with_memo.clone()).unwrap();
    let b = spool_engine::Store::open(rebuilt.path(), without_memo()).unwrap();
    let memo_dump = dump_all(a.engine().unwrap().index());
    assert!(memo_dump.len() > 100, "{} keys", memo_dump.len());
    assert!(
        memo_dump
            .keys()
            .any(|(ns, k)| *ns == SESSION_INDEXER && k.ends_with(b"broken")),
        "the undecodable session is marked"
    );
    assert_eq!(memo_dump, dump_all(b.index()));
    drop((a, b));

    // Appended without the memo, rebuilt through it.
    let appended = tempfile::tempdir().unwrap();
    let rebuilt = tempfile::tempdir().unwrap();
    {
        let engine = spool_engine::Store::open(appended.path(), without_memo()).unwrap();
        memo_case_commits(&engine);
    }
    copy_log(appended.path(), rebuilt.path());
    let a = spool_engine::Store::open(appended.path(), without_memo()).unwrap();
    let b = LogStore::open(rebuilt.path(), with_memo).unwrap();
    assert_eq!(dump_all(a.index()), dump_all(b.engine().unwrap().index()));
}

/// A log store's writer hands each appended entry, its size and its
/// encoding to the transcript indexer, which then neither decodes nor
/// measures it. The index must be the one indexers build decoding every
/// event: appended through handles (single and batched appends, a
/// branch, labels, kinds with escapes, control characters and JSON
/// data), then rebuilt from the same log by indexers without the memo,
/// compared byte for byte.
#[test]
fn handed_over_entries_change_no_index_key_or_value() {
    use spool_runtime::handle::HandleOptions;
    use spool_runtime::hooks::SessionHookStack;
    use spool_runtime::observer::NullSink;
    use spool_runtime::SessionRuntime;
    use std::sync::Arc;

    let opts = LogStoreOptions {
        durability: spool_engine::Durability::Buffered,
        ..LogStoreOptions::default()
    };
    let appended = tempfile::tempdir().unwrap();
    let rebuilt = tempfile::tempdir().unwrap();
    {
        let store = Arc::new(LogStore::open(appended.path(), opts.clone()).unwrap());
        let rt = SessionRuntime::new(store, Arc::new(NullSink), SessionHookStack::empty());
        let agent = AgentDefinition::new("a", "memo test", "");
        for s in 0..2usize {
            let id = rt.create(agent.clone(), None).unwrap().id().clone();
            let h = rt.open_handle(&id, HandleOptions::writer()).unwrap();
            let mut ids = Vec::new();
            for i in 0..40usize {
                let k = match (i + s) % 6 {
                    0 => text(&format!(
                        "line {i}\n\t\"quoted\" \\ \u{1}\u{1f} é {}",
                        "y".repeat(i * 37)
                    )),
                    1 => kind(2, i),
                    2 => kind(3, i),
                    3 => kind(7, i),
                    4 => kind(8, i),
                    _ => kind(0, i),
                };
                if i % 7 == 3 {
                    ids.extend(
                        h.append_entries(vec![k, kind(0, i + 1), kind(3, i + 2)])
                            .unwrap(),
                    );
                } else {
                    ids.push(h.append(k).unwrap());
                }
                if i % 9 == 4 {
                    h.set_label(&ids[i / 2], Some(format!("label {i}")))
                        .unwrap();
                }
                if i == 20 {
                    // A branch: the next append is not under the old leaf.
                    h.move_leaf(Some(ids[10].clone())).unwrap();
                }
            }
        }
    }
    copy_log(appended.path(), rebuilt.path());
    let a = LogStore::open(appended.path(), opts).unwrap();
    let b = spool_engine::Store::open(
        rebuilt.path(),
        spool_engine::Options::default()
            .durability(spool_engine::Durability::Buffered)
            .indexer(Arc::new(SessionIndexer::default()))
            .indexer(Arc::new(TranscriptIndexer::default())),
    )
    .unwrap();
    let live = dump_all(a.engine().unwrap().index());
    assert!(live.len() > 100, "{} keys", live.len());
    assert_eq!(live, dump_all(b.index()));
}
