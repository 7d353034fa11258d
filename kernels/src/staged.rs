//! xGR KV separation (§5): the prompt's KV is shared by every beam and read
//! once per step from its paged blocks; each beam's generated tokens live in
//! an unshared buffer of exactly BW × steps tokens updated in place when
//! beams fork. Attention runs in stages (shared, unshared) merged by online
//! softmax, never building a per-beam concatenated KV.

use crate::attention::Segment;
use crate::backend::{Backend, MatMut, MatRef};
use crate::config::ModelConfig;
use crate::kv_store::KvBlockStore;
use crate::ops::{exp_neg, exp_shift_sum, row_max};

/// Per-beam KV of generated tokens, token-granular, layout
/// `[layer][K|V][beam][step][d]`.
#[derive(Clone, Debug)]
pub struct UnsharedKv {
    buf: Vec<f32>,
    bw: usize,
    steps: usize,
    d: usize,
}

impl UnsharedKv {
    /// Room for `bw` beams × `steps` tokens in every layer.
    pub fn new(cfg: &ModelConfig, bw: usize, steps: usize) -> Self {
        Self {
            buf: vec![0.0; cfg.n_layers * 2 * bw * steps * cfg.d_model],
            bw,
            steps,
            d: cfg.d_model,
        }
    }

    /// Bytes of the buffer actually allocated (its capacity), which is
    /// BW × steps tokens of KV.
    pub fn allocated_bytes(&self) -> usize {
        self.buf.capacity() * std::mem::size_of::<f32>()
    }

    /// K (`kv = 0`) or V rows `0..len` of `beam` in `layer`, contiguous
    /// (`len × d`), read in place.
    pub fn rows(&self, layer: usize, kv: usize, beam: usize, len: usize) -> &[f32] {
        let o = self.base(layer, kv, beam);
        &self.buf[o..o + len * self.d]
    }

    fn base(&self, layer: usize, kv: usize, beam: usize) -> usize {
        (((layer * 2 + kv) * self.bw + beam) * self.steps) * self.d
    }

    /// K (`kv = 0`) or V row of `beam`'s token `step` in `layer`.
    pub fn row(&self, layer: usize, kv: usize, beam: usize, step: usize) -> &[f32] {
        let o = self.base(layer, kv, beam) + step * self.d;
        &self.buf[o..o + self.d]
    }

    pub fn row_mut(&mut self, layer: usize, kv: usize, beam: usize, step: usize) -> &mut [f32] {
        let o = self.base(layer, kv, beam) + step * self.d;
        &mut self.buf[o..o + self.d]
    }

    /// In-place fork: new beam `i` takes the first `len` tokens of old beam
    /// `parents[i]`. `parents` must be non-decreasing (the caller orders the
    /// selected beams by parent). Direct indices (xGR Fig. 8): the rows whose
    /// parent is at or after them are written first in ascending order, then
    /// the rest in descending order, so no row is overwritten before it is
    /// read.
    pub fn fork_in_place(&mut self, parents: &[u32], len: usize) {
        debug_assert!(
            parents.windows(2).all(|w| w[0] <= w[1]),
            "parents must be sorted"
        );
        let n_layers = self.buf.len() / (2 * self.bw * self.steps * self.d).max(1);
        let span = len * self.d;
        let copy = |this: &mut Self, i: usize| {
            let p = parents[i] as usize;
            if p == i {
                return;
            }
            for layer in 0..n_layers {
                for kv in 0..2 {
                    let (src, dst) = (this.base(layer, kv, p), this.base(layer, kv, i));
                    this.buf.copy_within(src..src + span, dst);
                }
            }
        };
        for (i, &p) in parents.iter().enumerate() {
            if p as usize >= i {
                copy(self, i);
            }
        }
        for i in (0..parents.len()).rev() {
            if (parents[i] as usize) < i {
                copy(self, i);
            }
        }
    }
}

