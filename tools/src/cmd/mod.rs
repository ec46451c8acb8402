//! Command implementations. Each submodule handles one command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cli::{Cli, Command};
use crate::out::{Result, ToolError};

mod bench;
mod compact;
mod context;
mod delete;
mod demo;
mod export;
mod gc;
mod import;
mod log;
mod replay;
pub mod sessions;
pub mod show;
mod stats;
mod streams;
mod stress;
mod tree;
mod verify;

pub fn run(cli: Cli) -> Result<ExitCode> {
    let store = cli.store;
    match cli.command {
        Command::Streams { json } => streams::run(need_store(&store)?, json),
        Command::Log {
            stream,
            limit,
            json,
        } => log::run(need_store(&store)?, stream.as_deref(), limit, json),
        Command::Verify { salvage, json } => match salvage {
            Some(out) => verify::salvage(need_store(&store)?, &out, json),
            None => verify::run(need_store(&store)?, json),
        },
        Command::Stress {
            writers,
            seconds,
            payload_bytes,
            segment_bytes,
            durability,
            ack_file,
            json,
        } => stress::run(
            need_store(&store)?,
            stress::Args {
                writers,
                seconds,
                payload_bytes,
                segment_bytes,
                durability,
                ack_file,
                json,
            },
        ),
        Command::Demo { json } => demo::run(need_store(&store)?, json),
        Command::Sessions {
            status,
            agent,
            parent,
            limit,
            json,
        } => sessions::run(
            need_store(&store)?,
            sessions::Args {
                status: status.as_deref(),
                agent: agent.as_deref(),
                parent: parent.as_deref(),
                limit,
                json,
            },
        ),
        Command::Show { id, json } => show::run(need_store(&store)?, &id, json),
        Command::Tree { id, json } => tree::run(need_store(&store)?, &id, json),
        Command::Context {
            id,
            budget_bytes,
            format,
            json,
        } => context::run_as(need_store(&store)?, &id, budget_bytes, format, json),
        Command::Stats { top, json } => stats::run(need_store(&store)?, top, json),
        Command::Replay {
            id,
            at_version,
            json,
        } => replay::run(need_store(&store)?, id.as_deref(), at_version, json),
        Command::Export {
            id,
            all: _,
            include_deleted,
            out,
        } => export::run(
            need_store(&store)?,
            export::Args {
                id: id.as_deref(),
                include_deleted,
                out: out.as_deref(),
            },
        ),
        Command::Import {
            file,
            format,
            fresh_commit_ids,
            json,
        } => import::run(need_store(&store)?, &file, format, fresh_commit_ids, json),
        Command::Delete { id, json } => delete::run(need_store(&store)?, &id, json),
        Command::Compact {
            id,
            all,
            truncate_tool_results,
            redact,
            drop_aborted,
            dry_run,
            gc,
            test_concurrent_write,
            json,
        } => compact::run(
            need_store(&store)?,
            compact::Args {
                id,
                all,
                truncate_tool_results,
                redact,
                drop_aborted,
                dry_run,
                gc,
                test_concurrent_write,
                json,
            },
        ),
        Command::Bench {
            workloads,
            quick,
            json,
            markdown,
        } => bench::run(bench::Args {
            workloads,
            quick,
            json,
            markdown,
            dir: store,
        }),
    }
}

/// The `--store` directory, or an error saying how to give one.
pub fn need_store(store: &Option<PathBuf>) -> Result<&Path> {
    store.as_deref().ok_or_else(|| {
        ToolError::new("no store directory given").hint("pass --store DIR (or set SPOOL_STORE)")
    })
}

/// Whether a directory looks like a spool store (has segment files).
pub fn require_existing_store(dir: &Path) -> Result<()> {
    let has_segments = std::fs::read_dir(dir)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .any(|e| e.path().extension().is_some_and(|x| x == "seg"))
        })
        .unwrap_or(false);
    if has_segments {
        Ok(())
    } else {
        Err(ToolError::new(format!(
            "{} is not a spool store (no .seg files)",
            dir.display()
        ))
        .hint("create one with `spool --store DIR demo`, or check the path"))
    }
}
