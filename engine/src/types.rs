//! Public value types of the engine API.

use crate::format;
use crate::vfs::{OsVfs, Vfs};
use crate::Indexer;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use uuid::Uuid;

/// When an append is acknowledged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Durability {
    /// After fdatasync (shared by concurrent writers: group commit).
    #[default]
    Immediate,
    /// After the write reached the page cache; a background thread fdatasyncs every
    /// [`Options::buffered_flush_interval`], and on [`crate::Store::flush`] and close.
    Buffered,
}

/// How new segments reserve their space.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Preallocate {
    /// `ZeroFill`, with either durability (see [`Preallocate::resolve`]).
    #[default]
    Auto,
    /// Write zeros over the whole segment once: later overwrites need no block
    /// allocation or extent conversion, so fdatasync commits no metadata, and a
    /// buffered commit's `pwrite` lands in page-cache pages and blocks that already
    /// exist. The zeros cost a second write of every byte to the disk, and a segment
    /// takes its whole size on disk from its creation (segments grow, see
    /// [`Options::segment_bytes_max`]); the spare segment (see `NextSegment`) is
    /// filled on a background thread, the first one when the store is created.
    /// (Plain writes only: no platform call such as fallocate(2), which would need
    /// `unsafe` and still leave unwritten extents to convert on the first overwrite.)
    ZeroFill,
    /// Only set the file's length (a sparse file reading as zeros): creating a segment
    /// costs next to nothing and writes nothing, and the file system allocates blocks
    /// and page-cache pages as records land, in the writer's `pwrite`. For buffered
    /// stores that are created often and hold little, or whose disk bandwidth matters
    /// more than the writer's CPU.
    Sparse,
}

impl Preallocate {
    /// The mode `Auto` stands for under `durability`: `ZeroFill` with both.
    ///
    /// With `Immediate`, overwriting written blocks keeps metadata out of the
    /// commits' fdatasyncs. With `Buffered`, the kernel's page allocation and
    /// delayed block allocation move from the writer's `pwrite` (new page
    /// cache every few commits) to the thread that fills the
    /// spare, off the commit path, so a buffered writer commits faster than
    /// with `Sparse` (see BENCHMARKS.md, Decisions).
    pub fn resolve(self, durability: Durability) -> Preallocate {
        match (self, durability) {
            (Preallocate::Auto, Durability::Immediate | Durability::Buffered) => {
                Preallocate::ZeroFill
            }
            (p, _) => p,
        }
    }
}

/// When the segment after the active one is created (see `spare.rs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum NextSegment {
    /// Once the active segment is half full, a background thread builds the next one
    /// (preallocated, header written, fsynced) under a spare name; the writer that fills
    /// the active segment renames it into place and fsyncs the directory. Creating a
    /// zero-filled segment is slow, and this keeps it off the commit path. Costs one segment of disk space ahead and a short-lived thread per segment.
    #[default]
    Background,
    /// The same spare, built by the writer whose group finds the active segment half
    /// full, before it writes that group: the file operations happen at a point that
    /// depends only on what was appended (tests that count them use this).
    Inline,
    /// Created by the writer that needs it, when it needs it.
    OnDemand,
}

