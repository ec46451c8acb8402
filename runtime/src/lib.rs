//! spool-runtime: event-sourced agent sessions on the spool engine.
//!
//! - [`session`]: domain types, domain events, the fold, codecs.
//! - [`store`]: the [`store::SessionStore`] trait, the in-memory and JSON
//!   file stores, and the store conformance suite.
//! - [`actions`]: built-in session actions and the [`actions::SessionAction`] trait.
//! - [`agent_loop`]: the [`agent_loop::AgentLoop`] trait, loop factories and
//!   the deterministic scripted loop.
//! - [`hooks`], [`observer`]: pipeline hooks and observer events.
//! - [`runtime`]: [`runtime::SessionRuntime`], the create/read/execute boundary.
//! - [`transcript`]: the transcript tree.
//! - [`handle`]: live session handles (bounded resident snapshots,
//!   transcript-level writes, history reads, prepared rewrites).

pub mod actions;
pub mod agent_loop;
pub mod error;
pub mod handle;
pub mod hooks;
pub mod import;
pub mod observer;
pub mod runtime;
pub mod session;
pub mod store;
pub mod transcript;

// The embedding API: what an application needs, at the crate root. The
// modules above stay reachable for tools and advanced use.
pub use actions::{SendMessage, SessionAction};
pub use agent_loop::{
    AgentLoop, LoopError, LoopFactory, LoopInput, LoopOutput, LoopSettings, ScriptedLoopFactory,
    ScriptedTurn, StepSink,
};
pub use error::RuntimeError;
pub use handle::{HandleError, HandleOptions, SessionHandle};
pub use hooks::{HookStage, SessionHook, SessionHookStack};
pub use observer::{EventSink, RuntimeEvent};
pub use runtime::SessionRuntime;
pub use session::{
    AgentDefinition, AgentSession, AgentSessionInfo, AgentState, HistoryReader, ModelConfig,
    SessionEvent, SessionId, SessionInfoList, SessionStatus,
};
pub use store::{open_store, ListQuery, LogStore, LogStoreOptions, SessionStore, StoreError};
pub use transcript::{Entry, EntryId, ModelContext};
