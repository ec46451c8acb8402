//! The index's queries: stream heads and versions, commit-id lookups through the
//! version blocks, the indexers' entries and the cache, the change mark, and
//! the test views of the memtable.

use super::*;

impl Index {
    /// The head of `stream`, `None` if it does not exist.
    pub fn stream_head(&self, stream: &str) -> Result<Option<StreamHead>, Error> {
        let k = head_key(stream);
        self.gate.read(|| match self.read_key(&k)? {
            Some(v) => Ok(Some(decode_head(&v)?)),
            None => Ok(None),
        })
    }

    /// The rebuild gate the public reads pass (see `gate.rs`).
    pub(crate) fn gate(&self) -> &gate::RebuildGate {
        &self.gate
    }

    /// The head of `stream` in the checkpoint `ck`: the index as of the checkpoint's
    /// record (what a scan resumed after that record continues each stream from).
    pub(crate) fn checkpoint_stream_head(
        ck: &CheckpointFile,
        stream: &str,
    ) -> Result<Option<StreamHead>, Error> {
        match ck.get(&head_key(stream)).map_err(Error::Index)? {
            Some(v) => Ok(Some(decode_head(&v)?)),
            None => Ok(None),
        }
    }

    /// Whether the index holds every version entry of the checkpoint `ck`: each of
    /// its version blocks is a prefix of the index's (later commits only append to a
    /// block). One index read per block, none of the log: what an owner's open from
    /// `ck` checks instead of the log before it, so that a block lost after the
    /// checkpoint was written is found and rebuilt, never served.
    pub(crate) fn holds_checkpoint_versions(
        &self,
        ck: &Arc<CheckpointFile>,
    ) -> Result<bool, Error> {
        let hi = prefix_end(VERSION).map_or(Bound::Unbounded, Bound::Excluded);
        for kv in ck.range(Bound::Included(VERSION.to_vec()), hi) {
            let (k, block) = kv.map_err(Error::Index)?;
            let held = self.read_key_with(&k, |v| v.is_some_and(|v| v.starts_with(&block)))?;
            if !held {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Where version `version` of `stream` is in the log.
    pub fn stream_position(
        &self,
        stream: &str,
        version: u64,
    ) -> Result<Option<LogPosition>, Error> {
        self.gate
            .read(|| Ok(self.stream_entry(stream, version)?.map(|e| e.position)))
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
        let mut found = None;
        self.visit_versions(|stream, version, e| {
            if e.commit_id == id {
                found = Some((stream.to_vec(), version, e.position));
            }
            found.is_none()
        })?;
        match found {
            Some((stream, version, pos)) => {
                let stream = String::from_utf8(stream).map_err(|_| {
                    Error::Index(IndexError::Malformed("stream version block key".into()))
                })?;
                Ok(Some((stream, version, pos)))
            }
            None => Ok(None),
        }
    }

    /// Calls `f` with the commit id of every commit the index holds (a full pass over
    /// the version index, the only place it keeps them): what fills the store's
    /// commit-id filter when the open read only the log's tail.
    pub(crate) fn for_each_commit_id(&self, mut f: impl FnMut(Uuid)) -> Result<(), Error> {
        self.visit_versions(|_, _, e| {
            f(e.commit_id);
            true
        })
    }

    /// Every version entry of every stream's blocks, holes skipped, as `f(stream,
    /// version, entry)`, until `f` returns false.
    fn visit_versions(
        &self,
        mut f: impl FnMut(&[u8], u64, &BlockEntry) -> bool,
    ) -> Result<(), Error> {
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
                let version = block_no * VERSIONS_PER_BLOCK + 1 + i as u64;
                i += 1;
                if !e.is_hole() && !f(stream, version, &e) {
                    return Ok(());
                }
            }
        }
        Ok(())
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
        self.gate.read(|| {
            let mut out = Vec::new();
            for kv in self.merged(HEAD) {
                let (k, v) = kv?;
                let name = String::from_utf8(k[HEAD.len()..].to_vec())
                    .map_err(|_| IndexError::Malformed("stream name".into()))?;
                out.push((name, decode_head(&v)?.version));
            }
            Ok(out)
        })
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
        self.gate.read(|| {
            Ok(with_joined(&[&head, ns.as_bytes(), key], |k| {
                self.read_key(k)
            })?)
        })
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
        let mut f = Some(f);
        loop {
            let epoch = self.gate.settled()?;
            // `f` sees the value only if no rebuild began before it was read.
            let got = with_joined(&[&head, ns.as_bytes(), key], |k| {
                self.read_key_with(k, |v| match self.gate.moved_since(epoch) {
                    true => None,
                    false => f.take().map(|f| f(v)),
                })
            });
            match got {
                Ok(Some(t)) => return Ok(t),
                Ok(None) => {}
                // Read while a rebuild ran: read again.
                Err(_) if self.gate.moved_since(epoch) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// An indexer's entries whose keys start with `prefix` (keys without the namespace).
    pub fn scan_prefix(&self, ns: &str, prefix: &[u8]) -> IndexScan<'_> {
        let p = user_key(ns, prefix);
        // Taken before the iterator is made: a rebuild that began meanwhile (or runs
        // now, odd) makes the first step start again.
        let epoch = self.gate.epoch();
        IndexScan {
            iter: ScanSource::Merged(Box::new(self.merged(&p))),
            strip: user_prefix_len(ns),
            resume: Some(Resume::new(self, p, epoch)),
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
        let mut from = from;
        loop {
            let epoch = self.gate.settled()?;
            // The last entry `f` saw (kept by moving it, not copying), to go on after
            // it if a rebuild began meanwhile.
            let mut last: Option<Kv> = None;
            let mut it = self.merged_from(&p, &from);
            let done = if it.mem.peek().is_none() {
                // Nothing pending in the memtables in range: sled's entries alone.
                let mut done = true;
                for kv in &mut it.sled {
                    if self.gate.moved_since(epoch) {
                        done = false;
                        break;
                    }
                    let (k, v) = kv?;
                    if !f(k.get(strip..).unwrap_or(&[]), &v) {
                        return Ok(());
                    }
                    last = Some(Kv::Sled(k, v));
                }
                done
            } else {
                let mut done = true;
                while let Some(kv) = it.next_kv() {
                    if self.gate.moved_since(epoch) {
                        done = false;
                        break;
                    }
                    let kv = kv?;
                    if !f(kv.key().get(strip..).unwrap_or(&[]), kv.value()) {
                        return Ok(());
                    }
                    last = Some(kv);
                }
                done
            };
            // An end reached while a rebuild cleared the index is no end.
            if done && !self.gate.moved_since(epoch) {
                return Ok(());
            }
            if let Some(kv) = last {
                from = [kv.key(), &[0]].concat();
            }
        }
    }

    /// Write a cache entry (outside commits; dropped when the index is rebuilt). An
    /// index with a directory keeps a large value in a file of its own and a small one
    /// in sled (see `cache_files.rs`; a value over [`crate::CACHE_VALUE_BYTES_MAX`] is
    /// not kept); one without keeps its cache in memory, at most 16 MiB of it
    /// (`MEM_CACHE_BYTES_MAX`).
    pub fn put_cache(&self, ns: &str, key: &[u8], value: &[u8]) -> Result<(), Error> {
        let mut k = cache_prefix(ns);
        k.extend_from_slice(key);
        match &self.cache_dir {
            Some(cache) => cache.put(&k, value)?,
            None => self.cache_map().insert(k, value),
        }
        Ok(())
    }

    /// The cache of an index without a directory.
    fn cache_map(&self) -> std::sync::MutexGuard<'_, super::mem_cache::MemCache> {
        self.cache_mem.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A cache entry's value, copied out (see [`Index::with_cache`]).
    pub fn get_cache(&self, ns: &str, key: &[u8]) -> Result<Option<Vec<u8>>, Error> {
        self.with_cache(ns, key, <[u8]>::to_vec)
    }

    /// `read` of a cache entry's value in place, without copying it again: a
    /// cached snapshot can be megabytes that the caller only decodes.
    pub fn with_cache<R>(
        &self,
        ns: &str,
        key: &[u8],
        read: impl FnOnce(&[u8]) -> R,
    ) -> Result<Option<R>, Error> {
        let mut k = cache_prefix(ns);
        k.extend_from_slice(key);
        match &self.cache_dir {
            Some(cache) => cache.get_with(&k, read),
            None => Ok(self.cache_map().get(&k).map(read)),
        }
    }

    pub fn remove_cache(&self, ns: &str, key: &[u8]) -> Result<(), Error> {
        let mut k = cache_prefix(ns);
        k.extend_from_slice(key);
        match &self.cache_dir {
            Some(cache) => cache.remove(&k)?,
            None => self.cache_map().remove(&k),
        }
        Ok(())
    }

    /// Drops every cache entry.
    pub(super) fn clear_cache(&self) -> Result<(), Error> {
        match &self.cache_dir {
            Some(cache) => cache.clear(),
            None => {
                *self.cache_map() = Default::default();
                Ok(())
            }
        }
    }

    /// How many cache entries have keys starting with `prefix`, without reading their
    /// values.
    pub fn count_cache_prefix(&self, ns: &str, prefix: &[u8]) -> Result<u64, Error> {
        let mut p = cache_prefix(ns);
        p.extend_from_slice(prefix);
        match &self.cache_dir {
            Some(cache) => cache.count(&p),
            None => Ok(self.cache_map().with_prefix(&p).len() as u64),
        }
    }

    /// Cache entries whose keys start with `prefix` (keys without the namespace).
    pub fn scan_cache_prefix(&self, ns: &str, prefix: &[u8]) -> IndexScan<'_> {
        let mut p = cache_prefix(ns);
        let strip = p.len();
        p.extend_from_slice(prefix);
        IndexScan {
            iter: match &self.cache_dir {
                Some(cache) => match cache.scan(&p) {
                    Ok(scan) => ScanSource::Cache(Box::new(scan)),
                    Err(e) => ScanSource::Failed(Some(e)),
                },
                None => {
                    let found: Vec<KeyValue> = self.cache_map().with_prefix(&p);
                    ScanSource::Copied(found.into_iter())
                }
            },
            strip,
            // The cache is dropped by a rebuild, not rebuilt: nothing to wait for.
            resume: None,
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
        self.sled("test")
            .unwrap()
            .tree
            .get(META_MOVING)
            .unwrap()
            .is_some()
    }

    /// The applied seq as sled alone holds it (without the memtable).
    #[cfg(test)]
    pub(crate) fn sled_applied_seq_for_tests(&self) -> Option<u64> {
        let v = self.sled.as_ref()?.tree.get(META_APPLIED).ok()??;
        be_u64(&v)
    }

    /// Flush sled's buffers (a courtesy on close: correctness never depends on it).
    pub(crate) fn flush(&self) -> Result<(), Error> {
        self.flush_mem()?;
        if let Some(sled) = &self.sled {
            flush_sled(&sled.db).map_err(sled_err)?;
        }
        if let Some(redo) = &self.redo {
            redo.lock().unwrap_or_else(|e| e.into_inner()).clear()?;
        }
        Ok(())
    }

    /// Every engine and indexer entry (not the cache), for comparing two indexes.
    /// Not the marker of a move into sled in progress either: it is the move's
    /// bookkeeping, not an entry, and a dump taken during a background move would
    /// otherwise differ from the same index's dump after it. Nor the synced mark: it
    /// records what was fsynced, not what the log holds, so a rebuild (which syncs
    /// nothing) has none. Nor the base checkpoint's name: it says where entries are
    /// kept, not what they are.
    pub fn dump(&self) -> Result<Vec<KeyValue>, Error> {
        self.entries().collect()
    }

    /// The entries of [`Index::dump`] one at a time, in key order, without holding
    /// them (what `verify` and `spool replay` compare two indexes with).
    pub fn entries(&self) -> impl Iterator<Item = Result<KeyValue, Error>> + '_ {
        self.merged(&[])
            .filter(|kv| {
                !matches!(kv, Ok((k, _)) if k.as_slice() == META_MOVING
                    || k.as_slice() == META_SYNCED
                    || k.as_slice() == META_BASE)
            })
            .map(|kv| kv.map_err(Error::Index))
    }
}
