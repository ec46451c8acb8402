//! `SessionRuntime::execute` on the log and PostgreSQL stores works on a
//! bounded session (the resident working set plus the settings fold): no
//! built-in action loads a session whole, the working set an execute holds
//! does not grow with the history, and a turn's steps handed to the step
//! sink are durable as they happen (a crash mid-turn keeps them, the next
//! execute records the execution as interrupted and continues). The
//! scenarios take any store; the PostgreSQL runs are in `pg` at the end.

use crate::common;
use crate::handle_support;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use handle_support::*;
use serde_json::json;
use spool_engine::vfs::SimVfs;
use spool_engine::{Durability, Store};
use spool_runtime::actions::{
    ChangeModel, ChangeSystemPrompt, ClearSession, CompleteSession, FailSession, RemoveMetadata,
    ResumeSession, SendMessage, SuspendSession, UpdateTask, WriteMetadata,
};
use spool_runtime::agent_loop::{
    AgentLoop, LoopError, LoopFactory, LoopInput, LoopOutput, LoopSettings, ScriptedLoopFactory,
    ScriptedTurn,
};
use spool_runtime::handle::{BranchWithSummary, MoveLeaf, SetLabel};
use spool_runtime::observer::RuntimeEvent;
use spool_runtime::runtime::INTERRUPTED_ERROR;
use spool_runtime::session::{
    AgentDefinition, AgentSession, ExecutionStatus, ModelConfig, SessionId,
};
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::transcript::{
    Budget, ContentBlock, EntryId, EntryKind, Message, StopReason, Transcript, Usage,
};
use spool_runtime::SessionRuntime;

/// A session of `n` entries of about `bytes` bytes each, appended through
/// a writer handle in chunks (closed before returning). Returns the ids.
fn history(rt: &SessionRuntime, id: &SessionId, n: usize, bytes: usize) -> Vec<EntryId> {
    const CHUNK: usize = 1000;
    let h = writer(rt, id, 64 * 1024);
    let mut ids = Vec::with_capacity(n);
    let mut i = 0;
    while i < n {
        let kinds: Vec<EntryKind> = (i..(i + CHUNK).min(n)).map(|k| sized(k, bytes)).collect();
        i += kinds.len();
        ids.extend(h.append_entries(kinds).unwrap());
    }
    h.close();
    ids
}

fn text_of(kind: &EntryKind) -> String {
    match kind {
        EntryKind::Message {
            message: Message::User { content } | Message::Assistant { content, .. },
        } => content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect(),
        _ => String::new(),
    }
}

/// A bounded execute's answer checked against a full load (which it
/// counts in `reference`): the same version, header, definition and state
/// but the transcript, and a transcript that is the tail of the full
/// one's current path (the working set of the leaf's context).
fn assert_matches_full(store: &dyn SessionStore, s: &AgentSession, reference: &mut u64) {
    let full = store.load(s.id()).unwrap().unwrap();
    *reference += 1;
    assert_eq!(s.version(), full.version());
    assert_eq!(s.info(), full.info());
    assert_eq!(s.definition(), full.definition());
    let mut want = full.state().clone();
    want.transcript = Transcript::new();
    let mut got = s.state().clone();
    got.transcript = Transcript::new();
    assert_eq!(got, want);
    let path: Vec<&EntryId> = full
        .state()
        .transcript
        .current_path()
        .unwrap()
        .into_iter()
        .map(|e| &e.id)
        .collect();
    let held: Vec<&EntryId> = s
        .state()
        .transcript
        .entries()
        .iter()
        .map(|e| &e.id)
        .collect();
    assert!(!held.is_empty() && held.len() <= path.len());
    assert_eq!(held, path[path.len() - held.len()..]);
    assert_eq!(s.state().transcript.leaf(), full.state().transcript.leaf());
}

