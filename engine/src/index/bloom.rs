//! Growable Bloom filters, so that the common case of a lookup that must miss costs
//! no index read: over commit ids ([`CommitIdFilter`]: appending with a fresh commit id
//! needs no lookup to rule out a retry; built by the open scan from every commit in the
//! log) and over index keys ([`KeyFilter`]: a read of a key never written skips the
//! memtables and sled). A positive answer is only a hint: the index decides.

use crate::vfs::Mapped;
use std::sync::Arc;
use uuid::Uuid;

// Commit ids: 24 bits (3 bytes) and 16 hashes per id, about 0.002% false positives per
// filter (blocking costs a little precision). A false positive costs a search
// of the named stream's version blocks and then of every stream's (see
// `Store::append`), O(commits / 64) index reads, so the rate is kept very low.
const BITS_PER_ITEM: u64 = 24;
const HASHES: u32 = 16;
const FIRST_CAPACITY: u64 = 1 << 16;
const BLOCK_BITS: u64 = 512;
/// The pieces [`KeyFilter::encode_to`] hands out.
const CHUNK_BYTES: usize = 64 << 10;

/// One blocked Bloom filter of a fixed capacity: each item sets its bits inside one
/// 512-bit block (one cache line), so a lookup costs one cache miss. Shared by the
/// commit-id and the key filters, which differ in bits per item, hashes and hashing.
struct Blocks {
    blocks: Bits,
    items: u64,
    capacity: u64,
}

/// A filter's blocks: in memory, or in a saved key filter file mapped read-only (its
/// words big-endian, see [`KeyFilter::decode_mapped`]), copied into memory by the
/// first insert. A mapped filter costs memory only for the pages lookups touch.
enum Bits {
    Owned(Vec<[u64; 8]>),
    Mapped {
        src: Arc<FilterFile>,
        offset: usize,
        nblocks: usize,
    },
}

/// A saved key filter file, mapped, and open to copy its bytes with reads (which,
/// unlike reads of the map, do not make its pages part of the process).
pub(crate) struct FilterFile {
    pub map: Mapped,
    pub file: Option<Arc<dyn crate::vfs::VfsFile>>,
}

impl Bits {
    fn len(&self) -> usize {
        match self {
            Bits::Owned(b) => b.len(),
            Bits::Mapped { nblocks, .. } => *nblocks,
        }
    }

    /// Word `w` of block `b` (both in range).
    fn word(&self, b: usize, w: usize) -> u64 {
        match self {
            Bits::Owned(blocks) => blocks[b][w],
            Bits::Mapped { src, offset, .. } => {
                let at = offset + (b * 8 + w) * 8;
                let mut word = [0u8; 8];
                word.copy_from_slice(&src.map[at..at + 8]);
                u64::from_be_bytes(word)
            }
        }
    }

    /// The blocks in memory (copied out of the map the first time).
    fn owned(&mut self) -> &mut Vec<[u64; 8]> {
        if let Bits::Mapped { nblocks, .. } = self {
            let copy = (0..*nblocks)
                .map(|b| std::array::from_fn(|w| self.word(b, w)))
                .collect();
            *self = Bits::Owned(copy);
        }
        match self {
            Bits::Owned(b) => b,
            Bits::Mapped { .. } => unreachable!("just copied"),
        }
    }
}

impl Blocks {
    fn new(capacity: u64, bits_per_item: u64) -> Blocks {
        let nblocks = (capacity * bits_per_item)
            .div_ceil(BLOCK_BITS)
            .next_power_of_two();
        Blocks {
            blocks: Bits::Owned(vec![[0u64; 8]; nblocks as usize]),
            items: 0,
            capacity,
        }
    }

    /// The block `h` picks and `hashes` bit positions inside it: independent 9-bit
    /// chunks of `words`, seven per word (double hashing inside a 512-bit block
    /// correlates too much).
    fn locate<const W: usize>(
        &self,
        h: u64,
        words: [u64; W],
        hashes: u32,
    ) -> (usize, impl Iterator<Item = u64>) {
        debug_assert!(hashes as usize <= 7 * W, "{hashes} hashes from {W} words");
        let block = (h & (self.blocks.len() as u64 - 1)) as usize;
        let bits = (0..hashes).map(move |i| {
            let w = words[(i / 7) as usize];
            (w >> ((i % 7) * 9)) & (BLOCK_BITS - 1)
        });
        (block, bits)
    }

