//! Fault injection: fail the Nth call of a chosen kind.

use super::{Mapped, OpenMode, Vfs, VfsFile, VfsLock};
use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Which calls a [`FaultVfs`] plan counts and fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    /// `write_at`.
    Write,
    /// `sync_data`, `sync_all`, `sync_dir`.
    Sync,
    /// `rename`.
    Rename,
    /// `set_len`.
    Truncate,
    /// `open`, `remove`, `read_dir`, `create_dir_all`, `exists`, `lock`.
    Meta,
    /// `read_at`, `len`, `map`.
    Read,
    /// Every call of every kind above.
    Any,
}

#[derive(Debug, Clone, Copy)]
struct Plan {
    kind: FaultKind,
    nth: u64,
    persistent: bool,
    /// Fail with this OS error (e.g. ENOSPC) instead of a generic one.
    errno: Option<i32>,
}

#[derive(Debug, Default)]
struct State {
    plan: Mutex<Option<Plan>>,
    // Calls seen per kind (indexes follow `slot`), plus all calls.
    counts: [AtomicU64; 7],
    injected: AtomicU64,
    pause: Mutex<Pause>,
    pause_cond: Condvar,
}

/// A planned pause: the call of `kind` whose count reaches `at` blocks until resumed.
#[derive(Debug, Default)]
struct Pause {
    plan: Option<(FaultKind, u64)>,
    /// A call is blocked in the pause now.
    paused: bool,
}

fn slot(kind: FaultKind) -> usize {
    match kind {
        FaultKind::Write => 0,
        FaultKind::Sync => 1,
        FaultKind::Rename => 2,
        FaultKind::Truncate => 3,
        FaultKind::Meta => 4,
        FaultKind::Read => 5,
        FaultKind::Any => 6,
    }
}

impl State {
    /// Count a call of `kind`; `Err` when the plan says this call fails.
    fn check(&self, kind: FaultKind, what: &str) -> io::Result<()> {
        let n_kind = self.counts[slot(kind)].fetch_add(1, Ordering::SeqCst) + 1;
        let n_any = self.counts[slot(FaultKind::Any)].fetch_add(1, Ordering::SeqCst) + 1;
        self.maybe_pause(kind, n_kind, n_any);
        let plan = *self.plan.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(p) = plan {
            let n = if p.kind == FaultKind::Any {
                n_any
            } else if p.kind == kind {
                n_kind
            } else {
                return Ok(());
            };
            if n == p.nth || (p.persistent && n > p.nth) {
                self.injected.fetch_add(1, Ordering::SeqCst);
                if let Some(errno) = p.errno {
                    return Err(io::Error::from_raw_os_error(errno));
                }
                return Err(io::Error::other(format!(
                    "injected fault: {what} (call {n} of kind {:?})",
                    p.kind
                )));
            }
        }
        Ok(())
    }

    /// Block this call while a pause planned for it lasts.
    fn maybe_pause(&self, kind: FaultKind, n_kind: u64, n_any: u64) {
        let mut p = self.pause.lock().unwrap_or_else(|e| e.into_inner());
        let hit = match p.plan {
            Some((FaultKind::Any, at)) => n_any == at,
            Some((k, at)) => k == kind && n_kind == at,
            None => false,
        };
        if !hit {
            return;
        }
        p.paused = true;
        self.pause_cond.notify_all();
        while p.plan.is_some() {
            p = self.pause_cond.wait(p).unwrap_or_else(|e| e.into_inner());
        }
        p.paused = false;
    }
}

/// A [`Vfs`] that passes calls to an inner one and fails the Nth call of a kind.
#[derive(Debug, Clone)]
pub struct FaultVfs {
    inner: Arc<dyn Vfs>,
    state: Arc<State>,
}

impl FaultVfs {
    /// Wrap `inner` with no fault planned; calls are counted.
    pub fn new(inner: Arc<dyn Vfs>) -> FaultVfs {
        FaultVfs {
            inner,
            state: Arc::new(State::default()),
        }
    }

    /// Fail the `nth` (1-based, counted from now on as the counters are reset) call of
    /// `kind`; with `persistent` every later call of that kind fails too.
    pub fn fail_nth(&self, kind: FaultKind, nth: u64, persistent: bool) {
        self.plan(kind, nth, persistent, None);
    }

    /// As [`FaultVfs::fail_nth`], failing with the OS error `errno` (e.g. 28, ENOSPC on
    /// Linux: a full disk) instead of a generic error.
    pub fn fail_nth_with_os_error(&self, kind: FaultKind, nth: u64, persistent: bool, errno: i32) {
        self.plan(kind, nth, persistent, Some(errno));
    }

