//! Opening a store: the owner lock, the scan of the log on open (record and history
//! validation, torn-tail repair by the owner), the catch-up or rebuild of the index,
//! and the read-only view of a store another process may own.
//!
//! Both opens start from the newest checkpoint when the log backs it and read only
//! the records after it (`check_resume`, `scan_opened`): a read-only open layers a
//! memtable over the checkpoint file; the owner needs its sled index to hold at
//! least the checkpoint's commits of the same history (`resume_owner`). Otherwise,
//! or on any mismatch found in the tail, the whole log is read.

use super::*;
use crate::index::VERSIONS_PER_BLOCK;

/// What scanning the log on open found.
pub(super) struct LogState {
    segments: BTreeMap<u64, Arc<Segment>>,
    last_seq: u64,
    last_ts: i64,
    heads: foldhash::HashMap<String, u64>,
    ids: CommitIdFilter,
    /// `ids` holds every commit id of the log (the scan read the whole log).
    ids_complete: bool,
    /// The index's applied seq names a record the log does not have (or another one).
    index_stale: bool,
    /// Largest segment id in the directory.
    max_id: u64,
    /// The log's layout id (see `layout_of`).
    layout: u64,
    /// Records decoded (validated and read) by the scan.
    decoded: u64,
}

/// Where a scan resumes after a checkpoint (see `check_resume`): the segments before
/// the checkpoint's are taken as the checkpoint describes them (headers checked, no
/// frame read), and the scan starts after the checkpoint's record.
pub(super) struct Resume {
    /// The checkpoint: each stream's head as of its record comes from it.
    ck: Arc<crate::checkpoint::CheckpointFile>,
    /// Index in log order of the segment holding the checkpoint's record.
    p_index: usize,
    segments: Vec<crate::checkpoint::SegmentEnd>,
    /// One past the checkpoint's record.
    p_end: u64,
    seq: u64,
    commit_id: Uuid,
    position: LogPosition,
    last_ts: i64,
    /// A segment written by GC comes before the checkpoint's record.
    compacted_before: bool,
}

/// What an open did (see [`StoreStats`]).
#[derive(Debug, Clone, Default)]
pub(crate) struct OpenReport {
    pub decoded: u64,
    pub checkpoint_seq: Option<u64>,
    pub checkpoint_fallback: Option<String>,
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
    /// Works while a writer holds the store and appends; sees a prefix of the log as it
    /// was when opened, ending before any record the writer was still writing (see
    /// `segment::frame_landed_since` for the rule), never reported as damage.
    pub fn open_read_only(dir: impl AsRef<Path>, opts: Options) -> Result<Store, Error> {
        Store::open_impl(dir.as_ref(), opts, true)
    }

    /// [`Store::open_read_only`] that ignores checkpoints: the index rebuilt from the
    /// whole log (what `verify` compares a checkpoint with).
    pub(crate) fn open_read_only_from_log(dir: &Path, opts: Options) -> Result<Store, Error> {
        Store::open_impl_with(dir, opts, true, false)
    }

    pub(super) fn open_impl(dir: &Path, opts: Options, read_only: bool) -> Result<Store, Error> {
        Store::open_impl_with(dir, opts, read_only, true)
    }

    fn open_impl_with(
        dir: &Path,
        opts: Options,
        read_only: bool,
        use_checkpoint: bool,
    ) -> Result<Store, Error> {
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
            create_store_dir(&*vfs, dir)?;
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
        if !read_only {
            // An erasing GC committed: its old values are still in the index's files.
            crate::gc::finish_erasure(&*vfs, dir, index_path.as_deref())?;
        }
        let mut report = OpenReport::default();
        let from_checkpoint = if read_only && use_checkpoint {
            match crate::checkpoint::read::newest(&*vfs, dir) {
                Some(path) => match open_from_checkpoint(&*vfs, dir, &opts, &path) {
                    Ok((index, state, seq)) => {
                        report.checkpoint_seq = Some(seq);
                        Some((index, state))
                    }
                    Err(reason) => {
                        report.checkpoint_fallback = Some(reason);
                        None
                    }
                },
                None => None,
            }
        } else {
            None
        };
        let (index, state) = match from_checkpoint {
            Some(opened) => opened,
            None if read_only => open_from_log(&*vfs, dir, &opts, None, true)?,
            None => open_owner(&*vfs, dir, &opts, index_path.as_deref(), &mut report)?,
        };
        report.decoded = state.decoded;
        Store::open_with(dir, opts, read_only, guard, index, state, report)
    }

