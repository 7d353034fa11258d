//! Synthetic GR workloads in the three regimes of HLEM §V.
//!
//! - Zipf user activity (inside the hot 5% of users and inside the rest)
//!   and Zipf item popularity; popular item ids are spread over the id space.
//! - Every user starts with a history of `min_history..=max_history` items
//!   (log-uniform); each request of the user appends the item picked next
//!   (the label), so a later request's history extends an earlier prefix.
//! - `candidates` (100) per request: the label plus popularity-sampled
//!   negatives, de-duplicated, shuffled.
//! - Poisson arrivals at `rps`. The regimes move the hot users' share of
//!   requests: Steady keeps it at 0.20; Trend raises it linearly from 0.20
//!   to 0.50 over the trace; Burst keeps 0.20 but spikes to 0.50, with
//!   arrivals ×2, in bursts whose onsets are Poisson (mean gap 15 s) and
//!   that last 3–5 decision windows of 5 s, aligned to window boundaries.
//!
//! ChaCha8 and IEEE `+ − × ÷` only (see [`crate::detmath`]): the same config
//! gives the same trace on every machine.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::detmath;
use crate::sampling::{
    Weighted, below, candidates, catalog, exponential, permutation, table_rows, unit,
};
use crate::schema::{Mode, Request, Trace, TraceMeta, UserHistory};

/// Workload regime (HLEM §V).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Regime {
    /// Stable hot-user share.
    Steady,
    /// Hot-user share rising over time.
    Trend,
    /// Hot-user spikes lasting 3–5 decision windows.
    Burst,
}

impl std::str::FromStr for Regime {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "steady" => Ok(Regime::Steady),
            "trend" => Ok(Regime::Trend),
            "burst" => Ok(Regime::Burst),
            other => Err(format!(
                "unknown regime {other:?} (expected steady|trend|burst)"
            )),
        }
    }
}

impl Regime {
    pub fn as_str(self) -> &'static str {
        match self {
            Regime::Steady => "steady",
            Regime::Trend => "trend",
            Regime::Burst => "burst",
        }
    }
}

/// Parameters of a synthetic trace; `Default` is `grflow gen-trace`'s
/// (Steady, 12,000 requests at 200 rps ≈ 60 s of event time, no retrieve
/// requests). `grflow replay` generates from its config's `[trace]`
/// section instead (Burst, 140 rps, 20% retrieve by default).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GenConfig {
    pub regime: Regime,
    pub users: u64,
    pub items: u32,
    pub requests: u64,
    /// Mean arrival rate outside bursts.
    pub rps: f64,
    pub seed: u64,
    /// Embedding tables T (table 0 is the item id itself).
    pub tables: u16,
    pub candidates: usize,
    pub codebook_size: u16,
    /// Share of requests in generative-retrieval mode.
    pub retrieve_share: f64,
    /// Zipf exponents of user activity and item popularity.
    pub user_zipf: f64,
    pub item_zipf: f64,
    /// Bounds of a user's initial history length.
    pub min_history: u32,
    pub max_history: u32,
}

impl Default for GenConfig {
    fn default() -> Self {
        Self {
            regime: Regime::Steady,
            users: 3_000,
            items: 20_000,
            requests: 12_000,
            rps: 200.0,
            seed: 42,
            tables: 4,
            candidates: 100,
            codebook_size: 256,
            retrieve_share: 0.0,
            user_zipf: 0.7,
            item_zipf: 1.05,
            min_history: 10,
            max_history: 120,
        }
    }
}

/// The longest user history the generator makes.
pub const MAX_HISTORY: u32 = 1_000_000;

/// The most users, and items, the generator makes: each is held in
/// memory from the start (a user's history, an item's features), so a
/// count past this is a typo that would abort when memory runs out.
pub const MAX_USERS: u64 = 100_000_000;

