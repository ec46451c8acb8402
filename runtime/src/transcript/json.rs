//! [`Json`]: an opaque JSON payload held as its compact text.
//!
//! Entries and events carry JSON values the runtime never looks into (a
//! tool call's arguments, a custom entry's data, a metadata value). Held
//! as a `serde_json::Value` tree, such a value takes ~32 bytes per element
//! plus the copies a decode, fold and encode make; held as text it takes
//! its own length. Every conversion streams: a [`Json`] is decoded from any
//! deserializer (MessagePack from the log, JSON from an export line) by
//! writing JSON text as the values arrive, and encoded into any serializer
//! by reading the text with `serde_json`'s parser, so no tree is built
//! either way.
//!
//! # Canonical text
//!
//! The text is always the one `serde_json::to_string` writes for the
//! equivalent `serde_json::Value` (whose map sorts its keys: `serde_json`'s
//! `preserve_order` feature is off): compact, object keys in byte order
//! (also when a source, e.g. a JSON file, has them in another order), a repeated key keeping its
//! last value, numbers and string escapes as `serde_json` writes them, a
//! float that is not finite written as `null`. So a [`Json`] encodes to
//! exactly the bytes the `Value` did (the stored format is unchanged), and
//! two [`Json`]s are equal exactly when their texts are, which is when the
//! `Value`s are equal.
//!
//! Decoding accepts exactly what `Value` accepted: byte strings, enums,
//! non-string map keys and integers beyond the 64-bit range are refused
//! with an error, never a panic. Nesting is bounded by the source's own
//! limit (128 for `serde_json` text, rmp-serde's for MessagePack), as it
//! was for `Value`.

use std::fmt;
use std::io::Write as _;
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// An immutable JSON value stored as its canonical compact text (see the
/// module docs): what entries and events hold for opaque payloads. The
/// text is shared: a clone (a fold copying an entry into the transcript)
/// does not copy it.
///
/// Build one from a `serde_json::Value` (`json!({...}).into()`) or from
/// text ([`Json::from_text`]); read it as text ([`Json::as_str`],
/// `Display`) or as a tree ([`Json::to_value`]). It serializes exactly as
/// the `Value` it holds would.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct Json(Arc<String>);

impl Json {
    /// The JSON `null`.
    pub fn null() -> Self {
        Json(Arc::new("null".to_string()))
    }

    /// Parses and validates JSON text (with `serde_json`'s nesting limit
    /// of 128); the value keeps the canonical form of it.
    pub fn from_text(text: &str) -> Result<Self, serde_json::Error> {
        let mut de = serde_json::Deserializer::from_str(text);
        // The canonical text is about as long as the text read.
        let json = Json::from_seed(text.len(), &mut de)?;
        de.end()?;
        Ok(json)
    }

    /// The canonical compact JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The value as a `serde_json::Value` tree (built on each call).
    pub fn to_value(&self) -> serde_json::Value {
        let mut de = serde_json::Deserializer::from_str(&self.0);
        de.disable_recursion_limit();
        // The text is valid JSON, written by this module.
        serde_json::Value::deserialize(&mut de).unwrap_or(serde_json::Value::Null)
    }

    /// Whether the value is `null`.
    pub fn is_null(&self) -> bool {
        self.0.as_str() == "null"
    }

    /// The value if it is a string (unescaped).
    pub fn as_string(&self) -> Option<String> {
        if !self.0.starts_with('"') {
            return None;
        }
        serde_json::from_str(&self.0).ok()
    }

    /// Decodes a value from any deserializer into canonical text (see
    /// the module docs), without building a tree.
    pub fn from_deserializer<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Json::from_seed(0, d)
    }

    /// [`Json::from_deserializer`] into a buffer of `capacity` bytes.
    fn from_seed<'de, D: Deserializer<'de>>(capacity: usize, d: D) -> Result<Self, D::Error> {
        let mut out = Vec::with_capacity(capacity);
        TextSeed { out: &mut out }.deserialize(d)?;
        let mut text = String::from_utf8(out).map_err(de::Error::custom)?;
        // In place for the allocator of the `spool` binary when less
        // than half is spare; the text is not copied again after this.
        text.shrink_to_fit();
        Ok(Json(Arc::new(text)))
    }
}

impl Default for Json {
    /// `null`.
    fn default() -> Self {
        Json::null()
    }
}

impl fmt::Debug for Json {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Json({})", self.0)
    }
}

impl fmt::Display for Json {
    /// The canonical compact JSON text.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<serde_json::Value> for Json {
    fn from(v: serde_json::Value) -> Self {
        Json::from(&v)
    }
}

impl From<&serde_json::Value> for Json {
    fn from(v: &serde_json::Value) -> Self {
        // Read like any source, so the keys are sorted whatever order the
        // `Value`'s map keeps; a `Value` is always valid JSON.
        Json::from_deserializer(v).unwrap_or_default()
    }
}

impl From<Json> for serde_json::Value {
    fn from(j: Json) -> Self {
        j.to_value()
    }
}

impl PartialEq<serde_json::Value> for Json {
    fn eq(&self, other: &serde_json::Value) -> bool {
        Json::from_deserializer(other).is_ok_and(|j| j == *self)
    }
}

