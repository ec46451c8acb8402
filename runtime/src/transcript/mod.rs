//! The transcript: a tree of entries with a persisted leaf.

pub mod entry;
pub mod tree;

pub use entry::{
    now_ms, ContentBlock, Entry, EntryId, EntryKind, InvalidEntryId, Message, StopReason, Usage,
};
pub use tree::{Transcript, TranscriptError};
