//! `spool compact` run as a user would run it, against stores made by
//! `spool demo` and a store built through the library with long tool
//! results, secrets and aborted/errored assistant entries; plus the
//! version-conflict case at the library level (the same prepare/commit
//! sequence the command runs, with another writer committing in between).

use std::collections::BTreeMap;
use std::hash::{Hash as _, Hasher as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::Arc;

use serde_json::{json, Value};
use spool_runtime::actions::{ActionError, SessionAction};
use spool_runtime::handle::{HandleError, HandleOptions};
use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::session::{AgentDefinition, AgentSession, SessionId};
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::transcript::{
    truncate_tool_results, CancelToken, ContentBlock, EntryKind, Message, StopReason, Usage,
};
use spool_runtime::SessionRuntime;

const EXIT_CONFLICT: i32 = 3;
/// Event kinds as `log --json` names them.
const REWRITTEN: &str = "session.transcript_rewritten";
const APPENDED: &str = "session.entry_appended";

fn run(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_spool"))
        .arg("--store")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn spool")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json_of(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}\nstderr: {}",
            stdout(out),
            stderr(out)
        )
    })
}

fn ok_json(out: &Output) -> Value {
    assert!(
        out.status.success(),
        "spool failed: {}\nstderr: {}",
        out.status,
        stderr(out)
    );
    json_of(out)
}

/// A demo store; returns its session ids (research, fork, review, plan).
fn demo_store(dir: &Path) -> Vec<String> {
    let v = ok_json(&run(dir, &["demo", "--json"]));
    v["created"]
        .as_array()
        .expect("created ids")
        .iter()
        .map(|s| s.as_str().expect("id").to_string())
        .collect()
}

/// Every file under `dir` (the log segments, the lock file and the index)
/// with its length and a hash of its bytes.
fn store_fingerprint(dir: &Path) -> BTreeMap<PathBuf, (u64, u64)> {
    fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<PathBuf, (u64, u64)>) {
        for e in std::fs::read_dir(dir).expect("read_dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                walk(root, &p, out);
            } else {
                let bytes = std::fs::read(&p).expect("read store file");
                // SipHash with fixed keys: deterministic within the process.
                let mut h = std::collections::hash_map::DefaultHasher::new();
                bytes.hash(&mut h);
                let rel = p.strip_prefix(root).expect("under root").to_path_buf();
                out.insert(rel, (bytes.len() as u64, h.finish()));
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(dir, dir, &mut out);
    assert!(
        out.keys()
            .any(|p| p.extension().is_some_and(|x| x == "seg")),
        "no segment in {}",
        dir.display()
    );
    out
}

/// The log segments' part of a fingerprint.
fn segments(fp: &BTreeMap<PathBuf, (u64, u64)>) -> Vec<(PathBuf, (u64, u64))> {
    fp.iter()
        .filter(|(p, _)| p.extension().is_some_and(|x| x == "seg"))
        .map(|(p, v)| (p.clone(), *v))
        .collect()
}

fn session_ids(dir: &Path) -> Vec<String> {
    ok_json(&run(dir, &["sessions", "--json"]))
        .as_array()
        .expect("sessions array")
        .iter()
        .map(|s| s["id"].as_str().expect("id").to_string())
        .collect()
}

/// The context messages of `context --json`.
fn context(dir: &Path, id: &str) -> Value {
    ok_json(&run(dir, &["context", id, "--json"]))["messages"].clone()
}

fn contexts(dir: &Path) -> BTreeMap<String, Value> {
    session_ids(dir)
        .into_iter()
        .map(|id| {
            let c = context(dir, &id);
            (id, c)
        })
        .collect()
}

fn log_kinds(dir: &Path, id: &str) -> Vec<String> {
    ok_json(&run(dir, &["log", "--stream", id, "--json"]))
        .as_array()
        .expect("log array")
        .iter()
        .flat_map(|c| {
            c["events"]
                .as_array()
                .expect("events")
                .iter()
                .map(|e| e["kind"].as_str().expect("kind").to_string())
                .collect::<Vec<_>>()
        })
        .collect()
}

fn report_of<'a>(reports: &'a Value, id: &str) -> &'a Value {
    reports
        .as_array()
        .expect("compact --json is an array")
        .iter()
        .find(|r| r["session"] == id)
        .unwrap_or_else(|| panic!("no report for {id} in {reports}"))
}

fn texts(ctx: &Value) -> Vec<String> {
    ctx.as_array()
        .expect("context array")
        .iter()
        .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
        .filter_map(|b| b["text"].as_str().map(str::to_string))
        .collect()
}

