//! Windowed statistics per node (HLEM Table I) as a stream of closed
//! windows. Each (node, window) is aggregated as its telemetry arrives and
//! emitted, then forgotten, once the input frontier has passed the window's
//! end; what the operator holds is bounded by its open windows. The
//! aggregation is `grflow_operators::windows::WindowAccumulator`.
//!
//! A closed window `[start, end)` is emitted at time `end`, so that a
//! decision made from it (the allocator's) can be stamped `end + 1`.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Capability;
use timely::dataflow::operators::generic::Operator;

use grflow_operators::windows::{WindowAccumulator, window_start};

use crate::events::{ClosedWindow, Telemetry};

/// What the windows operator of one worker holds, for tests and the summary.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct WindowGauge {
    /// Windows open now, and the most ever open at once.
    pub open: usize,
    pub open_peak: usize,
    /// Samples buffered in open windows now, and the most ever.
    pub samples: u64,
    pub samples_peak: u64,
    /// Windows closed and emitted.
    pub closed: u64,
}

/// One window's end time (exclusive), with its accumulators per node.
struct OpenWindow {
    /// Held at the window's end: the time its closed statistics are emitted at.
    cap: Capability<u64>,
    nodes: BTreeMap<u32, WindowAccumulator>,
}

/// Aggregates telemetry into closed windows of `window_ms` event time.
/// Telemetry is produced on the worker of its node, so no exchange is needed:
/// each (node, window) lives on one worker.
pub fn closed_windows<'s>(
    telemetry: StreamVec<'s, u64, Telemetry>,
    window_ms: u64,
    gauge: Rc<RefCell<WindowGauge>>,
) -> StreamVec<'s, u64, ClosedWindow> {
    let window_ms = window_ms.max(1);
    telemetry.unary_frontier(Pipeline, "Windows", move |_cap, _info| {
        // Keyed by window start.
        let mut open: BTreeMap<u64, OpenWindow> = BTreeMap::new();
        move |(input, frontier), output| {
            let mut gauge = gauge.borrow_mut();
            input.for_each_stamp(|cap, data| {
                // Telemetry is always sent under a capability.
                let Some(&time) = cap.least() else { return };
                // The window of the record's event time (its timely time: the
                // one the frontier tracks, so a window closes exactly when no
                // more of its records can come).
                let start = window_start(time, window_ms);
                let end = start.saturating_add(window_ms);
                let window = open.entry(start).or_insert_with(|| OpenWindow {
                    cap: cap.delayed(&end, 0),
                    nodes: BTreeMap::new(),
                });
                for t in data.flat_map(|d| d.drain(..)) {
                    window.nodes.entry(t.node).or_default().add(time, &t.sample);
                    gauge.samples += 1;
                }
            });
            gauge.open = open.len();
            gauge.open_peak = gauge.open_peak.max(gauge.open);
            gauge.samples_peak = gauge.samples_peak.max(gauge.samples);

            // Close, in time order, every window no record can still enter.
            while let Some(entry) = open.first_entry() {
                let end = *entry.get().cap.time();
                if frontier.less_than(&end) {
                    break;
                }
                let start = *entry.key();
                let window = entry.remove();
                let mut session = output.session(&window.cap);
                for (node, acc) in window.nodes {
                    gauge.samples -= acc.requests();
                    session.give(ClosedWindow {
                        node,
                        window_start_ms: start,
                        stats: acc.finish(),
                    });
                }
                gauge.closed += 1;
            }
            gauge.open = open.len();
        }
    })
}

#[cfg(test)]
mod tests {
    use std::sync::{Arc, Mutex};

    use timely::dataflow::ProbeHandle;
    use timely::dataflow::operators::Probe;
    use timely::dataflow::operators::vec::Input;

    use grflow_operators::windows::TelemetrySample;

    use super::*;

