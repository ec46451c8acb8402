//! `spool demo`: the main job. Builds a sample store with branching
//! sessions using the deterministic scripted agent loop, then shows it.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use serde_json::json;
use spool_runtime::actions::{
    ActionError, ChangeModel, CompleteSession, SendMessage, SessionAction, SuspendSession,
    UpdateTask, WriteMetadata,
};
use spool_runtime::agent_loop::{LoopFactory, ScriptedLoopFactory, ScriptedTurn};
use spool_runtime::session::{AgentDefinition, AgentSession, ModelConfig, SessionId, TaskStatus};
use spool_runtime::transcript::{ContentBlock, EntryId, EntryKind, Message};
use spool_runtime::{ListQuery, SessionRuntime};

use crate::cmd::display_store;
use crate::cmd::sessions::{print_headers, HeaderRow};
use crate::out::{print_doc, Result, ToolError};
use crate::session_open::{is_postgres, runtime_with, Access};

/// Moves the transcript leaf back to an earlier entry, so the next message
/// starts a new branch. (A custom action through the public trait.)
struct Rewind(EntryId);

impl SessionAction for Rewind {
    fn name(&self) -> &str {
        "rewind"
    }
    fn execute(&self, session: &mut AgentSession) -> std::result::Result<(), ActionError> {
        session.move_leaf(Some(self.0.clone()))?;
        Ok(())
    }
}

/// Labels an entry (labels are entries too; they never reach the model).
struct Label(EntryId, String);

impl SessionAction for Label {
    fn name(&self) -> &str {
        "label"
    }
    fn execute(&self, session: &mut AgentSession) -> std::result::Result<(), ActionError> {
        session.append(EntryKind::Label {
            target_id: self.0.clone(),
            label: Some(self.1.clone()),
        })?;
        Ok(())
    }
}

fn exec(rt: &SessionRuntime, id: &SessionId, action: &dyn SessionAction) -> Result<AgentSession> {
    rt.execute(id, action)
        .map_err(|e| ToolError::with_source(format!("demo: {} on {id} failed", action.name()), e))
}

/// The id of the first message whose text contains `needle`.
fn find_entry(s: &AgentSession, needle: &str) -> Option<EntryId> {
    s.state().transcript.entries().iter().find_map(|e| {
        let content = match &e.kind {
            EntryKind::Message {
                message: Message::User { content } | Message::Assistant { content, .. },
            } => content,
            _ => return None,
        };
        content
            .iter()
            .any(|b| matches!(b, ContentBlock::Text { text } if text.contains(needle)))
            .then(|| e.id.clone())
    })
}

