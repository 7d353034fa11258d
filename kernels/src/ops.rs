//! Row-wise elementwise kernels (norms, activations, softmax pieces).

/// RMSNorm epsilon.
pub(crate) const NORM_EPS: f32 = 1e-5;

/// Sums embedding rows into one token: `out = Σ rows` (each row `out.len()`
/// floats). This is how the caller turns an item's T table rows into its
/// input token.
pub fn sum_rows<'a>(rows: impl IntoIterator<Item = &'a [f32]>, out: &mut [f32]) {
    wide(|| {
        out.fill(0.0);
        for row in rows {
            debug_assert_eq!(row.len(), out.len());
            for (o, r) in out.iter_mut().zip(row) {
                *o += r;
            }
        }
    })
}

/// `out[r] = x[r] / rms(x[r]) * g` for each row of width `g.len()`.
pub(crate) fn rms_norm(x: &[f32], g: &[f32], out: &mut [f32]) {
    let d = g.len();
    wide(|| {
        for (xr, or) in x.chunks_exact(d).zip(out.chunks_exact_mut(d)) {
            let ms = xr.iter().map(|v| v * v).sum::<f32>() / d as f32;
            let inv = 1.0 / (ms + NORM_EPS).sqrt();
            for ((o, v), w) in or.iter_mut().zip(xr).zip(g) {
                *o = v * inv * w;
            }
        }
    })
}

/// GELU (tanh approximation), in place, in its sigmoid form
/// `0.5·u·(1 + tanh z) = u / (1 + e^{-2z})` so it runs on [`exp_fast`].
pub(crate) fn gelu(x: &mut [f32]) {
    const C: f32 = 0.797_884_6; // sqrt(2/pi)
    wide(|| {
        for v in x {
            let u = *v;
            let z = C * (u + 0.044_715 * u * u * u);
            *v = u / (1.0 + exp_fast(-2.0 * z));
        }
    })
}

/// Runs `f` inside a function compiled for AVX2 where the CPU has it, so
/// that the element-wise loops inlined into it vectorise eight lanes wide
/// instead of baseline x86-64's four (the GEMM crate dispatches the same
/// way). The same operations in the same order (Rust never contracts a
/// multiply and an add into an FMA), so results do not depend on the CPU.
#[inline(always)]
pub(crate) fn wide<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2, checked just above.
        return unsafe { wide_avx2(f) };
    }
    f()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn wide_avx2<R>(f: impl FnOnce() -> R) -> R {
    f()
}

/// `a += b`.
pub(crate) fn add(a: &mut [f32], b: &[f32]) {
    wide(|| {
        for (x, y) in a.iter_mut().zip(b) {
            *x += y;
        }
    })
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
    wide(|| {
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
    })
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
        // Each point on its own: a running `f32::max` would drop a NaN.
        for i in -20_000..20_000 {
            let x = i as f32 * 0.0043;
            let rel = ((exp_fast(x) - x.exp()) / x.exp()).abs();
            assert!(rel < 2e-6, "exp_fast({x}): relative error {rel}");
        }
        assert_eq!(exp_neg(-200.0).min(1e-30), exp_neg(-200.0));
    }

    /// `row_max` skips a NaN (`f32::max`), so the NaN must come through
    /// `exp_fast` itself for a NaN score to poison its softmax row rather
    /// than vanish as a zero weight.
    #[test]
    fn a_nan_score_makes_the_softmax_sum_nan() {
        let mut row = vec![0.5f32, f32::NAN, -1.0, 2.0];
        let m = row_max(&row);
        assert_eq!(m, 2.0);
        assert!(exp_shift_sum(&mut row, m).is_nan());
        assert!(row[1].is_nan());
        assert!(exp_fast(f32::NAN).is_nan());
    }

    /// The AVX2 build of the element-wise loops gives the bits the
    /// baseline build gives (no FMA contraction, no reordered sums), so a
    /// model's outputs do not depend on the CPU it runs on.
    #[test]
    fn wide_loops_give_the_baseline_bits() {
        let x: Vec<f32> = (0..1_003).map(|i| (i as f32 * 0.37).sin() * 6.0).collect();
        let mut got = x.clone();
        gelu(&mut got);
        let want: Vec<f32> = x
            .iter()
            .map(|&u| u / (1.0 + exp_fast(-2.0 * (0.797_884_6 * (u + 0.044_715 * u * u * u)))))
            .collect();
        assert!(
            got.iter()
                .zip(&want)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );

        let g: Vec<f32> = (0..59).map(|i| 0.5 + i as f32 * 0.01).collect();
        let mut out = vec![0f32; 17 * 59];
        rms_norm(&x[..17 * 59], &g, &mut out);
        for (xr, or) in x[..17 * 59].chunks_exact(59).zip(out.chunks_exact(59)) {
            let mut ms = 0f32;
            for v in xr {
                ms += v * v;
            }
            let inv = 1.0 / (ms / 59.0 + NORM_EPS).sqrt();
            for ((o, v), w) in or.iter().zip(xr).zip(&g) {
                assert_eq!(o.to_bits(), (v * inv * w).to_bits());
            }
        }

        let mut row = x[..1_001].to_vec();
        let m = row_max(&row);
        let sum = exp_shift_sum(&mut row, m);
        let mut acc = [0f32; 8];
        let e: Vec<f32> = x[..1_001].iter().map(|v| exp_neg(v - m)).collect();
        for c in e.chunks_exact(8) {
            for (a, v) in acc.iter_mut().zip(c) {
                *a += v;
            }
        }
        let want = acc.iter().sum::<f32>() + e[1_000];
        assert_eq!(sum.to_bits(), want.to_bits());
        assert!(row.iter().zip(&e).all(|(a, b)| a.to_bits() == b.to_bits()));
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
