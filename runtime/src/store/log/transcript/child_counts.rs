//! Child counts and child links: a parent's count in its `e` record (or an
//! `n` key for an absent parent), the `c` list of a parent with two or more
//! children, and [`ChildCount`], the one place every count is written.

use spool_engine::{IndexBatch, IndexError};

use super::keys::{child_key, child_prefix, count_key, entry_key};
use super::record::{get_record, put_record, EntryRecord, Writer, RECORD_FORMAT};
use crate::store::log::common::be_u64;
use crate::transcript::EntryId;
use crate::transcript::ENTRY_ID_LEN_MAX;

/// The encoding of the record `bytes` encodes with its child count set to
/// `children` and its only child to `only`: the count and the only child
/// lead the record (see [`EntryRecord::encode`]), so the rest is copied as
/// it is. `None` when `bytes` does not start like a record.
pub(super) fn splice_child_count(
    bytes: &[u8],
    children: u64,
    only: Option<&EntryId>,
) -> Option<Vec<u8>> {
    // Format byte, count (u64 BE), then the only child: a flag byte and,
    // when set, a u32 BE length and the id's bytes.
    let (&format, rest) = bytes.split_first()?;
    if format != RECORD_FORMAT {
        return None;
    }
    let (flag, after_count) = rest.get(8..)?.split_first()?;
    let tail = match flag {
        0 => after_count,
        1 => {
            let len = u32::from_be_bytes(after_count.get(..4)?.try_into().ok()?);
            after_count.get(4..)?.get(usize::try_from(len).ok()?..)?
        }
        _ => return None,
    };
    let mut w = Writer(Vec::with_capacity(bytes.len() + 4 + ENTRY_ID_LEN_MAX));
    w.u8(RECORD_FORMAT);
    w.u64(children);
    w.opt_id(only);
    w.0.extend_from_slice(tail);
    Some(w.0)
}

/// The `n` value: the number of children and, when there is exactly one,
/// its id (a chain's child list is then one point lookup, no scan). Only
/// for a parent without an `e` record (an orphan's absent parent): a
/// parent with a record keeps these in it ([`EntryRecord::children`]).
pub(super) fn count_value(count: u64, only: Option<&EntryId>) -> Vec<u8> {
    let mut v = count.to_be_bytes().to_vec();
    if let (1, Some(id)) = (count, only) {
        v.extend_from_slice(id.as_bytes());
    }
    v
}

/// The only child named by an `n` value (a count of 1 followed by an id).
pub(super) fn only_child(count: &[u8]) -> Option<EntryId> {
    let rest = count.get(8..).filter(|r| !r.is_empty())?;
    EntryId::parse_bytes(rest).ok()
}

/// A parent's child count as a writer changes it. Every writer of child
/// counts goes through it: the count lives in the parent's `e` record
/// when the parent has one, else (an orphan's absent parent) in its `n`
/// key, and a record never coexists with an `n` key of the same id (a
/// new record takes the `n` key's count over, [`take_absent_count`]).
struct ChildCount {
    /// The parent's record (the count is written back into it), or
    /// `None`: the count is the `n` key's.
    record: Option<EntryRecord>,
    /// The bytes `record` was read from, when the caller has them.
    record_bytes: Option<Vec<u8>>,
    /// Whether the count is kept anywhere (a record, or an `n` key).
    kept: bool,
    total: u64,
    /// The only child when `total` is 1.
    only: Option<EntryId>,
}

impl ChildCount {
    /// The count of `parent`, whose record (as just read from the batch)
    /// is `record`.
    fn load(
        batch: &IndexBatch<'_>,
        sid: &str,
        parent: &EntryId,
        record: Option<EntryRecord>,
    ) -> Result<Self, IndexError> {
        Ok(match record {
            Some(r) => ChildCount {
                total: r.children,
                only: r.only_child.clone(),
                record: Some(r),
                record_bytes: None,
                kept: true,
            },
            None => match batch.get(&count_key(sid, parent))? {
                Some(v) => ChildCount {
                    total: be_u64(&v).unwrap_or(0),
                    only: only_child(&v),
                    record: None,
                    record_bytes: None,
                    kept: true,
                },
                None => ChildCount {
                    record: None,
                    record_bytes: None,
                    kept: false,
                    total: 0,
                    only: None,
                },
            },
        })
    }

