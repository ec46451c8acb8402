//! [`SharedSeq`]: an immutable sequence whose successive versions share
//! their storage, so that a resident selection extended by an append
//! costs what the append added and dropped, not what the selection holds.
//!
//! A handle publishes a new snapshot per commit while the previous one
//! stays readable. With plain vectors every publication copied every
//! resident entry's shared pointer (one atomic increment each, and one
//! decrement when the old snapshot went): the append cost grew with the
//! budget, where with this type it stays flat (see BENCHMARKS.md,
//! Decisions). Here the elements live in an
//! append-only arena of write-once slots shared by the versions; a
//! version is a window over it plus two loose ends:
//!
//! ```text
//! [head?] ++ arena[start..end] ++ [tail?]
//! ```
//!
//! - `head`: a first element kept while the ones after it are dropped
//!   (the pinned compaction of a selection).
//! - `tail`: the last element, outside the arena so that the next version
//!   may replace it (the leaf's navigation links gain a child when an
//!   entry is appended under it). Whenever the window is non-empty the
//!   tail is there.
//!
//! A new version claims the arena's next free slots (an atomic
//! compare-and-swap on the claimed count, so two versions extended from
//! the same one never write the same slot) and fills them before it
//! exists; slots are never written twice, so every reader of an older
//! version sees its own elements unchanged. When the arena is full, when
//! another version claimed the slots first, or when the dropped prefix
//! outweighs what is live (see [`SharedSeq::extended`]), the live
//! elements move to a fresh arena: amortised over the appends that filled
//! the old one, still constant per element. What an old arena retains is
//! bounded by that rule, so memory stays proportional to the window.

use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use serde::{Serialize, Serializer};

/// What replaces the last kept element in [`SharedSeq::extended`].
pub type MapLast<'a, T> = Option<&'a dyn Fn(&T) -> T>;

/// What [`SharedSeq::extended`] puts after the kept elements, and the
/// weights that decide when they move to a fresh arena.
pub struct Appended<'a, T> {
    /// Replaces the last kept element (a leaf's links gain a child).
    pub map_last: MapLast<'a, T>,
    /// The elements that follow the kept ones.
    pub new: Vec<T>,
    /// Weight of the elements the extension drops (the caller's unit).
    pub dropped_weight: u64,
    /// The most the kept elements may weigh.
    pub live_weight_max: u64,
}

impl<T> Appended<'_, T> {
    /// `new` after the kept elements, nothing replaced, weights not
    /// counted (only the count of dropped elements moves the window to a
    /// fresh arena).
    pub fn new(new: Vec<T>) -> Self {
        Appended {
            map_last: None,
            new,
            dropped_weight: 0,
            live_weight_max: u64::MAX,
        }
    }
}

/// Slots an arena gets beyond twice its initial elements.
const ARENA_SLACK_SLOTS: usize = 16;

/// Write-once slots shared by the versions of a sequence.
struct Arena<T> {
    slots: Box<[OnceLock<T>]>,
    /// Slots `[0, claimed)` belong to some version (filled before that
    /// version exists); the rest are free.
    claimed: AtomicUsize,
}

impl<T> Arena<T> {
    fn with_capacity(n: usize) -> Arena<T> {
        Arena {
            slots: (0..n).map(|_| OnceLock::new()).collect(),
            claimed: AtomicUsize::new(0),
        }
    }

    /// Claims `n` slots from `at` (which must be the claimed count) and
    /// fills them; `false` (nothing written) when another version claimed
    /// them first or the arena is too small.
    fn try_push(&self, at: usize, items: &mut Vec<T>) -> bool {
        let n = items.len();
        let Some(end) = at.checked_add(n) else {
            return false;
        };
        if end > self.slots.len() {
            return false;
        }
        if self
            .claimed
            .compare_exchange(at, end, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return false;
        }
        for (slot, item) in self.slots[at..end].iter().zip(items.drain(..)) {
            // Freshly claimed by this call alone: never set before.
            let set = slot.set(item);
            debug_assert!(set.is_ok(), "a claimed slot was already set");
        }
        true
    }
}

