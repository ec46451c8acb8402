//! The measuring side of the `execute` workload: one subject, one history
//! size, in a process of its own, so that the process's peak resident set
//! is that subject's at that size alone.
//!
//! The parent ([`crate::workloads::execute`]) builds the history in a
//! fresh directory ([`build`], untimed, in its own process), then starts
//! this binary again with [`CHILD_ARG`] and a [`ChildSpec`]; the child
//! opens the directory, runs the turns ([`measure`]) and prints one
//! [`ChildReport`] as JSON on stdout.
//!
//! Every turn adds a [`TURN_TEXT_BYTES`]-byte user message and a reply of
//! the same size; the history is made of such turns too (user and
//! assistant entries alternating), so a session of `n` entries holds
//! `n × TURN_TEXT_BYTES` bytes of text.
//!
//! - `spool`: [`SessionRuntime::open`] on the directory (the log store,
//!   default options: `Immediate` durability), then per turn
//!   `SessionRuntime::execute(&id, &SendMessage::new(text, factory))`
//!   with the runtime's [`ScriptedLoopFactory`] replying the turn's reply.
//!   The history was committed one turn per commit, as executes leave it
//!   (user entry, execution started, reply, execution finished).
//! - `jsonl` (pi's way): per turn, both lines appended with one `write` on
//!   the session file opened for appending, `fdatasync`, then the whole
//!   file read and parsed and the root-to-leaf path rebuilt from the
//!   parent ids, which is the model context.
//! - `sqlite`: WAL, `synchronous=FULL`; per turn, both rows inserted in
//!   one `BEGIN IMMEDIATE` transaction, then the context selected: the
//!   newest rows whose text fits the context budget, newest first.
//!
//! Every turn's answer is checked: spool's returned session holds the
//! history plus the turns so far and ends with the reply; the JSONL path
//! has that length and ends with the reply; SQLite's context is the
//! expected tail and starts (newest first) with the reply.

use std::collections::HashMap;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use rusqlite::{params, Connection};
use serde::{Deserialize, Serialize};
use spool_runtime::session::{ExecutionStatus, SessionEvent};
use spool_runtime::store::TranscriptBackend;
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::transcript::{ContentBlock, EntryKind, Message, Usage};
use spool_runtime::{
    AgentDefinition, AgentSession, LoopFactory, ScriptedLoopFactory, ScriptedTurn, SendMessage,
    SessionId, SessionRuntime,
};

use crate::data::{self, parse_json_line, write_json_line, JsonEntry, Record, Role};
use crate::error::{io_err, BenchError};
use crate::harness::{wrong, CONTEXT_BUDGET};
use crate::report;
use crate::subject::session_id;
use crate::workloads::Workload;

/// The first argument that makes `spool-bench` a measuring child; the
/// second is the [`ChildSpec`] as JSON.
pub const CHILD_ARG: &str = "__execute-child";

/// Text bytes of every message: each turn's user message and reply, and
/// every entry of the history.
pub const TURN_TEXT_BYTES: usize = 400;

/// The subjects of the workload, in the order they run in a round.
pub const SUBJECTS: [&str; 3] = ["spool", "sqlite", "jsonl"];

/// The session's key (its id is [`session_id`] of it).
const SESSION_KEY: u64 = 0;

/// The JSONL session file inside a store directory.
const JSONL_FILE: &str = "session.jsonl";

/// The SQLite database file inside a store directory.
const SQLITE_FILE: &str = "bench.sqlite3";

/// Rows of the SQLite history inserted per transaction while building.
const SQLITE_BUILD_ROWS: usize = 10_000;

/// What one child measures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ChildSpec {
    /// `spool`, `sqlite` or `jsonl`.
    pub subject: String,
    /// The store directory [`build`] filled.
    pub dir: PathBuf,
    /// Entries in the session before the first turn.
    pub history: u64,
    /// Turns to run and time.
    pub turns: usize,
    /// The variant, for answer errors.
    pub variant: String,
}

/// What one child measured.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct ChildReport {
    /// Microseconds of each turn, in order.
    pub turn_us: Vec<f64>,
    /// The process's peak RSS (VmHWM) once the store was open, before the
    /// first turn: start-up and open.
    pub ready_peak_rss_bytes: Option<u64>,
    /// The process's RSS just before the first turn (the peak reset to
    /// it); `None` when the peak cannot be reset here.
    pub ready_rss_bytes: Option<u64>,
    /// The peak RSS during the turns alone (reset before the first);
    /// `None` when the peak cannot be reset here.
    pub turns_peak_rss_bytes: Option<u64>,
    /// The process's peak RSS over its whole life: start-up, open and
    /// turns.
    pub peak_rss_bytes: Option<u64>,
}

