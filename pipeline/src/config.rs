//! The job configuration: one TOML file, every section optional, unknown keys
//! rejected. `configs/default.toml` is compiled in as the embedded default.

use grflow_operators::allocator::AllocatorConfig;
use grflow_operators::node::batching::BatchPolicy;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

use grflow_operators::hotness::HotnessConfig;
use grflow_operators::router::RouterConfig;

/// The embedded default, identical to configs/default.toml.
pub const DEFAULT_TOML: &str = include_str!("../../configs/default.toml");

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

/// `grflow serve`: the Kafka side of the job (configs/kafka.toml).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KafkaSection {
    /// bootstrap.servers; the GRFLOW_KAFKA_BROKERS environment variable overrides it.
    pub brokers: String,
    pub request_topic: String,
    pub response_topic: String,
    pub dead_letter_topic: String,
    /// Consumer group the request offsets are committed under.
    pub group_id: String,
    /// Where a partition without a committed offset starts: "earliest" | "latest".
    pub start: String,
    /// Trace directory whose users.parquet / items.parquet / meta.json serve
    /// hist_len requests and the item catalog; empty = the [trace] section's
    /// generated tables (the embedded default).
    pub catalog: String,
    /// After a restart, fetch each partition from its start and skip what was
    /// committed, instead of fetching at the committed offset: needed with
    /// brokers that cannot fetch from inside a record batch (tansu 0.6).
    pub refetch_from_start: bool,
    /// Create missing topics at start with this many partitions (0 = never create).
    pub create_partitions: i32,
    /// A request not answered this long after it was consumed gets a `shed` error record.
    pub deadline_ms: u64,
    /// Per worker: consumed requests without a durable answer before reads pause.
    pub max_in_flight: usize,
    /// Per worker: tokens (history + candidates + 1) of those requests
    /// before reads pause: long histories fill a node with fewer requests.
    pub max_in_flight_tokens: u64,
    /// A partition with no record for this long stops holding back event time.
    pub idle_timeout_ms: u64,
    /// Event time may trail the newest request by at most this much before
    /// older requests count as late (processed, never dropped).
    pub max_skew_ms: u64,
    /// A request whose `ts_ms` is more than this ahead of both the wall
    /// clock and the job's event time is served at the current event time
    /// (counted in `clamped_ts`) and moves no watermark.
    pub max_future_ms: u64,
    /// Retries of an output the client or broker refused for good, before
    /// it goes to the dead-letter topic as `undeliverable`.
    pub produce_retries: u32,
    /// Wait before the first of those retries; doubles with each (at most 10 s).
    pub produce_retry_backoff_ms: u64,
    /// Longest wait at shutdown for in-flight requests to be answered and
    /// delivered; past it, their offsets stay uncommitted.
    pub drain_timeout_ms: u64,
    /// How often consumed offsets whose answers are durable get committed.
    pub commit_interval_ms: u64,
    /// How often consumer lag and counters are logged.
    pub metrics_interval_ms: u64,
    /// Messages over this size go to the dead-letter topic.
    pub max_message_bytes: usize,
    /// On start, the last N messages of each response-topic partition are
    /// read back so requests answered before a crash are not answered again.
    pub restart_scan: i64,
    /// Extra librdkafka properties, e.g. { "socket.timeout.ms" = "10000" }:
    /// TLS (`security.protocol = "ssl"`, `ssl.ca.location`, ...) and SASL
    /// (`sasl.mechanism = "SCRAM-SHA-256"`, `sasl.username`, ...). The
    /// GRFLOW_KAFKA_SASL_PASSWORD environment variable sets `sasl.password`.
    pub librdkafka: std::collections::BTreeMap<String, String>,
    /// `/readyz` says not ready once no broker has answered a metadata
    /// request (asked every second) for this long; ready again when one
    /// does. 0 = never.
    pub unready_after_ms: u64,
    /// Codec of what `serve` writes: "none", "gzip", "snappy", "lz4", "zstd".
    /// Compressed request topics are read whatever this says.
    pub compression: grflow_connectors::kafka::Compression,
}

