//! Rank requests (user-as-prefix ranking of candidates): planned, their
//! embeddings looked up, their prefixes reserved, then prefilled and ranked
//! in batched model calls split over the node's lanes (with a retrieve
//! group in a lane of its own when a step has one).

use grflow_kernels::{BeamSearch, GrModel, KvBlockStore, PrefillJob, RankJob, flops, rank_softmax};

use super::embedding::EmbStats;
use super::lanes;
use super::plan::{Plan, top_k};
use super::prefix::{self, UserPrefix};
use super::retrieve::{RetrieveGroup, Retrieved, retrieve_group};
use super::{ItemCatalog, Outcome, ServeError, Served, ServingNode};

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
    /// `history` already lost its oldest items before it reached the node
    /// (the Kafka decoder's cut): served, it counts as truncated once.
    pub cut_before: bool,
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

/// Rank requests of a step that waited for its retrieve groups' pages,
/// with the embeddings already looked up (and paid for) for them: served by
/// [`ServingNode::resume_rank`] once the groups are committed.
pub(super) struct Waiting<'h>(Vec<Ready<'h>>);

/// A rank request's candidates as scored by the model.
struct Scores {
    /// What candidates are ordered by: monotone in the probabilities, but
    /// never an underflowed tie (a logit ~104 below the best has
    /// probability 0 in f32, and then position would decide).
    logits: Vec<f32>,
    /// What the response reports: the softmax of the logits.
    probs: Vec<f32>,
}

impl Scores {
    fn of_logits(logits: Vec<f32>) -> Self {
        let probs = rank_softmax(&logits);
        Self { logits, probs }
    }
}

/// A rank request's scores or why its model work failed.
type Scored = Result<Scores, ServeError>;

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

