//! The hand-written MessagePack reader of the layouts
//! [`encode_event`](super::encode_event) and
//! [`encode_snapshot`](super::encode_snapshot) write: named maps with
//! their fields in declaration order, enum tags first (serde's internally
//! tagged form), unit variants as strings. Every reader answers `None` for
//! anything else, and the caller falls back to serde. Never panics: every
//! length is checked against the bytes left before it is used, and nothing
//! is allocated beyond the bytes it describes (a string's bytes; a block
//! list's capacity is bounded by the bytes left).

use serde::de::DeserializeOwned;

use crate::session::definition::AgentDefinition;
use crate::session::events::SessionEvent;
use crate::session::info::AgentSessionInfo;
use crate::session::state::AgentState;
use crate::transcript::{
    ContentBlock, Entry, EntryId, EntryKind, Message, StopReason, Transcript, Usage,
};

/// Deepest nesting [`Reader::value`] follows below the value it
/// measures; a deeper value goes to serde with the rest. Far below
/// rmp-serde's own limit (1024), so a value read here from its own
/// bytes (which restarts serde's depth count) is never one serde would
/// refuse for its depth in place.
pub(super) const SKIP_DEPTH_MAX: u32 = 128;

/// Whether `b` is UTF-8: a short id or name is mostly ASCII, which is
/// checked without `from_utf8`'s per-call setup (a page read checks
/// ~10 short strings per entry).
fn utf8(b: &[u8]) -> bool {
    b.is_ascii() || simdutf8::basic::from_utf8(b).is_ok()
}

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

    /// Checked with `simdutf8` (the same answer as `std::str::from_utf8`,
    /// with vector instructions where the CPU has them): a page read
    /// checks every entry's text, a visible part of its time with the
    /// standard library's check.
    fn str(&mut self) -> Option<&'a str> {
        simdutf8::basic::from_utf8(self.str_bytes()?).ok()
    }

    fn string(&mut self) -> Option<String> {
        self.str().map(str::to_owned)
    }

    /// A map key equal to `want` (equal bytes are UTF-8, as `want` is).
    /// The form the writer uses for a short key (a fixstr of `want`'s
    /// length) is matched in one comparison; any other form is read
    /// with [`Reader::str_bytes`]. Both accept exactly the same bytes.
    /// Inlined at every call so that `want` is a constant there and the
    /// comparison a few loads, not a `memcmp` call: those calls were a
    /// visible part of decoding an entry in a page read's profile, and
    /// none are left.
    #[inline(always)]
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
        utf8(self.str_bytes()?).then_some(())
    }

    /// A string compared, not converted: the tag of an enum variant,
    /// matched against byte literals. Every tag is ASCII, so bytes
    /// equal to one are UTF-8, and anything else (invalid UTF-8
    /// included) matches no arm and goes to serde, as a `str` would.
    fn tag(&mut self) -> Option<&'a [u8]> {
        self.str_bytes()
    }

    /// An entry id, as [`EntryId::from_decoded_str`] of the string.
    fn entry_id(&mut self) -> Option<EntryId> {
        let b = self.str_bytes()?;
        EntryId::from_decoded_ascii(b).or_else(|| {
            simdutf8::basic::from_utf8(b)
                .ok()
                .map(EntryId::from_decoded_str)
        })
    }

    /// A nil or an entry id ([`Reader::entry_id`]).
    fn opt_entry_id(&mut self) -> Option<Option<EntryId>> {
        if self.peek_nil() {
            self.byte()?;
            return Some(None);
        }
        self.entry_id().map(Some)
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

    /// A length of `n` big-endian bytes.
    fn len(&mut self, n: usize) -> Option<usize> {
        usize::try_from(self.be(n)?).ok()
    }

    /// Steps over one value at nesting `depth`. Extension types and
    /// the unused marker are refused (serde decides about them), as is
    /// nesting deeper than [`SKIP_DEPTH_MAX`]. Every element consumes
    /// at least one byte, so a hostile count ends with the bytes.
    fn skip(&mut self, depth: u32) -> Option<()> {
        let m = self.byte()?;
        let n = match m {
            0x00..=0x7f | 0xe0..=0xff | 0xc0 | 0xc2 | 0xc3 => 0,
            0xa0..=0xbf => usize::from(m & 0x1f),
            0xc4 | 0xd9 => self.len(1)?,
            0xc5 | 0xda => self.len(2)?,
            0xc6 | 0xdb => self.len(4)?,
            0xcc | 0xd0 => 1,
            0xcd | 0xd1 => 2,
            0xca | 0xce | 0xd2 => 4,
            0xcb | 0xcf | 0xd3 => 8,
            0x80..=0x9f | 0xdc..=0xdf => {
                // A container: its element count (a map's twice its
                // length: keys and values).
                let items = match m {
                    0x90..=0x9f => u64::from(m & 0x0f),
                    0x80..=0x8f => 2 * u64::from(m & 0x0f),
                    0xdc => self.be(2)?,
                    0xdd => self.be(4)?,
                    0xde => 2 * self.be(2)?,
                    _ => 2 * self.be(4)?,
                };
                return self.skip_items(items, depth);
            }
            _ => return None,
        };
        self.take(n).map(drop)
    }

    fn skip_items(&mut self, n: u64, depth: u32) -> Option<()> {
        if depth >= SKIP_DEPTH_MAX {
            return None;
        }
        for _ in 0..n {
            self.skip(depth + 1)?;
        }
        Some(())
    }

    /// The bytes of the next value (see [`Reader::skip`]).
    fn value(&mut self) -> Option<&'a [u8]> {
        let start = self.b;
        self.skip(0)?;
        start.get(..start.len().checked_sub(self.b.len())?)
    }

    /// The next value decoded by serde from its own bytes.
    fn serde<T: DeserializeOwned>(&mut self) -> Option<T> {
        let v = self.value()?;
        T::deserialize(&mut rmp_serde::Deserializer::from_read_ref(v)).ok()
    }
}

