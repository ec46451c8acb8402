//! Rewrite planning (pure, storage independent).
//!
//! A rewrite replaces the content of some entries and removes others,
//! producing a new transcript generation. [`RewritePlan::prepare`] computes
//! everything a store needs to commit it, reading only the affected
//! entries through an [`EntrySource`]:
//!
//! * **ids are stable** across generations: a kept entry keeps its id; the
//!   mapping says, per affected source entry, whether it was removed (and
//!   which kept ancestor takes its place) or kept with new content and/or a
//!   new parent. Entries not in the mapping are carried over unchanged.
//! * **parent repair**: a kept child of a removed entry is re-parented to
//!   the nearest kept ancestor of the removed entry (or becomes a root).
//!   Re-parented entries are listed as `(id, new parent)` without their
//!   payload: their stored bytes are carried over, only the parent link
//!   changes, so a 5 MiB custom payload is never loaded or re-encoded.
//! * **leaf**: a removed leaf is replaced by its nearest kept ancestor.
//! * **deltas**: bytes (in [`entry_size`] units) and entry counts.
//! * **stale path facts**: the entries whose subtree's [`PathFacts`](super::path_facts::PathFacts)
//!   must be recomputed (re-parented entries change depth; a replacement
//!   that changes an entry's [`PathMarker`] changes its descendants').
//!
//! Not handled here: label entries whose target is removed are kept (a
//! label of a missing target is inert), and a compaction whose
//! `first_kept_entry_id` is removed then keeps nothing before it (the
//! context rule for a first kept entry that is not on the path); callers
//! that remove such entries should replace the compaction too.
//!
//! Helpers produce replacement lists: [`remove_trailing_entries`],
//! [`truncate_tool_results`] and [`redact`].

use std::collections::{HashMap, HashSet};

use serde::Serialize;

use super::context::PathMarker;
use super::entry::{ContentBlock, Entry, EntryId, EntryKind, Message};
use super::history::TranscriptVersion;
use super::json_size::parent_json_len;
use super::resident::{entry_size, EntryFacts};
use super::source::EntrySource;
use super::tree::{Transcript, TranscriptError};

/// Maximum number of entries [`remove_trailing_entries`] examines before
/// giving up with [`RewriteError::ScanLimit`] (it never reports "nothing
/// to remove" without having found the boundary).
pub const TRAILING_SCAN_ENTRIES_MAX: u64 = 100_000;
/// Smallest effective `max_bytes` of [`truncate_tool_results`]: room for
/// the truncation marker, so a truncated result always fits its limit and
/// a second run changes nothing.
pub const TOOL_RESULT_TRUNCATE_BYTES_MIN: u64 = 64;

/// What to do with one entry.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Replacement {
    /// New content; id, parent (unless repaired) and timestamp are kept.
    Replace(EntryKind),
    Remove,
}

/// What happened to one affected source entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MappedEntry {
    pub source: EntryId,
    /// The same id when kept; `None` when removed.
    pub destination: Option<EntryId>,
    /// The content was replaced.
    pub content_replaced: bool,
    /// `Some(new parent)` when the parent link was repaired.
    pub reparented_to: Option<Option<EntryId>>,
    /// For a removed entry: its nearest kept ancestor (what a reference
    /// to it, such as the leaf, now points to).
    pub successor: Option<EntryId>,
    pub size_before: u64,
    /// 0 when removed.
    pub size_after: u64,
}

/// A prepared rewrite (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RewritePlan {
    /// The version the plan was computed against.
    pub expected_version: TranscriptVersion,
    /// The generation the rewrite writes (`expected_version.generation + 1`).
    pub generation: u64,
    /// Every affected source entry: replacements in request order, then
    /// re-parented entries.
    pub mapping: Vec<MappedEntry>,
    /// Entries with replaced content, complete (with repaired parents).
    pub written: Vec<Entry>,
    /// Entries whose only change is the parent link: `(id, new parent)`.
    pub reparented: Vec<(EntryId, Option<EntryId>)>,
    pub removed: Vec<EntryId>,
    pub old_leaf: Option<EntryId>,
    pub new_leaf: Option<EntryId>,
    /// Sum of `size_after - size_before` over the mapping.
    pub bytes_delta: i64,
    /// Minus the number of removed entries.
    pub entries_delta: i64,
    /// Roots of the subtrees whose path facts must be recomputed.
    pub facts_stale: Vec<EntryId>,
}

