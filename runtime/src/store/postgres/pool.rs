//! A small connection pool and the classification of client errors.
//!
//! The pool keeps at most `idle_max` idle connections; under more
//! concurrency it opens extra ones and closes them when they come back.
//! A connection that failed with a connection-level error is never put
//! back, so after a server restart every pooled connection is replaced on
//! its first use.
//!
//! # Inside a tokio runtime
//!
//! The blocking client drives each request on a runtime of its own, which
//! tokio refuses to start (or shut down) on a thread that is already
//! running one. [`off_runtime`] runs such work on a scoped thread when
//! the calling thread is inside a runtime, and in place otherwise; every
//! use of a [`Client`] — connecting, requests, closing — goes through it.

use std::sync::Mutex;

use postgres::error::SqlState;
use postgres::{Client, Config};

use super::tls::{self, TlsSetup};

/// Runs `f` where the blocking client may block: in place, or — when this
/// thread is inside a tokio runtime (a task, `block_on`, a
/// `spawn_blocking` closure) — on a scoped thread, waiting for it. The
/// only error is failing to start that thread.
pub fn off_runtime<T: Send>(f: impl FnOnce() -> T + Send) -> std::io::Result<T> {
    if tokio::runtime::Handle::try_current().is_err() {
        return Ok(f());
    }
    std::thread::scope(|s| {
        let worker = std::thread::Builder::new()
            .name("spool-postgres".into())
            .spawn_scoped(s, f)?;
        match worker.join() {
            Ok(v) => Ok(v),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// Whether `e` says the connection (or the server) went away, so the same
/// request on a new connection may succeed: a closed connection, an I/O
/// error, a connection exception (SQLSTATE class 08), the server shutting
/// down or starting up (57P01..57P03), or too many connections (53300).
pub fn is_connection_error(e: &postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(code) = e.code() {
        let c = code.code();
        return c.starts_with("08")
            || matches!(c, "57P01" | "57P02" | "57P03")
            || *code == SqlState::TOO_MANY_CONNECTIONS;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if s.is::<std::io::Error>() {
            return true;
        }
        source = s.source();
    }
    false
}

/// Whether a failed connection attempt may succeed later: anything but an
/// answer from the server that is not about it being unavailable (a bad
/// password, an unknown database, ...).
pub fn is_transient_connect_error(e: &postgres::Error) -> bool {
    match e.as_db_error() {
        // TLS refusing the server (a certificate check) or the server
        // refusing TLS will not change on a retry.
        None => tls::rejection(e).is_none() && !is_tls_unsupported(e),
        Some(_) => is_connection_error(e),
    }
}

/// Whether the server answered that it has no TLS (under a mode that
/// requires it). The client reports this as a bare message.
pub fn is_tls_unsupported(e: &postgres::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(s) = cur {
        if s.to_string().contains("server does not support TLS") {
            return true;
        }
        cur = s.source();
    }
    false
}

/// Whether the transaction lost a serialization race or a deadlock and may
/// simply be run again.
pub fn is_retryable_transaction_error(e: &postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

pub struct Pool {
    config: Config,
    tls: TlsSetup,
    idle: Mutex<Vec<Client>>,
    idle_max: usize,
}

impl Pool {
    /// `config`'s own TLS mode is replaced by `tls`'s.
    pub fn new(mut config: Config, tls: TlsSetup, idle_max: usize) -> Pool {
        config.ssl_mode(tls.client_mode());
        Pool {
            config,
            tls,
            idle: Mutex::new(Vec::new()),
            idle_max,
        }
    }

    /// The TLS settings connections are made with.
    pub fn tls_mode(&self) -> tls::SslMode {
        self.tls.mode
    }

    /// An idle connection that is not known to be closed, or a new one.
    /// Call it off any tokio runtime ([`off_runtime`]).
    pub fn get(&self) -> Result<Client, postgres::Error> {
        loop {
            let pooled = match self.idle.lock() {
                Ok(mut idle) => idle.pop(),
                // A panic while holding the lock cannot leave the Vec
                // inconsistent; keep using it.
                Err(poisoned) => poisoned.into_inner().pop(),
            };
            match pooled {
                Some(c) if c.is_closed() => continue,
                Some(c) => return Ok(c),
                None => return self.config.connect(self.tls.connector.clone()),
            }
        }
    }

    /// Returns a connection after a request that did not fail at the
    /// connection level.
    pub fn put(&self, client: Client) {
        if client.is_closed() {
            return;
        }
        let mut idle = match self.idle.lock() {
            Ok(idle) => idle,
            Err(poisoned) => poisoned.into_inner(),
        };
        if idle.len() < self.idle_max {
            idle.push(client);
        }
    }

    /// Drops every idle connection (they are closed on drop, off any
    /// tokio runtime).
    pub fn clear(&self) {
        let drained: Vec<Client> = match self.idle.lock() {
            Ok(mut idle) => idle.drain(..).collect(),
            Err(poisoned) => poisoned.into_inner().drain(..).collect(),
        };
        close(drained);
    }
}

/// Closes connections off any tokio runtime. Should no thread start for
/// that, they are leaked rather than closed where closing would panic;
/// the server drops them when their sockets go.
fn close(clients: Vec<Client>) {
    if clients.is_empty() {
        return;
    }
    let mut slot = Some(clients);
    if off_runtime(|| drop(slot.take())).is_err() {
        std::mem::forget(slot.take());
    }
}

impl Drop for Pool {
    fn drop(&mut self) {
        let idle = match self.idle.get_mut() {
            Ok(idle) => std::mem::take(idle),
            Err(poisoned) => std::mem::take(poisoned.into_inner()),
        };
        close(idle);
    }
}
