//! The online predictor: every request becomes a training sample whose label
//! (the reuse interval) is filled in when its key comes back; every
//! `retrain_every` samples a new model is fitted on the last `window`
//! samples, using only labels known at that moment (it never sees the
//! future). Samples still unlabeled and older than the 90th percentile of
//! the known intervals are labelled "not soon" (2 × the window span, as LRB
//! does); younger unlabeled ones are left out.
//!
//! Training runs inline with a fixed lag before the new version is used
//! (reproducible: benches, tests), or on a background thread (the node).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::mpsc::{Receiver, TryRecvError, channel};
use std::time::Instant;

use serde::Deserialize;

use super::features::{AccessContext, FeatureRow, FeatureTracker};
use super::gbdt::{GbdtConfig, NextAccessModel};
use crate::eviction::{Key, KeyMap, key_map};

/// How a new model version reaches the predictions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Training {
    /// Train inline; the version is used from `lag` requests after the
    /// trigger (Async modelled as a fixed lag; 0 = Sync).
    Inline { lag: u64 },
    /// Train on a background thread; the version is used once it is ready.
    Background,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PredictorConfig {
    /// New samples between retrainings (LCR: 1,000).
    pub retrain_every: usize,
    /// Sliding window of samples trained on (LCR: 100,000).
    pub window: usize,
    pub gbdt: GbdtConfig,
    pub training: Training,
}

impl Default for PredictorConfig {
    fn default() -> Self {
        Self {
            retrain_every: 1_000,
            window: 100_000,
            gbdt: GbdtConfig::default(),
            training: Training::Inline { lag: 1_000 },
        }
    }
}

/// One trained model version.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct VersionInfo {
    /// 1, 2, ...; 0 means "no model yet".
    pub version: u32,
    /// Request time of the last sample it was trained with.
    pub trained_at: u64,
    /// First request time at which it is used.
    pub available_at: u64,
    pub samples: usize,
    pub train_ms: f64,
}

#[derive(Debug, Clone, Copy)]
struct Sample {
    t: u64,
    key: Key,
    row: FeatureRow,
    /// Reuse interval, once the key came back.
    label: Option<u64>,
}

type Fitted = (Vec<FeatureRow>, Vec<f64>);

/// Features, samples, retraining and versioned models of one cache.
#[derive(Debug)]
pub struct OnlinePredictor {
    cfg: PredictorConfig,
    tracker: FeatureTracker,
    samples: VecDeque<Sample>,
    /// Latest sample time per key, to label it when the key comes back.
    last_sample: KeyMap<Key, u64>,
    since_train: usize,
    /// By version - 1 - `dropped`; under `Training::Background` (serving)
    /// only the version in use and later ones are kept: a node retrains
    /// about once a second for months. Inline training (the cache bench)
    /// keeps them all.
    models: Vec<Arc<NextAccessModel>>,
    versions: Vec<VersionInfo>,
    /// Versions dropped from the front of `models` and `versions`.
    dropped: usize,
    /// Version in use (0 = none).
    current: u32,
    background: Option<Receiver<(VersionInfo, Option<NextAccessModel>)>>,
    train_ms_total: f64,
}

impl OnlinePredictor {
    pub fn new(cfg: PredictorConfig) -> Self {
        Self {
            tracker: FeatureTracker::new(cfg.window as u64),
            samples: VecDeque::with_capacity(cfg.window.min(1 << 20)),
            last_sample: key_map(),
            since_train: 0,
            models: Vec::new(),
            versions: Vec::new(),
            dropped: 0,
            current: 0,
            background: None,
            train_ms_total: 0.0,
            cfg,
        }
    }

