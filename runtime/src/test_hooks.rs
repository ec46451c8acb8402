//! The log store's index internals, for tests that open the engine store
//! of a log store directly and check what its indexers wrote. Feature
//! `test-hooks`; not a stable API. (The handle's hooks are methods of
//! [`crate::SessionHandle`] and [`crate::handle::ResidentSnapshot`] under
//! the same feature.)

pub use crate::store::log::sessions::SessionIndexer;
pub use crate::store::log::transcript::{
    entry_records, read_meta, EntryRecord, TranscriptIndexer, TRANSCRIPT_INDEXER,
};
