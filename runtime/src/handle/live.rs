//! [`SessionHandle`]: opening, the snapshot swap, transcript-level writes
//! and publication.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::registry::{self, Refused};
use super::snapshot::{self, ResidentSnapshot, Reuse};
use super::{HandleError, HandleOptions};
use crate::hooks::{HandleWrite, HookStage, SessionHookStack};
use crate::observer::{EventSink, RuntimeEvent};
use crate::session::{SessionEvent, SessionId, SessionStatus};
use crate::store::{FullLoadBackend, TranscriptBackend};
use crate::store::{SessionStore, StoreError};
use crate::transcript::{now_ms, Budget, Entry, EntryId, EntryKind, EntrySource};

const OPEN: u8 = 0;
const CLOSED: u8 = 1;
const INVALIDATED: u8 = 2;

/// What a handle tells its subscribers, after the snapshot is published.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum HandleEvent {
    /// A replacement snapshot was published after a committed write (or a
    /// refresh); `cause` names the operation (`append`, `move_leaf`,
    /// `rewrite`, `refresh`, ...).
    Published {
        snapshot: Arc<ResidentSnapshot>,
        cause: &'static str,
    },
}

type Subscriber = Box<dyn Fn(&HandleEvent) + Send + Sync>;

/// Where a handle's backend comes from.
enum Backend {
    /// The store implements [`TranscriptBackend`] itself.
    Native(Arc<dyn SessionStore>),
    Adapter(FullLoadBackend),
}

pub(crate) struct Inner {
    pub(crate) id: SessionId,
    backend: Backend,
    events: Arc<dyn EventSink>,
    /// The hooks whose BeforeHandleWrite stage runs before every commit
    /// (none for a handle opened with [`SessionHandle::open`]).
    hooks: SessionHookStack,
    pub(crate) budget: Budget,
    writer: bool,
    pub(crate) owner: u64,
    identity: String,
    snapshot: RwLock<Arc<ResidentSnapshot>>,
    state: AtomicU8,
    write: Mutex<()>,
    revision: AtomicU64,
    pub(crate) rewrite_slot: AtomicBool,
    fail_next_publication: AtomicBool,
    /// Publications built by extending the previous snapshot (the rest
    /// were built through the backend).
    extended: AtomicU64,
    subscribers: RwLock<Vec<Subscriber>>,
    /// The last head a read found, at the backend's change mark it was
    /// read after (see [`super::reads`]).
    pub(crate) read_tip: Mutex<Option<super::reads::ReadTip>>,
}

impl Backend {
    fn get(&self, id: &SessionId) -> Result<&dyn TranscriptBackend, HandleError> {
        match self {
            Backend::Adapter(a) => Ok(a),
            Backend::Native(s) => s.transcript_backend().ok_or_else(|| {
                HandleError::Store(StoreError::InvalidSession {
                    id: id.clone(),
                    reason: "the store offers no transcript backend".into(),
                })
            }),
        }
    }
}

impl Inner {
    pub(crate) fn backend(&self) -> Result<&dyn TranscriptBackend, HandleError> {
        self.backend.get(&self.id)
    }

    /// Open and (for writers) still the registered writer.
    pub(crate) fn alive(&self) -> bool {
        if self.state.load(Ordering::Acquire) != OPEN {
            return false;
        }
        !self.writer || registry::holder(&self.identity, self.id.as_str()) == Some(self.owner)
    }

    pub(crate) fn owner_lost(&self) -> HandleError {
        HandleError::OwnerLost {
            id: self.id.clone(),
        }
    }

    /// Checks the authority to write: open, a writer, still registered.
    pub(crate) fn check_writer(&self) -> Result<(), HandleError> {
        if !self.writer {
            return Err(HandleError::ReadOnly {
                id: self.id.clone(),
            });
        }
        if !self.alive() {
            return Err(self.owner_lost());
        }
        Ok(())
    }

    pub(crate) fn snapshot(&self) -> Arc<ResidentSnapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub(crate) fn lock_writes(&self) -> MutexGuard<'_, ()> {
        self.write.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn shut(&self, state: u8) {
        let was = self.state.swap(state, Ordering::AcqRel);
        if was == OPEN && self.writer {
            registry::release(&self.identity, self.id.as_str(), self.owner);
        }
        if was == INVALIDATED {
            // Stay invalidated (a later close does not hide the failure).
            self.state.store(INVALIDATED, Ordering::Release);
        }
    }

