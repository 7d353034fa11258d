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

fn fails_with(out: std::process::Output, needle: &str) -> String {
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains(needle), "wanted {needle:?} in: {err}");
    err
}

/// What a careless command must not do: write a model over its own trace,
/// discard an earlier run's checkpoint, resume from damaged or mismatched
/// files, or score files that are not the model they claim to be.
#[test]
fn train_and_eval_refuse_what_would_lose_or_mislabel_work() {
    let dir = tmp_dir("train-cli-refusals");
    let trace = import_walks(&dir, "walks", 120, 60, 1);
    let model = dir.join("model");
    let train = |out: &std::path::Path, extra: &[&str]| {
        grflow()
            .args(["train", "--quiet", "--seed", "3", "--trace"])
            .arg(&trace)
            .arg("--out")
            .arg(out)
            .args(extra)
            .output()
            .unwrap()
    };
    // The trace itself as --out: refused, the trace untouched.
    let items_before = std::fs::read(trace.join("items.parquet")).unwrap();
    fails_with(train(&trace, &["--max-epochs", "1"]), "--out");
    assert_eq!(
        std::fs::read(trace.join("items.parquet")).unwrap(),
        items_before
    );
    fails_with(train(&model, &["--max-epochs", "0"]), "--max-epochs");
    // An --out that cannot be written: refused before any epoch runs.
    let plain = dir.join("plain");
    std::fs::write(&plain, b"").unwrap();
    let started = std::time::Instant::now();
    fails_with(
        train(&plain.join("model"), &["--max-epochs", "50"]),
        "--out",
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(20));

    ok(train(&model, &["--max-epochs", "1"]));
    // A new run into the same --out: refused; --force replaces it.
    fails_with(train(&model, &["--max-epochs", "1"]), "--resume");
    ok(train(&model, &["--max-epochs", "1", "--force"]));

    // Resuming keeps the checkpoint's seed: another --seed is refused,
    // naming the flag and both seeds; the same one is accepted.
    let ckpt = model.join("checkpoint");
    let resume = |extra: &[&str]| {
        grflow()
            .args(["train", "--quiet", "--trace"])
            .arg(&trace)
            .arg("--out")
            .arg(&model)
            .arg("--resume")
            .arg(&ckpt)
            .args(extra)
            .output()
            .unwrap()
    };
    fails_with(
        resume(&["--seed", "7", "--max-epochs", "2"]),
        "--seed 7: the checkpoint was trained with seed 3",
    );
    // A tensor file that is not the one state.json was saved with (a save
    // cut short, or a file copied in) is refused, naming the file.
    let state: Value =
        serde_json::from_slice(&std::fs::read(ckpt.join("state.json")).unwrap()).unwrap();
    let files: Vec<String> = state["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["file"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(files.len(), 4, "{state}");
    // (After one epoch `best` equals `params`; AdamW's moments do not.)
    let (params, adam_m) = (ckpt.join(&files[0]), ckpt.join(&files[2]));
    let saved = std::fs::read(&params).unwrap();
    std::fs::copy(&adam_m, &params).unwrap();
    fails_with(resume(&["--max-epochs", "2"]), &files[0]);
    std::fs::write(&params, saved).unwrap();
    ok(resume(&["--seed", "3", "--max-epochs", "2"]));
    // Epoch 1's tensor files were replaced by epoch 2's.
    let names: Vec<String> = std::fs::read_dir(&ckpt)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors"))
        .collect();
    assert_eq!(names.len(), 4, "{names:?}");
    assert!(names.iter().all(|n| n.contains("-e0002")), "{names:?}");
    // Resuming another directory's checkpoint into a run: refused, the run
    // held there untouched.
    let second = dir.join("second");
    ok(train(&second, &["--max-epochs", "1"]));
    let held = std::fs::read(second.join("model.json")).unwrap();
    fails_with(
        train(
            &second,
            &["--max-epochs", "3", "--resume", ckpt.to_str().unwrap()],
        ),
        "another run's",
    );
    assert_eq!(std::fs::read(second.join("model.json")).unwrap(), held);

    // eval: another trace of the same catalog is refused unless asked for.
    let other = import_walks(&dir, "fewer", 100, 60, 1);
    let eval = |trace: &std::path::Path, extra: &[&str]| {
        grflow()
            .args(["eval", "--json", "--model"])
            .arg(&model)
            .arg("--trace")
            .arg(trace)
            .args(extra)
            .output()
            .unwrap()
    };
    fails_with(eval(&other, &[]), "--other-trace");
    let out = ok(eval(&other, &["--other-trace"]));
    assert!(String::from_utf8_lossy(&out.stderr).contains("warning: "));
    // model.json edited after training: its files no longer hash to the
    // version it names.
    let json_path = model.join("model.json");
    let mut json: Value = serde_json::from_slice(&std::fs::read(&json_path).unwrap()).unwrap();
    json["training_secs"] = Value::from(1.5);
    std::fs::write(&json_path, serde_json::to_vec_pretty(&json).unwrap()).unwrap();
    fails_with(eval(&trace, &[]), "files hash to");
    std::fs::remove_dir_all(&dir).ok();
}

/// A trace whose semantic-ID codebook is not the default 256: the model is
/// trained with the trace's codebook, so serving takes it (it refused the
/// model, after the whole training, when the trainer kept 256).
#[test]
fn a_model_trained_on_a_small_codebook_trace_serves_it() {
    let dir = tmp_dir("train-codebook");
    let trace = dir.join("trace");
    ok(grflow()
        .args([
            "gen-trace",
            "--users",
            "150",
            "--items",
            "400",
            "--requests",
            "200",
            "--codebook-size",
            "8",
            "--out",
        ])
        .arg(&trace)
        .output()
        .unwrap());
    let model = dir.join("model");
    ok(grflow()
        .args(["train", "--quiet", "--max-epochs", "1", "--trace"])
        .arg(&trace)
        .arg("--out")
        .arg(&model)
        .output()
        .unwrap());
    let out = ok(grflow()
        .args(["replay", "--json", "--speed", "max", "--trace"])
        .arg(&trace)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap());
    let summary: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(summary["responses_out"], 200, "{summary}");
    assert_eq!(summary["errors"], 0, "{summary}");

    // An untrained tensor marked with another dtype and shape of the same
    // byte count: refused naming it (exit 2), not a panic (exit 101).
    let weights = model.join("model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    assert_eq!(header["sid_emb"]["shape"], serde_json::json!([2, 8, 64]));
    header["sid_emb"]["dtype"] = "F64".into();
    header["sid_emb"]["shape"] = serde_json::json!([8, 64]);
    let mut text = serde_json::to_vec(&header).unwrap();
    assert!(text.len() <= n);
    text.resize(n, b' ');
    bytes[8..8 + n].copy_from_slice(&text);
    std::fs::write(&weights, bytes).unwrap();
    let out = grflow()
        .args(["replay", "--json", "--speed", "max", "--trace"])
        .arg(&trace)
        .arg("--model")
        .arg(&model)
        .output()
        .unwrap();
    fails_with(out, "sid_emb: dtype F64, expected F32");
    std::fs::remove_dir_all(&dir).ok();
}

/// A resumed run keeps the interrupted run's `--max-epochs` unless given
/// another, which is said; and a checkpoint records the builds that
/// trained it: resumed by another build, the run warns and model.json
/// lists both.
#[test]
fn resume_keeps_the_run_s_epoch_limit_and_credits_every_build() {
    let dir = tmp_dir("train-resume-builds");
    let trace = import_walks(&dir, "walks", 120, 60, 1);
    let model = dir.join("model");
    let ckpt = model.join("checkpoint");
    let train = |extra: &[&std::ffi::OsStr]| {
        ok(grflow()
            .args(["train", "--quiet", "--trace"])
            .arg(&trace)
            .arg("--out")
            .arg(&model)
            .args(extra)
            .output()
            .unwrap())
    };
    let read = |path: &std::path::Path| -> Value {
        serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
    };
    let this = env!("GRFLOW_COMMIT");
    train(&["--max-epochs".as_ref(), "1".as_ref()]);
    let state_path = ckpt.join("state.json");
    let mut state = read(&state_path);
    assert_eq!(state["commits"], serde_json::json!([this]), "{state}");
    let json = read(&model.join("model.json"));
    assert_eq!(json["trained_by_commits"], serde_json::json!([this]));

    // As if another build had started the run with --max-epochs 2 and it
    // had stopped after epoch 1.
    state["state"]["config"]["max_epochs"] = 2.into();
    state["commits"] = serde_json::json!(["0123456789ab"]);
    std::fs::write(&state_path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    let out = train(&["--resume".as_ref(), ckpt.as_os_str()]);
    let json = read(&model.join("model.json"));
    assert_eq!(json["epochs"], 2, "{json}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("with the checkpoint's --max-epochs 2")
            && err.contains("warning: the checkpoint was trained by build 0123456789ab"),
        "{err}"
    );
    assert_eq!(json["commit"], this);
    let both = serde_json::json!(["0123456789ab", this]);
    assert_eq!(json["trained_by_commits"], both);
    assert_eq!(read(&state_path)["commits"], both);

    // A checkpoint from before builds were recorded loads, trained by an
    // unknown build; a larger --max-epochs extends the run, and says so.
    let mut state = read(&state_path);
    state.as_object_mut().unwrap().remove("commits");
    std::fs::write(&state_path, serde_json::to_vec_pretty(&state).unwrap()).unwrap();
    let out = train(&[
        "--resume".as_ref(),
        ckpt.as_os_str(),
        "--max-epochs".as_ref(),
        "3".as_ref(),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("with --max-epochs 3; the checkpoint's run had 2") && err.contains("unknown"),
        "{err}"
    );
    let json = read(&model.join("model.json"));
    assert_eq!(json["epochs"], 3, "{json}");
    assert_eq!(
        json["trained_by_commits"],
        serde_json::json!(["unknown", this])
    );
    // The extension is the run's limit now: a later resume keeps it.
    assert_eq!(read(&state_path)["state"]["config"]["max_epochs"], 3);
    std::fs::remove_dir_all(&dir).ok();
}

/// A failed import or train removes the `--out` it created (nested
/// parents included) instead of leaving it empty or half written; an
/// `--out` that was there before stays, with what it held.
#[test]
fn failed_import_and_train_remove_the_out_they_created() {
    let dir = tmp_dir("failed-out");
    let bad = dir.join("bad.inter");
    std::fs::write(&bad, "garbage\n").unwrap();
    let existing = dir.join("existing");
    std::fs::create_dir_all(&existing).unwrap();
    std::fs::write(existing.join("keep.txt"), "mine").unwrap();
    let new = dir.join("new");
    let nested = dir.join("a");
    let import = |out: &std::path::Path| {
        grflow()
            .args(["import", "--format", "recbole", "--quiet", "--input"])
            .arg(&bad)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    fails_with(import(&new), "user_id");
    assert!(!new.exists(), "import left {}", new.display());
    fails_with(import(&nested.join("b").join("c")), "user_id");
    assert!(!nested.exists(), "import left {}", nested.display());
    fails_with(import(&existing), "user_id");
    assert_eq!(
        std::fs::read_to_string(existing.join("keep.txt")).unwrap(),
        "mine"
    );

    // train: a trace that is not there, then a run that fails once its
    // --out exists (a checkpoint of another seed to resume).
    let train = |out: &std::path::Path, extra: &[&std::ffi::OsStr]| {
        grflow()
            .args(["train", "--quiet", "--out"])
            .arg(out)
            .args(extra)
            .output()
            .unwrap()
    };
    let missing = dir.join("no-trace");
    fails_with(
        train(&new, &["--trace".as_ref(), missing.as_os_str()]),
        "no-trace",
    );
    assert!(!new.exists(), "train left {}", new.display());
    fails_with(
        train(&existing, &["--trace".as_ref(), missing.as_os_str()]),
        "no-trace",
    );
    assert!(existing.join("keep.txt").is_file());
    let trace = import_walks(&dir, "walks", 120, 60, 1);
    let first = dir.join("first");
    ok(train(
        &first,
        &[
            "--trace".as_ref(),
            trace.as_os_str(),
            "--seed".as_ref(),
            "3".as_ref(),
            "--max-epochs".as_ref(),
            "1".as_ref(),
        ],
    ));
    let ckpt = first.join("checkpoint");
    fails_with(
        train(
            &new,
            &[
                "--trace".as_ref(),
                trace.as_os_str(),
                "--resume".as_ref(),
                ckpt.as_os_str(),
                "--seed".as_ref(),
                "7".as_ref(),
            ],
        ),
        "--seed 7: the checkpoint was trained with seed 3",
    );
    assert!(!new.exists(), "train left {}", new.display());
    std::fs::remove_dir_all(&dir).ok();
}
