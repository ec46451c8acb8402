//! Resident-snapshot selection: the bounded part of a transcript a live
//! session keeps in memory.
//!
//! [`select_resident`] walks back from a leaf along the context path (the
//! entries from [`context_start`](super::context::context_start) to the
//! leaf) and keeps, newest first, the entries that fit a [`Budget`] of bytes
//! and events. Nothing is dropped or truncated silently:
//!
//! * an entry larger than the whole byte budget is recorded as
//!   [omitted](OmittedEntry) (id, kind, size) and the walk goes on past it;
//! * the first entry that does not fit what is left of the budget ends the
//!   walk: it and every older context entry are not resident, and the
//!   selection says so (`complete == false`, with counts).
//!
//! Two rules keep the working set a context a model can be given:
//!
//! * **The leaf is never dropped for an older entry**: a leaf larger than
//!   the byte budget that gives the context a message (a message, custom
//!   message or branch summary) is recorded as omitted and nothing older is
//!   held (not even the pinned compaction), rather than a context that ends
//!   on an older turn. A leaf that gives no message (plugin state, a label,
//!   a setting) is omitted and the walk goes on: the context is the same.
//! * **A tool result is held only with its call**: a held result whose call
//!   the budget left out (beyond the budget, or in an omitted entry between
//!   it and the nearest held assistant message) is dropped too, bytes and
//!   all. A result that is an orphan in the transcript itself stays; the
//!   context drops it.
//!
//! **Unit of the byte budget**: the length in bytes of an entry's compact
//! JSON encoding (`serde_json::to_vec(entry)`), see [`entry_size`]. It is
//! deterministic for a given entry. **Events**: each resident entry and each
//! omitted-entry record uses one event of `events_max` (so the memory of the
//! omitted list is bounded too).
//!
//! **Pinned compaction**: when the context is governed by a compaction
//! (its summary heads the context), that compaction entry is pinned: its
//! event slot and bytes are reserved before the walk, so it is held even
//! when the budget cuts the entries between it and the newest ones (the
//! selection then holds the summary followed by the newest entries). The
//! byte budget still holds (`resident_bytes <= bytes_max`); if the
//! compaction alone is larger than the byte budget it is recorded as
//! omitted like any oversized entry. With `events_max == 0` nothing is
//! held, not even the pin.
//!
//! The selection is storage independent: it reads through [`EntrySource`],
//! implemented here for [`Transcript`] and by the store for its indexes.
//! The leaf's [`PathFacts`] (path length, context start, pinned
//! compaction, settings) come from [`EntrySource::path_facts`] when the
//! source stores them (then the cost is proportional to the budget), else
//! from a walk to the root ([`path_facts_by_walk`]: O(path) small lookups,
//! O(1) memory, parent cycles detected with Brent's algorithm). The
//! newest-first walk reads ids and sizes in ranges of depths
//! ([`EntrySource::path_range`]: the first up to the leaf's 64-depth block
//! boundary, each later one as long as the mean size kept so far says the
//! budget still needs, plus two) when the source answers them, else one
//! facts/size lookup per held entry plus the one that did not fit; a
//! refused range turns the rest of the walk into the lookups. Navigation
//! links take one [`EntrySource::children`] lookup per resident entry,
//! none when the source says the transcript is a single chain
//! ([`EntrySource::single_chain`]: each entry's only child is the next one
//! on the path, the walk saw it). Only resident payloads are loaded
//! ([`EntrySource::shared_entry`]: a source may share them with its cache);
//! what a live handle holds does not grow with history length.

use std::borrow::Cow;
use std::convert::Infallible;
use std::sync::Arc;

/// An entry a caller appended, as [`ResidentSelection::extended_measured`]
/// takes it: read in place, and kept as a shared [`Arc<Entry>`] when the
/// selection holds it (an `Arc` given is kept as it is, an [`Entry`] is
/// copied into one).
pub trait AppendedEntry {
    fn entry(&self) -> &Entry;
    fn shared(&self) -> Arc<Entry>;
}

impl AppendedEntry for Entry {
    fn entry(&self) -> &Entry {
        self
    }
    fn shared(&self) -> Arc<Entry> {
        Arc::new(self.clone())
    }
}

impl AppendedEntry for Arc<Entry> {
    fn entry(&self) -> &Entry {
        self
    }
    fn shared(&self) -> Arc<Entry> {
        Arc::clone(self)
    }
}

use serde::Serialize;

use super::context::{context_messages_segment, ModelContext, PathMarker};
use super::entry::{ContentBlock, Entry, EntryId, EntryKind, Message};
use super::path_facts::{path_facts_by_walk, PathFacts};
use super::shared_seq::{Appended, MapLast, SharedSeq};
use super::source::EntrySource;
use super::tree::Transcript;

/// Default resident byte budget (64 KiB).
pub const DEFAULT_RESIDENT_BYTES_MAX: u64 = 64 * 1024;
/// Default resident event budget.
pub const DEFAULT_RESIDENT_EVENTS_MAX: u64 = 1024;
/// Maximum number of child ids kept in the navigation links of one
/// resident entry; [`NavLinks::children_total`] gives the full count.
pub const CHILD_LINKS_MAX: usize = 64;

/// A byte and event budget for a resident selection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Budget {
    /// Maximum sum of [`entry_size`] of the resident entries.
    pub bytes_max: u64,
    /// Maximum number of resident entries plus omitted-entry records.
    pub events_max: u64,
}

impl Budget {
    pub const UNLIMITED: Budget = Budget {
        bytes_max: u64::MAX,
        events_max: u64::MAX,
    };

    pub const fn new(bytes_max: u64, events_max: u64) -> Self {
        Budget {
            bytes_max,
            events_max,
        }
    }
}

impl Default for Budget {
    fn default() -> Self {
        Budget::new(DEFAULT_RESIDENT_BYTES_MAX, DEFAULT_RESIDENT_EVENTS_MAX)
    }
}

/// What walking the context path needs to know about an entry, without
/// its payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EntryFacts {
    pub parent_id: Option<EntryId>,
    /// [`Entry::kind_name`] of the entry.
    pub kind: String,
    pub marker: PathMarker,
}

