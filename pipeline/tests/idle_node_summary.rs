//! A node that served nothing, and a run that answered nothing, report no
//! latency and no SLO satisfaction (JSON null, "-" for people), not a 0
//! that reads as a measurement.

use std::sync::Arc;

use grflow_pipeline::{Config, ReplayOptions, Summary, TraceInput, replay};
use grflow_traces::{GenConfig, Regime, Trace, generate};

/// Replays the first `requests` requests of a small trace on two nodes.
fn two_nodes(requests: usize) -> Summary {
    let mut trace: Trace = generate(&GenConfig {
        regime: Regime::Steady,
        users: 20,
        items: 200,
        requests: 8,
        rps: 100.0,
        seed: 11,
        ..GenConfig::default()
    });
    trace.requests.truncate(requests);
    let mut config = Config::embedded();
    config.run.workers = 2;
    config.run.speed = "max".into();
    replay(ReplayOptions::new(
        TraceInput::Memory(Arc::new(trace)),
        config,
    ))
    .unwrap()
    .summary
}

#[test]
fn a_node_that_got_no_request_has_null_p99_and_slo_satisfaction() {
    let s = two_nodes(1);
    assert_eq!((s.requests_in, s.responses_out), (1, 1), "{s:?}");
    let (idle, busy): (Vec<_>, Vec<_>) = s.nodes.iter().partition(|n| n.responses_out == 0);
    assert_eq!((idle.len(), busy.len()), (1, 1), "{:?}", s.nodes);
    let (idle, busy) = (idle[0], busy[0]);
    assert_eq!((&idle.latency_ms, idle.slo_satisfaction), (&None, None));
    assert!(
        busy.latency_ms.as_ref().is_some_and(|l| l.max > 0.0),
        "{busy:?}"
    );
    assert!(busy.slo_satisfaction.is_some(), "{busy:?}");
    assert!(
        s.latency_ms.is_some() && s.slo_satisfaction.is_some(),
        "{s:?}"
    );

    let json = serde_json::to_value(&s).unwrap();
    let at = s.nodes.iter().position(|n| n.node == idle.node).unwrap();
    let idle_json = &json["nodes"][at];
    assert!(idle_json["latency_ms"].is_null(), "{idle_json}");
    assert!(idle_json["slo_satisfaction"].is_null(), "{idle_json}");
    let back: Summary = serde_json::from_value(json).unwrap();
    assert_eq!(back, s);

    let text = s.human();
    let line = format!("node {}: 0 responses", idle.node);
    let idle_line = text.lines().find(|l| l.contains(&line)).expect(&text);
    assert!(idle_line.contains("p99 -  busy"), "{idle_line}");
}

#[test]
fn a_run_with_no_response_has_null_latency_and_slo_satisfaction() {
    let s = two_nodes(0);
    assert_eq!((s.requests_in, s.responses_out, s.errors), (0, 0, 0));
    assert_eq!((&s.latency_ms, s.slo_satisfaction), (&None, None));
    assert!(
        s.nodes
            .iter()
            .all(|n| n.latency_ms.is_none() && n.slo_satisfaction.is_none()),
        "{:?}",
        s.nodes
    );
    let json = serde_json::to_value(&s).unwrap();
    assert!(json["latency_ms"].is_null() && json["slo_satisfaction"].is_null());
    let back: Summary = serde_json::from_value(json).unwrap();
    assert_eq!(back, s);
    let text = s.human();
    let latency = text
        .lines()
        .find(|l| l.starts_with("latency ms"))
        .expect(&text);
    assert!(
        latency.contains("p99 -") && latency.ends_with("met by -"),
        "{latency}"
    );
}
