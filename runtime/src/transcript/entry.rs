//! Transcript entries: the nodes of a session's conversation tree.
//!
//! Every entry has an id, an optional parent id (the root has none), a
//! timestamp in milliseconds since the Unix epoch, and a kind. Entries are
//! immutable once appended; rewrites produce a new transcript generation.
//!
//! The kinds follow the well-known session-tree design used by coding agents
//! (pi-style session files): messages, custom entries (plugin state that is
//! stored but never sent to a model), custom messages (sent to a model),
//! branch summaries, compactions, resets, model and thinking-level changes,
//! labels and session info.

use serde::{Deserialize, Serialize};

use super::Json;

/// Maximum length of an entry id in bytes.
pub const ENTRY_ID_LEN_MAX: usize = 128;

/// The bytes an id may hold: ASCII letters, digits, `_` and `-`.
const ID_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric() || b == b'_' || b == b'-';
        c += 1;
    }
    t
};

/// Ids of up to this many bytes are stored inline in the [`EntryId`]
/// value (no heap allocation; a clone is a copy). 22 bytes, the length
/// and the variant tag fill the 24 bytes a `String` took before, so the
/// id grew no larger. Longer ids (imported UUIDs, for instance) are kept
/// in a shared `Arc<str>`, so their clones do not allocate either.
const INLINE_LEN_MAX: usize = 22;

/// The id of a transcript entry: 1..=128 bytes of ASCII letters, digits,
/// `_` or `-`. Generated ids are 8 random lowercase hex characters
/// ([`EntryId::generate`]), like pi-style session files; imported ids are
/// kept as they are if they validate.
///
/// Equality, ordering and hashing are those of the id's string (ordering
/// is byte order, as `str`'s), and it serializes as that string.
#[derive(Clone)]
pub struct EntryId(Repr);

/// How an [`EntryId`]'s bytes are held. One form per length (an id of at
/// most [`INLINE_LEN_MAX`] bytes is always `Inline`, with zeroed bytes
/// after `len`), so equal ids have equal representations; comparisons
/// still go through the bytes.
///
/// The inline bytes are always a whole `&str` or ASCII bytes copied
/// verbatim (every constructor takes one or the other), so they are valid
/// UTF-8; [`EntryId::as_str`]
/// checks that again with `std::str::from_utf8` rather than assuming it
/// (no `unsafe` outside mmap). For ids of at most 22 bytes that check is a
/// short loop, and the hot comparisons (`Eq`, `Ord`) and `Hash` use the
/// bytes and skip it.
#[derive(Clone)]
enum Repr {
    Inline {
        len: u8,
        bytes: [u8; INLINE_LEN_MAX],
    },
    Shared(std::sync::Arc<str>),
}

std::thread_local! {
    /// The state of this thread's id generator (`None` until first use).
    static ID_STATE: std::cell::Cell<Option<u64>> = const { std::cell::Cell::new(None) };
}

/// 32 random bits for [`EntryId::generate`]: SplitMix64 over a per-thread
/// state seeded from a random UUID on the thread's first id.
fn id_bits() -> u32 {
    ID_STATE.with(|state| {
        let seed = state
            .get()
            .unwrap_or_else(|| uuid::Uuid::new_v4().as_u64_pair().0);
        let x = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        state.set(Some(x));
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        (z >> 32) as u32
    })
}

impl EntryId {
    /// A fresh random id (8 lowercase hex characters).
    ///
    /// The bits come from a per-thread generator seeded once from the
    /// operating system's randomness (a random UUID), not from a system
    /// call per id: the `getrandom` call was a visible part of an append.
    /// Ids need not be unpredictable, only unlikely to repeat, and a
    /// writer checks every generated id against the session's entries
    /// before using it (32 bits collide within a long session).
    pub fn generate() -> Self {
        const HEX: &[u8; 16] = b"0123456789abcdef";
        let bits = id_bits();
        let mut buf = [0u8; 8];
        for (i, b) in buf.iter_mut().enumerate() {
            let nibble = (bits >> (28 - 4 * i)) & 0xf;
            *b = HEX[nibble as usize];
        }
        // Hex digits are ASCII: the fallback is never taken.
        EntryId::from_decoded_str(std::str::from_utf8(&buf).unwrap_or("00000000"))
    }

