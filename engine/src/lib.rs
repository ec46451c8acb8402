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
//!
//! # Cargo features
//!
//! None is on by default; both expose internals for the project's own tools and are not
//! a stable API.
//!
//! - `fuzzing`: the `fuzzing` module, entry points of the fuzz targets into the index's
//!   redo log (enabled by `spool-tests`, which holds the fuzz bodies).
//! - `profiling`: the `profiling` module, the index's own sled setup for the profiling
//!   examples (enabled for this crate's examples and tests).

mod checkpoint;
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

pub use checkpoint::{CHECKPOINT_COMMITS_MIN_DEFAULT, CHECKPOINT_DIR};
pub use error::{Error, IndexError};
pub use format::{
    CommitRef, EventRef, EVENTS_PER_COMMIT_MAX, EVENT_KIND_BYTES_MAX, RECORD_BYTES_HARD_CAP,
    RECORD_BYTES_MAX_DEFAULT, SEGMENT_BYTES_MAX_DEFAULT, SEGMENT_BYTES_MIN, SEGMENT_BYTES_START,
    STREAM_ID_BYTES_MAX,
};
pub use gc::{
    GcAction, GcOptions, GcPlan, GcReport, GcSegment, ERASE_MARKER_FILE, GC_MANIFEST_IDS_MAX,
};
pub use index::{
    ChangeMark, Index, IndexBatch, IndexScan, Indexer, StreamHead, CACHE_VALUE_BYTES_MAX,
    INDEX_CACHE_BYTES_BULK, INDEX_CACHE_BYTES_MAX, INDEX_CACHE_BYTES_MIN, INDEX_FORMAT_VERSION,
    INDEX_SLED_DIR,
};
pub use salvage::{salvage, DroppedCommit, LostRange, SalvageReport};
pub use segment::{LogSpan, ACTIVE_MAP_SLACK_BYTES};
pub use spare::SPARE_SEGMENT_FILE;
pub use store::{
    CheckpointsDeferred, LogScan, Store, APPEND_BATCH_COMMITS_MAX, INDEX_DIR, LOCK_FILE,
    LOCK_WAIT_MAX_MS, LOG_SPAN_BYTES_MAX, ZERO_FILL_CHUNK_BYTES,
};
pub use types::{
    AppendOutcome, BatchOutcome, CommitInfo, Durability, EventData, ExpectedVersion, LogPosition,
    NewCommit, NextSegment, Options, Preallocate, RecordedCommit, StoreStats,
    INDEX_THREAD_POLL_DEFAULT_US, INDEX_THREAD_POLL_MAX_US,
};
pub use uuid::Uuid;
pub use verify::{verify, CheckpointCheck, IndexCheck, VerifyProblem, VerifyReport};

// Public only with their features; compiled (private) in every other build
// too, so they stay in step with the internals they reach.
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
#[cfg(not(feature = "fuzzing"))]
#[allow(dead_code)]
mod fuzzing;
#[cfg(feature = "profiling")]
pub mod profiling;
#[cfg(not(feature = "profiling"))]
#[allow(dead_code)]
mod profiling;
