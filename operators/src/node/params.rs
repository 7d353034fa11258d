//! What a node is built from: model, memory pool, tables, link, and the
//! host tier and model that nodes of one process share.

use std::sync::Arc;

use grflow_kernels::{GrModel, ModelConfig};

use super::ServeError;
use crate::host::HostTables;
use crate::link::LinkConfig;
use crate::shards::ShardMap;

/// The node's device memory pool; page and row sizes come from the model.
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryParams {
    pub pool_bytes: u64,
    /// EMB share α of the pool.
    pub alpha: f64,
    /// Eviction policies by name: lru | laru | fpb | hf.
    pub emb_policy: String,
    pub user_kv_policy: String,
    pub item_kv_policy: String,
    /// The pool holds no floats (the virtual clock runs no model).
    pub metadata_only: bool,
}

/// Trained weights served instead of the seeded ones (a `grflow train`
/// model directory, checked against the catalog by the caller).
#[derive(Clone, Debug)]
pub struct TrainedWeights {
    /// The transformer as a kernels safetensors file (built into a model
    /// once per process, see [`NodeParams::with_shared_model_and_host`]).
    pub safetensors: Vec<u8>,
    /// Host-tier values per table: `table_rows[t] × d_model` floats.
    pub tables: Vec<Vec<f32>>,
    pub model_version: String,
    /// Histories are cut to their most recent `max_history` items.
    pub max_history: usize,
}

/// Everything a node is built from.
#[derive(Clone, Debug)]
pub struct NodeParams {
    pub model: ModelConfig,
    pub model_seed: u64,
    /// Items returned per response.
    pub top_k: usize,
    /// Generative retrieval: beam width BW and per-beam top-K (xGR).
    pub beam_width: usize,
    pub beam_top_k: usize,
    pub memory: MemoryParams,
    /// Rows of each embedding table (the host tier adds one OOV row each).
    pub table_rows: Vec<u32>,
    pub emb_seed: u64,
    pub shards: ShardMap,
    /// A shard is resident once this share of its rows is cached.
    pub shard_resident_share: f64,
    /// Host→device link: miss lane bandwidth and latency, refill lane cap.
    pub link: LinkConfig,
    /// Event-time service model for the load l(n).
    pub service_tokens_per_ms: f64,
    pub token_capacity: f64,
    /// Users whose prefix head the node remembers at most (least recently
    /// served dropped first): bounds per-user state however many users come.
    pub max_users: usize,
    /// Serve these weights and tables instead of the seeded ones.
    pub trained: Option<Arc<TrainedWeights>>,
    /// The host tier, built once and shared by every node made from these
    /// parameters (it is read-only; 8 nodes would otherwise hold 8 equal
    /// copies). `None`: each node builds its own.
    pub host: Option<Arc<HostTables>>,
    /// The GR model, likewise built once and shared (nodes only read it).
    pub shared_model: Option<Arc<GrModel>>,
}

impl NodeParams {
    /// The host tier these parameters stand for: the trained tables, or
    /// the seeded ones.
    pub fn build_host(&self) -> Result<HostTables, ServeError> {
        match &self.trained {
            Some(t) => HostTables::from_values(&self.table_rows, self.model.d_model, &t.tables)
                .map_err(|e| ServeError::Model(e.to_string())),
            None => Ok(HostTables::new(
                &self.table_rows,
                self.model.d_model,
                self.emb_seed,
            )),
        }
    }

    /// The model these parameters stand for: the trained weights, or the
    /// seeded ones.
    pub fn build_model(&self) -> Result<GrModel, ServeError> {
        match &self.trained {
            Some(t) => GrModel::from_safetensors(&t.safetensors)
                .map_err(|e| ServeError::Model(e.to_string())),
            None => Ok(GrModel::new(self.model.clone(), self.model_seed)),
        }
    }

    /// These parameters with their host tier and model built now, for
    /// every node made from them to share (both are read-only).
    pub fn with_shared_model_and_host(mut self) -> Result<Self, ServeError> {
        if self.host.is_none() {
            self.host = Some(Arc::new(self.build_host()?));
        }
        if self.shared_model.is_none() {
            self.shared_model = Some(Arc::new(self.build_model()?));
        }
        Ok(self)
    }
}

/// The catalog of [`test_params`]'s tables: item i < `items` has feature
/// ids (i mod 200, 7i mod 300), distinct below 600; later items are unknown
/// (each table's OOV row).
#[cfg(test)]
pub(crate) struct TestCatalog(Vec<[u32; 2]>);

#[cfg(test)]
impl TestCatalog {
    pub(crate) fn new(items: u32) -> Self {
        Self((0..items).map(|i| [i % 200, (i * 7) % 300]).collect())
    }
}

#[cfg(test)]
impl super::ItemCatalog for TestCatalog {
    fn feature_ids(&self, item: u32) -> Option<&[u32]> {
        self.0.get(item as usize).map(|f| &f[..])
    }
}

/// A small node for the unit tests of this module's files.
#[cfg(test)]
pub(crate) fn test_params() -> NodeParams {
    const TABLE_ROWS: [u32; 2] = [200, 300];
    let mut model = ModelConfig::preset("small").expect("preset");
    model.n_tables = TABLE_ROWS.len();
    model.codebook_size = 16;
    NodeParams {
        model,
        model_seed: 3,
        top_k: 5,
        beam_width: 8,
        beam_top_k: 8,
        memory: MemoryParams {
            pool_bytes: 4 << 20,
            alpha: 0.5,
            emb_policy: "lru".into(),
            user_kv_policy: "lru".into(),
            item_kv_policy: "lru".into(),
            metadata_only: false,
        },
        table_rows: TABLE_ROWS.to_vec(),
        emb_seed: 11,
        shards: ShardMap::new(&TABLE_ROWS, 16),
        shard_resident_share: 0.5,
        link: LinkConfig {
            bytes_per_s: 25e9,
            latency_ns: 1_000,
            refill_bytes_per_s: 5e9,
        },
        service_tokens_per_ms: 20.0,
        token_capacity: 2000.0,
        max_users: 100,
        trained: None,
        host: None,
        shared_model: None,
    }
}

#[cfg(test)]
mod shared_host_tests {
    use super::*;
    use crate::node::ServingNode;

    #[test]
    fn nodes_from_shared_params_hold_one_host_tier_and_model_equal_to_their_own() {
        let shared = test_params().with_shared_model_and_host().unwrap();
        let host = shared.host.clone().unwrap();
        let a = ServingNode::new(0, shared.clone()).unwrap();
        let b = ServingNode::new(1, shared.clone()).unwrap();
        assert!(Arc::ptr_eq(&a.host, &host) && Arc::ptr_eq(&b.host, &host));
        let model = shared.shared_model.clone().unwrap();
        assert!(Arc::ptr_eq(&a.model, &model) && Arc::ptr_eq(&b.model, &model));
        assert_eq!(a.model_version(), b.model_version());
        // The same values a node builds alone.
        let alone = ServingNode::new(2, test_params()).unwrap();
        assert!(!Arc::ptr_eq(&alone.host, &host));
        assert_eq!(alone.model_version(), a.model_version());
        for t in 0..2u16 {
            for r in [0u32, 7, 199] {
                assert_eq!(alone.host.row(t, r), host.row(t, r));
            }
        }
    }
}
