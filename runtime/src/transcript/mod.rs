//! The transcript: a tree of entries with a persisted leaf, the model
//! context built from its root→leaf path, and bounded resident selections.
//!
//! Storage-independent building blocks, all reading through
//! [`EntrySource`] (implemented for [`Transcript`]; a store implements it
//! over its indexes): per-entry [`PathFacts`] computed at append time
//! ([`path_facts`]), bounded resident selections ([`resident`]), paged and
//! version-fenced history reads ([`history`]) and rewrite planning
//! ([`rewrite`]).

pub mod api_format;
// The modules whose docs explain a concept stay public (their items are
// re-exported here too); the others hold a type or two.
pub mod context;
mod entry;
pub mod history;
pub(crate) mod id_index;
mod json;
mod json_encode;
mod json_size;
pub mod path_facts;
pub mod resident;
pub mod rewrite;
mod shared_seq;
mod source;
pub(crate) mod tagged;
pub mod tree;

pub(crate) use context::build_context;
#[cfg(test)]
pub(crate) use context::path_settings;
pub use context::PathMarker;
pub use context::{
    context_messages, context_start, BudgetReport, ContextMessage, ContextRole, ModelContext,
    SYNTHETIC_TOOL_RESULT_TEXT,
};
pub(crate) use entry::now_ms;
pub(crate) use entry::{custom_type, label_value, tagged_by};
pub use entry::{
    ContentBlock, Entry, EntryId, EntryKind, InvalidEntryId, Message, StopReason, Usage,
    ENTRY_ID_LEN_MAX,
};
pub use history::{
    read_branch_page, read_context, read_custom_page, read_entry, read_navigation, CancelToken,
    ChildSummary, Continuation, ContinuationError, EntryPage, NavigationFacts, OversizedPolicy,
    PageBudget, PageOrder, Position, ReadError, ReadResult, ReadScope, TranscriptVersion,
    VersionConflict, CONTINUATION_ENCODED_LEN_MAX, CONTINUATION_FORMAT, NAV_CHILDREN_MAX,
};
pub use json::Json;
pub(crate) use json_size::parent_json_len;
pub use path_facts::{first_kept_depth, path_facts_by_walk, Anchor, IndexedTranscript, PathFacts};
pub(crate) use resident::select_resident_sized;
pub use resident::{
    entry_size, select_resident, Budget, ChildLinks, CustomRef, EntryFacts, OmittedEntry,
    ResidentError, ResidentSelection, CHILD_LINKS_MAX, DEFAULT_RESIDENT_BYTES_MAX,
    DEFAULT_RESIDENT_EVENTS_MAX,
};
pub use resident::{AppendedEntry, BoundaryCounts, NavLinks};
pub use rewrite::{
    redact, remove_trailing_entries, truncate_tool_results, Replacement, RewriteError, RewritePlan,
    TOOL_RESULT_TRUNCATE_BYTES_MIN, TRAILING_SCAN_ENTRIES_MAX,
};
pub use rewrite::{MappedEntry, TrailingRemoval};
pub use shared_seq::SharedSeq;
pub use source::EntrySource;
pub use tree::{
    entry_summary, Navigation, Transcript, TranscriptError, TreeRow, TREE_SUMMARY_CHARS_MAX,
};
