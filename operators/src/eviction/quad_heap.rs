//! A max-heap with four children per node.
//!
//! LARU pops a victim at every eviction from a heap as large as the cache.
//! Halving the depth of std's binary heap halves the dependent loads of a
//! pop, and a node's four children sit next to each other in memory, so
//! choosing among them costs one or two cache lines instead of one per level.
//!
//! The storage past the last item always holds at least four copies of a
//! *floor* value that no item is below, so every node that has a child has
//! four readable children: choosing the largest is one fixed-size
//! tournament with no case for a short last family.

/// Children per node.
const ARITY: usize = 4;

/// Max-heap of `T` by its `Ord`; every item must be at least `floor`.
#[derive(Debug, Clone)]
pub struct QuadHeap<T> {
    /// `len` items in heap order, then at least ARITY copies of `floor`.
    items: Vec<T>,
    len: usize,
    floor: T,
}

impl<T: Ord + Copy> QuadHeap<T> {
    /// An empty heap for items no smaller than `floor`.
    pub fn new(floor: T) -> Self {
        Self {
            items: vec![floor; ARITY],
            len: 0,
            floor,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn clear(&mut self) {
        self.truncate(0);
    }

    /// The largest item.
    pub fn peek(&self) -> Option<&T> {
        (self.len > 0).then(|| &self.items[0])
    }

    pub fn push(&mut self, item: T) {
        debug_assert!(item >= self.floor, "an item below the floor");
        self.items.push(self.floor);
        self.items[self.len] = item;
        self.len += 1;
        self.sift_up(self.len - 1);
    }

    /// Removes and returns the largest item.
    pub fn pop(&mut self) -> Option<T> {
        if self.len == 0 {
            return None;
        }
        self.len -= 1;
        let last = std::mem::replace(&mut self.items[self.len], self.floor);
        self.items.pop();
        if self.len == 0 {
            return Some(last);
        }
        let top = std::mem::replace(&mut self.items[0], last);
        self.sift_down_to_bottom();
        Some(top)
    }

    /// Replaces the largest item by `item` (one sift instead of a pop and a
    /// push); pushes when empty. The sift stops as soon as `item` is in
    /// place: LARU's replacement is a fresh prediction, usually among the
    /// largest, so going to the bottom and back (as `pop` does) would waste
    /// both trips.
    pub fn replace_top(&mut self, item: T) {
        if self.len == 0 {
            self.push(item);
        } else {
            debug_assert!(item >= self.floor, "an item below the floor");
            self.items[0] = item;
            self.sift_down(0);
        }
    }

    /// Keeps the items for which `keep` holds and restores the heap order.
    pub fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.compact(keep);
        self.heapify();
    }

    /// Replaces the contents by `items`, in O(n).
    pub fn rebuild(&mut self, items: impl IntoIterator<Item = T>) {
        self.items.clear();
        self.items.extend(items);
        // Counts the items and puts the floor after them.
        self.truncate(self.items.len());
        debug_assert!(self.items[..self.len].iter().all(|&x| x >= self.floor));
        self.heapify();
    }

    /// Drops the items for which `keep` fails, without a branch on it: a
    /// sweep keeps about half, in no pattern a predictor could learn.
    fn compact(&mut self, mut keep: impl FnMut(&T) -> bool) {
        let mut kept = 0;
        for i in 0..self.len {
            let item = self.items[i];
            self.items[kept] = item;
            kept += keep(&item) as usize;
        }
        self.truncate(kept);
    }

    /// Keeps the first `len` items; the floor follows them.
    fn truncate(&mut self, len: usize) {
        self.items.truncate(len);
        self.items.extend([self.floor; ARITY]);
        self.len = len;
    }

    fn heapify(&mut self) {
        if self.len > 1 {
            for i in (0..=(self.len - 2) / ARITY).rev() {
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

    /// The largest child of `i` and its value, if `i` has children.
    #[inline(always)]
    fn largest_child(&self, i: usize) -> Option<(usize, T)> {
        let first = ARITY * i + 1;
        if first >= self.len {
            return None;
        }
        // In bounds: the floor pads the storage past the last item. The
        // tournament runs on the values, so no load waits on a comparison.
        let k: &[T; ARITY] = self.items[first..first + ARITY]
            .try_into()
            .expect("four children");
        let (a, ia) = if k[1] > k[0] { (k[1], 1) } else { (k[0], 0) };
        let (b, ib) = if k[3] > k[2] { (k[3], 3) } else { (k[2], 2) };
        let (c, ic) = if b > a { (b, ib) } else { (a, ia) };
        Some((first + ic, c))
    }

    #[inline(always)]
    fn sift_down(&mut self, mut hole: usize) {
        let item = self.items[hole];
        while let Some((c, kid)) = self.largest_child(hole) {
            if kid <= item {
                break;
            }
            self.items[hole] = kid;
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
        while let Some((c, kid)) = self.largest_child(hole) {
            self.items[hole] = kid;
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
        let mut ours = QuadHeap::new(0);
        let mut reference = BinaryHeap::new();
        for step in 0..20_000 {
            match rng.random_range(0..11) {
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
                9 if step % 2 == 0 => {
                    let m = rng.random_range(2..5);
                    ours.retain(|v| v % m != 0);
                    reference.retain(|v| v % m != 0);
                }
                9 => {
                    let items: Vec<u32> = (0..rng.random_range(0..40))
                        .map(|_| rng.random_range(0..500))
                        .collect();
                    ours.rebuild(items.iter().copied());
                    reference = items.into_iter().collect();
                }
                _ if step % 97 == 0 => {
                    ours.clear();
                    reference.clear();
                }
                _ => {}
            }
            assert_eq!(ours.peek(), reference.peek(), "peek at step {step}");
            assert_eq!(ours.len(), reference.len());
            assert!(
                ours.items[ours.len..].len() >= ARITY
                    && ours.items[ours.len..].iter().all(|&x| x == 0),
                "the floor pads the storage at step {step}"
            );
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
        let mut h = QuadHeap::new(0);
        for v in [5, 1, 9, 3, 7, 2, 8, 6, 4, 0, 11, 10] {
            h.push(v);
        }
        let popped: Vec<_> = std::iter::from_fn(|| h.pop()).collect();
        assert_eq!(popped, vec![11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0]);
        assert_eq!(h.len(), 0);
        assert_eq!(h.pop(), None);
    }
}
