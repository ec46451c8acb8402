//! History reads on a handle: five selections, validated against the live
//! transcript version and the owner, cancellable.
//!
//! [`SessionHandle::prepare_read`] captures the owner incarnation, the live
//! transcript version and leaf; the returned [`HistoryRead`] is bound to
//! that owner and version. Each [`HistoryRead::read`]:
//!
//! 1. checks cancellation and the owner (closed, invalidated or replaced:
//!    [`ReadResult::OwnerLost`]);
//! 2. checks the live version against the captured one (changed:
//!    [`ReadResult::VersionConflict`]; a capability never silently reads
//!    another version) — continuations are checked again by the selection
//!    itself (session, branch or custom type, version);
//! 3. reads through the backend's source (for the log store: index lookups
//!    and the commits holding the returned entries), checking cancellation
//!    before each entry read;
//! 4. re-reads the live version (a write that raced the read turns it into
//!    a version conflict) and rechecks the owner and cancellation before
//!    returning.
//!
//! [`SessionHandle::read`] prepares and reads at once: the version it
//! captures is the live one, so step 2 is already answered (one head read
//! fewer per page).
//!
//! A backend that offers a [`ChangeMark`] (the log store) saves the other
//! head reads while nothing changes: a mark taken before a head read and
//! found again after the read through the source (step 4) means no change
//! was published in between, so the version is still the captured one; and
//! the handle keeps the last head it read with the mark taken before it,
//! answering steps 2 and preparation from it while the mark stands. A
//! reader paging through a branch no one writes reads the head once.
//!
//! Results are owned by the caller; nothing of them is kept in the handle
//! (only the last head's version and leaf), so a caller paging through a
//! branch holds one page at a time.

use std::sync::Arc;

use serde::Serialize;

use super::live::{Inner, SessionHandle};
use super::HandleError;
use crate::store::{ChangeMark, TranscriptBackend};
use crate::transcript::{
    read_branch_page, read_context, read_custom_page, read_entry, read_navigation, Budget,
    CancelToken, Continuation, Entry, EntryId, EntryPage, NavigationFacts, PageBudget, PageOrder,
    ReadResult, ReadScope, ResidentSelection, TranscriptVersion,
};

/// What to read.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum HistorySelection {
    /// The bounded context of the current leaf.
    Context { budget: Budget },
    /// One entry, byte-exact, or explicit absence.
    Entry { id: EntryId },
    /// A page of the root→`leaf` path.
    BranchPage {
        leaf: EntryId,
        order: PageOrder,
        cursor: Option<Continuation>,
        budget: PageBudget,
    },
    /// Facts about `target` for a caller at `from`.
    Navigation {
        from: Option<EntryId>,
        target: EntryId,
    },
    /// A page of custom entries (of `custom_type`, or all), append order.
    CustomPage {
        custom_type: Option<String>,
        cursor: Option<Continuation>,
        budget: PageBudget,
    },
}

/// What a read returns.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub enum HistoryValue {
    Context(ResidentSelection),
    Entry(Entry),
    Page(EntryPage),
    Navigation(NavigationFacts),
}

impl HistoryValue {
    /// The page, owned (no copy of its entries).
    pub fn into_page(self) -> Option<EntryPage> {
        match self {
            HistoryValue::Page(p) => Some(p),
            _ => None,
        }
    }

    pub fn as_page(&self) -> Option<&EntryPage> {
        match self {
            HistoryValue::Page(p) => Some(p),
            _ => None,
        }
    }

    pub fn as_entry(&self) -> Option<&Entry> {
        match self {
            HistoryValue::Entry(e) => Some(e),
            _ => None,
        }
    }

    pub fn as_context(&self) -> Option<&ResidentSelection> {
        match self {
            HistoryValue::Context(c) => Some(c),
            _ => None,
        }
    }

    pub fn as_navigation(&self) -> Option<&NavigationFacts> {
        match self {
            HistoryValue::Navigation(n) => Some(n),
            _ => None,
        }
    }
}

/// The last head a handle's read found: its version and leaf, read after
/// the backend's change mark was `mark`.
#[derive(Clone, Debug)]
pub(crate) struct ReadTip {
    mark: ChangeMark,
    version: TranscriptVersion,
    leaf: Option<EntryId>,
}

