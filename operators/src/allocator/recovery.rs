//! HLEM's recovery controller (§IV-A, Eq. 8): burst detection on the p99 of
//! closed epochs. It keeps the last 10 epochs' p99, their EMA and standard
//! deviation; an epoch whose p99 exceeds EMA + 3σ while the hot-user share
//! is above ρ* = 0.2 is a burst, and α moves toward KV by a fixed step each
//! epoch instead of whatever the normal path decides. Normal control
//! resumes after 2 epochs without a detection.

use std::collections::VecDeque;

/// Epochs the baseline spans.
pub const BASELINE_EPOCHS: usize = 10;
/// Hot-user share above which a burst moves memory toward KV (ρ*).
pub const HOT_SHARE: f64 = 0.2;
/// Quiet epochs after the last detection before normal control resumes.
pub const QUIET_EPOCHS: u32 = 2;
/// The move per burst epoch (the largest of Eq. 3, toward KV).
pub const STEP: f64 = -0.06;
/// Epochs of history before anything can be detected: a σ of one or two
/// samples says nothing.
const WARM_UP: usize = 3;

/// What the controller says for an epoch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Verdict {
    /// No burst: the normal decision stands.
    Normal,
    /// A burst (or its 2-epoch tail): move α by this instead.
    Override(f64),
}

#[derive(Clone, Debug)]
pub struct Recovery {
    recent: VecDeque<f64>,
    /// Epochs since the last detection; `None` when none is active.
    quiet: Option<u32>,
    /// The smallest σ used, in ms: on a flat series any jitter would
    /// otherwise be "3σ".
    min_sigma_ms: f64,
}

impl Recovery {
    /// `min_sigma_ms`: floor of σ (for example 2% of the SLO).
    pub fn new(min_sigma_ms: f64) -> Self {
        Self {
            recent: VecDeque::with_capacity(BASELINE_EPOCHS),
            quiet: None,
            min_sigma_ms: min_sigma_ms.max(0.0),
        }
    }

    /// The EMA (span 10: weight 2/11 per new epoch, oldest first) and the
    /// standard deviation of the last epochs' p99; `None` while warming up.
    pub fn baseline(&self) -> Option<(f64, f64)> {
        if self.recent.len() < WARM_UP {
            return None;
        }
        let k = 2.0 / (BASELINE_EPOCHS as f64 + 1.0);
        let mut iter = self.recent.iter();
        let mut ema = *iter.next()?;
        for &v in iter {
            ema += k * (v - ema);
        }
        let n = self.recent.len() as f64;
        let mean = self.recent.iter().sum::<f64>() / n;
        let var = self.recent.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
        Some((ema, var.sqrt().max(self.min_sigma_ms)))
    }

    /// One closed epoch: its p99 (as the controllers see it, failures
    /// counted: [`super::mdp::controller_p99_ms`]) and hot-user share. A
    /// detection compares against the baseline of the epochs before this
    /// one; a burst epoch joins the baseline too, so a lasting shift
    /// becomes the new normal.
    pub fn observe(&mut self, p99_ms: f64, hot_share: f64) -> Verdict {
        if !p99_ms.is_finite() {
            return self.verdict(false);
        }
        let burst = self
            .baseline()
            .is_some_and(|(ema, sigma)| p99_ms > ema + 3.0 * sigma && hot_share > HOT_SHARE);
        if self.recent.len() == BASELINE_EPOCHS {
            self.recent.pop_front();
        }
        self.recent.push_back(p99_ms);
        self.verdict(burst)
    }

    fn verdict(&mut self, burst: bool) -> Verdict {
        if burst {
            self.quiet = Some(0);
            return Verdict::Override(STEP);
        }
        match self.quiet {
            Some(q) if q + 1 < QUIET_EPOCHS => {
                self.quiet = Some(q + 1);
                Verdict::Override(STEP)
            }
            _ => {
                self.quiet = None;
                Verdict::Normal
            }
        }
    }

    /// Whether a burst (or its quiet tail) is being handled.
    pub fn active(&self) -> bool {
        self.quiet.is_some()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn steady(r: &mut Recovery, epochs: usize) {
        for i in 0..epochs {
            // 30 ± 1 ms.
            let p99 = 30.0 + if i % 2 == 0 { 1.0 } else { -1.0 };
            assert_eq!(r.observe(p99, 0.5), Verdict::Normal, "epoch {i}");
        }
    }

    #[test]
    fn a_spike_past_three_sigma_overrides_toward_kv_then_two_quiet_epochs_resume() {
        let mut r = Recovery::new(0.5);
        steady(&mut r, 10);
        let (ema, sigma) = r.baseline().unwrap();
        assert!((ema - 30.0).abs() < 1.0 && (sigma - 1.0).abs() < 1e-9);
        assert_eq!(r.observe(60.0, 0.5), Verdict::Override(STEP));
        assert!(r.active());
        // Back to normal latencies: one more override epoch, then normal.
        assert_eq!(r.observe(30.0, 0.5), Verdict::Override(STEP));
        assert_eq!(r.observe(30.0, 0.5), Verdict::Normal);
        assert!(!r.active());
    }

    #[test]
    fn a_burst_with_few_hot_users_is_left_to_normal_control() {
        let mut r = Recovery::new(0.5);
        steady(&mut r, 10);
        assert_eq!(r.observe(60.0, 0.1), Verdict::Normal);
    }

    #[test]
    fn nothing_is_detected_while_warming_up_or_within_three_sigma() {
        let mut r = Recovery::new(0.5);
        assert_eq!(r.observe(30.0, 0.5), Verdict::Normal);
        assert_eq!(r.observe(300.0, 0.5), Verdict::Normal);
        let mut r = Recovery::new(0.5);
        steady(&mut r, 10);
        // EMA ≈ 30, σ = 1: 32.5 is within 3σ.
        assert_eq!(r.observe(32.5, 0.9), Verdict::Normal);
        // A flat series: the σ floor keeps jitter from counting.
        let mut flat = Recovery::new(0.6);
        for _ in 0..10 {
            assert_eq!(flat.observe(30.0, 0.9), Verdict::Normal);
        }
        assert_eq!(flat.observe(31.0, 0.9), Verdict::Normal);
        assert_eq!(flat.observe(f64::NAN, 0.9), Verdict::Normal);
    }

    #[test]
    fn a_lasting_burst_keeps_overriding_while_it_stays_above_the_baseline() {
        let mut r = Recovery::new(0.5);
        steady(&mut r, 10);
        let mut overrides = 0;
        for p99 in [60.0, 90.0, 140.0] {
            if r.observe(p99, 0.5) == Verdict::Override(STEP) {
                overrides += 1;
            }
        }
        assert_eq!(overrides, 3);
    }
}
