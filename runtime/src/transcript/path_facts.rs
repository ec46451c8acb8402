//! Per-entry path facts: what the root→entry path implies for an entry,
//! computed in O(1) from its parent's facts at append time.
//!
//! A store persists one [`PathFacts`] next to each entry in its index.
//! With them, opening a session at a leaf needs no walk to the root: the
//! path length, the context start, the pinned compaction and the model and
//! thinking settings are read from the leaf's facts, and
//! [`select_resident`](super::resident::select_resident) only walks the
//! entries it keeps (cost proportional to the budget, not the history).
//!
//! The rules mirror [`context_start`](super::context::context_start):
//!
//! * a **reset** starts the context at itself and clears the compaction;
//! * a **compaction** after the latest reset starts the context at its
//!   first kept entry if that entry is an ancestor after the latest reset,
//!   else at the compaction itself;
//! * any other entry inherits its parent's context start;
//! * the **model** and **thinking level** are the latest on the path
//!   ([`PathMarker`] of each entry).
//!
//! Whether a compaction's first kept entry is an ancestor is not a fact of
//! the parent alone, so [`PathFacts::child`] takes it as an argument (the
//! depth of the first kept entry when it is an ancestor).
//! [`first_kept_depth`] resolves it through an [`EntrySource`] by walking
//! up from the parent to the first kept entry's depth: a cost proportional
//! to the kept range, paid once per compaction at append time.

use std::collections::HashMap;
use std::convert::Infallible;

use serde::{Deserialize, Serialize};

use super::context::PathMarker;
use super::entry::{Entry, EntryId, EntryKind};
use super::resident::{walk_path, ResidentError};
use super::source::EntrySource;
use super::tree::{Transcript, TranscriptError};

/// An entry on a path and its depth (0 = the root of the path).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Anchor {
    pub id: EntryId,
    pub depth: u64,
}

/// What the root→entry path implies for one entry (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PathFacts {
    /// Number of ancestors on the path (0 for a root, or for an orphan
    /// whose parent is absent: its path stops at it).
    pub depth: u64,
    /// The first entry of the context segment of this entry.
    pub context_start: Anchor,
    /// The latest reset on the path (inclusive).
    pub reset: Option<Anchor>,
    /// The latest compaction after the latest reset (inclusive): its
    /// summary heads the context and is pinned in resident selections.
    pub compaction: Option<Anchor>,
    /// The compaction keeps the path entries before it (its first kept
    /// entry is an ancestor after the latest reset).
    pub compaction_keeps_prefix: bool,
    /// `(provider, model_id)` in force at this entry.
    pub model: Option<(String, String)>,
    /// Thinking level in force at this entry.
    pub thinking_level: Option<String>,
}

impl PathFacts {
    /// Facts of an entry that starts its path (no parent, or an absent
    /// parent). A root compaction has no ancestors to keep.
    pub fn root(entry: &Entry) -> PathFacts {
        let here = Anchor {
            id: entry.id.clone(),
            depth: 0,
        };
        let mut f = PathFacts {
            depth: 0,
            context_start: here.clone(),
            reset: None,
            compaction: None,
            compaction_keeps_prefix: false,
            model: None,
            thinking_level: None,
        };
        f.apply(entry, None);
        f
    }

    /// Facts of `entry` whose parent has facts `parent`. For a compaction,
    /// `first_kept_depth` is the depth of its first kept entry when that
    /// entry is an ancestor of `entry` (see [`first_kept_depth`]); it is
    /// ignored for every other kind.
    pub fn child(parent: &PathFacts, entry: &Entry, first_kept_depth: Option<u64>) -> PathFacts {
        let mut f = parent.clone();
        f.depth = parent.depth.saturating_add(1);
        f.apply(entry, first_kept_depth);
        f
    }

    /// Updates inherited facts (depth already set) with the entry itself.
    fn apply(&mut self, entry: &Entry, first_kept_depth: Option<u64>) {
        let here = Anchor {
            id: entry.id.clone(),
            depth: self.depth,
        };
        match PathMarker::of(entry) {
            PathMarker::Reset => {
                self.reset = Some(here.clone());
                self.compaction = None;
                self.compaction_keeps_prefix = false;
                self.context_start = here;
            }
            PathMarker::Compaction {
                first_kept_entry_id,
            } => {
                let after_reset = self.reset.as_ref().map_or(0, |r| r.depth.saturating_add(1));
                self.compaction = Some(here.clone());
                match first_kept_depth {
                    Some(d) if d >= after_reset && d < self.depth => {
                        self.compaction_keeps_prefix = true;
                        self.context_start = Anchor {
                            id: first_kept_entry_id,
                            depth: d,
                        };
                    }
                    _ => {
                        self.compaction_keeps_prefix = false;
                        self.context_start = here;
                    }
                }
            }
            PathMarker::Model { provider, model_id } => {
                self.model = Some((provider, model_id));
            }
            PathMarker::ThinkingLevel { thinking_level } => {
                self.thinking_level = Some(thinking_level);
            }
            _ => {}
        }
    }

