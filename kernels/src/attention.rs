//! Blocked multi-head softmax attention over `[context | local]` keys, and
//! the gather/scatter between paged KV blocks and contiguous rows.

use crate::backend::{Backend, MatMut, MatRef};
use crate::config::ModelConfig;
use crate::kv_store::KvBlockStore;
use crate::ops::{exp_neg, exp_shift_sum, row_max};

/// Query rows per attention tile: big enough for efficient GEMMs, small
/// enough that the causal triangle wastes little.
const Q_TILE: usize = 128;

/// Which local keys a local query sees (every query sees all context keys).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LocalMask {
    /// Query i sees local keys 0..=i.
    Causal,
    /// The first `n_items` local tokens are single-token items that see only
    /// themselves (BAT: items masked from each other); later tokens (the
    /// instruction) are causal among themselves but never see the items, so a
    /// candidate's score depends on the user and that candidate only.
    ItemsThenCausal { n_items: usize },
}

/// A run of cached tokens in paged blocks.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Segment<'a> {
    pub blocks: &'a [u32],
    pub len: usize,
}

/// Copies layer `layer`'s K (kv = 0) or V (kv = 1) rows of `seg` into `out`
/// (`seg.len × d`).
pub(crate) fn gather<S: KvBlockStore + ?Sized>(
    cfg: &ModelConfig,
    store: &S,
    seg: Segment<'_>,
    layer: usize,
    kv: usize,
    out: &mut [f32],
) {
    let (b, d) = (cfg.block_size, cfg.d_model);
    let mut t = 0;
    while t < seg.len {
        let run = (b - t % b).min(seg.len - t);
        let src = cfg.kv_offset(layer, kv, t % b);
        out[t * d..(t + run) * d]
            .copy_from_slice(&store.block(seg.blocks[t / b])[src..src + run * d]);
        t += run;
    }
}

/// Writes `n` token rows (`[layer][K|V][n][d]` in `kv`) at sequence
/// positions `start..start+n` of the block table.
pub(crate) fn scatter<S: KvBlockStore + ?Sized>(
    cfg: &ModelConfig,
    store: &mut S,
    blocks: &[u32],
    start: usize,
    n: usize,
    kv: &[f32],
) {
    let (b, d) = (cfg.block_size, cfg.d_model);
    for layer in 0..cfg.n_layers {
        for which in 0..2 {
            let src = &kv[(layer * 2 + which) * n * d..][..n * d];
            let mut i = 0;
            while i < n {
                let t = start + i;
                let run = (b - t % b).min(n - i);
                let dst = cfg.kv_offset(layer, which, t % b);
                store.block_mut(blocks[t / b])[dst..dst + run * d]
                    .copy_from_slice(&src[i * d..(i + run) * d]);
                i += run;
            }
        }
    }
}

/// Reusable buffers of [`attend`]: one score tile per thread.
#[derive(Debug, Default)]
pub(crate) struct AttnScratch {
    scores: Vec<Vec<f32>>,
}

/// The shared inputs of one attention call.
#[derive(Clone, Copy)]
struct AttnArgs<'a> {
    be: &'a dyn Backend,
    cfg: &'a ModelConfig,
    q: &'a [f32],
    q_rs: usize,
    kall: &'a [f32],
    vall: &'a [f32],
    c: usize,
    mask: LocalMask,
}

/// `out (n × d) = softmax(Q Kᵀ/√dh) V` per head, where queries are the `n`
/// rows of `q` (row stride `q_rs`), keys/values are `kall`/`vall`
/// (`(c + n) × d`: `c` context rows visible to all, then the `n` local rows
/// under `mask`). Query tiles are spread over the backend's threads
/// (round-robin, so the causal triangle's work is balanced).
#[allow(clippy::too_many_arguments)]
pub(crate) fn attend(
    be: &dyn Backend,
    cfg: &ModelConfig,
    q: &[f32],
    q_rs: usize,
    kall: &[f32],
    vall: &[f32],
    c: usize,
    n: usize,
    mask: LocalMask,
    scratch: &mut AttnScratch,
    out: &mut [f32],
) {
    let d = cfg.d_model;
    let tile = Q_TILE.min(n.max(1));
    let args = AttnArgs {
        be,
        cfg,
        q,
        q_rs,
        kall,
        vall,
        c,
        mask,
    };
    let tiles = n.div_ceil(tile);
    let threads = be.threads().min(tiles).max(1);
    scratch.scores.resize_with(threads, Vec::new);
    for s in &mut scratch.scores {
        s.resize(tile * (c + n), 0.0);
    }
    if threads == 1 {
        for (t, rows_out) in out[..n * d].chunks_mut(tile * d).enumerate() {
            attend_tile(args, t * tile, rows_out, &mut scratch.scores[0]);
        }
        return;
    }
    let mut work: Vec<Vec<(usize, &mut [f32])>> = (0..threads).map(|_| Vec::new()).collect();
    for (t, rows_out) in out[..n * d].chunks_mut(tile * d).enumerate() {
        work[t % threads].push((t * tile, rows_out));
    }
    std::thread::scope(|scope| {
        for (jobs, scores) in work.into_iter().zip(scratch.scores.iter_mut()) {
            scope.spawn(move || {
                for (r0, rows_out) in jobs {
                    attend_tile(args, r0, rows_out, scores);
                }
            });
        }
    });
}

