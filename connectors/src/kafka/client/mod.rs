//! The rdkafka client behind `grflow serve`: a consumer per worker that
//! reads its own partitions in assign mode (no group rebalancing) and
//! commits explicitly, one producer per job whose delivery reports say which
//! request record an output belongs to, topic administration, and the
//! restart scan of the response topic. Blocking calls only; no timely types.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};

/// How to reach the cluster, and extra librdkafka properties.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct KafkaSettings {
    /// `bootstrap.servers`, e.g. "127.0.0.1:9092".
    pub brokers: String,
    /// Consumer group the offsets are committed under.
    pub group_id: String,
    pub client_id: String,
    /// Passed to librdkafka as is (e.g. "socket.timeout.ms").
    pub extra: BTreeMap<String, String>,
    /// How the producer compresses what it writes (answers, dead letters).
    /// Consumers read every codec librdkafka was built with.
    pub compression: Compression,
}

/// A producer's `compression.type`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Compression {
    #[default]
    None,
    Gzip,
    Snappy,
    Lz4,
    Zstd,
}

impl Compression {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::Gzip => "gzip",
            Self::Snappy => "snappy",
            Self::Lz4 => "lz4",
            Self::Zstd => "zstd",
        }
    }
}

/// librdkafka's `builtin.features` (e.g. "gzip,snappy,ssl,sasl,...,
/// zstd"): what this build can speak (TLS, SASL mechanisms, codecs).
pub fn builtin_features() -> String {
    ClientConfig::new()
        .create_native_config()
        .and_then(|c| c.get("builtin.features"))
        .unwrap_or_default()
}

impl KafkaSettings {
    fn client_config(&self) -> ClientConfig {
        self.client_config_with(&[])
    }

    /// Our `defaults` for one kind of client, then the user's `extra`
    /// properties, which win: config validation refuses those the
    /// delivery guarantee rests on ([`refused_property`]).
    fn client_config_with(&self, defaults: &[(&str, &str)]) -> ClientConfig {
        let mut c = ClientConfig::new();
        c.set("bootstrap.servers", &self.brokers);
        if !self.client_id.is_empty() {
            c.set("client.id", &self.client_id);
        }
        for &(k, v) in defaults {
            c.set(k, v);
        }
        for (k, v) in &self.extra {
            c.set(k, v);
        }
        c
    }
}

/// Why `serve` refuses `key = value` among the user's librdkafka
/// properties (`kafka.librdkafka`), if it does: the properties grflow sets
/// itself because its delivery guarantee rests on them (an offset is
/// committed only once the answers before it are durable, answers are
/// written once, an outage stalls instead of dropping). Others pass through.
pub fn refused_property(key: &str, value: &str) -> Option<&'static str> {
    let value = value.trim().to_ascii_lowercase();
    let is = |allowed: &[&str]| allowed.contains(&value.as_str());
    match key.trim() {
        "group.id" => Some(
            "set kafka.group_id instead: it names the group serve commits and resumes under, and \
             this key would replace it",
        ),
        "enable.auto.commit" | "auto.commit.enable" if !is(&["false"]) => Some(
            "must stay \"false\": serve commits an offset only once the answers before it are \
             durable; librdkafka's own commits would not wait for them",
        ),
        "enable.auto.offset.store" if !is(&["false"]) => Some(
            "must stay \"false\": librdkafka would store each record's offset as it is read, \
             for a commit to send before its answer is durable",
        ),
        "auto.offset.reset" if !is(&["earliest", "smallest", "beginning"]) => Some(
            "must be \"earliest\" (kafka.start says where a partition without a commit starts): \
             a read position out of range (records deleted by retention, a log cut short or \
             created again) restarts at the log's start; \"latest\" would skip every request \
             not read yet, \"error\" would stop reading the partition",
        ),
        "acks" | "request.required.acks" if !is(&["all", "-1"]) => Some(
            "must be \"all\": an answer acknowledged by fewer than all in-sync replicas can be \
             lost after the offset of its request is committed",
        ),
        "enable.idempotence" if !is(&["true"]) => Some(
            "must stay \"true\": a retry after a lost acknowledgement would write an answer \
             twice",
        ),
        "message.timeout.ms" | "delivery.timeout.ms" if !is(&["0"]) => Some(
            "must stay \"0\" (no deadline): with one, answers waiting out a broker outage fail, \
             are dead-lettered as undeliverable and the job stops; one that timed out in flight \
             may have been written and is written again",
        ),
        _ => None,
    }
}

