//! spool-engine
