//! Rows that leave the dataflow, and the answers sinks acknowledge sources by.

use grflow_traces::Mode;
use serde::{Deserialize, Serialize};

/// Where a record came from, so errors can name it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum SourcePosition {
    /// Parquet: file, row group and row within the file (0-based).
    Parquet {
        file: String,
        row_group: u32,
        row: u64,
    },
    /// Kafka: topic, partition and offset.
    Kafka {
        topic: String,
        partition: i32,
        offset: i64,
    },
}

impl std::fmt::Display for SourcePosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SourcePosition::Parquet {
                file,
                row_group,
                row,
            } => {
                write!(f, "{file}: row group {row_group}, row {row}")
            }
            SourcePosition::Kafka {
                topic,
                partition,
                offset,
            } => {
                write!(f, "{topic}[{partition}]@{offset}")
            }
        }
    }
}

/// One row of responses.parquet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ResponseRow {
    pub req_id: u64,
    pub node: u32,
    /// "user" or "item" (which side was the prefix, BAT).
    pub prefix: String,
    pub items: Vec<u32>,
    pub scores: Vec<f32>,
    pub latency_ms: f64,
    pub model_version: String,
    /// History items the model saw: after a long history was truncated to
    /// its most recent items that fit.
    #[serde(default)]
    pub history_len: u32,
    /// Of those, items whose KV came from the prefix cache.
    #[serde(default)]
    pub kv_reused_tokens: u32,
}

/// One row of windows.parquet: HLEM Table I state vector of one node and window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowRow {
    pub node: u32,
    pub window_start_ms: u64,
    pub requests: u64,
    pub hot_user_share: f64,
    pub emb_hit_rate: f64,
    pub kv_hit_rate: f64,
    pub mean_seq_len: f64,
    pub slo_violation_share: f64,
    /// p99 of the served requests' latencies; 0 when none was served, as
    /// the allocator's controllers see it. Written out through
    /// [`WindowRow::served_p99_ms`], which says null there instead.
    pub p99_ms: f64,
    pub alpha: f64,
    /// Requests answered with an error (shed or unservable); counted in
    /// `requests` and as SLO violations, not in the latency.
    pub failed: u64,
    /// Share of the served requests whose history was cut to fit.
    pub truncated_share: f64,
    /// The node's α as the window ended (its latest request's), which an
    /// operator's pin or a KV reclaim may have moved; null when unknown.
    pub alpha_end: Option<f64>,
    /// α was pinned by an operator as the window ended.
    pub pinned_end: bool,
}

impl WindowRow {
    /// Requests the node served (answered with a response) in the window.
    pub fn served(&self) -> u64 {
        self.requests.saturating_sub(self.failed)
    }

    /// The p99 as windows.parquet and serve's window lines write it: None
    /// when nothing was served, whose 0 would plot as a perfect latency.
    pub fn served_p99_ms(&self) -> Option<f64> {
        (self.served() > 0).then_some(self.p99_ms)
    }
}

/// One row of errors.parquet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ErrorRow {
    /// `SourcePosition` rendered for people.
    pub position: String,
    pub reason: String,
    /// The request id when the record got far enough to have one.
    pub req_id: Option<u64>,
}

/// Where an answer's request came from, for sinks that acknowledge sources.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Origin {
    pub position: SourcePosition,
    pub ts_ms: u64,
    pub admitted_ns: u64,
    /// Served past its deadline because it was recovered after a restart.
    #[serde(default)]
    pub recovered_late: bool,
    /// Rank or retrieve: latency is tallied against that kind's SLO.
    #[serde(default = "rank")]
    pub mode: Mode,
}

fn rank() -> Mode {
    Mode::Rank
}

/// Why a request was answered with an error record.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ErrorKind {
    /// Its deadline passed before a node got to it (overload).
    Shed,
    /// It was produced longer ago than `kafka.max_age_ms` when a node got
    /// to it: it waited in the broker while the job was behind.
    Stale,
    /// It cannot be served (e.g. a history longer than the users table has).
    Unservable,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Shed => "shed",
            ErrorKind::Stale => "stale",
            ErrorKind::Unservable => "unservable",
        }
    }
}

/// The answer to one request, as an answer sink takes it: a ranking or
/// retrieval, or an error record. Latency is measured before the sink
/// gets it (`ResponseRow::latency_ms`, `latency_ms`).
#[derive(Clone, Debug)]
pub enum Answer {
    Response {
        row: ResponseRow,
        origin: Origin,
    },
    Error {
        row: ErrorRow,
        kind: ErrorKind,
        origin: Origin,
        latency_ms: f64,
    },
}

/// Time now in ns since the Unix epoch, read from the monotonic clock: the
/// wall clock at the process's first call plus the monotonic time since.
/// Latencies and deadlines are differences of these stamps, and a wall-clock
/// step (NTP, a VM resumed) must not shed every queued request or record
/// latencies of 0. Processes of one cluster compare stamps, so the anchor is
/// the wall clock: they agree as far as their wall clocks agreed when each
/// started.
pub fn now_ns() -> u64 {
    static ANCHOR: std::sync::OnceLock<MonotonicEpoch> = std::sync::OnceLock::new();
    ANCHOR
        .get_or_init(MonotonicEpoch::now)
        .at(std::time::Instant::now())
}

/// Milliseconds since the Unix epoch by the system clock (what a producer
/// stamps a request with).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A wall-clock reading and the monotonic instant it was taken at.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicEpoch {
    wall_ns: u64,
    at: std::time::Instant,
}

impl MonotonicEpoch {
    pub fn now() -> Self {
        let at = std::time::Instant::now();
        let wall_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as u64);
        Self { wall_ns, at }
    }

    /// Ns since the Unix epoch at `instant`; never goes back as `instant`
    /// moves on, whatever the wall clock does meanwhile.
    pub fn at(&self, instant: std::time::Instant) -> u64 {
        self.wall_ns
            .saturating_add(instant.saturating_duration_since(self.at).as_nanos() as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

    #[test]
    fn stamps_count_monotonic_time_from_the_anchor() {
        let epoch = MonotonicEpoch::now();
        let later = epoch.at + Duration::from_millis(250);
        assert_eq!(epoch.at(later) - epoch.at(epoch.at), 250_000_000);
        // An instant before the anchor never goes below it.
        let before = epoch.at.checked_sub(Duration::from_secs(1));
        if let Some(before) = before {
            assert_eq!(epoch.at(before), epoch.wall_ns);
        }
    }

    #[test]
    fn now_ns_never_goes_back_and_starts_at_the_wall_clock() {
        let wall = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as u64;
        let a = now_ns();
        assert!(a.abs_diff(wall) < 5_000_000_000, "{a} vs wall {wall}");
        let mut last = a;
        let start = Instant::now();
        while start.elapsed() < Duration::from_millis(5) {
            let t = now_ns();
            assert!(t >= last);
            last = t;
        }
        assert!(last > a);
    }
}
