//! `grflow replay --metrics-addr` serves Prometheus metrics, health,
//! readiness and status while it runs: scraped twice during a paced
//! replay, the request and response counters move.

use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[path = "common/cli.rs"]
#[allow(dead_code)] // the shared helpers serve several test binaries
mod cli;
#[path = "common/http.rs"]
mod http;
#[path = "common/process.rs"]
mod process;
#[path = "common/temp.rs"]
mod temp;
use cli::grflow;
use http::{metric_total as total, metric_total_where as total_where};
use process::Reaped;
use temp::tmp_dir;

/// GET `path`; the job listens for the whole test.
fn get(addr: &str, path: &str) -> (u16, String) {
    http::get(addr, path).unwrap_or_else(|| panic!("GET {path} from {addr} got no answer"))
}

/// A paced replay of `config` with the ops server on a free port: the
/// child (its stdout piped; killed if the test fails) and the server's
/// address. Its stderr is read to the end on a thread, so that the child
/// never blocks on it.
fn spawn_replay(config: &std::path::Path) -> (Reaped, String) {
    let mut child = Reaped::spawn(
        grflow()
            .args([
                "replay",
                "--quiet",
                "--json",
                "--metrics-addr",
                "127.0.0.1:0",
            ])
            .arg("--config")
            .arg(config)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let mut stderr = BufReader::new(child.child().stderr.take().unwrap());
    let mut line = String::new();
    let addr = loop {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "no address printed"
        );
        if let Some(rest) = line.strip_prefix("metrics and health: http://") {
            break rest.split('/').next().unwrap().to_string();
        }
    };
    std::thread::spawn(move || {
        let mut sink = String::new();
        let _ = stderr.read_to_string(&mut sink);
    });
    (child, addr)
}

/// `/metrics` of `addr` once `done` holds for it (within 20 s, while the
/// job runs: a job that ends first answers nothing and the GET panics).
fn scrape_until(addr: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, metrics) = get(addr, "/metrics");
        assert_eq!(code, 200, "{metrics}");
        if done(&metrics) {
            return metrics;
        }
        assert!(Instant::now() < deadline, "never happened:\n{metrics}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Waits until `addr` answers `/readyz` with 200; the deadline it gave
/// itself (20 s), which the caller may go on waiting against.
fn wait_ready(addr: &str) -> Instant {
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(addr, "/readyz").0 != 200 {
        assert!(Instant::now() < deadline, "never ready");
        std::thread::sleep(Duration::from_millis(50));
    }
    deadline
}

#[test]
fn a_running_replay_answers_metrics_health_readiness_and_status() {
    let dir = tmp_dir("ops-endpoints");
    let config = dir.join("paced.toml");
    // About 4 s at 1x.
    std::fs::write(
        &config,
        "[run]\nworkers = 2\nspeed = \"1x\"\n\
         [trace]\nregime = \"steady\"\nrequests = 800\nrps = 200.0\ncandidates = 16\n",
    )
    .unwrap();
    let (child, addr) = spawn_replay(&config);

    assert_eq!(get(&addr, "/healthz"), (200, "ok\n".to_string()));
    wait_ready(&addr);
    let (code, status) = get(&addr, "/status");
    assert_eq!(code, 200);
    let status: serde_json::Value = serde_json::from_str(&status).unwrap();
    assert_eq!(status["command"], "replay");
    assert!(status["model_version"].as_str().unwrap().starts_with("gr-"));
    assert_eq!(status["config"]["run"]["workers"], 2);

    // Scraped once both counters count something, then again once both
    // moved on and the embedding cache has hits: polled, as a loaded
    // machine replays at its own pace.
    const COUNTERS: [&str; 2] = ["grflow_requests_in_total", "grflow_responses_total"];
    let first = scrape_until(&addr, |m| COUNTERS.iter().all(|&n| total(m, n) > 0.0));
    let second = scrape_until(&addr, |m| {
        COUNTERS.iter().all(|&n| total(m, n) > total(&first, n))
            && total(m, "grflow_emb_hit_rate") > 0.0
    });
    assert!(second.contains("grflow_alpha{node=\"0\"}"), "{second}");
    // A histogram with fixed buckets: cumulative counts up to +Inf.
    assert!(
        second.contains("# TYPE grflow_latency_ms histogram"),
        "{second}"
    );
    let inf = total_where(&second, "grflow_latency_ms_bucket", "le=\"+Inf\"");
    let le30 = total_where(&second, "grflow_latency_ms_bucket", "le=\"30\"");
    assert!(inf > 0.0 && le30 <= inf, "{le30} of {inf}\n{second}");
    assert_eq!(inf, total(&second, "grflow_latency_ms_count"));
    assert_eq!(get(&addr, "/nope").0, 404);

    let out = child.wait_with_output();
    assert!(out.status.success());
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["responses_out"], 800);
}

/// After SIGTERM a replay drains what it admitted and says so on /readyz
/// (it answered `200 ready` until it exited).
#[test]
fn an_interrupted_replay_is_not_ready_while_it_drains() {
    let dir = tmp_dir("ops-draining");
    // At full speed the source runs max_ahead_ms (2 s of event time, here
    // ~4,000 requests) ahead of the answers: the drain after the signal
    // takes long enough to be seen however loaded the machine is.
    let config = dir.join("fast.toml");
    std::fs::write(
        &config,
        "[run]\nworkers = 2\nspeed = \"max\"\n\
         [trace]\nregime = \"steady\"\nrequests = 60000\nrps = 2000.0\ncandidates = 16\n",
    )
    .unwrap();
    let (child, addr) = spawn_replay(&config);
    let deadline = wait_ready(&addr);
    std::thread::sleep(Duration::from_millis(300));
    process::signal(child.id(), "-TERM");
    // Polled until the process stops answering.
    let mut readiness = Vec::new();
    while let Some(answer) = http::get(&addr, "/readyz") {
        readiness.push(answer);
        assert!(Instant::now() < deadline, "never exited");
    }
    assert!(
        readiness
            .iter()
            .any(|(code, body)| *code == 503 && body.contains("draining")),
        "{readiness:?}"
    );
    let out = child.wait_with_output();
    let summary: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["interrupted"]["signal"], "SIGTERM", "{summary}");
}
