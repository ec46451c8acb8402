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
            .hint_from_cause(None)
    })?);
    // A checkpoint that was there but could not be used (damaged, from another store,
    // ahead of the log): the answers are right (rebuilt from the log), only slower.
    if let Some(why) = store
        .engine()
        .ok()
        .and_then(|e| e.stats().open_checkpoint_fallback)
    {
        eprintln!("warning: {why}; read the whole log instead");
    }
    let rt = SessionRuntime::new(
        store.clone() as Arc<dyn SessionStore>,
        Arc::new(NullSink),
        SessionHookStack::empty(),
    );
    Ok((store, rt))
}

/// The runtime as the store's single owner (creates the store if needed).
pub fn writable(dir: &Path) -> Result<(Arc<LogStore>, SessionRuntime)> {
    crate::cmd::refuse_postgres(dir, "this command")?;
    crate::cmd::refuse_file(dir)?;
    let store = Arc::new(
        LogStore::open(dir, LogStoreOptions::default()).map_err(|e| {
            ToolError::with_source(format!("opening {} failed", dir.display()), e)
                .hint_from_cause(None)
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

/// The PostgreSQL store `--store` names (a `postgres://` URL), for the
/// commands that need more than the `SessionStore` interface.
pub fn postgres_store(dir: &Path) -> Result<spool_runtime::store::postgres::PostgresStore> {
    let location = dir.to_str().unwrap_or_default();
    spool_runtime::store::postgres::PostgresStore::connect(location).map_err(|e| {
        ToolError::with_source(
            format!(
                "connecting to the PostgreSQL store {} failed",
                crate::cmd::display_store(dir)
            ),
            e,
        )
        .hint("check the URL, the server and the credentials")
    })
}

/// How [`runtime_for`] opens a store directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// Read-only, no lock; the store must exist.
    Read,
    /// As the owner; the store must exist.
    Write,
    /// As the owner, creating the store if needed.
    Create,
}

/// [`runtime_with`]: read-only, or as the owner creating the store if needed.
pub fn runtime_for(dir: &Path, write: bool) -> Result<SessionRuntime> {
    runtime_with(dir, if write { Access::Create } else { Access::Read })
}

/// A runtime over whatever `--store` names: a PostgreSQL URL
/// (`postgres://…`) or a log-store directory.
/// Used by the commands that only need sessions, not the log itself.
pub fn runtime_with(dir: &Path, access: Access) -> Result<SessionRuntime> {
    if is_postgres(dir) {
        let location = dir.to_str().unwrap_or_default();
        let store = spool_runtime::store::open_store(location).map_err(|e| {
            ToolError::with_source(
                format!(
                    "connecting to the PostgreSQL store {} failed",
                    crate::cmd::display_store(dir)
                ),
                e,
            )
            .hint("check the URL, the server and the credentials")
        })?;
        return Ok(SessionRuntime::new(
            store,
            Arc::new(NullSink),
            SessionHookStack::empty(),
        ));
    }
    let (_store, rt) = match access {
        Access::Read => read_only(dir)?,
        Access::Write => {
            require_existing_store(dir)?;
            writable(dir)?
        }
        Access::Create => writable(dir)?,
    };
    Ok(rt)
}

/// The fewest characters a session id prefix may have (as in git, a
/// shorter one would match too much to be useful).
pub const ID_PREFIX_MIN: usize = 4;

/// Resolves a session id given on the command line: an existing session's
/// id, or a unique prefix of one, git-style (`show 3f7cc308`). An
/// ambiguous prefix is refused with the candidates listed. Deleted
/// sessions count (they can still be shown and exported). Uses the store's
/// session listing (the header index), never a scan of the log.
pub fn resolve_id(dir: &Path, arg: &str) -> Result<SessionId> {
    match resolve(dir, arg)? {
        Some(id) => Ok(id),
        None => Err(no_session(arg)),
    }
}

/// Like [`resolve_id`] for `log --stream`: a name no session id starts
/// with is returned as it is (streams that are not sessions, like
/// `stress-0`, have names of their own).
pub fn resolve_stream(dir: &Path, arg: &str) -> Result<String> {
    if SessionId::parse(arg).is_err() {
        return Ok(arg.to_string());
    }
    Ok(resolve(dir, arg)?.map_or_else(|| arg.to_string(), |id| id.as_str().to_string()))
}

fn no_session(arg: &str) -> ToolError {
    let e = ToolError::new(format!("no session {arg} in this store"));
    if arg.len() < ID_PREFIX_MIN {
        e.hint(format!(
            "an id prefix needs at least {ID_PREFIX_MIN} characters; list session ids with `spool --store DIR sessions`"
        ))
    } else {
        e.hint("list session ids with `spool --store DIR sessions`")
    }
}

/// `Some(id)`: the session `arg` names exactly or by a unique prefix;
/// `None`: no session matches.
fn resolve(dir: &Path, arg: &str) -> Result<Option<SessionId>> {
    let id = parse_id(arg)?;
    // A whole generated id needs no lookup: the command itself says
    // whether the session exists.
    if arg.len() == 36 && uuid::Uuid::try_parse(arg).is_ok() {
        return Ok(Some(id));
    }
    lookup(&runtime_for(dir, false)?, arg, id)
}

/// [`resolve_id`] through a runtime the command opened already (one open
/// of the store per command, not one to resolve and one to answer).
pub fn resolve_in(rt: &SessionRuntime, arg: &str) -> Result<SessionId> {
    let id = parse_id(arg)?;
    if arg.len() == 36 && uuid::Uuid::try_parse(arg).is_ok() {
        return Ok(id);
    }
    lookup(rt, arg, id)?.ok_or_else(|| no_session(arg))
}

fn lookup(rt: &SessionRuntime, arg: &str, id: SessionId) -> Result<Option<SessionId>> {
    match rt.session_info(&id) {
        Ok(_) => return Ok(Some(id)),
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(runtime_err(&id, e)),
    }
    if arg.len() < ID_PREFIX_MIN {
        return Ok(None);
    }
    let list = rt
        .list_sessions(&spool_runtime::ListQuery::all().including_deleted())
        .map_err(|e| ToolError::with_source("listing sessions failed", e))?;
    let lower = arg.to_ascii_lowercase();
    let mut matches: Vec<_> = list
        .headers
        .into_iter()
        .filter(|h| h.id.as_str().starts_with(arg) || h.id.as_str().starts_with(&lower))
        .collect();
    match matches.len() {
        0 => Ok(None),
        1 => Ok(matches.pop().map(|h| h.id)),
        n => {
            matches.sort_by(|a, b| a.id.cmp(&b.id));
            let mut msg = format!("session id prefix {arg} is ambiguous; {n} sessions match:");
            for h in &matches {
                msg.push_str(&format!(
                    "\n  {}  {}  {}",
                    h.id,
                    h.status.as_str(),
                    h.agent_name
                ));
            }
            Err(ToolError::new(msg).hint("give more characters of the id"))
        }
    }
}
