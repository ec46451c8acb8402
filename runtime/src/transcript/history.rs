//! Paged, version-fenced history reads (pure, storage independent).
//!
//! A history read takes a selection and returns a [`ReadResult`]:
//!
//! * **context** ([`read_context`]): the bounded resident selection of a
//!   leaf (see [`select_resident`]);
//! * **entry** ([`read_entry`]): one entry by id, or explicit absence;
//! * **branch page** ([`read_branch_page`]): the entries of a root→leaf
//!   path, in pages;
//! * **navigation** ([`read_navigation`]): facts about a target entry
//!   relative to where a caller is (common ancestor, labels, children);
//! * **custom page** ([`read_custom_page`]): custom entries (plugin state)
//!   of a type in append order, duplicates preserved, in pages.
//!
//! The functions read through an [`EntrySource`] that the caller has bound
//! to one consistent snapshot of one transcript version (a store: one
//! snapshot of its indexes). The caller passes that version and the session
//! id in a [`ReadScope`]; pages carry an opaque [`Continuation`] binding
//! session, selection (branch leaf or custom type), version and next
//! position. Before reading a later page the caller must check the
//! continuation against the *live* version ([`Continuation::check`]): a
//! changed version is a [`ReadResult::VersionConflict`], never a silently
//! different answer. Checking owner authority (`OwnerLost`) is the
//! caller's: these functions never produce it.
//!
//! **Oversized entries**: an entry larger than a page's byte budget is
//! never truncated or skipped. If it is the first entry of a page, the page
//! policy decides ([`OversizedPolicy`]): `Alone` returns a page holding it
//! alone (the only case where a page exceeds its byte budget), `Refuse`
//! returns [`ReadResult::Oversized`] and the caller may read it with
//! [`read_entry`]. Met later in a page, it ends the page and comes first
//! on the next one.
//!
//! **Cancellation**: the [`CancelToken`] is checked before each entry read
//! and before returning; a cancelled read returns [`ReadResult::Cancelled`]
//! and its partial page is dropped.
//!
//! **Costs** are proportional to what is returned: a branch page walks
//! parents from a cursor entry (see [`PageOrder`] for the order), a custom
//! page asks the source's index for the next entries after a sequence
//! number, navigation walks from the two entries to their common ancestor.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::entry::{Entry, EntryId};
use super::path_facts::{path_facts_by_walk, PathFacts};
use super::resident::{select_resident, Budget, ResidentError, ResidentSelection};
use super::source::EntrySource;

/// Maximum length of an encoded continuation accepted by
/// [`Continuation::decode`], in bytes.
pub const CONTINUATION_ENCODED_LEN_MAX: usize = 4096;
/// Version byte of the continuation encoding.
pub const CONTINUATION_FORMAT: u8 = 1;
/// Maximum number of children listed (with summaries) by a navigation read.
pub const NAV_CHILDREN_MAX: usize = 64;

/// The version of a session's transcript: the generation (bumped by every
/// rewrite), the raw sequence of the latest committed event and its commit
/// time. Ordered by generation, then raw sequence (then time, which only
/// breaks ties between versions that should not exist).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct TranscriptVersion {
    pub generation: u64,
    pub raw_seq: u64,
    pub updated_at_ms: i64,
}

/// A cancellation flag shared between a caller and a read (clones share
/// the flag).
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.0.store(true, Ordering::SeqCst);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

/// What a read is bound to: the session, the version of the snapshot the
/// source reads, and the cancellation token.
#[derive(Clone, Copy, Debug)]
pub struct ReadScope<'a> {
    pub session: &'a str,
    pub version: TranscriptVersion,
    pub cancel: &'a CancelToken,
}

/// What to do with an entry larger than a page's byte budget when it is
/// the first entry of the page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum OversizedPolicy {
    /// Return [`ReadResult::Oversized`] (the default).
    #[default]
    Refuse,
    /// Return a page holding that entry alone.
    Alone,
}

/// The budget of one page.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PageBudget {
    /// Maximum sum of [`entry_size`](super::resident::entry_size) of the
    /// page's entries (see [`OversizedPolicy`] for the one exception).
    pub bytes_max: u64,
    /// Maximum number of entries; 0 is treated as 1 (a page always makes
    /// progress or refuses).
    pub events_max: u64,
    pub oversized: OversizedPolicy,
}

