//! `spool delete`: tombstone a session through the runtime.
//!
//! The session keeps its history and reads with status `deleted`; every
//! later action on it fails (Deleted is terminal). Its records become dead
//! bytes (see `stats`) that `compact --gc` reclaims. Deleting a session
//! that is already deleted changes nothing and succeeds, also when another
//! process deleted it while this one was deleting it. Any other write that
//! lands first is a version conflict (exit 3; nothing was written).

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use spool_runtime::actions::{ActionError, DeleteSession, SessionAction};
use spool_runtime::session::{AgentSession, SessionId, SessionStatus};
use spool_runtime::{RuntimeError, SessionRuntime};

use crate::out::{print_doc, Result, ToolError, EXIT_CONFLICT};
use crate::session_open::{runtime_err, runtime_with, Access};

#[derive(Serialize)]
struct Deleted {
    id: String,
    status: &'static str,
    /// The session's version (its tombstone's).
    session_version: u64,
    already_deleted: bool,
}

/// Test hook: deletes the session through the same store between this
/// delete's load and its save, as a second process would, so the save
/// meets a version conflict.
struct RacingDelete<'a> {
    rt: &'a SessionRuntime,
    id: &'a SessionId,
}

impl SessionAction for RacingDelete<'_> {
    fn name(&self) -> &str {
        DeleteSession.name()
    }
    fn execute(&self, session: &mut AgentSession) -> std::result::Result<(), ActionError> {
        self.rt
            .delete(self.id)
            .map_err(|e| ActionError::Custom(Box::new(e)))?;
        DeleteSession.execute(session)
    }
}

pub fn run(
    dir: &Path,
    id: &SessionId,
    test_concurrent_delete: bool,
    json: bool,
) -> Result<ExitCode> {
    let rt = runtime_with(dir, Access::Write)?;
    let id = id.clone();
    let info = rt.session_info(&id).map_err(|e| runtime_err(&id, e))?;
    let (version, already_deleted) = if info.status == SessionStatus::Deleted {
        (info.version, true)
    } else {
        let deleted = if test_concurrent_delete {
            rt.execute(&id, &RacingDelete { rt: &rt, id: &id })
        } else {
            rt.delete(&id)
        };
        match deleted {
            Ok(s) => (s.version(), false),
            // Someone else deleted it first: the outcome asked for holds.
            Err(RuntimeError::SessionDeleted { .. }) => {
                let info = rt.session_info(&id).map_err(|e| runtime_err(&id, e))?;
                (info.version, true)
            }
            Err(e) if e.is_conflict() => {
                let info = rt.session_info(&id).map_err(|e| runtime_err(&id, e))?;
                if info.status != SessionStatus::Deleted {
                    return Err(ToolError::new(format!(
                        "session {id}: version conflict: another writer committed first (now version {}); nothing was written",
                        info.version
                    ))
                    .hint("run the command again")
                    .code(EXIT_CONFLICT));
                }
                (info.version, true)
            }
            Err(e) => return Err(runtime_err(&id, e)),
        }
    };
    let out = Deleted {
        id: id.to_string(),
        status: SessionStatus::Deleted.as_str(),
        session_version: version,
        already_deleted,
    };
    if json {
        print_doc(&out)?;
    } else if already_deleted {
        crate::outln!("session {id} was already deleted (version {version})");
    } else {
        crate::outln!("deleted session {id} (tombstone at version {version})");
        crate::outln!("its bytes are reclaimed by `spool --store DIR compact --gc`");
    }
    Ok(ExitCode::SUCCESS)
}
