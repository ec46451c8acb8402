//! Importing: the sources an import reads, the check pass that writes
//! nothing, and the write pass.

use super::spill::{SpillReader, SpillWriter, Spilled};
use super::twice::SeenIds;
use super::*;

// ---------------------------------------------------------------------------
// Import
// ---------------------------------------------------------------------------

/// How to import.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct ImportOptions {
    /// Give every commit a fresh commit id instead of keeping the file's
    /// (needed when the file's commits are already in the store, e.g.
    /// re-importing a purged session into the store it came from).
    pub fresh_commit_ids: bool,
    /// Finish an import of the same source that was cut short (a crash, a
    /// kill): a session already in the store whose commits are the source's
    /// first ones, commit id for commit id at the same versions, is continued
    /// after them instead of refused. Not with `fresh_commit_ids`, nor with a
    /// source that makes up commit ids per reading (a pi file). A resumed
    /// import that fails purges nothing ([`ExchangeError::ResumeFailed`]): it
    /// leaves what it wrote, as a crash would, and running it again continues.
    pub resume: bool,
}

impl ImportOptions {
    pub fn fresh_commit_ids(mut self, yes: bool) -> Self {
        self.fresh_commit_ids = yes;
        self
    }

    /// See [`ImportOptions::resume`].
    pub fn resume(mut self, yes: bool) -> Self {
        self.resume = yes;
        self
    }
}

/// What one session's import did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ImportedSession {
    pub id: SessionId,
    /// The session's version after import (its number of commits).
    pub version: u64,
    pub events: u64,
    pub entries: u64,
}

/// Where an import is, for a progress display.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ImportProgress {
    /// The first pass (nothing written yet) has checked this many commits.
    Checked { commits: u64 },
    /// The second pass has written `commits` of `total`.
    Written { commits: u64, total: u64 },
}

