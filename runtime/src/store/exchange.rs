//! Export and import of sessions as JSONL: the `spool-export` format.
//!
//! An export holds the exact event history of one or more sessions (the
//! current incarnation of each), commit by commit, so an import rebuilds
//! identical sessions: the same ids, versions, commit grouping, commit ids,
//! events and therefore entries.
//!
//! # Format (`spool-export`, version 1)
//!
//! UTF-8 text, one JSON object per line (`\n`-terminated; blank lines are
//! ignored). Three kinds of lines:
//!
//! 1. The **header**, always the first line:
//!    `{"format":"spool-export","version":1,"event_schema":1,"exported_at_ms":T}`.
//!    `version` is [`EXPORT_VERSION`]; a reader refuses a greater one.
//! 2. **Event lines**, one per event:
//!    `{"session":ID,"version":V,"commit_id":UUID,"timestamp_ms":T,"index":I,"events_in_commit":N,"event":EVENT}`.
//!    `version` is the session version the commit created (1-based,
//!    dense); the `N` lines of one commit are consecutive, with `index`
//!    0..N and the same `commit_id` and `timestamp_ms`; the commits of a
//!    session are consecutive and in version order, starting at 1.
//!    `EVENT` is the [`SessionEvent`] in its serde JSON form (an object
//!    tagged by `"type"`, e.g. `{"type":"entry_appended","entry":{...}}`).
//!    `timestamp_ms` is the original commit time (informational: the
//!    store that imports assigns its own commit times, so a session's
//!    `updated_at` after import is the import time).
//! 3. The **end line**, always the last:
//!    `{"end":true,"sessions":S,"commits":C,"events":E}` with the totals.
//!    A file without it is truncated and is refused.
//!
//! New optional fields may be added to any line in the same version;
//! readers ignore fields they do not know.
//!
//! # Import guarantees
//!
//! [`read_export`] parses every line, and [`import_sessions`] folds every
//! session with [`AgentSession::replay`] and checks the target store
//! (no session with the same id, no stream of that name that is not a
//! purged session, no commit id already taken) **before writing anything**.
//! A malformed or truncated file is refused with the line number. Each
//! commit is then appended through the engine under its exact version
//! fence, with the same event kinds (`session.<kind>`) and encoding
//! ([`encode_event`]) as [`LogStore`] uses. Should an append still fail
//! (I/O, a concurrent writer), every session this import wrote is purged
//! again, so no half-imported session stays visible; a crash in the middle
//! of an import can leave a prefix of the commits of one session (a valid
//! session at an earlier version), never a torn commit.

use std::collections::HashSet;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use spool_engine::{
    AppendOutcome, EventData, ExpectedVersion, NewCommit, Uuid, EVENTS_PER_COMMIT_MAX,
};

use super::log::{stored_kind, LogStore, PURGE_EVENT_KIND, SESSION_EVENT_PREFIX};
use super::{SessionStore, StoreError};
use crate::session::{
    decode_event, encode_event, AgentSession, SessionEvent, SessionId, EVENT_SCHEMA,
};
use crate::transcript::now_ms;

/// The `format` value of the header line.
pub const EXPORT_FORMAT: &str = "spool-export";
/// The format version this build writes and the newest it reads.
pub const EXPORT_VERSION: u32 = 1;
/// Longest line a reader accepts (bytes, without the newline): an event
/// line carries one event, which the codec bounds the same way.
pub const EXPORT_LINE_BYTES_MAX: usize = crate::session::MAX_CODEC_INPUT;
/// Commits read from the engine per batch while exporting.
const EXPORT_BATCH_COMMITS: usize = 256;

