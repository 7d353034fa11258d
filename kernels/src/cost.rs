//! A fitted model of the GR model's compute time on one machine, for the
//! virtual clock: it charges these times instead of running the model.
//! Fitted by least squares from kernel timings (BAT §5.2 fits a polynomial
//! the same way): prefill time as a function of new and cached tokens,
//! ranking time of candidates on a prefix, beam search time of a prompt.

use std::time::Instant;

use serde::{Deserialize, Serialize};

use crate::beam::BeamSearch;
use crate::bench::{best_secs, gemm_peak_gflops, rows, shuffled};
use crate::config::ModelConfig;
use crate::error::KernelError;
use crate::kv_store::VecKvStore;
use crate::model::GrModel;
use crate::trie::SidTrie;

/// Milliseconds of compute per request part on the machine it was fitted on.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CostModel {
    /// The model preset it was fitted for.
    pub preset: String,
    /// The CPU it was fitted on (`/proc/cpuinfo`'s model name).
    pub machine: String,
    /// One-core GEMM rate measured in the same run (GFLOP/s).
    pub gemm_gflops: f64,
    /// Beam width and per-beam top-k the beam search was timed with.
    pub beam_width: usize,
    pub beam_top_k: usize,
    /// Prefill of `new` tokens after `cached` ones:
    /// `c0 + c1·new + c2·new·(cached + new)` (the last term is attention).
    pub prefill_ms: [f64; 3],
    /// Ranking `candidates` on a prefix of `prefix` tokens:
    /// `c0 + c1·candidates + c2·candidates·prefix`.
    pub rank_ms: [f64; 3],
    /// Beam search after a prompt of `prompt` tokens: `c0 + c1·prompt`.
    pub beam_ms: [f64; 2],
    /// The fit's largest relative error on the timings it was fitted to.
    pub fit_max_rel_err: f64,
    /// The longest prompt (cached plus new tokens) it was timed at: longer
    /// ones are charged by extrapolation. 0 in older files (512 then).
    #[serde(default)]
    pub fitted_tokens: usize,
    /// What a request costs besides the model (source, router, exchanges,
    /// embedding lookups, cache work, response), in ms: measured against a
    /// real replay by `grflow calibrate`, 0 from [`calibrate`] alone.
    #[serde(default)]
    pub overhead_ms: f64,
    /// Host time per request that keeps the node busy, so that under load
    /// it delays the requests queued behind: the part of `overhead_ms`
    /// spent on the node's core (lookups, cache work, planning) and work
    /// after the response that shares it (exchanges, windows, sinks), so
    /// it may exceed `overhead_ms`. Fitted by `grflow calibrate` against a
    /// loaded replay; 0 in older files.
    #[serde(default)]
    pub occupancy_ms: f64,
    /// Seconds the calibration took.
    pub calibration_s: f64,
}

impl CostModel {
    /// A model of `preset` that costs nothing, written by hand rather than
    /// measured (tests, what-if runs): set the coefficients wanted on it.
    pub fn given(preset: &str, beam_width: usize, beam_top_k: usize) -> CostModel {
        CostModel {
            preset: preset.into(),
            machine: "given, not measured".into(),
            gemm_gflops: 100.0,
            beam_width,
            beam_top_k,
            prefill_ms: [0.0; 3],
            rank_ms: [0.0; 3],
            beam_ms: [0.0; 2],
            fit_max_rel_err: 0.0,
            fitted_tokens: 0,
            overhead_ms: 0.0,
            occupancy_ms: 0.0,
            calibration_s: 0.0,
        }
    }

    /// The same model on a device `scale` times as slow (0.001: a thousand
    /// times as fast): model compute (prefill, ranking, beam search) is
    /// scaled, the serving path's overhead on the host is not.
    pub fn scaled(&self, scale: f64) -> CostModel {
        let mut c = self.clone();
        let times = |a: &mut [f64]| a.iter_mut().for_each(|x| *x *= scale);
        times(&mut c.prefill_ms);
        times(&mut c.rank_ms);
        times(&mut c.beam_ms);
        c
    }

