//! `grflow bench allocator` smoke run: one regime, the static sweep, every
//! policy followed by the oracle α* (on a coarse grid), on the virtual
//! clock with a calibration made by `grflow calibrate`; the `ppo-only` and
//! `smart` rows use a policy that `grflow train-allocator` trains first
//! (two tiny iterations).

use std::ffi::OsStr;
use std::process::Output;

use serde_json::Value;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/process.rs"]
mod process;
#[path = "common/temp.rs"]
mod temp;
use cli::{grflow, ok};
use temp::tmp_dir;

/// `grflow train-allocator ARGS --out policy --config config
/// --calibration calibration`.
fn train_command(
    policy: &std::path::Path,
    config: &std::path::Path,
    calibration: &std::path::Path,
    args: &[&str],
) -> std::process::Command {
    let mut cmd = grflow();
    cmd.arg("train-allocator")
        .args(args)
        .arg("--out")
        .arg(policy)
        .arg("--config")
        .arg(config)
        .arg("--calibration")
        .arg(calibration);
    cmd
}

/// [`train_command`], which must succeed.
fn train_on(
    policy: &std::path::Path,
    config: &std::path::Path,
    calibration: &std::path::Path,
    args: &[&str],
) -> std::process::Output {
    ok(train_command(policy, config, calibration, args)
        .output()
        .unwrap())
}