    #[allow(clippy::too_many_arguments)]
    fn open_with(
        dir: &Path,
        opts: Options,
        read_only: bool,
        guard: Option<Box<dyn VfsLock>>,
        index: Index,
        state: LogState,
        report: OpenReport,
    ) -> Result<Store, Error> {
        let vfs = opts.vfs.clone();
        let mut state = state;
        let mut segments = std::mem::take(&mut state.segments);
        // The active segment is the last in log order, unless that one was written by GC
        // (or the log is empty): then a new one starts.
        let last = segment::in_log_order(segments.values()).pop();
        // A new active segment follows the last one's capacity (see `next_segment_capacity`).
        let new_cap = format::next_segment_capacity(
            last.as_ref().map(|s| s.capacity),
            opts.segment_bytes_max,
        );
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
                let seg = create_segment(&*vfs, dir, &opts, id, new_cap)?;
                segments.insert(id, seg.clone());
                next_segment_id = id;
                seg
            }
        };
        let checkpoints = Arc::new(crate::checkpoint::Shared::new(vfs.clone(), dir, &opts));
        if !read_only {
            // The newest checkpoint is known to be the index only when it is its base
            // (resumed from it, or adopted into an empty index): a resume from another
            // checks its version entries, not every entry.
            let of_index = report.checkpoint_seq.is_some()
                && index.base().map(|b| b.header.seq) == report.checkpoint_seq;
            checkpoints.adopt_or_remove(&segments, opts.record_bytes_max, state.last_seq, of_index);
        }
        let segments = Arc::new(RwLock::new(segments));
        if !read_only {
            let shared = checkpoints.clone();
            let segs = Arc::downgrade(&segments);
            index.set_after_move(Arc::new(move |view, at| {
                if let Some(segs) = segs.upgrade() {
                    shared.after_move(&segs, view, at);
                }
            }));
            checkpoints.keep_base(index.base_seq_cell());
            // Older checkpoints than the base are of no use (a close that made its
            // checkpoint the next base removes the one before, unless cut short).
            if let Some(base) = index.base() {
                checkpoints.remove_before(base.header.seq);
            }
        }
        build_store(
            dir,
            opts,
            read_only,
            guard,
            index,
            state,
            segments,
            active,
            next_segment_id,
            checkpoints,
            report,
        )
    }
}

/// The index and the log state of an open that reads the whole log (the owner's, and a
/// read-only open without a usable checkpoint).
fn open_from_log(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    index_path: Option<&Path>,
    read_only: bool,
) -> Result<(Index, LogState), Error> {
    let (index, _fresh) = Index::open_sized(
        index_path,
        opts.indexers.clone(),
        opts.index_cache_bytes_max,
    )?;
    let state = scan_whole(vfs, dir, opts, &index, read_only)?;
    Ok((index, state))
}

