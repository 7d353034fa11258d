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
//! The heap (4-ary) deletes lazily: an entry is skipped, or swept out when
//! stale entries outnumber live ones, once its node left the window, was
//! linked again (new stamp) or got a new prediction. Choosing a victim
//! costs O(log l) amortised.

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

/// A heap entry, ordered as one integer: larger prediction first, then the
/// less recent (smaller stamp), then the node (never reached: stamps are
/// unique). One integer comparison keeps the sift short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate(u128);

impl Candidate {
    /// Below every real entry (ranks are never 0): the heap's floor.
    const FLOOR: Self = Self(0);

    /// Node `i` as it stands now.
    #[inline(always)]
    fn of(n: &Node, i: u32) -> Self {
        Self((n.rank as u128) << 64 | ((u32::MAX - n.stamp) as u128) << 32 | i as u128)
    }

    fn node(self) -> u32 {
        self.0 as u32
    }

    fn stamp(self) -> u32 {
        u32::MAX - (self.0 >> 32) as u32
    }

    fn rank(self) -> u64 {
        (self.0 >> 64) as u64
    }

    /// Whether the entry still stands for a window key's current
    /// prediction (in the window, not linked again, same prediction).
    #[inline(always)]
    fn is_current(self, nodes: &Recency, edge_stamp: u32) -> bool {
        let n = nodes.node(self.node());
        // `&`, not `&&`: one branch for the caller instead of three
        // unpredictable ones (sweeps test half-stale heaps).
        (self.stamp() <= edge_stamp) & (n.stamp == self.stamp()) & (n.rank == self.rank())
    }
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
    heap: QuadHeap<Candidate>,
}

impl Window {
    pub fn new() -> Self {
        Self {
            edge: HEAD,
            edge_stamp: 0,
            len: 0,
            heap: QuadHeap::new(Candidate::FLOOR),
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
        self.heap.rebuild((0..l).map(|_| {
            edge = nodes.node(edge).newer;
            Candidate::of(nodes.node(edge), edge)
        }));
        self.edge = edge;
        self.edge_stamp = nodes.node(edge).stamp;
        self.len = l;
    }

    /// Node `i`'s prediction enters the heap (a window key's new one).
    #[inline(always)]
    pub fn push(&mut self, nodes: &Recency, i: u32) {
        let c = Candidate::of(nodes.node(i), i);
        // The last victim usually still sits on top: overwriting it costs
        // one sift-down instead of a pop and a push.
        let edge_stamp = self.edge_stamp;
        if self
            .heap
            .peek()
            .is_some_and(|top| !top.is_current(nodes, edge_stamp))
        {
            self.heap.replace_top(c);
        } else {
            self.heap.push(c);
        }
    }

    /// The key with the largest prediction among the `l` least-recent ones
    /// (ties: the least recent); `l` is at most the resident count. Out
    /// of line: the eviction's other paths then need fewer registers.
    #[inline(never)]
    pub fn best(&mut self, nodes: &Recency, l: usize) -> u32 {
        self.prepare(nodes, l);
        let edge_stamp = self.edge_stamp;
        while let Some(&top) = self.heap.peek() {
            if top.is_current(nodes, edge_stamp) {
                return top.node();
            }
            self.heap.pop();
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
            self.heap.retain(|c| c.is_current(nodes, edge_stamp));
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
        assert!(
            rank(f64::MIN) > Candidate::FLOOR.rank(),
            "the floor is below every rank"
        );
    }
}
