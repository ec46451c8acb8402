//! The active path (`p` keys): the root→leaf path of the current leaf in
//! blocks of 64 depths, the encoding of a block and its links, and
//! [`PathBlocks`], through which the indexer reads, changes and writes
//! whole blocks. The byte layout is in docs/format.md, "Indexer
//! `transcript`".

use spool_engine::{IndexBatch, IndexError, LogPosition};

use super::keys::{sk, TAG_PATH};
use super::record::{EntryKey, EntryRecord};
use crate::store::log::common::be_u64;
use crate::transcript::EntryId;
use crate::transcript::ENTRY_ID_LEN_MAX;

/// Depths of the active path are grouped in blocks of
/// [`PATH_BLOCK_DEPTHS`] under one `p` key each; keys sort by block, so a
/// root-first page (a depth range) is one `get` or one short range scan.
const PATH_BLOCK_BITS: u32 = 6;

/// Depths per `p` block (`1 << PATH_BLOCK_BITS`).
pub(super) const PATH_BLOCK_DEPTHS: u64 = 1 << PATH_BLOCK_BITS;

/// The block holding `depth`, and the depth's slot in it.
pub(super) fn path_slot(depth: u64) -> (u64, usize) {
    // The slot is below PATH_BLOCK_DEPTHS (64): it fits any usize.
    (
        depth >> PATH_BLOCK_BITS,
        (depth & (PATH_BLOCK_DEPTHS - 1)) as usize,
    )
}

/// The `p` key of one block of depths: u64 BE `depth >> PATH_BLOCK_BITS`.
pub(super) fn path_block_key(sid: &str, block: u64) -> Vec<u8> {
    let mut k = sk(TAG_PATH, sid);
    k.extend_from_slice(&block.to_be_bytes());
    k
}

/// Bytes of a path link before the entry id.
const PATH_LINK_HEADER: usize = 8 + 8 + 4 + 4 + 8 + 1;

/// Most bytes of one path link: the header, an entry id and an orphan's
/// parent id (each at most [`ENTRY_ID_LEN_MAX`] bytes).
const PATH_LINK_BYTES_MAX: usize = PATH_LINK_HEADER + 2 * ENTRY_ID_LEN_MAX;

/// Bytes of a link's length prefix in a block value (u16 BE).
const PATH_LINK_LEN_BYTES: usize = 2;

/// Most bytes of one `p` block value: [`PATH_BLOCK_DEPTHS`] links, each
/// with its length prefix (18,624 bytes). A longer value is damaged.
const PATH_BLOCK_BYTES_MAX: usize =
    PATH_BLOCK_DEPTHS as usize * (PATH_LINK_LEN_BYTES + PATH_LINK_BYTES_MAX);

/// The path link of an entry on the active path: where its bytes are in
/// the log, its size, its id and, only for an orphan at depth 0 (a parent
/// the index does not know), that parent's id; a root-first page is
/// answered from these links alone (the parent of the entry at depth
/// `d > 0` is the entry at `d - 1`). The link and block layouts are in
/// docs/format.md, "Indexer `transcript`", active-path block.
pub(super) fn path_value(id: &EntryId, r: &EntryRecord) -> Vec<u8> {
    let key = (
        LogPosition {
            segment: r.segment,
            offset: r.offset,
        },
        r.event,
        r.sub,
    );
    let orphan_parent = match (r.facts.depth, &r.parent) {
        (0, Some(p)) => Some(p),
        _ => None,
    };
    encode_path_link(key, r.size, id, orphan_parent)
}

/// The bytes of one path link ([`path_value`]'s layout; the inverse of
/// [`decode_path_link`]).
pub(super) fn encode_path_link(
    key: EntryKey,
    size: u64,
    id: &EntryId,
    orphan_parent: Option<&EntryId>,
) -> Vec<u8> {
    let (position, event, sub) = key;
    let mut v = Vec::with_capacity(PATH_LINK_HEADER + 2 * id.as_bytes().len());
    v.extend_from_slice(&position.segment.to_be_bytes());
    v.extend_from_slice(&position.offset.to_be_bytes());
    v.extend_from_slice(&event.to_be_bytes());
    v.extend_from_slice(&sub.to_be_bytes());
    v.extend_from_slice(&size.to_be_bytes());
    // Entry ids are at most 128 bytes (ENTRY_ID_LEN_MAX).
    v.push(id.as_bytes().len().min(255) as u8);
    v.extend_from_slice(id.as_bytes());
    if let Some(p) = orphan_parent {
        v.extend_from_slice(p.as_bytes());
    }
    debug_assert!(v.len() <= PATH_LINK_BYTES_MAX);
    v
}