/// The owner's index and log state. With a checkpoint the log backs and a sled index
/// that holds at least the checkpoint's commits, of the same history, only the log
/// after the checkpoint's record is read (see `resume_owner`); otherwise, or when that
/// tail shows the index disagrees with the log, the whole log.
fn open_owner(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    index_path: Option<&Path>,
    report: &mut OpenReport,
) -> Result<(Index, LogState), Error> {
    let (index, mut fresh) = Index::open_sized(
        index_path,
        opts.indexers.clone(),
        opts.index_cache_bytes_max,
    )?;
    if opts.index_bulk_load {
        // Before the catch-up: what a crashed bulk load left to read from the log goes
        // to runs too, not into sled.
        index.start_spill()?;
    }
    if !fresh {
        if let Some(id) = index.base_id()? {
            match crate::checkpoint::open_base(vfs, dir, &id) {
                Ok(ck) => index.attach_base(Arc::new(ck), true),
                Err(why) => {
                    // sled holds only what changed since a checkpoint that is gone:
                    // start again from the newest one instead.
                    report.checkpoint_fallback = Some(format!(
                        "the index's base checkpoint: {why}; the index was rebuilt"
                    ));
                    index.clear(0)?;
                    fresh = true;
                }
            }
        }
    }
    if let Some(path) = crate::checkpoint::read::newest(vfs, dir) {
        let adopt = !opts.index_from_log;
        let mut resumed = resume_owner(vfs, dir, opts, &index, &path, fresh && adopt);
        if matches!(&resumed, Err(u) if u.behind && adopt) {
            // The checkpoint holds more than the index (sled lost its last moves in a
            // crash): it replaces the index.
            index.clear(0)?;
            resumed = resume_owner(vfs, dir, opts, &index, &path, true);
        }
        match resumed {
            Ok((state, seq)) if !state.index_stale => {
                report.checkpoint_seq = Some(seq);
                return Ok((index, state));
            }
            Ok((state, _)) => {
                report.checkpoint_fallback = Some(format!(
                    "checkpoint {}: the index disagrees with the log after it",
                    path.display()
                ));
                // Entries the scan could not check may be wrong too: rebuild it all.
                index.clear(state.layout)?;
            }
            Err(Unresumable {
                reason, rebuild, ..
            }) => {
                if report.checkpoint_fallback.is_none() {
                    report.checkpoint_fallback = Some(reason);
                }
                if rebuild {
                    index.clear(index.layout()?)?;
                }
            }
        }
    }
    let state = scan_whole(vfs, dir, opts, &index, false)?;
    Ok((index, state))
}

/// The owner's scan resumed after the checkpoint at `path`, or why it cannot be (the
/// open then reads the whole log). Besides what a read-only open checks
/// (`checked_checkpoint`), sled must be of the checkpoint's log layout and hold at
/// least its commits: its applied marker at or after the checkpoint's seq (the same
/// commit when equal; after it, the tail scan finds the marker's record), and every
/// version entry of the checkpoint (what the whole-log open checks against the log
/// before the checkpoint's record). The tail's records up to the marker are checked
/// against sled, later ones applied to it. An index found empty (`adopt`) takes the
/// checkpoint as the base of its sled first, and then holds exactly its commits.
fn resume_owner(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    index: &Index,
    path: &Path,
    adopt: bool,
) -> Result<(LogState, u64), Unresumable> {
    let what = |w: String| Unresumable {
        reason: format!("checkpoint {}: {w}", path.display()),
        rebuild: false,
        behind: false,
    };
    let (opened, max_id, resume) =
        checked_checkpoint(vfs, dir, opts, path, false).map_err(|reason| Unresumable {
            reason,
            rebuild: false,
            behind: false,
        })?;
    if adopt {
        index
            .adopt_base(resume.ck.clone())
            .map_err(|e| what(e.to_string()))?;
    }
    let layout = index.layout().map_err(|e| what(e.to_string()))?;
    if layout != resume.ck.header.layout {
        return Err(what(format!(
            "the index was built for log layout {layout}, the checkpoint for {}",
            resume.ck.header.layout
        )));
    }
    let (applied, applied_id) = index.applied_marker().map_err(|e| what(e.to_string()))?;
    if applied < resume.seq {
        return Err(Unresumable {
            behind: true,
            ..what(format!(
                "the index holds commits up to seq {applied}, before the checkpoint's {}",
                resume.seq
            ))
        });
    }
    if applied == resume.seq && applied_id != Some(resume.commit_id) {
        return Err(what(format!(
            "the index names another commit at seq {applied}"
        )));
    }
    let seq = resume.seq;
    // Resumed from sled's own base, only sled's version blocks can disagree with it.
    let is_base = index
        .base()
        .is_some_and(|b| crate::index::BaseId::of(&b).names(&resume.ck));
    let held = match is_base {
        true => index.delta_extends_base(),
        false => index.holds_checkpoint_versions(&resume.ck),
    };
    if !held.map_err(|e| what(e.to_string()))? {
        // Sled and the checkpoint disagree on commits both hold: the whole-log open
        // checks only some entries, so the index is rebuilt rather than trusted.
        return Err(Unresumable {
            rebuild: true,
            ..what("the index lacks version entries the checkpoint holds".into())
        });
    }
    let mut state = scan_opened(vfs, dir, opts, index, false, opened, max_id, Some(&resume))
        .map_err(|e| what(format!("the log after it: {e}")))?;
    if !state.index_stale {
        // The writer checks versions against every stream's head: the tail's streams
        // have theirs from the scan, the others from the index (caught up now), which
        // must agree on the former.
        let mut heads = foldhash::HashMap::default();
        for (stream, version) in index.streams().map_err(|e| what(e.to_string()))? {
            heads.insert(stream, version);
        }
        state.index_stale = state.heads.iter().any(|(s, v)| heads.get(s) != Some(v));
        state.heads = heads;
    }
    Ok((state, seq))
}

