//! The agent loop seam: [`AgentLoop`], [`LoopFactory`], and the
//! deterministic [`ScriptedLoop`].
//!
//! `SendMessage` appends the user message, then asks a [`LoopFactory`] for
//! a loop built from the session's definition *and current state* (so the
//! state's model — changed by `ChangeModel` — is what the loop uses), runs
//! it once, and appends the entries it returns. A loop error (or a build
//! error) ends the execution as `Failed` with the error recorded; the
//! session stays usable.

use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex};

use crate::session::{
    AgentDefinition, AgentState, ExecutionStatus, HistoryReader, ModelConfig, SessionId, Task,
};
use crate::transcript::{
    ContentBlock, ContextMessage, ContextRole, EntryId, EntryKind, Message, ModelContext,
    StopReason, Usage,
};

/// The session settings a loop is built and run with (everything of the
/// state but the transcript and the usage counters).
#[derive(Clone, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct LoopSettings {
    pub system_prompt: String,
    /// The model the loop should use (`ChangeModel` changes it).
    pub model: ModelConfig,
    pub metadata: BTreeMap<String, crate::transcript::Json>,
    pub tasks: Vec<Task>,
    /// The 1-based number of this execution in the session.
    pub execution: u64,
}

impl LoopSettings {
    /// The settings of `state` (for its current or next execution).
    pub fn of(state: &AgentState) -> Self {
        LoopSettings {
            system_prompt: state.system_prompt.clone(),
            model: state.model.clone(),
            metadata: state.metadata.clone(),
            tasks: state.tasks.clone(),
            execution: state.execution_count,
        }
    }
}

/// Where a loop hands the entries it produces, as it produces them. Each
/// call commits what it is given (with the turn's events not yet stored,
/// the user's message first) as one commit under the session's version
/// fence before it returns: an entry whose id came back is durable, and
/// survives a crash of the process later in the turn. Several entries
/// produced together go in one call ([`StepSink::steps`]), one commit.
///
/// A failed commit (another writer moved the session: a conflict; or a
/// store fault) is returned as a [`LoopError`]; the loop should stop and
/// return it, and the execute then reports the store's error. Outside the
/// runtime (an action run on a session by hand) the entries are only
/// appended, and committed with the rest of the action.
pub trait StepSink {
    /// Appends one entry under the current leaf and commits it.
    fn step(&mut self, entry: EntryKind) -> Result<EntryId, LoopError> {
        let mut ids = self.steps(vec![entry])?;
        ids.pop()
            .ok_or_else(|| LoopError::new("the step sink returned no id"))
    }
    /// Appends entries in order (each under the one before) and commits
    /// them together.
    fn steps(&mut self, entries: Vec<EntryKind>) -> Result<Vec<EntryId>, LoopError>;
}

/// What a loop sees for one execution: the model context (built from the
/// session's working set with the same builder as `spool context`:
/// compaction, branch summaries, tool pairing; it ends with the user's new
/// message), the definition and settings, a reader of older entries, and
/// the sink its steps go to.
pub struct LoopInput<'a> {
    pub session_id: &'a SessionId,
    pub definition: &'a AgentDefinition,
    pub settings: &'a LoopSettings,
    pub context: &'a ModelContext,
    /// Whether `context` holds every message of the context (`false`: the
    /// resident budget left older ones out; read them through `history`).
    pub context_complete: bool,
    /// Entries in the session's transcript (its current generation, every
    /// branch, the new message included), resident or not.
    pub transcript_entries: u64,
    /// Older entries, on demand (see [`HistoryReader::older`]).
    pub history: &'a HistoryReader,
    /// Where produced entries go as they are produced (durable steps).
    pub steps: &'a mut dyn StepSink,
}

impl std::fmt::Debug for LoopInput<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoopInput")
            .field("session_id", &self.session_id)
            .field("definition", &self.definition)
            .field("settings", &self.settings)
            .field("context", &self.context)
            .field("context_complete", &self.context_complete)
            .field("transcript_entries", &self.transcript_entries)
            .finish_non_exhaustive()
    }
}

