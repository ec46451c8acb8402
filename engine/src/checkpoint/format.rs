//! The byte layout of a checkpoint file (all integers little-endian; docs/format.md has
//! it byte by byte):
//!
//! ```text
//! header       magic "SPOOLCKP", format version u32, header length u32 (all of the
//!              header, its crc included), index format version u32, layout id u64,
//!              seq u64, commit id [16], segment id u64, record offset u64, last
//!              timestamp i64, entries u64, indexer count u32, per indexer (name
//!              length u16, name, version u32), segment count u32, per segment in log
//!              order up to the checkpoint's (id u64, first seq u64, end u64), crc u32
//! blocks       per block: entries (key length u32, key, value length u32, value), in
//!              strictly increasing key order across the file, then crc u32
//! chunks       the block index in runs of at most `CHUNK_BLOCKS` blocks, per run:
//!              block count u32, per block (first key length u32, first key, offset
//!              u64, length u32 with the crc), then crc u32
//! top index    chunk count u32, per chunk (first key length u32, first key, offset
//!              u64, length u32 with the crc, block count u32, offset of its first
//!              block u64)
//! footer       top index offset u64, top index length u64, top index crc u32,
//!              footer crc u32 (of the 20 bytes before it), magic "SPOOLCKE"
//! ```
//!
//! Format version 1 (still read) had one flat block index where version 2 has the
//! chunks and the top index: the footer pointed at it, and it was the encoding of one
//! chunk without the crc.
//!
//! Every crc is CRC-32 (IEEE, `crc32fast`).

use uuid::Uuid;

pub(crate) const MAGIC: [u8; 8] = *b"SPOOLCKP";
pub(crate) const FOOTER_MAGIC: [u8; 8] = *b"SPOOLCKE";
/// Version of the checkpoint layout written; [`FORMAT_VERSION_FLAT`] is read too, any
/// other is not used (the open falls back).
pub(crate) const FORMAT_VERSION: u32 = 2;
/// The layout whose block index is one flat list (no chunks, no top index).
pub(crate) const FORMAT_VERSION_FLAT: u32 = 1;
pub(crate) const FOOTER_BYTES: u64 = 32;
/// Bytes of entries after which a block is closed (a larger entry makes a block of
/// its own). A point lookup reads and checks one whole block: a page-sized block keeps
/// a short-lived reader's few lookups from copying and faulting in 32 KiB each, which
/// was what kept `show` behind SQLite (BENCHMARKS.md, Decisions).
pub(crate) const BLOCK_BYTES_TARGET: usize = 4 << 10;
/// Largest header accepted (names and the segment table: far below this).
pub(crate) const HEADER_BYTES_MAX: u64 = 16 << 20;
/// Largest block accepted (one entry may be a large indexer value).
pub(crate) const BLOCK_BYTES_MAX: u64 = 1 << 30;
/// Largest block index chunk, and largest top index, accepted.
pub(crate) const BLOCK_INDEX_BYTES_MAX: u64 = 1 << 30;

/// Where a segment's records end, for a segment up to the checkpoint's position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentEnd {
    pub id: u64,
    pub first_seq: u64,
    pub end: u64,
}

/// What a checkpoint's header says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Header {
    pub index_format: u32,
    pub layout: u64,
    /// The last record the checkpoint holds: seq, commit id and where it starts.
    pub seq: u64,
    pub commit_id: Uuid,
    pub segment: u64,
    pub offset: u64,
    pub last_ts: i64,
    pub entries: u64,
    /// (name, version) of each indexer, in registration order.
    pub indexers: Vec<(String, u32)>,
    /// The segments in log order up to and including the one holding the record.
    pub segments: Vec<SegmentEnd>,
}

pub(crate) fn crc(bytes: &[u8]) -> u32 {
    crc32fast::hash(bytes)
}

