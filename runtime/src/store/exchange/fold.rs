//! The check of one session to import, commit by commit: its shape and the
//! fold of its events, optionally without the entries' content.

use std::path::PathBuf;

use super::ledger::{Check, Denied, IdChecks, CHUNK_BYTES_MAX};
use super::*;
use crate::session::{check_rewrite_with, FoldError, Need};
use crate::transcript::{Entry, EntryId, EntryKind, TranscriptError};

/// Folds one session's commits as they come, checking their shape: dense
/// versions from 1, 1..=[`EVENTS_PER_COMMIT_MAX`] events per commit, the
/// first event `created` with the session's id.
///
/// A *light* fold keeps the transcript as the set of its entry ids and its
/// leaf ([`Ids`]) and folds everything else as the full fold does. The
/// fold's transcript checks read nothing more (ids unique, parents and
/// leaves present, rewrites naming entries that exist), so a light fold
/// accepts and refuses exactly what a full one does, with the same errors,
/// and counts the same entries, while it holds no entry: an import checks a
/// session in about 20 bytes per live entry
/// ([`IdIndex`](crate::transcript::id_index::IdIndex)) up to
/// [`HELD_IDS_BYTES_MAX`], and a longer one with its ids' questions kept in
/// a temporary file ([`Ledger`](super::ledger::Ledger)) and answered at its
/// end, whatever its text.
pub(crate) struct SessionFold {
    id: SessionId,
    /// The light fold's transcript (`None`: a full fold).
    ids: Option<Ids>,
    light: bool,
    held_bytes_max: usize,
    /// A ledger's chunk ([`CHUNK_BYTES_MAX`] but in tests).
    chunk_bytes_max: usize,
    spill_dir: Option<PathBuf>,
    commits: u64,
    events: u64,
    last_ts: i64,
    session: Option<AgentSession>,
}

impl SessionFold {
    pub(crate) fn new(id: SessionId, light: bool) -> Self {
        let fold = SessionFold {
            id,
            ids: None,
            light,
            held_bytes_max: HELD_IDS_BYTES_MAX,
            chunk_bytes_max: CHUNK_BYTES_MAX,
            spill_dir: None,
            commits: 0,
            events: 0,
            last_ts: 0,
            session: None,
        };
        #[cfg(test)]
        if let Some((held, chunk)) = HOLDING.get() {
            return fold.holding(held, chunk);
        }
        fold
    }

    /// Where a long session's ids go (the system's temporary directory when
    /// this one refuses them).
    pub(crate) fn spill_in(mut self, dir: &std::path::Path) -> Self {
        self.spill_dir = Some(dir.to_path_buf());
        self
    }

    /// A light fold that keeps at most `held_bytes` of ids in memory, and
    /// a ledger's chunks of `chunk_bytes`.
    #[cfg(test)]
    pub(crate) fn holding(mut self, held_bytes: usize, chunk_bytes: usize) -> Self {
        self.held_bytes_max = held_bytes;
        self.chunk_bytes_max = chunk_bytes;
        self
    }

    pub(crate) fn id(&self) -> &SessionId {
        &self.id
    }

    /// Commits folded so far (the session's version).
    pub(crate) fn commits(&self) -> u64 {
        self.commits
    }

    /// Events folded so far.
    pub(crate) fn events(&self) -> u64 {
        self.events
    }

    /// Checks and folds the next commit; errors name the source line.
    pub(crate) fn commit(&mut self, c: &ImportCommit) -> Result<(), ExchangeError> {
        match self.fold_commit(c) {
            Ok(()) => Ok(()),
            Err(e) => Err(self.settle().err().unwrap_or(e)),
        }
    }

