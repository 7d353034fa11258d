//! The training loop: shuffled user batches, data-parallel gradients over
//! a fixed split of each batch (so a seed gives the same model on one
//! machine), AdamW, validation NDCG@10 after every epoch, early stopping,
//! and a checkpoint after every epoch that `resume` continues.

use grflow_kernels::history::HistoryCut;
use std::path::Path;
use std::time::Instant;

use grflow_kernels::{CpuBackend, ModelConfig};
use rand::seq::SliceRandom;
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::adamw::{AdamW, AdamWConfig};
use crate::checkpoint::Checkpoint;
use crate::data::{Dataset, eval_question, train_sequence};
use crate::error::TrainError;
use crate::metrics::{MetricSum, RankMetrics, Standing};
use crate::net::{self, Dropout, Sequence};
use crate::params::Params;

/// Every hyper-parameter of a training run (recorded in model.json). One
/// set of defaults serves every dataset.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TrainConfig {
    /// The kernels preset the dimensions come from.
    pub arch: String,
    pub model: ModelConfig,
    /// Training sequences keep their most recent `max_history` inputs;
    /// serving truncates histories to the same length.
    pub max_history: usize,
    /// Sampled negatives per target position.
    pub negatives: usize,
    /// Standard deviation of the item rows at init (1 in configs written
    /// before it existed). Small rows let AdamW's steps move an item that
    /// appears a few times per epoch; rows of scale 1 stay near random and
    /// the model learns popularity only.
    #[serde(default = "one")]
    pub item_init_std: f32,
    /// Dropout rate on the input rows and residual branches in training
    /// (0 in configs written before it existed).
    #[serde(default)]
    pub dropout: f32,
    pub batch_users: usize,
    pub adamw: AdamWConfig,
    pub max_epochs: usize,
    /// Stop after this many epochs without a better validation NDCG@10.
    pub patience: usize,
    /// Validation questions per epoch (a fixed seeded subset of users).
    pub val_users: usize,
    /// Negatives of the validation protocol (SASRec's 100).
    pub val_negatives: usize,
    /// Gradient threads; part of the result (the batch split depends on it).
    pub threads: usize,
    pub seed: u64,
}

impl TrainConfig {
    /// The defaults: `small` dimensions with item-id table only.
    pub fn defaults(seed: u64) -> Self {
        let mut model = ModelConfig::preset("small").expect("small preset");
        model.n_tables = 1;
        TrainConfig {
            arch: "small".into(),
            model,
            max_history: 50,
            negatives: 8,
            item_init_std: 0.3,
            dropout: 0.25,
            batch_users: 128,
            adamw: AdamWConfig {
                lr: 3e-3,
                ..AdamWConfig::default()
            },
            max_epochs: 200,
            patience: 5,
            val_users: 5000,
            val_negatives: 100,
            threads: 2,
            seed,
        }
    }
}

impl TrainConfig {
    /// Refuses settings a run cannot train with, naming the field: a zero
    /// `batch_users` would divide by zero, a zero `patience` or
    /// `max_history` would "train" on nothing and report success.
    pub fn validate(&self) -> Result<(), TrainError> {
        let positive = [
            ("max_history", self.max_history),
            ("negatives", self.negatives),
            ("batch_users", self.batch_users),
            ("max_epochs", self.max_epochs),
            ("patience", self.patience),
            ("val_users", self.val_users),
            ("val_negatives", self.val_negatives),
            ("threads", self.threads),
        ];
        if let Some((name, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(TrainError::Invalid(format!("{name}: must be at least 1")));
        }
        if !(0.0..1.0).contains(&self.dropout) {
            return Err(TrainError::Invalid(format!(
                "dropout: {} is not in [0, 1)",
                self.dropout
            )));
        }
        if !(self.item_init_std.is_finite() && self.item_init_std > 0.0) {
            return Err(TrainError::Invalid(format!(
                "item_init_std: {} is not a positive number",
                self.item_init_std
            )));
        }
        if !(self.adamw.lr.is_finite() && self.adamw.lr > 0.0) {
            return Err(TrainError::Invalid(format!(
                "adamw.lr: {} is not a positive number",
                self.adamw.lr
            )));
        }
        Ok(())
    }
}

fn one() -> f32 {
    1.0
}

/// One finished epoch.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct EpochReport {
    pub epoch: usize,
    pub loss: f64,
    pub valid: RankMetrics,
    /// Input rows (history, candidate and instruction tokens) per second
    /// of forward + backward + update.
    pub tokens_per_s: f64,
    pub secs: f64,
}

