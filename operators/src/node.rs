//! One serving node: embedding lookup through the EMB cache (misses fetched
//! from the host tier over the link), user-prefix KV reuse, and the GR model
//! forward from kernels/. Plain struct, no timely types: the dataflow wrapper
//! calls `serve` per request in event-time order and `report` once per tick.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use grflow_kernels::{GrModel, ModelConfig};

use crate::host::HostTables;
use crate::memory::{MemoryConfig, MemoryError, NodeMemory};
use crate::router::NodeReport;
use crate::shards::{ShardId, ShardMap};

/// What the node needs to know about items: their embedding feature ids.
pub trait ItemCatalog {
    /// Feature id per embedding table, or `None` for an unknown item.
    fn feature_ids(&self, item: u32) -> Option<&[u32]>;
}

/// The part of a request a node needs (operators/ does not know the trace
/// schema).
#[derive(Clone, Copy, Debug)]
pub struct RankRequest<'a> {
    pub req_id: u64,
    pub user_id: u64,
    pub candidates: &'a [u32],
}

/// Which side of the bipartite sequence was the prefix (BAT).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Prefix {
    User,
    Item,
}

impl Prefix {
    pub fn as_str(self) -> &'static str {
        match self {
            Prefix::User => "user",
            Prefix::Item => "item",
        }
    }
}

/// Everything a node is built from.
#[derive(Clone, Debug)]
pub struct NodeParams {
    pub model: ModelConfig,
    pub model_seed: u64,
    /// Items returned per response.
    pub top_k: usize,
    pub memory: MemoryConfig,
    /// Rows of each embedding table (the host tier adds one OOV row each).
    pub table_rows: Vec<u32>,
    pub emb_seed: u64,
    pub shards: ShardMap,
    /// A shard is resident once this share of its rows is cached.
    pub shard_resident_share: f64,
    /// Host→device link: bytes per second and fixed latency per transfer.
    pub link_bytes_per_s: f64,
    pub link_latency: Duration,
    /// Event-time service model for the load l(n).
    pub service_tokens_per_ms: f64,
    pub token_capacity: f64,
}

/// The result of serving one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Served {
    pub items: Vec<u32>,
    pub scores: Vec<f32>,
    pub prefix: Prefix,
    pub emb_hits: u32,
    pub emb_lookups: u32,
    pub kv_reused_tokens: u32,
    pub kv_total_tokens: u32,
    pub seq_len: u32,
    pub oov_items: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("memory: {0}")]
    Memory(#[from] MemoryError),
    #[error("model: {0}")]
    Model(String),
    #[error("request {req_id} has no candidates")]
    NoCandidates { req_id: u64 },
    #[error("request {req_id}: mode {mode} is not served by this node")]
    UnsupportedMode { req_id: u64, mode: &'static str },
}

/// Cumulative counters of a node.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeCounters {
    pub responses: u64,
    pub emb_hits: u64,
    pub emb_lookups: u64,
    pub kv_reused_tokens: u64,
    pub kv_total_tokens: u64,
    pub link_bytes: u64,
    pub oov_items: u64,
}

#[derive(Debug)]
pub struct ServingNode {
    id: u32,
    params: NodeParams,
    model: GrModel,
    model_version: String,
    host: HostTables,
    memory: NodeMemory,
    counters: NodeCounters,
    /// Resident rows per shard, and the shards the router was last told about.
    shard_rows_resident: HashMap<ShardId, u32>,
    shards_reported: HashSet<ShardId>,
    shards_touched: BTreeSet<ShardId>,
    /// Users whose prefix KV the router was last told is here.
    kv_users_reported: HashSet<u64>,
    /// First KV block of each user's history (the tokens of that block): the
    /// user's prefix is resident while this block is.
    user_heads: HashMap<u64, Vec<u32>>,
    users_touched: BTreeSet<u64>,
    /// Event-time backlog for l(n).
    backlog_tokens: f64,
    backlog_at_ms: u64,
}

