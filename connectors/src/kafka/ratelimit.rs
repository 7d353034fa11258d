//! A log line at most once per interval: the first event logs at once,
//! later ones within the interval are only counted, and the next line says
//! how many were suppressed. A permanent fault then costs one line a second
//! instead of one per retry.

use std::time::{Duration, Instant};

#[derive(Clone, Debug)]
pub struct LogLimiter {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl LogLimiter {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(suppressed since the last line)` when a line may be logged at
    /// `now`; `None` (and the event counted) otherwise.
    pub fn admit(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(last) if now.saturating_duration_since(last) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

impl Default for LogLimiter {
    fn default() -> Self {
        Self::new(Duration::from_secs(1))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_per_interval_with_the_suppressed_count() {
        let t0 = Instant::now();
        let mut l = LogLimiter::new(Duration::from_secs(1));
        assert_eq!(l.admit(t0), Some(0));
        for ms in 1..1000 {
            assert_eq!(l.admit(t0 + Duration::from_millis(ms)), None);
        }
        assert_eq!(l.admit(t0 + Duration::from_millis(1000)), Some(999));
        assert_eq!(l.admit(t0 + Duration::from_millis(1500)), None);
        assert_eq!(l.admit(t0 + Duration::from_millis(2500)), Some(1));
    }
}
