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
    /// The generator settings this section stands for, checked: the error
    /// is `trace.<key>: <why>`.
    pub fn gen_config(&self) -> Result<grflow_traces::GenConfig, String> {
        let g = self.unchecked()?;
        self.check(&g)
            .map_err(|(field, why)| format!("{field}: {why}"))?;
        Ok(g)
    }

    /// The first bad key of this section and why, as (field, message).
    pub(super) fn invalid_field(&self) -> Option<(String, String)> {
        match self.unchecked() {
            Err(e) => Some(("trace.regime".into(), e)),
            Ok(g) => self.check(&g).err(),
        }
    }

    /// The generator's own checks name its CLI flags; a config names keys.
    fn check(&self, g: &grflow_traces::GenConfig) -> Result<(), (String, String)> {
        let Err(grflow_traces::GenError::Invalid { field, rule, value }) = g.validate() else {
            return Ok(());
        };
        if field == "codebook-size" {
            // Not a key: every generated trace uses the default codebook.
            let max = (g.codebook_size as u64).pow(3);
            return Err((
                "trace.items".into(),
                format!(
                    "must be at most {max} ({}³ semantic ids; got {})",
                    g.codebook_size, self.items
                ),
            ));
        }
        Err((
            format!("trace.{}", field.replace('-', "_")),
            format!("must be {rule} (got {value})"),
        ))
    }

    fn unchecked(&self) -> Result<grflow_traces::GenConfig, String> {
        Ok(grflow_traces::GenConfig {
            // The error names trace.regime where it is reported.
            regime: self.regime.parse()?,
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