/// A rewrite could not be planned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RewriteError<E: std::error::Error + 'static> {
    #[error("reading the entry source failed")]
    Source(#[source] E),
    #[error("entry {0} is not in the transcript")]
    UnknownEntry(EntryId),
    #[error("entry {0} has more than one replacement")]
    DuplicateReplacement(EntryId),
    #[error("the parent links above entry {0} form a cycle")]
    ParentCycle(EntryId),
    /// The trailing scan examined [`TRAILING_SCAN_ENTRIES_MAX`] entries
    /// without finding its boundary.
    #[error("no boundary found within {0} trailing entries")]
    ScanLimit(u64),
}

fn src<E: std::error::Error + 'static>(e: E) -> RewriteError<E> {
    RewriteError::Source(e)
}

fn signed(after: u64, before: u64) -> i64 {
    if after >= before {
        i64::try_from(after - before).unwrap_or(i64::MAX)
    } else {
        i64::try_from(before - after).map_or(i64::MIN, |d| -d)
    }
}

impl RewritePlan {
    /// Plans `replacements` over the transcript read by `source`, whose
    /// current leaf is `leaf`, at `expected_version`. Reads the replaced
    /// and removed entries, the facts of their ancestors up to the nearest
    /// kept one, and the children of removed entries (facts and sizes
    /// only). Errors: an unknown entry, a duplicate replacement, a source
    /// fault.
    pub fn prepare<S: EntrySource + ?Sized>(
        source: &S,
        leaf: Option<&EntryId>,
        replacements: &[(EntryId, Replacement)],
        expected_version: TranscriptVersion,
    ) -> Result<RewritePlan, RewriteError<S::Error>> {
        let mut seen: HashSet<&EntryId> = HashSet::with_capacity(replacements.len());
        let mut removed: HashSet<&EntryId> = HashSet::new();
        for (id, r) in replacements {
            if !seen.insert(id) {
                return Err(RewriteError::DuplicateReplacement(id.clone()));
            }
            if matches!(r, Replacement::Remove) {
                removed.insert(id);
            }
        }
        let replaced: HashMap<&EntryId, &EntryKind> = replacements
            .iter()
            .filter_map(|(id, r)| match r {
                Replacement::Replace(k) => Some((id, k)),
                Replacement::Remove => None,
            })
            .collect();

        // Nearest kept ancestor of a removed entry (bounded walk: only
        // removed entries are stepped over).
        let successor = |id: &EntryId| -> Result<Option<EntryId>, RewriteError<S::Error>> {
            let mut cur = id.clone();
            for _ in 0..=removed.len() {
                let f = source
                    .facts(&cur)
                    .map_err(src)?
                    .ok_or_else(|| RewriteError::UnknownEntry(cur.clone()))?;
                match f.parent_id {
                    Some(p) if removed.contains(&p) => cur = p,
                    Some(p) => {
                        // An absent parent ends the path: a root.
                        let present = source.facts(&p).map_err(src)?.is_some();
                        return Ok(present.then_some(p));
                    }
                    None => return Ok(None),
                }
            }
            Err(RewriteError::ParentCycle(id.clone()))
        };

        let mut plan = RewritePlan {
            expected_version,
            generation: expected_version.generation.saturating_add(1),
            mapping: Vec::new(),
            written: Vec::new(),
            reparented: Vec::new(),
            removed: Vec::new(),
            old_leaf: leaf.cloned(),
            new_leaf: leaf.cloned(),
            bytes_delta: 0,
            entries_delta: 0,
            facts_stale: Vec::new(),
        };
        let mut stale: HashSet<EntryId> = HashSet::new();
        for (id, r) in replacements {
            let size_before = source
                .entry_size(id)
                .map_err(src)?
                .ok_or_else(|| RewriteError::UnknownEntry(id.clone()))?;
            match r {
                Replacement::Remove => {
                    plan.mapping.push(MappedEntry {
                        source: id.clone(),
                        destination: None,
                        content_replaced: false,
                        reparented_to: None,
                        successor: successor(id)?,
                        size_before,
                        size_after: 0,
                    });
                    plan.removed.push(id.clone());
                }
                Replacement::Replace(kind) => {
                    let old = source
                        .entry(id)
                        .map_err(src)?
                        .ok_or_else(|| RewriteError::UnknownEntry(id.clone()))?;
                    let mut new = Entry {
                        id: old.id.clone(),
                        parent_id: old.parent_id.clone(),
                        timestamp_ms: old.timestamp_ms,
                        kind: kind.clone(),
                    };
                    let mut reparented_to = None;
                    if let Some(p) = old.parent_id.as_ref().filter(|p| removed.contains(p)) {
                        let to = successor(p)?;
                        new.parent_id = to.clone();
                        reparented_to = Some(to);
                        stale.insert(id.clone());
                    }
                    if PathMarker::of(&old) != PathMarker::of(&new) {
                        stale.insert(id.clone());
                    }
                    let size_after = entry_size(&new);
                    plan.mapping.push(MappedEntry {
                        source: id.clone(),
                        destination: Some(id.clone()),
                        content_replaced: true,
                        reparented_to,
                        successor: None,
                        size_before,
                        size_after,
                    });
                    plan.written.push(new);
                }
            }
        }
        // Parent repair for the kept children of removed entries.
        for r in plan.removed.clone() {
            let all = source.children(&r, usize::MAX).map_err(src)?;
            let to = successor(&r)?;
            for child in all.ids {
                if removed.contains(&child) || replaced.contains_key(&child) {
                    continue;
                }
                let size_before = source
                    .entry_size(&child)
                    .map_err(src)?
                    .ok_or_else(|| RewriteError::UnknownEntry(child.clone()))?;
                let size_after = size_before
                    .saturating_sub(parent_json_len(&Some(r.clone())))
                    .saturating_add(parent_json_len(&to));
                plan.mapping.push(MappedEntry {
                    source: child.clone(),
                    destination: Some(child.clone()),
                    content_replaced: false,
                    reparented_to: Some(to.clone()),
                    successor: None,
                    size_before,
                    size_after,
                });
                plan.reparented.push((child.clone(), to.clone()));
                stale.insert(child);
            }
        }
        if let Some(l) = leaf.filter(|l| removed.contains(l)) {
            plan.new_leaf = successor(l)?;
        }
        plan.bytes_delta = plan.mapping.iter().fold(0i64, |acc, m| {
            acc.saturating_add(signed(m.size_after, m.size_before))
        });
        plan.entries_delta = i64::try_from(plan.removed.len()).map_or(i64::MIN, |n| -n);
        plan.facts_stale = plan
            .mapping
            .iter()
            .filter(|m| stale.contains(&m.source))
            .map(|m| m.source.clone())
            .collect();
        Ok(plan)
    }

