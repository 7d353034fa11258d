//! Timely's cluster mode through the real binary: two `grflow replay`
//! processes on loopback ports act as one job of two nodes.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde_json::Value;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/process.rs"]
mod process;
#[path = "common/seq_trace.rs"]
mod seq_trace;
#[path = "common/temp.rs"]
mod temp;
use cli::{grflow, ok};
use process::Reaped;
use temp::tmp_dir;

/// Free loopback ports for a hostfile (picked now; a race with another
/// program taking one before timely binds it is possible but rare).
fn hostfile(dir: &Path, processes: usize) -> PathBuf {
    let listeners: Vec<_> = (0..processes)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let text: String = listeners
        .iter()
        .map(|l| format!("127.0.0.1:{}\n", l.local_addr().unwrap().port()))
        .collect();
    let path = dir.join("hosts");
    std::fs::write(&path, format!("# test cluster\n{text}")).unwrap();
    path
}

/// (req_id, node, items) of every response, sorted by req_id.
fn answers(path: &Path) -> Vec<(u64, u32, Vec<u32>)> {
    let mut out: Vec<_> = seq_trace::responses(path)
        .into_iter()
        .map(|r| (r.req_id, r.node, r.items))
        .collect();
    out.sort_by_key(|a| a.0);
    out
}

fn summary(dir: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).unwrap()).unwrap()
}

/// `processes` × `threads` workers in cluster mode against one process of
/// `processes · threads` workers, `complete` mode: same answers, same nodes.
/// `shared_out`: every process is given process 0's `--out` (a loopback
/// test, NFS), which the others must leave alone.
fn cluster_answers_like_one_process(tag: &str, processes: usize, threads: usize, shared_out: bool) {
    let dir = tmp_dir(tag);
    let trace = dir.join("trace");
    ok(grflow()
        .args(["gen-trace", "--regime", "burst", "--users", "150"])
        .args(["--items", "2000", "--requests", "600", "--rps", "1000"])
        .args(["--seed", "11", "--retrieve-share", "0.2", "--out"])
        .arg(&trace)
        .output()
        .unwrap());
    let replay = |extra: &[&str], out: &Path| {
        let mut cmd = grflow();
        cmd.args(["replay", "--speed", "max", "--clock", "event"])
            .args(["--release", "complete", "--quiet", "--json", "--trace"])
            .arg(&trace)
            .arg("--out")
            .arg(out)
            .args(extra);
        cmd
    };
    let nodes = processes * threads;
    let one = dir.join("one-process");
    ok(replay(&["--workers", &nodes.to_string()], &one)
        .output()
        .unwrap());

    let hosts = hostfile(&dir, processes);
    let hosts = hosts.to_str().unwrap();
    let threads = threads.to_string();
    let cluster = dir.join("cluster");
    let mut followers = Vec::new();
    for p in 1..processes {
        let out = if shared_out {
            cluster.clone()
        } else {
            dir.join(format!("follower-{p}"))
        };
        let process = p.to_string();
        let args = [
            "--workers",
            &threads,
            "--hostfile",
            hosts,
            "--process",
            &process,
        ];
        // Killed if the test fails before it waits for them.
        let child = Reaped::spawn(
            replay(&args, &out)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped()),
        );
        followers.push((child, out));
    }
    let leader = ok(replay(
        &["--workers", &threads, "--hostfile", hosts, "--process", "0"],
        &cluster,
    )
    .output()
    .unwrap());
    for (child, out) in followers {
        let follower = ok(child.wait_with_output());
        let said: Value = serde_json::from_slice(&follower.stdout).expect("JSON on stdout");
        assert!(said["process"].as_u64().unwrap() >= 1);
        if !shared_out {
            assert!(
                !out.join("responses.parquet").exists(),
                "only process 0 writes the job's outputs"
            );
        }
    }

    // Process 0's stdout is the summary alone: timely's connection
    // messages went to stderr.
    let printed: Value = serde_json::from_slice(&leader.stdout).expect("JSON summary on stdout");
    assert_eq!(printed["workers"], nodes, "{printed}");

    let (a, b) = (summary(&one), summary(&cluster));
    for key in ["requests_in", "responses_out", "errors", "router"] {
        assert_eq!(a[key], b[key], "{key}");
    }
    // Node counters, not the wall-clock ones (busy share, queue waits).
    for n in 0..nodes {
        for key in [
            "node",
            "responses_out",
            "emb_hits",
            "kv_reused_tokens",
            "model_calls",
        ] {
            assert_eq!(a["nodes"][n][key], b["nodes"][n][key], "nodes[{n}].{key}");
        }
    }
    let (a, b) = (
        answers(&one.join("responses.parquet")),
        answers(&cluster.join("responses.parquet")),
    );
    assert_eq!(a.len(), 600);
    for n in 0..nodes as u32 {
        assert!(a.iter().any(|r| r.1 == n), "node {n} served something");
    }
    assert_eq!(
        a, b,
        "(req_id, node, items) equal in and out of cluster mode"
    );
}

