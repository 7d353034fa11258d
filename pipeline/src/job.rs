//! The bootstrap `replay` and `serve` share: the cluster this process is
//! part of, the side tables, the nodes' parameters and this process's
//! nodes, the routers' config checked, and `/status`. The two commands
//! differ only in where requests come from and where answers go (Parquet
//! or Kafka) and in what they summarise.

use std::sync::{Arc, Mutex};

use grflow_operators::allocator::ppo::ActorCritic;
use grflow_operators::hotness::HotUsers;
use grflow_operators::node::ServingNode;
use grflow_operators::router::Router;

use crate::cluster::{Cluster, ClusterError, Topology};
use crate::config::{Clock, Config};
use crate::params::{ParamsError, node_params};
use crate::side::SideTables;

/// Why [`Job::prepare`] refused to start: the user's to fix. Typed where
/// the key at fault is one a command-line flag may have set, so that the
/// binary can name the flag the user typed.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    #[error(transparent)]
    Cluster(#[from] ClusterError),
    #[error(transparent)]
    Params(#[from] ParamsError),
    /// Anything else, in words that name the key.
    #[error("{0}")]
    Other(String),
}

/// A job that is ready to start its workers.
pub struct Job {
    pub cfg: Config,
    pub cluster: Cluster,
    pub side: Arc<SideTables>,
    /// This process's nodes by local worker index; each worker takes its own.
    nodes: Arc<Mutex<Vec<Option<ServingNode>>>>,
    pub model_version: String,
    /// The allocator's frozen PPO policy (`ppo-only`, `smart`).
    pub allocator_policy: Option<Arc<ActorCritic>>,
    /// Pages of a node's pool (every node has the same): the grid the
    /// nodes move α on, which the allocator decides on.
    pub pool_pages: usize,
    /// Positions of the model the nodes start with (a trained model's, not
    /// the preset's): the allocator's sequence-length feature divides by it.
    pub max_positions: usize,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("topology", &self.cluster.topology)
            .field("model_version", &self.model_version)
            .finish_non_exhaustive()
    }
}

impl Job {
    /// Checks everything that can fail before a thread starts: the cluster
    /// section, the model and memory config (by building this process's
    /// nodes), the router config. Errors are for the user to fix.
    pub fn prepare(cfg: Config, side: SideTables) -> Result<Self, JobError> {
        let other = |e: &dyn std::fmt::Display| JobError::Other(e.to_string());
        let mut cluster = cfg.cluster.resolve(cfg.run.workers)?;
        let topo = cluster.topology;
        let side = Arc::new(side);
        // One host tier for this process's nodes (read-only).
        let params = node_params(&cfg, &side.meta, &side.catalog())?
            .with_shared_model_and_host()
            .map_err(|e| other(&e))?;
        let cost = match cfg.run.clock {
            Clock::Virtual => Some(crate::params::cost_model(&cfg)?),
            _ => None,
        };
        if let Some(alphas) = &cfg.memory.node_alpha
            && alphas.len() != topo.total()
        {
            return Err(JobError::Other(format!(
                "memory.node_alpha: {} values for {} nodes (one per worker of every process)",
                alphas.len(),
                topo.total()
            )));
        }
        let mut nodes = Vec::with_capacity(topo.threads);
        for n in topo.local_workers() {
            let mut params = params.clone();
            params.memory.alpha = cfg.start_alpha(n);
            let mut node = ServingNode::new(n as u32, params).map_err(|e| other(&e))?;
            if let Some(cost) = &cost {
                node.set_virtual(cost.clone());
            }
            nodes.push(Some(node));
        }
        Router::new(
            cfg.router.clone(),
            topo.total(),
            HotUsers::new(cfg.hotness.clone()),
        )
        .map_err(|e| other(&e))?;
        let model_version = nodes
            .first()
            .and_then(|n| n.as_ref())
            .map(|n| n.model_version().to_string())
            .unwrap_or_default();
        if cluster.topology.is_cluster() {
            cluster.parts = config_parts(&cfg, &model_version);
            cluster
                .parts
                .insert(CATALOG_PART.into(), side_tables_digest(&side));
        }
        let pool_pages = nodes
            .first()
            .and_then(|n| n.as_ref())
            .map_or(0, |n| n.memory().pool().pages());
        let allocator_policy = allocator_policy(&cfg).map_err(JobError::Other)?;
        Ok(Self {
            pool_pages,
            max_positions: params.model.max_positions,
            cfg,
            cluster,
            side,
            nodes: Arc::new(Mutex::new(nodes)),
            model_version,
            allocator_policy,
        })
    }

