//! A small dense network for the allocator's learned parts (the residual
//! adapter now; the PPO actor–critic is the same kind of network): tanh
//! hidden layers, a linear output, f64, forward and backward by hand. Small
//! enough (a few thousand parameters) that a library would cost more than
//! it saves; the backward pass is checked against finite differences.

use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// One dense layer: `out = W·x + b`, W row-major (`outputs × inputs`).
#[derive(Clone, Debug, PartialEq)]
pub struct Layer {
    pub inputs: usize,
    pub outputs: usize,
    pub w: Vec<f64>,
    pub b: Vec<f64>,
}

impl Layer {
    /// Uniform in ±1/√inputs (the usual fan-in scale), from `rng`.
    fn random(inputs: usize, outputs: usize, rng: &mut ChaCha8Rng) -> Self {
        let scale = 1.0 / (inputs.max(1) as f64).sqrt();
        Self {
            inputs,
            outputs,
            w: (0..inputs * outputs)
                .map(|_| rng.random_range(-scale..scale))
                .collect(),
            b: vec![0.0; outputs],
        }
    }

    fn apply_into(&self, x: &[f64], out: &mut [f64]) {
        affine(&self.w, &self.b, self.inputs, x, out);
    }

    fn apply(&self, x: &[f64]) -> Vec<f64> {
        let mut out = vec![0.0; self.outputs];
        self.apply_into(x, &mut out);
        out
    }
}

/// `out = W·x + b`, W row-major with `inputs` columns, for the f64 network
/// (training, the adapter); [`Frozen`] has its own, laid out for decisions.
fn affine(w: &[f64], b: &[f64], inputs: usize, x: &[f64], out: &mut [f64]) {
    for (o, (row, b)) in out.iter_mut().zip(w.chunks_exact(inputs).zip(b)) {
        *o = *b + dot(row, x);
    }
}

/// A dot product in four independent sums, added as (a0 + a1) + (a2 + a3)
/// with the tail last: the compiler may vectorise it (one running sum
/// fixes the order of additions and forbids that). The order is fixed,
/// so results are too, and trained policies were computed in it.
fn dot(a: &[f64], b: &[f64]) -> f64 {
    const L: usize = 4;
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0.0; L];
    let (heads_a, heads_b) = (a.chunks_exact(L), b.chunks_exact(L));
    let tail: f64 = heads_a
        .remainder()
        .iter()
        .zip(heads_b.remainder())
        .map(|(&x, &y)| x * y)
        .sum();
    for (x, y) in heads_a.zip(heads_b) {
        for k in 0..L {
            acc[k] += x[k] * y[k];
        }
    }
    (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail
}

/// tanh through one `exp`: glibc's `tanh` goes through `expm1`, and the
/// two were a third of a decision's time. Within 1e-15 of `f64::tanh`
/// (test), so trained policies decide alike.
pub fn tanh(x: f64) -> f64 {
    // Past 20, tanh is 1 to within f64's precision (NaN stays NaN).
    let a = x.abs();
    let a = if a > 20.0 { 20.0 } else { a };
    let e = (-2.0 * a).exp();
    ((1.0 - e) / (1.0 + e)).copysign(x)
}

/// [`tanh`] in f32 (for [`Frozen`]); past 9, tanh is 1 in f32. Built on
/// [`exp_neg_f32`], not libm's `expf`: a call per activation kept the
/// loop scalar and was a third of a decision's time.
fn tanh_f32(x: f32) -> f32 {
    let a = x.abs();
    let a = if a > 9.0 { 9.0 } else { a };
    let e = exp_neg_f32(-2.0 * a);
    ((1.0 - e) / (1.0 + e)).copysign(x)
}

