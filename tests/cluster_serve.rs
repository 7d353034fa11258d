//! `grflow serve` as two processes of one timely cluster against the real
//! broker (GRFLOW_KAFKA_BROKERS; skipped with a reason without it): one
//! process is SIGKILLed mid-run, timely's lost connection stops the other,
//! both restart, and every request has exactly one answer.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::kafka::{Serve, Tail, Topics, broker, produce, write_config};
use common::temp::tmp_dir;
use grflow_connectors::kafka::WireResponse;
use grflow_pipeline::Config;
use serde_json::json;

const PARTITIONS: i32 = 4;

fn request(i: u64) -> Vec<u8> {
    serde_json::to_vec(&json!({
        "req_id": i,
        "user_id": i % 500,
        "ts_ms": 1_700_000_000_000u64 + i * 2,
        "hist_len": 1 + i % 10,
        "candidates": [(i * 7) % 5000, (i * 13 + 1) % 5000, (i * 31 + 2) % 5000],
    }))
    .unwrap()
}

fn hostfile(dir: &Path) -> PathBuf {
    let ports: Vec<_> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let text: String = ports
        .iter()
        .map(|l| format!("127.0.0.1:{}\n", l.local_addr().unwrap().port()))
        .collect();
    let path = dir.join("hosts");
    std::fs::write(&path, text).unwrap();
    path
}

fn start_both(brokers: &str, config: &Path, hosts: &Path, tag: &str) -> (Serve, Serve) {
    let hosts = hosts.to_str().unwrap();
    let metrics = [
        "--metrics-addr",
        "none",
        "--workers",
        "1",
        "--hostfile",
        hosts,
    ];
    let mut args: Vec<&str> = metrics.to_vec();
    args.extend(["--process", "1"]);
    let p1 = Serve::start_with(brokers, config, &format!("{tag}-p1"), &args);
    let mut args: Vec<&str> = metrics.to_vec();
    args.extend(["--process", "0"]);
    let p0 = Serve::start_with(brokers, config, &format!("{tag}-p0"), &args);
    (p0, p1)
}

#[test]
fn kafka_two_processes_kill_one_restart_both_leaves_one_answer_per_request() {
    let Some(brokers) = broker("kafka_two_processes_kill_restart") else {
        return;
    };
    const N: u64 = 10_000;
    let topics = Topics::fresh("cluster-kill");
    topics.create(&brokers, PARTITIONS);
    let records: Vec<_> = (0..N)
        .map(|i| ((i % PARTITIONS as u64) as i32, Some(request(i))))
        .collect();
    produce(&brokers, &topics.requests, &records);

    let dir = tmp_dir("cluster-kill");
    let shipped = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/kafka.toml"))
        .expect("configs/kafka.toml");
    let config = write_config(
        &dir,
        &topics,
        // hstu-3l: slow enough that the kill lands mid-run.
        &format!(
            "deadline_ms = {}\nmax_in_flight = 256\n\n[model]\npreset = \"hstu-3l\"",
            shipped.kafka.deadline_ms
        ),
    );
    let hosts = hostfile(&dir);
    let mut tail = Tail::new(&brokers, &topics.responses, PARTITIONS);
    tail.read_until(Duration::from_millis(1_500), |_| false);

    let (mut p0, p1) = start_both(&brokers, &config, &hosts, "first");
    assert!(
        tail.read_until(Duration::from_secs(300), |t| t.req_ids.len() as u64
            >= N * 40 / 100),
        "only {} answers before the kill; stderr:\n{}\n{}",
        tail.req_ids.len(),
        p0.stderr_text(),
        p1.stderr_text()
    );
    p1.kill_hard();
    // Timely's lost connection ends process 0 too: one line naming the
    // lost process and exit code 4, not a cascade of panics.
    let status = p0.exited_within(Duration::from_secs(60));
    let stderr = p0.stderr_text();
    assert_eq!(
        status.and_then(|s| s.code()),
        Some(4),
        "process 0 after process 1's SIGKILL: {status:?}; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("lost the connection to process 1") && !stderr.contains("panicked"),
        "{stderr}"
    );
    drop(p0);
    tail.settle(Duration::from_secs(2));
    let at_kill = tail.req_ids.len() as u64;
    eprintln!("answered at SIGKILL: {at_kill} of {N}");
    assert!(
        (N * 30 / 100..=N * 70 / 100).contains(&at_kill),
        "the kill must land with 30-70% answered, not {at_kill}"
    );

    let (p0, p1) = start_both(&brokers, &config, &hosts, "second");
    let all = tail.read_until(Duration::from_secs(300), |t| t.req_ids.len() as u64 >= N);
    assert!(
        all,
        "{} of {N} answered after the restart; stderr:\n{}\n{}",
        tail.req_ids.len(),
        p0.stderr_text(),
        p1.stderr_text()
    );
    // SIGTERM to process 0 alone: the stop reaches process 1 through the
    // dataflow and both drain and exit 0.
    let s0 = p0.stop();
    let s1 = p1.summary();
    tail.settle(Duration::from_secs(1));

    let mut by_req: BTreeMap<u64, Vec<WireResponse>> = BTreeMap::new();
    for r in &tail.records {
        let response: WireResponse = serde_json::from_slice(&r.payload).expect("a response");
        by_req.entry(response.req_id).or_default().push(response);
    }
    assert_eq!(by_req.len() as u64, N, "every req_id answered");
    let mut twice = 0;
    for (req, answers) in &by_req {
        assert!(
            answers.iter().all(|a| a.same_answer(&answers[0])),
            "req {req} got different answers: {answers:?}"
        );
        twice += answers.len() - 1;
    }
    let committed = |s: &serde_json::Value| -> i64 {
        s["committed"]
            .as_object()
            .expect("committed")
            .values()
            .map(|v| v.as_i64().unwrap())
            .sum()
    };
    eprintln!(
        "responses on the topic: {}, produced twice: {twice}, committed {} + {}",
        tail.records.len(),
        committed(&s0),
        committed(&s1)
    );
    assert!(twice <= 2 * 2 * 256 + 512, "{twice} answered twice");
    assert_eq!(s0["in_flight_at_exit"], 0);
    assert_eq!(s1["in_flight_at_exit"], 0);
    assert_eq!(s0["workers"], 2, "{s0}");
    assert_eq!(s0["processes"], 2, "{s0}");
    assert_eq!(s0["processes_missing"], serde_json::json!([]), "{s0}");
    // Process 0 prints the job's summary (every process's counts); process
    // 1 its own. Each process committed the partitions its worker owns.
    assert_eq!(committed(&s0), N as i64, "{s0}");
    assert!(committed(&s1) > 0 && committed(&s1) < N as i64, "{s1}");
    assert!(
        s0["requests_in"].as_u64() > s1["requests_in"].as_u64(),
        "{s0}\n{s1}"
    );
}

