//! One pi line to an entry: its JSON object read in place, the v2→v3
//! migration of messages, and the mapping of entry types, message roles
//! and content blocks onto [`EntryKind`], with pi's timestamps.

use super::*;

/// A JSON object whose fields are kept as their JSON text, in place in
/// the line, and parsed only when read (a repeated key keeps its last
/// value, as in a `serde_json::Value` map). A field set by a migration
/// is owned.
pub(super) type Obj<'a> = BTreeMap<String, Cow<'a, RawValue>>;

/// The object `text` holds, read in place.
pub(super) fn parse_obj(text: &str) -> Option<Obj<'_>> {
    let m: BTreeMap<String, &RawValue> = serde_json::from_str(text).ok()?;
    Some(m.into_iter().map(|(k, v)| (k, Cow::Borrowed(v))).collect())
}

/// A field that is a string.
pub(super) fn str_of(m: &Obj, key: &str) -> Option<String> {
    m.get(key)
        .filter(|v| v.get().starts_with('"'))
        .and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is a boolean.
pub(super) fn bool_of(m: &Obj, key: &str) -> Option<bool> {
    m.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is a non-negative integer.
pub(super) fn u64_of(m: &Obj, key: &str) -> Option<u64> {
    m.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is an integer.
pub(super) fn i64_of(m: &Obj, key: &str) -> Option<i64> {
    m.get(key).and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is a number, as a float.
pub(super) fn f64_of(m: &Obj, key: &str) -> Option<f64> {
    m.get(key)
        .filter(|v| {
            v.get()
                .starts_with(|c: char| c == '-' || c.is_ascii_digit())
        })
        .and_then(|v| serde_json::from_str(v.get()).ok())
}

/// A field that is an object, taken out of `m` (a migration sets no
/// objects).
pub(super) fn take_obj<'a>(m: &mut Obj<'a>, key: &str) -> Option<Obj<'a>> {
    match m.remove(key)? {
        Cow::Borrowed(v) => parse_obj(v.get()),
        Cow::Owned(_) => None,
    }
}

/// A field taken out of `m` as an opaque payload.
pub(super) fn take_json(m: &mut Obj, key: &str) -> Result<Option<Json>, String> {
    m.remove(key)
        .map(|v| Json::from_text(v.get()).map_err(|e| format!("\"{key}\": {e}")))
        .transpose()
}

/// The whole object as an opaque payload.
pub(super) fn obj_json(m: Obj) -> Result<Json, String> {
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
pub(super) fn raw<T: serde::Serialize + ?Sized>(v: &T) -> Result<Cow<'static, RawValue>, String> {
    serde_json::value::to_raw_value(v)
        .map(Cow::Owned)
        .map_err(|e| e.to_string())
}

pub(super) fn get_str(m: &Obj, key: &str) -> Result<String, String> {
    str_of(m, key).ok_or_else(|| format!("\"{key}\" is missing or not a string"))
}

/// Maps one (migrated) pi entry to an entry kind.
pub(super) fn map_entry(
    ty: &str,
    m: &mut Obj,
    own_id: &EntryId,
    version: u64,
) -> Result<EntryKind, String> {
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

pub(super) fn map_message(msg: &mut Obj, version: u64) -> Result<EntryKind, String> {
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
pub(super) fn bash_execution_text(msg: &Obj) -> String {
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
pub(super) fn content(v: Option<Cow<'_, RawValue>>) -> Result<Vec<ContentBlock>, String> {
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

pub(super) fn json_kind(v: &RawValue) -> &'static str {
    match v.get().as_bytes().first() {
        Some(b'n') => "null",
        Some(b't' | b'f') => "a boolean",
        Some(b'"') => "a string",
        Some(b'[') => "an array",
        Some(b'{') => "an object",
        _ => "a number",
    }
}

pub(super) fn take_str(m: &mut Obj, key: &str) -> Result<String, String> {
    let s = get_str(m, key);
    m.remove(key);
    s
}

pub(super) fn take_opt_str(m: &mut Obj, key: &str) -> Option<String> {
    let s = str_of(m, key);
    m.remove(key);
    s
}

pub(super) fn block(b: &RawValue) -> Result<ContentBlock, String> {
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
pub(super) fn parse_time_raw(v: &RawValue) -> Option<i64> {
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

pub(super) fn parse_rfc3339_ms(s: &str) -> Option<i64> {
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
pub(super) fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}
