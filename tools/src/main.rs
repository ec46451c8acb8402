//! `spool`: inspect, replay, verify, compact and stress a spool store.
//!
//! The binary is a thin shell over `spool-engine` and `spool-runtime`: argument
//! parsing, output formatting (human tables by default, `--json` for machines)
//! and progress on stderr. It prints the whole error chain on failure (each cause once) and treats
//! a closed stdout (a broken pipe, e.g. `spool log | head`) as success.

mod cli;
mod cmd;
mod engine_open;
mod out;
mod session_open;

use std::process::ExitCode;

use clap::Parser;

/// The binary's allocator. The engine and runtime allocate per commit (an
/// event's buffers, index keys, the snapshot's new entries) from several
/// threads, and with the C library's allocator `malloc`/`free` took a large
/// share of the appending thread's time. The libraries do not choose an
/// allocator: an embedding application picks its own. `spool-bench` uses
/// the same one, so its figures are this binary's.
///
/// It is built without transparent huge pages (the `no_thp` feature in the
/// workspace manifest): with them, every arena mimalloc faults in or takes
/// back after a purge is a 2 MiB page the kernel zeroes whole, which raised
/// the append workloads' peak resident memory at the same throughput.
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
            let chain = out::cause_chain(&err);
            for (i, msg) in chain.iter().enumerate() {
                if i == 0 {
                    eprintln!("error: {msg}");
                } else {
                    eprintln!("  caused by: {msg}");
                }
            }
            if let Some(hint) = err.get_hint() {
                eprintln!("hint: {hint}");
            }
            ExitCode::from(err.exit_code())
        }
    }
}