/// Appends `link` to a block value, after its u16 BE length.
fn push_block_link(block: &mut Vec<u8>, link: &[u8]) {
    // A link is at most PATH_LINK_BYTES_MAX (289) bytes: its length fits.
    debug_assert!(link.len() <= PATH_LINK_BYTES_MAX);
    block.extend_from_slice(&(link.len().min(usize::from(u16::MAX)) as u16).to_be_bytes());
    block.extend_from_slice(link);
}

/// A block value's links in depth order; a malformed value yields one
/// `Err` with the slot of the first link it cannot take (a length past
/// the end, a length outside a link's bounds, more than
/// [`PATH_BLOCK_DEPTHS`] links) and ends.
pub(super) struct BlockLinks<'a> {
    rest: &'a [u8],
    slot: usize,
    failed: bool,
}

pub(super) fn block_links(v: &[u8]) -> BlockLinks<'_> {
    BlockLinks {
        rest: v,
        slot: 0,
        failed: v.len() > PATH_BLOCK_BYTES_MAX,
    }
}

impl<'a> Iterator for BlockLinks<'a> {
    /// The link, or the slot where the value is malformed.
    type Item = Result<&'a [u8], usize>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed {
            // Reported once, then the iteration ends.
            self.failed = false;
            self.rest = &[];
            return Some(Err(self.slot));
        }
        if self.rest.is_empty() {
            return None;
        }
        let link = match self.rest {
            [a, b, rest @ ..] if self.slot < PATH_BLOCK_DEPTHS as usize => {
                let n = usize::from(u16::from_be_bytes([*a, *b]));
                if (PATH_LINK_HEADER..=PATH_LINK_BYTES_MAX).contains(&n) {
                    rest.split_at_checked(n)
                } else {
                    None
                }
            }
            _ => None,
        };
        match link {
            Some((link, rest)) => {
                self.rest = rest;
                self.slot += 1;
                Some(Ok(link))
            }
            None => {
                self.rest = &[];
                Some(Err(self.slot))
            }
        }
    }
}

/// The link at `slot` of a block value (`None` past its links), the
/// whole value checked to be well formed (`Err`: the first bad slot).
pub(super) fn block_link(v: &[u8], slot: usize) -> Result<Option<&[u8]>, usize> {
    let mut found = None;
    for (i, link) in block_links(v).enumerate() {
        let link = link?;
        if i == slot {
            found = Some(link);
        }
    }
    Ok(found)
}

/// The typed error of a damaged active-path block (or one that disagrees
/// with the session's path length): names the session and the depth.
pub(super) fn path_damage(sid: &str, depth: u64, what: &str) -> IndexError {
    IndexError::Malformed(format!(
        "transcript active path of session {sid}, depth {depth}: {what}"
    ))
}

/// A block's links, owned (for writers), checked to be well formed.
pub(super) fn decode_block(
    sid: &str,
    block: u64,
    v: &[u8],
) -> Result<Vec<Option<Vec<u8>>>, IndexError> {
    let base = block.saturating_mul(PATH_BLOCK_DEPTHS);
    block_links(v)
        .map(|l| match l {
            Ok(link) => Ok(Some(link.to_vec())),
            Err(slot) => Err(path_damage(
                sid,
                base.saturating_add(slot as u64),
                "malformed block value",
            )),
        })
        .collect()
}

/// The number of links of a block value (checked to be well formed).
pub(super) fn block_len(sid: &str, block: u64, v: &[u8]) -> Result<u64, IndexError> {
    let mut n = 0u64;
    for l in block_links(v) {
        if let Err(slot) = l {
            let depth = block
                .saturating_mul(PATH_BLOCK_DEPTHS)
                .saturating_add(slot as u64);
            return Err(path_damage(sid, depth, "malformed block value"));
        }
        n += 1;
    }
    Ok(n)
}

