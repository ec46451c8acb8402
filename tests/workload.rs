//! A session workload for crash and fault-injection loops, and the checks
//! that must hold after recovery.
//!
//! The workload drives a [`SessionRuntime`] over a log store with random
//! (seeded) operations and records, per session, every acknowledged
//! version. A `BeforeSave` hook captures the exact session each save is
//! about to persist, so when a save fails (a crash, an injected fault) the
//! one in-flight version is known too. After recovery [`check_recovered`]
//! asserts:
//!
//! - every session is at an acknowledged version no older than the last
//!   durable one, or at the in-flight version — equal to what was
//!   acknowledged (or about to be), never a mix;
//! - acknowledged-durable sessions are present (and purged ones absent);
//! - nothing unknown appears; stream versions are contiguous from 1;
//! - each header equals the loaded session's info.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use serde_json::json;
use spool_runtime::actions::{
    ActionError, ResumeSession, SendMessage, SuspendSession, WriteMetadata,
};
use spool_runtime::agent_loop::ScriptedLoopFactory;
use spool_runtime::hooks::{FnHook, HookStage, SessionHookStack};
use spool_runtime::observer::NullSink;
use spool_runtime::session::{AgentSession, SessionId, SessionStatus};
use spool_runtime::store::{ListOrder, ListQuery, LogStore, SessionStore, SortDirection};
use spool_runtime::transcript::{Entry, EntryId, EntryKind};
use spool_runtime::{RuntimeError, SessionRuntime};

use crate::ops::{definition, FnAction};
use crate::seed::Rng;

/// The session a save was about to persist when it failed.
pub type Capture = Arc<Mutex<Option<AgentSession>>>;

/// A runtime over `store` whose `BeforeSave` hook records into the capture.
pub fn capturing_runtime(store: Arc<dyn SessionStore>) -> (SessionRuntime, Capture) {
    let capture: Capture = Arc::new(Mutex::new(None));
    let c = capture.clone();
    let hooks = SessionHookStack::empty().with(
        FnHook::new("capture", move |stage, s: &mut AgentSession| {
            if stage == HookStage::BeforeSave {
                *c.lock().unwrap_or_else(|p| p.into_inner()) = Some(s.clone());
            }
            Ok(())
        }),
        0,
    );
    (
        SessionRuntime::new(store, Arc::new(NullSink), hooks),
        capture,
    )
}

/// What is known about one session.
#[derive(Clone, Debug, Default)]
pub struct Track {
    /// Every acknowledged version, `versions[v - 1]` is version `v`.
    pub versions: Vec<AgentSession>,
    /// Versions guaranteed to survive a crash (all of them with
    /// `Immediate`; up to the last successful flush with `Buffered`).
    pub durable_len: usize,
    pub purged: bool,
    pub durable_purged: bool,
}

/// The operation that failed, if any.
#[derive(Clone, Debug)]
pub enum Inflight {
    /// A create or save: the session as the save was about to persist it
    /// (its version is the one before the save).
    Save(Box<AgentSession>),
    Purge(SessionId),
}

/// Everything acknowledged so far, and what was in flight.
#[derive(Clone, Debug, Default)]
pub struct Tracker {
    pub sessions: BTreeMap<SessionId, Track>,
    pub inflight: Option<Inflight>,
    /// Session ids in creation order (ids are random: ordering by id would
    /// make the workload's choices differ from run to run).
    pub order: Vec<SessionId>,
    /// Operations acknowledged.
    pub acked: u64,
}

impl Tracker {
    fn record(&mut self, s: &AgentSession) -> Result<(), String> {
        if !self.sessions.contains_key(s.id()) {
            self.order.push(s.id().clone());
        }
        let t = self.sessions.entry(s.id().clone()).or_default();
        if s.version() != t.versions.len() as u64 + 1 {
            return Err(format!(
                "session {} acknowledged at version {} after {} acknowledged versions",
                s.id(),
                s.version(),
                t.versions.len()
            ));
        }
        t.versions.push(s.clone());
        self.acked += 1;
        Ok(())
    }

    /// Everything acknowledged so far is now durable.
    pub fn mark_durable(&mut self) {
        for t in self.sessions.values_mut() {
            t.durable_len = t.versions.len();
            t.durable_purged = t.purged;
        }
    }

