//! A checkpoint's block index: where each data block is and its first key, in two
//! levels so that an open reads a small top index and a lookup one chunk of it,
//! whatever the checkpoint's size (a million-commit store's checkpoint has about
//! eighty thousand blocks; reading their whole index was most of what a read-only
//! open of it read). The byte layout is in [`super::format`]'s documentation.
//!
//! A chunk is checked (crc, bounds, order, and that it agrees with the top index)
//! when it is first read; a chunk that fails is an error naming the file and offset,
//! as a data block that fails is.

use super::format::{crc, Cursor, BLOCK_INDEX_BYTES_MAX};

/// Blocks per chunk of the block index: a chunk is about 8 KiB, and the top index of a
/// million-commit store's checkpoint (about eighty thousand blocks) under 20 KiB.
pub(crate) const CHUNK_BLOCKS: usize = 256;

/// A block's place in the file and its first key.
#[derive(Debug, Clone)]
pub(crate) struct BlockRef {
    pub first_key: Vec<u8>,
    pub offset: u64,
    /// Bytes of the block, its trailing crc included.
    pub len: u32,
}

pub(crate) fn encode_block_index(blocks: &[BlockRef]) -> Vec<u8> {
    let mut b = Vec::new();
    b.extend_from_slice(&(blocks.len() as u32).to_le_bytes());
    for r in blocks {
        b.extend_from_slice(&(r.first_key.len() as u32).to_le_bytes());
        b.extend_from_slice(&r.first_key);
        b.extend_from_slice(&r.offset.to_le_bytes());
        b.extend_from_slice(&r.len.to_le_bytes());
    }
    b
}

/// Where one block is, as the block index gives it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct BlockAt {
    /// The block's first key: `key_len` bytes at `key_at` of the block index.
    key_at: u32,
    key_len: u32,
    pub offset: u64,
    /// Bytes of the block, its trailing crc included.
    pub len: u32,
}

/// A decoded block index: its bytes as read and one fixed-size [`BlockAt`] per
/// block whose first key is a slice of them, so an open allocates two buffers, not
/// one per block (a million-commit store's checkpoint has about ten thousand).
#[derive(Debug)]
pub(crate) struct BlockIndex {
    bytes: Vec<u8>,
    blocks: Vec<BlockAt>,
}

impl BlockIndex {
    pub(crate) fn len(&self) -> usize {
        self.blocks.len()
    }

    pub(crate) fn at(&self, i: usize) -> BlockAt {
        self.blocks[i]
    }

    pub(crate) fn first_key(&self, i: usize) -> &[u8] {
        let b = &self.blocks[i];
        // In bounds: checked by `decode_block_index`.
        &self.bytes[b.key_at as usize..b.key_at as usize + b.key_len as usize]
    }

