//! The GBDT regressor (forust-ml, pure Rust, LightGBM-like histogram
//! boosting) of log2(1 + reuse interval).

use forust_ml::objective::ObjectiveType;
use forust_ml::{GradientBooster, Matrix};
use serde::Deserialize;

use super::features::{FEATURES, FeatureRow};

/// Booster hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GbdtConfig {
    pub trees: usize,
    pub max_depth: usize,
    pub learning_rate: f32,
    /// Histogram bins per feature.
    pub bins: u16,
    /// Use the rayon pool while training.
    pub parallel: bool,
}

impl Default for GbdtConfig {
    fn default() -> Self {
        Self {
            trees: 32,
            max_depth: 6,
            learning_rate: 0.3,
            bins: 64,
            parallel: false,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GbdtError {
    #[error("gbdt: {0}")]
    Forust(String),
    #[error("gbdt: no training samples")]
    Empty,
}

/// A trained next-access model: features → predicted reuse interval.
pub struct NextAccessModel {
    booster: GradientBooster,
}

impl std::fmt::Debug for NextAccessModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextAccessModel")
            .field("trees", &self.booster.trees.len())
            .finish()
    }
}

fn column_major(rows: &[FeatureRow]) -> Vec<f64> {
    let mut data = vec![0f64; rows.len() * FEATURES];
    for (r, row) in rows.iter().enumerate() {
        for (c, &v) in row.iter().enumerate() {
            data[c * rows.len() + r] = v as f64;
        }
    }
    data
}

impl NextAccessModel {
    /// Fits on `rows` with targets `intervals` (accesses until the next request).
    pub fn train(
        cfg: &GbdtConfig,
        rows: &[FeatureRow],
        intervals: &[f64],
    ) -> Result<Self, GbdtError> {
        if rows.is_empty() {
            return Err(GbdtError::Empty);
        }
        let data = column_major(rows);
        let matrix = Matrix::new(&data, rows.len(), FEATURES);
        let y: Vec<f64> = intervals
            .iter()
            .map(|&i| (1.0 + i.max(0.0)).log2())
            .collect();
        let mut booster = GradientBooster::default()
            .set_objective_type(ObjectiveType::SquaredLoss)
            .set_iterations(cfg.trees)
            .set_max_depth(cfg.max_depth)
            .set_learning_rate(cfg.learning_rate)
            .set_nbins(cfg.bins)
            .set_parallel(cfg.parallel)
            .set_initialize_base_score(true);
        booster
            .fit_unweighted(&matrix, &y, None)
            .map_err(|e| GbdtError::Forust(e.to_string()))?;
        Ok(Self { booster })
    }

    /// Predicted reuse intervals (accesses) of `rows`.
    pub fn predict_intervals(&self, rows: &[FeatureRow]) -> Vec<f64> {
        if rows.is_empty() {
            return Vec::new();
        }
        let data = column_major(rows);
        let matrix = Matrix::new(&data, rows.len(), FEATURES);
        self.booster
            .predict(&matrix, false)
            .into_iter()
            .map(|l| l.exp2() - 1.0)
            .collect()
    }
}
