//! The PostgreSQL peer (key `postgres`), for `append-durable` and `open`:
//! what teams keep sessions in when they already operate a database
//! server.
//!
//! - One throwaway server per run ([`pg_server`], over `spool-pgserver`),
//!   its data directory on the scratch disk, configured for a durable run
//!   ([`SERVER_SETTINGS`](super::pg_server::SERVER_SETTINGS):
//!   `synchronous_commit=on`, `fsync=on`, `full_page_writes` and
//!   `wal_sync_method` at their defaults, `shared_buffers=256MB`). Started
//!   on first use, stopped (and removed) when the peer is dropped. Each
//!   store directory of the harness is one schema of that server.
//! - The synchronous `postgres` crate over the server's Unix socket; one
//!   connection per writer thread; statements prepared once per
//!   connection.
//! - Schema: `entries` with primary key `(session, seq)` (the tail query is
//!   an index range scan), `sessions` with the headers.
//! - Append: one transaction per commit — a single prepared `INSERT` in
//!   autocommit mode, acknowledged after its WAL flush (one round trip;
//!   an explicit `BEGIN`/`COMMIT` would only add two).
//! - Open: the tail query newest first in keyset batches of
//!   [`TAIL_FETCH_ROWS`] rows (`seq < last ORDER BY seq DESC LIMIT n`,
//!   each an index range scan) until the budget is reached: a client does
//!   not know how many rows fit, and a `LIMIT` lets the planner pick the
//!   backward index scan (an open-ended query or portal is planned for
//!   fetching every row).
//!
//! When the server cannot run (no binaries, no `postgres` user as root),
//! the peer is unavailable and the rows carry `null` with a note.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use postgres::{Client, NoTls, Statement};

use super::context;
use super::pg_server::{self, PgServer};
use crate::data::{entry_id, Record, BASE_TIMESTAMP_MS};
use crate::error::BenchError;
use crate::subject::{
    ContextSummary, Durability, SessionData, SessionSpec, SpoolSubject, SubjectStore,
};
use crate::workloads::Workload;

const NAME: &str = "postgres";

/// Rows fetched per round trip by the tail query's portal (a 64 KiB
/// context holds about 50 generated entries).
pub const TAIL_FETCH_ROWS: i64 = 64;

const SCHEMA: &str = "
CREATE TABLE sessions (
    id TEXT PRIMARY KEY,
    parent_id TEXT,
    status TEXT NOT NULL,
    agent TEXT NOT NULL,
    version BIGINT NOT NULL,
    updated_ms BIGINT NOT NULL
);
CREATE TABLE entries (
    session TEXT NOT NULL,
    seq BIGINT NOT NULL,
    id TEXT NOT NULL,
    parent_id TEXT,
    ts BIGINT NOT NULL,
    role TEXT NOT NULL,
    text TEXT NOT NULL,
    PRIMARY KEY (session, seq)
);
";

const INSERT_ENTRY: &str = "INSERT INTO entries (session, seq, id, parent_id, ts, role, text) \
                            VALUES ($1, $2, $3, $4, $5, $6, $7)";
const INSERT_SESSION: &str = "INSERT INTO sessions (id, parent_id, status, agent, version, \
                              updated_ms) VALUES ($1, $2, $3, $4, $5, $6)";
const TAIL: &str = "SELECT seq, role, text FROM entries WHERE session = $1 AND seq < $2 \
                    ORDER BY seq DESC LIMIT $3";

/// The PostgreSQL peer. See the module docs.
pub struct PostgresPeer {
    /// Where the server directory goes (the scratch root).
    parent: PathBuf,
    /// The server once started, or why it cannot run.
    server: Mutex<Option<Result<Arc<PgServer>, String>>>,
    /// The schema of each store directory (a store reopened on the same
    /// directory sees its data again; schemas go with the server).
    schemas: Mutex<HashMap<PathBuf, String>>,
}

impl std::fmt::Debug for PostgresPeer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresPeer")
            .field("parent", &self.parent)
            .finish_non_exhaustive()
    }
}

fn pg(context: &str, e: postgres::Error) -> BenchError {
    BenchError::Subject {
        subject: NAME.into(),
        message: format!("{context}: {e}"),
    }
}

fn poisoned() -> BenchError {
    BenchError::Subject {
        subject: NAME.into(),
        message: "a connection's lock was poisoned by a panicking thread".into(),
    }
}

