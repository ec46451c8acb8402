//! The resident snapshot a handle publishes, and how a replacement is
//! built incrementally: extended in memory after plain appends under the
//! leaf ([`extend`]), else rebuilt through the backend reusing what the
//! previous snapshot holds ([`build`]).

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use serde::Serialize;

use super::HandleError;
use crate::session::{AgentSessionInfo, SessionId};
use crate::store::StoreError;
use crate::store::{AppendReceipt, TranscriptBackend, TranscriptHead};
use crate::transcript::{
    entry_size, select_resident_sized, BoundaryCounts, Budget, ChildLinks, CustomRef, Entry,
    EntryFacts, EntryId, EntrySource, ModelContext, NavLinks, PathFacts, ResidentSelection,
    SharedSeq, TranscriptVersion, CHILD_LINKS_MAX,
};

/// An immutable, shared, bounded view of a session: what a live handle
/// holds. Replaced (never mutated) after every committed write through
/// the handle; readers keep the `Arc` they took.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResidentSnapshot {
    pub session_id: SessionId,
    /// The header at the snapshot's session version.
    pub header: AgentSessionInfo,
    /// The session version (commit count) the snapshot was built at: the
    /// fence of the handle's next write.
    pub session_version: u64,
    pub version: TranscriptVersion,
    pub leaf: Option<EntryId>,
    /// Entries in the transcript's current generation (not resident).
    pub transcript_entries: u64,
    /// The bounded selection: resident entries, omitted oversized
    /// entries, navigation links, model and thinking level, boundary
    /// counts, completeness.
    pub selection: ResidentSelection,
    /// The owner incarnation (the handle) that published it.
    pub owner: u64,
    /// Local revision: 1 for the snapshot published at open, +1 per
    /// publication by this handle.
    pub revision: u64,
    /// [`entry_size`] of each resident entry, aligned with
    /// `selection.entries`: the next publication reuses them instead of
    /// encoding every resident entry again.
    #[serde(skip)]
    pub(crate) sizes: SharedSeq<u64>,
}

impl ResidentSnapshot {
    /// Boundary counts (path, context, resident, omitted, beyond budget).
    pub fn counts(&self) -> BoundaryCounts {
        self.selection.counts
    }

    /// Sum of [`entry_size`] of the resident entries (≤ the byte budget).
    pub fn resident_bytes(&self) -> u64 {
        self.selection.counts.resident_bytes
    }

    /// Resident entries plus omitted-entry records (≤ the event budget).
    pub fn resident_events(&self) -> u64 {
        self.selection
            .counts
            .resident_entries
            .saturating_add(self.selection.counts.omitted_entries)
    }

    /// The [`entry_size`] kept for each resident entry (aligned with
    /// [`ResidentSnapshot::entries`]); for tests.
    #[cfg(feature = "test-hooks")]
    pub fn resident_sizes(&self) -> &SharedSeq<u64> {
        &self.sizes
    }

    /// Every context entry is resident.
    pub fn is_complete(&self) -> bool {
        self.selection.complete
    }

    pub fn budget(&self) -> Budget {
        self.selection.budget
    }

    /// Model in force at the leaf.
    pub fn model(&self) -> Option<&(String, String)> {
        self.selection.model.as_ref()
    }

    /// Thinking level in force at the leaf.
    pub fn thinking_level(&self) -> Option<&str> {
        self.selection.thinking_level.as_deref()
    }

    /// Resident entries in path order (shared with the snapshots extended
    /// from this one).
    pub fn entries(&self) -> &SharedSeq<Arc<Entry>> {
        &self.selection.entries
    }

    /// A resident entry.
    pub fn get(&self, id: &EntryId) -> Option<&Entry> {
        self.selection.get(id)
    }

    /// The model context built from the resident entries (see
    /// [`ResidentSelection::context`]).
    pub fn context(&self) -> ModelContext {
        self.selection.context()
    }
}

/// How a replacement snapshot may reuse the previous one.
pub(crate) struct Reuse<'a> {
    pub prev: &'a ResidentSnapshot,
    /// Entries just committed (appended or rewritten), complete.
    pub fresh: &'a [Arc<Entry>],
    /// Previous resident entries that changed (rewritten, removed,
    /// relinked): never taken from the previous snapshot.
    pub changed: HashSet<EntryId>,
    /// The generation the live head is at if nothing but the caller's
    /// commit happened since `prev`: entries are reused only then.
    pub generation: u64,
    /// Whether the previous navigation links are still right except for
    /// the parents of `fresh` entries (only after an append or a leaf move
    /// that directly follows the previous snapshot).
    pub links: bool,
}

