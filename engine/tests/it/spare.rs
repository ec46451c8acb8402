//! The next segment built ahead (`NextSegment`): it becomes the next segment, it is
//! never part of the log, and a crash or close leaves nothing a reader sees.

use crate::common;

use common::*;
use spool_engine::vfs::{SimVfs, Vfs};
use spool_engine::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

fn opts(mode: NextSegment) -> Options {
    Options::default()
        .segment_bytes_max(4096)
        .next_segment(mode)
}

/// Appends version `v` of stream `a` to `s`: a 200-byte commit.
fn append_version(s: &Store, v: u64) -> Result<AppendOutcome, Error> {
    let payload = format!("{v:0>200}");
    s.append(commit(
        "a",
        ExpectedVersion::Exact(v - 1),
        payload.as_bytes(),
    ))
}

/// Appends `n` 200-byte commits to `s`, each to its own version of stream `a`.
fn fill(s: &Store, from: u64, n: u64) {
    for v in from..from + n {
        committed(append_version(s, v).unwrap());
    }
}

fn check_contents(s: &Store, n: u64) {
    let all = log_contents(s);
    assert_eq!(all.len() as u64, n);
    for (i, (stream, v, p)) in all.iter().enumerate() {
        assert_eq!(stream, "a");
        assert_eq!(*v, i as u64 + 1);
        assert_eq!(p, format!("{v:0>200}").as_bytes());
    }
}

#[test]
fn every_new_segment_is_the_spare_built_ahead() {
    for mode in [NextSegment::Background, NextSegment::Inline] {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(dir.path(), opts(mode)).unwrap();
        fill(&s, 1, 100);
        let st = s.stats();
        // 100 frames of about 280 bytes in 4 KiB segments.
        assert!(st.segments_created >= 5, "{mode:?}: {st:?}");
        assert_eq!(
            st.segments_from_spare, st.segments_created,
            "{mode:?}: every segment after the first was half full in time: {st:?}"
        );
        check_contents(&s, 100);
        drop(s);
        assert!(
            !dir.path().join(SPARE_SEGMENT_FILE).exists(),
            "{mode:?}: close removes the unused spare"
        );
        let v = verify(dir.path(), opts(mode)).unwrap();
        assert!(v.ok, "{mode:?}: {v:?}");
        let s = Store::open(dir.path(), opts(mode)).unwrap();
        check_contents(&s, 100);
        fill(&s, 101, 20);
        check_contents(&s, 120);
    }
}

#[test]
fn on_demand_builds_no_spare() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), opts(NextSegment::OnDemand)).unwrap();
    fill(&s, 1, 40);
    assert!(!dir.path().join(SPARE_SEGMENT_FILE).exists());
    let st = s.stats();
    assert!(st.segments_created >= 2, "{st:?}");
    assert_eq!(st.segments_from_spare, 0);
    check_contents(&s, 40);
}

/// A spare left by a crash (here: a file of garbage under its name) is not read as
/// part of the log by anyone, and the next owner removes it.
#[test]
fn a_leftover_spare_is_ignored_by_readers_and_removed_by_the_owner() {
    let dir = tempfile::tempdir().unwrap();
    {
        let s = Store::open(dir.path(), opts(NextSegment::OnDemand)).unwrap();
        fill(&s, 1, 30);
    }
    let spare = dir.path().join(SPARE_SEGMENT_FILE);
    std::fs::write(&spare, vec![0xA5u8; 4096]).unwrap();
    let v = verify(dir.path(), opts(NextSegment::Inline)).unwrap();
    assert!(v.ok, "{v:?}");
    let ro = Store::open_read_only(dir.path(), opts(NextSegment::Inline)).unwrap();
    check_contents(&ro, 30);
    drop(ro);
    assert!(spare.exists(), "a reader writes nothing");
    let s = Store::open(dir.path(), opts(NextSegment::Inline)).unwrap();
    assert!(!spare.exists(), "the owner's open removes it");
    check_contents(&s, 30);
    fill(&s, 31, 40);
    check_contents(&s, 70);
    assert!(s.stats().segments_from_spare > 0);
}

