//! `grflow bench serve` through the real binary at smoke scale (small
//! model, 150 requests per load point): both modes are bisected, the JSON
//! carries every figure, and `--out` writes the report and the plot.

use serde_json::Value;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/temp.rs"]
mod temp;
use cli::{grflow, ok};

#[test]
fn bench_serve_smoke_reports_goodput_of_both_modes_and_writes_the_plot() {
    let dir = temp::tmp_dir("bench-serve");
    let out = ok(grflow()
        .args(["bench", "serve", "--json", "--preset", "small"])
        .args(["--requests", "150", "--precision", "0.5", "--pool-mib", "8"])
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    for key in [
        "slo_ms",
        "single_request_p50_ms",
        "capacity_rps_unbatched",
        "capacity_rps_batched",
        "goodput_ratio_ceiling",
        "goodput_rps_unbatched",
        "goodput_rps_batched",
        "goodput_ratio",
        "gemm_gflops",
        "served_gflops",
        "efficiency",
        "capacity_rps_one_worker_one_lane",
        "capacity_rps_one_worker_lanes",
        "lanes_capacity_ratio",
    ] {
        assert!(v[key].as_f64().is_some(), "{key} missing: {v}");
    }
    assert_eq!(v["slo_ms"].as_f64(), Some(30.0), "small's default SLO");
    assert!(v["capacity_rps_unbatched"].as_f64().unwrap() > 0.0);
    let ceiling =
        v["capacity_rps_batched"].as_f64().unwrap() / v["goodput_rps_unbatched"].as_f64().unwrap();
    assert!((v["goodput_ratio_ceiling"].as_f64().unwrap() - ceiling).abs() < 1e-9);
    // The nodes' GEMMs were timed in place, and took part of their time.
    for mode in ["unbatched", "batched"] {
        let rate = v[format!("gemm_gflops_in_place_{mode}")].as_f64().unwrap();
        let share = v[format!("gemm_time_share_{mode}")].as_f64().unwrap();
        assert!(rate > 0.0 && share > 0.0 && share < 1.0, "{mode}: {v}");
    }
    assert!(v["gemm_gflops_in_place_at_goodput"].as_f64().unwrap() > 0.0);
    // Batching serves the same FLOPs in fewer, larger products.
    let size = |mode: &str| v[format!("gemm_mflop_per_call_{mode}")].as_f64().unwrap();
    assert!(size("unbatched") > 0.0, "{v}");
    assert!(size("batched") > size("unbatched"), "{v}");
    assert_eq!(v["lanes"].as_u64(), Some(2));
    assert!(v["capacity_rps_one_worker_lanes"].as_f64().unwrap() > 0.0);
    let points = v["points"].as_array().unwrap();
    for mode in ["unbatched", "batched"] {
        assert!(
            points.iter().filter(|p| p["mode"] == mode).count() >= 2,
            "{mode} was bisected: {points:?}"
        );
    }
    // The two searches take turns from the same rate, so that a drift of
    // the machine's speed reaches both modes alike.
    assert_eq!(points[0]["mode"], "unbatched");
    assert_eq!(points[1]["mode"], "batched");
    assert_eq!(points[0]["offered_rps"], points[1]["offered_rps"]);
    // Every batched point answered every request.
    assert!(points.iter().all(|p| p["errors"].as_u64() == Some(0)));
    // Each kind's p99 is there, and the overall p99 is at least the lower
    // of the two: were it under both, each kind would have its top 1% (by
    // the same ceil rank) above it, more than the overall top 1% holds.
    // (It can exceed both: at 150 requests the overall p99 is the second
    // largest latency, which may be a kind's largest, above that kind's p99.)
    for p in points {
        let (all, rank, retrieve) = (
            p["p99_ms"].as_f64().unwrap(),
            p["rank_p99_ms"].as_f64().unwrap(),
            p["retrieve_p99_ms"].as_f64().unwrap(),
        );
        assert!(rank > 0.0 && retrieve > 0.0, "{p}");
        assert!(all >= rank.min(retrieve), "{p}");
    }
    let svg = std::fs::read_to_string(dir.join("latency.svg")).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("batched") && svg.contains("polyline"));
    let saved: Value =
        serde_json::from_slice(&std::fs::read(dir.join("bench.json")).unwrap()).unwrap();
    assert_eq!(saved["goodput_rps_batched"], v["goodput_rps_batched"]);
}

