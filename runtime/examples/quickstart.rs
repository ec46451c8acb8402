//! The README's library example: a session on the log store, one run of the
//! scripted agent loop, then a live handle and its bounded model context.
//! Run it with `cargo run -p spool-runtime --example quickstart`.

use std::sync::Arc;

use spool_runtime::{AgentDefinition, HandleOptions, ScriptedLoopFactory, ScriptedTurn};
use spool_runtime::{SendMessage, SessionRuntime};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = tempfile::tempdir()?; // any directory: the store is created if missing
    let runtime = SessionRuntime::open(dir.path())?; // the log store, default options

    let agent = AgentDefinition::new("helper", "Answers questions", "You are concise.");
    let id = runtime.create(agent, None)?.id().clone(); // version 1

    // A real application plugs its model client in as a LoopFactory.
    let reply = ScriptedTurn::Reply("Hello!".into());
    let replies = Arc::new(ScriptedLoopFactory::new([reply]));
    runtime.execute(&id, &SendMessage::new("Hi, who are you?", replies))?; // version 2

    // A handle holds only what fits its budget (default 64 KiB / 1024 entries).
    let handle = runtime.open_handle(&id, HandleOptions::reader())?;
    for message in handle.snapshot().context().messages {
        println!("{:?}: {:?}", message.role, message.content);
    }
    Ok(())
}
