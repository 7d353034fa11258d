//! The allocator: moves a node's EMB share α between epochs from the
//! node's closed windows (HLEM §IV-A). This file holds the policies that
//! need no learned model: `static` (α from the config, never moved),
//! `kv-opt` (α = 0: all of the pool to KV, as HLEM defines it) and `pid`
//! (HLEM's PID baseline on the p99 error). Each decision is an action of at
//! most ±`max_step` (Eq. 3's largest; `smart` adds its adapter's residual of
//! at most ±0.02) from the node's α at the window's end, with α clipped to
//! [`min_alpha`, `max_alpha`] (Eq. 4, 6). Pure: the dataflow wrapper feeds
//! it windows and turns its answers into `SetAlpha` commands.
//!
//! HLEM's SmartAllocator is built from the parts beside it: the MDP
//! (state, actions, reward: [`mdp`]), the frozen PPO base policy
//! ([`ppo`], on the small network of [`mlp`]), the residual adapter
//! ([`adapter`]), the recovery controller ([`recovery`]), and their
//! decision loop ([`learned`]): `ppo-only` is the base policy alone,
//! `smart` all three layers.

pub mod adapter;
pub mod learned;
pub mod mdp;
pub mod mlp;
pub mod oracle;
pub mod ppo;
pub mod recovery;
pub mod split;

pub use learned::Learned;

use serde::{Deserialize, Serialize};

use crate::windows::WindowStats;

/// `allocator.policy`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AllocatorPolicy {
    /// α stays at `memory.alpha`.
    #[default]
    Static,
    /// α = 0 from the start.
    KvOpt,
    /// α moves against the p99 error: above the SLO toward KV (prefix
    /// reuse saves compute, the larger cost under load), below it toward
    /// EMB.
    Pid,
    /// The frozen PPO policy of `policy_file` alone (HLEM's ablation).
    PpoOnly,
    /// SmartAllocator: the PPO policy, the online residual adapter and the
    /// burst recovery controller (HLEM §IV-A).
    Smart,
}

impl AllocatorPolicy {
    /// Every policy, in the order errors list them.
    pub const ALL: [AllocatorPolicy; 5] = [
        Self::Static,
        Self::KvOpt,
        Self::Pid,
        Self::PpoOnly,
        Self::Smart,
    ];

    /// The name a config spells it with.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Static => "static",
            Self::KvOpt => "kv-opt",
            Self::Pid => "pid",
            Self::PpoOnly => "ppo-only",
            Self::Smart => "smart",
        }
    }
}

impl std::fmt::Display for AllocatorPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for AllocatorPolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if let Some(p) = Self::ALL.into_iter().find(|p| p.as_str() == s) {
            return Ok(p);
        }
        let names: Vec<String> = Self::ALL
            .iter()
            .map(|p| format!("{:?}", p.as_str()))
            .collect();
        Err(format!("{s:?} is not one of {}", names.join(", ")))
    }
}

/// Allocator settings (`[allocator]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AllocatorConfig {
    pub policy: AllocatorPolicy,
    /// PID gains on the error (p99 − τ_SLO) / τ_SLO.
    pub kp: f64,
    pub ki: f64,
    pub kd: f64,
    /// The largest move of one decision (Eq. 3: ±0.06).
    pub max_step: f64,
    /// α is kept within [min_alpha, max_alpha] by a controller (Eq. 4, 6).
    pub min_alpha: f64,
    pub max_alpha: f64,
    /// Windows with fewer requests than this leave α where it is (a p99
    /// of a handful of requests is noise).
    pub min_requests: u64,
    /// The PPO policy of `ppo-only` and `smart` (a `grflow
    /// train-allocator` safetensors file).
    pub policy_file: String,
    /// Training only (`grflow train-allocator`): sample the PPO policy's
    /// actions and record each decision with its reward.
    pub sample: bool,
    /// Seed of the sampled actions and of the adapter's exploration (each
    /// node adds its id).
    pub seed: u64,
}

