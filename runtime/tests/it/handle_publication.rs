//! Snapshot publication after handle writes: after every write through a
//! writer handle, the published snapshot equals the one a freshly opened
//! handle builds from the store, and its selection equals the selection
//! over the fully loaded transcript. Random sequences of entry kinds and
//! sizes (oversized entries, compactions, resets, model and thinking
//! changes, custom entries, labels, batches, leaf moves and branches
//! followed by appends) on the log store, on the memory and file stores
//! (full-load adapter) and on the PostgreSQL store (a throwaway server,
//! see `postgres_support`; skipped loudly without server binaries). The publications extended from the previous
//! snapshot are counted: exactly the appends of a chain under a non-empty
//! leaf without a compaction take that path. Existence checks answered
//! from the snapshot (duplicate ids, parents, targets) still refuse what
//! they must.
//!
//! Deterministic: the seed is fixed (override it with
//! `SPOOL_PUBLICATION_SEED=<u64>`; the seed in use is printed).

use crate::handle_support;
#[cfg(feature = "postgres")]
use crate::postgres_support;

use std::sync::Arc;

use handle_support::*;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use spool_runtime::handle::{HandleOptions, SessionHandle};
use spool_runtime::session::SessionId;
use spool_runtime::store::{FileStore, MemoryStore, SessionStore};
use spool_runtime::transcript::{
    entry_size, select_resident, Budget, ContentBlock, Entry, EntryId, EntryKind, Message,
    StopReason, Usage,
};
use spool_runtime::SessionRuntime;

const DEFAULT_SEED: u64 = 0x5b0f_1e5a_9e11;

