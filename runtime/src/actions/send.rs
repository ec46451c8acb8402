//! `SendMessage`: one execution of the agent loop.

use std::sync::Arc;

use super::{ActionError, SessionAction};
use crate::agent_loop::{LoopFactory, LoopInput, LoopOutput};
use crate::session::{AgentSession, ExecutionStatus, SessionStatus};
use crate::transcript::{ContentBlock, EntryKind, Message, Usage};

/// Appends a user message, runs the agent loop, appends what it produced.
///
/// Steps: append the message entry; `ExecutionStarted`; build a loop from
/// the definition and the *current* state (its model); run it; append its
/// entries in order; `ExecutionFinished`. If building or running the loop
/// fails, the execution finishes `Failed` with the error recorded and the
/// action still succeeds (the session is saved and stays usable).
///
/// Requires an `Active` session.
#[derive(Clone)]
pub struct SendMessage {
    pub message: Message,
    pub factory: Arc<dyn LoopFactory>,
}

impl SendMessage {
    /// A user text message.
    pub fn new(text: impl Into<String>, factory: Arc<dyn LoopFactory>) -> Self {
        SendMessage {
            message: Message::User {
                content: vec![ContentBlock::text(text)],
            },
            factory,
        }
    }

    /// Any message (normally a user message).
    pub fn with_message(message: Message, factory: Arc<dyn LoopFactory>) -> Self {
        SendMessage { message, factory }
    }
}

impl std::fmt::Debug for SendMessage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SendMessage")
            .field("message", &self.message)
            .finish_non_exhaustive()
    }
}

impl SessionAction for SendMessage {
    fn name(&self) -> &str {
        "send_message"
    }

    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        if session.status() != SessionStatus::Active && !session.is_deleted() {
            return Err(ActionError::not_allowed(format!(
                "session {} is {}; resume it before sending messages",
                session.id(),
                session.status()
            )));
        }
        session.append(EntryKind::Message {
            message: self.message.clone(),
        })?;
        session.start_execution()?;
        let result = self
            .factory
            .build(session.definition(), session.state())
            .and_then(|mut l| {
                l.run(LoopInput {
                    session_id: session.id(),
                    definition: session.definition(),
                    state: session.state(),
                })
            });
        match result {
            Ok(LoopOutput {
                entries,
                usage,
                status,
            }) => {
                for kind in entries {
                    session.append(kind)?;
                }
                let status = match status {
                    ExecutionStatus::Stopped => ExecutionStatus::Stopped,
                    _ => ExecutionStatus::Completed,
                };
                session.finish_execution(status, usage, None)?;
            }
            Err(e) => {
                session.finish_execution(
                    ExecutionStatus::Failed,
                    Usage::default(),
                    Some(e.message),
                )?;
            }
        }
        Ok(())
    }
}
