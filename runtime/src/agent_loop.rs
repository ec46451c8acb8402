//! The agent loop seam: [`AgentLoop`], [`LoopFactory`], and the
//! deterministic [`ScriptedLoop`].
//!
//! `SendMessage` appends the user message, then asks a [`LoopFactory`] for
//! a loop built from the session's definition *and current state* (so the
//! state's model — changed by `ChangeModel` — is what the loop uses), runs
//! it once, and appends the entries it returns. A loop error (or a build
//! error) ends the execution as `Failed` with the error recorded; the
//! session stays usable.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::session::{AgentDefinition, AgentState, ExecutionStatus, ModelConfig, SessionId};
use crate::transcript::{ContentBlock, EntryKind, Message, StopReason, Usage};

/// What a loop sees: the session's identity, definition and state (whose
/// transcript already ends with the new user message).
#[derive(Clone, Copy, Debug)]
pub struct LoopInput<'a> {
    pub session_id: &'a SessionId,
    pub definition: &'a AgentDefinition,
    pub state: &'a AgentState,
}

/// What a loop produced: new transcript entries in order (assistant
/// messages, tool calls, tool results, ...), each appended under the
/// previous one, the execution's usage, and how it ended (`Completed` or
/// `Stopped`; any other status is recorded as `Completed`).
#[derive(Clone, Debug, PartialEq)]
pub struct LoopOutput {
    pub entries: Vec<EntryKind>,
    pub usage: Usage,
    pub status: ExecutionStatus,
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
    /// A loop for one execution, configured from `definition` and `state`
    /// (in particular `state.model`).
    fn build(
        &self,
        definition: &AgentDefinition,
        state: &AgentState,
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
        state: &AgentState,
    ) -> Result<Box<dyn AgentLoop>, LoopError> {
        self.built
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(state.model.clone());
        let turn = self.lock_script().pop_front().unwrap_or(ScriptedTurn::Echo);
        Ok(Box::new(ScriptedLoop {
            model: state.model.clone(),
            turn,
        }))
    }
}

/// A deterministic loop: plays one [`ScriptedTurn`]. Assistant messages
/// carry the loop's model (`provider/model`); usage is derived from text
/// lengths (input: transcript entry count × 10, output: reply bytes), so
/// the same script always yields the same transcript and usage.
#[derive(Clone, Debug)]
pub struct ScriptedLoop {
    pub model: ModelConfig,
    pub turn: ScriptedTurn,
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

fn last_user_text(state: &AgentState) -> String {
    let t = &state.transcript;
    let Some(leaf) = t.leaf().and_then(|l| t.get(l)) else {
        return String::new();
    };
    match &leaf.kind {
        EntryKind::Message {
            message: Message::User { content },
        } => content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect::<Vec<_>>()
            .join(""),
        _ => String::new(),
    }
}

impl AgentLoop for ScriptedLoop {
    fn run(&mut self, input: LoopInput<'_>) -> Result<LoopOutput, LoopError> {
        let input_tokens = (input.state.transcript.len() as u64).saturating_mul(10);
        let usage_for = |reply: &str| Usage {
            input_tokens,
            output_tokens: reply.len() as u64,
            ..Usage::default()
        };
        let (entries, usage) = match &self.turn {
            ScriptedTurn::Fail(msg) => return Err(LoopError::new(msg.clone())),
            ScriptedTurn::Echo => {
                let reply = format!("echo: {}", last_user_text(input.state));
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
                let call_id = format!("call_{}", input.state.execution_count);
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
                                arguments: arguments.clone(),
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
        Ok(LoopOutput {
            entries,
            usage,
            status: ExecutionStatus::Completed,
        })
    }
}
