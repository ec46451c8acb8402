//! The append path: validation of a new commit, retries recognized by commit id, and
//! group commit (one leader writes and syncs the frames of every waiting writer, then
//! publishes them to the index), including the switch to a new segment.

use super::*;

/// Validate a commit; its encoded payload length.
pub(super) fn validate(c: &NewCommit, max: u32) -> Result<u32, Error> {
    if c.stream.is_empty() || c.stream.len() > format::STREAM_ID_BYTES_MAX {
        return Err(Error::InvalidInput(format!(
            "stream id must be 1..={} bytes, got {}",
            format::STREAM_ID_BYTES_MAX,
            c.stream.len()
        )));
    }
    if c.events.is_empty() || c.events.len() > format::EVENTS_PER_COMMIT_MAX {
        return Err(Error::InvalidInput(format!(
            "a commit carries 1..={} events, got {}",
            format::EVENTS_PER_COMMIT_MAX,
            c.events.len()
        )));
    }
    for e in &c.events {
        if e.kind.len() > format::EVENT_KIND_BYTES_MAX {
            return Err(Error::InvalidInput(format!(
                "event kind must be at most {} bytes, got {}",
                format::EVENT_KIND_BYTES_MAX,
                e.kind.len()
            )));
        }
    }
    let len = format::commit_payload_len(&c.stream, &c.events).unwrap_or(u64::MAX);
    if len > u64::from(max) {
        return Err(Error::RecordTooLarge {
            bytes: len,
            max: u64::from(max),
        });
    }
    Ok(len as u32)
}

/// The most commits one [`Store::append_batch`] takes.
pub const APPEND_BATCH_COMMITS_MAX: usize = 1024;

/// Why a commit is not written (see `Store::refusal`).
enum Refused {
    /// A retry of a commit still being written: acknowledged with it.
    Pending(CommitInfo),
    /// A retry of a commit in the log, or a conflict.
    Decided(AppendOutcome),
}

impl Store {
    /// Append one commit. Returns when it is acknowledged per the store's durability.
    /// A commit whose id an earlier commit has is a retry: it writes nothing and
    /// returns [`AppendOutcome::AlreadyCommitted`] with the earlier commit.
    pub fn append(&self, commit: NewCommit) -> Result<AppendOutcome, Error> {
        self.append_commit(commit, false, None)
    }

    /// Checks `commit` as an append would before writing (stream id, event
    /// count and kinds, record size against this store's limit) without
    /// writing anything: an import checks every commit before its first write.
    pub fn check_commit(&self, commit: &NewCommit) -> Result<(), Error> {
        validate(commit, self.inner.opts.record_bytes_max).map(|_| ())
    }

    /// [`Store::append`] with the commit time given by the caller instead of
    /// read from the clock: for imports that rebuild a history with its
    /// original times. Such a time may lie before earlier commits' times (the
    /// log does not order commits by time); commits appended later without a
    /// given time still get times no earlier than any time seen.
    pub fn append_at(&self, commit: NewCommit, timestamp_ms: i64) -> Result<AppendOutcome, Error> {
        self.append_commit(commit, false, Some(timestamp_ms))
    }

    /// [`Store::append`] under a commit id drawn here: 122 random bits from the
    /// operating system (drawn 256 ids at a time per thread, afresh after a
    /// `fork`), which no earlier commit has. So it cannot be a retry, and the
    /// lookup that recognizes retries (a probe of the commit-id filter, a likely
    /// cache miss, a visible part of a buffered append) is skipped. The id is in the
    /// outcome's [`CommitInfo`]; a later [`Store::append`] with it is a retry.
    pub fn append_fresh(
        &self,
        stream: impl Into<String>,
        expected: ExpectedVersion,
        events: Vec<EventData>,
    ) -> Result<AppendOutcome, Error> {
        let commit = NewCommit {
            stream: stream.into(),
            expected,
            commit_id: crate::commit_id::fresh(),
            events,
        };
        self.append_commit(commit, true, None)
    }

