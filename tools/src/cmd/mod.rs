//! Command implementations. Each submodule handles one command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use crate::cli::{Cli, Command};
use crate::out::{Result, ToolError};
use spool_runtime::session::SessionId;
use spool_runtime::store::exchange::ImportOptions;

use crate::session_open::{is_postgres, resolve_id, resolve_in, resolve_stream, runtime_for};

mod compact;
mod context;
mod delete;
mod demo;
mod export;
mod gc;
mod import;
mod log;
mod purge;
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
        Command::Streams { json } => streams::run(need_dir(&store, "streams")?, json),
        Command::Log {
            stream,
            limit,
            json,
        } => {
            let dir = need_dir(&store, "log")?;
            let stream = match stream {
                Some(s) => {
                    require_existing_store(dir)?;
                    Some(resolve_stream(dir, &s)?)
                }
                None => None,
            };
            log::run(dir, stream.as_deref(), limit, json)
        }
        Command::Verify { salvage, json } => match salvage {
            Some(out) => verify::salvage(need_dir(&store, "verify")?, &out, json),
            None => verify::run(need_dir(&store, "verify")?, json),
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
            need_dir(&store, "stress")?,
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
        } => {
            let dir = need_store(&store)?;
            let parent = parent.map(|p| resolve_id(dir, &p)).transpose()?;
            sessions::run(
                dir,
                sessions::Args {
                    status: status.as_deref(),
                    agent: agent.as_deref(),
                    parent: parent.as_ref().map(SessionId::as_str),
                    limit,
                    json,
                },
            )
        }
        Command::Show { id, json } => {
            let rt = runtime_for(need_store(&store)?, false)?;
            show::run(&rt, &resolve_in(&rt, &id)?, json)
        }
        Command::Tree { id, json } => {
            let rt = runtime_for(need_store(&store)?, false)?;
            tree::run(&rt, &resolve_in(&rt, &id)?, json)
        }
        Command::Context {
            id,
            budget_bytes,
            format,
            json,
        } => {
            let rt = runtime_for(need_store(&store)?, false)?;
            context::run_as(&rt, &resolve_in(&rt, &id)?, budget_bytes, format, json)
        }
        Command::Stats { top, json } => {
            let dir = need_store(&store)?;
            if is_postgres(dir) {
                stats::run_postgres(dir, top, json)
            } else {
                stats::run(dir, top, json)
            }
        }
        Command::Replay {
            id,
            at_version,
            json,
        } => {
            let dir = need_dir(&store, "replay")?;
            let id = id.map(|id| resolve_id(dir, &id)).transpose()?;
            replay::run(dir, id.as_ref().map(SessionId::as_str), at_version, json)
        }
        Command::Export {
            id,
            all: _,
            include_deleted,
            out,
        } => {
            let dir = need_store(&store)?;
            let id = id.map(|id| resolve_id(dir, &id)).transpose()?;
            export::run(
                dir,
                export::Args {
                    id: id.as_ref().map(SessionId::as_str),
                    include_deleted,
                    out: out.as_deref(),
                },
            )
        }
        Command::Import {
            file,
            format,
            fresh_commit_ids,
            resume,
            test_abort_after_commits,
            json,
        } => {
            let opts = ImportOptions::default()
                .fresh_commit_ids(fresh_commit_ids)
                .resume(resume);
            let file = import::Input {
                file: &file,
                format,
                abort_after_commits: test_abort_after_commits,
            };
            import::run(need_store(&store)?, file, &opts, json)
        }
        Command::Delete {
            id,
            test_concurrent_delete,
            json,
        } => {
            let dir = need_store(&store)?;
            delete::run(dir, &resolve_id(dir, &id)?, test_concurrent_delete, json)
        }
        Command::Purge { id, force, json } => {
            let dir = need_store(&store)?;
            purge::run(dir, &resolve_id(dir, &id)?, force, json)
        }
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
        } => {
            let dir = need_dir(&store, "compact")?;
            let id = match id {
                // Refusals that need no store come first (see compact::run).
                Some(id) if !gc => Some(resolve_id(dir, &id)?.as_str().to_string()),
                id => id,
            };
            compact::run(
                dir,
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
            )
        }
    }
}

