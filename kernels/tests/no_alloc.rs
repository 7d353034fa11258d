//! Mechanism 6 (xGR §6.3) and the "never materialises" half of mechanism 3,
//! measured with a counting global allocator. The model runs on a test
//! backend whose matmul is plain loops: the `gemm` crate allocates its own
//! packing buffers per call, so this isolates what the kernels allocate.

mod common;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use common::*;
use grflow_kernels::{
    Backend, BeamSearch, GrModel, MatMut, MatRef, ModelConfig, SharedPrompt, SidTrie,
    StagedScratch, UnsharedKv, concat_attention, per_beam_attention, staged_attention,
};
use rand_chacha::rand_core::Rng;

struct Counting;

static ALLOCS: AtomicUsize = AtomicUsize::new(0);
static BYTES: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards to the system allocator, only counting.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        BYTES.fetch_add(layout.size(), Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as the caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::SeqCst);
        BYTES.fetch_add(new_size, Ordering::SeqCst);
        // SAFETY: same contract as the caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// Matmul by loops: allocation-free, for measuring the kernels alone.
#[derive(Debug)]
struct LoopBackend;

impl Backend for LoopBackend {
    fn name(&self) -> &'static str {
        "loops"
    }
    fn threads(&self) -> usize {
        1
    }
    fn matmul(
        &self,
        dst: MatMut<'_>,
        lhs: MatRef<'_>,
        rhs: MatRef<'_>,
        scale: f32,
        accumulate: bool,
    ) {
        let (m, n, k) = (lhs.rows(), rhs.cols(), lhs.cols());
        let mut dst = dst;
        for i in 0..m {
            for j in 0..n {
                let s: f32 = (0..k).map(|p| lhs.get(i, p) * rhs.get(p, j)).sum();
                let prev = if accumulate { dst.get(i, j) } else { 0.0 };
                dst.set(i, j, prev + scale * s);
            }
        }
    }
}

fn counted<R>(f: impl FnOnce() -> R) -> (R, usize, usize) {
    let (a0, b0) = (ALLOCS.load(Ordering::SeqCst), BYTES.load(Ordering::SeqCst));
    let r = f();
    (
        r,
        ALLOCS.load(Ordering::SeqCst) - a0,
        BYTES.load(Ordering::SeqCst) - b0,
    )
}

// One test function: the counters are process-wide and tests run in threads.
#[test]
fn decode_loop_and_staged_attention_do_not_allocate() {
    let cfg = ModelConfig {
        codebook_size: 32,
        ..ModelConfig::preset("small").unwrap()
    };
    let model = GrModel::new(cfg.clone(), 5).with_backend(Arc::new(LoopBackend));
    let d = cfg.d_model;
    let mut r = rng(5);
    let cat: Vec<[u16; 3]> = (0..400)
        .map(|_| {
            [
                (r.next_u32() % 32) as u16,
                (r.next_u32() % 32) as u16,
                (r.next_u32() % 32) as u16,
            ]
        })
        .collect();
    let trie = SidTrie::new(&cat, 32).unwrap();
    let p = 29;
    let prompt = tokens(&mut r, p, d);
    let mut pool = Pool::new(&cfg, 8, &mut r);
    let table = pool.alloc(cfg.blocks_for(p));
    model.prefill(&mut pool.store, &table, 0, &prompt).unwrap();

    let mut search = BeamSearch::new(&cfg, 16, 8, 64).unwrap();
    let first = search
        .generate(&model, &pool.store, &table, p, &trie)
        .unwrap()
        .to_vec();
    let (second, allocs, _) = counted(|| {
        search
            .generate(&model, &pool.store, &table, p, &trie)
            .map(|h| h.to_vec())
    });
    // `to_vec` of the result is the only allocation allowed.
    assert_eq!(allocs, 1, "the decode loop allocated");
    assert_eq!(second.unwrap(), first);

    // Staged attention reads the shared prompt in place; the baseline
    // materialises [prompt | beam] per beam.
    let (nb, cur) = (16, 2);
    let un = UnsharedKv::new(&cfg, nb, 3);
    let q = tokens(&mut r, nb, d);
    let shared = SharedPrompt {
        store: &pool.store,
        blocks: &table,
        len: p,
    };
    let mut scratch = StagedScratch::new(&cfg, nb, p);
    let mut out = vec![0f32; nb * d];
    let (_, allocs, bytes) = counted(|| {
        staged_attention(
            model.backend(),
            &cfg,
            0,
            &q,
            d,
            nb,
            shared,
            &un,
            cur,
            &mut scratch,
            &mut out,
        )
    });
    assert_eq!((allocs, bytes), (0, 0));
    // The honest baseline reads [prompt | beam] in place: no copy either.
    let mut beam_scores = vec![0f32; p + cur];
    let (_, allocs, bytes) = counted(|| {
        per_beam_attention(
            model.backend(),
            &cfg,
            0,
            &q,
            d,
            nb,
            shared,
            &un,
            cur,
            &mut beam_scores,
            &mut out,
        )
    });
    assert_eq!((allocs, bytes), (0, 0));
    let (reported, _, bytes) =
        counted(|| concat_attention(&cfg, 0, &q, d, nb, shared, &un, cur, &mut out));
    assert!(
        bytes >= 2 * (p + cur) * d * 4,
        "baseline allocated {bytes} bytes"
    );
    assert_eq!(reported, nb * 2 * (p + cur) * d * 4);
}
