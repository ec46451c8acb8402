//! Importing: the sources an import reads, the check pass that writes
//! nothing, and the write pass.

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
}

impl ImportOptions {
    pub fn fresh_commit_ids(mut self, yes: bool) -> Self {
        self.fresh_commit_ids = yes;
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

/// Sessions to import, which an import reads twice: once to check them
/// all, once to write them. Both passes must yield the same sessions in
/// the same order (a source read from a file re-reads the file).
pub trait ImportSource {
    /// Calls `f` on every session, in order; stops at `f`'s first error.
    /// Sessions are lent, not given: a source that holds them (a slice)
    /// never copies one.
    fn for_each_session(
        &mut self,
        f: &mut dyn FnMut(&ImportSession) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError>;
}

impl ImportSource for &[ImportSession] {
    fn for_each_session(
        &mut self,
        f: &mut dyn FnMut(&ImportSession) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError> {
        self.iter().try_for_each(f)
    }
}

/// A `spool-export` file read from its path, one session at a time.
pub struct ExportFile {
    path: std::path::PathBuf,
}

impl ExportFile {
    pub fn new(path: impl Into<std::path::PathBuf>) -> Self {
        ExportFile { path: path.into() }
    }
}

impl ImportSource for ExportFile {
    fn for_each_session(
        &mut self,
        f: &mut dyn FnMut(&ImportSession) -> Result<(), ExchangeError>,
    ) -> Result<(), ExchangeError> {
        let file = std::fs::File::open(&self.path).map_err(|source| ExchangeError::Io {
            context: format!("opening {}", self.path.display()),
            source,
        })?;
        let mut reader = ExportReader::new(std::io::BufReader::with_capacity(1 << 16, file))?;
        while let Some(s) = reader.next_session()? {
            f(&s)?;
        }
        Ok(())
    }
}

/// What the first pass learnt of one session.
struct Planned {
    id: SessionId,
    /// The stream version the session continues from.
    base: u64,
    commits: u64,
    events: u64,
    entries: u64,
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

/// The store-independent checks of one session of an import: its id is
/// not repeated in the same import (`ids`) and its events fold
/// ([`ImportSession::validate`]). Returns the folded session.
pub(crate) fn check_shape(
    s: &ImportSession,
    ids: &mut HashSet<SessionId>,
) -> Result<AgentSession, ExchangeError> {
    let line = s
        .commits
        .first()
        .and_then(|c| c.lines.first())
        .copied()
        .unwrap_or(0);
    if !ids.insert(s.id.clone()) {
        return Err(ExchangeError::Malformed {
            line,
            reason: format!("session {} appears twice", s.id),
        });
    }
    s.validate()
}

/// Checks one session against `store` and the sessions before it in the
/// same import, writing nothing.
fn check_session(
    store: &LogStore,
    s: &ImportSession,
    opts: &ImportOptions,
    ids: &mut HashSet<SessionId>,
    commit_ids: &mut HashSet<Uuid>,
) -> Result<Planned, ExchangeError> {
    let folded = check_shape(s, ids)?;
    if store.header(&s.id)?.is_some() {
        return Err(ExchangeError::SessionExists { id: s.id.clone() });
    }
    let engine = store.engine()?;
    let base = match engine.stream_version(s.id.as_str()).map_err(engine_err)? {
        None => 0,
        Some(head) => {
            // A stream without a session header is either a purged
            // session (its last commit is the purge marker) or some
            // other stream that must not be mixed with a session.
            let last = engine
                .read_stream(s.id.as_str(), head, 1)
                .map_err(engine_err)?;
            let purged = last
                .first()
                .is_some_and(|c| c.events.iter().any(|e| e.kind == PURGE_EVENT_KIND));
            if !purged {
                return Err(ExchangeError::StreamExists { id: s.id.clone() });
            }
            head
        }
    };
    for c in &s.commits {
        if !opts.fresh_commit_ids {
            let taken = !commit_ids.insert(c.commit_id)
                || engine
                    .commit_by_id(c.commit_id)
                    .map_err(engine_err)?
                    .is_some();
            if taken {
                return Err(ExchangeError::CommitIdTaken {
                    id: s.id.clone(),
                    version: c.version,
                    commit_id: c.commit_id,
                });
            }
        }
        // Every commit must fit the store's record limit before the first
        // write, so an oversized entry writes nothing.
        let line = c.lines.first().copied().unwrap_or(0);
        let commit =
            new_commit(&s.id, c, base, opts).map_err(|reason| ExchangeError::Malformed {
                line,
                reason: format!("session {} version {}: {reason}", s.id, c.version),
            })?;
        if let Err(e) = engine.check_commit(&commit) {
            // Name the line of the commit's largest event: the likely cause.
            let largest = (0..commit.events.len())
                .max_by_key(|&i| commit.events[i].payload.len())
                .and_then(|i| c.lines.get(i).copied())
                .unwrap_or(line);
            return Err(ExchangeError::Unstorable {
                line: largest,
                id: s.id.clone(),
                version: c.version,
                source: e,
            });
        }
    }
    Ok(Planned {
        id: s.id.clone(),
        base,
        commits: s.commits.len() as u64,
        events: s.event_count(),
        entries: folded.state().transcript.len() as u64,
    })
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
    let mut ids = HashSet::new();
    let mut commit_ids = HashSet::new();
    sessions
        .iter()
        .map(|s| check_session(store, s, opts, &mut ids, &mut commit_ids).map(|p| p.base))
        .collect()
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

/// Imports every session of `source` into `store`, all or nothing (see the
/// module docs). The first pass checks every session and writes nothing;
/// the second appends each commit under its exact version fence with its
/// original commit time, and the log is synced once at the end (open the
/// store with [`spool_engine::Durability::Buffered`] for a bulk import:
/// with `Immediate` every append is synced on its own).
pub fn import_from(
    store: &LogStore,
    source: &mut dyn ImportSource,
    opts: &ImportOptions,
    progress: &mut dyn FnMut(ImportProgress),
) -> Result<Vec<ImportedSession>, ExchangeError> {
    let mut plan: Vec<Planned> = Vec::new();
    {
        let mut ids = HashSet::new();
        let mut commit_ids = HashSet::new();
        let mut checked = 0u64;
        source.for_each_session(&mut |s| {
            plan.push(check_session(store, s, opts, &mut ids, &mut commit_ids)?);
            checked += s.commits.len() as u64;
            progress(ImportProgress::Checked { commits: checked });
            Ok(())
        })?;
    }
    let total: u64 = plan.iter().map(|p| p.commits).sum();
    let engine = store.engine()?;
    let mut written: Vec<SessionId> = Vec::new();
    let mut done = 0u64;
    let mut next = 0usize;
    // The failure of the second pass: which session and version, why.
    let mut failure: Option<(SessionId, u64, String)> = None;
    let res = source.for_each_session(&mut |s| {
        let fail = |version: u64, reason: String| ExchangeError::ImportFailed {
            id: s.id.clone(),
            version,
            reason,
            rolled_back: false,
        };
        let p = match plan.get(next) {
            Some(p) if p.id == s.id && p.commits == s.commits.len() as u64 => p,
            _ => {
                return Err(fail(
                    0,
                    "the source changed between the check and the write".into(),
                ))
            }
        };
        next += 1;
        written.push(s.id.clone());
        // A long session gets its settings snapshot from the events in
        // hand, so its first execute does not replay the whole stream.
        let snapshot = s.commits.len() as u64 >= SETTINGS_TAIL_COMMITS;
        let mut fold = SettingsFold::default();
        let mut last = None;
        for c in &s.commits {
            let outcome = new_commit(&s.id, c, p.base, opts).and_then(|commit| {
                engine
                    .append_at(commit, c.timestamp_ms)
                    .map_err(|e| e.to_string())
            });
            let reason = match outcome {
                Ok(AppendOutcome::Committed(info)) => {
                    if snapshot {
                        fold.add(&c.events);
                        last = Some((info.version, info.timestamp_ms));
                    }
                    None
                }
                Ok(AppendOutcome::AlreadyCommitted(info)) => Some(format!(
                    "commit id {} had already landed (stream {} version {})",
                    info.commit_id, info.stream, info.version
                )),
                Ok(AppendOutcome::Conflict { actual, .. }) => Some(format!(
                    "version conflict: the stream moved to {} meanwhile",
                    actual.unwrap_or(0)
                )),
                Err(e) => Some(e),
            };
            if let Some(reason) = reason {
                failure = Some((s.id.clone(), c.version, reason.clone()));
                return Err(fail(c.version, reason));
            }
            done += 1;
            progress(ImportProgress::Written {
                commits: done,
                total,
            });
        }
        if let Some((version, updated_ms)) = last {
            store.write_settings_fold(fold, p.base, version, updated_ms);
        }
        Ok(())
    });
    if let Err(e) = res {
        let Some(last) = written.last().cloned() else {
            // The second pass failed before its first write.
            return Err(e);
        };
        // Purge what this import wrote, so no half-imported session stays
        // visible.
        let rolled_back = written
            .iter()
            .all(|id| store.delete(id).is_ok() && matches!(store.header(id), Ok(None)))
            && engine.flush().is_ok();
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
            (None, e) => (last, 0, e.to_string()),
        };
        return Err(ExchangeError::ImportFailed {
            id,
            version,
            reason,
            rolled_back,
        });
    }
    engine
        .flush()
        .map_err(|e| ExchangeError::SyncFailed(StoreError::Engine(e)))?;
    Ok(plan
        .into_iter()
        .map(|p| ImportedSession {
            id: p.id,
            version: p.commits,
            events: p.events,
            entries: p.entries,
        })
        .collect())
}
