//! Consumer lag while fetches fail, on librdkafka's in-process mock cluster
//! (no external broker): the watermark librdkafka caches freezes when the
//! partition's leader goes away, and the lag measured from it must then
//! turn unknown instead of showing the last, healthy value for the whole
//! outage, even though the job keeps asking the broker for the partition's
//! end; a partition read under steady traffic stays known, and so does a
//! quiet one whose leader answers for its end.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use grflow_connectors::kafka::{BrokerProbe, KafkaSource, LagGauge, SharedState, StartPosition};
use rdkafka::ClientConfig;
use rdkafka::mocking::MockCluster;
use rdkafka::producer::{BaseProducer, BaseRecord, DefaultProducerContext, Producer};

const WAIT: Duration = Duration::from_secs(20);
const TOPIC: &str = "requests";
const LEADER: i32 = 1;
/// The shared state's bound on a reading that does not move (short, for
/// the test; far above the gaps of the traffic below).
const STALE_AFTER: Duration = Duration::from_secs(1);
/// How long one round of the broker's answers may take.
const PROBE_BUDGET: Duration = Duration::from_millis(200);

/// Requests on partition 0, one every 10 ms from request `from` on, until
/// `stop`; then waits for all to be written. Returns how many it sent.
fn traffic(brokers: String, from: u64, stop: Arc<AtomicBool>) -> JoinHandle<u64> {
    std::thread::spawn(move || {
        let producer: BaseProducer = ClientConfig::new()
            .set("bootstrap.servers", &brokers)
            .set("linger.ms", "1")
            .create()
            .unwrap();
        let mut i = from;
        while !stop.load(Ordering::Relaxed) {
            let payload = common::request_payload(i);
            producer
                .send(
                    BaseRecord::<(), [u8]>::to(TOPIC)
                        .partition(0)
                        .payload(&payload),
                )
                .expect("send");
            producer.poll(Duration::ZERO);
            i += 1;
            std::thread::sleep(Duration::from_millis(10));
        }
        producer.flush(WAIT).expect("flush");
        i - from
    })
}

fn next_offset(shared: &SharedState) -> i64 {
    let book = shared.book(0).lock().unwrap();
    book.partition(0).map_or(0, |p| p.next_offset())
}

