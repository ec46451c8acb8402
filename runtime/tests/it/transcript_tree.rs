//! Tree queries and navigation on the in-memory transcript.

use crate::transcript_support;

use spool_runtime::transcript::{
    ContentBlock, Entry, EntryKind, Message, Navigation, Transcript, TranscriptError,
};
use transcript_support::{id, render, B};

fn user_entry(i: &str, p: Option<&str>) -> Entry {
    Entry {
        id: id(i),
        parent_id: p.map(id),
        timestamp_ms: 0,
        kind: EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(i)],
            },
        },
    }
}

fn ids(v: &[&Entry]) -> Vec<String> {
    v.iter().map(|e| e.id.to_string()).collect()
}

/// e1 ─ e2 ─ e3
///        ├─ e4 ─ e5
///        └─ e6
fn branched() -> B {
    let mut b = B::new();
    b.user("u1"); // e1
    let e2 = b.assistant("a1"); // e2
    b.user("u2"); // e3
    b.at(&e2);
    b.user("u2b"); // e4
    b.assistant("a2b"); // e5
    b.at(&e2);
    b.user("u2c"); // e6
    b
}

#[test]
fn children_are_in_append_order() {
    let b = branched();
    assert_eq!(ids(&b.t.children(&id("e2"))), ["e3", "e4", "e6"]);
    assert_eq!(b.t.children_ids(&id("e4")), [id("e5")]);
    assert!(b.t.children(&id("e5")).is_empty());
    assert!(b.t.children(&id("unknown")).is_empty());
    assert_eq!(b.t.child_count(&id("e2")), 3);
}

#[test]
fn paths_to_root_and_from_root() {
    let b = branched();
    assert_eq!(
        ids(&b.t.path_to_root(&id("e5")).unwrap()),
        ["e5", "e4", "e2", "e1"]
    );
    assert_eq!(
        ids(&b.t.root_path(&id("e5")).unwrap()),
        ["e1", "e2", "e4", "e5"]
    );
    assert_eq!(ids(&b.t.current_path().unwrap()), ["e1", "e2", "e6"]);
    assert_eq!(
        b.t.path_to_root(&id("zz")),
        Err(TranscriptError::UnknownEntry(id("zz")))
    );
}

#[test]
fn get_uses_the_index_after_append_replace_all_and_serde() {
    let b = branched();
    assert_eq!(b.t.get(&id("e4")).unwrap().id, id("e4"));
    let json = serde_json::to_string(&b.t).unwrap();
    // The serialized form is only entries and leaf.
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        v.as_object().unwrap().keys().collect::<Vec<_>>(),
        ["entries", "leaf"]
    );
    let back: Transcript = serde_json::from_str(&json).unwrap();
    assert_eq!(back, b.t);
    assert_eq!(back.get(&id("e5")).unwrap().id, id("e5"));
    assert_eq!(ids(&back.children(&id("e2"))), ["e3", "e4", "e6"]);
    let mp = rmp_serde::to_vec_named(&b.t).unwrap();
    let back: Transcript = rmp_serde::from_slice(&mp).unwrap();
    assert_eq!(back, b.t);
    assert!(back.contains(&id("e6")));

    let mut t = Transcript::new();
    t.replace_all(b.t.entries().to_vec(), Some(id("e3")));
    assert_eq!(t.get(&id("e3")).unwrap().id, id("e3"));
    assert_eq!(t.leaf(), Some(&id("e3")));
    t.replace_all(Vec::new(), None);
    assert!(t.get(&id("e3")).is_none());
    assert!(t.is_empty());
}

#[test]
fn append_refuses_duplicates_and_unknown_parents() {
    let mut b = branched();
    assert_eq!(
        b.t.append(user_entry("e1", None)),
        Err(TranscriptError::DuplicateEntry(id("e1")))
    );
    assert_eq!(
        b.t.append(user_entry("x", Some("nope"))),
        Err(TranscriptError::UnknownEntry(id("nope")))
    );
    assert_eq!(b.t.len(), 6);
}

