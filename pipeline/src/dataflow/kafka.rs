//! Timely wrappers of the Kafka side of `grflow serve`: a source operator
//! driving one worker's [`KafkaIngest`] (its partitions' event time becomes
//! capability downgrades) and a sink handing answers to the worker's
//! [`OutputQueue`]. The logic lives in `crate::serve`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Exchange;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::generic::operator::source;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::{Scope, StreamVec};

use grflow_connectors::SourcePosition;
use grflow_connectors::kafka::partition_owner;

use crate::dataflow::control::SourceClock;
use crate::events::{Admitted, NodeEvent};
use crate::serve::ingest::KafkaIngest;
use crate::serve::outputs::OutputQueue;

/// Records read per activation before yielding to other operators.
const MAX_PER_ACTIVATION: usize = 512;
/// How soon an idle source looks again.
const IDLE_POLL: Duration = Duration::from_millis(1);

/// Reads until `stop` is set, then drops its capability so the dataflow
/// drains what is in flight and completes.
pub fn kafka_source<'s>(
    scope: Scope<'s, u64>,
    ingest: Rc<RefCell<KafkaIngest>>,
    outputs: Rc<RefCell<OutputQueue>>,
    stop: Arc<AtomicBool>,
    clock: Rc<SourceClock>,
) -> StreamVec<'s, u64, Admitted> {
    source(scope, "KafkaSource", move |capability, info| {
        let activator = scope.activator_for(info.address);
        let mut cap = Some(capability);
        move |output| {
            let Some(c) = cap.as_mut() else { return };
            if stop.load(Ordering::Relaxed) {
                cap = None;
                clock.open.set(false);
                return;
            }
            let pumped = ingest.borrow_mut().pump(
                MAX_PER_ACTIVATION,
                &mut outputs.borrow_mut(),
                Instant::now(),
                *c.time(),
            );
            for admitted in pumped.admitted {
                // Behind the frontier (late, counted by the ingest): enters
                // at the earliest time we can still emit; never dropped.
                let ts = admitted.request.ts_ms.max(*c.time());
                output.session(&c.delayed(&ts)).give(admitted);
            }
            if pumped.frontier > *c.time() {
                c.downgrade(&pumped.frontier);
            }
            clock.now.set(*c.time());
            if pumped.drained {
                activator.activate_after(IDLE_POLL);
            } else {
                activator.activate();
            }
        }
    })
}

/// The answers among a node's events (responses and errors), each moved to
/// the worker that read its request: that worker's offset book waits for
/// the answer's acknowledgement, and in cluster mode it may live in another
/// process (the producer's acks arrive in the process that produced).
/// `workers = 1`: no move.
pub fn answers_to_readers<'s>(
    events: StreamVec<'s, u64, NodeEvent>,
    request_topic: String,
    workers: usize,
) -> StreamVec<'s, u64, NodeEvent> {
    let answers = events.flat_map(|e| match e {
        NodeEvent::Response(_) | NodeEvent::Error(_) => Some(e),
        NodeEvent::Telemetry(_) | NodeEvent::Report(_) => None,
    });
    if workers <= 1 {
        return answers;
    }
    answers.exchange(move |e| {
        let position = match e {
            NodeEvent::Response(r) => &r.1.position,
            NodeEvent::Error(e) => &e.2.position,
            NodeEvent::Telemetry(_) | NodeEvent::Report(_) => return 0,
        };
        match position {
            SourcePosition::Kafka { partition, .. } => {
                partition_owner(&request_topic, *partition, workers) as u64
            }
            SourcePosition::Parquet { .. } => 0,
        }
    })
}

/// Hands every answer to the output queue.
pub fn kafka_sink<'s>(events: StreamVec<'s, u64, NodeEvent>, outputs: Rc<RefCell<OutputQueue>>) {
    events.sink(Pipeline, "KafkaSink", move |(input, _)| {
        let mut out = outputs.borrow_mut();
        input.for_each(|_, data| {
            for event in data.drain(..) {
                out.answer(event);
            }
        });
    });
}
