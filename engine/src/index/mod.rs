//! Derived indexes in sled: the engine's own (stream heads; stream+version -> position,
//! seq and commit id) and those of registered [`Indexer`]s. Commit ids have no key of
//! their own: one sled key per commit (random ids, no locality) was the write path's
//! main cost; a retry is found through its stream's version blocks instead.
//!
//! Everything lives in sled's default tree under namespaced keys. Commits reach sled
//! through a memtable, moved into sled whole together with the applied sequence number:
//! a move cut short by a crash is finished from its redo record on the next open (see
//! [`crate::index::redo`]), so sled never holds half of one. Entries written outside
//! commits (the cache) are in sled's `cache` tree if small and in files beside sled if
//! large (see [`cache_files`]), or in memory for an index without a directory; they
//! are dropped on rebuild.
//!
//! sled is a cache: its flush is never relied on. On open the store checks the format,
//! the indexers' versions and the applied seq against the log and rebuilds or catches up.
//!
//! This file holds the [`Index`] handle, its shared state and the [`Indexer`] interface;
//! [`keys`] the key layout, [`open`] opening and wiping, [`publish`] the write side,
//! [`mover`] the move into sled, [`scan`] reads through the layers, [`read`] queries and
//! [`key_file`] the key filter saved at a clean close.

pub(crate) mod bloom;
mod cache_files;
pub(super) mod close;
mod delta;
pub(crate) mod gate;
mod key_file;
mod keys;
mod mem_cache;
mod memtable;
mod mover;
mod open;
mod publish;
mod read;
pub(crate) mod redo;
mod scan;
mod spill;

use self::bloom::{KeyFilter, KeyHash};
pub(crate) use self::cache_files::is_cache_dir_name;
pub use self::cache_files::CACHE_VALUE_BYTES_MAX;
pub use self::delta::INDEX_SLED_DIR;
pub(crate) use self::delta::{BaseId, DeltaIter, META_BASE};
pub use self::keys::StreamHead;
pub(crate) use self::keys::VERSIONS_PER_BLOCK;
use self::keys::*;
use self::memtable::{bound_ref, MemTable, Value};
pub(crate) use self::mover::reclaim_sled_garbage;
#[cfg(test)]
pub(crate) use self::mover::FAIL_SLED_WRITES_OF;
use self::mover::*;
use self::open::*;
use self::redo::RedoLog;
pub use self::scan::IndexScan;
use self::scan::*;
use crate::checkpoint::CheckpointFile;
use crate::error::{Error, IndexError};
use crate::types::{CommitInfo, LogPosition, RecordedCommit};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use uuid::Uuid;

/// sled's page cache, in bytes, by default ([`crate::Options::index_cache_bytes_max`];
/// sled's own default is 1 GiB). sled keeps the nodes it has read or written in
/// memory up to about this much, as it counts them (in memory they take up to about
/// twice that), so it bounds the index's share of the process's memory however large
/// the index grows; a smaller cache only means more of sled's reads go to its files
/// (and the OS page cache).
pub const INDEX_CACHE_BYTES_MAX: u64 = 64 << 20;

/// The smallest sled page cache an open asks for: a smaller setting is raised to it.
pub const INDEX_CACHE_BYTES_MIN: u64 = 1 << 20;

/// sled's page cache for a bulk load, such as `spool import` (what
/// [`crate::Options::index_cache_bytes_max`] is set to there): an import's index reads
/// hit the memtables, the runs and the key filter, and sled holds only what the store
/// held before the load (a bulk load writes runs, not sled: see `spill.rs`), so a
/// larger cache would only hold what the closing checkpoint's scan went through
/// (BENCHMARKS.md, Decisions).
pub const INDEX_CACHE_BYTES_BULK: u64 = 16 << 20;

/// Version of the index layout; a different one in an existing index means rebuild.
pub const INDEX_FORMAT_VERSION: u32 = 2;

pub(crate) const META_FORMAT: &[u8] = b"\x00meta:format";
pub(crate) const META_APPLIED: &[u8] = b"\x00meta:applied";
/// The highest seq known to be in the log on disk: written only after the fdatasync
/// that covered that commit (see [`Index::synced_seq`]).
pub(crate) const META_SYNCED: &[u8] = b"\x00meta:synced";
/// Present only while a move into sled runs: names the move's record in the redo log
/// (see [`crate::index::redo`]).
pub(crate) const META_MOVING: &[u8] = b"\x00meta:moving";
pub(crate) const META_LAYOUT: &[u8] = b"\x00meta:layout";
const META_INDEXER: &[u8] = b"\x00meta:indexer:";
/// The sled tree of the cache's small values (see `cache_files.rs`).
const CACHE_TREE: &[u8] = b"cache";
const HEAD: &[u8] = b"\x01h";
const VERSION: &[u8] = b"\x01v";
const USER: u8 = 0x02;

