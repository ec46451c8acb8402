//! The process-wide writer registry: at most one writer handle per
//! (store identity, session id) at a time, and owner incarnations.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// The holders of one store's sessions: session id to owner incarnation.
type Sessions = foldhash::HashMap<String, u64>;

struct Registry {
    /// Store identity to its sessions' holders. Nested so that a lookup
    /// borrows the two strings (every write checks its slot, see
    /// [`holder`]): a tuple key cost two allocations and two SipHash
    /// passes over a path-long identity per append.
    writers: Mutex<foldhash::HashMap<String, Sessions>>,
    released: Condvar,
}

fn registry() -> &'static Registry {
    static R: OnceLock<Registry> = OnceLock::new();
    R.get_or_init(|| Registry {
        writers: Mutex::new(foldhash::HashMap::default()),
        released: Condvar::new(),
    })
}

/// The holder of `(identity, session)` in `map`.
fn held(map: &foldhash::HashMap<String, Sessions>, identity: &str, session: &str) -> Option<u64> {
    map.get(identity).and_then(|s| s.get(session)).copied()
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
    let start = Instant::now();
    let mut map = r.writers.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        match held(&map, identity, session) {
            None => {
                map.entry(identity.to_string())
                    .or_default()
                    .insert(session.to_string(), owner);
                return Ok(());
            }
            Some(holder) => {
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
    let mut map = r.writers.lock().unwrap_or_else(|e| e.into_inner());
    let Some(sessions) = map.get_mut(identity) else {
        return;
    };
    if sessions.get(session) == Some(&owner) {
        sessions.remove(session);
        if sessions.is_empty() {
            map.remove(identity);
        }
        r.released.notify_all();
    }
}

/// The owner holding the slot, if any.
pub(crate) fn holder(identity: &str, session: &str) -> Option<u64> {
    let map = registry().writers.lock().unwrap_or_else(|e| e.into_inner());
    held(&map, identity, session)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Slots are per (identity, session): the same session id in another
    /// store, or another session in the same store, is a separate slot; a
    /// release by anyone but the holder changes nothing.
    #[test]
    fn a_slot_is_held_per_store_and_session_until_its_holder_releases_it() {
        let (a, b) = ("/registry-test/store-a", "/registry-test/store-b");
        let (o1, o2, o3) = (next_incarnation(), next_incarnation(), next_incarnation());
        assert!(acquire(a, "s", o1, None).is_ok());
        assert!(acquire(b, "s", o2, None).is_ok());
        assert!(acquire(a, "t", o3, None).is_ok());
        assert!(matches!(acquire(a, "s", o2, None), Err(Refused::Busy(h)) if h == o1));
        assert!(matches!(
            acquire(a, "s", o2, Some(Duration::from_millis(1))),
            Err(Refused::TimedOut { holder, .. }) if holder == o1
        ));
        assert_eq!(holder(a, "s"), Some(o1));
        assert_eq!(holder(b, "s"), Some(o2));
        assert_eq!(holder(a, "t"), Some(o3));
        assert_eq!(holder(b, "t"), None);
        release(a, "s", o2);
        assert_eq!(holder(a, "s"), Some(o1));
        release(a, "s", o1);
        assert_eq!(holder(a, "s"), None);
        assert_eq!(holder(a, "t"), Some(o3));
        release(a, "t", o3);
        release(b, "s", o2);
        assert_eq!(holder(b, "s"), None);
        assert!(acquire(a, "s", o2, None).is_ok());
        release(a, "s", o2);
    }
}
