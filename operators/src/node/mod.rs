//! One serving node: the GR model forward from kernels/ on top of the EMB
//! cache and user-prefix KV reuse. Plain structs, no timely types: the
//! dataflow wrapper calls `serve` per request in event-time order, `apply`
//! for commands, and `report` once per batch. Each file does one job:
//! - `params`: what a node is built from;
//! - `rank`: rank requests, batched, over the node's lanes;
//! - `retrieve`: generative-retrieval requests, computed in groups;
//! - `counters`: the node's cumulative counters and histograms;
//! - `plan`: what a request is served with and what it costs;
//! - `embedding`: token embeddings through the EMB cache and the link;
//! - `prefix`: user-prefix KV reuse, and the one release path on failure;
//! - `residency`: what the router is told;
//! - `load`: the event-time backlog behind l(n) and modelled latency;
//! - `deadline`: shedding requests that waited too long;
//! - `command`: commands from the control input;
//! - `batching`: which queued requests form the next batches (xSchedule);
//! - `lanes`: several batches computed at once over one KV pool.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use grflow_kernels::cost::CostModel;
use grflow_kernels::{BeamSearch, GrModel};

use crate::cache::{BoundaryMove, MemoryError, MemoryStats, NodeMemory, NodeMemoryConfig};
use crate::history::{HistoryLimits, pinnable_pages};
use crate::host::HostTables;
use crate::retrieval::RetrievalIndex;
use crate::router::NodeReport;

pub mod batching;
mod command;
mod counters;
mod deadline;
pub mod embedding;
pub mod lanes;
pub mod load;
mod params;
pub mod plan;
pub mod prefix;
mod rank;
pub mod residency;
mod retrieve;

pub use command::{Applied, NodeCommand};
pub use counters::{BATCH_BUCKETS, NodeCounters, WAIT_BUCKETS_MS};
pub use deadline::{DeadlineCheck, DeadlineShedder, Deadlined, Shedding};
pub use params::{MemoryParams, NodeParams, TrainedWeights};
#[cfg(test)]
pub(crate) use params::{TestCatalog, test_params};
pub use rank::{RankRequest, RankWork};
pub use retrieve::{MAX_RETRIEVE_GROUP, RetrieveRequest, RetrieveWork};

use embedding::{EmbStats, LinkClock, Lookup, link_cost};
use load::{Backlog, ReportedLoad, VirtualLoad};
use plan::Plan;
use prefix::UserPrefixes;
use residency::Residency;
use retrieve::RetrieveGroup;

/// What the node needs to know about items: their embedding feature ids.
pub trait ItemCatalog {
    /// Feature id per embedding table, or `None` for an unknown item.
    fn feature_ids(&self, item: u32) -> Option<&[u32]>;
}

/// A request's response or why it failed.
pub type Outcome = Result<Served, ServeError>;

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
    /// The history was cut to its most recent items that fit.
    pub truncated: bool,
    /// Latency under the event-time service model: the node's backlog
    /// including this request over its service rate, plus the link time of
    /// the request's embedding misses. Deterministic, unlike wall latency.
    pub modelled_latency_ms: f64,
}

#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    // Every MemoryError names its key or its cause itself.
    #[error(transparent)]
    Memory(#[from] MemoryError),
    #[error("model: {0}")]
    Model(String),
    #[error("request {req_id} has no candidates")]
    NoCandidates { req_id: u64 },
    #[error("request {req_id}: the catalog has no semantic IDs to retrieve from")]
    EmptyCatalog { req_id: u64 },
    #[error("alpha is pinned at {0} by the operator (PinAlpha(None) releases it)")]
    AlphaPinned(f64),
}

