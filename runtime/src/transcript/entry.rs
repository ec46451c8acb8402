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

/// Maximum length of an entry id in bytes.
pub const ENTRY_ID_LEN_MAX: usize = 128;

/// The id of a transcript entry: 1..=128 bytes of ASCII letters, digits,
/// `_` or `-`. Generated ids are 8 lowercase hex characters taken from a
/// random UUID, like pi-style session files; imported ids are kept as they
/// are if they validate.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct EntryId(String);

impl EntryId {
    /// A fresh random id (8 hex characters).
    pub fn generate() -> Self {
        let u = uuid::Uuid::new_v4().simple().to_string();
        EntryId(u[..8].to_string())
    }

    /// Validates and wraps an id.
    pub fn parse(s: &str) -> Result<Self, InvalidEntryId> {
        if s.is_empty() || s.len() > ENTRY_ID_LEN_MAX {
            return Err(InvalidEntryId {
                reason: "length must be 1..=128 bytes",
            });
        }
        if !s
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
        {
            return Err(InvalidEntryId {
                reason: "only ASCII letters, digits, '_' and '-' are allowed",
            });
        }
        Ok(EntryId(s.to_string()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// An id exactly as serde decodes one (`#[serde(transparent)]`: not
    /// validated), for decoders that must give serde's answer.
    pub(crate) fn from_decoded(s: String) -> Self {
        EntryId(s)
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
        data: serde_json::Value,
    },
    /// A message injected by a plugin; it is sent to the model.
    CustomMessage {
        custom_type: String,
        content: Vec<ContentBlock>,
        /// Whether a user interface shows it.
        display: bool,
        details: Option<serde_json::Value>,
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
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
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
#[non_exhaustive]
pub enum ContentBlock {
    Text {
        text: String,
    },
    Thinking {
        thinking: String,
    },
    ToolCall {
        id: String,
        name: String,
        arguments: serde_json::Value,
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

impl ContentBlock {
    pub fn text(s: impl Into<String>) -> Self {
        ContentBlock::Text { text: s.into() }
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
