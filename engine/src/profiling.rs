//! Entry points of the profiling examples (`examples/sled_insert.rs`) into the
//! index's own use of sled, so they measure what the index runs. Feature
//! `profiling`; not a stable API.

use std::path::Path;

/// A sled database at `path`, configured as the index opens its own.
pub fn open_index_sled(path: &Path) -> Result<sled::Db, sled::Error> {
    crate::index::Index::open_db_inner(Some(path), crate::index::INDEX_CACHE_BYTES_MAX)
}

/// The epoch reclamation a move into sled runs after its `writes`.
pub fn reclaim_after_move(writes: usize) {
    crate::index::reclaim_sled_garbage(writes)
}
