//! Building the model context from a root→leaf path.
//!
//! The rules follow the well-known session-tree design of coding agents
//! (pi-style session files), with spool's additions (reset):
//!
//! * **Reset** is a hard cut: no entry before the latest reset on the path
//!   contributes a message (model and thinking settings still come from the
//!   whole path: they are session settings, not conversation).
//! * **Compaction**: only the latest compaction after the latest reset
//!   counts. The model sees its summary first, then the path entries from
//!   its `first_kept_entry_id` up to the compaction, then the entries after
//!   it. If the first kept entry is not on the path between the reset (or
//!   the root) and the compaction, nothing before the compaction is kept
//!   (pi keeps nothing when the id is not found). Earlier compaction
//!   entries inside the kept range contribute nothing.
//! * **Branch summaries** on the path become `branch_summary` messages
//!   (empty summaries are skipped, as in pi).
//! * **Custom** entries (plugin state) never enter the context; **custom
//!   messages** do, as `custom` messages.
//! * **Label**, **session info**, **model change** and **thinking-level
//!   change** entries never produce messages.
//! * **Assistant messages that ended in an error or were aborted** are left
//!   out (pi does not replay incomplete turns: they may hold partial tool
//!   calls or reasoning that providers reject). Their model still counts
//!   for the model setting.
//! * **Tool pairing**: a tool result is kept only if it answers a tool call
//!   of the latest assistant message before it that is still unanswered;
//!   otherwise (its call was compacted away, cut by a reset, belongs to a
//!   left-out assistant, or was already answered) it is an orphan and is
//!   dropped. A tool call that is still unanswered when the next non-tool-
//!   result message arrives gets a synthetic error result with the text
//!   [`SYNTHETIC_TOOL_RESULT_TEXT`] just before that message (pi's
//!   behaviour, which keeps providers' call/result pairing valid). Calls of
//!   the last assistant message with no result yet stay open: the tools may
//!   still be running.
//! * **Model**: the latest model change or assistant message model
//!   (`provider/model`) on the path; **thinking level**: the latest
//!   thinking-level change on the path. `None` when there is none.

use serde::{Deserialize, Serialize};

use super::entry::{ContentBlock, Entry, EntryId, EntryKind, Message, StopReason};

/// Text of the synthetic error result given to a tool call that got no
/// result before the conversation moved on.
pub const SYNTHETIC_TOOL_RESULT_TEXT: &str = "No result provided";

/// What a model is sent: messages plus the model and thinking settings in
/// force at the leaf.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelContext {
    pub messages: Vec<ContextMessage>,
    /// `(provider, model_id)` of the latest model change or assistant model.
    pub model: Option<(String, String)>,
    pub thinking_level: Option<String>,
}

/// The role of a [`ContextMessage`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContextRole {
    User,
    Assistant,
    ToolResult,
    /// A custom message injected by a plugin.
    Custom,
    /// The summary of the latest compaction (always first when present).
    CompactionSummary,
    /// The summary of a branch that was left.
    BranchSummary,
}

impl ContextRole {
    pub fn as_str(self) -> &'static str {
        match self {
            ContextRole::User => "user",
            ContextRole::Assistant => "assistant",
            ContextRole::ToolResult => "tool_result",
            ContextRole::Custom => "custom",
            ContextRole::CompactionSummary => "compaction_summary",
            ContextRole::BranchSummary => "branch_summary",
        }
    }
}

/// One message of the model context. Serializes as
/// `{"role": ..., "content": [...]}` plus the role-specific fields that are
/// set (`entry_id`, `tool_call_id`, `tool_name`, `is_error`, `custom_type`,
/// `stop_reason`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ContextMessage {
    pub role: ContextRole,
    pub content: Vec<ContentBlock>,
    /// The entry this message comes from; `None` for a synthetic tool
    /// result.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_id: Option<EntryId>,
    /// Tool results: the call answered.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Tool results: the tool's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_name: Option<String>,
    /// Tool results: whether the tool failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
    /// Custom messages: the plugin's type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_type: Option<String>,
    /// Assistant messages: why the message ended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
}

impl ContextMessage {
    fn new(role: ContextRole, content: Vec<ContentBlock>, entry_id: Option<EntryId>) -> Self {
        ContextMessage {
            role,
            content,
            entry_id,
            tool_call_id: None,
            tool_name: None,
            is_error: None,
            custom_type: None,
            stop_reason: None,
        }
    }

