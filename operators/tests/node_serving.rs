//! The serving node on its own: prefix reuse gives the same answer as a
//! cold node, retrieval only returns catalog items, residency is reported,
//! and the event-time latency model sees the backlog.

mod common;

use common::{Catalog, history, node_params, sparse_sids};
use grflow_operators::node::{
    MAX_RETRIEVE_GROUP, NodeCommand, NodeParams, RankRequest, RankWork, RetrieveRequest,
    RetrieveWork, ServeError, Served, ServingNode,
};
use grflow_operators::retrieval::RetrievalIndex;

/// Largest elementwise `|a - b|`, NaN when any difference is NaN
/// (`f32::max` would drop it and let NaN scores pass `<= TOL`). Panics
/// when the lengths differ.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared scores differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |m, d| {
            if m.is_nan() || d.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        })
}

#[test]
fn max_diff_fails_a_tolerance_on_nan() {
    assert_eq!(max_diff(&[1.0, 2.0, 3.0], &[1.5, 2.0, 1.0]), 2.0);
    for (a, b) in [
        ([f32::NAN, 1.0, 1.0], [1.0; 3]),
        ([1.0, 1.0, 5.0], [1.0, f32::NAN, 1.0]),
        ([1.0, 5.0, f32::NAN], [1.0; 3]),
    ] {
        let d = max_diff(&a, &b);
        let passes = d <= 1e-4;
        assert!(!passes, "{a:?} vs {b:?} passed with {d}");
    }
}

#[test]
#[should_panic(expected = "differ in length")]
fn max_diff_of_short_scores_panics() {
    max_diff(&[1.0], &[1.0, 2.0]);
}

/// The shared node with a 4 MiB pool.
fn params() -> NodeParams {
    node_params(4 << 20)
}

/// Serves each retrieve request alone, in order, at time 5 (the reference
/// the grouped paths are compared against).
fn retrieve_in_turn(
    node: &mut ServingNode,
    work: &[RetrieveWork<'_>],
    catalog: &Catalog,
    index: &RetrievalIndex,
) -> Vec<Served> {
    work.iter()
        .map(|r| {
            node.serve_retrieve(5, r.req, r.history, catalog, index)
                .unwrap()
        })
        .collect()
}

#[test]
fn a_reused_prefix_ranks_exactly_like_a_cold_node() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (100..140).collect();
    let full = history(53); // not a multiple of the 16-token block
    let mut warm = ServingNode::new(0, params()).unwrap();
    let rank = |user| RankRequest {
        req_id: 1,
        user_id: user,
        candidates: &candidates,
    };
    let first = warm.serve(0, rank(7), &full[..37], &catalog).unwrap();
    assert_eq!(first.kv_reused_tokens, 0);
    let second = warm.serve(5, rank(7), &full, &catalog).unwrap();
    assert_eq!(
        second.kv_reused_tokens, 32,
        "two full blocks of the earlier prefix are reused"
    );
    assert_eq!(second.kv_total_tokens, 53);

    let mut cold = ServingNode::new(1, params()).unwrap();
    let reference = cold.serve(5, rank(7), &full, &catalog).unwrap();
    assert_eq!(reference.kv_reused_tokens, 0);
    assert_eq!(second.items, reference.items);
    let diff = max_diff(&second.scores, &reference.scores);
    assert!(
        diff <= 1e-4,
        "{:?} vs {:?}",
        second.scores,
        reference.scores
    );
    assert_eq!(second.items.len(), 5);
    assert!(second.scores.windows(2).all(|w| w[0] >= w[1]));
}

#[test]
fn retrieval_returns_only_catalog_items_deterministically() {
    let catalog = Catalog::new(500);
    let sids = sparse_sids();
    let index = RetrievalIndex::new(sids.iter().copied(), 16).unwrap();
    let req = RetrieveRequest {
        req_id: 9,
        user_id: 4,
    };
    let run = || {
        let mut node = ServingNode::new(0, params()).unwrap();
        node.serve_retrieve(0, req, &history(40), &catalog, &index)
            .unwrap()
    };
    let a = run();
    assert_eq!(a.items.len(), 5);
    let valid: Vec<u32> = sids.iter().map(|s| s.0).collect();
    assert!(a.items.iter().all(|i| valid.contains(i)), "{:?}", a.items);
    assert!(a.scores.windows(2).all(|w| w[0] >= w[1]));
    assert!(a.scores.iter().all(|&s| s <= 0.0), "log-probabilities");
    assert_eq!(a, run());
}

