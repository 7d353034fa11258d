//! One serving node: the GR model forward from kernels/ on top of the EMB
//! cache and user-prefix KV reuse. Plain structs, no timely types: the
//! dataflow wrapper calls `serve` per request in event-time order, `apply`
//! for commands, and `report` once per batch. Each file does one job:
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
use grflow_kernels::{
    BeamPrompt, BeamSearch, GrModel, KvBlockStore, ModelConfig, PrefillJob, RankJob, SID_STEPS,
    flops,
};

use crate::cache::{BoundaryMove, MemoryError, MemoryStats, NodeMemory, NodeMemoryConfig};
use crate::history::{HistoryLimits, pinnable_pages};
use crate::host::HostTables;
use crate::link::LinkConfig;
use crate::retrieval::RetrievalIndex;
use crate::router::NodeReport;
use crate::shards::ShardMap;

pub mod batching;
mod command;
mod deadline;
pub mod embedding;
pub mod lanes;
pub mod load;
pub mod plan;
pub mod prefix;
pub mod residency;

pub use command::{Applied, NodeCommand};
pub use deadline::{DeadlineCheck, DeadlineShedder, Deadlined, Shedding};

use embedding::{EmbStats, LinkClock, Lookup, link_cost};
use load::Backlog;
use plan::{Plan, top_k};
use prefix::{UserPrefix, UserPrefixes};
use residency::Residency;

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

/// A rank request of a batch with the history it is served with.
#[derive(Clone, Copy, Debug)]
pub struct RankWork<'a> {
    pub req: RankRequest<'a>,
    pub history: &'a [u32],
}

/// A planned request of a batch with its looked-up token embeddings.
struct Ready<'h> {
    /// Its position in the batch.
    index: usize,
    plan: Plan<'h>,
    emb: EmbStats,
    /// Embeddings of the history from `history_from` on: the tokens a
    /// cached KV prefix covers need none (HLEM's EMB–KV coupling).
    history_tokens: Vec<f32>,
    history_from: usize,
    candidate_tokens: Vec<f32>,
}

/// A generative-retrieval request: the user's history is the prompt.
#[derive(Clone, Copy, Debug)]
pub struct RetrieveRequest {
    pub req_id: u64,
    pub user_id: u64,
}

/// A retrieve request with the history it is served with.
#[derive(Clone, Copy, Debug)]
pub struct RetrieveWork<'a> {
    pub req: RetrieveRequest,
    pub history: &'a [u32],
}

/// A retrieve request ready for its model work: planned, its prompt
/// looked up and its prefix reserved.
struct RetrievePrep<'h> {
    user_id: u64,
    plan: Plan<'h>,
    emb: EmbStats,
    /// Embeddings of the history past the reused prefix.
    history_tokens: Vec<f32>,
    prefix: UserPrefix,
}

/// Items and scores of a retrieve request.
type Retrieved = (Vec<u32>, Vec<f32>);

/// A request's response or why it failed.
pub type Outcome = Result<Served, ServeError>;

/// A rank request's scores or why its model work failed.
type Scored = Result<Vec<f32>, ServeError>;

/// Retrieve requests computed together (one prefill and one beam decode
/// for all of them), in a lane beside rank batches or alone.
struct RetrieveGroup<'a, 'h> {
    preps: Vec<&'a RetrievePrep<'h>>,
    index: &'a RetrievalIndex,
}

