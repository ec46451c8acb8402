//! The length of a value's compact JSON encoding (as `serde_json` writes
//! it), counted without writing it. [`entry_size`](super::entry_size) is on
//! every append (the resident selection and the index both charge it), and
//! most of an entry is text: `serde_json` escapes a string byte by byte,
//! while the count here sums the bytes to escape over fixed chunks and
//! looks for the rare ones that take six bytes, both of which the
//! compiler vectorizes.
//!
//! Only the shapes transcript entries use are counted here (strings,
//! integers, booleans, null, sequences, maps with string or integer keys,
//! structs and enum variants). Anything else — floats, byte strings, other
//! map keys, `serde_json`'s private number and raw-value structs — answers
//! `None`, and the caller counts with `serde_json` itself, so the answer is
//! always exactly `serde_json`'s.

use serde::ser::{self, Serialize};

/// Length of `serde_json::to_vec(value)`, or `None` for a value with a
/// shape not counted here (see the module docs) or one `serde_json` would
/// refuse.
pub(crate) fn json_len<T: Serialize + ?Sized>(value: &T) -> Option<u64> {
    let mut c = Counter(0);
    value.serialize(&mut c).ok()?;
    Some(c.0)
}

/// Bytes of a parent id in an entry's JSON encoding (`"id"` or `null`).
/// Ids are ASCII letters, digits, `_` and `-`: never escaped.
pub(crate) fn parent_json_len(p: &Option<crate::transcript::EntryId>) -> u64 {
    match p {
        Some(id) => u64::try_from(id.as_str().len())
            .unwrap_or(u64::MAX)
            .saturating_add(2),
        None => 4,
    }
}

/// Length of `s` as a JSON string, quotes included. Not inlined: one
/// copy, vectorized once, instead of one per serialized type.
#[inline(never)]
fn str_len(s: &str) -> u64 {
    // Every byte to escape adds at least one: counted per 64-byte chunk in
    // byte-wide lanes (a chunk counts at most 64, so a `u8` never wraps),
    // which the compiler vectorizes 16 or 32 to a register. A control
    // character without a short escape adds 4 more (`\u00XX`); agent text
    // has newlines and quotes in most chunks but almost never those, so
    // they are only looked for (an OR over the same chunks) and counted
    // again, byte by byte, in the rare string that has one.
    let b = s.as_bytes();
    let mut n = b.len() as u64 + 2;
    let mut long_any = false;
    let mut chunks = b.chunks_exact(64);
    for chunk in &mut chunks {
        n += u64::from(
            chunk
                .iter()
                .fold(0u8, |a, &c| a.wrapping_add(u8::from(escaped(c)))),
        );
        long_any |= chunk.iter().fold(0u8, |a, &c| a | u8::from(long_escape(c))) != 0;
    }
    for &c in chunks.remainder() {
        n += u64::from(escaped(c));
        long_any |= long_escape(c);
    }
    if long_any {
        n += 4 * b.iter().filter(|&&c| long_escape(c)).count() as u64;
    }
    n
}

/// `serde_json` escapes `c`: a quote, a backslash or a control character.
#[inline(always)]
fn escaped(c: u8) -> bool {
    c < 0x20 || c == b'"' || c == b'\\'
}

/// `c` is a control character without a short escape (`\b \t \n \f \r`):
/// `serde_json` writes it as `\u00XX`, 6 bytes.
#[inline(always)]
fn long_escape(c: u8) -> bool {
    c < 0x20 && !matches!(c, 0x08..=0x0A | 0x0C | 0x0D)
}

fn u64_len(v: u64) -> u64 {
    u64::from(v.checked_ilog10().unwrap_or(0)) + 1
}

fn u128_len(v: u128) -> u64 {
    u64::from(v.checked_ilog10().unwrap_or(0)) + 1
}

fn i64_len(v: i64) -> u64 {
    u64_len(v.unsigned_abs()) + u64::from(v < 0)
}

/// A shape this counter does not count (the caller falls back).
#[derive(Debug)]
pub(crate) struct Uncounted;