// ---- a store built through the library --------------------------------

fn text(s: &str) -> Vec<ContentBlock> {
    vec![ContentBlock::Text { text: s.into() }]
}

fn user(s: &str) -> EntryKind {
    EntryKind::Message {
        message: Message::User { content: text(s) },
    }
}

fn assistant(s: &str, stop: StopReason) -> EntryKind {
    EntryKind::Message {
        message: Message::Assistant {
            content: text(s),
            stop_reason: stop,
            usage: Usage::default(),
            model: Some("test/model".into()),
            error_message: (stop == StopReason::Error).then(|| "upstream 529".to_string()),
        },
    }
}

fn tool_call(call: &str) -> EntryKind {
    EntryKind::Message {
        message: Message::Assistant {
            content: vec![ContentBlock::ToolCall {
                id: call.into(),
                name: "cat".into(),
                arguments: json!({"path": "big.log"}).into(),
                signature: None,
            }],
            stop_reason: StopReason::ToolUse,
            usage: Usage::default(),
            model: Some("test/model".into()),
            error_message: None,
        },
    }
}

fn tool_result(call: &str, body: &str) -> EntryKind {
    EntryKind::Message {
        message: Message::ToolResult {
            tool_call_id: call.into(),
            tool_name: "cat".into(),
            content: text(body),
            is_error: false,
        },
    }
}

fn custom(n: u64) -> EntryKind {
    EntryKind::Custom {
        custom_type: "plugin.state".into(),
        data: json!({"n": n}).into(),
    }
}

const SECRET: &str = "sk-LIVE0123456789";
const TOOL_BODY_LINES: usize = 400;

/// What [`library_store`] built.
struct Built {
    /// Session with long tool results, a secret and a trailing tail
    /// `aborted, custom, error` (plus an aborted entry mid-path and an
    /// aborted leaf on another branch, both of which must stay).
    tools: String,
    /// The two trailing entries `--drop-aborted` must remove.
    trailing: Vec<String>,
    /// The trailing custom entry that must be kept and re-parented.
    trailing_custom: String,
    /// The user entry the trailing tail hangs from.
    boundary: String,
    /// The aborted entry in the middle of the path.
    mid_aborted: String,
    /// The aborted leaf of the other branch.
    branch_aborted: String,
    /// A second session ending in a normal reply.
    plain: String,
}

fn open_rt(dir: &Path) -> (Arc<LogStore>, SessionRuntime) {
    let store = Arc::new(LogStore::open(dir, LogStoreOptions::default()).expect("open store"));
    let rt = SessionRuntime::new(
        store.clone() as Arc<dyn SessionStore>,
        Arc::new(NullSink),
        SessionHookStack::empty(),
    );
    (store, rt)
}

fn close(store: Arc<LogStore>, rt: SessionRuntime) {
    drop(rt);
    Arc::try_unwrap(store)
        .expect("no other holder of the store")
        .close()
        .expect("close store");
}

fn long_body(tag: &str) -> String {
    let mut s = String::new();
    for i in 0..TOOL_BODY_LINES {
        s.push_str(&format!("{tag} line {i:04}: ok\n"));
        if i == 7 {
            s.push_str(&format!("token={SECRET}\n"));
        }
    }
    s
}

