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