/// A `created`, `entry_appended` or `history_rewritten` event body
/// (after the schema byte); `None` for any other event or shape. With `keep_transcript`
/// false a `created` event's transcript is read and checked but not
/// kept (left empty).
pub(super) fn event(body: &[u8], keep_transcript: bool) -> Option<SessionEvent> {
    let keep = if keep_transcript {
        Keep::Transcript
    } else {
        Keep::Nothing
    };
    Some(event_with(body, keep)?.0)
}

/// What [`state`] does with the transcript it reads (it always checks it).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Keep {
    /// Built into the state's transcript.
    Transcript,
    /// Handed back apart, as entries and leaf (the state's transcript
    /// is left empty).
    Entries,
    /// Dropped (the state's transcript is left empty).
    Nothing,
}

use super::TranscriptParts as Parts;

/// [`event`] with the `created` event's transcript handled as `keep`
/// says (its parts are handed back with [`Keep::Entries`]).
pub(super) fn event_with(body: &[u8], keep: Keep) -> Option<(SessionEvent, Option<Parts>)> {
    let r = &mut Reader { b: body };
    let n = r.map_len()?;
    r.key("type")?;
    let ev = match (r.tag()?, n) {
        (b"created", 8) => {
            r.key("id")?;
            let id = r.serde()?;
            r.key("parent_id")?;
            let parent_id = r.serde()?;
            r.key("agent_name")?;
            let agent_name = r.string()?;
            r.key("label")?;
            let label = r.string()?;
            r.key("created_at_ms")?;
            let created_at_ms = r.i64()?;
            r.key("definition")?;
            let definition = r.serde()?;
            r.key("state")?;
            let (state, parts) = state(r, keep)?;
            let ev = SessionEvent::Created {
                id,
                parent_id,
                agent_name,
                label,
                created_at_ms,
                definition,
                state: Box::new(state),
            };
            return Some((ev, parts));
        }
        (b"entry_appended", 2) => {
            r.key("entry")?;
            SessionEvent::EntryAppended {
                entry: entry_or_serde(r)?,
            }
        }
        (b"history_rewritten", 4) => {
            r.key("generation")?;
            let generation = r.u64()?;
            r.key("entries")?;
            let entries = entries(r, true)?;
            r.key("leaf")?;
            SessionEvent::HistoryRewritten {
                generation,
                entries,
                leaf: r.opt_entry_id()?,
            }
        }
        _ => return None,
    };
    Some((ev, None))
}

