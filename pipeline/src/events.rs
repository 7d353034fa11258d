//! Records that travel between the operators of the dataflow.

use serde::{Deserialize, Serialize};

use grflow_connectors::WindowRow;
use grflow_connectors::{ErrorRow, ResponseRow, SourcePosition};
use grflow_operators::node::{Deadlined, NodeCommand};
use grflow_operators::router::{Decision, NodeReport};
use grflow_operators::windows::{TelemetrySample, WindowStats};
use grflow_traces::{Mode, Request};

use crate::side::{SideError, SideTables};

/// A request that entered the job.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Admitted {
    pub request: Request,
    pub position: SourcePosition,
    /// Wall time of admission, ns since the Unix epoch (latency starts here).
    pub admitted_ns: u64,
    /// The user's history when the request carried it inline (Kafka);
    /// `None` means the first `hist_len` items of the users table.
    pub inline_history: Option<Vec<u32>>,
    /// A Kafka record that was in the log when the job started: a previous
    /// incarnation may have answered it with a ranking that reaches the
    /// response topic only after the restart scan, so it is never shed.
    #[serde(default)]
    pub recovered: bool,
}

impl Admitted {
    /// The history this request is served with.
    pub fn history<'a>(&'a self, side: &'a SideTables) -> Result<&'a [u32], SideError> {
        match &self.inline_history {
            Some(items) => Ok(items),
            None => side.history(self.request.user_id, self.request.hist_len),
        }
    }
}

impl Deadlined for Routed {
    fn admitted_ns(&self) -> u64 {
        self.admitted.admitted_ns
    }
    fn recovered(&self) -> bool {
        self.admitted.recovered
    }
}

/// What a source emits: a request, or a record it could not read.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Ingest {
    Request(Box<Admitted>),
    Bad(ErrorRow),
}

/// A request with the router's decision.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Routed {
    pub admitted: Admitted,
    pub decision: Decision,
    /// The worker whose router replica decided (the node reports finished
    /// work back to it: `LoadSignal::InFlight`).
    pub router: u32,
    /// The tokens the router counted for it (history, cached or not,
    /// candidates and instruction: an upper bound known before the cache
    /// is asked); the node batches and reports finished work by them.
    pub tokens: u32,
}

/// Telemetry of one served request, keyed for windowing.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Telemetry {
    pub node: u32,
    pub ts_ms: u64,
    pub sample: TelemetrySample,
}

/// The statistics of one node over one closed window `[start, start + epoch)`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ClosedWindow {
    pub node: u32,
    pub window_start_ms: u64,
    pub stats: WindowStats,
}

impl ClosedWindow {
    pub fn to_row(&self) -> WindowRow {
        let s = &self.stats;
        WindowRow {
            node: self.node,
            window_start_ms: self.window_start_ms,
            requests: s.requests,
            hot_user_share: s.hot_user_share,
            emb_hit_rate: s.emb_hit_rate,
            kv_hit_rate: s.kv_hit_rate,
            mean_seq_len: s.mean_seq_len,
            slo_violation_share: s.slo_violation_share,
            p99_ms: s.p99_ms,
            alpha: s.alpha,
        }
    }
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
    /// It cannot be served (e.g. a history longer than the users table has).
    Unservable,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Shed => "shed",
            ErrorKind::Unservable => "unservable",
        }
    }
}

/// Everything a node emits.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum NodeEvent {
    Response(Box<(ResponseRow, Origin)>),
    Telemetry(Telemetry),
    Report(NodeReport),
    Error(Box<(ErrorRow, ErrorKind, Origin)>),
}

/// Which nodes a command is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Target {
    /// Every node (broadcast).
    All,
    /// One node, by id (= worker index).
    Node(u32),
}

/// A command on its way to a node's control input. The event time it
/// travels at is when it applies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeControl {
    pub target: Target,
    /// Order among commands of one time (ties keep arrival order).
    pub seq: u64,
    pub command: NodeCommand,
}

/// A command to apply at event time `at_ms`: a job's schedule of commands
/// (tests, experiments) enters the dataflow as these.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduledCommand {
    pub at_ms: u64,
    pub target: Target,
    pub command: NodeCommand,
}

/// Wall time now, ns since the Unix epoch; comparable across worker processes.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
