//! The transcript index of the log store and its read side.

mod accelerators;
mod indexer;

pub use indexer::*;