    /// The same model with the per-request host overhead × `scale` (0: the
    /// device's compute and the link alone).
    pub fn overhead_scaled(mut self, scale: f64) -> CostModel {
        self.overhead_ms *= scale;
        self.occupancy_ms *= scale;
        self
    }

    /// Per request, the host time that occupies the node, and the host time
    /// the request itself waits for after its compute (the whole overhead,
    /// whether the occupancy is shorter or longer than it: the part past
    /// the overhead comes after the response).
    pub fn overhead_split(&self) -> (f64, f64) {
        (self.occupancy_ms.max(0.0), self.overhead_ms.max(0.0))
    }

    /// Why the numbers cannot be a machine's costs, if they cannot: a value
    /// that is not finite, a negative overhead, or a cost function that is
    /// not positive where requests use it (a hand-edited or damaged file
    /// would otherwise be clamped to free compute).
    pub fn check(&self) -> Result<(), String> {
        let named = [
            ("prefill_ms", &self.prefill_ms[..]),
            ("rank_ms", &self.rank_ms[..]),
            ("beam_ms", &self.beam_ms[..]),
            ("overhead_ms", std::slice::from_ref(&self.overhead_ms)),
            ("occupancy_ms", std::slice::from_ref(&self.occupancy_ms)),
            ("gemm_gflops", std::slice::from_ref(&self.gemm_gflops)),
        ];
        for (name, values) in named {
            if let Some(v) = values.iter().find(|v| !v.is_finite()) {
                return Err(format!("{name}: {v} is not a number of ms"));
            }
        }
        if self.overhead_ms < 0.0 || self.occupancy_ms < 0.0 {
            return Err(format!(
                "overhead_ms {} and occupancy_ms {} must not be negative",
                self.overhead_ms, self.occupancy_ms
            ));
        }
        let named = [
            ("prefill_ms", &self.prefill_ms[..]),
            ("rank_ms", &self.rank_ms[..]),
            ("beam_ms", &self.beam_ms[..]),
        ];
        for (name, coefficients) in named {
            if let Some(v) = coefficients.iter().find(|&&v| v < 0.0) {
                return Err(format!(
                    "{name}: coefficient {v} is negative (each term is a cost); calibrate again"
                ));
            }
        }
        let probes = [
            ("prefill_ms", self.prefill(1, 0), "1 new token"),
            ("rank_ms", self.rank(1, 0), "1 candidate"),
            ("prefill_ms", self.prefill(64, 0), "64 new tokens"),
            ("prefill_ms", self.prefill(64, 256), "64 tokens after 256"),
            ("rank_ms", self.rank(100, 64), "100 candidates on 64 tokens"),
            ("beam_ms", self.beam(64), "a 64-token prompt"),
        ];
        for (name, ms, what) in probes {
            if ms <= 0.0 {
                return Err(format!(
                    "{name}: costs {ms} ms for {what}; a cost must be positive"
                ));
            }
        }
        Ok(())
    }

    pub fn prefill(&self, new: usize, cached: usize) -> f64 {
        if new == 0 {
            return 0.0;
        }
        let (n, c) = (new as f64, cached as f64);
        let [a, b, q] = self.prefill_ms;
        (a + b * n + q * n * (c + n)).max(0.0)
    }

    pub fn rank(&self, candidates: usize, prefix: usize) -> f64 {
        let (n, p) = (candidates as f64, prefix as f64);
        let [a, b, q] = self.rank_ms;
        (a + b * n + q * n * p).max(0.0)
    }

    pub fn beam(&self, prompt: usize) -> f64 {
        let [a, b] = self.beam_ms;
        (a + b * prompt as f64).max(0.0)
    }
}

/// The shortest longest prompt a calibration can fit its cost model on.
pub const MIN_FITTED_TOKENS: usize = 64;

/// The longest prompt [`calibrate`] times by default.
pub const DEFAULT_FITTED_TOKENS: usize = 512;