/// Every built-in action executed on a long session of `store`, none of
/// them (but the whole fork, which is not an execute) loading it whole.
fn every_builtin_action(store: Arc<dyn SessionStore>) {
    let (rt, _sink) = runtime(store.clone());
    let id = new_session(&rt);
    // 3,000 entries of ~200 bytes: far beyond the 64 KiB resident budget.
    let ids = history(&rt, &id, 3000, 200);
    let old = ids[10].clone();
    // Full loads of the checks against a reference.
    let mut reference = 0u64;
    let loads = |reference: u64| store.stats().full_loads - reference;
    assert_eq!(loads(reference), 0);

    let echo = Arc::new(ScriptedLoopFactory::echo());
    let s = rt.execute(&id, &SendMessage::new("hello", echo)).unwrap();
    assert!(s.is_bounded(), "a long session executes bounded");
    assert_matches_full(&*store, &s, &mut reference);
    let resident = s.resident().unwrap();
    assert!(resident.resident_bytes() <= 64 * 1024);
    assert_eq!(resident.transcript_entries, 3000);
    assert_eq!(s.state().execution, ExecutionStatus::Completed);
    let leaf = s.state().transcript.leaf().unwrap().clone();
    let reply = s.state().transcript.get(&leaf).unwrap();
    assert_eq!(text_of(&reply.kind), "echo: hello");

    let durable = Arc::new(
        ScriptedLoopFactory::new([ScriptedTurn::ToolRound {
            tool: "ls".into(),
            arguments: json!({}),
            result: "a b".into(),
            reply: "done".into(),
        }])
        .durable(),
    );
    let s = rt.execute(&id, &SendMessage::new("list", durable)).unwrap();
    assert_matches_full(&*store, &s, &mut reference);
    let s = rt
        .execute(&id, &ChangeSystemPrompt::new("Be brief."))
        .unwrap();
    assert_matches_full(&*store, &s, &mut reference);
    let s = rt
        .execute(&id, &ChangeModel::new(ModelConfig::new("p", "m2")))
        .unwrap();
    assert_matches_full(&*store, &s, &mut reference);
    let s = rt.execute(&id, &WriteMetadata::new("k", json!(1))).unwrap();
    assert_matches_full(&*store, &s, &mut reference);
    let s = rt.execute(&id, &RemoveMetadata::new("k")).unwrap();
    assert_matches_full(&*store, &s, &mut reference);
    let s = rt.execute(&id, &UpdateTask::add("a task")).unwrap();
    assert_matches_full(&*store, &s, &mut reference);
    let s = rt.execute(&id, &SuspendSession).unwrap();
    assert_matches_full(&*store, &s, &mut reference);
    let s = rt.execute(&id, &ResumeSession).unwrap();
    assert_matches_full(&*store, &s, &mut reference);
    assert_eq!(loads(reference), 0);
    // Navigation to an entry far outside the working set reads it through
    // the index.
    rt.execute(
        &id,
        &SetLabel {
            target: old.clone(),
            label: Some("early".into()),
        },
    )
    .unwrap();
    let s = rt
        .execute(
            &id,
            &MoveLeaf {
                to: Some(old.clone()),
            },
        )
        .unwrap();
    assert_eq!(s.state().transcript.leaf(), Some(&old));
    let s = rt
        .execute(
            &id,
            &BranchWithSummary {
                target: Some(ids[5].clone()),
                summary: "left the long branch".into(),
            },
        )
        .unwrap();
    let summary = s.state().transcript.leaf().unwrap();
    assert_eq!(
        s.state()
            .transcript
            .get(summary)
            .unwrap()
            .parent_id
            .as_ref(),
        Some(&ids[5])
    );
    let forked = rt.fork(&id, Some(old.clone())).unwrap();
    assert_eq!(forked.state().transcript.len(), 11, "root→entry 10");
    assert_eq!(forked.state().transcript.leaf(), Some(&old));
    rt.execute(&id, &CompleteSession).unwrap();
    rt.execute(&id, &ResumeSession).unwrap();
    rt.execute(&id, &FailSession { reason: None }).unwrap();
    rt.execute(&id, &ResumeSession).unwrap();
    rt.execute(&id, &ClearSession).unwrap();
    rt.delete(&id).unwrap();
    assert_eq!(loads(reference), 0, "no execute loaded the session whole");

    // What was stored, checked against one reference load.
    let full = store.load(&id).unwrap().unwrap();
    assert_eq!(loads(reference), 1);
    let st = full.state();
    assert!(st.transcript.is_empty(), "cleared");
    assert_eq!(st.system_prompt, "Be brief.");
    assert_eq!(st.model, ModelConfig::new("p", "m2"));
    assert!(!st.metadata.contains_key("k"));
    assert_eq!(st.execution_count, 2);
    let fork_full = store.load(forked.id()).unwrap().unwrap();
    let t = &fork_full.state().transcript;
    assert_eq!(t.len(), 11);
    let want: Vec<&EntryId> = ids[..11].iter().collect();
    let got: Vec<&EntryId> = t.entries().iter().map(|e| &e.id).collect();
    assert_eq!(got, want);
}

#[test]
fn every_builtin_action_executes_without_a_full_load_on_the_log_store() {
    let dir = tempfile::tempdir().unwrap();
    every_builtin_action(open_log(dir.path()));
}

fn a_whole_fork_loads_once(store: Arc<dyn SessionStore>) {
    let (rt, _sink) = runtime(store.clone());
    let id = new_session(&rt);
    history(&rt, &id, 2000, 200);
    let f = rt.fork(&id, None).unwrap();
    assert_eq!(store.stats().full_loads, 1);
    assert_eq!(f.state().transcript.len(), 2000);
}

#[test]
fn a_whole_fork_is_the_one_documented_full_load() {
    let dir = tempfile::tempdir().unwrap();
    a_whole_fork_loads_once(open_log(dir.path()));
}

