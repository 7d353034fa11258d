//! The keys a predictive policy knows, in a slab of 32-byte nodes, with the
//! resident ones linked from least to most recent.
//!
//! The list is circular through a sentinel (node 0, no key): its `newer`
//! is the oldest key and its `older` the newest, so linking and unlinking
//! have no end cases, exactly as cheap as [`crate::eviction::Lru`]'s list.
//! Every link stamps the node with a counter, so stamps order the resident
//! keys by recency and a window of the least-recent keys is a stamp
//! threshold. A node that is not resident (a LARU *ghost*) keeps its key,
//! prediction and phase tags until the policy releases it.

use crate::eviction::Key;

/// The sentinel node; as a window edge, "no key".
pub(super) const HEAD: u32 = 0;
/// The stamp of a key that is not resident (above every window edge).
pub(super) const NOT_RESIDENT: u32 = u32::MAX;
/// `older` of a node on the free list (no key).
const FREE: u32 = u32::MAX;

/// A key the policy knows.
#[derive(Debug, Clone, Copy)]
pub(super) struct Node {
    pub key: Key,
    /// Its latest prediction as rank bits (see `window::rank`); kept while
    /// not resident: the cache may predict before it inserts.
    pub rank: u64,
    /// Recency neighbours (resident keys; HEAD at the list's ends).
    pub newer: u32,
    pub older: u32,
    /// Link counter at its last request; NOT_RESIDENT when not resident.
    pub stamp: u32,
    /// Tag of the phase in which the key was last requested (0: none).
    pub seen_phase: u16,
    /// Tag of the phase in which the key was last evicted by prediction
    /// (LCR Alg. 1 line 18; 0: none).
    pub pred_evicted_phase: u16,
}

const _: () = assert!(
    std::mem::size_of::<Node>() == 32,
    "two nodes per cache line"
);

impl Node {
    /// A node of `key` in no list, with no phase tags.
    fn unlinked(key: Key, rank: u64, stamp: u32) -> Self {
        Self {
            key,
            rank,
            newer: HEAD,
            older: HEAD,
            stamp,
            seen_phase: 0,
            pred_evicted_phase: 0,
        }
    }

    pub fn is_resident(&self) -> bool {
        self.stamp != NOT_RESIDENT
    }
}

/// The node slab and the recency list through it.
#[derive(Debug)]
pub(super) struct Recency {
    /// Node 0 is the sentinel. Never shrinks: freed nodes are reused.
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// The next link's stamp; stamps are renumbered when it reaches
    /// `stamp_limit` (u32::MAX; tests lower it to renumber often).
    next_stamp: u32,
    pub(super) stamp_limit: u32,
}

impl Recency {
    /// An empty list with room for `capacity` nodes before it grows.
    pub fn with_capacity(capacity: usize) -> Self {
        let mut nodes = Vec::with_capacity(capacity + 1);
        // The sentinel: stamp 0 is below every window edge but an empty one.
        nodes.push(Node::unlinked(0, 0, 0));
        Self {
            nodes,
            free: Vec::new(),
            next_stamp: 1,
            stamp_limit: NOT_RESIDENT,
        }
    }

    /// Node `i`. The policy takes node numbers only from its index, the
    /// links, the window's heap and its own fields, which all name live
    /// slots (or the sentinel), so the hot paths skip the bounds check.
    #[inline(always)]
    pub fn node(&self, i: u32) -> &Node {
        debug_assert!((i as usize) < self.nodes.len(), "node {i} out of the slab");
        // SAFETY: `i` names a slot of `nodes` (see above), which never shrinks.
        unsafe { self.nodes.get_unchecked(i as usize) }
    }

    #[inline(always)]
    pub fn node_mut(&mut self, i: u32) -> &mut Node {
        debug_assert!((i as usize) < self.nodes.len(), "node {i} out of the slab");
        // SAFETY: as for `node`.
        unsafe { self.nodes.get_unchecked_mut(i as usize) }
    }

    /// The least-recent resident node (HEAD when none is resident).
    #[inline(always)]
    pub fn oldest(&self) -> u32 {
        self.node(HEAD).newer
    }

    /// Nodes in the slab that hold a key (resident or not).
    pub fn known(&self) -> usize {
        self.nodes.len() - 1 - self.free.len()
    }