impl EntryFacts {
    pub fn of(entry: &Entry) -> Self {
        EntryFacts {
            parent_id: entry.parent_id.clone(),
            kind: entry.kind_name().to_string(),
            marker: PathMarker::of(entry),
        }
    }
}

/// Up to a limit of child ids (append order) and the total count.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct ChildLinks {
    pub ids: Vec<EntryId>,
    pub total: u64,
}

/// A custom entry found by [`EntrySource::custom_entries_after`]: its
/// append sequence number (position in append order for a [`Transcript`],
/// the log sequence for a store; strictly increasing in append order) and
/// id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct CustomRef {
    pub seq: u64,
    pub id: EntryId,
}

impl EntrySource for Transcript {
    type Error = Infallible;

    fn entry(&self, id: &EntryId) -> Result<Option<Cow<'_, Entry>>, Infallible> {
        Ok(self.get(id).map(Cow::Borrowed))
    }

    fn children(&self, id: &EntryId, limit: usize) -> Result<ChildLinks, Infallible> {
        let kids = self.children(id);
        Ok(ChildLinks {
            total: u64::try_from(kids.len()).unwrap_or(u64::MAX),
            ids: kids.into_iter().take(limit).map(|e| e.id.clone()).collect(),
        })
    }

    fn facts(&self, id: &EntryId) -> Result<Option<EntryFacts>, Infallible> {
        Ok(self.get(id).map(EntryFacts::of))
    }

    /// Scans the entries after `after_seq` (a store answers from an index).
    fn custom_entries_after(
        &self,
        custom_type: Option<&str>,
        after_seq: Option<u64>,
        limit: usize,
    ) -> Result<Option<Vec<CustomRef>>, Infallible> {
        let from = match after_seq {
            None => 0,
            Some(s) => usize::try_from(s).map_or(usize::MAX, |s| s.saturating_add(1)),
        };
        let found = self
            .entries()
            .iter()
            .enumerate()
            .skip(from)
            // Only indexed entries (a duplicate id is not part of the tree).
            .filter(|(_, e)| self.get(&e.id) == Some(*e))
            .filter(|(_, e)| match &e.kind {
                EntryKind::Custom { custom_type: t, .. } => {
                    custom_type.is_none() || custom_type == Some(t.as_str())
                }
                _ => false,
            })
            .take(limit)
            .map(|(i, e)| CustomRef {
                seq: u64::try_from(i).unwrap_or(u64::MAX),
                id: e.id.clone(),
            })
            .collect();
        Ok(Some(found))
    }

    fn label(&self, id: &EntryId) -> Result<Option<String>, Infallible> {
        Ok(Transcript::label(self, id).map(str::to_string))
    }
}

/// The size of an entry in byte-budget units: the length of its compact
/// JSON encoding. Counted without building the encoding. Entry types
/// always encode; if one ever failed, `u64::MAX` is returned so the entry
/// is treated as oversized (omitted and reported), never silently dropped.
pub fn entry_size(entry: &Entry) -> u64 {
    // Counted without `serde_json` when the entry has only the shapes the
    // fast count knows (anything else, e.g. a float in custom data, falls
    // through to `serde_json`'s own count).
    if let Some(n) = super::json_size::json_len(entry) {
        return n;
    }
    struct Counter(u64);
    impl std::io::Write for Counter {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 = self
                .0
                .saturating_add(u64::try_from(buf.len()).unwrap_or(u64::MAX));
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut c = Counter(0);
    match serde_json::to_writer(&mut c, entry) {
        Ok(()) => c.0,
        Err(_) => u64::MAX,
    }
}

/// An entry of the current context that is not resident because it alone
/// is larger than the byte budget. It is still stored in full.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct OmittedEntry {
    pub id: EntryId,
    pub kind: String,
    pub size: u64,
}

/// Navigation links of a resident entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct NavLinks {
    pub id: EntryId,
    pub parent_id: Option<EntryId>,
    /// At most [`CHILD_LINKS_MAX`] children, append order.
    pub children: Vec<EntryId>,
    pub children_total: u64,
}

/// Boundary counts of a resident selection.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BoundaryCounts {
    /// Entries on the root→leaf path.
    pub path_entries: u64,
    /// Entries of the current context segment (context start → leaf).
    pub context_entries: u64,
    /// Entries held in the selection.
    pub resident_entries: u64,
    /// Sum of [`entry_size`] of the resident entries.
    pub resident_bytes: u64,
    /// Context entries recorded as omitted (oversized).
    pub omitted_entries: u64,
    /// Older context entries beyond the budget (neither resident nor
    /// recorded as omitted).
    pub beyond_budget_entries: u64,
}

/// A bounded selection of the current context of a leaf.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ResidentSelection {
    pub leaf: Option<EntryId>,
    pub budget: Budget,
    /// First entry of the context segment (`None` for an empty path).
    pub context_start: Option<EntryId>,
    /// Resident entries in path order (oldest first), byte-exact. Shared:
    /// a selection extended from this one holds the same entries.
    #[serde(serialize_with = "serialize_shared")]
    pub entries: SharedSeq<Arc<Entry>>,
    /// Oversized context entries, in path order.
    pub omitted: Vec<OmittedEntry>,
    /// Navigation links of the resident entries, same order as `entries`
    /// (shared like the entries).
    #[serde(serialize_with = "serialize_shared")]
    pub links: SharedSeq<Arc<NavLinks>>,
    /// Model in force at the leaf (from the whole path).
    pub model: Option<(String, String)>,
    /// Thinking level in force at the leaf (from the whole path).
    pub thinking_level: Option<String>,
    pub counts: BoundaryCounts,
    /// Every context entry is resident (nothing omitted, nothing beyond
    /// the budget).
    pub complete: bool,
    /// The compaction heading the context, pinned: held (resident, or
    /// omitted when it alone exceeds the byte budget) even when the budget
    /// cuts the entries between it and the newest ones. `None` when the
    /// context has no compaction or `events_max` is 0.
    pub pinned: Option<EntryId>,
    /// The path facts of the leaf (`None` for an empty leaf).
    pub path_facts: Option<PathFacts>,
    /// Whether the latest compaction in the context keeps the entries of
    /// the segment before it (its first kept entry was found on the path).
    compaction_keeps_prefix: bool,
    /// Where each omitted record sits among the resident entries: the
    /// number of resident entries before it in path order (aligned with
    /// `omitted`). With it the selection knows the path order of all the
    /// entries it holds, which [`ResidentSelection::extended`] needs to
    /// drop the oldest ones.
    #[serde(skip)]
    omitted_at: Vec<u64>,
    /// Where the pinned compaction is held (index in `entries` or in
    /// `omitted`): [`ResidentSelection::extended`] keeps it in place
    /// while it drops the oldest of the other held entries.
    #[serde(skip)]
    pin_slot: PinSlot,
    /// The walk left out entries the budget alone would have held (an
    /// omitted leaf ended it, or tool results went with their calls), so
    /// the held entries are not the newest that fit:
    /// [`ResidentSelection::extended`] defers to the full selection.
    #[serde(skip)]
    ruled: bool,
}

