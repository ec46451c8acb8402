//! The create and execute pipelines: hook order, observer events, hook
//! priorities, failures, factory rules and the status policy.

use crate::common;

use std::sync::Arc;

use common::*;
use spool_runtime::actions::{
    ActionError, ChangeSystemPrompt, ResumeSession, SessionAction, SuspendSession, WriteMetadata,
};
use spool_runtime::hooks::{FnHook, HookError, HookStage, SessionHookStack};
use spool_runtime::observer::{RecordingSink, RuntimeEvent};
use spool_runtime::session::{AgentSession, AgentState, SessionId, SessionStatus};
use spool_runtime::store::{ListQuery, MemoryStore, SessionStore, StoreError};
use spool_runtime::{RuntimeError, SessionRuntime};

#[test]
fn create_runs_hooks_in_seed_order_then_emits_saved() {
    let trace = Trace::default();
    let hooks = SessionHookStack::empty().with(
        TraceHook {
            name: "h".into(),
            trace: trace.clone(),
        },
        0,
    );
    let rt = SessionRuntime::new(Arc::new(MemoryStore::new()), Arc::new(trace.clone()), hooks);
    let s = rt.create(definition("a"), None).unwrap();
    assert_eq!(s.version(), 1);
    assert_eq!(
        trace.take(),
        [
            "h:before_create",
            "h:before_save",
            "h:after_save",
            "h:after_create",
            "event:SessionSaved"
        ]
    );
}

struct Traced {
    trace: Trace,
}

impl SessionAction for Traced {
    fn name(&self) -> &str {
        "traced"
    }
    fn execute(&self, s: &mut AgentSession) -> Result<(), ActionError> {
        self.trace.push("action");
        s.write_metadata("k", serde_json::json!(1))?;
        Ok(())
    }
}

#[test]
fn execute_runs_hooks_and_events_in_seed_order() {
    let trace = Trace::default();
    let hooks = SessionHookStack::empty().with(
        TraceHook {
            name: "h".into(),
            trace: trace.clone(),
        },
        0,
    );
    let rt = SessionRuntime::new(Arc::new(MemoryStore::new()), Arc::new(trace.clone()), hooks);
    let s = rt.create(definition("a"), None).unwrap();
    trace.take();
    let out = rt
        .execute(
            s.id(),
            &Traced {
                trace: trace.clone(),
            },
        )
        .unwrap();
    assert_eq!(out.version(), 2);
    assert_eq!(
        trace.take(),
        [
            "h:after_load",
            "event:SessionLoaded",
            "action",
            "h:after_action",
            "h:before_save",
            "event:SessionActionExecuted",
            "h:after_save",
            "event:SessionSaved"
        ]
    );
}

