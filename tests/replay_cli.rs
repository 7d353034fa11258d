//! End-to-end tests of `grflow replay` through the real binary: generated
//! and imported traces, 1/2/4 workers, outputs on disk, and clear errors.

use std::path::{Path, PathBuf};

use serde_json::Value;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/process.rs"]
mod process;
#[path = "common/temp.rs"]
mod temp;
use cli::{grflow, ok};
use temp::tmp_dir;

fn gen_trace(dir: &Path, regime: &str, requests: u32) -> PathBuf {
    let trace = dir.join(format!("{regime}-trace"));
    ok(grflow()
        .args([
            "gen-trace",
            "--regime",
            regime,
            "--users",
            "150",
            "--items",
            "2000",
        ])
        .args([
            "--requests",
            &requests.to_string(),
            "--rps",
            "100",
            "--seed",
            "5",
            "--out",
        ])
        .arg(&trace)
        .output()
        .unwrap());
    trace
}

fn replay_json(trace: &Path, workers: usize, out_dir: Option<&Path>) -> Value {
    let mut cmd = grflow();
    cmd.args([
        "replay",
        "--speed",
        "max",
        "--json",
        "--workers",
        &workers.to_string(),
        "--trace",
    ])
    .arg(trace);
    if let Some(o) = out_dir {
        cmd.arg("--out").arg(o);
    }
    let out = ok(cmd.output().unwrap());
    serde_json::from_slice(&out.stdout).expect("summary JSON on stdout")
}

fn conserved(summary: &Value) {
    let n = |k: &str| {
        summary[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k} missing in {summary}"))
    };
    assert!(n("requests_in") > 0);
    assert_eq!(
        n("requests_in"),
        n("responses_out") + n("errors"),
        "every request gets one answer: {summary}"
    );
}

#[test]
fn replay_of_generated_trace_conserves_requests_on_1_2_4_workers() {
    let dir = tmp_dir("gen");
    let trace = gen_trace(&dir, "burst", 400);
    for workers in [1, 2, 4] {
        let summary = replay_json(&trace, workers, None);
        conserved(&summary);
        assert_eq!(summary["requests_in"].as_u64(), Some(400));
        assert_eq!(summary["nodes"].as_array().unwrap().len(), workers);
    }
}

#[test]
fn replay_of_imported_trace_conserves_requests() {
    let dir = tmp_dir("import");
    let inter = dir.join("tiny.inter");
    let mut text = String::from("user_id:token\titem_id:token\trating:float\ttimestamp:float\n");
    for i in 0..300u32 {
        // 12 users, 40 items, increasing timestamps with some ties.
        text += &format!(
            "{}\t{}\t4\t{}\n",
            i % 12 + 1,
            (i * 7) % 40 + 1,
            1_000 + i / 2
        );
    }
    std::fs::write(&inter, text).unwrap();
    let trace = dir.join("tiny-trace");
    ok(grflow()
        .args(["import", "--format", "recbole", "--input"])
        .arg(&inter)
        .arg("--out")
        .arg(&trace)
        .output()
        .unwrap());
    for workers in [1, 2, 4] {
        conserved(&replay_json(&trace, workers, None));
    }
}

#[test]
fn replay_writes_the_documented_outputs() {
    let dir = tmp_dir("outputs");
    let trace = gen_trace(&dir, "steady", 200);
    let out = dir.join("out");
    // An earlier run's files (one from a run with the oracle, one left by
    // an interrupted run) are not left beside this run's.
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("oracle.json"), "[]").unwrap();
    std::fs::write(out.join("responses.parquet.partial"), "").unwrap();
    let summary = replay_json(&trace, 2, Some(&out));
    for f in [
        "summary.json",
        "responses.parquet",
        "windows.parquet",
        "errors.parquet",
    ] {
        assert!(out.join(f).is_file(), "{f} written");
    }
    for f in ["oracle.json", "responses.parquet.partial"] {
        assert!(!out.join(f).exists(), "{f} left from another run");
    }
    // Each output file says the version of its layout (README).
    for f in ["responses.parquet", "windows.parquet", "errors.parquet"] {
        assert_eq!(schema_version(&out.join(f)).as_deref(), Some("1"), "{f}");
    }
    let on_disk: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(on_disk["requests_in"], summary["requests_in"]);
    for key in [
        "throughput_rps",
        "slo_ms",
        "slo_satisfaction",
        "emb_hit_rate",
        "kv_hit_rate",
        "wall_s",
    ] {
        assert!(summary[key].is_number(), "{key} in summary");
    }
    for key in ["p50", "p95", "p99", "max"] {
        assert!(summary["latency_ms"][key].is_number(), "latency_ms.{key}");
    }
    for key in [
        "decisions",
        "kv_hits",
        "affinity_wins",
        "overload_fallbacks",
    ] {
        assert!(summary["router"][key].is_u64(), "router.{key}");
    }
    assert_eq!(summary["slo_ms"].as_f64(), Some(30.0));
    // Every response is tallied under its kind, against that kind's SLO.
    let by_mode = &summary["by_mode"];
    let kinds = ["rank", "retrieve"].map(|k| by_mode[k]["responses"].as_u64().unwrap());
    assert_eq!(
        kinds[0] + kinds[1],
        summary["responses_out"].as_u64().unwrap()
    );
    assert_eq!(by_mode["rank"]["slo_ms"].as_f64(), Some(30.0));
    assert_eq!(by_mode["retrieve"]["slo_ms"].as_f64(), Some(50.0));
}