/// One query tile starting at row `r0`; `out` holds exactly its rows. Under
/// [`LocalMask::ItemsThenCausal`] the tile's item rows (before `n_items`)
/// and its later rows are computed apart: an item sees only the context and
/// itself, so its rows need no scores against the other local keys.
fn attend_tile(a: AttnArgs<'_>, r0: usize, out: &mut [f32], scores: &mut [f32]) {
    let d = a.cfg.d_model;
    let rows = out.len() / d;
    let items = match a.mask {
        LocalMask::ItemsThenCausal { n_items } => n_items.clamp(r0, r0 + rows) - r0,
        LocalMask::Causal => 0,
    };
    let (item_out, rest_out) = out.split_at_mut(items * d);
    if items > 0 {
        attend_items(a, r0, item_out, scores);
    }
    if items < rows {
        attend_rows(a, r0 + items, rest_out, scores);
    }
}

/// Item rows `r0..r0 + rows` of [`LocalMask::ItemsThenCausal`] (all before
/// `n_items`): each attends to the `c` context keys and its own key only,
/// `out_i = (P_ctx V_ctx + p_own v_i)` with `(P_ctx, p_own)` the softmax
/// over its `c + 1` scores. One `rows × c` GEMM per head for the context
/// scores, one dot product per row for its own; O(rows · (c + 1)).
fn attend_items(a: AttnArgs<'_>, r0: usize, out: &mut [f32], scores: &mut [f32]) {
    let (cfg, c) = (a.cfg, a.c);
    let (d, dh) = (cfg.d_model, cfg.head_dim());
    let scale = 1.0 / (dh as f32).sqrt();
    let rows = out.len() / d;
    let (s, own) = scores[..rows * (c + 1)].split_at_mut(rows * c);
    for h in 0..cfg.n_heads {
        if c > 0 {
            a.be.matmul(
                MatMut::row_major(s, rows, c),
                MatRef::new(&a.q[r0 * a.q_rs + h * dh..], rows, dh, a.q_rs, 1),
                MatRef::new(&a.kall[h * dh..], dh, c, 1, d),
                scale,
                false,
            );
        }
        for (ri, p_own) in own.iter_mut().enumerate() {
            let i = r0 + ri;
            let qi = &a.q[i * a.q_rs + h * dh..][..dh];
            let ki = &a.kall[(c + i) * d + h * dh..][..dh];
            let own_score = dot(qi, ki) * scale;
            let row = &mut s[ri * c..(ri + 1) * c];
            let m = row_max(row).max(own_score);
            let e_own = exp_neg(own_score - m);
            let inv = 1.0 / (exp_shift_sum(row, m) + e_own);
            row.iter_mut().for_each(|v| *v *= inv);
            *p_own = e_own * inv;
        }
        if c > 0 {
            a.be.matmul(
                MatMut::new(&mut out[h * dh..], rows, dh, d, 1),
                MatRef::row_major(s, rows, c),
                MatRef::new(&a.vall[h * dh..], c, dh, d, 1),
                1.0,
                false,
            );
        }
        for (ri, &p_own) in own.iter().enumerate() {
            let vi = &a.vall[(c + r0 + ri) * d + h * dh..][..dh];
            let o = &mut out[ri * d + h * dh..][..dh];
            if c > 0 {
                o.iter_mut().zip(vi).for_each(|(o, v)| *o += p_own * v);
            } else {
                o.iter_mut().zip(vi).for_each(|(o, v)| *o = p_own * v);
            }
        }
    }
}