fn library_store(dir: &Path) -> Built {
    let (store, rt) = open_rt(dir);
    let s = rt
        .create(
            AgentDefinition::new("coder", "Reads logs", "You read logs."),
            None,
        )
        .expect("create");
    let id = s.id().clone();
    let h = rt
        .open_handle(&id, HandleOptions::writer())
        .expect("writer handle");
    h.append(user("Read big.log")).expect("append");
    h.append(tool_call("c1")).expect("append");
    h.append(tool_result("c1", &long_body("first")))
        .expect("append");
    h.append(assistant(
        &format!("It is long; the token is {SECRET}."),
        StopReason::Stop,
    ))
    .expect("append");
    let fork_point = h.append(user("Again, please")).expect("append");
    let mid_aborted = h
        .append(assistant("I was interrupted", StopReason::Aborted))
        .expect("append");
    h.append(user("Continue")).expect("append");
    h.append(tool_call("c2")).expect("append");
    h.append(tool_result("c2", &long_body("second")))
        .expect("append");
    h.append(assistant("Done reading.", StopReason::Stop))
        .expect("append");
    let boundary = h.append(user("Summarize")).expect("append");
    let a1 = h
        .append(assistant("Summ", StopReason::Aborted))
        .expect("append");
    let trailing_custom = h.append(custom(1)).expect("append");
    let a2 = h.append(assistant("", StopReason::Error)).expect("append");
    // Another branch from the fork point ends in an aborted entry: not
    // trailing from the current leaf, so it stays.
    let leaf = h.snapshot().leaf.clone();
    h.move_leaf(Some(fork_point)).expect("move leaf");
    let branch_aborted = h
        .append(assistant("Other branch, cut", StopReason::Aborted))
        .expect("append");
    h.move_leaf(leaf).expect("move leaf back");
    drop(h);

    let p = rt
        .create(AgentDefinition::new("chat", "Talks", "You talk."), None)
        .expect("create");
    let pid = p.id().clone();
    let h = rt
        .open_handle(&pid, HandleOptions::writer())
        .expect("writer handle");
    h.append(user("Hello")).expect("append");
    h.append(assistant("Hi there.", StopReason::Stop))
        .expect("append");
    drop(h);
    close(store, rt);
    Built {
        tools: id.to_string(),
        trailing: vec![a2.to_string(), a1.to_string()],
        trailing_custom: trailing_custom.to_string(),
        boundary: boundary.to_string(),
        mid_aborted: mid_aborted.to_string(),
        branch_aborted: branch_aborted.to_string(),
        plain: pid.to_string(),
    }
}

/// `(entry id, parent id)` of every entry of the session's tree, and the
/// leaf, from `tree --json`.
fn tree_of(dir: &Path, id: &str) -> (BTreeMap<String, Option<String>>, Option<String>) {
    let v = ok_json(&run(dir, &["tree", id, "--json"]));
    let rows = v["entries"]
        .as_array()
        .expect("tree entries")
        .iter()
        .map(|r| {
            (
                r["id"].as_str().expect("id").to_string(),
                r["parent_id"].as_str().map(str::to_string),
            )
        })
        .collect();
    (rows, v["leaf"].as_str().map(str::to_string))
}

// ---- tests --------------------------------------------------------------

#[test]
fn dry_run_changes_no_byte_of_the_store() {
    let tmp = tempfile::tempdir().unwrap();
    let demo = tmp.path().join("demo");
    demo_store(&demo);
    let lib = tmp.path().join("lib");
    let built = library_store(&lib);

    for (dir, expect_planned) in [(&demo, 1usize), (&lib, 1usize)] {
        let before = store_fingerprint(dir);
        let ctx_before = contexts(dir);
        let args = [
            "compact",
            "--all",
            "--dry-run",
            "--truncate-tool-results",
            "1024",
            "--redact",
            r"src/\w+\.rs|sk-[A-Z0-9]+",
            "--drop-aborted",
        ];
        let mut json_args = args.to_vec();
        json_args.push("--json");
        let reports = ok_json(&run(dir, &json_args));
        let planned: Vec<&Value> = reports
            .as_array()
            .unwrap()
            .iter()
            .filter(|r| r["outcome"] == "planned")
            .collect();
        // The plan is real (something would change) and marked as a dry run.
        assert_eq!(planned.len(), expect_planned, "{reports}");
        for r in planned {
            assert_eq!(r["dry_run"], true);
            assert!(r["entries_touched"].as_u64().unwrap() > 0);
            assert!(r["version_after"].is_null());
        }
        let human = run(dir, &args);
        assert!(human.status.success(), "{}", stderr(&human));
        let text = stdout(&human);
        assert!(text.contains("BYTES BEFORE -> AFTER"), "{text}");
        assert!(text.contains("nothing was written"), "{text}");
        assert_eq!(
            store_fingerprint(dir),
            before,
            "a dry run changed the store's files"
        );
        assert_eq!(contexts(dir), ctx_before);
    }
    // The library store's plan names the intended entries.
    let reports = ok_json(&run(
        &lib,
        &[
            "compact",
            &built.tools,
            "--dry-run",
            "--drop-aborted",
            "--json",
        ],
    ));
    let r = report_of(&reports, &built.tools);
    let removed: Vec<&str> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["change"] == "removed")
        .map(|e| e["id"].as_str().unwrap())
        .collect();
    assert_eq!(removed, built.trailing);
}