/// A durable turn on a bounded session of `store`: one commit per step.
fn steps_chain(store: Arc<dyn SessionStore>) {
    let (rt, sink) = runtime(store.clone());
    let id = new_session(&rt);
    let ids = history(&rt, &id, 1500, 200);
    let before = store.header(&id).unwrap().unwrap().version;
    sink.take();
    let f = Arc::new(
        ScriptedLoopFactory::new([ScriptedTurn::ToolRound {
            tool: "ls".into(),
            arguments: json!({}),
            result: "a b".into(),
            reply: "done".into(),
        }])
        .durable(),
    );
    let s = rt.execute(&id, &SendMessage::new("list", f)).unwrap();
    // Three step commits (the first with the user's message), then the
    // final commit with the end of the execution.
    assert_eq!(s.version(), before + 4);
    let names: Vec<&str> = sink.take().iter().map(|e| e.name()).collect();
    assert_eq!(
        names,
        [
            "SessionLoaded",
            "SessionSaved",
            "SessionSaved",
            "SessionSaved",
            "SessionActionExecuted",
            "SessionSaved"
        ]
    );
    assert_eq!(store.stats().full_loads, 0);
    let full = store.load(&id).unwrap().unwrap();
    let path = full.state().transcript.current_path().unwrap();
    let tail: Vec<String> = path[path.len() - 4..]
        .iter()
        .map(|e| e.kind_name().to_string() + ":" + &text_of(&e.kind))
        .collect();
    assert_eq!(tail[0], "message:list");
    assert_eq!(tail[3], "message:done");
    assert_eq!(path[path.len() - 5].id, *ids.last().unwrap());
    assert_eq!(full.state().execution, ExecutionStatus::Completed);
}

#[test]
fn the_steps_of_a_bounded_turn_chain_under_the_users_message() {
    let dir = tempfile::tempdir().unwrap();
    steps_chain(open_log(dir.path()));
}

/// What each execute's loop was given, recorded by [`Probe`].
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<Vec<(usize, bool, u64)>>>);

/// Replies at once and records the input's context size, completeness and
/// transcript size.
struct Probe(Seen);

impl LoopFactory for Probe {
    fn build(
        &self,
        _d: &AgentDefinition,
        _s: &LoopSettings,
    ) -> Result<Box<dyn AgentLoop>, LoopError> {
        Ok(Box::new(ProbeLoop(self.0.clone())))
    }
}

struct ProbeLoop(Seen);

impl AgentLoop for ProbeLoop {
    fn run(&mut self, input: LoopInput<'_>) -> Result<LoopOutput, LoopError> {
        self.0 .0.lock().unwrap().push((
            input.context.messages.len(),
            input.context_complete,
            input.transcript_entries,
        ));
        // Older entries are there on demand.
        let first = input.context.messages[0].entry_id.clone().unwrap();
        let older = input
            .history
            .older(&first, 3)
            .map_err(|e| LoopError::new(e.to_string()))?;
        assert_eq!(older.len(), 3);
        Ok(LoopOutput {
            entries: vec![sized(1, 400)],
            usage: Usage::default(),
            status: ExecutionStatus::Completed,
        })
    }
}

/// The working set of one execute at a history of `n` entries: context
/// messages, resident entries and bytes of the session it returns.
fn working_set(store: Arc<dyn SessionStore>, n: usize) -> (usize, usize, u64) {
    let (rt, _sink) = runtime(store.clone());
    let id = new_session(&rt);
    history(&rt, &id, n, 400);
    let seen = Seen::default();
    let factory = Arc::new(Probe(seen.clone()));
    let mut last = None;
    for turn in 0..5 {
        let s = rt
            .execute(
                &id,
                &SendMessage::new(format!("turn {turn}"), factory.clone()),
            )
            .unwrap();
        last = Some(s);
    }
    let s = last.unwrap();
    assert_eq!(store.stats().full_loads, 0);
    let seen = seen.0.lock().unwrap().clone();
    for (k, (_, complete, entries)) in seen.iter().enumerate() {
        assert!(!complete, "the budget cut the context at {n}");
        assert_eq!(*entries, (n + 2 * k + 1) as u64);
    }
    let r = s.resident().unwrap();
    assert!(r.resident_bytes() <= Budget::default().bytes_max);
    (
        seen.last().unwrap().0,
        s.state().transcript.len(),
        r.resident_bytes(),
    )
}

