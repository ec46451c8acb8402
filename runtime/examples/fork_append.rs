//! Appends to a session forked at the leaf of a long one, next to appends
//! to a session that was never forked, on a buffered log store: what a
//! fork's seed costs the appends that follow it (each append checks that
//! its new entry id is unused, which in a forked session also reads the
//! id's seed bucket). Run it with
//! `cargo run --release -p spool-runtime --example fork_append [SEED] [APPENDS] [durable]`
//! (`durable`: the appends are acknowledged after fdatasync; the source is
//! loaded buffered either way).

use std::sync::Arc;
use std::time::Instant;

use spool_runtime::handle::{HandleOptions, SessionHandle};
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::store::{LogStore, LogStoreOptions};
use spool_runtime::transcript::{ContentBlock, EntryKind, Message};
use spool_runtime::{AgentDefinition, SessionRuntime};

fn user(i: usize) -> EntryKind {
    let sizes = [200usize, 1024, 4096];
    EntryKind::Message {
        message: Message::User {
            content: vec![ContentBlock::text("x".repeat(sizes[i % sizes.len()]))],
        },
    }
}

fn appends_per_s(h: &SessionHandle, n: usize) -> Result<f64, Box<dyn std::error::Error>> {
    let start = Instant::now();
    for i in 0..n {
        h.append(user(i))?;
    }
    Ok(n as f64 / start.elapsed().as_secs_f64())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let arg = |i: usize, d: usize| -> Result<usize, Box<dyn std::error::Error>> {
        Ok(std::env::args()
            .nth(i)
            .map(|s| s.parse())
            .transpose()?
            .unwrap_or(d))
    };
    let (seed, n) = (arg(1, 50_000)?, arg(2, 20_000)?);
    let dir = tempfile::tempdir()?;
    let durable = std::env::args().nth(3).as_deref() == Some("durable");
    let open = |durability| -> Result<SessionRuntime, Box<dyn std::error::Error>> {
        let opts = LogStoreOptions {
            durability,
            ..LogStoreOptions::default()
        };
        let store = Arc::new(LogStore::open(dir.path(), opts)?);
        Ok(SessionRuntime::new(
            store,
            Arc::new(NullSink),
            SessionHookStack::empty(),
        ))
    };
    let runtime = open(spool_engine::Durability::Buffered)?;
    let agent = AgentDefinition::new("bench", "fork append profile", "You are profiled.");
    let source = runtime.create(agent.clone(), None)?.id().clone();
    {
        let h = runtime.open_handle(&source, HandleOptions::writer())?;
        for start in (0..seed).step_by(1000) {
            // Short entries: the largest seeds a fork can write (its
            // `created` event must fit one 16 MiB record).
            h.append_entries(
                (start..(start + 1000).min(seed))
                    .map(|_| user(0))
                    .collect::<Vec<_>>(),
            )?;
        }
    }
    let fork = runtime.fork(&source, None)?.id().clone();
    let plain = runtime.create(agent, None)?.id().clone();
    let runtime = if durable {
        drop(runtime);
        open(spool_engine::Durability::Immediate)?
    } else {
        runtime
    };
    let fork_h = runtime.open_handle(&fork, HandleOptions::writer())?;
    let plain_h = runtime.open_handle(&plain, HandleOptions::writer())?;
    // Alternate halves so that both see the same machine.
    let (mut f, mut p) = (Vec::new(), Vec::new());
    for _ in 0..2 {
        p.push(appends_per_s(&plain_h, n / 2)?);
        f.push(appends_per_s(&fork_h, n / 2)?);
    }
    println!(
        "seed {seed}: appends/s to the fork {:.0} / {:.0}, to a plain session {:.0} / {:.0}",
        f[0], f[1], p[0], p[1]
    );
    Ok(())
}
