//! The state saved after every epoch: current and best weights, AdamW
//! moments, and the loop's counters, so `--resume` continues a run.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::adamw::AdamW;
use crate::error::TrainError;
use crate::fit::{EpochReport, TrainConfig};
use crate::params::Params;

/// The loop's counters and the run's identity.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct State {
    pub config: TrainConfig,
    pub fingerprint: String,
    pub epochs_done: usize,
    pub best_epoch: usize,
    pub best_ndcg: f64,
    pub history: Vec<EpochReport>,
    pub train_secs: f64,
}

#[derive(Clone, Debug)]
pub struct Checkpoint {
    pub params: Params,
    pub best: Params,
    pub opt: AdamW,
    pub state: State,
}

const FILES: [&str; 4] = ["params", "best", "adam_m", "adam_v"];

#[derive(Serialize, Deserialize)]
struct StateFile {
    state: State,
    adam_step: u64,
}

fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes).map_err(TrainError::io(&tmp))?;
    std::fs::rename(&tmp, path).map_err(TrainError::io(path))
}

impl Checkpoint {
    /// Writes the checkpoint into `dir` (created if needed); state.json
    /// goes last, so a checkpoint with a state file is complete.
    pub fn save(&self, dir: &Path) -> Result<(), TrainError> {
        std::fs::create_dir_all(dir).map_err(TrainError::io(dir))?;
        let tensors = [&self.params, &self.best, &self.opt.m, &self.opt.v];
        for (name, p) in FILES.iter().zip(tensors) {
            write_atomic(
                &dir.join(format!("{name}.safetensors")),
                &p.to_safetensors(),
            )?;
        }
        let state = StateFile {
            state: self.state.clone(),
            adam_step: self.opt.step,
        };
        let json = serde_json::to_vec_pretty(&state).expect("state serialises");
        write_atomic(&dir.join("state.json"), &json)
    }

    pub fn load(dir: &Path) -> Result<Self, TrainError> {
        let read = |name: &str| -> Result<Vec<u8>, TrainError> {
            let path = dir.join(name);
            std::fs::read(&path).map_err(TrainError::io(&path))
        };
        let sf: StateFile =
            serde_json::from_slice(&read("state.json")?).map_err(|e| TrainError::Model {
                path: dir.join("state.json"),
                reason: e.to_string(),
            })?;
        let mut ps = Vec::new();
        for name in FILES {
            let file = format!("{name}.safetensors");
            let origin = dir.join(&file).display().to_string();
            ps.push(Params::from_safetensors(&read(&file)?, &origin)?);
        }
        let v = ps.pop().expect("4 files");
        let m = ps.pop().expect("4 files");
        let best = ps.pop().expect("4 files");
        let params = ps.pop().expect("4 files");
        let opt = AdamW {
            cfg: sf.state.config.adamw.clone(),
            m,
            v,
            step: sf.adam_step,
        };
        Ok(Checkpoint {
            params,
            best,
            opt,
            state: sf.state,
        })
    }

    /// A checkpoint continues only the run it came from.
    pub fn check(&self, cfg: &TrainConfig, fingerprint: &str) -> Result<(), TrainError> {
        if self.state.fingerprint != fingerprint {
            return Err(TrainError::Invalid(format!(
                "checkpoint was trained on dataset {}, this trace is {fingerprint}",
                self.state.fingerprint
            )));
        }
        let mut want = cfg.clone();
        // More epochs may be granted to a resumed run.
        want.max_epochs = self.state.config.max_epochs;
        if want != self.state.config {
            return Err(TrainError::Invalid(
                "checkpoint hyper-parameters differ from this run's".to_string(),
            ));
        }
        Ok(())
    }
}
