//! The state saved after every epoch: current and best weights, AdamW
//! moments, and the loop's counters, so `--resume` continues a run.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::adamw::AdamW;
use crate::artifact::{FNV0, fnv};
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
    /// The tensor files this state goes with, in `FILES` order, and the
    /// FNV-1a hash of each (empty in checkpoints written before them).
    #[serde(default)]
    tensors: Vec<TensorFile>,
    /// The builds (commits) whose epochs this checkpoint holds, oldest
    /// first; absent in checkpoints written before them, or saved outside
    /// [`recording_commits`].
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    commits: Vec<String>,
}

/// What a checkpoint from before commits were recorded was trained by.
pub const UNKNOWN_COMMIT: &str = "unknown";

thread_local! {
    static COMMITS: std::cell::RefCell<Vec<String>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` with `commits` (the builds that trained the run, oldest first,
/// this one last) recorded in every checkpoint saved on this thread
/// meanwhile. `fit` saves the checkpoints and knows nothing of builds; the
/// binary, which knows its own commit, scopes them around it.
pub fn recording_commits<R>(commits: Vec<String>, f: impl FnOnce() -> R) -> R {
    struct Restore(Vec<String>);
    impl Drop for Restore {
        fn drop(&mut self) {
            COMMITS.with(|c| *c.borrow_mut() = std::mem::take(&mut self.0));
        }
    }
    let _restore = Restore(COMMITS.with(|c| c.replace(commits)));
    f()
}

/// `commits` and then `this`, unless it is the last already: the builds
/// that trained a run once `this` trains on.
pub fn with_commit(mut commits: Vec<String>, this: &str) -> Vec<String> {
    if commits.last().map(String::as_str) != Some(this) {
        commits.push(this.to_string());
    }
    commits
}

#[derive(Clone, Debug, Serialize, Deserialize)]
struct TensorFile {
    file: String,
    fnv: String,
}

/// Writes `bytes` to `path` through a temporary file, on disk before the
/// rename and the rename on disk before returning: after a power loss the
/// path holds the old bytes or the new, never an empty file that a later
/// step (state.json naming it, the old epoch's files removed) relies on.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), TrainError> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let mut f = std::fs::File::create(&tmp).map_err(TrainError::io(&tmp))?;
    f.write_all(bytes).map_err(TrainError::io(&tmp))?;
    f.sync_all().map_err(TrainError::io(&tmp))?;
    drop(f);
    std::fs::rename(&tmp, path).map_err(TrainError::io(path))?;
    sync_parent(path)
}

/// Makes a rename in `path`'s directory durable (a no-op where a directory
/// cannot be opened for it).
fn sync_parent(path: &Path) -> Result<(), TrainError> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    match std::fs::File::open(dir) {
        Ok(d) => d.sync_all().map_err(TrainError::io(dir)),
        Err(_) => Ok(()),
    }
}

fn hash(bytes: &[u8]) -> String {
    format!("{:016x}", fnv(bytes.iter().copied(), FNV0))
}

impl Checkpoint {
    /// Writes the checkpoint into `dir` (created if needed). The tensors go
    /// to files named by epoch and state.json, renamed in last, names them
    /// with their hashes: whenever the process stops, state.json describes
    /// one complete epoch (the new or the previous). Files of earlier
    /// epochs are removed after.
    pub fn save(&self, dir: &Path) -> Result<(), TrainError> {
        std::fs::create_dir_all(dir).map_err(TrainError::io(dir))?;
        let tensors = [&self.params, &self.best, &self.opt.m, &self.opt.v];
        let mut refs = Vec::with_capacity(FILES.len());
        for (name, p) in FILES.iter().zip(tensors) {
            let file = format!("{name}-e{:04}.safetensors", self.state.epochs_done);
            let bytes = p.to_safetensors();
            write_atomic(&dir.join(&file), &bytes)?;
            refs.push(TensorFile {
                file,
                fnv: hash(&bytes),
            });
        }
        let state = StateFile {
            state: self.state.clone(),
            adam_step: self.opt.step,
            tensors: refs.clone(),
            commits: COMMITS.with(|c| c.borrow().clone()),
        };
        let json = serde_json::to_vec_pretty(&state).expect("state serialises");
        write_atomic(&dir.join("state.json"), &json)?;
        // Older epochs' tensors (and those of checkpoints from before the
        // files were named by epoch): nothing refers to them any more.
        let keep: Vec<&str> = refs.iter().map(|r| r.file.as_str()).collect();
        if let Ok(entries) = std::fs::read_dir(dir) {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                // Also a `.tmp` left by a crash mid-write: as large as a file.
                let ours = FILES.iter().any(|f| name.starts_with(f))
                    && (name.ends_with(".safetensors") || name.ends_with(".safetensors.tmp"));
                if ours && !keep.contains(&name.as_str()) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(())
    }

    pub fn load(dir: &Path) -> Result<Self, TrainError> {
        Self::load_with_commits(dir).map(|(ck, _)| ck)
    }

    /// [`Checkpoint::load`], and the builds that trained its epochs, oldest
    /// first (`[UNKNOWN_COMMIT]` for a checkpoint that does not say).
    pub fn load_with_commits(dir: &Path) -> Result<(Self, Vec<String>), TrainError> {
        let read = |name: &str| -> Result<Vec<u8>, TrainError> {
            let path = dir.join(name);
            std::fs::read(&path).map_err(TrainError::io(&path))
        };
        let sf: StateFile =
            serde_json::from_slice(&read("state.json")?).map_err(|e| TrainError::Model {
                path: dir.join("state.json"),
                reason: e.to_string(),
            })?;
        let files: Vec<(String, Option<String>)> = if sf.tensors.is_empty() {
            FILES
                .iter()
                .map(|n| (format!("{n}.safetensors"), None))
                .collect()
        } else if sf.tensors.len() == FILES.len() {
            sf.tensors
                .iter()
                .map(|t| (t.file.clone(), Some(t.fnv.clone())))
                .collect()
        } else {
            return Err(TrainError::Model {
                path: dir.join("state.json"),
                reason: format!(
                    "names {} tensor files, a checkpoint has {}",
                    sf.tensors.len(),
                    FILES.len()
                ),
            });
        };
        let mut ps = Vec::new();
        for (file, want) in files {
            let bytes = read(&file)?;
            let origin = dir.join(&file);
            if let Some(want) = want
                && hash(&bytes) != want
            {
                return Err(TrainError::Model {
                    path: origin,
                    reason: format!(
                        "does not hash to {want} as state.json says (changed or damaged after epoch {} was saved)",
                        sf.state.epochs_done
                    ),
                });
            }
            ps.push(Params::from_safetensors(
                &bytes,
                &origin.display().to_string(),
            )?);
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
        let commits = if sf.commits.is_empty() {
            vec![UNKNOWN_COMMIT.to_string()]
        } else {
            sf.commits
        };
        let ck = Checkpoint {
            params,
            best,
            opt,
            state: sf.state,
        };
        Ok((ck, commits))
    }

    /// A checkpoint continues only the run it came from: the same data,
    /// hyper-parameters (but `max_epochs`) and tensor shapes.
    pub fn check(
        &self,
        cfg: &TrainConfig,
        fingerprint: &str,
        n_items: usize,
    ) -> Result<(), TrainError> {
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
            let diffs = config_diff(&self.state.config, &want);
            return Err(TrainError::Invalid(format!(
                "checkpoint hyper-parameters differ from this run's: {}",
                diffs.join(", ")
            )));
        }
        let tensors = [
            ("params", &self.params),
            ("best", &self.best),
            ("adam_m", &self.opt.m),
            ("adam_v", &self.opt.v),
        ];
        for (name, p) in tensors {
            if p.cfg != cfg.model || p.n_items() != n_items {
                return Err(TrainError::Invalid(format!(
                    "checkpoint {name} tensors are for {} items and another model shape, \
                     this run trains {n_items} items",
                    p.n_items()
                )));
            }
        }
        Ok(())
    }
}

/// `field: checkpoint → this run` for every leaf that differs.
fn config_diff(old: &TrainConfig, new: &TrainConfig) -> Vec<String> {
    fn walk(path: &str, a: &Value, b: &Value, out: &mut Vec<String>) {
        match (a, b) {
            (Value::Object(x), Value::Object(y)) => {
                let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
                for k in keys {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    walk(
                        &p,
                        x.get(k).unwrap_or(&Value::Null),
                        y.get(k).unwrap_or(&Value::Null),
                        out,
                    );
                }
            }
            _ if a != b => out.push(format!("{path}: checkpoint {a}, this run {b}")),
            _ => {}
        }
    }
    let (a, b) = (
        serde_json::to_value(old).expect("config serialises"),
        serde_json::to_value(new).expect("config serialises"),
    );
    let mut out = Vec::new();
    walk("", &a, &b, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_differing_hyper_parameter_is_named_with_both_values() {
        let a = TrainConfig::defaults(42);
        let mut b = a.clone();
        b.seed = 7;
        b.adamw.lr *= 2.0;
        let d = config_diff(&a, &b);
        assert_eq!(d.len(), 2, "{d:?}");
        assert!(
            d.iter()
                .any(|l| l.starts_with("seed: checkpoint 42, this run 7")),
            "{d:?}"
        );
        assert!(d.iter().any(|l| l.starts_with("adamw.lr: ")), "{d:?}");
    }

    /// The builds a checkpoint was saved under come back on load; one saved
    /// before they were recorded loads, as trained by an unknown build.
    #[test]
    fn a_checkpoint_records_the_builds_that_trained_it() {
        let mut cfg = TrainConfig::defaults(1);
        cfg.model.d_model = 8;
        cfg.model.n_heads = 1;
        cfg.model.n_layers = 1;
        let params = Params::init(cfg.model.clone(), 4, 1).unwrap();
        let ck = Checkpoint {
            opt: AdamW::new(cfg.adamw.clone(), &params),
            best: params.clone(),
            params,
            state: State {
                config: cfg,
                fingerprint: "f".into(),
                epochs_done: 1,
                best_epoch: 1,
                best_ndcg: 0.5,
                history: Vec::new(),
                train_secs: 0.0,
            },
        };
        let dir = std::env::temp_dir().join(format!("grflow-ckpt-commits-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let builds = with_commit(vec!["aaa".into()], "bbb");
        assert_eq!(with_commit(builds.clone(), "bbb"), builds);
        recording_commits(builds.clone(), || ck.save(&dir)).unwrap();
        let (back, commits) = Checkpoint::load_with_commits(&dir).unwrap();
        assert_eq!((back.state, commits), (ck.state.clone(), builds));
        // Outside the scope nothing is recorded: an unknown build.
        ck.save(&dir).unwrap();
        let text = std::fs::read_to_string(dir.join("state.json")).unwrap();
        assert!(!text.contains("commits"), "{text}");
        let (_, commits) = Checkpoint::load_with_commits(&dir).unwrap();
        assert_eq!(commits, [UNKNOWN_COMMIT]);
        std::fs::remove_dir_all(&dir).ok();
    }
}