/// `⟨a, b⟩` in eight independent lanes, so that it vectorises.
#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let (ac, at) = a.split_at(a.len() / 8 * 8);
    let (bc, bt) = b.split_at(ac.len());
    for (x, y) in ac.chunks_exact(8).zip(bc.chunks_exact(8)) {
        for ((s, x), y) in acc.iter_mut().zip(x).zip(y) {
            *s += x * y;
        }
    }
    let tail: f32 = at.iter().zip(bt).map(|(x, y)| x * y).sum();
    acc.iter().sum::<f32>() + tail
}

/// Rows `r0..r0 + rows` that see every context key and, under the mask, the
/// local keys up to their own: scores against the first `c + r0 + rows` keys
/// (the hidden ones zeroed) and one P·V product per head. Under
/// [`LocalMask::ItemsThenCausal`] only rows at or after `n_items` come here.
fn attend_rows(a: AttnArgs<'_>, r0: usize, out: &mut [f32], scores: &mut [f32]) {
    let (cfg, c) = (a.cfg, a.c);
    let (d, dh) = (cfg.d_model, cfg.head_dim());
    let scale = 1.0 / (dh as f32).sqrt();
    let rows = out.len() / d;
    let lim = c + r0 + rows;
    for h in 0..cfg.n_heads {
        let s = &mut scores[..rows * lim];
        a.be.matmul(
            MatMut::row_major(s, rows, lim),
            MatRef::new(&a.q[r0 * a.q_rs + h * dh..], rows, dh, a.q_rs, 1),
            MatRef::new(&a.kall[h * dh..], dh, lim, 1, d),
            scale,
            false,
        );
        for ri in 0..rows {
            let i = r0 + ri;
            let row = &mut s[ri * lim..(ri + 1) * lim];
            match a.mask {
                LocalMask::ItemsThenCausal { n_items } => {
                    debug_assert!(i >= n_items, "item rows go through attend_items");
                    // Context and local tokens n_items..=i; the items are hidden.
                    let (ctx, rest) = row.split_at_mut(c);
                    let (items, rest) = rest.split_at_mut(n_items);
                    let seen = &mut rest[..i + 1 - n_items];
                    let m = row_max(ctx).max(row_max(seen));
                    let sum = exp_shift_sum(ctx, m) + exp_shift_sum(seen, m);
                    let inv = 1.0 / sum;
                    ctx.iter_mut().for_each(|v| *v *= inv);
                    seen.iter_mut().for_each(|v| *v *= inv);
                    items.fill(0.0);
                    rest[i + 1 - n_items..].fill(0.0);
                }
                LocalMask::Causal => {
                    let vis = c + i + 1;
                    let (seen, hidden) = row.split_at_mut(vis);
                    let m = row_max(seen);
                    let sum = exp_shift_sum(seen, m);
                    let inv = 1.0 / sum;
                    seen.iter_mut().for_each(|v| *v *= inv);
                    hidden.fill(0.0);
                }
            }
        }
        a.be.matmul(
            MatMut::new(&mut out[h * dh..], rows, dh, d, 1),
            MatRef::row_major(s, rows, lim),
            MatRef::new(&a.vall[h * dh..], lim, dh, d, 1),
            1.0,
            false,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::CpuBackend;

    /// A config with `n_heads` heads of width 16.
    fn cfg(n_heads: usize) -> ModelConfig {
        ModelConfig {
            d_model: 16 * n_heads,
            n_heads,
            ..ModelConfig::preset("small").unwrap()
        }
    }

    /// Deterministic values in [-amp, amp].
    fn fill(len: usize, seed: u32, amp: f32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                let h = (i as u32 ^ seed.wrapping_mul(0x9e37_79b9)).wrapping_mul(0x85eb_ca6b);
                let h = (h ^ (h >> 13)).wrapping_mul(0xc2b2_ae35);
                amp * ((h >> 8) as f32 / (1u32 << 24) as f32 * 2.0 - 1.0)
            })
            .collect()
    }

    /// Whether local query `i` sees local key `j` under `mask`.
    fn sees(mask: LocalMask, i: usize, j: usize) -> bool {
        match mask {
            LocalMask::Causal => j <= i,
            LocalMask::ItemsThenCausal { n_items } if i < n_items => j == i,
            LocalMask::ItemsThenCausal { n_items } => (n_items..=i).contains(&j),
        }
    }

    /// Naive attention in f64: every query row against every key it sees.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        cfg: &ModelConfig,
        q: &[f32],
        q_rs: usize,
        kall: &[f32],
        vall: &[f32],
        c: usize,
        n: usize,
        mask: LocalMask,
    ) -> Vec<f32> {
        let (d, dh) = (cfg.d_model, cfg.head_dim());
        let scale = 1.0 / (dh as f64).sqrt();
        let mut out = vec![0f32; n * d];
        for i in 0..n {
            for h in 0..cfg.n_heads {
                let keys: Vec<usize> = (0..c)
                    .chain((0..n).filter(|&j| sees(mask, i, j)).map(|j| c + j))
                    .collect();
                let s: Vec<f64> = keys
                    .iter()
                    .map(|&k| {
                        (0..dh)
                            .map(|t| {
                                q[i * q_rs + h * dh + t] as f64 * kall[k * d + h * dh + t] as f64
                            })
                            .sum::<f64>()
                            * scale
                    })
                    .collect();
                let m = s.iter().copied().fold(f64::NEG_INFINITY, f64::max);
                let e: Vec<f64> = s.iter().map(|v| (v - m).exp()).collect();
                let sum: f64 = e.iter().sum();
                for t in 0..dh {
                    let o: f64 = keys
                        .iter()
                        .zip(&e)
                        .map(|(&k, p)| p * vall[k * d + h * dh + t] as f64)
                        .sum();
                    out[i * d + h * dh + t] = (o / sum) as f32;
                }
            }
        }
        out
    }

    /// `attend` against [`naive`] for one shape; the worst error relative
    /// to the largest output value.
    fn check(c: usize, n: usize, mask: LocalMask, n_heads: usize, threads: usize) {
        let cfg = cfg(n_heads);
        let d = cfg.d_model;
        let seed = (c * 1000 + n * 10 + n_heads) as u32;
        // Queries laid out as the forward pass lays them: rows of [Q | K | V].
        let q = fill(n * 3 * d, seed, 3.0);
        let kall = fill((c + n) * d, seed + 1, 3.0);
        let vall = fill((c + n) * d, seed + 2, 1.0);
        let be = CpuBackend::new(threads);
        let mut scratch = AttnScratch::default();
        let mut got = vec![f32::NAN; n * d];
        attend(
            &be,
            &cfg,
            &q,
            3 * d,
            &kall,
            &vall,
            c,
            n,
            mask,
            &mut scratch,
            &mut got,
        );
        let want = naive(&cfg, &q, 3 * d, &kall, &vall, c, n, mask);
        let top = want.iter().fold(0f32, |m, v| m.max(v.abs()));
        let worst = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs())
            // NaN-propagating: `got` starts as NaN, so an output never
            // written must fail (`f32::max` would drop it).
            .fold(0f32, |m, d| if d.is_nan() || d > m { d } else { m });
        assert!(
            worst <= 1e-5 * top,
            "c {c}, n {n}, {mask:?}, {n_heads} heads, {threads} threads: \
             worst error {worst} against outputs up to {top}"
        );
    }

    /// Candidate rows attend to the context and themselves only (computed
    /// in O(c + 1) each); the rows after them see the context and the
    /// local rows from `n_items` on. Equal to naive attention for item-only
    /// requests, no context, tiles that straddle `n_items` (a tile is 128
    /// rows) and several threads.
    #[test]
    fn items_then_causal_matches_naive_attention() {
        let items = |n_items| LocalMask::ItemsThenCausal { n_items };
        for (c, n_items, n, heads, threads) in [
            (0, 1, 1, 1, 1),
            (0, 5, 5, 2, 1),
            (0, 3, 6, 2, 1),
            (9, 7, 7, 2, 1),
            (9, 7, 8, 4, 1),
            (33, 127, 129, 2, 1),
            (33, 128, 129, 2, 1),
            (40, 200, 203, 4, 1),
            (17, 300, 301, 2, 3),
            (0, 260, 300, 2, 2),
            (50, 140, 390, 1, 4),
        ] {
            check(c, n, items(n_items), heads, threads);
        }
    }

    #[test]
    fn causal_matches_naive_attention() {
        for (c, n, heads, threads) in [(0, 5, 2, 1), (12, 140, 2, 1), (7, 300, 4, 3)] {
            check(c, n, LocalMask::Causal, heads, threads);
        }
    }

    #[test]
    fn dot_matches_a_plain_sum_for_any_length() {
        for len in [0, 1, 7, 8, 9, 16, 23, 64] {
            let (a, b) = (fill(len, 1, 1.0), fill(len, 2, 1.0));
            let want: f32 = a.iter().zip(&b).map(|(x, y)| x * y).sum();
            assert!((dot(&a, &b) - want).abs() < 1e-5, "len {len}");
        }
    }
}
