//! `spool delete`: tombstone a session through the runtime.
//!
//! The session keeps its history and reads with status `deleted`; every
//! later action on it fails (Deleted is terminal). Its records become dead
//! bytes (see `stats`) that `compact --gc` reclaims. Deleting a session
//! that is already deleted changes nothing and succeeds.

use std::path::Path;
use std::process::ExitCode;

use serde::Serialize;
use spool_runtime::session::SessionStatus;

use crate::out::{print_json, Result};
use crate::session_open::{parse_id, runtime_err, runtime_for};

#[derive(Serialize)]
struct Deleted {
    id: String,
    status: &'static str,
    version: u64,
    already_deleted: bool,
}

pub fn run(dir: &Path, id: &str, json: bool) -> Result<ExitCode> {
    let id = parse_id(id)?;
    crate::cmd::require_existing_store(dir)?;
    let rt = runtime_for(dir, true)?;
    let info = rt.session_info(&id).map_err(|e| runtime_err(&id, e))?;
    let (version, already_deleted) = if info.status == SessionStatus::Deleted {
        (info.version, true)
    } else {
        let s = rt.delete(&id).map_err(|e| runtime_err(&id, e))?;
        (s.version(), false)
    };
    let out = Deleted {
        id: id.to_string(),
        status: SessionStatus::Deleted.as_str(),
        version,
        already_deleted,
    };
    if json {
        print_json(&out)?;
    } else if already_deleted {
        crate::outln!("session {id} was already deleted (version {version})");
    } else {
        crate::outln!("deleted session {id} (tombstone at version {version})");
        crate::outln!("its bytes are reclaimed by `spool --store DIR compact --gc`");
    }
    Ok(ExitCode::SUCCESS)
}