/// The deterministic text of entry `seq`: [`TURN_TEXT_BYTES`] bytes of
/// ASCII words.
pub fn text_for(seq: u64) -> String {
    const WORDS: [&str; 16] = [
        "the", "session", "file", "error", "return", "value", "build", "test", "agent", "model",
        "context", "tool", "result", "branch", "commit", "check",
    ];
    let mut rng = data::SplitMix64::new(data::DEFAULT_SEED ^ seq.wrapping_mul(0x9E37_79B9));
    let mut s = String::with_capacity(TURN_TEXT_BYTES + 16);
    while s.len() < TURN_TEXT_BYTES {
        if !s.is_empty() {
            s.push(' ');
        }
        s.push_str(WORDS[rng.range(0, WORDS.len() as u64 - 1) as usize]);
    }
    s.truncate(TURN_TEXT_BYTES);
    s
}

/// The record at `seq`: user messages at even positions, replies at odd.
pub fn record_for(seq: u64) -> Record {
    Record {
        role: if seq.is_multiple_of(2) {
            Role::User
        } else {
            Role::Assistant
        },
        text: text_for(seq),
    }
}

fn subject_err(subject: &str, e: impl std::fmt::Display) -> BenchError {
    BenchError::Subject {
        subject: subject.to_string(),
        message: e.to_string(),
    }
}

fn sql(context: &str, source: rusqlite::Error) -> BenchError {
    BenchError::Sqlite {
        subject: "sqlite".into(),
        context: context.to_string(),
        source,
    }
}

fn definition() -> AgentDefinition {
    AgentDefinition::new("bench-agent", "benchmark sessions", "You are benchmarked.")
}

/// Fills the empty directory `dir` with `subject`'s session of `history`
/// entries (untimed setup, run by the parent).
pub fn build(subject: &str, dir: &Path, history: u64) -> Result<(), BenchError> {
    match subject {
        "spool" => build_spool(dir, history),
        "sqlite" => build_sqlite(dir, history),
        "jsonl" => build_jsonl(dir, history),
        other => Err(subject_err(other, "not a subject of the execute workload")),
    }
}

/// One commit per turn, holding what an execute commits (the user entry,
/// the execution's start, the reply and its end), on a buffered store
/// closed afterwards.
fn build_spool(dir: &Path, history: u64) -> Result<(), BenchError> {
    let err = |e: &dyn std::fmt::Display| subject_err("spool", e);
    let opts = LogStoreOptions {
        durability: spool_engine::Durability::Buffered,
        ..LogStoreOptions::default()
    };
    let store = LogStore::open(dir, opts).map_err(|e| err(&e))?;
    let id = SessionId::parse(&session_id(SESSION_KEY)).map_err(|e| err(&e))?;
    let created = store
        .create(AgentSession::new_with_id(id, definition(), None))
        .map_err(|e| err(&e))?;
    let mut version = created.version();
    let mut seq = 0;
    let mut execution = 0;
    while seq < history {
        execution += 1;
        let mut events = vec![
            SessionEvent::EntryAppended {
                entry: crate::spool::entry_for(seq, &record_for(seq))?,
            },
            SessionEvent::ExecutionStarted { execution },
        ];
        if seq + 1 < history {
            events.push(SessionEvent::EntryAppended {
                entry: crate::spool::entry_for(seq + 1, &record_for(seq + 1))?,
            });
        }
        events.push(SessionEvent::ExecutionFinished {
            status: ExecutionStatus::Completed,
            usage: Usage::default(),
            error: None,
        });
        version = store
            .append_events(created.id(), version, events)
            .map_err(|e| err(&e))?
            .session_version;
        seq += 2;
    }
    store.close().map_err(|e| err(&e))
}

fn sqlite_connect(path: &Path, synchronous: &str) -> Result<Connection, BenchError> {
    let conn =
        Connection::open(path).map_err(|e| sql(&format!("opening {}", path.display()), e))?;
    conn.busy_timeout(crate::peers::sqlite::BUSY_TIMEOUT)
        .map_err(|e| sql("setting busy_timeout", e))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| sql("setting journal_mode", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(subject_err(
            "sqlite",
            format!("journal_mode is {mode}, WAL was asked for"),
        ));
    }
    conn.pragma_update(None, "synchronous", synchronous)
        .map_err(|e| sql("setting synchronous", e))?;
    Ok(conn)
}

