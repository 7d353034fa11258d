//! Generative retrieval (xGR): wide beam search over semantic-ID triplets
//! with shared prompt KV, in-place unshared beam KV, staged attention,
//! valid-path masks and early-terminating top-BW, reusing every buffer
//! across steps and requests (§6.3).

use crate::backend::{MatMut, MatRef};
use crate::config::ModelConfig;
use crate::error::KernelError;
use crate::kv_store::KvBlockStore;
use crate::model::{GrModel, LayerMatrix};
use crate::ops::{add, exp_neg, gelu, rms_norm};
use crate::staged::{MAX_STEPS, SharedPrompt, StagedScratch, UnsharedKv, staged_attention};
use crate::topk::{Candidate, TopBw, rank_order};
use crate::trie::SidTrie;

/// Decode steps: one per semantic-ID code.
pub const SID_STEPS: usize = MAX_STEPS;

/// One generated item and its cumulative log-probability.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BeamHit {
    pub sid: [u16; 3],
    pub log_prob: f32,
}

/// A reusable beam searcher for one (config, BW, K, max prompt) shape: all
/// buffers are allocated in [`BeamSearch::new`].
#[derive(Debug)]
pub struct BeamSearch {
    cfg: ModelConfig,
    bw: usize,
    k: usize,
    unshared: UnsharedKv,
    scratch: StagedScratch,
    /// Decode-step rows; when several searches decode together, the first
    /// one's hold every search's rows.
    rows: StepRows,
    /// Per-beam top candidates of the current step, `stride` apart
    /// (`bw × max(k, bw)`).
    cands: Vec<Candidate>,
    /// Slots per beam in `cands` this step: K, or max(K, BW) while fewer
    /// than BW beams are live.
    stride: usize,
    lens: Vec<usize>,
    /// One beam's valid expansions before its top-K cut.
    row: Vec<Candidate>,
    top: TopBw,
    selected: Vec<Candidate>,
    parents: Vec<u32>,
    codes: Vec<[u16; 3]>,
    codes_next: Vec<[u16; 3]>,
    scores: Vec<f32>,
    scores_next: Vec<f32>,
    nodes: Vec<u32>,
    nodes_next: Vec<u32>,
    /// Parents chosen at each step (for the memory comparison).
    parent_log: Vec<Vec<u32>>,
    /// Beams decoded (rows through the model) at each step.
    step_rows: [usize; SID_STEPS],
    hits: Vec<BeamHit>,
    live: usize,
}

impl BeamSearch {
    /// Buffers for beam width `beam_width`, per-beam top-`top_k`, and
    /// prompts of up to `max_prompt` tokens.
    pub fn new(
        cfg: &ModelConfig,
        beam_width: usize,
        top_k: usize,
        max_prompt: usize,
    ) -> Result<Self, KernelError> {
        cfg.validate()?;
        if beam_width == 0 || top_k == 0 {
            return Err(KernelError::Beam(
                "beam_width and top_k must be >= 1".into(),
            ));
        }
        let (bw, c) = (beam_width, cfg.codebook_size);
        let k = top_k.min(c);
        let cand0 = Candidate {
            score: 0.0,
            beam: 0,
            token: 0,
            node: 0,
        };
        Ok(Self {
            cfg: cfg.clone(),
            bw,
            k,
            unshared: UnsharedKv::new(cfg, bw, SID_STEPS),
            scratch: StagedScratch::new(cfg, bw, max_prompt),
            rows: StepRows::new(cfg, bw),
            cands: vec![cand0; bw * k.max(bw)],
            stride: k,
            lens: vec![0; bw],
            row: Vec::with_capacity(c),
            top: TopBw::with_capacity(bw),
            selected: Vec::with_capacity(bw),
            parents: Vec::with_capacity(bw),
            codes: vec![[0; 3]; bw],
            codes_next: vec![[0; 3]; bw],
            scores: vec![0.0; bw],
            scores_next: vec![0.0; bw],
            nodes: vec![0; bw],
            nodes_next: vec![0; bw],
            parent_log: (0..SID_STEPS).map(|_| Vec::with_capacity(bw)).collect(),
            step_rows: [0; SID_STEPS],
            hits: Vec::with_capacity(bw),
            live: 0,
        })
    }

    pub fn beam_width(&self) -> usize {
        self.bw
    }

    /// Bytes allocated for the unshared beam KV (the capacity of its
    /// buffer: BW × steps tokens).
    pub fn unshared_kv_bytes(&self) -> usize {
        self.unshared.allocated_bytes()
    }

