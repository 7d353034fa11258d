//! Naive full recomputation: the ground truth the fast paths are tested
//! against. No paging, no GEMM, no tiling; masks are explicit predicates and
//! every sequence is recomputed from its first token.

use crate::model::GrModel;
use crate::ops::{NORM_EPS, gelu};

/// Every layer's K and V (`n × d` each) and the final residual stream.
#[derive(Clone, Debug)]
pub struct RefOut {
    pub k: Vec<Vec<f32>>,
    pub v: Vec<Vec<f32>>,
    pub hidden: Vec<f32>,
}

fn norm(x: &[f32], g: &[f32]) -> Vec<f32> {
    let ms = x.iter().map(|v| v * v).sum::<f32>() / x.len() as f32;
    let inv = 1.0 / (ms + NORM_EPS).sqrt();
    x.iter().zip(g).map(|(v, w)| v * inv * w).collect()
}

/// `x (1 × rows) · w (rows × cols)`.
fn vecmat(x: &[f32], w: &[f32], cols: usize) -> Vec<f32> {
    let mut out = vec![0f32; cols];
    for (i, xi) in x.iter().enumerate() {
        for (o, wv) in out.iter_mut().zip(&w[i * cols..(i + 1) * cols]) {
            *o += xi * wv;
        }
    }
    out
}

/// Runs the model over `tokens` (`n × d` summed embeddings) at `positions`,
/// where token i attends to token j iff `visible(i, j)`.
pub fn forward(
    model: &GrModel,
    tokens: &[f32],
    positions: &[usize],
    visible: &dyn Fn(usize, usize) -> bool,
) -> RefOut {
    let cfg = &model.cfg;
    let (d, dh) = (cfg.d_model, cfg.head_dim());
    let n = positions.len();
    let mut x: Vec<Vec<f32>> = (0..n)
        .map(|i| {
            tokens[i * d..(i + 1) * d]
                .iter()
                .zip(model.pos_row(positions[i]))
                .map(|(a, b)| a + b)
                .collect()
        })
        .collect();
    let (mut ks, mut vs) = (Vec::new(), Vec::new());
    for w in &model.layers {
        let qkv: Vec<Vec<f32>> = x
            .iter()
            .map(|xi| vecmat(&norm(xi, &w.ln1), &w.wqkv, 3 * d))
            .collect();
        let mut attn = vec![vec![0f32; d]; n];
        for (i, a) in attn.iter_mut().enumerate() {
            for h in 0..cfg.n_heads {
                let q = &qkv[i][h * dh..(h + 1) * dh];
                let js: Vec<usize> = (0..n).filter(|&j| visible(i, j)).collect();
                let s: Vec<f32> = js
                    .iter()
                    .map(|&j| {
                        q.iter()
                            .zip(&qkv[j][d + h * dh..d + (h + 1) * dh])
                            .map(|(a, b)| a * b)
                            .sum::<f32>()
                            / (dh as f32).sqrt()
                    })
                    .collect();
                let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
                let e: Vec<f32> = s.iter().map(|v| (v - m).exp()).collect();
                let z: f32 = e.iter().sum();
                for (&j, p) in js.iter().zip(&e) {
                    for t in 0..dh {
                        a[h * dh + t] += p / z * qkv[j][2 * d + h * dh + t];
                    }
                }
            }
        }
        ks.push(qkv.iter().flat_map(|r| r[d..2 * d].to_vec()).collect());
        vs.push(qkv.iter().flat_map(|r| r[2 * d..].to_vec()).collect());
        for (xi, a) in x.iter_mut().zip(&attn) {
            for (o, v) in xi.iter_mut().zip(vecmat(a, &w.wo, d)) {
                *o += v;
            }
            let mut f = vecmat(&norm(xi, &w.ln2), &w.w1, cfg.d_ff);
            gelu(&mut f);
            for (o, v) in xi.iter_mut().zip(vecmat(&f, &w.w2, d)) {
                *o += v;
            }
        }
    }
    RefOut {
        k: ks,
        v: vs,
        hidden: x.concat(),
    }
}

/// A plain causal sequence at positions `0..n` (the user history).
pub fn causal(model: &GrModel, tokens: &[f32]) -> RefOut {
    let n = tokens.len() / model.cfg.d_model;
    let positions: Vec<usize> = (0..n).collect();
    forward(model, tokens, &positions, &|i, j| j <= i)
}

fn rank_scores(
    model: &GrModel,
    out: &RefOut,
    instr: usize,
    item_last_tokens: &[usize],
) -> Vec<f32> {
    let d = model.cfg.d_model;
    let u = vecmat(
        &norm(&out.hidden[instr * d..(instr + 1) * d], &model.ln_f),
        &model.w_rank,
        d,
    );
    let k = out.k.last().expect("at least one layer");
    let s: Vec<f32> = item_last_tokens
        .iter()
        .map(|&t| {
            k[t * d..(t + 1) * d]
                .iter()
                .zip(&u)
                .map(|(a, b)| a * b)
                .sum::<f32>()
                / (d as f32).sqrt()
        })
        .collect();
    let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let z: f32 = s.iter().map(|v| (v - m).exp()).sum();
    s.iter().map(|v| (v - m).exp() / z).collect()
}

