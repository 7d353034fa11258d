//! `/readyz` of `grflow serve` follows the broker, and `/metrics` counts as
//! records are answered: a tansu of the test's own (tansu on PATH, as
//! scripts/test.sh installs it; skipped with a reason without) is frozen
//! (SIGSTOP) and thawed under a running job, which must serve on after.
//!
//! Frozen, not restarted: tansu's memory storage forgets its topics on a
//! restart, and librdkafka 2.12.1 then crashes the client on tansu's fetch
//! answer (docs/kafka.md, tansu).

mod common;

use std::time::{Duration, Instant};

use common::http::{free_port, get, metric_total};
use common::kafka::{Serve, Topics, write_config};
use common::own_broker::{Broker, tansu_available};
use common::process::signal;
use common::temp::tmp_dir;

/// Polls `/readyz` until it answers `want`. On a timeout the message says
/// what it answered last and whether the job is still running, so that a
/// job that died (a crash prints nothing) reads apart from a wrong answer.
fn wait_ready(addr: &str, want: u16, serve: &mut Serve, within: Duration) -> String {
    let deadline = Instant::now() + within;
    let mut last = None;
    loop {
        match get(addr, "/readyz") {
            Some((status, body)) if status == want => return body,
            answer => last = answer.or(last),
        }
        if Instant::now() >= deadline {
            panic!(
                "/readyz never answered {want} within {within:?}; last answer {last:?}; \
                 grflow serve {}; stderr:\n{}",
                match serve.child.try_wait() {
                    Ok(Some(status)) => format!("exited: {status}"),
                    Ok(None) => "still running".to_string(),
                    Err(e) => format!("state unknown: {e}"),
                },
                serve.stderr_text()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kafka_readiness_drops_while_the_broker_is_unreachable_and_returns() {
    if !tansu_available("kafka_readiness_drops_while_the_broker_is_unreachable_and_returns") {
        return;
    }
    let dir = tmp_dir("readiness");
    let port = free_port();
    // Killed on drop, so a failing assertion leaves no (frozen) broker behind.
    let broker = Broker::start(port, port, &dir);
    let brokers = format!("127.0.0.1:{port}");
    let topics = Topics::fresh("readiness");
    topics.create(&brokers, 1);
    let config = write_config(&dir, &topics, "unready_after_ms = 1500");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut serve = Serve::start_with(&brokers, &config, "serve", &["--metrics-addr", &addr]);
    wait_ready(&addr, 200, &mut serve, Duration::from_secs(60));

    // The counters move on /metrics as records are answered (typed events).
    produce_requests(&brokers, &topics.requests, 0..50);
    wait_answered(&addr, 50.0, &mut serve);

    signal(broker.0.id(), "-STOP");
    let lost = Instant::now();
    let body = wait_ready(&addr, 503, &mut serve, Duration::from_secs(30));
    assert!(body.contains("broker unreachable"), "{body}");
    eprintln!(
        "not ready {:.1} s after the broker froze",
        lost.elapsed().as_secs_f64()
    );
    assert_eq!(
        get(&addr, "/healthz").map(|r| r.0),
        Some(200),
        "still alive"
    );

    signal(broker.0.id(), "-CONT");
    wait_ready(&addr, 200, &mut serve, Duration::from_secs(30));
    // Ready again means serving again: records sent after the outage are
    // answered by the same process.
    produce_requests(&brokers, &topics.requests, 50..70);
    wait_answered(&addr, 70.0, &mut serve);
    serve.kill_hard();
}

/// Without tansu the test above passes: its skip must show in `cargo test`
/// output under its own name (it named a test that does not exist, and
/// went out through the captured `eprintln!`).
#[test]
fn without_tansu_every_test_here_says_it_skipped() {
    let empty = tmp_dir("readiness-no-tansu");
    common::skip::assert_every_test_skips_visibly(
        "without_tansu_every_test_here_says_it_skipped",
        &[("PATH", Some(empty.as_os_str()))],
    );
}

/// Rank requests `ids` (one per id) on partition 0 of `topic`.
fn produce_requests(brokers: &str, topic: &str, ids: std::ops::Range<u64>) {
    let records: Vec<_> = ids
        .map(|i| {
            let body = format!(
                r#"{{"req_id":{i},"user_id":{i},"ts_ms":{},"hist_len":3,"candidates":[1,2,3]}}"#,
                1_700_000_000_000u64 + i
            );
            (0, Some(body.into_bytes()))
        })
        .collect();
    common::kafka::produce(brokers, topic, &records);
}

/// Waits (at most 60 s) until `/metrics` counts `n` requests in and `n`
/// answers delivered; fails early if the job is gone.
fn wait_answered(addr: &str, n: f64, serve: &mut Serve) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = get(addr, "/metrics").map(|r| r.1).unwrap_or_default();
        let value = |name: &str| metric_total(&metrics, name);
        if value("grflow_requests_in_total") >= n && value("grflow_delivered_total") >= n {
            return;
        }
        if let Ok(Some(status)) = serve.child.try_wait() {
            panic!(
                "grflow serve exited ({status}) before answering {n} requests; stderr:\n{}",
                serve.stderr_text()
            );
        }
        assert!(
            Instant::now() < deadline,
            "counters did not reach {n}:\n{metrics}\n{}",
            serve.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}
