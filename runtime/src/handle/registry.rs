//! The process-wide writer registry: at most one writer handle per
//! (store identity, session id) at a time, and owner incarnations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

type Key = (String, String);

struct Registry {
    writers: Mutex<HashMap<Key, u64>>,
    released: Condvar,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry {
        writers: Mutex::new(HashMap::new()),
        released: Condvar::new(),
    })
}

/// A fresh owner incarnation (process-unique, never 0).
pub(crate) fn next_incarnation() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Why a writer slot was not acquired.
pub(crate) enum Refused {
    /// Held by this owner incarnation.
    Busy(u64),
    /// Still held when the wait ended.
    TimedOut { holder: u64, waited: Duration },
}

/// Takes the writer slot of `(identity, session)` for `owner`; with `wait`,
/// waits up to that long for the current holder to release it.
pub(crate) fn acquire(
    identity: &str,
    session: &str,
    owner: u64,
    wait: Option<Duration>,
) -> Result<(), Refused> {
    let r = registry();
    let key = (identity.to_string(), session.to_string());
    let start = Instant::now();
    let mut map = r.writers.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        match map.get(&key) {
            None => {
                map.insert(key, owner);
                return Ok(());
            }
            Some(&holder) => {
                let Some(limit) = wait else {
                    return Err(Refused::Busy(holder));
                };
                let waited = start.elapsed();
                if waited >= limit {
                    return Err(Refused::TimedOut { holder, waited });
                }
                map = r
                    .released
                    .wait_timeout(map, limit - waited)
                    .unwrap_or_else(|e| e.into_inner())
                    .0;
            }
        }
    }
}

/// Releases the slot if `owner` holds it.
pub(crate) fn release(identity: &str, session: &str, owner: u64) {
    let r = registry();
    let key = (identity.to_string(), session.to_string());
    let mut map = r.writers.lock().unwrap_or_else(|e| e.into_inner());
    if map.get(&key) == Some(&owner) {
        map.remove(&key);
        r.released.notify_all();
    }
}

/// The owner holding the slot, if any.
pub(crate) fn holder(identity: &str, session: &str) -> Option<u64> {
    let key = (identity.to_string(), session.to_string());
    registry()
        .writers
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&key)
        .copied()
}
