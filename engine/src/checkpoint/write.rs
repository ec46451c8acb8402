//! Writing a checkpoint: the entries in key order into blocks, then the block index and
//! the footer, the header last (it holds the entry count); under a temporary name,
//! fsynced, renamed into place and the directory fsynced; then older checkpoints go.
//! A reader that has an older one open keeps reading it (an unlinked open file stays
//! readable).

use super::block_index::{BlockRef, TwoLevelWriter};
use super::format::{self, Footer, Header};
use super::CHECKPOINT_DIR;
use crate::error::Error;
use crate::vfs::{OpenMode, Vfs, VfsFile};
use std::path::{Path, PathBuf};

/// The file name of the checkpoint at `seq`: fixed-width hex, so names sort by seq.
pub(crate) fn file_name(seq: u64) -> String {
    format!("{seq:016x}.ckpt")
}

/// The seq a checkpoint file name stands for (`None`: not a checkpoint's name).
pub(crate) fn parse_file_name(name: &str) -> Option<u64> {
    let hex = name.strip_suffix(".ckpt")?;
    if hex.len() != 16 || !hex.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    u64::from_str_radix(hex, 16).ok()
}

const TEMP_SUFFIX: &str = ".tmp";

/// Write the checkpoint of `entries` (in strictly increasing key order) described by
/// `header` into `dir/checkpoints/`, then remove the older ones but the one at seq
/// `keep` (the owner's base; 0: none). Returns its path.
pub(crate) fn write_checkpoint<E: std::fmt::Display>(
    vfs: &dyn Vfs,
    dir: &Path,
    mut header: Header,
    entries: impl Iterator<Item = Result<(impl AsRef<[u8]>, impl AsRef<[u8]>), E>>,
    keep: u64,
) -> Result<PathBuf, Error> {
    let cdir = dir.join(CHECKPOINT_DIR);
    let existed = vfs
        .exists(&cdir)
        .map_err(|e| Error::io(&cdir, "exists", e))?;
    if !existed {
        vfs.create_dir_all(&cdir)
            .map_err(|e| Error::io(&cdir, "create_dir_all", e))?;
        vfs.sync_dir(dir)
            .map_err(|e| Error::io(dir, "sync_dir", e))?;
    }
    let name = file_name(header.seq);
    let path = cdir.join(&name);
    let tmp = cdir.join(format!("{name}{TEMP_SUFFIX}"));
    if vfs.exists(&tmp).map_err(|e| Error::io(&tmp, "exists", e))? {
        vfs.remove(&tmp).map_err(|e| Error::io(&tmp, "remove", e))?;
    }
    let file = vfs
        .open(&tmp, OpenMode::CreateNew)
        .map_err(|e| Error::io(&tmp, "create", e))?;
    let written = write_body(&*file, &tmp, &mut header, entries);
    let synced = written.and_then(|()| file.sync_all().map_err(|e| Error::io(&tmp, "sync_all", e)));
    drop(file);
    if let Err(e) = synced {
        let _ = vfs.remove(&tmp);
        return Err(e);
    }
    vfs.rename(&tmp, &path)
        .map_err(|e| Error::io(&tmp, "rename", e))?;
    vfs.sync_dir(&cdir)
        .map_err(|e| Error::io(&cdir, "sync_dir", e))?;
    // The new one is durable: the older ones (and leftovers of interrupted writes) go.
    if let Ok(names) = vfs.read_dir(&cdir) {
        for n in names {
            let old = parse_file_name(&n).is_some_and(|s| s < header.seq && s != keep);
            let stray = n.ends_with(TEMP_SUFFIX) && n != format!("{name}{TEMP_SUFFIX}");
            if old || stray {
                let _ = vfs.remove(&cdir.join(&n));
            }
        }
        let _ = vfs.sync_dir(&cdir);
    }
    Ok(path)
}