impl PageBudget {
    pub const fn new(bytes_max: u64, events_max: u64) -> Self {
        PageBudget {
            bytes_max,
            events_max,
            oversized: OversizedPolicy::Refuse,
        }
    }

    pub const fn with_oversized(mut self, policy: OversizedPolicy) -> Self {
        self.oversized = policy;
        self
    }

    fn events(&self) -> u64 {
        self.events_max.max(1)
    }
}

/// The order of branch pages.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum PageOrder {
    /// Root first (what an exporter wants). A page spans a depth range
    /// `[next, next + events_max)`: its last entry is found with
    /// [`EntrySource::ancestor_at_depth`] (an index of the active path
    /// answers in O(1)); without that index, by walking parents from the
    /// leaf, which costs the distance from the leaf to the page. Each page
    /// then walks `events_max` entries' facts and loads the page's
    /// payloads.
    #[default]
    RootFirst,
    /// Leaf first (newest first). Each page walks parents from its cursor
    /// entry: cost proportional to the page, with any source.
    LeafFirst,
}

/// Where the next page starts (inside a [`Continuation`]).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[non_exhaustive]
pub enum Position {
    /// Root-first branch pages: depth of the next entry.
    Depth(u64),
    /// Leaf-first branch pages: the next entry and its depth.
    Cursor { id: EntryId, depth: u64 },
    /// Custom pages: the append sequence number of the last returned entry.
    AfterSeq(u64),
}

/// The selection a continuation belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
enum Selection {
    Branch { leaf: EntryId, order: PageOrder },
    Custom { custom_type: Option<String> },
}

/// An opaque token for the next page of a branch or custom selection. It
/// binds the session, the selection (branch leaf and order, or custom
/// type), the transcript version the previous page was read at, and the
/// next position. It travels as a string ([`encode`](Self::encode) /
/// [`decode`](Self::decode), URL-safe base64 of a checksummed binary
/// form); callers must not interpret it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Continuation {
    session: String,
    selection: Selection,
    version: TranscriptVersion,
    position: Position,
}

#[derive(Serialize, Deserialize)]
struct ContinuationRepr {
    format: u8,
    session: String,
    selection: Selection,
    version: TranscriptVersion,
    position: Position,
}

/// A continuation could not be decoded (corrupted, truncated, forged, or
/// of another format). This is a fault of the caller, not an expected
/// outcome.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid continuation: {reason}")]
#[non_exhaustive]
pub struct ContinuationError {
    pub reason: &'static str,
}

/// A continuation does not match the live session, selection or version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct VersionConflict {
    /// The version the continuation was taken at.
    pub expected: TranscriptVersion,
    /// The live version.
    pub actual: TranscriptVersion,
}

impl<T> From<VersionConflict> for ReadResult<T> {
    fn from(c: VersionConflict) -> Self {
        ReadResult::VersionConflict {
            expected: c.expected,
            actual: c.actual,
        }
    }
}

impl Continuation {
    /// The version the continuation was taken at.
    pub fn version(&self) -> TranscriptVersion {
        self.version
    }

    /// The session it belongs to.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// The opaque string form.
    pub fn encode(&self) -> String {
        let repr = ContinuationRepr {
            format: CONTINUATION_FORMAT,
            session: self.session.clone(),
            selection: self.selection.clone(),
            version: self.version,
            position: self.position.clone(),
        };
        // Encoding plain data into a Vec cannot fail; an empty body would
        // be refused by `decode`, never misread.
        let mut bytes = rmp_serde::to_vec(&repr).unwrap_or_default();
        let sum = fnv1a32(&bytes);
        bytes.extend_from_slice(&sum.to_le_bytes());
        base64url_encode(&bytes)
    }

    /// Parses the string form, verifying its checksum and format.
    pub fn decode(s: &str) -> Result<Continuation, ContinuationError> {
        let bad = |reason| ContinuationError { reason };
        if s.len() > CONTINUATION_ENCODED_LEN_MAX {
            return Err(bad("too long"));
        }
        let bytes = base64url_decode(s).ok_or_else(|| bad("not URL-safe base64"))?;
        let split = bytes.len().checked_sub(4).ok_or_else(|| bad("too short"))?;
        let (body, sum) = bytes.split_at(split);
        let mut sum4 = [0u8; 4];
        sum4.copy_from_slice(sum);
        if fnv1a32(body) != u32::from_le_bytes(sum4) {
            return Err(bad("checksum mismatch"));
        }
        let repr: ContinuationRepr =
            rmp_serde::from_slice(body).map_err(|_| bad("undecodable body"))?;
        if repr.format != CONTINUATION_FORMAT {
            return Err(bad("unknown format"));
        }
        Ok(Continuation {
            session: repr.session,
            selection: repr.selection,
            version: repr.version,
            position: repr.position,
        })
    }

