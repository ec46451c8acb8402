//! sled as a delta over a base checkpoint.
//!
//! An owner's sled holds only what changed since its *base*, a checkpoint file of the
//! whole index named by sled's `META_BASE` key (none: sled holds everything). Reads
//! go memtable, frozen memtable, sled, base. sled's entry values are tagged so that a
//! removal can hide the base's value: a value is stored as [`TAG_VALUE`] and its bytes,
//! a removal under a base as [`TAG_REMOVED`] alone (without a base it is a plain sled
//! removal). Meta keys (first byte 0) are sled's own and stored as they are.
//!
//! A clean close that wrote a checkpoint (or finds one it wrote after its last commit:
//! `Shared::on_close`) makes it the next base: it builds a new sled in `delta.next`
//! holding only the meta keys (the base among them) and the cache's small values, and
//! once sled is closed swaps the directories (`delta` to `delta.old`, `delta.next` to
//! `delta`, the index directory fsynced, the old base and `delta.old` removed). The next owner open then opens an empty sled: its page table, and the
//! pages a check of the checkpoint's version blocks would read, no longer grow with
//! the store. A crash between the renames leaves no `delta`: the open takes the
//! newest checkpoint the log backs as the base of an empty sled (as it does when sled
//! is lost or damaged) and folds the log after it.

use super::*;
use sled::IVec;

/// sled's directory in the index directory ([`crate::INDEX_DIR`]): a delta over the
/// checkpoint it names (see `delta.rs`).
pub const INDEX_SLED_DIR: &str = "delta";
/// Where a clean close builds the next sled (see the module's docs).
const SLED_NEXT_DIR: &str = "delta.next";
/// Where the replaced sled goes before it is removed.
const SLED_OLD_DIR: &str = "delta.old";
/// The checkpoint sled is a delta over (see [`BaseId`]); absent: none.
pub(crate) const META_BASE: &[u8] = b"\x00meta:base";

pub(super) const TAG_VALUE: u8 = 0;
pub(super) const TAG_REMOVED: u8 = 1;

/// Names a base checkpoint: the fields of its header that tell it from any other of
/// the store (its seq and commit id, the log layout it was made for, its entry count).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BaseId {
    pub seq: u64,
    pub commit_id: Uuid,
    pub layout: u64,
    pub entries: u64,
}

const BASE_ID_BYTES: usize = 40;

impl BaseId {
    pub(crate) fn of(ck: &CheckpointFile) -> BaseId {
        BaseId {
            seq: ck.header.seq,
            commit_id: ck.header.commit_id,
            layout: ck.header.layout,
            entries: ck.header.entries,
        }
    }

    fn encode(&self) -> [u8; BASE_ID_BYTES] {
        let mut b = [0u8; BASE_ID_BYTES];
        b[..8].copy_from_slice(&self.seq.to_be_bytes());
        b[8..24].copy_from_slice(self.commit_id.as_bytes());
        b[24..32].copy_from_slice(&self.layout.to_be_bytes());
        b[32..].copy_from_slice(&self.entries.to_be_bytes());
        b
    }

    fn decode(v: &[u8]) -> Result<BaseId, IndexError> {
        let bad = || IndexError::Malformed(format!("base checkpoint key of {} bytes", v.len()));
        if v.len() != BASE_ID_BYTES {
            return Err(bad());
        }
        Ok(BaseId {
            seq: be_u64(&v[..8]).ok_or_else(bad)?,
            commit_id: Uuid::from_slice(&v[8..24]).map_err(|_| bad())?,
            layout: be_u64(&v[24..32]).ok_or_else(bad)?,
            entries: be_u64(&v[32..]).ok_or_else(bad)?,
        })
    }

    /// Whether `ck` is the checkpoint this names.
    pub(crate) fn names(&self, ck: &CheckpointFile) -> bool {
        *self == BaseId::of(ck)
    }
}

fn is_meta(k: &[u8]) -> bool {
    k.first() == Some(&0)
}