/// The longest span of event time a generated trace covers, in seconds.
pub const MAX_SPAN_S: f64 = 1e8;
pub const MAX_ITEMS: u32 = 100_000_000;
/// The most feature ids the catalog holds (items × tables, 4 bytes each):
/// 1.6 GB, the 100M-item catalog with the default 4 tables.
pub const MAX_FEATURE_IDS: u64 = 400_000_000;
/// The most candidate ids of a trace's requests (4 GB).
pub const MAX_CANDIDATE_IDS: u64 = 1_000_000_000;

/// Why a generator config is unusable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum GenError {
    #[error("--{field} must be {rule} (got {value})")]
    Invalid {
        field: &'static str,
        rule: &'static str,
        value: String,
    },
}

impl GenConfig {
    /// Checks every field; the error names the CLI flag.
    pub fn validate(&self) -> Result<(), GenError> {
        let bad = |field, rule, value: String| Err(GenError::Invalid { field, rule, value });
        if !(20..=MAX_USERS).contains(&self.users) {
            return bad(
                "users",
                ">= 20 and at most 100000000",
                self.users.to_string(),
            );
        }
        if self.items > MAX_ITEMS {
            return bad("items", "at most 100000000", self.items.to_string());
        }
        if (self.items as usize) <= self.candidates {
            return bad(
                "items",
                "more than the candidates per request",
                self.items.to_string(),
            );
        }
        if self.requests == 0 {
            return bad("requests", ">= 1", "0".into());
        }
        if !(self.rps.is_finite() && self.rps > 0.0) {
            return bad("rps", "a finite number > 0", self.rps.to_string());
        }
        // The regimes' schedules (bursts, trend) are laid over the trace's
        // span up front: a span of ages is a typo, not a workload.
        if self.requests as f64 / self.rps > MAX_SPAN_S {
            return bad(
                "rps",
                "such that requests / rps is at most 1e8 s (about 3 years)",
                self.rps.to_string(),
            );
        }
        if self.tables == 0 {
            return bad("tables", ">= 1", "0".into());
        }
        if self.items as u64 * self.tables as u64 > MAX_FEATURE_IDS {
            return bad(
                "tables",
                "such that items × tables is at most 400000000",
                self.tables.to_string(),
            );
        }
        if (self.codebook_size as u64).pow(3) < self.items as u64 {
            return bad(
                "codebook-size",
                "such that codebook_size³ >= items",
                self.codebook_size.to_string(),
            );
        }
        if self.candidates == 0 {
            return bad("candidates", ">= 1", "0".into());
        }
        // Every request's candidates are held in memory (4 bytes each).
        if self.requests.saturating_mul(self.candidates as u64) > MAX_CANDIDATE_IDS {
            return bad(
                "candidates",
                "such that requests × candidates is at most 1000000000",
                self.candidates.to_string(),
            );
        }
        // Every user's history is generated up front: past this it is a
        // typo that would run until memory is gone.
        if self.max_history > MAX_HISTORY {
            return bad(
                "max-history",
                "at most 1000000",
                self.max_history.to_string(),
            );
        }
        if self.min_history == 0 || self.max_history < self.min_history {
            return bad(
                "min-history",
                ">= 1 and <= max-history",
                format!("{}..{}", self.min_history, self.max_history),
            );
        }
        for (field, v) in [("user-zipf", self.user_zipf), ("item-zipf", self.item_zipf)] {
            if !(v.is_finite() && v >= 0.0) {
                return bad(field, ">= 0", v.to_string());
            }
        }
        if !(0.0..=1.0).contains(&self.retrieve_share) {
            return bad(
                "retrieve-share",
                "in [0, 1]",
                self.retrieve_share.to_string(),
            );
        }
        Ok(())
    }

    /// Rows of each embedding table (see [`crate::sampling::table_rows`]).
    pub fn table_rows(&self) -> Vec<u32> {
        table_rows(self.items, self.tables)
    }
}

/// Hot-user share of requests and arrival-rate factor over event time.
#[derive(Debug)]
struct Schedule {
    regime: Regime,
    duration_s: f64,
    /// Burst intervals [start, end) in seconds, aligned to decision windows.
    bursts: Vec<(f64, f64)>,
}