    /// Checks a branch-page continuation against the live session, the
    /// branch being read (its leaf) and the live version, and returns the
    /// next position. Any mismatch (another session, another leaf or page
    /// order, a custom-page continuation, a changed version) is a
    /// [`VersionConflict`]: the continuation never follows a different
    /// branch or version.
    pub fn check(
        &self,
        session: &str,
        leaf: &EntryId,
        current: TranscriptVersion,
    ) -> Result<&Position, VersionConflict> {
        let same_branch = matches!(&self.selection, Selection::Branch { leaf: l, .. } if l == leaf);
        self.check_with(session, same_branch, current)
    }

    /// Like [`check`](Self::check) for a custom-page continuation and its
    /// custom type filter.
    pub fn check_custom(
        &self,
        session: &str,
        custom_type: Option<&str>,
        current: TranscriptVersion,
    ) -> Result<&Position, VersionConflict> {
        let same = matches!(&self.selection, Selection::Custom { custom_type: t } if t.as_deref() == custom_type);
        self.check_with(session, same, current)
    }

    fn check_with(
        &self,
        session: &str,
        same_selection: bool,
        current: TranscriptVersion,
    ) -> Result<&Position, VersionConflict> {
        if self.session != session || !same_selection || self.version != current {
            return Err(VersionConflict {
                expected: self.version,
                actual: current,
            });
        }
        Ok(&self.position)
    }
}

impl Serialize for Continuation {
    /// Serializes as its opaque string.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.encode())
    }
}

impl<'de> Deserialize<'de> for Continuation {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        Continuation::decode(&s).map_err(serde::de::Error::custom)
    }
}

/// The outcome of a history read. Expected outcomes (absence, conflicts,
/// cancellation, refusal) are variants; faults are [`ReadError`]s.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[non_exhaustive]
pub enum ReadResult<T> {
    /// The whole selection (or its last page).
    Complete {
        value: T,
        version: TranscriptVersion,
    },
    /// One page; more follow from `continuation`.
    Page {
        value: T,
        continuation: Continuation,
    },
    /// The entry (or the leaf / target of the selection) does not exist.
    EntryAbsent {
        id: EntryId,
    },
    /// A continuation was taken at another version, session or selection.
    VersionConflict {
        expected: TranscriptVersion,
        actual: TranscriptVersion,
    },
    /// The session owner the read was bound to was closed or replaced
    /// (reported by the session layer; the pure readers never return it).
    OwnerLost,
    Cancelled,
    /// The first entry of a page is larger than the page byte budget and
    /// the policy is [`OversizedPolicy::Refuse`].
    Oversized {
        id: EntryId,
        size: u64,
        budget_bytes: u64,
    },
}

impl<T> ReadResult<T> {
    /// The value of a complete result or a page.
    pub fn value(&self) -> Option<&T> {
        match self {
            ReadResult::Complete { value, .. } | ReadResult::Page { value, .. } => Some(value),
            _ => None,
        }
    }

    /// The continuation of a page.
    pub fn continuation(&self) -> Option<&Continuation> {
        match self {
            ReadResult::Page { continuation, .. } => Some(continuation),
            _ => None,
        }
    }
}

/// A history read failed (a fault, not an expected outcome).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReadError<E: std::error::Error + 'static> {
    #[error("reading the entry source failed")]
    Source(#[source] E),
    #[error("the parent links above entry {0} form a cycle")]
    ParentCycle(EntryId),
    /// The source is not a consistent snapshot (an entry it listed is
    /// absent, or a depth does not match).
    #[error("entry {0} is missing or inconsistent in the source snapshot")]
    Inconsistent(EntryId),
    #[error(transparent)]
    Continuation(#[from] ContinuationError),
    /// The source cannot answer this selection.
    #[error("the entry source does not support {0}")]
    Unsupported(&'static str),
}

impl<E: std::error::Error + 'static> ReadError<E> {
    fn from_resident(e: ResidentError<E>) -> Self {
        match e {
            ResidentError::Source(e) => ReadError::Source(e),
            ResidentError::ParentCycle(id) => ReadError::ParentCycle(id),
            ResidentError::Vanished(id) | ResidentError::UnknownLeaf(id) => {
                ReadError::Inconsistent(id)
            }
        }
    }
}

/// A page of entries.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct EntryPage {
    /// Byte-exact entries in the selection's order.
    pub entries: Vec<Entry>,
    /// Sum of their sizes.
    pub bytes: u64,
}