    /// Records a request and returns its feature row. May retrain.
    pub fn observe(&mut self, key: Key, now: u64, ctx: AccessContext) -> FeatureRow {
        self.promote(now);
        let row = self.tracker.observe(key, now, ctx);
        if let Some(prev) = self.last_sample.insert(key, now) {
            // Found by time, not by offset: a cache ticks on every lookup but
            // observes only hits and inserts, so times have gaps.
            let first = self.samples.partition_point(|s| s.t < prev);
            if let Some(s) = (self.samples.range_mut(first..))
                .take_while(|s| s.t == prev)
                .find(|s| s.key == key)
            {
                s.label = Some(now - prev);
            }
        }
        self.samples.push_back(Sample {
            t: now,
            key,
            row,
            label: None,
        });
        while self.samples.len() > self.cfg.window {
            let old = self.samples.pop_front().expect("non-empty");
            if self.last_sample.get(&old.key) == Some(&old.t) {
                self.last_sample.remove(&old.key);
            }
        }
        self.since_train += 1;
        if self.since_train >= self.cfg.retrain_every {
            self.since_train = 0;
            self.retrain(now);
        }
        row
    }

    /// The version in use now (0 = none yet).
    pub fn current_version(&self) -> u32 {
        self.current
    }

    /// The versions kept, oldest first: every one trained under inline
    /// training, the one in use and later ones under background training.
    pub fn versions(&self) -> &[VersionInfo] {
        &self.versions
    }

    /// Versions trained so far.
    pub fn versions_trained(&self) -> usize {
        self.dropped + self.versions.len()
    }

    /// Total training time so far.
    pub fn train_ms_total(&self) -> f64 {
        self.train_ms_total
    }

    /// A trained model by version (1-based); `None` for one dropped as
    /// superseded in background training.
    pub fn model(&self, version: u32) -> Option<&Arc<NextAccessModel>> {
        self.models
            .get((version as usize).checked_sub(1 + self.dropped)?)
    }

    /// Predicted next-access times of rows observed at times `at` with the
    /// version in use; `None` before the first model.
    pub fn predict_next(&self, rows: &[FeatureRow], at: &[u64]) -> Option<Vec<f64>> {
        let model = self.model(self.current)?;
        Some(
            model
                .predict_intervals(rows)
                .into_iter()
                .zip(at)
                .map(|(i, &t)| t as f64 + i)
                .collect(),
        )
    }

    fn promote(&mut self, now: u64) {
        if let Some(rx) = &self.background {
            match rx.try_recv() {
                Ok((mut info, model)) => {
                    self.background = None;
                    if let Some(model) = model {
                        info.available_at = now;
                        self.install(info, model);
                    }
                }
                Err(TryRecvError::Empty) => {}
                Err(TryRecvError::Disconnected) => self.background = None,
            }
        }
        while let Some(next) = (self.current as usize)
            .checked_sub(self.dropped)
            .and_then(|i| self.versions.get(i))
            && next.available_at <= now
        {
            self.current = next.version;
        }
        if self.cfg.training == Training::Background {
            // Versions only move forward: the older models are never read.
            // Here on every access, so this costs nothing unless one goes.
            let superseded = (self.current as usize)
                .saturating_sub(1)
                .saturating_sub(self.dropped);
            if superseded > 0 {
                self.models.drain(..superseded);
                self.versions.drain(..superseded);
                self.dropped += superseded;
            }
        }
    }

    fn install(&mut self, info: VersionInfo, model: NextAccessModel) {
        self.train_ms_total += info.train_ms;
        self.models.push(Arc::new(model));
        self.versions.push(info);
    }

    /// The training set as known at `now`.
    fn training_set(&self, now: u64) -> Fitted {
        let mut known: Vec<u64> = self.samples.iter().filter_map(|s| s.label).collect();
        if known.is_empty() {
            return (Vec::new(), Vec::new());
        }
        let q = (known.len() * 9 / 10).min(known.len() - 1);
        let (_, &mut q90, _) = known.select_nth_unstable(q);
        let span = now + 1 - self.samples.front().map_or(now, |s| s.t);
        let censored = 2.0 * span as f64;
        let mut rows = Vec::with_capacity(self.samples.len());
        let mut y = Vec::with_capacity(self.samples.len());
        for s in &self.samples {
            match s.label {
                Some(l) => {
                    rows.push(s.row);
                    y.push(l as f64);
                }
                None if now - s.t >= q90 => {
                    rows.push(s.row);
                    y.push(censored.max((now - s.t) as f64));
                }
                None => {}
            }
        }
        (rows, y)
    }

