//! Binary encodings of events and snapshots for event-sourced stores.
//!
//! Both are one schema byte followed by MessagePack in the named
//! (struct-as-map) form, so adding a field with a serde default stays
//! readable by newer code. Decoding never panics on hostile bytes: input
//! is bounded by [`MAX_CODEC_INPUT`], rmp-serde bounds nesting depth (the
//! hand readers of the written layout, `msgpack.rs`, bound theirs far
//! below it), and every failure is a [`CodecError`]. Bytes after the
//! encoded value are ignored.
//!
//! A snapshot is the fold of a session at some version. A snapshot whose
//! schema byte differs from [`SNAPSHOT_SCHEMA`], or that fails to decode,
//! must be ignored by the caller and the events replayed instead.
//!
//! `event.rs` holds the event encodings, `snapshot.rs` the snapshot ones
//! and `msgpack.rs` the hand-written MessagePack reader both try first; this
//! file the schema bytes, the errors and the serde framing they share.

mod event;
mod msgpack;
mod snapshot;
#[cfg(test)]
mod test_support;

pub use event::{decode_appended_entry, decode_event, encode_event};
// The serde reference decoders, for the fuzz targets' cross-checks.
#[cfg(feature = "postgres")]
pub(crate) use event::TRANSCRIPT_EVENT_KINDS;
pub(crate) use event::{
    decode_appended_entry_as, decode_entry_at, decode_event_split, decode_event_without_transcript,
    encoded_event_len, event_entry_offsets, is_transcript_kind, TranscriptParts,
};
#[cfg(feature = "fuzzing")]
pub use event::{decode_appended_entry_serde, decode_event_serde};
#[cfg(feature = "fuzzing")]
pub use snapshot::decode_snapshot_serde;
pub use snapshot::{decode_snapshot, encode_snapshot};

use serde::{Deserialize, Serialize};

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

pub(super) fn encode<T: Serialize>(
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

pub(super) fn decode<'a, T: Deserialize<'a>>(
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
