//! Forward pass and hand-written backward of the GR transformer over a
//! batch laid out as the serving path lays out a User-as-prefix request:
//! history tokens are causal; for each target with prefix `p`, its
//! candidates (position `p`) and its instruction token (position `p + 1`)
//! see history rows `0..p` and themselves only. All targets of a sequence
//! share one pass over its history. Matmuls go through the kernels' GEMM.

use grflow_kernels::{Backend, CpuBackend, MatMut, MatRef};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::error::TrainError;
use crate::params::Params;

/// One ranking question: history prefix length and the candidate items.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    pub prefix: usize,
    pub cands: Vec<u32>,
}

/// A user's history (oldest first) and the targets asked about it.
#[derive(Clone, Debug, PartialEq)]
pub struct Sequence {
    pub history: Vec<u32>,
    pub targets: Vec<Target>,
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Input {
    Item(u32),
    Instr,
}

/// Row bookkeeping of a batch.
#[derive(Debug)]
pub(crate) struct Layout {
    n: usize,
    input: Vec<Input>,
    pos: Vec<usize>,
    /// First history row of the row's sequence.
    hist_start: Vec<usize>,
    /// History rows the row sees (from `hist_start`).
    pre: Vec<usize>,
    /// Whether the row also sees itself beyond its prefix (candidates, instr).
    extra: Vec<bool>,
    /// Offset of each row's attention probabilities (`heads × visible`).
    prob_at: Vec<usize>,
    prob_len: usize,
    /// Per target: first candidate row and candidate count; its
    /// instruction row follows the candidates.
    targets: Vec<(usize, usize)>,
    /// Offset of each target's first logit.
    logit_at: Vec<usize>,
}

impl Layout {
    pub(crate) fn new(p: &Params, seqs: &[Sequence]) -> Result<Self, TrainError> {
        let heads = p.cfg.n_heads;
        let mut l = Layout {
            n: 0,
            input: Vec::new(),
            pos: Vec::new(),
            hist_start: Vec::new(),
            pre: Vec::new(),
            extra: Vec::new(),
            prob_at: Vec::new(),
            prob_len: 0,
            targets: Vec::new(),
            logit_at: Vec::new(),
        };
        let n_items = p.n_items() as u32;
        let mut n_logits = 0;
        let check = |i: u32| {
            if i >= n_items {
                return Err(TrainError::Invalid(format!(
                    "item {i} outside the model's {n_items} items"
                )));
            }
            Ok(Input::Item(i))
        };
        for s in seqs {
            let h0 = l.input.len();
            let push = |l: &mut Layout, input, pos, pre, extra: bool| {
                l.input.push(input);
                l.pos.push(pos);
                l.hist_start.push(h0);
                l.pre.push(pre);
                l.extra.push(extra);
                l.prob_at.push(l.prob_len);
                l.prob_len += heads * (pre + extra as usize);
            };
            for (i, &item) in s.history.iter().enumerate() {
                push(&mut l, check(item)?, i, i + 1, false);
            }
            for t in &s.targets {
                if t.prefix > s.history.len() || t.cands.is_empty() {
                    return Err(TrainError::Invalid(format!(
                        "target prefix {} of a {}-item history with {} candidates",
                        t.prefix,
                        s.history.len(),
                        t.cands.len()
                    )));
                }
                if t.prefix + 2 > p.cfg.max_positions {
                    return Err(TrainError::Invalid(format!(
                        "prefix {} needs {} positions, the model has {}",
                        t.prefix,
                        t.prefix + 2,
                        p.cfg.max_positions
                    )));
                }
                l.targets.push((l.input.len(), t.cands.len()));
                l.logit_at.push(n_logits);
                n_logits += t.cands.len();
                for &c in &t.cands {
                    push(&mut l, check(c)?, t.prefix, t.prefix, true);
                }
                push(&mut l, Input::Instr, t.prefix + 1, t.prefix, true);
            }
        }
        l.n = l.input.len();
        Ok(l)
    }

    fn visible(&self, r: usize) -> impl Iterator<Item = usize> + '_ {
        let h = self.hist_start[r];
        (h..h + self.pre[r]).chain(self.extra[r].then_some(r))
    }

    fn n_visible(&self, r: usize) -> usize {
        self.pre[r] + self.extra[r] as usize
    }
}