impl PostgresPeer {
    /// A peer whose server will live in a new directory under `parent`.
    pub fn new(parent: &Path) -> Self {
        PostgresPeer {
            parent: parent.to_path_buf(),
            server: Mutex::new(None),
            schemas: Mutex::new(HashMap::new()),
        }
    }

    /// The running server (started on first call), or why there is none.
    pub fn server(&self) -> Result<Arc<PgServer>, String> {
        let mut s = self.server.lock().unwrap_or_else(|p| p.into_inner());
        s.get_or_insert_with(|| pg_server::start(&self.parent).map(Arc::new))
            .clone()
    }

    /// `Err(note)` when the peer cannot take part in this run.
    pub fn available(&self) -> Result<(), String> {
        self.server().map(|_| ())
    }
}

impl SpoolSubject for PostgresPeer {
    fn name(&self) -> &str {
        NAME
    }

    fn supports(&self, workload: Workload) -> bool {
        matches!(workload, Workload::AppendDurable | Workload::Open)
    }

    fn open_store(
        &self,
        dir: &Path,
        durability: Durability,
        writers: usize,
    ) -> Result<Box<dyn SubjectStore>, BenchError> {
        let server = self.server().map_err(|message| BenchError::Subject {
            subject: NAME.into(),
            message,
        })?;
        let (schema, fresh) = {
            let mut schemas = self.schemas.lock().unwrap_or_else(|p| p.into_inner());
            let n = schemas.len();
            match schemas.get(dir) {
                Some(s) => (s.clone(), false),
                None => {
                    let s = format!("bench{n}");
                    schemas.insert(dir.to_path_buf(), s.clone());
                    (s, true)
                }
            }
        };
        let base = server.socket_conn_str();
        if fresh {
            let mut admin = Client::connect(&base, NoTls).map_err(|e| pg("connecting", e))?;
            admin
                .batch_execute(&format!("CREATE SCHEMA {schema}"))
                .map_err(|e| pg("creating the schema", e))?;
        }
        let conn_str = format!("{base} options='-c search_path={schema}'");
        let mut conns = Vec::with_capacity(writers.max(1));
        for w in 0..writers.max(1) {
            let mut c = Client::connect(&conn_str, NoTls).map_err(|e| pg("connecting", e))?;
            if w == 0 && fresh {
                c.batch_execute(SCHEMA)
                    .map_err(|e| pg("creating the tables", e))?;
            }
            if durability == Durability::Buffered {
                c.batch_execute("SET synchronous_commit = off")
                    .map_err(|e| pg("setting synchronous_commit", e))?;
            }
            let insert_entry = c
                .prepare(INSERT_ENTRY)
                .map_err(|e| pg("preparing the insert", e))?;
            let insert_session = c
                .prepare(INSERT_SESSION)
                .map_err(|e| pg("preparing the session insert", e))?;
            let tail = c.prepare(TAIL).map_err(|e| pg("preparing the tail", e))?;
            conns.push(Mutex::new(Conn {
                client: c,
                insert_entry,
                insert_session,
                tail,
            }));
        }
        Ok(Box::new(PostgresStore {
            _server: server,
            conns,
        }))
    }
}

struct Conn {
    client: Client,
    insert_entry: Statement,
    insert_session: Statement,
    tail: Statement,
}

/// A store of the peer: one schema, one connection per writer (reads use
/// connection 0).
struct PostgresStore {
    /// Keeps the server up while the store is open.
    _server: Arc<PgServer>,
    conns: Vec<Mutex<Conn>>,
}

impl PostgresStore {
    fn conn(&self, writer: usize) -> Result<MutexGuard<'_, Conn>, BenchError> {
        self.conns
            .get(writer)
            .ok_or_else(|| BenchError::Subject {
                subject: NAME.into(),
                message: format!(
                    "writer {writer} out of range: the store has {} connections",
                    self.conns.len()
                ),
            })?
            .lock()
            .map_err(|_| poisoned())
    }
}

fn to_i64(v: u64) -> Result<i64, BenchError> {
    i64::try_from(v).map_err(|_| BenchError::Subject {
        subject: NAME.into(),
        message: format!("sequence number {v} does not fit BIGINT"),
    })
}

