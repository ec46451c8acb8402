//! [`SessionRepository`]: the seed's thin wrapper over a store.

use std::sync::Arc;

use super::{ListQuery, SessionStore, StoreError};
use crate::session::{AgentSession, AgentSessionInfo, SessionId, SessionInfoList};

/// A shared handle on a [`SessionStore`] with a `get` that turns absence
/// into `NotFound`. Use it to persist sessions you built yourself (the
/// runtime's `fork` already goes through the create pipeline).
#[derive(Clone)]
pub struct SessionRepository {
    store: Arc<dyn SessionStore>,
}

impl SessionRepository {
    pub fn new(store: Arc<dyn SessionStore>) -> Self {
        SessionRepository { store }
    }

    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    pub fn create(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        self.store.create(session)
    }

    pub fn save(&self, session: AgentSession) -> Result<AgentSession, StoreError> {
        self.store.save(session)
    }

    pub fn load(&self, id: &SessionId) -> Result<Option<AgentSession>, StoreError> {
        self.store.load(id)
    }

    /// The session, or `NotFound`.
    pub fn get(&self, id: &SessionId) -> Result<AgentSession, StoreError> {
        self.store
            .load(id)?
            .ok_or_else(|| StoreError::NotFound { id: id.clone() })
    }

    pub fn exists(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.store.exists(id)
    }

    pub fn delete(&self, id: &SessionId) -> Result<bool, StoreError> {
        self.store.delete(id)
    }

    pub fn header(&self, id: &SessionId) -> Result<Option<AgentSessionInfo>, StoreError> {
        self.store.header(id)
    }

    pub fn list_headers(&self, query: &ListQuery) -> Result<SessionInfoList, StoreError> {
        self.store.list_headers(query)
    }
}

impl std::fmt::Debug for SessionRepository {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SessionRepository").finish_non_exhaustive()
    }
}