impl ResidentSelection {
    /// The model context built from the resident entries. Equal to the
    /// full context when the selection is complete; otherwise it lacks the
    /// messages of the omitted and beyond-budget entries (and tool results
    /// whose calls are among those are dropped as orphans).
    pub fn context(&self) -> ModelContext {
        let refs: Vec<&Entry> = self.entries.iter().map(|e| &**e).collect();
        ModelContext {
            messages: context_messages_segment(&refs, self.compaction_keeps_prefix),
            model: self.model.clone(),
            thinking_level: self.thinking_level.clone(),
        }
    }

    /// A resident entry by id: a linear search, newest first (the entries
    /// asked for are mostly recent ones).
    pub fn get(&self, id: &EntryId) -> Option<&Entry> {
        self.entries
            .iter()
            .rev()
            .find(|e| &e.id == id)
            .map(|e| &**e)
    }
}

/// A resident selection failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ResidentError<E: std::error::Error + 'static> {
    #[error("reading the entry source failed")]
    Source(#[source] E),
    #[error("leaf {0} is not in the transcript")]
    UnknownLeaf(EntryId),
    #[error("the parent links above entry {0} form a cycle")]
    ParentCycle(EntryId),
    /// The source changed while it was walked (an entry seen in the first
    /// pass is absent in the second); the caller should read from a
    /// consistent snapshot.
    #[error("entry {0} vanished from the source during the selection")]
    Vanished(EntryId),
}

/// Selects the resident part of the context of `leaf` (see the module
/// docs). `leaf == None` gives an empty, complete selection.
pub fn select_resident<S: EntrySource + ?Sized>(
    source: &S,
    leaf: Option<&EntryId>,
    budget: Budget,
) -> Result<ResidentSelection, ResidentError<S::Error>> {
    select_resident_sized(source, leaf, budget).map(|(sel, _)| sel)
}

