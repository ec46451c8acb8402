//! The in-memory transcript tree: every entry of a session plus its leaf.
//!
//! Besides the entries in append order, a [`Transcript`] keeps derived
//! in-memory indexes (id → position, parent → children in append order,
//! resolved labels) so that lookups cost O(1) and navigation costs are
//! proportional to what they return. The indexes are never serialized: the
//! serialized form stays `{"entries": [...], "leaf": ...}`. They are built
//! by the first query that needs them after a transcript is deserialized
//! or replaced, so one that is only decoded, cut and encoded again (a
//! session loaded to be forked) never builds them.
//!
//! Tree queries here are pure; they never mutate the transcript. Operations
//! that change it ([`Navigation`]) are planned by pure functions and applied
//! with [`Transcript::apply`], so a caller can persist the planned event first
//! and apply it only once it is committed.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, OnceLock};

use serde::{Deserialize, Serialize};

use super::entry::{ContentBlock, Entry, EntryId, EntryKind, Message};

/// Maximum number of characters of a [`TreeRow::summary`]; longer texts are
/// shortened with a trailing `…` (the row is a display aid, the entry itself
/// is never shortened).
pub const TREE_SUMMARY_CHARS_MAX: usize = 80;

/// A whole transcript held in memory: entries in append order and the
/// persisted leaf (the entry new entries attach to). This is what a fully
/// loaded `AgentState` carries; bounded views are built with
/// [`select_resident`](super::resident::select_resident).
#[derive(Clone, Default, Deserialize)]
#[serde(from = "TranscriptRepr")]
pub struct Transcript {
    /// Shared by clones until one of them changes: a session's state and
    /// the pending `created` event that carries it (a fork's seed) hold
    /// one copy of the entries, not two.
    entries: Arc<Vec<Entry>>,
    leaf: Option<EntryId>,
    /// The lookups derived from `entries`, built on the first query that
    /// needs them: a transcript that is only decoded, cut, encoded or
    /// dropped (a snapshot loaded to be forked, a created event decoded by
    /// an indexer) never pays for them. Once built, appends keep them
    /// current; `replace_all` discards them.
    derived: OnceLock<Derived>,
}

/// The lookups of a [`Transcript`], derived from its entries alone.
#[derive(Clone)]
struct Derived {
    /// Id → position in `entries` (first occurrence wins).
    by_id: HashMap<EntryId, usize>,
    /// Parent id → positions of its children, in append order.
    children: HashMap<EntryId, Vec<usize>>,
    /// Resolved labels (replaying label entries in append order).
    labels: HashMap<EntryId, String>,
}

impl Derived {
    /// The lookups of `entries`, in one pass in append order.
    fn build(entries: &[Entry]) -> Derived {
        let mut d = Derived {
            by_id: HashMap::with_capacity(entries.len()),
            // Most entries are some entry's child (a chain: all but the root).
            children: HashMap::with_capacity(entries.len()),
            labels: HashMap::new(),
        };
        for (pos, entry) in entries.iter().enumerate() {
            d.add(pos, entry);
        }
        d
    }

    /// Adds `entry`, at `pos` in `entries`, to the lookups.
    fn add(&mut self, pos: usize, entry: &Entry) {
        if self.by_id.contains_key(&entry.id) {
            // A duplicate id (only via replace_all): the first one stays
            // authoritative, the duplicate is not linked into the tree.
            return;
        }
        self.by_id.insert(entry.id.clone(), pos);
        if let Some(p) = &entry.parent_id {
            self.children.entry(p.clone()).or_default().push(pos);
        }
        if let EntryKind::Label { target_id, label } = &entry.kind {
            match label.as_deref() {
                Some(l) if !l.is_empty() => {
                    self.labels.insert(target_id.clone(), l.to_string());
                }
                // `None` or an empty label clears it.
                _ => {
                    self.labels.remove(target_id);
                }
            }
        }
    }
}

/// The serialized form of a [`Transcript`] (indexes are derived, not stored).
#[derive(Deserialize)]
struct TranscriptRepr {
    entries: Vec<Entry>,
    leaf: Option<EntryId>,
}

#[derive(Serialize)]
struct TranscriptReprRef<'a> {
    entries: &'a [Entry],
    leaf: &'a Option<EntryId>,
}

impl From<TranscriptRepr> for Transcript {
    fn from(r: TranscriptRepr) -> Self {
        let mut t = Transcript::new();
        t.replace_all(r.entries, r.leaf);
        t
    }
}

