//! Log compaction (GC): copy the live records of sealed segments into new segments and
//! retire the old ones, crash-safely.
//!
//! The caller decides liveness with a predicate over each commit ([`Store::plan_gc`]);
//! the engine only removes, per stream, a *prefix* of its commits (a dead commit after a
//! live one of the same stream is kept, so a stream's versions stay contiguous from
//! wherever it now starts). [`Store::plan_gc_with`] takes a [`GcAction`] per commit
//! instead: besides dropping, it can *replace* a commit's events (the commit keeps its
//! stream, version, seq, commit id and timestamp: erasing content without touching the
//! history); [`GcOptions::include_active`] seals the active segment first so that its
//! records are compacted too. Replacing rather than removing is what keeps erasure
//! simple and safe: versions stay contiguous, version fences and retries by commit id
//! keep working, and the history check needs no new case.
//!
//! An erasing GC ([`GcOptions::erase`]) also leaves [`ERASE_MARKER_FILE`] durable
//! before its commit point and removes the files of [`CHECKPOINT_DIR`](crate::CHECKPOINT_DIR) after it: the
//! in-place index rebuild leaves the old values in sled's files, so the next owner
//! open ([`finish_erasure`]) deletes the index directory and rebuilds it from the log.
//!
//! [`Store::run_gc`] commits a plan:
//!
//! 1. For each run of consecutive sealed segments (in log order) with commits to remove,
//!    write the run's live records, re-framed for their new segment ids (ids above every
//!    existing one), into `<id>.seg.gc` files whose compacted header names the seq range
//!    the run covered; `sync_all` each.
//! 2. `sync_dir`.
//! 3. Under the writer lock (appends wait from here to step 6): check that no stream the
//!    plan removes commits from has moved; write `gc-<first new id>.manifest` (old ids,
//!    new ids, checksum), `sync_all`, `sync_dir`. **This is the commit point.**
//! 4. Rename every `<id>.seg.gc` to `<id>.seg`; `sync_dir`.
//! 5. Swap the segments in memory; rebuild the index from the new log.
//! 6. Release the writer lock. Retire the old segments: each file is removed once no
//!    reader holds its segment (scans hold them); then `sync_dir`, remove the manifest,
//!    `sync_dir`.
//!
//! Recovery on open ([`recover`]): a manifest that validates and whose new segments all
//! exist (as `.seg.gc` or `.seg`) is rolled forward (rename, `sync_dir`, remove the old
//! segments, `sync_dir`, remove the manifest, `sync_dir`); any other manifest is rolled back
//! (removed); leftover `.seg.gc` files are removed. A crash therefore leaves the old log
//! or the new one, never both and never a mix.

use crate::error::Error;
use crate::format::{self, CommitHead, FRAME_HEADER_BYTES};
use crate::segment::{self, Segment};
use crate::store::{lock, Store};
use crate::types::{EventData, RecordedCommit};
use crate::vfs::{OpenMode, Vfs, VfsFile};
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Suffix of a segment written by GC before its commit point.
pub const GC_SEGMENT_SUFFIX: &str = ".seg.gc";
/// File name prefix and suffix of a GC manifest (`gc-<16 hex>.manifest`).
pub const GC_MANIFEST_PREFIX: &str = "gc-";
pub const GC_MANIFEST_SUFFIX: &str = ".manifest";
const MANIFEST_MAGIC: [u8; 8] = *b"SPOOLGCM";
const MANIFEST_VERSION: u32 = 1;
/// Largest number of segment ids a manifest may list (on each side); bounds what a
/// damaged manifest can make recovery allocate.
pub const GC_MANIFEST_IDS_MAX: u32 = 1 << 20;

/// File the owner writes before the commit point of an erasing GC ([`GcOptions::erase`]):
/// while it exists, every owner open deletes the index directory and the files of
/// [`CHECKPOINT_DIR`](crate::CHECKPOINT_DIR) before opening the index (which is then rebuilt from the log), and
/// removes it after. Its content is not read (docs/format.md, "Erase marker").
pub const ERASE_MARKER_FILE: &str = "erase.pending";

/// What a GC does with one commit: the answer of the `decide` callback of
/// [`Store::plan_gc_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GcAction {
    /// Copy the commit as it is.
    Keep,
    /// Remove the commit (only within a prefix of its stream, see [`Store::plan_gc`]).
    Drop,
    /// Keep the commit's place in the history (stream, version, seq, commit id,
    /// timestamp, expected version: version fences, history checks and retries by commit
    /// id are unchanged) but store these events instead of its own. The caller's way to
    /// erase content a later commit superseded: it writes marker events that its own
    /// fold understands. Refused by planning if the new record exceeds
    /// [`crate::Options::record_bytes_max`].
    Replace(Vec<EventData>),
}

/// How [`Store::plan_gc_with`] plans.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct GcOptions {
    /// Also compact the active segment: when it holds a commit the callback drops or
    /// replaces, planning seals it and starts a new active segment first.
    pub include_active: bool,
    /// Erase: the committed GC also removes every file under [`CHECKPOINT_DIR`](crate::CHECKPOINT_DIR) and
    /// leaves [`ERASE_MARKER_FILE`], so that the next owner open deletes the index
    /// directory (whose files still hold the old values after the in-place rebuild)
    /// and rebuilds it from the compacted log.
    pub erase: bool,
}

impl GcOptions {
    /// Everything a GC that must leave no superseded byte behind needs: the active
    /// segment too, and the erase of index files.
    pub fn erasing() -> GcOptions {
        GcOptions {
            include_active: true,
            erase: true,
        }
    }

    /// With [`GcOptions::include_active`] set to `on`.
    pub fn include_active(mut self, on: bool) -> GcOptions {
        self.include_active = on;
        self
    }

    /// With [`GcOptions::erase`] set to `on`.
    pub fn erase(mut self, on: bool) -> GcOptions {
        self.erase = on;
        self
    }
}

