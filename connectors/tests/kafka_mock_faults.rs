//! Fault injection against the Kafka client wrapper (`kafka::client`), on
//! librdkafka's in-process mock cluster: no external broker, so these run in
//! CI. Each test owns its own cluster (brokers 1..=3), so they can run in
//! parallel.
//!
//! What the mock can do and what it cannot, as far as these tests rely on it:
//! - `broker_down` closes the broker's connections and refuses new ones, and
//!   drops the broker from Metadata answers; it does *not* move leadership,
//!   so partitions it leads stall until `broker_up`.
//! - Errors pushed with `request_errors` fail a whole request before
//!   anything is appended, so they never leave duplicates on the topic.
//! - Topics are created with `create_topic` (the mock has no CreateTopics).
//! - Offset commits from an assign-mode consumer (no JoinGroup) are stored
//!   per group and partition and read back by OffsetFetch, like a broker.
//! - `broker_round_trip_time` delays answers, not appends: a broker taken
//!   down then leaves records written but never acknowledged.
//!
//! The [`KafkaSource`] tests drive one worker's source on the mock: the
//! in-flight caps within one poll, and partitions counted before it opened.
//!
//! A position out of range (retention or truncation past it) is an
//! `OFFSET_OUT_OF_RANGE` pushed onto the next Fetch: librdkafka then resets
//! the partition as `auto.offset.reset` says. A log created again while
//! serving (the mock cannot delete a topic) is an offset book that read
//! further than the mock's log reaches.
//!
//! Kept out: `ensure_topics` (no CreateTopics in the mock).

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use grflow_connectors::kafka::{
    Admission, Delivery, DeliveryCallback, KafkaSettings, KafkaSource, OffsetBook, OutputProducer,
    RawRecord, RecordId, Refetch, RequestConsumer, Resumed, SharedState, StartPosition,
    WireResponse, owned_partitions, partition_count, scan_answered,
};
use grflow_connectors::source::SourceRecord;
use rdkafka::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::mocking::{MockCluster, MockCoordinator};
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};
use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

/// Upper bound for anything that waits on the cluster; a healthy run needs
/// a small fraction of it.
const WAIT: Duration = Duration::from_secs(20);
/// Timeout handed to blocking client calls (metadata, committed offsets).
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(50);

type Mock = MockCluster<'static, DefaultProducerContext>;

fn mock_cluster() -> Mock {
    MockCluster::new(3).expect("mock cluster")
}

/// A topic with `leaders[p]` leading partition `p` (replication factor 3).
fn create_topic(mock: &Mock, topic: &str, leaders: &[i32]) {
    mock.create_topic(topic, leaders.len() as i32, 3)
        .expect("create topic");
    for (p, &leader) in leaders.iter().enumerate() {
        mock.partition_leader(topic, p as i32, Some(leader))
            .expect("set leader");
    }
}

/// An assign-mode consumer of `partitions`, from the start when never committed.
fn open_consumer(
    settings: &KafkaSettings,
    topic: &str,
    partitions: &[i32],
    refetch: Refetch,
) -> (RequestConsumer, Vec<Resumed>) {
    RequestConsumer::open(
        settings,
        topic,
        partitions,
        StartPosition::Earliest,
        refetch,
        CALL_TIMEOUT,
    )
    .unwrap()
}

fn settings(mock: &Mock, group: &str) -> KafkaSettings {
    KafkaSettings {
        brokers: mock.bootstrap_servers(),
        group_id: group.to_string(),
        client_id: format!("kafka-mock-faults-{group}"),
        extra: BTreeMap::new(),
        ..KafkaSettings::default()
    }
}

fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A [`Delivery::Failed`] report.
#[derive(Debug)]
struct Failed {
    source: RecordId,
    topic: String,
    key: Option<Vec<u8>>,
    payload: Vec<u8>,
    error: String,
}

/// Delivery reports, as the producer's callback saw them.
#[derive(Default)]
struct Reports {
    delivered: HashMap<RecordId, u32>,
    failed: Vec<Failed>,
}

impl Reports {
    fn total(&self) -> usize {
        self.delivered.values().map(|&n| n as usize).sum::<usize>() + self.failed.len()
    }
}

fn collector() -> (Arc<Mutex<Reports>>, DeliveryCallback) {
    let reports = Arc::new(Mutex::new(Reports::default()));
    let sink = reports.clone();
    let callback: DeliveryCallback = Arc::new(move |d| {
        let mut r = sink.lock().unwrap();
        match d {
            Delivery::Delivered { source } => *r.delivered.entry(source).or_default() += 1,
            Delivery::Failed {
                source,
                topic,
                key,
                payload,
                error,
            } => r.failed.push(Failed {
                source,
                topic,
                key,
                payload,
                error,
            }),
        }
    });
    (reports, callback)
}

/// The `i`-th output: a response whose source is a distinct request record.
fn output(i: i64) -> (RecordId, Vec<u8>, Vec<u8>) {
    let source = RecordId {
        partition: (i % 4) as i32,
        offset: i,
    };
    let response = WireResponse::ranking(source, i as u64, vec![i as u32], &[0.5], "v1".into());
    (
        source,
        (i as u64).to_be_bytes().to_vec(),
        serde_json::to_vec(&response).unwrap(),
    )
}

/// Sends a failed output again, as the serve loop does: right after a
/// permanent error librdkafka may reject the send itself for a moment (the
/// topic carries the error until its metadata is refreshed), so keep trying.
/// Returns how many sends were rejected.
fn resend(producer: &OutputProducer, f: &Failed) -> usize {
    let deadline = Instant::now() + WAIT;
    let mut rejected = 0;
    while let Err(e) = producer.send(&f.topic, f.key.as_deref(), &f.payload, f.source) {
        rejected += 1;
        assert!(Instant::now() < deadline, "resending {:?}: {e}", f.source);
        std::thread::sleep(Duration::from_millis(10));
    }
    rejected
}

fn send_outputs(producer: &OutputProducer, topic: &str, range: std::ops::Range<i64>) {
    for i in range {
        let (source, key, payload) = output(i);
        producer
            .send(topic, Some(&key), &payload, source)
            .expect("send (500 records never fill the queue)");
    }
}