    /// The number of blocks whose first key is `<= k`.
    pub(crate) fn count_at_or_below(&self, k: &[u8]) -> usize {
        let (mut lo, mut hi) = (0, self.blocks.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.first_key(mid) <= k {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo
    }
}

/// The block index in `b` (its crc already checked); every block must lie in
/// `data_start..data_end`, in order, not overlapping, and first keys must increase.
pub(crate) fn decode_block_index(
    b: Vec<u8>,
    data_start: u64,
    data_end: u64,
) -> Result<BlockIndex, (u64, String)> {
    // The block index is at most `BLOCK_INDEX_BYTES_MAX`, so positions in it fit a u32.
    if b.len() as u64 > BLOCK_INDEX_BYTES_MAX {
        return Err((0, format!("block index of {} bytes", b.len())));
    }
    let mut r = Cursor { b: &b, at: 0 };
    let n = r.u32()? as usize;
    // Each entry is at least 16 bytes: a count past that is damage, not an allocation.
    if n > b.len() / 16 {
        return Err((
            0,
            format!("block count {n} larger than the block index holds"),
        ));
    }
    let mut out: Vec<BlockAt> = Vec::with_capacity(n);
    let mut next = data_start;
    let mut prev_key: Option<&[u8]> = None;
    for _ in 0..n {
        let at = r.at as u64;
        let klen = r.u32()? as usize;
        let key_at = r.at;
        let first_key = r.take(klen)?;
        let offset = r.u64()?;
        let len = r.u32()?;
        if offset != next || u64::from(len) < 4 || offset + u64::from(len) > data_end {
            return Err((at, "block out of place".into()));
        }
        if prev_key.is_some_and(|p| p >= first_key) {
            return Err((at, "block first keys do not increase".into()));
        }
        prev_key = Some(first_key);
        next = offset + u64::from(len);
        out.push(BlockAt {
            key_at: key_at as u32,
            key_len: klen as u32,
            offset,
            len,
        });
    }
    if r.at != b.len() {
        return Err((r.at as u64, "bytes after the block index".into()));
    }
    if next != data_end {
        return Err((0, "blocks do not cover the data".into()));
    }
    Ok(BlockIndex {
        bytes: b,
        blocks: out,
    })
}

/// The chunks (each with its crc) and the top index that follow the blocks, the chunks
/// starting at file offset `at`: `(chunks, top)`.
#[cfg(test)]
pub(crate) fn encode_two_level(blocks: &[BlockRef], at: u64) -> (Vec<u8>, Vec<u8>) {
    let mut w = TwoLevelWriter::default();
    for b in blocks {
        w.push(b.clone());
    }
    w.finish(at)
}

/// A block index built as the blocks are written: each run of [`CHUNK_BLOCKS`] blocks
/// is encoded once it is complete, so a writer holds the encoded chunks (about 50
/// bytes per block) and one entry per chunk, not a [`BlockRef`] and its key's own
/// allocation for every block of the checkpoint.
#[derive(Default)]
pub(crate) struct TwoLevelWriter {
    run: Vec<BlockRef>,
    chunks: Vec<u8>,
    tops: Vec<TopEntry>,
}

/// A chunk's entry in the top index, its offset relative to the first chunk.
struct TopEntry {
    first_key: Vec<u8>,
    chunk_offset: u64,
    len: u32,
    blocks: u32,
    first_block_offset: u64,
}

impl TwoLevelWriter {
    pub(crate) fn push(&mut self, block: BlockRef) {
        self.run.push(block);
        if self.run.len() == CHUNK_BLOCKS {
            self.seal();
        }
    }

    fn seal(&mut self) {
        let Some(first) = self.run.first() else {
            return;
        };
        let start = self.chunks.len();
        let body = encode_block_index(&self.run);
        let c = crc(&body);
        self.chunks.extend_from_slice(&body);
        self.chunks.extend_from_slice(&c.to_le_bytes());
        self.tops.push(TopEntry {
            first_key: first.first_key.clone(),
            chunk_offset: start as u64,
            len: (self.chunks.len() - start) as u32,
            blocks: self.run.len() as u32,
            first_block_offset: first.offset,
        });
        self.run.clear();
    }

    /// The chunks and the top index, the chunks to be written at file offset `at`.
    pub(crate) fn finish(mut self, at: u64) -> (Vec<u8>, Vec<u8>) {
        self.seal();
        let mut top = Vec::new();
        top.extend_from_slice(&(self.tops.len() as u32).to_le_bytes());
        for t in &self.tops {
            top.extend_from_slice(&(t.first_key.len() as u32).to_le_bytes());
            top.extend_from_slice(&t.first_key);
            top.extend_from_slice(&(at + t.chunk_offset).to_le_bytes());
            top.extend_from_slice(&t.len.to_le_bytes());
            top.extend_from_slice(&t.blocks.to_le_bytes());
            top.extend_from_slice(&t.first_block_offset.to_le_bytes());
        }
        (self.chunks, top)
    }
}

/// Where one chunk of the block index is, as the top index gives it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ChunkAt {
    /// The chunk's first key (its first block's): `key_len` bytes at `key_at` of the
    /// top index.
    key_at: u32,
    key_len: u32,
    /// The chunk's bytes in the file, its crc included.
    pub offset: u64,
    pub len: u32,
    /// Number (in the whole file) of its first block, and how many it lists.
    pub first_block: u64,
    pub blocks: u32,
    /// The file range its blocks cover.
    pub data_start: u64,
    pub data_end: u64,
}

/// A decoded top index: its bytes and one [`ChunkAt`] per chunk.
#[derive(Debug)]
pub(crate) struct TopIndex {
    bytes: Vec<u8>,
    chunks: Vec<ChunkAt>,
    blocks: u64,
}

impl TopIndex {
    /// Number of data blocks in the file.
    pub(crate) fn block_count(&self) -> u64 {
        self.blocks
    }