/// [`working_set`] at a short and a long history of stores from `open`:
/// the same.
fn working_set_is_flat(mut open: impl FnMut() -> Arc<dyn SessionStore>, short: usize, long: usize) {
    let (ctx_s, held_s, bytes_s) = working_set(open(), short);
    let (ctx_l, held_l, bytes_l) = working_set(open(), long);
    assert_eq!(ctx_s, ctx_l, "context messages");
    assert_eq!(held_s, held_l, "entries the session holds");
    // Entry texts grow by a digit or two with the history.
    assert!(bytes_l <= bytes_s + 1024, "{bytes_s} → {bytes_l}");
    assert!(held_l < 300, "the working set, not the history: {held_l}");
}

#[test]
fn the_working_set_of_execute_does_not_grow_with_history() {
    let dirs = [tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap()];
    let mut next = dirs.iter();
    working_set_is_flat(|| open_log(next.next().unwrap().path()), 1_000, 10_000);
}

// ---- crash mid-turn -------------------------------------------------------

/// A log store on a simulated file system (its index on a real temporary
/// directory), every commit synced.
fn sim_store(sim: &SimVfs, index: &Path) -> Arc<LogStore> {
    let opts = LogStoreOptions {
        durability: Durability::Immediate,
        ..LogStoreOptions::default()
    };
    let engine = Store::open(
        PathBuf::from("/sim/store"),
        opts.engine_options()
            .vfs(Arc::new(sim.clone()))
            .index_dir(index.join("index")),
    )
    .unwrap();
    Arc::new(LogStore::from_engine(engine))
}

/// Hands three steps to the sink, then the machine crashes.
struct CrashAfterSteps {
    sim: SimVfs,
    seed: u64,
    committed: Arc<Mutex<Vec<EntryId>>>,
}

impl LoopFactory for CrashAfterSteps {
    fn build(
        &self,
        _d: &AgentDefinition,
        _s: &LoopSettings,
    ) -> Result<Box<dyn AgentLoop>, LoopError> {
        Ok(Box::new(CrashLoop {
            sim: self.sim.clone(),
            seed: self.seed,
            committed: self.committed.clone(),
        }))
    }
}

struct CrashLoop {
    sim: SimVfs,
    seed: u64,
    committed: Arc<Mutex<Vec<EntryId>>>,
}

impl AgentLoop for CrashLoop {
    fn run(&mut self, input: LoopInput<'_>) -> Result<LoopOutput, LoopError> {
        let steps = [
            assistant("calling a tool", StopReason::ToolUse),
            EntryKind::Message {
                message: Message::ToolResult {
                    tool_call_id: "c1".into(),
                    tool_name: "ls".into(),
                    content: vec![ContentBlock::text("a b")],
                    is_error: false,
                },
            },
            assistant("calling another", StopReason::ToolUse),
        ];
        for s in steps {
            let id = input.steps.step(s)?;
            self.committed.lock().unwrap().push(id);
        }
        self.sim.crash(self.seed);
        Err(LoopError::new("the process died"))
    }
}

#[test]
fn a_crash_mid_turn_keeps_the_acknowledged_steps_and_the_next_execute_continues() {
    for seed in 0..4u64 {
        eprintln!("seed {seed}");
        let sim = SimVfs::new();
        let index = tempfile::tempdir().unwrap();
        let committed = Arc::new(Mutex::new(Vec::new()));
        let (id, before_leaf) = {
            let store = sim_store(&sim, index.path());
            let (rt, _) = runtime(store.clone());
            let id = new_session(&rt);
            let ids = history(&rt, &id, 300, 400);
            let f = Arc::new(CrashAfterSteps {
                sim: sim.clone(),
                seed,
                committed: committed.clone(),
            });
            let err = rt
                .execute(&id, &SendMessage::new("do it", f))
                .expect_err("the final commit cannot land after the crash");
            let _ = err;
            (id, ids.last().unwrap().clone())
        };
        let committed = committed.lock().unwrap().clone();
        assert_eq!(committed.len(), 3);

        let after = sim.after_crash();
        let index2 = tempfile::tempdir().unwrap();
        let store = sim_store(&after, index2.path());
        let (rt, sink) = runtime(store.clone());
        // Every acknowledged step is there, in order, under the user's
        // message, which is under the old leaf.
        let full = store.load(&id).unwrap().unwrap();
        let t: &Transcript = &full.state().transcript;
        let path = t.current_path().unwrap();
        let n = path.len();
        let tail: Vec<&EntryId> = path[n - 3..].iter().map(|e| &e.id).collect();
        assert_eq!(tail, committed.iter().collect::<Vec<_>>());
        assert_eq!(text_of(&path[n - 4].kind), "do it");
        assert_eq!(path[n - 5].id, before_leaf);
        assert_eq!(full.state().execution, ExecutionStatus::InProgress);

        // The next execute records the execution as interrupted.
        let s = rt.execute(&id, &WriteMetadata::new("k", json!(1))).unwrap();
        assert_eq!(s.state().execution, ExecutionStatus::Interrupted);
        assert_eq!(s.state().last_error.as_deref(), Some(INTERRUPTED_ERROR));
        assert!(sink
            .take()
            .iter()
            .all(|e| !matches!(e, RuntimeEvent::SessionSaveFailed { .. })));
        // And the session continues cleanly after the last step.
        let echo = Arc::new(ScriptedLoopFactory::echo());
        let s = rt.execute(&id, &SendMessage::new("again", echo)).unwrap();
        assert_eq!(s.state().execution, ExecutionStatus::Completed);
        assert_eq!(s.state().execution_count, 2);
        let full = store.load(&id).unwrap().unwrap();
        let path = full.state().transcript.current_path().unwrap();
        let n = path.len();
        assert_eq!(text_of(&path[n - 2].kind), "again");
        assert_eq!(path[n - 3].id, committed[2]);
        assert_eq!(text_of(&path[n - 1].kind), "echo: again");
    }
}