    /// Validates and wraps an id.
    pub fn parse(s: &str) -> Result<Self, InvalidEntryId> {
        EntryId::parse_bytes(s.as_bytes())
    }

    /// [`EntryId::parse`] of a string's bytes: a valid id is ASCII, so
    /// the bytes are checked for the id's alphabet alone, without a
    /// separate UTF-8 check (index keys and links hold ids as bytes).
    pub fn parse_bytes(b: &[u8]) -> Result<Self, InvalidEntryId> {
        if b.is_empty() || b.len() > ENTRY_ID_LEN_MAX {
            return Err(InvalidEntryId {
                reason: "length must be 1..=128 bytes",
            });
        }
        // One table lookup per byte (ids are read back from index keys,
        // path links and records many times per page).
        if !b.iter().all(|&c| ID_BYTE[usize::from(c)]) {
            return Err(InvalidEntryId {
                reason: "only ASCII letters, digits, '_' and '-' are allowed",
            });
        }
        // Checked: ASCII, so copied inline without a second check.
        Ok(match Repr::inline(b) {
            Some(inline) => EntryId(inline),
            None => {
                EntryId::from_decoded_str(std::str::from_utf8(b).map_err(|_| InvalidEntryId {
                    reason: "only ASCII letters, digits, '_' and '-' are allowed",
                })?)
            }
        })
    }

    pub fn as_str(&self) -> &str {
        match &self.0 {
            Repr::Inline { .. } => match std::str::from_utf8(self.as_bytes()) {
                Ok(s) => s,
                // Unreachable: the bytes were copied from a whole `str` or
                // from ASCII bytes.
                Err(_) => {
                    debug_assert!(false, "inline entry id is not UTF-8");
                    ""
                }
            },
            Repr::Shared(s) => s,
        }
    }

    /// The id's bytes (its string's), without [`EntryId::as_str`]'s UTF-8
    /// check: index keys and records hold ids as bytes, and that check
    /// would run several times per append.
    pub fn as_bytes(&self) -> &[u8] {
        match &self.0 {
            Repr::Inline { len, bytes } => bytes.get(..usize::from(*len)).unwrap_or(bytes),
            Repr::Shared(s) => s.as_bytes(),
        }
    }

    /// An id exactly as serde decodes one (`#[serde(transparent)]`: not
    /// validated), for decoders that must give serde's answer.
    pub(crate) fn from_decoded(s: String) -> Self {
        if s.len() <= INLINE_LEN_MAX {
            EntryId::from_decoded_str(&s)
        } else {
            EntryId(Repr::Shared(std::sync::Arc::from(s)))
        }
    }

    /// [`EntryId::from_decoded_str`] of ASCII bytes (`None` when they are
    /// not ASCII): a short id is copied inline without a UTF-8 check, as
    /// ASCII is UTF-8; a longer one is checked on its way into an `Arc<str>`.
    pub(crate) fn from_decoded_ascii(b: &[u8]) -> Option<Self> {
        if !b.is_ascii() {
            return None;
        }
        match Repr::inline(b) {
            Some(inline) => Some(EntryId(inline)),
            None => std::str::from_utf8(b).ok().map(EntryId::from_decoded_str),
        }
    }

    /// [`EntryId::from_decoded`] from borrowed bytes: an id of at most
    /// [`INLINE_LEN_MAX`] bytes is copied inline, without allocating.
    pub(crate) fn from_decoded_str(s: &str) -> Self {
        EntryId(Repr::inline(s.as_bytes()).unwrap_or_else(|| Repr::Shared(std::sync::Arc::from(s))))
    }
}