/// Configuration of a [`crate::Store`].
#[derive(Clone)]
pub struct Options {
    pub durability: Durability,
    /// Largest size of a segment file. Segments grow: a store's first segment is
    /// created with [`crate::SEGMENT_BYTES_START`] bytes (or this, if smaller), and each
    /// next one with double the capacity of the one before, up to this; a record larger
    /// than the capacity due gets a segment sized for it. A segment's capacity is its
    /// file length, so reopening continues with the sizes on disk.
    pub segment_bytes_max: u64,
    /// Largest record payload accepted (≤ [`crate::RECORD_BYTES_HARD_CAP`]).
    pub record_bytes_max: u32,
    /// How often the background thread fdatasyncs in [`Durability::Buffered`] mode.
    pub buffered_flush_interval: Duration,
    /// The I/O seam for the log's files.
    pub vfs: Arc<dyn Vfs>,
    /// Derived indexes maintained with every commit.
    pub indexers: Vec<Arc<dyn Indexer>>,
    /// How segments are preallocated.
    pub preallocate: Preallocate,
    /// Where the sled index lives; `None` = `DIR/index`. Tests that keep the log in a
    /// [`crate::vfs::SimVfs`] point this at a real directory.
    pub index_dir: Option<PathBuf>,
    /// How long an open waits for the owner lock before [`crate::Error::Locked`]
    /// (default [`crate::LOCK_WAIT_MAX_MS`]; zero tries once). A live owner keeps
    /// the lock, so a caller that would rather fail at once sets zero.
    pub lock_wait: Duration,
    /// When the next segment is created (default [`NextSegment::Background`]).
    pub next_segment: NextSegment,
    /// How long the index thread polls for a lone durable writer's next group before
    /// it sleeps: zero by default ([`INDEX_THREAD_POLL_DEFAULT_US`]: never), at most
    /// [`INDEX_THREAD_POLL_MAX_US`]. With a window, a group of
    /// fewer than 4 commits that follows the previous group within it goes to the
    /// index thread, which runs its indexers during the fdatasync and then polls for
    /// the next one instead of sleeping (no wake-up on either side); polls that end
    /// empty back off. The cost is a second core kept busy while a writer commits
    /// back to back; the gain varies with the machine (see BENCHMARKS.md,
    /// Decisions). Without a window such
    /// groups are indexed by their writer after the fdatasync.
    pub index_thread_poll: Duration,
    /// The owner writes a checkpoint of the index in the background once at least
    /// this many commits, or an eighth of the log's if that is more, were applied
    /// since the last one (default [`crate::CHECKPOINT_COMMITS_MIN_DEFAULT`]); 0 writes
    /// none in the background (only on close). See [`crate::CHECKPOINT_DIR`].
    pub checkpoint_commits_min: u64,
    /// Most bytes of sled's page cache, as sled counts them (default
    /// [`crate::INDEX_CACHE_BYTES_MAX`]; a setting below [`crate::INDEX_CACHE_BYTES_MIN`]
    /// is raised to it). A long-lived owner reading many sessions wants the default; a
    /// bulk load (an import) reads little of sled and does with a small one (see
    /// [`crate::INDEX_CACHE_BYTES_BULK`]). Read-only opens from a
    /// checkpoint open no sled and ignore it.
    pub index_cache_bytes_max: u64,
    /// An owner open that finds no usable index (a new, lost, damaged or outdated
    /// one) builds it from the whole log instead of from the newest checkpoint the
    /// log backs and the log after it (default false; `spool replay` sets it to
    /// compare the index with one made from the log alone).
    pub index_from_log: bool,
    /// A bulk load (what `spool import` opens the store with; default false): until
    /// the store is closed, the owner's index writes full memtables into sorted files
    /// beside sled instead of into sled, merges them in the background, and the clean
    /// close's checkpoint of the whole index becomes sled's next base. An import then
    /// costs neither sled's work per key nor its memory; what it loaded but the close
    /// did not checkpoint (a crash) is read from the log again by the next open. See
    /// docs/format.md (the index directory).
    pub index_bulk_load: bool,
}

/// Default of [`Options::index_thread_poll`], in microseconds: zero, no polling (its
/// gain was not clear in the benchmark, its cost a second core; see BENCHMARKS.md,
/// Decisions).
pub const INDEX_THREAD_POLL_DEFAULT_US: u64 = 0;
/// Largest [`Options::index_thread_poll`], in microseconds (a longer one is clamped).
pub const INDEX_THREAD_POLL_MAX_US: u64 = 10_000;

impl Default for Options {
    fn default() -> Self {
        Options {
            durability: Durability::Immediate,
            segment_bytes_max: format::SEGMENT_BYTES_MAX_DEFAULT,
            record_bytes_max: format::RECORD_BYTES_MAX_DEFAULT,
            buffered_flush_interval: Duration::from_millis(50),
            vfs: Arc::new(OsVfs),
            indexers: Vec::new(),
            preallocate: Preallocate::default(),
            index_dir: None,
            lock_wait: Duration::from_millis(crate::LOCK_WAIT_MAX_MS),
            next_segment: NextSegment::default(),
            index_thread_poll: Duration::from_micros(INDEX_THREAD_POLL_DEFAULT_US),
            checkpoint_commits_min: crate::CHECKPOINT_COMMITS_MIN_DEFAULT,
            index_from_log: false,
            index_bulk_load: false,
            index_cache_bytes_max: crate::INDEX_CACHE_BYTES_MAX,
        }
    }
}

impl fmt::Debug for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Options")
            .field("durability", &self.durability)
            .field("segment_bytes_max", &self.segment_bytes_max)
            .field("record_bytes_max", &self.record_bytes_max)
            .field("buffered_flush_interval", &self.buffered_flush_interval)
            .field("vfs", &self.vfs)
            .field(
                "indexers",
                &self.indexers.iter().map(|i| i.name()).collect::<Vec<_>>(),
            )
            .field("preallocate", &self.preallocate)
            .field("index_dir", &self.index_dir)
            .field("lock_wait", &self.lock_wait)
            .field("next_segment", &self.next_segment)
            .field("index_thread_poll", &self.index_thread_poll)
            .field("checkpoint_commits_min", &self.checkpoint_commits_min)
            .field("index_cache_bytes_max", &self.index_cache_bytes_max)
            .field("index_from_log", &self.index_from_log)
            .field("index_bulk_load", &self.index_bulk_load)
            .finish()
    }
}

