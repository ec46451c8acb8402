//! Snapshots of the log store and loads: a session's fold at some version
//! kept in the engine's index cache area, and [`LogStore::load_at`], which
//! starts from one and replays the tail. Snapshots are a cache only.
//!
//! A snapshot is the fold of a session at some version, kept in the
//! engine's index *cache* area (its key and value bytes, which end with
//! the [`encode_snapshot`] bytes, are in docs/format.md, "Snapshots"). Policy: a
//! `load` that replayed at least [`SNAPSHOT_TAIL_COMMITS`] commits beyond
//! the snapshot it started from (or from the start) writes a new one, so
//! the next load costs the snapshot plus a short tail; a read-only store,
//! whose cache lives only in its process, writes one from a session's
//! second load there. A snapshot that
//! fails to decode, has another schema, or does not fit the stream is
//! ignored and the events are replayed. Snapshots are a cache: a rebuild
//! drops them.

use std::ops::ControlFlow;

use spool_engine::CommitRef;

use super::sessions::{
    key, settings_commits_key, settings_commits_prefix, SETTINGS_BLOCK_VERSIONS,
};
use super::{
    be_u64, engine_err, LogStore, SESSION_EVENT_PREFIX, SESSION_INDEXER, SNAPSHOT_TAIL_COMMITS,
};
use crate::session::codec::{decode_event_without_transcript, is_transcript_kind};
use crate::session::CodecError;
use crate::session::{
    decode_event, decode_snapshot, encode_snapshot, AgentSession, SessionEvent, SessionId,
};
use crate::store::StoreError;
use crate::transcript::Transcript;

/// Tag of a snapshot in the cache area (its own key space: `s` there is not the
/// status listing key of the index proper).
pub(super) const CACHE_SNAPSHOT: u8 = b's';

/// Tag of a settings snapshot in the cache area: the fold of a session
/// without its transcript (see [`LogStore::load_settings`]).
pub(super) const CACHE_SETTINGS: u8 = b'b';

/// Tag of the mark a read-only store leaves in its (in-memory) cache area
/// after a session's first load (see [`LogStore::snapshot_worth_writing`]);
/// never on disk.
const CACHE_LOADED_ONCE: u8 = b'l';

/// A settings fold that replayed at least this many commits writes a
/// settings snapshot. Lower than [`SNAPSHOT_TAIL_COMMITS`]: a settings
/// snapshot holds no transcript, so it is cheap to write, and every
/// execute folds the tail after it.
pub(crate) const SETTINGS_TAIL_COMMITS: u64 = 16;

/// A commit whose stream version is a multiple of this refreshes the
/// session's settings snapshot ([`LogStore::refresh_settings`]), so a
/// session written by direct appends (no `execute` folding its settings)
/// still costs the next settings fold at most this many commits. Each
/// commit is then replayed about once more, spread over the appends.
pub(crate) const SETTINGS_REFRESH_COMMITS: u64 = 128;

/// The settings fold of events a writer holds in memory (an import writes
/// each session's settings snapshot from it, without reading the session
/// back): the same fold as [`LogStore::load_settings`] makes from the log.
/// A fold that fails (which the import's check pass rules out) writes
/// nothing.
#[derive(Default)]
pub(crate) struct SettingsFold {
    session: Option<AgentSession>,
    failed: bool,
}

impl SettingsFold {
    /// Folds one commit's events: transcript events are skipped, a
    /// `created` event's seed transcript is dropped.
    pub fn add(&mut self, events: &[SessionEvent]) {
        for ev in events {
            if self.failed {
                return;
            }
            if is_transcript_kind(ev.kind()) {
                continue;
            }
            let mut ev = ev.clone();
            if let SessionEvent::Created { state, .. } = &mut ev {
                state.transcript = Transcript::new();
            }
            let folded = match self.session.take() {
                Some(s) => s.replay_onto(std::iter::once(&ev)),
                None => AgentSession::replay(std::iter::once(&ev)),
            };
            match folded {
                Ok(s) => self.session = Some(s),
                Err(_) => self.failed = true,
            }
        }
    }

