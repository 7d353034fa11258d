//! LRU guided by predicted next-access times: LARU (LCR Alg. 1, Sync and
//! Async), FPB (evict the largest prediction among all resident keys) and HF
//! (LRU pre-filters the 4 least-recent keys, the prediction picks).
//!
//! A key without a prediction (none yet, NaN or -inf: "cannot say") ranks
//! highest: it goes first, least recent first, so keys learned before the
//! first model cannot sit in the cache forever, and with no predictions at
//! all every mode is LRU.
//!
//! Recency is a doubly linked list over a slab of nodes, exactly as in
//! [`super::Lru`], so a hit costs what an LRU hit costs plus a few writes
//! to the key's own node. Every link stamps the node with a counter, so
//! stamps order the resident keys from least to most recent.
//!
//! The l least-recent keys (the *window*, Alg. 1 line 17's candidate set)
//! are the list's oldest segment, up to an edge node: a key is inside when
//! its stamp is at most the edge's, so nothing is written to a key when the
//! window moves past it. The window changes only at its edge: a new
//! eviction extends it towards newer keys, a halved λ pulls the edge back,
//! and a new phase (λ = 1) makes it the whole list at once.
//! A max-heap (4-ary) holds the window's predictions with lazy deletion: an
//! entry is skipped, or swept out when stale entries outnumber live ones,
//! once its node left the window, was linked again (new stamp) or got a new
//! prediction. Choosing a victim costs O(log k) amortised. When a new phase
//! resets λ and the window regrows by more than half the heap, one heapify
//! over a sequential scan of the nodes replaces the pushes.

use super::quad_heap::QuadHeap;
use super::{EvictCtx, EvictionPolicy, Key, KeyMap, PredictOracle, key_map};

/// Which prediction-guided policy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// LARU; predictions arrive through `set_prediction` after each request.
    LaruAsync,
    /// LARU; candidates are predicted at eviction time by the ctx's oracle.
    LaruSync,
    /// Follow the prediction blindly over the whole cache.
    Fpb,
    /// Heuristic-filtered: the 4 LRU candidates, prediction picks.
    Hf,
}

/// HF's LRU pre-filter size (HALP's 4 candidates, LCR §3).
pub const HF_CANDIDATES: usize = 4;
/// Rank of a key without a prediction.
const UNKNOWN: f64 = f64::INFINITY;
/// Stale heap entries tolerated beyond twice the live ones before a sweep.
/// A sweep costs a few instructions per entry; a stale entry that surfaces
/// costs a whole sift, so sweep early (small caches halve λ often).
const HEAP_SLACK: usize = 8;
/// No node (list ends, empty window).
const NIL: u32 = u32::MAX;
/// The stamp of a key that is not resident (above every window edge).
const NOT_RESIDENT: u32 = u32::MAX;

/// A key the policy knows: resident, or kept for the current phase's
/// bookkeeping (requested or prediction-evicted in it).
#[derive(Debug, Clone, Copy)]
struct Node {
    key: Key,
    /// Its latest prediction as `rank` bits (kept while not resident: the
    /// cache may predict before it inserts).
    rank: u64,
    /// Recency neighbours (resident keys only; NIL at the list's ends).
    newer: u32,
    older: u32,
    /// Link counter at its last request: orders resident keys by recency;
    /// NOT_RESIDENT when not resident.
    stamp: u32,
    /// Tag of the phase in which the key was last requested (0: none).
    seen_phase: u16,
    /// Tag of the phase in which the key was last evicted by prediction
    /// (Alg. 1 line 18; 0: none).
    pred_evicted_phase: u16,
}

impl Node {
    fn is_resident(&self) -> bool {
        self.stamp != NOT_RESIDENT
    }

    /// The heap entry of this node (number `i`) as it stands now.
    fn candidate(&self, i: u32) -> Candidate {
        Candidate::new(self.rank, self.stamp, i)
    }
}

/// A heap entry, ordered as one integer: larger prediction first, then the
/// less recent (smaller stamp), then the node (never reached: stamps are
/// unique). One integer comparison keeps the sift short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate(u128);

