//! The compute seam: every matmul of the model goes through a [`Backend`].
//! The CPU backend wraps the `gemm` crate; a CUDA backend (later issue)
//! implements the same trait.

use std::fmt::Debug;

/// A read-only strided matrix view: element (i, j) is `data[i*rs + j*cs]`.
#[derive(Clone, Copy, Debug)]
pub struct MatRef<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

/// A mutable strided matrix view.
#[derive(Debug)]
pub struct MatMut<'a> {
    data: &'a mut [f32],
    rows: usize,
    cols: usize,
    rs: usize,
    cs: usize,
}

fn span(rows: usize, cols: usize, rs: usize, cs: usize) -> usize {
    if rows == 0 || cols == 0 {
        0
    } else {
        (rows - 1) * rs + (cols - 1) * cs + 1
    }
}

impl<'a> MatRef<'a> {
    /// Panics if the view reaches past `data` (a programming error).
    pub fn new(data: &'a [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        assert!(
            span(rows, cols, rs, cs) <= data.len(),
            "MatRef {rows}x{cols} (rs {rs}, cs {cs}) exceeds {} floats",
            data.len()
        );
        Self {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }
    /// A dense row-major `rows × cols` matrix.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, cols, 1)
    }
    /// The transpose (no copy).
    pub fn t(self) -> Self {
        Self {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Element (i, j); panics out of range.
    pub fn get(&self, i: usize, j: usize) -> f32 {
        assert!(i < self.rows && j < self.cols);
        self.data[i * self.rs + j * self.cs]
    }
}

impl<'a> MatMut<'a> {
    /// Panics if the view reaches past `data` (a programming error).
    pub fn new(data: &'a mut [f32], rows: usize, cols: usize, rs: usize, cs: usize) -> Self {
        assert!(
            span(rows, cols, rs, cs) <= data.len(),
            "MatMut {rows}x{cols} (rs {rs}, cs {cs}) exceeds {} floats",
            data.len()
        );
        Self {
            data,
            rows,
            cols,
            rs,
            cs,
        }
    }
    /// A dense row-major `rows × cols` matrix.
    pub fn row_major(data: &'a mut [f32], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, cols, 1)
    }
    pub fn rows(&self) -> usize {
        self.rows
    }
    pub fn cols(&self) -> usize {
        self.cols
    }
    /// Element (i, j); panics out of range.
    pub fn get(&self, i: usize, j: usize) -> f32 {
        assert!(i < self.rows && j < self.cols);
        self.data[i * self.rs + j * self.cs]
    }
    /// Sets element (i, j); panics out of range.
    pub fn set(&mut self, i: usize, j: usize, v: f32) {
        assert!(i < self.rows && j < self.cols);
        self.data[i * self.rs + j * self.cs] = v;
    }
}

/// Dense linear algebra the model is built on.
pub trait Backend: Debug + Send + Sync {
    /// Short name for reports ("cpu").
    fn name(&self) -> &'static str;
    /// Threads one matmul may use.
    fn threads(&self) -> usize;
    /// `dst = (accumulate ? dst : 0) + scale · lhs · rhs`.
    /// Panics on mismatched shapes (a programming error, not caller input).
    fn matmul(
        &self,
        dst: MatMut<'_>,
        lhs: MatRef<'_>,
        rhs: MatRef<'_>,
        scale: f32,
        accumulate: bool,
    );
}

/// The CPU backend: `gemm` crate matmuls, single-threaded by default because
/// each timely worker thread is one serving node.
#[derive(Clone, Debug)]
pub struct CpuBackend {
    threads: usize,
}

impl Default for CpuBackend {
    fn default() -> Self {
        Self { threads: 1 }
    }
}

impl CpuBackend {
    /// A backend whose matmuls use up to `threads` threads (rayon).
    pub fn new(threads: usize) -> Self {
        Self {
            threads: threads.max(1),
        }
    }
}

impl Backend for CpuBackend {
    fn name(&self) -> &'static str {
        "cpu"
    }

    fn threads(&self) -> usize {
        self.threads
    }

    fn matmul(
        &self,
        dst: MatMut<'_>,
        lhs: MatRef<'_>,
        rhs: MatRef<'_>,
        scale: f32,
        accumulate: bool,
    ) {
        let (m, n, k) = (dst.rows, dst.cols, lhs.cols);
        assert!(
            lhs.rows == m && rhs.rows == k && rhs.cols == n,
            "matmul shapes {m}x{n} = {}x{} · {}x{}",
            lhs.rows,
            lhs.cols,
            rhs.rows,
            rhs.cols
        );
        if m == 0 || n == 0 {
            return;
        }
        if k == 0 {
            if !accumulate {
                for i in 0..m {
                    for j in 0..n {
                        dst.data[i * dst.rs + j * dst.cs] = 0.0;
                    }
                }
            }
            return;
        }
        let parallelism = if self.threads > 1 {
            gemm::Parallelism::Rayon(self.threads)
        } else {
            gemm::Parallelism::None
        };
        // SAFETY: the views were bounds-checked at construction (every
        // (i, j) lies inside its slice), the shapes were checked above, and
        // `dst` is a unique borrow so it cannot alias `lhs` or `rhs`.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                dst.data.as_mut_ptr(),
                dst.cs as isize,
                dst.rs as isize,
                accumulate,
                lhs.data.as_ptr(),
                lhs.cs as isize,
                lhs.rs as isize,
                rhs.data.as_ptr(),
                rhs.cs as isize,
                rhs.rs as isize,
                1.0,
                scale,
                false,
                false,
                false,
                parallelism,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strided_matmul_matches_loops() {
        let (m, n, k) = (5, 7, 3);
        let a: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.37).sin()).collect();
        let b: Vec<f32> = (0..n * k).map(|i| (i as f32 * 0.11).cos()).collect(); // stored n×k, used transposed
        let mut c = vec![1.0f32; m * n];
        CpuBackend::default().matmul(
            MatMut::row_major(&mut c, m, n),
            MatRef::row_major(&a, m, k),
            MatRef::row_major(&b, n, k).t(),
            0.5,
            true,
        );
        for i in 0..m {
            for j in 0..n {
                let want: f32 =
                    1.0 + 0.5 * (0..k).map(|p| a[i * k + p] * b[j * k + p]).sum::<f32>();
                assert!((c[i * n + j] - want).abs() < 1e-5);
            }
        }
    }
}
