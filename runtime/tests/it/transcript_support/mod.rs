//! Shared builders for the transcript tests.
#![allow(dead_code)]

use proptest::prelude::*;
use spool_runtime::transcript::{
    ContentBlock, ContextMessage, ContextRole, Entry, EntryId, EntryKind, Message, ModelContext,
    StopReason, Transcript, Usage,
};

pub fn id(s: &str) -> EntryId {
    EntryId::parse(s).expect("test ids are valid")
}

/// Builds a transcript with deterministic ids (`e1`, `e2`, ...) and
/// timestamps; every entry is appended as a child of the current leaf.
#[derive(Default)]
pub struct B {
    pub t: Transcript,
    n: u32,
}

impl B {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn add(&mut self, kind: EntryKind) -> EntryId {
        self.n += 1;
        let e = Entry {
            id: id(&format!("e{}", self.n)),
            parent_id: self.t.leaf().cloned(),
            timestamp_ms: i64::from(self.n),
            kind,
        };
        let eid = e.id.clone();
        self.t.append(e).expect("append");
        eid
    }

    pub fn at(&mut self, leaf: &EntryId) -> &mut Self {
        self.t.set_leaf(Some(leaf.clone())).expect("set leaf");
        self
    }

    pub fn user(&mut self, text: &str) -> EntryId {
        self.add(EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(text)],
            },
        })
    }

    pub fn assistant(&mut self, text: &str) -> EntryId {
        self.assistant_full(vec![ContentBlock::text(text)], StopReason::Stop, None)
    }

    pub fn assistant_model(&mut self, text: &str, model: &str) -> EntryId {
        self.assistant_full(
            vec![ContentBlock::text(text)],
            StopReason::Stop,
            Some(model.to_string()),
        )
    }

    pub fn assistant_full(
        &mut self,
        content: Vec<ContentBlock>,
        stop_reason: StopReason,
        model: Option<String>,
    ) -> EntryId {
        self.add(EntryKind::Message {
            message: Message::Assistant {
                content,
                stop_reason,
                usage: Usage::default(),
                model,
                error_message: None,
            },
        })
    }

    /// An assistant message calling tools `(call id, tool name)`.
    pub fn calls(&mut self, calls: &[(&str, &str)]) -> EntryId {
        self.calls_with(calls, StopReason::ToolUse)
    }

    pub fn calls_with(&mut self, calls: &[(&str, &str)], stop_reason: StopReason) -> EntryId {
        let content = calls
            .iter()
            .map(|(cid, name)| ContentBlock::ToolCall {
                id: cid.to_string(),
                name: name.to_string(),
                arguments: serde_json::json!({}).into(),
                signature: None,
            })
            .collect();
        self.assistant_full(content, stop_reason, None)
    }

    pub fn result(&mut self, call_id: &str, tool: &str, text: &str) -> EntryId {
        self.add(EntryKind::Message {
            message: Message::ToolResult {
                tool_call_id: call_id.to_string(),
                tool_name: tool.to_string(),
                content: vec![ContentBlock::text(text)],
                is_error: false,
            },
        })
    }

    pub fn compaction(&mut self, summary: &str, first_kept: &EntryId) -> EntryId {
        self.add(EntryKind::Compaction {
            summary: summary.to_string(),
            first_kept_entry_id: first_kept.clone(),
            tokens_before: 1000,
        })
    }

    pub fn reset(&mut self) -> EntryId {
        self.add(EntryKind::Reset)
    }

    pub fn branch_summary(&mut self, summary: &str) -> EntryId {
        let from = self.t.leaf().cloned();
        self.add(EntryKind::BranchSummary {
            from_id: from,
            summary: summary.to_string(),
        })
    }

    pub fn custom(&mut self, ty: &str, data: serde_json::Value) -> EntryId {
        self.add(EntryKind::Custom {
            custom_type: ty.to_string(),
            data: data.into(),
        })
    }

    pub fn custom_message(&mut self, ty: &str, text: &str) -> EntryId {
        self.add(EntryKind::CustomMessage {
            custom_type: ty.to_string(),
            content: vec![ContentBlock::text(text)],
            display: true,
            details: None,
        })
    }

    pub fn label(&mut self, target: &EntryId, label: Option<&str>) -> EntryId {
        self.add(EntryKind::Label {
            target_id: target.clone(),
            label: label.map(str::to_string),
        })
    }

    pub fn model(&mut self, provider: &str, model_id: &str) -> EntryId {
        self.add(EntryKind::ModelChange {
            provider: provider.to_string(),
            model_id: model_id.to_string(),
        })
    }

    pub fn thinking(&mut self, level: &str) -> EntryId {
        self.add(EntryKind::ThinkingLevelChange {
            thinking_level: level.to_string(),
        })
    }

    pub fn info(&mut self, name: &str) -> EntryId {
        self.add(EntryKind::SessionInfo {
            name: Some(name.to_string()),
        })
    }
}

