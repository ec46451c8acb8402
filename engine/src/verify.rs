//! Offline verification: read every segment, check every record and the history, and
//! compare the sled index (when present and not in use) with the log. Never writes to
//! the store directory.

use crate::error::{chain_text, Error, IndexError};
use crate::format::{self, SEGMENT_HEADER_BYTES};
use crate::index::{Index, KeyValue};
use crate::segment::{self, HistoryCheck, Tail};
use crate::store::{check_plain_order, layout_of, open_segments_in_order, INDEX_DIR, LOCK_FILE};
use crate::types::{LogPosition, Options};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// One problem found by [`verify`]. Index problems name the segment `"index"` and give the
/// commit's seq as the offset (0 when not about one commit).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyProblem {
    /// File name of the segment (e.g. `0000000000000001.seg`), or `"index"`.
    pub segment: String,
    pub offset: u64,
    pub problem: String,
}

/// What happened to the index check.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum IndexCheck {
    /// No index directory.
    Absent,
    /// A writer holds the store: its index is in use and was not checked.
    Locked,
    /// The index has another format version, was built from another arrangement of the
    /// log (before a GC), or is ahead of the log (which lost a tail the index had seen):
    /// the next open rebuilds it.
    Outdated,
    /// Compared with the log up to its applied seq.
    Checked { applied_seq: u64 },
    /// sled could not open it (after removing what a crash during one of its
    /// snapshots leaves): the next open wipes and rebuilds it from the log, so no data
    /// depends on it. Not an error of the store.
    Unreadable { problem: String },
}

/// What happened to the check of the store's newest checkpoint
/// (`DIR/checkpoints/`): a read-only open from it must answer exactly as a rebuild of
/// the index from the whole log.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum CheckpointCheck {
    /// No checkpoint.
    Absent,
    /// Not compared: a writer holds the store (the two opens would see different
    /// prefixes of the log), or the log itself has problems.
    Skipped { reason: String },
    /// A read-only open would not use it (damaged, from another store, ahead of the
    /// log, other indexers than `verify`'s options register) and reads the whole log
    /// instead: not an error of the store; the owner's next open or close replaces it.
    Unused { reason: String },
    /// Its answers (every index entry) equal a rebuild from the log.
    Checked { seq: u64 },
}

/// Result of [`verify`]; `ok` is false when corruption was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifyReport {
    pub ok: bool,
    pub segments: u64,
    /// Valid record frames.
    pub records: u64,
    /// Records that decoded as commits.
    pub commits: u64,
    pub streams: u64,
    pub last_seq: u64,
    /// Bytes of a torn tail of the last segment (not an error; the next open truncates it).
    pub torn_tail_bytes: u64,
    pub index: IndexCheck,
    pub checkpoint: CheckpointCheck,
    pub errors: Vec<VerifyProblem>,
}

fn problem(segment: &str, offset: u64, p: impl Into<String>) -> VerifyProblem {
    VerifyProblem {
        segment: segment.to_string(),
        offset,
        problem: p.into(),
    }
}

/// Copies the index directory `from` to `to`, without its cache files (verify
/// reads none, and they can be most of its bytes).
fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for e in std::fs::read_dir(from)? {
        let e = e?;
        let target = to.join(e.file_name());
        if crate::index::is_cache_dir_name(&e.file_name()) {
            continue;
        }
        if e.file_type()?.is_dir() {
            copy_dir(&e.path(), &target)?;
        } else {
            std::fs::copy(e.path(), target)?;
        }
    }
    Ok(())
}

struct TempDir(PathBuf);
impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Verify the store in `dir` without writing to it. `Err` only when the store cannot be
/// read at all (e.g. the directory is missing); damage is reported in the report. Beside
/// a live writer it checks the prefix of the log written when it reached each segment: a
/// record the writer is still writing ends that view and is not damage, and a problem
/// is reported only when every one of up to three passes finds one.
pub fn verify(dir: impl AsRef<Path>, opts: Options) -> Result<VerifyReport, Error> {
    let dir = dir.as_ref();
    let mut report = verify_pass(dir, opts.clone())?;
    // Beside a live writer a pass reads the segments one after another: a segment
    // whose records ended when it was read may gain more before the next one is read,
    // which looks like a gap. Damage stays where it is; such a gap does not.
    for _ in 1..LIVE_WRITER_PASSES_MAX {
        if report.ok || !writer_live(&*opts.vfs, dir) {
            break;
        }
        report = verify_pass(dir, opts.clone())?;
    }
    Ok(report)
}

/// Passes `verify` makes at most beside a live writer before it reports a problem.
const LIVE_WRITER_PASSES_MAX: u32 = 3;

