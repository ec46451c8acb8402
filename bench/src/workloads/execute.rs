//! `execute`: one turn of an agent on one session with a long history: a
//! [`TURN_TEXT_BYTES`]-byte user message in, a reply of the same size
//! out, both durable, and the context the next model call needs. One
//! variant per history length; time per turn and the process's peak
//! resident memory, for spool (`SessionRuntime::execute` with a scripted
//! loop), pi's way (append the JSONL lines, rebuild the context from the
//! whole file) and SQLite (insert the rows, select the context). See
//! [`crate::execute_child`] for what each subject does.
//!
//! Memory is the point, so every subject and size runs in a fresh
//! process: the parent builds the history in a new directory (untimed),
//! then starts this binary again as a measuring child, which opens the
//! directory, runs [`crate::harness::Sizes::execute_turns`] turns and
//! reports their times and its own peak RSS. Rounds are interleaved
//! across subjects as elsewhere; every round builds its history afresh,
//! so each child starts from exactly the variant's history.
//!
//! The row's rate (executes/s) is, per subject, the median over the
//! rounds of each child's median turn. [`ExecuteFigures`] adds the same
//! in microseconds, the memory figures, and on the largest history's row
//! the goals of the workload computed from this run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::error::BenchError;
use crate::execute_child::{self, ChildReport, ChildSpec, SUBJECTS, TURN_TEXT_BYTES};
use crate::harness::{create_dir, remove_dir, Harness, CONTEXT_BUDGET};
use crate::report::ResultRow;
use crate::stats::Samples;
use crate::subject::SpoolSubject;
use crate::workloads::Workload;

/// The extra figures of an `execute` row.
#[derive(Clone, Debug, Serialize)]
pub struct ExecuteFigures {
    /// Entries in the session before a child's first turn.
    pub history: u64,
    /// Turns each child runs and times.
    pub turns: usize,
    /// By subject (`spool`, `sqlite`, `jsonl`).
    pub subjects: BTreeMap<String, SubjectFigures>,
    /// The workload's goals, on the largest history's row only. spool's
    /// memory goal compares the peak RSS during the turns (the process's
    /// peak where that cannot be told apart).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub goals: Vec<Goal>,
}

/// One subject at one history length, over its rounds.
#[derive(Clone, Debug, Serialize)]
pub struct SubjectFigures {
    /// Median over the rounds of each round's median turn, microseconds.
    pub execute_us: f64,
    /// `[min, max]` of the rounds' median turns.
    pub execute_us_spread: [f64; 2],
    /// Peak RSS of the measuring process over its whole life (start-up,
    /// open, turns), the highest of the rounds. `null` where the kernel
    /// does not report it.
    pub peak_rss_bytes: Option<u64>,
    /// Peak RSS once the store was open, before the first turn.
    pub ready_peak_rss_bytes: Option<u64>,
    /// RSS right before the first turn (`null` where the peak cannot be
    /// reset).
    pub ready_rss_bytes: Option<u64>,
    /// Peak RSS during the turns alone, counted from the RSS before them
    /// (`null` where the peak cannot be reset).
    pub turns_peak_rss_bytes: Option<u64>,
}

/// A goal of the workload, computed from this run.
#[derive(Clone, Debug, Serialize)]
pub struct Goal {
    pub name: &'static str,
    /// What is compared, in words.
    pub description: String,
    /// The measured ratio.
    pub value: f64,
    /// The bound it must meet.
    pub target: f64,
    /// Whether `value` must be at most (`true`) or at least the target.
    pub at_most: bool,
    pub met: bool,
}

