//! LRU guided by predicted next-access times: LARU (LCR Alg. 1, Sync and
//! Async), FPB (evict the largest prediction among all resident keys) and HF
//! (LRU pre-filters the 4 least-recent keys, the prediction picks).
//!
//! A key without a prediction (none yet, NaN or -inf: "cannot say") ranks
//! highest: it goes first, least recent first, so keys learned before the
//! first model cannot sit in the cache forever, and with no predictions at
//! all every mode is LRU.
//!
//! Resident keys sit in a recency list. The l least-recent of them (the
//! *window*, Alg. 1 line 17's candidate set) are always a prefix of that
//! list, so it only changes at its edge: a request moves O(1) keys across
//! it, amortised over a phase's λ halvings and reset. A max-heap holds the window's
//! predictions with lazy deletion: an entry stays in the heap after its key
//! leaves the window or gets a new prediction, and is skipped (or swept out
//! when stale entries outnumber live ones) when found on top. Heap pushes
//! wait until an eviction needs the heap, so a hit costs a hash lookup and
//! a list move, and choosing a victim costs O(log k) amortised.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

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
const NIL: u32 = u32::MAX;
/// Rank of a key without a prediction.
const UNKNOWN: f64 = f64::INFINITY;
/// Stale heap entries tolerated beyond the live ones before a sweep.
const HEAP_SLACK: usize = 64;

/// A key the policy knows: resident, or kept for the current phase's
/// bookkeeping (requested or prediction-evicted in it).
#[derive(Debug, Clone, Copy)]
struct Node {
    key: Key,
    /// Recency list links; `prev` is less recent.
    prev: u32,
    next: u32,
    pred: f64,
    /// Recency stamp, increasing along the list (ties go to the smaller).
    tick: u64,
    /// Bumped at every heap push: only the newest entry of a key is live.
    generation: u32,
    resident: bool,
    in_window: bool,
    /// In `pending`: its prediction changed while in the window.
    needs_push: bool,
    last_access: u64,
    /// Phase in which the key was last requested.
    seen_phase: u64,
    /// Phase in which the key was last evicted by prediction (Alg. 1 line 18).
    pred_evicted_phase: u64,
}

/// A heap entry: larger prediction first, then the less recent.
#[derive(Debug, Clone, Copy)]
struct Candidate {
    pred: f64,
    tick: u64,
    node: u32,
    generation: u32,
}

impl Ord for Candidate {
    fn cmp(&self, other: &Self) -> Ordering {
        self.pred
            .total_cmp(&other.pred)
            .then_with(|| other.tick.cmp(&self.tick))
    }
}