/// Why an owner's open does not resume after a checkpoint, whether the index must be
/// rebuilt from the log rather than checked against it, and whether it only holds
/// fewer commits than the checkpoint (which may then replace it).
struct Unresumable {
    reason: String,
    rebuild: bool,
    behind: bool,
}

/// [`scan_log`] of the whole log into `index`, rebuilding the index from the log when
/// it is ahead of the log or describes another history.
fn scan_whole(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    index: &Index,
    read_only: bool,
) -> Result<LogState, Error> {
    {
        let mut state = scan_log(vfs, dir, opts, index, read_only);
        if read_only {
            // A live writer may be appending to the last segment while it is scanned: a
            // frame caught half-written with a complete one after it looks like mid-log
            // corruption. Real corruption stays; a race does not survive a rescan.
            let mut tries = 0;
            while tries < READ_ONLY_RESCANS && matches!(state, Err(Error::Corrupt { .. })) {
                tries += 1;
                std::thread::sleep(std::time::Duration::from_millis(10));
                index.clear(0)?;
                state = scan_log(vfs, dir, opts, index, read_only);
            }
        }
        let mut state = state?;
        if state.index_stale {
            // The index is ahead of the log or describes another history (e.g. after a
            // crash with Buffered durability): rebuild it from the log.
            index.clear(state.layout)?;
            state = scan_log(vfs, dir, opts, index, read_only)?;
            debug_assert!(!state.index_stale);
            let _ = index.flush();
        }
        Ok(state)
    }
}

/// The index and the log state of a read-only open from the checkpoint at `path`,
/// or why the checkpoint cannot be used (the open then reads the whole log): only the
/// records after it are read (see `checked_checkpoint`), into a memtable over the
/// checkpoint file.
fn open_from_checkpoint(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    path: &Path,
) -> Result<(Index, LogState, u64), String> {
    let what = |w: String| format!("checkpoint {}: {w}", path.display());
    let (opened, max_id, resume) = checked_checkpoint(vfs, dir, opts, path, true)?;
    let seq = resume.seq;
    let index = Index::over_checkpoint(opts.indexers.clone(), resume.ck.clone());
    let state = scan_opened(vfs, dir, opts, &index, true, opened, max_id, Some(&resume))
        .map_err(|e| what(format!("the log after it: {e}")))?;
    if state.index_stale {
        return Err(what("the index it holds disagrees with the log".into()));
    }
    Ok((index, state, seq))
}