const SQLITE_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS entries (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id TEXT NOT NULL,
    parent_id TEXT,
    ts INTEGER NOT NULL,
    role TEXT NOT NULL,
    text TEXT NOT NULL
);
CREATE UNIQUE INDEX IF NOT EXISTS entries_by_session ON entries (session, seq);
";

const SQLITE_INSERT: &str = "INSERT INTO entries (session, seq, id, parent_id, ts, role, text) \
                             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";

const SQLITE_TAIL: &str =
    "SELECT seq, role, text FROM entries WHERE session = ?1 ORDER BY seq DESC";

fn sqlite_insert(conn: &Connection, session: &str, seq: u64, r: &Record) -> Result<(), BenchError> {
    let seq_i = i64::try_from(seq).map_err(|e| subject_err("sqlite", e))?;
    conn.prepare_cached(SQLITE_INSERT)
        .and_then(|mut s| {
            s.execute(params![
                session,
                seq_i,
                data::entry_id(seq),
                seq.checked_sub(1).map(data::entry_id),
                data::BASE_TIMESTAMP_MS + seq_i,
                r.role.as_str(),
                r.text,
            ])
        })
        .map_err(|e| sql("inserting an entry", e))?;
    Ok(())
}

fn build_sqlite(dir: &Path, history: u64) -> Result<(), BenchError> {
    let conn = sqlite_connect(&dir.join(SQLITE_FILE), "OFF")?;
    conn.execute_batch(SQLITE_SCHEMA)
        .map_err(|e| sql("creating the schema", e))?;
    let session = session_id(SESSION_KEY);
    let mut seq = 0;
    while seq < history {
        let end = history.min(seq + SQLITE_BUILD_ROWS as u64);
        conn.execute_batch("BEGIN")
            .map_err(|e| sql("beginning the build", e))?;
        for s in seq..end {
            sqlite_insert(&conn, &session, s, &record_for(s))?;
        }
        conn.execute_batch("COMMIT")
            .map_err(|e| sql("committing the build", e))?;
        seq = end;
    }
    // Later connections run with synchronous=FULL: leave nothing
    // unsynced behind.
    conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
        .map_err(|e| sql("checkpointing the build", e))?;
    conn.close().map_err(|(_, e)| sql("closing the build", e))
}

fn build_jsonl(dir: &Path, history: u64) -> Result<(), BenchError> {
    let path = dir.join(JSONL_FILE);
    let file = std::fs::File::create(&path).map_err(|e| io_err("jsonl", &path, e))?;
    let mut out = std::io::BufWriter::new(file);
    let mut line = Vec::new();
    for seq in 0..history {
        line.clear();
        write_json_line(&mut line, seq, &record_for(seq)).map_err(|source| BenchError::Json {
            subject: "jsonl".into(),
            path: path.clone(),
            line: seq + 1,
            source,
        })?;
        out.write_all(&line)
            .map_err(|e| io_err("jsonl", &path, e))?;
    }
    let file = out
        .into_inner()
        .map_err(|e| io_err("jsonl", &path, e.into_error()))?;
    file.sync_all().map_err(|e| io_err("jsonl", &path, e))?;
    crate::peers::sync_dir("jsonl", dir)
}

/// What the subjects need of one turn: its texts, prepared before the
/// clock starts.
struct Turn {
    seq: u64,
    user: Record,
    reply: Record,
}

fn turns(history: u64, n: usize) -> Vec<Turn> {
    (0..n as u64)
        .map(|i| {
            let seq = history + 2 * i;
            Turn {
                seq,
                user: Record {
                    role: Role::User,
                    text: text_for(seq),
                },
                reply: Record {
                    role: Role::Assistant,
                    text: text_for(seq + 1),
                },
            }
        })
        .collect()
}

/// Opens `spec.dir` as `spec.subject` and runs and times its turns,
/// recording the process's memory before and after (see
/// [`ChildReport`]).
pub fn measure(spec: &ChildSpec) -> Result<ChildReport, BenchError> {
    let turns = turns(spec.history, spec.turns);
    match spec.subject.as_str() {
        "spool" => measure_spool(spec, &turns),
        "sqlite" => measure_sqlite(spec, &turns),
        "jsonl" => measure_jsonl(spec, &turns),
        other => Err(subject_err(other, "not a subject of the execute workload")),
    }
}