/// Preallocated buffers of [`staged_attention`].
#[derive(Clone, Debug)]
pub struct StagedScratch {
    scores: Vec<f32>,
    o_shared: Vec<f32>,
    m_shared: Vec<f32>,
    l_shared: Vec<f32>,
}

impl StagedScratch {
    /// For up to `bw` beams over prompts of up to `max_prompt` tokens.
    pub fn new(cfg: &ModelConfig, bw: usize, max_prompt: usize) -> Self {
        Self {
            scores: vec![0.0; bw * max_prompt],
            o_shared: vec![0.0; bw * cfg.d_model],
            m_shared: vec![0.0; bw * cfg.n_heads],
            l_shared: vec![0.0; bw * cfg.n_heads],
        }
    }

    /// Largest prompt this scratch serves for `bw` beams.
    pub fn max_prompt(&self, bw: usize) -> usize {
        self.scores.len() / bw.max(1)
    }
}

/// The shared prompt: `len` tokens in paged `blocks` of `store`.
#[derive(Debug)]
pub struct SharedPrompt<'a, S: KvBlockStore + ?Sized> {
    pub store: &'a S,
    pub blocks: &'a [u32],
    pub len: usize,
}

impl<S: KvBlockStore + ?Sized> Clone for SharedPrompt<'_, S> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<S: KvBlockStore + ?Sized> Copy for SharedPrompt<'_, S> {}

/// Staged decode attention for layer `layer`: `nb` beam queries (rows of
/// `q`, stride `q_rs`) over the shared prompt (one GEMM per block for all
/// beams) and each beam's first `cur` unshared tokens, merged by online
/// softmax into `out` (`nb × d`). Allocates nothing beyond the backend.
#[allow(clippy::too_many_arguments)]
pub fn staged_attention<S: KvBlockStore + ?Sized>(
    be: &dyn Backend,
    cfg: &ModelConfig,
    layer: usize,
    q: &[f32],
    q_rs: usize,
    nb: usize,
    shared: SharedPrompt<'_, S>,
    unshared: &UnsharedKv,
    cur: usize,
    scratch: &mut StagedScratch,
    out: &mut [f32],
) {
    let (d, dh, b, p) = (cfg.d_model, cfg.head_dim(), cfg.block_size, shared.len);
    let scale = 1.0 / (dh as f32).sqrt();
    let hn = cfg.n_heads;
    assert!(
        p <= scratch.max_prompt(nb),
        "scratch too small for the prompt"
    );
    // Shared stage: local max, sum and unnormalised output per (beam, head).
    for h in 0..hn {
        let mut t0 = 0;
        while t0 < p {
            let run = (b - t0 % b).min(p - t0);
            let block = shared.store.block(shared.blocks[t0 / b]);
            let koff = cfg.kv_offset(layer, 0, t0 % b) + h * dh;
            be.matmul(
                MatMut::new(&mut scratch.scores[t0..], nb, run, p, 1),
                MatRef::new(&q[h * dh..], nb, dh, q_rs, 1),
                MatRef::new(&block[koff..], dh, run, 1, d),
                scale,
                false,
            );
            t0 += run;
        }
        for i in 0..nb {
            let row = &mut scratch.scores[i * p..(i + 1) * p];
            let m = row_max(row);
            let l = exp_shift_sum(row, m);
            scratch.m_shared[i * hn + h] = m;
            scratch.l_shared[i * hn + h] = l;
        }
        if p == 0 {
            for i in 0..nb {
                scratch.o_shared[i * d + h * dh..i * d + (h + 1) * dh].fill(0.0);
            }
        }
        let mut t0 = 0;
        while t0 < p {
            let run = (b - t0 % b).min(p - t0);
            let block = shared.store.block(shared.blocks[t0 / b]);
            let voff = cfg.kv_offset(layer, 1, t0 % b) + h * dh;
            be.matmul(
                MatMut::new(&mut scratch.o_shared[h * dh..], nb, dh, d, 1),
                MatRef::new(&scratch.scores[t0..], nb, run, p, 1),
                MatRef::new(&block[voff..], run, dh, d, 1),
                1.0,
                t0 > 0,
            );
            t0 += run;
        }
    }
    // Unshared stage and online-softmax merge, per beam and head.
    let mut s = [0f32; MAX_STEPS];
    for i in 0..nb {
        for h in 0..hn {
            let qh = &q[i * q_rs + h * dh..i * q_rs + (h + 1) * dh];
            let mut m2 = f32::NEG_INFINITY;
            for (j, sj) in s.iter_mut().enumerate().take(cur) {
                let k = &unshared.row(layer, 0, i, j)[h * dh..(h + 1) * dh];
                *sj = qh.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
                m2 = m2.max(*sj);
            }
            let m1 = scratch.m_shared[i * hn + h];
            let m = m1.max(m2);
            let a1 = if p == 0 { 0.0 } else { exp_neg(m1 - m) };
            let mut denom = a1 * scratch.l_shared[i * hn + h];
            let o = &mut out[i * d + h * dh..i * d + (h + 1) * dh];
            for (ot, os) in o.iter_mut().zip(&scratch.o_shared[i * d + h * dh..]) {
                *ot = a1 * os;
            }
            for (j, sj) in s.iter().enumerate().take(cur) {
                let e = exp_neg(sj - m);
                denom += e;
                let v = &unshared.row(layer, 1, i, j)[h * dh..(h + 1) * dh];
                for (ot, vt) in o.iter_mut().zip(v) {
                    *ot += e * vt;
                }
            }
            let inv = 1.0 / denom;
            o.iter_mut().for_each(|v| *v *= inv);
        }
    }
}

