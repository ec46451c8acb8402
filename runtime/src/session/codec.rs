//! Binary encodings of events and snapshots for event-sourced stores.
//!
//! Both are one schema byte followed by MessagePack in the named
//! (struct-as-map) form, so adding a field with a serde default stays
//! readable by newer code. Decoding never panics on hostile bytes: input
//! is bounded by [`MAX_CODEC_INPUT`], rmp-serde bounds nesting depth, and
//! every failure is a [`CodecError`]. Bytes after the encoded value are
//! ignored.
//!
//! A snapshot is the fold of a session at some version. A snapshot whose
//! schema byte differs from [`SNAPSHOT_SCHEMA`], or that fails to decode,
//! must be ignored by the caller and the events replayed instead.

use serde::{Deserialize, Serialize};

use super::definition::AgentDefinition;
use super::events::SessionEvent;
use super::info::AgentSessionInfo;
use super::state::AgentState;
use super::AgentSession;

/// Schema version of encoded events.
pub const EVENT_SCHEMA: u8 = 1;
/// Schema version of encoded snapshots. Bump it whenever the snapshot
/// shape changes in a way older decoders would misread.
pub const SNAPSHOT_SCHEMA: u8 = 1;
/// Largest input the decoders accept (256 MiB).
pub const MAX_CODEC_INPUT: usize = 256 << 20;

/// An event or snapshot could not be encoded or decoded.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    #[error("empty {what} payload")]
    Empty { what: &'static str },
    #[error("{what} schema {found} is not supported (expected {expected})")]
    UnsupportedSchema {
        what: &'static str,
        found: u8,
        expected: u8,
    },
    #[error("{what} payload of {len} bytes exceeds the {max}-byte limit")]
    TooLarge {
        what: &'static str,
        len: usize,
        max: usize,
    },
    #[error("malformed {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    #[error("cannot encode {what}: {reason}")]
    Encode { what: &'static str, reason: String },
}

fn encode<T: Serialize>(what: &'static str, schema: u8, value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![schema];
    rmp_serde::encode::write_named(&mut out, value).map_err(|e| CodecError::Encode {
        what,
        reason: e.to_string(),
    })?;
    Ok(out)
}

fn decode<'a, T: Deserialize<'a>>(
    what: &'static str,
    schema: u8,
    bytes: &'a [u8],
) -> Result<T, CodecError> {
    if bytes.len() > MAX_CODEC_INPUT {
        return Err(CodecError::TooLarge {
            what,
            len: bytes.len(),
            max: MAX_CODEC_INPUT,
        });
    }
    let (&found, body) = bytes.split_first().ok_or(CodecError::Empty { what })?;
    if found != schema {
        return Err(CodecError::UnsupportedSchema {
            what,
            found,
            expected: schema,
        });
    }
    // `from_read_ref` checks every declared length against the input before
    // allocating, so a hostile length cannot trigger a huge allocation.
    let mut de = rmp_serde::Deserializer::from_read_ref(body);
    let value = T::deserialize(&mut de).map_err(|e| CodecError::Malformed {
        what,
        reason: e.to_string(),
    })?;
    Ok(value)
}

/// Encodes one event: `[EVENT_SCHEMA] ++ msgpack(named)`.
pub fn encode_event(event: &SessionEvent) -> Result<Vec<u8>, CodecError> {
    encode("event", EVENT_SCHEMA, event)
}

/// Decodes one event written by [`encode_event`].
pub fn decode_event(bytes: &[u8]) -> Result<SessionEvent, CodecError> {
    decode("event", EVENT_SCHEMA, bytes)
}

/// The body of an `entry_appended` event, read as a plain struct: the
/// `type` tag is checked but the event enum's internally tagged decoding
/// (which buffers the whole event, entry text included, before decoding
/// it) is skipped.
#[derive(Deserialize)]
struct EntryAppendedBody<'a> {
    #[serde(rename = "type", borrow)]
    tag: std::borrow::Cow<'a, str>,
    entry: crate::transcript::Entry,
}

