//! Hot model swap under load against the real broker (GRFLOW_KAFKA_BROKERS;
//! skipped with a reason without it): `grflow serve --model-watch current`
//! answers a paced stream of requests with model A (the link's, from the
//! first request), moving the link switches it to model B mid-stream, a
//! model of another item space is refused by `POST /model` while A keeps
//! serving, `POST /model` rolls back to A, and every answer's scores are
//! what its `model_version` computes (checked against `grflow replay
//! --model` of each).

#[path = "common/cli.rs"]
mod cli;
mod common;
#[path = "common/seq_trace.rs"]
mod seq_trace;

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use cli::{grflow, ok};
use common::http::{free_addr, get, request, wait_listening};
use common::kafka::{Serve, Tail, Topics, broker, producer, write_config};
use common::temp::tmp_dir;
use grflow_connectors::kafka::WireResponse;
use rdkafka::producer::{BaseRecord, Producer};
use serde_json::{Value, json};

const PARTITIONS: i32 = 2;

/// `method path` with `body`, the answer's body parsed (Null if not JSON).
fn http(addr: &str, method: &str, path: &str, body: &str) -> (u16, Value) {
    let (status, body) = request(addr, method, path, body)
        .unwrap_or_else(|| panic!("{method} {path} to {addr} got no answer"));
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

fn version_of(model: &Path) -> String {
    let json: Value =
        serde_json::from_slice(&std::fs::read(model.join("model.json")).unwrap()).unwrap();
    json["model_version"].as_str().unwrap().to_string()
}

/// (items, scores) by req_id from `grflow replay --model` of the trace.
fn replayed(trace: &Path, model: &Path, out: &Path) -> HashMap<u64, (Vec<u32>, Vec<f32>)> {
    ok(grflow()
        .args([
            "replay",
            "--speed",
            "max",
            "--quiet",
            "--workers",
            "1",
            "--trace",
        ])
        .arg(trace)
        .arg("--model")
        .arg(model)
        .arg("--out")
        .arg(out)
        .output()
        .unwrap());
    seq_trace::responses(&out.join("responses.parquet"))
        .into_iter()
        .map(|r| (r.req_id, (r.items, r.scores)))
        .collect()
}

#[test]
fn kafka_hot_model_swap_under_load_answers_everything_with_the_version_that_computed_it() {
    let Some(brokers) = broker("kafka_hot_model_swap") else {
        return;
    };
    let dir = tmp_dir("model-swap");
    let trace = seq_trace::import_walks(&dir, "walks", 40, 60, 2);
    let (a, b) = (dir.join("model-a"), dir.join("model-b"));
    seq_trace::train_with_seed(&trace, &a, 5);
    seq_trace::train_with_seed(&trace, &b, 6);
    let (va, vb) = (version_of(&a), version_of(&b));
    assert_ne!(va, vb);
    // Another item space: refused.
    let other = seq_trace::import_walks(&dir, "other", 40, 90, 2);
    let c = dir.join("model-c");
    seq_trace::train_with_seed(&other, &c, 5);

    let expected = [
        (va.clone(), replayed(&trace, &a, &dir.join("replay-a"))),
        (vb.clone(), replayed(&trace, &b, &dir.join("replay-b"))),
    ];
    let mut originals: Vec<_> = seq_trace::trace_requests(&trace).into_values().collect();
    originals.sort_by_key(|r| r.req_id);
    originals.retain(|r| r.mode == grflow_traces::Mode::Rank);

    let topics = Topics::fresh("model-swap");
    topics.create(&brokers, PARTITIONS);
    // No model.weights: the watched link decides what serves from the start.
    let extra = format!("catalog = {:?}\n", trace.display().to_string());
    let config = write_config(&dir, &topics, &extra);
    let admin = free_addr();
    let mut tail = Tail::new(&brokers, &topics.responses, PARTITIONS);
    tail.read_until(Duration::from_millis(1_000), |_| false);
    let metrics = free_addr();
    // A watched link, pointing at A from the start: A serves the first
    // request (before, the seeded weights served until the link moved).
    let current = dir.join("current");
    std::os::unix::fs::symlink(&a, &current).unwrap();
    let serve = Serve::start_with(
        &brokers,
        &config,
        "swap",
        &[
            "--admin-addr",
            &admin,
            "--metrics-addr",
            &metrics,
            "--model-watch",
            current.to_str().unwrap(),
        ],
    );
    assert!(
        wait_listening(&admin, Duration::from_secs(60)),
        "{}",
        serve.stderr_text()
    );

    // 2,000 requests at 400/s; the swap is asked for after 800.
    const N: u64 = 2_000;
    let p = producer(&brokers);
    let started = Instant::now();
    let mut swapped_at = None;
    let mut original_of = BTreeMap::new();
    for i in 0..N {
        let r = &originals[i as usize % originals.len()];
        original_of.insert(i, r.req_id);
        let body = json!({
            "req_id": i, "user_id": r.user_id, "ts_ms": 1_700_000_000_000u64 + i,
            "candidates": r.candidates, "hist_len": r.hist_len, "mode": "rank",
        })
        .to_string();
        let partition = (i % PARTITIONS as u64) as i32;
        while let Err((e, _)) = p.send(
            BaseRecord::<(), _>::to(&topics.requests)
                .partition(partition)
                .payload(&body),
        ) {
            assert!(e.to_string().contains("Queue full"), "{e}");
            std::thread::sleep(Duration::from_millis(5));
        }
        if i == 800 {
            p.flush(Duration::from_secs(10)).unwrap();
            let (status, refused) = http(&admin, "POST", "/model", c.to_str().unwrap());
            assert_eq!(status, 409, "{refused}");
            assert!(
                refused["error"].as_str().unwrap().contains("item"),
                "names the item space: {refused}"
            );
            // The swap to B by the watched path: the link moves.
            let next = dir.join("current.next");
            std::os::unix::fs::symlink(&b, &next).unwrap();
            std::fs::rename(&next, &current).unwrap();
            // An operator pins α too (HLEM's runtime switch).
            let (status, pinned) = http(&admin, "POST", "/alpha", "0.3");
            assert_eq!(status, 202, "{pinned}");
            swapped_at = Some(i);
        }
        let due = started + Duration::from_micros(2_500 * (i + 1));
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
    p.flush(Duration::from_secs(30)).unwrap();
    assert!(swapped_at.is_some());
    assert!(
        tail.read_until(Duration::from_secs(120), |t| t.req_ids.len() as u64 >= N),
        "{} of {N} answered; stderr:\n{}",
        tail.req_ids.len(),
        serve.stderr_text()
    );
    let serving = |version: &str, r: &Value| {
        r["serving"]
            .as_object()
            .is_some_and(|s| !s.is_empty() && s.values().all(|v| v == version))
    };
    // The nodes take commands between batches: keep a few requests coming
    // until every node serves `version`.
    let mut extra = 0u64;
    let mut wait_serving = |version: &str, what: &str| {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (status, report) = http(&admin, "GET", "/model", "");
            assert_eq!(status, 200);
            if serving(version, &report) {
                break;
            }
            assert!(Instant::now() < deadline, "{what}: {report}");
            let r = &originals[0];
            let body = json!({
                "req_id": N + extra, "user_id": r.user_id, "ts_ms": 1_700_000_100_000u64 + extra,
                "candidates": r.candidates, "hist_len": r.hist_len, "mode": "rank",
            })
            .to_string();
            let _ = p.send(
                BaseRecord::<(), _>::to(&topics.requests)
                    .partition(0)
                    .payload(&body),
            );
            original_of.insert(N + extra, r.req_id);
            extra += 1;
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    wait_serving(&vb, "every node serves B after the link moved");
    // Rollback by the admin endpoint.
    let (status, asked) = http(&admin, "POST", "/model", a.to_str().unwrap());
    assert_eq!(status, 202, "{asked}");
    assert_eq!(asked["swapping_to"], va.as_str());
    wait_serving(&va, "no rollback");
    p.flush(Duration::from_secs(10)).unwrap();
    assert!(
        tail.read_until(Duration::from_secs(60), |t| t.req_ids.len() as u64
            >= N + extra),
        "extra requests answered"
    );
    let (_, scraped) = get(&metrics, "/metrics").expect("the job's metrics answer");
    let alphas: Vec<f64> = scraped
        .lines()
        .filter(|l| l.starts_with("grflow_alpha{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
        .collect();
    assert_eq!(alphas.len(), 2, "{scraped}");
    assert!(
        alphas.iter().all(|a| (a - 0.3).abs() < 0.02),
        "pinned: {alphas:?}"
    );
    let summary = serve.stop();
    assert_eq!(summary["requests_in"], N + extra, "{summary}");

    let mut by_req: BTreeMap<u64, Vec<WireResponse>> = BTreeMap::new();
    for r in &tail.records {
        let w: WireResponse = serde_json::from_slice(&r.payload).unwrap();
        by_req.entry(w.req_id).or_default().push(w);
    }
    assert_eq!(by_req.len() as u64, N + extra, "no request lost");
    let mut per_version: BTreeMap<String, u64> = BTreeMap::new();
    let mut first_b: BTreeMap<i32, i64> = BTreeMap::new();
    for (req, answers) in &by_req {
        let w = &answers[0];
        assert!(w.error.is_none(), "req {req}: {w:?}");
        *per_version.entry(w.model_version.clone()).or_default() += 1;
        let (_, want) = expected
            .iter()
            .find(|(v, _)| *v == w.model_version)
            .unwrap_or_else(|| panic!("req {req}: unknown version {}", w.model_version));
        let (items, scores) = &want[&original_of[req]];
        assert_eq!(&w.items, items, "req {req} under {}", w.model_version);
        for (got, want) in w.scores.iter().zip(scores) {
            assert!(
                (got - *want as f64).abs() <= 1e-3,
                "req {req}: {got} vs {want}"
            );
        }
        if w.model_version == vb {
            let e = first_b.entry(w.partition).or_insert(w.offset);
            *e = (*e).min(w.offset);
        }
    }
    assert!(
        per_version[&va] > 0 && per_version[&vb] > 0,
        "{per_version:?}"
    );
    // Latency around the swap: requests within 200 offsets of each
    // partition's first answer by B.
    let mut window: Vec<f64> = by_req
        .values()
        .map(|a| &a[0])
        .filter(|w| {
            first_b
                .get(&w.partition)
                .is_some_and(|&f| (w.offset - f).abs() <= 200)
        })
        .map(|w| w.latency_ms)
        .collect();
    window.sort_by(f64::total_cmp);
    let p99 = window[((window.len() - 1) as f64 * 0.99) as usize];
    let max = window.last().copied().unwrap_or(0.0);
    eprintln!(
        "answers by version {per_version:?}; swap window ({} answers): p99 {p99:.1} ms, max {max:.1} ms; job p99 {} ms",
        window.len(),
        summary["latency_ms"]["p99"]
    );
}
