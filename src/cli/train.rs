//! `grflow train`: trains the GR transformer on a trace's user sequences
//! and writes a model directory.

use std::path::PathBuf;
use std::time::Duration;

use grflow_train::artifact::{
    DatasetInfo, MODEL_JSON, ModelJson, Vocabulary, items_hash, write_model_dir,
};
use grflow_train::checkpoint::{Checkpoint, UNKNOWN_COMMIT, recording_commits, with_commit};
use grflow_train::data::Dataset;
use grflow_train::fit::{EpochReport, Observer, TrainConfig, fit};
use indicatif::{ProgressBar, ProgressStyle};

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace directory (from `grflow import` or `grflow gen-trace`); its
    /// users table holds the sequences.
    #[arg(long)]
    pub trace: PathBuf,
    /// Model directory to write (checkpoints go to OUT/checkpoint).
    #[arg(long, default_value = "model")]
    pub out: PathBuf,
    /// Seeds initialisation, batches and negatives [default: 42; with
    /// --resume the checkpoint's, and another value is refused].
    #[arg(long)]
    pub seed: Option<u64>,
    /// Continue the checkpoint in this directory (e.g. OUT/checkpoint).
    #[arg(long)]
    pub resume: Option<PathBuf>,
    /// Upper bound on epochs (early stopping usually ends the run first).
    #[arg(long)]
    pub max_epochs: Option<usize>,
    /// Replace the model and checkpoint already in OUT (without it, a new
    /// run refuses an OUT that holds one: use --resume to continue it).
    #[arg(long)]
    pub force: bool,
    /// No progress display.
    #[arg(long)]
    pub quiet: bool,
}

struct Bar {
    bar: ProgressBar,
}

impl Observer for Bar {
    fn step(&mut self, epoch: usize, step: usize, steps: usize, loss: f64, tps: f64) {
        if step == 1 {
            self.bar.set_length(steps as u64);
            self.bar.set_position(0);
            self.bar.set_prefix(format!("epoch {epoch}"));
        }
        self.bar.set_position(step as u64);
        self.bar
            .set_message(format!("loss {loss:.4}  {tps:.0} tokens/s"));
    }

    fn epoch(&mut self, r: &EpochReport, best_epoch: usize) {
        let line = format!(
            "epoch {:>3}  loss {:.4}  valid HR@10 {:.4} NDCG@10 {:.4}  {:.0} tokens/s  {:.1} s{}",
            r.epoch,
            r.loss,
            r.valid.hr_at_10,
            r.valid.ndcg_at_10,
            r.tokens_per_s,
            r.secs,
            if best_epoch == r.epoch { "  *best" } else { "" }
        );
        // A hidden bar (not a terminal, or --quiet) prints nothing.
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }
}

/// The commit this binary was built from (build.rs; "unknown" outside git).
fn commit() -> String {
    env!("GRFLOW_COMMIT").to_string()
}

/// Refuses an `--out` that would overwrite the trace or, on a new run, a
/// model or checkpoint that is there already.
fn check_out(args: &Args) -> anyhow::Result<()> {
    let out = &args.out;
    let same = match (out.canonicalize(), args.trace.canonicalize()) {
        (Ok(o), Ok(t)) => o == t,
        _ => false,
    };
    if same || TRACE_FILES.iter().any(|f| out.join(f).exists()) {
        return Err(InputError::from_display(format!(
            "--out {}: holds a trace (writing the model there would replace its items.parquet); \
             choose another directory",
            out.display()
        )));
    }
    let existing = [MODEL_JSON, CHECKPOINT_STATE]
        .into_iter()
        .find(|f| out.join(f).exists());
    // Resuming continues this directory's own run only: a checkpoint from
    // elsewhere would replace the run held here (its checkpoint files are
    // pruned on the first save).
    let resumes_here = args.resume.as_ref().is_some_and(|r| {
        match (r.canonicalize(), out.join("checkpoint").canonicalize()) {
            (Ok(a), Ok(b)) => a == b,
            _ => false,
        }
    });
    if let Some(f) = existing
        && !resumes_here
        && !args.force
    {
        return Err(InputError::from_display(format!(
            "--out {}: already holds {f} from an earlier run; continue it with --resume {}, \
             or pass --force to replace it{}",
            out.display(),
            out.join("checkpoint").display(),
            match &args.resume {
                Some(r) => format!(" (--resume {} is another run's)", r.display()),
                None => String::new(),
            }
        )));
    }
    Ok(())
}

