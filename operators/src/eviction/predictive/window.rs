//! The candidate window of LCR Alg. 1 line 14: the l least-recent resident
//! keys, and a max-heap of their predictions.
//!
//! The window is the recency list's oldest segment up to an *edge* node; a
//! key is inside when its stamp is at most the edge's, so nothing is
//! written to a key when the window moves past it. Keys enter one at a
//! time at the edge (an eviction took one out) or all at once: a halved λ
//! or a new phase rebuilds the window from the oldest key, one walk and
//! one heapify, which leaves no stale entries behind.
//!
//! The heap (4-ary) orders node numbers by one `u64` each, the prediction's
//! rank: a sift compares single words, and four children's keys fill half
//! a cache line. Equal predictions tie in the heap; they sit together at
//! the top when they matter, where the victim choice breaks the tie by
//! recency, so the victims are exactly Alg. 1's with LRU order among equal
//! predictions. The heap deletes lazily: an entry is skipped, or swept out
//! when stale entries outnumber live ones, once its node left the window
//! or got another prediction. Choosing a victim costs O(log l) amortised.

use super::recency::{HEAD, Node, Recency};
use crate::eviction::quad_heap::QuadHeap;

/// Stale heap entries tolerated beyond twice the live ones before a sweep.
/// A sweep costs a few instructions per entry; a stale entry that surfaces
/// costs a whole sift, so sweep early.
const HEAP_SLACK: usize = 8;

/// A prediction as an integer of the same order, computed once when it
/// arrives so that heap entries and staleness checks compare integers.
/// "Cannot say" (NaN, -inf) ranks with +inf, highest; -0.0 equals 0.0.
#[inline(always)]
pub(super) const fn rank(pred: f64) -> u64 {
    let pred = if pred.is_nan() || pred == f64::NEG_INFINITY {
        f64::INFINITY
    } else {
        pred + 0.0
    };
    let bits = pred.to_bits();
    // Negative floats order by their flipped bits, positive ones above them.
    let flip = ((bits as i64) >> 63) as u64 | 1 << 63;
    bits ^ flip
}

/// The rank of a key without a prediction: it goes first.
pub(super) const NO_PREDICTION: u64 = rank(f64::INFINITY);

/// Heap keys of keys without a prediction start here, above every rank.
const UNPREDICTED: u64 = NO_PREDICTION + 1;

/// A window key's heap key as it stands now: its rank, so the largest
/// prediction comes out first; for a key without a prediction, a key above
/// every rank that is larger the older the key is (they go first, least
/// recent first). Keys with an equal rank tie in the heap; [`Window::best`]
/// breaks the tie by recency.
#[inline(always)]
fn heap_key(n: &Node) -> u64 {
    let unpredicted = UNPREDICTED + (u32::MAX - n.stamp) as u64;
    if n.rank == NO_PREDICTION {
        unpredicted
    } else {
        n.rank
    }
}

/// Whether heap entry (`key`, node `i`) stands for a window key's current
/// state: in the window (so resident) with the same heap key, i.e. the
/// same prediction (and, without one, the same stamp). An entry left from
/// before the key was linked again is current only when nothing it is
/// ordered by changed, and then it is a harmless duplicate.
#[inline(always)]
fn is_current(key: u64, i: u32, nodes: &Recency, edge_stamp: u32) -> bool {
    let n = nodes.node(i);
    // `&`, not `&&`: one branch for the caller instead of two
    // unpredictable ones (sweeps test half-stale heaps).
    (n.stamp <= edge_stamp) & (heap_key(n) == key)
}

/// The window and its heap.
#[derive(Debug)]
pub(super) struct Window {
    /// The newest node in the window (HEAD: the window is empty).
    edge: u32,
    /// Resident keys with a stamp up to this are in the window. It may
    /// exceed the edge's own stamp after the edge left (no resident key has
    /// a stamp in between), and is 0 for an empty window.
    edge_stamp: u32,
    len: usize,
    /// Window nodes by heap key (lazily deleted: see `is_current`).
    heap: QuadHeap<u32>,
}