impl Candidate {
    fn new(rank: u64, stamp: u32, node: u32) -> Self {
        Self((rank as u128) << 64 | ((u32::MAX - stamp) as u128) << 32 | node as u128)
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
}

/// A prediction as an integer of the same order, computed once when it
/// arrives so that heap entries and staleness checks compare integers.
/// "Cannot say" (NaN, -inf) ranks highest; -0.0 equals 0.0.
fn rank(pred: f64) -> u64 {
    let pred = if pred.is_nan() || pred == f64::NEG_INFINITY {
        UNKNOWN
    } else {
        pred + 0.0
    };
    let bits = pred.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

/// LARU / FPB / HF over one cache.
#[derive(Debug)]
pub struct PredictiveLru {
    mode: Mode,
    /// k: the cache's capacity in keys.
    capacity: usize,
    index: KeyMap<Key, u32>,
    /// The last key looked up and its node: a request's `access`, `evict`,
    /// `insert` and `set_prediction` all name the same key, so one hash
    /// lookup serves all four.
    recent: Option<(Key, u32)>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// Ends of the recency list.
    newest: u32,
    oldest: u32,
    resident: usize,
    /// The next link's stamp; stamps are renumbered on reaching the limit
    /// (u32::MAX; tests lower it to renumber often).
    next_stamp: u32,
    stamp_limit: u32,
    /// The newest node in the window (NIL: the window is empty); the window
    /// runs from `oldest` up to it.
    window_edge: u32,
    /// Resident keys with a stamp up to this are in the window. It may
    /// exceed the edge's own stamp after the edge left (no resident key has
    /// a stamp in between), and is 0 for an empty window.
    edge_stamp: u32,
    window_len: usize,
    heap: QuadHeap<Candidate>,
    /// Current phase (LARU), from 1.
    phase: u64,
    /// The current phase's tag in nodes: 16 bits keep nodes at 32 bytes;
    /// every tag is cleared when it would wrap (after 65,535 phases of at
    /// least k requests each).
    tag: u16,
    /// Sync: each node's last request time (the predictor's query).
    last_access: Vec<u64>,
    distinct_in_phase: usize,
    /// Confidence λ = 2^-halvings (it only ever halves and resets to 1).
    halvings: u32,
    /// Nodes the current phase needs (created, requested or
    /// prediction-evicted in it); those not resident when it ends are
    /// released. Never released before, so the indices stay valid.
    phase_nodes: Vec<u32>,
    /// The request being served when it missed (Alg. 1 line 10).
    missing: Option<Key>,
    /// Sync: model version the stored predictions were made with, and keys
    /// requested since (their history changed).
    synced_version: Option<u64>,
    stale: Vec<Key>,
    prediction_evictions: u64,
    lru_fallbacks: u64,
}

impl PredictiveLru {
    pub fn new(mode: Mode, capacity: usize) -> Self {
        Self {
            mode,
            capacity: capacity.max(1),
            index: key_map(),
            recent: None,
            nodes: Vec::new(),
            free: Vec::new(),
            newest: NIL,
            oldest: NIL,
            resident: 0,
            next_stamp: 1,
            stamp_limit: u32::MAX,
            window_edge: NIL,
            edge_stamp: 0,
            window_len: 0,
            heap: QuadHeap::new(),
            phase: 1,
            tag: 1,
            last_access: Vec::new(),
            distinct_in_phase: 0,
            halvings: 0,
            phase_nodes: Vec::new(),
            missing: None,
            synced_version: None,
            stale: Vec::new(),
            prediction_evictions: 0,
            lru_fallbacks: 0,
        }
    }

    pub fn mode(&self) -> Mode {
        self.mode
    }

    /// Confidence λ of the current phase.
    pub fn lambda(&self) -> f64 {
        0.5f64.powi(self.halvings as i32)
    }

    /// Current phase number (from 1).
    pub fn phase(&self) -> u64 {
        self.phase
    }

    /// Evictions chosen by prediction (line 18) and by the LRU fallback (line 11).
    pub fn eviction_counts(&self) -> (u64, u64) {
        (self.prediction_evictions, self.lru_fallbacks)
    }

    fn is_laru(&self) -> bool {
        matches!(self.mode, Mode::LaruAsync | Mode::LaruSync)
    }

    /// l = max(⌊λk⌋, 1) for LARU; every key for FPB; 4 for HF.
    fn candidates(&self) -> usize {
        match self.mode {
            Mode::LaruAsync | Mode::LaruSync => {
                // ⌊λk⌋ with λ a power of two, without a float floor per eviction.
                self.capacity.checked_shr(self.halvings).unwrap_or(0).max(1)
            }
            Mode::Fpb => self.resident,
            Mode::Hf => HF_CANDIDATES,
        }
    }

    #[inline(always)]
    fn find(&mut self, key: Key) -> Option<u32> {
        if let Some((k, i)) = self.recent
            && k == key
        {
            return Some(i);
        }
        let i = *self.index.get(&key)?;
        self.recent = Some((key, i));
        Some(i)
    }

    /// The node of `key`, created (not resident) when new.
    #[inline(always)]
    fn node_for(&mut self, key: Key) -> u32 {
        match self.find(key) {
            Some(i) => i,
            None => self.new_node(key),
        }
    }

    /// A node for `key`, which has none (not resident).
    #[inline(always)]
    fn new_node(&mut self, key: Key) -> u32 {
        let fresh = Node {
            key,
            rank: rank(UNKNOWN),
            newer: NIL,
            older: NIL,
            stamp: NOT_RESIDENT,
            seen_phase: 0,
            pred_evicted_phase: 0,
        };
        let i = match self.free.pop() {
            Some(i) => {
                self.nodes[i as usize] = fresh;
                i
            }
            None => {
                self.nodes.push(fresh);
                (self.nodes.len() - 1) as u32
            }
        };
        self.index.insert(key, i);
        self.recent = Some((key, i));
        i
    }

    #[inline(always)]
    fn release(&mut self, i: u32) {
        let n = &mut self.nodes[i as usize];
        debug_assert!(!n.is_resident());
        // A node listed twice in phase_nodes is released once.
        n.seen_phase = 0;
        n.pred_evicted_phase = 0;
        self.index.remove(&n.key);
        if self.recent.is_some_and(|(k, _)| k == n.key) {
            self.recent = None;
        }
        self.free.push(i);
    }

    /// Links resident node `i` as the most recent.
    #[inline(always)]
    fn link_newest(&mut self, i: u32) {
        if self.next_stamp >= self.stamp_limit {
            self.restamp();
        }
        let stamp = self.next_stamp;
        self.next_stamp += 1;
        let newest = self.newest;
        let n = &mut self.nodes[i as usize];
        n.stamp = stamp;
        n.newer = NIL;
        n.older = newest;
        if newest == NIL {
            self.oldest = i;
        } else {
            self.nodes[newest as usize].newer = i;
        }
        self.newest = i;
    }

    /// Unlinks resident node `i` (it leaves the window too; the caller
    /// gives it a new stamp or NOT_RESIDENT).
    #[inline(always)]
    fn unlink(&mut self, i: u32) {
        let n = self.nodes[i as usize];
        // Branch-free: whether a hit lands in the window is data.
        self.window_len -= (n.stamp <= self.edge_stamp) as usize;
        if self.window_edge == i {
            self.window_edge = n.older;
        }
        if n.newer == NIL {
            self.newest = n.older;
        } else {
            self.nodes[n.newer as usize].older = n.older;
        }
        if n.older == NIL {
            self.oldest = n.newer;
        } else {
            self.nodes[n.older as usize].newer = n.newer;
        }
    }

    /// Stamps the resident keys 1, 2, … in recency order when the counter
    /// would wrap (once per 4 billion requests), and rebuilds the heap
    /// whose entries carry the old stamps.
    #[cold]
    fn restamp(&mut self) {
        let mut stamp = 0;
        let mut i = self.oldest;
        while i != NIL {
            stamp += 1;
            self.nodes[i as usize].stamp = stamp;
            i = self.nodes[i as usize].newer;
        }
        self.next_stamp = stamp + 1;
        self.set_window_edge(self.window_edge);
        self.rebuild_heap();
    }

    /// Puts the window's edge at `edge` (NIL: an empty window), with the
    /// edge's own stamp as the threshold.
    fn set_window_edge(&mut self, edge: u32) {
        self.window_edge = edge;
        self.edge_stamp = if edge == NIL {
            0
        } else {
            self.nodes[edge as usize].stamp
        };
    }

    /// The heap becomes exactly the window's current predictions. Scans
    /// the node slab in order (no pointer chasing): the window is every
    /// node with a stamp up to the edge's.
    fn rebuild_heap(&mut self) {
        let edge = self.edge_stamp;
        let every_node = (self.nodes.iter().enumerate()).map(|(i, n)| n.candidate(i as u32));
        self.heap
            .rebuild_retaining(every_node, |c| c.stamp() <= edge);
    }

    /// Whether a heap entry still stands for a window key's current
    /// prediction (in the window, not linked again, same prediction).
    #[inline(always)]
    fn is_current(&self, c: &Candidate) -> bool {
        let n = &self.nodes[c.node() as usize];
        // `&`, not `&&`: one branch for the caller instead of three
        // unpredictable ones (sweeps test half-stale heaps).
        (c.stamp() <= self.edge_stamp) & (n.stamp == c.stamp()) & (n.rank == c.rank())
    }

    #[inline(always)]
    fn push_candidate(&mut self, i: u32) {
        let c = self.nodes[i as usize].candidate(i);
        // The last victim usually still sits on top: overwriting it costs
        // one sift-down instead of a pop and a push.
        if self.heap.peek().is_some_and(|top| !self.is_current(top)) {
            self.heap.replace_top(c);
        } else {
            self.heap.push(c);
        }
    }

    /// The key just newer than `edge` (NIL: the window is empty, so the
    /// oldest key); NIL past the newest.
    #[inline(always)]
    fn newer_than(&self, edge: u32) -> u32 {
        if edge == NIL {
            self.oldest
        } else {
            self.nodes[edge as usize].newer
        }
    }

    /// Moves the window's edge one key newer; that key, if any.
    #[inline(always)]
    fn extend_window(&mut self) -> Option<u32> {
        let next = self.newer_than(self.window_edge);
        if next == NIL {
            return None;
        }
        self.set_window_edge(next);
        self.window_len += 1;
        Some(next)
    }

    /// Makes the window the `l` least-recent keys with every prediction in
    /// the heap, and sweeps the heap when mostly stale.
    fn prepare_window(&mut self, l: usize) {
        debug_assert!(l <= self.resident, "the window is within the cache");
        if self.window_len > l {
            // λ halved: the edge retreats; the heap entries it passes
            // become stale.
            let mut edge = self.window_edge;
            for _ in l..self.window_len {
                edge = self.nodes[edge as usize].older;
            }
            self.set_window_edge(edge);
            self.window_len = l;
        }
        let grow = l.saturating_sub(self.window_len);
        if grow > self.heap.len() / 2 + HEAP_SLACK {
            // A new phase resets λ and regrows the window by up to half the
            // cache: one heapify over it beats a push per key. With λ = 1
            // the window is the whole list and the edge jumps there.
            let edge = if l == self.resident {
                self.newest
            } else {
                (0..grow).fold(self.window_edge, |edge, _| self.newer_than(edge))
            };
            self.set_window_edge(edge);
            self.window_len = l;
            self.rebuild_heap();
            return;
        }
        while self.window_len < l {
            let Some(i) = self.extend_window() else {
                break;
            };
            self.push_candidate(i);
        }
        if self.heap.len() > 2 * self.window_len + HEAP_SLACK {
            let mut heap = std::mem::take(&mut self.heap);
            heap.retain(|c| self.is_current(c));
            self.heap = heap;
        }
    }

    /// The window key with the largest prediction (ties: least recent).
    fn best_candidate(&mut self) -> Option<u32> {
        while let Some(top) = self.heap.peek() {
            if self.is_current(top) {
                return Some(top.node());
            }
            self.heap.pop();
        }
        None
    }

    #[inline(always)]
    fn set_node_prediction(&mut self, i: u32, pred: f64) {
        let n = &mut self.nodes[i as usize];
        n.rank = rank(pred);
        // Async predictions name the key just requested, which is outside
        // the window; re-predictions (Sync) of window keys take this path.
        if n.stamp <= self.edge_stamp {
            self.push_candidate(i);
        }
    }

    /// Alg. 1 lines 4–7: k distinct requests ended the phase.
    #[inline(never)]
    fn start_phase(&mut self) {
        self.phase += 1;
        self.halvings = 0;
        self.distinct_in_phase = 0;
        let ended = self.tag;
        let mut nodes = std::mem::take(&mut self.phase_nodes);
        for &i in &nodes {
            let n = &self.nodes[i as usize];
            if !n.is_resident() && (n.seen_phase == ended || n.pred_evicted_phase == ended) {
                self.release(i);
            }
        }
        nodes.clear();
        self.phase_nodes = nodes;
        self.tag = ended.checked_add(1).unwrap_or_else(|| {
            // Only resident nodes are left, and an old tag means the same
            // to them as none.
            for n in &mut self.nodes {
                n.seen_phase = 0;
                n.pred_evicted_phase = 0;
            }
            1
        });
    }

    /// A request for a key the policy does not know: a miss. LARU gives it
    /// a node at once (the phase counts it) and lists it in phase_nodes, so
    /// it is dropped at the phase's end if the cache never inserts it.
    #[inline(never)]
    fn access_unknown(&mut self, key: Key, now: u64) -> bool {
        self.missing = Some(key);
        if self.is_laru() {
            // `access` just looked the key up: no second lookup.
            let i = self.new_node(key);
            self.nodes[i as usize].seen_phase = self.tag;
            self.distinct_in_phase += 1;
            self.phase_nodes.push(i);
            self.note_request(i, now);
        }
        false
    }

    /// Sync mode queries the predictor with each key's last request time.
    fn note_request(&mut self, i: u32, now: u64) {
        if self.mode == Mode::LaruSync {
            let i = i as usize;
            if i >= self.last_access.len() {
                self.last_access.resize(i + 1, 0);
            }
            self.last_access[i] = now;
        }
    }

    /// Forget a key that just left the cache; a node the phase still needs
    /// (requested or prediction-evicted in it) stays until the phase ends.
    #[inline(always)]
    fn retire(&mut self, i: u32) -> Key {
        self.unlink(i);
        self.resident -= 1;
        let tag = self.tag;
        let laru = self.is_laru();
        let n = &mut self.nodes[i as usize];
        n.stamp = NOT_RESIDENT;
        let key = n.key;
        if laru && (n.seen_phase == tag || n.pred_evicted_phase == tag) {
            self.phase_nodes.push(i);
        } else {
            self.release(i);
        }
        key
    }

    /// Line 16: every candidate gets a prediction of the current model. A
    /// stored prediction is reused when neither the model nor the key's
    /// history changed since it was made, so only keys requested since the
    /// last eviction (or all, after a new model) are predicted again.
    fn sync_predictions(&mut self, oracle: &mut dyn PredictOracle, now: u64) {
        let version = oracle.version(now);
        let keys: Vec<Key> = if self.synced_version != Some(version) {
            self.stale.clear();
            self.resident_lru_first()
                .map(|i| self.nodes[i as usize].key)
                .collect()
        } else {
            std::mem::take(&mut self.stale)
        };
        self.synced_version = Some(version);
        let items: Vec<(u32, (Key, u64))> = keys
            .into_iter()
            .filter_map(|k| {
                let &i = self.index.get(&k)?;
                let n = &self.nodes[i as usize];
                n.is_resident()
                    .then_some((i, (k, self.last_access[i as usize])))
            })
            .collect();
        let queries: Vec<(Key, u64)> = items.iter().map(|&(_, q)| q).collect();
        let mut preds = Vec::with_capacity(items.len());
        oracle.predict(&queries, now, &mut preds);
        for (&(i, _), &p) in items.iter().zip(&preds) {
            self.set_node_prediction(i, p);
        }
    }

    /// Resident nodes, least recent first.
    fn resident_lru_first(&self) -> impl Iterator<Item = u32> + '_ {
        std::iter::successors((self.oldest != NIL).then_some(self.oldest), |&i| {
            let newer = self.nodes[i as usize].newer;
            (newer != NIL).then_some(newer)
        })
    }

    fn lru_victim(&mut self, ctx: &EvictCtx<'_>) -> Option<u32> {
        self.resident_lru_first()
            .find(|&i| ctx.may_evict(self.nodes[i as usize].key))
    }
}

impl EvictionPolicy for PredictiveLru {
    fn name(&self) -> &'static str {
        match self.mode {
            Mode::LaruAsync => "laru",
            Mode::LaruSync => "laru-sync",
            Mode::Fpb => "fpb",
            Mode::Hf => "hf",
        }
    }