/// A child of a navigation target, summarized.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ChildSummary {
    pub id: EntryId,
    pub summary: String,
    pub label: Option<String>,
}

/// What a navigation read returns.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct NavigationFacts {
    pub target: EntryId,
    /// Path facts of the target (depth, context start, settings).
    pub target_facts: PathFacts,
    pub target_kind: String,
    pub target_size: u64,
    pub target_label: Option<String>,
    /// The deepest common ancestor-or-self of `from` and the target;
    /// `None` when `from` is `None` or they are in different trees.
    pub common_ancestor: Option<EntryId>,
    pub common_ancestor_label: Option<String>,
    /// Entries from `from` up to (excluding) the common ancestor, i.e.
    /// what a move leaves; the whole `from` path when there is none.
    pub steps_up: u64,
    /// Entries from the common ancestor down to the target (excluding
    /// the ancestor).
    pub steps_down: u64,
    /// At most [`NAV_CHILDREN_MAX`] children of the target, append order.
    pub children: Vec<ChildSummary>,
    pub children_total: u64,
}

type Res<T, E> = Result<ReadResult<T>, ReadError<E>>;

fn src<E: std::error::Error + 'static>(e: E) -> ReadError<E> {
    ReadError::Source(e)
}

/// The context selection: the bounded resident selection of `leaf`.
/// Absent leaf → [`ReadResult::EntryAbsent`].
pub fn read_context<S: EntrySource + ?Sized>(
    source: &S,
    scope: &ReadScope<'_>,
    leaf: Option<&EntryId>,
    budget: Budget,
) -> Res<ResidentSelection, S::Error> {
    if scope.cancel.is_cancelled() {
        return Ok(ReadResult::Cancelled);
    }
    let sel = match select_resident(source, leaf, budget) {
        Ok(s) => s,
        Err(ResidentError::UnknownLeaf(id)) => return Ok(ReadResult::EntryAbsent { id }),
        Err(e) => return Err(ReadError::from_resident(e)),
    };
    finish(scope, sel)
}

/// The entry selection: one entry, byte-exact, or explicit absence.
pub fn read_entry<S: EntrySource + ?Sized>(
    source: &S,
    scope: &ReadScope<'_>,
    id: &EntryId,
) -> Res<Entry, S::Error> {
    if scope.cancel.is_cancelled() {
        return Ok(ReadResult::Cancelled);
    }
    match source.entry(id).map_err(src)? {
        Some(e) => finish(scope, e.into_owned()),
        None => Ok(ReadResult::EntryAbsent { id: id.clone() }),
    }
}

fn finish<T, E: std::error::Error + 'static>(scope: &ReadScope<'_>, value: T) -> Res<T, E> {
    if scope.cancel.is_cancelled() {
        return Ok(ReadResult::Cancelled);
    }
    Ok(ReadResult::Complete {
        value,
        version: scope.version,
    })
}

fn leaf_facts<S: EntrySource + ?Sized>(
    source: &S,
    id: &EntryId,
) -> Result<Option<PathFacts>, ReadError<S::Error>> {
    if let Some(f) = source.path_facts(id).map_err(src)? {
        return Ok(Some(f));
    }
    match path_facts_by_walk(source, id) {
        Ok(f) => Ok(Some(f)),
        Err(ResidentError::UnknownLeaf(_)) => Ok(None),
        Err(e) => Err(ReadError::from_resident(e)),
    }
}

/// One entry considered for a page: id and size (payload not loaded).
struct Candidate {
    id: EntryId,
    size: u64,
}

/// A filled page and how many candidates it took, or the result that ends
/// the read (oversized refusal, cancellation).
type Filled = Result<(EntryPage, usize), ReadResult<EntryPage>>;