impl ServingNode {
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
        self.serve_rank_batch(
            now_ms,
            &[RankWork {
                req,
                history,
                cut_before: false,
            }],
            catalog,
        )
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
        self.serve_rank_inner(now_ms, work, catalog, Vec::new())
            .0
            .into_iter()
            .map(|r| r.expect("without retrieve groups no request waits"))
            .collect()
    }

    /// Rank batch serving; the retrieve requests of `sides` (whose beam
    /// buffers are `beams[i]`) are computed in lanes beside the first
    /// sub-batch (or by themselves, should no rank request get that far).
    /// A request that does not fit even alone while the groups of `sides`
    /// hold their pages gets no result (`None`) and is handed back in
    /// [`Waiting`]: the caller serves it with [`Self::resume_rank`] once
    /// those groups are committed, instead of this call taking pages back
    /// from EMB (moving α) or failing it for pages that are about to be
    /// free.
    pub(super) fn serve_rank_inner<'h>(
        &mut self,
        now_ms: u64,
        work: &[RankWork<'h>],
        catalog: &dyn ItemCatalog,
        sides: Vec<RetrieveGroup<'_, '_>>,
    ) -> (
        Vec<Option<Outcome>>,
        Vec<Result<Retrieved, ServeError>>,
        Waiting<'h>,
    ) {
        self.link_clock.observe(now_ms);
        let mut results: Vec<Option<Outcome>> = work.iter().map(|_| None).collect();
        let ready = self.look_up_rank(work, catalog, &mut results);
        let (retrieved, waiting) =
            self.serve_ready(now_ms, work, ready, catalog, sides, &mut results);
        (results, retrieved, Waiting(waiting))
    }

    /// Serves the requests that waited for a step's retrieve groups, in
    /// order, without looking up or paying for their embeddings again.
    pub(super) fn resume_rank(
        &mut self,
        now_ms: u64,
        work: &[RankWork<'_>],
        waiting: Waiting<'_>,
        catalog: &dyn ItemCatalog,
    ) -> Vec<Outcome> {
        let mut results: Vec<Option<Outcome>> = work.iter().map(|_| None).collect();
        let indices: Vec<usize> = waiting.0.iter().map(|r| r.index).collect();
        self.serve_ready(now_ms, work, waiting.0, catalog, Vec::new(), &mut results);
        indices
            .into_iter()
            .map(|i| {
                results[i]
                    .take()
                    .expect("without retrieve groups no request waits")
            })
            .collect()
    }

    /// Plans each request and looks up the embeddings it needs, then pays
    /// the link for their misses at once. A request that cannot be planned
    /// gets its error in `results`.
    fn look_up_rank<'h>(
        &mut self,
        work: &[RankWork<'h>],
        catalog: &dyn ItemCatalog,
        results: &mut [Option<Outcome>],
    ) -> Vec<Ready<'h>> {
        let mut ready = Vec::with_capacity(work.len());
        for (i, w) in work.iter().enumerate() {
            let plan = match Plan::rank(
                &self.history_limits,
                w.req.req_id,
                w.history,
                w.req.candidates.len(),
            ) {
                Ok(plan) => plan.cut_before(w.cut_before),
                Err(e) => {
                    results[i] = Some(Err(e));
                    continue;
                }
            };
            self.refill();
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
        ready
    }

    /// Reserves, prefills and ranks `ready` in sub-batches that fit the
    /// pool, with `sides` beside the first; the requests that must wait for
    /// the sides' pages are returned.
    fn serve_ready<'h>(
        &mut self,
        now_ms: u64,
        work: &[RankWork<'h>],
        mut ready: Vec<Ready<'h>>,
        catalog: &dyn ItemCatalog,
        mut sides: Vec<RetrieveGroup<'_, '_>>,
        results: &mut [Option<Outcome>],
    ) -> (Vec<Result<Retrieved, ServeError>>, Vec<Ready<'h>>) {
        let sides_hold_pages = !sides.is_empty();
        let mut retrieved = Vec::new();
        let mut waiting = Vec::new();
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
                    // Alone it does not fit: it waits for the retrieve
                    // groups' pages; else KV takes pages back from EMB and
                    // it tries again; else its own error.
                    Err(e) if reserved.is_empty() => {
                        if sides_hold_pages {
                            // No result: served after the groups.
                            waiting.push(next);
                        } else if self.reclaim_for(&e) {
                            continue;
                        } else {
                            results[ready[next].index] = Some(Err(e));
                        }
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
                let order = top_k(&scores.logits, self.params.top_k);
                let items = order.iter().map(|&i| w.req.candidates[i]).collect();
                let top_scores = order.iter().map(|&i| scores.probs[i]).collect();
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
        // `waiting` holds positions in `ready`, ascending.
        let waiting = ready
            .into_iter()
            .enumerate()
            .filter_map(|(k, r)| waiting.binary_search(&k).is_ok().then_some(r))
            .collect();
        (retrieved, waiting)
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
            // Nothing is scored: every candidate 0 (the first top_k win).
            let scores = reserved
                .iter()
                .map(|(k, _)| {
                    let zeros = vec![0.0; ready[*k].candidate_tokens.len() / d];
                    Ok(Scores {
                        logits: zeros.clone(),
                        probs: zeros,
                    })
                })
                .collect();
            let retrieved = sides
                .iter()
                .flat_map(|side| side.preps.iter().map(|_| Ok((Vec::new(), Vec::new()))))
                .collect();
            return (scores, retrieved);
        }
        let lanes = self.lanes.min(reserved.len()).max(1);
        // Each lane gets about the same tokens to compute, not the same
        // number of requests.
        let tokens: Vec<usize> = reserved
            .iter()
            .map(|(k, prefix)| ready[*k].plan.computed_tokens(prefix.reused))
            .collect();
        let mut rest = reserved;
        let groups: Vec<&[(usize, UserPrefix)]> = lanes::balanced_sizes(&tokens, lanes)
            .into_iter()
            .map(|n| {
                let (group, after) = rest.split_at(n);
                rest = after;
                group
            })
            .collect();
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
                Ok(logits) => out.extend(logits.into_iter().map(|l| Ok(Scores::of_logits(l)))),
                Err(e) if group.len() == 1 => out.push(Err(e)),
                Err(_) => out.extend(group.iter().map(|one| {
                    rank_group(
                        model,
                        d,
                        ready,
                        self.memory.kv_store(),
                        std::slice::from_ref(one),
                    )
                    .map(|mut l| Scores::of_logits(l.pop().expect("one job, one result")))
                })),
            }
        }
        (out, retrieved)
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

    /// FLOPs of a rank request on `reused` cached history tokens.
    fn rank_flops(&self, plan: &Plan<'_>, reused: usize, candidates: usize) -> f64 {
        let cfg = &self.params.model;
        let len = plan.history.len();
        flops::prefill_flops(cfg, reused, len - reused.min(len))
            + flops::rank_user_prefix_flops(cfg, len, candidates)
    }
}

