//! The cache entries of an index without a directory (an index over a checkpoint, in a
//! read-only process): kept in memory only, so bounded in bytes. Its entries live only
//! as long as the process, and a process that reads many sessions would otherwise keep
//! a snapshot of each.

use std::collections::BTreeMap;

/// Bytes of keys and values the cache of an index without sled holds at most. A put
/// that would go past it empties the cache first (the newest entries are the likeliest
/// to be read again); a single entry larger than this is not kept.
pub const MEM_CACHE_BYTES_MAX: usize = 16 << 20;

/// Cache entries in memory, at most [`MEM_CACHE_BYTES_MAX`] bytes of them.
#[derive(Debug, Default)]
pub(crate) struct MemCache {
    map: BTreeMap<Vec<u8>, Vec<u8>>,
    bytes: usize,
}

impl MemCache {
    pub(crate) fn insert(&mut self, key: Vec<u8>, value: &[u8]) {
        self.remove(&key);
        let size = key.len() + value.len();
        if size > MEM_CACHE_BYTES_MAX {
            return;
        }
        if self.bytes + size > MEM_CACHE_BYTES_MAX {
            self.map.clear();
            self.bytes = 0;
        }
        self.bytes += size;
        self.map.insert(key, value.to_vec());
        debug_assert!(self.bytes <= MEM_CACHE_BYTES_MAX);
    }

    pub(crate) fn get(&self, key: &[u8]) -> Option<&[u8]> {
        self.map.get(key).map(Vec::as_slice)
    }

    pub(crate) fn remove(&mut self, key: &[u8]) {
        if let Some(old) = self.map.remove(key) {
            self.bytes -= key.len() + old.len();
        }
    }

    /// Entries whose keys start with `prefix`, copied out.
    pub(crate) fn with_prefix(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.map
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cache_never_holds_more_than_its_budget_and_keeps_the_newest() {
        let mut c = MemCache::default();
        let value = vec![7u8; 1 << 20];
        for i in 0..100u32 {
            c.insert(i.to_be_bytes().to_vec(), &value);
            assert!(c.bytes() <= MEM_CACHE_BYTES_MAX, "after {i}");
            assert_eq!(c.get(&i.to_be_bytes()), Some(&value[..]), "the newest, {i}");
        }
        // Replacing and removing keep the count exact.
        c.insert(99u32.to_be_bytes().to_vec(), b"small");
        assert_eq!(c.get(&99u32.to_be_bytes()), Some(&b"small"[..]));
        let held: usize = c.map.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(c.bytes(), held);
        c.remove(&99u32.to_be_bytes());
        assert_eq!(c.get(&99u32.to_be_bytes()), None);
        let held: usize = c.map.iter().map(|(k, v)| k.len() + v.len()).sum();
        assert_eq!(c.bytes(), held);
        // An entry over the budget is not kept, and does not empty the cache.
        let before = c.bytes();
        c.insert(b"huge".to_vec(), &vec![0u8; MEM_CACHE_BYTES_MAX + 1]);
        assert_eq!(c.get(b"huge"), None);
        assert_eq!(c.bytes(), before);
        // Prefix reads.
        c.insert(b"p/1".to_vec(), b"a");
        c.insert(b"p/2".to_vec(), b"b");
        c.insert(b"q/1".to_vec(), b"c");
        assert_eq!(
            c.with_prefix(b"p/"),
            vec![
                (b"p/1".to_vec(), b"a".to_vec()),
                (b"p/2".to_vec(), b"b".to_vec())
            ]
        );
    }
}