/// User-as-prefix `[U, I1..IN, Instr]` recomputed from scratch: items share
/// position |U| and see U and themselves; Instr sees U and itself, never
/// the items.
pub fn rank_user_prefix(
    model: &GrModel,
    history: &[f32],
    candidates: &[f32],
) -> (Vec<f32>, RefOut) {
    let d = model.cfg.d_model;
    let (u, n) = (history.len() / d, candidates.len() / d);
    let tokens = [history, candidates, &model.instr].concat();
    let positions: Vec<usize> = (0..u)
        .chain(std::iter::repeat_n(u, n))
        .chain([u + 1])
        .collect();
    let is_item = |t: usize| t >= u && t < u + n;
    let out = forward(model, &tokens, &positions, &|i, j| {
        j <= i && (!is_item(j) || i == j)
    });
    let items: Vec<usize> = (u..u + n).collect();
    (rank_scores(model, &out, u + n, &items), out)
}

/// Item-as-prefix `[I1..IN, U, Instr]` recomputed from scratch: every item
/// starts at position 0 and sees only itself (causally); user tokens start
/// at the longest item's length and see all items; Instr sees all.
pub fn rank_item_prefix(model: &GrModel, items: &[&[f32]], user: &[f32]) -> (Vec<f32>, RefOut) {
    let d = model.cfg.d_model;
    let mut tokens = Vec::new();
    let mut positions = Vec::new();
    let mut owner = Vec::new();
    let mut last = Vec::new();
    for (i, it) in items.iter().enumerate() {
        let len = it.len() / d;
        tokens.extend_from_slice(it);
        positions.extend(0..len);
        owner.extend(std::iter::repeat_n(Some(i), len));
        last.push(owner.len() - 1);
    }
    let start = items.iter().map(|it| it.len() / d).max().unwrap_or(0);
    let n_user = user.len() / d;
    tokens.extend_from_slice(user);
    tokens.extend_from_slice(&model.instr);
    positions.extend(start..start + n_user + 1);
    owner.extend(std::iter::repeat_n(None, n_user + 1));
    let out = forward(model, &tokens, &positions, &|i, j| {
        j <= i
            && match (owner[i], owner[j]) {
                (Some(a), Some(b)) => a == b,
                _ => true,
            }
    });
    let instr = owner.len() - 1;
    (rank_scores(model, &out, instr, &last), out)
}

/// Log-probability of generating `sid` after `prompt` (`P × d`): the causal
/// sequence `[prompt, gen, emb0(c0), emb1(c1)]` at positions `0..P+3`, each
/// step's codebook head log-softmaxed over the codes `trie` allows there.
pub fn sid_log_prob(model: &GrModel, prompt: &[f32], sid: [u16; 3], trie: &crate::SidTrie) -> f32 {
    let cfg = &model.cfg;
    let (d, c) = (cfg.d_model, cfg.codebook_size);
    let p = prompt.len() / d;
    let e0 = &model.sid_emb[sid[0] as usize * d..(sid[0] as usize + 1) * d];
    let e1 = &model.sid_emb[(c + sid[1] as usize) * d..(c + sid[1] as usize + 1) * d];
    let tokens = [prompt, &model.gen_token, e0, e1].concat();
    let out = causal(model, &tokens);
    let (l1, first) = trie.children_of_first(sid[0]);
    let j = l1.iter().position(|&x| x == sid[1]).expect("sid in trie");
    let valid: [Vec<u16>; 3] = [
        // Counted in usize: `c as u16` is 0 for a codebook of 65536.
        (0..c)
            .filter(|&x| trie.first_mask()[x] == 0.0)
            .map(|x| x as u16)
            .collect(),
        l1.to_vec(),
        trie.children_of_node(first + j as u32).to_vec(),
    ];
    let mut total = 0.0;
    for step in 0..3 {
        let h = norm(&out.hidden[(p + step) * d..(p + step + 1) * d], &model.ln_f);
        let logits = vecmat(&h, &model.sid_head[step * d * c..(step + 1) * d * c], c);
        let m = valid[step]
            .iter()
            .map(|&k| logits[k as usize])
            .fold(f32::NEG_INFINITY, f32::max);
        let lse = m + valid[step]
            .iter()
            .map(|&k| (logits[k as usize] - m).exp())
            .sum::<f32>()
            .ln();
        total += logits[sid[step] as usize] - lse;
    }
    total
}
