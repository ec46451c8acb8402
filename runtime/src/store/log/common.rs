//! Names and helpers shared by the log store and its transcript index:
//! the engine event kinds of sessions, big-endian reads, the mapping of
//! engine errors and of the index's change mark. It imports nothing from
//! the rest of the log store, so neither side imports the other for them.

use crate::store::{ChangeMark, StoreError};

/// Prefix of the engine event kinds of session events.
pub const SESSION_EVENT_PREFIX: &str = "session.";

/// Engine event kind of the store-level purge marker.
pub const PURGE_EVENT_KIND: &str = "spool.purge";

/// The u64 a big-endian value starts with; `None` when it is shorter.
pub(crate) fn be_u64(b: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(b.get(..8)?.try_into().ok()?))
}

/// The engine index's change mark as the store's [`ChangeMark`] (the one
/// mark type of the runtime), `None` while it is not settled (a rebuild is
/// running): two equal unsettled marks say nothing.
pub(crate) fn index_mark(index: &spool_engine::Index) -> Option<ChangeMark> {
    let mark = index.change_mark();
    mark.is_settled()
        .then(|| ChangeMark::new(mark.instance(), mark.changes()))
}

/// An engine failure as a store error.
pub(crate) fn engine_err(e: spool_engine::Error) -> StoreError {
    StoreError::Engine(e)
}