/// A record too large for a normal segment gets a segment of its own, created on
/// demand; the spare (built for a normal one) waits for the next normal segment.
#[test]
fn an_oversized_segment_leaves_the_spare_for_the_next_normal_one() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), opts(NextSegment::Inline)).unwrap();
    fill(&s, 1, 10);
    let before = s.stats();
    assert!(
        dir.path().join(SPARE_SEGMENT_FILE).exists(),
        "the active segment is past half: {before:?}"
    );
    let big = vec![7u8; 10_000];
    committed(
        s.append(commit("big", ExpectedVersion::NoStream, &big))
            .unwrap(),
    );
    let after_big = s.stats();
    assert_eq!(after_big.segments_created, before.segments_created + 1);
    assert_eq!(after_big.segments_from_spare, before.segments_from_spare);
    fill(&s, 11, 5);
    let after = s.stats();
    assert_eq!(after.segments_created, after_big.segments_created + 1);
    assert_eq!(after.segments_from_spare, after_big.segments_from_spare + 1);
    let all = log_contents(&s);
    assert_eq!(all.len(), 16);
    assert_eq!(all[10].2, big);
    drop(s);
    let v = verify(dir.path(), opts(NextSegment::Inline)).unwrap();
    assert!(v.ok, "{v:?}");
}

/// The spare's header is written for the id expected when it was built; a GC that
/// takes ids in between makes the writer rewrite it for the id it gets.
#[test]
fn a_gc_between_build_and_use_gets_the_spare_the_right_header() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), opts(NextSegment::Inline)).unwrap();
    // Two streams: GC keeps one and drops the other from the sealed segments.
    for v in 1..=40u64 {
        for st in ["keep", "drop"] {
            let payload = format!("{st}{v:0>150}");
            committed(
                s.append(commit(
                    st,
                    ExpectedVersion::Exact(v - 1),
                    payload.as_bytes(),
                ))
                .unwrap(),
            );
        }
    }
    // Fill the active segment past half so that a spare exists, then GC.
    let spare = dir.path().join(SPARE_SEGMENT_FILE);
    let mut v = 40;
    while !spare.exists() {
        v += 1;
        committed(
            s.append(commit("keep", ExpectedVersion::Exact(v - 1), b"x"))
                .unwrap(),
        );
    }
    // The spare's header names the id after the newest segment.
    let expected_id = seg_files(dir.path())
        .iter()
        .filter_map(|p| format::parse_segment_file_name(p.file_name()?.to_str()?))
        .max()
        .unwrap()
        + 1;
    let plan = s
        .plan_gc(&|c: &RecordedCommit| c.info.stream == "keep")
        .unwrap();
    let report = s.run_gc(plan).unwrap();
    assert!(report.commits_removed > 0, "{report:?}");
    assert!(
        report.segments_written.contains(&expected_id),
        "the GC took the spare's id {expected_id}: {report:?}"
    );
    let mut kept = log_contents(&s);
    // The next segments come after the GC's: the spare gets another id.
    let from_spare = s.stats().segments_from_spare;
    for _ in 0..40 {
        v += 1;
        committed(
            s.append(commit("keep", ExpectedVersion::Exact(v - 1), &[b'y'; 150]))
                .unwrap(),
        );
        kept.push(("keep".to_string(), v, vec![b'y'; 150]));
    }
    assert!(s.stats().segments_from_spare > from_spare);
    assert_eq!(log_contents(&s), kept);
    drop(s);
    let rep = verify(dir.path(), opts(NextSegment::Inline)).unwrap();
    assert!(rep.ok, "{rep:?}");
    let s = Store::open(dir.path(), opts(NextSegment::Inline)).unwrap();
    assert_eq!(log_contents(&s), kept);
}

/// Simulated power loss at every sync point of a run that builds and installs spares:
/// the store reopens with every acknowledged commit and verify finds it sound.
#[test]
fn power_loss_at_every_sync_point_around_spares_loses_nothing_acknowledged() {
    let store = PathBuf::from("/store");
    let sim_opts = |sim: &SimVfs, ix: &Path| {
        opts(NextSegment::Inline)
            .vfs(Arc::new(sim.clone()) as Arc<dyn Vfs>)
            .index_dir(ix.join("index"))
    };
    let run = |sim: &SimVfs, ix: &Path| -> u64 {
        let mut acked = 0;
        if let Ok(s) = Store::open(&store, sim_opts(sim, ix)) {
            for v in 1..=60u64 {
                match append_version(&s, v) {
                    Ok(o) => {
                        committed(o);
                        acked = v;
                    }
                    Err(_) => break,
                }
            }
        }
        acked
    };
    let probe = SimVfs::new();
    let ix = tempfile::tempdir().unwrap();
    assert_eq!(run(&probe, ix.path()), 60);
    let syncs = probe.sync_count();
    assert!(syncs > 60, "{syncs}");
    for k in 1..=syncs {
        for crash_seed in 0..2u64 {
            let sim = SimVfs::new();
            sim.crash_at_sync(k, crash_seed);
            let ix = tempfile::tempdir().unwrap();
            let acked = run(&sim, ix.path());
            if sim.crash_count() == 0 {
                sim.crash(crash_seed);
            }
            let ctx = format!("crash at sync {k} (crash seed {crash_seed})");
            // The index is a real directory the crash did not touch: start afresh.
            let sim = sim.after_crash();
            let ix = tempfile::tempdir().unwrap();
            let rep = verify(&store, sim_opts(&sim, ix.path()))
                .unwrap_or_else(|e| panic!("{ctx}: verify: {e}"));
            assert!(rep.ok, "{ctx}: {rep:?}");
            let s = Store::open(&store, sim_opts(&sim, ix.path()))
                .unwrap_or_else(|e| panic!("{ctx}: reopen: {e}"));
            let all = log_contents(&s);
            assert!(all.len() as u64 >= acked, "{ctx}: {} < {acked}", all.len());
            for (i, (_, v, p)) in all.iter().enumerate() {
                assert_eq!(*v, i as u64 + 1, "{ctx}");
                assert_eq!(p, format!("{v:0>200}").as_bytes(), "{ctx}");
            }
        }
    }
}

