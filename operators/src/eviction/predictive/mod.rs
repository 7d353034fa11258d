//! LRU guided by predicted next-access times: LARU (LCR Alg. 1, Sync and
//! Async), FPB (evict the largest prediction among all resident keys) and HF
//! (LRU pre-filters the 4 least-recent keys, the prediction picks).
//!
//! A key without a prediction (none yet, NaN or -inf: "cannot say") ranks
//! highest: it goes first, least recent first, so keys learned before the
//! first model cannot sit in the cache forever, and with no predictions at
//! all every mode is LRU.
//!
//! The parts: [`recency`] keeps the known keys in a node slab with the
//! resident ones in LRU order; [`window`] keeps the candidate set of Alg. 1
//! line 14 (the l least-recent keys) and a heap of their predictions; this
//! module runs the algorithm: phases, λ, and which key goes.
//!
//! LARU needs to know, for a missed key, whether it was requested or
//! evicted by prediction earlier in the phase. Such a key keeps its node as
//! a *ghost* after it leaves the cache; ghosts are released in bulk at a
//! phase's start once they exceed a budget (k + 64 keys, but at least
//! 2,048), and a ghost requested again before then costs no new node and
//! no hash insertion. A phase creates nodes only for the at most k new
//! keys it requests, so the policy never knows more than
//! 2k + max(k + 64, 2048) keys (k resident, the ghosts carried into the
//! phase, k new). When λ has collapsed to l = 1 the victim is the
//! least-recent key and the heap is not used at all.

mod index;
mod recency;
mod window;

use index::KeyIndex;
use recency::{HEAD, NOT_RESIDENT, Recency};
use window::{NO_PREDICTION, Window, rank};

use super::{EvictCtx, EvictionPolicy, Key, PredictOracle};

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
/// Ghosts tolerated beyond the capacity before a collection.
const GHOST_SLACK: usize = 64;
/// Ghosts tolerated before a collection however small the cache: a
/// collection passes over every node and refills the key index, and a small
/// cache's phases are short, so with a budget of only k it would collect
/// every few phases and re-create the same few thousand keys each time
/// (2,048 ghosts are 64 KiB of nodes and about 10 KiB of index).
const GHOST_FLOOR: usize = 2_048;

/// Ghosts a LARU cache of `capacity` keys keeps before a collection.
fn ghost_budget(capacity: usize) -> usize {
    (capacity + GHOST_SLACK).max(GHOST_FLOOR)
}

/// LARU / FPB / HF over one cache.
#[derive(Debug)]
pub struct PredictiveLru {
    mode: Mode,
    /// LARU (Sync or Async): phases, λ and ghosts.
    laru: bool,
    sync: bool,
    /// k: the cache's capacity in keys.
    capacity: usize,
    index: KeyIndex,
    /// The last key looked up and its node: a request's `access`, `evict`,
    /// `insert` and `set_prediction` all name the same key, so one hash
    /// lookup serves all four.
    recent: Option<(Key, u32)>,
    recency: Recency,
    window: Window,
    resident: usize,
    /// Current phase (LARU), from 1.
    phase: u64,
    /// The current phase's tag in nodes: 16 bits keep nodes at 32 bytes;
    /// every tag is cleared when it would wrap (after 65,535 phases of at
    /// least k requests each).
    tag: u16,
    distinct_in_phase: usize,
    /// Distinct requests that end a phase: k for LARU, never otherwise.
    phase_len: usize,
    /// Confidence λ = 2^-halvings (it only ever halves and resets to 1).
    halvings: u32,
    /// The node of the request being served when it missed (Alg. 1 line
    /// 10); HEAD when it hit, and always for FPB and HF.
    missing: u32,
    /// Sync: each node's last request time (the predictor's query), the
    /// model version the stored predictions were made with, and keys
    /// requested since (their history changed).
    last_access: Vec<u64>,
    synced_version: Option<u64>,
    stale: Vec<Key>,
    prediction_evictions: u64,
    lru_fallbacks: u64,
}