/// What a loop produced beyond the steps it handed to [`StepSink`]: more
/// transcript entries in order (assistant messages, tool calls, tool
/// results, ...), appended after the steps in the execute's final commit,
/// the execution's usage, and how it ended (`Completed` or `Stopped`; any
/// other status is recorded as `Completed`).
#[derive(Clone, Debug, PartialEq)]
pub struct LoopOutput {
    pub entries: Vec<EntryKind>,
    pub usage: Usage,
    pub status: ExecutionStatus,
}

impl LoopOutput {
    /// A completed execution whose entries all went to the step sink.
    pub fn completed(usage: Usage) -> Self {
        LoopOutput {
            entries: Vec::new(),
            usage,
            status: ExecutionStatus::Completed,
        }
    }
}

/// An assistant text reply (stop reason `Stop`) from `model`, as a loop
/// hands it to the step sink or returns it.
pub fn assistant_message(text: impl Into<String>, model: &ModelConfig, usage: Usage) -> EntryKind {
    EntryKind::Message {
        message: Message::Assistant {
            content: vec![ContentBlock::text(text)],
            stop_reason: StopReason::Stop,
            usage,
            model: Some(model.qualified_name()),
            error_message: None,
        },
    }
}

/// An agent loop failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
#[non_exhaustive]
pub struct LoopError {
    pub message: String,
}

impl LoopError {
    pub fn new(message: impl Into<String>) -> Self {
        LoopError {
            message: message.into(),
        }
    }
}

/// Runs one execution of an agent.
pub trait AgentLoop: Send {
    fn run(&mut self, input: LoopInput<'_>) -> Result<LoopOutput, LoopError>;
}

/// Builds loops (the seed's `CanInstantiateAgentLoop`).
pub trait LoopFactory: Send + Sync {
    /// A loop for one execution, configured from `definition` and the
    /// session's `settings` (in particular `settings.model`).
    fn build(
        &self,
        definition: &AgentDefinition,
        settings: &LoopSettings,
    ) -> Result<Box<dyn AgentLoop>, LoopError>;
}

/// One scripted turn of a [`ScriptedLoop`].
#[derive(Clone, Debug, PartialEq)]
pub enum ScriptedTurn {
    /// An assistant reply.
    Reply(String),
    /// An assistant tool call, its result, then the final reply.
    ToolRound {
        tool: String,
        arguments: serde_json::Value,
        result: String,
        reply: String,
    },
    /// The loop fails with this message.
    Fail(String),
    /// Echo the last user message back (`echo: <text>`).
    Echo,
}

/// Builds [`ScriptedLoop`]s that take their turns from a shared queue; when
/// the queue is empty they echo. Records the model of every loop it built.
#[derive(Clone, Debug, Default)]
pub struct ScriptedLoopFactory {
    script: Arc<Mutex<VecDeque<ScriptedTurn>>>,
    built: Arc<Mutex<Vec<ModelConfig>>>,
    durable: bool,
}

impl ScriptedLoopFactory {
    /// A factory whose loops always echo.
    pub fn echo() -> Self {
        Self::default()
    }

    /// A factory whose loops play `turns` in order (one per execution),
    /// then echo.
    pub fn new(turns: impl IntoIterator<Item = ScriptedTurn>) -> Self {
        let f = Self::default();
        f.lock_script().extend(turns);
        f
    }

    /// This factory, its loops handing each produced entry to the step
    /// sink as they go (one commit per entry) instead of returning them.
    pub fn durable(mut self) -> Self {
        self.durable = true;
        self
    }

    /// Queues one more turn.
    pub fn push(&self, turn: ScriptedTurn) {
        self.lock_script().push_back(turn);
    }

