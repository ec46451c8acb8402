//! A model context in the shapes model APIs take: OpenAI Chat Completions
//! messages and an Anthropic Messages request body.
//!
//! Both start from a [`ModelContext`] (tool calls already paired with
//! results, errored turns left out) and the session's system prompt:
//!
//! * **OpenAI** ([`openai_messages`]): the system prompt first as a
//!   `system` message; user content as a string (one text block) or parts
//!   (`text`, `image_url` with a `data:` URL); assistant messages with their
//!   text as `content` (`null` when there is none) and `tool_calls`
//!   (`{"id", "type": "function", "function": {"name", "arguments"}}`,
//!   arguments as a JSON string); tool results as `role: "tool"` with their
//!   `tool_call_id` and text (their images follow in a user message, as
//!   tool messages take text only). Thinking is not sent back: the Chat
//!   Completions API takes none.
//! * **Anthropic** ([`anthropic_body`]): `{"system", "messages"}` (and
//!   `"model"` when known). Assistant thinking blocks keep their signature
//!   (`{"type": "thinking", "thinking", "signature"}`); a redacted block
//!   becomes `redacted_thinking` with its encrypted `data`; an unsigned
//!   block, which the API would refuse, becomes text. Tool calls are
//!   `tool_use` blocks; the results answering one assistant turn go in one
//!   user message of `tool_result` blocks (`tool_use_id`, `content`,
//!   `is_error`).
//!
//! In both, custom messages and branch summaries are user messages, and
//! the compaction summary a user message wrapped the way coding agents
//! phrase it. Empty text blocks and messages left with no content are
//! dropped (the APIs refuse them).

use serde_json::{json, Map, Value};

use super::context::{ContextMessage, ContextRole, ModelContext};
use super::entry::ContentBlock;
use super::Json;

/// A model API's message shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ApiFormat {
    /// OpenAI Chat Completions `messages`.
    OpenAi,
    /// Anthropic Messages request body.
    Anthropic,
}

/// Text before a compaction summary.
pub const COMPACTION_SUMMARY_PREFIX: &str =
    "The conversation history before this point was compacted into the following summary:\n\n<summary>\n";
/// Text after a compaction summary.
pub const COMPACTION_SUMMARY_SUFFIX: &str = "\n</summary>";
/// Text before a branch summary.
pub const BRANCH_SUMMARY_PREFIX: &str =
    "The following is a summary of a branch that this conversation came back from:\n\n<summary>\n";
/// Text after a branch summary.
pub const BRANCH_SUMMARY_SUFFIX: &str = "\n</summary>";

/// The request body for `format`: OpenAI `{"model"?, "messages"}`,
/// Anthropic `{"model"?, "system", "messages"}`. `model` is the context's
/// model id when it has one (the provider is not part of either body).
pub fn request_body(format: ApiFormat, system_prompt: &str, ctx: &ModelContext) -> Value {
    let mut body = Map::new();
    if let Some((_, model)) = &ctx.model {
        body.insert("model".into(), Value::from(model.as_str()));
    }
    match format {
        ApiFormat::OpenAi => {
            body.insert(
                "messages".into(),
                Value::Array(openai_messages(system_prompt, &ctx.messages)),
            );
        }
        ApiFormat::Anthropic => {
            if let Value::Object(m) = anthropic_body(system_prompt, &ctx.messages) {
                body.extend(m);
            }
        }
    }
    Value::Object(body)
}

/// The text of a message as a user would send it: summaries wrapped.
fn text_of(m: &ContextMessage) -> Vec<ContentBlock> {
    let wrap = |prefix: &str, suffix: &str| -> Vec<ContentBlock> {
        let inner: Vec<&str> = m
            .content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect();
        vec![ContentBlock::text(format!(
            "{prefix}{}{suffix}",
            inner.join("\n")
        ))]
    };
    match m.role {
        ContextRole::CompactionSummary => {
            wrap(COMPACTION_SUMMARY_PREFIX, COMPACTION_SUMMARY_SUFFIX)
        }
        ContextRole::BranchSummary => wrap(BRANCH_SUMMARY_PREFIX, BRANCH_SUMMARY_SUFFIX),
        _ => m.content.clone(),
    }
}

