//! Built-in actions, the scripted loop, forks and custom actions.

use crate::common;

use std::sync::Arc;

use common::*;
use spool_runtime::actions::{
    ActionError, ChangeModel, ChangeSystemPrompt, ClearSession, RemoveMetadata, ResumeSession,
    SendMessage, SessionAction, SuspendSession, UpdateTask, WriteMetadata,
};
use spool_runtime::agent_loop::{
    AgentLoop, LoopError, LoopFactory, LoopSettings, ScriptedLoopFactory, ScriptedTurn,
};
use spool_runtime::session::{
    AgentDefinition, AgentSession, ExecutionStatus, ModelConfig, SessionError, SessionEvent,
    SessionStatus, Task, TaskListError, TaskStatus, MAX_TASKS,
};
use spool_runtime::store::{ListQuery, SessionStore};
use spool_runtime::transcript::{ContentBlock, EntryKind, Message, StopReason};
use spool_runtime::RuntimeError;

fn text_of(kind: &EntryKind) -> String {
    let content = match kind {
        EntryKind::Message {
            message:
                Message::User { content }
                | Message::Assistant { content, .. }
                | Message::ToolResult { content, .. },
        } => content,
        _ => return String::new(),
    };
    content
        .iter()
        .map(|b| match b {
            ContentBlock::Text { text } => text.clone(),
            ContentBlock::ToolCall { name, .. } => format!("<call {name}>"),
            _ => String::new(),
        })
        .collect()
}

fn role(kind: &EntryKind) -> &'static str {
    match kind {
        EntryKind::Message { message } => match message {
            Message::User { .. } => "user",
            Message::Assistant { .. } => "assistant",
            Message::ToolResult { .. } => "tool",
            _ => "?",
        },
        _ => "other",
    }
}

#[test]
fn send_message_appends_user_and_loop_entries_and_records_the_execution() {
    let (rt, store, _sink) = memory_runtime();
    let factory = Arc::new(ScriptedLoopFactory::echo());
    let s = rt.create(definition("a"), None).unwrap();
    let s = rt
        .execute(s.id(), &SendMessage::new("What is 2 + 2?", factory.clone()))
        .unwrap();
    let entries = s.state().transcript.entries();
    assert_eq!(entries.len(), 2);
    assert_eq!(role(&entries[0].kind), "user");
    assert_eq!(text_of(&entries[0].kind), "What is 2 + 2?");
    assert_eq!(role(&entries[1].kind), "assistant");
    assert_eq!(text_of(&entries[1].kind), "echo: What is 2 + 2?");
    assert_eq!(entries[1].parent_id.as_ref(), Some(&entries[0].id));
    assert_eq!(s.state().transcript.leaf(), Some(&entries[1].id));
    assert_eq!(s.state().execution, ExecutionStatus::Completed);
    assert_eq!(s.state().execution_count, 1);
    assert!(s.state().usage.output_tokens > 0);
    assert_eq!(s.state().total_usage, s.state().usage);
    assert_eq!(store.load(s.id()).unwrap().unwrap(), s);

    let s = rt
        .execute(s.id(), &SendMessage::new("again", factory))
        .unwrap();
    assert_eq!(s.state().transcript.len(), 4);
    assert_eq!(s.state().execution_count, 2);
    assert!(s.state().total_usage.output_tokens > s.state().usage.output_tokens);
}

#[test]
fn send_message_events_are_in_order() {
    let mut s = AgentSession::new(definition("a"), None);
    s.take_pending();
    let f = Arc::new(ScriptedLoopFactory::echo());
    SendMessage::new("hi", f).execute(&mut s).unwrap();
    let kinds: Vec<_> = s.pending_events().iter().map(SessionEvent::kind).collect();
    assert_eq!(
        kinds,
        [
            "entry_appended",
            "execution_started",
            "entry_appended",
            "execution_finished"
        ]
    );
}

