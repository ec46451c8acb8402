//! Staging a durable group's index writes on another thread while the group leader waits
//! for the group's fdatasync.
//!
//! With [`crate::Durability::Immediate`] a commit is acknowledged after its fdatasync and
//! after the index has it. Running the indexers after the fdatasync put their CPU on top
//! of the disk's latency; here a worker thread runs them ([`crate::index::Index::stage`])
//! into a private batch while the leader writes and syncs. The leader then publishes the
//! batch only if the sync succeeded, so no reader ever sees an unsynced commit through
//! the index, and drops it if the sync failed (the store is poisoned as before; no fsync
//! is retried).
//!
//! At most one job exists, and only during a leader's tenure: the leader always takes
//! the result back (waiting if the worker is running it, computing it itself if the
//! worker has not started it yet) before it gives up the leadership. So whoever waits
//! for "no leader" (GC, flush, close) also waits for the worker, and the worker never
//! stages a group before the previous group is published.

use crate::error::IndexError;
use crate::index::{Index, Staged};
use crate::store::Inner;
use crate::types::RecordedCommit;
use std::sync::{Condvar, Mutex, MutexGuard, Weak};
use std::thread::JoinHandle;

/// The job slot shared by the leader and the worker.
enum Slot {
    Empty,
    /// Submitted, not started: the leader may take it back.
    Queued(Vec<RecordedCommit>),
    /// The worker is staging it.
    Running,
    /// Staged: the commits (handed back) and the indexers' writes or their error.
    Done(Vec<RecordedCommit>, Result<Staged, IndexError>),
}

struct State {
    slot: Slot,
    stop: bool,
}

/// The worker and its job slot (see the module docs).
pub(crate) struct Stager {
    state: Mutex<State>,
    /// Wakes the worker (a job or stop) and the leader (a result).
    cond: Condvar,
    worker: Mutex<Option<JoinHandle<()>>>,
}

fn lock(m: &Mutex<State>) -> MutexGuard<'_, State> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Stager {
    pub(crate) fn new() -> Stager {
        Stager {
            state: Mutex::new(State {
                slot: Slot::Empty,
                stop: false,
            }),
            cond: Condvar::new(),
            worker: Mutex::new(None),
        }
    }

    /// Start the worker for `inner` (whose `stager` this is). Without a worker (the spawn
    /// failed) every job is staged by the leader itself in [`Stager::take`].
    pub(crate) fn start(&self, inner: Weak<Inner>) -> std::io::Result<()> {
        let handle = std::thread::Builder::new()
            .name("spool-stage".into())
            .spawn(move || worker_loop(inner))?;
        *self.worker.lock().unwrap_or_else(|e| e.into_inner()) = Some(handle);
        Ok(())
    }

    /// Hand `commits` to the worker. The slot must be empty (one job per leader).
    pub(crate) fn submit(&self, commits: Vec<RecordedCommit>) {
        let mut st = lock(&self.state);
        debug_assert!(matches!(st.slot, Slot::Empty), "one staging job at a time");
        st.slot = Slot::Queued(commits);
        drop(st);
        self.cond.notify_all();
    }

    /// The submitted commits and their staged writes: the worker's result, or staged on
    /// this thread when the worker has not picked the job up (a slow wake-up never costs
    /// more than staging inline).
    pub(crate) fn take(&self, index: &Index) -> (Vec<RecordedCommit>, Result<Staged, IndexError>) {
        let mut st = lock(&self.state);
        loop {
            match std::mem::replace(&mut st.slot, Slot::Empty) {
                Slot::Queued(commits) => {
                    drop(st);
                    let staged = stage_caught(index, &commits);
                    return (commits, staged);
                }
                Slot::Done(commits, staged) => return (commits, staged),
                Slot::Running => {
                    st.slot = Slot::Running;
                    st = self.cond.wait(st).unwrap_or_else(|e| e.into_inner());
                }
                Slot::Empty => {
                    debug_assert!(false, "take without a submitted job");
                    return (Vec::new(), Ok(Staged::default()));
                }
            }
        }
    }

    /// Stop the worker and wait for it (on close; no leader is active then).
    pub(crate) fn stop(&self) {
        lock(&self.state).stop = true;
        self.cond.notify_all();
        let handle = self.worker.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(h) = handle {
            let _ = h.join();
        }
    }
}

/// [`Index::stage`], where an indexer that panics fails the group like an indexer error
/// (the leader poisons the store) instead of leaving the leader waiting on the worker.
fn stage_caught(index: &Index, commits: &[RecordedCommit]) -> Result<Staged, IndexError> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| index.stage(commits)))
        .unwrap_or_else(|_| Err(IndexError::Mismatch("an indexer panicked".into())))
}

fn worker_loop(inner: Weak<Inner>) {
    loop {
        let commits = {
            let Some(strong) = inner.upgrade() else {
                return;
            };
            let stager = &strong.stager;
            let mut st = lock(&stager.state);
            loop {
                if st.stop {
                    return;
                }
                if matches!(st.slot, Slot::Queued(_)) {
                    break;
                }
                st = stager.cond.wait(st).unwrap_or_else(|e| e.into_inner());
            }
            let Slot::Queued(commits) = std::mem::replace(&mut st.slot, Slot::Running) else {
                continue;
            };
            commits
        };
        // The leader that submitted the job holds the store until it takes the result.
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let staged = stage_caught(&strong.index, &commits);
        let stager = &strong.stager;
        lock(&stager.state).slot = Slot::Done(commits, staged);
        stager.cond.notify_all();
    }
}
