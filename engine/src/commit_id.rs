//! Commit ids the engine draws itself ([`Store::append_fresh`](crate::Store::append_fresh)).

use uuid::Uuid;

/// Random bytes a thread hands out as commit ids, 16 at a time.
struct CommitIdBytes {
    /// The process the bytes were drawn in: a forked child draws its own.
    pid: u32,
    bytes: [u8; COMMIT_ID_BYTES],
    next: usize,
}

/// Bytes drawn per `getrandom` call for commit ids: 256 ids.
const COMMIT_ID_BYTES: usize = 4096;

std::thread_local! {
    static COMMIT_IDS: std::cell::RefCell<Option<CommitIdBytes>> =
        const { std::cell::RefCell::new(None) };
}

/// A random (version 4) commit id. A drawn id must never repeat:
/// `Store::append_fresh` does not look for an earlier commit with it (a
/// repeat would be a second commit with the id, which `Store::append`
/// would take for a retry of the first). So it stays 122 bits from the
/// operating system, drawn 256 ids per call instead of one call per commit
/// (the call was a visible part of a buffered append). The bytes belong to the
/// thread and to the process that drew them: after a `fork` the child
/// draws afresh instead of repeating the parent's next ids.
pub(crate) fn fresh() -> Uuid {
    let pid = std::process::id();
    COMMIT_IDS.with(|cell| {
        let mut slot = cell.borrow_mut();
        let usable = matches!(&*slot, Some(b) if b.pid == pid && b.next + 16 <= COMMIT_ID_BYTES);
        if !usable {
            let mut bytes = [0u8; COMMIT_ID_BYTES];
            if getrandom::fill(&mut bytes).is_err() {
                // The same source: let `new_v4` report it as before.
                return Uuid::new_v4();
            }
            *slot = Some(CommitIdBytes {
                pid,
                bytes,
                next: 0,
            });
        }
        let Some(b) = slot.as_mut() else {
            return Uuid::new_v4();
        };
        let Some(drawn) = b.bytes.get(b.next..b.next + 16) else {
            return Uuid::new_v4();
        };
        let mut id = [0u8; 16];
        id.copy_from_slice(drawn);
        b.next += 16;
        uuid::Builder::from_random_bytes(id).into_uuid()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commit_ids_are_random_v4_ids_drawn_per_process() {
        // Across more than one draw of bytes: version 4, RFC variant, no
        // repeat.
        let n = COMMIT_ID_BYTES / 16 * 2 + 3;
        let ids: std::collections::HashSet<Uuid> = (0..n).map(|_| fresh()).collect();
        assert_eq!(ids.len(), n);
        assert!(ids
            .iter()
            .all(|u| u.get_version_num() == 4 && u.get_variant() == uuid::Variant::RFC4122));
        // Bytes drawn in another process (as a forked child inherits
        // them) are never used: the next id comes from a fresh draw.
        COMMIT_IDS.with(|c| {
            let mut slot = c.borrow_mut();
            let b = slot.as_mut().unwrap();
            b.pid = b.pid.wrapping_add(1);
            b.next = 0;
        });
        let stale = COMMIT_IDS.with(|c| c.borrow().as_ref().unwrap().bytes);
        let id = fresh();
        let inherited =
            uuid::Builder::from_random_bytes(stale[..16].try_into().unwrap()).into_uuid();
        assert_ne!(id, inherited);
        COMMIT_IDS.with(|c| {
            let slot = c.borrow();
            let b = slot.as_ref().unwrap();
            assert_eq!((b.pid, b.next), (std::process::id(), 16));
        });
    }
}