/// `exp(y)` for y in [-18, 0] (what [`tanh_f32`] needs), branch-free so
/// that a loop over activations vectorises: y = n·ln 2 + r with n whole
/// and |r| ≤ ln 2 / 2, exp(r) by its Taylor series to r⁶ (truncation
/// below 1.3e-7 relative), times 2ⁿ built from the exponent bits. Within
/// 3e-7 relative of `f64::exp` (test).
fn exp_neg_f32(y: f32) -> f32 {
    // Adding and subtracting 1.5·2²³ rounds to the nearest whole number.
    const ROUND: f32 = 12_582_912.0;
    // ln 2 in two parts, the first exact in a few bits, so n·LN2_HI has
    // no rounding error for the n in range.
    const LN2_HI: f32 = 355.0 / 512.0;
    const LN2_LO: f32 = -2.121_944_4e-4;
    let t = y * std::f32::consts::LOG2_E + ROUND;
    let n = t - ROUND;
    let r = (y - n * LN2_HI) - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (1.0 / 2.0
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    // t's low bits hold n as an integer (an `as` cast would check for
    // NaN and saturate, one element at a time); n ≥ -26 here, so 2ⁿ is
    // a normal float.
    let n_int = t.to_bits().wrapping_sub(ROUND.to_bits());
    p * f32::from_bits(n_int.wrapping_add(127) << 23)
}

/// Outputs per block of [`FrozenLayer::apply_into`]: four SSE vectors of
/// sums, which stay in registers.
const BLOCK: usize = 16;

#[derive(Clone, Debug)]
struct FrozenLayer {
    inputs: usize,
    outputs: usize,
    /// W in blocks of [`BLOCK`] outputs, each block stored whole (for
    /// every input in turn, its `BLOCK` weights): a block's loop reads
    /// one contiguous run of memory, which a cold cache streams in, where
    /// rows of all outputs made it stride by a row per input. The outputs
    /// are rounded up to whole blocks, the padding zero.
    wt: Vec<f32>,
    /// Padded like a row of `wt`.
    b: Vec<f32>,
    stride: usize,
}

impl FrozenLayer {
    fn of(l: &Layer) -> Self {
        let stride = l.outputs.div_ceil(BLOCK) * BLOCK;
        let mut wt = vec![0.0f32; l.inputs * stride];
        for (o, row) in l.w.chunks_exact(l.inputs).enumerate() {
            let (block, k) = (o / BLOCK, o % BLOCK);
            for (j, &w) in row.iter().enumerate() {
                wt[(block * l.inputs + j) * BLOCK + k] = w as f32;
            }
        }
        let mut b = vec![0.0f32; stride];
        b.iter_mut().zip(&l.b).for_each(|(d, &v)| *d = v as f32);
        Self {
            inputs: l.inputs,
            outputs: l.outputs,
            wt,
            b,
            stride,
        }
    }

    /// `out = W·x + b` (`out` holds `stride` values, the padding ends at
    /// 0) as a sum of W's columns scaled by x, a block of outputs at a
    /// time: each output has its own running sum, kept in a register
    /// across all inputs, so the inner loop is plain vector multiply-adds
    /// (a dot product per output needs a horizontal reduction per row,
    /// which made the decision 2–3× slower). The order of additions is
    /// fixed, so results are too.
    fn apply_into(&self, x: &[f32], out: &mut [f32]) {
        let blocks = self.wt.chunks_exact(self.inputs * BLOCK);
        for (start, block) in (0..self.stride).step_by(BLOCK).zip(blocks) {
            let mut acc: [f32; BLOCK] = self.b[start..start + BLOCK].try_into().expect("a block");
            for (w, &xj) in block.chunks_exact(BLOCK).zip(x) {
                let w: &[f32; BLOCK] = w.try_into().expect("a block");
                for k in 0..BLOCK {
                    acc[k] += xj * w[k];
                }
            }
            out[start..start + BLOCK].copy_from_slice(&acc);
        }
    }
}

/// An f32 copy of a trained [`Mlp`] for decisions only. A closed window
/// usually finds the weights out of cache (serving ran in between): half
/// the bytes to fetch, and twice the lanes per vector. Training stays in
/// f64; outputs agree to about 1e-6 of their scale (test).
#[derive(Clone, Debug)]
pub struct Frozen {
    layers: Vec<FrozenLayer>,
}

impl Frozen {
    pub fn of(net: &Mlp) -> Self {
        Self {
            layers: net.layers.iter().map(FrozenLayer::of).collect(),
        }
    }

    /// `f` of the output, activations on the stack (nothing allocated).
    pub fn forward_with<R>(&self, x: &[f64], f: impl FnOnce(&[f32]) -> R) -> R {
        let mut input = [0.0f32; STACK_WIDTH];
        let n = x.len().min(STACK_WIDTH);
        input[..n]
            .iter_mut()
            .zip(x)
            .for_each(|(d, &v)| *d = v as f32);
        let (mut a, mut b) = ([0.0f32; STACK_WIDTH], [0.0f32; STACK_WIDTH]);
        let (mut cur, mut next) = (&mut a, &mut b);
        let mut src: &[f32] = &input[..n];
        for (i, l) in self.layers.iter().enumerate() {
            assert!(
                l.stride <= STACK_WIDTH && l.inputs == src.len(),
                "a decision network's layer is at most {STACK_WIDTH} wide and fits its input"
            );
            l.apply_into(src, &mut next[..l.stride]);
            if i + 1 < self.layers.len() {
                next[..l.stride].iter_mut().for_each(|v| *v = tanh_f32(*v));
            }
            std::mem::swap(&mut cur, &mut next);
            src = &cur[..l.outputs];
        }
        f(src)
    }
}

/// Widest layer whose activations [`Mlp::forward_with`] keeps on the stack.
const STACK_WIDTH: usize = 256;
/// Widest layer a [`Frozen`] network may have (its padded layers live in
/// `STACK_WIDTH` activations; a multiple of the block, so padding fits).
pub const MAX_WIDTH: usize = STACK_WIDTH;
const _: () = assert!(MAX_WIDTH.is_multiple_of(BLOCK));

/// Layers `sizes[0] → sizes[1] → … → sizes[n]`, tanh between them.
#[derive(Clone, Debug, PartialEq)]
pub struct Mlp {
    pub layers: Vec<Layer>,
}

/// Gradients of every parameter, shaped like the network.
#[derive(Clone, Debug, PartialEq)]
pub struct Grads {
    pub layers: Vec<Layer>,
}

impl Grads {
    /// Zeros shaped like `net` (a sum to add to, an optimiser's moments).
    pub fn zeros(net: &Mlp) -> Self {
        Self {
            layers: net
                .layers
                .iter()
                .map(|l| Layer {
                    inputs: l.inputs,
                    outputs: l.outputs,
                    w: vec![0.0; l.w.len()],
                    b: vec![0.0; l.b.len()],
                })
                .collect(),
        }
    }

    /// `self += other`, parameter by parameter.
    pub fn add(&mut self, other: &Grads) {
        for (a, b) in self.layers.iter_mut().zip(&other.layers) {
            a.w.iter_mut().zip(&b.w).for_each(|(p, d)| *p += d);
            a.b.iter_mut().zip(&b.b).for_each(|(p, d)| *p += d);
        }
    }
}

impl Mlp {
    /// Random hidden layers (seeded) and an output layer of zeros, so the
    /// network starts at exactly 0 yet can learn (all-zero hidden layers
    /// would get no gradient).
    pub fn zero_output(sizes: &[usize], seed: u64) -> Self {
        assert!(sizes.len() >= 2, "an MLP needs an input and an output size");
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let n = sizes.len() - 1;
        let layers = (0..n)
            .map(|i| {
                let mut l = Layer::random(sizes[i], sizes[i + 1], &mut rng);
                if i == n - 1 {
                    l.w.fill(0.0);
                }
                l
            })
            .collect();
        Self { layers }
    }

    pub fn parameters(&self) -> usize {
        self.layers.iter().map(|l| l.w.len() + l.b.len()).sum()
    }

    pub fn forward(&self, x: &[f64]) -> Vec<f64> {
        self.forward_with(x, <[f64]>::to_vec)
    }

    /// `f` of the output, with the activations on the stack: the decision
    /// path allocates nothing (right after an adapter update has freed
    /// its buffers, a `malloc` may first consolidate the heap).
    pub fn forward_with<R>(&self, x: &[f64], f: impl FnOnce(&[f64]) -> R) -> R {
        if self.layers.iter().any(|l| l.outputs > STACK_WIDTH) {
            return f(self.trace(x).last().expect("an output"));
        }
        let (mut a, mut b) = ([0.0; STACK_WIDTH], [0.0; STACK_WIDTH]);
        let (mut cur, mut next) = (&mut a, &mut b);
        let first = &self.layers[0];
        first.apply_into(x, &mut cur[..first.outputs]);
        let mut n = first.outputs;
        for l in &self.layers[1..] {
            cur[..n].iter_mut().for_each(|v| *v = tanh(*v));
            l.apply_into(&cur[..n], &mut next[..l.outputs]);
            std::mem::swap(&mut cur, &mut next);
            n = l.outputs;
        }
        f(&cur[..n])
    }

    /// Every layer's input, and the output last.
    fn trace(&self, x: &[f64]) -> Vec<Vec<f64>> {
        let mut acts = vec![x.to_vec()];
        for (i, l) in self.layers.iter().enumerate() {
            let mut y = l.apply(acts.last().expect("an input"));
            if i + 1 < self.layers.len() {
                y.iter_mut().for_each(|v| *v = tanh(*v));
            }
            acts.push(y);
        }
        acts
    }

    /// Gradients of `dout · output(x)` with respect to every parameter.
    pub fn backward(&self, x: &[f64], dout: &[f64]) -> Grads {
        let mut grads = Grads::zeros(self);
        self.backward_add(x, |_| dout.to_vec(), &mut grads);
        grads
    }

    /// `grads +=` [`Mlp::backward`]`(x, dout(output(x)))`, adding each
    /// term where it is made (the same sums, in the same order, as adding
    /// a fresh `backward`): a pass over a training buffer allocates no
    /// gradient per sample, and a `dout` that depends on the output needs
    /// no forward pass of its own.
    pub fn backward_add(
        &self,
        x: &[f64],
        dout: impl FnOnce(&[f64]) -> Vec<f64>,
        grads: &mut Grads,
    ) {
        let acts = self.trace(x);
        let mut delta = dout(acts.last().expect("an output"));
        for (i, (l, g)) in self.layers.iter().zip(&mut grads.layers).enumerate().rev() {
            let input = &acts[i];
            for (row, d) in g.w.chunks_mut(l.inputs).zip(&delta) {
                row.iter_mut().zip(input).for_each(|(w, x)| *w += d * x);
            }
            g.b.iter_mut().zip(&delta).for_each(|(b, d)| *b += d);
            if i > 0 {
                // Through W, then through the tanh that made `input`.
                delta = (0..l.inputs)
                    .map(|j| {
                        let back: f64 = (0..l.outputs)
                            .map(|o| l.w[o * l.inputs + j] * delta[o])
                            .sum();
                        back * (1.0 - input[j] * input[j])
                    })
                    .collect();
            }
        }
    }

    /// `parameters += rate · grads` (ascent; pass a negative rate to descend).
    pub fn step(&mut self, grads: &Grads, rate: f64) {
        for (l, g) in self.layers.iter_mut().zip(&grads.layers) {
            l.w.iter_mut().zip(&g.w).for_each(|(p, d)| *p += rate * d);
            l.b.iter_mut().zip(&g.b).for_each(|(p, d)| *p += rate * d);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_zero_output_network_starts_at_zero_and_counts_its_parameters() {
        let m = Mlp::zero_output(&[5, 16, 1], 7);
        assert_eq!(m.parameters(), 5 * 16 + 16 + 16 + 1);
        assert_eq!(m.forward(&[0.3, 0.1, 0.9, 0.5, 0.2]), vec![0.0]);
        // Yet the output layer gets a gradient.
        let g = m.backward(&[0.3, 0.1, 0.9, 0.5, 0.2], &[1.0]);
        assert!(g.layers[1].w.iter().any(|v| *v != 0.0));
    }

    #[test]
    fn backward_add_sums_exactly_what_adding_each_backward_does() {
        let mut m = Mlp::zero_output(&[5, 16, 3], 8);
        let mut rng = ChaCha8Rng::seed_from_u64(2);
        m.layers[1]
            .w
            .iter_mut()
            .for_each(|w| *w = rng.random_range(-0.5..0.5));
        let (mut added, mut direct) = (Grads::zeros(&m), Grads::zeros(&m));
        for _ in 0..50 {
            let x: Vec<f64> = (0..5).map(|_| rng.random_range(-1.0..1.0)).collect();
            // A dout that depends on the output, as the trainers' do.
            let y = m.forward(&x);
            let dout: Vec<f64> = y.iter().map(|v| 0.3 - v).collect();
            added.add(&m.backward(&x, &dout));
            m.backward_add(
                &x,
                |out| {
                    assert_eq!(out, y.as_slice());
                    out.iter().map(|v| 0.3 - v).collect()
                },
                &mut direct,
            );
        }
        for (a, d) in added.layers.iter().zip(&direct.layers) {
            let bits = |v: &[f64]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&a.w), bits(&d.w));
            assert_eq!(bits(&a.b), bits(&d.b));
        }
    }

    #[test]
    fn backward_matches_finite_differences_for_every_parameter() {
        let mut m = Mlp::zero_output(&[4, 6, 5, 2], 3);
        // Non-zero output weights, so every layer's gradient is non-trivial.
        let mut rng = ChaCha8Rng::seed_from_u64(9);
        m.layers[2].w = (0..10).map(|_| rng.random_range(-1.0..1.0)).collect();
        m.layers[1].b = vec![0.1, -0.2, 0.3, 0.0, 0.05];
        let x = [0.5, -0.3, 0.8, 0.1];
        let dout = [0.7, -1.3];
        let loss = |m: &Mlp| {
            let y = m.forward(&x);
            y[0] * dout[0] + y[1] * dout[1]
        };
        let g = m.backward(&x, &dout);
        let h = 1e-6;
        for li in 0..m.layers.len() {
            for k in 0..m.layers[li].w.len() + m.layers[li].b.len() {
                let bump = |m: &mut Mlp, d: f64| {
                    let l = &mut m.layers[li];
                    if k < l.w.len() {
                        l.w[k] += d;
                    } else {
                        l.b[k - l.w.len()] += d;
                    }
                };
                let (mut up, mut down) = (m.clone(), m.clone());
                bump(&mut up, h);
                bump(&mut down, -h);
                let numeric = (loss(&up) - loss(&down)) / (2.0 * h);
                let l = &g.layers[li];
                let analytic = if k < l.w.len() {
                    l.w[k]
                } else {
                    l.b[k - l.w.len()]
                };
                assert!(
                    (numeric - analytic).abs() < 1e-6,
                    "layer {li} parameter {k}: {numeric} vs {analytic}"
                );
            }
        }
    }

    #[test]
    fn dot_adds_its_lanes_pairwise_in_a_fixed_order() {
        // The order trained policies were computed in: four lanes as
        // (a0 + a1) + (a2 + a3), the tail last. Bit for bit.
        let mut rng = ChaCha8Rng::seed_from_u64(4);
        for n in 0..140 {
            let a: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let b: Vec<f64> = (0..n).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut acc = [0.0f64; 4];
            for i in 0..n / 4 * 4 {
                acc[i % 4] += a[i] * b[i];
            }
            let tail: f64 = (n / 4 * 4..n).map(|i| a[i] * b[i]).sum();
            let want = (acc[0] + acc[1]) + (acc[2] + acc[3]) + tail;
            assert_eq!(dot(&a, &b).to_bits(), want.to_bits(), "{n}");
        }
    }

    #[test]
    fn tanh_matches_the_library_tanh() {
        for i in -4000..=4000 {
            let x = i as f64 * 0.01 + 1e-9 * i as f64;
            assert!((tanh(x) - x.tanh()).abs() < 1e-15, "{x}");
        }
        for x in [0.0, -0.0, 1e-300, -1e-12, 1e3, -1e3, f64::INFINITY] {
            assert!((tanh(x) - x.tanh()).abs() < 1e-15, "{x}");
        }
        assert!(tanh(f64::NAN).is_nan());
    }

    #[test]
    fn the_f32_copy_computes_what_the_network_does() {
        // The policy's shape, and one whose widths are no multiple of a
        // block (the padding must not leak into the outputs).
        for sizes in [[7, 64, 128, 7], [5, 20, 33, 3]] {
            let mut m = Mlp::zero_output(&sizes, 5);
            let mut rng = ChaCha8Rng::seed_from_u64(9);
            m.layers[2]
                .w
                .iter_mut()
                .for_each(|w| *w = rng.random_range(-0.3..0.3));
            m.layers[2]
                .b
                .iter_mut()
                .for_each(|b| *b = rng.random_range(-0.1..0.1));
            let frozen = Frozen::of(&m);
            for _ in 0..200 {
                let x: Vec<f64> = (0..sizes[0]).map(|_| rng.random_range(0.0..1.0)).collect();
                let want = m.forward(&x);
                let scale = want.iter().fold(1.0f64, |a, v| a.max(v.abs()));
                frozen.forward_with(&x, |got| {
                    assert_eq!(got.len(), sizes[3]);
                    for (g, w) in got.iter().zip(&want) {
                        assert!(
                            (*g as f64 - w).abs() < 1e-5 * scale,
                            "{sizes:?}: {g} vs {w}"
                        );
                    }
                });
            }
        }
        assert!((tanh_f32(0.5) - 0.5f32.tanh()).abs() < 1e-7);
        assert_eq!(tanh_f32(-100.0), -1.0);
    }

    #[test]
    fn a_frozen_layer_adds_in_input_order_whatever_its_layout() {
        // Per output: bias, then each input's term in turn, in f32. The
        // block-major layout must give exactly this (decisions must not
        // change with how the weights are laid out), padding included.
        let mut rng = ChaCha8Rng::seed_from_u64(11);
        for (inputs, outputs) in [(64, 128), (128, 7), (7, 64), (33, 20)] {
            let l = Layer::random(inputs, outputs, &mut rng);
            let frozen = FrozenLayer::of(&l);
            let x: Vec<f32> = (0..inputs).map(|_| rng.random_range(-1.0..1.0)).collect();
            let mut got = vec![f32::NAN; frozen.stride];
            frozen.apply_into(&x, &mut got);
            for (o, row) in l.w.chunks_exact(inputs).enumerate() {
                let mut want = l.b[o] as f32;
                for (w, xj) in row.iter().zip(&x) {
                    want += xj * *w as f32;
                }
                assert_eq!(
                    got[o].to_bits(),
                    want.to_bits(),
                    "{inputs}x{outputs}: output {o}"
                );
            }
            assert!(got[outputs..].iter().all(|&v| v == 0.0), "padding stays 0");
        }
    }

    #[test]
    fn the_f32_exp_and_tanh_are_within_f32_rounding() {
        for i in 0..=180_000 {
            let y = -(i as f32) * 1e-4;
            let want = (y as f64).exp();
            let got = exp_neg_f32(y) as f64;
            assert!(
                ((got - want) / want).abs() < 3e-7,
                "exp({y}): {got} vs {want}"
            );
        }
        for i in -12_000..=12_000 {
            let x = i as f32 * 1e-3;
            let want = (x as f64).tanh();
            let got = tanh_f32(x) as f64;
            assert!((got - want).abs() < 3e-7, "tanh({x}): {got} vs {want}");
        }
        assert_eq!(tanh_f32(0.0), 0.0);
        assert_eq!(tanh_f32(9.5), tanh_f32(9.0));
        assert!(tanh_f32(f32::NAN).is_nan());
    }

    #[test]
    fn forward_is_the_last_activation_of_the_trace() {
        let mut m = Mlp::zero_output(&[4, 6, 5, 2], 3);
        m.layers[2]
            .w
            .iter_mut()
            .enumerate()
            .for_each(|(i, w)| *w = 0.1 * i as f64 - 0.4);
        let x = [0.5, -0.3, 0.8, 0.1];
        assert_eq!(m.forward(&x), m.trace(&x).pop().unwrap());
    }

    #[test]
    fn steps_along_the_gradient_fit_a_target() {
        // Descend on (y − 0.5)² at one input: the output approaches 0.5.
        let mut m = Mlp::zero_output(&[3, 8, 1], 1);
        let x = [0.2, 0.4, 0.6];
        for _ in 0..500 {
            let y = m.forward(&x)[0];
            let g = m.backward(&x, &[2.0 * (y - 0.5)]);
            m.step(&g, -0.05);
        }
        assert!((m.forward(&x)[0] - 0.5).abs() < 1e-3);
    }
}
