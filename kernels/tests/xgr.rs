//! Mechanisms 3–5: xGR KV separation with staged attention, early-
//! terminating beam selection, and the valid-path constraint, each against a
//! naive reference.

mod common;

use common::*;
use grflow_kernels::{
    BeamHit, BeamPrompt, BeamSearch, Candidate, GrModel, ModelConfig, SharedPrompt, SidTrie,
    StagedScratch, TopBw, UnsharedKv, beam_kv_bytes, concat_attention, flops, gemm_tally,
    per_beam_attention, rank_order, reference, select_full_sort, select_nth_then_sort, sort_beam,
    staged_attention,
};
use proptest::prelude::*;
use rand_chacha::rand_core::Rng;

fn gr_config(codebook: usize) -> ModelConfig {
    ModelConfig {
        codebook_size: codebook,
        ..ModelConfig::preset("small").unwrap()
    }
}

#[test]
fn staged_attention_equals_attention_over_concatenated_kv() {
    let cfg = gr_config(32);
    let model = GrModel::new(cfg.clone(), 4);
    let d = cfg.d_model;
    let mut r = rng(17);
    let p = 37;
    let prompt = tokens(&mut r, p, d);
    let mut pool = Pool::new(&cfg, 16, &mut r);
    let table = pool.alloc(cfg.blocks_for(p));
    model.prefill(&mut pool.store, &table, 0, &prompt).unwrap();
    let (nb, cur) = (6, 3);
    let mut un = UnsharedKv::new(&cfg, nb, 3);
    for l in 0..cfg.n_layers {
        for kv in 0..2 {
            for b in 0..nb {
                for s in 0..cur {
                    un.row_mut(l, kv, b, s)
                        .copy_from_slice(&tokens(&mut r, 1, d));
                }
            }
        }
    }
    let q = tokens(&mut r, nb, d);
    let shared = SharedPrompt {
        store: &pool.store,
        blocks: &table,
        len: p,
    };
    let mut scratch = StagedScratch::new(&cfg, nb, p);
    for l in 0..cfg.n_layers {
        for c in 1..=cur {
            let mut fast = vec![0f32; nb * d];
            let mut slow = vec![0f32; nb * d];
            staged_attention(
                model.backend(),
                &cfg,
                l,
                &q,
                d,
                nb,
                shared,
                &un,
                c,
                &mut scratch,
                &mut fast,
            );
            let bytes = concat_attention(&cfg, l, &q, d, nb, shared, &un, c, &mut slow);
            assert_eq!(bytes, nb * 2 * (p + c) * d * 4);
            assert!(
                max_diff(&fast, &slow) <= 1e-5,
                "layer {l} cur {c}: {}",
                max_diff(&fast, &slow)
            );
        }
    }
}

