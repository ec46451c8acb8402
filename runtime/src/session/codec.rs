//! Binary encodings of events and snapshots for event-sourced stores.
//!
//! Both are one schema byte followed by MessagePack in the named
//! (struct-as-map) form, so adding a field with a serde default stays
//! readable by newer code. Decoding never panics on hostile bytes: input
//! is bounded by [`MAX_CODEC_INPUT`], rmp-serde bounds nesting depth (the
//! hand readers of the written layout, module `fast`, bound theirs far
//! below it), and every failure is a [`CodecError`]. Bytes after the
//! encoded value are ignored.
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
use crate::transcript::{ContentBlock, Entry, EntryKind, Message};

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

fn encode<T: Serialize>(
    what: &'static str,
    schema: u8,
    value: &T,
    capacity_bytes: usize,
) -> Result<Vec<u8>, CodecError> {
    let mut out = Vec::with_capacity(capacity_bytes.saturating_add(1));
    out.push(schema);
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
    encode("event", EVENT_SCHEMA, event, event_bytes_hint(event))
}

/// Bytes allowed per entry in the size hints for what is not counted
/// string by string: ids, tags, field names, numbers (an assistant
/// message's usage alone is about 80). Rather high than low: a hint short
/// by one byte costs a growth, which copies the whole buffer.
const ENTRY_OVERHEAD_BYTES_HINT: usize = 192;

/// An estimate of the encoded size of an event carrying entries (a
/// created session's transcript, a rewrite, an append), 0 for the others: the
/// buffer's capacity, so that a seed of megabytes (a fork's) is written
/// without growing the buffer by doubling, which copies and faults in
/// its bytes again at every step. The strings of the entries are counted
/// (in MessagePack a string costs its bytes plus a short prefix), JSON
/// values are not: a short estimate costs one late growth, never a
/// wrong result.
fn event_bytes_hint(event: &SessionEvent) -> usize {
    match event {
        SessionEvent::Created { state, .. } => entries_bytes_hint(state.transcript.entries()),
        SessionEvent::HistoryRewritten { entries, .. } => entries_bytes_hint(entries),
        SessionEvent::TranscriptRewritten { written, .. } => entries_bytes_hint(written),
        // An append's buffer grew ~8 times by doubling for a 1.5 KB entry.
        SessionEvent::EntryAppended { entry } => entries_bytes_hint(std::slice::from_ref(entry)),
        _ => 0,
    }
}

/// The size hint of `entries` (see [`event_bytes_hint`]).
fn entries_bytes_hint(entries: &[Entry]) -> usize {
    entries
        .iter()
        .map(|e| ENTRY_OVERHEAD_BYTES_HINT.saturating_add(entry_strings_bytes(e)))
        .fold(0, usize::saturating_add)
}

/// The bytes of an entry's variable-length strings (content, summaries).
fn entry_strings_bytes(e: &Entry) -> usize {
    let blocks = |content: &[ContentBlock]| -> usize {
        content
            .iter()
            .map(|b| match b {
                ContentBlock::Text { text } => text.len(),
                ContentBlock::Thinking {
                    thinking,
                    signature,
                    ..
                } => thinking.len() + signature.as_ref().map_or(0, String::len),
                ContentBlock::ToolCall { id, name, .. } => id.len() + name.len(),
                ContentBlock::Image { mime_type, data } => mime_type.len() + data.len(),
            })
            .fold(0, usize::saturating_add)
    };
    match &e.kind {
        EntryKind::Message { message } => match message {
            Message::User { content } => blocks(content),
            Message::Assistant { content, model, .. } => {
                blocks(content).saturating_add(model.as_ref().map_or(0, String::len))
            }
            Message::ToolResult {
                tool_name, content, ..
            } => tool_name.len().saturating_add(blocks(content)),
        },
        EntryKind::CustomMessage {
            custom_type,
            content,
            ..
        } => custom_type.len().saturating_add(blocks(content)),
        EntryKind::BranchSummary { summary, .. } | EntryKind::Compaction { summary, .. } => {
            summary.len()
        }
        _ => 0,
    }
}