/// Every record of every partition of `topic`, read by a [`RequestConsumer`]
/// of a fresh group up to the high watermarks as of the call.
fn read_back(settings: &KafkaSettings, topic: &str) -> Vec<RawRecord> {
    let partitions: Vec<i32> =
        (0..partition_count(settings, topic, CALL_TIMEOUT).unwrap()).collect();
    let probe: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", &settings.brokers)
        .create()
        .unwrap();
    let mut ends = BTreeMap::new();
    for &p in &partitions {
        let (_, high) = probe.fetch_watermarks(topic, p, CALL_TIMEOUT).unwrap();
        if high > 0 {
            ends.insert(p, high);
        }
    }
    let readback = KafkaSettings {
        group_id: format!("{}-readback", settings.group_id),
        ..settings.clone()
    };
    let (consumer, _) = open_consumer(&readback, topic, &partitions, Refetch::FromCommitted);
    let mut records = Vec::new();
    let deadline = Instant::now() + WAIT;
    while !ends.is_empty() {
        assert!(
            Instant::now() < deadline,
            "read-back of `{topic}` stalled; partitions left: {ends:?}"
        );
        if let Some(Ok(r)) = consumer.poll(POLL) {
            if ends
                .get(&r.partition)
                .is_some_and(|&end| r.offset + 1 >= end)
            {
                ends.remove(&r.partition);
            }
            records.push(r);
        }
    }
    records
}

/// How many times each output (by its source) is on `topic`.
fn copies_on_topic(settings: &KafkaSettings, topic: &str) -> BTreeMap<RecordId, usize> {
    let mut copies = BTreeMap::new();
    for r in read_back(settings, topic) {
        let response: WireResponse = serde_json::from_slice(r.payload.as_deref().unwrap()).unwrap();
        *copies.entry(response.source()).or_default() += 1;
    }
    copies
}

/// An idempotent producer (ordered, no duplicates) writing `payload(p, o)`
/// to offsets `from..to` of each partition `p` of `partitions`, whose
/// partitions must hold exactly `from` records.
fn produce_fixed(brokers: &str, topic: &str, partitions: &[i32], from: i64, to: i64) {
    let records =
        (from..to).flat_map(|o| partitions.iter().map(move |&p| (p, fixed_payload(p, o))));
    send_all(brokers, true, topic, records);
}

/// Sends `(partition, payload)` records to `topic` in order and waits for
/// every one (`idempotent`: ordered, no duplicates).
fn send_all(
    brokers: &str,
    idempotent: bool,
    topic: &str,
    records: impl IntoIterator<Item = (i32, impl AsRef<[u8]>)>,
) {
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", brokers)
        .set(
            "enable.idempotence",
            if idempotent { "true" } else { "false" },
        )
        .set("linger.ms", "1")
        .create()
        .unwrap();
    for (p, payload) in records {
        producer
            .send(
                BaseRecord::<(), [u8]>::to(topic)
                    .partition(p)
                    .payload(payload.as_ref()),
            )
            .expect("send");
    }
    producer.flush(WAIT).expect("flush");
}

fn fixed_payload(partition: i32, offset: i64) -> String {
    format!("p{partition}-o{offset}")
}

/// Polls `consumer` until `done(book)`, feeding every record to `book`.
/// Transient errors (a broker going away) are counted, not fatal: that is
/// how the serve loop treats them.
fn consume_until(
    consumer: &RequestConsumer,
    book: &mut OffsetBook,
    what: &str,
    done: impl Fn(&OffsetBook) -> bool,
) -> (Vec<(RawRecord, Admission)>, usize) {
    let mut records = Vec::new();
    let mut errors = 0;
    let deadline = Instant::now() + WAIT;
    while !done(book) {
        assert!(
            Instant::now() < deadline,
            "timed out consuming {what}; got {} records",
            records.len()
        );
        match consumer.poll(POLL) {
            None => {}
            Some(Err(_)) => errors += 1,
            Some(Ok(r)) => {
                let admission = book.consume(r.partition, r.offset).unwrap();
                records.push((r, admission));
            }
        }
    }
    (records, errors)
}

fn next_offset(book: &OffsetBook, partition: i32) -> i64 {
    book.partition(partition).map_or(0, |p| p.next_offset())
}

/// Offsets consumed per partition, checking each is `New`, carries the
/// payload it was produced with, and follows the previous one without a gap.
fn check_contiguous(
    records: &[(RawRecord, Admission)],
    first: &BTreeMap<i32, i64>,
) -> BTreeMap<i32, i64> {
    let mut next = first.clone();
    for (r, admission) in records {
        assert_eq!(*admission, Admission::New, "{r:?}");
        let expected = next.get_mut(&r.partition).expect("an assigned partition");
        assert_eq!(
            r.offset, *expected,
            "gap or repeat on partition {}",
            r.partition
        );
        assert_eq!(
            r.payload.as_deref(),
            Some(fixed_payload(r.partition, r.offset).as_bytes())
        );
        *expected += 1;
    }
    next
}