    /// The refusal a long session's deferred id checks meet first, if any:
    /// an error the fold met later, or any error after the fold, gives way
    /// to it (an immediate fold would have stopped there).
    pub(crate) fn settle(&mut self) -> Result<(), ExchangeError> {
        let Some(ids) = self.ids.as_mut() else {
            return Ok(());
        };
        match ids.settle() {
            Ok(None) => Ok(()),
            Ok(Some((version, line, e))) => Err(ExchangeError::Malformed {
                line,
                reason: format!("session {} version {version}: {e}", self.id),
            }),
            Err(source) => Err(ids_io(source)),
        }
    }

    fn fold_commit(&mut self, c: &ImportCommit) -> Result<(), ExchangeError> {
        let malformed = |line: u64, reason: String| ExchangeError::Malformed { line, reason };
        let first_line = c.lines.first().copied().unwrap_or(0);
        let want = self.commits + 1;
        if c.version != want {
            return Err(malformed(
                first_line,
                format!(
                    "session {}: expected version {want}, found {}",
                    self.id, c.version
                ),
            ));
        }
        if c.events.is_empty() || c.events.len() > EVENTS_PER_COMMIT_MAX {
            return Err(malformed(
                first_line,
                format!(
                    "session {} version {}: a commit carries 1..={EVENTS_PER_COMMIT_MAX} events, got {}",
                    self.id,
                    c.version,
                    c.events.len()
                ),
            ));
        }
        for (j, ev) in c.events.iter().enumerate() {
            let line = c.lines.get(j).copied().unwrap_or(0);
            let folded = match self.session.as_mut() {
                None => self.start(ev),
                Some(s) => match self.ids.as_mut() {
                    Some(ids) => {
                        ids.at = (c.version, line);
                        ids.fold(s, ev)
                    }
                    None => s.apply(ev).map_err(Refusal::Fold),
                },
            };
            folded.map_err(|e| {
                if let Refusal::Io(source) = e {
                    return ids_io(source);
                }
                let reason = match self.session {
                    None => format!("session {}: {e}", self.id),
                    Some(_) => format!("session {} version {}: {e}", self.id, c.version),
                };
                malformed(line, reason)
            })?;
            if let Some(s) = &self.session {
                if s.id() != &self.id {
                    return Err(malformed(
                        line,
                        format!(
                            "the `created` event of session {} names session {}",
                            self.id,
                            s.id()
                        ),
                    ));
                }
            }
        }
        self.commits = c.version;
        self.events += c.events.len() as u64;
        self.last_ts = c.timestamp_ms;
        Ok(())
    }

    /// The session from its first event, which must be `created`; a light
    /// fold takes the created transcript's ids and leaves the session's
    /// transcript empty.
    fn start(&mut self, ev: &SessionEvent) -> Result<(), Refusal> {
        let session = match ev {
            SessionEvent::Created {
                id,
                parent_id,
                agent_name,
                label,
                created_at_ms,
                definition,
                state,
            } if self.light => {
                let mut state = state.clone();
                let transcript = std::mem::take(&mut state.transcript);
                let mut ids = Ids::new(
                    self.held_bytes_max,
                    self.chunk_bytes_max,
                    self.spill_dir.clone(),
                );
                ids.replace(transcript.entries())?;
                ids.leaf = transcript.leaf().cloned();
                self.ids = Some(ids);
                AgentSession::replay(std::iter::once(&SessionEvent::Created {
                    id: id.clone(),
                    parent_id: parent_id.clone(),
                    agent_name: agent_name.clone(),
                    label: label.clone(),
                    created_at_ms: *created_at_ms,
                    definition: definition.clone(),
                    state,
                }))?
            }
            _ => AgentSession::replay(std::iter::once(ev))?,
        };
        self.session = Some(session);
        Ok(())
    }

    /// Entries in the folded transcript.
    pub(crate) fn entries(&self) -> u64 {
        match (&self.ids, &self.session) {
            (Some(ids), _) => ids.len,
            (None, Some(s)) => s.state().transcript.len() as u64,
            (None, None) => 0,
        }
    }

