//! The JSONL peer: one file per session, one JSON line per entry, as most
//! coding agents store their sessions.
//!
//! - Append: serialize the entry (serde_json) and write the line with one
//!   `write` on a file opened for appending; durable runs then
//!   `fdatasync` the file (the directory is fsynced once, when the file is
//!   created). Each writer thread has its own file.
//! - Open: read the whole file, parse every line, keep the newest entries
//!   that fit the budget. This is what a file-per-session agent must do:
//!   the file has no index.
//! - Page: the same whole-file parse, then split into pages.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use super::{context, paginate, sync_dir};
use crate::data::{parse_json_line, write_json_line, JsonEntry, Record};
use crate::error::{io_err, BenchError};
use crate::subject::{
    ContextSummary, Durability, PageSummary, SessionData, SessionSpec, SpoolSubject, SubjectStore,
};
use crate::workloads::Workload;

const NAME: &str = "jsonl";

/// The JSONL peer (key `jsonl`).
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonlPeer;

impl SpoolSubject for JsonlPeer {
    fn name(&self) -> &str {
        NAME
    }

    fn supports(&self, workload: Workload) -> bool {
        matches!(
            workload,
            Workload::AppendDurable | Workload::AppendBuffered | Workload::Open | Workload::Page
        )
    }

    fn open_store(
        &self,
        dir: &Path,
        durability: Durability,
        writers: usize,
    ) -> Result<Box<dyn SubjectStore>, BenchError> {
        Ok(Box::new(JsonlStore {
            dir: dir.to_path_buf(),
            durability,
            writers: (0..writers.max(1))
                .map(|_| Mutex::new(WriterState::default()))
                .collect(),
        }))
    }
}

#[derive(Default)]
struct WriterState {
    files: HashMap<u64, File>,
    line: Vec<u8>,
}

/// An open JSONL store: a directory of `<session id>.jsonl` files.
pub struct JsonlStore {
    dir: PathBuf,
    durability: Durability,
    writers: Vec<Mutex<WriterState>>,
}

impl JsonlStore {
    fn path(&self, session: &SessionSpec) -> PathBuf {
        self.dir.join(format!("{}.jsonl", session.id()))
    }

    fn writer(&self, writer: usize) -> Result<std::sync::MutexGuard<'_, WriterState>, BenchError> {
        self.writers
            .get(writer)
            .ok_or_else(|| BenchError::Subject {
                subject: NAME.into(),
                message: format!("writer {writer} out of range"),
            })?
            .lock()
            .map_err(|_| BenchError::Subject {
                subject: NAME.into(),
                message: "a writer's lock was poisoned by a panicking thread".into(),
            })
    }

    /// Reads and parses the whole file of `session`.
    fn parse_all(&self, session: &SessionSpec) -> Result<Vec<JsonEntry>, BenchError> {
        let path = self.path(session);
        let bytes = std::fs::read(&path).map_err(|e| io_err(NAME, &path, e))?;
        let mut out = Vec::new();
        for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
            if line.is_empty() {
                continue;
            }
            let e = parse_json_line(line).map_err(|source| BenchError::Json {
                subject: NAME.into(),
                path: path.clone(),
                line: i as u64 + 1,
                source,
            })?;
            out.push(e);
        }
        Ok(out)
    }

    fn serialize(line: &mut Vec<u8>, path: &Path, seq: u64, r: &Record) -> Result<(), BenchError> {
        write_json_line(line, seq, r).map_err(|source| BenchError::Json {
            subject: NAME.into(),
            path: path.to_path_buf(),
            line: seq + 1,
            source,
        })
    }
}

impl SubjectStore for JsonlStore {
    fn subject(&self) -> &str {
        NAME
    }

    fn create_session(&self, writer: usize, session: &SessionSpec) -> Result<(), BenchError> {
        let path = self.path(session);
        let file = OpenOptions::new()
            .create_new(true)
            .append(true)
            .open(&path)
            .map_err(|e| io_err(NAME, &path, e))?;
        if self.durability == Durability::Durable {
            file.sync_all().map_err(|e| io_err(NAME, &path, e))?;
            sync_dir(NAME, &self.dir)?;
        }
        self.writer(writer)?.files.insert(session.key, file);
        Ok(())
    }

    fn append(
        &self,
        writer: usize,
        session: &SessionSpec,
        seq: u64,
        record: &Record,
    ) -> Result<u64, BenchError> {
        let mut w = self.writer(writer)?;
        let WriterState { files, line } = &mut *w;
        let file = files
            .get_mut(&session.key)
            .ok_or_else(|| BenchError::Subject {
                subject: NAME.into(),
                message: format!("session {} is not open on writer {writer}", session.id()),
            })?;
        line.clear();
        Self::serialize(line, &self.dir, seq, record)?;
        file.write_all(line)
            .map_err(|e| io_err(NAME, &self.path(session), e))?;
        if self.durability == Durability::Durable {
            file.sync_data()
                .map_err(|e| io_err(NAME, &self.path(session), e))?;
        }
        Ok(record.bytes() as u64)
    }

    fn load(&self, sessions: &[SessionData<'_>]) -> Result<(), BenchError> {
        let mut line = Vec::new();
        for s in sessions {
            let path = self.path(s.spec);
            let file = File::create(&path).map_err(|e| io_err(NAME, &path, e))?;
            let mut out = BufWriter::new(file);
            for (seq, r) in s.records.iter().enumerate() {
                line.clear();
                Self::serialize(&mut line, &path, seq as u64, r)?;
                out.write_all(&line).map_err(|e| io_err(NAME, &path, e))?;
            }
            let file = out
                .into_inner()
                .map_err(|e| io_err(NAME, &path, e.into_error()))?;
            file.sync_all().map_err(|e| io_err(NAME, &path, e))?;
        }
        sync_dir(NAME, &self.dir)
    }

    fn open_context(
        &self,
        session: &SessionSpec,
        budget: usize,
    ) -> Result<ContextSummary, BenchError> {
        let mut all = self.parse_all(session)?;
        let mut start = all.len();
        let mut bytes = 0usize;
        while start > 0 {
            let b = all[start - 1].bytes();
            if bytes + b > budget {
                break;
            }
            bytes += b;
            start -= 1;
        }
        let ctx = all.split_off(start);
        Ok(context(ctx.len() as u64, bytes as u64))
    }

    fn read_branch(
        &self,
        session: &SessionSpec,
        page_budget: usize,
    ) -> Result<PageSummary, BenchError> {
        let all = self.parse_all(session)?;
        Ok(paginate(all.iter().map(JsonEntry::bytes), page_budget))
    }

    fn close(self: Box<Self>) -> Result<(), BenchError> {
        Ok(())
    }
}