impl std::fmt::Display for Uncounted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("not counted")
    }
}

impl std::error::Error for Uncounted {}

impl ser::Error for Uncounted {
    fn custom<T: std::fmt::Display>(_msg: T) -> Self {
        Uncounted
    }
}

struct Counter(u64);

/// A sequence, map or struct being counted: `first` until its first
/// element (elements after it add a comma); `close` bytes end it.
struct Compound<'a> {
    c: &'a mut Counter,
    first: bool,
    close: u64,
}

impl Compound<'_> {
    fn comma(&mut self) {
        if self.first {
            self.first = false;
        } else {
            self.c.0 += 1;
        }
    }

    fn element<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Uncounted> {
        self.comma();
        v.serialize(&mut *self.c)
    }

    fn field<T: Serialize + ?Sized>(&mut self, key: &str, v: &T) -> Result<(), Uncounted> {
        self.comma();
        // `"key":`
        self.c.0 += str_len(key) + 1;
        v.serialize(&mut *self.c)
    }

    fn end(self) -> Result<(), Uncounted> {
        self.c.0 += self.close;
        Ok(())
    }
}

/// Whether a struct name is one of `serde_json`'s private markers (its
/// arbitrary-precision number or raw value), which it writes verbatim.
fn private_struct(name: &str) -> bool {
    name.starts_with("$serde_json")
}

impl<'a> ser::Serializer for &'a mut Counter {
    type Ok = ();
    type Error = Uncounted;
    type SerializeSeq = Compound<'a>;
    type SerializeTuple = Compound<'a>;
    type SerializeTupleStruct = Compound<'a>;
    type SerializeTupleVariant = Compound<'a>;
    type SerializeMap = Compound<'a>;
    type SerializeStruct = Compound<'a>;
    type SerializeStructVariant = Compound<'a>;

