//! The store: open/recovery, the append path with group commit, reads.

use crate::bloom::CommitIdFilter;
use crate::error::{Error, IndexError};
use crate::format::{self, CommitHead, CommitRef, FRAME_HEADER_BYTES, SEGMENT_HEADER_BYTES};
use crate::index::Index;
use crate::log::{self, HistoryCheck, LogSpan, Segment, Tail};
use crate::prepare::Preparer;
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
/// costs a thread wake-up on each side, about what preparing two or three commits
/// costs; sixteen writers (groups of about 15) measured faster with the thread.
pub(crate) const PREPARE_THREAD_COMMITS_MIN: usize = 4;
/// Smallest durable group, in frame bytes, whose index writes are always prepared on
/// the index thread: its fdatasync writes back at least this much, which takes far
/// longer than the two wake-ups, and its indexers have as much to read (a fork's
/// `created` event carries its whole seed transcript).
pub(crate) const PREPARE_THREAD_BYTES_MIN: usize = 256 << 10;
/// Bytes per `pwrite` when zero-filling a new segment (and a torn tail). The kernel
/// sizes the page-cache folios a write creates by the write's length (ext4 with large
/// folios), and every later commit's small `pwrite`, and the fdatasync after it, walk
/// all the blocks of the folio they land in. With 1 MiB fill writes a lone durable
/// writer spent a median ~59 µs of CPU per append against ~48 µs with 16 KiB (eight
/// alternating runs of `handle_append 3000 durable 1`: 8.5 k against 10.0 k appends/s);
/// buffered appends and 16 writers (one `pwrite` per group) measured no different.
/// Filling 64 MiB takes longer (~20 ms of `pwrite` and ~50 ms of `fsync` against ~14
/// and ~40 ms), on the spare's thread, off the commit path. 4 KiB writes measured no
/// better than 16 KiB in a plain `pwrite` + `fdatasync` loop and fill at half the speed.
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
    /// (foldhash, as the per-commit maps below: std's SipHash cost ~100
    /// instructions a lookup, several per commit.)
    pub(crate) heads: foldhash::HashMap<String, u64>,
    /// Commit ids sequenced but not yet applied to the index.
    pending_ids: foldhash::HashMap<Uuid, CommitInfo>,
    /// Every commit id in the log (approximately): a miss skips the index lookup.
    ids: CommitIdFilter,
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
    pub(crate) segments: RwLock<BTreeMap<u64, Arc<Segment>>>,
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
    pub(crate) closed: AtomicBool,
    pub(crate) counters: Counters,
    pub(crate) stop: Mutex<bool>,
    pub(crate) stop_cond: Condvar,
    pub(crate) flusher: Mutex<Option<JoinHandle<()>>>,
    /// The owner lock. Declared last so that it is dropped last: another owner may only
    /// get in after sled (inside `index`) has been closed.
    /// One GC at a time.
    pub(crate) gc_lock: Mutex<()>,
    /// Number of GCs committed since open (plans name the one they were made after).
    pub(crate) gc_epoch: AtomicU64,
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

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Validate a commit; its encoded payload length.
fn validate(c: &NewCommit, max: u32) -> Result<u32, Error> {
    if c.stream.is_empty() || c.stream.len() > format::STREAM_ID_BYTES_MAX {
        return Err(Error::InvalidInput(format!(
            "stream id must be 1..={} bytes, got {}",
            format::STREAM_ID_BYTES_MAX,
            c.stream.len()
        )));
    }
    if c.events.is_empty() || c.events.len() > format::EVENTS_PER_COMMIT_MAX {
        return Err(Error::InvalidInput(format!(
            "a commit carries 1..={} events, got {}",
            format::EVENTS_PER_COMMIT_MAX,
            c.events.len()
        )));
    }
    for e in &c.events {
        if e.kind.len() > format::EVENT_KIND_BYTES_MAX {
            return Err(Error::InvalidInput(format!(
                "event kind must be at most {} bytes, got {}",
                format::EVENT_KIND_BYTES_MAX,
                e.kind.len()
            )));
        }
    }
    let len = format::commit_payload_len(&c.stream, &c.events).unwrap_or(u64::MAX);
    if len > u64::from(max) {
        return Err(Error::RecordTooLarge {
            bytes: len,
            max: u64::from(max),
        });
    }
    Ok(len as u32)
}

/// What scanning the log on open found.
struct LogState {
    segments: BTreeMap<u64, Arc<Segment>>,
    last_seq: u64,
    last_ts: i64,
    heads: foldhash::HashMap<String, u64>,
    ids: CommitIdFilter,
    /// The index's applied seq names a record the log does not have (or another one).
    index_stale: bool,
    /// Largest segment id in the directory.
    max_id: u64,
    /// The log's layout id (see `layout_of`).
    layout: u64,
}

impl Store {
    /// Open (creating if needed) the store in `dir` as its owner. Takes `DIR/LOCK`
    /// exclusively (a second owner gets [`Error::Locked`]), recovers the log (truncating
    /// only a torn tail of the last segment) and catches the index up or rebuilds it.
    pub fn open(dir: impl AsRef<Path>, opts: Options) -> Result<Store, Error> {
        Store::open_impl(dir.as_ref(), opts, false)
    }

    /// Open without the lock and without writing anything to `dir`: a torn tail is
    /// ignored (not truncated) and indexes are built from the log into a temporary sled.
    /// Works while a writer holds the store; sees the log as it was when opened.
    pub fn open_read_only(dir: impl AsRef<Path>, opts: Options) -> Result<Store, Error> {
        Store::open_impl(dir.as_ref(), opts, true)
    }

    fn open_impl(dir: &Path, opts: Options, read_only: bool) -> Result<Store, Error> {
        if opts.record_bytes_max == 0 || opts.record_bytes_max > format::RECORD_BYTES_HARD_CAP {
            return Err(Error::InvalidInput(format!(
                "record_bytes_max must be 1..={}",
                format::RECORD_BYTES_HARD_CAP
            )));
        }
        if opts.segment_bytes_max < format::SEGMENT_BYTES_MIN {
            return Err(Error::InvalidInput(format!(
                "segment_bytes_max must be at least {}",
                format::SEGMENT_BYTES_MIN
            )));
        }
        let vfs = opts.vfs.clone();
        let mut guard = None;
        if !read_only {
            vfs.create_dir_all(dir)
                .map_err(|e| Error::io(dir, "create_dir_all", e))?;
            let lock_path = dir.join(LOCK_FILE);
            let existed = vfs
                .exists(&lock_path)
                .map_err(|e| Error::io(&lock_path, "exists", e))?;
            let deadline = std::time::Instant::now() + opts.lock_wait;
            loop {
                match vfs.lock(&lock_path, true) {
                    Ok(Some(g)) => {
                        guard = Some(g);
                        break;
                    }
                    Ok(None) if std::time::Instant::now() < deadline => {
                        std::thread::sleep(std::time::Duration::from_millis(LOCK_RETRY_MS));
                    }
                    Ok(None) => return Err(Error::Locked { path: lock_path }),
                    Err(e) => return Err(Error::io(&lock_path, "lock", e)),
                }
            }
            if !existed {
                vfs.sync_dir(dir)
                    .map_err(|e| Error::io(dir, "sync_dir", e))?;
            }
        }
        if !read_only {
            // Finish or roll back a GC that a crash interrupted, before reading the log.
            crate::gc::recover(&*vfs, dir)?;
            // A spare segment of the last owner: it is rebuilt when needed.
            spare::remove(&*vfs, dir)?;
        }
        let index_path = if read_only {
            None
        } else {
            Some(
                opts.index_dir
                    .clone()
                    .unwrap_or_else(|| dir.join(INDEX_DIR)),
            )
        };
        let (index, _fresh) = Index::open(index_path.as_deref(), opts.indexers.clone())?;

        let mut state = scan_log(&*vfs, dir, &opts, &index, read_only);
        if read_only {
            // A live writer may be appending to the last segment while it is scanned: a
            // frame caught half-written with a complete one after it looks like mid-log
            // corruption. Real corruption stays; a race does not survive a rescan.
            let mut tries = 0;
            while tries < READ_ONLY_RESCANS && matches!(state, Err(Error::Corrupt { .. })) {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
                index.clear(0)?;
                state = scan_log(&*vfs, dir, &opts, &index, read_only);
            }
        }
        let mut state = state?;
        if state.index_stale {
            // The index is ahead of the log or describes another history (e.g. after a
            // crash with Buffered durability): rebuild it from the log.
            index.clear(state.layout)?;
            state = scan_log(&*vfs, dir, &opts, &index, read_only)?;
            debug_assert!(!state.index_stale);
            let _ = index.flush();
        }
        let mut segments = state.segments;
        // The active segment is the last in log order, unless that one was written by GC
        // (or the log is empty): then a new one starts.
        let last = log::in_log_order(segments.values()).pop();
        let mut next_segment_id = state.max_id.max(1);
        let active = match last.filter(|s| s.compacted.is_none()) {
            Some(s) => s.clone(),
            None if read_only => {
                // An empty read-only store: a placeholder segment that is never written.
                Arc::new(Segment::new(
                    0,
                    Arc::new(NoFile),
                    SEGMENT_HEADER_BYTES,
                    0,
                    0,
                ))
            }
            None => {
                let id = if segments.is_empty() && state.max_id == 0 {
                    1
                } else {
                    state.max_id + 1
                };
                let seg = create_segment(&*vfs, dir, &opts, id, opts.segment_bytes_max)?;
                segments.insert(id, seg.clone());
                next_segment_id = id;
                seg
            }
        };
        let end = active.end.load(Ordering::Acquire);
        let writer = Writer {
            tail_seg: active.id,
            tail_off: end,
            tail_cap: active.capacity,
            active,
            next_segment_id: next_segment_id + 1,
            buf: Vec::new(),
            chunks: Vec::new(),
            batch: Vec::new(),
            spare_buf: Vec::new(),
            spare_chunks: Vec::new(),
            spare_batch: Vec::new(),
            next_seq: state.last_seq,
            done_seq: state.last_seq,
            leader: false,
            heads: state.heads,
            pending_ids: foldhash::HashMap::default(),
            ids: state.ids,
            last_ts: state.last_ts,
            dirty: false,
            last_group: 0,
            gathering: false,
            waiters: 0,
            preparer: None,
            preparer_failed: false,
            last_group_end: None,
        };
        let inner = Arc::new(Inner {
            dir: dir.to_path_buf(),
            read_only,
            _lock: guard,
            segments: RwLock::new(segments),
            w: Mutex::new(writer),
            cond: Condvar::new(),
            gather_cond: Condvar::new(),
            last_sync_nanos: AtomicU64::new(0),
            index,
            last_seq: AtomicU64::new(state.last_seq),
            poisoned: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            counters: Counters::default(),
            stop: Mutex::new(false),
            stop_cond: Condvar::new(),
            flusher: Mutex::new(None),
            gc_lock: Mutex::new(()),
            gc_epoch: AtomicU64::new(0),
            retired: Mutex::new(Vec::new()),
            spare: Mutex::new(spare::Slot::Empty),
            opts,
        });
        if !read_only && inner.opts.durability == Durability::Buffered {
            let weak = Arc::downgrade(&inner);
            let interval = inner.opts.buffered_flush_interval;
            let handle = std::thread::Builder::new()
                .name("spool-flusher".into())
                .spawn(move || flusher_loop(weak, interval))
                .map_err(|e| Error::io(dir, "spawn flusher thread", e))?;
            *lock(&inner.flusher) = Some(handle);
        }
        Ok(Store { inner })
    }

