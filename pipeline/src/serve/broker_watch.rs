//! The thread that keeps asking the broker about the request topic while
//! `serve` runs: new partitions, the lag of quiet partitions, and (when
//! `kafka.unready_after_ms` is set) readiness.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use grflow_connectors::kafka::{BrokerProbe, SharedState};

/// Asks the broker for the request topic's metadata every second. The
/// partition count goes to `shared` (workers start reading partitions
/// created while the job runs). Then it asks where the logs of the
/// partitions whose consumer lag nothing vouched for lately (no requests)
/// end, which keeps their lag known (see `grflow_connectors::kafka::lag`).
/// Readiness follows the broker when `unready_after` is set: after that
/// long without an answer `/readyz` says not ready (and why) until the
/// next answer. Runs until `done`.
pub(super) fn watch_broker(
    probe: BrokerProbe,
    unready_after: Option<Duration>,
    shared: &SharedState,
    done: &AtomicBool,
) {
    const EVERY: Duration = Duration::from_secs(1);
    let ops = crate::ops::state();
    let mut last_ok = Instant::now();
    let mut unready = false;
    while !done.load(Ordering::Relaxed) {
        let asked = Instant::now();
        match probe.check(EVERY) {
            Ok(partitions) => {
                let before = shared.partitions.load(Ordering::Relaxed);
                if partitions > before {
                    tracing::info!(
                        topic = shared.request_topic(),
                        before,
                        now = partitions,
                        "the request topic has new partitions"
                    );
                    shared.saw_partitions(partitions);
                }
                last_ok = Instant::now();
                if std::mem::take(&mut unready) {
                    tracing::info!("broker reachable again");
                    ops.set_broker_down(None);
                }
                metrics::gauge!("grflow_broker_reachable").set(1.0);
                // Quiet partitions: the broker vouches for their lag.
                if let Some(e) = probe.confirm_lags(shared, EVERY) {
                    tracing::debug!("a request partition's end went unanswered: {e}");
                }
            }
            Err(e) => {
                metrics::gauge!("grflow_broker_reachable").set(0.0);
                if !unready && unready_after.is_some_and(|after| last_ok.elapsed() >= after) {
                    unready = true;
                    let reason = format!(
                        "broker unreachable for {} s: {e}",
                        last_ok.elapsed().as_secs()
                    );
                    tracing::warn!("{reason}; not ready");
                    ops.set_broker_down(Some(reason));
                }
            }
        }
        if let Some(rest) = EVERY.checked_sub(asked.elapsed()) {
            std::thread::sleep(rest);
        }
    }
}
