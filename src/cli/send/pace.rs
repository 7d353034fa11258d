//! When `send` sends each request, and what it sends for it. No I/O.

use std::time::Duration;

use grflow_connectors::kafka::{History, WireRequest};
use grflow_pipeline::Speed;
use grflow_traces::Request;

/// The highest `--rps`.
pub const MAX_RPS: f64 = 1e6;

/// When a request is due, from the start of sending.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Pace {
    /// By the trace's event times, at this speed.
    Trace(Speed),
    /// At a fixed rate, requests per second.
    Rate(f64),
}

impl Pace {
    /// When the `index`-th request (0-based) with event time `ts_ms` is
    /// due, the trace starting at `origin_ms`; `None`: at once.
    pub fn due(&self, index: u64, ts_ms: u64, origin_ms: u64) -> Option<Duration> {
        match *self {
            // Paced as `replay` paces (a stamp absurdly far ahead waits
            // "forever", Ctrl-C stops it, rather than overflowing).
            Pace::Trace(speed) => speed.wall_time(ts_ms.saturating_sub(origin_ms)),
            Pace::Rate(rps) => {
                Some(Duration::try_from_secs_f64(index as f64 / rps).unwrap_or(Duration::MAX))
            }
        }
    }
}

/// The message for one trace request: its history as a prefix of the
/// catalog's users table, stamped `ts_ms`, its id moved by `offset`.
pub fn wire_request(r: &Request, ts_ms: u64, offset: u64) -> Option<WireRequest> {
    Some(WireRequest {
        req_id: r.req_id.checked_add(offset)?,
        user_id: r.user_id,
        ts_ms,
        candidates: r.candidates.clone(),
        history: History::Prefix(r.hist_len),
        mode: r.mode,
        history_dropped: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_due_by_their_event_time_or_at_a_fixed_rate() {
        let ms = Duration::from_millis;
        assert_eq!(Pace::Trace(Speed::Max).due(5, 9_000, 1_000), None);
        assert_eq!(
            Pace::Trace(Speed::Factor(2.0)).due(5, 3_000, 1_000),
            Some(ms(1_000))
        );
        // A stamp before the first is due at once.
        assert_eq!(
            Pace::Trace(Speed::Factor(1.0)).due(1, 500, 1_000),
            Some(ms(0))
        );
        assert_eq!(Pace::Rate(200.0).due(10, 0, 0), Some(ms(50)));
        assert_eq!(
            Pace::Trace(Speed::Factor(1e-6)).due(0, u64::MAX, 0),
            Some(Duration::MAX),
            "no overflow"
        );
    }

    #[test]
    fn a_trace_request_goes_out_with_its_history_as_a_prefix_and_the_id_moved() {
        let r = Request {
            ts_ms: 5,
            req_id: 10,
            user_id: 3,
            hist_len: 7,
            candidates: vec![1, 2],
            mode: grflow_traces::Mode::Rank,
            label: Some(1),
        };
        let w = wire_request(&r, 1_000, 100).unwrap();
        assert_eq!(
            (w.req_id, w.ts_ms, w.history.clone()),
            (110, 1_000, History::Prefix(7))
        );
        assert!(wire_request(&r, 0, u64::MAX).is_none(), "overflow refused");
    }
}