    /// The last step's per-beam candidate lists: (candidates, stride, lens),
    /// each in no particular order (the selection leaves the lists it
    /// visited as heaps).
    pub fn last_candidates(&self) -> (&[Candidate], usize, &[usize]) {
        (&self.cands, self.stride, &self.lens[..self.live])
    }

    /// Parents chosen after each decode step of the last request.
    pub fn parents_per_step(&self) -> &[Vec<u32>] {
        &self.parent_log
    }

    /// Rows the last request ran through the model at each decode step:
    /// 1 at step 0, then the beams the previous step kept (at most BW;
    /// fewer where the catalog has fewer valid paths). All zero before the
    /// first request. [`crate::flops::beam_search_rows_flops`] turns them
    /// into the FLOPs the search did.
    pub fn rows_per_step(&self) -> [usize; SID_STEPS] {
        self.step_rows
    }

    /// Generates up to BW items for the prompt of `prompt_len` tokens whose
    /// KV is in `block_table` (e.g. a user prefix from
    /// [`GrModel::prefill`]). Decoding runs at positions `prompt_len..+3`:
    /// the generation token, then the embeddings of codes 0 and 1. Only
    /// items of `trie` are emitted. Returns hits by descending log-prob.
    pub fn generate<S: KvBlockStore + ?Sized>(
        &mut self,
        model: &GrModel,
        store: &S,
        block_table: &[u32],
        prompt_len: usize,
        trie: &SidTrie,
    ) -> Result<&[BeamHit], KernelError> {
        let prompt = BeamPrompt {
            block_table,
            prompt_len,
        };
        Self::generate_many(std::slice::from_mut(self), model, store, &[prompt], trie)?;
        Ok(&self.hits)
    }

