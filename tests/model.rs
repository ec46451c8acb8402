//! A reference model of session semantics: plain data and plain code.
//!
//! The model re-implements, independently of the runtime, what a sequence
//! of runtime operations must do to a session: versions, the status policy
//! (the table in the runtime's `session::info` docs), metadata, the task
//! list and its bounds, the transcript tree and leaf, executions and usage
//! of the scripted loop, clears, forks, history rewrites, tombstones and
//! purges. It borrows only the runtime's *data* types (ids, entries,
//! tasks, usage) so it can be compared field by field; the one piece of
//! runtime logic it uses is the transcript's context builder, as the oracle
//! for the model context (see [`ModelSession::context`]).
//!
//! Every mutation returns `Err(kind)` with the runtime error kind the real
//! runtime must return (`not_found`, `session_deleted`,
//! `invalid_transition`, `action_failed`, ...) and leaves the model
//! unchanged in that case.

use std::collections::{BTreeMap, HashSet};

use spool_runtime::agent_loop::ScriptedTurn;
use spool_runtime::session::{
    AgentDefinition, AgentSession, AgentState, ExecutionStatus, ModelConfig, SessionId,
    SessionStatus, Task, TaskStatus,
};
use spool_runtime::transcript::{
    ContentBlock, Entry, EntryId, EntryKind, Message, ModelContext, StopReason, Transcript, Usage,
};

/// An error kind the runtime must report (`RuntimeError::kind`).
pub type Kind = &'static str;

/// Task-list bounds, restated from the runtime's documentation.
pub const TASKS_MAX: usize = 64;
pub const TASK_ID_MAX: usize = 128;
pub const TASK_DESCRIPTION_MAX: usize = 4096;
pub const METADATA_KEY_MAX: usize = 256;

/// The documented status policy, restated as a table:
///
/// | from \ to | Active | Suspended | Completed | Failed | Deleted |
/// | Active    | —      | yes       | yes       | yes    | yes     |
/// | Suspended | yes    | —         | yes       | yes    | yes     |
/// | Completed | yes    | no        | —         | no     | yes     |
/// | Failed    | yes    | no        | no        | —      | yes     |
/// | Deleted   | no     | no        | no        | no     | —       |
pub fn policy_allows(from: SessionStatus, to: SessionStatus) -> bool {
    use SessionStatus::*;
    const T: [[bool; 5]; 5] = [
        // to: Active Suspended Completed Failed Deleted
        [true, true, true, true, true],     // from Active
        [true, true, true, true, true],     // from Suspended
        [true, false, true, false, true],   // from Completed
        [true, false, false, true, true],   // from Failed
        [false, false, false, false, true], // from Deleted
    ];
    let ix = |s| match s {
        Active => 0,
        Suspended => 1,
        Completed => 2,
        Failed => 3,
        Deleted => 4,
    };
    T[ix(from)][ix(to)]
}

/// One session as the model sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ModelSession {
    pub id: SessionId,
    pub parent_id: Option<SessionId>,
    pub status: SessionStatus,
    pub version: u64,
    pub agent_name: String,
    pub label: String,
    pub definition: AgentDefinition,
    pub system_prompt: String,
    pub model: ModelConfig,
    pub metadata: BTreeMap<String, spool_runtime::Json>,
    pub tasks: Vec<Task>,
    pub generation: u64,
    pub execution_count: u64,
    pub execution: ExecutionStatus,
    pub last_error: Option<String>,
    pub usage: Usage,
    pub total_usage: Usage,
    pub entries: Vec<Entry>,
    pub leaf: Option<EntryId>,
    /// Removed from the store (`purge`): reads must say `not_found`.
    pub purged: bool,
}

fn add_usage(a: &mut Usage, b: &Usage) {
    a.input_tokens += b.input_tokens;
    a.output_tokens += b.output_tokens;
    a.cache_read_tokens += b.cache_read_tokens;
    a.cache_write_tokens += b.cache_write_tokens;
}

