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
    DeadlineCheck, DeadlineShedder, Deadlined, RankRequest, RankWork, RetrieveRequest, Served,
    ServingNode,
};
use grflow_operators::windows::TelemetrySample;
use grflow_traces::Mode;

use crate::config::{Clock, Release, SloMs};
use crate::dataflow::operator::{EventOperator, event_operator};
use crate::events::{ErrorKind, NodeControl, NodeEvent, Origin, Routed, Target, Telemetry, now_ns};
use crate::side::SideTables;

/// What a node wrapper needs besides its streams.
#[allow(missing_debug_implementations)] // holds the node
pub struct NodeParts {
    pub node: Rc<RefCell<ServingNode>>,
    pub busy: Rc<RefCell<BusyMeter>>,
    pub side: Arc<SideTables>,
    pub slo_ms: SloMs,
    pub clock: Clock,
    pub shedder: DeadlineShedder,
    /// Rank requests served per batched model call, by tokens (history,
    /// candidates, instruction); 1 serves one request per call.
    pub batch_max_tokens: usize,
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

    fn on_data(&mut self, time: u64, batch: Vec<Routed>, out: &mut Vec<NodeEvent>) {
        let mut outs = [std::mem::take(out)];
        self.on_arrivals(vec![(time, batch)], &mut outs);
        let [served] = outs;
        *out = served;
    }

    fn on_arrivals(&mut self, arrivals: Vec<(u64, Vec<Routed>)>, out: &mut [Vec<NodeEvent>]) {
        let Some(last) = arrivals
            .iter()
            .map(|(t, _)| *t)
            .enumerate()
            .max_by_key(|(_, t)| *t)
        else {
            return;
        };
        let mut all: Vec<Slotted> = arrivals
            .into_iter()
            .enumerate()
            .flat_map(|(slot, (time, batch))| {
                batch
                    .into_iter()
                    .map(move |routed| Slotted { slot, time, routed })
            })
            .collect();
        all.sort_by_key(|s| {
            let r = &s.routed.admitted.request;
            (r.ts_ms, r.user_id, r.req_id)
        });
        let busy_since = now_ns();
        // Overload degrades by answering late requests with an error
        // record instead of spending compute on them.
        let split = self.shedder.split(all, busy_since);
        for (s, check) in split.shed {
            let DeadlineCheck::Shed {
                waited_ms,
                deadline_ms,
            } = check
            else {
                unreachable!("only shed requests are here")
            };
            let reason =
                format!("shed: waited {waited_ms:.1} ms, past the deadline of {deadline_ms} ms");
            let req_id = s.routed.admitted.request.req_id;
            out[s.slot].push(error_event(
                origin(&s.routed, false),
                req_id,
                reason,
                ErrorKind::Shed,
            ));
        }
        // Rank requests are served in batches of up to `batch_max_tokens`;
        // a retrieve request is served alone, in order.
        let mut batch: Vec<(Slotted, bool)> = Vec::new();
        let mut batch_tokens = 0;
        for (s, check) in split.serve {
            let recovered_late = matches!(check, DeadlineCheck::ServeRecovered { .. });
            let req = &s.routed.admitted.request;
            if req.mode == Mode::Retrieve {
                self.serve_rank_batch(std::mem::take(&mut batch), out);
                batch_tokens = 0;
                self.serve_retrieve(s, recovered_late, out);
                continue;
            }
            let tokens = request_tokens(&s.routed, &self.side);
            if !batch.is_empty() && batch_tokens + tokens > self.batch_max_tokens {
                self.serve_rank_batch(std::mem::take(&mut batch), out);
                batch_tokens = 0;
            }
            batch_tokens += tokens;
            batch.push((s, recovered_late));
        }
        self.serve_rank_batch(batch, out);
        let (slot, time) = last;
        out[slot].push(NodeEvent::Report(self.node.borrow_mut().report(time)));
        self.busy.borrow_mut().record(busy_since, now_ns());
    }
}

/// A request of one activation with the output slot of its event time.
struct Slotted {
    slot: usize,
    time: u64,
    routed: Routed,
}

