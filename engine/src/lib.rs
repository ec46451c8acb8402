//! spool-engine: a crash-safe, log-structured event store.
//!
//! The segment log is the single source of truth. A commit (1..=N events appended to one
//! stream behind an expected-version fence) is one checksummed record in a segment file;
//! sequence numbers are global, 1-based and increasing (dense until log compaction
//! removes commits); a stream's version is the number of commits appended to it.
//! Derived indexes (stream heads; stream version → position, seq and commit id; those of
//! registered [`Indexer`]s) live in sled, which is a rebuildable cache that is never
//! ahead of the log.
//!
//! - [`Store::open`] takes an exclusive lock, recovers the log (truncating only a torn
//!   tail of the last segment; mid-log corruption is an error naming segment and offset)
//!   and catches the index up from the log or rebuilds it.
//! - [`Store::append`] is acknowledged after fdatasync ([`Durability::Immediate`],
//!   shared among concurrent writers by group commit) or after the write
//!   ([`Durability::Buffered`]). A failed write or fsync poisons the store.
//! - [`Store::open_read_only`] and [`verify`] never write to the store directory.
//! - [`Store::plan_gc`] / [`Store::run_gc`] compact the log: the live records of sealed
//!   segments are copied into new segments and the old ones retired, crash-safely.
//!   [`Store::plan_gc_with`] also replaces commits' events ([`GcAction::Replace`]) and
//!   compacts the active segment; an erasing GC ([`GcOptions::erase`]) has the next
//!   owner open delete and rebuild the index.
//! - [`salvage`] copies every readable commit of a damaged store into a new one and
//!   reports what was lost, by segment and offset.
//! - All log I/O goes through [`vfs::Vfs`], so tests can inject faults and crashes.
//!
//! The on-disk format is in [`mod@format`] and, byte by byte, in docs/format.md at the
//! repository root.

mod commit_id;
mod error;
pub mod format;
mod gc;
mod index;
mod prepare;
mod salvage;
mod segment;
mod spare;
mod store;
mod types;
mod verify;
pub mod vfs;

pub use error::{Error, IndexError};
pub use format::{
    CommitRef, EventRef, EVENTS_PER_COMMIT_MAX, EVENT_KIND_BYTES_MAX, RECORD_BYTES_HARD_CAP,
    RECORD_BYTES_MAX_DEFAULT, SEGMENT_BYTES_MAX_DEFAULT, SEGMENT_BYTES_MIN, SEGMENT_BYTES_START,
    STREAM_ID_BYTES_MAX,
};
pub use gc::{
    GcAction, GcOptions, GcPlan, GcReport, GcSegment, CHECKPOINTS_DIR, ERASE_MARKER_FILE,
    GC_MANIFEST_IDS_MAX,
};
pub use index::{
    ChangeMark, Index, IndexBatch, IndexScan, Indexer, StreamHead, INDEX_FORMAT_VERSION,
};
pub use salvage::{salvage, DroppedCommit, LostRange, SalvageReport};
pub use segment::{LogSpan, ACTIVE_MAP_SLACK_BYTES};
pub use spare::SPARE_SEGMENT_FILE;
pub use store::{
    LogScan, Store, INDEX_DIR, LOCK_FILE, LOCK_WAIT_MAX_MS, LOG_SPAN_BYTES_MAX,
    ZERO_FILL_CHUNK_BYTES,
};
pub use types::{
    AppendOutcome, CommitInfo, Durability, EventData, ExpectedVersion, LogPosition, NewCommit,
    NextSegment, Options, Preallocate, RecordedCommit, StoreStats, INDEX_THREAD_POLL_DEFAULT_US,
    INDEX_THREAD_POLL_MAX_US,
};
pub use uuid::Uuid;
pub use verify::{verify, IndexCheck, VerifyProblem, VerifyReport};

/// Entry points of the profiling examples (`examples/sled_insert.rs`) into the index's
/// own use of sled, so they measure what the index runs; not a stable API.
#[doc(hidden)]
pub mod profiling {
    use std::path::Path;

    /// A sled database at `path`, configured as the index opens its own.
    pub fn open_index_sled(path: &Path) -> Result<sled::Db, sled::Error> {
        crate::index::Index::open_db_inner(Some(path))
    }

    /// The epoch reclamation a move into sled runs after its `writes`.
    pub fn reclaim_after_move(writes: usize) {
        crate::index::reclaim_sled_garbage(writes)
    }
}

/// Entry points of the fuzz targets into formats the engine keeps private (the index's
/// redo log); not a stable API.
#[doc(hidden)]
pub mod fuzzing {
    use std::path::Path;

    /// The writes a redo record body holds, or where and why it does not decode.
    #[allow(clippy::type_complexity)]
    pub fn redo_body_writes(body: &[u8]) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>, String> {
        crate::index::redo::decode_body(body).map_err(|(at, what)| format!("offset {at}: {what}"))
    }

    /// The body of a redo record holding `writes` (sorted by key, as a move writes them).
    pub fn redo_body(writes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Vec<u8> {
        let refs: Vec<(&[u8], &Option<Vec<u8>>)> =
            writes.iter().map(|(k, v)| (k.as_slice(), v)).collect();
        crate::index::redo::encode_body(&refs).expect("a fuzz input is far below the record limit")
    }

    /// The value of sled's `MOVING` key naming the record with `body`.
    pub fn redo_marker(body: &[u8]) -> Vec<u8> {
        crate::index::redo::marker(body).to_vec()
    }

    /// Appends a record holding `body` to the redo log of the index directory `dir`.
    pub fn redo_append(dir: &Path, body: &[u8]) -> Result<(), String> {
        let mut log = crate::index::redo::RedoLog::open(dir).map_err(|e| e.to_string())?;
        log.append(body).map(|_| ()).map_err(|e| e.to_string())
    }

    /// The record body the redo log of `dir` holds for `marker`, as open looks it up.
    pub fn redo_find(dir: &Path, marker: &[u8]) -> Result<Option<Vec<u8>>, String> {
        let mut log = crate::index::redo::RedoLog::open(dir).map_err(|e| e.to_string())?;
        log.find(marker).map_err(|e| e.to_string())
    }

    /// Name of the redo log file in an index directory.
    pub const REDO_FILE: &str = crate::index::redo::REDO_FILE;
}