    /// A node for `key`, not resident, with no prediction and no tags.
    #[inline(always)]
    pub fn alloc(&mut self, key: Key, no_prediction: u64) -> u32 {
        let fresh = Node::unlinked(key, no_prediction, NOT_RESIDENT);
        match self.free.pop() {
            Some(i) => {
                *self.node_mut(i) = fresh;
                i
            }
            None => {
                self.nodes.push(fresh);
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Returns non-resident node `i` to the free list.
    #[inline(always)]
    pub fn release(&mut self, i: u32) {
        let n = self.node_mut(i);
        debug_assert!(!n.is_resident(), "releasing a resident node");
        n.older = FREE;
        self.free.push(i);
    }

    /// Releases every non-resident node and tells `keep` each resident
    /// one (key and number), in one pass over the slab.
    pub fn release_ghosts(&mut self, mut keep: impl FnMut(Key, u32)) {
        for i in 1..self.nodes.len() as u32 {
            let n = self.node(i);
            if n.is_resident() {
                keep(n.key, i);
            } else if n.older != FREE {
                self.release(i);
            }
        }
    }

    /// Whether the stamps must be renumbered before the next link.
    #[inline(always)]
    pub fn stamps_exhausted(&self) -> bool {
        self.next_stamp >= self.stamp_limit
    }

    /// Links node `i` as the most recent with the next stamp (the caller
    /// renumbers first when the stamps are exhausted).
    #[inline(always)]
    pub fn link_newest(&mut self, i: u32) {
        debug_assert!(!self.stamps_exhausted());
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let newest = self.node(HEAD).older;
        let n = self.node_mut(i);
        n.stamp = stamp;
        n.newer = HEAD;
        n.older = newest;
        self.node_mut(newest).newer = i;
        self.node_mut(HEAD).older = i;
    }

    /// Unlinks resident node `i` and returns it as it was (the caller
    /// gives it a new stamp or NOT_RESIDENT).
    #[inline(always)]
    pub fn unlink(&mut self, i: u32) -> Node {
        let n = *self.node(i);
        self.node_mut(n.newer).older = n.older;
        self.node_mut(n.older).newer = n.newer;
        n
    }

    /// Stamps the resident keys 1, 2, … from the least recent (when the
    /// counter would wrap: once per 4 billion links).
    #[cold]
    pub fn restamp(&mut self) {
        let mut stamp = 0;
        let mut i = self.oldest();
        while i != HEAD {
            stamp += 1;
            self.node_mut(i).stamp = stamp;
            i = self.node(i).newer;
        }
        self.next_stamp = stamp + 1;
    }

    /// Clears every phase tag (when the tag counter wraps).
    #[cold]
    pub fn clear_phase_tags(&mut self) {
        for n in &mut self.nodes {
            n.seen_phase = 0;
            n.pred_evicted_phase = 0;
        }
    }

    /// Resident nodes, least recent first.
    pub fn lru_first(&self) -> impl Iterator<Item = u32> + '_ {
        let first = self.oldest();
        std::iter::successors((first != HEAD).then_some(first), |&i| {
            let newer = self.node(i).newer;
            (newer != HEAD).then_some(newer)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys_lru_first(r: &Recency) -> Vec<Key> {
        r.lru_first().map(|i| r.node(i).key).collect()
    }

    #[test]
    fn links_in_recency_order_and_unlinks_from_anywhere() {
        let mut r = Recency::with_capacity(4);
        let nodes: Vec<u32> = (10..15).map(|k| r.alloc(k, 0)).collect();
        for &i in &nodes {
            r.link_newest(i);
        }
        assert_eq!(keys_lru_first(&r), vec![10, 11, 12, 13, 14]);
        // The middle, the oldest and the newest.
        for i in [nodes[2], nodes[0], nodes[4]] {
            r.unlink(i);
            r.node_mut(i).stamp = NOT_RESIDENT;
        }
        assert_eq!(keys_lru_first(&r), vec![11, 13]);
        r.unlink(nodes[1]);
        r.link_newest(nodes[1]);
        assert_eq!(keys_lru_first(&r), vec![13, 11]);
        let stamps: Vec<u32> = r.lru_first().map(|i| r.node(i).stamp).collect();
        assert!(stamps.windows(2).all(|w| w[0] < w[1]), "{stamps:?}");
    }

    #[test]
    fn restamp_keeps_the_order_and_restarts_the_counter() {
        let mut r = Recency::with_capacity(4);
        let nodes: Vec<u32> = (0..4).map(|k| r.alloc(k, 0)).collect();
        for _ in 0..3 {
            for &i in &nodes {
                if r.node(i).is_resident() {
                    r.unlink(i);
                }
                r.link_newest(i);
            }
        }
        r.restamp();
        let stamps: Vec<u32> = r.lru_first().map(|i| r.node(i).stamp).collect();
        assert_eq!(stamps, vec![1, 2, 3, 4]);
        assert_eq!(keys_lru_first(&r), vec![0, 1, 2, 3]);
    }

    #[test]
    fn released_ghosts_are_reused_and_counted() {
        let mut r = Recency::with_capacity(4);
        let a = r.alloc(1, 0);
        let b = r.alloc(2, 0);
        r.link_newest(a);
        assert_eq!(r.known(), 2);
        let mut kept = Vec::new();
        r.release_ghosts(|k, i| kept.push((k, i)));
        assert_eq!(kept, vec![(1, a)], "the resident node is kept");
        assert_eq!(r.known(), 1);
        assert_eq!(r.alloc(3, 0), b, "the freed slot is reused");
        // A released node is not released again.
        r.release_ghosts(|k, i| kept.push((k, i)));
        assert_eq!(kept, vec![(1, a), (1, a)]);
        assert_eq!(r.known(), 1, "3 is released");
    }
}