/// The backend's source with the previous snapshot's resident entries and
/// the just-committed ones in front: a replacement selection loads from
/// storage only what it did not hold already (cost proportional to the
/// budget, not the history).
struct Overlay<'a> {
    base: &'a dyn EntrySource<Error = StoreError>,
    /// Entries held already, with their size when known.
    entries: HashMap<&'a EntryId, (Held<'a>, Option<u64>)>,
    links: HashMap<&'a EntryId, &'a NavLinks>,
}

/// An entry the overlay holds: shared by the previous snapshot, or just
/// committed.
#[derive(Clone, Copy)]
enum Held<'a> {
    Shared(&'a Arc<Entry>),
    Fresh(&'a Entry),
}

impl<'a> Held<'a> {
    fn entry(self) -> &'a Entry {
        match self {
            Held::Shared(e) => e,
            Held::Fresh(e) => e,
        }
    }
}

impl EntrySource for Overlay<'_> {
    type Error = StoreError;

    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, StoreError> {
        match self.entries.get(id) {
            Some((e, _)) => Ok(Some(Cow::Borrowed(e.entry()))),
            None => self.base.entry(id),
        }
    }

    /// A held entry of the previous snapshot is shared, not copied.
    fn shared_entry(&self, id: &EntryId) -> Result<Option<Arc<Entry>>, StoreError> {
        match self.entries.get(id) {
            Some((Held::Shared(e), _)) => Ok(Some(Arc::clone(e))),
            Some((Held::Fresh(e), _)) => Ok(Some(Arc::new((*e).clone()))),
            None => self.base.shared_entry(id),
        }
    }

    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, StoreError> {
        match self.links.get(id) {
            Some(l) if limit <= CHILD_LINKS_MAX => Ok(ChildLinks {
                ids: l.children.iter().take(limit).cloned().collect(),
                total: l.children_total,
            }),
            _ => self.base.children(id, limit),
        }
    }

    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, StoreError> {
        match self.entries.get(id) {
            Some((e, _)) => Ok(Some(EntryFacts::of(e.entry()))),
            None => self.base.facts(id),
        }
    }

    fn entry_size(&self, id: &EntryId) -> Result<Option<u64>, StoreError> {
        match self.entries.get(id) {
            Some((_, Some(s))) => Ok(Some(*s)),
            Some((e, None)) => Ok(Some(entry_size(e.entry()))),
            None => self.base.entry_size(id),
        }
    }

    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, StoreError> {
        self.base.path_facts(id)
    }

    fn ancestor_at_depth(&self, from: &EntryId, depth: u64) -> Result<Option<EntryId>, StoreError> {
        self.base.ancestor_at_depth(from, depth)
    }

    /// The backend's ranges (its index is at the head the selection is
    /// built for; the sizes it gives are those of the held entries).
    fn path_range(
        &self,
        leaf: &EntryId,
        leaf_depth: u64,
        start: u64,
        end: u64,
        bytes_max: u64,
    ) -> Result<Option<Vec<(EntryId, u64)>>, StoreError> {
        self.base
            .path_range(leaf, leaf_depth, start, end, bytes_max)
    }

    fn single_chain(&self, leaf: &EntryId, path_entries: u64) -> Result<Option<bool>, StoreError> {
        self.base.single_chain(leaf, path_entries)
    }

    fn custom_entries_after(
        &self,
        custom_type: Option<&str>,
        after_seq: Option<u64>,
        limit: usize,
    ) -> Result<Option<Vec<CustomRef>>, StoreError> {
        self.base
            .custom_entries_after(custom_type, after_seq, limit)
    }

    fn label(&self, id: &EntryId) -> Result<Option<String>, StoreError> {
        self.base.label(id)
    }

    fn summary(&self, id: &EntryId) -> Result<Option<String>, StoreError> {
        self.base.summary(id)
    }
}

