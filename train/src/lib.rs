//! Training and evaluation of grflow's GR transformer.
//!
//! - [`net`]: forward pass and hand-written backward over the kernels' GEMM,
//!   laid out as a served User-as-prefix request.
//! - [`fit`]: the training loop (AdamW, early stopping, checkpoints).
//! - [`eval`]: SASRec's sampled protocol and full ranking, scored through
//!   the serving kernels, with a popularity baseline.
//! - [`artifact`]: the model directory (`model.safetensors`,
//!   `items.parquet`, `model.json`).

pub mod adamw;
pub mod artifact;
pub mod checkpoint;
pub mod data;
pub mod error;
pub mod eval;
pub mod fit;
pub mod metrics;
pub mod net;
pub mod params;

pub use error::TrainError;
pub use net::{Sequence, Target};
pub use params::Params;
