//! The JSON file store peer: one JSON file per session holding the whole
//! session (header, definition, state with its transcript), the layout of
//! the runtime's JSON file store. It is the `list` peer.
//!
//! Listing has no index to use: read the directory, read and parse every
//! file, keep the headers with the wanted status, sort newest update
//! first. Parsing deserializes only the header (`info`); serde_json still
//! has to scan the rest of each file, as any JSON reader must.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::sync_dir;
use crate::data::{JsonEntry, Record};
use crate::error::{io_err, BenchError};
use crate::subject::{Durability, SessionData, SessionSpec, SpoolSubject, Status, SubjectStore};
use crate::workloads::Workload;

const NAME: &str = "json-file";

/// The JSON file store peer (key `json-file`): takes part in `list` only.
#[derive(Clone, Copy, Debug, Default)]
pub struct JsonFilePeer;

impl SpoolSubject for JsonFilePeer {
    fn name(&self) -> &str {
        NAME
    }

    fn supports(&self, workload: Workload) -> bool {
        workload == Workload::List
    }

    fn open_store(
        &self,
        dir: &Path,
        _durability: Durability,
        _writers: usize,
    ) -> Result<Box<dyn SubjectStore>, BenchError> {
        Ok(Box::new(JsonFileStore {
            dir: dir.to_path_buf(),
        }))
    }
}

/// A session header as the file stores it.
#[derive(Debug, Serialize, Deserialize)]
struct Info {
    id: String,
    parent_id: Option<String>,
    status: String,
    version: u64,
    agent_name: String,
    label: Option<String>,
    created_ms: i64,
    updated_ms: i64,
}

#[derive(Serialize)]
struct SessionFile<'a> {
    info: Info,
    definition: Definition<'a>,
    state: State,
}

#[derive(Serialize)]
struct Definition<'a> {
    name: &'a str,
    description: &'a str,
    system_prompt: &'a str,
}

#[derive(Serialize)]
struct State {
    transcript: Vec<JsonEntry>,
    execution_count: u64,
}

/// What listing deserializes: the header only; the rest is skipped.
#[derive(Deserialize)]
struct HeaderOnly {
    info: Info,
}

/// An open JSON file store: a directory of `<session id>.json` files.
pub struct JsonFileStore {
    dir: PathBuf,
}

impl JsonFileStore {
    fn write_session(&self, spec: &SessionSpec, records: &[Record]) -> Result<(), BenchError> {
        let path = self.dir.join(format!("{}.json", spec.id()));
        let file = SessionFile {
            info: Info {
                id: spec.id(),
                parent_id: spec.parent.map(crate::subject::session_id),
                status: spec.status.as_str().to_string(),
                version: records.len() as u64,
                agent_name: spec.agent().to_string(),
                label: None,
                created_ms: spec.updated_ms,
                updated_ms: spec.updated_ms,
            },
            definition: Definition {
                name: spec.agent(),
                description: "an agent of the benchmark",
                system_prompt: "You are a careful coding agent. Use the tools you are given.",
            },
            state: State {
                transcript: records
                    .iter()
                    .enumerate()
                    .map(|(i, r)| JsonEntry::new(i as u64, r))
                    .collect(),
                execution_count: 1,
            },
        };
        let f = File::create(&path).map_err(|e| io_err(NAME, &path, e))?;
        let mut out = BufWriter::new(f);
        serde_json::to_writer(&mut out, &file).map_err(|source| BenchError::Json {
            subject: NAME.into(),
            path: path.clone(),
            line: 1,
            source,
        })?;
        out.flush().map_err(|e| io_err(NAME, &path, e))
    }
}

impl SubjectStore for JsonFileStore {
    fn subject(&self) -> &str {
        NAME
    }

    fn create_session(&self, _writer: usize, session: &SessionSpec) -> Result<(), BenchError> {
        self.write_session(session, &[])
    }

    fn append(
        &self,
        _writer: usize,
        _session: &SessionSpec,
        _seq: u64,
        _record: &Record,
    ) -> Result<u64, BenchError> {
        Err(self.unsupported("append"))
    }

    /// Writes every session file, then syncs the directory once. Files are
    /// not fsynced one by one (setup speed; listing reads the page cache
    /// either way).
    fn load(&self, sessions: &[SessionData<'_>]) -> Result<(), BenchError> {
        for s in sessions {
            self.write_session(s.spec, s.records)?;
        }
        sync_dir(NAME, &self.dir)
    }

    fn list_by_status(&self, status: Status) -> Result<u64, BenchError> {
        let want = status.as_str();
        let mut headers = Vec::new();
        let rd = std::fs::read_dir(&self.dir).map_err(|e| io_err(NAME, &self.dir, e))?;
        for entry in rd {
            let entry = entry.map_err(|e| io_err(NAME, &self.dir, e))?;
            let path = entry.path();
            if path.extension().and_then(|e| e.to_str()) != Some("json") {
                continue;
            }
            let bytes = std::fs::read(&path).map_err(|e| io_err(NAME, &path, e))?;
            let h: HeaderOnly =
                serde_json::from_slice(&bytes).map_err(|source| BenchError::Json {
                    subject: NAME.into(),
                    path: path.clone(),
                    line: 1,
                    source,
                })?;
            if h.info.status == want {
                headers.push(h.info);
            }
        }
        headers.sort_by_key(|h| std::cmp::Reverse(h.updated_ms));
        Ok(headers.len() as u64)
    }

    fn close(self: Box<Self>) -> Result<(), BenchError> {
        Ok(())
    }
}
