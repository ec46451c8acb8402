//! The PostgreSQL store: sessions event-sourced in a database server, so
//! many processes on many machines can share them (cargo feature
//! `postgres`, off by default).
//!
//! It mirrors the [log store](super::log): every `create`/`save` is ONE
//! commit of the session's pending events under a version fence, and a
//! `load` folds the commits (from a snapshot when there is one).
//!
//! # Connecting and TLS
//!
//! [`PostgresStore::connect`] takes a `postgres://` URL or a `key=value`
//! string, as libpq does, including libpq's `sslmode` (`disable`,
//! `prefer` — the default —, `require`, `verify-ca`, `verify-full`) and
//! `sslrootcert=PATH` (or `system`):
//!
//! | `sslmode` | encrypts | checks the certificate chain | checks the host name |
//! | --- | --- | --- | --- |
//! | `disable` | no | – | – |
//! | `allow`, `prefer` (the default) | when the server offers TLS | no | no |
//! | `require` | yes | only when a root certificate file exists (as libpq) | no |
//! | `verify-ca` | yes | yes | no |
//! | `verify-full` | yes | yes | yes |
//!
//! `allow` (libpq: plain first, TLS if refused) is taken as `prefer`.
//! `sslrootcert=PATH` names a PEM file of trusted roots; without it the
//! verifying modes read `~/.postgresql/root.crt`, as libpq does, and fail
//! with an error naming the file when it is missing.
//! `sslrootcert=system` trusts the system's roots and, as in libpq,
//! implies `verify-full` and refuses any weaker mode. Under `prefer`, a
//! server that offers TLS but fails the handshake is an error (libpq would
//! retry in plain text). TLS is rustls with the ring provider.
//!
//! A certificate the mode refuses, or a server without TLS under a mode
//! that requires it, fails at once (no reconnect attempts) with
//! [`PostgresError::Tls`] naming the mode applied (`require` with a root
//! file shows as `verify-ca`).
//!
//! # From async code
//!
//! The store is blocking, like every [`SessionStore`]. In async code call
//! it through `tokio::task::spawn_blocking` (the store is `Send + Sync`;
//! share it in an `Arc`):
//!
//! ```no_run
//! # use std::sync::Arc;
//! # use spool_runtime::store::{PostgresStore, SessionStore};
//! # use spool_runtime::SessionId;
//! # async fn demo(url: &str, id: SessionId) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
//! let store: Arc<dyn SessionStore> = Arc::new(PostgresStore::connect(url)?);
//! let s = Arc::clone(&store);
//! let session = tokio::task::spawn_blocking(move || s.load(&id)).await??;
//! # Ok(()) }
//! ```
//!
//! Calling it directly from a task also works on both runtime flavours
//! (the client runs each request on a short-lived thread of its own
//! there, since it cannot block inside a runtime), but it holds up the
//! task's executor thread for the request, as any blocking call would.
//!
//! # Tables (schema version [`SCHEMA_VERSION`])
//!
//! | table | key | holds |
//! | --- | --- | --- |
//! | `spool_commits` | `(session_id, version)`, `commit_id` unique | one row per commit: its events' kinds (`text[]`) and [`encode_event`] bytes (`bytea[]`), its timestamp |
//! | `spool_sessions` | `id` | the header (status, parent, agent, label, version, times), indexed by status, parent, agent, created and updated time |
//! | `spool_snapshots` | `session_id` | the latest snapshot ([`encode_snapshot`]) with the version and commit id it folds up to |
//! | `spool_schema_version` | `version` | one row per applied migration |
//!
//! # Writes and version fences
//!
//! A save at expected version `v` runs one transaction: insert the commit
//! row `(id, v + 1)`, then `UPDATE spool_sessions ... WHERE version = v`.
//! The primary key of `spool_commits` is the fence: of two writers at the
//! same version the second fails with a unique violation (SQLSTATE 23505),
//! which is reported as [`StoreError::Conflict`] with the stored version
//! read afterwards — never as a backend error. The header update in the
//! same transaction can only move the head forward. Version fences are the
//! only coordination between processes; no lock is held between requests.
//!
//! # Idempotent retry
//!
//! Every commit carries a commit id (UUID, unique). When a write fails,
//! the store looks its commit id up before reporting a conflict: if the
//! commit landed (say the connection broke after the server committed but
//! before the reply arrived, and this is the retry), the original result
//! is returned. `save`/`create` retry on their own, with the same commit
//! id, when the connection breaks ([`PostgresOptions::reconnect_attempts`]);
//! [`PostgresStore::save_with_commit_id`] lets a caller carry a commit id
//! across its own retries. So a commit lands once or not at all.
//!
//! # Timestamps
//!
//! `updated_at_ms` (and a commit's `created_at_ms`) is the database
//! server's clock, never less than the previous value: with writers on
//! many machines one clock orders the commits, and the head's time never
//! moves backwards.
//!
//! # Snapshots
//!
//! Same policy as the log store: a `load` that replayed at least
//! [`SNAPSHOT_TAIL_COMMITS`] commits stores a snapshot (best effort). A
//! snapshot is only used when the commit it names (version and commit id)
//! is still in `spool_commits`, so a snapshot of a purged incarnation can
//! never be applied to a new session with the same id.
//!
//! # Settings fold
//!
//! [`TranscriptBackend::settings`] (the runtime's bounded execute pairs it
//! with the transcript index's working set) is [`PostgresStore::load_settings`]:
//! the non-transcript events of the commits folded in version order in one
//! REPEATABLE READ transaction, the server leaving the transcript events
//! out of each commit's payloads (`unnest ... WITH ORDINALITY`), read in
//! version ranges of [`LOAD_BATCH_COMMITS`] commits, so its memory follows
//! the settings, never the transcript. It is not a full load (`full_loads`
//! does not move). It does not start from a snapshot (those hold the
//! transcript) but from an in-process cache of the last folds, valid while
//! the commit a fold ends at is stored (the snapshots' rule).
//!
//! # Purge
//!
//! `delete` removes the session row; its commits and snapshot go with it
//! (`ON DELETE CASCADE`). The session then reads as absent and a later
//! `create` of the same id starts again at version 1. (A `delete` retried
//! after its reply was lost reports `false`: the first attempt removed it.)
//!
//! # Known limits
//!
//! - No client certificates (`sslcert`, `sslkey`), no `sslcrl`, and the
//!   `PGSSLMODE`-style environment variables are not read.
//! - A writer holding a session loaded before a purge and a re-create of
//!   the same id can land on the new incarnation if the versions line up
//!   (the session carries no incarnation tag) — as with the log store.
//! - `list_headers` counts `total` with a `count(*)` over the filter's
//!   index; the page itself costs what it returns.

