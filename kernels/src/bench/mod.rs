//! Measurements behind `grflow bench kernels`: GEMM peak, paged prefill,
//! prefix reuse, staged attention, beam KV bytes and early-terminating
//! top-BW. Pure computation and timing; the CLI prints the report.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::backend::{Backend, CpuBackend, MatMut, MatRef};
use crate::beam::SID_STEPS;
use crate::error::KernelError;
use crate::flops::beam_search_rows_flops;

mod attention;
mod beam;
mod model;
mod topk;

pub use beam::MAX_CODEBOOK;

/// The GEMM shapes `(m, n, k)` of `gemm_gflops` by default: a square one and
/// the two prefill-shaped ones of `hstu-3l` (d_model 512, d_ff 2048).
pub const DEFAULT_GEMM_SHAPES: [[usize; 3]; 3] =
    [[1024, 1024, 1024], [2048, 2048, 512], [2048, 512, 2048]];

/// What to measure.
#[derive(Clone, Debug)]
pub struct BenchOptions {
    /// Threads of the CPU backend (matmuls only).
    pub threads: usize,
    /// GEMM shapes `[m, n, k]` timed for `gemm_gflops` (the best is kept).
    pub gemm_shapes: Vec<[usize; 3]>,
    /// Prefill prompt length (the preset: 2,048).
    pub prefill_tokens: usize,
    /// Beam width = per-beam K of the beam benches (the issue's: 512).
    pub beam_width: usize,
    /// Codebook size C of the beam benches (>= 32 and >= `beam_width`): the
    /// catalog is the dense 32 × 32 × C, so every beam has C valid codes at
    /// the last step.
    pub codebook_size: usize,
    /// Prompt tokens of the beam benches.
    pub beam_prompt: usize,
    /// Repetitions per timing (the best is kept).
    pub reps: usize,
}

impl Default for BenchOptions {
    fn default() -> Self {
        Self {
            threads: 1,
            gemm_shapes: DEFAULT_GEMM_SHAPES.to_vec(),
            prefill_tokens: 2048,
            beam_width: 512,
            codebook_size: 1024,
            beam_prompt: 200,
            reps: 3,
        }
    }
}

/// One timed GEMM shape.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct GemmRate {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub gflops: f64,
}

/// The measured numbers (one JSON object).
#[derive(Clone, Debug, Serialize)]
pub struct BenchReport {
    pub threads: usize,
    pub backend: String,
    /// Best GFLOP/s over `gemm_shapes`, reached at `gemm_shape` ([m, n, k]).
    pub gemm_gflops: f64,
    pub gemm_shape: [usize; 3],
    pub gemm_shapes: Vec<GemmRate>,
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
    /// User-as-prefix ranking alone on `small` of 1,000 candidates (the
    /// default `model.max_candidates`) on those 100 cached tokens.
    pub small_rank_1000_candidates_ms: f64,
    /// Decode attention of one layer, `beam_width` beams over a shared
    /// prompt of `staged_attention_prompt` tokens, at step 2.
    pub staged_attention_prompt: usize,
    /// Staged: the prompt's KV read once for all beams (one GEMM per block),
    /// the beams' own rows, merged by online softmax.
    pub staged_attention_ms: f64,
    /// Baseline: each beam attends over [prompt | its rows] read in place,
    /// with the same matmul and `exp` (no sharing, no copy).
    pub per_beam_attention_ms: f64,
    /// `per_beam_attention_ms / staged_attention_ms`.
    pub staged_attention_speedup: f64,
    /// Round-1 baseline: per-beam copy of the KV, scalar dots, libm `exp`.
    pub concat_attention_ms: f64,
    /// `concat_attention_ms / staged_attention_ms` (the round-1 figure).
    pub staged_attention_speedup_vs_copy: f64,
    pub beam_width: usize,
    pub beam_top_k: usize,
    pub beam_prompt: usize,
    pub beam_search_ms: f64,
    /// FLOPs of the rows the search decoded (`beam_search_rows`, counted
    /// by [`crate::flops::beam_search_rows_flops`]) per second of
    /// `beam_search_ms`. Not BW rows at every step: the dense catalog has
    /// 32 first codes, so step 1 runs min(BW, 32) rows.
    pub beam_search_gflops: f64,
    /// Rows the search ran through the model at each decode step
    /// ([`crate::beam::BeamSearch::rows_per_step`]).
    pub beam_search_rows: [usize; SID_STEPS],
    /// Searches decoded together ([`crate::beam::BeamSearch::generate_many`]), as a
    /// node serves a group of retrieve requests, at the serving default
    /// (`hstu-3l`, BW = K = 32, a 64-token prompt).
    pub beam_group: usize,
    /// One such search alone.
    pub beam_group_alone_ms: f64,
    /// Wall time of the group's search divided by `beam_group`.
    pub beam_group_ms_per_search: f64,
    /// `beam_group_alone_ms / beam_group_ms_per_search`.
    pub beam_group_speedup: f64,
    /// Bytes allocated for the beam KV (capacities of the prompt's block
    /// arena and of the unshared beam buffer, both measured).
    pub beam_kv_bytes: usize,
    pub beam_kv_prompt_bytes: usize,
    pub beam_kv_unshared_bytes: usize,
    /// Peak of a simulated block-per-beam copy-on-write layout.
    pub beam_kv_bytes_baseline: usize,
    /// One copy of the prompt + BW × steps tokens (a lower bound).
    pub beam_kv_bytes_ideal: usize,
    pub beam_kv_overhead_vs_ideal: f64,
    /// Top-BW of BW × K candidates from the model's last decode step.
    pub topk_candidates: usize,
    /// Candidates the early-terminating selection offered to its heap, and
    /// the beams it took them from (of `beam_width`).
    pub topk_visited: usize,
    pub topk_beams_visited: usize,
    /// Early termination from unordered per-beam top-K lists, as the search
    /// serves it ([`crate::topk::TopBw::select_unordered`]): one scan for each beam's
    /// best, beams visited best first, a heap built in place per visited
    /// beam, and the sort of the BW selected.
    pub topk_early_termination_us: f64,
    /// The earlier way from the same lists: sort every list, then the heap
    /// over presorted lists ([`crate::topk::TopBw::sort_and_select`]).
    pub topk_sort_then_select_us: f64,
    /// Baseline: `select_nth_unstable` of all candidates, then a sort of
    /// the BW selected.
    pub topk_select_nth_us: f64,
    /// `topk_select_nth_us / topk_early_termination_us`.
    pub topk_early_termination_speedup: f64,
    /// Round-1 figures: the heap alone on presorted lists vs a full sort of
    /// all candidates.
    pub topk_presorted_heap_us: f64,
    pub topk_full_sort_us: f64,
    pub topk_presorted_vs_full_sort_speedup: f64,
}