/// Prefill then ranking of one group of reserved requests, in two batched
/// model calls over `store` (the pool, or a lane's view of it): each
/// request's candidate logits.
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
        .rank_user_prefix_logits_batch(store, &ranks)
        .map_err(model_err)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use safetensors::{Dtype, SafeTensors, tensor::TensorView};

    use super::*;
    use crate::node::{TestCatalog, test_params};

    /// The seeded model of `test_params` with its ranking head `w_rank`
    /// scaled by `by`: logits spread over hundreds, so many candidates'
    /// softmax probabilities underflow to 0.
    fn sharpened_model(by: f32) -> GrModel {
        let p = test_params();
        let bytes = GrModel::new(p.model.clone(), p.model_seed).to_safetensors();
        let (_, meta) = SafeTensors::read_metadata(&bytes).unwrap();
        let st = SafeTensors::deserialize(&bytes).unwrap();
        let owned: Vec<(String, Vec<usize>, Vec<u8>)> = st
            .tensors()
            .into_iter()
            .map(|(name, view)| {
                let mut data = view.data().to_vec();
                if name == "w_rank" {
                    for w in data.chunks_exact_mut(4) {
                        let v = f32::from_le_bytes([w[0], w[1], w[2], w[3]]) * by;
                        w.copy_from_slice(&v.to_le_bytes());
                    }
                }
                (name, view.shape().to_vec(), data)
            })
            .collect();
        let views: Vec<(String, TensorView<'_>)> = owned
            .iter()
            .map(|(name, shape, data)| {
                let view = TensorView::new(Dtype::F32, shape.clone(), data).unwrap();
                (name.clone(), view)
            })
            .collect();
        let out = safetensors::serialize(views, meta.metadata().clone()).unwrap();
        GrModel::from_safetensors(&out).unwrap()
    }

    /// Candidates whose probabilities underflow to 0 still come back in
    /// the order of their logits: the same order whichever order they
    /// were sent in (ordered by probability they tied and kept their
    /// positions, so reversing the request reversed them). The reported
    /// scores stay the probabilities. Alone and in a batch alike.
    #[test]
    fn candidates_whose_probabilities_underflow_are_ordered_by_their_logits() {
        let mut params = test_params();
        params.top_k = 40;
        params.shared_model = Some(Arc::new(sharpened_model(300.0)));
        let cands: Vec<u32> = (0..40u32).map(|c| (c * 37 + 5) % 600).collect();
        let rev: Vec<u32> = cands.iter().rev().copied().collect();
        let history: Vec<u32> = (0..30u32).map(|h| (h * 13 + 400) % 600).collect();
        let req = |req_id, candidates| RankRequest {
            req_id,
            user_id: req_id,
            candidates,
        };
        let serve = |id, candidates| {
            let mut node = ServingNode::new(id, params.clone()).unwrap();
            node.serve(0, req(1, candidates), &history, &TestCatalog::new(600))
                .unwrap()
        };
        let (a, b) = (serve(0, &cands), serve(1, &rev));
        let zeros = a.scores.iter().filter(|&&p| p == 0.0).count();
        assert!(zeros >= 3, "too few underflowed to test: {:?}", a.scores);
        assert!(a.scores.iter().sum::<f32>() > 0.99, "{:?}", a.scores);
        assert_eq!(a.items, b.items);
        assert!(a.scores.windows(2).all(|w| w[0] >= w[1]));
        // Both orders in one batch: the same answer as alone.
        let mut node = ServingNode::new(2, params.clone()).unwrap();
        let work = [
            RankWork {
                req: req(1, &cands),
                history: &history,
                cut_before: false,
            },
            RankWork {
                req: req(2, &rev),
                history: &history,
                cut_before: false,
            },
        ];
        let batched = node.serve_rank_batch(0, &work, &TestCatalog::new(600));
        for served in batched {
            assert_eq!(served.unwrap().items, a.items);
        }
    }
}