/// Export or import failed. `Malformed` and `Truncated` name the line of
/// the file; nothing was written when they are returned.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExchangeError {
    #[error("line {line}: {reason}")]
    Malformed { line: u64, reason: String },
    #[error("the file ends after line {line} without its end line: it is truncated")]
    Truncated { line: u64 },
    #[error("session {id} already exists in the store")]
    SessionExists { id: SessionId },
    #[error("the store has a stream named {id} that is not a session")]
    StreamExists { id: SessionId },
    #[error("commit {commit_id} (session {id}, version {version}) is already in the store")]
    CommitIdTaken {
        id: SessionId,
        version: u64,
        commit_id: Uuid,
    },
    #[error("session {id} is not in the store")]
    NotFound { id: SessionId },
    #[error("session {id}, version {version}: {reason}")]
    Unexportable {
        id: SessionId,
        version: u64,
        reason: String,
    },
    #[error(
        "importing session {id} failed at version {version} ({reason}); {}",
        if *rolled_back { "the sessions written by this import were purged again" } else { "purging the sessions written by this import also failed" }
    )]
    ImportFailed {
        id: SessionId,
        version: u64,
        reason: String,
        rolled_back: bool,
    },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] StoreError),
}

fn engine_err(e: spool_engine::Error) -> ExchangeError {
    ExchangeError::Store(StoreError::Engine(e))
}

/// The header line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportHeader {
    pub format: String,
    pub version: u32,
    pub event_schema: u8,
    pub exported_at_ms: i64,
}

/// One event line.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExportEventLine {
    pub session: SessionId,
    pub version: u64,
    pub commit_id: Uuid,
    pub timestamp_ms: i64,
    pub index: u32,
    pub events_in_commit: u32,
    pub event: SessionEvent,
}

/// The end line.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ExportEnd {
    pub end: bool,
    pub sessions: u64,
    pub commits: u64,
    pub events: u64,
}

/// One commit to import: the session version it creates and its events.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportCommit {
    /// Session version this commit creates (1-based, dense).
    pub version: u64,
    pub commit_id: Uuid,
    /// The original commit time (informational; the store assigns its own).
    pub timestamp_ms: i64,
    pub events: Vec<SessionEvent>,
    /// Source line of each event (for error messages); empty or 0 when
    /// the events did not come from a file.
    pub lines: Vec<u64>,
}

/// One session to import: its id and its commits in version order.
#[derive(Clone, Debug, PartialEq)]
pub struct ImportSession {
    pub id: SessionId,
    pub commits: Vec<ImportCommit>,
}

impl ImportSession {
    /// Number of events over all commits.
    pub fn event_count(&self) -> u64 {
        self.commits.iter().map(|c| c.events.len() as u64).sum()
    }

    /// Checks the shape (dense versions from 1, non-empty commits, the
    /// first event is `created` with this id) and folds every event.
    /// Returns the folded session at its last version; errors name the
    /// source line when known.
    pub fn validate(&self) -> Result<AgentSession, ExchangeError> {
        let first_line = |c: &ImportCommit| c.lines.first().copied().unwrap_or(0);
        let malformed = |line: u64, reason: String| ExchangeError::Malformed { line, reason };
        let mut session: Option<AgentSession> = None;
        if self.commits.is_empty() {
            return Err(malformed(0, format!("session {} has no commits", self.id)));
        }
        for (i, c) in self.commits.iter().enumerate() {
            let want = i as u64 + 1;
            if c.version != want {
                return Err(malformed(
                    first_line(c),
                    format!(
                        "session {}: expected version {want}, found {}",
                        self.id, c.version
                    ),
                ));
            }
            if c.events.is_empty() || c.events.len() > EVENTS_PER_COMMIT_MAX {
                return Err(malformed(
                    first_line(c),
                    format!(
                        "session {} version {}: a commit carries 1..={EVENTS_PER_COMMIT_MAX} events, got {}",
                        self.id,
                        c.version,
                        c.events.len()
                    ),
                ));
            }
            for (j, ev) in c.events.iter().enumerate() {
                let line = c.lines.get(j).copied().unwrap_or(0);
                match session.as_mut() {
                    None => {
                        let s = AgentSession::replay(std::iter::once(ev))
                            .map_err(|e| malformed(line, format!("session {}: {e}", self.id)))?;
                        if s.id() != &self.id {
                            return Err(malformed(
                                line,
                                format!(
                                    "the `created` event of session {} names session {}",
                                    self.id,
                                    s.id()
                                ),
                            ));
                        }
                        session = Some(s);
                    }
                    Some(s) => s.apply(ev).map_err(|e| {
                        malformed(
                            line,
                            format!("session {} version {}: {e}", self.id, c.version),
                        )
                    })?,
                }
            }
        }
        let last = self.commits.last().map_or(0, |c| c.version);
        let last_ts = self.commits.last().map_or(0, |c| c.timestamp_ms);
        session
            .map(|s| s.reconstitute(last, last_ts))
            .ok_or_else(|| malformed(0, format!("session {} has no events", self.id)))
    }
}

