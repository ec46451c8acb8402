//! The log store's [`TranscriptBackend`]: heads, sources and transcript
//! appends answered from the transcript index, without loading sessions.
//! It writes through the engine's commit only (the indexers do the rest).

use spool_engine::{AppendOutcome, ExpectedVersion};

use super::transcript::{self, LogTranscriptSource};
use super::LogStore;
use crate::session::{AgentSession, SessionEvent, SessionId};
use crate::store::backend::{
    AppendReceipt, BoxedSource, ChangeMark, TranscriptBackend, TranscriptHead,
};
use crate::store::{SessionStore, StoreError};
use crate::transcript::entry_size;
use crate::transcript::{EntryId, TranscriptVersion};

impl TranscriptBackend for LogStore {
    /// The store directory: one engine owns a directory at a time.
    fn identity(&self) -> String {
        let dir = std::fs::canonicalize(&self.dir).unwrap_or_else(|_| self.dir.clone());
        format!("log:{}", dir.display())
    }

    /// Two index reads: the session header and the transcript meta.
    fn head(&self, id: &SessionId) -> Result<Option<TranscriptHead>, StoreError> {
        let Some(header) = self.header(id)? else {
            return Ok(None);
        };
        let engine = self.engine()?;
        let meta = transcript::read_meta(engine.index(), id)?.unwrap_or_default();
        Ok(Some(TranscriptHead {
            header,
            version: meta.version(),
            leaf: meta.leaf,
            entries: meta.entries,
        }))
    }

    /// The engine index's change mark: every commit's publication to the
    /// index (before any reader can see it) and every rebuild move it, and
    /// a recovered engine is a new open with marks of its own. `None`
    /// while a rebuild runs or with the store closed.
    fn change_mark(&self) -> Option<ChangeMark> {
        super::common::index_mark(self.engine().ok()?.index())
    }

    fn source(&self, id: &SessionId) -> Result<BoxedSource<'_>, StoreError> {
        Ok(Box::new(LogTranscriptSource::new(
            self.engine()?,
            id.clone(),
        )))
    }

    fn entry_ids(&self, id: &SessionId) -> Result<Vec<EntryId>, StoreError> {
        transcript::entry_ids(self.engine()?.index(), id)
    }

    /// One engine commit under `Exact(expected)`. A poisoned engine (a
    /// failed earlier write) is recovered first ([`LogStore::recover`]):
    /// the fence then tells whether that earlier write landed.
    fn append_events(
        &self,
        id: &SessionId,
        expected_version: u64,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        self.append_transcript_events(id, expected_version, None, events)
    }

    /// The receipt's transcript version follows from `at` and the events
    /// (see `transcript_after`): no index read.
    fn append_events_at(
        &self,
        id: &SessionId,
        expected_version: u64,
        at: TranscriptVersion,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        self.append_transcript_events(id, expected_version, Some(at), events)
    }

    fn has_settings(&self) -> bool {
        true
    }

    /// [`LogStore::load_settings`].
    fn settings(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        self.load_settings(id)
    }
}

/// What a commit of `events` does to a session's transcript version, as
/// the transcript indexer records it: every appended entry, leaf move and
/// rewrite counts one raw event and stamps the commit time; a rewrite sets
/// its generation. `None` for commits with other transcript events (their
/// effect is left to a head read).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct TranscriptStep {
    raw_events: u64,
    generation: Option<u64>,
}

impl TranscriptStep {
    fn of(events: &[SessionEvent]) -> Option<TranscriptStep> {
        let mut step = TranscriptStep {
            raw_events: 0,
            generation: None,
        };
        for ev in events {
            match ev {
                SessionEvent::EntryAppended { .. } | SessionEvent::LeafMoved { .. } => {}
                SessionEvent::TranscriptRewritten { generation, .. } => {
                    step.generation = Some(*generation)
                }
                SessionEvent::Created { .. }
                | SessionEvent::HistoryRewritten { .. }
                | SessionEvent::StateCleared => return None,
                _ => continue,
            }
            step.raw_events = step.raw_events.saturating_add(1);
        }
        Some(step)
    }

    /// The transcript version after the commit, at `timestamp_ms`, onto a
    /// session whose transcript version was `at`.
    fn after(self, at: TranscriptVersion, timestamp_ms: i64) -> TranscriptVersion {
        let mut v = at;
        if let Some(g) = self.generation {
            v.generation = g;
        }
        if self.raw_events > 0 {
            v.raw_seq = v.raw_seq.saturating_add(self.raw_events);
            v.updated_at_ms = timestamp_ms;
        }
        v
    }
}

impl LogStore {
    /// [`TranscriptBackend::append_events`]; `at`: the transcript version
    /// at `expected_version`, when the caller knows it.
    fn append_transcript_events(
        &self,
        id: &SessionId,
        expected_version: u64,
        at: Option<TranscriptVersion>,
        events: Vec<SessionEvent>,
    ) -> Result<AppendReceipt, StoreError> {
        if self.engine()?.is_poisoned() {
            self.recover()?;
        }
        // One index read: the header and the version base. Races with other
        // writers are settled by the version fence of the commit.
        let record = self.record(id)?;
        crate::store::check_append(id, record.as_ref().map(|(h, _)| h), events.is_empty())?;
        let base = record.map_or(0, |(_, base)| base);
        let data = Self::encode_event_list(id, &events)?;
        let step = TranscriptStep::of(&events);
        // The appended entries go to the transcript indexer with their
        // sizes and encodings (see `DecodeMemo`): it indexes them without
        // decoding or measuring them again. The registration is withdrawn
        // when `_handed` drops, whatever the append's outcome.
        let mut entry_sizes = Vec::new();
        let mut handed = Vec::new();
        for (ev, d) in events.into_iter().zip(&data) {
            if let SessionEvent::EntryAppended { entry } = ev {
                let size = entry_size(&entry);
                entry_sizes.push(size);
                handed.push((d.payload.clone(), entry, size));
            }
        }
        let _handed = self.memo.hand_over(id.as_str(), handed);
        match self.append(id, ExpectedVersion::Exact(base + expected_version), data)? {
            AppendOutcome::Committed(info) => Ok(AppendReceipt {
                session_version: info.version - base,
                updated_at_ms: info.timestamp_ms,
                // The fence held: the commit applied to the state at
                // `expected_version`, whose transcript version was `at`.
                transcript: at
                    .zip(step)
                    .map(|(at, step)| step.after(at, info.timestamp_ms)),
                entry_sizes,
            }),
            AppendOutcome::AlreadyCommitted(info) => Ok(AppendReceipt {
                session_version: info.version - base,
                updated_at_ms: info.timestamp_ms,
                transcript: None,
                entry_sizes,
            }),
            AppendOutcome::Conflict { actual, .. } => match actual {
                Some(a) if a > base => Err(StoreError::Conflict {
                    id: id.clone(),
                    expected: expected_version,
                    actual: a - base,
                }),
                _ => Err(StoreError::NotFound { id: id.clone() }),
            },
            #[allow(unreachable_patterns)]
            _ => Err(StoreError::InvalidSession {
                id: id.clone(),
                reason: "unexpected append outcome".into(),
            }),
        }
    }
}