    fn access(&mut self, key: Key, now: u64) -> bool {
        let laru = self.is_laru();
        if laru && self.distinct_in_phase >= self.capacity {
            self.start_phase();
        }
        // A request's first lookup: `recent` rarely holds its key here.
        let Some(&i) = self.index.get(&key) else {
            return self.access_unknown(key, now);
        };
        self.recent = Some((key, i));
        let tag = self.tag;
        let n = &mut self.nodes[i as usize];
        // Branch-free: whether this is the key's first request in the phase
        // is data, not a pattern.
        self.distinct_in_phase += (n.seen_phase != tag) as usize;
        n.seen_phase = tag;
        let resident = n.is_resident();
        self.note_request(i, now);
        if !resident {
            // A ghost: requested or prediction-evicted earlier in this phase.
            self.missing = Some(key);
            return false;
        }
        // Leaves the window (if in it); re-enters, if still among the l
        // least recent, at the next eviction with its newest prediction.
        self.unlink(i);
        self.link_newest(i);
        self.missing = None;
        if self.mode == Mode::LaruSync {
            self.stale.push(key);
        }
        true
    }

    fn insert(&mut self, key: Key, now: u64) {
        if self.missing == Some(key) {
            self.missing = None;
        }
        let i = self.node_for(key);
        if self.nodes[i as usize].is_resident() {
            return;
        }
        self.note_request(i, now);
        self.resident += 1;
        self.link_newest(i);
        if self.mode == Mode::LaruSync {
            self.stale.push(key);
        }
    }

