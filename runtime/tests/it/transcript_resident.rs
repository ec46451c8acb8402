//! Resident-snapshot selection under byte and event budgets.

use crate::transcript_support;

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashMap;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use spool_runtime::transcript::{
    context_messages, context_start, entry_size, path_facts_by_walk, select_resident, Budget,
    ChildLinks, Entry, EntryFacts, EntryId, EntryKind, EntrySource, PathFacts, ResidentError,
    SharedSeq, Transcript, CHILD_LINKS_MAX,
};
use transcript_support::{build, id, ops, render, B};

fn sel(t: &Transcript, budget: Budget) -> spool_runtime::transcript::ResidentSelection {
    select_resident(t, t.leaf(), budget).expect("selection")
}

fn size_of(t: &Transcript, i: &EntryId) -> u64 {
    entry_size(t.get(i).unwrap())
}

#[test]
fn unlimited_budget_holds_the_whole_context() {
    let mut b = B::new();
    b.model("p", "m");
    b.user("u1");
    let a1 = b.assistant("a1");
    b.user("u2");
    b.compaction("S", &a1);
    b.calls(&[("c1", "read")]);
    b.result("c1", "read", "r");
    b.thinking("high");
    let s = sel(&b.t, Budget::UNLIMITED);
    assert!(s.complete);
    assert_eq!(s.context(), b.t.context().unwrap());
    assert_eq!(s.counts.path_entries, 8);
    // a1 .. leaf
    assert_eq!(s.counts.context_entries, 6);
    assert_eq!(s.counts.resident_entries, 6);
    assert_eq!(s.counts.beyond_budget_entries, 0);
    assert_eq!(s.context_start, Some(a1));
    assert_eq!(s.model, Some(("p".into(), "m".into())));
    assert_eq!(s.thinking_level.as_deref(), Some("high"));
    let expect: u64 = s.entries.iter().map(|e| entry_size(e)).sum();
    assert_eq!(s.counts.resident_bytes, expect);
}

#[test]
fn entry_size_is_the_compact_json_length() {
    let mut b = B::new();
    let u = b.user("hello");
    let e = b.t.get(&u).unwrap();
    assert_eq!(entry_size(e), serde_json::to_vec(e).unwrap().len() as u64);
}

#[test]
fn leaf_none_is_empty_and_complete_unknown_leaf_is_an_error() {
    let mut b = B::new();
    b.user("u");
    let s = select_resident(&b.t, None, Budget::default()).unwrap();
    assert!(s.complete);
    assert!(s.entries.is_empty());
    assert!(s.context().messages.is_empty());
    assert!(matches!(
        select_resident(&b.t, Some(&id("nope")), Budget::default()),
        Err(ResidentError::UnknownLeaf(x)) if x == id("nope")
    ));
}

#[test]
fn byte_budget_keeps_the_newest_entries_that_fit() {
    let mut b = B::new();
    let mut ids = Vec::new();
    for i in 0..10 {
        ids.push(b.user(&format!("message number {i:02}")));
    }
    // Sizes differ slightly (ids e1..e10): budget the newest three plus
    // less than the fourth.
    let size = |i: usize| size_of(&b.t, &ids[i]);
    let three = size(7) + size(8) + size(9);
    let s = sel(&b.t, Budget::new(three + size(6) - 1, 100));
    assert!(!s.complete);
    assert_eq!(s.counts.resident_entries, 3);
    assert_eq!(s.counts.resident_bytes, three);
    assert_eq!(s.counts.beyond_budget_entries, 7);
    assert_eq!(s.counts.context_entries, 10);
    assert!(s.omitted.is_empty());
    let got: Vec<&EntryId> = s.entries.iter().map(|e| &e.id).collect();
    assert_eq!(got, ids[7..].iter().collect::<Vec<_>>());
    assert_eq!(
        render(&s.context()),
        [
            "user:message number 07",
            "user:message number 08",
            "user:message number 09"
        ]
    );
    // Exactly enough bytes for all: complete.
    let all: u64 = (0..10).map(size).sum();
    let s = sel(&b.t, Budget::new(all, 100));
    assert!(s.complete);
    assert_eq!(s.context(), b.t.context().unwrap());
}

#[test]
fn event_budget_limits_the_count() {
    let mut b = B::new();
    for i in 0..10 {
        b.user(&format!("m{i}"));
    }
    let s = sel(&b.t, Budget::new(u64::MAX, 4));
    assert_eq!(s.counts.resident_entries, 4);
    assert_eq!(s.counts.beyond_budget_entries, 6);
    assert!(!s.complete);
    assert_eq!(
        render(&s.context()),
        ["user:m6", "user:m7", "user:m8", "user:m9"]
    );
    let s = sel(&b.t, Budget::new(u64::MAX, 0));
    assert_eq!(s.counts.resident_entries, 0);
    assert_eq!(s.counts.beyond_budget_entries, 10);
}

