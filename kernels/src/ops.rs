//! Row-wise elementwise kernels (norms, activations, softmax pieces).

/// RMSNorm epsilon.
pub(crate) const NORM_EPS: f32 = 1e-5;

/// Sums embedding rows into one token: `out = Σ rows` (each row `out.len()`
/// floats). This is how the caller turns an item's T table rows into its
/// input token.
pub fn sum_rows<'a>(rows: impl IntoIterator<Item = &'a [f32]>, out: &mut [f32]) {
    out.fill(0.0);
    for row in rows {
        debug_assert_eq!(row.len(), out.len());
        for (o, r) in out.iter_mut().zip(row) {
            *o += r;
        }
    }
}

/// `out[r] = x[r] / rms(x[r]) * g` for each row of width `g.len()`.
pub(crate) fn rms_norm(x: &[f32], g: &[f32], out: &mut [f32]) {
    let d = g.len();
    for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
        let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
        let inv = 1.0 / (ms + NORM_EPS).sqrt();
        for ((o, v), w) in or.iter_mut().zip(xr).zip(g) {
            *o = v * inv * w;
        }
    }
}

/// GELU (tanh approximation), in place, in its sigmoid form
/// `0.5·u·(1 + tanh z) = u / (1 + e^{-2z})` so it runs on [`exp_fast`].
pub(crate) fn gelu(x: &mut [f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    for v in x {
        let u = *v;
        let z = C * (u + 0.044_715 * u * u * u);
        *v = u / (1.0 + exp_fast(-2.0 * z));
    }
}

/// `a += b`.
pub(crate) fn add(a: &mut [f32], b: &[f32]) {
    for (x, y) in a.iter_mut().zip(b) {
        *x += y;
    }
}

/// exp(x), accurate to ~2e-7 relative, for x in [-87, 88] (clamped
/// outside): range reduction to 2^k · e^r with a degree-6 polynomial,
/// rounding by the 1.5·2^23 trick, so the loops using it vectorise even on
/// baseline x86-64 (no `round` instruction before SSE4.1).
#[inline(always)]
pub(crate) fn exp_fast(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0; // 1.5 · 2^23
    let x = x.clamp(-87.0, 88.0);
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let k = t - MAGIC;
    // Cody–Waite split of ln 2 keeps r exact for large |k|.
    let r = (x - k * 0.693_145_75) - k * 1.428_606_8e-6;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    let ki = (t.to_bits() as i32).wrapping_sub(MAGIC.to_bits() as i32);
    p * f32::from_bits(((ki + 127) as u32) << 23)
}

/// exp(x) for the softmax case x <= 0.
#[inline(always)]
pub(crate) fn exp_neg(x: f32) -> f32 {
    exp_fast(x)
}

/// In-place softmax numerators of `row` with max `m`; returns their sum.
/// The exponentials and the sum are two loops, the sum in eight lanes: one
/// running sum would chain every element to the last and keep the
/// exponentials from vectorising.
#[inline]
pub(crate) fn exp_shift_sum(row: &mut [f32], m: f32) -> f32 {
    for v in row.iter_mut() {
        *v = exp_neg(*v - m);
    }
    let mut acc = [0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for c in &mut chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v;
        }
    }
    acc.iter().sum::<f32>() + chunks.remainder().iter().sum::<f32>()
}

/// Maximum of a row (-inf when empty).
#[inline]
pub(crate) fn row_max(row: &[f32]) -> f32 {
    row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exp_fast_matches_std() {
        let mut worst = 0f32;
        for i in -20_000..20_000 {
            let x = i as f32 * 0.0043;
            let rel = ((exp_fast(x) - x.exp()) / x.exp()).abs();
            worst = worst.max(rel);
        }
        assert!(worst < 2e-6, "worst relative error {worst}");
        assert_eq!(exp_neg(-200.0).min(1e-30), exp_neg(-200.0));
    }

    #[test]
    fn sum_rows_adds_tables() {
        let a = [1.0, 2.0];
        let b = [0.5, -1.0];
        let mut out = [9.0; 2];
        sum_rows([&a[..], &b[..]], &mut out);
        assert_eq!(out, [1.5, 1.0]);
    }
}
