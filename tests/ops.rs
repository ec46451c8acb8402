//! Runtime operations, their generators, and a runner that applies each
//! one to a real [`SessionRuntime`] and to the [`Model`], then checks that
//! they agree — after every step, on any of the three stores.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use proptest::prelude::*;
use serde_json::json;
use spool_engine::Durability;
use spool_runtime::actions::{
    ActionError, ChangeModel, ChangeSystemPrompt, ClearSession, CompleteSession, FailSession,
    RemoveMetadata, ResumeSession, SendMessage, SessionAction, SuspendSession, UpdateTask,
    WriteMetadata,
};
use spool_runtime::agent_loop::{ScriptedLoopFactory, ScriptedTurn};
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::session::{
    AgentDefinition, AgentSession, AgentState, ModelConfig, SessionId, SessionStatus, Task,
    TaskStatus,
};
use spool_runtime::store::log::SNAPSHOT_TAIL_COMMITS;
use spool_runtime::store::{
    FileStore, FileStoreOptions, ListOrder, ListQuery, LogStore, LogStoreOptions, MemoryStore,
    SessionStore, SortDirection, StoreError,
};
use spool_runtime::transcript::{ContentBlock, Entry, EntryId, EntryKind, Message};
use spool_runtime::{RuntimeError, SessionRuntime};

use crate::model::{Kind, Model, ModelSession};

/// Which store a [`Harness`] runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    File,
    Log,
}

impl StoreKind {
    pub const ALL: [StoreKind; 3] = [StoreKind::Memory, StoreKind::File, StoreKind::Log];
}

/// Segment size of the log stores the model tests open: small, so that
/// segments roll often.
pub const TEST_SEGMENT_BYTES: u64 = 64 << 10;

/// A runtime over one store, which it can close and reopen.
pub struct Harness {
    pub kind: StoreKind,
    dir: Option<tempfile::TempDir>,
    memory: Option<Arc<MemoryStore>>,
    runtime: Option<SessionRuntime>,
    pub reopens: u64,
}

/// The log store options of the model tests. Buffered: the model checks
/// semantics, the crash and fault tests check durability.
pub fn log_options() -> LogStoreOptions {
    LogStoreOptions {
        durability: Durability::Buffered,
        segment_bytes_max: Some(TEST_SEGMENT_BYTES),
        ..LogStoreOptions::default()
    }
}

fn runtime_over(store: Arc<dyn SessionStore>) -> SessionRuntime {
    SessionRuntime::new(store, Arc::new(NullSink), SessionHookStack::empty())
}

impl Harness {
    pub fn new(kind: StoreKind) -> Result<Harness, String> {
        let mut h = Harness {
            kind,
            dir: None,
            memory: None,
            runtime: None,
            reopens: 0,
        };
        match kind {
            StoreKind::Memory => h.memory = Some(Arc::new(MemoryStore::new())),
            _ => h.dir = Some(crate::seed::scratch_dir()),
        }
        h.open()?;
        Ok(h)
    }

    fn open(&mut self) -> Result<(), String> {
        let store: Arc<dyn SessionStore> = match self.kind {
            StoreKind::Memory => self.memory.clone().ok_or("no memory store")?,
            StoreKind::File => Arc::new(
                FileStore::open_with(
                    self.dir()?,
                    FileStoreOptions {
                        // Durability is the crash tests' business.
                        fsync: false,
                        ..FileStoreOptions::default()
                    },
                )
                .map_err(|e| e.to_string())?,
            ),
            StoreKind::Log => {
                Arc::new(LogStore::open(self.dir()?, log_options()).map_err(|e| e.to_string())?)
            }
        };
        self.runtime = Some(runtime_over(store));
        Ok(())
    }

    fn dir(&self) -> Result<&Path, String> {
        self.dir
            .as_ref()
            .map(|d| d.path())
            .ok_or_else(|| "no store directory".to_string())
    }

    pub fn rt(&self) -> &SessionRuntime {
        self.runtime
            .as_ref()
            .expect("the harness always holds a runtime")
    }

