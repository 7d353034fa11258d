//! What the GEMMs run on this thread executed: calls, FLOPs and wall time.
//! A serving node reads the difference around its model work to report the
//! GEMM rate it gets in place (weights streamed from memory, odd shapes),
//! beside the peak `bench kernels` measures on ideal shapes. Per thread, so
//! that two nodes on two workers never share a counter; a lane thread's
//! work is handed to the thread that started it with [`absorb`].

use std::cell::Cell;

/// Cumulative GEMM work of one thread (or a difference of two readings).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GemmTally {
    pub calls: u64,
    /// 2·m·n·k per product, summed.
    pub flop: f64,
    pub nanos: u64,
}

impl GemmTally {
    /// The work done between `earlier` and `self` (two readings of one
    /// thread's tally).
    pub fn since(self, earlier: GemmTally) -> GemmTally {
        GemmTally {
            calls: self.calls.saturating_sub(earlier.calls),
            flop: (self.flop - earlier.flop).max(0.0),
            nanos: self.nanos.saturating_sub(earlier.nanos),
        }
    }

    pub fn add(&mut self, other: GemmTally) {
        self.calls += other.calls;
        self.flop += other.flop;
        self.nanos += other.nanos;
    }

    /// GFLOP/s over the time spent inside the products; 0 without any.
    pub fn gflops(&self) -> f64 {
        if self.nanos == 0 {
            0.0
        } else {
            self.flop / self.nanos as f64
        }
    }
}

thread_local! {
    static TALLY: Cell<GemmTally> = const {
        Cell::new(GemmTally { calls: 0, flop: 0.0, nanos: 0 })
    };
}

/// This thread's tally so far.
pub fn gemm_tally() -> GemmTally {
    TALLY.with(Cell::get)
}

/// Adds work done on another thread on this thread's behalf (a lane).
pub fn absorb(other: GemmTally) {
    TALLY.with(|t| {
        let mut v = t.get();
        v.add(other);
        t.set(v);
    });
}

pub(crate) fn record(m: usize, n: usize, k: usize, nanos: u64) {
    absorb(GemmTally {
        calls: 1,
        flop: 2.0 * m as f64 * n as f64 * k as f64,
        nanos,
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{Backend, CpuBackend, MatMut, MatRef};

    /// One 7×3 · 3×5 product of ones on this thread: every entry is 3.
    fn product() -> Vec<f32> {
        let (m, n, k) = (7, 5, 3);
        let (a, b) = (vec![1.0f32; m * k], vec![1.0f32; k * n]);
        let mut c = vec![0.0f32; m * n];
        CpuBackend::default().matmul(
            MatMut::new(&mut c, m, n, n, 1),
            MatRef::new(&a, m, k, k, 1),
            MatRef::new(&b, k, n, n, 1),
            1.0,
            false,
        );
        c
    }

    #[test]
    fn a_product_is_counted_on_its_own_thread_only() {
        let before = gemm_tally();
        assert!(product().iter().all(|&v| v == 3.0));
        let done = gemm_tally().since(before);
        assert_eq!(done.calls, 1);
        assert_eq!(done.flop, 2.0 * (7 * 5 * 3) as f64);
        // Another thread's products are its own until absorbed.
        let other = std::thread::spawn(|| {
            product();
            gemm_tally()
        })
        .join()
        .unwrap();
        assert_eq!(gemm_tally().since(before).calls, 1);
        absorb(other);
        assert_eq!(gemm_tally().since(before).calls, 2);
    }

    #[test]
    fn a_difference_never_goes_negative_and_an_empty_tally_has_no_rate() {
        let a = GemmTally {
            calls: 3,
            flop: 6e9,
            nanos: 2_000_000_000,
        };
        assert_eq!(a.gflops(), 3.0);
        assert_eq!(GemmTally::default().since(a), GemmTally::default());
        assert_eq!(GemmTally::default().gflops(), 0.0);
    }
}