impl PredictiveLru {
    pub fn new(mode: Mode, capacity: usize) -> Self {
        let capacity = capacity.max(1);
        let laru = matches!(mode, Mode::LaruAsync | Mode::LaruSync);
        // Room to start with: resident keys and, for LARU, about as many
        // ghosts (the slab and index grow to the ghost budget if needed).
        let known = if laru {
            2 * capacity + GHOST_SLACK
        } else {
            capacity
        };
        Self {
            mode,
            laru,
            sync: mode == Mode::LaruSync,
            capacity,
            index: KeyIndex::with_capacity(known),
            recent: None,
            recency: Recency::with_capacity(known),
            window: Window::new(),
            resident: 0,
            phase: 1,
            tag: 1,
            distinct_in_phase: 0,
            phase_len: if laru { capacity } else { usize::MAX },
            halvings: 0,
            missing: HEAD,
            last_access: Vec::new(),
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

    /// Keys the policy keeps a node for: resident ones and ghosts.
    pub fn known_keys(&self) -> usize {
        self.recency.known()
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
        let i = self.index.get(key, &self.recency)?;
        self.recent = Some((key, i));
        Some(i)
    }

    /// A node for `key`, which has none (not resident).
    #[inline(always)]
    fn new_node(&mut self, key: Key) -> u32 {
        let i = self.recency.alloc(key, NO_PREDICTION);
        self.index.insert(key, i, &self.recency);
        self.recent = Some((key, i));
        i
    }

    /// Links resident node `i` as the most recent.
    #[inline(always)]
    fn link_newest(&mut self, i: u32) {
        if self.recency.stamps_exhausted() {
            self.restamp();
        }
        self.recency.link_newest(i);
    }

    /// Unlinks resident node `i`; it leaves the window too.
    #[inline(always)]
    fn unlink(&mut self, i: u32) {
        let n = self.recency.unlink(i);
        self.window.on_unlink(i, &n);
    }

    /// Renumbers the stamps and rebuilds the window, whose heap entries
    /// carry the old ones.
    #[cold]
    fn restamp(&mut self) {
        self.recency.restamp();
        self.window.rebuild(&self.recency, self.window.len());
    }

    #[inline(always)]
    fn set_node_prediction(&mut self, i: u32, pred: f64) {
        let n = self.recency.node_mut(i);
        n.rank = rank(pred);
        // Async predictions name the key just requested, which is outside
        // the window; re-predictions (Sync) of window keys take this path.
        if self.window.contains(n.stamp) {
            self.push_window_candidate(i);
        }
    }

    /// A window key's new prediction enters the heap (out of line: the
    /// caller's common path then needs no saved registers).
    #[inline(never)]
    fn push_window_candidate(&mut self, i: u32) {
        self.window.push(&self.recency, i);
    }

    /// Alg. 1 lines 4–7: k distinct requests ended the phase.
    #[inline(never)]
    fn start_phase(&mut self) {
        self.phase += 1;
        self.halvings = 0;
        self.distinct_in_phase = 0;
        // The ended phase's ghosts are no longer needed; collect them in
        // bulk once they exceed the ghost budget (a ghost requested again
        // before then saves its key a new node and a hash insertion). The
        // index is then rebuilt from the resident keys: fewer than the
        // ghosts, and inserting into an emptied table beats removing key by
        // key.
        if self.recency.known() - self.resident > ghost_budget(self.capacity) {
            let index = &mut self.index;
            index.clear();
            self.recency
                .release_ghosts(|key, i| index.insert_fresh(key, i));
            self.recent = None;
            self.missing = HEAD;
        }
        self.tag = self.tag.checked_add(1).unwrap_or_else(|| {
            // An old tag means the same as none to every node.
            self.recency.clear_phase_tags();
            1
        });
    }

    /// A request (LARU) for a key the policy did not know: a miss. Its
    /// new node counts for the phase: a ghost until the cache inserts it.
    #[inline(never)]
    fn access_new(&mut self, key: Key, now: u64) -> bool {
        let i = self.new_node(key);
        self.recency.node_mut(i).seen_phase = self.tag;
        self.distinct_in_phase += 1;
        self.missing = i;
        self.note_request(i, now);
        false
    }

    /// A request for a ghost (LARU): a miss.
    #[inline(always)]
    fn access_ghost(&mut self, i: u32, now: u64) -> bool {
        self.missing = i;
        self.note_request(i, now);
        false
    }

    /// Sync: `key` (node `i`) was requested at `now`, so its history changed.
    #[inline(never)]
    fn note_sync_request(&mut self, i: u32, key: Key, now: u64) {
        self.note_request(i, now);
        self.stale.push(key);
    }

    /// Sync mode queries the predictor with each key's last request time.
    #[inline(always)]
    fn note_request(&mut self, i: u32, now: u64) {
        if self.sync {
            let i = i as usize;
            if i >= self.last_access.len() {
                self.last_access.resize(i + 1, 0);
            }
            self.last_access[i] = now;
        }
    }

    /// Takes node `i` out of the cache. LARU keeps it as a ghost (the
    /// phase may need it; collections drop it); the others forget it.
    #[inline(always)]
    fn retire(&mut self, i: u32) -> Key {
        self.unlink(i);
        self.resident -= 1;
        let n = self.recency.node_mut(i);
        n.stamp = NOT_RESIDENT;
        let key = n.key;
        if !self.laru {
            self.index.remove(key, i);
            self.recency.release(i);
            if self.recent.is_some_and(|(k, _)| k == key) {
                self.recent = None;
            }
        }
        key
    }

    /// Line 16: every candidate gets a prediction of the current model. A
    /// stored prediction is reused when neither the model nor the key's
    /// history changed since it was made, so only keys requested since the
    /// last eviction (or all, after a new model) are predicted again.
    #[inline(never)]
    fn sync_predictions(&mut self, oracle: &mut dyn PredictOracle, now: u64) {
        let version = oracle.version(now);
        let keys: Vec<Key> = if self.synced_version != Some(version) {
            self.stale.clear();
            (self.recency.lru_first())
                .map(|i| self.recency.node(i).key)
                .collect()
        } else {
            std::mem::take(&mut self.stale)
        };
        self.synced_version = Some(version);
        let items: Vec<(u32, (Key, u64))> = keys
            .into_iter()
            .filter_map(|k| {
                let i = self.index.get(k, &self.recency)?;
                (self.recency.node(i).is_resident())
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

    /// Lines 10–12: an LRU eviction, and λ halves.
    #[inline(never)]
    fn evict_proven_wrong(&mut self, ctx: &EvictCtx<'_>) -> Option<Key> {
        let victim = self.lru_victim(ctx)?;
        self.halvings = self.halvings.saturating_add(1);
        self.lru_fallbacks += 1;
        // One halving per returning key, however many pages its miss needs.
        self.missing = HEAD;
        Some(self.retire(victim))
    }

    /// The cache forbids the chosen key now (pinned, inner radix node):
    /// the least-recent key it allows goes instead.
    #[cold]
    fn evict_forbidden(&mut self, ctx: &EvictCtx<'_>) -> Option<Key> {
        let victim = self.lru_victim(ctx)?;
        self.lru_fallbacks += 1;
        Some(self.retire(victim))
    }

    fn lru_victim(&mut self, ctx: &EvictCtx<'_>) -> Option<u32> {
        (self.recency.lru_first()).find(|&i| ctx.may_evict(self.recency.node(i).key))
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
        if self.distinct_in_phase >= self.phase_len {
            self.start_phase();
        }
        // A request's first lookup (`recent` rarely holds its key here); a
        // key LARU does not know gets a node (`access_new`).
        let Some(i) = self.index.get(key, &self.recency) else {
            if self.laru {
                return self.access_new(key, now);
            }
            self.missing = HEAD;
            return false;
        };
        self.recent = Some((key, i));
        let tag = self.tag;
        let n = self.recency.node_mut(i);
        // Branch-free: whether this is the key's first request in the phase
        // is data, not a pattern.
        self.distinct_in_phase += (n.seen_phase != tag) as usize;
        n.seen_phase = tag;
        if !n.is_resident() {
            return self.access_ghost(i, now);
        }
        // Leaves the window (if in it); re-enters, if still among the l
        // least recent, at the next eviction with its newest prediction.
        self.unlink(i);
        self.link_newest(i);
        self.missing = HEAD;
        if self.sync {
            self.note_sync_request(i, key, now);
        }
        true
    }

    fn insert(&mut self, key: Key, now: u64) {
        let i = match self.find(key) {
            Some(i) if self.recency.node(i).is_resident() => return,
            Some(i) => i,
            None => self.new_node(key),
        };
        if i == self.missing {
            self.missing = HEAD;
        }
        self.resident += 1;
        self.link_newest(i);
        if self.sync {
            self.note_sync_request(i, key, now);
        }
    }

    fn evict(&mut self, now: u64, ctx: &mut EvictCtx<'_>) -> Option<Key> {
        if self.resident == 0 {
            return None;
        }
        let tag = self.tag;
        // Line 10: the missing key was evicted by prediction in this phase.
        if self.laru && self.recency.node(self.missing).pred_evicted_phase == tag {
            return self.evict_proven_wrong(ctx);
        }
        if self.sync
            && let Some(oracle) = ctx.oracle.as_deref_mut()
        {
            self.sync_predictions(oracle, now);
        }
        // Lines 14–18: the candidate with the largest predicted next-access
        // time among the l least-recent keys.
        let l = self.candidates().min(self.resident);
        let best = if l == 1 {
            self.window.clear();
            self.recency.oldest()
        } else {
            self.window.best(&self.recency, l)
        };
        if ctx.evictable.is_some() && !ctx.may_evict(self.recency.node(best).key) {
            return self.evict_forbidden(ctx);
        }
        if self.laru {
            self.recency.node_mut(best).pred_evicted_phase = tag;
        }
        self.prediction_evictions += 1;
        Some(self.retire(best))
    }

    fn remove(&mut self, key: Key) -> bool {
        match self.find(key) {
            Some(i) if self.recency.node(i).is_resident() => {
                self.retire(i);
                true
            }
            _ => false,
        }
    }

    fn contains(&self, key: Key) -> bool {
        (self.index.get(key, &self.recency)).is_some_and(|i| self.recency.node(i).is_resident())
    }

    fn len(&self) -> usize {
        self.resident
    }

    fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
        if self.laru {
            self.phase_len = self.capacity;
        }
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
    use super::{GHOST_FLOOR, Mode, PredictiveLru, ghost_budget};
    use crate::eviction::{EvictCtx, EvictionPolicy};
    use rand::{RngExt, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    /// One request as the bench and the caches make it: access, make room,
    /// insert on a miss, then the Async prediction. Returns (hit, victim).
    fn request(
        p: &mut PredictiveLru,
        key: u64,
        now: u64,
        cap: usize,
        pred: f64,
    ) -> (bool, Option<u64>) {
        let hit = p.access(key, now);
        let mut victim = None;
        if !hit {
            if p.len() >= cap {
                victim = p.evict(now, &mut EvictCtx::default());
            }
            p.insert(key, now);
        }
        p.set_prediction(key, pred);
        (hit, victim)
    }

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
                let (hit, victim) = request(cache, key, now, cap, pred);
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
        wrapping.recency.stamp_limit = 40;
        replay_side_by_side(
            &mut PredictiveLru::new(Mode::LaruAsync, cap),
            &mut wrapping,
            cap,
        );
        assert!(wrapping.recency.stamp_limit == 40 && !wrapping.recency.stamps_exhausted());
    }

    #[test]
    fn a_miss_the_cache_never_inserts_counts_once_in_its_phase_and_anew_in_the_next() {
        let cap = 4;
        let mut p = PredictiveLru::new(Mode::LaruAsync, cap);
        // Key 99 misses and is never inserted (the cache bypassed it).
        assert!(!p.access(99, 0));
        assert!(
            p.index.get(99, &p.recency).is_some(),
            "kept for the phase's count"
        );
        for (now, key) in [(1, 1), (2, 2), (3, 99)] {
            if !p.access(key, now) && key != 99 {
                p.insert(key, now);
            }
        }
        assert_eq!(p.distinct_in_phase, 3, "99 counted once");
        assert_eq!(p.phase(), 1);
        p.access(3, 4);
        p.insert(3, 4);
        // The fifth distinct key starts phase 2; 99 is a new key in it.
        p.access(4, 5);
        assert_eq!(p.phase(), 2);
        assert_eq!(p.distinct_in_phase, 1);
        assert!(!p.access(99, 6), "still a miss");
        assert_eq!(p.distinct_in_phase, 2, "counted again in the new phase");
        assert_eq!(p.len(), 3);
        assert!((1..=3).all(|k| p.contains(k)));
        assert!(!p.contains(99));
    }

    #[test]
    fn ghosts_stay_bounded_by_the_capacity() {
        // Below the floor (the budget is GHOST_FLOOR) and above it (k + 64).
        for (cap, requests) in [(16, 50_000u64), (GHOST_FLOOR, 120_000)] {
            let mut p = PredictiveLru::new(Mode::LaruAsync, cap);
            let mut rng = ChaCha8Rng::seed_from_u64(11);
            let (mut most, mut collections) = (0, 0);
            let bound = 2 * cap + ghost_budget(cap);
            for now in 0..requests {
                // Mostly new keys: every eviction leaves a ghost behind.
                let key = rng.random_range(0..4 * bound as u64);
                let known = p.known_keys();
                request(&mut p, key, now, cap, now as f64 + 100.0);
                collections += (p.known_keys() < known) as u32;
                most = most.max(p.known_keys());
                assert_eq!(p.index.len(), p.known_keys(), "index and slab agree");
            }
            // Resident keys, the last phase's ghosts (at most k distinct
            // requests) and the ghosts kept from before it.
            assert!(most <= bound, "{most} nodes for a cache of {cap}");
            assert!(most > bound - cap, "the budget is used: {most} nodes");
            assert!(
                collections > 5,
                "{collections} collections for a cache of {cap}"
            );
            assert!(p.phase() > 40, "{} phases", p.phase());
        }
    }

    /// When the cache forbids every resident key, nothing is evicted and
    /// no LRU fallback is counted.
    #[test]
    fn an_eviction_with_every_key_forbidden_counts_no_fallback() {
        let cap = 2;
        let mut p = PredictiveLru::new(Mode::LaruAsync, cap);
        request(&mut p, 1, 0, cap, 10.0);
        request(&mut p, 2, 1, cap, 20.0);
        let none = |_k: u64| false;
        let mut ctx = EvictCtx {
            evictable: Some(&none),
            oracle: None,
        };
        assert_eq!(p.evict(2, &mut ctx), None);
        assert_eq!((p.eviction_counts(), p.len()), ((0, 0), 2));
    }

    #[test]
    fn only_a_return_within_the_phase_of_its_prediction_eviction_halves_lambda() {
        let cap = 2;
        let mut p = PredictiveLru::new(Mode::LaruAsync, cap);
        request(&mut p, 1, 0, cap, 1_000.0);
        request(&mut p, 2, 1, cap, 5.0);
        // The third distinct key starts phase 2; 1 is predicted furthest.
        assert_eq!(request(&mut p, 3, 2, cap, 6.0), (false, Some(1)));
        assert_eq!((p.phase(), p.eviction_counts()), (2, (1, 0)));
        // 1 returns in the same phase: line 10, LRU evicts 2, λ halves.
        assert_eq!(request(&mut p, 1, 3, cap, 100.0), (false, Some(2)));
        assert_eq!((p.eviction_counts(), p.lambda()), ((1, 1), 0.5));
        // Phase 3 resets λ; 1 goes by prediction again.
        assert_eq!(request(&mut p, 4, 4, cap, 7.0), (false, Some(1)));
        assert_eq!((p.phase(), p.lambda()), (3, 1.0));
        // 2 was evicted by LRU, not by prediction: no halving for it.
        assert_eq!(request(&mut p, 2, 5, cap, 8.0), (false, Some(4)));
        assert_eq!((p.eviction_counts(), p.lambda()), ((3, 1), 1.0));
    }
}