    /// Several requests' searches decoded together (`searches[i]` for
    /// `prompts[i]`): each step runs the live beams of every search through
    /// the linear layers and the head in one set of GEMMs, and attention per
    /// search over its own prompt and beams, so a search's hits
    /// ([`Self::hits`]) equal [`Self::generate`] on it alone (within float
    /// rounding). Nothing is computed unless every prompt is valid.
    pub fn generate_many<S: KvBlockStore + ?Sized>(
        searches: &mut [BeamSearch],
        model: &GrModel,
        store: &S,
        prompts: &[BeamPrompt<'_>],
        trie: &SidTrie,
    ) -> Result<(), KernelError> {
        if searches.len() != prompts.len() {
            return Err(KernelError::Beam(format!(
                "{} searches for {} prompts",
                searches.len(),
                prompts.len()
            )));
        }
        for (search, prompt) in searches.iter().zip(prompts) {
            search.check(model, store, prompt, trie)?;
        }
        let Some(first) = searches.first_mut() else {
            return Ok(());
        };
        let mut rows = std::mem::take(&mut first.rows);
        rows.ensure(model.config(), searches.iter().map(|s| s.bw).sum());
        for search in searches.iter_mut() {
            search.live = 1;
            search.scores[0] = 0.0;
            search.codes[0] = [0; 3];
            search.hits.clear();
        }
        let c = model.config().codebook_size;
        for step in 0..SID_STEPS {
            for search in searches.iter_mut() {
                search.step_rows[step] = search.live;
            }
            decode_step(model, store, prompts, searches, &mut rows, step);
            let mut o = 0;
            for search in searches.iter_mut() {
                let nb = search.live;
                search.expand(&mut rows.logits[o * c..(o + nb) * c], trie, step);
                search.select(step);
                o += nb;
            }
        }
        searches[0].rows = rows;
        Ok(())
    }

    /// The hits of the last search, by descending log-prob.
    pub fn hits(&self) -> &[BeamHit] {
        &self.hits
    }

    /// Rejects a (model, store, prompt, catalog) this search cannot run.
    fn check<S: KvBlockStore + ?Sized>(
        &self,
        model: &GrModel,
        store: &S,
        prompt: &BeamPrompt<'_>,
        trie: &SidTrie,
    ) -> Result<(), KernelError> {
        let cfg = &self.cfg;
        if model.config() != cfg {
            return Err(KernelError::Beam(
                "model config differs from the searcher's".into(),
            ));
        }
        if trie.codebook_size() != cfg.codebook_size {
            return Err(KernelError::Beam(format!(
                "trie codebook {} != model codebook {}",
                trie.codebook_size(),
                cfg.codebook_size
            )));
        }
        if trie.is_empty() {
            return Err(KernelError::Empty("catalog"));
        }
        if store.block_floats() != cfg.kv_block_floats() {
            return Err(KernelError::BlockFloats {
                expected: cfg.kv_block_floats(),
                got: store.block_floats(),
            });
        }
        let prompt_len = prompt.prompt_len;
        if prompt_len > self.scratch.max_prompt(self.bw) {
            return Err(KernelError::Beam(format!(
                "prompt of {prompt_len} tokens exceeds max_prompt {}",
                self.scratch.max_prompt(self.bw)
            )));
        }
        let needed = cfg.blocks_for(prompt_len);
        if prompt.block_table.len() < needed {
            return Err(KernelError::BlockTableTooShort {
                needed,
                got: prompt.block_table.len(),
            });
        }
        model.check_pos(prompt_len + SID_STEPS)
    }

    /// Builds every live beam's top-K valid expansions, scored by
    /// cumulative log-prob (log-softmax over the valid codes only, which is
    /// the additive -inf mask of xGR §6.1).
    fn expand(&mut self, logits: &mut [f32], trie: &SidTrie, step: usize) {
        let c = self.cfg.codebook_size;
        // While fewer than BW beams are live (the first step's lone beam,
        // or a step after a level with few valid codes), each beam keeps
        // max(K, BW): the global top-BW is then exact, and the beam does not
        // shrink for good. A cut to K would drop valid children of a beam
        // with many whenever another beam has fewer than K (live·K >= BW
        // does not mean the K-cut lists hold BW candidates).
        // live·max(K, BW) < BW·max(K, BW) fits `cands`.
        self.stride = if self.live < self.bw {
            self.k.max(self.bw)
        } else {
            self.k
        };
        for b in 0..self.live {
            let logits = &mut logits[b * c..(b + 1) * c];
            self.row.clear();
            let base = self.scores[b];
            let beam = b as u32;
            match step {
                0 => {
                    // Dense mask, pre-generated at trie build time.
                    add(logits, trie.first_mask());
                    let lse = log_sum_exp(logits.iter().copied());
                    for (code, &z) in logits.iter().enumerate() {
                        if z > f32::NEG_INFINITY {
                            self.row.push(Candidate {
                                score: base + (z - lse),
                                beam,
                                token: code as u32,
                                node: code as u32,
                            });
                        }
                    }
                }
                1 => {
                    let (children, first) = trie.children_of_first(self.codes[b][0]);
                    let lse = log_sum_exp(children.iter().map(|&k| logits[k as usize]));
                    for (j, &k) in children.iter().enumerate() {
                        self.row.push(Candidate {
                            score: base + (logits[k as usize] - lse),
                            beam,
                            token: k as u32,
                            node: first + j as u32,
                        });
                    }
                }
                _ => {
                    let children = trie.children_of_node(self.nodes[b]);
                    let lse = log_sum_exp(children.iter().map(|&k| logits[k as usize]));
                    for &k in children {
                        self.row.push(Candidate {
                            score: base + (logits[k as usize] - lse),
                            beam,
                            token: k as u32,
                            node: 0,
                        });
                    }
                }
            }
            let keep = self.stride;
            if self.row.len() > keep {
                self.row.select_nth_unstable_by(keep - 1, rank_order);
                self.row.truncate(keep);
            }
            // Unordered: the selection visits beams best first and orders
            // only the candidates it takes.
            let at = b * self.stride;
            self.cands[at..at + self.row.len()].copy_from_slice(&self.row);
            self.lens[b] = self.row.len();
        }
    }

    /// Global top-BW with early termination, then the in-place fork of
    /// codes, scores, trie nodes and unshared KV (or the final hits).
    fn select(&mut self, step: usize) {
        let chosen = self.top.select_unordered(
            &mut self.cands,
            self.stride,
            &self.lens[..self.live],
            self.bw,
        );
        self.selected.clear();
        self.selected.extend_from_slice(chosen);
        if step + 1 == SID_STEPS {
            for s in &self.selected {
                let mut sid = self.codes[s.beam as usize];
                sid[step] = s.token as u16;
                self.hits.push(BeamHit {
                    sid,
                    log_prob: s.score,
                });
            }
            self.hits
                .sort_unstable_by(|a, b| b.log_prob.total_cmp(&a.log_prob).then(a.sid.cmp(&b.sid)));
            self.parent_log[step].clear();
            self.parent_log[step].extend(self.selected.iter().map(|s| s.beam));
            return;
        }
        // Ordering by parent makes the in-place KV fork hazard-free.
        self.selected.sort_unstable_by_key(|s| (s.beam, s.token));
        self.parents.clear();
        self.parents.extend(self.selected.iter().map(|s| s.beam));
        self.parent_log[step].clear();
        self.parent_log[step].extend_from_slice(&self.parents);
        for (i, s) in self.selected.iter().enumerate() {
            let mut sid = self.codes[s.beam as usize];
            sid[step] = s.token as u16;
            self.codes_next[i] = sid;
            self.scores_next[i] = s.score;
            self.nodes_next[i] = s.node;
        }
        std::mem::swap(&mut self.codes, &mut self.codes_next);
        std::mem::swap(&mut self.scores, &mut self.scores_next);
        std::mem::swap(&mut self.nodes, &mut self.nodes_next);
        self.unshared.fork_in_place(&self.parents, step + 1);
        self.live = self.selected.len();
    }
}

/// One prompt of [`BeamSearch::generate_many`]: `prompt_len` tokens whose
/// KV is in `block_table`.
#[derive(Clone, Copy, Debug)]
pub struct BeamPrompt<'a> {
    pub block_table: &'a [u32],
    pub prompt_len: usize,
}