    /// Whether this is a synthetic tool result (no entry behind it).
    pub fn is_synthetic(&self) -> bool {
        self.entry_id.is_none()
    }
}

/// What an entry means for walking the context path without its payload:
/// enough to find where the context starts and which settings are in force.
/// A storage layer can keep this in an index instead of loading entries.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PathMarker {
    /// Nothing that affects boundaries or settings.
    Plain,
    Reset,
    Compaction {
        first_kept_entry_id: EntryId,
    },
    /// A model change, or an assistant message with a `provider/model`.
    Model {
        provider: String,
        model_id: String,
    },
    ThinkingLevel {
        thinking_level: String,
    },
}

impl PathMarker {
    /// An entry with this id and parent whose kind has exactly this path
    /// marker: what [`super::PathFacts::child`] needs to recompute facts for
    /// a stored entry from its index record alone, without its payload.
    pub fn stand_in_entry(&self, id: EntryId, parent_id: Option<EntryId>) -> Entry {
        let kind = match self {
            PathMarker::Reset => EntryKind::Reset,
            PathMarker::Compaction {
                first_kept_entry_id,
            } => EntryKind::Compaction {
                summary: String::new(),
                first_kept_entry_id: first_kept_entry_id.clone(),
                tokens_before: 0,
            },
            PathMarker::Model { provider, model_id } => EntryKind::ModelChange {
                provider: provider.clone(),
                model_id: model_id.clone(),
            },
            PathMarker::ThinkingLevel { thinking_level } => EntryKind::ThinkingLevelChange {
                thinking_level: thinking_level.clone(),
            },
            _ => EntryKind::SessionInfo { name: None },
        };
        Entry {
            id,
            parent_id,
            timestamp_ms: 0,
            kind,
        }
    }

    pub fn of(entry: &Entry) -> PathMarker {
        match &entry.kind {
            EntryKind::Reset => PathMarker::Reset,
            EntryKind::Compaction {
                first_kept_entry_id,
                ..
            } => PathMarker::Compaction {
                first_kept_entry_id: first_kept_entry_id.clone(),
            },
            EntryKind::ModelChange { provider, model_id } => PathMarker::Model {
                provider: provider.clone(),
                model_id: model_id.clone(),
            },
            EntryKind::Message {
                message: Message::Assistant { model: Some(m), .. },
            } => match split_model(m) {
                Some((provider, model_id)) => PathMarker::Model { provider, model_id },
                None => PathMarker::Plain,
            },
            EntryKind::ThinkingLevelChange { thinking_level } => PathMarker::ThinkingLevel {
                thinking_level: thinking_level.clone(),
            },
            _ => PathMarker::Plain,
        }
    }
}

/// Splits an assistant's `provider/model` at the first `/`. A value without
/// a `/` (or with an empty side) names no provider and is not used as the
/// model setting.
pub fn split_model(s: &str) -> Option<(String, String)> {
    let (p, m) = s.split_once('/')?;
    if p.is_empty() || m.is_empty() {
        return None;
    }
    Some((p.to_string(), m.to_string()))
}

/// The model and thinking settings in force at the end of `path`
/// (root→leaf order): the latest of each.
pub fn path_settings(path: &[&Entry]) -> (Option<(String, String)>, Option<String>) {
    let mut model = None;
    let mut thinking = None;
    for e in path.iter().rev() {
        if model.is_some() && thinking.is_some() {
            break;
        }
        match PathMarker::of(e) {
            PathMarker::Model { provider, model_id } if model.is_none() => {
                model = Some((provider, model_id));
            }
            PathMarker::ThinkingLevel { thinking_level } if thinking.is_none() => {
                thinking = Some(thinking_level);
            }
            _ => {}
        }
    }
    (model, thinking)
}

/// Builds the model context of a root→leaf path (see the module docs for
/// the rules). Settings come from the same path.
pub fn build_context(path: &[&Entry]) -> ModelContext {
    let (model, thinking_level) = path_settings(path);
    ModelContext {
        messages: context_messages(path),
        model,
        thinking_level,
    }
}

/// The index in `path` where the context starts: the first kept entry of
/// the latest compaction (or the compaction itself when nothing before it
/// is kept), else the latest reset, else 0. Entries before it never
/// contribute to the context. For an empty path, 0.
pub fn context_start(path: &[&Entry]) -> usize {
    let bounds = Bounds::of(path);
    match bounds.compaction {
        Some((c, kept)) => kept.unwrap_or(c),
        None => bounds.reset.unwrap_or(0),
    }
}