/// A process whose peer never starts is not ready (it serves nothing until
/// the cluster connects), and SIGTERM ends it at once with exit 0: before,
/// `/readyz` said ready while it waited and the signal was ignored until
/// `cluster.connect_timeout_s` (300 s by default).
#[test]
fn a_process_waiting_for_its_peers_is_not_ready_and_stops_on_sigterm() {
    let Some(brokers) = broker("a_process_waiting_for_its_peers") else {
        return;
    };
    let dir = tmp_dir("cluster-waiting");
    let topics = Topics::fresh("cluster-waiting");
    topics.create(&brokers, PARTITIONS);
    let config = write_config(&dir, &topics, "");
    let hosts = hostfile(&dir);
    let metrics = common::http::free_addr();
    let mut alone = Serve::start_with(
        &brokers,
        &config,
        "waiting",
        &[
            "--metrics-addr",
            &metrics,
            "--workers",
            "1",
            "--hostfile",
            hosts.to_str().unwrap(),
            "--process",
            "0",
        ],
    );
    assert!(
        common::http::wait_listening(&metrics, Duration::from_secs(60)),
        "{}",
        alone.stderr_text()
    );
    // Once it waits for process 1 (its consumers open, the log says so),
    // no answer of /readyz for 3 s says ready.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while !alone
        .stderr_text()
        .contains("connecting to the other processes")
    {
        assert!(
            std::time::Instant::now() < deadline,
            "never said it connects to process 1; stderr:\n{}",
            alone.stderr_text()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let waiting = std::time::Instant::now();
    let mut answers = 0;
    while waiting.elapsed() < Duration::from_secs(3) {
        if let Some((status, body)) = common::http::get(&metrics, "/readyz") {
            assert_eq!(status, 503, "ready before process 1 connected? {body}");
            answers += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(answers > 0, "/readyz never answered");
    let signalled = std::time::Instant::now();
    common::process::signal(alone.child.id(), "-TERM");
    let exited = alone.exited_within(Duration::from_secs(10));
    assert!(
        exited.is_some_and(|s| s.success()),
        "{exited:?} after {:?}; stderr:\n{}",
        signalled.elapsed(),
        alone.stderr_text()
    );
}

/// A one-partition topic leaves one of the two processes without a
/// partition. Its worker's event time follows the newest in the job, which
/// was its own process's only: it stayed at 1, so no window closed anywhere
/// while the job ran (and under `arrival` every time in flight stayed held).
/// The processes now share their newest event time.
#[test]
fn windows_close_while_one_process_reads_nothing() {
    let Some(brokers) = broker("windows_close_while_one_process_reads_nothing") else {
        return;
    };
    const N: u64 = 200;
    let topics = Topics::fresh("cluster-idle-process");
    topics.create(&brokers, 1);
    // 20 ms apart: 4 s of event time, three 1 s windows to close.
    let records: Vec<_> = (0..N)
        .map(|i| {
            let mut r: serde_json::Value = serde_json::from_slice(&request(i)).unwrap();
            r["ts_ms"] = json!(1_700_000_000_000u64 + i * 20);
            (0, Some(serde_json::to_vec(&r).unwrap()))
        })
        .collect();
    produce(&brokers, &topics.requests, &records);
    let dir = tmp_dir("cluster-idle-process");
    let windows = dir.join("windows.jsonl");
    let config = write_config(
        &dir,
        &topics,
        &format!(
            "idle_timeout_ms = 200\n\n[windows]\nepoch_ms = 1000\nout = \"{}\"",
            windows.display()
        ),
    );
    let hosts = hostfile(&dir);
    let mut tail = Tail::new(&brokers, &topics.responses, 1);
    let (p0, p1) = start_both(&brokers, &config, &hosts, "idle-process");
    assert!(
        tail.read_until(Duration::from_secs(120), |t| t.req_ids.len() as u64 >= N),
        "{} of {N} answered; stderr:\n{}\n{}",
        tail.req_ids.len(),
        p0.stderr_text(),
        p1.stderr_text()
    );
    // While both still run: closed windows are written.
    let started = std::time::Instant::now();
    let lines = || {
        std::fs::read_to_string(&windows)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    };
    while lines() == 0 && started.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let written = lines();
    let (s0, s1) = (p0.stop(), p1.summary());
    assert!(
        written > 0,
        "no window closed in 20 s with every request answered\n{s0}\n{s1}"
    );
}
