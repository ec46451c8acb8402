//! Prepared rewrites on a handle.
//!
//! [`SessionHandle::prepare_rewrite`] plans the replacements with
//! [`RewritePlan::prepare`] over the store's source (reading only the
//! affected entries; the live session is never cloned or loaded) and
//! returns a [`PreparedRewrite`]: the plan (source→destination mapping,
//! byte and count deltas, the new leaf). It holds the handle's rewrite
//! slot (one open preparation per handle) until it is committed or
//! dropped. [`SessionHandle::commit_rewrite`] rechecks writer authority,
//! cancellation and the transcript version, commits ONE
//! `TranscriptRewritten` event (the delta: rewritten entries, relinked
//! ids, removed ids, leaf) that bumps the generation, and publishes the
//! bounded replacement snapshot. Cancellation (before the commit) writes
//! nothing.
//!
//! Built on them: [`SessionHandle::remove_trailing_entries`] (the
//! retained-data cleanup: preserved trailing entries are judged on their
//! indexed facts, so a large custom payload is never loaded, and it is
//! relinked, not rewritten), [`SessionHandle::truncate_tool_results`] and
//! [`SessionHandle::redact`] (both visit every entry of the transcript one
//! at a time: operation-owned, O(entries) reads).

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use serde::Serialize;

use super::live::{Inner, ReusePlan, SessionHandle};
use super::snapshot::ResidentSnapshot;
use super::HandleError;
use crate::session::SessionEvent;
use crate::transcript::{
    redact as redact_entries, remove_trailing_entries, truncate_tool_results, CancelToken, Entry,
    EntryFacts, EntryId, MappedEntry, Replacement, RewritePlan, TrailingRemoval, TranscriptVersion,
};

/// A planned rewrite bound to its handle (see the module docs). Dropping
/// it releases the handle's rewrite slot.
pub struct PreparedRewrite {
    inner: Arc<Inner>,
    plan: RewritePlan,
}

impl std::fmt::Debug for PreparedRewrite {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedRewrite")
            .field("session", &self.inner.id)
            .field("plan", &self.plan)
            .finish()
    }
}

impl Drop for PreparedRewrite {
    fn drop(&mut self) {
        self.inner.rewrite_slot.store(false, Ordering::Release);
    }
}

impl PreparedRewrite {
    pub fn plan(&self) -> &RewritePlan {
        &self.plan
    }

    /// Per affected source entry: removed (with its successor) or kept
    /// (replaced and/or relinked).
    pub fn mapping(&self) -> &[MappedEntry] {
        &self.plan.mapping
    }

    pub fn bytes_delta(&self) -> i64 {
        self.plan.bytes_delta
    }

    pub fn entries_delta(&self) -> i64 {
        self.plan.entries_delta
    }

    pub fn expected_version(&self) -> TranscriptVersion {
        self.plan.expected_version
    }
}

/// A committed rewrite.
#[derive(Clone, Debug, Serialize)]
pub struct RewriteCommitted {
    /// Whether anything was written (an empty plan commits nothing).
    pub written: bool,
    /// The transcript version after the rewrite.
    pub version: TranscriptVersion,
    /// The session version after the rewrite.
    pub session_version: u64,
    pub removed: Vec<EntryId>,
    pub rewritten: Vec<EntryId>,
    pub reparented: Vec<(EntryId, Option<EntryId>)>,
    pub bytes_delta: i64,
    pub entries_delta: i64,
    /// The published replacement snapshot.
    #[serde(skip)]
    pub snapshot: Arc<ResidentSnapshot>,
}

/// What [`SessionHandle::remove_trailing_entries`] did.
#[derive(Clone, Debug, Serialize)]
pub struct TrailingOutcome {
    /// The scan: removed ids (newest first), preserved ids, and the
    /// boundary entry that proves nothing older is trailing.
    pub scan: TrailingRemoval,
    pub removed: Vec<EntryId>,
    /// The committed rewrite (`None` when nothing matched).
    pub committed: Option<RewriteCommitted>,
}

impl SessionHandle {
    fn cancelled(&self) -> HandleError {
        HandleError::Cancelled {
            id: self.inner.id.clone(),
        }
    }