#[test]
fn mock_broker_down_then_up_every_output_is_delivered_exactly_once() {
    const N: i64 = 500;
    const LEADER: i32 = 2;
    let started = Instant::now();
    let mock = mock_cluster();
    let topic = "responses";
    create_topic(&mock, topic, &[LEADER, LEADER]);
    // Answers from the leader take 100 ms, so when it goes down some
    // requests are appended on the broker but not yet acknowledged: the
    // producer must send those again (possibly persisted, retried).
    mock.broker_round_trip_time(LEADER, Duration::from_millis(100))
        .unwrap();
    let settings = settings(&mock, "broker-down");
    let (reports, callback) = collector();
    let producer = OutputProducer::new(&settings, callback).unwrap();

    // Outputs stream in batches of 20 every 20 ms (~0.5 s); the leader goes
    // down once a third of them is acknowledged (or, on a slow machine, two
    // thirds are sent), with more in flight and at least a third still to
    // come, and stays down for a second.
    let mut sent = 0;
    let mut down_at = None;
    let mut sent_before_the_outage = 0;
    while sent < N {
        let next = (sent + 20).min(N);
        send_outputs(&producer, topic, sent..next);
        sent = next;
        if down_at.is_none()
            && (reports.lock().unwrap().total() as i64 >= N / 3 || sent >= 2 * N / 3)
        {
            mock.broker_down(LEADER).unwrap();
            down_at = Some(Instant::now());
            sent_before_the_outage = sent;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let down_at = down_at.expect("the leader went down");
    std::thread::sleep(Duration::from_secs(1).saturating_sub(down_at.elapsed()));
    let reported_by_the_outage_end = reports.lock().unwrap().total();
    assert!(
        producer.in_flight() > 0,
        "the outage must leave outputs waiting"
    );
    mock.broker_up(LEADER).unwrap();
    producer
        .flush(WAIT)
        .expect("flush after the broker came back");
    assert_eq!(producer.in_flight(), 0);

    let reports = reports.lock().unwrap();
    assert!(
        reports.failed.is_empty(),
        "message.timeout.ms=0 never gives up: {:?}",
        reports.failed
    );
    let sources: BTreeSet<RecordId> = (0..N).map(|i| output(i).0).collect();
    assert_eq!(reports.delivered.len(), N as usize, "one report per source");
    for source in &sources {
        assert_eq!(reports.delivered.get(source), Some(&1), "{source:?}");
    }

    // On the topic: nothing lost. A batch appended whose ack the outage
    // cut off is sent again by the retry, with its producer id and
    // sequence: the producer is idempotent, so a Kafka broker drops that
    // copy. The mock cannot: it checks sequences only for transactional
    // producers (librdkafka 2.12.1, rdkafka_mock.c,
    // `rd_kafka_mock_validate_records`), and appends the retry again. So
    // copies are asserted only to come from the outage's retries, and the
    // idempotence the real broker needs is asserted on the configuration.
    assert_eq!(
        OutputProducer::client_config(&settings).get("enable.idempotence"),
        Some("true")
    );
    let copies = copies_on_topic(&settings, topic);
    let missing: Vec<&RecordId> = sources.iter().filter(|s| !copies.contains_key(s)).collect();
    assert!(missing.is_empty(), "lost outputs: {missing:?}");
    assert_eq!(copies.len(), sources.len(), "nothing else on the topic");
    let duplicates: usize = copies.values().map(|&n| n - 1).sum();
    // Output `i` answers source offset `i`.
    let sent_later: Vec<_> = copies
        .iter()
        .filter(|&(s, &n)| n > 1 && s.offset >= sent_before_the_outage)
        .collect();
    assert!(
        sent_later.is_empty(),
        "sent after the outage began, written twice: {sent_later:?}"
    );
    // The restart scan sees the same set.
    let answered = scan_answered(&settings, topic, "requests", N * 2, CALL_TIMEOUT).unwrap();
    assert_eq!(answered.into_iter().collect::<BTreeSet<_>>(), sources);
    eprintln!(
        "broker down/up: {N} outputs, {reported_by_the_outage_end} reported before the leader came back, \
         {duplicates} extra copies on the topic (the mock does not deduplicate), {:.2?}",
        started.elapsed()
    );
}

#[test]
fn mock_produce_request_errors_are_retried() {
    const N: i64 = 500;
    let started = Instant::now();
    let mock = mock_cluster();
    let topic = "responses";
    create_topic(&mock, topic, &[1, 2, 3]);
    let settings = settings(&mock, "produce-errors");
    let (reports, callback) = collector();
    let producer = OutputProducer::new(&settings, callback).unwrap();

    // Each error fails one whole Produce request, whichever broker gets it;
    // all but the last are retriable (some with a metadata refresh first).
    // The errors are served first in, first out, so the permanent one at the
    // end fails a batch only after all retriable ones were served: proof that
    // the retries really happened.
    let errors = [
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_KAFKA_STORAGE_ERROR,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT,
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION,
        // Permanent for the one batch it answers (unlike
        // TOPIC_AUTHORIZATION_FAILED, which fails everything queued for the
        // topic).
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE,
    ];
    mock.request_errors(RDKafkaApiKey::Produce, &errors);
    // In five rounds, so that the errors meet more than one batch.
    for round in 0..5 {
        send_outputs(&producer, topic, round * N / 5..(round + 1) * N / 5);
        std::thread::sleep(Duration::from_millis(20));
    }
    producer.flush(WAIT).expect("flush");

    // Only the batch that met the permanent error failed; sent again, it is
    // delivered like the rest.
    let failed = std::mem::take(&mut reports.lock().unwrap().failed);
    assert!(
        !failed.is_empty(),
        "the permanent error was never served, so neither were all retriable ones"
    );
    for f in &failed {
        assert!(f.error.contains("MessageSizeTooLarge"), "{f:?}");
        assert!(!reports.lock().unwrap().delivered.contains_key(&f.source));
        resend(&producer, f);
    }
    producer.flush(WAIT).expect("flush of the resent outputs");

    let reports = reports.lock().unwrap();
    assert!(reports.failed.is_empty(), "{:?}", reports.failed);
    assert_eq!(reports.delivered.len(), N as usize);
    for i in 0..N {
        assert_eq!(reports.delivered.get(&output(i).0), Some(&1), "output {i}");
    }
    // The mock fails injected requests before appending, so here the topic
    // must hold each output exactly once. Retries may reorder them.
    let copies = copies_on_topic(&settings, topic);
    let wrong: Vec<(RecordId, usize)> = (0..N)
        .map(|i| output(i).0)
        .map(|s| (s, copies.get(&s).copied().unwrap_or(0)))
        .filter(|&(_, n)| n != 1)
        .collect();
    assert!(wrong.is_empty(), "(output, copies on the topic): {wrong:?}");
    assert_eq!(copies.len(), N as usize, "nothing else on the topic");
    eprintln!(
        "produce errors: {} injected, {} outputs failed and were resent, \
         {N} outputs once each, {:.2?}",
        errors.len(),
        failed.len(),
        started.elapsed()
    );
}

#[test]
fn mock_leader_change_consumer_resumes_and_commits() {
    const HALF: i64 = 50;
    const ACKED: i64 = 75;
    let started = Instant::now();
    let mock = mock_cluster();
    let topic = "requests";
    let partitions = [0, 1];
    create_topic(&mock, topic, &[1, 2]);
    let settings = settings(&mock, "leader-change");
    produce_fixed(&settings.brokers, topic, &partitions, 0, HALF);

    let (consumer, resumed) = open_consumer(&settings, topic, &partitions, Refetch::FromCommitted);
    assert_eq!(
        resumed,
        partitions
            .iter()
            .map(|&partition| Resumed {
                partition,
                offset: 0,
                from_commit: false,
                past_end: None,
                commit_start: false,
                refetches_below: false,
            })
            .collect::<Vec<_>>()
    );
    let mut book = OffsetBook::new();
    for r in &resumed {
        book.resume(r.partition, r.offset);
    }

    // First half, all acknowledged and committed under the first leaders.
    let (first, _) = consume_until(&consumer, &mut book, "the first half", |b| {
        partitions.iter().all(|&p| next_offset(b, p) >= HALF)
    });
    let next = check_contiguous(&first, &BTreeMap::from([(0, 0), (1, 0)]));
    for (r, _) in &first {
        book.ack(r.partition, r.offset).unwrap();
    }
    assert_eq!(book.take_commits(), vec![(0, HALF), (1, HALF)]);
    consumer.commit(&[(0, HALF), (1, HALF)], true).unwrap();

    // Both partitions move to broker 3; the second half is produced (the
    // producer follows too) and must be fetched from the new leader.
    mock.partition_leader(topic, 0, Some(3)).unwrap();
    mock.partition_leader(topic, 1, Some(3)).unwrap();
    produce_fixed(&settings.brokers, topic, &partitions, HALF, 2 * HALF);
    let (second, errors) = consume_until(&consumer, &mut book, "the second half", |b| {
        partitions.iter().all(|&p| next_offset(b, p) >= 2 * HALF)
    });
    let next = check_contiguous(&second, &next);
    assert_eq!(next, BTreeMap::from([(0, 2 * HALF), (1, 2 * HALF)]));
    // Only outputs below ACKED became durable: the commit stops there and
    // the rest must be read again after a restart.
    for (r, _) in &second {
        if r.offset < ACKED {
            book.ack(r.partition, r.offset).unwrap();
        }
    }
    assert_eq!(book.in_flight(), 2 * (2 * HALF - ACKED) as usize);
    let commits = book.take_commits();
    assert_eq!(commits, vec![(0, ACKED), (1, ACKED)]);
    consumer.commit(&commits, true).unwrap();
    drop(consumer);

    // A restart in the same group resumes at the commit, on both partitions.
    let (consumer, resumed) = open_consumer(&settings, topic, &partitions, Refetch::FromCommitted);
    assert_eq!(
        resumed,
        partitions
            .iter()
            .map(|&partition| Resumed {
                partition,
                offset: ACKED,
                from_commit: true,
                past_end: None,
                commit_start: false,
                refetches_below: false,
            })
            .collect::<Vec<_>>()
    );
    let mut book = OffsetBook::new();
    for r in &resumed {
        book.resume(r.partition, r.offset);
    }
    let (rest, _) = consume_until(&consumer, &mut book, "the rest", |b| {
        partitions.iter().all(|&p| next_offset(b, p) >= 2 * HALF)
    });
    // Exactly ACKED..2*HALF on each partition: nothing below the commit,
    // no gap, no repeat.
    let next = check_contiguous(&rest, &BTreeMap::from([(0, ACKED), (1, ACKED)]));
    assert_eq!(next, BTreeMap::from([(0, 2 * HALF), (1, 2 * HALF)]));
    assert_eq!(rest.len(), 2 * (2 * HALF - ACKED) as usize);
    assert_eq!(book.duplicates(), 0);
    for (r, _) in &rest {
        book.ack(r.partition, r.offset).unwrap();
    }
    let commits = book.take_commits();
    assert_eq!(commits, vec![(0, 2 * HALF), (1, 2 * HALF)]);
    consumer.commit(&commits, true).unwrap();
    drop(consumer);

    // Refetch::FromStart (for brokers that cannot fetch mid-batch) reads
    // from offset 0 again but reports all of it as duplicates.
    let (consumer, resumed) = open_consumer(&settings, topic, &partitions, Refetch::FromStart);
    assert!(
        resumed
            .iter()
            .all(|r| r.from_commit && r.offset == 2 * HALF),
        "{resumed:?}"
    );
    let mut book = OffsetBook::new();
    for r in &resumed {
        book.resume(r.partition, r.offset);
    }
    let (again, _) = consume_until(&consumer, &mut book, "the refetch", |b| {
        b.duplicates() >= (2 * 2 * HALF) as u64
    });
    assert!(again.iter().all(|(_, a)| *a == Admission::Duplicate));
    assert_eq!(book.in_flight(), 0);
    assert_eq!(book.take_commits(), vec![]);
    eprintln!(
        "leader change: {} transient consumer errors, {:.2?}",
        errors,
        started.elapsed()
    );
}

#[test]
fn mock_consumer_survives_broker_down() {
    const HALF: i64 = 50;
    const LEADER: i32 = 1;
    let started = Instant::now();
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[LEADER]);
    let settings = settings(&mock, "consumer-down");
    produce_fixed(&settings.brokers, topic, &[0], 0, HALF);
    let (consumer, resumed) = open_consumer(&settings, topic, &[0], Refetch::FromCommitted);
    let mut book = OffsetBook::new();
    book.resume(0, resumed[0].offset);
    let (first, _) = consume_until(&consumer, &mut book, "the first half", |b| {
        next_offset(b, 0) >= HALF
    });
    let next = check_contiguous(&first, &BTreeMap::from([(0, 0)]));

    // The leader goes away; the second half is produced meanwhile (its
    // producer stalls until the leader is back).
    mock.broker_down(LEADER).unwrap();
    let brokers = settings.brokers.clone();
    let producing =
        std::thread::spawn(move || produce_fixed(&brokers, topic, &[0], HALF, 2 * HALF));
    let down_until = Instant::now() + Duration::from_secs(1);
    let mut errors = 0;
    while Instant::now() < down_until {
        match consumer.poll(POLL) {
            None => {}
            Some(Err(_)) => errors += 1,
            Some(Ok(r)) => panic!("a record from a partition whose leader is down: {r:?}"),
        }
    }
    mock.broker_up(LEADER).unwrap();
    producing.join().unwrap();

    let (second, more_errors) = consume_until(&consumer, &mut book, "the second half", |b| {
        next_offset(b, 0) >= 2 * HALF
    });
    let next = check_contiguous(&second, &next);
    assert_eq!(next, BTreeMap::from([(0, 2 * HALF)]));
    for (r, _) in first.iter().chain(&second) {
        book.ack(r.partition, r.offset).unwrap();
    }
    let commits = book.take_commits();
    assert_eq!(commits, vec![(0, 2 * HALF)]);
    consumer.commit(&commits, true).unwrap();
    drop(consumer);

    let (_, resumed) = open_consumer(&settings, topic, &[0], Refetch::FromCommitted);
    assert_eq!(
        resumed,
        vec![Resumed {
            partition: 0,
            offset: 2 * HALF,
            from_commit: true,
            past_end: None,
            commit_start: false,
            refetches_below: false,
        }]
    );
    eprintln!(
        "consumer broker down: {} transient errors, {:.2?}",
        errors + more_errors,
        started.elapsed()
    );
}

#[test]
fn mock_permanent_produce_error_reports_failed_with_the_output() {
    let mock = mock_cluster();
    let topic = "responses";
    create_topic(&mock, topic, &[1]);
    let settings = settings(&mock, "produce-permanent");
    let (reports, callback) = collector();
    let producer = OutputProducer::new(&settings, callback).unwrap();
    // TOPIC_AUTHORIZATION_FAILED is one of the errors librdkafka does not
    // retry, even with message.timeout.ms=0.
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    let (source, key, payload) = output(7);
    producer.send(topic, Some(&key), &payload, source).unwrap();
    producer.flush(WAIT).unwrap();
    wait_until("the failure report", || {
        reports.lock().unwrap().total() == 1
    });
    {
        let r = reports.lock().unwrap();
        assert!(r.delivered.is_empty());
        let f = &r.failed[0];
        assert_eq!(
            (f.source, f.topic.as_str(), f.key.as_deref()),
            (source, topic, Some(key.as_slice()))
        );
        assert_eq!(f.payload, payload, "the caller can send it again");
        assert!(f.error.contains("authoriz"), "{}", f.error);
    }
    // Sending it again (what the serve loop does with a failure) works.
    let failed = std::mem::take(&mut reports.lock().unwrap().failed);
    let rejected = resend(&producer, &failed[0]);
    producer.flush(WAIT).unwrap();
    assert_eq!(reports.lock().unwrap().delivered.get(&source), Some(&1));
    assert_eq!(read_back(&settings, topic).len(), 1);
    eprintln!("permanent error: the resend was rejected {rejected} times before it was taken");
}

#[test]
fn mock_sync_commit_lands_after_a_coordinator_outage() {
    const COORDINATOR: i32 = 3;
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1]);
    // Partition leader and group coordinator on different brokers, so only
    // the commit is cut off.
    mock.coordinator(
        MockCoordinator::Group("coordinator-down".into()),
        COORDINATOR,
    )
    .unwrap();
    let settings = settings(&mock, "coordinator-down");
    produce_fixed(&settings.brokers, topic, &[0], 0, 10);
    let (consumer, _) = open_consumer(&settings, topic, &[0], Refetch::FromCommitted);
    let mut book = OffsetBook::new();
    book.resume(0, 0);
    let (records, _) = consume_until(&consumer, &mut book, "all", |b| next_offset(b, 0) >= 10);
    for (r, _) in &records {
        book.ack(r.partition, r.offset).unwrap();
    }

    mock.broker_down(COORDINATOR).unwrap();
    let down = Instant::now();
    let commits = book.safe_commits();
    assert_eq!(commits, vec![(0, 10)]);
    // `commit(.., true)` has no deadline of its own: it waits as long as
    // the coordinator is away (hence `commit_and_wait` for shutdowns).
    let committing = std::thread::spawn(move || {
        let result = consumer.commit(&commits, true).map_err(|e| e.to_string());
        (result, Instant::now())
    });
    std::thread::sleep(Duration::from_secs(1));
    let waited_through_outage = !committing.is_finished();
    mock.broker_up(COORDINATOR).unwrap();
    let up = Instant::now();
    let (result, done) = committing.join().unwrap();
    result.expect("the commit lands once the coordinator is back");

    let (_, resumed) = open_consumer(&settings, topic, &[0], Refetch::FromCommitted);
    assert_eq!(
        resumed,
        vec![Resumed {
            partition: 0,
            offset: 10,
            from_commit: true,
            past_end: None,
            commit_start: false,
            refetches_below: false,
        }]
    );
    eprintln!(
        "coordinator down: sync commit still waiting at the end of the outage: \
         {waited_through_outage}; done {:.2?} after the outage began, {:.2?} after it ended",
        done.duration_since(down),
        done.saturating_duration_since(up)
    );
}

