//! The transcript index of the log store (engine indexer `transcript`),
//! split by concern: [`keys`] and [`record`] (the key layout and the
//! values), [`seed_table`], [`path_blocks`], [`child_counts`], the
//! [`TranscriptIndexer`] that writes them, the [`LogTranscriptSource`] that
//! reads through them, and the read [`accelerators`].
//!
//! # The index
//!
//! Maintained from the log by [`TranscriptIndexer`] in the same memtable
//! (and move into sled) as the engine's own indexes, and rebuilt from the log like
//! them (deleting `DIR/index/` loses nothing). Every key starts with a tag
//! byte, the session id's length (u8) and the session id; the keys (the
//! [`TranscriptMeta`], [`EntryRecord`]s, the seed table, child links and
//! counts, custom-entry lists, labels and the active path's blocks) and
//! their values are laid out in docs/format.md, "Indexer `transcript`".
//!
//! Events read: `created` (the seed transcript of a fork), `entry_appended`,
//! `leaf_moved`, `history_rewritten` (whole form), `transcript_rewritten`
//! (delta form), `state_cleared` and the `spool.purge` marker. Costs per
//! event: an append is O(1) index operations (one parent lookup, about five
//! writes) plus, for a compaction, the walk from its parent to its first
//! kept entry ([`first_kept_depth`]). Of its writes only the entry's own
//! `e` record is a new key for a chain append (one under the leaf whose
//! parent had no child): the parent's `e` record (which holds its child
//! count), the last `p` block and the `m` meta are rewrites of keys the
//! appends before wrote, which the index's memtable coalesces (one value
//! per key) before they move into sled, and a parent's first child writes
//! no `c` key. A second child writes the `c` links of both. The new
//! entry's `n` key is probed (a missing key: answered by the index's key
//! filter) in case orphans named it as their parent before it existed.
//! A leaf move is O(1); a delta rewrite is proportional to what it names plus
//! the subtrees whose path facts change (re-parented entries, entries whose
//! [`PathMarker`] changed); a whole rewrite, a state clear and a purge are
//! O(entries of the session).
//! A `created` event's seed transcript (a fork's path) is indexed in one
//! in-memory pass (`index_seed`): the same records, links, lists and path
//! as appending its entries one by one, without reading the index back
//! (each record written once, with its child count). The records go into
//! the seed table, at most 256 keys whatever the seed's size, instead of
//! one `e` key per entry: the index's memtable moves every key into sled
//! at a cost per key, and a fork of a 10k-entry session at its middle
//! would otherwise move 5k of them. A lookup by id reads the `e` key and,
//! on a miss, the id's seed bucket (a session's [`TranscriptMeta::seed_table`]
//! tells an append whether its new-id check needs that second read).
//!
//! **Active path.** The `p` keys hold the root→leaf path of the current
//! leaf by depth, in blocks of 64 depths per key (exactly the depths
//! `0..path_len` of [`TranscriptMeta`] exist: every block but the last is
//! full, and no block lies past the path), so
//! [`EntrySource::ancestor_at_depth`] answers with one or two `get`s and a
//! root-first branch page costs what it returns: its depth range is read
//! from the blocks from the one holding its first depth's parent, one
//! lookup each ([`EntrySource::path_range`]: two keys for up to 64 depths,
//! where one key per depth cost a sled iterator step each; blocks and
//! records are kept on the reading thread while the index is unchanged,
//! see [`accelerators`]), and since each link
//! carries the entry's log position and size (the parent is the entry one
//! depth up), the page's entries are read from the log without index
//! record lookups. A block's framing (lengths, link count, size) is
//! checked whenever it is read and a link's contents when it is used: a
//! damaged block fails the read with an [`IndexError`] naming the session
//! and the depth; a block shorter than the path (a write racing the read)
//! is not the path, and the caller walks parents. The links are kept in
//! step with the records: every path write compares the whole link, and a
//! delta rewrite refreshes the links of the path entries it moved in the
//! log. Writers read, change and write back whole blocks (`PathBlocks`:
//! each block decoded once per event and written once). An append under
//! the leaf rewrites only the last block (a new block at a multiple of 64
//! is written without a read; the index's memtable keeps one value per
//! key, so the appends into one block coalesce before they reach sled); a
//! leaf move (or an append elsewhere) rewrites the blocks below the common
//! ancestor of the old and the new leaf, truncates the block holding the
//! new length and removes the blocks past it: O(distance to the common
//! ancestor) links. A delta rewrite rewrites from the new leaf up to the
//! shallowest entry whose parent it changed (its ancestry above stays
//! valid); whole rewrites, clears and fork seeds rebuild the path with the
//! entries (a seed writes one key per 64 depths).
//!
//! An entry is read back ([`LogTranscriptSource`]) by reading the commit
//! at its position and decoding only the event that holds it (an appended
//! entry is decoded alone, without the event enum's buffering); the parent
//! comes from the index (a re-parented entry's stored bytes are never
//! rewritten, only its parent link). A fork's seed transcript lives in its
//! `created` event: reading one of its entries decodes that whole event
//! (cached for the source's lifetime). Decoded entries read more than once
//! are kept in the engine's bounded, scan-resistant [`EntryCache`], keyed
//! by log position. Child links cost one lookup of the entry's `e` record
//! (only its leading child count and only child are decoded) for an entry
//! with at most one child (a chain), a prefix scan for more.
//!
//! **Child counts.** A parent's child count lives in its `e` record, so a
//! chain append changes a key that already exists instead of adding one.
//! A parent without a record (the absent parent of an orphan: whole
//! transcripts of rewrites, fork seeds and raw imports can hold orphans)
//! keeps its count in an `n` key; when an entry with that id is indexed
//! later (appending an entry whose id an orphan names as its parent is
//! allowed), its new record takes the count over and the `n` key is
//! removed, so an id never has both. Every writer of counts goes through
//! one place (`ChildCount`).
//!
//! Resolved labels are the last label entry (in append order) of a target;
//! removing a label entry by a rewrite restores the previous one.

