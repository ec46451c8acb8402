//! Reading pi-style coding-agent session files (JSONL, versions 1, 2, 3).
//!
//! A file is a header line `{"type":"session","version":N,"id":..,
//! "timestamp":..,"cwd":..}` (version 1 has no `version`) followed by one
//! entry per line. The file's versions differ as pi's own loader migrates
//! them, and this reader mirrors those migrations:
//!
//! * **v1 → v2**: v1 entries have no `id`/`parentId`; they form a linear
//!   chain. Each entry gets a fresh 8-hex-digit id and the previous entry
//!   as parent; a compaction's `firstKeptEntryIndex` (an index into the
//!   file's entries, the header being 0) becomes the `firstKeptEntryId` of
//!   the entry at that index.
//! * **v2 → v3**: message entries with role `hookMessage` become role
//!   `custom`.
//!
//! The leaf is the last entry (as pi sets it on load). Entries map onto
//! [`EntryKind`] one to one: `message` (user / assistant / toolResult;
//! `custom` messages become custom-message entries, `branchSummary`
//! messages branch-summary entries), `model_change`,
//! `thinking_level_change`, `compaction`, `branch_summary`, `custom`,
//! `custom_message`, `label`, `session_info`. A `bashExecution` message
//! becomes a custom message of type `pi.bashExecution` carrying the text
//! pi sends to the model (or, when excluded from the context, a custom
//! entry), and a `compactionSummary` message a custom message of type
//! `pi.compactionSummary`. So the context built from the leaf is the one
//! pi's `buildSessionContext` shows, message for message (spool
//! additionally pairs tool calls with results and leaves out errored
//! assistant turns, as pi's provider layer does before sending). What a
//! replay to the provider needs is kept: thinking blocks keep their
//! `thinkingSignature` and `redacted` flag, tool calls their
//! `thoughtSignature`.
//!
//! pi's loader skips a line that is not JSON (e.g. two objects glued
//! together on one line), and so does this reader: each skipped line's
//! number is reported in [`PiSession::skipped_lines`]. Everything else that
//! pi would accept silently with a loss is refused, because an import must
//! not silently lose data: an unknown entry type or message role, an
//! invalid or duplicate id, and a parent id that no earlier line defines
//! (pi would show such an entry as an extra root) are refused with the
//! line number. Blank lines are skipped. Not kept: compaction and
//! branch-summary `details`/`fromHook` (extension data that never reaches
//! the model), assistant `api`, `responseId` and cost figures, and text
//! blocks' `textSignature`.
//!
//! Memory: a line is read as objects whose fields stay JSON text until
//! they are used; opaque payloads (a tool call's arguments, a
//! custom entry's data, a custom message's details) go from that text to
//! a [`Json`] without a tree. So a line takes a few times its length at
//! most, whatever it holds; then the entries, and an id map.

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::io::BufRead;

use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::Value;
use uuid::Uuid;

use crate::session::encoded_event_len;
use crate::session::{AgentDefinition, AgentState, ModelConfig, SessionEvent, SessionId};
use crate::store::exchange::{read_line_bounded, ImportCommit, ImportSession};
use crate::transcript::{
    path_settings, ContentBlock, Entry, EntryId, EntryKind, Json, Message, StopReason, Usage,
};

/// Newest pi session format version this reader understands.
pub const PI_VERSION_MAX: u64 = 3;
/// Longest line accepted (bytes).
pub const PI_LINE_BYTES_MAX: usize = 64 << 20;
/// An import commit carries at most this many events...
pub const PI_COMMIT_EVENTS_MAX: usize = 1024;
/// ...and at most about this many encoded bytes (a single larger entry
/// still gets a commit of its own).
pub const PI_COMMIT_BYTES_MAX: usize = 4 << 20;
/// The agent name imported sessions get.
pub const PI_AGENT_NAME: &str = "pi";

/// A pi file could not be read. `line` is 1-based (0: the file as a whole).
#[derive(Debug, thiserror::Error)]
#[error("line {line}: {reason}")]
#[non_exhaustive]
pub struct PiError {
    pub line: u64,
    pub reason: String,
}

fn err(line: u64, reason: impl Into<String>) -> PiError {
    PiError {
        line,
        reason: reason.into(),
    }
}

/// What was read, besides the session itself.
#[derive(Debug)]
#[non_exhaustive]
pub struct PiSession {
    pub import: ImportSession,
    pub file_version: u64,
    /// Lines skipped as pi skips them (not JSON), 1-based, in file order.
    pub skipped_lines: Vec<u64>,
}