impl Serialize for Transcript {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        TranscriptReprRef {
            entries: &self.entries,
            leaf: &self.leaf,
        }
        .serialize(s)
    }
}

impl std::fmt::Debug for Transcript {
    /// Entries and leaf only; the indexes are derived from them.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transcript")
            .field("entries", &self.entries)
            .field("leaf", &self.leaf)
            .finish()
    }
}

impl PartialEq for Transcript {
    /// Two transcripts are equal when their entries and leaf are; the
    /// indexes are derived from those.
    fn eq(&self, other: &Self) -> bool {
        self.entries == other.entries && self.leaf == other.leaf
    }
}

/// A transcript operation was refused.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum TranscriptError {
    #[error("entry {0} already exists in this transcript")]
    DuplicateEntry(EntryId),
    #[error("entry {0} is not in this transcript")]
    UnknownEntry(EntryId),
    /// The parent links reachable from an entry loop back on themselves
    /// (only possible in entries installed with `replace_all` or read from
    /// damaged data; `append` cannot create a cycle).
    #[error("the parent links above entry {0} form a cycle")]
    ParentCycle(EntryId),
}

/// One row of [`Transcript::tree`]: a node of the tree in pre-order.
///
/// The tree is returned flat (rows in depth-first pre-order, children in
/// append order) rather than as nested nodes: a linear history of many
/// thousands of entries is a tree that deep, and building, dropping or
/// serializing it recursively would exhaust the stack.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TreeRow {
    pub id: EntryId,
    pub parent_id: Option<EntryId>,
    /// Entry kind name (`message`, `custom`, ...; see [`Entry::kind_name`]).
    pub kind: &'static str,
    /// For messages the role (`user`, `assistant`, `tool_result`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// A one-line display text, at most [`TREE_SUMMARY_CHARS_MAX`] chars.
    pub summary: String,
    /// The resolved label of this entry, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub label: Option<String>,
    pub timestamp_ms: i64,
    /// Distance from the root of its tree (roots have depth 0).
    pub depth: u32,
    /// Number of ancestors with more than one child: the indentation a
    /// printer needs (a linear run stays at the same indentation).
    pub branch_depth: u32,
    /// Children ids in append order.
    pub children: Vec<EntryId>,
    /// This entry is the current leaf.
    pub is_leaf: bool,
    /// This entry is on the root→leaf path.
    pub on_path: bool,
}

/// A planned change to a transcript, produced by the pure `plan_*`
/// functions and applied with [`Transcript::apply`]. The caller persists it
/// (an appended entry or a leaf move event) before applying it.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub enum Navigation {
    /// Move the leaf to an existing entry, or to `None` (before the root).
    MoveLeaf { to: Option<EntryId> },
    /// Append this entry (its parent is already set); it becomes the leaf.
    Append { entry: Entry },
}

impl Transcript {
    pub fn new() -> Self {
        Self::default()
    }

    /// All entries in append order.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The current leaf, `None` for an empty transcript (or after a move to
    /// before the first entry).
    pub fn leaf(&self) -> Option<&EntryId> {
        self.leaf.as_ref()
    }

    /// The entry with this id (O(1)). If a transcript installed with
    /// `replace_all` holds an id twice, the first occurrence is returned.
    pub fn get(&self, id: &EntryId) -> Option<&Entry> {
        self.derived()
            .by_id
            .get(id)
            .and_then(|&i| self.entries.get(i))
    }

    pub fn contains(&self, id: &EntryId) -> bool {
        self.derived().by_id.contains_key(id)
    }

    /// Appends an entry and makes it the leaf. Its parent must be absent
    /// (a root) or already present; its id must be new.
    pub fn append(&mut self, entry: Entry) -> Result<(), TranscriptError> {
        if self.contains(&entry.id) {
            return Err(TranscriptError::DuplicateEntry(entry.id));
        }
        if let Some(p) = &entry.parent_id {
            if !self.contains(p) {
                return Err(TranscriptError::UnknownEntry(p.clone()));
            }
        }
        self.leaf = Some(entry.id.clone());
        let pos = self.entries.len();
        // The checks above built the lookups: keep them current.
        if let Some(d) = self.derived.get_mut() {
            d.add(pos, &entry);
        }
        Arc::make_mut(&mut self.entries).push(entry);
        Ok(())
    }

