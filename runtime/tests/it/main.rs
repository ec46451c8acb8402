//! The runtime's integration tests, one binary with a module per area (one
//! link instead of one per file). Shared helpers are the `*_support` and
//! `common` modules.

mod common;
mod handle_support;
mod postgres_support;
mod transcript_support;

mod actions;
mod concurrency;
mod conformance;
mod events_fold;
mod execute_bounded;
mod file_store;
mod fork_seed_index;
mod handle_backends;
mod handle_basic;
mod handle_publication;
mod handle_rewrite;
mod handle_scale;
mod handle_writers;
mod json_payloads;
mod listing_scale;
mod log_erase;
mod postgres;
mod postgres_handle;
mod postgres_tls;
mod postgres_tokio;
mod runtime_pipeline;
mod transcript_context;
mod transcript_history;
mod transcript_path_facts;
mod transcript_resident;
mod transcript_rewrite;
mod transcript_tree;
