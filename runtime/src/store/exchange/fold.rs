//! The check of one session to import, commit by commit: its shape and the
//! fold of its events, optionally without the entries' content.

use super::*;
use crate::session::{check_rewrite, FoldError};
use crate::transcript::id_index::IdIndex;
use crate::transcript::{Entry, EntryId, EntryKind, Transcript, TranscriptError};

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
/// long session in about 20 bytes per live entry ([`IdIndex`], which
/// refuses a session beyond 4 Gi ids or 4 GiB of them held), whatever its
/// text.
pub(crate) struct SessionFold {
    id: SessionId,
    /// The light fold's transcript (`None`: a full fold).
    ids: Option<Ids>,
    light: bool,
    commits: u64,
    events: u64,
    last_ts: i64,
    session: Option<AgentSession>,
}

impl SessionFold {
    pub(crate) fn new(id: SessionId, light: bool) -> Self {
        SessionFold {
            id,
            ids: None,
            light,
            commits: 0,
            events: 0,
            last_ts: 0,
            session: None,
        }
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
                    Some(ids) => ids.fold(s, ev),
                    None => s.apply(ev).map_err(Refusal::Fold),
                },
            };
            folded.map_err(|e| {
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
                self.ids = Some(Ids::of(&transcript)?);
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
    pub(crate) fn finish(self) -> Result<AgentSession, ExchangeError> {
        let malformed = |reason: String| ExchangeError::Malformed { line: 0, reason };
        if self.commits == 0 {
            return Err(malformed(format!("session {} has no commits", self.id)));
        }
        self.session
            .map(|s| s.reconstitute(self.commits, self.last_ts))
            .ok_or_else(|| malformed(format!("session {} has no events", self.id)))
    }
}

/// Why a commit does not fold: the fold's own error, or more entry ids
/// than a light fold holds ([`IdIndex`]'s limits).
#[derive(Debug)]
enum Refusal {
    Fold(FoldError),
    Limit(String),
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
        }
    }
}

/// A transcript as a light fold keeps it: which ids it holds (the first of
/// a repeated id, as [`Transcript`]'s lookups), how many entries, the leaf.
/// The ids are an [`IdIndex`]: about 20 bytes an entry.
#[derive(Default)]
struct Ids {
    ids: IdIndex,
    len: u64,
    leaf: Option<EntryId>,
}

impl Ids {
    fn of(t: &Transcript) -> Result<Ids, Refusal> {
        let mut ids = Ids::from_entries(t.entries())?;
        ids.leaf = t.leaf().cloned();
        Ok(ids)
    }

    /// The ids of `entries` (a repeated id once), their count, no leaf.
    fn from_entries(entries: &[Entry]) -> Result<Ids, Refusal> {
        let mut ids = IdIndex::default();
        for e in entries {
            if !ids.contains(e.id.as_str()) {
                ids.push(e.id.as_str()).map_err(Refusal::Limit)?;
            }
        }
        Ok(Ids {
            ids,
            len: entries.len() as u64,
            leaf: None,
        })
    }

    fn contains(&self, id: &EntryId) -> bool {
        self.ids.contains(id.as_str())
    }

    /// Folds `ev` into `s` as [`AgentSession::apply`] does, with the
    /// transcript's part done here: the same checks, in the same order,
    /// with the same errors.
    fn fold(&mut self, s: &mut AgentSession, ev: &SessionEvent) -> Result<(), Refusal> {
        let unknown = |id: &EntryId| FoldError::Transcript {
            event: ev.kind(),
            source: TranscriptError::UnknownEntry(id.clone()),
        };
        match ev {
            SessionEvent::EntryAppended { entry } => {
                if self.contains(&entry.id) {
                    return Err(Refusal::Fold(FoldError::Transcript {
                        event: ev.kind(),
                        source: TranscriptError::DuplicateEntry(entry.id.clone()),
                    }));
                }
                if let Some(p) = entry.parent_id.as_ref().filter(|p| !self.contains(p)) {
                    return Err(unknown(p).into());
                }
                self.ids.push(entry.id.as_str()).map_err(Refusal::Limit)?;
                self.len += 1;
                self.leaf = Some(entry.id.clone());
                Ok(())
            }
            SessionEvent::LeafMoved { leaf } => {
                if let Some(l) = leaf.as_ref().filter(|l| !self.contains(l)) {
                    return Err(unknown(l).into());
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
                *self = Ids::from_entries(entries)?;
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
                self.rewrite(written, reparented, removed, leaf.as_ref())
                    .map_err(|reason| FoldError::BadRewrite { reason })?;
                Ok(s.apply(&emptied(*generation))?)
            }
            SessionEvent::StateCleared => {
                *self = Ids::default();
                Ok(s.apply(ev)?)
            }
            other => Ok(s.apply(other)?),
        }
    }

    /// [`Transcript::apply_rewrite`]'s checks and effect on the ids.
    fn rewrite(
        &mut self,
        written: &[Entry],
        reparented: &[(EntryId, Option<EntryId>)],
        removed: &[EntryId],
        leaf: Option<&EntryId>,
    ) -> Result<(), String> {
        check_rewrite(|id| self.contains(id), written, reparented, removed, leaf)?;
        for id in removed {
            self.ids.remove(id.as_str());
        }
        self.len = self.len.saturating_sub(removed.len() as u64);
        self.leaf = leaf.cloned();
        Ok(())
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

    /// A small deterministic generator (xorshift64*).
    struct Rng(u64);
    impl Rng {
        fn below(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
        }
    }

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
                    let parent = (!known.is_empty() && rng.below(5) > 0).then(|| pick(rng, &known));
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

    fn fold_all(id: &SessionId, events: &[SessionEvent], light: bool) -> Outcome {
        let mut f = SessionFold::new(id.clone(), light);
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
        Ok((entries, leaf, s.state().generation, s.info().version))
    }

    /// Folds `events` fully and lightly; both must end alike. Whether they
    /// accepted.
    fn decide_alike(id: &SessionId, events: &[SessionEvent], seed: u64) -> bool {
        match (fold_all(id, events, false), fold_all(id, events, true)) {
            (Ok(full), Ok(light)) => {
                assert_eq!(full, light, "seed {seed}");
                true
            }
            (Err(full), Err(light)) => {
                assert_eq!(full, light, "seed {seed}");
                false
            }
            (full, light) => panic!(
                "seed {seed}: full {:?}, light {:?}",
                full.map(|_| ()),
                light.map(|_| ())
            ),
        }
    }

    /// A light fold accepts and refuses exactly what a full fold does, with
    /// the same error, and ends with the same number of entries, leaf,
    /// generation and version.
    #[test]
    fn a_light_fold_decides_as_a_full_fold() {
        let id = SessionId::parse("s-light").unwrap();
        let (mut accepted, mut refused) = (0, 0);
        for seed in 1..=400u64 {
            let mut rng = Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1);
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
    /// to grow and rebuild a light fold's [`IdIndex`] many times.
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
