//! Hot model swap: the trained models a running `serve` may switch to.
//! An admin call loads and checks a model directory here (a model whose
//! item space differs from the running catalog is refused and the old one
//! keeps serving); the swap itself travels the nodes' control input as
//! `NodeCommand::SwapModel { path, version }` and each node takes the
//! loaded parameters from here between two batches. A process that did not
//! load the model (cluster mode, or a version it has dropped since) loads
//! it once, on a thread of its own ([`ModelRegistry::fetch`]): under
//! `arrival` release its nodes keep serving the old model meanwhile and
//! swap once it is ready; under `complete` release a node waits for it
//! ([`ModelRegistry::params`]), so that the swap stamped t still applies
//! before every request at t or later. No lock is held while a model loads.
//!
//! Memory: the registry keeps the parameters of the last
//! [`KEEP_LOADED`] models loaded (weights and host tables, shared by the
//! nodes of the process that serve them), so that a second swap made
//! before every node took the first, or a swap back, loads nothing again;
//! each node builds its own transformer and memory from them and drops its
//! old ones once the new ones are built. Peak during a swap: the models
//! kept here and the one loading, plus per node, one old and one new
//! model and pool while it swaps.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use grflow_connectors::kafka::ServedLimits;
use grflow_operators::history::HistoryLimits;
use grflow_operators::node::NodeParams;

/// Builds a node's parameters for a model directory (the job's config with
/// `model.weights` pointing there); checks the item space.
pub type ModelLoader = Box<dyn Fn(&str) -> Result<NodeParams, String> + Send + Sync>;

/// The loader, shared with the threads that load for a swap.
type SharedLoader = Arc<dyn Fn(&str) -> Result<NodeParams, String> + Send + Sync>;

/// How many loaded models a process keeps: the one its nodes swap to and
/// the one before (a rollback, or a second swap sent before the nodes took
/// the first, needs no new load).
pub const KEEP_LOADED: usize = 2;

pub struct ModelRegistry {
    loader: SharedLoader,
    /// What is loaded or loading, shared with the threads that load.
    cache: Arc<Cache>,
    /// What each of this process's nodes serves now.
    serving: Mutex<BTreeMap<u32, String>>,
    /// Why the last swap was refused (shown on /status), cleared by the
    /// next one that is accepted.
    last_error: Mutex<Option<String>>,
    /// The history limits the Kafka sources decode with (`serve`): each
    /// node's follow the model it took.
    history: Option<ServedLimits>,
}

/// The models a process has loaded, and those it is loading.
#[derive(Default)]
struct Cache {
    /// The last [`KEEP_LOADED`] models loaded, oldest first: (path,
    /// version, parameters).
    loaded: Mutex<VecDeque<(String, String, NodeParams)>>,
    /// Loads running on their own threads, by version: every node that
    /// asks for a version meanwhile waits for the same load. Locked before
    /// `loaded` where both are, and never across a load.
    loading: Mutex<BTreeMap<String, Arc<Load>>>,
    /// Loads started for a swap that failed (`/status`:
    /// `models.load_failures`).
    failures: AtomicU64,
}

impl Cache {
    fn get(&self, version: &str) -> Option<NodeParams> {
        let loaded = self.loaded.lock().expect("models lock");
        loaded
            .iter()
            .find(|(_, v, _)| v == version)
            .map(|(_, _, params)| params.clone())
    }

    /// Keeps `params` as the newest model, dropping the oldest beyond
    /// [`KEEP_LOADED`].
    fn keep(&self, path: &str, version: &str, params: NodeParams) {
        let mut loaded = self.loaded.lock().expect("models lock");
        loaded.retain(|(_, v, _)| v != version);
        loaded.push_back((path.into(), version.into(), params));
        while loaded.len() > KEEP_LOADED {
            loaded.pop_front();
        }
    }
}

/// A model loading on a thread of its own, for the nodes that wait for it.
#[derive(Default)]
pub struct Load {
    state: Mutex<LoadState>,
    finished: Condvar,
}

#[derive(Default)]
struct LoadState {
    result: Option<Result<NodeParams, String>>,
    /// Called once the result is in (each node's waker).
    on_done: Vec<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Load {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.state.lock().expect("load lock");
        f.debug_struct("Load")
            .field("done", &state.result.is_some())
            .finish_non_exhaustive()
    }
}

impl Load {
    /// The loaded parameters, or why they could not be had; `None` while
    /// loading.
    pub fn result(&self) -> Option<Result<NodeParams, String>> {
        self.state.lock().expect("load lock").result.clone()
    }

