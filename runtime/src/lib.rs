//! spool-runtime: event-sourced agent sessions on the spool engine.
//!
//! The crate root re-exports what an application needs: open a store
//! ([`LogStore`], or [`open_store`] for a location string), wrap it in a
//! [`SessionRuntime`], create sessions and run [`SessionAction`]s, and
//! open [`SessionHandle`]s for bounded, live views of a transcript. The
//! modules hold the rest of each area:
//!
//! - [`session`]: domain types, domain events, the fold, codecs.
//! - [`store`]: the [`SessionStore`] trait, the log, in-memory, JSON file
//!   and PostgreSQL stores, export and import.
//! - [`actions`]: built-in session actions and the [`SessionAction`] trait.
//! - [`agent_loop`]: the [`AgentLoop`] trait, loop factories and the
//!   deterministic scripted loop.
//! - [`hooks`], [`observer`]: pipeline hooks and observer events.
//! - [`transcript`]: the transcript tree, model context, history reads and
//!   rewrites.
//! - [`handle`]: live session handles (bounded resident snapshots,
//!   transcript-level writes, history reads, prepared rewrites).
//! - [`import`]: importers of other tools' session files.
//!
//! # Cargo features
//!
//! None is on by default.
//!
//! - `postgres`: the PostgreSQL store (`store::postgres`), with its
//!   blocking client and TLS.
//! - `conformance`: `store::conformance`, the behaviour every
//!   [`SessionStore`] must show, as functions a store's own tests call.
//! - `test-hooks`: fault injection and introspection for tests (a
//!   handle's publication failure and counters, the log store's index
//!   records in `test_hooks`); not a stable API.
//! - `fuzzing`: the `fuzzing` module, entry points of the fuzz targets into
//!   formats the crate keeps private (index records, reference decoders);
//!   not a stable API.

pub mod actions;
pub mod agent_loop;
mod error;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod handle;
pub mod hooks;
pub mod import;
pub mod observer;
pub mod runtime;
pub mod session;
pub mod store;
#[cfg(feature = "test-hooks")]
pub mod test_hooks;
#[cfg(test)]
mod test_rng;
pub mod transcript;

// The embedding API: what an application needs, at the crate root. The
// modules above hold the rest, for tools and advanced use.
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
pub use transcript::{Entry, EntryId, Json, ModelContext};
