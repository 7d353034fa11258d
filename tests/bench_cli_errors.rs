//! Commands that fail fail fast and say why: no broker for `bench kafka`,
//! a bad `--out` for `bench cluster`; and `serve` and `send` find a config
//! away from the repository. None needs a broker or a long run (a few
//! seconds each).

use std::time::{Duration, Instant};

#[path = "common/cli.rs"]
#[allow(dead_code)] // `ok` is for the other test binaries
mod cli;
#[path = "common/temp.rs"]
mod temp;
use cli::grflow;

/// No broker at the address: the command fails within the admin timeout
/// (10 s, it used to wait librdkafka's 60 s), names the broker, and does
/// so before spending the Parquet half of the run.
#[test]
fn bench_kafka_without_a_broker_fails_fast_naming_it() {
    let started = Instant::now();
    let out = grflow()
        .args(["bench", "kafka", "--json", "--requests", "50"])
        .args(["--brokers", "127.0.0.1:1"])
        .output()
        .unwrap();
    let elapsed = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("no Kafka broker answered at 127.0.0.1:1 within 10 s"),
        "{err}"
    );
    // The cause once, not again as its own link of the chain.
    assert_eq!(err.matches("Admin operation error").count(), 1, "{err}");
    assert!(
        !err.contains("Parquet"),
        "the Parquet half ran first: {err}"
    );
    assert!(elapsed < Duration::from_secs(20), "took {elapsed:?}: {err}");
}

#[test]
fn bench_cluster_rejects_an_out_path_that_is_a_file_before_measuring() {
    let dir = temp::tmp_dir("bench-cluster-out-file");
    let file = dir.join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    cli::refused_out(
        &[
            "bench",
            "cluster",
            "--json",
            "--preset",
            "small",
            "--requests",
            "20",
        ],
        &file,
    );
}

/// `serve` and `send` away from the repository, without --config: the
/// copy of configs/kafka.toml built into the binary, said on stderr (the
/// run then stops at a bad flag, before any broker is needed).
#[test]
fn serve_and_send_without_a_config_file_here_use_the_built_in_one() {
    let dir = temp::tmp_dir("built-in-kafka-config");
    for command in ["send", "serve"] {
        let out = grflow()
            .arg(command)
            .args(match command {
                "send" => ["--speed", "0x"],
                _ => ["--workers", "0"],
            })
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{command}: {err}");
        assert!(
            err.contains("using the copy built into grflow"),
            "{command}: {err}"
        );
        assert!(!err.contains("cannot read config"), "{command}: {err}");
        assert!(
            err.contains(match command {
                "send" => "--speed",
                _ => "--workers",
            }),
            "{command}: {err}"
        );
    }
    // A --config that is not there is still an error naming it.
    let out = grflow()
        .args(["send", "--config", "nope.toml"])
        .current_dir(&dir)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("nope.toml"), "{err}");
    // A duration that is no time: refused before any broker is needed.
    for bad in ["0", "-1", "nan"] {
        let out = grflow()
            .args(["send", "--loop", &format!("--duration-s={bad}")])
            .current_dir(&dir)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--duration-s must be above 0"), "{bad}: {err}");
    }
}

/// `serve --model-watch` a path with no model.json (a typo, a volume not
/// mounted): refused at once naming the flag and the file, before any
/// broker is asked (it used to serve the seeded weights and watch in
/// silence).
#[test]
fn serve_refuses_a_model_watch_path_without_a_model_json() {
    let empty = temp::tmp_dir("model-watch-empty");
    for path in [std::path::Path::new("/no/such"), empty.as_path()] {
        let started = Instant::now();
        let out = grflow()
            .args(["serve", "--brokers", "127.0.0.1:1", "--model-watch"])
            .arg(path)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{err}");
        assert!(
            err.contains("--model-watch") && err.contains("model.json"),
            "{err}"
        );
        assert!(err.contains(&*path.to_string_lossy()), "{err}");
        assert!(started.elapsed() < Duration::from_secs(5), "{err}");
    }
}

/// An --admin-addr a start would refuse (not a literal IP, not loopback, a
/// port in use) is refused by `serve --check` too, and by `serve` before it
/// talks to the broker (it used to create the topics and read the response
/// topic first).
#[test]
fn serve_and_its_check_refuse_a_bad_admin_addr_before_the_broker() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let in_use = taken.local_addr().unwrap().to_string();
    for addr in ["localhost:9465", "0.0.0.0:9465", in_use.as_str()] {
        for check in [true, false] {
            let started = Instant::now();
            let mut cmd = grflow();
            cmd.args(["serve", "--brokers", "127.0.0.1:1", "--admin-addr", addr])
                .args(["--metrics-addr", "127.0.0.1:0"]);
            if check {
                cmd.arg("--check");
            }
            let out = cmd.output().unwrap();
            let err = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{addr} (check {check}): {err}");
            assert!(err.contains("--admin-addr"), "{addr}: {err}");
            assert!(started.elapsed() < Duration::from_secs(5), "{addr}: {err}");
        }
    }
    drop(taken);
}

/// Flags past what the command can run are refused by name, with exit
/// code 2, before any work (each panicked, aborted or overflowed later).
#[test]
fn out_of_range_flags_are_refused_by_name() {
    let cases: &[(&[&str], &str)] = &[
        (&["bench", "serve", "--at", "2e8"], "--at"),
        (&["bench", "serve", "--at", "0.01"], "--at"),
        (
            &[
                "calibrate",
                "--beam-width",
                "100000",
                "--out",
                "/nonexistent/c.json",
            ],
            "--beam-width",
        ),
        (
            &[
                "train-allocator",
                "--seed-base",
                "18446744073709551615",
                "--seeds",
                "3",
            ],
            "--seed-base",
        ),
        (&["train-allocator", "--requests", "0"], "--requests"),
        (&["bench", "kafka", "--rps", "inf"], "--rps"),
        (&["serve", "--group", " "], "--group"),
        (&["serve", "--brokers", ""], "--brokers"),
    ];
    for (args, flag) in cases {
        let out = grflow().args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

/// `calibrate`, `train-allocator` and `bench allocator` check `--out`
/// before calibrating (~20 s each here): a directory, a missing directory
/// or a trace file's name is refused at once.
#[test]
fn calibrating_commands_check_out_before_calibrating() {
    let dir = temp::tmp_dir("calibrating-out");
    let missing = dir.join("no-such-dir").join("cost.json");
    let trace_file = dir.join("requests.parquet");
    for out in [dir.as_path(), missing.as_path(), trace_file.as_path()] {
        cli::refused_out(&["calibrate"], out);
        cli::refused_out(&["train-allocator", "--iterations", "1"], out);
    }
    let file = dir.join("a-file");
    std::fs::write(&file, "x").unwrap();
    cli::refused_out(&["bench", "allocator", "--regime", "burst"], &file);
    let err = grflow()
        .args(["bench", "allocator", "--policy"])
        .arg(dir.join("nope.safetensors"))
        .output()
        .unwrap();
    assert_eq!(err.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&err.stderr).contains("--policy"));
}