/// The bench's honest baseline (each beam over its own [prompt | rows], read
/// in place, same matmul and exp) computes what staged attention computes,
/// on the real `gemm` backend, for prompts that end mid-block or are empty
/// and for every number of beam tokens.
#[test]
fn per_beam_attention_equals_staged_attention() {
    let cfg = gr_config(32);
    let model = GrModel::new(cfg.clone(), 9);
    let d = cfg.d_model;
    let mut r = rng(19);
    let (nb, steps) = (5, 3);
    for p in [0usize, 1, 16, 37] {
        let prompt = tokens(&mut r, p, d);
        let mut pool = Pool::new(&cfg, 8, &mut r);
        let table = pool.alloc(cfg.blocks_for(p));
        if p > 0 {
            model.prefill(&mut pool.store, &table, 0, &prompt).unwrap();
        }
        let mut un = UnsharedKv::new(&cfg, nb, steps);
        for l in 0..cfg.n_layers {
            for kv in 0..2 {
                for b in 0..nb {
                    for s in 0..steps {
                        un.row_mut(l, kv, b, s)
                            .copy_from_slice(&tokens(&mut r, 1, d));
                    }
                }
            }
        }
        // Queries with a row stride wider than d, as the decode loop's QKV.
        let q = tokens(&mut r, nb, 3 * d);
        let shared = SharedPrompt {
            store: &pool.store,
            blocks: &table,
            len: p,
        };
        let mut scratch = StagedScratch::new(&cfg, nb, p.max(1));
        let mut scores = vec![0f32; p + steps];
        for l in 0..cfg.n_layers {
            for c in (if p == 0 { 1 } else { 0 })..=steps {
                let mut staged = vec![0f32; nb * d];
                let mut per_beam = vec![7f32; nb * d];
                staged_attention(
                    model.backend(),
                    &cfg,
                    l,
                    &q,
                    3 * d,
                    nb,
                    shared,
                    &un,
                    c,
                    &mut scratch,
                    &mut staged,
                );
                per_beam_attention(
                    model.backend(),
                    &cfg,
                    l,
                    &q,
                    3 * d,
                    nb,
                    shared,
                    &un,
                    c,
                    &mut scores,
                    &mut per_beam,
                );
                assert!(
                    max_diff(&staged, &per_beam) <= 1e-4,
                    "prompt {p} layer {l} cur {c}: {}",
                    max_diff(&staged, &per_beam)
                );
            }
        }
    }
}

fn random_candidates(
    r: &mut rand_chacha::ChaCha8Rng,
    bw: usize,
    k: usize,
) -> (Vec<Candidate>, Vec<usize>) {
    let mut cands = Vec::with_capacity(bw * k);
    let mut lens = Vec::with_capacity(bw);
    for b in 0..bw {
        let base = -((r.next_u32() % 64) as f32) / 8.0;
        // Quantised log-probs make ties across and within beams common.
        let mut row: Vec<Candidate> = (0..k)
            .map(|t| Candidate {
                score: base - (r.next_u32() % 512) as f32 / 64.0,
                beam: b as u32,
                token: t as u32,
                node: 0,
            })
            .collect();
        sort_beam(&mut row);
        let len = k - (r.next_u32() as usize % 4).min(k - 1);
        lens.push(len);
        cands.extend_from_slice(&row);
    }
    (cands, lens)
}

#[test]
fn early_termination_selects_the_full_sort_set() {
    let mut r = rng(3);
    for bw in [128usize, 256, 512] {
        for k in [128usize, 256, 512] {
            let (cands, lens) = random_candidates(&mut r, bw, k);
            let mut top = TopBw::with_capacity(bw);
            let mut fast = top.select(&cands, k, &lens, bw).to_vec();
            fast.sort_by(rank_order);
            let mut buf = Vec::with_capacity(bw * k);
            let slow = select_full_sort(&cands, k, &lens, bw, &mut buf);
            assert_eq!(fast, slow, "bw {bw} k {k}");
            assert!(
                top.visited() < lens.iter().sum::<usize>(),
                "early termination skipped nothing"
            );
        }
    }
}

/// The bench's top-k pair: early termination from unordered per-beam lists
/// (its per-beam sorts included) and `select_nth_unstable` + sort of the
/// top BW select the same candidates in the same order.
#[test]
fn early_termination_with_beam_sorts_equals_select_nth() {
    let mut r = rng(4);
    for (bw, k) in [(1usize, 1usize), (7, 3), (64, 64), (128, 256), (512, 128)] {
        let (sorted, lens) = random_candidates(&mut r, bw, k);
        // Shuffle every beam's valid candidates.
        let mut cands = sorted.clone();
        for (b, &len) in lens.iter().enumerate() {
            let beam = &mut cands[b * k..b * k + len];
            for i in (1..len).rev() {
                beam.swap(i, r.next_u32() as usize % (i + 1));
            }
        }
        let mut all: Vec<Candidate> = lens
            .iter()
            .enumerate()
            .flat_map(|(b, &len)| cands[b * k..b * k + len].iter().copied())
            .collect();
        for want in [bw, bw / 2 + 1, all.len() + 3] {
            let mut top = TopBw::with_capacity(want);
            let fast = top.sort_and_select(&mut cands, k, &lens, want).to_vec();
            let slow = select_nth_then_sort(&mut all, want).to_vec();
            assert_eq!(fast, slow, "bw {bw} k {k} want {want}");
            assert_eq!(fast.len(), want.min(all.len()));
            assert!(fast.windows(2).all(|w| rank_order(&w[0], &w[1]).is_lt()));
            // The per-beam sorts left every list in visiting order.
            for (b, &len) in lens.iter().enumerate() {
                assert_eq!(cands[b * k..b * k + len], sorted[b * k..b * k + len]);
            }
        }
    }
}

