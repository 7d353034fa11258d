//! `grflow bench cache` through the real binary on a small `seq` trace.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

#[path = "common/temp.rs"]
mod temp;
use temp::tmp_dir;

/// The trace in a directory of its own (`name`): tests run in parallel.
fn seq_trace(name: &str) -> PathBuf {
    let dir = tmp_dir(name);
    // 2,000 requests over 200 items, skewed so that caches of 10–40 keys
    // hit sometimes and miss often.
    let mut x: u64 = 12345;
    let mut text = String::new();
    for user in 0..2000 {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let item = ((x >> 33) % 200) * ((x >> 20) % 200) / 200;
        text.push_str(&format!("u{} i{item}\n", user % 50));
    }
    let path = dir.join("trace.seq");
    std::fs::write(&path, text).unwrap();
    path
}

fn bench(trace: &PathBuf, repeat: &str) -> Vec<(String, u64, u64)> {
    let out = Command::new(env!("CARGO_BIN_EXE_grflow"))
        .args(["bench", "cache", "--trace"])
        .arg(trace)
        .args(["--format", "seq", "--policies", "lru,opt", "--json"])
        .args(["--repeat", repeat])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).unwrap();
    rows.iter()
        .map(|r| {
            assert!(r["ns_per_access"].as_f64().unwrap() > 0.0);
            // Costs come with the machine that measured them.
            assert!(r["gemm_gflops"].as_f64().unwrap() > 0.0, "{r}");
            assert!(!r["machine"].as_str().unwrap().is_empty(), "{r}");
            (
                r["policy"].as_str().unwrap().to_string(),
                r["capacity"].as_u64().unwrap(),
                r["hits"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn repeated_replays_report_the_same_rows_and_counts() {
    let trace = seq_trace("bench-cache-repeat");
    let once = bench(&trace, "1");
    assert_eq!(once.len(), 6, "2 policies x 3 ratios: {once:?}");
    assert!(once.iter().any(|&(_, _, hits)| hits > 0));
    assert_eq!(bench(&trace, "3"), once);
}

#[test]
fn zero_repeats_is_a_clear_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_grflow"))
        .args([
            "bench", "cache", "--trace", "x", "--format", "seq", "--repeat", "0",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--repeat"), "names the flag: {err}");
}

/// A capacity ratio that holds no key of the trace (every policy would
/// score 0 hits) is refused naming the flag and the least ratio that works.
#[test]
fn a_capacity_of_no_key_is_refused() {
    let trace = seq_trace("bench-cache-capacity");
    let out = Command::new(env!("CARGO_BIN_EXE_grflow"))
        .args(["bench", "cache", "--trace"])
        .arg(&trace)
        .args([
            "--format",
            "seq",
            "--policies",
            "lru",
            "--capacity-ratio",
            "0.001",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--capacity-ratio 0.001: holds no key"),
        "{err}"
    );
}