/// One sealed segment a [`GcPlan`] compacts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcSegment {
    pub segment: u64,
    /// File name (e.g. `0000000000000003.seg`).
    pub name: String,
    /// Size of the file.
    pub file_bytes: u64,
    /// Bytes of the records that are copied.
    pub live_bytes: u64,
    /// Bytes of the records that are removed.
    pub dead_bytes: u64,
    pub live_commits: u64,
    pub dead_commits: u64,
    /// Commits whose events are replaced (counted among the live ones).
    pub replaced_commits: u64,
}

/// A prepared log compaction (from [`Store::plan_gc`]); commit it with
/// [`Store::run_gc`]. It stays valid while no stream it removes commits from changes and
/// no other GC runs; otherwise `run_gc` refuses it with [`Error::GcPlanStale`].
#[derive(Debug, Clone)]
pub struct GcPlan {
    /// The segments to compact, in log order.
    pub segments: Vec<GcSegment>,
    /// Record bytes copied / removed, over `segments`.
    pub live_bytes: u64,
    pub dead_bytes: u64,
    /// File bytes freed: the segments' sizes minus the new segments' sizes.
    pub reclaimed_bytes: u64,
    /// Commits removed.
    pub dead_commits: u64,
    /// Commits the predicate called dead but that stay, because a live commit of the
    /// same stream comes before them or they are in the active segment.
    pub kept_dead_commits: u64,
    /// Streams whose every commit is removed (their heads vanish).
    pub streams_removed: Vec<String>,
    /// Commits whose events are replaced ([`GcAction::Replace`]).
    pub replaced_commits: u64,
    /// Record bytes of the replaced commits before and after.
    pub replaced_bytes_before: u64,
    pub replaced_bytes_after: u64,
    /// Planning sealed the active segment to include it ([`GcOptions::include_active`]).
    pub rolled_active: bool,
    /// File bytes of the new active segment that sealing created (preallocated to its
    /// capacity; not subtracted from [`GcPlan::reclaimed_bytes`]).
    pub new_active_bytes: u64,
    /// The GC erases ([`GcOptions::erase`]).
    pub erase: bool,
    runs: Vec<Run>,
    /// The new events of the replaced commits, by seq.
    replace: HashMap<u64, Vec<EventData>>,
    epoch: u64,
    /// Every stream the plan removes commits from, with its head when planned.
    heads: Vec<(String, u64)>,
    segment_bytes_max: u64,
}

impl GcPlan {
    /// Whether there is nothing to compact.
    pub fn is_empty(&self) -> bool {
        self.runs.is_empty()
    }
}

#[derive(Debug, Clone)]
struct Run {
    segments: Vec<u64>,
    /// The seq range the run covers (the compacted header of its new segments).
    first_seq: u64,
    last_seq: u64,
    /// Seqs of the commits to remove.
    dead: HashSet<u64>,
}

/// What [`Store::run_gc`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GcReport {
    pub segments_removed: Vec<u64>,
    pub segments_written: Vec<u64>,
    pub commits_copied: u64,
    pub commits_removed: u64,
    /// File bytes of the removed segments and of the written ones.
    pub bytes_before: u64,
    pub bytes_after: u64,
    pub streams_removed: u64,
    /// Commits whose events were replaced.
    pub commits_replaced: u64,
    /// An erasing GC: the index directory is deleted and rebuilt at the next owner open
    /// ([`ERASE_MARKER_FILE`] is left for it); checkpoint files removed by this run.
    pub index_wipe_pending: bool,
    pub checkpoints_removed: u64,
    /// Old segment files still held by readers: removed when the last one lets go (on a
    /// later GC, [`Store::retire_segments`] or close; or by recovery after a crash).
    pub retire_pending: u64,
}

/// Old segments of a committed GC, waiting for their readers.
pub(crate) struct Retired {
    manifest: PathBuf,
    segments: Vec<Arc<Segment>>,
}

fn manifest_name(first_new: u64) -> String {
    format!("{GC_MANIFEST_PREFIX}{first_new:016x}{GC_MANIFEST_SUFFIX}")
}

fn is_manifest_name(n: &str) -> bool {
    n.strip_prefix(GC_MANIFEST_PREFIX)
        .and_then(|r| r.strip_suffix(GC_MANIFEST_SUFFIX))
        .is_some_and(|hex| hex.len() == 16 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn gc_segment_name(id: u64) -> String {
    format!("{id:016x}{GC_SEGMENT_SUFFIX}")
}

fn parse_gc_segment_name(n: &str) -> Option<u64> {
    let base = n.strip_suffix(".gc")?;
    format::parse_segment_file_name(base)
}

/// The manifest's bytes for the old and new segment ids; the layout is in docs/format.md,
/// "GC manifest".
fn encode_manifest(old: &[u64], new: &[u64]) -> Vec<u8> {
    let mut b = Vec::with_capacity(24 + 8 * (old.len() + new.len()));
    b.extend_from_slice(&MANIFEST_MAGIC);
    b.extend_from_slice(&MANIFEST_VERSION.to_le_bytes());
    for ids in [old, new] {
        b.extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            b.extend_from_slice(&id.to_le_bytes());
        }
    }
    let crc = format::mask_crc(crc32fast::hash(&b));
    b.extend_from_slice(&crc.to_le_bytes());
    b
}

/// `(old ids, new ids)`, or `None` when the bytes are not a complete, valid manifest.
fn decode_manifest(b: &[u8]) -> Option<(Vec<u64>, Vec<u64>)> {
    let body_len = b.len().checked_sub(4)?;
    let crc = u32::from_le_bytes(b.get(body_len..)?.try_into().ok()?);
    if crc != format::mask_crc(crc32fast::hash(&b[..body_len])) {
        return None;
    }
    if b.get(..8)? != MANIFEST_MAGIC {
        return None;
    }
    let u32_at =
        |o: usize| -> Option<u32> { Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?)) };
    if u32_at(8)? != MANIFEST_VERSION {
        return None;
    }
    let mut off = 12;
    let mut lists = Vec::with_capacity(2);
    for _ in 0..2 {
        let n = u32_at(off)?;
        if n > GC_MANIFEST_IDS_MAX || (n as usize) * 8 > body_len {
            return None;
        }
        off += 4;
        let mut ids = Vec::with_capacity(n as usize);
        for _ in 0..n {
            ids.push(u64::from_le_bytes(b.get(off..off + 8)?.try_into().ok()?));
            off += 8;
        }
        lists.push(ids);
    }
    if off != body_len {
        return None;
    }
    let new = lists.pop()?;
    let old = lists.pop()?;
    Some((old, new))
}