/// Memory bookkeeping around the timed turns.
struct Rss {
    ready_peak: Option<u64>,
    ready: Option<u64>,
}

impl Rss {
    /// Called once the store is open, right before the first turn.
    fn ready() -> Rss {
        let ready_peak = report::peak_rss_bytes();
        // After a reset the peak is the current RSS: what the process
        // holds before its first turn.
        let ready = report::reset_peak_rss()
            .then(report::peak_rss_bytes)
            .flatten();
        Rss { ready_peak, ready }
    }

    fn finish(self, turn_us: Vec<f64>) -> ChildReport {
        let end_peak = report::peak_rss_bytes();
        let (turns_peak, peak) = match self.ready {
            // The peak was reset: the end peak covers the turns alone.
            Some(_) => (end_peak, end_peak.max(self.ready_peak)),
            None => (None, end_peak),
        };
        ChildReport {
            turn_us,
            ready_peak_rss_bytes: self.ready_peak,
            ready_rss_bytes: self.ready,
            turns_peak_rss_bytes: turns_peak,
            peak_rss_bytes: peak,
        }
    }
}

fn check(
    spec: &ChildSpec,
    ok: bool,
    got: impl FnOnce() -> String,
    expected: impl FnOnce() -> String,
) -> Result<(), BenchError> {
    if ok {
        Ok(())
    } else {
        Err(wrong(
            &spec.subject,
            Workload::Execute,
            &spec.variant,
            got(),
            expected(),
        ))
    }
}

fn text_of(message: &Message) -> Option<&str> {
    let content = match message {
        Message::User { content } | Message::Assistant { content, .. } => content,
        _ => return None,
    };
    match content.as_slice() {
        [ContentBlock::Text { text }] => Some(text),
        _ => None,
    }
}

fn measure_spool(spec: &ChildSpec, turns: &[Turn]) -> Result<ChildReport, BenchError> {
    let err = |e: &dyn std::fmt::Display| subject_err("spool", e);
    let runtime = SessionRuntime::open(&spec.dir).map_err(|e| err(&e))?;
    let id = SessionId::parse(&session_id(SESSION_KEY)).map_err(|e| err(&e))?;
    let factory: Arc<dyn LoopFactory> = Arc::new(ScriptedLoopFactory::new(
        turns
            .iter()
            .map(|t| ScriptedTurn::Reply(t.reply.text.clone())),
    ));
    let actions: Vec<SendMessage> = turns
        .iter()
        .map(|t| SendMessage::new(t.user.text.clone(), factory.clone()))
        .collect();
    let rss = Rss::ready();
    let mut turn_us = Vec::with_capacity(turns.len());
    for (t, action) in turns.iter().zip(&actions) {
        let start = Instant::now();
        let session = runtime.execute(&id, action).map_err(|e| err(&e))?;
        // The session comes back bounded: its transcript is the working
        // set; the entry count covers the whole history.
        let transcript = &session.state().transcript;
        let len = session.transcript_entries();
        let leaf_text = transcript
            .leaf()
            .and_then(|l| transcript.get(l))
            .and_then(|e| match &e.kind {
                EntryKind::Message { message } => text_of(message),
                _ => None,
            })
            .map(str::to_owned);
        // The caller drops the session it got back: part of the call.
        drop(session);
        turn_us.push(start.elapsed().as_secs_f64() * 1e6);
        let want = t.seq + 2;
        check(
            spec,
            len == want && leaf_text.as_deref() == Some(t.reply.text.as_str()),
            || format!("{len} entries ending with {leaf_text:?}"),
            || format!("{want} entries ending with the turn's reply"),
        )?;
    }
    let report = rss.finish(turn_us);
    drop(runtime);
    Ok(report)
}

/// The expected SQLite context after `entries` entries: the newest whose
/// text fits the budget (every entry has the same size).
fn sqlite_expected(entries: u64) -> (u64, u64) {
    let n = entries.min((CONTEXT_BUDGET / TURN_TEXT_BYTES) as u64);
    (n, n * TURN_TEXT_BYTES as u64)
}