#[test]
fn residency_is_reported_once_and_load_follows_the_backlog() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (0..100).collect();
    let mut node = ServingNode::new(0, params()).unwrap();
    let req = |user| RankRequest {
        req_id: user,
        user_id: user,
        candidates: &candidates,
    };
    let a = node.serve(10, req(1), &history(40), &catalog).unwrap();
    let b = node.serve(10, req(2), &history(20), &catalog).unwrap();
    // Same event time: the second request queues behind the first.
    assert!(b.modelled_latency_ms > a.modelled_latency_ms);

    let report = node.report(10);
    assert_eq!(report.kv_users_added, vec![1, 2]);
    assert!(!report.shards_added.is_empty());
    // User 2's history is a prefix of user 1's: its first full block is
    // shared through the radix cache.
    assert_eq!(b.kv_reused_tokens, 16);
    let expected_backlog = (141 + 121 - 16) as f64;
    assert!((report.inflight_tokens - expected_backlog).abs() < 1e-9);
    // Nothing changed: nothing to report; the backlog drains in event time.
    let later = node.report(15);
    assert!(later.kv_users_added.is_empty() && later.shards_added.is_empty());
    assert!((later.inflight_tokens - (expected_backlog - 5.0 * 20.0)).abs() < 1e-9);
}

#[test]
fn moving_the_boundary_reaches_the_router_through_the_next_report() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (0..200).collect();
    let mut node = ServingNode::new(0, params()).unwrap();
    let req = RankRequest {
        req_id: 1,
        user_id: 1,
        candidates: &candidates,
    };
    node.serve(0, req, &history(30), &catalog).unwrap();
    let before = node.report(0);
    assert!(!before.shards_added.is_empty());

    // Shrinking EMB to nothing evicts every row: every shard leaves.
    let moved = node.set_alpha(0.0).unwrap();
    assert!(moved.pages_to_emb < 0 && moved.emb_rows_evicted > 0);
    let shrunk = node.report(1);
    let mut removed = shrunk.shards_removed.clone();
    let mut added = before.shards_added.clone();
    removed.sort_unstable();
    added.sort_unstable();
    assert_eq!(removed, added);
    assert_eq!(node.alpha(), 0.0);

    // Growing it back queues a background refill of the evicted rows.
    let grown = node.set_alpha(0.5).unwrap();
    assert!(grown.pages_to_emb > 0);
    assert!(grown.refill_rows > 0);
    assert_eq!(node.memory_stats().refill_queued_bytes, grown.refill_bytes);
}

#[test]
fn user_heads_are_bounded_and_a_dropped_user_is_reported_gone() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (0..10).collect();
    let mut node = ServingNode::new(
        0,
        NodeParams {
            max_users: 3,
            ..params()
        },
    )
    .unwrap();
    let req = |user| RankRequest {
        req_id: user,
        user_id: user,
        candidates: &candidates,
    };
    // All users share one history, so every prefix stays resident: only
    // the head table's bound can make the node forget a user.
    for user in 1..=3 {
        node.serve(user, req(user), &history(20), &catalog).unwrap();
    }
    assert_eq!(node.report(3).kv_users_added, vec![1, 2, 3]);
    // User 1 is served again, so user 2 is the least recently served.
    node.serve(4, req(1), &history(20), &catalog).unwrap();
    node.serve(5, req(4), &history(20), &catalog).unwrap();
    assert_eq!(node.user_heads(), 3);
    assert_eq!(node.user_heads_peak(), 3);
    assert_eq!(node.counters().user_head_evictions, 1);
    let report = node.report(5);
    assert_eq!(report.kv_users_added, vec![4]);
    assert_eq!(
        report.kv_users_removed,
        vec![2],
        "the router forgets user 2 here"
    );
    for user in 10..50 {
        node.serve(user, req(user), &history(20), &catalog).unwrap();
        assert!(node.user_heads() <= 3);
    }
    assert_eq!(node.counters().user_head_evictions, 41);
}

