//! The serving dataflow of one worker (= one serving node):
//! source → exchange by user → router → exchange by node → node → sinks,
//! with node reports fed back to every router replica (+1 ms) and telemetry
//! aggregated into a stream of closed windows. Router and node are
//! event-time operators (`operator::EventOperator`) released by
//! `run.release`; the node's control input carries commands (`control`).

pub mod allocator;
pub mod control;
pub mod kafka;
pub mod node;
pub mod operator;
mod outputs;
pub mod router;
pub mod source;
pub mod stash;
pub mod wake;
pub mod windows;

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use timely::dataflow::ProbeHandle;
use timely::dataflow::operators::vec::{Broadcast, Map};
use timely::dataflow::operators::{Concat, ConnectLoop, Feedback, Inspect, Probe};
use timely::dataflow::{Scope, StreamVec};
use timely::worker::Worker;

use grflow_connectors::RequestSource;
use grflow_connectors::{ErrorRow, ResponseRow};
use grflow_operators::allocator::oracle::OracleRecorder;
use grflow_operators::busy::BusyMeter;
use grflow_operators::node::batching::BatchPolicy;
use grflow_operators::node::{DeadlineShedder, ServingNode};
use grflow_operators::router::{LoadSignal, NodeReport, Router};

use crate::config::{Clock, Release, SloMs};
use crate::events::{Admitted, ClosedWindow, Ingest, NodeControl, NodeEvent, ScheduledCommand};
use crate::side::SideTables;
use crate::stop::StopRequest;
use crate::summary::{LatencyTally, ModeTallies};
pub use source::Pacing;
use source::SourceCounters;
use windows::WindowGauge;

/// Responses (and error rows) leave a worker in batches of this many rows.
pub(crate) const RESPONSE_BATCH: usize = 1_024;

/// Receives each batch of rows as they are produced (draining it).
pub type BatchSink<R> = Box<dyn FnMut(&mut Vec<R>)>;

/// The job's response sink, so no worker keeps responses for the whole run.
pub type ResponseBatchSink = BatchSink<ResponseRow>;

/// The same for error rows (records that failed to decode, requests shed
/// or unservable): the job's error sink.
pub type ErrorBatchSink = BatchSink<ErrorRow>;

/// What a worker keeps of the outputs it produced: latencies as bounded
/// tallies per node, responses and error rows only until the next batch
/// goes to its sink.
#[derive(Debug, Default)]
pub struct WorkerOutputs {
    /// Responses not yet handed to the sink (fewer than a batch).
    pub pending_responses: Vec<ResponseRow>,
    /// Error rows not yet handed to the sink (fewer than a batch).
    pub pending_errors: Vec<ErrorRow>,
    /// The most error rows this worker held at once before handing them
    /// to the sink (a batch, plus what arrived in the same activation).
    pub pending_errors_peak: usize,
    pub latency: BTreeMap<u32, LatencyTally>,
    /// The same latencies by request kind, each against its own SLO.
    pub by_mode: ModeTallies,
    /// Closed windows of this worker's node: one row per epoch, kept for
    /// windows.parquet and the summary's event-time span.
    pub windows: Vec<grflow_connectors::WindowRow>,
}

/// Handles to the state of one worker's dataflow, read after it completes.
#[allow(missing_debug_implementations)] // holds timely handles without Debug
pub struct WorkerDataflow {
    pub router: Rc<RefCell<Router>>,
    pub node: node::SharedNode,
    /// Time the node spent serving, for its busy share.
    pub busy: Rc<RefCell<BusyMeter>>,
    /// What the windows operator holds (open windows, buffered samples).
    pub window_gauge: Rc<RefCell<WindowGauge>>,
    pub outputs: Rc<RefCell<WorkerOutputs>>,
    pub probe: ProbeHandle<u64>,
}

/// Shared counters the progress display reads while the job runs.
#[derive(Debug, Default)]
pub struct JobCounters {
    pub source: Arc<SourceCounters>,
    pub responses_out: AtomicU64,
    pub errors: AtomicU64,
}

