//! `spool-bench`: the standard workloads, run against spool and against the
//! peers people would pick instead, side by side in one run.
//!
//! ```sh
//! cargo run --release -p spool-bench -- --quick
//! cargo run --release -p spool-bench -- --store /path/on/the/disk --markdown
//! ```
//!
//! Every subject, spool ([`spool::Spool`], the runtime's public handle API
//! over the log store) and each peer ([`peers`]), implements
//! [`subject::SpoolSubject`] and runs through the same [`harness`]; each
//! workload is one module of [`workloads`]; [`report`] turns a run into
//! JSON or the Markdown of `BENCHMARKS.md`.
//!
//! This crate is not published and is the only one that links the peers
//! (bundled SQLite, the PostgreSQL client and the throwaway server), so the
//! `spool` binary links none of them.

mod data;
mod error;
mod execute_child;
mod harness;
mod peers;
mod report;
mod spool;
mod stats;
mod store_child;
mod subject;
mod workloads;

use std::error::Error as _;
use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;

use crate::harness::BenchConfig;

/// The `spool` binary's allocator, so that spool's figures are those of the
/// binary users run. The JSONL and JSON-file peers, which run in this
/// process, allocate with it too; SQLite and PostgreSQL keep the C
/// library's `malloc`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Measure spool against its peers, side by side in one run.
///
/// Prints the Markdown tables of BENCHMARKS.md by default, one JSON object
/// with `--json`; progress goes to stderr. Exit codes: 0 success, 2 the run
/// failed (a subject's error or a wrong answer).
#[derive(Debug, Parser)]
#[command(name = "spool-bench", version, about, long_about)]
struct Args {
    /// Scratch directory on the disk to measure (default: a temporary
    /// directory under the current one, removed afterwards). The run works
    /// in a subdirectory of it and removes it when done.
    #[arg(long, value_name = "DIR")]
    store: Option<PathBuf>,
    /// Workloads to run (default: all but `store`, which builds stores of
    /// up to a million commits); repeat for several. A name without
    /// its suffix, such as `append`, selects every workload starting with it.
    #[arg(long = "workload", value_name = "NAME")]
    workloads: Vec<String>,
    /// Small sizes that finish in seconds.
    #[arg(long)]
    quick: bool,
    /// The `store` workload's store sizes in commits, comma-separated
    /// (default 10000,100000,1000000; with --quick 1000,2000).
    #[arg(long, value_name = "N,..", value_delimiter = ',')]
    store_commits: Option<Vec<u64>>,
    /// Print one JSON document instead of text.
    #[arg(long)]
    json: bool,
    /// Print the Markdown tables for BENCHMARKS.md (with `--json`, after it).
    #[arg(long)]
    markdown: bool,
}

/// A failure of the run: a message, its cause and what to do next.
#[derive(Debug)]
struct Failure {
    message: &'static str,
    source: Box<dyn std::error::Error + 'static>,
    hint: Option<String>,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(self.source.as_ref())
    }
}

fn main() -> ExitCode {
    // The `execute` workload's measuring processes: this binary again.
    let argv: Vec<String> = std::env::args().skip(1).collect();
    if argv.first().map(String::as_str) == Some(execute_child::CHILD_ARG) {
        return execute_child::child_main(&argv[1..]);
    }
    // The `store` workload's questions run in fresh processes of this
    // binary.
    if let Some(code) = store_child::run_if_child() {
        return code;
    }
    let args = Args::parse();
    match run(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            // A closed stdout (`spool-bench | head`) is not a failure.
            if is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {err}");
            let mut source = err.source();
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            if let Some(hint) = &err.hint {
                eprintln!("hint: {hint}");
            }
            ExitCode::from(2)
        }
    }
}

fn run(args: Args) -> Result<(), Failure> {
    // Scratch space on the disk being measured: --store if given, else a
    // temporary directory (removed afterwards).
    let tmp;
    let dir = match args.store {
        Some(d) => d,
        None => {
            tmp = tempfile::Builder::new()
                .prefix("spool-bench")
                .tempdir_in(".")
                .or_else(|_| tempfile::tempdir())
                .map_err(|e| Failure {
                    message: "creating a scratch directory failed",
                    source: Box::new(e),
                    hint: Some("give one with --store DIR".into()),
                })?;
            // The PostgreSQL peer's server runs as the `postgres` user when
            // this runs as root: it must be able to reach its directory.
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755));
            tmp.path().to_path_buf()
        }
    };
    let config = BenchConfig {
        quick: args.quick,
        store_commits: args.store_commits,
        workloads: args.workloads,
        dir,
    };
    let mut progress = |line: &str| eprintln!("{line}");
    let report = harness::run(&config, &spool::Spool, &mut progress).map_err(|e| Failure {
        message: "the benchmark failed",
        source: Box::new(e),
        hint: Some(format!(
            "workloads: {} (or a prefix such as `append`)",
            workloads::known_names()
        )),
    })?;
    let mut out = String::new();
    if args.json {
        out.push_str(&report::to_json(&report));
        out.push('\n');
    }
    if args.markdown || !args.json {
        out.push_str(&report::to_markdown(&report));
        out.push('\n');
    }
    std::io::stdout()
        .lock()
        .write_all(out.as_bytes())
        .map_err(|e| Failure {
            message: "output failed",
            source: Box::new(e),
            hint: None,
        })
}

/// Whether the failure is a broken pipe on stdout.
fn is_broken_pipe(err: &Failure) -> bool {
    err.source
        .downcast_ref::<std::io::Error>()
        .is_some_and(|e| e.kind() == std::io::ErrorKind::BrokenPipe)
}