    fn evict(&mut self, now: u64, ctx: &mut EvictCtx<'_>) -> Option<Key> {
        if self.resident == 0 {
            return None;
        }
        let tag = self.tag;
        // Line 10: the missing key was evicted by prediction in this phase.
        let proven_wrong = self.is_laru()
            && self
                .missing
                .and_then(|k| self.find(k))
                .is_some_and(|i| self.nodes[i as usize].pred_evicted_phase == tag);
        if proven_wrong {
            let victim = self.lru_victim(ctx)?;
            self.halvings = self.halvings.saturating_add(1);
            self.lru_fallbacks += 1;
            // One halving per returning key, however many pages its miss needs.
            self.missing = None;
            return Some(self.retire(victim));
        }
        let l = self.candidates().min(self.resident);
        if self.mode == Mode::LaruSync
            && let Some(oracle) = ctx.oracle.as_deref_mut()
        {
            self.sync_predictions(oracle, now);
        }
        self.prepare_window(l);
        // Line 18: the candidate with the largest predicted next-access time.
        let best = self
            .best_candidate()
            .expect("a non-empty window has a current entry");
        let victim = if ctx.may_evict(self.nodes[best as usize].key) {
            if self.is_laru() {
                self.nodes[best as usize].pred_evicted_phase = tag;
            }
            self.prediction_evictions += 1;
            best
        } else {
            // The cache forbids this key now (pinned, inner radix node).
            self.lru_fallbacks += 1;
            self.lru_victim(ctx)?
        };
        Some(self.retire(victim))
    }

