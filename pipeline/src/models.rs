//! Hot model swap: the trained models a running `serve` may switch to.
//! An admin call loads and checks a model directory here (a model whose
//! item space differs from the running catalog is refused and the old one
//! keeps serving); the swap itself travels the nodes' control input as
//! `NodeCommand::SwapModel { path, version }` and each node takes the
//! loaded parameters from here between two batches. A process that did not
//! load the model (cluster mode) loads it on the first node that asks.
//!
//! Memory: the registry keeps the parameters of the last model loaded (its
//! weights file and host tables, shared by the nodes of the process); each
//! node builds its own transformer and memory from them and drops its old
//! ones once the new ones are built. Peak during a swap: the registry's
//! copy, plus per node, one old and one new model and pool while it swaps.

use std::collections::BTreeMap;
use std::sync::Mutex;

use grflow_connectors::kafka::ServedLimits;
use grflow_operators::history::HistoryLimits;
use grflow_operators::node::NodeParams;

/// Builds a node's parameters for a model directory (the job's config with
/// `model.weights` pointing there); checks the item space.
pub type ModelLoader = Box<dyn Fn(&str) -> Result<NodeParams, String> + Send + Sync>;

pub struct ModelRegistry {
    loader: ModelLoader,
    /// The last model loaded: (path, version, parameters).
    loaded: Mutex<Option<(String, String, NodeParams)>>,
    /// What each of this process's nodes serves now.
    serving: Mutex<BTreeMap<u32, String>>,
    /// Why the last swap was refused (shown on /status), cleared by the
    /// next one that is accepted.
    last_error: Mutex<Option<String>>,
    /// The history limits the Kafka sources decode with (`serve`): each
    /// node's follow the model it took.
    history: Option<ServedLimits>,
}

impl std::fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRegistry")
            .field("serving", &self.serving)
            .field("last_error", &self.last_error)
            .finish_non_exhaustive()
    }
}

impl ModelRegistry {
    pub fn new(loader: ModelLoader) -> Self {
        Self {
            loader,
            loaded: Mutex::new(None),
            serving: Mutex::new(BTreeMap::new()),
            last_error: Mutex::new(None),
            history: None,
        }
    }

    /// Swaps note each node's new history limits in `history`, which the
    /// job's sources decode with.
    pub fn with_history(mut self, history: ServedLimits) -> Self {
        self.history = Some(history);
        self
    }

    /// Loads `path` and checks it; its version. Refused: the error, kept
    /// for /status; nothing changes.
    pub fn load(&self, path: &str) -> Result<String, String> {
        // Built once here and shared by every node of the process that
        // swaps to it (else each node built its own model and host tier).
        let loaded = (self.loader)(path).and_then(|params| {
            let params = params
                .with_shared_model_and_host()
                .map_err(|e| e.to_string())?;
            let version = params
                .trained
                .as_ref()
                .map(|t| t.model_version.clone())
                .ok_or_else(|| format!("{path}: not a trained model directory"))?;
            Ok((version, params))
        });
        match loaded {
            Ok((version, params)) => {
                *self.loaded.lock().expect("models lock") =
                    Some((path.into(), version.clone(), params));
                *self.last_error.lock().expect("models lock") = None;
                self.publish();
                Ok(version)
            }
            Err(e) => {
                let e = format!("model swap refused: {e}");
                self.note_error(e.clone());
                Err(e)
            }
        }
    }

    /// The parameters of model `version` in `path`, loading it if this
    /// process has not (under the lock, so that it loads once).
    pub fn params(&self, path: &str, version: &str) -> Result<NodeParams, String> {
        let mut loaded = self.loaded.lock().expect("models lock");
        if let Some((_, v, params)) = loaded.as_ref()
            && v == version
        {
            return Ok(params.clone());
        }
        // Every node of the process swaps to one shared host tier.
        let params = (self.loader)(path)?
            .with_shared_model_and_host()
            .map_err(|e| e.to_string())?;
        let found = params.trained.as_ref().map(|t| t.model_version.as_str());
        if found != Some(version) {
            return Err(format!(
                "{path} holds model {found:?} now, not the {version} the swap was for"
            ));
        }
        *loaded = Some((path.into(), version.into(), params.clone()));
        Ok(params)
    }