/// Writes `k`'s new value (`None`: removed) into sled as the delta stores it.
pub(super) fn write_entry(
    tree: &sled::Tree,
    k: &[u8],
    v: Option<&[u8]>,
    has_base: bool,
) -> Result<(), sled::Error> {
    match v {
        Some(v) if is_meta(k) => tree.insert(k, v)?,
        Some(v) => {
            let mut stored = Vec::with_capacity(v.len() + 1);
            stored.push(TAG_VALUE);
            stored.extend_from_slice(v);
            tree.insert(k, stored)?
        }
        None if has_base && !is_meta(k) => tree.insert(k, &[TAG_REMOVED][..])?,
        None => tree.remove(k)?,
    };
    Ok(())
}

/// What sled's stored value of `k` says: `Some(value)`, or `None` for a removal.
fn decode_stored(k: &[u8], v: IVec) -> Result<Option<IVec>, IndexError> {
    if is_meta(k) {
        return Ok(Some(v));
    }
    match v.first() {
        Some(&TAG_VALUE) => Ok(Some(v.subslice(1, v.len() - 1))),
        Some(&TAG_REMOVED) if v.len() == 1 => Ok(None),
        _ => Err(IndexError::Malformed(format!(
            "an index value of {} bytes with tag {:?}",
            v.len(),
            v.first()
        ))),
    }
}

/// `k`'s value in a bulk load's `runs`, or sled over `base`; a read of the base that
/// fails sets `failed`.
pub(super) fn get(
    tree: &sled::Tree,
    base: Option<&CheckpointFile>,
    runs: Option<&spill::Runs>,
    k: &[u8],
    failed: &AtomicBool,
) -> Result<Option<IVec>, IndexError> {
    if let Some(v) = runs.map(|r| r.get(k)).transpose()?.flatten() {
        return Ok(v);
    }
    match sled_guard("reading a key", || Ok(tree.get(k)?))? {
        Some(v) => decode_stored(k, v),
        None => match base {
            Some(b) if !is_meta(k) => b
                .get(k)
                .inspect_err(|_| failed.store(true, Ordering::Release)),
            _ => Ok(None),
        },
    }
}

/// sled's entries in a range merged over the base's, and a bulk load's runs over both,
/// in key order; removals hide older entries and are not yielded. The base's meta keys
/// are never yielded: sled's (or the runs') are the index's.
pub(crate) struct DeltaIter {
    runs: Option<spill::RunsIter>,
    runs_peek: Option<(IVec, Option<IVec>)>,
    sled: sled::Iter,
    /// Set when a read of the base fails (see [`Index::base_failed`]).
    base_failed: Option<Arc<AtomicBool>>,
    base: Option<crate::checkpoint::CheckpointIter>,
    sled_peek: Option<(IVec, IVec)>,
    base_peek: Option<(IVec, IVec)>,
    sled_done: bool,
    base_done: bool,
    failed: bool,
}

impl DeltaIter {
    pub(super) fn new(
        tree: &sled::Tree,
        base: Option<&Arc<CheckpointFile>>,
        runs: Option<&spill::Runs>,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
    ) -> DeltaIter {
        DeltaIter {
            runs: runs.map(|r| r.range(lo.clone(), hi.clone())),
            runs_peek: None,
            sled: tree.range((lo.clone(), hi.clone())),
            base_failed: None,
            base_done: base.is_none(),
            base: base.map(|b| b.range(lo, hi)),
            sled_peek: None,
            base_peek: None,
            sled_done: false,
            failed: false,
        }
    }

    /// Sets `flag` when a read of the base fails.
    pub(super) fn noting_base_failures(mut self, flag: Arc<AtomicBool>) -> DeltaIter {
        self.base_failed = Some(flag);
        self
    }

    fn fill(&mut self) -> Result<(), IndexError> {
        if self.runs_peek.is_none() {
            match self.runs.as_mut().and_then(Iterator::next) {
                Some(kv) => self.runs_peek = Some(kv?),
                None => self.runs = None,
            }
        }
        if self.sled_peek.is_none() && !self.sled_done {
            match sled_guard("scanning", || Ok(self.sled.next()))? {
                Some(kv) => self.sled_peek = Some(kv?),
                None => self.sled_done = true,
            }
        }
        while self.base_peek.is_none() && !self.base_done {
            match self.base.as_mut().and_then(Iterator::next) {
                Some(kv) => {
                    let kv = kv.inspect_err(|_| {
                        if let Some(f) = &self.base_failed {
                            f.store(true, Ordering::Release);
                        }
                    })?;
                    if !is_meta(&kv.0) {
                        self.base_peek = Some(kv);
                    }
                }
                None => self.base_done = true,
            }
        }
        Ok(())
    }
}

