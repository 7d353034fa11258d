//! Execution lanes (xGR's multi-stream): several batches of one node
//! computed at once, one thread each, with no lock around the model call.
//! Each lane reads the node's KV pool through a shared reference and
//! writes into a private overlay of the pages it touches; the overlays are
//! written back once every lane is done. Lanes write disjoint pages (each
//! request prefills into the fresh blocks reserved for it; cached blocks
//! are full and only read), so the result equals running the batches one
//! after another.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use grflow_kernels::KvBlockStore;

use crate::pool::PagePool;

/// A lane's view of the pool: reads fall through to the pool unless the
/// lane wrote the page; the first write copies the page.
#[derive(Debug)]
pub struct LaneStore<'p> {
    base: &'p PagePool,
    written: HashMap<u32, Vec<f32>>,
}

impl<'p> LaneStore<'p> {
    pub fn new(base: &'p PagePool) -> Self {
        Self {
            base,
            written: HashMap::new(),
        }
    }
}

impl KvBlockStore for LaneStore<'_> {
    fn block_floats(&self) -> usize {
        self.base.block_floats()
    }
    fn block(&self, id: u32) -> &[f32] {
        match self.written.get(&id) {
            Some(page) => page,
            None => self.base.block(id),
        }
    }
    fn block_mut(&mut self, id: u32) -> &mut [f32] {
        let base = self.base;
        self.written
            .entry(id)
            .or_insert_with(|| base.block(id).to_vec())
    }
}

/// What one thread did: (job index, result) pairs and the pages it wrote.
type LaneDone<T> = (Vec<(usize, T)>, HashMap<u32, Vec<f32>>);

