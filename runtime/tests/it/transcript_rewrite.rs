//! Rewrite planning: replacements, parent repair, mapping and deltas,
//! trailing removal (the retained-data scenario), truncation, redaction.

use crate::transcript_support;

use std::borrow::Cow;
use std::cell::RefCell;
use std::collections::HashSet;
use std::convert::Infallible;

use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use spool_runtime::transcript::{
    entry_size, redact, remove_trailing_entries, select_resident, truncate_tool_results, Budget,
    ChildLinks, ContentBlock, Entry, EntryFacts, EntryId, EntryKind, EntrySource, Message,
    Replacement, RewriteError, RewritePlan, StopReason, Transcript, TranscriptVersion,
    TOOL_RESULT_TRUNCATE_BYTES_MIN,
};
use transcript_support::{build, id, ops, render, B};

const V: TranscriptVersion = TranscriptVersion {
    generation: 3,
    raw_seq: 40,
    updated_at_ms: 7,
};

/// Records which payloads were loaded.
struct Loads<'a> {
    t: &'a Transcript,
    loaded: RefCell<Vec<EntryId>>,
}

impl<'a> Loads<'a> {
    fn new(t: &'a Transcript) -> Self {
        Loads {
            t,
            loaded: RefCell::new(Vec::new()),
        }
    }
}

impl EntrySource for Loads<'_> {
    type Error = Infallible;
    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, Infallible> {
        self.loaded.borrow_mut().push(id.clone());
        self.t.entry(id)
    }
    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, Infallible> {
        EntrySource::children(self.t, id, limit)
    }
    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, Infallible> {
        self.t.facts(id)
    }
    /// Sizes come from an "index" (here: computed without counting a load).
    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, Infallible> {
        Ok(self.t.get(id).map(entry_size))
    }
}

fn is_failed_assistant(e: &Entry) -> bool {
    matches!(
        &e.kind,
        EntryKind::Message {
            message: Message::Assistant {
                stop_reason: StopReason::Aborted | StopReason::Error,
                ..
            }
        }
    )
}

fn is_custom(f: &EntryFacts) -> bool {
    f.kind == "custom"
}

fn plan(t: &Transcript, reps: &[(EntryId, Replacement)]) -> RewritePlan {
    RewritePlan::prepare(t, t.leaf(), reps, V).expect("plan")
}

/// The seed's retained-data scenario at the pure level, for several
/// payloads: an aborted assistant followed by a custom payload; the
/// assistant is removed, the payload kept byte-exact and re-parented, and
/// the payload is never loaded.
#[test]
fn retained_data_scenario() {
    let payloads = [
        serde_json::Value::String("p".repeat(5 * 1024 * 1024)),
        serde_json::Value::Null,
        serde_json::Value::Bool(true),
        serde_json::Value::String("q".repeat(3 * 1024 * 1024)),
    ];
    for payload in payloads {
        let mut b = B::new();
        b.user("hello");
        b.assistant("hi");
        let u = b.user("do it");
        let aborted = b.assistant_full(
            vec![ContentBlock::text("partial")],
            StopReason::Aborted,
            None,
        );
        let custom = b.custom("plugin-state", payload.clone());
        let before_bytes = serde_json::to_vec(b.t.get(&custom).unwrap()).unwrap();
        let src = Loads::new(&b.t);

        let scan =
            remove_trailing_entries(&src, b.t.leaf(), &is_failed_assistant, &is_custom).unwrap();
        assert_eq!(
            scan.replacements,
            vec![(aborted.clone(), Replacement::Remove)]
        );
        assert_eq!(scan.preserved, vec![custom.clone()]);
        assert_eq!(scan.boundary, Some(u.clone()));
        assert_eq!(scan.examined, 3);

        let p = RewritePlan::prepare(&src, b.t.leaf(), &scan.replacements, V).unwrap();
        assert!(
            !src.loaded.borrow().contains(&custom),
            "the custom payload is never loaded"
        );
        assert_eq!(p.generation, 4);
        assert_eq!(p.removed, vec![aborted.clone()]);
        assert_eq!(p.reparented, vec![(custom.clone(), Some(u.clone()))]);
        assert!(p.written.is_empty());
        assert_eq!(p.new_leaf, Some(custom.clone()));
        assert_eq!(p.entries_delta, -1);
        let aborted_size = entry_size(b.t.get(&aborted).unwrap()) as i64;
        // Ids of equal length: re-parenting changes no bytes.
        assert_eq!(p.bytes_delta, -aborted_size);
        assert_eq!(p.facts_stale, vec![custom.clone()]);
        let m: Vec<_> = p
            .mapping
            .iter()
            .map(|m| (&m.source, m.destination.as_ref(), m.successor.as_ref()))
            .collect();
        assert_eq!(
            m,
            [(&aborted, None, Some(&u)), (&custom, Some(&custom), None)]
        );

        let next = p.apply_to(&b.t).unwrap();
        assert_eq!(next.len(), b.t.len() - 1);
        assert!(next.get(&aborted).is_none());
        let kept = next.get(&custom).unwrap();
        assert_eq!(kept.parent_id, Some(u.clone()));
        match &kept.kind {
            EntryKind::Custom { data, .. } => assert!(data == &payload, "payload byte-exact"),
            other => panic!("{other:?}"),
        }
        let mut expect = b.t.get(&custom).unwrap().clone();
        expect.parent_id = Some(u.clone());
        assert_eq!(kept, &expect);
        let after_bytes = serde_json::to_vec(kept).unwrap();
        assert_eq!(after_bytes.len(), before_bytes.len());
        assert_eq!(next.leaf(), Some(&custom));

        // A 4 KiB resident selection of the new generation: the payload is
        // omitted (big) or resident (small), never dropped or cut.
        let s = select_resident(&next, next.leaf(), Budget::new(4096, 100)).unwrap();
        if entry_size(kept) > 4096 {
            assert_eq!(s.omitted[0].id, custom);
            assert_eq!(s.omitted[0].size, entry_size(kept));
        } else {
            assert_eq!(s.get(&custom), Some(kept));
        }
        assert_eq!(
            render(&next.context().unwrap()).last().unwrap(),
            "user:do it"
        );

        // Idempotence: nothing left to remove, with the proof.
        let again =
            remove_trailing_entries(&next, next.leaf(), &is_failed_assistant, &is_custom).unwrap();
        assert!(again.replacements.is_empty());
        assert_eq!(again.boundary, Some(u.clone()));
        assert!(plan(&next, &again.replacements).is_empty());
    }
}