    /// Append several commits, in order, in one write group (one write per
    /// segment, with [`Durability::Immediate`] one fdatasync), all or none: when
    /// one of them would not commit after the ones before it (a retry, or a
    /// conflict), nothing is written and [`BatchOutcome::Refused`] names it; when
    /// judging one fails (a retry on another stream, a read of the index),
    /// nothing is written and [`Error::InBatch`] names it. Each
    /// pair is a commit and, as for [`Store::append_at`], its time when the caller
    /// chooses it. Every commit is checked first: an invalid one, a commit id twice
    /// in the batch, or more than [`APPEND_BATCH_COMMITS_MAX`] commits fail the call
    /// with nothing written. The batch is held in memory whole until it is
    /// acknowledged.
    pub fn append_batch(
        &self,
        commits: Vec<(NewCommit, Option<i64>)>,
    ) -> Result<BatchOutcome, Error> {
        let inner = &*self.inner;
        if inner.read_only {
            return Err(Error::ReadOnly);
        }
        if commits.len() > APPEND_BATCH_COMMITS_MAX {
            return Err(Error::InvalidInput(format!(
                "a batch holds at most {APPEND_BATCH_COMMITS_MAX} commits, got {}",
                commits.len()
            )));
        }
        let lens = commits
            .iter()
            .map(|(c, _)| validate(c, inner.opts.record_bytes_max))
            .collect::<Result<Vec<u32>, Error>>()?;
        let mut ids = foldhash::HashSet::default();
        if let Some((c, _)) = commits.iter().find(|(c, _)| !ids.insert(c.commit_id)) {
            return Err(Error::InvalidInput(format!(
                "commit id {} appears twice in the batch",
                c.commit_id
            )));
        }
        let mut w = lock(&inner.w);
        if inner.poisoned.load(Ordering::Acquire) {
            return Err(inner.poisoned_error());
        }
        {
            // Each stream's head after the batch's commits judged so far.
            let mut heads: foldhash::HashMap<&str, u64> = Default::default();
            for (index, (c, _)) in commits.iter().enumerate() {
                let head = match heads.get(c.stream.as_str()) {
                    Some(&h) => Some(h),
                    None => w.heads.get(&c.stream).copied(),
                };
                let refused = self.refusal(&mut w, c, head, false);
                let refused = refused.map_err(|e| Error::InBatch {
                    index,
                    source: Box::new(e),
                })?;
                match refused {
                    None => {
                        heads.insert(c.stream.as_str(), head.unwrap_or(0) + 1);
                    }
                    Some(Refused::Pending(info)) => {
                        self.wait_done(w, info.seq)?;
                        let outcome = AppendOutcome::AlreadyCommitted(info);
                        return Ok(BatchOutcome::Refused { index, outcome });
                    }
                    Some(Refused::Decided(outcome)) => {
                        return Ok(BatchOutcome::Refused { index, outcome })
                    }
                }
            }
        }
        // Every commit passed under this hold of the lock: each now takes its seq.
        let mut infos = Vec::with_capacity(commits.len());
        for ((commit, ts), len) in commits.into_iter().zip(lens) {
            infos.push(self.place(&mut w, commit, len, ts));
        }
        if let Some(seq) = infos.last().map(|i| i.seq) {
            self.wait_done(w, seq)?;
        }
        Ok(BatchOutcome::Committed(infos))
    }

    /// `drawn_here`: the commit id was drawn by [`Store::append_fresh`].
    /// `given_ts`: the commit time, when the caller chose it.
    pub(super) fn append_commit(
        &self,
        commit: NewCommit,
        drawn_here: bool,
        given_ts: Option<i64>,
    ) -> Result<AppendOutcome, Error> {
        let inner = &*self.inner;
        if inner.read_only {
            return Err(Error::ReadOnly);
        }
        let payload_len = validate(&commit, inner.opts.record_bytes_max)?;
        let mut w = lock(&inner.w);
        if inner.poisoned.load(Ordering::Acquire) {
            return Err(inner.poisoned_error());
        }
        let head = w.heads.get(&commit.stream).copied();
        match self.refusal(&mut w, &commit, head, drawn_here)? {
            None => {}
            Some(Refused::Pending(info)) => {
                self.wait_done(w, info.seq)?;
                return Ok(AppendOutcome::AlreadyCommitted(info));
            }
            Some(Refused::Decided(o)) => return Ok(o),
        }
        let info = self.place(&mut w, commit, payload_len, given_ts);
        self.wait_done(w, info.seq)?;
        Ok(AppendOutcome::Committed(info))
    }

