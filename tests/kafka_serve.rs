//! `grflow serve` against a real Kafka-compatible broker (tansu in CI,
//! started by ./scripts/test.sh, address in GRFLOW_KAFKA_BROKERS). Without
//! that variable these tests print why and pass without running.

#[path = "common/cli.rs"]
mod cli;
mod common;
#[path = "common/seq_trace.rs"]
mod seq_trace;

use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::time::Duration;

use common::kafka::{
    Serve, Tail, Topics, answers_by_req, broker, produce, write_config, write_config_as,
};
use common::temp::tmp_dir;
use grflow_connectors::kafka::{KafkaSettings, RecordId, WireResponse, scan_answered};
use grflow_pipeline::Config;
use serde_json::json;

const PARTITIONS: i32 = 4;

/// A valid request: half carry their history inline, half name a prefix
/// of the users table (every generated user has at least 10 items).
fn request(i: u64) -> Vec<u8> {
    let mut r = json!({
        "req_id": i,
        "user_id": i % 500,
        "ts_ms": 1_700_000_000_000u64 + i * 2,
        "candidates": [(i * 7) % 5000, (i * 13 + 1) % 5000, (i * 31 + 2) % 5000, (i * 57 + 3) % 5000],
    });
    if i.is_multiple_of(2) {
        r["history"] = json!([
            (i * 3) % 5000,
            (i * 5 + 1) % 5000,
            (i * 11 + 2) % 5000,
            17,
            42,
            4999
        ]);
    } else {
        r["hist_len"] = json!(1 + i % 10);
    }
    serde_json::to_vec(&r).unwrap()
}

fn committed_total(summary: &serde_json::Value) -> i64 {
    summary["committed"]
        .as_object()
        .expect("committed")
        .values()
        .map(|v| v.as_i64().unwrap())
        .sum()
}

/// Without a broker every test here passes after saying, under its own
/// name, that it skipped: a skip nobody sees reads as a test that ran.
#[test]
fn without_a_broker_every_test_here_says_it_skipped() {
    common::skip::assert_every_test_skips_visibly(
        "without_a_broker_every_test_here_says_it_skipped",
        &[("GRFLOW_KAFKA_BROKERS", None)],
    );
}

#[test]
fn kafka_kill_restart_with_the_shipped_deadline_leaves_one_answer_per_request() {
    let Some(brokers) =
        broker("kafka_kill_restart_with_the_shipped_deadline_leaves_one_answer_per_request")
    else {
        return;
    };
    const N: u64 = 10_000;
    let topics = Topics::fresh("killrestart");
    topics.create(&brokers, PARTITIONS);
    let records: Vec<_> = (0..N)
        .map(|i| ((i % PARTITIONS as u64) as i32, Some(request(i))))
        .collect();
    produce(&brokers, &topics.requests, &records);

    let dir = tmp_dir("kill-restart");
    // The deadline users get (configs/kafka.toml): answers past it are shed,
    // so a request recomputed after the crash could be shed while its first
    // answer, in flight at the kill, was a ranking.
    let shipped = Config::load(&Path::new(env!("CARGO_MANIFEST_DIR")).join("configs/kafka.toml"))
        .expect("configs/kafka.toml");
    let deadline_ms = shipped.kafka.deadline_ms;
    let config = write_config(
        &dir,
        &topics,
        // hstu-3l: a few ms per request, so that the run lasts long
        // enough for the kill to land mid-run (with `small` the job
        // answered all 10,000 before the tail had seen 15%).
        &format!(
            "deadline_ms = {deadline_ms}\nmax_in_flight = 256\n\n[model]\npreset = \"hstu-3l\""
        ),
    );
    let mut tail = Tail::new(&brokers, &topics.responses, PARTITIONS);
    // Connected and fetching before the job starts, so that it sees the
    // first answers as they come.
    tail.read_until(Duration::from_millis(1_500), |_| false);

    let first = Serve::start(&brokers, &config, "first");
    // Killed at 15% seen: answers already in the log but not yet
    // read by the tail (a few thousand at the arrival release's pace) still
    // count below, and the kill must land mid-run.
    assert!(
        tail.read_until(Duration::from_secs(300), |t| t.req_ids.len() as u64
            >= N * 15 / 100),
        "only {} answers before the kill; stderr:\n{}",
        tail.req_ids.len(),
        first.stderr_text()
    );
    first.kill_hard();
    tail.settle(Duration::from_secs(2));
    let at_kill = tail.req_ids.len() as u64;
    eprintln!("answered at SIGKILL: {at_kill} of {N}");
    // The kill must land mid-run: at least a thousand answered and a
    // thousand still to recover (about 16% here with hstu-3l and a tail
    // connected before the job).
    assert!(
        (N * 10 / 100..=N * 90 / 100).contains(&at_kill),
        "the kill must land with 10-90% answered, not {at_kill}"
    );

    let second = Serve::start(&brokers, &config, "second");
    let all = tail.read_until(Duration::from_secs(300), |t| t.req_ids.len() as u64 >= N);
    let summary = if all {
        second.stop()
    } else {
        panic!(
            "{} of {N} answered after the restart; stderr:\n{}",
            tail.req_ids.len(),
            second.stderr_text()
        );
    };
    tail.settle(Duration::from_secs(1));

    let mut by_req: BTreeMap<u64, Vec<WireResponse>> = BTreeMap::new();
    for r in &tail.records {
        let response: WireResponse = serde_json::from_slice(&r.payload).expect("a response");
        by_req.entry(response.req_id).or_default().push(response);
    }
    assert_eq!(by_req.len() as u64, N, "every req_id answered");
    assert_eq!(*by_req.keys().next().unwrap(), 0);
    assert_eq!(*by_req.keys().last().unwrap(), N - 1);
    let mut produced_twice = 0;
    let mut shed = 0;
    for (req, answers) in &by_req {
        // One answer, as `WireResponse::same_answer` defines it (scores may
        // differ within the stated tolerance between cache states).
        assert!(
            answers.iter().all(|a| a.same_answer(&answers[0])),
            "req {req} got different answers: {answers:?}"
        );
        if let Some(e) = &answers[0].error {
            assert_eq!(e.kind, "shed", "req {req}: {answers:?}");
            shed += 1;
        }
        produced_twice += answers.len() - 1;
    }
    eprintln!(
        "deadline {deadline_ms} ms; responses on the topic: {}, produced twice: {produced_twice}, \
         shed: {shed}, recovered past the deadline and served: {}, skipped on restart as already \
         answered: {}, duplicates skipped: {}",
        tail.records.len(),
        summary["recovered_unshed"],
        summary["already_answered"],
        summary["duplicates_skipped"]
    );
    // Only requests in flight at the crash may be answered twice.
    assert!(
        produced_twice <= 2 * 256 + 512,
        "{produced_twice} answered twice"
    );
    // The restart drained and committed everything.
    assert_eq!(summary["in_flight_at_exit"], 0);
    assert_eq!(committed_total(&summary), N as i64, "{summary}");
}