/// The `--store` directory, or an error saying how to give one.
pub fn need_store(store: &Option<PathBuf>) -> Result<&Path> {
    store.as_deref().ok_or_else(|| {
        ToolError::new("no store directory given").hint("pass --store DIR (or set SPOOL_STORE)")
    })
}

/// The commands that work on a PostgreSQL store (`--store postgres://…`):
/// they need sessions only, not the log. Every other command reads or
/// writes the log's files and refuses a URL.
pub const POSTGRES_COMMANDS: &str =
    "demo, sessions, show, tree, context, delete, purge, stats, export, import";

/// The `--store` directory of a command that works on the log's files:
/// a PostgreSQL URL is refused, never taken for a path.
pub fn need_dir<'a>(store: &'a Option<PathBuf>, command: &str) -> Result<&'a Path> {
    let dir = need_store(store)?;
    refuse_postgres(dir, command)?;
    Ok(dir)
}

/// Refuses a PostgreSQL URL where a store directory is needed.
pub fn refuse_postgres(dir: &Path, command: &str) -> Result<()> {
    if is_postgres(dir) {
        return Err(ToolError::new(format!(
            "`spool {command}` needs a store directory, not a PostgreSQL URL ({}); on PostgreSQL use: {POSTGRES_COMMANDS}",
            display_store(dir)
        )));
    }
    Ok(())
}

/// `--store` for messages: a PostgreSQL URL without its password.
pub fn display_store(dir: &Path) -> String {
    let s = dir.display().to_string();
    if !is_postgres(dir) {
        return s;
    }
    redact_url_password(&s)
}

/// `postgres://user:secret@host/db?password=x` ->
/// `postgres://user:***@host/db?password=***`.
fn redact_url_password(url: &str) -> String {
    let mut out = url.to_string();
    if let Some(scheme_end) = out.find("://") {
        let rest_start = scheme_end + 3;
        let authority_end = out[rest_start..]
            .find(['/', '?'])
            .map_or(out.len(), |i| rest_start + i);
        if let Some(at) = out[rest_start..authority_end].rfind('@') {
            let userinfo = &out[rest_start..rest_start + at];
            if let Some(colon) = userinfo.find(':') {
                out.replace_range(rest_start + colon + 1..rest_start + at, "***");
            }
        }
    }
    if let Some(q) = out.find('?') {
        let (head, query) = out.split_at(q + 1);
        let query: Vec<String> = query
            .split('&')
            .map(|kv| match kv.split_once('=') {
                Some((k, _)) if k.eq_ignore_ascii_case("password") => format!("{k}=***"),
                _ => kv.to_string(),
            })
            .collect();
        out = format!("{head}{}", query.join("&"));
    }
    out
}

/// Refuses a `--store` path that is a file (a store is a directory).
pub fn refuse_file(dir: &Path) -> Result<()> {
    if std::fs::metadata(dir).is_ok_and(|m| !m.is_dir()) {
        return Err(ToolError::new(format!(
            "{} is a file, not a store directory",
            dir.display()
        ))
        .hint("--store takes the store's directory (a new one is created by `demo`, `import` and `stress`)"));
    }
    Ok(())
}

/// Whether a directory looks like a spool store (has segment files).
pub fn require_existing_store(dir: &Path) -> Result<()> {
    refuse_postgres(dir, "this command")?;
    refuse_file(dir)?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_shown_without_their_password() {
        let show = |s: &str| display_store(Path::new(s));
        assert_eq!(
            show("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(
            show("postgresql://u@h/db?password=secret&sslmode=require"),
            "postgresql://u@h/db?password=***&sslmode=require"
        );
        assert_eq!(show("postgres://h/db"), "postgres://h/db");
        assert_eq!(show("some/dir:x@y"), "some/dir:x@y");
    }
}