    pub fn topology(&self) -> Topology {
        self.cluster.topology
    }

    /// What every worker of this process needs to take its node.
    pub fn nodes(&self) -> NodeHandout {
        NodeHandout {
            nodes: self.nodes.clone(),
            topology: self.cluster.topology,
        }
    }

    /// A router replica for a worker.
    pub fn router(cfg: &Config, peers: usize) -> Router {
        Router::new(
            cfg.router.clone(),
            peers,
            HotUsers::new(cfg.hotness.clone()),
        )
        .expect("checked in Job::prepare")
    }

    /// `/status` for this job (`extra` adds command-specific fields) and
    /// readiness: the model, catalog and nodes are loaded.
    pub fn publish(&self, command: &str, extra: serde_json::Value) {
        let topo = self.topology();
        let mut status = serde_json::json!({
            "command": command,
            "model_version": self.model_version,
            "workers": topo.total(),
            "process": topo.process,
            "processes": topo.processes,
            "config": &self.cfg,
        });
        if let (Some(status), serde_json::Value::Object(extra)) = (status.as_object_mut(), extra) {
            status.extend(extra);
        }
        crate::ops::state().set_status(status);
    }
}

/// This process's nodes, handed to the workers one each.
#[derive(Clone)]
pub struct NodeHandout {
    nodes: Arc<Mutex<Vec<Option<ServingNode>>>>,
    topology: Topology,
}

impl std::fmt::Debug for NodeHandout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeHandout")
            .field("topology", &self.topology)
            .finish_non_exhaustive()
    }
}

impl NodeHandout {
    /// The node of global worker `index` (once).
    pub fn take(&self, index: usize) -> ServingNode {
        let local = self
            .topology
            .local(index)
            .expect("a worker of this process");
        self.nodes.lock().expect("nodes lock")[local]
            .take()
            .expect("one node per worker")
    }

    /// A look at the first node (history limits, model version).
    pub fn with_first<R>(&self, f: impl FnOnce(&ServingNode) -> R) -> Option<R> {
        self.nodes
            .lock()
            .expect("nodes lock")
            .first()
            .and_then(|n| n.as_ref())
            .map(f)
    }
}

/// Reads `allocator.policy_file` when the policy needs one.
pub fn allocator_policy(cfg: &Config) -> Result<Option<Arc<ActorCritic>>, String> {
    if !cfg.allocator.learned() {
        return Ok(None);
    }
    let path = &cfg.allocator.policy_file;
    let bytes = std::fs::read(path).map_err(|e| {
        format!(
            "allocator.policy_file {path:?}: {e} (allocator.policy \"{}\" needs a `grflow \
             train-allocator` file)",
            cfg.allocator.policy
        )
    })?;
    let policy = ActorCritic::from_safetensors(&bytes)
        .map_err(|e| format!("allocator.policy_file {path:?}: {e}"))?;
    let slo = cfg.run.slo_ms.rank;
    if let Some(trained) = policy.provenance.slo_ms
        && (trained - slo).abs() > 1e-9
    {
        // Its state and reward scale p99 by the SLO: another SLO gives it
        // inputs it never saw. Allowed (an experiment), said loudly.
        tracing::warn!(
            policy_file = %path,
            trained_slo_ms = trained,
            slo_ms = slo,
            "the allocator policy was trained for another SLO (run.slo_ms.rank)"
        );
    }
    Ok(Some(Arc::new(policy)))
}

