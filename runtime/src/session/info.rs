//! Session headers and the session status.

use serde::{Deserialize, Serialize};

use super::id::SessionId;

/// The lifecycle status of a session (a cross-run concern; the status of a
/// single run is [`crate::session::ExecutionStatus`]).
///
/// # Status policy
///
/// | from \ to   | Active | Suspended | Completed | Failed | Deleted |
/// |-------------|--------|-----------|-----------|--------|---------|
/// | Active      | —      | yes       | yes       | yes    | yes     |
/// | Suspended   | yes    | —         | yes       | yes    | yes     |
/// | Completed   | yes¹   | no        | —         | no     | yes     |
/// | Failed      | yes¹   | no        | no        | —      | yes     |
/// | Deleted     | no     | no        | no        | no     | —       |
///
/// ¹ Reopening a finished session is allowed (the `ResumeSession` action
/// does it); a finished session cannot be suspended or flipped between
/// Completed and Failed without being reopened first.
///
/// A transition to the current status is a no-op (no event is recorded).
/// `Deleted` is terminal: the runtime refuses every action on a deleted
/// session with `SessionDeleted`, and the fold refuses any event after
/// `Deleted` except `Touched`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionStatus {
    Active,
    Suspended,
    Completed,
    Failed,
    Deleted,
}

impl SessionStatus {
    /// All statuses, in declaration order.
    pub const ALL: [SessionStatus; 5] = [
        SessionStatus::Active,
        SessionStatus::Suspended,
        SessionStatus::Completed,
        SessionStatus::Failed,
        SessionStatus::Deleted,
    ];

    /// Whether the status policy (see the module docs) allows `self -> to`.
    /// Same-status "transitions" are allowed (they are no-ops).
    pub fn can_transition_to(self, to: SessionStatus) -> bool {
        use SessionStatus::*;
        if self == to {
            return true;
        }
        match (self, to) {
            (Deleted, _) => false,
            (_, Deleted) => true,
            (Active, _) => true,
            (Suspended, _) => true,
            (Completed | Failed, Active) => true,
            (Completed | Failed, _) => false,
        }
    }

    /// The stable lowercase name (`active`, `suspended`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            SessionStatus::Active => "active",
            SessionStatus::Suspended => "suspended",
            SessionStatus::Completed => "completed",
            SessionStatus::Failed => "failed",
            SessionStatus::Deleted => "deleted",
        }
    }
}

impl std::fmt::Display for SessionStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown status name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown session status {0:?} (expected active, suspended, completed, failed or deleted)")]
pub struct UnknownStatus(pub String);

impl std::str::FromStr for SessionStatus {
    type Err = UnknownStatus;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        SessionStatus::ALL
            .into_iter()
            .find(|st| st.as_str().eq_ignore_ascii_case(s))
            .ok_or_else(|| UnknownStatus(s.to_string()))
    }
}

/// The header of a session: everything listing needs, nothing of the state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentSessionInfo {
    pub id: SessionId,
    /// The session this one was forked from.
    pub parent_id: Option<SessionId>,
    pub status: SessionStatus,
    /// 0 before the first persist; the store sets 1 on create and +1 on
    /// every save.
    pub version: u64,
    pub agent_name: String,
    /// Display label; falls back to the agent name.
    pub label: String,
    /// Milliseconds since the Unix epoch.
    pub created_at_ms: i64,
    /// Milliseconds since the Unix epoch; set by the store on each persist.
    pub updated_at_ms: i64,
}

/// A session file or record that could not be read while listing.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SkippedSession {
    /// Where it is (a file path for the file store, a key for others).
    pub location: String,
    pub reason: String,
}

/// The answer to a listing query.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionInfoList {
    /// The page of headers, in the requested order.
    pub headers: Vec<AgentSessionInfo>,
    /// How many headers matched the filter before paging.
    pub total: u64,
    /// Pass as `ListQuery::cursor` to get the page after this one; `None`
    /// when this page reaches the end.
    pub next_cursor: Option<String>,
    /// Unreadable entries that were skipped instead of failing the listing.
    pub skipped: Vec<SkippedSession>,
}

impl SessionInfoList {
    pub fn len(&self) -> usize {
        self.headers.len()
    }
    pub fn is_empty(&self) -> bool {
        self.headers.is_empty()
    }
    pub fn iter(&self) -> std::slice::Iter<'_, AgentSessionInfo> {
        self.headers.iter()
    }
    pub fn ids(&self) -> Vec<SessionId> {
        self.headers.iter().map(|h| h.id.clone()).collect()
    }
}

impl<'a> IntoIterator for &'a SessionInfoList {
    type Item = &'a AgentSessionInfo;
    type IntoIter = std::slice::Iter<'a, AgentSessionInfo>;
    fn into_iter(self) -> Self::IntoIter {
        self.headers.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::SessionStatus::*;
    use super::*;

    #[test]
    fn policy_table() {
        assert!(Active.can_transition_to(Suspended));
        assert!(Suspended.can_transition_to(Active));
        assert!(Active.can_transition_to(Completed));
        assert!(Suspended.can_transition_to(Failed));
        assert!(Completed.can_transition_to(Active));
        assert!(Failed.can_transition_to(Deleted));
        assert!(!Completed.can_transition_to(Suspended));
        assert!(!Completed.can_transition_to(Failed));
        for to in SessionStatus::ALL {
            assert_eq!(Deleted.can_transition_to(to), to == Deleted);
        }
    }

    #[test]
    fn status_names_round_trip() {
        for st in SessionStatus::ALL {
            assert_eq!(st.as_str().parse::<SessionStatus>().unwrap(), st);
            assert_eq!(
                serde_json::to_string(&st).unwrap(),
                format!("\"{}\"", st.as_str())
            );
        }
        assert!("nope".parse::<SessionStatus>().is_err());
    }
}