#[test]
fn trailing_removal_spans_several_failures_and_preserved_entries() {
    let mut b = B::new();
    let u = b.user("u");
    let a1 = b.assistant_full(vec![], StopReason::Error, None);
    let c1 = b.custom("s", serde_json::json!(1));
    let a2 = b.assistant_full(vec![], StopReason::Aborted, None);
    let c2 = b.custom("s", serde_json::json!(2));
    let scan = remove_trailing_entries(&b.t, b.t.leaf(), &is_failed_assistant, &is_custom).unwrap();
    assert_eq!(
        scan.replacements,
        vec![
            (a2.clone(), Replacement::Remove),
            (a1.clone(), Replacement::Remove)
        ]
    );
    assert_eq!(scan.preserved, vec![c2.clone(), c1.clone()]);
    let p = plan(&b.t, &scan.replacements);
    assert_eq!(
        p.reparented,
        vec![
            (c2.clone(), Some(c1.clone())),
            (c1.clone(), Some(u.clone()))
        ]
    );
    let next = p.apply_to(&b.t).unwrap();
    let path: Vec<_> = next
        .current_path()
        .unwrap()
        .iter()
        .map(|e| e.id.clone())
        .collect();
    assert_eq!(path, [u.clone(), c1, c2]);

    // No match at all: zero removals with the boundary as proof.
    let mut b = B::new();
    b.user("u");
    let a = b.assistant("fine");
    let scan = remove_trailing_entries(&b.t, b.t.leaf(), &is_failed_assistant, &is_custom).unwrap();
    assert!(scan.replacements.is_empty());
    assert_eq!(scan.boundary, Some(a));
    // Everything matches: the walk reaches the root, no boundary.
    let mut b = B::new();
    b.assistant_full(vec![], StopReason::Aborted, None);
    let scan = remove_trailing_entries(&b.t, b.t.leaf(), &is_failed_assistant, &is_custom).unwrap();
    assert_eq!(scan.replacements.len(), 1);
    assert_eq!(scan.boundary, None);
    let next = plan(&b.t, &scan.replacements).apply_to(&b.t).unwrap();
    assert!(next.is_empty() && next.leaf().is_none());
}

