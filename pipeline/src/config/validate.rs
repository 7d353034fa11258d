//! Whether a parsed config can be used: each field checked, the first bad
//! one named with why.

use super::{Config, ConfigError, Speed};

/// The largest `memory.pool_mib` accepted: 1 TiB.
pub const MAX_POOL_MIB: f64 = 1_048_576.0;

/// The most workers a process may run (`run.workers`): each is a thread
/// and a serving node with its own pool, far past any host's cores; 2,000
/// panicked inside timely.
pub const MAX_WORKERS: usize = 1024;

/// The most execution lanes a node may run (`node.lanes`).
pub const MAX_LANES: usize = 64;

/// `cost.compute_scale` beyond this is a typo (see `validate`).
const MAX_COMPUTE_SCALE: f64 = 1_000.0;
/// `node.service_tokens_per_ms` below this is a typo (see `validate`).
const MIN_SERVICE_TOKENS_PER_MS: f64 = 0.001;

/// Makes a field's error, naming the config file.
struct Check<'a> {
    path: &'a str,
}

impl Check<'_> {
    fn invalid(&self, field: &str, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: self.path.to_string(),
            field: field.to_string(),
            message,
        }
    }

    /// `inf` passes a plain `> 0` and NaN fails every comparison.
    fn finite_positive(&self, field: &str, v: f64) -> Result<(), ConfigError> {
        if v.is_finite() && v > 0.0 {
            Ok(())
        } else {
            Err(self.invalid(field, format!("must be a finite number > 0 (got {v})")))
        }
    }
}

impl Config {
    pub(super) fn validate(&self, name: &str) -> Result<(), ConfigError> {
        let c = Check { path: name };
        self.check_run(&c)?;
        self.check_cost(&c)?;
        self.check_trace(&c)?;
        self.check_memory(&c)?;
        self.check_link(&c)?;
        self.check_node(&c)?;
        self.check_hotness(&c)?;
        self.check_batch(&c)?;
        self.allocator
            .validate()
            .map_err(|(key, message)| c.invalid(key, message))?;
        self.check_windows(&c)?;
        self.check_model(&c)?;
        self.router
            .validate()
            .map_err(|e| c.invalid("router", e.to_string()))?;
        self.check_kafka(&c)
    }

    /// `[run]`: workers, speed and the SLOs.
    fn check_run(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        if self.run.workers == 0 || self.run.workers > MAX_WORKERS {
            return Err(c.invalid(
                "run.workers",
                format!("must be in 1..={MAX_WORKERS} (got {})", self.run.workers),
            ));
        }
        self.run
            .speed
            .parse::<Speed>()
            .map_err(|m| c.invalid("run.speed", m))?;
        c.finite_positive("run.slo_ms.rank", self.run.slo_ms.rank)?;
        c.finite_positive("run.slo_ms.retrieve", self.run.slo_ms.retrieve)?;
        Ok(())
    }

    /// `[cost]`: the virtual clock's scales.
    fn check_cost(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        c.finite_positive("cost.compute_scale", self.cost.compute_scale)?;
        // Past these a request takes hours of modelled time: a typo, and
        // the latency summary's histogram ends there.
        if self.cost.compute_scale > MAX_COMPUTE_SCALE {
            return Err(c.invalid(
                "cost.compute_scale",
                format!(
                    "must be at most {MAX_COMPUTE_SCALE} (a device that many times as slow as \
                     this CPU; got {})",
                    self.cost.compute_scale
                ),
            ));
        }
        let overhead = self.cost.overhead_scale;
        if !(overhead.is_finite() && overhead >= 0.0) {
            return Err(c.invalid(
                "cost.overhead_scale",
                format!("must be >= 0 (got {overhead})"),
            ));
        }
        Ok(())
    }

