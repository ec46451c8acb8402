//! The store: the [`Store`] handle, its shared state (`Inner`, the writer state of group
//! commit) and the limits and file names of a store directory. Opening is in [`open`],
//! the append path in [`commit`], reads in [`read`], flushing and shutdown in [`flusher`]
//! and segment files on disk in [`segment_file`].

mod commit;
mod flusher;
mod open;
mod read;
mod segment_file;

pub use self::commit::APPEND_BATCH_COMMITS_MAX;
use self::flusher::*;
pub use self::read::LogScan;
use self::segment_file::*;
pub(crate) use self::segment_file::{
    check_plain_order, init_segment_file, layout_of, open_segments_in_order, OpenedSegment,
    SegmentDamage,
};

use crate::error::{Error, IndexError};
use crate::format::{self, CommitHead, CommitRef, FRAME_HEADER_BYTES, SEGMENT_HEADER_BYTES};
use crate::index::bloom::CommitIdFilter;
use crate::index::Index;
use crate::prepare::Preparer;
use crate::segment::{self, HistoryCheck, LogSpan, Segment, Tail};
use crate::spare;
use crate::types::*;
use crate::vfs::{Mapped, OpenMode, Vfs, VfsFile, VfsLock};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock, Weak};
use std::thread::JoinHandle;
use uuid::Uuid;

/// Name of the owner lock file in the store directory.
pub const LOCK_FILE: &str = "LOCK";
/// How long an open waits for the owner lock before [`Error::Locked`] by default
/// ([`Options::lock_wait`] sets it per open). The lock is a
/// `flock` on `LOCK`, which belongs to the open file description: a child process
/// forked by any thread of the process (a `Command::spawn` elsewhere) holds a copy of
/// the descriptor until its `exec` closes it, so a store closed and reopened right
/// then finds its own released lock still held for that instant. A live owner keeps
/// the lock for longer than this and still gets `Locked`.
pub const LOCK_WAIT_MAX_MS: u64 = 1_000;
/// Pause between attempts while waiting for the owner lock.
const LOCK_RETRY_MS: u64 = 5;
/// Name of the sled index directory in the store directory.
pub const INDEX_DIR: &str = "index";
/// Most bytes one [`Store::read_span`] reads (or borrows): 4 MiB.
pub const LOG_SPAN_BYTES_MAX: u64 = 4 << 20;

/// Commits applied to the index per call while catching up on open.
pub(crate) const CATCH_UP_BATCH: usize = 1024;
/// How often a read-only open rescans a log that looked corrupt (see `open_impl`).
const READ_ONLY_RESCANS: u32 = 3;
/// Upper bound of how long a group-commit leader waits for followers (2 ms).
const MAX_GATHER_NANOS: u64 = 2_000_000;

/// Smallest durable group whose index writes are always prepared on the index thread
/// during its fdatasync ([`crate::prepare`]); a smaller one only when groups come back
/// to back ([`Options::index_thread_poll`]). Handing a group to a sleeping thread
/// costs a thread wake-up on each side, comparable to preparing a few commits; with
/// many writers (large groups) the thread is faster.
pub(crate) const PREPARE_THREAD_COMMITS_MIN: usize = 4;
/// Smallest durable group, in frame bytes, whose index writes are always prepared on
/// the index thread: its fdatasync writes back at least this much, which takes far
/// longer than the two wake-ups, and its indexers have as much to read (a fork's
/// `created` event carries its whole seed transcript).
pub(crate) const PREPARE_THREAD_BYTES_MIN: usize = 256 << 10;
/// Bytes per `pwrite` when zero-filling a new segment (and a torn tail). The kernel
/// sizes the page-cache folios a write creates by the write's length (ext4 with large
/// folios), and every later commit's small `pwrite`, and the fdatasync after it, walk
/// all the blocks of the folio they land in. Large fill writes made a lone durable
/// writer spend more CPU per append than 16 KiB ones; buffered appends and many
/// writers (one `pwrite` per group) did not differ. Filling a segment in 16 KiB writes
/// takes longer, but on the spare's thread, off the commit path. 4 KiB writes were no
/// better than 16 KiB and fill slower (see BENCHMARKS.md, Decisions).
pub const ZERO_FILL_CHUNK_BYTES: usize = 16 << 10;