/// A trace directory's own files (a model directory has items.parquet too).
const TRACE_FILES: [&str; 2] = ["requests.parquet", "users.parquet"];

/// What says OUT holds a checkpoint to resume.
const CHECKPOINT_STATE: &str = "checkpoint/state.json";

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.max_epochs == Some(0) {
        return Err(InputError::from_display("--max-epochs: must be at least 1"));
    }
    check_out(&args)?;
    let data = Dataset::from_trace(&args.trace).map_err(InputError::from_display)?;
    let (resume, commits) = match &args.resume {
        Some(dir) => {
            let (ck, commits) =
                Checkpoint::load_with_commits(dir).map_err(InputError::from_display)?;
            (Some(ck), commits)
        }
        None => (None, Vec::new()),
    };
    // A resumed run keeps its checkpoint's seed: every epoch's batches and
    // negatives derive from it, so another one would not continue that run.
    if let (Some(given), Some(ck)) = (args.seed, &resume)
        && given != ck.state.config.seed
    {
        return Err(InputError::from_display(format!(
            "--seed {given}: the checkpoint was trained with seed {}, and a resumed run \
             keeps its seed (drop --seed, or start a new run with --force)",
            ck.state.config.seed
        )));
    }
    // Made once the trace and checkpoint are read, before the first epoch
    // (not at its checkpoint). A run that fails removes it, unless it
    // saved a checkpoint there: epochs done are resumed, not redone.
    let out = super::OutDir::create(&args.out)?;
    let trained = train(&args, &data, resume, commits);
    if trained.is_ok() || args.out.join(CHECKPOINT_STATE).is_file() {
        out.keep();
    }
    trained
}

/// The epoch limit: `--max-epochs`, else a resumed run's own (the run
/// the checkpoint continues, not the default), else the default. Sets it
/// in the checkpoint too, so that a later resume of an extended run keeps
/// the extension.
fn max_epochs(args: &Args, resume: Option<&mut Checkpoint>, default: usize) -> usize {
    let Some(ck) = resume else {
        return args.max_epochs.unwrap_or(default);
    };
    let (done, theirs) = (ck.state.epochs_done, ck.state.config.max_epochs);
    let limit = match args.max_epochs {
        None => {
            eprintln!(
                "resuming after epoch {done} with the checkpoint's --max-epochs {theirs} \
                 (pass --max-epochs to change it)"
            );
            theirs
        }
        Some(given) if given != theirs => {
            eprintln!(
                "resuming after epoch {done} with --max-epochs {given}; the checkpoint's run \
                 had {theirs}"
            );
            given
        }
        Some(given) => given,
    };
    ck.state.config.max_epochs = limit;
    limit
}

/// Warns when `this` build resumes a checkpoint trained by another: the
/// model then comes from more than one build, and model.json lists each.
fn warn_other_builds(commits: &[String], this: &str) {
    let others: Vec<&str> = commits
        .iter()
        .map(String::as_str)
        .filter(|c| *c != this)
        .collect();
    if others.is_empty() {
        return;
    }
    let unknown = if others.contains(&UNKNOWN_COMMIT) {
        " (\"unknown\": a checkpoint from before builds were recorded)"
    } else {
        ""
    };
    eprintln!(
        "warning: the checkpoint was trained by build {}{unknown}, this is build {this}; \
         model.json lists every build in trained_by_commits",
        others.join(", ")
    );
}

