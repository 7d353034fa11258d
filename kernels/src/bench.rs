//! Measurements behind `grflow bench kernels`: GEMM peak, paged prefill,
//! prefix reuse, staged attention, beam KV bytes and early-terminating
//! top-BW. Pure computation and timing; the CLI prints the report.

use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;

use crate::backend::{Backend, CpuBackend, MatMut, MatRef};
use crate::beam::{BeamPrompt, BeamSearch, SID_STEPS, beam_kv_bytes};
use crate::config::ModelConfig;
use crate::error::KernelError;
use crate::flops::{beam_search_rows_flops, prefill_flops};
use crate::kv_store::VecKvStore;
use crate::model::GrModel;
use crate::staged::{
    SharedPrompt, StagedScratch, UnsharedKv, concat_attention, per_beam_attention, staged_attention,
};
use crate::topk::{Candidate, TopBw, select_full_sort, select_nth_then_sort, sort_beam};
use crate::trie::SidTrie;

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
    /// ([`BeamSearch::rows_per_step`]).
    pub beam_search_rows: [usize; SID_STEPS],
    /// Searches decoded together ([`BeamSearch::generate_many`]), as a
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
    /// serves it ([`TopBw::select_unordered`]): one scan for each beam's
    /// best, beams visited best first, a heap built in place per visited
    /// beam, and the sort of the BW selected.
    pub topk_early_termination_us: f64,
    /// The earlier way from the same lists: sort every list, then the heap
    /// over presorted lists ([`TopBw::sort_and_select`]).
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

/// Shuffles each beam's valid candidates (deterministically), standing in
/// for the unordered top-K that `select_nth_unstable` leaves per beam.
fn unordered(cands: &[Candidate], stride: usize, lens: &[usize]) -> Vec<Candidate> {
    let mut out = cands.to_vec();
    for (b, &len) in lens.iter().enumerate() {
        let beam = &mut out[b * stride..b * stride + len];
        for (i, j) in shuffled(len, 13 + b as u64).into_iter().enumerate() {
            beam[i] = cands[b * stride + j as usize];
        }
    }
    out
}

/// Searches per group in the grouped beam measurement.
const BEAM_GROUP: usize = 4;

/// One search alone and `BEAM_GROUP` searches decoded together at the
/// serving default (`hstu-3l`, BW = K = 32, 64-token prompt): ms of the
/// search alone, and ms of the group per search.
fn beam_group_ms(backend: Arc<dyn Backend>, reps: usize) -> Result<(f64, f64), KernelError> {
    let cfg = ModelConfig::preset("hstu-3l").expect("hstu-3l preset");
    let (bw, prompt) = (32, 64);
    let model = GrModel::try_new(cfg.clone(), 12)?.with_backend(backend);
    let mut store = VecKvStore::new(cfg.blocks_for(prompt), cfg.kv_block_floats());
    let table = shuffled(cfg.blocks_for(prompt), 13);
    model.prefill(&mut store, &table, 0, &rows(prompt, cfg.d_model, 14))?;
    let catalog: Vec<[u16; 3]> = (0..32u16)
        .flat_map(|a| (0..32u16).flat_map(move |b| (0..32u16).map(move |x| [a, b, x * 31])))
        .collect();
    let trie = SidTrie::new(&catalog, cfg.codebook_size)?;
    let prompts = [BeamPrompt {
        block_table: &table,
        prompt_len: prompt,
    }; BEAM_GROUP];
    let mut searches: Vec<BeamSearch> = (0..BEAM_GROUP)
        .map(|_| BeamSearch::new(&cfg, bw, bw, prompt))
        .collect::<Result<_, _>>()?;
    let mut result = Ok(());
    let alone = best_secs(reps, || {
        result = BeamSearch::generate_many(&mut searches[..1], &model, &store, &prompts[..1], &trie)
    });
    std::mem::replace(&mut result, Ok(()))?;
    let group = best_secs(reps, || {
        result = BeamSearch::generate_many(&mut searches, &model, &store, &prompts, &trie)
    });
    result?;
    Ok((alone * 1e3, group * 1e3 / BEAM_GROUP as f64))
}

/// The largest codebook the benches accept: codes are u16.
pub const MAX_CODEBOOK: usize = 1 << 16;

/// The codes `0..c` of a codebook of `c <= MAX_CODEBOOK` (counted in u32,
/// so that `c = 65536` is not truncated to an empty range).
fn codes(c: usize) -> impl Iterator<Item = u16> {
    debug_assert!(c <= MAX_CODEBOOK);
    (0..c.min(MAX_CODEBOOK) as u32).map(|x| x as u16)
}