/// Open the checkpoint at `path` and check it against the log (layout, indexers, the
/// record it ends with, see `check_resume`): the log's segments, opened, and where a
/// scan resumes; or why the checkpoint cannot be used.
fn checked_checkpoint(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    path: &Path,
    read_only: bool,
) -> Result<(Vec<OpenedSegment>, u64, Resume), String> {
    let ck = crate::checkpoint::CheckpointFile::open(vfs, path)?;
    let h = &ck.header;
    let what = |w: String| format!("checkpoint {}: {w}", path.display());
    if h.index_format != crate::index::INDEX_FORMAT_VERSION {
        return Err(what(format!("index format {}", h.index_format)));
    }
    let mut want: Vec<(String, u32)> = opts
        .indexers
        .iter()
        .map(|i| (i.name().to_string(), i.version()))
        .collect();
    let mut have = h.indexers.clone();
    want.sort();
    have.sort();
    if want != have {
        return Err(what(format!(
            "made with the indexers {have:?}, this open registers {want:?}"
        )));
    }
    let max = opts.record_bytes_max;
    // A reader over a checkpoint opens only the segments from its record's on; the
    // ones before are opened by the first read reaching them. That needs their headers:
    // a checkpoint of an older format has none, which is right only for a log no GC
    // rewrote (layout 0: every segment is plain).
    let listed = h
        .segments
        .split_last()
        .map_or(&[][..], |(_, before)| before);
    let headed = listed.iter().all(|t| t.header.is_some());
    let (opened, max_id) = if read_only && (h.layout == 0 || headed) {
        open_segments_over(&opts.vfs, dir, max, listed)
    } else {
        open_segments_in_order(vfs, dir, max, read_only)
    }
    .map_err(|e| what(e.to_string()))?;
    check_plain_order(&opened).map_err(|e| what(e.to_string()))?;
    let layout = layout_of(&opened);
    if layout != h.layout {
        return Err(what(format!(
            "made for log layout {}, the log has layout {layout}",
            h.layout
        )));
    }
    let resume = check_resume(&opened, Arc::new(ck), max).map_err(what)?;
    Ok((opened, max_id, resume))
}

/// Check a checkpoint's header against the opened log: the segments up to the one
/// holding its record are the ones it lists, with valid headers and at least as long
/// as it says, and that segment holds its record (seq and commit id) at its offset.
/// Reads each segment's header and the one record, nothing else.
fn check_resume(
    opened: &[OpenedSegment],
    ck: Arc<crate::checkpoint::CheckpointFile>,
    max: u32,
) -> Result<Resume, String> {
    let h = &ck.header;
    let p_index = opened
        .iter()
        .position(|s| s.id == h.segment)
        .ok_or_else(|| format!("its segment {} is not in the log", h.segment))?;
    if h.segments.len() != p_index + 1 {
        return Err(format!(
            "lists {} segments up to its record's, the log has {}",
            h.segments.len(),
            p_index + 1
        ));
    }
    let mut compacted_before = false;
    for (i, (s, t)) in opened.iter().zip(&h.segments).enumerate() {
        if s.id != t.id {
            return Err(format!("lists segment {} where the log has {}", t.id, s.id));
        }
        let header = s
            .header
            .as_ref()
            .map_err(|_| format!("segment {} has no valid header", s.id))?;
        if i < p_index {
            if t.end < header.data_start || t.end > s.len {
                return Err(format!("segment {} is shorter than it says", s.id));
            }
            compacted_before |= header.compacted.is_some();
        } else if header.compacted.is_some() {
            return Err("its record is in a segment written by GC".into());
        }
    }
    let seg = &opened[p_index];
    let data_start = seg
        .header
        .as_ref()
        .map(|h| h.data_start)
        .unwrap_or(u64::MAX);
    let mismatch = || {
        format!(
            "the log does not hold its record (seq {} at segment {} offset {}): \
             from another store, or ahead of the log",
            h.seq, h.segment, h.offset
        )
    };
    if h.offset < data_start {
        return Err(mismatch());
    }
    let frame = segment::read_plausible_frame(&*seg.file, h.offset, max)
        .map_err(|e| format!("segment {}: {e}", seg.id))?
        .ok_or_else(mismatch)?;
    let format::FrameCheck::Valid { payload, total, .. } = format::check_frame(&frame, seg.id, max)
    else {
        return Err(mismatch());
    };
    let pos = LogPosition {
        segment: seg.id,
        offset: h.offset,
    };
    let rec = format::decode_commit_head(payload, pos).map_err(|_| mismatch())?;
    if rec.info.seq != h.seq || rec.info.commit_id != h.commit_id {
        return Err(mismatch());
    }
    Ok(Resume {
        p_index,
        segments: h.segments.clone(),
        p_end: h.offset + total,
        seq: h.seq,
        commit_id: h.commit_id,
        position: pos,
        last_ts: h.last_ts,
        compacted_before,
        ck,
    })
}

