//! `SendMessage`: one execution of the agent loop.

use std::sync::Arc;

use super::{ActionError, SessionAction};
use crate::agent_loop::{LoopError, LoopFactory, LoopInput, LoopOutput, LoopSettings, StepSink};
use crate::session::{AgentSession, ExecutionStatus, SessionStatus};
use crate::store::StoreError;
use crate::transcript::{
    build_context, ContentBlock, EntryId, EntryKind, Message, ModelContext, Usage,
};

/// Appends a user message, runs the agent loop, appends what it produced.
///
/// Steps: append the message entry; `ExecutionStarted`; build a loop from
/// the definition and the *current* settings (their model); run it with
/// the model context of the working set, a history reader and a step sink
/// (each step it hands over is committed at once, with the events before
/// it); append the entries it returns in order; `ExecutionFinished`. If
/// building or running the loop fails, the execution finishes `Failed`
/// with the error recorded and the action still succeeds (the session is
/// saved and stays usable). If committing a step fails, the action fails
/// with that store error; the steps committed before stay, and the next
/// execute records the execution as interrupted.
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
        // Owned copies (bounded: a definition and settings, never the
        // transcript) so the step sink can hold the session mutably.
        let definition = session.definition().clone();
        let settings = LoopSettings::of(session.state());
        let (context, context_complete) = loop_context(session);
        let history = session.history();
        let transcript_entries = session.transcript_entries();
        let session_id = session.id().clone();
        let mut writer = TurnWriter {
            session,
            failed: None,
        };
        let result = self
            .factory
            .build(&definition, &settings)
            .and_then(|mut l| {
                l.run(LoopInput {
                    session_id: &session_id,
                    definition: &definition,
                    settings: &settings,
                    context: &context,
                    context_complete,
                    transcript_entries,
                    history: &history,
                    steps: &mut writer,
                })
            });
        if let Some(e) = writer.failed.take() {
            // A step could not be committed: the turn stops here; what was
            // committed before stays (the execution reads as interrupted).
            return Err(ActionError::Store(e));
        }
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

/// The [`StepSink`] of a turn: appends each step to the session and
/// commits it at once ([`AgentSession::commit_steps`]). The first failed
/// commit is kept; every later step is refused.
struct TurnWriter<'s> {
    session: &'s mut AgentSession,
    failed: Option<StoreError>,
}

impl StepSink for TurnWriter<'_> {
    fn steps(&mut self, entries: Vec<EntryKind>) -> Result<Vec<EntryId>, LoopError> {
        if let Some(e) = &self.failed {
            return Err(LoopError::new(format!(
                "an earlier step of this turn could not be committed: {e}"
            )));
        }
        let mut ids = Vec::with_capacity(entries.len());
        for kind in entries {
            ids.push(
                self.session
                    .append(kind)
                    .map_err(|e| LoopError::new(e.to_string()))?,
            );
        }
        match self.session.commit_steps() {
            Ok(_) => Ok(ids),
            Err(e) => {
                let msg = format!("committing a step failed: {e}");
                self.failed = Some(e);
                Err(LoopError::new(msg))
            }
        }
    }
}

/// The model context a loop gets and whether it is complete. A bounded
/// session: the resident selection it was loaded with, extended with the
/// entries appended since (the user's message), as a handle's snapshot is
/// after an append; if that selection cannot be extended in memory, the
/// context of the held part of the path. A whole session: the context of
/// its whole path.
fn loop_context(session: &AgentSession) -> (ModelContext, bool) {
    let t = &session.state().transcript;
    if let Some(snap) = session.resident() {
        let mut appended = Vec::new();
        let mut cur = t.leaf().cloned();
        let mut reached = cur.is_none() || cur == snap.leaf;
        while let Some(id) = cur {
            if Some(&id) == snap.leaf.as_ref() {
                reached = true;
                break;
            }
            let Some(e) = t.get(&id) else { break };
            cur = e.parent_id.clone();
            appended.push(e.clone());
        }
        appended.reverse();
        if reached {
            if let Some((sel, _)) = snap.selection.extended(&snap.sizes, &appended) {
                let ctx = sel.context();
                return (ctx, sel.complete);
            }
        }
        let path = t.current_path().unwrap_or_default();
        return (build_context(&path), false);
    }
    match t.current_path() {
        Ok(path) => (build_context(&path), true),
        Err(_) => (ModelContext::default(), false),
    }
}