#[test]
fn two_processes_of_one_worker_answer_like_one_process_of_two() {
    // Before, the follower deleted and truncated process 0's responses,
    // and the job ended well without responses.parquet.
    cluster_answers_like_one_process("cluster-2x1", 2, 1, true);
}

#[test]
fn two_processes_of_two_workers_answer_like_one_process_of_four() {
    cluster_answers_like_one_process("cluster-2x2", 2, 2, false);
}

#[test]
fn a_bad_hostfile_is_an_input_error() {
    let dir = tmp_dir("cluster-bad");
    let hosts = dir.join("hosts");
    std::fs::write(&hosts, "127.0.0.1:1\nnot-an-address\n").unwrap();
    let out = grflow()
        .args(["replay", "--workers", "1", "--hostfile"])
        .arg(&hosts)
        .args(["--process", "0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    // Named by the flag, the file and its line.
    assert!(
        err.contains("--hostfile") && err.contains("line 2 = \"not-an-address\""),
        "{err}"
    );
    std::fs::write(&hosts, "127.0.0.1:1\n127.0.0.1:2\n").unwrap();
    let out = grflow()
        .args(["replay", "--workers", "1", "--hostfile"])
        .arg(&hosts)
        .args(["--process", "5"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    // Named by the flag that gave it, not the key it overrides.
    assert!(err.contains("--process 5: there are only 2 hosts"), "{err}");
}

#[test]
fn bench_cluster_smoke_runs_all_three_layouts() {
    let dir = tmp_dir("bench-cluster");
    let out = ok(grflow()
        .args(["bench", "cluster", "--json", "--preset", "small"])
        .args(["--requests", "100", "--out"])
        .arg(&dir)
        .output()
        .unwrap());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (job, nodes) in [
        ("one_process_one_worker", 1),
        ("one_process_two_workers", 2),
        ("two_processes_one_worker", 2),
    ] {
        let served: Vec<u64> = v[job]["responses_per_node"]
            .as_array()
            .unwrap_or_else(|| panic!("{job}: {v}"))
            .iter()
            .map(|n| n.as_u64().unwrap())
            .collect();
        assert_eq!(served.len(), nodes, "{job}: {v}");
        assert_eq!(served.iter().sum::<u64>(), 100, "{job}: {v}");
        assert!(v[job]["throughput_rps"].as_f64().unwrap() > 0.0);
    }
    for key in ["ratio_2x1_over_1x1", "ratio_2x1_over_1x2", "gemm_gflops"] {
        assert!(v[key].as_f64().is_some_and(|r| r > 0.0), "{key}: {v}");
    }
    assert!(dir.join("bench.json").is_file());
}

#[test]
fn a_process_whose_peers_never_connect_gives_up_after_the_connect_timeout() {
    let dir = tmp_dir("cluster-timeout");
    let hosts = hostfile(&dir, 2);
    let config = dir.join("c.toml");
    std::fs::write(&config, "[cluster]\nconnect_timeout_s = 1\n").unwrap();
    let metrics = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let started = std::time::Instant::now();
    let mut child = Reaped::spawn(
        grflow()
            .env("GRFLOW_LOG", "info")
            .env("GRFLOW_LOG_FORMAT", "json")
            .args(["replay", "--quiet", "--workers", "1", "--config"])
            .arg(&config)
            .arg("--hostfile")
            .arg(&hosts)
            .args(["--process", "1", "--metrics-addr", &metrics])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    // Not ready while the peers are awaited (it said ready at once).
    let mut answered = 0;
    while child.child().try_wait().unwrap().is_none() {
        if let Some(status) = http_status(&metrics, "/readyz") {
            assert_ne!(status, 200, "ready before the other process connected");
            answered += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(answered > 0, "/readyz never answered");
    let out = child.wait_with_output();
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(started.elapsed().as_secs() < 30);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cluster.connect_timeout_s"), "{err}");
    assert!(out.stdout.is_empty(), "timely's messages go to stderr");
    // GRFLOW_LOG_FORMAT=json: log lines are JSON objects.
    let logged: Value = err
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["fields"]["message"] == "connecting to the other processes")
        .unwrap_or_else(|| panic!("a JSON log line: {err}"));
    assert_eq!(logged["level"], "INFO");
    assert_eq!(logged["fields"]["process"], 1);
}

/// One SIGTERM to a process still waiting for its peers ends it (nothing
/// was read, nothing to drain): it used to wait on until the connect
/// timeout, as only a second signal was heard.
#[test]
fn a_signal_while_waiting_for_the_peers_ends_the_process() {
    let dir = tmp_dir("cluster-stop-waiting");
    let hosts = hostfile(&dir, 2);
    let config = dir.join("c.toml");
    std::fs::write(&config, "[cluster]\nconnect_timeout_s = 120\n").unwrap();
    let mut child = Reaped::spawn(
        grflow()
            .env("GRFLOW_LOG", "info")
            .args(["replay", "--quiet", "--workers", "1", "--config"])
            .arg(&config)
            .arg("--hostfile")
            .arg(&hosts)
            .args(["--process", "1"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    // Wait until it is waiting (its log says so), then one SIGTERM.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut err = child.child().stderr.take().unwrap();
    let mut seen = String::new();
    let mut buf = [0u8; 4096];
    while !seen.contains("connecting to the other processes") {
        assert!(std::time::Instant::now() < deadline, "never waited: {seen}");
        let n = std::io::Read::read(&mut err, &mut buf).unwrap();
        assert!(n > 0, "ended before waiting: {seen}");
        seen.push_str(&String::from_utf8_lossy(&buf[..n]));
    }
    let signalled = std::time::Instant::now();
    process::signal(child.child().id(), "-TERM");
    while child.child().try_wait().unwrap().is_none() {
        assert!(
            signalled.elapsed().as_secs() < 20,
            "still waiting for its peers 20 s after SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut err, &mut rest).unwrap();
    assert!(
        rest.contains("stopped while waiting for the other processes"),
        "{seen}{rest}"
    );
}

/// Processes that are not one job stop before timely connects them, each
/// saying what differs (exit 2), instead of panicking in timely's network
/// threads (unequal worker counts) or serving a job nobody asked for.
#[test]
fn processes_with_unequal_workers_or_configs_refuse_to_start_and_say_why() {
    let dir = tmp_dir("cluster-mismatch");
    let hosts = hostfile(&dir, 2);
    let config = |name: &str, text: &str| {
        let path = dir.join(name);
        std::fs::write(&path, format!("[trace]\nrequests = 100\n{text}")).unwrap();
        path
    };
    let plain = config("plain.toml", "");
    let other_alpha = config("alpha.toml", "[memory]\nalpha = 0.3\n");
    for ((config_1, workers_1), want) in [
        ((&plain, "2"), "process 1 runs 2 workers, process 0 runs 1"),
        (
            (&other_alpha, "1"),
            "process 1 differs from process 0 in [memory]",
        ),
    ] {
        let start = |process: &str, config: &Path, workers: &str| {
            Reaped::spawn(
                grflow()
                    .args(["replay", "--quiet", "--json", "--workers", workers])
                    .arg("--config")
                    .arg(config)
                    .arg("--hostfile")
                    .arg(&hosts)
                    .args(["--process", process])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped()),
            )
        };
        let follower = start("1", config_1, workers_1);
        let leader = start("0", &plain, "1");
        for child in [leader, follower] {
            let out = child.wait_with_output();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{want}: {err}");
            assert!(err.contains(want), "{want}: {err}");
            assert!(!err.contains("panicked"), "{err}");
        }
    }
}

/// The status code of GET `path` on `addr`, or None if nothing answers.
fn http_status(addr: &str, path: &str) -> Option<u16> {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).ok()?;
    conn.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    write!(
        conn,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = String::new();
    conn.read_to_string(&mut head).ok()?;
    head.split_whitespace().nth(1)?.parse().ok()
}

#[test]
fn a_signal_to_one_process_stops_the_whole_job_and_process_0_writes_what_was_read() {
    let dir = tmp_dir("cluster-stop");
    let trace = dir.join("trace");
    // 3,000 requests at 100 req/s: 30 s at the default pace.
    ok(grflow()
        .args(["gen-trace", "--users", "150", "--items", "2000"])
        .args(["--requests", "3000", "--rps", "100", "--out"])
        .arg(&trace)
        .output()
        .unwrap());
    let hosts = hostfile(&dir, 2);
    let out = dir.join("out");
    let spawn = |process: &str, out: Option<&Path>| {
        let mut cmd = grflow();
        cmd.args(["replay", "--quiet", "--json", "--workers", "1"])
            .args(["--process", process, "--hostfile"])
            .arg(&hosts)
            .arg("--trace")
            .arg(&trace);
        if let Some(o) = out {
            cmd.arg("--out").arg(o);
        }
        Reaped::spawn(cmd.stdout(Stdio::piped()).stderr(Stdio::piped()))
    };
    let leader = spawn("0", Some(&out));
    let follower = spawn("1", None);
    let partial = out.join("responses.parquet.partial");
    process::wait_for_file(
        &partial,
        std::time::Duration::from_secs(60),
        "the job never started",
    );
    std::thread::sleep(std::time::Duration::from_millis(2_000));
    // SIGTERM to the follower alone.
    let signalled = std::time::Instant::now();
    process::signal(follower.id(), "-TERM");
    let follower = follower.wait_with_output();
    let leader = leader.wait_with_output();
    let stderr = |o: &std::process::Output| String::from_utf8_lossy(&o.stderr).to_string();
    assert!(
        signalled.elapsed().as_secs() < 15,
        "{:?}",
        signalled.elapsed()
    );
    assert_eq!(follower.status.code(), Some(143), "{}", stderr(&follower));
    assert!(stderr(&follower).contains("interrupted by SIGTERM"));
    // Process 0 heard it through the job and stopped too.
    assert_eq!(leader.status.code(), Some(143), "{}", stderr(&leader));
    let s = summary(&out);
    assert_eq!(s["interrupted"]["signal"], "SIGTERM", "{s}");
    let read = s["requests_in"].as_u64().unwrap();
    assert!(read > 0 && read < 3_000, "{s}");
    assert_eq!(
        read,
        s["responses_out"].as_u64().unwrap() + s["errors"].as_u64().unwrap()
    );
    assert_eq!(
        answers(&out.join("responses.parquet")).len() as u64,
        s["responses_out"].as_u64().unwrap()
    );
}