/// Sessions to import. A store directory's import ([`import_from`]) reads
/// them once; a PostgreSQL import reads them twice, once to check them all
/// and once to write them, so every reading must yield the same commits in
/// the same order (a source read from a file re-reads the file).
pub trait ImportSource {
    /// Calls `f` on every commit of every session, in order: a session's
    /// commits come one after the other, in version order from 1. Stops at
    /// `f`'s first error. Commits are lent one at a time, so a source that
    /// reads a file holds one commit, not a session.
    fn for_each_commit(
        &mut self,
        f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError>;
}

impl ImportSource for &[ImportSession] {
    fn for_each_commit(
        &mut self,
        f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError> {
        for s in self.iter() {
            if s.commits.is_empty() {
                return Err(ExchangeError::Malformed {
                    line: 0,
                    reason: format!("session {} has no commits", s.id),
                });
            }
            s.commits.iter().try_for_each(|c| f(&s.id, c))?;
        }
        Ok(())
    }
}

/// A `spool-export` file read from its path, one commit at a time.
pub struct ExportFile {
    path: std::path::PathBuf,
}

impl ExportFile {
    pub fn new(path: impl Into<std::path::PathBuf>) -> Self {
        ExportFile { path: path.into() }
    }
}

impl ImportSource for ExportFile {
    fn for_each_commit(
        &mut self,
        f: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError> {
        let file = std::fs::File::open(&self.path).map_err(|source| ExchangeError::Io {
            context: format!("opening {}", self.path.display()),
            source,
        })?;
        let reader = ExportReader::new(std::io::BufReader::with_capacity(1 << 16, file))?;
        super::ahead::for_each_read_ahead(reader, f)
    }
}

/// Splits a source's commits into sessions for one pass of an import:
/// `start` at a session's first commit (the id is new to this pass), `commit`
/// for each, `end` after a session's last (before the next one starts, and
/// once after the source's last commit). An error while a session is under
/// way (its `commit`, or the source's own) goes through `fail` with that
/// session, which returns the error to report (a deferred refusal of an
/// earlier commit of the session comes first).
pub(crate) fn for_each_session_commit<S>(
    source: &mut dyn ImportSource,
    start: &mut dyn FnMut(&SessionId, &ImportCommit) -> Result<S, ExchangeError>,
    commit: &mut dyn FnMut(&mut S, &ImportCommit) -> Result<(), ExchangeError>,
    end: &mut dyn FnMut(S) -> Result<(), ExchangeError>,
    fail: &mut dyn FnMut(&mut S, ExchangeError) -> ExchangeError,
) -> Result<(), ExchangeError> {
    let mut ids: HashSet<SessionId> = HashSet::new();
    let mut cur: Option<(SessionId, S)> = None;
    let read = source.for_each_commit(&mut |id, c| {
        if cur.as_ref().is_none_or(|(cur_id, _)| cur_id != id) {
            if let Some((_, s)) = cur.take() {
                end(s)?;
            }
            if !ids.insert(id.clone()) {
                return Err(ExchangeError::Malformed {
                    line: c.lines.first().copied().unwrap_or(0),
                    reason: format!("session {id} appears twice"),
                });
            }
            cur = Some((id.clone(), start(id, c)?));
        }
        match cur.as_mut() {
            Some((_, s)) => commit(s, c),
            None => Ok(()),
        }
    });
    if let Err(e) = read {
        return Err(match cur.as_mut() {
            Some((_, s)) => fail(s, e),
            None => e,
        });
    }
    match cur.take() {
        Some((_, s)) => end(s),
        None => Ok(()),
    }
}

/// What the first pass learnt of one session.
pub(crate) struct Planned {
    pub(crate) id: SessionId,
    /// The stream version the session continues from.
    pub(crate) base: u64,
    /// Commits an earlier import of the same source already wrote (a resumed
    /// import, see [`ImportOptions::resume`]): versions `1..=done` are skipped.
    pub(crate) done: u64,
    pub(crate) commits: u64,
    pub(crate) events: u64,
    pub(crate) entries: u64,
    /// The folded session's header (what the PostgreSQL store's import
    /// writes before the commits).
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) info: AgentSessionInfo,
}

impl Planned {
    /// From a finished light fold.
    pub(crate) fn from_fold(fold: SessionFold, base: u64) -> Result<Planned, ExchangeError> {
        let (id, commits, events) = (fold.id().clone(), fold.commits(), fold.events());
        let entries = fold.entries();
        let folded = fold.finish()?;
        Ok(Planned {
            id,
            base,
            done: 0,
            commits,
            events,
            entries,
            info: folded.info().clone(),
        })
    }

