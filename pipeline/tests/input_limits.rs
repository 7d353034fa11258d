//! Size limits before any work (issue 28, item 3): a Kafka request with
//! more than `model.max_candidates` candidates is rejected when it is
//! decoded, and would have changed the caches of a warm node had it been
//! served; a long inline history is cut to the nodes' limit at decode time
//! and is served. That `grflow serve` decodes with the configured limit
//! (dead letter, no answer) is tests/kafka_serve.rs's dead-letter test.

use grflow_connectors::kafka::{DecodeLimits, History, decode_request_within};
use grflow_operators::cache::MemoryStats;
use grflow_operators::node::{RankRequest, ServingNode};
use grflow_pipeline::Config;
use grflow_pipeline::params::node_params;
use grflow_pipeline::side::SideTables;
use grflow_traces::{GenConfig, Mode, Regime, Trace, generate};

fn setup() -> (Config, Trace, SideTables) {
    let cfg = Config::embedded();
    let trace = generate(&GenConfig {
        regime: Regime::Steady,
        users: 40,
        items: 1_500,
        requests: 60,
        rps: 100.0,
        seed: 21,
        ..GenConfig::default()
    });
    let side = SideTables::new(
        trace.meta.clone().unwrap(),
        trace.users.clone(),
        trace.items.clone(),
        cfg.node.shard_rows,
    )
    .unwrap();
    (cfg, trace, side)
}

/// A node that served the trace's rank requests: every cache holds entries.
fn warm_node(cfg: &Config, trace: &Trace, side: &SideTables) -> ServingNode {
    let mut node =
        ServingNode::new(0, node_params(cfg, &side.meta, &side.catalog()).unwrap()).unwrap();
    for r in trace.requests.iter().filter(|r| r.mode == Mode::Rank) {
        let history = side.history(r.user_id, r.hist_len).unwrap();
        let req = RankRequest {
            req_id: r.req_id,
            user_id: r.user_id,
            candidates: &r.candidates,
        };
        node.serve(r.ts_ms, req, history, side).unwrap();
    }
    node
}

/// Everything observable about the caches: counters, page use, and which
/// EMB rows and user prefixes are resident.
#[derive(Debug, PartialEq)]
struct Snapshot {
    stats: MemoryStats,
    emb_rows: Vec<(u16, u32)>,
    kv_prefixes: Vec<usize>,
}

fn snapshot(node: &ServingNode, trace: &Trace, side: &SideTables) -> Snapshot {
    let memory = node.memory();
    let mut emb_rows = Vec::new();
    for (t, &rows) in side.meta.table_rows.iter().enumerate() {
        // Rows 0..rows, then the table's OOV row.
        for row in 0..=rows {
            if memory.emb_contains(t as u16, row) {
                emb_rows.push((t as u16, row));
            }
        }
    }
    let kv_prefixes = trace
        .users
        .iter()
        .map(|u| memory.kv_cached_prefix_len(&u.items))
        .collect();
    Snapshot {
        stats: node.memory_stats(),
        emb_rows,
        kv_prefixes,
    }
}

fn message(candidates: &[u32], history: &[u32]) -> Vec<u8> {
    serde_json::json!({
        "req_id": 9_999,
        "user_id": 3,
        "ts_ms": 5_000,
        "candidates": candidates,
        "history": history,
    })
    .to_string()
    .into_bytes()
}

#[test]
fn an_over_limit_request_is_refused_at_decode_before_it_can_touch_a_cache() {
    let (cfg, trace, side) = setup();
    let mut node = warm_node(&cfg, &trace, &side);
    let limits = DecodeLimits {
        max_message_bytes: cfg.kafka.max_message_bytes,
        max_candidates: cfg.model.max_candidates,
        history: node.history_limits().into(),
    };
    assert_eq!(limits.max_candidates, 1_000, "the documented default");
    let before = snapshot(&node, &trace, &side);
    assert!(before.stats.emb_rows > 0 && before.stats.user_kv_pages > 0);
    assert!(before.kv_prefixes.iter().any(|&n| n > 0));

    // 1,001 candidates and a 5,000-item history: rejected by name at decode.
    let candidates: Vec<u32> = (0..1_001).collect();
    let history: Vec<u32> = (0..5_000).map(|i| (i * 13) % 1_500).collect();
    let err = decode_request_within(&message(&candidates, &history), &limits).unwrap_err();
    assert_eq!(err.kind(), "too_many_candidates");
    assert!(err.to_string().contains("`candidates`"), "{err}");

    // What the decode-time limit spares the caches: the same request,
    // served without it, touches them.
    let mut twin = warm_node(&cfg, &trace, &side);
    assert_eq!(
        snapshot(&twin, &trace, &side),
        before,
        "deterministic warm-up"
    );
    let req = RankRequest {
        req_id: 9_999,
        user_id: 3,
        candidates: &candidates,
    };
    let _ = twin.serve(5_000, req, &history, &side);
    assert_ne!(snapshot(&twin, &trace, &side), before);

    // Within the candidate limit, the long inline history is cut at decode
    // time to its most recent items that fit, and is served.
    let wire = decode_request_within(&message(&candidates[..10], &history), &limits).unwrap();
    let History::Inline(kept) = &wire.history else {
        panic!("inline history")
    };
    let limit = node.history_limits().rank;
    assert!(kept.len() <= limit && wire.history_dropped > 0);
    assert_eq!(kept.len() + wire.history_dropped, history.len());
    assert_eq!(
        kept.as_slice(),
        &history[wire.history_dropped..],
        "the most recent items"
    );
    let req = RankRequest {
        req_id: wire.req_id,
        user_id: wire.user_id,
        candidates: &wire.candidates,
    };
    let served = node.serve(wire.ts_ms, req, kept, &side).unwrap();
    assert_eq!(served.kv_total_tokens as usize, kept.len());
    assert_eq!(
        node.counters().truncated_histories,
        0,
        "already cut at decode time: the node does not cut again"
    );
}