/// A batch of rank requests (mixed history lengths, a cached prefix, a
/// repeated user, one request that must fail) gives the same items and
/// scores as serving them one at a time on an identical node, and the one
/// failure fails alone. A pool too small for the whole batch splits it into
/// sub-batches with the same results.
#[test]
fn a_rank_batch_equals_serving_one_request_at_a_time() {
    let catalog = Catalog::new(500);
    let users: [(u64, usize); 6] = [(1, 53), (2, 7), (3, 40), (1, 60), (4, 0), (5, 33)];
    let histories: Vec<Vec<u32>> = users.iter().map(|&(_, len)| history(len)).collect();
    let candidates: Vec<Vec<u32>> = (0..users.len() as u32)
        .map(|i| (100 + i * 13..100 + i * 13 + 5 + i * 7).collect())
        .collect();
    let no_candidates: Vec<u32> = Vec::new();
    let request = |i: usize| RankRequest {
        req_id: i as u64,
        user_id: users[i].0,
        // Request 2 has no candidates: refused by itself.
        candidates: if i == 2 {
            &no_candidates
        } else {
            &candidates[i]
        },
    };
    // Lanes = 3: the batch is computed in three threads at once.
    for (pool_bytes, lanes) in [
        (4u64 << 20, 1),
        (200 << 10, 1),
        (4 << 20, 3),
        (200 << 10, 3),
    ] {
        let mut p = params();
        p.memory.pool_bytes = pool_bytes;
        let mut one = ServingNode::new(0, p.clone()).unwrap();
        let mut batched = ServingNode::new(0, p).unwrap();
        batched.set_lanes(lanes);
        // User 3's prefix is cached on both before the batch.
        for node in [&mut one, &mut batched] {
            node.serve(0, request(0), &histories[2], &catalog).unwrap();
        }
        let expected: Vec<_> = (0..users.len())
            .map(|i| one.serve(5, request(i), &histories[i], &catalog))
            .collect();
        let work: Vec<RankWork<'_>> = (0..users.len())
            .map(|i| RankWork {
                req: request(i),
                history: &histories[i],
                cut_before: false,
            })
            .collect();
        let got = batched.serve_rank_batch(5, &work, &catalog);
        assert_eq!(got.len(), expected.len());
        for (i, (g, e)) in got.iter().zip(&expected).enumerate() {
            match (g, e) {
                (Ok(g), Ok(e)) => {
                    assert_eq!(
                        g.items, e.items,
                        "request {i} (pool {pool_bytes}, lanes {lanes})"
                    );
                    let diff = max_diff(&g.scores, &e.scores);
                    assert!(diff <= 1e-4, "request {i}: scores differ by {diff}");
                    assert_eq!(g.seq_len, e.seq_len);
                    assert_eq!(g.kv_total_tokens, e.kv_total_tokens);
                }
                (Err(_), Err(_)) => assert_eq!(i, 2, "only request 2 fails"),
                _ => panic!("request {i}: batched {g:?} vs one at a time {e:?}"),
            }
        }
        assert_eq!(
            batched.counters().responses,
            one.counters().responses,
            "pool {pool_bytes}"
        );
        // Every page a request took was cached or given back.
        let (b, o) = (batched.memory_stats(), one.memory_stats());
        assert_eq!(b.scratch_pages, 0, "{b:?}");
        assert_eq!(
            b.free_pages + b.user_kv_pages,
            o.free_pages + o.user_kv_pages
        );
    }
}

#[test]
fn retrieve_requests_in_lanes_beside_a_rank_batch_equal_serving_them_in_turn() {
    let catalog = Catalog::new(500);
    let index = RetrievalIndex::new(sparse_sids(), 16).unwrap();
    let users: [(u64, usize); 4] = [(1, 53), (2, 7), (3, 40), (4, 33)];
    let histories: Vec<Vec<u32>> = users.iter().map(|&(_, len)| history(len)).collect();
    let candidates: Vec<u32> = (100..130).collect();
    let work: Vec<RankWork<'_>> = users
        .iter()
        .zip(&histories)
        .map(|(&(user, _), h)| RankWork {
            req: RankRequest {
                req_id: user,
                user_id: user,
                candidates: &candidates,
            },
            history: h,
            cut_before: false,
        })
        .collect();
    // Two retrieve requests; one user also has a rank request in the batch.
    let retrieve_histories = [history(45), history(20)];
    let retrieve: Vec<RetrieveWork<'_>> = [3, 8]
        .into_iter()
        .zip(&retrieve_histories)
        .map(|(user, h)| RetrieveWork {
            req: RetrieveRequest {
                req_id: 90 + user,
                user_id: user,
            },
            history: h,
            cut_before: false,
        })
        .collect();
    let mut in_turn = ServingNode::new(0, params()).unwrap();
    let mut laned = ServingNode::new(0, params()).unwrap();
    laned.set_lanes(2);
    for node in [&mut in_turn, &mut laned] {
        // A cached prefix for user 1 first.
        node.serve(0, work[0].req, &histories[0], &catalog).unwrap();
    }
    let want_retrieved = retrieve_in_turn(&mut in_turn, &retrieve, &catalog, &index);
    let want_ranked = in_turn.serve_rank_batch(5, &work, &catalog);
    let (ranked, retrieved) = laned.serve_step(5, &work, &retrieve, &catalog, &index);
    assert_eq!(retrieved.len(), 2);
    assert_eq!(want_retrieved.len(), 2);
    for (got, want) in retrieved.iter().zip(&want_retrieved) {
        let got = got.as_ref().unwrap();
        assert_eq!(got.items, want.items);
        assert!(max_diff(&got.scores, &want.scores) <= 1e-4);
    }
    assert_eq!(ranked.len(), want_ranked.len());
    for (i, (g, e)) in ranked.iter().zip(&want_ranked).enumerate() {
        let (g, e) = (g.as_ref().unwrap(), e.as_ref().unwrap());
        assert_eq!(g.items, e.items, "rank request {i}");
        assert!(max_diff(&g.scores, &e.scores) <= 1e-4, "rank request {i}");
        assert_eq!(g.kv_reused_tokens, e.kv_reused_tokens);
    }
    // Same bookkeeping: every request answered, every page cached or freed.
    assert_eq!(laned.counters().responses, in_turn.counters().responses);
    let (l, t) = (laned.memory_stats(), in_turn.memory_stats());
    assert_eq!(l.scratch_pages, 0, "{l:?}");
    assert_eq!(
        l.free_pages + l.user_kv_pages,
        t.free_pages + t.user_kv_pages
    );
    assert_eq!(l.user_kv_pages, t.user_kv_pages);
}

