//! `page`: the whole branch of one long session, read oldest first in pages
//! of the page budget, text in memory. Reports MB/s of text.

use crate::data::{self};
use crate::error::BenchError;
use crate::harness::{close_all, rounds, wrong, Harness, MB, PAGE_BUDGET};
use crate::report::ResultRow;
use crate::stats;
use crate::subject::{SessionData, SessionSpec, SpoolSubject};
use crate::workloads::Workload;

/// Runs the workload: one row per variant (and unit).
pub fn run(h: &mut Harness<'_>, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
    let n = h.sizes.page_history;
    let records = data::transcript(data::DEFAULT_SEED, 0, n);
    let total = data::total_bytes(&records);
    let spec = SessionSpec::new(0);
    let variant = format!("history={n}");
    let peers = h.peers_for(Workload::Page);
    let mut subjects: Vec<&dyn SpoolSubject> = vec![spool];
    subjects.extend(peers.iter().map(|p| p.as_ref()));
    let sessions = [SessionData {
        spec: &spec,
        records: &records,
    }];
    let loaded = h.load_all(&subjects, Workload::Page, &variant, &sessions)?;
    let (min_time, max_iters) = (h.sizes.min_time, h.sizes.max_iters);
    let measured = rounds(h.sizes.repetitions, &loaded, |_, l| {
        let r = stats::rate_loop(min_time, max_iters, || {
            let got = l.store.read_branch(&spec, PAGE_BUDGET)?;
            if got.entries != n as u64 || got.bytes != total || got.pages == 0 {
                return Err(wrong(
                    l.name(),
                    Workload::Page,
                    &variant,
                    format!("{got:?}"),
                    format!("{n} entries, {total} bytes"),
                ));
            }
            Ok(got.bytes)
        })?;
        Ok(r / MB)
    })?;
    close_all(loaded)?;
    Ok(vec![ResultRow::from_measured(
        Workload::Page.name(),
        &variant,
        "MB/s",
        measured,
    )])
}
