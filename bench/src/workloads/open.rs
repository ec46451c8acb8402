//! `open`: the store is loaded, closed and reopened; then each open builds
//! the model context, the newest entries fitting the context budget, with
//! their text in memory. One variant per history length. spool's rows also
//! carry the open in microseconds, the handle's resident bytes and the
//! first page read on an open handle: an open's cost and a handle's memory
//! should not grow with the history.

use crate::data::{self, Record};
use crate::error::BenchError;
use crate::harness::{
    check_context, close_all, expected_context, expected_first_page, rounds, wrong, Harness,
    CONTEXT_BUDGET, PAGE_BUDGET,
};
use crate::report::ResultRow;
use crate::stats;
use crate::subject::{ContextSummary, SessionData, SessionSpec, SpoolSubject, SubjectStore};
use crate::workloads::Workload;

/// Runs the workload: one row per variant (and unit).
pub fn run(h: &mut Harness<'_>, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
    let mut rows = Vec::new();
    for &n in &h.sizes.open_histories.clone() {
        let records = data::transcript(data::DEFAULT_SEED, 0, n);
        let spec = SessionSpec::new(0);
        let variant = format!("history={n}");
        let peers = h.peers_for(Workload::Open);
        let pg_missing = h.pg.available().err();
        let mut subjects: Vec<&dyn SpoolSubject> = vec![spool];
        subjects.extend(peers.iter().map(|p| p.as_ref()));
        if pg_missing.is_none() {
            subjects.push(h.pg);
        }
        let sessions = [SessionData {
            spec: &spec,
            records: &records,
        }];
        let loaded = h.load_all(&subjects, Workload::Open, &variant, &sessions)?;
        // Each subject's answer in its own unit.
        let expected: Vec<ContextSummary> = loaded
            .iter()
            .map(|l| expected_context(&records, CONTEXT_BUDGET, |r, q| l.store.entry_cost(r, q)))
            .collect();
        let mut resident = None;
        let (min_time, max_iters) = (h.sizes.min_time, h.sizes.max_iters);
        let measured = rounds(h.sizes.repetitions, &loaded, |i, l| {
            stats::rate_loop(min_time, max_iters, || {
                let got = l.store.open_context(&spec, CONTEXT_BUDGET)?;
                check_context(l.name(), Workload::Open, &variant, got, expected[i])?;
                if got.resident_bytes.is_some() {
                    resident = got.resident_bytes;
                }
                Ok(1)
            })
        })?;
        let mut first_page = None;
        for l in loaded.iter().filter(|l| l.name() == "spool") {
            first_page = first_page_us(h, l.subject, l.store.as_ref(), &spec, &records, &variant)?;
        }
        close_all(loaded)?;
        let mut row =
            ResultRow::from_measured(Workload::Open.name(), &variant, "opens/s", measured);
        if let Some(note) = pg_missing {
            row.missing_peer(h.pg.name(), &note);
        }
        let micros = |rate: Option<f64>| rate.filter(|r| *r > 0.0).map(|r| 1e6 / r);
        row.history = Some(n as u64);
        row.open_us = micros(row.spool);
        row.resident_bytes = resident;
        row.first_page_us = first_page;
        row.jsonl_open_us = micros(row.peer("jsonl"));
        rows.push(row);
    }
    Ok(rows)
}

/// Median microseconds of one first page read on `store`, checked
/// against the expected page; `None` when the subject has no such
/// read.
fn first_page_us(
    h: &Harness<'_>,
    s: &dyn SpoolSubject,
    store: &dyn SubjectStore,
    spec: &SessionSpec,
    records: &[Record],
    variant: &str,
) -> Result<Option<f64>, BenchError> {
    let expected = expected_first_page(records, PAGE_BUDGET, |r, q| store.entry_cost(r, q));
    match store.first_page(spec, PAGE_BUDGET) {
        Err(BenchError::Unsupported { .. }) => return Ok(None),
        Err(e) => return Err(e),
        Ok(_) => {}
    }
    let samples = stats::repeat(h.sizes.repetitions, |_| {
        stats::rate_loop(h.sizes.min_time, h.sizes.max_iters, || {
            let got = store.first_page(spec, PAGE_BUDGET)?;
            if got != expected {
                return Err(wrong(
                    s.name(),
                    Workload::Open,
                    variant,
                    format!("first page {got:?}"),
                    format!("{expected:?}"),
                ));
            }
            Ok(1)
        })
    })?;
    Ok(samples
        .summary()
        .map(|m| m.median)
        .filter(|r| *r > 0.0)
        .map(|r| 1e6 / r))
}
