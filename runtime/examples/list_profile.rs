//! Lists session headers filtered by status on a log store, repeatedly, and
//! prints the rate: the log store's header listing on its own, for
//! profiling (`perf record`), outside `spool-bench`'s peers.
//!
//! `cargo run --release -p spool-runtime --example list_profile DIR [N] [SECONDS]`
//! creates N sessions (default 10,000; about 25 % active, the rest
//! suspended, completed or failed, from a fixed seed) in DIR if DIR holds no
//! store yet, then lists the active ones for about SECONDS (default 5) and
//! prints lists per wall-clock second and per CPU second of the listing
//! thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spool_runtime::session::{SessionId, SessionStatus};
use spool_runtime::store::{ListQuery, LogStore, LogStoreOptions, SessionStore};
use spool_runtime::{AgentDefinition, AgentSession};

/// CPU time of the calling thread (nanoseconds on the CPU from
/// `/proc/thread-self/schedstat`); 0 where it cannot be read.
fn cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

/// The status of session `i`: a fixed mix from a SplitMix64 step.
fn status_of(i: u64) -> SessionStatus {
    let mut z = i.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    match (z ^ (z >> 31)) % 100 {
        0..=24 => SessionStatus::Active,
        25..=34 => SessionStatus::Suspended,
        35..=89 => SessionStatus::Completed,
        _ => SessionStatus::Failed,
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: list_profile DIR [N] [SECONDS]")?;
    let n: u64 = args.next().map_or(Ok(10_000), |s| s.parse())?;
    let secs: f64 = args.next().map_or(Ok(5.0), |s| s.parse())?;
    let fresh = !std::path::Path::new(&dir).exists();
    let opts = LogStoreOptions {
        durability: spool_engine::Durability::Buffered,
        ..LogStoreOptions::default()
    };
    let mut store = Arc::new(LogStore::open(&dir, opts.clone())?);
    let mut expected = 0u64;
    for i in 0..n {
        if status_of(i) == SessionStatus::Active {
            expected += 1;
        }
    }
    if fresh {
        let agent = AgentDefinition::new("bench", "list profile", "You are listed.");
        for i in 0..n {
            let id = SessionId::parse(&format!("list-profile-{i:08}"))?;
            let mut s = AgentSession::new_with_id(id, agent.clone(), None);
            let status = status_of(i);
            if status != SessionStatus::Active {
                s.set_status(status)?;
            }
            store.create(s)?;
        }
        // Reopen, as a listing process would find the store: everything
        // moved into the index's tree, nothing pending.
        drop(store);
        store = Arc::new(LogStore::open(&dir, opts)?);
    }
    let query = ListQuery::all().with_status(SessionStatus::Active);
    let (start, cpu0) = (Instant::now(), cpu_secs());
    let mut lists = 0u64;
    while start.elapsed() < Duration::from_secs_f64(secs) {
        let got = store.list_headers(&query)?;
        if got.headers.len() as u64 != expected {
            return Err(
                format!("listed {} headers, expected {expected}", got.headers.len()).into(),
            );
        }
        lists += 1;
    }
    let (wall, cpu) = (start.elapsed().as_secs_f64(), cpu_secs() - cpu0);
    println!(
        "{lists} lists of {expected} headers (of {n} sessions) in {wall:.2} s: \
         {:.0} lists/s wall, {:.0} lists/s CPU",
        lists as f64 / wall,
        lists as f64 / cpu
    );
    Ok(())
}