/// What one lane computes.
enum LaneJob<'a, 'h> {
    Rank(&'a [(usize, UserPrefix)]),
    /// A group and its beam buffers (one per request).
    Retrieve(RetrieveGroup<'a, 'h>, &'a mut [BeamSearch]),
}

enum LaneOut {
    Rank(Result<Vec<Vec<f32>>, ServeError>),
    Retrieve(Vec<Result<Retrieved, ServeError>>),
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
    #[error("memory: {0}")]
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
    /// Requests that did not fit the KV share alone and were served after
    /// it took pages back from EMB (α lowered).
    #[serde(default)]
    pub kv_reclaims: u64,
    /// User prefix heads dropped because the table was full (max_users).
    pub user_head_evictions: u64,
    /// Model FLOPs executed: uncached history suffixes, candidates and
    /// instruction tokens, decode steps; cached tokens cost nothing.
    #[serde(default)]
    pub model_flops: f64,
    /// Tokens computed (those of the event-time service model: cached
    /// history tokens excluded).
    #[serde(default)]
    pub computed_tokens: u64,
    /// Model calls (a batch of rank requests, or one retrieve request).
    #[serde(default)]
    pub model_calls: u64,
    /// Model calls by requests served together: 1, 2, 3–4, 5–8, … 65+
    /// (see [`BATCH_BUCKETS`]).
    #[serde(default)]
    pub batch_size_hist: Vec<u64>,
    /// Requests by wall time from admission to the start of their batch,
    /// in [`WAIT_BUCKETS_MS`] (the last bucket is everything above).
    #[serde(default)]
    pub queue_wait_hist: Vec<u64>,
    /// α moves that changed the boundary, the refill they queued on the
    /// link's low-priority lane (bytes), and the most one move queued.
    #[serde(default)]
    pub alpha_moves: u64,
    #[serde(default)]
    pub refill_bytes: u64,
    #[serde(default)]
    pub refill_bytes_max_per_move: u64,
}

/// Upper bounds of the batch-size buckets (requests per model call); the
/// last bucket holds everything larger.
pub const BATCH_BUCKETS: [u64; 7] = [1, 2, 4, 8, 16, 32, 64];

/// Upper bounds (ms) of the queue-wait buckets; the last bucket holds
/// everything larger.
pub const WAIT_BUCKETS_MS: [f64; 9] = [1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0];

/// Retrieve requests decoded together at most: each holds a beam searcher
/// sized for the longest prompt (~2 MB at hstu-3l), and 16 searches of a
/// 32-wide beam already give the decode GEMMs 512 rows.
pub const MAX_RETRIEVE_GROUP: usize = 16;

/// Adds one to the bucket of `value` under `bounds` (one more bucket above).
fn bump<T: PartialOrd>(hist: &mut Vec<u64>, bounds: &[T], value: T) {
    hist.resize(bounds.len() + 1, 0);
    let i = bounds
        .iter()
        .position(|b| value <= *b)
        .unwrap_or(bounds.len());
    hist[i] += 1;
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
}

/// A node on the virtual clock: its compute timeline.
#[derive(Clone, Debug)]
struct VirtualCompute {
    cost: CostModel,
    /// Event time (ms) at which the node's model is free again.
    free_at_ms: f64,
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
        })
    }

    /// Moves the EMB/KV boundary (HLEM §IV-B); commands call this.
    /// Shard residency is recounted so the next report tells the router.
    pub fn set_alpha(&mut self, alpha: f64) -> Result<BoundaryMove, ServeError> {
        let moved = self.memory.set_alpha(alpha)?;
        self.recount_shards();
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
        let ServeError::Memory(MemoryError::KvFull { wanted, free }) = e else {
            return false;
        };
        let moved = self
            .memory
            .reclaim_for_kv(wanted.saturating_sub(*free).max(1));
        if moved > 0 {
            self.recount_shards();
            self.counters.kv_reclaims += 1;
        }
        moved > 0
    }

    /// Serves one rank request at event time `now_ms` whose user history is
    /// `history` (the first hist_len items): User-as-prefix ranking of the
    /// candidates on top of the user's cached history KV. A batch of one.
    pub fn serve(
        &mut self,
        now_ms: u64,
        req: RankRequest<'_>,
        history: &[u32],
        catalog: &dyn ItemCatalog,
    ) -> Result<Served, ServeError> {
        self.serve_rank_batch(now_ms, &[RankWork { req, history }], catalog)
            .pop()
            .expect("one request, one result")
    }

    /// Serves several rank requests at event time `now_ms` with batched
    /// model calls (xGR's token-capacity batching): their uncached history
    /// suffixes are prefilled in one set of GEMMs, then their candidates
    /// and instruction tokens are ranked in another. Results, in order,
    /// equal [`Self::serve`] one request at a time (within float rounding);
    /// each request fails or succeeds alone. Requests whose pages do not
    /// fit in the pool beside the others run in a later sub-batch.
    pub fn serve_rank_batch(
        &mut self,
        now_ms: u64,
        work: &[RankWork<'_>],
        catalog: &dyn ItemCatalog,
    ) -> Vec<Result<Served, ServeError>> {
        self.serve_rank_inner(now_ms, work, catalog, Vec::new()).0
    }

    /// Serves a batch of rank requests and retrieve requests in the same
    /// step. The retrieve requests are computed together: their prompts
    /// prefilled in one set of GEMMs and their beams decoded together (xGR
    /// batches the beams of several requests). With two lanes or more the
    /// retrieve group (split over the lanes when there is no rank work) is
    /// a job beside the rank batch's groups, and the lanes take the jobs as
    /// they come free, so neither kind waits for the other. Retrieve
    /// requests whose pages do not fit beside the group are served after
    /// it, as [`Self::serve_retrieve_batch`] splits a group. Results equal
    /// serving them one after another (within float rounding).
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
        // The requests from `later` on did not fit beside the group: they
        // are served after the step (pages freed by then).
        let (preps, later) = self.prepare_group(retrieve, 0, catalog, index, &mut retrieved);
        // Beside rank work one group keeps the beams batched; alone, the
        // retrieve requests are split over the lanes.
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
        let (ranked, outs) = self.serve_rank_inner(now_ms, rank, catalog, sides);
        for ((i, prep), out) in preps.iter().zip(outs) {
            retrieved[*i] = Some(self.finish_retrieve(now_ms, prep, out));
        }
        let rest = self.serve_retrieve_batch(now_ms, &retrieve[later..], catalog, index);
        for (slot, out) in retrieved[later..].iter_mut().zip(rest) {
            *slot = Some(out);
        }
        let retrieved = retrieved
            .into_iter()
            .map(|r| r.expect("every retrieve request has a result"))
            .collect();
        (ranked, retrieved)
    }

    /// Rank batch serving; the retrieve requests of `sides` (whose beam
    /// buffers are `beams[i]`) are computed in lanes beside the first
    /// sub-batch (or by themselves, should no rank request get that far).
    fn serve_rank_inner(
        &mut self,
        now_ms: u64,
        work: &[RankWork<'_>],
        catalog: &dyn ItemCatalog,
        mut sides: Vec<RetrieveGroup<'_, '_>>,
    ) -> (Vec<Outcome>, Vec<Result<Retrieved, ServeError>>) {
        self.link_clock.observe(now_ms);
        let mut retrieved = Vec::new();
        let mut results: Vec<Option<Result<Served, ServeError>>> =
            work.iter().map(|_| None).collect();
        let mut ready = Vec::with_capacity(work.len());
        for (i, w) in work.iter().enumerate() {
            let plan = match Plan::rank(
                &self.history_limits,
                w.req.req_id,
                w.history,
                w.req.candidates.len(),
            ) {
                Ok(plan) => plan,
                Err(e) => {
                    results[i] = Some(Err(e));
                    continue;
                }
            };
            self.begin(&plan);
            let mut emb = EmbStats::default();
            // Tokens under a cached KV prefix need no embeddings. Should the
            // prefix be evicted before it is pinned, the gap is looked up
            // at reservation.
            let history_from = self.memory.kv_cached_prefix_len(plan.history);
            let history_tokens =
                self.lookup()
                    .item_tokens(&plan.history[history_from..], catalog, &mut emb);
            let candidate_tokens = self
                .lookup()
                .item_tokens(w.req.candidates, catalog, &mut emb);
            ready.push(Ready {
                index: i,
                plan,
                emb,
                history_tokens,
                history_from,
                candidate_tokens,
            });
        }
        let miss_bytes = ready.iter().map(|r| r.emb.miss_bytes).sum();
        self.link_clock.pay(&mut self.memory, miss_bytes);

        let mut next = 0;
        while next < ready.len() {
            let mut reserved = Vec::new();
            while next < ready.len() {
                match self
                    .prefixes
                    .reserve(&mut self.memory, ready[next].plan.history)
                {
                    Ok(prefix) => {
                        self.fill_gap(&mut ready[next], prefix.reused, catalog);
                        reserved.push((next, prefix));
                    }
                    // Alone it does not fit: KV takes pages back from EMB
                    // and it tries again; else its own error.
                    Err(e) if reserved.is_empty() => {
                        if self.reclaim_for(&e) {
                            continue;
                        }
                        results[ready[next].index] = Some(Err(e))
                    }
                    // Serve what fits first; this one starts the next sub-batch.
                    Err(_) => break,
                }
                next += 1;
            }
            if reserved.is_empty() {
                continue;
            }
            let (scores, side_out) =
                self.rank_reserved(&ready, &reserved, std::mem::take(&mut sides));
            if !side_out.is_empty() {
                retrieved = side_out;
            }
            for ((k, prefix), scored) in reserved.into_iter().zip(scores) {
                let r = &ready[k];
                let w = &work[r.index];
                let scores = match scored {
                    Ok(scores) => {
                        self.prefixes.commit(
                            &mut self.memory,
                            w.req.user_id,
                            r.plan.history,
                            &prefix,
                        );
                        scores
                    }
                    Err(e) => {
                        prefix::release(&mut self.memory, &prefix);
                        results[r.index] = Some(Err(e));
                        continue;
                    }
                };
                let order = top_k(&scores, self.params.top_k);
                let items = order.iter().map(|&i| w.req.candidates[i]).collect();
                let top_scores = order.iter().map(|&i| scores[i]).collect();
                let flops = self.rank_flops(&r.plan, prefix.reused, w.req.candidates.len());
                let len = r.plan.history.len();
                let virtual_ms = self.virtual_compute.as_ref().map(|v| {
                    v.cost.prefill(len - prefix.reused.min(len), prefix.reused)
                        + v.cost.rank(w.req.candidates.len(), len)
                });
                let served = self.finish(
                    now_ms,
                    &r.plan,
                    items,
                    top_scores,
                    (prefix.reused, virtual_ms),
                    &r.emb,
                    flops,
                );
                results[r.index] = Some(Ok(served));
            }
        }
        if !sides.is_empty() {
            let (_, out) = self.rank_reserved(&[], &[], sides);
            retrieved = out;
        }
        let results = results
            .into_iter()
            .map(|r| r.expect("every request of the batch has a result"))
            .collect();
        (results, retrieved)
    }

    /// Prefills and ranks the reserved requests of a batch in two batched
    /// model calls, split over the node's lanes, with `side` in a lane of
    /// its own. Should a group fail as a whole (the plans rule that out),
    /// each of its requests is retried alone so that it fails by itself.
    fn rank_reserved(
        &mut self,
        ready: &[Ready<'_>],
        reserved: &[(usize, UserPrefix)],
        sides: Vec<RetrieveGroup<'_, '_>>,
    ) -> (Vec<Scored>, Vec<Result<Retrieved, ServeError>>) {
        let d = self.params.model.d_model;
        for side in &sides {
            self.count_call(side.preps.len());
        }
        if self.virtual_compute.is_some() {
            if !reserved.is_empty() {
                self.count_call(reserved.len());
            }
            let scores = reserved
                .iter()
                .map(|(k, _)| Ok(vec![0.0; ready[*k].candidate_tokens.len() / d]))
                .collect();
            let retrieved = sides
                .iter()
                .flat_map(|side| side.preps.iter().map(|_| Ok((Vec::new(), Vec::new()))))
                .collect();
            return (scores, retrieved);
        }
        let lanes = self.lanes.min(reserved.len()).max(1);
        let groups: Vec<&[(usize, UserPrefix)]> = if reserved.is_empty() {
            Vec::new()
        } else {
            reserved.chunks(reserved.len().div_ceil(lanes)).collect()
        };
        for group in &groups {
            self.count_call(group.len());
        }
        let model = &self.model;
        let top = self.params.top_k;
        let mut retrieved = Vec::with_capacity(sides.len());
        let outcomes =
            if groups.len() == 1 && sides.is_empty() {
                vec![rank_group(
                    model,
                    d,
                    ready,
                    self.memory.kv_store(),
                    groups[0],
                )]
            } else {
                // The retrieve request first: the lane that takes it takes a
                // rank group after it.
                let mut jobs: Vec<LaneJob<'_, '_>> = Vec::with_capacity(groups.len() + sides.len());
                let mut beams = &mut self.beams[..];
                for side in sides {
                    let (mine, rest) = beams.split_at_mut(side.preps.len());
                    beams = rest;
                    jobs.push(LaneJob::Retrieve(side, mine));
                }
                jobs.extend(groups.iter().map(|g| LaneJob::Rank(g)));
                let outs =
                    lanes::run_lanes(self.memory.kv_store(), jobs, self.lanes, |job, store| {
                        match job {
                            LaneJob::Rank(group) => {
                                LaneOut::Rank(rank_group(model, d, ready, store, group))
                            }
                            LaneJob::Retrieve(side, beams) => {
                                LaneOut::Retrieve(retrieve_group(model, store, &side, beams, top))
                            }
                        }
                    });
                let mut ranked = Vec::with_capacity(groups.len());
                for out in outs {
                    match out {
                        LaneOut::Rank(r) => ranked.push(r),
                        LaneOut::Retrieve(r) => retrieved.extend(r),
                    }
                }
                ranked
            };
        let mut out = Vec::with_capacity(reserved.len());
        for (group, outcome) in groups.into_iter().zip(outcomes) {
            match outcome {
                Ok(scores) => out.extend(scores.into_iter().map(Ok)),
                Err(e) if group.len() == 1 => out.push(Err(e)),
                Err(_) => out.extend(group.iter().map(|one| {
                    rank_group(
                        model,
                        d,
                        ready,
                        self.memory.kv_store(),
                        std::slice::from_ref(one),
                    )
                    .map(|mut s| s.pop().expect("one job, one result"))
                })),
            }
        }
        (out, retrieved)
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
        self.serve_retrieve_batch(now_ms, &[RetrieveWork { req, history }], catalog, index)
            .pop()
            .expect("one request, one result")
    }

    /// Serves retrieve requests together: planned and reserved in order,
    /// then computed as one group (one prefill, one beam decode). A request
    /// whose pages do not fit beside the group's starts the next group, and
    /// so does the request after [`MAX_RETRIEVE_GROUP`] of them.
    /// Results, in order, equal [`Self::serve_retrieve`] one at a time
    /// (within float rounding); each request fails or succeeds alone.
    pub fn serve_retrieve_batch(
        &mut self,
        now_ms: u64,
        work: &[RetrieveWork<'_>],
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
    ) -> Vec<Outcome> {
        self.link_clock.observe(now_ms);
        let mut results: Vec<Option<Outcome>> = work.iter().map(|_| None).collect();
        let mut from = 0;
        while from < work.len() {
            let (mut group, next) = self.prepare_group(work, from, catalog, index, &mut results);
            self.compute_retrieves(now_ms, &mut group, index, &mut results);
            from = next;
        }
        results
            .into_iter()
            .map(|r| r.expect("every retrieve request has a result"))
            .collect()
    }

    /// Prepares `work[from..]` in order as one group, until it holds
    /// [`MAX_RETRIEVE_GROUP`] requests or a request's pages do not fit
    /// beside the group's; returns the group (indices into `work`) and the
    /// first request left out. A request that fails alone gets its error in
    /// `results`.
    fn prepare_group<'h>(
        &mut self,
        work: &[RetrieveWork<'h>],
        from: usize,
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
        results: &mut [Option<Outcome>],
    ) -> (Vec<(usize, RetrievePrep<'h>)>, usize) {
        let mut group = Vec::new();
        for (i, w) in work.iter().enumerate().skip(from) {
            if group.len() == MAX_RETRIEVE_GROUP {
                return (group, i);
            }
            let lane = group.len();
            let mut prepared = self.prepare_retrieve(w.req, w.history, catalog, index, lane);
            // Alone it does not fit: KV takes pages back from EMB.
            while let Err(e) = &prepared
                && lane == 0
                && self.reclaim_for(e)
            {
                prepared = self.prepare_retrieve(w.req, w.history, catalog, index, lane);
            }
            match prepared {
                Ok(prep) => group.push((i, prep)),
                // The group holds the pages it needs: it goes first.
                Err(ServeError::Memory(_)) if !group.is_empty() => return (group, i),
                Err(e) => results[i] = Some(Err(e)),
            }
        }
        (group, work.len())
    }

    /// Computes a group of prepared retrieve requests in one model call and
    /// books each (emptying `group`).
    fn compute_retrieves(
        &mut self,
        now_ms: u64,
        group: &mut Vec<(usize, RetrievePrep<'_>)>,
        index: &RetrievalIndex,
        results: &mut [Option<Outcome>],
    ) {
        if group.is_empty() {
            return;
        }
        self.count_call(group.len());
        let outs = if self.virtual_compute.is_some() {
            group.iter().map(|_| Ok((Vec::new(), Vec::new()))).collect()
        } else {
            let side = RetrieveGroup {
                preps: group.iter().map(|(_, prep)| prep).collect(),
                index,
            };
            let top = self.params.top_k;
            let beams = &mut self.beams[..group.len()];
            retrieve_group(&self.model, self.memory.kv_store(), &side, beams, top)
        };
        for ((i, prep), out) in group.drain(..).zip(outs) {
            results[i] = Some(self.finish_retrieve(now_ms, &prep, out));
        }
    }

    /// Everything of a retrieve request before its model work: plan, beam
    /// buffers, prompt embeddings (paying the link for misses) and the
    /// prefix reservation. Nothing is held on failure. `lane` is the
    /// request's place among those computed at once (its beam buffers).
    fn prepare_retrieve<'h>(
        &mut self,
        req: RetrieveRequest,
        history: &'h [u32],
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
        lane: usize,
    ) -> Result<RetrievePrep<'h>, ServeError> {
        let plan = Plan::retrieve(
            &self.history_limits,
            req.req_id,
            history,
            self.params.beam_width,
            index.is_empty(),
        )?;
        // Buffers first: failing here has taken nothing yet.
        while self.beams.len() <= lane {
            let cfg = &self.params.model;
            let max_prompt = cfg.max_positions.saturating_sub(SID_STEPS);
            let beam = BeamSearch::new(
                cfg,
                self.params.beam_width,
                self.params.beam_top_k,
                max_prompt,
            )
            .map_err(|e| ServeError::Model(e.to_string()))?;
            self.beams.push(beam);
        }
        self.refill();
        // Reserved first: the tokens its cached prefix covers need no
        // embeddings (EMB lookups never evict KV pages).
        let prefix = self.prefixes.reserve(&mut self.memory, plan.history)?;
        // Counted once reserved: a request that waits for pages is retried.
        self.count_truncation(&plan);
        let mut emb = EmbStats::default();
        let history_tokens =
            self.lookup()
                .item_tokens(&plan.history[prefix.reused..], catalog, &mut emb);
        self.link_clock.pay(&mut self.memory, emb.miss_bytes);
        Ok(RetrievePrep {
            user_id: req.user_id,
            plan,
            emb,
            history_tokens,
            prefix,
        })
    }

    /// Caches the prefix of a computed retrieve request and books it, or
    /// gives its pages back.
    fn finish_retrieve(
        &mut self,
        now_ms: u64,
        prep: &RetrievePrep<'_>,
        retrieved: Result<Retrieved, ServeError>,
    ) -> Result<Served, ServeError> {
        let (items, scores) = match retrieved {
            Ok(r) => r,
            Err(e) => {
                prefix::release(&mut self.memory, &prep.prefix);
                return Err(e);
            }
        };
        let history = prep.plan.history;
        self.prefixes
            .commit(&mut self.memory, prep.user_id, history, &prep.prefix);
        let cfg = &self.params.model;
        let (len, reused) = (history.len(), prep.prefix.reused);
        let flops = flops::prefill_flops(cfg, reused, len - reused.min(len))
            + flops::beam_search_flops(cfg, len, self.params.beam_width);
        let virtual_ms = self
            .virtual_compute
            .as_ref()
            .map(|v| v.cost.prefill(len - reused.min(len), reused) + v.cost.beam(len));
        Ok(self.finish(
            now_ms,
            &prep.plan,
            items,
            scores,
            (reused, virtual_ms),
            &prep.emb,
            flops,
        ))
    }

    /// Before any cache work: count a truncation, and let background
    /// refill (after an α move) use the idle link up to now.
    fn begin(&mut self, plan: &Plan<'_>) {
        self.count_truncation(plan);
        self.refill();
    }

    fn count_truncation(&mut self, plan: &Plan<'_>) {
        if plan.truncated {
            self.counters.truncated_histories += 1;
        }
    }

    /// Lets background refill (after an α move) use the idle link up to now.
    fn refill(&mut self) {
        let now = self.link_clock.now_ns();
        let host = &self.host;
        let refilled = self
            .memory
            .advance_refill(now, &|t, r| host.row(t, r).to_vec());
        if refilled > 0 {
            self.recount_shards();
        }
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

    /// A rank request's prefix turned out shorter than when its embeddings
    /// were looked up (evicted by a reservation of the same batch): looks
    /// up the uncovered tokens and pays the link for them.
    fn fill_gap(&mut self, r: &mut Ready<'_>, reused: usize, catalog: &dyn ItemCatalog) {
        if reused >= r.history_from {
            return;
        }
        let mut emb = EmbStats::default();
        let gap =
            self.lookup()
                .item_tokens(&r.plan.history[reused..r.history_from], catalog, &mut emb);
        self.link_clock.pay(&mut self.memory, emb.miss_bytes);
        r.history_tokens.splice(0..0, gap);
        r.history_from = reused;
        r.emb.add(&emb);
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
        let backlog = self
            .backlog
            .add(now_ms, plan.computed_tokens(reused) as f64);
        let link_ms = link_cost(&self.params.link, emb.miss_bytes).as_secs_f64() * 1e3;
        let modelled_latency_ms = match (&mut self.virtual_compute, virtual_ms) {
            // Queued behind the node's earlier work, then its own compute
            // and host work; the link transfer of its misses comes first.
            (Some(v), Some(compute_ms)) => {
                let arrival = now_ms as f64;
                let (busy, rest) = v.cost.overhead_split();
                let start = v.free_at_ms.max(arrival + link_ms);
                v.free_at_ms = start + compute_ms + busy;
                v.free_at_ms - arrival + rest
            }
            _ => self.backlog.drain_ms(backlog) + link_ms,
        };
        let history_len = plan.history.len();
        let c = &mut self.counters;
        c.responses += 1;
        c.emb_hits += emb.hits as u64;
        c.emb_lookups += emb.lookups as u64;
        c.kv_reused_tokens += reused as u64;
        c.kv_total_tokens += history_len as u64;
        c.link_bytes += emb.miss_bytes as u64;
        c.oov_items += emb.oov_items as u64;
        c.user_head_evictions = self.prefixes.evictions();
        c.model_flops += flops;
        c.computed_tokens += plan.computed_tokens(reused) as u64;
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

    /// One model call serving `requests` requests together.
    fn count_call(&mut self, requests: usize) {
        self.counters.model_calls += 1;
        bump(
            &mut self.counters.batch_size_hist,
            &BATCH_BUCKETS,
            requests as u64,
        );
    }

    /// A request waited `ms` (wall time) from admission to its batch.
    pub fn record_wait(&mut self, ms: f64) {
        bump(&mut self.counters.queue_wait_hist, &WAIT_BUCKETS_MS, ms);
    }

    /// FLOPs of a rank request on `reused` cached history tokens.
    fn rank_flops(&self, plan: &Plan<'_>, reused: usize, candidates: usize) -> f64 {
        let cfg = &self.params.model;
        let len = plan.history.len();
        flops::prefill_flops(cfg, reused, len - reused.min(len))
            + flops::rank_user_prefix_flops(cfg, len, candidates)
    }

    /// Residency changes since the previous report, and the load now.
    pub fn report(&mut self, now_ms: u64) -> NodeReport {
        let mut report = NodeReport {
            node: self.id,
            at_ms: now_ms,
            inflight_tokens: self.backlog.at(now_ms),
            token_capacity: self.params.token_capacity,
            service_tokens_per_ms: self.params.service_tokens_per_ms,
            ..Default::default()
        };
        let touched: BTreeSet<u64> = self.prefixes.take_touched();
        let (prefixes, memory) = (&self.prefixes, &self.memory);
        self.residency.report_users(
            touched,
            |user| prefixes.is_resident(memory, user),
            &mut report,
        );
        let threshold =
            (self.params.shards.shard_rows() as f64 * self.params.shard_resident_share).max(1.0);
        self.residency.report_shards(threshold, &mut report);
        report
    }

    /// Recounts resident rows of every shard ever seen (after the EMB share
    /// changed under the counters: boundary moves and refill).
    fn recount_shards(&mut self) {
        let memory = &self.memory;
        self.residency
            .recount(&self.params.shards, |t, r| memory.emb_contains(t, r));
    }
}

/// Prefill of a group of retrieve requests' uncached prompts in one set of
/// GEMMs, then their beam searches decoded together, over `store` (the
/// pool, or a lane's view of it); `beams` holds one searcher per request.
/// Should the group fail as a whole (the plans rule that out), each request
/// is retried alone so that it fails by itself.
fn retrieve_group<S: KvBlockStore + ?Sized>(
    model: &GrModel,
    store: &mut S,
    group: &RetrieveGroup<'_, '_>,
    beams: &mut [BeamSearch],
    top: usize,
) -> Vec<Result<Retrieved, ServeError>> {
    let (preps, index) = (&group.preps[..], group.index);
    match retrieve_together(model, store, preps, index, beams, top) {
        Ok(all) => all.into_iter().map(Ok).collect(),
        Err(e) if preps.len() == 1 => vec![Err(e)],
        Err(_) => preps
            .iter()
            .zip(beams.iter_mut())
            .map(|(prep, beam)| {
                let one = std::slice::from_ref(prep);
                retrieve_together(model, store, one, index, std::slice::from_mut(beam), top)
                    .map(|mut r| r.pop().expect("one request, one result"))
            })
            .collect(),
    }
}

fn retrieve_together<S: KvBlockStore + ?Sized>(
    model: &GrModel,
    store: &mut S,
    preps: &[&RetrievePrep<'_>],
    index: &RetrievalIndex,
    beams: &mut [BeamSearch],
    top: usize,
) -> Result<Vec<Retrieved>, ServeError> {
    let model_err = |e: grflow_kernels::KernelError| ServeError::Model(e.to_string());
    let prefills: Vec<PrefillJob<'_>> = preps
        .iter()
        .map(|prep| PrefillJob {
            block_table: &prep.prefix.block_table,
            cached_len: prep.prefix.reused,
            new_tokens: &prep.history_tokens,
        })
        .collect();
    model.prefill_batch(store, &prefills).map_err(model_err)?;
    let prompts: Vec<BeamPrompt<'_>> = preps
        .iter()
        .map(|prep| BeamPrompt {
            block_table: &prep.prefix.block_table,
            prompt_len: prep.plan.history.len(),
        })
        .collect();
    let beams = &mut beams[..preps.len()];
    BeamSearch::generate_many(beams, model, &*store, &prompts, index.trie()).map_err(model_err)?;
    Ok(beams
        .iter()
        .map(|beam| {
            beam.hits()
                .iter()
                .filter_map(|h| index.item(h.sid).map(|item| (item, h.log_prob)))
                .take(top)
                .unzip()
        })
        .collect())
}

/// Prefill then ranking of one group of reserved requests, in two batched
/// model calls over `store` (the pool, or a lane's view of it).
fn rank_group<S: KvBlockStore + ?Sized>(
    model: &GrModel,
    d: usize,
    ready: &[Ready<'_>],
    store: &mut S,
    group: &[(usize, UserPrefix)],
) -> Result<Vec<Vec<f32>>, ServeError> {
    let prefills: Vec<PrefillJob<'_>> = group
        .iter()
        .map(|(k, p)| PrefillJob {
            block_table: &p.block_table,
            cached_len: p.reused,
            new_tokens: &ready[*k].history_tokens[(p.reused - ready[*k].history_from) * d..],
        })
        .collect();
    let ranks: Vec<RankJob<'_>> = group
        .iter()
        .map(|(k, p)| RankJob {
            block_table: &p.block_table,
            prefix_len: ready[*k].plan.history.len(),
            candidate_tokens: &ready[*k].candidate_tokens,
        })
        .collect();
    let model_err = |e: grflow_kernels::KernelError| ServeError::Model(e.to_string());
    model.prefill_batch(store, &prefills).map_err(model_err)?;
    model
        .rank_user_prefix_batch(store, &ranks)
        .map_err(model_err)
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