#[test]
fn oversized_entry_is_omitted_not_truncated_and_older_entries_stay() {
    let mut b = B::new();
    let u1 = b.user("before");
    let a1 = b.assistant("aborted half-answer");
    let payload = "x".repeat(5 * 1024 * 1024);
    let big = b.custom("blob", serde_json::json!({ "payload": payload }));
    let u2 = b.user("after");
    let budget = Budget::new(4096, 100);
    let s = sel(&b.t, budget);
    assert_eq!(s.omitted.len(), 1);
    assert_eq!(s.omitted[0].id, big);
    assert_eq!(s.omitted[0].kind, "custom");
    assert_eq!(s.omitted[0].size, size_of(&b.t, &big));
    assert!(s.omitted[0].size > 5 * 1024 * 1024);
    let got: Vec<&EntryId> = s.entries.iter().map(|e| &e.id).collect();
    assert_eq!(got, [&u1, &a1, &u2]);
    for e in &s.entries {
        assert_eq!(
            Some(&**e),
            b.t.get(&e.id),
            "resident entries are byte-exact"
        );
    }
    assert!(s.counts.resident_bytes <= 4096);
    assert_eq!(s.counts.omitted_entries, 1);
    assert_eq!(s.counts.beyond_budget_entries, 0);
    assert!(
        !s.complete,
        "an omitted entry makes the selection incomplete"
    );
    // The custom entry contributes no message, so the context is intact.
    assert_eq!(s.context(), b.t.context().unwrap());
    assert!(s.get(&big).is_none());
    // The source still has it in full.
    let EntryKind::Custom { data, .. } = &b.t.get(&big).unwrap().kind else {
        panic!("custom entry expected");
    };
    assert_eq!(
        data.to_value()["payload"].as_str().unwrap().len(),
        5 * 1024 * 1024
    );
}

/// A leaf over the byte budget is omitted, and nothing older is held in
/// its place: a context of the user turn without the newer assistant
/// answer would ask the model the same question again.
#[test]
fn an_oversized_leaf_is_never_dropped_for_an_older_entry() {
    let mut b = B::new();
    b.user("question");
    let c = b.compaction("S", &id("nope"));
    b.user("again");
    let a = b.assistant(&"a".repeat(1000));
    let s = sel(&b.t, Budget::new(300, 100));
    assert!(s.entries.is_empty(), "{:?}", s.entries);
    assert_eq!(s.omitted.len(), 1);
    assert_eq!(s.omitted[0].id, a);
    assert_eq!(s.pinned, None, "not even the compaction {c} is held");
    assert!(!s.complete);
    assert_eq!(s.counts.beyond_budget_entries, s.counts.context_entries - 1);
    assert!(s.context().messages.is_empty());
    // With room for the leaf, it is held first.
    let s = sel(&b.t, Budget::new(4096, 100));
    assert_eq!(s.entries.last().map(|e| &e.id), Some(&a));
}