/// Retrieve requests of one step are computed together (one prefill, one
/// beam decode): the same answers as one at a time, in one model call, and
/// a group that would not fit in the pool is split instead of failing, with
/// one lane or two.
#[test]
fn retrieve_requests_served_together_equal_serving_them_in_turn() {
    let catalog = Catalog::new(500);
    let index = RetrievalIndex::new(sparse_sids(), 16).unwrap();
    let of = |user: u32, len: usize| -> Vec<u32> {
        (0..len as u32)
            .map(|i| (i * 37 + 5 + user * 101) % 500)
            .collect()
    };
    // Lengths inside one block and across blocks; user 1's history extends
    // a prefix cached by its earlier request.
    let shapes: [(u32, usize); 4] = [(1, 40), (2, 7), (3, 53), (4, 21)];
    let histories: Vec<Vec<u32>> = shapes.iter().map(|&(u, len)| of(u, len)).collect();
    let work: Vec<RetrieveWork<'_>> = shapes
        .iter()
        .zip(&histories)
        .map(|(&(user, _), h)| RetrieveWork {
            req: RetrieveRequest {
                req_id: 50 + user as u64,
                user_id: user as u64,
            },
            history: h,
            cut_before: false,
        })
        .collect();
    let run = |pool_bytes: u64| {
        let mut p = params();
        p.memory.pool_bytes = pool_bytes;
        let mut in_turn = ServingNode::new(0, p.clone()).unwrap();
        let mut together = ServingNode::new(0, p.clone()).unwrap();
        let first = of(1, 20);
        for node in [&mut in_turn, &mut together] {
            let req = work[0].req;
            node.serve_retrieve(0, req, &first, &catalog, &index)
                .unwrap();
        }
        let want = retrieve_in_turn(&mut in_turn, &work, &catalog, &index);
        let calls = together.counters().model_calls;
        let got = together.serve_retrieve_batch(5, &work, &catalog, &index);
        // Two lanes (no rank work: the group is split over the lanes).
        let mut laned = ServingNode::new(0, p.clone()).unwrap();
        laned.set_lanes(2);
        laned
            .serve_retrieve(0, work[0].req, &first, &catalog, &index)
            .unwrap();
        let (none, got_laned) = laned.serve_step(5, &[], &work, &catalog, &index);
        assert!(none.is_empty());
        assert_eq!((got.len(), got_laned.len()), (want.len(), want.len()));
        for (i, (g, w)) in got
            .iter()
            .chain(&got_laned)
            .zip(want.iter().cycle())
            .enumerate()
        {
            let g = g.as_ref().unwrap_or_else(|e| panic!("request {i}: {e}"));
            assert_eq!(g.items, w.items, "request {i}");
            assert!(!g.items.is_empty());
            let diff = max_diff(&g.scores, &w.scores);
            assert!(diff <= 1e-4, "request {i}: {diff}");
            assert_eq!(g.kv_reused_tokens, w.kv_reused_tokens, "request {i}");
        }
        let (t, o) = (together.memory_stats(), in_turn.memory_stats());
        assert_eq!(t.scratch_pages, 0, "{t:?}");
        assert_eq!(
            t.free_pages + t.user_kv_pages,
            o.free_pages + o.user_kv_pages
        );
        assert_eq!(together.counters().responses, in_turn.counters().responses);
        assert_eq!(laned.counters().responses, in_turn.counters().responses);
        let l = laned.memory_stats();
        assert_eq!(l.scratch_pages, 0, "{l:?}");
        assert_eq!(l.user_kv_pages, o.user_kv_pages);
        together.counters().model_calls - calls
    };
    assert_eq!(run(4 << 20), 1, "one model call for the four");
    // 9 KV blocks (α 0.5 of 288 KiB, 16 KiB blocks): 3 + 1 + 4 + 2 blocks
    // do not fit at once, so the group splits; each request still succeeds.
    assert!(run(288 << 10) >= 2);
}