/// An immutable sequence sharing its storage with the sequences extended
/// from it (see the module docs). Cloning is constant-time.
pub struct SharedSeq<T> {
    head: Option<T>,
    arena: Arc<Arena<T>>,
    start: usize,
    end: usize,
    tail: Option<T>,
    /// Weight of the elements dropped from the front since the arena was
    /// made (the caller's unit: resident bytes for entries): what the
    /// arena keeps alive beyond the window.
    dead_weight: u64,
}

impl<T> SharedSeq<T> {
    /// The empty sequence.
    pub fn new() -> SharedSeq<T> {
        SharedSeq {
            head: None,
            arena: Arc::new(Arena::with_capacity(0)),
            start: 0,
            end: 0,
            tail: None,
            dead_weight: 0,
        }
    }

    pub fn len(&self) -> usize {
        usize::from(self.head.is_some())
            + (self.end - self.start)
            + usize::from(self.tail.is_some())
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The element at `i`, `None` past the end.
    pub fn get(&self, i: usize) -> Option<&T> {
        let mut i = i;
        if let Some(h) = &self.head {
            if i == 0 {
                return Some(h);
            }
            i -= 1;
        }
        let in_arena = self.end - self.start;
        if i < in_arena {
            return self.arena.slots.get(self.start + i).and_then(OnceLock::get);
        }
        if i == in_arena {
            return self.tail.as_ref();
        }
        None
    }

    pub fn first(&self) -> Option<&T> {
        self.get(0)
    }

    pub fn last(&self) -> Option<&T> {
        self.tail.as_ref().or(self.head.as_ref())
    }

    pub fn iter(&self) -> Iter<'_, T> {
        Iter {
            head: self.head.as_ref(),
            arena: self
                .arena
                .slots
                .get(self.start..self.end)
                .unwrap_or_default()
                .iter(),
            tail: self.tail.as_ref(),
        }
    }
}

impl<T: Clone> SharedSeq<T> {
    /// This sequence without its first `skip` elements, except the one at
    /// `keep` when it is among them (it is then kept, first), followed by
    /// `add.new`; the last kept element is replaced by `add.map_last` of
    /// it when given.
    ///
    /// `add.dropped_weight` is the weight of the dropped elements and
    /// `add.live_weight_max` the most the kept ones may weigh: once the
    /// elements dropped since the arena was made outweigh that bound (or
    /// outnumber the live ones), the live ones move to a fresh arena, so
    /// what an arena keeps alive stays bounded by the window.
    ///
    /// `None` when `skip` exceeds the length.
    pub fn extended(
        &self,
        keep: Option<usize>,
        skip: usize,
        add: Appended<'_, T>,
    ) -> Option<SharedSeq<T>> {
        if skip > self.len() {
            return None;
        }
        match keep {
            // Drop the elements before it, then keep it first and drop
            // the rest of the `skip`.
            Some(k) if k < skip => self
                .kept_first(false, k, Appended::new(Vec::new()))?
                .kept_first(true, skip - k - 1, add),
            _ => self.kept_first(false, skip, add),
        }
    }

