//! Appends entries through a writer handle on a buffered log store and
//! prints the rate, the appending threads' and the process's CPU per
//! append, and how the appending threads' wall time splits into on a CPU,
//! runnable and waiting (Linux only): the handle's append path on its own,
//! for profiling (`perf record`), outside `spool-bench`'s peers.
//! Run it with
//! `cargo run --release -p spool-runtime --example handle_append [N] [durable] [WRITERS] [BUDGET_BYTES] [POLL_US]`
//! (`durable`: engine durability `Immediate`, acknowledged after fdatasync;
//! `WRITERS` threads, default 1, each append `N` entries to a session of
//! their own, and the engine's group statistics are printed;
//! `BUDGET_BYTES`: the writer handles' resident byte budget, with up to
//! 1,000,000 events, instead of the default 64 KiB / 1024 events, to see
//! the append cost against the size of the resident snapshot, `-` for the
//! default; `POLL_US`: the index thread's poll window,
//! `LogStoreOptions::index_thread_poll`, default zero; any word but
//! `durable` keeps the store buffered).

use std::sync::Arc;
use std::time::Instant;

use spool_runtime::handle::HandleOptions;
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::store::{LogStore, LogStoreOptions};
use spool_runtime::transcript::{Budget, ContentBlock, EntryKind, Message};
use spool_runtime::{AgentDefinition, SessionRuntime};

/// Events allowed with `BUDGET_BYTES`: the byte budget is the bound.
const BUDGET_EVENTS_MAX: u64 = 1_000_000;

/// The allocator of the `spool` binary (see its `main.rs`), so this
/// profile is of what `spool-bench` runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    let durable = std::env::args().nth(2).as_deref() == Some("durable");
    let dir = tempfile::tempdir()?;
    let poll_us: Option<u64> = std::env::args().nth(5).map(|s| s.parse()).transpose()?;
    let opts = LogStoreOptions {
        durability: if durable {
            spool_engine::Durability::Immediate
        } else {
            spool_engine::Durability::Buffered
        },
        index_thread_poll: poll_us.map(std::time::Duration::from_micros),
        ..LogStoreOptions::default()
    };
    let writers: usize = std::env::args()
        .nth(3)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(1)
        .max(1);
    let budget_bytes: Option<u64> = std::env::args()
        .nth(4)
        .filter(|s| s != "-")
        .map(|s| s.parse())
        .transpose()?;
    let store = Arc::new(LogStore::open(dir.path(), opts)?);
    let engine = store.engine()?;
    let runtime = SessionRuntime::new(store, Arc::new(NullSink), SessionHookStack::empty());
    let agent = AgentDefinition::new("bench", "append profile", "You are profiled.");
    let mut handles = Vec::with_capacity(writers);
    for _ in 0..writers {
        let id = runtime.create(agent.clone(), None)?.id().clone();
        let mut o = HandleOptions::writer();
        if let Some(bytes_max) = budget_bytes {
            o.budget = Budget::new(bytes_max, BUDGET_EVENTS_MAX);
        }
        handles.push(runtime.open_handle(&id, o)?);
    }
    let before = engine.stats();
    let process_cpu0 = process_cpu_ns();
    let start = Instant::now();
    let per_thread: Vec<ThreadTimes> = std::thread::scope(|s| {
        let threads: Vec<_> = handles
            .iter()
            .map(|handle| {
                s.spawn(move || -> Result<ThreadTimes, String> {
                    let sizes = [200usize, 1024, 4096];
                    let sched0 = thread_sched_ns();
                    let wall0 = Instant::now();
                    for i in 0..n {
                        let text = "x".repeat(sizes[i % sizes.len()]);
                        handle
                            .append(EntryKind::Message {
                                message: Message::User {
                                    content: vec![ContentBlock::text(text)],
                                },
                            })
                            .map_err(|e| e.to_string())?;
                    }
                    let sched1 = thread_sched_ns();
                    Ok(ThreadTimes {
                        wall_ns: wall0.elapsed().as_nanos() as u64,
                        cpu_ns: sched1.0.saturating_sub(sched0.0),
                        runnable_ns: sched1.1.saturating_sub(sched0.1),
                    })
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().expect("writer thread").expect("appends"))
            .collect()
    });
    let secs = start.elapsed().as_secs_f64();
    let process_cpu = process_cpu_ns().saturating_sub(process_cpu0);
    let after = engine.stats();
    let total = (n * writers) as f64;
    let writer_cpu: u64 = per_thread.iter().map(|t| t.cpu_ns).sum();
    let writer_wall: u64 = per_thread.iter().map(|t| t.wall_ns).sum::<u64>().max(1);
    let writer_runnable: u64 = per_thread.iter().map(|t| t.runnable_ns).sum();
    let writer_waiting = writer_wall.saturating_sub(writer_cpu + writer_runnable);
    let groups = after
        .write_groups
        .saturating_sub(before.write_groups)
        .max(1);
    println!(
        "{writers} writer(s) x {n} appends in {secs:.3} s: {:.0} appends/s, {:.1} µs of the \
         appending threads' CPU and {:.1} µs of the process's CPU per append; {:.2} commits \
         per group, {:.1} µs per group; {} groups prepared during their fdatasync, {} of \
         them taken by the polling index thread; the appending threads' wall time: {:.1} % \
         on a CPU, {:.1} % runnable, {:.1} % waiting",
        total / secs,
        writer_cpu as f64 / 1e3 / total,
        process_cpu as f64 / 1e3 / total,
        after.commits.saturating_sub(before.commits) as f64 / groups as f64,
        secs * 1e6 / groups as f64,
        after
            .groups_prepared_ahead
            .saturating_sub(before.groups_prepared_ahead),
        after.groups_polled.saturating_sub(before.groups_polled),
        100.0 * writer_cpu as f64 / writer_wall as f64,
        100.0 * writer_runnable as f64 / writer_wall as f64,
        100.0 * writer_waiting as f64 / writer_wall as f64,
    );
    Ok(())
}

/// Nanoseconds this process has run on a CPU, all threads (Linux
/// `/proc/self/stat` utime + stime in clock ticks of 10 ms; 0 elsewhere).
fn process_cpu_ns() -> u64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0;
    };
    // Fields after the parenthesized command name; utime and stime are
    // fields 14 and 15 of the whole line.
    let Some(rest) = stat.rsplit_once(')').map(|(_, r)| r) else {
        return 0;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    // rest starts at field 3 (state): utime is field 14 -> index 11.
    (ticks(11) + ticks(12)) * 10_000_000
}

/// An appending thread's time over its appends.
struct ThreadTimes {
    wall_ns: u64,
    /// On a CPU: the append path's own cost, apart from the index's background
    /// thread and from waits.
    cpu_ns: u64,
    /// Runnable but not running (the machine's other threads had the CPUs).
    runnable_ns: u64,
}

/// Nanoseconds this thread has run on a CPU and waited runnable for one (Linux
/// `schedstat`; zeros elsewhere). What its wall time holds besides is waiting: for
/// a lock, a move into sled, an fsync.
fn thread_sched_ns() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/thread-self/schedstat").unwrap_or_default();
    let mut f = s.split_whitespace().map(|v| v.parse::<u64>().unwrap_or(0));
    (f.next().unwrap_or(0), f.next().unwrap_or(0))
}
