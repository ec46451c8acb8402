//! Decoding of the internally tagged enums (entries' kinds, messages,
//! content blocks, session events) without buffering.
//!
//! serde's derived decoder of an internally tagged enum buffers the whole
//! value in a tree of its private `Content` nodes (~32 bytes per element)
//! before it looks at the tag, whatever the tag's position: an event
//! carrying a tool call whose arguments hold a million-element array
//! takes tens of times its size. Every writer of these enums (rmp-serde,
//! `serde_json`, through their derived encoders) puts the tag first, so
//! [`deserialize`] reads the first key; when it is the tag, the variant's
//! fields are decoded straight from the rest of the map by the enum's
//! externally tagged twin (a `#[serde(remote = ...)]` derive of the same
//! variants, which the compiler checks against the enum). A map whose tag
//! is not first is buffered, in the source's own kind of format (JSON text
//! for a human-readable source, MessagePack otherwise), and decoded from
//! that, at the cost of one copy: the same answers as serde's, except that
//! a field repeated inside a JSON-buffered value keeps its last occurrence
//! where serde would refuse it. A sequence (serde's compact form: the tag,
//! then the fields in order) is decoded in place.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{
    self, DeserializeSeed, Deserializer, EnumAccess, IgnoredAny, IntoDeserializer, MapAccess,
    SeqAccess, VariantAccess, Visitor,
};

/// An internally tagged enum decoded through [`deserialize`].
pub(crate) trait Tagged: Sized {
    /// The tag's field name.
    const TAG: &'static str;
    /// What the enum is called in errors.
    const EXPECTING: &'static str;
    /// Decodes the enum from its externally tagged form (the twin's
    /// derived decoder).
    fn externally_tagged<'de, D: Deserializer<'de>>(d: D) -> Result<Self, D::Error>;
}

/// Decodes an internally tagged enum `T` (see the module docs).
pub(crate) fn deserialize<'de, D: Deserializer<'de>, T: Tagged>(d: D) -> Result<T, D::Error> {
    let human = d.is_human_readable();
    d.deserialize_any(TaggedVisitor::<T> {
        human,
        t: PhantomData,
    })
}

struct TaggedVisitor<T> {
    human: bool,
    t: PhantomData<T>,
}

/// A map key: the tag, or another key (kept for the buffered form).
enum Key {
    Tag,
    Other(String),
}

struct KeySeed(&'static str);

impl<'de> DeserializeSeed<'de> for KeySeed {
    type Value = Key;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Key, D::Error> {
        d.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for KeySeed {
    type Value = Key;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a field name")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Key, E> {
        Ok(if v == self.0 {
            Key::Tag
        } else {
            Key::Other(v.to_owned())
        })
    }
    fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Key, E> {
        match std::str::from_utf8(v) {
            Ok(s) => self.visit_str(s),
            Err(_) => Ok(Key::Other(String::from_utf8_lossy(v).into_owned())),
        }
    }
}

impl<'de, T: Tagged> Visitor<'de> for TaggedVisitor<T> {
    type Value = T;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<T, A::Error> {
        match map.next_key_seed(KeySeed(T::TAG))? {
            None => Err(de::Error::missing_field(T::TAG)),
            Some(Key::Tag) => {
                let tag: String = map.next_value()?;
                T::externally_tagged(Variant {
                    tag,
                    rest: MapRest(map),
                })
            }
            Some(Key::Other(first)) => {
                if self.human {
                    buffered_json::<A, T>(first, map)
                } else {
                    buffered_msgpack::<A, T>(first, map)
                }
            }
        }
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<T, A::Error> {
        let tag: String = seq
            .next_element()?
            .ok_or_else(|| de::Error::missing_field(T::TAG))?;
        T::externally_tagged(Variant {
            tag,
            rest: SeqRest(seq),
        })
    }
}

/// Calls `field` with each key of a map whose tag was not first (`first`,
/// then the rest), leaving it to read the value; returns the tag's value.
fn rest_fields<'de, A: MapAccess<'de>>(
    first: String,
    map: &mut A,
    tag_name: &'static str,
    mut field: impl FnMut(String, &mut A) -> Result<(), A::Error>,
) -> Result<String, A::Error> {
    let mut tag = None;
    field(first, map)?;
    while let Some(key) = map.next_key_seed(KeySeed(tag_name))? {
        match key {
            Key::Tag => tag = Some(map.next_value::<String>()?),
            Key::Other(k) => field(k, map)?,
        }
    }
    tag.ok_or_else(|| de::Error::missing_field(tag_name))
}

/// The fields of a map whose tag was not first, as JSON text, then
/// decoded from that text.
fn buffered_json<'de, A: MapAccess<'de>, T: Tagged>(
    first: String,
    mut map: A,
) -> Result<T, A::Error> {
    let mut text = String::from("{");
    let tag = rest_fields(first, &mut map, T::TAG, |k, map| {
        if text.len() > 1 {
            text.push(',');
        }
        text.push_str(&serde_json::to_string(&k).map_err(de::Error::custom)?);
        text.push(':');
        text.push_str(map.next_value::<crate::transcript::Json>()?.as_str());
        Ok(())
    })?;
    text.push('}');
    let mut de = serde_json::Deserializer::from_str(&text);
    de.disable_recursion_limit();
    de::Deserializer::deserialize_map(&mut de, RestVisitor::<T>(tag, PhantomData))
        .map_err(de::Error::custom)
}

/// The fields of a map whose tag was not first, as MessagePack, then
/// decoded from those bytes.
fn buffered_msgpack<'de, A: MapAccess<'de>, T: Tagged>(
    first: String,
    mut map: A,
) -> Result<T, A::Error> {
    let mut body = Vec::new();
    let mut n: u64 = 0;
    let tag = rest_fields(first, &mut map, T::TAG, |k, map| {
        n += 1;
        let mut ser = rmp_serde::Serializer::new(&mut body);
        serde::Serialize::serialize(&k, &mut ser).map_err(de::Error::custom)?;
        map.next_value_seed(Transcode(&mut body))
    })?;
    let mut bytes = Vec::with_capacity(body.len() + 5);
    match n {
        0..=15 => bytes.push(0x80 | n as u8),
        16..=0xffff => {
            bytes.push(0xde);
            bytes.extend_from_slice(&(n as u16).to_be_bytes());
        }
        _ => {
            let n = u32::try_from(n).map_err(de::Error::custom)?;
            bytes.push(0xdf);
            bytes.extend_from_slice(&n.to_be_bytes());
        }
    }
    bytes.extend_from_slice(&body);
    drop(body);
    let mut de = rmp_serde::Deserializer::from_read_ref(&bytes);
    de::Deserializer::deserialize_map(&mut de, RestVisitor::<T>(tag, PhantomData))
        .map_err(de::Error::custom)
}

/// Re-encodes the next value as MessagePack into the buffer.
struct Transcode<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Transcode<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        let mut ser = rmp_serde::Serializer::new(self.0);
        serde_transcode::transcode(d, &mut ser).map_err(de::Error::custom)
    }
}

/// Decodes `T` from a buffered map whose tag was taken out.
struct RestVisitor<T>(String, PhantomData<T>);

impl<'de, T: Tagged> Visitor<'de> for RestVisitor<T> {
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(T::EXPECTING)
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
        T::externally_tagged(Variant {
            tag: self.0,
            rest: MapRest(map),
        })
    }
}

