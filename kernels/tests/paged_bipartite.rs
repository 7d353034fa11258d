//! Mechanisms 1 and 2: paged KV prefix reuse and BAT bipartite attention
//! (User-as-prefix, Item-as-prefix) against naive full recomputation.

mod common;

use common::*;
use grflow_kernels::{ItemKvRef, PrefillJob, RankJob, reference};
use proptest::prelude::*;

const TOL: f32 = 1e-4;

/// Prefill `len` history tokens in two chunks split at `cached`, then check
/// every layer's K/V against recomputing the whole history.
fn check_prefix_reuse(len: usize, cached: usize, seed: u64) -> f32 {
    let model = small_model(seed);
    let cfg = model.config().clone();
    let mut r = rng(seed ^ 0xabc);
    let hist = tokens(&mut r, len, cfg.d_model);
    let mut pool = Pool::new(&cfg, 64, &mut r);
    let table = pool.alloc(cfg.blocks_for(len));
    let d = cfg.d_model;
    model
        .prefill(&mut pool.store, &table, 0, &hist[..cached * d])
        .unwrap();
    model
        .prefill(&mut pool.store, &table, cached, &hist[cached * d..])
        .unwrap();
    let full = reference::causal(&model, &hist);
    kv_diff(&cfg, &pool.store, &table, len, &full.k, &full.v, 0)
}

#[test]
fn suffix_on_cached_prefix_equals_recomputation() {
    // 45 = 2 full blocks + 13; cached 21 is mid-block.
    let diff = check_prefix_reuse(45, 21, 1);
    assert!(diff <= TOL, "max abs diff {diff}");
    // A tiny tail and an empty prefix.
    assert!(check_prefix_reuse(19, 18, 2) <= TOL);
    assert!(check_prefix_reuse(7, 0, 3) <= TOL);
}

/// A wide model multiplies chunks of up to 64 rows by column-major copies
/// of its weights and longer ones row-major: both equal recomputation.
#[test]
fn user_prefix_ranking_with_column_major_weights_equals_recomputation() {
    let model = wide_model(13);
    let cfg = model.config().clone();
    let d = cfg.d_model;
    let mut r = rng(6);
    let (u, n) = (110, 12);
    let hist = tokens(&mut r, u, d);
    let cands = tokens(&mut r, n, d);
    let mut pool = Pool::new(&cfg, 16, &mut r);
    let table = pool.alloc(cfg.blocks_for(u));
    // 90 rows (row-major weights), then 20 (column-major).
    model
        .prefill(&mut pool.store, &table, 0, &hist[..90 * d])
        .unwrap();
    model
        .prefill(&mut pool.store, &table, 90, &hist[90 * d..])
        .unwrap();
    let full = reference::causal(&model, &hist);
    let kv = kv_diff(&cfg, &pool.store, &table, u, &full.k, &full.v, 0);
    assert!(kv <= TOL, "KV differs by {kv}");
    let fast = model
        .rank_user_prefix(&pool.store, &table, u, &cands)
        .unwrap();
    let (slow, _) = reference::rank_user_prefix(&model, &hist, &cands);
    assert!(
        max_diff(&fast, &slow) <= TOL,
        "scores differ by {}",
        max_diff(&fast, &slow)
    );
}

#[test]
fn user_prefix_ranking_equals_recomputation() {
    let model = small_model(11);
    let cfg = model.config().clone();
    let d = cfg.d_model;
    let mut r = rng(5);
    let (u, n) = (37, 12);
    let hist = tokens(&mut r, u, d);
    let cands = tokens(&mut r, n, d);
    let mut pool = Pool::new(&cfg, 32, &mut r);
    let table = pool.alloc(cfg.blocks_for(u));
    model
        .prefill(&mut pool.store, &table, 0, &hist[..20 * d])
        .unwrap();
    model
        .prefill(&mut pool.store, &table, 20, &hist[20 * d..])
        .unwrap();
    let fast = model
        .rank_user_prefix(&pool.store, &table, u, &cands)
        .unwrap();
    let (slow, _) = reference::rank_user_prefix(&model, &hist, &cands);
    assert_eq!(fast.len(), n);
    assert!(
        max_diff(&fast, &slow) <= TOL,
        "scores differ by {}",
        max_diff(&fast, &slow)
    );
    assert!((fast.iter().sum::<f32>() - 1.0).abs() < 1e-4);
}

#[test]
fn a_candidates_score_does_not_depend_on_the_other_candidates() {
    // The instruction token never sees the candidates, so the logit gap
    // between two candidates is the same whatever else is ranked with them.
    let model = small_model(13);
    let cfg = model.config().clone();
    let d = cfg.d_model;
    let mut r = rng(17);
    let u = 9;
    let hist = tokens(&mut r, u, d);
    let pair = tokens(&mut r, 2, d);
    let mut pool = Pool::new(&cfg, 8, &mut r);
    let table = pool.alloc(cfg.blocks_for(u));
    model.prefill(&mut pool.store, &table, 0, &hist).unwrap();
    let gap = |others: &[f32]| {
        let cands = [&pair[..], others].concat();
        let s = model
            .rank_user_prefix(&pool.store, &table, u, &cands)
            .unwrap();
        s[0].ln() - s[1].ln()
    };
    let a = gap(&tokens(&mut r, 3, d));
    let b = gap(&tokens(&mut r, 40, d));
    let c = gap(&[]);
    assert!((a - b).abs() < 1e-4 && (a - c).abs() < 1e-4, "{a} {b} {c}");
}

