//! `spool import` cut short by a crash and finished with `--resume`.

use crate::tools_cli::{demo, json, run, stderr};

/// An export document without its first line (which holds the export time).
fn body(text: &str) -> Vec<String> {
    text.lines().skip(1).map(str::to_string).collect()
}

/// An import aborted (no cleanup, no rollback, as a kill leaves it) after each
/// number of written commits leaves sessions that a plain re-run refuses with
/// a hint naming `--resume`; `--resume` then finishes the import, and the store
/// exports exactly the file it imported. A `--resume` of a finished import
/// writes nothing.
#[test]
fn an_import_cut_short_at_every_commit_is_finished_by_resume() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    demo(&a);
    let file = dir.path().join("all.jsonl");
    let path = file.to_str().unwrap();
    let out = run(&a, &["export", "--all", "--out", path]);
    assert!(out.status.success(), "{}", stderr(&out));
    let text = std::fs::read_to_string(&file).unwrap();
    let listing = json(&a, &["sessions", "--json"]);
    let commits: u64 = listing
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["version"].as_u64().unwrap())
        .sum();
    assert!(commits > 4, "the demo store has more commits than sessions");
    let mut partial = 0;
    for cut in 1..commits {
        let b = dir.path().join(format!("b{cut}"));
        let at = cut.to_string();
        let out = run(&b, &["import", path, "--test-abort-after-commits", &at]);
        assert!(
            !out.status.success(),
            "cut {cut}: the import was not aborted"
        );
        let written = json(&b, &["sessions", "--json"]);
        let landed: u64 = written
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["version"].as_u64().unwrap())
            .sum();
        // A session's commits are appended in batches, so a cut lands
        // between batches: anything from none to all of the file.
        assert!(landed <= commits, "cut {cut}: {landed} commits landed");
        partial += u64::from(landed > 0 && landed < commits);
        if landed > 0 {
            let out = run(&b, &["import", path]);
            assert_eq!(
                out.status.code(),
                Some(2),
                "cut {cut}: a re-run wrote over it"
            );
            assert!(
                stderr(&out).contains("--resume"),
                "cut {cut}: {}",
                stderr(&out)
            );
        }
        let rep = json(&b, &["import", path, "--resume", "--json"]);
        assert_eq!(rep["commits"], commits, "cut {cut}");
        assert_eq!(json(&b, &["sessions", "--json"]), listing, "cut {cut}");
        let again = run(&b, &["export", "--all"]);
        assert!(again.status.success(), "{}", stderr(&again));
        assert_eq!(
            body(&String::from_utf8_lossy(&again.stdout)),
            body(&text),
            "cut {cut}"
        );
        let out = run(&b, &["verify"]);
        assert!(out.status.success(), "cut {cut}: {}", stderr(&out));
    }
    assert!(partial > 0, "no cut left a partial import to resume");
    // A finished import resumed again writes nothing.
    let b = dir.path().join("b1");
    let records = |dir: &std::path::Path| String::from_utf8(run(dir, &["verify"]).stdout).unwrap();
    let before = records(&b);
    assert!(before.contains(&format!("{commits} commits")), "{before}");
    json(&b, &["import", path, "--resume", "--json"]);
    assert_eq!(json(&b, &["sessions", "--json"]), listing);
    assert_eq!(records(&b), before);
}

/// `--resume` needs the file's commit ids, so it cannot go with
/// `--fresh-commit-ids` nor read a pi file; a store holding other commits
/// under the file's session ids is refused without a write, and so is a file
/// holding a commit id twice.
#[test]
fn what_resume_cannot_continue_and_a_commit_id_twice_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    demo(&a);
    let file = dir.path().join("all.jsonl");
    let path = file.to_str().unwrap();
    assert!(run(&a, &["export", "--all", "--out", path])
        .status
        .success());
    let out = run(&a, &["import", path, "--resume", "--fresh-commit-ids"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    // A pi file's commit ids are made up by each reading: nothing to resume.
    let pi = crate::tools_cli::fixture("v3.jsonl");
    let pi = pi.to_str().unwrap();
    let out = run(&a, &["import", "--format", "pi", pi, "--resume"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(stderr(&out).contains("purge"), "{}", stderr(&out));
    // A file holding a commit id twice is refused before a write.
    let text = std::fs::read_to_string(&file).unwrap();
    let commit_ids: Vec<String> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["commit_id"].as_str().map(str::to_string))
        .collect();
    let other_id = commit_ids.iter().find(|c| **c != commit_ids[0]).unwrap();
    let twice = dir.path().join("twice.jsonl");
    std::fs::write(&twice, text.replace(other_id, &commit_ids[0])).unwrap();
    let d = dir.path().join("d");
    let out = run(&d, &["import", twice.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("in the file twice"),
        "{}",
        stderr(&out)
    );
    assert!(
        stderr(&out).contains("--fresh-commit-ids"),
        "{}",
        stderr(&out)
    );
    assert_eq!(json(&d, &["sessions", "--json"]), serde_json::json!([]));
    // The source store holds the same commits: resuming there is a no-op.
    let before = json(&a, &["sessions", "--json"]);
    json(&a, &["import", path, "--resume", "--json"]);
    assert_eq!(json(&a, &["sessions", "--json"]), before);
    // Another store's demo sessions have other ids; a file whose session is
    // in the store under other commits is refused.
    let c = dir.path().join("c");
    let ids = demo(&c);
    let other = dir.path().join("other.jsonl");
    let other_path = other.to_str().unwrap();
    assert!(run(&c, &["export", &ids[0], "--out", other_path])
        .status
        .success());
    let doc = std::fs::read_to_string(&other).unwrap();
    let a_ids = crate::tools_cli::session_ids(&a, &[]);
    let forged = doc.replace(&ids[0], &a_ids[0]);
    std::fs::write(&other, forged).unwrap();
    let out = run(&a, &["import", other_path, "--resume"]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("not an interrupted import"),
        "{}",
        stderr(&out)
    );
    assert_eq!(json(&a, &["sessions", "--json"]), before);
}