/// Runs every measurement.
pub fn run(opts: &BenchOptions) -> Result<BenchReport, KernelError> {
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
    let backend: Arc<dyn Backend> = Arc::new(CpuBackend::new(opts.threads));
    let gemm_shapes = gemm_rates(backend.as_ref(), &opts.gemm_shapes, opts.reps);
    let best =
        gemm_shapes.iter().copied().fold(
            gemm_shapes[0],
            |a, b| if b.gflops > a.gflops { b } else { a },
        );
    let gemm = best.gflops;

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
    let many = rows(1000, small.d_model, 13);
    let mut many_scores = Ok(Vec::new());
    let rank_many = best_secs(opts.reps * 3, || {
        many_scores = sm.rank_user_prefix(&sstore, &stable, 100, &many);
    });
    many_scores?;

    // Generative retrieval on `small` with a dense catalog (32 × 32 × C
    // items) so that every beam has >= K valid codes at the last step.
    let bw = opts.beam_width;
    let c = opts.codebook_size;
    let gcfg = ModelConfig {
        codebook_size: c,
        ..small.clone()
    };
    let gm = GrModel::try_new(gcfg.clone(), 8)?.with_backend(backend.clone());
    let beam_prompt = opts.beam_prompt;
    let mut gstore = VecKvStore::new(gcfg.blocks_for(beam_prompt), gcfg.kv_block_floats());
    let gtable = shuffled(gcfg.blocks_for(beam_prompt), 9);
    let gprompt = rows(beam_prompt, gcfg.d_model, 10);
    gm.prefill(&mut gstore, &gtable, 0, &gprompt)?;
    let catalog: Vec<[u16; 3]> = (0..32u16)
        .flat_map(|a| (0..32u16).flat_map(move |b| codes(c).map(move |x| [a, b, x])))
        .collect();
    let trie = SidTrie::new(&catalog, c)?;
    let mut search = BeamSearch::new(&gcfg, bw, bw, beam_prompt)?;
    let mut gen_result = Ok(());
    let beam_secs = best_secs(opts.reps, || {
        gen_result = search
            .generate(&gm, &gstore, &gtable, beam_prompt, &trie)
            .map(|_| ())
    });
    gen_result?;
    let beam_rows = search.rows_per_step();
    let (group_alone_ms, group_ms_per_search) = beam_group_ms(backend.clone(), opts.reps)?;
    // Bytes: the prompt's blocks and the unshared buffer as allocated; the
    // paged baseline and the ideal come from the search's actual forks.
    let kv = beam_kv_bytes(&gcfg, beam_prompt, bw, search.parents_per_step());
    let kv_prompt = gstore.allocated_bytes();
    let kv_unshared = search.unshared_kv_bytes();
    let kv_measured = kv_prompt + kv_unshared;

    // Top-BW on the model's last-step candidates. Every timed region
    // starts from the same unordered per-beam lists (the baseline's
    // contiguous) and ends with the BW selected in selection order.
    let (last, stride, lens) = search.last_candidates();
    // The search leaves its lists in no order; the presorted figures need
    // them sorted, the others start from a shuffle of each list.
    let mut cand = last.to_vec();
    for (b, &len) in lens.iter().enumerate() {
        sort_beam(&mut cand[b * stride..b * stride + len]);
    }
    let cand = &cand[..];
    let total: usize = lens.iter().sum();
    let loose = unordered(cand, stride, lens);
    let loose_all: Vec<Candidate> = lens
        .iter()
        .enumerate()
        .flat_map(|(b, &len)| loose[b * stride..b * stride + len].iter().copied())
        .collect();
    let mut top = TopBw::with_capacity(bw);
    let mut work = loose.clone();
    let mut all = loose_all.clone();
    let reps = opts.reps * 10;
    let early = best_secs_with_setup(
        reps,
        &mut work[..],
        |w| w.copy_from_slice(&loose),
        |w| {
            std::hint::black_box(top.select_unordered(w, stride, lens, bw));
        },
    );
    let sort_then_select = best_secs_with_setup(
        reps,
        &mut work[..],
        |w| w.copy_from_slice(&loose),
        |w| {
            std::hint::black_box(top.sort_and_select(w, stride, lens, bw));
        },
    );
    let nth = best_secs_with_setup(
        reps,
        &mut all[..],
        |a| a.copy_from_slice(&loose_all),
        |a| {
            std::hint::black_box(select_nth_then_sort(a, bw));
        },
    );
    all.copy_from_slice(&loose_all);
    let want = select_nth_then_sort(&mut all, bw).to_vec();
    work.copy_from_slice(&loose);
    if top.sort_and_select(&mut work, stride, lens, bw) != want {
        return Err(KernelError::Beam(
            "sort-then-select and select_nth disagree".into(),
        ));
    }
    work.copy_from_slice(&loose);
    if top.select_unordered(&mut work, stride, lens, bw) != want {
        return Err(KernelError::Beam(
            "early termination and select_nth disagree".into(),
        ));
    }
    let (visited, beams_visited) = (top.visited(), top.beams_visited());
    let presorted = best_secs(reps, || {
        std::hint::black_box(top.select(cand, stride, lens, bw));
    });
    let mut buf: Vec<Candidate> = Vec::with_capacity(total);
    let sorted = best_secs(reps, || {
        std::hint::black_box(select_full_sort(cand, stride, lens, bw, &mut buf));
    });

    // Staged vs per-beam decode attention, one layer, step 2.
    let cur = 2;
    let mut un = UnsharedKv::new(&gcfg, bw, SID_STEPS);
    let fill = rows(bw * SID_STEPS, gcfg.d_model, 11);
    for l in 0..gcfg.n_layers {
        for k in 0..2 {
            for b in 0..bw {
                for s in 0..cur {
                    let i = b * SID_STEPS + s;
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
    let mut beam_scores = vec![0f32; beam_prompt + cur];
    let mut out_per_beam = vec![0f32; bw * gcfg.d_model];
    let per_beam = best_secs(opts.reps, || {
        per_beam_attention(
            backend.as_ref(),
            &gcfg,
            0,
            &q,
            gcfg.d_model,
            bw,
            shared,
            &un,
            cur,
            &mut beam_scores,
            &mut out_per_beam,
        )
    });
    let diff = out
        .iter()
        .zip(&out_per_beam)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, |m, d| if d.is_nan() || d > m { d } else { m });
    // A NaN (a kernel that produced one) fails too.
    if diff.is_nan() || diff > 1e-4 {
        return Err(KernelError::Beam(format!(
            "staged and per-beam attention differ by {diff}"
        )));
    }
    let concat = best_secs(opts.reps, || {
        concat_attention(&gcfg, 0, &q, gcfg.d_model, bw, shared, &un, cur, &mut out);
    });

    Ok(BenchReport {
        threads: opts.threads,
        backend: backend.name().to_string(),
        gemm_gflops: gemm,
        gemm_shape: [best.m, best.n, best.k],
        gemm_shapes,
        prefill_model: "hstu-3l".into(),
        prefill_tokens: n,
        prefill_ms: full * 1e3,
        prefill_gflops,
        prefill_fraction_of_gemm: prefill_gflops / gemm,
        prefix_reuse_suffix_ms: suffix * 1e3,
        prefix_reuse_speedup: full / suffix,
        small_rank_request_ms: rank * 1e3,
        small_rank_1000_candidates_ms: rank_many * 1e3,
        staged_attention_prompt: beam_prompt,
        staged_attention_ms: staged * 1e3,
        per_beam_attention_ms: per_beam * 1e3,
        staged_attention_speedup: per_beam / staged,
        concat_attention_ms: concat * 1e3,
        staged_attention_speedup_vs_copy: concat / staged,
        beam_width: bw,
        beam_top_k: bw,
        beam_prompt,
        beam_search_ms: beam_secs * 1e3,
        beam_search_gflops: beam_search_rows_flops(&gcfg, beam_prompt, &beam_rows)
            / beam_secs
            / 1e9,
        beam_search_rows: beam_rows,
        beam_group: BEAM_GROUP,
        beam_group_alone_ms: group_alone_ms,
        beam_group_ms_per_search: group_ms_per_search,
        beam_group_speedup: group_alone_ms / group_ms_per_search.max(1e-12),
        beam_kv_bytes: kv_measured,
        beam_kv_prompt_bytes: kv_prompt,
        beam_kv_unshared_bytes: kv_unshared,
        beam_kv_bytes_baseline: kv.paged_baseline,
        beam_kv_bytes_ideal: kv.ideal,
        beam_kv_overhead_vs_ideal: kv_measured as f64 / kv.ideal as f64 - 1.0,
        topk_candidates: total,
        topk_visited: visited,
        topk_beams_visited: beams_visited,
        topk_early_termination_us: early * 1e6,
        topk_sort_then_select_us: sort_then_select * 1e6,
        topk_select_nth_us: nth * 1e6,
        topk_early_termination_speedup: nth / early,
        topk_presorted_heap_us: presorted * 1e6,
        topk_full_sort_us: sorted * 1e6,
        topk_presorted_vs_full_sort_speedup: sorted / presorted,
    })
}

#[cfg(test)]
mod tests {
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