    fn serialize_bool(self, v: bool) -> Result<(), Uncounted> {
        self.0 += if v { 4 } else { 5 };
        Ok(())
    }
    fn serialize_i8(self, v: i8) -> Result<(), Uncounted> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<(), Uncounted> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<(), Uncounted> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<(), Uncounted> {
        self.0 += i64_len(v);
        Ok(())
    }
    fn serialize_i128(self, v: i128) -> Result<(), Uncounted> {
        self.0 += u128_len(v.unsigned_abs()) + u64::from(v < 0);
        Ok(())
    }
    fn serialize_u8(self, v: u8) -> Result<(), Uncounted> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<(), Uncounted> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<(), Uncounted> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<(), Uncounted> {
        self.0 += u64_len(v);
        Ok(())
    }
    fn serialize_u128(self, v: u128) -> Result<(), Uncounted> {
        self.0 += u128_len(v);
        Ok(())
    }
    fn serialize_f32(self, _v: f32) -> Result<(), Uncounted> {
        Err(Uncounted)
    }
    fn serialize_f64(self, _v: f64) -> Result<(), Uncounted> {
        Err(Uncounted)
    }
    fn serialize_char(self, v: char) -> Result<(), Uncounted> {
        self.serialize_str(v.encode_utf8(&mut [0u8; 4]))
    }
    fn serialize_str(self, v: &str) -> Result<(), Uncounted> {
        self.0 += str_len(v);
        Ok(())
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<(), Uncounted> {
        Err(Uncounted)
    }
    fn serialize_none(self) -> Result<(), Uncounted> {
        self.serialize_unit()
    }
    fn serialize_some<T: Serialize + ?Sized>(self, value: &T) -> Result<(), Uncounted> {
        value.serialize(self)
    }
    fn serialize_unit(self) -> Result<(), Uncounted> {
        self.0 += 4;
        Ok(())
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<(), Uncounted> {
        self.serialize_unit()
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<(), Uncounted> {
        self.serialize_str(variant)
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<(), Uncounted> {
        if private_struct(name) {
            return Err(Uncounted);
        }
        value.serialize(self)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        value: &T,
    ) -> Result<(), Uncounted> {
        // `{"variant":value}`
        self.0 += str_len(variant) + 3;
        value.serialize(self)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Compound<'a>, Uncounted> {
        self.0 += 1;
        Ok(Compound {
            c: self,
            first: true,
            close: 1,
        })
    }
    fn serialize_tuple(self, len: usize) -> Result<Compound<'a>, Uncounted> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        len: usize,
    ) -> Result<Compound<'a>, Uncounted> {
        self.serialize_seq(Some(len))
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, Uncounted> {
        // `{"variant":[` ... `]}`
        self.0 += str_len(variant) + 3;
        Ok(Compound {
            c: self,
            first: true,
            close: 2,
        })
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Compound<'a>, Uncounted> {
        self.0 += 1;
        Ok(Compound {
            c: self,
            first: true,
            close: 1,
        })
    }
    fn serialize_struct(self, name: &'static str, len: usize) -> Result<Compound<'a>, Uncounted> {
        if private_struct(name) {
            return Err(Uncounted);
        }
        self.serialize_map(Some(len))
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
        _len: usize,
    ) -> Result<Compound<'a>, Uncounted> {
        // `{"variant":{` ... `}}`
        self.0 += str_len(variant) + 3;
        Ok(Compound {
            c: self,
            first: true,
            close: 2,
        })
    }
}

/// The sequence-like compounds (arrays, tuples, tuple structs and tuple
/// variants) all count an element the same way; only the trait's method
/// name differs.
macro_rules! element_compound {
    ($($trait:ident :: $method:ident),* $(,)?) => {$(
        impl ser::$trait for Compound<'_> {
            type Ok = ();
            type Error = Uncounted;
            fn $method<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Uncounted> {
                self.element(v)
            }
            fn end(self) -> Result<(), Uncounted> {
                Compound::end(self)
            }
        }
    )*};
}

element_compound!(
    SerializeSeq::serialize_element,
    SerializeTuple::serialize_element,
    SerializeTupleStruct::serialize_field,
    SerializeTupleVariant::serialize_field,
);

impl ser::SerializeMap for Compound<'_> {
    type Ok = ();
    type Error = Uncounted;
    fn serialize_key<T: Serialize + ?Sized>(&mut self, key: &T) -> Result<(), Uncounted> {
        self.comma();
        self.c.0 += key.serialize(KeyCounter)?;
        Ok(())
    }
    fn serialize_value<T: Serialize + ?Sized>(&mut self, v: &T) -> Result<(), Uncounted> {
        // `:value`
        self.c.0 += 1;
        v.serialize(&mut *self.c)
    }
    fn end(self) -> Result<(), Uncounted> {
        Compound::end(self)
    }
}

impl ser::SerializeStruct for Compound<'_> {
    type Ok = ();
    type Error = Uncounted;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), Uncounted> {
        self.field(key, v)
    }
    fn end(self) -> Result<(), Uncounted> {
        Compound::end(self)
    }
}

impl ser::SerializeStructVariant for Compound<'_> {
    type Ok = ();
    type Error = Uncounted;
    fn serialize_field<T: Serialize + ?Sized>(
        &mut self,
        key: &'static str,
        v: &T,
    ) -> Result<(), Uncounted> {
        self.field(key, v)
    }
    fn end(self) -> Result<(), Uncounted> {
        Compound::end(self)
    }
}

/// A map key's length: strings as strings, integers quoted; any other key
/// is not counted.
struct KeyCounter;

impl ser::Serializer for KeyCounter {
    type Ok = u64;
    type Error = Uncounted;
    type SerializeSeq = ser::Impossible<u64, Uncounted>;
    type SerializeTuple = ser::Impossible<u64, Uncounted>;
    type SerializeTupleStruct = ser::Impossible<u64, Uncounted>;
    type SerializeTupleVariant = ser::Impossible<u64, Uncounted>;
    type SerializeMap = ser::Impossible<u64, Uncounted>;
    type SerializeStruct = ser::Impossible<u64, Uncounted>;
    type SerializeStructVariant = ser::Impossible<u64, Uncounted>;