#[test]
fn waiting_for_the_spare_leaves_it_complete_for_the_next_id() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), opts(NextSegment::Background)).unwrap();
    // About 250 bytes per frame: past half of 4 KiB, within the first segment.
    fill(&s, 1, 12);
    assert_eq!(s.stats().segments_created, 0);
    s.wait_for_spare_segment();
    // Waiting again finds it built: it stays for the writer that needs it.
    s.wait_for_spare_segment();
    let bytes = std::fs::read(dir.path().join(SPARE_SEGMENT_FILE)).unwrap();
    assert_eq!(bytes.len(), 4096);
    let header = format::check_header(&bytes, 2).expect("a header for segment 2");
    assert!(header.compacted.is_none());
    assert!(bytes[format::SEGMENT_HEADER_BYTES as usize..]
        .iter()
        .all(|&b| b == 0));
    fill(&s, 13, 10);
    assert_eq!(s.stats().segments_from_spare, 1);
    check_contents(&s, 22);
}

/// Regression: waiting for a spare that was already built dropped it (its file
/// stayed), so the next build found the name taken and the store was poisoned at the
/// next switch. Inline builds are done when waited for.
#[test]
fn waiting_for_a_built_spare_keeps_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Store::open(dir.path(), opts(NextSegment::Inline)).unwrap();
    for round in 0..5u64 {
        fill(&s, 1 + round * 20, 20);
        s.wait_for_spare_segment();
    }
    let st = s.stats();
    assert!(st.segments_created >= 5, "{st:?}");
    assert_eq!(st.segments_from_spare, st.segments_created, "{st:?}");
    check_contents(&s, 100);
}

/// The OS file system, but opening the spare segment fails or panics.
fn spare_fault(panic: bool) -> Arc<dyn Vfs> {
    Arc::new(OpenHook(move |path: &Path, mode| {
        if path.file_name() == Some(SPARE_SEGMENT_FILE.as_ref()) {
            if panic {
                panic!("injected panic building the spare");
            }
            return Err(std::io::Error::other("injected failure"));
        }
        os_open(path, mode)
    }))
}

/// A spare whose build fails, or whose thread panics, fails the append that
/// needs it with an error naming the spare's path in the store, and poisons
/// the store's writes; nothing acknowledged is lost, and a reopen with a
/// working file system goes on.
#[test]
fn a_failed_or_panicking_spare_build_fails_its_switch_naming_the_file() {
    for panic in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let s = Store::open(
            dir.path(),
            opts(NextSegment::Background).vfs(spare_fault(panic)),
        )
        .unwrap();
        let mut acknowledged = 0u64;
        let err = loop {
            let v = acknowledged + 1;
            match append_version(&s, v) {
                Ok(o) => {
                    committed(o);
                    acknowledged = v;
                }
                Err(e) => break e,
            }
            assert!(acknowledged < 100, "panic {panic}: no switch failed");
        };
        let text = format!("{err}: {:?}", std::error::Error::source(&err));
        let spare = dir.path().join(SPARE_SEGMENT_FILE);
        assert!(
            text.contains(&spare.display().to_string()),
            "panic {panic}: {text}"
        );
        let why = if panic {
            "panicked"
        } else {
            "injected failure"
        };
        assert!(text.contains(why), "panic {panic}: {text}");
        assert!(acknowledged >= 10, "panic {panic}: {acknowledged}");
        let refused = s.append(commit("a", ExpectedVersion::Exact(acknowledged), b"after"));
        assert!(
            matches!(refused, Err(Error::Poisoned { .. })),
            "panic {panic}: {refused:?}"
        );
        drop(s);
        let s = Store::open(dir.path(), opts(NextSegment::Inline)).unwrap();
        check_contents(&s, acknowledged);
        fill(&s, acknowledged + 1, 20);
        check_contents(&s, acknowledged + 20);
    }
}