#[test]
fn redaction_on_the_demo_store_changes_only_the_redacted_text() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let ids = demo_store(&dir);
    let pattern = r"src/\w+\.rs";
    let re = regex::Regex::new(pattern).unwrap();
    let before = contexts(&dir);
    assert!(
        before
            .values()
            .any(|c| texts(c).iter().any(|t| re.is_match(t))),
        "the demo has no text the pattern matches: the test would prove nothing"
    );

    let reports = ok_json(&run(
        &dir,
        &["compact", "--all", "--redact", pattern, "--json"],
    ));
    assert_eq!(reports.as_array().unwrap().len(), ids.len());
    let research = report_of(&reports, &ids[0]);
    assert_eq!(research["outcome"], "committed", "{research}");
    assert_eq!(research["entries_removed"], 0);
    assert!(research["transforms"]["redacted"].as_u64().unwrap() >= 3);
    assert!(research["version_after"]["generation"].as_u64().unwrap() > 0);

    // Every session's context is what it was, with exactly the matches in
    // text blocks replaced (tool-call arguments are not message text).
    let after = contexts(&dir);
    assert_eq!(
        after.keys().collect::<Vec<_>>(),
        before.keys().collect::<Vec<_>>()
    );
    for (id, ctx) in &before {
        let mut expected = ctx.clone();
        for m in expected.as_array_mut().unwrap() {
            for b in m["content"].as_array_mut().into_iter().flatten() {
                if let Some(t) = b.get("text").and_then(Value::as_str) {
                    let red = re.replace_all(t, "[redacted]").into_owned();
                    b["text"] = Value::String(red);
                }
            }
        }
        assert_eq!(after[id], expected, "session {id}");
    }
    assert!(log_kinds(&dir, &ids[0]).contains(&REWRITTEN.to_string()));
    // `show` reads the rewritten session's transcript head (generation,
    // entries, leaf) without its entries; a full fold says the same.
    let mut shown = ok_json(&run(&dir, &["show", &ids[0], "--json"]));
    // The document's format version, which `replay` has at its top.
    shown.as_object_mut().unwrap().remove("version");
    let version = shown["header"]["version"].to_string();
    let replayed = ok_json(&run(
        &dir,
        &["replay", &ids[0], "--at-version", &version, "--json"],
    ));
    assert_eq!(shown, replayed["session"]);
    assert!(
        shown["state"]["generation"].as_u64().unwrap() > 0,
        "{shown}"
    );
    for other in &ids[1..] {
        assert!(
            !log_kinds(&dir, other).contains(&REWRITTEN.to_string()),
            "unchanged session {other} was rewritten"
        );
    }

    // A second run finds nothing to change and writes nothing.
    let fp = store_fingerprint(&dir);
    let again = ok_json(&run(
        &dir,
        &["compact", "--all", "--redact", pattern, "--json"],
    ));
    for r in again.as_array().unwrap() {
        assert_eq!(r["outcome"], "unchanged", "{r}");
    }
    let fp_after = store_fingerprint(&dir);
    assert_eq!(
        segments(&fp_after),
        segments(&fp),
        "an empty plan appended to the log"
    );
}

