//! `spool stress`: a write load (durable by default, `--durability buffered`
//! to acknowledge from the page cache), used for crash testing (kill -9
//! loops check the `--ack-file` against the store) and for throughput.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use spool_engine::{
    AppendOutcome, Durability, EventData, ExpectedVersion, NewCommit, Options, Store,
};

use crate::cli::DurabilityArg;
use crate::out::{human_bytes, print_doc, Result, ToolError};

pub struct Args {
    pub writers: u32,
    pub seconds: f64,
    pub payload_bytes: u32,
    pub segment_bytes: Option<u64>,
    pub durability: DurabilityArg,
    pub ack_file: Option<PathBuf>,
    pub json: bool,
}

/// Upper bound on writer threads: each is an OS thread with its own stream.
const WRITERS_MAX: u32 = 1024;
/// Upper bound on `--seconds` (a year): longer runs are a mistake, and a
/// duration must be representable before the run starts.
pub const SECONDS_MAX: f64 = 365.0 * 86_400.0;

#[derive(Serialize)]
struct Summary {
    writers: u32,
    durability: &'static str,
    seconds: f64,
    commits: u64,
    commits_per_sec: f64,
    mb_per_sec: f64,
    payload_bytes: u32,
    fsyncs: u64,
    commits_per_fsync: f64,
}