/// Runs the workload: one row per history length.
pub fn run(h: &mut Harness<'_>, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
    let subjects: Vec<&str> = SUBJECTS
        .into_iter()
        .filter(|s| *s != "spool" || spool.supports(Workload::Execute))
        .collect();
    let turns = h.sizes.execute_turns;
    let reps = h.sizes.repetitions;
    let mut rows = Vec::new();
    for &n in &h.sizes.execute_histories.clone() {
        let variant = format!("history={n}");
        let mut reports: Vec<Vec<ChildReport>> = subjects.iter().map(|_| Vec::new()).collect();
        for rep in 0..reps {
            (h.progress)(&format!("  {variant} round {}/{reps}", rep + 1));
            for (subject, out) in subjects.iter().zip(reports.iter_mut()) {
                let dir = h.subject_dir(subject, &format!("{variant}-{rep}"));
                create_dir(&dir)?;
                execute_child::build(subject, &dir, n as u64)?;
                let report = run_child(&ChildSpec {
                    subject: subject.to_string(),
                    dir: dir.clone(),
                    history: n as u64,
                    turns,
                    variant: variant.clone(),
                })?;
                remove_dir(&dir)?;
                if report.turn_us.len() != turns {
                    return Err(BenchError::Subject {
                        subject: subject.to_string(),
                        message: format!(
                            "the measuring process timed {} turns of {turns}",
                            report.turn_us.len()
                        ),
                    });
                }
                out.push(report);
            }
        }
        let mut figures = ExecuteFigures {
            history: n as u64,
            turns,
            subjects: BTreeMap::new(),
            goals: Vec::new(),
        };
        let mut measured = Vec::new();
        for (subject, reports) in subjects.iter().zip(&reports) {
            let medians = Samples {
                rates: reports.iter().map(|r| median(&r.turn_us)).collect(),
            };
            // One rate per round: executes per second of its median turn.
            measured.push((
                subject.to_string(),
                Samples {
                    rates: medians.rates.iter().map(|us| 1e6 / us).collect(),
                },
            ));
            let Some(s) = medians.summary() else { continue };
            let highest = |f: fn(&ChildReport) -> Option<u64>| reports.iter().filter_map(f).max();
            figures.subjects.insert(
                subject.to_string(),
                SubjectFigures {
                    execute_us: s.median,
                    execute_us_spread: [s.min, s.max],
                    peak_rss_bytes: highest(|r| r.peak_rss_bytes),
                    ready_peak_rss_bytes: highest(|r| r.ready_peak_rss_bytes),
                    ready_rss_bytes: highest(|r| r.ready_rss_bytes),
                    turns_peak_rss_bytes: highest(|r| r.turns_peak_rss_bytes),
                },
            );
        }
        let mut row =
            ResultRow::from_measured(Workload::Execute.name(), &variant, "executes/s", measured);
        row.execute = Some(figures);
        rows.push(row);
    }
    let goals = goals(&rows);
    if let Some(f) = rows.last_mut().and_then(|r| r.execute.as_mut()) {
        f.goals = goals;
    }
    Ok(rows)
}