    /// The folded session at its last version (a light fold's transcript
    /// is empty: see [`SessionFold::entries`]).
    pub(crate) fn finish(mut self) -> Result<AgentSession, ExchangeError> {
        self.settle()?;
        let malformed = |reason: String| ExchangeError::Malformed { line: 0, reason };
        if self.commits == 0 {
            return Err(malformed(format!("session {} has no commits", self.id)));
        }
        self.session
            .map(|s| s.reconstitute(self.commits, self.last_ts))
            .ok_or_else(|| malformed(format!("session {} has no events", self.id)))
    }
}

/// Why a commit does not fold: the fold's own error, more entry ids than a
/// light fold holds ([`IdIndex`](crate::transcript::id_index::IdIndex)'s limits), or the temporary file of a
/// long session's ids failing.
#[derive(Debug)]
enum Refusal {
    Fold(FoldError),
    Limit(String),
    Io(std::io::Error),
}

impl From<FoldError> for Refusal {
    fn from(e: FoldError) -> Self {
        Refusal::Fold(e)
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::Fold(e) => e.fmt(f),
            Refusal::Limit(reason) => f.write_str(reason),
            Refusal::Io(e) => e.fmt(f),
        }
    }
}

/// A refusal of [`IdChecks`] as the fold's, `id` the one it names.
fn denied(d: Denied, id: Option<&EntryId>) -> Refusal {
    match (d, id) {
        (Denied::Check(check), Some(id)) => refusal(check, id).into(),
        (Denied::Check(check), None) => Refusal::Limit(format!("an id refused as {check:?}")),
        (Denied::Limit(reason), _) => Refusal::Limit(reason),
        (Denied::Io(e), _) => Refusal::Io(e),
    }
}

/// The fold's error for `check` refusing `id`, as an immediate check
/// reports it.
fn refusal(check: Check, id: &EntryId) -> FoldError {
    let transcript = |event, source| FoldError::Transcript { event, source };
    let rewrite = |need: Need| FoldError::BadRewrite {
        reason: need.refusal(id),
    };
    match check {
        Check::Appended => transcript(
            "entry_appended",
            TranscriptError::DuplicateEntry(id.clone()),
        ),
        Check::Parent => transcript("entry_appended", TranscriptError::UnknownEntry(id.clone())),
        Check::Leaf => transcript("leaf_moved", TranscriptError::UnknownEntry(id.clone())),
        Check::Named => rewrite(Need::Named),
        Check::NewParent => rewrite(Need::NewParent),
        Check::NewLeaf => rewrite(Need::NewLeaf),
    }
}

#[cfg(test)]
thread_local! {
    /// What every light fold this thread makes holds (see
    /// [`SessionFold::holding`]), so a test reaches the ledger through an
    /// import.
    pub(crate) static HOLDING: std::cell::Cell<Option<(usize, usize)>> =
        const { std::cell::Cell::new(None) };
}

/// How much of a light fold's ids are held in memory before a ledger
/// takes them over: [`IdIndex`](crate::transcript::id_index::IdIndex)'s
/// heap (its growth can double it once before the ledger takes over).
const HELD_IDS_BYTES_MAX: usize = 4 << 20;

/// A transcript as a light fold keeps it: which ids it holds (the first of
/// a repeated id, as [`Transcript`](crate::transcript::Transcript)'s
/// lookups) as [`IdChecks`] (held in memory up to a budget, then on disk),
/// how many entries, the leaf.
struct Ids {
    ids: IdChecks,
    len: u64,
    leaf: Option<EntryId>,
    /// The version and source line of the event being folded.
    at: (u64, u64),
}

impl Ids {
    fn new(held_bytes_max: usize, chunk_bytes_max: usize, spill_dir: Option<PathBuf>) -> Ids {
        Ids {
            ids: IdChecks::new(held_bytes_max, chunk_bytes_max, spill_dir),
            len: 0,
            leaf: None,
            at: (0, 0),
        }
    }