    /// Calls `f` once the load is done (at once if it is).
    pub fn on_done(&self, f: impl FnOnce() + Send + 'static) {
        let mut state = self.state.lock().expect("load lock");
        if state.result.is_some() {
            drop(state);
            f();
        } else {
            state.on_done.push(Box::new(f));
        }
    }

    /// Blocks until the load is done.
    pub fn wait(&self) -> Result<NodeParams, String> {
        let mut state = self.state.lock().expect("load lock");
        loop {
            if let Some(result) = &state.result {
                return result.clone();
            }
            state = self.finished.wait(state).expect("load lock");
        }
    }

    fn finish(&self, result: Result<NodeParams, String>) {
        let on_done = {
            let mut state = self.state.lock().expect("load lock");
            state.result = Some(result);
            std::mem::take(&mut state.on_done)
        };
        self.finished.notify_all();
        for f in on_done {
            f();
        }
    }
}

/// What [`ModelRegistry::fetch`] found.
#[derive(Debug)]
pub enum Fetch {
    /// This process has the model loaded.
    Ready(Box<NodeParams>),
    /// It is loading (started now, or by another node before).
    Loading(Arc<Load>),
}

impl std::fmt::Debug for ModelRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelRegistry")
            .field("serving", &self.serving)
            .field("last_error", &self.last_error)
            .finish_non_exhaustive()
    }
}

/// Loads `path` with `loader` and builds the model and host tier every
/// node of the process that swaps to it shares (else each node built its
/// own): its version and parameters. A panic while loading is a refused
/// load: the admin call answers it, and a node waiting for the load gets
/// the error.
fn prepare(
    loader: &(dyn Fn(&str) -> Result<NodeParams, String> + Send + Sync),
    path: &str,
) -> Result<(String, NodeParams), String> {
    let params = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        loader(path)?
            .with_shared_model_and_host()
            .map_err(|e| e.to_string())
    }))
    .unwrap_or_else(|_| Err(format!("{path}: loading it panicked")))?;
    let version = params
        .trained
        .as_ref()
        .map(|t| t.model_version.clone())
        .ok_or_else(|| format!("{path}: not a trained model directory"))?;
    Ok((version, params))
}

