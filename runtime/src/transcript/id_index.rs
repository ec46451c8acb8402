//! A compact index of entry ids: what the entry-id checks of an import
//! hold in memory, up to their budget (`store/exchange/ledger.rs`).
//!
//! Ids are held as bytes end to end, numbered in the order they were added,
//! with an open-addressing table over them: an 8-character id takes about
//! 20 bytes here, where a `HashSet<EntryId>` takes about 50 (a 24-byte id
//! plus the table's control byte, at most seven-eighths full, doubling).
//! A removed id's bytes stay (its number still names it) until removed ids
//! outnumber live ones; the table's next rebuild then keeps only the live
//! ids, renumbered in order, so memory follows the live ids. At most
//! `u32::MAX - 2` ids and 4 GiB of id bytes held; beyond, an error.

use std::hash::BuildHasher;

/// A free slot of the table.
const FREE: u32 = 0;
/// A slot whose id was removed: lookups probe past it.
const GONE: u32 = u32::MAX;

/// Entry ids by number, and a hash table over them; see the module
/// documentation.
pub(crate) struct IdIndex {
    /// Every id's bytes, end to end (see the module documentation for
    /// removed ones).
    bytes: Vec<u8>,
    /// Where each id ends in `bytes`.
    ends: Vec<u32>,
    /// Open addressing with linear probing: an id's number + 1, [`FREE`] or
    /// [`GONE`]. A power of two long; used and gone slots at most half of it,
    /// and at most a quarter just after a rebuild.
    slots: Vec<u32>,
    /// Slots holding an id, and slots holding [`GONE`].
    live: usize,
    gone: usize,
    /// Seeded per process, so a file cannot be made to collide.
    hasher: foldhash::fast::RandomState,
}

impl Default for IdIndex {
    fn default() -> Self {
        IdIndex {
            bytes: Vec::new(),
            ends: Vec::new(),
            slots: vec![FREE; 16],
            live: 0,
            gone: 0,
            hasher: foldhash::fast::RandomState::default(),
        }
    }
}

impl IdIndex {
    /// The id numbered `i` (removed or not; numbers change only when a
    /// rebuild drops removed ids).
    pub(crate) fn get(&self, i: usize) -> Option<&str> {
        let end = *self.ends.get(i)? as usize;
        let start = match i.checked_sub(1) {
            Some(p) => *self.ends.get(p)? as usize,
            None => 0,
        };
        std::str::from_utf8(self.bytes.get(start..end)?).ok()
    }

    pub(crate) fn contains(&self, id: &str) -> bool {
        self.slot_of(id).is_some()
    }

    fn slot_of(&self, id: &str) -> Option<usize> {
        let mask = self.slots.len() - 1;
        let mut at = self.hasher.hash_one(id) as usize & mask;
        // Ends: at least half the slots are free.
        loop {
            match self.slots[at] {
                FREE => return None,
                GONE => {}
                s if self.get(s as usize - 1) == Some(id) => return Some(at),
                _ => {}
            }
            at = (at + 1) & mask;
        }
    }

    /// Adds `id`, which must not be in the index; returns its number.
    pub(crate) fn push(&mut self, id: &str) -> Result<u32, String> {
        debug_assert!(!self.contains(id), "{id} is in the index already");
        let too_many = || {
            "more entry ids than one session can hold here (4 Gi ids or 4 GiB of them)".to_string()
        };
        if (self.live + self.gone + 1) * 2 > self.slots.len() {
            self.rebuild();
        }
        // After the rebuild, which may renumber.
        let n = u32::try_from(self.ends.len())
            .ok()
            .filter(|&n| n < GONE - 2)
            .ok_or_else(too_many)?;
        let end = u32::try_from(self.bytes.len() + id.len()).map_err(|_| too_many())?;
        self.bytes.extend_from_slice(id.as_bytes());
        self.ends.push(end);
        self.place(n);
        self.live += 1;
        Ok(n)
    }

