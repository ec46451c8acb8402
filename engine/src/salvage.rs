//! Salvage: copy every readable commit of a damaged store into a new store, and report
//! what was lost.
//!
//! Every segment is read tolerantly: at a frame that does not validate, the reader
//! searches forward for the next frame that does (its checksum binds the segment id,
//! so a match is a real record of this segment) and reports the bytes in between as
//! unreadable. The commits found are put in seq order (a seq seen twice keeps its first
//! copy) and written, re-framed, into compacted segments of the new store, so that every
//! commit keeps its seq, stream version, commit id and timestamp; the seqs of lost
//! commits are simply absent (the compacted range accounts for them).
//!
//! A stream's versions must be contiguous: when a version is missing, the versions
//! after the gap are dropped (and reported) and the stream keeps the contiguous run it
//! starts with. A stream whose first readable version is above 1 (its first commits
//! were lost, or removed by an earlier GC) keeps that run and is listed in
//! [`SalvageReport::streams_starting_late`].

use crate::error::Error;
use crate::format::{self, FrameCheck, SEGMENT_HEADER_BYTES};
use crate::gc::{encode_copy, write_compacted, Output};
use crate::segment;
use crate::store::{open_segments_in_order, Store};
use crate::types::{ExpectedVersion, LogPosition, Options, RecordedCommit};
use std::collections::{BTreeMap, HashMap};
use std::path::Path;

/// Bytes of a segment that could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostRange {
    /// File name of the segment.
    pub segment: String,
    pub offset: u64,
    pub bytes: u64,
    pub problem: String,
}

/// A commit that was read but not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedCommit {
    pub segment: String,
    pub offset: u64,
    pub stream: String,
    pub version: u64,
    pub seq: u64,
    pub reason: String,
}

/// What [`salvage`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SalvageReport {
    /// Segments read.
    pub segments: u64,
    /// Commits read and copied into the new store.
    pub commits_copied: u64,
    pub streams: u64,
    /// The largest seq copied.
    pub last_seq: u64,
    /// Unreadable bytes, by segment and offset.
    pub unreadable: Vec<LostRange>,
    /// Commits read but not copied, and why.
    pub dropped: Vec<DroppedCommit>,
    /// Streams whose first copied version is above 1: (stream, first version).
    pub streams_starting_late: Vec<(String, u64)>,
}

impl SalvageReport {
    /// Whether nothing was lost.
    pub fn is_complete(&self) -> bool {
        self.unreadable.is_empty() && self.dropped.is_empty()
    }
}

