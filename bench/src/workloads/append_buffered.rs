//! `append-buffered`: one writer commits one record per commit,
//! acknowledged from the page cache; the final flush is not timed. Reports
//! commits/s and MB/s of text.

use crate::data::{self};
use crate::error::BenchError;
use crate::harness::Harness;
use crate::peers;
use crate::report::ResultRow;
use crate::subject::{Durability, SpoolSubject};
use crate::workloads::Workload;

/// Runs the workload: one row per variant (and unit).
pub fn run(h: &mut Harness<'_>, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
    let records = vec![data::transcript(
        data::DEFAULT_SEED,
        0,
        h.sizes.buffered_commits,
    )];
    let variant = "writers=1".to_string();
    let sqlite = peers::sqlite::SqlitePeer;
    let jsonl = peers::jsonl::JsonlPeer;
    let raw = peers::raw::RawPeer::sequential_buffered();
    let mut subjects: Vec<&dyn SpoolSubject> = vec![spool, &sqlite, &jsonl, &raw];
    subjects.retain(|s| s.supports(Workload::AppendBuffered));
    let mut commits = Vec::new();
    let mut mbs = Vec::new();
    for (name, c, b) in h.append_rounds(&subjects, Durability::Buffered, &variant, &records)? {
        commits.push((name.clone(), c));
        mbs.push((name, b));
    }
    let w = Workload::AppendBuffered.name();
    Ok(vec![
        ResultRow::from_measured(w, &variant, "commits/s", commits),
        ResultRow::from_measured(w, &variant, "MB/s", mbs),
    ])
}
