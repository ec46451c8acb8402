//! Opening the index: sled's own open (with its lock wait and repairs), the format
//! and layout checks, finishing a move cut short by a crash from its redo record,
//! and wiping or clearing the index for a rebuild.

use super::*;

impl Index {
    /// sled of the index directory `path` (in its [`INDEX_SLED_DIR`]), or a temporary one.
    pub(super) fn open_db(path: Option<&Path>, cache_bytes: u64) -> Result<sled::Db, sled::Error> {
        if let Some(p) = path {
            // The index directory is the owner's alone (sled picks its own file
            // modes; `tighten_permissions` fixes them up on open and close).
            let _ = std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(p);
        }
        let sled_dir = path.map(|p| p.join(INDEX_SLED_DIR));
        let db = Self::open_db_inner(sled_dir.as_deref(), cache_bytes);
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
    pub(super) fn open_db_repairing(
        path: Option<&Path>,
        cache_bytes: u64,
    ) -> Result<sled::Db, sled::Error> {
        let first = Index::open_db(path, cache_bytes);
        match (&first, path) {
            (Err(e), Some(p)) if !is_sled_lock_error(e) => {
                if remove_unfinished_snapshots(&p.join(INDEX_SLED_DIR)) > 0 {
                    Index::open_db(path, cache_bytes)
                } else {
                    first
                }
            }
            _ => first,
        }
    }

    /// sled opened at `path` with a page cache of `cache_bytes` (clamped to
    /// [`INDEX_CACHE_BYTES_MIN`]: sled refuses a cache of less than 256 bytes).
    pub(crate) fn open_db_inner(
        path: Option<&Path>,
        cache_bytes: u64,
    ) -> Result<sled::Db, sled::Error> {
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
            .cache_capacity(cache_bytes.max(INDEX_CACHE_BYTES_MIN))
            .mode(sled::Mode::HighThroughput);
        match path {
            Some(p) => cfg.path(p).open(),
            None => cfg.temporary(true).open(),
        }
    }

    /// [`Index::open_sized`] with the default sled page cache.
    #[cfg(test)]
    pub(crate) fn open(
        path: Option<&Path>,
        indexers: Vec<Arc<dyn Indexer>>,
    ) -> Result<(Index, bool), Error> {
        Index::open_sized(path, indexers, INDEX_CACHE_BYTES_MAX)
    }

    /// Open (or create) the index at `path` (`None` = a temporary index) with a sled
    /// page cache of `cache_bytes`. Returns the index and whether it was (re)created
    /// empty. A missing, unreadable or outdated index is wiped.
    ///
    /// A damaged index (any error or panic from sled while opening it or reading what an
    /// open reads) is wiped and built again; the lock of a live sled is never wiped.
    pub(crate) fn open_sized(
        path: Option<&Path>,
        indexers: Vec<Arc<dyn Indexer>>,
        cache_bytes: u64,
    ) -> Result<(Index, bool), Error> {
        let first = sled_guard("opening the index", || {
            Index::open_checked(path, indexers.clone(), cache_bytes).map_err(IndexError::from_error)
        });
        match first {
            Ok(r) => Ok(r),
            Err(IndexError::Sled(e)) if is_sled_lock_error(&e) => Err(sled_err(e)),
            Err(e) if path.is_none() => Err(Error::Index(e)),
            Err(_) => {
                Index::wipe_dir(path)?;
                sled_guard("opening the index", || {
                    Index::open_checked(path, indexers, cache_bytes).map_err(IndexError::from_error)
                })
                .map_err(Error::Index)
            }
        }
    }

    /// [`Index::open`] without the rebuild of a damaged index; also reads what the
    /// store's open reads next (layout, applied marker), so that damage there is found
    /// here.
    fn open_checked(
        path: Option<&Path>,
        indexers: Vec<Arc<dyn Indexer>>,
        cache_bytes: u64,
    ) -> Result<(Index, bool), Error> {
        let (ix, fresh) = Index::open_unchecked(path, indexers, cache_bytes)?;
        ix.layout()?;
        ix.applied_marker()?;
        Ok((ix, fresh))
    }

    fn open_unchecked(
        path: Option<&Path>,
        indexers: Vec<Arc<dyn Indexer>>,
        cache_bytes: u64,
    ) -> Result<(Index, bool), Error> {
        if let Some(p) = path {
            // sled's files directly in the index directory: the layout before sled
            // became a delta over a checkpoint. The open takes a checkpoint as the
            // base of a new one instead.
            if p.join("conf").exists() || p.join("db").exists() {
                Index::wipe_dir(path)?;
            }
        }
        let mut opened = Index::open_db_repairing(path, cache_bytes);
        // sled's own file lock: a handle closed a moment ago (sled releases it from its
        // background threads) or, misconfigured, another store on the same directory.
        // Wait a little for the former; never wipe an index someone holds.
        let mut waited = 0;
        while matches!(&opened, Err(e) if is_sled_lock_error(e)) && waited < SLED_LOCK_WAIT_TRIES {
            std::thread::sleep(std::time::Duration::from_millis(50));
            waited += 1;
            opened = Index::open_db_repairing(path, cache_bytes);
        }
        let db = match opened {
            Ok(db) => db,
            Err(e) if is_sled_lock_error(&e) => return Err(sled_err(e)),
            Err(_) if path.is_some() => {
                Index::wipe_dir(path)?;
                Index::open_db(path, cache_bytes).map_err(sled_err)?
            }
            Err(e) => return Err(sled_err(e)),
        };
        if let Some(p) = path {
            // Under sled's lock: no other open of this index is building a next sled.
            delta::remove_rebase_leftovers(p)?;
            // A bulk load's runs never outlive its process (see `spill.rs`).
            spill::remove_dir(p)?;
        }
        let mut ix = Index::from_db(db, indexers.clone(), path, cache_bytes)?;
        // A move cut short that cannot be finished leaves keys of two states: only a
        // rebuild from the log gives a consistent index again.
        let whole = match ix.finish_cut_move() {
            Ok(()) => true,
            Err(_) if path.is_some() => false,
            Err(e) => return Err(e),
        };
        if whole && ix.is_current()? {
            // The filter saved at the last clean close, if it fits sled as it is; else
            // the scan (a stale or damaged file costs only that).
            match ix.take_key_filter() {
                Ok(Some(filter)) => {
                    let mut keys = ix.keys.write().unwrap_or_else(|e| e.into_inner());
                    keys.filter = filter;
                    keys.complete = true;
                }
                // Over a base the scan starts once the store attaches it.
                Ok(None) | Err(_) if ix.base_id()?.is_none() => ix.start_key_scan(),
                Ok(None) | Err(_) => {}
            }
            return Ok((ix, false));
        }
        if path.is_some() && (!whole || !ix.sled("check emptiness")?.tree.is_empty()) {
            drop(ix);
            Index::wipe_dir(path)?;
            let db = Index::open_db(path, cache_bytes).map_err(sled_err)?;
            ix = Index::from_db(db, indexers, path, cache_bytes)?;
        }
        // An empty index has no cache: one left by a clear cut short is of another.
        ix.clear_cache()?;
        ix.init_meta(0)?;
        // Empty: every indexer key will come through `apply`.
        ix.keys.write().unwrap_or_else(|e| e.into_inner()).complete = true;
        Ok((ix, true))
    }

    /// Open the index directory `path` on its own, outside any store, as it is (no
    /// wipe, no catch-up with a log), with a sled page cache of `cache_bytes`: to read
    /// its entries ([`Index::entries`]), e.g. an old index beside a rebuild of it.
    /// `None` if it holds an index of another format. A move into it that a crash cut
    /// short is finished first. Nothing else may have it open.
    ///
    /// `store_dir` is the directory of the store the index is of: the checkpoint sled
    /// is a delta over is read from there (a missing one is an error).
    pub fn open_existing(
        path: &Path,
        store_dir: &Path,
        cache_bytes: u64,
    ) -> Result<Option<Index>, Error> {
        Index::open_existing_in(&crate::vfs::OsVfs, path, store_dir, cache_bytes)
    }

    /// [`Index::open_existing`] reading the base checkpoint through `vfs`.
    pub(crate) fn open_existing_in(
        vfs: &dyn crate::vfs::Vfs,
        path: &Path,
        store_dir: &Path,
        cache_bytes: u64,
    ) -> Result<Option<Index>, Error> {
        sled_guard("opening the index", || {
            Index::open_existing_unguarded(vfs, path, store_dir, cache_bytes)
                .map_err(IndexError::from_error)
        })
        .map_err(Error::Index)
    }

    fn open_existing_unguarded(
        vfs: &dyn crate::vfs::Vfs,
        path: &Path,
        store_dir: &Path,
        cache_bytes: u64,
    ) -> Result<Option<Index>, Error> {
        if !path.join(INDEX_SLED_DIR).exists() {
            return Ok(None);
        }
        let db = Index::open_db_repairing(Some(path), cache_bytes).map_err(sled_err)?;
        let ix = Index::from_db(db, Vec::new(), Some(path), cache_bytes)?;
        ix.finish_cut_move()?;
        let format = ix
            .sled("read its format")?
            .tree
            .get(META_FORMAT)
            .map_err(sled_err)?;
        if format.as_deref() != Some(&INDEX_FORMAT_VERSION.to_be_bytes()[..]) {
            return Ok(None);
        }
        if let Some(id) = ix.base_id()? {
            let ck = crate::checkpoint::open_base(vfs, store_dir, &id).map_err(|why| {
                Error::Index(IndexError::Malformed(format!(
                    "the checkpoint the index is a delta over: {why}"
                )))
            })?;
            ix.attach_base(Arc::new(ck), false);
            // A view of a copy or an old index (verify, replay) never renames the
            // store's checkpoint: as if it had been set aside already.
            ix.base_set_aside.store(true, Ordering::Release);
        }
        Ok(Some(ix))
    }

    pub(super) fn from_db(
        db: sled::Db,
        indexers: Vec<Arc<dyn Indexer>>,
        path: Option<&Path>,
        cache_bytes: u64,
    ) -> Result<Index, Error> {
        #[cfg(test)]
        if tests::PANIC_IN_SLED.with(|p| p.replace(false)) {
            panic!("tried to serialize Uninitialized (a damaged index, forced by a test)");
        }
        let tree: sled::Tree = (*db).clone();
        let (redo, cache_dir) = match path {
            Some(p) => (
                Some(Arc::new(Mutex::new(RedoLog::open(p)?))),
                Some(cache_files::DirCache {
                    tree: db.open_tree(CACHE_TREE).map_err(sled_err)?,
                    files: cache_files::CacheFiles::open(p)?,
                }),
            ),
            None => (None, None),
        };
        let mut ix = Index::from_parts(Some(Sled { db, tree }), indexers, path, redo);
        ix.cache_dir = cache_dir;
        ix.cache_bytes = cache_bytes;
        Ok(ix)
    }

    /// An index whose bottom layer is the checkpoint file `base`, with no sled at all:
    /// a read-only open from a checkpoint reads the memtable (the log after the
    /// checkpoint) and the file, and never moves anything into sled. Opening a
    /// temporary sled only to drop it unused would cost a short read most of its time
    /// (sled's drop of a temporary database: flush, thread pool, directory removal).
    pub(crate) fn over_checkpoint(
        indexers: Vec<Arc<dyn Indexer>>,
        base: Arc<CheckpointFile>,
    ) -> Index {
        let ix = Index::from_parts(None, indexers, None, None);
        let set = ix.set_base(base);
        debug_assert!(set, "a fresh index has no base yet");
        ix
    }

    fn from_parts(
        sled: Option<Sled>,
        indexers: Vec<Arc<dyn Indexer>>,
        path: Option<&Path>,
        redo: Option<Arc<Mutex<RedoLog>>>,
    ) -> Index {
        Index {
            sled,
            cache_dir: None,
            cache_mem: Mutex::new(Default::default()),
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
            gate: Default::default(),
            // An index without sled has no page cache; `from_db` sets sled's.
            cache_bytes: INDEX_CACHE_BYTES_MAX,
            base: RwLock::new(None),
            base_seq: Arc::new(AtomicU64::new(0)),
            next: Mutex::new(None),
            spill: std::sync::OnceLock::new(),
            base_failed: Arc::new(AtomicBool::new(false)),
            base_set_aside: AtomicBool::new(false),
            applied_at: Mutex::new(None),
            moved_bytes: AtomicU64::new(0),
            snapshot_at_close: AtomicBool::new(false),
            after_move: std::sync::OnceLock::new(),
            #[cfg(test)]
            move_gate: Arc::default(),
        }
    }

    /// sled, or [`IndexError::NoSled`] for an index over a checkpoint file.
    pub(super) fn sled(&self, op: &'static str) -> Result<&Sled, IndexError> {
        self.sled.as_ref().ok_or(IndexError::NoSled(op))
    }

    /// Starts filling the key filter from sled in the background (reads use sled until
    /// it is done). Without a thread the filter stays unused.
    pub(super) fn start_key_scan(&self) {
        let Ok(view) = self.sled_view() else {
            return;
        };
        let keys = self.keys.clone();
        let stop = self.key_scan_stop.clone();
        if let Ok(h) = std::thread::Builder::new()
            .name("spool-index-keys".into())
            .spawn(move || scan_keys(&view, &keys, &stop))
        {
            *self.key_scan.lock().unwrap_or_else(|e| e.into_inner()) = Some(h);
        }
    }

    /// Stops the open scan (if it still runs) and waits for it.
    pub(super) fn stop_key_scan(&self) {
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
    pub(super) fn finish_cut_move(&self) -> Result<(), Error> {
        let Some(redo) = &self.redo else {
            return Ok(());
        };
        let mut redo = redo.lock().unwrap_or_else(|e| e.into_inner());
        let tree = &self.sled("finish a move")?.tree;
        let Some(marker) = tree.get(META_MOVING).map_err(sled_err)? else {
            // Every move sled holds is whole. After a kill its files may still be only
            // in the page cache, where a power loss could yet cut a move: the records
            // go once sled has been flushed (nothing to do after a clean close, which
            // empties the redo log).
            if !redo.is_empty() {
                flush_sled(tree).map_err(sled_err)?;
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
        let has_base = tree.get(delta::META_BASE).map_err(sled_err)?.is_some();
        let mut applied = Ok(());
        redo::for_each_write(&body, |k, v| {
            if applied.is_ok() {
                applied = delta::write_entry(tree, k, v, has_base);
            }
        })
        .map_err(malformed)?;
        applied.map_err(sled_err)?;
        tree.remove(META_MOVING).map_err(sled_err)?;
        // Durable before the record goes: a crash in between finds the marker again.
        flush_sled(tree).map_err(sled_err)?;
        redo.clear()?;
        Ok(())
    }

    pub(super) fn wipe_dir(path: Option<&Path>) -> Result<(), Error> {
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
    pub(super) fn is_current(&self) -> Result<bool, Error> {
        let format = self.read_key(META_FORMAT)?;
        if format.as_deref() != Some(&INDEX_FORMAT_VERSION.to_be_bytes()[..]) {
            return Ok(false);
        }
        let mut stored: BTreeMap<Vec<u8>, Vec<u8>> = BTreeMap::new();
        for kv in self
            .sled("check its indexers")?
            .tree
            .scan_prefix(META_INDEXER)
        {
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
    pub(super) fn init_meta(&self, layout: u64) -> Result<(), Error> {
        let mut b = sled::Batch::default();
        b.insert(META_FORMAT, &INDEX_FORMAT_VERSION.to_be_bytes()[..]);
        b.insert(META_APPLIED, &0u64.to_be_bytes()[..]);
        b.insert(META_LAYOUT, &layout.to_be_bytes()[..]);
        for ix in &self.indexers {
            let mut k = META_INDEXER.to_vec();
            k.extend_from_slice(ix.name().as_bytes());
            b.insert(k, &ix.version().to_be_bytes()[..]);
        }
        self.sled("write its meta keys")?
            .tree
            .apply_batch(b)
            .map_err(sled_err)
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

    pub(super) fn clear_entries(&self, layout: u64) -> Result<(), Error> {
        // A failed background move does not matter: everything is dropped.
        let _ = self.join_moving();
        *self.mem.write().unwrap_or_else(|e| e.into_inner()) = Mem::default();
        *self.frozen.write().unwrap_or_else(|e| e.into_inner()) = None;
        if let Some(runs) = self.spill.get() {
            runs.clear();
        }
        let sled = self.sled("clear")?;
        // Everything goes, the base too (sled's key naming it with the rest).
        self.drop_base();
        // The cache first, durably: sled's clear reaches its files whenever sled writes
        // (at the latest when it is dropped), and an index found empty must not find
        // the cache of the one it replaced.
        self.clear_cache()?;
        sled.tree.clear().map_err(sled_err)?;
        if let Some(redo) = &self.redo {
            // The records describe moves sled may not hold durably yet: they go only
            // once sled holds the clear (a crash before finds the old keys and them).
            flush_sled(&sled.tree).map_err(sled_err)?;
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

    /// The highest seq the index records as on disk in the log: it was written after
    /// the fdatasync that covered that commit, so a log whose valid records end before
    /// it lost acknowledged commits. 0 when the index holds no such mark (a new, lost or
    /// rebuilt index, or one written before the mark existed): no evidence.
    pub(crate) fn synced_seq(&self) -> Result<u64, Error> {
        match self.read_key(META_SYNCED)? {
            Some(v) => {
                be_u64(&v).ok_or_else(|| Error::Index(IndexError::Malformed("synced seq".into())))
            }
            None => Ok(0),
        }
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
}

/// Removes group and other access from the index directory and everything
/// in it (best effort). sled creates its files with the process's default
/// mode; the directory itself is created 0700, so nothing in it is reachable
/// by others in between.
pub(super) fn tighten_permissions(dir: &Path) {
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
        // The cache files are made owner-only, and may be many.
        if meta.is_dir() && !p.file_name().is_some_and(cache_files::is_cache_dir_name) {
            if let Ok(rd) = std::fs::read_dir(&p) {
                stack.extend(rd.filter_map(|e| e.ok()).map(|e| e.path()));
            }
        }
    }
}