#[test]
fn removing_a_chain_repairs_parents_and_moves_the_leaf() {
    let mut b = B::new();
    let u1 = b.user("u1");
    let x = b.user("x");
    let y = b.user("y");
    let side = b.user("side-of-y");
    b.at(&y);
    let z = b.user("z");
    let leaf = b.user("leaf");
    let reps = vec![
        (x.clone(), Replacement::Remove),
        (y.clone(), Replacement::Remove),
        (leaf.clone(), Replacement::Remove),
    ];
    let p = plan(&b.t, &reps);
    assert_eq!(p.new_leaf, Some(z.clone()));
    let mut rep = p.reparented.clone();
    rep.sort();
    let mut want = vec![
        (side.clone(), Some(u1.clone())),
        (z.clone(), Some(u1.clone())),
    ];
    want.sort();
    assert_eq!(rep, want);
    let next = p.apply_to(&b.t).unwrap();
    assert_eq!(next.children_ids(&u1), [side, z.clone()]);
    assert_eq!(next.leaf(), Some(&z));
    let sizes_before: u64 = b.t.entries().iter().map(entry_size).sum();
    let sizes_after: u64 = next.entries().iter().map(entry_size).sum();
    assert_eq!(sizes_after as i64 - sizes_before as i64, p.bytes_delta);
}

#[test]
fn replacing_a_child_of_a_removed_entry_also_repairs_its_parent() {
    let mut b = B::new();
    let u = b.user("u");
    let gone = b.user("gone");
    let kept = b.assistant("old text");
    let kind = EntryKind::Message {
        message: Message::User {
            content: vec![ContentBlock::text("new text")],
        },
    };
    let reps = vec![
        (kept.clone(), Replacement::Replace(kind.clone())),
        (gone.clone(), Replacement::Remove),
    ];
    let p = plan(&b.t, &reps);
    assert!(p.reparented.is_empty());
    assert_eq!(p.written.len(), 1);
    assert_eq!(p.written[0].parent_id, Some(u.clone()));
    assert_eq!(p.written[0].kind, kind);
    assert_eq!(p.mapping[0].reparented_to, Some(Some(u)));
    assert!(p.mapping[0].content_replaced);
}

#[test]
fn invalid_requests_are_refused() {
    let mut b = B::new();
    let u = b.user("u");
    let ghost = id("ghost");
    assert!(matches!(
        RewritePlan::prepare(&b.t, b.t.leaf(), &[(ghost.clone(), Replacement::Remove)], V),
        Err(RewriteError::UnknownEntry(g)) if g == ghost
    ));
    assert!(matches!(
        RewritePlan::prepare(
            &b.t,
            b.t.leaf(),
            &[
                (u.clone(), Replacement::Remove),
                (u.clone(), Replacement::Remove)
            ],
            V
        ),
        Err(RewriteError::DuplicateReplacement(_))
    ));
    let p = plan(&b.t, &[]);
    assert!(p.is_empty());
    // A plan for another transcript does not apply.
    let other = B::new();
    assert!(plan(&b.t, &[(u, Replacement::Remove)])
        .apply_to(&other.t)
        .is_err());
}

