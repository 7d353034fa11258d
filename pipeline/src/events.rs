//! Records that travel between the operators of the dataflow.

use serde::{Deserialize, Serialize};

use grflow_connectors::{ErrorRow, ResponseRow, SourcePosition};
use grflow_operators::router::{Decision, NodeReport};
use grflow_operators::windows::TelemetrySample;
use grflow_traces::Request;

/// A request that entered the job.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Admitted {
    pub request: Request,
    pub position: SourcePosition,
    /// Wall time of admission, ns since the Unix epoch (latency starts here).
    pub admitted_ns: u64,
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
}

/// Telemetry of one served request, keyed for windowing.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Telemetry {
    pub node: u32,
    pub ts_ms: u64,
    pub sample: TelemetrySample,
}

/// Everything a node emits.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub enum NodeEvent {
    Response(ResponseRow),
    Telemetry(Telemetry),
    Report(NodeReport),
    Error(ErrorRow),
}

/// Wall time now, ns since the Unix epoch; comparable across worker processes.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}
