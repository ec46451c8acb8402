//! The throwaway server of the `postgres` peer: [`spool_pgserver`] (the
//! harness the runtime's PostgreSQL tests use too), its directory under
//! the benchmark's scratch directory (the disk being measured), with the
//! settings of a durable run. A server that cannot run is an `Err` with
//! the reason, which the peer reports as its note.

use std::path::Path;

pub use spool_pgserver::PgServer;
use spool_pgserver::ServerOptions;

/// The server settings of a durable run, as its experts would set them:
/// every commit waits for its WAL flush (`synchronous_commit=on`,
/// `fsync=on`), `full_page_writes` and `wal_sync_method` stay at their
/// defaults, `shared_buffers` holds the benchmark's data (256 MB), enough
/// connections for 16 writers plus readers.
pub const SERVER_SETTINGS: [(&str, &str); 5] = [
    ("synchronous_commit", "on"),
    ("fsync", "on"),
    ("shared_buffers", "256MB"),
    ("max_connections", "64"),
    ("listen_addresses", "127.0.0.1"),
];

/// Initializes and starts a server in a new directory under `parent`
/// with [`SERVER_SETTINGS`]. `Err` says why it cannot run.
pub fn start(parent: &Path) -> Result<PgServer, String> {
    PgServer::start(&ServerOptions {
        parent: Some(parent),
        settings: &SERVER_SETTINGS,
    })
    .map_err(|e| e.to_string())
}
