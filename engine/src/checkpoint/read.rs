//! Opening a checkpoint (footer, block index and header checked, nothing else read)
//! and reading it: point lookups and range scans load the blocks they need with one
//! `pread` each, check the block's crc and keep the last few decoded.
//!
//! A block whose crc fails is an error naming the file and offset: the reader never
//! answers from it. The checkpoint was already chosen over the log when that is found,
//! so the read fails rather than answer from the log behind the caller's back.

use super::format::{self, BlockIndex, Footer, Header, FOOTER_BYTES};
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

/// An open, validated checkpoint file.
pub(crate) struct CheckpointFile {
    pub path: PathBuf,
    file: Arc<dyn VfsFile>,
    pub header: Header,
    blocks: BlockIndex,
    cache: Mutex<Vec<(usize, Arc<Block>)>>,
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
        let blocks = format::decode_block_index(ib, header_len, data_end)
            .map_err(|(off, e)| at(data_end + off, &e))?;
        if header.entries > 0 && blocks.is_empty() || header.entries == 0 && !blocks.is_empty() {
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

    fn block(&self, i: usize) -> Result<Arc<Block>, IndexError> {
        {
            let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(p) = c.iter().position(|(n, _)| *n == i) {
                let hit = c.remove(p);
                let b = hit.1.clone();
                c.push(hit);
                return Ok(b);
            }
        }
        let r = self.blocks.at(i);
        // The block index bounded every block by the file's size when it was opened.
        let mut buf = vec![0u8; r.len as usize];
        self.file
            .read_at(&mut buf, r.offset)
            .map_err(|e| self.malformed(r.offset, &format!("read: {e}")))?;
        let n = buf.len() - 4;
        let stored = u32::from_le_bytes(buf[n..].try_into().unwrap_or_default());
        if format::crc(&buf[..n]) != stored {
            return Err(self.malformed(r.offset, "block checksum mismatch"));
        }
        buf.truncate(n);
        let entries =
            format::parse_block(&buf).map_err(|(off, e)| self.malformed(r.offset + off, &e))?;
        let block = Block {
            bytes: buf,
            entries,
        };
        if block.entries.is_empty() || block.key(0) != self.blocks.first_key(i) {
            return Err(self.malformed(r.offset, "block's first key differs from its index"));
        }
        let block = Arc::new(block);
        let mut c = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        if c.len() >= BLOCK_CACHE_BLOCKS {
            c.remove(0);
        }
        c.push((i, block.clone()));
        Ok(block)
    }

    /// The block that would hold `k` (the last whose first key is `<= k`).
    fn block_for(&self, k: &[u8]) -> Option<usize> {
        let n = self.blocks.count_at_or_below(k);
        n.checked_sub(1)
    }

    pub(crate) fn get(&self, k: &[u8]) -> Result<Option<IVec>, IndexError> {
        let Some(i) = self.block_for(k) else {
            return Ok(None);
        };
        let b = self.block(i)?;
        let at = b.lower_bound(k);
        Ok((at < b.entries.len() && b.key(at) == k).then(|| IVec::from(b.value(at))))
    }

    /// Entries with keys in `lo..hi`, in key order.
    pub(crate) fn range(
        self: &Arc<Self>,
        lo: Bound<Vec<u8>>,
        hi: Bound<Vec<u8>>,
    ) -> CheckpointIter {
        let (block, pos) = match &lo {
            Bound::Unbounded => (0, Pos::Start(None)),
            Bound::Included(k) => (
                self.block_for(k).unwrap_or(0),
                Pos::Start(Some((k.clone(), true))),
            ),
            Bound::Excluded(k) => (
                self.block_for(k).unwrap_or(0),
                Pos::Start(Some((k.clone(), false))),
            ),
        };
        CheckpointIter {
            file: self.clone(),
            block,
            pos,
            current: None,
            hi,
            done: self.blocks.is_empty(),
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
    block: usize,
    pos: Pos,
    current: Option<Arc<Block>>,
    hi: Bound<Vec<u8>>,
    done: bool,
}

impl Iterator for CheckpointIter {
    type Item = Result<(IVec, IVec), IndexError>;

    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if self.done {
                return None;
            }
            let b = match &self.current {
                Some(b) => b.clone(),
                None => match self.file.block(self.block) {
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
                if self.block >= self.file.blocks.len() {
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