/// What follows the tag: the rest of a map or of a sequence.
trait Rest<'de>: Sized {
    type Error: de::Error;
    /// Hands the rest to a struct variant's visitor.
    fn visit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, Self::Error>;
    /// Skips the rest (a unit variant; serde ignores extra fields).
    fn drain(self) -> Result<(), Self::Error>;
}

struct MapRest<A>(A);
struct SeqRest<A>(A);

impl<'de, A: MapAccess<'de>> Rest<'de> for MapRest<A> {
    type Error = A::Error;
    fn visit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, A::Error> {
        v.visit_map(self.0)
    }
    fn drain(mut self) -> Result<(), A::Error> {
        while self.0.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

impl<'de, A: SeqAccess<'de>> Rest<'de> for SeqRest<A> {
    type Error = A::Error;
    fn visit<V: Visitor<'de>>(self, v: V) -> Result<V::Value, A::Error> {
        v.visit_seq(self.0)
    }
    fn drain(mut self) -> Result<(), A::Error> {
        while self.0.next_element::<IgnoredAny>()?.is_some() {}
        Ok(())
    }
}

/// The externally tagged view of a tagged value: the tag is the variant,
/// the rest its fields.
struct Variant<R> {
    tag: String,
    rest: R,
}

impl<'de, R: Rest<'de>> Deserializer<'de> for Variant<R> {
    type Error = R::Error;

    fn deserialize_any<V: Visitor<'de>>(self, v: V) -> Result<V::Value, R::Error> {
        v.visit_enum(self)
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, R::Error> {
        v.visit_enum(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map struct identifier ignored_any
    }
}

impl<'de, R: Rest<'de>> EnumAccess<'de> for Variant<R> {
    type Error = R::Error;
    type Variant = Fields<R>;

    fn variant_seed<S: DeserializeSeed<'de>>(
        self,
        seed: S,
    ) -> Result<(S::Value, Fields<R>), R::Error> {
        let d: de::value::StringDeserializer<R::Error> = self.tag.into_deserializer();
        Ok((seed.deserialize(d)?, Fields(self.rest)))
    }
}

/// A variant's fields: the rest of the tagged value.
struct Fields<R>(R);

impl<'de, R: Rest<'de>> VariantAccess<'de> for Fields<R> {
    type Error = R::Error;

    fn unit_variant(self) -> Result<(), Self::Error> {
        self.0.drain()
    }

    fn newtype_variant_seed<S: DeserializeSeed<'de>>(
        self,
        _seed: S,
    ) -> Result<S::Value, Self::Error> {
        Err(de::Error::custom("a tagged enum has no newtype variants"))
    }

    fn tuple_variant<V: Visitor<'de>>(self, _len: usize, _v: V) -> Result<V::Value, Self::Error> {
        Err(de::Error::custom("a tagged enum has no tuple variants"))
    }

    fn struct_variant<V: Visitor<'de>>(
        self,
        _fields: &'static [&'static str],
        v: V,
    ) -> Result<V::Value, Self::Error> {
        self.0.visit(v)
    }
}
