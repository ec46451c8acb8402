//! Black-box tests of the `spool` binary, run as a user would run it.
//!
//! One integration-test binary with small helpers. Randomized tests print
//! their seed; set `SPOOL_TEST_SEED` to reproduce a run.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

fn spool() -> Command {
    Command::new(env!("CARGO_BIN_EXE_spool"))
}

/// Runs `spool --store DIR args...` and returns its output.
fn run(dir: &Path, args: &[&str]) -> Output {
    spool()
        .arg("--store")
        .arg(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn spool")
}

fn stdout_json(out: &Output) -> serde_json::Value {
    // A report that found problems (verify exits 1) is on stdout.
    assert!(
        out.status.success(),
        "spool failed: {}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// SplitMix64: a tiny deterministic generator for test schedules.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

fn test_seed(name: &str) -> u64 {
    let seed = std::env::var("SPOOL_TEST_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(1)
        });
    eprintln!("{name}: seed {seed} (rerun with SPOOL_TEST_SEED={seed})");
    seed
}

fn streams_of(dir: &Path) -> BTreeMap<String, u64> {
    let v = stdout_json(&run(dir, &["streams", "--json"]));
    v.as_array()
        .expect("streams --json is an array")
        .iter()
        .map(|s| {
            (
                s["stream"].as_str().expect("stream").to_string(),
                s["version"].as_u64().expect("version"),
            )
        })
        .collect()
}

/// Highest acknowledged version per stream, from complete ack lines only
/// (a line cut by the kill has no trailing newline and was never relied
/// on), and how many lines were cut short by a kill. A kill can cut a line
/// in the middle of the file too: a `write` that straddles a page boundary
/// of the file is cut between the pages, and the next `spool stress` ends
/// that fragment with a newline before it appends. Such a fragment is the
/// stream name alone, or it with a prefix of the version's digits (a
/// smaller version, so never more than was acknowledged); the former is
/// counted and skipped.
fn acked(ack: &Path) -> (BTreeMap<String, u64>, usize) {
    let text = std::fs::read_to_string(ack).unwrap_or_default();
    let mut m = BTreeMap::new();
    let mut cut = 0;
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    for line in complete.lines() {
        let mut it = line.split(' ');
        match (it.next(), it.next(), it.next()) {
            (Some(s), Some(v), None) if s.starts_with("stress-") => match v.parse::<u64>() {
                Ok(v) => {
                    let e = m.entry(s.to_string()).or_insert(0);
                    *e = (*e).max(v);
                }
                Err(_) if v.is_empty() => cut += 1,
                Err(e) => panic!("malformed ack line {line:?}: {e}"),
            },
            (Some(s), None, None) if "stress-".starts_with(s) || s.starts_with("stress-") => {
                cut += 1
            }
            _ => panic!("malformed ack line {line:?}"),
        }
    }
    (m, cut)
}

/// Found by CI: the buffered kill loop read `stress-… 12stress-… 13` as one
/// ack line. A kill had cut a line (its `write` straddled a page boundary of
/// the file) and the next run appended right after the fragment. `spool
/// stress` now ends such a fragment with a newline first, and the reader
/// tells the fragments apart from acknowledgements.
#[test]
fn an_ack_line_cut_by_a_kill_is_ended_before_the_next_run_appends() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ack = dir.path().join("acks");
    std::fs::write(&ack, "stress-0 1\nstress-1 \nstres\nstress-0 2\nstress-1").unwrap();
    let out = run(
        &store,
        &[
            "stress",
            "--writers",
            "2",
            "--seconds",
            "0.2",
            "--durability",
            "buffered",
            "--ack-file",
            ack.to_str().unwrap(),
            "--json",
        ],
    );
    stdout_json(&out);
    let text = std::fs::read_to_string(&ack).unwrap();
    assert!(
        text.starts_with("stress-0 1\nstress-1 \nstres\nstress-0 2\nstress-1\nstress-"),
        "the fragment was not ended: {:?}",
        &text[..text.len().min(80)]
    );
    let (acks, cut) = acked(&ack);
    assert_eq!(cut, 3, "the three fragments");
    let streams = streams_of(&store);
    assert_eq!(acks, streams, "every acknowledged commit, and only those");
}

#[test]
fn stress_then_verify_streams_and_log() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ack = dir.path().join("acks");
    let out = run(
        &store,
        &[
            "stress",
            "--writers",
            "3",
            "--seconds",
            "0.5",
            "--payload-bytes",
            "100",
            "--ack-file",
            ack.to_str().unwrap(),
            "--json",
        ],
    );
    let summary = stdout_json(&out);
    let commits = summary["commits"].as_u64().unwrap();
    assert!(commits > 0, "stress made no commits: {summary}");
    assert!(summary["fsyncs"].as_u64().unwrap() > 0);
    let (acked, cut) = acked(&ack);
    assert_eq!(cut, 0, "no run was killed, yet an ack line was cut");
    let streams = streams_of(&store);
    assert_eq!(acked, streams, "every acknowledged commit is in the store");
    assert_eq!(streams.values().sum::<u64>(), commits);

    let v = stdout_json(&run(&store, &["verify", "--json"]));
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["commits"].as_u64().unwrap(), commits);
    assert_eq!(v["streams"].as_u64().unwrap(), 3);
    assert_eq!(v["torn_tail_bytes"].as_u64().unwrap(), 0);

    let log = stdout_json(&run(&store, &["log", "--stream", "stress-1", "--json"]));
    let log = log.as_array().unwrap();
    assert_eq!(log.len() as u64, streams["stress-1"]);
    for (i, c) in log.iter().enumerate() {
        assert_eq!(c["version"].as_u64().unwrap(), i as u64 + 1);
        assert_eq!(c["stream"], "stress-1");
    }
    let all = stdout_json(&run(&store, &["log", "--json"]));
    let seqs: Vec<u64> = all
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["seq"].as_u64().unwrap())
        .collect();
    assert_eq!(
        seqs,
        (1..=commits).collect::<Vec<_>>(),
        "dense global sequence"
    );
}

