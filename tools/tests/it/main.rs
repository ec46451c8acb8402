//! The `spool` binary's tests, one test binary with a module per area (one
//! link instead of one per file). Each module runs the built binary.

// The runtime's throwaway-server harness, shared rather than copied.
#[path = "../../../runtime/tests/it/postgres_support/mod.rs"]
mod postgres_support;

mod cli;
mod compact_cli;
mod import_cli;
mod postgres_cli;
mod tools_cli;