    /// Commits `events` under the session version fence `expected`, then
    /// publishes the replacement snapshot (see the module docs of
    /// [`super`]). The caller holds the write lock and checked authority.
    pub(crate) fn commit(
        &self,
        expected: u64,
        events: Vec<SessionEvent>,
        reuse: ReusePlan,
        cause: &'static str,
    ) -> Result<Arc<ResidentSnapshot>, HandleError> {
        self.commit_events(expected, events, reuse, false, cause)
    }

    /// [`Inner::commit`]; `appended`: the events are exactly one
    /// `EntryAppended` per entry of `reuse.fresh`, in order, so the
    /// replacement snapshot may be extended from the previous one (see
    /// [`snapshot::extend`]).
    fn commit_events(
        &self,
        expected: u64,
        events: Vec<SessionEvent>,
        reuse: ReusePlan,
        appended: bool,
        cause: &'static str,
    ) -> Result<Arc<ResidentSnapshot>, HandleError> {
        let backend = self.backend()?;
        self.run_hooks(expected, &events, cause)?;
        // The write lock is held: the published snapshot is the one whose
        // session version is the fence (checked below before it is used).
        let at = self.snapshot();
        let receipt = if at.session_version == expected {
            backend.append_events_at(&self.id, expected, at.version, events)
        } else {
            backend.append_events(&self.id, expected, events)
        };
        drop(at);
        let receipt = receipt.map_err(|e| match e {
            StoreError::Conflict {
                expected, actual, ..
            } => HandleError::Conflict {
                id: self.id.clone(),
                expected,
                actual,
            },
            StoreError::NotFound { .. } => HandleError::NotFound {
                id: self.id.clone(),
            },
            other => HandleError::Store(other),
        })?;
        // Committed: from here on a failure invalidates the handle and the
        // write is never replayed.
        let prev = self.snapshot();
        let published = if self.fail_next_publication.swap(false, Ordering::AcqRel) {
            Err("publication failure injected by a test hook".to_string())
        } else {
            let revision = self.revision.fetch_add(1, Ordering::AcqRel) + 1;
            // The common case: plain appends under the fence of `prev`
            // (the write lock is held, so `prev` is the snapshot whose
            // version was the fence). The receipt's version being the next
            // one means nothing else committed in between, so the new
            // state is `prev` plus these entries, and the receipt gives the
            // transcript version: no read.
            let extended = if appended
                && prev.session_version == expected
                && Some(receipt.session_version) == expected.checked_add(1)
            {
                snapshot::extend(&prev, &receipt, &reuse.fresh, self.owner, revision)
            } else {
                None
            };
            match extended {
                Some(snap) => {
                    self.extended.fetch_add(1, Ordering::Relaxed);
                    Ok(snap)
                }
                None => {
                    let r = Reuse {
                        prev: &prev,
                        fresh: &reuse.fresh,
                        changed: reuse.changed,
                        generation: reuse.generation,
                        links: reuse.links,
                    };
                    snapshot::build(
                        backend,
                        &self.id,
                        self.budget,
                        self.owner,
                        revision,
                        Some(&r),
                    )
                    .map_err(|e| e.to_string())
                }
            }
        };
        match published {
            Ok(snap) => {
                let snap = Arc::new(snap);
                *self.snapshot.write().unwrap_or_else(|e| e.into_inner()) = snap.clone();
                self.notify(&snap, cause);
                self.saved(receipt.session_version, snap.header.status);
                Ok(snap)
            }
            Err(reason) => {
                self.shut(INVALIDATED);
                self.saved(receipt.session_version, prev.header.status);
                Err(HandleError::PublicationFailed {
                    id: self.id.clone(),
                    committed_version: receipt.session_version,
                    reason,
                })
            }
        }
    }

