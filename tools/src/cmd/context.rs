//! `spool context`: the model context of a session as it is built from its leaf.

use std::path::Path;
use std::process::ExitCode;

use spool_runtime::transcript::{
    select_resident, Budget, ContentBlock, ModelContext, DEFAULT_RESIDENT_EVENTS_MAX,
};

use crate::out::{ellipsize, human_bytes, print_json, Result, ToolError};
use crate::session_open::{parse_id, runtime_err, runtime_for};

fn block_text(b: &ContentBlock) -> String {
    match b {
        ContentBlock::Text { text } => text.clone(),
        ContentBlock::Thinking { thinking, .. } => format!("(thinking) {thinking}"),
        ContentBlock::ToolCall {
            name, arguments, ..
        } => format!("→ {name}({arguments})"),
        ContentBlock::Image { mime_type, .. } => format!("(image {mime_type})"),
        #[allow(unreachable_patterns)]
        _ => "(content)".into(),
    }
}

pub fn run(dir: &Path, id: &str, budget_bytes: Option<u64>, json: bool) -> Result<ExitCode> {
    let id = parse_id(id)?;
    let rt = runtime_for(dir, false)?;
    let s = rt.get_session(&id).map_err(|e| runtime_err(&id, e))?;
    let transcript = &s.state().transcript;
    let (ctx, note): (ModelContext, Option<String>) = match budget_bytes {
        None => (
            transcript
                .context()
                .map_err(|e| ToolError::with_source("building the context failed", e))?,
            None,
        ),
        Some(bytes) => {
            let sel = select_resident(
                transcript,
                transcript.leaf(),
                Budget::new(bytes, DEFAULT_RESIDENT_EVENTS_MAX),
            )
            .map_err(|e| ToolError::with_source("selecting the resident context failed", e))?;
            let note = format!(
                "resident: {} of {} context entries, {} of budget {}, {} omitted, {}",
                sel.counts.resident_entries,
                sel.counts.context_entries,
                human_bytes(sel.counts.resident_bytes),
                human_bytes(bytes),
                sel.counts.omitted_entries,
                if sel.complete {
                    "complete"
                } else {
                    "incomplete"
                }
            );
            (sel.context(), Some(note))
        }
    };
    if json {
        print_json(&ctx.messages)?;
        if let Some(n) = note {
            eprintln!("{n}");
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some((p, m)) = &ctx.model {
        crate::outln!("model: {p}/{m}");
    }
    if let Some(t) = &ctx.thinking_level {
        crate::outln!("thinking: {t}");
    }
    for m in &ctx.messages {
        let text: Vec<String> = m.content.iter().map(block_text).collect();
        crate::outln!(
            "{:>18}  {}",
            m.role.as_str(),
            ellipsize(&text.join(" "), 100)
        );
    }
    if let Some(n) = note {
        crate::outln!("{n}");
    }
    Ok(ExitCode::SUCCESS)
}
