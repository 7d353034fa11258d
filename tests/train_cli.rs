//! `grflow train` and `grflow eval` through the real binary: the model
//! directory, `--resume`, the JSON shape and a mismatched trace.

use serde_json::Value;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/seq_trace.rs"]
mod seq_trace;
#[path = "common/temp.rs"]
mod temp;
use cli::{grflow, ok};
use seq_trace::import_walks;
use temp::tmp_dir;

#[test]
fn train_writes_a_model_that_eval_scores_and_resume_continues() {
    let dir = tmp_dir("train-cli");
    let trace = import_walks(&dir, "walks", 120, 60, 1);
    let model = dir.join("model");
    let train = |extra: &[&str]| {
        ok(grflow()
            .args(["train", "--quiet", "--seed", "3", "--trace"])
            .arg(&trace)
            .arg("--out")
            .arg(&model)
            .args(extra)
            .output()
            .unwrap())
    };
    train(&["--max-epochs", "1"]);
    for f in [
        "model.safetensors",
        "items.parquet",
        "model.json",
        "checkpoint/state.json",
    ] {
        assert!(model.join(f).is_file(), "{f} missing");
    }
    let ckpt = model.join("checkpoint");
    train(&["--max-epochs", "2", "--resume", ckpt.to_str().unwrap()]);
    let json: Value =
        serde_json::from_slice(&std::fs::read(model.join("model.json")).unwrap()).unwrap();
    assert_eq!(json["epochs"], 2, "{json}");
    // The build's commit (build.rs), not the working directory's.
    assert_eq!(json["commit"], env!("GRFLOW_COMMIT"));
    assert_eq!(json["max_history"], 50);
    assert_eq!(json["vocabulary"]["items"], 60);
    let version = json["model_version"].as_str().unwrap().to_string();
    assert!(version.starts_with("gr-64d2l-"), "{version}");

    let out = ok(grflow()
        .args(["eval", "--json", "--model"])
        .arg(&model)
        .arg("--trace")
        .arg(&trace)
        .output()
        .unwrap());
    let r: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(r["model_version"], version.as_str());
    assert_eq!(r["arch"], "small");
    assert_eq!(r["users"], 120);
    for m in [&r["sampled_100"], &r["popularity"]["sampled_100"]] {
        for k in ["hr_at_10", "ndcg_at_10", "mrr_at_10"] {
            let v = m[k].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&v), "{k} = {v}");
        }
    }
    assert!(r["latency_ms"]["p99"].as_f64().unwrap() >= r["latency_ms"]["p50"].as_f64().unwrap());
    assert!(r["gemm_gflops"].as_f64().unwrap() > 0.0);
    assert!(r.get("full").is_none());

    // Another catalog is refused with exit code 2, naming what differs.
    let other = import_walks(&dir, "other", 40, 30, 1);
    let out = grflow()
        .args(["eval", "--model"])
        .arg(&model)
        .arg("--trace")
        .arg(&other)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("items"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
}