/// A contiguous run of frames in the pending buffer, all for one segment.
#[derive(Debug, Clone, Copy)]
struct Chunk {
    seg: u64,
    offset: u64,
    start: usize,
    end: usize,
    /// Capacity to give the segment if this chunk starts it.
    capacity: u64,
    first_seq: u64,
}

pub(crate) struct Writer {
    /// The segment on disk that takes the next write.
    pub(crate) active: Arc<Segment>,
    /// Logical end of the log including sequenced but unwritten frames.
    tail_seg: u64,
    /// The id the next new segment gets (the writer's and GC's segments share it, so
    /// ids only grow).
    pub(crate) next_segment_id: u64,
    tail_off: u64,
    tail_cap: u64,
    buf: Vec<u8>,
    chunks: Vec<Chunk>,
    batch: Vec<RecordedCommit>,
    spare_buf: Vec<u8>,
    spare_chunks: Vec<Chunk>,
    spare_batch: Vec<RecordedCommit>,
    /// Last seq handed out.
    next_seq: u64,
    /// Last seq acknowledged (durable with Immediate, written with Buffered).
    done_seq: u64,
    /// A leader is writing a group.
    pub(crate) leader: bool,
    /// Head version of every stream, including commits sequenced but not yet
    /// acknowledged: version checks never touch the index. Built by the open scan.
    /// (foldhash, as the per-commit maps below: std's SipHash is slow for
    /// several lookups per commit.)
    pub(crate) heads: foldhash::HashMap<String, u64>,
    /// Commit ids sequenced but not yet applied to the index.
    pending_ids: foldhash::HashMap<Uuid, CommitInfo>,
    /// Every commit id in the log (approximately) once `ids_complete`: a miss skips
    /// the index lookup.
    ids: CommitIdFilter,
    /// `ids` holds every commit id: false after an open that read only the log's
    /// tail, until the first lookup that needs them all (see `Store::complete_ids`).
    ids_complete: bool,
    last_ts: i64,
    /// Buffered: written since the last fdatasync.
    dirty: bool,
    /// Commits in the last group written.
    last_group: usize,
    /// A leader is waiting for more commits to join its group.
    gathering: bool,
    /// Threads waiting on `Inner::cond` (see `wait_writer`).
    pub(crate) waiters: usize,
    /// The index thread that prepares a durable group's index writes during its
    /// fdatasync; started by the first group that uses it, taken by that group's
    /// leader for the group. `None` also when it could not be started.
    preparer: Option<Preparer>,
    /// Starting the index thread failed once: durable groups prepare on the leader.
    preparer_failed: bool,
    /// When the last durable group was acknowledged: a small group that follows
    /// within the index thread's poll window goes to the thread too.
    last_group_end: Option<std::time::Instant>,
}

#[derive(Default)]
pub(crate) struct Counters {
    commits: AtomicU64,
    fsyncs: AtomicU64,
    groups: AtomicU64,
    bytes: AtomicU64,
    segments_created: AtomicU64,
    segments_from_spare: AtomicU64,
    groups_prepared_ahead: AtomicU64,
    pub(crate) groups_polled: AtomicU64,
}