fn data_url(mime_type: &str, data: &str) -> String {
    format!("data:{mime_type};base64,{data}")
}

/// OpenAI user content: a string for a single text block, else parts.
fn openai_user_content(blocks: &[ContentBlock]) -> Option<Value> {
    let parts: Vec<Value> = blocks
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } if !text.is_empty() => {
                Some(json!({"type": "text", "text": text}))
            }
            ContentBlock::Image { mime_type, data } => Some(json!({
                "type": "image_url",
                "image_url": {"url": data_url(mime_type, data)},
            })),
            _ => None,
        })
        .collect();
    match parts.as_slice() {
        [] => None,
        [one] if one["type"] == "text" => Some(one["text"].clone()),
        _ => Some(Value::Array(parts)),
    }
}

fn joined_text(blocks: &[ContentBlock]) -> String {
    blocks
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The OpenAI Chat Completions `messages` of a context, the system prompt
/// first (when not empty).
pub fn openai_messages(system_prompt: &str, messages: &[ContextMessage]) -> Vec<Value> {
    let mut out = Vec::with_capacity(messages.len() + 1);
    if !system_prompt.is_empty() {
        out.push(json!({"role": "system", "content": system_prompt}));
    }
    for m in messages {
        match m.role {
            ContextRole::Assistant => {
                let text = joined_text(&m.content);
                let calls: Vec<Value> = m
                    .content
                    .iter()
                    .filter_map(|b| match b {
                        ContentBlock::ToolCall {
                            id,
                            name,
                            arguments,
                            ..
                        } => Some(json!({
                            "id": id,
                            "type": "function",
                            "function": {"name": name, "arguments": arguments_string(arguments)},
                        })),
                        _ => None,
                    })
                    .collect();
                if text.is_empty() && calls.is_empty() {
                    continue;
                }
                let mut msg = Map::new();
                msg.insert("role".into(), "assistant".into());
                msg.insert(
                    "content".into(),
                    if text.is_empty() {
                        Value::Null
                    } else {
                        Value::from(text)
                    },
                );
                if !calls.is_empty() {
                    msg.insert("tool_calls".into(), Value::Array(calls));
                }
                out.push(Value::Object(msg));
            }
            ContextRole::ToolResult => {
                out.push(json!({
                    "role": "tool",
                    "tool_call_id": m.tool_call_id.as_deref().unwrap_or(""),
                    "content": joined_text(&m.content),
                }));
                let images: Vec<ContentBlock> = m
                    .content
                    .iter()
                    .filter(|b| matches!(b, ContentBlock::Image { .. }))
                    .cloned()
                    .collect();
                if let Some(content) = openai_user_content(&images) {
                    out.push(json!({"role": "user", "content": content}));
                }
            }
            _ => {
                if let Some(content) = openai_user_content(&text_of(m)) {
                    out.push(json!({"role": "user", "content": content}));
                }
            }
        }
    }
    out
}

/// Tool-call arguments as the JSON string OpenAI takes.
fn arguments_string(arguments: &Json) -> String {
    if arguments.is_null() {
        "{}".into()
    } else {
        arguments.as_str().to_string()
    }
}

fn anthropic_blocks(blocks: &[ContentBlock], assistant: bool) -> Vec<Value> {
    blocks
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } if !text.is_empty() => {
                Some(json!({"type": "text", "text": text}))
            }
            ContentBlock::Text { .. } => None,
            ContentBlock::Image { mime_type, data } => Some(json!({
                "type": "image",
                "source": {"type": "base64", "media_type": mime_type, "data": data},
            })),
            ContentBlock::Thinking {
                signature: Some(sig),
                redacted: true,
                ..
            } if assistant => Some(json!({"type": "redacted_thinking", "data": sig})),
            ContentBlock::Thinking {
                thinking,
                signature: Some(sig),
                ..
            } if assistant && !sig.is_empty() => Some(json!({
                "type": "thinking",
                "thinking": thinking,
                "signature": sig,
            })),
            ContentBlock::Thinking { thinking, .. } if !thinking.is_empty() => {
                Some(json!({"type": "text", "text": thinking}))
            }
            ContentBlock::Thinking { .. } => None,
            ContentBlock::ToolCall {
                id,
                name,
                arguments,
                ..
            } if assistant => Some(json!({
                "type": "tool_use",
                "id": id,
                "name": name,
                "input": if arguments.is_null() { json!({}) } else { arguments.to_value() },
            })),
            _ => None,
        })
        .collect()
}