    /// Moves the leaf to an existing entry, or to `None` (before the root).
    pub fn set_leaf(&mut self, leaf: Option<EntryId>) -> Result<(), TranscriptError> {
        if let Some(id) = &leaf {
            if !self.contains(id) {
                return Err(TranscriptError::UnknownEntry(id.clone()));
            }
        }
        self.leaf = leaf;
        Ok(())
    }

    /// Replaces all entries and the leaf at once (used by rewrites and
    /// state clears). The caller guarantees the parent links are valid;
    /// if they are not, queries stay panic-free: a missing parent ends a
    /// path there, a cycle is reported as [`TranscriptError::ParentCycle`],
    /// and of duplicated ids only the first occurrence is indexed.
    pub fn replace_all(&mut self, entries: Vec<Entry>, leaf: Option<EntryId>) {
        self.entries = Arc::new(entries);
        self.leaf = leaf;
        self.derived = OnceLock::new();
    }

    /// The derived lookups, built now if no query has needed them yet.
    fn derived(&self) -> &Derived {
        self.derived.get_or_init(|| Derived::build(&self.entries))
    }

    // ----------------------------------------------------------------
    // Tree queries
    // ----------------------------------------------------------------

    /// The children of `id` in append order (empty for an unknown id or a
    /// leaf entry).
    pub fn children(&self, id: &EntryId) -> Vec<&Entry> {
        self.derived()
            .children
            .get(id)
            .map(|v| v.iter().filter_map(|&i| self.entries.get(i)).collect())
            .unwrap_or_default()
    }

    /// The ids of the children of `id` in append order.
    pub fn children_ids(&self, id: &EntryId) -> Vec<EntryId> {
        self.children(id)
            .into_iter()
            .map(|e| e.id.clone())
            .collect()
    }

    /// Number of children of `id`.
    pub fn child_count(&self, id: &EntryId) -> usize {
        self.derived().children.get(id).map_or(0, Vec::len)
    }