pub(crate) struct Inner {
    pub(crate) dir: PathBuf,
    pub(crate) opts: Options,
    pub(crate) read_only: bool,
    /// Shared with the background checkpoint (which lists the segments up to its
    /// record, see [`crate::checkpoint`]).
    pub(crate) segments: Arc<RwLock<BTreeMap<u64, Arc<Segment>>>>,
    /// The owner's checkpoints: when the last was written, failures.
    pub(crate) checkpoints: Arc<crate::checkpoint::Shared>,
    /// What the open did (records read, checkpoint used or why not).
    pub(crate) open_report: self::open::OpenReport,
    pub(crate) w: Mutex<Writer>,
    pub(crate) cond: Condvar,
    /// Wakes a gathering leader when a commit joins its group.
    pub(crate) gather_cond: Condvar,
    /// Duration of the last group's fdatasync, in nanoseconds.
    pub(crate) last_sync_nanos: AtomicU64,
    pub(crate) index: Index,
    /// The last acknowledged seq (`Writer::done_seq`, readable without the lock).
    pub(crate) last_seq: AtomicU64,
    pub(crate) poisoned: AtomicBool,
    /// What poisoned the store (the first failure), for [`Error::Poisoned`].
    pub(crate) poison_cause: Mutex<Option<String>>,
    pub(crate) closed: AtomicBool,
    pub(crate) counters: Counters,
    pub(crate) stop: Mutex<bool>,
    pub(crate) stop_cond: Condvar,
    pub(crate) flusher: Mutex<Option<JoinHandle<()>>>,
    /// The owner lock. Declared last so that it is dropped last: another owner may only
    /// get in after sled (inside `index`) has been closed.
    /// One GC at a time.
    pub(crate) gc_lock: Mutex<()>,
    /// Old segments of committed GCs waiting for their readers.
    pub(crate) retired: Mutex<Vec<crate::gc::Retired>>,
    /// The next segment, built ahead ([`NextSegment`]): the leader builds and takes it;
    /// close and `wait_for_spare_segment` wait for a build.
    pub(crate) spare: Mutex<spare::Slot>,
    pub(crate) _lock: Option<Box<dyn VfsLock>>,
}

/// An open store. `Send + Sync`; share it in an `Arc`.
pub struct Store {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Store {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Store")
            .field("dir", &self.inner.dir)
            .field("read_only", &self.inner.read_only)
            .finish()
    }
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

/// Wait on `Inner::cond` (woken when a group is done), counted so that the leader only
/// notifies when someone waits.
pub(crate) fn wait_writer<'a>(
    inner: &Inner,
    mut w: MutexGuard<'a, Writer>,
) -> MutexGuard<'a, Writer> {
    w.waiters += 1;
    let mut w = inner.cond.wait(w).unwrap_or_else(|e| e.into_inner());
    w.waiters -= 1;
    w
}

impl Inner {
    /// Refuse every later write until a reopen; `cause` is kept for the refusals (only
    /// the first failure's: later ones follow from it).
    pub(crate) fn poison(&self, cause: &dyn std::error::Error) {
        let mut c = lock(&self.poison_cause);
        if c.is_none() {
            // The whole chain: an I/O error's message names the call and the file,
            // its source what the system said (e.g. a full disk).
            let mut text = cause.to_string();
            let mut next = cause.source();
            while let Some(e) = next {
                text.push_str(": ");
                text.push_str(&e.to_string());
                next = e.source();
            }
            *c = Some(text);
        }
        self.poisoned.store(true, Ordering::Release);
    }

