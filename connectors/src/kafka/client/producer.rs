//! The output producer: one per job, whose delivery reports name the
//! request record each output answers.

use std::sync::Arc;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Message};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};

use super::{KafkaClientError, KafkaSettings, kafka};
use crate::kafka::client_logs::logged_client_context;
use crate::kafka::wire::RecordId;

/// What the broker said about one output record.
#[derive(Debug)]
pub enum Delivery {
    /// Durable on the broker.
    Delivered { source: RecordId },
    /// Given up on by librdkafka (a permanent error): the caller decides
    /// whether to send it again.
    Failed {
        source: RecordId,
        topic: String,
        key: Option<Vec<u8>>,
        payload: Vec<u8>,
        error: String,
    },
}

/// Called on the producer's polling thread for every delivery report.
pub type DeliveryCallback = Arc<dyn Fn(Delivery) + Send + Sync>;

struct DeliveryContext {
    on_delivery: DeliveryCallback,
}

logged_client_context!(DeliveryContext);

impl ProducerContext for DeliveryContext {
    type DeliveryOpaque = Box<RecordId>;

    fn delivery(&self, result: &DeliveryResult<'_>, source: Self::DeliveryOpaque) {
        let report = match result {
            Ok(_) => Delivery::Delivered { source: *source },
            Err((error, message)) => Delivery::Failed {
                source: *source,
                topic: message.topic().to_string(),
                key: message.key().map(<[u8]>::to_vec),
                payload: message.payload().map(<[u8]>::to_vec).unwrap_or_default(),
                error: error.to_string(),
            },
        };
        (self.on_delivery)(report);
    }
}

/// Why an output could not be handed to the producer.
#[derive(Debug, thiserror::Error)]
pub enum SendError {
    /// The producer's local queue is full: try again after it drains.
    #[error("producer queue full")]
    QueueFull,
    #[error(transparent)]
    Client(#[from] KafkaClientError),
}

/// One producer for a job's outputs (responses, error records, dead letters).
#[allow(missing_debug_implementations)] // wraps an rdkafka client
pub struct OutputProducer {
    producer: ThreadedProducer<DeliveryContext>,
}

impl OutputProducer {
    /// A producer that waits for all in-sync replicas and retries transient
    /// errors without a deadline (a broker outage stalls, it does not drop).
    pub fn new(
        settings: &KafkaSettings,
        on_delivery: DeliveryCallback,
    ) -> Result<Self, KafkaClientError> {
        let producer = Self::client_config(settings)
            .create_with_context(DeliveryContext { on_delivery })
            .map_err(kafka("creating the producer"))?;
        Ok(Self { producer })
    }

    /// The librdkafka properties [`OutputProducer::new`] creates its
    /// producer with; public so that tests can read what a config sets.
    pub fn client_config(settings: &KafkaSettings) -> ClientConfig {
        settings.client_config_with(&[
            ("acks", "all"),
            ("message.timeout.ms", "0"),
            ("linger.ms", "2"),
            // Retries after a lost acknowledgement must not write twice.
            ("enable.idempotence", "true"),
            ("compression.type", settings.compression.as_str()),
        ])
    }

    /// Queues one record; its [`Delivery`] names `source`.
    pub fn send(
        &self,
        topic: &str,
        key: Option<&[u8]>,
        payload: &[u8],
        source: RecordId,
    ) -> Result<(), SendError> {
        let mut record = BaseRecord::with_opaque_to(topic, Box::new(source)).payload(payload);
        if let Some(key) = key {
            record = record.key(key);
        }
        self.queue(record)
    }

    /// Queues one record for an explicit partition (load generators, tests).
    pub fn send_to(
        &self,
        topic: &str,
        partition: i32,
        payload: &[u8],
        source: RecordId,
    ) -> Result<(), SendError> {
        let record = BaseRecord::<'_, [u8], [u8], _>::with_opaque_to(topic, Box::new(source))
            .payload(payload)
            .partition(partition);
        self.queue(record)
    }

    fn queue(&self, record: BaseRecord<'_, [u8], [u8], Box<RecordId>>) -> Result<(), SendError> {
        let topic = record.topic;
        self.producer.send(record).map_err(|(e, _)| match e {
            KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull) => SendError::QueueFull,
            other => SendError::Client(kafka(format!("producing to `{topic}`"))(other)),
        })
    }

    /// Waits until every queued record has a delivery report.
    pub fn flush(&self, timeout: Duration) -> Result<(), KafkaClientError> {
        self.producer.flush(timeout).map_err(kafka("flush"))
    }

    /// Records queued or in flight to the broker.
    pub fn in_flight(&self) -> i32 {
        self.producer.in_flight_count()
    }
}
