//! Model figures: a long hstu-3l prefill fresh and with 90% of it cached,
//! and a typical `small` rank request.

use std::sync::Arc;

use super::{best_secs, rows, shuffled};
use crate::backend::Backend;
use crate::config::ModelConfig;
use crate::error::KernelError;
use crate::flops::prefill_flops;
use crate::kv_store::VecKvStore;
use crate::model::GrModel;

/// Seconds of an hstu-3l prefill of `tokens`, fresh and with 90% cached.
pub(super) struct Prefill {
    pub full_s: f64,
    pub suffix_s: f64,
    /// Causal FLOPs of the fresh prefill over its time.
    pub gflops: f64,
}

pub(super) fn prefill(
    backend: &Arc<dyn Backend>,
    tokens: usize,
    reps: usize,
) -> Result<Prefill, KernelError> {
    let cfg = ModelConfig::preset("hstu-3l").expect("preset exists");
    let model = GrModel::try_new(cfg.clone(), 1)?.with_backend(backend.clone());
    let blocks = cfg.blocks_for(tokens);
    let mut store = VecKvStore::new(blocks, cfg.kv_block_floats());
    let table = shuffled(blocks, 3);
    let prompt = rows(tokens, cfg.d_model, 4);
    let mut result = Ok(());
    let full_s = best_secs(reps.min(2), || {
        result = model.prefill(&mut store, &table, 0, &prompt)
    });
    std::mem::replace(&mut result, Ok(()))?;
    let cached = tokens * 9 / 10;
    let suffix_s = best_secs(reps, || {
        result = model.prefill(&mut store, &table, cached, &prompt[cached * cfg.d_model..])
    });
    result?;
    Ok(Prefill {
        full_s,
        suffix_s,
        gflops: prefill_flops(&cfg, 0, tokens) / full_s / 1e9,
    })
}

/// Seconds of user-as-prefix requests on `small` over 90 cached tokens.
pub(super) struct SmallRank {
    /// 10 new history tokens prefilled, then 100 candidates ranked.
    pub request_s: f64,
    /// 1,000 candidates ranked on the 100 cached tokens.
    pub thousand_candidates_s: f64,
}

pub(super) fn small_rank(
    backend: &Arc<dyn Backend>,
    reps: usize,
) -> Result<SmallRank, KernelError> {
    let small = ModelConfig::preset("small").expect("preset exists");
    let sm = GrModel::try_new(small.clone(), 2)?.with_backend(backend.clone());
    let hist = rows(100, small.d_model, 5);
    let cands = rows(100, small.d_model, 6);
    let mut store = VecKvStore::new(16, small.kv_block_floats());
    let table = shuffled(16, 7);
    sm.prefill(&mut store, &table, 0, &hist[..90 * small.d_model])?;
    let mut result = Ok(());
    let mut scores = Ok(Vec::new());
    let request_s = best_secs(reps * 10, || {
        result = sm.prefill(&mut store, &table, 90, &hist[90 * small.d_model..]);
        scores = sm.rank_user_prefix(&store, &table, 100, &cands);
    });
    result?;
    std::mem::replace(&mut scores, Ok(Vec::new()))?;
    let many = rows(1000, small.d_model, 13);
    let thousand_candidates_s = best_secs(reps * 3, || {
        scores = sm.rank_user_prefix(&store, &table, 100, &many);
    });
    scores?;
    Ok(SmallRank {
        request_s,
        thousand_candidates_s,
    })
}
