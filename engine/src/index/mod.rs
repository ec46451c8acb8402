//! Derived indexes in sled: the engine's own (stream heads; stream+version -> position,
//! seq and commit id) and those of registered [`Indexer`]s. Commit ids have no key of
//! their own: one sled key per commit (random ids, no locality) was the write path's
//! main cost; a retry is found through its stream's version blocks instead.
//!
//! Everything lives in sled's default tree under namespaced keys. Commits reach sled
//! through a memtable, moved into sled whole together with the applied sequence number:
//! a move cut short by a crash is finished from its redo record on the next open (see
//! [`crate::index::redo`]), so sled never holds half of one. A separate
//! `cache` tree holds entries written outside commits; it is dropped on rebuild.
//!
//! sled is a cache: its flush is never relied on. On open the store checks the format,
//! the indexers' versions and the applied seq against the log and rebuilds or catches up.

pub(crate) mod bloom;
mod memtable;
pub(crate) mod redo;

use self::redo::RedoLog;
use crate::error::{Error, IndexError};
use crate::index::bloom::{KeyFilter, KeyHash};
use crate::index::memtable::{bound_ref, MemTable, Value};
use crate::types::{CommitInfo, LogPosition, RecordedCommit};
use std::collections::BTreeMap;
use std::ops::Bound;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;
use uuid::Uuid;

/// sled's page cache, in bytes (sled's own default is 1 GiB). sled keeps the nodes it
/// has read or written in memory up to about this much, so it bounds the index's share
/// of the process's memory however large the index grows; a smaller cache only means
/// more of sled's reads go to its files (and the OS page cache).
pub const INDEX_CACHE_BYTES_MAX: u64 = 64 << 20;

/// Version of the index layout; a different one in an existing index means rebuild.
pub const INDEX_FORMAT_VERSION: u32 = 2;

const META_FORMAT: &[u8] = b"\x00meta:format";
const META_APPLIED: &[u8] = b"\x00meta:applied";
/// Present only while a move into sled runs: names the move's record in the redo log
/// (see [`crate::index::redo`]).
const META_MOVING: &[u8] = b"\x00meta:moving";
const META_LAYOUT: &[u8] = b"\x00meta:layout";
const META_INDEXER: &[u8] = b"\x00meta:indexer:";
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

/// Longest joined key [`with_joined`] builds on the stack (longer ones are allocated).
const JOINED_KEY_STACK_BYTES: usize = 256;

/// Calls `f` with the concatenation of `parts`, built on the stack when it is short (a
/// point read needs the full key only for its lookups, so it need not allocate).
fn with_joined<R>(parts: &[&[u8]], f: impl FnOnce(&[u8]) -> R) -> R {
    let n: usize = parts.iter().map(|p| p.len()).sum();
    if n <= JOINED_KEY_STACK_BYTES {
        let mut buf = [0u8; JOINED_KEY_STACK_BYTES];
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        f(&buf[..n])
    } else {
        f(&parts.concat())
    }
}

fn user_prefix(ns: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(2 + ns.len());
    p.push(USER);
    p.push(ns.len().min(255) as u8);
    p.extend_from_slice(ns.as_bytes());
    p
}

/// Length of [`user_prefix`]`(ns)`.
fn user_prefix_len(ns: &str) -> usize {
    2 + ns.len()
}

/// `key` in indexer `ns`'s namespace.
fn user_key(ns: &str, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(user_prefix_len(ns) + key.len());
    k.push(USER);
    k.push(ns.len().min(255) as u8);
    k.extend_from_slice(ns.as_bytes());
    k.extend_from_slice(key);
    k
}

fn cache_prefix(ns: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(1 + ns.len());
    p.push(ns.len().min(255) as u8);
    p.extend_from_slice(ns.as_bytes());
    p
}

pub(crate) fn head_key(stream: &str) -> Vec<u8> {
    let mut k = HEAD.to_vec();
    k.extend_from_slice(stream.as_bytes());
    k
}

/// Stream versions per position block: one sled entry holds the positions of
/// `VERSIONS_PER_BLOCK` consecutive versions, so a busy stream costs sled one key write
/// per block instead of one per commit.
pub const VERSIONS_PER_BLOCK: u64 = 64;
/// Bytes per version in a block: position (16) + seq (8) + commit id (16). The commit
/// ids here are the only place the index keeps them: an idempotent retry is found by
/// scanning its stream's blocks (see `Store::append`).
const BLOCK_ENTRY_BYTES: usize = 40;

/// Key of the block holding `version` (1-based) of `stream`.
pub(crate) fn version_block_key(stream: &str, version: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(VERSION.len() + 1 + stream.len() + 8);
    write_version_block_key(&mut k, stream, version);
    k
}

/// [`version_block_key`] into a reused buffer.
fn write_version_block_key(k: &mut Vec<u8>, stream: &str, version: u64) {
    k.clear();
    k.extend_from_slice(VERSION);
    k.push(stream.len() as u8);
    k.extend_from_slice(stream.as_bytes());
    k.extend_from_slice(&(version.saturating_sub(1) / VERSIONS_PER_BLOCK).to_be_bytes());
}

/// One version's entry in a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockEntry {
    pub position: LogPosition,
    pub seq: u64,
    pub commit_id: Uuid,
}

impl BlockEntry {
    /// An all-zero entry: a version GC removed (a stream prefix).
    fn is_hole(&self) -> bool {
        self.position.offset == 0
    }
}

fn encode_block_entry(i: &CommitInfo) -> [u8; BLOCK_ENTRY_BYTES] {
    let mut e = [0u8; BLOCK_ENTRY_BYTES];
    e[..16].copy_from_slice(&i.position.to_bytes());
    e[16..24].copy_from_slice(&i.seq.to_be_bytes());
    e[24..].copy_from_slice(i.commit_id.as_bytes());
    e
}

/// Entry `i` of a block.
fn block_entry(block: &[u8], i: usize) -> Option<Result<BlockEntry, IndexError>> {
    let e = block.get(i * BLOCK_ENTRY_BYTES..(i + 1) * BLOCK_ENTRY_BYTES)?;
    let id: Option<[u8; 16]> = e[24..].try_into().ok();
    Some(
        match (LogPosition::from_bytes(&e[..16]), be_u64(&e[16..24]), id) {
            (Some(position), Some(seq), Some(id)) => Ok(BlockEntry {
                position,
                seq,
                commit_id: Uuid::from_bytes(id),
            }),
            _ => Err(IndexError::Malformed("stream version block".into())),
        },
    )
}

/// The head of a stream as the index records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHead {
    pub version: u64,
    pub seq: u64,
    pub position: LogPosition,
}

fn encode_head(i: &CommitInfo) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&i.version.to_be_bytes());
    b[8..16].copy_from_slice(&i.seq.to_be_bytes());
    b[16..].copy_from_slice(&i.position.to_bytes());
    b
}

fn be_u64(b: &[u8]) -> Option<u64> {
    let a: [u8; 8] = b.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(a))
}