    /// [`SettingsFold::add`] for a commit's events as the store writes them:
    /// transcript events are skipped by their kind, undecoded; an event that
    /// does not decode fails the fold.
    pub fn add_encoded(&mut self, events: &[spool_engine::EventData]) {
        for e in events {
            if self.failed {
                return;
            }
            let kind = e.kind.strip_prefix(SESSION_EVENT_PREFIX).unwrap_or(&e.kind);
            if is_transcript_kind(kind) {
                continue;
            }
            match decode_event_without_transcript(&e.payload) {
                Ok(ev) => self.add(std::slice::from_ref(&ev)),
                Err(_) => self.failed = true,
            }
        }
    }
}

impl LogStore {
    fn read_snapshot(
        &self,
        id: &SessionId,
        base: u64,
        head: u64,
    ) -> Option<(u64, i64, AgentSession)> {
        self.read_cached(CACHE_SNAPSHOT, id, base, head)
    }

    fn read_cached(
        &self,
        tag: u8,
        id: &SessionId,
        base: u64,
        head: u64,
    ) -> Option<(u64, i64, AgentSession)> {
        let decoded = |bytes: &[u8]| {
            let version = be_u64(bytes.get(..8)?)?;
            let updated = i64::from_be_bytes(bytes.get(8..16)?.try_into().ok()?);
            if version <= base || version > head {
                return None;
            }
            let session = decode_snapshot(bytes.get(16..)?).ok()?;
            Some((version, updated, session))
        };
        let (version, updated, session) = self
            .engine()
            .ok()?
            .index()
            .with_cache(SESSION_INDEXER, &key(tag, id.as_str()), decoded)
            .ok()?
            .flatten()?;
        if session.id() != id {
            return None;
        }
        Some((version, updated, session))
    }

    fn write_snapshot(&self, session: &AgentSession, stream_version: u64) {
        self.write_cached(CACHE_SNAPSHOT, session, stream_version)
    }

    fn write_cached(&self, tag: u8, session: &AgentSession, stream_version: u64) {
        // A snapshot is a cache entry: failing to write one costs only time.
        if let Ok(bytes) = encode_snapshot(session) {
            let mut v = Vec::with_capacity(16 + bytes.len());
            v.extend_from_slice(&stream_version.to_be_bytes());
            v.extend_from_slice(&session.info().updated_at_ms.to_be_bytes());
            v.extend_from_slice(&bytes);
            if let Ok(engine) = self.engine() {
                let _ =
                    engine
                        .index()
                        .put_cache(SESSION_INDEXER, &key(tag, session.id().as_str()), &v);
            }
        }
    }

    /// How many sessions have a snapshot in the cache (not settings snapshots).
    pub fn cached_snapshots(&self) -> Result<u64, StoreError> {
        self.engine()?
            .index()
            .count_cache_prefix(SESSION_INDEXER, &[CACHE_SNAPSHOT])
            .map_err(engine_err)
    }

    /// Loads the session as of stream version `upto` (inclusive), or its
    /// head when `None`. Used by `load` and by time travel.
    pub fn load_at(
        &self,
        id: &SessionId,
        upto: Option<u64>,
    ) -> Result<Option<AgentSession>, StoreError> {
        let Some(head) = self
            .engine()?
            .stream_version(id.as_str())
            .map_err(engine_err)?
        else {
            return Ok(None);
        };
        let Some((_, base)) = self.record(id)? else {
            return Ok(None);
        };
        if head <= base {
            return Ok(None);
        }
        let target = match upto {
            Some(v) => base.saturating_add(v).min(head),
            None => head,
        };
        if target <= base {
            return Ok(None);
        }
        self.loads.bump();
        let snapshot = if upto.is_none() {
            self.read_snapshot(id, base, head)
        } else {
            None
        };
        let start = Folded::from(snapshot, base);
        let Folded {
            session,
            version,
            updated,
            replayed,
        } = self.fold_commits(id, start, 0, target, decode_event, |_| true)?;
        let Some(session) = session else {
            return Ok(None);
        };
        let session = session.reconstitute(version - base, updated);
        if upto.is_none() && replayed >= SNAPSHOT_TAIL_COMMITS && self.snapshot_worth_writing(id) {
            self.write_snapshot(&session, version);
        }
        Ok(Some(session))
    }

