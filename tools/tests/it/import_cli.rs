//! `spool import` cut short by a crash and finished with `--resume`.

use crate::tools_cli::{demo, json, run, stderr};

/// An export document without its first line (which holds the export time).
fn body(text: &str) -> Vec<String> {
    text.lines().skip(1).map(str::to_string).collect()
}

/// Imports `file` into a fresh store per cut, aborting the import (no cleanup,
/// no rollback, as a kill leaves it) once `cut` commits are written; checks
/// that a plain re-run is refused with a hint naming `--resume`, that
/// `--resume` finishes the import (the store then exports `export` and lists
/// as `listing`, what a whole import gives, and verifies), and returns, per
/// cut, the version each session the cut left was at.
fn cut_and_resume(
    dir: &std::path::Path,
    file: &std::path::Path,
    (export, listing): (&str, &serde_json::Value),
    cuts: &[u64],
) -> Vec<std::collections::BTreeMap<String, u64>> {
    let path = file.to_str().unwrap();
    let commits: u64 = versions(listing).values().sum();
    let mut left = Vec::new();
    for &cut in cuts {
        let b = dir.join(format!("b{cut}"));
        let at = cut.to_string();
        let out = run(&b, &["import", path, "--test-abort-after-commits", &at]);
        assert!(
            !out.status.success(),
            "cut {cut}: the import was not aborted"
        );
        let cut_left = versions(&json(&b, &["sessions", "--json"]));
        let landed: u64 = cut_left.values().sum();
        left.push(cut_left);
        // A session's commits are appended in batches, so a cut lands
        // between batches: anything from none to all of the file.
        assert!(landed <= commits, "cut {cut}: {landed} commits landed");
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
        assert_eq!(&json(&b, &["sessions", "--json"]), listing, "cut {cut}");
        let again = run(&b, &["export", "--all"]);
        assert!(again.status.success(), "{}", stderr(&again));
        assert_eq!(
            body(&String::from_utf8_lossy(&again.stdout)),
            body(export),
            "cut {cut}"
        );
        let out = run(&b, &["verify"]);
        assert!(out.status.success(), "cut {cut}: {}", stderr(&out));
    }
    left
}

/// Each session's version in a `sessions --json` listing.
fn versions(listing: &serde_json::Value) -> std::collections::BTreeMap<String, u64> {
    listing
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let id = s["id"].as_str().unwrap().to_string();
            (id, s["version"].as_u64().unwrap())
        })
        .collect()
}

/// A store made by `spool demo` in `dir/a` and its export in `dir/all.jsonl`.
fn demo_export(dir: &std::path::Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let a = dir.join("a");
    demo(&a);
    let file = dir.join("all.jsonl");
    let out = run(&a, &["export", "--all", "--out", file.to_str().unwrap()]);
    assert!(out.status.success(), "{}", stderr(&out));
    (a, file)
}

/// An import of the demo store's export cut after every number of written
/// commits is finished by `--resume` (see [`cut_and_resume`]); a `--resume`
/// of a finished import writes nothing.
#[test]
fn an_import_cut_short_at_every_commit_is_finished_by_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (a, file) = demo_export(dir.path());
    let path = file.to_str().unwrap();
    let listing = json(&a, &["sessions", "--json"]);
    let commits: u64 = versions(&listing).values().sum();
    assert!(commits > 4, "the demo store has more commits than sessions");
    let cuts: Vec<u64> = (1..commits).collect();
    let text = std::fs::read_to_string(&file).unwrap();
    let left = cut_and_resume(dir.path(), &file, (&text, &listing), &cuts);
    let partial = left.iter().map(|l| l.values().sum::<u64>());
    assert!(
        partial.clone().any(|n| n > 0 && n < commits),
        "no cut left a partial import: {:?}",
        partial.collect::<Vec<_>>()
    );
    // A finished import resumed again writes nothing.
    let b = dir.path().join("b1");
    let records = |dir: &std::path::Path| String::from_utf8(run(dir, &["verify"]).stdout).unwrap();
    let before = records(&b);
    assert!(before.contains(&format!("{commits} commits")), "{before}");
    json(&b, &["import", path, "--resume", "--json"]);
    assert_eq!(json(&b, &["sessions", "--json"]), listing);
    assert_eq!(records(&b), before);
}

/// The demo export with `extra` more commits (a metadata write each) at the
/// end of its first session, so that session spans several of the import's
/// batches; returns the file's text and that session's id.
fn with_a_long_session(text: &str, extra: u64) -> (String, String) {
    let mut lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let first = lines[1]["session"].as_str().unwrap().to_string();
    let last = (1..lines.len())
        .rev()
        .find(|&i| lines[i]["session"] == first.as_str())
        .unwrap();
    let template = lines[last].clone();
    let version = template["version"].as_u64().unwrap();
    let added = (1..=extra).map(|i| {
        let mut l = template.clone();
        l["version"] = (version + i).into();
        l["commit_id"] = format!("00000000-0000-4000-8000-{i:012x}").into();
        l["index"] = 0.into();
        l["events_in_commit"] = 1.into();
        l["event"] = serde_json::json!({"type": "metadata_written", "key": "n", "value": i});
        l
    });
    let tail = lines.split_off(last + 1);
    lines.extend(added);
    lines.extend(tail);
    let end = lines.last_mut().unwrap();
    end["commits"] = (end["commits"].as_u64().unwrap() + extra).into();
    end["events"] = (end["events"].as_u64().unwrap() + extra).into();
    let text: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
    (text.join("\n") + "\n", first)
}

/// A session longer than one of the import's batches, cut in its middle, is
/// continued by `--resume` from the commit after the cut (see
/// [`cut_and_resume`]).
#[test]
fn an_import_cut_inside_a_long_session_is_finished_by_resume() {
    let dir = tempfile::tempdir().unwrap();
    let (_, demo_file) = demo_export(dir.path());
    let demo_text = std::fs::read_to_string(&demo_file).unwrap();
    let (text, long) = with_a_long_session(&demo_text, 600);
    let file = dir.path().join("long.jsonl");
    std::fs::write(&file, &text).unwrap();
    // What the whole file imports as.
    let whole = dir.path().join("whole");
    json(&whole, &["import", file.to_str().unwrap(), "--json"]);
    let listing = json(&whole, &["sessions", "--json"]);
    let export = run(&whole, &["export", "--all"]);
    assert!(export.status.success(), "{}", stderr(&export));
    let export = String::from_utf8_lossy(&export.stdout).into_owned();
    let full = versions(&listing)[&long];
    assert!(full > 600, "{full}");
    let cuts = [1, 100, 300, 600];
    let left = cut_and_resume(dir.path(), &file, (&export, &listing), &cuts);
    let mid: Vec<u64> = left.iter().filter_map(|l| l.get(&long).copied()).collect();
    assert!(
        mid.iter().any(|&v| v > 0 && v < full),
        "no cut landed inside the long session: {mid:?} of {full}"
    );
}

/// `--resume` needs the file's commit ids, so it cannot go with
/// `--fresh-commit-ids` nor read a pi file; a store holding other commits
/// under the file's session ids is refused without a write, and so is a file
/// holding a commit id twice.
#[test]
fn what_resume_cannot_continue_and_a_commit_id_twice_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (a, file) = demo_export(dir.path());
    let path = file.to_str().unwrap();
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
