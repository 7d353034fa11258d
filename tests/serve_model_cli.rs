//! Serving a `grflow train` model: `replay --model` returns the scores the
//! train crate's eval path computes for the same request (the softmax of
//! its logits), carries the
//! trained model_version, and refuses a model directory that does not fit
//! the trace (exit code 2, naming the file and what differs).

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/seq_trace.rs"]
mod seq_trace;
#[path = "common/temp.rs"]
mod temp;
use cli::{grflow, ok};
use seq_trace::{import_walks, responses, trace_requests as requests, train_one_epoch as train};
use temp::tmp_dir;

#[test]
fn replay_serves_the_scores_eval_computes_with_the_trained_model_version() {
    let dir = tmp_dir("serve-model");
    // Two tables: the untrained side table must add nothing when served.
    let trace = import_walks(&dir, "walks", 80, 50, 2);
    let model = dir.join("model");
    train(&trace, &model);
    let out = dir.join("out");
    let run = ok(grflow()
        .args([
            "replay",
            "--speed",
            "max",
            "--json",
            "--workers",
            "2",
            "--trace",
        ])
        .arg(&trace)
        .arg("--model")
        .arg(&model)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap());
    let summary: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(summary["errors"].as_u64(), Some(0), "{summary}");

    let m = grflow_train::artifact::load_model_dir(&model).unwrap();
    let mut served = grflow_train::eval::Served::new(&m.params, m.json.max_history).unwrap();
    let side = grflow_connectors::parquet::load_side_tables(&trace).unwrap();
    let users: HashMap<u64, Vec<u32>> = side
        .users
        .into_iter()
        .map(|u| (u.user_id, u.items))
        .collect();
    let reqs = requests(&trace);
    let rows = responses(&out.join("responses.parquet"));
    assert!(rows.len() >= 20, "only {} responses", rows.len());
    let mut compared = 0;
    for r in &rows {
        assert_eq!(r.model_version, m.json.model_version);
        let q = &reqs[&r.req_id];
        let history = &users[&q.user_id][..q.hist_len as usize];
        let want = grflow_kernels::rank_softmax(&served.rank(history, &q.candidates).unwrap());
        assert!(!r.items.is_empty());
        for (item, got) in r.items.iter().zip(&r.scores) {
            let at = q.candidates.iter().position(|c| c == item).unwrap();
            assert!(
                (want[at] - got).abs() <= 1e-4,
                "req {}: item {item} served {got}, eval {}",
                r.req_id,
                want[at]
            );
            compared += 1;
        }
        // The served top item is eval's best candidate.
        let best = want.iter().cloned().fold(f32::MIN, f32::max);
        assert!((r.scores[0] - best).abs() <= 1e-4, "req {}", r.req_id);
    }
    assert!(compared >= 100, "{compared} scores compared");
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn retrieve_requests_run_on_the_trained_transformer() {
    let dir = tmp_dir("serve-model-retrieve");
    let trace = dir.join("trace");
    ok(grflow()
        .args(["gen-trace", "--regime", "steady", "--users", "60"])
        .args(["--items", "300", "--requests", "120", "--rps", "100"])
        .args(["--seed", "3", "--retrieve-share", "0.5", "--out"])
        .arg(&trace)
        .output()
        .unwrap());
    let model = dir.join("model");
    train(&trace, &model);
    let run = ok(grflow()
        .args(["replay", "--speed", "max", "--json", "--trace"])
        .arg(&trace)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap());
    let summary: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert_eq!(summary["errors"].as_u64(), Some(0), "{summary}");
    assert_eq!(summary["responses_out"].as_u64(), Some(120), "{summary}");
    std::fs::remove_dir_all(&dir).ok();
}

fn refused(config: Option<&Path>, trace: &Path, model: Option<&Path>) -> String {
    let mut cmd = grflow();
    cmd.args(["replay", "--speed", "max", "--quiet", "--trace"])
        .arg(trace);
    if let Some(c) = config {
        cmd.arg("--config").arg(c);
    }
    if let Some(m) = model {
        cmd.arg("--model").arg(m);
    }
    let out = cmd.output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    err
}

#[test]
fn a_model_that_does_not_fit_the_trace_is_refused_naming_the_file_and_the_difference() {
    let dir = tmp_dir("serve-model-refused");
    let trace = import_walks(&dir, "walks", 60, 40, 1);
    let model = dir.join("model");
    train(&trace, &model);

    // Another catalog, through model.weights in the config.
    let other = import_walks(&dir, "other", 60, 41, 1);
    let config = dir.join("weights.toml");
    std::fs::write(
        &config,
        format!("[model]\nweights = {:?}\n", model.display().to_string()),
    )
    .unwrap();
    let err = refused(Some(&config), &other, None);
    assert!(err.contains("items.parquet"), "{err}");
    assert!(err.contains("40 items") && err.contains("has 41"), "{err}");
    // A catalog of the same size whose items differ (the same interactions
    // imported with another seed draw other semantic IDs): refused too.
    let reseeded = dir.join("reseeded");
    ok(grflow()
        .args([
            "import", "--format", "seq", "--quiet", "--tables", "1", "--seed", "9",
        ])
        .arg("--input")
        .arg(dir.join("walks.txt"))
        .arg("--out")
        .arg(&reseeded)
        .output()
        .unwrap());
    let err = refused(None, &reseeded, Some(&model));
    assert!(
        err.contains("items.parquet") && err.contains("another catalog"),
        "{err}"
    );

    // A tensor of the wrong shape is named.
    let bad = dir.join("bad-shape");
    std::fs::create_dir_all(&bad).unwrap();
    for f in ["items.parquet", "model.json"] {
        std::fs::copy(model.join(f), bad.join(f)).unwrap();
    }
    let bytes = std::fs::read(model.join("model.safetensors")).unwrap();
    let (_, meta) = safetensors::SafeTensors::read_metadata(&bytes).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = st.tensors();
    for (name, view) in &mut tensors {
        if name == "layers.1.w1" {
            let s = view.shape().to_vec();
            // Same bytes, rows and columns swapped.
            *view =
                safetensors::tensor::TensorView::new(view.dtype(), vec![s[1], s[0]], view.data())
                    .unwrap();
        }
    }
    let out = safetensors::serialize(tensors, meta.metadata().clone()).unwrap();
    std::fs::write(bad.join("model.safetensors"), out).unwrap();
    let err = refused(None, &trace, Some(&bad));
    assert!(
        err.contains("model.safetensors") && err.contains("layers.1.w1"),
        "{err}"
    );

    // An arch grflow does not serve is named in model.json.
    let arch = dir.join("bad-arch");
    std::fs::create_dir_all(&arch).unwrap();
    for f in ["items.parquet", "model.safetensors"] {
        std::fs::copy(model.join(f), arch.join(f)).unwrap();
    }
    let mut json: Value =
        serde_json::from_slice(&std::fs::read(model.join("model.json")).unwrap()).unwrap();
    json["arch"] = "hstu-9l".into();
    std::fs::write(arch.join("model.json"), json.to_string()).unwrap();
    let err = refused(None, &trace, Some(&arch));
    assert!(
        err.contains("model.json") && err.contains("hstu-9l"),
        "{err}"
    );

    // Weights that are not the ones model.json's version was made from (a
    // directory caught mid-copy, or files of two models): one weight moved.
    let mixed = dir.join("mixed");
    std::fs::create_dir_all(&mixed).unwrap();
    for f in ["items.parquet", "model.json"] {
        std::fs::copy(model.join(f), mixed.join(f)).unwrap();
    }
    let mut bytes = std::fs::read(model.join("model.safetensors")).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x01;
    std::fs::write(mixed.join("model.safetensors"), bytes).unwrap();
    let err = refused(None, &trace, Some(&mixed));
    assert!(
        err.contains("model.json") && err.contains("does not match the files"),
        "{err}"
    );

    // The flag overrides the config: the good model serves the trace even
    // though the config names a directory that does not exist.
    std::fs::write(&config, "[model]\nweights = \"/nonexistent/model\"\n").unwrap();
    let run = ok(grflow()
        .args(["replay", "--speed", "max", "--json", "--trace"])
        .arg(&trace)
        .arg("--config")
        .arg(&config)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap());
    let summary: Value = serde_json::from_slice(&run.stdout).unwrap();
    let json: Value =
        serde_json::from_slice(&std::fs::read(model.join("model.json")).unwrap()).unwrap();
    assert_eq!(summary["model_version"], json["model_version"], "{summary}");
    std::fs::remove_dir_all(&dir).ok();
}