#[test]
fn truncation_redaction_and_drop_aborted_on_a_library_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lib");
    let b = library_store(&dir);
    let before = context(&dir, &b.tools);
    let plain_before = context(&dir, &b.plain);
    let (tree_before, leaf_before) = tree_of(&dir, &b.tools);
    assert_eq!(leaf_before.as_deref(), Some(b.trailing[0].as_str()));
    assert!(texts(&before).iter().any(|t| t.contains(SECRET)));
    assert!(texts(&before).iter().any(|t| t.len() > 4096));

    let reports = ok_json(&run(
        &dir,
        &[
            "compact",
            "--all",
            "--truncate-tool-results",
            "1024",
            "--redact",
            "sk-[A-Z0-9]+",
            "--drop-aborted",
            "--json",
        ],
    ));
    let r = report_of(&reports, &b.tools);
    assert_eq!(r["outcome"], "committed", "{r}");
    assert_eq!(r["transforms"]["dropped_aborted"], 2);
    assert_eq!(r["transforms"]["preserved_custom"], 1);
    assert_eq!(r["transforms"]["truncated"], 2);
    // Both tool results hold the secret, and one assistant reply quotes it.
    assert_eq!(r["transforms"]["redacted"], 3);
    assert_eq!(r["entries_removed"], 2);
    assert_eq!(r["entries_reparented"], 1);
    assert_eq!(r["entries_delta"], -2);
    assert!(r["bytes_after"].as_u64().unwrap() < r["bytes_before"].as_u64().unwrap());
    assert_eq!(
        r["bytes_delta"].as_i64().unwrap(),
        r["bytes_after"].as_i64().unwrap() - r["bytes_before"].as_i64().unwrap()
    );
    // The removed leaf's nearest kept ancestor is the preserved custom entry.
    assert_eq!(r["leaf_after"], b.trailing_custom.as_str());
    let reparented: Vec<&Value> = r["entries"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["change"] == "reparented")
        .collect();
    assert_eq!(reparented.len(), 1);
    assert_eq!(reparented[0]["id"], b.trailing_custom.as_str());
    assert_eq!(reparented[0]["new_parent"], b.boundary.as_str());
    assert_eq!(report_of(&reports, &b.plain)["outcome"], "unchanged");

    // The context: the same messages (aborted and errored assistant
    // entries never reach it), with the tool results cut and the secret
    // gone; nothing else changed.
    let after = context(&dir, &b.tools);
    let msgs_before = before.as_array().unwrap();
    let msgs_after = after.as_array().unwrap();
    assert_eq!(msgs_after.len(), msgs_before.len());
    let marker = regex::Regex::new(r"\[truncated \d+ bytes\]$").unwrap();
    let mut cut = 0;
    for (old, new) in msgs_before.iter().zip(msgs_after) {
        assert_eq!(old["entry_id"], new["entry_id"]);
        assert_eq!(old["role"], new["role"]);
        if old == new {
            continue;
        }
        let old_t = texts(&json!([old])).join("");
        let new_t = texts(&json!([new])).join("");
        assert!(
            old_t.contains(SECRET) || (new["role"] == "tool_result" && old_t.len() > 1024),
            "entry {} changed without reason",
            old["entry_id"]
        );
        if new["role"] == "tool_result" {
            cut += 1;
            assert!(new_t.len() <= 1024, "{} bytes", new_t.len());
            assert!(marker.is_match(&new_t), "{new_t}");
            // Redacted before the cut (the secret sits in the kept head).
            assert!(new_t.contains("token=[redacted]"), "{new_t}");
        } else {
            assert_eq!(new_t, old_t.replace(SECRET, "[redacted]"));
        }
    }
    assert_eq!(cut, 2);
    assert!(!texts(&after).iter().any(|t| t.contains(SECRET)));
    // In the tree: only the two trailing entries are gone; the custom
    // entry among them hangs from the boundary now; the mid-path aborted
    // entry and the other branch's aborted leaf stay.
    let (tree_after, leaf_after) = tree_of(&dir, &b.tools);
    let mut expected = tree_before.clone();
    for t in &b.trailing {
        assert!(expected.remove(t).is_some());
    }
    expected.insert(b.trailing_custom.clone(), Some(b.boundary.clone()));
    assert_eq!(tree_after, expected);
    assert!(tree_after.contains_key(&b.mid_aborted));
    assert!(tree_after.contains_key(&b.branch_aborted));
    assert_eq!(leaf_after.as_deref(), Some(b.trailing_custom.as_str()));
    assert_eq!(context(&dir, &b.plain), plain_before);

    // Idempotent: a second run changes nothing.
    let again = ok_json(&run(
        &dir,
        &[
            "compact",
            &b.tools,
            "--truncate-tool-results",
            "1024",
            "--redact",
            "sk-[A-Z0-9]+",
            "--drop-aborted",
            "--json",
        ],
    ));
    assert_eq!(report_of(&again, &b.tools)["outcome"], "unchanged");
    assert_eq!(context(&dir, &b.tools), after);
}

#[test]
fn drop_aborted_keeps_a_session_whose_leaf_is_not_aborted() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let ids = demo_store(&dir);
    let before = contexts(&dir);
    let reports = ok_json(&run(
        &dir,
        &["compact", "--all", "--drop-aborted", "--json"],
    ));
    for id in &ids {
        let r = report_of(&reports, id);
        assert_eq!(r["outcome"], "unchanged", "{r}");
        assert_eq!(r["transforms"]["dropped_aborted"], 0);
    }
    assert_eq!(contexts(&dir), before);
}

/// The other writer of the conflict tests: the runtime's session pipeline
/// appends a custom entry (it does not go through the handle's writer slot).
struct AppendCustom;

impl SessionAction for AppendCustom {
    fn name(&self) -> &str {
        "append_custom"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.append(custom(99))?;
        Ok(())
    }
}