/// Everything a worker needs to build its dataflow.
#[allow(missing_debug_implementations)] // holds a boxed source
pub struct DataflowParts {
    pub source: Box<dyn RequestSource>,
    pub pacing: Pacing,
    /// With `--speed max`: how far (event ms) the source may run ahead of
    /// the oldest time not yet answered (`run.max_ahead_ms`).
    pub max_ahead_ms: Option<u64>,
    pub serving: ServingParts,
    pub counters: Arc<JobCounters>,
    /// Where responses go; they are counted and tallied before.
    pub responses: ResponseBatchSink,
    /// Where error rows go; they are counted before.
    pub errors: ErrorBatchSink,
    /// Cluster mode: responses and error rows travel to worker 0 and only
    /// its sinks write them (one responses.parquet and one errors.parquet
    /// for the job, on process 0).
    pub gather_responses: bool,
    /// Once requested, the source reads nothing more and the job drains
    /// what it admitted (`replay` on SIGINT/SIGTERM); a stop requested in
    /// one process of a cluster reaches every other.
    pub stop: Option<StopRequest>,
}

/// The serving part every job shares: router, node, report feedback and
/// windowed statistics, from admitted requests to node events.
#[allow(missing_debug_implementations)] // holds the node and a closure
pub struct ServingParts {
    pub router: Router,
    pub node: ServingNode,
    pub side: Arc<SideTables>,
    pub slo_ms: SloMs,
    pub clock: Clock,
    /// Requests waiting longer than this are answered with a `shed` error.
    pub deadline: Option<Duration>,
    /// ... and so are requests produced (their `ts_ms`) longer ago than this.
    pub max_age: Option<Duration>,
    /// Length of a statistics window (`windows.epoch_ms`) and of a busy-share interval.
    pub window_ms: u64,
    /// When router and node handle what arrives.
    pub release: Release,
    /// Batch budget, wait bound and lanes (`Config::batch_policy`).
    pub batch: BatchPolicy,
    /// In-flight tokens at load 1.0 (`node.token_capacity`).
    pub token_capacity: f64,
    /// Commands for the nodes' control input, paced like the requests.
    pub commands: Vec<ScheduledCommand>,
    pub command_pacing: Pacing,
    /// Makes commands from the nodes' events (e.g. an allocator reading
    /// closed windows); they travel a feedback edge and apply from the next
    /// millisecond.
    pub controller: Option<Controller>,
    /// Commands made while the job runs (`serve`'s admin endpoint).
    pub live: Option<control::LiveControl>,
    /// Where a `SwapModel` command finds its model's parameters.
    pub models: Option<Arc<crate::models::ModelRegistry>>,
    /// The oracle α* follows this worker's node (bench allocator).
    pub oracle: Option<Rc<RefCell<OracleRecorder>>>,
}

/// Turns the node events and the closed windows into commands for the
/// nodes (the allocator). What it emits at event time t is fed back stamped
/// t + 1: a command made from a window that closes at W_end applies from
/// W_end + 1.
pub type Controller = Box<
    dyn for<'s> FnOnce(
        StreamVec<'s, u64, NodeEvent>,
        StreamVec<'s, u64, ClosedWindow>,
    ) -> StreamVec<'s, u64, NodeControl>,
>;

/// Shared handles to the serving state of one worker.
#[allow(missing_debug_implementations)]
pub struct ServingHandles {
    pub router: Rc<RefCell<Router>>,
    pub node: node::SharedNode,
    pub busy: Rc<RefCell<BusyMeter>>,
    pub window_gauge: Rc<RefCell<WindowGauge>>,
}

/// What the shared serving part produces: node events (responses, errors,
/// telemetry, reports) and the node's closed windows.
#[allow(missing_debug_implementations)]
pub struct ServingStreams<'s> {
    pub events: StreamVec<'s, u64, NodeEvent>,
    pub windows: StreamVec<'s, u64, ClosedWindow>,
}