impl Header {
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        b.extend_from_slice(&0u32.to_le_bytes()); // length, set below
        b.extend_from_slice(&self.index_format.to_le_bytes());
        b.extend_from_slice(&self.layout.to_le_bytes());
        b.extend_from_slice(&self.seq.to_le_bytes());
        b.extend_from_slice(self.commit_id.as_bytes());
        b.extend_from_slice(&self.segment.to_le_bytes());
        b.extend_from_slice(&self.offset.to_le_bytes());
        b.extend_from_slice(&self.last_ts.to_le_bytes());
        b.extend_from_slice(&self.entries.to_le_bytes());
        b.extend_from_slice(&(self.indexers.len() as u32).to_le_bytes());
        for (name, version) in &self.indexers {
            let n = &name.as_bytes()[..name.len().min(u16::MAX as usize)];
            b.extend_from_slice(&(n.len() as u16).to_le_bytes());
            b.extend_from_slice(n);
            b.extend_from_slice(&version.to_le_bytes());
        }
        b.extend_from_slice(&(self.segments.len() as u32).to_le_bytes());
        for s in &self.segments {
            b.extend_from_slice(&s.id.to_le_bytes());
            b.extend_from_slice(&s.first_seq.to_le_bytes());
            b.extend_from_slice(&s.end.to_le_bytes());
        }
        let len = (b.len() + 4) as u32;
        b[12..16].copy_from_slice(&len.to_le_bytes());
        let c = crc(&b);
        b.extend_from_slice(&c.to_le_bytes());
        b
    }

    /// The header in `b` (exactly the header's bytes, as long as its length field
    /// says), or where and why it does not decode.
    pub(crate) fn decode(b: &[u8]) -> Result<Header, (u64, String)> {
        if b.len() < 20 {
            return Err((0, "header shorter than its fixed part".into()));
        }
        let (body, tail) = b.split_at(b.len() - 4);
        let stored = u32::from_le_bytes(tail.try_into().unwrap_or_default());
        if crc(body) != stored {
            return Err((body.len() as u64, "header checksum mismatch".into()));
        }
        let mut r = Cursor { b: body, at: 0 };
        if r.take(8)? != MAGIC {
            return Err((0, "not a checkpoint (magic)".into()));
        }
        let version = r.u32()?;
        if version != FORMAT_VERSION && version != FORMAT_VERSION_FLAT {
            return Err((8, format!("checkpoint format version {version}")));
        }
        let _len = r.u32()?;
        let index_format = r.u32()?;
        let layout = r.u64()?;
        let seq = r.u64()?;
        let commit_id =
            Uuid::from_slice(r.take(16)?).map_err(|_| (r.at as u64, "commit id".to_string()))?;
        let segment = r.u64()?;
        let offset = r.u64()?;
        let last_ts = r.u64()? as i64;
        let entries = r.u64()?;
        let n = r.u32()?;
        let mut indexers = Vec::new();
        for _ in 0..n {
            let len = r.u16()? as usize;
            let at = r.at;
            let name = String::from_utf8(r.take(len)?.to_vec())
                .map_err(|_| (at as u64, "indexer name is not UTF-8".to_string()))?;
            indexers.push((name, r.u32()?));
        }
        let n = r.u32()?;
        let mut segments = Vec::new();
        for _ in 0..n {
            segments.push(SegmentEnd {
                id: r.u64()?,
                first_seq: r.u64()?,
                end: r.u64()?,
            });
        }
        if r.at != body.len() {
            return Err((r.at as u64, "bytes after the header's fields".into()));
        }
        Ok(Header {
            index_format,
            layout,
            seq,
            commit_id,
            segment,
            offset,
            last_ts,
            entries,
            indexers,
            segments,
        })
    }
}

pub(crate) struct Footer {
    pub index_offset: u64,
    pub index_len: u64,
    pub index_crc: u32,
}

impl Footer {
    pub(crate) fn encode(&self) -> [u8; FOOTER_BYTES as usize] {
        let mut b = [0u8; FOOTER_BYTES as usize];
        b[0..8].copy_from_slice(&self.index_offset.to_le_bytes());
        b[8..16].copy_from_slice(&self.index_len.to_le_bytes());
        b[16..20].copy_from_slice(&self.index_crc.to_le_bytes());
        let c = crc(&b[0..20]);
        b[20..24].copy_from_slice(&c.to_le_bytes());
        b[24..32].copy_from_slice(&FOOTER_MAGIC);
        b
    }

    pub(crate) fn decode(b: &[u8; FOOTER_BYTES as usize]) -> Result<Footer, String> {
        if b[24..32] != FOOTER_MAGIC {
            return Err("no footer (magic)".into());
        }
        let c = u32::from_le_bytes(b[20..24].try_into().unwrap_or_default());
        if crc(&b[0..20]) != c {
            return Err("footer checksum mismatch".into());
        }
        Ok(Footer {
            index_offset: u64::from_le_bytes(b[0..8].try_into().unwrap_or_default()),
            index_len: u64::from_le_bytes(b[8..16].try_into().unwrap_or_default()),
            index_crc: u32::from_le_bytes(b[16..20].try_into().unwrap_or_default()),
        })
    }
}

/// Appends one entry to a block being built.
pub(crate) fn push_entry(block: &mut Vec<u8>, key: &[u8], value: &[u8]) {
    block.extend_from_slice(&(key.len() as u32).to_le_bytes());
    block.extend_from_slice(key);
    block.extend_from_slice(&(value.len() as u32).to_le_bytes());
    block.extend_from_slice(value);
}

/// The entries of a block's bytes (its crc checked and removed by the caller), as
/// (key start, key end, value start, value end); keys must increase.
pub(crate) fn parse_block(b: &[u8]) -> Result<Vec<[u32; 4]>, (u64, String)> {
    let mut r = Cursor { b, at: 0 };
    let mut out = Vec::new();
    let mut prev: Option<(usize, usize)> = None;
    while r.at < b.len() {
        let at = r.at as u64;
        let klen = r.u32()? as usize;
        let k0 = r.at;
        r.take(klen)?;
        let vlen = r.u32()? as usize;
        let v0 = r.at;
        r.take(vlen)?;
        if let Some((p0, p1)) = prev {
            if b[p0..p1] >= b[k0..k0 + klen] {
                return Err((at, "keys do not increase".into()));
            }
        }
        prev = Some((k0, k0 + klen));
        out.push([k0 as u32, (k0 + klen) as u32, v0 as u32, (v0 + vlen) as u32]);
    }
    Ok(out)
}

/// Bounds-checked reads of little-endian fields; errors carry the offset.
pub(super) struct Cursor<'a> {
    pub b: &'a [u8],
    pub at: usize,
}

impl<'a> Cursor<'a> {
    pub fn take(&mut self, n: usize) -> Result<&'a [u8], (u64, String)> {
        let end = self
            .at
            .checked_add(n)
            .filter(|e| *e <= self.b.len())
            .ok_or_else(|| {
                (
                    self.at as u64,
                    format!("a {n}-byte field runs past the end"),
                )
            })?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    pub fn u16(&mut self) -> Result<u16, (u64, String)> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn u32(&mut self) -> Result<u32, (u64, String)> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().unwrap_or_default(),
        ))
    }
    pub fn u64(&mut self) -> Result<u64, (u64, String)> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().unwrap_or_default(),
        ))
    }
}
