//! `spool-bench --quick --json`, all workloads, as CI runs it: the output's
//! shape, a spool figure and a figure from every peer in every row, the
//! `open` rows' latency and memory fields. No time is asserted.

use std::process::{Command, Stdio};

use serde_json::Value;

/// Peers every row of a workload must report.
fn expected_peers(workload: &str) -> &'static [&'static str] {
    match workload {
        "append-durable" => &["jsonl", "postgres", "raw", "raw-append", "sqlite"],
        "append-buffered" => &["jsonl", "raw", "sqlite"],
        "open" => &["jsonl", "postgres", "sqlite"],
        "page" => &["jsonl", "sqlite"],
        "list" => &["json-file", "sqlite"],
        "fork" => &["sqlite"],
        "execute" => &["jsonl", "sqlite"],
        other => panic!("unexpected workload {other}"),
    }
}

/// Whether this machine can run the PostgreSQL peer's server (the
/// peer's own lookup).
fn postgres_binaries_present() -> bool {
    spool_pgserver::binaries_available()
}

fn positive(v: &Value, what: &str) -> f64 {
    let f = v
        .as_f64()
        .unwrap_or_else(|| panic!("{what}: not a number: {v}"));
    assert!(f.is_finite() && f > 0.0, "{what}: {f}");
    f
}

