//! A serving node in the dataflow: requests arrive exchanged by the
//! router's chosen node, commands arrive on the control input addressed to
//! it. Expired requests are shed before a batch is served; the rest are
//! served in (ts, user, req_id) order, then the node reports residency and
//! load. When a batch is handed over is the release policy's business.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::vec::Map;

use grflow_connectors::{ErrorRow, ResponseRow};
use grflow_operators::busy::BusyMeter;
use grflow_operators::node::{
    DeadlineCheck, DeadlineShedder, RankRequest, RetrieveRequest, ServingNode,
};
use grflow_operators::windows::TelemetrySample;
use grflow_traces::Mode;

use crate::config::{Clock, Release};
use crate::dataflow::operator::{EventOperator, event_operator};
use crate::events::{ErrorKind, NodeControl, NodeEvent, Origin, Routed, Target, Telemetry, now_ns};
use crate::side::SideTables;

/// What a node wrapper needs besides its streams.
#[allow(missing_debug_implementations)] // holds the node
pub struct NodeParts {
    pub node: Rc<RefCell<ServingNode>>,
    pub busy: Rc<RefCell<BusyMeter>>,
    pub side: Arc<SideTables>,
    pub slo_ms: f64,
    pub clock: Clock,
    pub shedder: DeadlineShedder,
}

impl EventOperator for NodeParts {
    type Data = Routed;
    type Control = NodeControl;
    type Output = NodeEvent;

    fn on_control(&mut self, time: u64, mut commands: Vec<NodeControl>) {
        commands.sort_by_key(|c| c.seq);
        let mut node = self.node.borrow_mut();
        for c in commands {
            match node.apply(&c.command) {
                Ok(applied) => {
                    tracing::debug!(node = node.id(), time, ?applied, "command applied")
                }
                Err(e) => tracing::warn!(
                    node = node.id(),
                    time,
                    command = ?c.command,
                    "command refused: {e}"
                ),
            }
        }
    }

    fn on_data(&mut self, time: u64, mut batch: Vec<Routed>, out: &mut Vec<NodeEvent>) {
        batch.sort_by_key(|r| {
            (
                r.admitted.request.ts_ms,
                r.admitted.request.user_id,
                r.admitted.request.req_id,
            )
        });
        let busy_since = now_ns();
        // Overload degrades by answering late requests with an error
        // record instead of spending compute on them.
        let split = self.shedder.split(batch, busy_since);
        for (routed, check) in split.shed {
            let DeadlineCheck::Shed {
                waited_ms,
                deadline_ms,
            } = check
            else {
                unreachable!("only shed requests are here")
            };
            let reason =
                format!("shed: waited {waited_ms:.1} ms, past the deadline of {deadline_ms} ms");
            let req_id = routed.admitted.request.req_id;
            out.push(error_event(
                origin(&routed, false),
                req_id,
                reason,
                ErrorKind::Shed,
            ));
        }
        for (routed, check) in split.serve {
            let recovered_late = matches!(check, DeadlineCheck::ServeRecovered { .. });
            self.serve_one(time, routed, recovered_late, out);
        }
        out.push(NodeEvent::Report(self.node.borrow_mut().report(time)));
        self.busy.borrow_mut().record(busy_since, now_ns());
    }
}

impl NodeParts {
    fn serve_one(
        &mut self,
        time: u64,
        routed: Routed,
        recovered_late: bool,
        out: &mut Vec<NodeEvent>,
    ) {
        let mut node = self.node.borrow_mut();
        let side = &*self.side;
        let req = &routed.admitted.request;
        let origin = origin(&routed, recovered_late);
        let served = routed
            .admitted
            .history(side)
            .map_err(|e| e.to_string())
            .and_then(|history| {
                match req.mode {
                    Mode::Rank => {
                        let rank = RankRequest {
                            req_id: req.req_id,
                            user_id: req.user_id,
                            candidates: &req.candidates,
                        };
                        node.serve(time, rank, history, side)
                    }
                    Mode::Retrieve => {
                        let retrieve = RetrieveRequest {
                            req_id: req.req_id,
                            user_id: req.user_id,
                        };
                        node.serve_retrieve(time, retrieve, history, side, &side.retrieval)
                    }
                }
                .map_err(|e| e.to_string())
            });
        let served = match served {
            Ok(served) => served,
            Err(reason) => {
                out.push(error_event(
                    origin,
                    req.req_id,
                    reason,
                    ErrorKind::Unservable,
                ));
                return;
            }
        };
        let latency_ms = match self.clock {
            Clock::Wall => now_ns().saturating_sub(routed.admitted.admitted_ns) as f64 / 1e6,
            Clock::Event => served.modelled_latency_ms,
        };
        let sample = TelemetrySample {
            latency_us: (latency_ms * 1000.0) as u64,
            hot_user: routed.decision.hot_user,
            emb_hits: served.emb_hits,
            emb_lookups: served.emb_lookups,
            kv_reused_tokens: served.kv_reused_tokens,
            kv_total_tokens: served.kv_total_tokens,
            seq_len: served.seq_len,
            slo_violated: latency_ms > self.slo_ms,
            alpha_milli: (node.alpha() * 1000.0).round() as u32,
        };
        out.push(NodeEvent::Telemetry(Telemetry {
            node: node.id(),
            ts_ms: time,
            sample,
        }));
        let row = ResponseRow {
            req_id: req.req_id,
            node: node.id(),
            prefix: served.prefix.as_str().to_string(),
            items: served.items,
            scores: served.scores,
            latency_ms,
            model_version: node.model_version().to_string(),
            history_len: served.kv_total_tokens,
            kv_reused_tokens: served.kv_reused_tokens,
        };
        out.push(NodeEvent::Response(Box::new((row, origin))));
    }
}

/// Serves `routed` on this worker's node, applying the commands of
/// `controls` (from any worker; a command for every node is copied to
/// each) at their event times.
pub fn serve<'s>(
    routed: StreamVec<'s, u64, Routed>,
    controls: StreamVec<'s, u64, NodeControl>,
    parts: NodeParts,
    release: Release,
) -> StreamVec<'s, u64, NodeEvent> {
    let peers = routed.scope().peers() as u32;
    let by_node = Exchange::new(|r: &Routed| r.decision.node as u64);
    let addressed = controls.flat_map(move |c| {
        let nodes = match c.target {
            Target::All => 0..peers,
            Target::Node(n) => n..n + 1,
        };
        nodes.map(move |n| NodeControl {
            target: Target::Node(n),
            ..c.clone()
        })
    });
    let to_node = Exchange::new(|c: &NodeControl| match c.target {
        Target::Node(n) => n as u64,
        Target::All => unreachable!("addressed above"),
    });
    event_operator(routed, addressed, by_node, to_node, "Node", release, parts)
}

fn origin(routed: &Routed, recovered_late: bool) -> Origin {
    Origin {
        position: routed.admitted.position.clone(),
        ts_ms: routed.admitted.request.ts_ms,
        admitted_ns: routed.admitted.admitted_ns,
        recovered_late,
    }
}

/// An error record in place of a response.
fn error_event(origin: Origin, req_id: u64, reason: String, kind: ErrorKind) -> NodeEvent {
    let row = ErrorRow {
        position: origin.position.to_string(),
        reason,
        req_id: Some(req_id),
    };
    NodeEvent::Error(Box::new((row, kind, origin)))
}
