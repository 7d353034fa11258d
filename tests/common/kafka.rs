//! Helpers of the broker tests: a real Kafka-compatible broker (tansu in
//! CI, started by ./scripts/test.sh) named by GRFLOW_KAFKA_BROKERS, fresh
//! topics per test, a producer, a tail that reads topics from the start,
//! and `grflow serve` as a child process.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use grflow_connectors::kafka::{KafkaSettings, ensure_topics};
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::Message;
use rdkafka::producer::{BaseRecord, DefaultProducerContext, Producer, ThreadedProducer};
use rdkafka::{Offset, TopicPartitionList};

/// The broker's address, or `None` (and a printed reason) to skip.
pub fn broker(test: &str) -> Option<String> {
    match std::env::var("GRFLOW_KAFKA_BROKERS") {
        Ok(b) if !b.trim().is_empty() => Some(b),
        _ => {
            super::skip::skip(
                test,
                "GRFLOW_KAFKA_BROKERS is not set \
                 (./scripts/test.sh starts a tansu broker and sets it)",
            );
            None
        }
    }
}

#[derive(Clone, Debug)]
pub struct Topics {
    pub requests: String,
    pub responses: String,
    pub dead_letters: String,
    pub group: String,
}

impl Topics {
    /// Fresh names, so tests never see each other's records.
    pub fn fresh(tag: &str) -> Self {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos()
            % 1_000_000_000_000;
        Self::named(&format!("{tag}-{}-{nonce}", std::process::id()))
    }

    /// `{base}.requests`, `{base}.responses`, ...
    pub fn named(base: &str) -> Self {
        Self {
            requests: format!("{base}.requests"),
            responses: format!("{base}.responses"),
            dead_letters: format!("{base}.dead-letters"),
            group: format!("{base}.group"),
        }
    }

    pub fn create(&self, brokers: &str, partitions: i32) {
        let settings = KafkaSettings {
            brokers: brokers.to_string(),
            ..KafkaSettings::default()
        };
        ensure_topics(
            &settings,
            &[
                (&self.requests, partitions),
                (&self.responses, partitions),
                (&self.dead_letters, 1),
            ],
            -1,
            Duration::from_secs(10),
        )
        .expect("create topics");
    }
}

/// Grows `topic` to `total` partitions (Kafka's CreatePartitions); false,
/// after announcing that the rest of `test` is skipped, where the broker
/// cannot (tansu 0.6).
pub fn grow_partitions(test: &str, brokers: &str, topic: &str, total: usize) -> bool {
    use rdkafka::admin::{AdminClient, AdminOptions, NewPartitions};
    use rdkafka::client::DefaultClientContext;
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .create()
        .expect("admin client");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = match runtime
        .block_on(admin.create_partitions(&[NewPartitions::new(topic, total)], &opts))
    {
        Err(rdkafka::error::KafkaError::AdminOp(
            rdkafka::types::RDKafkaErrorCode::UnsupportedFeature,
        )) => {
            super::skip::skip(
                test,
                &format!(
                    "the broker at {brokers} cannot add partitions (CreatePartitions is \
                     unsupported; tansu 0.6), so what follows the first part is not run"
                ),
            );
            return false;
        }
        other => other.expect("create_partitions"),
    };
    for r in results {
        r.unwrap_or_else(|(t, code)| panic!("growing `{t}`: {code}"));
    }
    true
}

/// A serve config for `topics` (serve.toml, topics made by the test);
/// `kafka_extra` lines go into [kafka].
pub fn write_config(dir: &Path, topics: &Topics, kafka_extra: &str) -> PathBuf {
    write_config_as(dir, "serve.toml", topics, 0, kafka_extra)
}