    fn insert(&mut self, (b, bits): (usize, impl Iterator<Item = u64>)) {
        let block = &mut self.blocks.owned()[b];
        for p in bits {
            block[(p / 64) as usize] |= 1 << (p % 64);
        }
        self.items += 1;
    }

    fn may_contain(&self, (b, mut bits): (usize, impl Iterator<Item = u64>)) -> bool {
        match &self.blocks {
            Bits::Owned(blocks) => {
                let block = &blocks[b];
                bits.all(|p| block[(p / 64) as usize] & (1 << (p % 64)) != 0)
            }
            mapped => bits.all(|p| mapped.word(b, (p / 64) as usize) & (1 << (p % 64)) != 0),
        }
    }

    fn bytes(&self) -> u64 {
        self.blocks.len() as u64 * BLOCK_BITS / 8
    }

    /// The capacity of the filter to start when the last of `filters` is full (or there
    /// is none): twice the last one's, so the false-positive rate stays per filter
    /// without rehashing what the older ones hold.
    fn next_capacity(filters: &[Blocks], first: u64) -> Option<u64> {
        match filters.last() {
            None => Some(first),
            Some(f) if f.items >= f.capacity => Some(f.capacity * 2),
            Some(_) => None,
        }
    }
}

/// A commit id's hashes: the block hash and three words of bit positions,
/// computed once for every filter of a chain.
fn commit_id_hashes(id: Uuid) -> (u64, [u64; 3]) {
    let (h1, h2) = hashes(id);
    let words = [
        h2,
        mix(h2 ^ h1.rotate_left(29)),
        mix(h1 ^ 0x6A09_E667_F3BC_C909),
    ];
    (h1, words)
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
    filters: Vec<Blocks>,
}

impl CommitIdFilter {
    pub fn with_capacity(n: u64) -> CommitIdFilter {
        CommitIdFilter {
            filters: vec![Blocks::new(n.max(FIRST_CAPACITY), BITS_PER_ITEM)],
        }
    }

    pub fn insert(&mut self, id: Uuid) {
        if let Some(cap) = Blocks::next_capacity(&self.filters, FIRST_CAPACITY) {
            self.filters.push(Blocks::new(cap, BITS_PER_ITEM));
        }
        if let Some(f) = self.filters.last_mut() {
            let (h, words) = commit_id_hashes(id);
            let at = f.locate(h, words, HASHES);
            f.insert(at);
        }
    }

    pub fn may_contain(&self, id: Uuid) -> bool {
        let (h, words) = commit_id_hashes(id);
        self.filters
            .iter()
            .any(|f| f.may_contain(f.locate(h, words, HASHES)))
    }
}

/// A growable Bloom filter over index keys (byte strings), so that a read of a key
/// that was never written (a fresh entry id, a first child) needs no sled lookup. A
/// positive answer is only a hint: sled decides. Keys are never removed from it (a
/// removed key only costs a lookup until the next open). Its memory is bounded by
/// [`KEY_FILTER_BYTES_MAX`]: a filter that would grow beyond it drops its bits and
/// answers "maybe" for every key from then on (every read goes to sled, as without a
/// filter), so an index of any size costs at most that much memory here.
// Blocked like [`CommitIdFilter`]'s filters, but with 12 bits per key and 8 hashes
// (about 0.5% false positives per filter): a false positive costs one sled lookup.
pub(crate) struct KeyFilter {
    filters: Vec<Blocks>,
    /// Bytes of `filters`' blocks.
    bytes: u64,
    /// Grown past [`KEY_FILTER_BYTES_MAX`]: no bits kept, every key "maybe".
    saturated: bool,
}

/// Most bytes of bits a [`KeyFilter`] holds (about 44 million keys at 12 bits per
/// key, ~0.5% false positives each). Beyond it the filter saturates (see there).
pub const KEY_FILTER_BYTES_MAX: u64 = 64 << 20;