    fn serialize_str(self, v: &str) -> Result<u64, Uncounted> {
        Ok(str_len(v))
    }
    fn serialize_char(self, v: char) -> Result<u64, Uncounted> {
        Ok(str_len(v.encode_utf8(&mut [0u8; 4])))
    }
    fn serialize_unit_variant(
        self,
        _name: &'static str,
        _index: u32,
        variant: &'static str,
    ) -> Result<u64, Uncounted> {
        Ok(str_len(variant))
    }
    fn serialize_newtype_struct<T: Serialize + ?Sized>(
        self,
        name: &'static str,
        value: &T,
    ) -> Result<u64, Uncounted> {
        if private_struct(name) {
            return Err(Uncounted);
        }
        value.serialize(self)
    }
    fn serialize_i8(self, v: i8) -> Result<u64, Uncounted> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i16(self, v: i16) -> Result<u64, Uncounted> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i32(self, v: i32) -> Result<u64, Uncounted> {
        self.serialize_i64(i64::from(v))
    }
    fn serialize_i64(self, v: i64) -> Result<u64, Uncounted> {
        Ok(i64_len(v) + 2)
    }
    fn serialize_u8(self, v: u8) -> Result<u64, Uncounted> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u16(self, v: u16) -> Result<u64, Uncounted> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u32(self, v: u32) -> Result<u64, Uncounted> {
        self.serialize_u64(u64::from(v))
    }
    fn serialize_u64(self, v: u64) -> Result<u64, Uncounted> {
        Ok(u64_len(v) + 2)
    }
    fn serialize_bool(self, _v: bool) -> Result<u64, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_f32(self, _v: f32) -> Result<u64, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_f64(self, _v: f64) -> Result<u64, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_bytes(self, _v: &[u8]) -> Result<u64, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_none(self) -> Result<u64, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_some<T: Serialize + ?Sized>(self, _value: &T) -> Result<u64, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_unit(self) -> Result<u64, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_unit_struct(self, _name: &'static str) -> Result<u64, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_newtype_variant<T: Serialize + ?Sized>(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _value: &T,
    ) -> Result<u64, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_seq(self, _len: Option<usize>) -> Result<Self::SerializeSeq, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_tuple(self, _len: usize) -> Result<Self::SerializeTuple, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_tuple_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleStruct, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_tuple_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeTupleVariant, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_map(self, _len: Option<usize>) -> Result<Self::SerializeMap, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_struct(
        self,
        _name: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStruct, Uncounted> {
        Err(Uncounted)
    }
    fn serialize_struct_variant(
        self,
        _name: &'static str,
        _index: u32,
        _variant: &'static str,
        _len: usize,
    ) -> Result<Self::SerializeStructVariant, Uncounted> {
        Err(Uncounted)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use serde_json::{json, Value};

    use super::*;
    use crate::transcript::{ContentBlock, Entry, EntryId, EntryKind, Message, StopReason, Usage};

    fn exact<T: Serialize>(v: &T) -> u64 {
        serde_json::to_vec(v).unwrap().len() as u64
    }

    /// Strings with everything that is escaped (quotes, backslashes, the
    /// short escapes, other control characters) and multi-byte text.
    fn text() -> impl Strategy<Value = String> {
        prop::collection::vec(
            prop_oneof![
                Just('"'),
                Just('\\'),
                Just('\n'),
                Just('\t'),
                Just('\u{8}'),
                Just('\u{c}'),
                Just('\r'),
                Just('\u{0}'),
                Just('\u{b}'),
                Just('\u{1f}'),
                Just('\u{7f}'),
                Just('é'),
                Just('€'),
                Just('𝄞'),
                Just(' '),
                prop::char::range('a', 'z'),
            ],
            0..40,
        )
        .prop_map(|cs| cs.into_iter().collect())
    }

    fn value() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(|v| json!(v)),
            any::<u64>().prop_map(|v| json!(v)),
            text().prop_map(Value::String),
        ];
        leaf.prop_recursive(3, 24, 4, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
                prop::collection::vec((text(), inner), 0..4)
                    .prop_map(|kv| Value::Object(kv.into_iter().collect())),
            ]
        })
    }

    fn block() -> impl Strategy<Value = ContentBlock> {
        prop_oneof![
            text().prop_map(|text| ContentBlock::Text { text }),
            (text(), prop::option::of(text()), any::<bool>()).prop_map(
                |(thinking, signature, redacted)| ContentBlock::Thinking {
                    thinking,
                    signature,
                    redacted
                }
            ),
            (text(), text(), value()).prop_map(|(id, name, arguments)| ContentBlock::ToolCall {
                id,
                name,
                arguments: arguments.into(),
                signature: None,
            }),
        ]
    }

    fn kind() -> impl Strategy<Value = EntryKind> {
        let blocks = || prop::collection::vec(block(), 0..4);
        prop_oneof![
            blocks().prop_map(|content| EntryKind::Message {
                message: Message::User { content }
            }),
            (blocks(), any::<u64>(), prop::option::of(text())).prop_map(
                |(content, tokens, error_message)| EntryKind::Message {
                    message: Message::Assistant {
                        content,
                        stop_reason: StopReason::ToolUse,
                        usage: Usage {
                            input_tokens: tokens,
                            ..Usage::default()
                        },
                        model: None,
                        error_message,
                    }
                }
            ),
            (text(), value()).prop_map(|(custom_type, data)| EntryKind::Custom {
                custom_type,
                data: data.into()
            }),
            (text(), any::<u64>()).prop_map(|(summary, tokens_before)| EntryKind::Compaction {
                summary,
                first_kept_entry_id: EntryId::generate(),
                tokens_before,
            }),
            Just(EntryKind::Reset),
        ]
    }

    proptest! {
        #[test]
        fn counts_exactly_what_serde_json_writes(k in kind(), ts in any::<i64>()) {
            let e = Entry {
                id: EntryId::generate(),
                parent_id: None,
                timestamp_ms: ts,
                kind: k,
            };
            prop_assert_eq!(json_len(&e), Some(exact(&e)));
            prop_assert_eq!(crate::transcript::entry_size(&e), exact(&e));
        }

        /// Strings longer than the 64-byte chunks `str_len` counts in,
        /// so that whole chunks (with and without anything to escape) and
        /// a remainder are all exercised.
        #[test]
        fn long_strings(parts in prop::collection::vec(text(), 0..12), pad in 0usize..130) {
            let s: String = parts.concat();
            prop_assert_eq!(str_len(&s), exact(&s));
            // With chunks that have nothing to escape around it.
            let padded = format!("{}{s}{}", "a".repeat(pad), "b".repeat(130 - pad));
            prop_assert_eq!(str_len(&padded), exact(&padded));
        }

        #[test]
        fn strings_and_integers(s in text(), i in any::<i64>(), u in any::<u64>()) {
            prop_assert_eq!(json_len(&s), Some(exact(&s)));
            prop_assert_eq!(json_len(&i), Some(exact(&i)));
            prop_assert_eq!(json_len(&u), Some(exact(&u)));
            let m: std::collections::BTreeMap<u64, i64> = [(u, i)].into();
            prop_assert_eq!(json_len(&m), Some(exact(&m)));
        }
    }

    #[test]
    fn floats_are_left_to_serde_json_and_still_exact() {
        let e = Entry {
            id: EntryId::generate(),
            parent_id: None,
            timestamp_ms: 0,
            kind: EntryKind::Custom {
                custom_type: "t".into(),
                data: json!({"f": 1.5, "g": [0.1, -2e300]}).into(),
            },
        };
        assert_eq!(json_len(&e), None);
        assert_eq!(crate::transcript::entry_size(&e), exact(&e));
    }

    #[test]
    fn unit_variants_tuples_and_options() {
        let v = (
            StopReason::Aborted,
            Some(3u8),
            None::<u8>,
            'q',
            '"',
            -7i128,
            (),
        );
        assert_eq!(json_len(&v), Some(exact(&v)));
        let empty: Vec<u8> = Vec::new();
        assert_eq!(json_len(&empty), Some(exact(&empty)));
    }
}
