//! Next-access-time prediction for LARU (LCR §5.1): per-key features
//! (last 10 inter-access deltas, 10 exponentially decayed counters, size,
//! request length and place in the request),
//! an online GBDT regressor retrained every 1,000 samples on a sliding
//! window of 100,000, and LCR §5.2 noise injection for robustness studies.

mod features;
mod gbdt;
mod noise;
mod online;

pub use features::{AccessContext, FEATURES, FeatureRow, FeatureTracker};
pub use gbdt::{GbdtConfig, GbdtError, NextAccessModel};
pub use noise::Noise;
pub use online::{OnlinePredictor, PredictorConfig, Training, VersionInfo};
