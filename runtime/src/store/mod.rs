//! Session stores: the [`SessionStore`] trait, its errors and queries.
//!
//! # Version semantics (every store)
//!
//! - `create` takes a fresh session (version 0) and persists it as
//!   version 1. An existing id is `Conflict { expected: 0, actual }`; a
//!   session whose version is not 0 is `InvalidSession`.
//! - `save` takes a session whose version equals the stored version and
//!   persists it as version + 1 with a new `updated_at_ms`. A mismatch is
//!   `Conflict { expected: session.version, actual: stored }` and writes
//!   nothing; a missing session is `NotFound`.
//! - Whatever is persisted by one `create`/`save` is all-or-nothing. An
//!   event-sourced store commits the session's pending events as one
//!   commit under the version fence (if the list is empty it commits a
//!   `Touched` event); a whole-state store persists the folded session.
//! - Every session a store returns has an empty pending list.
//! - `header` and `list_headers` never load state; `stats().full_loads`
//!   counts the loads that do, so callers (and tests) can prove it.

pub mod backend;
#[cfg(feature = "conformance")]
pub mod conformance;
pub mod exchange;
pub mod file;
pub mod log;
mod memory;
mod open;
#[cfg(feature = "postgres")]
pub mod postgres;
mod repository;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::session::{
    AgentSession, AgentSessionInfo, CodecError, InvalidSessionId, SessionId, SessionInfoList,
    SessionStatus,
};

pub use backend::{
    AppendReceipt, BoxedSource, ChangeMark, FullLoadBackend, TranscriptBackend, TranscriptHead,
};
pub use file::{FileStore, FileStoreOptions};
pub use log::{LogStore, LogStoreOptions};
pub use memory::MemoryStore;
pub use open::{is_postgres_location, open_store};
#[cfg(feature = "postgres")]
pub use postgres::{PostgresOptions, PostgresStore};
pub use repository::SessionRepository;

/// A store operation failed. `NotFound` and `Conflict` are expected
/// outcomes callers handle; the others are faults.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("session {id} not found")]
    NotFound { id: SessionId },
    #[error(
        "session {id}: version conflict (expected version {expected}, stored version {actual})"
    )]
    Conflict {
        id: SessionId,
        expected: u64,
        actual: u64,
    },
    #[error("session {id} cannot be stored: {reason}")]
    InvalidSession { id: SessionId, reason: String },
    #[error("invalid session file {}: {reason}", path.display())]
    InvalidSessionFile { path: PathBuf, reason: String },
    #[error(transparent)]
    InvalidId(#[from] InvalidSessionId),
    #[error("invalid listing query: {reason}")]
    InvalidQuery { reason: String },
    #[error("timed out after {waited_ms} ms waiting for lock {}", path.display())]
    LockTimeout { path: PathBuf, waited_ms: u64 },
    #[error("I/O error on {}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("encoding error ({context})")]
    Encoding {
        context: String,
        #[source]
        source: CodecError,
    },
    #[error(transparent)]
    Backend(Box<dyn std::error::Error + Send + Sync>),
    /// The log engine failed (I/O, corruption, a poisoned or locked store).
    #[error(transparent)]
    Engine(spool_engine::Error),
    /// Stored data of a session does not fold into a valid session.
    #[error("session {id} is corrupt in the store: {reason}")]
    Corrupt { id: SessionId, reason: String },
}

impl StoreError {
    /// A short stable name of the error kind (`not_found`, `conflict`, ...),
    /// used in observer events and machine-readable output.
    pub fn kind(&self) -> &'static str {
        match self {
            StoreError::NotFound { .. } => "not_found",
            StoreError::Conflict { .. } => "conflict",
            StoreError::InvalidSession { .. } => "invalid_session",
            StoreError::InvalidSessionFile { .. } => "invalid_session_file",
            StoreError::InvalidId(_) => "invalid_id",
            StoreError::InvalidQuery { .. } => "invalid_query",
            StoreError::LockTimeout { .. } => "lock_timeout",
            StoreError::Io { .. } => "io",
            StoreError::Encoding { .. } => "encoding",
            StoreError::Backend(_) => "backend",
            StoreError::Engine(_) => "engine",
            StoreError::Corrupt { .. } => "corrupt",
        }
    }

    pub fn is_conflict(&self) -> bool {
        matches!(self, StoreError::Conflict { .. })
    }

    pub fn is_not_found(&self) -> bool {
        matches!(self, StoreError::NotFound { .. })
    }
}

