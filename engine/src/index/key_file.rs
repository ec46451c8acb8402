//! The key filter saved with the index at a clean close, so that the next owner open
//! need not scan every key of sled to fill it (a scan that reads all of sled and fills
//! its page cache, whatever the open then reads).
//!
//! The file is a cache and is trusted only for the exact sled state it was written
//! beside: it carries a fingerprint of sled's meta keys (the applied marker, which
//! names the last applied commit's seq and id, the layout and the format), compared
//! byte for byte on open. An open always removes the file, whether it used it or not,
//! so an index that an open has written to never has a file of an older state beside
//! it; a file that a crash kept anyway still names the older marker. A missing, stale
//! or damaged file only costs the scan. The layout is in docs/format.md, "Key filter
//! file".

use super::*;
use crate::index::bloom::{take_u32, FilterFile, KEY_FILTER_BYTES_MAX};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;

/// The saved filter's name in the index directory.
pub(crate) const KEY_FILTER_FILE: &str = "keys.filter";
/// Where a save writes before its rename.
const KEY_FILTER_TMP: &str = "keys.filter.tmp";
const MAGIC: [u8; 8] = *b"spoolkf1";
const FILE_VERSION: u32 = 1;
/// Most bytes of a fingerprint: three meta values of at most a few dozen bytes.
const FINGERPRINT_BYTES_MAX: u32 = 1024;
/// Most bytes of a key filter file: the filter's bound plus headers. A larger file is
/// refused before it is read.
const KEY_FILE_BYTES_MAX: u64 = KEY_FILTER_BYTES_MAX + 64 * 1024;

impl Index {
    /// The meta values a saved filter must match: applied marker, layout, format and
    /// base, each as a length (u32 BE) and its bytes (absent = length 0); those of the
    /// next sled when a close built one (see `delta.rs`).
    fn key_fingerprint(&self) -> Result<Vec<u8>, Error> {
        if let Some(next) = &*self.next.lock().unwrap_or_else(|e| e.into_inner()) {
            return Ok(next.fingerprint.clone());
        }
        let tree = &self.sled("read its meta keys")?.tree;
        super::delta::key_fingerprint_of(tree).map_err(Error::Index)
    }

    /// Saves the key filter beside sled, if it is complete and not saturated. Call only
    /// once sled holds every applied commit durably (after [`Index::flush`]) and nothing
    /// will write to sled before the process lets go of it. Best effort: `Ok(false)`
    /// when there is nothing worth saving.
    pub(crate) fn save_key_filter(&self) -> Result<bool, Error> {
        let Some(dir) = &self.path else {
            return Ok(false);
        };
        if self.sled.is_none() {
            return Ok(false);
        }
        let fingerprint = self.key_fingerprint()?;
        let keys = self.keys.read().unwrap_or_else(|e| e.into_inner());
        if !keys.complete || keys.filter.is_saturated() {
            return Ok(false);
        }
        let tmp = dir.join(KEY_FILTER_TMP);
        let file = dir.join(KEY_FILTER_FILE);
        let io = |op: &'static str, p: &Path, e: std::io::Error| Error::io(p, op, e);
        let f = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(|e| io("open", &tmp, e))?;
        // Written a piece at a time: a filter still in the file it was taken from is
        // copied with reads, not brought into memory.
        let mut w = std::io::BufWriter::with_capacity(64 << 10, f);
        let mut crc = crc32fast::Hasher::new();
        let mut put = |b: &[u8]| {
            crc.update(b);
            w.write_all(b)
        };
        let head = [
            &MAGIC[..],
            &FILE_VERSION.to_be_bytes(),
            &(fingerprint.len() as u32).to_be_bytes(),
            &fingerprint,
        ];
        for b in head {
            put(b).map_err(|e| io("write", &tmp, e))?;
        }
        let saved = keys
            .filter
            .encode_to(&mut put)
            .map_err(|e| io("write", &tmp, e))?;
        drop(keys);
        if !saved {
            return Ok(false);
        }
        w.write_all(&crc.finalize().to_be_bytes())
            .map_err(|e| io("write", &tmp, e))?;
        let f = w
            .into_inner()
            .map_err(|e| io("write", &tmp, e.into_error()))?;
        // Not needed for safety (the checksum and the fingerprint refuse a file the
        // rename made visible before its bytes), only so a crash does not waste it.
        f.sync_all().map_err(|e| io("fsync", &tmp, e))?;
        std::fs::rename(&tmp, &file).map_err(|e| io("rename", &file, e))?;
        Ok(true)
    }

