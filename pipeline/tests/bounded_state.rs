//! Per-user state of a long job stays within its configured bounds: many
//! more users than the router, the hot-user counters and the nodes may
//! remember pass through a replay, the least recently used are evicted and
//! counted, and every request is still answered.

use std::collections::HashSet;
use std::sync::Arc;

use grflow_pipeline::replay::ResponseOutput;
use grflow_pipeline::{Clock, Config, ReplayOptions, TraceInput, replay};
use grflow_traces::{GenConfig, Regime};

#[test]
fn per_user_state_stays_within_bounds_and_nothing_is_lost() {
    let gen_cfg = GenConfig {
        regime: Regime::Steady,
        users: 40_000,
        requests: 50_000,
        rps: 400.0,
        seed: 28,
        // Few candidates and short histories: this test is about per-user
        // state, not model cost. Histories stay at least one KV block long
        // so every user gets a node prefix head.
        candidates: 8,
        min_history: 16,
        max_history: 24,
        ..GenConfig::default()
    };
    let trace = Arc::new(grflow_traces::generate(&gen_cfg));
    let users: HashSet<u64> = trace.requests.iter().map(|r| r.user_id).collect();

    let mut cfg = Config::embedded();
    cfg.run.speed = "max".into();
    cfg.run.clock = Clock::Event;
    cfg.router.max_users = 5_000;
    cfg.hotness.max_users = 4_000;
    cfg.node.max_users = 3_000;
    let out = replay(ReplayOptions {
        trace: TraceInput::Memory(trace.clone()),
        config: cfg,
        show_progress: false,
        responses: ResponseOutput::Drop,
        counters: None,
    })
    .unwrap();
    let s = &out.summary;

    // Each router replica sees the users hashed to it: far more than 5,000.
    assert!(
        users.len() >= 2 * 2 * 5_000,
        "{} distinct users",
        users.len()
    );
    assert_eq!(s.requests_in, 50_000);
    assert_eq!(s.requests_in, s.responses_out + s.errors, "nothing is lost");
    assert_eq!(s.errors, 0, "{:?}", out.errors.first());
    assert!(out.responses.is_empty(), "responses are not kept");

    let r = &s.router;
    assert_eq!(r.affinity_users_peak, 5_000, "{r:?}");
    assert!(r.affinity_evictions > 0, "{r:?}");
    assert!(
        r.hotness_users_peak <= 4_000 && r.hotness_users_peak > 0,
        "{r:?}"
    );
    assert!(r.hotness_evictions > 0, "{r:?}");
    assert_eq!(r.decisions, 50_000);
    for n in &s.nodes {
        assert_eq!(n.user_heads_peak, 3_000, "node {}: {n:?}", n.node);
        assert!(n.user_head_evictions > 0, "node {}: {n:?}", n.node);
    }
    // The latency summary still covers every response.
    assert!(s.latency_ms.p99 > 0.0 && s.latency_ms.max >= s.latency_ms.p99);
    assert!((0.0..=1.0).contains(&s.slo_satisfaction));
}
