//! The memory's user-prefix KV statistics (reused and total tokens, behind
//! `kv_hit_rate`) count each served request once, however many times its
//! prefix was matched: a request that waits for a later sub-batch, for
//! pages taken back from EMB or for a retrieve group's pages is matched
//! again, and counted as often before.

mod common;

use common::{Catalog, history, node_params as params, salted_history, sparse_sids};
use grflow_operators::node::{RankRequest, RankWork, RetrieveRequest, RetrieveWork, ServingNode};
use grflow_operators::retrieval::RetrievalIndex;

/// The memory counted what the node served: each response's history and
/// reuse once.
fn assert_counted_once(node: &ServingNode, what: &str) {
    let (s, c) = (node.memory_stats(), node.counters());
    assert!(c.kv_reused_tokens > 0, "{what}: some reuse to count");
    assert_eq!(
        (s.kv_reused_tokens, s.kv_total_tokens),
        (c.kv_reused_tokens, c.kv_total_tokens),
        "{what}"
    );
}

/// A pool too small for the whole batch: requests that do not fit beside
/// the first sub-batch are matched again in the next one.
#[test]
fn a_request_served_in_a_later_sub_batch_counts_once() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (100..120).collect();
    let histories: Vec<Vec<u32>> = (0..8).map(|u| salted_history(60, u % 3)).collect();
    let mut node = ServingNode::new(0, params(200 << 10)).unwrap();
    let work: Vec<RankWork<'_>> = histories
        .iter()
        .enumerate()
        .map(|(u, h)| RankWork {
            req: RankRequest {
                req_id: u as u64,
                user_id: u as u64,
                candidates: &candidates,
            },
            history: h,
            cut_before: false,
        })
        .collect();
    // Warm: the second batch reuses what the first cached.
    for _ in 0..2 {
        for out in node.serve_rank_batch(0, &work, &catalog) {
            out.unwrap();
        }
    }
    assert!(
        node.counters().model_calls > 2,
        "the batch was split: {} calls",
        node.counters().model_calls
    );
    assert_counted_once(&node, "sub-batches");
}

/// A request that does not fit the KV share alone takes pages back from
/// EMB and is matched again; a retrieve request likewise. Each is then
/// served again on its cached prefix.
#[test]
fn a_request_matched_again_after_a_reclaim_counts_once() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (100..130).collect();
    let index = RetrievalIndex::new(sparse_sids(), 16).unwrap();
    let h = history(60);
    let mut node = ServingNode::new(0, params(4 << 20)).unwrap();
    node.set_alpha(1.0).unwrap();
    for t in 0..2 {
        let req = RankRequest {
            req_id: t,
            user_id: 7,
            candidates: &candidates,
        };
        node.serve(t, req, &h, &catalog).unwrap();
    }
    assert_eq!(node.counters().kv_reclaims, 1);
    node.set_alpha(1.0).unwrap();
    for t in 2..4 {
        let req = RetrieveRequest {
            req_id: t,
            user_id: 7,
        };
        node.serve_retrieve(t, req, &h, &catalog, &index).unwrap();
    }
    assert_eq!(node.counters().kv_reclaims, 2);
    assert_counted_once(&node, "reclaims");
}

/// With two lanes a rank request that fits alone but not beside the step's
/// retrieve group waits for the group and is matched again after it.
#[test]
fn a_rank_request_that_waited_for_a_retrieve_group_counts_once() {
    let catalog = Catalog::new(500);
    let index = RetrievalIndex::new(sparse_sids(), 16).unwrap();
    let candidates: Vec<u32> = (100..130).collect();
    let h = history(60);
    let work = [RankWork {
        req: RankRequest {
            req_id: 1,
            user_id: 1,
            candidates: &candidates,
        },
        history: &h,
        cut_before: false,
    }];
    let retrieve = [RetrieveWork {
        req: RetrieveRequest {
            req_id: 2,
            user_id: 2,
        },
        history: &h,
        cut_before: false,
    }];
    // The α scan of `node_serving`: somewhere in it the request waits.
    for alpha_milli in 950..=999 {
        let mut node = ServingNode::new(0, params(4 << 20)).unwrap();
        node.set_lanes(2);
        node.set_alpha(alpha_milli as f64 / 1000.0).unwrap();
        // The second step reuses what the first cached.
        for now in [5, 6] {
            let (ranked, retrieved) = node.serve_step(now, &work, &retrieve, &catalog, &index);
            assert!(ranked.iter().chain(&retrieved).all(|r| r.is_ok()));
        }
        assert_counted_once(&node, &format!("alpha {alpha_milli}/1000"));
    }
}