    /// Whether a load that replayed a long tail of `id` should write a
    /// snapshot. An owner's cache persists in sled: always. A read-only
    /// store's lives only in this process: from the session's second load
    /// here on, so that a one-shot read (the command-line tools) does not
    /// encode a snapshot nobody reads.
    fn snapshot_worth_writing(&self, id: &SessionId) -> bool {
        let Ok(engine) = self.engine() else {
            return false;
        };
        if !engine.is_read_only() {
            return true;
        }
        let mark = key(CACHE_LOADED_ONCE, id.as_str());
        let index = engine.index();
        if matches!(index.get_cache(SESSION_INDEXER, &mark), Ok(Some(_))) {
            return true;
        }
        let _ = index.put_cache(SESSION_INDEXER, &mark, &[]);
        false
    }
}

impl LogStore {
    /// Writes the settings snapshot `fold` ends in, as of stream version
    /// `stream_version` committed at `updated_ms`, for a session whose
    /// version base is `base`. A cache write: failing costs only time.
    pub(crate) fn write_settings_fold(
        &self,
        fold: SettingsFold,
        base: u64,
        stream_version: u64,
        updated_ms: i64,
    ) {
        if let (Some(session), false) = (fold.session, fold.failed) {
            debug_assert!(stream_version > base, "a fold of no commit");
            let session = session.reconstitute(stream_version - base, updated_ms);
            self.write_cached(CACHE_SETTINGS, &session, stream_version);
        }
    }

    /// After a commit at `stream_version`: every
    /// [`SETTINGS_REFRESH_COMMITS`] stream versions, folds the settings
    /// (which writes a snapshot when the last one is at least
    /// [`SETTINGS_TAIL_COMMITS`] commits old). A cache write: a failure is
    /// left to the next fold.
    pub(super) fn refresh_settings(&self, id: &SessionId, stream_version: u64) {
        if stream_version.is_multiple_of(SETTINGS_REFRESH_COMMITS) {
            let _ = self.load_settings(id);
        }
    }

    /// The session at its head folded without its transcript: header,
    /// definition and state with an empty transcript (its `generation` is
    /// left as folded from the non-transcript events; the transcript index
    /// knows the real one). Not a full load: transcript events are skipped
    /// by their kind without being decoded, and the fold starts from a
    /// settings snapshot (cache tag `b`, see docs/format.md) that a fold which
    /// replayed at least `SETTINGS_TAIL_COMMITS` commits writes, and reads
    /// only the commits after it that hold an event it folds (and the
    /// head), so its cost follows those commits, not the history. A
    /// `created` event's seed transcript is dropped while it is decoded.
    pub fn load_settings(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        let Some(head) = self
            .engine()?
            .stream_version(id.as_str())
            .map_err(engine_err)?
        else {
            return Ok(None);
        };
        let Some((_, base)) = self.record(id)? else {
            return Ok(None);
        };
        if head <= base {
            return Ok(None);
        }
        let start = Folded::from(self.read_cached(CACHE_SETTINGS, id, base, head), base);
        // The transcript events are skipped by kind, never decoded (the
        // transcript index answers for them).
        let Folded {
            session,
            version,
            updated,
            replayed,
        } = self.fold_settings(id, start, head)?;
        let Some(session) = session else {
            return Ok(None);
        };
        let session = session.reconstitute(version - base, updated);
        if replayed >= SETTINGS_TAIL_COMMITS {
            self.write_cached(CACHE_SETTINGS, &session, version);
        }
        Ok(Some(session))
    }
}

/// The runs of consecutive versions marked in `bits` (block `block` of a
/// session's [`KEY_SETTINGS_COMMITS`](super::sessions::KEY_SETTINGS_COMMITS)
/// keys) within `from..=upto`, each as (first, last).
fn marked_runs(block: u64, bits: u64, from: u64, upto: u64) -> Vec<(u64, u64)> {
    let first = block
        .saturating_mul(SETTINGS_BLOCK_VERSIONS)
        .saturating_add(1);
    let mut runs: Vec<(u64, u64)> = Vec::new();
    for i in 0..SETTINGS_BLOCK_VERSIONS {
        let v = first.saturating_add(i);
        if bits & (1 << i) == 0 || v < from || v > upto {
            continue;
        }
        match runs.last_mut() {
            Some(r) if r.1 + 1 == v => r.1 = v,
            _ => runs.push((v, v)),
        }
    }
    runs
}

