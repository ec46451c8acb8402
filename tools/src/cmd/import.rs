//! `spool import`: sessions from a `spool export` file or a pi-style
//! coding-agent session file.
//!
//! The library does the work (`spool_runtime::store::exchange` for the
//! guarantees, `spool_runtime::import::pi` for the pi mapping): every
//! session is read, folded and checked against the store before anything
//! is written, then written with buffered appends and one sync at the end.
//! This command opens the store, draws the progress bar and prints.

use std::fs::File;
use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use spool_runtime::import::pi::PiFile;
use spool_runtime::store::exchange::{
    import_from, ExchangeError, ExportFile, ImportOptions, ImportProgress, ImportSource,
    ImportedSession,
};
use spool_runtime::store::{LogStore, LogStoreOptions};

use crate::cli::ImportFormat;
use crate::out::{print_doc, Result, Table, ToolError};
use crate::session_open::{is_postgres, postgres_store};

/// A progress bar shows once an import has run this long.
const PROGRESS_AFTER: Duration = Duration::from_secs(1);

#[derive(Serialize)]
struct Report<'a> {
    file: String,
    format: &'static str,
    /// For pi files: the file's format version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pi_version: Option<u64>,
    /// For pi files: lines skipped as pi skips them (not JSON), 1-based.
    #[serde(skip_serializing_if = "Option::is_none")]
    skipped_lines: Option<&'a [u64]>,
    commits: u64,
    sessions: &'a [ImportedSession],
}

fn file_err(file: &Path, e: impl std::error::Error + Send + Sync + 'static) -> ToolError {
    ToolError::with_source(format!("{} cannot be imported", file.display()), e)
}

/// `resumable`: `--resume` can finish an import of this file into this store
/// (a `spool-export` file on a store directory).
fn exchange_err(file: &Path, resumable: bool, e: ExchangeError) -> ToolError {
    if let ExchangeError::SessionExists { id } = &e {
        let resume = if resumable {
            "if an import of this file was cut short, run it again with --resume; "
        } else {
            ""
        };
        let hint = format!(
            "nothing was imported; {resume}if session {id} is deleted, `spool --store DIR purge {id}` frees its id (then import with --fresh-commit-ids); otherwise import into another store"
        );
        return file_err(file, e).hint(hint);
    }
    let hint = match &e {
        ExchangeError::Malformed { .. } | ExchangeError::Truncated { .. } => {
            "nothing was imported; fix or re-export the file (`spool export`)"
        }
        ExchangeError::CommitIdTaken { .. } => {
            "nothing was imported; pass --fresh-commit-ids to give the commits new ids (a purged session's commits keep their ids until `compact --gc` collects their segments)"
        }
        ExchangeError::CommitIdTwice { .. } => {
            "nothing was imported; fix or re-export the file, or pass --fresh-commit-ids to give every commit a new id"
        }
        ExchangeError::StreamExists { .. } => "nothing was imported; import into another store",
        ExchangeError::NotResumable { .. } => {
            "nothing was imported; the store holds other commits under this id, so import into another store"
        }
        ExchangeError::AheadOfSource { .. } => {
            "nothing was imported; the session moved on since this file was exported: export it again, or import into another store"
        }
        ExchangeError::ResumeFailed { .. } => {
            "fix the cause, then run the same import with --resume again; `spool --store DIR verify` checks the store"
        }
        ExchangeError::Unstorable {
            source: spool_engine::Error::RecordTooLarge { .. },
            ..
        } => "nothing was imported; a commit is over the store's record size limit, so retrying cannot help: store less in one entry",
        ExchangeError::Unstorable { .. } => "nothing was imported; fix the entry the line holds",
        ExchangeError::ImportFailed { reason, .. } if reason.contains("exceeds the maximum") => {
            "a commit is over the store's record size limit; retrying cannot help"
        }
        ExchangeError::ImportFailed { .. } | ExchangeError::SyncFailed(_) => {
            "run `spool --store DIR verify`, then retry"
        }
        ExchangeError::IndexFailed(_) => {
            "every session was imported and synced; the next open of the store brings its index up to date from the log"
        }
        _ => "nothing was imported",
    };
    file_err(file, e).hint(hint)
}

/// Progress on stderr, drawn only once the import has run a second.
struct Progress {
    bar: ProgressBar,
    started: Instant,
    shown: bool,
    styled: bool,
}

impl Progress {
    fn new() -> Self {
        let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
        Progress {
            bar,
            started: Instant::now(),
            shown: false,
            styled: false,
        }
    }

