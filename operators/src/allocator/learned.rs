//! The learned policies' decision loop (HLEM §IV-A, Eq. 6): the frozen PPO
//! policy's move, plus (in `smart`) the residual adapter's correction, or
//! the recovery controller's override during a burst. In training
//! (`sample`) the PPO action is sampled instead of taken greedily and each
//! decision is recorded with the reward of the window after it.

use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::adapter::Adapter;
use super::mdp::{ACTIONS, State, controller_p99_ms, reward};
use super::ppo::{ActorCritic, Decider, Step};
use super::recovery::{Recovery, Verdict};
use crate::windows::WindowStats;

/// σ floor of the recovery controller, as a share of the SLO.
const RECOVERY_MIN_SIGMA: f64 = 0.02;

#[derive(Clone, Debug)]
pub struct Learned {
    policy: Arc<ActorCritic>,
    /// The policy's decision network (f32).
    decider: Decider,
    max_positions: usize,
    slo_ms: f64,
    adapter: Option<Adapter>,
    recovery: Option<Recovery>,
    /// Training: sample actions with this generator and record them.
    sampler: Option<ChaCha8Rng>,
    /// The last recorded decision, waiting for the next window's reward.
    pending: Option<Step>,
    /// Decisions whose reward is known, oldest first.
    finished: Vec<Step>,
    /// The last decision's move without the adapter's correction, and the
    /// correction, while the allocator has not said what it sent.
    corrected: Option<(f64, f64)>,
    /// Epochs the recovery controller overrode.
    pub overrides: u64,
}

impl Learned {
    /// `smart`: with the adapter and the recovery controller; `sample`:
    /// training (sampled actions, recorded). `seed` makes both random parts
    /// reproducible.
    pub fn new(
        policy: Arc<ActorCritic>,
        max_positions: usize,
        slo_ms: f64,
        smart: bool,
        sample: bool,
        seed: u64,
    ) -> Self {
        // Warm-up at load, as a server warms a model: one forward of each
        // network, results dropped (no state changes), so the first
        // window's decision does not pay for first touches of the weights.
        let decider = policy.decider();
        std::hint::black_box(decider.greedy(std::hint::black_box(&[0.0; 7]), true));
        let adapter = smart.then(|| Adapter::new(seed, true));
        if let Some(a) = &adapter {
            a.warm_up();
        }
        Self {
            policy,
            decider,
            max_positions,
            slo_ms: slo_ms.max(1e-9),
            adapter,
            recovery: smart.then(|| Recovery::new(RECOVERY_MIN_SIGMA * slo_ms)),
            sampler: sample.then(|| ChaCha8Rng::seed_from_u64(seed)),
            pending: None,
            finished: Vec::new(),
            corrected: None,
            overrides: 0,
        }
    }

    /// The same, with the adapter's exploration off: a zero-initialised
    /// `smart` then decides as `ppo-only` (a test's comparison; serving
    /// explores, or the adapter could not learn).
    pub fn without_exploration(mut self) -> Self {
        if let Some(a) = &mut self.adapter {
            a.stop_exploring();
        }
        self
    }

    /// The adapter's updates on a thread of their own (`arrival` release:
    /// off the serving worker; not reproducible).
    pub fn train_off_path(mut self) -> Self {
        self.adapter = self.adapter.map(Adapter::train_off_path);
        self
    }

    /// The move of α after closed window `w`, for a node at `alpha` now.
    pub fn decide(&mut self, w: &WindowStats, alpha: f64) -> f64 {
        self.corrected = None;
        let r = reward(w, self.slo_ms);
        if let Some(mut step) = self.pending.take() {
            step.reward = r;
            self.finished.push(step);
        }
        // Failures count against the p99 (a window of them has none).
        let p99_ms = controller_p99_ms(w, self.slo_ms);
        if let Some(a) = &mut self.adapter {
            a.reward(r, p99_ms, self.slo_ms);
        }
        let state = State::of(w, alpha, self.max_positions, self.slo_ms);
        if let Some(rc) = &mut self.recovery
            && let Verdict::Override(step) = rc.observe(p99_ms, w.hot_user_share)
        {
            self.overrides += 1;
            return step;
        }
        // Histories were cut: the KV share is too small already, so α
        // must not grow (the policy's moves toward EMB are masked).
        let allow_up = w.truncated_share <= 0.0;
        let base = match &mut self.sampler {
            Some(rng) => {
                let (action, logp, value) = self.policy.sample(&state.0, allow_up, rng);
                self.pending = Some(Step {
                    state: state.0,
                    action,
                    logp,
                    value,
                    reward: 0.0,
                    allow_up,
                });
                ACTIONS[action]
            }
            None => ACTIONS[self.decider.greedy(&state.0, allow_up)],
        };
        let mask = |step: f64| if allow_up { step } else { step.min(0.0) };
        let Some(a) = &mut self.adapter else {
            return mask(base);
        };
        let correction = a.correct(&state);
        self.corrected = Some((mask(base), correction));
        mask(base + correction)
    }

