//! LRU guided by predicted next-access times: LARU (LCR Alg. 1, Sync and
//! Async), FPB (evict the largest prediction among all resident keys) and HF
//! (LRU pre-filters the 4 least-recent keys, the prediction picks).
//!
//! A key without a prediction (none yet, NaN or -inf: "cannot say") ranks
//! highest: it goes first, least recent first, so keys learned before the
//! first model cannot sit in the cache forever, and with no predictions at
//! all every mode is LRU.
//!
//! Recency is an append-only log: every request appends the key's entry
//! (its prediction and node) and clears the bit of its previous one, so the
//! live entries, in log order, are the resident keys from least to most
//! recent. A request touches the key's node, one bit and the log's tail,
//! instead of a linked list's neighbours. The log is compacted when it
//! reaches four times the resident keys.
//!
//! The l least-recent keys (the *window*, Alg. 1 line 17's candidate set)
//! are the live entries below `covered`, so the window only changes at its
//! edge, and growing it reads the log sequentially. A max-heap holds the
//! window's predictions with lazy deletion: an entry is skipped (or swept
//! out when stale entries outnumber live ones) once its log entry died, left
//! the window or got a new prediction. Heap pushes wait until an eviction
//! needs the heap, so a hit costs a hash lookup and an append, and choosing
//! a victim costs O(log k) amortised (a 4-ary heap: half the levels of a
//! binary one). When a new phase resets λ and the window regrows by more
//! than half the heap, one heapify replaces the pushes.

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
/// The log is compacted when it reaches this many times the resident keys
/// (plus a slack): a compaction writes every resident node, so it should
/// come rarely, and the dead entries cost only a bit scan meanwhile.
const LOG_GROWTH: usize = 4;
const LOG_SLACK: usize = 64;

/// A key the policy knows: resident, or kept for the current phase's
/// bookkeeping (requested or prediction-evicted in it).
#[derive(Debug, Clone, Copy)]
struct Node {
    key: Key,
    /// Its latest prediction (kept while not resident: the cache may
    /// predict before it inserts).
    pred: f64,
    /// Position of its live log entry (resident keys only).
    pos: u32,
    /// Tag of the phase in which the key was last requested (0: none).
    seen_phase: u32,
    /// Tag of the phase in which the key was last evicted by prediction
    /// (Alg. 1 line 18; 0: none).
    pred_evicted_phase: u32,
    resident: bool,
}

// Two nodes per cache line: on large caches a request's cost is mostly
// cache misses on nodes.
const _: () = assert!(std::mem::size_of::<Node>() == 32);

/// One request in the recency log.
#[derive(Debug, Clone, Copy)]
struct Entry {
    pred: f64,
    node: u32,
}

/// A heap entry, ordered as one integer: larger prediction first, then the
/// less recent (smaller log position). One integer comparison instead of
/// two float and one integer keeps the pop path short.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Candidate(u128);

impl Candidate {
    fn new(pred: f64, pos: usize) -> Self {
        Self(((order_bits(pred) as u128) << 64) | (u64::MAX - pos as u64) as u128)
    }

    fn pos(self) -> usize {
        (u64::MAX - self.0 as u64) as usize
    }

    fn pred_bits(self) -> u64 {
        (self.0 >> 64) as u64
    }
}

/// Maps a sanitized prediction to an integer of the same order.
fn order_bits(pred: f64) -> u64 {
    let bits = pred.to_bits();
    if bits >> 63 == 1 {
        !bits
    } else {
        bits | 1 << 63
    }
}

/// "Cannot say" ranks highest; -0.0 equals 0.0.
fn sanitize(pred: f64) -> f64 {
    if pred.is_nan() || pred == f64::NEG_INFINITY {
        UNKNOWN
    } else {
        pred + 0.0
    }
}

/// One bit per log position: whether the entry is live.
#[derive(Debug, Default)]
struct LiveBits {
    words: Vec<u64>,
}

impl LiveBits {
    fn get(&self, pos: usize) -> bool {
        self.words[pos >> 6] >> (pos & 63) & 1 == 1
    }

    /// Sets the bit of `pos`, the log's new last position.
    fn push_live(&mut self, pos: usize) {
        if pos >> 6 == self.words.len() {
            self.words.push(0);
        }
        self.words[pos >> 6] |= 1 << (pos & 63);
    }

    fn clear(&mut self, pos: usize) {
        self.words[pos >> 6] &= !(1 << (pos & 63));
    }

    /// Exactly positions `0..n` live.
    fn reset_to(&mut self, n: usize) {
        self.words.clear();
        self.words.resize(n / 64, u64::MAX);
        if !n.is_multiple_of(64) {
            self.words.push((1 << (n % 64)) - 1);
        }
    }

