//! Reading through the layers: a key looked up in the memtable, the frozen memtable
//! being moved and sled, in that order; and prefix and range scans merged over the
//! same layers ([`IndexScan`]).

use super::*;

impl Index {
    /// A key's value in the frozen memtable or sled (the caller holds the memtable).
    pub(super) fn read_below_mem(&self, k: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
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
        Ok(self.bottom_get(k)?.map(|v| v.to_vec()))
    }

    /// A key's value in the bottom layer: sled over its base checkpoint (see
    /// `delta.rs`), or the checkpoint file alone for an index without sled (see
    /// [`Index::set_base`]).
    pub(super) fn bottom_get(&self, k: &[u8]) -> Result<Option<sled::IVec>, IndexError> {
        let guard = self.base.read().unwrap_or_else(|e| e.into_inner());
        match (&self.sled, guard.as_deref()) {
            (Some(sled), base) => {
                let runs = self.spill.get().map(|r| &**r);
                let got = super::delta::get(&sled.tree, base, runs, k, &self.base_failed);
                if got.is_err() {
                    drop(guard);
                    self.set_base_aside_if_failed();
                }
                got
            }
            (None, Some(base)) => base.get(k),
            (None, None) => Ok(None),
        }
    }

    /// A key's value: the memtable, the frozen memtable, then sled — unless the key
    /// filter rules an indexer key out. It may: `apply` adds a key to the filter
    /// (under the memtable's write lock) before the key enters the memtable, and keys
    /// reach the frozen memtable and sled only from there, so a key the complete filter
    /// does not contain is in no layer. It is asked after the memtable, a hash lookup
    /// where most of an append's reads hit (its filter lookup, a likely cache miss in
    /// a large filter, was a visible part of a buffered append), and spares a miss (a fresh
    /// entry id, a first child) the frozen memtable's lookup and sled's.
    pub(super) fn read_key(&self, k: &[u8]) -> Result<Option<Vec<u8>>, IndexError> {
        self.read_key_with(k, |v| v.map(<[u8]>::to_vec))
    }

    /// [`Index::read_key`] handing the value to `f` in place (under the
    /// memtable's read lock when the value is there).
    pub(super) fn read_key_with<T>(
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
        let v = self.bottom_get(k)?;
        Ok(f(v.as_deref()))
    }

    /// Entries with keys starting with `prefix`, memtables
    /// merged over sled, in key order.
    pub(super) fn merged(&self, prefix: &[u8]) -> MergeIter {
        self.merged_from(prefix, prefix)
    }

    /// Like [`Index::merged`], starting at key `from` (which starts with `prefix`).
    pub(super) fn merged_from(&self, prefix: &[u8], from: &[u8]) -> MergeIter {
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
        let bottom = match (&self.sled, self.base()) {
            (Some(sled), base) => Bottom::Sled(Box::new(
                DeltaIter::new(
                    &sled.tree,
                    base.as_ref(),
                    self.spill.get().map(|r| &**r),
                    lo,
                    hi,
                )
                .noting_base_failures(self.base_failed.clone()),
            )),
            (None, Some(base)) => Bottom::Checkpoint(base.range(lo, hi)),
            (None, None) => Bottom::Empty,
        };
        MergeIter {
            mem: mem.into_iter().peekable(),
            sled: bottom,
            sled_peek: None,
            sled_done: false,
            prefix: prefix.to_vec(),
            done: false,
        }
    }
}

/// Iterator over index entries: `(key without namespace, value)`.
pub struct IndexScan<'a> {
    pub(super) iter: ScanSource,
    pub(super) strip: usize,
    /// How a scan of the merged layers starts again after a rebuild (see `gate.rs`).
    pub(super) resume: Option<Resume<'a>>,
}

pub(super) enum ScanSource {
    Merged(Box<MergeIter>),
    /// Cache entries from sled and from their files, one at a time.
    Cache(Box<super::cache_files::CacheScan>),
    /// Entries copied out of an in-memory map (the cache of an index without sled).
    Copied(std::vec::IntoIter<KeyValue>),
    /// A scan that could not start: its error, then the end.
    Failed(Option<Error>),
}

/// A merged scan's place: the iterator was made at `epoch`; an entry is returned only
/// if no rebuild began before it was read. Otherwise the scan waits for the rebuild
/// and goes on from the entry after `last` in the rebuilt index.
pub(super) struct Resume<'a> {
    index: &'a Index,
    prefix: Vec<u8>,
    epoch: u64,
    /// The full key of the last entry returned (empty before the first: no full key
    /// is empty, it starts with the namespace).
    last: Vec<u8>,
}