    /// Whether the plan changes nothing.
    pub fn is_empty(&self) -> bool {
        self.mapping.is_empty() && self.old_leaf == self.new_leaf
    }

    /// The new generation of an in-memory transcript: removed entries
    /// dropped, replaced ones swapped, re-parented ones relinked (payload
    /// untouched), append order kept, leaf moved. Errors if an entry of
    /// the plan is not in `t` (the plan was made for another transcript).
    pub fn apply_to(&self, t: &Transcript) -> Result<Transcript, TranscriptError> {
        for m in &self.mapping {
            if !t.contains(&m.source) {
                return Err(TranscriptError::UnknownEntry(m.source.clone()));
            }
        }
        let removed: HashSet<&EntryId> = self.removed.iter().collect();
        let written: HashMap<&EntryId, &Entry> = self.written.iter().map(|e| (&e.id, e)).collect();
        let reparented: HashMap<&EntryId, &Option<EntryId>> =
            self.reparented.iter().map(|(id, p)| (id, p)).collect();
        let mut out = Vec::with_capacity(t.len().saturating_sub(removed.len()));
        for e in t.entries() {
            if removed.contains(&e.id) {
                continue;
            }
            if let Some(w) = written.get(&e.id) {
                out.push((*w).clone());
            } else if let Some(p) = reparented.get(&e.id) {
                let mut c = e.clone();
                c.parent_id = (*p).clone();
                out.push(c);
            } else {
                out.push(e.clone());
            }
        }
        let mut next = Transcript::new();
        next.replace_all(out, self.new_leaf.clone());
        Ok(next)
    }
}

