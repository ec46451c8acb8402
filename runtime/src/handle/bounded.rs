//! The bounded session the runtime's execute works on, built with the
//! handles' machinery: the resident snapshot of [`snapshot::build`] for
//! the transcript, the backend's settings fold for the rest.

use std::sync::Arc;

use super::snapshot;
use super::HandleError;
use crate::observer::EventSink;
use crate::session::link::SessionLink;
use crate::session::{AgentSession, SessionId};
use crate::store::{SessionStore, StoreError};
use crate::transcript::{Budget, Entry};

/// Attempts before a load that keeps racing other writers gives up.
const LOAD_ATTEMPTS: usize = 4;

/// Loads `id` as a linked session without a full load, when the store's
/// transcript backend has a settings fold (else `Ok(None)`: the caller
/// loads whole). The transcript holds the resident working set of the
/// leaf's context under `budget` (plus the leaf when it is an omitted
/// oversized entry); when that is the whole transcript (one chain, all of
/// it resident) the session is whole and not marked bounded. Missing:
/// `NotFound`.
pub(crate) fn load_bounded(
    store: &Arc<dyn SessionStore>,
    events: &Arc<dyn EventSink>,
    id: &SessionId,
    budget: Budget,
) -> Result<Option<AgentSession>, StoreError> {
    let Some(backend) = store.transcript_backend() else {
        return Ok(None);
    };
    if !backend.has_settings() {
        return Ok(None);
    }
    for _ in 0..LOAD_ATTEMPTS {
        let snap = match snapshot::build(backend, id, budget, 0, 0, None) {
            Ok(s) => s,
            Err(HandleError::NotFound { .. }) => {
                return Err(StoreError::NotFound { id: id.clone() })
            }
            Err(HandleError::Store(e)) => return Err(e),
            Err(HandleError::Raced { .. }) => continue,
            Err(e) => return Err(StoreError::Backend(Box::new(e))),
        };
        let Some(mut session) = backend.settings(id)? else {
            return Err(StoreError::NotFound { id: id.clone() });
        };
        if session.version() != snap.session_version {
            // A commit landed between the two reads.
            continue;
        }
        let mut entries: Vec<Entry> = snap.entries().iter().map(|e| (**e).clone()).collect();
        if let Some(leaf) = &snap.leaf {
            if !entries.iter().any(|e| &e.id == leaf) {
                // An oversized leaf is omitted from the selection; new
                // entries attach to it, so it is held.
                let source = backend.source(id)?;
                if let Some(e) = source.entry(leaf)? {
                    entries.push(e.into_owned());
                }
            }
        }
        let counts = snap.counts();
        let whole = snap.is_complete()
            && counts.path_entries == snap.transcript_entries
            && counts.context_entries == snap.transcript_entries
            && counts.resident_entries == snap.transcript_entries;
        let loaded_entries = entries.len();
        session.install_transcript(entries, snap.leaf.clone(), snap.version.generation);
        session.set_link(SessionLink {
            store: Arc::downgrade(store),
            events: events.clone(),
            bounded: (!whole).then(|| Arc::new(snap)),
            loaded_entries,
        });
        return Ok(Some(session));
    }
    Err(StoreError::Backend(Box::new(HandleError::Raced {
        id: id.clone(),
    })))
}
