//! A throwaway PostgreSQL server for tests ([`spool_pgserver`], the
//! harness the benchmark's PostgreSQL peer uses too): `initdb` into a
//! temporary directory, `pg_ctl start` on a free loopback port, stopped
//! and removed on drop.
//!
//! When the machine cannot run a server (no binaries; as root, no
//! `runuser` or `postgres` user), [`PgServer::start_or_skip`] prints a
//! loud notice and returns `None` so the test is skipped — unless the
//! environment variable `CI` is set (as `.ci/run` runs), where that is a
//! failure.

#![allow(dead_code)]

use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};

use spool_pgserver::{ServerOptions, ServerTls, StartError};

/// Test server settings: loopback TCP (the connection strings below) and
/// connections for many concurrent test clients.
const TEST_SETTINGS: [(&str, &str); 2] = [
    ("listen_addresses", "127.0.0.1"),
    ("max_connections", "200"),
];

fn skip_or_fail(test: &str, why: &str) -> Option<PgServer> {
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    if ci {
        panic!("{test}: a PostgreSQL server is required under CI but {why}");
    }
    // Straight to the stderr handle: libtest captures only the print
    // macros, and a skip must be seen even when the test "passes".
    let bar = "!".repeat(72);
    let _ = writeln!(
        std::io::stderr(),
        "\n{bar}\n!!! SKIPPED {test}: {why}.\n\
         !!! Install the PostgreSQL server (initdb, pg_ctl) to run it.\n{bar}"
    );
    None
}

/// A running throwaway server; stopped and removed on drop.
pub struct PgServer {
    server: spool_pgserver::PgServer,
    schemas: AtomicU32,
}

impl PgServer {
    /// Starts a server, or returns `None` (after a loud notice) when the
    /// machine cannot run one and `CI` is unset. Panics when the binaries
    /// are there but the server does not start.
    pub fn start_or_skip(test: &str) -> Option<PgServer> {
        match spool_pgserver::PgServer::start(&ServerOptions {
            parent: None,
            settings: &TEST_SETTINGS,
        }) {
            Ok(server) => Some(PgServer {
                server,
                schemas: AtomicU32::new(0),
            }),
            Err(StartError::Unavailable(why)) => skip_or_fail(test, &why),
            Err(e) => panic!("{test}: the PostgreSQL server did not start: {e}"),
        }
    }

    /// Starts a server with `ssl=on` and `tls`'s certificate (see
    /// [`PgServer::start_or_skip`]).
    pub fn start_tls_or_skip(test: &str, tls: &ServerTls<'_>) -> Option<PgServer> {
        match spool_pgserver::PgServer::start_with_tls(
            &ServerOptions {
                parent: None,
                settings: &TEST_SETTINGS,
            },
            tls,
        ) {
            Ok(server) => Some(PgServer {
                server,
                schemas: AtomicU32::new(0),
            }),
            Err(StartError::Unavailable(why)) => skip_or_fail(test, &why),
            Err(e) => panic!("{test}: the PostgreSQL server did not start: {e}"),
        }
    }

    pub fn port(&self) -> u16 {
        self.server.port()
    }

    /// A `key=value` connection string for database `postgres`.
    pub fn conn_str(&self) -> String {
        self.server.tcp_conn_str()
    }

    /// A `postgres://` URL for database `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port())
    }

    /// Creates a new empty schema and returns a connection string whose
    /// search path is that schema: a fresh, isolated store location.
    pub fn fresh_schema(&self) -> String {
        let n = self.schemas.fetch_add(1, Ordering::Relaxed);
        let schema = format!("t{n}");
        // On a thread of its own: the blocking client cannot run on a
        // thread inside a tokio runtime, where async tests call this.
        let conn = self.conn_str();
        std::thread::scope(|s| {
            s.spawn(|| {
                let mut c = postgres::Client::connect(&conn, postgres::NoTls)
                    .expect("connect to the test server");
                c.batch_execute(&format!("CREATE SCHEMA {schema}"))
                    .expect("create schema");
            })
            .join()
            .expect("creating the schema");
        });
        format!("{} options='-c search_path={schema}'", self.conn_str())
    }

    /// Stops the server the hard way (like a crash: no checkpoint, open
    /// connections cut) and starts it again on the same port; WAL recovery
    /// runs on start.
    pub fn crash_restart(&self) {
        if let Err(e) = self.server.crash_restart() {
            panic!("{e}");
        }
    }
}
