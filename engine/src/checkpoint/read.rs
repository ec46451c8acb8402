//! Opening a checkpoint (footer, top index and header checked, nothing else read)
//! and reading it: point lookups and range scans load the block index chunks and the
//! blocks they need with one `pread` each, check their crcs and keep the last few
//! decoded.
//!
//! A block whose crc fails is an error naming the file and offset: the reader never
//! answers from it. The checkpoint was already chosen over the log when that is found,
//! so the read fails rather than answer from the log behind the caller's back.

use super::block_index::{decode_block_index, decode_top_index, BlockIndex, TopIndex};
use super::format::{self, Footer, Header, FOOTER_BYTES};
use super::write::parse_file_name;
use super::CHECKPOINT_DIR;
use crate::error::IndexError;
use crate::vfs::{OpenMode, Vfs, VfsFile};
use sled::IVec;
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

/// Decoded blocks kept per open checkpoint.
const BLOCK_CACHE_BLOCKS: usize = 16;
/// Decoded block index chunks kept per open checkpoint.
const CHUNK_CACHE_CHUNKS: usize = 4;

/// A decoded data block.
struct Block {
    bytes: Vec<u8>,
    /// Per entry: key start, key end, value start, value end in `bytes`.
    entries: Vec<[u32; 4]>,
}