fn text_of(e: &Entry) -> String {
    match &e.kind {
        EntryKind::Message {
            message: Message::ToolResult { content, .. },
        } => content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

#[test]
fn tool_results_are_truncated_with_a_marker_and_idempotently() {
    let mut b = B::new();
    b.calls(&[("c1", "read"), ("c2", "grep")]);
    let big = b.result("c1", "read", &"é".repeat(5000)); // 10,000 bytes
    let small = b.result("c2", "grep", "short");
    let user = b.user(&"u".repeat(10_000));
    let reps = truncate_tool_results(b.t.entries(), 1000);
    assert_eq!(reps.len(), 1, "only the big tool result");
    assert_eq!(reps[0].0, big);
    let next = plan(&b.t, &reps).apply_to(&b.t).unwrap();
    let t = text_of(next.get(&big).unwrap());
    assert!(t.len() <= 1000, "{}", t.len());
    let kept = t.split('\n').next().unwrap();
    assert!(kept.chars().all(|c| c == 'é'));
    assert!(t.ends_with(&format!("[truncated {} bytes]", 10_000 - kept.len())));
    assert_eq!(next.get(&small), b.t.get(&small));
    assert_eq!(next.get(&user), b.t.get(&user));
    assert!(truncate_tool_results(next.entries(), 1000).is_empty());

    // Several text blocks: the cut falls in the second, the third is
    // dropped, the image stays; tiny limits are raised to the minimum.
    let mut b = B::new();
    b.calls(&[("c", "t")]);
    let r = b.add(EntryKind::Message {
        message: Message::ToolResult {
            tool_call_id: "c".into(),
            tool_name: "t".into(),
            content: vec![
                ContentBlock::text("a".repeat(30)),
                ContentBlock::Image {
                    mime_type: "image/png".into(),
                    data: "AAAA".into(),
                },
                ContentBlock::text("b".repeat(300)),
                ContentBlock::text("c".repeat(300)),
            ],
            is_error: false,
        },
    });
    let reps = truncate_tool_results(b.t.entries(), 1);
    let next = plan(&b.t, &reps).apply_to(&b.t).unwrap();
    let EntryKind::Message {
        message: Message::ToolResult { content, .. },
    } = &next.get(&r).unwrap().kind
    else {
        panic!()
    };
    assert_eq!(content.len(), 3);
    assert!(matches!(content[1], ContentBlock::Image { .. }));
    assert!(text_of(next.get(&r).unwrap()).len() as u64 <= TOOL_RESULT_TRUNCATE_BYTES_MIN);
    assert!(truncate_tool_results(next.entries(), 1).is_empty());
}

#[test]
fn redaction_rewrites_message_text_but_not_plugin_state() {
    let mut b = B::new();
    let u = b.user("my key is SECRET-123");
    let a = b.assistant("noted SECRET-123");
    let c = b.custom("state", serde_json::json!("SECRET-123"));
    let clean = b.user("nothing here");
    let s = b.compaction("summary mentions SECRET-123", &u);
    let matcher = |t: &str| t.replace("SECRET-123", "[redacted]");
    let reps = redact(b.t.entries(), &matcher);
    let touched: HashSet<_> = reps.iter().map(|(i, _)| i.clone()).collect();
    assert_eq!(touched, HashSet::from([u.clone(), a.clone(), s.clone()]));
    let next = plan(&b.t, &reps).apply_to(&b.t).unwrap();
    let rendered = render(&next.context().unwrap()).join("|");
    assert!(!rendered.contains("SECRET-123"), "{rendered}");
    assert!(rendered.contains("[redacted]"));
    assert_eq!(next.get(&c), b.t.get(&c));
    assert_eq!(next.get(&clean), b.t.get(&clean));
    assert!(redact(next.entries(), &matcher).is_empty(), "idempotent");
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 300,
        rng_seed: RngSeed::Fixed(0x2e_3717e),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    /// Random removals and replacements: the new generation keeps every
    /// other entry, repairs parents so each kept entry's ancestry is its
    /// old ancestry minus the removed entries, and the deltas are exact.
    #[test]
    fn plans_repair_parents_and_report_exact_deltas(
        ops in ops(),
        leaf_pick in any::<u16>(),
        picks in prop::collection::vec((any::<u16>(), any::<bool>()), 0..12),
    ) {
        let t = build(&ops, leaf_pick);
        prop_assume!(!t.is_empty());
        let mut reps: Vec<(EntryId, Replacement)> = Vec::new();
        let mut seen = HashSet::new();
        for (i, remove) in picks {
            let e = &t.entries()[usize::from(i) % t.len()];
            if !seen.insert(e.id.clone()) {
                continue;
            }
            reps.push((
                e.id.clone(),
                if remove {
                    Replacement::Remove
                } else {
                    Replacement::Replace(EntryKind::SessionInfo { name: Some(format!("r{i}")) })
                },
            ));
        }
        let p = plan(&t, &reps);
        let next = p.apply_to(&t).unwrap();
        let removed: HashSet<&EntryId> = p.removed.iter().collect();
        prop_assert_eq!(next.len(), t.len() - removed.len());
        prop_assert_eq!(p.entries_delta, -(removed.len() as i64));
        let before: u64 = t.entries().iter().map(entry_size).sum();
        let after: u64 = next.entries().iter().map(entry_size).sum();
        prop_assert_eq!(after as i64 - before as i64, p.bytes_delta);
        for e in t.entries() {
            if removed.contains(&e.id) {
                prop_assert!(next.get(&e.id).is_none());
                continue;
            }
            let old_path: Vec<EntryId> = t.root_path(&e.id).unwrap().iter()
                .map(|x| x.id.clone()).filter(|x| !removed.contains(x)).collect();
            let new_path: Vec<EntryId> = next.root_path(&e.id).unwrap().iter()
                .map(|x| x.id.clone()).collect();
            prop_assert_eq!(old_path, new_path);
        }
        // The new leaf is the old one, or its nearest kept ancestor.
        let want_leaf = t.leaf().and_then(|l| {
            t.root_path(l).unwrap().iter().rev()
                .find(|x| !removed.contains(&x.id)).map(|x| x.id.clone())
        });
        prop_assert_eq!(next.leaf(), want_leaf.as_ref());
        // Running the removals again finds nothing (idempotence).
        let again: Vec<(EntryId, Replacement)> = reps.iter()
            .filter(|(i, _)| next.contains(i)).cloned().collect();
        let p2 = plan(&next, &again);
        prop_assert!(p2.removed.is_empty());
        prop_assert!(p2.reparented.is_empty());
    }
}