/// The memory store keeps loading whole (it has no transcript index); the
/// durable steps and the interrupted record work there too.
#[test]
fn the_memory_store_runs_durable_steps_through_full_loads() {
    let (rt, store, _sink) = common::memory_runtime();
    let s = rt.create(common::definition("a"), None).unwrap();
    let f = Arc::new(
        ScriptedLoopFactory::new([ScriptedTurn::ToolRound {
            tool: "ls".into(),
            arguments: json!({}),
            result: "a b".into(),
            reply: "done".into(),
        }])
        .durable(),
    );
    let out = rt.execute(s.id(), &SendMessage::new("list", f)).unwrap();
    assert!(!out.is_bounded());
    assert_eq!(out.version(), 5);
    assert_eq!(out.state().transcript.len(), 4);
    assert_eq!(store.load(s.id()).unwrap().unwrap(), out);
}

// ---- kill -9 mid-turn -----------------------------------------------------

const KILL_ENV_DIR: &str = "SPOOL_EXECUTE_KILL_DIR";
const KILL_ENV_SESSION: &str = "SPOOL_EXECUTE_KILL_SESSION";
const KILL_CHILD: &str = "execute_bounded::execute_kill_child";

/// Hands steps to the sink and prints each acknowledged id, then waits
/// for the parent's kill.
struct AckLoop;

impl LoopFactory for AckLoop {
    fn build(
        &self,
        _d: &AgentDefinition,
        _s: &LoopSettings,
    ) -> Result<Box<dyn AgentLoop>, LoopError> {
        Ok(Box::new(AckLoop))
    }
}

impl AgentLoop for AckLoop {
    fn run(&mut self, input: LoopInput<'_>) -> Result<LoopOutput, LoopError> {
        use std::io::Write;
        for k in 0..3 {
            let id = input
                .steps
                .step(assistant(format!("step {k}"), StopReason::ToolUse))?;
            // Printed only once the step is committed (synced).
            println!("ACK {id}");
            std::io::stdout().flush().ok();
        }
        println!("WAITING");
        std::io::stdout().flush().ok();
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
}

/// Child process of [`a_turn_killed_with_sigkill_keeps_its_acknowledged_steps`]:
/// runs a turn whose loop never returns. Without its variables it does
/// nothing.
#[test]
#[ignore = "child process of a_turn_killed_with_sigkill_keeps_its_acknowledged_steps"]
fn execute_kill_child() {
    let Ok(dir) = std::env::var(KILL_ENV_DIR) else {
        return;
    };
    let id = SessionId::parse(&std::env::var(KILL_ENV_SESSION).expect("session")).unwrap();
    let store = Arc::new(
        LogStore::open(
            &dir,
            LogStoreOptions {
                durability: Durability::Immediate,
                ..LogStoreOptions::default()
            },
        )
        .unwrap(),
    );
    let (rt, _) = runtime(store);
    let _ = rt.execute(&id, &SendMessage::new("go", Arc::new(AckLoop)));
    panic!("the turn's loop never returns");
}

/// A process killed with SIGKILL in the middle of a turn: every step it
/// acknowledged is stored in order under the turn's user message, the
/// execution reads as in progress until the next execute records it as
/// interrupted, and the session continues cleanly.
#[cfg(unix)]
#[test]
fn a_turn_killed_with_sigkill_keeps_its_acknowledged_steps() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let (id, old_leaf) = {
        let store = open_log(dir.path());
        let (rt, _) = runtime(store.clone());
        let id = new_session(&rt);
        let ids = history(&rt, &id, 2000, 200);
        drop(rt);
        Arc::try_unwrap(store).unwrap().close().unwrap();
        (id, ids.last().unwrap().clone())
    };
    let exe = std::env::current_exe().expect("test binary path");
    let mut child = std::process::Command::new(&exe)
        .args([
            "--ignored",
            "--exact",
            KILL_CHILD,
            "--nocapture",
            "--test-threads=1",
        ])
        .env(KILL_ENV_DIR, dir.path())
        .env(KILL_ENV_SESSION, id.as_str())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the child");
    let out = child.stdout.take().unwrap();
    let mut acked = Vec::new();
    let mut seen = Vec::new();
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        seen.push(line.clone());
        // The harness prints the test's name on the first line, unended.
        if let Some(at) = line.find("ACK ") {
            acked.push(EntryId::parse(line[at + 4..].trim()).unwrap());
        }
        if line.ends_with("WAITING") {
            break;
        }
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    assert_eq!(acked.len(), 3, "the child acknowledged its steps: {seen:?}");

