//! Spill runs: the index of a bulk load without sled.
//!
//! While a store opened for a bulk load ([`crate::Options::index_bulk_load`], what
//! `spool import` uses) is open, a full memtable is not moved into sled: it is written
//! as a *run*, a sorted file in the checkpoint format in `index/spill/`, and reads go
//! memtable, frozen memtable, runs (newest first), sled, base. Runs are merged in the
//! background as they pile up (a level's newest group of [`RUNS_PER_LEVEL_MAX`] or
//! more runs into one run of the next level), so their number grows with the
//! logarithm of what was loaded. A merge runs on a thread of its own, so that the
//! next spill (and the appends waiting for it) need not wait for it; only when level
//! 0 has piled up [`LEVEL0_RUNS_MAX`] runs behind a merge does a spill wait for the
//! merge to end. The clean close's checkpoint reads all of it and becomes sled's
//! next base (see `delta.rs`); the runs then go.
//!
//! sled never sees the load: its page table, IO buffers and per-key work grew with
//! every key moved into it, which is what bounded an import's speed and memory. Runs
//! are written once per level, in key order, with no fsync: like the memtable they
//! hold, they are lost in a crash, and sled's applied mark (which no spill moves)
//! makes the next open read the log after it again. Every open removes what a crashed
//! bulk load left in `index/spill/`.
//!
//! A run's values are tagged as sled's are under a base ([`delta::TAG_VALUE`] and the
//! value, or [`delta::TAG_REMOVED`] alone), meta keys included: a removal in a run hides
//! the key in older runs, sled and the base.

use super::delta::{TAG_REMOVED, TAG_VALUE};
use super::*;
use crate::checkpoint::format::Header;
use crate::checkpoint::{CheckpointFile, CheckpointIter};
use crate::vfs::{OsVfs, Vfs};
use sled::IVec;

/// The directory of the runs, in the index directory.
pub(super) const SPILL_DIR: &str = "spill";

/// How many runs of one level are merged into one of the next: the fan-in of the
/// merges. Each entry is written once per level (about log8 of the number of
/// memtables spilled), and once settled ([`Runs::settle`]) a read of a key that is in
/// no run looks at most `RUNS_PER_LEVEL_MAX - 1` runs per level (while merges run
/// behind the spills, level 0 holds up to about [`LEVEL0_RUNS_MAX`], and a higher
/// level may hold more than the fan-in until the merge thread gets to it: it merges
/// the newest full group first).
pub(super) const RUNS_PER_LEVEL_MAX: usize = 8;

/// Most runs level 0 holds while a merge runs before a spill waits for the merge
/// (which bounds what a read of an absent key looks at). Twice the fan-in: a spill
/// every so often finds the merge of the previous full level still running (a
/// merge into level 2 or higher takes as long as several spills).
const LEVEL0_RUNS_MAX: usize = 2 * RUNS_PER_LEVEL_MAX;

/// One run: a file and its level (0: a spilled memtable; `n + 1`: a merge of
/// [`RUNS_PER_LEVEL_MAX`] or more runs of level `n`).
pub(crate) struct Run {
    file: Arc<CheckpointFile>,
    level: u32,
}

/// The runs of an index open for a bulk load, oldest first. Levels never increase
/// from oldest to newest, so the runs of the newest level are the last ones.
pub(crate) struct Runs {
    dir: PathBuf,
    list: RwLock<Vec<Arc<Run>>>,
    next_id: AtomicU64,
    /// The thread merging full levels, if one was started (see
    /// [`Runs::merge_behind`]): its failure is reported by the next spill or settle.
    merging: Mutex<Option<JoinHandle<Result<(), IndexError>>>>,
    /// Holds merge threads back while closed (tests).
    #[cfg(test)]
    merge_gate: Arc<super::MoveGate>,
    /// Holds a merge thread back while closed once it has written its run, before it
    /// puts it in the list (tests).
    #[cfg(test)]
    splice_gate: Arc<super::MoveGate>,
}