    /// Closes the store and opens it again; for the log store optionally
    /// deletes `DIR/index/` in between (it must be rebuilt from the log).
    /// The memory store cannot be reopened: it is kept.
    pub fn reopen(&mut self, drop_index: bool) -> Result<(), String> {
        self.runtime = None;
        if self.kind == StoreKind::Log && drop_index {
            let ix = self.dir()?.join(spool_engine::INDEX_DIR);
            std::fs::remove_dir_all(&ix).map_err(|e| format!("remove {}: {e}", ix.display()))?;
            // The checkpoints too: an index found empty would start from the newest.
            let ck = self.dir()?.join(spool_engine::CHECKPOINT_DIR);
            if ck.exists() {
                std::fs::remove_dir_all(&ck)
                    .map_err(|e| format!("remove {}: {e}", ck.display()))?;
            }
        }
        self.reopens += 1;
        self.open()
    }
}

/// Which entry an operation refers to, resolved against the session's
/// transcript when the operation runs (so shrinking keeps it meaningful).
#[derive(Clone, Copy, Debug)]
pub enum Pick {
    None,
    Leaf,
    Entry(usize),
    Unknown,
}

/// One runtime operation. Session selectors are indexes into the sessions
/// created so far (modulo their count).
#[derive(Clone, Debug)]
pub enum Op {
    Create {
        agent: u8,
        seeded: bool,
    },
    Send {
        s: usize,
        text: u8,
        turn: u8,
    },
    Suspend(usize),
    Resume(usize),
    Complete(usize),
    Fail {
        s: usize,
        reason: bool,
    },
    Clear(usize),
    Prompt {
        s: usize,
        p: u8,
    },
    Model {
        s: usize,
        m: u8,
    },
    WriteMeta {
        s: usize,
        key: u8,
        value: u8,
    },
    RemoveMeta {
        s: usize,
        key: u8,
    },
    UpsertTask {
        s: usize,
        id: u8,
        status: u8,
    },
    RemoveTask {
        s: usize,
        id: u8,
    },
    ReplaceTasks {
        s: usize,
        n: u8,
        in_progress: u8,
    },
    Append {
        s: usize,
        parent: Pick,
        dup: bool,
    },
    MoveLeaf {
        s: usize,
        to: Pick,
    },
    Rewrite {
        s: usize,
        keep: u64,
        leaf: Pick,
        reverse: bool,
    },
    Fork {
        s: usize,
        at: Pick,
    },
    Delete(usize),
    Purge(usize),
    /// Save a copy loaded before another save: must be a `Conflict`.
    StaleSave(usize),
    /// Operations on an id that was never created.
    Missing,
    /// Enough saves to one session that the log store writes a snapshot.
    Burst(usize),
    Reopen {
        drop_index: bool,
    },
}

fn pick() -> impl Strategy<Value = Pick> {
    prop_oneof![
        1 => Just(Pick::None),
        2 => Just(Pick::Leaf),
        6 => (0usize..64).prop_map(Pick::Entry),
        1 => Just(Pick::Unknown),
    ]
}

/// The operation generator. `heavy` enables the expensive operations
/// (bursts of saves), which a few cases are enough to cover.
pub fn op_strategy() -> impl Strategy<Value = Op> {
    let s = || 0usize..16;
    prop_oneof![
        4 => (any::<u8>(), any::<bool>()).prop_map(|(agent, seeded)| Op::Create { agent, seeded }),
        8 => (s(), any::<u8>(), 0u8..8).prop_map(|(s, text, turn)| Op::Send { s, text, turn }),
        2 => s().prop_map(Op::Suspend),
        2 => s().prop_map(Op::Resume),
        2 => s().prop_map(Op::Complete),
        2 => (s(), any::<bool>()).prop_map(|(s, reason)| Op::Fail { s, reason }),
        1 => s().prop_map(Op::Clear),
        1 => (s(), 0u8..3).prop_map(|(s, p)| Op::Prompt { s, p }),
        1 => (s(), 0u8..3).prop_map(|(s, m)| Op::Model { s, m }),
        3 => (s(), any::<u8>(), any::<u8>()).prop_map(|(s, key, value)| Op::WriteMeta { s, key, value }),
        1 => (s(), any::<u8>()).prop_map(|(s, key)| Op::RemoveMeta { s, key }),
        2 => (s(), 0u8..6, 0u8..4).prop_map(|(s, id, status)| Op::UpsertTask { s, id, status }),
        1 => (s(), 0u8..6).prop_map(|(s, id)| Op::RemoveTask { s, id }),
        1 => (s(), 0u8..70, 0u8..3).prop_map(|(s, n, in_progress)| Op::ReplaceTasks { s, n, in_progress }),
        6 => (s(), pick(), prop::bool::weighted(0.1)).prop_map(|(s, parent, dup)| Op::Append { s, parent, dup }),
        3 => (s(), pick()).prop_map(|(s, to)| Op::MoveLeaf { s, to }),
        2 => (s(), any::<u64>(), pick(), prop::bool::weighted(0.2)).prop_map(|(s, keep, leaf, reverse)| Op::Rewrite { s, keep, leaf, reverse }),
        3 => (s(), pick()).prop_map(|(s, at)| Op::Fork { s, at }),
        1 => s().prop_map(Op::Delete),
        1 => s().prop_map(Op::Purge),
        2 => s().prop_map(Op::StaleSave),
        1 => Just(Op::Missing),
        2 => any::<bool>().prop_map(|drop_index| Op::Reopen { drop_index }),
    ]
}