    /// Append one commit. Returns when it is acknowledged per the store's durability.
    /// A commit whose id an earlier commit has is a retry: it writes nothing and
    /// returns [`AppendOutcome::AlreadyCommitted`] with the earlier commit.
    pub fn append(&self, commit: NewCommit) -> Result<AppendOutcome, Error> {
        self.append_commit(commit, false, None)
    }

    /// Checks `commit` as an append would before writing (stream id, event
    /// count and kinds, record size against this store's limit) without
    /// writing anything: an import checks every commit before its first write.
    pub fn check_commit(&self, commit: &NewCommit) -> Result<(), Error> {
        validate(commit, self.inner.opts.record_bytes_max).map(|_| ())
    }

    /// [`Store::append`] with the commit time given by the caller instead of
    /// read from the clock: for imports that rebuild a history with its
    /// original times. Such a time may lie before earlier commits' times (the
    /// log does not order commits by time); commits appended later without a
    /// given time still get times no earlier than any time seen.
    pub fn append_at(&self, commit: NewCommit, timestamp_ms: i64) -> Result<AppendOutcome, Error> {
        self.append_commit(commit, false, Some(timestamp_ms))
    }

    /// [`Store::append`] under a commit id drawn here: 122 random bits from the
    /// operating system (drawn 256 ids at a time per thread, afresh after a
    /// `fork`), which no earlier commit has. So it cannot be a retry, and the
    /// lookup that recognizes retries (a probe of the commit-id filter, a likely
    /// cache miss, ~2 % of a buffered append) is skipped. The id is in the
    /// outcome's [`CommitInfo`]; a later [`Store::append`] with it is a retry.
    pub fn append_fresh(
        &self,
        stream: impl Into<String>,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, Error> {
        let commit = NewCommit {
            stream: stream.into(),
            expected,
            commit_id: crate::commit_id::fresh(),
            events,
        };
        self.append_commit(commit, true, None)
    }

    /// `drawn_here`: the commit id was drawn by [`Store::append_fresh`].
    /// `given_ts`: the commit time, when the caller chose it.
    fn append_commit(
        &self,
        commit: NewCommit,
        drawn_here: bool,
        given_ts: Option<i64>,
    ) -> Result<AppendOutcome, Error> {
        let inner = &*self.inner;
        if inner.read_only {
            return Err(Error::ReadOnly);
        }
        let payload_len = validate(&commit, inner.opts.record_bytes_max)?;
        let frame_len = FRAME_HEADER_BYTES + u64::from(payload_len);
        let mut w = lock(&inner.w);
        if inner.poisoned.load(Ordering::Acquire) {
            return Err(Error::Poisoned);
        }
        if !drawn_here {
            if let Some(info) = w.pending_ids.get(&commit.commit_id).cloned() {
                check_retry_stream(&info, &commit)?;
                self.wait_done(w, info.seq)?;
                return Ok(AppendOutcome::AlreadyCommitted(info));
            }
        }
        if !drawn_here && w.ids.may_contain(commit.commit_id) {
            // The filter knows the id (or it is a false positive, ~0.002% per filter): look for it
            // in the named stream's version blocks, newest first; failing that, in every
            // stream's (a retry on another stream is refused).
            let head = w.heads.get(&commit.stream).copied().unwrap_or(0);
            if let Some((_, pos)) =
                inner
                    .index
                    .find_in_stream(&commit.stream, head, commit.commit_id)?
            {
                let rec = self.read_at(pos)?;
                return Ok(AppendOutcome::AlreadyCommitted(rec.info));
            }
            if let Some((stream, _, _)) = inner.index.find_anywhere(commit.commit_id)? {
                return Err(Error::InvalidInput(format!(
                    "commit id {} already landed on stream {stream:?}, retried on {:?}",
                    commit.commit_id, commit.stream
                )));
            }
        }
        let actual = w.heads.get(&commit.stream).copied();
        if !commit.expected.matches(actual) {
            return Ok(AppendOutcome::Conflict {
                expected: commit.expected,
                actual,
            });
        }
        if w.tail_off + frame_len > w.tail_cap {
            // Roll: the leader that writes this frame creates the next segment. A record
            // larger than a segment gets a segment of its own.
            w.tail_seg = w.next_segment_id;
            w.next_segment_id += 1;
            w.tail_off = SEGMENT_HEADER_BYTES;
            w.tail_cap = inner
                .opts
                .segment_bytes_max
                .max(SEGMENT_HEADER_BYTES + frame_len);
        }
        w.next_seq += 1;
        let seq = w.next_seq;
        let ts = given_ts.unwrap_or_else(|| now_ms().max(w.last_ts));
        w.last_ts = w.last_ts.max(ts);
        let version = actual.unwrap_or(0) + 1;
        let position = LogPosition {
            segment: w.tail_seg,
            offset: w.tail_off,
        };
        let start = w.buf.len();
        let head = CommitHead {
            stream: &commit.stream,
            expected: commit.expected,
            version,
            commit_id: commit.commit_id,
            timestamp_ms: ts,
            seq,
        };
        format::encode_commit_frame(
            &mut w.buf,
            position.segment,
            &head,
            &commit.events,
            payload_len,
        );
        let end = w.buf.len();
        let cap = w.tail_cap;
        match w.chunks.last_mut() {
            Some(c)
                if c.seg == position.segment
                    && c.offset + (c.end - c.start) as u64 == position.offset =>
            {
                c.end = end;
            }
            _ => w.chunks.push(Chunk {
                seg: position.segment,
                offset: position.offset,
                start,
                end,
                capacity: cap,
                first_seq: seq,
            }),
        }
        w.tail_off += frame_len;
        let info = CommitInfo {
            stream: commit.stream,
            version,
            seq,
            position,
            timestamp_ms: ts,
            commit_id: commit.commit_id,
        };
        match w.heads.get_mut(&info.stream) {
            Some(v) => *v = version,
            None => {
                w.heads.insert(info.stream.clone(), version);
            }
        }
        w.pending_ids.insert(info.commit_id, info.clone());
        w.ids.insert(info.commit_id);
        w.batch.push(RecordedCommit {
            info: info.clone(),
            expected: commit.expected,
            events: commit.events,
            record_bytes: frame_len as u32,
        });
        if w.gathering && w.batch.len() >= w.last_group {
            inner.gather_cond.notify_one();
        }
        self.wait_done(w, seq)?;
        Ok(AppendOutcome::Committed(info))
    }

    /// Wait until `seq` is acknowledged, leading a group write when no one else is.
    fn wait_done(&self, mut w: MutexGuard<'_, Writer>, seq: u64) -> Result<(), Error> {
        let inner = &*self.inner;
        loop {
            if w.done_seq >= seq {
                return Ok(());
            }
            if inner.poisoned.load(Ordering::Acquire) {
                return Err(Error::Poisoned);
            }
            if !w.leader {
                // With no leader, every unacknowledged commit is in the pending buffer,
                // `seq` among them: the group written now acknowledges it.
                let led = self.lead(w);
                debug_assert!(
                    led.is_err() || inner.last_seq.load(Ordering::Acquire) >= seq,
                    "a leader's group acknowledges the leader's own commit"
                );
                return led;
            }
            w = wait_writer(inner, w);
        }
    }

    /// Write every sequenced frame as one group: pwrite (per segment), fdatasync with
    /// Immediate, apply to the index, then acknowledge.
    fn lead(&self, mut w: MutexGuard<'_, Writer>) -> Result<(), Error> {
        let inner = &*self.inner;
        w.leader = true;
        let sync = inner.opts.durability == Durability::Immediate;
        if sync && w.last_group > 1 && w.batch.len() < w.last_group {
            // Group commit under concurrency: the writers acknowledged by the last group
            // are about to append again. Wait (at most about one fdatasync's time) until
            // as many commits as last time have joined, so that they share this fdatasync
            // instead of each paying for their own.
            let wait = std::time::Duration::from_nanos(
                inner
                    .last_sync_nanos
                    .load(Ordering::Relaxed)
                    .min(MAX_GATHER_NANOS),
            );
            let deadline = std::time::Instant::now() + wait;
            w.gathering = true;
            while w.batch.len() < w.last_group {
                let now = std::time::Instant::now();
                if now >= deadline {
                    break;
                }
                w = inner
                    .gather_cond
                    .wait_timeout(w, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            w.gathering = false;
        }
        let spare_buf = std::mem::take(&mut w.spare_buf);
        let spare_chunks = std::mem::take(&mut w.spare_chunks);
        let spare_batch = std::mem::take(&mut w.spare_batch);
        let mut buf = std::mem::replace(&mut w.buf, spare_buf);
        let mut chunks = std::mem::replace(&mut w.chunks, spare_chunks);
        let batch = std::mem::replace(&mut w.batch, spare_batch);
        let active = w.active.clone();
        // The id the next new segment gets unless a GC takes it first.
        let next_id = w.next_segment_id;
        let mut preparer = None;
        let poll = inner.opts.index_thread_poll_window();
        let back_to_back = !poll.is_zero() && w.last_group_end.is_some_and(|t| t.elapsed() <= poll);
        let large =
            batch.len() >= PREPARE_THREAD_COMMITS_MIN || buf.len() >= PREPARE_THREAD_BYTES_MIN;
        // The thread polls for the next group only after a small one that came back to
        // back (a lone writer's): after a large one it sleeps (see `crate::prepare`).
        let poll_after = back_to_back && !large;
        if sync && !w.preparer_failed && (large || back_to_back) {
            preparer = w
                .preparer
                .take()
                .or_else(|| Preparer::spawn(Arc::downgrade(&self.inner), poll));
            w.preparer_failed = preparer.is_none();
        }
        drop(w);

        let (res, mut batch) = self.write_and_index(
            active.clone(),
            next_id,
            &buf,
            &chunks,
            batch,
            preparer.as_ref().map(|p| (p, poll_after)),
        );

        let mut w = lock(&inner.w);
        w.leader = false;
        if preparer.is_some() {
            w.preparer = preparer;
        }
        let outcome = match res {
            Ok((new_active, ends)) => {
                for (seg, end, first_seq) in ends {
                    seg.end.store(end, Ordering::Release);
                    let _ = seg.first_seq.compare_exchange(
                        0,
                        first_seq,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    if seg.id != new_active.id {
                        seg.mappable.store(true, Ordering::Release);
                    }
                }
                if new_active.id != active.id {
                    active.mappable.store(true, Ordering::Release);
                }
                w.active = new_active;
                if let Some(last) = batch.last() {
                    w.done_seq = last.info.seq;
                    inner.last_seq.store(last.info.seq, Ordering::Release);
                }
                for c in &batch {
                    w.pending_ids.remove(&c.info.commit_id);
                }
                if !sync {
                    w.dirty = true;
                }
                w.last_group = batch.len();
                // Only read when a poll window is set: no clock read per group otherwise.
                if sync && !inner.opts.index_thread_poll_window().is_zero() {
                    w.last_group_end = Some(std::time::Instant::now());
                }
                let c = &inner.counters;
                c.commits.fetch_add(batch.len() as u64, Ordering::Relaxed);
                c.groups.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // The outcome of the write is unknown (or the index is behind a durable
                // commit): refuse every later write until a reopen recovers.
                inner.poisoned.store(true, Ordering::Release);
                Err(e)
            }
        };
        buf.clear();
        chunks.clear();
        batch.clear();
        if w.spare_buf.capacity() < buf.capacity() {
            w.spare_buf = buf;
        }
        w.spare_chunks = chunks;
        w.spare_batch = batch;
        // Waking costs a syscall even with no one waiting: skip it then (a lone Buffered
        // writer leads every group itself). The wake happens after the unlock: waking a
        // dozen threads takes tens of microseconds on a virtual machine, and each woken
        // thread's first step is to take this lock.
        let wake = w.waiters > 0;
        drop(w);
        if wake {
            inner.cond.notify_all();
        }
        outcome
    }

    /// Write a group, make it durable (`Immediate`), and publish it: pwrite, then
    /// the fdatasync with the indexers running on the index thread (`preparer`, and
    /// whether it polls for the next group afterwards) meanwhile (both must finish:
    /// the writes are published only once the group is durable), then the segments'
    /// readable ends, then the index. Without the
    /// thread the group is prepared after its fdatasync. Returns the new active
    /// segment and, per chunk, the segment, its new end and the chunk's first seq;
    /// and the group's commits (none if the index thread vanished with them).
    #[allow(clippy::type_complexity)]
    fn write_and_index(
        &self,
        active: Arc<Segment>,
        next_id: u64,
        buf: &[u8],
        chunks: &[Chunk],
        mut batch: Vec<RecordedCommit>,
        preparer: Option<(&Preparer, bool)>,
    ) -> (
        Result<(Arc<Segment>, Vec<(Arc<Segment>, u64, u64)>), Error>,
        Vec<RecordedCommit>,
    ) {
        let inner = &*self.inner;
        self.plan_spare(&active, next_id);
        let (seg, ends) = match self.write_group(active, buf, chunks) {
            Ok(r) => r,
            Err(e) => return (Err(e), batch),
        };
        let mut prepared = None;
        if inner.opts.durability == Durability::Immediate {
            let handed = match preparer {
                Some((p, poll_after)) => p.start(batch, poll_after),
                None => Err(batch),
            };
            if handed.is_ok() {
                inner
                    .counters
                    .groups_prepared_ahead
                    .fetch_add(1, Ordering::Relaxed);
            }
            let synced = self.sync_group(&seg);
            match handed {
                Ok(()) => match preparer.and_then(|(p, _)| p.finish()) {
                    Some((back, writes)) => {
                        batch = back;
                        prepared = Some(writes);
                    }
                    None => {
                        let stopped = IndexError::indexer(
                            "(index thread)",
                            "the index thread stopped before answering",
                        );
                        return (Err(Error::Index(stopped)), Vec::new());
                    }
                },
                Err(back) => batch = back,
            }
            if let Err(e) = synced {
                return (Err(e), batch);
            }
        }
        // Publish the readable end of each written segment before the index names
        // the new positions: a reader that finds a position in the index must be
        // able to read the record there.
        for (seg, end, _) in &ends {
            seg.end.fetch_max(*end, Ordering::AcqRel);
        }
        let published = prepared
            .unwrap_or_else(|| inner.index.prepare(&batch))
            .and_then(|writes| inner.index.publish(&batch, writes))
            .map_err(Error::Index);
        (published.map(|()| (seg, ends)), batch)
    }

    /// The pwrites of one group (sealing each segment it fills with an fdatasync).
    /// Returns the new active segment and, per chunk, the segment, its new end and the
    /// chunk's first seq.
    #[allow(clippy::type_complexity)]
    fn write_group(
        &self,
        mut seg: Arc<Segment>,
        buf: &[u8],
        chunks: &[Chunk],
    ) -> Result<(Arc<Segment>, Vec<(Arc<Segment>, u64, u64)>), Error> {
        let inner = &*self.inner;
        let mut ends = Vec::with_capacity(chunks.len());
        for ch in chunks {
            if ch.seg != seg.id {
                debug_assert!(ch.seg > seg.id);
                // Seal the current segment: its records must be durable before a later
                // segment exists, or recovery would find a torn segment in mid-log.
                self.sync_segment(&seg)?;
                let spare = lock(&inner.spare).take(ch.capacity)?;
                let new = match spare {
                    Some(s) => {
                        let new = spare::install(&*inner.opts.vfs, &inner.dir, s, ch.seg)?;
                        inner
                            .counters
                            .segments_from_spare
                            .fetch_add(1, Ordering::Relaxed);
                        new
                    }
                    None => create_segment(
                        &*inner.opts.vfs,
                        &inner.dir,
                        &inner.opts,
                        ch.seg,
                        ch.capacity,
                    )?,
                };
                inner
                    .counters
                    .segments_created
                    .fetch_add(1, Ordering::Relaxed);
                inner
                    .segments
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(new.id, new.clone());
                seg = new;
            }
            seg.file
                .write_at(&buf[ch.start..ch.end], ch.offset)
                .map_err(|e| Error::io(inner.dir.join(&seg.name), "write_at", e))?;
            ends.push((
                seg.clone(),
                ch.offset + (ch.end - ch.start) as u64,
                ch.first_seq,
            ));
        }
        Ok((seg, ends))
    }

    /// Start building the next segment once `active` is half full (per
    /// [`NextSegment`]), expecting it to get id `next_id`.
    fn plan_spare(&self, active: &Segment, next_id: u64) {
        let inner = &*self.inner;
        let mode = inner.opts.next_segment;
        if inner.read_only
            || mode == NextSegment::OnDemand
            || active.end.load(Ordering::Acquire).saturating_mul(2) < active.capacity
        {
            return;
        }
        let mut slot = lock(&inner.spare);
        if !slot.is_empty() {
            return;
        }
        let plan = spare::Plan {
            vfs: inner.opts.vfs.clone(),
            dir: inner.dir.clone(),
            preallocate: inner.opts.preallocate,
            durability: inner.opts.durability,
            id: next_id,
            capacity: inner.opts.segment_bytes_max,
        };
        *slot = match mode {
            NextSegment::Background => match plan.clone().spawn() {
                Some(h) => spare::Slot::Building(h),
                // No thread: build it here (as `Inline`).
                None => spare::Slot::Done(plan.build()),
            },
            _ => spare::Slot::Done(plan.build()),
        };
    }

    /// The fdatasync of a durable group (timed: the next group's gather waits about
    /// this long).
    fn sync_group(&self, seg: &Segment) -> Result<(), Error> {
        let t = std::time::Instant::now();
        self.sync_segment(seg)?;
        self.inner
            .last_sync_nanos
            .store(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn sync_segment(&self, seg: &Segment) -> Result<(), Error> {
        let inner = &*self.inner;
        inner.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        seg.file
            .sync_data()
            .map_err(|e| Error::io(inner.dir.join(&seg.name), "sync_data", e))
    }

    /// Wait until a next segment being built ahead ([`NextSegment::Background`]) is
    /// complete. Nothing needs this for correctness: a caller that times work (a
    /// benchmark between two measurements) uses it so that the build does not overlap
    /// what it measures next. A failed build stays for the writer that would use the
    /// spare, which reports it.
    pub fn wait_for_spare_segment(&self) {
        lock(&self.inner.spare).finish();
    }

    /// The head version of `stream`; `None` when it does not exist.
    pub fn stream_version(&self, stream: &str) -> Result<Option<u64>, Error> {
        Ok(self.inner.index.stream_head(stream)?.map(|h| h.version))
    }

    /// Commits of `stream` with versions `>= from_version`, ascending, at most `limit`.
    pub fn read_stream(
        &self,
        stream: &str,
        from_version: u64,
        limit: usize,
    ) -> Result<Vec<RecordedCommit>, Error> {
        loop {
            // A GC that swaps segments between reading positions and records makes
            // the positions stale: read again from the rebuilt index.
            let epoch = self.inner.gc_epoch.load(Ordering::Acquire);
            match self.read_stream_once(stream, from_version, limit) {
                Err(e) if self.inner.gc_epoch.load(Ordering::Acquire) != epoch => {
                    let _ = e;
                    continue;
                }
                other => return other,
            }
        }
    }

    fn read_stream_once(
        &self,
        stream: &str,
        from_version: u64,
        limit: usize,
    ) -> Result<Vec<RecordedCommit>, Error> {
        let positions = self
            .inner
            .index
            .stream_positions(stream, from_version.max(1), limit)?;
        let mut out = Vec::with_capacity(positions.len());
        for (version, pos) in positions {
            let rec = self.read_at(pos)?;
            if rec.info.stream != stream || rec.info.version != version {
                return Err(Error::Index(IndexError::Mismatch(format!(
                    "index says {stream:?} v{version} is at {pos}, the log has {:?} v{} there",
                    rec.info.stream, rec.info.version
                ))));
            }
            out.push(rec);
        }
        Ok(out)
    }

    /// The segment holding `pos` (`NotFound` when no segment has its id).
    fn segment_at(&self, pos: LogPosition) -> Result<Arc<Segment>, Error> {
        self.inner
            .segments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&pos.segment)
            .cloned()
            .ok_or_else(|| Error::NotFound(pos.to_string()))
    }

    /// The commit recorded at `pos`.
    pub fn read_at(&self, pos: LogPosition) -> Result<RecordedCommit, Error> {
        let seg = self.segment_at(pos)?;
        seg.read(pos.offset, self.inner.opts.record_bytes_max)
    }

    /// The commit recorded at `pos`, decoded in place and handed to `f`, with the checks
    /// of [`Store::read_at`] (frame checksum, every length): nothing is copied out of a
    /// sealed segment's map or from the map of the active segment's acknowledged prefix
    /// (see [`ACTIVE_MAP_SLACK_BYTES`](crate::ACTIVE_MAP_SLACK_BYTES)); a record
    /// after that map is read with one `pread` into a buffer the calling thread reuses.
    /// For reading one event of a commit without the allocations of a
    /// [`RecordedCommit`].
    pub fn visit_at<R>(
        &self,
        pos: LogPosition,
        f: impl FnOnce(CommitRef<'_>) -> R,
    ) -> Result<R, Error> {
        let seg = self.segment_at(pos)?;
        seg.visit(pos.offset, self.inner.opts.record_bytes_max, f)
    }

    /// The bytes of the log from `from` on in its segment, at most `len` of them (never
    /// past the acknowledged end), to read several nearby records with
    /// [`LogSpan::visit`]: borrowed from a segment's map when it holds them all (see
    /// [`Store::visit_at`]), else read with one `pread`. `len` is the caller's bound on
    /// what it copies
    /// ([`LOG_SPAN_BYTES_MAX`] at most).
    pub fn read_span(&self, from: LogPosition, len: u64) -> Result<LogSpan, Error> {
        let seg = self.segment_at(from)?;
        seg.span(
            from.offset,
            len.min(LOG_SPAN_BYTES_MAX),
            self.inner.opts.record_bytes_max,
        )
    }

    /// Commits with seq `>= from_seq` in log order, up to the last one acknowledged when
    /// the scan starts.
    pub fn scan(&self, from_seq: u64) -> Result<LogScan<'_>, Error> {
        let end_seq = self.last_seq();
        let segs = log::in_log_order(
            self.inner
                .segments
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values(),
        );
        let target = from_seq.max(1);
        // Start at the last segment that begins at or before the target.
        let start = segs
            .iter()
            .rposition(|s| s.order_key() != u64::MAX && s.order_key() <= target)
            .unwrap_or(0);
        Ok(LogScan {
            store: self,
            segs,
            i: start,
            off: 0,
            from_seq: target,
            end_seq,
        })
    }

    /// Every stream with its head version, sorted by name.
    pub fn streams(&self) -> Result<Vec<(String, u64)>, Error> {
        self.inner.index.streams()
    }

    /// The commit with client commit id `id`, if one landed (on any stream).
    /// Ids the in-memory filter has never seen answer `None` at once; otherwise
    /// the version index is searched (a full pass over it: meant for importers
    /// and tools, not for the write path).
    pub fn commit_by_id(&self, id: Uuid) -> Result<Option<CommitInfo>, Error> {
        let inner = &*self.inner;
        {
            let w = lock(&inner.w);
            if let Some(info) = w.pending_ids.get(&id) {
                return Ok(Some(info.clone()));
            }
            if !w.ids.may_contain(id) {
                return Ok(None);
            }
        }
        match inner.index.find_anywhere(id)? {
            Some((_, _, pos)) => Ok(Some(self.read_at(pos)?.info)),
            None => Ok(None),
        }
    }

    /// The last acknowledged sequence number (0 for an empty store).
    pub fn last_seq(&self) -> u64 {
        self.inner.last_seq.load(Ordering::Acquire)
    }

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
    /// that is [`Store::flush`]. A failure poisons the store, as a failed
    /// index write on the write path does. A no-op on a read-only store.
    pub fn flush_index(&self) -> Result<(), Error> {
        let inner = &*self.inner;
        if inner.read_only {
            return Ok(());
        }
        let w = lock_idle(inner)?;
        // With the writer lock held and no leader, nothing publishes into the
        // memtable, which makes this thread its only applier (`flush_mem`'s rule).
        let res = inner.index.flush_mem();
        if res.is_err() {
            inner.poisoned.store(true, Ordering::Release);
        }
        drop(w);
        res.map_err(Error::Index)
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

impl Drop for Store {
    fn drop(&mut self) {
        let _ = shutdown(&self.inner);
    }
}

fn check_retry_stream(info: &CommitInfo, c: &NewCommit) -> Result<(), Error> {
    if info.stream != c.stream {
        return Err(Error::InvalidInput(format!(
            "commit id {} already landed on stream {:?}, retried on {:?}",
            c.commit_id, info.stream, c.stream
        )));
    }
    Ok(())
}

/// The writer lock once no write group is in flight (no leader); `Poisoned` when
/// the store refuses writes.
fn lock_idle(inner: &Inner) -> Result<MutexGuard<'_, Writer>, Error> {
    let mut w = lock(&inner.w);
    while w.leader {
        w = wait_writer(inner, w);
    }
    if inner.poisoned.load(Ordering::Acquire) {
        return Err(Error::Poisoned);
    }
    Ok(w)
}

fn flush_inner(inner: &Inner) -> Result<(), Error> {
    if inner.read_only {
        return Ok(());
    }
    let mut w = lock_idle(inner)?;
    if !w.dirty {
        return Ok(());
    }
    w.dirty = false;
    let active = w.active.clone();
    drop(w);
    inner.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
    if let Err(e) = active.file.sync_data() {
        inner.poisoned.store(true, Ordering::Release);
        return Err(Error::io(inner.dir.join(&active.name), "sync_data", e));
    }
    Ok(())
}

fn shutdown(inner: &Inner) -> Result<(), Error> {
    if inner.closed.swap(true, Ordering::AcqRel) {
        return Ok(());
    }
    *lock(&inner.stop) = true;
    inner.stop_cond.notify_all();
    if let Some(h) = lock(&inner.flusher).take() {
        let _ = h.join();
    }
    let res = if inner.poisoned.load(Ordering::Acquire) {
        Ok(())
    } else {
        flush_inner(inner)
    };
    // Old segments of a GC: no reader is left once the store is closed (scans borrow
    // it). What fails here is finished by the next open's GC recovery.
    if !inner.read_only {
        let _ = crate::gc::retire(inner);
        // An unused spare: the next open would remove it anyway.
        let mut slot = lock(&inner.spare);
        slot.finish();
        *slot = spare::Slot::Empty;
        let _ = spare::remove(&*inner.opts.vfs, &inner.dir);
    }
    let _ = inner.index.flush();
    // The lock is released when `Inner` is dropped, after the index.
    res
}

fn flusher_loop(inner: Weak<Inner>, interval: std::time::Duration) {
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        {
            let stop = lock(&strong.stop);
            if *stop {
                return;
            }
            let (stop, _) = strong
                .stop_cond
                .wait_timeout(stop, interval)
                .unwrap_or_else(|e| e.into_inner());
            if *stop {
                return;
            }
        }
        // A failure poisons the store; the next append reports it.
        let _ = flush_inner(&strong);
    }
}

/// Create segment `id`: preallocate, header, fsync the file, fsync the directory.
fn create_segment(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    id: u64,
    capacity: u64,
) -> Result<Arc<Segment>, Error> {
    let name = format::segment_file_name(id);
    let path = dir.join(&name);
    let file = vfs
        .open(&path, OpenMode::CreateNew)
        .map_err(|e| Error::io(&path, "create", e))?;
    init_segment_file(
        &*file,
        &path,
        opts.preallocate.resolve(opts.durability),
        id,
        capacity,
    )?;
    vfs.sync_dir(dir)
        .map_err(|e| Error::io(dir, "sync_dir", e))?;
    Ok(Arc::new(Segment::new(
        id,
        file,
        SEGMENT_HEADER_BYTES,
        capacity,
        0,
    )))
}

/// Preallocate (`preallocate` resolved: not `Auto`), write the header and fsync.
pub(crate) fn init_segment_file(
    file: &dyn VfsFile,
    path: &Path,
    preallocate: Preallocate,
    id: u64,
    capacity: u64,
) -> Result<(), Error> {
    match preallocate {
        Preallocate::Sparse | Preallocate::Auto => file
            .set_len(capacity)
            .map_err(|e| Error::io(path, "set_len", e))?,
        Preallocate::ZeroFill => {
            file.set_len(capacity)
                .map_err(|e| Error::io(path, "set_len", e))?;
            let zeros = vec![0u8; ZERO_FILL_CHUNK_BYTES.min(capacity as usize)];
            let mut off = 0u64;
            while off < capacity {
                let n = (capacity - off).min(zeros.len() as u64) as usize;
                file.write_at(&zeros[..n], off)
                    .map_err(|e| Error::io(path, "write_at", e))?;
                off += n as u64;
            }
        }
    }
    file.write_at(&format::encode_header(id), 0)
        .map_err(|e| Error::io(path, "write_at", e))?;
    file.sync_all().map_err(|e| Error::io(path, "sync_all", e))
}

/// Zero `from..to` of a segment and fdatasync: the truncation of a torn tail that keeps
/// the preallocated size.
fn zero_range(file: &dyn VfsFile, path: &Path, from: u64, to: u64) -> Result<(), Error> {
    let zeros = vec![0u8; ZERO_FILL_CHUNK_BYTES.min((to - from) as usize)];
    let mut off = from;
    while off < to {
        let n = (to - off).min(zeros.len() as u64) as usize;
        file.write_at(&zeros[..n], off)
            .map_err(|e| Error::io(path, "write_at", e))?;
        off += n as u64;
    }
    file.sync_data()
        .map_err(|e| Error::io(path, "sync_data", e))
}

/// A segment file opened by the first pass of a log scan.
pub(crate) struct OpenedSegment {
    pub id: u64,
    /// Where the file is (a `.seg`, or a `.seg.gc` a read-only view rolls forward).
    pub path: PathBuf,
    pub name: String,
    pub file: Arc<dyn VfsFile>,
    pub map: Mapped,
    pub header: Result<format::SegmentHeader, format::HeaderProblem>,
    /// Position in log order (see `Segment::order_key`); `u64::MAX` when unknown.
    pub key: u64,
}

/// Open and map every segment of the log (read only) and sort them into log order (see
/// `log::sort_in_log_order`). Returns the segments and the largest segment id in the
/// directory.
pub(crate) fn open_segments_in_order(
    vfs: &dyn Vfs,
    dir: &Path,
    max: u32,
    read_only: bool,
) -> Result<(Vec<OpenedSegment>, u64), Error> {
    let files = crate::gc::segment_files(vfs, dir, read_only)?;
    let max_id = files.iter().map(|(id, _)| *id).max().unwrap_or(0);
    let mut out = Vec::with_capacity(files.len());
    for (id, file_name) in files {
        let path = dir.join(&file_name);
        let file = vfs
            .open(&path, OpenMode::Read)
            .map_err(|e| Error::io(&path, "open", e))?;
        let map: Mapped = file.map().map_err(|e| Error::io(&path, "map", e))?;
        let header = format::check_header(&map, id);
        let key = match &header {
            Ok(h) => match h.compacted {
                Some((first, _)) => first,
                None => match map
                    .get(h.data_start as usize..)
                    .map(|rest| format::check_frame(rest, id, max))
                {
                    Some(format::FrameCheck::Valid { payload, .. }) => {
                        format::peek_seq(payload).unwrap_or(u64::MAX)
                    }
                    _ => u64::MAX,
                },
            },
            Err(_) => u64::MAX,
        };
        out.push(OpenedSegment {
            id,
            path,
            name: format::segment_file_name(id),
            file,
            map,
            header,
            key,
        });
    }
    log::sort_in_log_order(&mut out, |s| {
        (
            s.id,
            matches!(&s.header, Ok(h) if h.compacted.is_some()),
            s.key,
        )
    });
    Ok((out, max_id))
}

/// Segments not written by GC must appear in log order by ascending id (the writer only
/// ever creates higher ids); `Err` names the first one out of place.
pub(crate) fn check_plain_order(segs: &[OpenedSegment]) -> Result<(), Error> {
    let mut prev: Option<u64> = None;
    for s in segs {
        let compacted = matches!(&s.header, Ok(h) if h.compacted.is_some());
        if compacted {
            continue;
        }
        if let Some(p) = prev {
            if s.id < p {
                return Err(Error::corrupt(
                    &s.name,
                    SEGMENT_HEADER_BYTES,
                    format!(
                        "holds seqs after those of the later segment {}",
                        format::segment_file_name(p)
                    ),
                ));
            }
        }
        prev = Some(s.id);
    }
    Ok(())
}

/// The log's layout id: the largest id of a segment written by GC (0 if none). Every GC
/// writes a segment with a new, larger id, so the index records the layout it was built
/// from and is rebuilt when it differs.
pub(crate) fn layout_of<'a>(segs: impl IntoIterator<Item = &'a OpenedSegment>) -> u64 {
    segs.into_iter()
        .filter(|s| matches!(&s.header, Ok(h) if h.compacted.is_some()))
        .map(|s| s.id)
        .max()
        .unwrap_or(0)
}

/// Scan the whole log: validate every record and the history, repair a torn tail (owner
/// only), and apply records past the index's applied seq to the index.
fn scan_log(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    index: &Index,
    read_only: bool,
) -> Result<LogState, Error> {
    let max = opts.record_bytes_max;
    let (opened, max_id) = open_segments_in_order(vfs, dir, max, read_only)?;
    check_plain_order(&opened)?;
    let layout = layout_of(&opened);
    if index.layout()? != layout {
        // Built from another arrangement of the log (before or after a GC): its
        // positions mean nothing now.
        index.clear(layout)?;
    }
    let (applied, applied_id) = index.applied_marker()?;
    let mut hist = HistoryCheck::default();
    let mut pending: Vec<RecordedCommit> = Vec::new();
    let mut segments = BTreeMap::new();
    let mut last_ts = 0i64;
    let mut index_stale = false;
    let mut commit_ids = CommitIdFilter::with_capacity(0);
    let count = opened.len();
    for (i, seg) in opened.into_iter().enumerate() {
        let OpenedSegment {
            id,
            path,
            name,
            mut file,
            map,
            header,
            ..
        } = seg;
        // Only the last segment in log order, if the writer made it, may have a torn
        // tail or an unfinished header.
        let is_last = i + 1 == count && !matches!(&header, Ok(h) if h.compacted.is_some());
        if is_last && !read_only {
            file = vfs
                .open(&path, OpenMode::ReadWrite)
                .map_err(|e| Error::io(&path, "open", e))?;
        }
        let header = match header {
            Ok(h) => h,
            Err(format::HeaderProblem::FutureVersion(v)) => {
                return Err(Error::UnsupportedFormat {
                    path,
                    found: v,
                    supported: format::SEGMENT_FORMAT_VERSION,
                })
            }
            Err(format::HeaderProblem::WrongId(found)) => {
                return Err(Error::corrupt(
                    &name,
                    16,
                    format!("header names segment id {found}, the file name {id}"),
                ))
            }
            Err(p) => {
                let problem = match p {
                    format::HeaderProblem::Blank => "blank segment header".to_string(),
                    format::HeaderProblem::Invalid(s) => s,
                    _ => "bad header".to_string(),
                };
                let we = log::written_end(&map);
                let has_records =
                    log::find_valid_frame(&map, id, max, SEGMENT_HEADER_BYTES, we).is_some();
                if !is_last || has_records {
                    return Err(Error::corrupt(&name, 0, problem));
                }
                // The last segment's creation did not complete (crash between create and
                // the header's fsync): it holds no record. Re-initialize it.
                if read_only {
                    continue;
                }
                let capacity = opts.segment_bytes_max.max(map.len() as u64);
                drop(map);
                init_segment_file(
                    &*file,
                    &path,
                    opts.preallocate.resolve(opts.durability),
                    id,
                    capacity,
                )?;
                vfs.sync_dir(dir)
                    .map_err(|e| Error::io(dir, "sync_dir", e))?;
                segments.insert(
                    id,
                    Arc::new(Segment::new(id, file, SEGMENT_HEADER_BYTES, capacity, 0)),
                );
                continue;
            }
        };
        hist.enter_segment(header.compacted)
            .map_err(|p| Error::corrupt(&name, SEGMENT_HEADER_BYTES, p))?;
        let mut first_seq = 0;
        let scan = log::scan_segment(&map, id, max, header.data_start, |off, payload| {
            let pos = LogPosition {
                segment: id,
                offset: off,
            };
            // Records the index already has are only checked, not copied out.
            let decode = if format::peek_seq(payload).is_some_and(|seq| seq <= applied) {
                format::decode_commit_head
            } else {
                format::decode_commit
            };
            let rec = decode(payload, pos).map_err(|p| Error::corrupt(&name, off, p))?;
            hist.check(&rec)
                .map_err(|p| Error::corrupt(&name, off, p))?;
            if first_seq == 0 {
                first_seq = rec.info.seq;
            }
            if !read_only {
                commit_ids.insert(rec.info.commit_id);
            }
            last_ts = last_ts.max(rec.info.timestamp_ms);
            let seq = rec.info.seq;
            if seq == applied && applied_id != Some(rec.info.commit_id) {
                index_stale = true;
            }
            if seq > applied && !index_stale {
                pending.push(rec);
                if pending.len() >= CATCH_UP_BATCH {
                    index.apply(&pending)?;
                    pending.clear();
                }
            }
            Ok(())
        })?;
        hist.leave_segment();
        let mut end = scan.end;
        match scan.tail {
            Tail::Clean => {}
            Tail::Corrupt { problem, valid_at } => {
                return Err(Error::corrupt(
                    &name,
                    scan.end,
                    format!("{problem}; a valid record follows at offset {valid_at}"),
                ))
            }
            Tail::Torn {
                problem,
                written_end,
            } => {
                if !is_last {
                    return Err(Error::corrupt(&name, scan.end, problem));
                }
                if !read_only {
                    // A torn tail of the last segment: the write that was in flight when
                    // the process died. Nothing after it validates, so it was never
                    // acknowledged: zero it (keeping the preallocation) and fdatasync.
                    zero_range(&*file, &path, scan.end, written_end)?;
                }
                end = scan.end;
            }
        }
        let capacity = map.len() as u64;
        let seg = Segment::new(id, file, end, capacity, first_seq).with_header(header);
        let seg = if read_only || !is_last {
            seg.with_map(Arc::new(map))
        } else {
            drop(map);
            seg
        };
        segments.insert(id, Arc::new(seg));
    }
    if applied > hist.last_seq {
        index_stale = true;
    }
    if !index_stale && !pending.is_empty() {
        index.apply(&pending)?;
        // Persist the catch-up now rather than redo it after a crash.
        index.flush_mem()?;
    }
    Ok(LogState {
        segments,
        last_seq: hist.last_seq,
        last_ts,
        heads: if read_only {
            foldhash::HashMap::default()
        } else {
            hist.heads
        },
        ids: commit_ids,
        index_stale,
        max_id,
        layout,
    })
}

/// Iterator over the log in seq order (from [`Store::scan`]).
///
/// It holds the segments of the log as they were when the scan started, so a GC that
/// retires them meanwhile does not cut it short: a retired segment's file is removed
/// only once no scan holds it.
pub struct LogScan<'a> {
    store: &'a Store,
    segs: Vec<Arc<Segment>>,
    i: usize,
    off: u64,
    from_seq: u64,
    end_seq: u64,
}

impl Iterator for LogScan<'_> {
    type Item = Result<RecordedCommit, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            let seg = self.segs.get(self.i)?.clone();
            if self.off < seg.data_start {
                self.off = seg.data_start;
            }
            if self.off >= seg.end.load(Ordering::Acquire) {
                self.i += 1;
                self.off = 0;
                continue;
            }
            match seg.read(self.off, self.store.inner.opts.record_bytes_max) {
                Ok(rec) => {
                    self.off += u64::from(rec.record_bytes);
                    if rec.info.seq > self.end_seq {
                        self.i = self.segs.len();
                        return None;
                    }
                    if rec.info.seq < self.from_seq {
                        continue;
                    }
                    return Some(Ok(rec));
                }
                Err(e) => {
                    self.i = self.segs.len();
                    return Some(Err(e));
                }
            }
        }
    }
}