    /// The models the built loops were configured with, in build order.
    pub fn built_models(&self) -> Vec<ModelConfig> {
        self.built.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn lock_script(&self) -> std::sync::MutexGuard<'_, VecDeque<ScriptedTurn>> {
        self.script.lock().unwrap_or_else(|p| p.into_inner())
    }
}

impl LoopFactory for ScriptedLoopFactory {
    fn build(
        &self,
        _definition: &AgentDefinition,
        settings: &LoopSettings,
    ) -> Result<Box<dyn AgentLoop>, LoopError> {
        self.built
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(settings.model.clone());
        let turn = self.lock_script().pop_front().unwrap_or(ScriptedTurn::Echo);
        Ok(Box::new(ScriptedLoop {
            model: settings.model.clone(),
            turn,
            durable: self.durable,
        }))
    }
}

/// A deterministic loop: plays one [`ScriptedTurn`]. Assistant messages
/// carry the loop's model (`provider/model`); usage is derived from text
/// lengths (input: transcript entry count × 10, output: reply bytes), so
/// the same script always yields the same transcript and usage. A durable
/// loop hands each entry to the step sink as it is produced; otherwise it
/// returns them.
#[derive(Clone, Debug)]
pub struct ScriptedLoop {
    pub model: ModelConfig,
    pub turn: ScriptedTurn,
    pub durable: bool,
}

impl ScriptedLoop {
    fn assistant(&self, content: Vec<ContentBlock>, stop: StopReason, usage: Usage) -> EntryKind {
        EntryKind::Message {
            message: Message::Assistant {
                content,
                stop_reason: stop,
                usage,
                model: Some(self.model.qualified_name()),
                error_message: None,
            },
        }
    }
}

fn last_user_text(context: &ModelContext) -> String {
    let Some(ContextMessage {
        role: ContextRole::User,
        content,
        ..
    }) = context.messages.last()
    else {
        return String::new();
    };
    content
        .iter()
        .filter_map(|b| match b {
            ContentBlock::Text { text } => Some(text.as_str()),
            _ => None,
        })
        .collect::<Vec<_>>()
        .join("")
}

impl AgentLoop for ScriptedLoop {
    fn run(&mut self, input: LoopInput<'_>) -> Result<LoopOutput, LoopError> {
        let input_tokens = input.transcript_entries.saturating_mul(10);
        let usage_for = |reply: &str| Usage {
            input_tokens,
            output_tokens: reply.len() as u64,
            ..Usage::default()
        };
        let (entries, usage) = match &self.turn {
            ScriptedTurn::Fail(msg) => return Err(LoopError::new(msg.clone())),
            ScriptedTurn::Echo => {
                let reply = format!("echo: {}", last_user_text(input.context));
                let u = usage_for(&reply);
                (
                    vec![self.assistant(vec![ContentBlock::text(reply)], StopReason::Stop, u)],
                    u,
                )
            }
            ScriptedTurn::Reply(reply) => {
                let u = usage_for(reply);
                (
                    vec![self.assistant(
                        vec![ContentBlock::text(reply.clone())],
                        StopReason::Stop,
                        u,
                    )],
                    u,
                )
            }
            ScriptedTurn::ToolRound {
                tool,
                arguments,
                result,
                reply,
            } => {
                let call_id = format!("call_{}", input.settings.execution);
                let u1 = usage_for(tool);
                let u2 = usage_for(reply);
                let mut total = u1;
                total.add(&u2);
                (
                    vec![
                        self.assistant(
                            vec![ContentBlock::ToolCall {
                                id: call_id.clone(),
                                name: tool.clone(),
                                arguments: arguments.clone().into(),
                                signature: None,
                            }],
                            StopReason::ToolUse,
                            u1,
                        ),
                        EntryKind::Message {
                            message: Message::ToolResult {
                                tool_call_id: call_id,
                                tool_name: tool.clone(),
                                content: vec![ContentBlock::text(result.clone())],
                                is_error: false,
                            },
                        },
                        self.assistant(
                            vec![ContentBlock::text(reply.clone())],
                            StopReason::Stop,
                            u2,
                        ),
                    ],
                    total,
                )
            }
        };
        let entries = if self.durable {
            for e in entries {
                input.steps.step(e)?;
            }
            Vec::new()
        } else {
            entries
        };
        Ok(LoopOutput {
            entries,
            usage,
            status: ExecutionStatus::Completed,
        })
    }
}
