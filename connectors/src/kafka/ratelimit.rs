//! A log line at most once per interval: the first event logs at once,
//! later ones within the interval are only counted, and the next line says
//! how many were suppressed. A permanent fault then costs one line a second
//! instead of one per retry.

use std::collections::HashMap;
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

/// One [`LogLimiter`] per kind of line, for a source of many kinds (a
/// client library's log): a kind seen for the first time logs at once.
#[derive(Clone, Debug)]
pub struct KeyedLogLimiter {
    every: Duration,
    kinds: HashMap<String, LogLimiter>,
}

/// Kinds remembered at most: past this the table starts afresh (a source
/// whose kinds never repeat gains nothing from a limiter anyway).
const MAX_KINDS: usize = 256;

impl KeyedLogLimiter {
    pub fn new(every: Duration) -> Self {
        Self {
            every,
            kinds: HashMap::new(),
        }
    }

    /// As [`LogLimiter::admit`], for a line of `kind`.
    pub fn admit(&mut self, kind: &str, now: Instant) -> Option<u64> {
        if !self.kinds.contains_key(kind) && self.kinds.len() >= MAX_KINDS {
            self.kinds.clear();
        }
        let every = self.every;
        self.kinds
            .entry(kind.to_string())
            .or_insert_with(|| LogLimiter::new(every))
            .admit(now)
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

    #[test]
    fn each_kind_has_its_own_interval() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let mut l = KeyedLogLimiter::new(Duration::from_secs(30));
        assert_eq!(l.admit("AllBrokersDown", at(0)), Some(0));
        assert_eq!(l.admit("FAIL", at(1)), Some(0));
        for ms in 2..10 {
            assert_eq!(l.admit("AllBrokersDown", at(ms)), None);
        }
        assert_eq!(l.admit("FAIL", at(2)), None);
        assert_eq!(l.admit("AllBrokersDown", at(30_000)), Some(8));
        assert_eq!(l.admit("FAIL", at(30_000)), None);
        assert_eq!(l.admit("FAIL", at(30_001)), Some(2));
        // Past MAX_KINDS the table starts afresh: nothing is lost but counts.
        for k in 0..MAX_KINDS {
            l.admit(&format!("kind {k}"), at(30_002));
        }
        assert_eq!(l.admit("FAIL", at(30_003)), Some(0));
    }
}