impl Runs {
    /// Empty runs in `index_dir/spill`, which is emptied first.
    pub(super) fn create(index_dir: &Path) -> Result<Runs, Error> {
        let dir = index_dir.join(SPILL_DIR);
        remove_dir(index_dir)?;
        // Owner-only, as every directory and file the store creates.
        OsVfs::new()
            .create_dir_all(&dir)
            .map_err(|e| Error::io(&dir, "create_dir_all", e))?;
        Ok(Runs {
            dir,
            list: RwLock::new(Vec::new()),
            next_id: AtomicU64::new(1),
            merging: Mutex::new(None),
            #[cfg(test)]
            merge_gate: Arc::default(),
            #[cfg(test)]
            splice_gate: Arc::default(),
        })
    }

    fn snapshot(&self) -> Vec<Arc<Run>> {
        self.list.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// The runs' levels, oldest first (tests).
    #[cfg(test)]
    pub(crate) fn levels(&self) -> Vec<u32> {
        self.snapshot().iter().map(|r| r.level).collect()
    }

    /// `k` in the newest run that has it: `Some(None)` if it was removed there, `None`
    /// if no run has it.
    pub(super) fn get(&self, k: &[u8]) -> Result<Option<Option<IVec>>, IndexError> {
        // Under the read lock, not a copy of the list: a spill or merge waits for it.
        let list = self.list.read().unwrap_or_else(|e| e.into_inner());
        for run in list.iter().rev() {
            if let Some(v) = run.file.get(k)? {
                return decode(&run.file, v).map(Some);
            }
        }
        Ok(None)
    }

    /// The runs' entries in a range, newest first on equal keys, removals included.
    pub(super) fn range(&self, lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>) -> RunsIter {
        RunsIter::over(&self.snapshot(), lo, hi)
    }

    /// Writes `writes` as a new run, then has full levels merged (see
    /// [`Runs::merge_behind`]).
    pub(super) fn spill(self: &Arc<Self>, writes: &MemTable) -> Result<(), IndexError> {
        let entries = writes
            .range(Bound::Unbounded, Bound::Unbounded)
            .map(|(k, v)| Ok::<_, IndexError>((k, tagged(v.as_deref()))));
        let run = self.write(entries, 0)?;
        self.list
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(run);
        self.merge_behind()
    }

    /// Starts a thread that merges full levels, unless one still runs and level 0
    /// holds fewer than [`LEVEL0_RUNS_MAX`] runs (then that one is left to it, or to
    /// the next spill); otherwise waits for it first, reporting its failure. Without
    /// a thread the merges happen here.
    fn merge_behind(self: &Arc<Self>) -> Result<(), IndexError> {
        let mut slot = self.merging.lock().unwrap_or_else(|e| e.into_inner());
        let running = slot.as_ref().is_some_and(|h| !h.is_finished());
        if running && self.level0_runs() < LEVEL0_RUNS_MAX {
            return Ok(());
        }
        if let Some(h) = slot.take() {
            joined(h)?;
        }
        if self.full_level().is_none() {
            return Ok(());
        }
        let runs = self.clone();
        match std::thread::Builder::new()
            .name("spool-merge".into())
            .spawn(move || {
                #[cfg(test)]
                runs.merge_gate.pass();
                runs.merge_full_levels()
            }) {
            Ok(h) => *slot = Some(h),
            Err(_) => self.merge_full_levels()?,
        }
        Ok(())
    }

    /// Waits for a merge thread, then merges what is still full here: afterwards no
    /// level holds [`RUNS_PER_LEVEL_MAX`] runs and no thread writes runs.
    pub(super) fn settle(&self) -> Result<(), IndexError> {
        if let Some(h) = self.take_merge() {
            joined(h)?;
        }
        self.merge_full_levels()
    }

    /// The merge thread started last, if any, to be joined.
    fn take_merge(&self) -> Option<JoinHandle<Result<(), IndexError>>> {
        self.merging
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    fn merge_full_levels(&self) -> Result<(), IndexError> {
        while let Some(full) = self.full_level() {
            self.merge(&full)?;
        }
        Ok(())
    }

    /// How many runs level 0 holds (they are the newest).
    fn level0_runs(&self) -> usize {
        let list = self.list.read().unwrap_or_else(|e| e.into_inner());
        list.iter().rev().take_while(|r| r.level == 0).count()
    }

    /// The newest group of runs of one level that holds at least
    /// [`RUNS_PER_LEVEL_MAX`] of them (more while a merge ran behind the spills).
    fn full_level(&self) -> Option<Vec<Arc<Run>>> {
        let list = self.snapshot();
        let mut end = list.len();
        while end > 0 {
            let level = list[end - 1].level;
            let same = list[..end]
                .iter()
                .rev()
                .take_while(|r| r.level == level)
                .count();
            if same >= RUNS_PER_LEVEL_MAX {
                return Some(list[end - same..end].to_vec());
            }
            end -= same;
        }
        None
    }

    /// Replaces `runs`, consecutive in the list, by one run of the next level holding
    /// their newest entries (removals kept: older runs, sled or the base may hold the
    /// key). Runs spilled meanwhile stay after it. The levels stay non-increasing:
    /// `runs` is a whole group of one level, so the run before them is of a higher one.
    fn merge(&self, runs: &[Arc<Run>]) -> Result<(), IndexError> {
        let level = runs[0].level + 1;
        let entries = RunsIter::over(runs, Bound::Unbounded, Bound::Unbounded)
            .map(|kv| kv.map(|(k, v)| (k, tagged(v.as_deref()))));
        let merged = self.write(entries, level)?;
        #[cfg(test)]
        if std::thread::current().name() == Some("spool-merge") {
            self.splice_gate.pass();
        }
        let mut list = self.list.write().unwrap_or_else(|e| e.into_inner());
        let at = list
            .iter()
            .position(|r| Arc::ptr_eq(r, &runs[0]))
            .filter(|&at| {
                list.len() - at >= runs.len()
                    && list[at..].iter().zip(runs).all(|(a, b)| Arc::ptr_eq(a, b))
            });
        if let Some(at) = at {
            list.splice(at..at + runs.len(), [merged]);
            debug_assert!(list.windows(2).all(|w| w[0].level >= w[1].level));
            drop(list);
            for r in runs {
                let _ = std::fs::remove_file(&r.file.path);
            }
        } else {
            // A clear dropped them meanwhile.
            drop(list);
            let _ = std::fs::remove_file(&merged.file.path);
        }
        Ok(())
    }

    fn write<E: std::fmt::Display>(
        &self,
        entries: impl Iterator<Item = Result<(impl AsRef<[u8]>, impl AsRef<[u8]>), E>>,
        level: u32,
    ) -> Result<Arc<Run>, IndexError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let path = self.dir.join(format!("{id:016x}.run"));
        let vfs = OsVfs::new();
        let header = Header {
            index_format: INDEX_FORMAT_VERSION,
            layout: 0,
            seq: 0,
            commit_id: Uuid::nil(),
            segment: 0,
            offset: 0,
            last_ts: 0,
            entries: 0,
            indexers: Vec::new(),
            segments: Vec::new(),
        };
        crate::checkpoint::write::write_unsynced(&vfs, &path, header, entries)
            .map_err(|e| IndexError::Spill(e.to_string()))?;
        let file = CheckpointFile::open(&vfs, &path).map_err(IndexError::Spill)?;
        Ok(Arc::new(Run {
            file: Arc::new(file),
            level,
        }))
    }

    /// Drops every run (a clear of the index), after a merge still running (whose
    /// failure does not matter then).
    pub(super) fn clear(&self) {
        if let Some(h) = self.take_merge() {
            let _ = h.join();
        }
        let dropped = std::mem::take(&mut *self.list.write().unwrap_or_else(|e| e.into_inner()));
        for r in dropped {
            let _ = std::fs::remove_file(&r.file.path);
        }
    }
}

/// A merge thread's outcome; its panic is a failure of the index.
fn joined(h: JoinHandle<Result<(), IndexError>>) -> Result<(), IndexError> {
    h.join()
        .unwrap_or_else(|_| Err(IndexError::Spill("the merge thread panicked".into())))
}

/// Removes `index_dir/spill` and everything in it.
pub(super) fn remove_dir(index_dir: &Path) -> Result<(), Error> {
    Index::wipe_dir(Some(&index_dir.join(SPILL_DIR)))
}

/// A memtable value as a run stores it.
fn tagged(v: Option<&[u8]>) -> Vec<u8> {
    match v {
        Some(v) => {
            let mut out = Vec::with_capacity(v.len() + 1);
            out.push(TAG_VALUE);
            out.extend_from_slice(v);
            out
        }
        None => vec![TAG_REMOVED],
    }
}

/// What a run's stored value says: `Some(value)`, or `None` for a removal.
fn decode(file: &CheckpointFile, v: IVec) -> Result<Option<IVec>, IndexError> {
    match v.first() {
        Some(&TAG_VALUE) => Ok(Some(v.subslice(1, v.len() - 1))),
        Some(&TAG_REMOVED) if v.len() == 1 => Ok(None),
        _ => Err(IndexError::Spill(format!(
            "{}: a value of {} bytes with tag {:?}",
            file.path.display(),
            v.len(),
            v.first()
        ))),
    }
}

/// Several runs' entries merged in key order; on equal keys the newest run's entry,
/// decoded (`None`: removed).
pub(crate) struct RunsIter {
    /// Newest first.
    runs: Vec<Cursor>,
    failed: bool,
}

/// A run's scan, and the entry it yields next.
struct Cursor {
    run: Arc<Run>,
    iter: CheckpointIter,
    peek: Option<(IVec, IVec)>,
    done: bool,
}

impl RunsIter {
    fn over(runs: &[Arc<Run>], lo: Bound<Vec<u8>>, hi: Bound<Vec<u8>>) -> RunsIter {
        RunsIter {
            runs: runs
                .iter()
                .rev()
                .map(|r| Cursor {
                    run: r.clone(),
                    iter: r.file.range(lo.clone(), hi.clone()),
                    peek: None,
                    done: false,
                })
                .collect(),
            failed: false,
        }
    }

