//! Entry points of the fuzz targets into formats the engine keeps private (the
//! index's redo log). Feature `fuzzing`; not a stable API.

use std::path::Path;

/// The writes a redo record body holds, or where and why it does not decode.
#[allow(clippy::type_complexity)]
pub fn redo_body_writes(body: &[u8]) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>, String> {
    crate::index::redo::decode_body(body).map_err(|(at, what)| format!("offset {at}: {what}"))
}

/// The body of a redo record holding `writes` (sorted by key, as a move writes them).
pub fn redo_body(writes: &[(Vec<u8>, Option<Vec<u8>>)]) -> Vec<u8> {
    let refs: Vec<(&[u8], &Option<Vec<u8>>)> =
        writes.iter().map(|(k, v)| (k.as_slice(), v)).collect();
    crate::index::redo::encode_body(&refs).expect("a fuzz input is far below the record limit")
}

/// The value of sled's `MOVING` key naming the record with `body`.
pub fn redo_marker(body: &[u8]) -> Vec<u8> {
    crate::index::redo::marker(body).to_vec()
}

/// Appends a record holding `body` to the redo log of the index directory `dir`.
pub fn redo_append(dir: &Path, body: &[u8]) -> Result<(), String> {
    let mut log = crate::index::redo::RedoLog::open(dir).map_err(|e| e.to_string())?;
    log.append(body).map(|_| ()).map_err(|e| e.to_string())
}

/// The record body the redo log of `dir` holds for `marker`, as open looks it up.
pub fn redo_find(dir: &Path, marker: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut log = crate::index::redo::RedoLog::open(dir).map_err(|e| e.to_string())?;
    log.find(marker).map_err(|e| e.to_string())
}

/// Name of the redo log file in an index directory.
pub const REDO_FILE: &str = crate::index::redo::REDO_FILE;