/// Counters a store keeps about its own work.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct StoreStats {
    /// How many times a session's full state was loaded (`load`, and any
    /// internal full read). Header reads and listings do not count.
    pub full_loads: u64,
}

/// A thread-safe counter of full loads, for store implementations.
#[derive(Debug, Default)]
pub(crate) struct LoadCounter(AtomicU64);

impl LoadCounter {
    pub fn bump(&self) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            full_loads: self.get(),
        }
    }
}

/// Where sessions live. Object safe; implementations are shared across
/// threads. See the module docs for the version semantics.
pub trait SessionStore: Send + Sync {
    /// Persists a fresh session (version 0) as version 1.
    fn create(&self, session: AgentSession) -> Result<AgentSession, StoreError>;
    /// Persists a loaded-and-changed session as stored version + 1.
    fn save(&self, session: AgentSession) -> Result<AgentSession, StoreError>;
    /// The stored session, or `None`. Counts as a full load.
    fn load(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError>;
    fn exists(&self, id: &SessionId) -> Result<bool, StoreError>;
    /// Removes the session physically; returns whether it existed. (The
    /// runtime's `delete` tombstones instead: see `SessionRuntime::delete`.)
    fn delete(&self, id: &SessionId) -> Result<bool, StoreError>;
    /// Headers matching `query`, ordered and paged. Never loads state;
    /// unreadable records are reported in `skipped`, not fatal.
    fn list_headers(&self, query: &ListQuery) -> Result<SessionInfoList, StoreError>;
    /// One header, without loading the state.
    fn header(&self, id: &SessionId) -> Result<Option<AgentSessionInfo>, StoreError>;
    fn stats(&self) -> StoreStats;
    /// The store's native transcript surface for session handles (indexed
    /// heads, sources and appends without full loads). `None` (the
    /// default): handles use [`FullLoadBackend`].
    fn transcript_backend(&self) -> Option<&dyn TranscriptBackend> {
        None
    }
}

/// What listing sorts by. Ties are broken by session id.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ListOrder {
    #[default]
    UpdatedAt,
    CreatedAt,
    Id,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SortDirection {
    Ascending,
    /// Newest (or greatest id) first; the default.
    #[default]
    Descending,
}

/// Maximum page size a query may ask for.
pub const MAX_PAGE_LIMIT: u64 = 100_000;

/// A listing query: filter, order, page.
///
/// Filters combine with AND. Without a `status` filter, deleted
/// (tombstoned) sessions are left out unless `include_deleted` is set;
/// `status: Some(Deleted)` lists only them. Paging: `cursor` (from a
/// previous page's `next_cursor`, valid for the same order) skips to after
/// that item, then `offset` items are skipped, then at most `limit` are
/// returned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ListQuery {
    pub status: Option<SessionStatus>,
    pub agent: Option<String>,
    pub parent: Option<SessionId>,
    pub include_deleted: bool,
    pub order: ListOrder,
    pub direction: SortDirection,
    pub offset: u64,
    pub limit: Option<u64>,
    pub cursor: Option<String>,
}