// ---------------------------------------------------------------------------
// Export
// ---------------------------------------------------------------------------

/// Totals of an export (also written in the end line).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ExportCounts {
    pub sessions: u64,
    pub commits: u64,
    pub events: u64,
}

/// Writes a `spool-export` file: the header on creation, sessions with
/// [`ExportWriter::session`], the end line with [`ExportWriter::finish`].
pub struct ExportWriter<W: Write> {
    out: W,
    counts: ExportCounts,
}

impl<W: Write> ExportWriter<W> {
    /// Writes the header line.
    pub fn new(mut out: W) -> Result<Self, ExchangeError> {
        let header = ExportHeader {
            format: EXPORT_FORMAT.to_string(),
            version: EXPORT_VERSION,
            event_schema: EVENT_SCHEMA,
            exported_at_ms: now_ms(),
        };
        write_line(&mut out, &header)?;
        Ok(ExportWriter {
            out,
            counts: ExportCounts::default(),
        })
    }

    /// Writes every commit of the current incarnation of session `id`.
    /// Each event is checked to survive the JSON round trip exactly.
    pub fn session(&mut self, store: &LogStore, id: &SessionId) -> Result<u64, ExchangeError> {
        let header = store
            .header(id)?
            .ok_or_else(|| ExchangeError::NotFound { id: id.clone() })?;
        let engine = store.engine()?;
        let head = engine
            .stream_version(id.as_str())
            .map_err(engine_err)?
            .ok_or_else(|| ExchangeError::NotFound { id: id.clone() })?;
        // The header's version counts the commits of the current
        // incarnation; the stream's earlier commits belong to purged ones.
        let base = head.checked_sub(header.version).ok_or_else(|| {
            ExchangeError::Store(StoreError::Corrupt {
                id: id.clone(),
                reason: format!(
                    "header version {} is beyond stream head {head}",
                    header.version
                ),
            })
        })?;
        let mut from = base + 1;
        let mut commits = 0u64;
        while from <= head {
            let want = (head - from + 1).min(EXPORT_BATCH_COMMITS as u64) as usize;
            let batch = engine
                .read_stream(id.as_str(), from, want)
                .map_err(engine_err)?;
            if batch.is_empty() {
                break;
            }
            for c in &batch {
                let version = c.info.version - base;
                let mut events = Vec::with_capacity(c.events.len());
                for (i, e) in c.events.iter().enumerate() {
                    if !e.kind.starts_with(SESSION_EVENT_PREFIX) {
                        continue;
                    }
                    let ev = decode_event(&e.payload).map_err(|source| {
                        ExchangeError::Store(StoreError::Encoding {
                            context: format!("session {id}, version {version}, event {i}"),
                            source,
                        })
                    })?;
                    events.push(ev);
                }
                if events.is_empty() {
                    return Err(ExchangeError::Unexportable {
                        id: id.clone(),
                        version,
                        reason: "the commit carries no session events".into(),
                    });
                }
                let n = events.len() as u32;
                for (i, event) in events.into_iter().enumerate() {
                    let line = ExportEventLine {
                        session: id.clone(),
                        version,
                        commit_id: c.info.commit_id,
                        timestamp_ms: c.info.timestamp_ms,
                        index: i as u32,
                        events_in_commit: n,
                        event,
                    };
                    let text =
                        serde_json::to_string(&line).map_err(|e| ExchangeError::Unexportable {
                            id: id.clone(),
                            version,
                            reason: format!("event {i}: {e}"),
                        })?;
                    // An import must rebuild the same session: refuse an
                    // event whose JSON form reads back differently (e.g.
                    // a float that does not round-trip).
                    let back: Result<ExportEventLine, _> = serde_json::from_str(&text);
                    if back.as_ref().map(|b| b.event != line.event).unwrap_or(true) {
                        return Err(ExchangeError::Unexportable {
                            id: id.clone(),
                            version,
                            reason: format!(
                                "event {i} ({}) does not read back identically from JSON",
                                line.event.kind()
                            ),
                        });
                    }
                    self.out
                        .write_all(text.as_bytes())
                        .and_then(|()| self.out.write_all(b"\n"))
                        .map_err(|source| ExchangeError::Io {
                            context: "writing the export".into(),
                            source,
                        })?;
                    self.counts.events += 1;
                }
                self.counts.commits += 1;
                commits += 1;
                from = c.info.version + 1;
            }
        }
        self.counts.sessions += 1;
        Ok(commits)
    }