/// A sequence of operations; starts with a create so most cases have a
/// session to work on. With `burst`, one snapshot-sized burst is mixed in.
pub fn ops_strategy(max_len: usize, burst: bool) -> impl Strategy<Value = Vec<Op>> {
    (
        prop::collection::vec(op_strategy(), 1..max_len),
        any::<u8>(),
        0usize..16,
        any::<bool>(),
    )
        .prop_map(move |(mut ops, agent, at, s)| {
            ops.insert(0, Op::Create { agent, seeded: s });
            if burst {
                let at = at % ops.len() + 1;
                ops.insert(at.min(ops.len()), Op::Burst(at));
            }
            ops
        })
}

/// An action made from a closure (appends, leaf moves and rewrites with
/// entry ids the test chooses).
pub struct FnAction<F>(pub &'static str, pub F);

impl<F> SessionAction for FnAction<F>
where
    F: Fn(&mut AgentSession) -> Result<(), ActionError> + Send + Sync,
{
    fn name(&self) -> &str {
        self.0
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        (self.1)(session)
    }
}

/// The definitions sessions are created from: one with a prompt and a
/// model, one relying on the seed state with an explicit label, one with
/// an empty label (falls back to the name).
pub fn definition(agent: u8) -> AgentDefinition {
    match agent % 3 {
        0 => AgentDefinition::new("alpha", "first agent", "You are alpha.")
            .with_model(ModelConfig::new("scripted", "a1")),
        1 => AgentDefinition::new("beta", "second agent", "").with_label("Beta sessions"),
        _ => AgentDefinition::new("gamma", "third agent", "Gamma prompt")
            .with_label("")
            .with_model(ModelConfig::new("scripted", "g").with_param("temperature", json!(0.25))),
    }
}

pub fn seed_state(n: u64) -> AgentState {
    let mut st = AgentState::new()
        .with_system_prompt("seed prompt")
        .with_model(ModelConfig::new("seeded", "m0"))
        .with_metadata("seeded", json!({ "n": n, "ok": true }));
    st.tasks = vec![Task::new("t-seed", "from the seed", TaskStatus::InProgress)];
    st
}

/// A metadata value of varied JSON shape (integers at the extremes,
/// negative numbers, fractions, strings, nesting).
pub fn value(v: u8) -> serde_json::Value {
    match v % 7 {
        0 => serde_json::Value::Null,
        1 => json!(u64::MAX - u64::from(v)),
        2 => json!(-i64::from(v) - 1),
        3 => json!(f64::from(v) + 0.5),
        4 => json!(format!("text {v} \u{e9}\u{1F600}\n\"quoted\"")),
        5 => json!({ "a": [v, "x", true, null], "b": { "c": -1.25 } }),
        _ => json!(i64::MIN + i64::from(v)),
    }
}

fn meta_key(k: u8) -> String {
    match k {
        // Invalid keys: empty, and one byte over the limit.
        250 => String::new(),
        251 => "k".repeat(crate::model::METADATA_KEY_MAX + 1),
        _ => format!("key{}", k % 5),
    }
}

fn turn(t: u8, text: u8) -> ScriptedTurn {
    match t {
        0..=2 => ScriptedTurn::Echo,
        3 | 4 => ScriptedTurn::Reply(format!("reply {text}")),
        5 | 6 => ScriptedTurn::ToolRound {
            tool: "search".into(),
            arguments: json!({ "q": text, "deep": { "x": [1, 2] } }),
            result: format!("found {text}"),
            reply: "done".into(),
        },
        _ => ScriptedTurn::Fail(format!("model unavailable {text}")),
    }
}

fn task_status(s: u8) -> TaskStatus {
    match s % 4 {
        0 => TaskStatus::Pending,
        1 => TaskStatus::InProgress,
        2 => TaskStatus::Completed,
        _ => TaskStatus::Cancelled,
    }
}

/// Counters of a run.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunStats {
    /// Runtime operations applied and compared with the model.
    pub ops: u64,
    /// Full model comparisons (every session, header and listing).
    pub checks: u64,
}

