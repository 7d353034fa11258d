//! One serving node: embedding lookup through the EMB cache (misses fetched
//! from the host tier over the link), user-prefix KV reuse, and the GR model
//! forward from kernels/. Plain struct, no timely types: the dataflow wrapper
//! calls `serve` per request in event-time order and `report` once per tick.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use grflow_kernels::{BeamSearch, GrModel, ModelConfig, SID_STEPS};

use crate::cache::{
    BoundaryMove, KvTenant, MemoryError, MemoryStats, NodeMemory, NodeMemoryConfig, PrefixMatch,
};
use crate::history::{HistoryLimits, Task, pinnable_pages};
use crate::host::HostTables;
use crate::link::LinkConfig;
use crate::lru::LruMap;
use crate::retrieval::RetrievalIndex;
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

/// A generative-retrieval request: the user's history is the prompt.
#[derive(Clone, Copy, Debug)]
pub struct RetrieveRequest {
    pub req_id: u64,
    pub user_id: u64,
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
    /// Latency under the event-time service model: the node's backlog
    /// including this request over its service rate, plus the link time of
    /// the request's embedding misses. Deterministic, unlike wall latency.
    pub modelled_latency_ms: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error("memory: {0}")]
    Memory(#[from] MemoryError),
    #[error("model: {0}")]
    Model(String),
    #[error("request {req_id} has no candidates")]
    NoCandidates { req_id: u64 },
    #[error("request {req_id}: the catalog has no semantic IDs to retrieve from")]
    EmptyCatalog { req_id: u64 },
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
    /// Requests served with only the most recent part of their history.
    #[serde(default)]
    pub truncated_histories: u64,
    /// User prefix heads dropped because the table was full (max_users).
    pub user_head_evictions: u64,
}

#[derive(Debug)]
pub struct ServingNode {
    id: u32,
    params: NodeParams,
    model: GrModel,
    model_version: String,
    host: HostTables,
    memory: NodeMemory,
    /// How much of a history a request is served with.
    history_limits: HistoryLimits,
    counters: NodeCounters,
    /// Resident rows per shard, and the shards the router was last told about.
    shard_rows_resident: HashMap<ShardId, u32>,
    shards_reported: HashSet<ShardId>,
    shards_touched: BTreeSet<ShardId>,
    /// Users whose prefix KV the router was last told is here.
    kv_users_reported: HashSet<u64>,
    /// First KV block of each user's history (the tokens of that block): the
    /// user's prefix is resident while this block is. Bounded by
    /// `max_users`; a dropped user is reported as no longer resident.
    user_heads: LruMap<Vec<u32>>,
    users_touched: BTreeSet<u64>,
    /// Event-time backlog for l(n).
    backlog_tokens: f64,
    backlog_at_ms: u64,
    /// Beam buffers, allocated on the first retrieve request and reused.
    beam: Option<BeamSearch>,
    /// Origin of the link's nanosecond clock.
    started: Instant,
}

