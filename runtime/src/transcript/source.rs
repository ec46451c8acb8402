//! [`EntrySource`]: the one read seam between the transcript logic and
//! whatever holds the entries (a [`Transcript`](super::Transcript) in
//! memory, a store's indexes). It only describes reads; nothing here
//! writes or caches.

use std::borrow::Cow;
use std::sync::Arc;

use super::entry::{Entry, EntryId};
use super::path_facts::PathFacts;
use super::resident::{entry_size, ChildLinks, CustomRef, EntryFacts};
use super::tree::{entry_summary, TREE_SUMMARY_CHARS_MAX};

/// Where a resident selection reads entries from.
pub trait EntrySource {
    type Error: std::error::Error + 'static;

    /// The entry with this id, `None` if absent.
    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, Self::Error>;

    /// Up to `limit` children of `id` in append order, and how many there
    /// are in all.
    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, Self::Error>;

    /// Facts of the entry, `None` if absent. The default loads the entry;
    /// a store should answer from an index.
    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, Self::Error> {
        Ok(self.entry(id)?.map(|e| EntryFacts::of(&e)))
    }

    /// [`entry_size`] of the entry, `None` if absent. The default encodes
    /// the entry; a store may keep the size in an index.
    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, Self::Error> {
        Ok(self.entry(id)?.map(|e| entry_size(&e)))
    }

    /// Stored [`PathFacts`] of the entry. `None` when the entry is absent
    /// or the source keeps no path facts (the default): callers then walk
    /// the root path ([`path_facts_by_walk`](crate::transcript::path_facts_by_walk)). A store answers from the
    /// facts it persisted at append time, which makes opening a leaf cost
    /// O(budget) instead of O(path).
    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, Self::Error> {
        let _ = id;
        Ok(None)
    }

    /// The ancestor-or-self of `from` at `depth` on its root path, when the
    /// source can answer it without walking (e.g. from an index of the
    /// active path). `None` (the default) means "not indexed": callers walk
    /// parents. A wrong answer is detected by callers (depth mismatch) and
    /// reported as [`ResidentError::Vanished`](crate::transcript::ResidentError::Vanished).
    fn ancestor_at_depth(
        &self,
        from: &EntryId,
        depth: u64,
    ) -> Result<Option<EntryId>, Self::Error> {
        let _ = (from, depth);
        Ok(None)
    }

    /// The ids and [`entry_size`]s of the entries at depths
    /// `start..=end` of the root path of `leaf` (at depth `leaf_depth`),
    /// root first, when the source can answer them in one range read (an
    /// index of the active path holding `leaf`); loading those entries
    /// next is then expected to be cheap. The answer may stop early, after
    /// the first entry that takes the sizes' sum past `bytes_max` (a page
    /// of `bytes_max` bytes cannot hold more). `None` (the default):
    /// callers walk parents ([`EntrySource::ancestor_at_depth`], facts,
    /// sizes).
    fn path_range(
        &self,
        leaf: &EntryId,
        leaf_depth: u64,
        start: u64,
        end: u64,
        bytes_max: u64,
    ) -> Result<Option<Vec<(EntryId, u64)>>, Self::Error> {
        let _ = (leaf, leaf_depth, start, end, bytes_max);
        Ok(None)
    }

    /// Whether the transcript is one unbranched chain ending at `leaf`:
    /// its entries are exactly the `path_entries` entries of the root path
    /// of `leaf`. Then every entry of that path has the next one as its
    /// only child and the leaf has none, so a resident selection builds
    /// their navigation links without asking [`EntrySource::children`].
    /// `None` (the default): unknown, callers ask for the children. A
    /// store answers from counters it keeps (one lookup), never by walking.
    fn single_chain(&self, leaf: &EntryId, path_entries: u64) -> Result<Option<bool>, Self::Error> {
        let _ = (leaf, path_entries);
        Ok(None)
    }

    /// [`EntrySource::entry`] as a shared value. The default wraps a copy
    /// of the entry; a source that keeps decoded entries shared (a cache)
    /// hands out its own `Arc`, so a resident selection holding the entry
    /// neither copies nor later frees its payload.
    fn shared_entry(&self, id: &EntryId) -> Result<Option<Arc<Entry>>, Self::Error> {
        Ok(self.entry(id)?.map(|e| Arc::new(e.into_owned())))
    }

    /// Up to `limit` custom entries (kind `custom`) with `custom_type`
    /// (any type when `None`) whose append sequence number is greater than
    /// `after_seq` (all when `None`), in append order, duplicates included.
    /// `None` (the default) means the source cannot answer: custom-entry
    /// pages then fail with [`ReadError::Unsupported`](super::history::ReadError::Unsupported),
    /// never with an empty page.
    fn custom_entries_after(
        &self,
        custom_type: Option<&str>,
        after_seq: Option<u64>,
        limit: usize,
    ) -> Result<Option<Vec<CustomRef>>, Self::Error> {
        let _ = (custom_type, after_seq, limit);
        Ok(None)
    }

    /// The resolved label of the entry (last label entry wins). The
    /// default knows no labels.
    fn label(&self, id: &EntryId) -> Result<Option<String>, Self::Error> {
        let _ = id;
        Ok(None)
    }

    /// A one-line display summary of the entry ([`entry_summary`] with
    /// [`TREE_SUMMARY_CHARS_MAX`]), `None` if absent. The default loads the
    /// entry; a store may keep summaries in an index.
    fn summary(&self, id: &EntryId) -> Result<Option<String>, Self::Error> {
        Ok(self
            .entry(id)?
            .map(|e| entry_summary(&e, TREE_SUMMARY_CHARS_MAX).0))
    }
}
