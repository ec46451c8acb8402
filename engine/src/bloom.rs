//! A growable Bloom filter over commit ids, so that appending with a fresh commit id
//! (the common case) needs no index lookup to rule out a retry. A positive answer is
//! only a hint: the index decides. Built by the open scan from every commit in the log.

use uuid::Uuid;

// 24 bits (3 bytes) and 16 hashes per id: about 0.001% false positives per filter. A
// false positive costs a search of the named stream's version blocks and then of every
// stream's (see `Store::append`): O(commits / 64) index reads; so the rate is kept
// very low.
// A blocked Bloom filter: each id sets HASHES bits inside one 512-bit block (one cache
// line), so a lookup costs one cache miss instead of HASHES. 24 bits (3 bytes) per id
// and 16 hashes: about 0.002% false positives per filter (measured; blocking costs a little
// precision). A false positive costs a search of the named stream's version blocks and
// then of every stream's (see `Store::append`), O(commits / 64) index reads, so the rate
// is kept very low.
const BITS_PER_ITEM: u64 = 24;
const HASHES: u32 = 16;
const FIRST_CAPACITY: u64 = 1 << 16;
const BLOCK_BITS: u64 = 512;

struct Filter {
    blocks: Vec<[u64; 8]>,
    items: u64,
    capacity: u64,
}

impl Filter {
    fn new(capacity: u64) -> Filter {
        let nblocks = (capacity * BITS_PER_ITEM)
            .div_ceil(BLOCK_BITS)
            .next_power_of_two();
        Filter {
            blocks: vec![[0u64; 8]; nblocks as usize],
            items: 0,
            capacity,
        }
    }
    /// The block of `id` and the bit positions inside it: independent 9-bit chunks of
    /// three mixed hashes (double hashing inside a 512-bit block correlates too much).
    fn locate(&self, id: Uuid) -> (usize, impl Iterator<Item = u64>) {
        let (h1, h2) = hashes(id);
        let block = (h1 & (self.blocks.len() as u64 - 1)) as usize;
        let words = [
            h2,
            mix(h2 ^ h1.rotate_left(29)),
            mix(h1 ^ 0x6A09_E667_F3BC_C909),
        ];
        let bits = (0..HASHES).map(move |i| {
            let w = words[(i / 7) as usize];
            (w >> ((i % 7) * 9)) & (BLOCK_BITS - 1)
        });
        (block, bits)
    }
    fn insert(&mut self, id: Uuid) {
        let (b, bits) = self.locate(id);
        let block = &mut self.blocks[b];
        for p in bits {
            block[(p / 64) as usize] |= 1 << (p % 64);
        }
        self.items += 1;
    }
    fn may_contain(&self, id: Uuid) -> bool {
        let (b, mut bits) = self.locate(id);
        let block = &self.blocks[b];
        bits.all(|p| block[(p / 64) as usize] & (1 << (p % 64)) != 0)
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
/// positive rate stays near 0.002% per filter without rehashing old ids.
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
        assert!(fp < 50, "{fp} false positives in 100000");
    }
}
