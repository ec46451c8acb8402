//! Per-entry path facts, and resident selections that read them instead
//! of walking to the root.

use crate::transcript_support;

use std::borrow::Cow;
use std::cell::Cell;
use std::collections::HashMap;
use std::convert::Infallible;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use spool_runtime::transcript::{
    entry_size, path_facts_by_walk, select_resident, Anchor, Budget, ChildLinks, Entry, EntryFacts,
    EntryId, EntrySource, IndexedTranscript, PathFacts, Transcript,
};
use transcript_support::{build, ops, render, B};

/// Counts every lookup a selection makes through an indexed transcript.
struct Counting<'a> {
    inner: IndexedTranscript<'a>,
    lookups: Cell<u64>,
    payloads: Cell<u64>,
}

impl<'a> Counting<'a> {
    fn new(t: &'a Transcript, f: &'a HashMap<EntryId, PathFacts>) -> Self {
        Counting {
            inner: IndexedTranscript::new(t, f),
            lookups: Cell::new(0),
            payloads: Cell::new(0),
        }
    }
    fn tick(&self) {
        self.lookups.set(self.lookups.get() + 1);
    }
}

impl EntrySource for Counting<'_> {
    type Error = Infallible;
    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, Infallible> {
        self.tick();
        self.payloads.set(self.payloads.get() + 1);
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
}

fn long_path(n: usize) -> B {
    let mut b = B::new();
    b.model("p", "m");
    b.thinking("high");
    for i in 0..n {
        b.user(&format!("{i:05} {}", "x".repeat(100)));
    }
    b
}

#[test]
fn facts_of_a_linear_path() {
    let mut b = B::new();
    let u1 = b.user("u1");
    let m = b.model("p", "m");
    let r = b.reset();
    let u2 = b.user("u2");
    let c = b.compaction("S", &u2);
    let a = b.assistant("a");
    let f = b.t.path_facts_all().unwrap();
    assert_eq!(f[&u1].depth, 0);
    assert_eq!(f[&u1].context_start.id, u1);
    assert_eq!(f[&m].model, Some(("p".into(), "m".into())));
    assert_eq!(f[&r].context_start, Anchor { id: r, depth: 2 });
    let fa = &f[&a];
    assert_eq!(fa.depth, 5);
    assert_eq!(fa.context_start, Anchor { id: u2, depth: 3 });
    assert_eq!(fa.compaction, Some(Anchor { id: c, depth: 4 }));
    assert!(fa.compaction_keeps_prefix);
    assert_eq!(fa.context_entries(), 3);
    assert_eq!(fa.path_entries(), 6);
    assert_eq!(fa.model, Some(("p".into(), "m".into())));
}

#[test]
fn compaction_keeping_an_entry_before_the_reset_starts_at_itself() {
    let mut b = B::new();
    let u1 = b.user("u1");
    b.reset();
    let c = b.compaction("S", &u1);
    let f = b.t.path_facts_all().unwrap();
    assert_eq!(
        f[&c].context_start,
        Anchor {
            id: c.clone(),
            depth: 2
        }
    );
    assert!(!f[&c].compaction_keeps_prefix);
    // PathFacts::child with a caller-resolved depth applies the same rule.
    let entry = b.t.get(&c).unwrap();
    let parent = &f[entry.parent_id.as_ref().unwrap()];
    assert_eq!(PathFacts::child(parent, entry, Some(0)), f[&c]);
}

#[test]
fn compaction_keeping_an_entry_of_another_branch_keeps_nothing() {
    let mut b = B::new();
    let u1 = b.user("u1");
    let side = b.user("side");
    b.at(&u1);
    b.user("main");
    let c = b.compaction("S", &side);
    let f = b.t.path_facts_all().unwrap();
    assert_eq!(f[&c].context_start.id, c);
    assert_eq!(f[&c], path_facts_by_walk(&b.t, &c).unwrap());
}

#[test]
fn indexed_selection_over_a_long_path_visits_only_the_budget() {
    let mut b = long_path(20_000);
    let leaf = b.t.leaf().cloned().unwrap();
    let facts = b.t.path_facts_all().unwrap();
    let src = Counting::new(&b.t, &facts);
    let budget = Budget::new(4096, 1000);
    let s = select_resident(&src, Some(&leaf), budget).unwrap();
    let walked = select_resident(&b.t, Some(&leaf), budget).unwrap();
    assert_eq!(s, walked);
    assert_eq!(s.counts.path_entries, 20_002);
    assert_eq!(s.model, Some(("p".into(), "m".into())));
    assert_eq!(s.thinking_level.as_deref(), Some("high"));
    let kept = s.counts.resident_entries;
    assert!(kept > 10 && kept < 40, "{kept}");
    // path facts of the leaf, then facts + size + payload + children per
    // resident entry, and facts + size of the entry that did not fit.
    assert!(
        src.lookups.get() <= 1 + 4 * kept + 2,
        "{} lookups for {kept} resident entries",
        src.lookups.get()
    );
    assert_eq!(src.payloads.get(), kept);

    // A compaction far back keeping almost everything: still O(budget).
    let first_kept = b.t.entries()[5].id.clone();
    let c = b.compaction("summary", &first_kept);
    for i in 0..50 {
        b.user(&format!("after {i} {}", "y".repeat(100)));
    }
    let facts = b.t.path_facts_all().unwrap();
    let src = Counting::new(&b.t, &facts);
    let s = select_resident(&src, b.t.leaf(), budget).unwrap();
    assert_eq!(s, select_resident(&b.t, b.t.leaf(), budget).unwrap());
    assert_eq!(s.pinned, Some(c.clone()));
    assert_eq!(s.entries[0].id, c, "the pinned summary is the oldest held");
    assert_eq!(s.counts.context_entries, 20_000 - 5 + 2 + 1 + 50);
    let kept = s.counts.resident_entries;
    assert!(
        src.lookups.get() <= 1 + 4 * kept + 4,
        "{}",
        src.lookups.get()
    );
    assert_eq!(render(&s.context())[0], "compaction_summary:summary");
}