/// Decodes the entry of an `entry_appended` event written by
/// [`encode_event`]; the same bytes decoded by [`decode_event`] give
/// `SessionEvent::EntryAppended` with this entry. Any other event is an
/// error (`Malformed`).
///
/// The layout [`encode_event`] writes is read by hand (module `fast`); bytes in
/// any other shape (another field order, a JSON value inside the entry, an
/// unknown kind, anything malformed) go through serde, which gives the
/// answer and the error. The hand reader accepts only bytes serde decodes
/// to the same entry (checked by tests and the `event_decode` fuzz target).
pub fn decode_appended_entry(bytes: &[u8]) -> Result<crate::transcript::Entry, CodecError> {
    decode_appended_entry_as(bytes, true)
}

/// [`decode_appended_entry`] for a caller that sets the parent itself
/// (readers take it from the index): with `keep_parent` false the written
/// parent is checked like the rest but not copied, and the entry's parent
/// may be `None`.
pub(crate) fn decode_appended_entry_as(
    bytes: &[u8],
    keep_parent: bool,
) -> Result<crate::transcript::Entry, CodecError> {
    if bytes.len() <= MAX_CODEC_INPUT {
        if let Some((&EVENT_SCHEMA, body)) = bytes.split_first() {
            if let Some(entry) = fast::appended_entry(body, keep_parent) {
                return Ok(entry);
            }
        }
    }
    decode_appended_entry_serde(bytes)
}

/// [`decode_appended_entry`] through serde alone: the reference the hand
/// reader is checked against (tests, the `event_decode` fuzz target).
#[doc(hidden)]
pub fn decode_appended_entry_serde(bytes: &[u8]) -> Result<crate::transcript::Entry, CodecError> {
    let body: EntryAppendedBody<'_> = decode("event", EVENT_SCHEMA, bytes)?;
    if body.tag != "entry_appended" {
        return Err(CodecError::Malformed {
            what: "event",
            reason: format!(
                "an {} event where an entry_appended event was expected",
                body.tag
            ),
        });
    }
    Ok(body.entry)
}

/// A hand reader of the MessagePack that [`encode_event`] writes for an
/// `entry_appended` event: named maps with their fields in declaration
/// order, enum tags first (serde's internally tagged form), unit variants
/// as strings. Every reader answers `None` for anything else, and the
/// caller falls back to serde. Never panics: every length is checked
/// against the bytes left before it is used, and nothing is allocated
/// beyond the bytes it describes (a string's bytes; a block list's
/// capacity is bounded by the bytes left).
mod fast {
    use crate::transcript::{ContentBlock, Entry, EntryId, EntryKind, Message, StopReason, Usage};