pub fn run(dir: &Path, args: Args) -> Result<ExitCode> {
    if args.writers == 0 || args.writers > WRITERS_MAX {
        return Err(ToolError::new(format!(
            "--writers must be between 1 and {WRITERS_MAX}"
        )));
    }
    let run_for = Some(args.seconds)
        .filter(|s| (0.0..=SECONDS_MAX).contains(s))
        .and_then(|s| Duration::try_from_secs_f64(s).ok())
        .ok_or_else(|| {
            ToolError::new(format!(
                "--seconds must be a number from 0 to {SECONDS_MAX} (a year), not {}",
                args.seconds
            ))
        })?;
    // Checked before the payload is allocated: a commit's record holds
    // the payload, so a larger one can never be written.
    let record_max = u64::from(spool_engine::RECORD_BYTES_MAX_DEFAULT);
    if u64::from(args.payload_bytes) > record_max {
        return Err(ToolError::new(format!(
            "--payload-bytes {} is over the record size limit of {} ({record_max} bytes)",
            args.payload_bytes,
            human_bytes(record_max)
        )));
    }
    let mut opts = Options::default().durability(match args.durability {
        DurabilityArg::Immediate => Durability::Immediate,
        DurabilityArg::Buffered => Durability::Buffered,
    });
    if let Some(s) = args.segment_bytes {
        opts = opts.segment_bytes_max(s);
    }
    crate::cmd::refuse_file(dir)?;
    let store = Store::open(dir, opts).map_err(|e| {
        ToolError::with_source(format!("opening {} failed", dir.display()), e).hint_from_cause(None)
    })?;
    let store = Arc::new(store);
    let ack = match &args.ack_file {
        Some(p) => Some(Arc::new(Mutex::new(open_ack_file(p)?))),
        None => None,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let commits = Arc::new(AtomicU64::new(0));
    let fsyncs_before = store.stats().fsyncs;
    let payload = Arc::new(vec![0x5au8; args.payload_bytes as usize]);
    let started = Instant::now();
    let mut handles = Vec::new();
    // Each writer says when it stops, so the run ends as soon as every
    // writer has failed instead of sleeping out its time.
    let (exited_tx, exited) = std::sync::mpsc::channel::<()>();
    for i in 0..args.writers {
        let exited_tx = exited_tx.clone();
        let store = Arc::clone(&store);
        let ack = ack.clone();
        let stop = Arc::clone(&stop);
        let commits = Arc::clone(&commits);
        let payload = Arc::clone(&payload);
        handles.push(std::thread::spawn(move || -> Result<()> {
            let _exited = ExitSignal(exited_tx);
            let stream = format!("stress-{i}");
            let mut version = store
                .stream_version(&stream)
                .map_err(|e| ToolError::with_source("reading stream head failed", e))?
                .unwrap_or(0);
            while !stop.load(Ordering::Relaxed) {
                let expected = if version == 0 {
                    ExpectedVersion::NoStream
                } else {
                    ExpectedVersion::Exact(version)
                };
                let outcome = store
                    .append(NewCommit {
                        stream: stream.clone(),
                        expected,
                        commit_id: uuid::Uuid::new_v4(),
                        events: vec![EventData {
                            kind: "stress".into(),
                            payload: payload.to_vec(),
                        }],
                    })
                    .map_err(|e| {
                        ToolError::with_source(format!("append to {stream} failed"), e)
                            .hint_from_cause(None)
                    })?;
                match outcome {
                    AppendOutcome::Committed(info) | AppendOutcome::AlreadyCommitted(info) => {
                        version = info.version;
                        commits.fetch_add(1, Ordering::Relaxed);
                        if let Some(ack) = &ack {
                            // One write per line: a kill between syscalls must never
                            // leave half a line followed by another writer's line.
                            let line = format!("{stream} {version}\n");
                            let mut f = ack.lock().unwrap_or_else(|p| p.into_inner());
                            f.write_all(line.as_bytes()).map_err(|e| {
                                ToolError::with_source("writing the ack file failed", e)
                            })?;
                        }
                    }
                    AppendOutcome::Conflict { actual, .. } => {
                        return Err(ToolError::new(format!(
                            "unexpected conflict on {stream}: another writer moved it to {actual:?}"
                        ))
                        .hint("run only one `spool stress` per store"));
                    }
                    #[allow(unreachable_patterns)]
                    _ => return Err(ToolError::new("unexpected append outcome")),
                }
            }
            Ok(())
        }));
    }
    drop(exited_tx);
    let deadline = started + run_for;
    let mut running = args.writers;
    while running > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        match exited.recv_timeout(left) {
            Ok(()) => running -= 1,
            Err(_) => break,
        }
    }
    stop.store(true, Ordering::Relaxed);
    let mut first_err = None;
    let mut failed = 0u32;
    for h in handles {
        let failure = match h.join() {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e),
            Err(_) => Some(ToolError::new("a writer thread panicked")),
        };
        if let Some(e) = failure {
            failed += 1;
            first_err.get_or_insert(e);
        }
    }
    let elapsed = started.elapsed().as_secs_f64().max(1e-9);
    if let Some(e) = first_err {
        let hint = e.get_hint().map(str::to_string);
        let all = if failed == args.writers { "all " } else { "" };
        let err = ToolError::with_source(
            format!(
                "stress: {all}{failed} of {} writer(s) failed after {elapsed:.2}s and {} commit(s)",
                args.writers,
                commits.load(Ordering::Relaxed)
            ),
            e,
        );
        return Err(match hint {
            Some(h) => err.hint(h),
            None => err,
        });
    }
    let fsyncs = store.stats().fsyncs.saturating_sub(fsyncs_before);
    let store = Arc::try_unwrap(store).map_err(|_| ToolError::new("store still shared"))?;
    store
        .close()
        .map_err(|e| ToolError::with_source("closing the store failed", e))?;
    let n = commits.load(Ordering::Relaxed);
    let summary = Summary {
        writers: args.writers,
        durability: match args.durability {
            DurabilityArg::Immediate => "immediate",
            DurabilityArg::Buffered => "buffered",
        },
        seconds: elapsed,
        commits: n,
        commits_per_sec: n as f64 / elapsed,
        mb_per_sec: (n as f64 * f64::from(args.payload_bytes)) / elapsed / 1e6,
        payload_bytes: args.payload_bytes,
        fsyncs,
        commits_per_fsync: if fsyncs == 0 {
            0.0
        } else {
            n as f64 / fsyncs as f64
        },
    };
    if args.json {
        print_doc(&summary)?;
    } else {
        crate::outln!(
            "{} commits in {:.2}s by {} writer(s), {}: {:.0} commits/s, {:.2} MB/s ({} per commit); {} fsyncs, {:.1} commits per fsync",
            summary.commits,
            summary.seconds,
            summary.writers,
            summary.durability,
            summary.commits_per_sec,
            summary.mb_per_sec,
            human_bytes(u64::from(summary.payload_bytes)),
            summary.fsyncs,
            summary.commits_per_fsync
        );
    }
    Ok(ExitCode::SUCCESS)
}

/// Sent (by being dropped) when a writer thread ends, however it ends.
struct ExitSignal(std::sync::mpsc::Sender<()>);

impl Drop for ExitSignal {
    fn drop(&mut self) {
        let _ = self.0.send(());
    }
}

/// Opens the ack file for appending, first ending a line a killed run left
/// unfinished: a `write` of a line that straddles a page boundary of the
/// file can be cut by SIGKILL between the pages, and this run's first line
/// must not continue that fragment.
fn open_ack_file(p: &Path) -> Result<std::fs::File> {
    use std::os::unix::fs::FileExt;
    let failed = |what: &str, e: std::io::Error| {
        ToolError::with_source(format!("{what} ack file {} failed", p.display()), e)
    };
    let mut f = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        .open(p)
        .map_err(|e| failed("opening", e))?;
    let len = f.metadata().map_err(|e| failed("reading", e))?.len();
    if len > 0 {
        let mut last = [0u8; 1];
        f.read_exact_at(&mut last, len - 1)
            .map_err(|e| failed("reading", e))?;
        if last[0] != b'\n' {
            f.write_all(b"\n").map_err(|e| failed("writing", e))?;
        }
    }
    Ok(f)
}
