//! `spool compact --gc`: log garbage collection that erases. Plans which
//! segments hold records of deleted or purged sessions (removed) or
//! transcript content a rewrite superseded (`compact --redact`,
//! `--truncate-tool-results`, `--drop-aborted`: those commits are kept with
//! the content replaced by erased placeholders), shows the plan, then
//! (unless `--dry-run`) seals the active segment when it holds such records,
//! copies the segments into new ones, swaps them in and retires the old
//! ones — crash-safe: a crash at any step reopens to the old or the new
//! log, never a mix. Last, the store is reopened: the open deletes the
//! index directory (its files still hold the erased values) and the index
//! checkpoint files, and rebuilds the index from the log.

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
    erased_commits: u64,
}

#[derive(Serialize)]
struct GcOutput {
    dry_run: bool,
    segments: Vec<SegmentRow>,
    live_bytes: u64,
    dead_bytes: u64,
    reclaimed_bytes: u64,
    dead_commits: u64,
    /// Commits whose superseded content is replaced by erased placeholders.
    erased_commits: u64,
    /// Record bytes of those commits before and after.
    erased_bytes_before: u64,
    erased_bytes_after: u64,
    kept_dead_commits: u64,
    streams_removed: Vec<String>,
    /// After a run: file bytes of the compacted segments before and after.
    bytes_before: Option<u64>,
    bytes_after: Option<u64>,
    commits_copied: Option<u64>,
    retire_pending: Option<u64>,
    /// The active segment was sealed to be compacted too.
    active_segment_sealed: Option<bool>,
    /// File bytes of the new active segment sealing started (preallocated).
    new_active_segment_bytes: Option<u64>,
    /// The index directory was deleted and rebuilt from the compacted log.
    index_rebuilt: Option<bool>,
    checkpoints_removed: Option<u64>,
}

pub fn run(dir: &Path, dry_run: bool, json: bool) -> Result<ExitCode> {
    require_existing_store(dir)?;
    let store = LogStore::open(dir, LogStoreOptions::default()).map_err(|e| {
        ToolError::with_source(format!("opening {} failed", dir.display()), e).hint_from_cause(None)
    })?;
    let plan = if dry_run {
        store.plan_gc_preview()
    } else {
        store.plan_gc()
    };
    let plan = plan.map_err(|e| ToolError::with_source("planning the log GC failed", e))?;
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
                erased_commits: s.replaced_commits,
            })
            .collect(),
        live_bytes: plan.live_bytes,
        dead_bytes: plan.dead_bytes,
        reclaimed_bytes: plan.reclaimed_bytes,
        dead_commits: plan.dead_commits,
        erased_commits: plan.replaced_commits,
        erased_bytes_before: plan.replaced_bytes_before,
        erased_bytes_after: plan.replaced_bytes_after,
        kept_dead_commits: plan.kept_dead_commits,
        streams_removed: plan.streams_removed.clone(),
        bytes_before: None,
        bytes_after: None,
        commits_copied: None,
        retire_pending: None,
        active_segment_sealed: None,
        new_active_segment_bytes: None,
        index_rebuilt: None,
        checkpoints_removed: None,
    };
    let empty = plan.is_empty();
    let plan_sealed = plan.rolled_active;
    let plan_new_active = plan.new_active_bytes;
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
        out.active_segment_sealed = Some(plan_sealed);
        out.new_active_segment_bytes = Some(plan_new_active);
        out.checkpoints_removed = Some(report.checkpoints_removed);
        // The index's files still hold the erased values: the reopen deletes
        // them and rebuilds the index from the compacted log.
        let rebuilt = store.finish_erasure().map_err(|e| {
            ToolError::with_source("rebuilding the index after the log GC failed", e).hint(
                "the log is compacted; the next open of the store deletes and rebuilds the index",
            )
        })?;
        out.index_rebuilt = Some(rebuilt);
        // An index `replay` left beside the real one when it was cut short
        // holds the old values too (this process owns the store: no replay
        // is running).
        for d in [super::replay::REBUILD_DIR, super::replay::OLD_DIR] {
            let p = dir.join(d);
            if p.exists() {
                std::fs::remove_dir_all(&p).map_err(|e| {
                    ToolError::with_source(format!("removing {} failed", p.display()), e)
                })?;
            }
        }
    }
    store
        .close()
        .map_err(|e| ToolError::with_source("closing the store failed", e))?;
    if json {
        print_doc(&out)?;
        return Ok(ExitCode::SUCCESS);
    }
    if empty && dry_run && out.kept_dead_commits > 0 {
        crate::outln!(
            "{} commits to remove or erase are in the active segment (a run seals it first) or follow a live commit of their stream",
            out.kept_dead_commits
        );
        crate::outln!("dry run: nothing was written");
        return Ok(ExitCode::SUCCESS);
    }
    if empty {
        crate::outln!(
            "nothing to collect: no segment holds records of deleted or purged sessions or content a rewrite superseded"
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
        "ERASED COMMITS",
    ])
    .right(6)
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
            s.erased_commits.to_string(),
        ]);
    }
    t.print()?;
    crate::outln!(
        "{} dead commits of {} stream(s), {} dead; {} commits with superseded content erased ({} -> {}); {} reclaimable",
        out.dead_commits,
        out.streams_removed.len(),
        human_bytes(out.dead_bytes),
        out.erased_commits,
        human_bytes(out.erased_bytes_before),
        human_bytes(out.erased_bytes_after),
        human_bytes(out.reclaimed_bytes)
    );
    match (out.bytes_before, out.bytes_after) {
        (Some(b), Some(a)) => {
            crate::outln!(
                "collected: segments {} -> {} ({} reclaimed), {} commits copied{}",
                human_bytes(b),
                human_bytes(a),
                human_bytes(b.saturating_sub(a)),
                out.commits_copied.unwrap_or(0),
                match out.new_active_segment_bytes {
                    Some(n) if out.active_segment_sealed == Some(true) => format!(
                        ", the active segment included (a new one of {} started)",
                        human_bytes(n)
                    ),
                    _ => String::new(),
                }
            );
            if out.index_rebuilt == Some(true) {
                crate::outln!(
                    "index deleted and rebuilt from the compacted log; {} checkpoint file(s) removed",
                    out.checkpoints_removed.unwrap_or(0)
                );
            }
        }
        _ => {
            if out.kept_dead_commits > 0 {
                crate::outln!(
                    "{} more commits to remove or erase are in the active segment (a run seals it first) or follow a live commit of their stream",
                    out.kept_dead_commits
                );
            }
            crate::outln!("dry run: nothing was written")
        }
    }
    Ok(ExitCode::SUCCESS)
}