/// HLEM decision window (s): bursts last a whole number of them.
const WINDOW_S: f64 = 5.0;
/// Hot-user share of requests: Steady, the start of Trend and Burst's
/// baseline sit near HLEM Fig. 15's Steady point (≈ 0.20); Trend ends and
/// Burst spikes near its Burst point (≈ 0.50).
const BASE_HOT_SHARE: f64 = 0.20;
const PEAK_HOT_SHARE: f64 = 0.50;
/// Arrivals speed up this much during a burst.
const BURST_RATE_FACTOR: f64 = 2.0;
/// Mean quiet time before and between bursts (s).
const BURST_MEAN_GAP_S: f64 = 15.0;
/// Event time kept free after the last burst, for the noise of Poisson arrivals (s).
const BURST_END_MARGIN_S: f64 = 2.0;

impl Schedule {
    fn new(cfg: &GenConfig, rng: &mut ChaCha8Rng) -> Self {
        let duration_s = cfg.requests as f64 / cfg.rps;
        let mut bursts = Vec::new();
        if cfg.regime == Regime::Burst {
            // Burst onsets form a Poisson process after two quiet windows;
            // each burst starts on a window boundary and lasts 3–5 windows.
            // A burst second uses BURST_RATE_FACTOR seconds' worth of
            // requests, so a burst is kept only if it ends before the
            // requests run out (with a margin for arrival noise): every
            // burst in the trace is complete.
            let budget = |start: f64, len: f64, earlier: f64| {
                start + earlier * (BURST_RATE_FACTOR - 1.0) + len * BURST_RATE_FACTOR
            };
            let limit = duration_s - BURST_END_MARGIN_S;
            let mut earlier = 0.0;
            let mut t = 2.0 * WINDOW_S;
            loop {
                t += exponential(rng, 1.0 / BURST_MEAN_GAP_S);
                let start = (t / WINDOW_S).ceil() * WINDOW_S;
                let len = (3 + below(rng, 3)) as f64 * WINDOW_S;
                if budget(start, len, earlier) > limit {
                    // A short trace still gets one burst, at the latest
                    // boundary where it fits, if one fits at all.
                    let len = 3.0 * WINDOW_S;
                    let latest = ((limit - len * BURST_RATE_FACTOR) / WINDOW_S).floor() * WINDOW_S;
                    if !bursts.is_empty() || latest < 2.0 * WINDOW_S {
                        break;
                    }
                    bursts.push((latest, latest + len));
                    break;
                }
                bursts.push((start, start + len));
                earlier += len;
                t = start + len;
            }
        }
        Self {
            regime: cfg.regime,
            duration_s,
            bursts,
        }
    }

    fn in_burst(&self, t_s: f64) -> bool {
        self.bursts.iter().any(|&(a, b)| t_s >= a && t_s < b)
    }

    fn hot_share(&self, t_s: f64) -> f64 {
        match self.regime {
            Regime::Steady => BASE_HOT_SHARE,
            Regime::Trend => {
                BASE_HOT_SHARE
                    + (PEAK_HOT_SHARE - BASE_HOT_SHARE) * (t_s / self.duration_s).clamp(0.0, 1.0)
            }
            Regime::Burst if self.in_burst(t_s) => PEAK_HOT_SHARE,
            Regime::Burst => BASE_HOT_SHARE,
        }
    }

    fn rate_factor(&self, t_s: f64) -> f64 {
        if self.regime == Regime::Burst && self.in_burst(t_s) {
            BURST_RATE_FACTOR
        } else {
            1.0
        }
    }
}

/// Generates a whole trace. Deterministic in `cfg` (ChaCha8 seeded with
/// `cfg.seed`, IEEE arithmetic only). Call [`GenConfig::validate`] first:
/// an invalid config panics.
pub fn generate(cfg: &GenConfig) -> Trace {
    generate_with_schedule(cfg).0
}

