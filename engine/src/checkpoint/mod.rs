//! Checkpoints: immutable, checksummed, sorted dumps of the whole index (the engine's
//! keys and every indexer's, not the cache) as of the end of one record of the log.
//!
//! A checkpoint lets a read-only open (which cannot open the owner's sled: sled locks
//! it) read the index from a plain file instead of rebuilding it from the whole log:
//! it checks the checkpoint against the log (layout, indexers, and that the log holds
//! the record it names at the position it names), then folds only the records after
//! that position into a memtable layered over the file. Any mismatch means the old
//! path (the whole log into a temporary index), never a wrong answer. The owner's
//! open uses the same checks to read only the log after the checkpoint when its
//! sled already holds the checkpoint's commits.
//!
//! [`format`] is the byte layout (docs/format.md has it byte by byte), [`block_index`]
//! the two-level index of a file's blocks, [`write`] writes
//! one crash-safely (temporary name, fsync, rename, directory fsync), [`read`] opens
//! and validates one and serves point and range reads from its blocks with `pread`.

pub(crate) mod block_index;
pub(crate) mod format;
mod owner;
pub(crate) mod read;
pub(crate) mod write;

pub(crate) use self::format::SegmentEnd;
pub(crate) use self::owner::Shared;
pub(crate) use self::read::{CheckpointFile, CheckpointIter};

/// Opens the checkpoint `id` names in the store directory `dir` (an owner's sled is a
/// delta over it, see `index/delta.rs`), or says why it cannot be used: missing,
/// damaged, of another index format, or another checkpoint under its name.
pub(crate) fn open_base(
    vfs: &dyn crate::vfs::Vfs,
    dir: &std::path::Path,
    id: &crate::index::BaseId,
) -> Result<CheckpointFile, String> {
    let path = dir.join(CHECKPOINT_DIR).join(write::file_name(id.seq));
    let ck = CheckpointFile::open(vfs, &path)?;
    if ck.header.index_format != crate::index::INDEX_FORMAT_VERSION || !id.names(&ck) {
        return Err(format!(
            "{} is not the checkpoint the index is a delta over",
            path.display()
        ));
    }
    Ok(ck)
}

/// Directory of the checkpoint files, in the store directory.
pub const CHECKPOINT_DIR: &str = "checkpoints";

/// The owner writes a checkpoint in the background after a move of the index into
/// sled once at least this many commits, or an eighth of the log's commits if that is
/// more, were applied since the last one (and on every clean close). A read-only open
/// folds at most that many commits (plus what arrived since the last move) from the
/// log; the eighth bounds the rewrite cost to a constant share of the appends.
pub const CHECKPOINT_COMMITS_MIN_DEFAULT: u64 = 65_536;
