//! `grflow bench allocator` smoke run: one regime, the static sweep, every
//! policy, on the virtual clock with a calibration made by `grflow calibrate`.

use serde_json::Value;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/temp.rs"]
mod temp;
use cli::{grflow, ok};
use temp::tmp_dir;

#[test]
fn bench_allocator_sweeps_static_alpha_and_reports_every_policy() {
    let dir = tmp_dir("bench-allocator");
    let calibration = dir.join("small.json");
    ok(grflow()
        .args([
            "calibrate",
            "--preset",
            "small",
            "--reps",
            "1",
            "--no-overhead",
            "--out",
        ])
        .arg(&calibration)
        .output()
        .unwrap());
    let config = dir.join("small-trace.toml");
    std::fs::write(
        &config,
        "[trace]\nrequests = 600\nrps = 100.0\ncandidates = 16\n[windows]\nepoch_ms = 1000\n",
    )
    .unwrap();
    let out = ok(grflow()
        .args([
            "bench",
            "allocator",
            "--regime",
            "burst",
            "--sweep",
            "--json",
        ])
        .arg("--config")
        .arg(&config)
        .arg("--calibration")
        .arg(&calibration)
        .output()
        .unwrap());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["clock"], "virtual");
    assert_eq!(report["sweep"].as_array().unwrap().len(), 11);
    let rows = report["rows"].as_array().unwrap();
    let policies: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(policies, ["kv-emb-opt", "static", "kv-opt", "pid"]);
    assert_eq!(rows[0]["p99_reduction_vs_kv_emb_opt"].as_f64(), Some(0.0));
    assert!(rows.iter().all(|r| r["p99_ms"].as_f64().unwrap() > 0.0));
    let pid = &rows[3];
    assert!(pid["alpha_moves"].as_u64().unwrap() > 0, "{pid}");
    assert!(pid["decision_us_p99"].as_f64().unwrap() > 0.0);
    assert!(report["sweep_alpha_star_std"]["burst"].as_f64().is_some());
    // A bad regime is refused by name.
    let bad = grflow()
        .args(["bench", "allocator", "--regime", "stormy"])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("stormy"));
}