/// Runs one measuring child: this binary again, in its child mode.
#[cfg(not(test))]
fn run_child(spec: &ChildSpec) -> Result<ChildReport, BenchError> {
    use std::process::{Command, Stdio};
    let failed = |message: String| BenchError::Subject {
        subject: spec.subject.clone(),
        message,
    };
    let exe = std::env::current_exe()
        .map_err(|e| crate::error::io_err(&spec.subject, std::path::Path::new("current_exe"), e))?;
    let json = serde_json::to_string(spec).map_err(|e| failed(e.to_string()))?;
    let out = Command::new(&exe)
        .arg(execute_child::CHILD_ARG)
        .arg(json)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| crate::error::io_err(&spec.subject, &exe, e))?;
    if !out.status.success() {
        return Err(failed(format!(
            "the measuring process failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    serde_json::from_slice(&out.stdout)
        .map_err(|e| failed(format!("the measuring process's report is unreadable: {e}")))
}

/// The unit tests' binary is not `spool-bench` and cannot be started as
/// a child: they measure in their own process (its memory figures then
/// mean nothing; the test of the binary covers the child processes).
#[cfg(test)]
fn run_child(spec: &ChildSpec) -> Result<ChildReport, BenchError> {
    execute_child::measure(spec)
}

fn median(v: &[f64]) -> f64 {
    Samples { rates: v.to_vec() }
        .summary()
        .map_or(f64::NAN, |s| s.median)
}

/// The goals, from the smallest and the largest history of the run: each
/// needs spool's figures and, for the comparisons, the peer's.
fn goals(rows: &[ResultRow]) -> Vec<Goal> {
    let figures: Vec<&ExecuteFigures> = rows.iter().filter_map(|r| r.execute.as_ref()).collect();
    let (Some(small), Some(large)) = (
        figures.iter().min_by_key(|f| f.history),
        figures.iter().max_by_key(|f| f.history),
    ) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut goal = |name, description: String, value: Option<f64>, target, at_most| {
        if let Some(value) = value.filter(|v| v.is_finite()) {
            let met = if at_most {
                value <= target
            } else {
                value >= target
            };
            out.push(Goal {
                name,
                description,
                value,
                target,
                at_most,
                met,
            });
        }
    };
    let us = |f: &ExecuteFigures, s: &str| f.subjects.get(s).map(|x| x.execute_us);
    // The memory of the turns: their peak where it can be told apart
    // from what opening the store peaked at, else the process's.
    let during_turns = small
        .subjects
        .get("spool")
        .and_then(|x| x.turns_peak_rss_bytes)
        .is_some()
        && large
            .subjects
            .get("spool")
            .and_then(|x| x.turns_peak_rss_bytes)
            .is_some();
    let rss = |f: &ExecuteFigures, s: &str| {
        f.subjects
            .get(s)
            .and_then(|x| {
                if during_turns {
                    x.turns_peak_rss_bytes
                } else {
                    x.peak_rss_bytes
                }
            })
            .map(|b| b as f64)
    };
    let over = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    if small.history < large.history {
        goal(
            "spool_rss_growth",
            format!(
                "spool's peak RSS {} at history {} over at history {}",
                if during_turns {
                    "during the turns"
                } else {
                    "of the process"
                },
                large.history,
                small.history
            ),
            over(rss(large, "spool"), rss(small, "spool")),
            1.5,
            true,
        );
        goal(
            "spool_time_growth",
            format!(
                "spool's time per execute at history {} over at history {}",
                large.history, small.history
            ),
            over(us(large, "spool"), us(small, "spool")),
            2.0,
            true,
        );
    }
    for (peer, target) in [("sqlite", 1.0), ("jsonl", 10.0)] {
        goal(
            match peer {
                "sqlite" => "speed_vs_sqlite",
                _ => "speed_vs_jsonl",
            },
            format!(
                "{peer}'s time per execute over spool's at history {}",
                large.history
            ),
            over(us(large, peer), us(large, "spool")),
            target,
            false,
        );
    }
    out
}

fn mib(b: Option<u64>) -> String {
    b.map_or("—".to_string(), |b| {
        format!("{:.1} MiB", b as f64 / (1024.0 * 1024.0))
    })
}

/// The Markdown section of the `execute` rows (empty without them).
pub fn markdown(results: &[ResultRow]) -> String {
    let figures: Vec<&ExecuteFigures> = results.iter().filter_map(|r| r.execute.as_ref()).collect();
    if figures.is_empty() {
        return String::new();
    }
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\nExecuting a turn on a session with a long history: a {TURN_TEXT_BYTES}-byte user \
         message and a {TURN_TEXT_BYTES}-byte reply per turn, durable, and the model context \
         (spool: `SessionRuntime::execute` with the scripted loop; sqlite: both rows in one \
         transaction, then the newest rows fitting {CONTEXT_BUDGET} bytes; jsonl: both lines \
         appended and fdatasynced, then the whole file parsed and the root-to-leaf path \
         rebuilt). Each subject and size runs in a fresh process, which times {turns} turns \
         per round; µs per execute is the median over the rounds of each round's median \
         turn (min–max of those in brackets). Peak RSS is the measuring process's over its \
         life (start-up, open, turns; the highest of the rounds); before turns is its RSS \
         after opening the store; during turns is its peak from then on, which spool's \
         memory goal compares (opening a store has a peak of its own). Building the \
         history is not in these figures (the parent builds it; the table's peak RSS \
         column above is the parent's).\n\n\
         | history | subject | µs per execute | peak RSS | RSS before turns | peak RSS during turns |\n\
         |---:|---|---:|---:|---:|---:|",
        turns = figures[0].turns,
    );
    for f in &figures {
        for s in SUBJECTS {
            let Some(x) = f.subjects.get(s) else { continue };
            let _ = writeln!(
                out,
                "| {} | {s} | {:.0} ({:.0}–{:.0}) | {} | {} | {} |",
                f.history,
                x.execute_us,
                x.execute_us_spread[0],
                x.execute_us_spread[1],
                mib(x.peak_rss_bytes),
                mib(x.ready_rss_bytes),
                mib(x.turns_peak_rss_bytes),
            );
        }
    }
    let goals: Vec<&Goal> = figures.iter().flat_map(|f| &f.goals).collect();
    if !goals.is_empty() {
        let _ = writeln!(out, "\nGoals of `execute`, computed in this run:\n");
        for g in goals {
            let _ = writeln!(
                out,
                "- {}: {:.2}× (goal {} {:.1}×): {}",
                g.description,
                g.value,
                if g.at_most { "≤" } else { "≥" },
                g.target,
                if g.met { "met" } else { "missed" }
            );
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(history: u64, subjects: &[(&str, f64, u64)]) -> ResultRow {
        let mut r = ResultRow::from_measured("execute", "v", "executes/s", Vec::new());
        r.execute = Some(ExecuteFigures {
            history,
            turns: 1,
            subjects: subjects
                .iter()
                .map(|&(s, us, rss)| {
                    (
                        s.to_string(),
                        SubjectFigures {
                            execute_us: us,
                            execute_us_spread: [us, us],
                            // Opening peaked higher than the turns.
                            peak_rss_bytes: Some(100),
                            ready_peak_rss_bytes: Some(100),
                            ready_rss_bytes: Some(1),
                            turns_peak_rss_bytes: Some(rss),
                        },
                    )
                })
                .collect(),
            goals: Vec::new(),
        });
        r
    }

    #[test]
    fn goals_compare_the_largest_history_with_the_smallest_and_the_peers() {
        let mut rows = [
            row(1_000, &[("spool", 1_000.0, 10), ("sqlite", 500.0, 5)]),
            row(
                50_000,
                &[
                    ("spool", 3_000.0, 14),
                    ("sqlite", 600.0, 5),
                    ("jsonl", 60_000.0, 50),
                ],
            ),
        ];
        let g = goals(&rows);
        let by: BTreeMap<&str, &Goal> = g.iter().map(|g| (g.name, g)).collect();
        assert_eq!(by.len(), 4);
        let rss = by["spool_rss_growth"];
        assert!((rss.value - 1.4).abs() < 1e-9 && rss.met && rss.at_most);
        let time = by["spool_time_growth"];
        assert!((time.value - 3.0).abs() < 1e-9 && !time.met);
        let sq = by["speed_vs_sqlite"];
        assert!((sq.value - 0.2).abs() < 1e-9 && !sq.met && !sq.at_most);
        let js = by["speed_vs_jsonl"];
        assert!((js.value - 20.0).abs() < 1e-9 && js.met);
        assert!(rss.description.contains("during the turns"));
        rows[1].execute.as_mut().unwrap().goals = g.clone();
        let md = markdown(&rows);
        assert!(
            md.contains("| 50000 | jsonl | 60000 (60000–60000) |"),
            "{md}"
        );
        assert_eq!(md.matches(": missed").count(), 2, "{md}");
    }

    #[test]
    fn without_the_turns_peak_the_memory_goal_takes_the_process_peak() {
        let mut rows = [
            row(1_000, &[("spool", 1_000.0, 10)]),
            row(50_000, &[("spool", 1_000.0, 30)]),
        ];
        for s in rows[0].execute.as_mut().unwrap().subjects.values_mut() {
            s.turns_peak_rss_bytes = None;
        }
        let g = goals(&rows);
        let rss = g.iter().find(|g| g.name == "spool_rss_growth").unwrap();
        assert!((rss.value - 1.0).abs() < 1e-9 && rss.met);
        assert!(rss.description.contains("of the process"));
    }

    #[test]
    fn without_spool_there_are_no_goals() {
        let rows = [
            row(200, &[("sqlite", 500.0, 5), ("jsonl", 600.0, 5)]),
            row(1_000, &[("sqlite", 500.0, 5), ("jsonl", 900.0, 5)]),
        ];
        assert!(goals(&rows).is_empty());
    }
}
