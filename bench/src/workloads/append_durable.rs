//! `append-durable`: each writer thread commits its own session's records,
//! one commit per record, acknowledged only once on stable storage; timed
//! from a common start to the last writer's end. Variants: 1 and 16
//! concurrent writers.

use crate::data::{self, Record};
use crate::error::BenchError;
use crate::harness::Harness;
use crate::peers;
use crate::report::ResultRow;
use crate::subject::{Durability, SpoolSubject};
use crate::workloads::Workload;

/// The concurrent writer counts of `append-durable`.
pub const DURABLE_WRITERS: [usize; 2] = [1, 16];

/// Runs the workload: one row per variant (and unit).
pub fn run(h: &mut Harness<'_>, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
    let mut rows = Vec::new();
    for writers in DURABLE_WRITERS {
        let n = if writers == 1 {
            h.sizes.durable_commits_1
        } else {
            h.sizes.durable_commits_16
        };
        let per_writer: Vec<Vec<Record>> = (0..writers)
            .map(|w| data::transcript(data::DEFAULT_SEED, w as u64, n))
            .collect();
        let variant = format!("writers={writers}");
        let sqlite = peers::sqlite::SqlitePeer;
        let jsonl = peers::jsonl::JsonlPeer;
        let raw = peers::raw::RawPeer::in_place(n);
        let raw_append = peers::raw::RawPeer::appending();
        let pg_missing = h.pg.available().err();
        let mut subjects: Vec<&dyn SpoolSubject> = vec![spool, &sqlite];
        if pg_missing.is_none() {
            subjects.push(h.pg);
        }
        subjects.extend([&jsonl as &dyn SpoolSubject, &raw, &raw_append]);
        subjects.retain(|s| s.supports(Workload::AppendDurable));
        let measured = h.append_rounds(&subjects, Durability::Durable, &variant, &per_writer)?;
        let mut row = ResultRow::from_measured(
            Workload::AppendDurable.name(),
            &variant,
            "commits/s",
            measured.into_iter().map(|(name, c, _)| (name, c)),
        );
        if let Some(note) = pg_missing {
            row.missing_peer(h.pg.name(), &note);
        }
        rows.push(row);
    }
    Ok(rows)
}
