//! `spool import`: sessions from a `spool export` file or a pi-style
//! coding-agent session file.
//!
//! The whole file is parsed, every session folded and the store checked
//! (no existing session with the same id) before anything is written; see
//! `spool_runtime::store::exchange` for the guarantees and `crate::pi`
//! for the pi mapping.

use std::fs::File;
use std::io::BufReader;
use std::path::Path;
use std::process::ExitCode;

use indicatif::{ProgressBar, ProgressStyle};
use serde::Serialize;
use spool_runtime::store::exchange::{
    import_sessions, read_export, ExchangeError, ImportOptions, ImportSession, ImportedSession,
};

use crate::cli::ImportFormat;
use crate::out::{print_doc, Result, Table, ToolError};
use crate::pi::read_pi;
use crate::session_open::writable;

#[derive(Serialize)]
struct Report<'a> {
    file: String,
    format: &'static str,
    /// For pi files: the file's format version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pi_version: Option<u64>,
    commits: u64,
    sessions: &'a [ImportedSession],
}

fn file_err(file: &Path, e: impl std::error::Error + Send + Sync + 'static) -> ToolError {
    ToolError::with_source(format!("{} cannot be imported", file.display()), e)
}

fn exchange_err(file: &Path, e: ExchangeError) -> ToolError {
    let hint = match &e {
        ExchangeError::Malformed { .. } | ExchangeError::Truncated { .. } => {
            "nothing was imported; fix or re-export the file (`spool export`)"
        }
        ExchangeError::SessionExists { .. } => {
            "nothing was imported; an id stays taken in a store even after `delete` (a deleted session keeps its id): import into another store"
        }
        ExchangeError::CommitIdTaken { .. } => {
            "nothing was imported; pass --fresh-commit-ids to give the commits new ids"
        }
        ExchangeError::StreamExists { .. } => "nothing was imported; import into another store",
        ExchangeError::ImportFailed { reason, .. } if reason.contains("exceeds the maximum") => "a commit is over the store's record size limit; retrying cannot help",
        ExchangeError::ImportFailed { .. } => "run `spool --store DIR verify`, then retry",
        _ => "nothing was imported",
    };
    file_err(file, e).hint(hint)
}

pub fn run(
    dir: &Path,
    file: &Path,
    format: ImportFormat,
    fresh_commit_ids: bool,
    json: bool,
) -> Result<ExitCode> {
    let f = File::open(file).map_err(|e| {
        ToolError::with_source(format!("cannot open {}", file.display()), e).hint("check the path")
    })?;
    let reader = BufReader::new(f);
    let (sessions, pi_version): (Vec<ImportSession>, Option<u64>) = match format {
        ImportFormat::Spool => (
            read_export(reader).map_err(|e| exchange_err(file, e))?,
            None,
        ),
        ImportFormat::Pi => {
            let name = file
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let s = read_pi(reader, &name).map_err(|e| {
                file_err(file, e).hint("nothing was imported; is this a pi session file (.jsonl)?")
            })?;
            (vec![s.import], Some(s.file_version))
        }
    };
    let commits: u64 = sessions.iter().map(|s| s.commits.len() as u64).sum();
    let (_store, _rt) = writable(dir)?;
    let pb = if commits >= 1000 {
        let pb = ProgressBar::new(commits);
        pb.set_style(
            ProgressStyle::with_template("importing [{bar:30}] {pos}/{len} commits ({elapsed})")
                .unwrap_or_else(|_| ProgressStyle::default_bar())
                .progress_chars("=> "),
        );
        pb
    } else {
        ProgressBar::hidden()
    };
    let opts = ImportOptions::default().fresh_commit_ids(fresh_commit_ids);
    let imported = import_sessions(&_store, &sessions, &opts, &mut || pb.inc(1))
        .map_err(|e| exchange_err(file, e))?;
    pb.finish_and_clear();
    let report = Report {
        file: file.display().to_string(),
        format: match format {
            ImportFormat::Spool => "spool",
            ImportFormat::Pi => "pi",
        },
        pi_version,
        commits,
        sessions: &imported,
    };
    if json {
        print_doc(&report)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = Table::new(&["SESSION", "VERSION", "EVENTS", "ENTRIES"])
        .right(1)
        .right(2)
        .right(3);
    for s in &imported {
        t.row(vec![
            s.id.to_string(),
            s.version.to_string(),
            s.events.to_string(),
            s.entries.to_string(),
        ]);
    }
    t.print()?;
    crate::outln!(
        "imported {} session(s), {commits} commit(s) from {}{}",
        imported.len(),
        file.display(),
        pi_version
            .map(|v| format!(" (pi session format v{v})"))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}
