//! `spool sessions`: list session headers (from the header index).

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use spool_runtime::session::{AgentSessionInfo, SessionStatus};
use spool_runtime::ListQuery;

use crate::out::{ellipsize, human_time_ms, print_json, Result, Table, ToolError};
use crate::session_open::{parse_id, runtime_with, Access};

#[derive(Serialize)]
pub struct HeaderRow {
    pub id: String,
    pub parent_id: Option<String>,
    pub status: &'static str,
    pub version: u64,
    pub agent_name: String,
    pub label: String,
    pub created_at: i64,
    pub updated_at: i64,
}

impl From<&AgentSessionInfo> for HeaderRow {
    fn from(h: &AgentSessionInfo) -> Self {
        HeaderRow {
            id: h.id.to_string(),
            parent_id: h.parent_id.as_ref().map(|p| p.to_string()),
            status: h.status.as_str(),
            version: h.version,
            agent_name: h.agent_name.clone(),
            label: h.label.clone(),
            created_at: h.created_at_ms,
            updated_at: h.updated_at_ms,
        }
    }
}

pub struct Args<'a> {
    pub status: Option<&'a str>,
    pub agent: Option<&'a str>,
    pub parent: Option<&'a str>,
    pub limit: Option<u32>,
    pub json: bool,
}

pub fn print_headers(headers: &[AgentSessionInfo]) -> Result<()> {
    let mut t = Table::new(&[
        "ID", "STATUS", "VERSION", "AGENT", "LABEL", "PARENT", "UPDATED",
    ])
    .right(2);
    for h in headers {
        t.row(vec![
            h.id.to_string(),
            h.status.as_str().to_string(),
            h.version.to_string(),
            h.agent_name.clone(),
            ellipsize(&h.label, 30),
            h.parent_id
                .as_ref()
                .map(|p| p.to_string())
                .unwrap_or_else(|| "-".into()),
            human_time_ms(h.updated_at_ms),
        ]);
    }
    t.print()
}

pub fn run(dir: &Path, args: Args<'_>) -> Result<ExitCode> {
    let mut q = ListQuery::all();
    if let Some(s) = args.status {
        let st: SessionStatus = s.parse().map_err(|_| {
            ToolError::new(format!("unknown status {s:?}"))
                .hint("use one of: active, suspended, completed, failed, deleted")
        })?;
        q = q.with_status(st);
    }
    if let Some(a) = args.agent {
        q = q.with_agent(a);
    }
    if let Some(p) = args.parent {
        q = q.children_of(parse_id(p)?);
    }
    if let Some(l) = args.limit {
        q = q.limit(u64::from(l));
    }
    let rt = runtime_with(dir, Access::Read)?;
    let list = rt
        .list_sessions(&q)
        .map_err(|e| ToolError::with_source("listing sessions failed", e))?;
    for s in &list.skipped {
        eprintln!(
            "warning: skipped unreadable session at {}: {}",
            s.location, s.reason
        );
    }
    if args.json {
        let rows: Vec<HeaderRow> = list.headers.iter().map(HeaderRow::from).collect();
        print_json(&rows)?;
    } else {
        print_headers(&list.headers)?;
    }
    Ok(ExitCode::SUCCESS)
}