#[test]
fn kafka_dead_letter_every_kind_of_bad_message_and_keep_serving() {
    let Some(brokers) = broker("kafka_dead_letter_every_kind_of_bad_message_and_keep_serving")
    else {
        return;
    };
    let topics = Topics::fresh("deadletter");
    topics.create(&brokers, 2);
    let good = |id: u64, extra: serde_json::Value| {
        let mut r =
            json!({"req_id": id, "user_id": 3, "ts_ms": 1000 + id, "candidates": [1, 2, 3]});
        for (k, v) in extra.as_object().unwrap() {
            r[k] = v.clone();
        }
        Some(serde_json::to_vec(&r).unwrap())
    };
    let raw = |s: &str| Some(s.as_bytes().to_vec());
    let oversized = {
        let pad = "x".repeat(5000);
        raw(&format!(
            r#"{{"req_id":9,"user_id":1,"ts_ms":1,"candidates":[1],"pad":"{pad}"}}"#
        ))
    };
    // (partition, payload, expected dead-letter kind or None for a request that is served)
    type Message = (i32, Option<Vec<u8>>, Option<&'static str>);
    let messages: Vec<Message> = vec![
        (0, good(1, json!({"history": [5, 6, 7]})), None),
        (
            0,
            raw(r#"{"req_id": 2, "user_id": "#),
            Some("malformed_json"),
        ),
        (1, raw("[1, 2, 3]"), Some("not_an_object")),
        (
            1,
            raw(r#"{"user_id": 1, "ts_ms": 5, "candidates": [1]}"#),
            Some("missing_field"),
        ),
        (
            0,
            raw(r#"{"req_id": 4, "user_id": 1, "ts_ms": 5, "candidates": [1, 2.5]}"#),
            Some("wrong_type"),
        ),
        (
            1,
            raw(
                r#"{"req_id": 5, "user_id": 1, "ts_ms": 5, "candidates": [1], "history": [1], "hist_len": 1}"#,
            ),
            Some("two_histories"),
        ),
        (
            0,
            raw(r#"{"req_id": 6, "user_id": 1, "ts_ms": 5, "candidates": []}"#),
            Some("no_candidates"),
        ),
        (1, oversized, Some("oversized")),
        // One candidate over `model.max_candidates` (3 here): refused when
        // decoded, before any work, whatever else the request holds.
        (
            1,
            good(13, json!({"candidates": [1, 2, 3, 4], "hist_len": 2})),
            Some("too_many_candidates"),
        ),
        (0, None, Some("malformed_json")),
        // Items the catalog does not know: served from the OOV row, counted.
        (
            1,
            good(
                10,
                json!({"candidates": [4_000_000, 4_000_001, 7], "hist_len": 2}),
            ),
            None,
        ),
        // A user the users table does not know: served with an empty history.
        (
            0,
            good(11, json!({"user_id": 987_654_321u64, "hist_len": 5})),
            None,
        ),
        (
            1,
            good(
                12,
                json!({"hist_len": 3, "mode": "retrieve", "candidates": null}),
            ),
            None,
        ),
        // A producer's retry: request 1 again, at another offset of its
        // partition. Served a second time, counted, logged by id.
        (0, good(1, json!({"history": [5, 6, 7]})), None),
        // A retry partitioned anew: request 11 again on the other
        // partition, which the other worker reads. Counted all the same.
        (
            1,
            good(11, json!({"user_id": 987_654_321u64, "hist_len": 5})),
            None,
        ),
    ];
    let records: Vec<_> = messages.iter().map(|(p, m, _)| (*p, m.clone())).collect();
    produce(&brokers, &topics.requests, &records);
    // Where each message landed: offsets count per partition in send order.
    let mut next = [0i64; 2];
    let mut expected_letters = BTreeMap::new();
    for (p, _, kind) in &messages {
        if let Some(kind) = kind {
            expected_letters.insert((*p, next[*p as usize]), kind.to_string());
        }
        next[*p as usize] += 1;
    }

    let dir = tmp_dir("dead-letter");
    // [kafka] ends the file: the [model] section after it takes the limit.
    let config = write_config(
        &dir,
        &topics,
        "max_message_bytes = 4096\ndeadline_ms = 600000\n\n[model]\nmax_candidates = 3",
    );
    let serve = Serve::start(&brokers, &config, "serve");
    let mut letters = Tail::new(&brokers, &topics.dead_letters, 1);
    let mut responses = Tail::new(&brokers, &topics.responses, 2);
    let n_letters = expected_letters.len();
    assert!(
        letters.read_until(Duration::from_secs(120), |t| t.records.len() >= n_letters),
        "{} of {n_letters} dead letters; stderr:\n{}",
        letters.records.len(),
        serve.stderr_text()
    );
    assert!(
        responses.read_until(Duration::from_secs(120), |t| t.records.len() >= 6),
        "{} of 6 responses; stderr:\n{}",
        responses.records.len(),
        serve.stderr_text()
    );
    let stderr = serve.stderr_text();
    let summary = serve.stop();

    let mut got = BTreeMap::new();
    for r in &letters.records {
        let v: serde_json::Value = serde_json::from_slice(&r.payload).unwrap();
        assert_eq!(v["topic"], topics.requests.as_str());
        assert!(!v["reason"].as_str().unwrap().is_empty());
        got.insert(
            (
                v["partition"].as_i64().unwrap() as i32,
                v["offset"].as_i64().unwrap(),
            ),
            v["kind"].as_str().unwrap().to_string(),
        );
    }
    assert_eq!(got, expected_letters);
    let wrong_type = letters
        .records
        .iter()
        .map(|r| serde_json::from_slice::<serde_json::Value>(&r.payload).unwrap())
        .find(|v| v["kind"] == "wrong_type")
        .unwrap();
    assert!(
        wrong_type["reason"]
            .as_str()
            .unwrap()
            .contains("candidates[1]"),
        "{wrong_type}"
    );
    let too_many = letters
        .records
        .iter()
        .map(|r| serde_json::from_slice::<serde_json::Value>(&r.payload).unwrap())
        .find(|v| v["kind"] == "too_many_candidates")
        .unwrap();
    assert!(
        too_many["reason"]
            .as_str()
            .unwrap()
            .contains("4 candidates, more than the limit of 3 (model.max_candidates)"),
        "{too_many}"
    );

    let by_req = answers_by_req(&responses.records);
    assert_eq!(
        by_req.keys().copied().collect::<Vec<_>>(),
        vec![1, 10, 11, 12]
    );
    assert_eq!(by_req[&1].len(), 2, "{by_req:?}");
    assert_eq!(by_req[&11].len(), 2, "{by_req:?}");
    for (req, answers) in &by_req {
        assert!(answers[0].2.is_null(), "req {req}: {answers:?}");
        assert!(
            !answers[0].0.as_array().unwrap().is_empty(),
            "req {req}: {answers:?}"
        );
    }
    assert_eq!(summary["dead_lettered"], n_letters as u64, "{summary}");
    assert_eq!(summary["responses_out"], 6, "{summary}");
    assert_eq!(summary["repeated_req_ids"], 2, "{summary}");
    // Logged by id; a worker's later repeats within its log interval are
    // counted, not logged, and which repeat a worker meets first depends
    // on the order the workers read their partitions.
    assert!(
        stderr.contains("repeats a request read before")
            && (stderr.contains("req_id=1 ") || stderr.contains("req_id=11 ")),
        "{stderr}"
    );
    assert!(summary["oov_items"].as_u64().unwrap() >= 2, "{summary}");
    // req_id 11 (and its retry) asked for 5 items of a user the users
    // table does not know.
    assert_eq!(summary["unknown_user_histories"], 2, "{summary}");
    // Dead-lettered records count as answered: every offset is committed.
    assert_eq!(
        committed_total(&summary),
        messages.len() as i64,
        "{summary}"
    );
}

#[test]
fn kafka_overload_sheds_past_the_deadline_and_pauses_reads() {
    let Some(brokers) = broker("kafka_overload_sheds_past_the_deadline_and_pauses_reads") else {
        return;
    };
    const N: u64 = 600;
    // One request per partition first: records already in the log when the
    // job starts are recovered and never shed, so the overload is produced
    // once the job has fetched from every partition.
    const WARM: u64 = PARTITIONS as u64;
    let topics = Topics::fresh("overload");
    topics.create(&brokers, PARTITIONS);
    let dir = tmp_dir("overload");
    // A 1 ms deadline, 8 in flight per worker (reads pause) and one
    // request per model call: a request queued behind others waits more
    // than 1 ms and is shed. Batched, a release build served the 8 queued
    // requests in one call of under 1 ms and shed nothing (3 runs of 6).
    let config = write_config(
        &dir,
        &topics,
        "deadline_ms = 1\nmax_in_flight = 8\n\n[batch]\nmax_tokens = 1",
    );
    let serve = Serve::start(&brokers, &config, "serve");
    let mut responses = Tail::new(&brokers, &topics.responses, PARTITIONS);
    // Stamped before the overload so that it does not arrive late.
    let warm: Vec<_> = (N..N + WARM)
        .map(|i| {
            let mut r: serde_json::Value = serde_json::from_slice(&request(i)).unwrap();
            r["ts_ms"] = json!(1_700_000_000_000u64 - 1_000 + i);
            (
                (i % PARTITIONS as u64) as i32,
                Some(serde_json::to_vec(&r).unwrap()),
            )
        })
        .collect();
    produce(&brokers, &topics.requests, &warm);
    assert!(
        responses.read_until(Duration::from_secs(120), |t| t.req_ids.len() as u64 >= WARM),
        "warm-up not answered; stderr:\n{}",
        serve.stderr_text()
    );
    let records: Vec<_> = (0..N)
        .map(|i| ((i % PARTITIONS as u64) as i32, Some(request(i))))
        .collect();
    produce(&brokers, &topics.requests, &records);
    assert!(
        responses.read_until(Duration::from_secs(180), |t| t.req_ids.len() as u64
            >= N + WARM),
        "{} of {N} answered; stderr:\n{}",
        responses.req_ids.len(),
        serve.stderr_text()
    );
    let summary = serve.stop();
    let by_req = answers_by_req(&responses.records);
    let shed = by_req.values().filter(|a| a[0].2 == "shed").count() as u64;
    assert!(shed > 0, "nothing shed: {summary}");
    assert_eq!(summary["shed"], shed, "{summary}");
    // A shed request is a miss of its kind's SLO, with no latency.
    let failed: u64 = ["rank", "retrieve"]
        .iter()
        .map(|k| summary["by_mode"][k]["failed"].as_u64().unwrap())
        .sum();
    assert_eq!(failed, shed, "{summary}");
    assert_eq!(
        summary["shed"].as_u64().unwrap() + summary["responses_out"].as_u64().unwrap(),
        N + WARM,
        "{summary}"
    );
    assert!(
        summary["pauses"].as_u64().unwrap() > 0,
        "never paused: {summary}"
    );
    assert_eq!(committed_total(&summary), (N + WARM) as i64, "{summary}");
}

#[test]
fn kafka_restart_scan_reads_to_the_end_of_a_batched_response_topic() {
    let Some(brokers) = broker("kafka_restart_scan_reads_to_the_end_of_a_batched_response_topic")
    else {
        return;
    };
    const N: i64 = 3_000;
    let topics = Topics::fresh("restartscan");
    topics.create(&brokers, 1);
    // Produced in a few large batches: the broker's ListOffsets answer can
    // then sit far before the end of the log.
    let records: Vec<_> = (0..N)
        .map(|i| {
            let source = RecordId {
                partition: (i % 4) as i32,
                offset: i / 4,
            };
            let r = WireResponse::ranking(source, i as u64, vec![1], &[0.5], "v".into());
            (0, Some(serde_json::to_vec(&r).unwrap()))
        })
        .collect();
    produce(&brokers, &topics.responses, &records);
    let answered = scan_responses(&brokers, &topics, 200_000);
    assert_eq!(answered.len() as i64, N);
}

/// What a restarted job's scan of `topics.responses` finds answered for
/// `topics.requests`, looking back `lookback` records per partition.
fn scan_responses(brokers: &str, topics: &Topics, lookback: i64) -> HashSet<RecordId> {
    let settings = KafkaSettings {
        brokers: brokers.to_string(),
        group_id: topics.group.clone(),
        ..KafkaSettings::default()
    };
    scan_answered(
        &settings,
        &topics.responses,
        &topics.requests,
        lookback,
        Duration::from_secs(10),
    )
    .unwrap()
}

/// Two request topics answered on one response topic: the scan for one
/// counts its own answers and those written before answers named their
/// topic, never the other topic's (whose (partition, offset) would make a
/// restarted job skip new requests unanswered).
#[test]
fn kafka_restart_scan_counts_only_answers_to_its_request_topic() {
    let Some(brokers) = broker("kafka_restart_scan_counts_only_answers_to_its_request_topic")
    else {
        return;
    };
    let topics = Topics::fresh("scantopic");
    topics.create(&brokers, 1);
    let answer = |offset: i64, topic: Option<&str>| {
        let source = RecordId {
            partition: 0,
            offset,
        };
        let r = WireResponse::ranking(source, offset as u64, vec![1], &[0.5], "v".into());
        let r = match topic {
            Some(t) => r.requested_on(t),
            None => r,
        };
        (0, Some(serde_json::to_vec(&r).unwrap()))
    };
    let other = format!("{}-other", topics.requests);
    let mut records: Vec<_> = (0..10).map(|i| answer(i, Some(&topics.requests))).collect();
    records.extend((10..20).map(|i| answer(i, Some(&other))));
    // An answer from before the topic was recorded: no `topic` field.
    let mut old: serde_json::Value = serde_json::from_slice(&answer(20, None).1.unwrap()).unwrap();
    old.as_object_mut().unwrap().remove("topic");
    records.push((0, Some(serde_json::to_vec(&old).unwrap())));
    produce(&brokers, &topics.responses, &records);
    let answered = scan_responses(&brokers, &topics, 1_000);
    let mut offsets: Vec<i64> = answered.iter().map(|r| r.offset).collect();
    offsets.sort_unstable();
    let expected: Vec<i64> = (0..10).chain([20]).collect();
    assert_eq!(offsets, expected);
}

/// `grflow bench kafka --json` against `brokers` with `args`.
fn bench_kafka(brokers: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_grflow"))
        .args(["bench", "kafka", "--json", "--brokers", brokers])
        .args(args)
        .output()
        .unwrap()
}

/// `grflow bench kafka` end to end at smoke scale: the job is warmed up on
/// every partition before load is offered, every request of the trace is
/// answered through the broker, and the JSON carries both paths' figures.
#[test]
fn bench_kafka_smoke_warms_up_then_answers_every_request() {
    let Some(brokers) = broker("bench_kafka_smoke_warms_up_then_answers_every_request") else {
        return;
    };
    let out = bench_kafka(&brokers, &["--requests", "300", "--rps", "200"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("waiting for the job to answer on every partition"),
        "{stderr}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "kafka_rps",
        "parquet_rps",
        "throughput_ratio",
        "kafka_p99_ms",
        "parquet_p99_ms",
        "gemm_gflops",
    ] {
        assert!(v[key].as_f64().is_some_and(|x| x > 0.0), "{key}: {v}");
    }
    assert!(v["machine"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert_eq!(v["requests"].as_u64(), Some(300), "{v}");
}

/// `grflow bench kafka --runs 2`: two pairs one after the other, each with
/// its own figures, and the medians of their ratios.
#[test]
fn bench_kafka_runs_pairs_and_reports_their_medians() {
    let Some(brokers) = broker("bench_kafka_runs_pairs_and_reports_their_medians") else {
        return;
    };
    let out = bench_kafka(
        &brokers,
        &["--requests", "100", "--rps", "200", "--runs", "2"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("run 2 of 2"), "{stderr}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "{v}");
    let ratios: Vec<f64> = runs
        .iter()
        .map(|r| r["p99_ratio"].as_f64().unwrap())
        .collect();
    assert!(ratios.iter().all(|r| *r > 0.0), "{v}");
    let median = v["median_p99_ratio"].as_f64().unwrap();
    assert!((median - (ratios[0] + ratios[1]) / 2.0).abs() < 1e-9, "{v}");
    assert!(v["median_throughput_ratio"].as_f64().unwrap() > 0.0, "{v}");
}

/// `grflow serve` with a `grflow train` model (`model.weights`): requests
/// from the model's own trace, produced to the broker, are answered with the
/// trained model_version and ranked items from their candidates.
#[test]
fn serve_with_a_trained_model_answers_with_its_model_version() {
    let Some(brokers) = broker("serve_with_a_trained_model_answers_with_its_model_version") else {
        return;
    };
    let dir = tmp_dir("kafka-serve-model");
    let trace = seq_trace::import_walks(&dir, "walks", 40, 60, 2);
    let model = dir.join("model");
    seq_trace::train_one_epoch(&trace, &model);
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("model.json")).unwrap()).unwrap();
    let version = json["model_version"].as_str().unwrap().to_string();

    let topics = Topics::fresh("serve-model");
    topics.create(&brokers, PARTITIONS);
    let extra = format!(
        "catalog = {:?}\n\n[model]\nweights = {:?}\n",
        trace.display().to_string(),
        model.display().to_string()
    );
    let config = write_config(&dir, &topics, &extra);
    let serve = Serve::start(&brokers, &config, "model");

    let mut requests: Vec<_> = seq_trace::trace_requests(&trace).into_values().collect();
    requests.sort_by_key(|r| r.req_id);
    requests.truncate(40);
    let records: Vec<(i32, Option<Vec<u8>>)> = requests
        .iter()
        .map(|r| {
            let body = json!({
                "req_id": r.req_id, "user_id": r.user_id, "ts_ms": r.ts_ms,
                "candidates": r.candidates, "hist_len": r.hist_len, "mode": "rank",
            });
            (
                (r.req_id % PARTITIONS as u64) as i32,
                Some(body.to_string().into_bytes()),
            )
        })
        .collect();
    produce(&brokers, &topics.requests, &records);
    let mut tail = Tail::new(&brokers, &topics.responses, PARTITIONS);
    let n = records.len();
    assert!(
        tail.read_until(Duration::from_secs(90), |t| t.req_ids.len() >= n),
        "{} of {n} answered; stderr:\n{}",
        tail.req_ids.len(),
        serve.stderr_text()
    );
    let summary = serve.stop();
    for read in &tail.records {
        let v: serde_json::Value = serde_json::from_slice(&read.payload).unwrap();
        assert_eq!(v["model_version"], version.as_str(), "{v}");
        let req = requests
            .iter()
            .find(|r| Some(r.req_id) == v["req_id"].as_u64())
            .unwrap();
        let items = v["items"].as_array().unwrap();
        assert!(!items.is_empty(), "{v}");
        assert!(
            items
                .iter()
                .all(|i| req.candidates.contains(&(i.as_u64().unwrap() as u32))),
            "{v}"
        );
    }
    assert_eq!(summary["model_version"], version.as_str(), "{summary}");
    // Rankings only: the per-kind summary counts them all as rank, each
    // against the rank SLO.
    let by_mode = &summary["by_mode"];
    assert_eq!(
        by_mode["rank"]["responses"].as_u64(),
        Some(n as u64),
        "{summary}"
    );
    assert_eq!(
        by_mode["retrieve"]["responses"].as_u64(),
        Some(0),
        "{summary}"
    );
    assert_eq!(by_mode["rank"]["slo_ms"].as_f64(), Some(30.0), "{summary}");
    assert!(
        by_mode["rank"]["latency_ms"]["p99"].as_f64().unwrap() > 0.0,
        "{summary}"
    );
    std::fs::remove_dir_all(&dir).ok();
}

/// Requests in zstd- and lz4-compressed record batches are read, and with
/// `kafka.compression = "zstd"` the job's producer is configured to write
/// zstd (a consumer decompresses whatever it reads, so the answers read
/// back here cannot tell; the producer's properties can).
#[test]
fn kafka_compressed_topics_are_read_and_written() {
    let Some(brokers) = broker("kafka_compressed_topics_are_read_and_written") else {
        return;
    };
    const N: u64 = 400;
    let topics = Topics::fresh("compressed");
    topics.create(&brokers, 2);
    for (codec, range) in [("zstd", 0..N / 2), ("lz4", N / 2..N)] {
        let records: Vec<_> = range.map(|i| ((i % 2) as i32, Some(request(i)))).collect();
        common::kafka::produce_compressed(&brokers, &topics.requests, &records, codec);
    }
    let dir = tmp_dir("compressed");
    let config = write_config(&dir, &topics, "compression = \"zstd\"");
    let settings = grflow_pipeline::kafka_settings(
        &Config::load(&config).expect("the test's config"),
        "compressed".into(),
    );
    let producer = grflow_connectors::kafka::OutputProducer::client_config(&settings);
    assert_eq!(producer.get("compression.type"), Some("zstd"));
    let mut tail = Tail::new(&brokers, &topics.responses, 2);
    let serve = Serve::start(&brokers, &config, "compressed");
    let all = tail.read_until(Duration::from_secs(120), |t| t.req_ids.len() as u64 >= N);
    assert!(
        all,
        "{} of {N} answered; stderr:\n{}",
        tail.req_ids.len(),
        serve.stderr_text()
    );
    let summary = serve.stop();
    assert_eq!(summary["requests_in"], N, "{summary}");
    assert_eq!(summary["dead_lettered"], 0, "{summary}");
    // The names replay's summary uses.
    assert_eq!(summary["responses_out"], N, "{summary}");
    assert_eq!(summary["errors"], 0, "{summary}");
    assert!(
        summary["throughput_rps"].as_f64().unwrap() > 0.0,
        "{summary}"
    );
    assert!(
        summary["latency_ms"]["p99"].as_f64().unwrap() > 0.0,
        "{summary}"
    );
    let by_req = answers_by_req(&tail.records);
    assert!(
        by_req.values().all(|a| a[0].2.is_null()),
        "rankings, not errors"
    );
}

/// Partitions added to the request topic while `grflow serve` runs are
/// read from their beginning by the worker that owns them: every request
/// produced to them is answered (before, the partition count was read once
/// at start and their requests waited forever). Needs a broker that can add
/// partitions (Apache Kafka); tansu 0.6 cannot, so CI runs the mock-cluster
/// test `connectors/tests/kafka_mock_partitions.rs` instead.
#[test]
fn partitions_created_while_serving_are_read() {
    let Some(brokers) = broker("partitions_created_while_serving_are_read") else {
        return;
    };
    const N: u64 = 100;
    let topics = Topics::fresh("grow");
    topics.create(&brokers, 1);
    let records: Vec<_> = (0..N).map(|i| (0, Some(request(i)))).collect();
    produce(&brokers, &topics.requests, &records);
    let dir = tmp_dir("grow");
    let config = write_config(&dir, &topics, "");
    let mut tail = Tail::new(&brokers, &topics.responses, 1);
    let serve = Serve::start(&brokers, &config, "grow");
    let first = tail.read_until(Duration::from_secs(60), |t| t.req_ids.len() as u64 >= N);
    assert!(
        first,
        "{} of {N}; stderr:\n{}",
        tail.req_ids.len(),
        serve.stderr_text()
    );
    // tansu cannot add partitions: the skip of the rest says so (visibly).
    if !common::kafka::grow_partitions(
        "partitions_created_while_serving_are_read",
        &brokers,
        &topics.requests,
        4,
    ) {
        serve.stop();
        return;
    }
    // Both workers own some of partitions 1..=3 (fnv1a64(topic) + p mod 2).
    let records: Vec<_> = (N..4 * N)
        .map(|i| ((1 + i % 3) as i32, Some(request(i))))
        .collect();
    produce(&brokers, &topics.requests, &records);
    let all = tail.read_until(Duration::from_secs(60), |t| t.req_ids.len() as u64 >= 4 * N);
    assert!(
        all,
        "{} of {} answered after the topic grew; stderr:\n{}",
        tail.req_ids.len(),
        4 * N,
        serve.stderr_text()
    );
    let summary = serve.stop();
    assert_eq!(summary["requests_in"], 4 * N, "{summary}");
    assert_eq!(summary["responses_out"], 4 * N, "{summary}");
}

/// `grflow serve` with the allocator on (the PID baseline) and requests
/// arriving live, 250 ms of event time every 250 ms: windows close while the
/// job serves, each node's allocator moves α, and later windows are served
/// at the moved α. Every request is answered, each closed window goes to
/// `windows.out` with the α its requests were served at, and the summary
/// says what the allocator did and where each node's α ended.
#[test]
fn serve_moves_alpha_window_by_window_and_reports_it() {
    let Some(brokers) = broker("serve_moves_alpha_window_by_window_and_reports_it") else {
        return;
    };
    // 2 ms of event time per request: 16 windows of 250 ms, ~60 requests
    // per node and window (pid leaves windows under 20 requests alone).
    const N: u64 = 2_000;
    const CHUNK: u64 = 125;
    let topics = Topics::fresh("serve-alloc");
    topics.create(&brokers, PARTITIONS);

    let dir = tmp_dir("kafka-serve-alloc");
    let windows = dir.join("windows.jsonl");
    let config = write_config(
        &dir,
        &topics,
        &format!(
            "\n[allocator]\npolicy = \"pid\"\n\n[windows]\nepoch_ms = 250\nout = {:?}",
            windows.to_str().unwrap()
        ),
    );
    let mut tail = Tail::new(&brokers, &topics.responses, PARTITIONS);
    tail.read_until(Duration::from_millis(1_000), |_| false);
    let job = Serve::start(&brokers, &config, "alloc");
    let chunk = |c: u64| -> Vec<_> {
        (c * CHUNK..(c + 1) * CHUNK)
            .map(|i| ((i % PARTITIONS as u64) as i32, Some(request(i))))
            .collect()
    };
    // The first chunk answered: the job is up, so the rest arrives live
    // (a backlog read at once is served before any window closes).
    produce(&brokers, &topics.requests, &chunk(0));
    assert!(
        tail.read_until(Duration::from_secs(120), |t| t.req_ids.len() as u64
            >= CHUNK),
        "the first {CHUNK} requests were not answered; stderr:\n{}",
        job.stderr_text()
    );
    for c in 1..N / CHUNK {
        produce(&brokers, &topics.requests, &chunk(c));
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(
        tail.read_until(Duration::from_secs(120), |t| t.req_ids.len() as u64 >= N),
        "{} of {N} answered; stderr:\n{}",
        tail.req_ids.len(),
        job.stderr_text()
    );
    let summary = job.stop();
    assert_eq!(summary["responses_out"], N, "{summary}");

    let allocator = &summary["allocator"];
    assert_eq!(allocator["policy"], "pid", "{summary}");
    let decided = allocator["windows"].as_u64().unwrap();
    let moves = allocator["alpha_moves"].as_u64().unwrap();
    assert!(decided >= 8, "{decided} windows decided: {summary}");
    assert!((1..=decided).contains(&moves), "{moves} moves: {summary}");
    assert!(allocator["decision_us_mean"].as_f64().unwrap() > 0.0);

    // Each window as the node served it: α starts at memory.alpha (0.25),
    // stays within pid's bounds [0.1, 0.9], and moves during the run.
    let text = std::fs::read_to_string(&windows).unwrap();
    let rows: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len() as u64, decided, "one line per window decided");
    let mut by_node: BTreeMap<u64, Vec<(u64, f64)>> = BTreeMap::new();
    for r in &rows {
        assert_eq!(r["kind"], "window");
        by_node
            .entry(r["node"].as_u64().unwrap())
            .or_default()
            .push((
                r["window_start_ms"].as_u64().unwrap(),
                r["alpha"].as_f64().unwrap(),
            ));
    }
    let mut served_moved = 0;
    for (node, mut seen) in by_node {
        seen.sort_by_key(|&(start, _)| start);
        assert!((seen[0].1 - 0.25).abs() < 1e-9, "node {node}: {seen:?}");
        for &(_, alpha) in &seen {
            assert!(
                (0.1 - 1e-3..=0.9 + 1e-3).contains(&alpha),
                "node {node}: {seen:?}"
            );
        }
        if seen.iter().any(|&(_, alpha)| (alpha - 0.25).abs() > 0.01) {
            served_moved += 1;
        }
        let at_exit = summary["alpha_at_exit"][node.to_string()].as_f64().unwrap();
        assert!(
            (0.1 - 1e-3..=0.9 + 1e-3).contains(&at_exit),
            "node {node}: {at_exit}"
        );
        // What the moves cost (rows evicted before a grown EMB share are
        // refilled; with room to spare there may be none).
        let refill = &summary["refill"][node.to_string()];
        let (bytes, max) = (
            refill["refill_bytes"].as_u64().unwrap(),
            refill["refill_bytes_max_per_move"].as_u64().unwrap(),
        );
        assert!(max <= bytes, "node {node}: {refill}");
        if (at_exit - 0.25).abs() > 0.01 {
            assert!(refill["alpha_moves"].as_u64().unwrap() >= 1, "{refill}");
        }
    }
    assert!(
        served_moved >= 1,
        "no window was served at a moved alpha: {rows:?}\n{summary}"
    );
}

/// `grflow COMMAND --config CONFIG ARGS` against `brokers`.
fn grflow(command: &[&str], config: &Path, brokers: &str, args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_grflow"))
        .args(command)
        .arg("--config")
        .arg(config)
        .args(args)
        .env("GRFLOW_KAFKA_BROKERS", brokers)
        .output()
        .unwrap()
}

/// `grflow send --config CONFIG ARGS` against `brokers`.
fn grflow_send(config: &Path, brokers: &str, args: &[&str]) -> std::process::Output {
    grflow(&["send"], config, brokers, args)
}

/// `kafka.max_age_ms`: requests stamped long ago (the generated trace's
/// event times, from 1970, sent with `--trace-ts`) are answered `stale`
/// without being served, naming their age; the same requests stamped now
/// are served.
#[test]
fn requests_older_than_max_age_are_answered_stale_and_fresh_ones_served() {
    let Some(brokers) =
        broker("requests_older_than_max_age_are_answered_stale_and_fresh_ones_served")
    else {
        return;
    };
    let dir = tmp_dir("max-age");
    let topics = Topics::fresh("max-age");
    let config = write_config(&dir, &topics, "max_age_ms = 60000");
    topics.create(&brokers, PARTITIONS);
    let job = Serve::start(&brokers, &config, "max-age");
    let send = |args: &[&str]| {
        let all = [
            &["--speed", "max", "--answers", "--json", "--wait-s", "120"],
            args,
        ]
        .concat();
        let out = grflow_send(&config, &brokers, &all);
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
        report["answers"].clone()
    };
    // Fresh first: records in the log before the job's first fetch count
    // as recovered (served however old, see connectors/README.md), so the
    // old ones go once the job has read.
    let fresh = send(&["--req-id-offset", "1000"]);
    assert_eq!(fresh["served"], 100, "{fresh}");
    let old = send(&["--trace-ts"]);
    assert_eq!(old["answered"], 100, "{old}");
    assert_eq!(old["errors"]["stale"], 100, "{old}");
    let summary = job.stop();
    assert_eq!(summary["requests_in"], 200, "{summary}");
    assert_eq!(summary["stale"], 100, "{summary}");
    assert_eq!(summary["shed"], 0, "{summary}");
    assert_eq!(summary["errors"], 100, "{summary}");
    // The stale answers say why.
    let mut tail = Tail::new(&brokers, &topics.responses, PARTITIONS);
    assert!(tail.read_until(Duration::from_secs(30), |t| t.req_ids.len() >= 200));
    let reasons: Vec<String> = tail
        .records
        .iter()
        .filter_map(|r| {
            let v: serde_json::Value = serde_json::from_slice(&r.payload).ok()?;
            Some(v["error"]["reason"].as_str()?.to_string())
        })
        .collect();
    assert_eq!(reasons.len(), 100, "{reasons:?}");
    assert!(
        reasons
            .iter()
            .all(|r| r.contains("ms ago (its ts_ms), past kafka.max_age_ms = 60000")),
        "{reasons:?}"
    );
}

/// `grflow send` with the job's config: its requests are the config's
/// generated trace (the job's catalog), every one is answered, and the
/// answers are read back and matched.
#[test]
fn grflow_send_feeds_a_serve_job_and_reads_every_answer_back() {
    let Some(brokers) = broker("grflow_send_feeds_a_serve_job_and_reads_every_answer_back") else {
        return;
    };
    let dir = tmp_dir("grflow-send");
    let topics = Topics::fresh("send");
    let config = write_config(&dir, &topics, "");
    let send = |args: &[&str]| grflow_send(&config, &brokers, args);
    // No topics yet: refused before anything is sent, naming the key.
    let refused = send(&["--speed", "max"]);
    let err = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{err}");
    assert!(
        err.contains("kafka.request_topic") && err.contains(&topics.requests),
        "{err}"
    );

    topics.create(&brokers, PARTITIONS);
    let job = Serve::start(&brokers, &config, "send");
    let run = send(&["--speed", "max", "--answers", "--json", "--wait-s", "120"]);
    let report: serde_json::Value = serde_json::from_slice(&run.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}\n{}",
            String::from_utf8_lossy(&run.stdout),
            String::from_utf8_lossy(&run.stderr)
        )
    });
    assert!(run.status.success(), "{report}");
    // The config's [trace] has 100 requests.
    assert_eq!(report["sent"], 100, "{report}");
    let answers = &report["answers"];
    assert_eq!(answers["answered"], 100, "{report}");
    assert_eq!(answers["unanswered"], 0, "{report}");
    assert_eq!(
        answers["served"], 100,
        "no request refused or shed: {report}"
    );
    assert!(answers["latency_ms"]["p99"].as_f64().unwrap() > 0.0);
    // Again, paced, with the ids moved past the first run's.
    let again = send(&[
        "--speed",
        "50x",
        "--requests",
        "30",
        "--req-id-offset",
        "1000",
        "--answers",
        "--json",
    ]);
    assert!(
        again.status.success(),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    let again: serde_json::Value = serde_json::from_slice(&again.stdout).unwrap();
    assert_eq!(again["answers"]["answered"], 30, "{again}");
    // Looped: 250 requests are two and a half passes over the trace, each
    // pass with its ids moved past the one before (no repeats below).
    let looped = send(&[
        "--loop",
        "--speed",
        "max",
        "--requests",
        "250",
        "--req-id-offset",
        "2000",
        "--answers",
        "--json",
    ]);
    let looped: serde_json::Value = serde_json::from_slice(&looped.stdout).unwrap();
    assert_eq!(looped["sent"], 250, "{looped}");
    assert_eq!(looped["passes"], 3, "{looped}");
    assert_eq!(looped["answers"]["answered"], 250, "{looped}");
    // For a second at 100 req/s: at most the 100 due within it.
    let timed = send(&[
        "--loop",
        "--rps",
        "100",
        "--duration-s",
        "1",
        "--req-id-offset",
        "10000",
        "--json",
    ]);
    let timed: serde_json::Value = serde_json::from_slice(&timed.stdout).unwrap();
    let timed_n = timed["sent"].as_u64().unwrap();
    assert!((1..=100).contains(&timed_n), "{timed}");
    let summary = job.stop();
    assert_eq!(summary["requests_in"], 130 + 250 + timed_n, "{summary}");
    assert_eq!(summary["dead_lettered"], 0, "{summary}");
    assert_eq!(summary["repeated_req_ids"], 0, "{summary}");
}

/// `serve --check` reports the topics and where each partition would
/// resume, and takes nothing from the job: a job started after it reads
/// every request from the start, and a check after that job sees its
/// commits and answers. A missing dead-letter topic fails the check with
/// the job's own message.
#[test]
fn serve_check_reports_where_a_start_would_resume_and_consumes_nothing() {
    let Some(brokers) =
        broker("serve_check_reports_where_a_start_would_resume_and_consumes_nothing")
    else {
        return;
    };
    const N: u64 = 40;
    let dir = tmp_dir("serve-check");
    let topics = Topics::fresh("check");
    let config = write_config(&dir, &topics, "");
    topics.create(&brokers, PARTITIONS);
    let records: Vec<_> = (0..N)
        .map(|i| ((i % PARTITIONS as u64) as i32, Some(request(i))))
        .collect();
    produce(&brokers, &topics.requests, &records);
    let check = |config: &Path| {
        let out = grflow(&["serve", "--check"], config, &brokers, &[]);
        let stderr = String::from_utf8_lossy(&out.stderr).to_string();
        let report: Option<serde_json::Value> = serde_json::from_slice(&out.stdout).ok();
        (out.status.code(), report, stderr)
    };
    let resumed = |report: &serde_json::Value, from_commit: bool| {
        let rows = report["resume"].as_array().expect("resume");
        assert_eq!(rows.len(), PARTITIONS as usize, "{report}");
        assert!(
            rows.iter().all(|r| r["from_commit"] == from_commit),
            "{report}"
        );
        rows.iter()
            .map(|r| r["offset"].as_i64().unwrap())
            .sum::<i64>()
    };

    let (code, report, stderr) = check(&config);
    let report = report.unwrap_or_else(|| panic!("no report (exit {code:?}): {stderr}"));
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(report["ok"], true);
    assert_eq!(
        report["request_topic"]["partitions"], PARTITIONS,
        "{report}"
    );
    assert_eq!(report["dead_letter_topic"]["partitions"], 1, "{report}");
    assert_eq!(resumed(&report, false), 0);
    assert_eq!(report["already_answered"], 0, "{report}");

    // Nothing was taken: the job reads and answers every request.
    let serve = Serve::start(&brokers, &config, "serve-check");
    let mut responses = Tail::new(&brokers, &topics.responses, PARTITIONS);
    assert!(
        responses.read_until(Duration::from_secs(120), |t| t.req_ids.len() as u64 >= N),
        "{} of {N} answered; stderr:\n{}",
        responses.req_ids.len(),
        serve.stderr_text()
    );
    let summary = serve.stop();
    assert_eq!(summary["requests_in"], N, "{summary}");
    assert_eq!(committed_total(&summary), N as i64, "{summary}");

    let (code, report, stderr) = check(&config);
    let report = report.unwrap_or_else(|| panic!("no report (exit {code:?}): {stderr}"));
    assert_eq!(resumed(&report, true), N as i64, "{report}");
    assert_eq!(report["already_answered"], N, "{report}");

    // A dead-letter topic that a start would not create.
    let missing = Topics {
        dead_letters: format!("{}.missing", topics.dead_letters),
        ..Topics::named(&topics.requests.replace(".requests", ""))
    };
    let bad = write_config_as(&dir, "bad.toml", &missing, 0, "");
    let (code, report, stderr) = check(&bad);
    assert_ne!(code, Some(0), "{report:?}");
    assert!(report.is_none(), "{report:?}");
    assert!(
        stderr.contains("kafka.dead_letter_topic") && stderr.contains(&missing.dead_letters),
        "{stderr}"
    );
}