/// Inverted dropout on the input rows and on the output of every residual
/// branch (attention and FFN), as SASRec regularises sparse data. Training
/// only: serving and evaluation run without it, which inverted dropout
/// makes the expected forward.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Dropout {
    pub rate: f32,
    /// Seeds the masks, so a batch's gradient is reproducible.
    pub seed: u64,
}

/// Draws dropout masks (`0` or `1 / (1 - rate)` per element).
struct Masks(Option<(f32, ChaCha8Rng)>);

impl Masks {
    fn new(drop: Option<Dropout>) -> Self {
        Masks(
            drop.filter(|d| d.rate > 0.0)
                .map(|d| (d.rate, ChaCha8Rng::seed_from_u64(d.seed))),
        )
    }

    fn draw(&mut self, len: usize) -> Option<Vec<f32>> {
        let (rate, rng) = self.0.as_mut()?;
        let keep = 1.0 / (1.0 - *rate);
        Some(
            (0..len)
                .map(|_| {
                    if rng.random::<f32>() < *rate {
                        0.0
                    } else {
                        keep
                    }
                })
                .collect(),
        )
    }
}

/// `x += mask ⊙ branch` where `branch = a · b` (plain accumulate without a mask).
fn residual_mm(
    be: &CpuBackend,
    x: &mut [f32],
    a: MatRef<'_>,
    b: MatRef<'_>,
    mask: &Option<Vec<f32>>,
) {
    match mask {
        None => mm(be, x, a, b, true),
        Some(m) => {
            let mut br = vec![0f32; x.len()];
            mm(be, &mut br, a, b, false);
            for ((o, v), k) in x.iter_mut().zip(&br).zip(m) {
                *o += v * k;
            }
        }
    }
}

/// The branch's gradient `mask ⊙ dx` (borrowed when there is no mask).
fn masked<'a>(dx: &'a [f32], mask: &Option<Vec<f32>>) -> std::borrow::Cow<'a, [f32]> {
    match mask {
        None => std::borrow::Cow::Borrowed(dx),
        Some(m) => std::borrow::Cow::Owned(dx.iter().zip(m).map(|(g, k)| g * k).collect()),
    }
}

/// Backward of [`residual_mm`] given the residual's gradient `dx` (`n × d`)
/// and the branch input `a` (`n × k`): adds `∂/∂b` to `gb` (`k × d`) and
/// returns `∂/∂a`.
fn residual_bwd(
    be: &CpuBackend,
    dx: &[f32],
    mask: &Option<Vec<f32>>,
    a: MatRef<'_>,
    b: &[f32],
    gb: &mut [f32],
) -> Vec<f32> {
    let (n, k) = (a.rows(), a.cols());
    let d = dx.len() / n;
    let branch = masked(dx, mask);
    mm(be, gb, a.t(), rm(&branch, n, d), true);
    let mut da = vec![0f32; n * k];
    mm(be, &mut da, rm(&branch, n, d), rm(b, k, d).t(), false);
    da
}

struct LayerCache {
    attn_mask: Option<Vec<f32>>,
    ffn_mask: Option<Vec<f32>>,
    x_in: Vec<f32>,
    inv1: Vec<f32>,
    h1: Vec<f32>,
    qkv: Vec<f32>,
    probs: Vec<f32>,
    attn: Vec<f32>,
    x_mid: Vec<f32>,
    inv2: Vec<f32>,
    h2: Vec<f32>,
    u: Vec<f32>,
    /// `gelu_tanh(u)`.
    t: Vec<f32>,
    g: Vec<f32>,
}

/// What the backward pass needs from the forward pass.
pub(crate) struct Forward {
    in_mask: Option<Vec<f32>>,
    layers: Vec<LayerCache>,
    /// Final residual of each target's instruction row (`targets × d`).
    xi: Vec<f32>,
    invf: Vec<f32>,
    hn: Vec<f32>,
    /// `W_rank · norm(h_instr)` per target.
    uvec: Vec<f32>,
    /// Candidate logits `⟨u, k⟩/√d`, targets one after another.
    pub logits: Vec<f32>,
}

fn mm(be: &CpuBackend, out: &mut [f32], a: MatRef<'_>, b: MatRef<'_>, acc: bool) {
    let (m, n) = (a.rows(), b.cols());
    be.matmul(MatMut::row_major(out, m, n), a, b, 1.0, acc);
}

