//! Forward passes over paged KV: prefix prefill (paged KV reuse) and the two
//! bipartite ranking layouts of BAT (§4.2).

use crate::attention::{AttnScratch, LocalMask, Segment, attend, gather, scatter};
use crate::backend::{MatMut, MatRef};
use crate::error::KernelError;
use crate::kv_store::KvBlockStore;
use crate::model::{GrModel, LayerMatrix};
use crate::ops::{add, gelu, rms_norm};

/// A cached item-prefix entry (BAT Item-as-prefix): the blocks holding one
/// item's KV written by [`GrModel::item_kv`], and its token count.
#[derive(Clone, Copy, Debug)]
pub struct ItemKvRef<'a> {
    pub blocks: &'a [u32],
    pub len: usize,
}

/// One sequence of a batched pass: its cached context, its local rows
/// (position embeddings added) and their mask.
pub(crate) struct SeqIn<'a> {
    pub ctx: Vec<Segment<'a>>,
    pub x: Vec<f32>,
    pub mask: LocalMask,
}

/// One user's history suffix to prefill in a batch ([`GrModel::prefill_batch`]).
#[derive(Clone, Copy, Debug)]
pub struct PrefillJob<'a> {
    pub block_table: &'a [u32],
    pub cached_len: usize,
    pub new_tokens: &'a [f32],
}

/// One User-as-prefix ranking in a batch ([`GrModel::rank_user_prefix_batch`]).
#[derive(Clone, Copy, Debug)]
pub struct RankJob<'a> {
    pub block_table: &'a [u32],
    pub prefix_len: usize,
    pub candidate_tokens: &'a [f32],
}

/// What one pass over a token sequence leaves behind.
pub(crate) struct SeqOut {
    /// Residual stream after the last layer (`n × d`, before the final norm).
    pub hidden: Vec<f32>,
    /// The local tokens' KV: `[layer][K|V][n][d]`.
    pub kv: Vec<f32>,
}

impl GrModel {
    fn check_store<S: KvBlockStore + ?Sized>(&self, store: &S) -> Result<(), KernelError> {
        let expected = self.cfg.kv_block_floats();
        if store.block_floats() != expected {
            return Err(KernelError::BlockFloats {
                expected,
                got: store.block_floats(),
            });
        }
        Ok(())
    }

    fn check_tokens(&self, what: &'static str, tokens: &[f32]) -> Result<usize, KernelError> {
        let d = self.cfg.d_model;
        if !tokens.len().is_multiple_of(d) {
            return Err(KernelError::Shape {
                what,
                expected: tokens.len().div_ceil(d) * d,
                got: tokens.len(),
            });
        }
        Ok(tokens.len() / d)
    }

    fn check_table(&self, blocks: &[u32], tokens: usize) -> Result<(), KernelError> {
        let needed = self.cfg.blocks_for(tokens);
        if blocks.len() < needed {
            return Err(KernelError::BlockTableTooShort {
                needed,
                got: blocks.len(),
            });
        }
        Ok(())
    }