#[test]
fn bench_allocator_sweeps_static_alpha_and_reports_every_policy() {
    let dir = tmp_dir("bench-allocator");
    let calibration = small_calibration(&dir);
    let config = short_trace(&dir, "small-trace.toml", 600);
    let policy = dir.join("policy.safetensors");
    let trained = train_on(
        &policy,
        &config,
        &calibration,
        &[
            "--regime",
            "burst",
            "--seeds",
            "1",
            "--iterations",
            "2",
            "--slo-ms",
            "2",
            "--select-every",
            "1",
            "--json",
        ],
    );
    let trained: Value = serde_json::from_slice(&trained.stdout).unwrap();
    assert_eq!(trained["iterations"], 2);
    assert!(trained["parameters"].as_u64().unwrap() < 25_000);
    let curve: Value =
        serde_json::from_slice(&std::fs::read(dir.join("policy.safetensors.curve.json")).unwrap())
            .unwrap();
    let curve = curve.as_array().unwrap();
    assert_eq!(curve.len(), 2);
    assert!(
        curve.iter().all(|c| c["decisions"].as_u64().unwrap() > 0),
        "every iteration learns from recorded decisions: {curve:?}"
    );
    // Checkpoint selection: the greedy policy was scored before each update
    // and at the end, and the written one is the best of those, never worse
    // than the untrained policy (α held at the config's value).
    assert!(curve.iter().all(|c| c["greedy_p99_ms"].as_f64().is_some()));
    assert!(trained["selected_updates"].as_u64().unwrap() <= 2);
    let (chosen, untrained) = (
        trained["selected_greedy_p99_ms"].as_f64().unwrap(),
        trained["untrained_greedy_p99_ms"].as_f64().unwrap(),
    );
    assert!(chosen <= untrained, "{trained}");
    assert_eq!(untrained, curve[0]["greedy_p99_ms"].as_f64().unwrap());
    // The bench reads the cost model the config names (`cost.calibration`)
    // without --calibration, and calibrates nothing itself.
    let bench_config = dir.join("small-trace-calibrated.toml");
    std::fs::write(
        &bench_config,
        format!(
            "{}[cost]\ncalibration = {:?}\n",
            std::fs::read_to_string(&config).unwrap(),
            calibration.display().to_string()
        ),
    )
    .unwrap();
    let out = ok(grflow()
        .args([
            "bench",
            "allocator",
            "--regime",
            "burst",
            "--sweep",
            "--node-sweep",
            "--train-seeds",
            "2",
            "--slo-ms",
            "2",
            "--oracle-step",
            "0.25",
            "--json",
        ])
        .arg("--out")
        .arg(dir.join("plots"))
        .arg("--policy")
        .arg(&policy)
        .arg("--config")
        .arg(&bench_config)
        .output()
        .unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("calibrating"), "{stderr}");
    // `--json` prints the array, one row per (regime, policy),
    // each naming its seed and carrying the figures the issue lists; the
    // whole report is DIR/report.json.
    let array: Value = serde_json::from_slice(&out.stdout).unwrap();
    let report: Value =
        serde_json::from_slice(&std::fs::read(dir.join("plots/report.json")).unwrap()).unwrap();
    let array = array.as_array().expect("--json prints an array");
    assert_eq!(array.len(), report["rows"].as_array().unwrap().len());
    for (a, r) in array.iter().zip(report["rows"].as_array().unwrap()) {
        let mut a = a.as_object().unwrap().clone();
        assert_eq!(a.remove("seed"), Some(report["seed"].clone()), "{r}");
        assert_eq!(&Value::Object(a), r);
        for key in [
            "regime",
            "policy",
            "oracle_gap",
            "p99_regret_ms",
            "alpha_star_std",
            "decision_us_mean",
            "decision_us_p99",
            "p99_ms",
            "slo_satisfaction",
            "p99_reduction_vs_kv_emb_opt",
        ] {
            assert!(r.get(key).is_some(), "{key} in {r}");
        }
    }
    assert!(stderr.contains("cost model from"), "{stderr}");
    assert_eq!(report["clock"], "virtual");
    assert_eq!(report["train_seeds"].as_u64(), Some(2));
    // Wall-clock figures come with the machine they were measured on.
    assert!(report["host_gemm_gflops"].as_f64().unwrap() > 0.0);
    assert!(!report["host_machine"].as_str().unwrap().is_empty());
    assert_eq!(report["sweep"].as_array().unwrap().len(), 11);
    assert!(
        report["sweep"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["kv_reclaims"].as_u64().is_some()),
        "{report}"
    );
    let rows = report["rows"].as_array().unwrap();
    let policies: Vec<&str> = rows.iter().map(|r| r["policy"].as_str().unwrap()).collect();
    assert_eq!(
        policies,
        [
            "kv-emb-opt",
            "kv-emb-opt-node",
            "static",
            "kv-opt",
            "pid",
            "ppo-only",
            "smart",
            "ppo-only-node",
            "smart-node"
        ]
    );
    // The per-node split: one α per node, from the grid, never worse than
    // the best single α on the training seed, and the row holds it.
    let split = &report["node_sweep"]["burst"];
    let node_alpha: Vec<f64> = split["node_alpha"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_f64().unwrap())
        .collect();
    assert_eq!(node_alpha.len(), 2, "{split}");
    assert!(
        node_alpha.iter().all(|a| (0.0..=1.0).contains(a)),
        "{split}"
    );
    assert!(
        split["train_p99_ms"].as_f64().unwrap()
            <= split["train_p99_ms_single_alpha"].as_f64().unwrap(),
        "{split}"
    );
    // The start, then each node's ten other α at least.
    assert!(split["evaluations"].as_u64().unwrap() > 2 * 10, "{split}");
    assert_eq!(rows[1]["node_alpha"], split["node_alpha"]);
    // The learned controllers' `-node` rows start from the same split.
    for r in &rows[7..] {
        assert_eq!(r["node_alpha"], split["node_alpha"], "{r}");
    }
    assert_eq!(rows[1]["truncated_histories"].as_u64(), Some(0));
    assert!(rows[0].get("node_alpha").is_none(), "{}", rows[0]);
    assert_eq!(report["slo_ms"].as_f64(), Some(2.0));
    assert_eq!(rows[0]["p99_reduction_vs_kv_emb_opt"].as_f64(), Some(0.0));
    // Every row says how many histories its α cut short; kv-emb-opt never
    // picks an α that cuts any.
    assert!(
        rows.iter()
            .all(|r| r["truncated_histories"].as_u64().is_some())
    );
    assert_eq!(rows[0]["truncated_histories"].as_u64(), Some(0));
    assert!(rows.iter().all(|r| r["p99_ms"].as_f64().unwrap() > 0.0));
    let pid = &rows[4];
    assert!(pid["alpha_moves"].as_u64().unwrap() > 0, "{pid}");
    assert!(pid["decision_us_p99"].as_f64().unwrap() > 0.0);
    // pid's gains were searched on the training seeds like kv-emb-opt's α.
    let gains = &pid["pid_gains"];
    assert_eq!(gains["searched"].as_bool(), Some(true), "{pid}");
    assert!(gains["train_p99_ms"].as_f64().unwrap() > 0.0, "{pid}");
    assert!(gains["kp"].as_f64().unwrap() > 0.0, "{pid}");
    // Policies that hold α time no decision: null, not 0 µs.
    for held in &rows[..4] {
        assert!(held["decision_us_mean"].is_null(), "{held}");
        assert!(held.get("pid_gains").is_none(), "{held}");
    }
    assert!(report["sweep_alpha_star_std"]["burst"].as_f64().is_some());
    for learned in &rows[5..] {
        assert!(learned["p99_ms"].as_f64().unwrap() > 0.0, "{learned}");
    }
    // Every policy's run is followed by the oracle.
    assert_eq!(report["oracle_step"].as_f64(), Some(0.25));
    for r in rows {
        assert!(r["oracle_epochs"].as_u64().unwrap() > 0, "{r}");
        let gap = r["oracle_gap"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&gap), "{r}");
        assert!(r["alpha_star_std"].as_f64().unwrap() >= 0.0, "{r}");
        assert!(r["p99_regret_ms"].as_f64().unwrap().is_finite(), "{r}");
        // No constant does better in hindsight than the kv-emb-opt/kv-opt
        // rows' own (constant) α.
        let best_constant = r["oracle_gap_best_constant"].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&best_constant), "{r}");
        if r["alpha_moves"].as_u64() == Some(0) {
            assert!(best_constant <= gap + 1e-9, "{r}");
        }
    }
    for plot in ["alpha-burst.svg", "p99-burst.svg", "sweep.svg"] {
        let svg = std::fs::read_to_string(dir.join("plots").join(plot)).unwrap();
        assert!(svg.contains("<polyline"), "{plot}");
    }
    let alpha_plot = std::fs::read_to_string(dir.join("plots/alpha-burst.svg")).unwrap();
    assert!(alpha_plot.contains("alpha* node"), "α* is drawn");
    // Each node's α is its own line (a split between nodes must show), not
    // a mean over nodes. (On this short trace the router may send node 1
    // nothing, and a node without requests closes no window.)
    for line in ["smart node 0", "pid node 0", "ppo-only node 0"] {
        assert!(alpha_plot.contains(line), "{line} is drawn");
    }
    assert!(!alpha_plot.contains("smart alpha"), "no mean line");
    // The oracle needs a deterministic node: a learning cache is refused
    // by name before any run.
    let laru = dir.join("laru.toml");
    std::fs::write(
        &laru,
        std::fs::read_to_string(&config).unwrap() + "[memory]\nemb_policy = \"laru\"\n",
    )
    .unwrap();
    let refused = grflow()
        .args(["bench", "allocator", "--regime", "burst"])
        .arg("--config")
        .arg(&laru)
        .arg("--calibration")
        .arg(&calibration)
        .output()
        .unwrap();
    refused_naming(refused, "memory.emb_policy = \"laru\"");
    // A policy file that is not one is refused by name.
    let bad_policy = grflow()
        .args(["bench", "allocator", "--regime", "burst", "--policy"])
        .arg(&config)
        .arg("--calibration")
        .arg(&calibration)
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    refused_naming(bad_policy, "allocator.policy_file");
    // The per-node search starts from the sweep's best: without --sweep it
    // is refused by flag before any run.
    let no_sweep = grflow()
        .args(["bench", "allocator", "--regime", "burst", "--node-sweep"])
        .output()
        .unwrap();
    refused_naming(no_sweep, "--sweep");
    let no_seeds = grflow()
        .args(["bench", "allocator", "--sweep", "--train-seeds", "0"])
        .output()
        .unwrap();
    refused_naming(no_seeds, "--train-seeds");
    // A bad regime is refused by name.
    let bad = grflow()
        .args(["bench", "allocator", "--regime", "stormy"])
        .output()
        .unwrap();
    refused_naming(bad, "stormy");
}