/// Whether another process or handle holds the store's lock (a writer is open).
fn writer_live(vfs: &dyn crate::vfs::Vfs, dir: &Path) -> bool {
    matches!(vfs.lock(&dir.join(LOCK_FILE), false), Ok(None))
}

/// One pass of [`verify`].
fn verify_pass(dir: &Path, opts: Options) -> Result<VerifyReport, Error> {
    let vfs = opts.vfs.clone();
    let max = opts.record_bytes_max;
    // The log as a reader sees it (a committed but unfinished GC applied on the fly).
    let (segs, _) = open_segments_in_order(&*vfs, dir, max, true)?;
    let layout = layout_of(&segs);
    let mut report = VerifyReport {
        ok: true,
        segments: segs.len() as u64,
        records: 0,
        commits: 0,
        streams: 0,
        last_seq: 0,
        torn_tail_bytes: 0,
        index: IndexCheck::Absent,
        checkpoint: CheckpointCheck::Absent,
        errors: Vec::new(),
    };

    // The index, through a private copy: opening sled writes to its directory.
    let index_dir = opts
        .index_dir
        .clone()
        .unwrap_or_else(|| dir.join(INDEX_DIR));
    let mut index: Option<(Index, u64, TempDir)> = None;
    if index_dir.exists() {
        let lock_path = dir.join(LOCK_FILE);
        let locked = match vfs.lock(&lock_path, false) {
            Ok(Some(_guard)) => false,
            Ok(None) => true,
            Err(_) => false,
        };
        if locked {
            report.index = IndexCheck::Locked;
        } else {
            let tmp = TempDir(std::env::temp_dir().join(format!(
                "spool-verify-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos())
                    .unwrap_or(0)
            )));
            // A failed copy says nothing about the index: verify could not check it.
            enum Failed {
                Copy(String),
                Open(String),
            }
            let opened = copy_dir(&index_dir, &tmp.0)
                .map_err(|e| {
                    Failed::Copy(format!(
                        "could not copy the index to check it: {}",
                        chain_text(&e)
                    ))
                })
                .and_then(|()| {
                    Index::open_existing_in(&*vfs, &tmp.0, dir, opts.index_cache_bytes_max)
                        .map_err(|e| Failed::Open(chain_text(&e)))
                });
            match opened {
                // Built from another arrangement of the log (before a GC): the next
                // open rebuilds it.
                Ok(Some(ix)) if ix.layout().ok() != Some(layout) => {
                    report.index = IndexCheck::Outdated
                }
                Ok(Some(ix)) => match ix.applied_seq() {
                    Ok(applied) => {
                        report.index = IndexCheck::Checked {
                            applied_seq: applied,
                        };
                        index = Some((ix, applied, tmp));
                    }
                    Err(e) => report.errors.push(problem(INDEX_DIR, 0, chain_text(&e))),
                },
                Ok(None) => report.index = IndexCheck::Outdated,
                Err(Failed::Open(e)) => report.index = IndexCheck::Unreadable { problem: e },
                Err(Failed::Copy(e)) => report.errors.push(problem(INDEX_DIR, 0, e)),
            }
        }
    }

    // sled failed (or panicked) reading the index: it is unreadable, not wrong.
    let mut index_failed: Option<String> = None;
    let writer_live = writer_live(&*vfs, dir);
    let mut hist = HistoryCheck::default();
    let mut heads_at_applied: HashMap<String, u64> = HashMap::new();
    if let Err(e) = check_plain_order(&segs) {
        report.errors.push(match e {
            Error::Corrupt {
                segment,
                offset,
                problem: p,
            } => problem(&segment, offset, p),
            other => problem(INDEX_DIR, 0, chain_text(&other)),
        });
    }
    let count = segs.len();
    for (i, seg) in segs.into_iter().enumerate() {
        let id = seg.id;
        let map = seg.map()?;
        let name = seg.name;
        let file = seg.file;
        let is_last = i + 1 == count && !matches!(&seg.header, Ok(h) if h.compacted.is_some());
        let header = match seg.header {
            Ok(h) => h,
            Err(format::HeaderProblem::Blank) | Err(format::HeaderProblem::Invalid(_))
                if is_last && segment::is_unfinished_creation(&map) =>
            {
                // A segment whose creation did not complete: like a torn tail.
                report.torn_tail_bytes += segment::written_end(&map);
                continue;
            }
            Err(p) => {
                let text = match p {
                    format::HeaderProblem::FutureVersion(v) => format!(
                        "format version {v}; this build supports up to {}",
                        format::SEGMENT_FORMAT_VERSION
                    ),
                    format::HeaderProblem::WrongId(found) => {
                        format!("header names segment id {found}, the file name {id}")
                    }
                    format::HeaderProblem::Blank => "blank segment header".into(),
                    format::HeaderProblem::Invalid(s) => s,
                };
                report.errors.push(problem(&name, 0, text));
                continue;
            }
        };
        if let Err(p) = hist.enter_segment(header.compacted) {
            report.errors.push(problem(&name, SEGMENT_HEADER_BYTES, p));
        }
        let mut start = header.data_start;
        loop {
            let mut found: Vec<VerifyProblem> = Vec::new();
            let scan = segment::scan_segment(
                &map,
                id,
                max,
                start,
                segment::ZeroHeader::CheckMapped,
                |off, payload| {
                    report.records += 1;
                    let pos = LogPosition {
                        segment: id,
                        offset: off,
                    };
                    let rec = match format::decode_commit(payload, pos) {
                        Ok(r) => r,
                        Err(p) => {
                            found.push(problem(&name, off, p));
                            return Ok(());
                        }
                    };
                    report.commits += 1;
                    if let Err(p) = hist.check(&rec) {
                        found.push(problem(&name, off, p));
                        hist.accept(&rec);
                    }
                    if let Some((ix, applied, _)) = &index {
                        if rec.info.seq <= *applied && index_failed.is_none() {
                            heads_at_applied.insert(rec.info.stream.clone(), rec.info.version);
                            index_failed = check_index_entry(ix, &rec, &mut found);
                        }
                    }
                    Ok(())
                },
            )?;
            report.errors.append(&mut found);
            match scan.tail {
                Tail::Clean => break,
                Tail::Torn {
                    problem: p,
                    written_end,
                } => {
                    let synced = match &index {
                        Some((ix, _, _)) if is_last && index_failed.is_none() => {
                            ix.synced_seq().unwrap_or(0)
                        }
                        _ => 0,
                    };
                    if is_last && synced > hist.last_seq {
                        // The index records commits past this point as on disk: the
                        // next open refuses instead of trimming (see `Error::DamagedTail`).
                        report.errors.push(problem(
                            &name,
                            scan.end,
                            format!(
                                "{p}; the index records commits up to seq {synced} as on \
                                 disk, the log's valid records end at seq {}: acknowledged \
                                 commits are damaged, not torn",
                                hist.last_seq
                            ),
                        ));
                    } else if is_last {
                        report.torn_tail_bytes += written_end - scan.end;
                    } else {
                        report.errors.push(problem(&name, scan.end, p));
                    }
                    break;
                }
                Tail::Corrupt { .. } | Tail::Enclosed { .. }
                    if is_last
                        && segment::frame_landed_since(&*file, id, max, scan.end)
                            .map_err(|e| Error::io(&seg.path, "read_at", e))? =>
                {
                    // A live writer's write in flight (see
                    // `segment::frame_landed_since`): the log this run sees ends here.
                    break;
                }
                // With a live writer this may be its record in flight, whose text holds
                // a frame; the owner's open decides.
                Tail::Enclosed { .. } if is_last && writer_live => break,
                Tail::Enclosed {
                    problem: p,
                    inner_at,
                } => {
                    report.errors.push(problem(
                        &name,
                        scan.end,
                        format!(
                            "{p}; the bytes this record claims hold a frame at offset \
                             {inner_at}, not taken for a record"
                        ),
                    ));
                    break;
                }
                Tail::Corrupt {
                    problem: p,
                    valid_at,
                } => {
                    report.errors.push(problem(
                        &name,
                        scan.end,
                        format!("{p}; a valid record follows at offset {valid_at}"),
                    ));
                    start = valid_at;
                }
            }
        }
        hist.leave_segment();
    }
    report.last_seq = hist.last_seq;
    report.streams = hist.heads.len() as u64;
    if let Some(problem) = index_failed {
        report.index = IndexCheck::Unreadable { problem };
        index = None;
    }

    if let Some((ix, applied, _tmp)) = &index {
        if *applied > hist.last_seq {
            // The log lost a tail the index had seen (Buffered commits not yet synced
            // at a power loss, or a torn tail): the next open discards the index and
            // rebuilds it from the log, so this is not damage of the store.
            report.index = IndexCheck::Outdated;
        } else {
            match ix.streams() {
                Ok(streams) => {
                    let mut seen = 0usize;
                    for (s, v) in streams {
                        match heads_at_applied.get(&s) {
                            Some(lv) if *lv == v => seen += 1,
                            other => report.errors.push(problem(
                                INDEX_DIR,
                                0,
                                format!("index head of {s:?} is {v}, the log says {other:?}"),
                            )),
                        }
                    }
                    if seen != heads_at_applied.len() {
                        report.errors.push(problem(
                            INDEX_DIR,
                            0,
                            format!(
                                "index has heads for {seen} of the log's {} streams",
                                heads_at_applied.len()
                            ),
                        ));
                    }
                }
                Err(e) => report.errors.push(problem(INDEX_DIR, 0, chain_text(&e))),
            }
        }
    }
    report.checkpoint = check_checkpoint(dir, &opts, writer_live, &mut report.errors);
    report.ok = report.errors.is_empty();
    Ok(report)
}