/// A step's retrieve requests are decoded in groups of at most
/// `MAX_RETRIEVE_GROUP` (each group holds a beam searcher per request),
/// with one lane or two (every group split over the lanes), and answer as
/// they would one at a time.
#[test]
fn retrieve_groups_are_capped_and_every_request_is_answered() {
    let catalog = Catalog::new(500);
    let index = RetrievalIndex::new(sparse_sids(), 16).unwrap();
    let n = MAX_RETRIEVE_GROUP + 2;
    let histories: Vec<Vec<u32>> = (0..n as u32)
        .map(|u| (0..6).map(|i| (i * 31 + u * 7) % 500).collect())
        .collect();
    let work: Vec<RetrieveWork<'_>> = histories
        .iter()
        .enumerate()
        .map(|(u, h)| RetrieveWork {
            req: RetrieveRequest {
                req_id: u as u64,
                user_id: u as u64,
            },
            history: h,
            cut_before: false,
        })
        .collect();
    let mut in_turn = ServingNode::new(0, params()).unwrap();
    let want = retrieve_in_turn(&mut in_turn, &work, &catalog, &index);
    for lanes in [1, 2] {
        let mut node = ServingNode::new(0, params()).unwrap();
        node.set_lanes(lanes);
        let (_, got) = node.serve_step(5, &[], &work, &catalog, &index);
        assert_eq!(got.len(), want.len(), "lanes {lanes}");
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let g = g.as_ref().unwrap_or_else(|e| panic!("request {i}: {e}"));
            assert_eq!(g.items, w.items, "request {i}, lanes {lanes}");
        }
        // One lane: a group of the cap, then the two left. Two lanes: each
        // group split over the lanes, the two left as well (until
        // 2026-11-29 they ran as one group on one thread, so a step of many
        // retrieve requests used one lane past its first group).
        let calls = node.counters().model_calls;
        assert_eq!(calls, if lanes == 1 { 2 } else { 4 }, "lanes {lanes}");
        assert_eq!(node.counters().responses, n as u64);
    }
}

/// HLEM's EMB–KV coupling: tokens a cached KV prefix covers need no
/// embeddings, so a full prefix hit looks up only the candidates (rank) or
/// nothing of the history (retrieve), and pays no link for it.
#[test]
fn a_full_prefix_hit_makes_no_emb_lookups_for_the_covered_history() {
    let catalog = Catalog::new(500);
    let index = RetrievalIndex::new(sparse_sids(), 16).unwrap();
    let block = params().model.block_size;
    let h = history(4 * block);
    let candidates: Vec<u32> = (300..310).collect();
    let req = RankRequest {
        req_id: 1,
        user_id: 1,
        candidates: &candidates,
    };
    let mut node = ServingNode::new(0, params()).unwrap();
    let cold = node.serve(0, req, &h, &catalog).unwrap();
    assert_eq!(cold.kv_reused_tokens, 0);
    let per_item = cold.emb_lookups / (h.len() + candidates.len()) as u32;
    assert!(per_item >= 1);
    let warm = node.serve(1, req, &h, &catalog).unwrap();
    assert_eq!(warm.kv_reused_tokens as usize, h.len(), "a full prefix hit");
    assert_eq!(warm.emb_lookups, per_item * candidates.len() as u32);
    assert_eq!(warm.items, cold.items, "the same answer");
    // A retrieve request of the same user: no history lookups at all.
    let retrieve = RetrieveRequest {
        req_id: 2,
        user_id: 1,
    };
    let served = node
        .serve_retrieve(2, retrieve, &h, &catalog, &index)
        .unwrap();
    assert_eq!(served.kv_reused_tokens as usize, h.len());
    assert_eq!(served.emb_lookups, 0);
    // One more item: only it is looked up.
    let longer = history(4 * block + 1);
    let served = node
        .serve_retrieve(3, retrieve, &longer, &catalog, &index)
        .unwrap();
    assert_eq!(served.emb_lookups, per_item);
}

/// A cost model of round numbers: prefill 1 ms, ranking 2 ms, beam search
/// 5 ms, whatever the lengths, and the given host overhead.
fn virtual_cost(overhead_ms: f64, occupancy_ms: f64) -> grflow_kernels::cost::CostModel {
    grflow_kernels::cost::CostModel {
        prefill_ms: [1.0, 0.0, 0.0],
        rank_ms: [2.0, 0.0, 0.0],
        beam_ms: [5.0, 0.0],
        overhead_ms,
        occupancy_ms,
        ..grflow_kernels::cost::CostModel::given("small", 8, 8)
    }
}

