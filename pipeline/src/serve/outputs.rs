//! One worker's outputs to Kafka: responses and error records on the
//! response topic (key = req_id), dead letters on the dead-letter topic.
//! A record the producer's queue cannot take yet waits here, in order, and
//! is offered again; nothing is dropped.

use std::collections::VecDeque;
use std::sync::Arc;

use grflow_connectors::kafka::{OutputProducer, RecordId, SendError, WireResponse};

use super::shared::{FailedOutput, ServeCounters, SharedState};
use crate::events::{ErrorKind, NodeEvent, now_ns};

#[derive(Debug)]
struct Pending {
    topic: String,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    source: RecordId,
}

#[allow(missing_debug_implementations)] // holds the producer
pub struct OutputQueue {
    producer: Arc<OutputProducer>,
    shared: Arc<SharedState>,
    response_topic: String,
    unsent: VecDeque<Pending>,
}

/// The request record an answer belongs to.
fn record_id(position: &grflow_connectors::SourcePosition) -> Option<RecordId> {
    match position {
        grflow_connectors::SourcePosition::Kafka {
            partition, offset, ..
        } => Some(RecordId {
            partition: *partition,
            offset: *offset,
        }),
        grflow_connectors::SourcePosition::Parquet { .. } => None,
    }
}

impl OutputQueue {
    pub fn new(
        producer: Arc<OutputProducer>,
        shared: Arc<SharedState>,
        response_topic: &str,
    ) -> Self {
        Self {
            producer,
            shared,
            response_topic: response_topic.to_string(),
            unsent: VecDeque::new(),
        }
    }

    /// Turns a node's answer into a response record and sends it.
    pub fn answer(&mut self, event: NodeEvent) {
        let (response, admitted_ns) = match event {
            NodeEvent::Response(boxed) => {
                let (row, origin) = *boxed;
                let Some(source) = record_id(&origin.position) else {
                    return;
                };
                ServeCounters::add(&self.shared.counters.responses, 1);
                if origin.recovered_late {
                    ServeCounters::add(&self.shared.counters.recovered_unshed, 1);
                }
                let response = WireResponse::ranking(
                    source,
                    row.req_id,
                    row.items,
                    &row.scores,
                    row.model_version,
                );
                (
                    response.timed(row.node, origin.ts_ms, 0.0),
                    origin.admitted_ns,
                )
            }
            NodeEvent::Error(boxed) => {
                let (row, kind, origin) = *boxed;
                let Some(source) = record_id(&origin.position) else {
                    return;
                };
                let counter = match kind {
                    ErrorKind::Shed => &self.shared.counters.shed,
                    ErrorKind::Unservable => &self.shared.counters.unservable,
                };
                ServeCounters::add(counter, 1);
                let req_id = row.req_id.unwrap_or_default();
                let response = WireResponse::failed(source, req_id, kind.as_str(), row.reason);
                (response.timed(0, origin.ts_ms, 0.0), origin.admitted_ns)
            }
            NodeEvent::Telemetry(_) | NodeEvent::Report(_) => return,
        };
        let latency_ms = now_ns().saturating_sub(admitted_ns) as f64 / 1e6;
        let mut response = response;
        response.latency_ms = (latency_ms * 1e3).round() / 1e3;
        self.shared.record_latency(latency_ms);
        let payload = serde_json::to_vec(&response).expect("responses serialize");
        let key = response.req_id.to_string().into_bytes();
        let topic = self.response_topic.clone();
        self.send(topic, Some(key), payload, response.source());
    }

    /// Sends one record, or keeps it for [`OutputQueue::retry`].
    pub fn send(
        &mut self,
        topic: String,
        key: Option<Vec<u8>>,
        payload: Vec<u8>,
        source: RecordId,
    ) {
        self.unsent.push_back(Pending {
            topic,
            key,
            payload,
            source,
        });
        self.retry();
    }

    /// Offers waiting records to the producer again, plus any the producer
    /// gave up on. Returns how many still wait.
    pub fn retry(&mut self) -> usize {
        for FailedOutput {
            source,
            topic,
            key,
            payload,
        } in self.shared.take_failed()
        {
            ServeCounters::add(&self.shared.counters.resent, 1);
            self.unsent.push_back(Pending {
                topic,
                key,
                payload,
                source,
            });
        }
        while let Some(p) = self.unsent.front() {
            match self
                .producer
                .send(&p.topic, p.key.as_deref(), &p.payload, p.source)
            {
                Ok(()) => {
                    self.unsent.pop_front();
                }
                Err(SendError::QueueFull) => break,
                Err(SendError::Client(e)) => {
                    // Often temporary (a topic error right after a failed
                    // batch), sometimes not (an invalid topic name): keep it,
                    // so its offset is never committed, and say why.
                    tracing::error!(error = %e, topic = %p.topic, "cannot produce; will retry");
                    break;
                }
            }
        }
        self.unsent.len()
    }

    pub fn waiting(&self) -> usize {
        self.unsent.len()
    }
}
