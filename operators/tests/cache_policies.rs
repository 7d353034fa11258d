//! Eviction policies against independent references: a deliberately simple
//! LRU, a naive Belady, LARU's phase/λ logic on hand-built sequences, and
//! LARU's 1-consistency (perfect predictions ⇒ misses equal OPT's).

use std::collections::VecDeque;
use std::sync::Arc;

use grflow_operators::cachebench::{self, BenchConfig};
use grflow_operators::eviction::{
    Belady, EvictCtx, EvictionPolicy, Key, Lru, Mode, PolicyName, PredictiveLru, next_use_times,
};
use proptest::prelude::*;

/// Reference LRU: a VecDeque, most recent at the back, linear search.
fn reference_lru_hits(keys: &[Key], cap: usize) -> u64 {
    let mut q: VecDeque<Key> = VecDeque::new();
    let mut hits = 0;
    for &k in keys {
        if let Some(i) = q.iter().position(|&x| x == k) {
            hits += 1;
            q.remove(i);
        } else if cap > 0 && q.len() == cap {
            q.pop_front();
        }
        if cap > 0 {
            q.push_back(k);
        }
    }
    hits
}

/// Reference Belady: on a miss with a full cache, scan the future.
fn reference_opt_hits(keys: &[Key], cap: usize) -> u64 {
    let mut cache: Vec<Key> = Vec::new();
    let mut hits = 0;
    for (t, &k) in keys.iter().enumerate() {
        if cache.contains(&k) {
            hits += 1;
            continue;
        }
        if cap == 0 {
            continue;
        }
        if cache.len() == cap {
            let next = |c: Key| {
                keys[t + 1..]
                    .iter()
                    .position(|&x| x == c)
                    .unwrap_or(usize::MAX)
            };
            let (i, _) = cache
                .iter()
                .enumerate()
                .max_by_key(|(_, c)| next(**c))
                .expect("full");
            cache.swap_remove(i);
        }
        cache.push(k);
    }
    hits
}

/// Replays through a policy; `pred` gives the Async prediction after request t.
fn replay(policy: &mut dyn EvictionPolicy, keys: &[Key], cap: usize, pred: Option<&[f64]>) -> u64 {
    let mut hits = 0;
    for (t, &k) in keys.iter().enumerate() {
        let now = t as u64;
        if policy.access(k, now) {
            hits += 1;
        } else if cap > 0 {
            if policy.len() >= cap {
                policy.evict(now, &mut EvictCtx::default()).expect("victim");
            }
            policy.insert(k, now);
        }
        if let Some(p) = pred {
            policy.set_prediction(k, p[t]);
        }
    }
    hits
}

fn synthetic_keys() -> Vec<Key> {
    include_str!("data/synthetic_keys.txt")
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| l.parse().expect("key"))
        .collect()
}

fn perfect(keys: &[Key]) -> Vec<f64> {
    next_use_times(keys)
        .into_iter()
        .map(|n| if n == u64::MAX { f64::MAX } else { n as f64 })
        .collect()
}

#[test]
fn synthetic_trace_has_known_counts() {
    let keys = synthetic_keys();
    assert_eq!(keys.len(), 3000);
    // Three rounds: repeated replays keep the rows, their order and counts.
    let cfg = BenchConfig {
        policies: vec![PolicyName::Lru, PolicyName::Opt],
        repeat: 3,
        ..BenchConfig::default()
    };
    let rows = cachebench::run("synthetic", keys.clone(), &cfg);
    let got: Vec<(String, usize, u64)> = rows
        .iter()
        .map(|r| (r.policy.clone(), r.capacity, r.hits))
        .collect();
    for (policy, cap, hits) in &got {
        let reference = if policy == "lru" {
            reference_lru_hits(&keys, *cap)
        } else {
            reference_opt_hits(&keys, *cap)
        };
        assert_eq!(*hits, reference, "{policy} at capacity {cap}");
    }
    // Pinned so that a change in the bench convention shows up here.
    let pinned: Vec<(String, usize, u64)> = KNOWN
        .iter()
        .map(|&(p, c, h)| (p.to_string(), c, h))
        .collect();
    assert_eq!(got, pinned);
}

const KNOWN: [(&str, usize, u64); 6] = [
    ("lru", 22, 401),
    ("lru", 44, 630),
    ("lru", 88, 945),
    ("opt", 22, 1070),
    ("opt", 44, 1370),
    ("opt", 88, 1732),
];

