//! The readers' side of a rebuild of the index in place (a GC's): from the GC's
//! segment swap until its rebuild ends, the index answers from part of the log (or
//! from positions in retired segments). The public reads wait while a rebuild runs
//! and read again when one ran while they read — a sequence lock over the whole
//! index. Rebuilds are rare and writers are already held off by the GC; a read (and
//! each entry of a scan) pays a few atomic loads.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How many times a waiting reader yields before it sleeps a millisecond at a time
/// (a rebuild takes as long as applying the log).
const REBUILD_WAIT_YIELDS: u32 = 64;

#[derive(Debug, Default)]
pub(crate) struct RebuildGate {
    /// Twice the number of rebuilds finished since open, plus one while one runs.
    epoch: AtomicU64,
    /// A rebuild began but did not finish (it failed or panicked, and the store is
    /// poisoned): the index holds part of the log until a reopen.
    incomplete: AtomicBool,
}

/// Why a gated read cannot be answered: a rebuild did not finish.
#[derive(Debug)]
pub(crate) struct Incomplete;

impl RebuildGate {
    /// The epoch now, odd or not (what a GC plan is made at).
    pub(crate) fn epoch(&self) -> u64 {
        self.epoch.load(Ordering::Acquire)
    }

    /// The epoch once no rebuild runs; waits while one does.
    pub(crate) fn settled(&self) -> Result<u64, Incomplete> {
        let mut waits = 0u32;
        loop {
            let epoch = self.epoch.load(Ordering::Acquire);
            if self.incomplete.load(Ordering::Acquire) {
                return Err(Incomplete);
            }
            if epoch.is_multiple_of(2) {
                return Ok(epoch);
            }
            if waits < REBUILD_WAIT_YIELDS {
                std::thread::yield_now();
            } else {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            waits = waits.saturating_add(1);
        }
    }

    /// Whether a rebuild began and did not finish (reads must fail, not answer).
    pub(crate) fn is_incomplete(&self) -> bool {
        self.incomplete.load(Ordering::Acquire)
    }

    /// Whether a rebuild began since `settled` returned `epoch`: what was read
    /// meanwhile may be empty, partial or stale.
    pub(crate) fn moved_since(&self, epoch: u64) -> bool {
        self.epoch.load(Ordering::Acquire) != epoch
    }

    /// `read` once no rebuild runs, again until no rebuild began while it ran. `read`
    /// must have no effect a second run would repeat.
    pub(crate) fn read<T, E>(&self, mut read: impl FnMut() -> Result<T, E>) -> Result<T, E>
    where
        E: From<Incomplete>,
    {
        loop {
            let epoch = self.settled()?;
            let got = read();
            if !self.moved_since(epoch) {
                return got;
            }
        }
    }

    /// A rebuild begins (one at a time: the caller holds the GC lock).
    pub(crate) fn begin(&self) {
        let before = self.epoch.fetch_add(1, Ordering::AcqRel);
        debug_assert!(before.is_multiple_of(2), "one rebuild at a time");
    }

    /// The rebuild that began ends; `finished` = the index holds the whole log again.
    pub(crate) fn end(&self, finished: bool) {
        if !finished {
            self.incomplete.store(true, Ordering::Release);
        }
        let before = self.epoch.fetch_add(1, Ordering::AcqRel);
        debug_assert!(!before.is_multiple_of(2), "a rebuild ends after it began");
    }
}

impl From<Incomplete> for crate::error::IndexError {
    fn from(_: Incomplete) -> Self {
        crate::error::IndexError::Incomplete
    }
}

impl From<Incomplete> for crate::error::Error {
    fn from(e: Incomplete) -> Self {
        crate::error::Error::Index(e.into())
    }
}
