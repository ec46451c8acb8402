//! Whether a source holds a commit id twice, found in memory bounded by a
//! constant rather than by the source's length: ids are sorted in chunks of
//! [`CHUNK_IDS_MAX`], every chunk but a lone first one is written as a sorted
//! run to an unnamed temporary file, and the runs are merged once, at the end
//! of the check pass, reading [`RUN_READ_IDS`] ids of each at a time.
//!
//! A source of `n` commits costs `24 n` bytes of temporary file (on the
//! store's file system when it can hold one) and at most
//! `24 (CHUNK_IDS_MAX + RUN_READ_IDS · n / CHUNK_IDS_MAX)` bytes of memory:
//! 1.5 MiB up to 64 Ki commits, 1.6 MiB at a million, 6 MiB at a
//! hundred million.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::Path;

use spool_engine::Uuid;

/// Ids sorted in memory before they are written out as a run.
const CHUNK_IDS_MAX: usize = 1 << 16;
/// Ids of one run read at a time while the runs are merged.
const RUN_READ_IDS: usize = 128;
/// One id as written in a run: the id (16 bytes) and its ordinal in the
/// source, little-endian (the file lives as long as the import).
const ENTRY_BYTES: usize = 24;

/// An id and where in the source it was seen (its commit's ordinal, from 0).
/// Ordered by id first, so equal ids are neighbours once sorted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Seen {
    id: u128,
    ordinal: u64,
}

impl Seen {
    fn to_bytes(self) -> [u8; ENTRY_BYTES] {
        let mut b = [0u8; ENTRY_BYTES];
        b[..16].copy_from_slice(&self.id.to_le_bytes());
        b[16..].copy_from_slice(&self.ordinal.to_le_bytes());
        b
    }

    fn from_bytes(b: &[u8]) -> Seen {
        let mut id = [0u8; 16];
        let mut ordinal = [0u8; 8];
        id.copy_from_slice(&b[..16]);
        ordinal.copy_from_slice(&b[16..ENTRY_BYTES]);
        Seen {
            id: u128::from_le_bytes(id),
            ordinal: u64::from_le_bytes(ordinal),
        }
    }
}

/// A commit id the source holds twice: the ordinals of two of its commits
/// (`first < second`) that have it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Twice {
    pub(crate) commit_id: Uuid,
    pub(crate) first: u64,
    pub(crate) second: u64,
}

/// The commit ids seen so far, in order; see the module documentation.
pub(crate) struct SeenIds<'d> {
    /// Where the temporary file goes (the system's temporary directory when
    /// this one refuses it).
    dir: &'d Path,
    chunk: Vec<Seen>,
    seen: u64,
    spill: Option<Spill>,
}

struct Spill {
    out: BufWriter<File>,
    /// Each run's first id (counted in ids from the file's start) and length.
    runs: Vec<(u64, u64)>,
}

impl<'d> SeenIds<'d> {
    pub(crate) fn new(dir: &'d Path) -> Self {
        SeenIds {
            dir,
            chunk: Vec::new(),
            seen: 0,
            spill: None,
        }
    }

    /// Records the next commit's id.
    pub(crate) fn push(&mut self, id: Uuid) -> io::Result<()> {
        self.chunk.push(Seen {
            id: id.as_u128(),
            ordinal: self.seen,
        });
        self.seen += 1;
        if self.chunk.len() >= CHUNK_IDS_MAX {
            self.write_run()?;
        }
        Ok(())
    }

    fn write_run(&mut self) -> io::Result<()> {
        self.chunk.sort_unstable();
        let spill = match &mut self.spill {
            Some(s) => s,
            None => {
                let file = tempfile::tempfile_in(self.dir).or_else(|_| tempfile::tempfile())?;
                self.spill.insert(Spill {
                    out: BufWriter::new(file),
                    runs: Vec::new(),
                })
            }
        };
        for s in &self.chunk {
            spill.out.write_all(&s.to_bytes())?;
        }
        let len = self.chunk.len() as u64;
        let start = spill.runs.last().map_or(0, |&(start, n)| start + n);
        spill.runs.push((start, len));
        self.chunk.clear();
        Ok(())
    }

    /// A commit id seen twice, if any (the smallest such id, with its first
    /// two ordinals).
    pub(crate) fn finish(mut self) -> io::Result<Option<Twice>> {
        if self.spill.is_none() {
            self.chunk.sort_unstable();
            return Ok(twice(self.chunk.windows(2).find_map(|w| pair(w[0], w[1]))));
        }
        if !self.chunk.is_empty() {
            self.write_run()?;
        }
        let Some(spill) = self.spill.take() else {
            return Ok(None);
        };
        let file = spill.out.into_inner().map_err(|e| e.into_error())?;
        merge(&file, &spill.runs)
    }
}