/// Compare a read-only open from the newest checkpoint with one that rebuilds the
/// index from the whole log: every index entry must be equal. A checkpoint whose data
/// block fails its checksum is a problem (reads from it would fail); one that an open
/// would not use is not (it falls back to the log).
fn check_checkpoint(
    dir: &Path,
    opts: &Options,
    writer_live: bool,
    errors: &mut Vec<VerifyProblem>,
) -> CheckpointCheck {
    use crate::store::Store;
    let Some(path) = crate::checkpoint::read::newest(&*opts.vfs, dir) else {
        return CheckpointCheck::Absent;
    };
    let skipped = |r: &str| CheckpointCheck::Skipped { reason: r.into() };
    if writer_live {
        return skipped("a writer holds the store");
    }
    if !errors.is_empty() {
        return skipped("the log has problems");
    }
    let name = crate::checkpoint::CHECKPOINT_DIR;
    let from = match Store::open_read_only(dir, opts.clone()) {
        Ok(s) => s,
        Err(e) => return skipped(&format!("read-only open failed: {e}")),
    };
    let stats = from.stats();
    let Some(seq) = stats.open_checkpoint_seq else {
        return CheckpointCheck::Unused {
            reason: stats
                .open_checkpoint_fallback
                .unwrap_or_else(|| format!("{} was not used", path.display())),
        };
    };
    let rebuilt = match Store::open_read_only_from_log(dir, opts.clone()) {
        Ok(s) => s,
        Err(e) => return skipped(&format!("read-only open failed: {e}")),
    };
    // Compared entry by entry, in key order: an index of a million commits is
    // hundreds of MiB, and holding both copies made verify's memory grow with the log.
    match compare_entries(from.index().entries(), rebuilt.index().entries()) {
        Compared::Equal => {}
        Compared::Differ { left, right, at } => errors.push(problem(
            name,
            seq,
            format!(
                "{}: its index differs from a rebuild from the log ({left} entries against \
                 {right}; first difference at entry {at})",
                path.display(),
            ),
        )),
        Compared::LeftFailed(e) => errors.push(problem(name, seq, e.to_string())),
        Compared::RightFailed(e) => return skipped(&format!("the rebuild failed: {e}")),
    }
    CheckpointCheck::Checked { seq }
}

