//! Navigation as [`SessionAction`]s, for the session-level pipeline
//! ([`SessionRuntime::execute`](crate::SessionRuntime::execute): a bounded
//! load, hooks, observer events; a target beyond the working set is read
//! through the transcript index). A [`SessionHandle`](super::SessionHandle) offers
//! the same operations at the transcript level without loading the session.

use crate::actions::{ActionError, SessionAction};
use crate::session::AgentSession;
use crate::transcript::EntryId;

/// Moves the transcript leaf to an existing entry (or to `None`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MoveLeaf {
    pub to: Option<EntryId>,
}

impl SessionAction for MoveLeaf {
    fn name(&self) -> &str {
        "move_leaf"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        if let Some(t) = &self.to {
            // A bounded session reads an entry beyond its working set
            // through the index.
            let known = session.know_entry(t).map_err(|e| {
                ActionError::Session(crate::session::SessionError::History {
                    id: session.id().clone(),
                    reason: e.to_string(),
                })
            })?;
            if !known {
                return Err(ActionError::Session(
                    crate::session::SessionError::UnknownEntry {
                        id: session.id().clone(),
                        entry: t.clone(),
                    },
                ));
            }
        }
        session.move_leaf(self.to.clone())?;
        Ok(())
    }
}

/// Appends a branch summary under `target` (`None`: a new root), recording
/// the current leaf as the branch left; it becomes the leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BranchWithSummary {
    pub target: Option<EntryId>,
    pub summary: String,
}

impl SessionAction for BranchWithSummary {
    fn name(&self) -> &str {
        "branch_with_summary"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.branch_with_summary(self.target.as_ref(), self.summary.clone())?;
        Ok(())
    }
}

/// Sets (`Some`, non-empty) or clears (`None`) the label of `target`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SetLabel {
    pub target: EntryId,
    pub label: Option<String>,
}

impl SessionAction for SetLabel {
    fn name(&self) -> &str {
        "set_label"
    }
    fn execute(&self, session: &mut AgentSession) -> Result<(), ActionError> {
        session.set_label(&self.target, self.label.clone())?;
        Ok(())
    }
}