/// Applies operations to a harness and the model, checking after each.
pub struct Runner {
    pub h: Harness,
    pub model: Model,
    next: u64,
    pub stats: RunStats,
}

fn outcome<T>(r: &Result<T, RuntimeError>) -> String {
    match r {
        Ok(_) => "Ok".into(),
        Err(e) => format!("Err({}: {e})", e.kind()),
    }
}

impl Runner {
    pub fn new(kind: StoreKind) -> Result<Runner, String> {
        Ok(Runner {
            h: Harness::new(kind)?,
            model: Model::default(),
            next: 0,
            stats: RunStats::default(),
        })
    }

    fn rt(&self) -> &SessionRuntime {
        self.h.rt()
    }

    fn fresh(&mut self) -> u64 {
        self.next += 1;
        self.next
    }

    /// Applies `op`, then checks everything against the model.
    pub fn step(&mut self, op: &Op) -> Result<(), String> {
        self.apply(op)?;
        self.check_all()
    }

    /// Runs `action` on session `id` in the runtime, and `f` on a copy of
    /// the model session; they must agree on the outcome and the result.
    fn exec(
        &mut self,
        id: &SessionId,
        action: &dyn SessionAction,
        f: impl FnOnce(&mut ModelSession) -> Result<(), Kind>,
    ) -> Result<(), String> {
        let mut expected = self.model.get(id).ok_or("unknown session")?.clone();
        let want = f(&mut expected);
        let got = self.rt().execute(id, action);
        self.stats.ops += 1;
        match (want, got) {
            (Ok(()), Ok(s)) => {
                expected.check(&s)?;
                *self.model.get_mut(id).ok_or("unknown session")? = expected;
                Ok(())
            }
            (Err(k), Err(e)) if e.kind() == k => Ok(()),
            (want, got) => Err(format!(
                "{}: runtime {}, model {want:?}",
                action.name(),
                outcome(&got)
            )),
        }
    }

    fn resolve(m: &ModelSession, p: Pick) -> Option<EntryId> {
        match p {
            Pick::None => None,
            Pick::Leaf => m.leaf.clone(),
            Pick::Entry(i) if !m.entries.is_empty() => {
                Some(m.entries[i % m.entries.len()].id.clone())
            }
            Pick::Entry(_) => None,
            Pick::Unknown => Some(EntryId::parse("no-such-entry").expect("valid id")),
        }
    }

