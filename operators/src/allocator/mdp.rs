//! HLEM's allocation MDP (§IV-A): the state a learned controller sees (Table
//! I, each feature normalised to [0, 1]), its actions (Eq. 3), how an action
//! moves α (Eq. 4) and the reward of the window after it (Eq. 5).

use crate::windows::WindowStats;

/// Eq. 3: moves of α one decision may make.
pub const ACTIONS: [f64; 7] = [-0.06, -0.04, -0.02, 0.0, 0.02, 0.04, 0.06];

/// Eq. 4 and 6: α after a move, kept within [min, max].
pub fn apply(alpha: f64, delta: f64, min: f64, max: f64) -> f64 {
    (alpha + delta).clamp(min, max)
}

/// Table I's state vector, every feature in [0, 1]:
/// (h, k, e, L, v, α, p) = hot-user share, KV hit rate, EMB hit rate, mean
/// sequence length ÷ `max_positions`, SLO-violation share, α, and p99 ÷
/// (2·τ_SLO). The last two are clipped (a p99 beyond twice the SLO reads 1).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct State(pub [f64; 7]);

impl State {
    pub const HOT: usize = 0;
    pub const KV_HIT: usize = 1;
    pub const EMB_HIT: usize = 2;
    pub const SEQ_LEN: usize = 3;
    pub const VIOLATIONS: usize = 4;
    pub const ALPHA: usize = 5;
    pub const P99: usize = 6;

    /// The state after a closed window `w`, for a node whose α is `alpha`
    /// now (the window's own α is its mean over the window, which may
    /// predate the last move).
    pub fn of(w: &WindowStats, alpha: f64, max_positions: usize, slo_ms: f64) -> Self {
        let unit = |v: f64| {
            if v.is_finite() {
                v.clamp(0.0, 1.0)
            } else {
                0.0
            }
        };
        let mut s = [0.0; 7];
        s[Self::HOT] = unit(w.hot_user_share);
        s[Self::KV_HIT] = unit(w.kv_hit_rate);
        s[Self::EMB_HIT] = unit(w.emb_hit_rate);
        s[Self::SEQ_LEN] = unit(w.mean_seq_len / max_positions.max(1) as f64);
        s[Self::VIOLATIONS] = unit(w.slo_violation_share);
        s[Self::ALPHA] = unit(alpha);
        // An empty or broken p99 reads as the worst: never as "all is well".
        let p99 = controller_p99_ms(w, slo_ms);
        s[Self::P99] = if p99.is_nan() {
            1.0
        } else {
            unit(p99 / (2.0 * slo_ms.max(1e-9)))
        };
        Self(s)
    }
}

/// Failed requests beyond this share of a window's requests make its p99
/// read as saturated ([`controller_p99_ms`]).
pub const FAILED_SHARE: f64 = 0.01;

/// The p99 the controllers see for window `w`: the served requests' p99
/// with each latency scaled to the rank SLO (`slo_ms`; a retrieve request
/// is held to its own SLO, not the rank one), or at least 2·τ_SLO (where
/// the P99 feature saturates) when more than [`FAILED_SHARE`] of the
/// window's requests failed. A failed request has no latency but missed
/// its SLO: a window of failures (p99 0 over no served request) must not
/// read as the fastest.
pub fn controller_p99_ms(w: &WindowStats, slo_ms: f64) -> f64 {
    let p99 = w.p99_scaled_ms.unwrap_or(w.p99_ms);
    // `requests` counts the failed ones too.
    if w.failed as f64 > FAILED_SHARE * w.requests as f64 {
        p99.max(2.0 * slo_ms.max(1e-9))
    } else {
        p99
    }
}

/// Eq. 5's highest reward: the window met the SLO with nothing truncated.
pub const BEST_REWARD: f64 = 1.0;