#[test]
fn duplicate_ids_from_replace_all_keep_the_first() {
    let mut t = Transcript::new();
    let mut dup = user_entry("a", None);
    dup.timestamp_ms = 99;
    t.replace_all(vec![user_entry("a", None), dup], Some(id("a")));
    assert_eq!(t.get(&id("a")).unwrap().timestamp_ms, 0);
    assert_eq!(t.roots().len(), 1);
    assert_eq!(t.tree().len(), 1);
}

#[test]
fn orphans_are_roots_and_their_path_stops() {
    let mut t = Transcript::new();
    t.replace_all(
        vec![
            user_entry("a", None),
            user_entry("c", Some("missing")),
            user_entry("d", Some("c")),
        ],
        Some(id("d")),
    );
    assert_eq!(ids(&t.roots()), ["a", "c"]);
    assert_eq!(ids(&t.root_path(&id("d")).unwrap()), ["c", "d"]);
    assert_eq!(t.common_ancestor(&id("a"), &id("d")).unwrap(), None);
}

#[test]
fn parent_cycles_are_reported_not_looped() {
    let mut t = Transcript::new();
    t.replace_all(
        vec![user_entry("a", Some("b")), user_entry("b", Some("a"))],
        Some(id("a")),
    );
    assert_eq!(
        t.path_to_root(&id("a")),
        Err(TranscriptError::ParentCycle(id("a")))
    );
    assert!(matches!(t.context(), Err(TranscriptError::ParentCycle(_))));
    // Entries on a cycle are unreachable from any root.
    assert!(t.tree().is_empty());
    let mut t = Transcript::new();
    t.replace_all(vec![user_entry("s", Some("s"))], Some(id("s")));
    assert!(t.path_to_root(&id("s")).is_err());
}

/// A replaced transcript builds its lookups on the first query that needs
/// them: answers are those of a transcript built by appends, appends after
/// a replacement (on a copy made before any query, which shares the
/// entries until then) keep them current and leave the original alone,
/// and cutting a path without the lookups keeps the first of duplicated
/// ids.
#[test]
fn lookups_are_built_on_demand_and_kept_current() {
    let mut b = branched();
    b.label(&id("e4"), Some("four"));
    let mut replaced = Transcript::new();
    replaced.replace_all(b.t.entries().to_vec(), b.t.leaf().cloned());
    let mut copy = replaced.clone();
    assert_eq!(replaced.tree(), b.t.tree());
    assert_eq!(replaced.labels(), b.t.labels());
    assert_eq!(replaced.branch_points(), b.t.branch_points());

    // The copy was made before any query: its own lookups, built by the
    // append's checks, then kept current by it.
    let leaf = b.t.leaf().cloned().unwrap();
    let under = user_entry("new", Some(leaf.as_str()));
    copy.append(under.clone()).unwrap();
    b.t.append(under).unwrap();
    assert_eq!(copy.tree(), b.t.tree());
    assert_eq!(copy.children_ids(&leaf), [id("new")]);
    assert!(!replaced.contains(&id("new")));
    assert!(replaced.children_ids(&leaf).is_empty());
    assert_eq!(replaced.len() + 1, copy.len());

    // Cutting a shared transcript copies the path and leaves the other.
    let shared = copy.clone();
    let path = shared.into_complete_path(&id("e5")).unwrap();
    assert_eq!(ids(&path.current_path().unwrap()), ["e1", "e2", "e4", "e5"]);
    assert_eq!(copy.tree(), b.t.tree());

    // Duplicated ids: the first occurrence is the path's, with or without
    // the lookups built.
    let mut dup = user_entry("a", None);
    dup.timestamp_ms = 99;
    let entries = vec![user_entry("a", None), dup, user_entry("b", Some("a"))];
    let mut unbuilt = Transcript::new();
    unbuilt.replace_all(entries.clone(), Some(id("b")));
    let mut built = Transcript::new();
    built.replace_all(entries, Some(id("b")));
    assert!(built.contains(&id("a")));
    for t in [unbuilt, built] {
        let path = t.into_complete_path(&id("b")).unwrap();
        let stamps: Vec<i64> = path.entries().iter().map(|e| e.timestamp_ms).collect();
        assert_eq!(stamps, [0, 0]);
        assert_eq!(path.leaf(), Some(&id("b")));
        assert_eq!(ids(&path.current_path().unwrap()), ["a", "b"]);
    }

    // A child stored before its parent (as an import may order them): the
    // cut path is still root first, and only the path is kept.
    let entries = vec![
        user_entry("b", Some("a")),
        user_entry("x", None),
        user_entry("a", None),
        user_entry("c", Some("b")),
    ];
    let mut t = Transcript::new();
    t.replace_all(entries, Some(id("c")));
    let path = t.into_complete_path(&id("c")).unwrap();
    let order: Vec<&str> = path.entries().iter().map(|e| e.id.as_str()).collect();
    assert_eq!(order, ["a", "b", "c"]);
    assert_eq!(ids(&path.current_path().unwrap()), ["a", "b", "c"]);
}