impl ServingNode {
    pub fn new(id: u32, params: NodeParams) -> Result<Self, ServeError> {
        let model = GrModel::new(params.model.clone(), params.model_seed);
        let model_version = model.model_version();
        let host = HostTables::new(&params.table_rows, params.model.d_model, params.emb_seed);
        let m = &params.memory;
        let memory = NodeMemory::new(NodeMemoryConfig {
            pool_bytes: m.pool_bytes,
            page_floats: params.model.kv_block_floats(),
            block_tokens: params.model.block_size,
            emb_row_floats: params.model.d_model,
            alpha: m.alpha,
            emb_policy: m.emb_policy.clone(),
            user_kv_policy: m.user_kv_policy.clone(),
            item_kv_policy: m.item_kv_policy.clone(),
            link: params.link,
        })?;
        let stats = memory.stats();
        let history_limits =
            HistoryLimits::new(&params.model, pinnable_pages(stats.pages - stats.emb_pages));
        let user_heads = LruMap::new(params.max_users);
        Ok(Self {
            id,
            params,
            model,
            model_version,
            host,
            memory,
            history_limits,
            counters: NodeCounters::default(),
            shard_rows_resident: HashMap::new(),
            shards_reported: HashSet::new(),
            shards_touched: BTreeSet::new(),
            kv_users_reported: HashSet::new(),
            user_heads,
            users_touched: BTreeSet::new(),
            backlog_tokens: 0.0,
            backlog_at_ms: 0,
            beam: None,
            started: Instant::now(),
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

    /// The most recent items of a history this node serves a request with
    /// (decoders truncate with the same limits before any cache work).
    pub fn history_limits(&self) -> HistoryLimits {
        self.history_limits
    }

    /// The memory pool and its caches, read-only (residency checks).
    pub fn memory(&self) -> &NodeMemory {
        &self.memory
    }

    /// Users whose prefix head the node tracks now (at most `max_users`).
    pub fn user_heads(&self) -> usize {
        self.user_heads.len()
    }

    /// The most user prefix heads ever tracked at once.
    pub fn user_heads_peak(&self) -> usize {
        self.user_heads.peak_len()
    }

    /// Pool, cache and link telemetry.
    pub fn memory_stats(&self) -> MemoryStats {
        self.memory.stats()
    }

    /// Moves the EMB/KV boundary (HLEM §IV-B); the allocator calls this.
    /// Shard residency is recounted so the next report tells the router.
    pub fn set_alpha(&mut self, alpha: f64) -> Result<BoundaryMove, ServeError> {
        let moved = self.memory.set_alpha(alpha)?;
        self.recount_shards();
        Ok(moved)
    }

    /// Serves one rank request at event time `now_ms` whose user history is
    /// `history` (the first hist_len items): User-as-prefix ranking of the
    /// candidates on top of the user's cached history KV.
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
        let history = self.truncate(history, Task::Rank);
        self.advance_refill();
        let mut emb = EmbStats::default();
        // Token embeddings: each item is the sum of its rows over all tables.
        let history_tokens = self.item_tokens(history, catalog, &mut emb);
        let candidate_tokens = self.item_tokens(req.candidates, catalog, &mut emb);
        self.pay_link(emb.miss_bytes);

        let prefix = self.prefill_user(history, &history_tokens)?;
        let ranked = self.model.rank_user_prefix(
            &*self.memory.kv_store(),
            &prefix.block_table,
            history.len(),
            &candidate_tokens,
        );
        let scores = match ranked {
            Ok(scores) => scores,
            Err(e) => {
                self.release_user(&prefix);
                return Err(ServeError::Model(e.to_string()));
            }
        };
        self.commit_user(req.user_id, history, &prefix);

        let mut order: Vec<usize> = (0..scores.len()).collect();
        order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
        order.truncate(self.params.top_k);
        let items = order.iter().map(|&i| req.candidates[i]).collect();
        let top_scores = order.iter().map(|&i| scores[i]).collect();
        let tokens = history.len() + req.candidates.len() + 1;
        Ok(self.finish(
            now_ms,
            items,
            top_scores,
            tokens,
            prefix.reused,
            history.len(),
            &emb,
        ))
    }

    /// Serves one generative-retrieval request (xGR): the user's history is
    /// the shared prompt, beam search decodes semantic-ID triplets constrained
    /// to the catalog, and the best `top_k` items come back with their
    /// log-probabilities as scores.
    pub fn serve_retrieve(
        &mut self,
        now_ms: u64,
        req: RetrieveRequest,
        history: &[u32],
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
    ) -> Result<Served, ServeError> {
        if index.is_empty() {
            return Err(ServeError::EmptyCatalog { req_id: req.req_id });
        }
        let history = self.truncate(history, Task::Retrieve);
        self.advance_refill();
        let mut emb = EmbStats::default();
        let history_tokens = self.item_tokens(history, catalog, &mut emb);
        self.pay_link(emb.miss_bytes);

        let prefix = self.prefill_user(history, &history_tokens)?;
        if self.beam.is_none() {
            let cfg = &self.params.model;
            let max_prompt = cfg.max_positions.saturating_sub(SID_STEPS);
            let beam = BeamSearch::new(
                cfg,
                self.params.beam_width,
                self.params.beam_top_k,
                max_prompt,
            )
            .map_err(|e| ServeError::Model(e.to_string()));
            match beam {
                Ok(beam) => self.beam = Some(beam),
                Err(e) => {
                    self.release_user(&prefix);
                    return Err(e);
                }
            }
        }
        let beam = self.beam.as_mut().expect("created above");
        let generated = beam.generate(
            &self.model,
            &*self.memory.kv_store(),
            &prefix.block_table,
            history.len(),
            index.trie(),
        );
        let (items, scores): (Vec<u32>, Vec<f32>) = match generated {
            Ok(hits) => hits
                .iter()
                .filter_map(|h| index.item(h.sid).map(|item| (item, h.log_prob)))
                .take(self.params.top_k)
                .unzip(),
            Err(e) => {
                self.release_user(&prefix);
                return Err(ServeError::Model(e.to_string()));
            }
        };
        self.commit_user(req.user_id, history, &prefix);
        let tokens = history.len() + SID_STEPS * self.params.beam_width;
        Ok(self.finish(
            now_ms,
            items,
            scores,
            tokens,
            prefix.reused,
            history.len(),
            &emb,
        ))
    }

    /// The most recent part of `history` that fits, before any cache work;
    /// counted when something was dropped.
    fn truncate<'h>(&mut self, history: &'h [u32], task: Task) -> &'h [u32] {
        let kept = self.history_limits.keep(history, task);
        if kept.len() < history.len() {
            self.counters.truncated_histories += 1;
        }
        kept
    }

