//! The README's library example: a session on the log store, an agent loop
//! that sees the bounded model context and commits each step as it goes,
//! then a live handle and its bounded context.
//! Run it with `cargo run -p spool-runtime --example quickstart`.

use std::sync::Arc;

use spool_runtime::agent_loop::assistant_message;
use spool_runtime::transcript::Usage;
use spool_runtime::{AgentDefinition, HandleOptions, SendMessage, SessionRuntime};
use spool_runtime::{AgentLoop, LoopError, LoopFactory, LoopInput, LoopOutput, LoopSettings};

/// Stands in for a model client: answers with what it was sent.
struct Echo;

impl AgentLoop for Echo {
    fn run(&mut self, input: LoopInput<'_>) -> Result<LoopOutput, LoopError> {
        // The context is built from the session's working set (bounded,
        // however long the session); `input.history` reads older entries.
        let sent = input.context.messages.len();
        let reply = format!("{sent} message(s) in my context");
        // Each step is committed as it is produced: a crash keeps it.
        let model = &input.settings.model;
        input
            .steps
            .step(assistant_message(reply, model, Usage::default()))?;
        Ok(LoopOutput::completed(Usage::default()))
    }
}

/// Builds a loop per execution, from the definition and the settings.
struct EchoFactory;

impl LoopFactory for EchoFactory {
    fn build(
        &self,
        _: &AgentDefinition,
        _: &LoopSettings,
    ) -> Result<Box<dyn AgentLoop>, LoopError> {
        Ok(Box::new(Echo))
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?; // any directory: the store is created if missing
    let runtime = SessionRuntime::open(dir.path())?; // the log store, default options

    let agent = AgentDefinition::new("helper", "Answers questions", "You are concise.");
    let id = runtime.create(agent, None)?.id().clone(); // version 1

    // The message and the loop's step: version 2; the end of the turn: 3.
    let turn = SendMessage::new("Hi, who are you?", Arc::new(EchoFactory));
    let session = runtime.execute(&id, &turn)?;
    println!(
        "version {}, {:?}",
        session.version(),
        session.state().execution
    );

    // A handle holds only what fits its budget (default 64 KiB / 1024 entries).
    let handle = runtime.open_handle(&id, HandleOptions::reader())?;
    for message in handle.snapshot().context().messages {
        println!("{:?}: {:?}", message.role, message.content);
    }
    Ok(())
}