#[test]
fn labels_set_clear_and_last_wins() {
    let mut b = B::new();
    let u1 = b.user("u1");
    let a1 = b.assistant("a1");
    b.label(&u1, Some("first"));
    b.label(&u1, Some("second"));
    b.label(&a1, Some("answer"));
    assert_eq!(b.t.label(&u1), Some("second"));
    assert_eq!(b.t.label(&a1), Some("answer"));
    b.label(&a1, None);
    assert_eq!(b.t.label(&a1), None);
    b.label(&u1, Some(""));
    assert_eq!(b.t.label(&u1), None);
    assert!(b.t.labels().is_empty());
    b.label(&u1, Some("again"));
    let labels = b.t.labels();
    assert_eq!(labels.len(), 1);
    assert_eq!(labels[&u1], "again");
    // Resolved labels are rebuilt after a round trip.
    let back: Transcript = serde_json::from_str(&serde_json::to_string(&b.t).unwrap()).unwrap();
    assert_eq!(back.labels(), labels);
    // Labels never enter the context.
    assert_eq!(render(&b.t.context().unwrap()), ["user:u1", "assistant:a1"]);
}

#[test]
fn plan_label_validates_the_target_and_appends_at_the_leaf() {
    let mut b = B::new();
    let u1 = b.user("u1");
    let a1 = b.assistant("a1");
    assert_eq!(
        b.t.plan_label(&id("nope"), Some("x".into()), 5),
        Err(TranscriptError::UnknownEntry(id("nope")))
    );
    let nav = b.t.plan_label(&u1, Some("start".into()), 5).unwrap();
    let Navigation::Append { entry } = &nav else {
        panic!("a label is an appended entry: {nav:?}");
    };
    assert_eq!(entry.parent_id.as_ref(), Some(&a1));
    assert_eq!(entry.timestamp_ms, 5);
    let label_id = entry.id.clone();
    b.t.apply(nav).unwrap();
    assert_eq!(b.t.label(&u1), Some("start"));
    assert_eq!(b.t.leaf(), Some(&label_id));
    // Clearing with an empty string is stored as a clear.
    let nav = b.t.plan_label(&u1, Some(String::new()), 6).unwrap();
    b.t.apply(nav).unwrap();
    assert_eq!(b.t.label(&u1), None);
}

#[test]
fn common_ancestor_cases() {
    let b = branched();
    let ca = |x: &str, y: &str| b.t.common_ancestor(&id(x), &id(y)).unwrap();
    assert_eq!(ca("e3", "e5"), Some(id("e2")));
    assert_eq!(ca("e5", "e6"), Some(id("e2")));
    assert_eq!(ca("e4", "e5"), Some(id("e4")));
    assert_eq!(ca("e5", "e4"), Some(id("e4")));
    assert_eq!(ca("e3", "e3"), Some(id("e3")));
    assert_eq!(ca("e1", "e6"), Some(id("e1")));
    assert_eq!(
        b.t.common_ancestor(&id("e1"), &id("zz")),
        Err(TranscriptError::UnknownEntry(id("zz")))
    );
    // Two separate roots share nothing.
    let mut b = B::new();
    let r1 = b.user("r1");
    b.t.set_leaf(None).unwrap();
    let r2 = b.user("r2");
    assert_eq!(b.t.common_ancestor(&r1, &r2).unwrap(), None);
}