/// [`select_resident`], with the [`entry_size`] of each resident entry
/// (aligned with `entries`) as the walk learnt them.
pub(crate) fn select_resident_sized<S: EntrySource + ?Sized>(
    source: &S,
    leaf: Option<&EntryId>,
    budget: Budget,
) -> Result<(ResidentSelection, Vec<u64>), ResidentError<S::Error>> {
    let mut sel = ResidentSelection {
        leaf: leaf.cloned(),
        budget,
        context_start: None,
        entries: SharedSeq::new(),
        omitted: Vec::new(),
        links: SharedSeq::new(),
        model: None,
        thinking_level: None,
        counts: BoundaryCounts::default(),
        complete: true,
        pinned: None,
        path_facts: None,
        compaction_keeps_prefix: false,
        omitted_at: Vec::new(),
        pin_slot: PinSlot::None,
        ruled: false,
    };
    let Some(leaf) = leaf else {
        return Ok((sel, Vec::new()));
    };

    // Pass 1: the leaf's path facts, stored by the source or walked.
    let facts = match source.path_facts(leaf).map_err(ResidentError::Source)? {
        Some(f) => f,
        None => path_facts_by_walk(source, leaf)?,
    };
    let context_entries = facts.context_entries();
    sel.counts.path_entries = facts.path_entries();
    sel.counts.context_entries = context_entries;
    sel.context_start = Some(facts.context_start.id.clone());
    sel.model = facts.model.clone();
    sel.thinking_level = facts.thinking_level.clone();
    sel.compaction_keeps_prefix = facts.compaction_keeps_prefix;

    // The compaction heading the context is pinned: its slot (one event,
    // its bytes) is reserved before the newest-first walk.
    let mut events_left = budget.events_max;
    let mut bytes_left = budget.bytes_max;
    let mut pin: Option<Pinned> = None;
    if let Some(c) = &facts.compaction {
        if events_left > 0 {
            events_left -= 1;
            let size = source
                .entry_size(&c.id)
                .map_err(ResidentError::Source)?
                .ok_or_else(|| ResidentError::Vanished(c.id.clone()))?;
            pin = Some(if size > budget.bytes_max {
                Pinned::Omitted(OmittedEntry {
                    id: c.id.clone(),
                    kind: "compaction".to_string(),
                    size,
                })
            } else {
                bytes_left -= size;
                let entry = source
                    .shared_entry(&c.id)
                    .map_err(ResidentError::Source)?
                    .ok_or_else(|| ResidentError::Vanished(c.id.clone()))?;
                Pinned::Resident(entry, size)
            });
            sel.pinned = Some(c.id.clone());
        }
    }

    // Pass 2: newest first, keep what fits. Built newest first: the
    // sizes of the resident entries and, for each, its child on the path
    // when the walk saw it (`Some(None)` for the leaf, which has none on
    // the path; `None` when unknown: a pinned compaction placed after
    // the walk stopped below it).
    let mut entries: Vec<Arc<Entry>> = Vec::new();
    let mut sizes: Vec<u64> = Vec::new();
    let mut path_child: Vec<Option<Option<EntryId>>> = Vec::new();
    let mut walk = Walk::new(source, leaf, &facts);
    let mut newer: Option<EntryId> = None;
    let mut seen: u64 = 0;
    let mut pin_placed = false;
    let mut leaf_omitted = false;
    while seen < context_entries {
        // How many more entries the walk likely takes (the one that ends
        // it included), from the mean size of those kept so far: the
        // next range asked is that long.
        let kept = len_u64(sizes.len());
        let likely = match sel.counts.resident_bytes.checked_div(kept) {
            Some(mean) if mean > 0 => (bytes_left / mean)
                .saturating_add(2)
                .min(events_left.saturating_add(1)),
            _ => PATH_RANGE_DEPTHS,
        };
        let Some(step) = walk.step(likely, newer.as_ref())? else {
            break;
        };
        let cur = step.id;
        if sel.pinned.as_ref() == Some(&cur) {
            if let Some(p) = pin.take() {
                p.place(
                    &mut sel,
                    &mut entries,
                    &mut sizes,
                    &mut path_child,
                    Some(newer.clone()),
                );
            }
            pin_placed = true;
        } else {
            let size = match step.size {
                Some(s) => s,
                None => source
                    .entry_size(&cur)
                    .map_err(ResidentError::Source)?
                    .ok_or_else(|| ResidentError::Vanished(cur.clone()))?,
            };
            if events_left == 0 {
                break;
            }
            if size > budget.bytes_max {
                let kind = match step.facts {
                    Some(f) => f.kind,
                    None => {
                        source
                            .facts(&cur)
                            .map_err(ResidentError::Source)?
                            .ok_or_else(|| ResidentError::Vanished(cur.clone()))?
                            .kind
                    }
                };
                // The leaf is never dropped for an older entry: with a
                // leaf that gives the context a message omitted, nothing
                // older is held (not even the pin).
                leaf_omitted = &cur == leaf && gives_message(&kind);
                sel.omitted.push(OmittedEntry {
                    id: cur.clone(),
                    kind,
                    size,
                });
                sel.omitted_at.push(len_u64(entries.len()));
            } else if size > bytes_left {
                break;
            } else {
                let entry = source
                    .shared_entry(&cur)
                    .map_err(ResidentError::Source)?
                    .ok_or_else(|| ResidentError::Vanished(cur.clone()))?;
                bytes_left -= size;
                sel.counts.resident_bytes = sel.counts.resident_bytes.saturating_add(size);
                entries.push(entry);
                sizes.push(size);
                path_child.push(Some(newer.clone()));
            }
            events_left -= 1;
        }
        seen = seen.saturating_add(1);
        newer = Some(cur);
        if leaf_omitted {
            break;
        }
    }
    if leaf_omitted {
        sel.ruled = true;
        if !pin_placed {
            pin = None;
            sel.pinned = None;
        }
    }
    if !pin_placed {
        // The walk stopped before the pinned compaction: it is the oldest
        // held entry.
        if let Some(p) = pin.take() {
            p.place(&mut sel, &mut entries, &mut sizes, &mut path_child, None);
        }
    }
    entries.reverse();
    sizes.reverse();
    path_child.reverse();
    sel.omitted.reverse();
    // Pushed newest first as "resident entries newer than it": turned into
    // "resident entries before it" in path order.
    let resident = len_u64(entries.len());
    sel.omitted_at.reverse();
    for at in &mut sel.omitted_at {
        *at = resident.saturating_sub(*at);
    }
    drop_orphan_results(&mut sel, &mut entries, &mut sizes, &mut path_child);
    sel.counts.resident_entries = u64::try_from(entries.len()).unwrap_or(u64::MAX);
    sel.counts.omitted_entries = u64::try_from(sel.omitted.len()).unwrap_or(u64::MAX);
    sel.counts.beyond_budget_entries = context_entries
        .saturating_sub(sel.counts.resident_entries)
        .saturating_sub(sel.counts.omitted_entries);
    sel.complete = sel.counts.resident_entries == context_entries;
    let path_entries = facts.path_entries();
    sel.path_facts = Some(facts);

    // Navigation links. In a single chain the walk already knows them.
    let chain = !entries.is_empty()
        && source
            .single_chain(leaf, path_entries)
            .map_err(ResidentError::Source)?
            == Some(true);
    let mut links: Vec<Arc<NavLinks>> = Vec::with_capacity(entries.len());
    for (e, child) in entries.iter().zip(path_child) {
        let kids = match (chain, child) {
            (true, Some(None)) => ChildLinks::default(),
            (true, Some(Some(c))) => ChildLinks {
                ids: vec![c],
                total: 1,
            },
            _ => source
                .children(&e.id, CHILD_LINKS_MAX)
                .map_err(ResidentError::Source)?,
        };
        links.push(Arc::new(NavLinks {
            id: e.id.clone(),
            parent_id: e.parent_id.clone(),
            children: kids.ids,
            children_total: kids.total,
        }));
    }
    if let Some(p) = &sel.pinned {
        sel.pin_slot = match entries.iter().position(|e| &e.id == p) {
            Some(i) => PinSlot::Resident(i),
            None => sel
                .omitted
                .iter()
                .position(|o| &o.id == p)
                .map_or(PinSlot::None, PinSlot::Omitted),
        };
    }
    sel.entries = SharedSeq::from(entries);
    sel.links = SharedSeq::from(links);
    Ok((sel, sizes))
}

/// Whether an entry of this kind ([`Entry::kind_name`]) can give the
/// context a message (the others only settings, or nothing).
fn gives_message(kind: &str) -> bool {
    matches!(kind, "message" | "custom_message" | "branch_summary")
}