/// allocator-small at 2 req/s: no window has `allocator.min_requests`,
/// so the deciding policies time no decision; their decision times are
/// null, not 0 µs.
#[test]
fn bench_allocator_reports_no_decision_time_where_no_decision_was_timed() {
    let dir = tmp_dir("bench-allocator-no-decisions");
    let root = env!("CARGO_MANIFEST_DIR");
    let small = std::fs::read_to_string(format!("{root}/configs/allocator-small.toml")).unwrap();
    let sparse: String = small
        .lines()
        .map(|l| {
            if l.starts_with("requests = ") {
                "requests = 200"
            } else if l.starts_with("rps = ") {
                "rps = 2.0"
            } else {
                l
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let config = dir.join("sparse.toml");
    std::fs::write(&config, sparse).unwrap();
    let out = ok(grflow()
        .current_dir(root)
        .args([
            "bench",
            "allocator",
            "--regime",
            "steady",
            "--no-oracle",
            "--json",
        ])
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap());
    let rows: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = rows.as_array().unwrap();
    let deciding: Vec<&Value> = rows
        .iter()
        .filter(|r| ["pid", "ppo-only", "smart"].contains(&r["policy"].as_str().unwrap()))
        .collect();
    assert!(!deciding.is_empty(), "{rows:?}");
    for r in deciding {
        assert_eq!(r["alpha_moves"].as_u64(), Some(0), "{r}");
        assert!(r["decision_us_mean"].is_null(), "{r}");
        assert!(r["decision_us_p99"].is_null(), "{r}");
    }
}

#[test]
fn bench_allocator_says_why_kv_emb_opt_is_missing_when_every_alpha_truncates() {
    let dir = tmp_dir("bench-allocator-truncating");
    let calibration = small_calibration(&dir);
    // Histories of 200-400 items in a 0.5 MiB pool: every static alpha cuts
    // them short, on the training trace too, so no alpha is comparable.
    let config = dir.join("truncating.toml");
    std::fs::write(
        &config,
        "[trace]\nrequests = 200\nrps = 100.0\ncandidates = 16\nmin_history = 200\n\
         max_history = 400\n[memory]\npool_mib = 0.5\n[windows]\nepoch_ms = 1000\n",
    )
    .unwrap();
    let out = ok(grflow()
        .args(["bench", "allocator", "--regime", "burst", "--sweep"])
        .args(["--no-oracle", "--slo-ms", "2", "--json-report"])
        .args([OsStr::new("--config"), config.as_os_str()])
        .args([OsStr::new("--calibration"), calibration.as_os_str()])
        .output()
        .unwrap());
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert!(rows.iter().all(|r| r["policy"] != "kv-emb-opt"), "{report}");
    let why = report["kv_emb_opt_missing"]["burst"].as_str().unwrap();
    assert!(
        why.contains("no static alpha") && why.contains("truncated histories"),
        "{why}"
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("burst: no static alpha"), "{stderr}");
}

/// A cost model of the small preset fitted here (one rep, no overhead).
fn small_calibration(dir: &std::path::Path) -> std::path::PathBuf {
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
    calibration
}

/// A config whose trace has `requests` requests at 100 req/s with 1 s
/// windows.
fn short_trace(dir: &std::path::Path, name: &str, requests: u64) -> std::path::PathBuf {
    let config = dir.join(name);
    std::fs::write(
        &config,
        format!(
            "[trace]\nrequests = {requests}\nrps = 100.0\ncandidates = 16\n[windows]\nepoch_ms = 1000\n"
        ),
    )
    .unwrap();
    config
}

/// `out` is a refusal of the user's input (exit 2) whose message names
/// `what`.
fn refused_naming(out: Output, what: &str) {
    assert_eq!(out.status.code(), Some(2), "{what}: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains(what), "{what}: {stderr}");
}

/// A config naming a calibration file that is not there: one line naming
/// the file, exit code 2, before any run.
#[test]
fn bench_allocator_refuses_a_missing_calibration_file_by_name() {
    let dir = tmp_dir("bench-allocator-missing");
    let config = dir.join("missing.toml");
    std::fs::write(&config, "[cost]\ncalibration = \"no/such/cal.json\"\n").unwrap();
    let out = grflow()
        .args([
            "bench",
            "allocator",
            "--regime",
            "burst",
            "--json",
            "--config",
        ])
        .arg(&config)
        .output()
        .unwrap();
    refused_naming(out, "no/such/cal.json");
}

/// A reward that every window earns in full teaches nothing: with an SLO
/// far above every p99 the trainer says so, naming the flag to change.
#[test]
fn train_allocator_warns_when_every_window_meets_the_slo() {
    let dir = tmp_dir("train-allocator-flat-reward");
    let config = short_trace(&dir, "flat.toml", 400);
    let policy = dir.join("flat.safetensors");
    let out = ok(grflow()
        .args([
            "train-allocator",
            "--regime",
            "steady",
            "--seeds",
            "1",
            "--iterations",
            "1",
            "--select-every",
            "0",
            "--slo-ms",
            "10000",
            "--json",
            "--out",
        ])
        .arg(&policy)
        .arg("--config")
        .arg(&config)
        .arg("--calibration")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/configs/allocator-calibration.json"
        ))
        .output()
        .unwrap());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("warning: 100% of iteration 0's decisions earned Eq. 5's best reward")
            && stderr.contains("--slo-ms near"),
        "{stderr}"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["first_best_reward_share"], 1.0);
}

/// PPO settings that cannot train: one line naming the flag, exit code 2,
/// before any calibration or replay.
#[test]
fn train_allocator_refuses_unusable_ppo_settings_by_flag() {
    let dir = tmp_dir("train-allocator-ppo-flags");
    for (flag, value) in [
        ("--learning-rate", "0"),
        ("--learning-rate", "NaN"),
        ("--ppo-epochs", "0"),
        ("--entropy-coef", "-0.1"),
    ] {
        let out = grflow()
            .args(["train-allocator", "--iterations", "1", flag, value, "--out"])
            .arg(dir.join("p.safetensors"))
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
        assert!(!dir.join("p.safetensors").exists());
    }
}

/// `--validation-seeds`: checkpoints are scored on held-out traces, which
/// the provenance names; seeds that overlap the training ones are refused.
#[test]
fn train_allocator_selects_on_held_out_traces() {
    let dir = tmp_dir("train-allocator-validation");
    let out = grflow()
        .args(["train-allocator", "--iterations", "1", "--seed-base", "10"])
        .args(["--seeds", "3", "--validation-seed-base", "12"])
        .args(["--validation-seeds", "2", "--out"])
        .arg(dir.join("p.safetensors"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("--validation-seed-base 12") && stderr.contains("10..12"),
        "{stderr}"
    );

    let calibration = small_calibration(&dir);
    let config = short_trace(&dir, "tiny.toml", 300);
    let policy = dir.join("policy.safetensors");
    // A Burst-only training on the tiny trace, scored every iteration.
    let train = |iterations: &str, extra: &[&str]| {
        let mut args = vec!["--regime", "burst", "--seeds", "1", "--slo-ms", "2"];
        args.extend(["--iterations", iterations, "--select-every", "1"]);
        args.extend(extra);
        train_on(&policy, &config, &calibration, &args)
    };
    let trained = train(
        "1",
        &["--validation-seeds", "1", "--validation-seed-base", "77"],
    );
    let stderr = String::from_utf8_lossy(&trained.stderr);
    assert!(
        stderr.contains("on the held-out validation traces"),
        "{stderr}"
    );
    let bytes = std::fs::read(&policy).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.contains("held-out validation traces (seeds 77..77)"),
        "the provenance names the validation seeds"
    );

    // --average-last: the mean of the last scored checkpoints is scored
    // too, and when it wins the report and the provenance say so.
    // --force: the policy of the run above is replaced.
    let trained = train("2", &["--average-last", "3", "--json", "--force"]);
    let stderr = String::from_utf8_lossy(&trained.stderr);
    assert!(
        stderr.contains("mean of the checkpoints after [0, 1, 2] updates"),
        "{stderr}"
    );
    let report: Value = serde_json::from_slice(&trained.stdout).unwrap();
    let text = String::from_utf8_lossy(&std::fs::read(&policy).unwrap()).to_string();
    match report.get("averaged_checkpoints") {
        Some(members) => {
            assert_eq!(members, &serde_json::json!([0, 1, 2]));
            assert!(text.contains("the parameter mean of the checkpoints"));
        }
        None => assert!(!text.contains("the parameter mean of the checkpoints")),
    }
}

/// The bench and the trainer set one α for every node, so a config with
/// per-node α is refused by name (exit 2) instead of being overridden.
#[test]
fn bench_and_train_allocator_refuse_per_node_alpha_by_name() {
    let dir = tmp_dir("bench-allocator-node-alpha");
    let config = dir.join("split.toml");
    std::fs::write(&config, "[memory]\nnode_alpha = [0.1, 0.8]\n").unwrap();
    // A writable --out: checked first, then the config refuses.
    let policy = dir.join("p.st");
    let policy = policy.to_str().unwrap();
    for args in [
        &["bench", "allocator", "--regime", "burst", "--json"][..],
        &["train-allocator", "--iterations", "1", "--out", policy][..],
    ] {
        let out = grflow()
            .args(args)
            .arg("--config")
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("memory.node_alpha"), "{args:?}: {stderr}");
    }
}

