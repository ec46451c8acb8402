//! Error types of the engine.
//!
//! Expected outcomes (a version conflict, an idempotent retry) are not errors: they are
//! variants of [`crate::AppendOutcome`]. Everything here is a fault or invalid input.

use std::io;
use std::path::PathBuf;

/// Every fault the engine can report.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// An I/O call failed. `op` names the operation (e.g. `"sync_data"`).
    #[error("I/O error during {op} on {}", path.display())]
    Io {
        path: PathBuf,
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// The log is damaged at a place recovery must not repair silently.
    #[error("corrupt segment {segment} at offset {offset}: {problem}")]
    Corrupt {
        /// File name of the segment (e.g. `0000000000000001.seg`).
        segment: String,
        offset: u64,
        problem: String,
    },
    /// The last segment ends in bytes that are not a valid record, where the index
    /// records that commits up to `synced_seq` were on disk: the bytes are damage to
    /// acknowledged commits, not the write in flight at a crash. Nothing was trimmed.
    #[error(
        "segment {segment} at offset {offset}: {problem}; the index records commits up to          seq {synced_seq} as on disk, the log's valid records end at seq {last_seq}:          acknowledged commits are damaged, not torn (`verify --salvage` copies every          readable commit)"
    )]
    DamagedTail {
        /// File name of the segment (e.g. `0000000000000001.seg`).
        segment: String,
        offset: u64,
        problem: String,
        /// Highest seq the index records as synced to disk.
        synced_seq: u64,
        /// Seq of the last valid record in the log.
        last_seq: u64,
    },
    /// Another owner holds the store's lock file.
    #[error("store is locked by another owner: {}", path.display())]
    Locked { path: PathBuf },
    /// An earlier write or fsync failed; the outcome of writes is unknown, so every later
    /// write is refused until the store is reopened (which recovers from the log).
    #[error("store is poisoned by an earlier write failure ({cause}); reopen it")]
    Poisoned {
        /// The failure that poisoned the store, as it was reported then (e.g. a full
        /// disk's "No space left on device"), so that every later refusal names it.
        cause: String,
    },
    /// A write was attempted on a store opened read-only.
    #[error("store is opened read-only")]
    ReadOnly,
    /// The caller passed something the engine does not accept.
    #[error("invalid input: {0}")]
    InvalidInput(String),
    /// Judging commit `index` of a [`Store::append_batch`](crate::Store::append_batch)
    /// failed (nothing of the batch was written).
    #[error("commit {index} of the batch")]
    InBatch {
        index: usize,
        #[source]
        source: Box<Error>,
    },
    /// A commit's encoded record exceeds the configured maximum record size.
    #[error("record of {bytes} bytes exceeds the maximum of {max} bytes")]
    RecordTooLarge { bytes: u64, max: u64 },
    /// A file was written by a format version this build does not understand.
    #[error("{} has format version {found}; this build supports up to {supported}", path.display())]
    UnsupportedFormat {
        path: PathBuf,
        found: u32,
        supported: u32,
    },
    /// The derived index failed. When it happens during an append the commit is durable in
    /// the log, the store is poisoned, and reopening catches the index up.
    #[error(transparent)]
    Index(#[from] IndexError),
    /// A GC plan no longer fits the log (another GC ran, or a stream it removes
    /// commits from has changed): plan again. Nothing was changed.
    #[error("GC plan is stale: {0}")]
    GcPlanStale(String),
    /// A log position or sequence number that does not name a record.
    #[error("no record at {0}")]
    NotFound(String),
}

impl Error {
    pub(crate) fn io(path: impl Into<PathBuf>, op: &'static str, source: io::Error) -> Error {
        let path = path.into();
        // A segment a read-only open took from a checkpoint is opened and checked by
        // its first read: what that check finds is damage, not an I/O failure.
        let damage = source
            .get_ref()
            .and_then(|e| e.downcast_ref::<crate::store::SegmentDamage>());
        if let Some(d) = damage {
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            return Error::corrupt(
                &name.unwrap_or_else(|| path.display().to_string()),
                d.offset,
                d.problem.clone(),
            );
        }
        Error::Io { path, op, source }
    }

    pub(crate) fn corrupt(segment: &str, offset: u64, problem: impl Into<String>) -> Error {
        Error::Corrupt {
            segment: segment.to_string(),
            offset,
            problem: problem.into(),
        }
    }
}

/// Faults of the derived (sled) index layer.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IndexError {
    /// sled itself failed.
    #[error(transparent)]
    Sled(#[from] sled::Error),
    /// An [`crate::Indexer`] refused a commit.
    #[error("indexer {name}: {message}")]
    Indexer { name: String, message: String },
    /// The index holds bytes it cannot decode.
    #[error("index entry is malformed: {0}")]
    Malformed(String),
    /// The index disagrees with the log.
    #[error("index disagrees with the log: {0}")]
    Mismatch(String),
    /// A rebuild of the index in place (a GC's) began but did not finish, so the
    /// index holds part of the log; the store is poisoned and reads of the index fail
    /// until it is reopened (the open rebuilds it).
    #[error("the index was left part-rebuilt by a GC that did not finish; reopen the store")]
    Incomplete,
    /// An operation that needs sled on an index over a checkpoint file, which has
    /// none (a read-only open from a checkpoint).
    #[error("the index over a checkpoint file has no sled to {0}")]
    NoSled(&'static str),
    /// A move into sled too large for one redo record (`REDO_RECORD_BYTES_MAX`, 1 GiB:
    /// one memtable's writes, at most about 16 MiB, plus one group's).
    #[error("a move of {writes} index writes needs a {bytes}-byte redo record, over the {max}-byte limit")]
    MoveTooLarge { writes: u64, bytes: u64, max: u64 },
    /// A spill run of a bulk load (see `index/spill.rs`) could not be written or read.
    #[error("index spill run: {0}")]
    Spill(String),
    /// The redo log of the index's moves into sled could not be read or written.
    #[error("{op} {} at offset {offset}", path.display())]
    Redo {
        path: std::path::PathBuf,
        op: &'static str,
        offset: u64,
        #[source]
        source: std::io::Error,
    },
}

impl IndexError {
    pub(crate) fn redo(
        path: &std::path::Path,
        op: &'static str,
        offset: u64,
        source: std::io::Error,
    ) -> IndexError {
        IndexError::Redo {
            path: path.to_path_buf(),
            op,
            offset,
            source,
        }
    }

    /// Convenience for indexers: an error carrying the indexer's name and a message.
    pub fn indexer(name: &str, message: impl Into<String>) -> IndexError {
        IndexError::Indexer {
            name: name.to_string(),
            message: message.into(),
        }
    }
}

impl IndexError {
    /// The index error inside `e`, or `e` as a mismatch when it is not one (an I/O error
    /// on the index directory, say): for code that reports index failures as such.
    pub(crate) fn from_error(e: Error) -> IndexError {
        match e {
            Error::Index(i) => i,
            other => IndexError::Mismatch(other.to_string()),
        }
    }
}

/// `e` and each of its causes, joined by ": ", for a report that keeps an
/// error as text (a `Display` shows only its own level, never its source).
pub(crate) fn chain_text(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}

#[cfg(test)]
mod chain_tests {
    use super::*;

    #[test]
    fn chain_text_names_every_cause_once() {
        let e = Error::io(
            std::path::Path::new("/x/0001.seg"),
            "read_at",
            std::io::Error::other("disk on fire"),
        );
        let text = chain_text(&e);
        assert!(text.ends_with(": disk on fire"), "{text}");
        assert_eq!(text.matches("disk on fire").count(), 1, "{text}");
    }
}
