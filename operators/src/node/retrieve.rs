//! Generative-retrieval requests (xGR): planned and reserved in order,
//! then computed in groups, one prefill and one beam decode for all of a
//! group's requests.

use grflow_kernels::{BeamPrompt, BeamSearch, GrModel, KvBlockStore, PrefillJob, SID_STEPS, flops};

use super::embedding::EmbStats;
use super::plan::Plan;
use super::prefix::{self, UserPrefix};
use super::{ItemCatalog, Outcome, ServeError, Served, ServingNode};
use crate::retrieval::RetrievalIndex;

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
    /// As [`super::RankWork::cut_before`].
    pub cut_before: bool,
}

/// A retrieve request ready for its model work: planned, its prompt
/// looked up and its prefix reserved.
pub(super) struct RetrievePrep<'h> {
    user_id: u64,
    plan: Plan<'h>,
    emb: EmbStats,
    /// Embeddings of the history past the reused prefix.
    history_tokens: Vec<f32>,
    prefix: UserPrefix,
}

/// Items and scores of a retrieve request.
pub(super) type Retrieved = (Vec<u32>, Vec<f32>);

/// Retrieve requests computed together (one prefill and one beam decode
/// for all of them), in a lane beside rank batches or alone.
pub(super) struct RetrieveGroup<'a, 'h> {
    pub(super) preps: Vec<&'a RetrievePrep<'h>>,
    pub(super) index: &'a RetrievalIndex,
}

/// Retrieve requests decoded together at most: each holds a beam searcher
/// sized for the longest prompt (~2 MB at hstu-3l), and 16 searches of a
/// 32-wide beam already give the decode GEMMs 512 rows.
pub const MAX_RETRIEVE_GROUP: usize = 16;

impl ServingNode {
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
        self.serve_retrieve_batch(
            now_ms,
            &[RetrieveWork {
                req,
                history,
                cut_before: false,
            }],
            catalog,
            index,
        )
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
    pub(super) fn prepare_group<'h>(
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
            let mut prepared = self.prepare_retrieve(*w, catalog, index, lane);
            // Alone it does not fit: KV takes pages back from EMB.
            while let Err(e) = &prepared
                && lane == 0
                && self.reclaim_for(e)
            {
                prepared = self.prepare_retrieve(*w, catalog, index, lane);
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
        work: RetrieveWork<'h>,
        catalog: &dyn ItemCatalog,
        index: &RetrievalIndex,
        lane: usize,
    ) -> Result<RetrievePrep<'h>, ServeError> {
        let RetrieveWork {
            req,
            history,
            cut_before,
        } = work;
        let plan = Plan::retrieve(
            &self.history_limits,
            req.req_id,
            history,
            self.params.beam_width,
            index.is_empty(),
        )?
        .cut_before(cut_before);
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
    pub(super) fn finish_retrieve(
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
}

/// Prefill of a group of retrieve requests' uncached prompts in one set of
/// GEMMs, then their beam searches decoded together, over `store` (the
/// pool, or a lane's view of it); `beams` holds one searcher per request.
/// Should the group fail as a whole (the plans rule that out), each request
/// is retried alone so that it fails by itself.
pub(super) fn retrieve_group<S: KvBlockStore + ?Sized>(
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