/// A held tool result whose call is in no held assistant message before it
/// is dropped (with its size and path child), so the working set never
/// holds a result without its call: the pair is held or dropped together.
/// `entries` are in path order; the omitted records' places follow.
fn drop_orphan_results(
    sel: &mut ResidentSelection,
    entries: &mut Vec<Arc<Entry>>,
    sizes: &mut Vec<u64>,
    path_child: &mut Vec<Option<Option<EntryId>>>,
) {
    // Only a result whose call the budget left out: the walk stopped
    // before the context start, or an omitted record lies between the
    // result and the nearest held assistant message. (A result that is an
    // orphan in the transcript itself is left to the context, which
    // drops it, so a complete selection holds every context entry.)
    let beyond = sel.counts.context_entries
        > len_u64(entries.len()).saturating_add(len_u64(sel.omitted.len()));
    let keep: Vec<bool> = (0..entries.len())
        .map(|i| !must_drop(|j| entries.get(j).map(|e| &**e), i, &sel.omitted_at, beyond))
        .collect();
    if keep.iter().all(|&k| k) {
        return;
    }
    sel.ruled = true;
    let mut dropped_before = Vec::with_capacity(entries.len() + 1);
    let mut dropped = 0u64;
    for (i, &k) in keep.iter().enumerate() {
        dropped_before.push(dropped);
        if !k {
            dropped += 1;
            sel.counts.resident_bytes = sel.counts.resident_bytes.saturating_sub(sizes[i]);
        }
    }
    dropped_before.push(dropped);
    for at in &mut sel.omitted_at {
        let before = usize::try_from(*at)
            .ok()
            .and_then(|a| dropped_before.get(a))
            .copied()
            .unwrap_or(dropped);
        *at = at.saturating_sub(before);
    }
    let mut it = keep.iter();
    entries.retain(|_| *it.next().unwrap_or(&true));
    let mut it = keep.iter();
    sizes.retain(|_| *it.next().unwrap_or(&true));
    let mut it = keep.iter();
    path_child.retain(|_| *it.next().unwrap_or(&true));
}

/// Whether the held tool result at `i` (path order) goes because the
/// budget left its call out: it is an orphan among the held entries, and
/// either no held assistant message precedes it while the walk stopped
/// before the context start (`beyond`), or an omitted record lies between
/// it and the nearest held assistant message.
fn must_drop<'a>(
    entries: impl Fn(usize) -> Option<&'a Entry> + Copy,
    i: usize,
    omitted_at: &[u64],
    beyond: bool,
) -> bool {
    if !orphan_result_at(entries, i) {
        return false;
    }
    let assistant = (0..i).rev().find(|&j| {
        matches!(
            entries(j).map(|e| &e.kind),
            Some(EntryKind::Message {
                message: Message::Assistant { .. }
            })
        )
    });
    let (lo, cut) = match assistant {
        Some(j) => (len_u64(j + 1), false),
        None => (0, beyond),
    };
    cut || omitted_at.iter().any(|&at| at >= lo && at <= len_u64(i))
}

/// Whether `entries[i]` (path order) is a tool result whose call is not in
/// the latest assistant message held before it.
fn orphan_result_at<'a>(entries: impl Fn(usize) -> Option<&'a Entry> + Copy, i: usize) -> bool {
    let Some(EntryKind::Message {
        message: Message::ToolResult { tool_call_id, .. },
    }) = entries(i).map(|e| &e.kind)
    else {
        return false;
    };
    for e in (0..i).rev().filter_map(entries) {
        if let EntryKind::Message {
            message: Message::Assistant { content, .. },
        } = &e.kind
        {
            return !content
                .iter()
                .any(|b| matches!(b, ContentBlock::ToolCall { id, .. } if id == tool_call_id));
        }
    }
    true
}

/// Most depths asked per [`EntrySource::path_range`] call by the
/// newest-first walk. The first range starts just after a multiple of
/// this, so a source that groups depths in blocks of this many (the log
/// store's active-path index) reads one block for it.
const PATH_RANGE_DEPTHS: u64 = 64;

/// One entry of the newest-first walk of the context path.
struct Step {
    id: EntryId,
    /// Its [`entry_size`] when the walk learnt it from a path range.
    size: Option<u64>,
    /// Its facts when the walk read them (parent by parent).
    facts: Option<EntryFacts>,
}

/// The newest-first walk of a leaf's context path (from the leaf up to
/// the context start, at most): from [`EntrySource::path_range`] ranges
/// while the source answers them (no facts or size lookup per entry),
/// else parent by parent through [`EntrySource::facts`]. A range the
/// source does not answer (not its active path, or a racing write) turns
/// the rest of the walk into the parent-by-parent one from where it is.
struct Walk<'a, S: EntrySource + ?Sized> {
    source: &'a S,
    leaf: &'a EntryId,
    leaf_depth: u64,
    /// Depth of the context start: ranges never go above it.
    top: u64,
    /// The current range, oldest first (taken from the end).
    range: Vec<(EntryId, u64)>,
    /// Depth of the newest entry not yet in a range; `None` once the
    /// ranges reached `top`.
    unread: Option<u64>,
    ranged: bool,
    /// Whether the walk gave an entry yet.
    started: bool,
    /// Parent by parent: the next entry (`None`: the walk is over).
    next: Option<EntryId>,
}

impl<'a, S: EntrySource + ?Sized> Walk<'a, S> {
    fn new(source: &'a S, leaf: &'a EntryId, facts: &PathFacts) -> Self {
        Walk {
            source,
            leaf,
            leaf_depth: facts.depth,
            top: facts.context_start.depth.min(facts.depth),
            range: Vec::new(),
            unread: Some(facts.depth),
            ranged: true,
            started: false,
            next: None,
        }
    }