/// The search's selection: from unordered lists, visiting beams best
/// first, it takes exactly what `select_nth_unstable` + sort takes, in the
/// same order, and skips whole beams that cannot contribute.
#[test]
fn early_termination_from_unordered_lists_equals_select_nth() {
    let mut r = rng(5);
    let mut skipped_beams = false;
    for (bw, k) in [
        (1usize, 1usize),
        (7, 3),
        (64, 64),
        (128, 256),
        (512, 128),
        (512, 512),
    ] {
        let (sorted, mut lens) = random_candidates(&mut r, bw, k);
        // Some beams empty (every expansion masked).
        if bw > 4 {
            lens[3] = 0;
        }
        let mut shuffled = sorted.clone();
        for (b, &len) in lens.iter().enumerate() {
            let beam = &mut shuffled[b * k..b * k + len];
            for i in (1..len).rev() {
                beam.swap(i, r.next_u32() as usize % (i + 1));
            }
        }
        let total: usize = lens.iter().sum();
        for want in [bw, bw / 2 + 1, 1, total + 3] {
            let mut all: Vec<Candidate> = lens
                .iter()
                .enumerate()
                .flat_map(|(b, &len)| shuffled[b * k..b * k + len].iter().copied())
                .collect();
            let slow = select_nth_then_sort(&mut all, want).to_vec();
            let mut cands = shuffled.clone();
            let mut top = TopBw::with_capacity(want);
            let fast = top.select_unordered(&mut cands, k, &lens, want).to_vec();
            assert_eq!(fast, slow, "bw {bw} k {k} want {want}");
            assert!(top.visited() <= total);
            assert!(top.beams_visited() <= lens.iter().filter(|&&l| l > 0).count());
            skipped_beams |= top.beams_visited() < bw - 1;
            // The lists still hold the same candidates.
            for (b, &len) in lens.iter().enumerate() {
                let mut got = cands[b * k..b * k + len].to_vec();
                sort_beam(&mut got);
                assert_eq!(got, sorted[b * k..b * k + len]);
            }
        }
    }
    assert!(skipped_beams, "no selection skipped a beam");
}

#[test]
fn fork_in_place_equals_out_of_place_gather() {
    let cfg = gr_config(8);
    let mut r = rng(8);
    for _ in 0..50 {
        let bw = 1 + (r.next_u32() % 12) as usize;
        let len = 1 + (r.next_u32() % 3) as usize;
        let mut un = UnsharedKv::new(&cfg, bw, 3);
        for l in 0..cfg.n_layers {
            for kv in 0..2 {
                for b in 0..bw {
                    for s in 0..3 {
                        un.row_mut(l, kv, b, s)
                            .fill((l * 1000 + kv * 100 + b * 10 + s) as f32);
                    }
                }
            }
        }
        let old = un.clone();
        let n_new = 1 + (r.next_u32() as usize % bw);
        let mut parents: Vec<u32> = (0..n_new).map(|_| r.next_u32() % bw as u32).collect();
        parents.sort_unstable();
        un.fork_in_place(&parents, len);
        for l in 0..cfg.n_layers {
            for kv in 0..2 {
                for (i, &p) in parents.iter().enumerate() {
                    for s in 0..len {
                        assert_eq!(
                            un.row(l, kv, i, s),
                            old.row(l, kv, p as usize, s),
                            "parents {parents:?}"
                        );
                    }
                }
            }
        }
    }
}

