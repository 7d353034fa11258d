//! Why training or evaluation could not run.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("trace {}: {reason}", dir.display())]
    Trace { dir: PathBuf, reason: String },
    #[error("{}: {reason}", path.display())]
    Model { path: PathBuf, reason: String },
    #[error("kernels: {0}")]
    Kernel(#[from] grflow_kernels::KernelError),
    #[error("{0}")]
    Invalid(String),
}

impl TrainError {
    pub(crate) fn io(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> TrainError + '_ {
        move |source| TrainError::Io {
            path: path.to_path_buf(),
            source,
        }
    }
}