/// The snapshot after `appended` was committed through the handle that
/// published `prev`, as the one commit right after it, built from `prev`
/// and the commit's `receipt` alone (see [`ResidentSelection::extended`]):
/// no head read and no entry, size, facts or children lookups. The receipt
/// must show the next session version and carry the transcript version in
/// `prev`'s generation, else `None`. `appended` must be a chain of new
/// entries under `prev`'s leaf committed as plain appends (transcript
/// events only: the header changes only its version and update time, the
/// last entry is the leaf, the generation grows by `appended.len()`
/// entries); `None` too when the selection cannot be extended without the
/// source. Callers then [`build`].
pub(crate) fn extend(
    prev: &ResidentSnapshot,
    receipt: &AppendReceipt,
    appended: &[Arc<Entry>],
    owner: u64,
    revision: u64,
) -> Option<ResidentSnapshot> {
    let last = appended.last()?;
    let added = u64::try_from(appended.len()).ok()?;
    let version = receipt.transcript?;
    if receipt.session_version != prev.session_version.checked_add(1)?
        || version.generation != prev.version.generation
    {
        return None;
    }
    let transcript_entries = prev.transcript_entries.checked_add(added)?;
    let (selection, sizes) = if receipt.entry_sizes.len() == appended.len() {
        // Measured by the store for its index.
        prev.selection
            .extended_measured(&prev.sizes, appended, &receipt.entry_sizes)?
    } else {
        let measured: Vec<u64> = appended.iter().map(|e| entry_size(e)).collect();
        prev.selection
            .extended_measured(&prev.sizes, appended, &measured)?
    };
    let mut header = prev.header.clone();
    header.version = receipt.session_version;
    header.updated_at_ms = receipt.updated_at_ms;
    Some(ResidentSnapshot {
        session_id: prev.session_id.clone(),
        header,
        session_version: receipt.session_version,
        version,
        leaf: Some(last.id.clone()),
        transcript_entries,
        selection,
        owner,
        revision,
        sizes,
    })
}

/// Builds a snapshot of `id` at the backend's live head, reusing `reuse`
/// where allowed. Retries (a bounded number of times) when the head moved
/// during the build, so the result is one consistent version.
pub(crate) fn build(
    backend: &dyn TranscriptBackend,
    id: &SessionId,
    budget: Budget,
    owner: u64,
    revision: u64,
    reuse: Option<&Reuse<'_>>,
) -> Result<ResidentSnapshot, HandleError> {
    /// Attempts before a build that keeps racing other writers gives up.
    const BUILD_ATTEMPTS: usize = 4;
    let mut last_err = None;
    for _ in 0..BUILD_ATTEMPTS {
        let Some(head) = backend.head(id)? else {
            return Err(HandleError::NotFound { id: id.clone() });
        };
        let result = build_at(backend, id, &head, budget, owner, revision, reuse);
        let after = backend.head(id)?;
        if after.as_ref().map(|h| (h.header.version, h.version))
            == Some((head.header.version, head.version))
        {
            return result;
        }
        last_err = Some(
            result
                .err()
                .unwrap_or(HandleError::Raced { id: id.clone() }),
        );
    }
    Err(last_err.unwrap_or(HandleError::Raced { id: id.clone() }))
}

fn build_at(
    backend: &dyn TranscriptBackend,
    id: &SessionId,
    head: &TranscriptHead,
    budget: Budget,
    owner: u64,
    revision: u64,
    reuse: Option<&Reuse<'_>>,
) -> Result<ResidentSnapshot, HandleError> {
    let base = backend.source(id)?;
    let mut overlay = Overlay {
        base: &*base,
        entries: HashMap::new(),
        links: HashMap::new(),
    };
    if let Some(r) = reuse {
        // Entries are immutable within a generation; the caller's own
        // rewrite names every entry it changed (`changed`).
        if head.version.generation == r.generation {
            let sizes = r
                .prev
                .sizes
                .iter()
                .map(|s| Some(*s))
                .chain(std::iter::repeat(None));
            for (e, size) in r.prev.selection.entries.iter().zip(sizes) {
                if !r.changed.contains(&e.id) {
                    overlay.entries.insert(&e.id, (Held::Shared(e), size));
                }
            }
        }
        for e in r.fresh {
            overlay.entries.insert(&e.id, (Held::Fresh(e), None));
        }
        let follows = head.header.version == r.prev.session_version.saturating_add(1);
        if r.links && follows {
            let touched: HashSet<&EntryId> = r
                .fresh
                .iter()
                .filter_map(|e| e.parent_id.as_ref())
                .collect();
            for l in &r.prev.selection.links {
                if !touched.contains(&l.id) && !r.changed.contains(&l.id) {
                    overlay.links.insert(&l.id, &**l);
                }
            }
        }
    }
    let (selection, sizes) =
        select_resident_sized(&overlay, head.leaf.as_ref(), budget).map_err(|source| {
            HandleError::Selection {
                id: id.clone(),
                source,
            }
        })?;
    Ok(ResidentSnapshot {
        session_id: id.clone(),
        header: head.header.clone(),
        session_version: head.header.version,
        version: head.version,
        leaf: head.leaf.clone(),
        transcript_entries: head.entries,
        selection,
        owner,
        revision,
        sizes: SharedSeq::from(sizes),
    })
}
