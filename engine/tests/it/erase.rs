//! Erasing GC: replaced and dropped commits leave no byte in any file of the store
//! directory (segments, the index, checkpoints), the active segment included, and a
//! crash at any sync leaves the old or the new log.
use crate::common;
use common::*;
use spool_engine::vfs::{FaultKind, FaultVfs, OpenMode, OsVfs, SimVfs, Vfs};
use spool_engine::*;
use std::path::Path;
use std::sync::Arc;

const SECRET: &[u8] = b"SECRET-c0ffee";

/// Copies every commit's first payload into the index, as an indexer that keeps
/// summaries of content would: the index's files then hold the secret too.
struct CopyIndexer;

impl Indexer for CopyIndexer {
    fn name(&self) -> &'static str {
        "copy"
    }
    fn version(&self) -> u32 {
        1
    }
    fn apply(&self, c: &RecordedCommit, batch: &mut IndexBatch<'_>) -> Result<(), IndexError> {
        if let Some(e) = c.events.first() {
            batch.insert(&c.info.seq.to_be_bytes(), &e.payload);
        }
        Ok(())
    }
}

fn opts() -> Options {
    Options::default()
        .segment_bytes_max(4096)
        .next_segment(NextSegment::Inline)
        .indexer(Arc::new(CopyIndexer))
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// Files under `dir` (recursively, on the host file system) holding `needle`.
fn files_with(dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else if contains(&std::fs::read(&p).unwrap(), needle) {
                hits.push(p.display().to_string());
            }
        }
    }
    hits
}

/// Files of the simulated store directory holding `needle`.
fn sim_files_with(vfs: &dyn Vfs, dir: &Path, needle: &[u8]) -> Vec<String> {
    let mut hits = Vec::new();
    for n in vfs.read_dir(dir).unwrap() {
        let p = dir.join(&n);
        let Ok(f) = vfs.open(&p, OpenMode::Read) else {
            continue;
        };
        let mut b = vec![0u8; f.len().unwrap() as usize];
        f.read_at(&mut b, 0).unwrap();
        if contains(&b, needle) {
            hits.push(n);
        }
    }
    hits
}

/// Streams `keep-0..2` (every third commit holds the secret) and `gone` (every commit
/// does), interleaved over many segments; the last commits land in the active segment.
fn fill(s: &Store, rounds: u64) {
    for _ in 0..rounds {
        for name in ["keep-0", "gone", "keep-1", "keep-2"] {
            let v = s.stream_version(name).unwrap().unwrap_or(0);
            let secret = name == "gone" || (v + 1).is_multiple_of(3);
            let mut payload = format!("{name}:{}:", v + 1).into_bytes();
            if secret {
                payload.extend_from_slice(SECRET);
            }
            payload.resize(150, b'.');
            committed(
                s.append(commit(name, ExpectedVersion::Exact(v), &payload))
                    .unwrap(),
            );
        }
    }
}

fn decide(c: &RecordedCommit) -> GcAction {
    if c.info.stream == "gone" {
        GcAction::Drop
    } else if contains(&c.events[0].payload, SECRET) {
        GcAction::Replace(vec![EventData::new(
            "erased",
            format!("v{}", c.info.version).into_bytes(),
        )])
    } else {
        GcAction::Keep
    }
}

/// (stream, version, seq, commit id, kind, payload) of every commit.
type Log = Vec<(String, u64, u64, Uuid, String, Vec<u8>)>;

fn log(s: &Store) -> Log {
    s.scan(1)
        .unwrap()
        .map(|r| {
            let r = r.unwrap();
            (
                r.info.stream,
                r.info.version,
                r.info.seq,
                r.info.commit_id,
                r.events[0].kind.clone(),
                r.events[0].payload.clone(),
            )
        })
        .collect()
}

/// The log an erasing GC with [`decide`] leaves.
fn erased(all: &Log) -> Log {
    all.iter()
        .filter(|c| c.0 != "gone")
        .map(|c| {
            if contains(&c.5, SECRET) {
                (
                    c.0.clone(),
                    c.1,
                    c.2,
                    c.3,
                    "erased".to_string(),
                    format!("v{}", c.1).into_bytes(),
                )
            } else {
                c.clone()
            }
        })
        .collect()
}

