//! The JSON file store (placeholder, filled in below).