/// Where a fold of a session's commits stands: the session so far (none
/// before its first commit), the stream version and time of the last commit
/// folded, and how many commits this fold replayed.
struct Folded {
    session: Option<AgentSession>,
    version: u64,
    updated: i64,
    replayed: u64,
}

impl Folded {
    /// Where a fold starts: a cached session (its version, time and state),
    /// or nothing at the incarnation's base version.
    fn from(cached: Option<(u64, i64, AgentSession)>, base: u64) -> Folded {
        let (session, version, updated) = match cached {
            Some((v, u, s)) => (Some(s), v, u),
            None => (None, base, 0),
        };
        Folded {
            session,
            version,
            updated,
            replayed: 0,
        }
    }
}

/// Blocks of [`KEY_SETTINGS_COMMITS`](super::sessions::KEY_SETTINGS_COMMITS)
/// a settings fold reads at a time (4 KiB of them in memory).
const SETTINGS_BLOCKS_READ: usize = 256;

impl LogStore {
    /// The settings fold of session `id` after `start` up to stream version
    /// `upto`: only the commits with an event it reads (marked in the
    /// sessions index,
    /// [`KEY_SETTINGS_COMMITS`](super::sessions::KEY_SETTINGS_COMMITS)),
    /// then the one at `upto`, for the session's version and update time.
    /// A commit without such an event changes nothing here (its events are
    /// all skipped by kind), so a session of transcript appends costs its
    /// `created` commit and its head, whatever its length. An index whose
    /// marks do not read as written is not trusted: every commit is folded
    /// then.
    fn fold_settings(
        &self,
        id: &SessionId,
        start: Folded,
        upto: u64,
    ) -> Result<Folded, StoreError> {
        if start.version >= upto {
            // A snapshot at the head: nothing to read.
            return Ok(start);
        }
        let decode = decode_event_without_transcript;
        let keep = |kind: &str| !is_transcript_kind(kind);
        let engine = self.engine()?;
        let prefix = settings_commits_prefix(id.as_str());
        let mut at = start;
        let mut from = at.version.saturating_add(1);
        loop {
            let mut blocks: Vec<(u64, u64)> = Vec::with_capacity(SETTINGS_BLOCKS_READ);
            let mut malformed = false;
            let (from_key, _) = settings_commits_key(id.as_str(), from);
            engine
                .index()
                .visit_range(SESSION_INDEXER, &prefix, &from_key, |k, v| {
                    match (k.get(prefix.len()..).and_then(be_u64), be_u64(v)) {
                        (Some(block), Some(bits)) if k.len() == prefix.len() + 8 => {
                            blocks.push((block, bits));
                        }
                        _ => malformed = true,
                    }
                    !malformed && blocks.len() < SETTINGS_BLOCKS_READ
                })
                .map_err(engine_err)?;
            if malformed {
                return self.fold_commits(id, at, from, upto, decode, keep);
            }
            let last_read = blocks.len() < SETTINGS_BLOCKS_READ;
            let next_block = blocks.last().map(|&(b, _)| b.saturating_add(1));
            for (block, bits) in blocks {
                for run in marked_runs(block, bits, from, upto) {
                    at = self.fold_commits(id, at, run.0, run.1, decode, keep)?;
                }
            }
            match next_block {
                Some(b) if !last_read => {
                    from = from.max(b.saturating_mul(SETTINGS_BLOCK_VERSIONS).saturating_add(1));
                    if from > upto {
                        break;
                    }
                }
                _ => break,
            }
        }
        if at.version < upto {
            // The head: the session's version and update time (and the proof
            // that the log holds it).
            at = self.fold_commits(id, at, upto, upto, decode, keep)?;
        }
        Ok(at)
    }

