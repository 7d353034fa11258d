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

/// One query tile starting at row `r0`; `out` holds exactly its rows.
fn attend_tile(a: AttnArgs<'_>, r0: usize, out: &mut [f32], scores: &mut [f32]) {
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
                LocalMask::ItemsThenCausal { n_items } if i < n_items => {
                    let own = row[c + i];
                    let m = row_max(&row[..c]).max(own);
                    let own = exp_neg(own - m);
                    let sum = exp_shift_sum(&mut row[..c], m) + own;
                    row[c..].fill(0.0);
                    row[c + i] = own;
                    let inv = 1.0 / sum;
                    row.iter_mut().for_each(|v| *v *= inv);
                }
                LocalMask::ItemsThenCausal { n_items } => {
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
