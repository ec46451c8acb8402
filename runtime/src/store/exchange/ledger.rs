//! Entry-id checks of one long session in memory that does not follow the
//! session's length (a chunk, and a small buffer per run of it at the end).
//!
//! An import's check pass (a light fold, [`super::fold`]) and a pi file's
//! first reading check a session's entry ids: none used twice, every id an
//! entry names (a parent, a leaf, a rewrite's) live. [`IdChecks`] holds the
//! ids in memory up to a budget and answers at once; past it, a [`Ledger`]
//! records every operation instead: an id checked to be absent (refused if
//! it is live), checked to be present (refused unless live), defined or
//! removed, and a reset of every id (a whole rewrite, a clear) as a new
//! *epoch*. Each operation carries its place (`seq`) and what to report if
//! it is refused. Operations are sorted by (id, seq) in chunks of at most
//! [`CHUNK_BYTES_MAX`]; every chunk but a lone first one is written as a
//! sorted run to an unnamed temporary file, and at the end the runs are
//! merged, reading [`RUN_READ_BYTES`] of each at a time. One sweep over
//! each id's operations in order then finds every refusal; the one with the
//! smallest `seq` is the one an immediate check would have met first, and
//! a caller that meets another error first asks the ledger before it
//! reports that one.
//!
//! A run's record, little-endian (the file lives as long as the import):
//! the id's length (1 byte), the id, the epoch (4), `seq` (8), the
//! operation (1), the commit's version (8), the source line (8): about 40
//! bytes for an 8-byte id, three of them an appended entry. Memory: the
//! chunk (2 MiB and its index) and, while merging, 2 KiB and 16 bytes per
//! run: about a thousandth of the records written.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;

use crate::transcript::id_index::IdIndex;
use crate::transcript::ENTRY_ID_LEN_MAX;

/// Operations held (and sorted) in memory before they are written out as a
/// run, in bytes of records.
pub(crate) const CHUNK_BYTES_MAX: usize = 2 << 20;
/// Bytes of one run read at a time while the runs are merged.
const RUN_READ_BYTES: usize = 2 << 10;
/// A record's bytes besides the id.
const FIXED_BYTES: usize = 1 + 4 + 8 + 1 + 8 + 8;
/// The longest record.
const RECORD_BYTES_MAX: usize = FIXED_BYTES + ENTRY_ID_LEN_MAX;
const _: () = assert!(ENTRY_ID_LEN_MAX <= u8::MAX as usize);
const _: () = assert!(RECORD_BYTES_MAX <= RUN_READ_BYTES);

/// The check that refused an id, which says how it is reported.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Check {
    /// An appended entry's id is live already.
    Appended,
    /// An appended entry's parent is not live.
    Parent,
    /// A moved leaf is not live.
    Leaf,
    /// A delta rewrite names (writes, reparents or removes) an id that is
    /// not live.
    Named,
    /// A delta rewrite's new parent is not live.
    NewParent,
    /// A delta rewrite's leaf is not live.
    NewLeaf,
}

/// What a record asks of its id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// Refused (as [`Check::Appended`]) if the id is live.
    Absent,
    /// Makes the id live.
    Define,
    /// Refused unless the id is live.
    Check(Check),
    /// Makes the id not live.
    Remove,
}

impl Op {
    fn to_byte(self) -> u8 {
        match self {
            Op::Absent => 0,
            Op::Define => 1,
            Op::Remove => 2,
            Op::Check(Check::Appended) => 10,
            Op::Check(Check::Parent) => 11,
            Op::Check(Check::Leaf) => 12,
            Op::Check(Check::Named) => 13,
            Op::Check(Check::NewParent) => 14,
            Op::Check(Check::NewLeaf) => 15,
        }
    }

