//! The index memtable: the writes not yet moved into sled, by key.
//!
//! Appends read and write it by single keys (about eight reads and six
//! writes per one-entry commit), reads of ranges are rarer. A `BTreeMap`
//! served both, but its point lookups were slow here: a memtable holds up
//! to ~25k keys that share long prefixes (a tag and a 36-byte session id),
//! so a lookup compared ~28 keys byte by byte, ~930 instructions under
//! callgrind, and such lookups were ~10 % of an append's instructions.
//! Point reads and writes now go through a hash map of the keys, and only
//! a key that is new to the memtable enters the ordered key set that range
//! reads walk. Both hold the same shared key
//! bytes. The map hashes with foldhash (seeded per map): std's SipHash
//! took ~300 instructions per key here.

use std::collections::BTreeSet;
use std::ops::Bound;
use std::sync::Arc;

/// A value as the memtable holds it: `None` is a removal.
pub(crate) type Value = Option<Vec<u8>>;

/// The memtable's writes: every key of `values` is in `order` and the
/// reverse.
#[derive(Debug, Default)]
pub(crate) struct MemTable {
    values: foldhash::HashMap<Arc<[u8]>, Value>,
    order: BTreeSet<Arc<[u8]>>,
}

impl MemTable {
    /// An empty memtable with room for `keys` keys (the previous one's
    /// count: the map then grows without rehashing on the way).
    pub(crate) fn with_capacity(keys: usize) -> MemTable {
        MemTable {
            values: foldhash::HashMap::with_capacity_and_hasher(keys, Default::default()),
            order: BTreeSet::new(),
        }
    }

    /// The value written for `k`, if any (`Some(None)`: removed).
    pub(crate) fn get(&self, k: &[u8]) -> Option<&Value> {
        self.values.get(k)
    }

    /// The value written for `k`, to change in place.
    pub(crate) fn get_mut(&mut self, k: &[u8]) -> Option<&mut Value> {
        self.values.get_mut(k)
    }

    /// Writes `v` for `k`; the value it replaces, if any.
    pub(crate) fn insert(&mut self, k: &[u8], v: Value) -> Option<Value> {
        if let Some(slot) = self.values.get_mut(k) {
            return Some(std::mem::replace(slot, v));
        }
        let key: Arc<[u8]> = Arc::from(k);
        self.order.insert(key.clone());
        self.values.insert(key, v);
        debug_assert_eq!(self.values.len(), self.order.len());
        None
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.values.len()
    }

    /// The writes with keys between `lo` and `hi`, in key order (none
    /// when `hi` is below `lo`).
    pub(crate) fn range<'a>(
        &'a self,
        lo: Bound<&'a [u8]>,
        hi: Bound<&'a [u8]>,
    ) -> impl Iterator<Item = (&'a [u8], &'a Value)> + 'a {
        // `BTreeSet::range` panics on such bounds; they hold no key.
        let empty = match (lo, hi) {
            (Bound::Included(a), Bound::Included(b)) => a > b,
            (Bound::Included(a) | Bound::Excluded(a), Bound::Included(b) | Bound::Excluded(b)) => {
                a >= b
            }
            _ => false,
        };
        let keys = if empty {
            None
        } else {
            Some(self.order.range::<[u8], _>((lo, hi)))
        };
        keys.into_iter()
            .flatten()
            .filter_map(move |k| Some((&**k, self.values.get(&**k)?)))
    }

    /// Every write, in no particular order (a move into sled sorts them).
    pub(crate) fn iter_unordered(&self) -> impl Iterator<Item = (&[u8], &Value)> {
        self.values.iter().map(|(k, v)| (&**k, v))
    }
}

/// A bound over an owned key as a bound over its bytes (what
/// [`MemTable::range`] takes).
pub(crate) fn bound_ref(b: &Bound<Vec<u8>>) -> Bound<&[u8]> {
    match b {
        Bound::Included(k) => Bound::Included(k.as_slice()),
        Bound::Excluded(k) => Bound::Excluded(k.as_slice()),
        Bound::Unbounded => Bound::Unbounded,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeMap;
    use std::ops::RangeBounds;

    fn key() -> impl Strategy<Value = Vec<u8>> {
        // Few distinct bytes and shared prefixes, so keys repeat and
        // ranges cut through runs of them.
        prop::collection::vec(prop::sample::select(vec![0u8, 1, 2, 0xff]), 0..5)
    }

    fn bounds() -> impl Strategy<Value = Bound<Vec<u8>>> {
        prop_oneof![
            key().prop_map(Bound::Included),
            key().prop_map(Bound::Excluded),
            Just(Bound::Unbounded),
        ]
    }

    proptest! {
        // A fixed seed: a failure reproduces as it is.
        #![proptest_config(ProptestConfig {
            cases: 256,
            rng_seed: proptest::test_runner::RngSeed::Fixed(0x6d65_6d74),
            failure_persistence: None,
            ..ProptestConfig::default()
        })]

        /// Against a `BTreeMap` model: every write, point read, in-place
        /// change and range read (with any bounds, empty ones included)
        /// agrees.
        #[test]
        fn the_memtable_behaves_like_an_ordered_map(
            ops in prop::collection::vec(
                (0u8..4, key(), prop::option::of(prop::collection::vec(any::<u8>(), 0..3))),
                0..200,
            ),
            ranges in prop::collection::vec((bounds(), bounds()), 1..8),
        ) {
            let mut m = MemTable::default();
            let mut model: BTreeMap<Vec<u8>, Value> = BTreeMap::new();
            for (op, k, v) in ops {
                match op {
                    0 | 1 => prop_assert_eq!(m.insert(&k, v.clone()), model.insert(k, v)),
                    2 => prop_assert_eq!(m.get(&k), model.get(&k)),
                    _ => {
                        if let Some(slot) = m.get_mut(&k) {
                            *slot = v.clone();
                        }
                        if let Some(slot) = model.get_mut(&k) {
                            *slot = v;
                        }
                    }
                }
                prop_assert_eq!(m.len(), model.len());
                prop_assert_eq!(m.is_empty(), model.is_empty());
            }
            for (lo, hi) in &ranges {
                let got: Vec<(Vec<u8>, Value)> = m
                    .range(bound_ref(lo), bound_ref(hi))
                    .map(|(k, v)| (k.to_vec(), v.clone()))
                    .collect();
                // The model filters instead of `BTreeMap::range`, which
                // panics on inverted bounds (the memtable returns nothing).
                let want: Vec<(Vec<u8>, Value)> = model
                    .iter()
                    .filter(|(k, _)| (bound_ref(lo), bound_ref(hi)).contains(k.as_slice()))
                    .map(|(k, v)| (k.clone(), v.clone()))
                    .collect();
                prop_assert_eq!(got, want);
            }
            let mut all: Vec<(Vec<u8>, Value)> =
                m.iter_unordered().map(|(k, v)| (k.to_vec(), v.clone())).collect();
            all.sort();
            let want: Vec<(Vec<u8>, Value)> = model.into_iter().collect();
            prop_assert_eq!(all, want);
        }
    }
}
