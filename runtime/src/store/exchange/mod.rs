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
//! An import ([`import_from`]) reads its source once, in two passes. The
//! first pass parses every line ([`ExportReader`], one commit in memory at a
//! time), folds every session's events and checks the target
//! store (no session with the same id, no stream of that name that is not
//! a purged session, no commit id already taken or in the file twice, every
//! commit within the store's record limit) **before writing anything**. A malformed or
//! truncated file is refused with the line number. It encodes each commit
//! with the same event kinds (`session.<kind>`) and encoding
//! ([`encode_event`]) as [`LogStore`] uses, into an unnamed temporary file
//! (about the size of the log the import writes). The second pass reads
//! them back and appends each commit through the engine under its exact
//! version fence and with its original commit time, and the log is
//! synced once at the end; the store's background checkpoints wait until
//! the write is over ([`spool_engine::Store::defer_checkpoints`]). Should an append still fail (I/O, a concurrent
//! writer), every session this import created is purged again, so no
//! half-imported session stays visible; a crash in the middle of an import
//! can leave the sessions written so far, the last one a prefix of its
//! commits (a valid session at an earlier version), never a torn commit, and
//! a resumed import ([`ImportOptions::resume`]) of the same source finishes it
//! (a resumed import that fails purges nothing, for the next one to go on).

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
    decode_event, encode_event, AgentSession, AgentSessionInfo, SessionEvent, SessionId,
    EVENT_SCHEMA,
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
    /// A resumed import ([`ImportOptions::resume`]) found a session in the store
    /// that is not the start of the source's: another commit at a version.
    #[error("session {id} is in the store, but its commit at version {version} is not the file's: it is not an interrupted import of this file")]
    NotResumable { id: SessionId, version: u64 },
    /// A resumed import found a session in the store with more commits than
    /// the source has (an older export, or a session continued since).
    #[error("session {id} has {stored} commits in the store and {in_source} in the file: the store holds more of it than the file")]
    AheadOfSource {
        id: SessionId,
        stored: u64,
        in_source: u64,
    },
    #[error("the store has a stream named {id} that is not a session")]
    StreamExists { id: SessionId },
    #[error("commit {commit_id} (session {id}, version {version}) is already in the store")]
    CommitIdTaken {
        id: SessionId,
        version: u64,
        commit_id: Uuid,
    },
    /// Two commits of the source have the same commit id; found before
    /// anything is written.
    #[error("commit id {commit_id} is in the file twice: session {id} version {version} and session {other_id} version {other_version}")]
    CommitIdTwice {
        commit_id: Uuid,
        id: SessionId,
        version: u64,
        other_id: SessionId,
        other_version: u64,
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
        if *rolled_back { "the sessions this import created were purged again" } else { "purging the sessions this import created also failed" }
    )]
    ImportFailed {
        id: SessionId,
        version: u64,
        reason: String,
        rolled_back: bool,
    },
    /// A resumed import ([`ImportOptions::resume`]) failed: nothing is
    /// purged, and the same import resumed again continues from what it wrote.
    #[error("importing session {id} failed at version {version} ({reason}); what this resumed import wrote stays, and resuming it again continues from there")]
    ResumeFailed {
        id: SessionId,
        version: u64,
        reason: String,
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
    /// Every imported commit is synced, but moving their index out of memory
    /// failed: the store refuses writes until it is reopened, and the open
    /// brings the index up to date from the log.
    #[error("the imported commits are on disk, but writing their index failed; reopen the store")]
    IndexFailed(#[source] StoreError),
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
        let mut fold = SessionFold::new(self.id.clone(), false);
        for c in &self.commits {
            fold.commit(c)?;
        }
        fold.finish()
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

mod ahead;
mod fold;
mod import;
mod ledger;
mod read;
mod spill;
mod twice;

pub(crate) use fold::SessionFold;
#[cfg(feature = "postgres")]
pub(crate) use import::{for_each_session_commit, Planned};
pub(crate) use ledger::{Check, Denied, IdChecks, CHUNK_BYTES_MAX};

pub use import::*;
pub use read::*;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::AgentDefinition;
    use crate::store::LogStoreOptions;
    use crate::transcript::{ContentBlock, EntryKind, Message};
    use spool_engine::vfs::{FaultKind, FaultVfs, OsVfs};
    use std::sync::Arc;

    /// A store opened as `spool import` opens one.
    fn store(dir: &std::path::Path) -> LogStore {
        LogStore::open(dir, LogStoreOptions::bulk_load()).unwrap()
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

    /// An import cut short (here: the first session whole, the second's first
    /// two commits of four, the third not at all) is refused when run again, and
    /// finished by a resumed run: the store then exports exactly what a whole
    /// import gives. A resumed run of a finished import writes nothing; a store
    /// whose session is not the file's first commits, or holds more of it than
    /// the file, is refused without a write.
    #[test]
    fn a_resumed_import_finishes_an_import_cut_short() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let ids: Vec<SessionId> = (0..3).map(|_| sample(&sa)).collect();
        let mut w = ExportWriter::new(Vec::new()).unwrap();
        for id in &ids {
            w.session(&sa, id).unwrap();
        }
        let file = w.finish().unwrap().0;
        let sessions = read_export(&file[..]).unwrap();
        assert!(sessions.iter().all(|s| s.commits.len() == 4));
        let export_all = |s: &LogStore| {
            let mut w = ExportWriter::new(Vec::new()).unwrap();
            for id in &ids {
                w.session(s, id).unwrap();
            }
            without_export_time(&w.finish().unwrap().0)
        };
        let cut = |n: usize| {
            let mut cut = vec![sessions[0].clone(), sessions[1].clone()];
            cut[1].commits.truncate(n);
            cut
        };
        let b = tempfile::tempdir().unwrap();
        let sb = store(b.path());
        import_sessions(&sb, &cut(2), &ImportOptions::default(), &mut || {}).unwrap();
        let resume = ImportOptions::default().resume(true);
        let before = sb.engine().unwrap().last_seq();
        let err = import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {});
        assert!(
            matches!(err, Err(ExchangeError::SessionExists { .. })),
            "{err:?}"
        );
        assert_eq!(sb.engine().unwrap().last_seq(), before);
        // The second session has more commits in the store than in this file.
        let err = import_sessions(&sb, &cut(1), &resume, &mut || {});
        assert!(
            matches!(
                err,
                Err(ExchangeError::AheadOfSource {
                    stored: 2,
                    in_source: 1,
                    ..
                })
            ),
            "{err:?}"
        );
        // The second session's first commit is another in this file: one the
        // store lacks, one the store has at another version of the session,
        // one the store has in another session.
        let mut lacking = sessions.clone();
        lacking[1].commits[0].commit_id = Uuid::new_v4();
        let mut swapped = sessions.clone();
        let (v1, v2) = (
            swapped[1].commits[0].commit_id,
            swapped[1].commits[1].commit_id,
        );
        swapped[1].commits[0].commit_id = v2;
        swapped[1].commits[1].commit_id = v1;
        let mut elsewhere = sessions.clone();
        elsewhere[1].commits[0].commit_id = sessions[0].commits[3].commit_id;
        for other in [lacking, swapped, elsewhere] {
            let err = import_sessions(&sb, &other, &resume, &mut || {});
            assert!(
                matches!(err, Err(ExchangeError::NotResumable { version: 1, .. })),
                "{err:?}"
            );
        }
        assert_eq!(sb.engine().unwrap().last_seq(), before);
        let mut written = 0;
        let done = import_sessions(&sb, &sessions, &resume, &mut || written += 1).unwrap();
        assert_eq!(written, 2 + 4, "only what the cut import did not write");
        assert_eq!(
            done.iter().map(|s| s.version).collect::<Vec<_>>(),
            [4, 4, 4]
        );
        assert_eq!(export_all(&sb), export_all(&sa));
        let before = sb.engine().unwrap().last_seq();
        import_sessions(&sb, &sessions, &resume, &mut || {}).unwrap();
        assert_eq!(
            sb.engine().unwrap().last_seq(),
            before,
            "nothing left to write"
        );
        assert_eq!(export_all(&sb), export_all(&sa));
        // Resuming needs the file's commit ids.
        let fresh = ImportOptions::default().resume(true).fresh_commit_ids(true);
        let err = import_sessions(&sb, &sessions, &fresh, &mut || {});
        assert!(
            matches!(err, Err(ExchangeError::SessionExists { .. })),
            "{err:?}"
        );
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

    /// Commits `commit_id` on a stream of its own, as another writer would.
    fn land_elsewhere(store: &LogStore, commit_id: Uuid) {
        let engine = store.engine().unwrap();
        let commit = NewCommit {
            stream: "another-writer".into(),
            expected: ExpectedVersion::Any,
            commit_id,
            events: vec![EventData::new("other", vec![1])],
        };
        assert!(matches!(
            engine.append(commit).unwrap(),
            AppendOutcome::Committed(_)
        ));
    }

    /// Once the check pass has checked `total` commits, `then` runs (what
    /// another writer does between the check and the write).
    fn after_check(total: u64, mut then: impl FnMut()) -> impl FnMut(ImportProgress) {
        move |p| {
            if p == (ImportProgress::Checked { commits: total }) {
                then()
            }
        }
    }

    /// An export of `sample` and of a session of `saves` + 1 commits.
    fn two_sessions(saves: usize) -> (Vec<ImportSession>, SessionId, SessionId) {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let one = sample(&sa);
        let def = AgentDefinition::new("a", "d", "p");
        let mut s = sa.create(AgentSession::new(def, None)).expect("create");
        let long = s.id().clone();
        for i in 0..saves {
            s.write_metadata("k", serde_json::json!({ "n": i }))
                .unwrap();
            s = sa.save(s).unwrap();
        }
        let mut w = ExportWriter::new(Vec::new()).unwrap();
        w.session(&sa, &one).unwrap();
        w.session(&sa, &long).unwrap();
        let sessions = read_export(&w.finish().unwrap().0[..]).unwrap();
        assert_eq!(sessions[1].commits.len(), saves + 1);
        (sessions, one, long)
    }

    /// A write pass refused inside a batch of a long session's commits (its
    /// commit id landed elsewhere after the check) fails the import naming
    /// the version where it was, writes nothing of that commit's batch, and
    /// purges every session it wrote.
    #[test]
    fn a_commit_refused_in_the_write_pass_fails_the_import_and_purges() {
        let (sessions, one, long) = two_sessions(600);
        let total: u64 = sessions.iter().map(|s| s.commits.len() as u64).sum();
        for version in [300u64, 601] {
            let b = tempfile::tempdir().unwrap();
            let sb = store(b.path());
            let taken = sessions[1].commits[version as usize - 1].commit_id;
            let mut progress = after_check(total, || land_elsewhere(&sb, taken));
            let err = import_from(
                &sb,
                &mut { &sessions[..] },
                &ImportOptions::default(),
                &mut progress,
            )
            .unwrap_err();
            match &err {
                ExchangeError::ImportFailed {
                    id,
                    version: v,
                    reason,
                    rolled_back,
                } => {
                    assert_eq!((id, *v, *rolled_back), (&long, version, true), "{err}");
                    assert!(reason.contains("retried on"), "{err}");
                }
                other => panic!("{other}"),
            }
            assert!(sb.header(&one).unwrap().is_none());
            assert!(sb.header(&long).unwrap().is_none());
            // The index's last writes moved before the checkpoint deferral
            // ended, as after a success.
            assert!(spill_runs(&sb) > 0, "version {version}");
        }
    }

    /// A resumed import refused in its write pass (another writer took a
    /// commit id after the check; the store stays writable) keeps what it
    /// wrote and, as any import does, moves the index's last writes before
    /// the checkpoint deferral ends.
    #[test]
    fn a_refused_resumed_import_moves_the_index_s_last_writes() {
        let (sessions, _, long) = two_sessions(600);
        let total: u64 = sessions.iter().map(|s| s.commits.len() as u64).sum();
        let b = tempfile::tempdir().unwrap();
        let sb = store(b.path());
        let taken = sessions[1].commits[299].commit_id;
        let mut progress = after_check(total, || land_elsewhere(&sb, taken));
        let resume = ImportOptions::default().resume(true);
        let err = import_from(&sb, &mut { &sessions[..] }, &resume, &mut progress).unwrap_err();
        assert!(
            matches!(&err, ExchangeError::ResumeFailed { id, version: 300, .. } if *id == long),
            "{err}"
        );
        assert_eq!(sb.header(&long).unwrap().map(|h| h.version), Some(256));
        assert!(spill_runs(&sb) > 0);
    }

    /// Runs in the bulk-load spill directory of `s`'s index.
    fn spill_runs(s: &LogStore) -> usize {
        let dir = s.engine().unwrap().dir().join(spool_engine::INDEX_DIR);
        std::fs::read_dir(dir.join("spill")).map_or(0, |d| d.count())
    }

    /// A resumed import continues a session whose stream a purged earlier
    /// incarnation began: the store's commits count from that incarnation's
    /// purge, and the finished session exports as the file.
    #[test]
    fn a_resumed_import_continues_after_a_purged_incarnation() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let sessions = read_export(&export(&sa, &id)[..]).unwrap();
        let b = tempfile::tempdir().unwrap();
        let sb = store(b.path());
        let mut earlier = sessions.clone();
        for c in &mut earlier[0].commits {
            c.commit_id = Uuid::new_v4();
        }
        import_sessions(&sb, &earlier, &ImportOptions::default(), &mut || {}).unwrap();
        assert!(sb.delete(&id).unwrap());
        let head = |s: &LogStore| s.engine().unwrap().stream_version(id.as_str()).unwrap();
        let base = head(&sb).unwrap();
        assert!(base > 0);
        let mut cut = sessions.clone();
        cut[0].commits.truncate(2);
        import_sessions(&sb, &cut, &ImportOptions::default(), &mut || {}).unwrap();
        let resume = ImportOptions::default().resume(true);
        let mut written = 0;
        let done = import_sessions(&sb, &sessions, &resume, &mut || written += 1).unwrap();
        let commits = sessions[0].commits.len() as u64;
        assert_eq!(written, commits - 2);
        assert_eq!(done[0].version, commits);
        assert_eq!(head(&sb), Some(base + commits));
        assert_eq!(
            without_export_time(&export(&sb, &id)),
            without_export_time(&export(&sa, &id))
        );
    }

    /// A resumed import that fails purges nothing: the session it continued
    /// and the one it created keep what it wrote, and resuming again finishes
    /// the import (purged commits would keep their ids and refuse that run).
    /// The failure is a write the file system refuses in the middle of the
    /// long session.
    #[test]
    fn a_failed_resumed_import_keeps_what_it_wrote_and_resumes_again() {
        let (sessions, one, long) = two_sessions(600);
        let b = tempfile::tempdir().unwrap();
        let fault = Arc::new(FaultVfs::new(Arc::new(OsVfs)));
        let sb = LogStore::open(
            b.path(),
            LogStoreOptions {
                durability: spool_engine::Durability::Buffered,
                vfs: Some(fault.clone()),
                ..Default::default()
            },
        )
        .unwrap();
        // Cut short: `one` has 2 of its 4 commits, `long` nothing.
        let mut cut = vec![sessions[0].clone()];
        cut[0].commits.truncate(2);
        import_sessions(&sb, &cut, &ImportOptions::default(), &mut || {}).unwrap();
        let resume = ImportOptions::default().resume(true);
        // The write after `one`'s last two commits and `long`'s first batch.
        let mut progress = |p| {
            if p == (ImportProgress::Written {
                commits: 2 + 256,
                total: 2 + 601,
            }) {
                fault.fail_nth(FaultKind::Write, 1, false);
            }
        };
        let err = import_from(&sb, &mut { &sessions[..] }, &resume, &mut progress).unwrap_err();
        assert!(
            matches!(&err, ExchangeError::ResumeFailed { id, .. } if *id == long),
            "{err}"
        );
        // The file system's own words, once: the store's later refusals
        // (it is poisoned by that failure) are not added to them.
        let text = err.to_string();
        assert_eq!(text.matches("injected").count(), 1, "{text}");
        assert!(!text.contains("poisoned"), "{text}");
        fault.clear();
        sb.recover().unwrap();
        // The continued session is whole; the created one keeps its batch.
        assert_eq!(sb.header(&one).unwrap().map(|h| h.version), Some(4));
        assert_eq!(sb.header(&long).unwrap().map(|h| h.version), Some(256));
        let done = import_sessions(&sb, &sessions, &resume, &mut || {}).unwrap();
        assert_eq!(done.iter().map(|s| s.version).collect::<Vec<_>>(), [4, 601]);
        let export = |s: &LogStore| {
            let mut w = ExportWriter::new(Vec::new()).unwrap();
            w.session(s, &one).unwrap();
            w.session(s, &long).unwrap();
            without_export_time(&w.finish().unwrap().0)
        };
        let c = tempfile::tempdir().unwrap();
        let sc = store(c.path());
        import_sessions(&sc, &sessions, &ImportOptions::default(), &mut || {}).unwrap();
        assert_eq!(export(&sb), export(&sc));
    }

    /// A write pass that fails before its first write has nothing to purge,
    /// and says the import's sessions are gone rather than that purging failed.
    #[test]
    fn a_failure_before_the_first_write_does_not_claim_a_failed_purge() {
        let (sessions, _, long) = two_sessions(10);
        let b = tempfile::tempdir().unwrap();
        let sb = store(b.path());
        let taken = sessions[1].commits[0].commit_id;
        let mut progress = after_check(11, || land_elsewhere(&sb, taken));
        let err = import_from(
            &sb,
            &mut { &sessions[1..] },
            &ImportOptions::default(),
            &mut progress,
        )
        .unwrap_err();
        assert_eq!(sb.engine().unwrap().last_seq(), 1, "only the other commit");
        assert!(sb.header(&long).unwrap().is_none());
        assert!(
            matches!(
                err,
                ExchangeError::ImportFailed {
                    version: 1,
                    rolled_back: true,
                    ..
                }
            ),
            "{err}"
        );
    }

    /// A commit of another writer between two of the import's batches: the
    /// import fails at the first commit after it, and none of the import's
    /// commits lands on top of it.
    #[test]
    fn no_imported_commit_lands_after_another_writers() {
        let (sessions, _, long) = two_sessions(400);
        let b = tempfile::tempdir().unwrap();
        let sb = store(b.path());
        // After `one`'s 4 commits and `long`'s first batch.
        let mut progress = |p| {
            if p == (ImportProgress::Written {
                commits: 4 + 256,
                total: 4 + 401,
            }) {
                let mut live = sb.load(&long).unwrap().unwrap();
                live.write_metadata("other", serde_json::json!(1)).unwrap();
                sb.save(live).unwrap();
            }
        };
        let err = import_from(
            &sb,
            &mut { &sessions[..] },
            &ImportOptions::default(),
            &mut progress,
        )
        .unwrap_err();
        assert!(
            matches!(err, ExchangeError::ImportFailed { version: 257, .. }),
            "{err}"
        );
        let engine = sb.engine().unwrap();
        let after: Vec<u64> = engine
            .read_stream(long.as_str(), 258, usize::MAX)
            .unwrap()
            .iter()
            .filter(|c| c.events.iter().all(|e| e.kind != PURGE_EVENT_KIND))
            .map(|c| c.info.version)
            .collect();
        assert_eq!(
            after,
            Vec::<u64>::new(),
            "imported commits after the other writer's"
        );
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

    /// A commit id the file holds twice, in one session or in two, is
    /// refused with both places before anything is written; with fresh
    /// commit ids the file imports.
    #[test]
    fn a_commit_id_in_the_file_twice_is_refused_before_a_write() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let ids: Vec<SessionId> = (0..2).map(|_| sample(&sa)).collect();
        let mut sessions = Vec::new();
        for id in &ids {
            sessions.extend(read_export(&export(&sa, id)[..]).unwrap());
        }
        let b = tempfile::tempdir().unwrap();
        let sb = store(b.path());
        let last = sessions[1].commits.len() - 1;
        for (from, to) in [((0, 0), (0, 2)), ((0, 1), (1, last))] {
            let mut twice = sessions.clone();
            let commit_id = twice[from.0].commits[from.1].commit_id;
            twice[to.0].commits[to.1].commit_id = commit_id;
            let err = import_sessions(&sb, &twice, &ImportOptions::default(), &mut || {});
            match err {
                Err(ExchangeError::CommitIdTwice {
                    commit_id: c,
                    id,
                    version,
                    other_id,
                    other_version,
                }) => {
                    assert_eq!(c, commit_id);
                    assert_eq!((&id, version), (&ids[from.0], from.1 as u64 + 1));
                    assert_eq!((&other_id, other_version), (&ids[to.0], to.1 as u64 + 1));
                }
                other => panic!("{from:?} and {to:?}: {other:?}"),
            }
            assert_eq!(sb.engine().unwrap().last_seq(), 0, "nothing written");
            let fresh = ImportOptions::default().fresh_commit_ids(true);
            let c = tempfile::tempdir().unwrap();
            import_sessions(&store(c.path()), &twice, &fresh, &mut || {}).unwrap();
        }
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

    /// An unknown parent in a long session (its ids kept in a ledger, which
    /// answers at the session's end) is named before a later commit's taken
    /// id, as when the session's ids are held: the first problem in the
    /// file is the one reported, and nothing is written.
    #[test]
    fn a_long_session_s_refusal_comes_before_a_later_problem() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let mut sessions = read_export(&export(&sa, &id)[..]).unwrap();
        let c = &mut sessions[0].commits[1];
        if let Some(SessionEvent::EntryAppended { entry }) = c.events.first_mut() {
            entry.parent_id = Some(crate::transcript::EntryId::parse("nope").unwrap());
        } else {
            panic!("unexpected event layout");
        }
        let line = c.lines[0];
        let taken = sessions[0].commits[3].commit_id;
        for holding in [None, Some((0, 64))] {
            let b = tempfile::tempdir().unwrap();
            let sb = store(b.path());
            land_elsewhere(&sb, taken);
            fold::HOLDING.set(holding);
            let err = import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {});
            fold::HOLDING.set(None);
            match err {
                Err(ExchangeError::Malformed { line: l, reason }) => {
                    assert_eq!(l, line, "{holding:?}");
                    assert!(
                        reason.contains("version 2") && reason.contains("nope"),
                        "{reason}"
                    );
                }
                e => panic!("{holding:?}: unexpected {e:?}"),
            }
            assert_eq!(sb.engine().unwrap().last_seq(), 1, "nothing imported");
        }
    }

    /// The same with the later problem an unreadable line of the file, which
    /// the file's reader meets: the long session's earlier refusal is named.
    #[test]
    fn a_long_session_s_refusal_comes_before_a_later_unreadable_line() {
        let a = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let text = String::from_utf8(export(&sa, &id)).unwrap();
        let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
        let at = |lines: &[String], version: u64, kind: &str| {
            lines
                .iter()
                .position(|l| {
                    let v: serde_json::Value = serde_json::from_str(l).unwrap();
                    v["version"] == version && v["event"]["type"] == kind
                })
                .unwrap()
        };
        let appended = at(&lines, 2, "entry_appended");
        let mut v: serde_json::Value = serde_json::from_str(&lines[appended]).unwrap();
        v["event"]["entry"]["parent_id"] = "nope".into();
        lines[appended] = v.to_string();
        let later = at(&lines, 4, "entry_appended");
        lines[later] = "{not json".into();
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("export.jsonl");
        std::fs::write(&file, lines.join("\n") + "\n").unwrap();
        for holding in [None, Some((0, 64))] {
            let b = tempfile::tempdir().unwrap();
            let sb = store(b.path());
            fold::HOLDING.set(holding);
            let err = import_from(
                &sb,
                &mut ExportFile::new(&file),
                &ImportOptions::default(),
                &mut |_| {},
            );
            fold::HOLDING.set(None);
            match err {
                Err(ExchangeError::Malformed { line, reason }) => {
                    assert_eq!(line, appended as u64 + 1, "{holding:?}: {reason}");
                    assert!(reason.contains("nope"), "{reason}");
                }
                e => panic!("{holding:?}: unexpected {e:?}"),
            }
            assert_eq!(sb.engine().unwrap().last_seq(), 0, "nothing written");
        }
    }

    /// A resumed import writes the settings snapshot of a long session from
    /// the commits it skipped and the ones it wrote; a resumed run that finds
    /// the session whole writes it too.
    #[test]
    fn a_resumed_long_session_gets_its_settings_snapshot() {
        let (sessions, _one, long) = two_sessions(40);
        let b = tempfile::tempdir().unwrap();
        let sb = store(b.path());
        let mut cut = sessions.clone();
        cut[1].commits.truncate(20);
        import_sessions(&sb, &cut, &ImportOptions::default(), &mut || {}).unwrap();
        sb.drop_cached_settings(&long);
        let resume = ImportOptions::default().resume(true);
        import_sessions(&sb, &sessions, &resume, &mut || {}).unwrap();
        let (version, cached) = sb.cached_settings(&long).expect("a settings snapshot");
        assert_eq!((version, cached.version()), (41, 41));
        sb.assert_settings_fold_from_start(&long);
        sb.drop_cached_settings(&long);
        import_sessions(&sb, &sessions, &resume, &mut || {}).unwrap();
        let (version, _) = sb.cached_settings(&long).expect("a settings snapshot");
        assert_eq!(version, 41);
        sb.assert_settings_fold_from_start(&long);
    }

    /// An import leaves no index write in memory when its checkpoint deferral ends
    /// (`Store::flush_index`): its last memtable went to a run of the bulk load, so no background
    /// move is left to finish after the guard and write a checkpoint of nearly
    /// everything that the close writes again.
    #[test]
    fn an_import_moves_its_last_memtable_before_the_deferral_ends() {
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let sa = store(a.path());
        let id = sample(&sa);
        let sessions = read_export(&export(&sa, &id)[..]).unwrap();
        let sb = store(b.path());
        assert_eq!(spill_runs(&sb), 0, "nothing spilled before the import");
        import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {}).unwrap();
        assert!(spill_runs(&sb) > 0, "the import's memtable went to a run");
    }
}