fn pair(a: Seen, b: Seen) -> Option<(Seen, Seen)> {
    (a.id == b.id).then_some((a, b))
}

fn twice(p: Option<(Seen, Seen)>) -> Option<Twice> {
    p.map(|(a, b)| Twice {
        commit_id: Uuid::from_u128(a.id),
        first: a.ordinal.min(b.ordinal),
        second: a.ordinal.max(b.ordinal),
    })
}

/// One run being merged: the ids read from it and not yet taken.
struct Cursor {
    next: u64,
    end: u64,
    buf: Vec<Seen>,
    at: usize,
}

impl Cursor {
    /// The run's next id, reading the next few from `file` when needed.
    fn take(&mut self, file: &File) -> io::Result<Option<Seen>> {
        if self.at == self.buf.len() {
            let n = (self.end - self.next).min(RUN_READ_IDS as u64) as usize;
            if n == 0 {
                return Ok(None);
            }
            let mut bytes = vec![0u8; n * ENTRY_BYTES];
            file.read_exact_at(&mut bytes, self.next * ENTRY_BYTES as u64)?;
            self.buf = bytes
                .chunks_exact(ENTRY_BYTES)
                .map(Seen::from_bytes)
                .collect();
            self.at = 0;
            self.next += n as u64;
        }
        self.at += 1;
        Ok(self.buf.get(self.at - 1).copied())
    }
}

/// Merges the sorted runs of `file`, stopping at the first id met twice.
fn merge(file: &File, runs: &[(u64, u64)]) -> io::Result<Option<Twice>> {
    let mut cursors: Vec<Cursor> = runs
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
        if let Some(s) = c.take(file)? {
            heap.push(Reverse((s, i)));
        }
    }
    let mut prev: Option<Seen> = None;
    while let Some(Reverse((s, i))) = heap.pop() {
        if let Some(found) = prev.and_then(|p| pair(p, s)) {
            return Ok(twice(Some(found)));
        }
        prev = Some(s);
        if let Some(next) = cursors[i].take(file)? {
            heap.push(Reverse((next, i)));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(seed: u64, n: u64) -> Vec<Uuid> {
        // SplitMix64: distinct inputs give distinct outputs.
        let mix = |mut z: u64| {
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        (0..n)
            .map(|i| Uuid::from_u64_pair(mix(seed ^ i), mix(i)))
            .collect()
    }

    fn find(dir: &Path, ids: &[Uuid]) -> Option<Twice> {
        let mut seen = SeenIds::new(dir);
        for &id in ids {
            seen.push(id).unwrap();
        }
        seen.finish().unwrap()
    }

    /// Distinct ids are never reported, in memory or over spilled runs; an
    /// id repeated anywhere (in one chunk, across runs, in the last partial
    /// chunk) is found with both places it was seen.
    #[test]
    fn an_id_seen_twice_is_found_wherever_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let chunk = CHUNK_IDS_MAX as u64;
        for n in [0, 1, 2, 100, chunk - 1, chunk, chunk + 1, 3 * chunk + 17] {
            let distinct = ids(n, n);
            assert_eq!(find(dir.path(), &distinct), None, "n {n}");
            if n < 2 {
                continue;
            }
            let pairs = [(0, 1), (0, n - 1), (n / 2, n - 1), (n - 2, n - 1)];
            for (a, b) in pairs.into_iter().filter(|(a, b)| a < b) {
                let mut with = distinct.clone();
                with[b as usize] = with[a as usize];
                let t = find(dir.path(), &with);
                let want = Twice {
                    commit_id: with[a as usize],
                    first: a,
                    second: b,
                };
                assert_eq!(t, Some(want), "n {n}, ids {a} and {b}");
            }
        }
        // No file is left behind in the directory given.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    /// An id seen three times is reported with two of its places.
    #[test]
    fn an_id_seen_three_times_reports_its_first_two() {
        let dir = tempfile::tempdir().unwrap();
        let n = 2 * CHUNK_IDS_MAX as u64 + 5;
        let mut with = ids(7, n);
        let id = with[3];
        with[(n - 1) as usize] = id;
        with[CHUNK_IDS_MAX + 1] = id;
        let t = find(dir.path(), &with).unwrap();
        assert_eq!(
            (t.commit_id, t.first, t.second),
            (id, 3, CHUNK_IDS_MAX as u64 + 1)
        );
    }
}
