//! The index thread of a durable store: computes a group's index writes
//! ([`Index::prepare`]) while the leader waits for the group's fdatasync.
//!
//! A durable group's cycle was pwrite, fdatasync, then the indexers, one after the
//! other, and the next group could not start before the cycle ended. The indexers
//! only read the index (never the log) and their writes stay invisible until
//! [`Index::publish`], so they do not need the commits to be durable: the leader hands
//! the group to this thread, waits for the fdatasync, then takes the writes back and
//! publishes them. A group's cycle becomes pwrite, the longer of the two, then the
//! publish. Only groups of at least `PREPARE_THREAD_COMMITS_MIN` (4) commits are
//! handed over: for a smaller one the two thread wake-ups cost about what it saves.
//!
//! The thread holds only a [`Weak`] reference to the store, taken for the length of
//! one job, so it never keeps a closed store alive; it ends when the store (which owns
//! the job channel's sender) is dropped. One job is in flight at a time: the leader
//! sends a group and receives it back before it releases leadership, so a group is
//! always prepared against an index holding every earlier group.

use crate::error::IndexError;
use crate::index::PreparedWrites;
use crate::store::Inner;
use crate::types::RecordedCommit;
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Weak;

/// A group handed back: its commits and the indexers' writes for them.
pub(crate) type Prepared = (Vec<RecordedCommit>, Result<PreparedWrites, IndexError>);

/// The leader's end of the index thread.
pub(crate) struct Preparer {
    jobs: Sender<Vec<RecordedCommit>>,
    done: Receiver<Prepared>,
}

impl Preparer {
    /// Start the thread for the store behind `inner`; `None` when no thread can be
    /// spawned (the leader then prepares its groups itself).
    pub(crate) fn spawn(inner: Weak<Inner>) -> Option<Preparer> {
        let (jobs, job_rx) = channel::<Vec<RecordedCommit>>();
        let (done_tx, done) = channel::<Prepared>();
        std::thread::Builder::new()
            .name("spool-prepare".into())
            .spawn(move || prepare_loop(inner, job_rx, done_tx))
            .ok()?;
        Some(Preparer { jobs, done })
    }

    /// Hand a group to the thread; gives the group back if the thread is gone.
    pub(crate) fn start(&self, commits: Vec<RecordedCommit>) -> Result<(), Vec<RecordedCommit>> {
        self.jobs.send(commits).map_err(|e| e.0)
    }

    /// Wait for the group handed over by the last [`Preparer::start`]; `None` if the
    /// thread stopped without answering (the store was dropped).
    pub(crate) fn finish(&self) -> Option<Prepared> {
        self.done.recv().ok()
    }
}

fn prepare_loop(inner: Weak<Inner>, jobs: Receiver<Vec<RecordedCommit>>, done: Sender<Prepared>) {
    while let Ok(commits) = jobs.recv() {
        let res = {
            // Dropped before the answer is sent: while the leader waits for it, the
            // store is alive through the leader, so this is never the last reference.
            let Some(inner) = inner.upgrade() else {
                return;
            };
            // A panicking indexer is already the group's error (`Index::prepare`
            // catches it); the leader treats a vanished thread as an index fault too.
            inner.index.prepare(&commits)
        };
        if done.send((commits, res)).is_err() {
            return;
        }
    }
}