/// A derived index maintained from every commit, in seq order.
///
/// The store calls a commit's indexers one after the other, in the order
/// they were registered, on one thread, and all of them before the next
/// commit's (appends, group commits prepared on the index thread, catch-up
/// and rebuild alike: every path goes through one preparation loop).
/// Indexers may rely on that order to share work done for the same commit.
pub trait Indexer: Send + Sync {
    /// Namespace of the index's keys; unique among a store's indexers.
    fn name(&self) -> &'static str;
    /// Bumping it rebuilds the whole index from the log on the next open.
    fn version(&self) -> u32;
    /// Record `commit` into `batch`. An error during an append poisons the store's writes
    /// (the commit is durable; reopening catches the index up); during open it fails open.
    fn apply(&self, commit: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError>;
}

/// A key and its value.
pub type KeyValue = (Vec<u8>, Vec<u8>);

/// Pending index writes of a group of commits, seen through one indexer's namespace.
pub struct IndexBatch<'a> {
    index: &'a Index,
    writes: &'a mut BTreeMap<Vec<u8>, Option<Vec<u8>>>,
    prefix: &'a [u8],
}

impl IndexBatch<'_> {
    fn full(&self, key: &[u8]) -> Vec<u8> {
        let mut k = Vec::with_capacity(self.prefix.len() + key.len());
        k.extend_from_slice(self.prefix);
        k.extend_from_slice(key);
        k
    }

    /// The value of `key`, seeing this batch's own pending writes first.
    pub fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        with_joined(&[self.prefix, key], |k| {
            if let Some(v) = self.writes.get(k) {
                return Ok(v.clone());
            }
            self.index.read_key(k)
        })
    }

    /// The value this batch has written for `key`, to change in place (`None`
    /// when the batch has not written it, or removed it): a value rewritten by
    /// each of a group's commits (a growing block) is then neither copied out
    /// nor written back each time.
    pub fn pending_mut(&mut self, key: &[u8]) -> Option<&mut Vec<u8>> {
        let writes = &mut *self.writes;
        with_joined(&[self.prefix, key], move |k| {
            writes.get_mut(k).and_then(Option::as_mut)
        })
    }

    /// [`IndexBatch::get`] handing the value to `f` in place instead of
    /// copying it out (for large values of which the caller reads a part).
    /// `f` may run under a read lock of the index's memtable: it must not
    /// use the index.
    pub fn get_with<T>(
        &self,
        key: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> T,
    ) -> Result<T, IndexError> {
        with_joined(&[self.prefix, key], |k| {
            if let Some(v) = self.writes.get(k) {
                return Ok(f(v.as_deref()));
            }
            self.index.read_key_with(k, f)
        })
    }

    pub fn insert(&mut self, key: &[u8], value: &[u8]) {
        self.insert_vec(key, value.to_vec());
    }

    /// [`IndexBatch::insert`] of a value the caller owns (it is kept as it is,
    /// not copied).
    pub fn insert_vec(&mut self, key: &[u8], value: Vec<u8>) {
        let k = self.full(key);
        self.writes.insert(k, Some(value));
    }

    pub fn remove(&mut self, key: &[u8]) {
        let k = self.full(key);
        self.writes.insert(k, None);
    }

    /// Every (key, value) whose key starts with `prefix`, pending writes applied, sorted.
    pub fn scan_prefix(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, IndexError> {
        let p = self.full(prefix);
        let mut out: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for kv in self.index.merged(&p) {
            let (k, v) = kv?;
            out.insert(k, v);
        }
        for (k, v) in self.writes.range(p.clone()..) {
            if !k.starts_with(&p) {
                break;
            }
            match v {
                Some(v) => out.insert(k.clone(), v.clone()),
                None => out.remove(k),
            };
        }
        let n = self.prefix.len();
        Ok(out.into_iter().map(|(k, v)| (k[n..].to_vec(), v)).collect())
    }
}

