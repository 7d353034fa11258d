//! FLOP counts of the forward passes (multiply-add = 2 FLOPs), for the
//! pipeline's virtual clock and the benches. Attention counts only the
//! query-key pairs the mask lets through (causal FLOPs).

use crate::config::ModelConfig;

/// Projections + FFN of one token through all layers.
pub fn dense_flops_per_token(cfg: &ModelConfig) -> f64 {
    let (d, f) = (cfg.d_model as f64, cfg.d_ff as f64);
    cfg.n_layers as f64 * (2.0 * d * 3.0 * d + 2.0 * d * d + 4.0 * d * f)
}

/// Attention (QKᵀ and PV) of one query over `keys` visible keys, all layers.
pub fn attention_flops(cfg: &ModelConfig, keys: f64) -> f64 {
    cfg.n_layers as f64 * 4.0 * cfg.d_model as f64 * keys
}

/// [`crate::GrModel::prefill`] of `new_len` tokens on `cached_len` cached ones.
pub fn prefill_flops(cfg: &ModelConfig, cached_len: usize, new_len: usize) -> f64 {
    let (c, n) = (cached_len as f64, new_len as f64);
    // Σ_{i=1..n} (c + i) visible keys.
    let keys = n * c + n * (n + 1.0) / 2.0;
    n * dense_flops_per_token(cfg) + attention_flops(cfg, keys)
}

/// Ranking head: projection plus one dot product per candidate.
fn head_flops(cfg: &ModelConfig, n: usize) -> f64 {
    let d = cfg.d_model as f64;
    2.0 * d * d + 2.0 * d * n as f64
}

/// [`crate::GrModel::rank_user_prefix`] with `n_cands` candidates.
pub fn rank_user_prefix_flops(cfg: &ModelConfig, prefix_len: usize, n_cands: usize) -> f64 {
    let (p, n) = (prefix_len as f64, n_cands as f64);
    // Each candidate sees the prefix and itself; the instruction token the
    // prefix and itself (never the candidates).
    let keys = n * (p + 1.0) + (p + 1.0);
    (n + 1.0) * dense_flops_per_token(cfg) + attention_flops(cfg, keys) + head_flops(cfg, n_cands)
}

/// [`crate::GrModel::item_kv`] of one item of `len` tokens.
pub fn item_kv_flops(cfg: &ModelConfig, len: usize) -> f64 {
    prefill_flops(cfg, 0, len)
}

/// [`crate::GrModel::rank_item_prefix`] over cached items holding
/// `item_tokens` tokens in all, `n_items` of them, and `user_len` user tokens.
pub fn rank_item_prefix_flops(
    cfg: &ModelConfig,
    item_tokens: usize,
    n_items: usize,
    user_len: usize,
) -> f64 {
    prefill_flops(cfg, item_tokens, user_len + 1) + head_flops(cfg, n_items)
}

/// One [`crate::BeamSearch::generate`] upper bound: BW beams at every step
/// (step 0 runs one), each over the prompt and its own tokens, plus the
/// codebook heads. A catalog with fewer valid paths runs fewer rows; see
/// [`beam_search_rows_flops`] for the FLOPs of the rows a search ran.
pub fn beam_search_flops(cfg: &ModelConfig, prompt_len: usize, beam_width: usize) -> f64 {
    let mut rows = [beam_width; crate::SID_STEPS];
    rows[0] = 1;
    beam_search_rows_flops(cfg, prompt_len, &rows)
}

/// A beam search that decoded `rows[t]` beams at step `t`
/// ([`crate::BeamSearch::rows_per_step`]): each row runs through every
/// layer, attends over the prompt and its own `t + 1` tokens, and through
/// the step's codebook head.
pub fn beam_search_rows_flops(cfg: &ModelConfig, prompt_len: usize, rows: &[usize]) -> f64 {
    let (d, c) = (cfg.d_model as f64, cfg.codebook_size as f64);
    rows.iter()
        .enumerate()
        .map(|(t, &nb)| {
            nb as f64
                * (dense_flops_per_token(cfg)
                    + attention_flops(cfg, (prompt_len + t + 1) as f64)
                    + 2.0 * d * c)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_splits_add_up() {
        let cfg = ModelConfig::preset("hstu-3l").unwrap();
        let whole = prefill_flops(&cfg, 0, 2048);
        let split = prefill_flops(&cfg, 0, 1843) + prefill_flops(&cfg, 1843, 205);
        assert!((whole - split).abs() / whole < 1e-12);
        // 3 layers × 2048 tokens × (8d² + 4d·d_ff) + causal attention.
        let dense = 3.0 * 2048.0 * (8.0 * 512.0 * 512.0 + 4.0 * 512.0 * 2048.0);
        let attn = 3.0 * 4.0 * 512.0 * (2048.0 * 2049.0 / 2.0);
        assert_eq!(whole, dense + attn);
    }
}