#[derive(Debug)]
pub struct ServingNode {
    id: u32,
    params: NodeParams,
    model: Arc<GrModel>,
    model_version: String,
    host: Arc<HostTables>,
    memory: NodeMemory,
    /// How much of a history a request is served with.
    history_limits: HistoryLimits,
    counters: NodeCounters,
    residency: Residency,
    prefixes: UserPrefixes,
    backlog: Backlog,
    /// Beam buffers, one per retrieve request computed at once, allocated
    /// on first use and reused.
    beams: Vec<BeamSearch>,
    link_clock: LinkClock,
    /// Execution lanes a rank batch is split over (1 = this thread only).
    lanes: usize,
    /// The virtual clock: model work is charged from this cost model
    /// instead of run.
    virtual_compute: Option<VirtualCompute>,
    /// α pinned by an operator (`NodeCommand::PinAlpha`): the allocator's
    /// `SetAlpha` is refused meanwhile.
    alpha_pin: Option<f64>,
    /// User-head evictions of the prefix tables before the last model swap.
    head_evictions_before: u64,
}

/// A node on the virtual clock: its compute timeline.
#[derive(Clone, Debug)]
struct VirtualCompute {
    cost: CostModel,
    /// Event time (ms) at which the node's model is free again.
    free_at_ms: f64,
    /// The requests not answered yet in modelled time: l(n) for the router.
    load: VirtualLoad,
}

impl ServingNode {
    pub fn new(id: u32, params: NodeParams) -> Result<Self, ServeError> {
        let model = match &params.shared_model {
            Some(m) => m.clone(),
            None => Arc::new(params.build_model()?),
        };
        let model_version = match &params.trained {
            Some(t) => t.model_version.clone(),
            None => model.model_version(),
        };
        let host = match &params.host {
            Some(h) => h.clone(),
            None => Arc::new(params.build_host()?),
        };
        let m = &params.memory;
        let memory = NodeMemory::with_storage(
            NodeMemoryConfig {
                pool_bytes: m.pool_bytes,
                page_floats: params.model.kv_block_floats(),
                block_tokens: params.model.block_size,
                emb_row_floats: params.model.d_model,
                alpha: m.alpha,
                emb_policy: m.emb_policy.clone(),
                user_kv_policy: m.user_kv_policy.clone(),
                item_kv_policy: m.item_kv_policy.clone(),
                link: params.link,
            },
            m.metadata_only,
        )?;
        // From the whole pool, not the KV share: a request that does not fit
        // the KV share takes pages back from EMB, so α is a speed knob and
        // never changes which items a request is served with (a node built
        // at another α, or whose α moved, answers the same).
        let mut history_limits =
            HistoryLimits::new(&params.model, pinnable_pages(memory.stats().pages));
        if let Some(t) = &params.trained {
            history_limits = history_limits.capped(t.max_history, params.model.block_size);
        }
        let prefixes = UserPrefixes::new(params.max_users, params.model.block_size);
        let backlog = Backlog::new(params.service_tokens_per_ms);
        Ok(Self {
            id,
            params,
            model,
            model_version,
            host,
            memory,
            history_limits,
            counters: NodeCounters::default(),
            residency: Residency::default(),
            prefixes,
            backlog,
            beams: Vec::new(),
            link_clock: LinkClock::start(),
            lanes: 1,
            virtual_compute: None,
            alpha_pin: None,
            head_evictions_before: 0,
        })
    }

    pub fn id(&self) -> u32 {
        self.id
    }

    /// Puts the node on the virtual clock: model work is not run but
    /// charged from `cost` on the node's own timeline, so a response's
    /// `modelled_latency_ms` is its queueing behind earlier work plus its
    /// compute and link time. Cache, pool and routing work as usual, but
    /// the pool holds metadata only and the link runs on event time; rank
    /// responses list the first `top_k` candidates and retrieve responses
    /// no items (nothing was scored).
    pub fn set_virtual(&mut self, cost: CostModel) {
        self.virtual_compute = Some(VirtualCompute {
            cost,
            free_at_ms: 0.0,
            load: VirtualLoad::default(),
        });
        self.link_clock = LinkClock::event();
        self.memory.keep_metadata_only();
    }

    /// Splits each rank batch over up to `lanes` threads (`node.lanes`):
    /// the same results, computed at once with no lock around the model.
    pub fn set_lanes(&mut self, lanes: usize) {
        self.lanes = lanes.max(1);
    }