    let store = open_log(dir.path());
    let (rt, _) = runtime(store.clone());
    let full = store.load(&id).unwrap().unwrap();
    let path = full.state().transcript.current_path().unwrap();
    let n = path.len();
    let tail: Vec<&EntryId> = path[n - 3..].iter().map(|e| &e.id).collect();
    assert_eq!(tail, acked.iter().collect::<Vec<_>>());
    assert_eq!(text_of(&path[n - 4].kind), "go");
    assert_eq!(path[n - 5].id, old_leaf);
    assert_eq!(full.state().execution, ExecutionStatus::InProgress);

    let echo = Arc::new(ScriptedLoopFactory::echo());
    let s = rt.execute(&id, &SendMessage::new("again", echo)).unwrap();
    assert_eq!(s.state().execution, ExecutionStatus::Completed);
    let full = store.load(&id).unwrap().unwrap();
    let path = full.state().transcript.current_path().unwrap();
    let n = path.len();
    assert_eq!(path[n - 3].id, acked[2]);
    assert_eq!(text_of(&path[n - 2].kind), "again");
    // The interrupted execution is on record in the log.
    assert_eq!(full.state().execution_count, 2);
}

// ---- the settings fold ----------------------------------------------------

/// The settings fold of `store` equals a full load without its
/// transcript (header, definition, every state field but the transcript
/// and its generation, which the transcript index keeps).
fn assert_same_settings(store: &dyn SessionStore, id: &SessionId) {
    let full = store.load(id).unwrap().unwrap();
    let backend = store.transcript_backend().unwrap();
    assert!(backend.has_settings());
    let settings = backend.settings(id).unwrap().unwrap();
    assert_eq!(settings.info(), full.info());
    assert_eq!(settings.definition(), full.definition());
    let mut want = full.state().clone();
    want.transcript = Transcript::new();
    want.generation = 0;
    let mut got = settings.state().clone();
    assert!(got.transcript.is_empty());
    got.generation = 0;
    assert_eq!(got, want);
}

/// Settings folds of `store` checked against full loads across actions,
/// clears, a fork and a purged and created again session.
fn settings_fold_scenario(store: Arc<dyn SessionStore>) {
    let (rt, _sink) = runtime(store.clone());
    let id = new_session(&rt);
    let echo = Arc::new(ScriptedLoopFactory::echo());
    assert_same_settings(&*store, &id);
    // Past the snapshot threshold (64 commits), then a tail after it.
    for k in 0..150u64 {
        match k % 6 {
            0 => rt.execute(&id, &SendMessage::new(format!("m{k}"), echo.clone())),
            1 => rt.execute(&id, &WriteMetadata::new(format!("k{}", k % 7), json!(k))),
            2 => rt.execute(&id, &UpdateTask::add(format!("t{k}"))),
            3 => rt.execute(&id, &ChangeSystemPrompt::new(format!("p{k}"))),
            4 => rt.execute(&id, &SuspendSession),
            _ => rt.execute(&id, &ResumeSession),
        }
        .unwrap();
        if k == 20 || k == 100 {
            rt.execute(&id, &ClearSession).unwrap();
        }
        if k % 37 == 0 {
            assert_same_settings(&*store, &id);
        }
    }
    assert_same_settings(&*store, &id);
    assert_same_settings(&*store, &id);
    // A fork carries its seed transcript in its `created` event.
    let s = rt
        .execute(&id, &SendMessage::new("last", echo.clone()))
        .unwrap();
    let at = s.state().transcript.leaf().unwrap().clone();
    let f = rt.fork(&id, Some(at)).unwrap();
    assert_same_settings(&*store, f.id());
    rt.execute(f.id(), &ChangeModel::new(ModelConfig::new("p", "x")))
        .unwrap();
    assert_same_settings(&*store, f.id());
    // A purged and created again session starts a new incarnation.
    assert!(rt.purge(&id).unwrap());
    let backend = store.transcript_backend().unwrap();
    assert!(backend.settings(&id).unwrap().is_none());
    store
        .create(spool_runtime::session::AgentSession::new_with_id(
            id.clone(),
            common::definition("again"),
            None,
        ))
        .unwrap();
    assert_same_settings(&*store, &id);
}

