//! Opens a prepared session with read-only handles and pages through its
//! branch, printing the rates: the read paths of the log store on their
//! own, for profiling (`perf record`), outside `spool-bench`'s peers.
//!
//! `cargo run --release -p spool-runtime --example handle_read DIR [N] [SECONDS]`
//! loads a session of N entries (one `entry_appended` commit per entry, a
//! mix of 200-byte, 1 KiB and 4 KiB texts) into DIR if DIR holds no store
//! yet, then opens it with a 64 KiB budget and reads its whole branch in
//! 64 KiB root-first pages, each for about SECONDS, and prints each rate
//! per wall-clock second and per CPU second of the reading thread.

use std::sync::Arc;
use std::time::{Duration, Instant};

use spool_runtime::handle::{HandleOptions, HistorySelection};
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::session::{SessionEvent, SessionId};
use spool_runtime::store::TranscriptBackend;
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::transcript::{
    Budget, CancelToken, ContentBlock, Entry, EntryId, EntryKind, Message, PageBudget, PageOrder,
    ReadResult, DEFAULT_RESIDENT_EVENTS_MAX,
};
use spool_runtime::{AgentDefinition, AgentSession, SessionRuntime};

const SESSION: &str = "read-profile";

/// CPU time of the calling thread, which runs every read (the machine may
/// be shared: wall-clock rates would count other processes' time). From
/// `/proc/thread-self/schedstat` (nanoseconds on the CPU); 0 where it
/// cannot be read, which makes the CPU rates infinite, never wrong-looking.
fn cpu_secs() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .map_or(0.0, |ns| ns as f64 / 1e9)
}

fn load(store: &LogStore, n: u64) -> Result<(), Box<dyn std::error::Error>> {
    let agent = AgentDefinition::new("bench", "read profile", "You are profiled.");
    let session = AgentSession::new_with_id(SessionId::parse(SESSION)?, agent, None);
    let created = store.create(session)?;
    let mut version = created.version();
    let sizes = [200usize, 1024, 4096, 1024, 300];
    for seq in 0..n {
        let text = "x".repeat(sizes[(seq % 5) as usize]);
        let entry = Entry {
            id: EntryId::parse(&format!("e{seq}"))?,
            parent_id: match seq.checked_sub(1) {
                Some(p) => Some(EntryId::parse(&format!("e{p}"))?),
                None => None,
            },
            timestamp_ms: 1_700_000_000_000 + seq as i64,
            kind: EntryKind::Message {
                message: Message::User {
                    content: vec![ContentBlock::text(text)],
                },
            },
        };
        version = store
            .append_events(
                created.id(),
                version,
                vec![SessionEvent::EntryAppended { entry }],
            )?
            .session_version;
    }
    Ok(())
}

/// The allocator of the `spool` binary (see its `main.rs`), so this
/// profile is of what `spool-bench` runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = std::path::PathBuf::from(args.next().ok_or("usage: handle_read DIR [N] [SECONDS]")?);
    let n: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(50_000);
    let secs: f64 = args.next().map(|s| s.parse()).transpose()?.unwrap_or(3.0);
    let fresh = !dir.exists();
    let opts = LogStoreOptions {
        durability: spool_engine::Durability::Buffered,
        ..LogStoreOptions::default()
    };
    if fresh {
        let store = LogStore::open(&dir, opts.clone())?;
        load(&store, n)?;
    }
    let store = Arc::new(LogStore::open(&dir, opts)?);
    let runtime = SessionRuntime::new(store, Arc::new(NullSink), SessionHookStack::empty());
    let id = SessionId::parse(SESSION)?;
    let span = Duration::from_secs_f64(secs);

    let start = Instant::now();
    let cpu = cpu_secs();
    let mut opens = 0u64;
    let mut messages = 0usize;
    while start.elapsed() < span {
        let h = runtime.open_handle(
            &id,
            HandleOptions::reader()
                .with_budget(Budget::new(64 * 1024, DEFAULT_RESIDENT_EVENTS_MAX)),
        )?;
        messages = h.snapshot().context().messages.len();
        opens += 1;
    }
    let t = start.elapsed().as_secs_f64();
    let c = cpu_secs() - cpu;
    println!(
        "open: {:.0} opens/s, {:.0} opens per CPU second ({messages} messages)",
        opens as f64 / t,
        opens as f64 / c
    );

    let start = Instant::now();
    let cpu = cpu_secs();
    let mut bytes = 0u64;
    let mut reads = 0u64;
    while start.elapsed() < span {
        let h = runtime.open_handle(&id, HandleOptions::reader().with_budget(Budget::new(0, 0)))?;
        let Some(leaf) = h.snapshot().leaf.clone() else {
            return Err("no leaf".into());
        };
        let mut cursor = None;
        loop {
            let sel = HistorySelection::BranchPage {
                leaf: leaf.clone(),
                order: PageOrder::RootFirst,
                cursor: cursor.take(),
                budget: PageBudget::new(64 * 1024, 64),
            };
            let (value, next) = match h.read(&sel, &CancelToken::new())? {
                ReadResult::Complete { value, .. } => (value, None),
                ReadResult::Page {
                    value,
                    continuation,
                } => (value, Some(continuation)),
                other => return Err(format!("page read: {other:?}").into()),
            };
            let page = value.as_page().ok_or("not a page")?;
            bytes += page.bytes;
            match next {
                Some(c) => cursor = Some(c),
                None => break,
            }
        }
        reads += 1;
    }
    let t = start.elapsed().as_secs_f64();
    let c = cpu_secs() - cpu;
    println!(
        "page: {:.1} MB/s, {:.1} MB per CPU second of entry bytes ({reads} whole-branch reads)",
        bytes as f64 / t / 1e6,
        bytes as f64 / c / 1e6
    );
    Ok(())
}
