//! The black-box reliability tests, one binary with a module per area (one
//! link instead of one per file). RELIABILITY.md says what each establishes.

mod crash_sim;
mod fault_injection;
mod fuzz_corpus;
mod hostile;
mod model_based;
