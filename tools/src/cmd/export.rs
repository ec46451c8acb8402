//! `spool export`: sessions as `spool-export` JSONL.
//!
//! The format is documented in `spool_runtime::store::exchange` (header
//! line, one line per event grouped by commit, end line with totals). With
//! `--out FILE` the file is written to a temporary name beside it and
//! renamed into place once complete, so a failed export leaves no partial
//! file behind; a device or a pipe (`/dev/null`, a FIFO) is written in
//! place. Progress goes to stderr.

use std::io::{BufWriter, Write};
use std::path::Path;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use spool_runtime::session::SessionId;
use spool_runtime::store::exchange::{ExchangeError, ExportWriter};
use spool_runtime::store::postgres::PostgresStore;
use spool_runtime::store::LogStore;
use spool_runtime::{ListQuery, SessionStore};

use crate::out::{Result, ToolError};
use crate::session_open::{is_postgres, parse_id, postgres_store, read_only};

/// Whether `path` exists and is neither a regular file nor a directory.
fn is_special(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| !m.is_file() && !m.is_dir())
}

/// The store an export reads: a log-store directory (opened read-only)
/// or a PostgreSQL database.
enum Source {
    Log(std::sync::Arc<LogStore>),
    Postgres(Box<PostgresStore>),
}

impl Source {
    fn sessions(&self) -> &dyn SessionStore {
        match self {
            Source::Log(s) => &**s,
            Source::Postgres(s) => &**s,
        }
    }

    fn export<W: Write>(
        &self,
        w: &mut ExportWriter<W>,
        id: &SessionId,
    ) -> std::result::Result<u64, ExchangeError> {
        match self {
            Source::Log(s) => w.session(s, id),
            Source::Postgres(s) => s.export_session(w, id),
        }
    }
}

pub struct Args<'a> {
    /// `None`: every session (clap requires either an id or `--all`).
    pub id: Option<&'a str>,
    pub include_deleted: bool,
    pub out: Option<&'a Path>,
}

fn exchange_err(e: ExchangeError) -> ToolError {
    match e {
        ExchangeError::NotFound { id } => ToolError::new(format!("no session {id} in this store"))
            .hint("list sessions with `spool --store DIR sessions`"),
        e => ToolError::with_source("export failed", e),
    }
}

/// A progress bar on stderr over `n` sessions (hidden when stderr is not
/// a terminal, or for a single session).
pub fn session_bar(n: u64, what: &str) -> ProgressBar {
    if n < 2 {
        return ProgressBar::hidden();
    }
    let pb = ProgressBar::new(n);
    pb.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} sessions ({elapsed})")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}

fn ids_to_export(store: &dyn SessionStore, args: &Args<'_>) -> Result<Vec<SessionId>> {
    if let Some(id) = args.id {
        return Ok(vec![parse_id(id)?]);
    }
    let mut q = ListQuery::all();
    if args.include_deleted {
        q = q.including_deleted();
    }
    let mut list = store
        .list_headers(&q)
        .map_err(|e| ToolError::with_source("listing sessions failed", e))?;
    for s in &list.skipped {
        eprintln!(
            "warning: skipped unreadable session at {}: {}",
            s.location, s.reason
        );
    }
    // Oldest first, so an import recreates them in their original order.
    list.headers
        .sort_by(|a, b| (a.created_at_ms, &a.id).cmp(&(b.created_at_ms, &b.id)));
    Ok(list.headers.into_iter().map(|h| h.id).collect())
}

fn write_all<W: Write>(store: &Source, ids: &[SessionId], out: W) -> Result<(W, u64, u64)> {
    let pb = session_bar(ids.len() as u64, "exporting");
    let mut w = ExportWriter::new(out).map_err(exchange_err)?;
    for id in ids {
        store.export(&mut w, id).map_err(exchange_err)?;
        pb.inc(1);
    }
    pb.finish_and_clear();
    let (out, counts) = w.finish().map_err(exchange_err)?;
    Ok((out, counts.sessions, counts.events))
}

pub fn run(dir: &Path, args: Args<'_>) -> Result<ExitCode> {
    let store = if is_postgres(dir) {
        Source::Postgres(Box::new(postgres_store(dir)?))
    } else {
        Source::Log(read_only(dir)?.0)
    };
    let ids = ids_to_export(store.sessions(), &args)?;
    match args.out {
        None => {
            let stdout = std::io::stdout();
            let (mut out, _, _) = write_all(&store, &ids, BufWriter::new(stdout.lock()))?;
            out.flush()?;
        }
        Some(path) if is_special(path) => {
            // A device or a pipe (`/dev/null`, `/dev/stdout`, a FIFO): written in
            // place. Writing beside it and renaming would replace it with a file.
            let f = std::fs::OpenOptions::new()
                .write(true)
                .open(path)
                .map_err(|e| {
                    ToolError::with_source(format!("cannot open {}", path.display()), e)
                })?;
            let (mut out, sessions, events) = write_all(&store, &ids, BufWriter::new(f))?;
            out.flush().map_err(|e| {
                ToolError::with_source(format!("writing {} failed", path.display()), e)
            })?;
            eprintln!(
                "exported {sessions} session(s), {events} event(s) to {}",
                path.display()
            );
        }
        Some(path) if path.is_dir() => {
            return Err(ToolError::new(format!("{} is a directory", path.display()))
                .hint("name a file to write, e.g. DIR/export.jsonl"));
        }
        Some(path) => {
            let parent = match path.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            let tmp = tempfile::NamedTempFile::new_in(parent).map_err(|e| {
                ToolError::with_source(format!("cannot create a file in {}", parent.display()), e)
                    .hint("check that the directory exists and is writable")
            })?;
            let (out, sessions, events) = write_all(&store, &ids, BufWriter::new(tmp))?;
            let tmp = out.into_inner().map_err(|e| {
                ToolError::with_source(format!("writing {} failed", path.display()), e.into_error())
            })?;
            tmp.as_file().sync_all().map_err(|e| {
                ToolError::with_source(format!("syncing {} failed", path.display()), e)
            })?;
            tmp.persist(path).map_err(|e| {
                ToolError::with_source(format!("renaming into {} failed", path.display()), e.error)
            })?;
            eprintln!(
                "exported {sessions} session(s), {events} event(s) to {}",
                path.display()
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
