//! A max-heap with four children per node.
//!
//! LARU pops a victim at every eviction from a heap as large as the cache.
//! Halving the depth of std's binary heap halves the dependent loads of a
//! pop, and a node's four children sit next to each other in memory, so
//! choosing among them costs one or two cache lines instead of one per level.

/// Children per node.
const ARITY: usize = 4;

/// Max-heap of `T` by its `Ord`.
#[derive(Debug, Clone)]
pub struct QuadHeap<T> {
    items: Vec<T>,
}

impl<T> Default for QuadHeap<T> {
    fn default() -> Self {
        Self { items: Vec::new() }
    }
}

impl<T: Ord + Copy> QuadHeap<T> {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The largest item.
    pub fn peek(&self) -> Option<&T> {
        self.items.first()
    }

    pub fn push(&mut self, item: T) {
        self.items.push(item);
        self.sift_up(self.items.len() - 1);
    }

    /// Removes and returns the largest item.
    pub fn pop(&mut self) -> Option<T> {
        let last = self.items.pop()?;
        let Some(top) = self.items.first_mut() else {
            return Some(last);
        };
        let top = std::mem::replace(top, last);
        self.sift_down_to_bottom();
        Some(top)
    }

    /// Replaces the largest item by `item` (one sift instead of a pop and a
    /// push); pushes when empty. The sift stops as soon as `item` is in
    /// place: LARU's replacement is a fresh prediction, usually among the
    /// largest, so going to the bottom and back (as `pop` does) would waste
    /// both trips.
    pub fn replace_top(&mut self, item: T) {
        match self.items.first_mut() {
            Some(top) => {
                *top = item;
                self.sift_down(0);
            }
            None => self.items.push(item),
        }
    }

    /// Keeps the items for which `keep` holds and restores the heap order.
    pub fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.compact(keep);
        self.heapify();
    }

    /// Replaces the contents by those of `items` for which `keep` holds,
    /// in O(n).
    pub fn rebuild_retaining(
        &mut self,
        items: impl IntoIterator<Item = T>,
        keep: impl FnMut(&T) -> bool,
    ) {
        self.items.clear();
        self.items.extend(items);
        self.retain(keep);
    }

    /// Drops the items for which `keep` fails, without a branch on it: a
    /// sweep keeps about half, in no pattern a predictor could learn.
    fn compact(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let mut kept = 0;
        for i in 0..self.items.len() {
            let item = self.items[i];
            self.items[kept] = item;
            kept += keep(&item) as usize;
        }
        self.items.truncate(kept);
    }

    fn heapify(&mut self) {
        let n = self.items.len();
        if n > 1 {
            for i in (0..=(n - 2) / ARITY).rev() {
                self.sift_down(i);
            }
        }
    }

    fn sift_up(&mut self, mut hole: usize) {
        let item = self.items[hole];
        while hole > 0 {
            let parent = (hole - 1) / ARITY;
            if self.items[parent] >= item {
                break;
            }
            self.items[hole] = self.items[parent];
            hole = parent;
        }
        self.items[hole] = item;
    }

    /// The largest child of `i`, if it has any.
    #[inline]
    fn largest_child(&self, i: usize) -> Option<usize> {
        let first = ARITY * i + 1;
        if let Some(kids) = self.items.get(first..first + ARITY) {
            // The common case, all four present: a fixed-size tournament
            // the compiler can keep branch-light.
            let a = if kids[1] > kids[0] { 1 } else { 0 };
            let b = if kids[3] > kids[2] { 3 } else { 2 };
            return Some(first + if kids[b] > kids[a] { b } else { a });
        }
        let kids = self.items.get(first..)?;
        let mut best = 0;
        for c in 1..kids.len() {
            if kids[c] > kids[best] {
                best = c;
            }
        }
        (!kids.is_empty()).then_some(first + best)
    }

    fn sift_down(&mut self, mut hole: usize) {
        let item = self.items[hole];
        while let Some(c) = self.largest_child(hole) {
            if self.items[c] <= item {
                break;
            }
            self.items[hole] = self.items[c];
            hole = c;
        }
        self.items[hole] = item;
    }

    /// Sifts the root down to a leaf along the largest children, then up:
    /// the root came from the bottom, so it usually belongs near there and
    /// this saves comparing it at every level on the way down.
    fn sift_down_to_bottom(&mut self) {
        let item = self.items[0];
        let mut hole = 0;
        while let Some(c) = self.largest_child(hole) {
            self.items[hole] = self.items[c];
            hole = c;
        }
        self.items[hole] = item;
        self.sift_up(hole);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use std::collections::BinaryHeap;

    #[test]
    fn matches_std_binary_heap_under_random_operations() {
        let mut rng = ChaCha8Rng::seed_from_u64(7);
        let mut ours = QuadHeap::new();
        let mut reference = BinaryHeap::new();
        for step in 0..20_000 {
            match rng.random_range(0..10) {
                0..=4 => {
                    let v: u32 = rng.random_range(0..500);
                    ours.push(v);
                    reference.push(v);
                }
                5..=7 => assert_eq!(ours.pop(), reference.pop(), "pop at step {step}"),
                8 => {
                    let v: u32 = rng.random_range(0..500);
                    ours.replace_top(v);
                    if let Some(mut top) = reference.peek_mut() {
                        *top = v;
                    } else {
                        reference.push(v);
                    }
                }
                _ if step % 2 == 0 => {
                    let m = rng.random_range(2..5);
                    ours.retain(|v| v % m != 0);
                    reference.retain(|v| v % m != 0);
                }
                _ => {
                    let items: Vec<u32> = (0..rng.random_range(0..40))
                        .map(|_| rng.random_range(0..500))
                        .collect();
                    ours.rebuild_retaining(items.iter().copied(), |v| v % 7 != 0);
                    reference = items.into_iter().filter(|v| v % 7 != 0).collect();
                }
            }
            assert_eq!(ours.peek(), reference.peek(), "peek at step {step}");
            assert_eq!(ours.len(), reference.len());
        }
        let mut rest = Vec::new();
        while let Some(v) = ours.pop() {
            rest.push(v);
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
    fn pops_in_descending_order() {
        let mut h = QuadHeap::new();
        for v in [5, 1, 9, 3, 7, 2, 8, 6, 4, 0, 11, 10] {
            h.push(v);
        }
        let popped: Vec<_> = std::iter::from_fn(|| h.pop()).collect();
        assert_eq!(popped, vec![11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(h.len(), 0);
        assert_eq!(h.pop(), None);
    }
}