fn measure_sqlite(spec: &ChildSpec, turns: &[Turn]) -> Result<ChildReport, BenchError> {
    let conn = sqlite_connect(&spec.dir.join(SQLITE_FILE), "FULL")?;
    let session = session_id(SESSION_KEY);
    let rss = Rss::ready();
    let mut turn_us = Vec::with_capacity(turns.len());
    for t in turns {
        let start = Instant::now();
        conn.prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut s| s.execute([]))
            .map_err(|e| sql("beginning a turn", e))?;
        let inserted = sqlite_insert(&conn, &session, t.seq, &t.user)
            .and_then(|()| sqlite_insert(&conn, &session, t.seq + 1, &t.reply));
        if let Err(e) = inserted {
            let _ = conn.execute_batch("ROLLBACK");
            return Err(e);
        }
        conn.prepare_cached("COMMIT")
            .and_then(|mut s| s.execute([]))
            .map_err(|e| sql("committing a turn", e))?;
        // The context, newest first, text in memory.
        let mut context: Vec<(i64, String, String)> = Vec::new();
        let mut bytes = 0usize;
        {
            let mut stmt = conn
                .prepare_cached(SQLITE_TAIL)
                .map_err(|e| sql("preparing the context query", e))?;
            let mut rows = stmt
                .query(params![session])
                .map_err(|e| sql("selecting the context", e))?;
            while let Some(row) = rows.next().map_err(|e| sql("selecting the context", e))? {
                let text: String = row.get(2).map_err(|e| sql("reading a row", e))?;
                if bytes + text.len() > CONTEXT_BUDGET {
                    break;
                }
                bytes += text.len();
                let seq: i64 = row.get(0).map_err(|e| sql("reading a row", e))?;
                let role: String = row.get(1).map_err(|e| sql("reading a row", e))?;
                context.push((seq, role, text));
            }
        }
        context.reverse();
        turn_us.push(start.elapsed().as_secs_f64() * 1e6);
        let (want_n, want_bytes) = sqlite_expected(t.seq + 2);
        let newest = context.last().map(|(_, _, text)| text.as_str());
        check(
            spec,
            context.len() as u64 == want_n
                && bytes as u64 == want_bytes
                && newest == Some(t.reply.text.as_str()),
            || format!("{} rows / {bytes} bytes", context.len()),
            || format!("{want_n} rows / {want_bytes} bytes ending with the reply"),
        )?;
    }
    let report = rss.finish(turn_us);
    conn.close().map_err(|(_, e)| sql("closing", e))?;
    Ok(report)
}

/// Parses the whole session file.
fn jsonl_parse(path: &Path, bytes: &[u8]) -> Result<Vec<JsonEntry>, BenchError> {
    let mut out = Vec::new();
    for (i, line) in bytes.split(|b| *b == b'\n').enumerate() {
        if line.is_empty() {
            continue;
        }
        out.push(parse_json_line(line).map_err(|source| BenchError::Json {
            subject: "jsonl".into(),
            path: path.to_path_buf(),
            line: i as u64 + 1,
            source,
        })?);
    }
    Ok(out)
}

/// The root-to-leaf path ending at the last entry of the file, by parent
/// ids; `None` if a parent is missing or the chain loops.
fn jsonl_path(entries: &[JsonEntry]) -> Option<Vec<&JsonEntry>> {
    let by_id: HashMap<&str, &JsonEntry> = entries.iter().map(|e| (e.id.as_str(), e)).collect();
    let mut path = Vec::new();
    let mut cur = entries.last();
    while let Some(e) = cur {
        if path.len() > entries.len() {
            return None;
        }
        path.push(e);
        cur = match &e.parent_id {
            Some(p) => Some(*by_id.get(p.as_str())?),
            None => None,
        };
    }
    path.reverse();
    Some(path)
}