impl Default for KafkaSection {
    fn default() -> Self {
        Self {
            brokers: "127.0.0.1:9092".into(),
            request_topic: "grflow.requests".into(),
            response_topic: "grflow.responses".into(),
            dead_letter_topic: "grflow.dead-letters".into(),
            group_id: "grflow".into(),
            start: "earliest".into(),
            catalog: String::new(),
            refetch_from_start: false,
            create_partitions: 4,
            deadline_ms: 2_000,
            max_in_flight: 2_048,
            max_in_flight_tokens: 262_144,
            idle_timeout_ms: 50,
            max_skew_ms: 2_000,
            max_future_ms: 60_000,
            produce_retries: 5,
            produce_retry_backoff_ms: 100,
            drain_timeout_ms: 30_000,
            commit_interval_ms: 500,
            metrics_interval_ms: 5_000,
            max_message_bytes: 1 << 20,
            restart_scan: 200_000,
            librdkafka: Default::default(),
            unready_after_ms: 10_000,
            compression: Default::default(),
        }
    }
}

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

/// Latency objectives (ms), one per request kind: beam search does more
/// work per request than ranking, so it gets its own.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct SloMs {
    pub rank: f64,
    pub retrieve: f64,
}

impl SloMs {
    /// The same objective for both kinds.
    pub fn both(ms: f64) -> Self {
        Self {
            rank: ms,
            retrieve: ms,
        }
    }

    pub fn for_mode(&self, mode: grflow_traces::Mode) -> f64 {
        match mode {
            grflow_traces::Mode::Rank => self.rank,
            grflow_traces::Mode::Retrieve => self.retrieve,
        }
    }
}

impl<'de> Deserialize<'de> for SloMs {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// A number for both kinds, or a table with one per kind.
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Written {
            Both(f64),
            Each(Each),
        }
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Each {
            rank: f64,
            retrieve: f64,
        }
        match Written::deserialize(d).map_err(|_| {
            serde::de::Error::custom(
                "slo_ms must be a number or a table { rank = MS, retrieve = MS }",
            )
        })? {
            Written::Both(ms) => Ok(SloMs::both(ms)),
            Written::Each(e) => Ok(SloMs {
                rank: e.rank,
                retrieve: e.retrieve,
            }),
        }
    }
}

/// How the job runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RunConfig {
    /// Timely workers in this process; one worker is one serving node.
    pub workers: usize,
    /// Pacing of event time against wall time: "max", "1x", "4x", "0.5x".
    pub speed: String,
    /// Latency objectives for slo_satisfaction: `slo_ms = 30.0` for both
    /// request kinds, or `slo_ms = { rank = 30.0, retrieve = 50.0 }`.
    pub slo_ms: SloMs,
    /// What latency_ms measures: "wall" (admission to response on this
    /// machine) or "event" (the node's event-time service model).
    pub clock: Clock,
    /// When router and nodes handle a request: "complete" (once every input
    /// has passed its event time; deterministic), "arrival" (as it arrives,
    /// with the state known so far) or "auto" (complete with clock = "event",
    /// arrival with clock = "wall" and in `grflow serve`).
    pub release: ReleaseSetting,
    /// With speed = "max": how far (event ms) the source may run ahead of
    /// the oldest event time not yet answered. Bounds the requests in
    /// flight (memory) and the times timely tracks; paced runs are not
    /// held back, so an overloaded node shows its queue as latency.
    pub max_ahead_ms: u64,
}

impl Default for RunConfig {
    fn default() -> Self {
        Self {
            workers: 2,
            speed: "1x".into(),
            slo_ms: SloMs {
                rank: 30.0,
                retrieve: 50.0,
            },
            clock: Clock::Wall,
            release: ReleaseSetting::Auto,
            max_ahead_ms: 2_000,
        }
    }
}

impl RunConfig {
    /// The release policy of `grflow replay`: `auto` follows the clock.
    pub fn replay_release(&self) -> Release {
        match self.release {
            ReleaseSetting::Complete => Release::Complete,
            ReleaseSetting::Arrival => Release::Arrival,
            ReleaseSetting::Auto => match self.clock {
                Clock::Event | Clock::Virtual => Release::Complete,
                Clock::Wall => Release::Arrival,
            },
        }
    }

