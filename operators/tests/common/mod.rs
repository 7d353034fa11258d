//! Setup shared by the serving-node integration tests: a small item
//! catalog, the node parameters they start from, and their histories.

// Each test binary uses only part of this module.
#![allow(dead_code)]

use std::collections::HashMap;

use grflow_kernels::ModelConfig;
use grflow_operators::link::LinkConfig;
use grflow_operators::node::{ItemCatalog, MemoryParams, NodeParams};
use grflow_operators::shards::ShardMap;

pub const TABLE_ROWS: [u32; 2] = [200, 300];
/// Item ids the histories draw from (`history` wraps at this).
pub const ITEMS: u32 = 500;

/// Items `0..items`, each with one feature id per table.
pub struct Catalog(HashMap<u32, Vec<u32>>);

impl Catalog {
    pub fn new(items: u32) -> Self {
        Self(
            (0..items)
                .map(|i| (i, vec![i % TABLE_ROWS[0], (i * 7) % TABLE_ROWS[1]]))
                .collect(),
        )
    }
}

impl ItemCatalog for Catalog {
    fn feature_ids(&self, item: u32) -> Option<&[u32]> {
        self.0.get(&item).map(|f| f.as_slice())
    }
}

/// A small node over `TABLE_ROWS` with a pool of `pool_bytes`: α 0.5,
/// beams of 8, LRU everywhere. Tests change the fields they vary.
pub fn node_params(pool_bytes: u64) -> NodeParams {
    let mut model = ModelConfig::preset("small").unwrap();
    model.n_tables = TABLE_ROWS.len();
    model.codebook_size = 16;
    NodeParams {
        model,
        model_seed: 3,
        top_k: 5,
        beam_width: 8,
        beam_top_k: 8,
        memory: MemoryParams {
            pool_bytes,
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
        max_users: 100_000,
        trained: None,
        host: None,
        shared_model: None,
    }
}

/// `len` items of one fixed pseudo-random walk over the catalog.
pub fn history(len: usize) -> Vec<u32> {
    salted_history(len, 0)
}

/// `history` shifted by `salt`: a different walk with the same shape.
pub fn salted_history(len: usize, salt: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (i * 37 + 5 + salt) % ITEMS)
        .collect()
}

/// A sparse catalog: 60 of the 16^3 semantic IDs exist.
pub fn sparse_sids() -> Vec<(u32, [u16; 3])> {
    (0..60u32)
        .map(|i| {
            (
                i * 3,
                [
                    (i % 16) as u16,
                    ((i * 5) % 16) as u16,
                    ((i * 11) % 16) as u16,
                ],
            )
        })
        .collect()
}
