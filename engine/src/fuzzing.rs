//! Entry points of the fuzz targets into formats the engine keeps private (the
//! index's redo log, the saved key filter). Feature `fuzzing`; not a stable API.

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

/// The key filter encoded in `bytes` (the filter part of `index/keys.filter`)
/// encoded again, or why it does not decode.
pub fn key_filter_reencode(bytes: &[u8]) -> Result<Vec<u8>, String> {
    let filter = crate::index::bloom::KeyFilter::decode(bytes)?;
    let mut out = Vec::new();
    if !filter.encode(&mut out) {
        return Err("a decoded filter is saturated".into());
    }
    Ok(out)
}

/// Whether the key filter encoded in `bytes` may contain `key` (`None`: it does
/// not decode).
pub fn key_filter_may_contain(bytes: &[u8], key: &[u8]) -> Option<bool> {
    let filter = crate::index::bloom::KeyFilter::decode(bytes).ok()?;
    Some(filter.may_contain(crate::index::bloom::KeyHash::of(key)))
}

/// The encoding of a key filter holding `keys`.
pub fn key_filter_of(keys: &[&[u8]]) -> Vec<u8> {
    let mut filter = crate::index::bloom::KeyFilter::default();
    for k in keys {
        filter.insert(crate::index::bloom::KeyHash::of(k));
    }
    let mut out = Vec::new();
    let kept = filter.encode(&mut out);
    debug_assert!(kept, "a filter of a few keys is not saturated");
    out
}

/// Most entries [`checkpoint_entries`] reads from a checkpoint.
pub const CHECKPOINT_ENTRIES_MAX: usize = 1 << 16;

/// A checkpoint file holding `bytes`, read as a reader reads one: opened (header,
/// footer and top index checked), every entry in key order (at most
/// [`CHECKPOINT_ENTRIES_MAX`]), then each of the first `lookups` of their keys looked
/// up again. The entries and what each lookup found, or where and why it failed.
#[allow(clippy::type_complexity)]
pub fn checkpoint_entries(
    bytes: &[u8],
    lookups: usize,
) -> Result<(Vec<(Vec<u8>, Vec<u8>)>, Vec<Option<Vec<u8>>>), String> {
    use crate::vfs::{OpenMode, SimVfs, Vfs};
    let vfs = SimVfs::new();
    let dir = Path::new("/fuzz-checkpoint");
    let path = dir.join("0000000000000001.ckpt");
    let write = |e: std::io::Error| format!("writing the input: {e}");
    vfs.create_dir_all(dir).map_err(write)?;
    let file = vfs.open(&path, OpenMode::CreateNew).map_err(write)?;
    file.write_at(bytes, 0).map_err(write)?;
    let ck = std::sync::Arc::new(crate::checkpoint::read::CheckpointFile::open(&vfs, &path)?);
    let mut entries = Vec::new();
    let all = ck.range(std::ops::Bound::Unbounded, std::ops::Bound::Unbounded);
    for kv in all.take(CHECKPOINT_ENTRIES_MAX) {
        let (k, v) = kv.map_err(|e| e.to_string())?;
        entries.push((k.to_vec(), v.to_vec()));
    }
    let mut found = Vec::new();
    for (k, _) in entries.iter().take(lookups) {
        found.push(ck.get(k).map_err(|e| e.to_string())?.map(|v| v.to_vec()));
    }
    Ok((entries, found))
}
