//! `spool compact --gc`: log garbage collection. Plans which sealed
//! segments hold records of deleted or purged sessions, shows the plan, then
//! (unless `--dry-run`) copies the live records into new segments, swaps
//! them in and retires the old ones — crash-safe: a crash at any step
//! reopens to the old or the new log, never a mix.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use spool_runtime::store::{LogStore, LogStoreOptions};

use crate::cmd::require_existing_store;
use crate::out::{human_bytes, print_doc, Result, Table, ToolError};

#[derive(Serialize)]
struct SegmentRow {
    segment: String,
    file_bytes: u64,
    live_bytes: u64,
    dead_bytes: u64,
    live_commits: u64,
    dead_commits: u64,
}

#[derive(Serialize)]
struct GcOutput {
    dry_run: bool,
    segments: Vec<SegmentRow>,
    live_bytes: u64,
    dead_bytes: u64,
    reclaimed_bytes: u64,
    dead_commits: u64,
    kept_dead_commits: u64,
    streams_removed: Vec<String>,
    /// After a run: file bytes of the compacted segments before and after.
    bytes_before: Option<u64>,
    bytes_after: Option<u64>,
    commits_copied: Option<u64>,
    retire_pending: Option<u64>,
}

pub fn run(dir: &Path, dry_run: bool, json: bool) -> Result<ExitCode> {
    require_existing_store(dir)?;
    let store = LogStore::open(dir, LogStoreOptions::default()).map_err(|e| {
        ToolError::with_source(format!("opening {} failed", dir.display()), e).hint_from_cause(None)
    })?;
    let plan = store
        .plan_gc()
        .map_err(|e| ToolError::with_source("planning the log GC failed", e))?;
    let mut out = GcOutput {
        dry_run,
        segments: plan
            .segments
            .iter()
            .map(|s| SegmentRow {
                segment: s.name.clone(),
                file_bytes: s.file_bytes,
                live_bytes: s.live_bytes,
                dead_bytes: s.dead_bytes,
                live_commits: s.live_commits,
                dead_commits: s.dead_commits,
            })
            .collect(),
        live_bytes: plan.live_bytes,
        dead_bytes: plan.dead_bytes,
        reclaimed_bytes: plan.reclaimed_bytes,
        dead_commits: plan.dead_commits,
        kept_dead_commits: plan.kept_dead_commits,
        streams_removed: plan.streams_removed.clone(),
        bytes_before: None,
        bytes_after: None,
        commits_copied: None,
        retire_pending: None,
    };
    let empty = plan.is_empty();
    if !dry_run && !empty {
        let report = store.run_gc(plan).map_err(|e| {
            ToolError::with_source("the log GC failed", e).hint(
                "the store is left in its old or its new state; reopen it (or run `spool verify`)",
            )
        })?;
        out.bytes_before = Some(report.bytes_before);
        out.bytes_after = Some(report.bytes_after);
        out.commits_copied = Some(report.commits_copied);
        out.retire_pending = Some(report.retire_pending);
    }
    store
        .close()
        .map_err(|e| ToolError::with_source("closing the store failed", e))?;
    if json {
        print_doc(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if empty {
        crate::outln!(
            "nothing to collect: no sealed segment holds records of deleted or purged sessions"
        );
        return Ok(ExitCode::SUCCESS);
    }
    let mut t = Table::new(&[
        "SEGMENT",
        "FILE",
        "LIVE",
        "DEAD",
        "LIVE COMMITS",
        "DEAD COMMITS",
    ])
    .right(1)
    .right(2)
    .right(3)
    .right(4)
    .right(5);
    for s in &out.segments {
        t.row(vec![
            s.segment.clone(),
            human_bytes(s.file_bytes),
            human_bytes(s.live_bytes),
            human_bytes(s.dead_bytes),
            s.live_commits.to_string(),
            s.dead_commits.to_string(),
        ]);
    }
    t.print()?;
    crate::outln!(
        "{} dead commits of {} stream(s), {} dead; {} reclaimable",
        out.dead_commits,
        out.streams_removed.len(),
        human_bytes(out.dead_bytes),
        human_bytes(out.reclaimed_bytes)
    );
    match (out.bytes_before, out.bytes_after) {
        (Some(b), Some(a)) => crate::outln!(
            "collected: segments {} -> {}, {} commits copied",
            human_bytes(b),
            human_bytes(a),
            out.commits_copied.unwrap_or(0)
        ),
        _ => crate::outln!("dry run: nothing was written"),
    }
    Ok(ExitCode::SUCCESS)
}