    pub fn alpha(&self) -> f64 {
        self.memory.alpha()
    }

    /// Whether an operator pinned α (`NodeCommand::PinAlpha`).
    pub fn alpha_pinned(&self) -> bool {
        self.alpha_pin.is_some()
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
        self.prefixes.len()
    }

    /// The most user prefix heads ever tracked at once.
    pub fn user_heads_peak(&self) -> usize {
        self.prefixes.peak_len()
    }

    /// Pool, cache and link telemetry.
    pub fn memory_stats(&self) -> MemoryStats {
        self.memory.stats()
    }

    /// An independent copy of the node in its current state: pool, caches,
    /// prefixes, link, counters and compute timeline (model and host tables
    /// are shared, read-only). Serving the same requests on the copy gives
    /// what the node would give; the oracle α* replays an epoch at every α
    /// from copies. Refused for eviction policies that learn online.
    pub fn snapshot(&self) -> Result<Self, ServeError> {
        Ok(Self {
            id: self.id,
            params: self.params.clone(),
            model: self.model.clone(),
            model_version: self.model_version.clone(),
            host: self.host.clone(),
            memory: self.memory.try_clone()?,
            history_limits: self.history_limits,
            counters: self.counters.clone(),
            residency: self.residency.clone(),
            prefixes: self.prefixes.clone(),
            backlog: self.backlog.clone(),
            // Beam buffers are scratch, allocated again on first use.
            beams: Vec::new(),
            link_clock: self.link_clock,
            lanes: self.lanes,
            virtual_compute: self.virtual_compute.clone(),
            alpha_pin: self.alpha_pin,
            head_evictions_before: self.head_evictions_before,
        })
    }

    /// Moves the EMB/KV boundary (HLEM §IV-B) now, after the last request
    /// served. Shard residency is recounted when rows were evicted (and
    /// counted row by row as the refill of a growing share lands), so the
    /// next report tells the router.
    pub fn set_alpha(&mut self, alpha: f64) -> Result<BoundaryMove, ServeError> {
        self.set_alpha_at(alpha, 0)
    }

    /// [`Self::set_alpha`] at event time `now_ms` (a command's stamp): on
    /// the event clock the refill it starts gets the link only from then.
    pub fn set_alpha_at(&mut self, alpha: f64, now_ms: u64) -> Result<BoundaryMove, ServeError> {
        let moved = self.memory.set_alpha(alpha, self.link_clock.at(now_ms))?;
        // Only evictions change which rows are cached: growing the EMB
        // share adds free slots (its refill is counted row by row as it
        // lands) and compaction moves rows without dropping them.
        self.count_rows(&moved.emb_evicted, -1);
        if moved.pages_to_emb != 0 {
            let c = &mut self.counters;
            c.alpha_moves += 1;
            c.refill_bytes += moved.refill_bytes;
            c.refill_bytes_max_per_move = c.refill_bytes_max_per_move.max(moved.refill_bytes);
        }
        Ok(moved)
    }

    /// A request alone failed for want of KV pages: the KV share takes the
    /// shortfall back from EMB (α goes down). Whether any page moved, so
    /// that trying again can go further.
    fn reclaim_for(&mut self, e: &ServeError) -> bool {
        let ServeError::Memory(MemoryError::KvFull {
            wanted,
            free,
            evictable,
        }) = e
        else {
            return false;
        };
        // What evicting every unpinned KV entry would not free (the retry
        // evicts those), as when the failed try had evicted them first.
        let (moved, evicted) = self
            .memory
            .reclaim_for_kv(wanted.saturating_sub(free + evictable).max(1));
        self.count_rows(&evicted, -1);
        if moved > 0 {
            self.counters.kv_reclaims += 1;
        }
        moved > 0
    }

