//! Context building from the root→leaf path: the tree/context cases of the
//! well-known session-tree design plus spool's reset.

use crate::transcript_support;

use spool_runtime::transcript::{
    context_start, ContentBlock, ContextRole, Entry, EntryKind, Message, StopReason, Transcript,
    TranscriptError, SYNTHETIC_TOOL_RESULT_TEXT,
};
use transcript_support::{id, render, B};

fn ctx(b: &B) -> Vec<String> {
    render(&b.t.context().expect("context"))
}

#[test]
fn empty_transcript_and_leaf_none_give_empty_context() {
    let b = B::new();
    let c = b.t.context().unwrap();
    assert!(c.messages.is_empty());
    assert_eq!(c.model, None);
    assert_eq!(c.thinking_level, None);

    let mut b = B::new();
    b.user("hi");
    b.t.set_leaf(None).unwrap();
    assert!(b.t.context().unwrap().messages.is_empty());
}

#[test]
fn simple_conversation_in_path_order_and_json_shape() {
    let mut b = B::new();
    let u = b.user("hello");
    b.assistant("hi there");
    assert_eq!(ctx(&b), ["user:hello", "assistant:hi there"]);
    let c = b.t.context().unwrap();
    assert_eq!(c.messages[0].entry_id.as_ref(), Some(&u));
    let json = serde_json::to_value(&c.messages).unwrap();
    assert_eq!(json[0]["role"], "user");
    assert_eq!(json[0]["content"][0]["type"], "text");
    assert_eq!(json[0]["content"][0]["text"], "hello");
    assert_eq!(json[1]["role"], "assistant");
    assert_eq!(json[1]["stop_reason"], "stop");
    // Fields that do not apply are absent, not null.
    assert!(json[0].get("tool_call_id").is_none());
}

#[test]
fn compaction_keeps_from_first_kept_entry() {
    let mut b = B::new();
    b.user("u1");
    b.assistant("a1");
    let u2 = b.user("u2");
    b.assistant("a2");
    b.user("u3");
    b.assistant("a3");
    b.compaction("S1", &u2);
    b.user("u4");
    b.assistant("a4");
    assert_eq!(
        ctx(&b),
        [
            "compaction_summary:S1",
            "user:u2",
            "assistant:a2",
            "user:u3",
            "assistant:a3",
            "user:u4",
            "assistant:a4"
        ]
    );
    let path = b.t.current_path().unwrap();
    assert_eq!(path[context_start(&path)].id, u2);
}

#[test]
fn compaction_as_leaf_shows_summary_and_kept_entries() {
    let mut b = B::new();
    b.user("u1");
    let a1 = b.assistant("a1");
    b.compaction("S", &a1);
    assert_eq!(ctx(&b), ["compaction_summary:S", "assistant:a1"]);
}

#[test]
fn multiple_compactions_latest_wins() {
    let mut b = B::new();
    b.user("u1");
    b.assistant("a1");
    let u2 = b.user("u2");
    b.assistant("a2");
    b.compaction("S1", &u2);
    let u3 = b.user("u3");
    b.assistant("a3");
    b.compaction("S2", &u3);
    b.user("u4");
    assert_eq!(
        ctx(&b),
        [
            "compaction_summary:S2",
            "user:u3",
            "assistant:a3",
            "user:u4"
        ]
    );
}

#[test]
fn later_compaction_may_keep_entries_before_an_earlier_one() {
    // The earlier compaction entry inside the kept range contributes
    // nothing; only the latest summary is shown.
    let mut b = B::new();
    b.user("u1");
    let a1 = b.assistant("a1");
    b.user("u2");
    b.compaction("S1", &a1);
    b.user("u3");
    b.compaction("S2", &a1);
    b.user("u4");
    assert_eq!(
        ctx(&b),
        [
            "compaction_summary:S2",
            "assistant:a1",
            "user:u2",
            "user:u3",
            "user:u4"
        ]
    );
}

#[test]
fn compaction_whose_first_kept_is_not_on_the_path_keeps_nothing_before_it() {
    let mut b = B::new();
    let u1 = b.user("u1");
    let other = b.user("side branch");
    b.at(&u1);
    b.assistant("a1");
    b.compaction("S", &other);
    b.user("u2");
    assert_eq!(ctx(&b), ["compaction_summary:S", "user:u2"]);
}

#[test]
fn branches_yield_only_their_path() {
    let mut b = B::new();
    let u1 = b.user("u1");
    let a1 = b.assistant("a1 first");
    b.user("u2 first");
    b.at(&u1);
    let a1b = b.assistant("a1 second");
    b.user("u2 second");
    assert_eq!(
        ctx(&b),
        ["user:u1", "assistant:a1 second", "user:u2 second"]
    );
    assert_eq!(
        render(&b.t.context_at(Some(&a1)).unwrap()),
        ["user:u1", "assistant:a1 first"]
    );
    assert_eq!(
        render(&b.t.context_at(Some(&a1b)).unwrap()),
        ["user:u1", "assistant:a1 second"]
    );
}

