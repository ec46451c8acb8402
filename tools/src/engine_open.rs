//! Opening the engine for the tools.

use std::path::Path;

use spool_engine::{Options, Store};

use crate::cmd::require_existing_store;
use crate::out::{Result, ToolError};

/// Engine options the tools use for reading.
pub fn engine_options() -> Options {
    Options::default()
}

/// Opens a store read-only from the log alone (no lock, nothing written).
pub fn open_read_only(dir: &Path) -> Result<Store> {
    require_existing_store(dir)?;
    Store::open_read_only(dir, engine_options()).map_err(|e| {
        ToolError::with_source(format!("opening {} read-only failed", dir.display()), e)
            .hint_from_cause(None)
    })
}
