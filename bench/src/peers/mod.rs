//! The peers spool is measured against, each in its best honest
//! configuration (see each module for the exact setup):
//!
//! - [`sqlite`]: what most agent frameworks persist to (rusqlite with its
//!   bundled SQLite, WAL).
//! - [`jsonl`]: one JSONL file per session, what most coding agents write.
//! - [`json_file`]: one JSON file per session holding the whole session,
//!   the layout of the runtime's JSON file store; the `list` peer.
//! - [`raw`]: the physical limit of the disk: raw writes, with and without
//!   fdatasync, no format at all.
//! - [`postgres`]: a PostgreSQL server ([`pg_server`] starts a throwaway
//!   one), for `append-durable` and `open`.

pub mod json_file;
pub mod jsonl;
pub mod pg_server;
pub mod postgres;
pub mod raw;
pub mod sqlite;

use std::fs::File;
use std::path::Path;

use crate::error::{io_err, BenchError};
use crate::subject::{ContextSummary, PageSummary};

/// fsyncs a directory so that the names created in it are durable.
pub(crate) fn sync_dir(subject: &str, dir: &Path) -> Result<(), BenchError> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(subject, dir, e))
}

/// Builds a context from entries given newest first: takes entries while
/// their payload bytes fit in `budget` together. `sizes` yields each
/// entry's payload size, newest first; returns how many were taken and
/// their bytes.
#[cfg(test)]
pub(crate) fn tail_under_budget(sizes: impl Iterator<Item = usize>, budget: usize) -> (u64, u64) {
    let mut entries = 0;
    let mut bytes = 0u64;
    for b in sizes {
        if bytes + b as u64 > budget as u64 {
            break;
        }
        bytes += b as u64;
        entries += 1;
    }
    (entries, bytes)
}

/// Splits entries (oldest first) into pages of at most `budget` payload
/// bytes, a larger entry forming a page alone; returns the summary.
pub(crate) fn paginate(sizes: impl Iterator<Item = usize>, budget: usize) -> PageSummary {
    let mut s = PageSummary::default();
    let mut in_page = 0u64;
    let mut page_open = false;
    for b in sizes {
        let b = b as u64;
        if page_open && in_page + b > budget as u64 {
            page_open = false;
        }
        if !page_open {
            s.pages += 1;
            in_page = 0;
            page_open = true;
        }
        in_page += b;
        s.entries += 1;
        s.bytes += b;
    }
    s
}

pub(crate) fn context(entries: u64, bytes: u64) -> ContextSummary {
    ContextSummary {
        entries,
        bytes,
        resident_bytes: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_and_pages_follow_the_budget() {
        assert_eq!(tail_under_budget([10, 20, 30, 40].into_iter(), 55), (2, 30));
        assert_eq!(tail_under_budget([60].into_iter(), 55), (0, 0));
        let p = paginate([10, 20, 30, 100, 5].into_iter(), 50);
        assert_eq!((p.pages, p.entries, p.bytes), (4, 5, 165));
        assert_eq!(paginate(std::iter::empty(), 50), PageSummary::default());
    }
}