#[test]
fn branch_summaries_on_the_path_are_included() {
    let mut b = B::new();
    let u1 = b.user("u1");
    b.assistant("abandoned");
    b.at(&u1);
    b.branch_summary("tried X, failed");
    b.user("u2");
    assert_eq!(
        ctx(&b),
        ["user:u1", "branch_summary:tried X, failed", "user:u2"]
    );
    // An empty branch summary adds no message.
    b.branch_summary("");
    assert_eq!(
        ctx(&b),
        ["user:u1", "branch_summary:tried X, failed", "user:u2"]
    );
}

#[test]
fn branch_summary_after_compaction_is_included() {
    let mut b = B::new();
    let u1 = b.user("u1");
    b.compaction("S", &u1);
    let u2 = b.user("u2");
    b.assistant("gone");
    b.at(&u2);
    b.branch_summary("B");
    assert_eq!(
        ctx(&b),
        [
            "compaction_summary:S",
            "user:u1",
            "user:u2",
            "branch_summary:B"
        ]
    );
}

#[test]
fn unknown_leaf_is_an_error() {
    let mut b = B::new();
    b.user("u1");
    assert_eq!(
        b.t.context_at(Some(&id("nope"))),
        Err(TranscriptError::UnknownEntry(id("nope")))
    );
}

#[test]
fn orphan_leaf_path_stops_at_the_missing_parent() {
    let mk = |i: &str, p: Option<&str>, text: &str| Entry {
        id: id(i),
        parent_id: p.map(id),
        timestamp_ms: 0,
        kind: EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(text)],
            },
        },
    };
    let mut t = Transcript::new();
    t.replace_all(
        vec![
            mk("a", None, "root"),
            mk("c", Some("b"), "orphan"),
            mk("d", Some("c"), "child"),
        ],
        Some(id("d")),
    );
    assert_eq!(render(&t.context().unwrap()), ["user:orphan", "user:child"]);
    let path = t.root_path(&id("d")).unwrap();
    assert_eq!(path.len(), 2);
    assert_eq!(path[0].id, id("c"));
}

#[test]
fn reset_is_a_hard_cut() {
    let mut b = B::new();
    b.user("u1");
    b.assistant("a1");
    b.reset();
    b.user("u2");
    assert_eq!(ctx(&b), ["user:u2"]);
    b.reset();
    assert!(ctx(&b).is_empty());
}

#[test]
fn reset_after_compaction_wins_and_compaction_after_reset_counts() {
    let mut b = B::new();
    let u1 = b.user("u1");
    b.compaction("S", &u1);
    b.user("u2");
    b.reset();
    b.user("u3");
    assert_eq!(ctx(&b), ["user:u3"]);
    let u4 = b.user("u4");
    b.compaction("S2", &u4);
    b.user("u5");
    assert_eq!(ctx(&b), ["compaction_summary:S2", "user:u4", "user:u5"]);
}

#[test]
fn compaction_keeping_from_before_a_reset_keeps_nothing_before_it() {
    let mut b = B::new();
    let u1 = b.user("u1");
    b.reset();
    b.user("u2");
    b.compaction("S", &u1);
    b.user("u3");
    assert_eq!(ctx(&b), ["compaction_summary:S", "user:u3"]);
}

#[test]
fn custom_entries_excluded_custom_messages_included() {
    let mut b = B::new();
    b.user("u1");
    b.custom("plugin-state", serde_json::json!({"k": 1}));
    b.custom_message("reminder", "remember X");
    b.assistant("a1");
    assert_eq!(ctx(&b), ["user:u1", "custom:remember X", "assistant:a1"]);
    let c = b.t.context().unwrap();
    assert_eq!(c.messages[1].custom_type.as_deref(), Some("reminder"));
}

#[test]
fn labels_session_info_and_settings_never_enter_the_context() {
    let mut b = B::new();
    let u1 = b.user("u1");
    b.label(&u1, Some("start"));
    b.info("my session");
    b.model("anthropic", "claude");
    b.thinking("high");
    b.assistant("a1");
    b.label(&u1, None);
    assert_eq!(ctx(&b), ["user:u1", "assistant:a1"]);
}

#[test]
fn tool_calls_pair_with_their_results() {
    let mut b = B::new();
    b.user("u1");
    b.calls(&[("c1", "read"), ("c2", "grep")]);
    b.result("c1", "read", "r1");
    b.result("c2", "grep", "r2");
    b.assistant("done");
    assert_eq!(
        ctx(&b),
        [
            "user:u1",
            "assistant:call(c1),call(c2)",
            "tool_result(c1):r1",
            "tool_result(c2):r2",
            "assistant:done"
        ]
    );
    let c = b.t.context().unwrap();
    assert_eq!(c.messages[2].tool_name.as_deref(), Some("read"));
    assert_eq!(c.messages[2].is_error, Some(false));
}