#[test]
fn the_settings_fold_equals_a_full_load_without_the_transcript() {
    let dir = tempfile::tempdir().unwrap();
    settings_fold_scenario(open_log(dir.path()));
}

/// An action that asks for the whole session gets every entry of every
/// branch, through exactly one full load.
fn whole_session_action(store: Arc<dyn SessionStore>) {
    use spool_runtime::actions::{ActionError, SessionAction};
    struct CountAll(Arc<Mutex<usize>>);
    impl SessionAction for CountAll {
        fn name(&self) -> &str {
            "count_all"
        }
        fn execute(&self, s: &mut AgentSession) -> Result<(), ActionError> {
            *self.0.lock().unwrap() = s.state().transcript.len();
            Ok(())
        }
        fn needs_whole_session(&self) -> bool {
            true
        }
    }
    let (rt, _sink) = runtime(store.clone());
    let id = new_session(&rt);
    history(&rt, &id, 2000, 200);
    let seen = Arc::new(Mutex::new(0));
    let s = rt.execute(&id, &CountAll(seen.clone())).unwrap();
    assert!(!s.is_bounded());
    assert_eq!(*seen.lock().unwrap(), 2000);
    assert_eq!(store.stats().full_loads, 1);
}

#[test]
fn an_action_can_ask_for_the_whole_session() {
    let dir = tempfile::tempdir().unwrap();
    whole_session_action(open_log(dir.path()));
}

// ---- a turn that dies mid-turn, any store ----------------------------------

/// Hands three steps to the sink, then the process dies: the loop unwinds
/// (without the panic hook's report) and nothing after it runs.
struct DieAfterSteps(Arc<Mutex<Vec<EntryId>>>);

impl LoopFactory for DieAfterSteps {
    fn build(
        &self,
        _d: &AgentDefinition,
        _s: &LoopSettings,
    ) -> Result<Box<dyn AgentLoop>, LoopError> {
        Ok(Box::new(DieLoop(self.0.clone())))
    }
}

struct DieLoop(Arc<Mutex<Vec<EntryId>>>);

impl AgentLoop for DieLoop {
    fn run(&mut self, input: LoopInput<'_>) -> Result<LoopOutput, LoopError> {
        let steps = [
            assistant("calling a tool", StopReason::ToolUse),
            EntryKind::Message {
                message: Message::ToolResult {
                    tool_call_id: "c1".into(),
                    tool_name: "ls".into(),
                    content: vec![ContentBlock::text("a b")],
                    is_error: false,
                },
            },
            assistant("calling another", StopReason::ToolUse),
        ];
        for s in steps {
            let id = input.steps.step(s)?;
            self.0.lock().unwrap().push(id);
        }
        std::panic::resume_unwind(Box::new("the process died"))
    }
}

/// A turn whose process dies after three steps, on stores from `open`
/// (each call a new process's view of the same data): the steps are
/// stored in order under the turn's user message, the next execute
/// records the execution as interrupted and the session continues.
fn a_turn_that_dies_keeps_its_steps(open: impl Fn() -> Arc<dyn SessionStore>) {
    let committed = Arc::new(Mutex::new(Vec::new()));
    let (id, before_leaf) = {
        let store = open();
        let (rt, _) = runtime(store.clone());
        let id = new_session(&rt);
        let ids = history(&rt, &id, 300, 400);
        let f = Arc::new(DieAfterSteps(committed.clone()));
        let died = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.execute(&id, &SendMessage::new("do it", f))
        }));
        assert!(died.is_err(), "the turn died");
        assert_eq!(store.stats().full_loads, 0);
        (id, ids.last().unwrap().clone())
    };
    let committed = committed.lock().unwrap().clone();
    assert_eq!(committed.len(), 3);

    let store = open();
    let (rt, sink) = runtime(store.clone());
    let full = store.load(&id).unwrap().unwrap();
    let path = full.state().transcript.current_path().unwrap();
    let n = path.len();
    let tail: Vec<&EntryId> = path[n - 3..].iter().map(|e| &e.id).collect();
    assert_eq!(tail, committed.iter().collect::<Vec<_>>());
    assert_eq!(text_of(&path[n - 4].kind), "do it");
    assert_eq!(path[n - 5].id, before_leaf);
    assert_eq!(full.state().execution, ExecutionStatus::InProgress);

    let loads = store.stats().full_loads;
    let s = rt.execute(&id, &WriteMetadata::new("k", json!(1))).unwrap();
    assert!(s.is_bounded());
    assert_eq!(s.state().execution, ExecutionStatus::Interrupted);
    assert_eq!(s.state().last_error.as_deref(), Some(INTERRUPTED_ERROR));
    assert!(sink
        .take()
        .iter()
        .all(|e| !matches!(e, RuntimeEvent::SessionSaveFailed { .. })));
    let echo = Arc::new(ScriptedLoopFactory::echo());
    let s = rt.execute(&id, &SendMessage::new("again", echo)).unwrap();
    assert_eq!(s.state().execution, ExecutionStatus::Completed);
    assert_eq!(s.state().execution_count, 2);
    assert_eq!(store.stats().full_loads, loads, "both executes bounded");
    let full = store.load(&id).unwrap().unwrap();
    let path = full.state().transcript.current_path().unwrap();
    let n = path.len();
    assert_eq!(text_of(&path[n - 2].kind), "again");
    assert_eq!(path[n - 3].id, committed[2]);
    assert_eq!(text_of(&path[n - 1].kind), "echo: again");
}

