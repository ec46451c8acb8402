//! The store-facing surface of session handles: [`TranscriptBackend`],
//! what it reports ([`TranscriptHead`], [`AppendReceipt`], [`ChangeMark`])
//! and [`FullLoadBackend`] for stores without transcript indexes. It lives
//! with the stores, which implement it; it never imports `handle/`.
//!
//!
//! A store that keeps transcript indexes (the log and PostgreSQL stores)
//! implements it natively: `head` and `source` answer from its indexes,
//! `append_events` commits transcript events under the session version
//! fence and `settings` folds the session without its transcript events
//! (for the runtime's bounded execute), all without loading the session.
//! Stores without such indexes
//! (memory, JSON file) are served by [`FullLoadBackend`], which loads the
//! whole session: every cost is then O(session) per new version (the
//! loaded session is cached per version), and the adapter's cache holds the
//! whole transcript. A new store gets bounded handles by implementing the
//! trait and returning it from [`SessionStore::transcript_backend`], and
//! bounded executes by implementing `has_settings` and `settings` too.

use std::borrow::Cow;
use std::sync::{Arc, Mutex};

use super::{SessionStore, StoreError};
use crate::session::{AgentSession, AgentSessionInfo, SessionEvent, SessionId};
use crate::transcript::{
    ChildLinks, CustomRef, Entry, EntryFacts, EntryId, EntrySource, PathFacts, Transcript,
    TranscriptVersion,
};

/// What a handle needs to know about a session's transcript head.
#[derive(Clone, Debug, PartialEq)]
pub struct TranscriptHead {
    /// The session header (version fence, status, timestamps).
    pub header: AgentSessionInfo,
    pub version: TranscriptVersion,
    pub leaf: Option<EntryId>,
    /// Entries in the current generation.
    pub entries: u64,
}

/// What a committed append of transcript events produced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AppendReceipt {
    /// The session version the commit produced.
    pub session_version: u64,
    pub updated_at_ms: i64,
    /// The transcript version the commit produced, when the store knows it
    /// without another read: the value a [`TranscriptBackend::head`] read
    /// right after the commit (and before any other) would report. `None`
    /// when it does not (e.g. a retried write found already landed, or the
    /// log store called without the transcript version at the fence).
    pub transcript: Option<TranscriptVersion>,
    /// The JSON sizes ([`entry_size`](crate::transcript::resident::entry_size))
    /// of the commit's appended entries, in order, when the store measured
    /// them (the log store does, for its index); empty otherwise. A
    /// handle's snapshot counts them instead of measuring the entries again.
    pub entry_sizes: Vec<u64>,
}

/// Where a backend's stored transcripts stood, from
/// [`TranscriptBackend::change_mark`]. Two equal marks, one taken before a
/// head read and one after a read through a source, mean nothing those
/// reads could see changed in between.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ChangeMark {
    source: u64,
    changes: u64,
}

impl ChangeMark {
    /// The mark of change count `changes` of `source`: a number naming
    /// the store and the open of it the count belongs to, which no other
    /// open reuses while marks of it are held.
    pub fn new(source: u64, changes: u64) -> Self {
        ChangeMark { source, changes }
    }
}

/// An entry source bound to one session, reading through a backend.
pub type BoxedSource<'a> = Box<dyn EntrySource<Error = StoreError> + 'a>;

/// The store-facing surface of [`SessionHandle`](crate::handle::SessionHandle)s.
pub trait TranscriptBackend: Send + Sync {
    /// A process-unique identity of the store (the writer registry key).
    fn identity(&self) -> String;

    /// The session's header and transcript head; `None` if absent.
    fn head(&self, id: &SessionId) -> Result<Option<TranscriptHead>, StoreError>;

    /// A mark that moves with every change a [`TranscriptBackend::head`]
    /// or a source read could see (of any session), or `None` when the
    /// backend cannot tell (another process may write, or a change is in
    /// progress). The reads of a handle take one before a head read and
    /// one after reading through the source: if the two are equal, the
    /// head still holds and the version check after the read needs no
    /// second head read; a handle also answers its next head read from
    /// the last one while the mark stands. So a mark must move before any
    /// reader can see a change's effects, and may move without one. The
    /// default, `None`, reads the head every time.
    fn change_mark(&self) -> Option<ChangeMark> {
        None
    }

    /// An entry source over the session's current transcript.
    fn source(&self, id: &SessionId) -> Result<BoxedSource<'_>, StoreError>;

    /// Every entry id of the session's current transcript (for whole
    /// transcript rewrites such as redaction; ids only).
    fn entry_ids(&self, id: &SessionId) -> Result<Vec<EntryId>, StoreError>;

    /// Commits transcript events (`EntryAppended`, `LeafMoved`,
    /// `TranscriptRewritten`) as one commit if the session is at
    /// `expected_version`; else `StoreError::Conflict` and nothing is
    /// written. The caller has checked that the events fold (entries and
    /// parents exist); the store refuses deleted sessions.
    fn append_events(
        &self,
        id: &SessionId,
        expected_version: u64,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError>;

    /// [`TranscriptBackend::append_events`], told the transcript version
    /// `at` of the session at `expected_version` (as a head read at that
    /// session version reported it). A store whose transcript version
    /// after a commit follows from the one before and the events (the log
    /// store) fills [`AppendReceipt::transcript`] from it without a read:
    /// the version fence makes `at` the state the commit applied to. A
    /// wrong `at` only makes the receipt's transcript version wrong.
    fn append_events_at(
        &self,
        id: &SessionId,
        expected_version: u64,
        at: TranscriptVersion,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        let _ = at;
        self.append_events(id, expected_version, events)
    }

    /// Whether [`TranscriptBackend::settings`] answers without a full
    /// load. The default, `false`: the runtime's execute loads sessions
    /// of this store whole.
    fn has_settings(&self) -> bool {
        false
    }

    /// The session at its head folded without its transcript (header,
    /// definition, state with an empty transcript; `generation` is not
    /// meaningful, the head's is), without a full load; `None` if absent.
    /// Only called when [`TranscriptBackend::has_settings`] is true; the
    /// default answers `None`.
    fn settings(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        let _ = id;
        Ok(None)
    }
}

/// [`TranscriptBackend`] for stores without transcript indexes: loads the
/// whole session (cached per session version). See the module docs for
/// its costs.
pub struct FullLoadBackend {
    store: Arc<dyn SessionStore>,
    cache: Mutex<Option<Arc<AgentSession>>>,
}

impl std::fmt::Debug for FullLoadBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FullLoadBackend").finish_non_exhaustive()
    }
}

