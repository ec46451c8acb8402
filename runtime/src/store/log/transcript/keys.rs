//! Keys of the transcript index: the tag bytes and the functions that build
//! each key (`m`, `e`, `c`, `n`, `t`, `T`, `a`, `l`; the `E` seed and `p`
//! path keys are built next to their values). Keys only: nothing here reads
//! or writes the index. The key layout is in docs/format.md, "Indexer
//! `transcript`".

use crate::transcript::EntryId;

/// Name of the engine indexer that keeps transcripts.
pub const TRANSCRIPT_INDEXER: &str = "transcript";

/// Version of the transcript index layout; bumping it rebuilds the index.
pub const TRANSCRIPT_INDEX_VERSION: u32 = 9;

const TAG_META: u8 = b'm';

pub(super) const TAG_ENTRY: u8 = b'e';

pub(super) const TAG_CHILD: u8 = b'c';

pub(super) const TAG_COUNT: u8 = b'n';

const TAG_CUSTOM: u8 = b't';

const TAG_CUSTOM_NEXT: u8 = b'T';

const TAG_CUSTOM_ALL: u8 = b'a';

const TAG_LABEL: u8 = b'l';

pub(super) const TAG_PATH: u8 = b'p';

pub(super) const TAG_SEED: u8 = b'E';

/// Every per-entry tag (what a clear or purge removes).
pub(super) const ENTRY_TAGS: [u8; 9] = [
    TAG_ENTRY,
    TAG_SEED,
    TAG_CHILD,
    TAG_COUNT,
    TAG_CUSTOM,
    TAG_CUSTOM_NEXT,
    TAG_CUSTOM_ALL,
    TAG_LABEL,
    TAG_PATH,
];

pub(super) fn sk(tag: u8, sid: &str) -> Vec<u8> {
    // Session ids are at most 128 bytes (SESSION_ID_LEN_MAX).
    let mut k = Vec::with_capacity(2 + sid.len() + 16);
    k.push(tag);
    k.push(sid.len().min(255) as u8);
    k.extend_from_slice(sid.as_bytes());
    k
}

pub(super) fn meta_key(sid: &str) -> Vec<u8> {
    sk(TAG_META, sid)
}

pub(super) fn entry_key(sid: &str, id: &EntryId) -> Vec<u8> {
    let mut k = sk(TAG_ENTRY, sid);
    k.extend_from_slice(id.as_bytes());
    k
}

pub(super) fn child_prefix(sid: &str, parent: &EntryId) -> Vec<u8> {
    // Entry ids are at most 128 bytes (ENTRY_ID_LEN_MAX).
    let mut k = sk(TAG_CHILD, sid);
    k.push(parent.as_bytes().len().min(255) as u8);
    k.extend_from_slice(parent.as_bytes());
    k
}

pub(super) fn child_key(sid: &str, parent: &EntryId, seq: u64) -> Vec<u8> {
    let mut k = child_prefix(sid, parent);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}

pub(super) fn count_key(sid: &str, parent: &EntryId) -> Vec<u8> {
    let mut k = sk(TAG_COUNT, sid);
    k.extend_from_slice(parent.as_bytes());
    k
}

fn custom_prefix(sid: &str, custom_type: &str) -> Vec<u8> {
    let mut k = sk(TAG_CUSTOM, sid);
    let len = u32::try_from(custom_type.len()).unwrap_or(u32::MAX);
    k.extend_from_slice(&len.to_be_bytes());
    k.extend_from_slice(custom_type.as_bytes());
    k
}

pub(super) fn custom_key(sid: &str, custom_type: &str, ordinal: u64) -> Vec<u8> {
    let mut k = custom_prefix(sid, custom_type);
    k.extend_from_slice(&ordinal.to_be_bytes());
    k
}

pub(super) fn custom_next_key(sid: &str, custom_type: &str) -> Vec<u8> {
    let mut k = sk(TAG_CUSTOM_NEXT, sid);
    k.extend_from_slice(custom_type.as_bytes());
    k
}

pub(super) fn custom_all_key(sid: &str, ordinal: u64) -> Vec<u8> {
    let mut k = sk(TAG_CUSTOM_ALL, sid);
    k.extend_from_slice(&ordinal.to_be_bytes());
    k
}

pub(super) fn label_prefix(sid: &str, target: &EntryId) -> Vec<u8> {
    let mut k = sk(TAG_LABEL, sid);
    k.push(target.as_bytes().len().min(255) as u8);
    k.extend_from_slice(target.as_bytes());
    k
}

pub(super) fn label_key(sid: &str, target: &EntryId, seq: u64) -> Vec<u8> {
    let mut k = label_prefix(sid, target);
    k.extend_from_slice(&seq.to_be_bytes());
    k
}