fn read_whole(vfs: &dyn Vfs, path: &Path) -> Result<Vec<u8>, Error> {
    let f = vfs
        .open(path, OpenMode::Read)
        .map_err(|e| Error::io(path, "open", e))?;
    let len = f.len().map_err(|e| Error::io(path, "len", e))?;
    // A manifest lists at most 2 * GC_MANIFEST_IDS_MAX ids: refuse anything larger
    // before allocating.
    if len > 16 + 16 * u64::from(GC_MANIFEST_IDS_MAX) + 16 {
        return Ok(Vec::new());
    }
    let mut b = vec![0u8; len as usize];
    f.read_at(&mut b, 0)
        .map_err(|e| Error::io(path, "read_at", e))?;
    Ok(b)
}

/// A committed GC manifest: its file name, old segment ids, new segment ids.
type Committed = (String, Vec<u64>, Vec<u64>);

/// The GC manifests in `dir` that commit a GC: valid, and every new segment present.
fn committed_manifests(
    vfs: &dyn Vfs,
    dir: &Path,
    names: &[String],
) -> Result<Vec<Committed>, Error> {
    let present: HashSet<&str> = names.iter().map(String::as_str).collect();
    let mut out = Vec::new();
    let mut manifests: Vec<&String> = names.iter().filter(|n| is_manifest_name(n)).collect();
    manifests.sort();
    for m in manifests {
        let bytes = read_whole(vfs, &dir.join(m))?;
        let Some((old, new)) = decode_manifest(&bytes) else {
            continue;
        };
        let all_new = new.iter().all(|&id| {
            present.contains(format::segment_file_name(id).as_str())
                || present.contains(gc_segment_name(id).as_str())
        });
        if all_new {
            out.push((m.clone(), old, new));
        }
    }
    Ok(out)
}

/// Finish or roll back an interrupted GC (owner open, before the log is scanned).
/// Returns whether anything was changed.
pub(crate) fn recover(vfs: &dyn Vfs, dir: &Path) -> Result<bool, Error> {
    let names = vfs
        .read_dir(dir)
        .map_err(|e| Error::io(dir, "read_dir", e))?;
    let committed = committed_manifests(vfs, dir, &names)?;
    let present: HashSet<&str> = names.iter().map(String::as_str).collect();
    let sync = |vfs: &dyn Vfs| vfs.sync_dir(dir).map_err(|e| Error::io(dir, "sync_dir", e));
    let remove = |vfs: &dyn Vfs, name: &str| -> Result<(), Error> {
        let p = dir.join(name);
        match vfs.remove(&p) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(Error::io(p, "remove", e)),
        }
    };
    let mut changed = false;
    let mut finished: HashSet<String> = HashSet::new();
    for (m, old, new) in &committed {
        // Roll forward: the new segments take their place, the old ones go.
        for &id in new {
            let gc = gc_segment_name(id);
            let seg = format::segment_file_name(id);
            if present.contains(gc.as_str()) {
                if present.contains(seg.as_str()) {
                    remove(vfs, &gc)?;
                } else {
                    vfs.rename(&dir.join(&gc), &dir.join(&seg))
                        .map_err(|e| Error::io(dir.join(&gc), "rename", e))?;
                }
            }
        }
        sync(vfs)?;
        for &id in old {
            remove(vfs, &format::segment_file_name(id))?;
        }
        sync(vfs)?;
        remove(vfs, m)?;
        finished.insert(m.clone());
        changed = true;
    }
    // Everything else of an unfinished GC is rolled back.
    for n in &names {
        let stray_manifest = is_manifest_name(n) && !finished.contains(n);
        let renamed = committed
            .iter()
            .any(|(_, _, new)| parse_gc_segment_name(n).is_some_and(|id| new.contains(&id)));
        if stray_manifest || (n.ends_with(GC_SEGMENT_SUFFIX) && !renamed) {
            remove(vfs, n)?;
            changed = true;
        }
    }
    if changed {
        sync(vfs)?;
    }
    Ok(changed)
}

/// The segment files of the log in `dir`: `(id, file name)`. The owner has run
/// [`recover`], so these are the `.seg` files; a read-only view applies a committed but
/// unfinished GC on the fly (without writing): its old segments are left out and its
/// new ones read from `.seg.gc` files where not yet renamed.
pub(crate) fn segment_files(
    vfs: &dyn Vfs,
    dir: &Path,
    read_only: bool,
) -> Result<Vec<(u64, String)>, Error> {
    let names = vfs
        .read_dir(dir)
        .map_err(|e| Error::io(dir, "read_dir", e))?;
    let mut files: HashMap<u64, String> = names
        .iter()
        .filter_map(|n| format::parse_segment_file_name(n).map(|id| (id, n.clone())))
        .collect();
    if read_only {
        for (_, old, new) in committed_manifests(vfs, dir, &names)? {
            for id in old {
                files.remove(&id);
            }
            for id in new {
                files.entry(id).or_insert_with(|| gc_segment_name(id));
            }
        }
    }
    let mut v: Vec<(u64, String)> = files.into_iter().collect();
    v.sort_unstable();
    Ok(v)
}

/// A new compacted segment being filled (by GC or salvage).
pub(crate) struct Output {
    pub id: u64,
    pub buf: Vec<u8>,
    pub first_range: u64,
    pub first_seq: u64,
    pub last_seq: u64,
    pub records: u64,
}

