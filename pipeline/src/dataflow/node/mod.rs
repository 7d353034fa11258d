//! A serving node in the dataflow: requests arrive exchanged by the
//! router's chosen node, commands arrive on the control input addressed to
//! it. Expired requests are shed before a batch is formed (the whole
//! queue is swept) and again when a batch starts; the rest are served in
//! (ts, user, req_id) order, then the node reports residency and load.
//! When a batch is handed over is the release policy's business.
//!
//! In `arrival` mode a step runs on the node's compute thread while the
//! worker goes on admitting and routing: a request due during a long step
//! is routed at once (to an idle node if there is one) and waits in this
//! node's queue for the next batch, instead of waiting at the source.
//! The thread is `compute`; what one step does (shedding, the model
//! calls, responses and error records) is `step`.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Exchange;
use timely::dataflow::operators::vec::Map;

use grflow_operators::allocator::oracle::OracleRecorder;
use grflow_operators::busy::BusyMeter;
use grflow_operators::node::batching::{BatchPolicy, Next, Queued};
use grflow_operators::node::{DeadlineShedder, NodeCommand, ServingNode};
use grflow_traces::Mode;

use crate::config::{Clock, Release, SloMs};
use crate::dataflow::operator::{EventOperator, Step, Waker, event_operator};
use crate::events::{NodeControl, NodeEvent, Routed, Target};
use crate::side::SideTables;

mod compute;
mod step;

use compute::{ComputeThread, WakeOnDrop};
use step::{Slotted, StepCtx};

/// A serving node shared by its worker and its compute thread.
pub type SharedNode = Arc<Mutex<ServingNode>>;

/// The node's state; a panic while serving is fatal to the job anyway.
pub fn lock(node: &SharedNode) -> MutexGuard<'_, ServingNode> {
    node.lock().expect("node state: a step panicked")
}

/// What a node wrapper needs besides its streams.
#[allow(missing_debug_implementations)] // holds the node
pub struct NodeParts {
    pub node: SharedNode,
    pub busy: Rc<RefCell<BusyMeter>>,
    pub side: Arc<SideTables>,
    pub slo_ms: SloMs,
    pub clock: Clock,
    pub shedder: DeadlineShedder,
    /// Token budget of a batch, its wait bound and lanes (`[batch]`,
    /// `node.lanes`); `max_tokens = 1` serves one request per call.
    pub batch: BatchPolicy,
    /// Wall clock, ns since the Unix epoch (`events::now_ns`; tests step it).
    pub wall_ns: fn() -> u64,
    /// Tokens of the requests finished here (answered, failed or shed), by
    /// the router replica that sent them; every report carries them.
    pub completed_tokens: Vec<f64>,
    /// Trained models a `SwapModel` command may name (`serve`).
    pub models: Option<Arc<crate::models::ModelRegistry>>,
    /// The oracle α*: sees the node before each epoch, every α command
    /// and every batch.
    pub oracle: Option<Rc<RefCell<OracleRecorder>>>,
    /// `arrival` mode: the compute thread and the step running on it.
    pub offload: Offload,
}

/// Steps of an `arrival`-mode node run on its own thread, one at a time.
#[derive(Default)]
#[allow(missing_debug_implementations)] // holds a thread and channels
pub struct Offload {
    waker: Option<Waker>,
    thread: Option<ComputeThread>,
    running: Option<Running>,
    /// Commands that arrived during a step, applied when it ends.
    deferred: Vec<(u64, Vec<NodeControl>)>,
    /// `arrival` release (set by [`serve`]): a swap to a model this
    /// process has not loaded waits for the load, made on a thread of its
    /// own, while the old model keeps serving.
    background_swaps: bool,
    /// That swap, until its model is loaded (or fails to load).
    pending_swap: Option<PendingSwap>,
}

/// A model swap waiting for its model's load ([`Offload::pending_swap`]).
struct PendingSwap {
    time: u64,
    path: String,
    version: String,
    load: Arc<crate::models::Load>,
}

/// A step on the compute thread: its times (held until it ends), its
/// start on the wall clock and where its outputs come back.
struct Running {
    times: Vec<u64>,
    busy_since: u64,
    done: mpsc::Receiver<Vec<Vec<NodeEvent>>>,
}

impl NodeParts {
    /// A `SwapModel` command, between two batches. `complete` release
    /// swaps now, waiting for the model if this process has not loaded it
    /// (the command stamped t applies before every request at t or
    /// later). `arrival` release never loads on the worker: a model not
    /// loaded yet is loaded on a thread of its own while the old one keeps
    /// serving, and the node swaps once it is ready
    /// ([`NodeParts::poll_swap`]). A later swap replaces one still waiting.
    fn swap(&mut self, node: &mut ServingNode, time: u64, path: &str, version: &str) {
        let Some(models) = self.models.clone() else {
            tracing::warn!(
                node = node.id(),
                "SwapModel without a model registry: ignored"
            );
            return;
        };
        if let Some(replaced) = self.offload.pending_swap.take() {
            tracing::info!(
                node = node.id(),
                time,
                version = replaced.version,
                "a later swap replaces one still waiting for its model"
            );
        }
        if !self.offload.background_swaps {
            let params = models.params(path, version);
            self.take_model(node, time, path, params);
            return;
        }
        match models.fetch(path, version) {
            crate::models::Fetch::Ready(params) => self.take_model(node, time, path, Ok(*params)),
            crate::models::Fetch::Loading(load) => {
                tracing::info!(
                    node = node.id(),
                    time,
                    path,
                    version,
                    serving = node.model_version(),
                    "model loading in the background: the node swaps once it is ready"
                );
                if let Some(waker) = &self.offload.waker {
                    let waker = waker.clone();
                    load.on_done(move || waker.wake());
                }
                self.offload.pending_swap = Some(PendingSwap {
                    time,
                    path: path.into(),
                    version: version.into(),
                    load,
                });
            }
        }
    }