    /// EMB rows that entered (`delta` 1: a refill placed them) or left
    /// (-1: a shrinking share evicted them) counted into their shards one
    /// by one; a full recount walks every row of every shard ever touched.
    /// The OOV row stands for no item and is never counted (as in
    /// `Lookup::item_tokens` and `counted_as_cached`).
    fn count_rows(&mut self, rows: &[(u16, u32)], delta: i32) {
        for &(table, row) in rows {
            if row != self.host.oov_row(table) {
                self.residency
                    .count_row(&self.params.shards, table, row, delta);
            }
        }
    }

    /// Serves a batch of rank requests and retrieve requests in the same
    /// step. The retrieve requests are computed together: their prompts
    /// prefilled in one set of GEMMs and their beams decoded together (xGR
    /// batches the beams of several requests). With two lanes or more the
    /// retrieve group (split over the lanes when there is no rank work) is
    /// a job beside the rank batch's groups, and the lanes take the jobs as
    /// they come free, so neither kind waits for the other. Retrieve
    /// requests past [`MAX_RETRIEVE_GROUP`] or whose pages do not fit beside
    /// the group are served after it, group by group, each split over the
    /// lanes. Results equal serving them one after another (within float
    /// rounding).
    pub fn serve_step(
        &mut self,
        now_ms: u64,
        rank: &[RankWork<'_>],
        retrieve: &[RetrieveWork<'_>],
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
    ) -> (Vec<Outcome>, Vec<Outcome>) {
        self.link_clock.observe(now_ms);
        if self.lanes < 2 {
            let retrieved = self.serve_retrieve_batch(now_ms, retrieve, catalog, index);
            return (self.serve_rank_batch(now_ms, rank, catalog), retrieved);
        }
        let mut retrieved: Vec<Option<Outcome>> = retrieve.iter().map(|_| None).collect();
        // The rank work goes with the first group; the later groups run alone.
        let mut rank = rank;
        let mut ranked = Vec::new();
        let mut from = 0;
        loop {
            // The requests from `later` on did not fit beside the group
            // (pages, or `MAX_RETRIEVE_GROUP`): the next group takes them
            // (pages freed by then), split over the lanes as well.
            let (preps, later) = self.prepare_group(retrieve, from, catalog, index, &mut retrieved);
            // Beside rank work one group keeps the beams batched; alone,
            // the retrieve requests are split over the lanes.
            let per_group = if rank.is_empty() {
                preps.len().div_ceil(self.lanes)
            } else {
                preps.len()
            };
            let sides = preps
                .chunks(per_group.max(1))
                .map(|chunk| RetrieveGroup {
                    preps: chunk.iter().map(|(_, prep)| prep).collect(),
                    index,
                })
                .collect();
            let (r, outs, waiting) = self.serve_rank_inner(now_ms, rank, catalog, sides);
            for ((i, prep), out) in preps.iter().zip(outs) {
                retrieved[*i] = Some(self.finish_retrieve(now_ms, prep, out));
            }
            // The group's pages are committed or freed now: the rank
            // requests that waited for them are served (their embeddings
            // were looked up and paid for already).
            let mut again = self.resume_rank(now_ms, rank, waiting, catalog).into_iter();
            ranked.extend(r.into_iter().map(|o| {
                o.unwrap_or_else(|| again.next().expect("one result per waiting request"))
            }));
            rank = &[];
            if later >= retrieve.len() {
                break;
            }
            from = later;
        }
        let retrieved = retrieved
            .into_iter()
            .map(|r| r.expect("every retrieve request has a result"))
            .collect();
        (ranked, retrieved)
    }

    fn count_truncation(&mut self, plan: &Plan<'_>) {
        if plan.truncated {
            self.counters.truncated_histories += 1;
        }
    }

    /// Lets background refill (after an α move) use the idle link up to now.
    /// A refill only fills free EMB slots (it never evicts), so each row it
    /// placed is counted into its shard; no full recount.
    fn refill(&mut self) {
        let now = self.link_clock.now_ns();
        let host = &self.host;
        let placed = self
            .memory
            .advance_refill(now, &|t, r| host.row(t, r).to_vec());
        self.count_rows(&placed, 1);
    }

    /// Embedding lookups through this node's cache.
    fn lookup(&mut self) -> Lookup<'_> {
        Lookup {
            memory: &mut self.memory,
            host: self.host.as_ref(),
            shards: &self.params.shards,
            residency: &mut self.residency,
            values: self.virtual_compute.is_none(),
        }
    }

    /// Books a served request: backlog, counters, and the response.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &mut self,
        now_ms: u64,
        plan: &Plan<'_>,
        items: Vec<u32>,
        scores: Vec<f32>,
        (reused, virtual_ms): (usize, Option<f64>),
        emb: &EmbStats,
        flops: f64,
    ) -> Served {
        let computed_tokens = plan.computed_tokens(reused) as f64;
        let backlog = self.backlog.add(now_ms, computed_tokens);
        let link_ms = link_cost(&self.params.link, emb.miss_bytes).as_secs_f64() * 1e3;
        let modelled_latency_ms = match (&mut self.virtual_compute, virtual_ms) {
            // Queued behind the node's earlier work, then its own compute
            // and host work; the link transfer of its misses comes first.
            // The node stays busy for the occupancy, the request waits for
            // the overhead: occupancy past the overhead is work after the
            // response (exchanges, windows), which delays the next request,
            // not this one.
            (Some(v), Some(compute_ms)) => {
                let arrival = now_ms as f64;
                let (busy, own) = v.cost.overhead_split();
                let start = v.free_at_ms.max(arrival + link_ms);
                v.free_at_ms = start + compute_ms + busy;
                let latency = start + compute_ms + own - arrival;
                let done = arrival + latency;
                v.load
                    .book(plan.tokens as u64, done, computed_tokens, compute_ms + busy);
                latency
            }
            _ => self.backlog.drain_ms(backlog) + link_ms,
        };
        // Counted when served: a request that fails is not "served with
        // a truncated history".
        self.count_truncation(plan);
        let history_len = plan.history.len();
        let c = &mut self.counters;
        c.responses += 1;
        c.emb_hits += emb.hits as u64;
        c.emb_lookups += emb.lookups as u64;
        c.kv_reused_tokens += reused as u64;
        c.kv_total_tokens += history_len as u64;
        c.link_bytes += emb.miss_bytes as u64;
        c.oov_items += emb.oov_items as u64;
        c.user_head_evictions = self.head_evictions_before + self.prefixes.evictions();
        c.model_flops += flops;
        c.computed_tokens += computed_tokens as u64;
        Served {
            items,
            scores,
            prefix: Prefix::User,
            emb_hits: emb.hits,
            emb_lookups: emb.lookups,
            kv_reused_tokens: reused as u32,
            kv_total_tokens: history_len as u32,
            seq_len: plan.tokens as u32,
            oov_items: emb.oov_items,
            truncated: plan.truncated,
            modelled_latency_ms,
        }
    }