#[test]
fn pinned_compaction_stays_resident_when_the_budget_cuts_the_kept_range() {
    let mut b = B::new();
    let mut first = None;
    for i in 0..50 {
        let u = b.user(&format!("{i:02} {}", "k".repeat(150)));
        first.get_or_insert(u);
    }
    let c = b.compaction("S", first.as_ref().unwrap());
    for i in 0..5 {
        b.user(&format!("new{i}"));
    }
    // The walk reaches the compaction and goes on into the kept range.
    let s = select_resident(&b.t, b.t.leaf(), Budget::new(1500, 100)).unwrap();
    assert_eq!(s.pinned, Some(c.clone()));
    assert!(!s.complete);
    assert!(s.counts.resident_bytes <= 1500);
    let r = render(&s.context());
    assert_eq!(r[0], "compaction_summary:S");
    assert_eq!(r.last().unwrap(), "user:new4");
    assert!(
        s.entries[0].id != c,
        "kept-range entries precede the summary"
    );

    // Newer entries fill the budget before the walk reaches the
    // compaction: it is held anyway, as the oldest entry.
    for i in 0..10 {
        b.user(&format!("big{i} {}", "b".repeat(300)));
    }
    let s = select_resident(&b.t, b.t.leaf(), Budget::new(1500, 100)).unwrap();
    assert_eq!(s.pinned, Some(c.clone()));
    assert!(s.counts.resident_bytes <= 1500);
    assert_eq!(s.entries[0].id, c);
    let r = render(&s.context());
    assert_eq!(r[0], "compaction_summary:S");
    assert!(r[1].starts_with("user:big"), "{r:?}");
    assert!(s.counts.beyond_budget_entries > 50);
}

#[test]
fn pinned_compaction_larger_than_the_budget_is_omitted_not_truncated() {
    let mut b = B::new();
    let u = b.user("u");
    let c = b.compaction(&"s".repeat(10_000), &u);
    b.user("after");
    let size = entry_size(b.t.get(&c).unwrap());
    let s = select_resident(&b.t, b.t.leaf(), Budget::new(4096, 100)).unwrap();
    assert_eq!(s.pinned, Some(c.clone()));
    assert_eq!(s.omitted.len(), 1);
    assert_eq!(s.omitted[0].id, c);
    assert_eq!(s.omitted[0].size, size);
    assert_eq!(s.omitted[0].kind, "compaction");
    assert!(s.get(&c).is_none());
    assert_eq!(
        render(&s.context()),
        ["user:u", "user:after"].map(String::from)
    );
    assert!(!s.complete);
}

#[test]
fn zero_event_budget_pins_nothing() {
    let mut b = B::new();
    let u = b.user("u");
    b.compaction("S", &u);
    let s = select_resident(&b.t, b.t.leaf(), Budget::new(4096, 0)).unwrap();
    assert_eq!(s.pinned, None);
    assert!(s.entries.is_empty() && s.omitted.is_empty());
    assert_eq!(s.counts.beyond_budget_entries, 2);
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 300,
        rng_seed: RngSeed::Fixed(0x0fac_75ee),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Facts computed incrementally at append time equal the facts found
    /// by walking the root path, for every entry.
    #[test]
    fn incremental_facts_equal_walked_facts(ops in ops(), leaf_pick in any::<u16>()) {
        let t = build(&ops, leaf_pick);
        let all = t.path_facts_all().unwrap();
        prop_assert_eq!(all.len(), t.len());
        for e in t.entries() {
            prop_assert_eq!(&all[&e.id], &path_facts_by_walk(&t, &e.id).unwrap(), "entry {}", e.id);
        }
    }

    /// A selection reading stored facts is identical to the walking one.
    #[test]
    fn indexed_selection_equals_walked_selection(
        ops in ops(),
        leaf_pick in any::<u16>(),
        bytes_max in 0u64..3000,
        events_max in 0u64..40,
    ) {
        let t = build(&ops, leaf_pick);
        let facts = t.path_facts_all().unwrap();
        let idx = IndexedTranscript::new(&t, &facts);
        let budget = Budget::new(bytes_max, events_max);
        for e in t.entries().iter().take(20) {
            let a = select_resident(&idx, Some(&e.id), budget).unwrap();
            let b = select_resident(&t, Some(&e.id), budget).unwrap();
            prop_assert_eq!(a, b);
        }
        let a = select_resident(&idx, t.leaf(), budget).unwrap();
        let b = select_resident(&t, t.leaf(), budget).unwrap();
        prop_assert_eq!(a, b);
    }
}