/// A catalog of `n` random triplets over codebook `c`.
fn catalog(r: &mut rand_chacha::ChaCha8Rng, n: usize, c: u32) -> Vec<[u16; 3]> {
    (0..n)
        .map(|_| {
            [
                (r.next_u32() % c) as u16,
                (r.next_u32() % c) as u16,
                (r.next_u32() % c) as u16,
            ]
        })
        .collect()
}

/// Every valid path of a wide beam, on the whole catalog, scored as the
/// reference scores it; `model` fixes which weight layouts the decode uses.
fn beam_finds_every_item_with_reference_log_probs(model: &GrModel) {
    let cfg = model.config().clone();
    let c = cfg.codebook_size as u32;

    let mut r = rng(12);
    let cat = catalog(&mut r, 20, c);
    let trie = SidTrie::new(&cat, cfg.codebook_size).unwrap();
    let p = 21;
    let (prompt, pool, table) = prefilled(model, &cfg, p, &mut r);
    let mut search = BeamSearch::new(&cfg, 32, cfg.codebook_size, 64).unwrap();
    let hits = search
        .generate(model, &pool.store, &table, p, &trie)
        .unwrap()
        .to_vec();
    assert_eq!(hits.len(), trie.len());
    for h in &hits {
        let want = reference::sid_log_prob(model, &prompt, h.sid, &trie);
        assert!(
            (h.log_prob - want).abs() <= 1e-4,
            "{:?}: {} vs {want}",
            h.sid,
            h.log_prob
        );
    }
    let total: f32 = hits.iter().map(|h| h.log_prob.exp()).sum();
    assert!(
        (total - 1.0).abs() < 1e-3,
        "probabilities of all valid items sum to {total}"
    );
}

#[test]
fn wide_enough_beam_finds_every_item_with_reference_log_probs() {
    // BW >= |catalog| and K = C keep every valid path, so the search must
    // return the whole catalog with the exact sequence log-probabilities.
    beam_finds_every_item_with_reference_log_probs(&GrModel::new(gr_config(16), 12));
    // A wide model decodes its 32 beams by column-major weight copies.
    beam_finds_every_item_with_reference_log_probs(&wide_model(12));
}

#[test]
fn beam_kv_layout_is_near_ideal_and_beats_block_copying() {
    let cfg = gr_config(64);
    let model = GrModel::new(cfg.clone(), 2);
    let mut r = rng(2);
    let cat = catalog(&mut r, 3000, 64);
    let trie = SidTrie::new(&cat, 64).unwrap();
    let p = 45;
    let (_, pool, table) = prefilled(&model, &cfg, p, &mut r);
    let bw = 32;
    let mut search = BeamSearch::new(&cfg, bw, 16, 64).unwrap();
    search
        .generate(&model, &pool.store, &table, p, &trie)
        .unwrap();
    let bytes = beam_kv_bytes(&cfg, p, bw, search.parents_per_step());
    assert_eq!(
        search.unshared_kv_bytes(),
        bw * 3 * cfg.kv_token_floats() * 4
    );
    assert!(
        bytes.separated >= bytes.ideal && bytes.separated < bytes.paged_baseline,
        "{bytes:?}"
    );
}

/// A prompt of `p` random tokens prefilled into a fresh pool of 8 blocks:
/// (prompt, pool, block table). Draws from `r` as the tests did by hand,
/// the prompt first, then the pool.
fn prefilled(
    model: &GrModel,
    cfg: &ModelConfig,
    p: usize,
    r: &mut rand_chacha::ChaCha8Rng,
) -> (Vec<f32>, Pool, Vec<u32>) {
    let prompt = tokens(r, p, cfg.d_model);
    let mut pool = Pool::new(cfg, 8, r);
    let table = pool.alloc(cfg.blocks_for(p));
    model.prefill(&mut pool.store, &table, 0, &prompt).unwrap();
    (prompt, pool, table)
}