#[derive(Debug, thiserror::Error)]
pub enum KafkaClientError {
    // The cause is in the message and not a `#[source]`: `error: {:#}`
    // would print it twice.
    #[error("kafka: {what}: {cause}")]
    Kafka { what: String, cause: KafkaError },
    /// No broker answered in time: the usual first-run mistake (a wrong
    /// address, a broker not started), said as such.
    #[error(
        "no Kafka broker answered at {brokers} within {timeout_s} s ({what}: {cause}); is the \
         broker up, and are kafka.brokers (or GRFLOW_KAFKA_BROKERS) and kafka.librdkafka right?{security}"
    )]
    Unreachable {
        brokers: String,
        what: String,
        timeout_s: u64,
        /// librdkafka's words for it.
        cause: String,
        /// With TLS or SASL configured, what else ends this way.
        security: String,
    },
    #[error("topic `{topic}` does not exist on {brokers}")]
    NoSuchTopic { topic: String, brokers: String },
    #[error(
        "creating topic `{topic}` ({partitions} partitions, replication factor {replication}): {reason}"
    )]
    CreateTopic {
        topic: String,
        partitions: i32,
        replication: i32,
        reason: String,
    },
    #[error("kafka admin runtime: {0}")]
    Runtime(String),
}

fn kafka(what: impl Into<String>) -> impl FnOnce(KafkaError) -> KafkaClientError {
    let what = what.into();
    move |cause| KafkaClientError::Kafka { what, cause }
}

/// Whether `e` is a call that timed out waiting for any broker.
fn timed_out(e: &KafkaError) -> bool {
    let code = match e {
        KafkaError::AdminOp(code) | KafkaError::MetadataFetch(code) => code,
        _ => return false,
    };
    matches!(
        code,
        RDKafkaErrorCode::OperationTimedOut
            | RDKafkaErrorCode::RequestTimedOut
            | RDKafkaErrorCode::AllBrokersDown
            | RDKafkaErrorCode::BrokerTransportFailure
            | RDKafkaErrorCode::Resolve
    )
}

/// Like [`kafka`], but a timeout waiting for the brokers becomes
/// [`KafkaClientError::Unreachable`] naming them.
fn kafka_call(
    settings: &KafkaSettings,
    what: impl Into<String>,
    timeout: Duration,
) -> impl FnOnce(KafkaError) -> KafkaClientError {
    let (what, brokers) = (what.into(), settings.brokers.clone());
    let protocol = settings.extra.get("security.protocol").cloned();
    let mechanism = settings.extra.get("sasl.mechanism").cloned();
    move |cause| {
        if timed_out(&cause) {
            KafkaClientError::Unreachable {
                brokers,
                what,
                timeout_s: timeout.as_secs().max(1),
                cause: cause.to_string(),
                security: security_hint(protocol.as_deref(), mechanism.as_deref()),
            }
        } else {
            KafkaClientError::Kafka { what, cause }
        }
    }
}

/// What else a call that reached no broker may mean under the configured
/// `security.protocol` (and `sasl.mechanism`): librdkafka reports a refused
/// SASL login or a failed TLS handshake only as a broker that does not
/// answer.
fn security_hint(protocol: Option<&str>, mechanism: Option<&str>) -> String {
    let protocol = protocol.unwrap_or_default().to_ascii_lowercase();
    let sasl = protocol.contains("sasl");
    let tls = protocol.contains("ssl");
    // A bearer token logs in without a user or password.
    let credentials = if mechanism.is_some_and(|m| m.eq_ignore_ascii_case("OAUTHBEARER")) {
        "sasl.mechanism and the token's settings (sasl.oauthbearer.*)"
    } else {
        "sasl.mechanism, sasl.username and GRFLOW_KAFKA_SASL_PASSWORD"
    };
    match (sasl, tls) {
        (false, false) => String::new(),
        (true, _) => format!(
            " With security.protocol = {protocol:?}, a refused login ends this way too: check \
             {credentials}{}",
            if tls {
                ", and that ssl.ca.location holds the brokers' CA"
            } else {
                ""
            }
        ),
        (false, true) => format!(
            " With security.protocol = {protocol:?}, a failed TLS handshake ends this way too: \
             check that ssl.ca.location holds the brokers' CA and that their certificates name \
             the addresses in kafka.brokers"
        ),
    }
}

/// Where a partition starts when its group never committed an offset.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StartPosition {
    #[default]
    Earliest,
    Latest,
}