    /// Every id gone (a whole rewrite, a clear).
    fn reset(&mut self) -> Result<(), Refusal> {
        self.ids.reset().map_err(|d| denied(d, None))?;
        self.len = 0;
        self.leaf = None;
        Ok(())
    }

    /// Makes `entries` the ids (a repeated id once), their count, no leaf.
    fn replace(&mut self, entries: &[Entry]) -> Result<(), Refusal> {
        self.reset()?;
        for e in entries {
            self.ids
                .define(e.id.as_str())
                .map_err(|d| denied(d, None))?;
        }
        self.len = entries.len() as u64;
        Ok(())
    }

    /// Refused as `check` unless `id` is live (now, or when the ledger
    /// answers).
    fn require(&mut self, id: &EntryId, check: Check) -> Result<(), Refusal> {
        self.ids
            .require(id.as_str(), check, self.at)
            .map_err(|d| denied(d, Some(id)))
    }

    /// The refusal the deferred checks met first, if any: the version and
    /// source line of its event, and the error.
    fn settle(&mut self) -> Result<Option<(u64, u64, FoldError)>, std::io::Error> {
        let Some(r) = self.ids.settle()? else {
            return Ok(None);
        };
        let id = EntryId::parse(&r.id).map_err(|e| {
            std::io::Error::other(format!(
                "an entry id read back from the temporary file does not parse: {e}"
            ))
        })?;
        Ok(Some((r.version, r.line, refusal(r.check, &id))))
    }

    /// Folds `ev` into `s` as [`AgentSession::apply`] does, with the
    /// transcript's part done here: the same checks, in the same order,
    /// with the same errors.
    fn fold(&mut self, s: &mut AgentSession, ev: &SessionEvent) -> Result<(), Refusal> {
        match ev {
            SessionEvent::EntryAppended { entry } => {
                let id = &entry.id;
                self.ids
                    .absent(id.as_str(), self.at)
                    .map_err(|d| denied(d, Some(id)))?;
                if let Some(p) = &entry.parent_id {
                    self.require(p, Check::Parent)?;
                }
                self.ids
                    .define_absent(id.as_str())
                    .map_err(|d| denied(d, Some(id)))?;
                self.len += 1;
                self.leaf = Some(entry.id.clone());
                Ok(())
            }
            SessionEvent::LeafMoved { leaf } => {
                if let Some(l) = leaf {
                    self.require(l, Check::Leaf)?;
                }
                self.leaf = leaf.clone();
                Ok(())
            }
            SessionEvent::HistoryRewritten {
                generation,
                entries,
                leaf,
            } => {
                // The checks are the fold's own: run them on the ids alone.
                s.apply(&SessionEvent::HistoryRewritten {
                    generation: *generation,
                    entries: entries.iter().map(id_only).collect(),
                    leaf: leaf.clone(),
                })?;
                s.apply(&emptied(*generation))?;
                self.replace(entries)?;
                self.leaf = leaf.clone();
                Ok(())
            }
            SessionEvent::TranscriptRewritten {
                generation,
                written,
                reparented,
                removed,
                leaf,
            } => {
                self.rewrite(written, reparented, removed, leaf.as_ref())?;
                Ok(s.apply(&emptied(*generation))?)
            }
            SessionEvent::StateCleared => {
                self.reset()?;
                Ok(s.apply(ev)?)
            }
            other => Ok(s.apply(other)?),
        }
    }