pub(crate) fn best_secs(reps: usize, mut f: impl FnMut()) -> f64 {
    (0..reps.max(1))
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Like [`best_secs`], but `setup` runs untimed on `state` before every
/// repetition (to restore inputs that `f` reorders in place).
fn best_secs_with_setup<T: ?Sized>(
    reps: usize,
    state: &mut T,
    mut setup: impl FnMut(&mut T),
    mut f: impl FnMut(&mut T),
) -> f64 {
    (0..reps.max(1))
        .map(|_| {
            setup(state);
            let t = Instant::now();
            f(state);
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

/// Deterministic pseudo-random rows in [-1, 1).
pub(crate) fn rows(n: usize, d: usize, seed: u64) -> Vec<f32> {
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
pub(crate) fn shuffled(n: usize, seed: u64) -> Vec<u32> {
    let mut ids: Vec<u32> = (0..n as u32).collect();
    let r = rows(n, 1, seed);
    for i in (1..n).rev() {
        let j = (((r[i] + 1.0) * 0.5 * (i + 1) as f32) as usize).min(i);
        ids.swap(i, j);
    }
    ids
}

/// This machine's one-core f32 GEMM rate: the best of the default shapes,
/// two repetitions each. Benches print it beside their absolute figures.
pub fn gemm_peak_gflops() -> f64 {
    gemm_rates(&crate::CpuBackend::new(1), &DEFAULT_GEMM_SHAPES, 2)
        .iter()
        .map(|r| r.gflops)
        .fold(0.0, f64::max)
}

/// GFLOP/s of each GEMM shape on `be` (best of `reps`).
pub fn gemm_rates(be: &dyn Backend, shapes: &[[usize; 3]], reps: usize) -> Vec<GemmRate> {
    shapes
        .iter()
        .map(|&[m, n, k]| {
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
            GemmRate {
                m,
                n,
                k,
                gflops: 2.0 * (m * n * k) as f64 / secs / 1e9,
            }
        })
        .collect()
}

/// Refuses options that leave a figure nothing to measure, naming the
/// CLI flag.
fn check(opts: &BenchOptions) -> Result<(), KernelError> {
    if opts.prefill_tokens < 10 {
        return Err(KernelError::InvalidConfig(format!(
            "prefill tokens (--prefill-tokens) {} < 10 leave no 10% suffix to time",
            opts.prefill_tokens
        )));
    }
    if opts.beam_width == 0 {
        return Err(KernelError::InvalidConfig(
            "beam width (--beam-width) must be >= 1".into(),
        ));
    }
    if opts.codebook_size < 32.max(opts.beam_width) || opts.codebook_size > MAX_CODEBOOK {
        return Err(KernelError::InvalidConfig(format!(
            "codebook size (--codebook-size) {} must be in max(32, beam width {})..={MAX_CODEBOOK}",
            opts.codebook_size, opts.beam_width
        )));
    }
    if opts.gemm_shapes.is_empty() || opts.gemm_shapes.iter().any(|s| s.contains(&0)) {
        return Err(KernelError::InvalidConfig(
            "gemm_shapes must name at least one shape with m, n, k >= 1".into(),
        ));
    }
    Ok(())
}

/// Runs every measurement.
pub fn run(opts: &BenchOptions) -> Result<BenchReport, KernelError> {
    check(opts)?;
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new(opts.threads));
    let gemm_shapes = gemm_rates(backend.as_ref(), &opts.gemm_shapes, opts.reps);
    let best =
        gemm_shapes.iter().copied().fold(
            gemm_shapes[0],
            |a, b| if b.gflops > a.gflops { b } else { a },
        );
    let gemm = best.gflops;
    let prefill = model::prefill(&backend, opts.prefill_tokens, opts.reps)?;
    let rank = model::small_rank(&backend, opts.reps)?;
    let bw = opts.beam_width;
    let wide = beam::wide_search(
        &backend,
        bw,
        opts.codebook_size,
        opts.beam_prompt,
        opts.reps,
    )?;
    let beam_rows = wide.search.rows_per_step();
    let (group_alone_ms, group_ms_per_search) = beam::group_ms(&backend, opts.reps)?;
    let kv = wide.kv_bytes();
    let (last, stride, lens) = wide.search.last_candidates();
    let top = topk::top_k(last, stride, lens, bw, opts.reps * 10)?;
    let att = attention::attention(&backend, &wide, opts.reps)?;

    Ok(BenchReport {
        threads: opts.threads,
        backend: backend.name().to_string(),
        gemm_gflops: gemm,
        gemm_shape: [best.m, best.n, best.k],
        gemm_shapes,
        prefill_model: "hstu-3l".into(),
        prefill_tokens: opts.prefill_tokens,
        prefill_ms: prefill.full_s * 1e3,
        prefill_gflops: prefill.gflops,
        prefill_fraction_of_gemm: prefill.gflops / gemm,
        prefix_reuse_suffix_ms: prefill.suffix_s * 1e3,
        prefix_reuse_speedup: prefill.full_s / prefill.suffix_s,
        small_rank_request_ms: rank.request_s * 1e3,
        small_rank_1000_candidates_ms: rank.thousand_candidates_s * 1e3,
        staged_attention_prompt: wide.prompt,
        staged_attention_ms: att.staged_s * 1e3,
        per_beam_attention_ms: att.per_beam_s * 1e3,
        staged_attention_speedup: att.per_beam_s / att.staged_s,
        concat_attention_ms: att.concat_s * 1e3,
        staged_attention_speedup_vs_copy: att.concat_s / att.staged_s,
        beam_width: bw,
        beam_top_k: bw,
        beam_prompt: wide.prompt,
        beam_search_ms: wide.secs * 1e3,
        beam_search_gflops: beam_search_rows_flops(&wide.cfg, wide.prompt, &beam_rows)
            / wide.secs
            / 1e9,
        beam_search_rows: beam_rows,
        beam_group: beam::BEAM_GROUP,
        beam_group_alone_ms: group_alone_ms,
        beam_group_ms_per_search: group_ms_per_search,
        beam_group_speedup: group_alone_ms / group_ms_per_search.max(1e-12),
        beam_kv_bytes: kv.measured(),
        beam_kv_prompt_bytes: kv.prompt,
        beam_kv_unshared_bytes: kv.unshared,
        beam_kv_bytes_baseline: kv.layouts.paged_baseline,
        beam_kv_bytes_ideal: kv.layouts.ideal,
        beam_kv_overhead_vs_ideal: kv.measured() as f64 / kv.layouts.ideal as f64 - 1.0,
        topk_candidates: top.candidates,
        topk_visited: top.visited,
        topk_beams_visited: top.beams_visited,
        topk_early_termination_us: top.early_s * 1e6,
        topk_sort_then_select_us: top.sort_then_select_s * 1e6,
        topk_select_nth_us: top.select_nth_s * 1e6,
        topk_early_termination_speedup: top.select_nth_s / top.early_s,
        topk_presorted_heap_us: top.presorted_heap_s * 1e6,
        topk_full_sort_us: top.full_sort_s * 1e6,
        topk_presorted_vs_full_sort_speedup: top.full_sort_s / top.presorted_heap_s,
    })
}

#[cfg(test)]
mod tests {
    use super::beam::codes;
    use super::*;

    #[test]
    fn codes_cover_the_largest_codebook() {
        assert_eq!(codes(32).collect::<Vec<_>>(), (0..32).collect::<Vec<u16>>());
        // 65536 as u16 is 0: the range must not wrap to empty.
        assert_eq!(codes(MAX_CODEBOOK).count(), MAX_CODEBOOK);
        assert_eq!(codes(MAX_CODEBOOK).last(), Some(u16::MAX));
    }

    #[test]
    fn bad_options_name_their_flags() {
        let bad = |opts: BenchOptions| run(&opts).unwrap_err().to_string();
        let err = bad(BenchOptions {
            prefill_tokens: 5,
            ..BenchOptions::default()
        });
        assert!(err.contains("--prefill-tokens"), "{err}");
        let err = bad(BenchOptions {
            codebook_size: MAX_CODEBOOK + 1,
            ..BenchOptions::default()
        });
        assert!(
            err.contains("--codebook-size") && err.contains("65536"),
            "{err}"
        );
        let err = bad(BenchOptions {
            beam_width: 0,
            ..BenchOptions::default()
        });
        assert!(err.contains("--beam-width"), "{err}");
    }
}