    /// Totals so far.
    pub fn counts(&self) -> ExportCounts {
        self.counts
    }

    /// Writes the end line and flushes; returns the writer and the totals.
    pub fn finish(mut self) -> Result<(W, ExportCounts), ExchangeError> {
        let end = ExportEnd {
            end: true,
            sessions: self.counts.sessions,
            commits: self.counts.commits,
            events: self.counts.events,
        };
        write_line(&mut self.out, &end)?;
        self.out.flush().map_err(|source| ExchangeError::Io {
            context: "writing the export".into(),
            source,
        })?;
        Ok((self.out, self.counts))
    }
}

fn write_line<W: Write, T: Serialize>(out: &mut W, value: &T) -> Result<(), ExchangeError> {
    let io = |source| ExchangeError::Io {
        context: "writing the export".into(),
        source,
    };
    serde_json::to_writer(&mut *out, value).map_err(|e| io(std::io::Error::other(e)))?;
    out.write_all(b"\n").map_err(io)
}

// ---------------------------------------------------------------------------
// Reading
// ---------------------------------------------------------------------------

/// Reads one line of at most `max` bytes into `buf` (without the newline).
/// `Ok(None)` at end of input; `Ok(Some(true))` when the line ended with a
/// newline, `Some(false)` when the input ended first.
pub fn read_line_bounded<R: BufRead>(
    r: &mut R,
    buf: &mut Vec<u8>,
    max: usize,
) -> std::io::Result<Option<bool>> {
    buf.clear();
    let mut any = false;
    loop {
        let chunk = match r.fill_buf() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if chunk.is_empty() {
            return Ok(if any { Some(false) } else { None });
        }
        any = true;
        let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
            Some(i) => (i, true),
            None => (chunk.len(), false),
        };
        if buf.len().saturating_add(take) > max {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("line longer than {max} bytes"),
            ));
        }
        buf.extend_from_slice(&chunk[..take]);
        r.consume(if done { take + 1 } else { take });
        if done {
            return Ok(Some(true));
        }
    }
}

