//! With `run.release = "complete"` a replay is a function of its trace and
//! config: the same (req_id, node, items) and router counters on every run,
//! for 1, 2 and 4 workers, although reports reach the routers through the
//! feedback edge and workers run at their own pace.

use std::sync::Arc;

use grflow_pipeline::replay::ResponseOutput;
use grflow_pipeline::{
    Clock, Config, ReleaseSetting, ReplayOptions, ReplayOutput, TraceInput, replay,
};
use grflow_traces::{GenConfig, Regime, Trace};

fn trace() -> Arc<Trace> {
    Arc::new(grflow_traces::generate(&GenConfig {
        regime: Regime::Burst,
        users: 400,
        requests: 2_000,
        rps: 200.0,
        seed: 2_029,
        candidates: 16,
        ..GenConfig::default()
    }))
}

fn run(trace: &Arc<Trace>, workers: usize) -> ReplayOutput {
    let mut cfg = Config::embedded();
    cfg.run.workers = workers;
    cfg.run.speed = "max".into();
    // Wall latency would differ; decisions must not.
    cfg.run.clock = Clock::Wall;
    cfg.run.release = ReleaseSetting::Complete;
    let mut opts = ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg);
    opts.responses = ResponseOutput::Collect;
    replay(opts).unwrap()
}

fn decisions(o: &ReplayOutput) -> Vec<(u64, u32, Vec<u32>)> {
    o.responses
        .iter()
        .map(|r| (r.req_id, r.node, r.items.clone()))
        .collect()
}

#[test]
fn complete_release_gives_the_same_answers_and_router_counters_for_1_2_and_4_workers() {
    let trace = trace();
    for workers in [1, 2, 4] {
        let a = run(&trace, workers);
        assert_eq!(a.summary.release, "complete");
        assert_eq!(a.summary.responses_out, trace.requests.len() as u64);
        if workers > 1 {
            // Reports changed decisions: the feedback edge is exercised.
            assert!(a.summary.router.kv_hits > 0, "{:?}", a.summary.router);
        }
        let b = run(&trace, workers);
        assert_eq!(decisions(&a), decisions(&b), "{workers} workers");
        assert_eq!(a.summary.router, b.summary.router, "{workers} workers");
    }
}