    /// [`SharedSeq::extended`] with the kept element, if any, at the front:
    /// `kept ++ add.new`, where `kept` is this one's first element when
    /// `keep_first`, then this one's elements after it without the first
    /// `drop` of them.
    fn kept_first(
        &self,
        keep_first: bool,
        drop: usize,
        add: Appended<'_, T>,
    ) -> Option<SharedSeq<T>> {
        let Appended {
            map_last,
            new,
            dropped_weight,
            live_weight_max,
        } = add;
        let len = self.len();
        let keep_first = keep_first && len > 0;
        if drop > len - usize::from(keep_first) {
            return None;
        }
        // Walk the old elements from the front: the kept first one, then
        // `drop` dropped ones, then the kept rest (`from..end` of the
        // arena, then the tail when kept).
        let mut to_drop = drop;
        let mut first: Option<T> = None;
        let mut from = self.start;
        let mut take_first = keep_first;
        if let Some(h) = &self.head {
            if take_first {
                first = Some(h.clone());
                take_first = false;
            } else if to_drop > 0 {
                to_drop -= 1;
            } else {
                // Nothing dropped: the head stays the head.
                first = Some(h.clone());
            }
        }
        if take_first && from < self.end {
            first = self.get(usize::from(self.head.is_some())).cloned();
            from += 1;
            take_first = false;
        }
        let in_arena = self.end - from;
        let mut tail_kept = self.tail.is_some();
        if to_drop <= in_arena {
            from += to_drop;
        } else {
            // Everything in the arena goes, and the tail: the bound above
            // says exactly one more element is there to drop.
            from = self.end;
            tail_kept = false;
        }
        if take_first {
            // Only the tail was there: it is the kept first.
            first = self.tail.clone();
            tail_kept = false;
        }
        let mut tail = if tail_kept { self.tail.clone() } else { None };
        // Replace the last kept element: the tail, else the kept first.
        if let Some(f) = map_last {
            if let Some(t) = &tail {
                tail = Some(f(t));
            } else if let Some(h) = &first {
                first = Some(f(h));
            }
        }
        let mut new = new;
        let new_tail = new.pop();
        let live = (self.end - from) + usize::from(tail.is_some()) + new.len();
        let dead_weight = self.dead_weight.saturating_add(dropped_weight);
        let fresh_arena = dead_weight > live_weight_max || from > live + ARENA_SLACK_SLOTS;
        // After the window: nothing new keeps the (mapped) tail as the
        // tail; otherwise it goes into the arena, followed by the new
        // elements but the last, which becomes the tail.
        let (mut push, tail) = match new_tail {
            None => (Vec::new(), tail),
            Some(t) => {
                let mut push: Vec<T> = Vec::with_capacity(new.len() + 1);
                push.extend(tail);
                push.append(&mut new);
                (push, Some(t))
            }
        };
        if !fresh_arena {
            let n = push.len();
            if n == 0 || self.arena.try_push(self.end, &mut push) {
                return Some(SharedSeq {
                    head: first,
                    arena: self.arena.clone(),
                    start: from,
                    end: self.end + n,
                    tail,
                    dead_weight,
                });
            }
        }
        // A fresh arena holding the live window and what is pushed.
        let mut items: Vec<T> = Vec::with_capacity(self.end - from + push.len());
        items.extend(
            self.arena
                .slots
                .get(from..self.end)
                .unwrap_or_default()
                .iter()
                .filter_map(OnceLock::get)
                .cloned(),
        );
        items.append(&mut push);
        let mut out = SharedSeq::from_arena_items(items, tail);
        out.head = first;
        Some(out)
    }

    /// A sequence of `items` (in the arena) followed by `tail`.
    fn from_arena_items(mut items: Vec<T>, tail: Option<T>) -> SharedSeq<T> {
        let n = items.len();
        let arena = Arena::with_capacity(n.saturating_mul(2).saturating_add(ARENA_SLACK_SLOTS));
        let pushed = arena.try_push(0, &mut items);
        debug_assert!(pushed, "a fresh arena takes its initial items");
        SharedSeq {
            head: None,
            arena: Arc::new(arena),
            start: 0,
            end: if pushed { n } else { 0 },
            tail,
            dead_weight: 0,
        }
    }
}

impl<T> Default for SharedSeq<T> {
    fn default() -> Self {
        SharedSeq::new()
    }
}

impl<T: Clone> From<Vec<T>> for SharedSeq<T> {
    fn from(mut v: Vec<T>) -> SharedSeq<T> {
        let tail = v.pop();
        SharedSeq::from_arena_items(v, tail)
    }
}

impl<T: Clone> FromIterator<T> for SharedSeq<T> {
    fn from_iter<I: IntoIterator<Item = T>>(iter: I) -> SharedSeq<T> {
        SharedSeq::from(iter.into_iter().collect::<Vec<T>>())
    }
}