#[test]
fn mock_records_in_the_log_at_start_are_recovered_and_later_ones_are_not() {
    const AT_START: i64 = 10;
    const LATER: i64 = 5;
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1, 2]);
    let settings = settings(&mock, "recovered");
    produce_fixed(&settings.brokers, topic, &[0, 1], 0, AT_START);
    // A restart after a crash: nothing was committed, so every record in
    // the log may have been in flight.
    let (consumer, _) = open_consumer(&settings, topic, &[0, 1], Refetch::FromCommitted);
    let mut book = OffsetBook::new();
    book.resume(0, 0);
    book.resume(1, 0);
    // One record of each partition first: their fetches fix the ends.
    let (first, _) = consume_until(&consumer, &mut book, "a record of each partition", |b| {
        next_offset(b, 0) >= 1 && next_offset(b, 1) >= 1
    });
    produce_fixed(
        &settings.brokers,
        topic,
        &[0, 1],
        AT_START,
        AT_START + LATER,
    );
    let (rest, _) = consume_until(&consumer, &mut book, "the rest", |b| {
        next_offset(b, 0) >= AT_START + LATER && next_offset(b, 1) >= AT_START + LATER
    });
    check_contiguous(
        &first.iter().chain(&rest).cloned().collect::<Vec<_>>(),
        &BTreeMap::from([(0, 0), (1, 0)]),
    );
    for (r, _) in first.iter().chain(&rest) {
        assert_eq!(
            consumer.is_recovered(r.partition, r.offset),
            r.offset < AT_START,
            "partition {} offset {}",
            r.partition,
            r.offset
        );
    }
    let bounds = consumer.recovery_bounds();
    assert_eq!(
        (bounds.end(0), bounds.end(1)),
        (Some(AT_START), Some(AT_START))
    );
}