fn seed() -> u64 {
    let seed = std::env::var("SPOOL_PUBLICATION_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(DEFAULT_SEED);
    eprintln!("handle_publication seed: {seed} (SPOOL_PUBLICATION_SEED)");
    seed
}

#[derive(Clone, Debug)]
enum Kind {
    User(usize),
    /// Text size and model pick (0: no model).
    Assistant(usize, u8),
    Model(u8),
    Thinking(u8),
    Custom(usize),
    Reset,
    SessionInfo,
}

impl Kind {
    fn entry_kind(&self) -> EntryKind {
        match self {
            Kind::User(n) => user(format!("u{}", "x".repeat(*n))),
            Kind::Assistant(n, m) => EntryKind::Message {
                message: Message::Assistant {
                    content: vec![ContentBlock::text(format!("a{}", "y".repeat(*n)))],
                    stop_reason: StopReason::Stop,
                    usage: Usage::default(),
                    model: (*m % 3 != 0).then(|| format!("prov/m{}", m % 3)),
                    error_message: None,
                },
            },
            Kind::Model(m) => EntryKind::ModelChange {
                provider: "p".into(),
                model_id: format!("model-{}", m % 4),
            },
            Kind::Thinking(t) => EntryKind::ThinkingLevelChange {
                thinking_level: ["low", "medium", "high"][usize::from(*t % 3)].into(),
            },
            Kind::Custom(n) => custom("note", serde_json::json!({ "t": "z".repeat(*n) })),
            Kind::Reset => EntryKind::Reset,
            Kind::SessionInfo => EntryKind::SessionInfo {
                name: Some("named".into()),
            },
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Append(Kind),
    /// One commit of several entries.
    Batch(Vec<Kind>),
    /// `append_entry` with an explicit parent: the leaf (`None`) or a
    /// picked entry.
    AppendEntry {
        parent: Option<u16>,
        kind: Kind,
    },
    /// A compaction under the leaf keeping from a picked entry.
    Compact {
        kept: u16,
        size: usize,
    },
    MoveLeaf(Option<u16>),
    /// A branch summary under a picked entry (`None`: the leaf).
    Branch(Option<u16>),
    Label(u16),
}

fn size() -> impl Strategy<Value = usize> {
    // Mostly small, sometimes larger than any byte budget below.
    prop_oneof![8 => 0usize..500, 1 => 2600usize..4000]
}

fn kind() -> impl Strategy<Value = Kind> {
    prop_oneof![
        6 => size().prop_map(Kind::User),
        4 => (size(), any::<u8>()).prop_map(|(n, m)| Kind::Assistant(n, m)),
        1 => any::<u8>().prop_map(Kind::Model),
        1 => any::<u8>().prop_map(Kind::Thinking),
        2 => size().prop_map(Kind::Custom),
        1 => Just(Kind::Reset),
        1 => Just(Kind::SessionInfo),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        10 => kind().prop_map(Op::Append),
        3 => proptest::collection::vec(kind(), 1..5).prop_map(Op::Batch),
        2 => (proptest::option::of(any::<u16>()), kind())
            .prop_map(|(parent, kind)| Op::AppendEntry { parent, kind }),
        2 => (any::<u16>(), 0usize..800).prop_map(|(kept, size)| Op::Compact { kept, size }),
        2 => proptest::option::weighted(0.9, any::<u16>()).prop_map(Op::MoveLeaf),
        1 => proptest::option::of(any::<u16>()).prop_map(Op::Branch),
        1 => any::<u16>().prop_map(Op::Label),
    ]
}

fn budget() -> impl Strategy<Value = Budget> {
    prop_oneof![
        6 => (300u64..2500, 1u64..12).prop_map(|(b, e)| Budget::new(b, e)),
        1 => (0u64..300, 0u64..3).prop_map(|(b, e)| Budget::new(b, e)),
        1 => Just(Budget::default()),
    ]
}

fn pick(ids: &[EntryId], p: u16) -> Option<EntryId> {
    if ids.is_empty() {
        return None;
    }
    ids.get(usize::from(p) % ids.len()).cloned()
}

/// Checks the published snapshot against a fresh handle's and the
/// selection over the full transcript.
fn check(
    rt: &SessionRuntime,
    store: &dyn SessionStore,
    id: &SessionId,
    h: &SessionHandle,
    budget: Budget,
    step: usize,
) -> Result<(), TestCaseError> {
    let s = h.snapshot();
    let fresh = rt
        .open_handle(id, HandleOptions::reader().with_budget(budget))
        .map_err(|e| TestCaseError::fail(format!("open reader: {e}")))?
        .snapshot();
    prop_assert_eq!(&s.header, &fresh.header, "header after step {}", step);
    prop_assert_eq!(s.session_version, fresh.session_version);
    prop_assert_eq!(s.version, fresh.version, "version after step {}", step);
    prop_assert_eq!(&s.leaf, &fresh.leaf);
    prop_assert_eq!(s.transcript_entries, fresh.transcript_entries);
    prop_assert_eq!(
        &s.selection,
        &fresh.selection,
        "selection after step {}",
        step
    );
    prop_assert_eq!(s.resident_sizes(), fresh.resident_sizes());
    let sizes: Vec<u64> = s.entries().iter().map(|e| entry_size(e)).collect();
    prop_assert_eq!(s.resident_sizes(), &sizes[..]);
    let t = full_transcript(store, id);
    let reference = select_resident(&t, s.leaf.as_ref(), budget).expect("reference selection");
    prop_assert_eq!(&s.selection, &reference, "reference after step {}", step);
    Ok(())
}

/// Runs `ops` through a writer handle on `store`, checking after each.
fn run(store: Arc<dyn SessionStore>, ops: &[Op], budget: Budget) -> Result<(), TestCaseError> {
    let (rt, _) = runtime(store.clone());
    let id = new_session(&rt);
    let h = rt
        .open_handle(&id, HandleOptions::writer().with_budget(budget))
        .expect("open writer");
    let mut ids: Vec<EntryId> = Vec::new();
    let mut expect_extended = 0u64;
    // Whether a selection's leaf is omitted (over the byte budget, not the
    // pinned compaction): then nothing older is held, and a publication
    // from or to such a selection is a fresh selection, not an extension.
    let leaf_omitted = |h: &SessionHandle| {
        let s = h.snapshot();
        let sel = &s.selection;
        sel.leaf.as_ref().is_some_and(|l| {
            sel.omitted.iter().any(|o| {
                &o.id == l
                    && matches!(
                        o.kind.as_str(),
                        "message" | "custom_message" | "branch_summary"
                    )
            }) && sel.pinned.as_ref() != Some(l)
        })
    };
    for (step, op) in ops.iter().enumerate() {
        let leaf = h.snapshot().leaf.clone();
        let omitted_before = leaf_omitted(&h);
        // A chain appended under a non-empty leaf, without a compaction,
        // is published by extending the previous snapshot.
        let mut under_leaf = false;
        match op {
            Op::Append(k) => {
                ids.push(h.append(k.entry_kind()).expect("append"));
                under_leaf = true;
            }
            Op::Batch(ks) => {
                let got = h
                    .append_entries(ks.iter().map(Kind::entry_kind).collect())
                    .expect("append batch");
                ids.extend(got);
                under_leaf = true;
            }
            Op::AppendEntry { parent, kind } => {
                let parent = match parent {
                    None => leaf.clone(),
                    Some(p) => pick(&ids, *p),
                };
                under_leaf = parent == leaf;
                let e = Entry {
                    id: EntryId::generate(),
                    parent_id: parent,
                    timestamp_ms: 1_700_000_000_000,
                    kind: kind.entry_kind(),
                };
                ids.push(h.append_entry(e).expect("append entry"));
            }
            Op::Compact { kept, size } => {
                let Some(kept) = pick(&ids, *kept) else {
                    continue;
                };
                ids.push(
                    h.append(EntryKind::Compaction {
                        summary: "s".repeat(*size),
                        first_kept_entry_id: kept,
                        tokens_before: 1000,
                    })
                    .expect("append compaction"),
                );
            }
            Op::MoveLeaf(p) => {
                let to = p.and_then(|p| pick(&ids, p));
                h.move_leaf(to).expect("move leaf");
            }
            Op::Branch(p) => {
                let target = match p {
                    None => leaf.clone(),
                    Some(p) => pick(&ids, *p),
                };
                under_leaf = target == leaf;
                ids.push(
                    h.branch_with_summary(target, "branch summary")
                        .expect("branch"),
                );
            }
            Op::Label(p) => {
                let Some(target) = pick(&ids, *p) else {
                    continue;
                };
                ids.push(h.set_label(&target, Some(format!("l{p}"))).expect("label"));
                under_leaf = true;
            }
        }
        if under_leaf && leaf.is_some() && !omitted_before && !leaf_omitted(&h) {
            expect_extended += 1;
        }
        check(&rt, &*store, &id, &h, budget, step)?;
    }
    prop_assert_eq!(h.extended_publications(), expect_extended);
    Ok(())
}

/// `append_entry` refuses an id already in the transcript (resident or
/// not) and a parent that is not; leaf moves, labels and branches refuse
/// unknown targets; refusals write nothing. Resident and non-resident
/// parents are accepted.
fn refusals(store: Arc<dyn SessionStore>) {
    let (rt, _) = runtime(store);
    let id = new_session(&rt);
    let h = writer(&rt, &id, 2_000);
    let ids = h
        .append_entries((0..30).map(|i| sized(i, 300)).collect())
        .expect("append");
    let snap = h.snapshot();
    let resident = snap.entries()[0].id.clone();
    let old = ids[0].clone();
    assert!(snap.get(&old).is_none(), "the oldest entry is not resident");
    let entry = |id: EntryId, parent: Option<EntryId>| Entry {
        id,
        parent_id: parent,
        timestamp_ms: 1,
        kind: user("x"),
    };
    let ghost = EntryId::parse("ghost").unwrap();
    for dup in [resident.clone(), old.clone(), ids[29].clone()] {
        let err = h.append_entry(entry(dup, snap.leaf.clone())).unwrap_err();
        assert_eq!(err.kind(), "duplicate_entry", "{err}");
    }
    let err = h
        .append_entry(entry(EntryId::generate(), Some(ghost.clone())))
        .unwrap_err();
    assert_eq!(err.kind(), "unknown_entry", "{err}");
    assert_eq!(
        h.move_leaf(Some(ghost.clone())).unwrap_err().kind(),
        "unknown_entry"
    );
    assert_eq!(
        h.set_label(&ghost, Some("l".into())).unwrap_err().kind(),
        "unknown_entry"
    );
    assert_eq!(
        h.branch_with_summary(Some(ghost), "s").unwrap_err().kind(),
        "unknown_entry"
    );
    assert_eq!(h.snapshot().session_version, snap.session_version);
    // Parents resident or not, and labels and moves to either, are fine.
    h.append_entry(entry(EntryId::generate(), Some(resident.clone())))
        .expect("under a resident entry");
    h.append_entry(entry(EntryId::generate(), Some(old.clone())))
        .expect("under an entry that is not resident");
    h.set_label(&old, Some("l".into())).expect("label");
    h.move_leaf(Some(resident))
        .expect("move to a resident entry");
    h.branch_with_summary(Some(old), "s").expect("branch");
    assert_eq!(h.snapshot().session_version, snap.session_version + 5);
}

#[test]
fn refusals_on_the_log_store() {
    let dir = tempfile::tempdir().unwrap();
    refusals(open_log(dir.path()));
}

#[test]
fn refusals_on_the_memory_store() {
    refusals(Arc::new(MemoryStore::new()));
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 64,
        rng_seed: RngSeed::Fixed(seed()),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn log_store_publications_equal_fresh_snapshots(
        ops in proptest::collection::vec(op(), 1..60),
        budget in budget(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        run(open_log(dir.path()), &ops, budget)?;
    }

    #[test]
    fn memory_store_publications_equal_fresh_snapshots(
        ops in proptest::collection::vec(op(), 1..60),
        budget in budget(),
    ) {
        run(Arc::new(MemoryStore::new()), &ops, budget)?;
    }

    #[test]
    fn file_store_publications_equal_fresh_snapshots(
        ops in proptest::collection::vec(op(), 1..25),
        budget in budget(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        run(Arc::new(FileStore::open(dir.path()).unwrap()), &ops, budget)?;
    }
}

/// The same property on the PostgreSQL store: one throwaway server, a
/// fresh schema, fewer cases (each write is a round trip).
#[cfg(feature = "postgres")]
#[test]
fn postgres_store_publications_equal_fresh_snapshots() {
    use proptest::test_runner::TestRunner;
    use spool_runtime::store::postgres::PostgresStore;
    let Some(server) = postgres_support::PgServer::start_or_skip(
        "postgres_store_publications_equal_fresh_snapshots",
    ) else {
        return;
    };
    let conn = server.fresh_schema();
    let store: Arc<dyn SessionStore> =
        Arc::new(PostgresStore::connect(&conn).unwrap_or_else(|e| panic!("connect {conn}: {e}")));
    let mut runner = TestRunner::new(ProptestConfig {
        cases: 16,
        ..config()
    });
    runner
        .run(
            &(proptest::collection::vec(op(), 1..40), budget()),
            |(ops, budget)| run(store.clone(), &ops, budget),
        )
        .unwrap();
}