/// Adds the link of the new leaf at `depth`, the path's length before it
/// (an append under the leaf): only the last block is rewritten (the
/// index's memtable keeps the latest value of a key, so repeated appends
/// into one block coalesce before they reach sled), and extended in place
/// when an earlier commit of the same group wrote it (an import appends a
/// session's commits in groups, and copying the block out and back for
/// each was a visible part of its indexing: BENCHMARKS.md, Decisions).
/// The block must hold exactly the depths before `depth`.
pub(super) fn append_path_link(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    depth: u64,
    link: &[u8],
) -> Result<(), IndexError> {
    let (block, slot) = path_slot(depth);
    let key = path_block_key(sid, block);
    if slot != 0 {
        if let Some(v) = batch.pending_mut(&key) {
            // Written by an earlier commit of this group: read and checked
            // then (or begun empty), and one link longer per append since.
            debug_assert_eq!(block_len(sid, block, v).ok(), Some(slot as u64));
            push_block_link(v, link);
            return Ok(());
        }
    }
    let mut v = if slot == 0 {
        // A new block: nothing to read.
        Vec::with_capacity(PATH_LINK_LEN_BYTES + link.len())
    } else {
        let v = batch.get(&key)?.unwrap_or_default();
        let n = block_len(sid, block, &v)?;
        if n != slot as u64 {
            return Err(path_damage(
                sid,
                depth,
                &format!("the block holds {n} depths, the path's length says {slot}"),
            ));
        }
        v
    };
    push_block_link(&mut v, link);
    batch.insert_vec(&key, v);
    Ok(())
}

/// Writes the active path of a session without `p` keys (a cleared one)
/// from its links in depth order (depth 0 first): one key per block.
pub(super) fn write_path_blocks<'v>(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    links: impl Iterator<Item = &'v [u8]>,
) {
    let mut block = 0u64;
    let mut v: Vec<u8> = Vec::new();
    let mut n = 0u64;
    for link in links {
        push_block_link(&mut v, link);
        n += 1;
        if n == PATH_BLOCK_DEPTHS {
            batch.insert(&path_block_key(sid, block), &v);
            v.clear();
            n = 0;
            block += 1;
        }
    }
    if n > 0 {
        batch.insert(&path_block_key(sid, block), &v);
    }
}

/// A block's links by slot (`None`: a depth not set yet), and whether
/// the event changed the block.
type LoadedBlock = (Vec<Option<Vec<u8>>>, bool);

/// The active path's blocks one index event changes: each read and
/// decoded once, changed in memory, written back once by
/// [`PathBlocks::finish`]. Before the event the blocks hold exactly the
/// depths `0..old_len`; a depth not yet written by the event is `None`.
pub(super) struct PathBlocks<'s> {
    sid: &'s str,
    old_len: u64,
    /// Block → its links by slot, and whether the event changed it.
    blocks: std::collections::BTreeMap<u64, LoadedBlock>,
}

impl<'s> PathBlocks<'s> {
    pub(super) fn new(sid: &'s str, old_len: u64) -> Self {
        PathBlocks {
            sid,
            old_len,
            blocks: std::collections::BTreeMap::new(),
        }
    }

    fn load(&mut self, batch: &IndexBatch<'_>, block: u64) -> Result<&mut LoadedBlock, IndexError> {
        let sid = self.sid;
        let old_len = self.old_len;
        match self.blocks.entry(block) {
            std::collections::btree_map::Entry::Occupied(e) => Ok(e.into_mut()),
            std::collections::btree_map::Entry::Vacant(e) => {
                let links = match batch.get(&path_block_key(sid, block))? {
                    Some(v) => decode_block(sid, block, &v)?,
                    None => Vec::new(),
                };
                // Exactly the depths `0..old_len` exist.
                let base = block.saturating_mul(PATH_BLOCK_DEPTHS);
                let want = old_len.saturating_sub(base).min(PATH_BLOCK_DEPTHS);
                if links.len() as u64 != want {
                    return Err(path_damage(
                        sid,
                        base.saturating_add(want.min(links.len() as u64)),
                        &format!(
                            "the block holds {} depths, the path's length says {want}",
                            links.len()
                        ),
                    ));
                }
                Ok(e.insert((links, false)))
            }
        }
    }

    /// The link at `depth`, `None` when the path does not reach it.
    pub(super) fn get(
        &mut self,
        batch: &IndexBatch<'_>,
        depth: u64,
    ) -> Result<Option<&[u8]>, IndexError> {
        let (block, slot) = path_slot(depth);
        let (links, _) = self.load(batch, block)?;
        Ok(links.get(slot).and_then(|l| l.as_deref()))
    }

    pub(super) fn set(
        &mut self,
        batch: &IndexBatch<'_>,
        depth: u64,
        link: Vec<u8>,
    ) -> Result<(), IndexError> {
        let (block, slot) = path_slot(depth);
        let (links, dirty) = self.load(batch, block)?;
        if links.len() <= slot {
            links.resize(slot + 1, None);
        }
        if let Some(l) = links.get_mut(slot) {
            *l = Some(link);
            *dirty = true;
        }
        Ok(())
    }