    fn from_byte(b: u8) -> Option<Op> {
        Some(match b {
            0 => Op::Absent,
            1 => Op::Define,
            2 => Op::Remove,
            10 => Op::Check(Check::Appended),
            11 => Op::Check(Check::Parent),
            12 => Op::Check(Check::Leaf),
            13 => Op::Check(Check::Named),
            14 => Op::Check(Check::NewParent),
            15 => Op::Check(Check::NewLeaf),
            _ => return None,
        })
    }
}

/// The first refusal of a session's recorded operations.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Refused {
    /// The operation's place in the fold (smaller: met first).
    pub(crate) seq: u64,
    pub(crate) check: Check,
    pub(crate) id: String,
    /// The commit's version and the source line of the event.
    pub(crate) version: u64,
    pub(crate) line: u64,
}

/// One record, borrowed from a chunk or a run's buffer.
#[derive(Clone, Copy)]
struct Rec<'a> {
    id: &'a [u8],
    epoch: u32,
    seq: u64,
    op: Op,
    version: u64,
    line: u64,
}

impl<'a> Rec<'a> {
    fn key(&self) -> (&'a [u8], u64) {
        (self.id, self.seq)
    }

    fn write(&self, out: &mut Vec<u8>) {
        // The id's length fits a byte (`ENTRY_ID_LEN_MAX`, checked when
        // recorded).
        out.push(self.id.len() as u8);
        out.extend_from_slice(self.id);
        out.extend_from_slice(&self.epoch.to_le_bytes());
        out.extend_from_slice(&self.seq.to_le_bytes());
        out.push(self.op.to_byte());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.line.to_le_bytes());
    }

    /// The record at the start of `b` and its length; `None` if `b` holds
    /// less than a whole one. A record this process wrote always decodes:
    /// anything else is the temporary file going wrong under it.
    fn read(b: &'a [u8]) -> io::Result<Option<(Rec<'a>, usize)>> {
        let Some(&n) = b.first() else {
            return Ok(None);
        };
        let len = FIXED_BYTES + n as usize;
        let Some(r) = b.get(..len) else {
            return Ok(None);
        };
        let id = &r[1..1 + n as usize];
        let f = &r[1 + n as usize..];
        let le4 = |s: &[u8]| u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
        let le8 = |s: &[u8]| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&s[..8]);
            u64::from_le_bytes(a)
        };
        let op = Op::from_byte(f[12]).ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "an entry-id record read back from the temporary file is not one written",
            )
        })?;
        let rec = Rec {
            id,
            epoch: le4(&f[0..4]),
            seq: le8(&f[4..12]),
            op,
            version: le8(&f[13..21]),
            line: le8(&f[21..29]),
        };
        Ok(Some((rec, len)))
    }
}

/// Where each id's sweep stands.
#[derive(Default)]
struct Sweep {
    /// The id of the operations being swept, and the epoch it is live in.
    id: Vec<u8>,
    live: Option<u32>,
    first: Option<Refused>,
}

impl Sweep {
    /// Applies `r`, the next operation in (id, seq) order.
    fn apply(&mut self, r: Rec<'_>) {
        if self.id != r.id {
            self.id.clear();
            self.id.extend_from_slice(r.id);
            self.live = None;
        }
        let live = self.live == Some(r.epoch);
        let refused = match r.op {
            Op::Absent => live.then_some(Check::Appended),
            Op::Define => {
                self.live = Some(r.epoch);
                None
            }
            Op::Check(c) => (!live).then_some(c),
            Op::Remove => {
                self.live = None;
                None
            }
        };
        let Some(check) = refused else {
            return;
        };
        if self.first.as_ref().is_some_and(|f| f.seq <= r.seq) {
            return;
        }
        self.first = Some(Refused {
            seq: r.seq,
            check,
            id: String::from_utf8_lossy(r.id).into_owned(),
            version: r.version,
            line: r.line,
        });
    }
}

/// A session's id operations; see the module documentation.
pub(crate) struct Ledger {
    /// Where the temporary file goes (the system's temporary directory when
    /// this one refuses it, or when there is none).
    dir: Option<PathBuf>,
    /// The current chunk's records, end to end, and where each starts.
    chunk: Vec<u8>,
    starts: Vec<u32>,
    chunk_bytes_max: usize,
    spill: Option<Spill>,
    seq: u64,
    epoch: u32,
}