    /// Folds the commits of session `id` from stream version `from` up to
    /// `upto` onto `start`: of each commit, the session events whose kind
    /// (without the prefix) `keep` accepts, decoded with `decode`. Each commit
    /// is visited where it lies in the log (`visit_stream`), never copied
    /// out: a session's commits can be megabytes each.
    fn fold_commits(
        &self,
        id: &SessionId,
        start: Folded,
        from: u64,
        upto: u64,
        decode: fn(&[u8]) -> Result<SessionEvent, CodecError>,
        keep: impl Fn(&str) -> bool,
    ) -> Result<Folded, StoreError> {
        let mut at = start;
        let mut failed: Option<StoreError> = None;
        let from = from.max(at.version.saturating_add(1));
        let limit =
            usize::try_from(upto.saturating_add(1).saturating_sub(from)).unwrap_or(usize::MAX);
        let mut fold = |c: CommitRef<'_>| -> Result<(), StoreError> {
            let mut events = Vec::with_capacity(c.event_count());
            for (i, e) in c.events().enumerate() {
                match e.kind.strip_prefix(SESSION_EVENT_PREFIX) {
                    Some(kind) if keep(kind) => {}
                    _ => continue,
                }
                let event = decode(e.payload).map_err(|source| StoreError::Encoding {
                    context: format!("session {id}, stream version {}, event {i}", c.version),
                    source,
                })?;
                events.push(event);
            }
            // A session's first commit must begin it (its `created` event).
            let session = match at.session.take() {
                Some(s) => s.replay_onto(events.iter()),
                None => AgentSession::replay(events.iter()),
            };
            at.session = Some(session.map_err(|e| StoreError::Corrupt {
                id: id.clone(),
                reason: format!("stream version {}: {e}", c.version),
            })?);
            at.version = c.version;
            at.updated = c.timestamp_ms;
            at.replayed += 1;
            Ok(())
        };
        self.engine()?
            .visit_stream(id.as_str(), from, limit, |c| {
                if c.version > upto {
                    return ControlFlow::Break(());
                }
                match fold(c) {
                    Ok(()) => ControlFlow::Continue(()),
                    Err(e) => {
                        failed = Some(e);
                        ControlFlow::Break(())
                    }
                }
            })
            .map_err(engine_err)?;
        match failed {
            Some(e) => Err(e),
            // The index named `upto` (at most the stream's head): a fold that
            // ends before it would be a session missing commits, never returned.
            None if at.version < upto => Err(StoreError::Corrupt {
                id: id.clone(),
                reason: format!(
                    "the log holds the session's commits up to stream version {}, \
                     the index names version {upto}",
                    at.version
                ),
            }),
            None => Ok(at),
        }
    }
}

#[cfg(test)]
impl LogStore {
    /// The settings snapshot of `id`, if the cache holds one: its stream
    /// version and session.
    pub(crate) fn cached_settings(&self, id: &SessionId) -> Option<(u64, AgentSession)> {
        self.read_cached(CACHE_SETTINGS, id, 0, u64::MAX)
            .map(|(v, _, s)| (v, s))
    }

    /// Drops the settings snapshot of `id`, so the next fold starts from
    /// the first commit.
    pub(crate) fn drop_cached_settings(&self, id: &SessionId) {
        let engine = self.engine().expect("engine");
        engine
            .index()
            .remove_cache(SESSION_INDEXER, &key(CACHE_SETTINGS, id.as_str()))
            .expect("remove the settings snapshot");
    }

