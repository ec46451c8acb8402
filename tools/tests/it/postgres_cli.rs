//! `spool --store postgres://…`: the session commands on a PostgreSQL store,
//! against a throwaway server started with the machine's own binaries
//! (skipped loudly when they are absent, except under CI).

use crate::postgres_support;

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
    // `show` reads the settings and the transcript head, `tree` the entries;
    // the figures are the demo's, as a full fold of the log store gives them.
    assert_eq!(
        shown["state"]["entries"].as_u64(),
        Some(tree["entries"].as_array().unwrap().len() as u64),
        "{shown}"
    );
    assert_eq!(shown["state"]["execution_count"], 3, "{shown}");
    assert_eq!(shown["state"]["usage_total_tokens"], 419, "{shown}");
    assert_eq!(shown["state"]["tasks"].as_array().unwrap().len(), 3);
}

fn spool_output(store: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_spool"))
        .arg("--store")
        .arg(store)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn spool")
}

/// A server that takes TCP connections over TLS only: the CLI connects
/// with `sslmode=verify-full` and the test CA, and a verifying mode
/// without its root file fails with the reason, exit 2.
#[test]
fn tls_urls_work_on_the_command_line() {
    let pki = spool_pgserver::TestPki::generate(&["localhost", "127.0.0.1"]).expect("certificates");
    let Some(server) = PgServer::start_tls_or_skip(
        "tls_urls_work_on_the_command_line",
        &spool_pgserver::ServerTls {
            cert_pem: &pki.server_cert_pem,
            key_pem: &pki.server_key_pem,
            hostssl_only: true,
        },
    ) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root.pem");
    std::fs::write(&root, &pki.ca_pem).unwrap();
    let base = format!("postgres://postgres@127.0.0.1:{}/postgres", server.port());
    let url = format!("{base}?sslmode=verify-full&sslrootcert={}", root.display());
    let demo = spool(&url, &["demo", "--json"]);
    assert_eq!(demo["created"].as_array().expect("created ids").len(), 4);
    assert_eq!(
        spool(&url, &["sessions", "--json"])
            .as_array()
            .unwrap()
            .len(),
        4
    );

    let missing = dir.path().join("missing.pem");
    let out = spool_output(
        &format!("{base}?sslmode=verify-ca&sslrootcert={}", missing.display()),
        &["sessions"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("missing.pem") && stderr.contains("does not exist"),
        "{stderr}"
    );

    let out = spool_output(&format!("{base}?sslmode=disable"), &["sessions"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("no encryption"), "{stderr}");
}

/// A malformed URL with a password: refused, and the password is not
/// printed.
#[test]
fn malformed_urls_do_not_print_the_password() {
    let out = spool_output(
        "postgres://alice:s3cr3tpw@127.0.0.1:notaport/db",
        &["sessions"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("invalid PostgreSQL connection string"),
        "{stderr}"
    );
    assert!(!stderr.contains("s3cr3tpw"), "{stderr}");
    assert!(!String::from_utf8_lossy(&out.stdout).contains("s3cr3tpw"));
}

/// On PostgreSQL, `demo` suggests only commands that work there (no
/// `log`, no `verify`), each of which then succeeds; session id prefixes
/// resolve; a delete that loses a race to another delete reports
/// "already deleted"; `purge` removes the deleted session.
#[test]
fn demo_suggestions_prefixes_and_delete_work_on_a_postgres_store() {
    let Some(server) =
        PgServer::start_or_skip("demo_suggestions_prefixes_and_delete_work_on_a_postgres_store")
    else {
        return;
    };
    let url = server.url();
    let out = spool_output(&url, &["demo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let suggested: Vec<Vec<String>> = text
        .split_once("Explore further:")
        .expect("suggestions")
        .1
        .lines()
        .filter_map(|l| l.trim().strip_prefix("spool --store "))
        .map(|l| l.split_whitespace().skip(1).map(str::to_string).collect())
        .collect();
    assert!(!suggested.is_empty(), "{text}");
    for args in &suggested {
        assert!(
            !["log", "verify", "streams", "stats"].contains(&args[0].as_str()),
            "{args:?}"
        );
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = spool_output(&url, &args);
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let ids: Vec<String> = spool(&url, &["sessions", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    let id = &ids[0];
    let shown = spool(&url, &["show", &id[..8], "--json"]);
    assert_eq!(shown["header"]["id"], id.as_str());
    let deleted = spool(
        &url,
        &["delete", &id[..8], "--test-concurrent-delete", "--json"],
    );
    assert_eq!(deleted["already_deleted"], true, "{deleted}");
    let deleted = spool(&url, &["delete", id, "--json"]);
    assert_eq!(deleted["already_deleted"], true, "{deleted}");

    // `stats` gives what a PostgreSQL store can tell: sessions by status.
    let stats = spool(&url, &["stats", "--json"]);
    assert_eq!(stats["version"], 1, "{stats}");
    assert_eq!(stats["store"], "postgresql");
    assert_eq!(stats["sessions"], 4, "{stats}");
    assert_eq!(stats["sessions_by_status"]["deleted"], 1, "{stats}");
    assert_eq!(stats["sessions_by_status"]["suspended"], 1, "{stats}");
    let most = stats["most_versions"].as_array().unwrap();
    assert!(most
        .windows(2)
        .all(|w| w[0]["version"].as_u64() >= w[1]["version"].as_u64()));

    // `purge` refuses an active session, removes the deleted one (by
    // prefix), and then finds no session.
    let out = spool_output(&url, &["purge", &ids[1]]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--force"));
    let purged = spool(&url, &["purge", &id[..8], "--json"]);
    assert_eq!(purged["status"], "deleted", "{purged}");
    assert_eq!(purged["already_purged"], false, "{purged}");
    assert_eq!(spool_output(&url, &["show", id]).status.code(), Some(2));
    assert_eq!(spool_output(&url, &["purge", id]).status.code(), Some(2));
    let stats = spool(&url, &["stats", "--json"]);
    assert_eq!(stats["sessions"], 3, "{stats}");
}

/// `export` and `import` on PostgreSQL: a log store's sessions go into
/// PostgreSQL and back out identically (ids, versions, commit ids, commit
/// times, so `sessions --json` is the same), and an import that meets an
/// existing session writes nothing at all (one transaction).
#[test]
fn export_and_import_round_trip_through_a_postgres_store() {
    let Some(server) =
        PgServer::start_or_skip("export_and_import_round_trip_through_a_postgres_store")
    else {
        return;
    };
    let url = server.url();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("store");
    let log = log.to_str().unwrap();
    let out = spool_output(log, &["demo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first = dir.path().join("first.jsonl");
    let out = spool_output(
        log,
        &[
            "export",
            "--all",
            "--include-deleted",
            "--out",
            first.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    let imported = spool(&url, &["import", first.to_str().unwrap(), "--json"]);
    assert_eq!(
        imported["sessions"].as_array().unwrap().len(),
        4,
        "{imported}"
    );
    let listing = |store: &str| {
        let mut v = spool(store, &["sessions", "--json"]);
        let list = v.as_array_mut().unwrap();
        list.sort_by(|a, b| a["id"].as_str().cmp(&b["id"].as_str()));
        serde_json::Value::Array(list.clone())
    };
    assert_eq!(listing(&url), listing(log));
    let id = imported["sessions"][0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        spool(&url, &["context", &id, "--json"]),
        spool(log, &["context", &id, "--json"])
    );

    // Out of PostgreSQL: the same lines as the first export but for the
    // header's export time.
    let second = dir.path().join("second.jsonl");
    let out = spool_output(
        &url,
        &[
            "export",
            "--all",
            "--include-deleted",
            "--out",
            second.to_str().unwrap(),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body = |p: &std::path::Path| {
        let text = std::fs::read_to_string(p).unwrap();
        text.lines().skip(1).map(str::to_string).collect::<Vec<_>>()
    };
    assert_eq!(body(&first), body(&second));

    // All or nothing: a file holding one new session and one that exists
    // imports neither.
    let fresh = dir.path().join("fresh");
    let fresh = fresh.to_str().unwrap();
    let out = spool_output(fresh, &["demo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let new_id = spool(fresh, &["sessions", "--json"])[0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let mixed = dir.path().join("mixed.jsonl");
    let mut lines: Vec<String> = std::fs::read_to_string(&first)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    let end = lines.pop().unwrap();
    let fresh_export = dir.path().join("fresh.jsonl");
    let out = spool_output(
        fresh,
        &["export", &new_id, "--out", fresh_export.to_str().unwrap()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let extra: Vec<String> = std::fs::read_to_string(&fresh_export)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // The new session first, then the ones PostgreSQL already has; the
    // end line's totals are recomputed from the parts.
    let mut body: Vec<String> = extra[1..extra.len() - 1].to_vec();
    body.extend(lines[1..].iter().cloned());
    let first_end: serde_json::Value = serde_json::from_str(&end).unwrap();
    let extra_end: serde_json::Value = serde_json::from_str(extra.last().unwrap()).unwrap();
    let sum = |k: &str| first_end[k].as_u64().unwrap() + extra_end[k].as_u64().unwrap();
    let end = serde_json::json!({
        "end": true,
        "sessions": sum("sessions"),
        "commits": sum("commits"),
        "events": sum("events"),
    });
    let mut text = vec![lines[0].clone()];
    text.extend(body);
    text.push(end.to_string());
    std::fs::write(&mixed, text.join("\n") + "\n").unwrap();
    let before = listing(&url);
    let out = spool_output(&url, &["import", mixed.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(listing(&url), before, "nothing imported");
}