    /// Writes the changed blocks back for a path of `len` depths (every
    /// depth below `len` is set or was there before the event) and
    /// removes the blocks past it.
    pub(super) fn finish(mut self, batch: &mut IndexBatch<'_>, len: u64) -> Result<(), IndexError> {
        let sid = self.sid;
        let (kept_block, kept_slot) = path_slot(len);
        if len < self.old_len && kept_slot > 0 {
            // The last kept block loses its deeper depths.
            self.load(batch, kept_block)?;
        }
        // Blocks wholly past `len` that held depths go.
        let first_gone = kept_block.saturating_add(u64::from(kept_slot > 0));
        let old_blocks = self.old_len.div_ceil(PATH_BLOCK_DEPTHS);
        for block in first_gone..old_blocks {
            if !self.blocks.contains_key(&block) {
                batch.remove(&path_block_key(sid, block));
            }
        }
        for (block, (mut links, mut dirty)) in self.blocks {
            let base = block.saturating_mul(PATH_BLOCK_DEPTHS);
            // At most PATH_BLOCK_DEPTHS (64): fits any usize.
            let n = len.saturating_sub(base).min(PATH_BLOCK_DEPTHS) as usize;
            if n == 0 {
                if base < self.old_len {
                    batch.remove(&path_block_key(sid, block));
                }
                continue;
            }
            if let Some(slot) = (0..n).find(|&s| links.get(s).is_none_or(Option::is_none)) {
                return Err(path_damage(
                    sid,
                    base.saturating_add(slot as u64),
                    "a depth of the path has no link",
                ));
            }
            if n < links.len() {
                links.truncate(n);
                dirty = true;
            }
            if !dirty {
                continue;
            }
            let mut v = Vec::with_capacity(n * (PATH_LINK_LEN_BYTES + PATH_LINK_HEADER + 40));
            for l in links.iter().flatten() {
                push_block_link(&mut v, l);
            }
            batch.insert(&path_block_key(sid, block), &v);
        }
        Ok(())
    }
}

/// A decoded path link (see [`path_value`]).
#[derive(Debug)]
pub(super) struct PathLink {
    pub(super) id: EntryId,
    pub(super) key: EntryKey,
    pub(super) size: u64,
    pub(super) orphan_parent: Option<EntryId>,
}

pub(super) fn decode_path_link(v: &[u8]) -> Option<PathLink> {
    let segment = be_u64(v)?;
    let offset = be_u64(v.get(8..)?)?;
    let event = u32::from_be_bytes(v.get(16..20)?.try_into().ok()?);
    let sub = u32::from_be_bytes(v.get(20..24)?.try_into().ok()?);
    let size = be_u64(v.get(24..)?)?;
    let n = usize::from(*v.get(32)?);
    let id = v.get(PATH_LINK_HEADER..PATH_LINK_HEADER.checked_add(n)?)?;
    let id = EntryId::parse_bytes(id).ok()?;
    let rest = v.get(PATH_LINK_HEADER + n..)?;
    let orphan_parent = if rest.is_empty() {
        None
    } else {
        Some(EntryId::parse_bytes(rest).ok()?)
    };
    Some(PathLink {
        id,
        key: (LogPosition { segment, offset }, event, sub),
        size,
        orphan_parent,
    })
}

/// The entry id a path link names.
pub(super) fn path_link_id(v: &[u8]) -> Option<&[u8]> {
    let n = usize::from(*v.get(PATH_LINK_HEADER - 1)?);
    v.get(PATH_LINK_HEADER..PATH_LINK_HEADER.checked_add(n)?)
}

#[cfg(test)]
mod tests {
    use super::super::test_support::{
        append_n, check_path, open, seeded_created, session_event, user, writer_session,
    };
    use super::*;
    use std::sync::Arc;

    use spool_engine::{Indexer, RecordedCommit, Store};

    use super::super::indexer::TranscriptIndexer;
    use super::super::keys::{TRANSCRIPT_INDEXER, TRANSCRIPT_INDEX_VERSION};
    use super::super::read_meta;
    use super::super::source::LogTranscriptSource;
    use crate::handle::HandleOptions;
    use crate::session::{SessionEvent, SessionId};
    use crate::store::StoreError;
    use crate::store::TranscriptBackend;
    use crate::store::{LogStore, SessionStore};
    use crate::transcript::EntrySource;
    use crate::transcript::{CancelToken, ContentBlock, Message, ReadResult};
    use crate::transcript::{Entry, EntryKind};

    fn raw_event(key: &[u8], value: &[u8]) -> spool_engine::EventData {
        let mut payload = (key.len() as u16).to_be_bytes().to_vec();
        payload.extend_from_slice(key);
        payload.extend_from_slice(value);
        spool_engine::EventData::new("raw", payload)
    }