/// Times prefill, ranking and beam search of `preset` on this machine (one
/// thread, best of `reps`) on prompts of up to 512 tokens and fits the
/// cost model. Takes seconds for `small`, tens of seconds for `hstu-3l`.
pub fn calibrate(
    preset: &str,
    beam_width: usize,
    beam_top_k: usize,
    reps: usize,
) -> Result<CostModel, KernelError> {
    calibrate_up_to(preset, beam_width, beam_top_k, reps, DEFAULT_FITTED_TOKENS)
}

/// [`calibrate`] on prompts of up to `max_tokens` (within the model's
/// positions): the timings sit at 0, ¼ and ½ of it, so a model used on
/// long histories is fitted on them, not extrapolated to them.
pub fn calibrate_up_to(
    preset: &str,
    beam_width: usize,
    beam_top_k: usize,
    reps: usize,
    max_tokens: usize,
) -> Result<CostModel, KernelError> {
    let started = Instant::now();
    let cfg = ModelConfig::preset(preset)
        .ok_or_else(|| KernelError::InvalidConfig(format!("unknown preset {preset:?}")))?;
    let max_tokens = max_tokens.min(cfg.max_positions.saturating_sub(200));
    if max_tokens < MIN_FITTED_TOKENS {
        return Err(KernelError::InvalidConfig(format!(
            "prompts of up to {max_tokens} tokens are too short to fit the cost model \
             ({MIN_FITTED_TOKENS} at least)"
        )));
    }
    let mut bench = Timed::new(&cfg, max_tokens, reps)?;
    let prefill = bench.prefill()?;
    let rank = bench.rank()?;
    let beam = bench.beam(&cfg, beam_width, beam_top_k)?;
    let b = non_negative_least_squares(&beam);
    let mut cost = CostModel {
        preset: preset.to_string(),
        machine: machine_name(),
        gemm_gflops: gemm_peak_gflops(),
        beam_width,
        beam_top_k,
        prefill_ms: fit3(&prefill),
        rank_ms: fit3(&rank),
        beam_ms: [b[0], b[1]],
        fit_max_rel_err: 0.0,
        fitted_tokens: max_tokens,
        overhead_ms: 0.0,
        occupancy_ms: 0.0,
        calibration_s: 0.0,
    };
    cost.fit_max_rel_err = worst_fit_error(&cost, &prefill, &rank, &beam);
    cost.calibration_s = started.elapsed().as_secs_f64();
    Ok(cost)
}

/// A calibration's timing samples: the terms of the fitted polynomial and
/// the milliseconds measured.
type Samples = Vec<(Vec<f64>, f64)>;

/// The model and a paged store with prompts of up to `max_tokens` (+200
/// for the longest prefill), timed best of `reps`.
struct Timed {
    model: GrModel,
    store: VecKvStore,
    table: Vec<u32>,
    tokens: Vec<f32>,
    d: usize,
    max_tokens: usize,
    reps: usize,
}

impl Timed {
    fn new(cfg: &ModelConfig, max_tokens: usize, reps: usize) -> Result<Self, KernelError> {
        let blocks = cfg.blocks_for(max_tokens + 200);
        Ok(Self {
            model: GrModel::try_new(cfg.clone(), 3)?,
            store: VecKvStore::new(blocks, cfg.kv_block_floats()),
            table: shuffled(blocks, 5),
            tokens: rows(max_tokens + 200, cfg.d_model, 6),
            d: cfg.d_model,
            max_tokens,
            reps,
        })
    }

    /// Prefills `prompt` tokens from the start (untimed).
    fn prompt(&mut self, prompt: usize) -> Result<(), KernelError> {
        self.model.prefill(
            &mut self.store,
            &self.table,
            0,
            &self.tokens[..prompt * self.d],
        )
    }

