//! Ownership across processes: the lock, read-only opens next to a live writer, and a
//! writer killed with SIGKILL. The test binary re-runs itself as the child.
use crate::common;
use common::*;
use spool_engine::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

const CHILD_ENV: &str = "SPOOL_ENGINE_TEST_CHILD_DIR";

/// In the child: open the store as owner, append 3 commits, say so, then wait to be killed.
fn child(dir: &str) -> ! {
    let s = Store::open(dir, test_opts()).unwrap();
    for v in 0..3u64 {
        s.append(commit("child", ExpectedVersion::Exact(v), b"c"))
            .unwrap();
    }
    println!("ready");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

#[test]
fn lock_across_processes_and_a_killed_writer() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        child(&dir);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut kid = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "process::lock_across_processes_and_a_killed_writer",
            "--nocapture",
        ])
        .env(CHILD_ENV, dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = kid.stdout.take().unwrap();
    let ready = BufReader::new(out)
        .lines()
        .any(|l| l.map(|l| l.contains("ready")).unwrap_or(false));
    assert!(ready, "child did not get ready");
    // Another process holds the lock.
    match Store::open(dir.path(), test_opts()) {
        Err(Error::Locked { .. }) => {}
        other => {
            let _ = kid.kill();
            panic!("expected Locked, got {other:?}");
        }
    }
    // Read-only works next to the live writer.
    let ro = Store::open_read_only(dir.path(), test_opts()).unwrap();
    assert_eq!(ro.stream_version("child").unwrap(), Some(3));
    drop(ro);
    // The index is in use: verify checks the log only.
    let r = verify(dir.path(), test_opts()).unwrap();
    assert!(r.ok && r.index == IndexCheck::Locked, "{r:?}");
    kid.kill().unwrap(); // SIGKILL
    kid.wait().unwrap();
    let ro = Store::open_read_only(dir.path(), test_opts()).unwrap();
    assert_eq!(ro.stream_version("child").unwrap(), Some(3));
    drop(ro);
    let s = Store::open(dir.path(), test_opts()).unwrap();
    assert_eq!(s.stream_version("child").unwrap(), Some(3));
    s.append(commit("child", ExpectedVersion::Exact(3), b"after"))
        .unwrap();
}

#[test]
fn store_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Store>();
    assert_send_sync::<Options>();
}