    fn remove(&mut self, key: Key) -> bool {
        match self.find(key) {
            Some(i) if self.nodes[i as usize].is_resident() => {
                self.retire(i);
                true
            }
            _ => false,
        }
    }

    fn contains(&self, key: Key) -> bool {
        self.index
            .get(&key)
            .is_some_and(|&i| self.nodes[i as usize].is_resident())
    }

    fn len(&self) -> usize {
        self.resident
    }

    fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
    }

    fn set_prediction(&mut self, key: Key, next_access: f64) {
        if let Some(i) = self.find(key) {
            self.set_node_prediction(i, next_access);
        }
    }

    fn uses_predictions(&self) -> bool {
        true
    }
}

#[cfg(test)]
mod tests {
    use super::{Mode, PredictiveLru};
    use crate::eviction::{EvictCtx, EvictionPolicy};
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// Replays the same random requests through `plain` and `tweaked`
    /// (the same policy with some counter moved near its wrap) and checks
    /// that every hit, victim, λ and eviction count agree.
    fn replay_side_by_side(plain: &mut PredictiveLru, tweaked: &mut PredictiveLru, cap: usize) {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        for now in 0..5_000u64 {
            let key = rng.random_range(0..30u64);
            let pred = now as f64 + rng.random_range(0.0..60.0);
            let mut outcomes = Vec::new();
            for cache in [&mut *plain, &mut *tweaked] {
                let hit = cache.access(key, now);
                let mut victim = None;
                if !hit {
                    if cache.len() >= cap {
                        victim = cache.evict(now, &mut EvictCtx::default());
                    }
                    cache.insert(key, now);
                }
                cache.set_prediction(key, pred);
                outcomes.push((hit, victim, cache.lambda(), cache.eviction_counts()));
            }
            assert_eq!(outcomes[0], outcomes[1], "request {now}");
        }
        assert!(plain.eviction_counts().1 > 0, "lambda halved at least once");
    }