impl<T: Clone> Clone for SharedSeq<T> {
    fn clone(&self) -> Self {
        SharedSeq {
            head: self.head.clone(),
            arena: self.arena.clone(),
            start: self.start,
            end: self.end,
            tail: self.tail.clone(),
            dead_weight: self.dead_weight,
        }
    }
}

/// Element by element (where the elements are stored does not matter).
impl<T: PartialEq> PartialEq for SharedSeq<T> {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: Eq> Eq for SharedSeq<T> {}

impl<T: PartialEq> PartialEq<Vec<T>> for SharedSeq<T> {
    fn eq(&self, other: &Vec<T>) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: PartialEq> PartialEq<[T]> for SharedSeq<T> {
    fn eq(&self, other: &[T]) -> bool {
        self.len() == other.len() && self.iter().eq(other.iter())
    }
}

impl<T: fmt::Debug> fmt::Debug for SharedSeq<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// As a sequence of the elements.
impl<T: Serialize> Serialize for SharedSeq<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

impl<T> std::ops::Index<usize> for SharedSeq<T> {
    type Output = T;

    /// Panics past the end, as a slice does.
    fn index(&self, i: usize) -> &T {
        match self.get(i) {
            Some(v) => v,
            None => panic!("index {i} out of range for a sequence of {}", self.len()),
        }
    }
}

impl<'a, T> IntoIterator for &'a SharedSeq<T> {
    type Item = &'a T;
    type IntoIter = Iter<'a, T>;
    fn into_iter(self) -> Iter<'a, T> {
        self.iter()
    }
}

/// The elements of a [`SharedSeq`] in order.
pub struct Iter<'a, T> {
    head: Option<&'a T>,
    arena: std::slice::Iter<'a, OnceLock<T>>,
    tail: Option<&'a T>,
}

impl<'a, T> Iterator for Iter<'a, T> {
    type Item = &'a T;

    fn next(&mut self) -> Option<&'a T> {
        if let Some(h) = self.head.take() {
            return Some(h);
        }
        for slot in self.arena.by_ref() {
            // Every slot of a version's window was set before the version
            // existed.
            if let Some(v) = slot.get() {
                return Some(v);
            }
        }
        self.tail.take()
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n =
            usize::from(self.head.is_some()) + self.arena.len() + usize::from(self.tail.is_some());
        (n, Some(n))
    }
}

impl<T> DoubleEndedIterator for Iter<'_, T> {
    fn next_back(&mut self) -> Option<Self::Item> {
        if let Some(t) = self.tail.take() {
            return Some(t);
        }
        while let Some(slot) = self.arena.next_back() {
            if let Some(v) = slot.get() {
                return Some(v);
            }
        }
        self.head.take()
    }
}