/// `n` requests on each of `partitions` of `topic`.
fn produce_requests(brokers: &str, topic: &str, partitions: &[i32], n: u64) {
    let records = partitions
        .iter()
        .flat_map(|&p| (0..n).map(move |i| (p, common::request_payload(p as u64 * 1_000 + i))));
    send_all(brokers, false, topic, records);
}

/// Worker 0 (of `shared`'s workers) reading `opened` of `topic` from the
/// start, with the caps given; its outputs are never sent, so nothing it
/// reads is ever answered.
fn source_of(
    settings: &KafkaSettings,
    topic: &str,
    opened: &[i32],
    shared: &Arc<SharedState>,
    max_in_flight: usize,
    max_in_flight_tokens: u64,
) -> KafkaSource {
    let opened = open_consumer(settings, topic, opened, Refetch::FromCommitted);
    common::source_over(
        settings,
        topic,
        opened,
        shared,
        max_in_flight,
        max_in_flight_tokens,
    )
}

/// Polls `source` (512 records a poll, as the dataflow does) for
/// `duration`; the partitions of the requests it handed out, in order.
fn poll_partitions(source: &mut KafkaSource, duration: Duration) -> Vec<i32> {
    let mut read = Vec::new();
    let deadline = Instant::now() + duration;
    while Instant::now() < deadline {
        for r in source.poll_at(512, Instant::now(), 0).records {
            match r {
                SourceRecord::Request {
                    position: grflow_connectors::SourcePosition::Kafka { partition, .. },
                    ..
                } => read.push(partition),
                other => panic!("not a Kafka request: {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    read
}

/// Worker 0 reading 50 requests of one partition for 1.5 s under the
/// given caps: the partitions of what it admitted, and its shared state.
fn admitted_under_caps(
    group: &str,
    max_in_flight: usize,
    max_in_flight_tokens: u64,
) -> (Vec<i32>, Arc<SharedState>) {
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1]);
    let settings = settings(&mock, group);
    produce_requests(&settings.brokers, topic, &[0], 50);
    let shared = Arc::new(SharedState::new(topic, 1));
    shared.saw_partitions(1);
    let mut source = source_of(
        &settings,
        topic,
        &[0],
        &shared,
        max_in_flight,
        max_in_flight_tokens,
    );
    let read = poll_partitions(&mut source, Duration::from_millis(1_500));
    (read, shared)
}

#[test]
fn mock_one_poll_never_admits_past_the_in_flight_cap() {
    let (read, shared) = admitted_under_caps("in-flight-cap", 4, 1_000_000);
    assert_eq!(read.len(), 4, "admitted with 4 allowed in flight");
    assert_eq!(shared.book(0).lock().unwrap().in_flight(), 4);
}

#[test]
fn mock_one_poll_stops_at_the_token_cap_after_one_request() {
    // Room for 2 requests of 7 tokens and a bit: the third is admitted
    // (its weight is known only once read), the fourth is not.
    let cap = 2 * common::REQUEST_TOKENS + 1;
    let (read, shared) = admitted_under_caps("token-cap", 1_000, cap);
    assert_eq!(read.len(), 3, "admitted under a cap of {cap} tokens");
    let tokens = shared.book(0).lock().unwrap().in_flight_tokens();
    assert!(
        tokens < cap + common::REQUEST_TOKENS,
        "{tokens} tokens in flight"
    );
}

/// The broker watcher may count partitions created after the consumers
/// were opened but before the worker's source is built: those are read
/// too.
#[test]
fn mock_partitions_counted_before_the_source_is_built_are_read() {
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1, 2, 3, 1]);
    let settings = settings(&mock, "counted-early");
    produce_requests(&settings.brokers, topic, &[0, 1, 2, 3], 5);
    let workers = 2;
    let shared = Arc::new(SharedState::new(topic, workers));
    let opened = owned_partitions(topic, 1, 0, workers);
    // The watcher saw 4 before the source was built.
    shared.saw_partitions(4);
    let mut source = source_of(&settings, topic, &opened, &shared, 1_000, 1_000_000);
    let read = poll_partitions(&mut source, Duration::from_millis(2_000));
    let expected: BTreeMap<i32, usize> = owned_partitions(topic, 4, 0, workers)
        .into_iter()
        .map(|p| (p, 5))
        .collect();
    let mut got = BTreeMap::new();
    for p in read {
        *got.entry(p).or_default() += 1;
    }
    assert_eq!(got, expected);
    assert!(
        expected.keys().any(|p| !opened.contains(p)),
        "worker 0 owns a partition it did not open: {expected:?}, opened {opened:?}"
    );
}