    /// The next entry, newest first; `likely` is how many more entries
    /// the caller expects to take (the length of a range read now), and
    /// `last` the entry the walk gave before (`None` at the start).
    fn step(
        &mut self,
        likely: u64,
        last: Option<&EntryId>,
    ) -> Result<Option<Step>, ResidentError<S::Error>> {
        if self.ranged {
            if self.range.is_empty() {
                if let Some(end) = self.unread {
                    // The first range ends at a block boundary (nothing is
                    // known about sizes yet); later ones are as long as
                    // the caller expects to need.
                    let len = if !self.started {
                        end.saturating_sub(1) % PATH_RANGE_DEPTHS + 1
                    } else {
                        likely.clamp(1, PATH_RANGE_DEPTHS)
                    };
                    let start = end.saturating_sub(len - 1).max(self.top);
                    let want = usize::try_from(end - start + 1).unwrap_or(usize::MAX);
                    match self
                        .source
                        .path_range(self.leaf, self.leaf_depth, start, end, u64::MAX)
                        .map_err(ResidentError::Source)?
                    {
                        Some(r) if r.len() == want => {
                            self.range = r;
                            self.unread = start.checked_sub(1).filter(|d| *d >= self.top);
                        }
                        _ => self.ranged = false,
                    }
                } else {
                    // Every depth up to the context start was given.
                    return Ok(None);
                }
            }
            if self.ranged {
                if let Some((id, size)) = self.range.pop() {
                    self.started = true;
                    return Ok(Some(Step {
                        id,
                        size: Some(size),
                        facts: None,
                    }));
                }
            }
            // Parent by parent from here: after the last entry given.
            self.ranged = false;
            self.next = match last.filter(|_| self.started) {
                None => Some(self.leaf.clone()),
                Some(l) => {
                    self.source
                        .facts(l)
                        .map_err(ResidentError::Source)?
                        .ok_or_else(|| ResidentError::Vanished(l.clone()))?
                        .parent_id
                }
            };
        }
        let Some(cur) = self.next.take() else {
            return Ok(None);
        };
        let facts = self
            .source
            .facts(&cur)
            .map_err(ResidentError::Source)?
            .ok_or_else(|| ResidentError::Vanished(cur.clone()))?;
        self.next = facts.parent_id.clone();
        Ok(Some(Step {
            id: cur,
            size: None,
            facts: Some(facts),
        }))
    }
}

/// The pinned compaction of a selection, before it is placed.
enum Pinned {
    Resident(Arc<Entry>, u64),
    Omitted(OmittedEntry),
}

impl Pinned {
    /// Adds it to the newest-first lists of `sel` (a resident one with
    /// its size and its child on the path, when known).
    fn place(
        self,
        sel: &mut ResidentSelection,
        entries: &mut Vec<Arc<Entry>>,
        sizes: &mut Vec<u64>,
        path_child: &mut Vec<Option<Option<EntryId>>>,
        child: Option<Option<EntryId>>,
    ) {
        match self {
            Pinned::Resident(e, size) => {
                sel.counts.resident_bytes = sel.counts.resident_bytes.saturating_add(size);
                entries.push(e);
                sizes.push(size);
                path_child.push(child);
            }
            Pinned::Omitted(o) => {
                sel.omitted.push(o);
                sel.omitted_at.push(len_u64(entries.len()));
            }
        }
    }
}

/// Serializes shared values as the values themselves.
fn serialize_shared<T: Serialize, S: serde::Serializer>(
    v: &SharedSeq<Arc<T>>,
    s: S,
) -> Result<S::Ok, S::Error> {
    s.collect_seq(v.iter().map(|a| &**a))
}

fn len_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// One step of the newest-first walk of [`select_resident`]: whether an
/// entry of `size` is held (resident or omitted) with what is left of the
/// budget, charging it. `false` ends the walk.
fn charge(size: u64, budget: Budget, events_left: &mut u64, bytes_left: &mut u64) -> bool {
    if *events_left == 0 {
        return false;
    }
    if size <= budget.bytes_max {
        if size > *bytes_left {
            return false;
        }
        *bytes_left -= size;
    }
    *events_left -= 1;
    true
}

/// Where a selection holds its pinned compaction. Not always the oldest
/// held entry: when the compaction keeps the segment before it, the
/// context starts there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum PinSlot {
    #[default]
    None,
    /// Index in `entries`.
    Resident(usize),
    /// Index in `omitted`.
    Omitted(usize),
}

impl ResidentSelection {
    /// The selection [`select_resident`] gives for the last entry of
    /// `appended`, computed from this selection alone (no source reads),
    /// when `appended` is a chain of entries just appended under this
    /// selection's leaf: the first one's parent is the leaf, each next
    /// one's parent the one before, and none of their ids was in the
    /// transcript before. `sizes` are the [`entry_size`] of this
    /// selection's resident entries (aligned with `entries`); the new
    /// selection comes with those of its own.
    ///
    /// The new entries join the newest end of the context, then the
    /// oldest held entries are dropped until the budget holds, exactly as
    /// the newest-first walk would stop: the held entries of this
    /// selection are the newest context entries that fitted, so with the
    /// new ones in front the walk keeps a newest part of them and stops
    /// where it stopped before at the latest. The pinned compaction stays
    /// pinned, the path facts follow with [`PathFacts::child`], the
    /// leaf's navigation links gain the first new entry. A reset among the
    /// new entries restarts the context at it.
    ///
    /// The cost follows the appended and the dropped entries (and the
    /// omitted records), not the resident ones: the new selection shares
    /// the kept entries, links and sizes with this one ([`SharedSeq`]).
    /// For that it trusts what it does not touch: `counts.resident_bytes`
    /// is the sum of `sizes`, and each held entry keeps its kind
    /// (resident entries fit the byte budget, omitted ones exceed it).
    /// Selections from [`select_resident`] and from this method are so.
    ///
    /// `None` when the outcome needs the source: an empty `appended` or an
    /// empty leaf, a chain not under the leaf, a compaction among the new
    /// entries (its first kept entry must be looked up), or a selection
    /// whose parts disagree. Callers then run [`select_resident`].
    pub fn extended(
        &self,
        sizes: &SharedSeq<u64>,
        appended: &[Entry],
    ) -> Option<(ResidentSelection, SharedSeq<u64>)> {
        let appended_sizes: Vec<u64> = appended.iter().map(entry_size).collect();
        self.extended_measured(sizes, appended, &appended_sizes)
    }