/// The virtual clock: no model runs; each request is charged the cost
/// model's compute on the node's own timeline, queued behind earlier work.
#[test]
fn a_virtual_node_charges_the_cost_model_on_its_own_timeline() {
    let catalog = Catalog::new(500);
    let mut node = ServingNode::new(0, params()).unwrap();
    node.set_virtual(virtual_cost(0.0, 0.0));
    // No model runs: the pool keeps page ownership but no floats.
    assert!(node.memory().pool().is_metadata_only());
    let candidates: Vec<u32> = (100..120).collect();
    let req = |id| RankRequest {
        req_id: id,
        user_id: id,
        candidates: &candidates,
    };
    let h = history(40);
    let a = node.serve(10, req(1), &h, &catalog).unwrap();
    let b = node.serve(10, req(2), &h, &catalog).unwrap();
    // Compute 3 ms each (prefill 1 + rank 2), plus the link of the misses.
    assert!(
        a.modelled_latency_ms >= 3.0 && a.modelled_latency_ms < 3.5,
        "{a:?}"
    );
    assert!(
        b.modelled_latency_ms >= a.modelled_latency_ms + 2.999,
        "queued: {b:?}"
    );
    // Nothing was scored: the first top_k candidates, in order.
    assert_eq!(a.items, candidates[..5].to_vec());
    // Much later the node is idle again; a retrieve request costs the
    // prefill of its uncached tail (the cached prefix is whole blocks:
    // 1 ms) + beam search 5 ms.
    let index = RetrievalIndex::new(sparse_sids(), 16).unwrap();
    let retrieve = RetrieveRequest {
        req_id: 3,
        user_id: 1,
    };
    let r = node
        .serve_retrieve(1_000, retrieve, &h, &catalog, &index)
        .unwrap();
    assert!(r.items.is_empty());
    assert!((6.0..6.5).contains(&r.modelled_latency_ms), "{r:?}");
    assert_eq!(node.counters().responses, 3);
    assert_eq!(node.memory_stats().scratch_pages, 0);
}

/// The router's l(n) on the virtual clock counts the tokens of the requests
/// not answered yet in modelled time, as `arrival` mode's in-flight signal
/// does on a real node; not the event-time backlog at
/// `service_tokens_per_ms` (a rate the cost model knows nothing of).
#[test]
fn a_virtual_node_reports_the_tokens_it_has_not_answered_as_its_load() {
    let catalog = Catalog::new(500);
    let mut node = ServingNode::new(0, params()).unwrap();
    node.set_virtual(virtual_cost(0.0, 0.0));
    let candidates: Vec<u32> = (100..120).collect();
    let h = history(40);
    let served: Vec<_> = (1..=2)
        .map(|id| {
            let req = RankRequest {
                req_id: id,
                user_id: id,
                candidates: &candidates,
            };
            node.serve(10, req, &h, &catalog).unwrap()
        })
        .collect();
    let (a, b) = (&served[0], &served[1]);
    // 3 ms of compute each, queued: answered at about 13 and 16 ms.
    let r = node.report(10);
    assert_eq!(r.inflight_tokens, f64::from(a.seq_len + b.seq_len), "{r:?}");
    assert_eq!(r.token_capacity, params().token_capacity);
    // Drained at the rate the cost model was charged, in the tokens the
    // load counts (whole requests, as a router counts its dispatches):
    // both requests' tokens over their 6 ms.
    let rate = f64::from(a.seq_len + b.seq_len) / 6.0;
    assert!((r.service_tokens_per_ms - rate).abs() < 1e-9, "{r:?}");
    assert!(10.0 + a.modelled_latency_ms < 14.0 && 10.0 + b.modelled_latency_ms > 15.0);
    assert_eq!(node.report(14).inflight_tokens, f64::from(b.seq_len));
    // Once both are answered, the node is idle.
    assert_eq!(node.report(1_000).inflight_tokens, 0.0);
}

/// A request that does not fit the KV share alone is not failed: the KV
/// share takes the pages back from EMB (α goes down) and the answer is the
/// one a node with room gives.
#[test]
fn a_request_that_does_not_fit_the_kv_share_takes_pages_back_from_emb() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (100..130).collect();
    let h = history(60);
    let req = |id| RankRequest {
        req_id: id,
        user_id: 7,
        candidates: &candidates,
    };
    let mut roomy = ServingNode::new(0, params()).unwrap();
    let want = roomy.serve(0, req(1), &h, &catalog).unwrap();

    let mut tight = ServingNode::new(0, params()).unwrap();
    tight.set_alpha(1.0).unwrap();
    assert_eq!(tight.alpha(), 1.0);
    let got = tight.serve(0, req(1), &h, &catalog).unwrap();
    assert_eq!(got.items, want.items);
    assert!(tight.alpha() < 1.0, "alpha {}", tight.alpha());
    assert_eq!(tight.counters().kv_reclaims, 1);
    assert!(tight.memory_stats().kv_reclaimed_pages > 0);
    // Retrieve requests too.
    let index = RetrievalIndex::new(sparse_sids(), 16).unwrap();
    tight.set_alpha(1.0).unwrap();
    let r = RetrieveRequest {
        req_id: 2,
        user_id: 8,
    };
    tight
        .serve_retrieve(1, r, &history(50), &catalog, &index)
        .unwrap();
    assert!(tight.alpha() < 1.0);
    assert_eq!(tight.counters().kv_reclaims, 2);
    assert_eq!(roomy.counters().kv_reclaims, 0);
    // An operator's pin does not fail a request either: serving wins, α
    // goes down, and the pin still refuses the allocator's moves.
    tight.apply(&NodeCommand::PinAlpha(Some(1.0)), 0).unwrap();
    assert_eq!(tight.alpha(), 1.0);
    let pinned = tight.serve(2, req(3), &history(60), &catalog).unwrap();
    assert_eq!(pinned.items, want.items);
    assert!(tight.alpha() < 1.0, "alpha {}", tight.alpha());
    assert_eq!(tight.counters().kv_reclaims, 3);
    assert!(matches!(
        tight.apply(&NodeCommand::SetAlpha(1.0), 0),
        Err(ServeError::AlphaPinned(_))
    ));
}