impl Default for AllocatorConfig {
    fn default() -> Self {
        Self {
            policy: AllocatorPolicy::Static,
            kp: 0.05,
            ki: 0.01,
            kd: 0.0,
            max_step: 0.06,
            min_alpha: 0.1,
            max_alpha: 0.9,
            min_requests: 20,
            policy_file: "configs/allocator-ppo.safetensors".into(),
            sample: false,
            seed: 0,
        }
    }
}

impl AllocatorConfig {
    /// The first unusable key (`allocator.<key>`) and why.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        for (key, v) in [
            ("allocator.kp", self.kp),
            ("allocator.ki", self.ki),
            ("allocator.kd", self.kd),
        ] {
            // A negative gain turns the push around: α walks toward EMB
            // while P99 is over the SLO, and the loop feeds itself.
            if !(v.is_finite() && v >= 0.0) {
                return Err((key, format!("must be a finite number >= 0 (got {v})")));
            }
        }
        if !(self.max_step.is_finite() && self.max_step > 0.0) {
            return Err((
                "allocator.max_step",
                format!("must be a finite number > 0 (got {})", self.max_step),
            ));
        }
        // Each bound out of [0, 1] (or NaN) is named by its own key; two
        // usable bounds the wrong way round name min_alpha.
        if !(0.0..=1.0).contains(&self.min_alpha) {
            return Err((
                "allocator.min_alpha",
                format!("must be in [0, 1] (got {})", self.min_alpha),
            ));
        }
        if !(0.0..=1.0).contains(&self.max_alpha) {
            return Err((
                "allocator.max_alpha",
                format!("must be in [0, 1] (got {})", self.max_alpha),
            ));
        }
        if self.min_alpha > self.max_alpha {
            return Err((
                "allocator.min_alpha",
                format!(
                    "need 0 <= min_alpha <= max_alpha <= 1 (got {} and {})",
                    self.min_alpha, self.max_alpha
                ),
            ));
        }
        Ok(())
    }

    /// α at the start of the job for `config_alpha` (`memory.alpha`).
    pub fn initial_alpha(&self, config_alpha: f64) -> f64 {
        match self.policy {
            AllocatorPolicy::KvOpt => 0.0,
            AllocatorPolicy::Static
            | AllocatorPolicy::Pid
            | AllocatorPolicy::PpoOnly
            | AllocatorPolicy::Smart => config_alpha,
        }
    }

    /// Whether α moves during the job (a controller must run).
    pub fn moves(&self) -> bool {
        matches!(
            self.policy,
            AllocatorPolicy::Pid | AllocatorPolicy::PpoOnly | AllocatorPolicy::Smart
        )
    }

    /// Whether the policy needs `policy_file`.
    pub fn learned(&self) -> bool {
        matches!(
            self.policy,
            AllocatorPolicy::PpoOnly | AllocatorPolicy::Smart
        )
    }
}

/// Bound of the PID integral (in epochs of full-scale error).
const INTEGRAL_LIMIT: f64 = 2.0;

/// One node's allocator.
#[derive(Clone, Debug)]
pub struct Allocator {
    cfg: AllocatorConfig,
    slo_ms: f64,
    alpha: f64,
    integral: f64,
    previous_error: Option<f64>,
    learned: Option<Learned>,
    /// Pages of the node's pool, when known: the node moves the boundary
    /// in whole pages (EMB gets round(α · pages)), so a decision that
    /// rounds to the page count the node has is no move and is not sent.
    pool_pages: Option<usize>,
}

impl Allocator {
    /// An allocator for a node whose α is `alpha` now, against a p99
    /// objective of `slo_ms`.
    pub fn new(cfg: AllocatorConfig, slo_ms: f64, alpha: f64) -> Self {
        Self {
            cfg,
            slo_ms: slo_ms.max(1e-9),
            alpha,
            integral: 0.0,
            previous_error: None,
            learned: None,
            pool_pages: None,
        }
    }

    /// Decides on the node's page grid: `pages` is its pool's page count.
    pub fn with_pool_pages(self, pages: usize) -> Self {
        Self {
            pool_pages: (pages > 0).then_some(pages),
            ..self
        }
    }

    /// A `ppo-only` or `smart` allocator: its decisions come from `learned`.
    pub fn with_learned(cfg: AllocatorConfig, slo_ms: f64, alpha: f64, learned: Learned) -> Self {
        Self {
            learned: Some(learned),
            ..Self::new(cfg, slo_ms, alpha)
        }
    }

