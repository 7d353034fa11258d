//! Beam selection (xGR §6.2): the global top-BW of BW × K candidates with
//! early termination. Each beam's candidates arrive sorted; a min-heap of
//! size BW holds the best so far; a beam stops at its first candidate that
//! cannot enter the heap. Ties are broken by (score desc, beam, token), so
//! the selected set equals a full sort's exactly.

use std::cmp::Ordering;

/// One expansion of a beam by one token.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    /// Cumulative log-probability of the extended sequence.
    pub score: f32,
    pub beam: u32,
    pub token: u32,
    /// Caller payload (the trie node of the extended prefix).
    pub node: u32,
}

/// The selection order: higher score first, then lower beam, then lower token.
#[inline]
pub fn rank_order(a: &Candidate, b: &Candidate) -> Ordering {
    b.score
        .total_cmp(&a.score)
        .then(a.beam.cmp(&b.beam))
        .then(a.token.cmp(&b.token))
}

/// Sorts one beam's candidates into selection order (its visiting order).
pub fn sort_beam(cands: &mut [Candidate]) {
    cands.sort_unstable_by(rank_order);
}

/// Early-terminating top-BW selector with a preallocated heap.
#[derive(Clone, Debug)]
pub struct TopBw {
    /// Binary min-heap under selection order: the root is the worst kept.
    heap: Vec<Candidate>,
    visited: usize,
}

impl TopBw {
    pub fn with_capacity(bw: usize) -> Self {
        Self {
            heap: Vec::with_capacity(bw),
            visited: 0,
        }
    }

    /// Candidates examined by the last `select` (for the bench).
    pub fn visited(&self) -> usize {
        self.visited
    }

    /// Selects the best `bw` of `cands`, laid out as beams of `stride` slots
    /// with `lens[b]` valid candidates each, every beam sorted by
    /// [`sort_beam`]. Returns them in heap order (unsorted). Does not
    /// allocate once `bw` fits the capacity.
    pub fn select(
        &mut self,
        cands: &[Candidate],
        stride: usize,
        lens: &[usize],
        bw: usize,
    ) -> &[Candidate] {
        self.heap.clear();
        self.visited = 0;
        if bw == 0 {
            return &self.heap;
        }
        for (b, &len) in lens.iter().enumerate() {
            for c in &cands[b * stride..b * stride + len] {
                self.visited += 1;
                if self.heap.len() < bw {
                    self.push(*c);
                } else if rank_order(c, &self.heap[0]) == Ordering::Less {
                    self.heap[0] = *c;
                    self.sift_down(0);
                } else {
                    break; // the rest of this beam is worse still
                }
            }
        }
        &self.heap
    }

    /// The whole cost of early termination when each beam's top-K arrives
    /// unordered (as `select_nth_unstable` leaves it): sorts every beam's
    /// valid candidates in place (the visiting order [`TopBw::select`]
    /// relies on), selects, and returns the best `bw` in selection order.
    pub fn sort_and_select(
        &mut self,
        cands: &mut [Candidate],
        stride: usize,
        lens: &[usize],
        bw: usize,
    ) -> &[Candidate] {
        for (b, &len) in lens.iter().enumerate() {
            sort_beam(&mut cands[b * stride..b * stride + len]);
        }
        self.select(cands, stride, lens, bw);
        // `select` rebuilds the heap from scratch, so sorting it is safe.
        self.heap.sort_unstable_by(rank_order);
        &self.heap
    }

    /// `true` when `a` is worse than `b` (the heap's "less").
    #[inline]
    fn worse(a: &Candidate, b: &Candidate) -> bool {
        rank_order(a, b) == Ordering::Greater
    }

    fn push(&mut self, c: Candidate) {
        self.heap.push(c);
        let mut i = self.heap.len() - 1;
        while i > 0 {
            let p = (i - 1) / 2;
            if Self::worse(&self.heap[i], &self.heap[p]) {
                self.heap.swap(i, p);
                i = p;
            } else {
                break;
            }
        }
    }

    fn sift_down(&mut self, mut i: usize) {
        let n = self.heap.len();
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < n && Self::worse(&self.heap[l], &self.heap[m]) {
                m = l;
            }
            if r < n && Self::worse(&self.heap[r], &self.heap[m]) {
                m = r;
            }
            if m == i {
                return;
            }
            self.heap.swap(i, m);
            i = m;
        }
    }
}

/// The baseline of [`TopBw::sort_and_select`]: `select_nth_unstable` of
/// all candidates (contiguous, any order; reordered in place), then a sort
/// of the best `bw`. Returns them in selection order.
pub fn select_nth_then_sort(all: &mut [Candidate], bw: usize) -> &[Candidate] {
    let keep = bw.min(all.len());
    if keep == 0 {
        return &all[..0];
    }
    if keep < all.len() {
        all.select_nth_unstable_by(keep - 1, rank_order);
    }
    let top = &mut all[..keep];
    top.sort_unstable_by(rank_order);
    top
}

/// The round-1 baseline: copy every candidate into `buf` (preallocated), full
/// `sort_unstable_by`, keep the first `bw`.
pub fn select_full_sort<'a>(
    cands: &[Candidate],
    stride: usize,
    lens: &[usize],
    bw: usize,
    buf: &'a mut Vec<Candidate>,
) -> &'a [Candidate] {
    buf.clear();
    for (b, &len) in lens.iter().enumerate() {
        buf.extend_from_slice(&cands[b * stride..b * stride + len]);
    }
    buf.sort_unstable_by(rank_order);
    buf.truncate(bw);
    buf
}
