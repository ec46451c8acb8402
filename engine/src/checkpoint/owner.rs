//! The owner's side: when to write a checkpoint (on close, and after a move into
//! sled once the log has grown enough, see [`crate::CHECKPOINT_COMMITS_MIN_DEFAULT`]),
//! from what (sled's main tree right after a move or a flush, when it holds exactly
//! the commits up to the last one applied), and what to do with checkpoints a
//! previous owner left that the log does not back (remove them).
//!
//! A failed write is not a fault of the store: the log is the truth and the index is
//! intact. It is recorded (the first failure, for [`crate::StoreStats`]) and the next
//! checkpoint is tried as if nothing happened. Nothing here syncs the log.

use super::format::{Header, SegmentEnd};
use super::read::{newest, CheckpointFile};
use super::write::write_checkpoint;
use crate::error::Error;
use crate::index::{
    AppliedAt, Index, SledView, INDEX_FORMAT_VERSION, META_APPLIED, META_FORMAT, META_LAYOUT,
    META_MOVING, META_SYNCED,
};
use crate::segment::{in_log_order, Segment};
use crate::types::Options;
use crate::vfs::Vfs;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

type Segments = RwLock<BTreeMap<u64, Arc<Segment>>>;

/// The owner's checkpoint state, shared with the move thread.
pub(crate) struct Shared {
    vfs: Arc<dyn Vfs>,
    dir: PathBuf,
    indexers: Vec<(String, u32)>,
    commits_min: u64,
    /// Seq of the newest checkpoint on disk that the log backs and the index is known
    /// to hold exactly (0: none).
    last_seq: AtomicU64,
    /// Seq of the last checkpoint this process wrote (0: none): the only ones a close
    /// may make the next base without writing one (see [`Shared::on_close`]).
    own_seq: AtomicU64,
    written: AtomicU64,
    failure: Mutex<Option<String>>,
    /// One write at a time (the move thread's and close's).
    writing: Mutex<()>,
    /// Live [`crate::CheckpointsDeferred`] guards: while any is, no checkpoint is
    /// written in the background (a close still writes one).
    deferred: AtomicU32,
    /// The seq of the checkpoint the owner's sled is a delta over (0: none): never
    /// removed for a newer one.
    base_seq: Mutex<Option<Arc<AtomicU64>>>,
}

fn be_u64(v: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(v.get(..8)?.try_into().ok()?))
}

impl Shared {
    pub(crate) fn new(vfs: Arc<dyn Vfs>, dir: &Path, opts: &Options) -> Shared {
        Shared {
            vfs,
            dir: dir.to_path_buf(),
            indexers: opts
                .indexers
                .iter()
                .map(|i| (i.name().to_string(), i.version()))
                .collect(),
            commits_min: opts.checkpoint_commits_min,
            last_seq: AtomicU64::new(0),
            own_seq: AtomicU64::new(0),
            written: AtomicU64::new(0),
            failure: Mutex::new(None),
            writing: Mutex::new(()),
            deferred: AtomicU32::new(0),
            base_seq: Mutex::new(None),
        }
    }

    /// Keep the index's base checkpoint (its seq read from `cell` at each write).
    pub(crate) fn keep_base(&self, cell: Arc<AtomicU64>) {
        *self.base_seq.lock().unwrap_or_else(|e| e.into_inner()) = Some(cell);
    }

    fn kept_seq(&self) -> u64 {
        self.base_seq
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map_or(0, |c| c.load(Ordering::Acquire))
    }

    /// After a GC rebuilt the index for a new log layout: no checkpoint on disk is of
    /// it, and the close writes one.
    pub(crate) fn forget_newest(&self) {
        self.last_seq.store(0, Ordering::Relaxed);
        self.own_seq.store(0, Ordering::Relaxed);
    }

    pub(crate) fn defer(&self) {
        self.deferred.fetch_add(1, Ordering::AcqRel);
    }