    /// Root entries (no parent) and orphans (parent missing), append order.
    pub fn roots(&self) -> Vec<&Entry> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(i, e)| {
                self.derived().by_id.get(&e.id) == Some(i)
                    && !matches!(&e.parent_id, Some(p) if self.contains(p))
            })
            .map(|(_, e)| e)
            .collect()
    }

    /// The entries from `id` up to its root, `id` first.
    ///
    /// If an entry's parent is not in the transcript (an orphan), the path
    /// stops at that entry. Errors: `id` unknown; a parent cycle.
    pub fn path_to_root(&self, id: &EntryId) -> Result<Vec<&Entry>, TranscriptError> {
        let mut cur = self
            .get(id)
            .ok_or_else(|| TranscriptError::UnknownEntry(id.clone()))?;
        let mut out = vec![cur];
        while let Some(p) = cur.parent_id.as_ref().and_then(|p| self.get(p)) {
            // A path longer than the transcript must revisit an entry.
            if out.len() >= self.entries.len() {
                return Err(TranscriptError::ParentCycle(id.clone()));
            }
            out.push(p);
            cur = p;
        }
        Ok(out)
    }

    /// The entries from the root down to `id` (`id` last); see
    /// [`path_to_root`](Self::path_to_root) for orphans and errors.
    pub fn root_path(&self, id: &EntryId) -> Result<Vec<&Entry>, TranscriptError> {
        let mut p = self.path_to_root(id)?;
        p.reverse();
        Ok(p)
    }

    /// The root→leaf path of the current leaf (empty when the leaf is
    /// `None`). Errors if the leaf is unknown or the path has a cycle.
    pub fn current_path(&self) -> Result<Vec<&Entry>, TranscriptError> {
        match &self.leaf {
            None => Ok(Vec::new()),
            Some(l) => self.root_path(l),
        }
    }

    /// The deepest entry that is an ancestor-or-self of both `a` and `b`;
    /// `None` when they lie in different trees (different roots or an
    /// orphaned subtree).
    pub fn common_ancestor(
        &self,
        a: &EntryId,
        b: &EntryId,
    ) -> Result<Option<EntryId>, TranscriptError> {
        let pa = self.path_to_root(a)?;
        let pb = self.path_to_root(b)?;
        let set: HashSet<&EntryId> = pa.iter().map(|e| &e.id).collect();
        Ok(pb
            .iter()
            .find(|e| set.contains(&e.id))
            .map(|e| e.id.clone()))
    }

    /// Entries with more than one child (where the tree branches), in
    /// append order.
    pub fn branch_points(&self) -> Vec<EntryId> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(i, e)| {
                self.derived().by_id.get(&e.id) == Some(i) && self.child_count(&e.id) > 1
            })
            .map(|(_, e)| e.id.clone())
            .collect()
    }

    /// The resolved label of an entry, if any.
    pub fn label(&self, id: &EntryId) -> Option<&str> {
        self.derived().labels.get(id).map(String::as_str)
    }

    /// All resolved labels: a label entry sets (or with `None` / an empty
    /// string clears) the label of its target; the last one in append order
    /// wins. Labels of targets that are not in the transcript are kept (a
    /// label entry may have been imported without its target).
    pub fn labels(&self) -> BTreeMap<EntryId, String> {
        self.derived()
            .labels
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// The whole tree as flat rows in depth-first pre-order (roots and
    /// children in append order), with labels and leaf/path flags. Entries
    /// on a parent cycle (damaged data) are not reachable from a root and
    /// are not listed.
    pub fn tree(&self) -> Vec<TreeRow> {
        let on_path: HashSet<&EntryId> = match &self.leaf {
            Some(l) => self
                .path_to_root(l)
                .map(|p| p.into_iter().map(|e| &e.id).collect())
                .unwrap_or_default(),
            None => HashSet::new(),
        };
        let mut rows = Vec::with_capacity(self.entries.len());
        // Explicit stack (not recursion): trees can be arbitrarily deep.
        let mut stack: Vec<(&Entry, u32, u32)> = self
            .roots()
            .into_iter()
            .rev()
            .map(|e| (e, 0u32, 0u32))
            .collect();
        let mut visited: HashSet<&EntryId> = HashSet::new();
        while let Some((e, depth, branch_depth)) = stack.pop() {
            if !visited.insert(&e.id) {
                continue;
            }
            let kids = self.children(&e.id);
            let child_branch_depth = if kids.len() > 1 {
                branch_depth.saturating_add(1)
            } else {
                branch_depth
            };
            for k in kids.iter().rev() {
                stack.push((k, depth.saturating_add(1), child_branch_depth));
            }
            let (summary, role) = entry_summary(e, TREE_SUMMARY_CHARS_MAX);
            rows.push(TreeRow {
                id: e.id.clone(),
                parent_id: e.parent_id.clone(),
                kind: e.kind_name(),
                role,
                summary,
                label: self.derived().labels.get(&e.id).cloned(),
                timestamp_ms: e.timestamp_ms,
                depth,
                branch_depth,
                children: kids.iter().map(|k| k.id.clone()).collect(),
                is_leaf: self.leaf.as_ref() == Some(&e.id),
                on_path: on_path.contains(&e.id),
            });
        }
        rows
    }

    // ----------------------------------------------------------------
    // Navigation (pure planning + apply)
    // ----------------------------------------------------------------

    /// Plans a leaf move to `to` (an existing entry) or to `None` (before
    /// the root: the next append starts a new root).
    pub fn plan_move_leaf(&self, to: Option<&EntryId>) -> Result<Navigation, TranscriptError> {
        if let Some(id) = to {
            if !self.contains(id) {
                return Err(TranscriptError::UnknownEntry(id.clone()));
            }
        }
        Ok(Navigation::MoveLeaf { to: to.cloned() })
    }

    /// Plans a branch with a summary: a `BranchSummary` entry whose parent
    /// is `target` (or `None`: a new root) and whose `from_id` is the
    /// current leaf (the branch being left). Applying it makes the summary
    /// the leaf, so the model sees the summary where the new branch starts.
    pub fn plan_branch_with_summary(
        &self,
        target: Option<&EntryId>,
        summary: impl Into<String>,
        timestamp_ms: i64,
    ) -> Result<Navigation, TranscriptError> {
        if let Some(id) = target {
            if !self.contains(id) {
                return Err(TranscriptError::UnknownEntry(id.clone()));
            }
        }
        let entry = Entry {
            id: self.fresh_id(),
            parent_id: target.cloned(),
            timestamp_ms,
            kind: EntryKind::BranchSummary {
                from_id: self.leaf.clone(),
                summary: summary.into(),
            },
        };
        Ok(Navigation::Append { entry })
    }

    /// Plans setting (`Some`, non-empty) or clearing (`None` or empty) the
    /// label of `target`. The label entry is appended as a child of the
    /// current leaf (like every append) and becomes the leaf; labels never
    /// enter the model context, so the context is unchanged.
    pub fn plan_label(
        &self,
        target: &EntryId,
        label: Option<String>,
        timestamp_ms: i64,
    ) -> Result<Navigation, TranscriptError> {
        if !self.contains(target) {
            return Err(TranscriptError::UnknownEntry(target.clone()));
        }
        let label = label.filter(|l| !l.is_empty());
        let entry = Entry {
            id: self.fresh_id(),
            parent_id: self.leaf.clone(),
            timestamp_ms,
            kind: EntryKind::Label {
                target_id: target.clone(),
                label,
            },
        };
        Ok(Navigation::Append { entry })
    }

    /// Applies a planned navigation.
    pub fn apply(&mut self, nav: Navigation) -> Result<(), TranscriptError> {
        match nav {
            Navigation::MoveLeaf { to } => self.set_leaf(to),
            Navigation::Append { entry } => self.append(entry),
        }
    }

    /// Positions (in `entries`) of the root→`id` path, root first. Unlike
    /// [`path_to_root`](Self::path_to_root), a missing parent is an error
    /// (`UnknownEntry` of that parent): the path must be complete.
    fn complete_path_positions(&self, id: &EntryId) -> Result<Vec<usize>, TranscriptError> {
        // The built lookups; when no query has needed them yet (a
        // transcript loaded to be cut), a map of first occurrences that
        // borrows the ids instead: no id is copied, no children or labels
        // derived.
        let built = self.derived.get();
        let mut first: foldhash::HashMap<&EntryId, usize> = foldhash::HashMap::default();
        if built.is_none() {
            first.reserve(self.entries.len());
            for (pos, e) in self.entries.iter().enumerate() {
                first.entry(&e.id).or_insert(pos);
            }
        }
        let position = |id: &EntryId| match built {
            Some(d) => d.by_id.get(id).copied(),
            None => first.get(id).copied(),
        };
        let mut pos = position(id).ok_or_else(|| TranscriptError::UnknownEntry(id.clone()))?;
        let mut out = Vec::new();
        loop {
            out.push(pos);
            // A path longer than the transcript must revisit an entry.
            if out.len() > self.entries.len() {
                return Err(TranscriptError::ParentCycle(id.clone()));
            }
            let Some(parent) = self.entries.get(pos).and_then(|e| e.parent_id.as_ref()) else {
                break;
            };
            pos = position(parent).ok_or_else(|| TranscriptError::UnknownEntry(parent.clone()))?;
        }
        out.reverse();
        Ok(out)
    }

    /// Copies of the entries on the root→`id` path, root first. Errors:
    /// `id` or an ancestor's parent unknown (`UnknownEntry` of the missing
    /// id), or a parent cycle.
    pub fn complete_path(&self, id: &EntryId) -> Result<Vec<Entry>, TranscriptError> {
        Ok(self
            .complete_path_positions(id)?
            .into_iter()
            .filter_map(|p| self.entries.get(p).cloned())
            .collect())
    }

    /// Consumes the transcript and returns its root→`id` path as a new
    /// transcript whose leaf is `id`: the path entries are moved, not
    /// copied. Errors as [`complete_path`](Self::complete_path); on error
    /// nothing is returned (the transcript is consumed either way).
    pub fn into_complete_path(self, id: &EntryId) -> Result<Transcript, TranscriptError> {
        let positions = self.complete_path_positions(id)?;
        if positions.windows(2).all(|w| w[0] < w[1]) {
            // The usual layout (every parent before its children): the path
            // is a subsequence of the entries, kept in one pass.
            let mut keep = positions.iter().copied().peekable();
            let entries: Vec<Entry> = Arc::unwrap_or_clone(self.entries)
                .into_iter()
                .enumerate()
                .filter_map(|(p, e)| (keep.next_if_eq(&p).is_some()).then_some(e))
                .collect();
            debug_assert_eq!(entries.len(), positions.len());
            let mut t = Transcript::new();
            t.replace_all(entries, Some(id.clone()));
            return Ok(t);
        }
        // Where each kept position goes in the path (root first).
        let mut slot_of: Vec<Option<usize>> = vec![None; self.entries.len()];
        for (slot, &p) in positions.iter().enumerate() {
            if let Some(s) = slot_of.get_mut(p) {
                *s = Some(slot);
            }
        }
        let mut path: Vec<Option<Entry>> = Vec::with_capacity(positions.len());
        path.resize_with(positions.len(), || None);
        // Moved out when no clone shares them, else copied.
        let entries = Arc::unwrap_or_clone(self.entries);
        for (p, e) in entries.into_iter().enumerate() {
            if let Some(Some(slot)) = slot_of.get(p) {
                if let Some(dst) = path.get_mut(*slot) {
                    *dst = Some(e);
                }
            }
        }
        let entries: Vec<Entry> = path.into_iter().flatten().collect();
        debug_assert_eq!(entries.len(), positions.len());
        let mut t = Transcript::new();
        t.replace_all(entries, Some(id.clone()));
        Ok(t)
    }

    /// A new transcript holding the root→`id` path (same ids, parents and
    /// timestamps), without its label entries; the labels resolved for
    /// entries of that path are re-created as fresh label entries chained
    /// after `id` (with `timestamp_ms`). The fork's leaf is its last entry:
    /// `id`, or the last re-created label entry (which leaves the context
    /// unchanged, labels never enter it).
    pub fn fork_at(&self, id: &EntryId, timestamp_ms: i64) -> Result<Transcript, TranscriptError> {
        let path = self.root_path(id)?;
        let mut fork = Transcript::new();
        let mut on_path: Vec<&EntryId> = Vec::with_capacity(path.len());
        for e in &path {
            on_path.push(&e.id);
            if matches!(e.kind, EntryKind::Label { .. }) {
                continue;
            }
            let mut copy = (*e).clone();
            // A label entry removed above may have been the parent of a
            // later path entry: re-attach to the nearest kept ancestor.
            copy.parent_id = fork.leaf.clone();
            fork.append(copy)?;
        }
        let mut labels: Vec<(&EntryId, &String)> = on_path
            .iter()
            .filter_map(|id| self.derived().labels.get(*id).map(|l| (*id, l)))
            .collect();
        labels.sort();
        for (target, label) in labels {
            let entry = Entry {
                id: fresh_id_avoiding(|c| fork.contains(c) || self.contains(c)),
                parent_id: fork.leaf.clone(),
                timestamp_ms,
                kind: EntryKind::Label {
                    target_id: target.clone(),
                    label: Some(label.clone()),
                },
            };
            fork.append(entry)?;
        }
        Ok(fork)
    }

    /// A generated id that is not yet used in this transcript.
    pub fn fresh_id(&self) -> EntryId {
        fresh_id_avoiding(|c| self.contains(c))
    }
}