pub fn serving<'s>(
    scope: Scope<'s, u64>,
    requests: StreamVec<'s, u64, Admitted>,
    parts: ServingParts,
) -> (ServingStreams<'s>, ServingHandles) {
    let mut router = parts.router;
    router.seed_token_capacity(parts.token_capacity);
    if parts.release == Release::Arrival {
        // Arrival serves on real time: l(n) is the work sent and not yet
        // finished, not an event-time model of it.
        router.set_load_signal(LoadSignal::InFlight {
            replica: scope.index(),
            replicas: scope.peers(),
            token_capacity: parts.token_capacity,
        });
    }
    let router = Rc::new(RefCell::new(router));
    let mut node = parts.node;
    node.set_lanes(parts.batch.lanes);
    let node = std::sync::Arc::new(std::sync::Mutex::new(node));
    // Busy shares are measured over wall-time intervals as long as a window.
    let busy = Rc::new(RefCell::new(BusyMeter::new(
        crate::events::now_ns(),
        parts.window_ms.saturating_mul(1_000_000),
    )));
    let window_gauge: Rc<RefCell<WindowGauge>> = Default::default();

    let (reports_handle, reports) = scope.feedback::<Vec<NodeReport>>(1);
    let routed = router::route(
        requests,
        reports,
        router.clone(),
        parts.side.clone(),
        parts.release,
    );
    let mut scheduled = control::scheduled_commands(scope, parts.commands, parts.command_pacing);
    if let Some(live) = parts.live {
        scheduled = scheduled.concat(control::live_commands(scope, live));
    }
    let (controls, commands_loop) = match parts.controller {
        Some(controller) => {
            let (handle, fed_back) = scope.feedback::<Vec<NodeControl>>(1);
            (scheduled.concat(fed_back), Some((controller, handle)))
        }
        None => (scheduled, None),
    };
    let node_parts = node::NodeParts {
        node: node.clone(),
        busy: busy.clone(),
        side: parts.side,
        slo_ms: parts.slo_ms,
        clock: parts.clock,
        shedder: DeadlineShedder::new(parts.deadline).with_max_age(parts.max_age),
        batch: parts.batch,
        wall_ns: crate::events::now_ns,
        completed_tokens: vec![0.0; scope.peers()],
        models: parts.models,
        oracle: parts.oracle,
        offload: node::Offload::default(),
    };
    let events = node::serve(routed, controls, node_parts, parts.release);

    events
        .clone()
        .flat_map(|e| match e {
            NodeEvent::Report(r) => Some(r),
            _ => None,
        })
        .broadcast()
        .connect_loop(reports_handle);

    let telemetry = events.clone().flat_map(|e| match e {
        NodeEvent::Telemetry(t) => Some(t),
        _ => None,
    });
    let windows = windows::closed_windows(telemetry, parts.window_ms, window_gauge.clone());
    if let Some((controller, handle)) = commands_loop {
        controller(events.clone(), windows.clone()).connect_loop(handle);
    }
    (
        ServingStreams { events, windows },
        ServingHandles {
            router,
            node,
            busy,
            window_gauge,
        },
    )
}

pub fn build(worker: &mut Worker, parts: DataflowParts) -> WorkerDataflow {
    let outputs: Rc<RefCell<WorkerOutputs>> = Default::default();
    let probe = ProbeHandle::new();
    let counters = parts.counters;
    let slo_ms = parts.serving.slo_ms;
    // Shared by the local sink and, in cluster mode, the gathering one.
    let sinks = outputs::Sinks {
        responses: Rc::new(RefCell::new(parts.responses)),
        errors: Rc::new(RefCell::new(parts.errors)),
    };

    let handles = worker.dataflow::<u64, _, _>(|scope| {
        let ahead = parts.max_ahead_ms.map(|max_ms| source::Ahead {
            probe: probe.clone(),
            max_ms,
        });
        let ingest = source::request_source(
            scope,
            parts.source,
            parts.pacing,
            ahead,
            counters.source.clone(),
            parts.stop.clone(),
        );
        let requests = ingest.clone().flat_map(|i| match i {
            Ingest::Request(a) => Some(*a),
            _ => None,
        });
        let bad = ingest.clone().flat_map(|i| match i {
            Ingest::Bad(e) => Some(e),
            _ => None,
        });
        if let Some(stop) = parts.stop {
            // One worker's stop is every worker's: in cluster mode a signal
            // reaches one process only.
            ingest
                .flat_map(|i| match i {
                    Ingest::Stopped(signal) => Some(signal),
                    _ => None,
                })
                .broadcast()
                .inspect(move |&signal| stop.request_from_peer(signal));
        }

        let (streams, handles) = serving(scope, requests, parts.serving);
        outputs::window_rows(streams.windows, outputs.clone());
        let gather = parts.gather_responses;
        if gather {
            outputs::gather_outputs(streams.events.clone(), bad.clone(), &sinks, outputs.clone());
        }
        outputs::tally(
            streams.events.probe_with(&probe),
            outputs::Tally {
                outputs: outputs.clone(),
                counters: counters.clone(),
                slo_ms,
                write: !gather,
            },
            &sinks,
        );
        outputs::bad_records(bad, outputs.clone(), counters.clone(), !gather, &sinks);
        handles
    });

    WorkerDataflow {
        router: handles.router,
        node: handles.node,
        busy: handles.busy,
        window_gauge: handles.window_gauge,
        outputs,
        probe,
    }
}