impl Repr {
    /// `b` copied inline, `None` when it is longer than [`INLINE_LEN_MAX`].
    /// Callers pass a whole `str`'s bytes or ASCII bytes (see the type).
    fn inline(b: &[u8]) -> Option<Repr> {
        let len = u8::try_from(b.len())
            .ok()
            .filter(|_| b.len() <= INLINE_LEN_MAX)?;
        let mut bytes = [0u8; INLINE_LEN_MAX];
        bytes.get_mut(..b.len())?.copy_from_slice(b);
        Some(Repr::Inline { len, bytes })
    }
}

impl PartialEq for EntryId {
    fn eq(&self, other: &Self) -> bool {
        self.as_bytes() == other.as_bytes()
    }
}

impl Eq for EntryId {}

impl PartialOrd for EntryId {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for EntryId {
    /// Byte order, which is `str`'s order.
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.as_bytes().cmp(other.as_bytes())
    }
}

impl std::hash::Hash for EntryId {
    /// The bytes `str`'s hash writes for the id's string.
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        // What `str`'s hash writes (its bytes, then 0xff), from the bytes:
        // `as_str` would check an inline id's UTF-8 on every hash.
        state.write(self.as_bytes());
        state.write_u8(0xff);
    }
}

impl std::fmt::Debug for EntryId {
    /// `EntryId("…")`, as the derived form over a `String` printed it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("EntryId").field(&self.as_str()).finish()
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for EntryId {
    /// As a string (the `#[serde(transparent)]` `String` form).
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for EntryId {
    /// What a `String` accepts (not validated, like the
    /// `#[serde(transparent)]` form): a string, borrowed or owned, or
    /// bytes that are UTF-8. A borrowed short string is copied inline
    /// without an intermediate `String`.
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_string(IdVisitor)
    }
}

/// The visitor of [`EntryId`]'s `Deserialize`: `String`'s visitor, with
/// its error messages, building an id instead.
struct IdVisitor;

impl<'de> serde::de::Visitor<'de> for IdVisitor {
    type Value = EntryId;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a string")
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<EntryId, E> {
        Ok(EntryId::from_decoded_str(v))
    }

    fn visit_string<E: serde::de::Error>(self, v: String) -> Result<EntryId, E> {
        Ok(EntryId::from_decoded(v))
    }

    fn visit_bytes<E: serde::de::Error>(self, v: &[u8]) -> Result<EntryId, E> {
        match std::str::from_utf8(v) {
            Ok(s) => Ok(EntryId::from_decoded_str(s)),
            Err(_) => Err(E::invalid_value(serde::de::Unexpected::Bytes(v), &self)),
        }
    }

    fn visit_byte_buf<E: serde::de::Error>(self, v: Vec<u8>) -> Result<EntryId, E> {
        match String::from_utf8(v) {
            Ok(s) => Ok(EntryId::from_decoded(s)),
            Err(e) => Err(E::invalid_value(
                serde::de::Unexpected::Bytes(&e.into_bytes()),
                &self,
            )),
        }
    }
}

/// An entry id failed validation.
#[derive(Debug, Clone, thiserror::Error)]
#[error("invalid entry id: {reason}")]
#[non_exhaustive]
pub struct InvalidEntryId {
    pub reason: &'static str,
}

/// One node of the transcript tree.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub id: EntryId,
    pub parent_id: Option<EntryId>,
    /// Milliseconds since the Unix epoch.
    pub timestamp_ms: i64,
    pub kind: EntryKind,
}

