//! Sample entries, states and events shared by the codec's unit tests.

use crate::session::definition::AgentDefinition;
use crate::session::events::SessionEvent;
use crate::session::state::AgentState;
use crate::transcript::{ContentBlock, Entry, EntryId, EntryKind, Message, StopReason, Usage};

pub(super) fn id(s: &str) -> EntryId {
    EntryId::parse(s).unwrap()
}

/// Entries of every kind, with the optional fields both ways, long
/// strings (str16/str32 forms) and integers of every width.
pub(super) fn samples() -> Vec<Entry> {
    let text = |n: usize| "é".repeat(n);
    let blocks = vec![
        ContentBlock::text("hi"),
        ContentBlock::thinking(text(200)),
        ContentBlock::Thinking {
            thinking: text(20),
            signature: Some("sig".repeat(100)),
            redacted: true,
        },
        ContentBlock::Image {
            mime_type: "image/png".into(),
            data: "x".repeat(70_000),
        },
    ];
    let kinds = vec![
        EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(text(3))],
            },
        },
        EntryKind::Message {
            message: Message::User { content: vec![] },
        },
        EntryKind::Message {
            message: Message::Assistant {
                content: blocks.clone(),
                stop_reason: StopReason::ToolUse,
                usage: Usage {
                    input_tokens: 1,
                    output_tokens: 300,
                    cache_read_tokens: 70_000,
                    cache_write_tokens: u64::MAX,
                },
                model: Some("p/m".into()),
                error_message: Some(String::new()),
            },
        },
        EntryKind::Message {
            message: Message::Assistant {
                content: vec![ContentBlock::text("a")],
                stop_reason: StopReason::Stop,
                usage: Usage::default(),
                model: None,
                error_message: None,
            },
        },
        EntryKind::Message {
            message: Message::Assistant {
                content: vec![ContentBlock::ToolCall {
                    id: "c1".into(),
                    name: "read".into(),
                    arguments: serde_json::json!({"path": "/x", "n": [1, -2.5, null]}).into(),
                    signature: Some("s".into()),
                }],
                stop_reason: StopReason::Aborted,
                usage: Usage::default(),
                model: None,
                error_message: Some("e".into()),
            },
        },
        EntryKind::Message {
            message: Message::ToolResult {
                tool_call_id: "c1".into(),
                tool_name: "read".into(),
                content: blocks,
                is_error: true,
            },
        },
        EntryKind::Custom {
            custom_type: "state".into(),
            data: serde_json::json!({"k": [1, 2]}).into(),
        },
        EntryKind::CustomMessage {
            custom_type: "tool_output".into(),
            content: vec![ContentBlock::text(text(40))],
            display: true,
            details: None,
        },
        EntryKind::CustomMessage {
            custom_type: "t".into(),
            content: vec![],
            display: false,
            details: Some(serde_json::json!("d").into()),
        },
        EntryKind::BranchSummary {
            from_id: Some(id("f")),
            summary: "s".into(),
        },
        EntryKind::BranchSummary {
            from_id: None,
            summary: String::new(),
        },
        EntryKind::Compaction {
            summary: "c".into(),
            first_kept_entry_id: id("k"),
            tokens_before: 1 << 40,
        },
        EntryKind::Reset,
        EntryKind::ModelChange {
            provider: "p".into(),
            model_id: "m".into(),
        },
        EntryKind::ThinkingLevelChange {
            thinking_level: "high".into(),
        },
        EntryKind::Label {
            target_id: id("t"),
            label: Some("l".into()),
        },
        EntryKind::Label {
            target_id: id("t"),
            label: None,
        },
        EntryKind::SessionInfo {
            name: Some("n".into()),
        },
        EntryKind::SessionInfo { name: None },
    ];
    let stamps = [0i64, 5, -1, -200, 1_700_000_000_000, i64::MIN, i64::MAX];
    kinds
        .into_iter()
        .enumerate()
        .map(|(i, kind)| Entry {
            id: id(&format!("e{i}")),
            parent_id: (i % 2 == 0).then(|| id(&"p".repeat(1 + i * 7))),
            timestamp_ms: stamps[i % stamps.len()],
            kind,
        })
        .collect()
}

/// A state around `entries`: every field set (JSON metadata, a model
/// with parameters, tasks, an error, usage), the leaf on the last entry.
pub(super) fn state_of(entries: Vec<Entry>) -> AgentState {
    use super::super::definition::ModelConfig;
    use super::super::state::{ExecutionStatus, Task, TaskStatus};
    let mut transcript = crate::transcript::Transcript::new();
    let leaf = entries.last().map(|e| e.id.clone());
    transcript.replace_all(entries, leaf);
    let mut model = ModelConfig::new("p", "m");
    model
        .params
        .insert("temperature".into(), serde_json::json!(0.5).into());
    AgentState {
        transcript,
        generation: 3,
        system_prompt: "é".repeat(40),
        model,
        execution_count: 1 << 33,
        execution: ExecutionStatus::Failed,
        last_error: Some("boom".into()),
        usage: Usage {
            input_tokens: 1,
            output_tokens: 2,
            cache_read_tokens: 3,
            cache_write_tokens: 4,
        },
        total_usage: Usage::default(),
        tasks: vec![Task::new("t1", "do", TaskStatus::InProgress)],
        ..AgentState::default()
    }
    .with_metadata("k", serde_json::json!({"a": [1, -2.5, null, "s"]}))
}

pub(super) fn has_json(e: &Entry) -> bool {
    match &e.kind {
        EntryKind::Custom { .. } => true,
        EntryKind::CustomMessage { details, .. } => details.is_some(),
        EntryKind::Message {
            message: Message::Assistant { content, .. },
        } => content
            .iter()
            .any(|b| matches!(b, ContentBlock::ToolCall { .. })),
        _ => false,
    }
}

/// Transcripts to carry: every sample (JSON entries included, read by
/// serde one by one), the samples without JSON, one entry, none.
pub(super) fn transcripts() -> Vec<Vec<Entry>> {
    let all = samples();
    let plain: Vec<Entry> = all.iter().filter(|e| !has_json(e)).cloned().collect();
    vec![
        all,
        plain.clone(),
        plain.into_iter().take(1).collect(),
        vec![],
    ]
}

pub(super) fn created(state: AgentState, parent: bool) -> SessionEvent {
    SessionEvent::Created {
        id: super::super::SessionId::generate(),
        parent_id: parent.then(super::super::SessionId::generate),
        agent_name: "agent".into(),
        label: "a label".into(),
        created_at_ms: -5,
        definition: Box::new(AgentDefinition::new("agent", "d", "sp")),
        state: Box::new(state),
    }
}

/// Calls `check` with every truncation of `bytes` and with every
/// single-byte flip (five masks) of every byte after the schema byte.
pub(super) fn for_each_damage(bytes: &[u8], check: impl Fn(&[u8])) {
    for n in 0..bytes.len() {
        check(&bytes[..n]);
    }
    for i in 1..bytes.len() {
        for x in [0x01u8, 0x10, 0x20, 0x80, 0xff] {
            let mut b = bytes.to_vec();
            b[i] ^= x;
            check(&b);
        }
    }
}