impl Output {
    pub fn new(id: u64, first_range: u64) -> Output {
        let buf = vec![0u8; (format::SEGMENT_HEADER_BYTES + format::COMPACTED_EXT_BYTES) as usize];
        Output {
            id,
            buf,
            first_range,
            first_seq: 0,
            last_seq: 0,
            records: 0,
        }
    }
}

/// Write a compacted segment file at `path` (created, never overwritten) covering
/// `o.first_range..=last_range`, and sync it.
pub(crate) fn write_compacted(
    vfs: &dyn Vfs,
    path: &Path,
    mut o: Output,
    last_range: u64,
) -> Result<Written, Error> {
    let h = format::encode_compacted_header(o.id, o.first_range, last_range);
    o.buf[..h.len()].copy_from_slice(&h);
    debug_assert!(o.records == 0 || (o.first_seq >= o.first_range && o.last_seq <= last_range));
    let file = vfs
        .open(path, OpenMode::CreateNew)
        .map_err(|e| Error::io(path, "create", e))?;
    file.write_at(&o.buf, 0)
        .map_err(|e| Error::io(path, "write_at", e))?;
    file.sync_all()
        .map_err(|e| Error::io(path, "sync_all", e))?;
    Ok(Written {
        id: o.id,
        file,
        bytes: o.buf.len() as u64,
        header: format::SegmentHeader {
            data_start: h.len() as u64,
            compacted: Some((o.first_range, last_range)),
        },
        first_seq: o.first_seq,
    })
}

/// A written compacted segment file.
pub(crate) struct Written {
    id: u64,
    file: Arc<dyn VfsFile>,
    pub bytes: u64,
    header: format::SegmentHeader,
    first_seq: u64,
}

/// Create [`ERASE_MARKER_FILE`] (if absent) and sync it; the caller syncs the directory.
fn write_erase_marker(vfs: &dyn Vfs, dir: &Path) -> Result<(), Error> {
    let p = dir.join(ERASE_MARKER_FILE);
    if vfs.exists(&p).map_err(|e| Error::io(&p, "exists", e))? {
        return Ok(());
    }
    let f = vfs
        .open(&p, OpenMode::CreateNew)
        .map_err(|e| Error::io(&p, "create", e))?;
    f.sync_all().map_err(|e| Error::io(&p, "sync_all", e))
}

/// Remove every file in `dir/checkpoints` (a missing directory has none) and sync the
/// directory. Returns how many were removed.
fn remove_checkpoints(vfs: &dyn Vfs, dir: &Path) -> Result<u64, Error> {
    let cdir = dir.join(crate::CHECKPOINT_DIR);
    let names = match vfs.read_dir(&cdir) {
        Ok(n) => n,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(Error::io(&cdir, "read_dir", e)),
    };
    let mut n = 0;
    for name in names {
        let p = cdir.join(&name);
        match vfs.remove(&p) {
            Ok(()) => n += 1,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(&p, "remove", e)),
        }
    }
    if n > 0 {
        vfs.sync_dir(&cdir)
            .map_err(|e| Error::io(&cdir, "sync_dir", e))?;
    }
    Ok(n)
}

/// Finish an erasing GC (owner open, before the index is opened): when
/// [`ERASE_MARKER_FILE`] exists, delete the index directory `index_dir` (sled keeps old
/// values in its files until its own compaction; the open rebuilds the index from the
/// log) and the checkpoint files, then remove the marker. Every step is repeated by the
/// next open until the marker is gone. Returns whether the index was deleted.
pub(crate) fn finish_erasure(
    vfs: &dyn Vfs,
    dir: &Path,
    index_dir: Option<&Path>,
) -> Result<bool, Error> {
    let marker = dir.join(ERASE_MARKER_FILE);
    if !vfs
        .exists(&marker)
        .map_err(|e| Error::io(&marker, "exists", e))?
    {
        return Ok(false);
    }
    if let Some(ix) = index_dir {
        // The index is sled's, on the host file system (not the VFS).
        match std::fs::remove_dir_all(ix) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(Error::io(ix, "remove_dir_all", e)),
        }
        if let Some(parent) = ix.parent() {
            std::fs::File::open(parent)
                .and_then(|f| f.sync_all())
                .map_err(|e| Error::io(parent, "sync_dir", e))?;
        }
    }
    remove_checkpoints(vfs, dir)?;
    vfs.remove(&marker)
        .map_err(|e| Error::io(&marker, "remove", e))?;
    vfs.sync_dir(dir)
        .map_err(|e| Error::io(dir, "sync_dir", e))?;
    Ok(true)
}

/// Holds the index's rebuild gate (the GC epoch) odd from the swap of a GC's segments
/// until its index is rebuilt, however that ends (a failed GC poisons the store; its
/// readers must not wait forever). Dropped without [`OddEpoch::finish`], it marks the
/// index incomplete.
struct OddEpoch<'a> {
    inner: &'a crate::store::Inner,
    finished: bool,
}

impl<'a> OddEpoch<'a> {
    fn enter(inner: &'a crate::store::Inner) -> OddEpoch<'a> {
        inner.index.gate().begin();
        OddEpoch {
            inner,
            finished: false,
        }
    }

    /// The index was rebuilt whole.
    fn finish(mut self) {
        self.finished = true;
    }
}

impl Drop for OddEpoch<'_> {
    fn drop(&mut self) {
        if !self.finished {
            let cause = "a GC did not finish rebuilding the index; reopen the store";
            self.inner.poison(&std::io::Error::other(cause));
        }
        self.inner.index.gate().end(self.finished);
    }
}

impl Store {
    /// Prepare a log compaction. `keep` is called for each commit of the sealed segments
    /// in log order and says whether it is live. Per stream only a prefix of dead commits
    /// can go (a dead commit after a live one of its stream stays, counted in
    /// [`GcPlan::kept_dead_commits`]); the active segment is never compacted.
    ///
    /// A stream all of whose commits go vanishes: its head is gone, an append with
    /// `NoStream` creates it again at version 1, and a retry of one of its removed
    /// commit ids is no longer recognised.
    pub fn plan_gc(&self, keep: &dyn Fn(&RecordedCommit) -> bool) -> Result<GcPlan, Error> {
        self.plan_gc_with(GcOptions::default(), &|c: &RecordedCommit| {
            if keep(c) {
                GcAction::Keep
            } else {
                GcAction::Drop
            }
        })
    }