/// `--seeds`: the whole bench on every seed (two at once with `--jobs 2`),
/// each seed's runs exactly those of a `--seed` run, and their means.
#[test]
fn bench_allocator_runs_several_seeds_and_gives_their_means() {
    let dir = tmp_dir("bench-allocator-seeds");
    let calibration = small_calibration(&dir);
    let config = short_trace(&dir, "tiny.toml", 300);
    let bench = |extra: &[&str]| {
        let out = ok(grflow()
            .args(["bench", "allocator", "--regime", "burst", "--sweep"])
            .args(["--no-oracle", "--slo-ms", "2"])
            .args(extra)
            .args([OsStr::new("--config"), config.as_os_str()])
            .args([OsStr::new("--calibration"), calibration.as_os_str()])
            .output()
            .unwrap());
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    let plots = dir.join("plots");
    let plots_arg = plots.display().to_string();
    // `--json`'s array holds both seeds' rows, each naming its seed; the
    // whole report is in DIR/report.json.
    let array = bench(&[
        "--seeds", "5,6", "--jobs", "2", "--json", "--out", &plots_arg,
    ]);
    let both: Value =
        serde_json::from_slice(&std::fs::read(plots.join("report.json")).unwrap()).unwrap();
    let single = bench(&["--seed", "6", "--json-report"]);
    let seeds_of_rows: Vec<u64> = array
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["seed"].as_u64().unwrap())
        .collect();
    let n = single["rows"].as_array().unwrap().len();
    assert_eq!(seeds_of_rows, [vec![5; n], vec![6; n]].concat());
    assert_eq!(both["seeds"], serde_json::json!([5, 6]));
    let per_seed = both["per_seed"].as_array().unwrap();
    assert_eq!(per_seed.len(), 2);
    assert_eq!(per_seed[0]["seed"], 5);
    assert_eq!(per_seed[1]["seed"], 6);
    // Seed 6's runs, benched beside seed 5, are those of seed 6 alone
    // (the virtual clock; decision times are wall time).
    let virtual_figures = |rows: &Value| -> Vec<Value> {
        rows.as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let mut r = r.clone();
                let o = r.as_object_mut().unwrap();
                o.retain(|k, _| !k.starts_with("decision_us"));
                r
            })
            .collect()
    };
    assert_eq!(
        virtual_figures(&per_seed[1]["rows"]),
        virtual_figures(&single["rows"])
    );
    assert_eq!(per_seed[1]["sweep"], single["sweep"]);
    assert_eq!(single["seed"], 6);
    // One mean row per (regime, policy), over both seeds.
    let mean = both["mean"].as_array().unwrap();
    assert_eq!(mean.len(), per_seed[0]["rows"].as_array().unwrap().len());
    for m in mean {
        assert_eq!(m["seeds"], 2, "{m}");
        let policy = m["policy"].as_str().unwrap();
        let p99: Vec<f64> = per_seed
            .iter()
            .map(|s| {
                let rows = s["rows"].as_array().unwrap();
                let r = rows.iter().find(|r| r["policy"] == policy).unwrap();
                r["p99_ms"].as_f64().unwrap()
            })
            .collect();
        let want = (p99[0] + p99[1]) / 2.0;
        assert!(
            (m["p99_ms_mean"].as_f64().unwrap() - want).abs() < 1e-12,
            "{m}"
        );
        if policy == "static" {
            assert!(m["seeds_below_static"].is_null(), "{m}");
        } else {
            assert!(m["seeds_below_static"].as_u64().unwrap() <= 2, "{m}");
        }
    }
    let reference = mean.iter().find(|m| m["policy"] == "kv-emb-opt").unwrap();
    assert_eq!(
        reference["p99_reduction_vs_kv_emb_opt_mean"].as_f64(),
        Some(0.0)
    );
    for seed in ["seed-5", "seed-6"] {
        let svg = std::fs::read_to_string(plots.join(seed).join("p99-burst.svg")).unwrap();
        assert!(svg.contains("<polyline"), "{seed}");
    }
    // Bad lists are refused by flag before any run.
    for (list, what) in [("5,x", "--seeds: item 2"), ("5,5", "given twice")] {
        let out = grflow()
            .args(["bench", "allocator", "--regime", "burst", "--seeds", list])
            .output()
            .unwrap();
        refused_naming(out, what);
    }
    let out = grflow()
        .args(["bench", "allocator", "--seeds", "5,6", "--jobs", "0"])
        .output()
        .unwrap();
    refused_naming(out, "--jobs");
    // Flags that would be ignored are refused, as is a regime twice.
    for (args, what) in [
        (&["--jobs", "2"][..], "--seeds"),
        (&["--train-seeds", "2"][..], "--sweep"),
        (&["--oracle-step", "0.1", "--no-oracle"][..], "--no-oracle"),
        (&["--regime", "burst,burst"][..], "burst is given twice"),
        (&["--json", "--json-report"][..], "--json-report"),
    ] {
        let out = grflow()
            .args(["bench", "allocator"])
            .args(args)
            .output()
            .unwrap();
        refused_naming(out, what);
    }
}