impl<'a> Resume<'a> {
    pub(super) fn new(index: &'a Index, prefix: Vec<u8>, epoch: u64) -> Resume<'a> {
        Resume {
            index,
            prefix,
            epoch,
            last: Vec::new(),
        }
    }

    /// Whether what the iterator yields now may be from a rebuild (or from what one
    /// that did not finish left: the reseek then fails).
    fn stale(&self) -> bool {
        let gate = self.index.gate();
        !self.epoch.is_multiple_of(2) || gate.moved_since(self.epoch) || gate.is_incomplete()
    }

    /// A new iterator from the entry after the last one returned, once no rebuild runs.
    fn reseek(&mut self) -> Result<MergeIter, Error> {
        self.epoch = self.index.gate().settled()?;
        let from = match self.last.is_empty() {
            true => self.prefix.clone(),
            false => [&self.last[..], &[0]].concat(),
        };
        Ok(self.index.merged_from(&self.prefix, &from))
    }
}

impl Iterator for IndexScan<'_> {
    type Item = Result<KeyValue, Error>;
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(r) = self.resume.as_mut().filter(|r| r.stale()) {
                match r.reseek() {
                    Ok(m) => self.iter = ScanSource::Merged(Box::new(m)),
                    Err(e) => {
                        // A scan that cannot go on ends with the error, as one whose
                        // step fails does.
                        self.resume = None;
                        self.iter = ScanSource::Copied(Vec::new().into_iter());
                        return Some(Err(e));
                    }
                }
            }
            let got = self.step();
            match &mut self.resume {
                // Read while a rebuild ran (or after one began): read again.
                Some(r) if r.stale() => continue,
                Some(r) => {
                    if let Some(Ok((k, _))) = &got {
                        // One buffer for the whole scan: no allocation per entry.
                        r.last.clear();
                        r.last
                            .extend_from_slice(&r.prefix[..self.strip.min(r.prefix.len())]);
                        r.last.extend_from_slice(k);
                    }
                    return got;
                }
                None => return got,
            }
        }
    }
}

impl IndexScan<'_> {
    fn step(&mut self) -> Option<Result<KeyValue, Error>> {
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
            ScanSource::Cache(i) => match i.next()? {
                Ok((k, v)) => Ok((own_key(&k), v)),
                Err(e) => Err(e),
            },
            ScanSource::Failed(e) => Err(e.take()?),
            ScanSource::Copied(i) => {
                let (k, v) = i.next()?;
                Ok((own_key(&k), v))
            }
        })
    }
}

/// An entry of a merged scan: from a memtable, or borrowed from sled without a copy.
pub(super) enum Kv {
    Mem(Vec<u8>, Vec<u8>),
    Sled(sled::IVec, sled::IVec),
}

impl Kv {
    pub(super) fn key(&self) -> &[u8] {
        match self {
            Kv::Mem(k, _) => k,
            Kv::Sled(k, _) => k,
        }
    }

    pub(super) fn value(&self) -> &[u8] {
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

/// The layer under the memtables: sled over its base, or a checkpoint file alone.
pub(super) enum Bottom {
    Sled(Box<DeltaIter>),
    Checkpoint(crate::checkpoint::CheckpointIter),
    /// No sled and no checkpoint (not built by any open; kept total).
    Empty,
}

impl Iterator for Bottom {
    type Item = Result<(sled::IVec, sled::IVec), IndexError>;
    fn next(&mut self) -> Option<Self::Item> {
        match self {
            Bottom::Sled(i) => i.next(),
            Bottom::Checkpoint(i) => i.next(),
            Bottom::Empty => None,
        }
    }
}

/// The memtables' entries merged over sled's, in key order; the memtable wins on equal
/// keys and its `None` hides sled's entry.
pub(super) struct MergeIter {
    pub(super) mem: std::iter::Peekable<std::vec::IntoIter<PendingWrite>>,
    pub(super) sled: Bottom,
    sled_peek: Option<(sled::IVec, sled::IVec)>,
    /// sled has no more entries in range.
    sled_done: bool,
    prefix: Vec<u8>,
    done: bool,
}

impl MergeIter {
    pub(super) fn next_kv(&mut self) -> Option<Result<Kv, IndexError>> {
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
                        return Some(Err(e));
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
pub(super) fn prefix_end(prefix: &[u8]) -> Option<Vec<u8>> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < u8::MAX {
            end.push(last + 1);
            return Some(end);
        }
    }
    None
}