#[test]
fn quick_bench_reports_every_workload_with_every_peer() {
    let scratch = tempfile::tempdir().unwrap();
    // The PostgreSQL server may run as the `postgres` user: let it reach
    // its directory.
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let out = Command::new(env!("CARGO_BIN_EXE_spool-bench"))
        .arg("--store")
        .arg(scratch.path())
        .args(["--quick", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("spawn spool-bench");
    assert!(
        out.status.success(),
        "spool-bench failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let json: Value = serde_json::from_slice(&out.stdout).expect("one JSON object on stdout");
    let machine = &json["machine"];
    assert!(machine["cpus"].as_u64().unwrap() >= 1);
    assert!(machine["os"].is_string());
    let pg = postgres_binaries_present();

    let results = json["results"].as_array().expect("results");
    let mut seen: Vec<(String, String, String)> = Vec::new();
    for r in results {
        let w = r["workload"].as_str().unwrap().to_string();
        let v = r["variant"].as_str().unwrap().to_string();
        let u = r["unit"].as_str().unwrap().to_string();
        let what = format!("{w} {v} {u}");
        let spool = positive(&r["spool"], &format!("{what} spool"));
        let peers = r["peers"].as_object().unwrap();
        let mut keys: Vec<&str> = peers.keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(keys, expected_peers(&w), "{what}");
        for (k, f) in peers {
            if k == "postgres" && !pg {
                assert!(f.is_null(), "{what}: postgres without a server");
                assert!(
                    r["notes"][k].is_string(),
                    "{what}: postgres null without a note"
                );
                continue;
            }
            let f = positive(f, &format!("{what} {k}"));
            let ratio = positive(&r["ratios"][k], &format!("{what} ratio to {k}"));
            assert!(
                (ratio * f - spool).abs() <= 1e-6 * spool,
                "{what}: ratio to {k}"
            );
            let spread = r["spread"][k].as_array().unwrap();
            let (lo, hi) = (spread[0].as_f64().unwrap(), spread[1].as_f64().unwrap());
            assert!(lo <= f && f <= hi, "{what} {k}: {lo} <= {f} <= {hi}");
            // Each round's ratio pairs one spool rate with one of the
            // peer's, so it lies within what the two spreads allow.
            let rr = r["round_ratios"][k].as_array().expect("round_ratios");
            let (rlo, rhi) = (rr[0].as_f64().unwrap(), rr[1].as_f64().unwrap());
            let s = r["spread"]["spool"].as_array().unwrap();
            let (slo, shi) = (s[0].as_f64().unwrap(), s[1].as_f64().unwrap());
            let tol = 1e-9;
            assert!(
                0.0 < rlo
                    && rlo <= rhi
                    && rlo >= slo / hi * (1.0 - tol)
                    && rhi <= shi / lo * (1.0 + tol),
                "{what} {k}: round ratios {rlo}..{rhi} outside {}..{}",
                slo / hi,
                shi / lo
            );
        }
        if w == "open" {
            // spool's open latency and memory, one row per size.
            let n = r["history"].as_u64().expect("history");
            assert_eq!(v, format!("history={n}"));
            positive(&r["open_us"], &format!("{what} open_us"));
            positive(&r["first_page_us"], &format!("{what} first_page_us"));
            positive(&r["jsonl_open_us"], &format!("{what} jsonl_open_us"));
            let resident = r["resident_bytes"].as_u64().expect("resident_bytes");
            let budget = json["run"]["context_budget"].as_u64().unwrap();
            assert!(
                resident > 0 && resident <= budget,
                "{what}: resident {resident}"
            );
        }
        seen.push((w, v, u));
    }
    let workloads: Vec<&str> = seen.iter().map(|(w, _, _)| w.as_str()).collect();
    for w in [
        "append-durable",
        "append-buffered",
        "open",
        "page",
        "list",
        "fork",
        "execute",
    ] {
        assert!(workloads.contains(&w), "no {w} row in {workloads:?}");
    }
    assert_eq!(
        seen.iter().filter(|(w, _, _)| w == "open").count(),
        3,
        "three open sizes"
    );
    assert!(seen.contains(&(
        "append-durable".into(),
        "writers=16".into(),
        "commits/s".into()
    )));
    // The scratch space is cleaned up, the server's directory with it.
    assert!(!scratch.path().join("spool-bench-scratch").exists());
}

#[test]
fn an_unknown_workload_fails_and_names_the_known_ones() {
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spool-bench"))
        .arg("--store")
        .arg(scratch.path())
        .args(["--workload", "nope", "--json"])
        .stdin(Stdio::null())
        .output()
        .expect("spawn spool-bench");
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("unknown workload \"nope\"")
            && stderr.contains("append-durable, append-buffered, open, page, list, fork"),
        "{stderr}"
    );
}

/// `--quick --workload execute`: every history size carries every
/// subject's time per execute and its measuring process's memory, and the
/// largest size carries the four goals, computed (met or not) from the
/// run's own figures.
#[test]
fn quick_execute_reports_every_size_for_every_subject() {
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spool-bench"))
        .arg("--store")
        .arg(scratch.path())
        .args(["--quick", "--workload", "execute", "--json", "--markdown"])
        .stdin(Stdio::null())
        .output()
        .expect("spawn spool-bench");
    assert!(
        out.status.success(),
        "spool-bench failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    // The JSON object comes first, the Markdown after it.
    let mut stream = serde_json::Deserializer::from_str(&stdout).into_iter::<Value>();
    let json = stream.next().expect("a JSON object").expect("valid JSON");
    let markdown = &stdout[stream.byte_offset()..];
    let rows = json["results"].as_array().unwrap();
    let histories: Vec<u64> = rows
        .iter()
        .map(|r| {
            assert_eq!(r["workload"], "execute");
            r["execute"]["history"].as_u64().expect("history")
        })
        .collect();
    assert!(histories.len() >= 2, "{histories:?}");
    assert!(histories.windows(2).all(|w| w[0] < w[1]), "{histories:?}");
    let turns = rows[0]["execute"]["turns"].as_u64().unwrap();
    for (r, n) in rows.iter().zip(&histories) {
        assert_eq!(r["variant"], format!("history={n}"));
        let subjects = r["execute"]["subjects"].as_object().unwrap();
        let mut keys: Vec<&str> = subjects.keys().map(|k| k.as_str()).collect();
        keys.sort_unstable();
        assert_eq!(keys, ["jsonl", "spool", "sqlite"], "history {n}");
        for (k, s) in subjects {
            let what = format!("history {n} {k}");
            let us = positive(&s["execute_us"], &format!("{what} execute_us"));
            // The row's rate is the same median, per second.
            let rate = if k == "spool" {
                &r["spool"]
            } else {
                &r["peers"][k]
            };
            let rate = positive(rate, &format!("{what} rate"));
            assert!(
                (rate * us - 1e6).abs() <= 1e-6 * 1e6,
                "{what}: {rate} × {us}"
            );
            let peak = s["peak_rss_bytes"].as_u64().expect("peak_rss_bytes");
            let ready = s["ready_peak_rss_bytes"].as_u64().expect("ready peak");
            assert!(0 < ready && ready <= peak, "{what}: {ready} <= {peak}");
            if let Some(during) = s["turns_peak_rss_bytes"].as_u64() {
                let before = s["ready_rss_bytes"].as_u64().unwrap();
                assert!(before <= during && during <= peak, "{what}");
            }
        }
        let rounds = json["run"]["repetitions"].as_u64().unwrap();
        assert_eq!(r["repetitions"].as_u64(), Some(rounds), "history {n}");
    }
    let goals = rows.last().unwrap()["execute"]["goals"].as_array().unwrap();
    let names: Vec<&str> = goals.iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert_eq!(
        names,
        [
            "spool_rss_growth",
            "spool_time_growth",
            "speed_vs_sqlite",
            "speed_vs_jsonl"
        ]
    );
    for g in goals {
        let v = positive(&g["value"], "goal value");
        let t = g["target"].as_f64().unwrap();
        let met = if g["at_most"].as_bool().unwrap() {
            v <= t
        } else {
            v >= t
        };
        assert_eq!(g["met"].as_bool(), Some(met), "{g}");
    }
    assert!(rows[..rows.len() - 1]
        .iter()
        .all(|r| r["execute"].get("goals").is_none()));
    assert!(
        markdown.contains(&format!("times {turns} turns per round")),
        "{markdown}"
    );
    assert!(markdown.contains("| history | subject | µs per execute |"));
    assert_eq!(markdown.matches("\n- spool's ").count(), 2, "{markdown}");
    assert!(!scratch.path().join("spool-bench-scratch").exists());
}

/// `--quick --workload store`: every question for every subject at every
/// size, each with a time and a peak RSS, the rates and ratios of the
/// common rows, and the goals at the largest size. No time is asserted.
#[test]
fn quick_store_reports_every_question_for_every_subject() {
    let scratch = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_spool-bench"))
        .arg("--store")
        .arg(scratch.path())
        .args(["--quick", "--workload", "store", "--json", "--markdown"])
        .stdin(Stdio::null())
        .output()
        .expect("spawn spool-bench");
    assert!(
        out.status.success(),
        "spool-bench failed: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    // The JSON object comes first, the Markdown after it.
    let end = stdout
        .find("\n# Benchmarks")
        .expect("markdown after the JSON");
    let json: Value = serde_json::from_str(&stdout[..end]).expect("one JSON object");
    let md = &stdout[end..];
    let results = json["results"].as_array().expect("results");
    let mut sizes: Vec<u64> = Vec::new();
    let mut seen: Vec<(String, u64)> = Vec::new();
    for r in results {
        assert_eq!(r["workload"], "store");
        let f = &r["store"];
        let q = f["question"].as_str().expect("question").to_string();
        let commits = f["commits"].as_u64().expect("commits");
        let sessions = f["sessions"].as_u64().expect("sessions");
        assert!(
            sessions >= 1 && commits == sessions * 101,
            "{commits} {sessions}"
        );
        let what = format!("{q} {commits}");
        // The quick sizes' counts: 4 of each read (not the 3 of the other
        // workloads), 1 import.
        let want = if q == "import" { 1 } else { 4 };
        assert_eq!(r["repetitions"].as_u64(), Some(want), "{what} repetitions");
        for s in ["spool", "sqlite", "jsonl"] {
            positive(&f["seconds"][s], &format!("{what} {s} seconds"));
            let rss = f["peak_rss_bytes"][s].as_u64().unwrap_or(0);
            assert!(rss > 0, "{what} {s}: peak RSS {rss}");
        }
        let spool = positive(&r["spool"], &format!("{what} spool rate"));
        for p in ["sqlite", "jsonl"] {
            let rate = positive(&r["peers"][p], &format!("{what} {p} rate"));
            let ratio = positive(&r["ratios"][p], &format!("{what} ratio to {p}"));
            assert!((ratio * rate - spool).abs() <= 1e-6 * spool, "{what}");
        }
        if !sizes.contains(&commits) {
            sizes.push(commits);
        }
        seen.push((q, commits));
    }
    assert_eq!(sizes.len(), 2, "two quick sizes: {sizes:?}");
    assert!(
        md.contains("over 4 repetitions of each read and owner open and then 1 of the import"),
        "{md}"
    );
    assert!(
        md.contains("(the `store` rows: as many as their section below says)"),
        "{md}"
    );
    for c in &sizes {
        for q in ["list", "context", "show", "open", "import"] {
            assert!(seen.contains(&(q.to_string(), *c)), "no {q} at {c}");
        }
    }
    // The goals are decided at the largest size: three for each read,
    // one for the owner open (memory), one for import, one more for the
    // listing (over the JSONL directory).
    let largest = *sizes.iter().max().unwrap();
    let goals: usize = results
        .iter()
        .filter(|r| r["store"]["commits"].as_u64() == Some(largest))
        .map(|r| {
            let g = r["store"]["goals"]
                .as_array()
                .expect("goals at the largest size");
            for x in g {
                positive(&x["ratio"], "goal ratio");
                assert_eq!(
                    x["met"].as_bool().unwrap(),
                    x["ratio"].as_f64().unwrap() >= x["target"].as_f64().unwrap()
                );
            }
            g.len()
        })
        .sum();
    assert_eq!(goals, 3 * 3 + 1 + 1 + 1);
    assert!(
        md.contains("`sessions --limit 20`:") && md.contains("| command | goal |"),
        "{md}"
    );
    assert!(!scratch.path().join("spool-bench-scratch").exists());
}