    /// Asserts that the settings fold of `id` from its snapshot equals
    /// the fold from its first commit.
    pub(crate) fn assert_settings_fold_from_start(&self, id: &SessionId) {
        let cached = self.load_settings(id).unwrap().unwrap();
        self.drop_cached_settings(id);
        let whole = self.load_settings(id).unwrap().unwrap();
        assert_eq!(cached.state(), whole.state());
        assert_eq!(cached.definition(), whole.definition());
        assert_eq!(cached.info(), whole.info());
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::AgentDefinition;
    use crate::store::{LogStoreOptions, SessionStore};
    use crate::transcript::{ContentBlock, EntryKind, Message};

    fn open(dir: &std::path::Path) -> LogStore {
        let opts = LogStoreOptions {
            durability: spool_engine::Durability::Buffered,
            ..Default::default()
        };
        LogStore::open(dir, opts).unwrap()
    }

    /// A session of `commits` saves after its creation, each appending a
    /// user message and writing metadata `n`.
    fn session_of(store: &LogStore, commits: u64) -> AgentSession {
        let def = AgentDefinition::new("a", "d", "p");
        let mut s = store.create(AgentSession::new(def, None)).unwrap();
        for i in 0..commits {
            s.append(EntryKind::Message {
                message: Message::User {
                    content: vec![ContentBlock::text(format!("turn {i}"))],
                },
            })
            .unwrap();
            s.write_metadata("n", serde_json::json!(i)).unwrap();
            s = store.save(s).unwrap();
        }
        s
    }

    /// The settings fold reads only the commits the sessions index marks
    /// (and the head), and answers what folding every commit answers:
    /// sessions of seeded random mixes of saves that append an entry, write
    /// metadata, or both, on both sides of a block of marks, and a session
    /// purged and created again under its id.
    #[test]
    fn the_settings_fold_reads_the_marked_commits_and_answers_as_the_whole_fold() {
        let seed = 0x5e77_1a65_u64;
        println!("seed {seed:#x}");
        let mut rng = crate::test_rng::Rng::seeded(seed);
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let def = AgentDefinition::new("a", "d", "p");
        let mut ids = Vec::new();
        for (case, saves) in [0u64, 1, 5, 63, 64, 65, 300].into_iter().enumerate() {
            let mut s = match ids.first().filter(|_| case == 6) {
                // The last case purges the first session and creates it again.
                Some(id) => {
                    assert!(store.delete(id).unwrap());
                    let s = AgentSession::new_with_id(SessionId::clone(id), def.clone(), None);
                    store.create(s).unwrap()
                }
                None => store.create(AgentSession::new(def.clone(), None)).unwrap(),
            };
            // The created commit reads; each save after it reads when it
            // writes metadata.
            let mut marked = 1u64;
            let mut head_marked = true;
            for i in 0..saves {
                let kind = rng.below(3);
                if kind != 1 {
                    s.append(EntryKind::Message {
                        message: Message::User {
                            content: vec![ContentBlock::text(format!("turn {i}"))],
                        },
                    })
                    .unwrap();
                }
                if kind != 0 {
                    s.write_metadata("n", serde_json::json!(i)).unwrap();
                }
                marked += u64::from(kind != 0);
                head_marked = kind != 0;
                s = store.save(s).unwrap();
            }
            let id = s.id().clone();
            ids.push(id.clone());
            store.drop_cached_settings(&id);
            let (_, base) = store.record(&id).unwrap().unwrap();
            let head = base + s.version();
            let keep = |kind: &str| !is_transcript_kind(kind);
            let start = || Folded::from(None, base);
            let whole = store
                .fold_commits(&id, start(), 0, head, decode_event_without_transcript, keep)
                .unwrap();
            let read = store.fold_settings(&id, start(), head).unwrap();
            let what = format!("case {case}: {saves} saves, {marked} marked");
            assert_eq!(
                (read.version, read.updated),
                (whole.version, whole.updated),
                "{what}"
            );
            let (r, w) = (read.session.unwrap(), whole.session.unwrap());
            assert_eq!(r.state(), w.state(), "{what}");
            assert_eq!(r.definition(), w.definition(), "{what}");
            assert_eq!(r.info(), w.info(), "{what}");
            assert_eq!(whole.replayed, saves + 1, "{what}");
            assert_eq!(read.replayed, marked + u64::from(!head_marked), "{what}");
        }
    }

    /// The index names the version a fold must reach; commits that stop
    /// before it (the log lacks some of the session's commits) are a
    /// corrupt session, not a shorter one returned as if whole.
    #[test]
    fn a_fold_whose_commits_end_before_the_named_version_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let id = session_of(&store, 3).id().clone();
        let head = store
            .engine()
            .unwrap()
            .stream_version(id.as_str())
            .unwrap()
            .unwrap();
        let (_, base) = store.record(&id).unwrap().unwrap();
        let fold = |upto| {
            store.fold_commits(&id, Folded::from(None, base), 0, upto, decode_event, |_| {
                true
            })
        };
        // Up to the head, the same fold is whole.
        let whole = fold(head).unwrap();
        assert_eq!((whole.version, whole.replayed), (head, head - base));
        match fold(head + 2) {
            Err(StoreError::Corrupt { id: got, reason }) => {
                assert_eq!(got, id);
                assert!(
                    reason.contains(&format!("up to stream version {head}"))
                        && reason.contains(&format!("names version {}", head + 2)),
                    "{reason}"
                );
            }
            Err(e) => panic!("expected a corrupt session, got {e}"),
            Ok(f) => panic!("a fold ending at version {} was returned", f.version),
        }
    }