/// The live transcript version and leaf of the session (`None` if it is
/// gone), with the change mark taken before they were found (`None` if
/// the backend offers none).
struct Tip {
    mark: Option<ChangeMark>,
    version: TranscriptVersion,
    leaf: Option<EntryId>,
}

impl Inner {
    /// The session's live version and leaf: the cached ones while the
    /// backend's change mark is the one they were read after, else a head
    /// read (cached under the mark taken before it).
    ///
    /// Why a hit is the live head: the mark is loaded under the cache's
    /// lock, after the read that filled it. Any change that read saw moved
    /// the mark before the read could see it, so a mark equal to the one
    /// taken before that read means the read saw no change after it, and
    /// none has been made since.
    fn tip(&self, backend: &dyn TranscriptBackend) -> Result<Option<Tip>, HandleError> {
        let mark = {
            let cached = self.read_tip.lock().unwrap_or_else(|e| e.into_inner());
            let mark = backend.change_mark();
            if let (Some(m), Some(t)) = (mark, cached.as_ref()) {
                if t.mark == m {
                    return Ok(Some(Tip {
                        mark,
                        version: t.version,
                        leaf: t.leaf.clone(),
                    }));
                }
            }
            mark
        };
        let Some(head) = backend.head(&self.id)? else {
            return Ok(None);
        };
        if let Some(m) = mark {
            *self.read_tip.lock().unwrap_or_else(|e| e.into_inner()) = Some(ReadTip {
                mark: m,
                version: head.version,
                leaf: head.leaf.clone(),
            });
        }
        Ok(Some(Tip {
            mark,
            version: head.version,
            leaf: head.leaf,
        }))
    }
}

/// A read capability bound to one owner and one transcript version (see
/// the module docs).
pub struct HistoryRead {
    inner: Arc<Inner>,
    version: TranscriptVersion,
    leaf: Option<EntryId>,
}

impl std::fmt::Debug for HistoryRead {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HistoryRead")
            .field("session", &self.inner.id)
            .field("owner", &self.inner.owner)
            .field("version", &self.version)
            .finish()
    }
}

fn map<T>(r: ReadResult<T>, f: impl FnOnce(T) -> HistoryValue) -> ReadResult<HistoryValue> {
    match r {
        ReadResult::Complete { value, version } => ReadResult::Complete {
            value: f(value),
            version,
        },
        ReadResult::Page {
            value,
            continuation,
        } => ReadResult::Page {
            value: f(value),
            continuation,
        },
        ReadResult::EntryAbsent { id } => ReadResult::EntryAbsent { id },
        ReadResult::VersionConflict { expected, actual } => {
            ReadResult::VersionConflict { expected, actual }
        }
        ReadResult::OwnerLost => ReadResult::OwnerLost,
        ReadResult::Cancelled => ReadResult::Cancelled,
        ReadResult::Oversized {
            id,
            size,
            budget_bytes,
        } => ReadResult::Oversized {
            id,
            size,
            budget_bytes,
        },
    }
}

impl HistoryRead {
    /// The version this capability reads.
    pub fn version(&self) -> TranscriptVersion {
        self.version
    }

    /// The leaf at the time of preparation.
    pub fn leaf(&self) -> Option<&EntryId> {
        self.leaf.as_ref()
    }

    /// Runs one read (see the module docs).
    pub fn read(
        &self,
        selection: &HistorySelection,
        cancel: &CancelToken,
    ) -> Result<ReadResult<HistoryValue>, HandleError> {
        let inner = &self.inner;
        if cancel.is_cancelled() {
            return Ok(ReadResult::Cancelled);
        }
        if !inner.alive() {
            return Ok(ReadResult::OwnerLost);
        }
        let backend = inner.backend()?;
        let Some(tip) = inner.tip(backend)? else {
            return Err(HandleError::NotFound {
                id: inner.id.clone(),
            });
        };
        if tip.version != self.version {
            return Ok(ReadResult::VersionConflict {
                expected: self.version,
                actual: tip.version,
            });
        }
        self.read_checked(backend, tip.mark, selection, cancel)
    }