    /// Takes the model a waiting swap loaded, once it is ready (or gives
    /// the swap up if it could not be loaded); whether the node changed.
    fn poll_swap(&mut self, node: &mut ServingNode) -> bool {
        let Some(result) = self
            .offload
            .pending_swap
            .as_ref()
            .and_then(|p| p.load.result())
        else {
            return false;
        };
        let swap = self.offload.pending_swap.take().expect("checked");
        self.take_model(node, swap.time, &swap.path, result);
        true
    }

    /// Swaps the node to `params`; a model that cannot be had leaves the
    /// old one serving (and says why on /status).
    fn take_model(
        &self,
        node: &mut ServingNode,
        time: u64,
        path: &str,
        params: Result<grflow_operators::node::NodeParams, String>,
    ) {
        let Some(models) = &self.models else {
            return;
        };
        let swapped = params.and_then(|params| node.swap_model(params).map_err(|e| e.to_string()));
        match swapped {
            Ok(applied) => {
                tracing::info!(node = node.id(), time, ?applied, "model swapped");
                models.note_serving(node.id(), node.model_version());
                // The new model may allow longer histories than the one
                // the sources started with.
                models.note_history(node.history_limits());
            }
            Err(e) => {
                tracing::warn!(node = node.id(), time, path, "model swap failed: {e}");
                models.note_error(format!("node {}: {e}", node.id()));
            }
        }
    }
}

impl EventOperator for NodeParts {
    type Data = Routed;
    type Control = NodeControl;
    type Output = NodeEvent;

    fn on_control(&mut self, time: u64, mut commands: Vec<NodeControl>) {
        if self.offload.running.is_some() {
            // The compute thread holds the node: apply between steps.
            self.offload.deferred.push((time, commands));
            return;
        }
        commands.sort_by_key(|c| c.seq);
        let shared = self.node.clone();
        let mut node = lock(&shared);
        // A swap whose model has loaded since goes before these commands.
        self.poll_swap(&mut node);
        if let Some(o) = &self.oracle {
            o.borrow_mut()
                .enter(&node, time, &*self.side, &self.side.retrieval);
        }
        for c in commands {
            if let NodeCommand::SwapModel { path, version } = &c.command {
                self.swap(&mut node, time, path, version);
                continue;
            }
            match node.apply(&c.command, time) {
                Ok(applied) => {
                    // The oracle replays each α move at its own time (its
                    // refill gets the link from then on, not from the
                    // next batch).
                    if let Some(o) = &self.oracle
                        && let NodeCommand::SetAlpha(alpha) | NodeCommand::PinAlpha(Some(alpha)) =
                            c.command
                    {
                        o.borrow_mut().command(time, alpha);
                    }
                    tracing::debug!(node = node.id(), time, ?applied, "command applied")
                }
                // The allocator's move while an operator pins α: expected.
                Err(e @ grflow_operators::node::ServeError::AlphaPinned(_)) => {
                    tracing::debug!(node = node.id(), time, "command refused: {e}")
                }
                Err(e) => tracing::warn!(
                    node = node.id(),
                    time,
                    command = ?c.command,
                    "command refused: {e}"
                ),
            }
        }
        // An idle node's gauges would show the α from before the command
        // until it next served.
        publish_node_metrics(&node);
    }

    /// Nothing more arrives (end of trace, stop): a short batch would
    /// wait for nobody.
    fn on_input_closed(&mut self) {
        self.batch.max_wait_ms = 0.0;
    }

    /// `complete` mode: every request of one event time, in batches.
    fn on_data(&mut self, time: u64, batch: Vec<Routed>, out: &mut Vec<NodeEvent>) {
        let mut outs = [std::mem::take(out)];
        self.serve_all(vec![(time, batch)], &mut outs);
        let [served] = outs;
        *out = served;
    }

    fn on_start(&mut self, waker: Waker) {
        self.offload.waker = Some(waker);
        // A node that has not served yet exports its α too.
        publish_node_metrics(&lock(&self.node));
    }

    fn in_flight(&self) -> &[u64] {
        self.offload.running.as_ref().map_or(&[], |r| &r.times)
    }

    /// A step runs, or a swap waits for its model: the load's end wakes
    /// the worker and `on_queue` takes the model, with no request held
    /// back meanwhile.
    fn busy(&self) -> bool {
        self.offload.running.is_some() || self.offload.pending_swap.is_some()
    }