    #[test]
    fn phase_tags_wrap_without_changing_victims() {
        let cap = 8;
        let mut wrapping = PredictiveLru::new(Mode::LaruAsync, cap);
        wrapping.tag = u16::MAX - 3;
        replay_side_by_side(
            &mut PredictiveLru::new(Mode::LaruAsync, cap),
            &mut wrapping,
            cap,
        );
        assert!(wrapping.tag < 1_000, "the tag wrapped");
    }

    #[test]
    fn recency_stamps_wrap_without_changing_victims() {
        let cap = 8;
        let mut wrapping = PredictiveLru::new(Mode::LaruAsync, cap);
        // Renumbers every few dozen links, with the heap and window in use.
        wrapping.stamp_limit = 40;
        replay_side_by_side(
            &mut PredictiveLru::new(Mode::LaruAsync, cap),
            &mut wrapping,
            cap,
        );
        assert!(wrapping.next_stamp < 40, "the stamps wrapped");
    }

    #[test]
    fn a_miss_the_cache_never_inserts_counts_once_and_is_forgotten_with_its_phase() {
        let cap = 4;
        let mut p = PredictiveLru::new(Mode::LaruAsync, cap);
        // Key 99 misses and is never inserted (the cache bypassed it).
        assert!(!p.access(99, 0));
        assert!(p.index.contains_key(&99), "kept for the phase's count");
        for (now, key) in [(1, 1), (2, 2), (3, 99)] {
            if !p.access(key, now) && key != 99 {
                p.insert(key, now);
            }
        }
        assert_eq!(p.distinct_in_phase, 3, "99 counted once");
        assert_eq!(p.phase(), 1);
        p.access(3, 4);
        p.insert(3, 4);
        // The fifth distinct key starts phase 2, which drops 99's node.
        p.access(4, 5);
        assert_eq!(p.phase(), 2);
        assert!(!p.index.contains_key(&99));
        assert_eq!(p.len(), 3);
        assert!((1..=3).all(|k| p.contains(k)));
    }
}
