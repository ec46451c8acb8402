//! `spool purge`: remove a session from the store, so its id is free again.
//!
//! By default only a deleted (tombstoned) session is purged: a purge cannot
//! be undone, and an active session is refused unless `--force` is given.
//! After a purge the session is gone from listings and reads and its id can
//! be created or imported again. On the log store its records stay in the
//! log (with a purge marker) until `compact --gc` reclaims their segment
//! (the active segment is never collected), and their commit ids stay
//! taken with them, so until then re-importing an export of the purged
//! session needs `import --fresh-commit-ids`. On PostgreSQL the session's rows are
//! deleted at once.
//!
//! An id no session has is a failure (exit 2): a purged session cannot be
//! told from one that never existed, and a mistyped id must not pass
//! silently. A purge that another process completed while this one ran
//! reports `already_purged` and succeeds.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use spool_runtime::session::{SessionId, SessionStatus};

use crate::out::{print_doc, Result, ToolError};
use crate::session_open::{is_postgres, runtime_err, runtime_with, Access};

#[derive(Serialize)]
struct Purged {
    id: String,
    /// The session's status when it was purged.
    status: &'static str,
    /// The session's version when it was purged.
    session_version: u64,
    /// Whether another process purged it first (then nothing was written).
    already_purged: bool,
}

pub fn run(dir: &Path, id: &SessionId, force: bool, json: bool) -> Result<ExitCode> {
    let rt = runtime_with(dir, Access::Write)?;
    let info = rt.session_info(id).map_err(|e| runtime_err(id, e))?;
    if info.status != SessionStatus::Deleted && !force {
        return Err(ToolError::new(format!(
            "session {id} is {}, not deleted: refusing to purge it",
            info.status.as_str()
        ))
        .hint(format!(
            "delete it first (`spool --store DIR delete {id}`), or pass --force to purge it as it is"
        )));
    }
    let removed = rt
        .purge(id)
        .map_err(|e| ToolError::with_source(format!("purging session {id} failed"), e))?;
    let out = Purged {
        id: id.to_string(),
        status: info.status.as_str(),
        session_version: info.version,
        already_purged: !removed,
    };
    if json {
        print_doc(&out)?;
    } else if !removed {
        crate::outln!("session {id} was already purged");
    } else {
        crate::outln!(
            "purged session {id} ({} at version {}); its id is free again",
            info.status.as_str(),
            info.version
        );
        if !is_postgres(dir) {
            crate::outln!(
                "its records and commit ids stay in the log until `spool --store DIR compact --gc` collects their segments; until then, importing it again needs `import --fresh-commit-ids`"
            );
        }
    }
    Ok(ExitCode::SUCCESS)
}
