//! HLEM's online residual adapter (§IV-A, Eq. 7): a 5 → 16 → 1 network,
//! output layer zero-initialised, that adds a bounded correction to the
//! frozen base policy's move.
//!
//! - **Inputs** (five of Table I's features, see [`State`]): hot-user
//!   share, KV hit rate, EMB hit rate, α and normalised p99 — what an
//!   offline–online mismatch in the cache trade-off shows in. Sequence
//!   length and the violation share are left to the base policy (the
//!   violation share moves with p99).
//! - **Output**: 0.02·tanh(y), so the correction stays within ±0.02.
//! - **Objective**: a one-step policy gradient on Eq. 5's reward. The
//!   proposed correction is the output plus Gaussian exploration (σ =
//!   [`EXPLORE`]); the applied one is what of it the allocator sent (after
//!   its mask, clamp and page grid: [`Adapter::realised`]). Each epoch's
//!   (inputs, applied correction, reward of the window after it) enters a
//!   1K FIFO buffer, and an update ascends
//!   E[(r − r̄)·∇ log π(applied | inputs)] over the buffer, with the
//!   learning rate of Eq. 7: η₀·|ℓ_t − ℓ_EMA| / τ_SLO, η₀ = 1e-3. A
//!   window that gets no decision (too few requests, α pinned) drops the
//!   correction waiting for it ([`Adapter::forget`]).
//! - With exploration off and no update, a zero-initialised adapter adds
//!   exactly 0: `ppo-only` and `smart` decide alike until it has learned.
//! - Where the update runs: inline after the decision is out (`complete`
//!   release: at the epoch boundary, so runs stay reproducible), or on a
//!   thread of its own whose result the next decision takes up
//!   ([`Adapter::train_off_path`], `arrival` release: the serving worker
//!   never waits for a pass over the buffer).

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::mdp::State;
use super::mlp::{Grads, Mlp, tanh};

/// Largest correction (±).
pub const BOUND: f64 = 0.02;
/// Exploration noise of the applied correction (σ).
pub const EXPLORE: f64 = 0.005;
/// η₀ of Eq. 7.
pub const ETA0: f64 = 1e-3;
/// Replay buffer size (FIFO).
pub const BUFFER: usize = 1_000;
/// Weight of a new epoch's p99 in ℓ_EMA (span 10, as the recovery
/// controller's baseline).
const EMA_WEIGHT: f64 = 2.0 / 11.0;

/// The five features the adapter reads, from a Table I state.
pub fn inputs(s: &State) -> [f64; 5] {
    [
        s.0[State::HOT],
        s.0[State::KV_HIT],
        s.0[State::EMB_HIT],
        s.0[State::ALPHA],
        s.0[State::P99],
    ]
}

#[derive(Clone, Debug)]
struct Sample {
    x: [f64; 5],
    applied: f64,
    reward: f64,
}

#[derive(Clone, Debug)]
pub struct Adapter {
    net: Mlp,
    buffer: VecDeque<Sample>,
    /// The correction applied at the last decision, awaiting its reward.
    pending: Option<([f64; 5], f64)>,
    p99_ema: Option<f64>,
    rng: ChaCha8Rng,
    explore: bool,
    /// The learning rate of an update waiting for [`Adapter::train`].
    due: Option<f64>,
    /// The next decision's exploration noise, drawn off the decision path
    /// (at construction and in [`Adapter::train`]; the RNG, the logarithm
    /// and the cosine were most of a cold decision's correction). The
    /// draws come in the same order as when drawn at the decision.
    noise: Option<f64>,
    /// Updates run on a thread of their own ([`Adapter::train_off_path`]).
    off_path: bool,
    /// The update running there: its network once done.
    training: Option<Arc<Mutex<Option<Mlp>>>>,
}