/// `start = "latest"` on partitions the group never committed: reading
/// starts at the end listed at start, and that position is committed even
/// when nothing arrives, so the next start resumes there (records produced
/// while no job ran are read, not jumped over).
#[test]
fn mock_a_latest_start_is_committed_and_the_next_start_resumes_there() {
    latest_start_round_trip(5);
}

/// The same on partitions that are empty at the first start: the start
/// position 0 is committed too. Without that commit the group had none, the
/// next `latest` start began at the end again, and the requests produced
/// while the job was down were never read, with no gap or lag to show it.
#[test]
fn mock_a_latest_start_on_empty_partitions_is_committed_too() {
    latest_start_round_trip(0);
}

/// Opens at `latest` after `OLD` records per partition, commits without
/// reading, produces while "down", and checks the next start reads them.
fn latest_start_round_trip(old: i64) {
    const WHILE_DOWN: i64 = 3;
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1, 2]);
    let settings = settings(&mock, "latest");
    produce_fixed(&settings.brokers, topic, &[0, 1], 0, old);
    let open_latest = || {
        RequestConsumer::open(
            &settings,
            topic,
            &[0, 1],
            StartPosition::Latest,
            Refetch::FromCommitted,
            CALL_TIMEOUT,
        )
        .unwrap()
    };
    let (consumer, resumed) = open_latest();
    let mut book = OffsetBook::new();
    for r in &resumed {
        assert!(!r.from_commit && r.commit_start, "{r:?}");
        assert_eq!(r.offset, old, "{r:?}");
        book.start_uncommitted(r.partition, r.offset);
    }
    // Nothing is read on either partition; the start is committed anyway.
    let commits = book.take_commits();
    assert_eq!(commits, vec![(0, old), (1, old)]);
    consumer.commit(&commits, true).unwrap();
    drop(consumer);

    produce_fixed(&settings.brokers, topic, &[0, 1], old, old + WHILE_DOWN);
    let (consumer, resumed) = open_latest();
    let mut book = OffsetBook::new();
    for r in &resumed {
        assert!(r.from_commit, "{r:?}");
        assert_eq!(r.offset, old, "{r:?}");
        book.resume(r.partition, r.offset);
    }
    let (records, _) = consume_until(
        &consumer,
        &mut book,
        "the records produced meanwhile",
        |b| next_offset(b, 0) >= old + WHILE_DOWN && next_offset(b, 1) >= old + WHILE_DOWN,
    );
    check_contiguous(&records, &BTreeMap::from([(0, old), (1, old)]));
}