    /// The first live position at or after `from`, below `end`.
    fn next_live(&self, from: usize, end: usize) -> Option<usize> {
        let mut w = from >> 6;
        let mut bits = self.words.get(w)? & (u64::MAX << (from & 63));
        loop {
            if bits != 0 {
                let pos = (w << 6) + bits.trailing_zeros() as usize;
                return (pos < end).then_some(pos);
            }
            w += 1;
            bits = *self.words.get(w)?;
        }
    }

    /// The live positions in `from..end`, in order.
    fn positions(&self, from: usize, end: usize) -> impl Iterator<Item = usize> + '_ {
        std::iter::successors(self.next_live(from, end), move |&p| {
            self.next_live(p + 1, end)
        })
    }

    /// Moves from `from` past up to `count` live positions; returns the
    /// position just after the last one passed and how many were passed.
    fn advance(&self, from: usize, count: usize) -> (usize, usize) {
        let mut left = count;
        let mut w = from >> 6;
        let Some(&first) = self.words.get(w) else {
            return (from, 0);
        };
        let mut bits = first & (u64::MAX << (from & 63));
        let mut end = from;
        while left > 0 {
            let ones = bits.count_ones() as usize;
            if ones >= left {
                for _ in 1..left {
                    bits &= bits - 1;
                }
                return ((w << 6) + bits.trailing_zeros() as usize + 1, count);
            }
            if ones > 0 {
                end = (w << 6) + 64 - bits.leading_zeros() as usize;
            }
            left -= ones;
            w += 1;
            match self.words.get(w) {
                Some(&b) => bits = b,
                None => break,
            }
        }
        (end, count - left)
    }

    /// The position `p` below `end` such that `p..end` holds exactly
    /// `count` live positions, the first of them at `p`; there must be as
    /// many before `end`.
    fn retreat(&self, end: usize, count: usize) -> usize {
        debug_assert!(count > 0);
        let mut left = count;
        let last = end - 1;
        let mut w = last >> 6;
        let mut bits = self.words[w] & (u64::MAX >> (63 - (last & 63)));
        loop {
            let ones = bits.count_ones() as usize;
            if ones >= left {
                for _ in 1..left {
                    bits &= !(1 << (63 - bits.leading_zeros()));
                }
                return (w << 6) + 63 - bits.leading_zeros() as usize;
            }
            left -= ones;
            w -= 1;
            bits = self.words[w];
        }
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
    /// Recency log; its live entries are the resident keys, least recent first.
    log: Vec<Entry>,
    live: LiveBits,
    /// No live entry lies before this position.
    head: usize,
    resident: usize,
    /// The window is the live entries below this log position.
    covered: usize,
    window_len: usize,
    heap: QuadHeap<Candidate>,
    /// Window positions whose new prediction is not yet in the heap.
    pending: Vec<u32>,
    /// Current phase (LARU), from 1.
    phase: u64,
    /// The current phase's tag in nodes: 32 bits keep a node at 32 bytes;
    /// every tag is cleared when it would wrap.
    tag: u32,
    /// Sync: each node's last request time (the predictor's query).
    last_access: Vec<u64>,
    distinct_in_phase: usize,
    /// Confidence λ = 2^-halvings (it only ever halves and resets to 1).
    halvings: u32,
    /// Nodes the current phase needs (requested or prediction-evicted in
    /// it); those not resident when it ends are released. Never released
    /// before, so the indices stay valid.
    phase_nodes: Vec<u32>,
    /// The request being served when it missed (Alg. 1 line 10).
    missing: Option<Key>,
    /// A node created by that miss: if the cache does not insert it, it
    /// joins phase_nodes (kept for the phase count, dropped at its end).
    unplaced: Option<u32>,
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
            log: Vec::new(),
            live: LiveBits::default(),
            head: 0,
            resident: 0,
            covered: 0,
            window_len: 0,
            heap: QuadHeap::new(),
            pending: Vec::new(),
            phase: 1,
            tag: 1,
            last_access: Vec::new(),
            distinct_in_phase: 0,
            halvings: 0,
            phase_nodes: Vec::new(),
            missing: None,
            unplaced: None,
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
        if let Some(i) = self.find(key) {
            return i;
        }
        let fresh = Node {
            key,
            pred: UNKNOWN,
            pos: 0,
            seen_phase: 0,
            pred_evicted_phase: 0,
            resident: false,
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
        debug_assert!(!n.resident);
        // A node listed twice in phase_nodes is released once.
        n.seen_phase = 0;
        n.pred_evicted_phase = 0;
        self.index.remove(&n.key);
        if self.recent.is_some_and(|(k, _)| k == n.key) {
            self.recent = None;
        }
        self.free.push(i);
    }

    /// Appends resident node `i` as the most recent.
    #[inline(always)]
    fn link_newest(&mut self, i: u32) {
        if self.log.len() >= LOG_GROWTH * self.resident + LOG_SLACK {
            self.compact();
        }
        let pos = self.log.len();
        self.log.push(Entry {
            pred: self.nodes[i as usize].pred,
            node: i,
        });
        self.live.push_live(pos);
        debug_assert!(pos <= u32::MAX as usize, "a log position fits a node's u32");
        self.nodes[i as usize].pos = pos as u32;
    }

    /// Kills resident node `i`'s log entry (it leaves the window too).
    #[inline(always)]
    fn unlink(&mut self, i: u32) {
        let pos = self.nodes[i as usize].pos as usize;
        self.live.clear(pos);
        if pos < self.covered {
            self.window_len -= 1;
        }
    }

    /// Drops the dead log entries. The window's keys are the first live
    /// ones, so it becomes the log's first `window_len` positions and the
    /// heap is rebuilt from them.
    fn compact(&mut self) {
        let mut kept = 0;
        for p in self.live.positions(self.head, self.log.len()) {
            let e = self.log[p];
            self.log[kept] = e;
            self.nodes[e.node as usize].pos = kept as u32;
            kept += 1;
        }
        self.log.truncate(kept);
        self.live.reset_to(kept);
        self.head = 0;
        self.covered = self.window_len;
        self.rebuild_heap();
    }

    /// The heap becomes exactly the window's current predictions.
    fn rebuild_heap(&mut self) {
        self.pending.clear();
        let log = &self.log;
        let window = self.live.positions(self.head, self.covered);
        self.heap
            .rebuild(window.map(|p| Candidate::new(log[p].pred, p)));
    }

    /// Whether a heap entry still stands for a window key's current
    /// prediction (its log entry is live, in the window and unchanged).
    #[inline(always)]
    fn is_current(&self, c: &Candidate) -> bool {
        let p = c.pos();
        p < self.covered && self.live.get(p) && order_bits(self.log[p].pred) == c.pred_bits()
    }

    #[inline(always)]
    fn push_candidate(&mut self, pos: usize) {
        let c = Candidate::new(self.log[pos].pred, pos);
        // The last victim usually still sits on top: overwriting it costs
        // one sift-down instead of a pop and a push.
        if self.heap.peek().is_some_and(|top| !self.is_current(top)) {
            self.heap.replace_top(c);
        } else {
            self.heap.push(c);
        }
    }

    /// Makes the window the `l` least-recent keys with every prediction in
    /// the heap, and sweeps the heap when mostly stale.
    fn prepare_window(&mut self, l: usize) {
        if self.window_len > l {
            self.covered = self.live.retreat(self.covered, self.window_len - l);
            self.window_len = l;
        }
        let grow = l.saturating_sub(self.window_len);
        if grow > self.heap.len() / 2 + HEAP_SLACK {
            // A new phase resets λ and regrows the window by up to half the
            // cache: one heapify over it beats a push per key.
            let (covered, found) = self.live.advance(self.covered, grow);
            self.covered = covered;
            self.window_len += found;
            self.rebuild_heap();
            return;
        }
        while self.window_len < l {
            let Some(p) = self.live.next_live(self.covered, self.log.len()) else {
                break;
            };
            self.covered = p + 1;
            self.window_len += 1;
            self.push_candidate(p);
        }
        // Taken and put back so the buffer keeps its capacity (every eviction
        // passes here).
        let mut pending = std::mem::take(&mut self.pending);
        for &p in &pending {
            let p = p as usize;
            if p < self.covered && self.live.get(p) {
                self.push_candidate(p);
            }
        }
        pending.clear();
        self.pending = pending;
        if self.heap.len() > 2 * self.window_len + HEAP_SLACK {
            let mut heap = std::mem::take(&mut self.heap);
            heap.retain(|c| self.is_current(c));
            self.heap = heap;
        }
    }

    /// Log position of the window key with the largest prediction (ties:
    /// least recent).
    fn best_candidate(&mut self) -> Option<usize> {
        while let Some(top) = self.heap.peek() {
            if self.is_current(top) {
                return Some(top.pos());
            }
            self.heap.pop();
        }
        None
    }

    #[inline(always)]
    fn set_node_prediction(&mut self, i: u32, pred: f64) {
        let pred = sanitize(pred);
        let n = &mut self.nodes[i as usize];
        n.pred = pred;
        if n.resident {
            let pos = n.pos as usize;
            self.log[pos].pred = pred;
            if pos < self.covered {
                self.pending.push(pos as u32);
            }
        }
    }

    /// Alg. 1 lines 4–7.
    fn maybe_start_phase(&mut self) {
        if self.distinct_in_phase < self.capacity {
            return;
        }
        self.phase += 1;
        self.halvings = 0;
        self.distinct_in_phase = 0;
        let ended = self.tag;
        let mut nodes = std::mem::take(&mut self.phase_nodes);
        for &i in &nodes {
            let n = &self.nodes[i as usize];
            if !n.resident && (n.seen_phase == ended || n.pred_evicted_phase == ended) {
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
        n.resident = false;
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
                n.resident.then_some((i, (k, self.last_access[i as usize])))
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
        self.live
            .positions(self.head, self.log.len())
            .map(|p| self.log[p].node)
    }

    fn lru_victim(&mut self, ctx: &EvictCtx<'_>) -> Option<u32> {
        if let Some(p) = self.live.next_live(self.head, self.log.len()) {
            self.head = p;
        }
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
            if let Some(u) = self.unplaced.take()
                && !self.nodes[u as usize].resident
            {
                self.phase_nodes.push(u);
            }
            self.maybe_start_phase();
        }
        let tag = self.tag;
        let i = if laru {
            self.node_for(key)
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
        // Any other non-resident node is a ghost already in phase_nodes.
        let fresh = !n.resident && n.seen_phase == 0 && n.pred_evicted_phase == 0;
        if n.seen_phase != tag {
            n.seen_phase = tag;
            self.distinct_in_phase += 1;
        }
        let resident = n.resident;
        self.note_request(i, now);
        if !resident {
            if fresh {
                self.unplaced = Some(i);
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
        let i = self.node_for(key);
        if self.nodes[i as usize].resident {
            return;
        }
        self.nodes[i as usize].resident = true;
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
            .map(|p| self.log[p].node)
            .expect("a non-empty window has a live entry");
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

#[cfg(test)]
mod tests {
    use super::{LiveBits, Mode, PredictiveLru};
    use crate::eviction::{EvictCtx, EvictionPolicy};
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    #[test]
    fn live_bits_walks_match_a_plain_scan() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        for n in [0usize, 1, 63, 64, 65, 200, 517] {
            let mut bits = LiveBits::default();
            let mut plain = vec![true; n];
            for p in 0..n {
                bits.push_live(p);
            }
            for (p, live) in plain.iter_mut().enumerate() {
                if rng.random_range(0..3) == 0 {
                    bits.clear(p);
                    *live = false;
                }
            }
            let live: Vec<usize> = (0..n).filter(|&p| plain[p]).collect();
            assert_eq!(bits.positions(0, n).collect::<Vec<_>>(), live);
            for from in 0..=n {
                let after: Vec<usize> = live.iter().copied().filter(|&p| p >= from).collect();
                assert_eq!(bits.next_live(from, n), after.first().copied());
                for count in 0..=after.len() + 2 {
                    let found = count.min(after.len());
                    let end = if found == 0 {
                        from
                    } else {
                        after[found - 1] + 1
                    };
                    assert_eq!(
                        bits.advance(from, count),
                        (end, found),
                        "n {n} from {from} count {count}"
                    );
                }
                let before: Vec<usize> = live.iter().copied().filter(|&p| p < from).collect();
                for count in 1..=before.len() {
                    assert_eq!(bits.retreat(from, count), before[before.len() - count]);
                }
            }
            bits.reset_to(n);
            assert_eq!(bits.advance(0, n + 1), (n, n));
        }
    }

    #[test]
    fn phase_tags_wrap_without_changing_victims() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let cap = 8;
        let mut plain = PredictiveLru::new(Mode::LaruAsync, cap);
        let mut wrapping = PredictiveLru::new(Mode::LaruAsync, cap);
        wrapping.tag = u32::MAX - 3;
        for now in 0..5_000u64 {
            let key = rng.random_range(0..30u64);
            let pred = now as f64 + rng.random_range(0.0..60.0);
            let mut victims = Vec::new();
            for cache in [&mut plain, &mut wrapping] {
                let hit = cache.access(key, now);
                let mut victim = None;
                if !hit {
                    if cache.len() >= cap {
                        victim = cache.evict(now, &mut EvictCtx::default());
                    }
                    cache.insert(key, now);
                }
                cache.set_prediction(key, pred);
                victims.push((hit, victim, cache.lambda(), cache.eviction_counts()));
            }
            assert_eq!(victims[0], victims[1], "request {now}");
        }
        assert!(wrapping.tag < 1_000, "the tag wrapped");
        assert!(plain.eviction_counts().1 > 0, "lambda halved at least once");
    }
}