/// Copy every readable commit of the store in `src_dir` into a new store in `out_dir`
/// (which must not exist or be empty); see the module docs. `opts` gives the file
/// system, the maximum record size (for reading) and the segment size and indexers of
/// the new store. Never writes to `src_dir`. `Err` only when the source cannot be
/// listed or the new store cannot be written.
pub fn salvage(
    src_dir: impl AsRef<Path>,
    out_dir: impl AsRef<Path>,
    opts: Options,
) -> Result<SalvageReport, Error> {
    let (src, out) = (src_dir.as_ref(), out_dir.as_ref());
    let vfs = opts.vfs.clone();
    let max = opts.record_bytes_max;
    if let Ok(names) = vfs.read_dir(out) {
        if !names.is_empty() {
            return Err(Error::InvalidInput(format!(
                "salvage target {} is not empty",
                out.display()
            )));
        }
    }
    let mut report = SalvageReport::default();
    let (segs, _) = open_segments_in_order(&*vfs, src, max, true)?;
    report.segments = segs.len() as u64;

    // Every readable commit, by seq (first copy wins).
    let mut found: BTreeMap<u64, (String, RecordedCommit)> = BTreeMap::new();
    for seg in &segs {
        let map = &seg.map()?;
        let start = match &seg.header {
            Ok(h) => h.data_start,
            Err(p) => {
                if !map.iter().all(|&b| b == 0) {
                    report.unreadable.push(LostRange {
                        segment: seg.name.clone(),
                        offset: 0,
                        bytes: SEGMENT_HEADER_BYTES.min(map.len() as u64),
                        problem: format!("segment header: {p:?}"),
                    });
                }
                SEGMENT_HEADER_BYTES
            }
        };
        let written_end = segment::written_end(map);
        let mut off = start;
        while off < written_end {
            let rest = map.get(off as usize..).unwrap_or(&[]);
            match format::check_frame(rest, seg.id, max) {
                FrameCheck::Valid { payload, total, .. } => {
                    let pos = LogPosition {
                        segment: seg.id,
                        offset: off,
                    };
                    match format::decode_commit(payload, pos) {
                        Ok(rec) => {
                            let seq = rec.info.seq;
                            if let Some((first_seg, first)) = found.get(&seq) {
                                report.dropped.push(DroppedCommit {
                                    segment: seg.name.clone(),
                                    offset: off,
                                    stream: rec.info.stream.clone(),
                                    version: rec.info.version,
                                    seq,
                                    reason: format!(
                                        "seq {seq} also at {first_seg}@{}",
                                        first.info.position.offset
                                    ),
                                });
                            } else {
                                found.insert(seq, (seg.name.clone(), rec));
                            }
                        }
                        Err(p) => report.unreadable.push(LostRange {
                            segment: seg.name.clone(),
                            offset: off,
                            bytes: total,
                            problem: format!("record does not decode: {p}"),
                        }),
                    }
                    off += total;
                }
                FrameCheck::Zero | FrameCheck::Invalid(_) => {
                    let problem = match format::check_frame(rest, seg.id, max) {
                        FrameCheck::Invalid(p) => p,
                        _ => "zero frame header followed by nonzero bytes".to_string(),
                    };
                    // Never from inside the bytes the invalid frame claims: a frame
                    // there is part of that record (message text may hold one).
                    let resume = segment::resume_after_invalid(map, off, max);
                    let next = segment::find_valid_frame(map, seg.id, max, resume, written_end)
                        .unwrap_or(written_end);
                    report.unreadable.push(LostRange {
                        segment: seg.name.clone(),
                        offset: off,
                        bytes: next - off,
                        problem,
                    });
                    off = next;
                }
            }
        }
    }

    // Keep each stream's contiguous run of versions.
    let mut heads: HashMap<String, u64> = HashMap::new();
    let mut broken: HashMap<String, u64> = HashMap::new();
    let mut keep: Vec<RecordedCommit> = Vec::with_capacity(found.len());
    for (_, (seg_name, rec)) in found {
        let i = &rec.info;
        let drop_reason = if let Some(missing) = broken.get(&i.stream) {
            Some(format!(
                "stream {:?} lost version {missing}: later versions are dropped",
                i.stream
            ))
        } else {
            match heads.get(&i.stream) {
                Some(&h) if i.version != h + 1 => {
                    broken.insert(i.stream.clone(), h + 1);
                    Some(format!(
                        "stream {:?} lost version {}: later versions are dropped",
                        i.stream,
                        h + 1
                    ))
                }
                prev => {
                    let prev = prev.copied().or(if i.version > 1 {
                        Some(i.version - 1)
                    } else {
                        None
                    });
                    if rec.expected.matches(prev)
                        && !(rec.expected == ExpectedVersion::NoStream && i.version > 1)
                    {
                        None
                    } else {
                        broken.insert(i.stream.clone(), i.version);
                        Some(format!(
                            "expected version {:?} does not fit version {}",
                            rec.expected, i.version
                        ))
                    }
                }
            }
        };
        if let Some(reason) = drop_reason {
            report.dropped.push(DroppedCommit {
                segment: seg_name,
                offset: i.position.offset,
                stream: i.stream.clone(),
                version: i.version,
                seq: i.seq,
                reason,
            });
            continue;
        }
        if !heads.contains_key(&i.stream) && i.version > 1 {
            report
                .streams_starting_late
                .push((i.stream.clone(), i.version));
        }
        heads.insert(i.stream.clone(), i.version);
        keep.push(rec);
    }
    report.streams = heads.len() as u64;
    report.commits_copied = keep.len() as u64;
    report.last_seq = keep.last().map_or(0, |r| r.info.seq);

    // Write the commits as compacted segments 1.. of the new store, then open it once
    // (which builds the index and the active segment) and close it.
    vfs.create_dir_all(out)
        .map_err(|e| Error::io(out, "create_dir_all", e))?;
    let seg_max = opts.segment_bytes_max;
    let mut next_id = 1u64;
    let mut next_first = 1u64;
    let mut cur = Output::new(next_id, next_first);
    let mut prev_seq = 0u64;
    for rec in &keep {
        let frame = u64::from(rec.record_bytes);
        if cur.records > 0 && cur.buf.len() as u64 + frame > seg_max {
            let path = out.join(format::segment_file_name(cur.id));
            write_compacted(&*vfs, &path, cur, prev_seq)?;
            next_id += 1;
            next_first = prev_seq + 1;
            cur = Output::new(next_id, next_first);
        }
        encode_copy(&mut cur.buf, cur.id, rec)?;
        if cur.records == 0 {
            cur.first_seq = rec.info.seq;
        }
        cur.last_seq = rec.info.seq;
        cur.records += 1;
        prev_seq = rec.info.seq;
    }
    if cur.records > 0 {
        let path = out.join(format::segment_file_name(cur.id));
        write_compacted(&*vfs, &path, cur, prev_seq)?;
    }
    vfs.sync_dir(out)
        .map_err(|e| Error::io(out, "sync_dir", e))?;
    Store::open(out, opts)?.close()?;
    report
        .unreadable
        .sort_by(|a, b| (&a.segment, a.offset).cmp(&(&b.segment, b.offset)));
    Ok(report)
}