    /// Computes the KV of `history` (token embeddings `history_tokens`) on
    /// top of its longest cached prefix.
    fn prefill_user(
        &mut self,
        history: &[u32],
        history_tokens: &[f32],
    ) -> Result<UserPrefix, ServeError> {
        let d = self.params.model.d_model;
        let matched = self.memory.kv_match(history);
        let reused = matched.matched_tokens.min(history.len());
        let blocks_needed = history
            .len()
            .div_ceil(self.params.model.block_size)
            .saturating_sub(matched.blocks.len());
        let mut block_table = matched.blocks.clone();
        let fresh = match self.memory.kv_alloc(blocks_needed, KvTenant::UserPrefix) {
            Ok(fresh) => fresh,
            Err(e) => {
                // Unpin the matched blocks: nothing leaks on a failed request.
                self.memory.kv_release(&matched, &[]);
                return Err(e.into());
            }
        };
        block_table.extend_from_slice(&fresh);
        let prefix = UserPrefix {
            block_table,
            matched,
            reused,
        };
        let store = self.memory.kv_store();
        if let Err(e) = self.model.prefill(
            store,
            &prefix.block_table,
            reused,
            &history_tokens[reused * d..],
        ) {
            self.release_user(&prefix);
            return Err(ServeError::Model(e.to_string()));
        }
        Ok(prefix)
    }

    /// Gives a failed request's pages back without caching anything.
    fn release_user(&mut self, prefix: &UserPrefix) {
        let fresh = &prefix.block_table[prefix.matched.blocks.len()..];
        self.memory.kv_release(&prefix.matched, fresh);
    }

    /// Full blocks of the history join the prefix cache; the partial tail
    /// block is scratch.
    fn commit_user(&mut self, user_id: u64, history: &[u32], prefix: &UserPrefix) {
        self.memory
            .kv_commit(history, &prefix.block_table, &prefix.matched);
        let block = self.params.model.block_size;
        if history.len() >= block {
            let head = &history[..block];
            let kept = self
                .user_heads
                .get_or_insert_with(user_id, || head.to_vec());
            if kept.as_slice() != head {
                // The history's first block changed (e.g. truncated): track the new one.
                kept.clear();
                kept.extend_from_slice(head);
            }
            self.counters.user_head_evictions = self.user_heads.evictions();
            self.users_touched.insert(user_id);
        }
    }