#[test]
fn branch_points_are_entries_with_several_children() {
    let mut b = branched();
    assert_eq!(b.t.branch_points(), [id("e2")]);
    b.at(&id("e4"));
    b.user("u3b"); // second child of e4
    assert_eq!(b.t.branch_points(), [id("e2"), id("e4")]);
}

#[test]
fn tree_rows_in_preorder_with_flags_and_labels() {
    let mut b = branched();
    b.at(&id("e5"));
    b.label(&id("e2"), Some("fork here")); // e7, child of e5, now leaf
    let rows = b.t.tree();
    let order: Vec<String> = rows.iter().map(|r| r.id.to_string()).collect();
    assert_eq!(order, ["e1", "e2", "e3", "e4", "e5", "e7", "e6"]);
    let row = |i: &str| rows.iter().find(|r| r.id == id(i)).unwrap();
    assert_eq!(row("e2").label.as_deref(), Some("fork here"));
    assert_eq!(row("e2").children, [id("e3"), id("e4"), id("e6")]);
    assert_eq!(row("e1").depth, 0);
    assert_eq!(row("e5").depth, 3);
    assert_eq!(row("e2").branch_depth, 0);
    assert_eq!(row("e3").branch_depth, 1);
    assert_eq!(row("e5").branch_depth, 1);
    assert!(row("e7").is_leaf);
    assert!(!row("e5").is_leaf);
    for (i, on) in [
        ("e1", true),
        ("e2", true),
        ("e3", false),
        ("e4", true),
        ("e5", true),
        ("e6", false),
        ("e7", true),
    ] {
        assert_eq!(row(i).on_path, on, "{i}");
    }
    assert_eq!(row("e1").kind, "message");
    assert_eq!(row("e1").role, Some("user"));
    assert_eq!(row("e1").summary, "u1");
    assert_eq!(row("e7").kind, "label");
    assert_eq!(row("e7").summary, "e2 = fork here");
}

#[test]
fn tree_summary_is_one_line_and_bounded() {
    let mut b = B::new();
    let long = format!("line one\nline two {}", "é".repeat(200));
    b.user(&long);
    let rows = b.t.tree();
    let s = &rows[0].summary;
    assert!(!s.contains('\n'));
    assert!(s.starts_with("line one line two"));
    assert_eq!(
        s.chars().count(),
        spool_runtime::transcript::TREE_SUMMARY_CHARS_MAX
    );
    assert!(s.ends_with('…'));
}

#[test]
fn deep_linear_history_does_not_exhaust_the_stack() {
    let mut b = B::new();
    for i in 0..20_000 {
        b.user(&format!("m{i}"));
    }
    let rows = b.t.tree();
    assert_eq!(rows.len(), 20_000);
    assert_eq!(rows[19_999].depth, 19_999);
    assert_eq!(rows[19_999].branch_depth, 0);
    let json = serde_json::to_string(&rows).unwrap();
    assert!(json.len() > 20_000);
    assert_eq!(b.t.context().unwrap().messages.len(), 20_000);
}

#[test]
fn move_leaf_plans_and_applies() {
    let mut b = branched();
    assert_eq!(
        b.t.plan_move_leaf(Some(&id("zz"))),
        Err(TranscriptError::UnknownEntry(id("zz")))
    );
    let nav = b.t.plan_move_leaf(Some(&id("e3"))).unwrap();
    assert_eq!(nav, Navigation::MoveLeaf { to: Some(id("e3")) });
    b.t.apply(nav).unwrap();
    assert_eq!(
        render(&b.t.context().unwrap()),
        ["user:u1", "assistant:a1", "user:u2"]
    );
    let nav = b.t.plan_move_leaf(None).unwrap();
    b.t.apply(nav).unwrap();
    assert_eq!(b.t.leaf(), None);
    // The next append starts a new root.
    let r = b.user("fresh");
    assert_eq!(b.t.get(&r).unwrap().parent_id, None);
    assert_eq!(render(&b.t.context().unwrap()), ["user:fresh"]);
}