    pub(crate) fn at(&self, c: usize) -> ChunkAt {
        self.chunks[c]
    }

    pub(crate) fn first_key(&self, c: usize) -> &[u8] {
        let ch = &self.chunks[c];
        // In bounds: checked by `decode_top_index`.
        &self.bytes[ch.key_at as usize..ch.key_at as usize + ch.key_len as usize]
    }

    /// The chunk whose first key is the last `<= k`, if any.
    pub(crate) fn chunk_for(&self, k: &[u8]) -> Option<usize> {
        let (mut lo, mut hi) = (0, self.chunks.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.first_key(mid) <= k {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.checked_sub(1)
    }

    /// The chunk that lists block `block` (`block < block_count()`).
    pub(crate) fn chunk_of(&self, block: u64) -> usize {
        let (mut lo, mut hi) = (0, self.chunks.len());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.chunks[mid].first_block <= block {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        lo.saturating_sub(1)
    }
}

/// The top index in `b` (its crc already checked), which starts at file offset
/// `top_offset`; the blocks start at `data_start`. Chunks must lie one after another
/// right before the top index, their blocks one after another from `data_start` up to
/// the first chunk, each chunk listing at least one block, and first keys must
/// increase.
pub(crate) fn decode_top_index(
    b: Vec<u8>,
    data_start: u64,
    top_offset: u64,
) -> Result<TopIndex, (u64, String)> {
    if b.len() as u64 > BLOCK_INDEX_BYTES_MAX {
        return Err((0, format!("top index of {} bytes", b.len())));
    }
    let mut r = Cursor { b: &b, at: 0 };
    let n = r.u32()? as usize;
    // Each entry is at least 28 bytes: a count past that is damage, not an allocation.
    if n > b.len() / 28 {
        return Err((
            0,
            format!("chunk count {n} larger than the top index holds"),
        ));
    }
    let mut chunks: Vec<ChunkAt> = Vec::with_capacity(n);
    let mut prev_key: Option<&[u8]> = None;
    let mut blocks = 0u64;
    for _ in 0..n {
        let at = r.at as u64;
        let klen = r.u32()? as usize;
        let key_at = r.at;
        let first_key = r.take(klen)?;
        let offset = r.u64()?;
        let len = r.u32()?;
        let count = r.u32()?;
        let first_data = r.u64()?;
        if prev_key.is_some_and(|p| p >= first_key) {
            return Err((at, "chunk first keys do not increase".into()));
        }
        prev_key = Some(first_key);
        // A chunk holds at least its count, one 16-byte entry and its crc; its blocks
        // start where the previous chunk's end (the first chunk's at `data_start`).
        let placed = match chunks.last() {
            None => first_data == data_start,
            Some(p) => p.offset + u64::from(p.len) == offset && first_data > p.data_start,
        };
        if count == 0 || u64::from(len) < 24 || !placed || first_data >= offset {
            return Err((at, "chunk out of place".into()));
        }
        if let Some(p) = chunks.last_mut() {
            p.data_end = first_data;
        }
        chunks.push(ChunkAt {
            key_at: key_at as u32,
            key_len: klen as u32,
            offset,
            len,
            first_block: blocks,
            blocks: count,
            data_start: first_data,
            data_end: first_data,
        });
        blocks += u64::from(count);
    }
    if r.at != b.len() {
        return Err((r.at as u64, "bytes after the top index".into()));
    }
    // The blocks end where the chunks start; the chunks end at the top index.
    let chunks_start = chunks.first().map(|c| c.offset);
    match (chunks_start, chunks.last_mut()) {
        (Some(start), Some(last)) => {
            last.data_end = start;
            if last.data_start >= last.data_end || last.offset + u64::from(last.len) != top_offset {
                return Err((0, "chunks do not end at the top index".into()));
            }
        }
        _ if top_offset != data_start => return Err((0, "data but no chunks".into())),
        _ => {}
    }
    Ok(TopIndex {
        bytes: b,
        chunks,
        blocks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` blocks of 100 bytes each from offset 64, first keys `b0000`, `b0001`, ...
    fn blocks(n: usize) -> Vec<BlockRef> {
        (0..n)
            .map(|i| BlockRef {
                first_key: format!("b{i:04}").into_bytes(),
                offset: 64 + 100 * i as u64,
                len: 100,
            })
            .collect()
    }

    #[test]
    fn the_two_levels_decode_as_encoded() {
        let refs = blocks(3 * CHUNK_BLOCKS + 7);
        let data_end = 64 + 100 * refs.len() as u64;
        let (chunks, top) = encode_two_level(&refs, data_end);
        let top_at = data_end + chunks.len() as u64;
        let t = decode_top_index(top, 64, top_at).unwrap();
        assert_eq!(t.block_count(), refs.len() as u64);
        for c in 0..4 {
            let ch = t.at(c);
            let body = (ch.offset - data_end) as usize
                ..(ch.offset - data_end) as usize + ch.len as usize - 4;
            let idx =
                decode_block_index(chunks[body].to_vec(), ch.data_start, ch.data_end).unwrap();
            assert_eq!(idx.len() as u32, ch.blocks);
            for i in 0..idx.len() {
                let r = &refs[ch.first_block as usize + i];
                assert_eq!(idx.first_key(i), r.first_key.as_slice());
                assert_eq!(idx.at(i).offset, r.offset);
            }
            assert_eq!(t.chunk_of(ch.first_block), c);
            assert_eq!(t.chunk_for(t.first_key(c)), Some(c));
        }
        assert_eq!(t.chunk_for(b"a"), None);
        assert_eq!(t.chunk_for(b"c"), Some(3));
        // No blocks: no chunks, an empty top index.
        let (chunks, top) = encode_two_level(&[], 64);
        assert!(chunks.is_empty());
        assert_eq!(decode_top_index(top, 64, 64).unwrap().block_count(), 0);
    }

    /// Every byte of a top index and of a chunk set to other values (their CRCs are
    /// the caller's; these are the bytes a CRC would not catch): decoding never
    /// panics, and what decodes still places its chunks and blocks in the file.
    #[test]
    fn changed_index_bytes_never_panic_and_what_decodes_is_in_place() {
        let refs = blocks(2 * CHUNK_BLOCKS + 3);
        let data_end = 64 + 100 * refs.len() as u64;
        let (chunks, top) = encode_two_level(&refs, data_end);
        let top_at = data_end + chunks.len() as u64;
        for i in 0..top.len() {
            for v in [0u8, 1, 0x7f, 0x80, 0xff, top[i] ^ 0x10] {
                let mut b = top.clone();
                b[i] = v;
                if let Ok(t) = decode_top_index(b, 64, top_at) {
                    for c in 0..3 {
                        let ch = t.at(c);
                        assert!(64 <= ch.data_start && ch.data_start < ch.data_end);
                        assert!(ch.data_end <= data_end && ch.offset >= ch.data_end);
                        assert!(ch.offset + u64::from(ch.len) <= top_at);
                    }
                }
            }
        }
        let first = CHUNK_BLOCKS * (4 + 5 + 8 + 4) + 4;
        for i in 0..first {
            for v in [0u8, 1, 0x7f, 0xff, chunks[i] ^ 0x04] {
                let mut b = chunks[..first].to_vec();
                b[i] = v;
                if let Ok(idx) = decode_block_index(b, 64, 64 + 100 * CHUNK_BLOCKS as u64) {
                    for j in 0..idx.len() {
                        let at = idx.at(j);
                        assert!(at.offset >= 64 && at.offset + u64::from(at.len) <= data_end);
                    }
                }
            }
        }
    }
}