impl ModelSession {
    /// A freshly created root session (version 1), following the factory
    /// rules: a non-empty definition prompt and a non-default definition
    /// model override the seed state's; the label falls back to the name.
    pub fn created(id: SessionId, def: &AgentDefinition, seed: Option<&AgentState>) -> Self {
        let seed = seed.cloned().unwrap_or_default();
        let system_prompt = if def.system_prompt.is_empty() {
            seed.system_prompt.clone()
        } else {
            def.system_prompt.clone()
        };
        let model = if def.model == ModelConfig::default() {
            seed.model.clone()
        } else {
            def.model.clone()
        };
        let label = match &def.label {
            Some(l) if !l.is_empty() => l.clone(),
            _ => def.name.clone(),
        };
        ModelSession {
            id,
            parent_id: None,
            status: SessionStatus::Active,
            version: 1,
            agent_name: def.name.clone(),
            label,
            definition: def.clone(),
            system_prompt,
            model,
            metadata: seed.metadata.clone(),
            tasks: seed.tasks.clone(),
            generation: seed.generation,
            execution_count: seed.execution_count,
            execution: seed.execution,
            last_error: seed.last_error.clone(),
            usage: seed.usage,
            total_usage: seed.total_usage,
            entries: seed.transcript.entries().to_vec(),
            leaf: seed.transcript.leaf().cloned(),
            purged: false,
        }
    }

    pub fn is_deleted(&self) -> bool {
        self.status == SessionStatus::Deleted
    }

    pub fn has_entry(&self, id: &EntryId) -> bool {
        self.entries.iter().any(|e| &e.id == id)
    }

    /// What every action checks first: the session exists and is not a
    /// tombstone.
    pub fn guard(&self) -> Result<(), Kind> {
        if self.purged {
            return Err("not_found");
        }
        if self.is_deleted() {
            return Err("session_deleted");
        }
        Ok(())
    }

    /// A successful save: one version more.
    fn saved(&mut self) {
        self.version += 1;
    }

    /// Status change through the policy (same status: no change).
    pub fn set_status(&mut self, to: SessionStatus) -> Result<(), Kind> {
        self.guard()?;
        if !policy_allows(self.status, to) {
            return Err("invalid_transition");
        }
        self.status = to;
        self.saved();
        Ok(())
    }

    /// `FailSession`: the reason is written first, but a refused transition
    /// fails the whole action.
    pub fn fail(&mut self, reason: Option<&str>) -> Result<(), Kind> {
        self.guard()?;
        if !policy_allows(self.status, SessionStatus::Failed) {
            return Err("invalid_transition");
        }
        if let Some(r) = reason {
            self.metadata.insert(
                "failure_reason".into(),
                serde_json::Value::String(r.into()).into(),
            );
        }
        self.status = SessionStatus::Failed;
        self.saved();
        Ok(())
    }

    pub fn delete(&mut self) -> Result<(), Kind> {
        self.guard()?;
        self.status = SessionStatus::Deleted;
        self.saved();
        Ok(())
    }

    pub fn clear(&mut self) -> Result<(), Kind> {
        self.guard()?;
        self.entries.clear();
        self.leaf = None;
        self.generation += 1;
        self.tasks.clear();
        self.execution = ExecutionStatus::Pending;
        self.last_error = None;
        self.usage = Usage::default();
        self.saved();
        Ok(())
    }

    pub fn set_prompt(&mut self, p: &str) -> Result<(), Kind> {
        self.guard()?;
        self.system_prompt = p.into();
        self.saved();
        Ok(())
    }

    pub fn set_model(&mut self, m: &ModelConfig) -> Result<(), Kind> {
        self.guard()?;
        self.model = m.clone();
        self.saved();
        Ok(())
    }

    pub fn write_metadata(&mut self, key: &str, value: &serde_json::Value) -> Result<(), Kind> {
        self.guard()?;
        if key.is_empty() || key.len() > METADATA_KEY_MAX {
            return Err("action_failed");
        }
        self.metadata.insert(key.into(), value.into());
        self.saved();
        Ok(())
    }

    pub fn remove_metadata(&mut self, key: &str) -> Result<(), Kind> {
        self.guard()?;
        self.metadata.remove(key);
        self.saved();
        Ok(())
    }

    fn tasks_ok(tasks: &[Task]) -> bool {
        let mut ids = HashSet::new();
        tasks.len() <= TASKS_MAX
            && tasks.iter().all(|t| {
                !t.id.is_empty()
                    && t.id.len() <= TASK_ID_MAX
                    && t.description.len() <= TASK_DESCRIPTION_MAX
                    && ids.insert(t.id.clone())
            })
            && tasks
                .iter()
                .filter(|t| t.status == TaskStatus::InProgress)
                .count()
                <= 1
    }