fn measure_jsonl(spec: &ChildSpec, turns: &[Turn]) -> Result<ChildReport, BenchError> {
    let path = spec.dir.join(JSONL_FILE);
    let io = |e| io_err("jsonl", &path, e);
    let rss = Rss::ready();
    let mut turn_us = Vec::with_capacity(turns.len());
    let mut lines = Vec::new();
    for t in turns {
        let start = Instant::now();
        lines.clear();
        for (seq, r) in [(t.seq, &t.user), (t.seq + 1, &t.reply)] {
            write_json_line(&mut lines, seq, r).map_err(|source| BenchError::Json {
                subject: "jsonl".into(),
                path: path.clone(),
                line: seq + 1,
                source,
            })?;
        }
        // Opened per turn, as an append-file call does.
        let mut file = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(io)?;
        file.write_all(&lines).map_err(io)?;
        file.sync_data().map_err(io)?;
        drop(file);
        let bytes = std::fs::read(&path).map_err(io)?;
        let entries = jsonl_parse(&path, &bytes)?;
        drop(bytes);
        let context: Option<Vec<&str>> =
            jsonl_path(&entries).map(|p| p.into_iter().map(|e| e.text.as_str()).collect());
        let got = context
            .as_ref()
            .map(|c| (c.len() as u64, c.last().map(|s| s.to_string())));
        drop(context);
        drop(entries);
        turn_us.push(start.elapsed().as_secs_f64() * 1e6);
        let want = t.seq + 2;
        check(
            spec,
            got.as_ref()
                .is_some_and(|(n, last)| *n == want && last.as_deref() == Some(&*t.reply.text)),
            || format!("{got:?}"),
            || format!("a path of {want} entries ending with the reply"),
        )?;
    }
    Ok(rss.finish(turn_us))
}

/// The child's entry point: `args` are the process's arguments after
/// [`CHILD_ARG`]. Prints the report as JSON on stdout; an error goes to
/// stderr with exit code 2.
pub fn child_main(args: &[String]) -> std::process::ExitCode {
    let result = (|| {
        let [json] = args else {
            return Err(format!("{CHILD_ARG} takes one argument, its spec as JSON"));
        };
        let spec: ChildSpec =
            serde_json::from_str(json).map_err(|e| format!("bad child spec: {e}"))?;
        let report = measure(&spec).map_err(|e| {
            let mut msg = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                msg.push_str(&format!(": {s}"));
                source = s.source();
            }
            msg
        })?;
        serde_json::to_string(&report).map_err(|e| e.to_string())
    })();
    match result {
        Ok(json) => {
            println!("{json}");
            std::process::ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            std::process::ExitCode::from(2)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn texts_are_fixed_size_and_deterministic() {
        for seq in [0, 1, 2, 49_999] {
            assert_eq!(text_for(seq).len(), TURN_TEXT_BYTES);
            assert_eq!(text_for(seq), text_for(seq));
        }
        assert_ne!(text_for(0), text_for(1));
        assert_eq!(record_for(4).role, Role::User);
        assert_eq!(record_for(5).role, Role::Assistant);
    }

    #[test]
    fn the_jsonl_path_follows_parent_ids_and_rejects_a_broken_chain() {
        let entries: Vec<JsonEntry> = (0..5).map(|s| JsonEntry::new(s, &record_for(s))).collect();
        let p = jsonl_path(&entries).unwrap();
        assert_eq!(p.iter().map(|e| e.seq).collect::<Vec<_>>(), [0, 1, 2, 3, 4]);
        let mut broken = entries.clone();
        broken.remove(2);
        assert!(jsonl_path(&broken).is_none());
    }

    #[test]
    fn every_subject_builds_and_measures_its_turns() {
        for subject in SUBJECTS {
            let dir = tempfile::tempdir().unwrap();
            build(subject, dir.path(), 11).unwrap();
            let spec = ChildSpec {
                subject: subject.into(),
                dir: dir.path().to_path_buf(),
                history: 11,
                turns: 3,
                variant: "history=11".into(),
            };
            let r = measure(&spec).unwrap();
            assert_eq!(r.turn_us.len(), 3, "{subject}");
            assert!(r.turn_us.iter().all(|t| *t > 0.0), "{subject}");
            assert!(r.peak_rss_bytes.is_some(), "{subject}");
        }
    }

    #[test]
    fn a_history_of_another_length_is_a_wrong_answer() {
        for subject in SUBJECTS {
            let dir = tempfile::tempdir().unwrap();
            build(subject, dir.path(), 10).unwrap();
            let spec = ChildSpec {
                subject: subject.into(),
                dir: dir.path().to_path_buf(),
                // The session holds 10 entries, the child is told 200.
                history: 200,
                turns: 1,
                variant: "history=200".into(),
            };
            let err = measure(&spec).unwrap_err();
            assert!(
                matches!(err, BenchError::WrongAnswer { .. }),
                "{subject}: {err}"
            );
        }
    }

    #[test]
    fn the_sqlite_context_is_the_budget_tail() {
        assert_eq!(sqlite_expected(10), (10, 4_000));
        let cap = (CONTEXT_BUDGET / TURN_TEXT_BYTES) as u64;
        assert_eq!(sqlite_expected(50_000), (cap, cap * TURN_TEXT_BYTES as u64));
    }
}