    /// Writes the count back where it lives (an `n` key of a count of
    /// zero is removed rather than kept).
    fn store(
        self,
        batch: &mut IndexBatch<'_>,
        sid: &str,
        parent: &EntryId,
    ) -> Result<(), IndexError> {
        let only = if self.total == 1 { self.only } else { None };
        match self.record {
            Some(mut r) => {
                r.children = self.total;
                r.only_child = only;
                match self
                    .record_bytes
                    .and_then(|b| splice_child_count(&b, r.children, r.only_child.as_ref()))
                {
                    Some(v) => {
                        debug_assert_eq!(v, r.encode(), "a splice encodes the record");
                        batch.insert_vec(&entry_key(sid, parent), v);
                    }
                    None => put_record(batch, sid, parent, &r)?,
                }
            }
            None if self.total == 0 => batch.remove(&count_key(sid, parent)),
            None => batch.insert(
                &count_key(sid, parent),
                &count_value(self.total, only.as_ref()),
            ),
        }
        Ok(())
    }
}

/// Counts `child` (appended with seq `child_seq`) as a new child of
/// `parent`, whose record is `record` (as read from the batch), and writes
/// the child links it needs. The `c` keys of a parent exist only while it
/// has two or more children: a chain's only child is named by the count
/// alone, which spares every chain append a key. So the second child
/// writes the links of both.
pub(super) fn add_child(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    parent: &EntryId,
    record: Option<EntryRecord>,
    child: &EntryId,
    child_seq: u64,
) -> Result<(), IndexError> {
    add_child_read(
        batch,
        sid,
        parent,
        record.map(|record| (record, None)),
        child,
        child_seq,
    )
}

/// [`add_child`] given the parent's record with the bytes it was read from,
/// when the caller has them.
pub(super) fn add_child_read(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    parent: &EntryId,
    read: Option<(EntryRecord, Option<Vec<u8>>)>,
    child: &EntryId,
    child_seq: u64,
) -> Result<(), IndexError> {
    let (record, record_bytes) = match read {
        Some((r, b)) => (Some(r), b),
        None => (None, None),
    };
    let mut count = ChildCount::load(batch, sid, parent, record)?;
    count.record_bytes = record_bytes;
    if count.total == 1 {
        if let Some(only) = &count.only {
            if let Some(r) = get_record(batch, sid, only)? {
                batch.insert(&child_key(sid, parent, r.seq), only.as_bytes());
            }
        }
    }
    if count.total >= 1 {
        batch.insert(&child_key(sid, parent, child_seq), child.as_bytes());
    }
    count.total = count.total.saturating_add(1);
    count.only = Some(child.clone());
    count.store(batch, sid, parent)
}

/// Uncounts the child of `parent` (whose record is `record`) appended with
/// seq `child_seq` and removes its link; when one child is left, its link
/// goes too (the count names it, see [`add_child`]). A parent whose count
/// is kept nowhere (one this rewrite removed) only loses the link.
pub(super) fn remove_child(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    parent: &EntryId,
    record: Option<EntryRecord>,
    child_seq: u64,
) -> Result<(), IndexError> {
    let mut count = ChildCount::load(batch, sid, parent, record)?;
    if !count.kept {
        batch.remove(&child_key(sid, parent, child_seq));
        return Ok(());
    }
    let next = count.total.saturating_sub(1);
    if count.total >= 2 {
        batch.remove(&child_key(sid, parent, child_seq));
    }
    count.only = if next == 1 {
        match batch
            .scan_prefix(&child_prefix(sid, parent))?
            .into_iter()
            .next()
        {
            Some((k, v)) => {
                batch.remove(&k);
                String::from_utf8(v)
                    .ok()
                    .and_then(|s| EntryId::parse(&s).ok())
            }
            None => None,
        }
    } else {
        None
    };
    count.total = next;
    count.store(batch, sid, parent)
}