    /// The release policy of `grflow serve`: `auto` is arrival (a live
    /// service does not hold requests back for its slowest partition).
    pub fn serve_release(&self) -> Release {
        match self.release {
            ReleaseSetting::Complete => Release::Complete,
            ReleaseSetting::Arrival | ReleaseSetting::Auto => Release::Arrival,
        }
    }
}

/// `run.release` as written in the config.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReleaseSetting {
    #[default]
    Auto,
    Complete,
    Arrival,
}

impl std::str::FromStr for ReleaseSetting {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "auto" => Ok(Self::Auto),
            "complete" => Ok(Self::Complete),
            "arrival" => Ok(Self::Arrival),
            _ => Err(format!("release {s:?} is not complete, arrival or auto")),
        }
    }
}

/// When a stateful operator handles the data of an event time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Release {
    /// Once every input's frontier has passed the time: control and data of
    /// one time are handled together, in time order. Deterministic.
    Complete,
    /// As data arrives, with the state known so far (HLEM's asynchronous
    /// state sync); frontiers only tell the operator a time is over.
    Arrival,
}

impl Release {
    pub fn as_str(self) -> &'static str {
        match self {
            Release::Complete => "complete",
            Release::Arrival => "arrival",
        }
    }
}

/// The clock latency is measured on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Clock {
    /// Wall time from a request's admission by the source to its response:
    /// what this machine actually delivered.
    #[default]
    Wall,
    /// The serving node's event-time model (backlog over service rate plus
    /// link time): deterministic, the same on any machine and at any speed.
    Event,
    /// Model work is not run but charged from a cost model fitted on a
    /// machine (`grflow calibrate`), each node on its own timeline: a
    /// request waits for the node's earlier work, then its link transfers
    /// and its compute. Deterministic, and fast (no model runs).
    Virtual,
}

impl Clock {
    pub fn as_str(self) -> &'static str {
        match self {
            Clock::Wall => "wall",
            Clock::Event => "event",
            Clock::Virtual => "virtual",
        }
    }
}

impl std::str::FromStr for Clock {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "wall" => Ok(Clock::Wall),
            "event" => Ok(Clock::Event),
            "virtual" => Ok(Clock::Virtual),
            _ => Err(format!("clock {s:?} is not wall, event or virtual")),
        }
    }
}

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
    /// Event-time service rate used for the load l(n): tokens per ms.
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

/// Event time against wall time.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Speed {
    /// As fast as the job can go.
    Max,
    /// `factor` ms of event time per ms of wall time.
    Factor(f64),
}

impl std::str::FromStr for Speed {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "max" {
            return Ok(Speed::Max);
        }
        let factor = s
            .strip_suffix('x')
            .and_then(|f| f.parse::<f64>().ok())
            .filter(|f| f.is_finite() && *f > 0.0)
            .ok_or_else(|| {
                format!("speed {s:?} is not max or a positive factor like 1x, 4x, 0.5x")
            })?;
        Ok(Speed::Factor(factor))
    }
}

