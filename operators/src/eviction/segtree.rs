//! Resident keys in recency order with their predicted next-access times:
//! a tree over recency slots that finds the l-th least-recent key
//! and the largest prediction among the l least-recent keys, each in
//! O(log n) (LCR Alg. 1 line 17 in O(log k)).
//!
//! Slots are handed out in increasing order (a key re-requested moves to a
//! new, later slot); when slots run out the live ones are renumbered in
//! order, which costs O(n) once per n/2 requests.

use super::Key;

const EMPTY: u32 = u32::MAX;

/// Recency slots → (key, prediction), with order statistics (a Fenwick tree
/// of occupied slots) and prefix max (a max segment tree whose updates stop
/// as soon as an ancestor's winner is unchanged).
#[derive(Debug)]
pub struct RecencyTree {
    size: usize,
    /// Max tree, 1-based heap layout; leaves at `size..2 * size`. An empty
    /// leaf holds (NEG_INFINITY, EMPTY); ties go to the smaller slot.
    best: Vec<f64>,
    at: Vec<u32>,
    /// Fenwick tree of occupancy, 1-based.
    fenwick: Vec<u32>,
    occupied: Vec<bool>,
    keys: Vec<Key>,
    len: usize,
    /// Next slot to hand out.
    next: usize,
}

#[inline]
fn wins(b: f64, bat: u32, a: f64, aat: u32) -> bool {
    b > a || (b == a && bat < aat)
}

impl RecencyTree {
    pub fn new(min_slots: usize) -> Self {
        let size = min_slots.max(64).next_power_of_two();
        Self {
            size,
            best: vec![f64::NEG_INFINITY; 2 * size],
            at: vec![EMPTY; 2 * size],
            fenwick: vec![0; size + 1],
            occupied: vec![false; size],
            keys: vec![0; size],
            len: 0,
            next: 0,
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the next `push` needs a `compact` first.
    pub fn full(&self) -> bool {
        self.next == self.size
    }

    fn count_add(&mut self, slot: usize, up: bool) {
        let mut i = slot + 1;
        while i <= self.size {
            if up {
                self.fenwick[i] += 1;
            } else {
                self.fenwick[i] -= 1;
            }
            i += i & i.wrapping_neg();
        }
    }

    fn write(&mut self, slot: usize, value: f64, at: u32) {
        let mut i = slot + self.size;
        self.best[i] = value;
        self.at[i] = at;
        while i > 1 {
            i /= 2;
            let (l, r) = (2 * i, 2 * i + 1);
            let (b, a) = if wins(self.best[r], self.at[r], self.best[l], self.at[l]) {
                (self.best[r], self.at[r])
            } else {
                (self.best[l], self.at[l])
            };
            if self.best[i] == b && self.at[i] == a {
                break; // ancestors above are unchanged too
            }
            self.best[i] = b;
            self.at[i] = a;
        }
    }

    fn sanitize(pred: f64) -> f64 {
        if pred.is_nan() {
            f64::NEG_INFINITY
        } else {
            pred
        }
    }

    /// Appends `key` as the most recent; the caller checked `!full()`.
    pub fn push(&mut self, key: Key, pred: f64) -> u32 {
        let slot = self.next;
        self.next += 1;
        self.keys[slot] = key;
        self.occupied[slot] = true;
        self.len += 1;
        self.count_add(slot, true);
        self.write(slot, Self::sanitize(pred), slot as u32);
        slot as u32
    }

    pub fn clear(&mut self, slot: u32) {
        let s = slot as usize;
        debug_assert!(self.occupied[s]);
        self.occupied[s] = false;
        self.len -= 1;
        self.count_add(s, false);
        self.write(s, f64::NEG_INFINITY, EMPTY);
    }

    pub fn set_prediction(&mut self, slot: u32, pred: f64) {
        self.write(slot as usize, Self::sanitize(pred), slot);
    }

    pub fn key(&self, slot: u32) -> Key {
        self.keys[slot as usize]
    }

    /// Slot of the `l`-th least-recent key (1-based, `1 <= l <= len`).
    pub fn kth(&self, l: usize) -> u32 {
        debug_assert!(l >= 1 && l <= self.len);
        let mut rem = l as u32;
        let mut pos = 0;
        let mut step = self.size;
        while step > 0 {
            let next = pos + step;
            if next <= self.size && self.fenwick[next] < rem {
                pos = next;
                rem -= self.fenwick[next];
            }
            step /= 2;
        }
        pos as u32 // 1-based position pos + 1 is slot pos
    }

    /// (largest prediction, its slot) over slots `0..=last`.
    pub fn max_upto(&self, last: u32) -> (f64, u32) {
        let (mut lo, mut hi) = (self.size, last as usize + self.size + 1);
        let (mut bb, mut ba) = (f64::NEG_INFINITY, EMPTY);
        while lo < hi {
            if lo & 1 == 1 {
                if wins(self.best[lo], self.at[lo], bb, ba) {
                    (bb, ba) = (self.best[lo], self.at[lo]);
                }
                lo += 1;
            }
            if hi & 1 == 1 {
                hi -= 1;
                if wins(self.best[hi], self.at[hi], bb, ba) {
                    (bb, ba) = (self.best[hi], self.at[hi]);
                }
            }
            lo /= 2;
            hi /= 2;
        }
        (bb, ba)
    }

    /// Every occupied slot, least recent first.
    pub fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.next)
            .filter(|&s| self.occupied[s])
            .map(|s| s as u32)
    }

    /// Renumbers live slots 0.. in order (growing when more than half are
    /// live); `moved(key, new_slot)` is told every key's new slot.
    pub fn compact(&mut self, mut moved: impl FnMut(Key, u32)) {
        let live: Vec<(Key, f64)> = (0..self.next)
            .filter(|&s| self.occupied[s])
            .map(|s| (self.keys[s], self.best[s + self.size]))
            .collect();
        let size = (live.len() * 2).max(64).next_power_of_two().max(self.size);
        *self = Self::new(size);
        for (key, pred) in live {
            let slot = self.push(key, pred);
            moved(key, slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kth_and_prefix_max_follow_recency() {
        let mut t = RecencyTree::new(8);
        let s: Vec<u32> = [5.0, 9.0, 1.0, 9.0, 2.0]
            .iter()
            .enumerate()
            .map(|(k, &p)| t.push(k as Key, p))
            .collect();
        t.clear(s[0]);
        assert_eq!(t.len(), 4);
        assert_eq!(t.kth(1), s[1]);
        assert_eq!(t.kth(3), s[3]);
        // Tie between keys 1 and 3 goes to the less recent one.
        assert_eq!(t.max_upto(t.kth(4)), (9.0, s[1]));
        assert_eq!(t.max_upto(t.kth(2)).1, s[1]);
        t.set_prediction(s[1], 0.0);
        assert_eq!(t.max_upto(t.kth(2)), (1.0, s[2]));
    }

    #[test]
    fn compaction_keeps_order_and_predictions() {
        let mut t = RecencyTree::new(64);
        let mut slots = std::collections::HashMap::new();
        for k in 0..64u64 {
            slots.insert(k, t.push(k, k as f64));
        }
        for k in 0..60u64 {
            t.clear(slots[&k]);
        }
        assert!(t.full());
        t.compact(|k, s| {
            slots.insert(k, s);
        });
        assert_eq!(t.len(), 4);
        assert_eq!(t.key(t.kth(1)), 60);
        assert_eq!(t.max_upto(t.kth(4)), (63.0, slots[&63]));
        assert!(!t.full());
    }
}