/// Where a partition with a committed offset is fetched from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Refetch {
    /// At the committed offset (any broker that implements Kafka's fetch).
    #[default]
    FromCommitted,
    /// From the start of the partition, skipping records below the committed
    /// offset as duplicates: for brokers that cannot fetch from an offset
    /// inside a record batch (tansu 0.6 returns nothing there).
    FromStart,
}

/// One consumed record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RawRecord {
    pub partition: i32,
    pub offset: i64,
    /// The record's broker/producer timestamp, ms since the Unix epoch.
    pub timestamp_ms: Option<i64>,
    /// `None` for a record without a value (a tombstone).
    pub payload: Option<Vec<u8>>,
}

/// Where a partition's reading starts: records below `offset` count as
/// consumed. Book it with `OffsetBook::start_uncommitted` when
/// `commit_start`, else with `OffsetBook::resume`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resumed {
    pub partition: i32,
    pub offset: i64,
    /// Whether `offset` came from a committed offset (a restart).
    pub from_commit: bool,
    /// The group's committed offset when it lay past the end of the log
    /// (the topic was deleted and created again, the log was cut short, or
    /// the group id was used on another topic): it was ignored and the
    /// partition read from the start position, since every record below
    /// it would otherwise be skipped as already consumed.
    pub past_end: Option<i64>,
    /// The group has no usable commit here and a restart would not come
    /// back to `offset` by itself (`start = "latest"`, or a commit past the
    /// log's end that would be trusted again once the log grows past it):
    /// `offset` must be committed even if nothing is read and even if it
    /// is 0, or what is produced while the job is down is skipped.
    pub commit_start: bool,
    /// The consumer fetches from the log's start, below `offset`
    /// ([`Refetch::FromStart`]), so records below it come back at first as
    /// the expected refetch. Otherwise a record below `offset` can only
    /// come from a log that started over.
    pub refetches_below: bool,
}

mod admin;
mod consumer;
mod producer;
mod scan;