    /// The error every write gets once the store is poisoned.
    pub(crate) fn poisoned_error(&self) -> Error {
        Error::Poisoned {
            cause: lock(&self.poison_cause)
                .clone()
                .unwrap_or_else(|| "cause not recorded".into()),
        }
    }
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Store {
    /// Read access to the derived indexes.
    pub fn index(&self) -> &Index {
        &self.inner.index
    }

    /// Make every acknowledged commit durable (a no-op in effect with Immediate).
    pub fn flush(&self) -> Result<(), Error> {
        flush_inner(&self.inner)
    }

    /// Move every index write still held in memory into sled, and wait for a
    /// background move in progress: a checkpoint of the derived indexes, which
    /// afterwards hold every acknowledged commit in sled and have no background
    /// work pending. Waits for a write group in flight and holds new groups
    /// back while it runs (appends wait; reads go on). The log is not synced:
    /// that is [`Store::flush`]. During a bulk load
    /// ([`Options::index_bulk_load`]) the writes go to a run beside sled
    /// instead, which a crash loses (the next open reads them from the log
    /// again). A failure poisons the store, as a failed index write on the
    /// write path does. A no-op on a read-only store.
    pub fn flush_index(&self) -> Result<(), Error> {
        let inner = &*self.inner;
        if inner.read_only {
            return Ok(());
        }
        let w = lock_idle(inner)?;
        // With the writer lock held and no leader, nothing publishes into the
        // memtable, which makes this thread its only applier (`flush_mem`'s rule).
        let res = inner.index.flush_mem().map_err(Error::Index);
        if let Err(e) = &res {
            inner.poison(e);
        }
        drop(w);
        res
    }

    /// Hold back the checkpoints the owner writes in the background until the
    /// returned guard drops, for a bulk write such as an import: each background
    /// checkpoint writes the whole index, and a bulk write would otherwise write
    /// one per eighth of its growth. Readers meanwhile open from the last
    /// checkpoint and fold the log after it; a clean close writes one as usual.
    /// Guards nest. A no-op on a read-only store.
    pub fn defer_checkpoints(&self) -> CheckpointsDeferred<'_> {
        self.inner.checkpoints.defer();
        CheckpointsDeferred { store: self }
    }

    /// Flush, stop background work and release the lock.
    pub fn close(self) -> Result<(), Error> {
        shutdown(&self.inner)
    }

    /// Counters since open.
    pub fn stats(&self) -> StoreStats {
        let c = &self.inner.counters;
        StoreStats {
            commits: c.commits.load(Ordering::Relaxed),
            fsyncs: c.fsyncs.load(Ordering::Relaxed),
            write_groups: c.groups.load(Ordering::Relaxed),
            bytes_written: c.bytes.load(Ordering::Relaxed),
            segments: self
                .inner
                .segments
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .len() as u64,
            segments_created: c.segments_created.load(Ordering::Relaxed),
            segments_from_spare: c.segments_from_spare.load(Ordering::Relaxed),
            groups_prepared_ahead: c.groups_prepared_ahead.load(Ordering::Relaxed),
            groups_polled: c.groups_polled.load(Ordering::Relaxed),
            last_seq: self.last_seq(),
            open_records_decoded: self.inner.open_report.decoded,
            open_checkpoint_seq: self.inner.open_report.checkpoint_seq,
            open_checkpoint_fallback: self.inner.open_report.checkpoint_fallback.clone(),
            checkpoints_written: self.inner.checkpoints.written(),
            checkpoint_failure: self.inner.checkpoints.failure(),
        }
    }

    /// The store directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Whether writes are refused after a failure (reads keep working).
    pub fn is_poisoned(&self) -> bool {
        self.inner.poisoned.load(Ordering::Acquire)
    }

    /// Whether this store was opened with [`Store::open_read_only`].
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }
}

/// Background checkpoints held back while this lives
/// ([`Store::defer_checkpoints`]).
#[must_use = "checkpoints are deferred only while the guard lives"]
pub struct CheckpointsDeferred<'a> {
    store: &'a Store,
}

impl Drop for CheckpointsDeferred<'_> {
    fn drop(&mut self) {
        self.store.inner.checkpoints.resume();
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        let _ = shutdown(&self.inner);
    }
}

#[cfg(test)]
mod tests;

/// The index thread ([`crate::prepare`]): a durable group of at least
/// `PREPARE_THREAD_COMMITS_MIN` commits is prepared during its fdatasync. Each test
/// holds a first writer inside its fdatasync (a paused [`FaultVfs`] call) until eight
/// more commits have lined up, so the second group is exactly those eight.
#[cfg(test)]
mod prepare_tests;