/// The Anthropic Messages body of a context: `{"system", "messages"}`.
pub fn anthropic_body(system_prompt: &str, messages: &[ContextMessage]) -> Value {
    let mut out: Vec<Value> = Vec::with_capacity(messages.len());
    // Whether the last message out is a user message of tool results, which
    // the next result joins.
    let mut open_results = false;
    for m in messages {
        match m.role {
            ContextRole::Assistant => {
                open_results = false;
                let content = anthropic_blocks(&m.content, true);
                if !content.is_empty() {
                    out.push(json!({"role": "assistant", "content": content}));
                }
            }
            ContextRole::ToolResult => {
                let mut result = Map::new();
                result.insert("type".into(), "tool_result".into());
                result.insert(
                    "tool_use_id".into(),
                    Value::from(m.tool_call_id.as_deref().unwrap_or("")),
                );
                let content = anthropic_blocks(&m.content, false);
                if !content.is_empty() {
                    result.insert("content".into(), Value::Array(content));
                }
                if m.is_error == Some(true) {
                    result.insert("is_error".into(), Value::Bool(true));
                }
                let block = Value::Object(result);
                let open = if open_results {
                    out.last_mut()
                        .and_then(|last| last.get_mut("content"))
                        .and_then(Value::as_array_mut)
                } else {
                    None
                };
                match open {
                    Some(blocks) => blocks.push(block),
                    None => out.push(json!({"role": "user", "content": [block]})),
                }
                open_results = true;
            }
            _ => {
                open_results = false;
                let content = anthropic_blocks(&text_of(m), false);
                if !content.is_empty() {
                    out.push(json!({"role": "user", "content": content}));
                }
            }
        }
    }
    json!({"system": system_prompt, "messages": out})
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{Entry, EntryKind, Message, StopReason, Transcript, Usage};

    fn add(t: &mut Transcript, kind: EntryKind) {
        let parent = t.leaf().cloned();
        t.append(Entry::new(parent, kind)).unwrap();
    }

    fn sample() -> ModelContext {
        let mut t = Transcript::new();
        add(
            &mut t,
            EntryKind::Message {
                message: Message::User {
                    content: vec![ContentBlock::text("read x")],
                },
            },
        );
        add(
            &mut t,
            EntryKind::Message {
                message: Message::Assistant {
                    content: vec![
                        ContentBlock::Thinking {
                            thinking: "plan".into(),
                            signature: Some("SIG".into()),
                            redacted: false,
                        },
                        ContentBlock::Thinking {
                            thinking: String::new(),
                            signature: Some("ENC".into()),
                            redacted: true,
                        },
                        ContentBlock::text("reading"),
                        ContentBlock::tool_call("c1", "read", json!({"path": "x"})),
                        ContentBlock::tool_call("c2", "read", json!({"path": "y"})),
                    ],
                    stop_reason: StopReason::ToolUse,
                    usage: Usage::default(),
                    model: Some("anthropic/claude".into()),
                    error_message: None,
                },
            },
        );
        for (id, text) in [("c1", "X"), ("c2", "Y")] {
            add(
                &mut t,
                EntryKind::Message {
                    message: Message::ToolResult {
                        tool_call_id: id.into(),
                        tool_name: "read".into(),
                        content: vec![ContentBlock::text(text)],
                        is_error: false,
                    },
                },
            );
        }
        add(
            &mut t,
            EntryKind::Message {
                message: Message::Assistant {
                    content: vec![ContentBlock::text("done")],
                    stop_reason: StopReason::Stop,
                    usage: Usage::default(),
                    model: Some("anthropic/claude".into()),
                    error_message: None,
                },
            },
        );
        t.context().unwrap()
    }

    #[test]
    fn openai_messages_have_the_system_prompt_tool_calls_and_tool_results() {
        let body = request_body(ApiFormat::OpenAi, "be brief", &sample());
        assert_eq!(
            body,
            json!({
                "model": "claude",
                "messages": [
                    {"role": "system", "content": "be brief"},
                    {"role": "user", "content": "read x"},
                    {"role": "assistant", "content": "reading", "tool_calls": [
                        {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"x\"}"}},
                        {"id": "c2", "type": "function", "function": {"name": "read", "arguments": "{\"path\":\"y\"}"}},
                    ]},
                    {"role": "tool", "tool_call_id": "c1", "content": "X"},
                    {"role": "tool", "tool_call_id": "c2", "content": "Y"},
                    {"role": "assistant", "content": "done"},
                ]
            })
        );
        // No system message for an empty prompt.
        let m = openai_messages("", &sample().messages);
        assert_eq!(m[0]["role"], "user");
    }

    #[test]
    fn anthropic_body_keeps_signed_thinking_and_groups_tool_results() {
        let body = request_body(ApiFormat::Anthropic, "be brief", &sample());
        assert_eq!(
            body,
            json!({
                "model": "claude",
                "system": "be brief",
                "messages": [
                    {"role": "user", "content": [{"type": "text", "text": "read x"}]},
                    {"role": "assistant", "content": [
                        {"type": "thinking", "thinking": "plan", "signature": "SIG"},
                        {"type": "redacted_thinking", "data": "ENC"},
                        {"type": "text", "text": "reading"},
                        {"type": "tool_use", "id": "c1", "name": "read", "input": {"path": "x"}},
                        {"type": "tool_use", "id": "c2", "name": "read", "input": {"path": "y"}},
                    ]},
                    {"role": "user", "content": [
                        {"type": "tool_result", "tool_use_id": "c1", "content": [{"type": "text", "text": "X"}]},
                        {"type": "tool_result", "tool_use_id": "c2", "content": [{"type": "text", "text": "Y"}]},
                    ]},
                    {"role": "assistant", "content": [{"type": "text", "text": "done"}]},
                ]
            })
        );
    }

    #[test]
    fn unsigned_thinking_becomes_text_and_summaries_are_wrapped() {
        let mut t = Transcript::new();
        add(
            &mut t,
            EntryKind::BranchSummary {
                from_id: None,
                summary: "tried A".into(),
            },
        );
        add(
            &mut t,
            EntryKind::Message {
                message: Message::Assistant {
                    content: vec![ContentBlock::thinking("hmm")],
                    stop_reason: StopReason::Stop,
                    usage: Usage::default(),
                    model: None,
                    error_message: None,
                },
            },
        );
        let ctx = t.context().unwrap();
        let body = anthropic_body("", &ctx.messages);
        assert_eq!(
            body["messages"][0]["content"][0]["text"],
            format!("{BRANCH_SUMMARY_PREFIX}tried A{BRANCH_SUMMARY_SUFFIX}")
        );
        assert_eq!(
            body["messages"][1]["content"],
            json!([{"type": "text", "text": "hmm"}])
        );
        // OpenAI takes no thinking: an assistant turn of thinking alone is
        // dropped.
        assert_eq!(openai_messages("", &ctx.messages).len(), 1);
    }
}
