//! `spool`: inspect, replay, verify, compact, benchmark and stress a spool store.
//!
//! The binary is a thin shell over `spool-engine` and `spool-runtime`: argument
//! parsing, output formatting (human tables by default, `--json` for machines)
//! and progress on stderr. It prints the whole error chain on failure and treats
//! a closed stdout (a broken pipe, e.g. `spool log | head`) as success.

mod bench;
mod cli;
mod cmd;
mod engine_open;
mod out;
mod session_open;

use std::error::Error as _;
use std::process::ExitCode;

use clap::Parser;

/// The binary's allocator. The engine and runtime allocate per commit (an
/// event's buffers, index keys, the snapshot's new entries) from several
/// threads; with the C library's allocator a fifth to a third of the
/// appending thread's samples were `malloc`/`free` (BENCHMARKS.md gives the
/// figures with both). The libraries do not choose an allocator: an
/// embedding application picks its own. C code in the process (the bundled
/// SQLite of `spool bench`) keeps the C library's `malloc`.
///
/// It is built without transparent huge pages (the `no_thp` feature in the
/// workspace manifest): with them, every arena mimalloc faults in or takes
/// back after a purge is a 2 MiB page the kernel zeroes whole. Without
/// them the append workloads' peak resident memory was 21-47 % lower at the
/// same throughput (BENCHMARKS.md, round 25).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let args = cli::Cli::parse();
    match cmd::run(args) {
        Ok(code) => code,
        Err(err) => {
            if out::is_broken_pipe(&err) {
                return ExitCode::SUCCESS;
            }
            eprintln!("error: {err}");
            let mut source = err.source();
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            if let Some(hint) = err.get_hint() {
                eprintln!("hint: {hint}");
            }
            ExitCode::from(err.exit_code())
        }
    }
}