const KEY_BITS_PER_ITEM: u64 = 12;
const KEY_HASHES: u32 = 8;
const KEY_FIRST_CAPACITY: u64 = 1 << 16;

/// A key's block and bits: its two hashes.
fn key_bits(f: &Blocks, h: KeyHash) -> (usize, impl Iterator<Item = u64>) {
    let words = [h.1, mix(h.1 ^ h.0.rotate_left(29))];
    f.locate(h.0, words, KEY_HASHES)
}

/// Two hashes of a key. Stored only as the bits of a saved [`KeyFilter`]: a change
/// to the hash, to the bits it picks or to the filter's sizes is a change of the key
/// filter file's format ([`KeyFilter::encode`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyHash(u64, u64);

impl KeyHash {
    pub fn of(key: &[u8]) -> KeyHash {
        let mut h1 = 0x243F_6A88_85A3_08D3 ^ key.len() as u64;
        let mut h2 = 0x1319_8A2E_0370_7344u64;
        let mut chunks = key.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            let x = u64::from_le_bytes(w);
            h1 = mix(h1 ^ x);
            h2 = (h2 ^ x).rotate_left(23).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        }
        let rest = chunks.remainder();
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        let x = u64::from_le_bytes(w);
        h1 = mix(h1 ^ x);
        h2 = (h2 ^ x).rotate_left(23).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        KeyHash(h1, mix(h2 ^ h1))
    }
}

impl Default for KeyFilter {
    fn default() -> Self {
        KeyFilter::with_bytes_max(KEY_FILTER_BYTES_MAX)
    }
}

impl KeyFilter {
    fn with_bytes_max(bytes_max: u64) -> KeyFilter {
        let first = Blocks::new(KEY_FIRST_CAPACITY, KEY_BITS_PER_ITEM);
        let bytes = first.bytes();
        let mut f = KeyFilter {
            filters: vec![first],
            bytes,
            saturated: false,
        };
        f.bytes_max_check(bytes_max);
        f
    }

    /// Saturates when over `bytes_max` (see the type's docs).
    fn bytes_max_check(&mut self, bytes_max: u64) {
        if self.bytes > bytes_max {
            self.filters = Vec::new();
            self.bytes = 0;
            self.saturated = true;
        }
    }

    pub fn insert(&mut self, h: KeyHash) {
        self.insert_bounded(h, KEY_FILTER_BYTES_MAX);
    }

    fn insert_bounded(&mut self, h: KeyHash, bytes_max: u64) {
        if self.saturated {
            return;
        }
        if let Some(cap) = Blocks::next_capacity(&self.filters, KEY_FIRST_CAPACITY) {
            let next = Blocks::new(cap, KEY_BITS_PER_ITEM);
            self.bytes += next.bytes();
            self.filters.push(next);
            self.bytes_max_check(bytes_max);
            if self.saturated {
                return;
            }
        }
        if let Some(f) = self.filters.last_mut() {
            let at = key_bits(f, h);
            f.insert(at);
        }
        debug_assert!(self.bytes <= bytes_max);
    }

    /// Whether the filter gave up (see the type's docs): more keys change nothing.
    pub fn is_saturated(&self) -> bool {
        self.saturated
    }

    pub fn may_contain(&self, h: KeyHash) -> bool {
        self.saturated || self.filters.iter().any(|f| f.may_contain(key_bits(f, h)))
    }

    /// Appends the filter to `out` (docs/format.md, "Key filter file"): the number of
    /// filters (u32 BE), then per filter its capacity and items (u64 BE each) and its
    /// blocks' words (u64 BE, 8 per block). `false` (nothing appended) when saturated:
    /// such a filter holds nothing worth keeping.
    pub fn encode(&self, out: &mut Vec<u8>) -> bool {
        let mut put = |b: &[u8]| {
            out.extend_from_slice(b);
            Ok(())
        };
        self.encode_to(&mut put).unwrap_or(false)
    }