    /// The BeforeHandleWrite stage: every hook sees the write; the first
    /// failure is reported as `SessionHookFailed` and refuses the write
    /// before anything is committed.
    fn run_hooks(
        &self,
        expected: u64,
        events: &[SessionEvent],
        cause: &'static str,
    ) -> Result<(), HandleError> {
        let write = HandleWrite {
            session_id: &self.id,
            cause,
            events,
            expected_version: expected,
        };
        self.hooks.run_handle_write(&write).map_err(|f| {
            let stage = HookStage::BeforeHandleWrite;
            self.events.emit(&RuntimeEvent::SessionHookFailed {
                session_id: self.id.clone(),
                stage,
                hook: f.hook.clone(),
                error: f.error.to_string(),
            });
            HandleError::HookFailed {
                id: self.id.clone(),
                stage,
                hook: f.hook,
                source: Box::new(f.error),
            }
        })
    }

    fn notify(&self, snap: &Arc<ResidentSnapshot>, cause: &'static str) {
        let ev = HandleEvent::Published {
            snapshot: snap.clone(),
            cause,
        };
        for s in self
            .subscribers
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
        {
            s(&ev);
        }
    }

    fn saved(&self, version: u64, status: SessionStatus) {
        self.events.emit(&RuntimeEvent::SessionSaved {
            session_id: self.id.clone(),
            version,
            status,
        });
    }
}

/// What a publication may reuse from the previous snapshot.
pub(crate) struct ReusePlan {
    /// Shared with the published snapshot, which keeps them as they are.
    pub fresh: Vec<Arc<Entry>>,
    pub changed: HashSet<EntryId>,
    pub generation: u64,
    pub links: bool,
}

/// A live session handle. See the [module docs](super).
pub struct SessionHandle {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for SessionHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionHandle")
            .field("session", &self.inner.id)
            .field("owner", &self.inner.owner)
            .field("writer", &self.inner.writer)
            .finish_non_exhaustive()
    }
}

impl Drop for SessionHandle {
    fn drop(&mut self) {
        self.inner.shut(CLOSED);
    }
}

impl SessionHandle {
    /// Opens a handle on `id` (see [`HandleOptions`]) that reports its
    /// commits to `events` and runs no hooks.
    /// [`SessionRuntime::open_handle`](crate::SessionRuntime::open_handle)
    /// opens handles whose writes run the runtime's hooks.
    pub fn open(
        store: Arc<dyn SessionStore>,
        events: Arc<dyn EventSink>,
        id: &SessionId,
        opts: HandleOptions,
    ) -> Result<SessionHandle, HandleError> {
        Self::open_with_hooks(store, events, SessionHookStack::empty(), id, opts)
    }

    /// [`SessionHandle::open`]; every write runs the BeforeHandleWrite
    /// stage of `hooks` before it is committed.
    pub(crate) fn open_with_hooks(
        store: Arc<dyn SessionStore>,
        events: Arc<dyn EventSink>,
        hooks: SessionHookStack,
        id: &SessionId,
        opts: HandleOptions,
    ) -> Result<SessionHandle, HandleError> {
        let backend = if store.transcript_backend().is_some() {
            Backend::Native(store)
        } else {
            Backend::Adapter(FullLoadBackend::new(store))
        };
        // The identity keys the writer registry; read-only handles never
        // touch it (and computing it may cost a system call per open).
        let identity = if opts.writer {
            backend.get(id)?.identity()
        } else {
            String::new()
        };
        let owner = registry::next_incarnation();
        if opts.writer {
            registry::acquire(&identity, id.as_str(), owner, opts.wait_for_writer).map_err(
                |r| match r {
                    Refused::Busy(holder) => HandleError::WriterBusy {
                        id: id.clone(),
                        holder,
                    },
                    Refused::TimedOut { holder, waited } => HandleError::WriterTimeout {
                        id: id.clone(),
                        holder,
                        waited_ms: u64::try_from(waited.as_millis()).unwrap_or(u64::MAX),
                    },
                },
            )?;
        }
        // Until the handle exists, a failure releases the slot taken above.
        let mut guard = ReleaseOnError {
            identity: identity.clone(),
            id: id.clone(),
            owner,
            armed: opts.writer,
        };
        let snap = snapshot::build(backend.get(id)?, id, opts.budget, owner, 1, None)?;
        let inner = Inner {
            id: id.clone(),
            backend,
            events,
            hooks,
            budget: opts.budget,
            writer: opts.writer,
            owner,
            identity,
            snapshot: RwLock::new(Arc::new(snap)),
            state: AtomicU8::new(OPEN),
            write: Mutex::new(()),
            revision: AtomicU64::new(1),
            rewrite_slot: AtomicBool::new(false),
            fail_next_publication: AtomicBool::new(false),
            extended: AtomicU64::new(0),
            subscribers: RwLock::new(Vec::new()),
            read_tip: Mutex::new(None),
        };
        // The handle's Drop releases the slot from now on.
        guard.armed = false;
        Ok(SessionHandle {
            inner: Arc::new(inner),
        })
    }