/// Parses a whole `spool-export` file. Every line is checked (header,
/// commit grouping, contiguous sessions, the end line and its totals);
/// the sessions are not folded here (see [`ImportSession::validate`]).
pub fn read_export<R: BufRead>(mut r: R) -> Result<Vec<ImportSession>, ExchangeError> {
    let mut buf = Vec::new();
    let mut line_no = 0u64;
    let mut header_seen = false;
    let mut end: Option<(u64, ExportEnd)> = None;
    let mut sessions: Vec<ImportSession> = Vec::new();
    let mut seen_ids: HashSet<SessionId> = HashSet::new();
    let mut events_total = 0u64;
    // The commit being read: (line of its first event, expected count).
    let mut open: Option<u32> = None;
    loop {
        let had = read_line_bounded(&mut r, &mut buf, EXPORT_LINE_BYTES_MAX).map_err(|e| {
            ExchangeError::Malformed {
                line: line_no + 1,
                reason: e.to_string(),
            }
        })?;
        let Some(_newline) = had else { break };
        line_no += 1;
        let malformed = |reason: String| ExchangeError::Malformed {
            line: line_no,
            reason,
        };
        let text = std::str::from_utf8(&buf).map_err(|e| malformed(format!("not UTF-8: {e}")))?;
        if text.trim().is_empty() {
            continue;
        }
        if let Some((end_line, _)) = &end {
            return Err(malformed(format!(
                "data after the end line (line {end_line})"
            )));
        }
        let value: serde_json::Value = serde_json::from_str(text).map_err(|e| {
            malformed(format!(
                "not a JSON object ({e}){}",
                if e.is_eof() {
                    "; the file may be truncated"
                } else {
                    ""
                }
            ))
        })?;
        if !header_seen {
            let h: ExportHeader = serde_json::from_value(value)
                .map_err(|e| malformed(format!("not a spool-export header: {e}")))?;
            if h.format != EXPORT_FORMAT {
                return Err(malformed(format!(
                    "format {:?} is not {EXPORT_FORMAT:?}",
                    h.format
                )));
            }
            if h.version == 0 || h.version > EXPORT_VERSION {
                return Err(malformed(format!(
                    "spool-export version {} is not supported (this build reads 1..={EXPORT_VERSION})",
                    h.version
                )));
            }
            header_seen = true;
            continue;
        }
        if value.get("end").is_some() {
            let e: ExportEnd = serde_json::from_value(value)
                .map_err(|e| malformed(format!("malformed end line: {e}")))?;
            if let Some(n) = open {
                return Err(malformed(format!(
                    "end line inside a commit ({n} events announced, fewer given)"
                )));
            }
            let commits: u64 = sessions.iter().map(|s| s.commits.len() as u64).sum();
            if !e.end
                || e.sessions != sessions.len() as u64
                || e.commits != commits
                || e.events != events_total
            {
                return Err(malformed(format!(
                    "end line says {} sessions, {} commits, {} events; the file has {}, {commits}, {events_total}",
                    e.sessions,
                    e.commits,
                    e.events,
                    sessions.len()
                )));
            }
            end = Some((line_no, e));
            continue;
        }
        let ev: ExportEventLine = serde_json::from_value(value)
            .map_err(|e| malformed(format!("malformed event line: {e}")))?;
        if ev.events_in_commit == 0 || ev.index >= ev.events_in_commit {
            return Err(malformed(format!(
                "event index {} of a commit of {} events",
                ev.index, ev.events_in_commit
            )));
        }
        match open {
            Some(n) => {
                // Continue the open commit of the last session.
                let commit = sessions
                    .last_mut()
                    .filter(|s| s.id == ev.session)
                    .and_then(|s| s.commits.last_mut())
                    .filter(|c| c.version == ev.version && c.commit_id == ev.commit_id)
                    .ok_or_else(|| {
                        malformed(
                            "the previous commit is incomplete (this line belongs to another commit)"
                                .into(),
                        )
                    })?;
                if n != ev.events_in_commit
                    || ev.index as usize != commit.events.len()
                    || ev.timestamp_ms != commit.timestamp_ms
                {
                    return Err(malformed(format!(
                        "event {} of commit {} does not continue it",
                        ev.index, ev.commit_id
                    )));
                }
                commit.events.push(ev.event);
                commit.lines.push(line_no);
            }
            None => {
                if ev.index != 0 {
                    return Err(malformed(format!(
                        "a commit starts with event index {}",
                        ev.index
                    )));
                }
                let same = sessions.last().is_some_and(|s| s.id == ev.session);
                if !same {
                    if !seen_ids.insert(ev.session.clone()) {
                        return Err(malformed(format!(
                            "session {} appears again after other sessions (its lines must be contiguous)",
                            ev.session
                        )));
                    }
                    sessions.push(ImportSession {
                        id: ev.session.clone(),
                        commits: Vec::new(),
                    });
                }
                let s = sessions
                    .last_mut()
                    .ok_or_else(|| malformed("no session".into()))?;
                let want = s.commits.last().map_or(1, |c| c.version + 1);
                if ev.version != want {
                    return Err(malformed(format!(
                        "session {}: expected version {want}, found {}",
                        ev.session, ev.version
                    )));
                }
                s.commits.push(ImportCommit {
                    version: ev.version,
                    commit_id: ev.commit_id,
                    timestamp_ms: ev.timestamp_ms,
                    events: vec![ev.event],
                    lines: vec![line_no],
                });
            }
        }
        events_total += 1;
        let done = sessions
            .last()
            .and_then(|s| s.commits.last())
            .is_some_and(|c| c.events.len() as u32 == ev.events_in_commit);
        open = if done {
            None
        } else {
            Some(ev.events_in_commit)
        };
    }
    if !header_seen {
        return Err(ExchangeError::Malformed {
            line: line_no.max(1),
            reason: "empty file: no spool-export header".into(),
        });
    }
    if end.is_none() {
        return Err(ExchangeError::Truncated { line: line_no });
    }
    Ok(sessions)
}