impl Adapter {
    /// A zero-output adapter; `explore` adds the Gaussian noise the policy
    /// gradient needs (off: decisions are the network's output alone).
    pub fn new(seed: u64, explore: bool) -> Self {
        let mut a = Self {
            net: Mlp::zero_output(&[5, 16, 1], seed),
            buffer: VecDeque::with_capacity(BUFFER),
            pending: None,
            p99_ema: None,
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x5eed),
            explore,
            due: None,
            noise: None,
            off_path: false,
            training: None,
        };
        a.draw_noise();
        a
    }

    /// Runs each update on a thread of its own; the decision after it is
    /// done takes up the new network. Not reproducible (when it is done
    /// depends on the machine): for `arrival` release.
    pub fn train_off_path(mut self) -> Self {
        self.off_path = true;
        self
    }

    /// Takes up the network of a finished update, if any.
    fn adopt(&mut self) {
        let Some(slot) = &self.training else { return };
        // Never waits: a slot the thread holds is not done yet.
        let done = match slot.try_lock() {
            Ok(mut net) => net.take(),
            Err(_) => None,
        };
        if let Some(net) = done {
            self.net = net;
            self.training = None;
        }
    }

    /// Waits for the update running off the path and takes it up (tests).
    #[cfg(test)]
    pub(crate) fn finish_training(&mut self) {
        while self.training.is_some() {
            self.adopt();
            std::thread::yield_now();
        }
    }

    fn draw_noise(&mut self) {
        if self.explore && self.noise.is_none() {
            self.noise = Some(gaussian(&mut self.rng));
        }
    }

    fn mean(&self, x: &[f64; 5]) -> f64 {
        BOUND * tanh(self.net.forward_with(x, |y| y[0]))
    }

    /// One forward pass whose result is dropped: touches the weights once
    /// at load, so that the first decision does not pay for it.
    pub fn warm_up(&self) {
        std::hint::black_box(self.mean(std::hint::black_box(&[0.0; 5])));
    }

    /// The correction for state `s`, remembered until [`Adapter::reward`].
    pub fn correct(&mut self, s: &State) -> f64 {
        self.adopt();
        let x = inputs(s);
        let mut applied = self.mean(&x);
        if self.explore {
            let z = match self.noise.take() {
                Some(z) => z,
                None => gaussian(&mut self.rng),
            };
            applied += EXPLORE * z;
        }
        let applied = applied.clamp(-BOUND, BOUND);
        self.pending = Some((x, applied));
        applied
    }

    /// The allocator sent `applied` of the last correction (0 when the
    /// move was masked, clamped away or below the page grid): the reward
    /// that follows is for that, not for the correction proposed.
    pub fn realised(&mut self, applied: f64) {
        if let Some((_, a)) = &mut self.pending {
            *a = applied.clamp(-BOUND, BOUND);
        }
    }

    /// The window after the last correction gets no decision (too few
    /// requests, or α pinned): nothing is learned from the correction.
    pub fn forget(&mut self) {
        self.pending = None;
    }

    /// Turns exploration off: corrections are the network's output alone
    /// (a noise drawn ahead is dropped).
    pub fn stop_exploring(&mut self) {
        self.explore = false;
        self.noise = None;
    }

    /// The buffer's (applied correction, reward) pairs, oldest first.
    #[cfg(test)]
    pub(crate) fn samples(&self) -> Vec<(f64, f64)> {
        self.buffer.iter().map(|s| (s.applied, s.reward)).collect()
    }

    /// The window after the last correction closed with reward `r` and
    /// p99 `p99_ms`: its sample enters the buffer, and one update over the
    /// buffer becomes due ([`Adapter::train`]). Returns its learning rate
    /// (0: none).
    pub fn reward(&mut self, r: f64, p99_ms: f64, slo_ms: f64) -> f64 {
        let ema = match self.p99_ema {
            Some(e) if p99_ms.is_finite() => e + EMA_WEIGHT * (p99_ms - e),
            Some(e) => e,
            None => p99_ms,
        };
        let rate = if p99_ms.is_finite() && ema.is_finite() {
            ETA0 * (p99_ms - self.p99_ema.unwrap_or(p99_ms)).abs() / slo_ms.max(1e-9)
        } else {
            0.0
        };
        self.p99_ema = ema.is_finite().then_some(ema);
        let Some((x, applied)) = self.pending.take() else {
            return 0.0;
        };
        if !r.is_finite() {
            return 0.0;
        }
        if self.buffer.len() == BUFFER {
            self.buffer.pop_front();
        }
        self.buffer.push_back(Sample {
            x,
            applied,
            reward: r,
        });
        if rate > 0.0 && self.buffer.len() >= 2 {
            self.due = Some(rate);
        }
        rate
    }

    /// Runs the update the last [`Adapter::reward`] made due, if any, and
    /// draws the next decision's exploration noise: off the decision path
    /// (the allocator calls it after its decision is out), so a decision
    /// never waits for a pass over the buffer or for the RNG.
    pub fn train(&mut self) {
        if let Some(rate) = self.due.take() {
            if self.off_path {
                self.train_on_thread(rate);
            } else {
                update(&mut self.net, self.buffer.iter(), rate);
            }
        }
        self.draw_noise();
    }

    /// The update on a thread of its own, over a copy of the buffer. While
    /// one runs, a newer one is not started (an epoch is seconds, an
    /// update under a millisecond); if no thread can be made, inline.
    fn train_on_thread(&mut self, rate: f64) {
        self.adopt();
        if self.training.is_some() {
            return;
        }
        let slot = Arc::new(Mutex::new(None));
        let (out, mut net) = (slot.clone(), self.net.clone());
        let buffer: Vec<Sample> = self.buffer.iter().cloned().collect();
        let spawned = std::thread::Builder::new()
            .name("grflow-adapter".into())
            .spawn(move || {
                update(&mut net, buffer.iter(), rate);
                *out.lock().unwrap_or_else(|e| e.into_inner()) = Some(net);
            });
        match spawned {
            Ok(_) => self.training = Some(slot),
            Err(_) => update(&mut self.net, self.buffer.iter(), rate),
        }
    }

    pub fn buffered(&self) -> usize {
        self.buffer.len()
    }
}