mod accelerators;
mod child_counts;
mod indexer;
mod keys;
mod path_blocks;
mod record;
mod seed_table;
mod source;
#[cfg(test)]
mod test_support;

pub use accelerators::DecodeMemo;
pub use indexer::TranscriptIndexer;
pub use source::{entry_ids, read_meta, LogTranscriptSource};
// Reached from outside the crate only through the `fuzzing` and
// `test_hooks` modules at its root, under their features.
#[cfg(any(feature = "fuzzing", feature = "test-hooks"))]
pub use keys::TRANSCRIPT_INDEXER;
#[cfg(any(feature = "fuzzing", feature = "test-hooks"))]
pub use record::EntryRecord;
#[cfg(any(feature = "postgres", feature = "fuzzing"))]
pub use record::TranscriptMeta;
#[cfg(feature = "fuzzing")]
pub use seed_table::{encode_seed_bucket, seed_bucket_records};
#[cfg(feature = "test-hooks")]
pub use source::entry_records;

/// The decoders of the transcript index's other values (active-path
/// blocks and their links, `n` child counts, the meta record), for the
/// `index_values` fuzz body (`spool-tests`): index values are bytes on
/// disk, read back as they are. Not an API: public only through the
/// crate's `fuzzing` module (feature `fuzzing`), compiled in every build
/// so it stays in step with the formats.
#[cfg_attr(not(feature = "fuzzing"), allow(dead_code))]
pub mod fuzzing {
    use super::child_counts::{count_value, only_child};
    use super::path_blocks::{
        block_len, block_link, block_links, decode_block, decode_path_link, encode_path_link,
        path_link_id,
    };
    use super::record::{decode, encode, TranscriptMeta};
    use crate::store::log::common::be_u64;
    use crate::transcript::EntryId;

    /// A record's bytes with its child count and only child replaced, as an
    /// append writes its parent's count back (`None`: the bytes do not start
    /// like a record).
    pub fn splice_child_count(
        bytes: &[u8],
        children: u64,
        only: Option<&EntryId>,
    ) -> Option<Vec<u8>> {
        super::child_counts::splice_child_count(bytes, children, only)
    }

    /// The links of a `p` block value in depth order, or the slot of the
    /// first malformed one.
    pub fn path_block_links(v: &[u8]) -> Result<Vec<&[u8]>, usize> {
        block_links(v).collect()
    }

    /// The number of links a writer and a reader of the block count.
    pub fn path_block_len(v: &[u8]) -> Result<u64, String> {
        block_len("fuzz", 0, v).map_err(|e| e.to_string())
    }

    /// The links as a writer takes them over (owned).
    pub fn path_block_decoded(v: &[u8]) -> Result<usize, String> {
        decode_block("fuzz", 0, v)
            .map(|links| links.len())
            .map_err(|e| e.to_string())
    }

    /// The link at `slot` as a point read finds it.
    pub fn path_block_link(v: &[u8], slot: usize) -> Result<Option<&[u8]>, usize> {
        block_link(v, slot)
    }

    /// A link decoded and encoded again (`None`: it does not decode).
    pub fn path_link_reencoded(v: &[u8]) -> Option<Vec<u8>> {
        let l = decode_path_link(v)?;
        Some(encode_path_link(
            l.key,
            l.size,
            &l.id,
            l.orphan_parent.as_ref(),
        ))
    }

    /// The id bytes a link names, as the leaf check reads them in place.
    pub fn path_link_id_bytes(v: &[u8]) -> Option<&[u8]> {
        path_link_id(v)
    }

    /// An `n` value's count and only child, as readers take them.
    pub fn count_value_parts(v: &[u8]) -> (Option<u64>, Option<EntryId>) {
        (be_u64(v), only_child(v))
    }

    /// [`count_value_parts`]'s inverse, as the writer encodes it.
    pub fn count_value_bytes(count: u64, only: Option<&EntryId>) -> Vec<u8> {
        count_value(count, only)
    }

    /// The `m` record decoded.
    pub fn decode_meta(b: &[u8]) -> Result<TranscriptMeta, String> {
        decode("transcript meta", b).map_err(|e| e.to_string())
    }

    /// The `m` record as the indexer writes it.
    pub fn encode_meta(m: &TranscriptMeta) -> Result<Vec<u8>, String> {
        encode("transcript meta", m).map_err(|e| e.to_string())
    }
}