#[test]
fn verify_reports_mid_log_corruption_with_segment_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // Small segments so that several are sealed.
    let out = run(
        &store,
        &[
            "stress",
            "--seconds",
            "0.3",
            "--payload-bytes",
            "2000",
            "--segment-bytes",
            "65536",
            "--durability",
            "buffered",
            "--json",
        ],
    );
    stdout_json(&out);
    let mut segs: Vec<_> = std::fs::read_dir(&store)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    assert!(segs.len() >= 3, "want several segments, got {}", segs.len());
    // Flip one byte in the middle of the first (sealed) segment.
    let victim = &segs[0];
    let mut bytes = std::fs::read(victim).unwrap();
    let at = 4096.min(bytes.len() / 2);
    bytes[at] ^= 0x40;
    std::fs::write(victim, &bytes).unwrap();

    let out = run(&store, &["verify", "--json"]);
    assert_eq!(out.status.code(), Some(1), "verify exits 1 on corruption");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["ok"], false);
    let errs = v["errors"].as_array().unwrap();
    assert!(!errs.is_empty());
    let name = victim.file_name().unwrap().to_str().unwrap();
    assert_eq!(errs[0]["segment"], name, "{v}");
    assert!(errs[0]["offset"].as_u64().unwrap() <= at as u64);

    // A writer that must read the damaged record (no checkpoint to start
    // after it) refuses to open, naming segment and offset.
    std::fs::remove_dir_all(store.join("checkpoints")).unwrap();
    let out = run(&store, &["stress", "--seconds", "0"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(name), "error names the segment: {err}");
}

/// kill -9 a durable writer at random moments, many times: every acknowledged
/// commit survives, the store always reopens, verify finds it sound.
/// `SPOOL_KILL_ITERATIONS` raises the count (e.g. for a run of hours).
#[test]
fn kill_dash_nine_loop_loses_no_acknowledged_commit() {
    kill_dash_nine_loop("kill_dash_nine_loop", "immediate");
}

/// The same with buffered writers: a `Buffered` acknowledgement is in the
/// page cache, which a killed process does not take with it, so every
/// acknowledged commit must survive a `kill -9` as well (power loss is the
/// crash simulation's part). Buffered segments are zero-filled ahead like
/// durable ones, so the writer is also killed in the middle of a segment
/// whose tail is zeros.
#[test]
fn kill_dash_nine_loop_of_buffered_writers_loses_no_acknowledged_commit() {
    kill_dash_nine_loop("kill_dash_nine_loop_buffered", "buffered");
}