/// Output places that cannot be written are refused before any run (the
/// bench and the training take minutes to hours); a training whose
/// windows are all too small to decide on is refused, not written as a
/// policy; no scratch directory is left behind.
#[test]
fn bench_and_train_allocator_refuse_outputs_and_empty_training_up_front() {
    let dir = tmp_dir("bench-allocator-outputs");
    let calibration = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/allocator-calibration.json"
    );
    let a_file = dir.join("a-file");
    std::fs::write(&a_file, "").unwrap();
    // Refused before the runs (each takes seconds to minutes).
    cli::refused_out(
        &[
            "bench",
            "allocator",
            "--regime",
            "burst",
            "--no-oracle",
            "--json",
            "--calibration",
            calibration,
        ],
        &a_file,
    );

    let train = |out: &std::path::Path, config: &std::path::Path| {
        grflow()
            .args(["train-allocator", "--regime", "burst", "--seeds", "1"])
            .args([
                "--iterations",
                "1",
                "--select-every",
                "0",
                "--calibration",
                calibration,
            ])
            .arg("--config")
            .arg(config)
            .arg("--out")
            .arg(out)
            .output()
            .unwrap()
    };
    let config = short_trace(&dir, "tiny.toml", 300);
    refused_naming(train(&dir, &config), "is a directory");
    // 5 requests: no window reaches allocator.min_requests.
    let five = short_trace(&dir, "five.toml", 5);
    let policy = dir.join("p.safetensors");
    refused_naming(train(&policy, &five), "allocator.min_requests");
    assert!(!policy.exists());
    let scratch: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(".train-allocator-"))
        .collect();
    assert!(scratch.is_empty(), "{scratch:?}");
}

