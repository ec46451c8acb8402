//! `spool verify`: check every record of every segment and the index.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;

use crate::cmd::require_existing_store;
use crate::engine_open::engine_options;
use crate::out::{print_json, Result, ToolError, EXIT_PROBLEM};

#[derive(Serialize)]
struct Report {
    ok: bool,
    segments: u64,
    records: u64,
    commits: u64,
    streams: u64,
    torn_tail_bytes: u64,
    errors: Vec<Problem>,
}

#[derive(Serialize)]
struct Problem {
    segment: String,
    offset: u64,
    problem: String,
}

pub fn run(dir: &Path, json: bool) -> Result<ExitCode> {
    require_existing_store(dir)?;
    let r = spool_engine::verify(dir, engine_options())
        .map_err(|e| ToolError::with_source(format!("verifying {} failed", dir.display()), e))?;
    let report = Report {
        ok: r.errors.is_empty(),
        segments: r.segments,
        records: r.records,
        commits: r.commits,
        streams: r.streams,
        torn_tail_bytes: r.torn_tail_bytes,
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
        print_json(&report)?;
    } else {
        println!(
            "{}: {} segments, {} records, {} commits, {} streams, torn tail {} bytes",
            if report.ok { "ok" } else { "CORRUPT" },
            report.segments,
            report.records,
            report.commits,
            report.streams,
            report.torn_tail_bytes
        );
        for p in &report.errors {
            println!("  {} @ {}: {}", p.segment, p.offset, p.problem);
        }
        if !report.ok {
            println!("hint: `spool --store DIR verify --salvage OUT_DIR` copies every readable commit into a new store");
        }
    }
    Ok(if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(EXIT_PROBLEM)
    })
}
