//! Black-box tests of the offline tools (`stats`, `replay`, `export`,
//! `import`, `delete`), run as a user would run them against stores made
//! by `spool demo` (and, where a test needs to know each saved version, a
//! session scripted through the runtime library).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use serde_json::Value;

fn spool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spool"))
}

/// Runs `spool --store DIR args...`.
pub(crate) fn run(dir: &Path, args: &[&str]) -> Output {
    spool()
        .arg("--store")
        .arg(dir)
        .args(args)
        .env_remove("SPOOL_STORE")
        .stdin(Stdio::null())
        .output()
        .expect("spawn spool")
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs and parses stdout as JSON; the command must succeed.
pub(crate) fn json(dir: &Path, args: &[&str]) -> Value {
    let out = run(dir, args);
    assert!(
        out.status.success(),
        "spool {args:?} failed: {}\nstderr: {}",
        out.status,
        stderr(&out)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "spool {args:?}: stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// Runs a command that must fail with exit code 2; returns its stderr.
fn fails(dir: &Path, args: &[&str]) -> String {
    let out = run(dir, args);
    assert_eq!(
        out.status.code(),
        Some(2),
        "spool {args:?} should fail with 2; stdout {} stderr {}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    stderr(&out)
}

/// A store made by `spool demo`; returns its session ids (oldest first).
pub(crate) fn demo(dir: &Path) -> Vec<String> {
    let v = json(dir, &["demo", "--json"]);
    v["created"]
        .as_array()
        .expect("created ids")
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

pub(crate) fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/pi")
        .join(name)
}

pub(crate) fn session_ids(dir: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec!["sessions", "--json"];
    args.extend_from_slice(extra);
    let mut ids: Vec<String> = json(dir, &args)
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["id"].as_str().unwrap().to_string())
        .collect();
    ids.sort();
    ids
}

/// `show --json` without the one field an import cannot keep (the commit
/// time of the last commit, which the importing store assigns).
fn show_without_updated(dir: &Path, id: &str) -> Value {
    let mut v = json(dir, &["show", id, "--json"]);
    v["header"]
        .as_object_mut()
        .unwrap()
        .remove("updated_at")
        .expect("updated_at");
    v
}

/// Per commit of a stream: (version, commit id, event kinds).
fn commits_of(dir: &Path, id: &str) -> Vec<(u64, String, Vec<String>)> {
    json(dir, &["log", "--stream", id, "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["version"].as_u64().unwrap(),
                c["commit_id"].as_str().unwrap().to_string(),
                c["events"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|e| e["kind"].as_str().unwrap().to_string())
                    .collect(),
            )
        })
        .collect()
}

fn streams(dir: &Path) -> BTreeMap<String, u64> {
    json(dir, &["streams", "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            (
                s["stream"].as_str().unwrap().to_string(),
                s["version"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn help_lists_every_command_and_documents_json() {
    let out = spool().arg("--help").output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for cmd in [
        "stats", "replay", "export", "import", "delete", "verify", "demo",
    ] {
        assert!(text.contains(cmd), "--help lacks {cmd}: {text}");
    }
    for cmd in [
        "stats", "replay", "import", "delete", "show", "log", "sessions",
    ] {
        let out = spool().args([cmd, "--help"]).output().unwrap();
        assert!(out.status.success(), "{cmd} --help");
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.contains("--json") && text.contains("Print one JSON document"),
            "{cmd} --help does not document --json: {text}"
        );
    }
    let out = spool().args(["export", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("--out"));
}

#[test]
fn stats_counts_live_and_dead_bytes_and_delete_tombstones() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = demo(&store);

    let s = json(&store, &["stats", "--json", "--top", "10"]);
    let b = &s["bytes"];
    let records = b["records"].as_u64().unwrap();
    assert!(records > 0);
    assert_eq!(
        b["live"].as_u64().unwrap(),
        records,
        "nothing dead yet: {s}"
    );
    assert_eq!(b["dead"].as_u64().unwrap(), 0);
    assert!(b["file_bytes"].as_u64().unwrap() >= records);
    assert_eq!(s["sessions"], 4);
    assert_eq!(s["sessions_by_status"]["suspended"], 1);
    assert_eq!(s["segments"].as_u64().unwrap(), 1);
    // The record bytes equal the sum over `log`.
    let log = json(&store, &["log", "--json"]);
    let logged: u64 = log
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["record_bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(logged, records);
    assert_eq!(
        s["commits"].as_u64().unwrap(),
        log.as_array().unwrap().len() as u64
    );
    let sizes: Vec<u64> = s["largest_entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["bytes"].as_u64().unwrap())
        .collect();
    assert!(
        !sizes.is_empty() && sizes.windows(2).all(|w| w[0] >= w[1]),
        "{sizes:?}"
    );

    // Delete (tombstone) one session: its bytes become dead.
    let victim = &ids[2];
    let victim_bytes: u64 = json(&store, &["log", "--stream", victim, "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["record_bytes"].as_u64().unwrap())
        .sum();
    let d = json(&store, &["delete", victim, "--json"]);
    assert_eq!(d["status"], "deleted");
    assert_eq!(d["already_deleted"], false);
    let tomb_bytes: u64 = json(&store, &["log", "--stream", victim, "--json"])
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["record_bytes"].as_u64().unwrap())
        .sum();
    assert!(tomb_bytes > victim_bytes, "the tombstone is a commit");
    let s = json(&store, &["stats", "--json"]);
    assert_eq!(s["bytes"]["dead"].as_u64().unwrap(), tomb_bytes, "{s}");
    assert_eq!(s["bytes"]["dead_deleted"].as_u64().unwrap(), tomb_bytes);
    assert_eq!(
        s["bytes"]["live"].as_u64().unwrap() + tomb_bytes,
        s["bytes"]["records"].as_u64().unwrap()
    );
    assert_eq!(s["sessions_by_status"]["deleted"], 1);
    let shown = json(&store, &["show", victim, "--json"]);
    assert_eq!(shown["header"]["status"], "deleted");
    assert!(
        !session_ids(&store, &[]).contains(victim),
        "hidden from listing"
    );
    assert_eq!(
        session_ids(&store, &["--status", "deleted"]),
        vec![victim.clone()]
    );

    // Deleting again is a no-op; unknown and invalid ids fail with a hint.
    let d = json(&store, &["delete", victim, "--json"]);
    assert_eq!(d["already_deleted"], true);
    let err = fails(&store, &["delete", "no-such-session"]);
    assert!(err.contains("no session") && err.contains("hint:"), "{err}");
    fails(&store, &["delete", "a/b"]);

    // The text forms print.
    let out = run(&store, &["stats"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("live") && text.contains("dead") && text.contains("largest entries"));
    let out = run(&store, &["delete", victim]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("already deleted"));
}

/// `--out` naming a pipe writes into it and leaves it a pipe (a temporary
/// file renamed over it would have replaced it, as it would `/dev/null`);
/// `--out` naming a directory is refused.
#[cfg(unix)]
#[test]
fn export_out_writes_into_a_pipe_and_refuses_a_directory() {
    use std::os::unix::fs::FileTypeExt;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("s");
    demo(&store);
    let fifo = dir.path().join("fifo");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap();
    assert!(made.success());
    let reader = {
        let fifo = fifo.clone();
        std::thread::spawn(move || std::fs::read_to_string(fifo).unwrap())
    };
    let out = run(
        &store,
        &["export", "--all", "--out", fifo.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // Checked before waiting for the reader, which a replaced pipe leaves blocked.
    assert!(std::fs::metadata(&fifo).unwrap().file_type().is_fifo());
    let text = reader.join().unwrap();
    assert!(text.starts_with("{\"format\":\"spool-export\""), "{text}");
    assert!(text.trim_end().ends_with('}') && text.contains("\"end\":true"));
    let out = run(
        &store,
        &["export", "--all", "--out", dir.path().to_str().unwrap()],
    );
    assert!(!out.status.success());
    assert!(stderr(&out).contains("is a directory"), "{}", stderr(&out));
}

#[test]
fn export_then_import_round_trips_identical_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    let ids = demo(&a);
    json(&a, &["delete", &ids[3], "--json"]);
    let file = dir.path().join("all.jsonl");
    let out = run(
        &a,
        &[
            "export",
            "--all",
            "--include-deleted",
            "--out",
            file.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    // Stdout export is the same document (bar the export time).
    let out = run(&a, &["export", "--all", "--include-deleted"]);
    assert!(out.status.success());
    let strip = |t: &str| t.lines().skip(1).map(str::to_string).collect::<Vec<_>>();
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(strip(&text), strip(&String::from_utf8_lossy(&out.stdout)));
    // Every line is one JSON object of the documented shape.
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["format"], "spool-export");
    assert_eq!(lines[0]["version"], 1);
    assert_eq!(lines.last().unwrap()["end"], true);
    for l in &lines[1..lines.len() - 1] {
        for k in [
            "session",
            "version",
            "commit_id",
            "timestamp_ms",
            "index",
            "events_in_commit",
            "event",
        ] {
            assert!(l.get(k).is_some(), "event line lacks {k}: {l}");
        }
    }

    let rep = json(&b, &["import", file.to_str().unwrap(), "--json"]);
    assert_eq!(rep["sessions"].as_array().unwrap().len(), 4);
    // Lossless: the listing (times included) is the same, and exporting
    // the imported store gives the same document bar the export time.
    assert_eq!(
        json(&a, &["sessions", "--json"]),
        json(&b, &["sessions", "--json"])
    );
    assert_eq!(
        json(&a, &["sessions", "--status", "deleted", "--json"]),
        json(&b, &["sessions", "--status", "deleted", "--json"])
    );
    let again = run(&b, &["export", "--all", "--include-deleted"]);
    assert!(again.status.success(), "{}", stderr(&again));
    assert_eq!(strip(&text), strip(&String::from_utf8_lossy(&again.stdout)));
    assert_eq!(session_ids(&a, &[]), session_ids(&b, &[]));
    assert_eq!(
        session_ids(&a, &["--status", "deleted"]),
        session_ids(&b, &["--status", "deleted"])
    );
    for id in &ids {
        assert_eq!(
            show_without_updated(&a, id),
            show_without_updated(&b, id),
            "show {id}"
        );
        assert_eq!(
            json(&a, &["tree", id, "--json"]),
            json(&b, &["tree", id, "--json"]),
            "tree {id}"
        );
        assert_eq!(
            json(&a, &["context", id, "--json"]),
            json(&b, &["context", id, "--json"]),
            "context {id}"
        );
        assert_eq!(commits_of(&a, id), commits_of(&b, id), "log --stream {id}");
    }
    assert_eq!(streams(&a), streams(&b));

    // Importing again is refused, names the session and changes nothing.
    let before = streams(&b);
    let err = fails(&b, &["import", file.to_str().unwrap()]);
    assert!(
        err.contains("already exists") && err.contains("hint:"),
        "{err}"
    );
    assert_eq!(streams(&b), before);

    // A single session exports alone; an unknown one is a clear error.
    let one = run(&a, &["export", &ids[0]]);
    assert!(one.status.success());
    let n = String::from_utf8_lossy(&one.stdout)
        .lines()
        .filter(|l| l.contains(&ids[1]))
        .count();
    assert_eq!(n, 0, "only the asked session");
    let err = fails(&a, &["export", "no-such-session"]);
    assert!(err.contains("no session"), "{err}");
    let _ = fails(&a, &["export"]);
}

/// A damaged file is refused with the line number and nothing of it
/// becomes visible, an oversized commit included.
#[test]
fn truncated_or_malformed_import_is_refused_and_leaves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let b = dir.path().join("b");
    demo(&a);
    let text = String::from_utf8(run(&a, &["export", "--all"]).stdout).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines.len() > 10);
    // The target store already holds other sessions.
    demo(&b);
    let before = streams(&b);
    let sessions_before = session_ids(&b, &[]);
    let write = |name: &str, body: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, body).unwrap();
        p
    };
    let check = |p: &Path, line: usize, what: &str| {
        let err = fails(&b, &["import", p.to_str().unwrap()]);
        assert!(
            err.contains(&format!("line {line}")),
            "{what}: error does not name line {line}: {err}"
        );
        assert!(err.contains("nothing was imported"), "{what}: {err}");
        assert_eq!(streams(&b), before, "{what}: the store changed");
        assert_eq!(session_ids(&b, &[]), sessions_before);
    };

    // Cut in the middle of line 6.
    let cut: usize = lines[..5].iter().map(|l| l.len() + 1).sum::<usize>() + lines[5].len() / 2;
    check(&write("cut.jsonl", &text[..cut]), 6, "cut mid-line");
    // Cut after a whole line (the end line is missing).
    let upto: String = lines[..8].iter().map(|l| format!("{l}\n")).collect();
    check(&write("short.jsonl", &upto), 8, "cut at a line boundary");
    // A line that is not JSON.
    let mut bad = lines.clone();
    bad[3] = "{not json";
    check(
        &write("bad.jsonl", &(bad.join("\n") + "\n")),
        4,
        "malformed line",
    );
    // A well-formed line whose event does not fold (unknown parent entry).
    let k = lines
        .iter()
        .position(|l| l.contains("\"entry_appended\"") && l.contains("\"parent_id\":\""))
        .expect("an appended entry with a parent");
    let mut v: Value = serde_json::from_str(lines[k]).unwrap();
    v["event"]["entry"]["parent_id"] = Value::from("missing0");
    let changed = v.to_string();
    let mut bad = lines.clone();
    bad[k] = &changed;
    check(
        &write("fold.jsonl", &(bad.join("\n") + "\n")),
        k + 1,
        "history that does not fold",
    );

    // A commit larger than the store's record limit (16 MiB by default)
    // is found before the first write: nothing is written, not even a
    // session later purged again.
    let fresh = dir.path().join("fresh");
    let k = lines
        .iter()
        .rposition(|l| l.contains("\"entry_appended\"") && l.contains("\"role\":\"user\""))
        .expect("a user message");
    let mut v: Value = serde_json::from_str(lines[k]).unwrap();
    v["event"]["entry"]["kind"]["message"]["content"][0]["text"] =
        Value::from("x".repeat(17 << 20));
    let big = v.to_string();
    let mut bad = lines.clone();
    bad[k] = &big;
    let p = write("big.jsonl", &(bad.join("\n") + "\n"));
    let err = fails(&fresh, &["import", p.to_str().unwrap()]);
    assert!(
        err.contains(&format!("line {}:", k + 1)) && err.contains("nothing was imported"),
        "{err}"
    );
    assert!(streams(&fresh).is_empty(), "nothing written");
    let v = json(&fresh, &["verify", "--json"]);
    assert_eq!(v["ok"], true);

    // Purged sessions, for `stats`: imported, then purged through the
    // library (the command line has no purge).
    {
        use spool_runtime::store::exchange::{import_sessions, read_export, ImportOptions};
        use spool_runtime::store::{LogStore, LogStoreOptions};
        use spool_runtime::SessionStore;
        let store = LogStore::open(&fresh, LogStoreOptions::default()).unwrap();
        let sessions = read_export(text.as_bytes()).unwrap();
        import_sessions(&store, &sessions, &ImportOptions::default(), &mut || {}).unwrap();
        for s in &sessions {
            assert!(store.delete(&s.id).unwrap());
        }
    }
    assert!(session_ids(&fresh, &[]).is_empty(), "nothing visible");
    assert!(session_ids(&fresh, &["--status", "deleted"]).is_empty());

    // `stats` counts what `compact --gc` removes. The purged sessions are
    // dead; created again, their purged incarnations stay (a compaction
    // keeps a stream whole): live, and counted as kept.
    let s = json(&fresh, &["stats", "--json"]);
    let purged = s["bytes"]["dead_purged"].as_u64().unwrap();
    assert!(purged > 0, "{s}");
    assert_eq!(s["bytes"]["dead"].as_u64().unwrap(), purged, "{s}");
    assert_eq!(s["bytes"]["purged_kept"].as_u64().unwrap(), 0, "{s}");
    let good = write("good.jsonl", &text);
    let out = run(
        &fresh,
        &["import", good.to_str().unwrap(), "--fresh-commit-ids"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let s = json(&fresh, &["stats", "--json"]);
    assert_eq!(s["bytes"]["dead"].as_u64().unwrap(), 0, "{s}");
    assert_eq!(s["bytes"]["purged_kept"].as_u64().unwrap(), purged, "{s}");
    let records = s["bytes"]["records"].as_u64().unwrap();
    assert_eq!(s["bytes"]["live"].as_u64().unwrap(), records, "{s}");
    assert!(s["largest_entries"]
        .as_array()
        .unwrap()
        .iter()
        .all(|e| e["live"] == true));
    let gc = json(&fresh, &["compact", "--gc", "--json"]);
    assert_eq!(gc["dead_bytes"].as_u64().unwrap(), 0, "{gc}");
    assert_eq!(gc["dead_commits"].as_u64().unwrap(), 0, "{gc}");
    assert!(gc["streams_removed"].as_array().unwrap().is_empty(), "{gc}");
    // Nothing dead, but the erasing GC replaces content that rewrites in the
    // imported sessions superseded: records may only shrink.
    let s = json(&fresh, &["stats", "--json"]);
    assert!(s["bytes"]["records"].as_u64().unwrap() <= records, "{s}");
    assert_eq!(s["bytes"]["dead"].as_u64().unwrap(), 0, "{s}");
}

fn tree_of(dir: &Path, id: &str) -> (Value, Vec<Value>) {
    let t = json(dir, &["tree", id, "--json"]);
    let entries = t["entries"].as_array().unwrap().clone();
    (t["leaf"].clone(), entries)
}

fn labels(entries: &[Value]) -> BTreeMap<String, String> {
    entries
        .iter()
        .filter_map(|e| {
            Some((
                e["id"].as_str()?.to_string(),
                e.get("label")?.as_str()?.to_string(),
            ))
        })
        .collect()
}

/// (role, first text) of each context message.
fn context_of(dir: &Path, id: &str) -> Vec<(String, String)> {
    json(dir, &["context", id, "--json"])["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let text = m["content"]
                .as_array()
                .unwrap()
                .iter()
                .find_map(|b| b.get("text").and_then(Value::as_str))
                .unwrap_or("")
                .to_string();
            (m["role"].as_str().unwrap().to_string(), text)
        })
        .collect()
}

fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect()
}

#[test]
fn pi_files_of_all_three_versions_import_with_tree_leaf_labels_and_context() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let import = |name: &str| {
        let f = fixture(name);
        json(
            &store,
            &["import", "--format", "pi", f.to_str().unwrap(), "--json"],
        )
    };

    // v1: a linear chain with generated ids; the compaction's entry index
    // becomes its first kept entry.
    let rep = import("v1.jsonl");
    assert_eq!(rep["pi_version"], 1);
    assert_eq!(rep["sessions"][0]["entries"], 8);
    let (leaf, entries) = tree_of(&store, "pi-v1-session");
    assert_eq!(entries.len(), 8);
    for (i, e) in entries.iter().enumerate() {
        assert_eq!(e["depth"].as_u64().unwrap(), i as u64, "a linear chain");
        assert!(e["children"].as_array().unwrap().len() <= 1);
    }
    assert_eq!(leaf, entries[7]["id"], "the last entry is the leaf");
    assert_eq!(
        context_of(&store, "pi-v1-session"),
        pairs(&[
            (
                "compaction_summary",
                "The user listed the files: main.rs and lib.rs."
            ),
            ("assistant", "There are two files: main.rs and lib.rs."),
            ("user", "Which one is the entry point?"),
            ("assistant", "main.rs is the entry point."),
        ])
    );
    let shown = json(&store, &["show", "pi-v1-session", "--json"]);
    assert_eq!(shown["state"]["model"], "anthropic/claude-sonnet-4");
    assert_eq!(shown["state"]["metadata"]["pi.thinking_level"], "high");
    assert_eq!(shown["state"]["metadata"]["pi.cwd"], "/home/dev/project");
    assert_eq!(shown["header"]["agent_name"], "pi");
    assert_eq!(
        shown["header"]["created_at"].as_i64().unwrap(),
        1_740_823_200_000
    );

    // v2: ids and parents, a branch with a summary, hookMessage -> custom,
    // labels, a session name.
    let rep = import("v2.jsonl");
    assert_eq!(rep["pi_version"], 2);
    let (leaf, entries) = tree_of(&store, "pi-v2-session");
    assert_eq!(entries.len(), 11);
    assert_eq!(leaf, "c1000003");
    let branch = entries.iter().find(|e| e["id"] == "a1000002").unwrap();
    assert_eq!(
        branch["children"],
        serde_json::json!(["a1000003", "b1000001"])
    );
    let off_path: Vec<&str> = entries
        .iter()
        .filter(|e| e["on_path"] == false)
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(off_path, ["a1000003", "a1000004"]);
    assert_eq!(
        labels(&entries),
        BTreeMap::from([
            ("a1000004".to_string(), "plan-a".to_string()),
            ("b1000004".to_string(), "plan-b".to_string())
        ])
    );
    let b2 = entries.iter().find(|e| e["id"] == "b1000002").unwrap();
    assert_eq!(b2["kind"], "custom_message");
    assert_eq!(
        context_of(&store, "pi-v2-session"),
        pairs(&[
            ("user", "hello"),
            ("assistant", "Hi! What should we plan?"),
            ("branch_summary", "Plan A worked but was slow."),
            ("custom", "Remember to write tests."),
            ("user", "Try plan B"),
            ("assistant", "Plan B is done and fast."),
        ])
    );
    let header = json(&store, &["sessions", "--agent", "pi", "--json"]);
    let v2 = header
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["id"] == "pi-v2-session")
        .unwrap();
    assert_eq!(v2["label"], "Planning", "session_info names the session");

    // v3: model change, custom entry (never in the context), custom
    // message, bash execution, an aborted turn, a compaction keeping a
    // range, a side branch, a label as the leaf.
    let rep = import("v3.jsonl");
    assert_eq!(rep["pi_version"], 3);
    let (leaf, entries) = tree_of(&store, "pi-v3-session");
    assert_eq!(entries.len(), 13);
    assert_eq!(leaf, "d0000012");
    let fork = entries.iter().find(|e| e["id"] == "d0000004").unwrap();
    assert_eq!(
        fork["children"],
        serde_json::json!(["d0000005", "e0000001"])
    );
    assert_eq!(
        labels(&entries),
        BTreeMap::from([("d0000002".to_string(), "start".to_string())])
    );
    assert_eq!(
        context_of(&store, "pi-v3-session"),
        pairs(&[
            (
                "compaction_summary",
                "Read parser.rs; the first rewrite was aborted; tests fail."
            ),
            ("custom", "The parser must stay allocation-free."),
            (
                "custom",
                "Ran `cargo test`\n```\n1 failed\n```\n\nCommand exited with code 101"
            ),
            ("user", "Continue"),
            ("assistant", "Fixed: parse() now returns a value."),
        ])
    );
    let shown = json(&store, &["show", "pi-v3-session", "--json"]);
    assert_eq!(
        shown["state"]["model"], "anthropic/claude-opus-4",
        "latest model on the path"
    );
    assert_eq!(
        shown["header"]["created_at"].as_i64().unwrap(),
        1_746_252_000_000,
        "offset timestamps"
    );
    assert_eq!(
        shown["state"]["metadata"]["pi.parent_session"],
        "/home/dev/.pi/agent/sessions/older.jsonl"
    );

    // The same file again: refused, nothing changes.
    let before = streams(&store);
    let f = fixture("v3.jsonl");
    let err = fails(&store, &["import", "--format", "pi", f.to_str().unwrap()]);
    assert!(err.contains("already exists"), "{err}");
    assert_eq!(streams(&store), before);
    // A spool import of a pi file fails on line 1.
    let err = fails(&store, &["import", f.to_str().unwrap()]);
    assert!(err.contains("line 1"), "{err}");
}

#[test]
fn broken_pi_files_are_refused_with_the_line_number() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let v2 = std::fs::read_to_string(fixture("v2.jsonl")).unwrap();
    let cases: Vec<(String, usize, &str)> = vec![
        (
            v2.replace("\"parentId\":\"b1000002\"", "\"parentId\":\"zzzz0000\""),
            9,
            "dangling parent",
        ),
        (
            v2.replace("\"id\":\"b1000003\"", "\"id\":\"b1000002\""),
            9,
            "duplicate id",
        ),
        (
            v2.replace("\"type\":\"label\"", "\"type\":\"bookmark\""),
            11,
            "unknown entry type",
        ),
        (
            v2.replacen("\"version\":2", "\"version\":9", 1),
            1,
            "future version",
        ),
        (
            v2.replace("\"role\":\"hookMessage\"", "\"role\":\"robot\""),
            8,
            "unknown role",
        ),
    ];
    for (i, (body, line, what)) in cases.iter().enumerate() {
        let p = dir.path().join(format!("case{i}.jsonl"));
        std::fs::write(&p, body).unwrap();
        let err = fails(&store, &["import", "--format", "pi", p.to_str().unwrap()]);
        assert!(err.contains(&format!("line {line}:")), "{what}: {err}");
        assert!(
            !store.join("LOCK").exists() || session_ids(&store, &[]).is_empty(),
            "{what}"
        );
    }
}

/// Lines pi itself skips (not JSON: a cut last line, two objects glued
/// together) are skipped too, and each is reported by number.
#[test]
fn pi_files_with_lines_pi_skips_import_and_report_the_lines() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let v2 = std::fs::read_to_string(fixture("v2.jsonl")).unwrap();
    let lines: Vec<&str> = v2.lines().collect();
    // Insert lines 2 and 3 glued together after line 2, and cut the last
    // line short.
    let mut body: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    body.insert(2, format!("{}{}", lines[1], lines[2]));
    let last = body.len() - 1;
    let cut = body[last].len() - 20;
    body[last].truncate(cut);
    let p = dir.path().join("glued.jsonl");
    std::fs::write(&p, body.join("\n") + "\n").unwrap();
    let out = run(
        &store,
        &["import", "--format", "pi", p.to_str().unwrap(), "--json"],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let rep: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(rep["skipped_lines"], serde_json::json!([3, body.len()]));
    let err = stderr(&out);
    assert!(err.contains("line 3 skipped"), "{err}");
    assert!(
        err.contains(&format!("line {} skipped", body.len())),
        "{err}"
    );
    assert_eq!(session_ids(&store, &[]).len(), 1);
}

#[test]
fn replay_from_the_log_alone_gives_the_same_answers() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = demo(&store);
    json(&store, &["delete", &ids[1], "--json"]);
    // A session imported from a pi file, too.
    json(
        &store,
        &[
            "import",
            "--format",
            "pi",
            fixture("v2.jsonl").to_str().unwrap(),
            "--json",
        ],
    );
    let answers = |dir: &Path| {
        let mut all = vec![
            json(dir, &["sessions", "--json"]),
            json(dir, &["sessions", "--status", "deleted", "--json"]),
            json(dir, &["streams", "--json"]),
        ];
        for id in &ids {
            all.push(json(dir, &["show", id, "--json"]));
            all.push(json(dir, &["tree", id, "--json"]));
        }
        all
    };
    let before = answers(&store);
    let r = json(&store, &["replay", "--json"]);
    assert_eq!(r["old_index_matched"], true, "{r}");
    assert_eq!(r["differing_entries"], 0);
    assert_eq!(r["sessions"], 5);
    assert_eq!(r["sessions_by_status"]["deleted"], 1);
    assert_eq!(r["failed_sessions"].as_array().unwrap().len(), 0);
    assert!(r["commits"].as_u64().unwrap() > 0 && r["index_entries"].as_u64().unwrap() > 0);
    assert!(store.join("index").is_dir() && !store.join("index.rebuild").exists());
    assert_eq!(answers(&store), before, "answers after the rebuild");

    // Without any index at all: the same answers again.
    std::fs::remove_dir_all(store.join("index")).unwrap();
    let out = run(&store, &["replay"]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains("rebuilt the indexes"));
    assert_eq!(answers(&store), before);
    // The store is still writable and consistent.
    assert_eq!(json(&store, &["verify", "--json"])["ok"], true);
    json(&store, &["delete", &ids[0], "--json"]);

    // replay needs exclusive ownership of an existing store.
    let empty = tempfile::tempdir().unwrap();
    let err = fails(empty.path(), &["replay"]);
    assert!(err.contains("not a spool store"), "{err}");
}

/// An old index holding an entry the log does not give, and another with a value the
/// log does not give, is reported as differing in exactly those entries, and replaced.
#[test]
fn replay_reports_the_entries_in_which_the_old_index_differs_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    demo(&store);
    let changed_key = {
        use spool_runtime::store::LogStore;
        let ro = LogStore::open_read_only(&store).unwrap();
        let engine = ro.engine().unwrap();
        let (key, _) = engine
            .index()
            .entries()
            .map(Result::unwrap)
            .find(|(k, _)| k.first() == Some(&0x02))
            .expect("an indexer entry");
        drop(engine);
        drop(ro);
        // sled is a delta over the close's checkpoint, its values tagged (0: a value).
        let db = sled::open(store.join("index").join(spool_engine::INDEX_SLED_DIR)).unwrap();
        db.insert(&key, &b"\0not what the log says"[..]).unwrap();
        db.insert(&b"\x02zz-planted"[..], &b"\0x"[..]).unwrap();
        db.flush().unwrap();
        key
    };
    let out = run(&store, &["replay", "--json"]);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["old_index_matched"], false, "{r}");
    assert_eq!(r["differing_entries"], 2, "{r}");
    let keys: Vec<&str> = r["differing_keys"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k.as_str().unwrap())
        .collect();
    assert!(keys.contains(&"\\x02zz-planted"), "{keys:?}");
    let changed: String = changed_key
        .iter()
        .map(|&b| match b.is_ascii_graphic() {
            true => (b as char).to_string(),
            false => format!("\\x{b:02x}"),
        })
        .collect();
    assert!(keys.contains(&changed.as_str()), "{changed} in {keys:?}");
    // The rebuilt index is installed: a second replay finds nothing.
    let r = json(&store, &["replay", "--json"]);
    assert_eq!(r["old_index_matched"], true, "{r}");
}

/// Records `show --json` after every step of a scripted session, then asks
/// `replay ID --at-version N` for each N.
#[test]
fn replay_at_version_matches_the_session_as_saved_at_that_version() {
    use spool_runtime::session::{AgentDefinition, AgentSession, ModelConfig, SessionStatus};
    use spool_runtime::store::{LogStore, LogStoreOptions};
    use spool_runtime::transcript::{ContentBlock, EntryKind, Message, StopReason, Usage};
    use spool_runtime::SessionStore;

    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("store");
    let store = LogStore::open(&path, LogStoreOptions::default()).unwrap();
    fn user(t: &str) -> EntryKind {
        EntryKind::Message {
            message: Message::User {
                content: vec![ContentBlock::text(t)],
            },
        }
    }
    fn assistant(t: &str) -> EntryKind {
        EntryKind::Message {
            message: Message::Assistant {
                content: vec![ContentBlock::text(t)],
                stop_reason: StopReason::Stop,
                usage: Usage::default(),
                model: Some("anthropic/claude".into()),
                error_message: None,
            },
        }
    }
    let mut s = store
        .create(AgentSession::new(
            AgentDefinition::new("scripted", "d", "be brief"),
            None,
        ))
        .unwrap();
    let id = s.id().to_string();
    let mut saved: Vec<Value> = vec![json(&path, &["show", &id, "--json"])];
    let mut contexts: Vec<Value> =
        vec![json(&path, &["context", &id, "--json"])["messages"].clone()];
    type Step = Box<dyn Fn(&mut AgentSession)>;
    let first = std::rc::Rc::new(std::cell::RefCell::new(None));
    let f2 = first.clone();
    let steps: Vec<Step> = vec![
        Box::new(move |s| *f2.borrow_mut() = Some(s.append(user("first question")).unwrap())),
        Box::new(move |s| {
            s.append(assistant("first answer")).unwrap();
        }),
        Box::new(|s| {
            s.write_metadata("ticket", serde_json::json!("T-1"))
                .unwrap()
        }),
        Box::new(move |s| s.move_leaf(first.borrow().clone()).unwrap()),
        Box::new(|s| {
            s.append(assistant("another answer")).unwrap();
            s.append(user("follow-up")).unwrap();
        }),
        Box::new(|s| s.set_model(ModelConfig::new("openai", "gpt")).unwrap()),
        Box::new(|s| {
            s.set_status(SessionStatus::Suspended).unwrap();
        }),
    ];
    for step in &steps {
        step(&mut s);
        s = store.save(s).unwrap();
        saved.push(json(&path, &["show", &id, "--json"]));
        contexts.push(json(&path, &["context", &id, "--json"])["messages"].clone());
    }
    assert_eq!(saved.len() as u64, s.version());
    for (i, want) in saved.iter().enumerate() {
        let v = (i + 1).to_string();
        let got = json(&path, &["replay", &id, "--at-version", &v, "--json"]);
        // `show` is a document of its own, with its shape version.
        let mut want = want.clone();
        assert_eq!(
            want.as_object_mut().unwrap().remove("version"),
            Some(1.into())
        );
        assert_eq!(got["session"], want, "version {v}");
        assert_eq!(got["at_version"].as_u64().unwrap(), i as u64 + 1);
        assert_eq!(got["head_version"].as_u64().unwrap(), saved.len() as u64);
        assert_eq!(
            got["context"]["messages"], contexts[i],
            "context at version {v}"
        );
        assert_eq!(
            got["transcript"]["entries"].as_array().unwrap().len() as u64,
            want["state"]["entries"].as_u64().unwrap()
        );
        assert_eq!(got["transcript"]["leaf"], want["state"]["leaf"]);
    }
    let out = run(&path, &["replay", &id, "--at-version", "3"]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("as of version 3 of 8"));
    let head = (saved.len() + 1).to_string();
    let err = fails(&path, &["replay", &id, "--at-version", &head]);
    assert!(err.contains("has versions 1..=8"), "{err}");
    fails(&path, &["replay", &id, "--at-version", "0"]);
    let err = fails(&path, &["replay", &id]);
    assert!(err.contains("--at-version"), "{err}");
    fails(&path, &["replay", "no-such-session", "--at-version", "1"]);
    // The store is owned by this process: a rebuild is refused with a hint.
    let err = fails(&path, &["replay"]);
    assert!(err.contains("hint:") && err.contains("owner"), "{err}");
    drop(store);
}

/// A `postgres://` URL is never taken for a directory: every command that
/// works on the log's files refuses it in one line that says so (without
/// the URL's password), and nothing is created under the working directory.
#[test]
fn commands_that_need_a_store_directory_refuse_a_postgres_url() {
    let cwd = tempfile::tempdir().unwrap();
    std::fs::write(cwd.path().join("export.jsonl"), "").unwrap();
    let commands: [&[&str]; 10] = [
        &["streams"],
        &["log"],
        &["verify"],
        &["verify", "--salvage", "out"],
        &["compact", "--all", "--drop-aborted"],
        &["compact", "--gc"],
        &["replay"],
        &["replay", "0123abcd", "--at-version", "1"],
        &["stress", "--seconds", "0"],
        &["log", "--stream", "stress-0"],
    ];
    for url in [
        "postgres://u:secret@127.0.0.1:1/db",
        "postgresql://u@127.0.0.1:1/db?password=secret",
    ] {
        for args in commands {
            let out = spool()
                .current_dir(cwd.path())
                .arg("--store")
                .arg(url)
                .args(args)
                .env_remove("SPOOL_STORE")
                .stdin(Stdio::null())
                .output()
                .unwrap();
            let err = stderr(&out);
            assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
            assert_eq!(err.lines().count(), 1, "{args:?}: one line: {err}");
            assert!(
                err.starts_with(&format!(
                    "error: `spool {}` needs a store directory",
                    args[0]
                )),
                "{args:?}: {err}"
            );
            assert!(!err.contains("secret"), "{args:?}: password shown: {err}");
            assert!(out.stdout.is_empty(), "{args:?}");
        }
    }
    let left: Vec<_> = std::fs::read_dir(cwd.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left, vec![std::ffi::OsString::from("export.jsonl")]);
}

/// Every command `demo` suggests works on the store it built.
#[test]
fn demo_suggests_only_commands_that_work() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = run(&store, &["demo"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let suggested = suggestions(&text);
    assert!(suggested.len() >= 3, "{text}");
    for args in suggested {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run(&store, &args);
        assert!(out.status.success(), "{args:?}: {}", stderr(&out));
    }
}

/// The `spool --store X ARGS…` lines after "Explore further:" as ARGS.
fn suggestions(demo_text: &str) -> Vec<Vec<String>> {
    demo_text
        .split_once("Explore further:")
        .expect("demo suggests commands")
        .1
        .lines()
        .filter_map(|l| l.trim().strip_prefix("spool --store "))
        .map(|l| l.split_whitespace().skip(1).map(str::to_string).collect())
        .collect()
}

/// Session ids may be given by a unique prefix, git-style, to every
/// command that takes one; an ambiguous prefix lists the candidates and a
/// prefix that matches nothing says so.
#[test]
fn session_id_prefixes_resolve_uniquely_or_list_the_candidates() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = demo(&store);
    let id = &ids[0];
    let short = &id[..8];
    let shown = json(&store, &["show", short, "--json"]);
    assert_eq!(shown["header"]["id"], id.as_str());
    assert_eq!(
        json(&store, &["tree", short, "--json"])["session"],
        id.as_str()
    );
    assert_eq!(
        json(&store, &["context", short, "--json"]),
        json(&store, &["context", id, "--json"])
    );
    let children = json(&store, &["sessions", "--parent", short, "--json"]);
    assert_eq!(children.as_array().unwrap().len(), 1, "{children}");
    assert_eq!(
        json(&store, &["log", "--stream", short, "--json"]),
        json(&store, &["log", "--stream", id, "--json"])
    );
    let at = json(&store, &["replay", short, "--at-version", "1", "--json"]);
    assert_eq!(at["session"]["header"]["id"], id.as_str());
    let out = run(&store, &["export", short]);
    assert!(out.status.success(), "{}", stderr(&out));
    assert!(String::from_utf8_lossy(&out.stdout).contains(id.as_str()));
    let out = run(&store, &["compact", short, "--drop-aborted", "--dry-run"]);
    assert!(out.status.success(), "{}", stderr(&out));
    // Uppercase hex names the same session.
    let shown = json(&store, &["show", &short.to_ascii_uppercase(), "--json"]);
    assert_eq!(shown["header"]["id"], id.as_str());

    // Import two sessions whose ids share a prefix: it is ambiguous.
    let export = dir.path().join("one.jsonl");
    let out = run(&store, &["export", id, "--out", export.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&export).unwrap();
    let other = dir.path().join("twins");
    for suffix in ["0", "1"] {
        let twin = dir.path().join(format!("twin{suffix}.jsonl"));
        std::fs::write(
            &twin,
            text.replace(id.as_str(), &format!("twin-abcd-{suffix}")),
        )
        .unwrap();
        let out = run(
            &other,
            &["import", twin.to_str().unwrap(), "--fresh-commit-ids"],
        );
        assert!(out.status.success(), "{}", stderr(&out));
    }
    let err = fails(&other, &["show", "twin-abcd"]);
    assert!(err.contains("ambiguous"), "{err}");
    assert!(
        err.contains("twin-abcd-0") && err.contains("twin-abcd-1"),
        "{err}"
    );
    // An id that is whole is never taken for a prefix of a longer one.
    assert_eq!(
        json(&other, &["show", "twin-abcd-1", "--json"])["header"]["id"],
        "twin-abcd-1"
    );
    let err = fails(&store, &["show", "ffffffff"]);
    assert!(err.contains("no session ffffffff"), "{err}");
    let err = fails(&store, &["show", "abc"]);
    assert!(err.contains("at least 4 characters"), "{err}");
}

/// Two deletes of one session racing: the loser reports "already deleted"
/// and succeeds (the outcome it asked for holds) instead of failing with a
/// version conflict.
#[test]
fn a_delete_that_loses_a_race_to_another_delete_reports_already_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = demo(&store);
    let out = json(
        &store,
        &["delete", &ids[2], "--test-concurrent-delete", "--json"],
    );
    assert_eq!(out["already_deleted"], true, "{out}");
    assert_eq!(out["status"], "deleted");
    let shown = json(&store, &["show", &ids[2], "--json"]);
    assert_eq!(shown["header"]["status"], "deleted");
    assert_eq!(shown["header"]["version"], out["session_version"]);
    assert_eq!(out["version"], 1);
}

/// `tree` draws branches with box characters: `├─` starts a branch that
/// has a sibling after it, `└─` the last one, `│` continues the left
/// border past a branch's entries while a sibling branch is still to come.
#[test]
fn tree_draws_branches_with_box_characters() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = demo(&store);
    let out = run(&store, &["tree", &ids[0]]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let marks = ['●', '◉', '○'];
    let prefixes: Vec<&str> = text
        .lines()
        .take_while(|l| !l.is_empty())
        .map(|l| &l[..l.find(marks).expect("a mark on every entry line")])
        .collect();
    assert_eq!(
        prefixes,
        ["", "", "", "", "├─", "│ ", "│ ", "└─", "  "],
        "{text}"
    );
}

/// Every object `--json` document carries its shape version
/// (docs/json.md); arrays of rows stay arrays.
#[test]
fn json_documents_carry_their_shape_version() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let demo_doc = json(&store, &["demo", "--json"]);
    let ids: Vec<&str> = demo_doc["created"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    let export = dir.path().join("all.jsonl");
    let out = run(
        &store,
        &["export", "--all", "--out", export.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let docs: Vec<(&str, Value)> = vec![
        ("demo", demo_doc.clone()),
        ("show", json(&store, &["show", ids[0], "--json"])),
        ("tree", json(&store, &["tree", ids[0], "--json"])),
        ("stats", json(&store, &["stats", "--json"])),
        ("verify", json(&store, &["verify", "--json"])),
        (
            "replay --at-version",
            json(&store, &["replay", ids[0], "--at-version", "1", "--json"]),
        ),
        (
            "gc",
            json(&store, &["compact", "--gc", "--dry-run", "--json"]),
        ),
        ("delete", json(&store, &["delete", ids[3], "--json"])),
        ("replay", json(&store, &["replay", "--json"])),
        (
            "stress",
            json(&store, &["stress", "--seconds", "0", "--json"]),
        ),
        (
            "import",
            json(
                &dir.path().join("other"),
                &["import", export.to_str().unwrap(), "--json"],
            ),
        ),
    ];
    for (what, doc) in docs {
        assert!(doc.is_object(), "{what}: {doc}");
        assert_eq!(doc["version"], 1, "{what}: {doc}");
    }
    for args in [
        &["sessions", "--json"][..],
        &["streams", "--json"],
        &["log", "--json"],
    ] {
        assert!(json(&store, args).is_array(), "{args:?}");
    }
}

/// `context --format openai|anthropic` prints the context as the model
/// APIs take it: the system prompt present, every tool result answering a
/// call made before it; `context --json` carries the system prompt, model
/// and thinking level.
#[test]
fn context_prints_the_shapes_model_apis_take() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ids = demo(&store);
    let mut tool_results = 0;
    for id in &ids {
        let show = json(&store, &["show", id, "--json"]);
        let prompt = show["state"]["system_prompt"].as_str().unwrap().to_string();
        assert!(!prompt.is_empty(), "the demo sessions have system prompts");
        let ctx = json(&store, &["context", id, "--json"]);
        assert_eq!(ctx["system_prompt"], prompt.as_str());
        assert_eq!(ctx["session"], id.as_str());
        assert!(ctx.get("model").is_some() && ctx.get("thinking_level").is_some());
        let n = ctx["messages"].as_array().unwrap().len();

        let openai = json(&store, &["context", id, "--format", "openai", "--json"]);
        let msgs = openai["messages"].as_array().unwrap();
        assert_eq!(
            msgs[0],
            serde_json::json!({"role": "system", "content": prompt})
        );
        let mut calls = std::collections::HashSet::new();
        for m in msgs {
            for c in m["tool_calls"].as_array().into_iter().flatten() {
                assert_eq!(c["type"], "function");
                assert!(c["function"]["arguments"].is_string(), "{c}");
                calls.insert(c["id"].as_str().unwrap().to_string());
            }
            if m["role"] == "tool" {
                tool_results += 1;
                assert!(calls.contains(m["tool_call_id"].as_str().unwrap()), "{m}");
            }
            assert!(
                ["system", "user", "assistant", "tool"].contains(&m["role"].as_str().unwrap()),
                "{m}"
            );
        }
        assert!(msgs.len() >= n.min(1), "{openai}");

        let anthropic = json(&store, &["context", id, "--format", "anthropic", "--json"]);
        assert_eq!(anthropic["system"], prompt.as_str());
        let mut uses = std::collections::HashSet::new();
        for m in anthropic["messages"].as_array().unwrap() {
            assert!(m["role"] == "user" || m["role"] == "assistant", "{m}");
            for b in m["content"].as_array().unwrap() {
                match b["type"].as_str().unwrap() {
                    "tool_use" => {
                        assert_eq!(m["role"], "assistant");
                        uses.insert(b["id"].as_str().unwrap().to_string());
                    }
                    "tool_result" => {
                        assert_eq!(m["role"], "user");
                        assert!(uses.contains(b["tool_use_id"].as_str().unwrap()), "{b}");
                    }
                    "text" | "thinking" | "redacted_thinking" | "image" => {}
                    other => panic!("unexpected block {other}"),
                }
            }
        }
        // Without --json: the same body, pretty-printed.
        let out = run(&store, &["context", id, "--format", "anthropic"]);
        assert!(out.status.success(), "{}", stderr(&out));
        let text: Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(text, anthropic);
    }
    assert!(tool_results > 0, "the demo has tool calls");
}

/// A pi session with signed thinking, imported, replays to Anthropic with
/// each thinking block's signature.
#[test]
fn pi_thinking_signatures_reach_the_anthropic_body() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let lines = [
        r#"{"type":"session","version":3,"id":"signed","timestamp":"2025-01-01T00:00:00Z","cwd":"/w"}"#,
        r#"{"type":"message","id":"u1","parentId":null,"timestamp":"2025-01-01T00:00:01Z","message":{"role":"user","content":"hi"}}"#,
        r#"{"type":"message","id":"a1","parentId":"u1","timestamp":"2025-01-01T00:00:02Z","message":{"role":"assistant","provider":"anthropic","model":"claude-x","stopReason":"stop","content":[{"type":"thinking","thinking":"hm","thinkingSignature":"SIG-1"},{"type":"text","text":"hello"}]}}"#,
    ];
    let p = dir.path().join("signed.jsonl");
    std::fs::write(&p, lines.join("\n") + "\n").unwrap();
    json(
        &store,
        &["import", "--format", "pi", p.to_str().unwrap(), "--json"],
    );
    let body = json(
        &store,
        &["context", "signed", "--format", "anthropic", "--json"],
    );
    assert_eq!(body["model"], "claude-x");
    assert_eq!(
        body["messages"][1]["content"][0],
        serde_json::json!({"type": "thinking", "thinking": "hm", "signature": "SIG-1"})
    );
}