/// The trace and the regime schedule it was drawn from.
fn generate_with_schedule(cfg: &GenConfig) -> (Trace, Schedule) {
    cfg.validate().expect("generate needs a valid GenConfig");
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed);
    let items = catalog(cfg.items, cfg.tables, cfg.codebook_size, &mut rng);
    let item_pop = Weighted::zipf(cfg.items as usize, cfg.item_zipf);
    // Popularity rank r is item `perm[r]`, so popular ids are spread over
    // the id space (and over the row-range shards of table 0).
    let perm = permutation(cfg.items as usize, &mut rng);

    // Users 0..n_hot are the hot 5%; activity is Zipf inside each group.
    let n_users = cfg.users as usize;
    let n_hot = hot_users(cfg.users) as usize;
    let hot = Weighted::zipf(n_hot, cfg.user_zipf);
    let cold = Weighted::zipf(n_users - n_hot, cfg.user_zipf);

    // Initial histories: log-uniform length in [min_history, max_history].
    let (lo, hi) = (cfg.min_history as f64, cfg.max_history as f64);
    let mut histories: Vec<Vec<u32>> = (0..n_users)
        .map(|_| {
            let len = (lo * detmath::exp(unit(&mut rng) * detmath::ln(hi / lo))) as usize;
            (0..len.max(1))
                .map(|_| perm[item_pop.sample(&mut rng)])
                .collect()
        })
        .collect();

    let schedule = Schedule::new(cfg, &mut rng);
    let mut requests = Vec::with_capacity(cfg.requests as usize);
    let mut t_s = 0.0;
    for _ in 0..cfg.requests {
        t_s += exponential(&mut rng, cfg.rps * schedule.rate_factor(t_s));
        let user = if unit(&mut rng) < schedule.hot_share(t_s) {
            hot.sample(&mut rng)
        } else {
            n_hot + cold.sample(&mut rng)
        };
        let history = &mut histories[user];
        let hist_len = history.len() as u32;
        // The true next item; the request's history is everything before it.
        let label = perm[item_pop.sample(&mut rng)];
        history.push(label);
        let candidates = candidates(label, cfg.candidates, &item_pop, &perm, &mut rng);
        let mode = if unit(&mut rng) < cfg.retrieve_share {
            Mode::Retrieve
        } else {
            Mode::Rank
        };
        requests.push(Request {
            ts_ms: (t_s * 1000.0) as u64,
            req_id: 0,
            user_id: user as u64,
            hist_len,
            candidates,
            mode,
            label: Some(label),
        });
    }
    // Generation order breaks ties, then req_id is the row number.
    requests.sort_by_key(|r| (r.ts_ms, r.user_id));
    for (i, r) in requests.iter_mut().enumerate() {
        r.req_id = i as u64;
    }
    let users = histories
        .into_iter()
        .enumerate()
        .map(|(u, items)| UserHistory {
            user_id: u as u64,
            items,
        })
        .collect();
    let trace = Trace {
        meta: Some(TraceMeta {
            n_tables: cfg.tables,
            table_rows: table_rows(cfg.items, cfg.tables),
            codebook_size: cfg.codebook_size,
            source: format!(
                "grflow gen-trace --regime {} --users {} --items {} --requests {} --rps {} --seed {} --tables {} --retrieve-share {} --codebook-size {} --candidates {} --min-history {} --max-history {}",
                cfg.regime.as_str(),
                cfg.users,
                cfg.items,
                cfg.requests,
                cfg.rps,
                cfg.seed,
                cfg.tables,
                cfg.retrieve_share,
                cfg.codebook_size,
                cfg.candidates,
                cfg.min_history,
                cfg.max_history
            ),
        }),
        requests,
        users,
        items,
    };
    (trace, schedule)
}