    /// `[trace]`: what the generator accepts.
    fn check_trace(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        if self.trace.min_history == 0 || self.trace.min_history > self.trace.max_history {
            return Err(c.invalid(
                "trace.min_history",
                format!(
                    "must be in 1..=trace.max_history ({}), got {}",
                    self.trace.max_history, self.trace.min_history
                ),
            ));
        }
        // Every command that generates this trace would otherwise stop
        // later, or panic in the generator.
        if let Some((field, message)) = self.trace.invalid_field() {
            return Err(c.invalid(&field, message));
        }
        Ok(())
    }

    /// `[memory]`: α and the pool.
    fn check_memory(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        if !(0.0..=1.0).contains(&self.memory.alpha) {
            return Err(c.invalid(
                "memory.alpha",
                format!("must be in [0, 1] (got {})", self.memory.alpha),
            ));
        }
        if let Some(alphas) = &self.memory.node_alpha {
            if alphas.is_empty() {
                return Err(c.invalid(
                    "memory.node_alpha",
                    "must name one α per node (got an empty list)".to_string(),
                ));
            }
            if let Some((i, a)) = alphas
                .iter()
                .enumerate()
                .find(|(_, a)| !(0.0..=1.0).contains(*a))
            {
                return Err(c.invalid(
                    "memory.node_alpha",
                    format!("value {i} must be in [0, 1] (got {a})"),
                ));
            }
        }
        // Past 1 TiB a pool is a typo, and allocating it would abort the job.
        if !(self.memory.pool_mib > 0.0 && self.memory.pool_mib <= MAX_POOL_MIB) {
            return Err(c.invalid(
                "memory.pool_mib",
                format!(
                    "must be > 0 and at most {MAX_POOL_MIB} (1 TiB) (got {})",
                    self.memory.pool_mib
                ),
            ));
        }
        Ok(())
    }

    /// `[link]`: bandwidth, latency and the refill lane.
    fn check_link(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        // Outside these a transfer's nanoseconds overflow (a worker panicked
        // with no field named); both ends are far past any real link.
        let bandwidth = self.link.bandwidth_gbps;
        if !(MIN_LINK_GBPS..=MAX_LINK_GBPS).contains(&bandwidth) {
            return Err(c.invalid(
                "link.bandwidth_gbps",
                format!("must be in {MIN_LINK_GBPS}..={MAX_LINK_GBPS} GB/s (got {bandwidth})"),
            ));
        }
        let latency = self.link.latency_us;
        if !(0.0..=MAX_LINK_LATENCY_US).contains(&latency) {
            return Err(c.invalid(
                "link.latency_us",
                format!("must be in 0..={MAX_LINK_LATENCY_US} (one second) (got {latency})"),
            ));
        }
        if !(self.link.refill_share > 0.0 && self.link.refill_share <= 1.0) {
            return Err(c.invalid("link.refill_share", "must be in (0, 1]".into()));
        }
        Ok(())
    }

    /// `[node]`: shards, service model, users and lanes.
    fn check_node(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        if self.node.shard_rows == 0 {
            return Err(c.invalid("node.shard_rows", "must be >= 1".into()));
        }
        c.finite_positive(
            "node.service_tokens_per_ms",
            self.node.service_tokens_per_ms,
        )?;
        if self.node.service_tokens_per_ms < MIN_SERVICE_TOKENS_PER_MS {
            return Err(c.invalid(
                "node.service_tokens_per_ms",
                format!(
                    "must be at least {MIN_SERVICE_TOKENS_PER_MS} (one token a second; got {})",
                    self.node.service_tokens_per_ms
                ),
            ));
        }
        c.finite_positive("node.token_capacity", self.node.token_capacity)?;
        let share = self.node.shard_resident_share;
        if !(share > 0.0 && share <= 1.0) {
            return Err(c.invalid(
                "node.shard_resident_share",
                format!("must be in (0, 1] (got {share})"),
            ));
        }
        if self.node.max_users == 0 {
            return Err(c.invalid("node.max_users", "must be >= 1".into()));
        }
        if self.node.lanes == 0 || self.node.lanes > MAX_LANES {
            return Err(c.invalid(
                "node.lanes",
                format!("must be in 1..={MAX_LANES} (got {})", self.node.lanes),
            ));
        }
        Ok(())
    }