    pub fn apply(&mut self, op: &Op) -> Result<(), String> {
        let sel = |s: &usize, model: &Model| model.pick(*s);
        match op {
            Op::Create { agent, seeded } => {
                let def = definition(*agent);
                let seed = seeded.then(|| seed_state(u64::from(*agent)));
                let s = self
                    .rt()
                    .create(def.clone(), seed.clone())
                    .map_err(|e| format!("create: {e}"))?;
                self.stats.ops += 1;
                let m = ModelSession::created(s.id().clone(), &def, seed.as_ref());
                m.check(&s)?;
                self.model.sessions.push(m);
            }
            Op::Send { s, text, turn: t } => {
                let Some(id) = sel(s, &self.model) else {
                    return Ok(());
                };
                let text = format!("message {text}");
                let tn = turn(*t, self.next as u8);
                let factory = Arc::new(ScriptedLoopFactory::new([tn.clone()]));
                let action = SendMessage::new(text.clone(), factory);
                let mut expected = self.model.get(&id).ok_or("unknown session")?.clone();
                let want = expected.send(&text, &tn);
                let got = self.rt().execute(&id, &action);
                self.stats.ops += 1;
                match (want, got) {
                    (Ok(kinds), Ok(real)) => {
                        expected.adopt(&real, &kinds)?;
                        expected.check(&real)?;
                        *self.model.get_mut(&id).ok_or("unknown session")? = expected;
                    }
                    (Err(k), Err(e)) if e.kind() == k => {}
                    (want, got) => {
                        return Err(format!(
                            "send_message: runtime {}, model {:?}",
                            outcome(&got),
                            want.map(|_| ())
                        ))
                    }
                }
            }
            Op::Suspend(s) => {
                if let Some(id) = sel(s, &self.model) {
                    self.exec(&id, &SuspendSession, |m| {
                        m.set_status(SessionStatus::Suspended)
                    })?;
                }
            }
            Op::Resume(s) => {
                if let Some(id) = sel(s, &self.model) {
                    self.exec(&id, &ResumeSession, |m| m.set_status(SessionStatus::Active))?;
                }
            }
            Op::Complete(s) => {
                if let Some(id) = sel(s, &self.model) {
                    self.exec(&id, &CompleteSession, |m| {
                        m.set_status(SessionStatus::Completed)
                    })?;
                }
            }
            Op::Fail { s, reason } => {
                if let Some(id) = sel(s, &self.model) {
                    let r = reason.then(|| "gave up".to_string());
                    let action = FailSession { reason: r.clone() };
                    self.exec(&id, &action, |m| m.fail(r.as_deref()))?;
                }
            }
            Op::Clear(s) => {
                if let Some(id) = sel(s, &self.model) {
                    self.exec(&id, &ClearSession, |m| m.clear())?;
                }
            }
            Op::Prompt { s, p } => {
                if let Some(id) = sel(s, &self.model) {
                    let prompt = format!("prompt {p}");
                    self.exec(&id, &ChangeSystemPrompt::new(prompt.clone()), |m| {
                        m.set_prompt(&prompt)
                    })?;
                }
            }
            Op::Model { s, m: n } => {
                if let Some(id) = sel(s, &self.model) {
                    let mc = ModelConfig::new("scripted", format!("m{n}"));
                    self.exec(&id, &ChangeModel::new(mc.clone()), |m| m.set_model(&mc))?;
                }
            }
            Op::WriteMeta { s, key, value: v } => {
                if let Some(id) = sel(s, &self.model) {
                    let k = meta_key(*key);
                    let val = value(*v);
                    self.exec(&id, &WriteMetadata::new(k.clone(), val.clone()), |m| {
                        m.write_metadata(&k, &val)
                    })?;
                }
            }
            Op::RemoveMeta { s, key } => {
                if let Some(id) = sel(s, &self.model) {
                    let k = meta_key(*key);
                    self.exec(&id, &RemoveMetadata::new(k.clone()), |m| {
                        m.remove_metadata(&k)
                    })?;
                }
            }
            Op::UpsertTask { s, id: t, status } => {
                if let Some(id) = sel(s, &self.model) {
                    let task =
                        Task::new(format!("t{t}"), format!("task {t}"), task_status(*status));
                    self.exec(&id, &UpdateTask::Upsert(task.clone()), |m| {
                        m.upsert_task(task)
                    })?;
                }
            }
            Op::RemoveTask { s, id: t } => {
                if let Some(id) = sel(s, &self.model) {
                    let tid = format!("t{t}");
                    self.exec(&id, &UpdateTask::Remove(tid.clone()), |m| {
                        m.remove_task(&tid)
                    })?;
                }
            }
            Op::ReplaceTasks { s, n, in_progress } => {
                if let Some(id) = sel(s, &self.model) {
                    let tasks: Vec<Task> = (0..*n)
                        .map(|i| {
                            let st = if i < *in_progress {
                                TaskStatus::InProgress
                            } else {
                                TaskStatus::Pending
                            };
                            Task::new(format!("r{i}"), "x".repeat(usize::from(i)), st)
                        })
                        .collect();
                    self.exec(&id, &UpdateTask::Replace(tasks.clone()), |m| {
                        m.replace_tasks(tasks)
                    })?;
                }
            }
            Op::Append { s, parent, dup } => {
                if let Some(id) = sel(s, &self.model) {
                    let n = self.fresh();
                    let m = self.model.get(&id).ok_or("unknown session")?;
                    let parent_id = match parent {
                        Pick::Leaf => m.leaf.clone(),
                        p => Self::resolve(m, *p),
                    };
                    let eid = match (dup, m.entries.first()) {
                        (true, Some(e)) => e.id.clone(),
                        _ => EntryId::parse(&format!("e{n}")).map_err(|e| e.to_string())?,
                    };
                    let kind = match n % 4 {
                        0 => EntryKind::Custom {
                            custom_type: "note".into(),
                            data: value(n as u8).into(),
                        },
                        1 => EntryKind::Message {
                            message: Message::User {
                                content: vec![ContentBlock::text(format!("typed {n}"))],
                            },
                        },
                        2 => EntryKind::Label {
                            target_id: parent_id
                                .clone()
                                .unwrap_or_else(|| EntryId::parse("e0").expect("valid id")),
                            label: Some(format!("label {n}")),
                        },
                        _ => EntryKind::ModelChange {
                            provider: "p".into(),
                            model_id: format!("m{n}"),
                        },
                    };
                    let entry = Entry {
                        id: eid,
                        parent_id,
                        timestamp_ms: 1_700_000_000_000 + n as i64,
                        kind,
                    };
                    let e2 = entry.clone();
                    let action = FnAction("append_entry", move |s: &mut AgentSession| {
                        s.append_entry(e2.clone()).map_err(ActionError::from)
                    });
                    self.exec(&id, &action, |m| m.append(entry))?;
                }
            }
            Op::MoveLeaf { s, to } => {
                if let Some(id) = sel(s, &self.model) {
                    let m = self.model.get(&id).ok_or("unknown session")?;
                    let target = Self::resolve(m, *to);
                    let t2 = target.clone();
                    let action = FnAction("move_leaf", move |s: &mut AgentSession| {
                        s.move_leaf(t2.clone()).map_err(ActionError::from)
                    });
                    self.exec(&id, &action, |m| m.move_leaf(target))?;
                }
            }
            Op::Rewrite {
                s,
                keep,
                leaf,
                reverse,
            } => {
                if let Some(id) = sel(s, &self.model) {
                    let m = self.model.get(&id).ok_or("unknown session")?;
                    let mut kept: Vec<Entry> = Vec::new();
                    for (i, e) in m.entries.iter().enumerate() {
                        let parent_kept = match &e.parent_id {
                            None => true,
                            Some(p) => kept.iter().any(|k| &k.id == p),
                        };
                        if parent_kept && (keep >> (i % 64)) & 1 == 1 {
                            kept.push(e.clone());
                        }
                    }
                    let new_leaf = match leaf {
                        Pick::Entry(i) if !kept.is_empty() => Some(kept[i % kept.len()].id.clone()),
                        Pick::Leaf => m.leaf.clone(),
                        Pick::Unknown => Self::resolve(m, Pick::Unknown),
                        _ => None,
                    };
                    if *reverse {
                        kept.reverse();
                    }
                    let (e2, l2) = (kept.clone(), new_leaf.clone());
                    let action = FnAction("rewrite_history", move |s: &mut AgentSession| {
                        s.rewrite_history(e2.clone(), l2.clone())
                            .map(|_| ())
                            .map_err(ActionError::from)
                    });
                    self.exec(&id, &action, |m| m.rewrite(kept, new_leaf))?;
                }
            }
            Op::Fork { s, at } => {
                if let Some(id) = sel(s, &self.model) {
                    let src = self.model.get(&id).ok_or("unknown session")?.clone();
                    let at = match at {
                        Pick::Leaf => src.leaf.clone(),
                        p => Self::resolve(&src, *p),
                    };
                    let got = self.rt().fork(&id, at.clone());
                    self.stats.ops += 1;
                    match got {
                        Ok(f) => {
                            let m = src
                                .fork(f.id().clone(), at.as_ref())
                                .map_err(|k| format!("fork: runtime Ok, model {k}"))?;
                            m.check(&f)?;
                            self.model.sessions.push(m);
                        }
                        Err(e) => {
                            let dummy = SessionId::generate();
                            match src.fork(dummy, at.as_ref()) {
                                Err(k) if k == e.kind() => {}
                                want => {
                                    return Err(format!(
                                        "fork: runtime Err({}: {e}), model {:?}",
                                        e.kind(),
                                        want.map(|_| ())
                                    ))
                                }
                            }
                        }
                    }
                }
            }
            Op::Delete(s) => {
                if let Some(id) = sel(s, &self.model) {
                    let mut expected = self.model.get(&id).ok_or("unknown session")?.clone();
                    let want = expected.delete();
                    let got = self.rt().delete(&id);
                    self.stats.ops += 1;
                    match (want, got) {
                        (Ok(()), Ok(real)) => {
                            expected.check(&real)?;
                            *self.model.get_mut(&id).ok_or("unknown session")? = expected;
                        }
                        (Err(k), Err(e)) if e.kind() == k => {}
                        (want, got) => {
                            return Err(format!(
                                "delete: runtime {}, model {want:?}",
                                outcome(&got)
                            ))
                        }
                    }
                }
            }
            Op::Purge(s) => {
                if let Some(id) = sel(s, &self.model) {
                    let existed = self.rt().purge(&id).map_err(|e| format!("purge: {e}"))?;
                    self.stats.ops += 1;
                    let m = self.model.get_mut(&id).ok_or("unknown session")?;
                    if existed == m.purged {
                        return Err(format!(
                            "purge returned {existed}, the model says purged={}",
                            m.purged
                        ));
                    }
                    m.purged = true;
                }
            }
            Op::StaleSave(s) => {
                let Some(id) = sel(s, &self.model) else {
                    return Ok(());
                };
                let m = self.model.get(&id).ok_or("unknown session")?;
                if m.guard().is_err() {
                    return Ok(());
                }
                let v = m.version;
                let store = self.rt().store().clone();
                let mut stale = store
                    .load(&id)
                    .map_err(|e| format!("load: {e}"))?
                    .ok_or("stale save: session missing")?;
                let n = self.fresh();
                let val = json!(n);
                self.exec(&id, &WriteMetadata::new("fresh", val.clone()), |m| {
                    m.write_metadata("fresh", &val)
                })?;
                stale
                    .write_metadata("stale", json!(true))
                    .map_err(|e| e.to_string())?;
                self.stats.ops += 1;
                match store.save(stale) {
                    Err(StoreError::Conflict {
                        expected, actual, ..
                    }) if expected == v && actual == v + 1 => {}
                    other => {
                        return Err(format!(
                            "stale save of v{v} after v{}: expected Conflict, got {other:?}",
                            v + 1
                        ))
                    }
                }
            }
            Op::Missing => {
                let id = SessionId::generate();
                self.stats.ops += 4;
                let e = self.rt().execute(&id, &SuspendSession);
                if !matches!(&e, Err(e) if e.is_not_found()) {
                    return Err(format!("execute on a missing id: {}", outcome(&e)));
                }
                let e = self.rt().session_info(&id);
                if !matches!(&e, Err(e) if e.is_not_found()) {
                    return Err(format!("session_info of a missing id: {}", outcome(&e)));
                }
                let e = self.rt().fork(&id, None);
                if !matches!(&e, Err(e) if e.is_not_found()) {
                    return Err(format!("fork of a missing id: {}", outcome(&e)));
                }
                match self.rt().purge(&id) {
                    Ok(false) => {}
                    other => return Err(format!("purge of a missing id: {other:?}")),
                }
            }
            Op::Burst(s) => {
                if let Some(id) = sel(s, &self.model) {
                    for i in 0..SNAPSHOT_TAIL_COMMITS + 2 {
                        let val = json!(i);
                        let before = self.model.get(&id).map(|m| m.version);
                        self.exec(&id, &WriteMetadata::new("burst", val.clone()), |m| {
                            m.write_metadata("burst", &val)
                        })?;
                        if self.model.get(&id).map(|m| m.version) == before {
                            break; // refused (deleted or purged): the rest would be too
                        }
                        // Load now and then: loads are what write snapshots.
                        if i % 16 == 15 {
                            self.check_all()?;
                        }
                    }
                }
            }
            Op::Reopen { drop_index } => {
                self.h.reopen(*drop_index)?;
                self.stats.ops += 1;
            }
        }
        Ok(())
    }