struct Spill {
    out: BufWriter<File>,
    /// Each run's first byte and its length in bytes.
    runs: Vec<(u64, u64)>,
    written: u64,
}

impl Ledger {
    /// A ledger whose runs go to a temporary file in `dir`, each holding
    /// about `chunk_bytes_max` of records ([`CHUNK_BYTES_MAX`] but in tests).
    pub(crate) fn new(dir: Option<PathBuf>, chunk_bytes_max: usize) -> Self {
        Ledger {
            dir,
            chunk: Vec::new(),
            starts: Vec::new(),
            chunk_bytes_max: chunk_bytes_max.clamp(1, CHUNK_BYTES_MAX),
            spill: None,
            seq: 0,
            epoch: 0,
        }
    }

    /// Refused later (as [`Check::Appended`]) if `id` is live now.
    pub(crate) fn absent(&mut self, id: &str, at: (u64, u64)) -> io::Result<()> {
        self.record(id, Op::Absent, at)
    }

    /// `id` is live from now, whether or not it was.
    pub(crate) fn define(&mut self, id: &str) -> io::Result<()> {
        self.record(id, Op::Define, (0, 0))
    }

    /// Refused later as `check` unless `id` is live now.
    pub(crate) fn check(&mut self, id: &str, check: Check, at: (u64, u64)) -> io::Result<()> {
        self.record(id, Op::Check(check), at)
    }

    pub(crate) fn remove(&mut self, id: &str) -> io::Result<()> {
        self.record(id, Op::Remove, (0, 0))
    }

    /// No id is live any more.
    pub(crate) fn reset(&mut self) -> io::Result<()> {
        self.epoch = self
            .epoch
            .checked_add(1)
            .ok_or_else(|| io::Error::other("more than 4 Gi transcript resets in one session"))?;
        Ok(())
    }

    fn record(&mut self, id: &str, op: Op, (version, line): (u64, u64)) -> io::Result<()> {
        if id.is_empty() || id.len() > ENTRY_ID_LEN_MAX {
            // An `EntryId` is never either.
            return Err(io::Error::other(format!(
                "an entry id of {} bytes (1..={ENTRY_ID_LEN_MAX})",
                id.len()
            )));
        }
        if self.chunk.capacity() == 0 {
            // Whole at once: a chunk grown by doubling would leave the
            // smaller ones behind in the allocator, and end at twice the
            // bound.
            self.chunk
                .reserve_exact(self.chunk_bytes_max + RECORD_BYTES_MAX);
            self.starts
                .reserve_exact(self.chunk_bytes_max / (FIXED_BYTES + 1) + 1);
        }
        let rec = Rec {
            id: id.as_bytes(),
            epoch: self.epoch,
            seq: self.seq,
            op,
            version,
            line,
        };
        self.seq += 1;
        // Below `CHUNK_BYTES_MAX` plus one record: fits a `u32`.
        self.starts.push(self.chunk.len() as u32);
        rec.write(&mut self.chunk);
        if self.chunk.len() >= self.chunk_bytes_max {
            self.write_run()?;
        }
        Ok(())
    }

    /// Orders the chunk's records by (id, seq), in `starts`.
    fn sort(&mut self) {
        let chunk = &self.chunk;
        let key = |s: &u32| match Rec::read(chunk.get(*s as usize..).unwrap_or_default()) {
            Ok(Some((r, _))) => r.key(),
            // Never: a chunk holds whole records this process wrote (and
            // `records` reports it).
            _ => (&[][..], 0),
        };
        self.starts.sort_unstable_by(|a, b| key(a).cmp(&key(b)));
    }