impl Options {
    pub fn durability(mut self, d: Durability) -> Self {
        self.durability = d;
        self
    }
    pub fn segment_bytes_max(mut self, n: u64) -> Self {
        self.segment_bytes_max = n;
        self
    }
    pub fn record_bytes_max(mut self, n: u32) -> Self {
        self.record_bytes_max = n;
        self
    }
    pub fn lock_wait(mut self, d: Duration) -> Self {
        self.lock_wait = d;
        self
    }
    pub fn buffered_flush_interval(mut self, d: Duration) -> Self {
        self.buffered_flush_interval = d;
        self
    }
    pub fn vfs(mut self, vfs: Arc<dyn Vfs>) -> Self {
        self.vfs = vfs;
        self
    }
    /// See [`Options::checkpoint_commits_min`].
    pub fn checkpoint_commits_min(mut self, n: u64) -> Self {
        self.checkpoint_commits_min = n;
        self
    }
    /// See [`Options::index_from_log`].
    pub fn index_from_log(mut self, yes: bool) -> Self {
        self.index_from_log = yes;
        self
    }
    /// See [`Options::index_bulk_load`].
    pub fn index_bulk_load(mut self, yes: bool) -> Self {
        self.index_bulk_load = yes;
        self
    }
    /// See [`Options::index_cache_bytes_max`].
    pub fn index_cache_bytes_max(mut self, n: u64) -> Self {
        self.index_cache_bytes_max = n;
        self
    }
    pub fn indexer(mut self, ix: Arc<dyn Indexer>) -> Self {
        self.indexers.push(ix);
        self
    }
    pub fn preallocate(mut self, p: Preallocate) -> Self {
        self.preallocate = p;
        self
    }
    pub fn index_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.index_dir = Some(dir.into());
        self
    }
    pub fn next_segment(mut self, n: NextSegment) -> Self {
        self.next_segment = n;
        self
    }
    /// [`Options::index_thread_poll`] (clamped to [`INDEX_THREAD_POLL_MAX_US`]).
    pub fn index_thread_poll(mut self, d: Duration) -> Self {
        self.index_thread_poll = d;
        self
    }
    /// [`Options::index_thread_poll`] within its limit.
    pub(crate) fn index_thread_poll_window(&self) -> Duration {
        self.index_thread_poll
            .min(Duration::from_micros(INDEX_THREAD_POLL_MAX_US))
    }
}

/// The version an append expects its stream to be at.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ExpectedVersion {
    /// The stream must not exist (version 0).
    NoStream,
    /// The stream must be at exactly this version (`Exact(0)` is the same as `NoStream`).
    Exact(u64),
    /// No check.
    Any,
}

impl ExpectedVersion {
    /// Whether a stream at `actual` (`None` = absent) satisfies this expectation.
    pub fn matches(self, actual: Option<u64>) -> bool {
        let v = actual.unwrap_or(0);
        match self {
            ExpectedVersion::Any => true,
            ExpectedVersion::NoStream => v == 0,
            ExpectedVersion::Exact(n) => v == n,
        }
    }
}

/// One event of a commit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventData {
    /// At most [`format::EVENT_KIND_BYTES_MAX`] bytes.
    pub kind: String,
    pub payload: Vec<u8>,
}

impl EventData {
    pub fn new(kind: impl Into<String>, payload: impl Into<Vec<u8>>) -> EventData {
        EventData {
            kind: kind.into(),
            payload: payload.into(),
        }
    }
}

/// A commit to append: 1..=[`format::EVENTS_PER_COMMIT_MAX`] events to one stream, all or
/// nothing.
#[derive(Debug, Clone)]
pub struct NewCommit {
    pub stream: String,
    pub expected: ExpectedVersion,
    /// Client-chosen id; retrying the same id returns the original outcome.
    pub commit_id: Uuid,
    pub events: Vec<EventData>,
}

impl NewCommit {
    /// A commit with a fresh random commit id.
    pub fn new(
        stream: impl Into<String>,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> NewCommit {
        NewCommit {
            stream: stream.into(),
            expected,
            commit_id: Uuid::new_v4(),
            events,
        }
    }
}

/// Where a record starts in the log. Ordered by (segment, offset), which is log order
/// only until a GC: compacted segments get new, higher ids (use `seq` for log order).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LogPosition {
    pub segment: u64,
    pub offset: u64,
}