fn rm(data: &[f32], rows: usize, cols: usize) -> MatRef<'_> {
    MatRef::row_major(data, rows, cols)
}

const EPS: f32 = 1e-5;

/// RMSNorm rows of `x` into `out`; returns each row's 1/rms.
fn rms_fwd(x: &[f32], g: &[f32], out: &mut [f32]) -> Vec<f32> {
    let d = g.len();
    x.chunks_exact(d)
        .zip(out.chunks_exact_mut(d))
        .map(|(xr, or)| {
            let inv = 1.0 / (xr.iter().map(|v| v * v).sum::<f32>() / d as f32 + EPS).sqrt();
            for ((o, v), w) in or.iter_mut().zip(xr).zip(g) {
                *o = v * inv * w;
            }
            inv
        })
        .collect()
}

/// Adds the input gradient of RMSNorm to `dx` and its gain gradient to `dg`.
fn rms_bwd(x: &[f32], g: &[f32], inv: &[f32], dy: &[f32], dx: &mut [f32], dg: &mut [f32]) {
    let d = g.len();
    for (((xr, dyr), dxr), &iv) in x
        .chunks_exact(d)
        .zip(dy.chunks_exact(d))
        .zip(dx.chunks_exact_mut(d))
        .zip(inv)
    {
        let mut dot = 0.0;
        for ((v, dyv), (w, dgw)) in xr.iter().zip(dyr).zip(g.iter().zip(dg.iter_mut())) {
            *dgw += dyv * v * iv;
            dot += dyv * w * v;
        }
        let c = iv * iv * iv * dot / d as f32;
        for (((o, v), dyv), w) in dxr.iter_mut().zip(xr).zip(dyr).zip(g) {
            *o += iv * dyv * w - c * v;
        }
    }
}

const GELU_C: f32 = 0.797_884_6; // sqrt(2/pi)

/// `tanh` of the GELU argument, kept by the forward pass so the backward
/// does not call `tanh` again (libm's `tanh` was 40% of a training step).
fn gelu_tanh(u: f32) -> f32 {
    (GELU_C * (u + 0.044_715 * u * u * u)).tanh()
}

/// The kernels' GELU (tanh approximation), from `t = gelu_tanh(u)`.
fn gelu(u: f32, t: f32) -> f32 {
    0.5 * u * (1.0 + t)
}

fn gelu_grad(u: f32, t: f32) -> f32 {
    0.5 * (1.0 + t) + 0.5 * u * (1.0 - t * t) * GELU_C * (1.0 + 3.0 * 0.044_715 * u * u)
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (o, v) in y.iter_mut().zip(x) {
        *o += a * v;
    }
}

fn attn_fwd(p: &Params, lay: &Layout, qkv: &[f32], probs: &mut [f32], out: &mut [f32]) {
    let cfg = &p.cfg;
    let (d, dh) = (cfg.d_model, cfg.head_dim());
    let scale = 1.0 / (dh as f32).sqrt();
    for r in 0..lay.n {
        let nv = lay.n_visible(r);
        for h in 0..cfg.n_heads {
            let q = &qkv[r * 3 * d + h * dh..][..dh];
            let pr = &mut probs[lay.prob_at[r] + h * nv..][..nv];
            for (pj, j) in pr.iter_mut().zip(lay.visible(r)) {
                *pj = dot(q, &qkv[j * 3 * d + d + h * dh..][..dh]) * scale;
            }
            let m = pr.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
            let mut z = 0.0;
            for v in pr.iter_mut() {
                *v = (*v - m).exp();
                z += *v;
            }
            let o = &mut out[r * d + h * dh..][..dh];
            o.fill(0.0);
            for (&pj, j) in pr.iter().zip(lay.visible(r)) {
                axpy(pj / z, &qkv[j * 3 * d + 2 * d + h * dh..][..dh], o);
            }
            pr.iter_mut().for_each(|v| *v /= z);
        }
    }
}