/// What an entry is.
///
/// Decoded without buffering (see the `tagged` module); the twin
/// `EntryKindDe` below lists the same variants.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum EntryKind {
    /// A conversation message (user, assistant, tool result).
    Message {
        message: Message,
    },
    /// Plugin state: stored and read back byte-exact, never sent to a model.
    Custom {
        custom_type: String,
        data: Json,
    },
    /// A message injected by a plugin; it is sent to the model.
    CustomMessage {
        custom_type: String,
        content: Vec<ContentBlock>,
        /// Whether a user interface shows it.
        display: bool,
        details: Option<Json>,
    },
    /// A summary of a branch that was left, placed where the new branch starts.
    BranchSummary {
        /// The leaf of the branch being summarized.
        from_id: Option<EntryId>,
        summary: String,
    },
    /// Context compaction: the model sees `summary`, then the path from
    /// `first_kept_entry_id` on.
    Compaction {
        summary: String,
        first_kept_entry_id: EntryId,
        tokens_before: u64,
    },
    /// A hard cut: the model sees nothing before this entry.
    Reset,
    ModelChange {
        provider: String,
        model_id: String,
    },
    ThinkingLevelChange {
        thinking_level: String,
    },
    /// Sets (or, with `None`, clears) the label of `target_id`. Last wins.
    /// Labels never enter the model context.
    Label {
        target_id: EntryId,
        label: Option<String>,
    },
    /// Session metadata such as a display name.
    SessionInfo {
        name: Option<String>,
    },
}

/// A conversation message.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "role", rename_all = "snake_case")]
#[non_exhaustive]
pub enum Message {
    User {
        content: Vec<ContentBlock>,
    },
    Assistant {
        content: Vec<ContentBlock>,
        stop_reason: StopReason,
        usage: Usage,
        /// `provider/model` that produced it, when known.
        model: Option<String>,
        /// Error text when `stop_reason` is `Error`.
        error_message: Option<String>,
    },
    ToolResult {
        tool_call_id: String,
        tool_name: String,
        content: Vec<ContentBlock>,
        is_error: bool,
    },
}

/// One block of message content.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
        /// The provider's signature over the thinking (opaque): a provider
        /// that signs its thinking refuses a replayed block without it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
        /// The provider redacted the thinking: `thinking` is empty or a
        /// placeholder and `signature` holds the encrypted payload.
        #[serde(default, skip_serializing_if = "is_false")]
        redacted: bool,
    },
    ToolCall {
        id: String,
        name: String,
        arguments: Json,
        /// Provider data tied to the call (opaque), e.g. the thought
        /// signature a provider asks to be sent back with it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signature: Option<String>,
    },
    Image {
        mime_type: String,
        /// Base64 data.
        data: String,
    },
}

/// Why an assistant message ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[non_exhaustive]
pub enum StopReason {
    Stop,
    Length,
    ToolUse,
    Error,
    Aborted,
}

/// Token usage of one assistant message.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    pub cache_read_tokens: u64,
    pub cache_write_tokens: u64,
}

impl Usage {
    pub fn total(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.output_tokens)
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }

    pub fn add(&mut self, other: &Usage) {
        self.input_tokens = self.input_tokens.saturating_add(other.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(other.output_tokens);
        self.cache_read_tokens = self
            .cache_read_tokens
            .saturating_add(other.cache_read_tokens);
        self.cache_write_tokens = self
            .cache_write_tokens
            .saturating_add(other.cache_write_tokens);
    }
}

// The externally tagged twins of the tagged enums above: the same
// variants and fields (the compiler checks them against the enums), each
// decoding the fields that follow the tag (see the `tagged` module).

#[derive(Deserialize)]
#[serde(remote = "EntryKind", rename_all = "snake_case")]
enum EntryKindDe {
    Message {
        message: Message,
    },
    Custom {
        custom_type: String,
        data: Json,
    },
    CustomMessage {
        custom_type: String,
        content: Vec<ContentBlock>,
        display: bool,
        details: Option<Json>,
    },
    BranchSummary {
        from_id: Option<EntryId>,
        summary: String,
    },
    Compaction {
        summary: String,
        first_kept_entry_id: EntryId,
        tokens_before: u64,
    },
    Reset,
    ModelChange {
        provider: String,
        model_id: String,
    },
    ThinkingLevelChange {
        thinking_level: String,
    },
    Label {
        target_id: EntryId,
        label: Option<String>,
    },
    SessionInfo {
        name: Option<String>,
    },
}

