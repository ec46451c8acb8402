//! Events: [`encode_event`] and the decoders of an event, of an appended
//! entry alone and of a `created` event with its seed apart, each by the
//! hand reader of [`msgpack`](super::msgpack) first and serde otherwise.

use super::msgpack;
use serde::Deserialize;

use super::{decode, encode, CodecError, EVENT_SCHEMA, MAX_CODEC_INPUT};
use crate::session::events::SessionEvent;
use crate::transcript::{ContentBlock, Entry, EntryKind, Message};

/// Encodes one event: `[EVENT_SCHEMA] ++ msgpack(named)`.
pub fn encode_event(event: &SessionEvent) -> Result<Vec<u8>, CodecError> {
    encode("event", EVENT_SCHEMA, event, event_bytes_hint(event))
}

/// The length of [`encode_event`]'s bytes for `event`, counted without
/// writing them.
pub(crate) fn encoded_event_len(event: &SessionEvent) -> Result<usize, CodecError> {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0 = self.0.saturating_add(b.len());
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(1);
    rmp_serde::encode::write_named(&mut n, event).map_err(|e| CodecError::Encode {
        what: "event",
        reason: e.to_string(),
    })?;
    Ok(n.0)
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
/// (in MessagePack a string costs its bytes plus a short prefix), and so
/// are JSON payloads, by the length of their text (MessagePack is not
/// longer but for floats; capacity never written is never faulted in): a
/// short estimate costs one late growth, never a wrong result.
fn event_bytes_hint(event: &SessionEvent) -> usize {
    match event {
        SessionEvent::Created { state, .. } => entries_bytes_hint(state.transcript.entries()),
        SessionEvent::HistoryRewritten { entries, .. } => entries_bytes_hint(entries),
        SessionEvent::TranscriptRewritten { written, .. } => entries_bytes_hint(written),
        // An append's buffer grew ~8 times by doubling for a 1.5 KB entry.
        SessionEvent::EntryAppended { entry } => entries_bytes_hint(std::slice::from_ref(entry)),
        SessionEvent::MetadataWritten { key, value } => {
            key.len().saturating_add(value.as_str().len())
        }
        _ => 0,
    }
}

/// The size hint of `entries` (see [`event_bytes_hint`]).
pub(super) fn entries_bytes_hint(entries: &[Entry]) -> usize {
    entries
        .iter()
        .map(|e| ENTRY_OVERHEAD_BYTES_HINT.saturating_add(entry_strings_bytes(e)))
        .fold(0, usize::saturating_add)
}

/// The bytes of an entry's variable-length strings (content, summaries)
/// and JSON payloads.
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
                ContentBlock::ToolCall {
                    id,
                    name,
                    arguments,
                    ..
                } => id.len() + name.len() + arguments.as_str().len(),
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
            details,
            ..
        } => custom_type
            .len()
            .saturating_add(blocks(content))
            .saturating_add(details.as_ref().map_or(0, |d| d.as_str().len())),
        EntryKind::Custom { custom_type, data } => {
            custom_type.len().saturating_add(data.as_str().len())
        }
        EntryKind::BranchSummary { summary, .. } | EntryKind::Compaction { summary, .. } => {
            summary.len()
        }
        _ => 0,
    }
}

/// Decodes one event written by [`encode_event`].
///
/// A `created`, `entry_appended` or `history_rewritten` event in the layout
/// [`encode_event`] writes is read by hand (module `msgpack`: the entries by
/// the hand entry reader, the other fields by serde from their own bytes), without the
/// event enum's buffering of the whole event; any other event or shape goes
/// through serde, which gives the answer and the error. Both give the same
/// value (checked by tests and the `event_decode` fuzz target).
pub fn decode_event(bytes: &[u8]) -> Result<SessionEvent, CodecError> {
    if let Some(body) = fast_body(EVENT_SCHEMA, bytes) {
        if let Some(ev) = msgpack::event(body, true) {
            return Ok(ev);
        }
    }
    decode_event_serde(bytes)
}

