//! Rough write-path figures: raw 1 KiB write+fdatasync loop vs. spool appends.
//! `cargo run --release -p spool-engine --example append_bench -- [seconds] [rounds] [dir]`
//! or `... -- single <writers> <immediate|buffered> [seconds]`.

use spool_engine::*;
use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn raw_loop(dir: &std::path::Path, secs: f64, prealloc_zero: bool) -> f64 {
    let path = dir.join("raw.bin");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(&path)
        .unwrap();
    let size = 64u64 << 20;
    if prealloc_zero {
        let z = vec![0u8; 1 << 20];
        for i in 0..64 {
            f.write_all_at(&z, i << 20).unwrap();
        }
        f.sync_all().unwrap();
    }
    let buf = vec![1u8; 1024];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        f.write_all_at(&buf, (n * 1024) % size).unwrap();
        f.sync_data().unwrap();
        n += 1;
    }
    let _ = std::fs::remove_file(&path);
    n as f64 / start.elapsed().as_secs_f64()
}

fn spool(
    dir: &std::path::Path,
    secs: f64,
    writers: usize,
    d: Durability,
    p: Preallocate,
) -> (f64, StoreStats) {
    let _ = std::fs::remove_dir_all(dir);
    let s = Arc::new(Store::open(dir, Options::default().durability(d).preallocate(p)).unwrap());
    let start = Instant::now();
    let deadline = start + Duration::from_secs_f64(secs);
    let handles: Vec<_> = (0..writers)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                let mut v = 0u64;
                let stream = format!("w-{i}");
                while Instant::now() < deadline {
                    let c = NewCommit::new(
                        stream.clone(),
                        ExpectedVersion::Exact(v),
                        vec![EventData::new("e", vec![2u8; 1024])],
                    );
                    match s.append(c).unwrap() {
                        AppendOutcome::Committed(_) => v += 1,
                        o => panic!("{o:?}"),
                    }
                }
                v
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().unwrap()).sum();
    let rate = total as f64 / start.elapsed().as_secs_f64();
    let st = s.stats();
    drop(s);
    let _ = std::fs::remove_dir_all(dir);
    (rate, st)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("single") {
        // append_bench single <writers> <immediate|buffered> [seconds]
        let w: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(1);
        let d = match args.get(3).map(String::as_str) {
            Some("buffered") => Durability::Buffered,
            _ => Durability::Immediate,
        };
        let secs: f64 = args.get(4).and_then(|s| s.parse().ok()).unwrap_or(3.0);
        let base = std::env::temp_dir().join("spool-bench-single");
        let (rate, st) = spool(&base, secs, w, d, Preallocate::Auto);
        println!("{d:?} x{w}: {rate:.0} commits/s {st:?}");
        return;
    }
    // append_bench [seconds per figure] [rounds] [dir]: each round measures every figure
    // back to back, so each ratio compares figures taken under the same load; the
    // medians over the rounds are printed at the end.
    let secs: f64 = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(2.0);
    let rounds: usize = args.get(2).and_then(|s| s.parse().ok()).unwrap_or(3);
    let base = args
        .get(3)
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("spool-bench"));
    std::fs::create_dir_all(&base).unwrap();
    let (mut r_one, mut r_sixteen, mut r_buf) = (Vec::new(), Vec::new(), Vec::new());
    for round in 1..=rounds {
        let raw = raw_loop(&base, secs, true);
        let (one, st1) = spool(
            &base.join("s1"),
            secs,
            1,
            Durability::Immediate,
            Preallocate::Auto,
        );
        let (sixteen, st) = spool(
            &base.join("s16"),
            secs,
            16,
            Durability::Immediate,
            Preallocate::Auto,
        );
        let seq = raw_sequential_writes(&base, secs);
        let (buf, _) = spool(
            &base.join("sb"),
            secs,
            1,
            Durability::Buffered,
            Preallocate::Auto,
        );
        println!(
            "round {round}: raw write+fdatasync {raw:.0}/s | immediate x1 {one:.0}/s \
             ({:.2}x raw, {} fsyncs) | immediate x16 {sixteen:.0}/s ({:.2}x x1, \
             {:.1} commits/fsync) | raw sequential writes {seq:.0}/s | buffered x1 \
             {buf:.0}/s ({:.2}x raw sequential)",
            one / raw,
            st1.fsyncs,
            sixteen / one,
            st.commits as f64 / st.fsyncs.max(1) as f64,
            buf / seq
        );
        r_one.push(one / raw);
        r_sixteen.push(sixteen / one);
        r_buf.push(buf / seq);
    }
    println!(
        "medians over {rounds} rounds: immediate x1 / raw = {:.2} (goal >= 0.8); \
         immediate x16 / x1 = {:.2} (goal >= 5); buffered / raw sequential = {:.2} \
         (goal >= 0.3)",
        median(r_one),
        median(r_sixteen),
        median(r_buf)
    );
}

fn raw_sequential_writes(dir: &std::path::Path, secs: f64) -> f64 {
    let path = dir.join("seq.bin");
    let f = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .unwrap();
    let buf = vec![1u8; 1024];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs && n < (1 << 20) {
        f.write_all_at(&buf, n * 1024).unwrap();
        n += 1;
    }
    let r = n as f64 / start.elapsed().as_secs_f64();
    let _ = std::fs::remove_file(&path);
    r
}
