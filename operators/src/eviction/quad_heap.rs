//! A max-heap with four children per node, ordered by a `u64` key, each
//! key carrying a value.
//!
//! LARU pops a victim at every eviction from a heap as large as the cache.
//! Halving the depth of std's binary heap halves the dependent loads of a
//! pop, and a node's four children sit next to each other in memory, so
//! choosing among them costs one or two cache lines instead of one per level.
//! Keys and values live in separate arrays: a sift compares keys only, and
//! four children's keys fill half a cache line.
//!
//! The key storage past the last item always holds at least four zeros, a
//! floor no key is below, so every node that has a child has four readable
//! children: choosing the largest is one fixed-size tournament with no case
//! for a short last family. Items with equal keys come out in no
//! particular order; [`QuadHeap::ties_of_top`] finds all of the top's.

/// Children per node.
const ARITY: usize = 4;
/// The key padding past the last item.
const FLOOR: u64 = 0;

/// Max-heap of values by `u64` key.
#[derive(Debug, Clone)]
pub struct QuadHeap<V> {
    /// `len` keys in heap order, then at least ARITY copies of FLOOR.
    keys: Vec<u64>,
    /// The value of each key (exactly `len`).
    values: Vec<V>,
}

impl<V: Copy> QuadHeap<V> {
    pub fn new() -> Self {
        Self {
            keys: vec![FLOOR; ARITY],
            values: Vec::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.values.len()
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// The largest key and its value.
    #[inline(always)]
    pub fn peek(&self) -> Option<(u64, V)> {
        let v = *self.values.first()?;
        Some((self.keys[0], v))
    }

    pub fn push(&mut self, key: u64, value: V) {
        let hole = self.len();
        // One more padding key; the sift writes the item's slot.
        self.keys.push(FLOOR);
        self.values.push(value);
        self.sift_up(hole, key, value);
    }

    /// Removes and returns the largest key and its value.
    pub fn pop(&mut self) -> Option<(u64, V)> {
        let last_value = self.values.pop()?;
        let len = self.len();
        let last_key = std::mem::replace(&mut self.keys[len], FLOOR);
        self.keys.pop();
        if len == 0 {
            return Some((last_key, last_value));
        }
        let top = (self.keys[0], self.values[0]);
        self.sift_down_to_bottom(last_key, last_value);
        Some(top)
    }

    /// Replaces the largest item (one sift instead of a pop and a push);
    /// pushes when empty. The sift stops as soon as the new item is in
    /// place: LARU's replacement is a fresh prediction, usually among the
    /// largest, so going to the bottom and back (as `pop` does) would waste
    /// both trips.
    pub fn replace_top(&mut self, key: u64, value: V) {
        if self.len() == 0 {
            self.push(key, value);
        } else {
            self.sift_down(0, key, value);
        }
    }

    /// Every value whose key equals the top's (the top's own included), in
    /// no particular order. They form a subtree at the root (each one's
    /// ancestors are between it and the top), so the walk reads only them
    /// and their children: usually the root and its four children.
    #[inline(always)]
    pub fn ties_of_top(&self, mut visit: impl FnMut(V)) {
        let Some((top, v)) = self.peek() else {
            return;
        };
        visit(v);
        // Mostly no child ties: four compares, no walk. (Padding is the
        // floor; a top equal to it is checked by the walk's bounds.)
        let k = &self.keys[1..1 + ARITY];
        if (k[0] == top) | (k[1] == top) | (k[2] == top) | (k[3] == top) {
            self.visit_ties_below_root(top, visit);
        }
    }

    #[cold]
    #[inline(never)]
    fn visit_ties_below_root(&self, top: u64, mut visit: impl FnMut(V)) {
        let mut stack = Vec::new();
        let mut parent = 0;
        loop {
            // Real children only: padding equals a top of FLOOR.
            let first = ARITY * parent + 1;
            for c in first..(first + ARITY).min(self.len()) {
                if self.keys[c] == top {
                    visit(self.values[c]);
                    stack.push(c);
                }
            }
            match stack.pop() {
                Some(next) => parent = next,
                None => return,
            }
        }
    }

    /// Keeps the items for which `keep` holds and restores the heap order.
    pub fn retain(&mut self, keep: impl FnMut(u64, V) -> bool) {
        self.compact(keep);
        self.heapify();
    }

    /// Replaces the contents by `n` items, the i-th made by `item(i)`
    /// (in order), in O(n).
    #[inline(always)]
    pub fn rebuild(&mut self, n: usize, mut item: impl FnMut(usize) -> (u64, V)) {
        self.keys.clear();
        self.values.clear();
        self.keys.resize(n + ARITY, FLOOR);
        if n == 0 {
            return;
        }
        // Room for every value up front: the loop then only stores.
        let (k0, v0) = item(0);
        self.keys[0] = k0;
        self.values.resize(n, v0);
        for i in 1..n {
            let (k, v) = item(i);
            self.keys[i] = k;
            self.values[i] = v;
        }
        self.heapify();
    }

    /// Drops the items for which `keep` fails, without a branch on it: a
    /// sweep keeps about half, in no pattern a predictor could learn.
    fn compact(&mut self, mut keep: impl FnMut(u64, V) -> bool) {
        let mut kept = 0;
        for i in 0..self.len() {
            let (k, v) = (self.keys[i], self.values[i]);
            self.keys[kept] = k;
            self.values[kept] = v;
            kept += keep(k, v) as usize;
        }
        self.truncate(kept);
    }

    /// Keeps the first `len` items; the floor follows them.
    fn truncate(&mut self, len: usize) {
        self.values.truncate(len);
        self.keys.truncate(len);
        self.keys.extend([FLOOR; ARITY]);
    }

    fn heapify(&mut self) {
        let len = self.len();
        if len > 1 {
            for i in (0..=(len - 2) / ARITY).rev() {
                self.sift_down(i, self.keys[i], self.values[i]);
            }
        }
    }

    #[inline(always)]
    fn sift_up(&mut self, mut hole: usize, key: u64, value: V) {
        while hole > 0 {
            let parent = (hole - 1) / ARITY;
            if self.keys[parent] >= key {
                break;
            }
            self.keys[hole] = self.keys[parent];
            self.values[hole] = self.values[parent];
            hole = parent;
        }
        self.keys[hole] = key;
        self.values[hole] = value;
    }

    /// The largest child of `i` and its key, if `i` has children.
    #[inline(always)]
    fn largest_child(&self, i: usize) -> Option<(usize, u64)> {
        let first = ARITY * i + 1;
        if first >= self.len() {
            return None;
        }
        // In bounds: the floor pads the storage past the last item. The
        // tournament runs on the keys, so no load waits on a comparison;
        // a padding child never wins against a real one (ties go left).
        let k: &[u64; ARITY] = self.keys[first..first + ARITY]
            .try_into()
            .expect("four children");
        let (a, ia) = if k[1] > k[0] { (k[1], 1) } else { (k[0], 0) };
        let (b, ib) = if k[3] > k[2] { (k[3], 3) } else { (k[2], 2) };
        let (c, ic) = if b > a { (b, ib) } else { (a, ia) };
        Some((first + ic, c))
    }

    /// Places (`key`, `value`) at `hole` or below it.
    #[inline(always)]
    fn sift_down(&mut self, mut hole: usize, key: u64, value: V) {
        while let Some((c, kid)) = self.largest_child(hole) {
            if kid <= key {
                break;
            }
            self.keys[hole] = kid;
            self.values[hole] = self.values[c];
            hole = c;
        }
        self.keys[hole] = key;
        self.values[hole] = value;
    }

    /// Moves the largest children up from the root to a leaf, then sifts
    /// (`key`, `value`) up from there: it came from the bottom, so it
    /// usually belongs near there and this saves comparing it at every
    /// level on the way down.
    fn sift_down_to_bottom(&mut self, key: u64, value: V) {
        let mut hole = 0;
        while let Some((c, kid)) = self.largest_child(hole) {
            self.keys[hole] = kid;
            self.values[hole] = self.values[c];
            hole = c;
        }
        self.sift_up(hole, key, value);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::collections::BinaryHeap;

    /// Keys only: equal keys may come out with their values in any order.
    fn keys_of(h: &QuadHeap<u32>) -> Option<u64> {
        h.peek().map(|(k, _)| k)
    }

    #[test]
    fn matches_std_binary_heap_under_random_operations() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut ours: QuadHeap<u32> = QuadHeap::new();
        let mut reference = BinaryHeap::new();
        for step in 0..20_000u32 {
            match rng.random_range(0..11) {
                0..=4 => {
                    let k: u64 = rng.random_range(0..500);
                    ours.push(k, step);
                    reference.push(k);
                }
                5..=7 => assert_eq!(
                    ours.pop().map(|(k, _)| k),
                    reference.pop(),
                    "pop at step {step}"
                ),
                8 => {
                    let k: u64 = rng.random_range(0..500);
                    ours.replace_top(k, step);
                    if let Some(mut top) = reference.peek_mut() {
                        *top = k;
                    } else {
                        reference.push(k);
                    }
                }
                9 if step % 2 == 0 => {
                    let m = rng.random_range(2..5);
                    ours.retain(|k, _| k % m != 0);
                    reference.retain(|k| k % m != 0);
                }
                9 => {
                    let items: Vec<u64> = (0..rng.random_range(0..40))
                        .map(|_| rng.random_range(0..500))
                        .collect();
                    ours.rebuild(items.len(), |i| (items[i], step));
                    reference = items.into_iter().collect();
                }
                _ if step % 97 == 0 => {
                    ours.clear();
                    reference.clear();
                }
                _ => {}
            }
            assert_eq!(
                keys_of(&ours),
                reference.peek().copied(),
                "peek at step {step}"
            );
            assert_eq!(ours.len(), reference.len());
            assert!(
                ours.keys[ours.len()..].len() >= ARITY
                    && ours.keys[ours.len()..].iter().all(|&x| x == FLOOR),
                "the floor pads the storage at step {step}"
            );
        }
        let mut rest = Vec::new();
        while let Some((k, _)) = ours.pop() {
            rest.push(k);
        }
        assert_eq!(
            rest,
            reference
                .into_sorted_vec()
                .into_iter()
                .rev()
                .collect::<Vec<_>>()
        );
    }

    #[test]
    fn pops_in_descending_order_with_each_keys_value() {
        let mut h = QuadHeap::new();
        for v in [5u64, 1, 9, 3, 7, 2, 8, 6, 4, 0, 11, 10] {
            h.push(v, v as u32 * 10);
        }
        let popped: Vec<_> = std::iter::from_fn(|| h.pop()).collect();
        let expected: Vec<_> = (0..12u64).rev().map(|k| (k, k as u32 * 10)).collect();
        assert_eq!(popped, expected);
        assert_eq!(h.len(), 0);
        assert_eq!(h.pop(), None);
    }

    #[test]
    fn ties_of_top_visits_exactly_the_values_with_the_top_key() {
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        for round in 0..200u32 {
            let mut h = QuadHeap::new();
            let mut items = Vec::new();
            for v in 0..rng.random_range(1..120u32) {
                // Few distinct keys, zeros (the floor value) included.
                let k = rng.random_range(0..4u64) * (round % 3) as u64;
                items.push((k, v));
            }
            // Heaps built both ways: pushes (sift-ups) and one heapify.
            if round % 2 == 0 {
                for &(k, v) in &items {
                    h.push(k, v);
                }
            } else {
                h.rebuild(items.len(), |i| items[i]);
            }
            for _ in 0..rng.random_range(0..20) {
                h.pop();
            }
            let mut seen = Vec::new();
            h.ties_of_top(|v| seen.push(v));
            seen.sort_unstable();
            let mut all = Vec::new();
            while let Some(kv) = h.pop() {
                all.push(kv);
            }
            let mut expected: Vec<u32> = match all.first() {
                Some(&(top, _)) => all.iter().filter(|kv| kv.0 == top).map(|kv| kv.1).collect(),
                None => Vec::new(),
            };
            expected.sort_unstable();
            assert_eq!(seen, expected, "round {round}");
        }
    }
}