mod exchange;
mod pool;
mod schema;
mod settings;
mod tls;
mod transcript;

use std::str::FromStr;
use std::time::Duration;

use postgres::error::SqlState;
use postgres::types::ToSql;
use postgres::{Client, Config, IsolationLevel, Row};
use uuid::Uuid;

use self::pool::{
    is_connection_error, is_retryable_transaction_error, is_transient_connect_error, off_runtime,
    Pool,
};
pub use self::schema::{SchemaError, SCHEMA_VERSION};
use self::settings::SettingsCache;
pub use self::tls::{SslMode, TlsConfigError};
pub use self::transcript::IndexFault;
use self::transcript::{PgTranscriptSource, TxIndex};
use super::log::SNAPSHOT_TAIL_COMMITS;
use super::{
    ListOrder, ListQuery, LoadCounter, SessionStore, SortDirection, StoreError, StoreStats,
    MAX_PAGE_LIMIT,
};
use crate::session::{
    decode_event, decode_snapshot, encode_event, encode_snapshot, AgentSession, AgentSessionInfo,
    SessionEvent, SessionId, SessionInfoList, SessionStatus, SkippedSession,
};
use crate::store::backend::{AppendReceipt, BoxedSource, TranscriptBackend, TranscriptHead};

/// Commits read per query while loading.
pub const LOAD_BATCH_COMMITS: i64 = 256;
/// How often a transaction that lost a serialization race or a deadlock is
/// run again before the error is reported.
pub const TRANSACTION_RETRIES_MAX: u32 = 8;
/// How often a create whose conflicting session vanished before its
/// version could be read is tried again.
const CREATE_RACE_RETRIES: u32 = 3;

/// The database server's clock in milliseconds since the Unix epoch.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Options of a [`PostgresStore`].
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct PostgresOptions {
    /// Idle connections kept for reuse (more are opened under load and
    /// closed when they come back).
    pub pool_idle_max: usize,
    /// How often one request reconnects and runs again after the
    /// connection broke (0: report the first failure).
    pub reconnect_attempts: u32,
    /// Pause between reconnect attempts (the first one is immediate).
    pub reconnect_delay: Duration,
    /// Connect timeout used when the connection string sets none.
    pub connect_timeout: Duration,
}

impl Default for PostgresOptions {
    fn default() -> Self {
        PostgresOptions {
            pool_idle_max: 8,
            // 40 attempts 250 ms apart ride out a server restart of ~10 s.
            reconnect_attempts: 40,
            reconnect_delay: Duration::from_millis(250),
            connect_timeout: Duration::from_secs(10),
        }
    }
}

impl PostgresOptions {
    pub fn pool_idle_max(mut self, n: usize) -> Self {
        self.pool_idle_max = n;
        self
    }
    pub fn reconnect_attempts(mut self, n: u32) -> Self {
        self.reconnect_attempts = n;
        self
    }
    pub fn reconnect_delay(mut self, d: Duration) -> Self {
        self.reconnect_delay = d;
        self
    }
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d;
        self
    }
}

/// A PostgreSQL store fault, carried in [`StoreError::Backend`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PostgresError {
    /// The connection string does not parse. The reason names the
    /// parameter, never its value, so a password is not echoed.
    #[error("invalid PostgreSQL connection string: {reason}")]
    Config { reason: String },
    /// The connection string's `sslmode`/`sslrootcert` cannot be used.
    #[error("invalid PostgreSQL TLS settings")]
    TlsSettings(#[source] TlsConfigError),
    /// TLS refused the server (its certificate under a verifying
    /// `sslmode`, or the handshake), or the server has no TLS and the mode
    /// requires it.
    #[error("postgres {op} ({target}): no TLS connection under sslmode={mode}")]
    Tls {
        op: &'static str,
        target: String,
        mode: SslMode,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error("postgres {op} ({target})")]
    Request {
        op: &'static str,
        target: String,
        #[source]
        source: postgres::Error,
    },
    /// The thread a request from inside a tokio runtime runs on could not
    /// be started.
    #[error("postgres {op} ({target}): starting the client's thread")]
    Thread {
        op: &'static str,
        target: String,
        #[source]
        source: std::io::Error,
    },
    #[error("postgres schema: {0}")]
    Schema(#[from] SchemaError),
}

/// The client's reason a connection string does not parse, without any
/// character of the string itself (its "expected `=` but got `x`" could
/// show a character of a password).
fn config_reason(e: &postgres::Error) -> String {
    // The client's own message is generic; the detail is its source.
    let mut reason = String::new();
    let mut cur: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(e);
    while let Some(s) = cur {
        if !reason.is_empty() {
            reason.push_str(": ");
        }
        reason.push_str(&s.to_string());
        cur = s.source();
    }
    if reason.is_empty() {
        reason = e.to_string();
    }
    if let Some(at) = reason.find(" but got `") {
        reason.truncate(at);
    }
    reason
}

fn backend(e: PostgresError) -> StoreError {
    StoreError::Backend(Box::new(e))
}

/// One landed commit, as recorded in `spool_commits`.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct CommitInfo {
    pub session_id: SessionId,
    /// The session version this commit produced.
    pub version: u64,
    pub commit_id: Uuid,
    /// Server time of the commit (the session's `updated_at_ms` after it).
    pub created_at_ms: i64,
    /// Event kinds in the commit, in order.
    pub kinds: Vec<String>,
}

/// Why a request closure stopped: a client error (classified by the retry
/// loop) or a store-level outcome to report as is.
enum Fail {
    Pg(postgres::Error),
    Store(StoreError),
}

impl From<postgres::Error> for Fail {
    fn from(e: postgres::Error) -> Self {
        Fail::Pg(e)
    }
}