impl Iterator for DeltaIter {
    type Item = Result<(IVec, IVec), IndexError>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.failed {
                return None;
            }
            if let Err(e) = self.fill() {
                self.failed = true;
                return Some(Err(e));
            }
            if let Some((r, _)) = &self.runs_peek {
                let sled_after = self.sled_peek.as_ref().is_none_or(|(s, _)| s >= r);
                let base_after = self.base_peek.as_ref().is_none_or(|(b, _)| b >= r);
                if sled_after && base_after {
                    // The runs' entry is the newest: it replaces sled's and the base's.
                    if self.sled_peek.as_ref().is_some_and(|(s, _)| s == r) {
                        self.sled_peek = None;
                    }
                    if self.base_peek.as_ref().is_some_and(|(b, _)| b == r) {
                        self.base_peek = None;
                    }
                    match self.runs_peek.take()? {
                        (k, Some(v)) => return Some(Ok((k, v))),
                        (_, None) => continue,
                    }
                }
            }
            let order = match (&self.sled_peek, &self.base_peek) {
                (None, None) => return None,
                (Some(_), None) => std::cmp::Ordering::Less,
                (None, Some(_)) => std::cmp::Ordering::Greater,
                (Some((s, _)), Some((b, _))) => s.as_ref().cmp(b.as_ref()),
            };
            if order == std::cmp::Ordering::Greater {
                return self.base_peek.take().map(Ok);
            }
            if order == std::cmp::Ordering::Equal {
                // sled's entry replaces the base's.
                self.base_peek = None;
            }
            let (k, v) = self.sled_peek.take()?;
            match decode_stored(&k, v) {
                Ok(Some(v)) => return Some(Ok((k, v))),
                Ok(None) => continue,
                Err(e) => {
                    self.failed = true;
                    return Some(Err(e));
                }
            }
        }
    }
}

impl Index {
    /// The base checkpoint sled names, if any (read from sled: an open resolves it).
    pub(crate) fn base_id(&self) -> Result<Option<BaseId>, Error> {
        let tree = &self.sled("read its base")?.tree;
        match sled_guard("reading a key", || Ok(tree.get(META_BASE)?)).map_err(Error::Index)? {
            Some(v) => Ok(Some(BaseId::decode(&v).map_err(Error::Index)?)),
            None => Ok(None),
        }
    }