    #[test]
    fn direct_appends_keep_the_settings_snapshot_fresh() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let commits = 3 * SETTINGS_REFRESH_COMMITS + 5;
        let s = session_of(&store, commits);
        let id = s.id().clone();
        // Nothing but the commits ran a settings fold: the snapshot is the
        // appends' own, at most one refresh interval behind the head.
        let head = s.version();
        let (version, cached) = store.cached_settings(&id).expect("a settings snapshot");
        assert!(
            head - version < SETTINGS_REFRESH_COMMITS,
            "snapshot at {version}, head {head}"
        );
        assert_eq!(cached.version(), version);
        store.assert_settings_fold_from_start(&id);
        let settings = store.load_settings(&id).unwrap().unwrap();
        assert_eq!(settings.version(), head);
        assert_eq!(
            settings.state().metadata.get("n"),
            Some(&serde_json::json!(commits - 1).into())
        );
    }

    #[test]
    fn a_read_only_store_writes_a_snapshot_from_a_sessions_second_load() {
        let dir = tempfile::tempdir().unwrap();
        let store = open(dir.path());
        let id = session_of(&store, SNAPSHOT_TAIL_COMMITS + 2).id().clone();
        store.close().unwrap();
        let ro = LogStore::open_read_only(dir.path()).unwrap();
        let first = ro.load(&id).unwrap().unwrap();
        assert!(
            ro.read_snapshot(&id, 0, u64::MAX).is_none(),
            "after one load"
        );
        assert_eq!(ro.cached_snapshots().unwrap(), 0);
        let second = ro.load(&id).unwrap().unwrap();
        let (version, _, cached) = ro.read_snapshot(&id, 0, u64::MAX).expect("after two");
        assert_eq!(ro.cached_snapshots().unwrap(), 1);
        assert_eq!(version, first.version());
        assert_eq!(cached.state(), first.state());
        let third = ro.load(&id).unwrap().unwrap();
        for s in [&second, &third] {
            assert_eq!((s.info(), s.state()), (first.info(), first.state()));
        }
        // An owner writes one at the first load that replays a long tail.
        drop(ro);
        let owner = open(dir.path());
        assert_eq!(owner.cached_snapshots().unwrap(), 0);
        owner.load(&id).unwrap().unwrap();
        assert!(owner.read_snapshot(&id, 0, u64::MAX).is_some());
        assert_eq!(owner.cached_snapshots().unwrap(), 1);
    }

    #[test]
    fn import_writes_each_long_session_settings_snapshot() {
        use crate::store::exchange::{import_sessions, read_export, ExportWriter, ImportOptions};
        let a = tempfile::tempdir().unwrap();
        let b = tempfile::tempdir().unwrap();
        let sa = open(a.path());
        let long = session_of(&sa, SETTINGS_TAIL_COMMITS);
        let short = session_of(&sa, 2);
        let mut w = ExportWriter::new(Vec::new()).unwrap();
        w.session(&sa, long.id()).unwrap();
        w.session(&sa, short.id()).unwrap();
        let bytes = w.finish().unwrap().0;
        let sessions = read_export(&bytes[..]).unwrap();
        let sb = open(b.path());
        import_sessions(&sb, &sessions, &ImportOptions::default(), &mut || {}).unwrap();
        let (version, cached) = sb.cached_settings(long.id()).expect("a settings snapshot");
        assert_eq!(cached.version(), long.version());
        assert_eq!(cached.version(), version, "no version base");
        assert_eq!(cached.state().metadata, long.state().metadata);
        sb.assert_settings_fold_from_start(long.id());
        // A short session's first fold is cheap: no snapshot for it.
        assert!(sb.cached_settings(short.id()).is_none());
    }
}
