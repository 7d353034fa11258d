//! Measurements behind `grflow bench kernels`: GEMM peak, paged prefill,
//! prefix reuse, staged attention, beam KV bytes and early-terminating
//! top-BW. Pure computation and timing; the CLI prints the report.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::backend::{Backend, CpuBackend, MatMut, MatRef};
use crate::beam::{BeamSearch, beam_kv_bytes};
use crate::config::ModelConfig;
use crate::error::KernelError;
use crate::flops::{beam_search_flops, prefill_flops};
use crate::kv_store::VecKvStore;
use crate::model::GrModel;
use crate::staged::{SharedPrompt, StagedScratch, UnsharedKv, concat_attention, staged_attention};
use crate::topk::{Candidate, TopBw, select_full_sort};
use crate::trie::SidTrie;

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Threads of the CPU backend (matmuls only).
    pub threads: usize,
    /// Prefill prompt length (the preset: 2,048).
    pub prefill_tokens: usize,
    /// Beam width = per-beam K of the beam benches (the issue's: 512).
    pub beam_width: usize,
    /// Repetitions per timing (the best is kept).
    pub reps: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            threads: 1,
            prefill_tokens: 2048,
            beam_width: 512,
            reps: 3,
        }
    }
}

/// The measured numbers (one JSON object).
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub threads: usize,
    pub backend: String,
    /// Best of square 1024³ and prefill-shaped GEMMs, GFLOP/s.
    pub gemm_gflops: f64,
    pub prefill_model: String,
    pub prefill_tokens: usize,
    pub prefill_ms: f64,
    /// Causal FLOPs of the prefill over its wall time.
    pub prefill_gflops: f64,
    pub prefill_fraction_of_gemm: f64,
    /// Prefill with 90% of the prompt cached in blocks vs the whole prompt.
    pub prefix_reuse_suffix_ms: f64,
    pub prefix_reuse_speedup: f64,
    /// User-as-prefix request on `small`: 10 new history tokens on 90
    /// cached, then ranking 100 candidates.
    pub small_rank_request_ms: f64,
    /// Decode attention of one layer, `beam_width` beams over a shared
    /// prompt: staged (shared GEMM + unshared + merge) vs per-beam
    /// concatenated KV.
    pub staged_attention_prompt: usize,
    pub staged_attention_ms: f64,
    pub concat_attention_ms: f64,
    pub staged_attention_speedup: f64,
    pub beam_width: usize,
    pub beam_top_k: usize,
    pub beam_prompt: usize,
    pub beam_search_ms: f64,
    pub beam_search_gflops: f64,
    pub beam_kv_bytes: usize,
    pub beam_kv_bytes_baseline: usize,
    pub beam_kv_bytes_ideal: usize,
    pub beam_kv_overhead_vs_ideal: f64,
    /// Top-BW of BW × K candidates from the model's last decode step.
    pub topk_candidates: usize,
    pub topk_visited: usize,
    pub topk_early_termination_us: f64,
    pub topk_full_sort_us: f64,
    pub topk_early_termination_speedup: f64,
}

fn best_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Deterministic pseudo-random rows in [-1, 1).
fn rows(n: usize, d: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n * d)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / 8_388_608.0 - 1.0
        })
        .collect()
}

/// Shuffled block ids `0..n` (pages of a pool are never contiguous).
fn shuffled(n: usize, seed: u64) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..n as u32).collect();
    let r = rows(n, 1, seed);
    for i in (1..n).rev() {
        let j = (((r[i] + 1.0) * 0.5 * (i + 1) as f32) as usize).min(i);
        ids.swap(i, j);
    }
    ids
}

