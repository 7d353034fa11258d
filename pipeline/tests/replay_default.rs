//! The embedded default job through the library: deterministic routing,
//! feedback that reaches the router, and hit rates in the documented band.

use std::sync::Arc;

use grflow_pipeline::replay::ResponseOutput;
use grflow_pipeline::{Config, ReleaseSetting, ReplayOptions, ReplayOutput, TraceInput, replay};
use grflow_traces::Trace;

fn default_trace(cfg: &Config) -> Arc<Trace> {
    Arc::new(grflow_traces::generate(&cfg.trace.gen_config().unwrap()))
}

fn run(cfg: &Config, trace: &Arc<Trace>) -> ReplayOutput {
    let mut cfg = cfg.clone();
    // Routing is decided in event time once each time is complete, so
    // pacing does not change decisions (the default, wall clock, would
    // release on arrival).
    cfg.run.speed = "max".into();
    cfg.run.release = ReleaseSetting::Complete;
    replay(ReplayOptions {
        trace: TraceInput::Memory(trace.clone()),
        config: cfg,
        show_progress: false,
        responses: ResponseOutput::Collect,
        counters: None,
        commands: Vec::new(),
        oracle_step: None,
        stop: None,
    })
    .unwrap()
}

#[test]
fn default_replay_is_deterministic_and_uses_every_router_path() {
    let cfg = Config::embedded();
    let trace = default_trace(&cfg);
    let a = run(&cfg, &trace);
    let s = &a.summary;
    assert_eq!(s.requests_in, trace.requests.len() as u64);
    assert_eq!(s.requests_in, s.responses_out + s.errors);
    assert!(s.requests_in >= 10_000);

    // Residency only reaches the router through the feedback edge: KV hits
    // at the router prove it arrives.
    assert!(s.router.kv_hits > 0, "{:?}", s.router);
    assert!(s.router.affinity_wins > 0, "{:?}", s.router);
    assert!(s.router.overload_fallbacks > 0, "{:?}", s.router);
    assert!(
        (0.1..=0.95).contains(&s.emb_hit_rate),
        "emb_hit_rate {}",
        s.emb_hit_rate
    );
    assert!(
        (0.1..=0.95).contains(&s.kv_hit_rate),
        "kv_hit_rate {}",
        s.kv_hit_rate
    );
    assert!(
        s.windows >= 12 * 2,
        "60 s of 5 s windows on 2 nodes: {}",
        s.windows
    );

    let b = run(&cfg, &trace);
    let route = |o: &ReplayOutput| {
        o.responses
            .iter()
            .map(|r| (r.req_id, r.node, r.items.clone()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        route(&a),
        route(&b),
        "same trace and seed give the same decisions and items"
    );
    assert_eq!(a.summary.router, b.summary.router);
}
