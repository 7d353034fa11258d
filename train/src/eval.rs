//! SASRec's evaluation protocol scored through the serving kernels: each
//! test question is a served User-as-prefix request (history prefilled
//! into paged KV blocks, candidates ranked by their logits, as served).

use grflow_kernels::history::HistoryCut;
use std::time::Instant;

use grflow_kernels::{GrModel, KvBlockStore, RankJob, VecKvStore};
use serde::{Deserialize, Serialize};

use crate::data::{Dataset, eval_question};
use crate::error::TrainError;
use crate::metrics::{MetricSum, RankMetrics, Standing};
use crate::net::Sequence;
use crate::params::Params;

/// A trained model behind the serving kernels, with one user's worth of
/// KV blocks.
#[derive(Debug)]
pub struct Served {
    model: GrModel,
    emb: Vec<f32>,
    /// What a history keeps: serving's cut, not the last `max_history`.
    cut: HistoryCut,
    store: VecKvStore,
    table: Vec<u32>,
}

impl Served {
    pub fn new(p: &Params, max_history: usize) -> Result<Self, TrainError> {
        let model = p.to_kernels()?;
        let cfg = model.config();
        let blocks = cfg.blocks_for(max_history.max(1));
        Ok(Served {
            store: VecKvStore::new(blocks, cfg.kv_block_floats()),
            table: (0..blocks as u32).collect(),
            emb: p.emb.clone(),
            cut: HistoryCut::new(max_history, cfg.block_size),
            model,
        })
    }

    pub fn model_version(&self) -> String {
        self.model.model_version()
    }

    fn tokens(&self, items: &[u32]) -> Vec<f32> {
        let d = self.model.config().d_model;
        items
            .iter()
            .flat_map(|&i| {
                self.emb[i as usize * d..(i as usize + 1) * d]
                    .iter()
                    .copied()
            })
            .collect()
    }

    /// Ranking logits of `cands` for a user with `history` (cut to the
    /// model's `max_history` as serving cuts it, like
    /// [`crate::data::eval_question`]), as a served request computes them.
    /// Serving orders candidates by these: their softmax, the scores a
    /// response reports, is 0 for a logit ~104 below the best, which would
    /// tie candidates that serving tells apart.
    pub fn rank(&mut self, history: &[u32], cands: &[u32]) -> Result<Vec<f32>, TrainError> {
        let h = self.cut.keep(history);
        let toks = self.tokens(h);
        self.model.prefill(&mut self.store, &self.table, 0, &toks)?;
        debug_assert!(self.store.block_floats() > 0);
        let c = self.tokens(cands);
        let job = RankJob {
            block_table: &self.table,
            prefix_len: h.len(),
            candidate_tokens: &c,
        };
        let mut logits = self
            .model
            .rank_user_prefix_logits_batch(&self.store, &[job])?;
        Ok(logits.pop().unwrap_or_default())
    }

    /// The positive's standing among the whole catalog: `cands[0]` is the
    /// positive, the rest are ranked against it in chunks of `chunk`, each
    /// chunk with the positive prepended. A candidate's logit does not
    /// depend on the others (the instruction never sees the candidates),
    /// so the count is the same for any chunk size.
    pub fn full_rank(
        &mut self,
        history: &[u32],
        cands: &[u32],
        chunk: usize,
    ) -> Result<Standing, TrainError> {
        let (pos, rest) = cands
            .split_first()
            .ok_or_else(|| TrainError::Invalid("full ranking needs a positive".to_string()))?;
        let mut st = Standing::default();
        for part in rest.chunks(chunk.max(1)) {
            let mut c = Vec::with_capacity(part.len() + 1);
            c.push(*pos);
            c.extend_from_slice(part);
            st = st.plus(Standing::of_first(&self.rank(history, &c)?));
        }
        Ok(st)
    }
}

/// Evaluation settings.
#[derive(Clone, Debug)]
pub struct EvalOptions {
    /// Seeds the 100 sampled negatives of each test question.
    pub seed: u64,
    pub negatives: usize,
    /// Rank the whole catalog for the first `full_users` test users.
    pub full: bool,
    pub full_users: usize,
    pub full_chunk: usize,
}

