//! `spool show`: one session's header, definition and a summary of its state.

use std::process::ExitCode;

use serde::Serialize;
use spool_runtime::session::{AgentDefinition, AgentSession, Task};
use spool_runtime::store::{StoreError, TranscriptHead};

use crate::cmd::sessions::HeaderRow;
use crate::out::{ellipsize, human_time_ms, print_doc, Result};
use crate::session_open::runtime_err;
use spool_runtime::{RuntimeError, SessionId, SessionRuntime};

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
    #[serde(skip)]
    tasks: &'a [Task],
}

/// The transcript's figures `show` prints: entries, leaf, generation.
struct TranscriptFigures {
    entries: u64,
    leaf: Option<String>,
    generation: u64,
}

fn summary(s: &AgentSession, t: TranscriptFigures) -> StateSummary {
    let st = s.state();
    StateSummary {
        entries: t.entries,
        leaf: t.leaf,
        generation: t.generation,
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
    /// From a whole session (its transcript loaded).
    pub fn of(s: &'a AgentSession) -> Self {
        let st = s.state();
        let figures = TranscriptFigures {
            entries: st.transcript.len() as u64,
            leaf: st.transcript.leaf().map(|l| l.to_string()),
            generation: st.generation,
        };
        Self::with(s, figures)
    }

    /// From a session folded without its transcript and the transcript's
    /// head at the same version.
    fn of_settings(s: &'a AgentSession, head: &TranscriptHead) -> Self {
        let figures = TranscriptFigures {
            entries: head.entries,
            leaf: head.leaf.as_ref().map(|l| l.to_string()),
            generation: head.version.generation,
        };
        Self::with(s, figures)
    }

    fn with(s: &'a AgentSession, figures: TranscriptFigures) -> Self {
        Shown {
            header: HeaderRow::from(s.info()),
            definition: s.definition(),
            state: summary(s, figures),
            tasks: &s.state().tasks,
        }
    }
}

/// How often `show` reads a session's settings and its transcript's head
/// (a commit may land between the two) before it loads the session whole.
const SETTINGS_READ_TRIES: u32 = 3;

/// The session folded without its transcript and its transcript's head, at
/// the same version, when the store answers both without a full load (the
/// log and PostgreSQL stores): what `show` prints costs the session's
/// settings, not its transcript. `None`: the store cannot, or commits kept
/// landing between the two reads.
fn settings_and_head(
    rt: &SessionRuntime,
    id: &SessionId,
) -> Result<Option<(AgentSession, TranscriptHead)>> {
    let Some(backend) = rt.store().transcript_backend() else {
        return Ok(None);
    };
    if !backend.has_settings() {
        return Ok(None);
    }
    for _ in 0..SETTINGS_READ_TRIES {
        let store_err = |e: StoreError| runtime_err(id, RuntimeError::from(e));
        let Some(head) = backend.head(id).map_err(store_err)? else {
            return Ok(None);
        };
        let Some(s) = backend.settings(id).map_err(store_err)? else {
            return Ok(None);
        };
        // The same version of the same incarnation: a session deleted and
        // created again between the two reads has another creation time.
        let info = s.info();
        if info.version == head.header.version && info.created_at_ms == head.header.created_at_ms {
            return Ok(Some((s, head)));
        }
    }
    Ok(None)
}

pub fn run(rt: &SessionRuntime, id: &SessionId, json: bool) -> Result<ExitCode> {
    let whole;
    let read = settings_and_head(rt, id)?;
    let shown = match &read {
        Some((s, head)) => Shown::of_settings(s, head),
        None => {
            whole = rt.get_session(id).map_err(|e| runtime_err(id, e))?;
            Shown::of(&whole)
        }
    };
    if json {
        print_doc(&shown)?;
        return Ok(ExitCode::SUCCESS);
    }
    print_text(&shown)?;
    Ok(ExitCode::SUCCESS)
}

/// Prints a session as `show` does without `--json`.
pub fn print_text(shown: &Shown<'_>) -> Result<()> {
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
        for t in shown.tasks {
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
