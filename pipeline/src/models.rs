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
        }
    }

    /// Loads `path` and checks it; its version. Refused: the error, kept
    /// for /status; nothing changes.
    pub fn load(&self, path: &str) -> Result<String, String> {
        let loaded = (self.loader)(path).and_then(|params| {
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
/// does not change what the nodes load). A refused model is reported once
/// per version. Runs until `done`.
pub fn watch(
    path: std::path::PathBuf,
    models: std::sync::Arc<ModelRegistry>,
    submit: crate::admin::Submit,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let version_at = |p: &std::path::Path| -> Option<String> {
            let text = std::fs::read_to_string(p.join("model.json")).ok()?;
            let json: serde_json::Value = serde_json::from_str(&text).ok()?;
            json["model_version"].as_str().map(str::to_string)
        };
        let mut seen = version_at(&path);
        while !done.load(std::sync::atomic::Ordering::Relaxed) {
            std::thread::sleep(WATCH_EVERY);
            let now = version_at(&path);
            if now.is_none() || now == seen {
                continue;
            }
            seen = now;
            let dir = std::fs::canonicalize(&path).unwrap_or_else(|_| path.clone());
            let dir = dir.display().to_string();
            match models.load(&dir) {
                Ok(version) => {
                    tracing::info!(path = %dir, version, "watched model changed: swapping");
                    submit(grflow_operators::node::NodeCommand::SwapModel { path: dir, version });
                }
                Err(e) => tracing::warn!(path = %dir, "{e}"),
            }
        }
    })
}