    /// The checkpoint under sled (an owner's index), if any.
    pub(crate) fn base(&self) -> Option<Arc<CheckpointFile>> {
        self.base.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts the checkpoint sled names as its base (see [`Index::base_id`]) under it.
    /// The caller has checked that `ck` is that checkpoint. `scan_keys`: fill the key
    /// filter from both in the background unless a saved one was taken.
    pub(crate) fn attach_base(&self, ck: Arc<CheckpointFile>, scan_keys: bool) {
        debug_assert!(self.sled.is_some(), "only sled is a delta over a base");
        self.set_base_file(ck);
        let complete = self.keys.read().unwrap_or_else(|e| e.into_inner()).complete;
        if scan_keys && !complete {
            self.start_key_scan();
        }
    }

    /// Makes `ck` the base of this empty index: sled then holds the meta keys of an
    /// index of exactly the checkpoint's commits (its applied marker and layout) and
    /// nothing else. The key filter is filled from both in the background.
    pub(crate) fn adopt_base(&self, ck: Arc<CheckpointFile>) -> Result<(), Error> {
        let tree = &self.sled("adopt a base")?.tree;
        debug_assert!(
            self.applied_marker()?.0 == 0,
            "only an empty index adopts a base"
        );
        let mut marker = [0u8; 24];
        marker[..8].copy_from_slice(&ck.header.seq.to_be_bytes());
        marker[8..].copy_from_slice(ck.header.commit_id.as_bytes());
        let mut b = sled::Batch::default();
        b.insert(META_APPLIED, &marker[..]);
        b.insert(META_LAYOUT, &ck.header.layout.to_be_bytes()[..]);
        b.insert(META_BASE, &BaseId::of(&ck).encode()[..]);
        tree.apply_batch(b).map_err(sled_err)?;
        self.set_base_file(ck);
        // The filter held sled's keys only (none).
        self.stop_key_scan();
        self.key_scan_stop.store(false, Ordering::Relaxed);
        self.keys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .complete = false;
        self.start_key_scan();
        Ok(())
    }

    fn set_base_file(&self, ck: Arc<CheckpointFile>) {
        self.base_seq.store(ck.header.seq, Ordering::Release);
        *self.base.write().unwrap_or_else(|e| e.into_inner()) = Some(ck);
    }

    /// After a read of the base failed (a block whose CRC does not hold: the base's
    /// reads were checked only as far as its header and block index when it was
    /// opened): the base is renamed to `<name>.damaged`, once, so that the next owner
    /// open finds it gone and starts from another checkpoint or the log instead of
    /// failing the same reads again. This open keeps failing them.
    pub(super) fn set_base_aside_if_failed(&self) {
        if !self.base_failed.load(Ordering::Acquire) {
            return;
        }
        let Some(base) = self.base() else {
            return;
        };
        if self.base_set_aside.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut aside = base.path.clone().into_os_string();
        aside.push(".damaged");
        let _ = std::fs::rename(&base.path, aside);
    }

    /// Drops the base (a clear: sled is emptied of everything, its base key included).
    pub(super) fn drop_base(&self) {
        *self.base.write().unwrap_or_else(|e| e.into_inner()) = None;
        self.base_failed.store(false, Ordering::Release);
        self.base_seq.store(0, Ordering::Release);
    }

    /// The seq of the base checkpoint, 0 when none, shared with the writer of
    /// checkpoints, which never removes the base.
    pub(crate) fn base_seq_cell(&self) -> Arc<AtomicU64> {
        self.base_seq.clone()
    }

    /// Whether every version block sled holds extends the base's block of the same
    /// key (versions are only ever appended to a block, and never removed): what an
    /// owner's open resumed from the base checks instead of every block of it.
    pub(crate) fn delta_extends_base(&self) -> Result<bool, Error> {
        let (Some(sled), Some(base)) = (&self.sled, self.base()) else {
            return Ok(true);
        };
        let hi = prefix_end(VERSION).map_or(Bound::Unbounded, Bound::Excluded);
        for kv in sled.tree.range((Bound::Included(VERSION.to_vec()), hi)) {
            let (k, v) = sled_guard("scanning", || Ok(kv?)).map_err(Error::Index)?;
            let Some(v) = decode_stored(&k, v).map_err(Error::Index)? else {
                return Ok(false);
            };
            if let Some(b) = base.get(&k).map_err(Error::Index)? {
                if !v.starts_with(&b) {
                    return Ok(false);
                }
            }
        }
        Ok(true)
    }

    /// Builds the next sled over the checkpoint `ck` just written by a clean close,
    /// which holds exactly the index's entries: in `delta.next`, with sled's meta keys
    /// (the base now `ck`) and the cache's small values. The directories are swapped
    /// when the index is dropped ([`Index::finish_rebase`]); a key filter saved after
    /// this is saved for the new sled. Best effort: on failure nothing changes.
    pub(crate) fn prepare_rebase(&self, ck: &CheckpointFile) -> Result<(), Error> {
        let (Some(dir), Some(sled)) = (&self.path, &self.sled) else {
            return Err(Error::Index(IndexError::NoSled("rebase")));
        };
        let applied = self.applied_marker()?;
        if applied != (ck.header.seq, Some(ck.header.commit_id))
            || self.layout()? != ck.header.layout
        {
            return Err(Error::Index(IndexError::Mismatch(format!(
                "the checkpoint at seq {} is not of the index (applied seq {})",
                ck.header.seq, applied.0
            ))));
        }
        let next = dir.join(SLED_NEXT_DIR);
        Index::wipe_dir(Some(&next))?;
        let built = sled_guard("building the next index", || {
            let db = Index::open_db_inner(Some(&next), INDEX_CACHE_BYTES_MIN)?;
            let mut meta = sled::Batch::default();
            // The meta keys as the index holds them: a bulk load's runs hold the newest.
            let runs = self.spill.get().map(|r| &**r);
            let hi = Bound::Excluded(vec![1u8]);
            for kv in DeltaIter::new(&sled.tree, None, runs, Bound::Unbounded, hi) {
                let (k, v) = kv?;
                if k != META_MOVING && k != META_BASE {
                    meta.insert(k, v);
                }
            }
            meta.insert(META_BASE, &BaseId::of(ck).encode()[..]);
            db.apply_batch(meta)?;
            if let Some(cache) = &self.cache_dir {
                let to = db.open_tree(CACHE_TREE)?;
                for kv in cache.tree.iter() {
                    let (k, v) = kv?;
                    to.insert(k, v)?;
                }
            }
            flush_sled(&db)?;
            Ok(db)
        })
        .map_err(Error::Index)?;
        let fingerprint = key_fingerprint_of(&built).map_err(Error::Index)?;
        drop(built);
        *self.next.lock().unwrap_or_else(|e| e.into_inner()) = Some(NextSled {
            base: ck.path.clone(),
            fingerprint,
        });
        Ok(())
    }

    /// Swaps in the sled [`Index::prepare_rebase`] built, once this index's sled is
    /// closed. Whatever fails leaves either sled, or none (which the next open reads
    /// as lost: it takes the newest checkpoint as the base).
    pub(super) fn finish_rebase(&mut self) -> bool {
        let Some(next) = self.next.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return false;
        };
        if self.base_failed.load(Ordering::Acquire) {
            // Nothing is built on a base set aside: the next open starts afresh.
            let _ = Index::wipe_dir(
                self.path
                    .as_deref()
                    .map(|d| d.join(SLED_NEXT_DIR))
                    .as_deref(),
            );
            return false;
        }
        let Some(dir) = self.path.clone() else {
            return false;
        };
        drop(self.cache_dir.take());
        drop(self.sled.take());
        let (cur, next_dir, old) = (
            dir.join(INDEX_SLED_DIR),
            dir.join(SLED_NEXT_DIR),
            dir.join(SLED_OLD_DIR),
        );
        let _ = Index::wipe_dir(Some(&old));
        if std::fs::rename(&cur, &old).is_ok() && std::fs::rename(&next_dir, &cur).is_ok() {
            let synced = std::fs::File::open(&dir).and_then(|d| d.sync_all());
            // The old base is of no use once the new sled is durably in place (the
            // next owner open removes it otherwise).
            if let (Ok(()), Some(b)) = (synced, self.base()) {
                if b.path != next.base {
                    let _ = std::fs::remove_file(&b.path);
                }
            }
        }
        let _ = Index::wipe_dir(Some(&old));
        true
    }
}

