//! `spool show`: one session's header, definition and a summary of its state.

use std::process::ExitCode;

use serde::Serialize;
use spool_runtime::session::{AgentDefinition, AgentSession};

use crate::cmd::sessions::HeaderRow;
use crate::out::{ellipsize, human_time_ms, print_doc, Result};
use crate::session_open::runtime_err;
use spool_runtime::{SessionId, SessionRuntime};

#[derive(Serialize)]
struct StateSummary {
    entries: u64,
    leaf: Option<String>,
    generation: u64,
    system_prompt: String,
    model: String,
    execution_count: u64,
    execution: String,
    last_error: Option<String>,
    usage_total_tokens: u64,
    metadata: serde_json::Map<String, serde_json::Value>,
    tasks: Vec<serde_json::Value>,
}

/// What `show` prints for a session (also used by `replay --at-version`).
#[derive(Serialize)]
pub struct Shown<'a> {
    header: HeaderRow,
    definition: &'a AgentDefinition,
    state: StateSummary,
}

fn summary(s: &AgentSession) -> StateSummary {
    let st = s.state();
    StateSummary {
        entries: st.transcript.len() as u64,
        leaf: st.transcript.leaf().map(|l| l.to_string()),
        generation: st.generation,
        system_prompt: st.system_prompt.clone(),
        model: st.model.qualified_name(),
        execution_count: st.execution_count,
        execution: format!("{:?}", st.execution).to_lowercase(),
        last_error: st.last_error.clone(),
        usage_total_tokens: st.total_usage.total(),
        metadata: st
            .metadata
            .iter()
            .map(|(k, v)| (k.clone(), v.to_value()))
            .collect(),
        tasks: st
            .tasks
            .iter()
            .map(|t| serde_json::to_value(t).unwrap_or(serde_json::Value::Null))
            .collect(),
    }
}

impl<'a> Shown<'a> {
    pub fn of(s: &'a AgentSession) -> Self {
        Shown {
            header: HeaderRow::from(s.info()),
            definition: s.definition(),
            state: summary(s),
        }
    }
}

pub fn run(rt: &SessionRuntime, id: &SessionId, json: bool) -> Result<ExitCode> {
    let s = rt.get_session(id).map_err(|e| runtime_err(id, e))?;
    if json {
        print_doc(&Shown::of(&s))?;
        return Ok(ExitCode::SUCCESS);
    }
    print_text(&s)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints a session as `show` does without `--json`.
pub fn print_text(s: &AgentSession) -> Result<()> {
    let shown = Shown::of(s);
    let h = &shown.header;
    let st = &shown.state;
    crate::outln!("session   {}", h.id);
    crate::outln!("status    {} (version {})", h.status, h.version);
    crate::outln!("agent     {} — {}", h.agent_name, h.label);
    if let Some(p) = &h.parent_id {
        crate::outln!("parent    {p}");
    }
    crate::outln!("created   {}", human_time_ms(h.created_at));
    crate::outln!("updated   {}", human_time_ms(h.updated_at));
    crate::outln!("model     {}", st.model);
    crate::outln!("prompt    {}", ellipsize(&st.system_prompt, 70));
    crate::outln!(
        "state     {} entries (generation {}), leaf {}, {} executions, last {}{}",
        st.entries,
        st.generation,
        st.leaf.as_deref().unwrap_or("-"),
        st.execution_count,
        st.execution,
        st.last_error
            .as_ref()
            .map(|e| format!(" ({})", ellipsize(e, 40)))
            .unwrap_or_default()
    );
    crate::outln!("tokens    {}", st.usage_total_tokens);
    if !st.metadata.is_empty() {
        crate::outln!("metadata");
        for (k, v) in &st.metadata {
            crate::outln!("  {k} = {}", ellipsize(&v.to_string(), 60));
        }
    }
    if !st.tasks.is_empty() {
        crate::outln!("tasks");
        for t in &s.state().tasks {
            crate::outln!(
                "  [{:?}] {} {}",
                t.status,
                t.id,
                ellipsize(&t.description, 60)
            );
        }
    }
    Ok(())
}