#[test]
fn item_entries_equal_their_kv_inside_the_full_sequence_and_scores_match() {
    let model = small_model(21);
    let cfg = model.config().clone();
    let d = cfg.d_model;
    let mut r = rng(9);
    // Items of 1..=19 tokens: some cross a block boundary.
    let lens = [3usize, 1, 19, 5, 17, 2, 9];
    let items: Vec<Vec<f32>> = lens.iter().map(|&l| tokens(&mut r, l, d)).collect();
    let user = tokens(&mut r, 23, d);
    let mut pool = Pool::new(&cfg, 64, &mut r);
    let tables: Vec<Vec<u32>> = lens
        .iter()
        .map(|&l| pool.alloc(cfg.blocks_for(l)))
        .collect();
    for (it, table) in items.iter().zip(&tables) {
        model.item_kv(&mut pool.store, table, it).unwrap();
    }
    let refs: Vec<&[f32]> = items.iter().map(|v| v.as_slice()).collect();
    let (slow, full) = reference::rank_item_prefix(&model, &refs, &user);
    let mut start = 0;
    for (&len, table) in lens.iter().zip(&tables) {
        let diff = kv_diff(&cfg, &pool.store, table, len, &full.k, &full.v, start);
        assert!(diff <= TOL, "item at {start}: KV differs by {diff}");
        start += len;
    }
    let entries: Vec<ItemKvRef<'_>> = lens
        .iter()
        .zip(&tables)
        .map(|(&len, t)| ItemKvRef { blocks: t, len })
        .collect();
    let fast = model
        .rank_item_prefix(&pool.store, &entries, &user)
        .unwrap();
    assert!(
        max_diff(&fast, &slow) <= TOL,
        "scores differ by {}",
        max_diff(&fast, &slow)
    );
    // The logits are what the scores are the softmax of.
    let logits = model
        .rank_item_prefix_logits(&pool.store, &entries, &user)
        .unwrap();
    assert_eq!(logits.len(), lens.len());
    let again = grflow_kernels::rank_softmax(&logits);
    assert!(max_diff(&again, &fast) <= 1e-6, "softmax of the logits");
}