fn decode_head(b: &[u8]) -> Result<StreamHead, IndexError> {
    let bad = || IndexError::Malformed(format!("stream head of {} bytes", b.len()));
    if b.len() != 32 {
        return Err(bad());
    }
    Ok(StreamHead {
        version: be_u64(&b[..8]).ok_or_else(bad)?,
        seq: be_u64(&b[8..16]).ok_or_else(bad)?,
        position: LogPosition::from_bytes(&b[16..]).ok_or_else(bad)?,
    })
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
    db: sled::Db,
    tree: sled::Tree,
    cache: sled::Tree,
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
    /// Holds background moves at their start (tests).
    #[cfg(test)]
    move_gate: Arc<MoveGate>,
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

/// Adds every indexer key in sled to `keys`, then marks it complete (unless stopped or
/// sled fails: the filter then stays unused).
fn scan_keys(tree: &sled::Tree, keys: &RwLock<Keys>, stop: &AtomicBool) {
    let mut pending: Vec<KeyHash> = Vec::with_capacity(KEY_SCAN_CHUNK);
    let add = |pending: &mut Vec<KeyHash>| {
        let mut k = keys.write().unwrap_or_else(|e| e.into_inner());
        for h in pending.drain(..) {
            k.filter.insert(h);
        }
    };
    for kv in tree.scan_prefix([USER]) {
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

fn sled_err(e: sled::Error) -> Error {
    Error::Index(IndexError::Sled(e))
}

impl Index {
    fn open_db(path: Option<&Path>) -> Result<sled::Db, sled::Error> {
        if let Some(p) = path {
            // The index directory is the owner's alone (sled picks its own file
            // modes; `tighten_permissions` fixes them up on open and close).
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(p);
        }
        let db = Self::open_db_inner(path);
        if let (Some(p), Ok(_)) = (path, &db) {
            tighten_permissions(p);
        }
        db
    }

    /// [`Index::open_db`], and once more without unfinished snapshot files if sled
    /// failed on them. sled 0.34 writes a snapshot to `snap.<lsn>.generating`, fsyncs
    /// it and renames it to `snap.<lsn>`, but on open takes the newest `snap.*` name,
    /// `.generating` included: a process killed while writing one leaves an index sled
    /// refuses as corrupt. Without it, sled recovers from the previous snapshot and its
    /// log, as it does after any crash. Only a directory the caller owns (the store's
    /// lock, or verify's private copy) is repaired.
    fn open_db_repairing(path: Option<&Path>) -> Result<sled::Db, sled::Error> {
        let first = Index::open_db(path);
        match (&first, path) {
            (Err(e), Some(p)) if !is_sled_lock_error(e) => {
                if remove_unfinished_snapshots(p) > 0 {
                    Index::open_db(path)
                } else {
                    first
                }
            }
            _ => first,
        }
    }

    pub(crate) fn open_db_inner(path: Option<&Path>) -> Result<sled::Db, sled::Error> {
        let cfg = sled::Config::new()
            // No flusher thread of sled's own: the index flushes sled itself, after a move
            // of the memtable at most once per `SLED_FLUSH_INTERVAL` and on close, always
            // inside an epoch pin (see `flush_sled`). sled 0.34 reads its current IO
            // buffer through a raw pointer it bumps the count of without pinning when it
            // flushes or rolls that buffer (its flusher thread, `Tree::flush`); another
            // thread that seals the buffer meanwhile defers freeing it to the epoch,
            // which can run the free before the count is bumped. The `store_open` fuzz
            // target hit that as a heap use-after-free under AddressSanitizer: a close's
            // `Tree::flush` read a buffer that another thread's roll had retired and
            // sled's IO thread freed. sled's own writes pin, so flushes that pin, and no
            // flusher thread of sled's, leave no unpinned reader of that pointer.
            .flush_every_ms(None)
            .cache_capacity(INDEX_CACHE_BYTES_MAX)
            .mode(sled::Mode::HighThroughput);
        match path {
            Some(p) => cfg.path(p).open(),
            None => cfg.temporary(true).open(),
        }
    }

    /// Open (or create) the index at `path` (`None` = a temporary index). Returns the index
    /// and whether it was (re)created empty. A missing, unreadable or outdated index is
    /// wiped.
    pub(crate) fn open(
        path: Option<&Path>,
        indexers: Vec<Arc<dyn Indexer>>,
    ) -> Result<(Index, bool), Error> {
        let mut opened = Index::open_db_repairing(path);
        // sled's own file lock: a handle closed a moment ago (sled releases it from its
        // background threads) or, misconfigured, another store on the same directory.
        // Wait a little for the former; never wipe an index someone holds.
        let mut waited = 0;
        while matches!(&opened, Err(e) if is_sled_lock_error(e)) && waited < SLED_LOCK_WAIT_TRIES {
            std::thread::sleep(std::time::Duration::from_millis(50));
            waited += 1;
            opened = Index::open_db_repairing(path);
        }
        let db = match opened {
            Ok(db) => db,
            Err(e) if is_sled_lock_error(&e) => return Err(sled_err(e)),
            Err(_) if path.is_some() => {
                Index::wipe_dir(path)?;
                Index::open_db(path).map_err(sled_err)?
            }
            Err(e) => return Err(sled_err(e)),
        };
        let mut ix = Index::from_db(db, indexers.clone(), path)?;
        // A move cut short that cannot be finished leaves keys of two states: only a
        // rebuild from the log gives a consistent index again.
        let whole = match ix.finish_cut_move() {
            Ok(()) => true,
            Err(_) if path.is_some() => false,
            Err(e) => return Err(e),
        };
        if whole && ix.is_current()? {
            ix.start_key_scan();
            return Ok((ix, false));
        }
        if path.is_some() && (!whole || !ix.tree.is_empty()) {
            drop(ix);
            Index::wipe_dir(path)?;
            ix = Index::from_db(Index::open_db(path).map_err(sled_err)?, indexers, path)?;
        }
        ix.init_meta(0)?;
        // Empty: every indexer key will come through `apply`.
        ix.keys.write().unwrap_or_else(|e| e.into_inner()).complete = true;
        Ok((ix, true))
    }

    /// Open an existing index as it is (no wipe); `None` if it has another format.
    pub(crate) fn open_existing(path: &Path) -> Result<Option<Index>, Error> {
        let db = Index::open_db_repairing(Some(path)).map_err(sled_err)?;
        let ix = Index::from_db(db, Vec::new(), Some(path))?;
        ix.finish_cut_move()?;
        let format = ix.tree.get(META_FORMAT).map_err(sled_err)?;
        if format.as_deref() != Some(&INDEX_FORMAT_VERSION.to_be_bytes()[..]) {
            return Ok(None);
        }
        Ok(Some(ix))
    }

    fn from_db(
        db: sled::Db,
        indexers: Vec<Arc<dyn Indexer>>,
        path: Option<&Path>,
    ) -> Result<Index, Error> {
        let tree: sled::Tree = (*db).clone();
        let cache = db.open_tree("cache").map_err(sled_err)?;
        let redo = match path {
            Some(p) => Some(Arc::new(Mutex::new(RedoLog::open(p)?))),
            None => None,
        };
        Ok(Index {
            db,
            tree,
            cache,
            indexers,
            path: path.map(Path::to_path_buf),
            mem: RwLock::new(Mem::default()),
            frozen: Arc::new(RwLock::new(None)),
            sled_flushed_at: Arc::new(Mutex::new(std::time::Instant::now())),
            moving: Mutex::new(None),
            redo,
            keys: Arc::new(RwLock::new(Keys::default())),
            key_scan: Mutex::new(None),
            key_scan_stop: Arc::new(AtomicBool::new(false)),
            instance: NEXT_INDEX_INSTANCE.fetch_add(1, Ordering::Relaxed),
            changes: AtomicU64::new(0),
            #[cfg(test)]
            move_gate: Arc::default(),
        })
    }

    /// Starts filling the key filter from sled in the background (reads use sled until
    /// it is done). Without a thread the filter stays unused.
    fn start_key_scan(&self) {
        let tree = self.tree.clone();
        let keys = self.keys.clone();
        let stop = self.key_scan_stop.clone();
        if let Ok(h) = std::thread::Builder::new()
            .name("spool-index-keys".into())
            .spawn(move || scan_keys(&tree, &keys, &stop))
        {
            *self.key_scan.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        }
    }

    /// Stops the open scan (if it still runs) and waits for it.
    fn stop_key_scan(&self) {
        self.key_scan_stop.store(true, Ordering::Relaxed);
        let h = self
            .key_scan
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(h) = h {
            let _ = h.join();
        }
    }

    /// Finish the move into sled that a crash cut short, if sled's log ends inside one:
    /// apply its writes again from the redo log, remove the marker and flush sled, then
    /// empty the redo log. An error means the move cannot be finished (its record is
    /// missing or damaged) and the index is unusable as it is.
    fn finish_cut_move(&self) -> Result<(), Error> {
        let Some(redo) = &self.redo else {
            return Ok(());
        };
        let mut redo = redo.lock().unwrap_or_else(|e| e.into_inner());
        let Some(marker) = self.tree.get(META_MOVING).map_err(sled_err)? else {
            // Every move sled holds is whole. After a kill its files may still be only
            // in the page cache, where a power loss could yet cut a move: the records
            // go once sled has been flushed (nothing to do after a clean close, which
            // empties the redo log).
            if !redo.is_empty() {
                flush_sled(&self.tree).map_err(sled_err)?;
                redo.clear()?;
            }
            return Ok(());
        };
        let body = redo.find(&marker)?.ok_or_else(|| {
            Error::Index(IndexError::Malformed(format!(
                "a move into the index was cut short and {} does not hold its record",
                redo.path().display()
            )))
        })?;
        let malformed = |(at, what): (u64, String)| {
            Error::Index(IndexError::Malformed(format!(
                "{}: the record of the move cut short, offset {at} of its body: {what}",
                redo.path().display()
            )))
        };
        // Checked whole before anything is applied, then applied from the body in
        // place (no copy of the writes: the body is all the memory this takes).
        redo::for_each_write(&body, |_, _| {}).map_err(malformed)?;
        let mut applied = Ok(());
        redo::for_each_write(&body, |k, v| {
            if applied.is_ok() {
                applied = match v {
                    Some(v) => self.tree.insert(k, v).map(|_| ()),
                    None => self.tree.remove(k).map(|_| ()),
                };
            }
        })
        .map_err(malformed)?;
        applied.map_err(sled_err)?;
        self.tree.remove(META_MOVING).map_err(sled_err)?;
        // Durable before the record goes: a crash in between finds the marker again.
        flush_sled(&self.tree).map_err(sled_err)?;
        redo.clear()?;
        Ok(())
    }

    fn wipe_dir(path: Option<&Path>) -> Result<(), Error> {
        if let Some(p) = path {
            match std::fs::remove_dir_all(p) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => return Err(Error::io(p, "remove_dir_all", e)),
            }
        }
        Ok(())
    }

    /// Whether the index has this build's format and the configured indexers' versions.
    fn is_current(&self) -> Result<bool, Error> {
        let format = self.read_key(META_FORMAT)?;
        if format.as_deref() != Some(&INDEX_FORMAT_VERSION.to_be_bytes()[..]) {
            return Ok(false);
        }
        let mut stored: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for kv in self.tree.scan_prefix(META_INDEXER) {
            let (k, v) = kv.map_err(sled_err)?;
            stored.insert(k[META_INDEXER.len()..].to_vec(), v.to_vec());
        }
        let mut wanted: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for ix in &self.indexers {
            wanted.insert(
                ix.name().as_bytes().to_vec(),
                ix.version().to_be_bytes().to_vec(),
            );
        }
        if stored != wanted {
            return Ok(false);
        }
        Ok(self.read_key(META_APPLIED)?.is_some())
    }

    /// Write the meta keys of an empty index built from a log with layout id `layout`.
    fn init_meta(&self, layout: u64) -> Result<(), Error> {
        let mut b = sled::Batch::default();
        b.insert(META_FORMAT, &INDEX_FORMAT_VERSION.to_be_bytes()[..]);
        b.insert(META_APPLIED, &0u64.to_be_bytes()[..]);
        b.insert(META_LAYOUT, &layout.to_be_bytes()[..]);
        for ix in &self.indexers {
            let mut k = META_INDEXER.to_vec();
            k.extend_from_slice(ix.name().as_bytes());
            b.insert(k, &ix.version().to_be_bytes()[..]);
        }
        self.tree.apply_batch(b).map_err(sled_err)
    }

    /// Drop every entry (engine, indexers and cache) and start empty, for a log with
    /// layout id `layout` (the largest id of a segment written by GC; 0 if none).
    pub(crate) fn clear(&self, layout: u64) -> Result<(), Error> {
        // Unsettled until the clear is done, however it ends: the entries
        // change over many steps, not under one lock.
        self.changes.fetch_add(1, Ordering::SeqCst);
        let cleared = self.clear_entries(layout);
        self.changes.fetch_add(1, Ordering::SeqCst);
        cleared
    }

    fn clear_entries(&self, layout: u64) -> Result<(), Error> {
        // A failed background move does not matter: everything is dropped.
        let _ = self.join_moving();
        *self.mem.write().unwrap_or_else(|e| e.into_inner()) = Mem::default();
        *self.frozen.write().unwrap_or_else(|e| e.into_inner()) = None;
        self.tree.clear().map_err(sled_err)?;
        self.cache.clear().map_err(sled_err)?;
        if let Some(redo) = &self.redo {
            // The records describe moves sled may not hold durably yet: they go only
            // once sled holds the clear (a crash before finds the old keys and them).
            flush_sled(&self.tree).map_err(sled_err)?;
            redo.lock().unwrap_or_else(|e| e.into_inner()).clear()?;
        }
        // Empty: every indexer key will come through `apply` (the filter's older keys
        // only cost lookups).
        self.keys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .complete = true;
        self.init_meta(layout)
    }

    /// The layout id of the log the index was built from (positions are only valid for
    /// that arrangement of segments). Absent = 0.
    pub(crate) fn layout(&self) -> Result<u64, Error> {
        match self.read_key(META_LAYOUT)? {
            Some(v) => {
                be_u64(&v).ok_or_else(|| Error::Index(IndexError::Malformed("layout id".into())))
            }
            None => Ok(0),
        }
    }

    /// The last seq whose commit is in the index.
    pub fn applied_seq(&self) -> Result<u64, Error> {
        Ok(self.applied_marker()?.0)
    }

    /// The applied seq and the commit id of that commit (which must match the log's
    /// record with that seq, or the index describes another history).
    pub(crate) fn applied_marker(&self) -> Result<(u64, Option<Uuid>), Error> {
        let bad = || Error::Index(IndexError::Malformed("applied seq".into()));
        match self.read_key(META_APPLIED)? {
            Some(v) => {
                let seq = be_u64(&v).ok_or_else(bad)?;
                let id = match v.get(8..24) {
                    Some(b) => Some(Uuid::from_slice(b).map_err(|_| bad())?),
                    None => None,
                };
                Ok((seq, id))
            }
            None => Ok((0, None)),
        }
    }

    /// Apply `commits` (consecutive, in seq order) to the memtable, together with the
    /// new applied seq; a full memtable moves into sled whole (see [`crate::index::redo`]).
    pub(crate) fn apply(&self, commits: &[RecordedCommit]) -> Result<(), IndexError> {
        let writes = self.prepare(commits)?;
        self.publish(commits, writes)
    }

    /// The registered indexers' writes for `commits` (consecutive, in seq order, the
    /// next after everything published), computed without changing what readers see:
    /// the indexers read the index through a batch that shows its own pending writes
    /// first. Only [`Index::publish`] makes them visible, so this may run while the
    /// commits are not yet durable (during their fdatasync); the caller must not
    /// publish anything else in between, or the writes would be computed from a
    /// stale index.
    pub(crate) fn prepare(&self, commits: &[RecordedCommit]) -> Result<PreparedWrites, IndexError> {
        let mut writes: Writes = BTreeMap::new();
        let prefixes: Vec<Vec<u8>> = self
            .indexers
            .iter()
            .map(|ix| user_prefix(ix.name()))
            .collect();
        for c in commits {
            for (ix, prefix) in self.indexers.iter().zip(&prefixes) {
                let mut batch = IndexBatch {
                    index: self,
                    writes: &mut writes,
                    prefix,
                };
                // A panicking indexer becomes the group's error (which poisons the
                // store's writes) instead of unwinding through the group's leader,
                // which would leave the writers behind it waiting for an
                // acknowledgement that never comes. Nothing shared is half-changed:
                // the batch's writes are this call's own and are dropped.
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| ix.apply(c, &mut batch)))
                    .unwrap_or_else(|panic| {
                        Err(IndexError::indexer(
                            ix.name(),
                            format!(
                                "panicked on commit {} of stream {:?}: {}",
                                c.info.seq,
                                c.info.stream,
                                panic_message(panic.as_ref())
                            ),
                        ))
                    })?;
            }
        }
        // The version blocks `publish` extends that only sled or the frozen memtable
        // hold: read here, off the memtable's write lock (a sled read waits for a move
        // into sled to finish). A block's first version needs no read.
        let mut blocks: foldhash::HashMap<Vec<u8>, Vec<u8>> = foldhash::HashMap::default();
        let mut key = Vec::with_capacity(64);
        for c in commits {
            let i = &c.info;
            if (i.version - 1) % VERSIONS_PER_BLOCK == 0 {
                continue;
            }
            write_version_block_key(&mut key, &i.stream, i.version);
            if blocks.contains_key(&key) {
                continue;
            }
            let in_mem = self
                .mem
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .writes
                .get(key.as_slice())
                .is_some();
            if !in_mem {
                let block = self.read_below_mem(&key)?.unwrap_or_default();
                blocks.insert(key.clone(), block);
            }
        }
        Ok(PreparedWrites { writes, blocks })
    }

    /// Make `commits` visible: their engine keys (stream heads, version blocks), the
    /// indexers' `writes` from [`Index::prepare`] of the same commits, and the new
    /// applied seq go into the memtable under one lock; a full memtable moves into
    /// sled whole (see [`crate::index::redo`]).
    pub(crate) fn publish(
        &self,
        commits: &[RecordedCommit],
        writes: PreparedWrites,
    ) -> Result<(), IndexError> {
        let Some(last) = commits.last() else {
            return Ok(());
        };
        let PreparedWrites { writes, mut blocks } = writes;
        let (past_move_bound, past_max_bound) = {
            let mut guard = self.mem.write().unwrap_or_else(|e| e.into_inner());
            let mem = &mut *guard;
            let mut key = Vec::with_capacity(64);
            for c in commits {
                let i = &c.info;
                // The head, overwritten in place when the memtable has it.
                key.clear();
                key.extend_from_slice(HEAD);
                key.extend_from_slice(i.stream.as_bytes());
                let head = encode_head(i);
                match mem.writes.get_mut(key.as_slice()) {
                    Some(Some(v)) if v.len() == head.len() => v.copy_from_slice(&head),
                    _ => {
                        mem.bytes += key.len() + head.len();
                        mem.writes.insert(&key, Some(head.to_vec()));
                    }
                }
                // Versions are contiguous (from 1, or from where GC removed a prefix of
                // the stream: those slots stay zero), so the block holds exactly the
                // versions before this one in its range: append the entry at its slot,
                // in place when the memtable has the block.
                write_version_block_key(&mut key, &i.stream, i.version);
                let slot = ((i.version - 1) % VERSIONS_PER_BLOCK) as usize * BLOCK_ENTRY_BYTES;
                let entry = encode_block_entry(i);
                if let Some(Some(block)) = mem.writes.get_mut(key.as_slice()) {
                    let before = block.len();
                    block.resize(slot, 0);
                    block.extend_from_slice(&entry);
                    mem.bytes += block.len().saturating_sub(before);
                } else {
                    // The first version of a block has no earlier ones to keep; the
                    // others were read by `prepare`.
                    let mut block = if slot == 0 {
                        Vec::new()
                    } else {
                        match blocks.remove(key.as_slice()) {
                            Some(b) => b,
                            None => self.read_below_mem(&key)?.unwrap_or_default(),
                        }
                    };
                    block.resize(slot, 0);
                    block.extend_from_slice(&entry);
                    mem.bytes += key.len() + block.len();
                    mem.writes.insert(&key, Some(block));
                }
            }
            {
                // Known to the filter before any reader can find them only in sled (both
                // locks are held until every write is in). A key the memtable holds with
                // a value is in the filter already: it went in when that value did, and
                // keys never leave the filter. Most of an append's writes rewrite such
                // keys (its parent's record, the session's meta, the path block), and
                // each filter insert touches a cache line of its own.
                let mut keys = self.keys.write().unwrap_or_else(|e| e.into_inner());
                for (k, v) in writes {
                    let is_value = v.is_some();
                    // Count what the memtable holds: a key written again (a block
                    // rewritten by every append, a meta record) replaces its pending
                    // value, so only the difference is added.
                    let size = k.len() + v.as_ref().map_or(0, Vec::len);
                    mem.bytes = mem.bytes.saturating_add(size);
                    let had_value = match mem.writes.insert(&k, v) {
                        Some(old) => {
                            mem.bytes = mem
                                .bytes
                                .saturating_sub(k.len() + old.as_ref().map_or(0, Vec::len));
                            old.is_some()
                        }
                        None => false,
                    };
                    if is_value && !had_value {
                        keys.filter.insert(KeyHash::of(&k));
                    }
                    debug_assert!(
                        !is_value || keys.filter.may_contain(KeyHash::of(&k)),
                        "a key with a value in the memtable is in the filter"
                    );
                }
            }
            let mut marker = [0u8; 24];
            marker[..8].copy_from_slice(&last.info.seq.to_be_bytes());
            marker[8..].copy_from_slice(last.info.commit_id.as_bytes());
            match mem.writes.get_mut(META_APPLIED) {
                Some(Some(v)) if v.len() == marker.len() => v.copy_from_slice(&marker),
                _ => {
                    mem.writes.insert(META_APPLIED, Some(marker.to_vec()));
                }
            }
            mem.commits += commits.len();
            // Under the write lock: a reader that sees any of these writes
            // (through the read lock) sees this count too.
            self.changes.fetch_add(2, Ordering::SeqCst);
            (
                mem.commits >= MEM_COMMITS_MOVE || mem.bytes >= MEM_BYTES_MOVE,
                mem.commits >= MEM_COMMITS_MAX || mem.bytes >= MEM_BYTES_MAX,
            )
        };
        if past_max_bound || (past_move_bound && !self.move_running()) {
            // Wait for the previous move (back-pressure: it runs on only past the
            // `_MAX` bounds) and report its failure.
            self.join_moving()?;
            let writes = self.freeze();
            let tree = self.tree.clone();
            let frozen = self.frozen.clone();
            let flushed_at = self.sled_flushed_at.clone();
            let redo = self.redo.clone();
            #[cfg(test)]
            let gate = self.move_gate.clone();
            let spawned = std::thread::Builder::new()
                .name("spool-index".into())
                .spawn(move || {
                    #[cfg(test)]
                    gate.pass();
                    move_into_sled(&tree, &frozen, &flushed_at, redo.as_deref(), &writes)
                });
            match spawned {
                Ok(h) => *self.moving.lock().unwrap_or_else(|e| e.into_inner()) = Some(h),
                Err(_) => {
                    let writes = self
                        .frozen
                        .read()
                        .unwrap_or_else(|e| e.into_inner())
                        .clone();
                    if let Some(w) = writes {
                        move_into_sled(
                            &self.tree,
                            &self.frozen,
                            &self.sled_flushed_at,
                            self.redo.as_deref(),
                            &w,
                        )?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Bytes the memtable counts (tests).
    #[cfg(test)]
    pub(crate) fn mem_bytes(&self) -> usize {
        self.mem.read().unwrap_or_else(|e| e.into_inner()).bytes
    }

    /// Move the memtable into sled as a crash after `writes` of its writes would leave
    /// it, and make that durable in sled (tests; the index must be dropped next).
    #[cfg(test)]
    pub(crate) fn cut_move_for_tests(&self, writes: usize) {
        self.join_moving().unwrap();
        let frozen = self.freeze();
        write_move(&self.tree, self.redo.as_deref(), &frozen, Some(writes)).unwrap();
        flush_sled(&self.tree).unwrap();
    }

    /// Drop the memtable's writes as a crash would (tests).
    #[cfg(test)]
    pub(crate) fn forget_memtable(&self) {
        let _ = self.join_moving();
        let mut mem = self.mem.write().unwrap_or_else(|e| e.into_inner());
        *mem = Mem::default();
        self.changes.fetch_add(2, Ordering::SeqCst);
    }

    /// Make the memtable the frozen one (the caller has joined any previous move).
    fn freeze(&self) -> Arc<MemTable> {
        let mut mem = self.mem.write().unwrap_or_else(|e| e.into_inner());
        let mut frozen = self.frozen.write().unwrap_or_else(|e| e.into_inner());
        let keys = mem.writes.len();
        let writes = Arc::new(std::mem::take(&mut mem.writes));
        *mem = Mem {
            writes: MemTable::with_capacity(keys),
            ..Mem::default()
        };
        *frozen = Some(writes.clone());
        writes
    }

    /// Whether the background move into sled is still running.
    fn move_running(&self) -> bool {
        self.moving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// Wait for the background move into sled, if one runs; its result.
    fn join_moving(&self) -> Result<(), IndexError> {
        let h = self.moving.lock().unwrap_or_else(|e| e.into_inner()).take();
        match h {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(IndexError::Mismatch("index thread panicked".into()))),
            None => Ok(()),
        }
    }

    /// Move every pending write into sled now (on open and close). Only the single
    /// applier (the group leader, or open/close) calls this and `apply`, so they never
    /// run concurrently.
    pub(crate) fn flush_mem(&self) -> Result<(), IndexError> {
        self.join_moving()?;
        if self
            .mem
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .writes
            .is_empty()
        {
            return Ok(());
        }
        let writes = self.freeze();
        move_into_sled(
            &self.tree,
            &self.frozen,
            &self.sled_flushed_at,
            self.redo.as_deref(),
            &writes,
        )
    }

    /// A key's value in the frozen memtable or sled (the caller holds the memtable).
    fn read_below_mem(&self, k: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        if let Some(f) = self
            .frozen
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
        {
            if let Some(v) = f.get(k) {
                return Ok(v.clone());
            }
        }
        Ok(self.tree.get(k)?.map(|v| v.to_vec()))
    }

    /// A key's value: the memtable, the frozen memtable, then sled — unless the key
    /// filter rules an indexer key out. It may: `apply` adds a key to the filter
    /// (under the memtable's write lock) before the key enters the memtable, and keys
    /// reach the frozen memtable and sled only from there, so a key the complete filter
    /// does not contain is in no layer. It is asked after the memtable, a hash lookup
    /// where most of an append's reads hit (its filter lookup, a likely cache miss in
    /// a large filter, was ~4 % of a buffered append), and spares a miss (a fresh
    /// entry id, a first child) the frozen memtable's lookup and sled's.
    fn read_key(&self, k: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        self.read_key_with(k, |v| v.map(<[u8]>::to_vec))
    }

    /// [`Index::read_key`] handing the value to `f` in place (under the
    /// memtable's read lock when the value is there).
    fn read_key_with<T>(
        &self,
        k: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> T,
    ) -> Result<T, IndexError> {
        {
            let mem = self.mem.read().unwrap_or_else(|e| e.into_inner());
            if let Some(v) = mem.writes.get(k) {
                return Ok(f(v.as_deref()));
            }
        }
        if k.first() == Some(&USER) {
            let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
            if keys.complete && !keys.filter.may_contain(KeyHash::of(k)) {
                return Ok(f(None));
            }
        }
        {
            let frozen = self.frozen.read().unwrap_or_else(|e| e.into_inner());
            if let Some(v) = frozen.as_ref().and_then(|w| w.get(k)) {
                return Ok(f(v.as_deref()));
            }
        }
        Ok(f(self.tree.get(k)?.as_deref()))
    }

    /// Entries with keys starting with `prefix`, memtables
    /// merged over sled, in key order.
    fn merged(&self, prefix: &[u8]) -> MergeIter {
        self.merged_from(prefix, prefix)
    }

    /// Like [`Index::merged`], starting at key `from` (which starts with `prefix`).
    fn merged_from(&self, prefix: &[u8], from: &[u8]) -> MergeIter {
        let hi = match prefix_end(prefix) {
            Some(end) => Bound::Excluded(end),
            None => Bound::Unbounded,
        };
        let lo = Bound::Included(from.to_vec());
        // Put the live memtable's new keys in order first (see `crate::memtable`):
        // keys written between this and the snapshot below are sorted by the
        // snapshot's range read itself.
        let pending = self
            .mem
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .writes
            .pending_len();
        if pending > 0 {
            self.mem
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .writes
                .settle();
        }
        // Snapshot the memtable over the frozen one (lock order: mem, then frozen).
        let mem: Vec<PendingWrite> = {
            let mem = self.mem.read().unwrap_or_else(|e| e.into_inner());
            let frozen = self.frozen.read().unwrap_or_else(|e| e.into_inner());
            let in_range = |w: &MemTable| -> Vec<PendingWrite> {
                w.range(bound_ref(&lo), bound_ref(&hi))
                    .take_while(|(k, _)| k.starts_with(prefix))
                    .map(|(k, v)| (k.to_vec(), v.clone()))
                    .collect()
            };
            match frozen.as_ref() {
                None => in_range(&mem.writes),
                Some(f) => {
                    let mut snap: Writes = BTreeMap::new();
                    for src in [&**f, &mem.writes] {
                        for (k, v) in src
                            .range(bound_ref(&lo), bound_ref(&hi))
                            .take_while(|(k, _)| k.starts_with(prefix))
                        {
                            snap.insert(k.to_vec(), v.clone());
                        }
                    }
                    snap.into_iter().collect()
                }
            }
        };
        MergeIter {
            mem: mem.into_iter().peekable(),
            sled: self.tree.range((lo, hi)),
            sled_peek: None,
            sled_done: false,
            prefix: prefix.to_vec(),
            done: false,
        }
    }

    /// The head of `stream`, `None` if it does not exist.
    pub fn stream_head(&self, stream: &str) -> Result<Option<StreamHead>, Error> {
        match self.read_key(&head_key(stream))? {
            Some(v) => Ok(Some(decode_head(&v)?)),
            None => Ok(None),
        }
    }

    /// Where version `version` of `stream` is in the log.
    pub fn stream_position(
        &self,
        stream: &str,
        version: u64,
    ) -> Result<Option<LogPosition>, Error> {
        Ok(self.stream_entry(stream, version)?.map(|e| e.position))
    }

    /// The index entry of version `version` of `stream`.
    pub(crate) fn stream_entry(
        &self,
        stream: &str,
        version: u64,
    ) -> Result<Option<BlockEntry>, Error> {
        if version == 0 {
            return Ok(None);
        }
        let Some(block) = self.read_key(&version_block_key(stream, version))? else {
            return Ok(None);
        };
        match block_entry(&block, ((version - 1) % VERSIONS_PER_BLOCK) as usize) {
            Some(e) => Ok(Some(e?).filter(|e| !e.is_hole())),
            None => Ok(None),
        }
    }

    /// The version and position of the commit with `id` in `stream`, searching from the
    /// stream's head version `head` backwards (one index read per 64 versions).
    pub(crate) fn find_in_stream(
        &self,
        stream: &str,
        head: u64,
        id: Uuid,
    ) -> Result<Option<(u64, LogPosition)>, Error> {
        if head == 0 {
            return Ok(None);
        }
        let mut block_no = (head - 1) / VERSIONS_PER_BLOCK;
        loop {
            let first = block_no * VERSIONS_PER_BLOCK + 1;
            if let Some(block) = self.read_key(&version_block_key(stream, first))? {
                let n = block.len() / BLOCK_ENTRY_BYTES;
                for i in (0..n).rev() {
                    if let Some(e) = block_entry(&block, i) {
                        let e = e?;
                        if e.commit_id == id && !e.is_hole() {
                            return Ok(Some((first + i as u64, e.position)));
                        }
                    }
                }
            }
            if block_no == 0 {
                return Ok(None);
            }
            block_no -= 1;
        }
    }

    /// The stream, version and position of the commit with `id`, searching every
    /// stream's blocks (a full pass over the version index: only for the rare case of a
    /// commit id the filter knows that is not on the stream it was retried on).
    pub(crate) fn find_anywhere(
        &self,
        id: Uuid,
    ) -> Result<Option<(String, u64, LogPosition)>, Error> {
        for kv in self.merged(VERSION) {
            let (k, block) = kv?;
            let bad = || Error::Index(IndexError::Malformed("stream version block key".into()));
            let len = *k.get(VERSION.len()).ok_or_else(bad)? as usize;
            let s0 = VERSION.len() + 1;
            let stream = k.get(s0..s0 + len).ok_or_else(bad)?;
            let block_no = be_u64(k.get(s0 + len..).ok_or_else(bad)?).ok_or_else(bad)?;
            let mut i = 0;
            while let Some(e) = block_entry(&block, i) {
                let e = e?;
                if e.commit_id == id && !e.is_hole() {
                    let stream = String::from_utf8(stream.to_vec()).map_err(|_| bad())?;
                    let version = block_no * VERSIONS_PER_BLOCK + 1 + i as u64;
                    return Ok(Some((stream, version, e.position)));
                }
                i += 1;
            }
        }
        Ok(None)
    }

    /// Positions of `stream`'s versions `>= from`, ascending, at most `limit`.
    pub(crate) fn stream_positions(
        &self,
        stream: &str,
        from: u64,
        limit: usize,
    ) -> Result<Vec<(u64, LogPosition)>, Error> {
        let from = from.max(1);
        let start = version_block_key(stream, from);
        let prefix = &start[..start.len() - 8];
        let mut out = Vec::new();
        for kv in self.merged_from(prefix, &start) {
            let (k, block) = kv?;
            let bad = || Error::Index(IndexError::Malformed("stream version block".into()));
            let block_no = be_u64(&k[k.len().saturating_sub(8)..]).ok_or_else(bad)?;
            let first = block_no
                .checked_mul(VERSIONS_PER_BLOCK)
                .and_then(|v| v.checked_add(1))
                .ok_or_else(bad)?;
            let mut i = 0;
            while let Some(e) = block_entry(&block, i) {
                let version = first + i as u64;
                i += 1;
                if version < from {
                    continue;
                }
                let e = e?;
                if e.is_hole() {
                    // A version GC removed (a stream prefix): no record.
                    continue;
                }
                if out.len() >= limit {
                    return Ok(out);
                }
                out.push((version, e.position));
            }
        }
        Ok(out)
    }

    /// Every stream with its head version, sorted by name.
    pub fn streams(&self) -> Result<Vec<(String, u64)>, Error> {
        let mut out = Vec::new();
        for kv in self.merged(HEAD) {
            let (k, v) = kv?;
            let name = String::from_utf8(k[HEAD.len()..].to_vec())
                .map_err(|_| IndexError::Malformed("stream name".into()))?;
            out.push((name, decode_head(&v)?.version));
        }
        Ok(out)
    }

    /// Where the visible entries stand (see [`ChangeMark`]). Take one before
    /// a read and one after: if they are equal and settled, no commit was
    /// published and no rebuild ran in between. A commit published later
    /// changes the mark; moving the memtable into sled does not (it changes
    /// where entries are kept, not what they are).
    pub fn change_mark(&self) -> ChangeMark {
        ChangeMark {
            instance: self.instance,
            changes: self.changes.load(Ordering::SeqCst),
        }
    }

    /// An indexer's entry.
    pub fn get(&self, ns: &str, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        let head = [USER, ns.len().min(255) as u8];
        Ok(with_joined(&[&head, ns.as_bytes(), key], |k| {
            self.read_key(k)
        })?)
    }

    /// [`Index::get`] handing the value to `f` in place instead of copying
    /// it out (for large values of which the caller reads a part). `f` may
    /// run under a read lock of the memtable: it must not use the index.
    pub fn get_with<T>(
        &self,
        ns: &str,
        key: &[u8],
        f: impl FnOnce(Option<&[u8]>) -> T,
    ) -> Result<T, Error> {
        let head = [USER, ns.len().min(255) as u8];
        Ok(with_joined(&[&head, ns.as_bytes(), key], |k| {
            self.read_key_with(k, f)
        })?)
    }

    /// An indexer's entries whose keys start with `prefix` (keys without the namespace).
    pub fn scan_prefix(&self, ns: &str, prefix: &[u8]) -> IndexScan {
        let p = user_key(ns, prefix);
        IndexScan {
            iter: ScanSource::Merged(self.merged(&p)),
            strip: user_prefix_len(ns),
        }
    }

    /// Calls `f` with each of an indexer's entries whose key starts with `prefix` (the
    /// key without the namespace, and the value), in key order, as
    /// [`Index::scan_prefix`] yields them but without copying them out of sled; stops
    /// early when `f` returns `false`.
    pub fn visit_prefix(
        &self,
        ns: &str,
        prefix: &[u8],
        f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), Error> {
        self.visit_range(ns, prefix, prefix, f)
    }

    /// Like [`Index::visit_prefix`], starting at the first key `>= from` (keys without
    /// the namespace): a range-from scan, so a reader that wants the entries after some
    /// key within a prefix does not step over the ones before it. A `from` below the
    /// prefix starts at the prefix; one past it visits nothing.
    pub fn visit_range(
        &self,
        ns: &str,
        prefix: &[u8],
        from: &[u8],
        mut f: impl FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<(), Error> {
        let p = user_key(ns, prefix);
        let from = if from.starts_with(prefix) {
            user_key(ns, from)
        } else if from < prefix {
            p.clone()
        } else {
            // Past every key with the prefix (it differs from the prefix at a byte
            // where it is greater); an empty range, which must not reach the range
            // calls below (a start after the end panics in `BTreeMap::range`).
            return Ok(());
        };
        let strip = user_prefix_len(ns);
        let mut it = self.merged_from(&p, &from);
        if it.mem.peek().is_none() {
            // Nothing pending in the memtables in range: sled's entries alone.
            for kv in &mut it.sled {
                let (k, v) = kv.map_err(sled_err)?;
                if !f(k.get(strip..).unwrap_or(&[]), &v) {
                    break;
                }
            }
            return Ok(());
        }
        while let Some(kv) = it.next_kv() {
            let kv = kv?;
            if !f(kv.key().get(strip..).unwrap_or(&[]), kv.value()) {
                break;
            }
        }
        Ok(())
    }

    /// Write a cache entry (outside commits; dropped when the index is rebuilt).
    pub fn put_cache(&self, ns: &str, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let mut k = cache_prefix(ns);
        k.extend_from_slice(key);
        self.cache.insert(k, value).map_err(sled_err)?;
        Ok(())
    }

    /// A cache entry's value, copied out (see [`Index::with_cache`]).
    pub fn get_cache(&self, ns: &str, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.with_cache(ns, key, <[u8]>::to_vec)
    }

    /// `read` of a cache entry's value in place, without copying it: a
    /// cached snapshot can be megabytes that the caller only decodes.
    pub fn with_cache<R>(
        &self,
        ns: &str,
        key: &[u8],
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, Error> {
        let mut k = cache_prefix(ns);
        k.extend_from_slice(key);
        Ok(self.cache.get(k).map_err(sled_err)?.map(|v| read(&v)))
    }

    pub fn remove_cache(&self, ns: &str, key: &[u8]) -> Result<(), Error> {
        let mut k = cache_prefix(ns);
        k.extend_from_slice(key);
        self.cache.remove(k).map_err(sled_err)?;
        Ok(())
    }

    /// Cache entries whose keys start with `prefix` (keys without the namespace).
    pub fn scan_cache_prefix(&self, ns: &str, prefix: &[u8]) -> IndexScan {
        let mut p = cache_prefix(ns);
        let strip = p.len();
        p.extend_from_slice(prefix);
        IndexScan {
            iter: ScanSource::Sled(self.cache.scan_prefix(p)),
            strip,
        }
    }

    /// Whether the memtable and the frozen memtable are both empty (`None` if a move
    /// into sled is running).
    #[cfg(test)]
    pub(crate) fn mem_is_empty_for_tests(&self) -> Option<bool> {
        if self
            .moving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return None;
        }
        let mem = self
            .mem
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .writes
            .is_empty();
        let frozen = self
            .frozen
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .is_none();
        Some(mem && frozen)
    }

    /// Commits the live memtable holds.
    #[cfg(test)]
    pub(crate) fn mem_commits_for_tests(&self) -> usize {
        self.mem.read().unwrap_or_else(|e| e.into_inner()).commits
    }

    /// Whether sled holds the marker of a move in progress or cut short.
    #[cfg(test)]
    pub(crate) fn sled_moving_for_tests(&self) -> bool {
        self.tree.get(META_MOVING).unwrap().is_some()
    }

    /// The applied seq as sled alone holds it (without the memtable).
    #[cfg(test)]
    pub(crate) fn sled_applied_seq_for_tests(&self) -> Option<u64> {
        let v = self.tree.get(META_APPLIED).ok()??;
        be_u64(&v)
    }

    /// Flush sled's buffers (a courtesy on close: correctness never depends on it).
    pub(crate) fn flush(&self) -> Result<(), Error> {
        self.flush_mem()?;
        flush_sled(&self.db).map_err(sled_err)?;
        if let Some(redo) = &self.redo {
            redo.lock().unwrap_or_else(|e| e.into_inner()).clear()?;
        }
        Ok(())
    }

    /// Every engine and indexer entry (not the cache), for comparing two indexes.
    /// Not the marker of a move into sled in progress either: it is the move's
    /// bookkeeping, not an entry, and a dump taken during a background move would
    /// otherwise differ from the same index's dump after it.
    pub fn dump(&self) -> Result<Vec<KeyValue>, Error> {
        let mut out = Vec::new();
        for kv in self.merged(&[]) {
            let kv = kv?;
            if kv.0 != META_MOVING {
                out.push(kv);
            }
        }
        Ok(out)
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        self.stop_key_scan();
        // sled must not outlive the Index through the mover thread: a reopen of the same
        // directory would find it still locked.
        let _ = self.join_moving();
        if let Some(p) = &self.path {
            tighten_permissions(p);
        }
    }
}

/// Removes group and other access from the index directory and everything
/// in it (best effort). sled creates its files with the process's default
/// mode; the directory itself is created 0700, so nothing in it is reachable
/// by others in between.
fn tighten_permissions(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(meta) = std::fs::symlink_metadata(&p) else {
            continue;
        };
        if meta.file_type().is_symlink() {
            continue;
        }
        let mode = meta.permissions().mode();
        if mode & 0o077 != 0 {
            let _ = std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode & !0o077));
        }
        if meta.is_dir() {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
            }
        }
    }
}

/// Apply `writes` to sled, then stop showing them from `frozen` (sled holds identical
/// values by then, so readers never see a gap: while the keys go in one by one, the
/// frozen memtable in front of sled still answers for every one of them).
///
/// The writes go in one by one, in key order, with the move recorded in the redo log
/// first (see [`crate::index::redo`] for why a crash in the middle loses nothing). One
/// `apply_batch` of the same writes cost sled about twice as much per key: three
/// alternating pairs of `spool bench --workload append-buffered` gave 76.4, 72.0 and
/// 84.3 k commits/s with the batch and 76.7, 82.6 and 93.0 k key by key.
fn move_into_sled(
    tree: &sled::Tree,
    frozen: &RwLock<Option<Arc<MemTable>>>,
    flushed_at: &Mutex<std::time::Instant>,
    redo: Option<&Mutex<RedoLog>>,
    writes: &MemTable,
) -> Result<(), IndexError> {
    let redo_full = write_move(tree, redo, writes, None)?;
    *frozen.write().unwrap_or_else(|e| e.into_inner()) = None;
    // Make the batches durable in sled's own log at most once per interval, as sled's
    // flusher thread (now off) did. The engine's log is the source of truth; this only
    // bounds what the next open catches up on after a power loss. A flush per move
    // (an fsync of up to a memtable's bytes) held the next freeze, which waits for
    // the move: buffered appends fell to 0.59-0.88x SQLite from 0.87-0.93x in three
    // paired runs.
    let mut last = flushed_at.lock().unwrap_or_else(|e| e.into_inner());
    if redo_full || last.elapsed() >= SLED_FLUSH_INTERVAL {
        flush_sled(tree)?;
        *last = std::time::Instant::now();
        // sled now holds every recorded move durably.
        if let Some(redo) = redo {
            redo.lock().unwrap_or_else(|e| e.into_inner()).clear()?;
        }
    }
    drop(last);
    reclaim_sled_garbage(writes.len());
    Ok(())
}

/// The writes of a move into sled (see [`move_into_sled`]): the redo record and the
/// `MOVING` marker first when there is a redo log, then the writes in key order, then
/// the marker's removal. Tests cut it short after `cut_after` writes, as a crash would
/// (the marker stays). Whether the redo log has passed its bound.
fn write_move(
    tree: &sled::Tree,
    redo: Option<&Mutex<RedoLog>>,
    writes: &MemTable,
    cut_after: Option<usize>,
) -> Result<bool, IndexError> {
    // Neighbouring keys share sled's tree nodes: in key order each node is found and
    // changed while it is still in the CPU's caches. The memtable's range read sorts
    // its pending keys once, for this move and for its readers meanwhile.
    let sorted: Vec<(&[u8], &Value)> = writes.range(Bound::Unbounded, Bound::Unbounded).collect();
    debug_assert_eq!(sorted.len(), writes.len());
    let mut redo_full = false;
    if let Some(redo) = redo {
        let body = redo::encode_body(&sorted)?;
        redo_full = redo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .append(&body)?;
        tree.insert(META_MOVING, &redo::marker(&body)[..])?;
    }
    for (k, v) in sorted.iter().take(cut_after.unwrap_or(usize::MAX)) {
        match v {
            Some(v) => tree.insert(k, v.as_slice())?,
            None => tree.remove(k)?,
        };
    }
    if redo.is_some() && cut_after.is_none() {
        tree.remove(META_MOVING)?;
    }
    Ok(redo_full)
}

/// `Tree::flush` (any tree flushes the whole database) inside an epoch pin: an IO
/// buffer another thread retires meanwhile is then not freed before this flush has
/// taken its own reference (see `open_db_inner`).
fn flush_sled(tree: &sled::Tree) -> Result<(), sled::Error> {
    let _pinned = sled::pin();
    tree.flush()?;
    Ok(())
}

/// Free what a batch of `writes` left to sled's epoch-based reclamation, on the calling
/// (background) thread. sled replaces tree nodes on every insert and defers freeing
/// the old ones until no thread can still see them; deferred frees are run only when
/// some thread pins the epoch (a few bags per 128 pins). Left alone, that work falls
/// on whichever threads read sled next — the committing threads, where it was about a
/// fifth of an append's CPU — and when they rarely read sled, memory grows without
/// bound instead. Each flush tries to advance the epoch and frees up to 8 bags of up to
/// 64 deferred frees, so this bounds the loop by what the batch can have produced
/// (a few nodes per write) plus the two epoch advances a bag must wait for.
pub(crate) fn reclaim_sled_garbage(writes: usize) {
    let rounds = writes / 64 + 64;
    for _ in 0..rounds {
        sled::pin().flush();
    }
}

/// Iterator over index entries: `(key without namespace, value)`.
pub struct IndexScan {
    iter: ScanSource,
    strip: usize,
}

enum ScanSource {
    Merged(MergeIter),
    Sled(sled::Iter),
}

impl Iterator for IndexScan {
    type Item = Result<KeyValue, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        let strip = self.strip;
        let own_key = |k: &[u8]| k.get(strip..).unwrap_or(&[]).to_vec();
        Some(match &mut self.iter {
            ScanSource::Merged(m) => match m.next_kv()? {
                Ok(Kv::Mem(mut k, v)) => {
                    k.drain(..strip.min(k.len()));
                    Ok((k, v))
                }
                Ok(Kv::Sled(k, v)) => Ok((own_key(&k), v.to_vec())),
                Err(e) => Err(Error::Index(e)),
            },
            ScanSource::Sled(i) => match i.next()? {
                Ok((k, v)) => Ok((own_key(&k), v.to_vec())),
                Err(e) => Err(sled_err(e)),
            },
        })
    }
}

/// An entry of a merged scan: from a memtable, or borrowed from sled without a copy.
enum Kv {
    Mem(Vec<u8>, Vec<u8>),
    Sled(sled::IVec, sled::IVec),
}

impl Kv {
    fn key(&self) -> &[u8] {
        match self {
            Kv::Mem(k, _) => k,
            Kv::Sled(k, _) => k,
        }
    }

    fn value(&self) -> &[u8] {
        match self {
            Kv::Mem(_, v) => v,
            Kv::Sled(_, v) => v,
        }
    }

    fn into_owned(self) -> KeyValue {
        match self {
            Kv::Mem(k, v) => (k, v),
            Kv::Sled(k, v) => (k.to_vec(), v.to_vec()),
        }
    }
}

/// The memtables' entries merged over sled's, in key order; the memtable wins on equal
/// keys and its `None` hides sled's entry.
struct MergeIter {
    mem: std::iter::Peekable<std::vec::IntoIter<PendingWrite>>,
    sled: sled::Iter,
    sled_peek: Option<(sled::IVec, sled::IVec)>,
    /// sled has no more entries in range.
    sled_done: bool,
    prefix: Vec<u8>,
    done: bool,
}

impl MergeIter {
    fn next_kv(&mut self) -> Option<Result<Kv, IndexError>> {
        loop {
            if self.done {
                return None;
            }
            if self.sled_peek.is_none() && !self.sled_done {
                // sled's range ends where the prefix does (see `prefix_end`), so every
                // key it yields starts with the prefix.
                match self.sled.next() {
                    Some(Ok((k, v))) => {
                        debug_assert!(k.starts_with(&self.prefix));
                        self.sled_peek = Some((k, v))
                    }
                    None => self.sled_done = true,
                    Some(Err(e)) => {
                        self.done = true;
                        return Some(Err(IndexError::Sled(e)));
                    }
                }
            }
            let order = match (self.mem.peek(), &self.sled_peek) {
                (None, None) => return None,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some((mk, _)), Some((sk, _))) => mk.as_slice().cmp(sk),
            };
            if order == std::cmp::Ordering::Equal {
                // The memtable's entry replaces sled's.
                self.sled_peek = None;
            }
            if order != std::cmp::Ordering::Greater {
                let (k, v) = self.mem.next()?;
                match v {
                    Some(v) => return Some(Ok(Kv::Mem(k, v))),
                    None => continue,
                }
            }
            return self.sled_peek.take().map(|(k, v)| Ok(Kv::Sled(k, v)));
        }
    }
}