impl FullLoadBackend {
    pub fn new(store: Arc<dyn SessionStore>) -> Self {
        FullLoadBackend {
            store,
            cache: Mutex::new(None),
        }
    }

    /// The session at its stored version (from the cache when current).
    fn session(&self, id: &SessionId) -> Result<Option<Arc<AgentSession>>, StoreError> {
        let Some(h) = self.store.header(id)? else {
            return Ok(None);
        };
        {
            let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(s) = cache.as_ref() {
                if s.id() == id && s.version() == h.version {
                    return Ok(Some(s.clone()));
                }
            }
        }
        let Some(s) = self.store.load(id)? else {
            return Ok(None);
        };
        let s = Arc::new(s);
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = Some(s.clone());
        Ok(Some(s))
    }
}

impl TranscriptBackend for FullLoadBackend {
    fn identity(&self) -> String {
        format!("store@{:p}", Arc::as_ptr(&self.store).cast::<()>())
    }

    fn head(&self, id: &SessionId) -> Result<Option<TranscriptHead>, StoreError> {
        Ok(self.session(id)?.map(|s| {
            let t = &s.state().transcript;
            TranscriptHead {
                header: s.info().clone(),
                // Without an index of transcript events, every save
                // counts: coarser (more conflicts), never laxer.
                version: TranscriptVersion {
                    generation: s.state().generation,
                    raw_seq: s.version(),
                    updated_at_ms: s.info().updated_at_ms,
                },
                leaf: t.leaf().cloned(),
                entries: u64::try_from(t.len()).unwrap_or(u64::MAX),
            }
        }))
    }

    fn source(&self, id: &SessionId) -> Result<BoxedSource<'_>, StoreError> {
        match self.session(id)? {
            Some(s) => Ok(Box::new(SessionSource(s))),
            None => Err(StoreError::NotFound { id: id.clone() }),
        }
    }

    fn entry_ids(&self, id: &SessionId) -> Result<Vec<EntryId>, StoreError> {
        match self.session(id)? {
            Some(s) => Ok(s
                .state()
                .transcript
                .entries()
                .iter()
                .map(|e| e.id.clone())
                .collect()),
            None => Err(StoreError::NotFound { id: id.clone() }),
        }
    }

    fn append_events(
        &self,
        id: &SessionId,
        expected_version: u64,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        let Some(mut s) = self.store.load(id)? else {
            return Err(StoreError::NotFound { id: id.clone() });
        };
        if s.version() != expected_version {
            return Err(StoreError::Conflict {
                id: id.clone(),
                expected: expected_version,
                actual: s.version(),
            });
        }
        for ev in events {
            s.record_transcript_event(ev)
                .map_err(|e| StoreError::InvalidSession {
                    id: id.clone(),
                    reason: e.to_string(),
                })?;
        }
        let saved = self.store.save(s)?;
        let receipt = AppendReceipt {
            session_version: saved.version(),
            updated_at_ms: saved.info().updated_at_ms,
            // As `head` reports it for this session.
            transcript: Some(TranscriptVersion {
                generation: saved.state().generation,
                raw_seq: saved.version(),
                updated_at_ms: saved.info().updated_at_ms,
            }),
            entry_sizes: Vec::new(),
        };
        *self.cache.lock().unwrap_or_else(|e| e.into_inner()) = Some(Arc::new(saved));
        Ok(receipt)
    }
}

/// A fully loaded session's transcript as an [`EntrySource`] with the
/// store's error type.
struct SessionSource(Arc<AgentSession>);

impl SessionSource {
    fn t(&self) -> &Transcript {
        &self.0.state().transcript
    }
}

fn never<T>(r: Result<T, std::convert::Infallible>) -> T {
    match r {
        Ok(v) => v,
        Err(e) => match e {},
    }
}

impl EntrySource for SessionSource {
    type Error = StoreError;

    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, StoreError> {
        Ok(self.t().get(id).map(Cow::Borrowed))
    }

    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, StoreError> {
        Ok(never(EntrySource::children(self.t(), id, limit)))
    }

    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, StoreError> {
        Ok(self.t().get(id).map(EntryFacts::of))
    }

    fn path_facts(&self, _id: &EntryId) -> Result<Option<PathFacts>, StoreError> {
        Ok(None)
    }

    fn custom_entries_after(
        &self,
        custom_type: Option<&str>,
        after_seq: Option<u64>,
        limit: usize,
    ) -> Result<Option<Vec<CustomRef>>, StoreError> {
        Ok(never(self.t().custom_entries_after(
            custom_type,
            after_seq,
            limit,
        )))
    }

    fn label(&self, id: &EntryId) -> Result<Option<String>, StoreError> {
        Ok(self.t().label(id).map(str::to_string))
    }
}