    /// Prepare a log compaction that can also replace commits' events
    /// ([`GcAction::Replace`]) and include the active segment ([`GcOptions`]). `decide`
    /// is called for each commit in log order (commits of the active segment possibly
    /// twice). Drops follow the prefix rule of [`Store::plan_gc`]; a replaced commit is
    /// live (it ends its stream's removable prefix).
    pub fn plan_gc_with(
        &self,
        opts: GcOptions,
        decide: &dyn Fn(&RecordedCommit) -> GcAction,
    ) -> Result<GcPlan, Error> {
        let inner = &*self.inner;
        if inner.read_only {
            return Err(Error::ReadOnly);
        }
        let _gc = lock(&inner.gc_lock);
        let _ = self.retire_segments();
        let mut rolled = None;
        if opts.include_active {
            let active = lock(&inner.w).active.clone();
            let mut off = active.data_start;
            let end = active.end.load(Ordering::Acquire);
            let mut touched = false;
            while off < end && !touched {
                let rec = active.read(off, inner.opts.record_bytes_max)?;
                off += u64::from(rec.record_bytes);
                touched = decide(&rec) != GcAction::Keep;
            }
            if touched {
                rolled = self.roll_active()?;
            }
        }
        let active = lock(&inner.w).active.id;
        let epoch = inner.index.gate().epoch();
        let order = segment::in_log_order(
            inner
                .segments
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values(),
        );
        // Per stream: still inside its prefix of removable commits.
        let mut open_prefix: HashMap<String, bool> = HashMap::new();
        let mut removed_through: HashMap<String, u64> = HashMap::new();
        let mut last_version: HashMap<String, u64> = HashMap::new();
        let mut per_seg: HashMap<u64, (GcSegment, Vec<u64>, u64)> = HashMap::new();
        let mut replace: HashMap<u64, Vec<EventData>> = HashMap::new();
        let mut kept_dead = 0u64;
        for rec in self.scan(1)? {
            let rec = rec?;
            let i = &rec.info;
            last_version.insert(i.stream.clone(), i.version);
            let sealed = i.position.segment != active;
            let prefix = open_prefix.entry(i.stream.clone()).or_insert(true);
            let mut replaced = false;
            let live = match decide(&rec) {
                GcAction::Keep => true,
                _ if !sealed => {
                    kept_dead += 1;
                    true
                }
                GcAction::Drop if *prefix => false,
                GcAction::Drop => {
                    kept_dead += 1;
                    true
                }
                GcAction::Replace(events) => {
                    format::commit_payload_len(&i.stream, &events)
                        .map(|n| n + FRAME_HEADER_BYTES)
                        .filter(|&n| n <= u64::from(inner.opts.record_bytes_max))
                        .ok_or_else(|| {
                            Error::InvalidInput(format!(
                                "the replacement of commit {} of stream {:?} is larger than the record limit",
                                i.version, i.stream
                            ))
                        })?;
                    replace.insert(i.seq, events);
                    replaced = true;
                    true
                }
            };
            if live {
                *prefix = false;
            } else {
                removed_through.insert(i.stream.clone(), i.version);
            }
            let seg = i.position.segment;
            let e = per_seg.entry(seg).or_insert_with(|| {
                (
                    GcSegment {
                        segment: seg,
                        name: format::segment_file_name(seg),
                        file_bytes: 0,
                        live_bytes: 0,
                        dead_bytes: 0,
                        live_commits: 0,
                        dead_commits: 0,
                        replaced_commits: 0,
                    },
                    Vec::new(),
                    0,
                )
            });
            let bytes = u64::from(rec.record_bytes);
            if live {
                e.0.live_bytes += bytes;
                e.0.live_commits += 1;
                e.0.replaced_commits += u64::from(replaced);
            } else {
                e.0.dead_bytes += bytes;
                e.0.dead_commits += 1;
                e.1.push(i.seq);
            }
            e.2 = i.seq;
        }
        let segment_bytes_max = inner.opts.segment_bytes_max;
        let mut plan = GcPlan {
            segments: Vec::new(),
            live_bytes: 0,
            dead_bytes: 0,
            reclaimed_bytes: 0,
            dead_commits: 0,
            kept_dead_commits: kept_dead,
            streams_removed: Vec::new(),
            replaced_commits: 0,
            replaced_bytes_before: 0,
            replaced_bytes_after: 0,
            rolled_active: rolled.is_some(),
            new_active_bytes: rolled.unwrap_or(0),
            erase: opts.erase,
            runs: Vec::new(),
            replace: HashMap::new(),
            epoch,
            heads: Vec::new(),
            segment_bytes_max,
        };
        let mut run: Option<Run> = None;
        let mut live_sizes: Vec<u64> = Vec::new();
        let mut new_bytes = 0u64;
        for seg in &order {
            let stats = per_seg.remove(&seg.id);
            let candidate = seg.id != active
                && stats
                    .as_ref()
                    .is_some_and(|s| s.0.dead_commits > 0 || s.0.replaced_commits > 0);
            if !candidate {
                if let Some(r) = run.take() {
                    new_bytes += packed_bytes(&live_sizes, segment_bytes_max);
                    live_sizes.clear();
                    plan.runs.push(r);
                }
                continue;
            }
            let Some((mut gs, dead, last_rec_seq)) = stats else {
                continue;
            };
            gs.file_bytes = seg.capacity;
            let (first, last) = match seg.compacted {
                Some(r) => r,
                None => (seg.first_seq.load(Ordering::Acquire), last_rec_seq),
            };
            let r = run.get_or_insert_with(|| Run {
                segments: Vec::new(),
                first_seq: first,
                last_seq: last,
                dead: HashSet::new(),
            });
            r.segments.push(seg.id);
            r.last_seq = last;
            r.dead.extend(dead);
            // Live record sizes, for the size of the new segments.
            let mut off = seg.data_start;
            let end = seg.end.load(Ordering::Acquire);
            while off < end {
                let rec = seg.read(off, inner.opts.record_bytes_max)?;
                off += u64::from(rec.record_bytes);
                let seq = rec.info.seq;
                if r.dead.contains(&seq) {
                    continue;
                }
                let size = match replace.remove(&seq) {
                    Some(events) => {
                        let n = format::commit_payload_len(&rec.info.stream, &events).unwrap_or(0)
                            + FRAME_HEADER_BYTES;
                        plan.replaced_commits += 1;
                        plan.replaced_bytes_before += u64::from(rec.record_bytes);
                        plan.replaced_bytes_after += n;
                        plan.replace.insert(seq, events);
                        n
                    }
                    None => u64::from(rec.record_bytes),
                };
                live_sizes.push(size);
            }
            plan.live_bytes += gs.live_bytes;
            plan.dead_bytes += gs.dead_bytes;
            plan.dead_commits += gs.dead_commits;
            plan.segments.push(gs);
        }
        if let Some(r) = run.take() {
            new_bytes += packed_bytes(&live_sizes, segment_bytes_max);
            plan.runs.push(r);
        }
        let old_bytes: u64 = plan.segments.iter().map(|s| s.file_bytes).sum();
        plan.reclaimed_bytes = old_bytes.saturating_sub(new_bytes);
        let mut heads: Vec<(String, u64)> = removed_through
            .keys()
            .filter_map(|s| last_version.get(s).map(|v| (s.clone(), *v)))
            .collect();
        heads.sort();
        plan.streams_removed = heads
            .iter()
            .filter(|(s, v)| removed_through.get(s) == Some(v))
            .map(|(s, _)| s.clone())
            .collect();
        plan.heads = heads;
        Ok(plan)
    }