impl Deadlined for Slotted {
    fn admitted_ns(&self) -> u64 {
        self.routed.admitted_ns()
    }
    fn recovered(&self) -> bool {
        self.routed.recovered()
    }
}

/// Wall time each request waited from admission to the start of its batch.
fn record_waits<'r>(node: &mut ServingNode, batch: impl IntoIterator<Item = &'r Routed>) {
    let now = now_ns();
    for r in batch {
        node.record_wait(now.saturating_sub(r.admitted.admitted_ns) as f64 / 1e6);
    }
}

/// Tokens a rank request adds to a batch: its whole history (cached or
/// not, an upper bound known before the cache is asked), its candidates
/// and the instruction token.
fn request_tokens(routed: &Routed, side: &SideTables) -> usize {
    let req = &routed.admitted.request;
    let history = routed.admitted.history(side).map_or(0, |h| h.len());
    history + req.candidates.len() + 1
}

impl NodeParts {
    /// Serves rank requests with batched model calls.
    fn serve_rank_batch(&mut self, batch: Vec<(Slotted, bool)>, out: &mut [Vec<NodeEvent>]) {
        if batch.is_empty() {
            return;
        }
        let side = &*self.side;
        let mut work = Vec::with_capacity(batch.len());
        let mut members = Vec::with_capacity(batch.len());
        for (s, recovered_late) in &batch {
            let req = &s.routed.admitted.request;
            match s.routed.admitted.history(side) {
                Ok(history) => {
                    work.push(RankWork {
                        req: RankRequest {
                            req_id: req.req_id,
                            user_id: req.user_id,
                            candidates: &req.candidates,
                        },
                        history,
                    });
                    members.push((s, *recovered_late));
                }
                Err(e) => out[s.slot].push(error_event(
                    origin(&s.routed, *recovered_late),
                    req.req_id,
                    e.to_string(),
                    ErrorKind::Unservable,
                )),
            }
        }
        // One event time per batch: the latest of its requests (all equal
        // in `complete` mode).
        let now_ms = members.iter().map(|(s, _)| s.time).max().unwrap_or(0);
        let mut node = self.node.borrow_mut();
        record_waits(&mut node, members.iter().map(|(s, _)| &s.routed));
        let results = node.serve_rank_batch(now_ms, &work, side);
        drop(node);
        for ((s, recovered_late), result) in members.into_iter().zip(results) {
            let served = result.map_err(|e| e.to_string());
            self.emit(s, recovered_late, served, &mut out[s.slot]);
        }
    }

    fn serve_retrieve(&mut self, s: Slotted, recovered_late: bool, out: &mut [Vec<NodeEvent>]) {
        let side = &*self.side;
        let req = &s.routed.admitted.request;
        let served = s
            .routed
            .admitted
            .history(side)
            .map_err(|e| e.to_string())
            .and_then(|history| {
                let retrieve = RetrieveRequest {
                    req_id: req.req_id,
                    user_id: req.user_id,
                };
                let mut node = self.node.borrow_mut();
                record_waits(&mut node, [&s.routed]);
                node.serve_retrieve(s.time, retrieve, history, side, &side.retrieval)
                    .map_err(|e| e.to_string())
            });
        self.emit(&s, recovered_late, served, &mut out[s.slot]);
    }

    /// The response (with its telemetry) or the error of one request.
    fn emit(
        &self,
        s: &Slotted,
        recovered_late: bool,
        served: Result<Served, String>,
        out: &mut Vec<NodeEvent>,
    ) {
        let routed = &s.routed;
        let req = &routed.admitted.request;
        let origin = origin(routed, recovered_late);
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
        let node = self.node.borrow();
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
            slo_violated: latency_ms > self.slo_ms.for_mode(req.mode),
            alpha_milli: (node.alpha() * 1000.0).round() as u32,
        };
        out.push(NodeEvent::Telemetry(Telemetry {
            node: node.id(),
            ts_ms: s.time,
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
        mode: routed.admitted.request.mode,
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
