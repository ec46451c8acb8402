//! The key layout of the engine's own entries in sled: stream heads, version blocks
//! (stream + version -> position, seq and commit id, 64 versions a key) and the
//! namespaced keys of registered indexers and of the cache.

use super::*;

/// Longest joined key [`with_joined`] builds on the stack (longer ones are allocated).
pub(super) const JOINED_KEY_STACK_BYTES: usize = 256;

/// Calls `f` with the concatenation of `parts`, built on the stack when it is short (a
/// point read needs the full key only for its lookups, so it need not allocate).
pub(super) fn with_joined<R>(parts: &[&[u8]], f: impl FnOnce(&[u8]) -> R) -> R {
    let n: usize = parts.iter().map(|p| p.len()).sum();
    if n <= JOINED_KEY_STACK_BYTES {
        let mut buf = [0u8; JOINED_KEY_STACK_BYTES];
        let mut at = 0;
        for p in parts {
            buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        f(&buf[..n])
    } else {
        f(&parts.concat())
    }
}

pub(super) fn user_prefix(ns: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(2 + ns.len());
    p.push(USER);
    p.push(ns.len().min(255) as u8);
    p.extend_from_slice(ns.as_bytes());
    p
}

/// Length of [`user_prefix`]`(ns)`.
pub(super) fn user_prefix_len(ns: &str) -> usize {
    2 + ns.len()
}

/// `key` in indexer `ns`'s namespace.
pub(super) fn user_key(ns: &str, key: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(user_prefix_len(ns) + key.len());
    k.push(USER);
    k.push(ns.len().min(255) as u8);
    k.extend_from_slice(ns.as_bytes());
    k.extend_from_slice(key);
    k
}

pub(super) fn cache_prefix(ns: &str) -> Vec<u8> {
    let mut p = Vec::with_capacity(1 + ns.len());
    p.push(ns.len().min(255) as u8);
    p.extend_from_slice(ns.as_bytes());
    p
}

pub(crate) fn head_key(stream: &str) -> Vec<u8> {
    let mut k = HEAD.to_vec();
    k.extend_from_slice(stream.as_bytes());
    k
}

/// Stream versions per position block: one sled entry holds the positions of
/// `VERSIONS_PER_BLOCK` consecutive versions, so a busy stream costs sled one key write
/// per block instead of one per commit.
pub const VERSIONS_PER_BLOCK: u64 = 64;
/// Bytes per version in a block: position (16) + seq (8) + commit id (16). The commit
/// ids here are the only place the index keeps them: an idempotent retry is found by
/// scanning its stream's blocks (see `Store::append`).
pub(super) const BLOCK_ENTRY_BYTES: usize = 40;

/// Key of the block holding `version` (1-based) of `stream`.
pub(crate) fn version_block_key(stream: &str, version: u64) -> Vec<u8> {
    let mut k = Vec::with_capacity(VERSION.len() + 1 + stream.len() + 8);
    write_version_block_key(&mut k, stream, version);
    k
}

/// [`version_block_key`] into a reused buffer.
pub(super) fn write_version_block_key(k: &mut Vec<u8>, stream: &str, version: u64) {
    k.clear();
    k.extend_from_slice(VERSION);
    k.push(stream.len() as u8);
    k.extend_from_slice(stream.as_bytes());
    k.extend_from_slice(&(version.saturating_sub(1) / VERSIONS_PER_BLOCK).to_be_bytes());
}

/// One version's entry in a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BlockEntry {
    pub position: LogPosition,
    pub seq: u64,
    pub commit_id: Uuid,
}

impl BlockEntry {
    /// An all-zero entry: a version GC removed (a stream prefix).
    pub(super) fn is_hole(&self) -> bool {
        self.position.offset == 0
    }
}

pub(super) fn encode_block_entry(i: &CommitInfo) -> [u8; BLOCK_ENTRY_BYTES] {
    let mut e = [0u8; BLOCK_ENTRY_BYTES];
    e[..16].copy_from_slice(&i.position.to_bytes());
    e[16..24].copy_from_slice(&i.seq.to_be_bytes());
    e[24..].copy_from_slice(i.commit_id.as_bytes());
    e
}

/// Entry `i` of a block.
pub(super) fn block_entry(block: &[u8], i: usize) -> Option<Result<BlockEntry, IndexError>> {
    let e = block.get(i * BLOCK_ENTRY_BYTES..(i + 1) * BLOCK_ENTRY_BYTES)?;
    let id: Option<[u8; 16]> = e[24..].try_into().ok();
    Some(
        match (LogPosition::from_bytes(&e[..16]), be_u64(&e[16..24]), id) {
            (Some(position), Some(seq), Some(id)) => Ok(BlockEntry {
                position,
                seq,
                commit_id: Uuid::from_bytes(id),
            }),
            _ => Err(IndexError::Malformed("stream version block".into())),
        },
    )
}

/// The head of a stream as the index records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamHead {
    pub version: u64,
    pub seq: u64,
    pub position: LogPosition,
}

pub(super) fn encode_head(i: &CommitInfo) -> [u8; 32] {
    let mut b = [0u8; 32];
    b[..8].copy_from_slice(&i.version.to_be_bytes());
    b[8..16].copy_from_slice(&i.seq.to_be_bytes());
    b[16..].copy_from_slice(&i.position.to_bytes());
    b
}

pub(super) fn be_u64(b: &[u8]) -> Option<u64> {
    let a: [u8; 8] = b.get(..8)?.try_into().ok()?;
    Some(u64::from_be_bytes(a))
}

pub(super) fn decode_head(b: &[u8]) -> Result<StreamHead, IndexError> {
    let bad = || IndexError::Malformed(format!("stream head of {} bytes", b.len()));
    if b.len() != 32 {
        return Err(bad());
    }
    Ok(StreamHead {
        version: be_u64(&b[..8]).ok_or_else(bad)?,
        seq: be_u64(&b[8..16]).ok_or_else(bad)?,
        position: LogPosition::from_bytes(&b[16..]).ok_or_else(bad)?,
    })
}