    /// Commit a plan from [`Store::plan_gc`]; see the module docs of `gc` (and ARCHITECTURE.md)
    /// for the crash-safe sequence. Appends wait while the segments are swapped and the
    /// index is rebuilt. A failure after the commit point poisons the store (reopening
    /// finishes the GC); a failure before it leaves the log as it was.
    pub fn run_gc(&self, plan: GcPlan) -> Result<GcReport, Error> {
        let inner = &*self.inner;
        if inner.read_only {
            return Err(Error::ReadOnly);
        }
        if inner.poisoned.load(Ordering::Acquire) {
            return Err(inner.poisoned_error());
        }
        let _gc = lock(&inner.gc_lock);
        if plan.epoch != inner.index.gate().epoch() {
            return Err(Error::GcPlanStale(
                "another GC ran since it was planned".into(),
            ));
        }
        let mut report = GcReport::default();
        if plan.runs.is_empty() {
            report.retire_pending = self.retire_segments()?;
            return Ok(report);
        }
        let dir = inner.dir.clone();
        let vfs = inner.opts.vfs.clone();
        let max = inner.opts.record_bytes_max;

        // 1-2: write the new segments as `.seg.gc`, sync them and the directory.
        let mut written: Vec<Written> = Vec::new();
        let copied = self.copy_runs(&plan, &mut written, &mut report);
        // An erasing GC leaves its marker durable before the commit point: whatever
        // happens next, the next owner open deletes the index files that hold the old
        // values (a rolled-back GC costs that open an index rebuild, nothing more).
        let copied = copied.and_then(|()| {
            if plan.erase {
                write_erase_marker(&*vfs, &dir)?;
            }
            vfs.sync_dir(&dir)
                .map_err(|e| Error::io(&dir, "sync_dir", e))
        });
        let rollback = |written: &[Written]| {
            for w in written {
                let _ = vfs.remove(&dir.join(gc_segment_name(w.id)));
            }
        };
        if let Err(e) = copied {
            rollback(&written);
            return Err(e);
        }

        // 3: the commit point, under the writer lock.
        let mut w = lock(&inner.w);
        while w.leader {
            w = crate::store::wait_writer(inner, w);
        }
        if inner.poisoned.load(Ordering::Acquire) {
            drop(w);
            rollback(&written);
            return Err(inner.poisoned_error());
        }
        if let Some((s, v)) = plan
            .heads
            .iter()
            .find(|(s, v)| w.heads.get(s).copied() != Some(*v))
        {
            let now = w.heads.get(s).copied();
            drop(w);
            rollback(&written);
            return Err(Error::GcPlanStale(format!(
                "stream {s:?} moved from version {v} to {now:?}"
            )));
        }
        let old_ids: Vec<u64> = plan.runs.iter().flat_map(|r| r.segments.clone()).collect();
        let new_ids: Vec<u64> = written.iter().map(|w| w.id).collect();
        let first_new = new_ids.first().copied().unwrap_or(0);
        let manifest = dir.join(manifest_name(first_new));
        let poison = |e: Error| {
            inner.poison(&e);
            e
        };
        let committed = (|| -> Result<(), Error> {
            let f = vfs
                .open(&manifest, OpenMode::CreateNew)
                .map_err(|e| Error::io(&manifest, "create", e))?;
            f.write_at(&encode_manifest(&old_ids, &new_ids), 0)
                .map_err(|e| Error::io(&manifest, "write_at", e))?;
            f.sync_all()
                .map_err(|e| Error::io(&manifest, "sync_all", e))?;
            vfs.sync_dir(&dir)
                .map_err(|e| Error::io(&dir, "sync_dir", e))
        })();
        if let Err(e) = committed {
            // Whether the manifest is durable is unknown: the next open decides (it
            // rolls forward only a complete manifest whose segments all exist).
            return Err(poison(e));
        }

        // 4: rename into place.
        for wr in &written {
            let from = dir.join(gc_segment_name(wr.id));
            let to = dir.join(format::segment_file_name(wr.id));
            vfs.rename(&from, &to)
                .map_err(|e| poison(Error::io(&from, "rename", e)))?;
        }
        vfs.sync_dir(&dir)
            .map_err(|e| poison(Error::io(&dir, "sync_dir", e)))?;

        // 5: swap in memory, rebuild the index. Readers of positions wait while the
        // epoch is odd and read again once it has moved (`Store::settled_gc_epoch`).
        let epoch_guard = OddEpoch::enter(inner);
        let mut retired = Vec::new();
        {
            let mut segs = inner.segments.write().unwrap_or_else(|e| e.into_inner());
            for id in &old_ids {
                if let Some(s) = segs.remove(id) {
                    report.bytes_before += s.capacity;
                    retired.push(s);
                }
            }
            for wr in &written {
                let map = wr.file.map().map_err(|e| {
                    poison(Error::io(
                        dir.join(format::segment_file_name(wr.id)),
                        "map",
                        e,
                    ))
                })?;
                let seg = Segment::new(wr.id, wr.file.clone(), wr.bytes, wr.bytes, wr.first_seq)
                    .at(dir.join(format::segment_file_name(wr.id)))
                    .with_header(wr.header)
                    .with_map(Arc::new(map));
                segs.insert(wr.id, Arc::new(seg));
                report.bytes_after += wr.bytes;
            }
        }
        for s in &plan.streams_removed {
            w.heads.remove(s);
        }
        let layout = inner
            .segments
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .values()
            .filter(|s| s.compacted.is_some())
            .map(|s| s.id)
            .max()
            .unwrap_or(0);
        let rebuilt = self.rebuild_index(layout, max).map_err(poison);
        if rebuilt.is_ok() {
            // No checkpoint on disk is of the new layout: the close writes one.
            inner.checkpoints.forget_newest();
            epoch_guard.finish();
        } else {
            drop(epoch_guard);
        }
        rebuilt?;
        drop(w);

        // 6: retire the old segments once no reader holds them.
        report.segments_removed = old_ids;
        report.segments_written = new_ids;
        report.streams_removed = plan.streams_removed.len() as u64;
        lock(&inner.retired).push(Retired {
            manifest,
            segments: retired,
        });
        report.retire_pending = self.retire_segments()?;
        if plan.erase {
            report.index_wipe_pending = true;
            report.checkpoints_removed = remove_checkpoints(&*vfs, &dir).map_err(poison)?;
        }
        Ok(report)
    }