#[test]
fn event_sequences_match_the_contract() {
    let (rt, _store, sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    assert_eq!(sink.names(), ["SessionSaved"]);
    sink.take();

    rt.execute(s.id(), &WriteMetadata::new("a", 1)).unwrap();
    assert_eq!(
        sink.names(),
        ["SessionLoaded", "SessionActionExecuted", "SessionSaved"]
    );
    sink.take();

    let missing = SessionId::generate();
    let err = rt.execute(&missing, &SuspendSession).unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(sink.names(), ["SessionLoadFailed"]);
    match &sink.events()[0] {
        RuntimeEvent::SessionLoadFailed {
            session_id,
            error_kind,
            ..
        } => {
            assert_eq!(session_id, &missing);
            assert_eq!(error_kind, "not_found");
        }
        e => panic!("{e:?}"),
    }
}

/// An action that sneaks in a concurrent save, so the runtime's own save
/// is stale.
struct RacingAction {
    store: Arc<dyn SessionStore>,
}

impl SessionAction for RacingAction {
    fn name(&self) -> &str {
        "racing"
    }
    fn execute(&self, s: &mut AgentSession) -> Result<(), ActionError> {
        let mut other = self.store.load(s.id()).unwrap().unwrap();
        other
            .write_metadata("winner", serde_json::json!("other"))
            .unwrap();
        self.store.save(other).unwrap();
        s.write_metadata("winner", serde_json::json!("me"))?;
        Ok(())
    }
}

#[test]
fn stale_save_emits_save_failed_with_conflict() {
    let (rt, store, sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    sink.take();
    let err = rt
        .execute(
            s.id(),
            &RacingAction {
                store: store.clone(),
            },
        )
        .unwrap_err();
    match err {
        RuntimeError::Store(StoreError::Conflict {
            expected, actual, ..
        }) => assert_eq!((expected, actual), (1, 2)),
        e => panic!("expected a conflict, got {e}"),
    }
    assert_eq!(
        sink.names(),
        [
            "SessionLoaded",
            "SessionActionExecuted",
            "SessionSaveFailed"
        ]
    );
    let loaded = store.load(s.id()).unwrap().unwrap();
    assert_eq!(
        loaded.state().metadata["winner"],
        serde_json::json!("other")
    );
}

#[test]
fn create_failure_emits_save_failed() {
    // A BeforeCreate hook pins the id of an existing session, so the
    // store's create conflicts.
    let store = Arc::new(MemoryStore::new());
    let existing = store
        .create(AgentSession::new(definition("a"), None))
        .unwrap();
    let sink = Arc::new(RecordingSink::new());
    let existing_copy = existing.clone();
    let hooks = SessionHookStack::empty().with(
        FnHook::new("clone-id", move |stage, s: &mut AgentSession| {
            if stage == HookStage::BeforeCreate {
                // Replace the session by a fresh one with the taken id.
                let mut again = existing_copy.clone().reconstitute(0, 0);
                again.touch();
                *s = again;
            }
            Ok(())
        }),
        0,
    );
    let rt = SessionRuntime::new(store.clone(), sink.clone(), hooks);
    let err = rt.create(definition("a"), None).unwrap_err();
    assert!(err.is_conflict(), "{err}");
    assert_eq!(sink.names(), ["SessionSaveFailed"]);
    assert_eq!(store.load(existing.id()).unwrap().unwrap(), existing);
}

#[test]
fn action_executed_reports_real_versions_and_statuses() {
    let (rt, _store, sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    rt.execute(s.id(), &WriteMetadata::new("x", 1)).unwrap();
    sink.take();
    let out = rt.execute(s.id(), &SuspendSession).unwrap();
    let ev = sink
        .events()
        .into_iter()
        .find(|e| e.name() == "SessionActionExecuted")
        .unwrap();
    assert_eq!(
        ev,
        RuntimeEvent::SessionActionExecuted {
            session_id: s.id().clone(),
            action: "suspend_session".into(),
            before_version: 2,
            after_version: 3,
            before_status: SessionStatus::Active,
            after_status: SessionStatus::Suspended,
        }
    );
    assert_eq!(out.version(), 3);
    match sink.events().last().unwrap() {
        RuntimeEvent::SessionSaved {
            version, status, ..
        } => {
            assert_eq!(*version, 3);
            assert_eq!(*status, SessionStatus::Suspended);
        }
        e => panic!("{e:?}"),
    }
}

#[test]
fn hooks_run_by_priority_and_registration_order() {
    let trace = Trace::default();
    let h = |n: &str| TraceHook {
        name: n.into(),
        trace: trace.clone(),
    };
    let hooks = SessionHookStack::empty()
        .with(h("a10"), 10)
        .with(h("b100"), 100)
        .with(h("c10"), 10)
        .with(h("d50"), 50)
        .with(h("e-5"), -5)
        .with(h("f100"), 100);
    assert_eq!(hooks.names(), ["b100", "f100", "d50", "a10", "c10", "e-5"]);
    let rt = SessionRuntime::new(
        Arc::new(MemoryStore::new()),
        Arc::new(RecordingSink::new()),
        hooks,
    );
    rt.create(definition("a"), None).unwrap();
    let before_create: Vec<String> = trace
        .take()
        .into_iter()
        .filter(|t| t.ends_with(":before_create"))
        .collect();
    assert_eq!(
        before_create,
        [
            "b100:before_create",
            "f100:before_create",
            "d50:before_create",
            "a10:before_create",
            "c10:before_create",
            "e-5:before_create"
        ]
    );
}

#[test]
fn before_save_hook_changes_are_persisted_with_the_action() {
    // The seed's auto-suspend controller.
    let hooks = SessionHookStack::empty().with(
        FnHook::new("auto-suspend", |stage, s: &mut AgentSession| {
            if stage == HookStage::BeforeSave && s.status() == SessionStatus::Active {
                s.set_status(SessionStatus::Suspended)?;
            }
            Ok(())
        }),
        100,
    );
    let (rt, store, _sink) = memory_runtime_with(hooks);
    let s = rt.create(definition("a"), None).unwrap();
    assert_eq!(s.status(), SessionStatus::Suspended);
    let s = rt.execute(s.id(), &ResumeSession).unwrap();
    assert_eq!(
        s.status(),
        SessionStatus::Suspended,
        "suspended again before save"
    );
    assert_eq!(store.load(s.id()).unwrap().unwrap(), s);
}

#[test]
fn failing_hook_emits_event_and_persists_nothing() {
    let hooks = SessionHookStack::empty().with(
        FnHook::new("veto", |stage, _s: &mut AgentSession| {
            if stage == HookStage::AfterAction {
                return Err(HookError::rejected("no"));
            }
            Ok(())
        }),
        0,
    );
    let (rt, store, sink) = memory_runtime_with(hooks);
    let s = rt.create(definition("a"), None).unwrap();
    sink.take();
    let err = rt.execute(s.id(), &WriteMetadata::new("k", 1)).unwrap_err();
    match &err {
        RuntimeError::HookFailed {
            stage,
            hook,
            persisted_version,
            ..
        } => {
            assert_eq!(*stage, HookStage::AfterAction);
            assert_eq!(hook, "veto");
            assert_eq!(*persisted_version, None);
        }
        e => panic!("{e}"),
    }
    assert_eq!(sink.names(), ["SessionLoaded", "SessionHookFailed"]);
    assert_eq!(store.load(s.id()).unwrap().unwrap().version(), 1);
}

#[test]
fn failing_before_create_hook_stores_nothing() {
    let hooks = SessionHookStack::empty().with(
        FnHook::new("policy", |stage, _s: &mut AgentSession| {
            if stage == HookStage::BeforeCreate {
                return Err(HookError::rejected("creation closed"));
            }
            Ok(())
        }),
        0,
    );
    let (rt, store, sink) = memory_runtime_with(hooks);
    let err = rt.create(definition("a"), None).unwrap_err();
    assert!(matches!(err, RuntimeError::HookFailed { .. }), "{err}");
    assert_eq!(sink.names(), ["SessionHookFailed"]);
    assert!(store.is_empty());
}

#[test]
fn after_save_hook_changes_are_committed_in_a_follow_up_save() {
    let hooks = SessionHookStack::empty().with(
        FnHook::new("audit", |stage, s: &mut AgentSession| {
            if stage == HookStage::AfterSave {
                let n = s.version();
                s.write_metadata("audited_version", serde_json::json!(n))?;
            }
            Ok(())
        }),
        0,
    );
    let (rt, store, sink) = memory_runtime_with(hooks);
    let s = rt.create(definition("a"), None).unwrap();
    assert_eq!(s.version(), 2, "follow-up commit after create");
    assert_eq!(s.state().metadata["audited_version"], serde_json::json!(1));
    assert_eq!(sink.names(), ["SessionSaved", "SessionSaved"]);
    sink.take();
    let s = rt.execute(s.id(), &WriteMetadata::new("k", 1)).unwrap();
    assert_eq!(s.version(), 4);
    assert_eq!(s.state().metadata["audited_version"], serde_json::json!(3));
    assert_eq!(
        sink.names(),
        [
            "SessionLoaded",
            "SessionActionExecuted",
            "SessionSaved",
            "SessionSaved"
        ]
    );
    assert_eq!(store.load(s.id()).unwrap().unwrap(), s, "nothing dropped");
}

#[test]
fn failing_after_save_hook_reports_the_persisted_version() {
    let hooks = SessionHookStack::empty().with(
        FnHook::new("notify", |stage, _s: &mut AgentSession| {
            if stage == HookStage::AfterSave {
                return Err(HookError::rejected("mail server down"));
            }
            Ok(())
        }),
        0,
    );
    let (rt, store, sink) = memory_runtime_with(hooks);
    let err = rt.create(definition("a"), None).unwrap_err();
    match err {
        RuntimeError::HookFailed {
            persisted_version,
            id,
            ..
        } => {
            assert_eq!(persisted_version, Some(1));
            assert!(store.exists(&id).unwrap());
        }
        e => panic!("{e}"),
    }
    assert_eq!(sink.names(), ["SessionHookFailed", "SessionSaved"]);
}

#[test]
fn failing_action_emits_action_failed_and_saves_nothing() {
    struct Boom;
    impl SessionAction for Boom {
        fn name(&self) -> &str {
            "boom"
        }
        fn execute(&self, s: &mut AgentSession) -> Result<(), ActionError> {
            s.write_metadata("half", serde_json::json!(true))?;
            Err(ActionError::not_allowed("boom"))
        }
    }
    let (rt, store, sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    sink.take();
    let err = rt.execute(s.id(), &Boom).unwrap_err();
    assert!(matches!(err, RuntimeError::ActionFailed { ref action, .. } if action == "boom"));
    assert_eq!(sink.names(), ["SessionLoaded", "SessionActionFailed"]);
    let stored = store.load(s.id()).unwrap().unwrap();
    assert_eq!(stored.version(), 1);
    assert!(!stored.state().metadata.contains_key("half"));
}

#[test]
fn factory_rules_prompt_override_and_label_fallback() {
    let (rt, _store, _sink) = memory_runtime();
    let seed = AgentState::new()
        .with_system_prompt("seed prompt")
        .with_metadata("from_seed", serde_json::json!(true));
    let s = rt.create(definition("named"), Some(seed.clone())).unwrap();
    assert_eq!(s.state().system_prompt, "You are helpful.");
    assert_eq!(s.state().metadata["from_seed"], serde_json::json!(true));
    assert_eq!(s.info().label, "named", "label falls back to the name");
    assert_eq!(s.info().agent_name, "named");
    assert_eq!(s.status(), SessionStatus::Active);
    assert_eq!(s.parent_id(), None);

    let labelled = definition("named").with_label("Shown");
    let s = rt.create(labelled, None).unwrap();
    assert_eq!(s.info().label, "Shown");

    let mut no_prompt = definition("quiet");
    no_prompt.system_prompt.clear();
    let s = rt.create(no_prompt, Some(seed)).unwrap();
    assert_eq!(
        s.state().system_prompt,
        "seed prompt",
        "an empty definition prompt keeps the seed's"
    );
}

#[test]
fn deleted_is_terminal() {
    let (rt, store, sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    let d = rt.delete(s.id()).unwrap();
    assert_eq!(d.status(), SessionStatus::Deleted);
    assert_eq!(d.version(), 2);
    sink.take();
    for action in [
        &ResumeSession as &dyn SessionAction,
        &WriteMetadata::new("k", 1),
        &ChangeSystemPrompt::new("x"),
    ] {
        let err = rt.execute(s.id(), action).unwrap_err();
        assert!(
            matches!(err, RuntimeError::SessionDeleted { ref id } if id == s.id()),
            "{err}"
        );
    }
    assert_eq!(
        sink.names(),
        ["SessionLoaded", "SessionActionFailed"].repeat(3)
    );
    assert!(matches!(
        rt.delete(s.id()),
        Err(RuntimeError::SessionDeleted { .. })
    ));
    assert!(matches!(
        rt.fork(s.id(), None),
        Err(RuntimeError::SessionDeleted { .. })
    ));
    assert_eq!(store.load(s.id()).unwrap().unwrap().version(), 2);
    assert!(rt.list_sessions(&ListQuery::all()).unwrap().is_empty());
    assert!(rt.purge(s.id()).unwrap());
    assert!(rt.get_session(s.id()).unwrap_err().is_not_found());
}

#[test]
fn status_policy_is_enforced_through_the_runtime() {
    use spool_runtime::actions::{CompleteSession, FailSession};
    let (rt, _store, _sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    let id = s.id().clone();
    assert_eq!(
        rt.execute(&id, &SuspendSession).unwrap().status(),
        SessionStatus::Suspended
    );
    assert_eq!(
        rt.execute(&id, &ResumeSession).unwrap().status(),
        SessionStatus::Active
    );
    assert_eq!(
        rt.execute(&id, &CompleteSession).unwrap().status(),
        SessionStatus::Completed
    );
    let err = rt.execute(&id, &SuspendSession).unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::InvalidTransition {
                from: SessionStatus::Completed,
                to: SessionStatus::Suspended,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        rt.execute(&id, &FailSession::default()).is_err(),
        "Completed -> Failed needs a reopen"
    );
    assert_eq!(
        rt.execute(&id, &ResumeSession).unwrap().status(),
        SessionStatus::Active,
        "reopen"
    );
    let f = rt
        .execute(
            &id,
            &FailSession {
                reason: Some("gave up".into()),
            },
        )
        .unwrap();
    assert_eq!(f.status(), SessionStatus::Failed);
    assert_eq!(
        f.state().metadata["failure_reason"],
        serde_json::json!("gave up")
    );
}

#[test]
fn session_info_and_listing_never_load_state() {
    let (rt, store, _sink) = memory_runtime();
    let s = rt.create(definition("a"), None).unwrap();
    let info = rt.session_info(s.id()).unwrap();
    assert_eq!(&info, s.info());
    rt.list_sessions(&ListQuery::all()).unwrap();
    assert_eq!(store.stats().full_loads, 0);
    assert!(rt
        .session_info(&SessionId::generate())
        .unwrap_err()
        .is_not_found());
    rt.get_session(s.id()).unwrap();
    assert_eq!(store.stats().full_loads, 1);
}

#[test]
fn get_session_reports_loaded_and_runs_no_hooks() {
    let trace = Trace::default();
    let hooks = SessionHookStack::empty().with(
        TraceHook {
            name: "h".into(),
            trace: trace.clone(),
        },
        0,
    );
    let rt = SessionRuntime::new(Arc::new(MemoryStore::new()), Arc::new(trace.clone()), hooks);
    let s = rt.create(definition("a"), None).unwrap();
    trace.take();
    assert_eq!(rt.get_session(s.id()).unwrap(), s);
    assert_eq!(trace.take(), ["event:SessionLoaded"]);
    assert!(rt.get_session(&SessionId::generate()).is_err());
    assert_eq!(trace.take(), ["event:SessionLoadFailed"]);
}

/// The one-call open: a log store in the directory (created if missing),
/// owned by this runtime, with hooks and an observer added by the builder
/// methods; what it writes is there after a reopen, and a second owner is
/// refused while the first lives.
#[test]
fn open_is_a_log_store_runtime_that_hooks_and_observers_can_be_added_to() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("fresh").join("store");
    let trace = Trace::default();
    let hooks = SessionHookStack::empty().with(
        TraceHook {
            name: "h".into(),
            trace: trace.clone(),
        },
        0,
    );
    let rt = SessionRuntime::open(&path)
        .unwrap()
        .with_hooks(hooks)
        .with_events(Arc::new(trace.clone()));
    let s = rt.create(definition("a"), None).unwrap();
    let s = rt
        .execute(s.id(), &WriteMetadata::new("k", serde_json::json!(1)))
        .unwrap();
    assert_eq!(s.version(), 2);
    let seen = trace.take();
    assert!(seen.contains(&"h:before_create".to_string()), "{seen:?}");
    assert!(seen.contains(&"event:SessionSaved".to_string()), "{seen:?}");

    let second = SessionRuntime::open(&path).unwrap_err();
    assert!(second.to_string().contains("lock"), "{second}");
    drop(rt);

    let rt = SessionRuntime::open(&path).unwrap();
    let info = rt.session_info(s.id()).unwrap();
    assert_eq!(info.version, 2);
    assert_eq!(
        trace.take(),
        Vec::<String>::new(),
        "the reopened runtime has no observer"
    );
}