// ---------------------------------------------------------------------------
// Import
// ---------------------------------------------------------------------------

/// How to import.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ImportOptions {
    /// Give every commit a fresh commit id instead of keeping the file's
    /// (needed when the file's commits are already in the store, e.g.
    /// re-importing a purged session into the store it came from).
    pub fresh_commit_ids: bool,
}

impl ImportOptions {
    pub fn fresh_commit_ids(mut self, yes: bool) -> Self {
        self.fresh_commit_ids = yes;
        self
    }
}

/// What one session's import did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImportedSession {
    pub id: SessionId,
    /// The session's version after import (its number of commits).
    pub version: u64,
    pub events: u64,
    pub entries: u64,
}

/// Checks that `sessions` can be imported into `store` (every session
/// folds; no id or commit id is taken) without writing anything. Returns
/// the stream version each session continues from (0, or the version of
/// the purge that ended an earlier incarnation).
pub fn check_import(
    store: &LogStore,
    sessions: &[ImportSession],
    opts: &ImportOptions,
) -> Result<Vec<u64>, ExchangeError> {
    let mut ids = HashSet::new();
    let mut commit_ids = HashSet::new();
    let mut bases = Vec::with_capacity(sessions.len());
    for s in sessions {
        let line = s
            .commits
            .first()
            .and_then(|c| c.lines.first())
            .copied()
            .unwrap_or(0);
        if !ids.insert(s.id.clone()) {
            return Err(ExchangeError::Malformed {
                line,
                reason: format!("session {} appears twice", s.id),
            });
        }
        s.validate()?;
        if store.header(&s.id)?.is_some() {
            return Err(ExchangeError::SessionExists { id: s.id.clone() });
        }
        let engine = store.engine()?;
        let base = match engine.stream_version(s.id.as_str()).map_err(engine_err)? {
            None => 0,
            Some(head) => {
                // A stream without a session header is either a purged
                // session (its last commit is the purge marker) or some
                // other stream that must not be mixed with a session.
                let last = engine
                    .read_stream(s.id.as_str(), head, 1)
                    .map_err(engine_err)?;
                let purged = last
                    .first()
                    .is_some_and(|c| c.events.iter().any(|e| e.kind == PURGE_EVENT_KIND));
                if !purged {
                    return Err(ExchangeError::StreamExists { id: s.id.clone() });
                }
                head
            }
        };
        bases.push(base);
        if !opts.fresh_commit_ids {
            for c in &s.commits {
                let taken = !commit_ids.insert(c.commit_id)
                    || engine
                        .commit_by_id(c.commit_id)
                        .map_err(engine_err)?
                        .is_some();
                if taken {
                    return Err(ExchangeError::CommitIdTaken {
                        id: s.id.clone(),
                        version: c.version,
                        commit_id: c.commit_id,
                    });
                }
            }
        }
    }
    Ok(bases)
}