    /// [`KeyFilter::encode`] handed to `put` a piece at a time (at most 64 KiB): a
    /// filter still in its file is copied from it with reads.
    pub fn encode_to(
        &self,
        put: &mut dyn FnMut(&[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<bool> {
        if self.saturated {
            return Ok(false);
        }
        put(&(self.filters.len() as u32).to_be_bytes())?;
        let mut buf = Vec::with_capacity(CHUNK_BYTES);
        for f in &self.filters {
            put(&f.capacity.to_be_bytes())?;
            put(&f.items.to_be_bytes())?;
            let bytes = f.blocks.len() * 64;
            match &f.blocks {
                Bits::Mapped { src, offset, .. } if src.file.is_some() => {
                    let Some(file) = &src.file else {
                        continue;
                    };
                    let mut at = 0;
                    while at < bytes {
                        let n = (bytes - at).min(CHUNK_BYTES);
                        buf.resize(n, 0);
                        file.read_at(&mut buf, (offset + at) as u64)?;
                        put(&buf)?;
                        at += n;
                    }
                    buf.clear();
                }
                blocks => {
                    for b in 0..blocks.len() {
                        for w in 0..8 {
                            buf.extend_from_slice(&blocks.word(b, w).to_be_bytes());
                        }
                        if buf.len() >= CHUNK_BYTES {
                            put(&buf)?;
                            buf.clear();
                        }
                    }
                    put(&buf)?;
                    buf.clear();
                }
            }
        }
        Ok(true)
    }

    /// The filter [`KeyFilter::encode`] wrote into `bytes` (all of them). Checks the
    /// shape before allocating: capacities double from the first, every filter but the
    /// last is full, the blocks fit [`KEY_FILTER_BYTES_MAX`] and the bytes end exactly
    /// with the last block.
    pub fn decode(bytes: &[u8]) -> Result<KeyFilter, String> {
        KeyFilter::decode_in(bytes, None)
    }

    /// [`KeyFilter::decode`] of `map[offset..end]` that leaves the blocks in the map
    /// (read only where a lookup needs them, copied by the first insert into them).
    pub fn decode_mapped(
        src: Arc<FilterFile>,
        offset: usize,
        end: usize,
    ) -> Result<KeyFilter, String> {
        let bytes = src
            .map
            .get(offset..end)
            .ok_or("the filter lies past the file's end")?;
        KeyFilter::decode_in(bytes, Some((&src, offset)))
    }

    fn decode_in(
        bytes: &[u8],
        map: Option<(&Arc<FilterFile>, usize)>,
    ) -> Result<KeyFilter, String> {
        let mut r = bytes;
        let count = take_u32(&mut r).ok_or("no filter count")?;
        if count == 0 || count > KEY_FILTERS_MAX {
            return Err(format!("{count} filters (1 to {KEY_FILTERS_MAX})"));
        }
        let mut filters = Vec::with_capacity(count as usize);
        let mut total = 0u64;
        for i in 0..count {
            let capacity = take_u64(&mut r).ok_or("truncated filter header")?;
            let items = take_u64(&mut r).ok_or("truncated filter header")?;
            let want = KEY_FIRST_CAPACITY.checked_shl(i).unwrap_or(u64::MAX);
            if capacity != want {
                return Err(format!("filter {i} has capacity {capacity}, not {want}"));
            }
            let last = i + 1 == count;
            if items > capacity || (!last && items != capacity) {
                return Err(format!("filter {i} holds {items} of {capacity} keys"));
            }
            let nblocks = (capacity * KEY_BITS_PER_ITEM)
                .div_ceil(BLOCK_BITS)
                .next_power_of_two();
            let size = nblocks * BLOCK_BITS / 8;
            total = total.saturating_add(size);
            if total > KEY_FILTER_BYTES_MAX || (r.len() as u64) < size {
                return Err(format!(
                    "filter {i}'s {size} bytes of blocks are missing or too many"
                ));
            }
            let blocks = match map {
                Some((src, offset)) => {
                    let start = offset + (bytes.len() - r.len());
                    r = &r[size as usize..];
                    Bits::Mapped {
                        src: src.clone(),
                        offset: start,
                        nblocks: nblocks as usize,
                    }
                }
                None => {
                    let mut blocks = vec![[0u64; 8]; nblocks as usize];
                    for block in &mut blocks {
                        for w in block.iter_mut() {
                            *w = take_u64(&mut r).ok_or("truncated block")?;
                        }
                    }
                    Bits::Owned(blocks)
                }
            };
            filters.push(Blocks {
                blocks,
                items,
                capacity,
            });
        }
        if !r.is_empty() {
            return Err(format!("{} bytes after the last filter", r.len()));
        }
        Ok(KeyFilter {
            filters,
            bytes: total,
            saturated: false,
        })
    }
}

/// Most filters a decoded [`KeyFilter`] may have: capacities double from
/// `KEY_FIRST_CAPACITY`, so [`KEY_FILTER_BYTES_MAX`] is reached long before.
const KEY_FILTERS_MAX: u32 = 32;

/// The next big-endian u32 of `r`, which moves past it.
pub(crate) fn take_u32(r: &mut &[u8]) -> Option<u32> {
    let (head, rest) = r.split_first_chunk::<4>()?;
    *r = rest;
    Some(u32::from_be_bytes(*head))
}

fn take_u64(r: &mut &[u8]) -> Option<u64> {
    let (head, rest) = r.split_first_chunk::<8>()?;
    *r = rest;
    Some(u64::from_be_bytes(*head))
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

    #[test]
    fn key_filter_has_no_false_negatives_and_few_false_positives() {
        let mut f = KeyFilter::default();
        let key = |i: u64| format!("\x02\x0atranscript/session-{i:08x}/e").into_bytes();
        for i in 0..300_000u64 {
            f.insert(KeyHash::of(&key(i)));
        }
        assert!(f.filters.len() > 1);
        assert!((0..300_000u64).all(|i| f.may_contain(KeyHash::of(&key(i)))));
        let fp = (1_000_000u64..1_100_000)
            .filter(|i| f.may_contain(KeyHash::of(&key(*i))))
            .count();
        // About 0.5% per filter, a few filters.
        assert!(fp < 3_000, "{fp} false positives in 100000");
        assert!(!f.saturated);
        assert!(f.bytes <= KEY_FILTER_BYTES_MAX);
        assert_ne!(KeyHash::of(b"a"), KeyHash::of(b"a\0"));
    }

    #[test]
    fn key_filter_decodes_what_it_encodes_and_refuses_damage() {
        let mut f = KeyFilter::default();
        let key = |i: u64| format!("k{i}").into_bytes();
        for i in 0..150_000u64 {
            f.insert(KeyHash::of(&key(i)));
        }
        let mut bytes = Vec::new();
        assert!(f.encode(&mut bytes));
        let g = KeyFilter::decode(&bytes).unwrap();
        assert_eq!(g.filters.len(), f.filters.len());
        assert_eq!(g.bytes, f.bytes);
        assert!((0..150_000u64).all(|i| g.may_contain(KeyHash::of(&key(i)))));
        for i in 1_000_000..1_010_000u64 {
            let h = KeyHash::of(&key(i));
            assert_eq!(f.may_contain(h), g.may_contain(h));
        }
        // Every truncation is refused.
        for n in (0..bytes.len()).step_by(997).chain([bytes.len() - 1]) {
            assert!(
                KeyFilter::decode(&bytes[..n]).is_err(),
                "{n} bytes accepted"
            );
        }
        // A trailing byte, a wrong count, a wrong capacity, an overfull filter.
        let mut longer = bytes.clone();
        longer.push(0);
        assert!(KeyFilter::decode(&longer).is_err());
        for (at, value) in [(0usize, 0xFFu8), (3, 9), (4, 0x7F), (19, 0xFF)] {
            let mut bad = bytes.clone();
            bad[at] = value;
            assert!(
                KeyFilter::decode(&bad).is_err(),
                "byte {at} = {value} accepted"
            );
        }
        // A huge count allocates nothing: refused from its header.
        assert!(KeyFilter::decode(&u32::MAX.to_be_bytes()).is_err());
        // Saturated: nothing to save.
        let mut s = KeyFilter::with_bytes_max(0);
        s.insert_bounded(KeyHash::of(b"x"), 0);
        assert!(s.saturated);
        assert!(!s.encode(&mut Vec::new()));
    }

    /// A filter decoded in place from a map answers as the one decoded into memory,
    /// reads its blocks from the map until an insert, which copies only the filter
    /// it goes into (the map's bytes never change), and encodes to the same bytes.
    #[test]
    fn a_mapped_key_filter_answers_as_a_decoded_one_and_copies_on_insert() {
        let mut f = KeyFilter::default();
        let key = |i: u64| format!("k{i}").into_bytes();
        for i in 0..150_000u64 {
            f.insert(KeyHash::of(&key(i)));
        }
        let mut bytes = b"head".to_vec();
        assert!(f.encode(&mut bytes));
        let end = bytes.len();
        bytes.extend_from_slice(b"tail");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, &bytes).unwrap();
        use crate::vfs::Vfs;
        let file = crate::vfs::OsVfs
            .open(&path, crate::vfs::OpenMode::Read)
            .unwrap();
        let map = Arc::new(FilterFile {
            map: file.map().unwrap(),
            file: Some(file),
        });
        let mut m = KeyFilter::decode_mapped(map.clone(), 4, end).unwrap();
        assert!(m
            .filters
            .iter()
            .all(|f| matches!(f.blocks, Bits::Mapped { .. })));
        for i in (0..150_000u64).chain(1_000_000..1_010_000) {
            let h = KeyHash::of(&key(i));
            assert_eq!(m.may_contain(h), f.may_contain(h), "key {i}");
        }
        let mut again = Vec::new();
        assert!(m.encode(&mut again));
        assert_eq!(again, bytes[4..end]);
        // Shape errors are found in the map as in memory.
        assert!(KeyFilter::decode_mapped(map.clone(), 4, end - 1).is_err());
        assert!(KeyFilter::decode_mapped(map.clone(), 4, end + 1).is_err());
        assert!(KeyFilter::decode_mapped(map.clone(), end + 5, end + 5).is_err());
        let fresh = KeyHash::of(b"not inserted before");
        m.insert(fresh);
        f.insert(fresh);
        assert!(m.may_contain(fresh));
        let owned = m
            .filters
            .iter()
            .filter(|f| matches!(f.blocks, Bits::Owned(_)));
        assert_eq!(owned.count(), 1, "only the last filter is copied");
        for i in (0..150_000u64).chain(1_000_000..1_010_000) {
            let h = KeyHash::of(&key(i));
            assert_eq!(m.may_contain(h), f.may_contain(h), "key {i}");
        }
        assert_eq!(&map.map[..], &bytes[..], "the map is never written");
        // Encoded a piece at a time, the filters still mapped copied from the file.
        let mut pieces = Vec::new();
        assert!(m
            .encode_to(&mut |b: &[u8]| {
                assert!(b.len() <= CHUNK_BYTES);
                pieces.extend_from_slice(b);
                Ok(())
            })
            .unwrap());
        let mut whole = Vec::new();
        assert!(m.encode(&mut whole));
        assert_eq!(pieces, whole);
        let back = KeyFilter::decode(&whole).unwrap();
        for i in (0..150_000u64).chain(1_000_000..1_010_000) {
            let h = KeyHash::of(&key(i));
            assert_eq!(back.may_contain(h), f.may_contain(h), "key {i}");
        }
    }

    #[test]
    fn key_filter_saturates_at_its_bound_and_then_answers_maybe() {
        // The first block set costs 65536 keys × 12 bits = 96 KiB (rounded up to a
        // power of two of blocks); a bound of 256 KiB allows the second (doubled)
        // set but not the third.
        let bound = 256 << 10;
        let mut f = KeyFilter::with_bytes_max(bound);
        let key = |i: u64| format!("k{i}").into_bytes();
        let mut i = 0u64;
        while !f.saturated {
            f.insert_bounded(KeyHash::of(&key(i)), bound);
            assert!(f.bytes <= bound, "{} bytes after {i} keys", f.bytes);
            i += 1;
            assert!(i < 10_000_000, "never saturated");
        }
        assert!(i > KEY_FIRST_CAPACITY, "saturated after only {i} keys");
        assert_eq!(f.bytes, 0);
        assert!(f.filters.is_empty());
        // Every key, written or not, is "maybe" now: nothing is ruled out wrongly.
        assert!((0..i + 1000).all(|k| f.may_contain(KeyHash::of(&key(k)))));
        f.insert_bounded(KeyHash::of(b"more"), bound);
        assert_eq!(f.bytes, 0);
    }
}