#[test]
fn an_erasing_gc_leaves_no_byte_of_replaced_or_dropped_commits_anywhere() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s = Store::open(dir, opts()).unwrap();
    fill(&s, 30);
    let all = log(&s);
    let last = all.last().unwrap().clone();
    // The newest commit holds the secret and sits in the active segment.
    assert!(contains(&last.5, SECRET));
    // A checkpoint file written before the GC holds it too.
    std::fs::create_dir_all(dir.join(CHECKPOINT_DIR)).unwrap();
    std::fs::write(dir.join(CHECKPOINT_DIR).join("0001.ckpt"), SECRET).unwrap();
    assert!(files_with(dir, SECRET).len() > 3);

    let plan = s.plan_gc_with(GcOptions::erasing(), &decide).unwrap();
    assert!(
        plan.rolled_active,
        "the active segment is sealed to be compacted"
    );
    assert_eq!(plan.kept_dead_commits, 0);
    assert_eq!(plan.streams_removed, vec!["gone".to_string()]);
    let want_replaced = all
        .iter()
        .filter(|c| c.0 != "gone" && contains(&c.5, SECRET))
        .count() as u64;
    assert_eq!(plan.replaced_commits, want_replaced);
    assert!(plan.reclaimed_bytes > 0);
    let report = s.run_gc(plan).unwrap();
    assert_eq!(report.commits_replaced, want_replaced);
    assert_eq!(report.commits_removed, 30);
    assert!(report.index_wipe_pending);
    assert_eq!(report.checkpoints_removed, 1);
    assert_eq!(report.retire_pending, 0);

    // Versions, seqs and commit ids stay: the erased commits are markers.
    let want = erased(&all);
    assert_eq!(log(&s), want);
    let (stream, version, _, id, _, _) = last;
    let mut retry = NewCommit::new(
        &stream,
        ExpectedVersion::Exact(version - 1),
        ev(b"a retry of the erased commit"),
    );
    retry.commit_id = id;
    match s.append(retry).unwrap() {
        AppendOutcome::AlreadyCommitted(i) => assert_eq!(i.version, version),
        other => panic!("a retry of an erased commit: {other:?}"),
    }
    assert!(s
        .append(commit("keep-0", ExpectedVersion::Exact(30), b"after"))
        .is_ok());
    s.close().unwrap();
    // The segments hold no secret; the index's files still may until the next open.
    for p in seg_files(dir) {
        assert!(!contains(&std::fs::read(&p).unwrap(), SECRET), "{p:?}");
    }
    assert!(dir.join(ERASE_MARKER_FILE).exists());

    let s = Store::open(dir, opts()).unwrap();
    assert!(!dir.join(ERASE_MARKER_FILE).exists());
    let mut want = want;
    want.push(log(&s).last().unwrap().clone());
    assert_eq!(log(&s), want);
    assert_eq!(s.stream_version("gone").unwrap(), None);
    assert_eq!(s.stream_version("keep-0").unwrap(), Some(31));
    // The rebuilt index serves the copy indexer without the secret.
    let mut n = 0;
    for kv in s.index().scan_prefix("copy", b"") {
        let (_, v) = kv.unwrap();
        assert!(!contains(&v, SECRET));
        n += 1;
    }
    assert_eq!(n, want.len());
    s.close().unwrap();
    assert_eq!(files_with(dir, SECRET), Vec::<String>::new());
    let r = verify(dir, opts()).unwrap();
    assert!(r.ok, "{:?}", r.errors);
}