    /// Runs all layers over `x` (`n` local tokens, position embeddings
    /// already added) attending to the cached `ctx` segments and, under
    /// `mask`, to each other.
    pub(crate) fn forward_seq<S: KvBlockStore + ?Sized>(
        &self,
        store: &S,
        ctx: &[Segment<'_>],
        x: Vec<f32>,
        mask: LocalMask,
    ) -> SeqOut {
        let seq = SeqIn {
            ctx: ctx.to_vec(),
            x,
            mask,
        };
        self.forward_batch(store, vec![seq])
            .pop()
            .expect("one sequence in, one out")
    }

    /// Runs all layers over several independent sequences at once: their
    /// rows are packed into one matrix for every projection and FFN GEMM
    /// (ragged, no padding), and each attends only to its own context and
    /// local tokens. Equal to one [`Self::forward_seq`] per sequence.
    pub(crate) fn forward_batch<S: KvBlockStore + ?Sized>(
        &self,
        store: &S,
        seqs: Vec<SeqIn<'_>>,
    ) -> Vec<SeqOut> {
        let cfg = &self.cfg;
        let be = self.backend.as_ref();
        let (d, f) = (cfg.d_model, cfg.d_ff);
        // Row offset of each sequence in the packed matrix.
        let mut offsets = Vec::with_capacity(seqs.len() + 1);
        offsets.push(0);
        for s in &seqs {
            offsets.push(offsets.last().copied().unwrap_or(0) + s.x.len() / d);
        }
        let n_all = *offsets.last().expect("at least the 0");
        let mut x = Vec::with_capacity(n_all * d);
        for s in &seqs {
            x.extend_from_slice(&s.x);
        }
        let mut h = vec![0f32; n_all * d];
        let mut qkv = vec![0f32; n_all * 3 * d];
        let mut attn = vec![0f32; n_all * d];
        let mut ff = vec![0f32; n_all * f];
        // Per sequence: its context + local keys and values, and the KV of
        // its local tokens for every layer.
        let mut kvs: Vec<(Vec<f32>, Vec<f32>, Vec<f32>)> = seqs
            .iter()
            .map(|s| {
                let n = s.x.len() / d;
                let c: usize = s.ctx.iter().map(|g| g.len).sum();
                (
                    vec![0f32; (c + n) * d],
                    vec![0f32; (c + n) * d],
                    vec![0f32; cfg.n_layers * 2 * n * d],
                )
            })
            .collect();
        let mut scratch = AttnScratch::default();
        for (l, w) in self.layers.iter().enumerate() {
            rms_norm(&x, &w.ln1, &mut h);
            be.matmul_weight(
                MatMut::row_major(&mut qkv, n_all, 3 * d),
                MatRef::row_major(&h, n_all, d),
                self.layer_matrix(l, LayerMatrix::Qkv),
                1.0,
                false,
            );
            for (i, (seq, (kall, vall, kv))) in seqs.iter().zip(&mut kvs).enumerate() {
                let (r0, n) = (offsets[i], offsets[i + 1] - offsets[i]);
                let c = kall.len() / d - n;
                let mut at = 0;
                for seg in &seq.ctx {
                    let rows = at * d..(at + seg.len) * d;
                    gather(cfg, store, *seg, l, 0, &mut kall[rows.clone()]);
                    gather(cfg, store, *seg, l, 1, &mut vall[rows]);
                    at += seg.len;
                }
                let q = &qkv[r0 * 3 * d..(r0 + n) * 3 * d];
                for (j, row) in q.chunks_exact(3 * d).enumerate() {
                    kall[(c + j) * d..(c + j + 1) * d].copy_from_slice(&row[d..2 * d]);
                    vall[(c + j) * d..(c + j + 1) * d].copy_from_slice(&row[2 * d..]);
                }
                kv[(l * 2) * n * d..(l * 2 + 1) * n * d].copy_from_slice(&kall[c * d..]);
                kv[(l * 2 + 1) * n * d..(l * 2 + 2) * n * d].copy_from_slice(&vall[c * d..]);
                attend(
                    be,
                    cfg,
                    q,
                    3 * d,
                    kall,
                    vall,
                    c,
                    n,
                    seq.mask,
                    &mut scratch,
                    &mut attn[r0 * d..(r0 + n) * d],
                );
            }
            be.matmul_weight(
                MatMut::row_major(&mut x, n_all, d),
                MatRef::row_major(&attn, n_all, d),
                self.layer_matrix(l, LayerMatrix::Out),
                1.0,
                true,
            );
            rms_norm(&x, &w.ln2, &mut h);
            be.matmul_weight(
                MatMut::row_major(&mut ff, n_all, f),
                MatRef::row_major(&h, n_all, d),
                self.layer_matrix(l, LayerMatrix::Ff1),
                1.0,
                false,
            );
            gelu(&mut ff);
            be.matmul_weight(
                MatMut::row_major(&mut x, n_all, d),
                MatRef::row_major(&ff, n_all, f),
                self.layer_matrix(l, LayerMatrix::Ff2),
                1.0,
                true,
            );
        }
        kvs.into_iter()
            .enumerate()
            .map(|(i, (_, _, kv))| SeqOut {
                hidden: x[offsets[i] * d..offsets[i + 1] * d].to_vec(),
                kv,
            })
            .collect()
    }

    /// Input rows `tokens + pos[positions]`.
    fn with_positions(&self, tokens: &[f32], positions: impl Iterator<Item = usize>) -> Vec<f32> {
        let d = self.cfg.d_model;
        let mut x = tokens.to_vec();
        for (row, p) in x.chunks_exact_mut(d).zip(positions) {
            add(row, self.pos_row(p));
        }
        x
    }

    /// Paged prefill of a user's history (User-as-prefix cache): computes
    /// the KV of `new_tokens` (summed embedding rows, `d_model` each) at
    /// positions `cached_len..`, causally attending to the `cached_len`
    /// tokens already in the table's blocks, and writes it into the blocks.
    /// Block ids may be any order; the table must cover
    /// `cached_len + new` tokens.
    pub fn prefill<S: KvBlockStore + ?Sized>(
        &self,
        store: &mut S,
        block_table: &[u32],
        cached_len: usize,
        new_tokens: &[f32],
    ) -> Result<(), KernelError> {
        let job = PrefillJob {
            block_table,
            cached_len,
            new_tokens,
        };
        self.prefill_batch(store, &[job])
    }

    /// User-as-prefix ranking `[U, I1..IN, Instr]`: the user's `prefix_len`
    /// tokens are read from the blocks; the N candidates (one token each)
    /// share position `prefix_len` and are masked from each other; the
    /// instruction token at `prefix_len + 1` sees the user and itself, never
    /// the candidates, so a candidate's logit does not depend on the others.
    /// Nothing is written. Returns one softmax score per candidate.
    pub fn rank_user_prefix<S: KvBlockStore + ?Sized>(
        &self,
        store: &S,
        block_table: &[u32],
        prefix_len: usize,
        candidate_tokens: &[f32],
    ) -> Result<Vec<f32>, KernelError> {
        let job = RankJob {
            block_table,
            prefix_len,
            candidate_tokens,
        };
        let mut scores = self.rank_user_prefix_batch(store, &[job])?;
        Ok(scores.pop().expect("one job, one score vector"))
    }

    /// [`Self::prefill`] for several users' history suffixes in one set of
    /// GEMMs. Jobs must write disjoint blocks (each request's fresh ones).
    /// Nothing is written unless every job is valid.
    pub fn prefill_batch<S: KvBlockStore + ?Sized>(
        &self,
        store: &mut S,
        jobs: &[PrefillJob<'_>],
    ) -> Result<(), KernelError> {
        self.check_store(store)?;
        let mut seqs = Vec::with_capacity(jobs.len());
        let mut kept = Vec::with_capacity(jobs.len());
        for job in jobs {
            let n = self.check_tokens("new_tokens", job.new_tokens)?;
            // Saturating: a wrapped sum passed both checks and panicked later.
            let end = job.cached_len.saturating_add(n);
            self.check_table(job.block_table, end)?;
            self.check_pos(end)?;
            if n == 0 {
                continue;
            }
            seqs.push(SeqIn {
                ctx: vec![Segment {
                    blocks: job.block_table,
                    len: job.cached_len,
                }],
                x: self.with_positions(job.new_tokens, job.cached_len..),
                mask: LocalMask::Causal,
            });
            kept.push((job, n));
        }
        if seqs.is_empty() {
            return Ok(());
        }
        let outs = self.forward_batch(&*store, seqs);
        for ((job, n), out) in kept.into_iter().zip(outs) {
            scatter(
                &self.cfg,
                store,
                job.block_table,
                job.cached_len,
                n,
                &out.kv,
            );
        }
        Ok(())
    }

    /// [`Self::rank_user_prefix`] for several requests in one set of GEMMs
    /// (their candidate and instruction rows packed together). One score
    /// vector per job, in order.
    pub fn rank_user_prefix_batch<S: KvBlockStore + ?Sized>(
        &self,
        store: &S,
        jobs: &[RankJob<'_>],
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        let logits = self.rank_user_prefix_logits_batch(store, jobs)?;
        Ok(logits.iter().map(|l| rank_softmax(l)).collect())
    }

    /// [`Self::rank_user_prefix_batch`] before the softmax: each candidate's
    /// logit. Order candidates by these: they are what the softmax is
    /// monotone in, and unlike the probabilities they never underflow to a
    /// tie (a logit ~104 below the best has probability 0 in f32).
    /// [`rank_softmax`] of a job's logits is its scores.
    pub fn rank_user_prefix_logits_batch<S: KvBlockStore + ?Sized>(
        &self,
        store: &S,
        jobs: &[RankJob<'_>],
    ) -> Result<Vec<Vec<f32>>, KernelError> {
        self.check_store(store)?;
        let d = self.cfg.d_model;
        let mut seqs = Vec::with_capacity(jobs.len());
        for job in jobs {
            let n_items = self.check_tokens("candidate_tokens", job.candidate_tokens)?;
            if n_items == 0 {
                return Err(KernelError::Empty("candidate_tokens"));
            }
            self.check_table(job.block_table, job.prefix_len)?;
            self.check_pos(job.prefix_len + 2)?;
            let mut tokens = Vec::with_capacity((n_items + 1) * d);
            tokens.extend_from_slice(job.candidate_tokens);
            tokens.extend_from_slice(&self.instr);
            let positions =
                std::iter::repeat_n(job.prefix_len, n_items).chain([job.prefix_len + 1]);
            seqs.push(SeqIn {
                ctx: vec![Segment {
                    blocks: job.block_table,
                    len: job.prefix_len,
                }],
                x: self.with_positions(&tokens, positions),
                mask: LocalMask::ItemsThenCausal { n_items },
            });
        }
        let outs = self.forward_batch(store, seqs);
        Ok(jobs
            .iter()
            .zip(outs)
            .map(|(job, out)| {
                let n_items = job.candidate_tokens.len() / d;
                let n = n_items + 1;
                let last_k = &out.kv[(self.cfg.n_layers - 1) * 2 * n * d..][..n * d];
                let keys = last_k.chunks_exact(d).take(n_items);
                self.rank_logits(&out.hidden[n_items * d..], keys)
            })
            .collect())
    }

    /// Item-as-prefix cache entry: the KV of one item computed alone
    /// (positions reset to 0, causal within the item), written into
    /// `block_table`. It equals the item's KV inside any Item-as-prefix
    /// sequence, so it can be shared across users.
    pub fn item_kv<S: KvBlockStore + ?Sized>(
        &self,
        store: &mut S,
        block_table: &[u32],
        item_tokens: &[f32],
    ) -> Result<(), KernelError> {
        self.check_store(store)?;
        let n = self.check_tokens("item_tokens", item_tokens)?;
        if n == 0 {
            return Err(KernelError::Empty("item_tokens"));
        }
        self.check_table(block_table, n)?;
        self.check_pos(n)?;
        let x = self.with_positions(item_tokens, 0..);
        let out = self.forward_seq(&*store, &[], x, LocalMask::Causal);
        scatter(&self.cfg, store, block_table, 0, n, &out.kv);
        Ok(())
    }

    /// Item-as-prefix ranking `[I1..IN, U, Instr]` from cached item entries
    /// ([`GrModel::item_kv`]): user tokens start at position
    /// `max item len` and see every item; the instruction follows. Each
    /// candidate is scored through its last token's last-layer key. The
    /// softmax of [`GrModel::rank_item_prefix_logits`]: order by those.
    pub fn rank_item_prefix<S: KvBlockStore + ?Sized>(
        &self,
        store: &S,
        items: &[ItemKvRef<'_>],
        user_tokens: &[f32],
    ) -> Result<Vec<f32>, KernelError> {
        Ok(rank_softmax(&self.rank_item_prefix_logits(
            store,
            items,
            user_tokens,
        )?))
    }

    /// The ranking head's logits of [`GrModel::rank_item_prefix`], one per
    /// item entry: candidates far below the best underflow to equal
    /// probabilities, never to equal logits.
    pub fn rank_item_prefix_logits<S: KvBlockStore + ?Sized>(
        &self,
        store: &S,
        items: &[ItemKvRef<'_>],
        user_tokens: &[f32],
    ) -> Result<Vec<f32>, KernelError> {
        self.check_store(store)?;
        if items.is_empty() {
            return Err(KernelError::Empty("items"));
        }
        for it in items {
            if it.len == 0 {
                return Err(KernelError::Empty("item entry"));
            }
            self.check_table(it.blocks, it.len)?;
        }
        let n_user = self.check_tokens("user_tokens", user_tokens)?;
        let start = items.iter().map(|i| i.len).max().unwrap_or(0);
        self.check_pos(start + n_user + 1)?;
        let d = self.cfg.d_model;
        let mut tokens = Vec::with_capacity((n_user + 1) * d);
        tokens.extend_from_slice(user_tokens);
        tokens.extend_from_slice(&self.instr);
        let x = self.with_positions(&tokens, start..);
        let ctx: Vec<Segment<'_>> = items
            .iter()
            .map(|i| Segment {
                blocks: i.blocks,
                len: i.len,
            })
            .collect();
        let out = self.forward_seq(store, &ctx, x, LocalMask::Causal);
        let (b, last) = (self.cfg.block_size, self.cfg.n_layers - 1);
        let keys = items.iter().map(|it| {
            let t = it.len - 1;
            let off = self.cfg.kv_offset(last, 0, t % b);
            &store.block(it.blocks[t / b])[off..off + d]
        });
        Ok(self.rank_logits(&out.hidden[n_user * d..], keys))
    }

    /// The ranking head's logits `⟨W_rank · norm(h_instr), k_i⟩ / √d`.
    fn rank_logits<'k>(&self, h_instr: &[f32], keys: impl Iterator<Item = &'k [f32]>) -> Vec<f32> {
        let d = self.cfg.d_model;
        let mut hn = vec![0f32; d];
        rms_norm(h_instr, &self.ln_f, &mut hn);
        let mut u = vec![0f32; d];
        self.backend.matmul(
            MatMut::row_major(&mut u, 1, d),
            MatRef::row_major(&hn, 1, d),
            MatRef::row_major(&self.w_rank, d, d),
            1.0,
            false,
        );
        let scale = 1.0 / (d as f32).sqrt();
        keys.map(|k| k.iter().zip(&u).map(|(a, b)| a * b).sum::<f32>() * scale)
            .collect()
    }
}

/// The ranking scores of one request: the softmax of its candidates'
/// logits ([`GrModel::rank_user_prefix_logits_batch`]), what
/// [`GrModel::rank_user_prefix`] returns. A candidate whose logit is more
/// than ~87 below the best gets a subnormal, more than ~104 below exactly
/// 0, so order candidates by the logits, not by these.
pub fn rank_softmax(logits: &[f32]) -> Vec<f32> {
    let m = logits.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut s: Vec<f32> = logits.iter().map(|v| (v - m).exp()).collect();
    let sum: f32 = s.iter().sum();
    s.iter_mut().for_each(|v| *v /= sum);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::rows;
    use crate::config::ModelConfig;
    use crate::kv_store::VecKvStore;

    /// A model whose ranking head is scaled up until most candidates'
    /// probabilities underflow: their logits still tell them apart, and the
    /// scores are the logits' softmax, as [`GrModel::rank_user_prefix`]
    /// returns them.
    #[test]
    fn logits_tell_apart_candidates_whose_probabilities_underflow() {
        let cfg = ModelConfig::preset("small").unwrap();
        let mut model = GrModel::new(cfg.clone(), 4);
        model.w_rank.iter_mut().for_each(|w| *w *= 2000.0);
        let d = cfg.d_model;
        let mut store = VecKvStore::new(4, cfg.kv_block_floats());
        let table: Vec<u32> = (0..4).collect();
        model
            .prefill(&mut store, &table, 0, &rows(20, d, 1))
            .unwrap();
        let cands = rows(40, d, 2);
        let job = RankJob {
            block_table: &table,
            prefix_len: 20,
            candidate_tokens: &cands,
        };
        let logits = model
            .rank_user_prefix_logits_batch(&store, &[job])
            .unwrap()
            .pop()
            .unwrap();
        let scores = model.rank_user_prefix(&store, &table, 20, &cands).unwrap();
        assert_eq!(scores, rank_softmax(&logits));
        let underflowed: Vec<f32> = logits
            .iter()
            .zip(&scores)
            .filter(|&(_, &p)| p == 0.0)
            .map(|(&l, _)| l)
            .collect();
        assert!(underflowed.len() >= 5, "{logits:?}");
        let mut distinct = underflowed.clone();
        distinct.sort_by(f32::total_cmp);
        distinct.dedup();
        assert_eq!(distinct.len(), underflowed.len(), "{underflowed:?}");
        assert!(underflowed.iter().all(|l| l.is_finite()));
    }

    #[test]
    fn rank_softmax_sums_to_one_and_keeps_the_order() {
        let p = rank_softmax(&[1.0, 3.0, 2.0, -200.0]);
        assert!((p.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(p[1] > p[2] && p[2] > p[0] && p[3] == 0.0);
    }
}
