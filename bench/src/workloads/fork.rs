//! `fork`: a durable fork of one session at its middle entry, then opening
//! the fork as `open` does.

use crate::data::{self};
use crate::error::BenchError;
use crate::harness::{check_context, close_all, expected_context, rounds, Harness, CONTEXT_BUDGET};
use crate::report::ResultRow;
use crate::stats;
use crate::subject::{ContextSummary, SessionData, SessionSpec, SpoolSubject};
use crate::workloads::Workload;

/// At most this many forks per repetition of `fork` (each copies half of
/// the source's history, so the store grows with every fork).
pub const FORKS_PER_REPETITION_MAX: u64 = 10;

/// Runs the workload: one row per variant (and unit).
pub fn run(h: &mut Harness<'_>, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
    let n = h.sizes.fork_history;
    let records = data::transcript(data::DEFAULT_SEED, 0, n);
    let at = (n / 2) as u64;
    let forked = &records[..=(at as usize).min(n.saturating_sub(1))];
    let source = SessionSpec::new(0);
    let variant = format!("history={n}");
    let peers = h.peers_for(Workload::Fork);
    let mut subjects: Vec<&dyn SpoolSubject> = vec![spool];
    subjects.extend(peers.iter().map(|p| p.as_ref()));
    let sessions = [SessionData {
        spec: &source,
        records: &records,
    }];
    let loaded = h.load_all(&subjects, Workload::Fork, &variant, &sessions)?;
    let expected: Vec<ContextSummary> = loaded
        .iter()
        .map(|l| expected_context(forked, CONTEXT_BUDGET, |r, q| l.store.entry_cost(r, q)))
        .collect();
    // Fork keys are unique across the run (each store only sees its own).
    let mut next_key = 1u64;
    // Every fork copies half the history; cap the count so the store
    // stays within a few times the source's size per repetition.
    let max_iters = h.sizes.max_iters.min(FORKS_PER_REPETITION_MAX);
    let min_time = h.sizes.min_time;
    let measured = rounds(h.sizes.repetitions, &loaded, |i, l| {
        stats::rate_loop(min_time, max_iters, || {
            let fork = SessionSpec {
                parent: Some(source.key),
                ..SessionSpec::new(next_key)
            };
            next_key += 1;
            let got = l.store.fork_and_open(&source, at, &fork, CONTEXT_BUDGET)?;
            check_context(l.name(), Workload::Fork, &variant, got, expected[i])?;
            Ok(1)
        })
    })?;
    close_all(loaded)?;
    Ok(vec![ResultRow::from_measured(
        Workload::Fork.name(),
        &variant,
        "forks/s",
        measured,
    )])
}