/// Write `entries` (in strictly increasing key order) at `path` in the checkpoint
/// format, replacing any file there, without syncing it: an index's spill run (see
/// `index/spill.rs`), which no crash leaves in use.
pub(crate) fn write_unsynced<E: std::fmt::Display>(
    vfs: &dyn Vfs,
    path: &Path,
    mut header: Header,
    entries: impl Iterator<Item = Result<(impl AsRef<[u8]>, impl AsRef<[u8]>), E>>,
) -> Result<(), Error> {
    if vfs.exists(path).map_err(|e| Error::io(path, "exists", e))? {
        vfs.remove(path).map_err(|e| Error::io(path, "remove", e))?;
    }
    let file = vfs
        .open(path, OpenMode::CreateNew)
        .map_err(|e| Error::io(path, "create", e))?;
    let written = write_body(&*file, path, &mut header, entries);
    drop(file);
    if written.is_err() {
        let _ = vfs.remove(path);
    }
    written
}

fn write_body<E: std::fmt::Display>(
    file: &dyn VfsFile,
    path: &Path,
    header: &mut Header,
    entries: impl Iterator<Item = Result<(impl AsRef<[u8]>, impl AsRef<[u8]>), E>>,
) -> Result<(), Error> {
    let write = |b: &[u8], at: u64| {
        file.write_at(b, at)
            .map_err(|e| Error::io(path, "write_at", e))
    };
    header.entries = 0;
    let header_len = header.encode().len() as u64;
    let mut at = header_len;
    let mut blocks = TwoLevelWriter::default();
    let mut block: Vec<u8> = Vec::with_capacity(format::BLOCK_BYTES_TARGET + 4096);
    let mut first_key: Option<Vec<u8>> = None;
    let mut prev: Option<Vec<u8>> = None;
    let mut count = 0u64;
    let mut finish = |block: &mut Vec<u8>, first: &mut Option<Vec<u8>>, at: &mut u64| {
        let Some(first_key) = first.take() else {
            return Ok(());
        };
        let c = format::crc(block);
        block.extend_from_slice(&c.to_le_bytes());
        if block.len() as u64 > format::BLOCK_BYTES_MAX {
            return Err(Error::InvalidInput(format!(
                "an index entry too large for a checkpoint block ({} bytes)",
                block.len()
            )));
        }
        write(block, *at)?;
        blocks.push(BlockRef {
            first_key,
            offset: *at,
            len: block.len() as u32,
        });
        *at += block.len() as u64;
        block.clear();
        Ok::<(), Error>(())
    };
    for kv in entries {
        let (k, v) = kv.map_err(|e| {
            Error::Index(crate::error::IndexError::Malformed(format!(
                "reading the index for a checkpoint: {e}"
            )))
        })?;
        let (k, v) = (k.as_ref(), v.as_ref());
        if prev.as_deref().is_some_and(|p| p >= k) {
            return Err(Error::Index(crate::error::IndexError::Malformed(
                "index keys out of order while writing a checkpoint".into(),
            )));
        }
        prev = Some(k.to_vec());
        if first_key.is_none() {
            first_key = Some(k.to_vec());
        }
        format::push_entry(&mut block, k, v);
        count += 1;
        if block.len() >= format::BLOCK_BYTES_TARGET {
            finish(&mut block, &mut first_key, &mut at)?;
        }
    }
    finish(&mut block, &mut first_key, &mut at)?;
    let (chunks, top) = blocks.finish(at);
    write(&chunks, at)?;
    let index_offset = at + chunks.len() as u64;
    write(&top, index_offset)?;
    let footer = Footer {
        index_offset,
        index_len: top.len() as u64,
        index_crc: format::crc(&top),
    };
    write(&footer.encode(), index_offset + top.len() as u64)?;
    header.entries = count;
    let h = header.encode();
    debug_assert_eq!(h.len() as u64, header_len);
    write(&h, 0)
}
