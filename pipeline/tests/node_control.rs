//! Commands on the nodes' control input, through the serving dataflow: in
//! `complete` mode a `SetAlpha` stamped t changes α for exactly the requests
//! at t and after, on the nodes it is addressed to, on every run; a command
//! made from the nodes' events at t (fed back) applies from t + 1.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use timely::dataflow::ProbeHandle;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{Inspect, Probe};

use grflow_connectors::parquet::MemoryRequestSource;
use grflow_operators::hotness::HotUsers;
use grflow_operators::node::{NodeCommand, ServingNode};
use grflow_operators::router::Router;
use grflow_pipeline::dataflow::source::{Pacing, request_source};
use grflow_pipeline::dataflow::{Controller, ServingParts, serving};
use grflow_pipeline::events::{Ingest, NodeControl, NodeEvent, ScheduledCommand, Target};
use grflow_pipeline::params::node_params;
use grflow_pipeline::side::SideTables;
use grflow_pipeline::{Clock, Config, Release, Speed};
use grflow_traces::{GenConfig, Regime, Trace};

const WORKERS: usize = 2;

/// (ts_ms, node, alpha in thousandths) of every served request.
type Served = Vec<(u64, u32, u32)>;

fn trace() -> Arc<Trace> {
    Arc::new(grflow_traces::generate(&GenConfig {
        regime: Regime::Steady,
        users: 200,
        requests: 600,
        // Load high enough that the router's overload fallback spreads
        // requests over both nodes.
        rps: 400.0,
        seed: 29,
        candidates: 64,
        ..GenConfig::default()
    }))
}

/// A controller that answers the first served request at `at_ms` with a
/// `SetAlpha(alpha)` for every node (one per request at that time).
fn set_alpha_after(at_ms: u64, alpha: f64) -> Controller {
    Box::new(move |events, _windows| {
        events.flat_map(move |e| match e {
            NodeEvent::Telemetry(t) if t.ts_ms == at_ms => Some(NodeControl {
                target: Target::All,
                seq: 0,
                command: NodeCommand::SetAlpha(alpha),
            }),
            _ => None,
        })
    })
}

/// Serves `trace` on two nodes with `commands` (and, with `fed_back`,
/// `set_alpha_after(at_ms, alpha)`) and records α per request.
fn run(trace: &Arc<Trace>, commands: &[ScheduledCommand], fed_back: Option<(u64, f64)>) -> Served {
    let cfg = Config::embedded();
    let meta = trace.meta.clone().unwrap();
    let side = Arc::new(
        SideTables::new(
            meta,
            trace.users.clone(),
            trace.items.clone(),
            cfg.node.shard_rows,
        )
        .unwrap(),
    );
    let params = node_params(&cfg, &side.meta, &side.catalog()).unwrap();
    let requests = Arc::new(trace.requests.clone());
    let served: Arc<Mutex<Served>> = Arc::default();
    let (log, commands) = (served.clone(), commands.to_vec());
    let pacing = Pacing {
        speed: Speed::Max,
        origin_ts_ms: 0,
        start: Instant::now(),
    };
    timely::execute(timely::Config::process(WORKERS), move |worker| {
        let (index, peers) = (worker.index(), worker.peers());
        let source = MemoryRequestSource::new(requests.clone(), index, peers);
        let router = Router::new(
            cfg.router.clone(),
            peers,
            HotUsers::new(cfg.hotness.clone()),
        )
        .unwrap();
        let node = ServingNode::new(index as u32, params.clone()).unwrap();
        let probe = ProbeHandle::new();
        let log = log.clone();
        worker.dataflow::<u64, _, _>(|scope| {
            let ingest = request_source(
                scope,
                Box::new(source),
                pacing,
                None,
                Default::default(),
                None,
            );
            let requests = ingest.flat_map(|i| match i {
                Ingest::Request(a) => Some(*a),
                _ => None,
            });
            let parts = ServingParts {
                oracle: None,
                router,
                node,
                side: side.clone(),
                slo_ms: cfg.run.slo_ms,
                clock: Clock::Event,
                deadline: None,
                max_age: None,
                window_ms: cfg.windows.epoch_ms,
                release: Release::Complete,
                batch: cfg.batch_policy(),
                token_capacity: cfg.node.token_capacity,
                commands: commands.clone(),
                command_pacing: pacing,
                controller: fed_back.map(|(at, alpha)| set_alpha_after(at, alpha)),
                live: None,
                models: None,
            };
            let (streams, _handles) = serving(scope, requests, parts);
            streams
                .events
                .inspect(move |e| {
                    if let NodeEvent::Telemetry(t) = e {
                        let alpha = t.sample.alpha_milli;
                        log.lock().unwrap().push((t.ts_ms, t.node, alpha));
                    }
                })
                .probe_with(&probe);
        });
        while !probe.done() {
            worker.step();
        }
    })
    .unwrap()
    .join()
    .into_iter()
    .for_each(|r| r.unwrap());
    let mut served = Arc::try_unwrap(served).unwrap().into_inner().unwrap();
    served.sort();
    served
}

