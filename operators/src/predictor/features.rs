//! Per-key access history → feature row (LCR §5.1, after LRB): the last 10
//! inter-access deltas, 10 exponentially decayed counters (EDCs), size, and
//! the request's length with the key's place in it (LCR's prompt length; for
//! a KV block its depth in the prefix tree and the blocks after it).

use crate::eviction::{Key, KeyMap, key_map};

pub const DELTAS: usize = 10;
pub const EDCS: usize = 10;
/// Size, request length, position, blocks after it.
pub const CONTEXT: usize = 4;
/// Deltas, EDCs, context.
pub const FEATURES: usize = DELTAS + EDCS + CONTEXT;

/// What is known about a request besides its key's history; NaN where
/// unknown (a missing value for the trees).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AccessContext {
    pub size: f32,
    /// Keys of the request this access is part of (a prompt's blocks).
    pub request_len: f32,
    /// 0-based place of the key in that request (a block's depth).
    pub position: f32,
}

impl AccessContext {
    /// Only the size is known.
    pub fn sized(size: f32) -> Self {
        Self {
            size,
            request_len: f32::NAN,
            position: f32::NAN,
        }
    }

    /// Block `position` of a request of `request_len` blocks, size 1.
    pub fn block(position: usize, request_len: usize) -> Self {
        Self {
            size: 1.0,
            request_len: request_len as f32,
            position: position as f32,
        }
    }

    fn features(&self) -> [f32; CONTEXT] {
        // The tail block of a prompt is rarely reused (its hash changes as
        // the conversation grows): the trees get the distance to the end
        // directly rather than having to learn a difference.
        let after = self.request_len - 1.0 - self.position;
        [self.size, self.request_len, self.position, after]
    }
}

impl Default for AccessContext {
    fn default() -> Self {
        Self::sized(1.0)
    }
}

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
    pub fn observe(&mut self, key: Key, now: u64, ctx: AccessContext) -> FeatureRow {
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
        row[DELTAS + EDCS..].copy_from_slice(&ctx.features());
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
        let r0 = f.observe(7, 0, AccessContext::default());
        assert!(r0[0].is_nan());
        assert_eq!(r0[DELTAS], 1.0);
        let r1 = f.observe(7, 512, AccessContext::default());
        assert_eq!(r1[0], 512.0);
        assert!(r1[1].is_nan());
        // EDC 0 halves over 512 accesses: 1 * 0.5 + 1.
        assert!((r1[DELTAS] - 1.5).abs() < 1e-6);
        let r2 = f.observe(7, 520, AccessContext::sized(2.0));
        assert_eq!((r2[0], r2[1]), (8.0, 512.0));
        assert_eq!(r2[DELTAS + EDCS], 2.0);
        assert!(r2[DELTAS + EDCS + 1..].iter().all(|v| v.is_nan()));
        let r3 = f.observe(8, 521, AccessContext::block(2, 5));
        assert_eq!(r3[DELTAS + EDCS..], [1.0, 5.0, 2.0, 2.0]);
    }

    #[test]
    fn idle_keys_are_forgotten() {
        let mut f = FeatureTracker::new(10);
        f.observe(1, 0, AccessContext::default());
        f.observe(2, 5, AccessContext::default());
        f.observe(3, 30, AccessContext::default());
        assert_eq!(f.tracked(), 1);
    }
}