/// Fills a page from candidates in page order, loading payloads. Returns
/// `Err(result)` for an oversized refusal or cancellation, else the page
/// and how many candidates it took.
fn fill_page<S: EntrySource + ?Sized>(
    source: &S,
    scope: &ReadScope<'_>,
    candidates: &[Candidate],
    budget: PageBudget,
) -> Result<Filled, ReadError<S::Error>> {
    // The page holds at most every candidate: one allocation of its list.
    let mut page = EntryPage {
        entries: Vec::with_capacity(candidates.len()),
        ..EntryPage::default()
    };
    for (i, c) in candidates.iter().enumerate() {
        if u64::try_from(i).unwrap_or(u64::MAX) >= budget.events() {
            break;
        }
        let fits = c.size <= budget.bytes_max.saturating_sub(page.bytes);
        if !fits {
            if i > 0 {
                break;
            }
            if budget.oversized == OversizedPolicy::Refuse {
                return Ok(Err(ReadResult::Oversized {
                    id: c.id.clone(),
                    size: c.size,
                    budget_bytes: budget.bytes_max,
                }));
            }
        }
        if scope.cancel.is_cancelled() {
            return Ok(Err(ReadResult::Cancelled));
        }
        let e = source
            .entry(&c.id)
            .map_err(src)?
            .ok_or_else(|| ReadError::Inconsistent(c.id.clone()))?
            .into_owned();
        page.bytes = page.bytes.saturating_add(c.size);
        page.entries.push(e);
        if !fits {
            break; // an oversized entry alone
        }
    }
    let n = page.entries.len();
    Ok(Ok((page, n)))
}

fn candidate<S: EntrySource + ?Sized>(
    source: &S,
    id: &EntryId,
) -> Result<(Candidate, Option<EntryId>), ReadError<S::Error>> {
    let facts = source
        .facts(id)
        .map_err(src)?
        .ok_or_else(|| ReadError::Inconsistent(id.clone()))?;
    let size = source
        .entry_size(id)
        .map_err(src)?
        .ok_or_else(|| ReadError::Inconsistent(id.clone()))?;
    Ok((
        Candidate {
            id: id.clone(),
            size,
        },
        facts.parent_id,
    ))
}

/// The candidates of a root-first page of depths `start..=end` (root
/// first) found by walking: the page's last entry from
/// [`EntrySource::ancestor_at_depth`] or by walking parents from the
/// leaf, then parents up to `start`. Returns early (candidates partial)
/// when cancelled; the caller checks.
fn read_root_first_by_walk<S: EntrySource + ?Sized>(
    source: &S,
    scope: &ReadScope<'_>,
    leaf: &EntryId,
    leaf_depth: u64,
    start: u64,
    end: u64,
    candidates: &mut Vec<Candidate>,
) -> Result<(), ReadError<S::Error>> {
    let mut cur = match source.ancestor_at_depth(leaf, end).map_err(src)? {
        Some(id) => {
            // Verify an indexed answer where facts allow it.
            if let Some(pf) = source.path_facts(&id).map_err(src)? {
                if pf.depth != end {
                    return Err(ReadError::Inconsistent(id));
                }
            }
            id
        }
        None => {
            let mut cur = leaf.clone();
            for _ in end..leaf_depth {
                if scope.cancel.is_cancelled() {
                    return Ok(());
                }
                let (_, parent) = candidate(source, &cur)?;
                cur = parent.ok_or_else(|| ReadError::Inconsistent(cur.clone()))?;
            }
            cur
        }
    };
    for _ in start..=end {
        let (c, parent) = candidate(source, &cur)?;
        candidates.push(c);
        match parent {
            Some(p) => cur = p,
            None => break,
        }
    }
    let want = usize::try_from(end - start + 1).unwrap_or(usize::MAX);
    if candidates.len() != want {
        return Err(ReadError::Inconsistent(cur));
    }
    candidates.reverse();
    Ok(())
}

