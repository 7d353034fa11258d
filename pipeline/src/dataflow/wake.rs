//! One pending timer per operator. timely's `activate_after` adds a timer
//! every call and never merges them, and an operator that asks for a
//! delayed wake on every activation (each input arrival, each consumer
//! wake-up) starts a new self-renewing chain each time: one review measured
//! 700-1,500 activations a second in a Kafka source designed for 10.

use std::time::{Duration, Instant};

/// When this operator's own timer is due, if one is pending.
#[derive(Debug, Default)]
pub struct WakeTimer {
    due: Option<Instant>,
}

impl WakeTimer {
    /// Whether a timer for `wait` from `now` must be set: not when one
    /// already pending fires at or before it (that wake asks again).
    pub fn set(&mut self, now: Instant, wait: Duration) -> bool {
        let due = now + wait;
        // A timer due by now has fired (timely fires at or after its time):
        // this activation may be it.
        if self.due.is_some_and(|t| t <= now) {
            self.due = None;
        }
        if self.due.is_some_and(|t| t <= due) {
            return false;
        }
        self.due = Some(due);
        true
    }

    /// Asks timely to activate after `wait` unless a timer at or before it
    /// is pending.
    pub fn activate_after(&mut self, activator: &timely::scheduling::Activator, wait: Duration) {
        if self.set(Instant::now(), wait) {
            activator.activate_after(wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::WakeTimer;
    use std::time::{Duration, Instant};

    #[test]
    fn wakes_asked_for_while_a_timer_is_pending_set_none() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let mut w = WakeTimer::default();
        assert!(w.set(t0, ms(100)));
        // 100 wakes before it fires (records arriving): no new chain.
        let set = (1..=99).filter(|&i| w.set(t0 + ms(i), ms(100))).count();
        assert_eq!(set, 0);
        // A sooner one replaces it.
        assert!(w.set(t0 + ms(50), ms(1)));
        assert!(!w.set(t0 + ms(50), ms(30)));
        // Once it has fired, the next ask sets one again.
        assert!(w.set(t0 + ms(51), ms(100)));
    }
}
