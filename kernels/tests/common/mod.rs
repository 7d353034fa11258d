//! Shared fixtures of the integration tests.
#![allow(dead_code)]

use grflow_kernels::{GrModel, KvBlockStore, ModelConfig, VecKvStore, kv_row};
use rand_chacha::ChaCha8Rng;
use rand_chacha::rand_core::{Rng, SeedableRng};

pub fn small_model(seed: u64) -> GrModel {
    GrModel::new(ModelConfig::preset("small").unwrap(), seed)
}

/// A model wide enough (`d_model` 256) that it keeps column-major copies of
/// its weights, which the CPU backend multiplies a few rows by.
pub fn wide_model(seed: u64) -> GrModel {
    let cfg = ModelConfig {
        d_model: 256,
        n_layers: 2,
        n_heads: 4,
        d_ff: 512,
        codebook_size: 64,
        max_positions: 256,
        ..ModelConfig::preset("small").unwrap()
    };
    GrModel::new(cfg, seed)
}

/// `n` random token rows of width `d` (like summed embedding rows).
pub fn tokens(rng: &mut ChaCha8Rng, n: usize, d: usize) -> Vec<f32> {
    (0..n * d)
        .map(|_| (rng.next_u32() >> 8) as f32 / 8_388_608.0 - 1.0)
        .collect()
}

pub fn rng(seed: u64) -> ChaCha8Rng {
    ChaCha8Rng::seed_from_u64(seed)
}

/// A block pool whose free list is shuffled, so block tables are not
/// contiguous or ordered.
#[derive(Debug)]
pub struct Pool {
    pub store: VecKvStore,
    free: Vec<u32>,
}

impl Pool {
    pub fn new(cfg: &ModelConfig, blocks: usize, rng: &mut ChaCha8Rng) -> Self {
        let mut free: Vec<u32> = (0..blocks as u32).collect();
        for i in (1..free.len()).rev() {
            let j = (rng.next_u32() as usize) % (i + 1);
            free.swap(i, j);
        }
        Pool {
            store: VecKvStore::new(blocks, cfg.kv_block_floats()),
            free,
        }
    }
    pub fn alloc(&mut self, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| self.free.pop().expect("pool exhausted"))
            .collect()
    }
}

/// The larger of `a` and `b`, NaN if either is: `f32::max` drops a NaN,
/// which would let a kernel that outputs NaN pass every `<= TOL` check.
pub fn nan_max(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// Largest elementwise `|a - b|`; NaN when any difference is NaN (so
/// `max_diff(..) <= TOL` fails). Panics when the lengths differ.
pub fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, nan_max)
}

/// Largest difference between the paged KV of tokens `0..n` and reference
/// rows `k[layer]`/`v[layer]` starting at row `ref_start` (NaN if any is).
pub fn kv_diff<S: KvBlockStore>(
    cfg: &ModelConfig,
    store: &S,
    table: &[u32],
    n: usize,
    k: &[Vec<f32>],
    v: &[Vec<f32>],
    ref_start: usize,
) -> f32 {
    let d = cfg.d_model;
    let mut worst = 0f32;
    for l in 0..cfg.n_layers {
        for t in 0..n {
            let r = (ref_start + t) * d..(ref_start + t + 1) * d;
            let dk = max_diff(kv_row(cfg, store, table, t, l, 0), &k[l][r.clone()]);
            let dv = max_diff(kv_row(cfg, store, table, t, l, 1), &v[l][r]);
            worst = nan_max(nan_max(worst, dk), dv);
        }
    }
    worst
}