    /// Entries on the root→entry path.
    pub fn path_entries(&self) -> u64 {
        self.depth.saturating_add(1)
    }

    /// Entries of the context segment (context start → entry).
    pub fn context_entries(&self) -> u64 {
        self.depth
            .saturating_sub(self.context_start.depth)
            .saturating_add(1)
    }
}

/// For a compaction entry whose parent is `parent_id`: the depth of its
/// first kept entry if that entry is an ancestor of the compaction, found
/// by walking parents from `parent_id` (depth `parent_depth`) up to the
/// first kept entry's depth. `None` for other kinds, or when the first
/// kept entry is absent or not an ancestor. Cost: one facts lookup for the
/// first kept entry, then one per entry of the kept range.
pub fn first_kept_depth<S: EntrySource + ?Sized>(
    source: &S,
    entry: &Entry,
    parent_depth: u64,
) -> Result<Option<u64>, ResidentError<S::Error>> {
    let EntryKind::Compaction {
        first_kept_entry_id,
        ..
    } = &entry.kind
    else {
        return Ok(None);
    };
    let Some(mut cur) = entry.parent_id.clone() else {
        return Ok(None);
    };
    let Some(kept) = source
        .path_facts(first_kept_entry_id)
        .map_err(ResidentError::Source)?
    else {
        if source
            .facts(first_kept_entry_id)
            .map_err(ResidentError::Source)?
            .is_none()
        {
            return Ok(None);
        }
        // No stored facts: walk up to the root looking for it.
        return ancestor_depth_by_walk(source, &cur, first_kept_entry_id);
    };
    if kept.depth > parent_depth {
        return Ok(None);
    }
    let mut depth = parent_depth;
    loop {
        if &cur == first_kept_entry_id {
            return Ok((depth == kept.depth).then_some(depth));
        }
        if depth <= kept.depth {
            return Ok(None);
        }
        let Some(f) = source.facts(&cur).map_err(ResidentError::Source)? else {
            return Ok(None);
        };
        match f.parent_id {
            Some(p) => cur = p,
            None => return Ok(None),
        }
        depth -= 1;
    }
}

/// The depth of `target` on the root→`from` path, by walking all of it.
fn ancestor_depth_by_walk<S: EntrySource + ?Sized>(
    source: &S,
    from: &EntryId,
    target: &EntryId,
) -> Result<Option<u64>, ResidentError<S::Error>> {
    let mut steps: Option<u64> = None;
    let mut n: u64 = 0;
    walk_path(source, from, |id, _| {
        if steps.is_none() && id == target {
            steps = Some(n);
        }
        n = n.saturating_add(1);
    })?;
    // `n` entries on the path: `from` has depth n - 1.
    Ok(steps.map(|s| n.saturating_sub(1).saturating_sub(s)))
}

/// The facts of `id` computed by walking its whole root path through the
/// source (O(path) time, O(1) memory). This is what
/// [`select_resident`](super::resident::select_resident) falls back to when
/// the source has no stored facts ([`EntrySource::path_facts`] is `None`).
pub fn path_facts_by_walk<S: EntrySource + ?Sized>(
    source: &S,
    id: &EntryId,
) -> Result<PathFacts, ResidentError<S::Error>> {
    /// Where the context segment starts, found while walking back.
    enum Seek {
        /// No reset or compaction seen yet.
        Open,
        /// The latest compaction was seen (`steps` from the entry); looking
        /// for its first kept entry.
        Kept {
            first_kept: EntryId,
        },
        Closed,
    }
    let mut n: u64 = 0;
    let mut seek = Seek::Open;
    // Anchors as (id, steps from `id`); depths are known once n is.
    let mut start: Option<(EntryId, u64)> = None;
    let mut reset: Option<(EntryId, u64)> = None;
    let mut compaction: Option<(EntryId, u64)> = None;
    let mut keeps_prefix = false;
    let mut model = None;
    let mut thinking_level = None;
    let mut last: Option<EntryId> = None;
    walk_path(source, id, |cur, facts| {
        match &facts.marker {
            PathMarker::Model { provider, model_id } if model.is_none() => {
                model = Some((provider.clone(), model_id.clone()));
            }
            PathMarker::ThinkingLevel { thinking_level: t } if thinking_level.is_none() => {
                thinking_level = Some(t.clone());
            }
            PathMarker::Reset if reset.is_none() => reset = Some((cur.clone(), n)),
            _ => {}
        }
        match &seek {
            Seek::Open => match &facts.marker {
                PathMarker::Reset => {
                    start = Some((cur.clone(), n));
                    seek = Seek::Closed;
                }
                PathMarker::Compaction {
                    first_kept_entry_id,
                } => {
                    compaction = Some((cur.clone(), n));
                    seek = Seek::Kept {
                        first_kept: first_kept_entry_id.clone(),
                    };
                }
                _ => {}
            },
            Seek::Kept { first_kept } => {
                if facts.marker == PathMarker::Reset {
                    // The first kept entry is not after the latest reset.
                    start = compaction.clone();
                    seek = Seek::Closed;
                } else if cur == first_kept {
                    start = Some((cur.clone(), n));
                    keeps_prefix = true;
                    seek = Seek::Closed;
                }
            }
            Seek::Closed => {}
        }
        last = Some(cur.clone());
        n = n.saturating_add(1);
    })?;
    let depth = n.saturating_sub(1);
    let anchor = |(id, steps): (EntryId, u64)| Anchor {
        id,
        depth: depth.saturating_sub(steps),
    };
    let start = match seek {
        Seek::Open => last.map(|l| (l, depth)),
        Seek::Kept { .. } => compaction.clone(),
        Seek::Closed => start,
    };
    let context_start = match start {
        Some(s) => anchor(s),
        // walk_path visits at least `id` itself or fails.
        None => Anchor {
            id: id.clone(),
            depth,
        },
    };
    Ok(PathFacts {
        depth,
        context_start,
        reset: reset.map(anchor),
        compaction: compaction.map(anchor),
        compaction_keeps_prefix: keeps_prefix,
        model,
        thinking_level,
    })
}