/// Where a write landed.
#[derive(Clone, Copy, Debug)]
struct Landed {
    version: u64,
    updated_at_ms: i64,
    /// The transcript version the commit wrote; `None` when unknown (a
    /// commit found landed after a broken connection) or unchanged.
    transcript: Option<crate::transcript::TranscriptVersion>,
}

fn is_unique_violation(e: &postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

fn version_to_sql(id: &SessionId, v: u64) -> Result<i64, StoreError> {
    i64::try_from(v).map_err(|_| StoreError::InvalidSession {
        id: id.clone(),
        reason: format!("version {v} exceeds the PostgreSQL bigint range"),
    })
}

fn version_from_sql(id: &SessionId, v: i64, what: &str) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt {
        id: id.clone(),
        reason: format!("{what}: negative version {v}"),
    })
}

fn header_from_row(row: &Row) -> Result<AgentSessionInfo, String> {
    let get_err = |e: postgres::Error| e.to_string();
    let id: String = row.try_get("id").map_err(get_err)?;
    let parent: Option<String> = row.try_get("parent_id").map_err(get_err)?;
    let status: String = row.try_get("status").map_err(get_err)?;
    let version: i64 = row.try_get("version").map_err(get_err)?;
    Ok(AgentSessionInfo {
        id: SessionId::parse(&id).map_err(|e| e.to_string())?,
        parent_id: parent
            .map(|p| SessionId::parse(&p))
            .transpose()
            .map_err(|e| e.to_string())?,
        status: SessionStatus::from_str(&status).map_err(|e| e.to_string())?,
        version: u64::try_from(version).map_err(|_| format!("negative version {version}"))?,
        agent_name: row.try_get("agent_name").map_err(get_err)?,
        label: row.try_get("label").map_err(get_err)?,
        created_at_ms: row.try_get("created_at_ms").map_err(get_err)?,
        updated_at_ms: row.try_get("updated_at_ms").map_err(get_err)?,
    })
}

const HEADER_COLUMNS: &str =
    "id, parent_id, status, version, agent_name, label, created_at_ms, updated_at_ms";

/// The event batch of one commit: kinds and [`encode_event`] bytes. An
/// empty pending list commits a `Touched` event, as every store does.
fn encode_batch(session: &AgentSession) -> Result<(Vec<String>, Vec<Vec<u8>>), StoreError> {
    let touched = [SessionEvent::Touched];
    let events: &[SessionEvent] = if session.pending_events().is_empty() {
        &touched
    } else {
        session.pending_events()
    };
    let mut kinds = Vec::with_capacity(events.len());
    let mut payloads = Vec::with_capacity(events.len());
    for ev in events {
        payloads.push(encode_event(ev).map_err(|source| StoreError::Encoding {
            context: format!("event {} of session {}", ev.kind(), session.id()),
            source,
        })?);
        kinds.push(ev.kind().to_string());
    }
    Ok((kinds, payloads))
}

/// What a load read inside its transaction.
struct Loaded {
    session: AgentSession,
    replayed: u64,
    last_commit: Uuid,
    version: u64,
}

/// Sessions event-sourced in PostgreSQL. See the module docs.
pub struct PostgresStore {
    pool: Pool,
    /// Where the store lives (hosts, ports, database, user, options): the
    /// key of the handles' writer registry.
    identity: String,
    opts: PostgresOptions,
    loads: LoadCounter,
    /// The last settings folds (see `settings`).
    settings: SettingsCache,
}