#[derive(Deserialize)]
#[serde(remote = "Message", rename_all = "snake_case")]
enum MessageDe {
    User {
        content: Vec<ContentBlock>,
    },
    Assistant {
        content: Vec<ContentBlock>,
        stop_reason: StopReason,
        usage: Usage,
        model: Option<String>,
        error_message: Option<String>,
    },
    ToolResult {
        tool_call_id: String,
        tool_name: String,
        content: Vec<ContentBlock>,
        is_error: bool,
    },
}

#[derive(Deserialize)]
#[serde(remote = "ContentBlock", rename_all = "snake_case")]
enum ContentBlockDe {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
        #[serde(default)]
        signature: Option<String>,
        #[serde(default)]
        redacted: bool,
    },
    ToolCall {
        id: String,
        name: String,
        arguments: Json,
        #[serde(default)]
        signature: Option<String>,
    },
    Image {
        mime_type: String,
        data: String,
    },
}

/// Decodes the tagged enum `$ty` through its twin `$twin` (see the
/// `tagged` module).
macro_rules! tagged_by {
    ($ty:ty, $twin:ty, $tag:literal, $expecting:literal) => {
        impl $crate::transcript::tagged::Tagged for $ty {
            const TAG: &'static str = $tag;
            const EXPECTING: &'static str = $expecting;
            fn externally_tagged<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                <$twin>::deserialize(d)
            }
        }

        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                $crate::transcript::tagged::deserialize(d)
            }
        }
    };
}
pub(crate) use tagged_by;

tagged_by!(
    EntryKind,
    EntryKindDe,
    "type",
    "an entry kind tagged by `type`"
);
tagged_by!(Message, MessageDe, "role", "a message tagged by `role`");
tagged_by!(
    ContentBlock,
    ContentBlockDe,
    "type",
    "a content block tagged by `type`"
);

fn is_false(b: &bool) -> bool {
    !*b
}

impl ContentBlock {
    pub fn text(s: impl Into<String>) -> Self {
        ContentBlock::Text { text: s.into() }
    }

    /// An unsigned thinking block.
    pub fn thinking(s: impl Into<String>) -> Self {
        ContentBlock::Thinking {
            thinking: s.into(),
            signature: None,
            redacted: false,
        }
    }

    /// A tool call without provider data.
    pub fn tool_call(
        id: impl Into<String>,
        name: impl Into<String>,
        arguments: impl Into<Json>,
    ) -> Self {
        ContentBlock::ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
            signature: None,
        }
    }
}

impl Entry {
    /// A new entry with a generated id and the current time.
    pub fn new(parent_id: Option<EntryId>, kind: EntryKind) -> Self {
        Entry {
            id: EntryId::generate(),
            parent_id,
            timestamp_ms: now_ms(),
            kind,
        }
    }

    /// The entry's kind as a short stable name (`message`, `custom`, ...).
    pub fn kind_name(&self) -> &'static str {
        match &self.kind {
            EntryKind::Message { .. } => "message",
            EntryKind::Custom { .. } => "custom",
            EntryKind::CustomMessage { .. } => "custom_message",
            EntryKind::BranchSummary { .. } => "branch_summary",
            EntryKind::Compaction { .. } => "compaction",
            EntryKind::Reset => "reset",
            EntryKind::ModelChange { .. } => "model_change",
            EntryKind::ThinkingLevelChange { .. } => "thinking_level_change",
            EntryKind::Label { .. } => "label",
            EntryKind::SessionInfo { .. } => "session_info",
        }
    }
}

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

/// The target and resolved label of a label entry (an empty label
/// clears it: `None`); `None` for any other entry.
pub(crate) fn label_value(entry: &Entry) -> Option<(EntryId, Option<String>)> {
    match &entry.kind {
        EntryKind::Label { target_id, label } => {
            Some((target_id.clone(), label.clone().filter(|l| !l.is_empty())))
        }
        _ => None,
    }
}