/// A generated id for which `taken` is false. Generated ids are random
/// (8 hex chars); after a few collisions a full 32-char UUID is used.
fn fresh_id_avoiding(taken: impl Fn(&EntryId) -> bool) -> EntryId {
    const SHORT_ID_ATTEMPTS: usize = 100;
    for _ in 0..SHORT_ID_ATTEMPTS {
        let id = EntryId::generate();
        if !taken(&id) {
            return id;
        }
    }
    loop {
        let s = uuid::Uuid::new_v4().simple().to_string();
        if let Ok(id) = EntryId::parse(&s) {
            if !taken(&id) {
                return id;
            }
        }
    }
}

/// A one-line display text for an entry (at most `max_chars` chars) and,
/// for messages, the role name.
///
/// The text is the entry's display text with whitespace runs collapsed to
/// single spaces, cut to `max_chars` characters with a trailing `…`. It is
/// built word by word and stops once the cut is known, so its cost is
/// bounded by `max_chars` plus the whitespace skipped, not by the size of
/// the entry.
pub fn entry_summary(entry: &Entry, max_chars: usize) -> (String, Option<&'static str>) {
    let mut line = LineShortener::new(max_chars);
    let role = match &entry.kind {
        EntryKind::Message { message } => match message {
            Message::User { content } => {
                line.blocks(content);
                Some("user")
            }
            Message::Assistant {
                content,
                stop_reason,
                error_message,
                ..
            } => {
                line.blocks(content);
                if let Some(err) = error_message {
                    line.push(&format!("[{stop_reason:?}: {err}]"));
                }
                Some("assistant")
            }
            Message::ToolResult {
                tool_name,
                content,
                is_error,
                ..
            } => {
                let tag = if *is_error { "error" } else { "ok" };
                line.push(&format!("{tool_name} ({tag}): "));
                line.blocks(content);
                Some("tool_result")
            }
        },
        EntryKind::Custom { custom_type, .. } => {
            line.push(custom_type);
            None
        }
        EntryKind::CustomMessage {
            custom_type,
            content,
            ..
        } => {
            line.push(&format!("{custom_type}: "));
            line.blocks(content);
            None
        }
        EntryKind::BranchSummary { summary, .. } => {
            line.push(summary);
            None
        }
        EntryKind::Compaction { summary, .. } => {
            line.push(summary);
            None
        }
        EntryKind::Reset => None,
        EntryKind::ModelChange { provider, model_id } => {
            line.push(&format!("{provider}/{model_id}"));
            None
        }
        EntryKind::ThinkingLevelChange { thinking_level } => {
            line.push(thinking_level);
            None
        }
        EntryKind::Label { target_id, label } => {
            match label {
                Some(l) => line.push(&format!("{target_id} = {l}")),
                None => line.push(&format!("{target_id} cleared")),
            }
            None
        }
        EntryKind::SessionInfo { name } => {
            if let Some(n) = name {
                line.push(n);
            }
            None
        }
    };
    (line.finish(), role)
}