#[test]
fn bad_inputs_are_errors_not_panics() {
    let model = small_model(1);
    let cfg = model.config().clone();
    let mut pool = Pool::new(&cfg, 4, &mut rng(1));
    let table = pool.alloc(1);
    assert!(
        model
            .prefill(&mut pool.store, &table, 0, &[0.0; 65])
            .is_err()
    );
    assert!(
        model
            .prefill(&mut pool.store, &table, 10, &vec![0.0; 10 * 64])
            .is_err()
    );
    assert!(model.rank_user_prefix(&pool.store, &table, 5, &[]).is_err());
    let wrong = grflow_kernels::VecKvStore::new(2, 7);
    assert!(
        model
            .rank_user_prefix(&wrong, &table, 1, &[0.0; 64])
            .is_err()
    );
    // A cached length near usize::MAX wrapped past both checks and panicked.
    assert!(
        model
            .prefill(&mut pool.store, &table, usize::MAX, &[0.0; 64])
            .is_err()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn prefix_reuse_over_lengths(len in 1usize..70, cut in 0.0f64..1.0, seed in 0u64..1000) {
        let cached = ((len as f64) * cut) as usize;
        let diff = check_prefix_reuse(len, cached, seed);
        prop_assert!(diff <= TOL, "len {} cached {}: diff {}", len, cached, diff);
    }

    #[test]
    fn candidates_are_permutation_equivariant(n in 2usize..20, u in 1usize..40, seed in 0u64..1000) {
        // Bipartite masking + shared positions: shuffling candidates only
        // shuffles their scores.
        let model = small_model(3);
        let cfg = model.config().clone();
        let d = cfg.d_model;
        let mut r = rng(seed);
        let hist = tokens(&mut r, u, d);
        let cands = tokens(&mut r, n, d);
        let mut pool = Pool::new(&cfg, 8, &mut r);
        let table = pool.alloc(cfg.blocks_for(u));
        model.prefill(&mut pool.store, &table, 0, &hist).unwrap();
        let a = model.rank_user_prefix(&pool.store, &table, u, &cands).unwrap();
        let rev: Vec<f32> = cands.chunks(d).rev().flatten().copied().collect();
        let mut b = model.rank_user_prefix(&pool.store, &table, u, &rev).unwrap();
        b.reverse();
        prop_assert!(max_diff(&a, &b) <= 1e-5);
    }
}

#[test]
fn stores_work_through_mut_and_dyn_references() {
    // The node passes one `&mut` store to `prefill` and then to the ranking.
    let model = small_model(4);
    let cfg = model.config().clone();
    let mut pool = Pool::new(&cfg, 4, &mut rng(4));
    let table = pool.alloc(2);
    let hist = tokens(&mut rng(5), 20, cfg.d_model);
    let cands = tokens(&mut rng(6), 3, cfg.d_model);
    let store = &mut pool.store;
    model.prefill(store, &table, 0, &hist).unwrap();
    let a = model.rank_user_prefix(store, &table, 20, &cands).unwrap();
    let dyn_store: &mut dyn grflow_kernels::KvBlockStore = &mut pool.store;
    model.prefill(dyn_store, &table, 0, &hist).unwrap();
    let b = model
        .rank_user_prefix(dyn_store, &table, 20, &cands)
        .unwrap();
    assert_eq!(a, b);
}

#[test]
fn threaded_attention_tiles_match_single_thread() {
    // 300 tokens = 3 query tiles, spread over 2 threads.
    let one = small_model(8);
    let two = small_model(8).with_backend(std::sync::Arc::new(grflow_kernels::CpuBackend::new(2)));
    let cfg = one.config().clone();
    let hist = tokens(&mut rng(8), 300, cfg.d_model);
    let mut a = Pool::new(&cfg, 19, &mut rng(1));
    let mut b = Pool::new(&cfg, 19, &mut rng(2));
    let (ta, tb) = (a.alloc(19), b.alloc(19));
    one.prefill(&mut a.store, &ta, 0, &hist).unwrap();
    two.prefill(&mut b.store, &tb, 0, &hist).unwrap();
    for l in 0..cfg.n_layers {
        for t in [0, 127, 128, 200, 299] {
            let d = max_diff(
                grflow_kernels::kv_row(&cfg, &a.store, &ta, t, l, 1),
                grflow_kernels::kv_row(&cfg, &b.store, &tb, t, l, 1),
            );
            assert!(d <= 1e-5, "layer {l} token {t}: {d}");
        }
    }
}

/// Batched prefill and ranking (several requests' rows packed into one set
/// of GEMMs) equal one call per request: mixed history lengths, cached and
/// uncached prefixes, mixed candidate counts.
#[test]
fn batched_prefill_and_ranking_equal_one_request_at_a_time() {
    let model = small_model(21);
    let cfg = model.config().clone();
    let d = cfg.d_model;
    let mut r = rng(23);
    // (history length, tokens already cached, candidates)
    let shapes = [
        (45, 21, 12),
        (7, 0, 3),
        (19, 18, 30),
        (16, 16, 1),
        (33, 0, 8),
    ];
    let mut single = Pool::new(&cfg, 64, &mut r);
    let mut batched = Pool::new(&cfg, 64, &mut r);
    let mut reqs = Vec::new();
    for &(len, cached, n) in &shapes {
        let hist = tokens(&mut r, len, d);
        let cands = tokens(&mut r, n, d);
        let ts = single.alloc(cfg.blocks_for(len));
        let tb = batched.alloc(cfg.blocks_for(len));
        // The cached part is in both pools already.
        for (pool, table) in [(&mut single, &ts), (&mut batched, &tb)] {
            model
                .prefill(&mut pool.store, table, 0, &hist[..cached * d])
                .unwrap();
        }
        reqs.push((hist, cands, ts, tb, len, cached));
    }
    let mut expected = Vec::new();
    for (hist, cands, ts, _, len, cached) in &reqs {
        model
            .prefill(&mut single.store, ts, *cached, &hist[cached * d..])
            .unwrap();
        expected.push(
            model
                .rank_user_prefix(&single.store, ts, *len, cands)
                .unwrap(),
        );
    }
    let prefills: Vec<PrefillJob<'_>> = reqs
        .iter()
        .map(|(hist, _, _, tb, _, cached)| PrefillJob {
            block_table: tb,
            cached_len: *cached,
            new_tokens: &hist[cached * d..],
        })
        .collect();
    model.prefill_batch(&mut batched.store, &prefills).unwrap();
    let ranks: Vec<RankJob<'_>> = reqs
        .iter()
        .map(|(_, cands, _, tb, len, _)| RankJob {
            block_table: tb,
            prefix_len: *len,
            candidate_tokens: cands,
        })
        .collect();
    let got = model
        .rank_user_prefix_batch(&batched.store, &ranks)
        .unwrap();
    assert_eq!(got.len(), reqs.len());
    for (i, ((g, e), (_, _, ts, tb, len, _))) in got.iter().zip(&expected).zip(&reqs).enumerate() {
        assert_eq!(g.len(), e.len());
        assert!(
            max_diff(g, e) <= TOL,
            "request {i}: scores differ by {}",
            max_diff(g, e)
        );
        // The KV each prefill wrote is the same too.
        let full = reference::causal(&model, &reqs[i].0);
        assert!(kv_diff(&cfg, &single.store, ts, *len, &full.k, &full.v, 0) <= TOL);
        assert!(kv_diff(&cfg, &batched.store, tb, *len, &full.k, &full.v, 0) <= TOL);
    }
}