    /// `arrival` mode: one step at a time (a group of retrieve requests,
    /// or up to `lanes` rank batches, or both with two lanes or more), on
    /// the compute thread while the worker routes and admits; or a wait
    /// for a short batch to fill.
    fn on_queue(
        &mut self,
        queue: &mut VecDeque<(u64, Routed)>,
        out: &mut Vec<(u64, NodeEvent)>,
    ) -> Step {
        if !self.collect_step(queue, out) {
            return Step::Pending;
        }
        // Between two steps: a swap whose model has loaded takes it now,
        // before the next batch.
        if self.offload.pending_swap.is_some() {
            let shared = self.node.clone();
            let mut node = lock(&shared);
            if self.poll_swap(&mut node) {
                publish_node_metrics(&node);
            }
        }
        if queue.is_empty() {
            return Step::Idle;
        }
        let now = (self.wall_ns)();
        // Everything expired is answered now, however deep in the queue:
        // the batch policy sees only requests that are still served.
        let swept = self.sweep_expired(queue, now);
        let next = if queue.is_empty() {
            Next::Nothing
        } else {
            let view: Vec<Queued> = queue
                .iter()
                .map(|(_, r)| queued(r, now.saturating_sub(r.admitted.admitted_ns) as f64 / 1e6))
                .collect();
            self.batch.next(&view)
        };
        let (retrieve, rank) = match next {
            Next::Serve { retrieve, rank } => (retrieve, rank),
            wait_or_nothing => {
                // No step follows to report what the sweep finished: the
                // sweep reports itself, as a step of shed requests would.
                if let Some((times, outs)) = swept {
                    let queued = queued_by_replica(queue);
                    self.finish_step(times, outs, now, queued, out);
                }
                return match wait_or_nothing {
                    Next::Wait(ms) => Step::After(Duration::from_secs_f64(ms / 1e3)),
                    _ => Step::Idle,
                };
            }
        };
        // The step's report carries the tokens the sweep finished.
        if let Some((times, outs)) = swept {
            for (time, events) in times.into_iter().zip(outs) {
                out.extend(events.into_iter().map(|e| (time, e)));
            }
        }
        let items = take_positions(queue, rank.into_iter().chain(retrieve));
        self.launch(items, now, queue, out)
    }
}

impl NodeParts {
    /// Reports the running step if it has finished, then applies the
    /// commands deferred behind it. False while it still runs.
    fn collect_step(
        &mut self,
        queue: &VecDeque<(u64, Routed)>,
        out: &mut Vec<(u64, NodeEvent)>,
    ) -> bool {
        let Some(running) = &self.offload.running else {
            return true;
        };
        match running.done.try_recv() {
            Err(mpsc::TryRecvError::Empty) => false,
            Err(mpsc::TryRecvError::Disconnected) => {
                panic!("a step of node {} panicked (see above)", self.id())
            }
            Ok(outs) => {
                let running = self.offload.running.take().expect("checked");
                let queued = queued_by_replica(queue);
                self.finish_step(running.times, outs, running.busy_since, queued, out);
                for (time, commands) in std::mem::take(&mut self.offload.deferred) {
                    self.on_control(time, commands);
                }
                true
            }
        }
    }

    /// Serves `items` as one step: on the compute thread when the node has
    /// one (`Pending` until it ends), else here, reported at once. The
    /// policy bounded the step already; the node splits the rank batch
    /// over its lanes.
    fn launch(
        &mut self,
        items: Vec<(u64, Routed)>,
        now: u64,
        queue: &VecDeque<(u64, Routed)>,
        out: &mut Vec<(u64, NodeEvent)>,
    ) -> Step {
        let (times, slotted) = self.begin_step(items);
        let mut outs: Vec<Vec<NodeEvent>> = times.iter().map(|_| Vec::new()).collect();
        let (retrieve, rank): (Vec<Slotted>, Vec<Slotted>) = slotted
            .into_iter()
            .partition(|s| s.routed.admitted.request.mode == Mode::Retrieve);
        let ctx = self.ctx();
        match (&self.offload.waker, &self.oracle) {
            // The oracle follows every batch on this thread.
            (Some(waker), None) => {
                let thread = match &self.offload.thread {
                    Some(t) => t,
                    None => self.offload.thread.insert(
                        ComputeThread::spawn(self.id()).expect("spawning a node's compute thread"),
                    ),
                };
                let (tx, done) = mpsc::channel();
                let wake = WakeOnDrop(waker.clone());
                thread.run(Box::new(move || {
                    let _wake = wake;
                    ctx.serve_batch(rank, retrieve, None, &mut outs);
                    let _ = tx.send(outs);
                }));
                self.offload.running = Some(Running {
                    times,
                    busy_since: now,
                    done,
                });
                Step::Pending
            }
            _ => {
                ctx.serve_batch(rank, retrieve, self.oracle.as_ref(), &mut outs);
                let queued = queued_by_replica(queue);
                self.finish_step(times, outs, now, queued, out);
                if queue.is_empty() {
                    Step::Idle
                } else {
                    Step::Again
                }
            }
        }
    }
}

/// Takes the entries at `positions` out of `queue`, in queue order; the
/// rest keep theirs.
fn take_positions<T>(
    queue: &mut VecDeque<T>,
    positions: impl IntoIterator<Item = usize>,
) -> Vec<T> {
    let mut take = vec![false; queue.len()];
    for i in positions {
        take[i] = true;
    }
    let mut taken = Vec::new();
    let mut rest = VecDeque::with_capacity(queue.len());
    for (item, take) in queue.drain(..).zip(take) {
        if take {
            taken.push(item);
        } else {
            rest.push_back(item);
        }
    }
    *queue = rest;
    taken
}

impl NodeParts {
    fn id(&self) -> u32 {
        lock(&self.node).id()
    }

    fn ctx(&self) -> StepCtx {
        StepCtx {
            node: self.node.clone(),
            side: self.side.clone(),
            slo_ms: self.slo_ms,
            clock: self.clock,
            shedder: self.shedder,
            wall_ns: self.wall_ns,
        }
    }

