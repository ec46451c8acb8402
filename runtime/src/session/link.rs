//! What ties a session loaded by [`SessionRuntime::execute`] to its store:
//! the bounded view it was loaded as, the history reader behind it, and
//! the per-step commits of a turn.
//!
//! A session the runtime loads for an execute is *linked*. On a store with
//! transcript indexes and a settings fold (the log store) it is also
//! *bounded*: its header, definition and settings are whole, but its
//! transcript holds only the resident working set of the leaf's context
//! (the same selection a [`SessionHandle`](crate::handle::SessionHandle)
//! publishes), and older entries are read on demand through a
//! [`HistoryReader`]. A session whose whole transcript is one chain that
//! fits the budget is loaded whole (not bounded): nothing is left out.
//!
//! Rules for a bounded session:
//! - Appends, status, settings, execution bookkeeping, `clear_state` and
//!   `rewrite_history` work as on a whole session (their checks need only
//!   the leaf and the new entries). Generated entry ids are checked
//!   against the store's transcript index.
//! - Navigation to an entry outside the working set (`move_leaf`,
//!   `branch_with_summary`, `set_label`, forks at an entry) reads that
//!   entry through the index and adds it to the working set first.
//! - `rewrite_transcript` (a prepared rewrite) needs the rewritten entries
//!   resident; write whole-history rewrites through a handle's prepared
//!   rewrites instead.
//! - `state().transcript` is the working set: read older entries with
//!   [`AgentSession::history`].
//!
//! [`SessionRuntime::execute`]: crate::SessionRuntime::execute

use std::sync::{Arc, Weak};

use super::{AgentSession, SessionId};
use crate::handle::ResidentSnapshot;
use crate::observer::{EventSink, RuntimeEvent};
use crate::store::{SessionStore, StoreError};
use crate::transcript::{Entry, EntryId, Transcript};

/// The runtime side of a linked session (see the module docs).
pub(crate) struct SessionLink {
    /// Weak: a session handed back by the runtime never keeps its store
    /// open; reads and commits through a closed store fail.
    pub store: Weak<dyn SessionStore>,
    pub events: Arc<dyn EventSink>,
    /// The resident snapshot the session was loaded from, when bounded.
    pub bounded: Option<Arc<ResidentSnapshot>>,
    /// Entries the transcript held when the session was loaded.
    pub loaded_entries: usize,
}

/// A session's link, if any. Not part of the session's value: equality,
/// serialization and the fold ignore it.
#[derive(Clone, Default)]
pub(crate) struct Link {
    pub inner: Option<Arc<SessionLink>>,
    /// Stored entries read into a bounded session's transcript since its
    /// load (navigation targets): held, but not new.
    pub known: usize,
}

impl PartialEq for Link {
    fn eq(&self, _other: &Self) -> bool {
        true
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.inner {
            None => f.write_str("unlinked"),
            Some(l) if l.bounded.is_some() => f.write_str("linked(bounded)"),
            Some(_) => f.write_str("linked"),
        }
    }
}

/// Reads a session's older entries on demand: through the store's
/// transcript index for a bounded session, from memory for a whole one.
/// Reads see what is stored when they run (the turn's own committed
/// steps included), never uncommitted entries of the session they came
/// from other than those it holds.
#[derive(Clone)]
pub struct HistoryReader {
    id: SessionId,
    inner: HistoryInner,
}

#[derive(Clone)]
enum HistoryInner {
    /// The store's transcript index, with the session's working set first.
    Store {
        store: Weak<dyn SessionStore>,
        held: Transcript,
    },
    /// A whole transcript in memory.
    Memory(Transcript),
}

impl std::fmt::Debug for HistoryReader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryReader")
            .field("session", &self.id)
            .field(
                "source",
                &match self.inner {
                    HistoryInner::Store { .. } => "store",
                    HistoryInner::Memory(_) => "memory",
                },
            )
            .finish()
    }
}

/// Most parents a [`HistoryReader::older`] walk follows per call, whatever
/// `limit` asks (a page is bounded; ask again from the oldest returned).
pub const HISTORY_PAGE_MAX: usize = 4096;

impl HistoryReader {
    pub(crate) fn memory(id: SessionId, transcript: Transcript) -> Self {
        HistoryReader {
            id,
            inner: HistoryInner::Memory(transcript),
        }
    }

    pub(crate) fn store(id: SessionId, store: Weak<dyn SessionStore>, held: Transcript) -> Self {
        HistoryReader {
            id,
            inner: HistoryInner::Store { store, held },
        }
    }

    /// The session this reader reads.
    pub fn session_id(&self) -> &SessionId {
        &self.id
    }