#[test]
fn scripted_tool_round_produces_call_result_and_reply() {
    let (rt, _store, _sink) = memory_runtime();
    let factory = Arc::new(ScriptedLoopFactory::new([ScriptedTurn::ToolRound {
        tool: "bash".into(),
        arguments: serde_json::json!({"cmd": "ls"}),
        result: "a.txt".into(),
        reply: "There is one file.".into(),
    }]));
    let s = rt.create(definition("a"), None).unwrap();
    let s = rt
        .execute(s.id(), &SendMessage::new("list files", factory))
        .unwrap();
    let e = s.state().transcript.entries();
    let roles: Vec<_> = e.iter().map(|e| role(&e.kind)).collect();
    assert_eq!(roles, ["user", "assistant", "tool", "assistant"]);
    match (&e[1].kind, &e[2].kind) {
        (
            EntryKind::Message {
                message:
                    Message::Assistant {
                        content,
                        stop_reason,
                        ..
                    },
            },
            EntryKind::Message {
                message: Message::ToolResult { tool_call_id, .. },
            },
        ) => {
            assert_eq!(*stop_reason, StopReason::ToolUse);
            match &content[0] {
                ContentBlock::ToolCall { id, name, .. } => {
                    assert_eq!(id, tool_call_id, "result pairs with its call");
                    assert_eq!(name, "bash");
                }
                b => panic!("{b:?}"),
            }
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(text_of(&e[3].kind), "There is one file.");
}

#[test]
fn scripted_loop_is_deterministic() {
    let run = || {
        let mut s = AgentSession::new(definition("a"), None);
        let f = Arc::new(ScriptedLoopFactory::new([
            ScriptedTurn::Reply("one".into()),
            ScriptedTurn::Echo,
        ]));
        SendMessage::new("x", f.clone()).execute(&mut s).unwrap();
        SendMessage::new("y", f).execute(&mut s).unwrap();
        let e = s.state().transcript.entries();
        (
            e.iter().map(|e| text_of(&e.kind)).collect::<Vec<_>>(),
            s.state().total_usage,
        )
    };
    let a = run();
    assert_eq!(a, run());
    assert_eq!(a.0, ["x", "one", "y", "echo: y"]);
}

#[test]
fn change_model_changes_the_next_loop() {
    let (rt, _store, _sink) = memory_runtime();
    let factory = Arc::new(ScriptedLoopFactory::echo());
    let s = rt.create(definition("a"), None).unwrap();
    rt.execute(s.id(), &SendMessage::new("one", factory.clone()))
        .unwrap();
    let m2 = ModelConfig::new("openai", "gpt-4o").with_param("temperature", serde_json::json!(0.1));
    let changed = rt.execute(s.id(), &ChangeModel::new(m2.clone())).unwrap();
    assert_eq!(changed.state().model, m2);
    assert_eq!(
        changed.definition().model.model,
        "base",
        "the definition keeps its model"
    );
    let s = rt
        .execute(s.id(), &SendMessage::new("two", factory.clone()))
        .unwrap();
    let built = factory.built_models();
    assert_eq!(built.len(), 2);
    assert_eq!(built[0].model, "base");
    assert_eq!(
        built[1], m2,
        "the loop after ChangeModel uses the new model"
    );
    match &s.state().transcript.entries()[3].kind {
        EntryKind::Message {
            message: Message::Assistant { model, .. },
        } => assert_eq!(model.as_deref(), Some("openai/gpt-4o")),
        k => panic!("{k:?}"),
    }
}

#[test]
fn loop_failure_ends_the_execution_failed_and_the_session_stays_usable() {
    let (rt, store, _sink) = memory_runtime();
    let factory = Arc::new(ScriptedLoopFactory::new([ScriptedTurn::Fail(
        "provider unavailable".into(),
    )]));
    let s = rt.create(definition("a"), None).unwrap();
    let s = rt
        .execute(s.id(), &SendMessage::new("hello", factory.clone()))
        .unwrap();
    assert_eq!(s.status(), SessionStatus::Active);
    assert_eq!(s.state().execution, ExecutionStatus::Failed);
    assert_eq!(
        s.state().last_error.as_deref(),
        Some("provider unavailable")
    );
    assert_eq!(s.state().transcript.len(), 1, "the user message is kept");
    assert_eq!(
        store.load(s.id()).unwrap().unwrap(),
        s,
        "the failure is persisted"
    );
    let s = rt
        .execute(s.id(), &SendMessage::new("retry", factory))
        .unwrap();
    assert_eq!(s.state().execution, ExecutionStatus::Completed);
    assert_eq!(s.state().last_error, None);
    assert_eq!(s.state().execution_count, 2);
}

#[test]
fn loop_build_failure_is_recorded_too() {
    struct NoLoops;
    impl LoopFactory for NoLoops {
        fn build(
            &self,
            _d: &AgentDefinition,
            _s: &LoopSettings,
        ) -> Result<Box<dyn AgentLoop>, LoopError> {
            Err(LoopError::new("no capability registry"))
        }
    }
    let (rt, _store, _sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    let s = rt
        .execute(s.id(), &SendMessage::new("hi", Arc::new(NoLoops)))
        .unwrap();
    assert_eq!(s.state().execution, ExecutionStatus::Failed);
    assert_eq!(
        s.state().last_error.as_deref(),
        Some("no capability registry")
    );
}

#[test]
fn send_message_needs_an_active_session() {
    let (rt, store, _sink) = memory_runtime();
    let f = Arc::new(ScriptedLoopFactory::echo());
    let s = rt.create(definition("a"), None).unwrap();
    rt.execute(s.id(), &SuspendSession).unwrap();
    let err = rt
        .execute(s.id(), &SendMessage::new("hi", f.clone()))
        .unwrap_err();
    assert!(matches!(err, RuntimeError::ActionFailed { .. }), "{err}");
    assert!(store
        .load(s.id())
        .unwrap()
        .unwrap()
        .state()
        .transcript
        .is_empty());
    rt.execute(s.id(), &ResumeSession).unwrap();
    assert_eq!(
        rt.execute(s.id(), &SendMessage::new("hi", f))
            .unwrap()
            .state()
            .transcript
            .len(),
        2
    );
}

#[test]
fn suspend_and_resume_are_idempotent() {
    let (rt, _store, _sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    let a = rt.execute(s.id(), &SuspendSession).unwrap();
    let b = rt.execute(s.id(), &SuspendSession).unwrap();
    assert_eq!(b.status(), SessionStatus::Suspended);
    assert_eq!(
        b.version(),
        a.version() + 1,
        "a no-op save still advances the version"
    );
    assert_eq!(
        rt.execute(s.id(), &ResumeSession).unwrap().status(),
        SessionStatus::Active
    );
}

#[test]
fn clear_session_resets_state_but_keeps_identity_and_settings() {
    let (rt, _store, _sink) = memory_runtime();
    let f = Arc::new(ScriptedLoopFactory::echo());
    let s = rt.create(definition("a"), None).unwrap();
    rt.execute(s.id(), &SendMessage::new("hi", f)).unwrap();
    rt.execute(s.id(), &WriteMetadata::new("ticket", "OPS-1"))
        .unwrap();
    rt.execute(
        s.id(),
        &UpdateTask::set("t", "do it", TaskStatus::InProgress),
    )
    .unwrap();
    let before = rt.get_session(s.id()).unwrap();
    let c = rt.execute(s.id(), &ClearSession).unwrap();
    assert_eq!(c.id(), before.id());
    assert_eq!(c.definition(), before.definition());
    assert_eq!(c.info().created_at_ms, before.info().created_at_ms);
    assert!(c.state().transcript.is_empty());
    assert!(c.state().tasks.is_empty());
    assert_eq!(c.state().execution, ExecutionStatus::Pending);
    assert_eq!(c.state().metadata["ticket"], serde_json::json!("OPS-1"));
    assert_eq!(c.state().system_prompt, before.state().system_prompt);
    assert_eq!(c.state().model, before.state().model);
    assert_eq!(c.state().execution_count, 1);
    assert_eq!(c.state().total_usage, before.state().total_usage);
    assert_eq!(c.state().generation, before.state().generation + 1);
}

#[test]
fn change_system_prompt_and_metadata_write_remove() {
    let (rt, _store, _sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    let s = rt
        .execute(s.id(), &ChangeSystemPrompt::new("Bullet points only."))
        .unwrap();
    assert_eq!(s.state().system_prompt, "Bullet points only.");
    rt.execute(s.id(), &WriteMetadata::new("ticket_id", "OPS-142"))
        .unwrap();
    let s = rt
        .execute(s.id(), &WriteMetadata::new("priority", "high"))
        .unwrap();
    assert_eq!(s.state().metadata.len(), 2);
    let s = rt
        .execute(s.id(), &RemoveMetadata::new("priority"))
        .unwrap();
    assert_eq!(s.state().metadata.keys().collect::<Vec<_>>(), ["ticket_id"]);
    // Removing an absent key is a no-op, not an error.
    let s = rt.execute(s.id(), &RemoveMetadata::new("nope")).unwrap();
    assert_eq!(s.state().metadata.len(), 1);
    let err = rt.execute(s.id(), &WriteMetadata::new("", 1)).unwrap_err();
    assert!(matches!(err, RuntimeError::ActionFailed { .. }), "{err}");
}

#[test]
fn task_list_is_bounded_with_one_task_in_progress() {
    let (rt, _store, _sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    let id = s.id().clone();
    rt.execute(
        &id,
        &UpdateTask::set("t1", "Refactor auth", TaskStatus::InProgress),
    )
    .unwrap();
    let s = rt.execute(&id, &UpdateTask::add("Write tests")).unwrap();
    assert_eq!(s.state().tasks.len(), 2);
    assert_eq!(s.state().current_task().unwrap().id, "t1");
    let err = rt
        .execute(&id, &UpdateTask::set("t2", "also", TaskStatus::InProgress))
        .unwrap_err();
    match err {
        RuntimeError::ActionFailed { source, .. } => assert!(matches!(
            *source,
            ActionError::Session(SessionError::Tasks {
                source: TaskListError::SeveralInProgress(2),
                ..
            })
        )),
        e => panic!("{e}"),
    }
    // Finish t1, start t2: fine.
    rt.execute(
        &id,
        &UpdateTask::set("t1", "Refactor auth", TaskStatus::Completed),
    )
    .unwrap();
    let s = rt
        .execute(&id, &UpdateTask::set("t2", "also", TaskStatus::InProgress))
        .unwrap();
    assert_eq!(s.state().current_task().unwrap().id, "t2");
    let s = rt.execute(&id, &UpdateTask::Remove("t1".into())).unwrap();
    assert_eq!(s.state().tasks.len(), 2);
    // The bound.
    let full: Vec<Task> = (0..MAX_TASKS)
        .map(|i| Task::new(format!("k{i}"), "x", TaskStatus::Pending))
        .collect();
    rt.execute(&id, &UpdateTask::Replace(full)).unwrap();
    let err = rt
        .execute(&id, &UpdateTask::add("one too many"))
        .unwrap_err();
    match err {
        RuntimeError::ActionFailed { source, .. } => assert!(matches!(
            *source,
            ActionError::Session(SessionError::Tasks {
                source: TaskListError::TooMany,
                ..
            })
        )),
        e => panic!("{e}"),
    }
}

#[test]
fn fork_whole_and_at_an_entry() {
    let (rt, _store, sink) = memory_runtime();
    let f = Arc::new(ScriptedLoopFactory::echo());
    let s = rt.create(definition("a"), None).unwrap();
    rt.execute(s.id(), &SendMessage::new("one", f.clone()))
        .unwrap();
    let src = rt
        .execute(s.id(), &SendMessage::new("two", f.clone()))
        .unwrap();
    let first_reply = src.state().transcript.entries()[1].id.clone();
    sink.take();

    let whole = rt.fork(s.id(), None).unwrap();
    assert_eq!(sink.names(), ["SessionLoaded", "SessionSaved"]);
    assert_ne!(whole.id(), s.id());
    assert_eq!(whole.parent_id(), Some(s.id()));
    assert_eq!(whole.version(), 1);
    assert_eq!(whole.state().transcript, src.state().transcript);
    assert_eq!(whole.definition(), src.definition());

    let at = rt.fork(s.id(), Some(first_reply.clone())).unwrap();
    assert_eq!(at.state().transcript.len(), 2);
    assert_eq!(at.state().transcript.leaf(), Some(&first_reply));

    // The fork continues independently.
    let at = rt.execute(at.id(), &SendMessage::new("branch", f)).unwrap();
    assert_eq!(at.state().transcript.len(), 4);
    assert_eq!(rt.get_session(s.id()).unwrap().state().transcript.len(), 4);
    assert_eq!(rt.get_session(s.id()).unwrap().version(), src.version());

    let kids = rt
        .list_sessions(&ListQuery::all().children_of(s.id().clone()))
        .unwrap();
    let mut got = kids.ids();
    got.sort();
    let mut want = vec![whole.id().clone(), at.id().clone()];
    want.sort();
    assert_eq!(got, want);

    // Unknown entry: the fork action fails, nothing is created.
    let before = rt.list_sessions(&ListQuery::all()).unwrap().total;
    let bogus = spool_runtime::transcript::EntryId::parse("nope").unwrap();
    let err = rt.fork(s.id(), Some(bogus)).unwrap_err();
    assert!(matches!(err, RuntimeError::ActionFailed { .. }), "{err}");
    assert_eq!(rt.list_sessions(&ListQuery::all()).unwrap().total, before);
}

#[test]
fn custom_actions_through_the_public_trait() {
    /// The seed's ArchiveSession example.
    struct ArchiveSession {
        reason: String,
    }
    impl SessionAction for ArchiveSession {
        fn name(&self) -> &str {
            "archive_session"
        }
        fn execute(&self, s: &mut AgentSession) -> Result<(), ActionError> {
            s.write_metadata("archive_reason", serde_json::json!(self.reason))?;
            s.set_status(SessionStatus::Completed)?;
            Ok(())
        }
    }
    let (rt, _store, sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    let s = rt
        .execute(
            s.id(),
            &ArchiveSession {
                reason: "Ticket resolved".into(),
            },
        )
        .unwrap();
    assert_eq!(s.status(), SessionStatus::Completed);
    assert_eq!(
        s.state().metadata["archive_reason"],
        serde_json::json!("Ticket resolved")
    );
    assert!(sink.events().iter().any(|e| matches!(e,
        spool_runtime::observer::RuntimeEvent::SessionActionExecuted { action, .. } if action == "archive_session")));
}

#[test]
fn fork_through_the_repository_like_the_seed() {
    use spool_runtime::actions::ForkSession;
    use spool_runtime::store::{SessionRepository, StoreError};
    let (rt, store, _sink) = memory_runtime();
    let repo = SessionRepository::new(store);
    let s = rt.create(definition("a"), None).unwrap();
    let source = rt.get_session(s.id()).unwrap();
    let forked = ForkSession::whole().fork(&source).unwrap();
    assert_eq!(forked.version(), 0);
    let forked = repo.create(forked).unwrap();
    assert_eq!(forked.parent_id(), Some(s.id()));
    assert_eq!(repo.get(forked.id()).unwrap(), forked);
    let missing = spool_runtime::session::SessionId::generate();
    assert!(matches!(
        repo.get(&missing),
        Err(StoreError::NotFound { .. })
    ));
}
