//! The pure fold: `AgentSession::apply` and `AgentSession::replay`.
//!
//! The fold checks structure only (a session starts with `Created`, entry
//! parents exist, ids are unique); policy (status transitions, task-list
//! bounds) is checked by the mutation methods before an event is recorded,
//! so a log written by an older policy still replays.

use std::collections::{HashMap, HashSet};

use super::events::SessionEvent;
use super::info::{AgentSessionInfo, SessionStatus};
use super::state::ExecutionStatus;
use super::AgentSession;
use crate::transcript::{Entry, EntryId, Transcript, TranscriptError, Usage};

/// An event could not be folded into a session.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum FoldError {
    #[error("an event history must start with `created` (found `{found}`)")]
    NotCreated { found: &'static str },
    #[error("`created` can only be the first event")]
    AlreadyCreated,
    #[error("empty event history")]
    Empty,
    #[error("event `{event}`: {source}")]
    Transcript {
        event: &'static str,
        source: TranscriptError,
    },
    #[error("history rewrite: {reason}")]
    BadRewrite { reason: String },
    /// A transcript-level recording was given another kind of event.
    #[error("`{found}` is not a transcript event")]
    NotTranscript { found: &'static str },
}

pub(super) fn session_from_created(ev: &SessionEvent) -> Result<AgentSession, FoldError> {
    match ev {
        SessionEvent::Created {
            id,
            parent_id,
            agent_name,
            label,
            created_at_ms,
            definition,
            state,
        } => Ok(AgentSession {
            info: AgentSessionInfo {
                id: id.clone(),
                parent_id: parent_id.clone(),
                status: SessionStatus::Active,
                version: 0,
                agent_name: agent_name.clone(),
                label: label.clone(),
                created_at_ms: *created_at_ms,
                updated_at_ms: *created_at_ms,
            },
            definition: (**definition).clone(),
            state: (**state).clone(),
            pending: Vec::new(),
            link: Default::default(),
        }),
        other => Err(FoldError::NotCreated {
            found: other.kind(),
        }),
    }
}

impl AgentSession {
    /// Folds one event into the session. Pure: no validation beyond
    /// structure, no pending-list change, no version change.
    pub fn apply(&mut self, ev: &SessionEvent) -> Result<(), FoldError> {
        let st = &mut self.state;
        match ev {
            SessionEvent::Created { .. } => return Err(FoldError::AlreadyCreated),
            SessionEvent::EntryAppended { entry } => {
                st.transcript
                    .append(entry.clone())
                    .map_err(|source| FoldError::Transcript {
                        event: ev.kind(),
                        source,
                    })?
            }
            SessionEvent::LeafMoved { leaf } => {
                st.transcript
                    .set_leaf(leaf.clone())
                    .map_err(|source| FoldError::Transcript {
                        event: ev.kind(),
                        source,
                    })?
            }
            SessionEvent::StatusChanged { to, .. } => self.info.status = *to,
            SessionEvent::SystemPromptChanged { system_prompt } => {
                st.system_prompt = system_prompt.clone()
            }
            SessionEvent::ModelChanged { model } => st.model = model.clone(),
            SessionEvent::MetadataWritten { key, value } => {
                st.metadata.insert(key.clone(), value.clone());
            }
            SessionEvent::MetadataRemoved { key } => {
                st.metadata.remove(key);
            }
            SessionEvent::TaskUpdated { tasks } => st.tasks = tasks.clone(),
            SessionEvent::StateCleared => *st = st.for_next_execution(),
            SessionEvent::ExecutionStarted { execution } => {
                st.execution_count = *execution;
                st.execution = ExecutionStatus::InProgress;
                st.usage = Usage::default();
                st.last_error = None;
            }
            SessionEvent::ExecutionFinished {
                status,
                usage,
                error,
            } => {
                st.execution = *status;
                st.usage = *usage;
                st.total_usage.add(usage);
                st.last_error = error.clone();
            }
            SessionEvent::HistoryRewritten {
                generation,
                entries,
                leaf,
            } => {
                let mut seen: HashSet<&EntryId> = HashSet::with_capacity(entries.len());
                for e in entries {
                    if let Some(p) = &e.parent_id {
                        if !seen.contains(p) {
                            return Err(FoldError::BadRewrite {
                                reason: format!("entry {} precedes its parent {p}", e.id),
                            });
                        }
                    }
                    if !seen.insert(&e.id) {
                        return Err(FoldError::BadRewrite {
                            reason: format!("entry {} appears twice", e.id),
                        });
                    }
                }
                if let Some(l) = leaf {
                    if !seen.contains(l) {
                        return Err(FoldError::BadRewrite {
                            reason: format!("leaf {l} is not among the entries"),
                        });
                    }
                }
                st.transcript.replace_all(entries.clone(), leaf.clone());
                st.generation = *generation;
            }
            SessionEvent::TranscriptRewritten {
                generation,
                written,
                reparented,
                removed,
                leaf,
            } => {
                st.transcript
                    .apply_rewrite(written, reparented, removed, leaf.as_ref())
                    .map_err(|reason| FoldError::BadRewrite { reason })?;
                st.generation = *generation;
            }
            SessionEvent::Forked { from, .. } => self.info.parent_id = Some(from.clone()),
            SessionEvent::Deleted => self.info.status = SessionStatus::Deleted,
            SessionEvent::Touched => {}
        }
        Ok(())
    }

    /// Rebuilds a session from its whole event history (which must start
    /// with `Created`). The result has version 0 and an empty pending list;
    /// a store sets the version with [`AgentSession::reconstitute`].
    pub fn replay<'a, I>(events: I) -> Result<AgentSession, FoldError>
    where
        I: IntoIterator<Item = &'a SessionEvent>,
    {
        let mut it = events.into_iter();
        let first = it.next().ok_or(FoldError::Empty)?;
        let mut s = session_from_created(first)?;
        for ev in it {
            s.apply(ev)?;
        }
        Ok(s)
    }

    /// Continues from a snapshot: folds `tail` into `self`.
    pub fn replay_onto<'a, I>(mut self, tail: I) -> Result<AgentSession, FoldError>
    where
        I: IntoIterator<Item = &'a SessionEvent>,
    {
        for ev in tail {
            self.apply(ev)?;
        }
        Ok(self)
    }
}

impl Transcript {
    /// Applies a delta rewrite (the fold of
    /// [`SessionEvent::TranscriptRewritten`]): entries keep their append
    /// order; `removed` ones are dropped, `written` ones replaced (same id),
    /// `reparented` ones relinked (payload untouched), and the leaf set.
    /// Checked first, so a refused rewrite changes nothing: every named
    /// entry must exist, be named once, and not be removed when written or
    /// relinked; every new parent and the leaf must exist after the
    /// rewrite. Cost: O(entries) (the in-memory form is rebuilt).
    pub fn apply_rewrite(
        &mut self,
        written: &[Entry],
        reparented: &[(EntryId, Option<EntryId>)],
        removed: &[EntryId],
        leaf: Option<&EntryId>,
    ) -> Result<(), String> {
        check_rewrite(|id| self.contains(id), written, reparented, removed, leaf)?;
        let removed_set: HashSet<&EntryId> = removed.iter().collect();
        let written_by: HashMap<&EntryId, &Entry> = written.iter().map(|e| (&e.id, e)).collect();
        let relinked: HashMap<&EntryId, &Option<EntryId>> =
            reparented.iter().map(|(id, p)| (id, p)).collect();
        let mut out = Vec::with_capacity(self.len().saturating_sub(removed.len()));
        for e in self.entries() {
            if removed_set.contains(&e.id) {
                continue;
            }
            if let Some(w) = written_by.get(&e.id) {
                out.push((*w).clone());
            } else if let Some(p) = relinked.get(&e.id) {
                let mut c = e.clone();
                c.parent_id = (*p).clone();
                out.push(c);
            } else {
                out.push(e.clone());
            }
        }
        self.replace_all(out, leaf.cloned());
        Ok(())
    }
}

/// The checks of a delta rewrite ([`Transcript::apply_rewrite`]) against a
/// transcript that holds the ids `contains` says it holds: every named
/// entry exists and is named once, is not removed when written or
/// relinked; every new parent and the leaf exist after the rewrite.
pub(crate) fn check_rewrite(
    contains: impl Fn(&EntryId) -> bool,
    written: &[Entry],
    reparented: &[(EntryId, Option<EntryId>)],
    removed: &[EntryId],
    leaf: Option<&EntryId>,
) -> Result<(), String> {
    check_rewrite_with(
        |id, need| match contains(id) {
            true => Ok(()),
            false => Err(need.refusal(id)),
        },
        written,
        reparented,
        removed,
        leaf,
    )
}

/// What a delta rewrite needs of an id the transcript must hold.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Need {
    /// A written, relinked or removed entry.
    Named,
    /// A written or relinked entry's new parent.
    NewParent,
    /// The new leaf.
    NewLeaf,
}

