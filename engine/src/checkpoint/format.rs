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
/// Version of the checkpoint layout written; [`FORMAT_VERSION_UNHEADED`] and
/// [`FORMAT_VERSION_FLAT`] are read too, any other is not used (the open falls back).
pub(crate) const FORMAT_VERSION: u32 = 3;
/// The layout whose segment table has no segment headers (a reader opens a GC'd log's
/// segments to read them).
pub(crate) const FORMAT_VERSION_UNHEADED: u32 = 2;
/// The layout whose block index is one flat list (no chunks, no top index), and whose
/// segment table has no segment headers.
pub(crate) const FORMAT_VERSION_FLAT: u32 = 1;
/// Flags of a segment in the table: bit 0, written by GC (its seq range follows).
const SEGMENT_FLAG_COMPACTED: u8 = 1;
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
    /// The segment's header as the owner had it (`None` in a checkpoint of a format
    /// before [`FORMAT_VERSION`], which did not record it).
    pub header: Option<crate::format::SegmentHeader>,
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
        self.encode_as(FORMAT_VERSION)
    }

    /// The header as checkpoint format `version` lays it out: before
    /// [`FORMAT_VERSION`], without the segments' headers (older files, for tests).
    pub(crate) fn encode_as(&self, version: u32) -> Vec<u8> {
        let mut b = Vec::with_capacity(128);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&version.to_le_bytes());
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
            if version != FORMAT_VERSION {
                continue;
            }
            // A segment without a header known is written as a plain one: the owner
            // writes the table from segments it opened, which all have one.
            let h = s.header.unwrap_or(crate::format::SegmentHeader {
                data_start: crate::format::SEGMENT_HEADER_BYTES,
                compacted: None,
            });
            b.extend_from_slice(&h.data_start.to_le_bytes());
            let (flags, (first, last)) = match h.compacted {
                Some(range) => (SEGMENT_FLAG_COMPACTED, range),
                None => (0, (0, 0)),
            };
            b.push(flags);
            b.extend_from_slice(&first.to_le_bytes());
            b.extend_from_slice(&last.to_le_bytes());
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
        if ![FORMAT_VERSION, FORMAT_VERSION_UNHEADED, FORMAT_VERSION_FLAT].contains(&version) {
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
            let (id, first_seq, end) = (r.u64()?, r.u64()?, r.u64()?);
            let header = match version {
                FORMAT_VERSION => {
                    let data_start = r.u64()?;
                    let at = r.at as u64;
                    let flags = r.take(1)?[0];
                    let range = (r.u64()?, r.u64()?);
                    let compacted = match flags {
                        0 => None,
                        SEGMENT_FLAG_COMPACTED if range.0 <= range.1 => Some(range),
                        _ => return Err((at, format!("segment {id}: flags {flags:#x}"))),
                    };
                    if data_start < crate::format::SEGMENT_HEADER_BYTES || data_start > end {
                        return Err((at - 8, format!("segment {id}: data start {data_start}")));
                    }
                    Some(crate::format::SegmentHeader {
                        data_start,
                        compacted,
                    })
                }
                _ => None,
            };
            segments.push(SegmentEnd {
                id,
                first_seq,
                end,
                header,
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{SegmentHeader, SEGMENT_HEADER_BYTES};

    fn header(segments: Vec<SegmentEnd>) -> Header {
        Header {
            index_format: 2,
            layout: 7,
            seq: 9,
            commit_id: Uuid::from_u128(3),
            segment: 8,
            offset: 100,
            last_ts: 5,
            entries: 4,
            indexers: vec![("t".into(), 1)],
            segments,
        }
    }

    fn segment(id: u64, compacted: Option<(u64, u64)>) -> SegmentEnd {
        let data_start = match compacted {
            Some(_) => SEGMENT_HEADER_BYTES + crate::format::COMPACTED_EXT_BYTES,
            None => SEGMENT_HEADER_BYTES,
        };
        SegmentEnd {
            id,
            first_seq: id * 10,
            end: 4096,
            header: Some(SegmentHeader {
                data_start,
                compacted,
            }),
        }
    }

    /// The segment table keeps each segment's header (plain or GC's range); a file of
    /// the previous format reads without them; a malformed flag byte or first-record
    /// offset is refused, naming where it is.
    #[test]
    fn the_segment_table_keeps_headers_and_older_files_read_without_them() {
        let h = header(vec![segment(7, Some((1, 60))), segment(8, None)]);
        assert_eq!(Header::decode(&h.encode()).unwrap(), h);
        let old = Header::decode(&h.encode_as(FORMAT_VERSION_UNHEADED)).unwrap();
        assert!(old.segments.iter().all(|s| s.header.is_none()));
        assert_eq!(old.segments.len(), 2);
        let fixed = 8 + 4 + 4 + 4 + 8 + 8 + 16 + 8 + 8 + 8 + 8 + 4 + (2 + 1 + 4) + 4;
        let first_flags = fixed + 24 + 8;
        let reencoded = |edit: &dyn Fn(&mut Vec<u8>)| {
            let mut b = h.encode();
            edit(&mut b);
            let n = b.len() - 4;
            let c = crc(&b[..n]);
            b[n..].copy_from_slice(&c.to_le_bytes());
            Header::decode(&b)
        };
        let bad_flags = reencoded(&|b| b[first_flags] = 2).unwrap_err();
        assert_eq!(bad_flags.0, first_flags as u64, "{}", bad_flags.1);
        let bad_start = reencoded(&|b| b[first_flags - 8..first_flags].fill(0)).unwrap_err();
        assert!(bad_start.1.contains("data start"), "{}", bad_start.1);
    }
}