impl Block {
    fn key(&self, i: usize) -> &[u8] {
        let e = self.entries[i];
        &self.bytes[e[0] as usize..e[1] as usize]
    }
    fn value(&self, i: usize) -> &[u8] {
        let e = self.entries[i];
        &self.bytes[e[2] as usize..e[3] as usize]
    }
    /// Index of the first entry with a key `>= k`.
    fn lower_bound(&self, k: &[u8]) -> usize {
        let (mut lo, mut hi) = (0, self.entries.len());
        while lo < hi {
            let mid = (lo + hi) / 2;
            if self.key(mid) < k {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// Where a checkpoint's blocks are.
enum Blocks {
    /// Format version 1: the whole block index, read at open.
    Flat(Arc<BlockIndex>),
    /// The top index; a chunk is read when a lookup first needs it.
    Chunked {
        top: TopIndex,
        cache: Mutex<Vec<(u64, Arc<BlockIndex>)>>,
    },
}

/// The value under `key` in a small most-recently-used list, moved to its end.
fn touch<T: Clone>(list: &mut Vec<(u64, T)>, key: u64) -> Option<T> {
    let p = list.iter().position(|(n, _)| *n == key)?;
    let hit = list.remove(p);
    let v = hit.1.clone();
    list.push(hit);
    Some(v)
}

/// Adds `v` under `key` to a most-recently-used list of at most `max` entries.
fn remember<T>(list: &mut Vec<(u64, T)>, key: u64, v: T, max: usize) {
    if list.len() >= max {
        list.remove(0);
    }
    list.push((key, v));
}

/// An open, validated checkpoint file.
pub(crate) struct CheckpointFile {
    pub path: PathBuf,
    file: Arc<dyn VfsFile>,
    pub header: Header,
    blocks: Blocks,
    cache: Mutex<Vec<(u64, Arc<Block>)>>,
}

impl std::fmt::Debug for CheckpointFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointFile")
            .field("path", &self.path)
            .field("seq", &self.header.seq)
            .finish()
    }
}

/// The newest checkpoint file in the store directory `dir`, if any.
pub(crate) fn newest(vfs: &dyn Vfs, dir: &Path) -> Option<PathBuf> {
    let cdir = dir.join(CHECKPOINT_DIR);
    let names = vfs.read_dir(&cdir).ok()?;
    names
        .iter()
        .filter_map(|n| parse_file_name(n).map(|s| (s, n)))
        .max_by_key(|(s, _)| *s)
        .map(|(_, n)| cdir.join(n))
}

impl CheckpointFile {
    /// Open and check the checkpoint at `path`: its footer, block index and header
    /// (their crcs and bounds). `Err` says why it cannot be used, naming the file and
    /// offset.
    pub(crate) fn open(vfs: &dyn Vfs, path: &Path) -> Result<CheckpointFile, String> {
        let at = |off: u64, what: &str| format!("{} at offset {off}: {what}", path.display());
        let file = vfs
            .open(path, OpenMode::Read)
            .map_err(|e| format!("{}: open: {e}", path.display()))?;
        let len = file
            .len()
            .map_err(|e| format!("{}: len: {e}", path.display()))?;
        if len < FOOTER_BYTES + 20 {
            return Err(at(0, "shorter than a header and a footer"));
        }
        let read = |off: u64, n: u64| -> Result<Vec<u8>, String> {
            // Every length read from the file was checked against its size before this.
            let mut buf = vec![0u8; n as usize];
            file.read_at(&mut buf, off)
                .map_err(|e| at(off, &format!("read: {e}")))?;
            Ok(buf)
        };
        let foot = read(len - FOOTER_BYTES, FOOTER_BYTES)?;
        let foot: [u8; FOOTER_BYTES as usize] = foot
            .try_into()
            .map_err(|_| at(len - FOOTER_BYTES, "footer"))?;
        let footer = Footer::decode(&foot).map_err(|e| at(len - FOOTER_BYTES, &e))?;
        let data_end = footer.index_offset;
        if footer.index_len > format::BLOCK_INDEX_BYTES_MAX
            || data_end
                .checked_add(footer.index_len)
                .is_none_or(|e| e != len - FOOTER_BYTES)
        {
            return Err(at(len - FOOTER_BYTES, "block index out of bounds"));
        }
        let fixed = read(0, 16)?;
        let version = u32::from_le_bytes(fixed[8..12].try_into().unwrap_or_default());
        let header_len = u64::from(u32::from_le_bytes(
            fixed[12..16].try_into().unwrap_or_default(),
        ));
        if fixed[..8] != format::MAGIC {
            return Err(at(0, "not a checkpoint (magic)"));
        }
        if !(20..=format::HEADER_BYTES_MAX).contains(&header_len) || header_len > data_end {
            return Err(at(12, "header length out of bounds"));
        }
        let hb = read(0, header_len)?;
        let header = Header::decode(&hb).map_err(|(off, e)| at(off, &e))?;
        let ib = read(data_end, footer.index_len)?;
        if format::crc(&ib) != footer.index_crc {
            return Err(at(data_end, "block index checksum mismatch"));
        }
        let blocks = if version == format::FORMAT_VERSION_FLAT {
            let flat = decode_block_index(ib, header_len, data_end)
                .map_err(|(off, e)| at(data_end + off, &e))?;
            Blocks::Flat(Arc::new(flat))
        } else {
            let top = decode_top_index(ib, header_len, data_end)
                .map_err(|(off, e)| at(data_end + off, &e))?;
            Blocks::Chunked {
                top,
                cache: Mutex::new(Vec::new()),
            }
        };
        let count = match &blocks {
            Blocks::Flat(b) => b.len() as u64,
            Blocks::Chunked { top, .. } => top.block_count(),
        };
        if (header.entries > 0) != (count > 0) {
            return Err(at(0, "entry count and blocks disagree"));
        }
        Ok(CheckpointFile {
            path: path.to_path_buf(),
            file,
            header,
            blocks,
            cache: Mutex::new(Vec::new()),
        })
    }

    fn malformed(&self, off: u64, what: &str) -> IndexError {
        IndexError::Malformed(format!(
            "checkpoint {} at offset {off}: {what}",
            self.path.display()
        ))
    }

    /// The `len` bytes at `offset` (a block or a chunk, which the open placed inside the
    /// file, at least 4 bytes long) without their trailing crc, once it is checked.
    fn read_checked(&self, offset: u64, len: u32, what: &str) -> Result<Vec<u8>, IndexError> {
        let mut buf = vec![0u8; len as usize];
        self.file
            .read_at(&mut buf, offset)
            .map_err(|e| self.malformed(offset, &format!("read: {e}")))?;
        let n = buf.len().saturating_sub(4);
        let stored = u32::from_le_bytes(buf[n..].try_into().unwrap_or_default());
        if format::crc(&buf[..n]) != stored {
            return Err(self.malformed(offset, &format!("{what} checksum mismatch")));
        }
        buf.truncate(n);
        Ok(buf)
    }

    /// Number of data blocks.
    fn block_count(&self) -> u64 {
        match &self.blocks {
            Blocks::Flat(b) => b.len() as u64,
            Blocks::Chunked { top, .. } => top.block_count(),
        }
    }

    /// Chunk `c` of the block index, read and checked if it is not cached.
    fn chunk(
        &self,
        top: &TopIndex,
        cache: &Mutex<Vec<(u64, Arc<BlockIndex>)>>,
        c: usize,
    ) -> Result<Arc<BlockIndex>, IndexError> {
        if let Some(hit) = touch(
            &mut cache.lock().unwrap_or_else(|e| e.into_inner()),
            c as u64,
        ) {
            return Ok(hit);
        }
        let ch = top.at(c);
        // The top index placed every chunk inside the file when it was opened.
        let buf = self.read_checked(ch.offset, ch.len, "block index chunk")?;
        let index = decode_block_index(buf, ch.data_start, ch.data_end)
            .map_err(|(off, e)| self.malformed(ch.offset + off, &e))?;
        if index.len() as u64 != u64::from(ch.blocks) || index.first_key(0) != top.first_key(c) {
            return Err(self.malformed(ch.offset, "block index chunk disagrees with the top index"));
        }
        let index = Arc::new(index);
        remember(
            &mut cache.lock().unwrap_or_else(|e| e.into_inner()),
            c as u64,
            index.clone(),
            CHUNK_CACHE_CHUNKS,
        );
        Ok(index)
    }

    /// The block index (or chunk of it) listing block `i`, and `i`'s place in it.
    fn locate(&self, i: u64) -> Result<(Arc<BlockIndex>, usize), IndexError> {
        match &self.blocks {
            Blocks::Flat(b) => Ok((b.clone(), i as usize)),
            Blocks::Chunked { top, cache } => {
                let c = top.chunk_of(i);
                let local = i - top.at(c).first_block;
                Ok((self.chunk(top, cache, c)?, local as usize))
            }
        }
    }

    /// Block `i`, read and checked if it is not cached; `keep`: cache it. A scan keeps
    /// only the block it starts in, so that a long one (the owner's check of every
    /// version block, a reader's whole-prefix scan) neither holds a cache's worth of
    /// blocks it will not read again nor evicts those point lookups use.
    fn block(&self, i: u64, keep: bool) -> Result<Arc<Block>, IndexError> {
        if let Some(hit) = touch(&mut self.cache.lock().unwrap_or_else(|e| e.into_inner()), i) {
            return Ok(hit);
        }
        let (index, local) = self.locate(i)?;
        let r = index.at(local);
        // The block index bounded every block by the file's size when it was opened.
        let buf = self.read_checked(r.offset, r.len, "block")?;
        let entries =
            format::parse_block(&buf).map_err(|(off, e)| self.malformed(r.offset + off, &e))?;
        let block = Block {
            bytes: buf,
            entries,
        };
        if block.entries.is_empty() || block.key(0) != index.first_key(local) {
            return Err(self.malformed(r.offset, "block's first key differs from its index"));
        }
        let block = Arc::new(block);
        if keep {
            remember(
                &mut self.cache.lock().unwrap_or_else(|e| e.into_inner()),
                i,
                block.clone(),
                BLOCK_CACHE_BLOCKS,
            );
        }
        Ok(block)
    }

    /// The block that would hold `k` (the last whose first key is `<= k`).
    fn block_for(&self, k: &[u8]) -> Result<Option<u64>, IndexError> {
        match &self.blocks {
            Blocks::Flat(b) => Ok(b.count_at_or_below(k).checked_sub(1).map(|i| i as u64)),
            Blocks::Chunked { top, cache } => {
                let Some(c) = top.chunk_for(k) else {
                    return Ok(None);
                };
                let chunk = self.chunk(top, cache, c)?;
                // The chunk's first key is the top index's for it, `<= k`.
                let local = chunk.count_at_or_below(k).saturating_sub(1);
                Ok(Some(top.at(c).first_block + local as u64))
            }
        }
    }

    pub(crate) fn get(&self, k: &[u8]) -> Result<Option<IVec>, IndexError> {
        let Some(i) = self.block_for(k)? else {
            return Ok(None);
        };
        let b = self.block(i, true)?;
        let at = b.lower_bound(k);
        Ok((at < b.entries.len() && b.key(at) == k).then(|| IVec::from(b.value(at))))
    }

    /// Entries with keys in `lo..hi`, in key order.
    pub(crate) fn range(
        self: &Arc<Self>,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
    ) -> CheckpointIter {
        let (start, pos) = match &lo {
            Bound::Unbounded => (Ok(Some(0)), Pos::Start(None)),
            Bound::Included(k) => (self.block_for(k), Pos::Start(Some((k.clone(), true)))),
            Bound::Excluded(k) => (self.block_for(k), Pos::Start(Some((k.clone(), false)))),
        };
        let (block, failed) = match start {
            Ok(b) => (b.unwrap_or(0), None),
            Err(e) => (0, Some(e)),
        };
        CheckpointIter {
            file: self.clone(),
            block,
            pos,
            current: None,
            hi,
            done: self.block_count() == 0,
            failed,
        }
    }
}

enum Pos {
    /// Not positioned yet: at the first key `>=` (or `>`) this one.
    Start(Option<(Vec<u8>, bool)>),
    At(usize),
}

/// A range scan of a checkpoint (from [`CheckpointFile::range`]).
pub(crate) struct CheckpointIter {
    file: Arc<CheckpointFile>,
    block: u64,
    pos: Pos,
    current: Option<Arc<Block>>,
    hi: Bound<Vec<u8>>,
    done: bool,
    /// Finding the first block failed: the scan yields this error and ends.
    failed: Option<IndexError>,
}

impl Iterator for CheckpointIter {
    type Item = Result<(IVec, IVec), IndexError>;

    fn next(&mut self) -> Option<Self::Item> {
        if let Some(e) = self.failed.take() {
            self.done = true;
            return Some(Err(e));
        }
        loop {
            if self.done {
                return None;
            }
            let b = match &self.current {
                Some(b) => b.clone(),
                None => match self
                    .file
                    .block(self.block, matches!(self.pos, Pos::Start(_)))
                {
                    Ok(b) => {
                        self.current = Some(b.clone());
                        b
                    }
                    Err(e) => {
                        self.done = true;
                        return Some(Err(e));
                    }
                },
            };
            let i = match &self.pos {
                Pos::At(i) => *i,
                Pos::Start(None) => 0,
                Pos::Start(Some((k, incl))) => {
                    let i = b.lower_bound(k);
                    if !incl && i < b.entries.len() && b.key(i) == k.as_slice() {
                        i + 1
                    } else {
                        i
                    }
                }
            };
            if i >= b.entries.len() {
                self.block += 1;
                self.current = None;
                self.pos = Pos::At(0);
                if self.block >= self.file.block_count() {
                    self.done = true;
                }
                continue;
            }
            let k = b.key(i);
            let past = match &self.hi {
                Bound::Unbounded => false,
                Bound::Included(h) => k > h.as_slice(),
                Bound::Excluded(h) => k >= h.as_slice(),
            };
            if past {
                self.done = true;
                return None;
            }
            self.pos = Pos::At(i + 1);
            return Some(Ok((IVec::from(k), IVec::from(b.value(i)))));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::block_index::{encode_block_index, BlockRef, CHUNK_BLOCKS};
    use super::super::format::{push_entry, Header, SegmentEnd, FORMAT_VERSION_FLAT};
    use super::super::write::write_checkpoint;
    use super::*;
    use crate::vfs::OsVfs;
    use std::collections::BTreeMap;

    /// Entries per data block of [`entries`]: entries of 1117 to 1123 bytes, of which
    /// this many are the first to reach the writer's block target.
    const PER_BLOCK: usize = format::BLOCK_BYTES_TARGET / 1117 + 1;
    const _: () = assert!(
        (PER_BLOCK - 1) * 1123 < format::BLOCK_BYTES_TARGET
            && PER_BLOCK * 1117 >= format::BLOCK_BYTES_TARGET
    );

    /// Keys and values making `blocks` data blocks.
    fn entries(blocks: usize) -> BTreeMap<Vec<u8>, Vec<u8>> {
        (0..(blocks * PER_BLOCK) as u32)
            .map(|i| {
                // Every other key, so that absent keys lie between present ones.
                let k = format!("k{:08}", 2 * i).into_bytes();
                let v = vec![(i % 251) as u8; 1100 + (i % 7) as usize];
                (k, v)
            })
            .collect()
    }

    fn header(entries: u64) -> Header {
        Header {
            index_format: 1,
            layout: 7,
            seq: 1,
            commit_id: uuid::Uuid::from_u128(1),
            segment: 1,
            offset: 64,
            last_ts: 0,
            entries,
            indexers: vec![("t".into(), 1)],
            segments: vec![SegmentEnd {
                id: 1,
                first_seq: 1,
                end: 128,
                header: Some(crate::format::SegmentHeader {
                    data_start: crate::format::SEGMENT_HEADER_BYTES,
                    compacted: None,
                }),
            }],
        }
    }

    fn write(dir: &Path, want: &BTreeMap<Vec<u8>, Vec<u8>>) -> PathBuf {
        let it = want.iter().map(Ok::<_, String>);
        write_checkpoint(&OsVfs, dir, header(0), it, 0).unwrap()
    }

    /// The same entries in format version 1: the same blocks, one flat block
    /// index, as that version's writer laid them out.
    fn write_flat(path: &Path, want: &BTreeMap<Vec<u8>, Vec<u8>>) {
        let mut file = header(want.len() as u64).encode_as(FORMAT_VERSION_FLAT);
        let mut blocks = Vec::new();
        let all: Vec<_> = want.iter().collect();
        for run in all.chunks(PER_BLOCK) {
            let mut b = Vec::new();
            for (k, v) in run {
                push_entry(&mut b, k, v);
            }
            let c = format::crc(&b);
            b.extend_from_slice(&c.to_le_bytes());
            blocks.push(BlockRef {
                first_key: run[0].0.clone(),
                offset: file.len() as u64,
                len: b.len() as u32,
            });
            file.extend_from_slice(&b);
        }
        let index = encode_block_index(&blocks);
        let footer = Footer {
            index_offset: file.len() as u64,
            index_len: index.len() as u64,
            index_crc: format::crc(&index),
        };
        file.extend_from_slice(&index);
        file.extend_from_slice(&footer.encode());
        std::fs::write(path, file).unwrap();
    }

    /// Every present and absent key, and scans from assorted bounds, answer as the map.
    fn check_answers(ck: &Arc<CheckpointFile>, want: &BTreeMap<Vec<u8>, Vec<u8>>) {
        for (i, (k, v)) in want.iter().enumerate() {
            assert_eq!(ck.get(k).unwrap().as_deref(), Some(&v[..]), "key {i}");
            let mut absent = k.clone();
            absent.push(b'x');
            assert_eq!(ck.get(&absent).unwrap(), None, "after key {i}");
        }
        assert_eq!(ck.get(b"a").unwrap(), None);
        assert_eq!(ck.get(b"z").unwrap(), None);
        let keys: Vec<&Vec<u8>> = want.keys().collect();
        let chunk = CHUNK_BLOCKS * PER_BLOCK;
        for lo in [
            0,
            1,
            29,
            30,
            31,
            chunk - 1,
            chunk,
            chunk + 1,
            keys.len() - 1,
        ] {
            for hi in [lo + 1, lo + 40, lo + 5000] {
                let lo_k = keys[lo].clone();
                let hi_k = keys.get(hi).map(|k| (*k).clone());
                let hi_b = hi_k.clone().map_or(Bound::Unbounded, Bound::Excluded);
                let got: Vec<(IVec, IVec)> = ck
                    .range(Bound::Included(lo_k.clone()), hi_b)
                    .map(Result::unwrap)
                    .collect();
                let expected: Vec<_> = match &hi_k {
                    Some(h) => want.range(lo_k.clone()..h.clone()).collect(),
                    None => want.range(lo_k.clone()..).collect(),
                };
                assert_eq!(got.len(), expected.len(), "scan {lo}..{hi}");
                for ((gk, gv), (wk, wv)) in got.iter().zip(expected) {
                    assert_eq!((&gk[..], &gv[..]), (&wk[..], &wv[..]), "scan {lo}..{hi}");
                }
                let after: Vec<_> = ck
                    .range(Bound::Excluded(lo_k.clone()), Bound::Unbounded)
                    .take(3)
                    .map(|kv| kv.unwrap().0)
                    .collect();
                let want_after: Vec<_> = want
                    .range((Bound::Excluded(lo_k.clone()), Bound::Unbounded))
                    .take(3)
                    .map(|(k, _)| IVec::from(&k[..]))
                    .collect();
                assert_eq!(after, want_after, "scan after {lo}");
            }
        }
    }

    #[test]
    fn a_checkpoint_of_several_index_chunks_answers_as_its_entries() {
        let dir = tempfile::tempdir().unwrap();
        let want = entries(3 * CHUNK_BLOCKS + 5);
        let path = write(dir.path(), &want);
        let ck = Arc::new(CheckpointFile::open(&OsVfs, &path).unwrap());
        let Blocks::Chunked { top, .. } = &ck.blocks else {
            panic!("a new checkpoint has a top index");
        };
        assert_eq!(top.block_count(), (3 * CHUNK_BLOCKS + 5) as u64);
        assert_eq!(top.chunk_of(top.block_count() - 1), 3);
        // A scan of every block keeps only the one it started in.
        let all = ck.range(Bound::Unbounded, Bound::Unbounded).count();
        assert_eq!(all, want.len());
        assert_eq!(ck.cache.lock().unwrap().len(), 1);
        check_answers(&ck, &want);
    }

    #[test]
    fn a_flat_block_index_of_the_first_format_is_still_read() {
        let dir = tempfile::tempdir().unwrap();
        let want = entries(CHUNK_BLOCKS + 3);
        let path = dir.path().join("flat.ckpt");
        write_flat(&path, &want);
        let ck = Arc::new(CheckpointFile::open(&OsVfs, &path).unwrap());
        assert!(matches!(ck.blocks, Blocks::Flat(_)));
        check_answers(&ck, &want);
    }

    #[test]
    fn a_damaged_chunk_fails_the_reads_that_need_it_naming_the_file_and_offset() {
        let dir = tempfile::tempdir().unwrap();
        let want = entries(2 * CHUNK_BLOCKS + 5);
        let path = write(dir.path(), &want);
        let Blocks::Chunked { top, .. } = &CheckpointFile::open(&OsVfs, &path).unwrap().blocks
        else {
            panic!("a new checkpoint has a top index");
        };
        let second = top.at(1);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[second.offset as usize + 9] ^= 0x10;
        std::fs::write(&path, &bytes).unwrap();
        // The open reads the top index only: it succeeds.
        let ck = Arc::new(CheckpointFile::open(&OsVfs, &path).unwrap());
        let keys: Vec<&Vec<u8>> = want.keys().collect();
        assert!(ck.get(keys[0]).unwrap().is_some());
        let in_second = keys[CHUNK_BLOCKS * PER_BLOCK + 40];
        let e = ck.get(in_second).unwrap_err().to_string();
        assert!(
            e.contains(&*path.to_string_lossy())
                && e.contains(&format!("offset {}", second.offset)),
            "{e}"
        );
        let scan: Vec<_> = ck
            .range(Bound::Included(keys[0].clone()), Bound::Unbounded)
            .collect();
        assert!(scan.last().unwrap().is_err(), "a scan ends with the error");
        assert_eq!(scan.len(), CHUNK_BLOCKS * PER_BLOCK + 1);
    }
}
