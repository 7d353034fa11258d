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
                "calibrate",
                "--max-tokens",
                "0",
                "--out",
                "/nonexistent/c.json",
            ],
            "--max-tokens",
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
        (&["bench", "kafka", "--runs", "0"], "--runs"),
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

/// `calibrate --out FILE` and `train-allocator --out FILE` keep a FILE
/// that is there (a calibration or a policy took minutes to hours, and
/// committed ones were edited by hand) unless `--force`, as `train` keeps
/// a model: refused at once, exit 2, the file untouched.
#[test]
fn calibrate_and_train_allocator_keep_an_existing_out_without_force() {
    let dir = temp::tmp_dir("out-exists");
    let file = dir.join("earlier.json");
    std::fs::write(&file, "earlier").unwrap();
    for args in [
        &["calibrate"][..],
        &["train-allocator", "--iterations", "1"][..],
    ] {
        let err = cli::refused_out(args, &file);
        assert!(err.contains("--force"), "{args:?}: {err}");
        assert_eq!(std::fs::read_to_string(&file).unwrap(), "earlier");
    }
    // --force passes that check (the run then stops at its next bad flag,
    // before writing anything).
    let out = grflow()
        .args(["calibrate", "--force", "--max-tokens", "10", "--out"])
        .arg(&file)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        !err.contains("--out") && err.contains("--max-tokens"),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "earlier");
}

/// Every flag that starts threads (workers, lanes, jobs) has an upper
/// bound, refused by name with exit 2 before any work: `--workers 100000`
/// used to fail deep in the run (a pool or a thread that could not be
/// had, or a panic in timely).
#[test]
fn thread_count_flags_have_an_upper_bound() {
    let cases: &[(&[&str], &str)] = &[
        (&["replay", "--workers", "100000"], "--workers"),
        (&["replay", "--workers", "1025"], "--workers"),
        (
            &["serve", "--brokers", "127.0.0.1:1", "--workers", "100000"],
            "--workers",
        ),
        (&["bench", "serve", "--workers", "100000"], "--workers"),
        (&["bench", "serve", "--lanes", "65"], "--lanes"),
        (&["bench", "memory", "--workers", "100000"], "--workers"),
        (
            &[
                "bench",
                "kafka",
                "--brokers",
                "127.0.0.1:1",
                "--workers",
                "100000",
            ],
            "--workers",
        ),
        (&["bench", "kernels", "--threads", "100000"], "--threads"),
        (
            &["bench", "allocator", "--seeds", "1,2", "--jobs", "100000"],
            "--jobs",
        ),
    ];
    for (args, flag) in cases {
        let started = Instant::now();
        let out = grflow().args(*args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(flag) && err.contains("at most"),
            "{args:?}: {err}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "{args:?}: {err}"
        );
    }
}

/// A bad file or value given by a flag is reported under the flag's name,
/// not the config key the flag overrides (`cost.calibration`,
/// `model.weights`, `cluster.hostfile`, `cluster.process`), which the user
/// never wrote.
#[test]
fn a_bad_value_given_by_a_flag_is_named_by_the_flag() {
    let dir = temp::tmp_dir("flag-named");
    let missing = dir.join("missing.json");
    let missing = missing.to_str().unwrap();
    let not_a_cost_model = dir.join("not-a-cost-model.json");
    std::fs::write(&not_a_cost_model, "{\"nope\": 1}").unwrap();
    let not_a_cost_model = not_a_cost_model.to_str().unwrap();
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let empty = empty.to_str().unwrap();
    let hostfile = dir.join("hosts");
    std::fs::write(&hostfile, "127.0.0.1:1\n127.0.0.1:2\n").unwrap();
    let hostfile = hostfile.to_str().unwrap();
    let policy = dir.join("p.safetensors");
    let policy = policy.to_str().unwrap();
    let virt = ["replay", "--quiet", "--clock", "virtual", "--speed", "max"];
    let serve = ["serve", "--check", "--brokers", "127.0.0.1:1"];
    let serve = [&serve[..], &["--metrics-addr", "127.0.0.1:0"]].concat();
    let cases: Vec<(Vec<&str>, &str, &str)> = vec![
        (
            [&virt[..], &["--calibration", missing]].concat(),
            "--calibration",
            "cost.calibration",
        ),
        (
            [&virt[..], &["--calibration", not_a_cost_model]].concat(),
            "--calibration",
            "cost.calibration",
        ),
        (
            vec!["replay", "--quiet", "--model", empty],
            "--model",
            "model.weights",
        ),
        (
            [&serve[..], &["--model", empty]].concat(),
            "--model",
            "model.weights",
        ),
        (
            vec!["replay", "--quiet", "--hostfile", missing, "--process", "0"],
            "--hostfile",
            "cluster.hostfile",
        ),
        (
            vec![
                "replay",
                "--quiet",
                "--hostfile",
                hostfile,
                "--process",
                "5",
            ],
            "--process",
            "cluster.process",
        ),
        (
            vec!["bench", "allocator", "--json", "--calibration", missing],
            "--calibration",
            "cost.calibration",
        ),
        (
            vec![
                "train-allocator",
                "--iterations",
                "1",
                "--out",
                policy,
                "--calibration",
                missing,
            ],
            "--calibration",
            "cost.calibration",
        ),
    ];
    for (args, flag, key) in &cases {
        let out = grflow().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
        assert!(!err.contains(key), "{args:?} names {key}: {err}");
    }
}