/// Reads a pi session file into one session to import. `source` names the
/// file in the session's description.
pub fn read_pi<R: BufRead>(mut r: R, source: &str) -> Result<PiSession, PiError> {
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    let mut skipped_lines = Vec::new();
    // The next non-blank line that is JSON, with its number.
    let mut next_line = |skipped: &mut Vec<u64>| -> Result<Option<(u64, String)>, PiError> {
        loop {
            let had = read_line_bounded(&mut r, &mut buf, PI_LINE_BYTES_MAX)
                .map_err(|e| err(line_no + 1, e.to_string()))?;
            if had.is_none() {
                return Ok(None);
            }
            line_no += 1;
            let text =
                std::str::from_utf8(&buf).map_err(|e| err(line_no, format!("not UTF-8: {e}")))?;
            if text.trim().is_empty() {
                continue;
            }
            // pi's loader skips what JSON.parse refuses (checked without
            // building anything, with serde_json's nesting limit).
            if serde_json::from_str::<IgnoredAny>(text).is_err() {
                skipped.push(line_no);
                continue;
            }
            // The line's bytes, taken (not copied): its objects are
            // read in place.
            let text = String::from_utf8(std::mem::take(&mut buf))
                .map_err(|e| err(line_no, format!("not UTF-8: {e}")))?;
            return Ok(Some((line_no, text)));
        }
    };
    let Some((hline, htext)) = next_line(&mut skipped_lines)? else {
        return Err(err(0, "empty file: no pi session header"));
    };
    let header = parse_obj(&htext).ok_or_else(|| err(hline, "not a JSON object"))?;
    if str_of(&header, "type").as_deref() != Some("session") {
        return Err(err(
            hline,
            "the first line is not a pi session header ({\"type\":\"session\",...})",
        ));
    }
    let version = match header.get("version").filter(|v| v.get() != "null") {
        None => 1,
        Some(v) => serde_json::from_str::<u64>(v.get())
            .ok()
            .filter(|v| (1..=PI_VERSION_MAX).contains(v))
            .ok_or_else(|| {
                err(
                    hline,
                    format!("pi session version {v} is not supported (this build reads 1..={PI_VERSION_MAX})"),
                )
            })?,
    };
    let sid = str_of(&header, "id").ok_or_else(|| err(hline, "the header has no session id"))?;
    let id = SessionId::parse(&sid)
        .map_err(|e| err(hline, format!("session id {sid:?} cannot be used: {e}")))?;
    let header_ts = header.get("timestamp").and_then(|t| parse_time_raw(t));
    let cwd = str_of(&header, "cwd").unwrap_or_default();
    let cwd = cwd.as_str();

    // Each line is migrated to v3 as pi does, mapped, and its JSON dropped.
    // v1 ids by entry index (the header being 0), for compaction indexes.
    let mut v1_ids: Vec<Option<EntryId>> = vec![None];
    let mut prev: Option<EntryId> = None;
    // Entry id -> index in `entries`: the parent checks and the path walk.
    let mut index: HashMap<EntryId, usize> = HashMap::new();
    let mut entries: Vec<(u64, Entry)> = Vec::new();
    let mut session_name: Option<String> = None;
    let mut last_ts = header_ts.unwrap_or(0);
    while let Some((line, text)) = next_line(&mut skipped_lines)? {
        let mut m = parse_obj(&text).ok_or_else(|| err(line, "not a JSON object"))?;
        if version < 2 {
            let new_id = loop {
                let g = EntryId::generate();
                if !index.contains_key(&g) && prev.as_ref() != Some(&g) {
                    break g;
                }
            };
            m.insert("id".into(), raw(new_id.as_str()).map_err(|e| err(line, e))?);
            m.insert(
                "parentId".into(),
                raw(&prev.as_ref().map(EntryId::as_str)).map_err(|e| err(line, e))?,
            );
            if str_of(&m, "type").as_deref() == Some("compaction") {
                if let Some(idx) = u64_of(&m, "firstKeptEntryIndex") {
                    // pi resolves the index among the file's entries
                    // (header = 0); only earlier ones have ids yet.
                    let target = usize::try_from(idx)
                        .ok()
                        .and_then(|t| v1_ids.get(t).cloned().flatten());
                    if let Some(t) = target {
                        m.insert(
                            "firstKeptEntryId".into(),
                            raw(t.as_str()).map_err(|e| err(line, e))?,
                        );
                    }
                    m.remove("firstKeptEntryIndex");
                }
            }
            v1_ids.push(Some(new_id.clone()));
            prev = Some(new_id);
        }
        let ty = str_of(&m, "type").ok_or_else(|| err(line, "the entry has no \"type\""))?;
        if ty == "session" {
            return Err(err(line, "a second session header"));
        }
        let raw_id =
            str_of(&m, "id").ok_or_else(|| err(line, format!("the {ty} entry has no id")))?;
        let eid =
            EntryId::parse(&raw_id).map_err(|e| err(line, format!("entry id {raw_id:?}: {e}")))?;
        if index.contains_key(&eid) {
            return Err(err(line, format!("entry id {eid} is used twice")));
        }
        let parent = match m.get("parentId").filter(|p| p.get() != "null") {
            None => None,
            Some(p) if p.get().starts_with('"') => {
                let p: String =
                    serde_json::from_str(p.get()).map_err(|e| err(line, e.to_string()))?;
                let pid =
                    EntryId::parse(&p).map_err(|e| err(line, format!("parent id {p:?}: {e}")))?;
                if pid == eid {
                    return Err(err(line, format!("entry {eid} is its own parent")));
                }
                if !index.contains_key(&pid) {
                    return Err(err(
                        line,
                        format!(
                            "the parent {pid} of entry {eid} is not defined on an earlier line"
                        ),
                    ));
                }
                Some(pid)
            }
            Some(other) => return Err(err(line, format!("parentId {other} is not a string"))),
        };
        let ts = m
            .get("timestamp")
            .and_then(|t| parse_time_raw(t))
            .or_else(|| {
                // The message's own timestamp, read without the rest.
                #[derive(Deserialize)]
                struct Stamped<'a> {
                    #[serde(borrow)]
                    timestamp: Option<&'a RawValue>,
                }
                m.get("message")
                    .and_then(|msg| serde_json::from_str::<Stamped<'_>>(msg.get()).ok())
                    .and_then(|s| s.timestamp)
                    .and_then(parse_time_raw)
            })
            .unwrap_or(last_ts);
        last_ts = ts;
        let kind = map_entry(&ty, &mut m, &eid, version).map_err(|r| err(line, r))?;
        if let EntryKind::SessionInfo { name: Some(n) } = &kind {
            if !n.trim().is_empty() {
                session_name = Some(n.trim().to_string());
            }
        }
        index.insert(eid.clone(), entries.len());
        entries.push((
            line,
            Entry {
                id: eid,
                parent_id: parent,
                timestamp_ms: ts,
                kind,
            },
        ));
    }

    // The settings in force at the leaf (the last entry): walk its path.
    let mut path: Vec<&Entry> = Vec::new();
    let mut at = entries.last().map(|(_, e)| e);
    while let Some(e) = at {
        path.push(e);
        if path.len() > entries.len() {
            return Err(err(0, "the entries' parent links form a cycle"));
        }
        at = e
            .parent_id
            .as_ref()
            .and_then(|p| index.get(p))
            .map(|&i| &entries[i].1);
    }
    path.reverse();
    let (model, thinking) = path_settings(&path);
    drop(path);
    drop(index);

    // The session: a `created` event with the settings in force at the
    // leaf, then one `entry_appended` per entry (the last is the leaf).
    let model = model
        .map(|(p, m)| ModelConfig::new(p, m))
        .unwrap_or_default();
    let mut definition = AgentDefinition::new(
        PI_AGENT_NAME,
        format!("pi coding-agent session imported from {source}"),
        "",
    )
    .with_label(session_name.unwrap_or_else(|| {
        if cwd.is_empty() {
            "pi session".to_string()
        } else {
            format!("pi session in {cwd}")
        }
    }));
    definition.model = model.clone();
    let mut state = AgentState::new().with_model(model);
    state
        .metadata
        .insert("pi.session_version".into(), Value::from(version).into());
    if !cwd.is_empty() {
        state
            .metadata
            .insert("pi.cwd".into(), Value::from(cwd).into());
    }
    if let Some(p) = str_of(&header, "parentSession") {
        state
            .metadata
            .insert("pi.parent_session".into(), Value::from(p).into());
    }
    if let Some(t) = thinking {
        state
            .metadata
            .insert("pi.thinking_level".into(), Value::from(t).into());
    }
    let created_at_ms = header_ts
        .or_else(|| entries.first().map(|(_, e)| e.timestamp_ms))
        .unwrap_or(0);
    let created = SessionEvent::Created {
        id: id.clone(),
        parent_id: None,
        agent_name: PI_AGENT_NAME.to_string(),
        label: definition.effective_label(),
        created_at_ms,
        definition: Box::new(definition),
        state: Box::new(state),
    };

    let mut commits: Vec<ImportCommit> = Vec::new();
    let mut cur = ImportCommit {
        version: 1,
        commit_id: Uuid::new_v4(),
        timestamp_ms: created_at_ms,
        events: vec![created],
        lines: vec![hline],
    };
    let mut cur_bytes = 0usize;
    for (line, entry) in entries {
        let ts = entry.timestamp_ms;
        let ev = SessionEvent::EntryAppended { entry };
        let bytes = encoded_event_len(&ev)
            .map_err(|e| err(line, format!("cannot encode the entry: {e}")))?;
        if !cur.events.is_empty()
            && (cur.events.len() >= PI_COMMIT_EVENTS_MAX
                || cur_bytes.saturating_add(bytes) > PI_COMMIT_BYTES_MAX)
        {
            let next = ImportCommit {
                version: cur.version + 1,
                commit_id: Uuid::new_v4(),
                timestamp_ms: ts,
                events: Vec::new(),
                lines: Vec::new(),
            };
            commits.push(std::mem::replace(&mut cur, next));
            cur_bytes = 0;
        }
        cur.events.push(ev);
        cur.lines.push(line);
        cur.timestamp_ms = ts;
        cur_bytes = cur_bytes.saturating_add(bytes);
    }
    commits.push(cur);
    Ok(PiSession {
        import: ImportSession { id, commits },
        file_version: version,
        skipped_lines,
    })
}