/// Stand-in file for the placeholder segment of an empty read-only store.
#[derive(Debug)]
struct NoFile;

impl VfsFile for NoFile {
    fn read_at(&self, _: &mut [u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            "empty store",
        ))
    }
    fn write_at(&self, _: &[u8], _: u64) -> std::io::Result<()> {
        Err(std::io::Error::other("read-only"))
    }
    fn sync_data(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn sync_all(&self) -> std::io::Result<()> {
        Ok(())
    }
    fn set_len(&self, _: u64) -> std::io::Result<()> {
        Err(std::io::Error::other("read-only"))
    }
    fn len(&self) -> std::io::Result<u64> {
        Ok(0)
    }
    fn map(&self) -> std::io::Result<Mapped> {
        Ok(Mapped::from_vec(Vec::new()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(i: u64) -> Vec<EventData> {
        vec![EventData::new("e", i.to_le_bytes().to_vec())]
    }

    /// The active segment is read through a map of its acknowledged prefix once the end
    /// has moved a slack past the map; reads after the map, and a record that straddles
    /// its end, go to the file; a sealed segment is then mapped whole.
    #[test]
    fn the_active_segment_is_read_through_a_map_of_its_acknowledged_prefix() {
        use crate::log::ACTIVE_MAP_SLACK_BYTES;
        let dir = tempfile::tempdir().unwrap();
        let opts = Options::default()
            .durability(Durability::Buffered)
            .segment_bytes_max(8 << 20);
        let s = Store::open(dir.path(), opts).unwrap();
        let mut written: Vec<(LogPosition, Vec<u8>)> = Vec::new();
        fn append(s: &Store, i: u64, written: &mut Vec<(LogPosition, Vec<u8>)>) {
            // 3,000 to 5,000 bytes, so records straddle page and map boundaries.
            let len = 3000 + (i * 7919 % 2000) as usize;
            let payload: Vec<u8> = (0..len).map(|j| (i as usize * 31 + j) as u8).collect();
            let o = s
                .append(NewCommit::new(
                    "s",
                    ExpectedVersion::Exact(i),
                    vec![EventData::new("e", payload.clone())],
                ))
                .unwrap();
            let AppendOutcome::Committed(info) = o else {
                panic!("append {i}: {o:?}")
            };
            written.push((info.position, payload));
        }
        let check = |s: &Store, written: &[(LogPosition, Vec<u8>)]| {
            for (i, (pos, payload)) in written.iter().enumerate() {
                let got = s
                    .visit_at(*pos, |c| c.event(0).map(|e| e.payload.to_vec()))
                    .unwrap();
                assert_eq!(got.as_deref(), Some(&payload[..]), "record {i} at {pos}");
            }
        };
        let active = |s: &Store| s.segment_at(written_first(s)).unwrap();
        fn written_first(s: &Store) -> LogPosition {
            LogPosition {
                segment: *s.inner.segments.read().unwrap().keys().next().unwrap(),
                offset: SEGMENT_HEADER_BYTES,
            }
        }
        // Under the slack: reads go to the file, nothing is mapped.
        let mut i = 0u64;
        while active(&s).end.load(Ordering::Acquire) < ACTIVE_MAP_SLACK_BYTES / 2 {
            append(&s, i, &mut written);
            i += 1;
        }
        check(&s, &written);
        assert_eq!(active(&s).map_state(), None);
        // Past it: the first read maps exactly the acknowledged prefix.
        while active(&s).end.load(Ordering::Acquire) < ACTIVE_MAP_SLACK_BYTES * 3 / 2 {
            append(&s, i, &mut written);
            i += 1;
        }
        let end = active(&s).end.load(Ordering::Acquire);
        check(&s, &written);
        assert_eq!(active(&s).map_state(), Some((end, false)));
        // Records after the map (its end is a record boundary, in the middle of a page
        // the writer goes on writing) are read from the file, as is a span reaching past
        // the map; the map stays until the next slack.
        let before = written.len();
        for _ in 0..20 {
            append(&s, i, &mut written);
            i += 1;
        }
        check(&s, &written);
        assert_eq!(active(&s).map_state(), Some((end, false)));
        let span = s.read_span(written[before - 1].0, 64 << 10).unwrap();
        for (pos, payload) in &written[before - 1..before + 5] {
            let got = span
                .visit(*pos, |c| c.event(0).map(|e| e.payload.to_vec()))
                .unwrap()
                .unwrap();
            assert_eq!(got.as_deref(), Some(&payload[..]), "span read at {pos}");
        }
        // Past the next slack: mapped again, longer.
        while active(&s).end.load(Ordering::Acquire) < end + ACTIVE_MAP_SLACK_BYTES + (end / 4) {
            append(&s, i, &mut written);
            i += 1;
        }
        let end2 = active(&s).end.load(Ordering::Acquire);
        check(&s, &written);
        assert_eq!(active(&s).map_state(), Some((end2, false)));
        // Sealed (the log moved on to the next segment): the next read maps it whole.
        let first = written_first(&s).segment;
        while written.last().unwrap().0.segment == first {
            append(&s, i, &mut written);
            i += 1;
        }
        check(&s, &written);
        let sealed = s.segment_at(written_first(&s)).unwrap();
        let (len, whole) = sealed.map_state().unwrap();
        assert!(
            whole && len == 8 << 20,
            "sealed map: {len} bytes, whole {whole}"
        );
        drop(s);
        // And reopened, everything reads back the same.
        let s = Store::open(
            dir.path(),
            Options::default()
                .durability(Durability::Buffered)
                .segment_bytes_max(8 << 20),
        )
        .unwrap();
        check(&s, &written);
    }

    /// A failed map of the active segment's prefix fails that read with an I/O error
    /// naming the segment, poisons nothing (reads never do), and the next read maps it.
    #[test]
    fn a_failed_prefix_map_fails_the_read_and_the_next_read_maps() {
        use crate::vfs::{FaultKind, FaultVfs, OsVfs};
        let dir = tempfile::tempdir().unwrap();
        let vfs = FaultVfs::new(Arc::new(OsVfs));
        let s = Store::open(
            dir.path(),
            Options::default()
                .durability(Durability::Buffered)
                // No thread building the next segment beside the test's reads.
                .next_segment(NextSegment::Inline)
                .vfs(Arc::new(vfs.clone())),
        )
        .unwrap();
        let mut last = None;
        for i in 0..400u64 {
            let o = s
                .append(NewCommit::new(
                    "s",
                    ExpectedVersion::Exact(i),
                    vec![EventData::new("e", vec![i as u8; 4000])],
                ))
                .unwrap();
            last = o.info().map(|c| c.position);
        }
        let pos = last.unwrap();
        let seg = s.segment_at(pos).unwrap();
        assert!(seg.end.load(Ordering::Acquire) > crate::ACTIVE_MAP_SLACK_BYTES);
        assert_eq!(seg.map_state(), None);
        // The next read call is the map of the prefix.
        vfs.reset_counts();
        vfs.fail_nth(FaultKind::Read, 1, false);
        let err = s.visit_at(pos, |c| c.seq).unwrap_err();
        match &err {
            Error::Io { path, op, .. } => {
                assert_eq!(*op, "map");
                assert!(path.ends_with(&seg.name), "{err}");
            }
            other => panic!("expected an I/O error naming the segment, got {other}"),
        }
        assert_eq!(vfs.injected(), 1);
        assert_eq!(seg.map_state(), None);
        // Not poisoned; the next read maps the prefix and reads the record.
        assert_eq!(s.visit_at(pos, |c| c.seq).unwrap(), 400);
        assert!(matches!(seg.map_state(), Some((_, false))));
        let o = s
            .append(NewCommit::new(
                "s",
                ExpectedVersion::Exact(400),
                vec![EventData::new("e", vec![1])],
            ))
            .unwrap();
        assert!(matches!(o, AppendOutcome::Committed(_)));
    }

    #[test]
    fn losing_the_memtable_is_caught_up_from_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let opts = || {
            Options::default()
                .durability(Durability::Buffered)
                .segment_bytes_max(1 << 20)
        };
        let s = Store::open(dir.path(), opts()).unwrap();
        // More than one memtable's worth: one background move into sled, then the rest.
        let n = 5000u64;
        for i in 0..n {
            let stream = format!("s{}", i % 7);
            let v = s.stream_version(&stream).unwrap().unwrap_or(0);
            let o = s
                .append(NewCommit::new(stream, ExpectedVersion::Exact(v), ev(i)))
                .unwrap();
            assert!(matches!(o, AppendOutcome::Committed(_)));
        }
        let heads = s.streams().unwrap();
        let dump = s.index().dump().unwrap();
        s.flush().unwrap();
        s.inner.index.forget_memtable();
        let behind = s.index().applied_seq().unwrap();
        assert!(behind > 0 && behind < n, "applied {behind}");
        drop(s);
        let s = Store::open(dir.path(), opts()).unwrap();
        assert_eq!(s.index().applied_seq().unwrap(), n);
        assert_eq!(s.streams().unwrap(), heads);
        assert_eq!(s.index().dump().unwrap(), dump);
        assert_eq!(s.read_stream("s3", 700, 10).unwrap().len(), 10);
    }
}

/// The index thread ([`crate::prepare`]): a durable group of at least
/// `PREPARE_THREAD_COMMITS_MIN` commits is prepared during its fdatasync. Each test
/// holds a first writer inside its fdatasync (a paused [`FaultVfs`] call) until eight
/// more commits have lined up, so the second group is exactly those eight.
#[cfg(test)]
mod prepare_tests {
    use super::*;
    use crate::index::IndexBatch;
    use crate::vfs::{FaultKind, FaultVfs, OsVfs};
    use crate::Indexer;
    use std::time::Duration;

    const LINED_UP: usize = 8;

    /// Writes one key per commit (its seq) after checking that the previous commit's
    /// key is there: a group prepared against an index missing an earlier group fails.
    /// Panics on a commit to the stream "boom".
    struct Chain;

    impl Indexer for Chain {
        fn name(&self) -> &'static str {
            "chain"
        }
        fn version(&self) -> u32 {
            1
        }
        fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
            assert!(c.info.stream != "boom", "the chain indexer met stream boom");
            let seq = c.info.seq;
            if seq > 1 && batch.get(&(seq - 1).to_be_bytes())?.is_none() {
                return Err(IndexError::indexer(
                    "chain",
                    format!(
                        "commit {seq} prepared before commit {} was visible",
                        seq - 1
                    ),
                ));
            }
            batch.insert(&seq.to_be_bytes(), c.info.stream.as_bytes());
            Ok(())
        }
    }

    fn open(dir: &Path) -> (Arc<Store>, FaultVfs) {
        open_polling(dir, Options::default().index_thread_poll)
    }

    fn open_polling(dir: &Path, poll: Duration) -> (Arc<Store>, FaultVfs) {
        let vfs = FaultVfs::new(Arc::new(OsVfs));
        let opts = Options::default()
            .durability(Durability::Immediate)
            .segment_bytes_max(1 << 20)
            .vfs(Arc::new(vfs.clone()))
            .next_segment(NextSegment::Inline)
            .index_thread_poll(poll)
            .indexer(Arc::new(Chain));
        (Arc::new(Store::open(dir, opts).unwrap()), vfs)
    }

    /// With the longest poll window allowed: a commit up to 10 ms after the one
    /// before still counts as back to back, even on a loaded machine.
    fn open_polling_longest(dir: &Path) -> (Arc<Store>, FaultVfs) {
        open_polling(dir, Duration::from_micros(crate::INDEX_THREAD_POLL_MAX_US))
    }

    /// A lone writer appending back to back: its one-commit groups go to the index
    /// thread, which polls for them. The window is the longest allowed, so a commit
    /// up to 10 ms after the one before keeps the thread polling even on a loaded
    /// machine; no assertion counts on more than one such pair in 200 commits.
    #[test]
    fn a_lone_writers_back_to_back_groups_are_prepared_during_their_fdatasync() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _vfs) = open_polling_longest(dir.path());
        let n = 200u64;
        for i in 0..n {
            append(&s, &format!("s{i}")).unwrap();
        }
        let st = s.stats();
        assert_eq!(st.write_groups, n, "{st:?}");
        assert!(st.groups_prepared_ahead >= 1, "{st:?}");
        assert!(st.groups_polled >= 1, "{st:?}");
        assert!(st.groups_polled <= st.groups_prepared_ahead, "{st:?}");
        // Each commit was prepared against an index holding the one before (the
        // chain indexer fails otherwise) and is visible once acknowledged.
        assert_eq!(s.index().applied_seq().unwrap(), n);
        for seq in 1..=n {
            assert!(
                s.index()
                    .get("chain", &seq.to_be_bytes())
                    .unwrap()
                    .is_some(),
                "{seq}"
            );
        }
    }

    /// A failed fdatasync of a lone writer's group, whichever thread prepares it:
    /// nothing of the group is published and the store refuses writes.
    #[test]
    fn a_lone_writers_failed_fdatasync_publishes_nothing_while_the_thread_polls() {
        let dir = tempfile::tempdir().unwrap();
        let (s, vfs) = open_polling_longest(dir.path());
        for i in 0..5 {
            append(&s, &format!("s{i}")).unwrap();
        }
        vfs.fail_nth(FaultKind::Sync, 1, false);
        assert!(matches!(append(&s, "lost"), Err(Error::Io { .. })));
        assert!(s.is_poisoned());
        assert_eq!(s.index().applied_seq().unwrap(), 5);
        assert!(s
            .index()
            .get("chain", &6u64.to_be_bytes())
            .unwrap()
            .is_none());
        assert!(s.read_stream("lost", 1, 10).unwrap().is_empty());
        assert!(matches!(append(&s, "later"), Err(Error::Poisoned)));
    }

    #[test]
    fn without_a_poll_window_a_lone_writer_indexes_its_own_groups() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _vfs) = open_polling(dir.path(), Duration::ZERO);
        for i in 0..20 {
            append(&s, &format!("s{i}")).unwrap();
        }
        let st = s.stats();
        assert_eq!(
            (st.groups_prepared_ahead, st.groups_polled),
            (0, 0),
            "{st:?}"
        );
        assert!(lock(&s.inner.w).preparer.is_none());
        assert_eq!(s.index().applied_seq().unwrap(), 20);
    }

    /// A group of at least `PREPARE_THREAD_BYTES_MIN` bytes goes to the index thread
    /// even alone and without a poll window (a fork's one large commit).
    #[test]
    fn a_large_group_is_prepared_during_its_fdatasync_even_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _vfs) = open_polling(dir.path(), Duration::ZERO);
        append(&s, "small").unwrap();
        append_big(&s, "big");
        let st = s.stats();
        assert_eq!(
            (st.groups_prepared_ahead, st.groups_polled),
            (1, 0),
            "{st:?}"
        );
        assert_eq!(s.index().applied_seq().unwrap(), 2);
        assert_eq!(s.read_stream("big", 1, 10).unwrap().len(), 1);
    }

    /// After a large group the index thread sleeps instead of polling: the small
    /// group right after it reaches the thread by a wake-up, not a poll (with a poll
    /// after every group of one commit, it was taken polling).
    #[test]
    fn the_index_thread_does_not_poll_after_a_large_group() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _vfs) = open_polling_longest(dir.path());
        append(&s, "small").unwrap();
        append_big(&s, "big");
        append(&s, "after").unwrap();
        let st = s.stats();
        assert!(st.groups_prepared_ahead >= 1, "{st:?}");
        assert_eq!(st.groups_polled, 0, "{st:?}");
        assert_eq!(s.index().applied_seq().unwrap(), 3);
    }

    fn append_big(s: &Store, stream: &str) {
        let big = vec![7u8; PREPARE_THREAD_BYTES_MIN];
        let r = s.append(NewCommit::new(
            stream,
            ExpectedVersion::Exact(0),
            vec![EventData::new("e", big)],
        ));
        assert!(matches!(r, Ok(AppendOutcome::Committed(_))), "{r:?}");
    }

    /// Sixteen durable writers, each waiting for the group that acknowledges its commit
    /// or leading the next one: every one of them is woken, every commit is
    /// indexed in seq order (the chain indexer checks), and each stream has all of its
    /// versions. A wake-up that went missing would leave a writer waiting forever: the
    /// test fails on a deadline instead of hanging.
    #[test]
    fn every_waiting_writer_is_woken_by_the_group_that_acknowledges_it() {
        const WRITERS: usize = 16;
        const COMMITS: u64 = 40;
        let dir = tempfile::tempdir().unwrap();
        let (s, _vfs) = open(dir.path());
        let (done_tx, done_rx) = std::sync::mpsc::channel();
        let threads: Vec<_> = (0..WRITERS)
            .map(|w| {
                let s = s.clone();
                let done_tx = done_tx.clone();
                std::thread::spawn(move || {
                    let stream = format!("w{w}");
                    for v in 0..COMMITS {
                        let r = s.append(NewCommit::new(
                            stream.as_str(),
                            ExpectedVersion::Exact(v),
                            vec![EventData::new("e", vec![w as u8; 64])],
                        ));
                        assert!(matches!(r, Ok(AppendOutcome::Committed(_))), "{r:?}");
                    }
                    done_tx.send(w).unwrap();
                })
            })
            .collect();
        drop(done_tx);
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        for _ in 0..WRITERS {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match done_rx.recv_timeout(left) {
                Ok(_) => {}
                Err(e) => panic!("a writer never finished ({e}): a wake-up went missing"),
            }
        }
        for t in threads {
            t.join().unwrap();
        }
        let total = WRITERS as u64 * COMMITS;
        assert_eq!(s.last_seq(), total);
        assert_eq!(s.index().applied_seq().unwrap(), total);
        for w in 0..WRITERS {
            assert_eq!(s.stream_version(&format!("w{w}")).unwrap(), Some(COMMITS));
        }
        assert!(!s.is_poisoned());
    }

    /// A poll window past the limit is clamped to it.
    #[test]
    fn the_poll_window_is_clamped() {
        let o = Options::default().index_thread_poll(Duration::from_secs(5));
        assert_eq!(
            o.index_thread_poll_window(),
            Duration::from_micros(crate::INDEX_THREAD_POLL_MAX_US)
        );
    }

    #[test]
    fn flush_index_leaves_nothing_in_memory_and_the_applied_marker_in_sled() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _vfs) = open(dir.path());
        for i in 0..20 {
            append(&s, &format!("s{i}")).unwrap();
        }
        let index = &s.inner.index;
        assert!(index.mem_is_empty_for_tests() == Some(false));
        s.flush_index().unwrap();
        assert_eq!(index.mem_is_empty_for_tests(), Some(true));
        assert_eq!(index.sled_applied_seq_for_tests(), Some(20));
        // Everything stays readable, and appends go on.
        assert_eq!(
            index.get("chain", &20u64.to_be_bytes()).unwrap().as_deref(),
            Some(&b"s19"[..])
        );
        append(&s, "after").unwrap();
        assert_eq!(index.applied_seq().unwrap(), 21);
    }

    #[test]
    fn flush_index_on_a_poisoned_store_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (s, vfs) = open(dir.path());
        append(&s, "a").unwrap();
        vfs.fail_nth(FaultKind::Sync, 1, false);
        assert!(append(&s, "b").is_err());
        assert!(matches!(s.flush_index(), Err(Error::Poisoned)));
    }

    fn append(s: &Store, stream: &str) -> Result<AppendOutcome, Error> {
        s.append(NewCommit::new(
            stream,
            ExpectedVersion::Exact(0),
            vec![EventData::new("e", stream.as_bytes().to_vec())],
        ))
    }

    /// Commit 1 to stream "first", held in its fdatasync until `streams` (eight) have
    /// lined up behind it; `before_resume` runs then. Returns both outcomes.
    #[allow(clippy::type_complexity)]
    fn line_up(
        s: &Arc<Store>,
        vfs: &FaultVfs,
        streams: [&'static str; LINED_UP],
        before_resume: impl FnOnce(),
    ) -> (
        Result<AppendOutcome, Error>,
        Vec<Result<AppendOutcome, Error>>,
    ) {
        vfs.pause_nth(FaultKind::Sync, 1);
        let first = {
            let s = s.clone();
            std::thread::spawn(move || append(&s, "first"))
        };
        assert!(
            vfs.wait_paused(Duration::from_secs(30)),
            "the first fdatasync never came"
        );
        let rest: Vec<_> = streams
            .into_iter()
            .map(|name| {
                let s = s.clone();
                std::thread::spawn(move || append(&s, name))
            })
            .collect();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while lock(&s.inner.w).batch.len() < LINED_UP {
            assert!(
                std::time::Instant::now() < deadline,
                "the writers never lined up"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        before_resume();
        vfs.resume();
        let first = first.join().unwrap();
        let rest = rest.into_iter().map(|t| t.join().unwrap()).collect();
        (first, rest)
    }

    /// The seqs of the test's commits (1 to 9) whose chain key the index shows.
    fn indexed(s: &Store) -> Vec<u64> {
        (1..=1 + LINED_UP as u64)
            .filter(|seq| {
                s.index()
                    .get("chain", &seq.to_be_bytes())
                    .unwrap()
                    .is_some()
            })
            .collect()
    }

    const STREAMS: [&str; LINED_UP] = ["s1", "s2", "s3", "s4", "s5", "s6", "s7", "s8"];

    #[test]
    fn a_durable_group_is_prepared_during_its_fdatasync_and_published_after_it() {
        let dir = tempfile::tempdir().unwrap();
        let (s, vfs) = open(dir.path());
        let (first, rest) = line_up(&s, &vfs, STREAMS, || {});
        assert!(
            matches!(first, Ok(AppendOutcome::Committed(_))),
            "{first:?}"
        );
        for r in &rest {
            assert!(matches!(r, Ok(AppendOutcome::Committed(_))), "{r:?}");
        }
        // The second group went through the index thread, which is kept for the next.
        assert!(lock(&s.inner.w).preparer.is_some());
        assert_eq!(s.stats().write_groups, 2);
        assert_eq!(indexed(&s), (1..=1 + LINED_UP as u64).collect::<Vec<_>>());
        for name in STREAMS {
            assert_eq!(s.read_stream(name, 1, 10).unwrap().len(), 1, "{name}");
        }
        // A reopen finds the same index (the applied seq covers the group).
        assert_eq!(s.index().applied_seq().unwrap(), 1 + LINED_UP as u64);
    }

    #[test]
    fn a_group_whose_fdatasync_fails_publishes_nothing_it_prepared() {
        let dir = tempfile::tempdir().unwrap();
        let (s, vfs) = open(dir.path());
        // The paused call is the first group's; the next fdatasync is the second's.
        let (first, rest) = line_up(&s, &vfs, STREAMS, || {
            vfs.fail_nth(FaultKind::Sync, 1, false)
        });
        assert!(
            matches!(first, Ok(AppendOutcome::Committed(_))),
            "{first:?}"
        );
        assert!(rest.iter().all(Result::is_err), "{rest:?}");
        assert!(
            rest.iter().any(|r| matches!(r, Err(Error::Io { .. }))),
            "{rest:?}"
        );
        assert!(s.is_poisoned());
        assert_eq!(vfs.injected(), 1);
        // The index thread prepared the group (the chain indexer saw commit 1), but
        // none of it is visible: not its keys, not its versions, not its applied seq.
        assert_eq!(indexed(&s), vec![1]);
        for name in STREAMS {
            assert!(s.read_stream(name, 1, 10).unwrap().is_empty(), "{name}");
        }
        assert_eq!(s.index().applied_seq().unwrap(), 1);
        assert!(matches!(append(&s, "later"), Err(Error::Poisoned)));
    }

    /// Found while moving the indexers to the index thread: a panicking indexer
    /// unwound through the leader, which never gave up leadership, so every later
    /// append waited forever.
    #[test]
    fn a_panicking_indexer_fails_the_append_instead_of_stranding_the_writers() {
        let dir = tempfile::tempdir().unwrap();
        let (s, _vfs) = open(dir.path());
        assert!(matches!(
            append(&s, "first"),
            Ok(AppendOutcome::Committed(_))
        ));
        let r = append(&s, "boom");
        assert!(
            matches!(&r, Err(Error::Index(IndexError::Indexer { name, message })) if name == "chain" && message.contains("panicked on commit 2")),
            "{r:?}"
        );
        assert!(s.is_poisoned());
        assert!(matches!(append(&s, "later"), Err(Error::Poisoned)));
        assert_eq!(s.index().applied_seq().unwrap(), 1);
    }

    #[test]
    fn an_indexer_panicking_on_the_index_thread_fails_the_group_and_poisons() {
        let dir = tempfile::tempdir().unwrap();
        let (s, vfs) = open(dir.path());
        let mut streams = STREAMS;
        streams[3] = "boom";
        let (first, rest) = line_up(&s, &vfs, streams, || {});
        assert!(
            matches!(first, Ok(AppendOutcome::Committed(_))),
            "{first:?}"
        );
        let panicked = rest
            .iter()
            .filter(|r| matches!(r, Err(Error::Index(IndexError::Indexer { name, message })) if name == "chain" && message.contains("panicked") && message.contains("boom")))
            .count();
        assert_eq!(panicked, 1, "{rest:?}");
        assert!(
            rest.iter()
                .all(|r| matches!(r, Err(Error::Poisoned | Error::Index(_)))),
            "{rest:?}"
        );
        assert!(s.is_poisoned());
        assert_eq!(s.index().applied_seq().unwrap(), 1);
        assert_eq!(indexed(&s), vec![1]);
    }
}
