//! `list`: the headers of every active session (about a quarter of them),
//! newest update first; every session also holds a few records so that
//! session files and tables have realistic sizes.

use crate::data::{self, Record};
use crate::error::BenchError;
use crate::harness::{close_all, rounds, wrong, Harness, LIST_ENTRIES_PER_SESSION};
use crate::report::ResultRow;
use crate::stats;
use crate::subject::{SessionData, SessionSpec, SpoolSubject, Status};
use crate::workloads::Workload;

/// Runs the workload: one row per variant (and unit).
pub fn run(h: &mut Harness<'_>, spool: &dyn SpoolSubject) -> Result<Vec<ResultRow>, BenchError> {
    let n = h.sizes.list_sessions;
    let specs = list_sessions(n);
    let records: Vec<Vec<Record>> = (0..n)
        .map(|i| data::transcript(data::DEFAULT_SEED, i as u64, LIST_ENTRIES_PER_SESSION))
        .collect();
    let sessions: Vec<SessionData<'_>> = specs
        .iter()
        .zip(&records)
        .map(|(spec, records)| SessionData { spec, records })
        .collect();
    let expected = specs.iter().filter(|s| s.status == Status::Active).count() as u64;
    let variant = format!("sessions={n}");
    let peers = h.peers_for(Workload::List);
    let mut subjects: Vec<&dyn SpoolSubject> = vec![spool];
    subjects.extend(peers.iter().map(|p| p.as_ref()));
    let loaded = h.load_all(&subjects, Workload::List, &variant, &sessions)?;
    let (min_time, max_iters) = (h.sizes.min_time, h.sizes.max_iters);
    let measured = rounds(h.sizes.repetitions, &loaded, |_, l| {
        stats::rate_loop(min_time, max_iters, || {
            let got = l.store.list_by_status(Status::Active)?;
            if got != expected {
                return Err(wrong(
                    l.name(),
                    Workload::List,
                    &variant,
                    got.to_string(),
                    expected.to_string(),
                ));
            }
            Ok(1)
        })
    })?;
    close_all(loaded)?;
    Ok(vec![ResultRow::from_measured(
        Workload::List.name(),
        &variant,
        "lists/s",
        measured,
    )])
}

/// Session headers of the `list` workload: a fixed mix of statuses (about
/// 25 % active, 10 % suspended, 55 % completed, 10 % failed).
pub fn list_sessions(n: usize) -> Vec<SessionSpec> {
    let mut rng = data::SplitMix64::new(data::DEFAULT_SEED ^ 0x11575);
    (0..n as u64)
        .map(|key| {
            let status = match rng.range(0, 99) {
                0..=24 => Status::Active,
                25..=34 => Status::Suspended,
                35..=89 => Status::Completed,
                _ => Status::Failed,
            };
            SessionSpec {
                status,
                updated_ms: data::BASE_TIMESTAMP_MS + rng.range(0, 86_400_000) as i64,
                ..SessionSpec::new(key)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_statuses_follow_the_documented_mix() {
        let s = list_sessions(10_000);
        let active = s.iter().filter(|x| x.status == Status::Active).count();
        assert!((2_300..2_700).contains(&active), "{active}");
        assert_eq!(s, list_sessions(10_000));
    }
}