/// A JSON object whose fields are kept as their JSON text, in place in
/// the line, and parsed only when read (a repeated key keeps its last
/// value, as in a `serde_json::Value` map). A field set by a migration
/// is owned.
type Obj<'a> = BTreeMap<String, Cow<'a, RawValue>>;

/// The object `text` holds, read in place.
fn parse_obj(text: &str) -> Option<Obj<'_>> {
    let m: BTreeMap<String, &RawValue> = serde_json::from_str(text).ok()?;
    Some(m.into_iter().map(|(k, v)| (k, Cow::Borrowed(v))).collect())
}

/// A field that is a string.
fn str_of(m: &Obj, key: &str) -> Option<String> {
    m.get(key)
        .filter(|v| v.get().starts_with('"'))
        .and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is a boolean.
fn bool_of(m: &Obj, key: &str) -> Option<bool> {
    m.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is a non-negative integer.
fn u64_of(m: &Obj, key: &str) -> Option<u64> {
    m.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is an integer.
fn i64_of(m: &Obj, key: &str) -> Option<i64> {
    m.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is a number, as a float.
fn f64_of(m: &Obj, key: &str) -> Option<f64> {
    m.get(key)
        .filter(|v| {
            v.get()
                .starts_with(|c: char| c == '-' || c.is_ascii_digit())
        })
        .and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is an object, taken out of `m` (a migration sets no
/// objects).
fn take_obj<'a>(m: &mut Obj<'a>, key: &str) -> Option<Obj<'a>> {
    match m.remove(key)? {
        Cow::Borrowed(v) => parse_obj(v.get()),
        Cow::Owned(_) => None,
    }
}

/// A field taken out of `m` as an opaque payload.
fn take_json(m: &mut Obj, key: &str) -> Result<Option<Json>, String> {
    m.remove(key)
        .map(|v| Json::from_text(v.get()).map_err(|e| format!("\"{key}\": {e}")))
        .transpose()
}

/// The whole object as an opaque payload.
fn obj_json(m: Obj) -> Result<Json, String> {
    let mut text = String::from("{");
    for (i, (k, v)) in m.iter().enumerate() {
        if i > 0 {
            text.push(',');
        }
        text.push_str(&serde_json::to_string(k).map_err(|e| e.to_string())?);
        text.push(':');
        text.push_str(v.get());
    }
    text.push('}');
    drop(m);
    Json::from_text(&text).map_err(|e| e.to_string())
}

/// A value as a field's JSON text.
fn raw<T: serde::Serialize + ?Sized>(v: &T) -> Result<Cow<'static, RawValue>, String> {
    serde_json::value::to_raw_value(v)
        .map(Cow::Owned)
        .map_err(|e| e.to_string())
}

fn get_str(m: &Obj, key: &str) -> Result<String, String> {
    str_of(m, key).ok_or_else(|| format!("\"{key}\" is missing or not a string"))
}

/// Maps one (migrated) pi entry to an entry kind.
fn map_entry(ty: &str, m: &mut Obj, own_id: &EntryId, version: u64) -> Result<EntryKind, String> {
    Ok(match ty {
        "message" => {
            let mut msg =
                take_obj(m, "message").ok_or("the message entry has no \"message\" object")?;
            map_message(&mut msg, version)?
        }
        "model_change" => EntryKind::ModelChange {
            provider: get_str(m, "provider")?,
            model_id: get_str(m, "modelId")?,
        },
        "thinking_level_change" => EntryKind::ThinkingLevelChange {
            thinking_level: get_str(m, "thinkingLevel")?,
        },
        "compaction" => EntryKind::Compaction {
            summary: get_str(m, "summary")?,
            // pi keeps nothing before the compaction when its first kept
            // entry is not found; pointing at the compaction itself gives
            // the same context here.
            first_kept_entry_id: str_of(m, "firstKeptEntryId")
                .and_then(|s| EntryId::parse(&s).ok())
                .unwrap_or_else(|| own_id.clone()),
            tokens_before: u64_of(m, "tokensBefore").unwrap_or(0),
        },
        "branch_summary" => EntryKind::BranchSummary {
            from_id: str_of(m, "fromId").and_then(|s| EntryId::parse(&s).ok()),
            summary: get_str(m, "summary")?,
        },
        "custom" => EntryKind::Custom {
            custom_type: get_str(m, "customType")?,
            data: take_json(m, "data")?.unwrap_or_default(),
        },
        "custom_message" => EntryKind::CustomMessage {
            custom_type: get_str(m, "customType")?,
            content: content(m.remove("content"))?,
            display: bool_of(m, "display").unwrap_or(false),
            details: take_json(m, "details")?.filter(|d| !d.is_null()),
        },
        "label" => {
            let target = get_str(m, "targetId")?;
            EntryKind::Label {
                target_id: EntryId::parse(&target)
                    .map_err(|e| format!("label target {target:?}: {e}"))?,
                label: str_of(m, "label"),
            }
        }
        "session_info" => EntryKind::SessionInfo {
            name: str_of(m, "name").map(|n| n.trim().to_string()),
        },
        other => return Err(format!("unknown entry type {other:?}")),
    })
}

fn map_message(msg: &mut Obj, version: u64) -> Result<EntryKind, String> {
    let role = str_of(msg, "role").ok_or("the message has no \"role\"")?;
    // v2 -> v3: the hookMessage role was renamed to custom.
    let role = if role == "hookMessage" && version < 3 {
        "custom"
    } else {
        role.as_str()
    };
    let message = |message| EntryKind::Message { message };
    Ok(match role {
        "user" => message(Message::User {
            content: content(msg.remove("content"))?,
        }),
        "assistant" => {
            let provider = str_of(msg, "provider").unwrap_or_default();
            let model = str_of(msg, "model").unwrap_or_default();
            let model = match (provider.is_empty(), model.is_empty()) {
                (false, false) => Some(format!("{provider}/{model}")),
                (true, false) => Some(model),
                _ => None,
            };
            let stop_reason = match str_of(msg, "stopReason").as_deref() {
                None | Some("stop") => StopReason::Stop,
                Some("length") => StopReason::Length,
                Some("toolUse") => StopReason::ToolUse,
                Some("error") => StopReason::Error,
                Some("aborted") => StopReason::Aborted,
                Some(other) => return Err(format!("unknown stopReason {other:?}")),
            };
            let u = take_obj(msg, "usage").unwrap_or_default();
            let tokens = |k: &str| {
                f64_of(&u, k)
                    .filter(|t| t.is_finite() && *t >= 0.0)
                    .map_or(0, |t| t as u64)
            };
            let usage = Usage {
                input_tokens: tokens("input"),
                output_tokens: tokens("output"),
                cache_read_tokens: tokens("cacheRead"),
                cache_write_tokens: tokens("cacheWrite"),
            };
            message(Message::Assistant {
                content: content(msg.remove("content"))?,
                stop_reason,
                usage,
                model,
                error_message: str_of(msg, "errorMessage"),
            })
        }
        "toolResult" => message(Message::ToolResult {
            tool_call_id: get_str(msg, "toolCallId")?,
            tool_name: str_of(msg, "toolName").unwrap_or_default(),
            content: content(msg.remove("content"))?,
            is_error: bool_of(msg, "isError").unwrap_or(false),
        }),
        "custom" => EntryKind::CustomMessage {
            custom_type: get_str(msg, "customType")?,
            content: content(msg.remove("content"))?,
            display: bool_of(msg, "display").unwrap_or(false),
            details: take_json(msg, "details")?.filter(|d| !d.is_null()),
        },
        "branchSummary" => EntryKind::BranchSummary {
            from_id: str_of(msg, "fromId").and_then(|s| EntryId::parse(&s).ok()),
            summary: get_str(msg, "summary")?,
        },
        "compactionSummary" => EntryKind::CustomMessage {
            custom_type: "pi.compactionSummary".into(),
            content: vec![ContentBlock::text(get_str(msg, "summary")?)],
            display: true,
            details: None,
        },
        "bashExecution" => {
            let excluded = bool_of(msg, "excludeFromContext").unwrap_or(false);
            let text = (!excluded).then(|| bash_execution_text(msg));
            let whole = obj_json(std::mem::take(msg))?;
            if let Some(text) = text {
                EntryKind::CustomMessage {
                    custom_type: "pi.bashExecution".into(),
                    content: vec![ContentBlock::text(text)],
                    display: true,
                    details: Some(whole),
                }
            } else {
                EntryKind::Custom {
                    custom_type: "pi.bashExecution".into(),
                    data: whole,
                }
            }
        }
        other => return Err(format!("unknown message role {other:?}")),
    })
}

/// The text pi sends to the model for a bash execution.
fn bash_execution_text(msg: &Obj) -> String {
    let command = str_of(msg, "command").unwrap_or_default();
    let output = str_of(msg, "output").unwrap_or_default();
    let mut text = format!("Ran `{command}`\n");
    if output.is_empty() {
        text.push_str("(no output)");
    } else {
        text.push_str(&format!("```\n{output}\n```"));
    }
    let flag = |k: &str| bool_of(msg, k).unwrap_or(false);
    if flag("cancelled") {
        text.push_str("\n\n(command cancelled)");
    } else if let Some(code) = i64_of(msg, "exitCode") {
        if code != 0 {
            text.push_str(&format!("\n\nCommand exited with code {code}"));
        }
    }
    if flag("truncated") {
        if let Some(p) = str_of(msg, "fullOutputPath") {
            text.push_str(&format!("\n\n[Output truncated. Full output: {p}]"));
        }
    }
    text
}

/// Message content: a string (one text block) or an array of blocks.
fn content(v: Option<Cow<'_, RawValue>>) -> Result<Vec<ContentBlock>, String> {
    let Some(v) = v else {
        return Ok(Vec::new());
    };
    match v.get().as_bytes().first() {
        Some(b'n') => Ok(Vec::new()),
        Some(b'"') => Ok(vec![ContentBlock::text(
            serde_json::from_str::<String>(v.get()).map_err(|e| e.to_string())?,
        )]),
        Some(b'[') => {
            let blocks: Vec<&RawValue> =
                serde_json::from_str(v.get()).map_err(|e| e.to_string())?;
            blocks.into_iter().map(block).collect()
        }
        _ => Err(format!(
            "content {} is neither text nor a list of blocks",
            json_kind(&v)
        )),
    }
}

fn json_kind(v: &RawValue) -> &'static str {
    match v.get().as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}

fn take_str(m: &mut Obj, key: &str) -> Result<String, String> {
    let s = get_str(m, key);
    m.remove(key);
    s
}

fn take_opt_str(m: &mut Obj, key: &str) -> Option<String> {
    let s = str_of(m, key);
    m.remove(key);
    s
}

fn block(b: &RawValue) -> Result<ContentBlock, String> {
    let Some(mut m) = parse_obj(b.get()) else {
        return Err("a content block is not an object".into());
    };
    let ty = take_str(&mut m, "type")?;
    Ok(match ty.as_str() {
        "text" => ContentBlock::Text {
            text: take_str(&mut m, "text")?,
        },
        "thinking" => ContentBlock::Thinking {
            thinking: take_str(&mut m, "thinking")?,
            signature: take_opt_str(&mut m, "thinkingSignature"),
            redacted: bool_of(&m, "redacted").unwrap_or(false),
        },
        "toolCall" => ContentBlock::ToolCall {
            id: take_str(&mut m, "id")?,
            name: take_str(&mut m, "name")?,
            arguments: take_json(&mut m, "arguments")?.unwrap_or_default(),
            signature: take_opt_str(&mut m, "thoughtSignature"),
        },
        "image" => ContentBlock::Image {
            mime_type: take_str(&mut m, "mimeType")?,
            data: take_str(&mut m, "data")?,
        },
        other => return Err(format!("unknown content block type {other:?}")),
    })
}

/// A time field's JSON text (see [`parse_time`]); only a number or a
/// string is parsed.
fn parse_time_raw(v: &RawValue) -> Option<i64> {
    let t = v.get();
    if !t.starts_with(|c: char| c == '"' || c == '-' || c.is_ascii_digit()) {
        return None;
    }
    serde_json::from_str::<Value>(t)
        .ok()
        .as_ref()
        .and_then(parse_time)
}

/// A time: milliseconds since the epoch (a number) or an RFC 3339 /
/// ISO 8601 string such as `2025-01-02T03:04:05.678Z` or
/// `2025-01-02T05:04:05+02:00`.
pub(crate) fn parse_time(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)),
        Value::String(s) => parse_rfc3339_ms(s),
        _ => None,
    }
}

