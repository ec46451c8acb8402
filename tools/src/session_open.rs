//! Opening sessions for the tools: the runtime over the log store.

use std::path::Path;
use std::sync::Arc;

use spool_runtime::hooks::SessionHookStack;
use spool_runtime::observer::NullSink;
use spool_runtime::session::SessionId;
use spool_runtime::store::{LogStore, LogStoreOptions, SessionStore};
use spool_runtime::SessionRuntime;

use crate::cmd::require_existing_store;
use crate::out::{Result, ToolError};

/// A read-only runtime over the store's log (no lock taken, nothing written).
pub fn read_only(dir: &Path) -> Result<(Arc<LogStore>, SessionRuntime)> {
    require_existing_store(dir)?;
    let store = Arc::new(LogStore::open_read_only(dir).map_err(|e| {
        ToolError::with_source(format!("opening {} read-only failed", dir.display()), e)
            .hint("run `spool --store DIR verify` to locate damage")
    })?);
    let rt = SessionRuntime::new(
        store.clone() as Arc<dyn SessionStore>,
        Arc::new(NullSink),
        SessionHookStack::empty(),
    );
    Ok((store, rt))
}

/// The runtime as the store's single owner (creates the store if needed).
pub fn writable(dir: &Path) -> Result<(Arc<LogStore>, SessionRuntime)> {
    let store = Arc::new(
        LogStore::open(dir, LogStoreOptions::default()).map_err(|e| {
            ToolError::with_source(format!("opening {} failed", dir.display()), e)
                .hint("another process may own the store; stop it or use a read-only command")
        })?,
    );
    let rt = SessionRuntime::new(
        store.clone() as Arc<dyn SessionStore>,
        Arc::new(NullSink),
        SessionHookStack::empty(),
    );
    Ok((store, rt))
}

/// Parses a session id given on the command line.
pub fn parse_id(s: &str) -> Result<SessionId> {
    SessionId::parse(s).map_err(|e| {
        ToolError::with_source(format!("{s:?} is not a valid session id"), e)
            .hint("list session ids with `spool --store DIR sessions`")
    })
}

/// A runtime error, phrased for the command line.
pub fn runtime_err(id: &SessionId, e: spool_runtime::RuntimeError) -> ToolError {
    if e.is_not_found() {
        ToolError::new(format!("no session {id} in this store"))
            .hint("list sessions with `spool --store DIR sessions`")
    } else {
        ToolError::with_source(format!("session {id}"), e)
    }
}

/// Whether `--store` names a PostgreSQL database rather than a directory.
pub fn is_postgres(dir: &Path) -> bool {
    dir.to_str()
        .is_some_and(spool_runtime::store::is_postgres_location)
}

/// A runtime over whatever `--store` names: a PostgreSQL URL
/// (`postgres://…`) or a log-store directory (read-only unless `write`).
/// Used by the commands that only need sessions, not the log itself.
pub fn runtime_for(dir: &Path, write: bool) -> Result<SessionRuntime> {
    if is_postgres(dir) {
        let location = dir.to_str().unwrap_or_default();
        let store = spool_runtime::store::open_store(location).map_err(|e| {
            ToolError::with_source("connecting to the PostgreSQL store failed", e)
                .hint("check the URL, the server and the credentials")
        })?;
        return Ok(SessionRuntime::new(
            store,
            Arc::new(NullSink),
            SessionHookStack::empty(),
        ));
    }
    let (_store, rt) = if write {
        writable(dir)?
    } else {
        read_only(dir)?
    };
    Ok(rt)
}