    /// Why a validated commit is not to be written, under the writer lock: a
    /// retry (of a commit still being written, or of one in the log), or a
    /// conflict with `head`, the head its stream has when it is sequenced. Changes
    /// nothing but the commit-id filter's completion.
    fn refusal(
        &self,
        w: &mut Writer,
        commit: &NewCommit,
        head: Option<u64>,
        drawn_here: bool,
    ) -> Result<Option<Refused>, Error> {
        let inner = &*self.inner;
        if !drawn_here {
            if let Some(info) = w.pending_ids.get(&commit.commit_id).cloned() {
                check_retry_stream(&info, commit)?;
                return Ok(Some(Refused::Pending(info)));
            }
            self.complete_ids(w)?;
        }
        if !drawn_here && w.ids.may_contain(commit.commit_id) {
            // The filter knows the id (or it is a rare false positive): look for it
            // in the named stream's version blocks, newest first; failing that, in every
            // stream's (a retry on another stream is refused).
            let logged = w.heads.get(&commit.stream).copied().unwrap_or(0);
            if let Some((_, pos)) =
                inner
                    .index
                    .find_in_stream(&commit.stream, logged, commit.commit_id)?
            {
                let rec = self.read_at(pos)?;
                return Ok(Some(Refused::Decided(AppendOutcome::AlreadyCommitted(
                    rec.info,
                ))));
            }
            if let Some((stream, _, _)) = inner.index.find_anywhere(commit.commit_id)? {
                return Err(Error::InvalidInput(format!(
                    "commit id {} already landed on stream {stream:?}, retried on {:?}",
                    commit.commit_id, commit.stream
                )));
            }
        }
        if !commit.expected.matches(head) {
            return Ok(Some(Refused::Decided(AppendOutcome::Conflict {
                expected: commit.expected,
                actual: head,
            })));
        }
        Ok(None)
    }

    /// Sequence a commit [`Store::refusal`] let through: the next seq, the next
    /// version of its stream, its frame encoded into the pending group.
    fn place(
        &self,
        w: &mut Writer,
        commit: NewCommit,
        payload_len: u32,
        given_ts: Option<i64>,
    ) -> CommitInfo {
        let inner = &*self.inner;
        let frame_len = FRAME_HEADER_BYTES + u64::from(payload_len);
        let actual = w.heads.get(&commit.stream).copied();
        if w.tail_off + frame_len > w.tail_cap {
            // Roll: the leader that writes this frame creates the next segment, double
            // the current one's capacity up to the maximum. A record larger than that
            // gets a segment sized for it.
            w.tail_seg = w.next_segment_id;
            w.next_segment_id += 1;
            w.tail_off = SEGMENT_HEADER_BYTES;
            w.tail_cap =
                format::next_segment_capacity(Some(w.tail_cap), inner.opts.segment_bytes_max)
                    .max(SEGMENT_HEADER_BYTES + frame_len);
        }
        w.next_seq += 1;
        let seq = w.next_seq;
        let ts = given_ts.unwrap_or_else(|| now_ms().max(w.last_ts));
        w.last_ts = w.last_ts.max(ts);
        let version = actual.unwrap_or(0) + 1;
        let position = LogPosition {
            segment: w.tail_seg,
            offset: w.tail_off,
        };
        let start = w.buf.len();
        let head = CommitHead {
            stream: &commit.stream,
            expected: commit.expected,
            version,
            commit_id: commit.commit_id,
            timestamp_ms: ts,
            seq,
        };
        format::encode_commit_frame(
            &mut w.buf,
            position.segment,
            &head,
            &commit.events,
            payload_len,
        );
        let end = w.buf.len();
        let cap = w.tail_cap;
        match w.chunks.last_mut() {
            Some(c)
                if c.seg == position.segment
                    && c.offset + (c.end - c.start) as u64 == position.offset =>
            {
                c.end = end;
            }
            _ => w.chunks.push(Chunk {
                seg: position.segment,
                offset: position.offset,
                start,
                end,
                capacity: cap,
                first_seq: seq,
            }),
        }
        w.tail_off += frame_len;
        let info = CommitInfo {
            stream: commit.stream,
            version,
            seq,
            position,
            timestamp_ms: ts,
            commit_id: commit.commit_id,
        };
        match w.heads.get_mut(&info.stream) {
            Some(v) => *v = version,
            None => {
                w.heads.insert(info.stream.clone(), version);
            }
        }
        w.pending_ids.insert(info.commit_id, info.clone());
        w.ids.insert(info.commit_id);
        w.batch.push(RecordedCommit {
            info: info.clone(),
            expected: commit.expected,
            events: commit.events,
            record_bytes: frame_len as u32,
        });
        if w.gathering && w.batch.len() >= w.last_group {
            inner.gather_cond.notify_one();
        }
        info
    }