pub use admin::{BrokerProbe, delete_topics, ensure_topics, partition_count};
pub use consumer::RequestConsumer;
pub use producer::{Delivery, DeliveryCallback, OutputProducer, SendError};
pub use scan::{scan_answered, scan_answers};

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::producer::{BaseProducer, Producer};

    /// A broker that never answers is named as such; a broker's refusal
    /// keeps its own message; the cause is printed once either way.
    #[test]
    fn timeouts_waiting_for_brokers_say_which_brokers() {
        let settings = KafkaSettings {
            brokers: "10.0.0.9:9092".into(),
            group_id: "g".into(),
            client_id: "c".into(),
            extra: BTreeMap::new(),
            compression: Compression::default(),
        };
        let timeout = Duration::from_secs(10);
        let e = kafka_call(&settings, "creating topics", timeout)(KafkaError::AdminOp(
            RDKafkaErrorCode::OperationTimedOut,
        ));
        // `error: {:#}` prints the chain: this error ends it.
        assert!(std::error::Error::source(&e).is_none());
        let said = e.to_string();
        assert!(
            said.starts_with("no Kafka broker answered at 10.0.0.9:9092 within 10 s"),
            "{said}"
        );
        assert_eq!(said.matches("OperationTimedOut").count(), 1, "{said}");
        let e = kafka_call(&settings, "creating topics", timeout)(KafkaError::AdminOp(
            RDKafkaErrorCode::TopicAuthorizationFailed,
        ));
        assert!(matches!(e, KafkaClientError::Kafka { .. }), "{e}");
    }

    /// With SASL or TLS configured, "no broker answered" also names what
    /// librdkafka reports the same way: a refused login, a failed handshake.
    #[test]
    fn an_unreachable_broker_under_sasl_or_tls_names_the_security_settings() {
        let timeout = Duration::from_secs(10);
        // With these librdkafka settings set.
        let said_with = |set: &[(&str, &str)]| {
            let mut settings = KafkaSettings {
                brokers: "b:9093".into(),
                ..KafkaSettings::default()
            };
            for (k, v) in set {
                settings.extra.insert((*k).into(), (*v).into());
            }
            kafka_call(&settings, "metadata", timeout)(KafkaError::MetadataFetch(
                RDKafkaErrorCode::BrokerTransportFailure,
            ))
            .to_string()
        };
        let said = |protocol: Option<&str>| match protocol {
            Some(p) => said_with(&[("security.protocol", p)]),
            None => said_with(&[]),
        };
        assert!(!said(None).contains("security.protocol"));
        let sasl = said(Some("SASL_PLAINTEXT"));
        assert!(sasl.contains("refused login") && sasl.contains("GRFLOW_KAFKA_SASL_PASSWORD"));
        // A bearer token has no password to check.
        let bearer = said_with(&[
            ("security.protocol", "sasl_ssl"),
            ("sasl.mechanism", "OAUTHBEARER"),
        ]);
        assert!(
            bearer.contains("sasl.oauthbearer.*")
                && !bearer.contains("GRFLOW_KAFKA_SASL_PASSWORD")
                && bearer.contains("ssl.ca.location"),
            "{bearer}"
        );
        assert!(!sasl.contains("ssl.ca.location"), "{sasl}");
        assert!(said(Some("sasl_ssl")).contains("ssl.ca.location"));
        let tls = said(Some("ssl"));
        assert!(
            tls.contains("TLS handshake") && !tls.contains("sasl"),
            "{tls}"
        );
    }

    /// The build speaks TLS, SASL PLAIN/SCRAM and every codec (rdkafka's
    /// `ssl` and `zstd` features; lz4, snappy and gzip are built in).
    #[test]
    fn librdkafka_is_built_with_tls_sasl_and_every_codec() {
        let features = builtin_features();
        for f in [
            "ssl",
            "sasl_plain",
            "sasl_scram",
            "gzip",
            "snappy",
            "lz4",
            "zstd",
        ] {
            assert!(
                features.split(',').any(|x| x.trim() == f),
                "{f} missing from {features:?}"
            );
        }
    }

    /// A client configured for SASL_SSL with SCRAM is accepted (a build
    /// without OpenSSL refuses these properties at creation).
    #[test]
    fn a_sasl_ssl_scram_client_can_be_created() {
        let settings = KafkaSettings {
            brokers: "127.0.0.1:1".into(),
            extra: [
                ("security.protocol", "sasl_ssl"),
                ("sasl.mechanism", "SCRAM-SHA-512"),
                ("sasl.username", "grflow"),
                ("sasl.password", "secret"),
                ("ssl.endpoint.identification.algorithm", "https"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
            compression: Compression::Zstd,
            ..KafkaSettings::default()
        };
        let producer: BaseProducer = settings
            .client_config_with(&[("compression.type", settings.compression.as_str())])
            .create()
            .expect("TLS + SCRAM + zstd settings accepted");
        drop(
            producer
                .client()
                .fetch_metadata(None, Duration::from_millis(1)),
        );
    }

    /// The properties grflow sets for its guarantee keep grflow's values
    /// (in any of librdkafka's spellings); the rest pass through.
    #[test]
    fn only_overrides_of_what_the_guarantee_rests_on_are_refused() {
        for (key, value) in [
            ("acks", "1"),
            ("request.required.acks", "0"),
            ("enable.idempotence", "false"),
            ("message.timeout.ms", "300000"),
            ("delivery.timeout.ms", "1"),
            ("enable.auto.commit", "true"),
            ("auto.commit.enable", "true"),
            ("enable.auto.offset.store", "true"),
            ("auto.offset.reset", "latest"),
            ("auto.offset.reset", "error"),
            ("group.id", "grflow"),
        ] {
            assert!(refused_property(key, value).is_some(), "{key} = {value}");
        }
        for (key, value) in [
            ("acks", "all"),
            ("acks", " -1 "),
            ("enable.idempotence", "True"),
            ("message.timeout.ms", "0"),
            ("enable.auto.commit", "false"),
            ("enable.auto.offset.store", "false"),
            ("auto.offset.reset", "smallest"),
            ("auto.offset.reset", "beginning"),
            ("fetch.wait.max.ms", "500"),
            ("isolation.level", "read_uncommitted"),
            ("linger.ms", "20"),
            ("security.protocol", "sasl_ssl"),
        ] {
            assert_eq!(refused_property(key, value), None, "{key} = {value}");
        }
    }

    #[test]
    fn compression_names_parse_as_librdkafka_spells_them() {
        for c in [
            Compression::None,
            Compression::Gzip,
            Compression::Snappy,
            Compression::Lz4,
            Compression::Zstd,
        ] {
            let json = format!("\"{}\"", c.as_str());
            assert_eq!(serde_json::from_str::<Compression>(&json).unwrap(), c);
        }
        assert!(serde_json::from_str::<Compression>("\"brotli\"").is_err());
    }
}