/// α in thousandths a fresh node has after `alpha` is set (α snaps to pages).
fn alpha_milli_after(alpha: f64, trace: &Trace) -> u32 {
    let cfg = Config::embedded();
    let params = node_params(&cfg, trace.meta.as_ref().unwrap(), &trace.items).unwrap();
    let mut node = ServingNode::new(0, params).unwrap();
    node.apply(&NodeCommand::SetAlpha(alpha), 0).unwrap();
    (node.alpha() * 1000.0).round() as u32
}

#[test]
fn set_alpha_stamped_t_applies_to_exactly_the_requests_at_or_after_t() {
    let trace = trace();
    let times: Vec<u64> = trace.requests.iter().map(|r| r.ts_ms).collect();
    // Two stamps inside the trace, each shared by a request (the edge case:
    // a request at exactly t must see the command).
    let t1 = times[times.len() / 3];
    let t2 = times[2 * times.len() / 3];
    assert!(t1 < t2);
    let commands = vec![
        ScheduledCommand {
            at_ms: t1,
            target: Target::All,
            command: NodeCommand::SetAlpha(0.10),
        },
        ScheduledCommand {
            at_ms: t2,
            target: Target::Node(1),
            command: NodeCommand::SetAlpha(0.40),
        },
    ];
    let start = alpha_milli_after(Config::embedded().memory.alpha, &trace);
    let (a1, a2) = (
        alpha_milli_after(0.10, &trace),
        alpha_milli_after(0.40, &trace),
    );
    assert!(start != a1 && a1 != a2 && start != a2, "{start} {a1} {a2}");

    let first = run(&trace, &commands, None);
    assert_eq!(first.len(), trace.requests.len(), "every request served");
    for &(ts, node, alpha) in &first {
        let expected = match (ts, node) {
            (ts, _) if ts < t1 => start,
            (ts, 1) if ts >= t2 => a2,
            _ => a1,
        };
        assert_eq!(alpha, expected, "request at {ts} on node {node}");
    }
    // Both nodes served requests in each phase, so each boundary was tested.
    let phase = |ts: u64| (ts >= t1) as usize + (ts >= t2) as usize;
    let mut counts = [[0; 3]; WORKERS];
    for &(ts, n, _) in &first {
        counts[n as usize][phase(ts)] += 1;
    }
    eprintln!("requests per node and phase: {counts:?}");
    for node in 0..WORKERS as u32 {
        assert!(first.iter().any(|&(ts, n, _)| n == node && ts < t1));
        assert!(
            first
                .iter()
                .any(|&(ts, n, _)| n == node && (t1..t2).contains(&ts))
        );
        assert!(first.iter().any(|&(ts, n, _)| n == node && ts >= t2));
    }
    assert!(first.iter().any(|&(ts, _, _)| ts == t1));
    assert!(first.iter().any(|&(ts, _, _)| ts == t2));
    // And the same on every run.
    assert_eq!(run(&trace, &commands, None), first);
}

#[test]
fn a_command_made_from_events_at_t_applies_from_t_plus_1() {
    let trace = trace();
    let times: Vec<u64> = trace.requests.iter().map(|r| r.ts_ms).collect();
    let t = times[times.len() / 2];
    let start = alpha_milli_after(Config::embedded().memory.alpha, &trace);
    let after = alpha_milli_after(0.10, &trace);
    assert_ne!(start, after);
    let served = run(&trace, &[], Some((t, 0.10)));
    assert_eq!(served.len(), trace.requests.len());
    for &(ts, node, alpha) in &served {
        let expected = if ts <= t { start } else { after };
        assert_eq!(alpha, expected, "request at {ts} on node {node}");
    }
    assert!(
        served.iter().any(|&(ts, _, _)| ts == t),
        "a request at t itself"
    );
    assert!(served.iter().any(|&(ts, _, _)| ts > t), "requests after t");
    assert_eq!(run(&trace, &[], Some((t, 0.10))), served);
}