fn insert_entry(
    c: &mut impl postgres::GenericClient,
    st: &Statement,
    session: &str,
    seq: u64,
    record: &Record,
) -> Result<(), BenchError> {
    let seq_i = to_i64(seq)?;
    c.execute(
        st,
        &[
            &session,
            &seq_i,
            &entry_id(seq),
            &seq.checked_sub(1).map(entry_id),
            &(BASE_TIMESTAMP_MS + seq_i),
            &record.role.as_str(),
            &record.text,
        ],
    )
    .map_err(|e| pg(&format!("inserting entry {seq} of {session}"), e))?;
    Ok(())
}

fn insert_session(
    c: &mut impl postgres::GenericClient,
    st: &Statement,
    s: &SessionSpec,
) -> Result<(), BenchError> {
    c.execute(
        st,
        &[
            &s.id(),
            &s.parent.map(crate::subject::session_id),
            &s.status.as_str(),
            &s.agent(),
            &0i64,
            &s.updated_ms,
        ],
    )
    .map_err(|e| pg(&format!("inserting session {}", s.id()), e))?;
    Ok(())
}

impl SubjectStore for PostgresStore {
    fn subject(&self) -> &str {
        NAME
    }

    fn create_session(&self, writer: usize, session: &SessionSpec) -> Result<(), BenchError> {
        let mut c = self.conn(writer)?;
        let Conn {
            client,
            insert_session: st,
            ..
        } = &mut *c;
        insert_session(client, st, session)
    }

    fn append(
        &self,
        writer: usize,
        session: &SessionSpec,
        seq: u64,
        record: &Record,
    ) -> Result<u64, BenchError> {
        let mut c = self.conn(writer)?;
        let Conn {
            client,
            insert_entry: st,
            ..
        } = &mut *c;
        insert_entry(client, st, &session.id(), seq, record)?;
        Ok(record.bytes() as u64)
    }

    fn load(&self, sessions: &[SessionData<'_>]) -> Result<(), BenchError> {
        let mut c = self.conn(0)?;
        let Conn {
            client,
            insert_entry: ie,
            insert_session: is,
            ..
        } = &mut *c;
        let mut tx = client
            .transaction()
            .map_err(|e| pg("beginning the load", e))?;
        for s in sessions {
            insert_session(&mut tx, is, s.spec)?;
            let id = s.spec.id();
            for (seq, r) in s.records.iter().enumerate() {
                insert_entry(&mut tx, ie, &id, seq as u64, r)?;
            }
        }
        tx.commit().map_err(|e| pg("committing the load", e))?;
        // Fresh statistics, as after any bulk load.
        client
            .batch_execute("ANALYZE entries")
            .map_err(|e| pg("analyzing", e))
    }

    fn open_context(
        &self,
        session: &SessionSpec,
        budget: usize,
    ) -> Result<ContextSummary, BenchError> {
        let mut c = self.conn(0)?;
        let Conn { client, tail, .. } = &mut *c;
        let id = session.id();
        let mut ctx: Vec<(i64, String, String)> = Vec::new();
        let mut bytes = 0usize;
        let mut before = i64::MAX;
        'fetch: loop {
            let rows = client
                .query(&*tail, &[&id, &before, &TAIL_FETCH_ROWS])
                .map_err(|e| pg(&format!("fetching the tail of {id}"), e))?;
            let last_batch = rows.len() < TAIL_FETCH_ROWS as usize;
            for row in rows {
                let text: String = row.try_get(2).map_err(|e| pg("reading text", e))?;
                if bytes + text.len() > budget {
                    break 'fetch;
                }
                bytes += text.len();
                let seq: i64 = row.try_get(0).map_err(|e| pg("reading seq", e))?;
                let role: String = row.try_get(1).map_err(|e| pg("reading role", e))?;
                before = seq;
                ctx.push((seq, role, text));
            }
            if last_batch {
                break;
            }
        }
        // A model context is oldest first.
        ctx.reverse();
        Ok(context(ctx.len() as u64, bytes as u64))
    }

    /// Closes the connections; the data stays in the server (every commit
    /// was durable when acknowledged) until the server goes.
    fn close(self: Box<Self>) -> Result<(), BenchError> {
        for c in self.conns {
            let c = c.into_inner().map_err(|_| poisoned())?;
            c.client
                .close()
                .map_err(|e| pg("closing a connection", e))?;
        }
        Ok(())
    }
}