    pub fn note_serving(&self, node: u32, version: &str) {
        self.serving
            .lock()
            .expect("models lock")
            .insert(node, version.into());
        self.publish();
        // /status's top-level model_version follows the swap (the last
        // node to take a model; `models.serving` has each node's).
        crate::ops::state().set_status_field("model_version", serde_json::json!(version));
    }

    /// A node took a model whose history limits are `limits`: from their
    /// next poll the sources keep at least what it keeps of an inline
    /// history ([`ServedLimits`]). A request decoded before may have lost
    /// items the new model would keep.
    pub fn note_history(&self, limits: HistoryLimits) {
        if let Some(history) = &self.history {
            history.note(limits);
        }
    }

    pub fn note_error(&self, e: String) {
        *self.last_error.lock().expect("models lock") = Some(e);
        self.publish();
    }

    /// `/status` shows what every change left (`models`).
    fn publish(&self) {
        crate::ops::state().set_status_field("models", self.report());
    }

    /// For /status and the admin endpoint.
    pub fn report(&self) -> serde_json::Value {
        serde_json::json!({
            "serving": *self.serving.lock().expect("models lock"),
            "last_error": *self.last_error.lock().expect("models lock"),
        })
    }
}

/// How often a watched model path is looked at.
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// `serve --model-watch PATH`: when the `model_version` in `PATH/model.json`
/// changes (a new directory copied there, or a symlink moved to another),
/// the model is loaded and checked like an admin call, and every node
/// swaps to it (its resolved directory, so that a later move of the link
/// does not change what the nodes load). A refused model is tried again
/// when its files change (a directory caught mid-copy loads once the copy
/// is complete) and reported once per state of its files. Runs until
/// `done`. `served`: the version the nodes were built with, the first
/// one compared.
pub fn watch(
    path: std::path::PathBuf,
    served: String,
    models: std::sync::Arc<ModelRegistry>,
    submit: crate::admin::Submit,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        // What the nodes serve, not what is on disk now: a link moved
        // while the job started (after its model was loaded) is swapped to.
        let mut seen = Some(served);
        let mut refused: Option<WatchedFiles> = None;
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(WATCH_EVERY);
            let Some(now) = watched_files(&path) else {
                continue;
            };
            if !worth_loading(&now, seen.as_deref(), refused.as_ref()) {
                continue;
            }
            let dir = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            let dir = dir.display().to_string();
            match models.load(&dir) {
                Ok(version) => {
                    tracing::info!(path = %dir, version, "watched model changed: swapping");
                    // The version loaded, which the nodes will serve: the
                    // link may have moved since `now` was read.
                    seen = Some(version.clone());
                    refused = None;
                    submit(grflow_operators::node::NodeCommand::SwapModel { path: dir, version });
                }
                Err(e) => {
                    tracing::warn!(path = %dir, "{e} (tried again when its files change)");
                    refused = Some(now);
                }
            }
        }
    })
}

/// What the watcher compares: the version model.json names and each
/// file's size and modification time.
#[derive(Clone, Debug, PartialEq)]
struct WatchedFiles {
    version: String,
    files: Vec<Option<(u64, std::time::SystemTime)>>,
}

/// Whether the watched directory should be loaded: its version is not the
/// one served, and it is not the same files as a load refused before (a
/// copy that completed, or a fixed file, is tried again).
fn worth_loading(now: &WatchedFiles, served: Option<&str>, refused: Option<&WatchedFiles>) -> bool {
    Some(now.version.as_str()) != served && refused != Some(now)
}