#[test]
fn orphan_tool_results_are_dropped() {
    // A result with no call at all.
    let mut b = B::new();
    b.user("u1");
    b.result("ghost", "read", "r");
    b.assistant("a");
    assert_eq!(ctx(&b), ["user:u1", "assistant:a"]);

    // A result whose call was compacted away.
    let mut b = B::new();
    b.user("u1");
    b.calls(&[("c1", "read")]);
    let r = b.result("c1", "read", "r1");
    b.compaction("S", &r);
    b.user("u2");
    assert_eq!(ctx(&b), ["compaction_summary:S", "user:u2"]);

    // A result whose call is before a reset.
    let mut b = B::new();
    b.calls(&[("c1", "read")]);
    b.reset();
    b.result("c1", "read", "r1");
    assert!(ctx(&b).is_empty());

    // A duplicate result for an answered call.
    let mut b = B::new();
    b.calls(&[("c1", "read")]);
    b.result("c1", "read", "first");
    b.result("c1", "read", "second");
    assert_eq!(ctx(&b), ["assistant:call(c1)", "tool_result(c1):first"]);
}

#[test]
fn unanswered_tool_call_gets_synthetic_error_result_when_conversation_moves_on() {
    let mut b = B::new();
    b.calls(&[("c1", "read"), ("c2", "grep")]);
    b.result("c2", "grep", "r2");
    b.user("stop that");
    assert_eq!(
        ctx(&b),
        [
            "assistant:call(c1),call(c2)",
            "tool_result(c2):r2",
            &format!("tool_result(c1)*:{SYNTHETIC_TOOL_RESULT_TEXT}"),
            "user:stop that"
        ]
    );
    let c = b.t.context().unwrap();
    assert_eq!(c.messages[2].is_error, Some(true));
    assert_eq!(c.messages[2].tool_name.as_deref(), Some("read"));
    assert!(c.messages[2].entry_id.is_none());

    // A late result after the synthetic one is an orphan.
    b.result("c1", "read", "late");
    assert_eq!(ctx(&b).len(), 4);
}

#[test]
fn trailing_unanswered_tool_call_stays_open() {
    let mut b = B::new();
    b.user("u1");
    b.calls(&[("c1", "read")]);
    assert_eq!(ctx(&b), ["user:u1", "assistant:call(c1)"]);
}

#[test]
fn errored_and_aborted_assistants_are_left_out_with_their_results() {
    let mut b = B::new();
    b.user("u1");
    b.calls_with(&[("c1", "read")], StopReason::Aborted);
    b.result("c1", "read", "r1");
    b.assistant_full(
        vec![ContentBlock::text("partial")],
        StopReason::Error,
        Some("openai/gpt".into()),
    );
    b.user("u2");
    assert_eq!(ctx(&b), ["user:u1", "user:u2"]);
    // The errored assistant's model still counts as the model setting.
    assert_eq!(
        b.t.context().unwrap().model,
        Some(("openai".to_string(), "gpt".to_string()))
    );
}

#[test]
fn model_and_thinking_level_come_from_the_path() {
    let mut b = B::new();
    assert_eq!(b.t.context().unwrap().model, None);
    let u1 = b.user("u1");
    b.model("anthropic", "claude-a");
    b.thinking("low");
    b.assistant("a1");
    let c = b.t.context().unwrap();
    assert_eq!(c.model, Some(("anthropic".into(), "claude-a".into())));
    assert_eq!(c.thinking_level.as_deref(), Some("low"));

    // An assistant's provider/model is newer than the change.
    b.assistant_model("a2", "openai/gpt-x");
    assert_eq!(
        b.t.context().unwrap().model,
        Some(("openai".into(), "gpt-x".into()))
    );
    // A model without a provider is not used.
    b.assistant_model("a3", "bare");
    assert_eq!(
        b.t.context().unwrap().model,
        Some(("openai".into(), "gpt-x".into()))
    );
    b.thinking("high");
    assert_eq!(
        b.t.context().unwrap().thinking_level.as_deref(),
        Some("high")
    );

    // Another branch does not see those settings.
    b.at(&u1);
    b.assistant("other");
    let c = b.t.context().unwrap();
    assert_eq!(c.model, None);
    assert_eq!(c.thinking_level, None);
}

#[test]
fn settings_survive_reset_and_compaction() {
    let mut b = B::new();
    b.model("p", "m");
    b.thinking("medium");
    let u = b.user("u");
    b.compaction("S", &u);
    b.reset();
    b.user("u2");
    let c = b.t.context().unwrap();
    assert_eq!(c.model, Some(("p".into(), "m".into())));
    assert_eq!(c.thinking_level.as_deref(), Some("medium"));
    assert_eq!(render(&c), ["user:u2"]);
}

#[test]
fn roles_serialize_as_snake_case() {
    let all = [
        (ContextRole::User, "user"),
        (ContextRole::Assistant, "assistant"),
        (ContextRole::ToolResult, "tool_result"),
        (ContextRole::Custom, "custom"),
        (ContextRole::CompactionSummary, "compaction_summary"),
        (ContextRole::BranchSummary, "branch_summary"),
    ];
    for (r, s) in all {
        assert_eq!(serde_json::to_value(r).unwrap(), s);
        assert_eq!(r.as_str(), s);
    }
}
