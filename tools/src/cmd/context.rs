//! `spool context`: the model context of a session as it is built from its
//! leaf, in spool's shape or in a model API's (the library builds both;
//! this command prints).

use std::process::ExitCode;

use serde::Serialize;
use spool_runtime::transcript::api_format::{request_body, ApiFormat};
use spool_runtime::transcript::{
    select_resident, Budget, BudgetReport, ContentBlock, ContextMessage, ModelContext,
    DEFAULT_RESIDENT_EVENTS_MAX,
};

use crate::cli::ContextFormat;
use crate::out::{ellipsize, human_bytes, print_json, Result, ToolError};
use crate::session_open::runtime_err;
use spool_runtime::{SessionId, SessionRuntime};

/// The `--json` shape of the spool format.
const CONTEXT_JSON_VERSION: u32 = 1;

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

#[derive(Serialize)]
struct Model<'a> {
    provider: &'a str,
    model_id: &'a str,
}

#[derive(Serialize)]
struct ContextJson<'a> {
    version: u32,
    session: &'a str,
    system_prompt: &'a str,
    model: Option<Model<'a>>,
    thinking_level: Option<&'a str>,
    messages: &'a [ContextMessage],
    /// With `--budget-bytes`: what the budget kept and left out.
    budget: Option<&'a BudgetReport>,
}

fn budget_note(b: &BudgetReport) -> String {
    format!(
        "resident: {} of {} context entries, {} of budget {}, {} omitted, {} beyond the budget, {}",
        b.resident_entries,
        b.context_entries,
        human_bytes(b.resident_bytes),
        human_bytes(b.bytes_max),
        b.omitted.len(),
        b.beyond_budget.len(),
        if b.complete { "complete" } else { "incomplete" }
    )
}

/// The spool format without a budget (the demo's call).
pub fn run(
    rt: &SessionRuntime,
    id: &SessionId,
    budget_bytes: Option<u64>,
    json: bool,
) -> Result<ExitCode> {
    run_as(rt, id, budget_bytes, ContextFormat::Spool, json)
}

pub fn run_as(
    rt: &SessionRuntime,
    id: &SessionId,
    budget_bytes: Option<u64>,
    format: ContextFormat,
    json: bool,
) -> Result<ExitCode> {
    let s = rt.get_session(id).map_err(|e| runtime_err(id, e))?;
    let transcript = &s.state().transcript;
    let system_prompt = s.state().system_prompt.as_str();
    let (ctx, budget): (ModelContext, Option<BudgetReport>) = match budget_bytes {
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
            let path = transcript
                .current_path()
                .map_err(|e| ToolError::with_source("reading the path failed", e))?;
            (sel.context(), Some(BudgetReport::of(&path, &sel)))
        }
    };
    let api = match format {
        ContextFormat::Spool => None,
        ContextFormat::Openai => Some(ApiFormat::OpenAi),
        ContextFormat::Anthropic => Some(ApiFormat::Anthropic),
    };
    if let Some(api) = api {
        let body = request_body(api, system_prompt, &ctx);
        if json {
            print_json(&body)?;
        } else {
            let text = serde_json::to_string_pretty(&body)
                .map_err(|e| ToolError::with_source("formatting the context failed", e))?;
            crate::outln!("{text}");
        }
        if let Some(b) = &budget {
            eprintln!("{}", budget_note(b));
        }
        return Ok(ExitCode::SUCCESS);
    }
    if json {
        print_json(&ContextJson {
            version: CONTEXT_JSON_VERSION,
            session: id.as_str(),
            system_prompt,
            model: ctx.model.as_ref().map(|(p, m)| Model {
                provider: p,
                model_id: m,
            }),
            thinking_level: ctx.thinking_level.as_deref(),
            messages: &ctx.messages,
            budget: budget.as_ref(),
        })?;
        return Ok(ExitCode::SUCCESS);
    }
    if !system_prompt.is_empty() {
        crate::outln!("system: {}", ellipsize(system_prompt, 100));
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
    if let Some(b) = &budget {
        crate::outln!("{}", budget_note(b));
        for o in &b.omitted {
            crate::outln!("  omitted {} ({}, {})", o.id, o.kind, human_bytes(o.size));
        }
    }
    Ok(ExitCode::SUCCESS)
}