/// Ctrl-C during `train-allocator`: the iterations done are kept, the best
/// checkpoint so far is written with a provenance that says so, and the
/// exit code is 130.
#[test]
fn train_allocator_stopped_by_sigint_writes_the_best_policy_so_far() {
    use std::io::{BufRead, BufReader};
    let dir = tmp_dir("train-allocator-sigint");
    let calibration = small_calibration(&dir);
    let config = short_trace(&dir, "sigint-trace.toml", 600);
    let policy = dir.join("policy.safetensors");
    let args = "--regime burst --seeds 1 --iterations 500 --slo-ms 2 --select-every 1 --json";
    let args: Vec<&str> = args.split(' ').collect();
    let mut child = train_command(&policy, &config, &calibration, &args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Two iterations done, then the signal.
    let mut stderr = BufReader::new(child.stderr.take().unwrap());
    let mut seen = String::new();
    let mut line = String::new();
    let mut iterations = 0;
    while iterations < 2 {
        line.clear();
        assert!(
            stderr.read_line(&mut line).unwrap() > 0,
            "ended early:\n{seen}"
        );
        iterations += usize::from(line.starts_with("iteration "));
        seen += &line;
    }
    process::signal(child.id(), "-INT");
    let mut rest = String::new();
    std::io::Read::read_to_string(&mut stderr, &mut rest).unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{seen}{rest}");
    assert!(rest.contains("interrupted by SIGINT after"), "{rest}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["interrupted"], "SIGINT", "{report}");
    let done = report["iterations"].as_u64().unwrap();
    assert!((2..500).contains(&done), "{report}");
    assert!(report["selected_updates"].as_u64().unwrap() <= done);
    // The policy is there and says how it was trained.
    let bytes = std::fs::read(&policy).unwrap();
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        text.contains(&format!(
            "{done} iterations (of 500 asked; stopped by SIGINT)"
        )),
        "provenance"
    );
}

/// The learning curve is written with the policy and refused as `--out`
/// is: an earlier run's curve is not overwritten without `--force`; with
/// it both files are replaced by a rename, never truncated in place (a
/// hard link to the old policy keeps the old bytes).
#[test]
fn train_allocator_keeps_an_earlier_curve_and_replaces_files_whole() {
    let dir = tmp_dir("train-allocator-curve");
    let config = short_trace(&dir, "tiny.toml", 300);
    let calibration = std::path::PathBuf::from(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/configs/allocator-calibration.json"
    ));
    let policy = dir.join("p.safetensors");
    let curve = dir.join("p.safetensors.curve.json");
    std::fs::write(&curve, "an earlier run's").unwrap();
    let train = |extra: &[&str]| {
        let mut args = vec!["--regime", "steady", "--seeds", "1", "--iterations", "1"];
        args.extend(["--select-every", "0"]);
        args.extend(extra);
        train_command(&policy, &config, &calibration, &args)
            .output()
            .unwrap()
    };
    refused_naming(train(&[]), "p.safetensors.curve.json already exists");
    assert_eq!(std::fs::read_to_string(&curve).unwrap(), "an earlier run's");
    assert!(!policy.exists());

    std::fs::write(&policy, "an earlier policy").unwrap();
    let linked = dir.join("linked.safetensors");
    std::fs::hard_link(&policy, &linked).unwrap();
    ok(train(&["--force"]));
    assert_eq!(std::fs::read(&linked).unwrap(), b"an earlier policy");
    assert_ne!(std::fs::read(&policy).unwrap(), b"an earlier policy");
    let points: Value = serde_json::from_str(&std::fs::read_to_string(&curve).unwrap()).unwrap();
    assert_eq!(points.as_array().unwrap().len(), 1, "{points}");
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).ok();
}
