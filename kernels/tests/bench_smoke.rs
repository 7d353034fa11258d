//! `grflow bench kernels` at tiny sizes: every code path of the bench runs
//! in CI, so the measurements cannot rot, and the report names what it
//! measured. No timing is asserted.

use grflow_kernels::bench::{BenchOptions, run};
use grflow_kernels::flops::beam_search_rows_flops;
use grflow_kernels::{BeamSearch, ModelConfig, SID_STEPS, VecKvStore};

fn tiny() -> BenchOptions {
    BenchOptions {
        threads: 1,
        gemm_shapes: vec![[8, 16, 4], [32, 8, 16]],
        prefill_tokens: 40,
        beam_width: 16,
        codebook_size: 32,
        beam_prompt: 21,
        reps: 1,
    }
}

#[test]
fn tiny_bench_runs_every_measurement_and_names_its_shapes() {
    let opts = tiny();
    let r = run(&opts).unwrap();

    // GEMM: every shape timed is named, and the headline is the best one.
    let shapes: Vec<[usize; 3]> = r.gemm_shapes.iter().map(|g| [g.m, g.n, g.k]).collect();
    assert_eq!(shapes, opts.gemm_shapes);
    let best = r
        .gemm_shapes
        .iter()
        .max_by(|a, b| a.gflops.total_cmp(&b.gflops))
        .unwrap();
    assert_eq!(r.gemm_gflops, best.gflops);
    assert_eq!(r.gemm_shape, [best.m, best.n, best.k]);

    // Beam KV: the allocations of the prompt's arena and of the searcher's
    // unshared buffer, never below the ideal layout.
    let cfg = ModelConfig {
        codebook_size: opts.codebook_size,
        ..ModelConfig::preset("small").unwrap()
    };
    let arena = VecKvStore::new(cfg.blocks_for(opts.beam_prompt), cfg.kv_block_floats());
    assert_eq!(r.beam_kv_prompt_bytes, arena.allocated_bytes());
    let search = BeamSearch::new(&cfg, opts.beam_width, opts.beam_width, opts.beam_prompt).unwrap();
    assert_eq!(r.beam_kv_unshared_bytes, search.unshared_kv_bytes());
    assert!(r.beam_kv_unshared_bytes >= opts.beam_width * SID_STEPS * cfg.kv_token_floats() * 4);
    assert_eq!(
        r.beam_kv_bytes,
        r.beam_kv_prompt_bytes + r.beam_kv_unshared_bytes
    );
    assert!(r.beam_kv_bytes >= r.beam_kv_bytes_ideal, "{r:?}");

    // Top-k ran on the last step's BW × K candidates; attention on the
    // configured prompt; every timing is a real, positive duration.
    assert_eq!(r.topk_candidates, opts.beam_width * opts.beam_width);
    assert!(r.topk_visited <= r.topk_candidates);
    assert!(r.topk_beams_visited >= 1 && r.topk_beams_visited <= opts.beam_width);
    assert_eq!(r.staged_attention_prompt, opts.beam_prompt);
    for t in [
        r.staged_attention_ms,
        r.per_beam_attention_ms,
        r.concat_attention_ms,
        r.topk_early_termination_us,
        r.topk_sort_then_select_us,
        r.topk_select_nth_us,
        r.topk_presorted_heap_us,
        r.topk_full_sort_us,
        r.beam_search_ms,
        r.beam_group_alone_ms,
        r.beam_group_ms_per_search,
        r.prefill_ms,
    ] {
        assert!(t.is_finite() && t > 0.0, "{r:?}");
    }
    assert_eq!(r.beam_group, 4);
}

#[test]
fn beam_search_gflops_counts_the_rows_the_search_ran() {
    // The dense catalog has 32 first codes: BW 64 decodes 1, then 32, then
    // 64 rows, and the rate is credited for those, not for 1, 64, 64.
    let opts = BenchOptions {
        beam_width: 64,
        codebook_size: 64,
        ..tiny()
    };
    let r = run(&opts).unwrap();
    assert_eq!(r.beam_search_rows, [1, 32, 64]);
    let cfg = ModelConfig {
        codebook_size: opts.codebook_size,
        ..ModelConfig::preset("small").unwrap()
    };
    let flops = beam_search_rows_flops(&cfg, opts.beam_prompt, &r.beam_search_rows);
    let credited = r.beam_search_gflops * 1e9 * r.beam_search_ms / 1e3;
    assert!(
        (credited / flops - 1.0).abs() < 1e-9,
        "{credited} vs {flops}"
    );
    let json = serde_json::to_value(&r).unwrap();
    assert!(json["beam_search_gflops"].is_number());
    assert_eq!(json["beam_search_rows"], serde_json::json!([1, 32, 64]));
}

#[test]
fn bench_rejects_a_codebook_smaller_than_the_beam() {
    let opts = BenchOptions {
        codebook_size: 8,
        ..tiny()
    };
    let err = run(&opts).unwrap_err().to_string();
    assert!(err.contains("(--codebook-size) 8"), "{err}");
    let opts = BenchOptions {
        gemm_shapes: vec![[4, 0, 4]],
        ..tiny()
    };
    assert!(run(&opts).unwrap_err().to_string().contains("gemm_shapes"));
}