impl Iterator for MergeIter {
    type Item = Result<KeyValue, IndexError>;
    fn next(&mut self) -> Option<Self::Item> {
        Some(self.next_kv()?.map(Kv::into_owned))
    }
}

/// The least key greater than every key that starts with `prefix` (`None`: no bound).
fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::{
        prefix_end, with_joined, Index, IndexBatch, IndexError, Indexer, JOINED_KEY_STACK_BYTES,
        MEM_BYTES_MOVE, MEM_COMMITS_MAX, MEM_COMMITS_MOVE,
    };
    use crate::types::{CommitInfo, ExpectedVersion, LogPosition, RecordedCommit};
    use std::sync::Arc;

    /// Rewrites one key with a 64 KiB value on every commit, as the transcript indexer
    /// rewrites the last block of the active path on every append.
    struct OneBigKey;

    impl Indexer for OneBigKey {
        fn name(&self) -> &'static str {
            "one-big-key"
        }
        fn version(&self) -> u32 {
            1
        }
        fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
            batch.insert(b"k", &vec![c.info.seq as u8; 64 << 10]);
            Ok(())
        }
    }

    /// Found by reading the memtable's accounting: a key rewritten by every commit
    /// counted its whole value each time, so the memtable moved into sled long
    /// before it held `MEM_BYTES_MOVE` bytes.
    #[test]
    fn a_rewritten_key_counts_its_value_once_in_the_memtable() {
        let (index, _) = Index::open(None, vec![Arc::new(OneBigKey)]).unwrap();
        // 256 commits × 64 KiB = 16 MiB written, twice the memtable's move bound.
        for seq in 1..=256u64 {
            index.apply(&[commit_to("s", seq, seq)]).unwrap();
            let bytes = index.mem_bytes();
            // The value once, plus the stream's head and version block (~40 bytes per
            // version); counting every rewrite would pass 128 KiB at the second commit.
            assert!(bytes < (80 << 10), "commit {seq}: {bytes} bytes counted");
        }
        assert!(index.mem_bytes() < MEM_BYTES_MOVE);
    }

    /// A key per commit, `c/<seq>`, holding the seq.
    struct KeyPerCommit;

    impl Indexer for KeyPerCommit {
        fn name(&self) -> &'static str {
            "key-per-commit"
        }
        fn version(&self) -> u32 {
            1
        }
        fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
            let seq = c.info.seq;
            batch.insert(format!("c/{seq:08}").as_bytes(), &seq.to_be_bytes());
            Ok(())
        }
    }

    /// While a move into sled runs, the memtable takes commits past the move bound
    /// instead of waiting for it, and waits for it only at `MEM_COMMITS_MAX`. Every
    /// commit stays readable throughout, from sled, the frozen memtable or the live one.
    #[test]
    fn the_memtable_grows_while_a_move_runs_and_waits_for_it_only_at_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(KeyPerCommit)]).unwrap();
        let index = Arc::new(index);
        let (step, max) = (MEM_COMMITS_MOVE as u64, MEM_COMMITS_MAX as u64);
        let readable = |index: &Index, seqs: std::ops::RangeInclusive<u64>| {
            for seq in seqs {
                let v = index
                    .get("key-per-commit", format!("c/{seq:08}").as_bytes())
                    .unwrap();
                assert_eq!(v, Some(seq.to_be_bytes().to_vec()), "seq {seq}");
            }
        };
        // Opens the gate however the test ends: a failed assertion with the move held
        // would otherwise hang in the index's drop, which joins the move.
        struct OpenOnDrop(Arc<super::MoveGate>);
        impl Drop for OpenOnDrop {
            fn drop(&mut self) {
                self.0.set_closed(false);
            }
        }
        let _open = OpenOnDrop(index.move_gate.clone());
        index.move_gate.set_closed(true);
        // No move runs yet: the first freeze comes at the move bound, and its move is
        // held at its start.
        for seq in 1..=step {
            index.apply(&[commit(seq)]).unwrap();
        }
        assert_eq!(index.mem_commits_for_tests(), 0);
        // The next memtable grows past the move bound, up to one commit short of the
        // bound, without waiting (on another thread, so that a wait fails the test
        // instead of hanging it).
        let last = step + max - 1;
        let (done, finished) = std::sync::mpsc::channel();
        let applier = {
            let index = index.clone();
            std::thread::spawn(move || {
                for seq in step + 1..=last {
                    index.apply(&[commit(seq)]).unwrap();
                }
                done.send(()).unwrap();
            })
        };
        let waited = finished
            .recv_timeout(std::time::Duration::from_secs(120))
            .is_err();
        index.move_gate.set_closed(!waited);
        assert!(!waited, "an apply below the bound waited for the held move");
        applier.join().unwrap();
        assert_eq!(index.mem_commits_for_tests(), (max - 1) as usize);
        assert_eq!(
            index.mem_is_empty_for_tests(),
            None,
            "the move is still held"
        );
        readable(&index, 1..=last);
        // At the bound, the apply waits for the move, then freezes all `max` commits.
        index.move_gate.set_closed(false);
        index.apply(&[commit(last + 1)]).unwrap();
        assert_eq!(index.mem_commits_for_tests(), 0);
        readable(&index, 1..=last + 1);
        index.flush_mem().unwrap();
        assert_eq!(index.mem_is_empty_for_tests(), Some(true));
        readable(&index, 1..=last + 1);
    }

    /// Per commit: a key of its own, a rewrite of one shared key, and the removal of
    /// the key of the commit three before: a move holds inserts, rewrites and removes.
    struct Churn;

    impl Indexer for Churn {
        fn name(&self) -> &'static str {
            "churn"
        }
        fn version(&self) -> u32 {
            1
        }
        fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
            let seq = c.info.seq;
            batch.insert(format!("c/{seq:06}").as_bytes(), &seq.to_be_bytes());
            batch.insert(b"last", &vec![seq as u8; 300]);
            if seq > 3 {
                batch.remove(format!("c/{:06}", seq - 3).as_bytes());
            }
            Ok(())
        }
    }

    /// Commit `seq` of the log, version `version` of `stream`, without events.
    fn commit_to(stream: &str, version: u64, seq: u64) -> RecordedCommit {
        RecordedCommit {
            info: CommitInfo {
                stream: stream.into(),
                version,
                seq,
                position: LogPosition {
                    segment: 1,
                    offset: seq * 100,
                },
                timestamp_ms: 0,
                commit_id: uuid::Uuid::from_u128(u128::from(seq)),
            },
            expected: ExpectedVersion::Any,
            events: Vec::new(),
            record_bytes: 100,
        }
    }

    /// Commit `seq` of three streams taking turns.
    fn commit(seq: u64) -> RecordedCommit {
        commit_to(&format!("s{}", seq % 3), seq.div_ceil(3), seq)
    }

    /// Applies commits `1..=n` to `index`, moving the memtable into sled after
    /// `move_after` of them.
    fn apply_commits(index: &Index, n: u64, move_after: u64) {
        for seq in 1..=n {
            index.apply(&[commit(seq)]).unwrap();
            if seq == move_after {
                index.flush_mem().unwrap();
            }
        }
    }

    /// The index of commits `1..=n`, moved into sled after `first` of them and at the
    /// end; its entries.
    fn whole_index(dir: &std::path::Path, first: u64, n: u64) -> Vec<super::KeyValue> {
        let (index, created) = Index::open(Some(dir), vec![Arc::new(Churn)]).unwrap();
        assert!(created);
        apply_commits(&index, n, first);
        index.flush().unwrap();
        index.dump().unwrap()
    }

    /// A crash inside a move into sled, at every point from before its first write to
    /// after its last (the marker still there): the next open finishes the move from
    /// the redo log and finds exactly the index of a move that was never cut. Before
    /// the crash, a dump already is that index (a dump that kept the move's marker made
    /// `losing_the_memtable_is_caught_up_from_the_log` fail when its dump overlapped
    /// the background move).
    #[test]
    fn a_move_cut_short_is_finished_from_the_redo_log_on_open() {
        let want = whole_index(tempfile::tempdir().unwrap().path(), 40, 100);
        // The second move: 60 commits, a key each, less the 57 removed, plus `last`
        // and the engine's keys (heads, version blocks, the applied marker).
        for cut in [0, 1, 2, 7, 30, 60, 10_000] {
            let dir = tempfile::tempdir().unwrap();
            {
                let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
                apply_commits(&index, 100, 40);
                index.cut_move_for_tests(cut);
                assert!(index.sled_moving_for_tests(), "cut {cut}");
                // Mid-move (the frozen memtable still in front of sled), a dump is
                // the whole index: the move's marker is not an entry.
                assert_eq!(index.dump().unwrap(), want, "cut {cut}: mid-move dump");
            }
            let (index, created) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
            assert!(!created, "cut {cut}: the index was rebuilt, not finished");
            assert!(!index.sled_moving_for_tests(), "cut {cut}");
            assert_eq!(index.applied_seq().unwrap(), 100, "cut {cut}");
            assert_eq!(index.dump().unwrap(), want, "cut {cut}");
            let redo = dir.path().join(crate::index::redo::REDO_FILE);
            assert_eq!(std::fs::metadata(&redo).unwrap().len(), 0, "cut {cut}");
        }
    }

    /// A move cut short whose redo record is gone (a power loss that kept sled's pages
    /// but not the redo log's) or damaged: the index cannot be trusted, and opening it
    /// starts it empty for a rebuild instead of serving keys of two states.
    #[test]
    fn a_move_cut_short_without_its_record_empties_the_index() {
        for damage in ["missing", "flipped"] {
            let dir = tempfile::tempdir().unwrap();
            {
                let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
                apply_commits(&index, 50, 0);
                index.cut_move_for_tests(5);
            }
            let redo = dir.path().join(crate::index::redo::REDO_FILE);
            let mut bytes = std::fs::read(&redo).unwrap();
            assert!(bytes.len() > 100, "{damage}");
            match damage {
                "missing" => bytes.clear(),
                _ => {
                    let mid = bytes.len() / 2;
                    bytes[mid] ^= 0x40;
                }
            }
            std::fs::write(&redo, &bytes).unwrap();
            let (index, created) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
            assert!(created, "{damage}: the index was kept");
            assert_eq!(index.applied_seq().unwrap(), 0, "{damage}");
            assert!(!index.sled_moving_for_tests(), "{damage}");
        }
    }

    /// Every finished move leaves no marker, and a flush empties the redo log.
    #[test]
    fn whole_moves_leave_no_marker_and_a_flush_empties_the_redo_log() {
        let dir = tempfile::tempdir().unwrap();
        let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
        for seq in 1..=30 {
            index.apply(&[commit(seq)]).unwrap();
            index.flush_mem().unwrap();
            assert!(!index.sled_moving_for_tests(), "seq {seq}");
        }
        let redo = dir.path().join(crate::index::redo::REDO_FILE);
        assert!(std::fs::metadata(&redo).unwrap().len() > 0);
        index.flush().unwrap();
        assert_eq!(std::fs::metadata(&redo).unwrap().len(), 0);
    }

    /// The change mark moves with every publish and with a clear, and only
    /// then: a move into sled, a flush and reads leave it where it was. Two
    /// opens never share marks.
    #[test]
    fn the_change_mark_moves_with_every_publish_and_clear_and_only_then() {
        let dir = tempfile::tempdir().unwrap();
        let (index, _) = Index::open(Some(dir.path()), vec![Arc::new(Churn)]).unwrap();
        let mut mark = index.change_mark();
        assert!(mark.is_settled());
        for seq in 1..=20 {
            index.apply(&[commit(seq)]).unwrap();
            let now = index.change_mark();
            assert_ne!(now, mark, "seq {seq}: a publish moves the mark");
            assert!(now.is_settled(), "seq {seq}");
            mark = now;
            if seq % 5 == 0 {
                index.flush_mem().unwrap();
                assert_eq!(index.change_mark(), mark, "seq {seq}: a move into sled");
            }
            assert!(index.get("churn", b"last").unwrap().is_some());
            assert_eq!(index.applied_seq().unwrap(), seq);
            assert_eq!(index.change_mark(), mark, "seq {seq}: reads");
        }
        index.flush().unwrap();
        assert_eq!(index.change_mark(), mark, "a flush");
        // An empty group publishes nothing.
        index.apply(&[]).unwrap();
        assert_eq!(index.change_mark(), mark, "an empty group");
        index.clear(0).unwrap();
        let cleared = index.change_mark();
        assert_ne!(cleared, mark, "a clear moves the mark");
        assert!(cleared.is_settled(), "a finished clear is settled");
        let (other, _) = Index::open(None, vec![Arc::new(Churn)]).unwrap();
        assert_ne!(
            other.change_mark(),
            Index::open(None, vec![]).unwrap().0.change_mark()
        );
        assert_ne!(other.change_mark(), cleared);
    }

    #[test]
    fn joined_keys_are_the_concatenation_on_and_off_the_stack() {
        for n in [
            0,
            1,
            JOINED_KEY_STACK_BYTES - 3,
            JOINED_KEY_STACK_BYTES + 1,
            1000,
        ] {
            let a = vec![1u8; 3];
            let b: Vec<u8> = (0..n).map(|i| i as u8).collect();
            let want = [a.as_slice(), b.as_slice()].concat();
            assert_eq!(with_joined(&[&a, &b], |k| k.to_vec()), want, "n={n}");
            assert_eq!(with_joined(&[&b, &[], &a], |k| k.len()), n + 3);
        }
    }

    #[test]
    fn prefix_end_is_the_least_key_after_the_prefix() {
        assert_eq!(prefix_end(b"ab"), Some(b"ac".to_vec()));
        assert_eq!(prefix_end(b"a\xff"), Some(b"b".to_vec()));
        assert_eq!(prefix_end(b"\x01\xff\xff"), Some(b"\x02".to_vec()));
        assert_eq!(prefix_end(b"\xff\xff"), None);
        assert_eq!(prefix_end(b""), None);
    }
}