    /// Takes every request of `queue` that is past its deadline or age
    /// limit at wall time `now` out of it and answers each as a batch
    /// would ([`StepCtx::answer_shed`]: its error record and failed sample,
    /// in (ts, user, req_id) order; its tokens booked as finished). The
    /// times answered at and their outputs (slot i at `times[i]`), or
    /// `None` when nothing expired.
    fn sweep_expired(
        &mut self,
        queue: &mut VecDeque<(u64, Routed)>,
        now: u64,
    ) -> Option<(Vec<u64>, Vec<Vec<NodeEvent>>)> {
        let mut swept = self.shedder.sweep(queue, now, |(_, r)| r);
        if swept.is_empty() {
            return None;
        }
        // In `begin_step`'s order already (its sort is stable), so that
        // each request stays beside its check.
        swept.sort_by_key(|((_, r), _)| {
            let r = &r.admitted.request;
            (r.ts_ms, r.user_id, r.req_id)
        });
        let (items, checks): (Vec<_>, Vec<_>) = swept.into_iter().unzip();
        let (times, slotted) = self.begin_step(items);
        let mut outs: Vec<Vec<NodeEvent>> = times.iter().map(|_| Vec::new()).collect();
        let ctx = self.ctx();
        for (s, check) in slotted.iter().zip(checks) {
            ctx.answer_shed(s, check, &mut outs[s.slot]);
        }
        Some((times, outs))
    }

    /// Reports, books the busy time and hands a step's outputs on, each
    /// at its time.
    fn finish_step(
        &mut self,
        times: Vec<u64>,
        mut outs: Vec<Vec<NodeEvent>>,
        busy_since: u64,
        queued: Vec<f64>,
        out: &mut Vec<(u64, NodeEvent)>,
    ) {
        self.end_step(&times, &mut outs, busy_since, queued);
        for (time, events) in times.into_iter().zip(outs) {
            out.extend(events.into_iter().map(|e| (time, e)));
        }
    }

    /// The output slot of each distinct time of a step (slot i is emitted
    /// at `times[i]`), its requests in (ts, user, req_id) order, and their
    /// tokens booked as finished for the routers: every request handed to
    /// a step is answered by its end.
    fn begin_step(&mut self, items: Vec<(u64, Routed)>) -> (Vec<u64>, Vec<Slotted>) {
        let mut times: Vec<u64> = Vec::new();
        let mut all: Vec<Slotted> = items
            .into_iter()
            .map(|(time, routed)| {
                let slot = match times.iter().position(|&t| t == time) {
                    Some(slot) => slot,
                    None => {
                        times.push(time);
                        times.len() - 1
                    }
                };
                Slotted { slot, time, routed }
            })
            .collect();
        all.sort_by_key(|s| {
            let r = &s.routed.admitted.request;
            (r.ts_ms, r.user_id, r.req_id)
        });
        for s in &all {
            add_for_replica(&mut self.completed_tokens, &s.routed);
        }
        (times, all)
    }

    /// Reports residency, load and finished work at the step's latest
    /// time, and books the step's wall time as busy.
    fn end_step(
        &mut self,
        times: &[u64],
        out: &mut [Vec<NodeEvent>],
        busy_since: u64,
        queued: Vec<f64>,
    ) {
        let Some((slot, &time)) = times.iter().enumerate().max_by_key(|(_, t)| **t) else {
            return;
        };
        let mut node = lock(&self.node);
        let mut report = node.report(time);
        report.completed_tokens = self.completed_tokens.clone();
        report.queued_tokens = queued;
        publish_node_metrics(&node);
        drop(node);
        out[slot].push(NodeEvent::Report(report));
        self.busy.borrow_mut().record(busy_since, (self.wall_ns)());
    }

    /// Serves `arrivals` (requests per event time) in (ts, user, req_id)
    /// order, in the steps the batch policy takes from a full queue without
    /// waiting: rank requests in batches of up to `max_tokens` per lane,
    /// retrieve requests in groups (one prefill, one beam decode); then
    /// reports. `out[i]` is emitted at `arrivals[i].0` (distinct times).
    fn serve_all(&mut self, arrivals: Vec<(u64, Vec<Routed>)>, out: &mut [Vec<NodeEvent>]) {
        let busy_since = (self.wall_ns)();
        let items = arrivals
            .into_iter()
            .flat_map(|(time, batch)| batch.into_iter().map(move |r| (time, r)))
            .collect();
        let (times, all) = self.begin_step(items);
        let ctx = self.ctx();
        // What expired already is answered before the steps are formed, so
        // that it takes no place in a batch.
        let all: Vec<Slotted> = if self.shedder.sheds_any() {
            let live = ctx.shed_expired(all, out);
            live.into_iter().map(|(s, _)| s).collect()
        } else {
            all
        };
        let view: Vec<Queued> = all.iter().map(|s| queued(&s.routed, 0.0)).collect();
        let steps = self.batch.steps(&view);
        let oracle = self.oracle.as_ref();
        let mut all: Vec<Option<Slotted>> = all.into_iter().map(Some).collect();
        let mut take = |indices: Vec<usize>| -> Vec<Slotted> {
            indices
                .into_iter()
                .map(|i| all[i].take().expect("a request is in one step"))
                .collect()
        };
        // Each step is checked against the deadline when it starts, so a
        // request queued behind earlier steps of the same activation is
        // shed too.
        for (retrieve, rank) in steps {
            let (retrieve, rank) = (take(retrieve), take(rank));
            ctx.serve_batch(rank, retrieve, oracle, out);
        }
        // Complete mode: the routers model load on event time instead.
        self.end_step(&times, out, busy_since, Vec::new());
    }
}