    /// `[hotness]`: the router's per-user counters.
    fn check_hotness(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        if self.hotness.max_users == 0 {
            return Err(c.invalid("hotness.max_users", "must be >= 1".into()));
        }
        if self.hotness.window_ms == 0 {
            return Err(c.invalid("hotness.window_ms", "must be >= 1".into()));
        }
        // Each tracked user keeps `windows` counters: bounded so that a
        // typo is an error here, not an allocation failure later.
        if !(1..=MAX_HOTNESS_WINDOWS).contains(&self.hotness.windows) {
            return Err(c.invalid(
                "hotness.windows",
                format!("must be in 1..={MAX_HOTNESS_WINDOWS}"),
            ));
        }
        // 16 bytes per (user, window) in every router replica: 1000 windows
        // of the default 100,000 users would hold 1.6 GB each.
        let counters = self.hotness.windows as u64 * self.hotness.max_users as u64;
        if counters > MAX_HOTNESS_COUNTERS {
            return Err(c.invalid(
                "hotness.windows",
                format!(
                    "{} windows × hotness.max_users {} = {counters} counters per router, \
                     more than {MAX_HOTNESS_COUNTERS} (160 MB); lower either",
                    self.hotness.windows, self.hotness.max_users
                ),
            ));
        }
        let hot = self.hotness.hot_share;
        if !(hot > 0.0 && hot <= 1.0) {
            return Err(c.invalid(
                "hotness.hot_share",
                format!("must be in (0, 1] (got {hot})"),
            ));
        }
        Ok(())
    }

    /// `[batch]`: the token budget and the wait.
    fn check_batch(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        if self.batch.max_tokens == 0 {
            return Err(c.invalid("batch.max_tokens", "must be >= 1".into()));
        }
        // A wait past an hour is a typo; past ~1.8e22 ms it panicked when
        // converted to a Duration.
        if !(0.0..=MAX_WAIT_MS).contains(&self.batch.max_wait_ms) {
            return Err(c.invalid(
                "batch.max_wait_ms",
                format!(
                    "must be in 0..={MAX_WAIT_MS} (one hour) (got {})",
                    self.batch.max_wait_ms
                ),
            ));
        }
        Ok(())
    }

    /// `[windows]`: the epoch and where closed windows go.
    fn check_windows(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        if self.windows.epoch_ms == 0 {
            return Err(c.invalid("windows.epoch_ms", "must be >= 1".into()));
        }
        if self.windows.out.trim().is_empty() {
            return Err(c.invalid(
                "windows.out",
                "must be \"stderr\", \"none\" or a file path".into(),
            ));
        }
        Ok(())
    }

    /// `[model]`: retrieval and candidate bounds.
    fn check_model(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        if self.model.top_k == 0 {
            return Err(c.invalid("model.top_k", "must be >= 1".into()));
        }
        // A search holds beam_width × beam_top_k candidates per step.
        for (key, v) in [
            ("model.beam_width", self.model.beam_width),
            ("model.beam_top_k", self.model.beam_top_k),
        ] {
            if !(1..=MAX_BEAM).contains(&v) {
                return Err(c.invalid(key, format!("must be in 1..={MAX_BEAM}")));
            }
        }
        if self.model.max_candidates == 0 {
            return Err(c.invalid("model.max_candidates", "must be >= 1".into()));
        }
        Ok(())
    }