#[test]
fn a_per_beam_top_k_below_the_width_still_starts_with_a_full_beam() {
    // BW 8, K 2: the first step expands one beam, whose top-2 alone would
    // start the search with 2 beams (4 after the second step).
    let cfg = gr_config(16);
    let model = GrModel::new(cfg.clone(), 3);
    let mut r = rng(5);
    let cat = catalog(&mut r, 200, 16);
    let trie = SidTrie::new(&cat, 16).unwrap();
    let p = 9;
    let (_, pool, table) = prefilled(&model, &cfg, p, &mut r);
    let mut narrow = BeamSearch::new(&cfg, 8, 2, 64).unwrap();
    let hits = narrow
        .generate(&model, &pool.store, &table, p, &trie)
        .unwrap()
        .to_vec();
    let beams: Vec<usize> = narrow.parents_per_step().iter().map(Vec::len).collect();
    assert_eq!(beams, [8, 8, 8]);
    assert_eq!(hits.len(), 8);

    // Two first codes with 8×8 items under each (a collapsed first level):
    // the first step leaves 2 beams, and 2 per beam would make 4, then 8,
    // never the full width of 16.
    let narrow_first: Vec<[u16; 3]> = (0..2u16)
        .flat_map(|a| (0..8u16).flat_map(move |b| (0..8u16).map(move |c| [a, b, c])))
        .collect();
    let trie = SidTrie::new(&narrow_first, 16).unwrap();
    let mut wide = BeamSearch::new(&cfg, 16, 2, 64).unwrap();
    let hits = wide
        .generate(&model, &pool.store, &table, p, &trie)
        .unwrap()
        .len();
    let beams: Vec<usize> = wide.parents_per_step().iter().map(Vec::len).collect();
    assert_eq!(beams, [2, 16, 16]);
    assert_eq!(hits, 16);
}

#[test]
fn a_beam_short_of_its_width_keeps_every_child_it_can() {
    // BW 4, K 2: the first step leaves 2 beams (first codes 0 and 1).
    // 2 beams × K = 4 would fill the beam only if both had K children;
    // code 0 has one, code 1 ten, so a cut to K leaves 3 beams and 3 hits
    // although 11 items are valid.
    let cfg = gr_config(16);
    let model = GrModel::new(cfg.clone(), 4);
    let mut r = rng(6);
    let cat: Vec<[u16; 3]> = std::iter::once([0, 0, 0])
        .chain((0..10u16).map(|b| [1, b, 0]))
        .collect();
    let trie = SidTrie::new(&cat, 16).unwrap();
    let p = 9;
    let (prompt, pool, table) = prefilled(&model, &cfg, p, &mut r);
    let mut search = BeamSearch::new(&cfg, 4, 2, 64).unwrap();
    let hits = search
        .generate(&model, &pool.store, &table, p, &trie)
        .unwrap()
        .to_vec();
    let beams: Vec<usize> = search.parents_per_step().iter().map(Vec::len).collect();
    assert_eq!(beams, [2, 4, 4]);
    assert_eq!(search.rows_per_step(), [1, 2, 4]);
    assert_eq!(hits.len(), 4);
    for h in &hits {
        assert!(trie.contains(h.sid), "{:?}", h.sid);
        let want = reference::sid_log_prob(&model, &prompt, h.sid, &trie);
        assert!((h.log_prob - want).abs() <= 1e-4, "{h:?} vs {want}");
    }
}