impl Config {
    /// The embedded default.
    pub fn embedded() -> Self {
        Self::parse(DEFAULT_TOML, "<embedded default>").expect("embedded default config is valid")
    }

    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: name.clone(),
            source,
        })?;
        Self::parse(&text, &name)
    }

    /// Parses and validates; `name` is used in error messages.
    pub fn parse(text: &str, name: &str) -> Result<Self, ConfigError> {
        let cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse {
            path: name.to_string(),
            // toml's message already names the key, line and column.
            message: e.to_string().trim_end().replace('\n', " | "),
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

    fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let invalid = |field: &str, message: String| ConfigError::Invalid {
            path: name.to_string(),
            field: field.to_string(),
            message,
        };
        if self.run.workers == 0 {
            return Err(invalid("run.workers", "must be >= 1".into()));
        }
        self.run
            .speed
            .parse::<Speed>()
            .map_err(|m| invalid("run.speed", m))?;
        for (field, ms) in [
            ("run.slo_ms.rank", self.run.slo_ms.rank),
            ("run.slo_ms.retrieve", self.run.slo_ms.retrieve),
        ] {
            if ms.is_nan() || ms <= 0.0 {
                return Err(invalid(field, format!("must be > 0 (got {ms})")));
            }
        }
        let scale = self.cost.compute_scale;
        if !(scale.is_finite() && scale > 0.0) {
            return Err(invalid(
                "cost.compute_scale",
                format!("must be > 0 (got {scale})"),
            ));
        }
        let overhead = self.cost.overhead_scale;
        if !(overhead.is_finite() && overhead >= 0.0) {
            return Err(invalid(
                "cost.overhead_scale",
                format!("must be >= 0 (got {overhead})"),
            ));
        }
        if self.trace.min_history == 0 || self.trace.min_history > self.trace.max_history {
            return Err(invalid(
                "trace.min_history",
                format!(
                    "must be in 1..=trace.max_history ({}), got {}",
                    self.trace.max_history, self.trace.min_history
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.memory.alpha) {
            return Err(invalid(
                "memory.alpha",
                format!("must be in [0, 1] (got {})", self.memory.alpha),
            ));
        }
        if let Some(alphas) = &self.memory.node_alpha {
            if alphas.is_empty() {
                return Err(invalid(
                    "memory.node_alpha",
                    "must name one α per node (got an empty list)".to_string(),
                ));
            }
            if let Some((i, a)) = alphas
                .iter()
                .enumerate()
                .find(|(_, a)| !(0.0..=1.0).contains(*a))
            {
                return Err(invalid(
                    "memory.node_alpha",
                    format!("value {i} must be in [0, 1] (got {a})"),
                ));
            }
        }
        if self.memory.pool_mib.is_nan() || self.memory.pool_mib <= 0.0 {
            return Err(invalid(
                "memory.pool_mib",
                format!("must be > 0 (got {})", self.memory.pool_mib),
            ));
        }
        if self.link.bandwidth_gbps.is_nan() || self.link.bandwidth_gbps <= 0.0 {
            return Err(invalid("link.bandwidth_gbps", "must be > 0".into()));
        }
        if !(self.link.refill_share > 0.0 && self.link.refill_share <= 1.0) {
            return Err(invalid("link.refill_share", "must be in (0, 1]".into()));
        }
        if self.node.shard_rows == 0 {
            return Err(invalid("node.shard_rows", "must be >= 1".into()));
        }
        if !(self.node.service_tokens_per_ms > 0.0 && self.node.token_capacity > 0.0) {
            return Err(invalid(
                "node",
                "service_tokens_per_ms and token_capacity must be > 0".into(),
            ));
        }
        if self.node.max_users == 0 {
            return Err(invalid("node.max_users", "must be >= 1".into()));
        }
        if self.hotness.max_users == 0 {
            return Err(invalid("hotness.max_users", "must be >= 1".into()));
        }
        if self.batch.max_tokens == 0 {
            return Err(invalid("batch.max_tokens", "must be >= 1".into()));
        }
        if !(self.batch.max_wait_ms >= 0.0 && self.batch.max_wait_ms.is_finite()) {
            return Err(invalid(
                "batch.max_wait_ms",
                "must be a finite number >= 0".into(),
            ));
        }
        self.allocator
            .validate()
            .map_err(|e| invalid("allocator", e))?;
        if self.node.lanes == 0 || self.node.lanes > 64 {
            return Err(invalid("node.lanes", "must be in 1..=64".into()));
        }
        if self.windows.epoch_ms == 0 {
            return Err(invalid("windows.epoch_ms", "must be >= 1".into()));
        }
        if self.windows.out.trim().is_empty() {
            return Err(invalid(
                "windows.out",
                "must be \"stderr\", \"none\" or a file path".into(),
            ));
        }
        if self.model.top_k == 0 {
            return Err(invalid("model.top_k", "must be >= 1".into()));
        }
        if self.model.beam_width == 0 {
            return Err(invalid("model.beam_width", "must be >= 1".into()));
        }
        if self.model.beam_top_k == 0 {
            return Err(invalid("model.beam_top_k", "must be >= 1".into()));
        }
        if self.model.max_candidates == 0 {
            return Err(invalid("model.max_candidates", "must be >= 1".into()));
        }
        self.router
            .validate()
            .map_err(|e| invalid("router", e.to_string()))?;
        let k = &self.kafka;
        for (field, value) in [
            ("kafka.brokers", &k.brokers),
            ("kafka.request_topic", &k.request_topic),
            ("kafka.response_topic", &k.response_topic),
            ("kafka.dead_letter_topic", &k.dead_letter_topic),
            ("kafka.group_id", &k.group_id),
        ] {
            if value.trim().is_empty() {
                return Err(invalid(field, "must not be empty".into()));
            }
        }
        if !matches!(k.start.as_str(), "earliest" | "latest") {
            return Err(invalid(
                "kafka.start",
                format!("{:?} is not \"earliest\" or \"latest\"", k.start),
            ));
        }
        for (field, value) in [
            ("kafka.deadline_ms", k.deadline_ms),
            ("kafka.max_in_flight", k.max_in_flight as u64),
            ("kafka.max_in_flight_tokens", k.max_in_flight_tokens),
            ("kafka.idle_timeout_ms", k.idle_timeout_ms),
            ("kafka.commit_interval_ms", k.commit_interval_ms),
            ("kafka.metrics_interval_ms", k.metrics_interval_ms),
            ("kafka.max_message_bytes", k.max_message_bytes as u64),
            ("kafka.drain_timeout_ms", k.drain_timeout_ms),
        ] {
            if value == 0 {
                return Err(invalid(field, "must be >= 1".into()));
            }
        }
        if k.create_partitions < 0 || k.restart_scan < 0 {
            return Err(invalid(
                "kafka",
                "create_partitions and restart_scan must be >= 0".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grflow_operators::allocator::AllocatorPolicy;

    #[test]
    fn embedded_default_parses() {
        let cfg = Config::embedded();
        assert_eq!(cfg.run.workers, 2);
        assert_eq!(cfg.run.slo_ms.rank, 30.0);
    }

    #[test]
    fn embedded_file_and_compiled_defaults_agree() {
        // A key left out of a user's file falls back to the compiled default,
        // so the two must not drift apart.
        assert_eq!(Config::embedded(), Config::default());
    }

    #[test]
    fn unknown_key_is_named() {
        let err = Config::parse("[run]\nworkres = 3\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("x.toml"), "{err}");
        assert!(err.contains("workres"), "{err}");
    }

    #[test]
    fn an_unknown_codec_is_named_with_the_ones_there_are() {
        let err = Config::parse("[kafka]\ncompression = \"brotli\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("brotli") && err.contains("zstd"), "{err}");
        let ok = Config::parse("[kafka]\ncompression = \"lz4\"\n", "x.toml").unwrap();
        assert_eq!(
            ok.kafka.compression,
            grflow_connectors::kafka::Compression::Lz4
        );
    }

    #[test]
    fn unknown_section_is_named() {
        let err = Config::parse("[rn]\nworkers = 3\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("rn"), "{err}");
    }

    #[test]
    fn bad_values_name_their_field() {
        let err = Config::parse("[memory]\nalpha = 1.5\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("memory.alpha"), "{err}");
        let err = Config::parse("[memory]\nnode_alpha = [0.1, 1.2]\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("memory.node_alpha") && err.contains("value 1"),
            "{err}"
        );
        let err = Config::parse("[memory]\nnode_alpha = []\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("memory.node_alpha"), "{err}");
        let cfg =
            Config::parse("[memory]\nalpha = 0.3\nnode_alpha = [0.1, 0.8]\n", "x.toml").unwrap();
        assert_eq!((cfg.start_alpha(0), cfg.start_alpha(1)), (0.1, 0.8));
        assert_eq!(
            Config::embedded().start_alpha(1),
            Config::embedded().memory.alpha
        );
        let err = Config::parse("[run]\nspeed = \"fast\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("run.speed"), "{err}");
        let err = Config::parse("[router]\nmiss_cost_kv = -1.0\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("miss_cost_kv"), "{err}");
        for key in ["router.max_users", "node.max_users", "hotness.max_users"] {
            let (section, field) = key.split_once('.').unwrap();
            let err = Config::parse(&format!("[{section}]\n{field} = 0\n"), "x.toml")
                .unwrap_err()
                .to_string();
            assert!(err.contains(key), "{err}");
        }
    }

    #[test]
    fn pacing_is_idle_only_for_a_paced_deterministic_replay() {
        let with = |clock: &str, speed: &str, release: &str| {
            Config::parse(
                &format!(
                    "[run]\nclock = \"{clock}\"\nspeed = \"{speed}\"\nrelease = \"{release}\"\n"
                ),
                "x.toml",
            )
            .unwrap()
            .replay_pacing_is_idle()
        };
        assert!(with("virtual", "1x", "auto"));
        assert!(with("event", "4x", "complete"));
        assert!(!with("virtual", "max", "auto"));
        assert!(!with("wall", "1x", "auto"));
        // arrival on a model clock: what has arrived depends on the pace.
        assert!(!with("virtual", "1x", "arrival"));
    }

    #[test]
    fn release_auto_follows_the_clock_in_replay_and_is_arrival_in_serve() {
        let mut run = RunConfig::default();
        assert_eq!(run.release, ReleaseSetting::Auto);
        assert_eq!(run.replay_release(), Release::Arrival);
        assert_eq!(run.serve_release(), Release::Arrival);
        run.clock = Clock::Event;
        assert_eq!(run.replay_release(), Release::Complete);
        assert_eq!(run.serve_release(), Release::Arrival);
        let cfg = Config::parse("[run]\nrelease = \"complete\"\n", "x.toml").unwrap();
        assert_eq!(cfg.run.replay_release(), Release::Complete);
        assert_eq!(cfg.run.serve_release(), Release::Complete);
        let err = Config::parse("[run]\nrelease = \"eager\"\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("release"), "{err}");
    }

    #[test]
    fn speed_parses() {
        assert_eq!("max".parse::<Speed>().unwrap(), Speed::Max);
        assert_eq!("4x".parse::<Speed>().unwrap(), Speed::Factor(4.0));
        assert!("0x".parse::<Speed>().is_err());
    }

    #[test]
    fn shipped_kafka_config_resumes_at_the_committed_offset() {
        // Apache Kafka's behaviour ships; tansu's workaround has its own file,
        // identical but for that one key.
        let kafka = Config::parse(
            include_str!("../../configs/kafka.toml"),
            "configs/kafka.toml",
        )
        .unwrap();
        assert!(!kafka.kafka.refetch_from_start);
        assert_eq!(kafka.kafka.deadline_ms, 2_000);
        assert_eq!(kafka.kafka.max_future_ms, 60_000);
        let mut tansu = Config::parse(
            include_str!("../../configs/kafka-tansu.toml"),
            "configs/kafka-tansu.toml",
        )
        .unwrap();
        assert!(tansu.kafka.refetch_from_start);
        tansu.kafka.refetch_from_start = false;
        assert_eq!(tansu, kafka);
    }

    #[test]
    fn the_allocator_preset_is_the_default_with_the_training_shape() {
        let c = Config::parse(
            include_str!("../../configs/allocator-small.toml"),
            "configs/allocator-small.toml",
        )
        .unwrap();
        let mut d = Config::embedded();
        assert_eq!(d.allocator.policy_file, "configs/allocator-ppo.safetensors");
        assert_eq!(c.allocator.policy, AllocatorPolicy::Smart);
        // What `grflow train-allocator --slo-ms 3 --requests 24000 --rps 40`
        // sets on the embedded default, and nothing else.
        d.run.slo_ms = SloMs::both(3.0);
        d.trace.requests = 24_000;
        d.trace.rps = 40.0;
        d.allocator.policy = AllocatorPolicy::Smart;
        // The committed cost model, so the bench is the same everywhere.
        d.cost.calibration = Some("configs/allocator-calibration.json".into());
        assert_eq!(c, d);
    }

    #[test]
    fn the_emb_kv_preset_is_the_allocator_preset_on_a_balanced_device() {
        let c = Config::parse(
            include_str!("../../configs/allocator-emb.toml"),
            "configs/allocator-emb.toml",
        )
        .unwrap();
        let mut d = Config::parse(
            include_str!("../../configs/allocator-small.toml"),
            "configs/allocator-small.toml",
        )
        .unwrap();
        d.run.slo_ms = SloMs::both(0.05);
        d.link.bandwidth_gbps = 8.0;
        d.cost.compute_scale = 0.01;
        d.cost.overhead_scale = 0.0;
        d.allocator.policy_file = "configs/allocator-emb-ppo.safetensors".into();
        assert_eq!(c, d);
        // A negative overhead scale is refused by name.
        let bad = Config::parse("[cost]\noverhead_scale = -1.0\n", "bad.toml").unwrap_err();
        assert!(bad.to_string().contains("cost.overhead_scale"), "{bad}");
    }

    #[test]
    fn the_tight_preset_is_the_emb_kv_preset_with_half_the_pool() {
        let c = Config::parse(
            include_str!("../../configs/allocator-tight.toml"),
            "configs/allocator-tight.toml",
        )
        .unwrap();
        let mut d = Config::parse(
            include_str!("../../configs/allocator-emb.toml"),
            "configs/allocator-emb.toml",
        )
        .unwrap();
        d.memory.pool_mib = 2.0;
        d.allocator.policy_file = "configs/allocator-tight-ppo.safetensors".into();
        assert_eq!(c, d);
        let policy = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(&c.allocator.policy_file);
        assert!(policy.exists(), "{}", policy.display());
        // The cost model the policy was trained and benched with, named by
        // the config so that the bench and the trainer use it by default.
        assert_eq!(
            c.cost.calibration.as_deref(),
            Some(std::path::Path::new("configs/allocator-calibration.json"))
        );
        let cost: grflow_kernels::cost::CostModel =
            serde_json::from_str(include_str!("../../configs/allocator-calibration.json")).unwrap();
        assert_eq!(cost.preset, c.model.preset.as_str());
        assert_eq!(cost.gemm_gflops, 131.7);
    }

    #[test]
    fn paper_presets_parse_as_8_virtual_nodes_at_an_a100_over_pcie_ratio() {
        for (name, text) in [
            (
                "paper-steady",
                include_str!("../../configs/paper-steady.toml"),
            ),
            (
                "paper-trend",
                include_str!("../../configs/paper-trend.toml"),
            ),
            (
                "paper-burst",
                include_str!("../../configs/paper-burst.toml"),
            ),
        ] {
            let c = Config::parse(text, name).unwrap();
            assert_eq!(c.run.workers, 8, "{name}");
            assert_eq!(c.run.clock, Clock::Virtual, "{name}");
            assert_eq!(c.model.preset, "hstu-3l", "{name}");
            assert!(name.ends_with(&c.trace.regime), "{name}");
            // ~130 GFLOP/s / compute_scale over the link: HLEM's 12.5-15.5
            // TFLOP/s per GB/s.
            let ratio = 130e9 / c.cost.compute_scale / (c.link.bandwidth_gbps * 1e9) / 1e3;
            assert!((12.0..=15.5).contains(&ratio), "{name}: {ratio}");
        }
    }

    #[test]
    fn kafka_hardening_keys_default_and_validate() {
        let k = Config::parse("", "x.toml").unwrap().kafka;
        assert_eq!(
            (
                k.max_future_ms,
                k.produce_retries,
                k.produce_retry_backoff_ms,
                k.drain_timeout_ms
            ),
            (60_000, 5, 100, 30_000)
        );
        let err = Config::parse("[kafka]\ndrain_timeout_ms = 0\n", "x.toml")
            .unwrap_err()
            .to_string();
        assert!(err.contains("kafka.drain_timeout_ms"), "{err}");
    }

    #[test]
    fn empty_file_means_defaults() {
        let cfg = Config::parse("", "empty.toml").unwrap();
        assert_eq!(cfg.memory, MemorySection::default());
    }
}