/// The branch-page selection: the entries of the root→`leaf` path, one
/// page per call, in `order` (see [`PageOrder`]). `cursor` is the
/// continuation of the previous page (`None` for the first page); it must
/// have been checked against the live version with
/// [`Continuation::check`] — it is checked again here against
/// `scope.version`. The last page is [`ReadResult::Complete`].
pub fn read_branch_page<S: EntrySource + ?Sized>(
    source: &S,
    scope: &ReadScope<'_>,
    leaf: &EntryId,
    order: PageOrder,
    cursor: Option<&Continuation>,
    budget: PageBudget,
) -> Res<EntryPage, S::Error> {
    if scope.cancel.is_cancelled() {
        return Ok(ReadResult::Cancelled);
    }
    let position = match cursor {
        None => None,
        Some(c) => {
            let same_order =
                matches!(&c.selection, Selection::Branch { order: o, .. } if *o == order);
            match c.check(scope.session, leaf, scope.version) {
                Err(conflict) => return Ok(conflict.into()),
                Ok(_) if !same_order => {
                    return Ok(VersionConflict {
                        expected: c.version,
                        actual: scope.version,
                    }
                    .into())
                }
                Ok(p) => Some(p.clone()),
            }
        }
    };
    let Some(facts) = leaf_facts(source, leaf)? else {
        return Ok(ReadResult::EntryAbsent { id: leaf.clone() });
    };
    let leaf_depth = facts.depth;
    let mut candidates: Vec<Candidate> = Vec::new();
    let (first_depth, next_parent);
    match order {
        PageOrder::RootFirst => {
            let start = match position {
                None => 0,
                Some(Position::Depth(d)) if d <= leaf_depth => d,
                Some(_) => {
                    return Err(ContinuationError {
                        reason: "position does not fit the branch",
                    }
                    .into())
                }
            };
            let end = start
                .saturating_add(budget.events().saturating_sub(1))
                .min(leaf_depth);
            if let Some(range) = source
                .path_range(leaf, leaf_depth, start, end, budget.bytes_max)
                .map_err(src)?
            {
                // One range read of an indexed path: ids and sizes, all
                // the depths or a prefix that is already past the bytes.
                let want = usize::try_from((end - start).saturating_add(1)).unwrap_or(usize::MAX);
                let bytes = range.iter().fold(0u64, |a, (_, n)| a.saturating_add(*n));
                if range.is_empty()
                    || range.len() > want
                    || (range.len() < want && bytes <= budget.bytes_max)
                {
                    return Err(ReadError::Inconsistent(leaf.clone()));
                }
                // Collected in place: a candidate has the layout of a
                // range pair, so the range's allocation is reused.
                candidates = range
                    .into_iter()
                    .map(|(id, size)| Candidate { id, size })
                    .collect();
            } else {
                read_root_first_by_walk(
                    source,
                    scope,
                    leaf,
                    leaf_depth,
                    start,
                    end,
                    &mut candidates,
                )?;
                if scope.cancel.is_cancelled() {
                    return Ok(ReadResult::Cancelled);
                }
            }
            first_depth = start;
            next_parent = None;
        }
        PageOrder::LeafFirst => {
            let (mut cur, depth) = match position {
                None => (leaf.clone(), leaf_depth),
                Some(Position::Cursor { id, depth }) if depth <= leaf_depth => (id, depth),
                Some(_) => {
                    return Err(ContinuationError {
                        reason: "position does not fit the branch",
                    }
                    .into())
                }
            };
            let mut parent = None;
            let n = budget.events().min(depth.saturating_add(1));
            // The candidates' bytes so far (a running sum: summing the
            // list on every step made a long page quadratic).
            let mut bytes = 0u64;
            for i in 0..n {
                let (c, p) = candidate(source, &cur)?;
                let size = c.size;
                bytes = bytes.saturating_add(size);
                candidates.push(c);
                parent = p;
                // Stop collecting once the bytes are exceeded: later
                // candidates could not join this page.
                if bytes > budget.bytes_max || size > budget.bytes_max || i + 1 == n {
                    break;
                }
                match &parent {
                    Some(p) => cur = p.clone(),
                    None => break,
                }
            }
            first_depth = depth;
            next_parent = Some(parent);
        }
    }
    let (page, taken) = match fill_page(source, scope, &candidates, budget)? {
        Ok(x) => x,
        Err(r) => return Ok(r),
    };
    let taken_u = u64::try_from(taken).unwrap_or(u64::MAX);
    let next = match order {
        PageOrder::RootFirst => {
            let next = first_depth.saturating_add(taken_u);
            (next <= leaf_depth).then_some(Position::Depth(next))
        }
        PageOrder::LeafFirst => {
            if first_depth < taken_u {
                None
            } else {
                let depth = first_depth - taken_u;
                let id = if taken == candidates.len() {
                    next_parent.flatten()
                } else {
                    candidates.get(taken).map(|c| c.id.clone())
                };
                match id {
                    Some(id) => Some(Position::Cursor { id, depth }),
                    None => return Err(ReadError::Inconsistent(leaf.clone())),
                }
            }
        }
    };
    if scope.cancel.is_cancelled() {
        return Ok(ReadResult::Cancelled);
    }
    Ok(match next {
        None => ReadResult::Complete {
            value: page,
            version: scope.version,
        },
        Some(position) => ReadResult::Page {
            value: page,
            continuation: Continuation {
                session: scope.session.to_string(),
                selection: Selection::Branch {
                    leaf: leaf.clone(),
                    order,
                },
                version: scope.version,
                position,
            },
        },
    })
}