/// The node's gauges and counters for `/metrics`, after each step.
fn publish_node_metrics(node: &ServingNode) {
    let label = [("node", node.id().to_string())];
    let c = node.counters();
    let ratio = |a: u64, b: u64| if b == 0 { 0.0 } else { a as f64 / b as f64 };
    metrics::gauge!("grflow_alpha", &label).set(node.alpha());
    metrics::gauge!("grflow_emb_hit_rate", &label).set(ratio(c.emb_hits, c.emb_lookups));
    metrics::gauge!("grflow_kv_hit_rate", &label).set(ratio(c.kv_reused_tokens, c.kv_total_tokens));
    metrics::counter!("grflow_model_calls_total", &label).absolute(c.model_calls);
    metrics::counter!("grflow_model_flops_total", &label).absolute(c.model_flops as u64);
    metrics::counter!("grflow_refill_bytes_total", &label).absolute(c.refill_bytes);
    metrics::gauge!("grflow_user_prefix_heads", &label).set(node.user_heads() as f64);
}

/// `r` as the batch policy sees it, having waited `waited_ms`.
fn queued(r: &Routed, waited_ms: f64) -> Queued {
    Queued {
        retrieve: r.admitted.request.mode == Mode::Retrieve,
        tokens: r.tokens as usize,
        waited_ms,
    }
}

/// Tokens waiting in an arrival-mode queue, by the router replica that
/// sent them: with the finished work, what every replica needs to see the
/// whole queue, not only its own share of it.
fn queued_by_replica(queue: &VecDeque<(u64, Routed)>) -> Vec<f64> {
    let mut queued: Vec<f64> = Vec::new();
    for (_, r) in queue {
        add_for_replica(&mut queued, r);
    }
    queued
}

/// Adds `r`'s tokens to the entry of the router replica that sent it,
/// growing `by_replica` as replicas appear.
fn add_for_replica(by_replica: &mut Vec<f64>, r: &Routed) {
    let replica = r.router as usize;
    if by_replica.len() <= replica {
        by_replica.resize(replica + 1, 0.0);
    }
    by_replica[replica] += r.tokens as f64;
}