    /// The live ids, in no particular order.
    pub(crate) fn live_ids(&self) -> impl Iterator<Item = &str> + '_ {
        self.slots
            .iter()
            .filter(|&&s| s != FREE && s != GONE)
            .filter_map(|&s| self.get(s as usize - 1))
    }

    /// The heap memory the index holds, in bytes.
    pub(crate) fn heap_bytes(&self) -> usize {
        self.bytes.capacity() + 4 * (self.ends.capacity() + self.slots.capacity())
    }

    /// Removes `id` if it is in the index; its number is not reused.
    pub(crate) fn remove(&mut self, id: &str) -> bool {
        let Some(at) = self.slot_of(id) else {
            return false;
        };
        self.slots[at] = GONE;
        self.live -= 1;
        self.gone += 1;
        true
    }

    /// A table for the live ids without removed slots, at most a quarter
    /// full (so a rebuild is followed by at least a quarter of the table's
    /// adds and removes before the next): the same length, or twice it.
    /// Once removed ids outnumber live ones, their bytes go too.
    fn rebuild(&mut self) {
        let mut len = self.slots.len();
        while (self.live + 1) * 4 > len {
            len *= 2;
        }
        let old = std::mem::replace(&mut self.slots, vec![FREE; len]);
        self.gone = 0;
        let live = old.into_iter().filter(|&s| s != FREE && s != GONE);
        if self.ends.len() <= 2 * self.live {
            for s in live {
                self.place(s - 1);
            }
            return;
        }
        let mut numbers: Vec<u32> = live.map(|s| s - 1).collect();
        numbers.sort_unstable();
        let (bytes, ends) = (
            std::mem::take(&mut self.bytes),
            std::mem::take(&mut self.ends),
        );
        let old = IdIndex {
            bytes,
            ends,
            ..IdIndex::default()
        };
        for (n, i) in numbers.into_iter().enumerate() {
            if let Some(id) = old.get(i as usize) {
                self.bytes.extend_from_slice(id.as_bytes());
                // Fits: these bytes were a prefix's worth of the old ones.
                self.ends.push(self.bytes.len() as u32);
                self.place(n as u32);
            }
        }
    }

    /// Puts id `i` in a free slot.
    fn place(&mut self, i: u32) {
        let mask = self.slots.len() - 1;
        let mut at = self
            .get(i as usize)
            .map_or(0, |id| self.hasher.hash_one(id)) as usize
            & mask;
        while self.slots[at] != FREE {
            at = (at + 1) & mask;
        }
        self.slots[at] = i + 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl IdIndex {
        /// The number of the id `id`, unless it is absent or removed.
        fn find(&self, id: &str) -> Option<u32> {
            self.slot_of(id).map(|at| self.slots[at] - 1)
        }

        /// The id added last.
        fn last(&self) -> Option<&str> {
            self.ends.len().checked_sub(1).and_then(|i| self.get(i))
        }
    }
    use std::collections::HashSet;

    /// Seeded random adds, removes and lookups answer as a `HashSet` does,
    /// and every number names its id; the seed is printed.
    #[test]
    fn answers_as_a_hash_set_under_adds_and_removes() {
        let seed: u64 = std::env::var("SPOOL_TEST_SEED")
            .ok()
            .and_then(|s| s.parse().ok())
            .unwrap_or(0x1d5e7);
        eprintln!("seed {seed} (SPOOL_TEST_SEED reruns it)");
        let mut state = seed;
        let mut next = move || {
            state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        };
        let mut index = IdIndex::default();
        let mut set: HashSet<String> = HashSet::new();
        for step in 0..200_000u32 {
            let id = format!("e{}", next() % 20_000);
            match next() % 4 {
                0 | 1 if !set.contains(&id) => {
                    let n = index.push(&id).unwrap();
                    assert_eq!(index.get(n as usize), Some(id.as_str()), "step {step}");
                    assert_eq!(index.last(), Some(id.as_str()));
                    set.insert(id.clone());
                }
                2 => assert_eq!(index.remove(&id), set.remove(&id), "step {step}"),
                _ => {}
            }
            assert_eq!(index.contains(&id), set.contains(&id), "step {step} {id}");
            if let Some(n) = index.find(&id) {
                assert_eq!(index.get(n as usize), Some(id.as_str()), "step {step}");
            }
            if step % 1_000 == 0 {
                // The table never fills beyond half, so every lookup ends.
                let used = index.slots.iter().filter(|&&s| s != FREE).count();
                assert_eq!(used, index.live + index.gone, "step {step}");
                assert_eq!(index.live, set.len(), "step {step}");
                assert!(used * 2 <= index.slots.len(), "step {step}");
                // Removed ids' bytes are dropped once they outnumber live ones.
                assert!(index.ends.len() <= 2 * index.live + index.slots.len());
                // The live ids are the set's; the heap counted holds them.
                let live: HashSet<String> = index.live_ids().map(str::to_string).collect();
                assert_eq!(live, set, "step {step}");
                assert!(index.heap_bytes() >= 4 * index.slots.len() + index.bytes.len());
            }
        }
        assert!(
            set.len() > 1_000,
            "the walk kept a real set ({})",
            set.len()
        );
    }

    /// Removes and adds with the live ids near half the table rebuild it
    /// rarely (a rebuild leaves at least a quarter of it free), so a session
    /// of many rewrites costs amortized O(1) per id, not O(table).
    #[test]
    fn removes_and_adds_near_half_full_do_not_rebuild_every_time() {
        let mut index = IdIndex::default();
        let n = 1u32 << 12;
        for i in 0..n {
            index.push(&format!("e{i}")).unwrap();
        }
        let len = index.slots.len();
        let mut rebuilds = 0;
        for i in 0..n {
            index.remove(&format!("e{i}"));
            let before = index.slots.as_ptr();
            index.push(&format!("f{i}")).unwrap();
            rebuilds += usize::from(index.slots.as_ptr() != before);
        }
        assert!(
            rebuilds < 64,
            "{rebuilds} rebuilds of a {len}-slot table for {n} adds"
        );
        // Many adds of ids removed again: what is held follows the live ids,
        // not every id ever added.
        for i in 0..100 * n {
            let id = format!("g{i}");
            index.push(&id).unwrap();
            assert!(index.remove(&id));
        }
        assert_eq!(index.live, n as usize);
        assert!(
            index.ends.len() <= 2 * index.live + index.slots.len(),
            "{} ids held for {} live",
            index.ends.len(),
            index.live
        );
        for i in 0..n {
            assert!(index.contains(&format!("f{i}")));
        }
    }

    #[test]
    fn the_id_index_finds_every_id_and_grows() {
        let mut ids = IdIndex::default();
        let n = 10_000u32;
        for i in 0..n {
            assert_eq!(ids.push(&format!("id{i}")).unwrap(), i);
        }
        for i in 0..n {
            assert_eq!(ids.find(&format!("id{i}")), Some(i));
            assert_eq!(ids.get(i as usize), Some(format!("id{i}").as_str()));
        }
        assert_eq!(ids.find("id10000"), None);
        assert_eq!(ids.get(n as usize), None);
        assert_eq!(ids.last(), Some("id9999"));
        assert!(ids.slots.len() >= 2 * n as usize);
    }
}
