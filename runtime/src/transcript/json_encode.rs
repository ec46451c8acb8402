//! Encoding a [`Json`](super::Json)'s canonical text into any serializer
//! with the data model stream of the equivalent `serde_json::Value`:
//! the text is read by `serde_json`'s parser and each value handed on as
//! it is read (no tree), and every sequence and map announces its length
//! as a `Value`'s does. The lengths come from one scan of the text before
//! (4 bytes per array or object), so a serializer that needs them
//! (rmp-serde writes a length first) does not buffer the elements.

use std::cell::{Cell, RefCell};
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{self, Serialize, SerializeMap, SerializeSeq, Serializer};

/// The element counts of the arrays and objects of a canonical JSON text
/// (no whitespace), in the order they open; `None` for a text too long
/// for 32-bit counts.
fn container_lengths(text: &[u8]) -> Option<Vec<u32>> {
    u32::try_from(text.len()).ok()?;
    let mut lens: Vec<u32> = Vec::new();
    // Per open container: its index in `lens` and its commas so far.
    let mut open: Vec<(usize, u32)> = Vec::new();
    let mut i = 0;
    while let Some(&c) = text.get(i) {
        match c {
            b'"' => {
                // To the closing quote, over escapes.
                i += 1;
                while let Some(&c) = text.get(i) {
                    match c {
                        b'\\' => i += 1,
                        b'"' => break,
                        _ => {}
                    }
                    i += 1;
                }
            }
            b'[' | b'{' => {
                open.push((lens.len(), 0));
                lens.push(0);
            }
            b',' => {
                if let Some(top) = open.last_mut() {
                    top.1 += 1;
                }
            }
            b']' | b'}' => {
                let (at, commas) = open.pop()?;
                let empty = i > 0 && matches!(text[i - 1], b'[' | b'{');
                lens[at] = if empty { 0 } else { commas + 1 };
            }
            _ => {}
        }
        i += 1;
    }
    Some(lens)
}

/// The lengths of the containers, handed out in order.
struct Lengths {
    lens: Option<Vec<u32>>,
    next: Cell<usize>,
}

impl Lengths {
    fn take(&self) -> Option<usize> {
        let i = self.next.get();
        self.next.set(i + 1);
        self.lens
            .as_ref()
            .and_then(|l| l.get(i))
            .map(|&n| n as usize)
    }
}

/// Serializes `text` (canonical JSON) into `s`.
pub(super) fn encode<S: Serializer>(text: &str, s: S) -> Result<S::Ok, S::Error> {
    let lengths = Lengths {
        lens: container_lengths(text.as_bytes()),
        next: Cell::new(0),
    };
    let mut de = serde_json::Deserializer::from_str(text);
    // The text was accepted when it was built (perhaps deeper than
    // `serde_json`'s default limit, from MessagePack or a `Value`).
    de.disable_recursion_limit();
    Next::new(&mut de, &lengths).serialize(s)
}

/// The next value of the deserializer, as a `Serialize`.
struct Next<'l, D> {
    d: RefCell<Option<D>>,
    lengths: &'l Lengths,
}

impl<'l, D> Next<'l, D> {
    fn new(d: D, lengths: &'l Lengths) -> Self {
        Next {
            d: RefCell::new(Some(d)),
            lengths,
        }
    }
}

/// A serializer's error carried through the deserializer's, as text.
fn s2d<E: ser::Error, F: de::Error>(e: E) -> F {
    F::custom(e)
}

impl<'de, D: Deserializer<'de>> Serialize for Next<'_, D> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let d = self
            .d
            .borrow_mut()
            .take()
            .ok_or_else(|| ser::Error::custom("a value serialized twice"))?;
        d.deserialize_any(Forward {
            s,
            lengths: self.lengths,
        })
        .map_err(ser::Error::custom)
    }
}

/// Hands each value read on to the serializer.
struct Forward<'l, S> {
    s: S,
    lengths: &'l Lengths,
}

impl<'de, S: Serializer> Visitor<'de> for Forward<'_, S> {
    type Value = S::Ok;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<S::Ok, E> {
        self.s.serialize_bool(v).map_err(s2d)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<S::Ok, E> {
        self.s.serialize_i64(v).map_err(s2d)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<S::Ok, E> {
        self.s.serialize_u64(v).map_err(s2d)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<S::Ok, E> {
        self.s.serialize_f64(v).map_err(s2d)
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<S::Ok, E> {
        self.s.serialize_str(v).map_err(s2d)
    }

    fn visit_unit<E: de::Error>(self) -> Result<S::Ok, E> {
        self.s.serialize_unit().map_err(s2d)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<S::Ok, A::Error> {
        let mut out = self.s.serialize_seq(self.lengths.take()).map_err(s2d)?;
        while seq
            .next_element_seed(Element {
                out: &mut out,
                lengths: self.lengths,
            })?
            .is_some()
        {}
        out.end().map_err(s2d)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<S::Ok, A::Error> {
        let mut out = self.s.serialize_map(self.lengths.take()).map_err(s2d)?;
        while map
            .next_key_seed(MapKey {
                out: &mut out,
                lengths: self.lengths,
            })?
            .is_some()
        {
            map.next_value_seed(MapValue {
                out: &mut out,
                lengths: self.lengths,
            })?;
        }
        out.end().map_err(s2d)
    }
}

struct Element<'a, 'l, T> {
    out: &'a mut T,
    lengths: &'l Lengths,
}

impl<'de, T: SerializeSeq> DeserializeSeed<'de> for Element<'_, '_, T> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.out
            .serialize_element(&Next::new(d, self.lengths))
            .map_err(s2d)
    }
}

struct MapKey<'a, 'l, T> {
    out: &'a mut T,
    lengths: &'l Lengths,
}

impl<'de, T: SerializeMap> DeserializeSeed<'de> for MapKey<'_, '_, T> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.out
            .serialize_key(&Next::new(d, self.lengths))
            .map_err(s2d)
    }
}

struct MapValue<'a, 'l, T> {
    out: &'a mut T,
    lengths: &'l Lengths,
}

impl<'de, T: SerializeMap> DeserializeSeed<'de> for MapValue<'_, '_, T> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        self.out
            .serialize_value(&Next::new(d, self.lengths))
            .map_err(s2d)
    }
}

#[cfg(test)]
mod tests {
    use super::container_lengths;

    #[test]
    fn lengths_are_counted_in_opening_order_over_strings() {
        let text = br#"{"a":[1,[],[2,3]],"b,[":"x\"],{","c":{}}"#;
        assert_eq!(container_lengths(text), Some(vec![3, 3, 0, 2, 0]));
        assert_eq!(container_lengths(b"[]"), Some(vec![0]));
        assert_eq!(container_lengths(b"1"), Some(vec![]));
    }
}