    pub fn replace_tasks(&mut self, tasks: Vec<Task>) -> Result<(), Kind> {
        self.guard()?;
        if !Self::tasks_ok(&tasks) {
            return Err("action_failed");
        }
        self.tasks = tasks;
        self.saved();
        Ok(())
    }

    pub fn upsert_task(&mut self, task: Task) -> Result<(), Kind> {
        self.guard()?;
        let mut tasks = self.tasks.clone();
        match tasks.iter_mut().find(|t| t.id == task.id) {
            Some(t) => *t = task,
            None => tasks.push(task),
        }
        self.replace_tasks(tasks)
    }

    pub fn remove_task(&mut self, id: &str) -> Result<(), Kind> {
        self.guard()?;
        self.tasks.retain(|t| t.id != id);
        self.saved();
        Ok(())
    }

    /// Appends `entry` (parent must exist, id must be new); it becomes the
    /// leaf.
    pub fn append(&mut self, entry: Entry) -> Result<(), Kind> {
        self.guard()?;
        if self.has_entry(&entry.id) {
            return Err("action_failed");
        }
        if let Some(p) = &entry.parent_id {
            if !self.has_entry(p) {
                return Err("action_failed");
            }
        }
        self.leaf = Some(entry.id.clone());
        self.entries.push(entry);
        self.saved();
        Ok(())
    }

    pub fn move_leaf(&mut self, to: Option<EntryId>) -> Result<(), Kind> {
        self.guard()?;
        if let Some(t) = &to {
            if !self.has_entry(t) {
                return Err("action_failed");
            }
        }
        self.leaf = to;
        self.saved();
        Ok(())
    }

    /// A history rewrite: parents precede children, ids unique, the leaf
    /// among the entries; a new generation.
    pub fn rewrite(&mut self, entries: Vec<Entry>, leaf: Option<EntryId>) -> Result<(), Kind> {
        self.guard()?;
        let mut seen = HashSet::new();
        for e in &entries {
            if let Some(p) = &e.parent_id {
                if !seen.contains(p) {
                    return Err("action_failed");
                }
            }
            if !seen.insert(e.id.clone()) {
                return Err("action_failed");
            }
        }
        if let Some(l) = &leaf {
            if !seen.contains(l) {
                return Err("action_failed");
            }
        }
        self.entries = entries;
        self.leaf = leaf;
        self.generation += 1;
        self.saved();
        Ok(())
    }

    /// The entries root → `at`, root first.
    pub fn path_to(&self, at: &EntryId) -> Option<Vec<Entry>> {
        let mut out = Vec::new();
        let mut cur = self.entries.iter().find(|e| &e.id == at)?;
        loop {
            out.push(cur.clone());
            if out.len() > self.entries.len() {
                return None;
            }
            match &cur.parent_id {
                None => break,
                Some(p) => cur = self.entries.iter().find(|e| &e.id == p)?,
            }
        }
        out.reverse();
        Some(out)
    }

    /// The fork of this session (whole, or cut at `at`) with the new id
    /// `id`, version 1; `Err` as the runtime must refuse it.
    pub fn fork(&self, id: SessionId, at: Option<&EntryId>) -> Result<ModelSession, Kind> {
        self.guard()?;
        let mut f = self.clone();
        if let Some(at) = at {
            f.entries = self.path_to(at).ok_or("action_failed")?;
            f.leaf = Some(at.clone());
        }
        f.id = id;
        f.parent_id = Some(self.id.clone());
        f.status = SessionStatus::Active;
        f.version = 1;
        f.execution = ExecutionStatus::Pending;
        f.last_error = None;
        f.usage = Usage::default();
        f.purged = false;
        Ok(f)
    }

