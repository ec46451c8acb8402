//! The in-memory store: a map behind a mutex. Same version semantics as
//! every other store; nothing survives the process.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};

use super::{ListQuery, LoadCounter, SessionStore, StoreError, StoreStats};
use crate::session::{AgentSession, AgentSessionInfo, SessionId, SessionInfoList};
use crate::transcript::now_ms;

/// Sessions in a `Mutex<HashMap>`.
#[derive(Debug, Default)]
pub struct MemoryStore {
    sessions: Mutex<HashMap<SessionId, AgentSession>>,
    loads: LoadCounter,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn map(&self) -> MutexGuard<'_, HashMap<SessionId, AgentSession>> {
        // A panic while holding the lock cannot leave a half-written
        // session (every write is a single insert), so poison is harmless.
        self.sessions.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.map().is_empty()
    }
}

impl SessionStore for MemoryStore {
    fn create(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        if session.version() != 0 {
            return Err(StoreError::InvalidSession {
                id: session.id().clone(),
                reason: format!("create needs version 0, got {}", session.version()),
            });
        }
        let mut map = self.map();
        if let Some(existing) = map.get(session.id()) {
            return Err(StoreError::Conflict {
                id: session.id().clone(),
                expected: 0,
                actual: existing.version(),
            });
        }
        let now = now_ms().max(session.info().created_at_ms);
        let stored = session.reconstitute(1, now);
        map.insert(stored.id().clone(), stored.clone());
        Ok(stored)
    }

    fn save(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        let mut map = self.map();
        let current = map.get(session.id()).ok_or_else(|| StoreError::NotFound {
            id: session.id().clone(),
        })?;
        if current.version() != session.version() {
            return Err(StoreError::Conflict {
                id: session.id().clone(),
                expected: session.version(),
                actual: current.version(),
            });
        }
        let now = now_ms().max(current.info().updated_at_ms);
        let version = session.version().saturating_add(1);
        let stored = session.reconstitute(version, now);
        map.insert(stored.id().clone(), stored.clone());
        Ok(stored)
    }

    fn load(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        let found = self.map().get(id).cloned();
        if found.is_some() {
            self.loads.bump();
        }
        Ok(found)
    }

    fn exists(&self, id: &SessionId) -> Result<bool, StoreError> {
        Ok(self.map().contains_key(id))
    }

    fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        Ok(self.map().remove(id).is_some())
    }

    fn list_headers(&self, query: &ListQuery) -> Result<SessionInfoList, StoreError> {
        let headers: Vec<AgentSessionInfo> = self
            .map()
            .values()
            .filter(|s| query.matches(s.info()))
            .map(|s| s.info().clone())
            .collect();
        query.apply(headers)
    }

    fn header(&self, id: &SessionId) -> Result<Option<AgentSessionInfo>, StoreError> {
        Ok(self.map().get(id).map(|s| s.info().clone()))
    }

    fn stats(&self) -> StoreStats {
        self.loads.stats()
    }
}