    /// Copy each run's live records into new `.seg.gc` segments (synced).
    fn copy_runs(
        &self,
        plan: &GcPlan,
        written: &mut Vec<Written>,
        report: &mut GcReport,
    ) -> Result<(), Error> {
        let inner = &*self.inner;
        let max = inner.opts.record_bytes_max;
        for run in &plan.runs {
            let segs: Vec<Arc<Segment>> = {
                let map = inner.segments.read().unwrap_or_else(|e| e.into_inner());
                run.segments
                    .iter()
                    .map(|id| {
                        map.get(id)
                            .cloned()
                            .ok_or_else(|| Error::GcPlanStale(format!("segment {id} is gone")))
                    })
                    .collect::<Result<_, _>>()?
            };
            let mut out: Option<Output> = None;
            // Start of the seq range of the next new segment: each one covers from the
            // end of the previous one's range, the last one up to the run's end.
            let mut next_first = run.first_seq;
            let mut prev_seq = 0;
            for seg in &segs {
                let mut off = seg.data_start;
                let end = seg.end.load(Ordering::Acquire);
                while off < end {
                    let rec = seg.read(off, max)?;
                    off += u64::from(rec.record_bytes);
                    let seq = rec.info.seq;
                    if run.dead.contains(&seq) {
                        report.commits_removed += 1;
                        continue;
                    }
                    let replaced;
                    let rec = match plan.replace.get(&seq) {
                        Some(events) => {
                            let len = format::commit_payload_len(&rec.info.stream, events)
                                .and_then(|n| u32::try_from(n + FRAME_HEADER_BYTES).ok())
                                .ok_or_else(|| {
                                    Error::InvalidInput(format!(
                                        "the replacement of the record at {} is too large",
                                        rec.info.position
                                    ))
                                })?;
                            report.commits_replaced += 1;
                            replaced = RecordedCommit {
                                info: rec.info.clone(),
                                expected: rec.expected,
                                events: events.clone(),
                                record_bytes: len,
                            };
                            &replaced
                        }
                        None => &rec,
                    };
                    let frame = u64::from(rec.record_bytes);
                    let full = out.as_ref().is_some_and(|o| {
                        o.records > 0 && o.buf.len() as u64 + frame > plan.segment_bytes_max
                    });
                    if full {
                        if let Some(o) = out.take() {
                            written.push(self.write_output(o, prev_seq)?);
                            next_first = prev_seq + 1;
                        }
                    }
                    let o = match out.as_mut() {
                        Some(o) => o,
                        None => out.insert(Output::new(self.allocate_segment_id(), next_first)),
                    };
                    encode_copy(&mut o.buf, o.id, rec)?;
                    if o.records == 0 {
                        o.first_seq = seq;
                    }
                    o.last_seq = seq;
                    o.records += 1;
                    report.commits_copied += 1;
                    prev_seq = seq;
                }
            }
            let o = match out.take() {
                Some(o) => o,
                // Nothing live: a segment with only the header still records the range.
                None => Output::new(self.allocate_segment_id(), run.first_seq),
            };
            written.push(self.write_output(o, run.last_seq)?);
        }
        Ok(())
    }

    /// Write an output segment as `<id>.seg.gc` covering `first_range..=last_range`.
    fn write_output(&self, o: Output, last_range: u64) -> Result<Written, Error> {
        let inner = &*self.inner;
        let path = inner.dir.join(gc_segment_name(o.id));
        write_compacted(&*inner.opts.vfs, &path, o, last_range)
    }

    /// A fresh segment id (shared with the writer's rolls, so ids only grow).
    fn allocate_segment_id(&self) -> u64 {
        let mut w = lock(&self.inner.w);
        let id = w.next_segment_id;
        w.next_segment_id += 1;
        id
    }