    pub(crate) fn imported(&self) -> ImportedSession {
        ImportedSession {
            id: self.id.clone(),
            version: self.commits,
            events: self.events,
            entries: self.entries,
        }
    }
}

/// The engine commit that imports `c` (its events encoded as a
/// [`LogStore`] writes them).
fn new_commit(
    s: &SessionId,
    c: &ImportCommit,
    base: u64,
    opts: &ImportOptions,
) -> Result<NewCommit, String> {
    let mut events = Vec::with_capacity(c.events.len());
    for ev in &c.events {
        let payload = encode_event(ev).map_err(|e| format!("encoding {}: {e}", ev.kind()))?;
        events.push(EventData::new(stored_kind(ev), payload));
    }
    Ok(NewCommit {
        stream: s.as_str().to_string(),
        expected: ExpectedVersion::Exact(base + c.version - 1),
        commit_id: if opts.fresh_commit_ids {
            Uuid::new_v4()
        } else {
            c.commit_id
        },
        events,
    })
}

/// The stream version session `id` continues from in `store` (0, or the
/// version of the purge that ended an earlier incarnation), and how many of
/// its commits an earlier import of the same source wrote (0 for a new
/// session). Fails when the session exists, unless the import resumes
/// ([`ImportOptions::resume`]: its commits are then checked one by one in
/// [`check_commit`]), or when the stream is something else.
fn session_start(
    store: &LogStore,
    id: &SessionId,
    opts: &ImportOptions,
) -> Result<(u64, u64), ExchangeError> {
    if let Some(header) = store.header(id)? {
        let resumable = opts.resume && !opts.fresh_commit_ids;
        let engine = store.engine()?;
        let head = engine.stream_version(id.as_str()).map_err(engine_err)?;
        let base = head.and_then(|h| h.checked_sub(header.version));
        return match (resumable, base) {
            (true, Some(base)) => Ok((base, header.version)),
            _ => Err(ExchangeError::SessionExists { id: id.clone() }),
        };
    }
    let engine = store.engine()?;
    match engine.stream_version(id.as_str()).map_err(engine_err)? {
        None => Ok((0, 0)),
        Some(head) => {
            // A stream without a session header is either a purged
            // session (its last commit is the purge marker) or some
            // other stream that must not be mixed with a session.
            let last = engine
                .read_stream(id.as_str(), head, 1)
                .map_err(engine_err)?;
            let purged = last
                .first()
                .is_some_and(|c| c.events.iter().any(|e| e.kind == PURGE_EVENT_KIND));
            if !purged {
                return Err(ExchangeError::StreamExists { id: id.clone() });
            }
            Ok((head, 0))
        }
    }
}

/// Checks one commit of session `fold` against `store` and the commits
/// before it in the same import, writing nothing: it folds, its commit id
/// is free, it fits the store's record limit. Returns the engine commit
/// that imports it.
fn check_commit(
    store: &LogStore,
    fold: &mut SessionFold,
    (base, done): (u64, u64),
    c: &ImportCommit,
    opts: &ImportOptions,
    commit_ids: &mut SeenIds<'_>,
) -> Result<NewCommit, ExchangeError> {
    fold.commit(c)?;
    let id = fold.id();
    let engine = store.engine()?;
    if !opts.fresh_commit_ids {
        // A commit id the source holds twice is found once every id is seen.
        commit_ids
            .push(c.commit_id)
            .map_err(|source| ExchangeError::Io {
                context: "keeping the file's commit ids in a temporary file failed".into(),
                source,
            })?;
    }
    let line = c.lines.first().copied().unwrap_or(0);
    let encode = || {
        new_commit(id, c, base, opts).map_err(|reason| ExchangeError::Malformed {
            line,
            reason: format!("session {id} version {}: {reason}", c.version),
        })
    };
    if c.version <= done {
        // Written by the import this one resumes: the store's commit at this
        // version must be the source's (commit ids are drawn at random).
        let ours = engine
            .commit_by_id(c.commit_id)
            .map_err(engine_err)?
            .is_some_and(|i| i.stream == id.as_str() && i.version == base + c.version);
        return match ours {
            true => encode(),
            false => Err(ExchangeError::NotResumable {
                id: id.clone(),
                version: c.version,
            }),
        };
    }
    if !opts.fresh_commit_ids {
        let taken = engine
            .commit_by_id(c.commit_id)
            .map_err(engine_err)?
            .is_some();
        if taken {
            return Err(ExchangeError::CommitIdTaken {
                id: id.clone(),
                version: c.version,
                commit_id: c.commit_id,
            });
        }
    }
    // Every commit must fit the store's record limit before the first
    // write, so an oversized entry writes nothing.
    let commit = encode()?;
    if let Err(e) = engine.check_commit(&commit) {
        // Name the line of the commit's largest event: the likely cause.
        let largest = (0..commit.events.len())
            .max_by_key(|&i| commit.events[i].payload.len())
            .and_then(|i| c.lines.get(i).copied())
            .unwrap_or(line);
        return Err(ExchangeError::Unstorable {
            line: largest,
            id: id.clone(),
            version: c.version,
            source: e,
        });
    }
    Ok(commit)
}

/// The first pass of [`import_from`]: checks every session of `source`
/// against `store`, writing nothing to it; each commit as the write pass
/// appends it goes to `spill`, if any.
fn check_pass(
    store: &LogStore,
    source: &mut dyn ImportSource,
    opts: &ImportOptions,
    progress: &mut dyn FnMut(ImportProgress),
    mut spill: Option<&mut SpillWriter>,
) -> Result<Vec<Planned>, ExchangeError> {
    let mut plan: Vec<Planned> = Vec::new();
    let mut commit_ids = SeenIds::new(store.dir());
    let mut checked = 0u64;
    let mut sessions = 0u32;
    for_each_session_commit(
        source,
        &mut |id, _| {
            let start = session_start(store, id, opts)?;
            let ordinal = sessions;
            sessions = sessions
                .checked_add(1)
                .ok_or_else(|| ExchangeError::Malformed {
                    line: 0,
                    reason: format!("more than {} sessions in one import", u32::MAX),
                })?;
            let fold = SessionFold::new(id.clone(), true).spill_in(store.dir());
            Ok((fold, start, ordinal))
        },
        &mut |(fold, start, ordinal), c| {
            let commit = check_commit(store, fold, *start, c, opts, &mut commit_ids)?;
            if let Some(w) = spill.as_deref_mut() {
                w.push(
                    *ordinal,
                    c.version,
                    c.timestamp_ms,
                    commit.commit_id,
                    &commit.events,
                )
                .map_err(|source| ExchangeError::Io {
                    context: "keeping the encoded commits in a temporary file failed".into(),
                    source,
                })?;
            }
            checked += 1;
            progress(ImportProgress::Checked { commits: checked });
            Ok(())
        },
        &mut |(mut fold, (base, done), _)| {
            fold.settle()?;
            if done > fold.commits() {
                // The store holds more of the session than the source has.
                return Err(ExchangeError::AheadOfSource {
                    id: fold.id().clone(),
                    stored: done,
                    in_source: fold.commits(),
                });
            }
            let mut planned = Planned::from_fold(fold, base)?;
            planned.done = done;
            plan.push(planned);
            Ok(())
        },
        // An entry-id refusal of an earlier commit comes first.
        &mut |(fold, _, _), e| fold.settle().err().unwrap_or(e),
    )?;
    let twice = commit_ids.finish().map_err(|source| ExchangeError::Io {
        context: "reading the file's commit ids back from a temporary file failed".into(),
        source,
    })?;
    if let Some(t) = twice {
        let (id, version) = place(&plan, t.first);
        let (other_id, other_version) = place(&plan, t.second);
        return Err(ExchangeError::CommitIdTwice {
            commit_id: t.commit_id,
            id,
            version,
            other_id,
            other_version,
        });
    }
    Ok(plan)
}

/// The session and version of the source's commit number `ordinal` (from 0).
fn place(plan: &[Planned], mut ordinal: u64) -> (SessionId, u64) {
    for p in plan {
        if ordinal < p.commits {
            return (p.id.clone(), ordinal + 1);
        }
        ordinal -= p.commits;
    }
    unreachable!("an ordinal past the source's last commit")
}

/// Checks that `sessions` can be imported into `store` (every session
/// folds; no id or commit id is taken; every commit fits the store's
/// record limit) without writing anything. Returns the stream version
/// each session continues from (0, or the version of the purge that ended
/// an earlier incarnation).
pub fn check_import(
    store: &LogStore,
    sessions: &[ImportSession],
    opts: &ImportOptions,
) -> Result<Vec<u64>, ExchangeError> {
    let plan = check_pass(store, &mut { sessions }, opts, &mut |_| {}, None)?;
    Ok(plan.iter().map(|p| p.base).collect())
}

/// Imports `sessions` into `store` (see [`import_from`]). `on_commit` is
/// called after each written commit.
pub fn import_sessions(
    store: &LogStore,
    sessions: &[ImportSession],
    opts: &ImportOptions,
    on_commit: &mut dyn FnMut(),
) -> Result<Vec<ImportedSession>, ExchangeError> {
    import_from(store, &mut { sessions }, opts, &mut |p| {
        if let ImportProgress::Written { .. } = p {
            on_commit()
        }
    })
}

/// The session the write pass is writing.
struct Writing<'p> {
    plan: &'p Planned,
    /// The settings snapshot of a long session, folded from the events in
    /// hand (so its first execute does not replay the whole stream).
    fold: Option<SettingsFold>,
    /// The version and time of the last commit written.
    last: Option<(u64, i64)>,
    /// Commits encoded and not yet appended, each with its commit time, and their
    /// versions in the file: appended together (see [`IMPORT_BATCH_COMMITS_MAX`]).
    queue: Vec<(NewCommit, Option<i64>)>,
    versions: Vec<u64>,
    queued_bytes: usize,
}

impl<'p> Writing<'p> {
    fn new(plan: &'p Planned) -> Self {
        Writing {
            plan,
            fold: (plan.commits >= SETTINGS_TAIL_COMMITS).then(SettingsFold::default),
            last: None,
            queue: Vec::new(),
            versions: Vec::new(),
            queued_bytes: 0,
        }
    }
}

/// The second pass of [`import_from`]: the check pass's commits read back
/// from `commits`, session by session in `plan`'s order: `start` as a
/// session begins, `commit` for each of its commits, `end` once they are
/// all written. The file must hold exactly what the check planned; what it
/// holds is checked as it is read, so damage fails the import before the
/// commit it would have changed.
fn write_pass<'p>(
    commits: &mut SpillReader,
    plan: &'p [Planned],
    start: &mut dyn FnMut(&'p Planned),
    commit: &mut dyn FnMut(&mut Writing<'p>, Spilled) -> Result<(), ExchangeError>,
    end: &mut dyn FnMut(Writing<'p>),
) -> Result<(), ExchangeError> {
    let failed = |p: &Planned, version: u64, reason: String| ExchangeError::ImportFailed {
        id: p.id.clone(),
        version,
        reason,
        rolled_back: false,
    };
    for (ordinal, p) in plan.iter().enumerate() {
        start(p);
        let mut w = Writing::new(p);
        for version in 1..=p.commits {
            let c = match commits.next_commit() {
                Ok(Some(c)) => c,
                Ok(None) => return Err(failed(p, version, "the encoded commits end early".into())),
                Err(e) => return Err(failed(p, version, e.to_string())),
            };
            if c.session as usize != ordinal || c.version != version {
                let reason = format!(
                    "the encoded commits hold version {} of the import's session {} here",
                    c.version,
                    u64::from(c.session) + 1
                );
                return Err(failed(p, version, reason));
            }
            commit(&mut w, c)?;
        }
        // A session's last commit ends its batch (see `import_from`).
        debug_assert!(w.queue.is_empty(), "a session ended with commits queued");
        end(w);
    }
    match commits.next_commit() {
        Ok(None) => Ok(()),
        Ok(Some(c)) => Err(ExchangeError::Io {
            context: "reading back the encoded commits".into(),
            source: std::io::Error::new(
                std::io::ErrorKind::InvalidData,
                format!("a commit past the last one checked (version {})", c.version),
            ),
        }),
        Err(source) => Err(ExchangeError::Io {
            context: "reading back the encoded commits".into(),
            source,
        }),
    }
}

/// The write pass appends a session's commits in batches of at most this many ...
const IMPORT_BATCH_COMMITS_MAX: usize = 256;
/// ... or this many bytes of event payloads (plus one commit's): one write and one
/// index publication per batch instead of per commit, with a bounded batch in hand.
const IMPORT_BATCH_BYTES_MAX: usize = 1 << 20;

/// Appends the commits `w` has queued as one batch ([`Store::append_batch`]: all
/// of them or none), reporting progress per commit written; when the batch is
/// refused or fails, the version in the file to report and why.
fn append_queued(
    engine: &spool_engine::Store,
    w: &mut Writing<'_>,
    done: &mut u64,
    total: u64,
    progress: &mut dyn FnMut(ImportProgress),
) -> Result<(), (u64, String)> {
    let versions = std::mem::take(&mut w.versions);
    let (Some(&first), Some(&last)) = (versions.first(), versions.last()) else {
        return Ok(());
    };
    w.queued_bytes = 0;
    let outcome = match engine.append_batch(std::mem::take(&mut w.queue)) {
        Ok(o) => o,
        Err(spool_engine::Error::InBatch { index, source }) => {
            let version = versions.get(index).copied().unwrap_or(first);
            // The whole chain: the reason is text, and the store's later
            // refusals (it is poisoned) are not added to it.
            return Err((version, crate::error::chain_text(&*source)));
        }
        Err(e) => {
            let e = crate::error::chain_text(&e);
            return Err((first, format!("appending versions {first}-{last}: {e}")));
        }
    };
    let (index, refused) = match outcome {
        spool_engine::BatchOutcome::Committed(infos) => {
            for info in infos {
                w.last = Some((info.version, info.timestamp_ms));
                *done += 1;
                progress(ImportProgress::Written {
                    commits: *done,
                    total,
                });
            }
            return Ok(());
        }
        spool_engine::BatchOutcome::Refused { index, outcome } => (index, outcome),
    };
    let reason = match refused {
        AppendOutcome::AlreadyCommitted(info) => format!(
            "commit id {} had already landed (stream {} version {})",
            info.commit_id, info.stream, info.version
        ),
        AppendOutcome::Conflict { actual, .. } => format!(
            "version conflict: the stream moved to {} meanwhile",
            actual.unwrap_or(0)
        ),
        AppendOutcome::Committed(_) => "refused".into(),
    };
    Err((versions.get(index).copied().unwrap_or(first), reason))
}

/// Imports every session of `source` into `store`, all or nothing (see the
/// module docs). The first pass reads the source, checks every session and
/// writes nothing to the store, only each commit encoded to a temporary
/// file; the second appends those commits under their exact version fences
/// with their original commit times, and the log is synced once at the end
/// (open the store with [`spool_engine::Durability::Buffered`] for a bulk
/// import: with `Immediate` every append is synced on its own). Both passes
/// hold one commit at a time; the first also holds, per session, a fold of
/// its entries' ids and links (see [`ImportSource`]).
pub fn import_from(
    store: &LogStore,
    source: &mut dyn ImportSource,
    opts: &ImportOptions,
    progress: &mut dyn FnMut(ImportProgress),
) -> Result<Vec<ImportedSession>, ExchangeError> {
    let io = |context: &str| {
        let context = context.to_string();
        move |source| ExchangeError::Io { context, source }
    };
    let mut spill = SpillWriter::new(store.dir());
    let plan = check_pass(store, source, opts, progress, Some(&mut spill))?;
    let mut commits = spill
        .finish()
        .map_err(io("keeping the encoded commits in a temporary file failed"))?;
    let total: u64 = plan.iter().map(|p| p.commits - p.done).sum();
    let engine = store.engine()?;
    let _deferred = engine.defer_checkpoints();
    // The last session the write pass reached, and the sessions it creates
    // (the ones a failure purges, unless the import resumes).
    let mut reached: Option<SessionId> = None;
    let mut created: Vec<SessionId> = Vec::new();
    let mut done = 0u64;
    // The failure of the second pass: which session and version, why.
    let mut failure: Option<(SessionId, u64, String)> = None;
    let res = write_pass(
        &mut commits,
        &plan,
        &mut |p| {
            reached = Some(p.id.clone());
            if p.done == 0 {
                created.push(p.id.clone());
            }
        },
        &mut |w, c| {
            let p = w.plan;
            if c.version <= p.done {
                // Written by the import this one resumes (the check found it
                // in the store, commit id for commit id).
                if let Some(fold) = w.fold.as_mut() {
                    fold.add_encoded(&c.events);
                }
                w.last = Some((p.base + c.version, c.timestamp_ms));
                return Ok(());
            }
            let commit = NewCommit {
                stream: p.id.as_str().to_string(),
                expected: ExpectedVersion::Exact(p.base + c.version - 1),
                commit_id: c.commit_id,
                events: c.events,
            };
            // No two commits share an id here: the check pass refused a file
            // that repeats one.
            if let Some(fold) = w.fold.as_mut() {
                fold.add_encoded(&commit.events);
            }
            w.queued_bytes += commit.events.iter().map(|e| e.payload.len()).sum::<usize>();
            w.queue.push((commit, Some(c.timestamp_ms)));
            w.versions.push(c.version);
            // A session's last commit ends its batch: the session's end
            // then finds every commit written.
            let full = w.queue.len() >= IMPORT_BATCH_COMMITS_MAX
                || w.queued_bytes >= IMPORT_BATCH_BYTES_MAX
                || c.version == p.commits;
            let failed = match full {
                true => append_queued(&engine, w, &mut done, total, progress).err(),
                false => None,
            };
            if let Some((version, reason)) = failed {
                failure = Some((p.id.clone(), version, reason.clone()));
                return Err(ExchangeError::ImportFailed {
                    id: p.id.clone(),
                    version,
                    reason,
                    rolled_back: false,
                });
            }
            Ok(())
        },
        &mut |w| {
            let p = w.plan;
            if let Some(fold) = w.fold {
                let (version, updated_ms) = w.last.unwrap_or((p.base, 0));
                store.write_settings_fold(fold, p.base, version, updated_ms);
            }
        },
    );
    if let Err(e) = res {
        return Err(write_pass_failed(
            store, &engine, opts, failure, e, reached, &created,
        ));
    }
    engine
        .flush()
        .map_err(|e| ExchangeError::SyncFailed(StoreError::Engine(e)))?;
    // The index's last memtables moved while checkpoints are still deferred: a
    // move finished after the guard drops would write a checkpoint of nearly
    // everything, and the close (or the next move) writes one of everything
    // again. The commits are synced already; a failure here poisons the store
    // and its next open rebuilds the index from the log.
    engine
        .flush_index()
        .map_err(|e| ExchangeError::IndexFailed(StoreError::Engine(e)))?;
    Ok(plan.iter().map(Planned::imported).collect())
}

/// `reason`, once the index's last memtables moved as after a successful import
/// (while checkpoints are still deferred, see [`import_from`]); a failure to move
/// them, which poisons the store until its next open brings the index up to date,
/// is added to it, unless it is the refusal of a store poisoned by the failure
/// `reason` names already ([`repeats`]).
fn index_moved(engine: &spool_engine::Store, reason: String) -> String {
    match engine.flush_index() {
        Ok(()) => reason,
        Err(e) if repeats(&reason, &e) => reason,
        Err(e) => format!(
            "{reason}; moving the index's last writes also failed (the next open \
             brings the index up to date): {e}"
        ),
    }
}

/// Whether `e` is the refusal of a store poisoned by the failure `reason` already
/// names (the append that failed poisoned it): adding it would print that cause
/// again.
fn repeats(reason: &str, e: &spool_engine::Error) -> bool {
    matches!(e, spool_engine::Error::Poisoned { cause } if reason.contains(cause.as_str()))
}

/// What a failed write pass of [`import_from`] leaves and reports: a resumed
/// import keeps what it wrote (synced); any other purges the sessions it created.
/// `failure` is the refusal the pass recorded, `e` the error it returned.
fn write_pass_failed(
    store: &LogStore,
    engine: &spool_engine::Store,
    opts: &ImportOptions,
    failure: Option<(SessionId, u64, String)>,
    e: ExchangeError,
    reached: Option<SessionId>,
    created: &[SessionId],
) -> ExchangeError {
    let (id, version, reason) = match (failure, e) {
        (Some(f), _) => f,
        (
            None,
            ExchangeError::ImportFailed {
                id,
                version,
                reason,
                ..
            },
        ) => (id, version, reason),
        (None, e) => match reached {
            Some(last) => (last, 0, e.to_string()),
            // The second pass failed before it reached a session.
            None => return e,
        },
    };
    if opts.resume {
        // A resumed import keeps what it wrote, as a crash would leave it,
        // so that running it again continues: purged commits would keep
        // their ids and refuse the next run. Synced, so that a crash
        // before that run loses none of it.
        let reason = match engine.flush() {
            Ok(()) => reason,
            Err(e) if repeats(&reason, &e) => reason,
            Err(e) => format!("{reason}; syncing what it wrote also failed: {e}"),
        };
        let reason = index_moved(engine, reason);
        return ExchangeError::ResumeFailed {
            id,
            version,
            reason,
        };
    }
    // Purge the sessions this import created, so no half-imported session
    // stays visible (one it never reached is not there to purge).
    let rolled_back = created
        .iter()
        .all(|id| store.delete(id).is_ok() && matches!(store.header(id), Ok(None)))
        && engine.flush().is_ok();
    let reason = index_moved(engine, reason);
    ExchangeError::ImportFailed {
        id,
        version,
        reason,
        rolled_back,
    }
}

#[cfg(test)]
mod write_pass_tests {
    use super::super::spill::{SpillWriter, Spilled};
    use super::*;
    use crate::session::AgentDefinition;
    use crate::store::{LogStoreOptions, SessionStore};

    fn open(dir: &std::path::Path) -> LogStore {
        let opts = LogStoreOptions {
            durability: spool_engine::Durability::Buffered,
            ..Default::default()
        };
        LogStore::open(dir, opts).unwrap()
    }

    fn sessions() -> Vec<ImportSession> {
        let a = tempfile::tempdir().unwrap();
        let sa = open(a.path());
        let mut w = ExportWriter::new(Vec::new()).unwrap();
        for _ in 0..2 {
            let def = AgentDefinition::new("a", "d", "p");
            let mut s = sa.create(AgentSession::new(def, None)).unwrap();
            for i in 0..3 {
                s.write_metadata("k", serde_json::json!(i)).unwrap();
                s = sa.save(s).unwrap();
            }
            w.session(&sa, s.id()).unwrap();
        }
        read_export(&w.finish().unwrap().0[..]).unwrap()
    }

    fn run(plan: &[Planned], commits: &[Spilled]) -> (usize, Result<(), ExchangeError>) {
        let mut w = SpillWriter::new(&std::env::temp_dir());
        for c in commits {
            w.push(c.session, c.version, c.timestamp_ms, c.commit_id, &c.events)
                .unwrap();
        }
        let mut r = w.finish().unwrap();
        let mut n = 0;
        let res = write_pass(
            &mut r,
            plan,
            &mut |_| {},
            &mut |_, _| {
                n += 1;
                Ok(())
            },
            &mut |_| {},
        );
        (n, res)
    }

    /// The write pass hands on exactly the planned commits; a temporary file
    /// holding another session's commit, versions out of order, a commit
    /// too few or too many fails before the first commit that differs.
    #[test]
    fn the_write_pass_refuses_commits_other_than_planned() {
        let sessions = sessions();
        let d = tempfile::tempdir().unwrap();
        let store = open(d.path());
        let mut w = SpillWriter::new(store.dir());
        let opts = ImportOptions::default();
        let plan = check_pass(
            &store,
            &mut { &sessions[..] },
            &opts,
            &mut |_| {},
            Some(&mut w),
        )
        .unwrap();
        let mut r = w.finish().unwrap();
        let mut good = Vec::new();
        while let Some(c) = r.next_commit().unwrap() {
            good.push(c);
        }
        let total = good.len();
        let k = plan[0].commits as usize;
        assert_eq!(total, k + plan[1].commits as usize);
        let (n, res) = run(&plan, &good);
        assert_eq!(n, total);
        assert!(res.is_ok(), "{res:?}");
        let mut other_session = good.clone();
        other_session[k].session = 0;
        let mut swapped = good.clone();
        swapped.swap(k + 1, k + 2);
        let mut gap = good.clone();
        gap.remove(k - 1);
        let mut extra = good.clone();
        extra.push(good[total - 1].clone());
        let cases: [(&str, &[Spilled], usize); 5] = [
            ("another session's commit", &other_session, k),
            ("versions swapped", &swapped, k + 1),
            ("a commit missing mid-file", &gap, k - 1),
            ("a commit missing at the end", &good[..total - 1], total - 1),
            ("a commit too many", &extra, total),
        ];
        for (what, commits, handed) in cases {
            let (n, res) = run(&plan, commits);
            assert_eq!(n, handed, "{what}");
            assert!(res.is_err(), "{what}: accepted");
        }
    }
}
