//! LCR §5.2 noise: with probability p a prediction is replaced by the
//! negative of the true next-access time. Needs the future, so only benches
//! use it. The draw is a hash of (seed, request position), so every policy
//! and ratio sees the same corrupted predictions.

/// Deterministic noise of probability `p`.
#[derive(Debug, Clone, Copy)]
pub struct Noise {
    pub p: f64,
    pub seed: u64,
}

impl Noise {
    pub fn new(p: f64, seed: u64) -> Self {
        Self { p, seed }
    }

    /// Whether the prediction made for request position `t` (and, for Sync
    /// re-predictions, at time `salt`) is replaced.
    pub fn hits(&self, t: u64, salt: u64) -> bool {
        if self.p <= 0.0 {
            return false;
        }
        if self.p >= 1.0 {
            return true;
        }
        let mut x = self.seed ^ t.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.rotate_left(32);
        x ^= x >> 33;
        x = x.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        x ^= x >> 33;
        x = x.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
        x ^= x >> 33;
        ((x >> 11) as f64 / (1u64 << 53) as f64) < self.p
    }

    /// `pred`, or minus the true next-access time when the draw hits.
    /// A key never requested again has true next-access time +∞.
    pub fn apply(&self, pred: f64, true_next: u64, t: u64, salt: u64) -> f64 {
        if self.hits(t, salt) {
            if true_next == u64::MAX {
                f64::MIN
            } else {
                -(true_next as f64)
            }
        } else {
            pred
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rate_is_close_to_p_and_deterministic() {
        let n = Noise::new(0.3, 9);
        let hits = (0..20_000).filter(|&t| n.hits(t, 0)).count();
        assert!((5_400..6_600).contains(&hits), "{hits}");
        assert_eq!(n.hits(123, 4), Noise::new(0.3, 9).hits(123, 4));
        assert!(!Noise::new(0.0, 1).hits(5, 0));
        assert_eq!(Noise::new(1.0, 1).apply(3.0, 10, 0, 0), -10.0);
    }
}