/// Eq. 5 with λ = 1/τ_SLO: the window's SLO satisfaction minus its p99
/// overshoot in units of the SLO. 1 at best; unbounded below, so a p99 of
/// three SLOs (−2 + satisfaction) weighs more than any satisfaction gain.
///
/// One term more than the paper: minus the share of requests served with a
/// truncated history. HLEM's KV cache only misses when it is small; ours
/// cuts histories that its KV share cannot hold, which makes answers worse
/// and faster, and a policy rewarded for latency alone learns to starve KV
/// for exactly that.
pub fn reward(w: &WindowStats, slo_ms: f64) -> f64 {
    let slo = slo_ms.max(1e-9);
    let satisfied = (1.0 - w.slo_violation_share).clamp(0.0, 1.0);
    let p99 = controller_p99_ms(w, slo);
    let p99 = if p99.is_finite() { p99 } else { f64::MAX / 4.0 };
    satisfied - (p99 - slo).max(0.0) / slo - w.truncated_share.clamp(0.0, 1.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn window() -> WindowStats {
        WindowStats {
            requests: 100,
            failed: 0,
            hot_user_share: 0.32,
            emb_hit_rate: 0.8,
            kv_hit_rate: 0.5,
            mean_seq_len: 512.0,
            slo_violation_share: 0.05,
            p99_ms: 45.0,
            alpha: 0.4,
            truncated_share: 0.0,
            alpha_end: None,
            pinned_end: false,
            p99_scaled_ms: None,
        }
    }

    #[test]
    fn the_state_is_table_one_normalised_to_the_unit_interval() {
        let s = State::of(&window(), 0.46, 1024, 30.0);
        assert_eq!(s.0, [0.32, 0.5, 0.8, 0.5, 0.05, 0.46, 0.75]);
        // Out-of-range inputs clip; a p99 past 2·SLO or unknown reads 1.
        let wild = WindowStats {
            mean_seq_len: 1e9,
            p99_ms: 500.0,
            hot_user_share: -1.0,
            ..window()
        };
        let s = State::of(&wild, 1.5, 1024, 30.0);
        assert_eq!((s.0[0], s.0[3], s.0[5], s.0[6]), (0.0, 1.0, 1.0, 1.0));
        let nan = WindowStats {
            p99_ms: f64::NAN,
            ..window()
        };
        assert_eq!(State::of(&nan, 0.4, 1024, 30.0).0[State::P99], 1.0);
    }

    #[test]
    fn the_controllers_hold_each_kind_to_its_own_slo() {
        // p99 80 ms over rank (30 ms) and retrieve (100 ms) requests; scaled
        // to the rank SLO, the slow retrieve ones read 0.3 of theirs.
        let w = WindowStats {
            requests: 100,
            p99_ms: 80.0,
            p99_scaled_ms: Some(24.0),
            ..Default::default()
        };
        assert_eq!(controller_p99_ms(&w, 30.0), 24.0);
        assert_eq!(reward(&w, 30.0), BEST_REWARD);
        let unscaled = WindowStats {
            p99_scaled_ms: None,
            ..w
        };
        assert_eq!(controller_p99_ms(&unscaled, 30.0), 80.0);
    }

    #[test]
    fn failed_requests_read_as_a_saturated_p99_in_the_state_and_the_reward() {
        // 50 requests, all failed: no served latency (p99 0), all late.
        let shed = WindowStats {
            requests: 50,
            failed: 50,
            slo_violation_share: 1.0,
            p99_ms: 0.0,
            ..window()
        };
        assert_eq!(controller_p99_ms(&shed, 30.0), 60.0);
        assert_eq!(State::of(&shed, 0.4, 1024, 30.0).0[State::P99], 1.0);
        // Eq. 5 at p99 = 2·τ: no satisfaction, one SLO of overshoot.
        assert!((reward(&shed, 30.0) - -1.0).abs() < 1e-12);
        // Half failed, the served ones fast: as bad as all failed.
        let half = WindowStats {
            failed: 50,
            p99_ms: 10.0,
            ..window()
        };
        assert_eq!(State::of(&half, 0.4, 1024, 30.0).0[State::P99], 1.0);
        // A served p99 beyond 2·τ stands.
        let slow = WindowStats {
            p99_ms: 90.0,
            ..half
        };
        assert_eq!(controller_p99_ms(&slow, 30.0), 90.0);
        // 1% failed (1 of 100) is within the share: the served p99 stands.
        let one = WindowStats {
            failed: 1,
            ..window()
        };
        assert_eq!(controller_p99_ms(&one, 30.0), 45.0);
        assert_eq!(State::of(&one, 0.46, 1024, 30.0).0[State::P99], 0.75);
        let two = WindowStats {
            failed: 2,
            ..window()
        };
        assert_eq!(controller_p99_ms(&two, 30.0), 60.0);
    }

    #[test]
    fn actions_are_eq_three_and_alpha_stays_within_bounds() {
        assert_eq!(ACTIONS.len(), 7);
        assert!(ACTIONS.contains(&0.0));
        assert!(ACTIONS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(apply(0.88, 0.06, 0.1, 0.9), 0.9);
        assert_eq!(apply(0.12, -0.06, 0.1, 0.9), 0.1);
        assert!((apply(0.5, -0.04, 0.1, 0.9) - 0.46).abs() < 1e-12);
    }

    #[test]
    fn the_reward_is_satisfaction_minus_the_p99_overshoot_in_slos() {
        // Within the SLO: the satisfaction alone.
        let calm = WindowStats {
            p99_ms: 20.0,
            ..window()
        };
        assert!((reward(&calm, 30.0) - 0.95).abs() < 1e-12);
        // 45 ms against 30: 0.95 − 15/30.
        assert!((reward(&window(), 30.0) - 0.45).abs() < 1e-12);
        // A worse tail always costs more.
        let worse = WindowStats {
            p99_ms: 90.0,
            ..window()
        };
        assert!(reward(&worse, 30.0) < reward(&window(), 30.0));
        assert!(reward(&calm, 30.0) <= 1.0);
        // Truncated answers cost what they are a share of.
        let cut = WindowStats {
            truncated_share: 0.25,
            ..calm
        };
        assert!((reward(&cut, 30.0) - 0.70).abs() < 1e-12);
    }
}