    /// Learning that waits until the decision is out (`smart`'s adapter):
    /// call after the decision's command is sent.
    pub fn learn(&mut self) {
        if let Some(l) = &mut self.learned {
            l.learn();
        }
    }

    /// Training decisions recorded since the last call (see
    /// [`AllocatorConfig::sample`]).
    pub fn take_steps(&mut self) -> Vec<ppo::Step> {
        self.learned
            .as_mut()
            .map_or_else(Vec::new, Learned::take_steps)
    }

    pub fn alpha(&self) -> f64 {
        self.alpha
    }

    /// Whether a window with statistics `w` gets a decision (else it has
    /// too few requests, or an operator pinned α, and α stays). A pinned
    /// window is not learned from either: the node would refuse its move.
    /// Failed requests count: a window of them is decided on, as the worst.
    pub fn decides(&self, w: &WindowStats) -> bool {
        w.requests >= self.cfg.min_requests && !w.pinned_end
    }

    /// The α to set after a closed epoch with statistics `w`, or None to
    /// leave it.
    pub fn decide(&mut self, w: &WindowStats) -> Option<f64> {
        if !self.decides(w) {
            if let Some(l) = &mut self.learned {
                l.skip();
            }
            return None;
        }
        // Decide from the node's α, not the last one set: a pin, a KV
        // reclaim or a move cut short by pinned pages may have changed it,
        // and a move from a stale α would jump by more than one step.
        if let Some(alpha) = w.alpha_end {
            self.alpha = alpha;
        }
        let step = match (self.cfg.policy, &mut self.learned) {
            (AllocatorPolicy::Pid, _) => self.pid_step(w),
            (AllocatorPolicy::PpoOnly | AllocatorPolicy::Smart, Some(l)) => l.decide(w, self.alpha),
            _ => return None,
        };
        let max_step = self.cfg.max_step;
        // The adapter's residual (at most ±BOUND) comes on top of the
        // policy's action, which keeps its own bound: with a zero residual
        // `smart` moves exactly as `ppo-only`, whatever max_step is.
        let base = self.learned.as_ref().and_then(Learned::uncorrected);
        let (step, bound) = match base {
            // Recomposed only when a bound binds: base + (step − base) is
            // not always step in floating point, and one ulp of α can move
            // a page and every decision after it.
            Some(base) if base.abs() > max_step || (step - base).abs() > adapter::BOUND => (
                base.clamp(-max_step, max_step)
                    + (step - base).clamp(-adapter::BOUND, adapter::BOUND),
                max_step + adapter::BOUND,
            ),
            Some(_) => (step, max_step + adapter::BOUND),
            None => (step, max_step),
        };
        let next = self.target(step, bound);
        // The adapter learns from what its correction changed in the α
        // sent, not from the correction it proposed.
        if let Some(base) = base {
            let moved = |target: Option<f64>| target.map_or(0.0, |a| a - self.alpha);
            let uncorrected = self.target(base.clamp(-max_step, max_step), bound);
            let share = moved(next) - moved(uncorrected);
            if let Some(l) = &mut self.learned {
                l.realised(share);
            }
        }
        if let Some(next) = next {
            self.alpha = next;
        }
        next
    }

    /// The α that a move of `step` (at most ±`bound`) sends, or None when
    /// it is no move on the node.
    fn target(&self, step: f64, bound: f64) -> Option<f64> {
        // A start outside [min_alpha, max_alpha] (memory.alpha is any α in
        // [0, 1]) is not pulled in by a jump: α only moves by the step,
        // and never further out.
        let lower = self.cfg.min_alpha.min(self.alpha);
        let upper = self.cfg.max_alpha.max(self.alpha);
        let next = (self.alpha + step.clamp(-bound, bound)).clamp(lower, upper);
        if (next - self.alpha).abs() < 1e-9 {
            return None;
        }
        if let Some(pages) = self.pool_pages {
            // The node's α is reported in thousandths; on a grid coarser
            // than that, rounding recovers its page count exactly.
            let on_grid = |a: f64| (a * pages as f64).round() as i64;
            if on_grid(next) == on_grid(self.alpha) {
                return None;
            }
        }
        Some(next)
    }

