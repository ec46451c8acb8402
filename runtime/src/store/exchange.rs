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
//!    `timestamp_ms` is the commit time; an import gives each commit its
//!    original time, so a session's `updated_at` survives the round trip.
//! 3. The **end line**, always the last:
//!    `{"end":true,"sessions":S,"commits":C,"events":E}` with the totals.
//!    A file without it is truncated and is refused.
//!
//! New optional fields may be added to any line in the same version;
//! readers ignore fields they do not know.
//!
//! # Import guarantees
//!
//! An import ([`import_from`]) reads its source twice. The first pass
//! parses every line ([`ExportReader`], one session in memory at a time),
//! folds every session with [`AgentSession::replay`] and checks the target
//! store (no session with the same id, no stream of that name that is not
//! a purged session, no commit id already taken, every commit within the
//! store's record limit) **before writing anything**. A malformed or
//! truncated file is refused with the line number. The second pass appends
//! each commit through the engine under its exact version fence and with
//! its original commit time, with the same event kinds (`session.<kind>`)
//! and encoding ([`encode_event`]) as [`LogStore`] uses, and the log is
//! synced once at the end. Should an append still fail (I/O, a concurrent
//! writer), every session this import wrote is purged again, so no
//! half-imported session stays visible; a crash in the middle of an import
//! can leave a prefix of the commits of one session (a valid session at an
//! earlier version), never a torn commit.

use std::collections::HashSet;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};
use spool_engine::{
    AppendOutcome, EventData, ExpectedVersion, NewCommit, Uuid, EVENTS_PER_COMMIT_MAX,
};

