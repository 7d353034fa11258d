//! LRU guided by predicted next-access times: LARU (LCR Alg. 1, Sync and
//! Async), FPB (evict the largest prediction among all resident keys) and HF
//! (LRU pre-filters the 4 least-recent keys, the prediction picks).
//!
//! A key without a prediction ranks lowest; ties go to the least recent, so
//! with no predictions at all every mode is LRU.

use super::segtree::RecencyTree;
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
const NOT_RESIDENT: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct Meta {
    slot: u32,
    pred: f64,
    last_access: u64,
    /// Phase in which the key was last requested.
    seen_phase: u64,
    /// Phase in which the key was last evicted by prediction (Alg. 1 line 18).
    pred_evicted_phase: u64,
}

/// LARU / FPB / HF over one cache.
#[derive(Debug)]
pub struct PredictiveLru {
    mode: Mode,
    /// k: the cache's capacity in keys.
    capacity: usize,
    meta: KeyMap<Key, Meta>,
    order: RecencyTree,
    /// Current phase (LARU), from 1.
    phase: u64,
    distinct_in_phase: usize,
    /// Confidence λ.
    lambda: f64,
    /// Non-resident keys whose metadata lives until the phase ends.
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
            meta: key_map(),
            order: RecencyTree::new(capacity.saturating_mul(2)),
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
            Mode::Fpb => self.order.len(),
            Mode::Hf => HF_CANDIDATES,
        }
    }

    fn push_slot(&mut self, key: Key, pred: f64) -> u32 {
        if self.order.full() {
            let meta = &mut self.meta;
            self.order
                .compact(|k, s| meta.get_mut(&k).expect("live slot has meta").slot = s);
        }
        self.order.push(key, pred)
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
            if self.meta.get(&key).is_some_and(|m| m.slot == NOT_RESIDENT) {
                self.meta.remove(&key);
            }
        }
    }

    /// Forget a key that just left the cache; metadata a phase still needs
    /// (requested or prediction-evicted in it) stays until the phase ends.
    fn retire(&mut self, key: Key) {
        let phase = self.phase;
        let laru = self.is_laru();
        let m = self.meta.get_mut(&key).expect("resident key has meta");
        self.order.clear(m.slot);
        m.slot = NOT_RESIDENT;
        if laru && (m.seen_phase == phase || m.pred_evicted_phase == phase) {
            self.phase_keys.push(key);
        } else {
            self.meta.remove(&key);
        }
    }

    /// Line 16: every candidate gets a prediction of the current model. A
    /// stored prediction is reused when neither the model nor the key's
    /// history changed since it was made, so only keys requested since the
    /// last eviction (or all, after a new model) are predicted again.
    fn sync_predictions(&mut self, oracle: &mut dyn PredictOracle, now: u64) {
        let version = oracle.version(now);
        let keys: Vec<Key> = if self.synced_version != Some(version) {
            self.stale.clear();
            self.order.slots().map(|s| self.order.key(s)).collect()
        } else {
            std::mem::take(&mut self.stale)
        };
        self.synced_version = Some(version);
        let items: Vec<(Key, u64)> = keys
            .into_iter()
            .filter_map(|k| {
                self.meta
                    .get(&k)
                    .filter(|m| m.slot != NOT_RESIDENT)
                    .map(|m| (k, m.last_access))
            })
            .collect();
        let mut preds = Vec::with_capacity(items.len());
        oracle.predict(&items, now, &mut preds);
        for (&(key, _), &p) in items.iter().zip(&preds) {
            let m = self.meta.get_mut(&key).expect("filtered resident");
            m.pred = p;
            self.order.set_prediction(m.slot, p);
        }
    }

    fn lru_victim(&mut self, ctx: &EvictCtx<'_>) -> Option<Key> {
        (1..=self.order.len())
            .map(|i| self.order.key(self.order.kth(i)))
            .find(|&k| ctx.may_evict(k))
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
        let m = self.meta.entry(key).or_insert(Meta {
            slot: NOT_RESIDENT,
            pred: f64::NEG_INFINITY,
            last_access: now,
            seen_phase: 0,
            pred_evicted_phase: 0,
        });
        if m.seen_phase != phase {
            m.seen_phase = phase;
            self.distinct_in_phase += 1;
        }
        m.last_access = now;
        let (slot, pred) = (m.slot, m.pred);
        if slot == NOT_RESIDENT {
            if laru && m.pred_evicted_phase != phase {
                // Kept only for the phase count; dropped when the phase ends.
                self.phase_keys.push(key);
            } else if !laru {
                self.meta.remove(&key);
            }
            self.missing = Some(key);
            return false;
        }
        self.order.clear(slot);
        let new_slot = self.push_slot(key, pred);
        self.meta.get_mut(&key).expect("just seen").slot = new_slot;
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
        let m = *self.meta.entry(key).or_insert(Meta {
            slot: NOT_RESIDENT,
            pred: f64::NEG_INFINITY,
            last_access: now,
            seen_phase: 0,
            pred_evicted_phase: 0,
        });
        if m.slot != NOT_RESIDENT {
            return;
        }
        let slot = self.push_slot(key, m.pred);
        let m = self.meta.get_mut(&key).expect("inserted above");
        m.slot = slot;
        m.last_access = now;
        if self.mode == Mode::LaruSync {
            self.stale.push(key);
        }
    }

    fn evict(&mut self, now: u64, ctx: &mut EvictCtx<'_>) -> Option<Key> {
        let len = self.order.len();
        if len == 0 {
            return None;
        }
        let phase = self.phase;
        // Line 10: the missing key was evicted by prediction in this phase.
        let proven_wrong = self.is_laru()
            && self
                .missing
                .and_then(|k| self.meta.get(&k))
                .is_some_and(|m| m.pred_evicted_phase == phase);
        if proven_wrong {
            let victim = self.lru_victim(ctx)?;
            self.retire(victim);
            self.lambda /= 2.0;
            self.lru_fallbacks += 1;
            // One halving per returning key, however many pages its miss needs.
            self.missing = None;
            return Some(victim);
        }
        let l = self.candidates().min(len);
        let last = self.order.kth(l);
        if self.mode == Mode::LaruSync
            && let Some(oracle) = ctx.oracle.as_deref_mut()
        {
            self.sync_predictions(oracle, now);
        }
        // Line 18: the candidate with the largest predicted next-access time.
        let (_, slot) = self.order.max_upto(last);
        let mut victim = self.order.key(slot);
        if ctx.may_evict(victim) {
            if self.is_laru() {
                self.meta
                    .get_mut(&victim)
                    .expect("resident")
                    .pred_evicted_phase = phase;
            }
            self.prediction_evictions += 1;
        } else {
            // The cache forbids this key now (pinned, inner radix node).
            victim = self.lru_victim(ctx)?;
            self.lru_fallbacks += 1;
        }
        self.retire(victim);
        Some(victim)
    }

    fn remove(&mut self, key: Key) -> bool {
        if !self.contains(key) {
            return false;
        }
        self.retire(key);
        true
    }

    fn contains(&self, key: Key) -> bool {
        self.meta.get(&key).is_some_and(|m| m.slot != NOT_RESIDENT)
    }

    fn len(&self) -> usize {
        self.order.len()
    }

    fn set_capacity(&mut self, capacity: usize) {
        self.capacity = capacity.max(1);
    }

    fn set_prediction(&mut self, key: Key, next_access: f64) {
        if let Some(m) = self.meta.get_mut(&key) {
            m.pred = next_access;
            if m.slot != NOT_RESIDENT {
                self.order.set_prediction(m.slot, next_access);
            }
        }
    }

    fn uses_predictions(&self) -> bool {
        true
    }
}
