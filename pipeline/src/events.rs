//! Records that travel between the operators of the dataflow.

use serde::{Deserialize, Serialize};

use grflow_connectors::WindowRow;
use grflow_connectors::{ErrorRow, ResponseRow, SourcePosition};
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
}

/// What the deadline says about a request a node is about to serve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeadlineCheck {
    /// In time, or no deadline.
    Serve,
    /// Past the deadline but recovered (see [`Admitted::recovered`]):
    /// served anyway, so that a crash never leaves a shed error beside a
    /// ranking for one request.
    ServeRecovered { waited_ms: f64 },
    /// Past the deadline: answered with a `shed` error record.
    Shed { waited_ms: f64, deadline_ms: u128 },
}

impl Admitted {
    /// The history this request is served with.
    pub fn history<'a>(&'a self, side: &'a SideTables) -> Result<&'a [u32], SideError> {
        match &self.inline_history {
            Some(items) => Ok(items),
            None => side.history(self.request.user_id, self.request.hist_len),
        }
    }

    /// The overload decision at wall time `now_ns`: a request that waited
    /// longer than `deadline` since admission is shed, unless recovered.
    pub fn deadline_check(
        &self,
        deadline: Option<std::time::Duration>,
        now_ns: u64,
    ) -> DeadlineCheck {
        let Some(deadline) = deadline else {
            return DeadlineCheck::Serve;
        };
        let waited_ns = now_ns.saturating_sub(self.admitted_ns);
        if waited_ns <= deadline.as_nanos() as u64 {
            return DeadlineCheck::Serve;
        }
        let waited_ms = waited_ns as f64 / 1e6;
        if self.recovered {
            DeadlineCheck::ServeRecovered { waited_ms }
        } else {
            DeadlineCheck::Shed {
                waited_ms,
                deadline_ms: deadline.as_millis(),
            }
        }
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

/// Wall time now, ns since the Unix epoch; comparable across worker processes.
pub fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn admitted(admitted_ns: u64, recovered: bool) -> Admitted {
        Admitted {
            request: Request {
                ts_ms: 1,
                req_id: 7,
                user_id: 3,
                hist_len: 0,
                candidates: vec![1, 2],
                mode: grflow_traces::Mode::Rank,
                label: None,
            },
            position: SourcePosition::Kafka {
                topic: "requests".into(),
                partition: 0,
                offset: 4,
            },
            admitted_ns,
            inline_history: Some(vec![5]),
            recovered,
        }
    }

    #[test]
    fn a_recovered_request_past_its_deadline_is_served_and_a_new_one_is_shed() {
        let deadline = Some(Duration::from_millis(2_000));
        let admitted_ns = 1_000_000_000;
        let late = admitted_ns + 2_500_000_000;
        assert_eq!(
            admitted(admitted_ns, false).deadline_check(deadline, late),
            DeadlineCheck::Shed {
                waited_ms: 2_500.0,
                deadline_ms: 2_000
            }
        );
        assert_eq!(
            admitted(admitted_ns, true).deadline_check(deadline, late),
            DeadlineCheck::ServeRecovered { waited_ms: 2_500.0 }
        );
        // In time, or without a deadline, both are simply served.
        let in_time = admitted_ns + 2_000_000_000;
        for recovered in [false, true] {
            let a = admitted(admitted_ns, recovered);
            assert_eq!(a.deadline_check(deadline, in_time), DeadlineCheck::Serve);
            assert_eq!(a.deadline_check(None, late), DeadlineCheck::Serve);
            // A clock that stepped back never sheds.
            assert_eq!(a.deadline_check(deadline, 0), DeadlineCheck::Serve);
        }
    }
}
