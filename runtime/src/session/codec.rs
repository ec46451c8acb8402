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
pub fn decode_appended_entry(bytes: &[u8]) -> Result<crate::transcript::Entry, CodecError> {
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
    use crate::transcript::{ContentBlock, Entry, EntryId, EntryKind, Message};

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