/// The custom-page selection: custom entries with `custom_type` (any type
/// when `None`) in append order, duplicates preserved, one page per call,
/// read with [`EntrySource::custom_entries_after`] (an index lookup in a
/// store). `cursor` as for [`read_branch_page`] (checked with
/// [`Continuation::check_custom`]).
pub fn read_custom_page<S: EntrySource + ?Sized>(
    source: &S,
    scope: &ReadScope<'_>,
    custom_type: Option<&str>,
    cursor: Option<&Continuation>,
    budget: PageBudget,
) -> Res<EntryPage, S::Error> {
    if scope.cancel.is_cancelled() {
        return Ok(ReadResult::Cancelled);
    }
    let after = match cursor {
        None => None,
        Some(c) => match c.check_custom(scope.session, custom_type, scope.version) {
            Err(conflict) => return Ok(conflict.into()),
            Ok(Position::AfterSeq(s)) => Some(*s),
            Ok(_) => {
                return Err(ContinuationError {
                    reason: "position does not fit a custom page",
                }
                .into())
            }
        },
    };
    let limit = usize::try_from(budget.events())
        .unwrap_or(usize::MAX)
        .saturating_add(1);
    let refs = source
        .custom_entries_after(custom_type, after, limit)
        .map_err(src)?
        .ok_or(ReadError::Unsupported("custom-entry pages"))?;
    let mut candidates = Vec::with_capacity(refs.len());
    for r in &refs {
        let size = source
            .entry_size(&r.id)
            .map_err(src)?
            .ok_or_else(|| ReadError::Inconsistent(r.id.clone()))?;
        candidates.push(Candidate {
            id: r.id.clone(),
            size,
        });
        // Later candidates cannot join once the bytes are exceeded.
        if candidates.iter().map(|c| c.size).sum::<u64>() > budget.bytes_max {
            break;
        }
    }
    let (page, taken) = match fill_page(source, scope, &candidates, budget)? {
        Ok(x) => x,
        Err(r) => return Ok(r),
    };
    if scope.cancel.is_cancelled() {
        return Ok(ReadResult::Cancelled);
    }
    let more = taken < refs.len();
    Ok(match taken.checked_sub(1).and_then(|i| refs.get(i)) {
        Some(last) if more => ReadResult::Page {
            value: page,
            continuation: Continuation {
                session: scope.session.to_string(),
                selection: Selection::Custom {
                    custom_type: custom_type.map(str::to_string),
                },
                version: scope.version,
                position: Position::AfterSeq(last.seq),
            },
        },
        _ => ReadResult::Complete {
            value: page,
            version: scope.version,
        },
    })
}