/// The end (a byte offset) of the word that starts `s` and how many
/// characters it has, reading at most `room` characters: the word ends
/// at whitespace (`char::is_whitespace`), at the end of `s`, or after
/// `room` characters. ASCII is read a byte at a time (decoding each char
/// was most of a summary's cost, a visible part of an append), the
/// first other byte hands the rest to the char loop.
fn word_end(s: &str, room: usize) -> (usize, usize) {
    let bytes = s.as_bytes();
    let mut taken = 0usize;
    let mut i = 0usize;
    while let Some(&b) = bytes.get(i) {
        if !b.is_ascii() {
            break;
        }
        // `char::is_whitespace` for ASCII (with the vertical tab, which
        // `u8::is_ascii_whitespace` leaves out).
        if matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r') || taken == room {
            return (i, taken);
        }
        taken += 1;
        i += 1;
    }
    let Some(tail) = s.get(i..) else {
        return (i, taken);
    };
    for (j, c) in tail.char_indices() {
        if c.is_whitespace() || taken == room {
            return (i + j, taken);
        }
        taken += 1;
    }
    (s.len(), taken)
}

/// Most characters a [`LineShortener`] reserves up front (a summary is
/// usually [`TREE_SUMMARY_CHARS_MAX`] long).
const LINE_PREALLOC_CHARS_MAX: usize = 256;