impl PartialEq<Json> for serde_json::Value {
    fn eq(&self, other: &Json) -> bool {
        other == self
    }
}

impl Serialize for Json {
    /// The data model stream of the equivalent `Value`, lengths included,
    /// read from the text (see `json_encode`).
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        super::json_encode::encode(&self.0, s)
    }
}

impl<'de> Deserialize<'de> for Json {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Json::from_deserializer(d)
    }
}

/// Writes the canonical text of the next value into `out`.
struct TextSeed<'a> {
    out: &'a mut Vec<u8>,
}

/// A `serde_json` scalar into `out` (writing to a `Vec` fails only on a
/// value `serde_json` refuses, which no caller passes).
fn scalar<T: Serialize + ?Sized, E: de::Error>(out: &mut Vec<u8>, v: &T) -> Result<(), E> {
    serde_json::to_writer(out, v).map_err(E::custom)
}

impl<'de> DeserializeSeed<'de> for TextSeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for TextSeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.out
            .extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        write!(self.out, "{v}").map_err(E::custom)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        write!(self.out, "{v}").map_err(E::custom)
    }

    fn visit_i128<E: de::Error>(self, v: i128) -> Result<(), E> {
        // As `Value`: an integer in the 64-bit range, else an error.
        if let Ok(u) = u64::try_from(v) {
            self.visit_u64(u)
        } else if let Ok(i) = i64::try_from(v) {
            self.visit_i64(i)
        } else {
            Err(E::custom("JSON number out of range"))
        }
    }

    fn visit_u128<E: de::Error>(self, v: u128) -> Result<(), E> {
        match u64::try_from(v) {
            Ok(u) => self.visit_u64(u),
            Err(_) => Err(E::custom("JSON number out of range")),
        }
    }

    fn visit_f32<E: de::Error>(self, v: f32) -> Result<(), E> {
        // As `Value`, which widens it to f64.
        self.visit_f64(f64::from(v))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        // `serde_json` writes a float that is not finite as `null`, as
        // `Value` holds it.
        scalar(self.out, &v)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        scalar(self.out, v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.out.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.deserialize(d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.out.push(b'[');
        let mut first = true;
        loop {
            let mark = self.out.len();
            if !first {
                self.out.push(b',');
            }
            if seq
                .next_element_seed(TextSeed {
                    out: &mut *self.out,
                })?
                .is_none()
            {
                self.out.truncate(mark);
                break;
            }
            first = false;
        }
        self.out.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        // The entries are written as they come; a `Value`'s map holds
        // them in key order with a repeated key's last value, so when
        // the keys did not come strictly increasing the object is
        // written again in that order.
        let start = self.out.len();
        self.out.push(b'{');
        // The raw keys, one after the other.
        let mut keys: Vec<u8> = Vec::new();
        // Per entry: the end of its key in `keys`, the start and end of
        // its value in `out`.
        let mut spans: Vec<[usize; 3]> = Vec::new();
        let mut sorted = true;
        while map.next_key_seed(KeySeed { out: &mut keys })?.is_some() {
            let key_start = spans.last().map_or(0, |s| s[0]);
            let key_end = keys.len();
            if let Some(prev) = spans.len().checked_sub(1) {
                let prev_start = prev.checked_sub(1).map_or(0, |p| spans[p][0]);
                sorted &= keys[prev_start..key_start] < keys[key_start..key_end];
                self.out.push(b',');
            }
            let key = std::str::from_utf8(&keys[key_start..key_end]).map_err(de::Error::custom)?;
            scalar(self.out, key)?;
            self.out.push(b':');
            let value_start = self.out.len();
            map.next_value_seed(TextSeed {
                out: &mut *self.out,
            })?;
            spans.push([key_end, value_start, self.out.len()]);
        }
        if !sorted {
            let body = self.out.split_off(start);
            let key = |i: usize| &keys[i.checked_sub(1).map_or(0, |p| spans[p][0])..spans[i][0]];
            let mut order: Vec<usize> = (0..spans.len()).collect();
            // Stable: among equal keys the last stays last.
            order.sort_by(|&a, &b| key(a).cmp(key(b)));
            self.out.push(b'{');
            let mut first = true;
            for (n, &i) in order.iter().enumerate() {
                if order.get(n + 1).is_some_and(|&next| key(next) == key(i)) {
                    continue;
                }
                if !first {
                    self.out.push(b',');
                }
                first = false;
                let k = std::str::from_utf8(key(i)).map_err(de::Error::custom)?;
                scalar(self.out, k)?;
                self.out.push(b':');
                self.out
                    .extend_from_slice(&body[spans[i][1] - start..spans[i][2] - start]);
            }
        }
        self.out.push(b'}');
        Ok(())
    }
}

/// Appends a map key's raw text (a string, as `Value` requires) to `out`.
struct KeySeed<'a> {
    out: &'a mut Vec<u8>,
}

impl<'de> DeserializeSeed<'de> for KeySeed<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string key")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        self.out.extend_from_slice(v.as_bytes());
        Ok(())
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
