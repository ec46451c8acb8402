//! Store conformance suite (placeholder).
