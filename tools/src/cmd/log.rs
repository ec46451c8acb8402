//! `spool log`: the commits of the log, in log order.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use spool_engine::{ExpectedVersion, RecordedCommit};

use crate::engine_open::open_read_only;
use crate::out::{human_bytes, human_time_ms, print_json, Result, Table, ToolError};

#[derive(Serialize)]
struct CommitRow {
    seq: u64,
    stream: String,
    version: u64,
    expected: String,
    commit_id: String,
    timestamp_ms: i64,
    segment: u64,
    offset: u64,
    record_bytes: u32,
    events: Vec<EventRow>,
}

#[derive(Serialize)]
struct EventRow {
    kind: String,
    bytes: u64,
}

fn expected_str(e: &ExpectedVersion) -> String {
    match e {
        ExpectedVersion::NoStream => "no-stream".into(),
        ExpectedVersion::Exact(n) => n.to_string(),
        ExpectedVersion::Any => "any".into(),
        #[allow(unreachable_patterns)]
        _ => "?".into(),
    }
}

fn row(c: &RecordedCommit) -> CommitRow {
    CommitRow {
        seq: c.info.seq,
        stream: c.info.stream.clone(),
        version: c.info.version,
        expected: expected_str(&c.expected),
        commit_id: c.info.commit_id.to_string(),
        timestamp_ms: c.info.timestamp_ms,
        segment: c.info.position.segment,
        offset: c.info.position.offset,
        record_bytes: c.record_bytes,
        events: c
            .events
            .iter()
            .map(|e| EventRow {
                kind: e.kind.clone(),
                bytes: e.payload.len() as u64,
            })
            .collect(),
    }
}

pub fn run(dir: &Path, stream: Option<&str>, limit: Option<u64>, json: bool) -> Result<ExitCode> {
    let store = open_read_only(dir)?;
    let limit = limit.unwrap_or(u64::MAX);
    let mut rows = Vec::new();
    match stream {
        Some(s) => {
            let mut from = 1u64;
            while (rows.len() as u64) < limit {
                let batch = store
                    .read_stream(s, from, 1024)
                    .map_err(|e| ToolError::with_source(format!("reading stream {s} failed"), e))?;
                if batch.is_empty() {
                    break;
                }
                for c in &batch {
                    if (rows.len() as u64) < limit {
                        rows.push(row(c));
                    }
                    from = c.info.version + 1;
                }
            }
            if rows.is_empty() && store.stream_version(s).ok().flatten().is_none() {
                return Err(
                    ToolError::new(format!("no stream named {s:?} in this store"))
                        .hint("list streams with `spool --store DIR streams`"),
                );
            }
        }
        None => {
            let scan = store
                .scan(1)
                .map_err(|e| ToolError::with_source("scanning the log failed", e))?;
            for c in scan {
                if rows.len() as u64 >= limit {
                    break;
                }
                let c = c.map_err(|e| ToolError::with_source("reading the log failed", e))?;
                rows.push(row(&c));
            }
        }
    }
    if json {
        print_json(&rows)?;
    } else {
        let mut t = Table::new(&[
            "SEQ", "STREAM", "VERSION", "EXPECTED", "TIME", "POSITION", "SIZE", "EVENTS",
        ])
        .right(0)
        .right(2)
        .right(6);
        for r in &rows {
            let kinds: Vec<&str> = r.events.iter().map(|e| e.kind.as_str()).collect();
            t.row(vec![
                r.seq.to_string(),
                r.stream.clone(),
                r.version.to_string(),
                r.expected.clone(),
                human_time_ms(r.timestamp_ms),
                format!("{:016x}.seg@{}", r.segment, r.offset),
                human_bytes(u64::from(r.record_bytes)),
                kinds.join(","),
            ]);
        }
        t.print()?;
    }
    Ok(ExitCode::SUCCESS)
}