    /// Residency changes since the previous report, and the load now.
    pub fn report(&mut self, now_ms: u64) -> NodeReport {
        let (capacity, rate) = (
            self.params.token_capacity,
            self.params.service_tokens_per_ms,
        );
        let load = match &mut self.virtual_compute {
            Some(v) => v.load.report(now_ms, capacity, rate),
            None => ReportedLoad {
                inflight_tokens: self.backlog.at(now_ms),
                token_capacity: capacity,
                service_tokens_per_ms: rate,
            },
        };
        let mut report = NodeReport {
            node: self.id,
            seq: self.residency.next_seq(),
            at_ms: now_ms,
            inflight_tokens: load.inflight_tokens,
            token_capacity: load.token_capacity,
            service_tokens_per_ms: load.service_tokens_per_ms,
            ..Default::default()
        };
        let touched: BTreeSet<u64> = self.prefixes.take_touched();
        // Users whose prefix left: their head block was evicted, or they
        // fell out of the head table.
        let left = self.prefixes.take_left(self.memory.kv_take_evicted_heads());
        let (prefixes, memory) = (&self.prefixes, &self.memory);
        self.residency.report_users(
            touched,
            left,
            |user| prefixes.is_resident(memory, user),
            &mut report,
        );
        let threshold =
            (self.params.shards.shard_rows() as f64 * self.params.shard_resident_share).max(1.0);
        self.residency.report_shards(threshold, &mut report);
        report
    }