fn attn_bwd(p: &Params, lay: &Layout, qkv: &[f32], probs: &[f32], da: &[f32], dqkv: &mut [f32]) {
    let cfg = &p.cfg;
    let (d, dh) = (cfg.d_model, cfg.head_dim());
    let scale = 1.0 / (dh as f32).sqrt();
    let mut dp = Vec::new();
    let mut dq = vec![0f32; dh];
    for r in 0..lay.n {
        let nv = lay.n_visible(r);
        for h in 0..cfg.n_heads {
            let dar = &da[r * d + h * dh..][..dh];
            let pr = &probs[lay.prob_at[r] + h * nv..][..nv];
            dp.clear();
            for (&pj, j) in pr.iter().zip(lay.visible(r)) {
                dp.push(dot(dar, &qkv[j * 3 * d + 2 * d + h * dh..][..dh]));
                axpy(pj, dar, &mut dqkv[j * 3 * d + 2 * d + h * dh..][..dh]);
            }
            let s = dot(pr, &dp);
            dq.fill(0.0);
            let q = &qkv[r * 3 * d + h * dh..][..dh];
            for ((&pj, &dpj), j) in pr.iter().zip(&dp).zip(lay.visible(r)) {
                let ds = pj * (dpj - s) * scale;
                axpy(ds, &qkv[j * 3 * d + d + h * dh..][..dh], &mut dq);
                axpy(ds, q, &mut dqkv[j * 3 * d + d + h * dh..][..dh]);
            }
            axpy(1.0, &dq, &mut dqkv[r * 3 * d + h * dh..][..dh]);
        }
    }
}

/// Runs the model over the batch; keeps what backward needs.
pub(crate) fn forward(p: &Params, lay: &Layout, be: &CpuBackend, drop: Option<Dropout>) -> Forward {
    let cfg = &p.cfg;
    let (d, f, n) = (cfg.d_model, cfg.d_ff, lay.n);
    let mut masks = Masks::new(drop);
    let mut x = vec![0f32; n * d];
    for (r, row) in x.chunks_exact_mut(d).enumerate() {
        let src = match lay.input[r] {
            Input::Item(i) => p.item_row(i),
            Input::Instr => &p.instr,
        };
        row.copy_from_slice(src);
        axpy(1.0, &p.pos[lay.pos[r] * d..][..d], row);
    }
    let in_mask = masks.draw(n * d);
    if let Some(m) = &in_mask {
        x.iter_mut().zip(m).for_each(|(v, k)| *v *= k);
    }
    let mut layers = Vec::with_capacity(p.layers.len());
    for w in &p.layers {
        let (attn_mask, ffn_mask) = (masks.draw(n * d), masks.draw(n * d));
        let x_in = x.clone();
        let mut h1 = vec![0f32; n * d];
        let inv1 = rms_fwd(&x, &w.ln1, &mut h1);
        let mut qkv = vec![0f32; n * 3 * d];
        mm(be, &mut qkv, rm(&h1, n, d), rm(&w.wqkv, d, 3 * d), false);
        let mut probs = vec![0f32; lay.prob_len];
        let mut attn = vec![0f32; n * d];
        attn_fwd(p, lay, &qkv, &mut probs, &mut attn);
        residual_mm(be, &mut x, rm(&attn, n, d), rm(&w.wo, d, d), &attn_mask);
        let x_mid = x.clone();
        let mut h2 = vec![0f32; n * d];
        let inv2 = rms_fwd(&x, &w.ln2, &mut h2);
        let mut u = vec![0f32; n * f];
        mm(be, &mut u, rm(&h2, n, d), rm(&w.w1, d, f), false);
        let t: Vec<f32> = u.iter().map(|&v| gelu_tanh(v)).collect();
        let g: Vec<f32> = u.iter().zip(&t).map(|(&v, &t)| gelu(v, t)).collect();
        residual_mm(be, &mut x, rm(&g, n, f), rm(&w.w2, f, d), &ffn_mask);
        layers.push(LayerCache {
            attn_mask,
            ffn_mask,
            x_in,
            inv1,
            h1,
            qkv,
            probs,
            attn,
            x_mid,
            inv2,
            h2,
            u,
            t,
            g,
        });
    }
    let nt = lay.targets.len();
    let mut xi = vec![0f32; nt * d];
    for (row, &(c0, nc)) in xi.chunks_exact_mut(d).zip(&lay.targets) {
        row.copy_from_slice(&x[(c0 + nc) * d..][..d]);
    }
    let mut hn = vec![0f32; nt * d];
    let invf = rms_fwd(&xi, &p.ln_f, &mut hn);
    let mut uvec = vec![0f32; nt * d];
    mm(be, &mut uvec, rm(&hn, nt, d), rm(&p.w_rank, d, d), false);
    let qkv = &layers.last().expect("at least one layer").qkv;
    let scale = 1.0 / (d as f32).sqrt();
    let mut logits = Vec::new();
    for (t, &(c0, nc)) in lay.targets.iter().enumerate() {
        let u = &uvec[t * d..][..d];
        logits.extend((c0..c0 + nc).map(|c| dot(u, &qkv[c * 3 * d + d..][..d]) * scale));
    }
    Forward {
        in_mask,
        layers,
        xi,
        invf,
        hn,
        uvec,
        logits,
    }
}