pub fn run(dir: &Path, json: bool) -> Result<ExitCode> {
    let rt = runtime_with(dir, Access::Create)?;
    let loops = Arc::new(ScriptedLoopFactory::new([
        ScriptedTurn::ToolRound {
            tool: "bash".into(),
            arguments: json!({"command": "du -a src | sort -n | tail -3"}),
            result: "4120 src/engine.rs\n6310 src/runtime.rs\n9954 src/main.rs".into(),
            reply: "The three largest files are src/main.rs (9.9 KB), src/runtime.rs (6.3 KB) and src/engine.rs (4.1 KB).".into(),
        },
        ScriptedTurn::Reply("main.rs parses arguments and dispatches commands; runtime.rs folds events; engine.rs appends to the log.".into()),
        ScriptedTurn::Reply("Only Rust files: src/main.rs, src/runtime.rs, src/engine.rs.".into()),
        ScriptedTurn::Reply("On this branch: the same three files, sorted by name instead.".into()),
        ScriptedTurn::Reply("The review found two unchecked unwraps in engine.rs.".into()),
        ScriptedTurn::Reply("Plan: 1) index, 2) recovery, 3) benchmarks.".into()),
        ScriptedTurn::Reply("Plan confirmed with the larger model.".into()),
    ]));
    let factory: Arc<dyn LoopFactory> = loops;
    let send = |text: &str| SendMessage::new(text, factory.clone());

    // 1. A research session with a tool round, metadata and a task list.
    let researcher = AgentDefinition::new(
        "researcher",
        "Explores a code base and answers questions about it",
        "You are a careful research assistant. Cite file names.",
    )
    .with_label("Repository research");
    let mut researcher = researcher;
    researcher.model = ModelConfig::new("anthropic", "claude-sonnet");
    let s1 = rt
        .create(researcher.clone(), None)
        .map_err(|e| ToolError::with_source("demo: create failed", e))?;
    let id1 = s1.id().clone();
    exec(
        &rt,
        &id1,
        &send("Find the three largest files in the repository"),
    )?;
    exec(&rt, &id1, &send("What does each of them do?"))?;
    exec(&rt, &id1, &WriteMetadata::new("ticket", "OPS-142"))?;
    exec(
        &rt,
        &id1,
        &UpdateTask::set("t1", "Survey the repository", TaskStatus::Completed),
    )?;
    exec(
        &rt,
        &id1,
        &UpdateTask::set("t2", "Explain the main modules", TaskStatus::InProgress),
    )?;
    let s1 = exec(&rt, &id1, &UpdateTask::add("Write the summary"))?;

    // 2. A branch inside the same transcript: label the first answer,
    //    rewind to it and ask a different follow-up question.
    let first_q = find_entry(&s1, "three largest files in")
        .ok_or_else(|| ToolError::new("demo: first question not found"))?;
    let first_a = find_entry(&s1, "three largest files are")
        .ok_or_else(|| ToolError::new("demo: first answer not found"))?;
    exec(&rt, &id1, &Label(first_a.clone(), "survey".into()))?;
    exec(&rt, &id1, &Rewind(first_a))?;
    let s1 = exec(&rt, &id1, &send("Actually, list only Rust files"))?;

    // 3. A fork of the research session at its first question.
    let fork = rt
        .fork(&id1, Some(first_q))
        .map_err(|e| ToolError::with_source("demo: fork failed", e))?;
    exec(&rt, fork.id(), &send("Sort them by name instead"))?;

    // 4. A review session, suspended.
    let mut reviewer = AgentDefinition::new(
        "reviewer",
        "Reviews changes for correctness",
        "You review Rust code. Be specific.",
    );
    reviewer.model = ModelConfig::new("openai", "gpt-4o");
    let s3 = rt
        .create(reviewer, None)
        .map_err(|e| ToolError::with_source("demo: create failed", e))?;
    exec(&rt, s3.id(), &send("Review engine.rs"))?;
    exec(&rt, s3.id(), &SuspendSession)?;

    // 5. A planning session that changes model mid-way and completes.
    let mut planner = AgentDefinition::new("planner", "Plans work", "You plan engineering work.")
        .with_label("Quarter plan");
    planner.model = ModelConfig::new("anthropic", "claude-haiku");
    let s4 = rt
        .create(planner, None)
        .map_err(|e| ToolError::with_source("demo: create failed", e))?;
    exec(&rt, s4.id(), &send("Draft a plan for the storage work"))?;
    exec(
        &rt,
        s4.id(),
        &ChangeModel::new(ModelConfig::new("anthropic", "claude-opus")),
    )?;
    exec(&rt, s4.id(), &send("Confirm the plan"))?;
    exec(&rt, s4.id(), &CompleteSession)?;

    let list = rt
        .list_sessions(&ListQuery::all())
        .map_err(|e| ToolError::with_source("demo: listing failed", e))?;
    if json {
        let rows: Vec<HeaderRow> = list.headers.iter().map(HeaderRow::from).collect();
        print_doc(&json!({
            "store": display_store(dir),
            "created": [id1.to_string(), fork.id().to_string(), s3.id().to_string(), s4.id().to_string()],
            "sessions": rows,
        }))?;
        return Ok(ExitCode::SUCCESS);
    }
    crate::outln!("Built a sample store in {}:", display_store(dir));
    crate::outln!();
    print_headers(&list.headers)?;
    crate::outln!();
    crate::outln!(
        "Session {} branches after its first answer ({} entries):",
        id1,
        s1.state().transcript.len()
    );
    crate::outln!();
    drop(rt);
    let ro = crate::session_open::runtime_for(dir, false)?;
    super::tree::run(&ro, &id1, false)?;
    crate::outln!();
    crate::outln!("The model context at its leaf:");
    crate::outln!();
    super::context::run(&ro, &id1, None, false)?;
    crate::outln!();
    crate::outln!("Explore further:");
    for cmd in explore_commands(dir, &id1) {
        crate::outln!("  {cmd}");
    }
    Ok(ExitCode::SUCCESS)
}

/// The follow-up commands `demo` suggests: only ones that work on the
/// store it used (a PostgreSQL store has no log files to read or verify).
fn explore_commands(dir: &Path, id: &SessionId) -> Vec<String> {
    let store = display_store(dir);
    let short = &id.as_str()[..id.as_str().len().min(8)];
    let mut cmds = vec![
        format!("spool --store {store} show {short}"),
        format!("spool --store {store} sessions --parent {short}"),
    ];
    if !is_postgres(dir) {
        cmds.push(format!("spool --store {store} log --stream {short}"));
        cmds.push(format!("spool --store {store} verify"));
    }
    cmds
}