    /// [`Transcript::apply_rewrite`](crate::transcript::Transcript::apply_rewrite)'s checks and effect on the ids.
    fn rewrite(
        &mut self,
        written: &[Entry],
        reparented: &[(EntryId, Option<EntryId>)],
        removed: &[EntryId],
        leaf: Option<&EntryId>,
    ) -> Result<(), Refusal> {
        // A question the ledger notes (or a temporary file's failure) is
        // kept aside, so the checks within the rewrite see a plain answer.
        let mut failed: Option<Refusal> = None;
        let checked = check_rewrite_with(
            |id, need| {
                let check = match need {
                    Need::Named => Check::Named,
                    Need::NewParent => Check::NewParent,
                    Need::NewLeaf => Check::NewLeaf,
                };
                match self.require(id, check) {
                    Ok(()) => Ok(()),
                    Err(e) => {
                        failed = Some(e);
                        Err(String::new())
                    }
                }
            },
            written,
            reparented,
            removed,
            leaf,
        );
        if let Some(e) = failed {
            return Err(e);
        }
        checked.map_err(|reason| FoldError::BadRewrite { reason })?;
        for id in removed {
            self.ids
                .remove(id.as_str())
                .map_err(|d| denied(d, Some(id)))?;
        }
        self.len = self.len.saturating_sub(removed.len() as u64);
        self.leaf = leaf.cloned();
        Ok(())
    }
}

fn ids_io(source: std::io::Error) -> ExchangeError {
    ExchangeError::Io {
        context: "keeping a long session's entry ids in a temporary file failed".into(),
        source,
    }
}

/// `e` as its id and parent alone (what the fold's rewrite checks read).
fn id_only(e: &Entry) -> Entry {
    Entry {
        id: e.id.clone(),
        parent_id: e.parent_id.clone(),
        timestamp_ms: e.timestamp_ms,
        kind: EntryKind::Reset,
    }
}