    fn fill(&mut self) -> Result<(), IndexError> {
        for c in &mut self.runs {
            if c.peek.is_none() && !c.done {
                match c.iter.next() {
                    Some(kv) => c.peek = Some(kv?),
                    None => c.done = true,
                }
            }
        }
        Ok(())
    }
}

impl Iterator for RunsIter {
    type Item = Result<(IVec, Option<IVec>), IndexError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            return None;
        }
        if let Err(e) = self.fill() {
            self.failed = true;
            return Some(Err(e));
        }
        let least = self
            .runs
            .iter()
            .filter_map(|c| c.peek.as_ref().map(|(k, _)| k))
            .min()?
            .clone();
        // The first (newest) run holding the least key wins; the others' entries of it
        // are older and go.
        let mut winner = None;
        for c in &mut self.runs {
            if c.peek.as_ref().is_some_and(|(k, _)| *k == least) {
                let (k, v) = c.peek.take()?;
                if winner.is_none() {
                    winner = Some((c.run.clone(), k, v));
                }
            }
        }
        let (run, k, v) = winner?;
        match decode(&run.file, v) {
            Ok(v) => Some(Ok((k, v))),
            Err(e) => {
                self.failed = true;
                Some(Err(e))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Spill `i`: key `k{i}`, a removal of `k{i-1}` when `i` is a multiple of 5, and
    /// `last` overwritten.
    fn memtable(i: u64) -> MemTable {
        let mut m = MemTable::with_capacity(3);
        m.insert(
            format!("k{i:04}").as_bytes(),
            Some(i.to_be_bytes().to_vec()),
        );
        if i.is_multiple_of(5) {
            m.insert(format!("k{:04}", i - 1).as_bytes(), None);
        }
        m.insert(b"last", Some(i.to_be_bytes().to_vec()));
        m
    }

    /// What the runs must answer after spills 1..=n, removals as `None`.
    fn want(n: u64) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        let mut w: Vec<_> = (1..=n)
            .map(|i| {
                let removed = i < n && (i + 1).is_multiple_of(5);
                let v = (!removed).then(|| i.to_be_bytes().to_vec());
                (format!("k{i:04}").into_bytes(), v)
            })
            .collect();
        w.push((b"last".to_vec(), Some(n.to_be_bytes().to_vec())));
        w.sort();
        w
    }

    fn check(runs: &Runs, n: u64) {
        let levels = runs.levels();
        assert!(levels.windows(2).all(|w| w[0] >= w[1]), "{levels:?}");
        for (k, v) in want(n) {
            let got = runs.get(&k).unwrap().map(|v| v.map(|v| v.to_vec()));
            assert_eq!(
                got,
                Some(v),
                "{} after {n} spills",
                String::from_utf8_lossy(&k)
            );
        }
        let scanned: Vec<_> = runs
            .range(Bound::Unbounded, Bound::Unbounded)
            .map(|kv| {
                kv.map(|(k, v)| (k.to_vec(), v.map(|v| v.to_vec())))
                    .unwrap()
            })
            .collect();
        assert_eq!(scanned, want(n), "after {n} spills");
    }

    /// Spills go on while a merge is held back: reads answer as the whole index at
    /// every step; once level 0 holds `LEVEL0_RUNS_MAX` runs the next spill waits for
    /// the merge; a settle leaves no full level and no merge thread.
    #[test]
    fn spills_go_on_while_a_merge_runs_behind_them() {
        let dir = tempfile::tempdir().unwrap();
        let runs = Arc::new(Runs::create(dir.path()).unwrap());
        runs.merge_gate.set_closed(true);
        let held = LEVEL0_RUNS_MAX as u64 - 1;
        for i in 1..=held {
            runs.spill(&memtable(i)).unwrap();
            check(&runs, i);
        }
        assert_eq!(
            runs.levels(),
            vec![0; held as usize],
            "the merge is held back"
        );
        let spiller = {
            let runs = runs.clone();
            std::thread::spawn(move || runs.spill(&memtable(held + 1)))
        };
        while runs.levels().len() <= held as usize {
            std::thread::yield_now();
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(
            !spiller.is_finished(),
            "a spill at the bound waits for the merge"
        );
        runs.merge_gate.set_closed(false);
        spiller.join().unwrap().unwrap();
        check(&runs, held + 1);
        for i in held + 2..=100 {
            runs.spill(&memtable(i)).unwrap();
            check(&runs, i);
        }
        runs.settle().unwrap();
        assert!(runs.merging.lock().unwrap().is_none());
        let levels = runs.levels();
        for l in 0..=2 {
            let at_l = levels.iter().filter(|&&x| x == l).count();
            assert!(at_l < RUNS_PER_LEVEL_MAX, "{levels:?}");
        }
        // How many runs each merge took depends on how far the spills ran ahead.
        assert!(levels.len() < 2 * RUNS_PER_LEVEL_MAX, "{levels:?}");
        check(&runs, 100);
        let files = std::fs::read_dir(dir.path().join(SPILL_DIR))
            .unwrap()
            .count();
        assert_eq!(files, levels.len(), "merged runs' files are gone");
    }

    fn spill_dir_files(dir: &Path) -> usize {
        std::fs::read_dir(dir.join(SPILL_DIR)).unwrap().count()
    }

    /// Waits until the merge thread has ended (without joining it).
    fn wait_merge_ended(runs: &Runs) {
        while runs
            .merging
            .lock()
            .unwrap()
            .as_ref()
            .is_some_and(|h| !h.is_finished())
        {
            std::thread::yield_now();
        }
    }

    /// Spills `first..first + RUNS_PER_LEVEL_MAX` with the splice gate closed and
    /// waits until the merge they fill has written its run and is held at the gate.
    /// The last spill's number.
    fn spill_into_held_merge(runs: &Arc<Runs>, dir: &Path, first: u64) -> u64 {
        runs.splice_gate.set_closed(true);
        let files = spill_dir_files(dir);
        let last = first + RUNS_PER_LEVEL_MAX as u64 - 1;
        for i in first..=last {
            runs.spill(&memtable(i)).unwrap();
        }
        while spill_dir_files(dir) <= files + RUNS_PER_LEVEL_MAX {
            std::thread::yield_now();
        }
        last
    }

    /// Spills into a merge held after it wrote its run: the merged run takes its
    /// inputs' place and the runs spilled meanwhile stay after it, unmerged (a merge
    /// that could splice only at the tail would throw its run away and merge again).
    #[test]
    fn a_merge_splices_its_run_where_its_inputs_were() {
        let dir = tempfile::tempdir().unwrap();
        let runs = Arc::new(Runs::create(dir.path()).unwrap());
        let full = spill_into_held_merge(&runs, dir.path(), 1);
        for i in full + 1..=full + 3 {
            runs.spill(&memtable(i)).unwrap();
            check(&runs, i);
        }
        runs.splice_gate.set_closed(false);
        wait_merge_ended(&runs);
        assert_eq!(runs.levels(), vec![1, 0, 0, 0]);
        check(&runs, full + 3);
        assert_eq!(spill_dir_files(dir.path()), 4, "the inputs' files are gone");
    }

    /// A level that filled behind a newer, smaller group is merged too: seven runs of
    /// level 1, then a merge of level 0 that ends after three more spills leaves
    /// eight runs of level 1 before three of level 0; the settle merges them.
    #[test]
    fn a_full_level_behind_a_newer_group_is_merged() {
        let dir = tempfile::tempdir().unwrap();
        let runs = Arc::new(Runs::create(dir.path()).unwrap());
        let full = RUNS_PER_LEVEL_MAX as u64;
        let mut i = 0;
        for _ in 0..full - 1 {
            for _ in 0..full {
                i += 1;
                runs.spill(&memtable(i)).unwrap();
            }
            runs.settle().unwrap();
        }
        assert_eq!(runs.levels(), vec![1; full as usize - 1]);
        i = spill_into_held_merge(&runs, dir.path(), i + 1);
        for _ in 0..3 {
            i += 1;
            runs.spill(&memtable(i)).unwrap();
        }
        runs.splice_gate.set_closed(false);
        runs.settle().unwrap();
        assert_eq!(runs.levels(), vec![2, 0, 0, 0]);
        check(&runs, i);
    }

    /// A settle and a clear wait for a merge still running: afterwards no thread
    /// writes runs, and a clear leaves no file.
    #[test]
    fn a_settle_and_a_clear_wait_for_the_merge() {
        for clear in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let runs = Arc::new(Runs::create(dir.path()).unwrap());
            let full = spill_into_held_merge(&runs, dir.path(), 1);
            let waiter = {
                let runs = runs.clone();
                std::thread::spawn(move || {
                    if clear {
                        runs.clear();
                        Ok(())
                    } else {
                        runs.settle()
                    }
                })
            };
            std::thread::sleep(std::time::Duration::from_millis(50));
            assert!(!waiter.is_finished(), "clear {clear}: waits for the merge");
            runs.splice_gate.set_closed(false);
            waiter.join().unwrap().unwrap();
            assert!(runs.merging.lock().unwrap().is_none());
            if clear {
                assert!(runs.levels().is_empty());
                assert_eq!(spill_dir_files(dir.path()), 0);
            } else {
                assert_eq!(runs.levels(), vec![1]);
                check(&runs, full);
                assert_eq!(spill_dir_files(dir.path()), 1);
            }
        }
    }

    /// A merge that fails (its run cannot be written) is reported by the next spill,
    /// keeps its inputs (nothing lost) and leaves no file; a settle then merges them.
    #[test]
    fn a_failed_merge_is_reported_and_loses_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let runs = Arc::new(Runs::create(dir.path()).unwrap());
        runs.merge_gate.set_closed(true);
        let full = RUNS_PER_LEVEL_MAX as u64;
        for i in 1..=full {
            runs.spill(&memtable(i)).unwrap();
        }
        // The merge thread cannot write into a directory that is gone.
        let aside = dir.path().join("aside");
        std::fs::rename(dir.path().join(SPILL_DIR), &aside).unwrap();
        runs.merge_gate.set_closed(false);
        wait_merge_ended(&runs);
        std::fs::rename(&aside, dir.path().join(SPILL_DIR)).unwrap();
        let next = runs.spill(&memtable(full + 1));
        assert!(
            matches!(next, Err(IndexError::Spill(_))),
            "the merge's failure is reported: {next:?}"
        );
        check(&runs, full + 1);
        assert_eq!(
            spill_dir_files(dir.path()),
            full as usize + 1,
            "no stray file"
        );
        runs.settle().unwrap();
        assert_eq!(runs.levels(), vec![1]);
        check(&runs, full + 1);
    }
}