impl Forward {
    /// Logits of target `t`.
    pub(crate) fn target_logits<'a>(&'a self, lay: &Layout, t: usize) -> &'a [f32] {
        &self.logits[lay.logit_at[t]..][..lay.targets[t].1]
    }
}

/// Sampled softmax cross-entropy with the positive at candidate 0, summed
/// over targets and divided by `norm`; returns the loss and `∂loss/∂logits`.
pub(crate) fn sampled_softmax(lay: &Layout, fw: &Forward, norm: f32) -> (f64, Vec<f32>) {
    let mut dl = vec![0f32; fw.logits.len()];
    let mut loss = 0f64;
    for t in 0..lay.targets.len() {
        let s = fw.target_logits(lay, t);
        let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
        let z: f32 = s.iter().map(|v| (v - m).exp()).sum();
        loss += (m + z.ln() - s[0]) as f64;
        let g = &mut dl[lay.logit_at[t]..][..s.len()];
        for (gi, v) in g.iter_mut().zip(s) {
            *gi = (v - m).exp() / z / norm;
        }
        g[0] -= 1.0 / norm;
    }
    (loss / norm as f64, dl)
}

/// Gradients of every trained tensor given `∂loss/∂logits`.
pub(crate) fn backward(
    p: &Params,
    lay: &Layout,
    fw: &Forward,
    dlogits: &[f32],
    be: &CpuBackend,
) -> Params {
    let cfg = &p.cfg;
    let (d, f, n, nt) = (cfg.d_model, cfg.d_ff, lay.n, lay.targets.len());
    let scale = 1.0 / (d as f32).sqrt();
    let mut gr = p.zeros_like();
    let last = fw.layers.len() - 1;
    let qkv_last = &fw.layers[last].qkv;
    // Head: logits = ⟨u_t, k_c⟩·scale.
    let mut du = vec![0f32; nt * d];
    let mut dk_last = vec![0f32; n * 3 * d];
    for (t, &(c0, nc)) in lay.targets.iter().enumerate() {
        let u = &fw.uvec[t * d..][..d];
        let dl = &dlogits[lay.logit_at[t]..][..nc];
        for (c, &g) in (c0..c0 + nc).zip(dl) {
            axpy(
                g * scale,
                &qkv_last[c * 3 * d + d..][..d],
                &mut du[t * d..][..d],
            );
            axpy(g * scale, u, &mut dk_last[c * 3 * d + d..][..d]);
        }
    }
    mm(
        be,
        &mut gr.w_rank,
        rm(&fw.hn, nt, d).t(),
        rm(&du, nt, d),
        true,
    );
    let mut dhn = vec![0f32; nt * d];
    mm(be, &mut dhn, rm(&du, nt, d), rm(&p.w_rank, d, d).t(), false);
    let mut dxi = vec![0f32; nt * d];
    rms_bwd(&fw.xi, &p.ln_f, &fw.invf, &dhn, &mut dxi, &mut gr.ln_f);
    let mut dx = vec![0f32; n * d];
    for (row, &(c0, nc)) in dxi.chunks_exact(d).zip(&lay.targets) {
        dx[(c0 + nc) * d..][..d].copy_from_slice(row);
    }
    let mut dqkv = dk_last;
    for (l, (w, c)) in p.layers.iter().zip(&fw.layers).enumerate().rev() {
        if l != last {
            dqkv.fill(0.0);
        }
        let gw = &mut gr.layers[l];
        // FFN: x_out = x_mid + mask ⊙ gelu(h2·W1)·W2.
        let mut dg = residual_bwd(be, &dx, &c.ffn_mask, rm(&c.g, n, f), &w.w2, &mut gw.w2);
        for ((v, &u), &t) in dg.iter_mut().zip(&c.u).zip(&c.t) {
            *v *= gelu_grad(u, t);
        }
        mm(be, &mut gw.w1, rm(&c.h2, n, d).t(), rm(&dg, n, f), true);
        let mut dh = vec![0f32; n * d];
        mm(be, &mut dh, rm(&dg, n, f), rm(&w.w1, d, f).t(), false);
        rms_bwd(&c.x_mid, &w.ln2, &c.inv2, &dh, &mut dx, &mut gw.ln2);
        // Attention: x_mid = x_in + mask ⊙ attn·Wo.
        let da = residual_bwd(be, &dx, &c.attn_mask, rm(&c.attn, n, d), &w.wo, &mut gw.wo);
        attn_bwd(p, lay, &c.qkv, &c.probs, &da, &mut dqkv);
        mm(
            be,
            &mut gw.wqkv,
            rm(&c.h1, n, d).t(),
            rm(&dqkv, n, 3 * d),
            true,
        );
        mm(
            be,
            &mut dh,
            rm(&dqkv, n, 3 * d),
            rm(&w.wqkv, d, 3 * d).t(),
            false,
        );
        rms_bwd(&c.x_in, &w.ln1, &c.inv1, &dh, &mut dx, &mut gw.ln1);
    }
    let dx = masked(&dx, &fw.in_mask);
    for (r, row) in dx.chunks_exact(d).enumerate() {
        match lay.input[r] {
            Input::Item(i) => axpy(1.0, row, &mut gr.emb[i as usize * d..][..d]),
            Input::Instr => axpy(1.0, row, &mut gr.instr),
        }
        axpy(1.0, row, &mut gr.pos[lay.pos[r] * d..][..d]);
    }
    gr
}