    /// Wait until `seq` is acknowledged, leading a group write when no one else is.
    pub(super) fn wait_done(&self, mut w: MutexGuard<'_, Writer>, seq: u64) -> Result<(), Error> {
        let inner = &*self.inner;
        loop {
            if w.done_seq >= seq {
                return Ok(());
            }
            if inner.poisoned.load(Ordering::Acquire) {
                return Err(inner.poisoned_error());
            }
            if !w.leader {
                // With no leader, every unacknowledged commit is in the pending buffer,
                // `seq` among them: the group written now acknowledges it.
                let led = self.lead(w);
                debug_assert!(
                    led.is_err() || inner.last_seq.load(Ordering::Acquire) >= seq,
                    "a leader's group acknowledges the leader's own commit"
                );
                return led;
            }
            w = wait_writer(inner, w);
        }
    }

    /// Write every sequenced frame as one group: pwrite (per segment), fdatasync with
    /// Immediate, apply to the index, then acknowledge.
    pub(super) fn lead(&self, mut w: MutexGuard<'_, Writer>) -> Result<(), Error> {
        let inner = &*self.inner;
        w.leader = true;
        let sync = inner.opts.durability == Durability::Immediate;
        if sync && w.last_group > 1 && w.batch.len() < w.last_group {
            // Group commit under concurrency: the writers acknowledged by the last group
            // are about to append again. Wait (at most about one fdatasync's time) until
            // as many commits as last time have joined, so that they share this fdatasync
            // instead of each paying for their own.
            let wait = std::time::Duration::from_nanos(
                inner
                    .last_sync_nanos
                    .load(Ordering::Relaxed)
                    .min(MAX_GATHER_NANOS),
            );
            let deadline = std::time::Instant::now() + wait;
            w.gathering = true;
            while w.batch.len() < w.last_group {
                let now = std::time::Instant::now();
                if now >= deadline {
                    break;
                }
                w = inner
                    .gather_cond
                    .wait_timeout(w, deadline - now)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
            w.gathering = false;
        }
        let spare_buf = std::mem::take(&mut w.spare_buf);
        let spare_chunks = std::mem::take(&mut w.spare_chunks);
        let spare_batch = std::mem::take(&mut w.spare_batch);
        let mut buf = std::mem::replace(&mut w.buf, spare_buf);
        let mut chunks = std::mem::replace(&mut w.chunks, spare_chunks);
        let batch = std::mem::replace(&mut w.batch, spare_batch);
        let active = w.active.clone();
        // The id the next new segment gets unless a GC takes it first.
        let next_id = w.next_segment_id;
        let mut preparer = None;
        let poll = inner.opts.index_thread_poll_window();
        let back_to_back = !poll.is_zero() && w.last_group_end.is_some_and(|t| t.elapsed() <= poll);
        let large =
            batch.len() >= PREPARE_THREAD_COMMITS_MIN || buf.len() >= PREPARE_THREAD_BYTES_MIN;
        // The thread polls for the next group only after a small one that came back to
        // back (a lone writer's): after a large one it sleeps (see `crate::prepare`).
        let poll_after = back_to_back && !large;
        if sync && !w.preparer_failed && (large || back_to_back) {
            preparer = w
                .preparer
                .take()
                .or_else(|| Preparer::spawn(Arc::downgrade(&self.inner), poll));
            w.preparer_failed = preparer.is_none();
        }
        drop(w);

        let (res, mut batch) = self.write_and_index(
            active.clone(),
            next_id,
            &buf,
            &chunks,
            batch,
            preparer.as_ref().map(|p| (p, poll_after)),
        );

        let mut w = lock(&inner.w);
        w.leader = false;
        if preparer.is_some() {
            w.preparer = preparer;
        }
        let outcome = match res {
            Ok((new_active, ends)) => {
                for (seg, end, first_seq) in ends {
                    seg.end.store(end, Ordering::Release);
                    let _ = seg.first_seq.compare_exchange(
                        0,
                        first_seq,
                        Ordering::AcqRel,
                        Ordering::Acquire,
                    );
                    if seg.id != new_active.id {
                        seg.mappable.store(true, Ordering::Release);
                    }
                }
                if new_active.id != active.id {
                    active.mappable.store(true, Ordering::Release);
                }
                w.active = new_active;
                if let Some(last) = batch.last() {
                    w.done_seq = last.info.seq;
                    inner.last_seq.store(last.info.seq, Ordering::Release);
                }
                for c in &batch {
                    w.pending_ids.remove(&c.info.commit_id);
                }
                if !sync {
                    w.dirty = true;
                }
                w.last_group = batch.len();
                // Only read when a poll window is set: no clock read per group otherwise.
                if sync && !inner.opts.index_thread_poll_window().is_zero() {
                    w.last_group_end = Some(std::time::Instant::now());
                }
                let c = &inner.counters;
                c.commits.fetch_add(batch.len() as u64, Ordering::Relaxed);
                c.groups.fetch_add(1, Ordering::Relaxed);
                c.bytes.fetch_add(buf.len() as u64, Ordering::Relaxed);
                Ok(())
            }
            Err(e) => {
                // The outcome of the write is unknown (or the index is behind a durable
                // commit): refuse every later write until a reopen recovers.
                inner.poison(&e);
                Err(e)
            }
        };
        buf.clear();
        chunks.clear();
        batch.clear();
        if w.spare_buf.capacity() < buf.capacity() {
            w.spare_buf = buf;
        }
        w.spare_chunks = chunks;
        w.spare_batch = batch;
        // Waking costs a syscall even with no one waiting: skip it then (a lone Buffered
        // writer leads every group itself). The wake happens after the unlock: waking a
        // dozen threads takes tens of microseconds on a virtual machine, and each woken
        // thread's first step is to take this lock.
        let wake = w.waiters > 0;
        drop(w);
        if wake {
            inner.cond.notify_all();
        }
        outcome
    }

    /// Write a group, make it durable (`Immediate`), and publish it: pwrite, then
    /// the fdatasync with the indexers running on the index thread (`preparer`, and
    /// whether it polls for the next group afterwards) meanwhile (both must finish:
    /// the writes are published only once the group is durable), then the segments'
    /// readable ends, then the index. Without the
    /// thread the group is prepared after its fdatasync. Returns the new active
    /// segment and, per chunk, the segment, its new end and the chunk's first seq;
    /// and the group's commits (none if the index thread vanished with them).
    #[allow(clippy::type_complexity)]
    pub(super) fn write_and_index(
        &self,
        active: Arc<Segment>,
        next_id: u64,
        buf: &[u8],
        chunks: &[Chunk],
        mut batch: Vec<RecordedCommit>,
        preparer: Option<(&Preparer, bool)>,
    ) -> (
        Result<(Arc<Segment>, Vec<(Arc<Segment>, u64, u64)>), Error>,
        Vec<RecordedCommit>,
    ) {
        let inner = &*self.inner;
        self.plan_spare(&active, next_id);
        let (seg, ends) = match self.write_group(active, buf, chunks) {
            Ok(r) => r,
            Err(e) => return (Err(e), batch),
        };
        let mut prepared = None;
        if inner.opts.durability == Durability::Immediate {
            let handed = match preparer {
                Some((p, poll_after)) => p.start(batch, poll_after),
                None => Err(batch),
            };
            if handed.is_ok() {
                inner
                    .counters
                    .groups_prepared_ahead
                    .fetch_add(1, Ordering::Relaxed);
            }
            let synced = self.sync_group(&seg);
            match handed {
                Ok(()) => match preparer.and_then(|(p, _)| p.finish()) {
                    Some((back, writes)) => {
                        batch = back;
                        prepared = Some(writes);
                    }
                    None => {
                        let stopped = IndexError::indexer(
                            "(index thread)",
                            "the index thread stopped before answering",
                        );
                        return (Err(Error::Index(stopped)), Vec::new());
                    }
                },
                Err(back) => batch = back,
            }
            if let Err(e) = synced {
                return (Err(e), batch);
            }
        }
        // Publish the readable end of each written segment before the index names
        // the new positions: a reader that finds a position in the index must be
        // able to read the record there.
        for (seg, end, _) in &ends {
            seg.end.fetch_max(*end, Ordering::AcqRel);
        }
        let published = prepared
            .unwrap_or_else(|| inner.index.prepare(&batch))
            // An `Immediate` group is on disk by now: the index may record it as synced.
            .and_then(|writes| {
                let synced = inner.opts.durability == Durability::Immediate;
                inner.index.publish(&batch, writes, synced)
            })
            .map_err(Error::Index);
        (published.map(|()| (seg, ends)), batch)
    }

    /// The pwrites of one group (sealing each segment it fills with an fdatasync).
    /// Returns the new active segment and, per chunk, the segment, its new end and the
    /// chunk's first seq.
    #[allow(clippy::type_complexity)]
    pub(super) fn write_group(
        &self,
        mut seg: Arc<Segment>,
        buf: &[u8],
        chunks: &[Chunk],
    ) -> Result<(Arc<Segment>, Vec<(Arc<Segment>, u64, u64)>), Error> {
        let inner = &*self.inner;
        let mut ends = Vec::with_capacity(chunks.len());
        for ch in chunks {
            if ch.seg != seg.id {
                debug_assert!(ch.seg > seg.id);
                // Seal the current segment: its records must be durable before a later
                // segment exists, or recovery would find a torn segment in mid-log.
                self.sync_segment(&seg)?;
                let spare = lock(&inner.spare).take(ch.capacity)?;
                let new = match spare {
                    Some(s) => {
                        let new = spare::install(&*inner.opts.vfs, &inner.dir, s, ch.seg)?;
                        inner
                            .counters
                            .segments_from_spare
                            .fetch_add(1, Ordering::Relaxed);
                        new
                    }
                    None => create_segment(
                        &*inner.opts.vfs,
                        &inner.dir,
                        &inner.opts,
                        ch.seg,
                        ch.capacity,
                    )?,
                };
                inner
                    .counters
                    .segments_created
                    .fetch_add(1, Ordering::Relaxed);
                inner
                    .segments
                    .write()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(new.id, new.clone());
                seg = new;
            }
            seg.file
                .write_at(&buf[ch.start..ch.end], ch.offset)
                .map_err(|e| Error::io(inner.dir.join(&seg.name), "write_at", e))?;
            ends.push((
                seg.clone(),
                ch.offset + (ch.end - ch.start) as u64,
                ch.first_seq,
            ));
        }
        Ok((seg, ends))
    }

    /// Start building the next segment once `active` is half full (per
    /// [`NextSegment`]), expecting it to get id `next_id`.
    pub(super) fn plan_spare(&self, active: &Segment, next_id: u64) {
        let inner = &*self.inner;
        let mode = inner.opts.next_segment;
        if inner.read_only
            || mode == NextSegment::OnDemand
            || active.end.load(Ordering::Acquire).saturating_mul(2) < active.capacity
        {
            return;
        }
        let capacity =
            format::next_segment_capacity(Some(active.capacity), inner.opts.segment_bytes_max);
        let mut slot = lock(&inner.spare);
        slot.discard_unless(capacity, &*inner.opts.vfs, &inner.dir);
        if !slot.is_empty() {
            return;
        }
        let plan = spare::Plan {
            vfs: inner.opts.vfs.clone(),
            dir: inner.dir.clone(),
            preallocate: inner.opts.preallocate,
            durability: inner.opts.durability,
            id: next_id,
            capacity,
        };
        *slot = match mode {
            NextSegment::Background => match plan.clone().spawn() {
                Some(h) => spare::Slot::Building(h),
                // No thread: build it here (as `Inline`).
                None => spare::Slot::Done(plan.build()),
            },
            _ => spare::Slot::Done(plan.build()),
        };
    }

    /// The fdatasync of a durable group (timed: the next group's gather waits about
    /// this long).
    pub(super) fn sync_group(&self, seg: &Segment) -> Result<(), Error> {
        let t = std::time::Instant::now();
        self.sync_segment(seg)?;
        self.inner
            .last_sync_nanos
            .store(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    pub(super) fn sync_segment(&self, seg: &Segment) -> Result<(), Error> {
        let inner = &*self.inner;
        inner.counters.fsyncs.fetch_add(1, Ordering::Relaxed);
        seg.file
            .sync_data()
            .map_err(|e| Error::io(inner.dir.join(&seg.name), "sync_data", e))
    }

    /// Seal the active segment and start a new one now (for a GC that must compact
    /// the records of the active segment too). Waits until no group is being written
    /// and none is sequenced; then makes the active segment's records durable, creates
    /// the next segment (zero-filled, header, `sync_all`, directory synced) and makes it
    /// the active one. An empty active segment is left as it is. Returns the capacity of
    /// the new segment, if one was started. A failure poisons the store (the next open
    /// recovers).
    pub(crate) fn roll_active(&self) -> Result<Option<u64>, Error> {
        let inner = &*self.inner;
        if inner.read_only {
            return Err(Error::ReadOnly);
        }
        let mut w = lock(&inner.w);
        while w.leader || !w.batch.is_empty() {
            w = super::wait_writer(inner, w);
        }
        if inner.poisoned.load(Ordering::Acquire) {
            return Err(inner.poisoned_error());
        }
        let old = w.active.clone();
        if old.end.load(Ordering::Acquire) <= old.data_start {
            return Ok(None);
        }
        let poison = |e: Error| {
            inner.poison(&e);
            e
        };
        // Sealed records are durable before a later segment exists (as a roll by the
        // writer): recovery never finds a torn segment in mid-log.
        self.sync_segment(&old).map_err(poison)?;
        let id = w.next_segment_id;
        w.next_segment_id += 1;
        // The same capacity: a roll forced early is no reason to grow.
        let cap = old.capacity;
        let new =
            create_segment(&*inner.opts.vfs, &inner.dir, &inner.opts, id, cap).map_err(poison)?;
        inner
            .counters
            .segments_created
            .fetch_add(1, Ordering::Relaxed);
        inner
            .segments
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .insert(new.id, new.clone());
        old.mappable.store(true, Ordering::Release);
        w.active = new;
        w.tail_seg = id;
        w.tail_off = SEGMENT_HEADER_BYTES;
        w.tail_cap = cap;
        w.dirty = false;
        Ok(Some(cap))
    }

    /// Wait until a next segment being built ahead ([`NextSegment::Background`]) is
    /// complete. Nothing needs this for correctness: a caller that times work (a
    /// benchmark between two measurements) uses it so that the build does not overlap
    /// what it measures next. A failed build stays for the writer that would use the
    /// spare, which reports it.
    pub fn wait_for_spare_segment(&self) {
        lock(&self.inner.spare).finish();
    }
}

pub(super) fn check_retry_stream(info: &CommitInfo, c: &NewCommit) -> Result<(), Error> {
    if info.stream != c.stream {
        return Err(Error::InvalidInput(format!(
            "commit id {} already landed on stream {:?}, retried on {:?}",
            c.commit_id, info.stream, c.stream
        )));
    }
    Ok(())
}
