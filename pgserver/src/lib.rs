//! A throwaway PostgreSQL server: `initdb` into a new directory,
//! `pg_ctl start` on a free loopback port, `pg_ctl stop` on drop (the
//! directory is removed with it). Used by the runtime's PostgreSQL tests
//! and by the benchmark's `postgres` peer, so both run the server the same
//! way.
//!
//! The server binaries are looked up in `SPOOL_PG_BIN`, on PATH, or in the
//! newest `/usr/lib/postgresql/*/bin` (where Debian installs them).
//! `initdb` refuses to run as root, so as root every server command runs
//! as the unprivileged `postgres` user through `runuser`, and the server
//! directory is chowned to it (its ancestors must be searchable by that
//! user). Nothing here panics: a server that cannot run is an `Err` with
//! the reason; callers decide whether that skips, fails or is reported.
//!
//! [`PgServer::start_with_tls`] starts a server with `ssl=on` and a given
//! certificate, optionally refusing plain TCP connections; with the `tls`
//! feature, `TestPki` makes a throwaway CA and a server certificate in
//! Rust (no openssl binary needed).

#[cfg(feature = "tls")]
mod pki;
#[cfg(feature = "tls")]
pub use pki::TestPki;

use std::net::TcpListener;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

/// Attempts to find a free port and start on it (another process may take
/// the port between the probe and the start).
const START_ATTEMPTS: u32 = 5;
/// `pg_ctl -t`: seconds pg_ctl waits for start or stop to complete.
const PG_CTL_WAIT_SECS: &str = "120";
/// Longest Unix socket path the kernel accepts (`sun_path` is 108 bytes
/// with its terminating NUL); longer socket paths fall back to TCP.
const UNIX_SOCKET_PATH_MAX: usize = 107;

/// The server binaries.
#[derive(Clone, Debug)]
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

/// Finds `initdb` and `pg_ctl` (see the module docs).
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

/// Whether `initdb` and `pg_ctl` were found (see the module docs); as
/// root, [`PgServer::start`] also needs `runuser` and a `postgres` user.
pub fn binaries_available() -> bool {
    find_binaries().is_some()
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

fn free_port() -> Result<u16, String> {
    let l = TcpListener::bind("127.0.0.1:0").map_err(|e| format!("binding a port: {e}"))?;
    l.local_addr()
        .map(|a| a.port())
        .map_err(|e| format!("reading the bound port: {e}"))
}

/// Why a server could not be started.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StartError {
    /// This machine cannot run a server (no binaries; as root, no
    /// `runuser` or no `postgres` user): tests may skip.
    Unavailable(String),
    /// The binaries are there but initializing or starting failed.
    Failed(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Unavailable(why) | StartError::Failed(why) => f.write_str(why),
        }
    }
}

impl std::error::Error for StartError {}

/// Where and how to start a server.
#[derive(Clone, Debug, Default)]
pub struct ServerOptions<'a> {
    /// Directory to create the server directory in (`None`: the system's
    /// temporary directory). A benchmark puts it on the disk it measures.
    pub parent: Option<&'a Path>,
    /// Server settings passed as `-c key=value` (besides the port and the
    /// socket directory, which are always set).
    pub settings: &'a [(&'a str, &'a str)],
}

/// TLS for a server started with [`PgServer::start_with_tls`].
#[derive(Clone, Copy, Debug)]
pub struct ServerTls<'a> {
    /// The server's certificate (PEM; intermediates may follow it).
    pub cert_pem: &'a str,
    /// The server's private key (PEM).
    pub key_pem: &'a str,
    /// Refuse TCP connections without TLS (`hostssl` lines only in
    /// `pg_hba.conf`).
    pub hostssl_only: bool,
}

/// TCP over TLS only; the Unix socket stays open (plain) for local tools.
const HBA_HOSTSSL_ONLY: &str = "local all all trust
hostssl all all 127.0.0.1/32 trust
hostssl all all ::1/128 trust
";

/// A running throwaway server; stopped (`pg_ctl stop -m immediate`) and
/// its directory removed on drop.
pub struct PgServer {
    bins: Binaries,
    /// Run server commands as `postgres` through runuser.
    as_postgres: bool,
    dir: tempfile::TempDir,
    /// 0 until started, and again after a start that failed for good.
    port: u16,
    settings: Vec<(String, String)>,
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
    /// Initializes and starts a server (see [`ServerOptions`]).
    pub fn start(opts: &ServerOptions<'_>) -> Result<PgServer, StartError> {
        Self::start_inner(opts, None)
    }

    /// Initializes and starts a server with `ssl=on` and `tls`'s
    /// certificate and key (see [`ServerTls`]).
    pub fn start_with_tls(
        opts: &ServerOptions<'_>,
        tls: &ServerTls<'_>,
    ) -> Result<PgServer, StartError> {
        Self::start_inner(opts, Some(tls))
    }