/// The busy part of the host overhead delays the requests queued behind;
/// the rest adds to each request's own latency alone.
#[test]
fn a_virtual_node_queues_behind_the_busy_part_of_the_overhead() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (100..120).collect();
    let h = history(40);
    let pair = |occupancy_ms: f64| {
        let mut node = ServingNode::new(0, params()).unwrap();
        node.set_virtual(virtual_cost(1.0, occupancy_ms));
        let mut served = (1..=2).map(|id| {
            let req = RankRequest {
                req_id: id,
                user_id: id,
                candidates: &candidates,
            };
            node.serve(10, req, &h, &catalog)
                .unwrap()
                .modelled_latency_ms
        });
        (served.next().unwrap(), served.next().unwrap())
    };
    let (a0, b0) = pair(0.0);
    let (a1, b1) = pair(0.6);
    // Alone, a request pays the whole overhead either way.
    assert!((a0 - a1).abs() < 1e-9, "{a0} vs {a1}");
    // The second waits for the first's compute, and for its busy 0.6 ms.
    assert!((b1 - b0 - 0.6).abs() < 1e-9, "{b0} vs {b1}");
    // Occupancy longer than the overhead (work after the response) delays
    // the next request, never the request itself: alone it still costs
    // its compute and the overhead.
    let (a2, b2) = pair(2.5);
    assert!((a2 - a0).abs() < 1e-9, "{a0} vs {a2}");
    assert!((b2 - b0 - 2.5).abs() < 1e-9, "{b0} vs {b2}");
}

#[test]
fn a_swapped_model_serves_like_a_fresh_node_of_it_and_reuses_nothing_from_before() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (100..140).collect();
    let full = history(53);
    let rank = RankRequest {
        req_id: 1,
        user_id: 7,
        candidates: &candidates,
    };
    let mut node = ServingNode::new(0, params()).unwrap();
    node.set_lanes(2);
    let old_version = node.model_version().to_string();
    node.serve(0, rank, &full, &catalog).unwrap();
    node.apply(&grflow_operators::node::NodeCommand::SetAlpha(0.25), 0)
        .unwrap();
    let alpha = node.alpha();

    let mut next = params();
    next.model_seed = 4;
    let applied = node.swap_model(next.clone()).unwrap();
    assert_eq!(
        applied,
        grflow_operators::node::Applied::Model {
            from: old_version.clone(),
            to: node.model_version().to_string()
        }
    );
    assert_ne!(node.model_version(), old_version);
    assert_eq!(node.alpha(), alpha, "α carries over");
    assert_eq!(node.counters().responses, 1, "counters carry over");

    let after = node.serve(5, rank, &full, &catalog).unwrap();
    assert_eq!(after.kv_reused_tokens, 0, "no KV from the old weights");
    let mut fresh = ServingNode::new(1, next).unwrap();
    let reference = fresh.serve(5, rank, &full, &catalog).unwrap();
    assert_eq!(
        after.emb_hits, reference.emb_hits,
        "EMB hits only within the request, as on a cold node"
    );
    assert_eq!(after.items, reference.items);
    assert_eq!(after.scores, reference.scores);
    assert_eq!(node.counters().responses, 2);
}

#[test]
fn after_a_model_swap_the_next_report_takes_back_what_the_old_memory_held() {
    let catalog = Catalog::new(500);
    let candidates: Vec<u32> = (0..100).collect();
    let mut node = ServingNode::new(0, params()).unwrap();
    let req = RankRequest {
        req_id: 1,
        user_id: 1,
        candidates: &candidates,
    };
    node.serve(10, req, &history(40), &catalog).unwrap();
    let before = node.report(10);
    assert_eq!(before.kv_users_added, vec![1]);
    assert!(!before.shards_added.is_empty());
    let mut next = params();
    next.model_seed = 4;
    node.swap_model(next).unwrap();
    // The routers were told user 1's KV and these shards are here: the
    // new memory is empty, so the report says so (it said nothing before).
    let after = node.report(11);
    assert_eq!(after.kv_users_removed, vec![1]);
    let mut removed = after.shards_removed.clone();
    let mut added = before.shards_added.clone();
    removed.sort();
    added.sort();
    assert_eq!(removed, added);
}