/// The next sled a clean close built in `delta.next`: the checkpoint it is a delta
/// over, and its meta keys' fingerprint (the key filter saved at that close is
/// saved for it).
pub(super) struct NextSled {
    base: PathBuf,
    pub(super) fingerprint: Vec<u8>,
}

/// The fingerprint [`Index::save_key_filter`] writes for sled `db` (its applied
/// marker, layout, format and base, each as a length and its bytes).
pub(super) fn key_fingerprint_of(tree: &sled::Tree) -> Result<Vec<u8>, IndexError> {
    let mut out = Vec::new();
    for k in [META_APPLIED, META_LAYOUT, META_FORMAT, META_BASE] {
        let v = tree.get(k)?;
        let v = v.as_deref().unwrap_or(&[]);
        out.extend_from_slice(&(v.len() as u32).to_be_bytes());
        out.extend_from_slice(v);
    }
    Ok(out)
}

/// Removes what a close's rebase cut short left in the index directory `dir`: the
/// sled it was building, the one it was replacing.
pub(super) fn remove_rebase_leftovers(dir: &Path) -> Result<(), Error> {
    Index::wipe_dir(Some(&dir.join(SLED_NEXT_DIR)))?;
    Index::wipe_dir(Some(&dir.join(SLED_OLD_DIR)))
}
