//! `spool tree`: the transcript tree of a session.

use std::path::Path;
use std::process::ExitCode;

use crate::out::{print_json, Result};
use crate::session_open::{parse_id, runtime_err, runtime_with, Access};

pub fn run(dir: &Path, id: &str, json: bool) -> Result<ExitCode> {
    let id = parse_id(id)?;
    let rt = runtime_with(dir, Access::Read)?;
    let s = rt.get_session(&id).map_err(|e| runtime_err(&id, e))?;
    let transcript = &s.state().transcript;
    let rows = transcript.tree();
    if json {
        print_json(&serde_json::json!({
            "session": id.to_string(),
            "leaf": transcript.leaf().map(|l| l.to_string()),
            "entries": rows,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    if rows.is_empty() {
        crate::outln!("(empty transcript)");
        return Ok(ExitCode::SUCCESS);
    }
    // Indent by branch depth so a linear run stays flat; mark branch
    // starts, the active path and the leaf.
    let fanout: std::collections::HashMap<&str, usize> = rows
        .iter()
        .map(|r| (r.id.as_str(), r.children.len()))
        .collect();
    for r in &rows {
        let starts_branch = r
            .parent_id
            .as_ref()
            .and_then(|p| fanout.get(p.as_str()))
            .is_some_and(|&n| n > 1);
        let indent = if starts_branch {
            format!(
                "{}├─",
                "  ".repeat((r.branch_depth as usize).saturating_sub(1))
            )
        } else {
            "  ".repeat(r.branch_depth as usize)
        };
        let mark = if r.is_leaf {
            "◉"
        } else if r.on_path {
            "●"
        } else {
            "○"
        };
        let what = match r.role {
            Some(role) => format!("{}:{role}", r.kind),
            None => r.kind.to_string(),
        };
        let label = r
            .label
            .as_ref()
            .map(|l| format!(" [{l}]"))
            .unwrap_or_default();
        let fork = if r.children.len() > 1 {
            format!("  ({} branches)", r.children.len())
        } else {
            String::new()
        };
        crate::outln!("{indent}{mark} {} {what}{label}  {}{fork}", r.id, r.summary);
    }
    crate::outln!();
    crate::outln!("● on the active path   ◉ leaf   ○ other branches");
    Ok(ExitCode::SUCCESS)
}