/// Per config section (`[run]`, `[memory]`, …), a digest every process of
/// a cluster must share, and the served `model_version` (a hash of the
/// weights). Left out: `[cluster]` (`process` differs by design),
/// `kafka.brokers` (each machine may list its nearest broker first),
/// `kafka.librdkafka` (client settings such as a machine's TLS files),
/// `kafka.catalog` (each machine may keep the catalog elsewhere: its
/// contents are compared, [`side_tables_digest`]) and `model.weights`
/// (likewise: the version says whether the weights are the same); the
/// topics, group and serving settings are compared.
fn config_parts(cfg: &Config, model_version: &str) -> std::collections::BTreeMap<String, u64> {
    let Ok(serde_json::Value::Object(mut sections)) = serde_json::to_value(cfg) else {
        return Default::default();
    };
    if let Some(serde_json::Value::Object(kafka)) = sections.get_mut("kafka") {
        kafka.remove("brokers");
        kafka.remove("librdkafka");
        kafka.remove("catalog");
    }
    if let Some(serde_json::Value::Object(model)) = sections.get_mut("model") {
        model.remove("weights");
    }
    let mut parts: std::collections::BTreeMap<String, u64> = sections
        .iter()
        .filter(|(name, _)| name.as_str() != "cluster")
        .map(|(name, value)| (format!("[{name}]"), crate::handshake::digest(value)))
        .collect();
    parts.insert(
        "the served model (model_version)".into(),
        crate::handshake::digest(&model_version),
    );
    parts
}

/// The handshake's name for the side tables' contents: what a process
/// that differs there must be given the same copy of.
const CATALOG_PART: &str = "the catalog (the contents of users.parquet and items.parquet: \
                            kafka.catalog's in serve, the trace's in replay)";

