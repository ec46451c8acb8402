//! Paged, version-fenced history reads over entry sources.

use crate::transcript_support;

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::convert::Infallible;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use spool_runtime::transcript::{
    entry_size, read_branch_page, read_context, read_custom_page, read_entry, read_navigation,
    Budget, CancelToken, ChildLinks, Continuation, Entry, EntryFacts, EntryId, EntryPage,
    EntrySource, IndexedTranscript, OversizedPolicy, PageBudget, PageOrder, PathFacts, ReadError,
    ReadResult, ReadScope, Transcript, TranscriptVersion,
};
use transcript_support::{build, id, ops, B};

const V1: TranscriptVersion = TranscriptVersion {
    generation: 1,
    raw_seq: 10,
    updated_at_ms: 1000,
};
const V2: TranscriptVersion = TranscriptVersion {
    generation: 1,
    raw_seq: 11,
    updated_at_ms: 1001,
};

fn scope(cancel: &CancelToken) -> ReadScope<'_> {
    ReadScope {
        session: "s1",
        version: V1,
        cancel,
    }
}

/// Reads all pages of a branch; returns the pages.
fn all_pages<S: EntrySource + ?Sized>(
    src: &S,
    leaf: &EntryId,
    order: PageOrder,
    budget: PageBudget,
) -> Vec<EntryPage>
where
    S::Error: std::fmt::Debug,
{
    let cancel = CancelToken::new();
    let sc = scope(&cancel);
    let mut pages = Vec::new();
    let mut cursor: Option<Continuation> = None;
    loop {
        // The continuation travels as a string.
        let decoded = cursor
            .as_ref()
            .map(|c| Continuation::decode(&c.encode()).unwrap());
        match read_branch_page(src, &sc, leaf, order, decoded.as_ref(), budget).unwrap() {
            ReadResult::Page {
                value,
                continuation,
            } => {
                assert!(!value.entries.is_empty(), "a page always makes progress");
                pages.push(value);
                cursor = Some(continuation);
            }
            ReadResult::Complete { value, version } => {
                assert_eq!(version, V1);
                pages.push(value);
                return pages;
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(pages.len() < 100_000);
    }
}

fn ids(entries: &[Entry]) -> Vec<EntryId> {
    entries.iter().map(|e| e.id.clone()).collect()
}

fn path_ids(t: &Transcript, leaf: &EntryId) -> Vec<EntryId> {
    t.root_path(leaf)
        .unwrap()
        .into_iter()
        .map(|e| e.id.clone())
        .collect()
}

#[test]
fn versions_order_by_generation_then_raw_seq() {
    let a = TranscriptVersion {
        generation: 1,
        raw_seq: 99,
        updated_at_ms: 5,
    };
    let b = TranscriptVersion {
        generation: 2,
        raw_seq: 1,
        updated_at_ms: 1,
    };
    assert!(a < b);
    assert!(V1 < V2);
}

#[test]
fn continuation_round_trips_and_rejects_damage() {
    let mut b = B::new();
    for i in 0..5 {
        b.user(&format!("u{i}"));
    }
    let leaf = b.t.leaf().cloned().unwrap();
    let cancel = CancelToken::new();
    let r = read_branch_page(
        &b.t,
        &scope(&cancel),
        &leaf,
        PageOrder::RootFirst,
        None,
        PageBudget::new(10_000, 2),
    )
    .unwrap();
    let c = r.continuation().unwrap().clone();
    let s = c.encode();
    assert!(s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_'));
    assert_eq!(Continuation::decode(&s).unwrap(), c);
    assert_eq!(c.version(), V1);
    assert_eq!(c.session(), "s1");
    // serde: an opaque string.
    let j = serde_json::to_string(&c).unwrap();
    assert_eq!(j, format!("\"{s}\""));
    assert_eq!(serde_json::from_str::<Continuation>(&j).unwrap(), c);
    // Any single changed character is refused.
    for i in 0..s.len() {
        let mut bytes = s.clone().into_bytes();
        bytes[i] = if bytes[i] == b'A' { b'B' } else { b'A' };
        let damaged = String::from_utf8(bytes).unwrap();
        assert!(Continuation::decode(&damaged).is_err(), "position {i}");
    }
    assert!(Continuation::decode("").is_err());
    assert!(Continuation::decode("!!!!").is_err());
    assert!(Continuation::decode(&s[..s.len() - 3]).is_err());
    assert!(Continuation::decode(&"A".repeat(10_000)).is_err());

    // check: session, branch and version must all match.
    assert!(c.check("s1", &leaf, V1).is_ok());
    let conflict = c.check("s1", &leaf, V2).unwrap_err();
    assert_eq!((conflict.expected, conflict.actual), (V1, V2));
    assert!(c.check("s2", &leaf, V1).is_err());
    assert!(c.check("s1", &id("e1"), V1).is_err());
    assert!(c.check_custom("s1", None, V1).is_err());
}

#[test]
fn branch_pages_cover_the_path_in_both_orders() {
    let mut b = B::new();
    let mut fork = None;
    for i in 0..40 {
        let e = b.user(&format!("{i:02} {}", "p".repeat(i * 7)));
        if i == 20 {
            fork = Some(e);
        }
    }
    b.at(fork.as_ref().unwrap());
    for i in 0..10 {
        b.assistant(&format!("side {i}"));
    }
    let leaf = b.t.leaf().cloned().unwrap();
    let want = path_ids(&b.t, &leaf);
    for budget in [
        PageBudget::new(600, 5),
        PageBudget::new(100_000, 7),
        PageBudget::new(1, 3).with_oversized(OversizedPolicy::Alone),
    ] {
        let pages = all_pages(&b.t, &leaf, PageOrder::RootFirst, budget);
        let got: Vec<EntryId> = pages.iter().flat_map(|p| ids(&p.entries)).collect();
        assert_eq!(got, want, "{budget:?}");
        for p in &pages {
            assert!(p.entries.len() as u64 <= budget.events_max);
            assert_eq!(p.bytes, p.entries.iter().map(entry_size).sum::<u64>());
            assert!(p.bytes <= budget.bytes_max || p.entries.len() == 1);
        }
        let pages = all_pages(&b.t, &leaf, PageOrder::LeafFirst, budget);
        let mut got: Vec<EntryId> = pages.iter().flat_map(|p| ids(&p.entries)).collect();
        got.reverse();
        assert_eq!(got, want, "{budget:?}");
    }
}

#[test]
fn oversized_entry_is_refused_or_returned_alone_never_cut() {
    let mut b = B::new();
    b.user("small 1");
    let big = b.custom("blob", serde_json::json!("x".repeat(5000)));
    b.user("small 2");
    let leaf = b.t.leaf().cloned().unwrap();
    let cancel = CancelToken::new();
    let sc = scope(&cancel);
    let budget = PageBudget::new(1000, 10);
    // First page stops before the big entry.
    let r = read_branch_page(&b.t, &sc, &leaf, PageOrder::RootFirst, None, budget).unwrap();
    assert_eq!(r.value().unwrap().entries.len(), 1);
    let c = r.continuation().unwrap().clone();
    // The big entry heads the next page: refused with its size.
    let r = read_branch_page(&b.t, &sc, &leaf, PageOrder::RootFirst, Some(&c), budget).unwrap();
    assert_eq!(
        r,
        ReadResult::Oversized {
            id: big.clone(),
            size: entry_size(b.t.get(&big).unwrap()),
            budget_bytes: 1000
        }
    );
    // With `Alone`, it comes alone and byte-exact.
    let alone = budget.with_oversized(OversizedPolicy::Alone);
    let r = read_branch_page(&b.t, &sc, &leaf, PageOrder::RootFirst, Some(&c), alone).unwrap();
    assert_eq!(
        r.value().unwrap().entries,
        vec![b.t.get(&big).unwrap().clone()]
    );
    // And it is always readable on its own.
    let r = read_entry(&b.t, &sc, &big).unwrap();
    assert_eq!(r.value(), b.t.get(&big));
}

#[test]
fn a_version_change_between_pages_is_a_conflict() {
    let mut b = B::new();
    for i in 0..10 {
        b.user(&format!("u{i}"));
    }
    let leaf = b.t.leaf().cloned().unwrap();
    let cancel = CancelToken::new();
    let budget = PageBudget::new(10_000, 3);
    let r = read_branch_page(
        &b.t,
        &scope(&cancel),
        &leaf,
        PageOrder::RootFirst,
        None,
        budget,
    )
    .unwrap();
    let c = r.continuation().unwrap().clone();
    b.user("appended");
    let later = ReadScope {
        session: "s1",
        version: V2,
        cancel: &cancel,
    };
    let r = read_branch_page(&b.t, &later, &leaf, PageOrder::RootFirst, Some(&c), budget).unwrap();
    assert_eq!(
        r,
        ReadResult::VersionConflict {
            expected: V1,
            actual: V2
        }
    );
    // Another leaf or order with the same continuation: a conflict too.
    let r = read_branch_page(
        &b.t,
        &scope(&cancel),
        &leaf,
        PageOrder::LeafFirst,
        Some(&c),
        budget,
    )
    .unwrap();
    assert!(matches!(r, ReadResult::VersionConflict { .. }));
    let other = b.t.leaf().cloned().unwrap();
    let r = read_branch_page(
        &b.t,
        &scope(&cancel),
        &other,
        PageOrder::RootFirst,
        Some(&c),
        budget,
    )
    .unwrap();
    assert!(matches!(r, ReadResult::VersionConflict { .. }));
}

/// Cancels its token after a number of payload loads and counts lookups.
struct Probe<'a> {
    inner: IndexedTranscript<'a>,
    active_path: Vec<EntryId>,
    cancel_after: Option<(u64, &'a CancelToken)>,
    loads: Cell<u64>,
    lookups: Cell<u64>,
}

impl<'a> Probe<'a> {
    fn new(t: &'a Transcript, f: &'a HashMap<EntryId, PathFacts>) -> Self {
        Probe {
            inner: IndexedTranscript::new(t, f),
            active_path: t.leaf().map(|l| path_ids(t, l)).unwrap_or_default(),
            cancel_after: None,
            loads: Cell::new(0),
            lookups: Cell::new(0),
        }
    }
    fn tick(&self) {
        self.lookups.set(self.lookups.get() + 1);
    }
}

impl EntrySource for Probe<'_> {
    type Error = Infallible;
    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, Infallible> {
        self.tick();
        self.loads.set(self.loads.get() + 1);
        if let Some((n, c)) = self.cancel_after {
            if self.loads.get() >= n {
                c.cancel();
            }
        }
        self.inner.entry(id)
    }
    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, Infallible> {
        self.tick();
        self.inner.children(id, limit)
    }
    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, Infallible> {
        self.tick();
        self.inner.facts(id)
    }
    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, Infallible> {
        self.tick();
        self.inner.entry_size(id)
    }
    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, Infallible> {
        self.tick();
        self.inner.path_facts(id)
    }
    fn ancestor_at_depth(&self, from: &EntryId, depth: u64) -> Result<Option<EntryId>, Infallible> {
        self.tick();
        // An index of the active path only.
        if self.active_path.last() != Some(from) {
            return Ok(None);
        }
        Ok(usize::try_from(depth)
            .ok()
            .and_then(|d| self.active_path.get(d).cloned()))
    }
    fn custom_entries_after(
        &self,
        custom_type: Option<&str>,
        after_seq: Option<u64>,
        limit: usize,
    ) -> Result<Option<Vec<spool_runtime::transcript::CustomRef>>, Infallible> {
        self.tick();
        self.inner
            .custom_entries_after(custom_type, after_seq, limit)
    }
}

#[test]
fn page_cost_is_proportional_to_the_page_on_a_long_path() {
    let mut b = B::new();
    for i in 0..20_000 {
        b.user(&format!("{i:05} {}", "x".repeat(50)));
    }
    let leaf = b.t.leaf().cloned().unwrap();
    let facts = b.t.path_facts_all().unwrap();
    let cancel = CancelToken::new();
    let sc = scope(&cancel);
    let budget = PageBudget::new(100_000, 16);
    for order in [PageOrder::RootFirst, PageOrder::LeafFirst] {
        let probe = Probe::new(&b.t, &facts);
        let mut cursor = None;
        for _ in 0..5 {
            probe.lookups.set(0);
            let r = read_branch_page(&probe, &sc, &leaf, order, cursor.as_ref(), budget).unwrap();
            assert_eq!(r.value().unwrap().entries.len(), 16);
            // path facts + ancestor lookup + (facts, size, payload) per entry.
            assert!(
                probe.lookups.get() <= 3 + 3 * 16 + 2,
                "{order:?}: {}",
                probe.lookups.get()
            );
            cursor = r.continuation().cloned();
        }
    }
}

#[test]
fn cancellation_before_and_during_a_read() {
    let mut b = B::new();
    for i in 0..30 {
        b.user(&format!("u{i}"));
    }
    let leaf = b.t.leaf().cloned().unwrap();
    let facts = b.t.path_facts_all().unwrap();
    let cancel = CancelToken::new();
    let sc = scope(&cancel);
    let budget = PageBudget::new(100_000, 10);
    let mut probe = Probe::new(&b.t, &facts);
    probe.cancel_after = Some((3, &cancel));
    let r = read_branch_page(&probe, &sc, &leaf, PageOrder::RootFirst, None, budget).unwrap();
    assert_eq!(r, ReadResult::Cancelled);
    assert_eq!(probe.loads.get(), 3, "no entry is read after cancellation");
    // Already cancelled: every selection reports it.
    assert_eq!(read_entry(&b.t, &sc, &leaf).unwrap(), ReadResult::Cancelled);
    assert_eq!(
        read_context(&b.t, &sc, Some(&leaf), Budget::default()).unwrap(),
        ReadResult::Cancelled
    );
    assert_eq!(
        read_custom_page(&b.t, &sc, None, None, budget).unwrap(),
        ReadResult::Cancelled
    );
    assert_eq!(
        read_navigation(&b.t, &sc, None, &leaf).unwrap(),
        ReadResult::Cancelled
    );
    // A clone shares the flag.
    let c2 = CancelToken::new();
    c2.clone().cancel();
    assert!(c2.is_cancelled());
}

#[test]
fn entry_and_context_reads_report_absence_explicitly() {
    let mut b = B::new();
    b.user("u");
    let cancel = CancelToken::new();
    let sc = scope(&cancel);
    let ghost = id("ghost");
    assert_eq!(
        read_entry(&b.t, &sc, &ghost).unwrap(),
        ReadResult::EntryAbsent { id: ghost.clone() }
    );
    assert_eq!(
        read_context(&b.t, &sc, Some(&ghost), Budget::default()).unwrap(),
        ReadResult::EntryAbsent { id: ghost.clone() }
    );
    assert_eq!(
        read_branch_page(
            &b.t,
            &sc,
            &ghost,
            PageOrder::RootFirst,
            None,
            PageBudget::new(10, 10)
        )
        .unwrap(),
        ReadResult::EntryAbsent { id: ghost.clone() }
    );
    let r = read_context(&b.t, &sc, b.t.leaf(), Budget::default()).unwrap();
    let ReadResult::Complete { value, version } = r else {
        panic!("{r:?}")
    };
    assert_eq!(version, V1);
    assert_eq!(value.context(), b.t.context().unwrap());
}

#[test]
fn custom_pages_keep_append_order_and_duplicates() {
    let mut b = B::new();
    let mut want = Vec::new();
    for i in 0..12 {
        b.user(&format!("u{i}"));
        want.push(b.custom("state", serde_json::json!({"n": i % 3})));
        b.custom("other", serde_json::json!(i));
        if i == 5 {
            // A branch: custom entries off the active path count too.
            let e = b.t.entries()[1].id.clone();
            b.at(&e);
        }
    }
    // Duplicate payloads are preserved.
    want.push(b.custom("state", serde_json::json!({"n": 0})));
    want.push(b.custom("state", serde_json::json!({"n": 0})));
    let cancel = CancelToken::new();
    let sc = scope(&cancel);
    let budget = PageBudget::new(100_000, 5);
    let mut got = Vec::new();
    let mut cursor: Option<Continuation> = None;
    loop {
        match read_custom_page(&b.t, &sc, Some("state"), cursor.as_ref(), budget).unwrap() {
            ReadResult::Page {
                value,
                continuation,
            } => {
                assert_eq!(value.entries.len(), 5);
                got.extend(ids(&value.entries));
                cursor = Some(continuation);
            }
            ReadResult::Complete { value, .. } => {
                got.extend(ids(&value.entries));
                break;
            }
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(got, want);
    // A custom continuation is bound to its type and version.
    let r = read_custom_page(&b.t, &sc, Some("state"), None, budget).unwrap();
    let c = r.continuation().unwrap();
    assert!(matches!(
        read_custom_page(&b.t, &sc, Some("other"), Some(c), budget).unwrap(),
        ReadResult::VersionConflict { .. }
    ));
    let later = ReadScope { version: V2, ..sc };
    assert!(matches!(
        read_custom_page(&b.t, &later, Some("state"), Some(c), budget).unwrap(),
        ReadResult::VersionConflict { .. }
    ));
}

/// A source without a custom-entry index.
struct NoIndex<'a>(&'a Transcript);

impl EntrySource for NoIndex<'_> {
    type Error = Infallible;
    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, Infallible> {
        self.0.entry(id)
    }
    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, Infallible> {
        EntrySource::children(self.0, id, limit)
    }
}

#[test]
fn a_source_without_a_custom_index_fails_rather_than_returning_nothing() {
    let mut b = B::new();
    b.custom("state", serde_json::json!(1));
    let cancel = CancelToken::new();
    let r = read_custom_page(
        &NoIndex(&b.t),
        &scope(&cancel),
        None,
        None,
        PageBudget::new(100, 10),
    );
    assert!(matches!(r, Err(ReadError::Unsupported(_))));
}

#[test]
fn navigation_facts_give_the_common_ancestor_labels_and_children() {
    let mut b = B::new();
    let root = b.user("root");
    let fork = b.assistant("fork point");
    let x1 = b.user("x1");
    let x2 = b.assistant("x2");
    b.at(&fork);
    let y1 = b.user("y1");
    let y2 = b.assistant("y2");
    b.label(&fork, Some("here"));
    b.label(&y1, Some("why"));
    let cancel = CancelToken::new();
    let sc = scope(&cancel);
    let r = read_navigation(&b.t, &sc, Some(&x2), &fork).unwrap();
    let n = r.value().unwrap();
    assert_eq!(n.common_ancestor.as_ref(), Some(&fork));
    assert_eq!(n.common_ancestor_label.as_deref(), Some("here"));
    assert_eq!(n.target_label.as_deref(), Some("here"));
    assert_eq!((n.steps_up, n.steps_down), (2, 0));
    assert_eq!(n.target_facts.depth, 1);
    assert_eq!(n.children_total, 2);
    let kids: Vec<_> = n
        .children
        .iter()
        .map(|c| (&c.id, c.summary.as_str()))
        .collect();
    assert_eq!(kids, [(&x1, "x1"), (&y1, "y1")]);
    assert_eq!(n.children[1].label.as_deref(), Some("why"));

    let r = read_navigation(&b.t, &sc, Some(&x2), &y2).unwrap();
    let n = r.value().unwrap();
    assert_eq!(n.common_ancestor.as_ref(), Some(&fork));
    assert_eq!((n.steps_up, n.steps_down), (2, 2));
    let r = read_navigation(&b.t, &sc, None, &root).unwrap();
    assert_eq!(r.value().unwrap().common_ancestor, None);
    // Same answers through stored path facts.
    let facts = b.t.path_facts_all().unwrap();
    let idx = IndexedTranscript::new(&b.t, &facts);
    assert_eq!(
        read_navigation(&idx, &sc, Some(&x2), &y2).unwrap(),
        r_again(&b.t, &sc, &x2, &y2)
    );
    let ghost = id("ghost");
    assert_eq!(
        read_navigation(&b.t, &sc, Some(&x2), &ghost).unwrap(),
        ReadResult::EntryAbsent { id: ghost }
    );
}

fn r_again(
    t: &Transcript,
    sc: &ReadScope<'_>,
    from: &EntryId,
    to: &EntryId,
) -> ReadResult<spool_runtime::transcript::NavigationFacts> {
    read_navigation(t, sc, Some(from), to).unwrap()
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 200,
        rng_seed: RngSeed::Fixed(0x9a6e_5eed),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Pages of every order and budget concatenate to exactly the path:
    /// nothing skipped, nothing repeated, nothing cut.
    #[test]
    fn pages_concatenate_to_the_path(
        ops in ops(),
        leaf_pick in any::<u16>(),
        bytes_max in 0u64..2000,
        events_max in 0u64..12,
        indexed in any::<bool>(),
    ) {
        let t = build(&ops, leaf_pick);
        let Some(leaf) = t.leaf().cloned() else { return Ok(()) };
        let want = path_ids(&t, &leaf);
        let budget = PageBudget::new(bytes_max, events_max).with_oversized(OversizedPolicy::Alone);
        let facts = t.path_facts_all().unwrap();
        let probe = Probe::new(&t, &facts);
        for order in [PageOrder::RootFirst, PageOrder::LeafFirst] {
            let pages = if indexed {
                all_pages(&probe, &leaf, order, budget)
            } else {
                all_pages(&t, &leaf, order, budget)
            };
            let mut got: Vec<EntryId> = pages.iter().flat_map(|p| ids(&p.entries)).collect();
            if order == PageOrder::LeafFirst {
                got.reverse();
            }
            prop_assert_eq!(&got, &want);
            for p in &pages {
                prop_assert!(p.entries.len() as u64 <= events_max.max(1));
                prop_assert!(p.bytes <= bytes_max || p.entries.len() == 1);
                for e in &p.entries {
                    prop_assert_eq!(Some(e), t.get(&e.id));
                }
            }
        }
    }
}
