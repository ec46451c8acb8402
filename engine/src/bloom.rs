//! A growable Bloom filter over commit ids, so that appending with a fresh commit id
//! (the common case) needs no index lookup to rule out a retry. A positive answer is
//! only a hint: the index decides. Built by the open scan from every commit in the log.

use uuid::Uuid;

// 16 bits and 11 hashes per id: about 0.05% false positives per filter. A false
// positive costs a search of the named stream's version blocks and then of every
// stream's (see `Store::append`), so the rate is kept low.
const BITS_PER_ITEM: u64 = 16;
const HASHES: u32 = 11;
const FIRST_CAPACITY: u64 = 1 << 16;

struct Filter {
    bits: Vec<u64>,
    nbits: u64,
    items: u64,
    capacity: u64,
}

impl Filter {
    fn new(capacity: u64) -> Filter {
        let nbits = (capacity * BITS_PER_ITEM).next_power_of_two();
        Filter {
            bits: vec![0; (nbits / 64) as usize],
            nbits,
            items: 0,
            capacity,
        }
    }
    fn positions(&self, id: Uuid) -> impl Iterator<Item = u64> + '_ {
        let (h1, h2) = hashes(id);
        (0..HASHES).map(move |i| h1.wrapping_add(u64::from(i).wrapping_mul(h2)) & (self.nbits - 1))
    }
    fn insert(&mut self, id: Uuid) {
        let (h1, h2) = hashes(id);
        for i in 0..HASHES {
            let p = h1.wrapping_add(u64::from(i).wrapping_mul(h2)) & (self.nbits - 1);
            self.bits[(p / 64) as usize] |= 1 << (p % 64);
        }
        self.items += 1;
    }
    fn may_contain(&self, id: Uuid) -> bool {
        self.positions(id)
            .all(|p| self.bits[(p / 64) as usize] & (1 << (p % 64)) != 0)
    }
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Two independent hashes (commit ids need not be random: mix them).
fn hashes(id: Uuid) -> (u64, u64) {
    let (hi, lo) = id.as_u64_pair();
    let h1 = mix(hi ^ mix(lo));
    let h2 = mix(lo.wrapping_add(0x9E37_79B9_7F4A_7C15) ^ mix(hi)) | 1;
    (h1, h2)
}

/// Filters of doubling capacity; a new one starts when the last is full, so the false
/// positive rate stays near 0.05% per filter without rehashing old ids.
pub(crate) struct CommitIdFilter {
    filters: Vec<Filter>,
}

impl CommitIdFilter {
    pub fn with_capacity(n: u64) -> CommitIdFilter {
        CommitIdFilter {
            filters: vec![Filter::new(n.max(FIRST_CAPACITY))],
        }
    }

    pub fn insert(&mut self, id: Uuid) {
        let need_new = self.filters.last().is_none_or(|f| f.items >= f.capacity);
        if need_new {
            let cap = self
                .filters
                .last()
                .map_or(FIRST_CAPACITY, |f| f.capacity * 2);
            self.filters.push(Filter::new(cap));
        }
        if let Some(f) = self.filters.last_mut() {
            f.insert(id);
        }
    }

    pub fn may_contain(&self, id: Uuid) -> bool {
        self.filters.iter().any(|f| f.may_contain(id))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_false_negatives_and_few_false_positives() {
        let mut f = CommitIdFilter::with_capacity(1000);
        let ids: Vec<Uuid> = (0..200_000u128).map(Uuid::from_u128).collect();
        for id in &ids {
            f.insert(*id);
        }
        assert!(ids.iter().all(|id| f.may_contain(*id)));
        assert!(f.filters.len() > 1);
        let fp = (1_000_000u128..1_100_000)
            .filter(|i| f.may_contain(Uuid::from_u128(*i)))
            .count();
        assert!(fp < 500, "{fp} false positives in 100000");
    }
}