/// Where an index's visible entries stood, from [`Index::change_mark`]: two
/// equal settled marks taken around a read mean no change to the engine's or
/// the indexers' entries (not the cache) overlapped it, so whatever the read
/// found still stands. Marks of different [`Index`] instances never compare
/// equal (an instance is one open of the index in this process).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChangeMark {
    instance: u64,
    changes: u64,
}

impl ChangeMark {
    /// False while a change that is not made atomically under the memtable
    /// lock (a clear of the whole index) is in progress: two such marks that
    /// compare equal say nothing.
    pub fn is_settled(&self) -> bool {
        self.changes.is_multiple_of(2)
    }

    /// Which open of an index the mark is of (unique in the process).
    pub fn instance(&self) -> u64 {
        self.instance
    }

    /// The open's change count at the mark.
    pub fn changes(&self) -> u64 {
        self.changes
    }
}

/// The next [`Index`] instance's [`ChangeMark::instance`] (process-wide, so
/// an index reopened in place never repeats an earlier one's marks).
static NEXT_INDEX_INSTANCE: AtomicU64 = AtomicU64::new(1);

/// Read access to the derived indexes (from [`crate::Store::index`]).
pub struct Index {
    /// sled, under the memtables; `None` for an index over a checkpoint file (see
    /// [`Index::over_checkpoint`]), which never moves anything into sled.
    sled: Option<Sled>,
    /// The cache of an index with a directory: in sled, and in files beside it (see
    /// [`Index::put_cache`]).
    cache_dir: Option<cache_files::DirCache>,
    /// The cache entries of an index without a directory (over a checkpoint file, or
    /// a temporary one).
    cache_mem: Mutex<mem_cache::MemCache>,
    indexers: Vec<Arc<dyn Indexer>>,
    path: Option<PathBuf>,
    /// Applied writes not yet moved into sled (a memtable in front of it). Moving them in
    /// large batches, on another thread, keeps sled's own work off the append path;
    /// losing them in a crash only means a longer catch-up from the log on the next open.
    mem: RwLock<Mem>,
    /// A full memtable being moved into sled by a background thread; it sits between
    /// `mem` and sled for readers until sled has it.
    frozen: Arc<RwLock<Option<Arc<MemTable>>>>,
    /// When sled was last flushed by a move (see [`SLED_FLUSH_INTERVAL`]).
    sled_flushed_at: Arc<Mutex<std::time::Instant>>,
    /// The background move in progress, if any.
    moving: Mutex<Option<JoinHandle<Result<(), IndexError>>>>,
    /// The redo log of moves into sled (`None` for a temporary index, which no crash
    /// leaves behind).
    redo: Option<Arc<Mutex<RedoLog>>>,
    /// The indexers' keys that may exist: a read of a key it rules out skips sled (the
    /// reads of keys never written — a fresh entry id, a first child — are most of an
    /// append's index reads).
    keys: Arc<RwLock<Keys>>,
    /// The background scan adding sled's keys to `keys` after an open, and its stop flag.
    key_scan: Mutex<Option<JoinHandle<()>>>,
    key_scan_stop: Arc<AtomicBool>,
    /// This open's [`ChangeMark::instance`].
    instance: u64,
    /// Counts changes to the visible entries for [`Index::change_mark`]: each
    /// publish adds 2 under the memtable's write lock; a clear adds 1 before
    /// it starts and 1 once it is done (odd = a clear in progress).
    changes: AtomicU64,
    /// Held odd by a GC from its segment swap until its rebuild of this index ends:
    /// the public reads wait it out (see `gate.rs`).
    gate: gate::RebuildGate,
    /// sled's page cache this index was opened with (a reopen at close uses it too).
    cache_bytes: u64,
    /// A checkpoint file under everything else: under sled, which holds what changed
    /// since (an owner's index, see `delta.rs`), or in place of sled (a read-only open
    /// from a checkpoint: the memtable then holds every commit after it and is never
    /// moved, see [`Index::set_base`]).
    base: RwLock<Option<Arc<CheckpointFile>>>,
    /// The base's seq (0: none), shared with the checkpoint writer, which keeps it.
    base_seq: Arc<AtomicU64>,
    /// The next sled a clean close built (see `delta.rs`), which the drop swaps in.
    next: Mutex<Option<delta::NextSled>>,
    /// The runs of a bulk load, between the memtables and sled (see `spill.rs`); set
    /// once, by [`Index::start_spill`].
    spill: std::sync::OnceLock<Arc<spill::Runs>>,
    /// A read of the base failed (see [`Index::set_base_aside_if_failed`]), and the
    /// base was then renamed aside.
    base_failed: Arc<AtomicBool>,
    base_set_aside: AtomicBool,
    /// The last commit published (and the largest timestamp so far): where a
    /// checkpoint of what sled holds after a move ends.
    applied_at: Mutex<Option<AppliedAt>>,
    /// Called on the move thread after each move into sled, with sled (then holding
    /// exactly the commits up to the `AppliedAt`, as no other move runs): the store's
    /// background checkpoint.
    after_move: std::sync::OnceLock<AfterMove>,
    /// Bytes of keys and values moved into sled since the open, and whether the close
    /// may open sled once more to write its snapshot (see [`close`]).
    moved_bytes: AtomicU64,
    snapshot_at_close: AtomicBool,
    /// Holds background moves at their start (tests).
    #[cfg(test)]
    move_gate: Arc<MoveGate>,
}

