//! Appends entries through a writer handle on a buffered log store and
//! prints the rate: the handle's append path on its own, for profiling
//! (`perf record`), outside `spool bench`'s peers.
//! Run it with `cargo run --release -p spool-runtime --example handle_append [N] [durable]`
//! (`durable`: engine durability `Immediate`, one fdatasync per append).

use std::sync::Arc;
use std::time::Instant;

use spool_runtime::handle::HandleOptions;
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::store::{LogStore, LogStoreOptions};
use spool_runtime::transcript::{ContentBlock, EntryKind, Message};
use spool_runtime::{AgentDefinition, SessionRuntime};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let n: usize = std::env::args()
        .nth(1)
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(20_000);
    let durable = std::env::args().nth(2).as_deref() == Some("durable");
    let dir = tempfile::tempdir()?;
    let opts = LogStoreOptions {
        durability: if durable {
            spool_engine::Durability::Immediate
        } else {
            spool_engine::Durability::Buffered
        },
        ..LogStoreOptions::default()
    };
    let store = Arc::new(LogStore::open(dir.path(), opts)?);
    let runtime = SessionRuntime::new(store, Arc::new(NullSink), SessionHookStack::empty());
    let agent = AgentDefinition::new("bench", "append profile", "You are profiled.");
    let id = runtime.create(agent, None)?.id().clone();
    let handle = runtime.open_handle(&id, HandleOptions::writer())?;
    let sizes = [200usize, 1024, 4096];
    let start = Instant::now();
    let cpu0 = thread_cpu_ns();
    for i in 0..n {
        let text = "x".repeat(sizes[i % sizes.len()]);
        handle.append(EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(text)],
            },
        })?;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = thread_cpu_ns().saturating_sub(cpu0);
    println!(
        "{n} appends in {secs:.3} s: {:.0} appends/s, {:.1} µs of the appending thread's CPU per append",
        n as f64 / secs,
        cpu as f64 / 1e3 / n as f64
    );
    Ok(())
}

/// Nanoseconds this thread has run on a CPU (Linux `schedstat`; 0 elsewhere): the
/// append path's own cost, apart from the index's background thread and from waits.
fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