/// Decode steps the unshared stage supports (semantic IDs have 3 codes).
pub const MAX_STEPS: usize = 3;

/// The honest baseline of [`staged_attention`]: every beam attends on its
/// own over its logically concatenated KV `[prompt | beam's first cur
/// tokens]`, read in place (prompt rows from their paged blocks, beam rows
/// from `unshared`), with the same [`Backend::matmul`] for QKᵀ and PV and
/// the same `exp`. What it lacks is only the sharing: the prompt's KV is
/// read once per beam instead of once per step. `scores` needs at least
/// `shared.len + cur` floats. Allocates nothing beyond the backend.
#[allow(clippy::too_many_arguments)]
pub fn per_beam_attention<S: KvBlockStore + ?Sized>(
    be: &dyn Backend,
    cfg: &ModelConfig,
    layer: usize,
    q: &[f32],
    q_rs: usize,
    nb: usize,
    shared: SharedPrompt<'_, S>,
    unshared: &UnsharedKv,
    cur: usize,
    scores: &mut [f32],
    out: &mut [f32],
) {
    let (d, dh, b, p) = (cfg.d_model, cfg.head_dim(), cfg.block_size, shared.len);
    let scale = 1.0 / (dh as f32).sqrt();
    let n = p + cur;
    assert!(
        scores.len() >= n,
        "scores shorter than prompt + beam tokens"
    );
    let s = &mut scores[..n];
    for i in 0..nb {
        let (kb, vb) = (
            unshared.rows(layer, 0, i, cur),
            unshared.rows(layer, 1, i, cur),
        );
        for h in 0..cfg.n_heads {
            let qh = MatRef::new(&q[i * q_rs + h * dh..], 1, dh, q_rs, 1);
            let mut t0 = 0;
            while t0 < p {
                let run = (b - t0 % b).min(p - t0);
                let block = shared.store.block(shared.blocks[t0 / b]);
                let koff = cfg.kv_offset(layer, 0, t0 % b) + h * dh;
                be.matmul(
                    MatMut::new(&mut s[t0..], 1, run, n, 1),
                    qh,
                    MatRef::new(&block[koff..], dh, run, 1, d),
                    scale,
                    false,
                );
                t0 += run;
            }
            if cur > 0 {
                be.matmul(
                    MatMut::new(&mut s[p..], 1, cur, n, 1),
                    qh,
                    MatRef::new(&kb[h * dh..], dh, cur, 1, d),
                    scale,
                    false,
                );
            }
            let m = row_max(s);
            let inv = 1.0 / exp_shift_sum(s, m);
            s.iter_mut().for_each(|v| *v *= inv);
            let o = &mut out[i * d + h * dh..];
            let mut t0 = 0;
            while t0 < p {
                let run = (b - t0 % b).min(p - t0);
                let block = shared.store.block(shared.blocks[t0 / b]);
                let voff = cfg.kv_offset(layer, 1, t0 % b) + h * dh;
                be.matmul(
                    MatMut::new(o, 1, dh, d, 1),
                    MatRef::new(&s[t0..], 1, run, n, 1),
                    MatRef::new(&block[voff..], run, dh, d, 1),
                    1.0,
                    t0 > 0,
                );
                t0 += run;
            }
            if cur > 0 {
                be.matmul(
                    MatMut::new(o, 1, dh, d, 1),
                    MatRef::new(&s[p..], 1, cur, n, 1),
                    MatRef::new(&vb[h * dh..], cur, dh, d, 1),
                    1.0,
                    p > 0,
                );
            }
        }
    }
}