/// A compact rendering of a context for assertions: `role:text`, tool
/// results as `tool_result(call):text`, synthetic ones marked with `*`.
pub fn render(ctx: &ModelContext) -> Vec<String> {
    ctx.messages.iter().map(render_one).collect()
}

pub fn render_one(m: &ContextMessage) -> String {
    let text: Vec<String> = m
        .content
        .iter()
        .map(|b| match b {
            ContentBlock::Text { text } => text.clone(),
            ContentBlock::ToolCall { id, .. } => format!("call({id})"),
            ContentBlock::Thinking { thinking, .. } => format!("thinking({thinking})"),
            ContentBlock::Image { .. } => "image".to_string(),
            _ => "?".to_string(),
        })
        .collect();
    let role = match m.role {
        ContextRole::ToolResult => format!(
            "tool_result({}){}",
            m.tool_call_id.as_deref().unwrap_or("?"),
            if m.is_synthetic() { "*" } else { "" }
        ),
        r => r.as_str().to_string(),
    };
    format!("{role}:{}", text.join(","))
}

// ---------------------------------------------------------------------
// Random transcripts for property tests.
// ---------------------------------------------------------------------

pub type Op = (u8, u16, u16);

/// Interprets generated ops as a transcript (deterministic).
pub fn build(ops: &[Op], leaf_pick: u16) -> Transcript {
    let mut b = B::new();
    let mut all: Vec<EntryId> = Vec::new();
    let mut calls: Vec<(String, String)> = Vec::new();
    let pick = |all: &Vec<EntryId>, a: u16| all[usize::from(a) % all.len()].clone();
    for (n, &(kind, a, x)) in ops.iter().enumerate() {
        let new = match kind % 14 {
            0 | 1 => b.user(&format!("u{n}")),
            2 | 3 => {
                let stop = match x % 6 {
                    0 => StopReason::Error,
                    1 => StopReason::Aborted,
                    _ => StopReason::Stop,
                };
                let model = (x.is_multiple_of(4)).then(|| format!("p/m{}", a % 3));
                b.assistant_full(
                    vec![spool_runtime::transcript::ContentBlock::text(format!(
                        "a{n}"
                    ))],
                    stop,
                    model,
                )
            }
            4 => {
                let k = usize::from(a % 3) + 1;
                let cs: Vec<(String, String)> = (0..k)
                    .map(|j| (format!("c{n}_{j}"), format!("t{j}")))
                    .collect();
                calls.extend(cs.iter().cloned());
                let refs: Vec<(&str, &str)> =
                    cs.iter().map(|(c, t)| (c.as_str(), t.as_str())).collect();
                let stop = if x.is_multiple_of(7) {
                    StopReason::Aborted
                } else {
                    StopReason::ToolUse
                };
                b.calls_with(&refs, stop)
            }
            5 | 6 => {
                if calls.is_empty() || x.is_multiple_of(5) {
                    b.result("ghost", "t", &format!("r{n}"))
                } else {
                    let (c, t) = calls[usize::from(a) % calls.len()].clone();
                    b.result(&c, &t, &format!("r{n}"))
                }
            }
            7 if !all.is_empty() => {
                let fk = pick(&all, a);
                b.compaction(&format!("S{n}"), &fk)
            }
            8 if x.is_multiple_of(3) => b.reset(),
            9 => b.branch_summary(if x.is_multiple_of(4) { "" } else { "B" }),
            10 => {
                if x.is_multiple_of(2) {
                    b.custom("state", serde_json::json!("d".repeat(usize::from(a % 300))))
                } else {
                    b.custom_message("cm", &"m".repeat(usize::from(a % 300)))
                }
            }
            11 if !all.is_empty() => {
                let t = pick(&all, a);
                b.label(&t, (!x.is_multiple_of(3)).then_some("L"))
            }
            12 => {
                if x.is_multiple_of(2) {
                    b.model("prov", &format!("m{}", a % 4))
                } else {
                    b.thinking(&format!("level{}", a % 3))
                }
            }
            13 if !all.is_empty() => {
                if x.is_multiple_of(10) {
                    b.t.set_leaf(None).unwrap();
                } else {
                    let t = pick(&all, a);
                    b.at(&t);
                }
                continue;
            }
            _ => b.user(&format!("u{n}")),
        };
        all.push(new);
    }
    if !all.is_empty() && !leaf_pick.is_multiple_of(5) {
        let l = pick(&all, leaf_pick);
        b.at(&l);
    }
    b.t
}

pub fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec((any::<u8>(), any::<u16>(), any::<u16>()), 0..80)
}