/// Number of hot users: the top 5% by activity (at least one).
pub fn hot_users(users: u64) -> u64 {
    (users / 20).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small(regime: Regime) -> GenConfig {
        GenConfig {
            regime,
            users: 200,
            items: 1_000,
            requests: 4_000,
            rps: 50.0,
            ..GenConfig::default()
        }
    }

    #[test]
    fn same_seed_same_trace() {
        let a = generate(&small(Regime::Burst));
        let b = generate(&small(Regime::Burst));
        assert_eq!(a, b);
        let c = generate(&GenConfig {
            seed: 43,
            ..small(Regime::Burst)
        });
        assert_ne!(a.requests, c.requests);
    }

    #[test]
    fn requests_extend_their_users_history() {
        let t = generate(&small(Regime::Steady));
        assert_eq!(t.requests.len(), 4_000);
        let mut last_len = std::collections::BTreeMap::new();
        for (i, r) in t.requests.iter().enumerate() {
            assert_eq!(r.req_id, i as u64, "req_id is the row number");
            let user = &t.users[r.user_id as usize];
            let label = r.label.unwrap();
            assert_eq!(
                user.items[r.hist_len as usize], label,
                "label is the next interaction"
            );
            assert!(r.hist_len >= 10);
            assert_eq!(r.candidates.len(), 100);
            assert_eq!(r.candidates.iter().filter(|&&c| c == label).count(), 1);
            if let Some(prev) = last_len.insert(r.user_id, r.hist_len) {
                assert_eq!(
                    r.hist_len,
                    prev + 1,
                    "each request extends the previous prefix by one"
                );
            }
        }
        assert!(
            t.requests
                .windows(2)
                .all(|w| (w[0].ts_ms, w[0].user_id) <= (w[1].ts_ms, w[1].user_id))
        );
        let span_s = t.requests.last().unwrap().ts_ms as f64 / 1e3;
        assert!(
            (70.0..90.0).contains(&span_s),
            "Poisson at 50 rps: 4000 requests ≈ 80 s, got {span_s}"
        );
    }

    #[test]
    fn retrieve_share_sets_modes() {
        let t = generate(&GenConfig {
            retrieve_share: 0.25,
            ..small(Regime::Steady)
        });
        let retrieve = t
            .requests
            .iter()
            .filter(|r| r.mode == Mode::Retrieve)
            .count() as f64
            / 4_000.0;
        assert!((0.2..0.3).contains(&retrieve), "{retrieve}");
    }

    fn hot_share(t: &Trace, from_s: f64, to_s: f64) -> f64 {
        let n_hot = hot_users(t.users.len() as u64);
        let rs: Vec<_> = t
            .requests
            .iter()
            .filter(|r| (r.ts_ms as f64) >= from_s * 1e3 && (r.ts_ms as f64) < to_s * 1e3)
            .collect();
        rs.iter().filter(|r| r.user_id < n_hot).count() as f64 / rs.len().max(1) as f64
    }

    #[test]
    fn steady_and_trend_move_the_hot_user_share() {
        let steady = generate(&small(Regime::Steady));
        let (a, b) = (
            hot_share(&steady, 0.0, 30.0),
            hot_share(&steady, 40.0, 70.0),
        );
        assert!(
            (a - b).abs() < 0.06 && (0.15..0.25).contains(&a),
            "steady stays near 0.20: {a} vs {b}"
        );
        let trend = generate(&small(Regime::Trend));
        let (a, b) = (hot_share(&trend, 0.0, 15.0), hot_share(&trend, 60.0, 80.0));
        assert!(b > a + 0.15, "trend rises: {a} -> {b}");
    }

    #[test]
    fn bursts_last_three_to_five_windows_and_spike_hot_users() {
        let cfg = GenConfig {
            requests: 20_000,
            ..small(Regime::Burst)
        };
        let mut rng = ChaCha8Rng::seed_from_u64(1);
        let s = Schedule::new(&cfg, &mut rng);
        assert!(s.bursts.len() >= 3, "{:?}", s.bursts);
        for (a, b) in &s.bursts {
            assert_eq!(a % WINDOW_S, 0.0, "bursts start on a window boundary");
            let windows = (b - a) / WINDOW_S;
            assert!(
                [3.0, 4.0, 5.0].contains(&windows),
                "bursts last 3–5 windows: {windows}"
            );
        }
        for seed in 0..12 {
            let cfg = GenConfig {
                regime: Regime::Burst,
                seed,
                ..GenConfig::default()
            };
            let s = Schedule::new(&cfg, &mut ChaCha8Rng::seed_from_u64(seed));
            assert!(
                !s.bursts.is_empty(),
                "the default burst trace holds a burst (seed {seed})"
            );
            let t = generate(&cfg);
            let end_s = t.requests.last().unwrap().ts_ms as f64 / 1e3;
            let (_, last_end) = s.bursts.last().copied().unwrap();
            assert!(
                last_end <= end_s + 1.0,
                "bursts are complete: ends {last_end} s, trace {end_s} s (seed {seed})"
            );
        }
        let t = generate(&small(Regime::Burst));
        // The 15 s with the highest hot share (a burst) stand well above the whole trace.
        let whole = hot_share(&t, 0.0, 1e9);
        let peak = (0..16)
            .map(|k| hot_share(&t, k as f64 * 5.0, k as f64 * 5.0 + 15.0))
            .fold(0.0, f64::max);
        assert!(
            peak > whole + 0.12,
            "a burst spikes the hot share: peak {peak}, overall {whole}"
        );
    }

    #[test]
    fn default_trace_fits_the_embedded_default() {
        let t = generate(&GenConfig::default());
        assert_eq!(t.requests.len(), 12_000);
        assert!(
            t.requests.last().unwrap().ts_ms >= 55_000,
            "about 60 s of event time"
        );
        let lens: Vec<u32> = t.requests.iter().map(|r| r.hist_len).collect();
        let max = *lens.iter().max().unwrap();
        let min = *lens.iter().min().unwrap();
        assert!(min >= 10 && max <= 600, "histories {min}..{max}");
    }

    #[test]
    fn the_recorded_source_names_every_setting_that_shapes_the_trace() {
        let cfg = GenConfig {
            users: 100,
            requests: 50,
            codebook_size: 512,
            candidates: 20,
            min_history: 200,
            max_history: 300,
            ..GenConfig::default()
        };
        let source = generate(&cfg).meta.unwrap().source;
        for flag in [
            "--users 100",
            "--requests 50",
            "--codebook-size 512",
            "--candidates 20",
            "--min-history 200",
            "--max-history 300",
        ] {
            assert!(source.contains(flag), "{flag} missing from {source}");
        }
    }

    #[test]
    fn bad_config_names_the_flag() {
        let err = GenConfig {
            rps: 0.0,
            ..GenConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("--rps"));
        let err = GenConfig {
            items: 50,
            ..GenConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("--items"));
        let err = GenConfig {
            max_history: 4_000_000_000,
            ..GenConfig::default()
        }
        .validate()
        .unwrap_err();
        assert!(err.to_string().contains("--max-history"), "{err}");
        // Counts held in memory up front: a typo is refused, not an abort.
        for (cfg, flag) in [
            (
                GenConfig {
                    rps: 1e-300,
                    regime: Regime::Burst,
                    ..GenConfig::default()
                },
                "--rps",
            ),
            (
                GenConfig {
                    users: 100_000_000_000,
                    ..GenConfig::default()
                },
                "--users",
            ),
            (
                GenConfig {
                    items: 4_000_000_000,
                    codebook_size: 2_000,
                    ..GenConfig::default()
                },
                "--items",
            ),
            (
                GenConfig {
                    items: 200_000,
                    candidates: 100_000,
                    requests: 12_000,
                    ..GenConfig::default()
                },
                "--candidates",
            ),
            (
                GenConfig {
                    tables: 65_535,
                    items: 10_000_000,
                    ..GenConfig::default()
                },
                "--tables",
            ),
        ] {
            let err = cfg.validate().unwrap_err();
            assert!(err.to_string().contains(flag), "{err}");
        }
    }
}
