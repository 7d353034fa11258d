//! `ln`, `exp` and `pow` from basic IEEE operations only.
//!
//! `f64::ln`/`powf` call the platform's libm, which is not required to round
//! the same way everywhere; a one-ulp difference in a Zipf CDF can flip a
//! sample and change a trace. These versions use only `+ − × ÷`, which IEEE
//! 754 rounds identically on every machine, so traces are byte-identical
//! across platforms. Accuracy is ~1e-15 relative, plenty for sampling.

const LN2_HI: f64 = 6.931_471_803_691_238e-1;
const LN2_LO: f64 = 1.908_214_929_270_587_7e-10;
const LN2: f64 = std::f64::consts::LN_2;

/// Natural logarithm of a positive, finite, normal `x` (NaN otherwise, −∞ at 0).
pub fn ln(x: f64) -> f64 {
    if x.is_nan() || x < 0.0 {
        return f64::NAN;
    }
    if x == 0.0 {
        return f64::NEG_INFINITY;
    }
    if x.is_infinite() {
        return x;
    }
    // Scale subnormals into the normal range first.
    let (x, bias) = if x < f64::MIN_POSITIVE {
        (x * 18_014_398_509_481_984.0, -54)
    } else {
        (x, 0)
    };
    let bits = x.to_bits();
    let mut e = ((bits >> 52) & 0x7ff) as i64 - 1023 + bias;
    let mut m = f64::from_bits((bits & 0x000f_ffff_ffff_ffff) | 0x3ff0_0000_0000_0000);
    if m > std::f64::consts::SQRT_2 {
        m *= 0.5;
        e += 1;
    }
    // ln m = 2 atanh(s), s = (m−1)/(m+1), |s| < 0.172.
    let s = (m - 1.0) / (m + 1.0);
    let s2 = s * s;
    let mut term = s;
    let mut sum = 0.0;
    let mut k = 1.0;
    while k < 40.0 {
        sum += term / k;
        term *= s2;
        k += 2.0;
    }
    let e = e as f64;
    e * LN2_HI + (2.0 * sum + e * LN2_LO)
}

/// e^x; saturates to 0 and +∞ outside the finite range.
pub fn exp(x: f64) -> f64 {
    if x.is_nan() {
        return x;
    }
    if x > 709.0 {
        return f64::INFINITY;
    }
    if x < -708.0 {
        return 0.0;
    }
    // x = k ln2 + r with |r| <= ln2/2.
    let k = (x / LN2 + if x >= 0.0 { 0.5 } else { -0.5 }) as i64;
    let kf = k as f64;
    let r = (x - kf * LN2_HI) - kf * LN2_LO;
    let mut term = 1.0;
    let mut sum = 1.0;
    for n in 1..24 {
        term *= r / n as f64;
        sum += term;
    }
    sum * f64::from_bits(((k + 1023) as u64) << 52)
}

/// x^y for x > 0.
pub fn pow(x: f64, y: f64) -> f64 {
    exp(y * ln(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() <= 1e-13 * b.abs().max(1e-300)
    }

    #[test]
    fn agrees_with_libm() {
        for &x in &[
            1e-300, 1e-5, 0.1, 0.5, 0.999_999, 1.0, 1.5, 2.0, 3.7, 100.0, 12345.678, 1e300,
        ] {
            assert!(
                close(ln(x), x.ln()) || (x == 1.0 && ln(x) == 0.0),
                "ln {x}: {} vs {}",
                ln(x),
                x.ln()
            );
        }
        for &x in &[-700.0, -20.0, -1.0, -1e-9, 0.0, 0.3, 1.0, 2.5, 50.0, 700.0] {
            assert!(close(exp(x), x.exp()), "exp {x}: {} vs {}", exp(x), x.exp());
        }
        for &(x, y) in &[(2.0, 0.5), (10.0, -1.05), (1234.0, -0.9), (7.0, 3.0)] {
            assert!(close(pow(x, y), f64::powf(x, y)), "pow {x} {y}");
        }
    }
}
