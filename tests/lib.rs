//! spool-tests: black-box reliability tests for spool.
//!
//! - [`seed`]: seeds for randomized tests (`SPOOL_TEST_SEED`) and a small
//!   deterministic generator.
//! - [`model`]: a reference model of session semantics.
//! - [`ops`]: runtime operations, their proptest generators, and a runner
//!   that checks the real runtime against the model after every step, on
//!   the memory, file and log stores.
//! - [`fuzz`]: the bodies of the cargo-fuzz targets in `fuzz/`, so that the
//!   saved corpora replay as ordinary tests on stable Rust.
//!
//! The tests themselves are in `tests/tests/it/` (one binary); RELIABILITY.md at the
//! repository root says what each one establishes and how to run it longer.

pub mod fuzz;
pub mod model;
pub mod ops;
pub mod seed;
pub mod workload;
