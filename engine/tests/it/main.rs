//! The engine's integration tests, one binary with a module per area (one
//! link instead of one per file). Shared helpers are in `common`.

mod common;

mod basic;
mod bulk_load;
mod checkpoint;
mod erase;
mod faults;
mod gc;
mod growth;
mod index;
mod owner_open;
mod process;
mod recovery;
mod salvage;
mod spare;