/// How two sequences of index entries compare.
#[derive(Debug)]
enum Compared {
    Equal,
    /// How many entries each has, and the position of the first that differs (or
    /// that one of them lacks).
    Differ {
        left: u64,
        right: u64,
        at: u64,
    },
    /// Reading the first failed (anywhere: a failure outranks a difference).
    LeftFailed(Error),
    /// Reading the second failed, and the first did not.
    RightFailed(Error),
}

/// Compares `a` with `b` entry by entry, holding one entry of each. A failure to read
/// `a` anywhere is reported before one of `b`, and either before a difference (the
/// sides are read to their ends once they differ, for the totals).
fn compare_entries(
    mut a: impl Iterator<Item = Result<KeyValue, Error>>,
    mut b: impl Iterator<Item = Result<KeyValue, Error>>,
) -> Compared {
    // Entries left on one side: how many, or the failure that ended its reading.
    let rest = |it: &mut dyn Iterator<Item = Result<KeyValue, Error>>| -> Result<u64, Error> {
        let mut n = 0u64;
        for kv in it {
            kv?;
            n += 1;
        }
        Ok(n)
    };
    let mut at = 0u64;
    loop {
        match (a.next(), b.next()) {
            (None, None) => return Compared::Equal,
            (Some(Err(e)), _) => return Compared::LeftFailed(e),
            (x, Some(Err(e))) => {
                return match x
                    .map_or(Ok(()), |x| x.map(drop))
                    .and_then(|()| rest(&mut a))
                {
                    Err(left) => Compared::LeftFailed(left),
                    Ok(_) => Compared::RightFailed(e),
                };
            }
            (Some(Ok(x)), Some(Ok(y))) if x == y => at += 1,
            (x, y) => {
                let (x, y) = (x.is_some(), y.is_some());
                let left = rest(&mut a);
                let right = rest(&mut b);
                return match (left, right) {
                    (Err(e), _) => Compared::LeftFailed(e),
                    (_, Err(e)) => Compared::RightFailed(e),
                    (Ok(l), Ok(r)) => Compared::Differ {
                        left: at + u64::from(x) + l,
                        right: at + u64::from(y) + r,
                        at,
                    },
                };
            }
        }
    }
}