    /// Prefill of new tokens after cached ones; at the default 512 tokens:
    /// cached 0, 128, 256; new 16, 64, 128, 256. Terms [1, n, n(c + n)].
    fn prefill(&mut self) -> Result<Samples, KernelError> {
        let (q, d) = (self.max_tokens / 4, self.d);
        let mut samples = Vec::new();
        let mut news = vec![16, 64, q, 2 * q];
        news.sort_unstable();
        news.dedup();
        for cached in [0, q, 2 * q] {
            for &new in &news {
                if cached + new > self.max_tokens {
                    continue;
                }
                if cached > 0 {
                    self.prompt(cached)?;
                }
                let mut result = Ok(());
                let secs = best_secs(self.reps, || {
                    result = self.model.prefill(
                        &mut self.store,
                        &self.table,
                        cached,
                        &self.tokens[cached * d..(cached + new) * d],
                    );
                });
                result?;
                let (n, c) = (new as f64, cached as f64);
                samples.push((vec![1.0, n, n * (c + n)], secs * 1e3));
            }
        }
        Ok(samples)
    }

    /// Ranking 16, 64 and 128 candidates on prefixes of 32, ¼ and ½ of the
    /// longest prompt. Terms [1, n, n·prefix].
    fn rank(&mut self) -> Result<Samples, KernelError> {
        let q = self.max_tokens / 4;
        let mut samples = Vec::new();
        for prefix in [32, q, 2 * q] {
            self.prompt(prefix)?;
            for &cands in &[16usize, 64, 128] {
                let cand_tokens = rows(cands, self.d, 7);
                let mut result = Ok(Vec::new());
                let secs = best_secs(self.reps, || {
                    result =
                        self.model
                            .rank_user_prefix(&self.store, &self.table, prefix, &cand_tokens);
                });
                result?;
                let (n, p) = (cands as f64, prefix as f64);
                samples.push((vec![1.0, n, n * p], secs * 1e3));
            }
        }
        Ok(samples)
    }

    /// Beam search after prompts of 32, ¼ and ½ of the longest, on a sparse
    /// catalog of 4,096 items. Terms [1, prompt].
    fn beam(
        &mut self,
        cfg: &ModelConfig,
        beam_width: usize,
        beam_top_k: usize,
    ) -> Result<Samples, KernelError> {
        let q = self.max_tokens / 4;
        let c = cfg.codebook_size;
        let catalog: Vec<[u16; 3]> = (0..4096u32)
            .map(|i| {
                let h = i.wrapping_mul(2_654_435_761);
                [
                    (h % c as u32) as u16,
                    ((h >> 8) % c as u32) as u16,
                    ((h >> 16) % c as u32) as u16,
                ]
            })
            .collect();
        let trie = SidTrie::new(&catalog, c)?;
        let mut search = BeamSearch::new(cfg, beam_width, beam_top_k, self.max_tokens)?;
        let mut samples = Vec::new();
        for prompt in [32, q, 2 * q] {
            self.prompt(prompt)?;
            let mut result = Ok(());
            let secs = best_secs(self.reps, || {
                result = search
                    .generate(&self.model, &self.store, &self.table, prompt, &trie)
                    .map(|_| ());
            });
            result?;
            samples.push((vec![1.0, prompt as f64], secs * 1e3));
        }
        Ok(samples)
    }
}

/// The largest relative error of `cost` over the samples it was fitted on
/// (a NaN error, from a fit that produced one, counts as the worst).
fn worst_fit_error(cost: &CostModel, prefill: &Samples, rank: &Samples, beam: &Samples) -> f64 {
    let rel = |predicted: f64, measured: f64| {
        let e = (predicted - measured).abs() / measured.max(1e-6);
        if e.is_nan() { f64::INFINITY } else { e }
    };
    let mut worst: f64 = 0.0;
    for (x, y) in prefill {
        let (n, c) = (x[1], x[2] / x[1] - x[1]);
        worst = worst.max(rel(cost.prefill(n as usize, c.round() as usize), *y));
    }
    for (x, y) in rank {
        worst = worst.max(rel(
            cost.rank(x[1] as usize, (x[2] / x[1]).round() as usize),
            *y,
        ));
    }
    for (x, y) in beam {
        worst = worst.max(rel(cost.beam(x[1] as usize), *y));
    }
    worst
}