    /// Books a served request: backlog, counters, and the response.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        now_ms: u64,
        items: Vec<u32>,
        scores: Vec<f32>,
        tokens: usize,
        reused: usize,
        history_len: usize,
        emb: &EmbStats,
    ) -> Served {
        let computed = tokens - reused;
        let backlog = self.add_backlog(now_ms, computed as f64);
        let link_ms = if emb.miss_bytes == 0 {
            0.0
        } else {
            self.link_cost(emb.miss_bytes).as_secs_f64() * 1e3
        };
        self.counters.responses += 1;
        self.counters.emb_hits += emb.hits as u64;
        self.counters.emb_lookups += emb.lookups as u64;
        self.counters.kv_reused_tokens += reused as u64;
        self.counters.kv_total_tokens += history_len as u64;
        self.counters.link_bytes += emb.miss_bytes as u64;
        self.counters.oov_items += emb.oov_items as u64;
        Served {
            items,
            scores,
            prefix: Prefix::User,
            emb_hits: emb.hits,
            emb_lookups: emb.lookups,
            kv_reused_tokens: reused as u32,
            kv_total_tokens: history_len as u32,
            seq_len: tokens as u32,
            oov_items: emb.oov_items,
            modelled_latency_ms: backlog / self.params.service_tokens_per_ms + link_ms,
        }
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
                .get(user)
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

    /// Queues `tokens` of work at `now_ms`; returns the backlog including them.
    fn add_backlog(&mut self, now_ms: u64, tokens: f64) -> f64 {
        self.backlog_tokens = self.backlog(now_ms) + tokens;
        self.backlog_at_ms = self.backlog_at_ms.max(now_ms);
        self.backlog_tokens
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
                if let Some(values) = self.memory.emb_lookup(t as u16, row) {
                    stats.hits += 1;
                    add(token, values);
                    continue;
                }
                let values = self.host.row(t as u16, row);
                add(token, values);
                stats.miss_bytes += self.host.row_bytes();
                let evicted = self.memory.emb_insert(t as u16, row, values);
                if self.memory.emb_contains(t as u16, row) {
                    self.count_shard_row(t as u16, row, 1);
                }
                for (table, row) in evicted {
                    self.count_shard_row(table, row, -1);
                }
            }
        }
        out
    }

    fn count_shard_row(&mut self, table: u16, row: u32, delta: i32) {
        let shard = self.params.shards.shard_of(table, row);
        let count = self.shard_rows_resident.entry(shard).or_default();
        *count = count.saturating_add_signed(delta);
        self.shards_touched.insert(shard);
    }

    /// Waits for a host→device transfer of `bytes` on the link's miss lane:
    /// on the CPU backend the device pool is host memory, so the link paces
    /// the copy to what PCIe would cost (queueing behind earlier misses).
    fn pay_link(&mut self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let now = self.clock_ns();
        let done = self.memory.link().miss_transfer(bytes as u64, now);
        let until = self.started + Duration::from_nanos(done);
        while Instant::now() < until {
            std::hint::spin_loop();
        }
    }

    /// Lets background refill (after an α move) use the idle link up to now.
    fn advance_refill(&mut self) {
        let now = self.clock_ns();
        let host = &self.host;
        let refilled = self
            .memory
            .advance_refill(now, &|t, r| host.row(t, r).to_vec());
        if refilled > 0 {
            self.recount_shards();
        }
    }

    /// Nanoseconds since the node started: the link's clock.
    fn clock_ns(&self) -> u64 {
        self.started.elapsed().as_nanos() as u64
    }

    /// Transfer time of `bytes` on an idle miss lane (the event-time model).
    fn link_cost(&self, bytes: usize) -> Duration {
        let link = &self.params.link;
        Duration::from_nanos(link.latency_ns)
            + Duration::from_secs_f64(bytes as f64 / link.bytes_per_s)
    }

    /// Recounts resident rows of every shard ever seen (after the EMB share
    /// changed under the counters: boundary moves and refill).
    fn recount_shards(&mut self) {
        let shards: Vec<ShardId> = self.shard_rows_resident.keys().copied().collect();
        for shard in shards {
            let (table, rows) = self.params.shards.rows_of(shard);
            let resident = rows.filter(|&r| self.memory.emb_contains(table, r)).count() as u32;
            self.shard_rows_resident.insert(shard, resident);
            self.shards_touched.insert(shard);
        }
    }
}

/// The user's history KV while a request runs on it.
struct UserPrefix {
    block_table: Vec<u32>,
    matched: PrefixMatch,
    reused: usize,
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