/// The result of [`remove_trailing_entries`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct TrailingRemoval {
    /// `Remove` for every matching trailing entry, newest first.
    #[serde(skip)]
    pub replacements: Vec<(EntryId, Replacement)>,
    /// Trailing entries kept because they match the preserve predicate
    /// (parent repair re-attaches them), newest first.
    pub preserved: Vec<EntryId>,
    /// The entry that ended the scan (neither preserved nor matching):
    /// the proof that nothing older is trailing. `None` when the scan
    /// reached the root (or the leaf is `None`).
    pub boundary: Option<EntryId>,
    /// Entries examined (facts read).
    pub examined: u64,
}

/// Walks back from `leaf` through the trailing entries: an entry for
/// which `preserve` holds (judged on its [`EntryFacts`], so its payload is
/// never loaded) is kept and the walk goes on; an entry for which
/// `predicate` holds is removed and the walk goes on; the first other
/// entry ends the walk. Zero removals are therefore reported only with
/// the boundary that proves it (or when the walk reached the root).
/// Payloads are loaded only for entries that are not preserved. Errors:
/// more than [`TRAILING_SCAN_ENTRIES_MAX`] entries examined, an unknown
/// leaf, a source fault.
pub fn remove_trailing_entries<S: EntrySource + ?Sized>(
    source: &S,
    leaf: Option<&EntryId>,
    predicate: &dyn Fn(&Entry) -> bool,
    preserve: &dyn Fn(&EntryFacts) -> bool,
) -> Result<TrailingRemoval, RewriteError<S::Error>> {
    let mut out = TrailingRemoval {
        replacements: Vec::new(),
        preserved: Vec::new(),
        boundary: None,
        examined: 0,
    };
    let mut cur = leaf.cloned();
    while let Some(id) = cur {
        if out.examined >= TRAILING_SCAN_ENTRIES_MAX {
            return Err(RewriteError::ScanLimit(TRAILING_SCAN_ENTRIES_MAX));
        }
        out.examined += 1;
        let facts = source
            .facts(&id)
            .map_err(src)?
            .ok_or_else(|| RewriteError::UnknownEntry(id.clone()))?;
        if preserve(&facts) {
            out.preserved.push(id);
        } else {
            let entry = source
                .entry(&id)
                .map_err(src)?
                .ok_or_else(|| RewriteError::UnknownEntry(id.clone()))?;
            if predicate(&entry) {
                out.replacements.push((id, Replacement::Remove));
            } else {
                out.boundary = Some(id);
                break;
            }
        }
        cur = match facts.parent_id {
            Some(p) if source.facts(&p).map_err(src)?.is_some() => Some(p),
            _ => None,
        };
    }
    Ok(out)
}

/// The marker appended where a tool result was cut.
fn truncation_marker(cut_bytes: u64) -> String {
    format!("\n[truncated {cut_bytes} bytes]")
}