    fn plan_err(
        &self,
        source: crate::transcript::RewriteError<crate::store::StoreError>,
    ) -> HandleError {
        HandleError::RewritePlan {
            id: self.inner.id.clone(),
            source,
        }
    }

    /// Plans `replacements` against the live transcript, which must be at
    /// `expected_version` (else [`HandleError::VersionConflict`]). Needs
    /// writer authority; holds the handle's rewrite slot until the
    /// preparation is committed or dropped.
    pub fn prepare_rewrite(
        &self,
        replacements: Vec<(EntryId, Replacement)>,
        expected_version: TranscriptVersion,
        cancel: &CancelToken,
    ) -> Result<PreparedRewrite, HandleError> {
        self.inner.check_writer()?;
        if self
            .inner
            .rewrite_slot
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return Err(HandleError::RewriteBusy {
                id: self.inner.id.clone(),
            });
        }
        // The slot is released by the preparation's Drop, or here on error.
        let mut prepared = PreparedRewrite {
            inner: self.inner.clone(),
            plan: RewritePlan {
                expected_version,
                generation: 0,
                mapping: Vec::new(),
                written: Vec::new(),
                reparented: Vec::new(),
                removed: Vec::new(),
                old_leaf: None,
                new_leaf: None,
                bytes_delta: 0,
                entries_delta: 0,
                facts_stale: Vec::new(),
            },
        };
        if cancel.is_cancelled() {
            return Err(self.cancelled());
        }
        let backend = self.inner.backend()?;
        let Some(head) = backend.head(&self.inner.id)? else {
            return Err(HandleError::NotFound {
                id: self.inner.id.clone(),
            });
        };
        if head.version != expected_version {
            return Err(HandleError::VersionConflict {
                id: self.inner.id.clone(),
                expected: expected_version,
                actual: head.version,
            });
        }
        let source = backend.source(&self.inner.id)?;
        prepared.plan = RewritePlan::prepare(
            &*source,
            head.leaf.as_ref(),
            &replacements,
            expected_version,
        )
        .map_err(|e| self.plan_err(e))?;
        if cancel.is_cancelled() {
            return Err(self.cancelled());
        }
        Ok(prepared)
    }

    /// Commits a preparation of this handle (see the module docs). A
    /// cancelled token or a changed version writes nothing.
    pub fn commit_rewrite(
        &self,
        prepared: PreparedRewrite,
        cancel: &CancelToken,
    ) -> Result<RewriteCommitted, HandleError> {
        if !Arc::ptr_eq(&prepared.inner, &self.inner) {
            return Err(HandleError::ForeignPreparation {
                id: self.inner.id.clone(),
            });
        }
        let _w = self.inner.lock_writes();
        self.inner.check_writer()?;
        if cancel.is_cancelled() {
            return Err(self.cancelled());
        }
        let plan = &prepared.plan;
        let backend = self.inner.backend()?;
        let Some(head) = backend.head(&self.inner.id)? else {
            return Err(HandleError::NotFound {
                id: self.inner.id.clone(),
            });
        };
        if head.version != plan.expected_version {
            return Err(HandleError::VersionConflict {
                id: self.inner.id.clone(),
                expected: plan.expected_version,
                actual: head.version,
            });
        }
        let mut out = RewriteCommitted {
            written: false,
            version: head.version,
            session_version: head.header.version,
            removed: plan.removed.clone(),
            rewritten: plan.written.iter().map(|e| e.id.clone()).collect(),
            reparented: plan.reparented.clone(),
            bytes_delta: plan.bytes_delta,
            entries_delta: plan.entries_delta,
            snapshot: self.snapshot(),
        };
        if plan.is_empty() {
            return Ok(out);
        }
        let changed: HashSet<EntryId> = plan.mapping.iter().map(|m| m.source.clone()).collect();
        let event = SessionEvent::TranscriptRewritten {
            generation: plan.generation,
            written: plan.written.clone(),
            reparented: plan.reparented.clone(),
            removed: plan.removed.clone(),
            leaf: plan.new_leaf.clone(),
        };
        let snap = self.inner.commit(
            head.header.version,
            vec![event],
            ReusePlan {
                fresh: plan.written.iter().cloned().map(Arc::new).collect(),
                changed,
                generation: plan.generation,
                links: false,
            },
            "rewrite",
        )?;
        out.written = true;
        out.version = snap.version;
        out.session_version = snap.session_version;
        out.snapshot = snap;
        Ok(out)
    }

    /// Removes the trailing entries for which `predicate` holds, walking
    /// back from the leaf; entries for which `preserve` holds (judged on
    /// their indexed facts: payload never loaded) are kept and relinked to
    /// the nearest kept ancestor; the first other entry ends the walk and
    /// is reported as the boundary. Nothing matched: nothing is written.
    pub fn remove_trailing_entries(
        &self,
        predicate: &dyn Fn(&Entry) -> bool,
        preserve: &dyn Fn(&EntryFacts) -> bool,
        cancel: &CancelToken,
    ) -> Result<TrailingOutcome, HandleError> {
        self.inner.check_writer()?;
        let backend = self.inner.backend()?;
        let Some(head) = backend.head(&self.inner.id)? else {
            return Err(HandleError::NotFound {
                id: self.inner.id.clone(),
            });
        };
        let scan = {
            let source = backend.source(&self.inner.id)?;
            remove_trailing_entries(&*source, head.leaf.as_ref(), predicate, preserve)
                .map_err(|e| self.plan_err(e))?
        };
        let removed: Vec<EntryId> = scan.replacements.iter().map(|(id, _)| id.clone()).collect();
        if scan.replacements.is_empty() {
            return Ok(TrailingOutcome {
                scan,
                removed,
                committed: None,
            });
        }
        let prepared = self.prepare_rewrite(scan.replacements.clone(), head.version, cancel)?;
        let committed = self.commit_rewrite(prepared, cancel)?;
        Ok(TrailingOutcome {
            scan,
            removed,
            committed: Some(committed),
        })
    }

    /// Every entry of the transcript, one at a time, to `visit` (checks
    /// cancellation before each). Returns the version visited.
    fn visit_all(
        &self,
        cancel: &CancelToken,
        mut visit: impl FnMut(&Entry),
    ) -> Result<TranscriptVersion, HandleError> {
        let backend = self.inner.backend()?;
        let Some(head) = backend.head(&self.inner.id)? else {
            return Err(HandleError::NotFound {
                id: self.inner.id.clone(),
            });
        };
        let source = backend.source(&self.inner.id)?;
        for id in backend.entry_ids(&self.inner.id)? {
            if cancel.is_cancelled() {
                return Err(self.cancelled());
            }
            if let Some(e) = source.entry(&id)? {
                visit(&e);
            }
        }
        Ok(head.version)
    }

    fn rewrite_all(
        &self,
        cancel: &CancelToken,
        replacements_of: impl Fn(&Entry) -> Vec<(EntryId, Replacement)>,
    ) -> Result<Option<RewriteCommitted>, HandleError> {
        self.inner.check_writer()?;
        let mut replacements = Vec::new();
        let version = self.visit_all(cancel, |e| replacements.extend(replacements_of(e)))?;
        if replacements.is_empty() {
            return Ok(None);
        }
        let prepared = self.prepare_rewrite(replacements, version, cancel)?;
        Ok(Some(self.commit_rewrite(prepared, cancel)?))
    }

    /// Cuts tool results longer than `max_bytes` (see
    /// [`truncate_tool_results`]) across the whole transcript, as one
    /// rewrite. `None` when nothing needed cutting.
    pub fn truncate_tool_results(
        &self,
        max_bytes: u64,
        cancel: &CancelToken,
    ) -> Result<Option<RewriteCommitted>, HandleError> {
        self.rewrite_all(cancel, |e| {
            truncate_tool_results(std::iter::once(e), max_bytes)
        })
    }

    /// Passes message texts through `matcher` (see
    /// [`redact`](crate::transcript::redact)) across the whole transcript,
    /// as one rewrite. `None` when nothing changed.
    pub fn redact(
        &self,
        matcher: &dyn Fn(&str) -> String,
        cancel: &CancelToken,
    ) -> Result<Option<RewriteCommitted>, HandleError> {
        self.rewrite_all(cancel, |e| redact_entries(std::iter::once(e), matcher))
    }
}