impl std::fmt::Debug for PostgresStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresStore")
            .field("opts", &self.opts)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects with default options (see [`PostgresStore::connect_with`]).
    pub fn connect(conn_str: &str) -> Result<PostgresStore, StoreError> {
        Self::connect_with(conn_str, PostgresOptions::default())
    }

    /// Connects to the database named by `conn_str` (a `postgres://` URL or
    /// a `key=value` string, as libpq takes them, with libpq's `sslmode`
    /// and `sslrootcert`: see the module docs) and brings its schema to
    /// [`SCHEMA_VERSION`].
    pub fn connect_with(
        conn_str: &str,
        opts: PostgresOptions,
    ) -> Result<PostgresStore, StoreError> {
        let (rest, tls_params) = tls::split_params(conn_str);
        let tls = tls::setup(&tls_params).map_err(|e| backend(PostgresError::TlsSettings(e)))?;
        let mut config = Config::from_str(&rest).map_err(|e| {
            backend(PostgresError::Config {
                reason: config_reason(&e),
            })
        })?;
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(opts.connect_timeout);
        }
        let identity = format!(
            "postgres:{:?}:{:?}:{:?}:{:?}:{:?}",
            config.get_hosts(),
            config.get_ports(),
            config.get_dbname(),
            config.get_user(),
            config.get_options()
        );
        let store = PostgresStore {
            identity,
            pool: Pool::new(config, tls, opts.pool_idle_max),
            opts,
            loads: LoadCounter::default(),
            settings: SettingsCache::default(),
        };
        store.run("migrate", "schema", |client| {
            schema::migrate(client).map_err(|e| match e {
                // A connection lost mid-migration is retried like any
                // request; the transaction rolled back.
                SchemaError::Read(pe) | SchemaError::Migration { source: pe, .. }
                    if is_connection_error(&pe) =>
                {
                    Fail::Pg(pe)
                }
                other => Fail::Store(backend(PostgresError::Schema(other))),
            })
        })?;
        Ok(store)
    }

    /// The schema version recorded in the database.
    pub fn schema_version(&self) -> Result<i32, StoreError> {
        self.run("schema_version", "schema", |client| {
            let row = client.query_one(
                "SELECT coalesce(max(version), 0) FROM spool_schema_version",
                &[],
            )?;
            Ok(row.try_get(0)?)
        })
    }

    /// Runs `f` with a pooled connection. Connection-level failures
    /// reconnect and run `f` again (up to `reconnect_attempts` times), lost
    /// serialization races and deadlocks run it again; so `f` must be safe
    /// to repeat — every write carries a fixed commit id for that.
    ///
    /// Inside a tokio runtime this runs on a thread of its own
    /// ([`off_runtime`]).
    fn run<T: Send>(
        &self,
        op: &'static str,
        target: &str,
        f: impl FnMut(&mut Client) -> Result<T, Fail> + Send,
    ) -> Result<T, StoreError> {
        off_runtime(|| self.run_here(op, target, f)).unwrap_or_else(|source| {
            Err(backend(PostgresError::Thread {
                op,
                target: target.to_string(),
                source,
            }))
        })
    }

    /// [`PostgresStore::run`] on this thread.
    fn run_here<T>(
        &self,
        op: &'static str,
        target: &str,
        mut f: impl FnMut(&mut Client) -> Result<T, Fail>,
    ) -> Result<T, StoreError> {
        let mut reconnects = 0u32;
        let mut tx_retries = 0u32;
        let fail = |source| {
            backend(PostgresError::Request {
                op,
                target: target.to_string(),
                source,
            })
        };
        loop {
            let mut client = match self.pool.get() {
                Ok(c) => c,
                Err(e) => {
                    if is_transient_connect_error(&e) && reconnects < self.opts.reconnect_attempts {
                        reconnects += 1;
                        std::thread::sleep(self.opts.reconnect_delay);
                        continue;
                    }
                    return Err(self.connect_fail(op, target, e));
                }
            };
            match f(&mut client) {
                Ok(v) => {
                    self.pool.put(client);
                    return Ok(v);
                }
                Err(Fail::Store(e)) => {
                    self.pool.put(client);
                    return Err(e);
                }
                Err(Fail::Pg(e)) if is_connection_error(&e) => {
                    drop(client);
                    // The server went away: the other idle connections
                    // are most likely dead too.
                    self.pool.clear();
                    if reconnects < self.opts.reconnect_attempts {
                        if reconnects > 0 {
                            std::thread::sleep(self.opts.reconnect_delay);
                        }
                        reconnects += 1;
                        continue;
                    }
                    return Err(fail(e));
                }
                Err(Fail::Pg(e)) => {
                    self.pool.put(client);
                    if is_retryable_transaction_error(&e) && tx_retries < TRANSACTION_RETRIES_MAX {
                        tx_retries += 1;
                        continue;
                    }
                    return Err(fail(e));
                }
            }
        }
    }

    /// The error of a connection attempt that is given up on: TLS
    /// failures apart, with the mode they happened under.
    fn connect_fail(&self, op: &'static str, target: &str, e: postgres::Error) -> StoreError {
        let tls = |source: Box<dyn std::error::Error + Send + Sync>| {
            backend(PostgresError::Tls {
                op,
                target: target.to_string(),
                mode: self.pool.tls_mode(),
                source,
            })
        };
        if let Some(r) = tls::rejection(&e) {
            return tls(Box::new(r.clone()));
        }
        if pool::is_tls_unsupported(&e) {
            return tls("the server does not support TLS".into());
        }
        backend(PostgresError::Request {
            op,
            target: target.to_string(),
            source: e,
        })
    }

    /// After a failed write: the original result when commit `commit_id`
    /// landed (a retry), else the stored version of `id` (`None`: absent).
    fn resolve_failed_write(
        client: &mut Client,
        id: &SessionId,
        commit_id: Uuid,
    ) -> Result<Result<Landed, Option<u64>>, Fail> {
        if let Some(row) = client.query_opt(
            "SELECT session_id, version, created_at_ms FROM spool_commits WHERE commit_id = $1",
            &[&commit_id],
        )? {
            let owner: String = row.try_get(0)?;
            if owner != id.as_str() {
                return Err(Fail::Store(StoreError::InvalidSession {
                    id: id.clone(),
                    reason: format!("commit id {commit_id} was already used by session {owner}"),
                }));
            }
            let version = version_from_sql(id, row.try_get(1)?, "commit").map_err(Fail::Store)?;
            return Ok(Ok(Landed {
                version,
                updated_at_ms: row.try_get(2)?,
                transcript: None,
            }));
        }
        let stored = client.query_opt(
            "SELECT version FROM spool_sessions WHERE id = $1",
            &[&id.as_str()],
        )?;
        match stored {
            None => Ok(Err(None)),
            Some(row) => {
                let v = version_from_sql(id, row.try_get(0)?, "header").map_err(Fail::Store)?;
                Ok(Err(Some(v)))
            }
        }
    }

    /// [`SessionStore::create`] with a caller-chosen commit id: retrying
    /// with the same id after an unknown outcome returns the original
    /// result if the first attempt landed.
    pub fn create_with_commit_id(
        &self,
        session: AgentSession,
        commit_id: Uuid,
    ) -> Result<AgentSession, StoreError> {
        let id = session.id().clone();
        if session.version() != 0 {
            return Err(StoreError::InvalidSession {
                id,
                reason: format!("create needs version 0, got {}", session.version()),
            });
        }
        let (kinds, payloads) = encode_batch(&session)?;
        let info = session.info();
        let parent = info.parent_id.as_ref().map(|p| p.as_str());
        let status = info.status.as_str();
        let landed = self.run("create", &format!("session {id}"), |client| {
            for _ in 0..CREATE_RACE_RETRIES {
                let mut tx = client.transaction()?;
                let inserted = tx.query_one(
                    &format!(
                        "INSERT INTO spool_sessions ({HEADER_COLUMNS})
                         VALUES ($1, $2, $3, 1, $4, $5, $6, GREATEST($6, {NOW_MS}))
                         RETURNING updated_at_ms"
                    ),
                    &[
                        &id.as_str(),
                        &parent,
                        &status,
                        &info.agent_name,
                        &info.label,
                        &info.created_at_ms,
                    ],
                );
                let stamp: i64 = match inserted {
                    Ok(row) => row.try_get(0)?,
                    Err(e) if is_unique_violation(&e) => {
                        drop(tx);
                        match Self::resolve_failed_write(client, &id, commit_id)? {
                            Ok(landed) => return Ok(landed),
                            Err(Some(actual)) => {
                                return Err(Fail::Store(StoreError::Conflict {
                                    id: id.clone(),
                                    expected: 0,
                                    actual,
                                }))
                            }
                            // Deleted in between: try again.
                            Err(None) => continue,
                        }
                    }
                    Err(e) => return Err(e.into()),
                };
                let commit = tx.execute(
                    "INSERT INTO spool_commits
                         (session_id, version, commit_id, created_at_ms, kinds, payloads)
                     VALUES ($1, 1, $2, $3, $4, $5)",
                    &[&id.as_str(), &commit_id, &stamp, &kinds, &payloads],
                );
                match commit {
                    Ok(_) => {}
                    Err(e) if is_unique_violation(&e) => {
                        drop(tx);
                        // Only the commit id can collide here.
                        return match Self::resolve_failed_write(client, &id, commit_id)? {
                            Ok(landed) => Ok(landed),
                            Err(_) => Err(Fail::Store(StoreError::InvalidSession {
                                id: id.clone(),
                                reason: format!("commit id {commit_id} is already used"),
                            })),
                        };
                    }
                    Err(e) => return Err(e.into()),
                }
                // The transcript index, in the commit's transaction.
                let transcript = TxIndex::new(&mut tx, id.as_str())
                    .apply(session.pending_events(), Some(&payloads), stamp)
                    .map_err(|e| e.into_fail(&id))?;
                tx.commit()?;
                return Ok(Landed {
                    version: 1,
                    updated_at_ms: stamp,
                    transcript,
                });
            }
            Err(Fail::Store(StoreError::Conflict {
                id: id.clone(),
                expected: 0,
                actual: 0,
            }))
        })?;
        Ok(session.reconstitute(landed.version, landed.updated_at_ms))
    }

    /// [`SessionStore::save`] with a caller-chosen commit id: retrying with
    /// the same id after an unknown outcome (a broken connection, a server
    /// restart) returns the original result if the first attempt landed,
    /// and never lands the commit twice.
    pub fn save_with_commit_id(
        &self,
        session: AgentSession,
        commit_id: Uuid,
    ) -> Result<AgentSession, StoreError> {
        let (kinds, payloads) = encode_batch(&session)?;
        let info = session.info();
        let parent = info.parent_id.as_ref().map(|p| p.as_str());
        let landed = self.commit_events(
            "save",
            session.id(),
            session.version(),
            commit_id,
            &kinds,
            &payloads,
            session.pending_events(),
            Some((info.status.as_str(), parent)),
        )?;
        Ok(session.reconstitute(landed.version, landed.updated_at_ms))
    }

    /// Commits one batch of events to `id` at `expected` (the version
    /// fence), maintaining the transcript index in the same transaction.
    /// `events` are the decoded events behind `payloads` (empty when the
    /// batch is the implicit `Touched`); `header` is the status and parent
    /// to store with the new version (`None`: unchanged).
    #[allow(clippy::too_many_arguments)]
    fn commit_events(
        &self,
        op: &'static str,
        id: &SessionId,
        expected: u64,
        commit_id: Uuid,
        kinds: &[String],
        payloads: &[Vec<u8>],
        events: &[SessionEvent],
        header: Option<(&str, Option<&str>)>,
    ) -> Result<Landed, StoreError> {
        debug_assert!(events.is_empty() || events.len() == payloads.len());
        let expected_sql = version_to_sql(id, expected)?;
        let next = version_to_sql(id, expected.saturating_add(1))?;
        let failed = |client: &mut Client| -> Result<Landed, Fail> {
            match Self::resolve_failed_write(client, id, commit_id)? {
                Ok(landed) => Ok(landed),
                Err(None) => Err(Fail::Store(StoreError::NotFound { id: id.clone() })),
                Err(Some(actual)) => Err(Fail::Store(StoreError::Conflict {
                    id: id.clone(),
                    expected,
                    actual,
                })),
            }
        };
        self.run(op, &format!("session {id}"), |client| {
            let mut tx = client.transaction()?;
            // The commit row first: its primary key is the version fence.
            let inserted = tx.query_opt(
                &format!(
                    "INSERT INTO spool_commits
                         (session_id, version, commit_id, created_at_ms, kinds, payloads)
                     SELECT s.id, $2, $3, GREATEST(s.updated_at_ms, {NOW_MS}), $4, $5
                     FROM spool_sessions s WHERE s.id = $1
                     RETURNING created_at_ms"
                ),
                &[&id.as_str(), &next, &commit_id, &kinds, &payloads],
            );
            let stamp: i64 = match inserted {
                Ok(Some(row)) => row.try_get(0)?,
                // No such session.
                Ok(None) => {
                    drop(tx);
                    return failed(client);
                }
                Err(e) if is_unique_violation(&e) => {
                    drop(tx);
                    return failed(client);
                }
                Err(e) => return Err(e.into()),
            };
            let moved = match header {
                Some((status, parent)) => tx.execute(
                    "UPDATE spool_sessions
                     SET version = $2, status = $3, parent_id = $4, updated_at_ms = $5
                     WHERE id = $1 AND version = $6",
                    &[&id.as_str(), &next, &status, &parent, &stamp, &expected_sql],
                )?,
                None => tx.execute(
                    "UPDATE spool_sessions SET version = $2, updated_at_ms = $3
                     WHERE id = $1 AND version = $4",
                    &[&id.as_str(), &next, &stamp, &expected_sql],
                )?,
            };
            if moved != 1 {
                drop(tx);
                return failed(client);
            }
            // The transcript index, in the commit's transaction: never
            // ahead of or behind the commits.
            let transcript = TxIndex::new(&mut tx, id.as_str())
                .apply(events, Some(payloads), stamp)
                .map_err(|e| e.into_fail(id))?;
            tx.commit()?;
            Ok(Landed {
                version: expected + 1,
                updated_at_ms: stamp,
                transcript,
            })
        })
    }

    /// The commit with id `commit_id`, if it landed (and was not purged).
    pub fn commit(&self, commit_id: Uuid) -> Result<Option<CommitInfo>, StoreError> {
        self.run("commit", &format!("commit {commit_id}"), |client| {
            let row = client.query_opt(
                "SELECT session_id, version, commit_id, created_at_ms, kinds
                 FROM spool_commits WHERE commit_id = $1",
                &[&commit_id],
            )?;
            row.as_ref().map(commit_from_row).transpose()
        })
    }

    /// Every commit of session `id` in version order, without the events.
    pub fn commits(&self, id: &SessionId) -> Result<Vec<CommitInfo>, StoreError> {
        self.run("commits", &format!("session {id}"), |client| {
            client
                .query(
                    "SELECT session_id, version, commit_id, created_at_ms, kinds
                     FROM spool_commits WHERE session_id = $1 ORDER BY version",
                    &[&id.as_str()],
                )?
                .iter()
                .map(commit_from_row)
                .collect()
        })
    }

    /// Loads the session as of version `upto` (inclusive), or its head when
    /// `None`. Only a head load may store a snapshot.
    pub fn load_at(
        &self,
        id: &SessionId,
        upto: Option<u64>,
    ) -> Result<Option<AgentSession>, StoreError> {
        let upto_sql = upto.map(|v| i64::try_from(v).unwrap_or(i64::MAX));
        let loaded = self.run("load", &format!("session {id}"), |client| {
            Self::load_in_transaction(client, id, upto_sql)
        })?;
        let Some(loaded) = loaded else {
            return Ok(None);
        };
        self.loads.bump();
        if upto.is_none() && loaded.replayed >= SNAPSHOT_TAIL_COMMITS {
            self.write_snapshot(&loaded);
        }
        Ok(Some(loaded.session))
    }

    fn load_in_transaction(
        client: &mut Client,
        id: &SessionId,
        upto: Option<i64>,
    ) -> Result<Option<Loaded>, Fail> {
        let sid = id.as_str();
        // One consistent view of header, snapshot and commits.
        let mut tx = client
            .build_transaction()
            .isolation_level(IsolationLevel::RepeatableRead)
            .read_only(true)
            .start()?;
        let Some(head) =
            tx.query_opt("SELECT version FROM spool_sessions WHERE id = $1", &[&sid])?
        else {
            return Ok(None);
        };
        let head: i64 = head.try_get(0)?;
        let target = upto.map_or(head, |u| u.min(head));
        if target < 1 {
            return Ok(None);
        }
        // A snapshot counts only if the commit it names is still there.
        let snapshot = tx.query_opt(
            "SELECT s.version, s.updated_at_ms, s.bytes, s.commit_id
             FROM spool_snapshots s
             JOIN spool_commits c ON c.session_id = s.session_id
                  AND c.version = s.version AND c.commit_id = s.commit_id
             WHERE s.session_id = $1 AND s.version <= $2",
            &[&sid, &target],
        )?;
        let snapshot = snapshot.and_then(|row| {
            let version: i64 = row.try_get(0).ok()?;
            let updated: i64 = row.try_get(1).ok()?;
            let bytes: &[u8] = row.try_get(2).ok()?;
            let commit: Uuid = row.try_get(3).ok()?;
            let session = decode_snapshot(bytes).ok()?;
            (session.id() == id && version >= 1).then_some((version, updated, session, commit))
        });
        let (mut session, mut version, mut updated, mut last_commit) = match snapshot {
            Some((v, u, s, c)) => (Some(s), v, u, c),
            None => (None, 0i64, 0i64, Uuid::nil()),
        };
        let mut replayed = 0u64;
        while version < target {
            let rows = tx.query(
                "SELECT version, created_at_ms, commit_id, payloads FROM spool_commits
                 WHERE session_id = $1 AND version > $2 AND version <= $3
                 ORDER BY version LIMIT $4",
                &[&sid, &version, &target, &LOAD_BATCH_COMMITS],
            )?;
            if rows.is_empty() {
                break;
            }
            for row in &rows {
                let v: i64 = row.try_get(0)?;
                if v != version + 1 {
                    return Err(Fail::Store(StoreError::Corrupt {
                        id: id.clone(),
                        reason: format!("commit {} is missing (next stored is {v})", version + 1),
                    }));
                }
                let payloads: Vec<&[u8]> = row.try_get(3)?;
                let mut events = Vec::with_capacity(payloads.len());
                for (i, p) in payloads.iter().enumerate() {
                    events.push(decode_event(p).map_err(|source| {
                        Fail::Store(StoreError::Encoding {
                            context: format!("session {id}, version {v}, event {i}"),
                            source,
                        })
                    })?);
                }
                let folded = match session.take() {
                    Some(s) => s.replay_onto(events.iter()),
                    None => AgentSession::replay(events.iter()),
                };
                session = Some(folded.map_err(|e| {
                    Fail::Store(StoreError::Corrupt {
                        id: id.clone(),
                        reason: format!("version {v}: {e}"),
                    })
                })?);
                version = v;
                updated = row.try_get(1)?;
                last_commit = row.try_get(2)?;
                replayed += 1;
            }
        }
        tx.commit()?;
        let session = match session {
            Some(s) if version == target => s,
            _ => {
                return Err(Fail::Store(StoreError::Corrupt {
                    id: id.clone(),
                    reason: format!("commits end at version {version}, the header says {target}"),
                }))
            }
        };
        let version = version_from_sql(id, version, "commit").map_err(Fail::Store)?;
        Ok(Some(Loaded {
            session: session.reconstitute(version, updated),
            replayed,
            last_commit,
            version,
        }))
    }

    /// Stores a snapshot of a loaded head. A snapshot is a cache entry:
    /// failing to write one costs only time, so errors are dropped.
    fn write_snapshot(&self, loaded: &Loaded) {
        // Best effort here too: no thread, no snapshot.
        let _ = off_runtime(|| self.write_snapshot_here(loaded));
    }

    fn write_snapshot_here(&self, loaded: &Loaded) {
        let Ok(bytes) = encode_snapshot(&loaded.session) else {
            return;
        };
        let Ok(version) = i64::try_from(loaded.version) else {
            return;
        };
        let id = loaded.session.id().as_str();
        let updated = loaded.session.info().updated_at_ms;
        let Ok(mut client) = self.pool.get() else {
            return;
        };
        // Replace an older snapshot, or one whose commit is gone (a purged
        // incarnation's, written by a load that raced the purge).
        let written = client.execute(
            "INSERT INTO spool_snapshots (session_id, version, commit_id, updated_at_ms, bytes)
             VALUES ($1, $2, $3, $4, $5)
             ON CONFLICT (session_id) DO UPDATE
             SET version = EXCLUDED.version, commit_id = EXCLUDED.commit_id,
                 updated_at_ms = EXCLUDED.updated_at_ms, bytes = EXCLUDED.bytes
             WHERE spool_snapshots.version < EXCLUDED.version
                OR NOT EXISTS (SELECT 1 FROM spool_commits c
                               WHERE c.session_id = spool_snapshots.session_id
                                 AND c.version = spool_snapshots.version
                                 AND c.commit_id = spool_snapshots.commit_id)",
            &[&id, &version, &loaded.last_commit, &updated, &bytes],
        );
        match written {
            Err(e) if is_connection_error(&e) => drop(client),
            _ => self.pool.put(client),
        }
    }

    /// Closes the idle connections. Connections in use close when their
    /// request ends and the store is dropped.
    pub fn close(&self) {
        self.pool.clear();
    }
}