/// The child count an absent parent's `n` key kept for `id` (its orphans
/// arrived first), removed from the index: a new record of `id` takes it
/// over. One probe of a missing key per new entry otherwise (answered by
/// the index's key filter).
pub(super) fn take_absent_count(
    batch: &mut IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
) -> Result<(u64, Option<EntryId>), IndexError> {
    let key = count_key(sid, id);
    Ok(match batch.get(&key)? {
        Some(v) => {
            batch.remove(&key);
            let total = be_u64(&v).unwrap_or(0);
            let only = if total == 1 { only_child(&v) } else { None };
            (total, only)
        }
        None => (0, None),
    })
}

/// The children of `id` (whose record is `record`) as the batch sees
/// them: the count's only child, or the `c` links in append order.
pub(super) fn batch_children(
    batch: &IndexBatch<'_>,
    sid: &str,
    id: &EntryId,
    record: Option<&EntryRecord>,
) -> Result<Vec<EntryId>, IndexError> {
    let count = ChildCount::load(batch, sid, id, record.cloned())?;
    if count.total == 1 {
        if let Some(only) = count.only {
            return Ok(vec![only]);
        }
    }
    if count.total == 0 {
        return Ok(Vec::new());
    }
    Ok(batch
        .scan_prefix(&child_prefix(sid, id))?
        .into_iter()
        .filter_map(|(_, v)| {
            std::str::from_utf8(&v)
                .ok()
                .and_then(|s| EntryId::parse(s).ok())
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::keys::TRANSCRIPT_INDEXER;
    use super::super::keys::{ENTRY_TAGS, TAG_COUNT};
    use super::super::test_support::{
        append_n, check_path, open, record_count, seeded_created, session_event, tag_keys, user,
        writer_session,
    };
    use super::*;
    use crate::handle::HandleOptions;
    use crate::session::SessionId;
    use crate::store::TranscriptBackend;
    use crate::transcript::{ChildLinks, Entry};

    use crate::transcript::CancelToken;

    /// The second and third child of a chain entry are both counted in its
    /// record and linked in append order; removing them by delta rewrites
    /// takes it back to one child named by the record, with no links.
    #[test]
    fn branch_counts_follow_new_children_and_delta_removals() {
        let dir = tempfile::tempdir().unwrap();
        let (store, rt) = open(dir.path());
        let (id, h) = writer_session(&rt);
        let chain = append_n(&h, 3, "a");
        let under_first = |name: &str, at: i64| {
            h.append_entry(Entry {
                id: EntryId::parse(name).unwrap(),
                parent_id: Some(chain[0].clone()),
                timestamp_ms: at,
                kind: user(name),
            })
            .unwrap()
        };
        let children = |e: &EntryId| store.source(&id).unwrap().children(e, usize::MAX).unwrap();
        let links = |e: &EntryId| {
            store
                .engine()
                .unwrap()
                .index()
                .scan_prefix(TRANSCRIPT_INDEXER, &child_prefix(id.as_str(), e))
                .count()
        };
        assert_eq!(
            record_count(&store, &id, &chain[0]),
            (1, Some(chain[1].clone()))
        );
        let b = under_first("b", 1);
        assert_eq!(
            children(&chain[0]),
            ChildLinks {
                ids: vec![chain[1].clone(), b.clone()],
                total: 2
            }
        );
        assert_eq!(record_count(&store, &id, &chain[0]), (2, None));
        assert_eq!(links(&chain[0]), 2);
        let c = under_first("c", 2);
        assert_eq!(
            children(&chain[0]),
            ChildLinks {
                ids: vec![chain[1].clone(), b.clone(), c.clone()],
                total: 3
            }
        );
        assert_eq!(record_count(&store, &id, &chain[0]), (3, None));
        check_path(&store, &id);
        // The leaf is `c`: a delta rewrite removes it (two children left).
        let only = |x: &EntryId| {
            let x = x.clone();
            move |e: &Entry| e.id == x
        };
        let out = h
            .remove_trailing_entries(&only(&c), &|_| false, &CancelToken::new())
            .unwrap();
        assert_eq!(out.removed, vec![c.clone()]);
        assert_eq!(record_count(&store, &id, &chain[0]), (2, None));
        assert_eq!(links(&chain[0]), 2);
        check_path(&store, &id);
        // Then `b`: one child left, named by the record, no links.
        h.move_leaf(Some(b.clone())).unwrap();
        let out = h
            .remove_trailing_entries(&only(&b), &|_| false, &CancelToken::new())
            .unwrap();
        assert_eq!(out.removed, vec![b.clone()]);
        assert_eq!(
            record_count(&store, &id, &chain[0]),
            (1, Some(chain[1].clone()))
        );
        assert_eq!(links(&chain[0]), 0);
        assert_eq!(
            children(&chain[0]),
            ChildLinks {
                ids: vec![chain[1].clone()],
                total: 1
            }
        );
        assert!(tag_keys(&store, &id, TAG_COUNT).is_empty());
        check_path(&store, &id);
    }

    /// Orphans (entries whose parent is absent, as imported or damaged
    /// transcripts hold) are counted in their absent parent's `n` key;
    /// when that parent is appended later, its new record takes the count
    /// over (children, append order, the only child) and the `n` key goes.
    #[test]
    fn an_absent_parents_count_moves_into_its_record_when_it_is_appended() {
        let eid = |s: &str| EntryId::parse(s).unwrap();
        let entry = |id: &str, parent: Option<&str>| Entry {
            id: eid(id),
            parent_id: parent.map(eid),
            timestamp_ms: 1,
            kind: user(id),
        };
        let sid = SessionId::parse("orphans").unwrap();
        let mut transcript = crate::transcript::Transcript::new();
        transcript.replace_all(
            vec![
                entry("r", None),
                entry("x1", Some("ghost")),
                entry("x2", Some("ghost")),
                entry("y", Some("ghost1")),
            ],
            Some(eid("r")),
        );
        let created = seeded_created(&sid, transcript);
        let dir = tempfile::tempdir().unwrap();
        let (store, rt) = open(dir.path());
        store
            .engine()
            .unwrap()
            .append(spool_engine::NewCommit::new(
                sid.as_str(),
                spool_engine::ExpectedVersion::NoStream,
                vec![session_event(&created)],
            ))
            .unwrap();
        let children = |e: &str| {
            store
                .source(&sid)
                .unwrap()
                .children(&eid(e), usize::MAX)
                .unwrap()
        };
        assert_eq!(
            children("ghost"),
            ChildLinks {
                ids: vec![eid("x1"), eid("x2")],
                total: 2
            }
        );
        assert_eq!(
            children("ghost1"),
            ChildLinks {
                ids: vec![eid("y")],
                total: 1
            }
        );
        assert_eq!(tag_keys(&store, &sid, TAG_COUNT).len(), 2);
        check_path(&store, &sid);
        // The absent parents are appended: `ghost` as a root, `ghost1`
        // under it (its third child).
        let h = rt.open_handle(&sid, HandleOptions::writer()).unwrap();
        h.append_entry(entry("ghost", None)).unwrap();
        assert_eq!(record_count(&store, &sid, &eid("ghost")), (2, None));
        h.append_entry(entry("ghost1", Some("ghost"))).unwrap();
        assert!(tag_keys(&store, &sid, TAG_COUNT).is_empty());
        assert_eq!(record_count(&store, &sid, &eid("ghost")), (3, None));
        assert_eq!(
            record_count(&store, &sid, &eid("ghost1")),
            (1, Some(eid("y")))
        );
        assert_eq!(
            children("ghost"),
            ChildLinks {
                ids: vec![eid("x1"), eid("x2"), eid("ghost1")],
                total: 3
            }
        );
        assert_eq!(
            children("ghost1"),
            ChildLinks {
                ids: vec![eid("y")],
                total: 1
            }
        );
        let before = check_path(&store, &sid);
        let all: Vec<_> = ENTRY_TAGS
            .into_iter()
            .map(|t| tag_keys(&store, &sid, t))
            .collect();
        // Rebuilt from the log: the same keys and path.
        drop((h, store, rt));
        std::fs::remove_dir_all(dir.path().join("index")).unwrap();
        // From the log alone: without the checkpoints too.
        let _ = std::fs::remove_dir_all(dir.path().join("checkpoints"));
        let (store, _rt) = open(dir.path());
        let again: Vec<_> = ENTRY_TAGS
            .into_iter()
            .map(|t| tag_keys(&store, &sid, t))
            .collect();
        assert_eq!(again, all);
        assert_eq!(check_path(&store, &sid), before);
    }
}