fn fit3(samples: &[(Vec<f64>, f64)]) -> [f64; 3] {
    let c = non_negative_least_squares(samples);
    [c[0], c[1], c[2]]
}

/// [`least_squares`] with no coefficient below zero: the most negative one
/// is dropped (held at 0) and the rest refitted, until none is. Each term
/// is a cost, so a negative one only fits noise, and it drove the model's
/// small requests (a 1-token prefill after a prefix hit) to 0 ms or below.
fn non_negative_least_squares(samples: &[(Vec<f64>, f64)]) -> Vec<f64> {
    let k = samples.first().map_or(0, |s| s.0.len());
    let mut kept: Vec<usize> = (0..k).collect();
    loop {
        let reduced: Vec<(Vec<f64>, f64)> = samples
            .iter()
            .map(|(x, y)| (kept.iter().map(|&i| x[i]).collect(), *y))
            .collect();
        let fit = least_squares(&reduced);
        let worst = (0..kept.len())
            .filter(|&j| fit[j] < 0.0)
            .min_by(|&a, &b| fit[a].total_cmp(&fit[b]));
        match worst {
            Some(j) => {
                kept.remove(j);
            }
            None => {
                let mut c = vec![0.0; k];
                for (j, &i) in kept.iter().enumerate() {
                    c[i] = fit[j];
                }
                return c;
            }
        }
    }
}

/// Least squares on relative error (each row weighted by 1/y, so that a
/// small request's time is fitted as closely as a large one's).
fn least_squares(samples: &[(Vec<f64>, f64)]) -> Vec<f64> {
    let k = samples.first().map_or(0, |s| s.0.len());
    let mut a = vec![vec![0.0; k + 1]; k];
    for (x, y) in samples {
        let w = 1.0 / (y * y).max(1e-12);
        for i in 0..k {
            for j in 0..k {
                a[i][j] += w * x[i] * x[j];
            }
            a[i][k] += w * x[i] * y;
        }
    }
    // Gaussian elimination with partial pivoting.
    for col in 0..k {
        let pivot = (col..k)
            .max_by(|&p, &q| a[p][col].abs().total_cmp(&a[q][col].abs()))
            .unwrap_or(col);
        a.swap(col, pivot);
        let div = a[col][col];
        if div.abs() < 1e-300 {
            continue;
        }
        for v in &mut a[col][col..=k] {
            *v /= div;
        }
        let pivot_row = a[col].clone();
        for (row, r) in a.iter_mut().enumerate() {
            if row != col {
                let f = r[col];
                for (v, p) in r[col..=k].iter_mut().zip(&pivot_row[col..=k]) {
                    *v -= f * p;
                }
            }
        }
    }
    (0..k).map(|i| a[i][k]).collect()
}