    /// The current snapshot (a shared, immutable `Arc`).
    pub fn snapshot(&self) -> Arc<ResidentSnapshot> {
        self.inner.snapshot()
    }

    pub fn session_id(&self) -> &SessionId {
        &self.inner.id
    }

    /// This handle's owner incarnation (process-unique).
    pub fn owner(&self) -> u64 {
        self.inner.owner
    }

    pub fn budget(&self) -> Budget {
        self.inner.budget
    }

    pub fn is_writer(&self) -> bool {
        self.inner.writer
    }

    /// Open, not invalidated, and (for a writer) still the registered
    /// writer.
    pub fn is_open(&self) -> bool {
        self.inner.alive()
    }

    /// Closes the handle (as dropping it does): the writer slot is
    /// released; reads and preparations bound to it report owner lost.
    pub fn close(self) {
        self.inner.shut(CLOSED);
    }

    /// Calls `f` after every publication (after the snapshot is swapped,
    /// before the runtime's `SessionSaved`). Keep it cheap.
    pub fn subscribe(&self, f: impl Fn(&HandleEvent) + Send + Sync + 'static) {
        self.inner
            .subscribers
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .push(Box::new(f));
    }

    /// Test hook: the next publication after a committed write fails (the
    /// write stays committed, the handle is invalidated).
    #[cfg(feature = "test-hooks")]
    pub fn fail_next_publication(&self) {
        self.inner
            .fail_next_publication
            .store(true, Ordering::Release);
    }

    /// Test hook: how many publications of this handle were extended from
    /// the previous snapshot without reading entries from the backend.
    #[cfg(feature = "test-hooks")]
    pub fn extended_publications(&self) -> u64 {
        self.inner.extended.load(Ordering::Relaxed)
    }

    /// One entry, byte-exact: from the snapshot when resident, else read
    /// from storage (operation-owned; nothing is cached in the handle).
    pub fn entry(&self, id: &EntryId) -> Result<Option<Entry>, HandleError> {
        if !self.inner.alive() {
            return Err(self.inner.owner_lost());
        }
        let snap = self.snapshot();
        if let Some(e) = snap.get(id) {
            return Ok(Some(e.clone()));
        }
        let backend = self.inner.backend()?;
        let source = backend.source(&self.inner.id)?;
        Ok(source.entry(id)?.map(|e| e.into_owned()))
    }

    /// Republishes the snapshot from the store's live head (after another
    /// writer committed, or to reset the resident set). Works on
    /// read-only handles too.
    pub fn refresh(&self) -> Result<Arc<ResidentSnapshot>, HandleError> {
        let _w = self.inner.lock_writes();
        if !self.inner.alive() {
            return Err(self.inner.owner_lost());
        }
        let revision = self.inner.revision.fetch_add(1, Ordering::AcqRel) + 1;
        let snap = Arc::new(snapshot::build(
            self.inner.backend()?,
            &self.inner.id,
            self.inner.budget,
            self.inner.owner,
            revision,
            None,
        )?);
        *self
            .inner
            .snapshot
            .write()
            .unwrap_or_else(|e| e.into_inner()) = snap.clone();
        self.inner.notify(&snap, "refresh");
        Ok(snap)
    }

    // ---- writes ---------------------------------------------------------

    fn prepare_write(&self) -> Result<(MutexGuard<'_, ()>, Arc<ResidentSnapshot>), HandleError> {
        let guard = self.inner.lock_writes();
        self.inner.check_writer()?;
        let snap = self.snapshot();
        if snap.header.status == SessionStatus::Deleted {
            return Err(HandleError::Deleted {
                id: self.inner.id.clone(),
            });
        }
        Ok((guard, snap))
    }