/// The largest char boundary of `s` at or below `max`.
fn floor_boundary(s: &str, max: usize) -> usize {
    let mut i = max.min(s.len());
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Replacements that cut the text of tool results whose text blocks hold
/// more than `max_bytes` bytes (UTF-8) in all (at least
/// [`TOOL_RESULT_TRUNCATE_BYTES_MIN`]). The text is cut on a char
/// boundary and ends with a marker `[truncated N bytes]` (N = bytes cut);
/// kept text plus marker fit in `max_bytes`, so a second run changes
/// nothing. Text blocks after the cut are dropped; other blocks (images)
/// are kept.
pub fn truncate_tool_results<'a>(
    entries: impl IntoIterator<Item = &'a Entry>,
    max_bytes: u64,
) -> Vec<(EntryId, Replacement)> {
    let max = usize::try_from(max_bytes.max(TOOL_RESULT_TRUNCATE_BYTES_MIN)).unwrap_or(usize::MAX);
    let mut out = Vec::new();
    for e in entries {
        let EntryKind::Message {
            message:
                Message::ToolResult {
                    tool_call_id,
                    tool_name,
                    content,
                    is_error,
                },
        } = &e.kind
        else {
            continue;
        };
        let total: usize = content
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text } => text.len(),
                _ => 0,
            })
            .fold(0usize, usize::saturating_add);
        if total <= max {
            continue;
        }
        let total_u = u64::try_from(total).unwrap_or(u64::MAX);
        let mut left = max.saturating_sub(truncation_marker(total_u).len());
        let mut kept_total: usize = 0;
        let mut cut_done = false;
        let mut new_content = Vec::with_capacity(content.len());
        for b in content {
            match b {
                ContentBlock::Text { text } if !cut_done => {
                    if text.len() <= left {
                        left -= text.len();
                        kept_total += text.len();
                        new_content.push(b.clone());
                    } else {
                        let k = floor_boundary(text, left);
                        kept_total += k;
                        let cut = u64::try_from(total - kept_total).unwrap_or(u64::MAX);
                        let mut t = text.get(..k).unwrap_or_default().to_string();
                        t.push_str(&truncation_marker(cut));
                        new_content.push(ContentBlock::Text { text: t });
                        cut_done = true;
                    }
                }
                ContentBlock::Text { .. } => {}
                other => new_content.push(other.clone()),
            }
        }
        out.push((
            e.id.clone(),
            Replacement::Replace(EntryKind::Message {
                message: Message::ToolResult {
                    tool_call_id: tool_call_id.clone(),
                    tool_name: tool_name.clone(),
                    content: new_content,
                    is_error: *is_error,
                },
            }),
        ));
    }
    out
}

/// Replacements that pass the text of messages through `matcher` (which
/// returns the redacted text): text and thinking blocks of user,
/// assistant and tool-result messages and of custom messages, assistant
/// error messages, and compaction and branch summaries. Custom entries
/// (plugin state), tool-call arguments and images are not touched. Only
/// entries whose text changes get a replacement.
pub fn redact<'a>(
    entries: impl IntoIterator<Item = &'a Entry>,
    matcher: &dyn Fn(&str) -> String,
) -> Vec<(EntryId, Replacement)> {
    let blocks = |content: &[ContentBlock]| -> Vec<ContentBlock> {
        content
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text } => ContentBlock::Text {
                    text: matcher(text),
                },
                ContentBlock::Thinking {
                    thinking,
                    signature,
                    redacted,
                } => ContentBlock::Thinking {
                    thinking: matcher(thinking),
                    signature: signature.clone(),
                    redacted: *redacted,
                },
                other => other.clone(),
            })
            .collect()
    };
    let mut out = Vec::new();
    for e in entries {
        let kind = match &e.kind {
            EntryKind::Message { message } => EntryKind::Message {
                message: match message {
                    Message::User { content } => Message::User {
                        content: blocks(content),
                    },
                    Message::Assistant {
                        content,
                        stop_reason,
                        usage,
                        model,
                        error_message,
                    } => Message::Assistant {
                        content: blocks(content),
                        stop_reason: *stop_reason,
                        usage: *usage,
                        model: model.clone(),
                        error_message: error_message.as_deref().map(matcher),
                    },
                    Message::ToolResult {
                        tool_call_id,
                        tool_name,
                        content,
                        is_error,
                    } => Message::ToolResult {
                        tool_call_id: tool_call_id.clone(),
                        tool_name: tool_name.clone(),
                        content: blocks(content),
                        is_error: *is_error,
                    },
                },
            },
            EntryKind::CustomMessage {
                custom_type,
                content,
                display,
                details,
            } => EntryKind::CustomMessage {
                custom_type: custom_type.clone(),
                content: blocks(content),
                display: *display,
                details: details.clone(),
            },
            EntryKind::Compaction {
                summary,
                first_kept_entry_id,
                tokens_before,
            } => EntryKind::Compaction {
                summary: matcher(summary),
                first_kept_entry_id: first_kept_entry_id.clone(),
                tokens_before: *tokens_before,
            },
            EntryKind::BranchSummary { from_id, summary } => EntryKind::BranchSummary {
                from_id: from_id.clone(),
                summary: matcher(summary),
            },
            _ => continue,
        };
        if kind != e.kind {
            out.push((e.id.clone(), Replacement::Replace(kind)));
        }
    }
    out
}
