//! `spool streams`: every stream of the log with its head version.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;

use crate::engine_open::open_read_only;
use crate::out::{print_json, Result, Table, ToolError};

#[derive(Serialize)]
struct StreamRow {
    stream: String,
    version: u64,
}

pub fn run(dir: &Path, json: bool) -> Result<ExitCode> {
    let store = open_read_only(dir)?;
    let streams = store
        .streams()
        .map_err(|e| ToolError::with_source("listing streams failed", e))?;
    let rows: Vec<StreamRow> = streams
        .into_iter()
        .map(|(stream, version)| StreamRow { stream, version })
        .collect();
    if json {
        print_json(&rows)?;
    } else {
        let mut t = Table::new(&["STREAM", "VERSION"]).right(1);
        for r in &rows {
            t.row(vec![r.stream.clone(), r.version.to_string()]);
        }
        t.print()?;
    }
    Ok(ExitCode::SUCCESS)
}
