//! The write side: indexers run over new commits (`prepare`), their writes published
//! into the memtable with the applied sequence number (`publish`), and the memtable
//! frozen and handed to the mover when it reaches its bound.

use super::*;

impl Index {
    /// Apply `commits` (consecutive, in seq order) to the memtable, together with the
    /// new applied seq; a full memtable moves into sled whole (see [`crate::index::redo`]).
    pub(crate) fn apply(&self, commits: &[RecordedCommit]) -> Result<(), IndexError> {
        let writes = self.prepare(commits)?;
        self.publish(commits, writes, false)
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
        synced: bool,
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
            if synced {
                set_synced(mem, last.info.seq);
            }
            {
                let mut at = self.applied_at.lock().unwrap_or_else(|e| e.into_inner());
                let ts = commits.iter().map(|c| c.info.timestamp_ms).max();
                let last_ts = at.map_or(i64::MIN, |a| a.last_ts).max(ts.unwrap_or(0));
                *at = Some(AppliedAt {
                    seq: last.info.seq,
                    commit_id: last.info.commit_id,
                    position: last.info.position,
                    last_ts,
                });
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
        // Over a checkpoint file alone the memtable holds every commit after it: there
        // is no sled to move into (see `Index::set_base`).
        let movable = self.sled.is_some();
        if movable && (past_max_bound || (past_move_bound && !self.move_running())) {
            // Wait for the previous move (back-pressure: it runs on only past the
            // `_MAX` bounds) and report its failure.
            self.join_moving()?;
            let writes = self.freeze();
            let view = self.sled_view()?;
            let frozen = self.frozen.clone();
            let flushed_at = self.sled_flushed_at.clone();
            let redo = self.redo.clone();
            let after = self.after_move.get().cloned();
            let at = *self.applied_at.lock().unwrap_or_else(|e| e.into_inner());
            #[cfg(test)]
            let gate = self.move_gate.clone();
            let spawned = std::thread::Builder::new()
                .name("spool-index".into())
                .spawn(move || {
                    #[cfg(test)]
                    gate.pass();
                    move_into_sled(&view, &frozen, &flushed_at, redo.as_deref(), &writes)?;
                    if let (Some(after), Some(at)) = (after, at) {
                        after(&view, &at);
                    }
                    Ok(())
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
                            &self.sled_view()?,
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
        let view = self.sled_view().unwrap();
        write_move(&view, self.redo.as_deref(), &frozen, Some(writes)).unwrap();
        flush_sled(&view.tree).unwrap();
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
    pub(super) fn freeze(&self) -> Arc<MemTable> {
        let mut mem = self.mem.write().unwrap_or_else(|e| e.into_inner());
        let mut frozen = self.frozen.write().unwrap_or_else(|e| e.into_inner());
        let keys = mem.writes.len();
        if self.spill.get().is_none() {
            // A bulk load's moves go to runs: sled's snapshot does not grow stale.
            self.moved_bytes
                .fetch_add(mem.bytes as u64, Ordering::Relaxed);
        }
        let writes = Arc::new(std::mem::take(&mut mem.writes));
        *mem = Mem {
            writes: MemTable::with_capacity(keys),
            ..Mem::default()
        };
        *frozen = Some(writes.clone());
        writes
    }

    /// Whether the background move into sled is still running.
    pub(super) fn move_running(&self) -> bool {
        self.moving
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|h| !h.is_finished())
    }

    /// Wait for the background move into sled, if one runs; its result.
    pub(super) fn join_moving(&self) -> Result<(), IndexError> {
        let h = self.moving.lock().unwrap_or_else(|e| e.into_inner()).take();
        match h {
            Some(h) => h
                .join()
                .unwrap_or_else(|_| Err(IndexError::Mismatch("index thread panicked".into()))),
            None => Ok(()),
        }
    }

    /// Move every pending write into sled now, or into a run during a bulk load
    /// (on open and close). Only the single
    /// applier (the group leader, or open/close) calls this and `apply`, so they never
    /// run concurrently.
    pub(crate) fn flush_mem(&self) -> Result<(), IndexError> {
        if self.sled.is_none() {
            return Ok(());
        }
        self.join_moving()?;
        let pending = !self
            .mem
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .writes
            .is_empty();
        if pending {
            let writes = self.freeze();
            move_into_sled(
                &self.sled_view()?,
                &self.frozen,
                &self.sled_flushed_at,
                self.redo.as_deref(),
                &writes,
            )?;
        }
        // A bulk load's merges end here too: afterwards nothing writes runs.
        match self.spill.get() {
            Some(runs) => runs.settle(),
            None => Ok(()),
        }
    }
}

/// Raises the synced mark in the memtable to `seq` (never lowers it: two flushes may
/// finish out of order).
fn set_synced(mem: &mut Mem, seq: u64) {
    let v = seq.to_be_bytes();
    match mem.writes.get_mut(META_SYNCED) {
        Some(Some(old)) if old.len() == v.len() => {
            if be_u64(old).is_none_or(|o| o < seq) {
                old.copy_from_slice(&v);
            }
        }
        _ => {
            mem.writes.insert(META_SYNCED, Some(v.to_vec()));
        }
    }
}

impl Index {
    /// Records that every commit up to `seq` is on disk: called only after the
    /// fdatasync that covered them (a `Buffered` store's flush). Goes to sled with
    /// the memtable's next move.
    pub(crate) fn mark_synced(&self, seq: u64) {
        if seq == 0 {
            return;
        }
        let mut guard = self.mem.write().unwrap_or_else(|e| e.into_inner());
        set_synced(&mut guard, seq);
    }
}

impl Index {
    /// Put the checkpoint `base` under this (new, temporary, empty) index in place of
    /// sled: reads then go memtable, checkpoint; commits after the checkpoint are
    /// applied to the memtable, which is never moved (sled would lose its removals'
    /// effect on the checkpoint's keys). `false` if the index already has one.
    pub(crate) fn set_base(&self, base: Arc<CheckpointFile>) -> bool {
        debug_assert!(self.sled.is_none(), "with sled, see `attach_base`");
        {
            let mut b = self.base.write().unwrap_or_else(|e| e.into_inner());
            if b.is_some() {
                return false;
            }
            *b = Some(base);
        }
        // The key filter knows nothing of the checkpoint's keys: unused from now on.
        self.keys
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .complete = false;
        true
    }

    /// Set the hook run after each background move into sled (see `after_move`).
    pub(crate) fn set_after_move(&self, f: AfterMove) {
        let _ = self.after_move.set(f);
    }

    /// The last commit published (see [`AppliedAt`]), if known.
    pub(crate) fn applied_at(&self) -> Option<AppliedAt> {
        *self.applied_at.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Record where the last applied commit is (the open's scan found it).
    pub(crate) fn set_applied_at(&self, at: AppliedAt) {
        *self.applied_at.lock().unwrap_or_else(|e| e.into_inner()) = Some(at);
    }

    /// From now on, until it is dropped, this owner's index moves full memtables into
    /// runs instead of sled (a bulk load: see `spill.rs`); what sled holds already
    /// stays under the runs. A second call does nothing.
    pub(crate) fn start_spill(&self) -> Result<(), Error> {
        let (Some(dir), Some(_)) = (&self.path, &self.sled) else {
            return Err(Error::Index(IndexError::NoSled("spill a bulk load")));
        };
        if self.spill.get().is_none() {
            let _ = self.spill.set(Arc::new(spill::Runs::create(dir)?));
        }
        Ok(())
    }

    /// sled over its base (for a checkpoint of it once the memtable is empty).
    pub(crate) fn sled_view(&self) -> Result<SledView, IndexError> {
        Ok(SledView {
            tree: self.sled("read sled")?.tree.clone(),
            base: self.base(),
            runs: self.spill.get().cloned(),
            base_failed: self.base_failed.clone(),
        })
    }
}
