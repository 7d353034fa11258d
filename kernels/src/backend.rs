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
    /// A dense column-major `rows × cols` matrix (a row-major `cols × rows`
    /// one, transposed).
    pub fn col_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        Self::new(data, rows, cols, 1, rows)
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
    /// `dst = (accumulate ? dst : 0) + scale · lhs · w` for a weight `w`,
    /// in whichever of its layouts this backend multiplies fastest.
    fn matmul_weight(
        &self,
        dst: MatMut<'_>,
        lhs: MatRef<'_>,
        w: Weight<'_>,
        scale: f32,
        accumulate: bool,
    ) {
        self.matmul(dst, lhs, w.row_major, scale, accumulate);
    }
}

/// A weight matrix (`in × out`) as the model holds it: row-major, and for
/// large weights also column-major.
#[derive(Clone, Copy, Debug)]
pub struct Weight<'a> {
    pub row_major: MatRef<'a>,
    pub col_major: Option<MatRef<'a>>,
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

/// Products of a weight with at most this many rows go through
/// [`CpuBackend::via_col_major`] where the weight has a column-major copy. `bench
/// kernels` on a 2-core Xeon (`hstu-3l`): a 32-beam decode 1.9x faster;
/// a 205-token suffix prefill 13% slower that way, so longer products keep
/// the row-major weight.
const VIA_COL_MAJOR_ROWS: usize = 64;

thread_local! {
    /// [`CpuBackend::via_col_major`]'s column-major product, reused between calls.
    static COL_MAJOR_OUT: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl CpuBackend {
    /// `dst = (accumulate ? dst : 0) + scale · lhs · rhs` for a row-major
    /// `dst` and a column-major `rhs`, computed column-major and copied into
    /// `dst`. Into a row-major destination the gemm crate transposes the
    /// problem and repacks all of `rhs` on every call, which for a few rows
    /// costs as much as the product itself; into a column-major one it reads
    /// `rhs` where it lies.
    fn via_col_major(
        &self,
        dst: MatMut<'_>,
        lhs: MatRef<'_>,
        rhs: MatRef<'_>,
        scale: f32,
        accumulate: bool,
    ) {
        let (m, n) = (dst.rows, dst.cols);
        COL_MAJOR_OUT.with(|out| {
            let mut out = out.borrow_mut();
            out.clear();
            out.resize(m * n, 0.0);
            self.matmul(MatMut::new(&mut out, m, n, 1, m), lhs, rhs, scale, false);
            for i in 0..m {
                let row = &mut dst.data[i * dst.rs..i * dst.rs + n];
                for (j, d) in row.iter_mut().enumerate() {
                    let v = out[j * m + i];
                    *d = if accumulate { *d + v } else { v };
                }
            }
        });
    }

    fn parallelism(&self) -> gemm::Parallelism {
        if self.threads > 1 {
            gemm::Parallelism::Rayon(self.threads)
        } else {
            gemm::Parallelism::None
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
        let parallelism = self.parallelism();
        let started = std::time::Instant::now();
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
        crate::tally::record(m, n, k, started.elapsed().as_nanos() as u64);
    }

    fn matmul_weight(
        &self,
        dst: MatMut<'_>,
        lhs: MatRef<'_>,
        w: Weight<'_>,
        scale: f32,
        accumulate: bool,
    ) {
        match w.col_major {
            Some(col_major) if lhs.rows <= VIA_COL_MAJOR_ROWS && dst.cs == 1 => {
                self.via_col_major(dst, lhs, col_major, scale, accumulate);
            }
            _ => self.matmul(dst, lhs, w.row_major, scale, accumulate),
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

    /// Both layouts of a weight give the same product, on each side of
    /// the row count where the CPU backend switches between them.
    #[test]
    fn a_weight_multiplies_alike_in_either_layout() {
        let (n, k) = (40, 24);
        let w: Vec<f32> = (0..k * n).map(|i| (i as f32 * 0.13).sin()).collect();
        let mut w_t = vec![0f32; k * n];
        for i in 0..k {
            for j in 0..n {
                w_t[j * k + i] = w[i * n + j];
            }
        }
        let weight = Weight {
            row_major: MatRef::row_major(&w, k, n),
            col_major: Some(MatRef::col_major(&w_t, k, n)),
        };
        let be = CpuBackend::default();
        for m in [1, 7, VIA_COL_MAJOR_ROWS, VIA_COL_MAJOR_ROWS + 1] {
            let x: Vec<f32> = (0..m * k).map(|i| (i as f32 * 0.29).cos()).collect();
            for accumulate in [false, true] {
                let start: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.01).collect();
                let (mut want, mut got) = (start.clone(), start);
                be.matmul(
                    MatMut::row_major(&mut want, m, n),
                    MatRef::row_major(&x, m, k),
                    weight.row_major,
                    0.5,
                    accumulate,
                );
                be.matmul_weight(
                    MatMut::row_major(&mut got, m, n),
                    MatRef::row_major(&x, m, k),
                    weight,
                    0.5,
                    accumulate,
                );
                for (a, b) in want.iter().zip(&got) {
                    assert!(
                        (a - b).abs() < 1e-5,
                        "{m} rows, accumulate {accumulate}: {a} vs {b}"
                    );
                }
            }
        }
    }
}