    fn unknown(&self, entry: &EntryId) -> HandleError {
        HandleError::UnknownEntry {
            id: self.inner.id.clone(),
            entry: entry.clone(),
        }
    }

    /// Appends an entry of `kind` under the current leaf; it becomes the
    /// leaf. Returns its id.
    pub fn append(&self, kind: EntryKind) -> Result<EntryId, HandleError> {
        let ids = self.append_entries(vec![kind])?;
        ids.into_iter().next().ok_or(HandleError::Raced {
            id: self.inner.id.clone(),
        })
    }

    /// Appends a chain of entries under the current leaf in ONE commit
    /// (each the child of the previous one); the last becomes the leaf.
    /// Returns their ids. Bulk imports use it to build long histories
    /// quickly.
    pub fn append_entries(&self, kinds: Vec<EntryKind>) -> Result<Vec<EntryId>, HandleError> {
        let (_w, snap) = self.prepare_write()?;
        let backend = self.inner.backend()?;
        let source = backend.source(&self.inner.id)?;
        let mut parent = snap.leaf.clone();
        let mut taken: HashSet<EntryId> = HashSet::new();
        let mut entries = Vec::with_capacity(kinds.len());
        let ts = now_ms();
        for kind in kinds {
            let id = fresh_id(&*source, &taken)?;
            taken.insert(id.clone());
            let e = Entry {
                id: id.clone(),
                parent_id: parent.clone(),
                timestamp_ms: ts,
                kind,
            };
            parent = Some(id);
            entries.push(e);
        }
        drop(source);
        self.commit_entries(&snap, entries, "append")
    }

    /// Appends `entry` as given (its parent must exist or be `None`, its
    /// id must be new); it becomes the leaf.
    pub fn append_entry(&self, entry: Entry) -> Result<EntryId, HandleError> {
        let (_w, snap) = self.prepare_write()?;
        {
            let backend = self.inner.backend()?;
            let source = backend.source(&self.inner.id)?;
            // A new id is looked up in the index alone (its key filter
            // answers a new id in memory): searching the resident entries
            // first would cost a comparison per resident entry for an id
            // that is almost never there.
            if source.facts(&entry.id)?.is_some() {
                return Err(HandleError::DuplicateEntry {
                    id: self.inner.id.clone(),
                    entry: entry.id.clone(),
                });
            }
            if let Some(p) = &entry.parent_id {
                if !exists(&snap, &*source, p)? {
                    return Err(self.unknown(p));
                }
            }
        }
        let id = entry.id.clone();
        self.commit_entries(&snap, vec![entry], "append")?;
        Ok(id)
    }

    fn commit_entries(
        &self,
        snap: &ResidentSnapshot,
        entries: Vec<Entry>,
        cause: &'static str,
    ) -> Result<Vec<EntryId>, HandleError> {
        let ids: Vec<EntryId> = entries.iter().map(|e| e.id.clone()).collect();
        let events = entries
            .iter()
            .map(|e| SessionEvent::EntryAppended { entry: e.clone() })
            .collect();
        // The snapshot keeps the entries as they are (no second copy).
        let entries: Vec<Arc<Entry>> = entries.into_iter().map(Arc::new).collect();
        self.inner.commit_events(
            snap.session_version,
            events,
            ReusePlan {
                fresh: entries,
                changed: HashSet::new(),
                generation: snap.version.generation,
                links: true,
            },
            true,
            cause,
        )?;
        Ok(ids)
    }

    /// Moves the leaf to an existing entry (anywhere in the tree, resident
    /// or not) or to `None`, and publishes the snapshot of the new leaf.
    pub fn move_leaf(&self, to: Option<EntryId>) -> Result<Arc<ResidentSnapshot>, HandleError> {
        let (_w, snap) = self.prepare_write()?;
        if snap.leaf == to {
            return Ok(snap);
        }
        if let Some(t) = &to {
            let backend = self.inner.backend()?;
            if !exists(&snap, &*backend.source(&self.inner.id)?, t)? {
                return Err(self.unknown(t));
            }
        }
        self.inner.commit(
            snap.session_version,
            vec![SessionEvent::LeafMoved { leaf: to }],
            ReusePlan {
                fresh: Vec::new(),
                changed: HashSet::new(),
                generation: snap.version.generation,
                links: true,
            },
            "move_leaf",
        )
    }

