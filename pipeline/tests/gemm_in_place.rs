//! A node reports what its GEMMs ran (`gemm_gflop`, `gemm_s`), its lanes'
//! products included, so that the GEMM rate it gets in place can be set
//! beside the peak of ideal shapes; and a virtual-clock run, which charges
//! a cost model instead of computing, reports none.

use std::sync::Arc;

use grflow_pipeline::summary::NodeSummary;
use grflow_pipeline::{Clock, Config, ReleaseSetting, ReplayOptions, TraceInput, replay};
use grflow_traces::{GenConfig, Regime, Trace};

fn trace() -> Arc<Trace> {
    Arc::new(grflow_traces::generate(&GenConfig {
        regime: Regime::Steady,
        users: 80,
        requests: 300,
        rps: 200.0,
        seed: 31,
        candidates: 16,
        retrieve_share: 0.2,
        ..GenConfig::default()
    }))
}

fn node(trace: &Arc<Trace>, lanes: usize, clock: Clock) -> NodeSummary {
    let mut cfg = Config::embedded();
    cfg.run.workers = 1;
    cfg.run.speed = "max".into();
    cfg.run.clock = clock;
    cfg.run.release = ReleaseSetting::Arrival;
    cfg.node.lanes = lanes;
    let out = replay(ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg)).unwrap();
    out.summary.nodes[0].clone()
}

#[test]
fn gemm_work_is_counted_on_the_node_with_its_lanes_and_not_in_virtual_time() {
    let trace = trace();
    let one = node(&trace, 1, Clock::Wall);
    let two = node(&trace, 2, Clock::Wall);
    for (lanes, n) in [(1, &one), (2, &two)] {
        assert!(n.model_gflop > 0.0, "{lanes} lanes: {n:?}");
        // The products run at least the model's dense FLOPs (attention's
        // own products come on top), and not wildly more.
        assert!(
            n.gemm_gflop >= 0.9 * n.model_gflop && n.gemm_gflop <= 3.0 * n.model_gflop,
            "{lanes} lanes: gemm {} against model {}",
            n.gemm_gflop,
            n.model_gflop
        );
        assert!(n.gemm_s > 0.0 && n.gemm_calls > 0, "{lanes} lanes: {n:?}");
    }
    // Split over two lanes the same requests run about the same products:
    // the second lane's share is not lost.
    let ratio = two.gemm_gflop / one.gemm_gflop;
    assert!((0.8..1.25).contains(&ratio), "two lanes / one: {ratio}");

    let virt = node(&trace, 1, Clock::Virtual);
    assert_eq!(
        (virt.gemm_gflop, virt.gemm_s, virt.gemm_calls),
        (0.0, 0.0, 0),
        "{virt:?}"
    );
}