/// Decodes one event written by [`encode_event`].
///
/// A `created` or `history_rewritten` event in the layout [`encode_event`]
/// writes is read by hand (module `fast`: the entries by the hand entry
/// reader, the other fields by serde from their own bytes), without the
/// event enum's buffering of the whole event; any other event or shape goes
/// through serde, which gives the answer and the error. Both give the same
/// value (checked by tests and the `event_decode` fuzz target).
pub fn decode_event(bytes: &[u8]) -> Result<SessionEvent, CodecError> {
    if let Some(body) = fast_body(EVENT_SCHEMA, bytes) {
        if let Some(ev) = fast::event(body, true) {
            return Ok(ev);
        }
    }
    decode_event_serde(bytes)
}

/// [`decode_event`] through serde alone: the reference the hand reader is
/// checked against (tests, the `event_decode` fuzz target).
#[doc(hidden)]
pub fn decode_event_serde(bytes: &[u8]) -> Result<SessionEvent, CodecError> {
    decode("event", EVENT_SCHEMA, bytes)
}

/// [`decode_event`] for a reader that never looks at a `created` event's
/// transcript (the sessions index reads only the header): the event is
/// decoded and checked exactly as [`decode_event`] checks it, so it fails
/// exactly when that fails, but a `created` event's transcript is not kept
/// (the returned state's transcript is empty). Every other event is
/// [`decode_event`]'s answer.
pub(crate) fn decode_event_without_transcript(bytes: &[u8]) -> Result<SessionEvent, CodecError> {
    if let Some(body) = fast_body(EVENT_SCHEMA, bytes) {
        if let Some(ev) = fast::event(body, false) {
            return Ok(ev);
        }
    }
    let mut ev = decode_event_serde(bytes)?;
    if let SessionEvent::Created { state, .. } = &mut ev {
        state.transcript = crate::transcript::Transcript::new();
    }
    Ok(ev)
}

/// [`decode_event`] for a reader that walks a `created` event's entries
/// but never asks the transcript for ids, children or labels (the
/// transcript index): the event is decoded and checked exactly as
/// [`decode_event`] does, so it fails exactly when that fails, and a
/// `created` event's transcript comes back apart as its entries and leaf
/// (the event's state then holds an empty transcript), without building
/// the transcript's in-memory indexes. Any other event comes back as
/// [`decode_event`] gives it, with `None`.
pub(crate) fn decode_event_split(
    bytes: &[u8],
) -> Result<(SessionEvent, Option<TranscriptParts>), CodecError> {
    if let Some(body) = fast_body(EVENT_SCHEMA, bytes) {
        if let Some(split) = fast::event_with(body, fast::Keep::Entries) {
            return Ok(split);
        }
    }
    let mut ev = decode_event_serde(bytes)?;
    let parts = match &mut ev {
        SessionEvent::Created { state, .. } => {
            let t = std::mem::take(&mut state.transcript);
            Some((t.entries().to_vec(), t.leaf().cloned()))
        }
        _ => None,
    };
    Ok((ev, parts))
}

/// A transcript as written: its entries in order and its leaf.
pub(crate) type TranscriptParts = (
    Vec<crate::transcript::Entry>,
    Option<crate::transcript::EntryId>,
);

/// Where each entry of a `created` event's transcript or a
/// `history_rewritten` event's entry list starts in `bytes` (an event
/// written by [`encode_event`]), found without decoding them: the event's
/// layout is checked and every other value stepped over. `None` for any
/// other event or shape (the caller decodes the whole event instead).
pub(crate) fn event_entry_offsets(bytes: &[u8]) -> Option<Vec<usize>> {
    let body = fast_body(EVENT_SCHEMA, bytes)?;
    let offsets = fast::entry_offsets(body)?;
    // Offsets in the body are one byte short of offsets in `bytes`.
    Some(offsets.into_iter().map(|o| o + 1).collect())
}

/// The entry that starts at `offset` of `bytes` (an offset from
/// [`event_entry_offsets`]), as [`decode_event`] decodes it in place except
/// its parent, which may be `None` (a caller that reads this takes the
/// parent from its index). `None` when the bytes there are not an entry.
pub(crate) fn decode_entry_at(bytes: &[u8], offset: usize) -> Option<crate::transcript::Entry> {
    fast::entry_at(bytes.get(offset..)?)
}