    fn live(&self) -> Vec<(SessionId, AgentSession)> {
        self.order
            .iter()
            .filter_map(|id| self.sessions.get(id).map(|t| (id, t)))
            .filter(|(_, t)| !t.purged)
            .filter_map(|(id, t)| t.versions.last().map(|s| (id.clone(), s.clone())))
            .filter(|(_, s)| !s.is_deleted())
            .collect()
    }
}

/// Refusals write nothing and are part of normal operation.
fn is_refusal(e: &RuntimeError) -> bool {
    matches!(
        e.kind(),
        "session_deleted" | "invalid_transition" | "action_failed" | "not_found" | "conflict"
    )
}

/// Runs up to `steps` random operations. After each acknowledged one,
/// `after_ack` runs (to flush, or mark durability). Stops at the first
/// failure that is not a refusal, records it as in flight, and returns it.
pub fn run_workload(
    rt: &SessionRuntime,
    capture: &Capture,
    tracker: &mut Tracker,
    rng: &mut Rng,
    steps: usize,
    mut after_ack: impl FnMut(&mut Tracker),
) -> Result<Option<RuntimeError>, String> {
    for step in 0..steps {
        *capture.lock().unwrap_or_else(|p| p.into_inner()) = None;
        let live = tracker.live();
        let n = step as u64;
        let mut purge_of = None;
        let result: Result<Option<AgentSession>, RuntimeError> = if live.is_empty() || rng.chance(8)
        {
            rt.create(definition(rng.below(3) as u8), None).map(Some)
        } else {
            let (id, cur) = &live[rng.below(live.len() as u64) as usize];
            match rng.below(20) {
                0..=4 if cur.status() == SessionStatus::Active => {
                    let f = Arc::new(ScriptedLoopFactory::echo());
                    rt.execute(id, &SendMessage::new(format!("hello {n}"), f))
                        .map(Some)
                }
                0..=6 => rt
                    .execute(id, &WriteMetadata::new(format!("k{}", n % 3), json!(n)))
                    .map(Some),
                7 => {
                    // Larger than a test segment: it gets a segment of its own.
                    let big = "x".repeat(5000 + (n as usize % 7) * 100);
                    rt.execute(id, &WriteMetadata::new("big", json!(big)))
                        .map(Some)
                }
                8..=10 => {
                    let leaf = cur.state().transcript.leaf().cloned();
                    let entry = Entry {
                        id: EntryId::parse(&format!("w{n}")).map_err(|e| e.to_string())?,
                        parent_id: leaf,
                        timestamp_ms: 1_700_000_000_000 + n as i64,
                        kind: EntryKind::Custom {
                            custom_type: "step".into(),
                            data: json!({ "n": n }).into(),
                        },
                    };
                    let action = FnAction("append_entry", move |s: &mut AgentSession| {
                        s.append_entry(entry.clone()).map_err(ActionError::from)
                    });
                    rt.execute(id, &action).map(Some)
                }
                11 | 12 => rt.fork(id, None).map(Some),
                13 | 14 => {
                    if cur.status() == SessionStatus::Active {
                        rt.execute(id, &SuspendSession).map(Some)
                    } else {
                        rt.execute(id, &ResumeSession).map(Some)
                    }
                }
                15 | 16 => {
                    let entries = cur.state().transcript.entries();
                    let kept: Vec<Entry> = entries[..entries.len() / 2].to_vec();
                    let leaf = kept.last().map(|e| e.id.clone());
                    let action = FnAction("rewrite_history", move |s: &mut AgentSession| {
                        s.rewrite_history(kept.clone(), leaf.clone())
                            .map(|_| ())
                            .map_err(ActionError::from)
                    });
                    rt.execute(id, &action).map(Some)
                }
                17 => rt.delete(id).map(Some),
                18 => {
                    purge_of = Some(id.clone());
                    rt.purge(id).map(|_| None)
                }
                _ => rt
                    .execute(id, &WriteMetadata::new("tail", json!([n, "t"])))
                    .map(Some),
            }
        };
        match result {
            Ok(Some(s)) => {
                tracker.record(&s)?;
                after_ack(tracker);
            }
            Ok(None) => {
                if let Some(id) = purge_of {
                    if let Some(t) = tracker.sessions.get_mut(&id) {
                        t.purged = true;
                    }
                    tracker.acked += 1;
                }
                after_ack(tracker);
            }
            Err(e) if is_refusal(&e) => {}
            Err(e) => {
                tracker.inflight = match purge_of {
                    Some(id) => Some(Inflight::Purge(id)),
                    None => capture
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .take()
                        .map(|s| Inflight::Save(Box::new(s))),
                };
                return Ok(Some(e));
            }
        }
    }
    Ok(None)
}