/// Builds a one-line text from pieces: the words of every piece (split on
/// whitespace) joined by single spaces, shortened to `max` characters
/// (on a char boundary) with a trailing `…` when cut. Pieces are separate
/// words (as if joined with a space), so a word never spans two pieces.
/// Once more than `max` characters are held the rest is ignored: the cut
/// is decided.
struct LineShortener {
    out: String,
    chars: usize,
    max: usize,
}

impl LineShortener {
    fn new(max: usize) -> Self {
        LineShortener {
            // Room for a full line of ASCII (the cut needs one character
            // past `max`), so the common case never regrows; bounded, since
            // `max` comes from the caller (`usize::MAX` for no limit).
            out: String::with_capacity(max.min(LINE_PREALLOC_CHARS_MAX) + 2),
            chars: 0,
            max,
        }
    }

    fn full(&self) -> bool {
        self.chars > self.max
    }

    fn push(&mut self, piece: &str) {
        // Word by word as `split_whitespace` would split them, but a word is
        // read only up to the cut: finding the end of a long word (a pasted
        // file, a base64 blob) would otherwise scan all of it.
        let mut rest = piece;
        loop {
            if self.full() {
                return;
            }
            rest = rest.trim_start();
            if rest.is_empty() {
                return;
            }
            if self.chars > 0 {
                self.out.push(' ');
                self.chars += 1;
            }
            // Only up to one character past `max` is needed to know the
            // line is cut.
            // Never zero while not full (`chars <= max`), so every step
            // takes at least one character; saturating, as `max` may be
            // `usize::MAX`.
            let room = self.max.saturating_add(1).saturating_sub(self.chars);
            let (end, taken) = word_end(rest, room);
            self.out.push_str(&rest[..end]);
            self.chars += taken;
            rest = &rest[end..];
        }
    }

    /// Text blocks, then `[tool name]` for tool calls, `[image]` for
    /// images; thinking is left out.
    fn blocks(&mut self, blocks: &[ContentBlock]) {
        for b in blocks {
            if self.full() {
                return;
            }
            match b {
                ContentBlock::Text { text } => self.push(text),
                ContentBlock::ToolCall { name, .. } => self.push(&format!("[{name}]")),
                ContentBlock::Image { .. } => self.push("[image]"),
                ContentBlock::Thinking { .. } => {}
            }
        }
    }