/// Runs `work(job, store)` for every job on up to `lanes` threads (this
/// one and `lanes - 1` more): each thread takes the next job not yet taken,
/// so a short job (a retrieve request) and long ones (rank batches) share
/// the threads evenly. Then writes the pages they wrote back into `pool`.
/// Results come back in job order; a panicking job panics here after the
/// others finished.
pub fn run_lanes<J, T, F>(pool: &mut PagePool, jobs: Vec<J>, lanes: usize, work: F) -> Vec<T>
where
    J: Send,
    T: Send,
    F: Fn(J, &mut LaneStore<'_>) -> T + Sync,
{
    let n = jobs.len();
    let threads = lanes.clamp(1, n.max(1));
    let jobs: Vec<Mutex<Option<J>>> = jobs.into_iter().map(|j| Mutex::new(Some(j))).collect();
    let next = AtomicUsize::new(0);
    let base: &PagePool = pool;
    let lane = || {
        let tally = grflow_kernels::gemm_tally();
        let mut store = LaneStore::new(base);
        let mut done = Vec::new();
        loop {
            let i = next.fetch_add(1, Ordering::Relaxed);
            let Some(slot) = jobs.get(i) else { break };
            let job = slot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take()
                .expect("each job is taken once");
            done.push((i, work(job, &mut store)));
        }
        (
            done,
            store.written,
            grflow_kernels::gemm_tally().since(tally),
        )
    };
    let lanes_done: Vec<LaneDone<T>> = std::thread::scope(|s| {
        let others: Vec<_> = (1..threads).map(|_| s.spawn(lane)).collect();
        let (done, written, _) = lane();
        let mut all = vec![(done, written)];
        for other in others {
            match other.join() {
                Ok((done, written, gemm)) => {
                    // The caller's tally covers its own lane; the others'
                    // work was done on its behalf.
                    grflow_kernels::absorb_gemm(gemm);
                    all.push((done, written));
                }
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        all
    });
    let mut results: Vec<Option<T>> = (0..n).map(|_| None).collect();
    let mut seen = std::collections::HashSet::new();
    for (done, written) in lanes_done {
        for (id, page) in written {
            debug_assert!(seen.insert(id), "two lanes wrote page {id}");
            pool.block_mut(id).copy_from_slice(&page);
        }
        for (i, out) in done {
            results[i] = Some(out);
        }
    }
    results
        .into_iter()
        .map(|r| r.expect("every job ran"))
        .collect()
}

/// Cuts items of the given token counts, in order, into at most `lanes`
/// contiguous groups of about equal tokens (group sizes, none empty). A
/// cut by count put 1,800 of 2,000 tokens in one lane when two long
/// requests came first.
pub fn balanced_sizes(tokens: &[usize], lanes: usize) -> Vec<usize> {
    let lanes = lanes.clamp(1, tokens.len().max(1));
    let total: usize = tokens.iter().sum();
    let mut sizes = Vec::with_capacity(lanes);
    let (mut size, mut sum) = (0usize, 0usize);
    for (i, &t) in tokens.iter().enumerate() {
        let left = tokens.len() - i;
        let lanes_left = lanes - sizes.len();
        // Cut before this item when the group has reached its share of the
        // tokens, or when every lane still to fill needs an item.
        let share = total * (sizes.len() + 1) / lanes;
        if size > 0 && lanes_left > 1 && (sum + t / 2 > share || left < lanes_left) {
            sizes.push(size);
            size = 0;
        }
        size += 1;
        sum += t;
    }
    if size > 0 {
        sizes.push(size);
    }
    sizes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lanes_get_about_equal_tokens_in_order() {
        assert_eq!(balanced_sizes(&[900, 900, 100, 100], 2), vec![1, 3]);
        assert_eq!(balanced_sizes(&[1500, 300, 200], 2), vec![1, 2]);
        assert_eq!(balanced_sizes(&[100; 6], 2), vec![3, 3]);
        assert_eq!(balanced_sizes(&[100; 6], 4), vec![2, 1, 2, 1]);
        // Fewer items than lanes: one each.
        assert_eq!(balanced_sizes(&[5, 7], 4), vec![1, 1]);
        assert_eq!(balanced_sizes(&[5], 1), vec![1]);
        assert_eq!(balanced_sizes(&[], 3), Vec::<usize>::new());
        // Every item in exactly one group, whatever the mix.
        for lanes in 1..6 {
            let tokens: Vec<usize> = (0..17).map(|i| (i * 37) % 300 + 1).collect();
            let sizes = balanced_sizes(&tokens, lanes);
            assert_eq!(sizes.iter().sum::<usize>(), tokens.len());
            assert!(sizes.len() <= lanes && sizes.iter().all(|&n| n > 0));
        }
    }

    #[test]
    fn lanes_write_their_own_pages_back_and_read_the_shared_ones() {
        let mut pool = PagePool::new(6, 4);
        pool.block_mut(0).copy_from_slice(&[1.0, 2.0, 3.0, 4.0]);
        // Each job reads page 0 and writes its sum into its own page.
        let jobs: Vec<u32> = vec![1, 2, 3];
        let sums = run_lanes(&mut pool, jobs, 2, |page, store| {
            let sum: f32 = store.block(0).iter().sum();
            let out = store.block_mut(page);
            out[0] = sum + page as f32;
            // A lane reads its own write back.
            store.block(page)[0]
        });
        assert_eq!(sums, vec![11.0, 12.0, 13.0]);
        for page in 1..=3 {
            assert_eq!(pool.block(page)[0], 10.0 + page as f32);
            assert_eq!(
                &pool.block(page)[1..],
                &[0.0; 3],
                "the rest of the page is kept"
            );
        }
        assert_eq!(pool.block(0), &[1.0, 2.0, 3.0, 4.0]);
        assert!(run_lanes(&mut pool, Vec::<u32>::new(), 2, |_, _| 0).is_empty());
    }

    #[test]
    fn jobs_share_the_lanes_threads() {
        let mut pool = PagePool::new(2, 1);
        // Two lanes, two jobs: they run at once on two threads. Each waits
        // (up to 10 s) until both have started: a wall-time bound would be
        // flaky on a loaded machine; run one after the other, the first
        // would time out and the test fail.
        let arrived = std::sync::atomic::AtomicUsize::new(0);
        let meet = |_, _: &mut LaneStore<'_>| {
            use std::sync::atomic::Ordering;
            arrived.fetch_add(1, Ordering::SeqCst);
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
            while arrived.load(Ordering::SeqCst) < 2 && std::time::Instant::now() < deadline {
                std::thread::sleep(std::time::Duration::from_millis(1));
            }
            (
                std::thread::current().id(),
                arrived.load(Ordering::SeqCst) == 2,
            )
        };
        let threads = run_lanes(&mut pool, vec![0, 1], 2, meet);
        assert_ne!(threads[0].0, threads[1].0);
        assert!(threads.iter().all(|t| t.1), "the two jobs did not overlap");
        // Five jobs on two lanes: two threads, every job once, in order.
        let ids = run_lanes(&mut pool, (0..5).collect(), 2, |j: u32, _| {
            (j, std::thread::current().id())
        });
        assert_eq!(
            ids.iter().map(|x| x.0).collect::<Vec<_>>(),
            vec![0, 1, 2, 3, 4]
        );
        let distinct: std::collections::HashSet<_> = ids.iter().map(|x| x.1).collect();
        assert!(distinct.len() <= 2);
        // One lane: all on this thread.
        let here = run_lanes(&mut pool, vec![0, 1, 2], 1, |_, _| {
            std::thread::current().id()
        });
        assert!(here.iter().all(|&t| t == std::thread::current().id()));
    }
}