/// A snapshot body (after the schema byte): header, definition, state.
pub(super) fn snapshot(body: &[u8]) -> Option<(AgentSessionInfo, AgentDefinition, AgentState)> {
    let r = &mut Reader { b: body };
    if r.map_len()? != 3 {
        return None;
    }
    r.key("info")?;
    let info = r.serde()?;
    r.key("definition")?;
    let definition = r.serde()?;
    r.key("state")?;
    Some((info, definition, state(r, Keep::Transcript)?.0))
}

/// An [`AgentState`] with every field present in declaration order:
/// the transcript by hand, the small fields by hand or by serde from
/// their own bytes. The transcript is read and checked, then kept as
/// `keep` says.
fn state(r: &mut Reader<'_>, keep: Keep) -> Option<(AgentState, Option<Parts>)> {
    if r.map_len()? != 11 {
        return None;
    }
    r.key("transcript")?;
    if r.map_len()? != 2 {
        return None;
    }
    r.key("entries")?;
    let entries = entries(r, keep != Keep::Nothing)?;
    r.key("leaf")?;
    let leaf = r.opt_entry_id()?;
    let mut transcript = Transcript::new();
    let mut parts = None;
    match keep {
        Keep::Transcript => transcript.replace_all(entries, leaf),
        Keep::Entries => parts = Some((entries, leaf)),
        Keep::Nothing => {}
    }
    r.key("generation")?;
    let generation = r.u64()?;
    r.key("metadata")?;
    let metadata = r.serde()?;
    r.key("system_prompt")?;
    let system_prompt = r.string()?;
    r.key("model")?;
    let model = r.serde()?;
    r.key("execution_count")?;
    let execution_count = r.u64()?;
    r.key("execution")?;
    let execution = r.serde()?;
    r.key("last_error")?;
    let last_error = r.opt_string()?;
    r.key("usage")?;
    let usage = r.serde()?;
    r.key("total_usage")?;
    let total_usage = r.serde()?;
    r.key("tasks")?;
    let state = AgentState {
        transcript,
        generation,
        metadata,
        system_prompt,
        model,
        execution_count,
        execution,
        last_error,
        usage,
        total_usage,
        tasks: r.serde()?,
    };
    Some((state, parts))
}

/// See [`super::event_entry_offsets`]: offsets into `body`.
pub(super) fn entry_offsets(body: &[u8]) -> Option<Vec<usize>> {
    let r = &mut Reader { b: body };
    let n = r.map_len()?;
    r.key("type")?;
    let skip_fields = |r: &mut Reader<'_>, keys: &[&str]| -> Option<()> {
        for k in keys {
            r.key(k)?;
            r.skip(0)?;
        }
        Some(())
    };
    let offsets = match (r.tag()?, n) {
        (b"created", 8) => {
            skip_fields(
                r,
                &[
                    "id",
                    "parent_id",
                    "agent_name",
                    "label",
                    "created_at_ms",
                    "definition",
                ],
            )?;
            r.key("state")?;
            if r.map_len()? != 11 {
                return None;
            }
            r.key("transcript")?;
            if r.map_len()? != 2 {
                return None;
            }
            r.key("entries")?;
            let offsets = entry_starts(r, body.len())?;
            skip_fields(
                r,
                &[
                    "leaf",
                    "generation",
                    "metadata",
                    "system_prompt",
                    "model",
                    "execution_count",
                    "execution",
                    "last_error",
                    "usage",
                    "total_usage",
                    "tasks",
                ],
            )?;
            offsets
        }
        (b"history_rewritten", 4) => {
            skip_fields(r, &["generation"])?;
            r.key("entries")?;
            let offsets = entry_starts(r, body.len())?;
            skip_fields(r, &["leaf"])?;
            offsets
        }
        _ => return None,
    };
    Some(offsets)
}

/// The start (as an offset into a body of `body_len` bytes) of every
/// value of the array at `r`, stepped over.
fn entry_starts(r: &mut Reader<'_>, body_len: usize) -> Option<Vec<usize>> {
    let n = r.array_len()?;
    let mut out = Vec::with_capacity(usize::try_from(n).ok()?.min(r.b.len() / ENTRY_BYTES_MIN));
    for _ in 0..n {
        out.push(body_len.checked_sub(r.b.len())?);
        r.skip(0)?;
    }
    Some(out)
}

/// One entry at the start of `b`, its parent not kept by the hand
/// reader (serde's, which keeps it, for any other shape).
pub(super) fn entry_at(b: &[u8]) -> Option<Entry> {
    let r = &mut Reader { b };
    if let Some(e) = entry(r, false) {
        return Some(e);
    }
    Reader { b }.serde()
}

