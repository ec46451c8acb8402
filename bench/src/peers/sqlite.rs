//! The SQLite peer, set up as its experts would set it up.
//!
//! - rusqlite with its bundled SQLite; one database file per store.
//! - `journal_mode=WAL`; `synchronous=FULL` for durable runs, `OFF` for
//!   buffered runs; `busy_timeout` 5 s.
//! - One connection per writer thread; every statement prepared once and
//!   cached on its connection (`prepare_cached`).
//! - Schema: `sessions` (id primary key, parent, status, agent, version,
//!   updated time) with an index on `(status, updated_ms)`; `entries` (a
//!   rowid table) with a unique index on `(session, seq)`, so a session's
//!   tail and a branch's range are index range scans.
//! - Append: one transaction per commit, `BEGIN IMMEDIATE` (take the write
//!   lock up front instead of upgrading, as WAL writers should), one
//!   `INSERT`, `COMMIT`. The session header is not touched: the peer's best
//!   case.
//! - Writers in the process are serialized by an in-process mutex around
//!   each write transaction. SQLite admits one writer at a time anyway;
//!   without the mutex, concurrent connections meet through the busy
//!   handler, which sleeps with a millisecond backoff, and 16 writers
//!   commit many times slower than one. The busy timeout stays as the
//!   guard against other processes.
//! - Open: a tail query newest first, stepping until the 64 KiB budget is
//!   reached. Page: keyset pagination on `(session, seq)`. List: an index
//!   range scan on status, newest update first. Fork: `INSERT ... SELECT`
//!   row copy in one durable transaction, then open the fork.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use rusqlite::{params, Connection, OptionalExtension};

use super::context;
use crate::data::{entry_id, Record, BASE_TIMESTAMP_MS};
use crate::error::BenchError;
use crate::subject::{
    ContextSummary, Durability, PageSummary, SessionData, SessionSpec, SpoolSubject, Status,
    SubjectStore,
};
use crate::workloads::Workload;

const NAME: &str = "sqlite";

/// The database file inside a store directory.
pub const DB_FILE: &str = "bench.sqlite3";

/// How long a writer waits for the write lock before failing.
pub const BUSY_TIMEOUT: Duration = Duration::from_secs(5);

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    parent_id TEXT,
    status TEXT NOT NULL,
    agent TEXT NOT NULL,
    version INTEGER NOT NULL,
    updated_ms INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS sessions_by_status ON sessions (status, updated_ms);
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

const INSERT_ENTRY: &str =
    "INSERT INTO entries (session, seq, id, parent_id, ts, role, text) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)";
const INSERT_SESSION: &str =
    "INSERT INTO sessions (id, parent_id, status, agent, version, updated_ms) VALUES (?1, ?2, ?3, ?4, ?5, ?6)";
const TAIL: &str = "SELECT seq, role, text FROM entries WHERE session = ?1 ORDER BY seq DESC";
const PAGE: &str =
    "SELECT seq, role, text FROM entries WHERE session = ?1 AND seq > ?2 ORDER BY seq ASC";
const LIST: &str = "SELECT id, parent_id, status, agent, version, updated_ms FROM sessions \
                    WHERE status = ?1 ORDER BY updated_ms DESC";
const FORK_ROWS: &str = "INSERT INTO entries (session, seq, id, parent_id, ts, role, text) \
                         SELECT ?1, seq, id, parent_id, ts, role, text FROM entries \
                         WHERE session = ?2 AND seq <= ?3";

/// The SQLite peer (key `sqlite`): takes part in every workload.
#[derive(Clone, Copy, Debug, Default)]
pub struct SqlitePeer;

impl SpoolSubject for SqlitePeer {
    fn name(&self) -> &str {
        NAME
    }

    fn supports(&self, _workload: Workload) -> bool {
        true
    }

    fn open_store(
        &self,
        dir: &Path,
        durability: Durability,
        writers: usize,
    ) -> Result<Box<dyn SubjectStore>, BenchError> {
        let path = dir.join(DB_FILE);
        let mut conns = Vec::with_capacity(writers.max(1));
        for _ in 0..writers.max(1) {
            conns.push(Mutex::new(connect(&path, durability)?));
        }
        conns[0]
            .get_mut()
            .map_err(|_| poisoned())?
            .execute_batch(SCHEMA)
            .map_err(|e| sql("creating the schema", e))?;
        Ok(Box::new(SqliteStore {
            path,
            conns,
            write_lock: Mutex::new(()),
        }))
    }
}

fn connect(path: &Path, durability: Durability) -> Result<Connection, BenchError> {
    let conn =
        Connection::open(path).map_err(|e| sql(&format!("opening {}", path.display()), e))?;
    conn.busy_timeout(BUSY_TIMEOUT)
        .map_err(|e| sql("setting busy_timeout", e))?;
    let mode: String = conn
        .query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))
        .map_err(|e| sql("setting journal_mode", e))?;
    if !mode.eq_ignore_ascii_case("wal") {
        return Err(BenchError::Subject {
            subject: NAME.into(),
            message: format!("journal_mode is {mode}, WAL was asked for"),
        });
    }
    let sync = match durability {
        Durability::Durable => "FULL",
        Durability::Buffered => "OFF",
    };
    conn.pragma_update(None, "synchronous", sync)
        .map_err(|e| sql("setting synchronous", e))?;
    Ok(conn)
}