/// sled's database and its main tree (engine and indexer keys).
pub(super) struct Sled {
    pub(super) db: sled::Db,
    pub(super) tree: sled::Tree,
}

/// See [`Index::set_after_move`]: called with the index's entries below the
/// memtables, sled over its base.
pub(crate) type AfterMove = Arc<dyn Fn(&SledView, &AppliedAt) + Send + Sync>;

/// sled over its base, as a checkpoint of the whole index reads it.
#[derive(Clone)]
pub(crate) struct SledView {
    pub(crate) tree: sled::Tree,
    pub(crate) base: Option<Arc<CheckpointFile>>,
    /// A bulk load's runs, above sled (see `spill.rs`).
    pub(crate) runs: Option<Arc<spill::Runs>>,
    pub(crate) base_failed: Arc<AtomicBool>,
}

impl SledView {
    /// A key's value (meta keys: sled's).
    pub(crate) fn get(&self, k: &[u8]) -> Result<Option<sled::IVec>, IndexError> {
        delta::get(
            &self.tree,
            self.base.as_deref(),
            self.runs.as_deref(),
            k,
            &self.base_failed,
        )
    }

    /// Every entry in key order.
    pub(crate) fn iter(&self) -> DeltaIter {
        DeltaIter::new(
            &self.tree,
            self.base.as_ref(),
            self.runs.as_deref(),
            Bound::Unbounded,
            Bound::Unbounded,
        )
        .noting_base_failures(self.base_failed.clone())
    }
}

/// The last commit applied to an index: its seq, commit id and position, and the
/// largest commit timestamp up to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct AppliedAt {
    pub seq: u64,
    pub commit_id: Uuid,
    pub position: LogPosition,
    pub last_ts: i64,
}

/// A gate that background moves wait at while it is closed (tests).
#[cfg(test)]
#[derive(Default)]
struct MoveGate {
    closed: Mutex<bool>,
    opened: std::sync::Condvar,
}

#[cfg(test)]
impl MoveGate {
    fn pass(&self) {
        let mut closed = self.closed.lock().unwrap_or_else(|e| e.into_inner());
        while *closed {
            closed = self.opened.wait(closed).unwrap_or_else(|e| e.into_inner());
        }
    }

    fn set_closed(&self, closed: bool) {
        *self.closed.lock().unwrap_or_else(|e| e.into_inner()) = closed;
        self.opened.notify_all();
    }
}

/// Every indexer key written through [`Index::apply`] since the index was opened and,
/// once `complete`, every indexer key sled held when it was opened: then a key it does
/// not contain is in no layer (keys reach sled only through the memtables, which only
/// `apply` writes). Until `complete` it answers nothing.
#[derive(Default)]
struct Keys {
    filter: KeyFilter,
    complete: bool,
}

/// Keys added to the filter per write lock by the open scan.
const KEY_SCAN_CHUNK: usize = 4096;

/// Adds every indexer key in sled and its base to `keys`, then marks it complete
/// (unless stopped or a read fails: the filter then stays unused).
fn scan_keys(view: &SledView, keys: &RwLock<Keys>, stop: &AtomicBool) {
    let mut pending: Vec<KeyHash> = Vec::with_capacity(KEY_SCAN_CHUNK);
    let add = |pending: &mut Vec<KeyHash>| {
        let mut k = keys.write().unwrap_or_else(|e| e.into_inner());
        for h in pending.drain(..) {
            k.filter.insert(h);
        }
    };
    let hi = scan::prefix_end(&[USER]).map_or(Bound::Unbounded, Bound::Excluded);
    let iter = DeltaIter::new(
        &view.tree,
        view.base.as_ref(),
        view.runs.as_deref(),
        Bound::Included(vec![USER]),
        hi,
    );
    for kv in iter {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        match kv {
            Ok((k, _)) => pending.push(KeyHash::of(&k)),
            Err(_) => return,
        }
        if pending.len() >= KEY_SCAN_CHUNK {
            add(&mut pending);
            if keys
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .filter
                .is_saturated()
            {
                // Past its memory bound the filter answers "maybe" for every key:
                // scanning on would only cost I/O.
                break;
            }
        }
    }
    add(&mut pending);
    keys.write().unwrap_or_else(|e| e.into_inner()).complete = true;
}