    /// The PID baseline's move.
    fn pid_step(&mut self, w: &WindowStats) -> f64 {
        // Relative error, clipped: one pathological window must not
        // dominate the integral. Failed requests count (a window of them
        // has no served p99).
        let p99_ms = mdp::controller_p99_ms(w, self.slo_ms);
        let error = ((p99_ms - self.slo_ms) / self.slo_ms).clamp(-1.0, 1.0);
        let derivative = self.previous_error.map_or(0.0, |p| error - p);
        self.previous_error = Some(error);
        // A bounded integral (anti-windup): after a long overload α turns
        // as soon as the error does.
        self.integral = (self.integral + error).clamp(-INTEGRAL_LIMIT, INTEGRAL_LIMIT);
        let push = self.cfg.kp * error + self.cfg.ki * self.integral + self.cfg.kd * derivative;
        (-push).clamp(-self.cfg.max_step, self.cfg.max_step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_policy_prints_as_a_config_spells_it() {
        for p in AllocatorPolicy::ALL {
            assert_eq!(p.to_string().parse::<AllocatorPolicy>(), Ok(p));
            let toml = serde_json::to_string(&p).unwrap();
            assert_eq!(toml, format!("\"{p}\""));
        }
        assert_eq!(
            "greedy".parse::<AllocatorPolicy>(),
            Err(r#""greedy" is not one of "static", "kv-opt", "pid", "ppo-only", "smart""#.into())
        );
    }

    fn window(p99_ms: f64, requests: u64) -> WindowStats {
        WindowStats {
            requests,
            p99_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_decision_that_rounds_to_the_nodes_page_count_is_not_sent() {
        // A p99 far over the SLO pushes α down to min_alpha (0.1).
        let cfg = AllocatorConfig { kp: 1.0, ..pid() };
        let hot = |alpha_end| WindowStats {
            alpha_end: Some(alpha_end),
            ..window(1000.0, 100)
        };
        // 128 pages: the node holds 13 (α 0.1015625, reported 0.102), and
        // 0.1 is 12.8 pages, 13 on the node: no move, nothing sent.
        let mut a = Allocator::new(cfg.clone(), 10.0, 0.3).with_pool_pages(128);
        assert_eq!(a.decide(&hot(0.102)), None);
        // 64 pages: 7 (α 0.109375, reported 0.109) to 6.4, so 6: a move.
        let mut a = Allocator::new(cfg.clone(), 10.0, 0.3).with_pool_pages(64);
        assert_eq!(a.decide(&hot(0.109)), Some(0.1));
        // Without the grid the no-op is sent.
        let mut a = Allocator::new(cfg, 10.0, 0.3);
        assert_eq!(a.decide(&hot(0.102)), Some(0.1));
    }

    fn pid() -> AllocatorConfig {
        AllocatorConfig {
            policy: AllocatorPolicy::Pid,
            ..Default::default()
        }
    }

    #[test]
    fn static_and_kv_opt_never_move() {
        for policy in [AllocatorPolicy::Static, AllocatorPolicy::KvOpt] {
            let cfg = AllocatorConfig {
                policy,
                ..Default::default()
            };
            let mut a = Allocator::new(cfg.clone(), 30.0, cfg.initial_alpha(0.4));
            assert_eq!(a.decide(&window(300.0, 1000)), None);
            assert!(!cfg.moves());
        }
        assert_eq!(
            AllocatorConfig {
                policy: AllocatorPolicy::KvOpt,
                ..Default::default()
            }
            .initial_alpha(0.4),
            0.0
        );
    }

    #[test]
    fn pid_moves_toward_kv_above_the_slo_and_back_below_it_within_bounds() {
        let mut a = Allocator::new(pid(), 30.0, 0.5);
        // p99 twice the SLO: error 1, push 0.05 + 0.01: α down by 0.06.
        let first = a.decide(&window(60.0, 100)).unwrap();
        assert!((first - 0.44).abs() < 1e-9, "{first}");
        // Far above: the step is capped at max_step, α floored at 0.1.
        for _ in 0..20 {
            a.decide(&window(3_000.0, 100));
        }
        assert!((a.alpha() - 0.1).abs() < 1e-9);
        // Well below the SLO: back up at once (the integral is bounded,
        // so twenty windows at the floor did not wind it up).
        let up = a.decide(&window(3.0, 100)).unwrap();
        assert!(up > 0.1, "{up}");
        // Too few requests: no decision.
        assert_eq!(a.decide(&window(3.0, 5)), None);
    }

    #[test]
    fn a_window_of_failed_requests_is_decided_on_as_the_worst_p99() {
        // 50 requests, all shed: no served latency (p99 0), all late.
        let shed = WindowStats {
            failed: 50,
            slo_violation_share: 1.0,
            ..window(0.0, 50)
        };
        let mut a = Allocator::new(pid(), 30.0, 0.5);
        // `requests` counts the failed ones: the window is decided on.
        assert!(a.decides(&shed));
        // Read as p99 ≥ 2·SLO (error 1): down by 0.06, not up.
        let down = a.decide(&shed).unwrap();
        assert!((down - 0.44).abs() < 1e-9, "{down}");
    }

    #[test]
    fn decisions_start_from_the_nodes_alpha_at_the_windows_end() {
        let mut a = Allocator::new(pid(), 30.0, 0.5);
        let low = |alpha_end| WindowStats {
            alpha_end,
            ..window(3.0, 100)
        };
        // Below the SLO: α up from 0.5.
        let up = a.decide(&low(Some(0.5))).unwrap();
        assert!(up > 0.5 && up <= 0.56 + 1e-9, "{up}");
        // An operator pinned the node at 0.3 (or a reclaim moved it): the
        // next move starts there, one step at most, not from `up`.
        let next = a.decide(&low(Some(0.3))).unwrap();
        assert!(next > 0.3 && next <= 0.36 + 1e-9, "{next}");
        assert_eq!(a.alpha(), next);
        // A window without times leaves the allocator's own α.
        let again = a.decide(&low(None)).unwrap();
        assert!(again > next && again <= next + 0.06 + 1e-9, "{again}");
    }

    #[test]
    fn a_pinned_window_gets_no_decision_and_winds_nothing_up() {
        let mut a = Allocator::new(pid(), 30.0, 0.5);
        let pinned = WindowStats {
            alpha_end: Some(0.3),
            pinned_end: true,
            ..window(300.0, 100)
        };
        assert!(!a.decides(&pinned));
        // Far over the SLO for many windows while pinned: no command (the
        // node would refuse it) and no integral wound up meanwhile.
        for _ in 0..20 {
            assert_eq!(a.decide(&pinned), None);
        }
        assert_eq!(a.alpha(), 0.5);
        // Released, below the SLO: one step up from where the pin left α.
        let released = WindowStats {
            alpha_end: Some(0.3),
            ..window(3.0, 100)
        };
        let up = a.decide(&released).unwrap();
        assert!(up > 0.3 && up <= 0.36 + 1e-9, "{up}");
    }

    #[test]
    fn a_start_outside_the_bounds_moves_by_steps_and_never_further_out() {
        // Starting at α 0 with min_alpha 0.1: below the SLO the first move
        // is one step up, not a jump to the bound plus a step.
        let mut a = Allocator::new(pid(), 30.0, 0.0);
        let up = a.decide(&window(3.0, 100)).unwrap();
        assert!(up > 0.0 && up <= 0.06 + 1e-9, "{up}");
        // Starting at α 1 above the SLO: down by one step.
        let mut a = Allocator::new(pid(), 30.0, 1.0);
        let down = a.decide(&window(300.0, 100)).unwrap();
        assert!((down - 0.94).abs() < 1e-9, "{down}");
        // Starting at α 0, above the SLO: the step points further out, so
        // α stays (it is never pushed below 0 nor under where it is).
        let mut a = Allocator::new(pid(), 30.0, 0.0);
        assert_eq!(a.decide(&window(300.0, 100)), None);
        assert_eq!(a.alpha(), 0.0);
    }

    /// `smart` on a fresh policy (it holds α: every move is the adapter's
    /// exploring correction), at `alpha`.
    fn smart(alpha: f64) -> Allocator {
        let cfg = AllocatorConfig {
            policy: AllocatorPolicy::Smart,
            ..Default::default()
        };
        let policy = std::sync::Arc::new(ppo::ActorCritic::new(1));
        let learned = Learned::new(policy, 1024, 30.0, true, false, 7);
        Allocator::with_learned(cfg, 30.0, alpha, learned)
    }

    /// A window within the SLO and too few hot users for a burst.
    fn calm(i: usize, alpha_end: f64) -> WindowStats {
        WindowStats {
            hot_user_share: 0.1,
            alpha_end: Some(alpha_end),
            ..window(20.0 + (i % 3) as f64, 100)
        }
    }

    #[test]
    fn the_adapter_learns_from_the_correction_sent_not_the_one_proposed() {
        // Three ways a correction is not sent: α at max_alpha (up is
        // clamped away), histories truncated (up is masked), and a page
        // grid coarser than any correction (no move on the node).
        let at_max = (smart(0.9), 0.9, 0.0);
        let truncated = (smart(0.5), 0.5, 0.2);
        let coarse = (smart(0.5).with_pool_pages(8), 0.5, 0.0);
        for (case, (mut a, alpha, truncated_share)) in
            [at_max, truncated, coarse].into_iter().enumerate()
        {
            let mut sent = Vec::new();
            for i in 0..40 {
                let w = WindowStats {
                    truncated_share,
                    ..calm(i, alpha)
                };
                sent.push(a.decide(&w).map_or(0.0, |next| next - alpha));
                a.learn();
            }
            let l = a.learned.as_ref().unwrap();
            let recorded = l.adapter().unwrap().samples();
            // Each decision's sample arrives with the next window.
            assert_eq!(recorded.len(), 39, "case {case}");
            for (i, ((applied, _), moved)) in recorded.iter().zip(&sent).enumerate() {
                assert!(
                    (applied - moved).abs() < 1e-12,
                    "case {case}, decision {i}: recorded {applied}, sent {moved}"
                );
            }
            match case {
                0 | 1 => assert!(sent.iter().all(|m| *m <= 0.0), "case {case}: {sent:?}"),
                _ => assert!(sent.iter().all(|m| *m == 0.0), "{sent:?}"),
            }
        }
    }

    #[test]
    fn a_window_without_a_decision_drops_the_correction_waiting_for_its_reward() {
        let few = WindowStats {
            requests: 5,
            ..calm(1, 0.5)
        };
        let pinned = WindowStats {
            pinned_end: true,
            ..calm(1, 0.5)
        };
        for skipped in [few, pinned] {
            let mut a = smart(0.5);
            let buffered =
                |a: &Allocator| a.learned.as_ref().unwrap().adapter().unwrap().buffered();
            a.decide(&calm(0, 0.5));
            a.learn();
            assert_eq!(a.decide(&skipped), None);
            // The first correction is not credited with this reward.
            a.decide(&calm(2, 0.5));
            assert_eq!(buffered(&a), 0);
            a.learn();
            a.decide(&calm(3, 0.5));
            assert_eq!(buffered(&a), 1);
        }
    }

    #[test]
    fn bad_settings_are_refused_by_name() {
        let cfg = AllocatorConfig {
            min_alpha: 0.8,
            max_alpha: 0.2,
            ..Default::default()
        };
        assert_eq!(cfg.validate().unwrap_err().0, "allocator.min_alpha");
        // An out-of-range bound is named by its own key.
        let named = |min_alpha: f64, max_alpha: f64| {
            let cfg = AllocatorConfig {
                min_alpha,
                max_alpha,
                ..Default::default()
            };
            cfg.validate().unwrap_err().0
        };
        assert_eq!(named(0.1, 1.5), "allocator.max_alpha");
        assert_eq!(named(0.1, f64::NAN), "allocator.max_alpha");
        assert_eq!(named(-0.1, 0.9), "allocator.min_alpha");
        assert_eq!(named(f64::NAN, 0.9), "allocator.min_alpha");
        assert!(
            "ppo"
                .parse::<AllocatorPolicy>()
                .unwrap_err()
                .contains("pid")
        );
        assert_eq!("kv-opt".parse(), Ok(AllocatorPolicy::KvOpt));
    }
}