impl Transcript {
    /// [`PathFacts`] of every entry, computed incrementally in append order
    /// with [`PathFacts::root`] / [`PathFacts::child`] (as a store does at
    /// append time). Entries whose parent comes later in append order (only
    /// possible via `replace_all`) are computed by walking. Errors: a parent
    /// cycle.
    pub fn path_facts_all(&self) -> Result<HashMap<EntryId, PathFacts>, TranscriptError> {
        let mut out: HashMap<EntryId, PathFacts> = HashMap::with_capacity(self.len());
        for e in self.entries() {
            if out.contains_key(&e.id) || self.get(&e.id) != Some(e) {
                continue; // a duplicate id: the first occurrence is indexed
            }
            let parent = e.parent_id.as_ref().filter(|p| self.contains(p));
            let facts = match parent {
                None => PathFacts::root(e),
                Some(p) => match out.get(p) {
                    Some(pf) => {
                        let view = IndexedTranscript {
                            transcript: self,
                            facts: &out,
                        };
                        let kept = first_kept_depth(&view, e, pf.depth).map_err(cycle(&e.id))?;
                        PathFacts::child(pf, e, kept)
                    }
                    None => path_facts_by_walk(self, &e.id).map_err(cycle(&e.id))?,
                },
            };
            out.insert(e.id.clone(), facts);
        }
        Ok(out)
    }
}

fn cycle(id: &EntryId) -> impl FnOnce(ResidentError<Infallible>) -> TranscriptError + '_ {
    move |_| TranscriptError::ParentCycle(id.clone())
}

/// A [`Transcript`] with precomputed [`PathFacts`] (see
/// [`Transcript::path_facts_all`]): an [`EntrySource`] that answers
/// [`EntrySource::path_facts`] like a store's index does.
#[derive(Clone, Copy, Debug)]
pub struct IndexedTranscript<'a> {
    pub transcript: &'a Transcript,
    pub facts: &'a HashMap<EntryId, PathFacts>,
}

impl<'a> IndexedTranscript<'a> {
    pub fn new(transcript: &'a Transcript, facts: &'a HashMap<EntryId, PathFacts>) -> Self {
        IndexedTranscript { transcript, facts }
    }
}

impl EntrySource for IndexedTranscript<'_> {
    type Error = Infallible;

    fn entry(&self, id: &EntryId) -> Result<Option<std::borrow::Cow<'_, Entry>>, Infallible> {
        self.transcript.entry(id)
    }

    fn children(
        &self,
        id: &EntryId,
        limit: usize,
    ) -> Result<super::resident::ChildLinks, Infallible> {
        EntrySource::children(self.transcript, id, limit)
    }

    fn facts(&self, id: &EntryId) -> Result<Option<super::resident::EntryFacts>, Infallible> {
        self.transcript.facts(id)
    }

    fn path_facts(&self, id: &EntryId) -> Result<Option<PathFacts>, Infallible> {
        Ok(self.facts.get(id).cloned())
    }

    fn custom_entries_after(
        &self,
        custom_type: Option<&str>,
        after_seq: Option<u64>,
        limit: usize,
    ) -> Result<Option<Vec<super::resident::CustomRef>>, Infallible> {
        self.transcript
            .custom_entries_after(custom_type, after_seq, limit)
    }

    fn label(&self, id: &EntryId) -> Result<Option<String>, Infallible> {
        EntrySource::label(self.transcript, id)
    }
}