/// The CPU model name, or "unknown".
pub fn machine_name() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_scales_compute_and_leaves_the_host_overhead() {
        let c = hand_made();
        let s = c.scaled(0.01);
        assert!((s.prefill(100, 50) - c.prefill(100, 50) * 0.01).abs() < 1e-12);
        assert!((s.rank(10, 100) - c.rank(10, 100) * 0.01).abs() < 1e-12);
        assert!((s.beam(100) - c.beam(100) * 0.01).abs() < 1e-12);
        assert_eq!(s.overhead_ms, c.overhead_ms);
        // The overhead has its own scale, and it leaves compute alone.
        let o = c.clone().overhead_scaled(0.5);
        assert!((o.overhead_ms - 0.15).abs() < 1e-12);
        assert!((o.occupancy_ms - 0.05).abs() < 1e-12);
        // A request waits for the whole overhead, whether the node stays
        // busy for less of it or for longer (work after the response).
        let (busy, own) = CostModel {
            occupancy_ms: 0.5,
            ..c.clone()
        }
        .overhead_split();
        assert_eq!((busy, own), (0.5, c.overhead_ms));
        let (busy, own) = c.overhead_split();
        assert!((busy - 0.1).abs() < 1e-12 && (own - 0.3).abs() < 1e-12);
        assert_eq!(o.prefill(100, 50), c.prefill(100, 50));
    }

    #[test]
    fn least_squares_recovers_an_exact_polynomial() {
        let samples: Vec<(Vec<f64>, f64)> = [(1.0, 2.0), (3.0, 1.0), (10.0, 5.0), (7.0, 7.0)]
            .iter()
            .map(|&(n, c)| {
                (
                    vec![1.0, n, n * (n + c)],
                    0.5 + 0.2 * n + 0.01 * n * (n + c),
                )
            })
            .collect();
        let c = least_squares(&samples);
        for (got, want) in c.iter().zip([0.5, 0.2, 0.01]) {
            assert!((got - want).abs() < 1e-9, "{c:?}");
        }
        // Exact data: the constrained fit is the same.
        assert_eq!(non_negative_least_squares(&samples), c);
    }

    #[test]
    fn a_noisy_fit_keeps_every_cost_term_non_negative() {
        // Linear times whose largest sample read low (noise): unconstrained,
        // the quadratic term comes out negative, and with it long requests
        // cost less than short ones would suggest.
        let samples: Vec<(Vec<f64>, f64)> = [(16.0, 1.6), (32.0, 3.2), (64.0, 6.4), (128.0, 11.0)]
            .iter()
            .map(|&(n, y)| (vec![1.0, n, n * n], y))
            .collect();
        let free = least_squares(&samples);
        assert!(free.iter().any(|&c| c < 0.0), "{free:?}");
        let c = non_negative_least_squares(&samples);
        assert!(c.iter().all(|&v| v >= 0.0), "{c:?}");
        let one = c[0] + c[1] + c[2];
        assert!(one > 0.0, "{c:?}");
        // And a file with a negative term is refused by name.
        let mut cost = hand_made();
        cost.prefill_ms[0] = -0.2;
        let err = cost.check().unwrap_err();
        assert!(
            err.contains("prefill_ms") && err.contains("negative"),
            "{err}"
        );
    }

    /// A cost model written by hand, not measured.
    fn hand_made() -> CostModel {
        CostModel {
            prefill_ms: [0.1, 0.01, 0.0001],
            rank_ms: [0.2, 0.02, 0.0002],
            beam_ms: [0.5, 0.05],
            fitted_tokens: 512,
            overhead_ms: 0.3,
            occupancy_ms: 0.1,
            calibration_s: 1.0,
            ..CostModel::given("small", 8, 8)
        }
    }

    #[test]
    fn calibrating_small_fits_its_own_timings_and_grows_with_work() {
        let cost = calibrate("small", 8, 8, 2).unwrap();
        assert!(cost.prefill(256, 0) > cost.prefill(16, 0));
        assert!(cost.prefill(128, 256) > cost.prefill(128, 0));
        assert!(cost.rank(128, 128) > cost.rank(16, 128));
        assert!(cost.beam(256) >= cost.beam(32) * 0.5);
        assert_eq!(cost.prefill(0, 100), 0.0);
        // Timings of a shared VM are noisy; the fit must still be in range.
        assert!(cost.fit_max_rel_err < 2.0, "{cost:?}");
        assert!(calibrate("nope", 8, 8, 1).is_err());
        assert_eq!(cost.fitted_tokens, DEFAULT_FITTED_TOKENS);
    }

    #[test]
    fn calibration_is_timed_up_to_the_tokens_asked_within_the_positions() {
        let short = calibrate_up_to("small", 8, 8, 1, 128).unwrap();
        assert_eq!(short.fitted_tokens, 128);
        assert!(short.prefill(64, 64) > short.prefill(16, 0));
        let max = ModelConfig::preset("small").unwrap().max_positions;
        let capped = calibrate_up_to("small", 8, 8, 1, 1 << 20).unwrap();
        assert_eq!(capped.fitted_tokens, max - 200);
        let err = calibrate_up_to("small", 8, 8, 1, 32)
            .unwrap_err()
            .to_string();
        assert!(err.contains("too short"), "{err}");
    }
}