    struct Reader<'a> {
        b: &'a [u8],
    }

    impl<'a> Reader<'a> {
        fn byte(&mut self) -> Option<u8> {
            let (&x, rest) = self.b.split_first()?;
            self.b = rest;
            Some(x)
        }

        fn take(&mut self, n: usize) -> Option<&'a [u8]> {
            if n > self.b.len() {
                return None;
            }
            let (x, rest) = self.b.split_at(n);
            self.b = rest;
            Some(x)
        }

        fn be(&mut self, n: usize) -> Option<u64> {
            Some(
                self.take(n)?
                    .iter()
                    .fold(0u64, |a, &x| (a << 8) | u64::from(x)),
            )
        }

        fn peek_nil(&self) -> bool {
            self.b.first() == Some(&0xc0)
        }

        /// A string's bytes, not yet checked to be UTF-8.
        fn str_bytes(&mut self) -> Option<&'a [u8]> {
            let n = match self.byte()? {
                m @ 0xa0..=0xbf => usize::from(m & 0x1f),
                0xd9 => usize::try_from(self.be(1)?).ok()?,
                0xda => usize::try_from(self.be(2)?).ok()?,
                0xdb => usize::try_from(self.be(4)?).ok()?,
                _ => return None,
            };
            self.take(n)
        }

        fn str(&mut self) -> Option<&'a str> {
            std::str::from_utf8(self.str_bytes()?).ok()
        }

        fn string(&mut self) -> Option<String> {
            self.str().map(str::to_owned)
        }

        /// A map key equal to `want` (equal bytes are UTF-8, as `want` is).
        /// The form the writer uses for a short key (a fixstr of `want`'s
        /// length) is matched in one comparison; any other form is read
        /// with [`Reader::str_bytes`]. Both accept exactly the same bytes.
        fn key(&mut self, want: &str) -> Option<()> {
            let w = want.as_bytes();
            if let Some((&m, rest)) = self.b.split_first() {
                if w.len() < 32 && usize::from(m) == 0xa0 | w.len() {
                    self.b = rest.strip_prefix(w)?;
                    return Some(());
                }
            }
            (self.str_bytes()? == w).then_some(())
        }

        /// A nil or a string, checked but not copied.
        fn skip_opt_str(&mut self) -> Option<()> {
            if self.peek_nil() {
                self.byte()?;
                return Some(());
            }
            self.str().map(|_| ())
        }

        /// A nil or a string, borrowed.
        fn opt_str(&mut self) -> Option<Option<&'a str>> {
            if self.peek_nil() {
                self.byte()?;
                return Some(None);
            }
            self.str().map(Some)
        }

        fn opt_string(&mut self) -> Option<Option<String>> {
            Some(self.opt_str()?.map(str::to_owned))
        }

        fn map_len(&mut self) -> Option<u64> {
            match self.byte()? {
                m @ 0x80..=0x8f => Some(u64::from(m & 0x0f)),
                0xde => self.be(2),
                0xdf => self.be(4),
                _ => None,
            }
        }

        fn array_len(&mut self) -> Option<u64> {
            match self.byte()? {
                m @ 0x90..=0x9f => Some(u64::from(m & 0x0f)),
                0xdc => self.be(2),
                0xdd => self.be(4),
                _ => None,
            }
        }

        fn bool(&mut self) -> Option<bool> {
            match self.byte()? {
                0xc2 => Some(false),
                0xc3 => Some(true),
                _ => None,
            }
        }

        /// Any integer form, as i128 (every MessagePack integer fits).
        fn int(&mut self) -> Option<i128> {
            let m = self.byte()?;
            Some(match m {
                0x00..=0x7f => i128::from(m),
                0xe0..=0xff => i128::from(m as i8),
                0xcc => i128::from(self.be(1)?),
                0xcd => i128::from(self.be(2)?),
                0xce => i128::from(self.be(4)?),
                0xcf => i128::from(self.be(8)?),
                0xd0 => i128::from(self.be(1)? as u8 as i8),
                0xd1 => i128::from(self.be(2)? as u16 as i16),
                0xd2 => i128::from(self.be(4)? as u32 as i32),
                0xd3 => i128::from(self.be(8)? as i64),
                _ => return None,
            })
        }

        fn u64(&mut self) -> Option<u64> {
            u64::try_from(self.int()?).ok()
        }

        fn i64(&mut self) -> Option<i64> {
            i64::try_from(self.int()?).ok()
        }
    }

    /// The entry of an `entry_appended` event body (after the schema byte);
    /// with `keep_parent` false its parent is checked but left `None`.
    pub(super) fn appended_entry(body: &[u8], keep_parent: bool) -> Option<Entry> {
        let r = &mut Reader { b: body };
        if r.map_len()? != 2 {
            return None;
        }
        r.key("type")?;
        if r.str()? != "entry_appended" {
            return None;
        }
        r.key("entry")?;
        entry(r, keep_parent)
    }

    fn entry(r: &mut Reader<'_>, keep_parent: bool) -> Option<Entry> {
        if r.map_len()? != 4 {
            return None;
        }
        r.key("id")?;
        let id = EntryId::from_decoded_str(r.str()?);
        r.key("parent_id")?;
        let parent_id = if keep_parent {
            r.opt_str()?.map(EntryId::from_decoded_str)
        } else {
            r.skip_opt_str()?;
            None
        };
        r.key("timestamp_ms")?;
        let timestamp_ms = r.i64()?;
        r.key("kind")?;
        let kind = kind(r)?;
        Some(Entry {
            id,
            parent_id,
            timestamp_ms,
            kind,
        })
    }

    fn kind(r: &mut Reader<'_>) -> Option<EntryKind> {
        let n = r.map_len()?;
        r.key("type")?;
        Some(match (r.str()?, n) {
            ("message", 2) => {
                r.key("message")?;
                EntryKind::Message {
                    message: message(r)?,
                }
            }
            ("custom_message", 5) => {
                r.key("custom_type")?;
                let custom_type = r.string()?;
                r.key("content")?;
                let content = blocks(r)?;
                r.key("display")?;
                let display = r.bool()?;
                r.key("details")?;
                // A JSON value: serde's.
                if !r.peek_nil() {
                    return None;
                }
                r.byte()?;
                EntryKind::CustomMessage {
                    custom_type,
                    content,
                    display,
                    details: None,
                }
            }
            ("branch_summary", 3) => {
                r.key("from_id")?;
                let from_id = r.opt_str()?.map(EntryId::from_decoded_str);
                r.key("summary")?;
                EntryKind::BranchSummary {
                    from_id,
                    summary: r.string()?,
                }
            }
            ("compaction", 4) => {
                r.key("summary")?;
                let summary = r.string()?;
                r.key("first_kept_entry_id")?;
                let first_kept_entry_id = EntryId::from_decoded_str(r.str()?);
                r.key("tokens_before")?;
                EntryKind::Compaction {
                    summary,
                    first_kept_entry_id,
                    tokens_before: r.u64()?,
                }
            }
            ("reset", 1) => EntryKind::Reset,
            ("model_change", 3) => {
                r.key("provider")?;
                let provider = r.string()?;
                r.key("model_id")?;
                EntryKind::ModelChange {
                    provider,
                    model_id: r.string()?,
                }
            }
            ("thinking_level_change", 2) => {
                r.key("thinking_level")?;
                EntryKind::ThinkingLevelChange {
                    thinking_level: r.string()?,
                }
            }
            ("label", 3) => {
                r.key("target_id")?;
                let target_id = EntryId::from_decoded_str(r.str()?);
                r.key("label")?;
                EntryKind::Label {
                    target_id,
                    label: r.opt_string()?,
                }
            }
            ("session_info", 2) => {
                r.key("name")?;
                EntryKind::SessionInfo {
                    name: r.opt_string()?,
                }
            }
            // `custom` holds a JSON value; anything else is not this layout.
            _ => return None,
        })
    }

    fn message(r: &mut Reader<'_>) -> Option<Message> {
        let n = r.map_len()?;
        r.key("role")?;
        Some(match (r.str()?, n) {
            ("user", 2) => {
                r.key("content")?;
                Message::User {
                    content: blocks(r)?,
                }
            }
            ("assistant", 6) => {
                r.key("content")?;
                let content = blocks(r)?;
                r.key("stop_reason")?;
                let stop_reason = match r.str()? {
                    "stop" => StopReason::Stop,
                    "length" => StopReason::Length,
                    "tool_use" => StopReason::ToolUse,
                    "error" => StopReason::Error,
                    "aborted" => StopReason::Aborted,
                    _ => return None,
                };
                r.key("usage")?;
                if r.map_len()? != 4 {
                    return None;
                }
                r.key("input_tokens")?;
                let input_tokens = r.u64()?;
                r.key("output_tokens")?;
                let output_tokens = r.u64()?;
                r.key("cache_read_tokens")?;
                let cache_read_tokens = r.u64()?;
                r.key("cache_write_tokens")?;
                let cache_write_tokens = r.u64()?;
                r.key("model")?;
                let model = r.opt_string()?;
                r.key("error_message")?;
                Message::Assistant {
                    content,
                    stop_reason,
                    usage: Usage {
                        input_tokens,
                        output_tokens,
                        cache_read_tokens,
                        cache_write_tokens,
                    },
                    model,
                    error_message: r.opt_string()?,
                }
            }
            ("tool_result", 5) => {
                r.key("tool_call_id")?;
                let tool_call_id = r.string()?;
                r.key("tool_name")?;
                let tool_name = r.string()?;
                r.key("content")?;
                let content = blocks(r)?;
                r.key("is_error")?;
                Message::ToolResult {
                    tool_call_id,
                    tool_name,
                    content,
                    is_error: r.bool()?,
                }
            }
            _ => return None,
        })
    }

    /// Smallest encoding of a block (`{type: "text", text: ""}`): bounds the
    /// capacity reserved for a declared count.
    const BLOCK_BYTES_MIN: usize = 12;

    fn blocks(r: &mut Reader<'_>) -> Option<Vec<ContentBlock>> {
        let n = usize::try_from(r.array_len()?).ok()?;
        if n > r.b.len() / BLOCK_BYTES_MIN {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            let fields = r.map_len()?;
            r.key("type")?;
            out.push(match (r.str()?, fields) {
                ("text", 2) => {
                    r.key("text")?;
                    ContentBlock::Text { text: r.string()? }
                }
                ("thinking", 2) => {
                    r.key("thinking")?;
                    ContentBlock::Thinking {
                        thinking: r.string()?,
                    }
                }
                ("image", 3) => {
                    r.key("mime_type")?;
                    let mime_type = r.string()?;
                    r.key("data")?;
                    ContentBlock::Image {
                        mime_type,
                        data: r.string()?,
                    }
                }
                // A tool call holds a JSON value: serde's.
                _ => return None,
            });
        }
        Some(out)
    }
}