/// One request on two workers: the node that got none reports no latency
/// and no SLO satisfaction (null in summary.json, "-" for people), not 0.
#[test]
fn a_node_that_served_nothing_reports_null_not_zero() {
    let dir = tmp_dir("idle-node");
    let trace = gen_trace(&dir, "steady", 1);
    let out = dir.join("out");
    let summary = replay_json(&trace, 2, Some(&out));
    assert_eq!(summary["responses_out"].as_u64(), Some(1), "{summary}");
    assert!(summary["latency_ms"]["p99"].is_number(), "{summary}");
    assert!(summary["slo_satisfaction"].is_number(), "{summary}");
    let on_disk: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    let nodes = on_disk["nodes"].as_array().unwrap();
    let idle: Vec<&Value> = nodes.iter().filter(|n| n["responses_out"] == 0).collect();
    assert_eq!(idle.len(), 1, "{nodes:?}");
    assert!(idle[0]["latency_ms"].is_null(), "{}", idle[0]);
    assert!(idle[0]["slo_satisfaction"].is_null(), "{}", idle[0]);

    let text = ok(grflow()
        .args(["replay", "--speed", "max", "--workers", "2", "--trace"])
        .arg(&trace)
        .output()
        .unwrap());
    let text = String::from_utf8(text.stdout).unwrap();
    let idle_line = text
        .lines()
        .find(|l| l.contains(": 0 responses"))
        .unwrap_or_else(|| panic!("no idle node in {text}"));
    assert!(idle_line.contains("p99 -  busy"), "{idle_line}");
}