/// What the caller sees while training runs.
pub trait Observer {
    fn step(&mut self, epoch: usize, step: usize, steps: usize, loss: f64, tokens_per_s: f64);
    fn epoch(&mut self, report: &EpochReport, best_epoch: usize);
}

/// An observer that ignores everything.
#[derive(Debug, Default)]
pub struct Quiet;

impl Observer for Quiet {
    fn step(&mut self, _: usize, _: usize, _: usize, _: f64, _: f64) {}
    fn epoch(&mut self, _: &EpochReport, _: usize) {}
}

/// The result of [`fit`].
#[derive(Clone, Debug)]
pub struct Fitted {
    /// The weights of the best validation epoch.
    pub params: Params,
    pub best_epoch: usize,
    pub history: Vec<EpochReport>,
    pub train_secs: f64,
}

/// Scores `seqs` with the trainer's forward on `threads` threads.
pub fn score(p: &Params, seqs: &[Sequence], threads: usize) -> Result<Vec<Vec<f32>>, TrainError> {
    let be = CpuBackend::default();
    let chunk = seqs.len().div_ceil(threads.max(1)).max(1);
    let parts: Vec<Result<Vec<Vec<f32>>, TrainError>> = std::thread::scope(|s| {
        let hs: Vec<_> = seqs
            .chunks(chunk)
            .map(|c| {
                let be = &be;
                s.spawn(move || {
                    let mut out = Vec::new();
                    // Small sub-batches keep the activations in cache.
                    for sub in c.chunks(64) {
                        out.extend(net::logits(p, sub, be)?);
                    }
                    Ok(out)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("scoring thread"))
            .collect()
    });
    let mut out = Vec::with_capacity(seqs.len());
    for p in parts {
        out.extend(p?);
    }
    Ok(out)
}

/// Sampled validation metrics on a fixed subset of users.
pub fn validate(p: &Params, data: &Dataset, cfg: &TrainConfig) -> Result<RankMetrics, TrainError> {
    let mut users: Vec<usize> = (0..data.users.len())
        .filter(|&u| data.users[u].valid().is_some())
        .collect();
    users.shuffle(&mut ChaCha8Rng::seed_from_u64(cfg.seed ^ 0x7a11d));
    users.truncate(cfg.val_users);
    users.sort_unstable();
    let qs: Vec<Sequence> = users
        .iter()
        .map(|&u| {
            let user = &data.users[u];
            let (h, t) = user.valid().expect("filtered");
            eval_question(
                user,
                h,
                t,
                data.n_items,
                HistoryCut::new(cfg.max_history, p.cfg.block_size),
                cfg.val_negatives,
                cfg.seed ^ 0x5a1d,
            )
        })
        .collect();
    let mut m = MetricSum::default();
    for s in score(p, &qs, cfg.threads)? {
        m.add_standing(Standing::of_first(&s));
    }
    Ok(m.mean())
}

/// One batch's loss and gradient, split over threads in a fixed way; the
/// parts are summed in order, so the result does not depend on timing.
fn batch_grad(
    p: &Params,
    seqs: &[Sequence],
    threads: usize,
    dropout: f32,
    seed: u64,
) -> Result<(f64, Params), TrainError> {
    let targets: usize = seqs.iter().map(|s| s.targets.len()).sum();
    let chunk = seqs.len().div_ceil(threads.max(1)).max(1);
    let parts: Vec<Result<(f64, Params, usize), TrainError>> = std::thread::scope(|s| {
        let hs: Vec<_> = seqs
            .chunks(chunk)
            .enumerate()
            .map(|(part, c)| {
                s.spawn(move || {
                    let n: usize = c.iter().map(|s| s.targets.len()).sum();
                    let drop = Dropout {
                        rate: dropout,
                        seed: seed ^ (part as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    };
                    let (l, g) = net::loss_and_grad(p, c, &CpuBackend::default(), Some(drop))?;
                    Ok((l, g, n))
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| h.join().expect("gradient thread"))
            .collect()
    });
    let mut total: Option<Params> = None;
    let mut loss = 0.0;
    for part in parts {
        let (l, g, n) = part?;
        let w = n as f32 / targets.max(1) as f32;
        loss += l * w as f64;
        match &mut total {
            None => {
                let mut g = g;
                g.trainable_mut()
                    .into_iter()
                    .for_each(|t| t.iter_mut().for_each(|v| *v *= w));
                total = Some(g);
            }
            Some(acc) => {
                for (a, b) in acc.trainable_mut().into_iter().zip(g.trainable()) {
                    a.iter_mut().zip(b.1).for_each(|(x, y)| *x += w * y);
                }
            }
        }
    }
    Ok((loss, total.unwrap_or_else(|| p.zeros_like())))
}

/// Trains until validation NDCG@10 stops improving (or `max_epochs`),
/// writing a checkpoint into `ckpt_dir` after every epoch. `resume`
/// continues a checkpoint of the same data and config.
pub fn fit(
    data: &Dataset,
    cfg: &TrainConfig,
    resume: Option<Checkpoint>,
    ckpt_dir: Option<&Path>,
    obs: &mut dyn Observer,
) -> Result<Fitted, TrainError> {
    cfg.validate()?;
    let mut ck = match resume {
        Some(ck) => {
            ck.check(cfg, &data.fingerprint(), data.n_items)?;
            ck
        }
        None => fresh(data, cfg)?,
    };
    let train_users = trainable_users(data)?;
    while ck.state.epochs_done < cfg.max_epochs
        && ck.state.epochs_done - ck.state.best_epoch < cfg.patience
    {
        let epoch = ck.state.epochs_done + 1;
        let t0 = Instant::now();
        let trained = train_epoch(&mut ck, data, cfg, &train_users, epoch, obs)?;
        let valid = validate(&ck.params, data, cfg)?;
        let report = EpochReport {
            epoch,
            loss: trained.mean_loss,
            valid,
            tokens_per_s: trained.tokens as f64 / trained.secs.max(1e-9),
            secs: t0.elapsed().as_secs_f64(),
        };
        ck.state.epochs_done = epoch;
        ck.state.train_secs += report.secs;
        if valid.ndcg_at_10 > ck.state.best_ndcg {
            ck.state.best_ndcg = valid.ndcg_at_10;
            ck.state.best_epoch = epoch;
            ck.best = ck.params.clone();
        }
        obs.epoch(&report, ck.state.best_epoch);
        ck.state.history.push(report);
        if let Some(dir) = ckpt_dir {
            ck.save(dir)?;
        }
    }
    Ok(Fitted {
        params: ck.best,
        best_epoch: ck.state.best_epoch,
        history: ck.state.history,
        train_secs: ck.state.train_secs,
    })
}

/// A new run's checkpoint before its first epoch: initialised parameters
/// (item rows scaled by `item_init_std`) and a fresh optimiser.
fn fresh(data: &Dataset, cfg: &TrainConfig) -> Result<Checkpoint, TrainError> {
    let mut params = Params::init(cfg.model.clone(), data.n_items, cfg.seed)?;
    params.scale_items(cfg.item_init_std);
    Ok(Checkpoint {
        opt: AdamW::new(cfg.adamw.clone(), &params),
        best: params.clone(),
        params,
        state: crate::checkpoint::State {
            config: cfg.clone(),
            fingerprint: data.fingerprint(),
            epochs_done: 0,
            best_epoch: 0,
            best_ndcg: f64::NEG_INFINITY,
            history: Vec::new(),
            train_secs: 0.0,
        },
    })
}

/// The users an epoch trains on (2 or more training items); refused when
/// there are none, or when no user can be asked a validation question.
fn trainable_users(data: &Dataset) -> Result<Vec<usize>, TrainError> {
    let users: Vec<usize> = (0..data.users.len())
        .filter(|&u| data.users[u].train_items().len() >= 2)
        .collect();
    if users.is_empty() {
        return Err(TrainError::Invalid(
            "no user has 2 training items (a user of 3 or more items keeps 2 of them for validation and test)"
                .to_string(),
        ));
    }
    if !data.users.iter().any(|u| u.valid().is_some()) {
        // Early stopping and the best epoch would be chosen on nothing.
        return Err(TrainError::Invalid(
            "no user has the 3 items a validation question needs (history, validation item, test item)"
                .to_string(),
        ));
    }
    Ok(users)
}

/// What one epoch's steps did.
struct EpochTrained {
    mean_loss: f64,
    tokens: usize,
    /// Seconds of the steps (validation excluded).
    secs: f64,
}

/// One pass over `users` in batches of `batch_users`, an optimiser step
/// each, reporting every step to `obs`.
fn train_epoch(
    ck: &mut Checkpoint,
    data: &Dataset,
    cfg: &TrainConfig,
    users: &[usize],
    epoch: usize,
    obs: &mut dyn Observer,
) -> Result<EpochTrained, TrainError> {
    let t0 = Instant::now();
    // Every epoch's randomness comes from (seed, epoch): a resumed run
    // draws what the uninterrupted one would have.
    let mut rng = ChaCha8Rng::seed_from_u64(cfg.seed.wrapping_mul(1_000_003) ^ epoch as u64);
    let mut order = users.to_vec();
    order.shuffle(&mut rng);
    let steps = order.len().div_ceil(cfg.batch_users);
    let (mut loss_sum, mut tokens) = (0.0, 0usize);
    for (step, batch) in order.chunks(cfg.batch_users).enumerate() {
        let seqs: Vec<Sequence> = batch
            .iter()
            .filter_map(|&u| {
                train_sequence(
                    &data.users[u],
                    data.n_items,
                    cfg.max_history,
                    cfg.negatives,
                    &mut rng,
                )
            })
            .collect();
        tokens += seqs
            .iter()
            .map(|s| s.history.len() + s.targets.iter().map(|t| t.cands.len() + 1).sum::<usize>())
            .sum::<usize>();
        let seed = rng.random::<u64>();
        let (loss, g) = batch_grad(&ck.params, &seqs, cfg.threads, cfg.dropout, seed)?;
        if !loss.is_finite() {
            return Err(diverged(ck.state.epochs_done, loss, epoch, step + 1, steps));
        }
        ck.opt.update(&mut ck.params, &g);
        loss_sum += loss;
        let el = t0.elapsed().as_secs_f64().max(1e-9);
        obs.step(
            epoch,
            step + 1,
            steps,
            loss_sum / (step + 1) as f64,
            tokens as f64 / el,
        );
    }
    Ok(EpochTrained {
        mean_loss: loss_sum / steps as f64,
        tokens,
        secs: t0.elapsed().as_secs_f64(),
    })
}

/// A loss that stopped being finite at `step` of `steps`, with `done`
/// epochs in the checkpoint. Epochs replay the same batches from (seed,
/// epoch): a resume diverges again, so the error says what does not.
fn diverged(done: usize, loss: f64, epoch: usize, step: usize, steps: usize) -> TrainError {
    let way_out = if done > 0 {
        format!(
            "; the checkpoint holds the {done} epochs before: --resume it with \
             --max-epochs {done} to write the best of them, or train again with \
             another --seed"
        )
    } else {
        "; train again with another --seed".to_string()
    };
    TrainError::Invalid(format!(
        "loss became {loss} at epoch {epoch} step {step} of {steps}{way_out}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_diverged_run_says_how_to_get_the_epochs_before() {
        let first = diverged(0, f64::NAN, 1, 3, 10).to_string();
        assert!(
            first.contains("loss became NaN at epoch 1 step 3 of 10")
                && first.ends_with("train again with another --seed"),
            "{first}"
        );
        let later = diverged(4, f64::INFINITY, 5, 1, 10).to_string();
        assert!(
            later.contains("holds the 4 epochs before") && later.contains("--max-epochs 4"),
            "{later}"
        );
    }

    #[test]
    fn configs_written_before_init_std_and_dropout_load_with_the_old_behaviour() {
        let mut v = serde_json::to_value(TrainConfig::defaults(1)).unwrap();
        let o = v.as_object_mut().unwrap();
        o.remove("item_init_std");
        o.remove("dropout");
        let old: TrainConfig = serde_json::from_value(v).unwrap();
        assert_eq!((old.item_init_std, old.dropout), (1.0, 0.0));
    }

    #[test]
    fn a_config_that_cannot_train_is_refused_naming_its_field() {
        assert!(TrainConfig::defaults(1).validate().is_ok());
        type Break = fn(&mut TrainConfig);
        let cases: [(&str, Break); 5] = [
            ("batch_users", |c| c.batch_users = 0),
            ("patience", |c| c.patience = 0),
            ("max_history", |c| c.max_history = 0),
            ("dropout", |c| c.dropout = 1.0),
            ("adamw.lr", |c| c.adamw.lr = f32::NAN),
        ];
        for (field, break_it) in cases {
            let mut cfg = TrainConfig::defaults(1);
            break_it(&mut cfg);
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.starts_with(field), "{field}: {err}");
        }
    }
}