    /// Recounts resident rows of every shard ever seen (after the EMB share
    /// lost rows under the counters: boundary moves that evict, reclaims,
    /// model swaps). Refill is counted row by row instead (`refill`).
    fn recount_shards(&mut self) {
        let (memory, host) = (&self.memory, &self.host);
        self.residency.recount(&self.params.shards, |t, r| {
            counted_as_cached(memory, host, t, r)
        });
    }
}

/// Whether shard residency counts (`table`, `row`) as cached: in the EMB
/// cache and not the table's OOV row (a table's last shard may reach it;
/// it stands for no item).
fn counted_as_cached(memory: &NodeMemory, host: &HostTables, table: u16, row: u32) -> bool {
    row != host.oov_row(table) && memory.emb_contains(table, row)
}

#[cfg(test)]
mod refill_tests {
    use super::*;
    use grflow_kernels::cost::CostModel;

    /// Items past 600 are unknown (each table's OOV row).
    fn catalog() -> TestCatalog {
        TestCatalog::new(600)
    }

    /// Cached rows of every shard of the map, counted from the cache
    /// itself (not from what the residency counters hold).
    fn cached_per_shard(node: &ServingNode) -> Vec<u32> {
        let shards = &node.params.shards;
        (0..shards.num_shards())
            .map(|s| {
                let (t, rows) = shards.rows_of(s);
                rows.filter(|&r| counted_as_cached(&node.memory, &node.host, t, r))
                    .count() as u32
            })
            .collect()
    }

    fn counted_per_shard(node: &ServingNode) -> Vec<u32> {
        let shards = &node.params.shards;
        (0..shards.num_shards())
            .map(|s| node.residency.shard_rows(s))
            .collect()
    }

    /// A node on the event clock whose EMB share was emptied and grown
    /// back: a slow background refill of the evicted rows is under way.
    fn node_refilling() -> ServingNode {
        let mut params = test_params();
        // 256-byte rows at 1 MB/s: a row lands every ~0.26 ms of event time.
        params.link.refill_bytes_per_s = 1e6;
        let mut node = ServingNode::new(0, params).unwrap();
        node.set_virtual(CostModel::given("small", 8, 8));
        let candidates: Vec<u32> = (0..20).collect();
        // Every item of the catalogue once, and an unknown item (OOV rows).
        for (i, chunk) in (0..600u32).collect::<Vec<_>>().chunks(60).enumerate() {
            let mut history = chunk.to_vec();
            history.push(10_000);
            let req = RankRequest {
                req_id: i as u64,
                user_id: i as u64,
                candidates: &candidates,
            };
            node.serve(i as u64, req, &history, &catalog()).unwrap();
        }
        assert!(node.memory.stats().emb_rows > 400);
        let shrunk = node.set_alpha_at(0.0, 10).unwrap();
        assert!(shrunk.emb_rows_evicted > 0);
        let grown = node.set_alpha_at(0.5, 10).unwrap();
        assert!(grown.refill_rows > 400, "{grown:?}");
        node
    }