/// A digest of the side tables' contents, wherever they were read from
/// (each machine may keep them elsewhere): the trace's metadata, the
/// catalog in item_id order and every user's history in user_id order.
/// Processes must hold the same: a hist_len request takes its user's
/// history from the process that serves it, and an item's rows and
/// semantic ID from the catalog there.
pub fn side_tables_digest(side: &SideTables) -> u64 {
    let mut d = crate::handshake::Digest::default();
    d.json(&side.meta);
    let catalog = side.catalog();
    d.bytes(&(catalog.len() as u64).to_le_bytes());
    for item in &catalog {
        // Every field (a new one does not compile until it is added here),
        // as bytes: a catalog may hold millions of items.
        let grflow_traces::Item {
            item_id,
            feature_ids,
            token_len,
            sid,
        } = item;
        d.bytes(&item_id.to_le_bytes());
        d.bytes(&[*token_len]);
        for s in sid {
            d.bytes(&s.to_le_bytes());
        }
        d.bytes(&(feature_ids.len() as u64).to_le_bytes());
        for f in feature_ids {
            d.bytes(&f.to_le_bytes());
        }
    }
    let mut users: Vec<(u64, &[u32])> = side.users().collect();
    users.sort_unstable_by_key(|&(user, _)| user);
    d.bytes(&(users.len() as u64).to_le_bytes());
    for (user, items) in users {
        d.bytes(&user.to_le_bytes());
        d.bytes(&(items.len() as u64).to_le_bytes());
        for item in items {
            d.bytes(&item.to_le_bytes());
        }
    }
    d.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_parts_tell_sections_apart_but_not_the_process_or_brokers() {
        let base = Config::default();
        let parts = config_parts(&base, "gr-a");
        assert!(parts.contains_key("[memory]") && parts.contains_key("[run]"));
        assert!(!parts.contains_key("[cluster]"));
        let mut other = base.clone();
        other.cluster.process = 1;
        other.kafka.brokers = "elsewhere:9092".into();
        other
            .kafka
            .librdkafka
            .insert("ssl.ca.location".into(), "/etc/here.pem".into());
        // Each machine keeps the model where it likes: the version decides.
        other.model.weights = Some("/models/elsewhere".into());
        // And the catalog: its contents decide (side_tables_digest).
        other.kafka.catalog = "/data/elsewhere".into();
        assert_eq!(config_parts(&other, "gr-a"), parts);
        let changed: Vec<_> = config_parts(&other, "gr-b")
            .into_iter()
            .filter(|(k, v)| parts[k] != *v)
            .map(|(k, _)| k)
            .collect();
        assert_eq!(changed, ["the served model (model_version)"]);
        other.memory.alpha += 0.1;
        let changed: Vec<_> = config_parts(&other, "gr-a")
            .into_iter()
            .filter(|(k, v)| parts[k] != *v)
            .map(|(k, _)| k)
            .collect();
        assert_eq!(changed, ["[memory]"]);
    }

    /// A small generated trace's side tables.
    fn small_trace() -> grflow_traces::Trace {
        grflow_traces::generate(&grflow_traces::GenConfig {
            users: 40,
            items: 300,
            requests: 10,
            min_history: 5,
            max_history: 30,
            ..Default::default()
        })
    }

    /// The side tables of `trace` written to `dir` (rows in groups of
    /// `rows`) and read back, as `serve` reads `kafka.catalog`.
    fn written_and_loaded(
        trace: &grflow_traces::Trace,
        dir: &std::path::Path,
        rows: usize,
    ) -> SideTables {
        let opts = grflow_traces::WriteOptions {
            row_group_rows: rows,
            ..Default::default()
        };
        grflow_traces::write_trace(dir, trace, &opts).unwrap();
        let t = grflow_connectors::parquet::load_side_tables(dir).unwrap();
        SideTables::new(t.meta, t.users, t.items, 1024).unwrap()
    }

    /// The handshake compares the catalog's contents, not its path: the
    /// same tables at two paths (written in other row groups, too) agree;
    /// a changed history or item disagrees, and the mismatch names the
    /// catalog.
    #[test]
    fn side_tables_digest_follows_the_contents_not_the_path() {
        let base = std::env::temp_dir().join(format!("grflow-side-digest-{}", std::process::id()));
        let trace = small_trace();
        let here = written_and_loaded(&trace, &base.join("here"), 1024);
        let there = written_and_loaded(&trace, &base.join("there"), 7);
        let digest = side_tables_digest(&here);
        assert_eq!(side_tables_digest(&there), digest);

        // One user's history in another order (the same length).
        let mut history = trace.clone();
        let user = history
            .users
            .iter_mut()
            .find(|u| u.items.len() >= 2 && u.items[0] != u.items[1])
            .unwrap();
        user.items.swap(0, 1);
        let changed = written_and_loaded(&history, &base.join("there"), 1024);
        assert_ne!(side_tables_digest(&changed), digest);

        // One item's token length.
        let mut item = trace.clone();
        item.items[3].token_len = item.items[3].token_len.wrapping_add(1).max(1);
        let changed = written_and_loaded(&item, &base.join("there"), 1024);
        assert_ne!(side_tables_digest(&changed), digest);

        // How process 0 reports it.
        let fingerprint = |catalog: u64| crate::handshake::Fingerprint {
            process: 1,
            version: crate::handshake::BUILD.into(),
            threads: 1,
            hosts: vec!["a:1".into(), "b:2".into()],
            parts: std::collections::BTreeMap::from([(CATALOG_PART.to_string(), catalog)]),
        };
        let mut zero = fingerprint(digest);
        zero.process = 0;
        assert_eq!(zero.mismatch(&fingerprint(digest)), None);
        let m = zero
            .mismatch(&fingerprint(side_tables_digest(&changed)))
            .unwrap();
        assert!(
            m.contains("process 1 differs from process 0 in the catalog (the contents of"),
            "{m}"
        );
        assert!(m.contains("kafka.catalog's in serve"), "{m}");
        std::fs::remove_dir_all(&base).ok();
    }
}