fn watched_files(dir: &std::path::Path) -> Option<WatchedFiles> {
    use grflow_train::artifact::{ITEMS_FILE, MODEL_JSON, WEIGHTS_FILE};
    let text = std::fs::read_to_string(dir.join(MODEL_JSON)).ok()?;
    let json: serde_json::Value = serde_json::from_str(&text).ok()?;
    let version = json["model_version"].as_str()?.to_string();
    let files = [MODEL_JSON, WEIGHTS_FILE, ITEMS_FILE]
        .iter()
        .map(|f| {
            let m = std::fs::metadata(dir.join(f)).ok()?;
            Some((m.len(), m.modified().ok()?))
        })
        .collect();
    Some(WatchedFiles { version, files })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_directory_is_tried_again_once_its_files_change() {
        let dir = std::env::temp_dir().join(format!("grflow-watch-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let json = |v: &str| format!("{{\"model_version\": \"{v}\"}}");
        std::fs::write(dir.join("model.json"), json("v2")).unwrap();
        // Half the weights copied so far.
        std::fs::write(dir.join("model.safetensors"), [0u8; 10]).unwrap();
        std::fs::write(dir.join("items.parquet"), [0u8; 4]).unwrap();
        let partial = watched_files(&dir).unwrap();
        assert_eq!(partial.version, "v2");
        assert!(worth_loading(&partial, Some("v1"), None));
        // Refused: not again while nothing changes.
        assert!(!worth_loading(&partial, Some("v1"), Some(&partial)));
        // The copy completes: tried again.
        std::fs::write(dir.join("model.safetensors"), [0u8; 20]).unwrap();
        let complete = watched_files(&dir).unwrap();
        assert!(worth_loading(&complete, Some("v1"), Some(&partial)));
        // Served already: nothing to do.
        assert!(!worth_loading(&complete, Some("v2"), None));
        // No model.json (yet): nothing to look at.
        std::fs::remove_file(dir.join("model.json")).unwrap();
        assert!(watched_files(&dir).is_none());
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn a_node_that_took_a_model_moves_the_sources_history_limits() {
        use grflow_operators::history::Task;
        let limits = |max: usize| HistoryLimits {
            rank: max,
            retrieve: max,
            chunk: 4,
        };
        let history = ServedLimits::new(limits(8));
        let models = ModelRegistry::new(Box::new(|_: &str| Err("unused".into())))
            .with_history(history.clone());
        assert_eq!(history.current().dropped(100, Task::Rank), 92);
        models.note_history(limits(64));
        assert_eq!(history.current().dropped(100, Task::Rank), 36);
        // Without a source to feed (replay), noting is harmless.
        ModelRegistry::new(Box::new(|_: &str| Err("unused".into()))).note_history(limits(1));
    }

    #[test]
    fn the_watcher_compares_with_the_served_version_not_the_one_on_disk_at_its_start() {
        use std::sync::atomic::{AtomicBool, Ordering};
        use std::sync::{Arc, Mutex};
        // The nodes were built with v1; the link moved to v2 meanwhile.
        let dir = std::env::temp_dir().join(format!("grflow-watch-start-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.json"), r#"{"model_version": "v2"}"#).unwrap();
        let asked: Arc<Mutex<Vec<String>>> = Arc::default();
        let models = {
            let asked = asked.clone();
            Arc::new(ModelRegistry::new(Box::new(move |path: &str| {
                asked.lock().unwrap().push(path.into());
                Err("not loaded in this test".into())
            })))
        };
        models.note_serving(0, "v1");
        let done = Arc::new(AtomicBool::new(false));
        let submit: crate::admin::Submit = Arc::new(|_| {});
        let watcher = watch(dir.clone(), "v1".into(), models, submit, done.clone());
        let started = std::time::Instant::now();
        while asked.lock().unwrap().is_empty() && started.elapsed().as_secs() < 10 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        done.store(true, Ordering::Relaxed);
        watcher.join().unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert!(
            !asked.lock().unwrap().is_empty(),
            "the watcher never tried to load v2"
        );
    }
}