fn sql(context: &str, source: rusqlite::Error) -> BenchError {
    BenchError::Sqlite {
        subject: NAME.into(),
        context: context.to_string(),
        source,
    }
}

fn poisoned() -> BenchError {
    BenchError::Subject {
        subject: NAME.into(),
        message: "a connection's lock was poisoned by a panicking thread".into(),
    }
}

/// An open SQLite store: one connection per writer thread. Reads use
/// connection 0.
pub struct SqliteStore {
    path: PathBuf,
    conns: Vec<Mutex<Connection>>,
    /// Serializes write transactions within the process (see the module
    /// docs).
    write_lock: Mutex<()>,
}

impl SqliteStore {
    fn conn(&self, writer: usize) -> Result<MutexGuard<'_, Connection>, BenchError> {
        let m = self.conns.get(writer).ok_or_else(|| BenchError::Subject {
            subject: NAME.into(),
            message: format!(
                "writer {writer} out of range: the store has {} connections",
                self.conns.len()
            ),
        })?;
        m.lock().map_err(|_| poisoned())
    }

    /// Runs `body` inside `BEGIN IMMEDIATE` ... `COMMIT` holding the
    /// in-process write lock, rolling back if it fails.
    fn in_transaction<T>(
        &self,
        conn: &Connection,
        what: &str,
        body: impl FnOnce(&Connection) -> Result<T, BenchError>,
    ) -> Result<T, BenchError> {
        let _writer = self.write_lock.lock().map_err(|_| poisoned())?;
        conn.prepare_cached("BEGIN IMMEDIATE")
            .and_then(|mut s| s.execute([]))
            .map_err(|e| sql(&format!("beginning {what}"), e))?;
        match body(conn) {
            Ok(v) => {
                conn.prepare_cached("COMMIT")
                    .and_then(|mut s| s.execute([]))
                    .map_err(|e| sql(&format!("committing {what}"), e))?;
                Ok(v)
            }
            Err(e) => {
                // The body's error is the one worth reporting; a failed
                // rollback leaves the connection unusable anyway.
                let _ = conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    fn insert_session(conn: &Connection, s: &SessionSpec) -> Result<(), BenchError> {
        conn.prepare_cached(INSERT_SESSION)
            .and_then(|mut st| {
                st.execute(params![
                    s.id(),
                    s.parent.map(crate::subject::session_id),
                    s.status.as_str(),
                    s.agent(),
                    0i64,
                    s.updated_ms
                ])
            })
            .map_err(|e| sql(&format!("inserting session {}", s.id()), e))?;
        Ok(())
    }

    fn insert_entry(
        conn: &Connection,
        session: &str,
        seq: u64,
        record: &Record,
    ) -> Result<(), BenchError> {
        let seq_i = to_i64(seq)?;
        conn.prepare_cached(INSERT_ENTRY)
            .and_then(|mut st| {
                st.execute(params![
                    session,
                    seq_i,
                    entry_id(seq),
                    seq.checked_sub(1).map(entry_id),
                    BASE_TIMESTAMP_MS + seq_i,
                    record.role.as_str(),
                    record.text
                ])
            })
            .map_err(|e| sql(&format!("inserting entry {seq} of session {session}"), e))?;
        Ok(())
    }

    fn tail(conn: &Connection, session: &str, budget: usize) -> Result<ContextSummary, BenchError> {
        let mut st = conn
            .prepare_cached(TAIL)
            .map_err(|e| sql("preparing the tail query", e))?;
        let mut rows = st
            .query(params![session])
            .map_err(|e| sql(&format!("querying the tail of {session}"), e))?;
        let mut ctx: Vec<(i64, String, String)> = Vec::new();
        let mut bytes = 0usize;
        while let Some(row) = rows
            .next()
            .map_err(|e| sql(&format!("reading the tail of {session}"), e))?
        {
            let text: String = row.get(2).map_err(|e| sql("reading text", e))?;
            if bytes + text.len() > budget {
                break;
            }
            bytes += text.len();
            let seq: i64 = row.get(0).map_err(|e| sql("reading seq", e))?;
            let role: String = row.get(1).map_err(|e| sql("reading role", e))?;
            ctx.push((seq, role, text));
        }
        // A model context is oldest first.
        ctx.reverse();
        Ok(context(ctx.len() as u64, bytes as u64))
    }
}

fn to_i64(v: u64) -> Result<i64, BenchError> {
    i64::try_from(v).map_err(|_| BenchError::Subject {
        subject: NAME.into(),
        message: format!("sequence number {v} does not fit SQLite's INTEGER"),
    })
}

impl SubjectStore for SqliteStore {
    fn subject(&self) -> &str {
        NAME
    }

    fn create_session(&self, writer: usize, session: &SessionSpec) -> Result<(), BenchError> {
        let conn = self.conn(writer)?;
        self.in_transaction(&conn, "creating a session", |c| {
            Self::insert_session(c, session)
        })
    }

    fn append(
        &self,
        writer: usize,
        session: &SessionSpec,
        seq: u64,
        record: &Record,
    ) -> Result<u64, BenchError> {
        let conn = self.conn(writer)?;
        let id = session.id();
        self.in_transaction(&conn, "an append", |c| {
            Self::insert_entry(c, &id, seq, record)
        })?;
        Ok(record.bytes() as u64)
    }

    fn load(&self, sessions: &[SessionData<'_>]) -> Result<(), BenchError> {
        let conn = self.conn(0)?;
        self.in_transaction(&conn, "loading sessions", |c| {
            for s in sessions {
                Self::insert_session(c, s.spec)?;
                let id = s.spec.id();
                for (seq, r) in s.records.iter().enumerate() {
                    Self::insert_entry(c, &id, seq as u64, r)?;
                }
            }
            Ok(())
        })
    }

    fn open_context(
        &self,
        session: &SessionSpec,
        budget: usize,
    ) -> Result<ContextSummary, BenchError> {
        let conn = self.conn(0)?;
        Self::tail(&conn, &session.id(), budget)
    }

    fn read_branch(
        &self,
        session: &SessionSpec,
        page_budget: usize,
    ) -> Result<PageSummary, BenchError> {
        let conn = self.conn(0)?;
        let id = session.id();
        let mut st = conn
            .prepare_cached(PAGE)
            .map_err(|e| sql("preparing the page query", e))?;
        let mut summary = PageSummary::default();
        let mut after: i64 = -1;
        loop {
            let mut rows = st
                .query(params![id, after])
                .map_err(|e| sql(&format!("querying a page of {id} after {after}"), e))?;
            let mut page: Vec<(i64, String, String)> = Vec::new();
            let mut bytes = 0usize;
            while let Some(row) = rows
                .next()
                .map_err(|e| sql(&format!("reading a page of {id}"), e))?
            {
                let text: String = row.get(2).map_err(|e| sql("reading text", e))?;
                if !page.is_empty() && bytes + text.len() > page_budget {
                    break;
                }
                bytes += text.len();
                let seq: i64 = row.get(0).map_err(|e| sql("reading seq", e))?;
                let role: String = row.get(1).map_err(|e| sql("reading role", e))?;
                page.push((seq, role, text));
            }
            let Some(last) = page.last() else { break };
            after = last.0;
            summary.pages += 1;
            summary.entries += page.len() as u64;
            summary.bytes += bytes as u64;
        }
        Ok(summary)
    }

    fn list_by_status(&self, status: Status) -> Result<u64, BenchError> {
        let conn = self.conn(0)?;
        let mut st = conn
            .prepare_cached(LIST)
            .map_err(|e| sql("preparing the list query", e))?;
        type Header = (String, Option<String>, String, String, i64, i64);
        let headers: Vec<Header> = st
            .query_map(params![status.as_str()], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                ))
            })
            .and_then(|rows| rows.collect())
            .map_err(|e| sql("listing sessions", e))?;
        Ok(headers.len() as u64)
    }

    fn fork_and_open(
        &self,
        source: &SessionSpec,
        at_seq: u64,
        fork: &SessionSpec,
        budget: usize,
    ) -> Result<ContextSummary, BenchError> {
        let conn = self.conn(0)?;
        let src = source.id();
        let dst = fork.id();
        let at = to_i64(at_seq)?;
        self.in_transaction(&conn, "a fork", |c| {
            let exists: Option<i64> = c
                .prepare_cached("SELECT 1 FROM entries WHERE session = ?1 AND seq = ?2")
                .and_then(|mut st| st.query_row(params![src, at], |r| r.get(0)).optional())
                .map_err(|e| sql("looking up the fork point", e))?;
            if exists.is_none() {
                return Err(BenchError::Subject {
                    subject: NAME.into(),
                    message: format!("session {src} has no entry {at_seq} to fork at"),
                });
            }
            Self::insert_session(c, fork)?;
            c.prepare_cached(FORK_ROWS)
                .and_then(|mut st| st.execute(params![dst, src, at]))
                .map_err(|e| sql(&format!("copying {src} into {dst}"), e))?;
            Ok(())
        })?;
        Self::tail(&conn, &dst, budget)
    }

    fn close(self: Box<Self>) -> Result<(), BenchError> {
        for m in self.conns {
            let conn = m.into_inner().map_err(|_| poisoned())?;
            conn.close()
                .map_err(|(_, e)| sql(&format!("closing {}", self.path.display()), e))?;
        }
        Ok(())
    }
}