    fn write_run(&mut self) -> io::Result<()> {
        self.sort();
        if self.spill.is_none() {
            let file = match &self.dir {
                Some(d) => tempfile::tempfile_in(d).or_else(|_| tempfile::tempfile())?,
                None => tempfile::tempfile()?,
            };
            self.spill = Some(Spill {
                out: BufWriter::new(file),
                runs: Vec::new(),
                written: 0,
            });
        }
        let Some(spill) = &mut self.spill else {
            return Err(io::Error::other("a ledger's run file is missing"));
        };
        let mut record = Vec::with_capacity(RECORD_BYTES_MAX);
        let mut len = 0u64;
        for r in records(&self.chunk, &self.starts) {
            record.clear();
            r?.write(&mut record);
            spill.out.write_all(&record)?;
            len += record.len() as u64;
        }
        spill.runs.push((spill.written, len));
        spill.written += len;
        self.chunk.clear();
        self.starts.clear();
        Ok(())
    }

    /// The refusal met first among every operation recorded, if any.
    pub(crate) fn finish(mut self) -> io::Result<Option<Refused>> {
        let mut sweep = Sweep::default();
        if self.spill.is_none() {
            self.sort();
            for r in records(&self.chunk, &self.starts) {
                sweep.apply(r?);
            }
            return Ok(sweep.first);
        }
        if !self.starts.is_empty() {
            self.write_run()?;
        }
        let Some(spill) = self.spill.take() else {
            return Ok(None);
        };
        let file = spill.out.into_inner().map_err(|e| e.into_error())?;
        let mut cursors: Vec<Cursor> = spill
            .runs
            .iter()
            .map(|&(start, len)| Cursor {
                next: start,
                end: start + len,
                buf: Vec::new(),
                at: 0,
            })
            .collect();
        let mut heap = BinaryHeap::with_capacity(cursors.len());
        for (i, c) in cursors.iter_mut().enumerate() {
            if let Some((id, seq)) = c.head(&file)? {
                heap.push(Reverse(Head(id, seq, i)));
            }
        }
        while let Some(Reverse(Head(_, _, i))) = heap.pop() {
            let c = &mut cursors[i];
            let Some((r, len)) = c.peek()? else {
                return Err(io::Error::other("a ledger run lost the record it showed"));
            };
            sweep.apply(r);
            c.at += len;
            if let Some((id, seq)) = c.head(&file)? {
                heap.push(Reverse(Head(id, seq, i)));
            }
        }
        Ok(sweep.first)
    }
}

/// Why [`IdChecks`] refuses an operation now.
#[derive(Debug)]
pub(crate) enum Denied {
    /// The check failed (answered at once: the ids are held).
    Check(Check),
    /// More ids than [`IdIndex`] holds.
    Limit(String),
    /// The ledger's temporary file failed.
    Io(io::Error),
}

/// A session's entry ids for checks: held in an [`IdIndex`] (about 20
/// bytes an id) up to `held_bytes_max` of it, answering each check at once;
/// past that, every operation goes to a [`Ledger`] on disk, which answers
/// them all in [`IdChecks::settle`]: the same answers, the refusal an
/// immediate check would have met first.
pub(crate) struct IdChecks {
    held: IdIndex,
    /// Every operation once the ids outgrew `held`.
    ledger: Option<Ledger>,
    held_bytes_max: usize,
    chunk_bytes_max: usize,
    spill_dir: Option<PathBuf>,
    /// Whether a ledger answered: the ids are gone, so no check can be
    /// answered any more.
    settled: bool,
}

impl IdChecks {
    /// Checks holding at most about `held_bytes_max` of ids in memory (its
    /// growth can double the table once before the ledger takes over), then
    /// a ledger of `chunk_bytes_max` chunks in a temporary file in
    /// `spill_dir`.
    pub(crate) fn new(
        held_bytes_max: usize,
        chunk_bytes_max: usize,
        spill_dir: Option<PathBuf>,
    ) -> Self {
        IdChecks {
            held: IdIndex::default(),
            ledger: None,
            held_bytes_max,
            chunk_bytes_max,
            spill_dir,
            settled: false,
        }
    }