fn commit_from_row(row: &Row) -> Result<CommitInfo, Fail> {
    let sid: String = row.try_get(0)?;
    let id = SessionId::parse(&sid).map_err(|e| Fail::Store(StoreError::InvalidId(e)))?;
    let version = version_from_sql(&id, row.try_get(1)?, "commit").map_err(Fail::Store)?;
    Ok(CommitInfo {
        session_id: id,
        version,
        commit_id: row.try_get(2)?,
        created_at_ms: row.try_get(3)?,
        kinds: row.try_get(4)?,
    })
}

/// The SQL of a listing: the filter (shared by the count) and the page.
struct ListSql {
    filter: String,
    page: String,
    params: Vec<Box<dyn ToSql + Sync>>,
    /// Parameters the filter uses (a prefix of `params`).
    filter_params: usize,
}

fn list_sql(query: &ListQuery) -> Result<ListSql, StoreError> {
    let mut params: Vec<Box<dyn ToSql + Sync>> = Vec::new();
    let mut conds: Vec<String> = Vec::new();
    let bind = |params: &mut Vec<Box<dyn ToSql + Sync>>, v: Box<dyn ToSql + Sync>| {
        params.push(v);
        format!("${}", params.len())
    };
    match query.status {
        Some(st) => {
            let p = bind(&mut params, Box::new(st.as_str()));
            conds.push(format!("status = {p}"));
        }
        None if !query.include_deleted => {
            let p = bind(&mut params, Box::new(SessionStatus::Deleted.as_str()));
            conds.push(format!("status <> {p}"));
        }
        None => {}
    }
    if let Some(a) = &query.agent {
        let p = bind(&mut params, Box::new(a.clone()));
        conds.push(format!("agent_name = {p}"));
    }
    if let Some(parent) = &query.parent {
        let p = bind(&mut params, Box::new(parent.as_str().to_string()));
        conds.push(format!("parent_id = {p}"));
    }
    let filter_params = params.len();
    let filter = if conds.is_empty() {
        "TRUE".to_string()
    } else {
        conds.join(" AND ")
    };
    let column = match query.order {
        ListOrder::UpdatedAt => Some("updated_at_ms"),
        ListOrder::CreatedAt => Some("created_at_ms"),
        ListOrder::Id => None,
    };
    let (cmp, dir) = match query.direction {
        SortDirection::Ascending => (">", "ASC"),
        SortDirection::Descending => ("<", "DESC"),
    };
    let mut page_conds = vec![filter.clone()];
    if let Some(c) = &query.cursor {
        let (primary, after_id) = query.decode_cursor(c)?;
        let pid = bind(&mut params, Box::new(after_id));
        match column {
            Some(col) => {
                let pp = bind(&mut params, Box::new(primary));
                page_conds.push(format!("({col}, id) {cmp} ({pp}, {pid})"));
            }
            None => page_conds.push(format!("id {cmp} {pid}")),
        }
    }
    let order_by = match column {
        Some(col) => format!("{col} {dir}, id {dir}"),
        None => format!("id {dir}"),
    };
    let mut page = format!(
        "SELECT {HEADER_COLUMNS} FROM spool_sessions WHERE {} ORDER BY {order_by}",
        page_conds.join(" AND ")
    );
    if query.offset > 0 {
        let p = bind(
            &mut params,
            Box::new(i64::try_from(query.offset).unwrap_or(i64::MAX)),
        );
        page.push_str(&format!(" OFFSET {p}"));
    }
    if let Some(l) = query.limit {
        if l > MAX_PAGE_LIMIT {
            return Err(StoreError::InvalidQuery {
                reason: format!("limit {l} exceeds {MAX_PAGE_LIMIT}"),
            });
        }
        // One more than asked, to know whether a next page exists.
        let p = bind(&mut params, Box::new(l as i64 + 1));
        page.push_str(&format!(" LIMIT {p}"));
    }
    Ok(ListSql {
        filter,
        page,
        params,
        filter_params,
    })
}

