//! The in-memory transcript tree: every entry of a session plus its leaf.

use serde::{Deserialize, Serialize};

use super::entry::{Entry, EntryId};

/// A whole transcript held in memory: entries in append order and the
/// persisted leaf (the entry new entries attach to). This is what a fully
/// loaded `AgentState` carries; bounded views live in the working-set module.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Transcript {
    entries: Vec<Entry>,
    leaf: Option<EntryId>,
}

/// A transcript operation was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TranscriptError {
    #[error("entry {0} already exists in this transcript")]
    DuplicateEntry(EntryId),
    #[error("entry {0} is not in this transcript")]
    UnknownEntry(EntryId),
}

impl Transcript {
    pub fn new() -> Self {
        Self::default()
    }

    /// All entries in append order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The current leaf, `None` for an empty transcript (or after a move to
    /// before the first entry).
    pub fn leaf(&self) -> Option<&EntryId> {
        self.leaf.as_ref()
    }

    pub fn get(&self, id: &EntryId) -> Option<&Entry> {
        self.entries.iter().find(|e| &e.id == id)
    }

    pub fn contains(&self, id: &EntryId) -> bool {
        self.get(id).is_some()
    }

    /// Appends an entry and makes it the leaf. Its parent must be absent
    /// (a root) or already present; its id must be new.
    pub fn append(&mut self, entry: Entry) -> Result<(), TranscriptError> {
        if self.contains(&entry.id) {
            return Err(TranscriptError::DuplicateEntry(entry.id));
        }
        if let Some(p) = &entry.parent_id {
            if !self.contains(p) {
                return Err(TranscriptError::UnknownEntry(p.clone()));
            }
        }
        self.leaf = Some(entry.id.clone());
        self.entries.push(entry);
        Ok(())
    }

    /// Moves the leaf to an existing entry, or to `None` (before the root).
    pub fn set_leaf(&mut self, leaf: Option<EntryId>) -> Result<(), TranscriptError> {
        if let Some(id) = &leaf {
            if !self.contains(id) {
                return Err(TranscriptError::UnknownEntry(id.clone()));
            }
        }
        self.leaf = leaf;
        Ok(())
    }

    /// Replaces all entries and the leaf at once (used by rewrites and
    /// state clears). The caller guarantees the parent links are valid.
    pub fn replace_all(&mut self, entries: Vec<Entry>, leaf: Option<EntryId>) {
        self.entries = entries;
        self.leaf = leaf;
    }
}