    /// Steps 3 and 4 of [`HistoryRead::read`], once the live version was
    /// found to be the captured one after the backend's change mark was
    /// `mark`.
    fn read_checked(
        &self,
        backend: &dyn TranscriptBackend,
        mark: Option<ChangeMark>,
        selection: &HistorySelection,
        cancel: &CancelToken,
    ) -> Result<ReadResult<HistoryValue>, HandleError> {
        let inner = &self.inner;
        let source = backend.source(&inner.id)?;
        let scope = ReadScope {
            session: inner.id.as_str(),
            version: self.version,
            cancel,
        };
        let fault = |source| HandleError::Read {
            id: inner.id.clone(),
            source,
        };
        let result = match selection {
            HistorySelection::Context { budget } => map(
                read_context(&*source, &scope, self.leaf.as_ref(), *budget).map_err(fault)?,
                HistoryValue::Context,
            ),
            HistorySelection::Entry { id } => map(
                read_entry(&*source, &scope, id).map_err(fault)?,
                HistoryValue::Entry,
            ),
            HistorySelection::BranchPage {
                leaf,
                order,
                cursor,
                budget,
            } => map(
                read_branch_page(&*source, &scope, leaf, *order, cursor.as_ref(), *budget)
                    .map_err(fault)?,
                HistoryValue::Page,
            ),
            HistorySelection::Navigation { from, target } => map(
                read_navigation(&*source, &scope, from.as_ref(), target).map_err(fault)?,
                HistoryValue::Navigation,
            ),
            HistorySelection::CustomPage {
                custom_type,
                cursor,
                budget,
            } => map(
                read_custom_page(
                    &*source,
                    &scope,
                    custom_type.as_deref(),
                    cursor.as_ref(),
                    *budget,
                )
                .map_err(fault)?,
                HistoryValue::Page,
            ),
        };
        drop(source);
        // A write that landed during the read: its answer may mix versions.
        // An unmoved mark says none did (see `Inner::tip`); else the head
        // tells.
        if mark.is_none() || backend.change_mark() != mark {
            let after = backend.head(&inner.id)?.map(|h| h.version);
            if after != Some(self.version) {
                return Ok(ReadResult::VersionConflict {
                    expected: self.version,
                    actual: after.unwrap_or_default(),
                });
            }
        }
        if !inner.alive() {
            return Ok(ReadResult::OwnerLost);
        }
        if cancel.is_cancelled() {
            return Ok(ReadResult::Cancelled);
        }
        Ok(result)
    }
}

impl SessionHandle {
    /// Captures a read capability at the live transcript version, bound
    /// to this handle (see the module docs). Fails with `OwnerLost` on a
    /// closed or invalidated handle.
    pub fn prepare_read(&self) -> Result<HistoryRead, HandleError> {
        Ok(self.prepare_at_mark()?.0)
    }

    /// [`SessionHandle::prepare_read`], and the change mark taken before
    /// the version was found.
    fn prepare_at_mark(&self) -> Result<(HistoryRead, Option<ChangeMark>), HandleError> {
        if !self.inner.alive() {
            return Err(self.inner.owner_lost());
        }
        let Some(tip) = self.inner.tip(self.inner.backend()?)? else {
            return Err(HandleError::NotFound {
                id: self.inner.id.clone(),
            });
        };
        Ok((
            HistoryRead {
                inner: self.inner.clone(),
                version: tip.version,
                leaf: tip.leaf,
            },
            tip.mark,
        ))
    }

    /// Prepares a read at the live version and runs it. For a page after
    /// the first, the continuation carries the version it was taken at; a
    /// changed version is a [`ReadResult::VersionConflict`].
    pub fn read(
        &self,
        selection: &HistorySelection,
        cancel: &CancelToken,
    ) -> Result<ReadResult<HistoryValue>, HandleError> {
        if cancel.is_cancelled() {
            return Ok(ReadResult::Cancelled);
        }
        if !self.inner.alive() {
            return Ok(ReadResult::OwnerLost);
        }
        // The version is captured and read at once: the head just read is
        // the live one, so the capability's own first check (a second head
        // read) is skipped; the check after the read still catches a write
        // that landed since.
        let (read, mark) = self.prepare_at_mark()?;
        read.read_checked(read.inner.backend()?, mark, selection, cancel)
    }
}