/// A shutdown's last commit waits for the broker only as long as it is
/// told: with the coordinator away it gives up in time and says so, and
/// once the coordinator is back the same call lands.
#[test]
fn mock_commit_and_wait_gives_up_at_its_deadline_while_the_coordinator_is_away() {
    const COORDINATOR: i32 = 3;
    const WAIT_AT_MOST: Duration = Duration::from_millis(500);
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1]);
    mock.coordinator(MockCoordinator::Group("bounded".into()), COORDINATOR)
        .unwrap();
    let settings = settings(&mock, "bounded");
    produce_fixed(&settings.brokers, topic, &[0], 0, 10);
    let (consumer, _) = open_consumer(&settings, topic, &[0], Refetch::FromCommitted);
    let mut book = OffsetBook::new();
    book.resume(0, 0);
    let (records, _) = consume_until(&consumer, &mut book, "all", |b| next_offset(b, 0) >= 10);
    for (r, _) in &records {
        book.ack(r.partition, r.offset).unwrap();
    }
    let commits = book.safe_commits();

    mock.broker_down(COORDINATOR).unwrap();
    let started = Instant::now();
    let answered = consumer.commit_and_wait(&commits, WAIT_AT_MOST).unwrap();
    let waited = started.elapsed();
    assert!(!answered, "answered by a coordinator that is down");
    assert!(
        waited >= WAIT_AT_MOST && waited < WAIT_AT_MOST + Duration::from_secs(1),
        "waited {waited:?}"
    );

    mock.broker_up(COORDINATOR).unwrap();
    assert!(
        consumer.commit_and_wait(&commits, WAIT).unwrap(),
        "answered"
    );
    assert!(consumer.take_refused_commits().is_empty());
    let (_, resumed) = open_consumer(&settings, topic, &[0], Refetch::FromCommitted);
    assert_eq!((resumed[0].offset, resumed[0].from_commit), (10, true));
}

/// `OFFSET_OUT_OF_RANGE` on the next Fetch: what a broker answers when
/// retention deleted the records past the read position (or the log was
/// cut short or created again).
fn fetch_out_of_range(mock: &Mock) {
    mock.request_errors(
        RDKafkaApiKey::Fetch,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_OFFSET_OUT_OF_RANGE],
    );
}

/// A committed position that turns out of range under `start = "latest"`
/// restarts at the log's start: the records after the commit are read.
/// With `auto.offset.reset = latest` the consumer jumped to the end and
/// they were never read.
#[test]
fn mock_an_out_of_range_position_restarts_at_the_logs_start_under_a_latest_start() {
    const COMMITTED: i64 = 5;
    const END: i64 = 10;
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1]);
    let settings = settings(&mock, "out-of-range");
    produce_fixed(&settings.brokers, topic, &[0], 0, END);
    let open_latest = || {
        RequestConsumer::open(
            &settings,
            topic,
            &[0],
            StartPosition::Latest,
            Refetch::FromCommitted,
            CALL_TIMEOUT,
        )
        .unwrap()
    };
    let (consumer, _) = open_latest();
    consumer.commit(&[(0, COMMITTED)], true).unwrap();
    drop(consumer);

    fetch_out_of_range(&mock);
    let (consumer, resumed) = open_latest();
    assert_eq!(
        (resumed[0].offset, resumed[0].from_commit),
        (COMMITTED, true)
    );
    let mut book = OffsetBook::new();
    book.resume(0, COMMITTED);
    let (records, _) = consume_until(&consumer, &mut book, "the records after the commit", |b| {
        next_offset(b, 0) >= END
    });
    let new: Vec<i64> = records
        .iter()
        .filter(|(_, a)| *a == Admission::New)
        .map(|(r, _)| r.offset)
        .collect();
    assert_eq!(new, (COMMITTED..END).collect::<Vec<_>>());
    // Read again from offset 0: below the commit, skipped.
    assert!(
        records
            .iter()
            .any(|(r, a)| r.offset < COMMITTED && *a == Admission::Duplicate),
        "the position was not reset to the log's start"
    );
}

