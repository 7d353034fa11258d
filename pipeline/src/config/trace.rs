//! `[trace]`: the synthetic trace replayed when no `--trace` is given.

use serde::{Deserialize, Serialize};

/// The synthetic trace `grflow replay` generates when no `--trace` is given.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DefaultTraceConfig {
    pub regime: String,
    pub users: u64,
    pub items: u32,
    pub requests: u64,
    pub rps: f64,
    pub seed: u64,
    pub tables: u16,
    /// Candidates per request (the label plus popularity-sampled items).
    pub candidates: usize,
    /// Share of generative-retrieval (beam search) requests.
    pub retrieve_share: f64,
    /// History lengths (items) are drawn between these.
    pub min_history: u32,
    pub max_history: u32,
}

impl Default for DefaultTraceConfig {
    fn default() -> Self {
        Self {
            regime: "burst".into(),
            users: 3_000,
            items: 20_000,
            requests: 12_000,
            rps: 140.0,
            seed: 42,
            tables: 4,
            candidates: grflow_traces::GenConfig::default().candidates,
            retrieve_share: 0.2,
            min_history: grflow_traces::GenConfig::default().min_history,
            max_history: grflow_traces::GenConfig::default().max_history,
        }
    }
}

impl DefaultTraceConfig {
    /// The generator settings this section stands for.
    pub fn gen_config(&self) -> Result<grflow_traces::GenConfig, String> {
        Ok(grflow_traces::GenConfig {
            regime: self
                .regime
                .parse()
                .map_err(|e| format!("trace.regime: {e}"))?,
            users: self.users,
            items: self.items,
            requests: self.requests,
            rps: self.rps,
            seed: self.seed,
            tables: self.tables,
            candidates: self.candidates,
            retrieve_share: self.retrieve_share,
            min_history: self.min_history,
            max_history: self.max_history,
            ..grflow_traces::GenConfig::default()
        })
    }
}
