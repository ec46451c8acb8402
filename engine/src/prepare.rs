//! The index thread of a durable store: computes a group's index writes
//! ([`Index::prepare`]) while the leader waits for the group's fdatasync.
//!
//! A durable group's cycle was pwrite, fdatasync, then the indexers, one after the
//! other, and the next group could not start before the cycle ended. The indexers
//! only read the index (never the log) and their writes stay invisible until
//! [`Index::publish`], so they do not need the commits to be durable: the leader hands
//! the group to this thread, waits for the fdatasync, then takes the writes back and
//! publishes them. A group's cycle becomes pwrite, the longer of the two, then the
//! publish.
//!
//! Which groups are handed over:
//! - a group of at least `PREPARE_THREAD_COMMITS_MIN` (4) commits, or of at least
//!   `PREPARE_THREAD_BYTES_MIN` (256 KiB) of frames (a fork's one large commit, whose
//!   fdatasync and indexers each take milliseconds), always;
//! - a smaller one (a lone writer's group holds one commit) only when the previous
//!   group ended at most [`Options::index_thread_poll`] ago (zero by default: never),
//!   i.e. when commits come back to back. Waking a sleeping thread, and being woken
//!   by it, costs about what preparing one commit does (on a virtual machine each
//!   wake-up is an interrupt to the other core), so after such a group the thread
//!   does not sleep at once: it polls the job channel for up to that long, and the
//!   next group reaches it without a wake-up on either side. A lone durable writer's
//!   indexers then run during its fdatasync. The cost is one more core kept busy
//!   while the writer writes back to back, and the benchmark's lone durable writer
//!   gained no clear margin over its peers, so it is off by default (see
//!   BENCHMARKS.md, Decisions).
//! - A poll that ends without a job (the writer paused, or the disk's fdatasync is
//!   longer than the window) makes the thread skip polling after the next 2, then 4,
//!   ... up to `POLL_BACKOFF_MAX` such groups; a poll that catches one resets that.
//!   So a writer slower than the window, or a slow disk, costs at most one window per
//!   `POLL_BACKOFF_MAX` groups. After any other group (many writers, every core busy
//!   encoding commits; or one large commit) the thread sleeps at once: polling after
//!   every group was slower with many writers.
//!
//! The thread holds only a [`Weak`] reference to the store, taken for the length of
//! one job, so it never keeps a closed store alive; it ends when the store (which owns
//! the job channel's sender) is dropped, polling or not. One job is in flight at a
//! time: the leader sends a group and receives it back before it releases leadership,
//! so a group is always prepared against an index holding every earlier group.

use crate::error::IndexError;
use crate::index::PreparedWrites;
use crate::store::Inner;
use crate::types::RecordedCommit;
#[cfg(test)]
use crate::types::INDEX_THREAD_POLL_MAX_US;
#[cfg(doc)]
use crate::{index::Index, Options};
use std::sync::atomic::Ordering;
use std::sync::mpsc::{channel, Receiver, Sender, TryRecvError};
use std::sync::Weak;
use std::time::{Duration, Instant};

/// Most small groups after which the thread skips polling, once polls keep ending
/// without a job (see the module docs).
const POLL_BACKOFF_MAX: u32 = 64;

/// A group, and whether the thread polls for the next one after it (see
/// [`Preparer::start`]).
type Job = (Vec<RecordedCommit>, bool);

/// A group handed back: its commits and the indexers' writes for them.
pub(crate) type Prepared = (Vec<RecordedCommit>, Result<PreparedWrites, IndexError>);

/// The leader's end of the index thread.
pub(crate) struct Preparer {
    jobs: Sender<Job>,
    done: Receiver<Prepared>,
}

impl Preparer {
    /// Start the thread for the store behind `inner`; `None` when no thread can be
    /// spawned (the leader then prepares its groups itself).
    /// `poll` is how long the thread polls for the next job when asked to (zero:
    /// never).
    pub(crate) fn spawn(inner: Weak<Inner>, poll: Duration) -> Option<Preparer> {
        let (jobs, job_rx) = channel::<Job>();
        let (done_tx, done) = channel::<Prepared>();
        std::thread::Builder::new()
            .name("spool-prepare".into())
            .spawn(move || prepare_loop(inner, job_rx, done_tx, Poll::new(poll)))
            .ok()?;
        Some(Preparer { jobs, done })
    }

    /// Hand a group to the thread; gives the group back if the thread is gone.
    /// `poll_after`: the thread polls for the next group once this one is done (a
    /// small group handed over because groups come back to back), instead of
    /// sleeping.
    pub(crate) fn start(
        &self,
        commits: Vec<RecordedCommit>,
        poll_after: bool,
    ) -> Result<(), Vec<RecordedCommit>> {
        self.jobs.send((commits, poll_after)).map_err(|e| e.0 .0)
    }