/// One ascent step of `net` on the buffer's mean advantage-weighted log
/// likelihood of the applied corrections (a Gaussian policy).
fn update<'a>(net: &mut Mlp, buffer: impl ExactSizeIterator<Item = &'a Sample> + Clone, rate: f64) {
    let n = buffer.len() as f64;
    let baseline = buffer.clone().map(|s| s.reward).sum::<f64>() / n;
    let mut total = Grads::zeros(net);
    for s in buffer {
        let dout = |y: &[f64]| {
            let t = tanh(y[0]);
            let mean = BOUND * t;
            // ∂ log N(applied; mean, σ²) / ∂y = (applied − mean)/σ² · ∂mean/∂y
            let dlog = (s.applied - mean) / (EXPLORE * EXPLORE) * BOUND * (1.0 - t * t);
            vec![(s.reward - baseline) * dlog / n]
        };
        net.backward_add(&s.x, dout, &mut total);
    }
    net.step(&total, rate);
}

/// A standard normal sample (Box–Muller).
fn gaussian(rng: &mut ChaCha8Rng) -> f64 {
    let u1: f64 = rng.random_range(f64::EPSILON..1.0);
    let u2: f64 = rng.random_range(0.0..1.0);
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(alpha: f64, p99: f64) -> State {
        State([0.3, 0.5, 0.8, 0.4, 0.05, alpha, p99])
    }

    #[test]
    fn noise_drawn_ahead_comes_in_the_order_drawn_at_each_decision() {
        // Untrained (zero output), so a correction is its noise alone.
        let mut rng = ChaCha8Rng::seed_from_u64(7 ^ 0x5eed);
        let want: Vec<f64> = (0..20)
            .map(|_| (EXPLORE * gaussian(&mut rng)).clamp(-BOUND, BOUND))
            .collect();
        let mut ahead = Adapter::new(7, true);
        let mut at_decision = Adapter::new(7, true);
        for (i, w) in want.iter().enumerate() {
            assert_eq!(ahead.correct(&state(0.3, 0.3)), *w, "decision {i}");
            ahead.train();
            // Without train() between decisions the noise is drawn late.
            assert_eq!(at_decision.correct(&state(0.3, 0.3)), *w, "decision {i}");
        }
    }

    #[test]
    fn a_fresh_adapter_without_exploration_adds_exactly_zero() {
        let mut a = Adapter::new(1, false);
        for i in 0..20 {
            assert_eq!(a.correct(&state(0.1 + 0.04 * i as f64, 0.3)), 0.0);
        }
    }

    #[test]
    fn corrections_stay_within_the_bound_and_the_buffer_is_a_bounded_fifo() {
        let mut a = Adapter::new(2, true);
        for i in 0..(BUFFER + 50) {
            let c = a.correct(&state(0.5, 0.4));
            assert!(c.abs() <= BOUND, "{c}");
            a.reward(0.5, 30.0 + (i % 7) as f64, 30.0);
        }
        assert_eq!(a.buffered(), BUFFER);
    }

    #[test]
    fn the_learning_rate_follows_eq_seven() {
        let mut a = Adapter::new(3, false);
        a.correct(&state(0.5, 0.5));
        // First epoch: ℓ_EMA = ℓ, no step.
        assert_eq!(a.reward(0.9, 30.0, 30.0), 0.0);
        a.correct(&state(0.5, 0.5));
        // |60 − 30| / 30 · 1e-3.
        assert!((a.reward(0.9, 60.0, 30.0) - 1e-3).abs() < 1e-15);
    }

    #[test]
    fn off_path_updates_equal_inline_ones_and_wait_for_the_next_decision() {
        let mut inline = Adapter::new(5, true);
        let mut off = Adapter::new(5, true).train_off_path();
        let x = inputs(&state(0.5, 0.5));
        let mut on_thread = 0;
        for i in 0..40 {
            let s = state(0.5, 0.5);
            let c = inline.correct(&s);
            assert_eq!(off.correct(&s), c, "decision {i}");
            let p99 = if i % 2 == 0 { 20.0 } else { 40.0 };
            inline.reward(0.5 + 10.0 * c, p99, 30.0);
            off.reward(0.5 + 10.0 * c, p99, 30.0);
            let before = off.mean(&x);
            inline.train();
            off.train();
            if off.training.is_some() {
                // Started, not taken up: the network is the one before.
                assert_eq!(off.mean(&x), before, "decision {i}");
                on_thread += 1;
            }
            off.finish_training();
            assert_eq!(off.mean(&x), inline.mean(&x), "decision {i}");
        }
        assert_ne!(inline.mean(&x), 0.0, "it learned");
        assert!(on_thread > 20, "updates ran off the path: {on_thread}");
    }

    #[test]
    fn it_learns_the_sign_of_a_correction_that_pays() {
        // A reward that grows with the correction: after training, the
        // adapter's mean correction is positive.
        let mut a = Adapter::new(4, true);
        for i in 0..3_000 {
            let s = state(0.5, 0.5);
            let c = a.correct(&s);
            // Alternate p99 so Eq. 7 gives a non-zero rate.
            let p99 = if i % 2 == 0 { 20.0 } else { 40.0 };
            a.reward(0.5 + 10.0 * c, p99, 30.0);
            a.train();
        }
        let mean = a.mean(&inputs(&state(0.5, 0.5)));
        assert!(mean > 0.002, "learned mean correction {mean}");
    }
}