    /// Branches: appends a branch summary under `target` (`None`: a new
    /// root) recording the current leaf as the branch left; it becomes the
    /// leaf. Returns its id.
    pub fn branch_with_summary(
        &self,
        target: Option<EntryId>,
        summary: impl Into<String>,
    ) -> Result<EntryId, HandleError> {
        let (_w, snap) = self.prepare_write()?;
        let entry = {
            let backend = self.inner.backend()?;
            let source = backend.source(&self.inner.id)?;
            if let Some(t) = &target {
                if !exists(&snap, &*source, t)? {
                    return Err(self.unknown(t));
                }
            }
            Entry {
                id: fresh_id(&*source, &HashSet::new())?,
                parent_id: target,
                timestamp_ms: now_ms(),
                kind: EntryKind::BranchSummary {
                    from_id: snap.leaf.clone(),
                    summary: summary.into(),
                },
            }
        };
        let id = entry.id.clone();
        self.commit_entries(&snap, vec![entry], "branch_with_summary")?;
        Ok(id)
    }

    /// Sets (`Some`, non-empty) or clears (`None`) the label of `target`
    /// with a label entry appended under the leaf. Returns its id.
    pub fn set_label(
        &self,
        target: &EntryId,
        label: Option<String>,
    ) -> Result<EntryId, HandleError> {
        let (_w, snap) = self.prepare_write()?;
        let entry = {
            let backend = self.inner.backend()?;
            let source = backend.source(&self.inner.id)?;
            if !exists(&snap, &*source, target)? {
                return Err(self.unknown(target));
            }
            Entry {
                id: fresh_id(&*source, &HashSet::new())?,
                parent_id: snap.leaf.clone(),
                timestamp_ms: now_ms(),
                kind: EntryKind::Label {
                    target_id: target.clone(),
                    label: label.filter(|l| !l.is_empty()),
                },
            }
        };
        let id = entry.id.clone();
        self.commit_entries(&snap, vec![entry], "set_label")?;
        Ok(id)
    }
}

/// Whether `id` is in the transcript: the snapshot's leaf and resident
/// entries are (the snapshot is at the version the caller's write is
/// fenced on, so a commit based on this answer cannot land if anything
/// changed since); any other id is looked up. For the parents and targets
/// of writes, which are mostly the leaf or recent entries.
fn exists(
    snap: &ResidentSnapshot,
    source: &dyn EntrySource<Error = StoreError>,
    id: &EntryId,
) -> Result<bool, StoreError> {
    if snap.leaf.as_ref() == Some(id) || snap.get(id).is_some() {
        return Ok(true);
    }
    Ok(source.facts(id)?.is_some())
}

/// A generated entry id that is neither stored nor in `taken`.
fn fresh_id(
    source: &dyn EntrySource<Error = StoreError>,
    taken: &HashSet<EntryId>,
) -> Result<EntryId, StoreError> {
    loop {
        let id = EntryId::generate();
        if !taken.contains(&id) && source.facts(&id)?.is_none() {
            return Ok(id);
        }
    }
}

/// The writer-registry key of `store`: the identity a writer handle
/// opened over it registers under (the store's own backend's, or the
/// full-load adapter's, which is the store's address).
pub(crate) fn writer_identity(store: &Arc<dyn SessionStore>) -> String {
    match store.transcript_backend() {
        Some(b) => b.identity(),
        None => FullLoadBackend::new(store.clone()).identity(),
    }
}

/// The owner of the writer handle open on `id` under `identity` (see
/// [`writer_identity`]) in this process, if any. The runtime's session
/// pipeline refuses to run while one is open (see [`crate::runtime`]).
pub(crate) fn writer_holder(identity: &str, id: &SessionId) -> Option<u64> {
    registry::holder(identity, id.as_str())
}

/// Releases a writer slot taken during `open` if opening fails.
struct ReleaseOnError {
    identity: String,
    id: SessionId,
    owner: u64,
    armed: bool,
}

impl Drop for ReleaseOnError {
    fn drop(&mut self) {
        if self.armed {
            registry::release(&self.identity, self.id.as_str(), self.owner);
        }
    }
}