fn parse_rfc3339_ms(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        let part = s.get(r)?;
        if part.is_empty() || !part.bytes().all(|c| c.is_ascii_digit()) {
            return None;
        }
        part.parse().ok()
    };
    if b.len() < 19 || b[4] != b'-' || b[7] != b'-' || !matches!(b[10], b'T' | b't' | b' ') {
        return None;
    }
    if b[13] != b':' || b[16] != b':' {
        return None;
    }
    let (y, mo, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (h, mi, sec) = (num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || sec > 60 {
        return None;
    }
    let mut i = 19;
    let mut ms = 0i64;
    if b.get(i) == Some(&b'.') {
        let start = i + 1;
        let mut end = start;
        while b.get(end).is_some_and(u8::is_ascii_digit) {
            end += 1;
        }
        if end == start {
            return None;
        }
        // Milliseconds from the first three fraction digits.
        let frac = s.get(start..end.min(start + 3))?;
        ms = frac.parse::<i64>().ok()? * 10i64.pow(3 - frac.len() as u32);
        i = end;
    }
    let offset_s = match b.get(i) {
        Some(b'Z' | b'z') if i + 1 == b.len() => 0,
        Some(&sign @ (b'+' | b'-')) if b.len() == i + 6 && b[i + 3] == b':' => {
            let oh = num(i + 1..i + 3)?;
            let om = num(i + 4..i + 6)?;
            let o = oh * 3600 + om * 60;
            if sign == b'+' {
                o
            } else {
                -o
            }
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo, d);
    let secs = days * 86_400 + h * 3600 + mi * 60 + sec - offset_s;
    secs.checked_mul(1000)?.checked_add(ms)
}

/// Howard Hinnant's civil-to-days algorithm (proleptic Gregorian).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_like_javascript_dates() {
        assert_eq!(parse_rfc3339_ms("1970-01-01T00:00:00.000Z"), Some(0));
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T07:35:12Z"),
            Some(1_796_024_112_000)
        );
        assert_eq!(
            parse_rfc3339_ms("2026-11-30T09:35:12.5+02:00"),
            Some(1_796_024_112_500)
        );
        assert_eq!(parse_rfc3339_ms("2026-11-30"), None);
        assert_eq!(parse_rfc3339_ms("2026-13-30T07:35:12Z"), None);
        assert_eq!(parse_time(&Value::from(42)), Some(42));
    }

    #[test]
    fn v1_is_a_linear_chain_with_compaction_index_resolved() {
        let file = concat!(
            r#"{"type":"session","id":"s1","timestamp":"2025-01-01T00:00:00.000Z","cwd":"/w"}"#,
            "\n",
            r#"{"type":"message","timestamp":"2025-01-01T00:00:01.000Z","message":{"role":"user","content":"a"}}"#,
            "\n",
            r#"{"type":"message","timestamp":"2025-01-01T00:00:02.000Z","message":{"role":"assistant","content":[{"type":"text","text":"b"}],"provider":"p","model":"m","stopReason":"stop"}}"#,
            "\n",
            r#"{"type":"compaction","timestamp":"2025-01-01T00:00:03.000Z","summary":"s","firstKeptEntryIndex":2,"tokensBefore":5}"#,
            "\n"
        );
        let s = read_pi(file.as_bytes(), "t").unwrap();
        assert_eq!(s.file_version, 1);
        let evs: Vec<&SessionEvent> = s.import.commits.iter().flat_map(|c| &c.events).collect();
        let entries: Vec<&Entry> = evs
            .iter()
            .filter_map(|e| match e {
                SessionEvent::EntryAppended { entry } => Some(entry),
                _ => None,
            })
            .collect();
        assert_eq!(entries.len(), 3);
        assert_eq!(entries[0].parent_id, None);
        assert_eq!(entries[1].parent_id.as_ref(), Some(&entries[0].id));
        assert_eq!(entries[2].parent_id.as_ref(), Some(&entries[1].id));
        match &entries[2].kind {
            EntryKind::Compaction {
                first_kept_entry_id,
                ..
            } => assert_eq!(first_kept_entry_id, &entries[1].id),
            k => panic!("{k:?}"),
        }
        assert_eq!(entries[0].timestamp_ms, 1_735_689_601_000);
    }

    #[test]
    fn long_sessions_are_split_into_bounded_commits_that_fold() {
        let mut file = String::from(
            r#"{"type":"session","version":3,"id":"long","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#,
        );
        file.push('\n');
        let n = PI_COMMIT_EVENTS_MAX * 2 + 10;
        for i in 0..n {
            let parent = if i == 0 {
                "null".to_string()
            } else {
                format!("\"e{}\"", i - 1)
            };
            file.push_str(&format!(
                r#"{{"type":"custom","id":"e{i}","parentId":{parent},"timestamp":"2025-01-01T00:00:01Z","customType":"c","data":{i}}}"#
            ));
            file.push('\n');
        }
        let s = read_pi(file.as_bytes(), "t").unwrap();
        let commits = &s.import.commits;
        assert_eq!(commits.len(), 3);
        for (i, c) in commits.iter().enumerate() {
            assert_eq!(c.version, i as u64 + 1);
            assert!(c.events.len() <= PI_COMMIT_EVENTS_MAX);
            assert_eq!(c.events.len(), c.lines.len());
        }
        let folded = s.import.validate().unwrap();
        assert_eq!(folded.state().transcript.len(), n);
        let last = format!("e{}", n - 1);
        assert_eq!(
            folded.state().transcript.leaf().map(|l| l.as_str()),
            Some(last.as_str())
        );
    }

    const HEAD: &str = r#"{"type":"session","version":3,"id":"sig","timestamp":"2025-01-01T00:00:00Z","cwd":"/w"}"#;

    fn entries_of(s: &PiSession) -> Vec<&Entry> {
        s.import
            .commits
            .iter()
            .flat_map(|c| &c.events)
            .filter_map(|e| match e {
                SessionEvent::EntryAppended { entry } => Some(entry),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn thinking_and_tool_call_signatures_are_kept() {
        let user = r#"{"type":"message","id":"u1","parentId":null,"timestamp":"2025-01-01T00:00:01Z","message":{"role":"user","content":"hi"}}"#;
        let asst = r#"{"type":"message","id":"a1","parentId":"u1","timestamp":"2025-01-01T00:00:02Z","message":{"role":"assistant","provider":"anthropic","model":"claude","stopReason":"toolUse","content":[{"type":"thinking","thinking":"hm","thinkingSignature":"SIG1"},{"type":"thinking","thinking":"","thinkingSignature":"ENC","redacted":true},{"type":"toolCall","id":"c1","name":"read","arguments":{"path":"x"},"thoughtSignature":"TS"}]}}"#;
        let file = format!("{HEAD}\n{user}\n{asst}\n");
        let s = read_pi(file.as_bytes(), "t").unwrap();
        let entries = entries_of(&s);
        let EntryKind::Message {
            message: Message::Assistant { content, .. },
        } = &entries[1].kind
        else {
            panic!("{:?}", entries[1].kind)
        };
        assert_eq!(
            content,
            &vec![
                ContentBlock::Thinking {
                    thinking: "hm".into(),
                    signature: Some("SIG1".into()),
                    redacted: false
                },
                ContentBlock::Thinking {
                    thinking: String::new(),
                    signature: Some("ENC".into()),
                    redacted: true
                },
                ContentBlock::ToolCall {
                    id: "c1".into(),
                    name: "read".into(),
                    arguments: serde_json::json!({"path": "x"}).into(),
                    signature: Some("TS".into())
                },
            ]
        );
        // The signatures survive the store's codec.
        for c in &s.import.commits {
            for ev in &c.events {
                let back = crate::session::decode_event(&crate::session::encode_event(ev).unwrap())
                    .unwrap();
                assert_eq!(&back, ev);
            }
        }
    }

    #[test]
    fn lines_pi_skips_are_skipped_and_reported() {
        let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        let b = r#"{"type":"custom","id":"b1","parentId":"a1","timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        // Two objects glued together on one line, as pi's own history
        // has them: JSON.parse refuses the line and pi skips it.
        let file = format!("{HEAD}\n{a}\n{a}{b}\n\n{b}\n{{\"type\":\n");
        let s = read_pi(file.as_bytes(), "t").unwrap();
        assert_eq!(s.skipped_lines, vec![3, 6]);
        let ids: Vec<&str> = entries_of(&s).iter().map(|e| e.id.as_str()).collect();
        assert_eq!(ids, vec!["a1", "b1"]);
        s.import.validate().unwrap();
    }

    #[test]
    fn a_message_over_the_record_limit_writes_nothing() {
        use crate::store::exchange::{import_from, ExchangeError, ImportOptions};
        use crate::store::{LogStore, LogStoreOptions};
        let small = r#"{"type":"message","id":"u1","parentId":null,"timestamp":"2025-01-01T00:00:01Z","message":{"role":"user","content":"hi"}}"#;
        let big = format!(
            r#"{{"type":"message","id":"u2","parentId":"u1","timestamp":"2025-01-01T00:00:02Z","message":{{"role":"user","content":"{}"}}}}"#,
            "x".repeat(100_000)
        );
        let file = format!("{HEAD}\n{small}\n{big}\n");
        let s = read_pi(file.as_bytes(), "t").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let store = LogStore::open(
            dir.path(),
            LogStoreOptions {
                durability: spool_engine::Durability::Buffered,
                record_bytes_max: Some(64 << 10),
                ..Default::default()
            },
        )
        .unwrap();
        let sessions = vec![s.import];
        let err = import_from(
            &store,
            &mut sessions.as_slice(),
            &ImportOptions::default(),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(err, ExchangeError::Unstorable { line: 3, .. }),
            "{err}"
        );
        assert_eq!(store.engine().unwrap().last_seq(), 0, "nothing written");
    }

    #[test]
    fn dangling_and_duplicate_ids_name_the_line() {
        let head = r#"{"type":"session","version":3,"id":"s","timestamp":"2025-01-01T00:00:00Z","cwd":""}"#;
        let a = r#"{"type":"custom","id":"a1","parentId":null,"timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        let dangling = r#"{"type":"custom","id":"b1","parentId":"zz","timestamp":"2025-01-01T00:00:00Z","customType":"x"}"#;
        let e = read_pi(format!("{head}\n{a}\n\n{dangling}\n").as_bytes(), "t").unwrap_err();
        assert_eq!(e.line, 4, "{e}");
        let e = read_pi(format!("{head}\n{a}\n{a}\n").as_bytes(), "t").unwrap_err();
        assert_eq!(e.line, 3, "{e}");
        // A cut last line is not JSON: skipped, as pi skips it.
        let s = read_pi(format!("{head}\n{a}\n{{\"type\":").as_bytes(), "t").unwrap();
        assert_eq!(s.skipped_lines, vec![3]);
        let v4 = head.replace("\"version\":3", "\"version\":4");
        assert_eq!(read_pi(v4.as_bytes(), "t").unwrap_err().line, 1);
    }
}