#[test]
fn laru_phases_and_confidence_follow_alg1() {
    // k = 4. Phase 1: a b c d. e starts phase 2 and evicts by prediction
    // over all 4 (l = k): d has the largest prediction.
    let (a, b, c, d, e, f) = (1, 2, 3, 4, 5, 6);
    let mut p = PredictiveLru::new(Mode::LaruAsync, 4);
    for (t, k) in [a, b, c, d].into_iter().enumerate() {
        assert!(!p.access(k, t as u64));
        p.insert(k, t as u64);
    }
    for (k, pred) in [(a, 10.0), (b, 10.0), (c, 10.0), (d, 100.0)] {
        p.set_prediction(k, pred);
    }
    assert_eq!(p.phase(), 1);
    assert!(!p.access(e, 4));
    assert_eq!(p.phase(), 2);
    assert_eq!(p.evict(4, &mut EvictCtx::default()), Some(d));
    p.insert(e, 4);
    p.set_prediction(e, 1000.0);
    // d comes back in the same phase: proven wrong, LRU evicts a, λ halves.
    assert!(!p.access(d, 5));
    assert_eq!(p.evict(5, &mut EvictCtx::default()), Some(a));
    assert_eq!(p.lambda(), 0.5);
    p.insert(d, 5);
    // f: l = ⌊0.5 · 4⌋ = 2 candidates (b, c); e's larger prediction is
    // outside the candidate set, so c goes.
    p.set_prediction(c, 50.0);
    assert!(!p.access(f, 6));
    assert_eq!(p.phase(), 2, "only 3 distinct (e, d, f) so far");
    assert_eq!(p.evict(6, &mut EvictCtx::default()), Some(c));
    p.insert(f, 6);
    assert_eq!(p.eviction_counts(), (2, 1));
    // A 4th distinct key (b) fills phase 2; the next request starts phase 3.
    assert!(p.access(b, 7));
    assert_eq!(p.phase(), 2);
    assert!(p.access(e, 8));
    assert_eq!((p.phase(), p.lambda()), (3, 1.0));
}

#[test]
fn without_predictions_every_predictive_mode_is_lru() {
    let keys = synthetic_keys();
    for cap in [1, 7, 60] {
        let lru = reference_lru_hits(&keys, cap);
        for mode in [Mode::LaruAsync, Mode::Fpb, Mode::Hf] {
            let mut p = PredictiveLru::new(mode, cap);
            assert_eq!(replay(&mut p, &keys, cap, None), lru, "{mode:?} cap {cap}");
        }
    }
}

/// Keys the predictor could not say anything about (learned before the
/// first model) go first, least recent first; they must not outlive keys
/// whose predictions say they come back.
#[test]
fn keys_without_a_prediction_are_evicted_first() {
    let mut p = PredictiveLru::new(Mode::Fpb, 4);
    let mut ctx = EvictCtx::default();
    for (t, (key, pred)) in [(1, 50.0), (2, f64::NEG_INFINITY), (3, 9.0), (4, f64::NAN)]
        .into_iter()
        .enumerate()
    {
        assert!(!p.access(key, t as u64));
        p.insert(key, t as u64);
        p.set_prediction(key, pred);
    }
    assert_eq!(p.evict(4, &mut ctx), Some(2));
    assert_eq!(p.evict(4, &mut ctx), Some(4));
    assert_eq!(p.evict(4, &mut ctx), Some(1), "then the largest prediction");
}

#[test]
fn belady_matches_reference_on_synthetic_trace() {
    let keys = synthetic_keys();
    for cap in [1, 5, 33, 120] {
        let mut opt = Belady::new(Arc::from(next_use_times(&keys)));
        assert_eq!(
            replay(&mut opt, &keys, cap, None),
            reference_opt_hits(&keys, cap)
        );
    }
}

/// Reference LARU / FPB / HF (LCR Alg. 1 read literally): resident keys in
/// a Vec, least recent first, candidates scanned linearly.
struct NaivePredictive {
    mode: Mode,
    k: usize,
    order: Vec<Key>,
    pred: std::collections::HashMap<Key, f64>,
    seen: std::collections::HashMap<Key, u64>,
    pred_evicted: std::collections::HashMap<Key, u64>,
    phase: u64,
    distinct: usize,
    lambda: f64,
}

impl NaivePredictive {
    fn new(mode: Mode, k: usize) -> Self {
        Self {
            mode,
            k,
            order: Vec::new(),
            pred: Default::default(),
            seen: Default::default(),
            pred_evicted: Default::default(),
            phase: 1,
            distinct: 0,
            lambda: 1.0,
        }
    }

    fn laru(&self) -> bool {
        matches!(self.mode, Mode::LaruAsync)
    }