impl Window {
    pub fn new() -> Self {
        Self {
            edge: HEAD,
            edge_stamp: 0,
            len: 0,
            heap: QuadHeap::new(),
        }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether a resident key with this stamp is in the window.
    #[inline(always)]
    pub fn contains(&self, stamp: u32) -> bool {
        stamp <= self.edge_stamp
    }

    /// Node `i`, which was `n`, left the recency list.
    #[inline(always)]
    pub fn on_unlink(&mut self, i: u32, n: &Node) {
        // Branch-free: whether a hit lands in the window is data.
        self.len -= self.contains(n.stamp) as usize;
        if self.edge == i {
            self.edge = n.older;
        }
    }

    /// No key is in the window and the heap is empty (λ collapsed to
    /// l = 1, where the victim is simply the least-recent key).
    #[inline(always)]
    pub fn clear(&mut self) {
        // Mostly already so: λ stays small for many evictions in a row.
        if self.edge != HEAD || self.heap.len() != 0 {
            self.edge = HEAD;
            self.edge_stamp = 0;
            self.len = 0;
            self.heap.clear();
        }
    }

    /// The window becomes the `l` least-recent keys and the heap exactly
    /// their predictions: one walk from the oldest key and one heapify.
    pub fn rebuild(&mut self, nodes: &Recency, l: usize) {
        let mut edge = HEAD;
        self.heap.rebuild(l, |_| {
            edge = nodes.node(edge).newer;
            (heap_key(nodes.node(edge)), edge)
        });
        self.edge = edge;
        self.edge_stamp = nodes.node(edge).stamp;
        self.len = l;
    }

    /// Node `i`'s prediction enters the heap (a window key's new one).
    #[inline(always)]
    pub fn push(&mut self, nodes: &Recency, i: u32) {
        let key = heap_key(nodes.node(i));
        // The last victim usually still sits on top: overwriting it costs
        // one sift-down instead of a pop and a push.
        let edge_stamp = self.edge_stamp;
        if (self.heap.peek()).is_some_and(|(k, j)| !is_current(k, j, nodes, edge_stamp)) {
            self.heap.replace_top(key, i);
        } else {
            self.heap.push(key, i);
        }
    }

    /// The key with the largest prediction among the `l` least-recent ones
    /// (ties: the least recent); `l` is at most the resident count. Out
    /// of line: the eviction's other paths then need fewer registers.
    #[inline(never)]
    pub fn best(&mut self, nodes: &Recency, l: usize) -> u32 {
        self.prepare(nodes, l);
        let edge_stamp = self.edge_stamp;
        while let Some((key, i)) = self.heap.peek() {
            if !is_current(key, i, nodes, edge_stamp) {
                self.heap.pop();
                continue;
            }
            if key >= UNPREDICTED {
                // Its stamp is in the key: no other current entry ties.
                return i;
            }
            // Equal predictions: the least recent goes (Alg. 1 names no
            // order; this is LRU's, and makes the victim unique).
            let mut best = (nodes.node(i).stamp, i);
            self.heap.ties_of_top(|j| {
                if is_current(key, j, nodes, edge_stamp) {
                    best = best.min((nodes.node(j).stamp, j));
                }
            });
            return best.1;
        }
        unreachable!("a non-empty window has a current entry")
    }

    /// Makes the window the `l` least-recent keys with every prediction in
    /// the heap, and sweeps the heap when mostly stale.
    fn prepare(&mut self, nodes: &Recency, l: usize) {
        if self.len > l || l - self.len > self.heap.len() / 2 + HEAP_SLACK {
            // λ halved, or a new phase reset it: rebuilding costs what
            // moving the edge would, leaves no stale entries to sweep, and
            // one heapify beats a push per key.
            self.rebuild(nodes, l);
            return;
        }
        while self.len < l {
            // The window is within the cache, so a newer key exists.
            let next = nodes.node(self.edge).newer;
            debug_assert_ne!(next, HEAD, "the window outgrew the cache");
            self.edge = next;
            self.edge_stamp = nodes.node(next).stamp;
            self.len += 1;
            self.push(nodes, next);
        }
        if self.heap.len() > 2 * self.len + HEAP_SLACK {
            let edge_stamp = self.edge_stamp;
            self.heap.retain(|k, i| is_current(k, i, nodes, edge_stamp));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_orders_like_the_predictions_and_unknowns_go_first() {
        let preds = [f64::MIN, -1e9, -2.5, -0.0, 0.0, 1e-300, 3.0, 1e9, f64::MAX];
        for w in preds.windows(2) {
            assert!(rank(w[0]) <= rank(w[1]), "{} vs {}", w[0], w[1]);
        }
        assert_eq!(rank(-0.0), rank(0.0));
        for unknown in [f64::NAN, f64::NEG_INFINITY, f64::INFINITY] {
            assert_eq!(rank(unknown), NO_PREDICTION);
            assert!(rank(f64::MAX) < NO_PREDICTION);
        }
        assert!(rank(f64::MIN) > 0, "the heap's floor is below every rank");
    }
}