    /// One entry of the session's current transcript, or `None`.
    pub fn entry(&self, id: &EntryId) -> Result<Option<Entry>, StoreError> {
        match &self.inner {
            HistoryInner::Memory(t) => Ok(t.get(id).cloned()),
            HistoryInner::Store { store, held } => {
                if let Some(e) = held.get(id) {
                    return Ok(Some(e.clone()));
                }
                read_stored(store, &self.id, id)
            }
        }
    }

    /// The entries on the path before `before` (its ancestors), oldest
    /// first: at most `limit` of them (and at most [`HISTORY_PAGE_MAX`]),
    /// the nearest ones. Page further back by asking again before the
    /// first returned entry. `before` itself is not returned; an unknown
    /// `before` gives an empty page.
    pub fn older(&self, before: &EntryId, limit: usize) -> Result<Vec<Entry>, StoreError> {
        let limit = limit.min(HISTORY_PAGE_MAX);
        let mut out = Vec::new();
        let Some(start) = self.entry(before)? else {
            return Ok(out);
        };
        let mut next = start.parent_id;
        while out.len() < limit {
            let Some(pid) = next else { break };
            let Some(e) = self.entry(&pid)? else { break };
            next = e.parent_id.clone();
            out.push(e);
        }
        out.reverse();
        Ok(out)
    }

    /// The whole root→`at` path, root first (for forks); `Ok(None)` when
    /// `at` or one of its ancestors is missing, or the parents cycle.
    /// Walks one entry per step: its cost follows the path.
    pub(crate) fn path_to(&self, at: &EntryId) -> Result<Option<Vec<Entry>>, StoreError> {
        let mut out = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut next = Some(at.clone());
        while let Some(id) = next {
            if !seen.insert(id.clone()) {
                return Ok(None);
            }
            let Some(e) = self.entry(&id)? else {
                return Ok(None);
            };
            next = e.parent_id.clone();
            out.push(e);
        }
        out.reverse();
        Ok(Some(out))
    }
}

/// One entry read through the store's transcript backend.
pub(crate) fn read_stored(
    store: &Weak<dyn SessionStore>,
    session: &SessionId,
    id: &EntryId,
) -> Result<Option<Entry>, StoreError> {
    let store = open_store(store)?;
    let Some(backend) = store.transcript_backend() else {
        return Ok(None);
    };
    let source = backend.source(session)?;
    let found = source.entry(id)?;
    Ok(found.map(std::borrow::Cow::into_owned))
}

impl AgentSession {
    pub(crate) fn link(&self) -> Option<&Arc<SessionLink>> {
        self.link.inner.as_ref()
    }

    /// A bounded session whose transcript was just replaced whole (a
    /// clear, a history rewrite) holds all of it: it is whole from now on.
    pub(crate) fn unbound(&mut self) {
        if let Some(l) = self.link().filter(|l| l.bounded.is_some()) {
            let whole = SessionLink {
                store: l.store.clone(),
                events: l.events.clone(),
                bounded: None,
                loaded_entries: 0,
            };
            self.link = Link {
                inner: Some(Arc::new(whole)),
                known: 0,
            };
        }
    }

    /// Installs a working set as the transcript (bounded loads).
    pub(crate) fn install_transcript(
        &mut self,
        entries: Vec<Entry>,
        leaf: Option<EntryId>,
        generation: u64,
    ) {
        self.state.transcript.replace_all(entries, leaf);
        self.state.generation = generation;
    }

    pub(crate) fn set_link(&mut self, link: SessionLink) {
        self.link = Link {
            inner: Some(Arc::new(link)),
            known: 0,
        };
    }

    /// Whether this session holds only its working set (see
    /// `session::link`): `state().transcript` is then the
    /// resident part of the leaf's context, and older entries are read
    /// through [`AgentSession::history`].
    pub fn is_bounded(&self) -> bool {
        self.link().is_some_and(|l| l.bounded.is_some())
    }

    /// The resident snapshot a bounded session was loaded from (counts,
    /// budget, completeness, the selection the model context is built
    /// from); `None` for a whole session.
    pub fn resident(&self) -> Option<&ResidentSnapshot> {
        self.link().and_then(|l| l.bounded.as_deref())
    }

    /// Entries in this session's transcript (current generation, every
    /// branch), resident or not: for a bounded session, those stored at
    /// its load plus those appended since.
    pub fn transcript_entries(&self) -> u64 {
        let held = self.state.transcript.len();
        match self.link().and_then(|l| l.bounded.as_ref().map(|b| (l, b))) {
            Some((l, b)) => b.transcript_entries.saturating_add(
                held.saturating_sub(l.loaded_entries.saturating_add(self.link.known)) as u64,
            ),
            None => held as u64,
        }
    }