/// Polls and measures lag (as the serve loop does, more often), with
/// `probe` asking the broker for the ends of partitions nothing vouched
/// for lately (as serve's broker watch does); partition 0's gauge after
/// each measurement goes to `check`, until it says done.
fn poll_until(
    source: &mut KafkaSource,
    shared: &SharedState,
    probe: Option<&BrokerProbe>,
    what: &str,
    mut check: impl FnMut(Option<LagGauge>) -> bool,
) {
    let deadline = Instant::now() + WAIT;
    loop {
        source.poll_at(512, Instant::now(), 0);
        if let Some(probe) = probe {
            probe.confirm_lags(shared, PROBE_BUDGET);
        }
        source.measure_lag();
        let gauge = shared.lag_gauges(Instant::now()).get(&0).copied();
        if check(gauge) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "timed out waiting for {what}: {gauge:?}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A mock cluster of three brokers whose broker [`LEADER`] leads the one
/// partition of [`TOPIC`], and a source reading it from the start, its
/// lag going stale after [`STALE_AFTER`].
struct Setup {
    mock: MockCluster<'static, DefaultProducerContext>,
    brokers: String,
    shared: Arc<SharedState>,
    source: KafkaSource,
    probe: BrokerProbe,
}

fn setup(group: &str) -> Setup {
    let mock: MockCluster<'static, DefaultProducerContext> = MockCluster::new(3).unwrap();
    mock.create_topic(TOPIC, 1, 3).unwrap();
    mock.partition_leader(TOPIC, 0, Some(LEADER)).unwrap();
    let brokers = mock.bootstrap_servers();
    let shared = Arc::new(SharedState::new(TOPIC, 1).with_lag_stale_after(STALE_AFTER));
    shared.saw_partitions(1);
    let (settings, opened) =
        common::open_consumer_on(&brokers, TOPIC, group, &[0], StartPosition::Earliest);
    // Nothing is answered: caps that never pause reads.
    let source = common::source_over(&settings, TOPIC, opened, &shared, 1 << 20, u64::MAX);
    let probe = BrokerProbe::new(&settings, TOPIC).unwrap();
    Setup {
        mock,
        brokers,
        shared,
        source,
        probe,
    }
}

#[test]
fn mock_lag_of_a_partition_whose_leader_is_away_turns_unknown_then_returns() {
    let Setup {
        mock,
        brokers,
        shared,
        mut source,
        probe,
    } = setup("lag");
    let probe = Some(&probe);
    let stop = Arc::new(AtomicBool::new(false));
    let producing = traffic(brokers, 0, stop.clone());

    // Steady traffic: the lag stays known, well past the bound.
    poll_until(&mut source, &shared, probe, "the first requests", |g| {
        g.is_some_and(|g| g.lag.is_some())
    });
    let busy = Instant::now();
    poll_until(&mut source, &shared, probe, "steady traffic", |g| {
        assert!(g.unwrap().lag.is_some(), "unknown under traffic: {g:?}");
        busy.elapsed() > STALE_AFTER * 3
    });
    let before = next_offset(&shared);
    assert!(before > 0);

    // The leader goes away (the producer keeps sending: its records wait
    // in its queue). The cached watermark freezes and the leader answers
    // for no end; within the bound the last lag stands, then it is
    // unknown, not that healthy value.
    mock.broker_down(LEADER).unwrap();
    poll_until(
        &mut source,
        &shared,
        probe,
        "the lag to turn unknown",
        |g| g.is_some_and(|g| g.lag.is_none()),
    );
    assert!(
        shared.known_lag(Instant::now()).is_empty(),
        "a stale partition is left out of the lag table"
    );
    // However long the outage lasts.
    let down = Instant::now();
    poll_until(&mut source, &shared, probe, "the outage to last", |g| {
        assert_eq!(g.unwrap().lag, None, "known while the leader is away");
        down.elapsed() > STALE_AFTER * 2
    });

    // Back: the lag is known again and what waited is written and read.
    // Two events, not one: the probe can learn the log's end before the
    // consumer's next fetch returns a record (seen on a loaded CI VM).
    mock.broker_up(LEADER).unwrap();
    poll_until(
        &mut source,
        &shared,
        probe,
        "the lag to be known again and reading to go on",
        |g| g.is_some_and(|g| g.lag.is_some()) && next_offset(&shared) > before,
    );
    stop.store(true, Ordering::Relaxed);
    let sent = producing.join().unwrap() as i64;
    poll_until(&mut source, &shared, probe, "every request read", |g| {
        g.is_some_and(|g| g.lag == Some(0)) && next_offset(&shared) == sent
    });
    assert_eq!(shared.known_lag(Instant::now()), [(0, 0)].into());
}

/// A partition nobody writes to: its reading stands still, and the broker
/// answering for its end keeps the lag known (0); unasked, it turns unknown
/// after the bound, as one whose fetches fail.
#[test]
fn mock_lag_of_a_quiet_partition_stays_known_while_its_leader_answers() {
    let Setup {
        mock: _mock,
        brokers,
        shared,
        mut source,
        probe,
    } = setup("quiet");
    let stop = Arc::new(AtomicBool::new(false));
    let producing = traffic(brokers, 0, stop.clone());
    std::thread::sleep(Duration::from_millis(200));
    stop.store(true, Ordering::Relaxed);
    let sent = producing.join().unwrap() as i64;
    assert!(sent > 0);
    poll_until(&mut source, &shared, None, "every request read", |g| {
        g.is_some_and(|g| g.lag == Some(0)) && next_offset(&shared) == sent
    });

    let quiet = Instant::now();
    poll_until(&mut source, &shared, Some(&probe), "a quiet spell", |g| {
        assert_eq!(g.unwrap().lag, Some(0), "unknown while the leader answers");
        quiet.elapsed() > STALE_AFTER * 3
    });
    poll_until(
        &mut source,
        &shared,
        None,
        "the lag to turn unknown unasked",
        |g| g.unwrap().lag.is_none(),
    );
    poll_until(
        &mut source,
        &shared,
        Some(&probe),
        "the lag known again",
        |g| g.unwrap().lag == Some(0),
    );
}