impl TranscriptBackend for PostgresStore {
    /// The server, database, user and options of the connection string.
    fn identity(&self) -> String {
        self.identity.clone()
    }

    /// One row: the header and the transcript meta of `spool_sessions`.
    fn head(&self, id: &SessionId) -> Result<Option<TranscriptHead>, StoreError> {
        let row = self.run("transcript head", &format!("session {id}"), |client| {
            Ok(client.query_opt(
                &format!(
                    "SELECT {HEADER_COLUMNS}, tx_generation, tx_raw_seq, tx_updated_at_ms,
                            tx_leaf, tx_entries
                     FROM spool_sessions WHERE id = $1"
                ),
                &[&id.as_str()],
            )?)
        })?;
        let Some(row) = row else {
            return Ok(None);
        };
        let bad = |reason: String| StoreError::Corrupt {
            id: id.clone(),
            reason: format!("header row: {reason}"),
        };
        let header = header_from_row(&row).map_err(bad)?;
        let count = |col: &str| -> Result<u64, StoreError> {
            let v: i64 = row.try_get(col).map_err(|e| bad(e.to_string()))?;
            u64::try_from(v).map_err(|_| bad(format!("negative {col} {v}")))
        };
        let leaf: Option<String> = row.try_get("tx_leaf").map_err(|e| bad(e.to_string()))?;
        let leaf = leaf
            .map(|l| crate::transcript::EntryId::parse(&l))
            .transpose()
            .map_err(|e| bad(format!("leaf: {e}")))?;
        Ok(Some(TranscriptHead {
            version: crate::transcript::TranscriptVersion {
                generation: count("tx_generation")?,
                raw_seq: count("tx_raw_seq")?,
                updated_at_ms: row
                    .try_get("tx_updated_at_ms")
                    .map_err(|e| bad(e.to_string()))?,
            },
            leaf,
            entries: count("tx_entries")?,
            header,
        }))
    }