    fn plan(&self, kind: FaultKind, nth: u64, persistent: bool, errno: Option<i32>) {
        self.reset_counts();
        *self.state.plan.lock().unwrap_or_else(|e| e.into_inner()) = Some(Plan {
            kind,
            nth,
            persistent,
            errno,
        });
    }

    /// Remove any planned fault (counters keep counting).
    pub fn clear(&self) {
        *self.state.plan.lock().unwrap_or_else(|e| e.into_inner()) = None;
    }

    /// Reset every call counter to zero.
    pub fn reset_counts(&self) {
        for c in &self.state.counts {
            c.store(0, Ordering::SeqCst);
        }
    }

    /// Calls of `kind` seen since the last reset (`Any` = all calls).
    pub fn count(&self, kind: FaultKind) -> u64 {
        self.state.counts[slot(kind)].load(Ordering::SeqCst)
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.state.injected.load(Ordering::SeqCst)
    }

    /// Block the `nth` call of `kind` from now on (1-based, counted on the current
    /// counters) until [`FaultVfs::resume`]: a test holds a writer inside, say, its
    /// fdatasync while other threads line up behind it. The call then proceeds (or
    /// fails, if a fault is planned for it).
    pub fn pause_nth(&self, kind: FaultKind, nth: u64) {
        let at = self.count(kind) + nth;
        let mut p = self.state.pause.lock().unwrap_or_else(|e| e.into_inner());
        p.plan = Some((kind, at));
        p.paused = false;
    }

    /// Wait until a call is blocked in the planned pause; `false` after `timeout`.
    pub fn wait_paused(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let mut p = self.state.pause.lock().unwrap_or_else(|e| e.into_inner());
        while !p.paused {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            p = self
                .state
                .pause_cond
                .wait_timeout(p, deadline - now)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
        true
    }

    /// End the planned pause, letting a blocked call proceed.
    pub fn resume(&self) {
        self.state
            .pause
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .plan = None;
        self.state.pause_cond.notify_all();
    }
}

#[derive(Debug)]
struct FaultFile {
    inner: Arc<dyn VfsFile>,
    state: Arc<State>,
}

impl Vfs for FaultVfs {
    fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Arc<dyn VfsFile>> {
        self.state.check(FaultKind::Meta, "open")?;
        let inner = self.inner.open(path, mode)?;
        Ok(Arc::new(FaultFile {
            inner,
            state: self.state.clone(),
        }))
    }
    fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        self.state.check(FaultKind::Rename, "rename")?;
        self.inner.rename(from, to)
    }
    fn remove(&self, path: &Path) -> io::Result<()> {
        self.state.check(FaultKind::Meta, "remove")?;
        self.inner.remove(path)
    }
    fn read_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        self.state.check(FaultKind::Meta, "read_dir")?;
        self.inner.read_dir(dir)
    }
    fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        self.state.check(FaultKind::Meta, "create_dir_all")?;
        self.inner.create_dir_all(dir)
    }
    fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        self.state.check(FaultKind::Sync, "sync_dir")?;
        self.inner.sync_dir(dir)
    }
    fn exists(&self, path: &Path) -> io::Result<bool> {
        self.state.check(FaultKind::Meta, "exists")?;
        self.inner.exists(path)
    }
    fn lock(&self, path: &Path, create: bool) -> io::Result<Option<Box<dyn VfsLock>>> {
        self.state.check(FaultKind::Meta, "lock")?;
        self.inner.lock(path, create)
    }
}

impl VfsFile for FaultFile {
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.state.check(FaultKind::Read, "read_at")?;
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.state.check(FaultKind::Write, "write_at")?;
        self.inner.write_at(buf, offset)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.state.check(FaultKind::Sync, "sync_data")?;
        self.inner.sync_data()
    }
    fn sync_all(&self) -> io::Result<()> {
        self.state.check(FaultKind::Sync, "sync_all")?;
        self.inner.sync_all()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.state.check(FaultKind::Truncate, "set_len")?;
        self.inner.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        self.state.check(FaultKind::Read, "len")?;
        self.inner.len()
    }
    fn map(&self) -> io::Result<Mapped> {
        self.state.check(FaultKind::Read, "map")?;
        self.inner.map()
    }
    fn map_prefix(&self, len: u64) -> io::Result<Mapped> {
        self.state.check(FaultKind::Read, "map_prefix")?;
        self.inner.map_prefix(len)
    }
}