    /// Rows placed by the refill are counted one by one: after any part
    /// of it has landed the counters equal what the cache holds, shard by
    /// shard, and a full recount would change nothing (the same report).
    #[test]
    fn refilled_rows_are_counted_as_a_full_recount_would() {
        let mut node = node_refilling();
        let candidates: Vec<u32> = (500..520).collect();
        let mut landed = Vec::new();
        for t in 0..40u64 {
            let before = node.memory.stats().emb_rows;
            // Serving looks rows up too (and caches its misses).
            let history = [t as u32 * 3, 599 - t as u32, 20_000];
            let req = RankRequest {
                req_id: 100 + t,
                user_id: 100 + t,
                candidates: &candidates,
            };
            node.serve(11 + t * 2, req, &history, &catalog()).unwrap();
            landed.push(node.memory.stats().emb_rows - before);
            assert_eq!(counted_per_shard(&node), cached_per_shard(&node), "t={t}");
        }
        assert!(
            landed.iter().filter(|&&n| n > 4).count() > 10,
            "the refill lands while requests are served: {landed:?}"
        );
        let mut recounted = node.residency.clone();
        let (memory, host) = (&node.memory, &node.host);
        recounted.recount(&node.params.shards, |t, r| {
            counted_as_cached(memory, host, t, r)
        });
        let threshold = 8.0;
        let (mut a, mut b) = (NodeReport::default(), NodeReport::default());
        node.residency.report_shards(threshold, &mut a);
        recounted.report_shards(threshold, &mut b);
        assert!(!a.shards_added.is_empty());
        assert_eq!(a, b);
    }

    /// Serving requests while a refill lands makes no full recount, nor
    /// does a boundary move (its evicted rows are counted out one by one);
    /// only a model swap does.
    #[test]
    fn serving_during_a_refill_makes_no_full_recount() {
        let mut node = node_refilling();
        let recounts = node.residency.recounts();
        let rows_before = node.memory.stats().emb_rows;
        let candidates: Vec<u32> = (0..10).collect();
        let history: Vec<u32> = (300..310).collect();
        let work: Vec<RankWork<'_>> = (0..8)
            .map(|i| RankWork {
                req: RankRequest {
                    req_id: 200 + i,
                    user_id: 200 + i,
                    candidates: &candidates,
                },
                history: &history,
                cut_before: false,
            })
            .collect();
        for t in 0..30u64 {
            for out in node.serve_rank_batch(20 + t, &work, &catalog()) {
                out.unwrap();
            }
        }
        assert!(node.memory.stats().emb_rows > rows_before + 50);
        assert_eq!(node.residency.recounts(), recounts, "no full recount");
        assert_eq!(counted_per_shard(&node), cached_per_shard(&node));
        // Growing the share evicts nothing: no recount either.
        node.set_alpha_at(0.75, 60).unwrap();
        assert_eq!(node.residency.recounts(), recounts);
        // Shrinking it evicts, row by row: still no recount, and the
        // counts still equal what the cache holds.
        let moved = node.set_alpha_at(0.0, 60).unwrap();
        assert!(moved.emb_rows_evicted > 0);
        assert_eq!(moved.emb_evicted.len(), moved.emb_rows_evicted);
        assert_eq!(node.residency.recounts(), recounts);
        assert_eq!(counted_per_shard(&node), cached_per_shard(&node));
    }

    /// A request that needs the EMB share's pages takes them back
    /// (a reclaim); the rows it evicts are counted out one by one.
    #[test]
    fn a_reclaim_counts_its_evicted_rows_out() {
        let mut node = node_refilling();
        let candidates: Vec<u32> = (0..20).collect();
        for i in 0..10u32 {
            let history: Vec<u32> = (i * 60..i * 60 + 60).collect();
            let req = RankRequest {
                req_id: 300 + i as u64,
                user_id: 300 + i as u64,
                candidates: &candidates,
            };
            node.serve(70 + i as u64, req, &history, &catalog())
                .unwrap();
        }
        let rows = node.memory.stats().emb_rows;
        assert!(rows > 100, "{rows}");
        let recounts = node.residency.recounts();
        let short = ServeError::Memory(MemoryError::KvFull {
            wanted: node.memory.stats().pages,
            free: 0,
            evictable: 0,
        });
        assert!(node.reclaim_for(&short));
        assert!(node.memory.stats().emb_rows < rows, "rows were evicted");
        assert_eq!(node.residency.recounts(), recounts, "no full recount");
        assert_eq!(counted_per_shard(&node), cached_per_shard(&node));
    }
}