/// Smallest encoding of an entry serde reads (a four-element array
/// `[id, nil, 0, {type: "reset"}]`): bounds the capacity reserved for a
/// declared count.
const ENTRY_BYTES_MIN: usize = 16;

/// One entry by the hand entry reader, or, when it does not take it (a
/// JSON value, another shape), by serde from the entry's own bytes.
fn entry_or_serde(r: &mut Reader<'_>) -> Option<Entry> {
    let at = r.b;
    if let Some(e) = entry(r, true) {
        return Some(e);
    }
    r.b = at;
    r.serde::<Entry>()
}

/// An array of entries, each read by [`entry_or_serde`]. With `keep` false the entries are checked and
/// dropped (the answer is empty).
fn entries(r: &mut Reader<'_>, keep: bool) -> Option<Vec<Entry>> {
    let n = r.array_len()?;
    let mut out = Vec::new();
    if keep {
        out.reserve(usize::try_from(n).ok()?.min(r.b.len() / ENTRY_BYTES_MIN));
    }
    for _ in 0..n {
        let e = entry_or_serde(r)?;
        if keep {
            out.push(e);
        }
    }
    Some(out)
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
    let id = r.entry_id()?;
    r.key("parent_id")?;
    let parent_id = if keep_parent {
        r.opt_entry_id()?
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
    Some(match (r.tag()?, n) {
        (b"message", 2) => {
            r.key("message")?;
            EntryKind::Message {
                message: message(r)?,
            }
        }
        (b"custom_message", 5) => {
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
        (b"branch_summary", 3) => {
            r.key("from_id")?;
            let from_id = r.opt_entry_id()?;
            r.key("summary")?;
            EntryKind::BranchSummary {
                from_id,
                summary: r.string()?,
            }
        }
        (b"compaction", 4) => {
            r.key("summary")?;
            let summary = r.string()?;
            r.key("first_kept_entry_id")?;
            let first_kept_entry_id = r.entry_id()?;
            r.key("tokens_before")?;
            EntryKind::Compaction {
                summary,
                first_kept_entry_id,
                tokens_before: r.u64()?,
            }
        }
        (b"reset", 1) => EntryKind::Reset,
        (b"model_change", 3) => {
            r.key("provider")?;
            let provider = r.string()?;
            r.key("model_id")?;
            EntryKind::ModelChange {
                provider,
                model_id: r.string()?,
            }
        }
        (b"thinking_level_change", 2) => {
            r.key("thinking_level")?;
            EntryKind::ThinkingLevelChange {
                thinking_level: r.string()?,
            }
        }
        (b"label", 3) => {
            r.key("target_id")?;
            let target_id = r.entry_id()?;
            r.key("label")?;
            EntryKind::Label {
                target_id,
                label: r.opt_string()?,
            }
        }
        (b"session_info", 2) => {
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
    Some(match (r.tag()?, n) {
        (b"user", 2) => {
            r.key("content")?;
            Message::User {
                content: blocks(r)?,
            }
        }
        (b"assistant", 6) => {
            r.key("content")?;
            let content = blocks(r)?;
            r.key("stop_reason")?;
            let stop_reason = match r.tag()? {
                b"stop" => StopReason::Stop,
                b"length" => StopReason::Length,
                b"tool_use" => StopReason::ToolUse,
                b"error" => StopReason::Error,
                b"aborted" => StopReason::Aborted,
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
        (b"tool_result", 5) => {
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
        out.push(match (r.tag()?, fields) {
            (b"text", 2) => {
                r.key("text")?;
                ContentBlock::Text { text: r.string()? }
            }
            (b"thinking", n @ 2..=4) => {
                r.key("thinking")?;
                let thinking = r.string()?;
                // The optional fields, in serde's order, each written
                // only when set.
                let mut signature = None;
                let mut redacted = false;
                for _ in 2..n {
                    match r.str()? {
                        "signature" if signature.is_none() && !redacted => {
                            signature = Some(r.string()?)
                        }
                        "redacted" if !redacted => redacted = r.bool()?,
                        _ => return None,
                    }
                }
                ContentBlock::Thinking {
                    thinking,
                    signature,
                    redacted,
                }
            }
            (b"image", 3) => {
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