    /// Refused as [`Check::Appended`] if `id` is live. `at`: the version
    /// and source line reported with a deferred refusal.
    pub(crate) fn absent(&mut self, id: &str, at: (u64, u64)) -> Result<(), Denied> {
        self.outgrown()?;
        match &mut self.ledger {
            Some(l) => l.absent(id, at).map_err(Denied::Io),
            None if self.held.contains(id) => Err(Denied::Check(Check::Appended)),
            None => Ok(()),
        }
    }

    /// Refused as `check` unless `id` is live.
    pub(crate) fn require(&mut self, id: &str, check: Check, at: (u64, u64)) -> Result<(), Denied> {
        self.outgrown()?;
        match &mut self.ledger {
            Some(l) => l.check(id, check, at).map_err(Denied::Io),
            None if self.held.contains(id) => Ok(()),
            None => Err(Denied::Check(check)),
        }
    }

    /// `id` is live from now, whether or not it was.
    pub(crate) fn define(&mut self, id: &str) -> Result<(), Denied> {
        self.outgrown()?;
        match &mut self.ledger {
            Some(l) => l.define(id).map_err(Denied::Io),
            None if self.held.contains(id) => Ok(()),
            None => self.held.push(id).map(|_| ()).map_err(Denied::Limit),
        }
    }

    /// [`IdChecks::define`] of an id [`IdChecks::absent`] just accepted:
    /// held, it is added without looking it up again.
    pub(crate) fn define_absent(&mut self, id: &str) -> Result<(), Denied> {
        self.outgrown()?;
        match &mut self.ledger {
            Some(l) => l.define(id).map_err(Denied::Io),
            None => self.held.push(id).map(|_| ()).map_err(Denied::Limit),
        }
    }

    pub(crate) fn remove(&mut self, id: &str) -> Result<(), Denied> {
        match &mut self.ledger {
            Some(l) => l.remove(id).map_err(Denied::Io),
            None => {
                self.held.remove(id);
                Ok(())
            }
        }
    }

    /// No id is live any more.
    pub(crate) fn reset(&mut self) -> Result<(), Denied> {
        match &mut self.ledger {
            Some(l) => l.reset().map_err(Denied::Io),
            None => {
                self.held = IdIndex::default();
                Ok(())
            }
        }
    }

    /// Hands the held ids to a ledger once they are over the budget.
    fn outgrown(&mut self) -> Result<(), Denied> {
        if self.settled {
            return Err(Denied::Io(io::Error::other(
                "the entry-id checks were asked after their ledger answered",
            )));
        }
        if self.ledger.is_some() || self.held.heap_bytes() <= self.held_bytes_max {
            return Ok(());
        }
        let mut ledger = Ledger::new(self.spill_dir.clone(), self.chunk_bytes_max);
        for id in self.held.live_ids() {
            ledger.define(id).map_err(Denied::Io)?;
        }
        self.held = IdIndex::default();
        self.ledger = Some(ledger);
        Ok(())
    }

    /// The refusal the deferred checks met first, if any (none while the
    /// ids are held, or when asked again). Once a ledger answered, the
    /// checks refuse every further question.
    pub(crate) fn settle(&mut self) -> io::Result<Option<Refused>> {
        match self.ledger.take() {
            Some(l) => {
                self.settled = true;
                l.finish()
            }
            None => Ok(None),
        }
    }
}

/// The records of `chunk` that start at `starts`, in that order.
fn records<'a>(
    chunk: &'a [u8],
    starts: &'a [u32],
) -> impl Iterator<Item = io::Result<Rec<'a>>> + 'a {
    starts.iter().map(
        |&s| match Rec::read(chunk.get(s as usize..).unwrap_or_default()) {
            Ok(Some((r, _))) => Ok(r),
            Ok(None) => Err(io::Error::other("a ledger chunk holds a part of a record")),
            Err(e) => Err(e),
        },
    )
}

