//! Records that travel between the operators of the dataflow.

use serde::{Deserialize, Serialize};

use grflow_connectors::WindowRow;
use grflow_connectors::{Answer, ErrorRow, ResponseRow, SourcePosition};
// Answer records are the connectors' (sinks acknowledge sources by them).
pub use grflow_connectors::{ErrorKind, Origin, now_ns};
use grflow_operators::node::{Deadlined, NodeCommand};
use grflow_operators::router::{Decision, NodeReport};
use grflow_operators::windows::{TelemetrySample, WindowStats};
use grflow_traces::Request;

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
    /// The inline history lost its oldest items at decode: served, the
    /// request counts as truncated even if its node cuts no further.
    #[serde(default)]
    pub history_cut: bool,
}

impl Admitted {
    /// The history this request is served with.
    pub fn history<'a>(&'a self, side: &'a SideTables) -> Result<&'a [u32], SideError> {
        match &self.inline_history {
            Some(items) => Ok(items),
            None => side.history(self.request.user_id, self.request.hist_len),
        }
    }

    /// Whether [`Self::history`] serves this request an empty history it
    /// did not ask for: `hist_len` > 0 of a user the users table does not
    /// know (a new user sends 0).
    pub fn asks_unknown_user(&self, side: &SideTables) -> bool {
        self.inline_history.is_none()
            && self.request.hist_len > 0
            && !side.knows_user(self.request.user_id)
    }
}

impl Deadlined for Routed {
    fn admitted_ns(&self) -> u64 {
        self.admitted.admitted_ns
    }
    fn produced_ms(&self) -> u64 {
        self.admitted.request.ts_ms
    }
    fn recovered(&self) -> bool {
        self.admitted.recovered
    }
}

/// What a source emits: a request, a record it could not read, or the
/// news that it stopped early (with the signal number that asked, 0 if
/// none), which every worker of the job then hears.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum Ingest {
    Request(Box<Admitted>),
    Bad(ErrorRow),
    Stopped(usize),
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
            failed: s.failed,
            truncated_share: s.truncated_share,
            alpha_end: s.alpha_end,
            pinned_end: s.pinned_end,
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

impl NodeEvent {
    /// The answer among a node's events, with its latency measured now
    /// (from admission); telemetry and reports are not answers.
    pub fn into_answer(self) -> Option<Answer> {
        let latency_ms = |admitted_ns: u64| now_ns().saturating_sub(admitted_ns) as f64 / 1e6;
        match self {
            NodeEvent::Response(boxed) => {
                let (mut row, origin) = *boxed;
                row.latency_ms = latency_ms(origin.admitted_ns);
                Some(Answer::Response { row, origin })
            }
            NodeEvent::Error(boxed) => {
                let (row, kind, origin) = *boxed;
                Some(Answer::Error {
                    latency_ms: latency_ms(origin.admitted_ns),
                    row,
                    kind,
                    origin,
                })
            }
            NodeEvent::Telemetry(_) | NodeEvent::Report(_) => None,
        }
    }
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