#[test]
fn missing_trace_is_a_clear_error_with_exit_code_2() {
    let out = grflow()
        .args(["replay", "--trace", "/definitely/not/here"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("/definitely/not/here"),
        "names the path: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "one line: {err}");
}

#[test]
fn corrupt_parquet_is_a_clear_error_with_exit_code_2() {
    let dir = tmp_dir("corrupt");
    let trace = gen_trace(&dir, "steady", 100);
    let requests = trace.join("requests.parquet");
    let bytes = std::fs::read(&requests).unwrap();
    std::fs::write(&requests, &bytes[..bytes.len() / 2]).unwrap();
    let out = grflow()
        .args(["replay", "--speed", "max", "--trace"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(2),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("requests.parquet"), "names the file: {err}");
}

/// `grflow replay --config F` with `text` in F (named `name`): it must exit
/// 2; its stderr.
fn refused_config(name: &str, text: &str) -> String {
    let dir = tmp_dir(name);
    let cfg = dir.join(format!("{name}.toml"));
    std::fs::write(&cfg, text).unwrap();
    let out = grflow()
        .args(["replay", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    err
}

#[test]
fn unknown_config_key_is_a_clear_error_with_exit_code_2() {
    let err = refused_config("bad", "[memory]\nalpah = 0.3\n");
    assert!(
        err.contains("bad.toml") && err.contains("alpah"),
        "names file and key: {err}"
    );
}

#[test]
fn a_generated_trace_over_the_candidate_limit_is_refused_naming_both_keys() {
    let err = refused_config(
        "limit",
        "[model]\nmax_candidates = 50\n[trace]\ncandidates = 100\nrequests = 20\n",
    );
    assert!(
        err.contains("trace.candidates") && err.contains("model.max_candidates"),
        "{err}"
    );
}

/// A Parquet file's `grflow.schema_version`.
fn schema_version(path: &Path) -> Option<String> {
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::file::reader::SerializedFileReader::new(file).unwrap();
    let meta = parquet::file::reader::FileReader::metadata(&reader);
    meta.file_metadata()
        .key_value_metadata()?
        .iter()
        .find(|kv| kv.key == "grflow.schema_version")
        .and_then(|kv| kv.value.clone())
}

/// Reads one string column of a Parquet output file (a null as "").
fn string_column(path: &Path, column: &str) -> Vec<String> {
    use arrow::array::{Array, AsArray};
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let col = batch
            .column_by_name(column)
            .unwrap_or_else(|| panic!("{column} in {}", path.display()));
        let col = arrow::compute::cast(col, &arrow::datatypes::DataType::Utf8).unwrap();
        let strings = col.as_string::<i32>();
        out.extend((0..strings.len()).map(|i| strings.value(i).to_string()));
    }
    out
}

/// A generated trace (100 req/s, seed 9) to spoil before writing it.
fn small_trace(users: u64, items: u32, requests: u64) -> grflow_traces::Trace {
    grflow_traces::generate(&grflow_traces::GenConfig {
        users,
        items,
        requests,
        rps: 100.0,
        seed: 9,
        ..grflow_traces::GenConfig::default()
    })
}

#[test]
fn a_bad_row_is_an_error_with_its_position_and_the_run_goes_on() {
    let dir = tmp_dir("bad-row");
    let mut trace = small_trace(100, 1000, 300);
    // Request 120 claims more history than users.parquet holds for its user.
    trace.requests[120].hist_len = 1_000_000;
    let bad_req = trace.requests[120].req_id;
    let path = dir.join("trace");
    grflow_traces::write_trace(
        &path,
        &trace,
        &grflow_traces::WriteOptions {
            row_group_rows: 64,
            ..Default::default()
        },
    )
    .unwrap();
    let out = dir.join("out");
    let summary = replay_json(&path, 2, Some(&out));
    conserved(&summary);
    assert_eq!(summary["errors"].as_u64(), Some(1), "{summary}");
    assert_eq!(summary["responses_out"].as_u64(), Some(299));
    let positions = string_column(&out.join("errors.parquet"), "position");
    let reasons = string_column(&out.join("errors.parquet"), "reason");
    assert_eq!(positions.len(), 1);
    // Row 120 is row 56 of the second row group of 64.
    assert!(
        positions[0].contains("requests.parquet") && positions[0].contains("row group 1, row 120"),
        "{}",
        positions[0]
    );
    assert!(reasons[0].contains("hist_len"), "{}", reasons[0]);
    // The position's parts, to join the row back to the trace.
    let column = |name| string_column(&out.join("errors.parquet"), name);
    let file = positions[0].split(": row group").next().unwrap();
    assert!(file.ends_with("requests.parquet"), "{file}");
    assert_eq!(column("file"), [file]);
    assert_eq!(column("row_group"), ["1"]);
    assert_eq!(column("row"), ["120"]);
    let served = string_column(&out.join("responses.parquet"), "req_id");
    assert!(!served.contains(&bad_req.to_string()));
}

/// A trace none of whose requests can be served: the outputs are written
/// (every row in errors.parquet) and the replay exits 1 saying so.
#[test]
fn a_replay_that_served_nothing_writes_its_outputs_and_fails() {
    let dir = tmp_dir("served-nothing");
    let mut trace = small_trace(50, 500, 40);
    for r in &mut trace.requests {
        r.hist_len = 1_000_000;
    }
    let path = dir.join("trace");
    grflow_traces::write_trace(&path, &trace, &Default::default()).unwrap();
    let out = dir.join("out");
    let run = grflow()
        .args(["replay", "--speed", "max", "--json", "--trace"])
        .arg(&path)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(run.status.code(), Some(1), "{run:?}");
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        stderr.contains("no request was served: all 40 requests")
            && stderr.contains("errors.parquet"),
        "{stderr}"
    );
    let summary: Value = serde_json::from_slice(&run.stdout).expect("summary JSON on stdout");
    assert_eq!(summary["errors"].as_u64(), Some(40), "{summary}");
    assert_eq!(
        string_column(&out.join("errors.parquet"), "reason").len(),
        40
    );
    assert!(out.join("summary.json").exists());
}

/// Cluster mode: the error rows of every process reach process 0's
/// errors.parquet (with the responses, over the dataflow), once each and
/// in trace order; the other process writes no errors file.
#[test]
fn a_cluster_writes_every_process_error_rows_to_one_file() {
    let dir = tmp_dir("cluster-errors");
    let mut trace = grflow_traces::generate(&grflow_traces::GenConfig {
        users: 100,
        items: 1000,
        requests: 300,
        rps: 100.0,
        seed: 9,
        ..grflow_traces::GenConfig::default()
    });
    // Rows that fail to decode in row groups of both processes' sources
    // (row groups of 64 alternate between them), and one request a node
    // cannot serve.
    let undecodable = [10, 70, 130, 200];
    for row in undecodable {
        trace.requests[row].candidates.clear();
    }
    trace.requests[120].hist_len = 1_000_000;
    let path = dir.join("trace");
    grflow_traces::write_trace(
        &path,
        &trace,
        &grflow_traces::WriteOptions {
            row_group_rows: 64,
            ..Default::default()
        },
    )
    .unwrap();
    let listeners: Vec<_> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let hosts = dir.join("hosts");
    let lines: String = listeners
        .iter()
        .map(|l| format!("127.0.0.1:{}\n", l.local_addr().unwrap().port()))
        .collect();
    std::fs::write(&hosts, lines).unwrap();
    drop(listeners);
    let replay = |process: &str, out: &Path| {
        let mut cmd = grflow();
        cmd.args(["replay", "--speed", "max", "--quiet", "--json"])
            .args(["--workers", "1", "--process", process, "--hostfile"])
            .arg(&hosts)
            .arg("--trace")
            .arg(&path)
            .arg("--out")
            .arg(out);
        cmd
    };
    let (leader_out, follower_out) = (dir.join("out"), dir.join("follower"));
    let follower = process::Reaped::spawn(
        replay("1", &follower_out)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped()),
    );
    let leader = ok(replay("0", &leader_out).output().unwrap());
    ok(follower.wait_with_output());
    let summary: Value = serde_json::from_slice(&leader.stdout).expect("summary JSON");
    conserved(&summary);
    assert_eq!(summary["errors"].as_u64(), Some(5), "{summary}");
    let errors = leader_out.join("errors.parquet");
    let rows = string_column(&errors, "row");
    assert_eq!(
        rows,
        ["10", "70", "120", "130", "200"],
        "once each, in order"
    );
    let groups = string_column(&errors, "row_group");
    assert_eq!(groups, ["0", "1", "1", "2", "3"]);
    let reasons = string_column(&errors, "reason");
    assert!(reasons[2].contains("hist_len"), "{}", reasons[2]);
    for i in [0, 1, 3, 4] {
        assert!(reasons[i].contains("candidates"), "{}", reasons[i]);
    }
    assert!(!follower_out.join("errors.parquet").exists());
}

/// Rows out of time order within a row group are served at their own
/// times, not counted late: the source hands a row group out in time order.
/// The summary's event time is the trace's span.
#[test]
fn rows_out_of_order_within_a_row_group_are_not_late() {
    let dir = tmp_dir("out-of-order");
    let mut trace = grflow_traces::generate(&grflow_traces::GenConfig {
        users: 100,
        items: 1000,
        requests: 1_000,
        rps: 100.0,
        seed: 9,
        ..grflow_traces::GenConfig::default()
    });
    // Row 150 is stamped 1 s after its neighbours (still in the trace's span).
    trace.requests[150].ts_ms += 1_000;
    let path = dir.join("trace");
    grflow_traces::write_trace(&path, &trace, &grflow_traces::WriteOptions::default()).unwrap();
    let summary = replay_json(&path, 1, None);
    conserved(&summary);
    assert_eq!(summary["late_records"].as_u64(), Some(0), "{summary}");
    // The event time the trace covers, first request to last (it was read
    // off the windows' starts: short by up to a window, 0 under one).
    let (lo, hi) = (
        trace.requests.iter().map(|r| r.ts_ms).min().unwrap(),
        trace.requests.iter().map(|r| r.ts_ms).max().unwrap(),
    );
    let span = summary["event_time_s"].as_f64().unwrap();
    assert!((span - (hi - lo) as f64 / 1000.0).abs() < 1e-9, "{span}");
    // A trace shorter than one window.
    let short = dir.join("short");
    trace.requests.truncate(200);
    grflow_traces::write_trace(&short, &trace, &grflow_traces::WriteOptions::default()).unwrap();
    let summary = replay_json(&short, 1, None);
    let span = summary["event_time_s"].as_f64().unwrap();
    assert!(span > 1.0, "{summary}");
}

/// A Parquet trace whose row groups run backwards in time (as two files
/// concatenated in the wrong order would): `--speed max` hung on it,
/// holding the first group back behind a later group's earlier start.
#[test]
fn speed_max_serves_a_trace_whose_row_groups_run_backwards() {
    let dir = tmp_dir("backwards");
    let mut trace = grflow_traces::generate(&grflow_traces::GenConfig {
        users: 100,
        items: 1000,
        requests: 1_200,
        rps: 100.0,
        seed: 9,
        ..grflow_traces::GenConfig::default()
    });
    trace.requests.reverse();
    let path = dir.join("trace");
    // Groups of 3 s each: every group starts 3 s after the next one.
    let options = grflow_traces::WriteOptions {
        row_group_rows: 300,
        ..grflow_traces::WriteOptions::default()
    };
    grflow_traces::write_trace(&path, &trace, &options).unwrap();
    let mut child = grflow()
        .args(["replay", "--speed", "max", "--json", "--workers", "1"])
        .arg("--trace")
        .arg(&path)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let started = std::time::Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > std::time::Duration::from_secs(120) {
            let _ = child.kill();
            panic!("replay --speed max of a backwards trace did not finish in 120 s");
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let out = ok(child.wait_with_output().unwrap());
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    conserved(&summary);
    assert_eq!(summary["requests_in"].as_u64(), Some(1_200), "{summary}");
}

#[test]
fn retrieve_requests_are_served_by_beam_search_and_the_event_clock_is_deterministic() {
    let dir = tmp_dir("retrieve");
    let trace = dir.join("trace");
    ok(grflow()
        .args(["gen-trace", "--regime", "steady", "--users", "80"])
        .args(["--items", "1500", "--requests", "150", "--rps", "100"])
        .args(["--seed", "3", "--retrieve-share", "0.5", "--out"])
        .arg(&trace)
        .output()
        .unwrap());
    let run = |out: &Path| {
        let o = ok(grflow()
            .args(["replay", "--speed", "max", "--json", "--clock", "event"])
            .args(["--workers", "2", "--trace"])
            .arg(&trace)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap());
        serde_json::from_slice::<Value>(&o.stdout).unwrap()
    };
    let a = run(&dir.join("a"));
    conserved(&a);
    assert_eq!(a["errors"].as_u64(), Some(0), "{a}");
    assert_eq!(a["clock"], "event");
    assert_eq!(
        a["release"], "complete",
        "auto is complete on the event clock"
    );
    let b = run(&dir.join("b"));
    assert_eq!(
        a["latency_ms"], b["latency_ms"],
        "event-clock latency is a pure function of the trace"
    );
    assert!(a["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
}

#[test]
fn release_flag_picks_the_policy_and_auto_follows_the_clock() {
    let dir = tmp_dir("release");
    let trace = gen_trace(&dir, "steady", 100);
    let release = |extra: &[&str]| {
        let o = ok(grflow()
            .args(["replay", "--speed", "max", "--json", "--trace"])
            .arg(&trace)
            .args(extra)
            .output()
            .unwrap());
        let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
        conserved(&summary);
        summary["release"].as_str().unwrap().to_string()
    };
    assert_eq!(
        release(&[]),
        "arrival",
        "the wall clock releases on arrival"
    );
    assert_eq!(release(&["--clock", "event"]), "complete");
    assert_eq!(release(&["--release", "complete"]), "complete");
    assert_eq!(
        release(&["--clock", "event", "--release", "arrival"]),
        "arrival"
    );

    let out = grflow()
        .args(["replay", "--release", "eager", "--trace"])
        .arg(&trace)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--release"), "names the flag: {err}");
}

#[test]
fn a_pool_too_small_for_one_page_names_memory_pool_mib_and_the_file() {
    let err = refused_config(
        "tiny",
        "[memory]\npool_mib = 0.00001\n[trace]\nrequests = 20\n",
    );
    assert!(
        err.contains("tiny.toml: memory.pool_mib") && !err.contains("pool_bytes"),
        "{err}"
    );
}

/// Row groups out of time order: the later ones hold earlier requests. The
/// source's lower bound covers them, so no request is late, paced or not
/// (a paced replay counted 72 of 200 late, and `--speed max` none).
#[test]
fn row_groups_out_of_time_order_are_not_late_at_any_pace() {
    let dir = tmp_dir("reversed-groups");
    let trace = grflow_traces::generate(&grflow_traces::GenConfig {
        users: 100,
        items: 1000,
        requests: 200,
        rps: 400.0,
        seed: 5,
        ..grflow_traces::GenConfig::default()
    });
    let path = dir.join("trace");
    grflow_traces::write_trace(&path, &trace, &grflow_traces::WriteOptions::default()).unwrap();
    // requests.parquet again, in row groups of 40 written last first.
    let file = std::fs::File::create(path.join("requests.parquet")).unwrap();
    let schema = grflow_traces::columnar::requests_schema();
    let mut w = parquet::arrow::ArrowWriter::try_new(file, schema, None).unwrap();
    for group in trace.requests.chunks(40).rev() {
        w.write(&grflow_traces::columnar::requests_to_batch(group))
            .unwrap();
        w.flush().unwrap();
    }
    w.close().unwrap();
    for speed in ["max", "20x"] {
        let out = ok(grflow()
            .args(["replay", "--json", "--quiet", "--workers", "1"])
            .args(["--clock", "event", "--speed", speed, "--trace"])
            .arg(&path)
            .output()
            .unwrap());
        let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
        conserved(&summary);
        assert_eq!(
            summary["late_records"].as_u64(),
            Some(0),
            "{speed}: {summary}"
        );
    }
}

/// `--out` that is a file is refused by name before any work: replay,
/// gen-trace and import used to find out after running or generating.
#[test]
fn an_out_path_that_is_a_file_is_refused_before_the_work() {
    let dir = tmp_dir("out-is-a-file");
    let file = dir.join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let ratings = dir.join("ratings.csv");
    std::fs::write(&ratings, "userId,movieId,rating,timestamp\n1,2,5,100\n").unwrap();
    let ratings = ratings.to_string_lossy().to_string();
    for args in [
        &["replay", "--quiet"][..],
        &["gen-trace", "--requests", "100000"][..],
        &["import", "--format", "movielens", "--input", &ratings][..],
    ] {
        let err = cli::refused_out(args, &file);
        assert!(err.contains("not a directory"), "{args:?}: {err}");
    }
}

/// gen-trace and import into a `grflow train` model directory: refused,
/// the model's items.parquet untouched (both formats use that name).
#[test]
fn gen_trace_and_import_refuse_an_out_holding_a_model() {
    let dir = tmp_dir("out-is-a-model");
    let ratings = dir.join("ratings.csv");
    std::fs::write(&ratings, "userId,movieId,rating,timestamp\n1,2,5,100\n").unwrap();
    let ratings = ratings.to_string_lossy().to_string();
    for file in ["model.json", "model.safetensors"] {
        let model = dir.join(format!("model-{file}"));
        std::fs::create_dir_all(&model).unwrap();
        std::fs::write(model.join(file), "{}").unwrap();
        std::fs::write(model.join("items.parquet"), "x").unwrap();
        for args in [
            &["gen-trace", "--requests", "100"][..],
            &["import", "--format", "movielens", "--input", &ratings][..],
        ] {
            let err = cli::refused_out(args, &model);
            assert!(err.contains("holds a model"), "{args:?}: {err}");
            let items = std::fs::read_to_string(model.join("items.parquet")).unwrap();
            assert_eq!(items, "x", "{args:?}");
        }
    }
}

/// A replay refused at setup (no such trace, a config the job cannot
/// run) leaves the previous run's outputs in --out; one that runs
/// replaces them.
#[test]
fn a_replay_refused_at_setup_keeps_the_previous_outputs() {
    let dir = tmp_dir("refused-keeps-outputs");
    let out = dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    std::fs::write(out.join("summary.json"), "old").unwrap();
    std::fs::write(out.join("errors.parquet"), "old").unwrap();
    let tiny = dir.join("tiny.toml");
    std::fs::write(
        &tiny,
        "[memory]\npool_mib = 0.00001\n[trace]\nrequests = 20\n",
    )
    .unwrap();
    let small = dir.join("small.toml");
    std::fs::write(&small, "[trace]\nrequests = 20\n").unwrap();
    let run = |extra: &[&std::ffi::OsStr]| {
        grflow()
            .args(["replay", "--quiet", "--speed", "max", "--out"])
            .arg(&out)
            .args(extra)
            .output()
            .unwrap()
    };
    for extra in [
        ["--trace".as_ref(), "/no/such".as_ref()],
        ["--config".as_ref(), tiny.as_os_str()],
    ] {
        let r = run(&extra);
        let err = String::from_utf8_lossy(&r.stderr);
        assert_eq!(r.status.code(), Some(2), "{extra:?}: {err}");
        for f in ["summary.json", "errors.parquet"] {
            let kept = std::fs::read_to_string(out.join(f)).unwrap();
            assert_eq!(kept, "old", "{extra:?} removed {f}: {err}");
        }
    }
    ok(run(&["--config".as_ref(), small.as_os_str()]));
    let summary = std::fs::read_to_string(out.join("summary.json")).unwrap();
    assert_ne!(summary, "old");
}

/// A replay refused at setup does not leave an empty --out it made (with
/// the parents it made), as gen-trace does not.
#[test]
fn a_replay_refused_at_setup_removes_the_out_directory_it_made() {
    let dir = tmp_dir("refused-removes-made-out");
    let tiny = dir.join("tiny.toml");
    std::fs::write(
        &tiny,
        "[memory]\npool_mib = 0.00001\n[trace]\nrequests = 20\n",
    )
    .unwrap();
    let out = dir.join("new").join("sub");
    let r = grflow()
        .args(["replay", "--quiet", "--speed", "max", "--out"])
        .arg(&out)
        .arg("--config")
        .arg(&tiny)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(!dir.join("new").exists(), "left {}: {err}", out.display());
}

#[test]
fn sigint_stops_reading_answers_what_was_read_and_writes_the_outputs() {
    let dir = tmp_dir("sigint");
    // 2,000 requests at 100 req/s: 20 s at the default pace.
    let trace = gen_trace(&dir, "steady", 2_000);
    let out = dir.join("out");
    let child = grflow()
        .args(["replay", "--json", "--workers", "2", "--trace"])
        .arg(&trace)
        .arg("--out")
        .arg(&out)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Serving has begun once responses stream to the partial file.
    let partial = out.join("responses.parquet.partial");
    process::wait_for_file(
        &partial,
        std::time::Duration::from_secs(30),
        "replay never started",
    );
    std::thread::sleep(std::time::Duration::from_millis(1_500));
    let signalled = std::time::Instant::now();
    // Twice at once, as GNU `timeout` passes a signal on (to the child and
    // to its process group): one signal, which drains. The copy exited at
    // once, without the summary, about one run in two.
    let pid = child.id().to_string();
    let status = std::process::Command::new("kill")
        .args(["-INT", &pid, &pid])
        .status()
        .unwrap();
    assert!(status.success());
    let run = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(
        signalled.elapsed().as_secs() < 10,
        "took {:?} to stop",
        signalled.elapsed()
    );
    assert_eq!(
        run.status.code(),
        Some(130),
        "128 + SIGINT; stderr: {stderr}"
    );
    let summary: Value = serde_json::from_slice(&run.stdout).expect("summary JSON on stdout");
    conserved(&summary);
    assert_eq!(summary["interrupted"]["signal"], "SIGINT", "{summary}");
    assert_eq!(summary["interrupted"]["trace_rows"], 2_000, "{summary}");
    let read = summary["requests_in"].as_u64().unwrap();
    assert!(read < 2_000, "stopped before the trace's end: {summary}");
    // The event time read, not the trace's 20 s.
    let event_s = summary["event_time_s"].as_f64().unwrap();
    assert!(event_s > 0.5 && event_s < 15.0, "{summary}");
    // Every response read is in the outputs, and no partial file is left.
    assert!(!out.join("responses.parquet.partial").exists());
    let rows = string_column(&out.join("responses.parquet"), "req_id").len() as u64;
    assert_eq!(rows, summary["responses_out"].as_u64().unwrap());
    let on_disk: Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("summary.json")).unwrap()).unwrap();
    assert_eq!(on_disk["interrupted"], summary["interrupted"]);
}