#[test]
fn read_only_opens_next_to_a_busy_writer_see_a_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(
        Store::open(dir.path(), small_opts().durability(Durability::Buffered)).unwrap(),
    );
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let s = s.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut v = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                s.append(commit("busy", ExpectedVersion::Exact(v), &[v as u8; 300]))
                    .unwrap();
                v += 1;
            }
            v
        })
    };
    // The readers start once the writer has (on a loaded machine the thread may not
    // have run before twenty opens of an empty store are done).
    while s.last_seq() == 0 {
        std::thread::yield_now();
    }
    for _ in 0..20 {
        let ro = Store::open_read_only(dir.path(), small_opts()).unwrap();
        let n = ro.stream_version("busy").unwrap().unwrap_or(0);
        let all = ro.read_stream("busy", 1, usize::MAX).unwrap();
        assert_eq!(all.len() as u64, n);
        for (i, c) in all.iter().enumerate() {
            assert_eq!(c.info.version, i as u64 + 1);
            assert_eq!(c.events[0].payload, vec![i as u8; 300]);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let n = writer.join().unwrap();
    assert!(n > 0);
}

/// Set in a child that runs [`live_writer_child`]: the store directory.
const LIVE_CHILD_ENV: &str = "SPOOL_ENGINE_TEST_LIVE_WRITER_DIR";
/// Set in that child: "small" or "default" segments.
const LIVE_SEGMENTS_ENV: &str = "SPOOL_ENGINE_TEST_LIVE_WRITER_SEGMENTS";
/// Writer threads of a live writer, each appending to its own stream `live-<k>`: durable
/// appends from several threads go out in groups, one `pwrite` of many frames each.
const LIVE_WRITERS: u64 = 4;
/// Commits each writer thread stops at when the readers are not done by then.
const LIVE_COMMITS_PER_WRITER: u64 = 5_000;
/// Read-only opens (each followed by a `verify`) run beside a live writer.
const LIVE_READS: usize = 40;

/// Payload of version `v` of stream `live-<k>`: lengths vary so that frames end anywhere
/// in a page and groups straddle page boundaries.
fn live_payload(k: u64, v: u64) -> Vec<u8> {
    vec![(k * 31 + v % 251) as u8; 1 + ((v * 7919 + k * 104_729) % 1500) as usize]
}

fn live_opts(segments: &str) -> Options {
    match segments {
        "small" => small_opts(),
        // Checkpoints rewritten in the background all along (after each move into
        // sled), read by every read-only open.
        "small-checkpoints" => small_opts().checkpoint_commits_min(256),
        _ => Options::default(),
    }
}

/// One read-only open and one `verify` of a store a live writer appends to: neither may
/// report damage, and the open must hold seqs 1..=n, each stream's versions from 1 with
/// their payloads. Returns the (writer, version) of each seq in order.
fn read_live_prefix(dir: &std::path::Path, segments: &str) -> Vec<(u64, u64)> {
    let ro = Store::open_read_only(dir, live_opts(segments))
        .unwrap_or_else(|e| panic!("read-only open beside a live writer: {e}"));
    let mut seen = Vec::new();
    let mut heads = vec![0u64; LIVE_WRITERS as usize];
    for r in ro.scan(1).unwrap() {
        let r = r.unwrap_or_else(|e| panic!("read beside a live writer: {e}"));
        assert_eq!(r.info.seq, seen.len() as u64 + 1);
        let k: u64 = r
            .info
            .stream
            .strip_prefix("live-")
            .unwrap()
            .parse()
            .unwrap();
        heads[k as usize] += 1;
        assert_eq!(r.info.version, heads[k as usize]);
        assert_eq!(
            r.events[0].payload,
            live_payload(k, r.info.version),
            "{:?}",
            r.info
        );
        seen.push((k, r.info.version));
    }
    for (k, &v) in heads.iter().enumerate() {
        let head = ro
            .stream_version(&format!("live-{k}"))
            .unwrap()
            .unwrap_or(0);
        assert_eq!(head, v);
    }
    drop(ro);
    let rep = verify(dir, live_opts(segments)).unwrap();
    assert!(rep.ok, "verify beside a live writer: {:?}", rep.errors);
    assert!(
        rep.last_seq >= seen.len() as u64,
        "verify saw {} after an open saw {}",
        rep.last_seq,
        seen.len()
    );
    seen
}

/// The writer threads: append as fast as they can until `stop` or
/// `LIVE_COMMITS_PER_WRITER` each. Returns the commits acknowledged.
fn append_live(
    s: &std::sync::Arc<Store>,
    stop: &std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> u64 {
    let threads: Vec<_> = (0..LIVE_WRITERS)
        .map(|k| {
            let (s, stop) = (s.clone(), stop.clone());
            std::thread::spawn(move || {
                let mut v = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed)
                    && v < LIVE_COMMITS_PER_WRITER
                {
                    let stream = format!("live-{k}");
                    s.append(commit(
                        &stream,
                        ExpectedVersion::Exact(v),
                        &live_payload(k, v + 1),
                    ))
                    .unwrap();
                    v += 1;
                }
                v
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

/// Every view is a prefix of the final log.
fn assert_prefixes(views: &[Vec<(u64, u64)>], fin: &[(u64, u64)]) {
    for v in views {
        assert!(
            v.len() <= fin.len(),
            "a view of {} commits, {} in the end",
            v.len(),
            fin.len()
        );
        assert_eq!(v[..], fin[..v.len()], "a view is not a prefix of the log");
    }
}

/// Read-only opens and `verify` in a loop beside writer threads of the same process
/// appending durably as fast as they can: no damage reported, every view a prefix of
/// the log and no longer than what was acknowledged by the end.
fn readers_beside_a_writer_thread(segments: &str) {
    let dir = tempfile::tempdir().unwrap();
    let s = std::sync::Arc::new(Store::open(dir.path(), live_opts(segments)).unwrap());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (s, stop) = (s.clone(), stop.clone());
        std::thread::spawn(move || append_live(&s, &stop))
    };
    if segments == "small-checkpoints" {
        // Readers start once a background checkpoint exists (after the first move into
        // sled); the writer goes on rewriting it while they read.
        while s.stats().checkpoints_written == 0 && !writer.is_finished() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        assert!(s.stats().checkpoints_written > 0, "{:?}", s.stats());
    }
    let views: Vec<_> = (0..LIVE_READS)
        .map(|_| read_live_prefix(dir.path(), segments))
        .collect();
    if segments == "small-checkpoints" {
        let ro = Store::open_read_only(dir.path(), live_opts(segments)).unwrap();
        assert!(ro.stats().open_checkpoint_seq.is_some(), "{:?}", ro.stats());
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked = writer.join().unwrap();
    let fin = read_live_prefix(dir.path(), segments);
    assert_eq!(fin.len() as u64, acked);
    assert_prefixes(&views, &fin);
}

#[test]
fn read_only_opens_and_verify_beside_a_writer_thread_small_segments() {
    readers_beside_a_writer_thread("small");
}

#[test]
fn read_only_opens_and_verify_beside_a_writer_thread_rewriting_checkpoints() {
    readers_beside_a_writer_thread("small-checkpoints");
}

#[test]
fn read_only_opens_and_verify_beside_a_writer_thread_default_segments() {
    readers_beside_a_writer_thread("default");
}

/// In the child: own the store, say so, append as fast as it can up to
/// `LIVE_COMMITS_PER_WRITER` per thread, then wait to be killed.
fn live_writer_child(dir: &str) -> ! {
    let segments = std::env::var(LIVE_SEGMENTS_ENV).unwrap_or_default();
    let s = std::sync::Arc::new(Store::open(dir, live_opts(&segments)).unwrap());
    println!("ready");
    append_live(
        &s,
        &std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
    );
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// The same beside a writer in another process (this test binary re-run as the child),
/// killed with SIGKILL at the end: every view is a prefix of what the next owner finds.
fn readers_beside_a_writer_process(test: &str, segments: &str) {
    if let Ok(dir) = std::env::var(LIVE_CHILD_ENV) {
        live_writer_child(&dir);
    }
    let dir = tempfile::tempdir().unwrap();
    let mut kid = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env(LIVE_CHILD_ENV, dir.path())
        .env(LIVE_SEGMENTS_ENV, segments)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = kid.stdout.take().unwrap();
    let ready = BufReader::new(out)
        .lines()
        .any(|l| l.map(|l| l.contains("ready")).unwrap_or(false));
    if !ready {
        let _ = kid.kill();
        panic!("child did not get ready");
    }
    let views = std::panic::catch_unwind(|| {
        (0..LIVE_READS)
            .map(|_| read_live_prefix(dir.path(), segments))
            .collect::<Vec<_>>()
    });
    kid.kill().unwrap(); // SIGKILL
    kid.wait().unwrap();
    let views = views.unwrap_or_else(|p| std::panic::resume_unwind(p));
    drop(Store::open(dir.path(), live_opts(segments)).unwrap());
    let fin = read_live_prefix(dir.path(), segments);
    assert_prefixes(&views, &fin);
}

#[test]
fn read_only_opens_and_verify_beside_a_writer_process_small_segments() {
    readers_beside_a_writer_process(
        "process::read_only_opens_and_verify_beside_a_writer_process_small_segments",
        "small",
    );
}

#[test]
fn read_only_opens_and_verify_beside_a_writer_process_rewriting_checkpoints() {
    readers_beside_a_writer_process(
        "process::read_only_opens_and_verify_beside_a_writer_process_rewriting_checkpoints",
        "small-checkpoints",
    );
}

#[test]
fn read_only_opens_and_verify_beside_a_writer_process_default_segments() {
    readers_beside_a_writer_process(
        "process::read_only_opens_and_verify_beside_a_writer_process_default_segments",
        "default",
    );
}