#[test]
fn the_reference_and_the_search_cover_the_largest_codebook() {
    // Codes are u16: a codebook of 65536 holds code 65535, and
    // `65536 as u16` is 0, so nothing may count codes in u16.
    let cfg = ModelConfig {
        d_model: 16,
        d_ff: 32,
        codebook_size: 65536,
        ..ModelConfig::preset("small").unwrap()
    };
    let model = GrModel::new(cfg.clone(), 7);
    let mut r = rng(7);
    let trie = SidTrie::new(&[[5, 6, 7], [65535, 1, 2]], cfg.codebook_size).unwrap();
    let p = 5;
    let prompt = tokens(&mut r, p, cfg.d_model);
    let mut pool = Pool::new(&cfg, 2, &mut r);
    let table = pool.alloc(cfg.blocks_for(p));
    model.prefill(&mut pool.store, &table, 0, &prompt).unwrap();
    let mut search = BeamSearch::new(&cfg, 2, 2, 8).unwrap();
    let hits = search
        .generate(&model, &pool.store, &table, p, &trie)
        .unwrap()
        .to_vec();
    assert_eq!(hits.len(), 2);
    let mut total = 0.0;
    for h in &hits {
        let want = reference::sid_log_prob(&model, &prompt, h.sid, &trie);
        assert!(want.is_finite() && want <= 0.0, "{:?}: {want}", h.sid);
        assert!((h.log_prob - want).abs() <= 1e-4, "{h:?} vs {want}");
        total += want.exp();
    }
    // The catalog's two items are every valid path.
    assert!((total - 1.0).abs() < 1e-4, "{total}");
}

#[test]
fn the_flops_credited_to_a_search_are_those_of_the_rows_it_ran() {
    // 3 first codes × 2 second codes: BW 8 decodes 1, 3 and 6 rows, not
    // the 1, 8, 8 of the upper bound.
    let cfg = gr_config(16);
    let model = GrModel::new(cfg.clone(), 8);
    let mut r = rng(8);
    let cat: Vec<[u16; 3]> = (0..3u16)
        .flat_map(|a| (0..2u16).map(move |b| [a, b, 9]))
        .collect();
    let trie = SidTrie::new(&cat, 16).unwrap();
    let p = 21;
    let (_, pool, table) = prefilled(&model, &cfg, p, &mut r);
    let (bw, k) = (8, 8);
    let mut search = BeamSearch::new(&cfg, bw, k, 64).unwrap();
    assert_eq!(search.rows_per_step(), [0, 0, 0]);
    let before = gemm_tally();
    search
        .generate(&model, &pool.store, &table, p, &trie)
        .unwrap();
    let gemm = gemm_tally().since(before);
    let rows = search.rows_per_step();
    assert_eq!(rows, [1, 3, 6]);
    let kept: Vec<usize> = search.parents_per_step().iter().map(Vec::len).collect();
    assert_eq!(rows[1..], kept[..2]);
    let credited = flops::beam_search_rows_flops(&cfg, p, &rows);
    // The GEMMs run each row's projections, FFN, head and attention over
    // the prompt; attention over the row's own (at most 3) tokens is not a
    // GEMM. Every term is an integer, so the sums are exact.
    let own: f64 = rows
        .iter()
        .enumerate()
        .map(|(t, &n)| n as f64 * flops::attention_flops(&cfg, (t + 1) as f64))
        .sum();
    assert_eq!(gemm.flop, credited - own);
    assert!(credited < flops::beam_search_flops(&cfg, p, bw));
    // At full width the two counts agree.
    assert_eq!(
        flops::beam_search_rows_flops(&cfg, p, &[1, bw, bw]),
        flops::beam_search_flops(&cfg, p, bw)
    );
}