/// A tool result is held only with its call: when the assistant message
/// that made the call is beyond the budget or omitted, its results go too.
#[test]
fn a_tool_result_is_never_held_without_its_call() {
    // Beyond the budget: the results fit, the call does not.
    let mut b = B::new();
    b.user("go");
    let call = b.add(EntryKind::Message {
        message: spool_runtime::transcript::Message::Assistant {
            content: vec![
                spool_runtime::transcript::ContentBlock::text("x".repeat(600)),
                spool_runtime::transcript::ContentBlock::tool_call(
                    "c1",
                    "read",
                    serde_json::json!({}),
                ),
            ],
            stop_reason: spool_runtime::transcript::StopReason::ToolUse,
            usage: Default::default(),
            model: None,
            error_message: None,
        },
    });
    let r1 = b.result("c1", "read", "r1");
    let leaf = b.assistant("done");
    let budget_bytes = size_of(&b.t, &r1) + size_of(&b.t, &leaf) + size_of(&b.t, &call) / 2;
    let s = sel(&b.t, Budget::new(budget_bytes, 100));
    let held: Vec<&EntryId> = s.entries.iter().map(|e| &e.id).collect();
    assert_eq!(held, [&leaf], "the result went with its call");
    assert_eq!(
        s.counts.resident_bytes,
        size_of(&b.t, &leaf),
        "the dropped result's bytes are not counted"
    );
    assert_eq!(
        s.counts.resident_entries + s.counts.omitted_entries + s.counts.beyond_budget_entries,
        s.counts.context_entries
    );
    // Omitted (over the whole budget): the walk goes on past the call,
    // and the older user turn is held, but not the result.
    let s = sel(&b.t, Budget::new(size_of(&b.t, &call) - 1, 100));
    let held: Vec<&EntryId> = s.entries.iter().map(|e| &e.id).collect();
    assert!(!held.contains(&&r1), "{held:?}");
    assert!(held.contains(&&leaf));
    assert_eq!(s.omitted.len(), 1);
    assert_eq!(s.omitted[0].id, call);
    // Extending such a selection keeps the rule (or defers to the full
    // selection).
    let before = sel(&b.t, Budget::new(budget_bytes, 100));
    let sizes: SharedSeq<u64> = before.entries.iter().map(|e| entry_size(e)).collect();
    let appended = {
        let n = b.result("c1", "read", "late");
        vec![b.t.get(&n).unwrap().clone()]
    };
    if let Some((next, _)) = before.extended(&sizes, &appended) {
        let want = sel(&b.t, Budget::new(budget_bytes, 100));
        assert_eq!(
            next.entries
                .iter()
                .map(|e| e.id.clone())
                .collect::<Vec<_>>(),
            want.entries
                .iter()
                .map(|e| e.id.clone())
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn omitted_records_use_event_slots() {
    let mut b = B::new();
    for _ in 0..5 {
        b.custom("blob", serde_json::json!("y".repeat(500)));
    }
    let leaf = b.user("u");
    let s = sel(&b.t, Budget::new(300, 3));
    assert_eq!(s.omitted.len(), 2);
    assert_eq!(s.counts.beyond_budget_entries, 3);
    let held: Vec<&EntryId> = s.entries.iter().map(|e| &e.id).collect();
    assert_eq!(held, [&leaf]);
}

#[test]
fn omitted_first_kept_entry_does_not_discard_the_kept_range() {
    let mut b = B::new();
    b.user("old");
    let big = b.user(&"k".repeat(10_000));
    b.assistant("kept answer");
    b.compaction("S", &big);
    b.user("new");
    let s = sel(&b.t, Budget::new(4096, 100));
    assert_eq!(s.omitted.len(), 1);
    assert_eq!(s.context_start, Some(big));
    assert_eq!(
        render(&s.context()),
        ["compaction_summary:S", "assistant:kept answer", "user:new"]
    );
}

#[test]
fn context_segment_starts_at_reset() {
    let mut b = B::new();
    b.user("u1");
    let r = b.reset();
    b.user("u2");
    let s = sel(&b.t, Budget::UNLIMITED);
    assert_eq!(s.context_start, Some(r));
    assert_eq!(s.counts.path_entries, 3);
    assert_eq!(s.counts.context_entries, 2);
    assert_eq!(s.context(), b.t.context().unwrap());
}

#[test]
fn compaction_whose_first_kept_is_missing_starts_the_segment() {
    let mut b = B::new();
    b.user("u1");
    let c = b.compaction("S", &id("elsewhere"));
    b.user("u2");
    let s = sel(&b.t, Budget::UNLIMITED);
    assert_eq!(s.context_start, Some(c));
    assert_eq!(s.counts.context_entries, 2);
    assert_eq!(s.context(), b.t.context().unwrap());
}

#[test]
fn navigation_links_of_resident_entries() {
    let mut b = B::new();
    let root = b.user("root");
    for i in 0..(CHILD_LINKS_MAX + 6) {
        b.at(&root);
        b.user(&format!("child {i}"));
    }
    let s = sel(&b.t, Budget::UNLIMITED);
    assert_eq!(s.links.len(), s.entries.len());
    let l = &s.links[0];
    assert_eq!(l.id, root);
    assert_eq!(l.parent_id, None);
    assert_eq!(l.children.len(), CHILD_LINKS_MAX);
    assert_eq!(l.children_total, (CHILD_LINKS_MAX + 6) as u64);
    assert_eq!(l.children[..], b.t.children_ids(&root)[..CHILD_LINKS_MAX]);
    let leaf_links = &s.links[1];
    assert_eq!(leaf_links.parent_id.as_ref(), Some(&root));
    assert!(leaf_links.children.is_empty());
}

#[test]
fn orphan_leaf_path_stops_and_cycles_are_errors() {
    let mk = |i: &str, p: Option<&str>| {
        let mut b = B::new();
        let e = b.user(i);
        let mut entry = b.t.get(&e).unwrap().clone();
        entry.id = id(i);
        entry.parent_id = p.map(id);
        entry
    };
    let mut t = Transcript::new();
    t.replace_all(
        vec![mk("a", None), mk("c", Some("missing")), mk("d", Some("c"))],
        Some(id("d")),
    );
    let s = sel(&t, Budget::UNLIMITED);
    assert_eq!(s.counts.path_entries, 2);
    assert_eq!(s.context_start, Some(id("c")));
    assert_eq!(s.context(), t.context().unwrap());

    let mut t = Transcript::new();
    t.replace_all(
        vec![
            mk("x", Some("z")),
            mk("y", Some("x")),
            mk("z", Some("y")),
            mk("w", Some("z")),
        ],
        Some(id("w")),
    );
    assert!(matches!(
        select_resident(&t, t.leaf(), Budget::UNLIMITED),
        Err(ResidentError::ParentCycle(_))
    ));
}

/// A store-like source: answers facts and sizes from an "index" and
/// records which payloads were loaded.
struct IndexedSource {
    entries: HashMap<EntryId, Entry>,
    facts: HashMap<EntryId, (EntryFacts, u64)>,
    loaded: RefCell<Vec<EntryId>>,
    fail_on: Option<EntryId>,
}

#[derive(Debug, thiserror::Error)]
#[error("disk read failed at {0}")]
struct DiskError(EntryId);

impl IndexedSource {
    fn of(t: &Transcript) -> Self {
        IndexedSource {
            entries: t
                .entries()
                .iter()
                .map(|e| (e.id.clone(), e.clone()))
                .collect(),
            facts: t
                .entries()
                .iter()
                .map(|e| (e.id.clone(), (EntryFacts::of(e), entry_size(e))))
                .collect(),
            loaded: RefCell::new(Vec::new()),
            fail_on: None,
        }
    }
}

impl EntrySource for IndexedSource {
    type Error = DiskError;
    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, DiskError> {
        if self.fail_on.as_ref() == Some(id) {
            return Err(DiskError(id.clone()));
        }
        self.loaded.borrow_mut().push(id.clone());
        Ok(self.entries.get(id).map(Cow::Borrowed))
    }
    fn children(&self, _id: &EntryId, _limit: usize) -> Result<ChildLinks, DiskError> {
        Ok(ChildLinks::default())
    }
    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, DiskError> {
        Ok(self.facts.get(id).map(|(f, _)| f.clone()))
    }
    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, DiskError> {
        Ok(self.facts.get(id).map(|(_, s)| *s))
    }
}

#[test]
fn only_resident_payloads_are_loaded_from_an_indexed_source() {
    let mut b = B::new();
    b.model("p", "m");
    for i in 0..2000 {
        b.user(&format!("{i:04} {}", "z".repeat(200)));
    }
    let src = IndexedSource::of(&b.t);
    let s = select_resident(&src, b.t.leaf(), Budget::new(4096, 1000)).unwrap();
    assert!(!s.complete);
    assert!(s.counts.resident_entries > 0 && s.counts.resident_entries < 30);
    assert_eq!(s.counts.path_entries, 2001);
    // The model setting is found at the root without loading it.
    assert_eq!(s.model, Some(("p".into(), "m".into())));
    let loaded = src.loaded.borrow();
    assert_eq!(
        loaded.len() as u64,
        s.counts.resident_entries,
        "payloads beyond the budget must not be loaded"
    );
    let same = select_resident(&b.t, b.t.leaf(), Budget::new(4096, 1000)).unwrap();
    assert_eq!(s.entries, same.entries);
    assert_eq!(s.counts, same.counts);
}

#[test]
fn source_errors_are_propagated() {
    let mut b = B::new();
    b.user("u1");
    let u2 = b.user("u2");
    let mut src = IndexedSource::of(&b.t);
    src.fail_on = Some(u2.clone());
    match select_resident(&src, Some(&u2), Budget::UNLIMITED) {
        Err(ResidentError::Source(DiskError(at))) => assert_eq!(at, u2),
        other => panic!("expected a source error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------
// Property tests: random transcripts, resident context vs full context.
// ---------------------------------------------------------------------

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 300,
        rng_seed: RngSeed::Fixed(0x5b00_1c0d),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn resident_context_equals_full_context_with_enough_budget(
        ops in ops(), leaf_pick in any::<u16>()
    ) {
        let t = build(&ops, leaf_pick);
        let s = select_resident(&t, t.leaf(), Budget::UNLIMITED).unwrap();
        prop_assert!(s.complete);
        prop_assert_eq!(s.context(), t.context().unwrap());
        let path = t.current_path().unwrap();
        prop_assert_eq!(s.counts.path_entries, path.len() as u64);
        let start = context_start(&path);
        let segment: Vec<&Entry> = path[start..].to_vec();
        prop_assert_eq!(s.entries.iter().map(|e| &**e).collect::<Vec<_>>(), segment.clone());
        prop_assert_eq!(s.context_start.as_ref(), segment.first().map(|e| &e.id));
        // The segment alone yields the same messages as the whole path.
        prop_assert_eq!(context_messages(&segment), context_messages(&path));
    }

    #[test]
    fn bounded_selection_invariants(
        ops in ops(),
        leaf_pick in any::<u16>(),
        bytes_max in 0u64..3000,
        events_max in 0u64..40,
    ) {
        let t = build(&ops, leaf_pick);
        let budget = Budget::new(bytes_max, events_max);
        let s = select_resident(&t, t.leaf(), budget).unwrap();
        let c = s.counts;
        prop_assert!(c.resident_bytes <= bytes_max);
        prop_assert!(c.resident_entries + c.omitted_entries <= events_max);
        prop_assert_eq!(
            c.resident_entries + c.omitted_entries + c.beyond_budget_entries,
            c.context_entries
        );
        prop_assert_eq!(c.resident_bytes, s.entries.iter().map(|e| entry_size(e)).sum::<u64>());
        for e in &s.entries {
            prop_assert_eq!(Some(&**e), t.get(&e.id));
        }
        for o in &s.omitted {
            let e = t.get(&o.id).unwrap();
            prop_assert_eq!(o.size, entry_size(e));
            prop_assert!(o.size > bytes_max);
            prop_assert_eq!(o.kind.as_str(), e.kind_name());
        }
        // Besides the pinned compaction, resident + omitted entries are
        // exactly the newest entries of the context segment.
        let path = t.current_path().unwrap();
        let segment = &path[context_start(&path)..];
        prop_assert_eq!(segment.len() as u64, c.context_entries);
        // The leaf is never dropped for an older entry.
        let leaf_omitted = s.omitted.iter().any(|o| {
            Some(&o.id) == t.leaf()
                && matches!(o.kind.as_str(), "message" | "custom_message" | "branch_summary")
        });
        if leaf_omitted {
            prop_assert!(s.entries.is_empty());
            prop_assert_eq!(s.omitted.len(), 1);
        }
        let pinned = s.pinned.as_ref();
        let expect_pin = s.path_facts.as_ref().and_then(|f| f.compaction.as_ref()).map(|a| &a.id);
        prop_assert_eq!(pinned, if events_max > 0 && !leaf_omitted { expect_pin } else { None });
        // No tool result is held without its call: when the latest
        // assistant message before a held result on the path made its
        // call, that message is held too.
        let held_ids: Vec<&EntryId> = s.entries.iter().map(|e| &e.id).collect();
        for (k, e) in segment.iter().enumerate() {
            let EntryKind::Message { message: spool_runtime::transcript::Message::ToolResult { tool_call_id, .. } } = &e.kind else { continue };
            if !held_ids.contains(&&e.id) { continue; }
            let call = segment[..k].iter().rev().find(|p| matches!(&p.kind, EntryKind::Message { message: spool_runtime::transcript::Message::Assistant { .. } }));
            if let Some(a) = call {
                let EntryKind::Message { message: spool_runtime::transcript::Message::Assistant { content, .. } } = &a.kind else { continue };
                if content.iter().any(|b| matches!(b, spool_runtime::transcript::ContentBlock::ToolCall { id, .. } if id == tool_call_id)) {
                    prop_assert!(held_ids.contains(&&a.id), "result {} held without its call {}", e.id, a.id);
                }
            }
        }
        let mut held: Vec<&EntryId> = s.entries.iter().map(|e| &e.id).collect();
        held.extend(s.omitted.iter().map(|o| &o.id));
        if let Some(p) = pinned {
            prop_assert!(held.contains(&p), "the pinned compaction is held");
            prop_assert!(segment.iter().any(|e| &e.id == p));
        }
        held.retain(|h| Some(*h) != pinned);
        let rest: Vec<&Entry> = segment.iter().copied().filter(|e| Some(&e.id) != pinned).collect();
        // Besides the pin, the held entries are the newest of the segment,
        // less tool results dropped with their calls.
        let oldest = rest.iter().position(|e| held.contains(&&e.id)).unwrap_or(rest.len());
        let mut dropped = 0usize;
        for e in &rest[oldest..] {
            if !held.contains(&&e.id) {
                dropped += 1;
                prop_assert!(
                    matches!(&e.kind, EntryKind::Message { message: spool_runtime::transcript::Message::ToolResult { .. } }),
                    "only tool results are passed over: {:?}", e.kind
                );
            }
        }
        let taken = held.len();
        prop_assert_eq!(rest.len() - oldest, taken + dropped);
        // Held entries are in path order.
        let order: Vec<&EntryId> = s.entries.iter().map(|e| &e.id).collect();
        let mut in_path: Vec<&EntryId> = segment.iter().map(|e| &e.id).filter(|i| order.contains(i)).collect();
        in_path.dedup();
        prop_assert_eq!(order, in_path);
        // The walk stopped only because the next entry did not fit (when
        // no result was dropped at its oldest end, which hides where).
        let result_before = oldest > 0 && matches!(
            &rest[oldest - 1].kind,
            EntryKind::Message { message: spool_runtime::transcript::Message::ToolResult { .. } }
        );
        if c.beyond_budget_entries > 0 && !leaf_omitted && dropped == 0 && oldest > 0 && !result_before {
            let next = rest[oldest - 1];
            let size = entry_size(next);
            prop_assert!(
                c.resident_entries + c.omitted_entries == events_max
                    || (size <= bytes_max && size > bytes_max - c.resident_bytes)
            );
        }
        prop_assert_eq!(s.complete, c.resident_entries == c.context_entries);
        let full = t.context().unwrap();
        let ctx = s.context();
        if s.complete {
            prop_assert_eq!(&ctx, &full);
        }
        // Every message of the bounded context comes from a resident entry.
        for m in &ctx.messages {
            if let Some(i) = &m.entry_id {
                prop_assert!(s.get(i).is_some());
            }
        }
        prop_assert_eq!(ctx.model, full.model);
        prop_assert_eq!(ctx.thinking_level, full.thinking_level);
    }
}

// ---------------------------------------------------------------------
// Extending a selection by entries appended under its leaf.
// ---------------------------------------------------------------------

/// An entry kind for a chain appended under the leaf: `(kind, a, size)`.
fn chain_kind((k, a, size): (u8, u16, usize)) -> EntryKind {
    let text = "w".repeat(size);
    match k % 8 {
        0 | 1 => EntryKind::Message {
            message: spool_runtime::transcript::Message::User {
                content: vec![spool_runtime::transcript::ContentBlock::text(text)],
            },
        },
        2 => EntryKind::Message {
            message: spool_runtime::transcript::Message::Assistant {
                content: vec![spool_runtime::transcript::ContentBlock::text(text)],
                stop_reason: spool_runtime::transcript::StopReason::Stop,
                usage: spool_runtime::transcript::Usage::default(),
                model: (a % 2 == 0).then(|| format!("p/m{}", a % 5)),
                error_message: None,
            },
        },
        3 => EntryKind::ModelChange {
            provider: "p".into(),
            model_id: format!("x{}", a % 3),
        },
        4 => EntryKind::ThinkingLevelChange {
            thinking_level: format!("t{}", a % 3),
        },
        5 => EntryKind::Custom {
            custom_type: "c".into(),
            data: serde_json::json!({ "t": text }).into(),
        },
        6 => EntryKind::Label {
            target_id: id("e1"),
            label: Some(text),
        },
        _ => EntryKind::Reset,
    }
}

fn chain_strategy() -> impl Strategy<Value = Vec<(u8, u16, usize)>> {
    let size = prop_oneof![6 => 0usize..400, 1 => 1500usize..3500];
    prop::collection::vec((any::<u8>(), any::<u16>(), size), 1..6)
}

/// Appends `kinds` as a chain under the leaf of `t`.
fn append_chain(t: &mut Transcript, kinds: Vec<EntryKind>) -> Vec<Entry> {
    let mut out = Vec::new();
    for (n, kind) in kinds.into_iter().enumerate() {
        let e = Entry {
            id: id(&format!("n{n}")),
            parent_id: t.leaf().cloned(),
            timestamp_ms: 9_000 + n as i64,
            kind,
        };
        t.append(e.clone()).unwrap();
        out.push(e);
    }
    out
}

/// Extends the selection of the leaf by one user entry and checks it
/// against the selection of the new leaf, sizes included.
fn extend_matches(b: &mut B, budget: Budget, text: &str) {
    let s = select_resident(&b.t, b.t.leaf(), budget).unwrap();
    let sizes: SharedSeq<u64> = s.entries.iter().map(|e| entry_size(e)).collect();
    let appended = appended_user(b, text);
    let want = select_resident(&b.t, b.t.leaf(), budget).unwrap();
    let want_sizes: SharedSeq<u64> = want.entries.iter().map(|e| entry_size(e)).collect();
    let leaf_omitted = s.omitted.iter().any(|o| {
        s.leaf.as_ref() == Some(&o.id)
            && s.pinned.as_ref() != Some(&o.id)
            && matches!(
                o.kind.as_str(),
                "message" | "custom_message" | "branch_summary"
            )
    });
    if (leaf_omitted || entry_size(&appended[0]) > budget.bytes_max) && budget.events_max > 0 {
        // An oversized new leaf, or a selection whose oversized leaf ended
        // it, is for the full selection.
        assert_eq!(s.extended(&sizes, &appended), None);
    } else {
        assert_eq!(s.extended(&sizes, &appended), Some((want, want_sizes)));
    }
}

/// Appends a user entry under the leaf; the chain `extended` is given.
fn appended_user(b: &mut B, text: &str) -> Vec<Entry> {
    let id = b.user(text);
    vec![b.t.get(&id).expect("just appended").clone()]
}

/// A compaction that keeps the segment before it is pinned while older
/// held entries are dropped around it: held before it, held as the leaf
/// (its links gain the appended entry once everything older is gone), and
/// among omitted records on both sides.
#[test]
fn extended_keeps_a_pinned_compaction_that_is_not_the_oldest_held() {
    // The pin is the leaf with one kept entry before it; two events: the
    // older entry goes, the pin gains its child.
    let mut b = B::new();
    b.user("zero");
    let kept = b.user("kept");
    b.compaction("summary", &kept);
    extend_matches(&mut b, Budget::new(10_000, 2), "after");

    // The same with room for three: nothing dropped, the pin stays second.
    let mut b = B::new();
    let kept = b.user("kept");
    b.compaction("summary", &kept);
    extend_matches(&mut b, Budget::new(10_000, 3), "after");

    // Omitted records (oversized) before and after the pin; the byte
    // budget drops the oldest, step after step.
    let big = "x".repeat(700);
    let mut b = B::new();
    let kept = b.user(&big);
    b.user("small one");
    b.user(&big);
    b.compaction("summary", &kept);
    b.user(&big);
    b.user("small two");
    let budget = Budget::new(600, 6);
    for step in 0..6 {
        let text = if step % 2 == 0 {
            big.clone()
        } else {
            format!("small {step}")
        };
        extend_matches(&mut b, budget, &text);
    }

    // An oversized compaction (pinned as an omitted record) after two
    // oversized kept entries: the older records go, the pin's place among
    // the omitted ones moves.
    let mut b = B::new();
    let kept = b.user(&big);
    b.user(&big);
    b.compaction(&big, &kept);
    let budget = Budget::new(600, 4);
    for step in 0..4 {
        extend_matches(&mut b, budget, &format!("small {step}"));
    }
}

/// An extension shares the entries it keeps instead of cloning their
/// pointers (its cost follows the appended and dropped entries, not the
/// resident ones), and entries that left the window are released once the
/// dropped ones outnumber the kept ones (these are far below the byte
/// budget): a long sliding window keeps memory bounded.
#[test]
fn extended_shares_kept_entries_and_releases_dropped_ones() {
    let mut b = B::new();
    for i in 0..200 {
        b.user(&format!("entry {i}"));
    }
    let budget = Budget::new(1 << 20, 100);
    let mut s = select_resident(&b.t, b.t.leaf(), budget).unwrap();
    let mut sizes: SharedSeq<u64> = s.entries.iter().map(|e| entry_size(e)).collect();
    assert_eq!(s.entries.len(), 100);
    let oldest = s.entries[0].clone();
    let middle = s.entries[50].clone();
    let before = std::sync::Arc::strong_count(&middle);
    for step in 0..1000 {
        let appended = appended_user(&mut b, "more");
        let (next, next_sizes) = s.extended(&sizes, &appended).expect("extended");
        if step == 0 {
            // Held by the arena both selections share: not cloned.
            assert_eq!(std::sync::Arc::strong_count(&middle), before);
        }
        assert_eq!(next.entries.len(), 100);
        s = next;
        sizes = next_sizes;
    }
    let want = select_resident(&b.t, b.t.leaf(), budget).unwrap();
    assert_eq!(s, want);
    // Only this test holds them now.
    assert_eq!(std::sync::Arc::strong_count(&oldest), 1);
    assert_eq!(std::sync::Arc::strong_count(&middle), 1);
}

#[test]
fn extended_refuses_what_needs_the_source() {
    let mut b = B::new();
    let first = b.user("one");
    b.user("two");
    let budget = Budget::new(10_000, 10);
    let s = select_resident(&b.t, b.t.leaf(), budget).unwrap();
    let sizes: SharedSeq<u64> = s.entries.iter().map(|e| entry_size(e)).collect();
    let under = |parent: Option<EntryId>, kind: EntryKind| Entry {
        id: id("z1"),
        parent_id: parent,
        timestamp_ms: 1,
        kind,
    };
    let plain = || EntryKind::Custom {
        custom_type: "c".into(),
        data: serde_json::json!(1).into(),
    };
    // Nothing appended, not under the leaf, a compaction, wrong sizes.
    assert!(s.extended(&sizes, &[]).is_none());
    assert!(s
        .extended(&sizes, &[under(Some(first.clone()), plain())])
        .is_none());
    assert!(s.extended(&sizes, &[under(None, plain())]).is_none());
    let compaction = EntryKind::Compaction {
        summary: "s".into(),
        first_kept_entry_id: first,
        tokens_before: 1,
    };
    assert!(s
        .extended(&sizes, &[under(b.t.leaf().cloned(), compaction)])
        .is_none());
    assert!(s
        .extended(
            &sizes.iter().skip(1).copied().collect(),
            &[under(b.t.leaf().cloned(), plain())]
        )
        .is_none());
    // An empty leaf has no path facts to extend.
    let empty = select_resident(&Transcript::new(), None, budget).unwrap();
    assert!(empty
        .extended(&SharedSeq::new(), &[under(None, plain())])
        .is_none());
    // Under the leaf: extended.
    assert!(s
        .extended(&sizes, &[under(b.t.leaf().cloned(), plain())])
        .is_some());
}

proptest! {
    #![proptest_config(config())]

    /// Extending the selection of a leaf by a chain appended under it
    /// gives exactly the selection of the new leaf (and the sizes of its
    /// entries), whatever the tree, the budget and the chain (oversized
    /// entries, resets, model and thinking changes, labels, custom
    /// entries), with the pinned compaction and the omitted records of the
    /// old selection.
    #[test]
    fn extended_selection_equals_the_selection_of_the_new_leaf(
        ops in ops(),
        leaf_pick in any::<u16>(),
        bytes_max in 0u64..3000,
        events_max in 0u64..30,
        chain in chain_strategy(),
    ) {
        let mut t = build(&ops, leaf_pick);
        prop_assume!(t.leaf().is_some());
        let budget = Budget::new(bytes_max, events_max);
        let s = select_resident(&t, t.leaf(), budget).unwrap();
        let sizes: SharedSeq<u64> = s.entries.iter().map(|e| entry_size(e)).collect();
        let appended = append_chain(&mut t, chain.into_iter().map(chain_kind).collect());
        let want = select_resident(&t, t.leaf(), budget).unwrap();
        let want_sizes: SharedSeq<u64> = want.entries.iter().map(|e| entry_size(e)).collect();
        let got = s.extended(&sizes, &appended);
        // Given the appended entries' sizes (as a store's receipt gives
        // them), the same; sizes not one per entry are refused.
        let appended_sizes: Vec<u64> = appended.iter().map(entry_size).collect();
        prop_assert_eq!(&s.extended_measured(&sizes, &appended, &appended_sizes), &got);
        prop_assert_eq!(s.extended_measured(&sizes, &appended, &appended_sizes[1..]), None);
        // Entries held before and after are shared, not copied.
        if let Some((g, _)) = &got {
            for e in &g.entries {
                if let Some(old) = s.entries.iter().find(|o| o.id == e.id) {
                    prop_assert!(std::sync::Arc::ptr_eq(old, e));
                }
            }
        }
        match got {
            Some(g) => prop_assert_eq!(g, (want, want_sizes)),
            // Deferred to the full selection (an oversized leaf, now or
            // before, or a tool result whose call is not held), which
            // only a selection that holds something can need.
            None => prop_assert!(events_max > 0),
        }
    }
}

// ---------------------------------------------------------------------
// The walk through path ranges and single-chain links (what the log
// store's active-path index answers) equals the plain walk.
// ---------------------------------------------------------------------

/// A [`Transcript`] answering [`EntrySource::path_range`] for its current
/// path and [`EntrySource::single_chain`] truthfully, refusing the range
/// call number `refuse_at` (a racing write, as a store sees it) and
/// counting the calls the walk makes.
struct RangedSource<'a> {
    t: &'a Transcript,
    refuse_at: Option<usize>,
    ranges: RefCell<Vec<(u64, u64)>>,
    facts: RefCell<usize>,
    children: RefCell<usize>,
}

impl<'a> RangedSource<'a> {
    fn new(t: &'a Transcript, refuse_at: Option<usize>) -> Self {
        RangedSource {
            t,
            refuse_at,
            ranges: RefCell::new(Vec::new()),
            facts: RefCell::new(0),
            children: RefCell::new(0),
        }
    }
}

impl EntrySource for RangedSource<'_> {
    type Error = std::convert::Infallible;
    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, Self::Error> {
        self.t.entry(id)
    }
    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, Self::Error> {
        *self.children.borrow_mut() += 1;
        EntrySource::children(self.t, id, limit)
    }
    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, Self::Error> {
        *self.facts.borrow_mut() += 1;
        self.t.facts(id)
    }
    fn path_range(
        &self,
        leaf: &EntryId,
        leaf_depth: u64,
        start: u64,
        end: u64,
        _bytes_max: u64,
    ) -> Result<Option<Vec<(EntryId, u64)>>, Self::Error> {
        let mut calls = self.ranges.borrow_mut();
        calls.push((start, end));
        if self.refuse_at == Some(calls.len() - 1) {
            return Ok(None);
        }
        let path = self.t.current_path().unwrap();
        if self.t.leaf() != Some(leaf) || path.len() as u64 != leaf_depth + 1 || end > leaf_depth {
            return Ok(None);
        }
        Ok(Some(
            path[start as usize..=end as usize]
                .iter()
                .map(|e| (e.id.clone(), entry_size(e)))
                .collect(),
        ))
    }
    /// Stored facts, as a store keeps them (not walked through `facts`).
    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, Self::Error> {
        Ok(Some(path_facts_by_walk(self.t, id).unwrap()))
    }
    fn single_chain(&self, leaf: &EntryId, path_entries: u64) -> Result<Option<bool>, Self::Error> {
        let indexed = self
            .t
            .entries()
            .iter()
            .filter(|e| self.t.get(&e.id) == Some(*e))
            .count();
        let path = self.t.current_path().unwrap();
        Ok(Some(
            self.t.leaf() == Some(leaf)
                && path.len() as u64 == path_entries
                && indexed == path.len(),
        ))
    }
}

/// A chain of user entries of the given text sizes.
fn chain_of(sizes: &[usize]) -> Transcript {
    let mut b = B::new();
    for (n, s) in sizes.iter().enumerate() {
        b.user(&format!("{n} {}", "c".repeat(*s)));
    }
    b.t
}

#[test]
fn a_chain_is_walked_by_ranges_and_its_links_come_from_the_walk() {
    // 300 entries of ~1 KiB: a 64 KiB budget holds about 60, across two
    // ranges (the first ends at the leaf's 64-depth block boundary).
    let t = chain_of(&[1000; 300]);
    let budget = Budget::new(64 * 1024, 1024);
    let src = RangedSource::new(&t, None);
    let got = select_resident(&src, t.leaf(), budget).unwrap();
    assert_eq!(got, select_resident(&t, t.leaf(), budget).unwrap());
    assert!(!got.complete && got.counts.resident_entries > 50);
    // No facts and no children lookups: sizes and ids from the ranges,
    // links from the walk.
    assert_eq!(*src.facts.borrow(), 0);
    assert_eq!(*src.children.borrow(), 0);
    let ranges = src.ranges.borrow();
    assert_eq!(
        ranges[0],
        (257, 299),
        "first range up to the block boundary"
    );
    assert!(ranges.len() >= 2);
    for w in ranges.windows(2) {
        assert_eq!(w[1].1 + 1, w[0].0, "ranges follow each other upwards");
    }
    // The leaf has no children; every other resident entry the next one.
    let last = got.links.last().unwrap();
    assert_eq!((last.children.len(), last.children_total), (0, 0));
    for (l, next) in got.links.iter().zip(got.entries.iter().skip(1)) {
        assert_eq!(
            (&l.children[..], l.children_total),
            (&[next.id.clone()][..], 1)
        );
    }
}

#[test]
fn a_refused_range_turns_the_rest_of_the_walk_into_the_parent_walk() {
    let t = chain_of(&[1000; 300]);
    let budget = Budget::new(64 * 1024, 1024);
    let want = select_resident(&t, t.leaf(), budget).unwrap();
    let plain = RangedSource::new(&t, None);
    select_resident(&plain, t.leaf(), budget).unwrap();
    let asked = plain.ranges.borrow().len();
    assert!(asked >= 2);
    for refuse_at in 0..asked {
        let src = RangedSource::new(&t, Some(refuse_at));
        assert_eq!(
            select_resident(&src, t.leaf(), budget).unwrap(),
            want,
            "range {refuse_at} refused"
        );
        assert!(*src.facts.borrow() > 0, "the walk went on parent by parent");
    }
}

proptest! {
    #![proptest_config(config())]

    /// Any tree (branched or not, any leaf), any budget, any refused
    /// range: the ranged walk equals the plain one.
    #[test]
    fn the_ranged_walk_equals_the_plain_walk(
        ops in ops(),
        leaf_pick in any::<u16>(),
        bytes_max in 0u64..3000,
        events_max in 0u64..40,
        refuse_at in proptest::option::of(0usize..4),
    ) {
        let t = build(&ops, leaf_pick);
        let budget = Budget::new(bytes_max, events_max);
        let src = RangedSource::new(&t, refuse_at);
        prop_assert_eq!(
            select_resident(&src, t.leaf(), budget).unwrap(),
            select_resident(&t, t.leaf(), budget).unwrap()
        );
    }

    /// Long chains with oversized entries (omitted, the walk goes on):
    /// ranges across block boundaries, chain links.
    #[test]
    fn ranged_chains_equal_the_plain_walk(
        sizes in prop::collection::vec(prop_oneof![8 => 0usize..600, 1 => 3000usize..5000], 1..200),
        bytes_max in 0u64..8000,
        events_max in 0u64..200,
        refuse_at in proptest::option::of(0usize..4),
    ) {
        let t = chain_of(&sizes);
        let budget = Budget::new(bytes_max, events_max);
        let src = RangedSource::new(&t, refuse_at);
        prop_assert_eq!(
            select_resident(&src, t.leaf(), budget).unwrap(),
            select_resident(&t, t.leaf(), budget).unwrap()
        );
    }
}