impl ListQuery {
    /// Every non-deleted session, most recently updated first.
    pub fn all() -> Self {
        Self::default()
    }
    pub fn with_status(mut self, status: SessionStatus) -> Self {
        self.status = Some(status);
        self
    }
    pub fn with_agent(mut self, agent: impl Into<String>) -> Self {
        self.agent = Some(agent.into());
        self
    }
    /// Only sessions forked from `parent`.
    pub fn children_of(mut self, parent: SessionId) -> Self {
        self.parent = Some(parent);
        self
    }
    pub fn including_deleted(mut self) -> Self {
        self.include_deleted = true;
        self
    }
    pub fn order_by(mut self, order: ListOrder, direction: SortDirection) -> Self {
        self.order = order;
        self.direction = direction;
        self
    }
    pub fn page(mut self, offset: u64, limit: u64) -> Self {
        self.offset = offset;
        self.limit = Some(limit);
        self
    }
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = Some(limit);
        self
    }
    pub fn after(mut self, cursor: impl Into<String>) -> Self {
        self.cursor = Some(cursor.into());
        self
    }

    /// Whether a header passes the filters.
    pub fn matches(&self, h: &AgentSessionInfo) -> bool {
        match self.status {
            Some(st) if h.status != st => return false,
            None if h.status == SessionStatus::Deleted && !self.include_deleted => return false,
            _ => {}
        }
        if let Some(a) = &self.agent {
            if &h.agent_name != a {
                return false;
            }
        }
        if let Some(p) = &self.parent {
            if h.parent_id.as_ref() != Some(p) {
                return false;
            }
        }
        true
    }

    /// The primary sort key of a header (ties are broken by id).
    fn primary(&self, h: &AgentSessionInfo) -> i64 {
        match self.order {
            ListOrder::UpdatedAt => h.updated_at_ms,
            ListOrder::CreatedAt => h.created_at_ms,
            ListOrder::Id => 0,
        }
    }

    fn order_tag(&self) -> char {
        match self.order {
            ListOrder::UpdatedAt => 'u',
            ListOrder::CreatedAt => 'c',
            ListOrder::Id => 'i',
        }
    }

    /// The query's limit checked, and its cursor's position (primary key, id).
    pub(crate) fn checked_after(&self) -> Result<Option<(i64, String)>, StoreError> {
        if let Some(l) = self.limit {
            if l > MAX_PAGE_LIMIT {
                return Err(StoreError::InvalidQuery {
                    reason: format!("limit {l} exceeds {MAX_PAGE_LIMIT}"),
                });
            }
        }
        match &self.cursor {
            Some(c) => Ok(Some(self.decode_cursor(c)?)),
            None => Ok(None),
        }
    }

    pub(crate) fn encode_cursor(&self, h: &AgentSessionInfo) -> String {
        format!("{}{}:{}", self.order_tag(), self.primary(h), h.id.as_str())
    }

    fn decode_cursor(&self, c: &str) -> Result<(i64, String), StoreError> {
        let bad = |why: &str| StoreError::InvalidQuery {
            reason: format!("cursor {c:?}: {why}"),
        };
        let mut chars = c.chars();
        if chars.next() != Some(self.order_tag()) {
            return Err(bad("it belongs to a different order"));
        }
        let rest = chars.as_str();
        let (p, id) = rest.split_once(':').ok_or_else(|| bad("malformed"))?;
        let p: i64 = p.parse().map_err(|_| bad("malformed"))?;
        let id = SessionId::parse(id).map_err(|_| bad("malformed id"))?;
        Ok((p, id.as_str().to_string()))
    }

    /// Filters, sorts and pages a set of headers. Stores that keep all
    /// headers at hand use this so every store answers identically.
    pub fn apply<I>(&self, headers: I) -> Result<SessionInfoList, StoreError>
    where
        I: IntoIterator<Item = AgentSessionInfo>,
    {
        let after = self.checked_after()?;
        // Filter, sort and page in place: a listing can hold thousands of
        // headers, and a fresh buffer of that size is fresh pages the
        // allocator maps and faults in on every call (in place was clearly
        // faster than gathering the result into a new vector; see
        // `runtime/examples/list_profile`).
        let mut headers: Vec<AgentSessionInfo> = headers.into_iter().collect();
        headers.retain(|h| self.matches(h));
        let total = headers.len() as u64;
        // Sort positions by key rather than the headers themselves (fewer
        // bytes moved, no key copies). Ties of the key (the same id twice)
        // keep their input order ascending and the reverse descending, as
        // a stable ascending sort then a reversal would.
        let mut order: Vec<(i64, usize)> = headers
            .iter()
            .enumerate()
            .map(|(i, h)| (self.primary(h), i))
            .collect();
        let id_at = |i: usize| headers.get(i).map_or("", |h| h.id.as_str());
        let ascending = |a: &(i64, usize), b: &(i64, usize)| {
            a.0.cmp(&b.0)
                .then_with(|| id_at(a.1).cmp(id_at(b.1)))
                .then(a.1.cmp(&b.1))
        };
        match self.direction {
            SortDirection::Ascending => order.sort_unstable_by(ascending),
            SortDirection::Descending => order.sort_unstable_by(|a, b| ascending(b, a)),
        }
        let start = match &after {
            None => 0,
            Some((p, id)) => order
                .iter()
                .position(|&(kp, i)| {
                    let kk = (kp, id_at(i));
                    match self.direction {
                        SortDirection::Ascending => kk > (*p, id.as_str()),
                        SortDirection::Descending => kk < (*p, id.as_str()),
                    }
                })
                .unwrap_or(order.len()),
        };
        let start = start.saturating_add(usize::try_from(self.offset).unwrap_or(usize::MAX));
        let start = start.min(order.len());
        let end = match self.limit {
            Some(l) => start
                .saturating_add(usize::try_from(l).unwrap_or(usize::MAX))
                .min(order.len()),
            None => order.len(),
        };
        let next_cursor = if end < order.len() && end > start {
            headers.get(order[end - 1].1).map(|h| self.encode_cursor(h))
        } else {
            None
        };
        permute(&mut headers, &order[..end]);
        headers.truncate(end);
        headers.drain(..start);
        Ok(SessionInfoList {
            headers,
            total,
            next_cursor,
            skipped: Vec::new(),
        })
    }
}