/// A run's next record's key (id, then `seq`) and the run's number.
#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Head(Vec<u8>, u64, usize);

/// One run being merged: a window of its bytes.
struct Cursor {
    /// The run's next byte not yet read, and its end.
    next: u64,
    end: u64,
    buf: Vec<u8>,
    at: usize,
}

impl Cursor {
    /// The record at the cursor, if the window holds a whole one.
    fn peek(&self) -> io::Result<Option<(Rec<'_>, usize)>> {
        Rec::read(&self.buf[self.at..])
    }

    /// The sort key of the run's next record, reading more of the run when
    /// needed; `None` at its end.
    fn head(&mut self, file: &File) -> io::Result<Option<(Vec<u8>, u64)>> {
        if self.peek()?.is_none() {
            self.buf.drain(..self.at);
            self.at = 0;
            let want = (RUN_READ_BYTES - self.buf.len()).min((self.end - self.next) as usize);
            let have = self.buf.len();
            self.buf.resize(have + want, 0);
            file.read_exact_at(&mut self.buf[have..], self.next)?;
            self.next += want as u64;
        }
        if self.peek()?.is_none() && self.at < self.buf.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "a ledger run of the temporary file ends inside a record (at byte {})",
                    self.next
                ),
            ));
        }
        Ok(self.peek()?.map(|(r, _)| (r.id.to_vec(), r.seq)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::path::Path;

    use crate::test_rng::Rng;

    #[derive(Clone, Debug)]
    enum Step {
        Absent(String),
        Define(String),
        Check(String, Check),
        Remove(String),
        Reset,
    }

    /// The first refusal, answering each step at once.
    fn immediately(steps: &[Step]) -> Option<(u64, Check, String)> {
        let mut live: HashSet<&str> = HashSet::new();
        let mut seq = 0u64;
        for s in steps {
            let refused = match s {
                Step::Absent(id) => live.contains(id.as_str()).then_some((Check::Appended, id)),
                Step::Define(id) => {
                    live.insert(id);
                    None
                }
                Step::Check(id, c) => (!live.contains(id.as_str())).then_some((*c, id)),
                Step::Remove(id) => {
                    live.remove(id.as_str());
                    None
                }
                Step::Reset => {
                    live.clear();
                    continue;
                }
            };
            if let Some((c, id)) = refused {
                return Some((seq, c, id.clone()));
            }
            seq += 1;
        }
        None
    }

    fn ledger(dir: &Path, steps: &[Step], chunk: usize) -> Option<(u64, Check, String)> {
        let mut l = Ledger::new(Some(dir.to_path_buf()), chunk);
        for (i, s) in steps.iter().enumerate() {
            let at = (i as u64 + 1, i as u64 + 10);
            match s {
                Step::Absent(id) => l.absent(id, at),
                Step::Define(id) => l.define(id),
                Step::Check(id, c) => l.check(id, *c, at),
                Step::Remove(id) => l.remove(id),
                Step::Reset => l.reset(),
            }
            .unwrap();
        }
        let r = l.finish().unwrap()?;
        // The refused step's place is reported with it.
        let step = r.version as usize - 1;
        assert_eq!(r.line, step as u64 + 10);
        Some((r.seq, r.check, r.id))
    }

    /// Ids that are prefixes of one another, so (id, seq) order is tested
    /// where a shorter id sorts before a longer one it starts.
    fn id(rng: &mut Rng) -> String {
        ["a", "ab", "abc", "b", "ba", "z9", "a0"][rng.below(7) as usize].to_string()
    }

    /// Random steps that mostly pass (a check mostly names a live id, an
    /// absence mostly one that is not), so refusals come at any point.
    fn steps(rng: &mut Rng, n: usize) -> Vec<Step> {
        let checks = [
            Check::Parent,
            Check::Leaf,
            Check::Named,
            Check::NewParent,
            Check::NewLeaf,
        ];
        let mut live: Vec<String> = Vec::new();
        let mut out = Vec::new();
        for _ in 0..n {
            let pick_live = |rng: &mut Rng, live: &[String]| match live.len() {
                0 => id(rng),
                n if rng.below(40) > 0 => live[rng.below(n as u64) as usize].clone(),
                _ => id(rng),
            };
            let step = match rng.below(20) {
                0..=6 => Step::Define(id(rng)),
                7..=9 => {
                    let mut i = id(rng);
                    if rng.below(40) > 0 && live.contains(&i) {
                        i.push('x');
                    }
                    Step::Absent(i)
                }
                10..=15 => Step::Check(pick_live(rng, &live), checks[rng.below(5) as usize]),
                16..=18 => Step::Remove(pick_live(rng, &live)),
                _ if rng.below(3) == 0 => Step::Reset,
                _ => Step::Define(id(rng)),
            };
            match &step {
                Step::Define(i) if !live.contains(i) => live.push(i.clone()),
                Step::Remove(i) => live.retain(|l| l != i),
                Step::Reset => live.clear(),
                _ => {}
            }
            out.push(step);
        }
        out
    }

    /// Over random steps, the ledger finds the refusal an immediate check
    /// meets first, in memory or over runs of one record to many, and
    /// leaves no file behind.
    #[test]
    fn the_ledger_refuses_what_an_immediate_check_refuses_first() {
        let dir = tempfile::tempdir().unwrap();
        let (mut refused, mut accepted) = (0, 0);
        for seed in 1..=300u64 {
            let mut rng = Rng::seeded(seed);
            let n = 1 + rng.below(80) as usize;
            let steps = steps(&mut rng, n);
            let want = immediately(&steps);
            for chunk in [1, 40, 300, CHUNK_BYTES_MAX] {
                let got = ledger(dir.path(), &steps, chunk);
                assert_eq!(got, want, "seed {seed}, chunk {chunk}");
            }
            match want {
                Some(_) => refused += 1,
                None => accepted += 1,
            }
        }
        assert!(
            refused > 50 && accepted > 20,
            "{refused} refused, {accepted} accepted"
        );
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// A run read back that ends inside a record is an error, never a run
    /// cut short in silence.
    #[test]
    fn a_run_that_ends_inside_a_record_is_an_error() {
        let rec = Rec {
            id: b"e1",
            epoch: 0,
            seq: 7,
            op: Op::Absent,
            version: 1,
            line: 2,
        };
        let mut bytes = Vec::new();
        rec.write(&mut bytes);
        let whole = bytes.len();
        rec.write(&mut bytes);
        bytes.truncate(whole + 5);
        let mut file = tempfile::tempfile().unwrap();
        file.write_all(&bytes).unwrap();
        let mut c = Cursor {
            next: 0,
            end: bytes.len() as u64,
            buf: Vec::new(),
            at: 0,
        };
        assert_eq!(c.head(&file).unwrap(), Some((b"e1".to_vec(), 7)));
        c.at += whole;
        let e = c.head(&file).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    /// A long valid run (every check met) spills many runs and refuses
    /// nothing; one bad check late in it is found with its place.
    #[test]
    fn a_long_ledger_finds_one_late_refusal() {
        let dir = tempfile::tempdir().unwrap();
        let mut steps = Vec::new();
        for i in 0..20_000u32 {
            let id = format!("e{i}");
            steps.push(Step::Absent(id.clone()));
            if i > 0 {
                steps.push(Step::Check(format!("e{}", i - 1), Check::Parent));
            }
            steps.push(Step::Define(id));
        }
        assert_eq!(ledger(dir.path(), &steps, 4096), None);
        let at = steps.len() - 7;
        steps.insert(at, Step::Check("e20000".into(), Check::Leaf));
        let want = immediately(&steps);
        assert!(want.is_some());
        assert_eq!(ledger(dir.path(), &steps, 4096), want);
    }
}