    /// [`ResidentSelection::extended`] given the appended entries' sizes
    /// ([`entry_size`] of each, in order; a store that measured them for
    /// its index reports them in its receipt), so they are not measured
    /// twice. `None` as there, and when the sizes are not one per entry.
    ///
    /// The appended entries may be shared ([`Arc<Entry>`]): the selection
    /// then keeps them as they are instead of copying them.
    pub fn extended_measured<E: AppendedEntry>(
        &self,
        sizes: &SharedSeq<u64>,
        appended: &[E],
        appended_sizes: &[u64],
    ) -> Option<(ResidentSelection, SharedSeq<u64>)> {
        if appended_sizes.len() != appended.len() {
            return None;
        }
        let shared = appended;
        let appended: Vec<&Entry> = shared.iter().map(AppendedEntry::entry).collect();
        let appended = appended.as_slice();
        debug_assert!(
            appended
                .iter()
                .zip(appended_sizes)
                .all(|(e, &n)| entry_size(e) == n),
            "appended sizes are the entries' sizes"
        );
        if self.ruled {
            return None;
        }
        let budget = self.budget;
        let leaf = self.leaf.as_ref()?;
        let facts = self.path_facts.as_ref()?;
        let last = appended.last()?;
        let resident = self.entries.len();
        if sizes.len() != resident
            || self.links.len() != resident
            || self.omitted_at.len() != self.omitted.len()
        {
            return None;
        }
        // Omitted records sit in path order among the resident entries.
        let mut prev_at = 0u64;
        for &at in &self.omitted_at {
            if at < prev_at || at > len_u64(resident) {
                return None;
            }
            prev_at = at;
        }
        debug_assert_eq!(
            sizes.iter().fold(0u64, |a, s| a.saturating_add(*s)),
            self.counts.resident_bytes,
            "resident bytes are the sum of the sizes"
        );
        let mut parent = leaf;
        for e in appended {
            if e.parent_id.as_ref() != Some(parent)
                || matches!(e.kind, EntryKind::Compaction { .. })
            {
                return None;
            }
            parent = &e.id;
        }
        let mut new_facts = facts.clone();
        for e in appended {
            new_facts = PathFacts::child(&new_facts, e, None);
        }
        // The context's entries newest first are `fresh` (reversed), then
        // what this selection held (when the context did not restart),
        // then entries beyond the budget.
        let restart = appended
            .iter()
            .rposition(|e| matches!(e.kind, EntryKind::Reset));
        // Where `fresh` starts in `appended` (and `shared`).
        let fresh_at = restart.unwrap_or(0);
        let fresh = appended.get(fresh_at..)?;
        let pinned = new_facts
            .compaction
            .as_ref()
            .filter(|_| budget.events_max > 0)
            .map(|a| a.id.clone());
        let mut events_left = budget.events_max;
        let mut bytes_left = budget.bytes_max;
        let mut pin_bytes = 0u64;
        let pin = match (&pinned, restart) {
            (None, Some(_)) => PinSlot::None,
            (None, None) if self.pinned.is_none() => PinSlot::None,
            (Some(p), None) if self.pinned.as_ref() == Some(p) => {
                events_left = events_left.checked_sub(1)?;
                match self.pin_slot {
                    PinSlot::Resident(i) if &self.entries.get(i)?.id == p => {
                        pin_bytes = *sizes.get(i)?;
                        bytes_left = bytes_left.checked_sub(pin_bytes)?;
                    }
                    PinSlot::Omitted(i) if &self.omitted.get(i)?.id == p => {}
                    _ => return None,
                }
                self.pin_slot
            }
            _ => return None,
        };
        let fresh_sizes = appended_sizes.get(appended.len() - fresh.len()..)?;
        let mut take_fresh = 0usize;
        for &size in fresh_sizes.iter().rev() {
            if !charge(size, budget, &mut events_left, &mut bytes_left) {
                break;
            }
            take_fresh += 1;
        }
        // A new leaf over the byte budget is omitted, and then nothing
        // older may be held: the full selection settles that.
        if take_fresh > 0
            && *fresh_sizes.last()? > budget.bytes_max
            && gives_message(last.kind_name())
        {
            return None;
        }

        // The held entries besides the pin, oldest first, are dropped
        // until the rest fits what the budget has left (everything when
        // the context restarted or not every new entry fitted): the
        // newest-first walk keeps the longest newest part that fits.
        let pin_res = match pin {
            PinSlot::Resident(i) => Some(i),
            _ => None,
        };
        let pin_om = match pin {
            PinSlot::Omitted(i) => Some(i),
            _ => None,
        };
        let mut held_events = len_u64(resident - usize::from(pin_res.is_some()))
            .saturating_add(len_u64(self.omitted.len() - usize::from(pin_om.is_some())));
        let mut held_bytes = self.counts.resident_bytes.saturating_sub(pin_bytes);
        let drop_all = restart.is_some() || take_fresh < fresh.len();
        // Cursors over the held entries in path order (an omitted record
        // comes before the resident entry its `omitted_at` names); the pin
        // is passed over, never dropped.
        let (mut r, mut o) = (0usize, 0usize);
        let mut dropped_bytes = 0u64;
        while held_events > 0 && (drop_all || held_events > events_left || held_bytes > bytes_left)
        {
            let omitted_next = self.omitted_at.get(o).is_some_and(|&at| at <= len_u64(r));
            if omitted_next {
                o += 1;
                if pin_om == Some(o - 1) {
                    continue;
                }
                // An omitted record exceeds the byte budget.
                if self.omitted.get(o - 1)?.size <= budget.bytes_max {
                    return None;
                }
            } else {
                r += 1;
                if pin_res == Some(r - 1) {
                    continue;
                }
                let size = *sizes.get(r - 1)?;
                if size > budget.bytes_max {
                    return None;
                }
                held_bytes = held_bytes.saturating_sub(size);
                dropped_bytes = dropped_bytes.saturating_add(size);
            }
            held_events -= 1;
        }
        // A pin the cursors passed is kept first; one they did not reach
        // stays where it is among the kept.
        let res_pin_passed = pin_res.filter(|&i| i < r);
        let om_pin_passed = pin_om.filter(|&i| i < o);
        let kept_old = resident - r + usize::from(res_pin_passed.is_some());

        // The leaf's links gain the first new entry, when the leaf is the
        // newest resident entry kept (it is the newest held entry if held
        // at all, and only a resident one has links).
        let first_new = &appended.first()?.id;
        let newest_kept = if resident > r {
            self.entries.last()
        } else {
            res_pin_passed.and_then(|i| self.entries.get(i))
        };
        let leaf_kept = newest_kept.is_some_and(|e| &e.id == leaf);
        let add_child = |l: &Arc<NavLinks>| -> Arc<NavLinks> {
            let mut l = l.clone();
            let m = Arc::make_mut(&mut l);
            if m.children_total < len_u64(CHILD_LINKS_MAX) {
                m.children.push(first_new.clone());
            }
            m.children_total = m.children_total.saturating_add(1);
            l
        };
        let map_links: MapLast<'_, Arc<NavLinks>> = if leaf_kept { Some(&add_child) } else { None };

        // The kept old omitted records, then the new ones, with their
        // places among the kept resident entries: everything the cursors
        // passed is older than every kept record but the pin.
        let before_kept = u64::from(res_pin_passed.is_some());
        let mut omitted = Vec::new();
        let mut omitted_at = Vec::new();
        let mut kept_om: Vec<usize> = Vec::new();
        kept_om.extend(om_pin_passed);
        kept_om.extend(o..self.omitted.len());
        for i in kept_om {
            omitted.push(self.omitted.get(i)?.clone());
            let at = *self.omitted_at.get(i)?;
            omitted_at.push(at.saturating_sub(len_u64(r)).saturating_add(before_kept));
        }
        let mut new_entries = Vec::with_capacity(take_fresh);
        let mut new_links = Vec::with_capacity(take_fresh);
        let mut new_sizes = Vec::with_capacity(take_fresh);
        let mut fresh_bytes = 0u64;
        let first = fresh.len() - take_fresh;
        for (k, e) in fresh.iter().enumerate().skip(first) {
            let size = *fresh_sizes.get(k)?;
            if size > budget.bytes_max {
                omitted.push(OmittedEntry {
                    id: e.id.clone(),
                    kind: e.kind_name().to_string(),
                    size,
                });
                omitted_at.push(len_u64(kept_old + new_entries.len()));
            } else {
                let child = fresh.get(k + 1).map(|c| c.id.clone());
                new_links.push(Arc::new(NavLinks {
                    id: e.id.clone(),
                    parent_id: e.parent_id.clone(),
                    children_total: u64::from(child.is_some()),
                    children: child.into_iter().collect(),
                }));
                new_entries.push(shared.get(fresh_at + k)?.shared());
                new_sizes.push(size);
                fresh_bytes = fresh_bytes.saturating_add(size);
            }
        }
        let pin_slot = match (pin_res, pin_om) {
            (Some(i), _) => PinSlot::Resident(i.saturating_sub(r)),
            (_, Some(i)) => PinSlot::Omitted(i.saturating_sub(o)),
            _ => PinSlot::None,
        };
        // Entries weigh their bytes: an arena is replaced once what it
        // keeps alive beyond the window exceeds the byte budget.
        let new_resident = new_entries.len();
        let entries = self.entries.extended(
            pin_res,
            r,
            Appended {
                dropped_weight: dropped_bytes,
                live_weight_max: budget.bytes_max,
                ..Appended::new(new_entries)
            },
        )?;
        // No tool result held without its call (as the full selection
        // rules: see `drop_orphan_results`): a result before the first held
        // assistant message, or a new one, that would go is for the full
        // selection to settle.
        let held = |j: usize| entries.get(j).map(|e| &**e);
        let n = entries.len();
        let context_entries = new_facts.context_entries();
        let beyond = context_entries > len_u64(n).saturating_add(len_u64(omitted.len()));
        let first_assistant = (0..n)
            .find(|&j| {
                matches!(
                    held(j).map(|e| &e.kind),
                    Some(EntryKind::Message {
                        message: Message::Assistant { .. }
                    })
                )
            })
            .unwrap_or(n);
        if (0..first_assistant)
            .chain(n.saturating_sub(new_resident).max(first_assistant)..n)
            .any(|i| must_drop(held, i, &omitted_at, beyond))
        {
            return None;
        }
        let links = self.links.extended(
            pin_res,
            r,
            Appended {
                map_last: map_links,
                ..Appended::new(new_links)
            },
        )?;
        let out_sizes = sizes.extended(pin_res, r, Appended::new(new_sizes))?;

        let resident_entries = len_u64(entries.len());
        let omitted_entries = len_u64(omitted.len());
        let counts = BoundaryCounts {
            path_entries: new_facts.path_entries(),
            context_entries,
            resident_entries,
            resident_bytes: self
                .counts
                .resident_bytes
                .saturating_sub(dropped_bytes)
                .saturating_add(fresh_bytes),
            omitted_entries,
            beyond_budget_entries: context_entries
                .saturating_sub(resident_entries)
                .saturating_sub(omitted_entries),
        };
        Some((
            ResidentSelection {
                leaf: Some(last.id.clone()),
                budget,
                context_start: Some(new_facts.context_start.id.clone()),
                entries,
                omitted,
                links,
                model: new_facts.model.clone(),
                thinking_level: new_facts.thinking_level.clone(),
                counts,
                complete: resident_entries == context_entries,
                pinned,
                compaction_keeps_prefix: new_facts.compaction_keeps_prefix,
                path_facts: Some(new_facts),
                omitted_at,
                pin_slot,
                ruled: false,
            },
            out_sizes,
        ))
    }
}