    fn finish(self) -> String {
        if self.chars <= self.max {
            return self.out;
        }
        // Cut in place after `max - 1` characters: at that byte when every
        // character so far is one byte (ASCII), else found by walking.
        let mut out = self.out;
        let keep = self.max.saturating_sub(1);
        let cut = if out.len() == self.chars {
            Some(keep).filter(|&k| out.is_char_boundary(k))
        } else {
            out.char_indices().nth(keep).map(|(i, _)| i)
        };
        if let Some(cut) = cut {
            out.truncate(cut);
        }
        out.push('…');
        out
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The summary's definition, written plainly: collapse every
    /// whitespace run of the whole text, then cut.
    fn reference_line(pieces: &[&str], max_chars: usize) -> String {
        let collapsed = pieces
            .join(" ")
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        if collapsed.chars().count() <= max_chars {
            return collapsed;
        }
        let mut out: String = collapsed
            .chars()
            .take(max_chars.saturating_sub(1))
            .collect();
        out.push('…');
        out
    }

    fn shortened(pieces: &[&str], max_chars: usize) -> String {
        let mut line = LineShortener::new(max_chars);
        for p in pieces {
            line.push(p);
        }
        line.finish()
    }

    proptest! {
        /// Word-by-word shortening with an early stop equals collapsing the
        /// whole text and cutting it, for any pieces (multi-byte chars and
        /// every kind of whitespace included) and any limit.
        #[test]
        fn the_line_shortener_matches_collapse_then_cut(
            pieces in proptest::collection::vec(
                "[a-zé€😀 \\t\\n\\r\u{b}\u{c}\u{1f}\u{85}\u{a0}\u{2003}\u{3000}]{0,40}",
                0..6,
            ),
            max_chars in 0usize..100,
        ) {
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            prop_assert_eq!(shortened(&refs, max_chars), reference_line(&refs, max_chars));
        }

        /// The same for text that is mostly short ASCII words (the byte by
        /// byte path of `word_end`), with a non-ASCII letter or space now
        /// and then.
        #[test]
        fn the_line_shortener_matches_collapse_then_cut_on_ascii_words(
            pieces in proptest::collection::vec("[ab \n]{0,30}([é\u{a0}][ab ]{0,10})?", 0..4),
            max_chars in 0usize..40,
        ) {
            let refs: Vec<&str> = pieces.iter().map(String::as_str).collect();
            prop_assert_eq!(shortened(&refs, max_chars), reference_line(&refs, max_chars));
        }
    }

    /// ASCII words, and words `word_end` hands to its char loop (a non-ASCII
    /// letter in the word, a non-ASCII space after it), at and around the cut.
    #[test]
    fn ascii_and_other_words_shorten_like_the_reference() {
        let cases: &[&[&str]] = &[
            &["a b"],
            &["  a  b  ", "c"],
            &["ab é cd"],
            &["abé cd ef"],
            &["abc\u{a0}def gh"],
            &["x\u{85}y z", "w"],
            &["one two three four five six"],
            &["", " ", "a"],
        ];
        for pieces in cases {
            for max_chars in 0..20 {
                assert_eq!(
                    shortened(pieces, max_chars),
                    reference_line(pieces, max_chars),
                    "{pieces:?} at {max_chars}"
                );
            }
        }
    }

    /// A `tool_output` custom message whose text blocks are `texts`.
    fn tool_output(texts: &[&str]) -> Entry {
        Entry {
            id: EntryId::parse("a").unwrap(),
            parent_id: None,
            timestamp_ms: 0,
            kind: EntryKind::CustomMessage {
                custom_type: "tool_output".into(),
                content: texts.iter().map(|t| ContentBlock::text(*t)).collect(),
                display: true,
                details: None,
            },
        }
    }

    #[test]
    fn summaries_of_messages_cut_at_the_limit_and_collapse_whitespace() {
        let long = "word ".repeat(100);
        let e = tool_output(&["  x\n\ny ", &long]);
        let (s, role) = entry_summary(&e, 20);
        assert_eq!(role, None);
        assert_eq!(s, "tool_output: x y wo…");
        assert_eq!(s.chars().count(), 20);
    }

    /// Regression: `entry_summary` with `usize::MAX` (no limit) overflowed
    /// the room left on the line to zero and looped forever in release
    /// builds (found while bounding the summary's preallocation).
    #[test]
    fn an_unlimited_summary_is_the_whole_line() {
        let e = tool_output(&["  x\n\ny ", "a b  c"]);
        assert_eq!(entry_summary(&e, usize::MAX).0, "tool_output: x y a b c");
    }
}