#[test]
fn a_commit_between_prepare_and_commit_is_a_version_conflict_library() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lib");
    let b = library_store(&dir);
    let (store, rt) = open_rt(&dir);
    let id = SessionId::parse(&b.tools).unwrap();
    let loaded_before = rt.get_session(&id).unwrap();
    let handle = rt.open_handle(&id, HandleOptions::writer()).unwrap();
    let snap = handle.snapshot();
    let replacements = truncate_tool_results(loaded_before.state().transcript.entries(), 1024);
    assert_eq!(replacements.len(), 2);
    let cancel = CancelToken::new();
    let prepared = handle
        .prepare_rewrite(replacements, snap.version, &cancel)
        .expect("prepare");
    assert!(prepared.bytes_delta() < 0);

    // Another writer commits, straight through the store as a second
    // process would (this process's pipeline refuses while the writer
    // handle is open).
    let mut other = rt.store().load(&id).unwrap().expect("stored");
    AppendCustom.execute(&mut other).expect("append");
    rt.store().save(other).expect("concurrent commit");
    let version_after_other = rt.session_info(&id).unwrap().version;

    match handle.commit_rewrite(prepared, &cancel) {
        Err(e @ HandleError::VersionConflict { .. }) => {
            assert_eq!(e.kind(), "version_conflict");
            assert!(e.to_string().contains("version conflict"), "{e}");
        }
        other => panic!("expected a version conflict, got {other:?}"),
    }
    // Nothing was written by the failed commit: the session is the
    // original plus the other writer's entry.
    assert_eq!(rt.session_info(&id).unwrap().version, version_after_other);
    let now = rt.get_session(&id).unwrap();
    let before_entries = loaded_before.state().transcript.entries();
    let now_entries = now.state().transcript.entries();
    assert_eq!(now_entries.len(), before_entries.len() + 1);
    assert_eq!(&now_entries[..before_entries.len()], before_entries);
    assert!(matches!(
        now_entries.last().map(|e| &e.kind),
        Some(EntryKind::Custom { custom_type, .. }) if custom_type == "plugin.state"
    ));
    drop(handle);
    close(store, rt);

    // The command plans against the new version and succeeds.
    let reports = ok_json(&run(
        &dir,
        &[
            "compact",
            &b.tools,
            "--truncate-tool-results",
            "1024",
            "--json",
        ],
    ));
    assert_eq!(report_of(&reports, &b.tools)["outcome"], "committed");
}

#[test]
fn a_commit_between_prepare_and_commit_is_a_version_conflict_cli() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lib");
    let b = library_store(&dir);
    let before = context(&dir, &b.tools);
    let kinds_before = log_kinds(&dir, &b.tools);

    // The hidden test hook commits a custom entry through the session
    // pipeline between the command's prepare and commit.
    let out = run(
        &dir,
        &[
            "compact",
            "--all",
            "--truncate-tool-results",
            "1024",
            "--test-concurrent-write",
            "--json",
        ],
    );
    assert_eq!(out.status.code(), Some(EXIT_CONFLICT), "{}", stderr(&out));
    let err = stderr(&out);
    assert!(err.contains("version conflict"), "{err}");
    assert!(err.contains("nothing was written"), "{err}");
    assert!(err.contains(&b.tools), "{err}");
    let reports = json_of(&out);
    let r = report_of(&reports, &b.tools);
    assert_eq!(r["outcome"], "conflict");
    assert!(r["error"].as_str().unwrap().contains("version conflict"));
    // The session without changes never reached the commit (empty plan).
    assert_eq!(report_of(&reports, &b.plain)["outcome"], "unchanged");

    // Only the hook's commit reached the log; the rewrite did not.
    let kinds_after = log_kinds(&dir, &b.tools);
    assert_eq!(kinds_after.len(), kinds_before.len() + 1);
    assert_eq!(kinds_after.last().map(String::as_str), Some(APPENDED));
    assert!(!kinds_after.contains(&REWRITTEN.to_string()));
    // Custom entries never reach the context: it is exactly as before.
    assert_eq!(context(&dir, &b.tools), before);

    // Human output of a conflict: same exit code and message.
    let out = run(
        &dir,
        &[
            "compact",
            &b.tools,
            "--truncate-tool-results",
            "1024",
            "--test-concurrent-write",
        ],
    );
    assert_eq!(out.status.code(), Some(EXIT_CONFLICT));
    assert!(stdout(&out).contains("conflict"), "{}", stdout(&out));
    assert!(stderr(&out).contains("run the command again"));
}

