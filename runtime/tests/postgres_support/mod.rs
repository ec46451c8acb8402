//! A throwaway PostgreSQL server for tests: `initdb` into a temporary
//! directory, `pg_ctl start` on a free loopback port, `pg_ctl stop` on drop.
//!
//! The server binaries are looked up on PATH (or in `SPOOL_PG_BIN`, or the
//! newest `/usr/lib/postgresql/*/bin`). `initdb` refuses to run as root,
//! so as root every server command runs as the unprivileged `postgres`
//! user through `runuser`, and the directory is chowned to it.
//!
//! When the binaries (or, as root, `runuser` and the `postgres` user) are
//! missing, [`PgServer::start_or_skip`] prints a loud notice and returns
//! `None` so the test is skipped — unless the environment variable `CI` is
//! set (as `.ci/run` runs), where that is a failure.

#![allow(dead_code)]

use std::io::Write;
use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::atomic::{AtomicU32, Ordering};

/// Attempts to find a free port and start on it (another process may take
/// the port between the probe and the start).
const START_ATTEMPTS: u32 = 5;
/// `pg_ctl -t`: seconds pg_ctl waits for start or stop to complete.
const PG_CTL_WAIT_SECS: &str = "120";

struct Binaries {
    initdb: PathBuf,
    pg_ctl: PathBuf,
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

fn find_binaries() -> Option<Binaries> {
    if let Some(dir) = std::env::var_os("SPOOL_PG_BIN") {
        let dir = PathBuf::from(dir);
        return Some(Binaries {
            initdb: dir.join("initdb"),
            pg_ctl: dir.join("pg_ctl"),
        })
        .filter(|b| b.initdb.is_file() && b.pg_ctl.is_file());
    }
    if let (Some(initdb), Some(pg_ctl)) = (find_on_path("initdb"), find_on_path("pg_ctl")) {
        return Some(Binaries { initdb, pg_ctl });
    }
    // Debian installs the server outside PATH.
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|p| p.file_name())
            .and_then(|n| n.to_str())
            .and_then(|n| n.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.into_iter().rev().find_map(|d| {
        let b = Binaries {
            initdb: d.join("initdb"),
            pg_ctl: d.join("pg_ctl"),
        };
        (b.initdb.is_file() && b.pg_ctl.is_file()).then_some(b)
    })
}

fn running_as_root() -> bool {
    // /proc/self belongs to the effective user of this process.
    std::fs::metadata("/proc/self")
        .map(|m| m.uid() == 0)
        .unwrap_or(false)
}

fn postgres_user_ids() -> Option<(u32, u32)> {
    let out = Command::new("id").arg("-u").arg("postgres").output().ok()?;
    let uid = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    let out = Command::new("id").arg("-g").arg("postgres").output().ok()?;
    let gid = String::from_utf8_lossy(&out.stdout).trim().parse().ok()?;
    Some((uid, gid))
}

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
    bins: Binaries,
    /// Run server commands as `postgres` through runuser.
    as_postgres: bool,
    dir: tempfile::TempDir,
    port: u16,
    schemas: AtomicU32,
}

impl PgServer {
    /// Starts a server, or returns `None` (after a loud notice) when the
    /// machine cannot run one and `CI` is unset. Panics when the binaries
    /// are there but the server does not start.
    pub fn start_or_skip(test: &str) -> Option<PgServer> {
        let Some(bins) = find_binaries() else {
            return skip_or_fail(test, "initdb/pg_ctl were not found");
        };
        let as_postgres = running_as_root();
        let dir = tempfile::Builder::new()
            .prefix("spool-pg-")
            .tempdir()
            .expect("create a temporary directory for the server");
        if as_postgres {
            if find_on_path("runuser").is_none() {
                return skip_or_fail(test, "running as root and `runuser` was not found");
            }
            let Some((uid, gid)) = postgres_user_ids() else {
                return skip_or_fail(test, "running as root and there is no `postgres` user");
            };
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .expect("chown the server directory to postgres");
        }
        let mut server = PgServer {
            bins,
            as_postgres,
            dir,
            port: 0,
            schemas: AtomicU32::new(0),
        };
        let data = server.data_dir();
        let initdb = server.pg_command(
            &server.bins.initdb,
            &[
                "-D",
                path_str(&data),
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                // Test data: skip initdb's own fsyncs (the server still
                // fsyncs its WAL).
                "--no-sync",
            ],
        );
        check(&initdb, "initdb");
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            server.port = free_port();
            let out = server.pg_ctl_start();
            if out.status.success() {
                return Some(server);
            }
            last = Some(out);
        }
        let out = last.expect("at least one start attempt");
        panic!(
            "pg_ctl start failed {START_ATTEMPTS} times: {}\n{}\nserver log:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
            std::fs::read_to_string(server.log_file()).unwrap_or_default()
        );
    }

    fn data_dir(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn pg_command(&self, bin: &Path, args: &[&str]) -> Output {
        let mut cmd = if self.as_postgres {
            let mut c = Command::new("runuser");
            c.arg("-u").arg("postgres").arg("--").arg(bin);
            c
        } else {
            Command::new(bin)
        };
        cmd.args(args)
            // The postgres user may not be able to enter the caller's cwd.
            .current_dir(self.dir.path())
            .stdin(std::process::Stdio::null());
        cmd.output()
            .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()))
    }

    fn pg_ctl_start(&self) -> Output {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -c unix_socket_directories={} -c max_connections=200",
            self.port,
            path_str(self.dir.path())
        );
        let data = self.data_dir();
        let log = self.log_file();
        self.pg_command(
            &self.bins.pg_ctl,
            &[
                "start",
                "-w",
                "-t",
                PG_CTL_WAIT_SECS,
                "-D",
                path_str(&data),
                "-l",
                path_str(&log),
                "-o",
                &opts,
            ],
        )
    }

    fn pg_ctl_stop(&self, mode: &str) -> Output {
        let data = self.data_dir();
        self.pg_command(
            &self.bins.pg_ctl,
            &[
                "stop",
                "-w",
                "-t",
                PG_CTL_WAIT_SECS,
                "-m",
                mode,
                "-D",
                path_str(&data),
            ],
        )
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `key=value` connection string for database `postgres`.
    pub fn conn_str(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// A `postgres://` URL for database `postgres`.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Creates a new empty schema and returns a connection string whose
    /// search path is that schema: a fresh, isolated store location.
    pub fn fresh_schema(&self) -> String {
        let n = self.schemas.fetch_add(1, Ordering::Relaxed);
        let schema = format!("t{n}");
        let mut c = postgres::Client::connect(&self.conn_str(), postgres::NoTls)
            .expect("connect to the test server");
        c.batch_execute(&format!("CREATE SCHEMA {schema}"))
            .expect("create schema");
        format!("{} options='-c search_path={schema}'", self.conn_str())
    }

    /// Stops the server the hard way (like a crash: no checkpoint, open
    /// connections cut) and starts it again on the same port; WAL recovery
    /// runs on start.
    pub fn crash_restart(&self) {
        check(&self.pg_ctl_stop("immediate"), "pg_ctl stop -m immediate");
        check(&self.pg_ctl_start(), "pg_ctl start (after a stop)");
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.port != 0 {
            let out = self.pg_ctl_stop("immediate");
            if !out.status.success() {
                eprintln!(
                    "warning: pg_ctl stop failed: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
        }
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

fn free_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind a loopback port");
    l.local_addr().expect("local address").port()
}

fn check(out: &Output, what: &str) {
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}