/// Row buffers of a decode step (`rows` × width each).
#[derive(Debug, Default)]
struct StepRows {
    x: Vec<f32>,
    h: Vec<f32>,
    qkv: Vec<f32>,
    attn: Vec<f32>,
    ff: Vec<f32>,
    logits: Vec<f32>,
}

impl StepRows {
    fn new(cfg: &ModelConfig, rows: usize) -> Self {
        let mut r = Self::default();
        r.ensure(cfg, rows);
        r
    }

    /// Grows the buffers to `rows` rows; never shrinks (they are reused).
    fn ensure(&mut self, cfg: &ModelConfig, rows: usize) {
        let (d, f, c) = (cfg.d_model, cfg.d_ff, cfg.codebook_size);
        for (buf, width) in [
            (&mut self.x, d),
            (&mut self.h, d),
            (&mut self.qkv, 3 * d),
            (&mut self.attn, d),
            (&mut self.ff, f),
            (&mut self.logits, c),
        ] {
            if buf.len() < rows * width {
                buf.resize(rows * width, 0.0);
            }
        }
    }
}

/// Runs the step-`step` tokens of every search's live beams through the
/// model into `rows.logits` (one row of C per beam, searches in order).
fn decode_step<S: KvBlockStore + ?Sized>(
    model: &GrModel,
    store: &S,
    prompts: &[BeamPrompt<'_>],
    searches: &mut [BeamSearch],
    rows: &mut StepRows,
    step: usize,
) {
    let cfg = model.config();
    let be = model.backend.as_ref();
    let (d, f, c) = (cfg.d_model, cfg.d_ff, cfg.codebook_size);
    let n: usize = searches.iter().map(|s| s.live).sum();
    let StepRows {
        x,
        h,
        qkv,
        attn,
        ff,
        logits,
    } = rows;
    let mut o = 0;
    for (search, prompt) in searches.iter().zip(prompts) {
        let pos = model.pos_row(prompt.prompt_len + step);
        let beams = x[o * d..].chunks_exact_mut(d).take(search.live);
        for (row, codes) in beams.zip(&search.codes) {
            let input = match step {
                0 => &model.gen_token[..],
                s => {
                    let at = (s - 1) * c + codes[s - 1] as usize;
                    &model.sid_emb[at * d..(at + 1) * d]
                }
            };
            row.copy_from_slice(input);
            add(row, pos);
        }
        o += search.live;
    }
    let x = &mut x[..n * d];
    let h = &mut h[..n * d];
    for (l, w) in model.layers.iter().enumerate() {
        rms_norm(x, &w.ln1, h);
        be.matmul_weight(
            MatMut::row_major(&mut qkv[..n * 3 * d], n, 3 * d),
            MatRef::row_major(h, n, d),
            model.layer_matrix(l, LayerMatrix::Qkv),
            1.0,
            false,
        );
        let mut o = 0;
        for (search, prompt) in searches.iter_mut().zip(prompts) {
            let nb = search.live;
            let q = &qkv[o * 3 * d..(o + nb) * 3 * d];
            for (i, r) in q.chunks_exact(3 * d).enumerate() {
                search
                    .unshared
                    .row_mut(l, 0, i, step)
                    .copy_from_slice(&r[d..2 * d]);
                search
                    .unshared
                    .row_mut(l, 1, i, step)
                    .copy_from_slice(&r[2 * d..]);
            }
            let shared = SharedPrompt {
                store,
                blocks: prompt.block_table,
                len: prompt.prompt_len,
            };
            staged_attention(
                be,
                cfg,
                l,
                q,
                3 * d,
                nb,
                shared,
                &search.unshared,
                step + 1,
                &mut search.scratch,
                &mut attn[o * d..(o + nb) * d],
            );
            o += nb;
        }
        be.matmul_weight(
            MatMut::row_major(x, n, d),
            MatRef::row_major(&attn[..n * d], n, d),
            model.layer_matrix(l, LayerMatrix::Out),
            1.0,
            true,
        );
        rms_norm(x, &w.ln2, h);
        let ff = &mut ff[..n * f];
        be.matmul_weight(
            MatMut::row_major(ff, n, f),
            MatRef::row_major(h, n, d),
            model.layer_matrix(l, LayerMatrix::Ff1),
            1.0,
            false,
        );
        gelu(ff);
        be.matmul_weight(
            MatMut::row_major(x, n, d),
            MatRef::row_major(ff, n, f),
            model.layer_matrix(l, LayerMatrix::Ff2),
            1.0,
            true,
        );
    }
    rms_norm(x, &model.ln_f, h);
    be.matmul_weight(
        MatMut::row_major(&mut logits[..n * c], n, c),
        MatRef::row_major(h, n, d),
        model.sid_head_matrix(step),
        1.0,
        false,
    );
}

fn log_sum_exp(v: impl Iterator<Item = f32> + Clone) -> f32 {
    let m = v.clone().fold(f32::NEG_INFINITY, f32::max);
    if m == f32::NEG_INFINITY {
        return m;
    }
    m + v.map(|z| exp_neg(z - m)).sum::<f32>().ln()
}

/// Beam KV bytes of three layouts at one request's shape.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BeamKvBytes {
    /// Ours: the prompt's paged blocks once + BW × steps unshared tokens.
    pub separated: usize,
    /// Peak of a PagedAttention-style layout where each beam owns a block
    /// table and forking copies a shared partial block (copy-on-write).
    pub paged_baseline: usize,
    /// One copy of the prompt + BW × steps tokens, no padding.
    pub ideal: usize,
}