    pub(crate) fn resume(&self) {
        let before = self.deferred.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "resumed more checkpoints than were deferred");
    }

    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    pub(crate) fn failure(&self) -> Option<String> {
        self.failure
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn record_failure(&self, e: &Error) {
        let mut f = self.failure.lock().unwrap_or_else(|e| e.into_inner());
        if f.is_none() {
            *f = Some(e.to_string());
        }
    }

    /// On the owner's open: take the newest checkpoint whose record the log holds and
    /// that was made for this open's index format and indexers, removing newer ones that
    /// are not (ahead of the log after lost writes, not readable, or made for other
    /// indexers, whose index this open rebuilt), so that readers never keep meeting them
    /// and the close writes one they can use.
    pub(crate) fn adopt_or_remove(
        &self,
        segments: &BTreeMap<u64, Arc<Segment>>,
        max: u32,
        log_last_seq: u64,
        remember: bool,
    ) {
        while let Some(path) = newest(&*self.vfs, &self.dir) {
            let backed = CheckpointFile::open(&*self.vfs, &path).is_ok_and(|ck| {
                let h = &ck.header;
                let mut made_for = h.indexers.clone();
                made_for.sort();
                let mut this = self.indexers.clone();
                this.sort();
                h.index_format == INDEX_FORMAT_VERSION
                    && made_for == this
                    && h.seq <= log_last_seq
                    && segments
                        .get(&h.segment)
                        .and_then(|s| s.read(h.offset, max).ok())
                        .is_some_and(|r| r.info.seq == h.seq && r.info.commit_id == h.commit_id)
            });
            if backed {
                // Only the index's base is known to hold exactly the index (`remember`):
                // after any other open, the close writes a new one.
                if !remember {
                    return;
                }
                if let Some(seq) = path
                    .file_name()
                    .and_then(|n| super::write::parse_file_name(&n.to_string_lossy()))
                {
                    self.last_seq.store(seq, Ordering::Relaxed);
                }
                return;
            }
            if self.vfs.remove(&path).is_err() {
                return;
            }
        }
    }

    /// Removes the checkpoints before seq `seq`, the index's base: an open's cleanup
    /// of what a close cut short left. Best effort.
    pub(crate) fn remove_before(&self, seq: u64) {
        self.remove_before_but(seq, seq);
    }

    /// Removes the checkpoints before seq `seq` but the one at `keep`. Best effort.
    fn remove_before_but(&self, seq: u64, keep: u64) {
        let cdir = self.dir.join(super::CHECKPOINT_DIR);
        if let Ok(names) = self.vfs.read_dir(&cdir) {
            let mut removed = false;
            for n in names {
                if super::write::parse_file_name(&n).is_some_and(|s| s < seq && s != keep) {
                    removed |= self.vfs.remove(&cdir.join(&n)).is_ok();
                }
            }
            if removed {
                let _ = self.vfs.sync_dir(&cdir);
            }
        }
    }

    /// After a background move into sled: a checkpoint when enough was applied since
    /// the last one.
    pub(crate) fn after_move(&self, segments: &Segments, view: &SledView, at: &AppliedAt) {
        if self.commits_min == 0 || self.deferred.load(Ordering::Acquire) > 0 {
            return;
        }
        let last = self.last_seq.load(Ordering::Relaxed);
        if at.seq <= last || at.seq - last < self.commits_min.max(at.seq / 8) {
            return;
        }
        if let Err(e) = self.write_from_sled(segments, view, at, false) {
            self.record_failure(&e);
        }
    }

    /// On a clean close (the memtable moved into sled, nothing running): a checkpoint
    /// of everything, unless the newest one already is. The checkpoint written, if
    /// one was: it holds exactly the index's entries.
    pub(crate) fn on_close(&self, segments: &Segments, index: &Index) -> Option<CheckpointFile> {
        let at = index.applied_at()?;
        if at.seq == self.last_seq.load(Ordering::Relaxed) {
            // The newest checkpoint holds everything already. If this process wrote it
            // (after its last move), it is the next base, unless it is already; one
            // another process wrote is not known to hold what this index holds.
            let own = self.own_seq.load(Ordering::Relaxed) == at.seq;
            if !own || index.base().is_some_and(|b| b.header.seq == at.seq) {
                return None;
            }
            let path = self
                .dir
                .join(super::CHECKPOINT_DIR)
                .join(super::write::file_name(at.seq));
            let ck = CheckpointFile::open(&*self.vfs, &path).ok()?;
            // Of this log's layout too: a GC since changed every position after it.
            let same = ck.header.commit_id == at.commit_id
                && ck.header.index_format == INDEX_FORMAT_VERSION
                && index.layout().is_ok_and(|l| l == ck.header.layout);
            return same.then_some(ck);
        }
        // An owner's index always has sled; one over a checkpoint file writes none.
        let view = index.sled_view().ok()?;
        match self.write_from_sled(segments, &view, &at, true) {
            Ok(Some(path)) => CheckpointFile::open(&*self.vfs, &path).ok(),
            Ok(None) => None,
            Err(e) => {
                self.record_failure(&e);
                // No checkpoint on disk is known to be this index (its open did not
                // resume from one it holds exactly): rather than leave readers one of
                // another index, leave them none (they read the log) but the base.
                if self.last_seq.load(Ordering::Relaxed) == 0 {
                    self.remove_before_but(u64::MAX, self.kept_seq());
                }
                None
            }
        }
    }

    /// Write the checkpoint of sled over its base, which holds exactly the commits up
    /// to `at`; its path. `Ok(None)`: nothing written because the cut is not one a
    /// checkpoint may describe (sled's applied seq not `at`'s, the
    /// segments busy, the record in a segment GC wrote).
    fn write_from_sled(
        &self,
        segments: &Segments,
        view: &SledView,
        at: &AppliedAt,
        wait: bool,
    ) -> Result<Option<PathBuf>, Error> {
        let _one = self.writing.lock().unwrap_or_else(|e| e.into_inner());
        let get = |k: &[u8]| view.get(k).map_err(Error::Index);
        // The commits may not be durable yet (`Buffered`): after a power loss that
        // loses them, readers find the log does not hold the checkpoint's record and
        // fall back, and the next owner's open removes the checkpoint
        // (`adopt_or_remove`) before it writes anything.
        let applied = get(META_APPLIED)?;
        let applied_ok = applied.as_deref().is_some_and(|v| {
            be_u64(v) == Some(at.seq) && v.get(8..24) == Some(at.commit_id.as_bytes())
        });
        if !applied_ok
            || get(META_FORMAT)?.as_deref() != Some(&INDEX_FORMAT_VERSION.to_be_bytes()[..])
        {
            return Ok(None);
        }
        let layout = get(META_LAYOUT)?.and_then(|v| be_u64(&v)).unwrap_or(0);
        let table = {
            let segs = if wait {
                segments.read().unwrap_or_else(|e| e.into_inner())
            } else {
                match segments.try_read() {
                    Ok(g) => g,
                    Err(_) => return Ok(None),
                }
            };
            let mut table = Vec::new();
            let mut found = false;
            for s in in_log_order(segs.values()) {
                table.push(SegmentEnd {
                    id: s.id,
                    first_seq: s.first_seq.load(Ordering::Acquire),
                    end: s.end.load(Ordering::Acquire),
                    header: Some(crate::format::SegmentHeader {
                        data_start: s.data_start,
                        compacted: s.compacted,
                    }),
                });
                if s.id == at.position.segment {
                    found = s.compacted.is_none();
                    break;
                }
            }
            if !found {
                return Ok(None);
            }
            table
        };
        let header = Header {
            index_format: INDEX_FORMAT_VERSION,
            layout,
            seq: at.seq,
            commit_id: at.commit_id,
            segment: at.position.segment,
            offset: at.position.offset,
            last_ts: at.last_ts,
            entries: 0,
            indexers: self.indexers.clone(),
            segments: table,
        };
        // sled 0.34 panics on some damaged files instead of returning an error (see
        // `sled_guard`): a panic while reading it is this checkpoint's failure only.
        let written = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let entries = view.iter().filter(|kv| {
                kv.as_ref().map_or(true, |(k, _)| {
                    k != META_MOVING && k != META_SYNCED && k != crate::index::META_BASE
                })
            });
            write_checkpoint(&*self.vfs, &self.dir, header, entries, self.kept_seq())
        }))
        .unwrap_or_else(|_| {
            Err(Error::Index(crate::error::IndexError::Malformed(
                "sled panicked while a checkpoint was written".into(),
            )))
        })?;
        self.last_seq.store(at.seq, Ordering::Relaxed);
        self.own_seq.store(at.seq, Ordering::Relaxed);
        self.written.fetch_add(1, Ordering::Relaxed);
        Ok(Some(written))
    }
}