/// Starts `spool stress` with the given durability (1 to 4 writers, random
/// payloads, 256 KiB segments) and kills it after a random 20 to 420 ms,
/// `SPOOL_KILL_ITERATIONS` times (25 by default) on one store; after each
/// kill, `verify` must find the store sound and every acknowledged version
/// must be there.
fn kill_dash_nine_loop(name: &str, durability: &str) {
    let iterations: u64 = std::env::var("SPOOL_KILL_ITERATIONS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(25);
    let seed = test_seed(name);
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let ack = dir.path().join("acks");
    for i in 0..iterations {
        let writers = 1 + rng.below(4);
        let mut child = spool()
            .arg("--store")
            .arg(&store)
            .args([
                "stress",
                "--writers",
                &writers.to_string(),
                "--seconds",
                "30",
                "--payload-bytes",
                &(1 + rng.below(3000)).to_string(),
                "--segment-bytes",
                "262144",
                "--durability",
                durability,
                "--ack-file",
                ack.to_str().unwrap(),
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn stress");
        std::thread::sleep(Duration::from_millis(20 + rng.below(400)));
        child.kill().expect("SIGKILL");
        let status = child.wait().unwrap();
        assert!(
            !status.success() || status.code().is_some(),
            "iteration {i}"
        );

        let has_segment = std::fs::read_dir(&store)
            .map(|rd| {
                rd.flatten()
                    .any(|e| e.path().extension().is_some_and(|x| x == "seg"))
            })
            .unwrap_or(false);
        if !has_segment {
            // Killed before the first segment existed (a slow start on a
            // loaded machine): then nothing can have been acknowledged, and
            // the tools rightly call the directory no store yet.
            assert!(
                acked(&ack).0.is_empty(),
                "iteration {i} (seed {seed}): acknowledged commits but no segment"
            );
            continue;
        }
        let v = stdout_json(&run(&store, &["verify", "--json"]));
        assert_eq!(v["ok"], true, "iteration {i} (seed {seed}): {v}");
        let streams = streams_of(&store);
        let (acks, cut) = acked(&ack);
        // A kill cuts at most the one line being written.
        assert!(
            cut <= i as usize + 1,
            "iteration {i} (seed {seed}): {cut} ack lines cut by {} kills",
            i + 1
        );
        for (s, acked_v) in acks {
            let have = streams.get(&s).copied().unwrap_or(0);
            assert!(
                have >= acked_v,
                "iteration {i} (seed {seed}): {s} acknowledged v{acked_v} but store has v{have}"
            );
        }
    }
    // The store still takes writes after all that.
    let out = run(
        &store,
        &[
            "stress",
            "--seconds",
            "0.1",
            "--durability",
            durability,
            "--json",
        ],
    );
    stdout_json(&out);
}

#[test]
fn missing_store_argument_says_what_to_do() {
    let out = spool()
        .args(["streams"])
        .env_remove("SPOOL_STORE")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--store"), "{err}");
}

#[test]
fn not_a_store_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let out = run(dir.path(), &["verify"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a spool store"));
}

/// The main job: `demo` builds a store, and every inspection command works
/// on it as a user would run it.
#[test]
fn demo_then_inspect_every_session() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = run(&store, &["demo"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("Built a sample store"), "{text}");

    let sessions = stdout_json(&run(&store, &["sessions", "--json"]));
    let sessions = sessions.as_array().unwrap();
    assert_eq!(sessions.len(), 4, "{sessions:?}");
    for key in [
        "id",
        "parent_id",
        "status",
        "version",
        "agent_name",
        "label",
        "created_at",
        "updated_at",
    ] {
        assert!(sessions[0].get(key).is_some(), "header lacks {key}");
    }
    let statuses: Vec<&str> = sessions
        .iter()
        .map(|s| s["status"].as_str().unwrap())
        .collect();
    assert!(statuses.contains(&"suspended") && statuses.contains(&"completed"));
    let suspended = stdout_json(&run(
        &store,
        &["sessions", "--status", "suspended", "--json"],
    ));
    assert_eq!(suspended.as_array().unwrap().len(), 1);
    let researchers = stdout_json(&run(
        &store,
        &["sessions", "--agent", "researcher", "--json"],
    ));
    assert_eq!(researchers.as_array().unwrap().len(), 2);
    let fork = researchers
        .as_array()
        .unwrap()
        .iter()
        .find(|s| !s["parent_id"].is_null())
        .expect("the fork");
    let parent = fork["parent_id"].as_str().unwrap();
    let children = stdout_json(&run(&store, &["sessions", "--parent", parent, "--json"]));
    assert_eq!(children.as_array().unwrap()[0]["id"], fork["id"]);

    // `show` reads a session's settings and transcript head, never its
    // entries; a full fold of every event (`replay --at-version`) says the
    // same of every session.
    for s in sessions {
        let (id, version) = (s["id"].as_str().unwrap(), s["version"].to_string());
        let mut shown = stdout_json(&run(&store, &["show", id, "--json"]));
        // The document's format version, which `replay` has at its top.
        shown.as_object_mut().unwrap().remove("version");
        let replayed = stdout_json(&run(
            &store,
            &["replay", id, "--at-version", &version, "--json"],
        ));
        assert_eq!(shown, replayed["session"], "session {id}");
    }

    let shown = stdout_json(&run(&store, &["show", parent, "--json"]));
    assert_eq!(shown["header"]["id"], parent);
    assert_eq!(shown["definition"]["name"], "researcher");
    assert_eq!(shown["state"]["metadata"]["ticket"], "OPS-142");
    assert_eq!(shown["state"]["tasks"].as_array().unwrap().len(), 3);

    let tree = stdout_json(&run(&store, &["tree", parent, "--json"]));
    let entries = tree["entries"].as_array().unwrap();
    assert!(
        entries
            .iter()
            .any(|e| e["children"].as_array().unwrap().len() == 2),
        "a branch point"
    );
    assert_eq!(entries.iter().filter(|e| e["is_leaf"] == true).count(), 1);

    let ctx = stdout_json(&run(&store, &["context", parent, "--json"]));
    assert_eq!(ctx["version"], 1);
    assert!(ctx["budget"].is_null());
    let roles: Vec<&str> = ctx["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "tool_result",
            "assistant",
            "user",
            "assistant"
        ],
        "the active branch only, tool call paired with its result"
    );
    let small = stdout_json(&run(
        &store,
        &["context", parent, "--budget-bytes", "600", "--json"],
    ));
    assert!(small["messages"].as_array().unwrap().len() < roles.len());
    let budget = &small["budget"];
    assert_eq!(budget["bytes_max"], 600);
    assert_eq!(budget["complete"], false);
    let left_out = budget["omitted"].as_array().unwrap().len()
        + budget["beyond_budget"].as_array().unwrap().len();
    assert_eq!(
        budget["resident_entries"].as_u64().unwrap() + left_out as u64,
        budget["context_entries"].as_u64().unwrap(),
        "{budget}"
    );

    for args in [&["show", "nope"][..], &["tree", "a/b"][..]] {
        let out = run(&store, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!out.stderr.is_empty());
    }
    let v = stdout_json(&run(&store, &["verify", "--json"]));
    assert_eq!(v["ok"], true);
}

/// Hashes every file of a directory tree (path and bytes), to prove a
/// command wrote nothing.
fn tree_digest(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

fn dir_bytes(dir: &Path) -> u64 {
    tree_digest(dir)
        .iter()
        .filter(|(p, _)| p.extension().is_some_and(|x| x == "seg"))
        .map(|(_, b)| b.len() as u64)
        .sum()
}

/// `compact --gc` reclaims the records of deleted sessions from sealed
/// segments; `--dry-run` only shows the plan; live sessions read the same.
#[test]
fn compact_gc_reclaims_deleted_sessions() {
    use spool_runtime::actions::SendMessage;
    use spool_runtime::agent_loop::ScriptedLoopFactory;
    use spool_runtime::hooks::SessionHookStack;
    use spool_runtime::observer::NullSink;
    use spool_runtime::session::AgentDefinition;
    use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
    use spool_runtime::SessionRuntime;
    use std::sync::Arc;

    let dir = tempfile::tempdir().unwrap();
    let store_dir = dir.path().join("store");
    let mut ids = Vec::new();
    {
        let store = Arc::new(
            LogStore::open(
                &store_dir,
                LogStoreOptions {
                    segment_bytes_max: Some(64 * 1024),
                    ..Default::default()
                },
            )
            .unwrap(),
        );
        let rt = SessionRuntime::new(
            store.clone() as Arc<dyn SessionStore>,
            Arc::new(NullSink),
            SessionHookStack::empty(),
        );
        let loops = Arc::new(ScriptedLoopFactory::echo());
        for i in 0..6 {
            let s = rt
                .create(AgentDefinition::new(format!("a{i}"), "d", "p"), None)
                .unwrap();
            for j in 0..20 {
                let text = format!("{i}-{j} {}", "x".repeat(2000));
                rt.execute(s.id(), &SendMessage::new(text, loops.clone()))
                    .unwrap();
            }
            ids.push(s.id().to_string());
        }
        for id in &ids[..3] {
            rt.delete(&spool_runtime::session::SessionId::parse(id).unwrap())
                .unwrap();
        }
    }
    let live_before: Vec<serde_json::Value> = ids[3..]
        .iter()
        .map(|id| stdout_json(&run(&store_dir, &["show", id, "--json"])))
        .collect();
    let ctx_before: Vec<serde_json::Value> = ids[3..]
        .iter()
        .map(|id| stdout_json(&run(&store_dir, &["context", id, "--json"])))
        .collect();

    let before = tree_digest(&store_dir);
    let plan = stdout_json(&run(
        &store_dir,
        &["compact", "--gc", "--dry-run", "--json"],
    ));
    assert_eq!(plan["dry_run"], true);
    assert!(plan["dead_bytes"].as_u64().unwrap() > 100_000, "{plan}");
    assert!(plan["reclaimed_bytes"].as_u64().unwrap() > 0, "{plan}");
    // Every commit of the deleted sessions in sealed segments is dead (their
    // last commits may sit in the active segment, which GC never touches).
    assert!(plan["dead_commits"].as_u64().unwrap() >= 50, "{plan}");
    assert_eq!(
        plan["segments"].as_array().unwrap()[0]["live_commits"],
        0,
        "the first segments hold only the deleted sessions: {plan}"
    );
    // A dry run opens the store as owner (to plan) but writes no log bytes.
    let after_dry = tree_digest(&store_dir);
    let segs = |d: &Vec<(std::path::PathBuf, Vec<u8>)>| -> Vec<(std::path::PathBuf, Vec<u8>)> {
        d.iter()
            .filter(|(p, _)| p.extension().is_some_and(|x| x == "seg"))
            .cloned()
            .collect()
    };
    assert_eq!(segs(&before), segs(&after_dry), "dry run changed the log");

    let seg_bytes_before = dir_bytes(&store_dir);
    let done = stdout_json(&run(&store_dir, &["compact", "--gc", "--json"]));
    assert_eq!(done["dry_run"], false);
    assert!(done["bytes_after"].as_u64().unwrap() < done["bytes_before"].as_u64().unwrap());
    let seg_bytes_after = dir_bytes(&store_dir);
    assert!(
        seg_bytes_after < seg_bytes_before,
        "segments {seg_bytes_before} -> {seg_bytes_after}"
    );
    let v = stdout_json(&run(&store_dir, &["verify", "--json"]));
    assert_eq!(v["ok"], true, "{v}");
    for (i, id) in ids[3..].iter().enumerate() {
        assert_eq!(
            stdout_json(&run(&store_dir, &["show", id, "--json"])),
            live_before[i]
        );
        assert_eq!(
            stdout_json(&run(&store_dir, &["context", id, "--json"])),
            ctx_before[i]
        );
    }
    let all = stdout_json(&run(
        &store_dir,
        &["sessions", "--status", "deleted", "--json"],
    ));
    assert!(
        all.as_array().unwrap().is_empty(),
        "deleted sessions reclaimed: {all}"
    );
    // A second GC finds nothing more to do.
    let again = stdout_json(&run(&store_dir, &["compact", "--gc", "--json"]));
    assert_eq!(again["dead_commits"], 0, "{again}");
}

/// `verify --salvage OUT_DIR` copies every readable commit around mid-log
/// corruption into a new, sound store and reports the loss.
#[test]
fn verify_salvage_recovers_around_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let out = run(
        &store,
        &[
            "stress",
            "--writers",
            "2",
            "--seconds",
            "0.3",
            "--payload-bytes",
            "2000",
            "--segment-bytes",
            "65536",
            "--durability",
            "buffered",
            "--json",
        ],
    );
    stdout_json(&out);
    let total: u64 = streams_of(&store).values().sum();
    let mut segs: Vec<_> = std::fs::read_dir(&store)
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "seg"))
        .collect();
    segs.sort();
    assert!(segs.len() >= 3);
    let victim = &segs[1];
    let mut bytes = std::fs::read(victim).unwrap();
    bytes[5000] ^= 0x01;
    std::fs::write(victim, &bytes).unwrap();

    let salvaged = dir.path().join("salvaged");
    let out = run(
        &store,
        &["verify", "--salvage", salvaged.to_str().unwrap(), "--json"],
    );
    assert_eq!(out.status.code(), Some(1), "something was lost");
    let r: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let lost = r["unreadable"].as_array().unwrap();
    assert!(!lost.is_empty(), "{r}");
    assert_eq!(
        lost[0]["segment"],
        victim.file_name().unwrap().to_str().unwrap()
    );
    let copied = r["commits_copied"].as_u64().unwrap();
    assert!(copied > 0 && copied < total, "copied {copied} of {total}");
    let v = stdout_json(&run(&salvaged, &["verify", "--json"]));
    assert_eq!(v["ok"], true, "the salvaged store is sound: {v}");
    // The damaged store was not written.
    assert_eq!(std::fs::read(victim).unwrap(), bytes);
}

/// A closed stdout (`spool … | head`) ends a command quietly with success,
/// like a well-behaved Unix tool; it never panics.
#[test]
fn broken_pipe_is_success() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    // Enough commits that `log` writes far more than a pipe buffer (64 KiB)
    // after the reader has gone.
    let out = run(
        &store,
        &[
            "stress",
            "--seconds",
            "0.3",
            "--payload-bytes",
            "10",
            "--durability",
            "buffered",
            "--json",
        ],
    );
    let commits = stdout_json(&out)["commits"].as_u64().unwrap();
    assert!(commits > 2_000, "need a long log, got {commits} commits");
    for args in [&["log"][..], &["log", "--json"][..]] {
        let mut child = spool()
            .arg("--store")
            .arg(&store)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        // Read one byte, then close the pipe while the command still writes.
        let mut out = child.stdout.take().unwrap();
        let mut one = [0u8; 1];
        out.read_exact(&mut one).unwrap();
        drop(out);
        let status = child.wait().unwrap();
        let mut err = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        assert!(!err.contains("panicked"), "{args:?}: {err}");
        assert!(status.success(), "{args:?}: {status} {err}");
    }
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// A failure's stderr names each cause once: no message repeats the
/// message of its cause on the next line.
#[test]
fn each_cause_of_a_failure_is_printed_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    let out = run(&file.join("store"), &["demo"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(count(&err, "Not a directory"), 1, "{err}");
    assert_eq!(count(&err, "I/O error during"), 1, "{err}");
    assert!(!err.contains("another process"), "{err}");

    // A PostgreSQL server that is not there: four layers, each once.
    let out = run(Path::new("postgres://u@127.0.0.1:1/db"), &["sessions"]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    for cause in ["error connecting to server", "postgres migrate", "refused"] {
        assert_eq!(count(&err, cause), 1, "{cause}: {err}");
    }
    let lines: Vec<&str> = err.lines().collect();
    for pair in lines.windows(2) {
        let (a, b) = (
            pair[0],
            pair[1].trim_start().trim_start_matches("caused by: "),
        );
        assert!(!a.ends_with(b), "{a:?} repeats its cause {b:?}");
    }
}

/// Hints name what actually helps: a store path that is a file, a locked
/// store and a corrupt store each get their own.
#[test]
fn hints_name_what_actually_works() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, "x").unwrap();
    for args in [
        &["demo"][..],
        &["sessions"],
        &["verify"],
        &["stress", "--seconds", "0"],
    ] {
        let out = run(&file, args);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("is a file, not a store directory"),
            "{args:?}: {err}"
        );
        assert!(!err.contains("another process"), "{args:?}: {err}");
    }

    let store = dir.path().join("store");
    let demo = run(&store, &["demo", "--json"]);
    assert!(demo.status.success());
    let ids: serde_json::Value = serde_json::from_slice(&demo.stdout).unwrap();
    let id = ids["created"][0].as_str().unwrap();
    {
        // Another owner holds the store.
        let _owner = spool_engine::Store::open(&store, spool_engine::Options::default()).unwrap();
        let out = run(&store, &["delete", id]);
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("hint: another process owns the store"),
            "{err}"
        );
        assert!(!err.contains("--store DIR verify"), "{err}");
    }

    // Damage in the middle of the log.
    let seg = store.join("0000000000000001.seg");
    let mut bytes = std::fs::read(&seg).unwrap();
    bytes[200] ^= 0xff;
    std::fs::write(&seg, &bytes).unwrap();
    let out = run(&store, &["delete", id]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hint: run `spool --store DIR verify`"),
        "{err}"
    );
    assert!(!err.contains("another process"), "{err}");
}