    /// Writes raw keys into the transcript index's namespace (events of
    /// kind `raw`: u16 BE key length, key, value) and indexes every
    /// commit as the transcript indexer does: damaged `p` blocks where
    /// readers and writers meet them.
    struct RawIndexer;

    impl Indexer for RawIndexer {
        fn name(&self) -> &'static str {
            TRANSCRIPT_INDEXER
        }

        fn version(&self) -> u32 {
            TRANSCRIPT_INDEX_VERSION
        }

        fn apply(
            &self,
            commit: &RecordedCommit,
            batch: &mut IndexBatch<'_>,
        ) -> Result<(), IndexError> {
            for ev in commit.events.iter().filter(|e| e.kind == "raw") {
                let n = usize::from(u16::from_be_bytes([ev.payload[0], ev.payload[1]]));
                batch.insert(&ev.payload[2..2 + n], &ev.payload[2 + n..]);
            }
            TranscriptIndexer::default().apply(commit, batch)
        }
    }

    fn path_blocks(store: &LogStore, id: &SessionId) -> Vec<(Vec<u8>, Vec<u8>)> {
        store
            .engine()
            .unwrap()
            .index()
            .scan_prefix(TRANSCRIPT_INDEXER, &sk(TAG_PATH, id.as_str()))
            .map(Result::unwrap)
            .collect()
    }

    #[test]
    fn the_active_path_index_follows_appends_moves_rewrites_and_rebuilds() {
        let dir = tempfile::tempdir().unwrap();
        let (id, fork_id, before) = {
            let (store, rt) = open(dir.path());
            let (id, h) = writer_session(&rt);
            // Linear appends: the O(1) path.
            let main = append_n(&h, 40, "m");
            check_path(&store, &id);
            // Back to a shallow entry, then a branch: the old path's
            // deeper keys go, the branch's come.
            h.move_leaf(Some(main[9].clone())).unwrap();
            assert_eq!(check_path(&store, &id).len(), 10);
            let side = append_n(&h, 5, "s");
            assert_eq!(check_path(&store, &id).len(), 15);
            // A leaf move back down the first branch: rewrite below the
            // common ancestor only.
            h.move_leaf(Some(main[35].clone())).unwrap();
            assert_eq!(check_path(&store, &id).len(), 36);
            // An append under a non-leaf entry (a branch by append).
            h.append_entry(Entry {
                id: EntryId::parse("x-under-side").unwrap(),
                parent_id: Some(side[2].clone()),
                timestamp_ms: 1,
                kind: user("under side"),
            })
            .unwrap();
            assert_eq!(check_path(&store, &id).len(), 14);
            // A new root.
            h.append_entry(Entry {
                id: EntryId::parse("x-root").unwrap(),
                parent_id: None,
                timestamp_ms: 2,
                kind: user("new root"),
            })
            .unwrap();
            assert_eq!(check_path(&store, &id).len(), 1);
            h.move_leaf(None).unwrap();
            assert_eq!(check_path(&store, &id).len(), 0);
            // A second child of main[39] (off the path below): the rewrite
            // below takes main[39] from two children to one and back.
            h.append_entry(Entry {
                id: EntryId::parse("x-beside").unwrap(),
                parent_id: Some(main[39].clone()),
                timestamp_ms: 3,
                kind: user("beside"),
            })
            .unwrap();
            assert_eq!(check_path(&store, &id).len(), 41);
            h.move_leaf(Some(main[39].clone())).unwrap();
            // A delta rewrite that relinks: an aborted assistant is removed
            // and the custom entry after it moves up one depth.
            h.append(EntryKind::Message {
                message: Message::Assistant {
                    content: vec![ContentBlock::text("aborted")],
                    stop_reason: crate::transcript::StopReason::Aborted,
                    usage: Default::default(),
                    model: None,
                    error_message: None,
                },
            })
            .unwrap();
            h.append(EntryKind::Custom {
                custom_type: "payload".into(),
                data: serde_json::json!({"k": 1}).into(),
            })
            .unwrap();
            assert_eq!(check_path(&store, &id).len(), 42);
            let out = h
                .remove_trailing_entries(
                    &|e| {
                        matches!(
                            &e.kind,
                            EntryKind::Message {
                                message: Message::Assistant { .. }
                            }
                        )
                    },
                    &|f| f.kind == "custom",
                    &CancelToken::new(),
                )
                .unwrap();
            assert_eq!(out.removed.len(), 1);
            assert_eq!(check_path(&store, &id).len(), 41);
            // A rewrite that relinks nothing (redaction).
            h.redact(&|s| s.replace("m1", "[r]"), &CancelToken::new())
                .unwrap();
            check_path(&store, &id);
            // The custom entry goes too: main[39] is left with one child,
            // whose link goes with the other's.
            let out = h
                .remove_trailing_entries(
                    &|e| matches!(&e.kind, EntryKind::Custom { .. }),
                    &|_| false,
                    &CancelToken::new(),
                )
                .unwrap();
            assert_eq!(out.removed.len(), 1);
            assert_eq!(check_path(&store, &id).len(), 40);
            drop(h);
            // A fork's seed transcript is indexed with its path.
            let fork = rt.fork(&id, Some(main[20].clone())).unwrap();
            assert_eq!(check_path(&store, fork.id()).len(), 21);
            let before = (check_path(&store, &id), check_path(&store, fork.id()));
            (id, fork.id().clone(), before)
        };
        // Rebuilt from the log: the same paths.
        std::fs::remove_dir_all(dir.path().join("index")).unwrap();
        // From the log alone: without the checkpoints too.
        let _ = std::fs::remove_dir_all(dir.path().join("checkpoints"));
        let (store, rt) = open(dir.path());
        assert_eq!(
            (check_path(&store, &id), check_path(&store, &fork_id)),
            before
        );
        // A state clear empties the path; appends start it again.
        rt.execute(&id, &crate::actions::ClearSession).unwrap();
        assert_eq!(check_path(&store, &id).len(), 0);
        let h = rt.open_handle(&id, HandleOptions::writer()).unwrap();
        append_n(&h, 3, "c");
        assert_eq!(check_path(&store, &id).len(), 3);
        // A path over several blocks of `p` keys; a rewrite of entries
        // deep in it (new log positions) keeps their path links in step.
        append_n(&h, 150, "long");
        assert_eq!(check_path(&store, &id).len(), 153);
        h.redact(&|s| s.replace("long7", "[r]"), &CancelToken::new())
            .unwrap();
        let path = check_path(&store, &id);
        assert_eq!(path.len(), 153);
        // A side branch: its leaf is off the active path (pages walk).
        h.move_leaf(Some(path[100].clone())).unwrap();
        let side = append_n(&h, 3, "side");
        h.move_leaf(path.last().cloned()).unwrap();
        assert_eq!(check_path(&store, &id), path);
        // Root-first pages from the log store (the active path's range
        // reads, or the walk off it) equal the in-memory transcript's.
        let t = store.load(&id).unwrap().unwrap().state().transcript.clone();
        let cancel = CancelToken::new();
        let scope = crate::transcript::ReadScope {
            session: id.as_str(),
            version: read_meta(store.engine().unwrap().index(), &id)
                .unwrap()
                .unwrap()
                .version(),
            cancel: &cancel,
        };
        for leaf in [path.last().unwrap(), &path[70], &side[2]] {
            for budget in [
                crate::transcript::PageBudget::new(1 << 20, 7),
                crate::transcript::PageBudget::new(1 << 20, 64),
                crate::transcript::PageBudget::new(600, 64),
            ] {
                let (mut a, mut b) = (None, None);
                let mut pages = 0;
                loop {
                    let src = store.source(&id).unwrap();
                    let order = crate::transcript::PageOrder::RootFirst;
                    let ra = crate::transcript::read_branch_page(
                        &*src,
                        &scope,
                        leaf,
                        order,
                        a.as_ref(),
                        budget,
                    )
                    .unwrap();
                    let rb = crate::transcript::read_branch_page(
                        &t,
                        &scope,
                        leaf,
                        order,
                        b.as_ref(),
                        budget,
                    )
                    .unwrap();
                    assert_eq!(ra, rb, "page {pages} of {leaf} ({budget:?})");
                    pages += 1;
                    match ra {
                        ReadResult::Page { continuation, .. } => {
                            a = Some(continuation.clone());
                            b = Some(continuation);
                        }
                        ReadResult::Complete { .. } => break,
                        other => panic!("{other:?}"),
                    }
                }
                assert!(pages > 1);
            }
        }
    }

    /// The `p` blocks across block boundaries: appends at depths 63, 64
    /// and 65, leaf moves across boundaries both ways, truncation to just
    /// below and just at one, a branch and an off-path append that cross
    /// one, a fork of a path over three blocks; and a rebuild from the
    /// log gives the same block values byte for byte.
    #[test]
    fn active_path_blocks_follow_block_boundaries_and_rebuild_byte_for_byte() {
        let dir = tempfile::tempdir().unwrap();
        let (id, fork_id, before) = {
            let (store, rt) = open(dir.path());
            let (id, h) = writer_session(&rt);
            let mut main = append_n(&h, 63, "m");
            assert_eq!(check_path(&store, &id).len(), 63);
            assert_eq!(path_blocks(&store, &id).len(), 1);
            for (depth, tag) in [(63, "d63-"), (64, "d64-"), (65, "d65-")] {
                main.extend(append_n(&h, 1, tag));
                assert_eq!(check_path(&store, &id).len(), depth + 1);
            }
            assert_eq!(path_blocks(&store, &id).len(), 2);
            main.extend(append_n(&h, 134, "deep"));
            assert_eq!(check_path(&store, &id), main);
            assert_eq!(path_blocks(&store, &id).len(), 4);
            // Truncation to just below a boundary, then to exactly one.
            h.move_leaf(Some(main[62].clone())).unwrap();
            assert_eq!(check_path(&store, &id).len(), 63);
            assert_eq!(path_blocks(&store, &id).len(), 1);
            h.move_leaf(Some(main[63].clone())).unwrap();
            assert_eq!(check_path(&store, &id).len(), 64);
            assert_eq!(path_blocks(&store, &id).len(), 1);
            // Back down across three boundaries.
            h.move_leaf(Some(main[199].clone())).unwrap();
            assert_eq!(check_path(&store, &id), main);
            // A branch from depth 62 across the boundary: slot 63 of block
            // 0 changes, block 1 is the branch's, blocks 2 and 3 go.
            h.move_leaf(Some(main[62].clone())).unwrap();
            let side = append_n(&h, 70, "side");
            let p = check_path(&store, &id);
            assert_eq!(p.len(), 133);
            assert_eq!(p[..63], main[..63]);
            assert_eq!(p[63..], side[..]);
            // Between the branches: below the common ancestor only.
            h.move_leaf(Some(main[150].clone())).unwrap();
            assert_eq!(check_path(&store, &id), main[..151]);
            // An append under an off-path entry at depth 63 (the new leaf
            // is at depth 64): block 1 shrinks to one link, block 2 goes.
            h.append_entry(Entry {
                id: EntryId::parse("x-at-64").unwrap(),
                parent_id: Some(side[0].clone()),
                timestamp_ms: 1,
                kind: user("at 64"),
            })
            .unwrap();
            let p = check_path(&store, &id);
            assert_eq!(p.len(), 65);
            assert_eq!(p[63], side[0]);
            assert_eq!(path_blocks(&store, &id).len(), 2);
            // A delta rewrite of entries on both sides of a boundary.
            h.move_leaf(Some(main[199].clone())).unwrap();
            h.redact(&|s| s.replace("d6", "[r]"), &CancelToken::new())
                .unwrap();
            assert_eq!(check_path(&store, &id), main);
            drop(h);
            let fork = rt.fork(&id, Some(main[130].clone())).unwrap();
            assert_eq!(check_path(&store, fork.id())[..], main[..131]);
            assert_eq!(path_blocks(&store, fork.id()).len(), 3);
            let before = (path_blocks(&store, &id), path_blocks(&store, fork.id()));
            (id, fork.id().clone(), before)
        };
        std::fs::remove_dir_all(dir.path().join("index")).unwrap();
        // From the log alone: without the checkpoints too.
        let _ = std::fs::remove_dir_all(dir.path().join("checkpoints"));
        let (store, _rt) = open(dir.path());
        assert_eq!(
            (path_blocks(&store, &id), path_blocks(&store, &fork_id)),
            before
        );
        assert_eq!(check_path(&store, &id).len(), 200);
        assert_eq!(check_path(&store, &fork_id).len(), 131);
    }

    /// A damaged `p` block (lengths past the end or outside a link's
    /// bounds, too many links, an oversized value, a link with a bad id)
    /// makes the reads of the active path that meet it fail with an
    /// `IndexError` naming the session and the depth (a bad framing fails
    /// every read of the block, a bad link the reads of that link), and
    /// an append onto it fail the same way; never a panic. A block shorter than the path's length
    /// says is not read as the path (the readers fall back to walks).
    #[test]
    fn damaged_path_blocks_fail_reads_and_writes_with_index_errors() {
        let eid = |i: usize| EntryId::parse(&format!("e{i}")).unwrap();
        let sid = SessionId::parse("damaged").unwrap();
        let entries: Vec<Entry> = (0..3)
            .map(|i| Entry {
                id: eid(i),
                parent_id: i.checked_sub(1).map(eid),
                timestamp_ms: i as i64,
                kind: user(&format!("entry {i}")),
            })
            .collect();
        let mut transcript = crate::transcript::Transcript::new();
        transcript.replace_all(entries, Some(eid(2)));
        let created = seeded_created(&sid, transcript);
        let dir = tempfile::tempdir().unwrap();
        let engine = Arc::new(
            Store::open(
                dir.path(),
                spool_engine::Options::default().indexer(Arc::new(RawIndexer)),
            )
            .unwrap(),
        );
        let mut version = 0u64;
        let mut append = |events: Vec<spool_engine::EventData>| {
            let expected = match version {
                0 => spool_engine::ExpectedVersion::NoStream,
                v => spool_engine::ExpectedVersion::Exact(v),
            };
            let out = engine.append(spool_engine::NewCommit::new(sid.as_str(), expected, events));
            if out.is_ok() {
                version += 1;
            }
            out
        };
        append(vec![session_event(&created)]).unwrap();
        let key = path_block_key(sid.as_str(), 0);
        let good = engine
            .index()
            .get(TRANSCRIPT_INDEXER, &key)
            .unwrap()
            .unwrap();
        let src = LogTranscriptSource::new(engine.clone(), sid.clone());
        let whole = src.path_range(&eid(2), 2, 0, 2, u64::MAX).unwrap().unwrap();
        assert_eq!(whole.len(), 3);
        assert_eq!(src.ancestor_at_depth(&eid(2), 0).unwrap(), Some(eid(0)));

        let link0 = block_link(&good, 0).unwrap().unwrap().to_vec();
        let mut too_many = Vec::new();
        for _ in 0..=PATH_BLOCK_DEPTHS {
            push_block_link(&mut too_many, &link0);
        }
        let mut bad_id = good.clone();
        // The first byte of the first link's id (after the length prefix
        // and the link's header): not UTF-8.
        bad_id[PATH_LINK_LEN_BYTES + PATH_LINK_HEADER] = 0xff;
        let damaged: Vec<(&str, Vec<u8>)> = vec![
            ("truncated", good[..good.len() - 1].to_vec()),
            ("length below a link's header", {
                let mut v = good.clone();
                v.extend_from_slice(&[0, 5, 1, 2, 3, 4, 5]);
                v
            }),
            ("length past a link's bound", {
                let mut v = good.clone();
                v.extend_from_slice(&u16::MAX.to_be_bytes());
                v.extend(std::iter::repeat_n(0u8, usize::from(u16::MAX)));
                v
            }),
            ("too many links", too_many),
            ("oversized", vec![0u8; PATH_BLOCK_BYTES_MAX + 1]),
            ("bad id", bad_id),
        ];
        for (what, value) in damaged {
            append(vec![raw_event(&key, &value)]).unwrap();
            let src = LogTranscriptSource::new(engine.clone(), sid.clone());
            let check = |r: Result<(), StoreError>| match r {
                Err(StoreError::Engine(spool_engine::Error::Index(IndexError::Malformed(m)))) => {
                    assert!(m.contains("session damaged, depth "), "{what}: {m}")
                }
                other => panic!("{what}: {other:?}"),
            };
            check(src.path_range(&eid(2), 2, 0, 2, u64::MAX).map(|_| ()));
            check(src.ancestor_at_depth(&eid(2), 0).map(|_| ()));
            if what != "bad id" {
                // The framing of the whole block is checked on every read;
                // a link's contents when it is read.
                check(src.path_range(&eid(2), 2, 2, 2, 0).map(|_| ()));
            }
        }
        // A well-formed block with fewer links than the path's length: not
        // the path (the caller walks).
        let mut short = Vec::new();
        for slot in 0..2 {
            push_block_link(&mut short, block_link(&good, slot).unwrap().unwrap());
        }
        append(vec![raw_event(&key, &short)]).unwrap();
        let src = LogTranscriptSource::new(engine.clone(), sid.clone());
        assert_eq!(src.path_range(&eid(2), 2, 0, 2, u64::MAX).unwrap(), None);
        assert_eq!(src.ancestor_at_depth(&eid(2), 0).unwrap(), None);
        // An append under the leaf onto a malformed block fails in the
        // indexer (the commit is in the log; the index refuses it).
        append(vec![raw_event(&key, &good[..good.len() - 1])]).unwrap();
        let e3 = Entry {
            id: eid(3),
            parent_id: Some(eid(2)),
            timestamp_ms: 3,
            kind: user("entry 3"),
        };
        let failed = append(vec![session_event(&SessionEvent::EntryAppended {
            entry: e3,
        })]);
        match failed {
            Err(spool_engine::Error::Index(IndexError::Malformed(m))) => {
                assert!(m.contains("session damaged, depth "), "{m}")
            }
            other => panic!("{other:?}"),
        }
    }
}