#[test]
fn branch_with_summary_appends_a_summary_child_of_the_target() {
    let mut b = branched();
    b.at(&id("e5"));
    assert!(b
        .t
        .plan_branch_with_summary(Some(&id("zz")), "s", 1)
        .is_err());
    let nav =
        b.t.plan_branch_with_summary(Some(&id("e2")), "left the e4 branch", 42)
            .unwrap();
    let Navigation::Append { entry } = &nav else {
        panic!("a branch summary is an appended entry: {nav:?}");
    };
    assert_eq!(entry.parent_id.as_ref(), Some(&id("e2")));
    assert_eq!(
        entry.kind,
        EntryKind::BranchSummary {
            from_id: Some(id("e5")),
            summary: "left the e4 branch".into()
        }
    );
    assert!(!b.t.contains(&entry.id));
    let sid = entry.id.clone();
    b.t.apply(nav).unwrap();
    assert_eq!(b.t.leaf(), Some(&sid));
    assert_eq!(b.t.children_ids(&id("e2")).last(), Some(&sid));
    assert_eq!(
        render(&b.t.context().unwrap()),
        [
            "user:u1",
            "assistant:a1",
            "branch_summary:left the e4 branch"
        ]
    );
    // Branching to before the root makes the summary a new root.
    let nav =
        b.t.plan_branch_with_summary(None, "from scratch", 43)
            .unwrap();
    b.t.apply(nav).unwrap();
    assert_eq!(
        render(&b.t.context().unwrap()),
        ["branch_summary:from scratch"]
    );
}

#[test]
fn fork_at_keeps_the_root_path_and_its_labels() {
    let mut b = branched();
    b.at(&id("e5"));
    b.label(&id("e1"), Some("root")); // e7 on the e5 path
    b.label(&id("e6"), Some("other branch")); // e8, target not on fork path
    b.at(&id("e4"));
    b.user("after"); // e9, parent e4
    let fork = b.t.fork_at(&id("e5"), 77).unwrap();
    // Path e1 e2 e4 e5, no label entries, then one fresh label entry.
    let kept: Vec<String> = fork.entries()[..4]
        .iter()
        .map(|e| e.id.to_string())
        .collect();
    assert_eq!(kept, ["e1", "e2", "e4", "e5"]);
    assert_eq!(fork.len(), 5);
    let label = &fork.entries()[4];
    assert_eq!(label.parent_id.as_ref(), Some(&id("e5")));
    assert_eq!(label.timestamp_ms, 77);
    assert_eq!(fork.leaf(), Some(&label.id));
    assert_eq!(fork.label(&id("e1")), Some("root"));
    assert_eq!(fork.label(&id("e6")), None);
    for e in &fork.entries()[..4] {
        assert_eq!(Some(e), b.t.get(&e.id));
    }
    assert_eq!(
        fork.context().unwrap(),
        b.t.context_at(Some(&id("e5"))).unwrap()
    );
    assert!(matches!(
        b.t.fork_at(&id("zz"), 0),
        Err(TranscriptError::UnknownEntry(_))
    ));
}

#[test]
fn fork_at_reattaches_entries_that_followed_a_label() {
    let mut b = B::new();
    let u1 = b.user("u1");
    b.label(&u1, Some("L")); // e2
    let a = b.assistant("a"); // e3, parent e2
    let fork = b.t.fork_at(&a, 1).unwrap();
    assert_eq!(fork.get(&a).unwrap().parent_id.as_ref(), Some(&u1));
    assert_eq!(fork.label(&u1), Some("L"));
    assert!(!fork.contains(&id("e2")));
    assert_eq!(render(&fork.context().unwrap()), ["user:u1", "assistant:a"]);
}