    fn telemetry(node: u32, ts_ms: u64, latency_us: u64) -> Telemetry {
        Telemetry {
            node,
            ts_ms,
            sample: TelemetrySample {
                latency_ns: latency_us * 1_000,
                hot_user: false,
                emb_hits: 1,
                emb_lookups: 2,
                kv_reused_tokens: 0,
                kv_total_tokens: 10,
                seq_len: 10,
                slo_violated: false,
                alpha_milli: 500,
                truncated: false,
                alpha_pinned: false,
                failed: false,
                scaled_latency_ns: None,
            },
        }
    }

    /// Feeds telemetry at times 0..5 windows of 100 ms, advancing the input
    /// as it goes; returns what came out (with its timely time) and the gauge.
    fn run(window_ms: u64) -> (Vec<(u64, ClosedWindow)>, WindowGauge, Vec<usize>) {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let open_after_each_window = Arc::new(Mutex::new(Vec::new()));
        let last_gauge = Arc::new(Mutex::new(WindowGauge::default()));
        let (seen2, open2, gauge2) = (
            seen.clone(),
            open_after_each_window.clone(),
            last_gauge.clone(),
        );
        timely::execute(timely::Config::thread(), move |worker| {
            let gauge: Rc<RefCell<WindowGauge>> = Default::default();
            let seen = seen2.clone();
            let probe = ProbeHandle::new();
            let mut input = worker.dataflow::<u64, _, _>(|scope| {
                let (input, stream) = scope.new_input::<Telemetry>();
                closed_windows(stream, window_ms, gauge.clone())
                    .probe_with(&probe)
                    .sink(Pipeline, "Seen", move |(input, _)| {
                        input.for_each_stamp(|cap, data| {
                            let t = *cap.least().unwrap();
                            for w in data.flat_map(|d| d.drain(..)) {
                                seen.lock().unwrap().push((t, w));
                            }
                        });
                    });
                input
            });
            for window in 0..5u64 {
                for i in 0..10u64 {
                    let t = window * window_ms + i * (window_ms / 10);
                    input.advance_to(t);
                    input.send(telemetry((i % 2) as u32, t, 1_000 * (i + 1)));
                }
                input.advance_to((window + 1) * window_ms);
                while probe.less_than(input.time()) {
                    worker.step();
                }
                open2.lock().unwrap().push(gauge.borrow().open);
            }
            input.close();
            while worker.step() {}
            *gauge2.lock().unwrap() = *gauge.borrow();
        })
        .unwrap();
        let seen = seen.lock().unwrap().clone();
        let open = open_after_each_window.lock().unwrap().clone();
        let gauge = *last_gauge.lock().unwrap();
        (seen, gauge, open)
    }

    #[test]
    fn each_window_is_emitted_once_at_its_end_and_then_forgotten() {
        let (seen, gauge, open) = run(100);
        // 5 windows × 2 nodes, in window order, each at its end time.
        assert_eq!(seen.len(), 10, "{seen:?}");
        for (time, w) in &seen {
            assert_eq!(*time, w.window_start_ms + 100);
            assert_eq!(w.stats.requests, 5);
            assert_eq!(w.stats.emb_hit_rate, 0.5);
        }
        let starts: Vec<u64> = seen.iter().map(|(_, w)| w.window_start_ms).collect();
        assert_eq!(starts, [0, 0, 100, 100, 200, 200, 300, 300, 400, 400]);
        // Node 1 served the odd samples: latencies 2, 4, ..., 10 ms.
        let node1 = seen.iter().find(|(_, w)| w.node == 1).unwrap();
        assert_eq!(node1.1.stats.p99_ms, 10.0);
        // A window closes as soon as the input passes its end: nothing is
        // open between windows, and at most one window's samples are held.
        assert_eq!(open, [0, 0, 0, 0, 0]);
        assert_eq!(gauge.open_peak, 1);
        assert_eq!(gauge.samples_peak, 10);
        assert_eq!(gauge.samples, 0);
        assert_eq!(gauge.closed, 5);
    }
}
