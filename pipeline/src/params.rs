//! Turns the job config and the trace's metadata into node parameters.

use grflow_kernels::ModelConfig;
use grflow_kernels::cost::CostModel;
use grflow_operators::link::LinkConfig;
use grflow_operators::node::{MemoryParams, NodeParams};
use grflow_operators::shards::ShardMap;
use grflow_traces::{Item, TraceMeta};

use crate::config::Config;
use crate::trained::{self, WeightsError};

#[derive(Debug, thiserror::Error)]
pub enum ParamsError {
    #[error("model.preset {0:?} is unknown (expected small, hstu-3l or hstu-6l)")]
    UnknownPreset(String),
    #[error("trace metadata: n_tables {n_tables} but {rows} table_rows")]
    Tables { n_tables: u16, rows: usize },
    #[error("model.weights: {0}")]
    Weights(#[from] WeightsError),
    #[error("cost.calibration {path}: {reason}")]
    Calibration { path: String, reason: String },
    #[error("calibrating {preset} for the virtual clock: {reason}")]
    Calibrate { preset: String, reason: String },
    #[error(
        "cost.overhead_scale = {0} has no effect without cost.calibration: the cost model \
         calibrated at start times the kernels alone, with no host overhead to scale (set \
         cost.calibration to a `grflow calibrate` file, which measures it)"
    )]
    OverheadUnmeasured(f64),
    #[error(
        "memory.pool_mib {pool_mib} holds no KV page of {page_bytes} bytes for model {preset:?} \
         (at least {min_mib:.4} MiB)"
    )]
    PoolTooSmall {
        pool_mib: f64,
        page_bytes: u64,
        preset: String,
        min_mib: f64,
    },
}

/// The virtual clock's cost model, scaled by `cost.compute_scale` and
/// `cost.overhead_scale`.
pub fn cost_model(cfg: &Config) -> Result<CostModel, ParamsError> {
    let cost = fitted_cost_model(cfg)?;
    // Said where the model is read or fitted; one handed in (`cost.model`:
    // the allocator bench and trainer, hundreds of replays of one model)
    // was reported once by whoever made it.
    if cfg.cost.model.is_none()
        && let Some(warning) = extrapolation_warning(&cost, cfg)
    {
        tracing::warn!("{warning}");
    }
    Ok(cost
        .scaled(cfg.cost.compute_scale)
        .overhead_scaled(cfg.cost.overhead_scale))
}

/// What to tell a user whose histories `cost` charges by extrapolation.
pub fn extrapolation_warning(cost: &CostModel, cfg: &Config) -> Option<String> {
    let fitted = extrapolated(cost, cfg)?;
    let max = cfg.trace.max_history;
    Some(format!(
        "the cost model was timed on prompts of up to {fitted} tokens, but trace.max_history \
         is {max}: longer prefills are charged by extrapolation (fit the range with `grflow \
         calibrate --max-tokens {max}`)"
    ))
}

/// The longest prompt `cost` was timed at, when the config's histories
/// are longer (files from before `fitted_tokens` were timed up to 512).
pub fn extrapolated(cost: &CostModel, cfg: &Config) -> Option<usize> {
    let fitted = match cost.fitted_tokens {
        0 => grflow_kernels::cost::DEFAULT_FITTED_TOKENS,
        n => n,
    };
    (cfg.trace.max_history as usize > fitted).then_some(fitted)
}

/// The fitted model, before `cost.compute_scale`: the one in hand
/// (`cost.model`, which must therefore be unscaled), read from
/// `cost.calibration` (which must be for `model.preset`), or measured now.
pub fn fitted_cost_model(cfg: &Config) -> Result<CostModel, ParamsError> {
    let preset = &cfg.model.preset;
    if let Some(cost) = &cfg.cost.model {
        if &cost.preset != preset {
            return Err(ParamsError::Calibrate {
                preset: preset.clone(),
                reason: format!("the cost model given is for preset {:?}", cost.preset),
            });
        }
        return Ok(cost.clone());
    }
    if let Some(path) = &cfg.cost.calibration {
        let bad = |reason: String| ParamsError::Calibration {
            path: path.display().to_string(),
            reason,
        };
        let text = std::fs::read_to_string(path).map_err(|e| bad(e.to_string()))?;
        let cost: CostModel = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if &cost.preset != preset {
            return Err(bad(format!(
                "fitted for preset {:?}, but model.preset is {preset:?}",
                cost.preset
            )));
        }
        // The beam term was timed at one width: another would be charged
        // the wrong cost for every retrieve request.
        if (cost.beam_width, cost.beam_top_k) != (cfg.model.beam_width, cfg.model.beam_top_k) {
            return Err(bad(format!(
                "beam search timed at beam_width {} and beam_top_k {}, but model.beam_width is {} \
                 and model.beam_top_k {} (run grflow calibrate --beam-width {} --beam-top-k {})",
                cost.beam_width,
                cost.beam_top_k,
                cfg.model.beam_width,
                cfg.model.beam_top_k,
                cfg.model.beam_width,
                cfg.model.beam_top_k
            )));
        }
        cost.check().map_err(bad)?;
        return Ok(cost);
    }
    // 0 and the default 1 charge what is measured here: nothing.
    let scale = cfg.cost.overhead_scale;
    if scale != 0.0 && scale != 1.0 {
        return Err(ParamsError::OverheadUnmeasured(scale));
    }
    tracing::warn!(
        preset = %preset,
        "calibrating the virtual clock's cost model (set cost.calibration to a \
         `grflow calibrate` file to reuse one)"
    );
    // Timed up to the config's histories, so that they are not extrapolated.
    let tokens = (cfg.trace.max_history as usize).max(grflow_kernels::cost::DEFAULT_FITTED_TOKENS);
    grflow_kernels::cost::calibrate_up_to(
        preset,
        cfg.model.beam_width,
        cfg.model.beam_top_k,
        2,
        tokens,
    )
    .map_err(|e| ParamsError::Calibrate {
        preset: preset.clone(),
        reason: e.to_string(),
    })
}

