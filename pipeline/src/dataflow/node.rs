//! Timely wrapper of a serving node: requests arrive exchanged by the
//! router's chosen node; each event time is served once complete, in
//! (ts, user, req_id) order, then the node reports residency and load.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::generic::Operator;

use grflow_connectors::{ErrorRow, ResponseRow};
use grflow_operators::busy::BusyMeter;
use grflow_operators::node::{RankRequest, RetrieveRequest, ServingNode};
use grflow_operators::windows::TelemetrySample;
use grflow_traces::Mode;

use crate::config::Clock;
use crate::dataflow::stash::TimeStash;
use crate::events::{DeadlineCheck, ErrorKind, NodeEvent, Origin, Routed, Telemetry, now_ns};
use crate::side::SideTables;

pub fn serve<'s>(
    routed: StreamVec<'s, u64, Routed>,
    node: Rc<RefCell<ServingNode>>,
    busy: Rc<RefCell<BusyMeter>>,
    side: Arc<SideTables>,
    slo_ms: f64,
    clock: Clock,
    deadline: Option<Duration>,
) -> StreamVec<'s, u64, NodeEvent> {
    let by_node = Exchange::new(|r: &Routed| r.decision.node as u64);
    routed.unary_frontier(by_node, "Node", move |_cap, _info| {
        let mut waiting: TimeStash<Routed> = TimeStash::default();
        move |(input, frontier), output| {
            input.for_each_stamp(|cap, data| {
                let cap = cap.retain_least(0);
                let time = *cap.as_ref().expect("data comes with a time").time();
                waiting.push(time, cap, data.flat_map(|d| d.drain(..)));
            });
            while let Some((time, cap, mut batch)) = waiting.pop_complete(&[frontier]) {
                let cap = cap.expect("requests keep their capability");
                batch.sort_by_key(|r| {
                    (
                        r.admitted.request.ts_ms,
                        r.admitted.request.user_id,
                        r.admitted.request.req_id,
                    )
                });
                let busy_since = now_ns();
                let mut node = node.borrow_mut();
                let mut session = output.session(&cap);
                for routed in batch {
                    let req = &routed.admitted.request;
                    // Overload degrades by answering late requests with an
                    // error record instead of spending compute on them.
                    let check = routed.admitted.deadline_check(deadline, now_ns());
                    let origin = Origin {
                        position: routed.admitted.position.clone(),
                        ts_ms: req.ts_ms,
                        admitted_ns: routed.admitted.admitted_ns,
                        recovered_late: matches!(check, DeadlineCheck::ServeRecovered { .. }),
                    };
                    if let DeadlineCheck::Shed {
                        waited_ms,
                        deadline_ms,
                    } = check
                    {
                        let reason = format!(
                            "shed: waited {waited_ms:.1} ms, past the deadline of {deadline_ms} ms"
                        );
                        session.give(error_event(origin, req.req_id, reason, ErrorKind::Shed));
                        continue;
                    }
                    let served = routed
                        .admitted
                        .history(&side)
                        .map_err(|e| e.to_string())
                        .and_then(|history| {
                            match req.mode {
                                Mode::Rank => {
                                    let rank = RankRequest {
                                        req_id: req.req_id,
                                        user_id: req.user_id,
                                        candidates: &req.candidates,
                                    };
                                    node.serve(time, rank, history, &*side)
                                }
                                Mode::Retrieve => {
                                    let retrieve = RetrieveRequest {
                                        req_id: req.req_id,
                                        user_id: req.user_id,
                                    };
                                    node.serve_retrieve(
                                        time,
                                        retrieve,
                                        history,
                                        &*side,
                                        &side.retrieval,
                                    )
                                }
                            }
                            .map_err(|e| e.to_string())
                        });
                    match served {
                        Ok(out) => {
                            let latency_ms = match clock {
                                Clock::Wall => {
                                    now_ns().saturating_sub(routed.admitted.admitted_ns) as f64
                                        / 1e6
                                }
                                Clock::Event => out.modelled_latency_ms,
                            };
                            let sample = TelemetrySample {
                                latency_us: (latency_ms * 1000.0) as u64,
                                hot_user: routed.decision.hot_user,
                                emb_hits: out.emb_hits,
                                emb_lookups: out.emb_lookups,
                                kv_reused_tokens: out.kv_reused_tokens,
                                kv_total_tokens: out.kv_total_tokens,
                                seq_len: out.seq_len,
                                slo_violated: latency_ms > slo_ms,
                                alpha_milli: (node.alpha() * 1000.0).round() as u32,
                            };
                            session.give(NodeEvent::Telemetry(Telemetry {
                                node: node.id(),
                                ts_ms: time,
                                sample,
                            }));
                            let row = ResponseRow {
                                req_id: req.req_id,
                                node: node.id(),
                                prefix: out.prefix.as_str().to_string(),
                                items: out.items,
                                scores: out.scores,
                                latency_ms,
                                model_version: node.model_version().to_string(),
                                history_len: out.kv_total_tokens,
                                kv_reused_tokens: out.kv_reused_tokens,
                            };
                            session.give(NodeEvent::Response(Box::new((row, origin))));
                        }
                        Err(reason) => session.give(error_event(
                            origin,
                            req.req_id,
                            reason,
                            ErrorKind::Unservable,
                        )),
                    }
                }
                session.give(NodeEvent::Report(node.report(time)));
                busy.borrow_mut().record(busy_since, now_ns());
            }
        }
    })
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