#[test]
fn usage_errors_exit_2_with_a_hint() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let ids = demo_store(&dir);
    let fp = store_fingerprint(&dir);
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["compact", &ids[0]], "nothing to do"),
        (
            vec!["compact", &ids[0], "--redact", "(unclosed"],
            "not a valid regular expression",
        ),
        (
            vec!["compact", &ids[0], "--redact", "x*"],
            "matches the empty string",
        ),
        (
            vec!["compact", "not an id!", "--drop-aborted"],
            "not a valid session id",
        ),
    ];
    for (args, needle) in cases {
        let out = run(&dir, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {}", stderr(&out));
        let err = stderr(&out);
        assert!(err.contains(needle), "{args:?}: {err}");
        assert!(err.contains("hint:"), "{args:?}: {err}");
    }
    // clap refuses a missing session and a session with --all.
    for args in [
        vec!["compact", "--drop-aborted"],
        vec!["compact", &ids[0], "--all", "--drop-aborted"],
        vec!["compact", "--gc", "--drop-aborted"],
    ] {
        let out = run(&dir, &args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
    }
    assert_eq!(
        store_fingerprint(&dir),
        fp,
        "a command refused before opening the store changed it"
    );

    // An unknown session is found out after the store is opened: the log
    // is untouched (the index engine may rewrite its own files on close).
    let out = run(
        &dir,
        &[
            "compact",
            "00000000-0000-4000-8000-000000000000",
            "--drop-aborted",
        ],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("no session"), "{}", stderr(&out));
    assert!(stderr(&out).contains("hint:"));
    assert_eq!(segments(&store_fingerprint(&dir)), segments(&fp));

    let not_store = tmp.path().join("empty");
    std::fs::create_dir_all(&not_store).unwrap();
    let out = run(&not_store, &["compact", "--all", "--drop-aborted"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("is not a spool store"));
    assert_eq!(std::fs::read_dir(&not_store).unwrap().count(), 0);

    let help = Command::new(env!("CARGO_BIN_EXE_spool"))
        .args(["compact", "--help"])
        .output()
        .unwrap();
    let h = stdout(&help);
    for flag in [
        "--truncate-tool-results",
        "--redact",
        "--drop-aborted",
        "--dry-run",
        "--all",
        "--json",
        "--gc",
    ] {
        assert!(h.contains(flag), "help lacks {flag}");
    }
    assert!(
        !h.contains("--test-concurrent-write"),
        "the test hook is hidden"
    );
}

#[test]
fn deleted_sessions_are_refused_by_id_and_skipped_by_all() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let ids = demo_store(&dir);
    let (store, rt) = open_rt(&dir);
    rt.delete(&SessionId::parse(&ids[2]).unwrap())
        .expect("delete");
    close(store, rt);

    let out = run(&dir, &["compact", &ids[2], "--redact", "engine"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr(&out).contains("deleted"), "{}", stderr(&out));

    let reports = ok_json(&run(
        &dir,
        &["compact", "--all", "--redact", "engine", "--json"],
    ));
    let listed: Vec<&str> = reports
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["session"].as_str().unwrap())
        .collect();
    assert_eq!(listed.len(), ids.len() - 1);
    assert!(!listed.contains(&ids[2].as_str()));
    assert!(!log_kinds(&dir, &ids[2]).contains(&REWRITTEN.to_string()));
}

// ---- erasure: `compact --gc` after rewrites ------------------------------

/// Files under `dir` (recursively, read as bytes) that contain `needle`.
fn files_containing(dir: &Path, needle: &str) -> Vec<PathBuf> {
    let mut hits = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("dir entry").path();
            if p.is_dir() {
                stack.push(p);
            } else {
                let b = std::fs::read(&p).expect("read");
                if b.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    hits.push(p);
                }
            }
        }
    }
    hits
}

/// The session as `show`, `context` and `tree` print it.
fn views(dir: &Path, id: &str) -> (Value, Value, Value) {
    (
        ok_json(&run(dir, &["show", id, "--json"])),
        ok_json(&run(dir, &["context", id, "--json"])),
        ok_json(&run(dir, &["tree", id, "--json"])),
    )
}

