//! `spool verify`: check every record of every segment and the index.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;

use crate::cmd::require_existing_store;
use crate::engine_open::engine_options;
use crate::out::{print_doc, Result, ToolError, EXIT_PROBLEM};

#[derive(Serialize)]
struct Report {
    ok: bool,
    segments: u64,
    records: u64,
    commits: u64,
    streams: u64,
    torn_tail_bytes: u64,
    /// What the index check found (its problems are among `errors`).
    index: String,
    /// What the check of the newest checkpoint against a rebuild found (its problems
    /// are among `errors`).
    checkpoint: String,
    errors: Vec<Problem>,
}

/// The index check in words.
fn index_state(c: &spool_engine::IndexCheck) -> String {
    use spool_engine::IndexCheck;
    match c {
        IndexCheck::Absent => "absent: the next open builds it".into(),
        IndexCheck::Locked => "in use by the store's owner: not checked".into(),
        IndexCheck::Outdated => "outdated: the next open rebuilds it".into(),
        IndexCheck::Checked { applied_seq } => format!("checked up to seq {applied_seq}"),
        IndexCheck::Unreadable { problem } => {
            format!("unreadable ({problem}): the next open rebuilds it")
        }
        other => format!("{other:?}"),
    }
}

/// The checkpoint check in words.
fn checkpoint_state(c: &spool_engine::CheckpointCheck) -> String {
    use spool_engine::CheckpointCheck;
    match c {
        CheckpointCheck::Absent => "none: read-only opens read the whole log".into(),
        CheckpointCheck::Skipped { reason } => format!("not checked: {reason}"),
        CheckpointCheck::Unused { reason } => {
            format!("not used by read-only opens ({reason}): the owner's next close replaces it")
        }
        CheckpointCheck::Checked { seq } => format!("checked against a rebuild, up to seq {seq}"),
        other => format!("{other:?}"),
    }
}

#[derive(Serialize)]
struct Problem {
    segment: String,
    offset: u64,
    problem: String,
}

pub fn run(dir: &Path, json: bool) -> Result<ExitCode> {
    require_existing_store(dir)?;
    // The log store's indexers: a checkpoint holds their keys, and is compared with
    // a rebuild by the same ones. verify reads each index once, in order: a small
    // sled cache serves it as well as a large one.
    let opts = spool_runtime::store::LogStoreOptions {
        index_cache_bytes_max: Some(spool_engine::INDEX_CACHE_BYTES_BULK),
        ..Default::default()
    }
    .engine_options();
    let r = spool_engine::verify(dir, opts)
        .map_err(|e| ToolError::with_source(format!("verifying {} failed", dir.display()), e))?;
    let report = Report {
        ok: r.errors.is_empty(),
        segments: r.segments,
        records: r.records,
        commits: r.commits,
        streams: r.streams,
        torn_tail_bytes: r.torn_tail_bytes,
        index: index_state(&r.index),
        checkpoint: checkpoint_state(&r.checkpoint),
        errors: r
            .errors
            .iter()
            .map(|p| Problem {
                segment: p.segment.clone(),
                offset: p.offset,
                problem: p.problem.clone(),
            })
            .collect(),
    };
    if json {
        print_doc(&report)?;
    } else {
        crate::outln!(
            "{}: {} segments, {} records, {} commits, {} streams, torn tail {} bytes",
            if report.ok { "ok" } else { "CORRUPT" },
            report.segments,
            report.records,
            report.commits,
            report.streams,
            report.torn_tail_bytes
        );
        crate::outln!("index: {}", report.index);
        crate::outln!("checkpoint: {}", report.checkpoint);
        for p in &report.errors {
            crate::outln!("  {} @ {}: {}", p.segment, p.offset, p.problem);
        }
        if !report.ok {
            crate::outln!("hint: `spool --store DIR verify --salvage OUT_DIR` copies every readable commit into a new store");
        }
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PROBLEM)
    })
}

#[derive(Serialize)]
struct SalvageOutput {
    out_dir: String,
    segments: u64,
    commits_copied: u64,
    streams: u64,
    last_seq: u64,
    unreadable: Vec<LostRow>,
    dropped: Vec<DroppedRow>,
    streams_starting_late: Vec<(String, u64)>,
}

#[derive(Serialize)]
struct LostRow {
    segment: String,
    offset: u64,
    bytes: u64,
    problem: String,
}

#[derive(Serialize)]
struct DroppedRow {
    segment: String,
    offset: u64,
    stream: String,
    version: u64,
    seq: u64,
    reason: String,
}

/// `verify --salvage OUT_DIR`: copy every readable commit into a new store.
pub fn salvage(dir: &Path, out_dir: &Path, json: bool) -> Result<ExitCode> {
    require_existing_store(dir)?;
    let r = spool_engine::salvage(dir, out_dir, engine_options()).map_err(|e| {
        ToolError::with_source(
            format!(
                "salvaging {} into {} failed",
                dir.display(),
                out_dir.display()
            ),
            e,
        )
        .hint("OUT_DIR must be empty or absent; the damaged store was not written")
    })?;
    let lost = !r.unreadable.is_empty() || !r.dropped.is_empty();
    let out = SalvageOutput {
        out_dir: out_dir.display().to_string(),
        segments: r.segments,
        commits_copied: r.commits_copied,
        streams: r.streams,
        last_seq: r.last_seq,
        unreadable: r
            .unreadable
            .iter()
            .map(|l| LostRow {
                segment: l.segment.clone(),
                offset: l.offset,
                bytes: l.bytes,
                problem: l.problem.clone(),
            })
            .collect(),
        dropped: r
            .dropped
            .iter()
            .map(|d| DroppedRow {
                segment: d.segment.clone(),
                offset: d.offset,
                stream: d.stream.clone(),
                version: d.version,
                seq: d.seq,
                reason: d.reason.clone(),
            })
            .collect(),
        streams_starting_late: r.streams_starting_late.clone(),
    };
    if json {
        print_doc(&out)?;
    } else {
        crate::outln!(
            "salvaged {} commits of {} streams from {} segments into {}",
            out.commits_copied,
            out.streams,
            out.segments,
            out.out_dir
        );
        for l in &out.unreadable {
            crate::outln!(
                "  lost {} bytes at {} @ {}: {}",
                l.bytes,
                l.segment,
                l.offset,
                l.problem
            );
        }
        for d in &out.dropped {
            crate::outln!(
                "  dropped {} v{} (seq {}) at {} @ {}: {}",
                d.stream,
                d.version,
                d.seq,
                d.segment,
                d.offset,
                d.reason
            );
        }
        if !lost {
            crate::outln!("nothing was lost");
        }
    }
    // Exit 1 when something could not be recovered, like `verify`.
    Ok(if lost {
        ExitCode::from(EXIT_PROBLEM)
    } else {
        ExitCode::SUCCESS
    })
}