impl Need {
    /// Why the rewrite is refused when the transcript does not hold `id`.
    pub(crate) fn refusal(self, id: &EntryId) -> String {
        match self {
            Need::Named => format!("entry {id} is not in the transcript"),
            Need::NewParent => format!("new parent {id} is not kept by the rewrite"),
            Need::NewLeaf => format!("leaf {id} is not kept by the rewrite"),
        }
    }
}

/// [`check_rewrite`] with every question about the transcript's ids put to
/// `need`, in the order the checks meet them (a caller may note a question
/// and answer it later); the checks within the rewrite are made here.
pub(crate) fn check_rewrite_with(
    mut need: impl FnMut(&EntryId, Need) -> Result<(), String>,
    written: &[Entry],
    reparented: &[(EntryId, Option<EntryId>)],
    removed: &[EntryId],
    leaf: Option<&EntryId>,
) -> Result<(), String> {
    let removed_set: HashSet<&EntryId> = removed.iter().collect();
    let mut named: HashSet<&EntryId> = HashSet::new();
    for id in removed
        .iter()
        .chain(written.iter().map(|e| &e.id))
        .chain(reparented.iter().map(|(id, _)| id))
    {
        need(id, Need::Named)?;
        if !named.insert(id) {
            return Err(format!("entry {id} is named twice"));
        }
    }
    for p in written
        .iter()
        .filter_map(|e| e.parent_id.as_ref())
        .chain(reparented.iter().filter_map(|(_, p)| p.as_ref()))
    {
        need(p, Need::NewParent)?;
        if removed_set.contains(p) {
            return Err(Need::NewParent.refusal(p));
        }
    }
    if let Some(l) = leaf {
        need(l, Need::NewLeaf)?;
        if removed_set.contains(l) {
            return Err(Need::NewLeaf.refusal(l));
        }
    }
    Ok(())
}
