//! Reads of an open store: a stream's commits, a record at a position, spans of raw
//! log bytes, the scan of the log in seq order ([`LogScan`]) and commit-id lookups.

use super::*;
use std::ops::ControlFlow;

/// Positions [`Store::visit_stream`] reads from the index at a time.
const VISIT_POSITIONS_MAX: usize = 1024;

/// The index placed `stream`'s `version` at `pos`, where the log holds another commit.
fn misplaced(
    stream: &str,
    version: u64,
    pos: LogPosition,
    found: &str,
    found_version: u64,
) -> Error {
    Error::Index(IndexError::Mismatch(format!(
        "index says {stream:?} v{version} is at {pos}, the log has {found:?} v{found_version} there"
    )))
}

impl Store {
    /// The head version of `stream`; `None` when it does not exist.
    pub fn stream_version(&self, stream: &str) -> Result<Option<u64>, Error> {
        let head = self.settled(|| self.inner.index.stream_head(stream))?;
        Ok(head.map(|h| h.version))
    }

    /// Commits of `stream` with versions `>= from_version`, ascending, at most `limit`.
    pub fn read_stream(
        &self,
        stream: &str,
        from_version: u64,
        limit: usize,
    ) -> Result<Vec<RecordedCommit>, Error> {
        self.settled(|| self.read_stream_once(stream, from_version, limit))
    }

    /// `read` (of the index and the segments) made when no GC was swapping segments
    /// or rebuilding the index, and made again if one did while it ran: what it read
    /// then is stale (an error, or a part of the answer).
    fn settled<T>(&self, read: impl Fn() -> Result<T, Error>) -> Result<T, Error> {
        self.inner.index.gate().read(read).map_err(|e| match e {
            // A GC that did not finish its rebuild poisoned the store: say why.
            Error::Index(IndexError::Incomplete) => self.inner.poisoned_error(),
            e => e,
        })
    }

    /// The GC epoch once no GC is swapping segments or rebuilding the index (while
    /// one is, the index answers from a part of the log). A read that finds the epoch
    /// moved since the value returned here read during a GC, and reads again.
    fn settled_gc_epoch(&self) -> Result<u64, Error> {
        // A GC that did not finish its rebuild left part of the index.
        self.inner
            .index
            .gate()
            .settled()
            .map_err(|_| self.inner.poisoned_error())
    }

    pub(super) fn read_stream_once(
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
                return Err(misplaced(
                    stream,
                    version,
                    pos,
                    &rec.info.stream,
                    rec.info.version,
                ));
            }
            out.push(rec);
        }
        Ok(out)
    }

    /// [`Store::read_stream`] without copying a commit out: each commit of `stream`
    /// with a version `>= from_version`, ascending, at most `limit` of them, decoded in
    /// place and handed to `f` (as [`Store::visit_at`] does) until `f` breaks. What it
    /// holds is a batch of positions, whatever the commits' sizes. A GC that moves
    /// records meanwhile is followed: the visit goes on from the first version `f` has
    /// not seen, so `f` sees each version once.
    pub fn visit_stream(
        &self,
        stream: &str,
        from_version: u64,
        limit: usize,
        mut f: impl FnMut(CommitRef<'_>) -> ControlFlow<()>,
    ) -> Result<(), Error> {
        let mut next = from_version.max(1);
        let mut left = limit;
        'batches: while left > 0 {
            let epoch = self.settled_gc_epoch()?;
            let batch = left.min(VISIT_POSITIONS_MAX);
            let positions = self.inner.index.stream_positions(stream, next, batch);
            if self.inner.index.gate().moved_since(epoch) {
                // Read while a GC rebuilt the index: empty, partial or stale.
                continue 'batches;
            }
            let positions = positions?;
            if positions.is_empty() {
                return Ok(());
            }
            for (version, pos) in positions {
                let visited = self.visit_at(pos, |c| {
                    if c.stream != stream || c.version != version {
                        return Err(misplaced(stream, version, pos, c.stream, c.version));
                    }
                    Ok(f(c))
                });
                match visited.and_then(|r| r) {
                    Ok(ControlFlow::Continue(())) => {
                        next = version.saturating_add(1);
                        left -= 1;
                    }
                    Ok(ControlFlow::Break(())) => return Ok(()),
                    // Positions read before a GC swapped segments are stale: read
                    // them again from the rebuilt index.
                    Err(_) if self.inner.index.gate().moved_since(epoch) => continue 'batches,
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }

    /// The segment holding `pos` (`NotFound` when no segment has its id).
    pub(super) fn segment_at(&self, pos: LogPosition) -> Result<Arc<Segment>, Error> {
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
        let segs = segment::in_log_order(
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
        self.settled(|| self.inner.index.streams())
    }

    /// The commit with client commit id `id`, if one landed (on any stream).
    /// Ids the in-memory filter has never seen answer `None` at once; otherwise
    /// the version index is searched (a full pass over it: meant for importers
    /// and tools, not for the write path).
    pub fn commit_by_id(&self, id: Uuid) -> Result<Option<CommitInfo>, Error> {
        let inner = &*self.inner;
        {
            let mut w = lock(&inner.w);
            if let Some(info) = w.pending_ids.get(&id) {
                return Ok(Some(info.clone()));
            }
            self.complete_ids(&mut w)?;
            if !w.ids.may_contain(id) {
                return Ok(None);
            }
        }
        self.settled(|| match inner.index.find_anywhere(id)? {
            Some((_, _, pos)) => Ok(Some(self.read_at(pos)?.info)),
            None => Ok(None),
        })
    }

    /// Make the commit-id filter hold every commit id of the log, once: after an open
    /// that read only the log's tail it holds the tail's and later ones. The index's
    /// version blocks have every applied commit's id; the commits not applied yet
    /// were sequenced since the open and put into the filter then. Under the writer
    /// lock, so no GC rebuilds the index meanwhile.
    pub(super) fn complete_ids(&self, w: &mut Writer) -> Result<(), Error> {
        if w.ids_complete {
            return Ok(());
        }
        let ids = &mut w.ids;
        self.inner.index.for_each_commit_id(|id| ids.insert(id))?;
        w.ids_complete = true;
        Ok(())
    }

    /// The last acknowledged sequence number (0 for an empty store).
    pub fn last_seq(&self) -> u64 {
        self.inner.last_seq.load(Ordering::Acquire)
    }
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
