//! Timely wrappers of the Kafka side of `grflow serve`: a source operator
//! driving one worker's [`KafkaSource`] (its partitions' event time becomes
//! capability downgrades) and a sink handing answers to the worker's
//! [`KafkaSink`]. The logic lives in `grflow_connectors::kafka`.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::Exchange;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::generic::operator::source;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::{Scope, StreamVec};

use grflow_connectors::kafka::{IDLE_POLL, KafkaSink, KafkaSource, partition_owner};
use grflow_connectors::{RequestSource, Sink, SourcePosition, SourceRecord, SourceState};

use crate::dataflow::control::SourceClock;
use crate::dataflow::wake::WakeTimer;
use crate::events::{Admitted, NodeEvent, now_ns};
use crate::serve::summary::AnswerLatency;

/// Records read per activation before yielding to other operators.
const MAX_PER_ACTIVATION: usize = 512;

/// Reads until `stop` is set, then drops its capability so the dataflow
/// drains what is in flight and completes. With `sleep_when_quiet`, an
/// idle source is woken by the consumer when records arrive and otherwise
/// polls every [`grflow_connectors::kafka::QUIET_POLL`] while nothing is
/// in flight, instead of every millisecond (`run.release = "arrival"`:
/// no request waits for its frontier).
pub fn kafka_source<'s>(
    scope: Scope<'s, u64>,
    records: Rc<RefCell<KafkaSource>>,
    stop: Arc<AtomicBool>,
    clock: Rc<SourceClock>,
    sleep_when_quiet: bool,
) -> StreamVec<'s, u64, Admitted> {
    source(scope, "KafkaSource", move |capability, info| {
        let activator = scope.activator_for(info.address.clone());
        if sleep_when_quiet {
            let waker = scope.worker().sync_activator_for(info.address.to_vec());
            // Fails only once the worker has shut down: nothing to wake.
            records.borrow_mut().wake_on_arrival(move || {
                let _ = waker.activate();
            });
        }
        let mut cap = Some(capability);
        // The consumer's wake-ups activate the source too: one timer chain.
        let mut timer = WakeTimer::default();
        move |output| {
            let Some(c) = cap.as_mut() else { return };
            if stop.load(Ordering::Relaxed) {
                cap = None;
                clock.open.set(false);
                return;
            }
            let polled = match records.borrow_mut().poll(MAX_PER_ACTIVATION, *c.time()) {
                Ok(polled) => polled,
                Err(e) => {
                    // Kafka's client errors are retried inside the source;
                    // anything else is said and polled again shortly.
                    tracing::warn!(error = %e, "request source");
                    timer.activate_after(&activator, IDLE_POLL);
                    return;
                }
            };
            for record in polled.records {
                // Undecodable records were dead-lettered by the source.
                let SourceRecord::Request {
                    request,
                    position,
                    inline_history,
                    recovered,
                    history_cut,
                } = record
                else {
                    continue;
                };
                // Behind the frontier (late, counted by the source): enters
                // at the earliest time we can still emit; never dropped.
                let ts = request.ts_ms.max(*c.time());
                output.session(&c.delayed(&ts)).give(Admitted {
                    request,
                    position,
                    admitted_ns: now_ns(),
                    inline_history,
                    recovered,
                    history_cut,
                });
            }
            if polled.watermark_ms > *c.time() {
                c.downgrade(&polled.watermark_ms);
            }
            clock.now.set(*c.time());
            if polled.state != SourceState::Ready {
                timer.activate_after(&activator, records.borrow().idle_poll());
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

/// Hands every answer to the worker's sink, its latency (from admission)
/// measured on the way.
pub fn kafka_sink<'s>(
    events: StreamVec<'s, u64, NodeEvent>,
    sink: Rc<RefCell<KafkaSink>>,
    latency: Arc<AnswerLatency>,
) {
    events.sink(Pipeline, "KafkaSink", move |(input, _)| {
        let mut sink = sink.borrow_mut();
        input.for_each(|_, data| {
            let answers: Vec<_> = data
                .drain(..)
                .filter_map(NodeEvent::into_answer)
                .inspect(|a| {
                    let (ms, mode, failed) = match a {
                        grflow_connectors::Answer::Response { row, origin } => {
                            (row.latency_ms, origin.mode, false)
                        }
                        grflow_connectors::Answer::Error {
                            latency_ms, origin, ..
                        } => (*latency_ms, origin.mode, true),
                    };
                    latency.record(ms, mode, failed);
                })
                .collect();
            // The Kafka sink holds what it cannot send and retries it; a
            // failure for good becomes a dead letter or stops the job.
            if let Err(e) = sink.write(answers) {
                tracing::error!(error = %e, "answer sink");
            }
        });
    });
}