#[test]
fn a_model_swap_that_fails_leaves_the_old_model_serving() {
    let mut node = ServingNode::new(0, params()).unwrap();
    let version = node.model_version().to_string();
    let mut bad = params();
    bad.memory.pool_bytes = 0;
    assert!(node.swap_model(bad).is_err());
    assert_eq!(node.model_version(), version);
    let swap = grflow_operators::node::NodeCommand::SwapModel {
        path: "m".into(),
        version: "v".into(),
    };
    assert!(node.apply(&swap, 0).is_err(), "apply cannot load weights");
}

#[test]
fn a_bad_memory_policy_is_named_once_by_its_key() {
    let mut p = params();
    p.memory.emb_policy = "arc".into();
    let Err(err) = ServingNode::new(0, p) else {
        panic!("an unknown policy was accepted");
    };
    let msg = err.to_string();
    // It read "memory: memory.emb_policy: ..." before.
    assert!(
        msg.starts_with("memory.emb_policy: unknown eviction policy"),
        "{msg}"
    );
}

/// With two lanes the step's retrieve group reserves its pages before the
/// rank requests and holds them until it is committed. A rank request that
/// fits alone but not beside the group waits for the group instead of
/// taking pages back from EMB (moving α) or failing: the same answers,
/// reclaims and α as one lane, which serves the group first.
#[test]
fn a_rank_request_waits_for_the_retrieve_groups_pages_instead_of_moving_alpha() {
    let catalog = Catalog::new(500);
    let index = RetrievalIndex::new(sparse_sids(), 16).unwrap();
    let candidates: Vec<u32> = (100..130).collect();
    let (rank_history, retrieve_history) = (history(60), history(60));
    let work = [RankWork {
        req: RankRequest {
            req_id: 1,
            user_id: 1,
            candidates: &candidates,
        },
        history: &rank_history,
        cut_before: false,
    }];
    let retrieve = [RetrieveWork {
        req: RetrieveRequest {
            req_id: 2,
            user_id: 2,
        },
        history: &retrieve_history,
        cut_before: false,
    }];
    let mut tight_cases = 0;
    for alpha_milli in 950..=999 {
        let alpha = alpha_milli as f64 / 1000.0;
        let serve = |lanes| {
            let mut node = ServingNode::new(0, params()).unwrap();
            node.set_lanes(lanes);
            node.set_alpha(alpha).unwrap();
            let out = node.serve_step(5, &work, &retrieve, &catalog, &index);
            (node, out)
        };
        let (one, (ranked_one, retrieved_one)) = serve(1);
        let (two, (ranked_two, retrieved_two)) = serve(2);
        let ok = |o: &[Result<Served, ServeError>]| o.iter().all(|r| r.is_ok());
        assert!(ok(&ranked_two) && ok(&retrieved_two), "alpha {alpha}");
        assert_eq!(ok(&ranked_one), ok(&ranked_two), "alpha {alpha}");
        assert_eq!(ok(&retrieved_one), ok(&retrieved_two), "alpha {alpha}");
        assert_eq!(
            two.counters().kv_reclaims,
            one.counters().kv_reclaims,
            "alpha {alpha}"
        );
        assert_eq!(two.alpha(), one.alpha(), "alpha {alpha}");
        assert_eq!(
            ranked_two[0].as_ref().unwrap().items,
            ranked_one[0].as_ref().unwrap().items
        );
        // The request that waited is not looked up a second time: the EMB
        // tables saw exactly the lookups the node reports, and every miss
        // they saw crossed the link once. (Two lanes look up more than one:
        // the rank request is looked up before the group's prefix KV,
        // which covers the same items, is committed.)
        let row_bytes = (params().model.d_model * 4) as u64;
        for node in [&one, &two] {
            let tables = node.memory_stats().emb_tables;
            let lookups: u64 = tables.iter().map(|t| t.hits + t.misses).sum();
            let misses: u64 = tables.iter().map(|t| t.misses).sum();
            assert_eq!(lookups, node.counters().emb_lookups, "alpha {alpha}");
            assert_eq!(
                misses * row_bytes,
                node.counters().link_bytes,
                "alpha {alpha}"
            );
        }
        // Between α 0.97 and 0.98 the group and the rank request fit one
        // after the other but not together (two lanes reclaimed before).
        tight_cases += (one.counters().kv_reclaims == 0) as u32;
    }
    // The scan reaches the α where even one lane must take pages back.
    assert!(tight_cases > 0 && tight_cases < 50, "{tight_cases}");
}