/// Reorders `items` so that position `k` holds what was at `order[k].1`,
/// for every `k < order.len()`, in place (each cycle of the permutation is
/// followed once: O(n) swaps, no second buffer). Positions at and beyond
/// `order.len()` hold the items no position asked for, in no particular
/// order. `order`'s positions must be distinct and in range.
fn permute<T>(items: &mut [T], order: &[(i64, usize)]) {
    debug_assert!(order.len() <= items.len());
    // `source[k]`: where the item position k wants sits now. Positions
    // past `order.len()` want whatever is left over, which completes the
    // partial permutation into a full one.
    let n = items.len();
    let mut wanted = vec![false; n];
    let mut source: Vec<usize> = Vec::with_capacity(n);
    for &(_, i) in order {
        debug_assert!(
            i < n && !wanted[i],
            "order names position {i} twice or out of range"
        );
        source.push(i);
        wanted[i] = true;
    }
    source.extend((0..n).filter(|&i| !wanted[i]));
    let mut done = vec![false; n];
    for k in 0..n {
        if done[k] {
            continue;
        }
        // Walk the cycle through k: the item that started at k travels
        // along it while each visited position receives its item.
        let mut j = k;
        loop {
            done[j] = true;
            let src = source[j];
            if src == k {
                break;
            }
            items.swap(j, src);
            j = src;
        }
    }
}

/// The checks a transcript-level append makes before its commit, shared by
/// the stores with transcript indexes: the session exists (`header`), is
/// not deleted, and the append carries events. Races are the version
/// fence's to settle.
pub(crate) fn check_append(
    id: &SessionId,
    header: Option<&AgentSessionInfo>,
    events_empty: bool,
) -> Result<(), StoreError> {
    let Some(h) = header else {
        return Err(StoreError::NotFound { id: id.clone() });
    };
    if h.status == SessionStatus::Deleted {
        return Err(StoreError::InvalidSession {
            id: id.clone(),
            reason: "the session is deleted".into(),
        });
    }
    if events_empty {
        return Err(StoreError::InvalidSession {
            id: id.clone(),
            reason: "an append needs at least one event".into(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::permute;
    use proptest::prelude::*;

    proptest! {
        /// `permute` puts exactly the asked-for items first, in the asked
        /// order, and keeps every other item (a partial permutation of
        /// distinct positions, as `ListQuery::apply` passes it).
        #[test]
        fn permute_matches_a_gather(
            (n, picks) in (0usize..64).prop_flat_map(|n| {
                (Just(n), Just((0..n).collect::<Vec<_>>()).prop_shuffle())
            }),
            keep in 0usize..65,
        ) {
            let picks = &picks[..keep.min(n)];
            let order: Vec<(i64, usize)> = picks.iter().map(|&i| (0, i)).collect();
            let mut items: Vec<usize> = (0..n).map(|i| i * 10).collect();
            permute(&mut items, &order);
            let want: Vec<usize> = picks.iter().map(|&i| i * 10).collect();
            prop_assert_eq!(&items[..picks.len()], &want[..]);
            let mut all = items.clone();
            all.sort_unstable();
            prop_assert_eq!(all, (0..n).map(|i| i * 10).collect::<Vec<_>>());
        }
    }
}
