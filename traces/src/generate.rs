//! Synthetic GR workloads in the three regimes of HLEM §V.
//!
//! - Zipf user activity (inside the hot 5% of users and inside the rest)
//!   and Zipf item popularity; popular item ids are spread over the id space.
//! - Every user starts with a history of `min_history..max_history` items:
//!   log-uniform and half-open, `min_history <= len < max_history` (the
//!   length is ⌊min · (max/min)^u⌋ with u in [0, 1), so `max_history` is
//!   reached only when float rounding at the very top of u's range carries
//!   it up, odds about 1e-13 per user; exactly `min_history` when the two
//!   are equal); each request of the user appends the item picked next
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
    /// Bounds of a user's initial history length, half-open:
    /// `min_history <= len < max_history` (`min_history` when equal).
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
/// The most items of the users' initial histories, bounded as users ×
/// max_history (4 bytes each, 4 GB; every request then adds one): the
/// largest shipped config, `configs/paper-*.toml`, uses 4,000 × 2,048.
pub const MAX_HISTORY_ITEMS: u64 = 1_000_000_000;
/// The most requests of a trace: each is held in memory as a record of
/// about 64 bytes besides its candidates (3.2 GB at this count).
pub const MAX_REQUESTS: u64 = 50_000_000;

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
        if !(1..=MAX_REQUESTS).contains(&self.requests) {
            return bad(
                "requests",
                ">= 1 and at most 50000000",
                self.requests.to_string(),
            );
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
        check_feature_ids(self.items as u64, self.tables)?;
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
        check_candidate_ids(self.requests, self.candidates)?;
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
        // Every user's initial history is drawn up front, up to max_history
        // items each (4 bytes per item).
        if self.users.saturating_mul(self.max_history as u64) > MAX_HISTORY_ITEMS {
            return bad(
                "max-history",
                "such that users × max-history is at most 1000000000",
                format!("{} with {} users", self.max_history, self.users),
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

    /// Whether this is a Burst config too short for any burst: its
    /// requests span less than [`MIN_BURST_SPAN_S`] of event time, so the
    /// trace holds no burst and is statistically Steady. Short Burst traces
    /// are allowed (tests and small replays use them); `gen-trace` warns
    /// and the trace's `source` says "no burst fits".
    pub fn no_burst_fits(&self) -> bool {
        self.regime == Regime::Burst
            && latest_short_burst(self.requests as f64 / self.rps).is_none()
    }

    /// The warning for a Burst config without room for a burst (see
    /// [`GenConfig::no_burst_fits`]), naming the settings as the caller's
    /// user writes them ([`GEN_TRACE_FLAGS`], or a config's keys); `None`
    /// otherwise.
    pub fn burst_warning(&self, names: &BurstSettingNames) -> Option<String> {
        let BurstSettingNames {
            regime,
            requests,
            rps,
        } = names;
        self.no_burst_fits().then(|| {
            format!(
                "warning: {regime}: {requests} {} at {rps} {} span {:.1} s of event time, \
                 less than the {MIN_BURST_SPAN_S} s a burst needs, so the trace holds no burst \
                 (its source says \"no burst fits\"); raise {requests} or lower {rps}",
                self.requests,
                self.rps,
                self.requests as f64 / self.rps
            )
        })
    }

    /// Rows of each embedding table (see [`crate::sampling::table_rows`]).
    pub fn table_rows(&self) -> Vec<u32> {
        table_rows(self.items, self.tables)
    }
}

/// How a burst warning names the regime, request count and rate settings.
#[derive(Clone, Copy, Debug)]
pub struct BurstSettingNames {
    pub regime: &'static str,
    pub requests: &'static str,
    pub rps: &'static str,
}

/// `gen-trace`'s flags.
pub const GEN_TRACE_FLAGS: BurstSettingNames = BurstSettingNames {
    regime: "--regime burst",
    requests: "--requests",
    rps: "--rps",
};

/// Refuses a catalog of more than [`MAX_FEATURE_IDS`] feature ids (items ×
/// tables), held in memory up front; the error names `--tables`. Shared by
/// the generator and the importers.
pub fn check_feature_ids(items: u64, tables: u16) -> Result<(), GenError> {
    if items.saturating_mul(tables as u64) > MAX_FEATURE_IDS {
        return Err(GenError::Invalid {
            field: "tables",
            rule: "such that items × tables is at most 400000000",
            value: format!("{tables} with {items} items"),
        });
    }
    Ok(())
}

/// Refuses requests whose candidates add up to more than
/// [`MAX_CANDIDATE_IDS`] (4 bytes each, all held in memory); the error
/// names `--candidates`. Shared by the generator and the importers.
pub fn check_candidate_ids(requests: u64, candidates: usize) -> Result<(), GenError> {
    if requests.saturating_mul(candidates as u64) > MAX_CANDIDATE_IDS {
        return Err(GenError::Invalid {
            field: "candidates",
            rule: "such that requests × candidates is at most 1000000000",
            value: format!("{candidates} with {requests} requests"),
        });
    }
    Ok(())
}

/// Hot-user share of requests and arrival-rate factor over event time.
#[derive(Debug)]
struct Schedule {
    regime: Regime,
    duration_s: f64,
    /// Burst intervals [start, end) in seconds, aligned to decision windows,
    /// in time order and disjoint.
    bursts: Vec<(f64, f64)>,
    /// The first burst that has not ended by the last time asked about:
    /// arrival times only grow, so each lookup resumes here and a trace of
    /// many bursts costs O(requests + bursts), not their product.
    next_burst: usize,
    /// The last time asked about (checked in debug builds).
    last_t_s: f64,
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
/// The shortest burst (s).
const SHORT_BURST_S: f64 = 3.0 * WINDOW_S;
/// The shortest span of event time (requests / rps, s) that holds a burst:
/// two quiet windows, a 3-window burst at double rate (which uses twice its
/// length in requests) and the end margin: 42 s.
pub const MIN_BURST_SPAN_S: f64 =
    2.0 * WINDOW_S + SHORT_BURST_S * BURST_RATE_FACTOR + BURST_END_MARGIN_S;

/// The latest window boundary at which a shortest burst still ends before
/// the requests of `duration_s` run out, or `None` when that is inside the
/// two quiet windows at the start (the trace is shorter than
/// [`MIN_BURST_SPAN_S`]): then no burst fits.
fn latest_short_burst(duration_s: f64) -> Option<f64> {
    let limit = duration_s - BURST_END_MARGIN_S;
    let latest = ((limit - SHORT_BURST_S * BURST_RATE_FACTOR) / WINDOW_S).floor() * WINDOW_S;
    (latest >= 2.0 * WINDOW_S).then_some(latest)
}

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
                    // boundary where it fits, if one fits at all (none
                    // below MIN_BURST_SPAN_S: see GenConfig::no_burst_fits).
                    if bursts.is_empty()
                        && let Some(latest) = latest_short_burst(duration_s)
                    {
                        bursts.push((latest, latest + SHORT_BURST_S));
                    }
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
            next_burst: 0,
            last_t_s: 0.0,
        }
    }

    /// Whether `t_s` falls in a burst. Times must not decrease from one
    /// call to the next (arrival times); then this is
    /// `bursts.iter().any(|&(a, b)| t_s >= a && t_s < b)`.
    fn in_burst(&mut self, t_s: f64) -> bool {
        debug_assert!(
            t_s >= self.last_t_s,
            "times go backwards: {t_s} after {}",
            self.last_t_s
        );
        self.last_t_s = t_s;
        while self
            .bursts
            .get(self.next_burst)
            .is_some_and(|&(_, b)| t_s >= b)
        {
            self.next_burst += 1;
        }
        self.bursts
            .get(self.next_burst)
            .is_some_and(|&(a, b)| t_s >= a && t_s < b)
    }

    fn hot_share(&mut self, t_s: f64) -> f64 {
        let regime = self.regime;
        match regime {
            Regime::Steady => BASE_HOT_SHARE,
            Regime::Trend => {
                BASE_HOT_SHARE
                    + (PEAK_HOT_SHARE - BASE_HOT_SHARE) * (t_s / self.duration_s).clamp(0.0, 1.0)
            }
            Regime::Burst if self.in_burst(t_s) => PEAK_HOT_SHARE,
            Regime::Burst => BASE_HOT_SHARE,
        }
    }

    fn rate_factor(&mut self, t_s: f64) -> f64 {
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

    // Initial histories: log-uniform length in [min_history, max_history)
    // (u < 1 and the floor keep max_history out of reach but for rounding
    // at the top 1e-13 of u's range).
    let (lo, hi) = (cfg.min_history as f64, cfg.max_history as f64);
    let mut histories: Vec<Vec<u32>> = (0..n_users)
        .map(|_| {
            let len = (lo * detmath::exp(unit(&mut rng) * detmath::ln(hi / lo))) as usize;
            (0..len.max(1))
                .map(|_| perm[item_pop.sample(&mut rng)])
                .collect()
        })
        .collect();

    let mut schedule = Schedule::new(cfg, &mut rng);
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
    let users = UserHistory::numbered(histories);
    // A Burst trace too short for a burst says so: it is statistically Steady.
    let no_burst = schedule.regime == Regime::Burst && schedule.bursts.is_empty();
    debug_assert_eq!(no_burst, cfg.no_burst_fits());
    let note = if no_burst {
        format!(
            ": no burst fits ({:.1} s of event time, a burst needs {MIN_BURST_SPAN_S} s)",
            schedule.duration_s
        )
    } else {
        String::new()
    };
    let trace = Trace {
        meta: Some(TraceMeta {
            n_tables: cfg.tables,
            table_rows: table_rows(cfg.items, cfg.tables),
            codebook_size: cfg.codebook_size,
            source: format!(
                "grflow gen-trace --regime {} --users {} --items {} --requests {} --rps {} --seed {} --tables {} --retrieve-share {} --codebook-size {} --candidates {} --min-history {} --max-history {}{note}",
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
            // 3000 users × 1M items of history: 12 GB, used to abort.
            (
                GenConfig {
                    min_history: 1_000_000,
                    max_history: 1_000_000,
                    ..GenConfig::default()
                },
                "--max-history",
            ),
            // 1e9 request records of 64 bytes: used to abort.
            (
                GenConfig {
                    requests: 1_000_000_000,
                    candidates: 1,
                    rps: 1e6,
                    ..GenConfig::default()
                },
                "--requests",
            ),
        ] {
            let err = cfg.validate().unwrap_err();
            assert!(err.to_string().contains(flag), "{err}");
        }
    }

    #[test]
    fn memory_caps_leave_the_shipped_configs_valid() {
        // configs/paper-*.toml: the largest histories shipped.
        let paper = GenConfig {
            users: 4_000,
            requests: 24_000,
            rps: 400.0,
            min_history: 256,
            max_history: 2_048,
            ..GenConfig::default()
        };
        assert_eq!(paper.validate(), Ok(()));
        // At the caps themselves: accepted.
        let at_caps = GenConfig {
            users: 1_000,
            min_history: 10,
            max_history: 1_000_000,
            requests: MAX_REQUESTS,
            candidates: 20,
            rps: 1e6,
            ..GenConfig::default()
        };
        assert_eq!(at_caps.validate(), Ok(()));
        let err = GenConfig {
            requests: MAX_REQUESTS + 1,
            ..at_caps.clone()
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("--requests must be"), "{err}");
        let err = GenConfig {
            users: 1_001,
            ..at_caps
        }
        .validate()
        .unwrap_err()
        .to_string();
        assert!(
            err.contains("--max-history") && err.contains("users × max-history"),
            "{err}"
        );
        assert!(
            err.contains("1001 users"),
            "the error says both values: {err}"
        );
    }

    #[test]
    fn the_burst_cursor_agrees_with_a_scan_of_every_burst() {
        // A long Burst trace: hundreds of bursts.
        let cfg = GenConfig {
            regime: Regime::Burst,
            requests: 2_000_000,
            rps: 200.0,
            ..GenConfig::default()
        };
        let mut s = Schedule::new(&cfg, &mut ChaCha8Rng::seed_from_u64(3));
        assert!(s.bursts.len() > 100, "{}", s.bursts.len());
        let bursts = s.bursts.clone();
        let scan = |t: f64| bursts.iter().any(|&(a, b)| t >= a && t < b);
        // A grid and every boundary, in time order as arrivals come.
        let mut times: Vec<f64> = (0..((s.duration_s + 10.0) / 0.37) as u64)
            .map(|k| k as f64 * 0.37)
            .chain(bursts.iter().flat_map(|&(a, b)| [a, b, a - 1e-9, b - 1e-9]))
            .collect();
        times.sort_by(f64::total_cmp);
        let mut inside = 0;
        for t in times {
            // Each time asked twice, as the generator does.
            for _ in 0..2 {
                assert_eq!(s.in_burst(t), scan(t), "at {t} s");
            }
            inside += scan(t) as usize;
        }
        assert!(inside > 1_000);
    }

    #[test]
    fn a_burst_trace_too_short_for_a_burst_says_so() {
        // 5,000 requests at 200 rps: 25 s, under the 42 s a burst needs.
        let short = GenConfig {
            regime: Regime::Burst,
            requests: 5_000,
            ..GenConfig::default()
        };
        assert!(short.no_burst_fits());
        let s = Schedule::new(&short, &mut ChaCha8Rng::seed_from_u64(short.seed));
        assert!(s.bursts.is_empty());
        let source = generate(&short).meta.unwrap().source;
        assert!(
            source.ends_with(": no burst fits (25.0 s of event time, a burst needs 42 s)"),
            "{source}"
        );
        let warning = short.burst_warning(&GEN_TRACE_FLAGS).unwrap();
        for part in [
            "--regime burst",
            "--requests 5000",
            "--rps 200",
            "25.0 s",
            "42 s",
        ] {
            assert!(warning.contains(part), "{part} missing from {warning}");
        }
        // Other regimes, and a burst trace long enough: no note, no warning.
        for cfg in [
            GenConfig {
                regime: Regime::Steady,
                ..short.clone()
            },
            GenConfig {
                regime: Regime::Burst,
                ..GenConfig::default()
            },
        ] {
            assert!(!cfg.no_burst_fits());
            assert_eq!(cfg.burst_warning(&GEN_TRACE_FLAGS), None);
            assert!(!generate(&cfg).meta.unwrap().source.contains("burst fits"));
        }
        // The threshold is the schedule's own, whatever the seed.
        assert_eq!(MIN_BURST_SPAN_S, 42.0);
        for tenths in 380..460u64 {
            let cfg = GenConfig {
                regime: Regime::Burst,
                requests: tenths * 20,
                rps: 200.0,
                ..GenConfig::default()
            };
            let span = cfg.requests as f64 / cfg.rps;
            assert_eq!(cfg.no_burst_fits(), span < MIN_BURST_SPAN_S, "{span} s");
            for seed in 0..4 {
                let s = Schedule::new(&cfg, &mut ChaCha8Rng::seed_from_u64(seed));
                assert_eq!(
                    s.bursts.is_empty(),
                    cfg.no_burst_fits(),
                    "{span} s, seed {seed}"
                );
            }
        }
    }

    #[test]
    fn max_history_is_out_of_reach_but_for_float_rounding() {
        // u = k / 2^53, k < 2^53. Only the top 1,024 values of k (odds
        // about 1e-13 per user) may round up to max_history.
        let len = |lo: u32, hi: u32, k: u64| {
            let (l, h) = (lo as f64, hi as f64);
            let u = k as f64 / (1u64 << 53) as f64;
            (l * detmath::exp(u * detmath::ln(h / l))) as u32
        };
        let below_top = (1u64 << 53) - 1 - 1_024;
        for lo in 1..=300u32 {
            for hi in lo..=2_100u32 {
                assert_eq!(len(lo, hi, 0), lo, "u = 0 gives min_history");
                if hi > lo {
                    assert!(len(lo, hi, below_top) < hi, "{lo}..{hi}");
                } else {
                    assert_eq!(len(lo, hi, below_top), lo);
                }
            }
        }
        let t = generate(&GenConfig {
            users: 2_000,
            min_history: 3,
            max_history: 5,
            requests: 10,
            ..GenConfig::default()
        });
        let mut initial: Vec<usize> = t.users.iter().map(|u| u.items.len()).collect();
        for r in &t.requests {
            initial[r.user_id as usize] -= 1;
        }
        assert!(initial.iter().all(|&n| (3..5).contains(&n)), "{initial:?}");
        assert!(initial.contains(&3) && initial.contains(&4));
    }
}