    /// The last decision's move without the adapter's correction (None:
    /// no correction was made).
    pub fn uncorrected(&self) -> Option<f64> {
        self.corrected.map(|(base, _)| base)
    }

    /// What the last decision's correction changed in the α sent: `share`
    /// is the α sent minus the α the uncorrected move would have sent
    /// (each the node's α when nothing is sent). The adapter learns from
    /// that, kept within its correction's range.
    pub fn realised(&mut self, share: f64) {
        if let (Some((_, c)), Some(a)) = (self.corrected.take(), &mut self.adapter) {
            a.realised(share.clamp(c.min(0.0), c.max(0.0)));
        }
    }

    /// The window gets no decision (too few requests, α pinned): the
    /// adapter's correction waiting for its reward is dropped, so a later
    /// window's reward is not credited to it. The training step is kept:
    /// α holds over a skipped window, so the next decided window still
    /// serves at the α that step chose, and its reward judges the step (a
    /// step lasting two windows, as in a semi-Markov decision process;
    /// dropping it would lose ~3% of allocator-tight's decisions).
    pub fn skip(&mut self) {
        self.corrected = None;
        if let Some(a) = &mut self.adapter {
            a.forget();
        }
    }

    /// Learning that waits until the decision is out (the adapter's update).
    pub fn learn(&mut self) {
        if let Some(a) = &mut self.adapter {
            a.train();
        }
    }

    #[cfg(test)]
    pub(crate) fn adapter(&self) -> Option<&Adapter> {
        self.adapter.as_ref()
    }