    /// Takes the saved key filter (the file is removed in any case): the filter, if the
    /// file is whole and was written beside sled's present state. Reported as the reason
    /// it was not used otherwise; `Ok(None)` when there is no file.
    ///
    /// The file is checked whole through reads (the page cache, not this process's
    /// memory) and then mapped: the filter's blocks stay in the file, and a lookup
    /// brings in only its page (an owner open that reads or writes little no longer
    /// holds a filter that grows with the index; an insert copies the filter it goes
    /// into).
    pub(super) fn take_key_filter(&self) -> Result<Option<KeyFilter>, String> {
        let Some(dir) = &self.path else {
            return Ok(None);
        };
        let file = dir.join(KEY_FILTER_FILE);
        let _ = std::fs::remove_file(dir.join(KEY_FILTER_TMP));
        let mapped = match map_checked(&file) {
            Ok(Some(m)) => m,
            Ok(None) => return Ok(None),
            Err(e) => {
                let _ = std::fs::remove_file(&file);
                return Err(e);
            }
        };
        // Removed before it is used: should the removal fail, the file is not used
        // (an open that writes to sled must leave no file of the state before). The
        // map keeps the removed file's bytes.
        std::fs::remove_file(&file).map_err(|e| format!("removing {}: {e}", file.display()))?;
        let at =
            |offset: usize, what: &str| format!("{} at offset {offset}: {what}", file.display());
        let body_len = mapped.map.len() - 4;
        let body = &mapped.map[..body_len];
        if body.get(..8) != Some(&MAGIC[..]) {
            return Err(at(0, "not a key filter file"));
        }
        let mut r = &body[8..];
        let version = take_u32(&mut r).ok_or_else(|| at(8, "truncated"))?;
        if version != FILE_VERSION {
            return Err(at(8, &format!("format version {version}")));
        }
        let len = take_u32(&mut r).ok_or_else(|| at(12, "truncated"))?;
        if len > FINGERPRINT_BYTES_MAX || r.len() < len as usize {
            return Err(at(12, &format!("fingerprint of {len} bytes")));
        }
        let fingerprint = &r[..len as usize];
        let now = self.key_fingerprint().map_err(|e| e.to_string())?;
        if fingerprint != now {
            return Err(at(16, "written beside another state of the index"));
        }
        let start = 16 + len as usize;
        KeyFilter::decode_mapped(Arc::new(mapped), start, body_len)
            .map(Some)
            .map_err(|e| at(start, &e))
    }
}

/// The file mapped, once its size is within [`KEY_FILE_BYTES_MAX`] and the CRC at its
/// end holds for the bytes before it (read in chunks, not through the map); `None` if
/// there is no file.
fn map_checked(file: &Path) -> Result<Option<FilterFile>, String> {
    use crate::vfs::{OpenMode, Vfs};
    let err = |e: std::io::Error| format!("{}: {e}", file.display());
    // One open file for the check and the map: a rename over the name meanwhile
    // changes neither (spool never writes the file in place).
    let f = match crate::vfs::OsVfs.open(file, OpenMode::Read) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(err(e)),
    };
    let len = f.len().map_err(err)?;
    if len > KEY_FILE_BYTES_MAX {
        return Err(format!(
            "{}: {len} bytes, over the {KEY_FILE_BYTES_MAX}-byte limit",
            file.display()
        ));
    }
    if len < 4 {
        return Err(format!("{} at offset 0: too short", file.display()));
    }
    let mut crc = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 64 << 10];
    let mut at = 0u64;
    while at < len - 4 {
        let n = ((len - 4 - at) as usize).min(buf.len());
        f.read_at(&mut buf[..n], at).map_err(err)?;
        crc.update(&buf[..n]);
        at += n as u64;
    }
    let mut stored = [0u8; 4];
    f.read_at(&mut stored, len - 4).map_err(err)?;
    if crc.finalize().to_be_bytes() != stored {
        return Err(format!(
            "{} at offset {}: checksum mismatch",
            file.display(),
            len - 4
        ));
    }
    let map = f.map().map_err(err)?;
    if map.len() as u64 != len {
        return Err(format!("{}: changed while read", file.display()));
    }
    Ok(Some(FilterFile { map, file: Some(f) }))
}
