//! `spool tree`: the transcript tree of a session.

use std::collections::HashMap;
use std::process::ExitCode;

use spool_runtime::transcript::TreeRow;

use crate::out::{print_doc, Result};
use crate::session_open::runtime_err;
use spool_runtime::{SessionId, SessionRuntime};

pub fn run(rt: &SessionRuntime, id: &SessionId, json: bool) -> Result<ExitCode> {
    let s = rt.get_session(id).map_err(|e| runtime_err(id, e))?;
    let transcript = &s.state().transcript;
    let rows = transcript.tree();
    if json {
        print_doc(&serde_json::json!({
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
    for line in draw(&rows) {
        crate::outln!("{line}");
    }
    crate::outln!();
    crate::outln!("● on the active path   ◉ leaf   ○ other branches");
    Ok(ExitCode::SUCCESS)
}

/// The tree's lines, drawn with box characters: a linear run stays at one
/// indentation; at an entry with several children each child's branch
/// starts with `├─` (`└─` for the last) and the branches still to come
/// continue down the left with `│`. Marks: `●` on the active path, `◉` the
/// leaf, `○` other branches. Iterative, so a deep chain cannot overflow the
/// stack.
fn draw(rows: &[TreeRow]) -> Vec<String> {
    let by_id: HashMap<&str, &TreeRow> = rows.iter().map(|r| (r.id.as_str(), r)).collect();
    let roots = rows.iter().filter(|r| {
        r.parent_id
            .as_ref()
            .is_none_or(|p| !by_id.contains_key(p.as_str()))
    });
    // (row, prefix of its own line, prefix of the lines below it)
    let mut stack: Vec<(&TreeRow, String, String)> = roots
        .rev()
        .map(|r| (r, String::new(), String::new()))
        .collect();
    let mut lines = Vec::with_capacity(rows.len());
    while let Some((r, lead, below)) = stack.pop() {
        lines.push(format!("{lead}{}", row_text(r)));
        let children: Vec<&TreeRow> = r
            .children
            .iter()
            .filter_map(|c| by_id.get(c.as_str()).copied())
            .collect();
        if let [only] = children.as_slice() {
            stack.push((only, below.clone(), below));
            continue;
        }
        let last = children.len().saturating_sub(1);
        for (i, c) in children.into_iter().enumerate().rev() {
            let (lead, next) = if i == last {
                ("└─", "  ")
            } else {
                ("├─", "│ ")
            };
            stack.push((c, format!("{below}{lead}"), format!("{below}{next}")));
        }
    }
    lines
}

fn row_text(r: &TreeRow) -> String {
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
    format!("{mark} {} {what}{label}  {}{fork}", r.id, r.summary)
}