/// Serves `routed` on this worker's node, applying the commands of
/// `controls` (from any worker; a command for every node is copied to
/// each) at their event times.
pub fn serve<'s>(
    routed: StreamVec<'s, u64, Routed>,
    controls: StreamVec<'s, u64, NodeControl>,
    mut parts: NodeParts,
    release: Release,
) -> StreamVec<'s, u64, NodeEvent> {
    parts.offload.background_swaps = release == Release::Arrival;
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

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::time::Duration;

    use grflow_connectors::SourcePosition;
    use grflow_operators::router::Decision;
    use grflow_traces::{GenConfig, Regime};

    use super::*;

    use crate::Config;
    use crate::events::Admitted;
    use crate::events::ErrorKind;
    use crate::params::node_params;

    thread_local! {
        /// A wall clock that moves 1 ms every time it is read.
        static NOW_NS: Cell<u64> = const { Cell::new(0) };
    }

    fn stepping_clock() -> u64 {
        NOW_NS.with(|t| {
            let now = t.get();
            t.set(now + 1_000_000);
            now
        })
    }

    /// A node wrapper with a 10 ms deadline, one request per batch, on the
    /// stepping clock, and `n` rank requests admitted at time 0.
    fn setup(n: u64) -> (NodeParts, Vec<Routed>) {
        setup_mix(n, 0.0)
    }

    /// [`setup`] with this share of retrieve requests.
    fn setup_mix(n: u64, retrieve_share: f64) -> (NodeParts, Vec<Routed>) {
        let cfg = Config::embedded();
        let trace = grflow_traces::generate(&GenConfig {
            regime: Regime::Steady,
            users: 20,
            items: 300,
            requests: n,
            candidates: 8,
            retrieve_share,
            ..GenConfig::default()
        });
        let meta = trace.meta.clone().unwrap();
        let side = SideTables::new(meta, trace.users, trace.items, cfg.node.shard_rows).unwrap();
        let params = node_params(&cfg, &side.meta, &side.catalog()).unwrap();
        let parts = NodeParts {
            node: Arc::new(Mutex::new(ServingNode::new(0, params).unwrap())),
            busy: Rc::new(RefCell::new(BusyMeter::new(0, 1_000_000_000))),
            side: Arc::new(side),
            slo_ms: cfg.run.slo_ms,
            clock: Clock::Wall,
            shedder: DeadlineShedder::new(Some(Duration::from_millis(10))),
            batch: BatchPolicy {
                max_tokens: 1,
                max_wait_ms: 0.0,
                lanes: 1,
            },
            wall_ns: stepping_clock,
            completed_tokens: Vec::new(),
            models: None,
            oracle: None,
            offload: Offload::default(),
        };
        let routed = trace
            .requests
            .into_iter()
            .enumerate()
            .map(|(i, request)| {
                // The router's count.
                let history = parts
                    .side
                    .history(request.user_id, request.hist_len)
                    .unwrap_or(&[]);
                let tokens = parts.side.request_tokens(&request, history) as u32;
                Routed {
                    admitted: Admitted {
                        request,
                        position: SourcePosition::Parquet {
                            file: "t".into(),
                            row_group: 0,
                            row: i as u64,
                        },
                        admitted_ns: 0,
                        inline_history: None,
                        recovered: false,
                        history_cut: false,
                    },
                    decision: Decision {
                        node: 0,
                        kv_hit: false,
                        affinity_win: false,
                        overload_fallback: false,
                        emb_coverage: 0.0,
                        hot_user: false,
                    },
                    router: 0,
                    tokens,
                }
            })
            .collect();
        (parts, routed)
    }

    #[test]
    fn each_batch_is_checked_against_the_deadline_when_it_starts() {
        NOW_NS.with(|t| t.set(0));
        let (mut parts, routed) = setup(12);
        let mut out = [Vec::new()];
        parts.serve_all(vec![(5, routed)], &mut out);
        let (mut served, mut shed) = (Vec::new(), Vec::new());
        for event in &out[0] {
            match event {
                NodeEvent::Response(r) => served.push(r.0.req_id),
                NodeEvent::Error(e) if e.1 == ErrorKind::Shed => shed.push(e.0.req_id.unwrap()),
                NodeEvent::Error(e) => panic!("unexpected error {:?}", e.0),
                _ => {}
            }
        }
        // The clock moves 1 ms per read and a batch reads it several
        // times, so the first batches start within the 10 ms deadline and
        // the later ones after it: those are shed, though all twelve were
        // in time when the activation began.
        assert_eq!(served.len() + shed.len(), 12, "{served:?} {shed:?}");
        assert!(
            !served.is_empty() && !shed.is_empty(),
            "{served:?} {shed:?}"
        );
        assert!(
            served.iter().max() < shed.iter().min(),
            "the shed ones are the later batches: {served:?} {shed:?}"
        );
    }

    #[test]
    fn without_a_deadline_every_request_is_served_in_batches() {
        NOW_NS.with(|t| t.set(0));
        let (mut parts, routed) = setup(12);
        parts.shedder = DeadlineShedder::new(None);
        parts.batch.max_tokens = 10_000;
        let mut out = [Vec::new()];
        parts.serve_all(vec![(5, routed)], &mut out);
        let served = out[0]
            .iter()
            .filter(|e| matches!(e, NodeEvent::Response(_)))
            .count();
        assert_eq!(served, 12);
        let counters = lock(&parts.node).counters().clone();
        assert_eq!(counters.responses, 12);
        assert!(
            counters.model_calls < 12,
            "batched: {} calls",
            counters.model_calls
        );
    }

    /// Every response of a complete-mode activation of `n` requests, by
    /// req_id, with the node's model calls.
    fn serve_complete(n: u64, share: f64, max_tokens: usize) -> (Vec<(u64, Vec<u32>)>, u64) {
        NOW_NS.with(|t| t.set(0));
        let (mut parts, routed) = setup_mix(n, share);
        parts.shedder = DeadlineShedder::new(None);
        parts.batch.max_tokens = max_tokens;
        let mut out = [Vec::new()];
        parts.serve_all(vec![(5, routed)], &mut out);
        let mut items: Vec<(u64, Vec<u32>)> = out[0]
            .iter()
            .filter_map(|e| match e {
                NodeEvent::Response(r) => Some((r.0.req_id, r.0.items.clone())),
                NodeEvent::Error(e) => panic!("unexpected error {:?}", e.0),
                _ => None,
            })
            .collect();
        items.sort();
        let calls = lock(&parts.node).counters().model_calls;
        (items, calls)
    }

    #[test]
    fn complete_mode_groups_retrieve_requests_with_the_results_of_one_at_a_time() {
        let (alone, alone_calls) = serve_complete(12, 0.5, 1);
        let (grouped, grouped_calls) = serve_complete(12, 0.5, 10_000);
        assert_eq!(alone.len(), 12);
        assert_eq!(alone_calls, 12, "one request per call");
        // One rank batch and one retrieve group.
        assert_eq!(grouped_calls, 2);
        assert_eq!(grouped, alone);
    }

    /// What one `on_queue` call answered: served req_ids in order, shed
    /// req_ids, failed samples, reports.
    #[derive(Debug, Default)]
    struct Answered {
        served: Vec<u64>,
        shed: Vec<u64>,
        failed_samples: usize,
        reports: usize,
    }

    fn answered(out: &[(u64, NodeEvent)]) -> Answered {
        let mut a = Answered::default();
        for (time, event) in out {
            assert_eq!(*time, 5, "answered at the request's time");
            match event {
                NodeEvent::Response(r) => a.served.push(r.0.req_id),
                NodeEvent::Error(e) if e.1 == ErrorKind::Shed => {
                    assert!(e.0.reason.starts_with("shed: waited "), "{}", e.0.reason);
                    assert!(e.0.reason.ends_with("past the deadline of 10000 ms"));
                    a.shed.push(e.0.req_id.unwrap());
                }
                NodeEvent::Error(e) => panic!("unexpected error {:?}", e.0),
                NodeEvent::Telemetry(t) if t.sample.failed => a.failed_samples += 1,
                NodeEvent::Report(_) => a.reports += 1,
                _ => {}
            }
        }
        a
    }

    /// A 10 s deadline, the clock at 100 s and each request admitted at 0
    /// (expired) or at 100 s (live) by `expired(i)`; one request a batch.
    fn arrival_queue(
        n: u64,
        expired: impl Fn(usize) -> bool,
    ) -> (NodeParts, VecDeque<(u64, Routed)>) {
        NOW_NS.with(|t| t.set(100_000_000_000));
        let (mut parts, routed) = setup(n);
        parts.shedder = DeadlineShedder::new(Some(Duration::from_secs(10)));
        let queue = routed
            .into_iter()
            .enumerate()
            .map(|(i, mut r)| {
                r.admitted.admitted_ns = if expired(i) { 0 } else { 100_000_000_000 };
                (5, r)
            })
            .collect();
        (parts, queue)
    }

    /// A backlog of expired requests is answered in one activation, not
    /// one batch's worth per step: no model call, one report carrying all
    /// their tokens as finished.
    #[test]
    fn a_backlog_of_expired_requests_is_answered_in_one_activation() {
        let (mut parts, mut queue) = arrival_queue(40, |_| true);
        let tokens: f64 = queue.iter().map(|(_, r)| r.tokens as f64).sum();
        let ids: Vec<u64> = queue
            .iter()
            .map(|(_, r)| r.admitted.request.req_id)
            .collect();
        let mut out = Vec::new();
        let step = parts.on_queue(&mut queue, &mut out);
        assert!(matches!(step, Step::Idle));
        assert!(queue.is_empty());
        let a = answered(&out);
        assert!(a.served.is_empty());
        let (mut shed, mut want) = (a.shed.clone(), ids);
        shed.sort();
        want.sort();
        assert_eq!(shed, want, "each answered once");
        assert_eq!(a.failed_samples, 40);
        assert_eq!(a.reports, 1);
        assert_eq!(parts.completed_tokens.iter().sum::<f64>(), tokens);
        assert_eq!(lock(&parts.node).counters().model_calls, 0);
    }

    /// Expired and live requests mixed: the first activation answers every
    /// expired one; the live ones are served in queue order, one step each
    /// (none spent on an expired request).
    #[test]
    fn expired_requests_are_swept_and_live_ones_served_in_order() {
        let (mut parts, mut queue) = arrival_queue(30, |i| i % 3 != 0);
        let live: Vec<u64> = queue
            .iter()
            .filter(|(_, r)| r.admitted.admitted_ns > 0)
            .map(|(_, r)| r.admitted.request.req_id)
            .collect();
        assert_eq!(live.len(), 10);
        let mut first = Vec::new();
        let mut step = parts.on_queue(&mut queue, &mut first);
        let a = answered(&first);
        assert_eq!(a.shed.len(), 20);
        assert_eq!(a.failed_samples, 20);
        assert_eq!(a.served, live[..1], "and the first live batch");
        assert_eq!(a.reports, 1, "one report, the step's");
        let mut served = a.served;
        let mut steps = 1;
        while matches!(step, Step::Again) {
            let mut out = Vec::new();
            step = parts.on_queue(&mut queue, &mut out);
            let a = answered(&out);
            assert!(a.shed.is_empty() && a.failed_samples == 0);
            served.extend(a.served);
            steps += 1;
        }
        assert!(matches!(step, Step::Idle));
        assert_eq!(served, live);
        assert_eq!(steps, live.len());
        assert_eq!(lock(&parts.node).counters().responses, 10);
    }

    /// In complete mode what expired before the activation is answered
    /// before the steps are formed: the live requests' steps are theirs.
    #[test]
    fn complete_mode_sheds_what_expired_before_forming_steps() {
        let (mut parts, queue) = arrival_queue(12, |i| i % 2 == 0);
        // Room for the live requests exactly: an expired request in a
        // batch would push a live one into another.
        parts.batch.max_tokens = queue
            .iter()
            .filter(|(_, r)| r.admitted.admitted_ns > 0)
            .map(|(_, r)| r.tokens as usize)
            .sum();
        let routed: Vec<Routed> = queue.into_iter().map(|(_, r)| r).collect();
        let mut out = [Vec::new()];
        parts.serve_all(vec![(5, routed)], &mut out);
        let tagged: Vec<(u64, NodeEvent)> = out[0].drain(..).map(|e| (5, e)).collect();
        let a = answered(&tagged);
        assert_eq!((a.served.len(), a.shed.len()), (6, 6));
        assert_eq!(lock(&parts.node).counters().model_calls, 1, "one batch");
    }

    /// `complete` release (deterministic replays): the swap stamped t
    /// applies when its command does, loading the model there if this
    /// process has not, so that every request at t or later sees it.
    #[test]
    fn a_complete_node_swaps_when_the_command_applies() {
        use crate::models::test_models::as_trained;
        let (mut parts, _) = setup(1);
        let base =
            node_params(&Config::embedded(), &parts.side.meta, &parts.side.catalog()).unwrap();
        parts.models = Some(Arc::new(crate::models::ModelRegistry::new(Box::new(
            move |_: &str| Ok(as_trained(&base, "v2")),
        ))));
        assert!(!parts.offload.background_swaps, "complete release");
        let swap = swap_to_v2(Target::Node(0));
        parts.on_control(5, vec![swap]);
        assert_eq!(lock(&parts.node).model_version(), "v2");
        assert!(parts.in_flight().is_empty());
        assert!(!parts.busy());
    }

    /// A swap to model "v2" (at "/m/v2"), for `target`.
    fn swap_to_v2(target: Target) -> NodeControl {
        NodeControl {
            target,
            seq: 0,
            command: NodeCommand::SwapModel {
                path: "/m/v2".into(),
                version: "v2".into(),
            },
        }
    }

    /// `arrival` release: while a swap waits for its model and no step
    /// runs, the node is busy (the wrapper offers it the queue when the
    /// load ends) but holds no time of the job back; the next `on_queue`
    /// after the load, even with nothing queued, swaps.
    #[test]
    fn a_node_waiting_for_its_model_is_busy_with_nothing_in_flight() {
        use crate::models::test_models::{Gate, as_trained};
        let (mut parts, _) = setup(1);
        parts.offload.background_swaps = true;
        let base =
            node_params(&Config::embedded(), &parts.side.meta, &parts.side.catalog()).unwrap();
        let gate = Gate::default();
        let loading = gate.clone();
        parts.models = Some(Arc::new(crate::models::ModelRegistry::new(Box::new(
            move |_: &str| {
                loading.pass();
                Ok(as_trained(&base, "v2"))
            },
        ))));
        let old = lock(&parts.node).model_version().to_string();
        let swap = swap_to_v2(Target::Node(0));
        parts.on_control(5, vec![swap]);
        assert!(parts.busy(), "the swap waits for its model");
        assert!(parts.in_flight().is_empty(), "{:?}", parts.in_flight());
        assert_eq!(lock(&parts.node).model_version(), old);
        gate.open();
        let load = parts.offload.pending_swap.as_ref().unwrap().load.clone();
        load.wait().unwrap();
        let mut out = Vec::new();
        let step = parts.on_queue(&mut VecDeque::new(), &mut out);
        assert_eq!(step, Step::Idle);
        assert!(out.is_empty());
        assert_eq!(lock(&parts.node).model_version(), "v2");
        assert!(!parts.busy());
    }

    /// `arrival` release (serve's default): a swap to a model this process
    /// has not loaded (cluster mode: another process was called) does not
    /// load it on the worker. The node keeps answering with the old model
    /// while it loads elsewhere, and once it has loaded, the load's end
    /// wakes the idle worker, which swaps without any other input.
    #[test]
    fn an_arrival_node_serves_the_old_model_while_the_new_one_loads_then_swaps() {
        use crate::models::test_models::{Gate, as_trained};
        use timely::dataflow::operators::core::Inspect;
        use timely::dataflow::operators::{Input, Probe};
        use timely::dataflow::{InputHandleVec, ProbeHandle};

        timely::execute_directly(move |worker| {
            let (mut parts, routed) = setup(8);
            parts.shedder = DeadlineShedder::new(None);
            parts.wall_ns = crate::events::now_ns;
            let base =
                node_params(&Config::embedded(), &parts.side.meta, &parts.side.catalog()).unwrap();
            let old = lock(&parts.node).model_version().to_string();
            let gate = Gate::default();
            let models = {
                let gate = gate.clone();
                Arc::new(crate::models::ModelRegistry::new(Box::new(
                    move |_: &str| {
                        gate.pass();
                        Ok(as_trained(&base, "v2"))
                    },
                )))
            };
            parts.models = Some(models.clone());
            let node = parts.node.clone();
            let versions: Rc<RefCell<Vec<String>>> = Rc::default();
            let answered = versions.clone();
            let mut requests: InputHandleVec<u64, Routed> = InputHandleVec::new();
            let mut controls: InputHandleVec<u64, NodeControl> = InputHandleVec::new();
            let probe = ProbeHandle::new();
            worker.dataflow::<u64, _, _>(|scope| {
                let routed = scope.input_from(&mut requests);
                let commands = scope.input_from(&mut controls);
                serve(routed, commands, parts, Release::Arrival)
                    .inspect(move |e| {
                        if let NodeEvent::Response(r) = e {
                            answered.borrow_mut().push(r.0.model_version.clone());
                        }
                    })
                    .probe_with(&probe);
            });
            let serve_until = |worker: &mut timely::worker::Worker, n: usize| {
                let started = std::time::Instant::now();
                while versions.borrow().len() < n {
                    worker.step_or_park(Some(Duration::from_millis(5)));
                    assert!(
                        started.elapsed() < Duration::from_secs(60),
                        "never answered"
                    );
                }
            };
            let mut routed = routed.into_iter();
            controls.send(swap_to_v2(Target::All));
            controls.flush();
            // The load waits at the gate: the worker goes on serving (had
            // it loaded here, it would wait for the gate, a minute).
            for r in routed.by_ref().take(4) {
                requests.send(r);
            }
            requests.flush();
            serve_until(worker, 4);
            assert_eq!(
                *versions.borrow(),
                vec![old.clone(); 4],
                "the old model serves"
            );
            assert_eq!(lock(&node).model_version(), old);
            // Idle now: nothing queued, no step running.
            for _ in 0..20 {
                worker.step_or_park(Some(Duration::from_millis(5)));
            }
            // The model loads; nothing else happens. The worker parks for
            // up to a minute at a time unless the load's end wakes it.
            gate.open();
            let started = std::time::Instant::now();
            while lock(&node).model_version() == old {
                worker.step_or_park(Some(Duration::from_secs(60)));
                assert!(
                    started.elapsed() < Duration::from_secs(30),
                    "the idle worker was not woken to swap"
                );
            }
            assert_eq!(lock(&node).model_version(), "v2");
            for r in routed {
                requests.send(r);
            }
            requests.flush();
            serve_until(worker, 8);
            assert_eq!(versions.borrow()[4..], vec!["v2".to_string(); 4]);
            assert_eq!(models.report()["serving"]["0"], "v2");
        });
    }

    #[test]
    fn a_step_takes_its_positions_in_queue_order_and_leaves_the_rest() {
        let mut queue: VecDeque<u32> = (10..16).collect();
        // The policy names rank positions, then retrieve ones.
        let taken = take_positions(&mut queue, [4, 1, 2]);
        assert_eq!(taken, vec![11, 12, 14]);
        assert_eq!(queue, VecDeque::from(vec![10, 13, 15]));
        assert!(take_positions(&mut queue, []).is_empty());
        assert_eq!(queue.len(), 3);
    }
}
