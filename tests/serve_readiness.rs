//! `/readyz` of `grflow serve` follows the broker, and `/metrics` counts as
//! records are answered: a tansu of the test's
//! own (tansu on PATH, as scripts/test.sh installs it; skipped with a
//! reason without) is stopped and started again under a running job.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::kafka::{Serve, Topics, write_config};
use common::temp::tmp_dir;

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn tansu(port: u16, dir: &std::path::Path) -> Child {
    let url = format!("tcp://127.0.0.1:{port}");
    Command::new("tansu")
        .args([
            "broker",
            "--listener-url",
            &url,
            "--advertised-listener-url",
            &url,
        ])
        .args(["--storage-engine", "memory://tansu/"])
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn tansu")
}

fn wait_port(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "tansu did not listen on {port}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// (status, body) of GET `path`, or None while nothing listens.
fn get(addr: &str, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(addr).ok()?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: grflow\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let status = out.get(9..12)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n").map_or("", |x| x.1).to_string();
    Some((status, body))
}

fn wait_ready(addr: &str, want: u16, serve: &Serve, within: Duration) -> String {
    let deadline = Instant::now() + within;
    loop {
        if let Some((status, body)) = get(addr, "/readyz")
            && status == want
        {
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "/readyz never answered {want}; stderr:\n{}",
            serve.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn kafka_readiness_drops_while_the_broker_is_unreachable_and_returns() {
    if Command::new("tansu").arg("--version").output().is_err() {
        use std::io::Write;
        let _ = writeln!(
            std::io::stderr(),
            "skipping kafka_readiness_follows_the_broker: no tansu on PATH \
             (scripts/test.sh installs it)"
        );
        return;
    }
    let dir = tmp_dir("readiness");
    let port = free_port();
    let mut broker = tansu(port, &dir);
    wait_port(port);
    let brokers = format!("127.0.0.1:{port}");
    let topics = Topics::fresh("readiness");
    topics.create(&brokers, 1);
    let config = write_config(&dir, &topics, "unready_after_ms = 1500");
    let addr = format!("127.0.0.1:{}", free_port());
    let serve = Serve::start_with(&brokers, &config, "serve", &["--metrics-addr", &addr]);
    wait_ready(&addr, 200, &serve, Duration::from_secs(60));

    // The counters move on /metrics as records are answered (typed events).
    let records: Vec<_> = (0..50u64)
        .map(|i| {
            let body = format!(
                r#"{{"req_id":{i},"user_id":{i},"ts_ms":{},"hist_len":3,"candidates":[1,2,3]}}"#,
                1_700_000_000_000u64 + i
            );
            (0, Some(body.into_bytes()))
        })
        .collect();
    common::kafka::produce(&brokers, &topics.requests, &records);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let metrics = get(&addr, "/metrics").map(|r| r.1).unwrap_or_default();
        let value = |name: &str| -> f64 {
            metrics
                .lines()
                .filter(|l| l.starts_with(name) && l[name.len()..].starts_with([' ', '{']))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum()
        };
        if value("grflow_requests_in_total") >= 50.0 && value("grflow_delivered_total") >= 50.0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "counters did not move:\n{metrics}\n{}",
            serve.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(100));
    }

    broker.kill().unwrap();
    broker.wait().unwrap();
    let lost = Instant::now();
    let body = wait_ready(&addr, 503, &serve, Duration::from_secs(30));
    assert!(body.contains("broker unreachable"), "{body}");
    eprintln!(
        "not ready {:.1} s after the broker stopped",
        lost.elapsed().as_secs_f64()
    );
    assert_eq!(
        get(&addr, "/healthz").map(|r| r.0),
        Some(200),
        "still alive"
    );

    let mut broker = tansu(port, &dir);
    wait_port(port);
    wait_ready(&addr, 200, &serve, Duration::from_secs(30));
    serve.kill_hard();
    broker.kill().unwrap();
    broker.wait().unwrap();
}