    fn source(&self, id: &SessionId) -> Result<BoxedSource<'_>, StoreError> {
        Ok(Box::new(PgTranscriptSource::new(self, id.clone())))
    }

    fn entry_ids(&self, id: &SessionId) -> Result<Vec<crate::transcript::EntryId>, StoreError> {
        self.run("transcript entry ids", &format!("session {id}"), |client| {
            transcript::entry_ids(client, id.as_str()).map_err(|e| e.into_fail(id))
        })
    }

    /// One commit (a fresh commit id, retried on a broken connection like
    /// `save`) under the version fence; the header's status and parent are
    /// left as they are. Deleted sessions are refused.
    fn append_events(
        &self,
        id: &SessionId,
        expected_version: u64,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        let h = self.header(id)?;
        crate::store::check_append(id, h.as_ref(), events.is_empty())?;
        let mut kinds = Vec::with_capacity(events.len());
        let mut payloads = Vec::with_capacity(events.len());
        for ev in &events {
            payloads.push(encode_event(ev).map_err(|source| StoreError::Encoding {
                context: format!("event {} of session {id}", ev.kind()),
                source,
            })?);
            kinds.push(ev.kind().to_string());
        }
        let landed = self.commit_events(
            "append",
            id,
            expected_version,
            Uuid::new_v4(),
            &kinds,
            &payloads,
            &events,
            None,
        )?;
        Ok(AppendReceipt {
            session_version: landed.version,
            updated_at_ms: landed.updated_at_ms,
            transcript: landed.transcript,
            entry_sizes: Vec::new(),
        })
    }

    fn has_settings(&self) -> bool {
        true
    }

    /// [`PostgresStore::load_settings`].
    fn settings(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        self.load_settings(id)
    }
}

