//! The two small dataflows every worker of `serve` builds beside the
//! serving one: the stop, and in cluster mode each process's newest event
//! time, both broadcast to every worker of the job.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use timely::container::CapacityContainerBuilder;
use timely::dataflow::InputHandle;
use timely::dataflow::operators::Inspect;
use timely::dataflow::operators::vec::Broadcast;
use timely::worker::Worker;

use grflow_connectors::kafka::SharedState;

/// Where a worker sends the stop.
pub(super) type StopInput = InputHandle<u64, CapacityContainerBuilder<Vec<()>>>;

/// A dataflow that carries a stop from any worker to every worker: each
/// sends `()` on the returned input when its process is signalled, and
/// every worker that receives one sets `stop`.
pub(super) fn stop_broadcast(worker: &mut Worker, stop: Arc<AtomicBool>) -> StopInput {
    let mut input = InputHandle::new();
    worker.dataflow::<u64, _, _>(|scope| {
        input
            .to_stream(scope)
            .broadcast()
            .inspect(move |_| stop.store(true, Ordering::Relaxed));
    });
    input
}

/// Carries each process's newest request event time to every process in
/// cluster mode. A worker's clock never trails the newest event time in
/// the job by more than `kafka.max_skew_ms`, and a worker whose partitions
/// are idle releases everything up to it; that newest time was each
/// process's own, so a process that read nothing (it owns no busy
/// partition) held its workers' event time at 1 for the whole job: no
/// window ever closed, and under `arrival` every time in flight stayed
/// held.
pub(super) struct NewestBroadcast {
    input: InputHandle<u64, CapacityContainerBuilder<Vec<u64>>>,
    sent: u64,
    last: Instant,
}

/// How often a process sends its newest event time when it moved.
const NEWEST_EVERY: Duration = Duration::from_millis(50);

impl NewestBroadcast {
    pub(super) fn new(worker: &mut Worker, shared: Arc<SharedState>) -> Self {
        let mut input = InputHandle::new();
        worker.dataflow::<u64, _, _>(|scope| {
            input.to_stream(scope).broadcast().inspect(move |&t: &u64| {
                shared
                    .counters
                    .newest_event_ms
                    .fetch_max(t, Ordering::Relaxed);
            });
        });
        Self {
            input,
            sent: 0,
            last: Instant::now(),
        }
    }

    /// Sends this process's newest event time if it moved since the last
    /// send, at most every `NEWEST_EVERY` (one worker per process sends).
    pub(super) fn share(&mut self, shared: &SharedState) {
        let newest = shared.counters.newest_event_ms.load(Ordering::Relaxed);
        if newest > self.sent && self.last.elapsed() >= NEWEST_EVERY {
            self.input.send(newest);
            self.input.flush();
            self.sent = newest;
            self.last = Instant::now();
        }
    }
}