/// `items` is the trace's catalog, which trained weights must match.
pub fn node_params(
    cfg: &Config,
    meta: &TraceMeta,
    items: &[Item],
) -> Result<NodeParams, ParamsError> {
    let mut model = ModelConfig::preset(&cfg.model.preset)
        .ok_or_else(|| ParamsError::UnknownPreset(cfg.model.preset.clone()))?;
    if meta.table_rows.len() != meta.n_tables as usize {
        return Err(ParamsError::Tables {
            n_tables: meta.n_tables,
            rows: meta.table_rows.len(),
        });
    }
    model.n_tables = meta.n_tables as usize;
    model.codebook_size = meta.codebook_size as usize;
    let trained = match &cfg.model.weights {
        Some(dir) => {
            let t = trained::load(dir, meta, items)?;
            // The trained dimensions replace the preset's.
            model = t.config;
            Some(t.weights)
        }
        None => None,
    };
    let pool_bytes = (cfg.memory.pool_mib * 1024.0 * 1024.0) as u64;
    // The page size depends on the model, so the config alone cannot check it.
    let page_bytes = model.kv_block_floats() as u64 * 4;
    if pool_bytes < page_bytes {
        return Err(ParamsError::PoolTooSmall {
            pool_mib: cfg.memory.pool_mib,
            page_bytes,
            preset: cfg.model.preset.clone(),
            min_mib: page_bytes as f64 / (1024.0 * 1024.0),
        });
    }
    let memory = MemoryParams {
        pool_bytes,
        alpha: cfg.allocator.initial_alpha(cfg.memory.alpha),
        emb_policy: cfg.memory.emb_policy.clone(),
        user_kv_policy: cfg.memory.user_kv_policy.clone(),
        item_kv_policy: cfg.memory.item_kv_policy.clone(),
        // The virtual clock runs no model: a pool sized for a device larger
        // than this host is never allocated.
        metadata_only: cfg.run.clock == crate::config::Clock::Virtual,
    };
    let bytes_per_s = cfg.link.bandwidth_gbps * 1e9;
    let link = LinkConfig {
        bytes_per_s,
        latency_ns: (cfg.link.latency_us * 1e3).round() as u64,
        refill_bytes_per_s: bytes_per_s * cfg.link.refill_share,
    };
    Ok(NodeParams {
        model,
        model_seed: cfg.model.seed,
        top_k: cfg.model.top_k,
        beam_width: cfg.model.beam_width,
        beam_top_k: cfg.model.beam_top_k,
        memory,
        table_rows: meta.table_rows.clone(),
        emb_seed: cfg.model.seed ^ 0x454d_4245_4444_494e,
        shards: ShardMap::new(&meta.table_rows, cfg.node.shard_rows),
        shard_resident_share: cfg.node.shard_resident_share,
        link,
        service_tokens_per_ms: cfg.node.service_tokens_per_ms,
        token_capacity: cfg.node.token_capacity,
        max_users: cfg.node.max_users,
        trained,
        host: None,
        shared_model: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A scale of the host overhead that the calibration at start never
    /// measures is refused before calibrating, naming the field.
    #[test]
    fn an_overhead_scale_without_a_measured_overhead_is_refused() {
        let mut cfg = Config::embedded();
        cfg.run.clock = crate::config::Clock::Virtual;
        cfg.cost.calibration = None;
        cfg.cost.model = None;
        cfg.cost.overhead_scale = 100.0;
        let e = fitted_cost_model(&cfg).unwrap_err().to_string();
        assert!(
            e.starts_with("cost.overhead_scale = 100 has no effect"),
            "{e}"
        );
    }
}