    /// Recorded decisions with their rewards (taken: the caller owns them).
    pub fn take_steps(&mut self) -> Vec<Step> {
        std::mem::take(&mut self.finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocator::adapter::BOUND;
    use crate::allocator::{Allocator, AllocatorConfig, AllocatorPolicy};

    fn window(p99_ms: f64) -> WindowStats {
        WindowStats {
            requests: 100,
            failed: 0,
            hot_user_share: 0.5,
            emb_hit_rate: 0.8,
            kv_hit_rate: 0.5,
            mean_seq_len: 256.0,
            slo_violation_share: 0.0,
            p99_ms,
            alpha: 0.4,
            truncated_share: 0.0,
            alpha_end: None,
            pinned_end: false,
            p99_scaled_ms: None,
        }
    }

    #[test]
    fn a_fresh_policy_holds_alpha_and_records_nothing_unless_training() {
        let policy = Arc::new(ActorCritic::new(1));
        let mut ppo = Learned::new(policy, 1024, 30.0, false, false, 7);
        for _ in 0..5 {
            assert_eq!(ppo.decide(&window(20.0), 0.4), 0.0);
        }
        assert!(
            ppo.take_steps().is_empty(),
            "nothing recorded unless training"
        );
    }

    /// The shipped policy (it moves α) and the SLO it was trained for.
    fn shipped() -> (Arc<ActorCritic>, f64) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../configs/allocator-ppo.safetensors");
        let p = ActorCritic::from_safetensors(&std::fs::read(path).unwrap()).unwrap();
        let slo_ms = p.provenance.slo_ms.unwrap_or(30.0);
        (Arc::new(p), slo_ms)
    }

    /// Windows that move the policy both ways: p99 from a third of the
    /// SLO to twice it, varied hit rates; the hot-user share stays at the
    /// burst threshold, so the recovery controller never overrides.
    fn varied(slo_ms: f64) -> Vec<WindowStats> {
        (0..80)
            .map(|i| WindowStats {
                hot_user_share: 0.2,
                kv_hit_rate: 0.2 + 0.1 * (i % 6) as f64,
                emb_hit_rate: 0.9 - 0.1 * (i % 5) as f64,
                p99_ms: slo_ms * (0.3 + 0.15 * ((i * 7) % 12) as f64),
                ..window(0.0)
            })
            .collect()
    }

    #[test]
    fn smart_without_exploration_sends_the_alphas_ppo_only_sends_until_it_learns() {
        // With the default step, and with one under the policy's largest
        // action (which both must cut to the same bound).
        for max_step in [AllocatorConfig::default().max_step, 0.02] {
            smart_moves_as_ppo_only(max_step);
        }
    }

    fn smart_moves_as_ppo_only(max_step: f64) {
        let (policy, slo_ms) = shipped();
        let allocator = |policy_kind, learned| {
            let cfg = AllocatorConfig {
                policy: policy_kind,
                min_requests: 1,
                max_step,
                ..Default::default()
            };
            Allocator::with_learned(cfg, slo_ms, 0.5, learned).with_pool_pages(1024)
        };
        let mut ppo = allocator(
            AllocatorPolicy::PpoOnly,
            Learned::new(policy.clone(), 1024, slo_ms, false, false, 7),
        );
        let learned = Learned::new(policy, 1024, slo_ms, true, false, 7);
        let mut smart = allocator(AllocatorPolicy::Smart, learned.without_exploration());
        let mut moves = 0;
        for (i, w) in varied(slo_ms).iter().enumerate() {
            // Bit for bit, the same α sent (or none) from the same windows.
            let (a, b) = (ppo.decide(w), smart.decide(w));
            assert_eq!(
                a.map(f64::to_bits),
                b.map(f64::to_bits),
                "max_step {max_step}, window {i}"
            );
            moves += usize::from(a.is_some());
            ppo.learn();
            smart.learn();
        }
        assert!(moves >= 10, "the policy moved α only {moves} times");
        let l = smart.learned.as_ref().unwrap();
        assert_eq!(l.overrides, 0, "the recovery controller stayed out");
        // Its updates ran (a full buffer, p99 varying) but changed nothing:
        // without exploration every applied correction is its mean.
        assert_eq!(l.adapter().unwrap().buffered(), 79);
    }

    #[test]
    fn smart_exploring_stays_within_the_adapters_bound_of_ppo_only() {
        let (policy, slo_ms) = shipped();
        let mut ppo = Learned::new(policy.clone(), 1024, slo_ms, false, false, 7);
        let mut smart = Learned::new(policy, 1024, slo_ms, true, false, 7);
        let mut differ = 0;
        for (i, w) in varied(slo_ms).iter().enumerate() {
            let alpha = 0.2 + 0.05 * (i % 12) as f64;
            let (a, b) = (ppo.decide(w, alpha), smart.decide(w, alpha));
            assert!((a - b).abs() <= BOUND + 1e-12, "window {i}: {a} vs {b}");
            differ += usize::from(a != b);
            smart.learn();
        }
        assert_eq!(smart.overrides, 0);
        // Exploration moves nearly every decision off the policy's.
        assert!(differ >= 60, "only {differ} decisions differ");
    }

    #[test]
    fn training_records_each_decision_with_the_next_windows_reward() {
        let policy = Arc::new(ActorCritic::new(1));
        let mut t = Learned::new(policy, 1024, 30.0, false, true, 3);
        let moves: Vec<f64> = [20.0, 45.0, 20.0]
            .iter()
            .map(|&p| t.decide(&window(p), 0.4))
            .collect();
        let steps = t.take_steps();
        assert_eq!(steps.len(), 2, "the last decision waits for its reward");
        assert_eq!(ACTIONS[steps[0].action], moves[0]);
        // The window after the first decision had p99 45 against 30.
        assert!((steps[0].reward - 0.5).abs() < 1e-12);
        assert!((steps[1].reward - 1.0).abs() < 1e-12);
        assert!((steps[0].logp - (1.0f64 / 7.0).ln()).abs() < 1e-12);
    }

    #[test]
    fn a_decision_whose_next_window_is_skipped_is_judged_by_the_next_decided_one() {
        let policy = Arc::new(ActorCritic::new(1));
        let mut t = Learned::new(policy, 1024, 30.0, false, true, 3);
        t.decide(&window(20.0), 0.4);
        // The window after it was too small to decide on; α held.
        t.skip();
        t.decide(&window(45.0), 0.4);
        let steps = t.take_steps();
        assert_eq!(steps.len(), 1, "{steps:?}");
        assert!((steps[0].reward - 0.5).abs() < 1e-12, "{steps:?}");
    }

    #[test]
    fn smart_hands_a_burst_to_the_recovery_controller() {
        let policy = Arc::new(ActorCritic::new(1));
        let mut smart = Learned::new(policy, 1024, 30.0, true, false, 7);
        for i in 0..10 {
            smart.decide(&window(20.0 + (i % 2) as f64), 0.5);
        }
        assert_eq!(smart.decide(&window(80.0), 0.5), -0.06);
        assert_eq!(smart.overrides, 1);
    }

    #[test]
    fn a_window_of_failed_requests_is_a_burst_not_a_fast_epoch() {
        let policy = Arc::new(ActorCritic::new(1));
        let mut smart = Learned::new(policy, 1024, 30.0, true, false, 7);
        for i in 0..10 {
            smart.decide(&window(20.0 + (i % 2) as f64), 0.5);
        }
        // Every request shed: no served p99 (0), which read as the best.
        let shed = WindowStats {
            failed: 100,
            slo_violation_share: 1.0,
            ..window(0.0)
        };
        assert_eq!(smart.decide(&shed, 0.5), -0.06);
        assert_eq!(smart.overrides, 1);
    }

    #[test]
    fn alpha_never_grows_while_histories_are_truncated() {
        let policy = Arc::new(ActorCritic::new(1));
        let cut = WindowStats {
            truncated_share: 0.1,
            ..window(20.0)
        };
        for smart in [false, true] {
            let mut l = Learned::new(policy.clone(), 1024, 30.0, smart, true, 11);
            for _ in 0..50 {
                assert!(l.decide(&cut, 0.6) <= 0.0);
            }
            assert!(
                l.take_steps()
                    .iter()
                    .all(|s| !s.allow_up && ACTIONS[s.action] <= 0.0)
            );
        }
    }
}
