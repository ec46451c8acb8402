//! Forks a 10k-entry session at its middle entry on a durable log store,
//! then opens each fork with a read-only 64 KiB handle, and prints the
//! rate: `SessionRuntime::fork` on its own, for profiling (`perf record`).
//! The source is loaded as appends leave it (one commit per entry,
//! buffered), then the store is reopened with `Immediate` durability and
//! the source loaded once (which writes its snapshot) before the timing.
//! Run it with
//! `cargo run --release -p spool-runtime --example fork_profile [FORKS] [ENTRIES]`.

use std::sync::Arc;
use std::time::Instant;

use spool_runtime::handle::HandleOptions;
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::session::SessionEvent;
use spool_runtime::store::TranscriptBackend;
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::transcript::{
    Budget, ContentBlock, Entry, EntryId, EntryKind, Message, StopReason, Usage,
    DEFAULT_RESIDENT_EVENTS_MAX,
};
use spool_runtime::{AgentDefinition, SessionRuntime};

/// A small deterministic generator (SplitMix64) for the text mix.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Entry `seq` of the mix: 35 % user (100..=300 B), 45 % assistant
/// (512..=1536 B), 20 % tool output (2048..=6144 B), chained under the
/// previous entry.
fn entry(rng: &mut Rng, seq: u64) -> Result<Entry, Box<dyn std::error::Error>> {
    let id = EntryId::parse(&format!("e{seq}"))?;
    let parent = match seq.checked_sub(1) {
        Some(p) => Some(EntryId::parse(&format!("e{p}"))?),
        None => None,
    };
    let roll = rng.range(0, 99);
    let (lo, hi) = match roll {
        0..=34 => (100, 300),
        35..=79 => (512, 1536),
        _ => (2048, 6144),
    };
    let len = rng.range(lo, hi) as usize;
    let mut text = String::with_capacity(len + 8);
    while text.len() < len {
        text.push_str(["alpha ", "beta\n", "\"gamma\" ", "delta\\ "][(rng.next() % 4) as usize]);
    }
    text.truncate(len);
    let content = vec![ContentBlock::text(text)];
    let kind = match roll {
        0..=34 => EntryKind::Message {
            message: Message::User { content },
        },
        35..=79 => EntryKind::Message {
            message: Message::Assistant {
                content,
                stop_reason: StopReason::Stop,
                usage: Usage::default(),
                model: None,
                error_message: None,
            },
        },
        _ => EntryKind::CustomMessage {
            custom_type: "tool_output".into(),
            content,
            display: true,
            details: None,
        },
    };
    Ok(Entry {
        id,
        parent_id: parent,
        timestamp_ms: 1_700_000_000_000 + seq as i64,
        kind,
    })
}

/// CPU seconds (user + system) this process has used, all threads: on a
/// shared machine a steadier figure than wall time. From `/proc/self/stat`
/// (fields 14 and 15, in clock ticks of `USER_HZ`, 100 on Linux); 0 where
/// it cannot be read, which makes the CPU figure meaningless, never
/// plausible-looking.
fn cpu_secs() -> f64 {
    const USER_HZ: f64 = 100.0;
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // The command name (field 2) may hold spaces: count from after it.
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<u64>().ok());
    match (ticks(11), ticks(12)) {
        (Some(user), Some(system)) => (user + system) as f64 / USER_HZ,
        _ => 0.0,
    }
}

/// The allocator of the `spool` binary (see its `main.rs`), so this
/// profile is of what `spool-bench` runs.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let forks: usize = args.next().map(|s| s.parse()).transpose()?.unwrap_or(20);
    let n: u64 = args
        .next()
        .map(|s| s.parse())
        .transpose()?
        .unwrap_or(10_000);
    let dir = tempfile::tempdir()?;
    let id = {
        let opts = LogStoreOptions {
            durability: spool_engine::Durability::Buffered,
            ..LogStoreOptions::default()
        };
        let store = LogStore::open(dir.path(), opts)?;
        let agent = AgentDefinition::new("bench", "fork profile", "You are profiled.");
        let created = store.create(spool_runtime::session::AgentSession::new(agent, None))?;
        let mut version = created.version();
        let mut rng = Rng(0x5EED);
        for seq in 0..n {
            let entry = entry(&mut rng, seq)?;
            version = store
                .append_events(
                    created.id(),
                    version,
                    vec![SessionEvent::EntryAppended { entry }],
                )?
                .session_version;
        }
        let id = created.id().clone();
        store.close()?;
        id
    };
    let opts = LogStoreOptions {
        durability: spool_engine::Durability::Immediate,
        ..LogStoreOptions::default()
    };
    let store = Arc::new(LogStore::open(dir.path(), opts)?);
    // A first load replays the appends and writes the source's snapshot;
    // the forks below read it, as every later fork of a session does.
    store.load(&id)?;
    let runtime = SessionRuntime::new(store, Arc::new(NullSink), SessionHookStack::empty());
    let at = EntryId::parse(&format!("e{}", n / 2))?;
    let cpu_start = cpu_secs();
    let start = Instant::now();
    let mut fork_secs = 0.0;
    for _ in 0..forks {
        let t = Instant::now();
        let fork = runtime.fork(&id, Some(at.clone()))?;
        fork_secs += t.elapsed().as_secs_f64();
        let h = runtime.open_handle(
            fork.id(),
            HandleOptions::reader().with_budget(Budget::new(65_536, DEFAULT_RESIDENT_EVENTS_MAX)),
        )?;
        let context = h.snapshot().context();
        assert!(!context.messages.is_empty());
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = cpu_secs() - cpu_start;
    println!(
        "{forks} forks of {n} entries in {secs:.3} s: {:.2} forks/s (fork alone {:.1} ms each; \
         {:.1} ms CPU per fork and open, all threads)",
        forks as f64 / secs,
        fork_secs * 1000.0 / forks as f64,
        cpu * 1000.0 / forks as f64
    );
    Ok(())
}