#[allow(clippy::too_many_arguments)]
fn build_store(
    dir: &Path,
    opts: Options,
    read_only: bool,
    guard: Option<Box<dyn VfsLock>>,
    index: Index,
    state: LogState,
    segments: Arc<RwLock<BTreeMap<u64, Arc<Segment>>>>,
    active: Arc<Segment>,
    next_segment_id: u64,
    checkpoints: Arc<crate::checkpoint::Shared>,
    report: OpenReport,
) -> Result<Store, Error> {
    {
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
            ids_complete: state.ids_complete,
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
            segments,
            checkpoints,
            open_report: report,
            w: Mutex::new(writer),
            cond: Condvar::new(),
            gather_cond: Condvar::new(),
            last_sync_nanos: AtomicU64::new(0),
            index,
            last_seq: AtomicU64::new(state.last_seq),
            poisoned: AtomicBool::new(false),
            poison_cause: Mutex::new(None),
            closed: AtomicBool::new(false),
            counters: Counters::default(),
            stop: Mutex::new(false),
            stop_cond: Condvar::new(),
            flusher: Mutex::new(None),
            gc_lock: Mutex::new(()),
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
}

/// Whether the index holds `i` (its version's entry names the same seq, position and
/// commit id). An index that cannot be read does not.
fn index_has(index: &Index, i: &CommitInfo) -> bool {
    matches!(
        index.stream_entry(&i.stream, i.version),
        Ok(Some(e)) if e.seq == i.seq && e.position == i.position && e.commit_id == i.commit_id
    )
}

/// Create the store directory `dir` and any missing ancestors, and fsync the parent of
/// each directory created: a new directory's entry is durable only once its parent is
/// synced, and every later fsync inside it would otherwise not survive a power loss.
pub(super) fn create_store_dir(vfs: &dyn Vfs, dir: &Path) -> Result<(), Error> {
    let mut missing = Vec::new();
    for a in dir.ancestors() {
        if a.as_os_str().is_empty() || vfs.exists(a).map_err(|e| Error::io(a, "exists", e))? {
            break;
        }
        missing.push(a);
    }
    vfs.create_dir_all(dir)
        .map_err(|e| Error::io(dir, "create_dir_all", e))?;
    for created in missing.iter().rev() {
        let parent = match created.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        vfs.sync_dir(parent)
            .map_err(|e| Error::io(parent, "sync_dir", e))?;
    }
    Ok(())
}

/// Scan the whole log: validate every record and the history, repair a torn tail (owner
/// only), and apply records past the index's applied seq to the index.
pub(super) fn scan_log(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    index: &Index,
    read_only: bool,
) -> Result<LogState, Error> {
    let (opened, max_id) = open_segments_in_order(vfs, dir, opts.record_bytes_max, read_only)?;
    scan_opened(vfs, dir, opts, index, read_only, opened, max_id, None)
}

/// [`scan_log`] of segments already opened, from the start of the log or, with
/// `resume` (an open from a checkpoint), from after the checkpoint's record: the
/// segments before it are taken as the checkpoint lists them, their records neither
/// read nor checked, and the history check continues from the checkpoint's head of
/// each stream. The commit-id filter then holds only the tail's ids.
#[allow(clippy::too_many_arguments)]
pub(super) fn scan_opened(
    vfs: &dyn Vfs,
    dir: &Path,
    opts: &Options,
    index: &Index,
    read_only: bool,
    opened: Vec<OpenedSegment>,
    max_id: u64,
    resume: Option<&Resume>,
) -> Result<LogState, Error> {
    let max = opts.record_bytes_max;
    check_plain_order(&opened)?;
    let layout = layout_of(&opened);
    if index.layout()? != layout {
        // Built from another arrangement of the log (before or after a GC): its
        // positions mean nothing now.
        index.clear(layout)?;
    }
    let (applied, applied_id) = index.applied_marker()?;
    // Commits the index records as on disk: evidence only while the index matches
    // the log (see the torn-tail case below).
    let synced = index.synced_seq()?;
    let mut hist = HistoryCheck::default();
    let mut pending: Vec<RecordedCommit> = Vec::new();
    let mut segments = BTreeMap::new();
    let mut last_ts = 0i64;
    let mut decoded = 0u64;
    // The commit the index's applied seq names, where the scan finds it.
    let mut applied_at = None;
    let mut index_stale = false;
    if let Some(r) = resume {
        hist.resume(r.seq, r.compacted_before);
        last_ts = r.last_ts;
        if applied == r.seq {
            // The index ends with the checkpoint's record, which the scan does not read.
            if applied_id == Some(r.commit_id) {
                applied_at = Some(crate::index::AppliedAt {
                    seq: r.seq,
                    commit_id: r.commit_id,
                    position: r.position,
                    last_ts: r.last_ts,
                });
            } else {
                index_stale = true;
            }
        }
    }
    let mut commit_ids = CommitIdFilter::with_capacity(0);
    // Per stream, the last commit the index says it holds (see `index_has`).
    let mut last_indexed: foldhash::HashMap<String, CommitInfo> = Default::default();
    let count = opened.len();
    // The capacity of the segment before this one in log order.
    let mut prev_cap = None;
    for (i, seg) in opened.into_iter().enumerate() {
        let OpenedSegment {
            id,
            path,
            name,
            mut file,
            len,
            header,
            ..
        } = seg;
        let before_cap = prev_cap.replace(len);
        if let (Some(r), Ok(h)) = (resume, &header) {
            if i < r.p_index {
                // Before the checkpoint's record: as the checkpoint lists it (checked
                // against the header and the file's size by `check_resume`), mapped
                // only when a read reaches it.
                let t = &r.segments[i];
                let seg = Segment::new(id, file, t.end, len, t.first_seq)
                    .at(path)
                    .with_header(*h)
                    .sealed();
                segments.insert(id, Arc::new(seg));
                continue;
            }
        }
        let map = file.map().map_err(|e| Error::io(&path, "map", e))?;
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
                if !is_last || !segment::is_unfinished_creation(&map) {
                    return Err(Error::corrupt(&name, 0, problem));
                }
                // The last segment's creation did not complete (crash between create and
                // the header's fsync): it holds no record. Re-initialize it.
                if read_only {
                    continue;
                }
                let capacity = format::next_segment_capacity(before_cap, opts.segment_bytes_max)
                    .max(map.len() as u64);
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
                    Arc::new(Segment::new(id, file, SEGMENT_HEADER_BYTES, capacity, 0).at(path)),
                );
                continue;
            }
        };
        hist.enter_segment(header.compacted)
            .map_err(|p| Error::corrupt(&name, SEGMENT_HEADER_BYTES, p))?;
        let mut first_seq = 0;
        let mut start = header.data_start;
        if let Some(r) = resume.filter(|r| r.p_index == i) {
            first_seq = r.segments[i].first_seq;
            start = r.p_end;
        }
        let zero = if read_only {
            segment::ZeroHeader::EndsView
        } else {
            segment::ZeroHeader::CheckFile(&*file, &path)
        };
        let scan = segment::scan_segment(&map, id, max, start, zero, |off, payload| {
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
            decoded += 1;
            if let Some(r) = resume.filter(|_| !hist.heads.contains_key(&rec.info.stream)) {
                // The stream's head before the checkpoint's tail, from the checkpoint
                // (an owner's sled may already hold later commits of the stream).
                if let Some(h) = Index::checkpoint_stream_head(&r.ck, &rec.info.stream)? {
                    hist.heads.insert(rec.info.stream.clone(), h.version);
                }
            }
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
            if seq == applied {
                applied_at = Some(crate::index::AppliedAt {
                    seq,
                    commit_id: rec.info.commit_id,
                    position: pos,
                    last_ts,
                });
            }
            if seq == applied && applied_id != Some(rec.info.commit_id) {
                index_stale = true;
            }
            if seq <= applied && !index_stale {
                // The index's entries for what it says it holds: the last version of
                // each full block is checked here, each stream's last one after the
                // scan (one index read per 64 versions and per stream), so a gap left
                // by a failed move or sled damage is found and rebuilt, never served.
                let i = &rec.info;
                if i.version % VERSIONS_PER_BLOCK == 0 && !index_has(index, i) {
                    index_stale = true;
                }
                match last_indexed.get_mut(&i.stream) {
                    Some(last) => *last = i.clone(),
                    None => {
                        last_indexed.insert(i.stream.clone(), i.clone());
                    }
                }
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
            // A reader never judges these bytes: with a live writer they may be its
            // record in flight (its text may hold a frame); the owner's open decides.
            Tail::Enclosed { .. } if read_only && is_last => end = scan.end,
            Tail::Corrupt { .. }
                if read_only
                    && is_last
                    && segment::frame_landed_since(&*file, id, max, scan.end)
                        .map_err(|e| Error::io(&path, "read_at", e))? =>
            {
                // The writer's write in flight (see `segment::frame_landed_since`): this
                // view of the log ends before it.
                end = scan.end;
            }
            Tail::Corrupt { problem, valid_at } => {
                return Err(Error::corrupt(
                    &name,
                    scan.end,
                    format!("{problem}; a valid record follows at offset {valid_at}"),
                ))
            }
            Tail::Enclosed { problem, inner_at } => {
                return Err(Error::corrupt(
                    &name,
                    scan.end,
                    format!(
                        "{problem}; the bytes this record claims hold a frame at offset \
                         {inner_at}, which is not taken for a record (`verify --salvage` \
                         copies every readable commit)"
                    ),
                ))
            }
            Tail::Torn {
                problem,
                written_end,
            } => {
                if !is_last {
                    return Err(Error::corrupt(&name, scan.end, problem));
                }
                // A torn tail is the write in flight at a crash, so it holds only
                // commits after every one known to be on disk. When the index (matching
                // this log) records a synced seq beyond the last valid record, these
                // bytes held acknowledged commits: damage, refused, nothing trimmed.
                if !read_only && !index_stale && synced > hist.last_seq {
                    return Err(Error::DamagedTail {
                        segment: name,
                        offset: scan.end,
                        problem,
                        synced_seq: synced,
                        last_seq: hist.last_seq,
                    });
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
        let seg = Segment::new(id, file, end, capacity, first_seq)
            .at(path)
            .with_header(header);
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
    if !index_stale && !last_indexed.values().all(|i| index_has(index, i)) {
        index_stale = true;
    }
    if let Some(at) = applied_at.filter(|a| !index_stale && a.seq > 0) {
        index.set_applied_at(at);
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
        ids_complete: !read_only && resume.is_none(),
        index_stale,
        max_id,
        layout,
        decoded,
    })
}

/// Stand-in file for the placeholder segment of an empty read-only store.
#[derive(Debug)]
pub(super) struct NoFile;

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
