//! One file per subcommand.

pub mod bench_cache;
pub mod bench_kafka;
pub mod bench_kernels;
pub mod bench_memory;
pub mod bench_serve;
pub mod eval;
pub mod gen_trace;
pub mod import;
pub mod replay;
pub mod serve;
pub mod train;

/// The user's input (a file, a flag, a config) is wrong: exit code 2.
/// Wrap library errors that are the user's to fix in this.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct InputError(pub String);

impl InputError {
    pub fn from_display(e: impl std::fmt::Display) -> anyhow::Error {
        anyhow::Error::new(InputError(e.to_string()))
    }
}

/// Logs to stderr at `GRFLOW_LOG`, or at `default_level` when it is unset.
pub fn init_tracing(default_level: &str) {
    use tracing_subscriber::EnvFilter;
    let filter =
        EnvFilter::try_from_env("GRFLOW_LOG").unwrap_or_else(|_| EnvFilter::new(default_level));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}