/// The custom type of a custom entry; `None` for any other entry.
pub(crate) fn custom_type(entry: &Entry) -> Option<&str> {
    match &entry.kind {
        EntryKind::Custom { custom_type, .. } => Some(custom_type),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    /// An id of `len` valid bytes (letters cycling).
    fn id_of(len: usize) -> String {
        (0..len)
            .map(|i| char::from(b'a' + (i % 26) as u8))
            .collect()
    }

    /// Whether `id` and `s` hash alike under the same (random) keys.
    fn same_hash(id: &EntryId, s: &str) -> bool {
        let keys = std::collections::hash_map::RandomState::new();
        keys.hash_one(id) == keys.hash_one(s)
    }

    #[test]
    fn entry_id_stays_the_size_of_a_string() {
        assert_eq!(std::mem::size_of::<EntryId>(), 24);
        assert_eq!(std::mem::size_of::<Option<EntryId>>(), 24);
    }

    /// `parse_bytes` of a string's bytes answers what `parse` answers,
    /// across the inline boundary and for every kind of refusal; bytes
    /// that are not UTF-8 are refused.
    #[test]
    fn parse_bytes_agrees_with_parse() {
        let mut cases: Vec<String> = [0, 1, INLINE_LEN_MAX, INLINE_LEN_MAX + 1]
            .into_iter()
            .chain([ENTRY_ID_LEN_MAX, ENTRY_ID_LEN_MAX + 1])
            .map(id_of)
            .collect();
        cases.extend(["a-b_C9", "a b", "a.b", "\u{e9}", "x\u{e9}y", "-", "_"].map(String::from));
        for s in &cases {
            let bytes = EntryId::parse_bytes(s.as_bytes()).map_err(|e| e.to_string());
            let parsed = EntryId::parse(s).map_err(|e| e.to_string());
            assert_eq!(bytes, parsed, "{s:?}");
            if let Ok(id) = bytes {
                assert_eq!(id.as_str(), s);
                assert!(matches!(id.0, Repr::Inline { .. }) == (s.len() <= INLINE_LEN_MAX));
            }
        }
        for bad in [&[0xffu8][..], &[b'a', 0xc3], &[0xc3, 0xa9]] {
            assert!(EntryId::parse_bytes(bad).is_err(), "{bad:?}");
        }
    }

    /// The alphabet table against its definition: every byte value, at the
    /// start, middle and end of an inline and of a shared id.
    #[test]
    fn parse_bytes_accepts_exactly_letters_digits_underscore_and_dash() {
        for c in 0..=255u8 {
            let allowed = c.is_ascii_alphanumeric() || c == b'_' || c == b'-';
            for len in [1, 3, INLINE_LEN_MAX, INLINE_LEN_MAX + 5] {
                for at in [0, len / 2, len - 1] {
                    let mut b = vec![b'a'; len];
                    b[at] = c;
                    let got = EntryId::parse_bytes(&b);
                    assert_eq!(got.is_ok(), allowed, "byte {c:#04x} at {at} of {len}");
                    if let Ok(id) = got {
                        assert_eq!(id.as_bytes(), &b[..]);
                    }
                }
            }
        }
    }

    #[test]
    fn entry_id_round_trips_across_the_inline_boundary() {
        for len in [1, 8, INLINE_LEN_MAX, INLINE_LEN_MAX + 1, ENTRY_ID_LEN_MAX] {
            let s = id_of(len);
            let id = EntryId::parse(&s).unwrap();
            assert_eq!(id.as_str(), s);
            assert_eq!(id.to_string(), s);
            assert_eq!(format!("{id:?}"), format!("EntryId({s:?})"));
            assert!(matches!(id.0, Repr::Inline { .. }) == (len <= INLINE_LEN_MAX));

            // JSON and MessagePack bytes are those of the string.
            let json = serde_json::to_vec(&id).unwrap();
            assert_eq!(json, serde_json::to_vec(&s).unwrap());
            assert_eq!(serde_json::from_slice::<EntryId>(&json).unwrap(), id);
            // Owned (escaped) and reader-fed JSON strings too.
            let escaped = format!("\"\\u00{:02x}{}\"", s.as_bytes()[0], &s[1..]);
            assert_eq!(serde_json::from_str::<EntryId>(&escaped).unwrap(), id);
            assert_eq!(
                serde_json::from_reader::<_, EntryId>(&json[..]).unwrap(),
                id
            );
            let value = serde_json::to_value(&id).unwrap();
            assert_eq!(value, serde_json::Value::String(s.clone()));
            assert_eq!(serde_json::from_value::<EntryId>(value).unwrap(), id);

            let mp = rmp_serde::to_vec(&id).unwrap();
            assert_eq!(mp, rmp_serde::to_vec(&s).unwrap());
            assert_eq!(rmp_serde::from_slice::<EntryId>(&mp).unwrap(), id);
            assert_eq!(rmp_serde::from_read::<_, EntryId>(&mp[..]).unwrap(), id);
            let named = rmp_serde::to_vec_named(&id).unwrap();
            assert_eq!(named, rmp_serde::to_vec_named(&s).unwrap());

            // Inside an entry (serde's derived struct).
            let entry = Entry {
                id: id.clone(),
                parent_id: Some(id.clone()),
                timestamp_ms: 1,
                kind: EntryKind::Reset,
            };
            let back: Entry =
                rmp_serde::from_slice(&rmp_serde::to_vec_named(&entry).unwrap()).unwrap();
            assert_eq!(back, entry);
            let back: Entry =
                serde_json::from_str(&serde_json::to_string(&entry).unwrap()).unwrap();
            assert_eq!(back, entry);
        }
    }

    #[test]
    fn entry_id_decodes_what_a_string_decodes() {
        // Unvalidated, as `#[serde(transparent)] String` decoded: long,
        // empty and non-ASCII ids come through, short and long.
        let long = "é".repeat(200);
        for s in ["", "a b", "ü", long.as_str(), &long[..INLINE_LEN_MAX]] {
            let json = serde_json::to_string(s).unwrap();
            let id: EntryId = serde_json::from_str(&json).unwrap();
            assert_eq!(id.as_str(), s);
            assert_eq!(serde_json::to_string(&id).unwrap(), json);
            let mp = rmp_serde::to_vec(s).unwrap();
            let id: EntryId = rmp_serde::from_slice(&mp).unwrap();
            assert_eq!(id.as_str(), s);
            assert_eq!(rmp_serde::to_vec(&id).unwrap(), mp);
            assert_eq!(EntryId::from_decoded(s.to_owned()), id);
            assert_eq!(EntryId::from_decoded_str(s), id);
        }
        // Which `parse` refuses.
        assert!(EntryId::parse(&long).is_err());

        // MessagePack bin holding UTF-8 is a string to serde; other bytes
        // and other types are errors with a string's message.
        let bin = rmp_serde::to_vec(&serde_bytes_like(b"abc")).unwrap();
        assert_eq!(
            rmp_serde::from_slice::<EntryId>(&bin).unwrap().as_str(),
            "abc"
        );
        let bad = rmp_serde::to_vec(&serde_bytes_like(&[0xff, 0xfe])).unwrap();
        let (a, b) = (
            rmp_serde::from_slice::<EntryId>(&bad)
                .unwrap_err()
                .to_string(),
            rmp_serde::from_slice::<String>(&bad)
                .unwrap_err()
                .to_string(),
        );
        assert_eq!(a, b);
        let (a, b) = (
            serde_json::from_str::<EntryId>("5")
                .unwrap_err()
                .to_string(),
            serde_json::from_str::<String>("5").unwrap_err().to_string(),
        );
        assert_eq!(a, b);
    }

    /// Bytes serialized as MessagePack `bin`.
    fn serde_bytes_like(b: &[u8]) -> impl Serialize + '_ {
        struct Bin<'a>(&'a [u8]);
        impl Serialize for Bin<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_bytes(self.0)
            }
        }
        Bin(b)
    }

    #[test]
    fn the_id_generator_is_splitmix64() {
        // SplitMix64 from state 0 yields 0xe220a8397b1dcdaf first and
        // 0x6e789e6aa1b965f4 second (the reference sequence); an id is the
        // high 32 bits of one output.
        ID_STATE.with(|s| s.set(Some(0)));
        assert_eq!(EntryId::generate().as_str(), "e220a839");
        assert_eq!(EntryId::generate().as_str(), "6e789e6a");
        // A fresh thread seeds its own state from the OS.
        let other = std::thread::spawn(|| {
            ID_STATE.with(|s| assert!(s.get().is_none()));
            EntryId::generate();
            ID_STATE.with(|s| s.get())
        })
        .join()
        .unwrap();
        assert!(other.is_some());
    }

    #[test]
    fn generated_ids_are_eight_hex_characters() {
        let id = EntryId::generate();
        assert_eq!(id.as_str().len(), 8);
        assert!(id.as_str().bytes().all(|b| b.is_ascii_hexdigit()));
        assert!(EntryId::parse(id.as_str()).is_ok());
        assert_ne!(EntryId::generate(), EntryId::generate());
    }

    #[test]
    fn hash_is_the_hash_of_the_str() {
        for len in [1, INLINE_LEN_MAX, INLINE_LEN_MAX + 1, ENTRY_ID_LEN_MAX] {
            let s = id_of(len);
            assert!(same_hash(&EntryId::parse(&s).unwrap(), &s));
        }
        // Distinct ids hash apart (a hash that ignored its input would
        // pass the equality check above).
        let keys = std::collections::hash_map::RandomState::new();
        assert_ne!(
            keys.hash_one(EntryId::parse("a").unwrap()),
            keys.hash_one(EntryId::parse("b").unwrap())
        );
    }

    proptest::proptest! {
        #![proptest_config(proptest::test_runner::Config {
            cases: 512,
            failure_persistence: None,
            // Deterministic: this seed reproduces any failure.
            rng_algorithm: proptest::test_runner::RngAlgorithm::ChaCha,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x1d_5eed),
            ..proptest::test_runner::Config::default()
        })]

        /// Order, equality and hashing are `str`'s, on both sides of the
        /// inline limit (lengths 1..=40 straddle it; a shared prefix makes
        /// the comparisons reach the tails).
        #[test]
        fn ids_compare_and_hash_as_their_strings(
            a in "[A-Za-z0-9_-]{1,40}",
            b in "[A-Za-z0-9_-]{1,40}",
            prefix in "[a-c]{0,24}",
        ) {
            for (x, y) in [(a.clone(), b.clone()), (format!("{prefix}{a}"), format!("{prefix}{b}"))] {
                let x = if x.len() > ENTRY_ID_LEN_MAX { x[..ENTRY_ID_LEN_MAX].to_owned() } else { x };
                let y = if y.len() > ENTRY_ID_LEN_MAX { y[..ENTRY_ID_LEN_MAX].to_owned() } else { y };
                let (ix, iy) = (EntryId::parse(&x).unwrap(), EntryId::parse(&y).unwrap());
                proptest::prop_assert_eq!(ix.cmp(&iy), x.cmp(&y));
                proptest::prop_assert_eq!(ix.partial_cmp(&iy), x.partial_cmp(&y));
                proptest::prop_assert_eq!(ix == iy, x == y);
                proptest::prop_assert!(same_hash(&ix, &x));
                proptest::prop_assert_eq!(ix.clone(), ix.clone());
                proptest::prop_assert_eq!(ix.as_str(), x.as_str());
            }
        }
    }
}