/// Calls `visit` for each entry from `leaf` up to its root (or to an entry
/// whose parent is absent: the path stops there). O(1) memory; a parent
/// cycle is detected with Brent's algorithm.
pub(crate) fn walk_path<S: EntrySource + ?Sized>(
    source: &S,
    leaf: &EntryId,
    mut visit: impl FnMut(&EntryId, &EntryFacts),
) -> Result<(), ResidentError<S::Error>> {
    let mut facts = source
        .facts(leaf)
        .map_err(ResidentError::Source)?
        .ok_or_else(|| ResidentError::UnknownLeaf(leaf.clone()))?;
    let mut cur = leaf.clone();
    let mut tortoise = leaf.clone();
    let mut power: u64 = 1;
    let mut lam: u64 = 0;
    loop {
        visit(&cur, &facts);
        let Some(parent) = facts.parent_id.take() else {
            return Ok(());
        };
        let Some(pf) = source.facts(&parent).map_err(ResidentError::Source)? else {
            // Orphan: the parent is not in the transcript.
            return Ok(());
        };
        if lam == power {
            tortoise = cur.clone();
            power = power.saturating_mul(2);
            lam = 0;
        }
        cur = parent;
        facts = pf;
        lam += 1;
        if cur == tortoise {
            return Err(ResidentError::ParentCycle(leaf.clone()));
        }
    }
}
