//! Per-key access history → feature row (LCR §5.1, after LRB): the last 10
//! inter-access deltas, 10 exponentially decayed counters (EDCs) and size.

use crate::eviction::{Key, KeyMap, key_map};

pub const DELTAS: usize = 10;
pub const EDCS: usize = 10;
/// Deltas, EDCs, size.
pub const FEATURES: usize = DELTAS + EDCS + 1;

/// One feature row; missing deltas are NaN (GBDT missing values).
pub type FeatureRow = [f32; FEATURES];

#[derive(Debug, Clone, Copy)]
struct History {
    last: u64,
    /// Most recent first; NaN where the key has fewer accesses.
    deltas: [f32; DELTAS],
    edc: [f32; EDCS],
}

/// EDC i halves every 2^(9+i) accesses (LRB's decay schedule).
fn edc_half_life(i: usize) -> f64 {
    (1u64 << (9 + i)) as f64
}

/// Tracks every key's recent history; forgets keys idle for longer than
/// `horizon` accesses so memory follows the window, not the key space.
#[derive(Debug)]
pub struct FeatureTracker {
    hist: KeyMap<Key, History>,
    horizon: u64,
    next_sweep: u64,
}

impl FeatureTracker {
    pub fn new(horizon: u64) -> Self {
        Self {
            hist: key_map(),
            horizon: horizon.max(1),
            next_sweep: horizon.max(1),
        }
    }

    /// Records a request of `key` at `now` (non-decreasing) and returns its
    /// features as of this request.
    pub fn observe(&mut self, key: Key, now: u64, size: f32) -> FeatureRow {
        if now >= self.next_sweep {
            let cutoff = now.saturating_sub(self.horizon);
            self.hist.retain(|_, h| h.last >= cutoff);
            self.next_sweep = now + self.horizon;
        }
        let h = self.hist.entry(key).or_insert(History {
            last: now,
            deltas: [f32::NAN; DELTAS],
            edc: [0.0; EDCS],
        });
        if h.edc[0] > 0.0 {
            let delta = (now - h.last) as f64;
            h.deltas.copy_within(0..DELTAS - 1, 1);
            h.deltas[0] = delta as f32;
            for (i, e) in h.edc.iter_mut().enumerate() {
                *e = (*e as f64 * (-delta / edc_half_life(i)).exp2()) as f32;
            }
        }
        for e in &mut h.edc {
            *e += 1.0;
        }
        h.last = now;
        let mut row = [0f32; FEATURES];
        row[..DELTAS].copy_from_slice(&h.deltas);
        row[DELTAS..DELTAS + EDCS].copy_from_slice(&h.edc);
        row[FEATURES - 1] = size;
        row
    }

    /// Keys currently remembered.
    pub fn tracked(&self) -> usize {
        self.hist.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_shift_and_edcs_decay() {
        let mut f = FeatureTracker::new(1 << 20);
        let r0 = f.observe(7, 0, 1.0);
        assert!(r0[0].is_nan());
        assert_eq!(r0[DELTAS], 1.0);
        let r1 = f.observe(7, 512, 1.0);
        assert_eq!(r1[0], 512.0);
        assert!(r1[1].is_nan());
        // EDC 0 halves over 512 accesses: 1 * 0.5 + 1.
        assert!((r1[DELTAS] - 1.5).abs() < 1e-6);
        let r2 = f.observe(7, 520, 2.0);
        assert_eq!((r2[0], r2[1]), (8.0, 512.0));
        assert_eq!(r2[FEATURES - 1], 2.0);
    }

    #[test]
    fn idle_keys_are_forgotten() {
        let mut f = FeatureTracker::new(10);
        f.observe(1, 0, 1.0);
        f.observe(2, 5, 1.0);
        f.observe(3, 30, 1.0);
        assert_eq!(f.tracked(), 1);
    }
}
