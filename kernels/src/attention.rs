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
    /// themselves (BAT: items masked from each other); later tokens are causal.
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

/// Reusable buffers of [`attend`].
#[derive(Debug, Default)]
pub(crate) struct AttnScratch {
    scores: Vec<f32>,
}

/// `out (n × d) = softmax(Q Kᵀ/√dh) V` per head, where queries are the `n`
/// rows of `q` (row stride `q_rs`), keys/values are `kall`/`vall`
/// (`(c + n) × d`: `c` context rows visible to all, then the `n` local rows
/// under `mask`).
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
    let (d, dh) = (cfg.d_model, cfg.head_dim());
    let scale = 1.0 / (dh as f32).sqrt();
    let tile = Q_TILE.min(n.max(1));
    scratch.scores.resize(tile * (c + n), 0.0);
    for r0 in (0..n).step_by(tile) {
        let r1 = (r0 + tile).min(n);
        let rows = r1 - r0;
        let lim = c + r1;
        for h in 0..cfg.n_heads {
            let s = &mut scratch.scores[..rows * lim];
            be.matmul(
                MatMut::row_major(s, rows, lim),
                MatRef::new(&q[r0 * q_rs + h * dh..], rows, dh, q_rs, 1),
                MatRef::new(&kall[h * dh..], dh, lim, 1, d),
                scale,
                false,
            );
            for ri in 0..rows {
                let i = r0 + ri;
                let row = &mut s[ri * lim..(ri + 1) * lim];
                match mask {
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
                    _ => {
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
            be.matmul(
                MatMut::new(&mut out[r0 * d + h * dh..], rows, dh, d, 1),
                MatRef::row_major(s, rows, lim),
                MatRef::new(&vall[h * dh..], lim, dh, d, 1),
                1.0,
                false,
            );
        }
    }
}