    /// `[kafka]`: names, topics, limits and librdkafka properties.
    fn check_kafka(&self, c: &Check<'_>) -> Result<(), ConfigError> {
        let k = &self.kafka;
        for (field, value) in [
            ("kafka.brokers", &k.brokers),
            ("kafka.request_topic", &k.request_topic),
            ("kafka.response_topic", &k.response_topic),
            ("kafka.dead_letter_topic", &k.dead_letter_topic),
            ("kafka.group_id", &k.group_id),
        ] {
            if value.trim().is_empty() {
                return Err(c.invalid(field, "must not be empty".into()));
            }
        }
        // Serving its own responses or dead letters as requests would loop:
        // each answer comes back as a malformed request, forever.
        for (field, value) in [
            ("kafka.response_topic", &k.response_topic),
            ("kafka.dead_letter_topic", &k.dead_letter_topic),
        ] {
            if value.trim() == k.request_topic.trim() {
                return Err(c.invalid(
                    field,
                    format!("must differ from kafka.request_topic ({value:?})"),
                ));
            }
        }
        if !matches!(k.start.as_str(), "earliest" | "latest") {
            return Err(c.invalid(
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
                return Err(c.invalid(field, "must be >= 1".into()));
            }
        }
        for (field, value) in [
            ("kafka.create_partitions", i64::from(k.create_partitions)),
            ("kafka.restart_scan", k.restart_scan),
        ] {
            if value < 0 {
                return Err(c.invalid(field, format!("must be >= 0 (got {value})")));
            }
        }
        if k.repeat_window > MAX_REPEAT_WINDOW {
            return Err(c.invalid(
                "kafka.repeat_window",
                format!(
                    "must be at most {MAX_REPEAT_WINDOW} (got {}; each worker holds up to \
                     twice this many ids, ~30 bytes each)",
                    k.repeat_window
                ),
            ));
        }
        // Passed to librdkafka after grflow's own settings, so they win:
        // not those the delivery guarantee rests on.
        for (key, value) in &k.librdkafka {
            if let Some(why) = grflow_connectors::kafka::refused_property(key, value) {
                return Err(c.invalid(
                    &format!("kafka.librdkafka.{key:?}"),
                    format!("{value:?} refused: {why}"),
                ));
            }
        }
        if !(k.replication_factor == -1 || k.replication_factor >= 1) {
            return Err(c.invalid(
                "kafka.replication_factor",
                format!(
                    "must be >= 1, or -1 for the broker's default (got {})",
                    k.replication_factor
                ),
            ));
        }
        Ok(())
    }
}

/// The most recent `req_id`s a Kafka worker may remember (up to ~6 GB
/// at twice this many ids).
const MAX_REPEAT_WINDOW: usize = 100_000_000;

/// The longest a short batch may wait to fill (ms): one hour.
pub const MAX_WAIT_MS: f64 = 3_600_000.0;

/// Bounds of `link.bandwidth_gbps` (1 KB/s to 1 PB/s) and `link.latency_us`.
const MIN_LINK_GBPS: f64 = 1e-6;
const MAX_LINK_GBPS: f64 = 1e6;
const MAX_LINK_LATENCY_US: f64 = 1e6;

/// The most hotness windows a user's counters keep.
const MAX_HOTNESS_WINDOWS: usize = 1_000;

impl Config {
    /// Settings that are valid but serve less than they seem to ask for,
    /// one sentence each naming the keys (the commands print them).
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        // A search ends with at most one item per beam.
        if self.model.top_k > self.model.beam_width {
            warnings.push(format!(
                "model.top_k ({}) is more than model.beam_width ({}): a retrieve response holds \
                 at most beam_width items (rank responses hold top_k); raise model.beam_width \
                 to {} for top_k retrieved items",
                self.model.top_k, self.model.beam_width, self.model.top_k
            ));
        }
        warnings
    }
}

/// The most (user, window) counters a router replica keeps.
const MAX_HOTNESS_COUNTERS: u64 = 10_000_000;

/// The widest beam, and the most candidates kept per beam and step.
pub const MAX_BEAM: usize = 4_096;
