//! A serving node with histories longer than the model's positions: served
//! with the most recent items that fit, counted, and a growing history keeps
//! reusing its prefix KV between the rare moves of its first kept item.

mod common;

use common::{Catalog, ITEMS, history, node_params};
use grflow_operators::history::Task;
use grflow_operators::node::{NodeParams, RankRequest, RankWork, RetrieveRequest, ServingNode};
use grflow_operators::retrieval::RetrievalIndex;

/// The shared node with narrower beams and a KV-heavy split.
fn params(pool_bytes: u64) -> NodeParams {
    let mut p = node_params(pool_bytes);
    p.beam_width = 4;
    p.beam_top_k = 4;
    p.memory.alpha = 0.25;
    p
}

#[test]
fn histories_past_max_positions_are_served_with_their_most_recent_items() {
    let catalog = Catalog::new(ITEMS);
    let mut node = ServingNode::new(0, params(8 << 20)).unwrap();
    let limits = node.history_limits();
    assert_eq!((limits.rank, limits.chunk), (1022, 240));
    let candidates: Vec<u32> = (100..104).collect();
    let full = history(1_500);
    let req = RankRequest {
        req_id: 1,
        user_id: 7,
        candidates: &candidates,
    };
    let served = node.serve(0, req, &full, &catalog).unwrap();
    let kept = limits.keep(&full, Task::Rank);
    assert_eq!(served.kv_total_tokens as usize, kept.len());
    // Exactly what a node given only the kept items answers.
    let mut fresh = ServingNode::new(1, params(8 << 20)).unwrap();
    let expected = fresh.serve(0, req, kept, &catalog).unwrap();
    assert_eq!(
        (served.items, served.scores),
        (expected.items, expected.scores)
    );
    assert_eq!(node.counters().truncated_histories, 1);
    assert_eq!(fresh.counters().truncated_histories, 0);

    // Retrieval has its own position budget (SID_STEPS after the prompt).
    let index = RetrievalIndex::new(
        (0..ITEMS).map(|i| (i, [(i % 16) as u16, (i / 16 % 16) as u16, (i / 256) as u16])),
        16,
    )
    .unwrap();
    let retrieve = RetrieveRequest {
        req_id: 2,
        user_id: 8,
    };
    let got = node
        .serve_retrieve(1, retrieve, &full, &catalog, &index)
        .unwrap();
    assert_eq!(
        got.kv_total_tokens as usize,
        limits.keep(&full, Task::Retrieve).len()
    );
    assert_eq!(node.counters().truncated_histories, 2);
}

/// A history the Kafka decoder already cut counts once when served, whether
/// the node cuts it again (a node still on a shorter model) or not.
#[test]
fn a_history_cut_before_the_node_counts_once() {
    let catalog = Catalog::new(ITEMS);
    let mut node = ServingNode::new(0, params(8 << 20)).unwrap();
    let candidates: Vec<u32> = (100..104).collect();
    let req = |req_id| RankRequest {
        req_id,
        user_id: req_id,
        candidates: &candidates,
    };
    let (short, long) = (history(30), history(1_500));
    let work = [
        // Cut at decode only.
        RankWork {
            req: req(1),
            history: &short,
            cut_before: true,
        },
        // Cut at decode and again by the node.
        RankWork {
            req: req(2),
            history: &long,
            cut_before: true,
        },
        // Cut by neither.
        RankWork {
            req: req(3),
            history: &short,
            cut_before: false,
        },
    ];
    for out in node.serve_rank_batch(0, &work, &catalog) {
        out.unwrap();
    }
    assert_eq!(node.counters().truncated_histories, 2);
}

#[test]
fn a_growing_long_history_keeps_reusing_its_prefix() {
    let catalog = Catalog::new(ITEMS);
    let mut node = ServingNode::new(0, params(8 << 20)).unwrap();
    let limits = node.history_limits();
    let candidates: Vec<u32> = (100..104).collect();
    let full = history(1_600);
    let (mut reused, mut total, mut cold) = (0u64, 0u64, 0);
    // One request per new item, from past the limit on: as a heavy user.
    for len in 1_000..1_600 {
        let req = RankRequest {
            req_id: len as u64,
            user_id: 7,
            candidates: &candidates,
        };
        let s = node.serve(len as u64, req, &full[..len], &catalog).unwrap();
        assert!(s.kv_total_tokens as usize <= limits.rank);
        reused += s.kv_reused_tokens as u64;
        total += s.kv_total_tokens as u64;
        cold += (s.kv_reused_tokens == 0) as u32;
    }
    // Cold once at the start, then once per move of the first kept item
    // (at 1,023, 1,263 and 1,503 items); a sliding window would move it on
    // every request.
    assert_eq!(cold, 4);
    assert!(reused as f64 / total as f64 > 0.9, "{reused} / {total}");
}

/// α is a speed knob: nodes built at any α serve a long history with the
/// same items, because the limit comes from the whole pool. A history the
/// KV share cannot hold takes pages back from EMB instead of being cut.
#[test]
fn alpha_never_changes_which_items_a_request_is_served_with() {
    let catalog = Catalog::new(ITEMS);
    let candidates: Vec<u32> = (100..104).collect();
    let node_at = |alpha: f64| {
        let mut p = params(1 << 20);
        p.memory.alpha = alpha;
        ServingNode::new(0, p).unwrap()
    };
    let (mut kv_heavy, mut emb_heavy) = (node_at(0.1), node_at(0.9));
    let limits = kv_heavy.history_limits();
    assert_eq!(emb_heavy.history_limits(), limits);
    let stats = emb_heavy.memory_stats();
    let kv_share_tokens = (stats.pages - stats.emb_pages) * params(1 << 20).model.block_size;
    // Longer than α 0.9's KV share holds, within the limit.
    let len = (kv_share_tokens + 64).min(limits.rank);
    assert!(
        len > kv_share_tokens,
        "limit {limits:?}, KV share {kv_share_tokens} tokens"
    );
    let full = history(len);
    let req = RankRequest {
        req_id: 1,
        user_id: 7,
        candidates: &candidates,
    };
    let a = kv_heavy.serve(0, req, &full, &catalog).unwrap();
    let b = emb_heavy.serve(0, req, &full, &catalog).unwrap();
    assert_eq!(a.kv_total_tokens as usize, len);
    assert_eq!((a.items, a.scores), (b.items, b.scores));
    assert_eq!(kv_heavy.counters().truncated_histories, 0);
    assert_eq!(emb_heavy.counters().truncated_histories, 0);
    assert!(
        emb_heavy.counters().kv_reclaims > 0,
        "{:?}",
        emb_heavy.counters()
    );
}