impl Default for EvalOptions {
    fn default() -> Self {
        EvalOptions {
            seed: 2024,
            negatives: 100,
            full: false,
            full_users: 1000,
            full_chunk: 2048,
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Latency {
    pub p50: f64,
    pub p99: f64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FullMetrics {
    pub users: usize,
    #[serde(flatten)]
    pub metrics: RankMetrics,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Baseline {
    pub sampled_100: RankMetrics,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full: Option<FullMetrics>,
}

/// `grflow eval --json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EvalReport {
    pub model_version: String,
    pub arch: String,
    pub users: usize,
    pub sampled_100: RankMetrics,
    pub popularity: Baseline,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full: Option<FullMetrics>,
    /// Per served request (prefill + ranking of 101 candidates).
    pub latency_ms: Latency,
    pub gemm_gflops: f64,
}

/// Every user's test question (users with at least 3 items), in user order.
pub fn test_questions(
    data: &Dataset,
    max_history: usize,
    block_size: usize,
    opts: &EvalOptions,
) -> Vec<(usize, Sequence)> {
    data.users
        .iter()
        .enumerate()
        .filter_map(|(u, user)| {
            let (h, t) = user.test()?;
            let q = eval_question(
                user,
                h,
                t,
                data.n_items,
                HistoryCut::new(max_history, block_size),
                opts.negatives,
                opts.seed,
            );
            Some((u, q))
        })
        .collect()
}

/// Scores questions through the kernels: the metrics and each request's
/// latency in ms.
pub fn score_served(
    served: &mut Served,
    qs: &[(usize, Sequence)],
    progress: &mut dyn FnMut(usize),
) -> Result<(RankMetrics, Vec<f64>), TrainError> {
    let mut m = MetricSum::default();
    let mut lat = Vec::with_capacity(qs.len());
    for (done, (_, q)) in qs.iter().enumerate() {
        let t0 = Instant::now();
        let s = served.rank(&q.history, &q.targets[0].cands)?;
        lat.push(t0.elapsed().as_secs_f64() * 1e3);
        m.add_standing(Standing::of_first(&s));
        if done % 256 == 0 {
            progress(done);
        }
    }
    Ok((m.mean(), lat))
}

/// The popularity baseline: candidates scored by training-part counts.
pub fn score_popularity(counts: &[u64], qs: &[(usize, Sequence)]) -> RankMetrics {
    let mut m = MetricSum::default();
    for (_, q) in qs {
        let s: Vec<f32> = q.targets[0]
            .cands
            .iter()
            .map(|&c| counts[c as usize] as f32)
            .collect();
        m.add_standing(Standing::of_first(&s));
    }
    m.mean()
}

/// Nearest-rank percentile of an ascending slice, the rule of every other
/// p99 in grflow (`grflow_operators::windows::percentile`, which this
/// crate does not depend on).
fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

/// The model under evaluation and what the report says about it.
#[derive(Clone, Copy, Debug)]
pub struct Subject<'a> {
    pub params: &'a Params,
    pub max_history: usize,
    pub arch: &'a str,
    pub model_version: &'a str,
}

/// Runs the protocol: sampled-100 for the model and popularity, and the
/// full-catalog ranking when asked.
pub fn evaluate(
    subject: Subject<'_>,
    data: &Dataset,
    opts: &EvalOptions,
    gemm_gflops: f64,
    progress: &mut dyn FnMut(&'static str, usize, usize),
) -> Result<EvalReport, TrainError> {
    let Subject {
        params: p,
        max_history,
        arch,
        model_version,
    } = subject;
    if p.n_items() != data.n_items {
        return Err(TrainError::Invalid(format!(
            "the model has {} items, the trace {}",
            p.n_items(),
            data.n_items
        )));
    }
    let qs = test_questions(data, max_history, p.cfg.block_size, opts);
    if qs.is_empty() {
        return Err(TrainError::Invalid(
            "no test users: a test question needs a user with 3 or more items".to_string(),
        ));
    }
    let mut served = Served::new(p, max_history)?;
    let total = qs.len();
    let (sampled, mut lat) =
        score_served(&mut served, &qs, &mut |d| progress("sampled 100", d, total))?;
    let counts = data.train_counts();
    let pop = score_popularity(&counts, &qs);
    let (full, pop_full) = if opts.full {
        let (mut m, mut pm) = (MetricSum::default(), MetricSum::default());
        let n_full = qs.len().min(opts.full_users);
        for (i, (u, q)) in qs.iter().take(opts.full_users).enumerate() {
            progress("full catalog", i, n_full);
            let user = &data.users[*u];
            let target = q.targets[0].cands[0];
            let mut cands = vec![target];
            cands.extend((0..data.n_items as u32).filter(|&i| i != target && !user.has_seen(i)));
            m.add_standing(served.full_rank(&q.history, &cands, opts.full_chunk)?);
            let s: Vec<f32> = cands.iter().map(|&c| counts[c as usize] as f32).collect();
            pm.add_standing(Standing::of_first(&s));
        }
        let n = m.count() as usize;
        (
            Some(FullMetrics {
                users: n,
                metrics: m.mean(),
            }),
            Some(FullMetrics {
                users: n,
                metrics: pm.mean(),
            }),
        )
    } else {
        (None, None)
    };
    lat.sort_by(f64::total_cmp);
    Ok(EvalReport {
        model_version: model_version.to_string(),
        arch: arch.to_string(),
        users: total,
        sampled_100: sampled,
        popularity: Baseline {
            sampled_100: pop,
            full: pop_full,
        },
        full,
        latency_ms: Latency {
            p50: percentile(&lat, 0.5),
            p99: percentile(&lat, 0.99),
        },
        gemm_gflops,
    })
}

#[cfg(test)]
mod tests {
    use super::percentile;

    #[test]
    fn latency_percentiles_are_nearest_rank() {
        let sorted: Vec<f64> = (1..=60).map(f64::from).collect();
        // Rank ceil(0.99 × 60) = 60; rounding (n − 1) × q gave the 59th.
        assert_eq!(percentile(&sorted, 0.99), 60.0);
        assert_eq!(percentile(&[1.0, 2.0], 0.5), 1.0);
        assert_eq!(percentile(&[], 0.99), 0.0);
    }
}