#[test]
fn a_crash_at_every_sync_of_an_erasing_gc_leaves_the_old_or_the_erased_log() {
    let mut outcomes = (0, 0);
    for seed in 0..2u64 {
        let mut n = 1;
        loop {
            let tmp = tempfile::tempdir().unwrap();
            let ix = tmp.path().join("ix");
            let sim = SimVfs::new();
            let o = opts().vfs(Arc::new(sim.clone())).index_dir(&ix);
            let s = Store::open("/store", o).unwrap();
            fill(&s, 12);
            let all = log(&s);
            // From before planning: the seal of the active segment is covered too.
            sim.crash_at_sync(n, seed);
            let res = s
                .plan_gc_with(GcOptions::erasing(), &decide)
                .and_then(|plan| {
                    assert!(!plan.is_empty());
                    s.run_gc(plan)
                });
            let crashed = sim.crash_count() > 0;
            drop(s);
            if !crashed {
                res.unwrap();
                break;
            }
            assert!(
                res.is_err(),
                "seed {seed} sync {n}: a crashed GC reports it"
            );
            let after = sim.after_crash();
            let o = opts().vfs(Arc::new(after.clone())).index_dir(&ix);
            let s = Store::open("/store", o.clone())
                .unwrap_or_else(|e| panic!("seed {seed} sync {n}: reopen failed: {e}"));
            let got = log(&s);
            let new = got != all;
            if new {
                // Every acknowledged commit is there, the erased ones as markers.
                assert_eq!(
                    got,
                    erased(&all),
                    "seed {seed} sync {n}: neither old nor new"
                );
                outcomes.1 += 1;
            } else {
                outcomes.0 += 1;
            }
            for (name, v) in s.streams().unwrap() {
                let rs = s.read_stream(&name, 1, 1000).unwrap();
                assert_eq!(rs.last().unwrap().info.version, v);
            }
            s.append(commit("keep-0", ExpectedVersion::Exact(12), b"after"))
                .unwrap();
            s.close().unwrap();
            let root = Path::new("/store");
            let names = after.read_dir(root).unwrap();
            assert!(
                names.iter().all(|n| !n.ends_with(".gc")
                    && !n.ends_with(".manifest")
                    && n != ERASE_MARKER_FILE),
                "seed {seed} sync {n}: leftovers {names:?}"
            );
            if new {
                assert_eq!(
                    sim_files_with(&after, root, SECRET),
                    Vec::<String>::new(),
                    "seed {seed} sync {n}"
                );
                assert_eq!(files_with(&ix, SECRET), Vec::<String>::new());
            }
            let r = verify("/store", o).unwrap();
            assert!(r.ok, "seed {seed} sync {n}: {:?}", r.errors);
            n += 1;
        }
        assert!(n > 4, "the GC has several sync points");
    }
    assert!(outcomes.0 > 0 && outcomes.1 > 0, "{outcomes:?}");
}

#[test]
fn a_fault_at_every_io_call_of_an_erasing_gc_leaves_the_old_or_the_erased_log() {
    let probe = |fault: Option<u64>| {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        let fv = FaultVfs::new(Arc::new(OsVfs));
        let s = Store::open(dir, opts().vfs(Arc::new(fv.clone()))).unwrap();
        fill(&s, 12);
        let all = log(&s);
        fv.reset_counts();
        if let Some(k) = fault {
            fv.fail_nth(FaultKind::Any, k, false);
        }
        let res = s
            .plan_gc_with(GcOptions::erasing(), &decide)
            .and_then(|plan| s.run_gc(plan));
        let calls = fv.count(FaultKind::Any);
        let injected = fv.injected() > 0;
        drop(s);
        if injected {
            assert!(res.is_err(), "fault {fault:?}: an injected fault surfaces");
        } else {
            res.unwrap();
        }
        let s = Store::open(dir, opts()).unwrap();
        let got = log(&s);
        let new = got != all;
        if new {
            assert_eq!(got, erased(&all), "fault {fault:?}: neither old nor new");
        }
        assert!(
            new || injected,
            "fault {fault:?}: a GC without a fault erases"
        );
        for (name, v) in s.streams().unwrap() {
            let rs = s.read_stream(&name, 1, 1000).unwrap();
            assert_eq!(rs.last().unwrap().info.version, v);
        }
        s.close().unwrap();
        if new {
            assert_eq!(
                files_with(dir, SECRET),
                Vec::<String>::new(),
                "fault {fault:?}"
            );
        }
        assert!(!dir.join(ERASE_MARKER_FILE).exists());
        let r = verify(dir, opts()).unwrap();
        assert!(r.ok, "fault {fault:?}: {:?}", r.errors);
        calls
    };
    let calls = probe(None);
    assert!(calls > 10, "{calls}");
    for k in 1..=calls {
        probe(Some(k));
    }
}

#[test]
fn an_open_that_fails_while_finishing_an_erasure_leaves_it_to_the_next_open() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let s = Store::open(dir, opts()).unwrap();
    fill(&s, 12);
    let plan = s.plan_gc_with(GcOptions::erasing(), &decide).unwrap();
    s.run_gc(plan).unwrap();
    s.close().unwrap();
    let mut k = 1;
    loop {
        let fv = FaultVfs::new(Arc::new(OsVfs));
        fv.fail_nth(FaultKind::Any, k, false);
        let res = Store::open(dir, opts().vfs(Arc::new(fv.clone())));
        let injected = fv.injected() > 0;
        match res {
            Ok(s) => {
                s.close().unwrap();
                if !injected {
                    break;
                }
            }
            Err(_) => assert!(injected, "call {k}: an open fails only by the fault"),
        }
        k += 1;
    }
    assert!(k > 3, "the open makes several calls");
    assert!(!dir.join(ERASE_MARKER_FILE).exists());
    assert_eq!(files_with(dir, SECRET), Vec::<String>::new());
    let r = verify(dir, opts()).unwrap();
    assert!(r.ok, "{:?}", r.errors);
}
