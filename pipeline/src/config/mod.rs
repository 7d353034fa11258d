//! The job configuration: one TOML file, every section optional, unknown keys
//! rejected. `configs/default.toml` is compiled in as the embedded default.
//!
//! Each section's type lives with its kind: `run.rs` (how the job runs and
//! is timed), `trace.rs` (the synthetic trace), `sections.rs` (model,
//! memory, link, node, batching, windows, cost model), `kafka.rs` (`grflow
//! serve`'s side); `validate.rs` checks a parsed config field by field.

mod kafka;
mod run;
mod sections;
mod trace;
mod validate;

use grflow_operators::allocator::AllocatorConfig;
use grflow_operators::hotness::HotnessConfig;
use grflow_operators::node::batching::BatchPolicy;
use grflow_operators::router::RouterConfig;
use serde::{Deserialize, Serialize};
use std::path::Path;

pub use kafka::KafkaSection;
pub use run::{Clock, Release, ReleaseSetting, RunConfig, SloMs, Speed};
pub use sections::{
    BatchSection, CostSection, LinkSection, MemorySection, ModelSection, NodeSection,
    WindowsSection,
};
pub use trace::DefaultTraceConfig;
pub use validate::{MAX_BEAM, MAX_LANES, MAX_POOL_MIB, MAX_WAIT_MS, MAX_WORKERS};

/// The embedded default, identical to configs/default.toml.
pub const DEFAULT_TOML: &str = include_str!("../../../configs/default.toml");

/// configs/kafka.toml, built in for `serve` and `send` run without
/// `--config` away from the repository (it names no other file).
pub const KAFKA_TOML: &str = include_str!("../../../configs/kafka.toml");

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    #[serde(default)]
    pub run: RunConfig,
    #[serde(default)]
    pub trace: DefaultTraceConfig,
    #[serde(default)]
    pub model: ModelSection,
    #[serde(default)]
    pub memory: MemorySection,
    #[serde(default)]
    pub link: LinkSection,
    #[serde(default)]
    pub router: RouterConfig,
    #[serde(default)]
    pub hotness: HotnessConfig,
    #[serde(default)]
    pub node: NodeSection,
    #[serde(default)]
    pub windows: WindowsSection,
    #[serde(default)]
    pub batch: BatchSection,
    /// Who moves α at runtime (`[allocator]`, HLEM §IV-A).
    #[serde(default)]
    pub allocator: AllocatorConfig,
    /// The virtual clock's cost model (`[cost]`).
    #[serde(default)]
    pub cost: CostSection,
    /// `grflow serve` only: where requests come from and answers go.
    #[serde(default)]
    pub kafka: KafkaSection,
    /// Several processes as one job (timely's cluster mode).
    #[serde(default)]
    pub cluster: crate::cluster::ClusterSection,
}

impl Config {
    /// The node's batching policy (`[batch]` and `node.lanes`).
    pub fn batch_policy(&self) -> BatchPolicy {
        BatchPolicy {
            max_tokens: self.batch.max_tokens,
            max_wait_ms: self.batch.max_wait_ms,
            lanes: self.node.lanes,
        }
    }

    /// The EMB share node `node` and its controller start with: the
    /// allocator policy's start (`kv-opt`: 0) from `memory.node_alpha` when
    /// set (its length is checked against the job's nodes at start), else
    /// from `memory.alpha`.
    pub fn start_alpha(&self, node: usize) -> f64 {
        let configured = self
            .memory
            .node_alpha
            .as_ref()
            .and_then(|a| a.get(node).copied())
            .unwrap_or(self.memory.alpha);
        self.allocator.initial_alpha(configured)
    }
}

/// A config that cannot be used, with where and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("config {path}: {message}")]
    Parse { path: String, message: String },
    #[error("config {path}: {field}: {message}")]
    Invalid {
        path: String,
        field: String,
        message: String,
    },
}

impl Config {
    /// The embedded default.
    pub fn embedded() -> Self {
        Self::parse(DEFAULT_TOML, "<embedded default>").expect("embedded default config is valid")
    }

    /// The built-in copy of configs/kafka.toml.
    pub fn embedded_kafka() -> Self {
        Self::parse(KAFKA_TOML, "<built-in configs/kafka.toml>")
            .expect("built-in configs/kafka.toml is valid")
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: name.clone(),
            source,
        })?;
        let mut cfg = Self::parse(&text, &name)?;
        if let Some(dir) = path.parent() {
            cfg.resolve_inputs(dir);
        }
        Ok(cfg)
    }

    /// A relative input path names a file from the current directory, as the
    /// shipped configs do (`configs/...` from the repository root). One that
    /// is not there is looked for from the config file's side, so that a
    /// config finds its files from any directory and a folder of configs can
    /// be copied with its files: beside the config (`dir/PATH`), by file
    /// name beside it (`dir/NAME`: the shipped `configs/X` named from a
    /// config in `configs/`, or such a folder copied under another name),
    /// then from the folder above it (`dir/../PATH`).
    fn resolve_inputs(&mut self, config_dir: &Path) {
        let beside = |p: &Path| -> Option<std::path::PathBuf> {
            if p.as_os_str().is_empty() || p.is_absolute() || p.exists() {
                return None;
            }
            let mut tries = vec![config_dir.join(p)];
            if let Some(name) = p.file_name() {
                tries.push(config_dir.join(name));
            }
            if let Some(above) = config_dir.parent() {
                tries.push(above.join(p));
            }
            tries.into_iter().find(|there| there.exists())
        };
        for p in [&mut self.model.weights, &mut self.cost.calibration]
            .into_iter()
            .flatten()
        {
            if let Some(there) = beside(p) {
                *p = there;
            }
        }
        for p in [&mut self.allocator.policy_file, &mut self.kafka.catalog] {
            if let Some(there) = beside(Path::new(p.as_str())) {
                *p = there.display().to_string();
            }
        }
    }

    /// Parses and validates; `name` is used in error messages.
    pub fn parse(text: &str, name: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: name.to_string(),
            message: parse_message(&e, text),
        })?;
        cfg.validate(name)?;
        Ok(cfg)
    }

    pub fn speed(&self) -> Speed {
        self.run.speed.parse().expect("validated")
    }

    /// Whether a replay is paced although pacing cannot change its latencies:
    /// on the event or virtual clock with `complete` release, latencies come
    /// from the nodes' modelled timelines and every time is handled in
    /// order, so the wall-clock pace only makes the replay take longer.
    pub fn replay_pacing_is_idle(&self) -> bool {
        self.run.clock != Clock::Wall
            && self.run.replay_release() == Release::Complete
            && self.speed() != Speed::Max
    }
}

/// toml's error on one line, with the line and column and the line's
/// text: its own Display draws the line with a caret over several lines,
/// which a log line cannot hold.
fn parse_message(e: &toml::de::Error, text: &str) -> String {
    let message = e.message().trim_end().replace('\n', " ");
    match e.span() {
        Some(span) => {
            let before = &text[..span.start.min(text.len())];
            let line = before.matches('\n').count() + 1;
            let start = before.rfind('\n').map_or(0, |n| n + 1);
            let column = before.len() - start + 1;
            // The line itself names the key, which toml's message may not
            // ("invalid type: string \"two\", expected usize").
            let source: String = text[start..]
                .lines()
                .next()
                .unwrap_or("")
                .trim()
                .chars()
                .take(80)
                .collect();
            format!("line {line}, column {column} (`{source}`): {message}")
        }
        None => message,
    }
}

#[cfg(test)]
mod tests;
