//! Appends entries through a writer handle on a buffered log store and
//! prints the rate: the handle's append path on its own, for profiling
//! (`perf record`), outside `spool bench`'s peers.
//! Run it with `cargo run --release -p spool-runtime --example handle_append [N]`.

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
    let dir = tempfile::tempdir()?;
    let opts = LogStoreOptions {
        durability: spool_engine::Durability::Buffered,
        ..LogStoreOptions::default()
    };
    let store = Arc::new(LogStore::open(dir.path(), opts)?);
    let runtime = SessionRuntime::new(store, Arc::new(NullSink), SessionHookStack::empty());
    let agent = AgentDefinition::new("bench", "append profile", "You are profiled.");
    let id = runtime.create(agent, None)?.id().clone();
    let handle = runtime.open_handle(&id, HandleOptions::writer())?;
    let sizes = [200usize, 1024, 4096];
    let start = Instant::now();
    for i in 0..n {
        let text = "x".repeat(sizes[i % sizes.len()]);
        handle.append(EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(text)],
            },
        })?;
    }
    let secs = start.elapsed().as_secs_f64();
    println!(
        "{n} appends in {secs:.3} s: {:.0} appends/s",
        n as f64 / secs
    );
    Ok(())
}