use super::log::{
    stored_kind, LogStore, SettingsFold, PURGE_EVENT_KIND, SESSION_EVENT_PREFIX,
    SETTINGS_TAIL_COMMITS,
};
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
    /// A commit the store would refuse (e.g. over its record size
    /// limit); found before anything is written.
    #[error("line {line}: session {id} version {version} cannot be stored")]
    Unstorable {
        line: u64,
        id: SessionId,
        version: u64,
        #[source]
        source: spool_engine::Error,
    },
    #[error("syncing the imported commits to disk failed")]
    SyncFailed(#[source] StoreError),
    #[error("{context}")]
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
    /// The original commit time, which the import keeps.
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
                self.commit(id, version, c.info.commit_id, c.info.timestamp_ms, events)?;
                commits += 1;
                from = c.info.version + 1;
            }
        }
        self.end_session();
        Ok(commits)
    }

    /// Writes the lines of one commit of session `id`: `version` is the
    /// session version it created, `events` its session events in order.
    /// Each event is checked to survive the JSON round trip exactly. The
    /// commits of a session are written consecutively and in version
    /// order, then [`ExportWriter::end_session`] counts the session.
    pub(crate) fn commit(
        &mut self,
        id: &SessionId,
        version: u64,
        commit_id: Uuid,
        timestamp_ms: i64,
        events: Vec<SessionEvent>,
    ) -> Result<(), ExchangeError> {
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
                commit_id,
                timestamp_ms,
                index: i as u32,
                events_in_commit: n,
                event,
            };
            let text = serde_json::to_string(&line).map_err(|e| ExchangeError::Unexportable {
                id: id.clone(),
                version,
                reason: format!("event {i}: {e}"),
            })?;
            // An import must rebuild the same session: refuse an event
            // whose JSON form reads back differently (e.g. a float that
            // does not round-trip).
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
        Ok(())
    }

    /// Counts a session whose commits were written with
    /// [`ExportWriter::commit`].
    pub(crate) fn end_session(&mut self) {
        self.counts.sessions += 1;
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
pub(crate) fn read_line_bounded<R: BufRead>(
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

/// Any line after the header, parsed straight into its fields (no
/// intermediate JSON tree of the line): an end line has `end`, an event
/// line the rest.
#[derive(Deserialize)]
struct BodyLine {
    end: Option<bool>,
    sessions: Option<u64>,
    commits: Option<u64>,
    events: Option<u64>,
    session: Option<SessionId>,
    version: Option<u64>,
    commit_id: Option<Uuid>,
    timestamp_ms: Option<i64>,
    index: Option<u32>,
    events_in_commit: Option<u32>,
    event: Option<SessionEvent>,
}

fn json_reason(what: &str, e: &serde_json::Error) -> String {
    format!(
        "{what} ({e}){}",
        if e.is_eof() {
            "; the file may be truncated"
        } else {
            ""
        }
    )
}

/// Reads a `spool-export` file one session at a time, checking every line
/// (header, commit grouping, contiguous sessions, the end line and its
/// totals) as it goes; the sessions are not folded here (see
/// [`ImportSession::validate`]). Memory holds one session, not the file.
pub struct ExportReader<R> {
    r: R,
    buf: Vec<u8>,
    line_no: u64,
    header: ExportHeader,
    /// The session being read.
    cur: Option<ImportSession>,
    /// Events the open commit still expects (its announced count).
    open: Option<u32>,
    seen_ids: HashSet<SessionId>,
    totals: ExportCounts,
    end_line: Option<u64>,
}

impl<R: BufRead> ExportReader<R> {
    /// Reads and checks the header line.
    pub fn new(mut r: R) -> Result<Self, ExchangeError> {
        let mut buf = Vec::new();
        let mut line_no = 0u64;
        let header = loop {
            let had = read_line_bounded(&mut r, &mut buf, EXPORT_LINE_BYTES_MAX).map_err(|e| {
                ExchangeError::Malformed {
                    line: line_no + 1,
                    reason: e.to_string(),
                }
            })?;
            if had.is_none() {
                return Err(ExchangeError::Malformed {
                    line: line_no.max(1),
                    reason: "empty file: no spool-export header".into(),
                });
            }
            line_no += 1;
            let malformed = |reason: String| ExchangeError::Malformed {
                line: line_no,
                reason,
            };
            let text =
                std::str::from_utf8(&buf).map_err(|e| malformed(format!("not UTF-8: {e}")))?;
            if text.trim().is_empty() {
                continue;
            }
            let h: ExportHeader = serde_json::from_str(text)
                .map_err(|e| malformed(json_reason("not a spool-export header", &e)))?;
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
            break h;
        };
        Ok(ExportReader {
            r,
            buf,
            line_no,
            header,
            cur: None,
            open: None,
            seen_ids: HashSet::new(),
            totals: ExportCounts::default(),
            end_line: None,
        })
    }

    /// The file's header.
    pub fn header(&self) -> &ExportHeader {
        &self.header
    }

    /// The next session, `None` after the end line (once the rest of the
    /// file is checked to be blank).
    pub fn next_session(&mut self) -> Result<Option<ImportSession>, ExchangeError> {
        loop {
            let had = read_line_bounded(&mut self.r, &mut self.buf, EXPORT_LINE_BYTES_MAX)
                .map_err(|e| ExchangeError::Malformed {
                    line: self.line_no + 1,
                    reason: e.to_string(),
                })?;
            if had.is_none() {
                return match self.end_line {
                    Some(_) => Ok(None),
                    None => Err(ExchangeError::Truncated { line: self.line_no }),
                };
            }
            self.line_no += 1;
            let line_no = self.line_no;
            let malformed = |reason: String| ExchangeError::Malformed {
                line: line_no,
                reason,
            };
            let text =
                std::str::from_utf8(&self.buf).map_err(|e| malformed(format!("not UTF-8: {e}")))?;
            if text.trim().is_empty() {
                continue;
            }
            if let Some(end_line) = self.end_line {
                return Err(malformed(format!(
                    "data after the end line (line {end_line})"
                )));
            }
            let line: BodyLine = serde_json::from_str(text)
                .map_err(|e| malformed(json_reason("not a spool-export line", &e)))?;
            if let Some(end) = line.end {
                let (Some(sessions), Some(commits), Some(events)) =
                    (line.sessions, line.commits, line.events)
                else {
                    return Err(malformed(
                        "malformed end line: it needs sessions, commits and events".into(),
                    ));
                };
                if let Some(n) = self.open {
                    return Err(malformed(format!(
                        "end line inside a commit ({n} events announced, fewer given)"
                    )));
                }
                let t = self.totals;
                if !end || sessions != t.sessions || commits != t.commits || events != t.events {
                    return Err(malformed(format!(
                        "end line says {sessions} sessions, {commits} commits, {events} events; the file has {}, {}, {}",
                        t.sessions, t.commits, t.events
                    )));
                }
                self.end_line = Some(line_no);
                if let Some(s) = self.cur.take() {
                    return Ok(Some(s));
                }
                continue;
            }
            let missing = |f: &str| malformed(format!("malformed event line: missing field `{f}`"));
            let ev = ExportEventLine {
                session: line.session.ok_or_else(|| missing("session"))?,
                version: line.version.ok_or_else(|| missing("version"))?,
                commit_id: line.commit_id.ok_or_else(|| missing("commit_id"))?,
                timestamp_ms: line.timestamp_ms.ok_or_else(|| missing("timestamp_ms"))?,
                index: line.index.ok_or_else(|| missing("index"))?,
                events_in_commit: line
                    .events_in_commit
                    .ok_or_else(|| missing("events_in_commit"))?,
                event: line.event.ok_or_else(|| missing("event"))?,
            };
            if ev.events_in_commit == 0 || ev.index >= ev.events_in_commit {
                return Err(malformed(format!(
                    "event index {} of a commit of {} events",
                    ev.index, ev.events_in_commit
                )));
            }
            let mut finished: Option<ImportSession> = None;
            match self.open {
                Some(n) => {
                    // Continue the open commit of the current session.
                    let commit = self
                        .cur
                        .as_mut()
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
                    let same = self.cur.as_ref().is_some_and(|s| s.id == ev.session);
                    if !same {
                        if !self.seen_ids.insert(ev.session.clone()) {
                            return Err(malformed(format!(
                                "session {} appears again after other sessions (its lines must be contiguous)",
                                ev.session
                            )));
                        }
                        finished = self.cur.replace(ImportSession {
                            id: ev.session.clone(),
                            commits: Vec::new(),
                        });
                        self.totals.sessions += 1;
                    }
                    let s = self
                        .cur
                        .as_mut()
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
                    self.totals.commits += 1;
                }
            }
            self.totals.events += 1;
            let done = self
                .cur
                .as_ref()
                .and_then(|s| s.commits.last())
                .is_some_and(|c| c.events.len() as u32 == ev.events_in_commit);
            self.open = if done {
                None
            } else {
                Some(ev.events_in_commit)
            };
            if finished.is_some() {
                return Ok(finished);
            }
        }
    }
}

/// Parses a whole `spool-export` file into memory (see [`ExportReader`]
/// for a reader that holds one session at a time).
pub fn read_export<R: BufRead>(r: R) -> Result<Vec<ImportSession>, ExchangeError> {
    let mut reader = ExportReader::new(r)?;
    let mut sessions = Vec::new();
    while let Some(s) = reader.next_session()? {
        sessions.push(s);
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

/// Where an import is, for a progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImportProgress {
    /// The first pass (nothing written yet) has checked this many commits.
    Checked { commits: u64 },
    /// The second pass has written `commits` of `total`.
    Written { commits: u64, total: u64 },
}

/// Sessions to import, which an import reads twice: once to check them
/// all, once to write them. Both passes must yield the same sessions in
/// the same order (a source read from a file re-reads the file).
pub trait ImportSource {
    /// Calls `f` on every session, in order; stops at `f`'s first error.
    /// Sessions are lent, not given: a source that holds them (a slice)
    /// never copies one.
    fn for_each_session(
        &mut self,
        f: &mut dyn FnMut(&ImportSession) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError>;
}

impl ImportSource for &[ImportSession] {
    fn for_each_session(
        &mut self,
        f: &mut dyn FnMut(&ImportSession) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError> {
        self.iter().try_for_each(f)
    }
}

/// A `spool-export` file read from its path, one session at a time.
pub struct ExportFile {
    path: std::path::PathBuf,
}

impl ExportFile {
    pub fn new(path: impl Into<std::path::PathBuf>) -> Self {
        ExportFile { path: path.into() }
    }
}

impl ImportSource for ExportFile {
    fn for_each_session(
        &mut self,
        f: &mut dyn FnMut(&ImportSession) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError> {
        let file = std::fs::File::open(&self.path).map_err(|source| ExchangeError::Io {
            context: format!("opening {}", self.path.display()),
            source,
        })?;
        let mut reader = ExportReader::new(std::io::BufReader::with_capacity(1 << 16, file))?;
        while let Some(s) = reader.next_session()? {
            f(&s)?;
        }
        Ok(())
    }
}

/// What the first pass learnt of one session.
struct Planned {
    id: SessionId,
    /// The stream version the session continues from.
    base: u64,
    commits: u64,
    events: u64,
    entries: u64,
}

/// The engine commit that imports `c` (its events encoded as a
/// [`LogStore`] writes them).
fn new_commit(
    s: &SessionId,
    c: &ImportCommit,
    base: u64,
    opts: &ImportOptions,
) -> Result<NewCommit, String> {
    let mut events = Vec::with_capacity(c.events.len());
    for ev in &c.events {
        let payload = encode_event(ev).map_err(|e| format!("encoding {}: {e}", ev.kind()))?;
        events.push(EventData::new(stored_kind(ev), payload));
    }
    Ok(NewCommit {
        stream: s.as_str().to_string(),
        expected: ExpectedVersion::Exact(base + c.version - 1),
        commit_id: if opts.fresh_commit_ids {
            Uuid::new_v4()
        } else {
            c.commit_id
        },
        events,
    })
}

/// The store-independent checks of one session of an import: its id is
/// not repeated in the same import (`ids`) and its events fold
/// ([`ImportSession::validate`]). Returns the folded session.
pub(crate) fn check_shape(
    s: &ImportSession,
    ids: &mut HashSet<SessionId>,
) -> Result<AgentSession, ExchangeError> {
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
    s.validate()
}

/// Checks one session against `store` and the sessions before it in the
/// same import, writing nothing.
fn check_session(
    store: &LogStore,
    s: &ImportSession,
    opts: &ImportOptions,
    ids: &mut HashSet<SessionId>,
    commit_ids: &mut HashSet<Uuid>,
) -> Result<Planned, ExchangeError> {
    let folded = check_shape(s, ids)?;
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
    for c in &s.commits {
        if !opts.fresh_commit_ids {
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
        // Every commit must fit the store's record limit before the first
        // write, so an oversized entry writes nothing.
        let line = c.lines.first().copied().unwrap_or(0);
        let commit =
            new_commit(&s.id, c, base, opts).map_err(|reason| ExchangeError::Malformed {
                line,
                reason: format!("session {} version {}: {reason}", s.id, c.version),
            })?;
        if let Err(e) = engine.check_commit(&commit) {
            // Name the line of the commit's largest event: the likely cause.
            let largest = (0..commit.events.len())
                .max_by_key(|&i| commit.events[i].payload.len())
                .and_then(|i| c.lines.get(i).copied())
                .unwrap_or(line);
            return Err(ExchangeError::Unstorable {
                line: largest,
                id: s.id.clone(),
                version: c.version,
                source: e,
            });
        }
    }
    Ok(Planned {
        id: s.id.clone(),
        base,
        commits: s.commits.len() as u64,
        events: s.event_count(),
        entries: folded.state().transcript.len() as u64,
    })
}

/// Checks that `sessions` can be imported into `store` (every session
/// folds; no id or commit id is taken; every commit fits the store's
/// record limit) without writing anything. Returns the stream version
/// each session continues from (0, or the version of the purge that ended
/// an earlier incarnation).
pub fn check_import(
    store: &LogStore,
    sessions: &[ImportSession],
    opts: &ImportOptions,
) -> Result<Vec<u64>, ExchangeError> {
    let mut ids = HashSet::new();
    let mut commit_ids = HashSet::new();
    sessions
        .iter()
        .map(|s| check_session(store, s, opts, &mut ids, &mut commit_ids).map(|p| p.base))
        .collect()
}

/// Imports `sessions` into `store` (see [`import_from`]). `on_commit` is
/// called after each written commit.
pub fn import_sessions(
    store: &LogStore,
    sessions: &[ImportSession],
    opts: &ImportOptions,
    on_commit: &mut dyn FnMut(),
) -> Result<Vec<ImportedSession>, ExchangeError> {
    import_from(store, &mut { sessions }, opts, &mut |p| {
        if let ImportProgress::Written { .. } = p {
            on_commit()
        }
    })
}

/// Imports every session of `source` into `store`, all or nothing (see the
/// module docs). The first pass checks every session and writes nothing;
/// the second appends each commit under its exact version fence with its
/// original commit time, and the log is synced once at the end (open the
/// store with [`spool_engine::Durability::Buffered`] for a bulk import:
/// with `Immediate` every append is synced on its own).
pub fn import_from(
    store: &LogStore,
    source: &mut dyn ImportSource,
    opts: &ImportOptions,
    progress: &mut dyn FnMut(ImportProgress),
) -> Result<Vec<ImportedSession>, ExchangeError> {
    let mut plan: Vec<Planned> = Vec::new();
    {
        let mut ids = HashSet::new();
        let mut commit_ids = HashSet::new();
        let mut checked = 0u64;
        source.for_each_session(&mut |s| {
            plan.push(check_session(store, s, opts, &mut ids, &mut commit_ids)?);
            checked += s.commits.len() as u64;
            progress(ImportProgress::Checked { commits: checked });
            Ok(())
        })?;
    }
    let total: u64 = plan.iter().map(|p| p.commits).sum();
    let engine = store.engine()?;
    let mut written: Vec<SessionId> = Vec::new();
    let mut done = 0u64;
    let mut next = 0usize;
    // The failure of the second pass: which session and version, why.
    let mut failure: Option<(SessionId, u64, String)> = None;
    let res = source.for_each_session(&mut |s| {
        let fail = |version: u64, reason: String| ExchangeError::ImportFailed {
            id: s.id.clone(),
            version,
            reason,
            rolled_back: false,
        };
        let p = match plan.get(next) {
            Some(p) if p.id == s.id && p.commits == s.commits.len() as u64 => p,
            _ => {
                return Err(fail(
                    0,
                    "the source changed between the check and the write".into(),
                ))
            }
        };
        next += 1;
        written.push(s.id.clone());
        // A long session gets its settings snapshot from the events in
        // hand, so its first execute does not replay the whole stream.
        let snapshot = s.commits.len() as u64 >= SETTINGS_TAIL_COMMITS;
        let mut fold = SettingsFold::default();
        let mut last = None;
        for c in &s.commits {
            let outcome = new_commit(&s.id, c, p.base, opts).and_then(|commit| {
                engine
                    .append_at(commit, c.timestamp_ms)
                    .map_err(|e| e.to_string())
            });
            let reason = match outcome {
                Ok(AppendOutcome::Committed(info)) => {
                    if snapshot {
                        fold.add(&c.events);
                        last = Some((info.version, info.timestamp_ms));
                    }
                    None
                }
                Ok(AppendOutcome::AlreadyCommitted(info)) => Some(format!(
                    "commit id {} had already landed (stream {} version {})",
                    info.commit_id, info.stream, info.version
                )),
                Ok(AppendOutcome::Conflict { actual, .. }) => Some(format!(
                    "version conflict: the stream moved to {} meanwhile",
                    actual.unwrap_or(0)
                )),
                Err(e) => Some(e),
            };
            if let Some(reason) = reason {
                failure = Some((s.id.clone(), c.version, reason.clone()));
                return Err(fail(c.version, reason));
            }
            done += 1;
            progress(ImportProgress::Written {
                commits: done,
                total,
            });
        }
        if let Some((version, updated_ms)) = last {
            store.write_settings_fold(fold, p.base, version, updated_ms);
        }
        Ok(())
    });
    if let Err(e) = res {
        let Some(last) = written.last().cloned() else {
            // The second pass failed before its first write.
            return Err(e);
        };
        // Purge what this import wrote, so no half-imported session stays
        // visible.
        let rolled_back = written
            .iter()
            .all(|id| store.delete(id).is_ok() && matches!(store.header(id), Ok(None)))
            && engine.flush().is_ok();
        let (id, version, reason) = match (failure, e) {
            (Some(f), _) => f,
            (
                None,
                ExchangeError::ImportFailed {
                    id,
                    version,
                    reason,
                    ..
                },
            ) => (id, version, reason),
            (None, e) => (last, 0, e.to_string()),
        };
        return Err(ExchangeError::ImportFailed {
            id,
            version,
            reason,
            rolled_back,
        });
    }
    engine
        .flush()
        .map_err(|e| ExchangeError::SyncFailed(StoreError::Engine(e)))?;
    Ok(plan
        .into_iter()
        .map(|p| ImportedSession {
            id: p.id,
            version: p.commits,
            events: p.events,
            entries: p.entries,
        })
        .collect())
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

    /// The lines of an export with the header's export time blanked.
    fn without_export_time(bytes: &[u8]) -> Vec<String> {
        let text = String::from_utf8(bytes.to_vec()).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let mut h: ExportHeader = serde_json::from_str(&lines[0]).unwrap();
        h.exported_at_ms = 0;
        lines[0] = serde_json::to_string(&h).unwrap();
        lines
    }

    #[test]
    fn export_import_export_is_identical_but_for_the_export_time() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let first = export(&sa, &id);
        // Import a while later, so a store that stamped its own times
        // would differ.
        std::thread::sleep(std::time::Duration::from_millis(5));
        let sb = store(b.path());
        let sessions = read_export(&first[..]).unwrap();
        import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {}).unwrap();
        let second = export(&sb, &id);
        assert_eq!(without_export_time(&first), without_export_time(&second));
        let (ha, hb) = (
            sa.header(&id).unwrap().unwrap(),
            sb.header(&id).unwrap().unwrap(),
        );
        assert_eq!(ha.updated_at_ms, hb.updated_at_ms);
        assert_eq!(ha.created_at_ms, hb.created_at_ms);
        assert_eq!(
            sa.load(&id).unwrap().unwrap().info(),
            sb.load(&id).unwrap().unwrap().info()
        );
    }

    #[test]
    fn a_file_that_fails_midway_writes_nothing() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let one = sample(&sa);
        let two = sample(&sa);
        let mut w = ExportWriter::new(Vec::new()).unwrap();
        w.session(&sa, &one).unwrap();
        w.session(&sa, &two).unwrap();
        let text = String::from_utf8(w.finish().unwrap().0).unwrap();
        // Break the second session's last event: the first session is
        // whole, so a writer that did not check everything first would
        // have written it.
        let lines: Vec<&str> = text.lines().collect();
        let n = lines.len();
        let broken = lines[n - 2].replace("\"entry_appended\"", "\"no_such_event\"");
        let broken = if broken == lines[n - 2] {
            lines[n - 2].replacen("\"type\":\"", "\"type\":\"x_", 1)
        } else {
            broken
        };
        let mut v: Vec<String> = lines.iter().map(|l| l.to_string()).collect();
        v[n - 2] = broken;
        let path = a.path().join("broken.jsonl");
        std::fs::write(&path, v.join("\n") + "\n").unwrap();
        let b = tempfile::tempdir().unwrap();
        let sb = store(b.path());
        let err = import_from(
            &sb,
            &mut ExportFile::new(&path),
            &ImportOptions::default(),
            &mut |_| {},
        )
        .unwrap_err();
        assert!(
            matches!(err, ExchangeError::Malformed { line, .. } if line == n as u64 - 1),
            "{err}"
        );
        assert_eq!(sb.engine().unwrap().last_seq(), 0, "nothing written");
        // The intact file imports both.
        std::fs::write(&path, &text).unwrap();
        let rep = import_from(
            &sb,
            &mut ExportFile::new(&path),
            &ImportOptions::default(),
            &mut |_| {},
        )
        .unwrap();
        assert_eq!(rep.len(), 2);
        assert_eq!(rep[1].entries, 3);
    }

    #[test]
    fn a_commit_over_the_record_limit_writes_nothing() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let mut sessions = read_export(&export(&sa, &id)[..]).unwrap();
        let big = "x".repeat(70_000);
        if let Some(SessionEvent::EntryAppended { entry }) =
            sessions[0].commits[3].events.first_mut()
        {
            entry.kind = EntryKind::Message {
                message: Message::User {
                    content: vec![ContentBlock::text(big)],
                },
            };
        } else {
            panic!("unexpected event layout");
        }
        let b = tempfile::tempdir().unwrap();
        let sb = LogStore::open(
            b.path(),
            LogStoreOptions {
                durability: spool_engine::Durability::Buffered,
                record_bytes_max: Some(64 << 10),
                ..Default::default()
            },
        )
        .unwrap();
        let err =
            import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {}).unwrap_err();
        assert!(
            matches!(
                err,
                ExchangeError::Unstorable {
                    source: spool_engine::Error::RecordTooLarge { .. },
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(sb.engine().unwrap().last_seq(), 0, "nothing written");
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