    /// `SendMessage` with a scripted turn: the kinds of the entries it must
    /// append (the user message first), with the execution bookkeeping
    /// applied. Entry ids and timestamps are generated by the runtime, so
    /// the caller adopts them from the real result with [`Self::adopt`].
    pub fn send(&mut self, text: &str, turn: &ScriptedTurn) -> Result<Vec<EntryKind>, Kind> {
        self.guard()?;
        if self.status != SessionStatus::Active {
            return Err("action_failed");
        }
        let mut kinds = vec![EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(text)],
            },
        }];
        self.execution_count += 1;
        // The loop sees the transcript with the user message appended.
        let input_tokens = (self.entries.len() as u64 + 1) * 10;
        let usage_for = |s: &str| Usage {
            input_tokens,
            output_tokens: s.len() as u64,
            ..Usage::default()
        };
        let model_name = Some(format!("{}/{}", self.model.provider, self.model.model));
        let assistant =
            |content: Vec<ContentBlock>, stop: StopReason, usage: Usage| EntryKind::Message {
                message: Message::Assistant {
                    content,
                    stop_reason: stop,
                    usage,
                    model: model_name.clone(),
                    error_message: None,
                },
            };
        let (usage, status, error) = match turn {
            ScriptedTurn::Fail(msg) => {
                (Usage::default(), ExecutionStatus::Failed, Some(msg.clone()))
            }
            ScriptedTurn::Echo | ScriptedTurn::Reply(_) => {
                let reply = match turn {
                    ScriptedTurn::Reply(r) => r.clone(),
                    _ => format!("echo: {text}"),
                };
                let u = usage_for(&reply);
                kinds.push(assistant(
                    vec![ContentBlock::text(reply)],
                    StopReason::Stop,
                    u,
                ));
                (u, ExecutionStatus::Completed, None)
            }
            ScriptedTurn::ToolRound {
                tool,
                arguments,
                result,
                reply,
            } => {
                let call_id = format!("call_{}", self.execution_count);
                let u1 = usage_for(tool);
                let u2 = usage_for(reply);
                kinds.push(assistant(
                    vec![ContentBlock::ToolCall {
                        id: call_id.clone(),
                        name: tool.clone(),
                        arguments: arguments.clone().into(),
                        signature: None,
                    }],
                    StopReason::ToolUse,
                    u1,
                ));
                kinds.push(EntryKind::Message {
                    message: Message::ToolResult {
                        tool_call_id: call_id,
                        tool_name: tool.clone(),
                        content: vec![ContentBlock::text(result.clone())],
                        is_error: false,
                    },
                });
                kinds.push(assistant(
                    vec![ContentBlock::text(reply.clone())],
                    StopReason::Stop,
                    u2,
                ));
                let mut total = u1;
                add_usage(&mut total, &u2);
                (total, ExecutionStatus::Completed, None)
            }
        };
        self.execution = status;
        self.usage = usage;
        add_usage(&mut self.total_usage, &usage);
        self.last_error = error;
        self.saved();
        Ok(kinds)
    }

    /// Adopts the entries a `send` appended in the real session: they must
    /// be exactly `kinds`, chained under the previous leaf.
    pub fn adopt(&mut self, real: &AgentSession, kinds: &[EntryKind]) -> Result<(), String> {
        let got = real.state().transcript.entries();
        let n = self.entries.len();
        // A bounded session holds its working set, the new entries last.
        let total = usize::try_from(real.transcript_entries()).unwrap_or(usize::MAX);
        if total != n + kinds.len() || got.len() < kinds.len() {
            return Err(format!(
                "send appended {} entries, the model expects {}",
                total.saturating_sub(n),
                kinds.len()
            ));
        }
        if !real.is_bounded() && got[..n] != self.entries[..] {
            return Err("send changed existing entries".into());
        }
        let mut parent = self.leaf.clone();
        for (e, k) in got[got.len() - kinds.len()..].iter().zip(kinds) {
            if &e.kind != k {
                return Err(format!(
                    "send appended {:?}, the model expects {:?}",
                    e.kind, k
                ));
            }
            if e.parent_id != parent {
                return Err(format!(
                    "entry {} has parent {:?}, expected {:?}",
                    e.id, e.parent_id, parent
                ));
            }
            if self.has_entry(&e.id) {
                return Err(format!("entry id {} reused", e.id));
            }
            parent = Some(e.id.clone());
            self.entries.push(e.clone());
        }
        self.leaf = parent;
        Ok(())
    }

    /// The model context at the leaf, built with the transcript module's
    /// context builder (the oracle for context only).
    pub fn context(&self) -> Result<ModelContext, String> {
        let mut t = Transcript::new();
        t.replace_all(self.entries.clone(), self.leaf.clone());
        t.context().map_err(|e| e.to_string())
    }

    /// Compares a session returned or loaded by the runtime with the model.
    /// Timestamps set by the store (`updated_at_ms`) are not compared here.
    pub fn check(&self, real: &AgentSession) -> Result<(), String> {
        let i = real.info();
        let st = real.state();
        let mut diffs = Vec::new();
        macro_rules! eq {
            ($name:expr, $a:expr, $b:expr) => {
                if $a != $b {
                    diffs.push(format!("{}: runtime {:?}, model {:?}", $name, $a, $b));
                }
            };
        }
        eq!("id", &i.id, &self.id);
        eq!("parent_id", &i.parent_id, &self.parent_id);
        eq!("status", i.status, self.status);
        eq!("version", i.version, self.version);
        eq!("agent_name", &i.agent_name, &self.agent_name);
        eq!("label", &i.label, &self.label);
        eq!("definition", real.definition(), &self.definition);
        eq!("system_prompt", &st.system_prompt, &self.system_prompt);
        eq!("model", &st.model, &self.model);
        eq!("metadata", &st.metadata, &self.metadata);
        eq!("tasks", &st.tasks, &self.tasks);
        eq!("generation", st.generation, self.generation);
        eq!("execution_count", st.execution_count, self.execution_count);
        eq!("execution", st.execution, self.execution);
        eq!("last_error", &st.last_error, &self.last_error);
        eq!("usage", st.usage, self.usage);
        eq!("total_usage", st.total_usage, self.total_usage);
        if real.is_bounded() {
            // An execute's session holds its working set: every entry it
            // holds is the model's, and it counts the model's entries.
            for e in st.transcript.entries() {
                match self.entries.iter().find(|m| m.id == e.id) {
                    Some(m) if m == e => {}
                    other => diffs.push(format!("entry: runtime {e:?}, model {other:?}")),
                }
            }
            eq!(
                "transcript_entries",
                real.transcript_entries(),
                self.entries.len() as u64
            );
        } else {
            eq!("entries", st.transcript.entries(), &self.entries[..]);
        }
        eq!("leaf", st.transcript.leaf(), self.leaf.as_ref());
        if !real.pending_events().is_empty() {
            diffs.push(format!(
                "a stored session has {} pending events",
                real.pending_events().len()
            ));
        }
        if i.updated_at_ms < i.created_at_ms {
            diffs.push(format!(
                "updated_at_ms {} < created_at_ms {}",
                i.updated_at_ms, i.created_at_ms
            ));
        }
        // A bounded session's context is its handle selection's, checked
        // against the full one by the handle tests.
        match (st.transcript.context(), self.context()) {
            _ if real.is_bounded() => {}
            (Ok(a), Ok(b)) if a == b => {}
            (a, b) => diffs.push(format!("context: runtime {a:?}, model {b:?}")),
        }
        if diffs.is_empty() {
            Ok(())
        } else {
            Err(format!("session {}: {}", self.id, diffs.join("; ")))
        }
    }
}

/// Every session the model knows, in creation order (purged ones stay,
/// marked, so reads of them can be checked).
#[derive(Clone, Debug, Default)]
pub struct Model {
    pub sessions: Vec<ModelSession>,
}

impl Model {
    pub fn get(&self, id: &SessionId) -> Option<&ModelSession> {
        self.sessions.iter().find(|s| &s.id == id)
    }

    pub fn get_mut(&mut self, id: &SessionId) -> Option<&mut ModelSession> {
        self.sessions.iter_mut().find(|s| &s.id == id)
    }

    /// The `sel`-th session (modulo the count), if any.
    pub fn pick(&self, sel: usize) -> Option<SessionId> {
        if self.sessions.is_empty() {
            None
        } else {
            Some(self.sessions[sel % self.sessions.len()].id.clone())
        }
    }

    /// Sessions a listing must show (`include_deleted`), sorted by id.
    pub fn listed(&self, include_deleted: bool) -> Vec<&ModelSession> {
        let mut v: Vec<&ModelSession> = self
            .sessions
            .iter()
            .filter(|s| !s.purged && (include_deleted || !s.is_deleted()))
            .collect();
        v.sort_by(|a, b| a.id.cmp(&b.id));
        v
    }
}