    /// A reader of this session's entries beyond what it holds (for a
    /// whole session, a reader over its transcript).
    pub fn history(&self) -> HistoryReader {
        match self.link() {
            Some(l) if l.bounded.is_some() => HistoryReader::store(
                self.id().clone(),
                l.store.clone(),
                self.state.transcript.clone(),
            ),
            _ => HistoryReader::memory(self.id().clone(), self.state.transcript.clone()),
        }
    }

    /// Whether `id` is an entry of this session's transcript; for a
    /// bounded session, an entry outside the working set is read through
    /// the index and added to it (so navigation to it folds).
    pub(crate) fn know_entry(&mut self, id: &EntryId) -> Result<bool, StoreError> {
        if self.state.transcript.contains(id) {
            return Ok(true);
        }
        let Some(link) = self.link().filter(|l| l.bounded.is_some()).cloned() else {
            return Ok(false);
        };
        let Some(entry) = read_stored(&link.store, self.id(), id)? else {
            return Ok(false);
        };
        let t = &mut self.state.transcript;
        let leaf = t.leaf().cloned();
        let mut entries = t.entries().to_vec();
        entries.push(entry);
        t.replace_all(entries, leaf);
        self.link.known = self.link.known.saturating_add(1);
        Ok(true)
    }

    /// For a bounded session: whether `id` is stored beyond the working
    /// set (a read failure is an error); whole sessions answer `false`.
    pub(crate) fn stored_beyond(&self, id: &EntryId) -> Result<bool, StoreError> {
        if self.state.transcript.contains(id) {
            return Ok(false);
        }
        match self.link().filter(|l| l.bounded.is_some()) {
            Some(l) => Ok(read_stored(&l.store, self.id(), id)?.is_some()),
            None => Ok(false),
        }
    }

    /// Whether a new entry id is taken in the stored transcript beyond the
    /// working set (bounded sessions only; a whole session's transcript
    /// checks itself).
    pub(crate) fn id_taken_in_store(&self, id: &EntryId) -> bool {
        match self.link().filter(|l| l.bounded.is_some()) {
            // A failed read counts as taken: the caller draws another id.
            Some(l) => !matches!(read_stored(&l.store, self.id(), id), Ok(None)),
            None => false,
        }
    }

    /// Commits the pending events now, as one commit under the version
    /// fence, when this session is linked to a store (an execute is
    /// running it); returns the committed version, or `None` when there
    /// was nothing to commit or the session is not linked (its events
    /// then stay pending for the execute's final save). Each commit is
    /// reported to the runtime's observer as `SessionSaved`. No hook runs
    /// for it (see [`crate::runtime`], "Durable steps").
    ///
    /// On failure (`Conflict` when another writer moved the session, or a
    /// store fault) nothing of this commit is stored and the pending
    /// events stay; the observer gets `SessionSaveFailed`.
    pub fn commit_steps(&mut self) -> Result<Option<u64>, StoreError> {
        let Some(link) = self.link().cloned() else {
            return Ok(None);
        };
        if self.pending.is_empty() {
            return Ok(None);
        }
        let store = open_store(&link.store)?;
        match save_linked(&store, self.clone()) {
            Ok(saved) => {
                let v = saved.version();
                *self = saved;
                link.events.emit(&RuntimeEvent::SessionSaved {
                    session_id: self.id().clone(),
                    version: v,
                    status: self.status(),
                });
                Ok(Some(v))
            }
            Err(e) => {
                link.events.emit(&RuntimeEvent::SessionSaveFailed {
                    session_id: self.id().clone(),
                    error: e.to_string(),
                    error_kind: e.kind().to_string(),
                });
                Err(e)
            }
        }
    }
}

/// Saves `session` through `store` without its link (a store that keeps
/// sessions in memory must not hold a link back to itself) and hands the
/// persisted session back with the link restored.
pub(crate) fn save_linked(
    store: &Arc<dyn SessionStore>,
    mut session: AgentSession,
) -> Result<AgentSession, StoreError> {
    let link = std::mem::take(&mut session.link);
    let mut saved = store.save(session)?;
    saved.link = link;
    Ok(saved)
}

/// The store behind a link, while the runtime that loaded the session
/// (or anything else) keeps it open.
fn open_store(store: &Weak<dyn SessionStore>) -> Result<Arc<dyn SessionStore>, StoreError> {
    store.upgrade().ok_or_else(|| {
        StoreError::Backend("the store this session was loaded from is closed".into())
    })
}