impl ServingNode {
    pub fn new(id: u32, params: NodeParams) -> Result<Self, ServeError> {
        let model = GrModel::new(params.model.clone(), params.model_seed);
        let model_version = model.model_version();
        let host = HostTables::new(&params.table_rows, params.model.d_model, params.emb_seed);
        let memory = NodeMemory::new(
            params.memory.clone(),
            params.model.kv_block_floats(),
            params.model.d_model,
            params.model.block_size,
        )?;
        Ok(Self {
            id,
            params,
            model,
            model_version,
            host,
            memory,
            counters: NodeCounters::default(),
            shard_rows_resident: HashMap::new(),
            shards_reported: HashSet::new(),
            shards_touched: BTreeSet::new(),
            kv_users_reported: HashSet::new(),
            user_heads: HashMap::new(),
            users_touched: BTreeSet::new(),
            backlog_tokens: 0.0,
            backlog_at_ms: 0,
        })
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    pub fn alpha(&self) -> f64 {
        self.memory.alpha()
    }

    pub fn model_version(&self) -> &str {
        &self.model_version
    }

    pub fn counters(&self) -> &NodeCounters {
        &self.counters
    }

    /// Serves one rank request at event time `now_ms` whose user history is
    /// `history` (the first hist_len items).
    pub fn serve(
        &mut self,
        now_ms: u64,
        req: RankRequest<'_>,
        history: &[u32],
        catalog: &dyn ItemCatalog,
    ) -> Result<Served, ServeError> {
        if req.candidates.is_empty() {
            return Err(ServeError::NoCandidates { req_id: req.req_id });
        }
        let d = self.params.model.d_model;
        let mut emb = EmbStats::default();

        // Token embeddings: each item is the sum of its rows over all tables.
        let history_tokens = self.item_tokens(history, catalog, &mut emb);
        let candidate_tokens = self.item_tokens(req.candidates, catalog, &mut emb);
        self.pay_link(emb.miss_bytes);

        // User-as-prefix: reuse the cached prefix of the history, compute the rest.
        let prefix = self.memory.kv_match_prefix(history);
        let reused = prefix.matched_tokens.min(history.len());
        let blocks_needed = history
            .len()
            .div_ceil(self.params.model.block_size)
            .saturating_sub(prefix.blocks.len());
        let mut block_table = prefix.blocks.clone();
        let fresh = self.memory.kv_alloc(blocks_needed)?;
        block_table.extend_from_slice(&fresh);
        let new_tokens = &history_tokens[reused * d..];
        let store = self.memory.kv_store();
        let forward = self
            .model
            .prefill(store, &block_table, reused, new_tokens)
            .and_then(|()| {
                self.model
                    .rank_user_prefix(&*store, &block_table, history.len(), &candidate_tokens)
            });
        let scores = match forward {
            Ok(scores) => scores,
            Err(e) => {
                // Give the pages back before reporting: nothing leaks on a failed request.
                self.memory.kv_commit_prefix(&[], &block_table, &prefix);
                return Err(ServeError::Model(e.to_string()));
            }
        };
        // Full blocks join the prefix cache; the partial tail block is scratch.
        self.memory.kv_commit_prefix(history, &block_table, &prefix);
        let block = self.params.model.block_size;
        if history.len() >= block {
            self.user_heads
                .entry(req.user_id)
                .or_insert_with(|| history[..block].to_vec());
            self.users_touched.insert(req.user_id);
        }

        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        order.truncate(self.params.top_k);
        let items = order.iter().map(|&i| req.candidates[i]).collect();
        let top_scores = order.iter().map(|&i| scores[i]).collect();

        let tokens = history.len() + req.candidates.len() + 1;
        let computed = tokens - reused;
        self.add_backlog(now_ms, computed as f64);

        self.counters.responses += 1;
        self.counters.emb_hits += emb.hits as u64;
        self.counters.emb_lookups += emb.lookups as u64;
        self.counters.kv_reused_tokens += reused as u64;
        self.counters.kv_total_tokens += history.len() as u64;
        self.counters.link_bytes += emb.miss_bytes as u64;
        self.counters.oov_items += emb.oov_items as u64;
        Ok(Served {
            items,
            scores: top_scores,
            prefix: Prefix::User,
            emb_hits: emb.hits,
            emb_lookups: emb.lookups,
            kv_reused_tokens: reused as u32,
            kv_total_tokens: history.len() as u32,
            seq_len: tokens as u32,
            oov_items: emb.oov_items,
        })
    }

    /// Residency changes since the previous report, and the load now.
    pub fn report(&mut self, now_ms: u64) -> NodeReport {
        let mut report = NodeReport {
            node: self.id,
            at_ms: now_ms,
            inflight_tokens: self.backlog(now_ms),
            token_capacity: self.params.token_capacity,
            service_tokens_per_ms: self.params.service_tokens_per_ms,
            ..Default::default()
        };
        // Evictions can remove any user's prefix, so users already reported
        // are rechecked too; the set is bounded by what the KV share holds.
        let mut check: BTreeSet<u64> = std::mem::take(&mut self.users_touched);
        check.extend(self.kv_users_reported.iter().copied());
        for user in check {
            let block = self.params.model.block_size;
            let resident = self
                .user_heads
                .get(&user)
                .is_some_and(|head| self.memory.kv_cached_prefix_len(head) >= block);
            let known = self.kv_users_reported.contains(&user);
            if resident && !known {
                self.kv_users_reported.insert(user);
                report.kv_users_added.push(user);
            } else if !resident && known {
                self.kv_users_reported.remove(&user);
                report.kv_users_removed.push(user);
            }
        }
        let threshold =
            (self.params.shards.shard_rows() as f64 * self.params.shard_resident_share).max(1.0);
        for shard in std::mem::take(&mut self.shards_touched) {
            let resident =
                self.shard_rows_resident.get(&shard).copied().unwrap_or(0) as f64 >= threshold;
            let known = self.shards_reported.contains(&shard);
            if resident && !known {
                self.shards_reported.insert(shard);
                report.shards_added.push(shard);
            } else if !resident && known {
                self.shards_reported.remove(&shard);
                report.shards_removed.push(shard);
            }
        }
        report
    }

    fn backlog(&self, now_ms: u64) -> f64 {
        let drained =
            self.params.service_tokens_per_ms * now_ms.saturating_sub(self.backlog_at_ms) as f64;
        (self.backlog_tokens - drained).max(0.0)
    }

    fn add_backlog(&mut self, now_ms: u64, tokens: f64) {
        self.backlog_tokens = self.backlog(now_ms) + tokens;
        self.backlog_at_ms = self.backlog_at_ms.max(now_ms);
    }

    /// Summed embedding rows of `items`, `d_model` floats each, through the
    /// EMB cache.
    fn item_tokens(
        &mut self,
        items: &[u32],
        catalog: &dyn ItemCatalog,
        stats: &mut EmbStats,
    ) -> Vec<f32> {
        let d = self.params.model.d_model;
        let tables = self.host.tables();
        let mut out = vec![0f32; items.len() * d];
        for (i, &item) in items.iter().enumerate() {
            let features = catalog.feature_ids(item);
            if features.is_none() {
                stats.oov_items += 1;
            }
            let token = &mut out[i * d..(i + 1) * d];
            for t in 0..tables {
                let feature = features.and_then(|f| f.get(t).copied()).unwrap_or(u32::MAX);
                let (row, _) = self.host.resolve(t as u16, feature);
                stats.lookups += 1;
                if let Some(values) = self.memory.emb_get(t as u16, row) {
                    stats.hits += 1;
                    add(token, values);
                    continue;
                }
                let values = self.host.row(t as u16, row);
                add(token, values);
                stats.miss_bytes += self.host.row_bytes();
                for (table, row, delta) in self.memory.emb_insert(t as u16, row, values) {
                    let shard = self.params.shards.shard_of(table, row);
                    let count = self.shard_rows_resident.entry(shard).or_default();
                    *count = count.saturating_add_signed(delta);
                    self.shards_touched.insert(shard);
                }
            }
        }
        out
    }

    /// Waits for a host→device transfer of `bytes` at the link's bandwidth:
    /// on the CPU backend the device pool is host memory, so the link paces
    /// the copy to what PCIe would cost.
    fn pay_link(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let cost = self.params.link_latency
            + Duration::from_secs_f64(bytes as f64 / self.params.link_bytes_per_s);
        let until = Instant::now() + cost;
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }
}

#[derive(Debug, Default)]
struct EmbStats {
    hits: u32,
    lookups: u32,
    miss_bytes: usize,
    oov_items: u32,
}

fn add(acc: &mut [f32], row: &[f32]) {
    for (a, r) in acc.iter_mut().zip(row) {
        *a += r;
    }
}