type Writes = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The text of a caught panic's payload.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// The indexers' writes for a group of commits, computed by [`Index::prepare`] and not
/// yet visible to readers, with the version blocks the group extends that the memtable
/// did not hold (key to value; empty when absent).
pub(crate) struct PreparedWrites {
    writes: Writes,
    blocks: foldhash::HashMap<Vec<u8>, Vec<u8>>,
}

/// A key and its new value (`None` = removed).
type PendingWrite = (Vec<u8>, Option<Vec<u8>>);

#[derive(Default)]
struct Mem {
    writes: MemTable,
    commits: usize,
    bytes: usize,
}

/// The least time between two flushes of sled by the background move.
const SLED_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Move the memtable into sled after this many commits ...
const MEM_COMMITS_MOVE: usize = 4096;
/// ... or this many bytes of keys and values, if the previous move has finished.
const MEM_BYTES_MOVE: usize = 8 << 20;
/// While the previous move still runs, the memtable takes more writes, up to this
/// many commits or bytes, instead of waiting for it. Waiting at every freeze left
/// the applier idle whenever one move ran a little longer than the commits that
/// filled the next memtable: in `handle_append 150000` (buffered, four runs), 8-14 %
/// of the appending thread's wall time went to those waits, 12-18 of the 36 freezes
/// waiting over a millisecond, while the move thread was busy for 78-87 % of the run.
const MEM_COMMITS_MAX: usize = 2 * MEM_COMMITS_MOVE;
/// See [`MEM_COMMITS_MAX`]: a memtable, live or frozen, holds at most about this many
/// bytes of keys and values (plus one group's).
const MEM_BYTES_MAX: usize = 2 * MEM_BYTES_MOVE;

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Index").field("path", &self.path).finish()
    }
}

/// How many times (50 ms apart) to retry opening a sled directory that is still locked.
const SLED_LOCK_WAIT_TRIES: u32 = 60;

fn is_sled_lock_error(e: &sled::Error) -> bool {
    matches!(e, sled::Error::Io(io) if io.to_string().contains("could not acquire lock"))
}

/// Remove sled's unfinished snapshot files (`snap.*.generating`) from `dir`; how many
/// were removed (see [`Index::open_db_repairing`]).
fn remove_unfinished_snapshots(dir: &Path) -> usize {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return 0;
    };
    rd.flatten()
        .filter(|e| {
            let name = e.file_name();
            let name = name.to_string_lossy();
            name.starts_with("snap.") && name.ends_with(".generating")
        })
        .filter(|e| std::fs::remove_file(e.path()).is_ok())
        .count()
}

/// Run `f`, a call into sled on the index's files, turning a panic into an error: sled
/// 0.34 panics on some damaged files (e.g. "tried to serialize Uninitialized") instead
/// of returning an error, and the index is derived data that a damaged file must only
/// cost a rebuild of, never the process.
pub(crate) fn sled_guard<T>(
    what: &str,
    f: impl FnOnce() -> Result<T, IndexError>,
) -> Result<T, IndexError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => Err(IndexError::Malformed(format!(
            "sled panicked {what}: {}",
            panic_message(&*p)
        ))),
    }
}

fn sled_err(e: sled::Error) -> Error {
    Error::Index(IndexError::Sled(e))
}

impl Drop for Index {
    fn drop(&mut self) {
        self.stop_key_scan();
        // sled must not outlive the Index through the mover thread: a reopen of the same
        // directory would find it still locked.
        let _ = self.join_moving();
        self.set_base_aside_if_failed();
        if !self.finish_rebase() {
            self.write_sled_snapshot();
        }
        if let (Some(runs), Some(p)) = (self.spill.get(), &self.path) {
            runs.clear();
            let _ = spill::remove_dir(p);
        }
        if let Some(p) = &self.path {
            tighten_permissions(p);
        }
    }
}

#[cfg(test)]
mod tests;