/// A serve config `name` for `topics`, whose job creates missing topics
/// with `create_partitions` partitions (0: never).
pub fn write_config_as(
    dir: &Path,
    name: &str,
    topics: &Topics,
    create_partitions: i32,
    kafka_extra: &str,
) -> PathBuf {
    let text = format!(
        r#"
[run]
workers = 2

[trace]
users = 500
items = 5000
requests = 100

[kafka]
request_topic = "{}"
response_topic = "{}"
dead_letter_topic = "{}"
group_id = "{}"
create_partitions = {create_partitions}
refetch_from_start = true
commit_interval_ms = 200
metrics_interval_ms = 1000
{kafka_extra}
"#,
        topics.requests, topics.responses, topics.dead_letters, topics.group
    );
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

pub fn producer(brokers: &str) -> ThreadedProducer<DefaultProducerContext> {
    producer_compressed(brokers, "none")
}

/// A producer whose record batches use `codec` ("none", "zstd", "lz4", ...).
pub fn producer_compressed(brokers: &str, codec: &str) -> ThreadedProducer<DefaultProducerContext> {
    ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set("linger.ms", "5")
        .set("compression.type", codec)
        .create()
        .expect("producer")
}

/// Produces `(partition, payload)` records and waits until all are durable.
pub fn produce(brokers: &str, topic: &str, records: &[(i32, Option<Vec<u8>>)]) {
    produce_compressed(brokers, topic, records, "none");
}

/// `produce` in record batches compressed with `codec`.
pub fn produce_compressed(
    brokers: &str,
    topic: &str,
    records: &[(i32, Option<Vec<u8>>)],
    codec: &str,
) {
    let p = producer_compressed(brokers, codec);
    for (partition, payload) in records {
        loop {
            let mut r: BaseRecord<'_, [u8], [u8]> = BaseRecord::to(topic).partition(*partition);
            if let Some(payload) = payload {
                r = r.payload(payload.as_slice());
            }
            match p.send(r) {
                Ok(()) => break,
                Err((e, _)) => {
                    assert!(
                        e.to_string().contains("Queue full"),
                        "produce to {topic}: {e}"
                    );
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }
    p.flush(Duration::from_secs(60)).expect("flush");
}

/// One record read back.
#[derive(Clone, Debug)]
pub struct Read {
    pub partition: i32,
    pub offset: i64,
    pub payload: Vec<u8>,
}

/// Reads every partition of a topic from the start, as records arrive.
pub struct Tail {
    consumer: BaseConsumer,
    pub records: Vec<Read>,
    /// Distinct `req_id`s seen (records that are responses).
    pub req_ids: std::collections::BTreeSet<u64>,
}

impl Tail {
    pub fn new(brokers: &str, topic: &str, partitions: i32) -> Self {
        let consumer: BaseConsumer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("group.id", format!("tail-{topic}"))
            .set("enable.auto.commit", "false")
            .create()
            .expect("tail consumer");
        let mut tpl = TopicPartitionList::new();
        for p in 0..partitions {
            tpl.add_partition_offset(topic, p, Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&tpl).expect("assign");
        Self {
            consumer,
            records: Vec::new(),
            req_ids: Default::default(),
        }
    }

    /// Reads for up to `wait`, returning early once `done` holds.
    pub fn read_until(&mut self, wait: Duration, done: impl Fn(&Tail) -> bool) -> bool {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if done(self) {
                return true;
            }
            if let Some(m) = self.consumer.poll(Duration::from_millis(100)) {
                let m = m.expect("tail read");
                let payload = m.payload().unwrap_or_default().to_vec();
                if let Ok(v) = serde_json::from_slice::<serde_json::Value>(&payload)
                    && let Some(req) = v.get("req_id").and_then(|r| r.as_u64())
                {
                    self.req_ids.insert(req);
                }
                self.records.push(Read {
                    partition: m.partition(),
                    offset: m.offset(),
                    payload,
                });
            }
        }
        done(self)
    }

    /// Reads whatever arrives within `wait`.
    pub fn settle(&mut self, wait: Duration) {
        self.read_until(wait, |_| false);
    }
}

/// `grflow serve` as a child process, its output in files.
pub struct Serve {
    pub child: Child,
    pub stdout: PathBuf,
    pub stderr: PathBuf,
}

impl Serve {
    pub fn start(brokers: &str, config: &Path, tag: &str) -> Self {
        Self::start_with(brokers, config, tag, &[])
    }

    /// `start` with more command-line arguments (e.g. `--hostfile`).
    pub fn start_with(brokers: &str, config: &Path, tag: &str, extra: &[&str]) -> Self {
        Self::start_env(brokers, config, tag, extra, &[])
    }

    /// `start_with` with more environment variables (e.g. a password).
    pub fn start_env(
        brokers: &str,
        config: &Path,
        tag: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> Self {
        let dir = config.parent().unwrap();
        let stdout = dir.join(format!("{tag}.stdout"));
        let stderr = dir.join(format!("{tag}.stderr"));
        let child = Command::new(env!("CARGO_BIN_EXE_grflow"))
            .args(["serve", "--config"])
            .arg(config)
            .args(extra)
            .env("GRFLOW_KAFKA_BROKERS", brokers)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&stdout).unwrap())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .expect("spawn grflow serve");
        Self {
            child,
            stdout,
            stderr,
        }
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGKILL: no drain, no final commit.
    pub fn kill_hard(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// SIGTERM, then the summary it printed; panics unless it exits 0 in time.
    pub fn stop(self) -> serde_json::Value {
        super::process::signal(self.child.id(), "-TERM");
        self.summary()
    }

    /// Waits (at most 60 s) for the job to exit 0; the summary it printed.
    pub fn summary(mut self) -> serde_json::Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                assert!(
                    status.success(),
                    "grflow serve exited with {status}; stderr:\n{}",
                    self.stderr_text()
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "grflow serve did not stop within 60 s; stderr:\n{}",
                self.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let out = std::fs::read_to_string(&self.stdout).unwrap();
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("summary JSON: {e}\n{out}"))
    }
}

impl Serve {
    /// Waits (at most `wait`) for the process to end on its own; its status.
    pub fn exited_within(&mut self, wait: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }
}

impl Drop for Serve {
    /// A failed test must not leave the job running.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Responses grouped by req_id: each answer as (items, scores, error kind).
pub type Answer = (serde_json::Value, serde_json::Value, serde_json::Value);

pub fn answers_by_req(records: &[Read]) -> BTreeMap<u64, Vec<Answer>> {
    let mut by_req: BTreeMap<u64, Vec<Answer>> = BTreeMap::new();
    for r in records {
        let v: serde_json::Value = serde_json::from_slice(&r.payload).expect("response JSON");
        let req = v["req_id"].as_u64().expect("req_id");
        let kind = v["error"]["kind"].clone();
        by_req
            .entry(req)
            .or_default()
            .push((v["items"].clone(), v["scores"].clone(), kind));
    }
    by_req
}