    fn start_inner(
        opts: &ServerOptions<'_>,
        tls: Option<&ServerTls<'_>>,
    ) -> Result<PgServer, StartError> {
        let unavailable = |why: &str| StartError::Unavailable(why.to_string());
        let bins = find_binaries().ok_or_else(|| {
            unavailable("the PostgreSQL server binaries (initdb, pg_ctl) were not found")
        })?;
        let as_postgres = running_as_root();
        if as_postgres && find_on_path("runuser").is_none() {
            return Err(unavailable("running as root and `runuser` was not found"));
        }
        let owner =
            if as_postgres {
                Some(postgres_user_ids().ok_or_else(|| {
                    unavailable("running as root and there is no `postgres` user")
                })?)
            } else {
                None
            };
        let mut builder = tempfile::Builder::new();
        builder.prefix("spool-pg-");
        let dir = match opts.parent {
            Some(parent) => {
                std::fs::create_dir_all(parent).map_err(|e| {
                    StartError::Failed(format!("creating {}: {e}", parent.display()))
                })?;
                builder.tempdir_in(parent)
            }
            None => builder.tempdir(),
        }
        .map_err(|e| StartError::Failed(format!("creating a server directory: {e}")))?;
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(dir.path(), Some(uid), Some(gid)).map_err(|e| {
                StartError::Failed(format!("chown {} to postgres: {e}", dir.path().display()))
            })?;
        }
        let mut server = PgServer {
            bins,
            as_postgres,
            dir,
            port: 0,
            settings: opts
                .settings
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        };
        let data = server.data_dir();
        let initdb = server
            .pg_command(
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
            )
            .map_err(StartError::Failed)?;
        if !initdb.status.success() {
            return Err(StartError::Failed(format!(
                "initdb failed ({})",
                describe(&initdb)
            )));
        }
        if let Some(tls) = tls {
            server.install_tls(tls, owner).map_err(StartError::Failed)?;
        }
        let mut last = String::new();
        for _ in 0..START_ATTEMPTS {
            server.port = free_port().map_err(StartError::Failed)?;
            let out = server.pg_ctl_start().map_err(StartError::Failed)?;
            if out.status.success() {
                return Ok(server);
            }
            last = describe(&out);
        }
        server.port = 0;
        let log = std::fs::read_to_string(server.log_file()).unwrap_or_default();
        Err(StartError::Failed(format!(
            "pg_ctl start failed {START_ATTEMPTS} times ({last}); server log: {}",
            log.trim()
        )))
    }

    /// Writes the certificate and key into the data directory (the
    /// server's default `server.crt`/`server.key`), turns `ssl` on and,
    /// when asked, makes `pg_hba.conf` TLS-only for TCP.
    fn install_tls(
        &mut self,
        tls: &ServerTls<'_>,
        owner: Option<(u32, u32)>,
    ) -> Result<(), String> {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let data = PathBuf::from(self.data_dir());
        let mut files = vec![
            ("server.crt", tls.cert_pem),
            // The server refuses a key others can read.
            ("server.key", tls.key_pem),
        ];
        if tls.hostssl_only {
            files.push(("pg_hba.conf", HBA_HOSTSSL_ONLY));
        }
        for (name, text) in files {
            let path = data.join(name);
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            f.write_all(text.as_bytes())
                .map_err(|e| format!("writing {}: {e}", path.display()))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::chown(&path, Some(uid), Some(gid))
                    .map_err(|e| format!("chown {} to postgres: {e}", path.display()))?;
            }
        }
        self.settings.push(("ssl".into(), "on".into()));
        Ok(())
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
        for (k, v) in &self.settings {
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

    fn pg_ctl_stop(&self, mode: &str) -> Result<Output, String> {
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
                &data,
            ],
        )
    }

    /// The server's loopback TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// A `key=value` connection string for database `postgres` over
    /// loopback TCP.
    pub fn tcp_conn_str(&self) -> String {
        format!(
            "host=127.0.0.1 port={} user=postgres dbname=postgres",
            self.port
        )
    }

    /// A `key=value` connection string for database `postgres` through
    /// the Unix socket when its path fits, else loopback TCP.
    pub fn socket_conn_str(&self) -> String {
        let socket = self.dir.path().join(format!(".s.PGSQL.{}", self.port));
        if socket.as_os_str().len() > UNIX_SOCKET_PATH_MAX {
            return self.tcp_conn_str();
        }
        format!(
            "host='{}' port={} user=postgres dbname=postgres",
            self.dir.path().display(),
            self.port
        )
    }

    /// Stops the server the hard way (like a crash: no checkpoint, open
    /// connections cut) and starts it again on the same port; WAL
    /// recovery runs on start.
    pub fn crash_restart(&self) -> Result<(), String> {
        let stop = self.pg_ctl_stop("immediate")?;
        if !stop.status.success() {
            return Err(format!(
                "pg_ctl stop -m immediate failed ({})",
                describe(&stop)
            ));
        }
        let start = self.pg_ctl_start()?;
        if !start.status.success() {
            return Err(format!(
                "pg_ctl start after a stop failed ({})",
                describe(&start)
            ));
        }
        Ok(())
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        if self.port == 0 {
            return;
        }
        // Immediate: the directory is removed next, nothing needs a
        // checkpoint.
        match self.pg_ctl_stop("immediate") {
            Ok(out) if out.status.success() => {}
            Ok(out) => eprintln!("warning: pg_ctl stop failed ({})", describe(&out)),
            Err(e) => eprintln!("warning: {e}"),
        }
    }
}