/// [`decode_event`] through serde alone: the reference the hand reader is
/// checked against (tests, the `event_decode` fuzz target).
pub fn decode_event_serde(bytes: &[u8]) -> Result<SessionEvent, CodecError> {
    decode("event", EVENT_SCHEMA, bytes)
}

/// Kinds ([`SessionEvent::kind`]) of the transcript events, which a
/// settings fold (a session folded without its transcript) skips without
/// decoding them: their effect is the transcript alone, which the stores'
/// transcript indexes answer for. A `created` event's seed transcript is
/// dropped by [`decode_event_without_transcript`] instead.
pub(crate) const TRANSCRIPT_EVENT_KINDS: [&str; 4] = [
    "entry_appended",
    "leaf_moved",
    "transcript_rewritten",
    "history_rewritten",
];

/// Whether events of `kind` ([`SessionEvent::kind`]) are skipped by a
/// settings fold (see [`TRANSCRIPT_EVENT_KINDS`]).
pub(crate) fn is_transcript_kind(kind: &str) -> bool {
    TRANSCRIPT_EVENT_KINDS.contains(&kind)
}

/// [`decode_event`] for a reader that never looks at a `created` event's
/// transcript (the sessions index reads only the header): the event is
/// decoded and checked exactly as [`decode_event`] checks it, so it fails
/// exactly when that fails, but a `created` event's transcript is not kept
/// (the returned state's transcript is empty). Every other event is
/// [`decode_event`]'s answer.
pub(crate) fn decode_event_without_transcript(bytes: &[u8]) -> Result<SessionEvent, CodecError> {
    if let Some(body) = fast_body(EVENT_SCHEMA, bytes) {
        if let Some(ev) = msgpack::event(body, false) {
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
        if let Some(split) = msgpack::event_with(body, msgpack::Keep::Entries) {
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
    let offsets = msgpack::entry_offsets(body)?;
    // Offsets in the body are one byte short of offsets in `bytes`.
    Some(offsets.into_iter().map(|o| o + 1).collect())
}

/// The entry that starts at `offset` of `bytes` (an offset from
/// [`event_entry_offsets`]), as [`decode_event`] decodes it in place except
/// its parent, which may be `None` (a caller that reads this takes the
/// parent from its index). `None` when the bytes there are not an entry.
pub(crate) fn decode_entry_at(bytes: &[u8], offset: usize) -> Option<crate::transcript::Entry> {
    msgpack::entry_at(bytes.get(offset..)?)
}

/// The MessagePack body of `bytes` when it is within [`MAX_CODEC_INPUT`]
/// and carries `schema`: what the hand readers may try. `None` leaves the
/// answer (and the error) to serde.
pub(super) fn fast_body(schema: u8, bytes: &[u8]) -> Option<&[u8]> {
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
            if let Some(entry) = msgpack::appended_entry(body, keep_parent) {
                return Ok(entry);
            }
        }
    }
    decode_appended_entry_serde(bytes)
}

/// [`decode_appended_entry`] through serde alone: the reference the hand
/// reader is checked against (tests, the `event_decode` fuzz target).
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

#[cfg(test)]
mod tests {
    use super::super::msgpack;
    use super::super::test_support::{
        created, for_each_damage, has_json, id, samples, state_of, transcripts,
    };
    use super::super::{CodecError, EVENT_SCHEMA};
    use super::*;
    use crate::transcript::{EntryId, StopReason, Usage};

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
            let fast = msgpack::appended_entry(&bytes[1..], true);
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
                    if let Some(fast) = msgpack::appended_entry(body, true) {
                        assert_eq!(Some(fast), serde, "{b:?}");
                    }
                    // Without the parent: accepted exactly when serde accepts.
                    let orphan = msgpack::appended_entry(body, false);
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
            assert_eq!(
                msgpack::appended_entry(&bytes[1..], true),
                Some(entry.clone())
            );
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
            assert_eq!(msgpack::appended_entry(&bad[1..], true), None);
            assert_eq!(msgpack::appended_entry(&bad[1..], false), None);
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