/// The round-1 baseline, kept as a second figure: for every beam,
/// materialise the concatenated KV `[prompt | beam's tokens]` (as a
/// per-beam paged layout reads it) and attend over it with scalar dot
/// products and libm `exp`. Returns the bytes of KV materialised.
#[allow(clippy::too_many_arguments)]
pub fn concat_attention<S: KvBlockStore + ?Sized>(
    cfg: &ModelConfig,
    layer: usize,
    q: &[f32],
    q_rs: usize,
    nb: usize,
    shared: SharedPrompt<'_, S>,
    unshared: &UnsharedKv,
    cur: usize,
    out: &mut [f32],
) -> usize {
    let (d, dh) = (cfg.d_model, cfg.head_dim());
    let scale = 1.0 / (dh as f32).sqrt();
    let n = shared.len + cur;
    let mut k = vec![0f32; n * d];
    let mut v = vec![0f32; n * d];
    let mut s = vec![0f32; n];
    let mut bytes = 0;
    for i in 0..nb {
        let seg = Segment {
            blocks: shared.blocks,
            len: shared.len,
        };
        crate::attention::gather(cfg, shared.store, seg, layer, 0, &mut k[..shared.len * d]);
        crate::attention::gather(cfg, shared.store, seg, layer, 1, &mut v[..shared.len * d]);
        for j in 0..cur {
            k[(shared.len + j) * d..(shared.len + j + 1) * d]
                .copy_from_slice(unshared.row(layer, 0, i, j));
            v[(shared.len + j) * d..(shared.len + j + 1) * d]
                .copy_from_slice(unshared.row(layer, 1, i, j));
        }
        bytes += 2 * n * d * 4;
        for h in 0..cfg.n_heads {
            let qh = &q[i * q_rs + h * dh..i * q_rs + (h + 1) * dh];
            for (t, st) in s.iter_mut().enumerate() {
                *st = qh
                    .iter()
                    .zip(&k[t * d + h * dh..t * d + (h + 1) * dh])
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    * scale;
            }
            let m = row_max(&s);
            let z: f32 = s
                .iter_mut()
                .map(|x| {
                    *x = (*x - m).exp();
                    *x
                })
                .sum();
            let o = &mut out[i * d + h * dh..i * d + (h + 1) * dh];
            o.fill(0.0);
            for (t, st) in s.iter().enumerate() {
                for (ot, vt) in o.iter_mut().zip(&v[t * d + h * dh..t * d + (h + 1) * dh]) {
                    *ot += st / z * vt;
                }
            }
        }
    }
    bytes
}