    fn retrain(&mut self, now: u64) {
        if self.background.is_some() {
            // Still training the previous version: building the set (~10 MB
            // on a full window) only to drop it cost the serving thread.
            return;
        }
        let (rows, y) = self.training_set(now);
        if rows.is_empty() {
            return;
        }
        let version = (self.versions_trained() + 1) as u32;
        let gbdt = self.cfg.gbdt;
        match self.cfg.training {
            Training::Inline { lag } => {
                let start = Instant::now();
                let Ok(model) = NextAccessModel::train(&gbdt, &rows, &y) else {
                    return;
                };
                let info = VersionInfo {
                    version,
                    trained_at: now,
                    available_at: now + 1 + lag,
                    samples: rows.len(),
                    train_ms: start.elapsed().as_secs_f64() * 1e3,
                };
                self.install(info, model);
            }
            Training::Background => {
                let (tx, rx) = channel();
                std::thread::spawn(move || {
                    let start = Instant::now();
                    let model = NextAccessModel::train(&gbdt, &rows, &y).ok();
                    let info = VersionInfo {
                        version,
                        trained_at: now,
                        available_at: u64::MAX,
                        samples: rows.len(),
                        train_ms: start.elapsed().as_secs_f64() * 1e3,
                    };
                    let _ = tx.send((info, model));
                });
                self.background = Some(rx);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(p: &OnlinePredictor) -> Vec<(u64, Key, Option<u64>)> {
        p.samples.iter().map(|s| (s.t, s.key, s.label)).collect()
    }

    #[test]
    fn background_training_keeps_only_the_model_in_use_and_later_ones() {
        // Serving retrains about once a second for months: every version
        // kept grew a node's memory without bound.
        let mut p = OnlinePredictor::new(PredictorConfig {
            retrain_every: 50,
            window: 500,
            training: Training::Background,
            ..PredictorConfig::default()
        });
        let ctx = AccessContext::default();
        let mut t = 0;
        let started = Instant::now();
        while p.current_version() < 4 {
            assert!(
                started.elapsed().as_secs() < 60,
                "version {} after 60 s",
                p.current_version()
            );
            for _ in 0..200 {
                p.observe(t % 97, t, ctx);
                t += 1;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let kept = p.models.len();
        assert!(
            kept <= 2 && p.versions().len() == kept,
            "{kept} models kept at version {}",
            p.current_version()
        );
        assert_eq!(p.versions_trained(), p.dropped + kept);
        assert_eq!(
            p.versions().first().map(|v| v.version),
            Some(p.current_version())
        );
        assert!(p.model(p.current_version()).is_some());
        assert!(p.model(1).is_none(), "superseded");
    }

    #[test]
    fn requests_counted_but_not_observed_leave_labels_on_their_own_samples() {
        // A cache ticks on every lookup but observes only hits and inserts
        // (an EMB share of 0 rows observes nothing): ticks 2..5 are a gap.
        let mut p = OnlinePredictor::new(PredictorConfig {
            training: Training::Inline { lag: 0 },
            ..PredictorConfig::default()
        });
        let ctx = AccessContext::default();
        for (key, t) in [(100, 0), (101, 1), (102, 5), (103, 6), (104, 7), (105, 8)] {
            p.observe(key, t, ctx);
        }
        // Offset 5 from the front is 105's sample: mislabelled before.
        p.observe(102, 9, ctx);
        // Two samples of one tick (an insert observed at its lookup's tick).
        p.observe(9, 9, ctx);
        // Offset 9 is past the queue's end: "Out of bounds access" before.
        p.observe(9, 20, ctx);
        assert_eq!(
            labels(&p),
            [
                (0, 100, None),
                (1, 101, None),
                (5, 102, Some(4)),
                (6, 103, None),
                (7, 104, None),
                (8, 105, None),
                (9, 102, None),
                (9, 9, Some(11)),
                (20, 9, None),
            ]
        );
    }
}