/// The same log read again from its start while serving (an out-of-range
/// answer): every record comes back as a duplicate, none as a log reset,
/// since the log still reaches past what was read.
#[test]
fn mock_the_same_log_read_again_while_serving_is_skipped_not_reset() {
    const N: u64 = 10;
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1]);
    let settings = settings(&mock, "read-again");
    produce_requests(&settings.brokers, topic, &[0], N);
    let shared = Arc::new(SharedState::new(topic, 1));
    shared.saw_partitions(1);
    let mut source = source_of(&settings, topic, &[0], &shared, 1_000, 1_000_000);
    assert_eq!(
        poll_partitions(&mut source, Duration::from_millis(500)).len(),
        N as usize
    );
    fetch_out_of_range(&mock);
    let counters = &shared.counters;
    let deadline = Instant::now() + WAIT;
    while counters
        .duplicates
        .load(std::sync::atomic::Ordering::Relaxed)
        < N
    {
        assert!(Instant::now() < deadline, "the log was not read again");
        assert!(poll_partitions(&mut source, Duration::from_millis(50)).is_empty());
    }
    assert_eq!(
        counters
            .log_resets
            .load(std::sync::atomic::Ordering::Relaxed),
        0
    );
    assert_eq!(shared.book(0).lock().unwrap().in_flight(), N as usize);
}

/// A partition that had read up to offset 100 of its log finds a log that
/// ends at 3 (the topic was deleted and created again while serving): its
/// records are served, counted as one log reset, and committed in the new
/// log, while the old log's answers still in flight hold nothing back.
/// Until now they were skipped as duplicates and never answered.
#[test]
fn mock_a_log_that_starts_over_while_serving_is_served_and_committed_anew() {
    const NEW: u64 = 3;
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1]);
    let settings = settings(&mock, "log-reset");
    produce_requests(&settings.brokers, topic, &[0], NEW);
    let shared = Arc::new(SharedState::new(topic, 1));
    shared.saw_partitions(1);
    let mut source = source_of(&settings, topic, &[0], &shared, 1_000, 1_000_000);
    {
        // What the worker had done on the topic's previous incarnation:
        // read 90..100, of which 95..100 are still unanswered.
        let mut book = shared.book(0).lock().unwrap();
        book.resume(0, 90);
        for o in 90..100 {
            assert_eq!(book.consume(0, o), Ok(Admission::New));
        }
        for o in 90..95 {
            book.ack(0, o).unwrap();
        }
        assert_eq!(book.take_commits(), vec![(0, 95)]);
    }
    let read = poll_partitions(&mut source, Duration::from_millis(1_000));
    assert_eq!(
        read,
        vec![0; NEW as usize],
        "the new log's requests are served"
    );
    let counters = &shared.counters;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((n(&counters.log_resets), n(&counters.duplicates)), (1, 0));
    let mut book = shared.book(0).lock().unwrap();
    assert_eq!(book.take_commits(), vec![(0, 0)], "the new log's start");
    for o in 0..NEW as i64 {
        book.ack(0, o).unwrap();
    }
    assert_eq!(book.take_commits(), vec![(0, NEW as i64)]);
    assert_eq!(book.in_flight(), 5, "the old log's answers still in flight");
}

/// A worker that reads no partition (more workers than partitions) still
/// serves its consumer's queue: statistics events, one every 50 ms here,
/// used to pile up in it for as long as the job ran.
#[test]
fn mock_a_consumer_without_partitions_keeps_its_queue_empty() {
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1]);
    let mut settings = settings(&mock, "no-partitions");
    settings
        .extra
        .insert("statistics.interval.ms".into(), "50".into());
    let (consumer, resumed) = open_consumer(&settings, topic, &[], Refetch::FromCommitted);
    assert!(resumed.is_empty());
    let mut queued = 0;
    for _ in 0..10 {
        let started = Instant::now();
        assert!(consumer.poll(Duration::from_millis(200)).is_none());
        assert!(
            started.elapsed() >= Duration::from_millis(150),
            "poll waits"
        );
        queued += usize::from(consumer.has_queued());
    }
    // One may arrive between a poll and the check; unserved, every check
    // after the first 200 ms would find some.
    assert!(queued <= 2, "events left queued after {queued} polls of 10");
}

/// As above, but the log starts over before the partition read anything
/// since it resumed at offset 90 (a restart, then the topic created again
/// before any request came). The consumer fetches at the commit, so a
/// record below it can only be a new log's: the new requests are served
/// (they were skipped as duplicates and never answered), and none counts
/// as recovered from a previous incarnation, so deadlines apply to them.
#[test]
fn mock_a_log_that_starts_over_before_anything_was_read_is_served_as_new() {
    const NEW: u64 = 3;
    let mock = mock_cluster();
    let topic = "requests";
    create_topic(&mock, topic, &[1]);
    let settings = settings(&mock, "log-reset-first");
    produce_requests(&settings.brokers, topic, &[0], NEW);
    let shared = Arc::new(SharedState::new(topic, 1));
    shared.saw_partitions(1);
    let mut source = source_of(&settings, topic, &[0], &shared, 1_000, 1_000_000);
    shared.book(0).lock().unwrap().register(&Resumed {
        partition: 0,
        offset: 90,
        from_commit: true,
        past_end: None,
        commit_start: false,
        refetches_below: false,
    });
    let mut recovered = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(1_000);
    while Instant::now() < deadline {
        for r in source.poll_at(512, Instant::now(), 0).records {
            match r {
                SourceRecord::Request { recovered: rec, .. } => recovered.push(rec),
                other => panic!("not a request: {other:?}"),
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        recovered,
        vec![false; NEW as usize],
        "served as new requests"
    );
    let counters = &shared.counters;
    let n = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    assert_eq!((n(&counters.log_resets), n(&counters.duplicates)), (1, 0));
    let mut book = shared.book(0).lock().unwrap();
    assert_eq!(book.take_commits(), vec![(0, 0)], "the new log's start");
}