/// The navigation selection: facts about `target` for a caller at `from`
/// (typically the current leaf): target path facts, common ancestor,
/// labels, and at most [`NAV_CHILDREN_MAX`] child summaries. Cost: the
/// walk from both entries to their common ancestor, plus the children
/// listed (and, for a source without stored path facts, the target's and
/// `from`'s root paths).
pub fn read_navigation<S: EntrySource + ?Sized>(
    source: &S,
    scope: &ReadScope<'_>,
    from: Option<&EntryId>,
    target: &EntryId,
) -> Res<NavigationFacts, S::Error> {
    if scope.cancel.is_cancelled() {
        return Ok(ReadResult::Cancelled);
    }
    let Some(tf) = leaf_facts(source, target)? else {
        return Ok(ReadResult::EntryAbsent { id: target.clone() });
    };
    let (common, steps_up, steps_down) = match from {
        None => (None, 0, tf.path_entries()),
        Some(f) => {
            let Some(ff) = leaf_facts(source, f)? else {
                return Ok(ReadResult::EntryAbsent { id: f.clone() });
            };
            let mut a = (f.clone(), ff.depth);
            let mut b = (target.clone(), tf.depth);
            let parent = |id: &EntryId| -> Result<Option<EntryId>, ReadError<S::Error>> {
                Ok(source
                    .facts(id)
                    .map_err(src)?
                    .ok_or_else(|| ReadError::Inconsistent(id.clone()))?
                    .parent_id)
            };
            let mut common = None;
            loop {
                if scope.cancel.is_cancelled() {
                    return Ok(ReadResult::Cancelled);
                }
                if a.0 == b.0 {
                    common = Some(a.clone());
                    break;
                }
                // Step the deeper one (both when equally deep).
                let (step_a, step_b) = (a.1 >= b.1, b.1 >= a.1);
                if step_a {
                    match (parent(&a.0)?, a.1.checked_sub(1)) {
                        (Some(p), Some(d)) => a = (p, d),
                        _ => break,
                    }
                }
                if step_b {
                    match (parent(&b.0)?, b.1.checked_sub(1)) {
                        (Some(p), Some(d)) => b = (p, d),
                        _ => break,
                    }
                }
            }
            match common {
                Some((id, d)) => (Some(id), ff.depth - d, tf.depth - d),
                None => (None, ff.path_entries(), tf.path_entries()),
            }
        }
    };
    let tfacts = source
        .facts(target)
        .map_err(src)?
        .ok_or_else(|| ReadError::Inconsistent(target.clone()))?;
    let target_size = source
        .entry_size(target)
        .map_err(src)?
        .ok_or_else(|| ReadError::Inconsistent(target.clone()))?;
    let kids = source.children(target, NAV_CHILDREN_MAX).map_err(src)?;
    let mut children = Vec::with_capacity(kids.ids.len());
    for id in kids.ids.iter().take(NAV_CHILDREN_MAX) {
        if scope.cancel.is_cancelled() {
            return Ok(ReadResult::Cancelled);
        }
        children.push(ChildSummary {
            id: id.clone(),
            summary: source
                .summary(id)
                .map_err(src)?
                .ok_or_else(|| ReadError::Inconsistent(id.clone()))?,
            label: source.label(id).map_err(src)?,
        });
    }
    let common_ancestor_label = match &common {
        Some(c) => source.label(c).map_err(src)?,
        None => None,
    };
    let value = NavigationFacts {
        target: target.clone(),
        target_facts: tf,
        target_kind: tfacts.kind,
        target_size,
        target_label: source.label(target).map_err(src)?,
        common_ancestor: common,
        common_ancestor_label,
        steps_up,
        steps_down,
        children,
        children_total: kids.total,
    };
    finish(scope, value)
}

/// FNV-1a, 32 bits: a checksum against corrupted or hand-edited
/// continuations (not a security measure).
fn fnv1a32(bytes: &[u8]) -> u32 {
    let mut h: u32 = 0x811c_9dc5;
    for &b in bytes {
        h ^= u32::from(b);
        h = h.wrapping_mul(0x0100_0193);
    }
    h
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

/// URL-safe base64 without padding.
fn base64url_encode(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            let idx = (n >> (18 - 6 * i)) & 0x3f;
            out.push(char::from(B64[idx as usize]));
        }
    }
    out
}

fn base64url_decode(s: &str) -> Option<Vec<u8>> {
    let val = |c: u8| -> Option<u32> {
        B64.iter()
            .position(|&x| x == c)
            .and_then(|p| u32::try_from(p).ok())
    };
    let bytes = s.as_bytes();
    if bytes.len() % 4 == 1 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / 4 * 3 + 2);
    for chunk in bytes.chunks(4) {
        let mut n: u32 = 0;
        for (i, &c) in chunk.iter().enumerate() {
            n |= val(c)? << (18 - 6 * i);
        }
        let [_, b0, b1, b2] = n.to_be_bytes();
        out.push(b0);
        if chunk.len() > 2 {
            out.push(b1);
        }
        if chunk.len() > 3 {
            out.push(b2);
        }
    }
    // Non-canonical trailing bits would let two strings decode alike.
    if base64url_encode(&out) != s {
        return None;
    }
    Some(out)
}