/// Computes [`BeamKvBytes`] for a prompt of `prompt_len` tokens and the
/// parents a search chose at each step ([`BeamSearch::parents_per_step`]).
pub fn beam_kv_bytes(
    cfg: &ModelConfig,
    prompt_len: usize,
    bw: usize,
    parents_per_step: &[Vec<u32>],
) -> BeamKvBytes {
    let tok = cfg.kv_token_floats() * 4;
    let block = cfg.kv_block_floats() * 4;
    let steps = parents_per_step.len();
    let separated = cfg.blocks_for(prompt_len) * block + bw * steps * tok;
    let ideal = (prompt_len + bw * steps) * tok;
    // Paged simulation: block refcounts, per-beam block tables.
    let mut refs: Vec<u32> = Vec::new();
    let mut free: Vec<usize> = Vec::new();
    let alloc = |refs: &mut Vec<u32>, free: &mut Vec<usize>| -> usize {
        if let Some(id) = free.pop() {
            refs[id] = 1;
            id
        } else {
            refs.push(1);
            refs.len() - 1
        }
    };
    let mut prompt_blocks = Vec::new();
    for _ in 0..cfg.blocks_for(prompt_len) {
        prompt_blocks.push(alloc(&mut refs, &mut free));
    }
    let mut beams: Vec<(Vec<usize>, usize)> = vec![(prompt_blocks, prompt_len)];
    let live = |refs: &Vec<u32>| refs.iter().filter(|&&r| r > 0).count();
    let mut peak = live(&refs);
    for parents in parents_per_step {
        // Every live beam appends the token of this step.
        for (table, len) in beams.iter_mut() {
            if *len % cfg.block_size == 0 {
                table.push(alloc(&mut refs, &mut free));
            } else {
                let last = *table.last().expect("partial block exists");
                if refs[last] > 1 {
                    refs[last] -= 1;
                    *table.last_mut().expect("non-empty") = alloc(&mut refs, &mut free); // copy-on-write
                }
            }
            *len += 1;
        }
        peak = peak.max(live(&refs));
        // Fork: children share the parent's blocks; old beams are released.
        let next: Vec<(Vec<usize>, usize)> =
            parents.iter().map(|&p| beams[p as usize].clone()).collect();
        for (table, _) in &next {
            for &blk in table {
                refs[blk] += 1;
            }
        }
        for (table, _) in &beams {
            for &blk in table {
                refs[blk] -= 1;
                if refs[blk] == 0 {
                    free.push(blk);
                }
            }
        }
        beams = next;
        peak = peak.max(live(&refs));
    }
    BeamKvBytes {
        separated,
        paged_baseline: peak * block,
        ideal,
    }
}