/// Positions of the boundaries that decide the context of a path.
struct Bounds {
    /// Index of the latest reset.
    reset: Option<usize>,
    /// Index of the latest compaction after the latest reset, and the index
    /// of its first kept entry if that is between the reset and it.
    compaction: Option<(usize, Option<usize>)>,
}

impl Bounds {
    fn of(path: &[&Entry]) -> Bounds {
        let reset = path
            .iter()
            .rposition(|e| matches!(e.kind, EntryKind::Reset));
        let after_reset = reset.map_or(0, |r| r + 1);
        let compaction = path
            .iter()
            .rposition(|e| matches!(e.kind, EntryKind::Compaction { .. }))
            .filter(|&c| c >= after_reset)
            .map(|c| {
                let kept = match path.get(c).map(|e| &e.kind) {
                    Some(EntryKind::Compaction {
                        first_kept_entry_id,
                        ..
                    }) => path
                        .get(after_reset..c)
                        .and_then(|seg| seg.iter().position(|e| &e.id == first_kept_entry_id))
                        .map(|k| after_reset + k),
                    _ => None,
                };
                (c, kept)
            });
        Bounds { reset, compaction }
    }
}

/// The messages of the context of a root→leaf path (see the module docs).
///
/// The same function serves a suffix of the path that starts at
/// [`context_start`]: the result is identical, which is what lets a
/// bounded resident selection rebuild the full context.
pub fn context_messages(path: &[&Entry]) -> Vec<ContextMessage> {
    messages_with(path, None)
}

/// The messages of a context segment held by a resident selection: the
/// entries are a suffix of the context segment, possibly with holes
/// (omitted entries). `keep_prefix` says whether the latest compaction
/// keeps the segment entries before it (its first kept entry was found on
/// the full path), which the segment alone may no longer show.
pub(crate) fn context_messages_segment(
    entries: &[&Entry],
    keep_prefix: bool,
) -> Vec<ContextMessage> {
    messages_with(entries, Some(keep_prefix))
}

fn messages_with(path: &[&Entry], keep_prefix: Option<bool>) -> Vec<ContextMessage> {
    let mut bounds = Bounds::of(path);
    if let (Some(keep), Some((c, kept))) = (keep_prefix, bounds.compaction.as_mut()) {
        let after_reset = bounds.reset.map_or(0, |r| r + 1);
        *kept = if keep {
            Some(after_reset.min(*c))
        } else {
            None
        };
    }
    let after_reset = bounds.reset.map_or(0, |r| r + 1);
    // At most one message per entry plus the summary.
    let mut raw: Vec<ContextMessage> = Vec::with_capacity(path.len().saturating_add(1));
    match bounds.compaction {
        Some((c, kept)) => {
            if let Some(Entry {
                id,
                kind: EntryKind::Compaction { summary, .. },
                ..
            }) = path.get(c).copied()
            {
                raw.push(ContextMessage::new(
                    ContextRole::CompactionSummary,
                    vec![ContentBlock::text(summary.clone())],
                    Some(id.clone()),
                ));
            }
            if let Some(k) = kept {
                for e in path.get(k..c).unwrap_or_default() {
                    push_entry(&mut raw, e);
                }
            }
            for e in path.get(c + 1..).unwrap_or_default() {
                push_entry(&mut raw, e);
            }
        }
        None => {
            for e in path.get(after_reset..).unwrap_or_default() {
                push_entry(&mut raw, e);
            }
        }
    }
    pair_tool_calls(raw)
}

/// Appends the message an entry contributes, if any (before tool pairing).
fn push_entry(out: &mut Vec<ContextMessage>, e: &Entry) {
    let id = Some(e.id.clone());
    match &e.kind {
        EntryKind::Message { message } => match message {
            Message::User { content } => {
                out.push(ContextMessage::new(ContextRole::User, content.clone(), id));
            }
            Message::Assistant {
                content,
                stop_reason,
                ..
            } => {
                if matches!(stop_reason, StopReason::Error | StopReason::Aborted) {
                    return;
                }
                let mut m = ContextMessage::new(ContextRole::Assistant, content.clone(), id);
                m.stop_reason = Some(*stop_reason);
                out.push(m);
            }
            Message::ToolResult {
                tool_call_id,
                tool_name,
                content,
                is_error,
            } => {
                let mut m = ContextMessage::new(ContextRole::ToolResult, content.clone(), id);
                m.tool_call_id = Some(tool_call_id.clone());
                m.tool_name = Some(tool_name.clone());
                m.is_error = Some(*is_error);
                out.push(m);
            }
        },
        EntryKind::CustomMessage {
            custom_type,
            content,
            ..
        } => {
            let mut m = ContextMessage::new(ContextRole::Custom, content.clone(), id);
            m.custom_type = Some(custom_type.clone());
            out.push(m);
        }
        EntryKind::BranchSummary { summary, .. } if !summary.is_empty() => {
            out.push(ContextMessage::new(
                ContextRole::BranchSummary,
                vec![ContentBlock::text(summary.clone())],
                id,
            ));
        }
        // Custom (plugin state), labels, session info, settings changes,
        // resets and compactions (their summary is placed separately)
        // produce no message.
        _ => {}
    }
}