impl LogPosition {
    /// Stable 16-byte big-endian encoding (sorts like the position).
    pub fn to_bytes(self) -> [u8; 16] {
        let mut b = [0u8; 16];
        b[..8].copy_from_slice(&self.segment.to_be_bytes());
        b[8..].copy_from_slice(&self.offset.to_be_bytes());
        b
    }
    /// Inverse of [`LogPosition::to_bytes`]; `None` unless exactly 16 bytes.
    pub fn from_bytes(b: &[u8]) -> Option<LogPosition> {
        if b.len() != 16 {
            return None;
        }
        let mut s = [0u8; 8];
        let mut o = [0u8; 8];
        s.copy_from_slice(&b[..8]);
        o.copy_from_slice(&b[8..]);
        Some(LogPosition {
            segment: u64::from_be_bytes(s),
            offset: u64::from_be_bytes(o),
        })
    }
}

impl fmt::Display for LogPosition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}@{}",
            format::segment_file_name(self.segment),
            self.offset
        )
    }
}

/// What a landed commit is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitInfo {
    pub stream: String,
    /// The stream's new head version (number of commits in the stream).
    pub version: u64,
    /// Global sequence number: 1-based, increasing in log order; dense except where log
    /// compaction removed commits.
    pub seq: u64,
    pub position: LogPosition,
    pub timestamp_ms: i64,
    pub commit_id: Uuid,
}

/// The result of an append that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AppendOutcome {
    Committed(CommitInfo),
    /// The commit id had already landed: the original info; nothing was written.
    AlreadyCommitted(CommitInfo),
    /// The expected version did not match; nothing was written.
    Conflict {
        expected: ExpectedVersion,
        actual: Option<u64>,
    },
}

/// The result of [`Store::append_batch`](crate::Store::append_batch) that did not fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BatchOutcome {
    /// Every commit landed, in order, in one write group.
    Committed(Vec<CommitInfo>),
    /// Nothing was written: the commit at `index` would not have committed, and
    /// `outcome` says why, as appending it after the ones before it would have
    /// ([`AppendOutcome::AlreadyCommitted`] or [`AppendOutcome::Conflict`]).
    Refused {
        index: usize,
        outcome: AppendOutcome,
    },
}

impl AppendOutcome {
    /// The commit info for `Committed` and `AlreadyCommitted`.
    pub fn info(&self) -> Option<&CommitInfo> {
        match self {
            AppendOutcome::Committed(i) | AppendOutcome::AlreadyCommitted(i) => Some(i),
            AppendOutcome::Conflict { .. } => None,
        }
    }
}

/// A commit as read back from the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCommit {
    pub info: CommitInfo,
    pub expected: ExpectedVersion,
    pub events: Vec<EventData>,
    /// Bytes the record occupies in the log (frame header + payload).
    pub record_bytes: u32,
}

/// Counters of a store since it was opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreStats {
    /// Commits appended since open.
    pub commits: u64,
    /// fdatasync calls on segments since open.
    pub fsyncs: u64,
    /// Groups written (one pwrite each).
    pub write_groups: u64,
    /// Bytes of frames written since open.
    pub bytes_written: u64,
    /// Segments in the log now.
    pub segments: u64,
    /// Segments created since open.
    pub segments_created: u64,
    /// Of those, segments that were a spare built ahead ([`NextSegment`]).
    pub segments_from_spare: u64,
    /// Durable groups whose index writes the index thread prepared during their
    /// fdatasync: groups of 4 or more commits or 256 KiB or more of frames, and
    /// back-to-back smaller ones ([`Options::index_thread_poll`]).
    pub groups_prepared_ahead: u64,
    /// Of those, groups the index thread took while polling, without being woken.
    pub groups_polled: u64,
    /// Last sequence number in the log.
    pub last_seq: u64,
    /// Records the open decoded from the log: the whole log, or only those after the
    /// checkpoint the open started from.
    pub open_records_decoded: u64,
    /// The seq of the checkpoint the open started from, if it used one.
    pub open_checkpoint_seq: Option<u64>,
    /// Why the open did not use the store's newest checkpoint (damaged, from another
    /// store, ahead of the log, made with other indexers, or for the owner an index
    /// behind it or found stale after it) and read the whole log instead; `None`
    /// when it used it or there was none.
    pub open_checkpoint_fallback: Option<String>,
    /// Checkpoints the owner wrote since open.
    pub checkpoints_written: u64,
    /// The first checkpoint write that failed since open, if any (a failed checkpoint
    /// is not a fault of the store: the log is the truth; the next one is tried
    /// anyway).
    pub checkpoint_failure: Option<String>,
}
