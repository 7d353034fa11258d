//! The plain sections: `[model]`, `[memory]`, `[link]`, `[node]`,
//! `[batch]`, `[windows]` and `[cost]`, each with its defaults.

use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The per-node statistics windows (HLEM Table I).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WindowsSection {
    /// Event-time length of a window; also the interval of `busy_share_peak`.
    pub epoch_ms: u64,
    /// `grflow serve` only: where each closed window goes as one JSON line:
    /// "stderr", "none", or a file path (appended).
    pub out: String,
}

impl Default for WindowsSection {
    fn default() -> Self {
        Self {
            epoch_ms: 5_000,
            out: "stderr".into(),
        }
    }
}

/// The GR model: a named preset of kernels' ModelConfig and the weight seed.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ModelSection {
    pub preset: String,
    pub seed: u64,
    /// Items returned per response (best first).
    pub top_k: usize,
    /// Retrieve requests: beam width BW and per-beam top-K (xGR).
    pub beam_width: usize,
    pub beam_top_k: usize,
    /// A request with more candidates is answered with a
    /// `too_many_candidates` error when it is decoded, before any work.
    pub max_candidates: usize,
    /// A `grflow train` model directory: serve its transformer and
    /// embedding tables (and its model_version) instead of seeded ones.
    pub weights: Option<PathBuf>,
}

impl Default for ModelSection {
    fn default() -> Self {
        Self {
            preset: "small".into(),
            seed: 7,
            top_k: 10,
            beam_width: 32,
            beam_top_k: 32,
            max_candidates: 1_000,
            weights: None,
        }
    }
}

/// One node's device memory pool (HLEM §IV-B).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MemorySection {
    /// Pool size per node in MiB.
    pub pool_mib: f64,
    /// EMB share α of the pool.
    pub alpha: f64,
    /// α per node, node 0 first, one value for every node of the job
    /// (replaces `alpha`; a controller starts each node there): nodes with
    /// different α specialise, since the router follows EMB and KV
    /// residency.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_alpha: Option<Vec<f64>>,
    /// Eviction policy of the EMB cache: lru | laru | fpb | hf.
    pub emb_policy: String,
    /// Eviction policy of the user-prefix KV cache.
    pub user_kv_policy: String,
    /// Eviction policy of the item-prefix KV cache.
    pub item_kv_policy: String,
}

impl Default for MemorySection {
    fn default() -> Self {
        Self {
            pool_mib: 4.0,
            alpha: 0.25,
            node_alpha: None,
            emb_policy: "lru".into(),
            user_kv_policy: "lru".into(),
            item_kv_policy: "lru".into(),
        }
    }
}

/// The host→device link an EMB miss travels over.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LinkSection {
    /// Bandwidth in GB/s (PCIe 4 x16 ≈ 25).
    pub bandwidth_gbps: f64,
    /// Fixed cost of one transfer in microseconds.
    pub latency_us: f64,
    /// Cap on background refill bandwidth as a share of the link.
    pub refill_share: f64,
}

impl Default for LinkSection {
    fn default() -> Self {
        Self {
            bandwidth_gbps: 25.0,
            latency_us: 10.0,
            refill_share: 0.25,
        }
    }
}

/// Serving-node parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NodeSection {
    /// Rows per embedding shard (the unit of EMB residency the router sees).
    pub shard_rows: u32,
    /// A shard counts as resident when this share of its rows is cached.
    pub shard_resident_share: f64,
    /// Event-time service rate behind the load l(n) on the event clock:
    /// tokens per ms (the virtual clock charges its cost model instead,
    /// `arrival` mode counts work in flight).
    pub service_tokens_per_ms: f64,
    /// Token capacity l(n) is normalised by.
    pub token_capacity: f64,
    /// Users whose prefix head a node tracks at most (least recently served
    /// dropped first), so per-user state stays bounded in long jobs.
    pub max_users: usize,
    /// Execution lanes: rank batches a node runs at once (threads on the
    /// CPU backend), `arrival` mode only.
    pub lanes: usize,
}

impl Default for NodeSection {
    fn default() -> Self {
        Self {
            lanes: 1,
            shard_rows: 32,
            shard_resident_share: 0.5,
            service_tokens_per_ms: 20.0,
            token_capacity: 2_000.0,
            max_users: 100_000,
        }
    }
}

/// How a node batches rank requests into model calls (xGR's token-capacity
/// batching): the requests at hand (one event time in `complete` mode,
/// everything that arrived in `arrival` mode) are cut into batches of at
/// most `max_tokens` tokens each (history + candidates + instruction); a
/// larger request is served alone. 1 serves one request per model call.
/// In `arrival` mode a node serves one batch per step and, with
/// `max_wait_ms > 0`, waits up to that long for a short batch to fill.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct BatchSection {
    pub max_tokens: usize,
    /// How long the oldest request may wait for its batch to fill (ms).
    pub max_wait_ms: f64,
}

impl Default for BatchSection {
    fn default() -> Self {
        Self {
            max_tokens: 2_048,
            max_wait_ms: 0.0,
        }
    }
}

/// Where the virtual clock's cost model comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CostSection {
    /// A `grflow calibrate` file (JSON); without it the job calibrates at
    /// start (seconds for `small`, longer for `hstu-3l`).
    pub calibration: Option<std::path::PathBuf>,
    /// A cost model in hand (a program that calibrated already); used
    /// before `calibration`. Not part of a config file.
    #[serde(skip)]
    pub model: Option<grflow_kernels::cost::CostModel>,
    /// Model compute charged = fitted time × this: the virtual clock of a
    /// device this many times as slow as the calibrating CPU (0.0004 ≈ an
    /// A100 against a ~130 GFLOP/s core; see configs/paper-*.toml).
    pub compute_scale: f64,
    /// The per-request host overhead the calibration measured (router,
    /// dataflow, lookups on this CPU) charged × this; 0 models the device's
    /// compute and the link alone (configs/allocator-emb.toml).
    pub overhead_scale: f64,
}

impl Default for CostSection {
    fn default() -> Self {
        Self {
            calibration: None,
            model: None,
            compute_scale: 1.0,
            overhead_scale: 1.0,
        }
    }
}