    /// Clear the index and apply the whole log to it again (the writer lock is held).
    fn rebuild_index(&self, layout: u64, max: u32) -> Result<(), Error> {
        let inner = &*self.inner;
        inner.index.clear(layout)?;
        let order = segment::in_log_order(
            inner
                .segments
                .read()
                .unwrap_or_else(|e| e.into_inner())
                .values(),
        );
        let mut batch = Vec::with_capacity(crate::store::CATCH_UP_BATCH);
        for seg in order {
            let mut off = seg.data_start;
            let end = seg.end.load(Ordering::Acquire);
            while off < end {
                let rec = seg.read(off, max)?;
                off += u64::from(rec.record_bytes);
                batch.push(rec);
                if batch.len() >= crate::store::CATCH_UP_BATCH {
                    inner.index.apply(&batch)?;
                    batch.clear();
                }
            }
        }
        inner.index.apply(&batch)?;
        inner.index.flush_mem()?;
        Ok(())
    }

    /// Remove the files of retired segments no reader holds any more; then, for each GC
    /// whose old segments are all gone, its manifest. Returns how many old segment files
    /// are still waiting for readers.
    pub fn retire_segments(&self) -> Result<u64, Error> {
        retire(&self.inner)
    }
}

/// See [`Store::retire_segments`].
pub(crate) fn retire(inner: &crate::store::Inner) -> Result<u64, Error> {
    {
        // After a failure (e.g. a directory fsync) what is durable is unknown: leave
        // the rest to the next open's recovery, which works from the manifest.
        if inner.read_only || inner.poisoned.load(Ordering::Acquire) {
            return Ok(0);
        }
        let mut retired = lock(&inner.retired);
        if retired.is_empty() {
            return Ok(0);
        }
        let vfs = &*inner.opts.vfs;
        let dir = &inner.dir;
        let mut removed_any = false;
        let mut failed: Option<Error> = None;
        for r in retired.iter_mut() {
            let mut keep = Vec::new();
            for s in std::mem::take(&mut r.segments) {
                // Held only by this list: no reader maps it any more. A segment whose
                // removal fails stays listed (and so does the manifest).
                if Arc::strong_count(&s) > 1 || failed.is_some() {
                    keep.push(s);
                    continue;
                }
                let p = dir.join(&s.name);
                match vfs.remove(&p) {
                    Ok(()) => removed_any = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        failed = Some(Error::io(p, "remove", e));
                        keep.push(s);
                    }
                }
            }
            r.segments = keep;
        }
        if let Some(e) = failed {
            return Err(e);
        }
        if removed_any {
            vfs.sync_dir(dir).map_err(|e| {
                let e = Error::io(dir, "sync_dir", e);
                inner.poison(&e);
                e
            })?;
        }
        let mut done_any = false;
        let mut still = Vec::new();
        for r in retired.drain(..) {
            if r.segments.is_empty() {
                match vfs.remove(&r.manifest) {
                    Ok(()) => done_any = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(Error::io(&r.manifest, "remove", e)),
                }
            } else {
                still.push(r);
            }
        }
        *retired = still;
        if done_any {
            vfs.sync_dir(dir).map_err(|e| {
                let e = Error::io(dir, "sync_dir", e);
                inner.poison(&e);
                e
            })?;
        }
        Ok(retired.iter().map(|r| r.segments.len() as u64).sum())
    }
}

/// Bytes of the segments GC would write for records of these sizes.
fn packed_bytes(sizes: &[u64], segment_bytes_max: u64) -> u64 {
    let head = format::SEGMENT_HEADER_BYTES + format::COMPACTED_EXT_BYTES;
    let mut total = 0;
    let mut cur = head;
    let mut n = 0;
    for &s in sizes {
        if n > 0 && cur + s > segment_bytes_max {
            total += cur;
            cur = head;
            n = 0;
        }
        cur += s;
        n += 1;
    }
    total + cur
}

/// Re-frame a commit for segment `seg`: the payload is the same bytes (every field is
/// kept), the checksum binds the new segment id.
pub(crate) fn encode_copy(out: &mut Vec<u8>, seg: u64, rec: &RecordedCommit) -> Result<(), Error> {
    let i = &rec.info;
    let len = format::commit_payload_len(&i.stream, &rec.events)
        .and_then(|n| u32::try_from(n).ok())
        .ok_or_else(|| Error::InvalidInput(format!("record at {} too large", i.position)))?;
    debug_assert_eq!(
        u64::from(len) + FRAME_HEADER_BYTES,
        u64::from(rec.record_bytes)
    );
    let head = CommitHead {
        stream: &i.stream,
        expected: rec.expected,
        version: i.version,
        commit_id: i.commit_id,
        timestamp_ms: i.timestamp_ms,
        seq: i.seq,
    };
    format::encode_commit_frame(out, seg, &head, &rec.events, len);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn manifest_round_trips_and_rejects_damage() {
        let m = encode_manifest(&[1, 2, 3], &[9, 10]);
        assert_eq!(decode_manifest(&m), Some((vec![1, 2, 3], vec![9, 10])));
        for cut in 0..m.len() {
            assert_eq!(decode_manifest(&m[..cut]), None, "cut at {cut}");
        }
        for i in 0..m.len() {
            let mut d = m.clone();
            d[i] ^= 0x10;
            assert_eq!(decode_manifest(&d), None, "flip at {i}");
        }
        assert!(is_manifest_name(&manifest_name(0xab)));
        assert_eq!(parse_gc_segment_name(&gc_segment_name(7)), Some(7));
    }

    #[test]
    fn packing_matches_segment_limits() {
        // header 56 + three 1000-byte records into 2100-byte segments: 2 + 1.
        assert_eq!(
            packed_bytes(&[1000, 1000, 1000], 2100),
            56 + 2000 + 56 + 1000
        );
        assert_eq!(packed_bytes(&[], 2100), 56);
    }
}