impl<T> ExactSizeIterator for Iter<'_, T> {}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};

    /// A plain-vector model of [`SharedSeq::extended`] (`map_last` adds
    /// 1000).
    fn model(
        v: &[u32],
        keep: Option<usize>,
        skip: usize,
        map_last: bool,
        new: &[u32],
    ) -> Option<Vec<u32>> {
        if skip > v.len() {
            return None;
        }
        let mut out: Vec<u32> = Vec::new();
        if let Some(k) = keep.filter(|&k| k < skip) {
            out.push(v[k]);
        }
        out.extend_from_slice(&v[skip..]);
        if map_last {
            if let Some(l) = out.last_mut() {
                *l += 1000;
            }
        }
        out.extend_from_slice(new);
        Some(out)
    }

    fn check(seq: &SharedSeq<u32>, want: &[u32]) -> Result<(), TestCaseError> {
        prop_assert_eq!(seq.len(), want.len());
        prop_assert_eq!(seq.iter().copied().collect::<Vec<_>>(), want);
        let back: Vec<u32> = want.iter().rev().copied().collect();
        prop_assert_eq!(seq.iter().rev().copied().collect::<Vec<_>>(), back);
        for (i, w) in want.iter().enumerate() {
            prop_assert_eq!(seq.get(i), Some(w));
        }
        prop_assert_eq!(seq.get(want.len()), None);
        prop_assert_eq!(seq.first(), want.first());
        prop_assert_eq!(seq.last(), want.last());
        prop_assert_eq!(seq.iter().len(), want.len());
        Ok(())
    }

    /// One extension: which earlier version it extends (an index taken
    /// modulo the versions so far, mostly the newest), the element kept,
    /// the elements skipped, whether the last kept one is replaced, how
    /// many new ones, the weight bound.
    type Step = (bool, usize, Option<usize>, usize, bool, usize, u64);

    fn step() -> impl Strategy<Value = Step> {
        (
            prop::bool::weighted(0.2),
            0usize..64,
            prop::option::of(0usize..8),
            0usize..10,
            any::<bool>(),
            0usize..4,
            0u64..8,
        )
    }

    proptest! {
        #![proptest_config(Config {
            cases: 256,
            rng_seed: RngSeed::Fixed(0x5eed_0005),
            failure_persistence: None,
            ..Config::default()
        })]

        /// Chains of extensions, some of older versions (a branch: the
        /// slots after it are taken, so it must not disturb the chain),
        /// agree with the vector model, and every version keeps its
        /// elements while later ones are made.
        #[test]
        fn extensions_agree_with_a_vector_model_and_keep_old_versions_intact(
            start in 0u32..6,
            steps in prop::collection::vec(step(), 1..60),
        ) {
            let first: Vec<u32> = (0..start).collect();
            let mut versions: Vec<(SharedSeq<u32>, Vec<u32>)> =
                vec![(SharedSeq::from(first.clone()), first)];
            let mut next = 100u32;
            for (older, pick, keep, skip, map_last, n_new, weight_max) in steps {
                let at = if older { pick % versions.len() } else { versions.len() - 1 };
                let (seq, want) = versions[at].clone();
                let new: Vec<u32> = (0..n_new)
                    .map(|_| {
                        next += 1;
                        next
                    })
                    .collect();
                let f = |x: &u32| x + 1000;
                let got = seq.extended(
                    keep,
                    skip,
                    Appended {
                        map_last: if map_last { Some(&f) } else { None },
                        new: new.clone(),
                        dropped_weight: skip as u64,
                        live_weight_max: weight_max,
                    },
                );
                let expect = model(&want, keep, skip, map_last, &new);
                prop_assert_eq!(got.is_some(), expect.is_some());
                if let (Some(g), Some(e)) = (got, expect) {
                    check(&g, &e)?;
                    versions.push((g, e));
                }
                for (s, w) in &versions {
                    check(s, w)?;
                }
            }
        }
    }

    /// Appending one element and dropping one per version keeps the arena
    /// bounded: the dropped prefix moves out once it outnumbers the window.
    #[test]
    fn a_sliding_window_keeps_its_arena_bounded() {
        let mut seq: SharedSeq<u64> = (0..10).collect();
        for i in 10..10_000u64 {
            seq = seq.extended(None, 1, Appended::new(vec![i])).unwrap();
            assert_eq!(seq.len(), 10);
            assert!(seq.arena.slots.len() <= 2 * 10 + 2 * ARENA_SLACK_SLOTS + 2);
        }
        let want: Vec<u64> = (9_990..10_000).collect();
        assert_eq!(seq, want);
    }

    /// Dropped weight beyond the bound moves the window to a fresh arena.
    #[test]
    fn dropped_weight_beyond_the_bound_starts_a_fresh_arena() {
        let weighed = |n: u64| Appended {
            dropped_weight: 30,
            live_weight_max: 50,
            ..Appended::new(vec![n])
        };
        let seq: SharedSeq<u64> = (0..100).collect();
        let a = seq.extended(None, 3, weighed(100)).unwrap();
        assert!(Arc::ptr_eq(&a.arena, &seq.arena));
        let b = a.extended(None, 3, weighed(101)).unwrap();
        assert!(!Arc::ptr_eq(&b.arena, &a.arena));
        assert_eq!(b.dead_weight, 0);
        assert_eq!(b, (6..102).collect::<Vec<u64>>());
    }
}