/// Loss and gradients of a batch (sampled softmax, positive first, mean
/// over targets).
pub fn loss_and_grad(
    p: &Params,
    seqs: &[Sequence],
    be: &CpuBackend,
    drop: Option<Dropout>,
) -> Result<(f64, Params), TrainError> {
    let lay = Layout::new(p, seqs)?;
    if lay.n == 0 {
        // Nothing to learn from (and the backward pass divides by rows).
        return Ok((0.0, p.zeros_like()));
    }
    let fw = forward(p, &lay, be, drop);
    let norm = lay.targets.len().max(1) as f32;
    let (loss, dl) = sampled_softmax(&lay, &fw, norm);
    Ok((loss, backward(p, &lay, &fw, &dl, be)))
}

/// Loss only (the finite-difference check's objective); the same `drop`
/// draws the same masks as in [`loss_and_grad`].
pub fn loss(
    p: &Params,
    seqs: &[Sequence],
    be: &CpuBackend,
    drop: Option<Dropout>,
) -> Result<f64, TrainError> {
    let lay = Layout::new(p, seqs)?;
    let fw = forward(p, &lay, be, drop);
    Ok(sampled_softmax(&lay, &fw, lay.targets.len().max(1) as f32).0)
}

/// Candidate logits of every target, per target.
pub fn logits(p: &Params, seqs: &[Sequence], be: &CpuBackend) -> Result<Vec<Vec<f32>>, TrainError> {
    let lay = Layout::new(p, seqs)?;
    let fw = forward(p, &lay, be, None);
    Ok((0..lay.targets.len())
        .map(|t| fw.target_logits(&lay, t).to_vec())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_drop_about_rate_and_scale_the_rest() {
        let drop = Dropout {
            rate: 0.25,
            seed: 3,
        };
        let a = Masks::new(Some(drop)).draw(20_000).unwrap();
        assert_eq!(Some(a.clone()), Masks::new(Some(drop)).draw(20_000));
        let zeros = a.iter().filter(|&&v| v == 0.0).count() as f64 / a.len() as f64;
        assert!((zeros - 0.25).abs() < 0.02, "dropped {zeros}");
        assert!(a.iter().all(|&v| v == 0.0 || (v - 1.0 / 0.75).abs() < 1e-6));
        // Mean-preserving: the expected forward is the undropped one.
        let mean = a.iter().map(|&v| v as f64).sum::<f64>() / a.len() as f64;
        assert!((mean - 1.0).abs() < 0.03, "mean {mean}");
        assert!(Masks::new(None).draw(10).is_none());
        assert!(
            Masks::new(Some(Dropout { rate: 0.0, seed: 3 }))
                .draw(10)
                .is_none()
        );
    }
}
