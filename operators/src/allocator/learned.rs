//! The learned policies' decision loop (HLEM §IV-A, Eq. 6): the frozen PPO
//! policy's move, plus (in `smart`) the residual adapter's correction, or
//! the recovery controller's override during a burst. In training
//! (`sample`) the PPO action is sampled instead of taken greedily and each
//! decision is recorded with the reward of the window after it.

use std::sync::Arc;

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::adapter::Adapter;
use super::mdp::{ACTIONS, State, reward};
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
            overrides: 0,
        }
    }

    /// The move of α after closed window `w`, for a node at `alpha` now.
    pub fn decide(&mut self, w: &WindowStats, alpha: f64) -> f64 {
        let r = reward(w, self.slo_ms);
        if let Some(mut step) = self.pending.take() {
            step.reward = r;
            self.finished.push(step);
        }
        if let Some(a) = &mut self.adapter {
            a.reward(r, w.p99_ms, self.slo_ms);
        }
        let state = State::of(w, alpha, self.max_positions, self.slo_ms);
        if let Some(rc) = &mut self.recovery
            && let Verdict::Override(step) = rc.observe(w.p99_ms, w.hot_user_share)
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
        let correction = self.adapter.as_mut().map_or(0.0, |a| a.correct(&state));
        let step = base + correction;
        if allow_up { step } else { step.min(0.0) }
    }

    /// Learning that waits until the decision is out (the adapter's update).
    pub fn learn(&mut self) {
        if let Some(a) = &mut self.adapter {
            a.train();
        }
    }

    /// Recorded decisions with their rewards (taken: the caller owns them).
    pub fn take_steps(&mut self) -> Vec<Step> {
        std::mem::take(&mut self.finished)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        }
    }

    #[test]
    fn a_fresh_policy_holds_alpha_and_smart_matches_ppo_only_until_it_learns() {
        let policy = Arc::new(ActorCritic::new(1));
        let mut ppo = Learned::new(policy.clone(), 1024, 30.0, false, false, 7);
        for _ in 0..5 {
            assert_eq!(ppo.decide(&window(20.0), 0.4), 0.0);
        }
        // Smart's adapter explores (±σ), bounded by ±0.02 around PPO's move.
        let mut smart = Learned::new(policy, 1024, 30.0, true, false, 7);
        for _ in 0..5 {
            assert!(smart.decide(&window(20.0), 0.4).abs() <= 0.02);
        }
        assert!(
            ppo.take_steps().is_empty(),
            "nothing recorded unless training"
        );
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
