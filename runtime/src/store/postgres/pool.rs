//! A small connection pool and the classification of client errors.
//!
//! The pool keeps at most `idle_max` idle connections; under more
//! concurrency it opens extra ones and closes them when they come back.
//! A connection that failed with a connection-level error is never put
//! back, so after a server restart every pooled connection is replaced on
//! its first use.

use std::sync::Mutex;

use postgres::error::SqlState;
use postgres::{Client, Config, NoTls};

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
        None => true,
        Some(_) => is_connection_error(e),
    }
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
    idle: Mutex<Vec<Client>>,
    idle_max: usize,
}

impl Pool {
    pub fn new(config: Config, idle_max: usize) -> Pool {
        Pool {
            config,
            idle: Mutex::new(Vec::new()),
            idle_max,
        }
    }

    /// An idle connection that is not known to be closed, or a new one.
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
                None => return self.config.connect(NoTls),
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

    /// Drops every idle connection (they are closed on drop).
    pub fn clear(&self) {
        let drained: Vec<Client> = match self.idle.lock() {
            Ok(mut idle) => idle.drain(..).collect(),
            Err(poisoned) => poisoned.into_inner().drain(..).collect(),
        };
        drop(drained);
    }
}
