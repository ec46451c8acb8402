//! A throwaway PostgreSQL server for the `postgres` peer: `initdb` into a
//! new directory under the benchmark's scratch directory (the disk being
//! measured), `pg_ctl start` on a free loopback port, `pg_ctl stop` on
//! drop. The same procedure as the runtime's PostgreSQL test harness.
//!
//! The server binaries are looked up in `SPOOL_PG_BIN`, on PATH, or in the
//! newest `/usr/lib/postgresql/*/bin`. `initdb` refuses to run as root, so
//! as root every server command runs as the unprivileged `postgres` user
//! through `runuser`, and the server directory is chowned to it (its
//! ancestors must be searchable by that user). Nothing here panics: a
//! server that cannot run is an `Err` with the reason, which the peer
//! reports as its note.

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Attempts to find a free port and start on it (another process may take
/// the port between the probe and the start).
const START_ATTEMPTS: u32 = 3;
/// `pg_ctl -t`: seconds pg_ctl waits for start or stop to complete.
const PG_CTL_WAIT_SECS: &str = "120";
/// Longest Unix socket path the kernel accepts (`sun_path` is 108 bytes
/// with its terminating NUL); longer socket paths fall back to TCP.
const UNIX_SOCKET_PATH_MAX: usize = 107;

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

/// The server binaries.
#[derive(Clone, Debug)]
pub struct Binaries {
    pub initdb: PathBuf,
    pub pg_ctl: PathBuf,
}

fn find_on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Finds `initdb` and `pg_ctl` (see the module docs).
pub fn find_binaries() -> Option<Binaries> {
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
    let id = |flag: &str| -> Option<u32> {
        let out = Command::new("id").arg(flag).arg("postgres").output().ok()?;
        String::from_utf8_lossy(&out.stdout).trim().parse().ok()
    };
    Some((id("-u")?, id("-g")?))
}

fn describe(out: &Output) -> String {
    format!(
        "{}: {} {}",
        out.status,
        String::from_utf8_lossy(&out.stdout).trim(),
        String::from_utf8_lossy(&out.stderr).trim()
    )
}

/// A running throwaway server; stopped (and its directory removed) on
/// drop.
pub struct PgServer {
    bins: Binaries,
    /// Run server commands as `postgres` through runuser.
    as_postgres: bool,
    dir: tempfile::TempDir,
    port: u16,
}

impl std::fmt::Debug for PgServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgServer")
            .field("dir", &self.dir.path())
            .field("port", &self.port)
            .finish_non_exhaustive()
    }
}

impl PgServer {
    /// Initializes and starts a server in a new directory under `parent`
    /// with [`SERVER_SETTINGS`]. `Err` says why it cannot run.
    pub fn start(parent: &Path) -> Result<PgServer, String> {
        let bins = find_binaries()
            .ok_or("the PostgreSQL server binaries (initdb, pg_ctl) were not found")?;
        let as_postgres = running_as_root();
        std::fs::create_dir_all(parent)
            .map_err(|e| format!("creating {}: {e}", parent.display()))?;
        let dir = tempfile::Builder::new()
            .prefix("pg-")
            .tempdir_in(parent)
            .map_err(|e| format!("creating a server directory in {}: {e}", parent.display()))?;
        if as_postgres {
            if find_on_path("runuser").is_none() {
                return Err("running as root and `runuser` was not found".into());
            }
            let (uid, gid) =
                postgres_user_ids().ok_or("running as root and there is no `postgres` user")?;
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid))
                .map_err(|e| format!("chown {} to postgres: {e}", dir.path().display()))?;
        }
        let mut server = PgServer {
            bins,
            as_postgres,
            dir,
            port: 0,
        };
        let data = server.data_dir();
        let initdb = server.pg_command(
            &server.bins.initdb,
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--locale=C",
                // initdb's own fsyncs of the template files; the server
                // fsyncs its WAL on every commit regardless.
                "--no-sync",
            ],
        )?;
        if !initdb.status.success() {
            return Err(format!("initdb failed ({})", describe(&initdb)));
        }
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            server.port = free_port()?;
            let out = server.pg_ctl_start()?;
            if out.status.success() {
                return Ok(server);
            }
            last = describe(&out);
        }
        server.port = 0;
        let log = std::fs::read_to_string(server.log_file()).unwrap_or_default();
        Err(format!(
            "pg_ctl start failed {START_ATTEMPTS} times ({last}); server log: {}",
            log.trim()
        ))
    }

    fn data_dir(&self) -> String {
        self.dir.path().join("data").to_string_lossy().into_owned()
    }

    fn log_file(&self) -> PathBuf {
        self.dir.path().join("server.log")
    }

    fn pg_command(&self, bin: &Path, args: &[&str]) -> Result<Output, String> {
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
            .stdin(Stdio::null());
        cmd.output()
            .map_err(|e| format!("running {}: {e}", bin.display()))
    }

    fn pg_ctl_start(&self) -> Result<Output, String> {
        let mut opts = format!(
            "-p {} -c unix_socket_directories={}",
            self.port,
            self.dir.path().display()
        );
        for (k, v) in SERVER_SETTINGS {
            opts.push_str(&format!(" -c {k}={v}"));
        }
        let data = self.data_dir();
        let log = self.log_file().to_string_lossy().into_owned();
        self.pg_command(
            &self.bins.pg_ctl,
            &[
                "start",
                "-w",
                "-t",
                PG_CTL_WAIT_SECS,
                "-D",
                &data,
                "-l",
                &log,
                "-o",
                &opts,
            ],
        )
    }

    /// A `key=value` connection string for database `postgres` through
    /// the Unix socket when its path fits, else loopback TCP.
    pub fn conn_str(&self) -> String {
        let socket = self.dir.path().join(format!(".s.PGSQL.{}", self.port));
        let host = if socket.as_os_str().len() <= UNIX_SOCKET_PATH_MAX {
            self.dir.path().display().to_string()
        } else {
            "127.0.0.1".to_string()
        };
        format!(
            "host='{host}' port={} user=postgres dbname=postgres",
            self.port
        )
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.port == 0 {
            return;
        }
        let data = self.data_dir();
        let stopped = self.pg_command(
            &self.bins.pg_ctl,
            &[
                "stop",
                "-w",
                "-t",
                PG_CTL_WAIT_SECS,
                "-m",
                "fast",
                "-D",
                &data,
            ],
        );
        match stopped {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!("warning: pg_ctl stop failed ({})", describe(&out)),
            Err(e) => eprintln!("warning: {e}"),
        }
    }
}

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("binding a port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("reading the bound port: {e}"))
}
