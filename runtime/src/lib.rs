//! spool-runtime: event-sourced agent sessions on the spool engine.

pub mod transcript;