impl PartialOrd for Candidate {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Candidate {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Candidate {}

/// "Cannot say" ranks highest; -0.0 equals 0.0 (total_cmp would split them).
fn sanitize(pred: f64) -> f64 {
    if pred.is_nan() || pred == f64::NEG_INFINITY {
        UNKNOWN
    } else {
        pred + 0.0
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
    /// Least and most recent resident keys.
    oldest: u32,
    newest: u32,
    resident: usize,
    next_tick: u64,
    /// The window is the list prefix ending at `window_edge` (NIL: empty).
    window_edge: u32,
    window_len: usize,
    heap: BinaryHeap<Candidate>,
    /// Window keys whose new prediction is not yet in the heap.
    pending: Vec<u32>,
    /// Current phase (LARU), from 1.
    phase: u64,
    distinct_in_phase: usize,
    /// Confidence λ.
    lambda: f64,
    /// Non-resident keys whose node lives until the phase ends.
    phase_keys: Vec<Key>,
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
            oldest: NIL,
            newest: NIL,
            resident: 0,
            next_tick: 0,
            window_edge: NIL,
            window_len: 0,
            heap: BinaryHeap::new(),
            pending: Vec::new(),
            phase: 1,
            distinct_in_phase: 0,
            lambda: 1.0,
            phase_keys: Vec::new(),
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
        self.lambda
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
                ((self.lambda * self.capacity as f64).floor() as usize).max(1)
            }
            Mode::Fpb => self.resident,
            Mode::Hf => HF_CANDIDATES,
        }
    }

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
    fn node_for(&mut self, key: Key, now: u64) -> u32 {
        if let Some(i) = self.find(key) {
            return i;
        }
        let fresh = Node {
            key,
            prev: NIL,
            next: NIL,
            pred: UNKNOWN,
            tick: 0,
            generation: 0,
            resident: false,
            in_window: false,
            needs_push: false,
            last_access: now,
            seen_phase: 0,
            pred_evicted_phase: 0,
        };
        let i = match self.free.pop() {
            Some(i) => {
                // Keep the generation: the old key's heap entries stay dead.
                let generation = self.nodes[i as usize].generation;
                self.nodes[i as usize] = Node {
                    generation,
                    ..fresh
                };
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

    fn release(&mut self, i: u32) {
        let n = &mut self.nodes[i as usize];
        debug_assert!(!n.resident);
        n.needs_push = false;
        self.index.remove(&n.key);
        if self.recent.is_some_and(|(k, _)| k == n.key) {
            self.recent = None;
        }
        self.free.push(i);
    }

    /// Appends resident node `i` as the most recent.
    fn link_newest(&mut self, i: u32) {
        let tick = self.next_tick;
        self.next_tick += 1;
        let n = &mut self.nodes[i as usize];
        n.prev = self.newest;
        n.next = NIL;
        n.tick = tick;
        if self.newest == NIL {
            self.oldest = i;
        } else {
            self.nodes[self.newest as usize].next = i;
        }
        self.newest = i;
    }

    /// Takes resident node `i` out of the list (and the window).
    fn unlink(&mut self, i: u32) {
        let Node {
            prev,
            next,
            in_window,
            ..
        } = self.nodes[i as usize];
        if in_window {
            // The window is a prefix, so `prev` is in it too.
            self.nodes[i as usize].in_window = false;
            self.window_len -= 1;
            if self.window_edge == i {
                self.window_edge = prev;
            }
        }
        if prev == NIL {
            self.oldest = next;
        } else {
            self.nodes[prev as usize].next = next;
        }
        if next == NIL {
            self.newest = prev;
        } else {
            self.nodes[next as usize].prev = prev;
        }
    }

    fn push_candidate(&mut self, i: u32) {
        let n = &mut self.nodes[i as usize];
        n.generation = n.generation.wrapping_add(1);
        n.needs_push = false;
        let c = Candidate {
            pred: n.pred,
            tick: n.tick,
            node: i,
            generation: n.generation,
        };
        // The last victim usually still sits on top: overwriting it costs
        // one sift-down instead of a pop and a push.
        if let Some(mut top) = self.heap.peek_mut()
            && !Self::live(&self.nodes, &top)
        {
            *top = c;
        } else {
            self.heap.push(c);
        }
    }

    fn live(nodes: &[Node], c: &Candidate) -> bool {
        let n = &nodes[c.node as usize];
        n.in_window && n.generation == c.generation
    }

    /// Makes the window the `l` least-recent keys with every prediction in
    /// the heap, and sweeps the heap when mostly stale.
    fn prepare_window(&mut self, l: usize) {
        while self.window_len > l {
            let e = self.window_edge;
            self.nodes[e as usize].in_window = false;
            self.window_edge = self.nodes[e as usize].prev;
            self.window_len -= 1;
        }
        while self.window_len < l {
            let n = if self.window_edge == NIL {
                self.oldest
            } else {
                self.nodes[self.window_edge as usize].next
            };
            if n == NIL {
                break;
            }
            self.nodes[n as usize].in_window = true;
            self.window_edge = n;
            self.window_len += 1;
            self.push_candidate(n);
        }
        // Taken and put back so the buffer keeps its capacity (every eviction
        // passes here).
        let mut pending = std::mem::take(&mut self.pending);
        for &i in &pending {
            let n = self.nodes[i as usize];
            if n.needs_push && n.in_window {
                self.push_candidate(i);
            }
            self.nodes[i as usize].needs_push = false;
        }
        pending.clear();
        self.pending = pending;
        if self.heap.len() > 2 * self.window_len + HEAP_SLACK {
            let nodes = &self.nodes;
            self.heap.retain(|c| Self::live(nodes, c));
        }
    }

    /// The window key with the largest prediction (ties: least recent).
    fn best_candidate(&mut self) -> Option<u32> {
        while let Some(top) = self.heap.peek() {
            if Self::live(&self.nodes, top) {
                return Some(top.node);
            }
            self.heap.pop();
        }
        None
    }

    fn set_node_prediction(&mut self, i: u32, pred: f64) {
        let n = &mut self.nodes[i as usize];
        n.pred = sanitize(pred);
        if n.in_window && !n.needs_push {
            n.needs_push = true;
            self.pending.push(i);
        }
    }

    /// Alg. 1 lines 4–7.
    fn maybe_start_phase(&mut self) {
        if self.distinct_in_phase < self.capacity {
            return;
        }
        self.phase += 1;
        self.lambda = 1.0;
        self.distinct_in_phase = 0;
        for key in std::mem::take(&mut self.phase_keys) {
            if let Some(&i) = self.index.get(&key)
                && !self.nodes[i as usize].resident
            {
                self.release(i);
            }
        }
    }

    /// Forget a key that just left the cache; a node the phase still needs
    /// (requested or prediction-evicted in it) stays until the phase ends.
    fn retire(&mut self, i: u32) -> Key {
        self.unlink(i);
        self.resident -= 1;
        let phase = self.phase;
        let laru = self.is_laru();
        let n = &mut self.nodes[i as usize];
        n.resident = false;
        let key = n.key;
        if laru && (n.seen_phase == phase || n.pred_evicted_phase == phase) {
            self.phase_keys.push(key);
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
                n.resident.then_some((i, (k, n.last_access)))
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
        std::iter::successors(Some(self.oldest).filter(|&i| i != NIL), |&i| {
            Some(self.nodes[i as usize].next).filter(|&n| n != NIL)
        })
    }

    fn lru_victim(&self, ctx: &EvictCtx<'_>) -> Option<u32> {
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
        if laru {
            self.maybe_start_phase();
        }
        let phase = self.phase;
        let i = if laru {
            self.node_for(key, now)
        } else {
            // Without phases a key's node lives exactly while it is resident.
            match self.find(key) {
                Some(i) => i,
                None => {
                    self.missing = Some(key);
                    return false;
                }
            }
        };
        let n = &mut self.nodes[i as usize];
        if n.seen_phase != phase {
            n.seen_phase = phase;
            self.distinct_in_phase += 1;
        }
        n.last_access = now;
        if !n.resident {
            if n.pred_evicted_phase != phase {
                // Kept only for the phase count; dropped when the phase ends.
                self.phase_keys.push(key);
            }
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
        let i = self.node_for(key, now);
        if self.nodes[i as usize].resident {
            return;
        }
        let n = &mut self.nodes[i as usize];
        n.resident = true;
        n.last_access = now;
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
        let phase = self.phase;
        // Line 10: the missing key was evicted by prediction in this phase.
        let proven_wrong = self.is_laru()
            && self
                .missing
                .and_then(|k| self.find(k))
                .is_some_and(|i| self.nodes[i as usize].pred_evicted_phase == phase);
        if proven_wrong {
            let victim = self.lru_victim(ctx)?;
            self.lambda /= 2.0;
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
            .expect("a non-empty window has a live entry");
        let victim = if ctx.may_evict(self.nodes[best as usize].key) {
            if self.is_laru() {
                self.nodes[best as usize].pred_evicted_phase = phase;
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
            Some(i) if self.nodes[i as usize].resident => {
                self.retire(i);
                true
            }
            _ => false,
        }
    }

    fn contains(&self, key: Key) -> bool {
        self.index
            .get(&key)
            .is_some_and(|&i| self.nodes[i as usize].resident)
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
