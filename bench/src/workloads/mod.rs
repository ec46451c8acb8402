//! The standard workloads, one file each.
//!
//! Names as given to `--workload`; a name without its suffix, such as
//! `append`, selects every workload that starts with `append-`:
//!
//! | workload          | variants                        | unit        | peers                          |
//! |-------------------|---------------------------------|-------------|--------------------------------|
//! | `append-durable`  | `writers=1`, `writers=16`       | commits/s   | sqlite, postgres, jsonl, raw, raw-append |
//! | `append-buffered` | `writers=1`                     | commits/s, MB/s | sqlite, jsonl, raw         |
//! | `open`            | `history=2000/10000/50000`      | opens/s     | sqlite, postgres, jsonl        |
//! | `page`            | `history=50000`                 | MB/s        | sqlite, jsonl                  |
//! | `list`            | `sessions=10000`                | lists/s     | sqlite, json-file              |
//! | `fork`            | `history=10000`                 | forks/s     | sqlite                         |
//! | `execute`         | `history=1000/10000/50000`      | executes/s  | sqlite, jsonl (each in its own process) |
//! | `store`           | `QUESTION commits=10100/101000/1010000` | runs/s (+ s, RSS) | sqlite, jsonl     |
//!
//! `store` is opt-in (not run by default): it builds stores of up to a
//! million commits and asks each question in a fresh process.
//!
//! `--quick` runs the same variants at small sizes (the variant names carry
//! the sizes actually used) and fewer repetitions, so it finishes in seconds.
//!
//! A workload is a module with one `run(harness, spool)` function that
//! loads or appends through the [`Harness`], times the subjects in
//! interleaved rounds and returns its result rows. Adding one takes the
//! module, a [`Workload`] variant with its name, a line in [`run`], its
//! sizes in [`crate::harness::Sizes`], and the subjects' `supports` answers.

mod append_buffered;
mod append_durable;
pub mod execute;
mod fork;
mod list;
mod open;
mod page;
pub mod store;

use crate::error::BenchError;
use crate::harness::Harness;
use crate::report::ResultRow;
use crate::subject::SpoolSubject;

/// A workload of the standard set.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Workload {
    AppendDurable,
    AppendBuffered,
    Open,
    Page,
    List,
    Fork,
    Execute,
    Store,
}

impl Workload {
    pub const ALL: [Workload; 7] = [
        Workload::AppendDurable,
        Workload::AppendBuffered,
        Workload::Open,
        Workload::Page,
        Workload::List,
        Workload::Fork,
        Workload::Execute,
    ];

    /// Workloads run only when named.
    pub const OPT_IN: [Workload; 1] = [Workload::Store];

    pub fn name(self) -> &'static str {
        match self {
            Workload::AppendDurable => "append-durable",
            Workload::AppendBuffered => "append-buffered",
            Workload::Open => "open",
            Workload::Page => "page",
            Workload::List => "list",
            Workload::Fork => "fork",
            Workload::Execute => "execute",
            Workload::Store => "store",
        }
    }

    /// Whether the name given to `--workload` selects this workload: the
    /// full name, or its prefix before a `-` (`append`).
    pub fn matches(self, name: &str) -> bool {
        let full = self.name();
        full == name || full.split('-').next() == Some(name)
    }
}

/// The workloads a config selects, in the standard order.
pub fn select_workloads(names: &[String]) -> Result<Vec<Workload>, BenchError> {
    if names.is_empty() {
        return Ok(Workload::ALL.to_vec());
    }
    let every = Workload::ALL.into_iter().chain(Workload::OPT_IN);
    for n in names {
        if !every.clone().any(|w| w.matches(n)) {
            return Err(BenchError::UnknownWorkload(n.clone()));
        }
    }
    Ok(every
        .filter(|w| names.iter().any(|n| w.matches(n)))
        .collect())
}
/// The names of every workload, comma-separated, for messages.
pub fn known_names() -> String {
    Workload::ALL
        .into_iter()
        .chain(Workload::OPT_IN)
        .map(Workload::name)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Runs one workload against `spool` and the peers that take part in it.
pub fn run(
    workload: Workload,
    h: &mut Harness<'_>,
    spool: &dyn SpoolSubject,
) -> Result<Vec<ResultRow>, BenchError> {
    match workload {
        Workload::AppendDurable => append_durable::run(h, spool),
        Workload::AppendBuffered => append_buffered::run(h, spool),
        Workload::Open => open::run(h, spool),
        Workload::Page => page::run(h, spool),
        Workload::List => list::run(h, spool),
        Workload::Fork => fork::run(h, spool),
        Workload::Execute => execute::run(h, spool),
        Workload::Store => store::run(h),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workload_names_select_and_reject() {
        let names =
            |v: &[&str]| select_workloads(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(names(&[]).unwrap(), Workload::ALL.to_vec());
        assert_eq!(
            names(&["append"]).unwrap(),
            vec![Workload::AppendDurable, Workload::AppendBuffered]
        );
        assert_eq!(
            names(&["fork", "open"]).unwrap(),
            vec![Workload::Open, Workload::Fork]
        );
        assert_eq!(names(&["store"]).unwrap(), vec![Workload::Store]);
        assert!(matches!(
            names(&["nope"]),
            Err(BenchError::UnknownWorkload(n)) if n == "nope"
        ));
    }

    #[test]
    fn the_error_for_an_unknown_name_lists_every_workload() {
        let err = select_workloads(&["nope".to_string()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown workload \"nope\" (known: append-durable, append-buffered, open, page, list, fork, execute, store)"
        );
    }
}
