//! `grflow eval`: SASRec's sampled-100 protocol (and optionally the full
//! catalog) on a trace's test items, scored through the serving kernels,
//! beside a popularity baseline.

use std::path::PathBuf;

use grflow_kernels::bench::gemm_peak_gflops;
use grflow_train::artifact::{items_hash, load_model_dir};
use grflow_train::data::Dataset;
use grflow_train::eval::{EvalOptions, Subject, evaluate};
use indicatif::{ProgressBar, ProgressStyle};

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model directory written by `grflow train`.
    #[arg(long)]
    pub model: PathBuf,
    /// The trace the model was trained on.
    #[arg(long)]
    pub trace: PathBuf,
    /// Also rank the whole catalog (slow: FULL_USERS users).
    #[arg(long)]
    pub full: bool,
    /// Test users of the full-catalog ranking.
    #[arg(long, default_value_t = 1000, requires = "full")]
    pub full_users: usize,
    /// Seeds the sampled negatives of each test question.
    #[arg(long, default_value_t = EvalOptions::default().seed)]
    pub seed: u64,
    /// Print one JSON object.
    #[arg(long)]
    pub json: bool,
    /// Evaluate on a trace other than the one the model was trained on
    /// (same catalog). Its test items may then be items the model trained
    /// on, which inflates every figure.
    #[arg(long)]
    pub other_trace: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let dir = load_model_dir(&args.model).map_err(InputError::from_display)?;
    if dir.files_version != dir.json.model_version {
        return Err(InputError::from_display(format!(
            "{}: model.json says model_version {} but the files hash to {} \
             (a copy in progress, or files of different models)",
            args.model.display(),
            dir.json.model_version,
            dir.files_version
        )));
    }
    let data = Dataset::from_trace(&args.trace).map_err(InputError::from_display)?;
    let trained_on = &dir.json.dataset.fingerprint;
    if data.fingerprint() != *trained_on {
        let what = format!(
            "{}: not the trace the model was trained on (its sequences hash to {}, the \
             model's training trace {} to {trained_on})",
            args.trace.display(),
            data.fingerprint(),
            dir.json.dataset.trace
        );
        if !args.other_trace {
            return Err(InputError::from_display(format!(
                "{what}; its test items may be items the model trained on. Pass --other-trace \
                 to evaluate anyway"
            )));
        }
        eprintln!("warning: {what}");
    }
    if items_hash(&data.catalog) != dir.json.vocabulary.items_hash {
        return Err(InputError::from_display(format!(
            "{}: the trace's {} items (hash {}) are not the model's {} (hash {})",
            args.trace.display(),
            data.n_items,
            items_hash(&data.catalog),
            dir.json.vocabulary.items,
            dir.json.vocabulary.items_hash
        )));
    }
    if args.full && args.full_users == 0 {
        return Err(InputError::from_display(
            "--full-users must be >= 1 (0 users would print zeros as if measured)",
        ));
    }
    let opts = EvalOptions {
        seed: args.seed,
        full: args.full,
        full_users: args.full_users,
        ..EvalOptions::default()
    };
    let gemm = gemm_peak_gflops();
    let bar = if args.json {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(1)
    };
    bar.set_style(
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    let subject = Subject {
        params: &dir.params,
        max_history: dir.json.max_history,
        arch: &dir.json.arch,
        model_version: &dir.json.model_version,
    };
    let report = evaluate(subject, &data, &opts, gemm, &mut |stage, done, total| {
        bar.set_message(stage);
        bar.set_length(total as u64);
        bar.set_position(done as u64);
    })
    .map_err(|e| match e {
        grflow_train::TrainError::Invalid(_) => InputError::from_display(e),
        other => anyhow::Error::new(other),
    })?;
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
        return Ok(());
    }
    let row = |name: &str, m: &grflow_train::metrics::RankMetrics| {
        println!(
            "{name:<24} HR@10 {:.4}  NDCG@10 {:.4}  MRR@10 {:.4}",
            m.hr_at_10, m.ndcg_at_10, m.mrr_at_10
        )
    };
    println!(
        "{} ({}), {} test users",
        report.model_version, report.arch, report.users
    );
    row("model, sampled 100", &report.sampled_100);
    row("popularity, sampled 100", &report.popularity.sampled_100);
    if let (Some(f), Some(pf)) = (&report.full, &report.popularity.full) {
        row(&format!("model, full ({} users)", f.users), &f.metrics);
        row("popularity, full", &pf.metrics);
    }
    println!(
        "latency per request p50 {:.2} ms p99 {:.2} ms; GEMM {:.1} GFLOP/s (1 thread)",
        report.latency_ms.p50, report.latency_ms.p99, report.gemm_gflops
    );
    Ok(())
}