#[derive(Serialize)]
struct SnapshotRef<'a> {
    info: &'a AgentSessionInfo,
    definition: &'a AgentDefinition,
    state: &'a AgentState,
}

#[derive(Deserialize)]
struct SnapshotOwned {
    info: AgentSessionInfo,
    definition: AgentDefinition,
    state: AgentState,
}

/// Encodes a session (header, definition, state; never the pending list)
/// as a snapshot: `[SNAPSHOT_SCHEMA] ++ msgpack(named)`.
pub fn encode_snapshot(session: &AgentSession) -> Result<Vec<u8>, CodecError> {
    encode(
        "snapshot",
        SNAPSHOT_SCHEMA,
        &SnapshotRef {
            info: &session.info,
            definition: &session.definition,
            state: &session.state,
        },
    )
}

/// Decodes a snapshot. Any error means "ignore the snapshot and replay".
pub fn decode_snapshot(bytes: &[u8]) -> Result<AgentSession, CodecError> {
    let s: SnapshotOwned = decode("snapshot", SNAPSHOT_SCHEMA, bytes)?;
    Ok(AgentSession {
        info: s.info,
        definition: s.definition,
        state: s.state,
        pending: Vec::new(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transcript::{ContentBlock, Entry, EntryId, EntryKind, Message, StopReason, Usage};

    fn id(s: &str) -> EntryId {
        EntryId::parse(s).unwrap()
    }

    /// Entries of every kind, with the optional fields both ways, long
    /// strings (str16/str32 forms) and integers of every width.
    fn samples() -> Vec<Entry> {
        let text = |n: usize| "é".repeat(n);
        let blocks = vec![
            ContentBlock::text("hi"),
            ContentBlock::Thinking {
                thinking: text(200),
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
                        arguments: serde_json::json!({"path": "/x", "n": [1, -2.5, null]}),
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
                data: serde_json::json!({"k": [1, 2]}),
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
                details: Some(serde_json::json!("d")),
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

    #[test]
    fn the_hand_reader_reads_what_serde_reads() {
        for entry in samples() {
            let has_json = matches!(
                &entry.kind,
                EntryKind::Custom { .. }
                    | EntryKind::CustomMessage {
                        details: Some(_),
                        ..
                    }
            ) || matches!(
                &entry.kind,
                EntryKind::Message {
                    message: Message::Assistant { content, .. }
                } if content.iter().any(|b| matches!(b, ContentBlock::ToolCall { .. }))
            );
            let bytes = encode_event(&SessionEvent::EntryAppended {
                entry: entry.clone(),
            })
            .unwrap();
            // The written layout is read by hand, except JSON values.
            let fast = fast::appended_entry(&bytes[1..], true);
            assert_eq!(fast.is_some(), !has_json, "{entry:?}");
            if let Some(e) = fast {
                assert_eq!(e, entry);
            }
            let mut orphan = decode_appended_entry_as(&bytes, false).unwrap();
            if !has_json {
                assert_eq!(orphan.parent_id, None);
            }
            orphan.parent_id = entry.parent_id.clone();
            assert_eq!(orphan, entry);
            assert_eq!(decode_appended_entry(&bytes).unwrap(), entry);
            assert_eq!(decode_appended_entry_serde(&bytes).unwrap(), entry);
        }
    }

    /// Damaged bytes (every byte position of small events changed, every
    /// truncation): the hand reader never panics and, when it answers,
    /// answers what serde answers; the public decoder agrees with serde.
    #[test]
    fn damaged_events_decode_as_serde_decodes_them() {
        for entry in samples() {
            let bytes = encode_event(&SessionEvent::EntryAppended { entry }).unwrap();
            if bytes.len() > 2_000 {
                continue;
            }
            let check = |b: &[u8]| {
                let serde = decode_appended_entry_serde(b).ok();
                if let Some(body) = b.get(1..) {
                    if let Some(fast) = fast::appended_entry(body, true) {
                        assert_eq!(Some(fast), serde, "{b:?}");
                    }
                    // Without the parent: accepted exactly when serde accepts.
                    let orphan = fast::appended_entry(body, false);
                    if orphan.is_some() {
                        assert!(serde.is_some(), "{b:?}");
                    }
                }
                assert_eq!(decode_appended_entry(b).ok(), serde, "{b:?}");
            };
            for n in 0..bytes.len() {
                check(&bytes[..n]);
            }
            for i in 1..bytes.len() {
                for x in [0x01u8, 0x10, 0x20, 0x80, 0xff] {
                    let mut b = bytes.clone();
                    b[i] ^= x;
                    check(&b);
                }
            }
        }
    }

    #[test]
    fn an_appended_entry_decodes_alone_as_in_the_event() {
        let entry = Entry {
            id: EntryId::parse("e1").unwrap(),
            parent_id: Some(EntryId::parse("e0").unwrap()),
            timestamp_ms: 7,
            kind: EntryKind::Message {
                message: Message::User {
                    content: vec![ContentBlock::text("hello")],
                },
            },
        };
        let bytes = encode_event(&SessionEvent::EntryAppended {
            entry: entry.clone(),
        })
        .unwrap();
        assert_eq!(decode_appended_entry(&bytes).unwrap(), entry);
        assert!(matches!(
            decode_event(&bytes).unwrap(),
            SessionEvent::EntryAppended { entry: e } if e == entry
        ));
        // Another event, a truncated payload, another schema: errors.
        let moved = encode_event(&SessionEvent::LeafMoved { leaf: None }).unwrap();
        assert!(decode_appended_entry(&moved).is_err());
        assert!(decode_appended_entry(&bytes[..bytes.len() / 2]).is_err());
        let mut other = bytes.clone();
        other[0] = EVENT_SCHEMA + 1;
        assert!(matches!(
            decode_appended_entry(&other),
            Err(CodecError::UnsupportedSchema { .. })
        ));
        assert!(decode_appended_entry(&[]).is_err());
    }
}