#[test]
fn gc_after_redaction_erases_the_secret_from_every_file_of_the_demo_store() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("demo");
    let ids = demo_store(&dir);
    // In the research session, in the fork's seed (copied from it) and in
    // the review session: appended entries and a fork's `created` event.
    let secrets = ["largest", "engine.rs"];
    for s in secrets {
        assert!(!files_containing(&dir, s).is_empty(), "{s} is in the store");
    }
    // An index checkpoint file holding the secret (as one written before the
    // GC would): an erasing GC removes every checkpoint file.
    std::fs::create_dir_all(dir.join("checkpoints")).unwrap();
    std::fs::write(
        dir.join("checkpoints").join("0000000000000001.ckpt"),
        "largest",
    )
    .unwrap();
    // So does an old index a cut-short `replay` left beside the real one.
    std::fs::create_dir_all(dir.join("index.old")).unwrap();
    std::fs::write(dir.join("index.old").join("db"), "largest").unwrap();
    let reports = ok_json(&run(
        &dir,
        &[
            "compact",
            "--all",
            "--redact",
            r"largest|engine\.rs",
            "--json",
        ],
    ));
    let committed = reports
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["outcome"] == "committed")
        .count();
    assert_eq!(committed, 3, "{reports}");
    // The rewrite alone leaves the old text in the log.
    assert!(!files_containing(&dir, "largest").is_empty());
    let before: Vec<_> = ids.iter().map(|id| views(&dir, id)).collect();
    let versions: Vec<Value> = ids.iter().map(|id| before_version(&dir, id)).collect();

    let gc = ok_json(&run(&dir, &["compact", "--gc", "--json"]));
    assert_eq!(gc["dry_run"], false);
    assert!(gc["erased_commits"].as_u64().unwrap() >= 4, "{gc}");
    assert_eq!(gc["index_rebuilt"], true, "{gc}");
    assert_eq!(gc["checkpoints_removed"], 1, "{gc}");
    assert!(
        gc["bytes_after"].as_u64().unwrap() < gc["bytes_before"].as_u64().unwrap(),
        "{gc}"
    );
    for s in secrets {
        assert_eq!(
            files_containing(&dir, s),
            Vec::<PathBuf>::new(),
            "{s} survived the GC"
        );
    }
    // Every session reads as it did after the redaction, at the same version.
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(views(&dir, id), before[i], "session {id}");
        assert_eq!(before_version(&dir, id), versions[i]);
    }
    let v = ok_json(&run(&dir, &["verify", "--json"]));
    assert_eq!(v["ok"], true, "{v}");
    // A rebuild from the log agrees with the rebuilt index.
    let r = run(&dir, &["replay"]);
    assert!(r.status.success(), "replay: {}", stderr(&r));

    // Time travel to a version before the redaction says it was erased.
    let research = &ids[0];
    let old = ok_json(&run(
        &dir,
        &["replay", research, "--at-version", "3", "--json"],
    ));
    assert!(old["erased_entries"].as_u64().unwrap() > 0, "{old}");
    assert!(!old.to_string().contains("largest"), "{old}");
    let text = run(&dir, &["replay", research, "--at-version", "3"]);
    assert!(text.status.success());
    assert!(stdout(&text).contains("erased"), "{}", stdout(&text));
    // The head version shows the redacted content and nothing erased.
    let head = before_version(&dir, research).as_u64().unwrap().to_string();
    let now = ok_json(&run(
        &dir,
        &["replay", research, "--at-version", &head, "--json"],
    ));
    assert_eq!(now["erased_entries"], 0, "{now}");

    // Nothing left: a second GC collects nothing.
    let again = ok_json(&run(&dir, &["compact", "--gc", "--json"]));
    assert_eq!(again["erased_commits"], 0, "{again}");
    assert_eq!(again["dead_commits"], 0, "{again}");
}

fn before_version(dir: &Path, id: &str) -> Value {
    ok_json(&run(dir, &["show", id, "--json"]))["header"]["version"].clone()
}

#[test]
fn gc_after_truncation_and_drop_aborted_erases_the_cut_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("lib");
    let b = library_store(&dir);
    // Lines past the truncation limit and the removed trailing reply.
    let cut = "second line 0399: ok";
    assert!(!files_containing(&dir, cut).is_empty());
    ok_json(&run(
        &dir,
        &[
            "compact",
            "--all",
            "--truncate-tool-results",
            "1024",
            "--drop-aborted",
            "--json",
        ],
    ));
    let before = views(&dir, &b.tools);
    let plain = views(&dir, &b.plain);
    let gc = ok_json(&run(&dir, &["compact", "--gc", "--json"]));
    assert!(gc["erased_commits"].as_u64().unwrap() >= 2, "{gc}");
    assert_eq!(files_containing(&dir, cut), Vec::<PathBuf>::new());
    // Content no rewrite touched stays.
    assert!(!files_containing(&dir, "first line 0000: ok").is_empty());
    assert_eq!(views(&dir, &b.tools), before);
    assert_eq!(views(&dir, &b.plain), plain);
    let v = ok_json(&run(&dir, &["verify", "--json"]));
    assert_eq!(v["ok"], true, "{v}");
}