/// Imports `sessions` into `store` (see the module docs for the
/// guarantees). `on_commit` is called after each appended commit (for
/// progress). Nothing is written unless every session validates.
pub fn import_sessions(
    store: &LogStore,
    sessions: &[ImportSession],
    opts: &ImportOptions,
    on_commit: &mut dyn FnMut(),
) -> Result<Vec<ImportedSession>, ExchangeError> {
    let bases = check_import(store, sessions, opts)?;
    let mut written: Vec<SessionId> = Vec::new();
    let mut report = Vec::with_capacity(sessions.len());
    for (s, base) in sessions.iter().zip(bases) {
        written.push(s.id.clone());
        for c in &s.commits {
            if let Err(reason) = append_commit(store, s, c, base, opts) {
                let rolled_back = written
                    .iter()
                    .all(|id| store.delete(id).is_ok() && matches!(store.header(id), Ok(None)));
                return Err(ExchangeError::ImportFailed {
                    id: s.id.clone(),
                    version: c.version,
                    reason,
                    rolled_back,
                });
            }
            on_commit();
        }
        let entries = match store.load(&s.id) {
            Ok(Some(loaded)) => loaded.state().transcript.len() as u64,
            _ => 0,
        };
        report.push(ImportedSession {
            id: s.id.clone(),
            version: s.commits.len() as u64,
            events: s.event_count(),
            entries,
        });
    }
    Ok(report)
}

