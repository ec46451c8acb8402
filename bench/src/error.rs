//! The one error type of the harness, its peers and the spool subject.
//!
//! A variant's message names the subject and what it was doing; the cause
//! (an I/O, SQLite or JSON error) is its `source()`, printed once by
//! `main` below the message.

use std::path::{Path, PathBuf};

/// Errors of the benchmark harness, its peers and the spool subject.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("{subject}: I/O error on {}", path.display())]
    Io {
        subject: String,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{subject}: SQLite error while {context}")]
    Sqlite {
        subject: String,
        context: String,
        #[source]
        source: rusqlite::Error,
    },
    #[error("{subject}: bad JSON in {} at line {line}", path.display())]
    Json {
        subject: String,
        path: PathBuf,
        line: u64,
        #[source]
        source: serde_json::Error,
    },
    /// The subject's own error (the spool subject reports engine or
    /// runtime errors through this).
    #[error("{subject}: {message}")]
    Subject { subject: String, message: String },
    /// A subject was asked for an operation it does not implement.
    #[error("{subject} does not support {operation}")]
    Unsupported {
        subject: String,
        operation: &'static str,
    },
    /// A subject's answer differs from the expected one: its figure would
    /// not measure the same work as the others'.
    #[error("{subject} answered {got} for {workload} {variant}, expected {expected}")]
    WrongAnswer {
        subject: String,
        workload: &'static str,
        variant: String,
        got: String,
        expected: String,
    },
    #[error("unknown workload {:?} (known: {})", .0, crate::workloads::known_names())]
    UnknownWorkload(String),
}

/// An I/O error of `subject` on `path`.
pub fn io_err(subject: &str, path: &Path, source: std::io::Error) -> BenchError {
    BenchError::Io {
        subject: subject.to_string(),
        path: path.to_path_buf(),
        source,
    }
}