/// An entry over the record size limit is refused with a hint that says
/// retrying cannot help (not "run verify, then retry").
#[test]
fn an_entry_over_the_record_limit_does_not_hint_verify_and_retry() {
    let dir = tempfile::tempdir().unwrap();
    let pi = dir.path().join("big.jsonl");
    let text = "x".repeat(17 << 20);
    let header = r#"{"type":"session","version":3,"id":"big-one","timestamp":"2025-05-03T08:00:00.000Z","cwd":"/"}"#;
    let message = format!(
        r#"{{"type":"message","id":"e0000001","parentId":null,"timestamp":"2025-05-03T06:00:02.000Z","message":{{"role":"user","content":[{{"type":"text","text":"{text}"}}],"timestamp":1746252002000}}}}"#
    );
    std::fs::write(&pi, format!("{header}\n{message}\n")).unwrap();
    let out = run(
        &dir.path().join("store"),
        &["import", "--format", "pi", pi.to_str().unwrap()],
    );
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("limit"), "{err}");
    assert!(!err.contains("verify"), "{err}");
}

/// `stress` validates its arguments before it allocates or runs: a
/// duration too long to represent and a payload over the record limit are
/// refused (no panic, no 4 GiB allocation), and a run whose writers have
/// all failed stops and reports instead of sleeping out its time.
#[test]
fn stress_refuses_bad_arguments_and_stops_when_every_writer_failed() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    for (args, needle) in [
        (&["--seconds", "1e300"][..], "--seconds"),
        (&["--seconds=-1"], "--seconds"),
        (&["--seconds", "NaN"], "--seconds"),
        (&["--payload-bytes", "4294967295"], "record size limit"),
    ] {
        let out = run(&store, &[&["stress"][..], args].concat());
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(needle) && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    // 16 MiB of payload plus its framing is over the record limit: every
    // append fails. The run must end then, not after its 100,000 seconds;
    // the guard below only keeps a regression from hanging the suite.
    let mut child = spool()
        .arg("--store")
        .arg(&store)
        .args(["stress", "--writers", "2", "--seconds", "100000"])
        .args(["--payload-bytes", &(16u32 << 20).to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(600) {
            child.kill().unwrap();
            panic!("stress kept running after every writer failed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("all 2 of 2 writer(s) failed"), "{err}");
    assert!(err.contains("exceeds the maximum"), "{err}");
}

/// Opens `dir` with small segments and sends `n` messages of about 2 KiB
/// to session `id` (created first when `None`); returns the session id.
fn fill_session(dir: &Path, id: Option<&str>, n: usize) -> String {
    use spool_runtime::actions::SendMessage;
    use spool_runtime::agent_loop::ScriptedLoopFactory;
    use spool_runtime::hooks::SessionHookStack;
    use spool_runtime::observer::NullSink;
    use spool_runtime::session::{AgentDefinition, SessionId};
    use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
    use spool_runtime::SessionRuntime;
    use std::sync::Arc;

    let store = Arc::new(
        LogStore::open(
            dir,
            LogStoreOptions {
                segment_bytes_max: Some(64 * 1024),
                ..Default::default()
            },
        )
        .unwrap(),
    );
    let rt = SessionRuntime::new(
        store as Arc<dyn SessionStore>,
        Arc::new(NullSink),
        SessionHookStack::empty(),
    );
    let id = match id {
        Some(id) => SessionId::parse(id).unwrap(),
        None => rt
            .create(AgentDefinition::new("a", "d", "p"), None)
            .unwrap()
            .id()
            .clone(),
    };
    let loops = Arc::new(ScriptedLoopFactory::echo());
    for j in 0..n {
        let text = format!("{j} {}", "x".repeat(2000));
        rt.execute(&id, &SendMessage::new(text, loops.clone()))
            .unwrap();
    }
    id.to_string()
}

#[test]
fn purge_frees_a_deleted_sessions_id_so_its_export_imports_again() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let demo = stdout_json(&run(&store, &["demo", "--json"]));
    let id = demo["created"][0].as_str().unwrap().to_string();
    let file = dir.path().join("one.jsonl");
    let out = run(&store, &["export", &id, "--out", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let show_before = stdout_json(&run(&store, &["show", &id, "--json"]));
    let ctx_before = stdout_json(&run(&store, &["context", &id, "--json"]));
    let import = |args: &[&str]| {
        let mut all = vec!["import", file.to_str().unwrap()];
        all.extend_from_slice(args);
        run(&store, &all)
    };

    assert!(run(&store, &["delete", &id]).status.success());
    // The deleted session still holds the id; the hint names the purge.
    let out = import(&[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(&format!("purge {id}")), "{err}");

    // Purge by prefix.
    let purged = stdout_json(&run(&store, &["purge", &id[..8], "--json"]));
    assert_eq!(purged["version"], 1);
    assert_eq!(purged["id"], id.as_str());
    assert_eq!(purged["status"], "deleted");
    assert_eq!(purged["already_purged"], false);
    assert!(purged["session_version"].as_u64().unwrap() > 0);
    // Gone from reads and listings, deleted ones included.
    let out = run(&store, &["show", &id]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session"));
    let all = stdout_json(&run(&store, &["sessions", "--status", "deleted", "--json"]));
    assert!(
        !all.to_string().contains(&id),
        "a purged session is listed: {all}"
    );

    // Its commits are still in the log, so their ids are taken...
    let out = import(&[]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--fresh-commit-ids"), "{err}");
    // ...and with fresh commit ids the import succeeds and reads back.
    let out = import(&["--fresh-commit-ids"]);
    assert!(out.status.success(), "{out:?}");
    let show_after = stdout_json(&run(&store, &["show", &id, "--json"]));
    assert_eq!(show_after, show_before);
    let ctx_after = stdout_json(&run(&store, &["context", &id, "--json"]));
    assert_eq!(ctx_after, ctx_before);
    assert!(run(&store, &["verify"]).status.success());
}

#[test]
fn purge_refuses_an_active_session_without_force_and_an_absent_id() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let demo = stdout_json(&run(&store, &["demo", "--json"]));
    let id = demo["created"][0].as_str().unwrap().to_string();
    let status = stdout_json(&run(&store, &["show", &id, "--json"]))["header"]["status"].clone();
    assert_ne!(status, "deleted");

    let out = run(&store, &["purge", &id]);
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not deleted") && err.contains("--force"),
        "{err}"
    );
    // Nothing changed.
    let show = stdout_json(&run(&store, &["show", &id, "--json"]));
    assert_eq!(show["header"]["status"], status);

    let purged = stdout_json(&run(&store, &["purge", &id, "--force", "--json"]));
    assert_eq!(purged["status"], status);
    assert_eq!(purged["already_purged"], false);
    assert_eq!(run(&store, &["show", &id]).status.code(), Some(2));

    // A purged id, like one that never existed, is no session (exit 2).
    for absent in [id.as_str(), "00000000-0000-4000-8000-000000000000"] {
        let out = run(&store, &["purge", absent]);
        assert_eq!(out.status.code(), Some(2), "{absent}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("no session"), "{err}");
    }
}

#[test]
fn compact_gc_after_a_purge_frees_the_commit_ids_of_sealed_segments() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let id = fill_session(&store, None, 20);
    let file = dir.path().join("one.jsonl");
    let out = run(&store, &["export", &id, "--out", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let show_before = stdout_json(&run(&store, &["show", &id, "--json"]));
    assert!(run(&store, &["delete", &id]).status.success());
    assert!(run(&store, &["purge", &id]).status.success());
    // Another session's writes seal the segments the purged one is in.
    fill_session(&store, None, 60);
    let gc = stdout_json(&run(&store, &["compact", "--gc", "--json"]));
    assert!(
        gc["streams_removed"].to_string().contains(&id),
        "the purged stream is not collected: {gc}"
    );
    // No commit id is taken any more: the plain import succeeds.
    let out = run(&store, &["import", file.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    let show_after = stdout_json(&run(&store, &["show", &id, "--json"]));
    assert_eq!(show_after, show_before);
}