    /// Every session loads as the model says (or is `not_found`), its
    /// header equals its loaded info, and listings (all, by status, by
    /// parent, paged) agree with the model.
    pub fn check_all(&mut self) -> Result<(), String> {
        self.stats.checks += 1;
        let rt = self.h.rt();
        for m in &self.model.sessions {
            let got = rt.get_session(&m.id);
            let info = rt.session_info(&m.id);
            if m.purged {
                if !matches!(&got, Err(e) if e.is_not_found())
                    || !matches!(&info, Err(e) if e.is_not_found())
                {
                    return Err(format!(
                        "purged session {}: get {}, info {}",
                        m.id,
                        outcome(&got),
                        outcome(&info)
                    ));
                }
                continue;
            }
            let s = got.map_err(|e| format!("get_session {}: {e}", m.id))?;
            m.check(&s)?;
            let h = info.map_err(|e| format!("session_info {}: {e}", m.id))?;
            if &h != s.info() {
                return Err(format!(
                    "header of {} differs from the loaded session:\nheader {h:?}\nloaded {:?}",
                    m.id,
                    s.info()
                ));
            }
        }
        let by_id = ListQuery::all()
            .including_deleted()
            .order_by(ListOrder::Id, SortDirection::Ascending);
        let all = rt.list_sessions(&by_id).map_err(|e| e.to_string())?;
        let want = self.model.listed(true);
        let got: Vec<(&SessionId, u64, SessionStatus)> = all
            .headers
            .iter()
            .map(|h| (&h.id, h.version, h.status))
            .collect();
        let exp: Vec<(&SessionId, u64, SessionStatus)> =
            want.iter().map(|m| (&m.id, m.version, m.status)).collect();
        if got != exp || all.total != exp.len() as u64 || !all.skipped.is_empty() {
            return Err(format!(
                "listing: runtime {got:?} (total {}, skipped {:?}), model {exp:?}",
                all.total, all.skipped
            ));
        }
        let ids = |l: &spool_runtime::SessionInfoList| -> BTreeSet<SessionId> {
            l.headers.iter().map(|h| h.id.clone()).collect()
        };
        let live = rt
            .list_sessions(&ListQuery::all())
            .map_err(|e| e.to_string())?;
        let want_live: BTreeSet<SessionId> = self
            .model
            .listed(false)
            .iter()
            .map(|m| m.id.clone())
            .collect();
        if ids(&live) != want_live {
            return Err(format!(
                "listing without deleted: runtime {:?}, model {want_live:?}",
                ids(&live)
            ));
        }
        let status = SessionStatus::ALL[(self.stats.checks % 5) as usize];
        let by_status = rt
            .list_sessions(&ListQuery::all().with_status(status))
            .map_err(|e| e.to_string())?;
        let want_status: BTreeSet<SessionId> = want
            .iter()
            .filter(|m| m.status == status)
            .map(|m| m.id.clone())
            .collect();
        if ids(&by_status) != want_status {
            return Err(format!(
                "listing status {status}: runtime {:?}, model {want_status:?}",
                ids(&by_status)
            ));
        }
        let parents: BTreeSet<&SessionId> =
            want.iter().filter_map(|m| m.parent_id.as_ref()).collect();
        for p in parents {
            let kids = rt
                .list_sessions(&ListQuery::all().children_of(p.clone()).including_deleted())
                .map_err(|e| e.to_string())?;
            let want_kids: BTreeSet<SessionId> = want
                .iter()
                .filter(|m| m.parent_id.as_ref() == Some(p))
                .map(|m| m.id.clone())
                .collect();
            if ids(&kids) != want_kids {
                return Err(format!(
                    "children of {p}: runtime {:?}, model {want_kids:?}",
                    ids(&kids)
                ));
            }
        }
        // Paging with cursors (default order: most recently updated first)
        // must give the unpaged listing, in order, without repeats.
        let full = rt
            .list_sessions(&ListQuery::all().including_deleted())
            .map_err(|e| e.to_string())?;
        let mut paged = Vec::new();
        let mut q = ListQuery::all().including_deleted().limit(2);
        loop {
            let page = rt.list_sessions(&q).map_err(|e| e.to_string())?;
            paged.extend(page.headers.iter().map(|h| h.id.clone()));
            match page.next_cursor {
                Some(c) if paged.len() <= full.headers.len() => q = q.clone().after(c),
                _ => break,
            }
        }
        if paged != full.ids() {
            return Err(format!(
                "paged listing {paged:?} != unpaged {:?}",
                full.ids()
            ));
        }
        Ok(())
    }
}