    /// One request with its prediction; returns (hit, evicted key).
    fn request(&mut self, key: Key, pred: f64) -> (bool, Option<Key>) {
        if self.laru() && self.distinct == self.k {
            self.phase += 1;
            self.lambda = 1.0;
            self.distinct = 0;
        }
        if self.seen.insert(key, self.phase) != Some(self.phase) {
            self.distinct += 1;
        }
        let mut out = (false, None);
        if let Some(i) = self.order.iter().position(|&x| x == key) {
            self.order.remove(i);
            out.0 = true;
        } else if self.order.len() == self.k {
            let victim = if self.laru() && self.pred_evicted.get(&key) == Some(&self.phase) {
                self.lambda /= 2.0;
                0
            } else {
                let l = match self.mode {
                    Mode::Fpb => self.order.len(),
                    Mode::Hf => 4,
                    _ => ((self.lambda * self.k as f64).floor() as usize).max(1),
                }
                .min(self.order.len());
                let rank = |x: &Key| {
                    // No prediction ranks highest (evicted first).
                    let p = self.pred.get(x).copied().unwrap_or(f64::INFINITY);
                    if p.is_nan() || p == f64::NEG_INFINITY {
                        f64::INFINITY
                    } else {
                        p
                    }
                };
                let mut best = 0;
                for i in 1..l {
                    if rank(&self.order[i]) > rank(&self.order[best]) {
                        best = i;
                    }
                }
                if self.laru() {
                    self.pred_evicted.insert(self.order[best], self.phase);
                }
                best
            };
            out.1 = Some(self.order.remove(victim));
        }
        self.order.push(key);
        self.pred.insert(key, pred);
        out
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn lru_equals_reference(keys in prop::collection::vec(0u64..40, 0..400), cap in 0usize..30) {
        let mut lru = Lru::new();
        prop_assert_eq!(replay(&mut lru, &keys, cap, None), reference_lru_hits(&keys, cap));
    }

    /// 1-consistency (LCR Thm. 1): perfect predictions ⇒ LARU misses = OPT's.
    #[test]
    fn laru_with_perfect_predictions_is_opt(keys in prop::collection::vec(0u64..30, 1..400), cap in 1usize..20) {
        let pred = perfect(&keys);
        let opt = reference_opt_hits(&keys, cap);
        let mut laru = PredictiveLru::new(Mode::LaruAsync, cap);
        prop_assert_eq!(replay(&mut laru, &keys, cap, Some(&pred)), opt);
        prop_assert_eq!(laru.eviction_counts().1, 0, "no prediction is ever proven wrong");
        let mut fpb = PredictiveLru::new(Mode::Fpb, cap);
        prop_assert_eq!(replay(&mut fpb, &keys, cap, Some(&pred)), opt);
    }
    /// The log-heap-and-window LARU / FPB / HF choose exactly the
    /// reference's victims under arbitrary (tied, NaN, wrong) predictions,
    /// including predictions for keys other than the one requested (Sync
    /// mode's re-predictions take that path).
    #[test]
    fn predictive_modes_match_the_naive_reference(
        reqs in prop::collection::vec((0u64..40, prediction(), prop::option::weighted(0.3, (0u64..40, prediction()))), 1..500),
        cap in 1usize..24,
    ) {
        check_against_naive(&reqs, cap)?;
    }

    /// The same at sizes where the log compacts many times and a new phase
    /// regrows the window by a bulk heap rebuild.
    #[test]
    fn predictive_modes_match_the_naive_reference_at_scale(
        reqs in prop::collection::vec((0u64..600, prediction(), prop::option::weighted(0.1, (0u64..600, prediction()))), 2000..4000),
        cap in 150usize..400,
    ) {
        check_against_naive(&reqs, cap)?;
    }
}

fn prediction() -> impl Strategy<Value = f64> {
    prop_oneof![
        8 => (0i32..12).prop_map(|p| p as f64),
        1 => Just(f64::NAN),
        1 => Just(f64::NEG_INFINITY),
    ]
}

type Request = (Key, f64, Option<(Key, f64)>);

fn check_against_naive(reqs: &[Request], cap: usize) -> Result<(), TestCaseError> {
    for mode in [Mode::LaruAsync, Mode::Fpb, Mode::Hf] {
        let mut fast = PredictiveLru::new(mode, cap);
        let mut naive = NaivePredictive::new(mode, cap);
        for (t, &(key, pred, other)) in reqs.iter().enumerate() {
            let now = t as u64;
            let (hit, victim) = naive.request(key, pred);
            prop_assert_eq!(fast.access(key, now), hit, "{:?} request {}", mode, t);
            if !hit {
                let evicted = if fast.len() >= cap {
                    fast.evict(now, &mut EvictCtx::default())
                } else {
                    None
                };
                prop_assert_eq!(evicted, victim, "{:?} request {}", mode, t);
                fast.insert(key, now);
            }
            fast.set_prediction(key, pred);
            if let Some((other, p)) = other {
                fast.set_prediction(other, p);
                naive.pred.insert(other, p);
            }
        }
        if mode == Mode::LaruAsync {
            prop_assert_eq!((fast.phase(), fast.lambda()), (naive.phase, naive.lambda));
        }
    }
    Ok(())
}