#[test]
fn a_turn_that_dies_keeps_its_steps_on_the_log_store() {
    let dir = tempfile::tempdir().unwrap();
    a_turn_that_dies_keeps_its_steps(|| open_log(dir.path()));
}

// ---- the PostgreSQL store -------------------------------------------------

/// The scenarios above on the PostgreSQL store, each on a fresh schema of
/// a throwaway server (skipped loudly when the machine cannot run one,
/// failed under CI: see `postgres_support`).
#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use crate::postgres_support::PgServer;
    use spool_runtime::store::postgres::PostgresStore;

    fn connect(conn: &str) -> Arc<dyn SessionStore> {
        Arc::new(PostgresStore::connect(conn).unwrap_or_else(|e| panic!("connect {conn}: {e}")))
    }

    /// Runs `body` with the server and a fresh schema's connection string.
    fn on_postgres(test: &str, body: impl FnOnce(&PgServer, &str)) {
        let Some(server) = PgServer::start_or_skip(test) else {
            return;
        };
        let conn = server.fresh_schema();
        body(&server, &conn);
        drop(server);
    }

    #[test]
    fn every_builtin_action_executes_without_a_full_load_on_postgres() {
        on_postgres("every_builtin_action_on_postgres", |_, conn| {
            every_builtin_action(connect(conn))
        });
    }

    #[test]
    fn a_whole_fork_is_the_one_documented_full_load_on_postgres() {
        on_postgres("a_whole_fork_on_postgres", |_, conn| {
            a_whole_fork_loads_once(connect(conn))
        });
    }

    #[test]
    fn the_steps_of_a_bounded_turn_chain_under_the_users_message_on_postgres() {
        on_postgres("steps_chain_on_postgres", |_, conn| {
            steps_chain(connect(conn))
        });
    }

    #[test]
    fn the_working_set_of_execute_does_not_grow_with_history_on_postgres() {
        on_postgres("working_set_on_postgres", |server, _| {
            working_set_is_flat(|| connect(&server.fresh_schema()), 1_000, 5_000)
        });
    }

    #[test]
    fn the_settings_fold_equals_a_full_load_without_the_transcript_on_postgres() {
        on_postgres("settings_fold_on_postgres", |_, conn| {
            settings_fold_scenario(connect(conn))
        });
    }

    /// Two stores (two processes) on one database: each one's settings
    /// fold, cached or not, follows the other's commits.
    #[test]
    fn the_settings_fold_follows_another_stores_commits_on_postgres() {
        on_postgres("settings_fold_two_stores_on_postgres", |_, conn| {
            let a = connect(conn);
            let b = connect(conn);
            let (rt_a, _) = runtime(a.clone());
            let (rt_b, _) = runtime(b.clone());
            let id = new_session(&rt_a);
            for k in 0..40u64 {
                let rt = if k % 3 == 0 { &rt_a } else { &rt_b };
                rt.execute(&id, &WriteMetadata::new(format!("k{}", k % 5), json!(k)))
                    .unwrap();
                if k % 4 == 0 {
                    rt.execute(&id, &ChangeSystemPrompt::new(format!("p{k}")))
                        .unwrap();
                }
                assert_same_settings(&*a, &id);
                assert_same_settings(&*b, &id);
            }
            // A purge and a new incarnation by the other store.
            assert!(rt_b.purge(&id).unwrap());
            assert!(a
                .transcript_backend()
                .unwrap()
                .settings(&id)
                .unwrap()
                .is_none());
            b.create(AgentSession::new_with_id(
                id.clone(),
                common::definition("again"),
                None,
            ))
            .unwrap();
            assert_same_settings(&*a, &id);
        });
    }

    #[test]
    fn an_action_can_ask_for_the_whole_session_on_postgres() {
        on_postgres("whole_session_action_on_postgres", |_, conn| {
            whole_session_action(connect(conn))
        });
    }

    #[test]
    fn a_turn_that_dies_keeps_its_steps_on_postgres() {
        on_postgres("a_turn_that_dies_on_postgres", |_, conn| {
            a_turn_that_dies_keeps_its_steps(|| connect(conn))
        });
    }
}