    fn update(&mut self, p: ImportProgress) {
        if !self.shown && self.started.elapsed() >= PROGRESS_AFTER {
            self.shown = true;
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
        }
        match p {
            ImportProgress::Checked { commits } => {
                if commits == 0 || !self.styled {
                    self.styled = true;
                    self.bar.set_style(
                        ProgressStyle::with_template("checking {pos} commits ({elapsed})")
                            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    );
                }
                self.bar.set_position(commits);
            }
            ImportProgress::Written { commits, total } => {
                if self.bar.length() != Some(total) {
                    self.bar.set_length(total);
                    self.bar.set_style(
                        ProgressStyle::with_template(
                            "importing [{bar:30}] {pos}/{len} commits ({elapsed}, {per_sec})",
                        )
                        .unwrap_or_else(|_| ProgressStyle::default_bar())
                        .progress_chars("=> "),
                    );
                }
                self.bar.set_position(commits);
            }
            _ => {}
        }
    }
}

/// What to import.
pub struct Input<'a> {
    pub file: &'a Path,
    pub format: ImportFormat,
    /// Test hook: abort the process once this many commits are written.
    pub abort_after_commits: Option<u64>,
}

pub fn run(dir: &Path, input: Input<'_>, opts: &ImportOptions, json: bool) -> Result<ExitCode> {
    let Input {
        file,
        format,
        abort_after_commits,
    } = input;
    let postgres = is_postgres(dir);
    if postgres && opts.resume {
        return Err(ToolError::new(
            "--resume finishes an import into a store directory; a PostgreSQL import is one transaction and leaves nothing to finish",
        )
        .hint("run the import without --resume"));
    }
    if opts.resume && matches!(format, ImportFormat::Pi) {
        // A pi file's commit ids are made up afresh by each reading, so no
        // store can show they are the file's.
        return Err(ToolError::new(
            "--resume finishes a `spool-export` import; a pi file is one session whose commit ids each import makes up",
        )
        .hint("purge the session a cut-short pi import left (`spool --store DIR purge --force ID`), then import the file again"));
    }
    // Opened here for the error a user meets first; each pass opens it again.
    File::open(file).map_err(|e| {
        ToolError::with_source(format!("cannot open {}", file.display()), e).hint("check the path")
    })?;
    let mut pi: Option<PiFile> = None;
    if let ImportFormat::Pi = format {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let p = PiFile::open(file, &name).map_err(|e| {
            file_err(file, e).hint("nothing was imported; is this a pi session file (.jsonl)?")
        })?;
        for line in p.skipped_lines() {
            eprintln!(
                "warning: {} line {line} skipped: not JSON (pi skips it too)",
                file.display()
            );
        }
        pi = Some(p);
    }
    let mut bar = Progress::new();
    let mut progress = |p: ImportProgress| {
        if let (ImportProgress::Written { commits, .. }, Some(n)) = (p, abort_after_commits) {
            if commits >= n {
                std::process::abort();
            }
        }
        bar.update(p);
    };
    let mut export_file = ExportFile::new(file);
    let pi_version = pi.as_ref().map(PiFile::file_version);
    let skipped_lines: Option<Vec<u64>> = pi.as_ref().map(|p| p.skipped_lines().to_vec());
    let source: &mut (dyn ImportSource + Send) = match pi.as_mut() {
        Some(p) => p,
        None => &mut export_file,
    };
    let imported = if postgres {
        // One transaction: all or nothing.
        postgres_store(dir)?.import_from(source, opts, &mut progress)
    } else {
        // Buffered appends and one sync at the end (the import syncs
        // before it reports success), and a small index cache.
        let store = LogStore::open(dir, LogStoreOptions::bulk_load()).map_err(|e| {
            ToolError::with_source(format!("opening {} failed", dir.display()), e)
                .hint_from_cause(None)
        })?;
        import_from(&store, source, opts, &mut progress)
    }
    .map_err(|e| exchange_err(file, !postgres && matches!(format, ImportFormat::Spool), e))?;
    bar.bar.finish_and_clear();
    let commits: u64 = imported.iter().map(|s| s.version).sum();
    let report = Report {
        file: file.display().to_string(),
        format: match format {
            ImportFormat::Spool => "spool",
            ImportFormat::Pi => "pi",
        },
        pi_version,
        skipped_lines: skipped_lines.as_deref(),
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
        report
            .pi_version
            .map(|v| format!(" (pi session format v{v})"))
            .unwrap_or_default()
    );
    Ok(ExitCode::SUCCESS)
}