/// Applies the tool pairing rules (module docs) to the assembled messages.
fn pair_tool_calls(raw: Vec<ContextMessage>) -> Vec<ContextMessage> {
    let mut out = Vec::with_capacity(raw.len());
    // Unanswered calls (id, name) of the latest assistant message.
    let mut pending: Vec<(String, String)> = Vec::new();
    for m in raw {
        match m.role {
            ContextRole::ToolResult => {
                let answered = m
                    .tool_call_id
                    .as_ref()
                    .and_then(|cid| pending.iter().position(|(id, _)| id == cid));
                if let Some(i) = answered {
                    pending.remove(i);
                    out.push(m);
                }
                // else: orphan result, dropped.
            }
            role => {
                for (id, name) in pending.drain(..) {
                    let mut r = ContextMessage::new(
                        ContextRole::ToolResult,
                        vec![ContentBlock::text(SYNTHETIC_TOOL_RESULT_TEXT)],
                        None,
                    );
                    r.tool_call_id = Some(id);
                    r.tool_name = Some(name);
                    r.is_error = Some(true);
                    out.push(r);
                }
                if role == ContextRole::Assistant {
                    pending = m
                        .content
                        .iter()
                        .filter_map(|b| match b {
                            ContentBlock::ToolCall { id, name, .. } => {
                                Some((id.clone(), name.clone()))
                            }
                            _ => None,
                        })
                        .collect();
                }
                out.push(m);
            }
        }
    }
    out
}

/// What a byte budget kept of a context and what it left out: the
/// summary of a [`super::ResidentSelection`] a user reads.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub struct BudgetReport {
    pub bytes_max: u64,
    pub context_entries: u64,
    pub resident_entries: u64,
    pub resident_bytes: u64,
    /// Every context entry is resident.
    pub complete: bool,
    /// Context entries left out because each alone exceeds the budget.
    pub omitted: Vec<super::OmittedEntry>,
    /// Older context entries beyond the budget, in path order.
    pub beyond_budget: Vec<EntryId>,
}

impl BudgetReport {
    /// The report of `sel`, a selection made for the leaf of `path` (its
    /// root→leaf path).
    pub fn of(path: &[&Entry], sel: &super::ResidentSelection) -> BudgetReport {
        let held: std::collections::HashSet<&EntryId> = sel
            .entries
            .iter()
            .map(|e| &e.id)
            .chain(sel.omitted.iter().map(|o| &o.id))
            .collect();
        let start = context_start(path);
        let beyond_budget = path
            .get(start..)
            .unwrap_or_default()
            .iter()
            .filter(|e| !held.contains(&e.id))
            .map(|e| e.id.clone())
            .collect();
        BudgetReport {
            bytes_max: sel.budget.bytes_max,
            context_entries: sel.counts.context_entries,
            resident_entries: sel.counts.resident_entries,
            resident_bytes: sel.counts.resident_bytes,
            complete: sel.complete,
            omitted: sel.omitted.clone(),
            beyond_budget,
        }
    }
}

impl super::tree::Transcript {
    /// The model context at the current leaf (empty when the leaf is
    /// `None`).
    pub fn context(&self) -> Result<ModelContext, super::tree::TranscriptError> {
        self.context_at(self.leaf())
    }

    /// The model context at `leaf`: built from its root→leaf path; an
    /// orphan entry (parent missing) ends the path there. `None` gives an
    /// empty context. Errors: unknown leaf, parent cycle.
    pub fn context_at(
        &self,
        leaf: Option<&EntryId>,
    ) -> Result<ModelContext, super::tree::TranscriptError> {
        match leaf {
            None => Ok(ModelContext::default()),
            Some(id) => Ok(build_context(&self.root_path(id)?)),
        }
    }
}