/// Trains on `data` into `args.out`, which exists; `commits` are the
/// builds that trained the checkpoint resumed (none for a new run).
fn train(
    args: &Args,
    data: &Dataset,
    mut resume: Option<Checkpoint>,
    commits: Vec<String>,
) -> anyhow::Result<()> {
    let seed = resume
        .as_ref()
        .map(|c| c.state.config.seed)
        .or(args.seed)
        .unwrap_or(42);
    let mut cfg = TrainConfig::defaults(seed);
    // Retrieve requests decode the trace's semantic IDs: serving refuses a
    // model whose codebook differs.
    if let Some(c) = data.codebook_size {
        cfg.model.codebook_size = c;
    }
    cfg.max_epochs = max_epochs(args, resume.as_mut(), cfg.max_epochs);
    let this = commit();
    warn_other_builds(&commits, &this);
    let resumed_epochs = resume.as_ref().map_or(0, |ck| ck.state.epochs_done);
    if let Some(ck) = &resume {
        let done = ck.state.epochs_done;
        let stopped = done - ck.state.best_epoch >= cfg.patience;
        if done >= cfg.max_epochs || stopped {
            let why = if stopped {
                format!(
                    "it stopped early, {} epochs without a better one",
                    cfg.patience
                )
            } else {
                format!("--max-epochs is {}: raise it to train on", cfg.max_epochs)
            };
            eprintln!(
                "warning: the checkpoint has run {done} epochs ({why}); no epoch runs, and the \
                 model is written from its best epoch {}",
                ck.state.best_epoch
            );
        }
    }
    let bar = if args.quiet {
        ProgressBar::hidden()
    } else {
        ProgressBar::new(1)
    };
    bar.set_style(
        ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} {msg} ({elapsed})")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.enable_steady_tick(Duration::from_millis(500));
    let ckpt = args.out.join("checkpoint");
    let mut obs = Bar { bar: bar.clone() };
    // Every checkpoint this run saves holds an epoch trained by this build.
    let fitted = recording_commits(with_commit(commits.clone(), &this), || {
        fit(data, &cfg, resume, Some(&ckpt), &mut obs)
    })
    .map_err(|e| match e {
        grflow_train::TrainError::Invalid(_) => InputError::from_display(e),
        other => anyhow::Error::new(other),
    })?;
    bar.finish_and_clear();
    let best = fitted
        .history
        .iter()
        .find(|r| r.epoch == fitted.best_epoch)
        .map(|r| r.valid)
        .unwrap_or_default();
    let json = ModelJson {
        model_version: String::new(),
        arch: cfg.arch.clone(),
        model_config: cfg.model.clone(),
        max_history: cfg.max_history,
        vocabulary: Vocabulary {
            items: data.n_items,
            items_hash: items_hash(&data.catalog),
            tables: vec![0],
        },
        dataset: DatasetInfo {
            // Absolute: the model may be read from anywhere later.
            trace: args
                .trace
                .canonicalize()
                .unwrap_or_else(|_| args.trace.clone())
                .display()
                .to_string(),
            fingerprint: data.fingerprint(),
            users: data.users.len(),
        },
        seed: cfg.seed,
        hyper_parameters: cfg.clone(),
        // This build writes the model; the epochs may be older builds'.
        trained_by_commits: if fitted.history.len() > resumed_epochs {
            with_commit(commits, &this)
        } else {
            commits
        },
        commit: this,
        epochs: fitted.history.len(),
        best_epoch: fitted.best_epoch,
        valid: best,
        history: fitted.history.clone(),
        training_secs: fitted.train_secs,
    };
    let version = write_model_dir(&args.out, &fitted.params, &data.catalog, json)?;
    let tps = fitted.history.iter().map(|r| r.tokens_per_s).sum::<f64>()
        / fitted.history.len().max(1) as f64;
    println!(
        "trained {version}: {} epochs (best {}), valid HR@10 {:.4} NDCG@10 {:.4}, {:.0} tokens/s, {:.1} s -> {}",
        fitted.history.len(),
        fitted.best_epoch,
        best.hr_at_10,
        best.ndcg_at_10,
        tps,
        fitted.train_secs,
        args.out.display()
    );
    Ok(())
}