/// Checks the index's entry for `rec`; `Some(problem)` when sled could not read it.
fn check_index_entry(
    ix: &Index,
    rec: &crate::RecordedCommit,
    found: &mut Vec<VerifyProblem>,
) -> Option<String> {
    let i = &rec.info;
    match ix.stream_entry(&i.stream, i.version) {
        Err(e @ (Error::Index(IndexError::Sled(_)) | Error::Index(IndexError::Malformed(_)))) => {
            return Some(chain_text(&e))
        }
        Ok(Some(e)) if e.position == i.position && e.seq == i.seq && e.commit_id == i.commit_id => {
        }
        other => found.push(problem(
            INDEX_DIR,
            i.seq,
            format!(
                "{:?} v{} (seq {}, commit {}) is at {} in the log, the index says {other:?}",
                i.stream, i.version, i.seq, i.commit_id, i.position
            ),
        )),
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entries(keys: &[&str]) -> Vec<Result<KeyValue, Error>> {
        keys.iter()
            .map(|k| Ok((k.as_bytes().to_vec(), b"v".to_vec())))
            .collect()
    }

    fn differ(a: &[&str], b: &[&str]) -> (u64, u64, u64) {
        match compare_entries(entries(a).into_iter(), entries(b).into_iter()) {
            Compared::Differ { left, right, at } => (left, right, at),
            other => panic!("{a:?} against {b:?}: {other:?}"),
        }
    }

    #[test]
    fn entries_compare_one_by_one_and_report_totals_and_the_first_difference() {
        let same = compare_entries(
            entries(&["a", "b"]).into_iter(),
            entries(&["a", "b"]).into_iter(),
        );
        assert!(matches!(same, Compared::Equal), "{same:?}");
        assert_eq!(differ(&["a", "b", "c"], &["a", "x", "c"]), (3, 3, 1));
        assert_eq!(differ(&["a", "b"], &["a", "b", "c"]), (2, 3, 2));
        assert_eq!(differ(&["a", "b", "c", "d"], &["a"]), (4, 1, 1));
        assert_eq!(differ(&[], &["a"]), (0, 1, 0));
        let failed = Err(Error::Index(IndexError::Malformed("bad".into())));
        let left = compare_entries(vec![failed].into_iter(), entries(&["a"]).into_iter());
        assert!(matches!(left, Compared::LeftFailed(_)), "{left:?}");
        let failed = Err(Error::Index(IndexError::Malformed("bad".into())));
        let right = compare_entries(entries(&["a"]).into_iter(), vec![failed].into_iter());
        assert!(matches!(right, Compared::RightFailed(_)), "{right:?}");
    }

    fn bad() -> Result<KeyValue, Error> {
        Err(Error::Index(IndexError::Malformed("bad".into())))
    }

    fn with_failure(
        keys: &[&str],
        fail_at: usize,
    ) -> impl Iterator<Item = Result<KeyValue, Error>> {
        let mut v = entries(keys);
        v.insert(fail_at, bad());
        v.into_iter()
    }

    /// As when both sides were read whole before comparing: a failure of the first
    /// anywhere is its problem; else a failure of the second; only then a difference.
    #[test]
    fn a_read_failure_anywhere_outranks_a_difference() {
        // The second fails after a difference, or after the first ran out.
        let c = compare_entries(
            entries(&["a", "b"]).into_iter(),
            with_failure(&["a", "x"], 2),
        );
        assert!(matches!(c, Compared::RightFailed(_)), "{c:?}");
        let c = compare_entries(entries(&["a"]).into_iter(), with_failure(&["a", "b"], 2));
        assert!(matches!(c, Compared::RightFailed(_)), "{c:?}");
        // The second fails first, the first later.
        let c = compare_entries(with_failure(&["a"], 1), with_failure(&[], 0));
        assert!(matches!(c, Compared::LeftFailed(_)), "{c:?}");
        // The first fails after a difference.
        let c = compare_entries(
            with_failure(&["a", "x"], 2),
            entries(&["a", "b"]).into_iter(),
        );
        assert!(matches!(c, Compared::LeftFailed(_)), "{c:?}");
    }
}