/// Whether `loaded` is what the in-flight save `pre` would have stored.
fn is_inflight_result(loaded: &AgentSession, pre: &AgentSession) -> bool {
    let (a, b) = (loaded.info(), pre.info());
    loaded.version() == pre.version() + 1
        && a.id == b.id
        && a.parent_id == b.parent_id
        && a.status == b.status
        && a.agent_name == b.agent_name
        && a.label == b.label
        && a.created_at_ms == b.created_at_ms
        && loaded.definition() == pre.definition()
        && loaded.state() == pre.state()
}

/// Checks a recovered store against the tracker (see the module docs).
pub fn check_recovered(store: &LogStore, tracker: &Tracker) -> Result<(), String> {
    let inflight_save = match &tracker.inflight {
        Some(Inflight::Save(s)) => Some(&**s),
        _ => None,
    };
    let inflight_purge = match &tracker.inflight {
        Some(Inflight::Purge(id)) => Some(id),
        _ => None,
    };
    let mut expected_ids: Vec<SessionId> = tracker.sessions.keys().cloned().collect();
    if let Some(s) = inflight_save {
        if !tracker.sessions.contains_key(s.id()) {
            expected_ids.push(s.id().clone());
        }
    }
    for id in &expected_ids {
        let t = tracker.sessions.get(id).cloned().unwrap_or_default();
        let loaded = store.load(id).map_err(|e| format!("load {id}: {e}"))?;
        let header = store.header(id).map_err(|e| format!("header {id}: {e}"))?;
        match &loaded {
            None => {
                let may_be_absent = t.durable_len == 0
                    || t.durable_purged
                    || t.purged
                    || inflight_purge == Some(id);
                if !may_be_absent {
                    return Err(format!(
                        "session {id}: {} durable versions acknowledged, none recovered",
                        t.durable_len
                    ));
                }
                if header.is_some() {
                    return Err(format!("session {id}: absent but its header is listed"));
                }
            }
            Some(s) => {
                if t.durable_purged {
                    return Err(format!(
                        "session {id}: purge was acknowledged, still present"
                    ));
                }
                let v = s.version() as usize;
                if v < t.durable_len {
                    return Err(format!(
                        "session {id}: recovered version {v}, but {} were durable",
                        t.durable_len
                    ));
                }
                let ok = match t.versions.get(v.wrapping_sub(1)) {
                    Some(acked) if v >= 1 => acked == s,
                    _ => inflight_save
                        .is_some_and(|pre| pre.id() == id && is_inflight_result(s, pre)),
                };
                if !ok {
                    return Err(format!(
                        "session {id}: recovered version {v} is neither an acknowledged \
                         version nor the in-flight one (acknowledged {}, in flight {:?})",
                        t.versions.len(),
                        inflight_save
                            .filter(|p| p.id() == id)
                            .map(|p| p.version() + 1)
                    ));
                }
                if header.as_ref() != Some(s.info()) {
                    return Err(format!(
                        "session {id}: header {header:?} != loaded {:?}",
                        s.info()
                    ));
                }
            }
        }
        // Stream versions are contiguous from 1 up to the head.
        let engine = store.engine().expect("engine handle");
        let head = engine
            .stream_version(id.as_str())
            .map_err(|e| e.to_string())?
            .unwrap_or(0);
        let commits = engine
            .read_stream(id.as_str(), 1, usize::MAX)
            .map_err(|e| format!("read_stream {id}: {e}"))?;
        let versions: Vec<u64> = commits.iter().map(|c| c.info.version).collect();
        if versions != (1..=head).collect::<Vec<u64>>() {
            return Err(format!(
                "session {id}: stream versions {versions:?}, head {head}"
            ));
        }
    }
    let listed = list_all(store)?;
    for h in &listed {
        if !expected_ids.contains(&h.id) {
            return Err(format!("unknown session {} appeared", h.id));
        }
    }
    Ok(())
}

/// Every header, deleted included, ordered by id.
pub fn list_all(store: &LogStore) -> Result<Vec<spool_runtime::session::AgentSessionInfo>, String> {
    let q = ListQuery::all()
        .including_deleted()
        .order_by(ListOrder::Id, SortDirection::Ascending);
    let l = store.list_headers(&q).map_err(|e| format!("list: {e}"))?;
    if !l.skipped.is_empty() {
        return Err(format!("listing skipped {:?}", l.skipped));
    }
    Ok(l.headers)
}