/// A rewrite to generation `generation` of an empty transcript: how a
/// light fold moves the session's generation (its transcript stays empty).
fn emptied(generation: u64) -> SessionEvent {
    SessionEvent::HistoryRewritten {
        generation,
        entries: Vec::new(),
        leaf: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{AgentDefinition, AgentState};
    use crate::transcript::{ContentBlock, EntryId, Message};

    use crate::test_rng::Rng;

    fn text_entry(id: &str, parent: Option<EntryId>, text: String) -> Entry {
        Entry {
            id: EntryId::parse(id).unwrap(),
            parent_id: parent,
            timestamp_ms: 1,
            kind: EntryKind::Message {
                message: Message::User {
                    content: vec![ContentBlock::text(text)],
                },
            },
        }
    }

    /// A random history: appends, leaf moves, delta and whole rewrites.
    /// Most ids named are ones appended before; a few are repeated or
    /// unknown, so both outcomes happen.
    fn history(rng: &mut Rng, id: &SessionId, events: usize) -> Vec<SessionEvent> {
        let mut known: Vec<EntryId> = Vec::new();
        let mut fresh = 0u64;
        let mut pick = |rng: &mut Rng, known: &[EntryId]| -> EntryId {
            if known.is_empty() || rng.below(12) == 0 {
                fresh += 1;
                EntryId::parse(&format!("x{fresh}")).unwrap()
            } else {
                known[rng.below(known.len() as u64) as usize].clone()
            }
        };
        let mut out = vec![SessionEvent::Created {
            id: id.clone(),
            parent_id: None,
            agent_name: "a".into(),
            label: "l".into(),
            created_at_ms: 1,
            definition: Box::new(AgentDefinition::new("a", "d", "p")),
            state: Box::new(AgentState::new()),
        }];
        for i in 0..events {
            let ev = match rng.below(10) {
                0..=5 => {
                    let id = if rng.below(16) == 0 && !known.is_empty() {
                        pick(rng, &known)
                    } else {
                        EntryId::parse(&format!("e{i}")).unwrap()
                    };
                    let parent = match rng.below(40) {
                        0 => Some(id.clone()),
                        _ => (!known.is_empty() && rng.below(5) > 0).then(|| pick(rng, &known)),
                    };
                    known.push(id.clone());
                    SessionEvent::EntryAppended {
                        entry: text_entry(id.as_str(), parent, format!("text {i}")),
                    }
                }
                6 => SessionEvent::LeafMoved {
                    leaf: (rng.below(4) > 0).then(|| pick(rng, &known)),
                },
                7 => SessionEvent::TranscriptRewritten {
                    generation: i as u64,
                    written: (0..rng.below(2))
                        .map(|_| {
                            let id = pick(rng, &known);
                            text_entry(id.as_str(), None, "w".repeat(i))
                        })
                        .collect(),
                    reparented: (0..rng.below(2))
                        .map(|_| (pick(rng, &known), None))
                        .collect(),
                    removed: (0..rng.below(2)).map(|_| pick(rng, &known)).collect(),
                    leaf: None,
                },
                8 => {
                    let entries: Vec<Entry> = known
                        .iter()
                        .filter(|_| rng.below(8) > 0)
                        .map(|id| text_entry(id.as_str(), None, "h".into()))
                        .collect();
                    let leaf = entries.last().map(|e| e.id.clone());
                    known = entries.iter().map(|e| e.id.clone()).collect();
                    SessionEvent::HistoryRewritten {
                        generation: i as u64,
                        entries,
                        leaf,
                    }
                }
                _ => SessionEvent::Touched,
            };
            out.push(ev);
        }
        out
    }

    /// What a fold of `events` (a commit each) ends with: entries, leaf,
    /// generation and version; or its error.
    type Outcome = Result<(u64, Option<EntryId>, u64, u64), String>;

    /// How a fold is made: full, or light holding some bytes of ids (and a
    /// ledger's chunk) — the default, a ledger from the first id with a run
    /// per record, one taking over after a few ids, and one after more.
    const FOLDS: [Option<(usize, usize)>; 5] = [
        None,
        Some((HELD_IDS_BYTES_MAX, CHUNK_BYTES_MAX)),
        Some((0, 1)),
        Some((256, 200)),
        Some((2048, 4096)),
    ];

    fn fold_all(id: &SessionId, events: &[SessionEvent], how: Option<(usize, usize)>) -> Outcome {
        let dir = tempfile::tempdir().unwrap();
        let mut f = match how {
            None => SessionFold::new(id.clone(), false),
            Some((held, chunk)) => SessionFold::new(id.clone(), true)
                .holding(held, chunk)
                .spill_in(dir.path()),
        };
        for (i, ev) in events.iter().enumerate() {
            let c = ImportCommit {
                version: i as u64 + 1,
                commit_id: spool_engine::Uuid::from_u128(i as u128 + 1),
                timestamp_ms: i as i64,
                events: vec![ev.clone()],
                lines: vec![i as u64 + 1],
            };
            f.commit(&c).map_err(|e| e.to_string())?;
        }
        let entries = f.entries();
        let leaf = match &f.ids {
            Some(ids) => ids.leaf.clone(),
            None => f
                .session
                .as_ref()
                .and_then(|s| s.state().transcript.leaf().cloned()),
        };
        let s = f.finish().map_err(|e| e.to_string())?;
        // A ledger's temporary file is unnamed: nothing is left behind.
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
        Ok((entries, leaf, s.state().generation, s.info().version))
    }

    /// Folds `events` fully and in each light way; all must end alike.
    /// Whether they accepted.
    fn decide_alike(id: &SessionId, events: &[SessionEvent], seed: u64) -> bool {
        let full = fold_all(id, events, None);
        for how in &FOLDS[1..] {
            match (&full, fold_all(id, events, *how)) {
                (Ok(full), Ok(light)) => assert_eq!(full, &light, "seed {seed}, {how:?}"),
                (Err(full), Err(light)) => assert_eq!(full, &light, "seed {seed}, {how:?}"),
                (full, light) => panic!(
                    "seed {seed}, {how:?}: full {:?}, light {:?}",
                    full.as_ref().map(|_| ()),
                    light.map(|_| ())
                ),
            }
        }
        full.is_ok()
    }

    /// A light fold accepts and refuses exactly what a full fold does, with
    /// the same error, and ends with the same number of entries, leaf,
    /// generation and version.
    #[test]
    fn a_light_fold_decides_as_a_full_fold() {
        let id = SessionId::parse("s-light").unwrap();
        let (mut accepted, mut refused) = (0, 0);
        for seed in 1..=400u64 {
            let mut rng = Rng::seeded(seed);
            let n = 1 + rng.below(12) as usize;
            let events = history(&mut rng, &id, n);
            match decide_alike(&id, &events, seed) {
                true => accepted += 1,
                false => refused += 1,
            }
        }
        // Both outcomes are exercised.
        assert!(
            accepted > 20 && refused > 20,
            "{accepted} accepted, {refused} refused"
        );
    }

    /// A long valid history: appends under live entries, leaf moves, delta
    /// rewrites removing up to three entries, whole rewrites keeping most,
    /// and appends that reuse a removed id. Enough ids, removals and re-adds
    /// to grow and rebuild a light fold's [`IdIndex`](crate::transcript::id_index::IdIndex) many times.
    fn long_history(rng: &mut Rng, id: &SessionId, events: usize) -> Vec<SessionEvent> {
        let mut live: Vec<EntryId> = Vec::new();
        let mut gone: Vec<EntryId> = Vec::new();
        let mut out = history(rng, id, 0);
        for i in 0..events {
            let ev = match rng.below(10) {
                _ if live.is_empty() => None,
                0..=5 => None,
                6 => Some(SessionEvent::LeafMoved {
                    leaf: Some(pick_live(rng, &live)),
                }),
                7 | 8 => {
                    let mut removed: Vec<EntryId> = Vec::new();
                    for _ in 0..=rng.below(3) {
                        let at = rng.below(live.len() as u64) as usize;
                        if live.len() > 1 {
                            removed.push(live.swap_remove(at));
                        }
                    }
                    gone.extend(removed.iter().cloned());
                    Some(SessionEvent::TranscriptRewritten {
                        generation: i as u64,
                        written: Vec::new(),
                        reparented: Vec::new(),
                        removed,
                        leaf: None,
                    })
                }
                _ if rng.below(20) > 0 => Some(SessionEvent::Touched),
                _ => {
                    let entries: Vec<Entry> = live
                        .iter()
                        .filter(|_| rng.below(8) > 0)
                        .map(|id| text_entry(id.as_str(), None, "h".into()))
                        .collect();
                    let kept: Vec<EntryId> = entries.iter().map(|e| e.id.clone()).collect();
                    gone.extend(live.iter().filter(|id| !kept.contains(id)).cloned());
                    live = kept;
                    let leaf = live.last().cloned();
                    Some(SessionEvent::HistoryRewritten {
                        generation: i as u64,
                        entries,
                        leaf,
                    })
                }
            };
            let ev = ev.unwrap_or_else(|| {
                let new = match rng.below(4) {
                    0 if !gone.is_empty() => {
                        gone.swap_remove(rng.below(gone.len() as u64) as usize)
                    }
                    _ => EntryId::parse(&format!("e{i}")).unwrap(),
                };
                let parent = (!live.is_empty()).then(|| pick_live(rng, &live));
                live.push(new.clone());
                SessionEvent::EntryAppended {
                    entry: text_entry(new.as_str(), parent, format!("text {i}")),
                }
            });
            out.push(ev);
        }
        out
    }

    fn pick_live(rng: &mut Rng, live: &[EntryId]) -> EntryId {
        live[rng.below(live.len() as u64) as usize].clone()
    }

    /// Over long histories (thousands of events, hundreds of live ids,
    /// removals and re-adds), a light fold still ends as the full one.
    #[test]
    fn a_light_fold_decides_as_a_full_fold_over_long_histories() {
        let id = SessionId::parse("s-long").unwrap();
        let mut accepted = 0;
        for seed in 1..=8u64 {
            let mut rng = Rng(seed.wrapping_mul(0xD1B5_4A32_D192_ED03) | 1);
            let events = long_history(&mut rng, &id, 3_000);
            accepted += usize::from(decide_alike(&id, &events, seed));
        }
        assert_eq!(accepted, 8, "long valid histories are accepted by both");
    }
}