fn gemm_gflops(be: &dyn Backend, reps: usize) -> f64 {
    let mut best: f64 = 0.0;
    for (m, n, k) in [(1024, 1024, 1024), (2048, 2048, 512), (2048, 512, 2048)] {
        let a = rows(m, k, 1);
        let b = rows(k, n, 2);
        let mut c = vec![0f32; m * n];
        let secs = best_secs(reps, || {
            be.matmul(
                MatMut::row_major(&mut c, m, n),
                MatRef::row_major(&a, m, k),
                MatRef::row_major(&b, k, n),
                1.0,
                false,
            )
        });
        best = best.max(2.0 * (m * n * k) as f64 / secs / 1e9);
    }
    best
}

/// Runs every measurement.
pub fn run(opts: &BenchOptions) -> Result<BenchReport, KernelError> {
    if opts.prefill_tokens < 10 {
        return Err(KernelError::InvalidConfig(format!(
            "prefill_tokens {} < 10 leaves no 10% suffix to time",
            opts.prefill_tokens
        )));
    }
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new(opts.threads));
    let gemm = gemm_gflops(backend.as_ref(), opts.reps);

    // Prefill: hstu-3l on a fresh prompt, then with 90% cached.
    let cfg = ModelConfig::preset("hstu-3l").expect("preset exists");
    let model = GrModel::try_new(cfg.clone(), 1)?.with_backend(backend.clone());
    let n = opts.prefill_tokens;
    let blocks = cfg.blocks_for(n);
    let mut store = VecKvStore::new(blocks, cfg.kv_block_floats());
    let table = shuffled(blocks, 3);
    let prompt = rows(n, cfg.d_model, 4);
    let mut result = Ok(());
    let full = best_secs(opts.reps.min(2), || {
        result = model.prefill(&mut store, &table, 0, &prompt)
    });
    std::mem::replace(&mut result, Ok(()))?;
    let cached = n * 9 / 10;
    let suffix = best_secs(opts.reps, || {
        result = model.prefill(&mut store, &table, cached, &prompt[cached * cfg.d_model..])
    });
    std::mem::replace(&mut result, Ok(()))?;
    let prefill_gflops = prefill_flops(&cfg, 0, n) / full / 1e9;

    // A typical node request on `small`.
    let small = ModelConfig::preset("small").expect("preset exists");
    let sm = GrModel::try_new(small.clone(), 2)?.with_backend(backend.clone());
    let hist = rows(100, small.d_model, 5);
    let cands = rows(100, small.d_model, 6);
    let mut sstore = VecKvStore::new(16, small.kv_block_floats());
    let stable = shuffled(16, 7);
    sm.prefill(&mut sstore, &stable, 0, &hist[..90 * small.d_model])?;
    let mut scores = Ok(Vec::new());
    let rank = best_secs(opts.reps * 10, || {
        result = sm.prefill(&mut sstore, &stable, 90, &hist[90 * small.d_model..]);
        scores = sm.rank_user_prefix(&sstore, &stable, 100, &cands);
    });
    std::mem::replace(&mut result, Ok(()))?;
    scores?;

    // Generative retrieval on `small` with C = 1024 and a dense catalog
    // (32 × 32 × 1024 items) so that every beam has >= K valid codes at the
    // last step.
    let bw = opts.beam_width;
    let gcfg = ModelConfig {
        codebook_size: 1024,
        ..small.clone()
    };
    let gm = GrModel::try_new(gcfg.clone(), 8)?.with_backend(backend.clone());
    let beam_prompt = 200;
    let mut gstore = VecKvStore::new(gcfg.blocks_for(beam_prompt), gcfg.kv_block_floats());
    let gtable = shuffled(gcfg.blocks_for(beam_prompt), 9);
    let gprompt = rows(beam_prompt, gcfg.d_model, 10);
    gm.prefill(&mut gstore, &gtable, 0, &gprompt)?;
    let catalog: Vec<[u16; 3]> = (0..32u16)
        .flat_map(|a| (0..32u16).flat_map(move |b| (0..1024u16).map(move |c| [a, b, c])))
        .collect();
    let trie = SidTrie::new(&catalog, 1024)?;
    let mut search = BeamSearch::new(&gcfg, bw, bw, beam_prompt)?;
    let mut gen_result = Ok(());
    let beam_secs = best_secs(opts.reps, || {
        gen_result = search
            .generate(&gm, &gstore, &gtable, beam_prompt, &trie)
            .map(|_| ())
    });
    gen_result?;
    let kv = beam_kv_bytes(&gcfg, beam_prompt, bw, search.parents_per_step());

    // Top-BW on the model's last-step candidates.
    let (cand, stride, lens) = search.last_candidates();
    let total: usize = lens.iter().sum();
    let mut top = TopBw::with_capacity(bw);
    let mut buf: Vec<Candidate> = Vec::with_capacity(total);
    let reps = opts.reps * 10;
    let early = best_secs(reps, || {
        std::hint::black_box(top.select(cand, stride, lens, bw));
    });
    let visited = top.visited();
    let sorted = best_secs(reps, || {
        std::hint::black_box(select_full_sort(cand, stride, lens, bw, &mut buf));
    });

    // Staged vs concatenated decode attention, one layer, step 2.
    let cur = 2;
    let mut un = UnsharedKv::new(&gcfg, bw, 3);
    let fill = rows(bw * 3, gcfg.d_model, 11);
    for l in 0..gcfg.n_layers {
        for k in 0..2 {
            for b in 0..bw {
                for s in 0..cur {
                    let i = b * 3 + s;
                    un.row_mut(l, k, b, s)
                        .copy_from_slice(&fill[i * gcfg.d_model..(i + 1) * gcfg.d_model]);
                }
            }
        }
    }
    let q = rows(bw, gcfg.d_model, 12);
    let shared = SharedPrompt {
        store: &gstore,
        blocks: &gtable,
        len: beam_prompt,
    };
    let mut scratch = StagedScratch::new(&gcfg, bw, beam_prompt);
    let mut out = vec![0f32; bw * gcfg.d_model];
    let staged = best_secs(opts.reps, || {
        staged_attention(
            backend.as_ref(),
            &gcfg,
            0,
            &q,
            gcfg.d_model,
            bw,
            shared,
            &un,
            cur,
            &mut scratch,
            &mut out,
        )
    });
    let concat = best_secs(opts.reps, || {
        concat_attention(&gcfg, 0, &q, gcfg.d_model, bw, shared, &un, cur, &mut out);
    });

    Ok(BenchReport {
        threads: opts.threads,
        backend: backend.name().to_string(),
        gemm_gflops: gemm,
        prefill_model: "hstu-3l".into(),
        prefill_tokens: n,
        prefill_ms: full * 1e3,
        prefill_gflops,
        prefill_fraction_of_gemm: prefill_gflops / gemm,
        prefix_reuse_suffix_ms: suffix * 1e3,
        prefix_reuse_speedup: full / suffix,
        small_rank_request_ms: rank * 1e3,
        staged_attention_prompt: beam_prompt,
        staged_attention_ms: staged * 1e3,
        concat_attention_ms: concat * 1e3,
        staged_attention_speedup: concat / staged,
        beam_width: bw,
        beam_top_k: bw,
        beam_prompt,
        beam_search_ms: beam_secs * 1e3,
        beam_search_gflops: beam_search_flops(&gcfg, beam_prompt, bw) / beam_secs / 1e9,
        beam_kv_bytes: kv.separated,
        beam_kv_bytes_baseline: kv.paged_baseline,
        beam_kv_bytes_ideal: kv.ideal,
        beam_kv_overhead_vs_ideal: kv.separated as f64 / kv.ideal as f64 - 1.0,
        topk_candidates: total,
        topk_visited: visited,
        topk_early_termination_us: early * 1e6,
        topk_full_sort_us: sorted * 1e6,
        topk_early_termination_speedup: sorted / early,
    })
}