#[test]
fn searches_decoded_together_equal_each_alone() {
    // Prompts of different lengths (inside one block, across blocks) and
    // different beam widths: the batched GEMMs must not mix the searches.
    let cfg = gr_config(32);
    let model = GrModel::new(cfg.clone(), 21);
    let mut r = rng(21);
    let cat = catalog(&mut r, 500, 32);
    let trie = SidTrie::new(&cat, 32).unwrap();
    let mut pool = Pool::new(&cfg, 32, &mut r);
    let shapes = [(5, 8), (21, 16), (37, 8), (60, 4)];
    let mut tables = Vec::new();
    for &(p, _) in &shapes {
        let table = pool.alloc(cfg.blocks_for(p));
        let prompt = tokens(&mut r, p, cfg.d_model);
        model.prefill(&mut pool.store, &table, 0, &prompt).unwrap();
        tables.push(table);
    }
    let alone: Vec<Vec<BeamHit>> = shapes
        .iter()
        .zip(&tables)
        .map(|(&(p, bw), table)| {
            let mut s = BeamSearch::new(&cfg, bw, 8, 64).unwrap();
            s.generate(&model, &pool.store, table, p, &trie)
                .unwrap()
                .to_vec()
        })
        .collect();
    let mut searches: Vec<BeamSearch> = shapes
        .iter()
        .map(|&(_, bw)| BeamSearch::new(&cfg, bw, 8, 64).unwrap())
        .collect();
    let prompts: Vec<BeamPrompt<'_>> = shapes
        .iter()
        .zip(&tables)
        .map(|(&(p, _), table)| BeamPrompt {
            block_table: table,
            prompt_len: p,
        })
        .collect();
    let check = |searches: &[BeamSearch], which: &[usize]| {
        for (s, &i) in searches.iter().zip(which) {
            let (got, want) = (s.hits(), &alone[i]);
            assert_eq!(got.len(), want.len(), "search {i}");
            for (g, w) in got.iter().zip(want) {
                assert_eq!(g.sid, w.sid, "search {i}");
                assert!(
                    (g.log_prob - w.log_prob).abs() <= 1e-4,
                    "search {i}: {g:?} vs {w:?}"
                );
            }
        }
    };
    BeamSearch::generate_many(&mut searches, &model, &pool.store, &prompts, &trie).unwrap();
    check(&searches, &[0, 1, 2, 3]);
    // The buffers are reused: fewer searches, in another order.
    let mut two: Vec<BeamSearch> = searches.drain(2..).collect();
    BeamSearch::generate_many(&mut two, &model, &pool.store, &prompts[2..], &trie).unwrap();
    check(&two, &[2, 3]);
    // One invalid prompt fails the call before any work.
    let bad = [
        prompts[0],
        BeamPrompt {
            block_table: &[],
            prompt_len: 40,
        },
    ];
    assert!(BeamSearch::generate_many(&mut two, &model, &pool.store, &bad, &trie).is_err());
    assert!(
        BeamSearch::generate_many(&mut two, &model, &pool.store, &prompts[..1], &trie).is_err()
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 16, ..ProptestConfig::default() })]

    #[test]
    fn generation_never_emits_an_invalid_item(n in 1usize..200, bw in 1usize..24, k in 1usize..16, p in 1usize..40, seed in 0u64..10_000) {
        let cfg = gr_config(16);
        let model = GrModel::new(cfg.clone(), seed);
        let mut r = rng(seed);
        let cat = catalog(&mut r, n, 16);
        let trie = SidTrie::new(&cat, 16).unwrap();
        let prompt = tokens(&mut r, p, cfg.d_model);
        let mut pool = Pool::new(&cfg, 8, &mut r);
        let table = pool.alloc(cfg.blocks_for(p));
        model.prefill(&mut pool.store, &table, 0, &prompt).unwrap();
        let mut search = BeamSearch::new(&cfg, bw, k, 64).unwrap();
        let hits = search.generate(&model, &pool.store, &table, p, &trie).unwrap();
        prop_assert!(!hits.is_empty() && hits.len() <= bw);
        let mut seen = std::collections::HashSet::new();
        for w in hits.windows(2) {
            prop_assert!(w[0].log_prob >= w[1].log_prob);
        }
        for h in hits {
            prop_assert!(trie.contains(h.sid), "invalid item {:?}", h.sid);
            prop_assert!(seen.insert(h.sid), "duplicate item {:?}", h.sid);
            prop_assert!(h.log_prob <= 1e-5);
        }
    }
}