/// The MessagePack body of `bytes` when it is within [`MAX_CODEC_INPUT`]
/// and carries `schema`: what the hand readers may try. `None` leaves the
/// answer (and the error) to serde.
fn fast_body(schema: u8, bytes: &[u8]) -> Option<&[u8]> {
    if bytes.len() > MAX_CODEC_INPUT {
        return None;
    }
    match bytes.split_first() {
        Some((&found, body)) if found == schema => Some(body),
        _ => None,
    }
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
        /// checks every entry's text, ~8 % of its samples with the standard
        /// library's check.
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
        /// comparison a few loads, not a `memcmp` call: those calls were
        /// ~9 % of decoding an entry in a page read's profile, and none are
        /// left.
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

    /// A `created` or `history_rewritten` event body (after the schema
    /// byte); `None` for any other event or shape. With `keep_transcript`
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

    /// An array of entries: each by the hand entry reader, or, when it
    /// does not take it (a JSON value, another shape), by serde from the
    /// entry's own bytes. With `keep` false the entries are checked and
    /// dropped (the answer is empty).
    fn entries(r: &mut Reader<'_>, keep: bool) -> Option<Vec<Entry>> {
        let n = r.array_len()?;
        let mut out = Vec::new();
        if keep {
            out.reserve(usize::try_from(n).ok()?.min(r.b.len() / ENTRY_BYTES_MIN));
        }
        for _ in 0..n {
            let at = r.b;
            let e = match entry(r, true) {
                Some(e) => e,
                None => {
                    r.b = at;
                    r.serde::<Entry>()?
                }
            };
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
        entries_bytes_hint(session.state.transcript.entries()),
    )
}

/// Decodes a snapshot. Any error means "ignore the snapshot and replay".
///
/// The layout [`encode_snapshot`] writes is read by hand (the state as in
/// [`decode_event`]); any other shape goes through serde. Both give the
/// same value.
pub fn decode_snapshot(bytes: &[u8]) -> Result<AgentSession, CodecError> {
    if let Some(body) = fast_body(SNAPSHOT_SCHEMA, bytes) {
        if let Some((info, definition, state)) = fast::snapshot(body) {
            return Ok(AgentSession {
                info,
                definition,
                state,
                pending: Vec::new(),
            });
        }
    }
    decode_snapshot_serde(bytes)
}

/// [`decode_snapshot`] through serde alone: the reference the hand reader
/// is checked against (tests, the `event_decode` fuzz target).
#[doc(hidden)]
pub fn decode_snapshot_serde(bytes: &[u8]) -> Result<AgentSession, CodecError> {
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

    /// Long texts are checked with vector instructions: six kinds of
    /// invalid UTF-8 put at nine places in one (the start, around 32- and
    /// 64-byte block boundaries, the middle, the last bytes) are refused
    /// exactly as the serde decoder refuses them, and valid multi-byte
    /// text is accepted.
    #[test]
    fn long_texts_with_invalid_utf8_are_refused_like_serde_refuses_them() {
        let base: String = "ab\u{e9}c\u{20ac}d\u{1f600}".repeat(40);
        let event = SessionEvent::EntryAppended {
            entry: Entry {
                id: EntryId::parse("e1").unwrap(),
                parent_id: None,
                timestamp_ms: 1,
                kind: EntryKind::Message {
                    message: Message::User {
                        content: vec![ContentBlock::text(base.clone())],
                    },
                },
            },
        };
        let bytes = encode_event(&event).unwrap();
        assert_eq!(decode_event(&bytes).unwrap(), event);
        let at = bytes
            .windows(base.len())
            .position(|w| w == base.as_bytes())
            .unwrap();
        let bad: [&[u8]; 6] = [
            &[0xff],
            &[0xc3],             // a lead byte without its continuation
            &[0x80],             // a lone continuation byte
            &[0xe2, 0x82],       // a truncated 3-byte sequence
            &[0xed, 0xa0, 0x80], // a surrogate
            &[0xc0, 0xaf],       // an overlong encoding
        ];
        let mut refused = 0;
        for b in bad {
            for off in [
                0,
                1,
                31,
                32,
                33,
                63,
                64,
                base.len() / 2,
                base.len() - b.len(),
            ] {
                let mut m = bytes.clone();
                m[at + off..at + off + b.len()].copy_from_slice(b);
                let serde = decode_event_serde(&m).ok();
                assert_eq!(decode_event(&m).ok(), serde, "{b:?} at {off}");
                // A byte put inside a multi-byte character may leave valid text.
                let invalid = std::str::from_utf8(&m[at..at + base.len()]).is_err();
                assert_eq!(serde.is_none(), invalid, "{b:?} at {off}");
                refused += usize::from(invalid);
            }
        }
        assert!(refused >= 40, "only {refused} of 54 texts were invalid");
    }

    fn id(s: &str) -> EntryId {
        EntryId::parse(s).unwrap()
    }

    /// Entries of every kind, with the optional fields both ways, long
    /// strings (str16/str32 forms) and integers of every width.
    fn samples() -> Vec<Entry> {
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
                        arguments: serde_json::json!({"path": "/x", "n": [1, -2.5, null]}),
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
            for_each_damage(&bytes, check);
        }
    }

    /// Ids are read as bytes with an ASCII fast path; serde takes any
    /// UTF-8 string as a decoded id (ids are validated where they are
    /// made, not where they are read). Non-ASCII ids, short (inline) and
    /// long (shared), read by hand as serde reads them, and a non-ASCII
    /// byte that breaks the UTF-8 is refused by both.
    #[test]
    fn non_ascii_ids_decode_as_serde_decodes_them() {
        let cases: [(String, String); 2] = [
            ("\u{e9}1".into(), "\u{fc}".repeat(20)),
            ("x".repeat(30), "p\u{e9}".into()),
        ];
        for (own, parent) in cases {
            let entry = Entry {
                id: EntryId::from_decoded_str(&own),
                parent_id: Some(EntryId::from_decoded_str(&parent)),
                timestamp_ms: 1,
                kind: EntryKind::Reset,
            };
            let bytes = encode_event(&SessionEvent::EntryAppended {
                entry: entry.clone(),
            })
            .unwrap();
            assert_eq!(fast::appended_entry(&bytes[1..], true), Some(entry.clone()));
            assert_eq!(decode_appended_entry(&bytes).unwrap(), entry);
            assert_eq!(decode_appended_entry_serde(&bytes).unwrap(), entry);
            // The first byte of the multi-byte character, alone.
            let at = bytes
                .windows(2)
                .position(|w| w == [0xc3, 0xa9] || w == [0xc3, 0xbc])
                .unwrap();
            let mut bad = bytes.clone();
            bad[at + 1] = b'a';
            assert_eq!(decode_appended_entry_serde(&bad).ok(), None);
            assert_eq!(fast::appended_entry(&bad[1..], true), None);
            assert_eq!(fast::appended_entry(&bad[1..], false), None);
            assert_eq!(decode_appended_entry(&bad).ok(), None);
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

    /// A state around `entries`: every field set (JSON metadata, a model
    /// with parameters, tasks, an error, usage), the leaf on the last entry.
    fn state_of(entries: Vec<Entry>) -> AgentState {
        use super::super::definition::ModelConfig;
        use super::super::state::{ExecutionStatus, Task, TaskStatus};
        let mut transcript = crate::transcript::Transcript::new();
        let leaf = entries.last().map(|e| e.id.clone());
        transcript.replace_all(entries, leaf);
        let mut model = ModelConfig::new("p", "m");
        model
            .params
            .insert("temperature".into(), serde_json::json!(0.5));
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

    fn has_json(e: &Entry) -> bool {
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
    fn transcripts() -> Vec<Vec<Entry>> {
        let all = samples();
        let plain: Vec<Entry> = all.iter().filter(|e| !has_json(e)).cloned().collect();
        vec![
            all,
            plain.clone(),
            plain.into_iter().take(1).collect(),
            vec![],
        ]
    }

    fn created(state: AgentState, parent: bool) -> SessionEvent {
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

    fn snapshot_of(state: AgentState) -> AgentSession {
        let mut s = AgentSession::new(AgentDefinition::new("agent", "d", "sp"), None);
        s.state = state;
        s.pending.clear();
        s
    }

    /// What [`decode_event_split`] answers for `ev`.
    fn split(mut ev: SessionEvent) -> (SessionEvent, Option<TranscriptParts>) {
        let parts = match &mut ev {
            SessionEvent::Created { state, .. } => {
                let t = std::mem::take(&mut state.transcript);
                Some((t.entries().to_vec(), t.leaf().cloned()))
            }
            _ => None,
        };
        (ev, parts)
    }

    fn without_transcript(mut ev: SessionEvent) -> SessionEvent {
        if let SessionEvent::Created { state, .. } = &mut ev {
            state.transcript = crate::transcript::Transcript::new();
        }
        ev
    }

    #[test]
    fn created_events_and_snapshots_are_read_by_hand_as_serde_reads_them() {
        for (i, entries) in transcripts().into_iter().enumerate() {
            let ev = created(state_of(entries.clone()), i % 2 == 0);
            let bytes = encode_event(&ev).unwrap();
            // The written layout is taken by hand, JSON entries included.
            assert_eq!(fast::event(&bytes[1..], true).as_ref(), Some(&ev));
            assert_eq!(decode_event_serde(&bytes).unwrap(), ev);
            assert_eq!(decode_event(&bytes).unwrap(), ev);
            let bare = fast::event(&bytes[1..], false).unwrap();
            assert_eq!(bare, without_transcript(ev.clone()));
            assert_eq!(decode_event_without_transcript(&bytes).unwrap(), bare);
            assert_eq!(decode_event_split(&bytes).unwrap(), split(ev.clone()));
            assert!(fast::event_with(&bytes[1..], fast::Keep::Entries).is_some());

            let rewritten = SessionEvent::HistoryRewritten {
                generation: 9,
                leaf: entries.first().map(|e| e.id.clone()),
                entries: entries.clone(),
            };
            let bytes = encode_event(&rewritten).unwrap();
            assert_eq!(fast::event(&bytes[1..], true).as_ref(), Some(&rewritten));
            assert_eq!(decode_event_serde(&bytes).unwrap(), rewritten);
            assert_eq!(decode_event(&bytes).unwrap(), rewritten);

            let snap = snapshot_of(state_of(entries));
            let bytes = encode_snapshot(&snap).unwrap();
            assert!(fast::snapshot(&bytes[1..]).is_some());
            assert_eq!(decode_snapshot_serde(&bytes).unwrap(), snap);
            assert_eq!(decode_snapshot(&bytes).unwrap(), snap);
        }
        // Other events are serde's, unchanged by the variant decoder.
        let moved = encode_event(&SessionEvent::LeafMoved { leaf: None }).unwrap();
        assert!(fast::event(&moved[1..], true).is_none());
        assert_eq!(
            decode_event_without_transcript(&moved).unwrap(),
            decode_event_serde(&moved).unwrap()
        );
        assert_eq!(
            decode_event_split(&moved).unwrap(),
            (decode_event_serde(&moved).unwrap(), None)
        );
    }

    /// Layouts the hand reader does not take (an unknown extra field,
    /// another field order, a value nested deeper than the skipper
    /// follows) decode through serde to serde's answer.
    #[test]
    fn other_layouts_of_created_events_and_snapshots_go_to_serde() {
        #[derive(Serialize)]
        struct Extra<'a> {
            info: &'a AgentSessionInfo,
            definition: &'a AgentDefinition,
            state: &'a AgentState,
            unknown: u8,
        }
        #[derive(Serialize)]
        struct Reordered<'a> {
            state: &'a AgentState,
            info: &'a AgentSessionInfo,
            definition: &'a AgentDefinition,
        }
        #[derive(Serialize)]
        struct CreatedReordered<'a> {
            #[serde(rename = "type")]
            tag: &'a str,
            state: &'a AgentState,
            id: &'a str,
            parent_id: Option<&'a str>,
            agent_name: &'a str,
            label: &'a str,
            created_at_ms: i64,
            definition: &'a AgentDefinition,
        }
        let plain: Vec<Entry> = samples().into_iter().filter(|e| !has_json(e)).collect();
        let snap = snapshot_of(state_of(plain.clone()));
        let extra = encode(
            "snapshot",
            SNAPSHOT_SCHEMA,
            &Extra {
                info: &snap.info,
                definition: &snap.definition,
                state: &snap.state,
                unknown: 7,
            },
            0,
        )
        .unwrap();
        let reordered = encode(
            "snapshot",
            SNAPSHOT_SCHEMA,
            &Reordered {
                info: &snap.info,
                definition: &snap.definition,
                state: &snap.state,
            },
            0,
        )
        .unwrap();
        for bytes in [extra, reordered] {
            assert!(fast::snapshot(&bytes[1..]).is_none());
            assert_eq!(decode_snapshot(&bytes).unwrap(), snap);
            assert_eq!(decode_snapshot_serde(&bytes).unwrap(), snap);
        }
        let ev = created(state_of(plain.clone()), false);
        let SessionEvent::Created {
            id,
            agent_name,
            label,
            created_at_ms,
            definition,
            state,
            ..
        } = &ev
        else {
            unreachable!()
        };
        let bytes = encode(
            "event",
            EVENT_SCHEMA,
            &CreatedReordered {
                tag: "created",
                state,
                id: id.as_str(),
                parent_id: None,
                agent_name,
                label,
                created_at_ms: *created_at_ms,
                definition,
            },
            0,
        )
        .unwrap();
        assert!(fast::event(&bytes[1..], true).is_none());
        assert_eq!(decode_event(&bytes).unwrap(), ev);
        assert_eq!(
            decode_event_without_transcript(&bytes).unwrap(),
            without_transcript(ev.clone())
        );
        assert_eq!(decode_event_split(&bytes).unwrap(), split(ev));
        // Metadata nested deeper than the skipper follows (but well within
        // serde's limit): serde's answer.
        let mut deep = serde_json::json!(1);
        for _ in 0..fast::SKIP_DEPTH_MAX + 10 {
            deep = serde_json::json!([deep]);
        }
        let ev = created(state_of(plain).with_metadata("deep", deep), true);
        let bytes = encode_event(&ev).unwrap();
        assert!(fast::event(&bytes[1..], true).is_none());
        assert_eq!(decode_event(&bytes).unwrap(), ev);
    }

    /// Truncated and damaged created events and snapshots: the hand
    /// readers never panic and, when they answer, answer what serde
    /// answers; the public decoders agree with serde.
    #[test]
    fn damaged_created_events_and_snapshots_decode_as_serde_decodes_them() {
        let small: Vec<Entry> = samples()
            .into_iter()
            .filter(|e| {
                encode_event(&SessionEvent::EntryAppended { entry: e.clone() })
                    .is_ok_and(|b| b.len() < 300)
            })
            .take(4)
            .collect();
        assert!(small.iter().any(has_json) && small.iter().any(|e| !has_json(e)));
        let mut state = state_of(small);
        state.system_prompt = "sp".into();
        let event = encode_event(&created(state.clone(), true)).unwrap();
        let snapshot = encode_snapshot(&snapshot_of(state)).unwrap();
        let check = |b: &[u8]| {
            let serde = decode_event_serde(b).ok();
            if let Some(body) = b.get(1..) {
                if let Some(fast) = fast::event(body, true) {
                    assert_eq!(Some(fast), serde, "{b:?}");
                }
                if let Some(bare) = fast::event(body, false) {
                    assert_eq!(Some(bare), serde.clone().map(without_transcript), "{b:?}");
                }
            }
            assert_eq!(decode_event(b).ok(), serde, "{b:?}");
            assert_eq!(
                decode_event_without_transcript(b).ok(),
                serde.clone().map(without_transcript),
                "{b:?}"
            );
            assert_eq!(decode_event_split(b).ok(), serde.map(split), "{b:?}");
            let mut s = b.to_vec();
            if let Some(x) = s.first_mut() {
                *x = SNAPSHOT_SCHEMA;
            }
            let serde = decode_snapshot_serde(&s).ok();
            if let Some(fast) = s.get(1..).and_then(fast::snapshot) {
                let (info, definition, state) = fast;
                let fast = AgentSession {
                    info,
                    definition,
                    state,
                    pending: Vec::new(),
                };
                assert_eq!(Some(fast), serde, "{s:?}");
            }
            assert_eq!(decode_snapshot(&s).ok(), serde, "{s:?}");
        };
        for bytes in [&event, &snapshot] {
            for_each_damage(bytes, check);
        }
    }

    /// Entries found by offset in a created or history_rewritten event are
    /// the event's entries (parents aside, which the hand reader leaves
    /// out); any other event has no offsets; damaged bytes never panic and
    /// whatever is found at an offset is an entry serde reads there too.
    #[test]
    fn entries_found_by_offset_are_the_events_entries() {
        let strip = |mut e: Entry, keep: bool| {
            if !keep {
                e.parent_id = None;
            }
            e
        };
        for entries in transcripts() {
            let rewritten = SessionEvent::HistoryRewritten {
                generation: 1,
                entries: entries.clone(),
                leaf: None,
            };
            for ev in [created(state_of(entries.clone()), true), rewritten] {
                let bytes = encode_event(&ev).unwrap();
                let offsets = event_entry_offsets(&bytes).unwrap();
                assert_eq!(offsets.len(), entries.len());
                for (e, &at) in entries.iter().zip(&offsets) {
                    let got = decode_entry_at(&bytes, at).unwrap();
                    // JSON entries are serde's, which keeps the parent.
                    assert_eq!(got, strip(e.clone(), has_json(e)));
                }
            }
        }
        let moved = encode_event(&SessionEvent::LeafMoved { leaf: None }).unwrap();
        assert!(event_entry_offsets(&moved).is_none());
        let plain: Vec<Entry> = samples()
            .into_iter()
            .filter(|e| {
                encode_event(&SessionEvent::EntryAppended { entry: e.clone() })
                    .is_ok_and(|b| b.len() < 300)
            })
            .take(3)
            .collect();
        let bytes = encode_event(&created(state_of(plain), false)).unwrap();
        let check = |b: &[u8]| {
            for at in event_entry_offsets(b).unwrap_or_default() {
                if let Some(e) = decode_entry_at(b, at) {
                    let mut de = rmp_serde::Deserializer::from_read_ref(&b[at..]);
                    let serde = Entry::deserialize(&mut de).unwrap();
                    assert_eq!(strip(serde, e.parent_id.is_some()), e, "{b:?}");
                }
            }
        };
        for_each_damage(&bytes, check);
    }

    /// Calls `check` with every truncation of `bytes` and with every
    /// single-byte flip (five masks) of every byte after the schema byte.
    fn for_each_damage(bytes: &[u8], check: impl Fn(&[u8])) {
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

    /// The capacity hint of an event carrying entries covers its encoded
    /// size, with little to spare, for the usual mix (user 200 B,
    /// assistant 1 KiB, tool output 4 KiB): a seed of megabytes is written
    /// into one allocation. Every other event gets no hint.
    #[test]
    fn the_size_hint_of_a_seed_is_close_to_its_encoded_size() {
        let mut entries = Vec::new();
        for i in 0..300u32 {
            let (kind, len) = match i % 3 {
                0 => ("user", 200),
                1 => ("assistant", 1024),
                _ => ("tool", 4096),
            };
            let content = vec![ContentBlock::text("x".repeat(len))];
            let kind = match kind {
                "user" => EntryKind::Message {
                    message: Message::User { content },
                },
                "assistant" => EntryKind::Message {
                    message: Message::Assistant {
                        content,
                        stop_reason: StopReason::Stop,
                        usage: Usage {
                            input_tokens: 12_345,
                            output_tokens: 678,
                            cache_read_tokens: 0,
                            cache_write_tokens: 0,
                        },
                        model: Some("provider/model".into()),
                        error_message: None,
                    },
                },
                _ => EntryKind::CustomMessage {
                    custom_type: "tool_output".into(),
                    content,
                    display: true,
                    details: None,
                },
            };
            entries.push(Entry {
                id: id(&format!("e{i}")),
                parent_id: i.checked_sub(1).map(|p| id(&format!("e{p}"))),
                timestamp_ms: 1_700_000_000_000 + i64::from(i),
                kind,
            });
        }
        let ev = created(state_of(entries), true);
        let encoded = encode_event(&ev).unwrap().len();
        let hint = event_bytes_hint(&ev);
        let ratio = hint as f64 / encoded as f64;
        assert!(
            (1.0..=1.25).contains(&ratio),
            "hint {hint} B for {encoded} encoded bytes ({ratio:.3})"
        );
        assert_eq!(event_bytes_hint(&SessionEvent::StateCleared), 0);
    }
}