impl ModelRegistry {
    pub fn new(loader: ModelLoader) -> Self {
        Self {
            loader: Arc::from(loader),
            cache: Arc::default(),
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

    /// Loads `path` and checks it (on the caller's thread); its version.
    /// Refused: the error, kept for /status; nothing changes.
    pub fn load(&self, path: &str) -> Result<String, String> {
        match prepare(&*self.loader, path) {
            Ok((version, params)) => {
                self.cache.keep(path, &version, params);
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

    /// The parameters of model `version` in `path` if this process has
    /// them; else the load that brings them, started now on a thread of its
    /// own unless one is running already (one load per process and
    /// version). Never waits for a load.
    pub fn fetch(&self, path: &str, version: &str) -> Fetch {
        let mut loading = self.cache.loading.lock().expect("models lock");
        // Under `loading`: a load that ends now is either still there or
        // kept already.
        if let Some(params) = self.cache.get(version) {
            return Fetch::Ready(Box::new(params));
        }
        if let Some(load) = loading.get(version) {
            return Fetch::Loading(load.clone());
        }
        let load = Arc::new(Load::default());
        loading.insert(version.into(), load.clone());
        drop(loading);
        let (loader, cache, done) = (self.loader.clone(), self.cache.clone(), load.clone());
        let (path, version) = (path.to_string(), version.to_string());
        let spawned = std::thread::Builder::new()
            .name("grflow-model-load".into())
            .spawn({
                let (path, version) = (path.clone(), version.clone());
                move || {
                    tracing::info!(path, version, "loading a model for a swap");
                    // `prepare` turns a panic into an error: the load ends,
                    // and a node may wait for it.
                    let result = prepare(&*loader, &path).and_then(|(found, params)| {
                        if found == version {
                            Ok(params)
                        } else {
                            Err(format!(
                                "{path} holds model {found} now, not the {version} the swap was for"
                            ))
                        }
                    });
                    finish_load(&cache, &path, &version, &done, result);
                }
            });
        if let Err(e) = spawned {
            let e = format!("cannot start a thread to load {path}: {e}");
            finish_load(&self.cache, &path, &version, &load, Err(e));
        }
        Fetch::Loading(load)
    }

    /// The parameters of model `version` in `path`, waiting for them if
    /// this process has not loaded them (`complete` release: the swap
    /// must apply at its time). Waits on the load only: other nodes take
    /// loaded models meanwhile.
    pub fn params(&self, path: &str, version: &str) -> Result<NodeParams, String> {
        match self.fetch(path, version) {
            Fetch::Ready(params) => Ok(*params),
            Fetch::Loading(load) => load.wait(),
        }
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
            "load_failures": self.cache.failures.load(Ordering::Relaxed),
        })
    }
}

/// A load for a swap ended: keeps what it loaded (or counts and logs why
/// it failed, once per process), then hands the result to the nodes that
/// wait for it and wakes them.
fn finish_load(
    cache: &Cache,
    path: &str,
    version: &str,
    load: &Load,
    result: Result<NodeParams, String>,
) {
    {
        let mut loading = cache.loading.lock().expect("models lock");
        match &result {
            Ok(params) => cache.keep(path, version, params.clone()),
            Err(e) => {
                cache.failures.fetch_add(1, Ordering::Relaxed);
                metrics::counter!("grflow_model_load_failures_total").increment(1);
                tracing::warn!(
                    path,
                    version,
                    "model load failed: {e} (this process's nodes keep their model)"
                );
            }
        }
        // A later swap to this version loads again (its files may be
        // fixed by then).
        loading.remove(version);
    }
    load.finish(result);
}

/// The model a `serve` job ended on, for its summary: the lowest node's
/// of `versions` (node, version), whatever order they came in. Nodes that
/// ended on different models (in cluster mode: a swap some process could
/// not load, one still loading when the job stopped, or processes started
/// with different configs or `--model`) are logged as a warning, not
/// hidden.
pub fn version_at_exit<'a>(versions: impl IntoIterator<Item = (usize, &'a str)>) -> String {
    let versions: BTreeMap<usize, &str> = versions.into_iter().collect();
    let distinct: std::collections::BTreeSet<&str> = versions.values().copied().collect();
    if distinct.len() > 1 {
        tracing::warn!(
            ?versions,
            "the nodes ended the run on different models: a swap some process could not \
             load (see its `model load failed` or `model swap failed` warnings) or had not \
             applied yet, or processes started with different configs or --model"
        );
    }
    versions
        .values()
        .next()
        .map(|v| v.to_string())
        .unwrap_or_default()
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
/// one compared. Once the job drains or stops (its command source has
/// closed) a changed model is not submitted: that is logged and the
/// watcher stops.
pub fn watch(
    path: std::path::PathBuf,
    served: String,
    models: std::sync::Arc<ModelRegistry>,
    submit: crate::admin::Submit,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<()> {
    watch_gated(path, served, models, submit, done, || {
        crate::ops::state().refuses_commands()
    })
}

/// [`watch`], with `closed` saying why commands are no longer applied.
fn watch_gated(
    path: std::path::PathBuf,
    served: String,
    models: std::sync::Arc<ModelRegistry>,
    submit: crate::admin::Submit,
    done: std::sync::Arc<std::sync::atomic::AtomicBool>,
    closed: impl Fn() -> Option<String> + Send + 'static,
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
            // Checked before and after the load, which may take seconds:
            // a command submitted once draining began would be dropped.
            if let Some(why) = closed() {
                tracing::warn!(
                    path = %dir,
                    "watched model changed, but the job is {why}: no swap submitted"
                );
                break;
            }
            match models.load(&dir) {
                Ok(version) => {
                    if let Some(why) = closed() {
                        tracing::warn!(
                            path = %dir,
                            version,
                            "watched model loaded, but the job is {why}: no swap submitted"
                        );
                        break;
                    }
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

/// Trained models for the unit tests of the registry and its users.
#[cfg(test)]
pub(crate) mod test_models {
    use std::sync::Arc;

    use grflow_operators::node::{NodeParams, TrainedWeights};

    /// A small node's parameters: the embedded config over a generated
    /// catalog.
    pub(crate) fn small_params() -> NodeParams {
        let cfg = crate::Config::embedded();
        let trace = grflow_traces::generate(&grflow_traces::GenConfig {
            users: 20,
            items: 300,
            requests: 1,
            candidates: 8,
            ..grflow_traces::GenConfig::default()
        });
        let meta = trace.meta.clone().expect("generated traces have meta");
        let side =
            crate::side::SideTables::new(meta, trace.users, trace.items, cfg.node.shard_rows)
                .expect("side tables");
        crate::params::node_params(&cfg, &side.meta, &side.catalog()).expect("node params")
    }

    /// `base` as the trained model `version`: its seeded weights, zero
    /// host tables.
    pub(crate) fn as_trained(base: &NodeParams, version: &str) -> NodeParams {
        let model = grflow_kernels::GrModel::new(base.model.clone(), base.model_seed);
        let tables = base
            .table_rows
            .iter()
            .map(|&rows| vec![0.0; rows as usize * base.model.d_model])
            .collect();
        NodeParams {
            trained: Some(Arc::new(TrainedWeights {
                safetensors: model.to_safetensors(),
                tables,
                model_version: version.into(),
                max_history: usize::MAX,
            })),
            host: None,
            shared_model: None,
            ..base.clone()
        }
    }

    /// Holds a load back until opened (or until a minute has passed, so
    /// that a test that waits on it by mistake fails instead of hanging).
    #[derive(Clone, Default)]
    pub(crate) struct Gate(Arc<(std::sync::Mutex<bool>, std::sync::Condvar)>);

    impl Gate {
        pub(crate) fn open(&self) {
            *self.0.0.lock().unwrap() = true;
            self.0.1.notify_all();
        }

        pub(crate) fn pass(&self) {
            let (open, changed) = &*self.0;
            let guard = open.lock().unwrap();
            let (_guard, _) = changed
                .wait_timeout_while(guard, std::time::Duration::from_secs(60), |open| !*open)
                .unwrap();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::test_models::{Gate, as_trained, small_params};
    use super::*;

    /// A registry whose loader hands out `base` as trained model `v` for
    /// any path `/m/v`, waiting at `gate` for paths that end in `slow`;
    /// the paths it was asked for.
    fn slow_registry(gate: Gate) -> (Arc<ModelRegistry>, Arc<Mutex<Vec<String>>>) {
        let base = small_params();
        let asked: Arc<Mutex<Vec<String>>> = Arc::default();
        let seen = asked.clone();
        let models = ModelRegistry::new(Box::new(move |path: &str| {
            seen.lock().unwrap().push(path.into());
            let version = path
                .strip_prefix("/m/")
                .ok_or(format!("{path}: no model"))?;
            if version.ends_with("slow") {
                gate.pass();
            }
            if version.starts_with("bad") {
                return Err(format!("{path}: item space differs"));
            }
            Ok(as_trained(&base, version))
        }));
        (Arc::new(models), asked)
    }

    fn version_of(params: &NodeParams) -> &str {
        &params.trained.as_ref().expect("trained").model_version
    }

    #[test]
    fn a_loaded_version_is_had_at_once_while_another_loads_and_both_are_kept() {
        let gate = Gate::default();
        let (models, asked) = slow_registry(gate.clone());
        // Called on this process: loaded by the admin call.
        assert_eq!(models.load("/m/a").unwrap(), "a");
        // A swap to a model this process did not load (another one was
        // called): loaded on a thread of its own, once for all its nodes.
        let Fetch::Loading(load) = models.fetch("/m/b-slow", "b-slow") else {
            panic!("b-slow was never loaded here")
        };
        let Fetch::Loading(same) = models.fetch("/m/b-slow", "b-slow") else {
            panic!("b-slow is loading")
        };
        assert!(Arc::ptr_eq(&load, &same), "one load per version");
        // Meanwhile a node that asks for the loaded model gets it at once,
        // also in the blocking form (`complete` release): nothing waits
        // behind the load (it would wait for the gate, a minute).
        let started = std::time::Instant::now();
        let (tx, rx) = std::sync::mpsc::channel();
        let blocking = {
            let models = models.clone();
            std::thread::spawn(move || {
                let params = models.params("/m/a", "a");
                tx.send(params.map(|p| version_of(&p).to_string())).unwrap();
            })
        };
        let got = rx
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("params() of a loaded model waited behind another load");
        assert_eq!(got.unwrap(), "a");
        blocking.join().unwrap();
        assert!(matches!(models.fetch("/m/a", "a"), Fetch::Ready(_)));
        assert!(started.elapsed() < std::time::Duration::from_secs(20));
        assert!(load.result().is_none(), "b-slow is still loading");
        // The load's end wakes whoever waits for it.
        let (woke, woken) = std::sync::mpsc::channel();
        load.on_done(move || woke.send(()).unwrap());
        gate.open();
        woken
            .recv_timeout(std::time::Duration::from_secs(20))
            .expect("never woken");
        assert_eq!(version_of(&load.result().unwrap().unwrap()), "b-slow");
        // Both are kept: swapping between them (or a second swap sent
        // before the nodes took the first) loads nothing again.
        assert!(matches!(models.fetch("/m/a", "a"), Fetch::Ready(_)));
        assert!(matches!(
            models.fetch("/m/b-slow", "b-slow"),
            Fetch::Ready(_)
        ));
        assert_eq!(*asked.lock().unwrap(), ["/m/a", "/m/b-slow"]);
        // A third one drops the oldest.
        assert_eq!(models.load("/m/c").unwrap(), "c");
        assert!(matches!(models.fetch("/m/a", "a"), Fetch::Loading(_)));
        assert_eq!(version_of(&models.params("/m/a", "a").unwrap()), "a");
    }

    /// A loader that panics on a file (weights it failed to refuse) is a
    /// refused load: the admin call gets an error, the registry serves on.
    #[test]
    fn a_load_that_panics_is_refused_not_propagated() {
        let base = small_params();
        let models = ModelRegistry::new(Box::new(move |path: &str| {
            if path.ends_with("broken") {
                panic!("shapes match data");
            }
            Ok(as_trained(&base, path))
        }));
        let refused = models.load("/m/broken").unwrap_err();
        assert!(
            refused.contains("/m/broken") && refused.contains("panicked"),
            "{refused}"
        );
        assert_eq!(models.load("/m/fine").unwrap(), "/m/fine");
        let failed = models.params("/m/broken", "v").unwrap_err();
        assert!(failed.contains("panicked"), "{failed}");
    }

    #[test]
    fn a_load_that_fails_is_counted_reported_to_its_waiters_and_tried_again_later() {
        let (models, asked) = slow_registry(Gate::default());
        let failed = models.params("/m/bad", "bad").unwrap_err();
        assert!(failed.contains("item space differs"), "{failed}");
        assert_eq!(models.report()["load_failures"], 1);
        // A path that holds another model than the swap names.
        let other = models.params("/m/d", "e").unwrap_err();
        assert!(other.contains("holds model d now, not the e"), "{other}");
        assert_eq!(models.report()["load_failures"], 2);
        // Not kept: a later swap to it loads again (its files may be fixed).
        let Fetch::Loading(again) = models.fetch("/m/bad", "bad") else {
            panic!("a failed load was kept")
        };
        again.wait().unwrap_err();
        let tried = asked.lock().unwrap().clone();
        assert_eq!(
            tried.iter().filter(|p| *p == "/m/bad").count(),
            2,
            "{tried:?}"
        );
    }

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
    fn the_version_at_exit_is_the_lowest_node_s_whatever_the_order() {
        assert_eq!(version_at_exit([(1, "b"), (0, "a"), (2, "b")]), "a");
        assert_eq!(version_at_exit([(3, "a"), (2, "a")]), "a");
        assert_eq!(version_at_exit(std::iter::empty()), "");
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
    #[test]
    fn the_watcher_submits_no_swap_once_the_job_began_draining_during_the_load() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let dir = std::env::temp_dir().join(format!("grflow-watch-drain-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("model.json"), r#"{"model_version": "v2"}"#).unwrap();
        let base = small_params();
        // The job begins draining while the model loads (it takes seconds
        // for a big one).
        let draining = Arc::new(AtomicBool::new(false));
        let models = {
            let draining = draining.clone();
            Arc::new(ModelRegistry::new(Box::new(move |_: &str| {
                draining.store(true, Ordering::Relaxed);
                Ok(as_trained(&base, "v2"))
            })))
        };
        let submitted: Arc<Mutex<Vec<grflow_operators::node::NodeCommand>>> = Arc::default();
        let submit: crate::admin::Submit = {
            let submitted = submitted.clone();
            Arc::new(move |c| submitted.lock().unwrap().push(c))
        };
        let done = Arc::new(AtomicBool::new(false));
        let closed = {
            let draining = draining.clone();
            move || {
                draining
                    .load(Ordering::Relaxed)
                    .then(|| "draining".to_string())
            }
        };
        let watcher = watch_gated(
            dir.clone(),
            "v1".into(),
            models,
            submit,
            done.clone(),
            closed,
        );
        // It loads v2, finds the job draining and stops by itself.
        let started = std::time::Instant::now();
        while !watcher.is_finished() && started.elapsed().as_secs() < 20 {
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let stopped = watcher.is_finished();
        done.store(true, Ordering::Relaxed);
        watcher.join().unwrap();
        std::fs::remove_dir_all(&dir).ok();
        assert!(draining.load(Ordering::Relaxed), "v2 was never loaded");
        assert!(stopped, "the watcher kept watching a draining job");
        assert!(
            submitted.lock().unwrap().is_empty(),
            "a swap was submitted after the command source closed"
        );
    }
}