fn append_commit(
    store: &LogStore,
    s: &ImportSession,
    c: &ImportCommit,
    base: u64,
    opts: &ImportOptions,
) -> Result<(), String> {
    let mut events = Vec::with_capacity(c.events.len());
    for ev in &c.events {
        let payload = encode_event(ev).map_err(|e| format!("encoding {}: {e}", ev.kind()))?;
        events.push(EventData::new(stored_kind(ev), payload));
    }
    let commit = NewCommit {
        stream: s.id.as_str().to_string(),
        expected: ExpectedVersion::Exact(base + c.version - 1),
        commit_id: if opts.fresh_commit_ids {
            Uuid::new_v4()
        } else {
            c.commit_id
        },
        events,
    };
    let engine = store.engine().map_err(|e| e.to_string())?;
    match engine.append(commit) {
        Ok(AppendOutcome::Committed(_)) => Ok(()),
        Ok(AppendOutcome::AlreadyCommitted(info)) => Err(format!(
            "commit id {} had already landed (stream {} version {})",
            info.commit_id, info.stream, info.version
        )),
        Ok(AppendOutcome::Conflict { actual, .. }) => Err(format!(
            "version conflict: the stream moved to {} meanwhile",
            actual.unwrap_or(0)
        )),
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::AgentDefinition;
    use crate::store::LogStoreOptions;
    use crate::transcript::{ContentBlock, EntryKind, Message};

    fn store(dir: &std::path::Path) -> LogStore {
        LogStore::open(
            dir,
            LogStoreOptions {
                durability: spool_engine::Durability::Buffered,
                ..Default::default()
            },
        )
        .unwrap()
    }

    fn sample(store: &LogStore) -> SessionId {
        let def = AgentDefinition::new("a", "d", "p");
        let s = store.create(AgentSession::new(def, None)).expect("create");
        let id = s.id().clone();
        let mut s = s;
        for i in 0..3 {
            s.append(EntryKind::Message {
                message: Message::User {
                    content: vec![ContentBlock::text(format!("hello {i}"))],
                },
            })
            .unwrap();
            s.write_metadata("k", serde_json::json!({"n": i, "f": 0.1}))
                .unwrap();
            s = store.save(s).unwrap();
        }
        id
    }

    fn export(store: &LogStore, id: &SessionId) -> Vec<u8> {
        let mut w = ExportWriter::new(Vec::new()).unwrap();
        w.session(store, id).unwrap();
        w.finish().unwrap().0
    }

    #[test]
    fn round_trip_keeps_versions_commit_ids_and_state() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let bytes = export(&sa, &id);
        let sessions = read_export(&bytes[..]).unwrap();
        assert_eq!(sessions.len(), 1);
        assert_eq!(sessions[0].commits.len(), 4);
        let sb = store(b.path());
        let rep = import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {}).unwrap();
        assert_eq!(rep[0].version, 4);
        assert_eq!(rep[0].entries, 3);
        let orig = sa.load(&id).unwrap().unwrap();
        let back = sb.load(&id).unwrap().unwrap();
        assert_eq!(orig.state(), back.state());
        assert_eq!(orig.definition(), back.definition());
        assert_eq!(orig.version(), back.version());
        let ca = sa
            .engine()
            .unwrap()
            .read_stream(id.as_str(), 1, 100)
            .unwrap();
        let cb = sb
            .engine()
            .unwrap()
            .read_stream(id.as_str(), 1, 100)
            .unwrap();
        let key = |c: &spool_engine::RecordedCommit| {
            (
                c.info.version,
                c.info.commit_id,
                c.events.iter().map(|e| e.kind.clone()).collect::<Vec<_>>(),
            )
        };
        assert_eq!(
            ca.iter().map(key).collect::<Vec<_>>(),
            cb.iter().map(key).collect::<Vec<_>>()
        );
        // A second import of the same file is refused and writes nothing.
        let before = sb.engine().unwrap().last_seq();
        let err = import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {});
        assert!(matches!(err, Err(ExchangeError::SessionExists { .. })));
        assert_eq!(sb.engine().unwrap().last_seq(), before);
    }

    #[test]
    fn reimport_after_purge_needs_fresh_commit_ids() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let sessions = read_export(&export(&sa, &id)[..]).unwrap();
        let orig = sa.load(&id).unwrap().unwrap();
        assert!(sa.delete(&id).unwrap());
        let err = import_sessions(&sa, &sessions, &ImportOptions::default(), &mut || {});
        assert!(
            matches!(err, Err(ExchangeError::CommitIdTaken { .. })),
            "{err:?}"
        );
        let opts = ImportOptions::default().fresh_commit_ids(true);
        import_sessions(&sa, &sessions, &opts, &mut || {}).unwrap();
        let back = sa.load(&id).unwrap().unwrap();
        assert_eq!(back.state(), orig.state());
        assert_eq!(back.version(), orig.version());
    }

    #[test]
    fn every_truncation_is_refused_with_a_line_number() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let bytes = export(&sa, &id);
        let text = String::from_utf8(bytes.clone()).unwrap();
        let lines = text.lines().count() as u64;
        // Cut at every byte: each prefix is refused (never accepted as a
        // shorter session), and the error names a line within the file.
        for cut in 0..bytes.len() - 1 {
            match read_export(&bytes[..cut]) {
                Ok(_) => panic!("a file cut at byte {cut} was accepted"),
                Err(ExchangeError::Malformed { line, .. })
                | Err(ExchangeError::Truncated { line }) => {
                    assert!(line >= 1 && line <= lines, "cut {cut}: line {line}");
                }
                Err(e) => panic!("cut {cut}: unexpected error {e}"),
            }
        }
        // A whole line removed from the middle is caught too.
        let mut v: Vec<&str> = text.lines().collect();
        v.remove(3);
        let joined = v.join("\n") + "\n";
        let err = read_export(joined.as_bytes()).unwrap_err();
        assert!(
            matches!(err, ExchangeError::Malformed { line: 3 | 4, .. }),
            "{err}"
        );
    }

    #[test]
    fn a_history_that_does_not_fold_is_refused_before_writing() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let mut sessions = read_export(&export(&sa, &id)[..]).unwrap();
        // Point an appended entry at a parent that does not exist.
        let c = &mut sessions[0].commits[2];
        if let Some(SessionEvent::EntryAppended { entry }) = c.events.first_mut() {
            entry.parent_id = Some(crate::transcript::EntryId::parse("nope").unwrap());
        } else {
            panic!("unexpected event layout");
        }
        let line = c.lines[0];
        let b = tempfile::tempdir().unwrap();
        let sb = store(b.path());
        let err =
            import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {}).unwrap_err();
        match err {
            ExchangeError::Malformed { line: l, .. } => assert_eq!(l, line),
            e => panic!("unexpected {e}"),
        }
        assert_eq!(sb.engine().unwrap().last_seq(), 0, "nothing written");
    }
}
