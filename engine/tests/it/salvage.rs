//! Salvage: copying every readable commit out of a damaged store.
use crate::common;
use common::*;
use spool_engine::*;
use std::collections::BTreeMap;
use std::path::Path;

/// (seq, stream, version, commit id, timestamp, events) of every commit.
type Row = (u64, String, u64, Uuid, i64, Vec<EventData>);

fn rows(s: &Store) -> Vec<(Row, LogPosition, u32)> {
    s.scan(1)
        .unwrap()
        .map(|r| {
            let r = r.unwrap();
            (
                (
                    r.info.seq,
                    r.info.stream,
                    r.info.version,
                    r.info.commit_id,
                    r.info.timestamp_ms,
                    r.events,
                ),
                r.info.position,
                r.record_bytes,
            )
        })
        .collect()
}

fn fill(dir: &Path, n: u64) -> Vec<(Row, LogPosition, u32)> {
    let s = Store::open(dir, small_opts()).unwrap();
    for i in 0..n {
        let stream = ["a", "b", "c"][(i % 3) as usize];
        let v = s.stream_version(stream).unwrap().unwrap_or(0);
        let payload = vec![(i % 251) as u8; 50 + (i as usize * 37) % 200];
        committed(
            s.append(commit(stream, ExpectedVersion::Exact(v), &payload))
                .unwrap(),
        );
    }
    let r = rows(&s);
    s.close().unwrap();
    r
}

fn out_rows(out: &Path) -> Vec<Row> {
    let s = Store::open(out, small_opts()).unwrap();
    let r = rows(&s).into_iter().map(|(row, _, _)| row).collect();
    s.close().unwrap();
    r
}

#[test]
fn salvage_copies_everything_around_mid_log_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let before = fill(dir.path(), 120);
    // Damage a record in the middle of a sealed segment (not its first record).
    let segs: Vec<u64> = {
        let mut v: Vec<u64> = before.iter().map(|r| r.1.segment).collect();
        v.dedup();
        v
    };
    assert!(segs.len() >= 4, "{segs:?}");
    let target_seg = segs[2];
    let (victim, pos, len) = before
        .iter()
        .filter(|r| r.1.segment == target_seg)
        .nth(2)
        .cloned()
        .unwrap();
    let path = dir.path().join(format!("{target_seg:016x}.seg"));
    let mut bytes = std::fs::read(&path).unwrap();
    let at = (pos.offset + 20) as usize;
    bytes[at] ^= 0xff;
    bytes[at + 1] ^= 0x55;
    std::fs::write(&path, &bytes).unwrap();
    // An open from the close's checkpoint would read nothing before its record.
    std::fs::remove_dir_all(dir.path().join(CHECKPOINT_DIR)).unwrap();
    let e = Store::open(dir.path(), small_opts()).unwrap_err();
    assert!(matches!(e, Error::Corrupt { .. }), "{e}");

    let out = dir.path().join("salvaged");
    let report = salvage(dir.path(), &out, small_opts()).unwrap();
    assert!(!report.is_complete());
    assert_eq!(
        report.unreadable,
        vec![LostRange {
            segment: format!("{target_seg:016x}.seg"),
            offset: pos.offset,
            bytes: u64::from(len),
            problem: "record checksum mismatch".into(),
        }]
    );
    // The victim's stream keeps the versions before it; the later ones are reported.
    let (stream, lost_version) = (victim.1.clone(), victim.2);
    let later: Vec<u64> = before
        .iter()
        .filter(|r| r.0 .1 == stream && r.0 .2 > lost_version)
        .map(|r| r.0 .2)
        .collect();
    assert!(!later.is_empty());
    assert_eq!(
        report.dropped.iter().map(|d| d.version).collect::<Vec<_>>(),
        later
    );
    assert!(report.dropped.iter().all(|d| d.stream == stream));
    let expected: Vec<Row> = before
        .iter()
        .map(|r| r.0.clone())
        .filter(|r| !(r.1 == stream && r.2 >= lost_version))
        .collect();
    assert_eq!(report.commits_copied, expected.len() as u64);
    assert_eq!(out_rows(&out), expected);
    let v = verify(&out, small_opts()).unwrap();
    assert!(v.ok, "{:?}", v.errors);
    // The salvaged store takes writes where each stream left off.
    let s = Store::open(&out, small_opts()).unwrap();
    assert_eq!(s.stream_version(&stream).unwrap(), Some(lost_version - 1));
    let heads: BTreeMap<String, u64> = s.streams().unwrap().into_iter().collect();
    for (name, v) in &heads {
        committed(
            s.append(commit(name, ExpectedVersion::Exact(*v), b"more"))
                .unwrap(),
        );
    }
    drop(s);
    // The source was not written to.
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn salvage_reads_the_records_of_a_segment_with_a_damaged_header() {
    let dir = tempfile::tempdir().unwrap();
    let before = fill(dir.path(), 60);
    let seg = before[before.len() / 2].1.segment;
    let path = dir.path().join(format!("{seg:016x}.seg"));
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[3] ^= 0x01; // the magic
    std::fs::write(&path, &bytes).unwrap();
    assert!(Store::open(dir.path(), small_opts()).is_err());
    let out = dir.path().join("out");
    let report = salvage(dir.path(), &out, small_opts()).unwrap();
    assert_eq!(report.unreadable.len(), 1, "{:?}", report.unreadable);
    assert_eq!(report.unreadable[0].offset, 0);
    assert!(report.dropped.is_empty());
    let expected: Vec<Row> = before.into_iter().map(|r| r.0).collect();
    assert_eq!(out_rows(&out), expected);
}

#[test]
fn salvage_of_a_compacted_store_keeps_versions_and_seqs() {
    let dir = tempfile::tempdir().unwrap();
    fill(dir.path(), 90);
    let s = Store::open(dir.path(), small_opts()).unwrap();
    let plan = s
        .plan_gc(&|c: &RecordedCommit| c.info.stream != "b" || c.info.version > 10)
        .unwrap();
    s.run_gc(plan).unwrap();
    let before: Vec<Row> = rows(&s).into_iter().map(|r| r.0).collect();
    s.close().unwrap();
    let out = dir.path().join("out");
    let report = salvage(dir.path(), &out, small_opts()).unwrap();
    assert!(report.is_complete(), "{report:?}");
    assert_eq!(report.streams_starting_late, vec![("b".to_string(), 11)]);
    assert_eq!(out_rows(&out), before);
    // A non-empty target is refused.
    assert!(matches!(
        salvage(dir.path(), &out, small_opts()),
        Err(Error::InvalidInput(_))
    ));
}
