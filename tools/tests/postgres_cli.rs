//! `spool --store postgres://…`: the session commands on a PostgreSQL store,
//! against a throwaway server started with the machine's own binaries
//! (skipped loudly when they are absent, except under CI).

#[path = "../../runtime/tests/postgres_support/mod.rs"]
mod postgres_support;

use std::process::{Command, Stdio};

use postgres_support::PgServer;

fn spool(store: &str, args: &[&str]) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_spool"))
        .arg("--store")
        .arg(store)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn spool");
    assert!(
        out.status.success(),
        "spool {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON output")
}

#[test]
fn session_commands_work_on_a_postgres_store() {
    let Some(server) = PgServer::start_or_skip("session_commands_work_on_a_postgres_store") else {
        return;
    };
    let url = server.url();
    let demo = spool(&url, &["demo", "--json"]);
    let created = demo["created"].as_array().expect("created ids");
    assert_eq!(created.len(), 4);
    let sessions = spool(&url, &["sessions", "--json"]);
    assert_eq!(sessions.as_array().unwrap().len(), 4);
    let suspended = spool(&url, &["sessions", "--status", "suspended", "--json"]);
    assert_eq!(suspended.as_array().unwrap().len(), 1);
    let id = created[0].as_str().unwrap();
    let shown = spool(&url, &["show", id, "--json"]);
    assert_eq!(shown["state"]["metadata"]["ticket"], "OPS-142");
    let ctx = spool(&url, &["context", id, "--json"]);
    assert_eq!(ctx["messages"].as_array().unwrap().len(), 6, "{ctx}");
    let tree = spool(&url, &["tree", id, "--json"]);
    assert!(tree["entries"].as_array().unwrap().len() >= 9);
}