impl SessionStore for PostgresStore {
    fn transcript_backend(&self) -> Option<&dyn TranscriptBackend> {
        Some(self)
    }

    fn create(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        self.create_with_commit_id(session, Uuid::new_v4())
    }

    fn save(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        self.save_with_commit_id(session, Uuid::new_v4())
    }

    fn load(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        self.load_at(id, None)
    }

    fn exists(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.run("exists", &format!("session {id}"), |client| {
            Ok(client
                .query_opt(
                    "SELECT 1 FROM spool_sessions WHERE id = $1",
                    &[&id.as_str()],
                )?
                .is_some())
        })
    }

    fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        // Commits and snapshot go with the row (ON DELETE CASCADE).
        self.run("delete", &format!("session {id}"), |client| {
            Ok(client.execute("DELETE FROM spool_sessions WHERE id = $1", &[&id.as_str()])? > 0)
        })
    }

    fn list_headers(&self, query: &ListQuery) -> Result<SessionInfoList, StoreError> {
        let sql = list_sql(query)?;
        let params: Vec<&(dyn ToSql + Sync)> = sql.params.iter().map(|p| p.as_ref()).collect();
        let filter_params = params.get(..sql.filter_params).unwrap_or(&[]);
        let count_sql = format!("SELECT count(*) FROM spool_sessions WHERE {}", sql.filter);
        let (total, rows) = self.run("list", "sessions", |client| {
            // The count and the page see the same state.
            let mut tx = client
                .build_transaction()
                .isolation_level(IsolationLevel::RepeatableRead)
                .read_only(true)
                .start()?;
            let total: i64 = tx.query_one(&count_sql, filter_params)?.try_get(0)?;
            let rows = tx.query(&sql.page, &params)?;
            tx.commit()?;
            Ok((total, rows))
        })?;
        let mut headers = Vec::with_capacity(rows.len());
        let mut skipped = Vec::new();
        let mut next_cursor = None;
        let page_len = query
            .limit
            .map_or(rows.len(), |l| rows.len().min(l as usize));
        for (i, row) in rows.iter().enumerate() {
            if i >= page_len {
                break;
            }
            match header_from_row(row) {
                Ok(h) => headers.push(h),
                Err(reason) => {
                    let id: String = row.try_get("id").unwrap_or_default();
                    skipped.push(SkippedSession {
                        location: format!("postgres:spool_sessions:{id}"),
                        reason,
                    });
                }
            }
        }
        if rows.len() > page_len && page_len > 0 {
            // The cursor is made from the raw key of the page's last row,
            // so it is right even if that row could not be read.
            let last = &rows[page_len - 1];
            let primary: i64 = match query.order {
                ListOrder::UpdatedAt => last.try_get("updated_at_ms").unwrap_or(0),
                ListOrder::CreatedAt => last.try_get("created_at_ms").unwrap_or(0),
                ListOrder::Id => 0,
            };
            let id: String = last.try_get("id").unwrap_or_default();
            next_cursor = Some(format!("{}{}:{}", query.order_tag(), primary, id));
        }
        Ok(SessionInfoList {
            headers,
            total: u64::try_from(total).unwrap_or(0),
            next_cursor,
            skipped,
        })
    }

    fn header(&self, id: &SessionId) -> Result<Option<AgentSessionInfo>, StoreError> {
        let row = self.run("header", &format!("session {id}"), |client| {
            Ok(client.query_opt(
                &format!("SELECT {HEADER_COLUMNS} FROM spool_sessions WHERE id = $1"),
                &[&id.as_str()],
            )?)
        })?;
        match row {
            None => Ok(None),
            Some(row) => header_from_row(&row)
                .map(Some)
                .map_err(|reason| StoreError::Corrupt {
                    id: id.clone(),
                    reason: format!("header row: {reason}"),
                }),
        }
    }

    fn stats(&self) -> StoreStats {
        self.loads.stats()
    }
}