    /// Wait for the group handed over by the last [`Preparer::start`]; `None` if the
    /// thread stopped without answering (the store was dropped).
    pub(crate) fn finish(&self) -> Option<Prepared> {
        self.done.recv().ok()
    }
}

/// How the thread waits for its next job when asked to poll.
struct Poll {
    window: Duration,
    /// Small jobs still to come before the thread polls again.
    skip: u32,
    /// The next `skip` after a poll that ends without a job.
    backoff: u32,
}

impl Poll {
    fn new(window: Duration) -> Poll {
        Poll {
            window,
            skip: 0,
            backoff: 1,
        }
    }

    /// Whether to poll for the next job (else sleep until it comes).
    fn polls(&mut self) -> bool {
        if self.window.is_zero() {
            return false;
        }
        if self.skip > 0 {
            self.skip -= 1;
            return false;
        }
        true
    }

    /// After a poll: one that took a job resets the backoff; one that ended without
    /// a job skips the next `backoff` (doubled, at most `POLL_BACKOFF_MAX`) polls.
    fn polled(&mut self, took_job: bool) {
        if took_job {
            self.backoff = 1;
        } else {
            self.backoff = self.backoff.saturating_mul(2).min(POLL_BACKOFF_MAX);
            self.skip = self.backoff;
        }
    }

    /// The next job after one that asked for polling, and whether polling took it;
    /// `None` once the store is dropped.
    fn next(&mut self, jobs: &Receiver<Job>) -> (Option<Job>, bool) {
        if !self.polls() {
            return (jobs.recv().ok(), false);
        }
        let deadline = Instant::now() + self.window;
        loop {
            match jobs.try_recv() {
                Ok(job) => {
                    self.polled(true);
                    return (Some(job), true);
                }
                Err(TryRecvError::Disconnected) => return (None, false),
                Err(TryRecvError::Empty) => {}
            }
            if Instant::now() >= deadline {
                break;
            }
            std::hint::spin_loop();
        }
        self.polled(false);
        (jobs.recv().ok(), false)
    }
}

fn prepare_loop(inner: Weak<Inner>, jobs: Receiver<Job>, done: Sender<Prepared>, mut poll: Poll) {
    let (mut next, mut polled) = (jobs.recv().ok(), false);
    while let Some((commits, poll_after)) = next {
        let res = {
            // Dropped before the answer is sent: while the leader waits for it, the
            // store is alive through the leader, so this is never the last reference.
            let Some(inner) = inner.upgrade() else {
                return;
            };
            if polled {
                inner.counters.groups_polled.fetch_add(1, Ordering::Relaxed);
            }
            // A panicking indexer is already the group's error (`Index::prepare`
            // catches it); the leader treats a vanished thread as an index fault too.
            inner.index.prepare(&commits)
        };
        if done.send((commits, res)).is_err() {
            return;
        }
        (next, polled) = if poll_after {
            poll.next(&jobs)
        } else {
            (jobs.recv().ok(), false)
        };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_window_never_polls() {
        let mut p = Poll::new(Duration::ZERO);
        for _ in 0..3 {
            assert!(!p.polls());
        }
    }

    #[test]
    fn polls_that_miss_back_off_doubling_and_a_hit_resets_the_backoff() {
        let mut p = Poll::new(Duration::from_micros(200));
        assert!(p.polls());
        p.polled(false);
        // Two small jobs without polling, then a poll.
        assert_eq!((p.polls(), p.polls(), p.polls()), (false, false, true));
        p.polled(false);
        let skipped = std::iter::repeat_with(|| p.polls())
            .take_while(|polls| !polls)
            .count();
        assert_eq!(skipped, 4);
        // Misses in a row: the skip grows to its cap and stays there.
        for _ in 0..10 {
            p.polled(false);
        }
        let skipped = std::iter::repeat_with(|| p.polls())
            .take_while(|polls| !polls)
            .count();
        assert_eq!(skipped, POLL_BACKOFF_MAX as usize);
        // A hit: the next miss skips two again.
        p.polled(true);
        assert!(p.polls());
        p.polled(false);
        assert_eq!((p.polls(), p.polls(), p.polls()), (false, false, true));
    }

    #[test]
    fn next_takes_a_waiting_job_by_polling_and_ends_when_the_store_is_gone() {
        let (tx, rx) = channel::<Job>();
        let mut p = Poll::new(Duration::from_micros(INDEX_THREAD_POLL_MAX_US));
        tx.send((Vec::new(), true)).unwrap();
        assert!(matches!(p.next(&rx), (Some(_), true)));
        drop(tx);
        // Polling sees the closed channel at once (no wait for the window).
        assert!(matches!(p.next(&rx), (None, false)));
        let mut p = Poll::new(Duration::ZERO);
        let (tx, rx) = channel::<Job>();
        tx.send((Vec::new(), true)).unwrap();
        assert!(matches!(p.next(&rx), (Some(_), false)));
    }
}