#[test]
fn bench_serve_rejects_an_unknown_preset_by_name() {
    let out = grflow()
        .args(["bench", "serve", "--preset", "huge"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--preset") && err.contains("huge"), "{err}");
}

#[test]
fn bench_serve_at_serves_both_modes_at_the_given_rates_only() {
    let dir = temp::tmp_dir("bench-serve-at");
    let out = ok(grflow()
        .args(["bench", "serve", "--json", "--preset", "small"])
        .args(["--requests", "120", "--pool-mib", "8"])
        .args(["--at", "40,80", "--max-wait-ms", "2"])
        .arg("--out")
        .arg(&dir)
        .output()
        .unwrap());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["max_wait_ms"].as_f64(), Some(2.0));
    assert!(v["capacity_rps_unbatched"].as_f64().unwrap() > 0.0);
    // No searches: no goodput, and exactly one point per rate and mode.
    assert!(v.get("goodput_ratio").is_none(), "{v}");
    let points = v["points"].as_array().unwrap();
    let got: Vec<(String, f64)> = points
        .iter()
        .map(|p| {
            (
                p["mode"].as_str().unwrap().to_string(),
                p["offered_rps"].as_f64().unwrap(),
            )
        })
        .collect();
    let want = [
        ("unbatched", 40.0),
        ("batched", 40.0),
        ("unbatched", 80.0),
        ("batched", 80.0),
    ];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for ((mode, rate), (m, r)) in got.iter().zip(want) {
        assert_eq!((mode.as_str(), *rate), (m, r));
    }
    for p in points {
        // Every request of a point was served by some model call.
        let hist = p["batch_size_hist"].as_array().unwrap();
        let calls: u64 = hist.iter().map(|c| c.as_u64().unwrap()).sum();
        assert!(calls > 0, "{p}");
        if p["mode"] == "unbatched" {
            assert!(
                hist[1..].iter().all(|c| c == 0),
                "one request per call: {p}"
            );
        }
    }
    let saved: Value =
        serde_json::from_slice(&std::fs::read(dir.join("probe.json")).unwrap()).unwrap();
    assert_eq!(saved["points"], v["points"]);
}

#[test]
fn bench_serve_rejects_a_rate_that_is_not_positive() {
    let out = grflow()
        .args(["bench", "serve", "--at", "10,0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--at") && err.contains('0'), "{err}");
}

/// Smoke-scale flags that keep a run to a few seconds.
const TINY: [&str; 8] = [
    "--preset",
    "small",
    "--requests",
    "20",
    "--lanes",
    "1",
    "--pool-mib",
    "8",
];

#[test]
fn bench_serve_reports_the_highest_passing_rate_as_a_lower_bound_when_no_rate_fails() {
    // An SLO no run misses: every rate the searches try meets it.
    let out = ok(grflow()
        .args(["bench", "serve", "--json"])
        .args(TINY)
        .args(["--slo-ms", "1000000"])
        .output()
        .unwrap());
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let points = v["points"].as_array().unwrap();
    assert!(points.iter().all(|p| p["meets_slo"] == true), "{v}");
    for mode in ["unbatched", "batched"] {
        let highest = points
            .iter()
            .filter(|p| p["mode"] == mode)
            .map(|p| p["offered_rps"].as_f64().unwrap())
            .fold(0.0, f64::max);
        let goodput = v[format!("goodput_rps_{mode}")].as_f64().unwrap();
        assert!(goodput > 0.0 && goodput == highest, "{mode}: {v}");
        assert_eq!(v[format!("goodput_unbounded_{mode}")], true, "{mode}: {v}");
    }
    let ceiling =
        v["capacity_rps_batched"].as_f64().unwrap() / v["goodput_rps_unbatched"].as_f64().unwrap();
    assert!(
        (v["goodput_ratio_ceiling"].as_f64().unwrap() - ceiling).abs() < 1e-9,
        "{v}"
    );
    // --lanes 1 skips the lanes comparison: no ratio to report, and the
    // capacities it did not measure are null, not 0 req/s.
    assert!(v["lanes_capacity_ratio"].is_null(), "{v}");
    assert!(v["capacity_rps_one_worker_one_lane"].is_null(), "{v}");
    assert!(v["capacity_rps_one_worker_lanes"].is_null(), "{v}");
}

#[test]
fn bench_serve_rejects_an_out_path_that_is_a_file_before_measuring() {
    let dir = temp::tmp_dir("bench-serve-out-file");
    let file = dir.join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let mut args = vec!["bench", "serve", "--json"];
    args.extend(TINY);
    let err = cli::refused_out(&args, &file);
    assert!(!err.contains("capacity"), "nothing was measured: {err}");
    // An uncreatable directory (under that file) is refused alike.
    cli::refused_out(&args, &file.join("sub"));
}

#[test]
fn bench_serve_rejects_an_slo_that_is_not_a_positive_number() {
    for bad in ["0", "-5", "nan", "inf"] {
        let out = grflow()
            .args(["bench", "serve", "--json"])
            .args(TINY)
            .arg(format!("--slo-ms={bad}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--slo-ms"), "{bad}: {err}");
    }
}

#[test]
fn bench_serve_rejects_a_pool_it_cannot_allocate_before_measuring() {
    // 1e12 MiB aborted the process on its first allocation.
    for bad in ["0", "-5", "nan", "1e12"] {
        let out = grflow()
            .args(["bench", "serve", "--json"])
            .args(TINY)
            .arg(format!("--pool-mib={bad}"))
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{bad}: {err}");
        assert!(err.contains("--pool-mib"), "{bad}: {err}");
    }
}
