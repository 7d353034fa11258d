//! Beam selection (xGR §6.2): the global top-BW of BW × K candidates with
//! early termination. A min-heap of size BW holds the best so far; a beam
//! stops at its first candidate that cannot enter the heap. With lists in
//! any order ([`TopBw::select_unordered`], what the search serves with)
//! beams are visited best first and the first beam whose best candidate
//! cannot enter ends the selection; a visited beam yields its candidates
//! in order from a heap built in place. Ties are broken by (score desc,
//! beam, token), so the selected set equals a full sort's exactly.

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
    beams_visited: usize,
    /// [`TopBw::select_unordered`]: each beam's best candidate and its beam.
    order: Vec<(Candidate, u32)>,
}

impl TopBw {
    pub fn with_capacity(bw: usize) -> Self {
        Self {
            heap: Vec::with_capacity(bw),
            visited: 0,
            beams_visited: 0,
            order: Vec::with_capacity(bw),
        }
    }

    /// Candidates offered to the heap by the last selection (for the
    /// bench; [`TopBw::select_unordered`] also scans every candidate once
    /// for its beam's best, which this does not count).
    pub fn visited(&self) -> usize {
        self.visited
    }

    /// Beams the last selection offered candidates from.
    pub fn beams_visited(&self) -> usize {
        self.beams_visited
    }

    /// Selects the best `bw` of `cands` (beams of `stride` slots with
    /// `lens[b]` valid candidates each, in any order) and returns them in
    /// selection order. One pass finds every beam's best candidate; beams
    /// are then visited best first, and the first whose best cannot enter
    /// the heap ends the selection, since every later beam's candidates
    /// are worse still. A visited beam's list becomes a heap in place
    /// (its order afterwards is unspecified) and yields candidates in order
    /// until one cannot enter. Costs one scan plus O(len) per visited beam,
    /// against a sort of every list for [`TopBw::sort_and_select`]. Does not
    /// allocate once `bw` and the beam count fit the capacities.
    pub fn select_unordered(
        &mut self,
        cands: &mut [Candidate],
        stride: usize,
        lens: &[usize],
        bw: usize,
    ) -> &[Candidate] {
        self.start();
        if bw == 0 {
            return &self.heap;
        }
        self.order.clear();
        for (b, &len) in lens.iter().enumerate() {
            let beam = &cands[b * stride..b * stride + len];
            if beam.is_empty() {
                continue;
            }
            let best = best_of(beam);
            self.order.push((best, b as u32));
        }
        self.order.sort_unstable_by(|x, y| rank_order(&x.0, &y.0));
        for i in 0..self.order.len() {
            let (best, b) = self.order[i];
            if !self.admits(&best, bw) {
                break;
            }
            self.beams_visited += 1;
            let b = b as usize;
            let beam = &mut cands[b * stride..b * stride + lens[b]];
            build_best_first(beam);
            let mut n = beam.len();
            while n > 0 {
                self.visited += 1;
                if !self.offer(beam[0], bw) {
                    break; // the rest of this beam is worse still
                }
                n -= 1;
                beam.swap(0, n);
                sift_best_first(&mut beam[..n], 0);
            }
        }
        self.heap.sort_unstable_by(rank_order);
        &self.heap
    }

    /// Empties the heap and the counters for a new selection.
    fn start(&mut self) {
        self.heap.clear();
        self.visited = 0;
        self.beams_visited = 0;
    }

    /// Whether `c` would enter a heap of at most `bw`.
    #[inline]
    fn admits(&self, c: &Candidate, bw: usize) -> bool {
        self.heap.len() < bw || rank_order(c, &self.heap[0]).is_lt()
    }

    /// Keeps `c` if it enters a heap of at most `bw` (evicting the worst
    /// when full); `false` when it does not.
    #[inline]
    fn offer(&mut self, c: Candidate, bw: usize) -> bool {
        if self.heap.len() < bw {
            self.push(c);
        } else if rank_order(&c, &self.heap[0]).is_lt() {
            self.heap[0] = c;
            self.sift_down(0);
        } else {
            return false;
        }
        true
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
        self.start();
        if bw == 0 {
            return &self.heap;
        }
        for (b, &len) in lens.iter().enumerate() {
            self.beams_visited += (len > 0) as usize;
            for c in &cands[b * stride..b * stride + len] {
                self.visited += 1;
                if !self.offer(*c, bw) {
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

    fn sift_down(&mut self, i: usize) {
        sift_down_by(&mut self.heap, i, Self::worse);
    }
}

/// Restores a binary heap below `i` whose root is the first under `first`.
#[inline]
fn sift_down_by(v: &mut [Candidate], mut i: usize, first: impl Fn(&Candidate, &Candidate) -> bool) {
    let n = v.len();
    loop {
        let (l, r) = (2 * i + 1, 2 * i + 2);
        let mut m = i;
        if l < n && first(&v[l], &v[m]) {
            m = l;
        }
        if r < n && first(&v[r], &v[m]) {
            m = r;
        }
        if m == i {
            return;
        }
        v.swap(i, m);
        i = m;
    }
}

/// The best candidate of one beam's non-empty list in selection order: the
/// scores compared as integers ordered as `f32::total_cmp` orders them, the
/// lower token on equal scores (one beam's candidates share their beam).
fn best_of(beam: &[Candidate]) -> Candidate {
    #[inline]
    fn key(score: f32) -> i32 {
        let bits = score.to_bits() as i32;
        bits ^ (((bits >> 31) as u32) >> 1) as i32
    }
    let mut best = 0;
    let mut best_key = key(beam[0].score);
    for (i, c) in beam.iter().enumerate().skip(1) {
        let k = key(c.score);
        if k > best_key || (k == best_key && c.token < beam[best].token) {
            best = i;
            best_key = k;
        }
    }
    beam[best]
}

/// Makes `v` a binary heap whose root is its best candidate in selection
/// order (Floyd's construction, O(len)).
fn build_best_first(v: &mut [Candidate]) {
    for i in (0..v.len() / 2).rev() {
        sift_best_first(v, i);
    }
}

fn sift_best_first(v: &mut [Candidate], i: usize) {
    sift_down_by(v, i, |a, b| rank_order(a, b).is_lt());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn c(score: f32, token: u32) -> Candidate {
        Candidate {
            score,
            beam: 2,
            token,
            node: 0,
        }
    }

    #[test]
    fn a_beams_best_follows_the_selection_order() {
        let lists = [
            vec![c(-1.0, 5), c(-0.5, 9), c(-0.5, 3), c(-2.0, 1)],
            // total_cmp puts +0.0 before -0.0; `>` would call them equal.
            vec![c(-0.0, 1), c(0.0, 7)],
            vec![c(f32::NEG_INFINITY, 0), c(-1e30, 4)],
            vec![c(-3.0, 8)],
        ];
        for list in lists {
            let mut sorted = list.clone();
            sort_beam(&mut sorted);
            assert_eq!(best_of(&list), sorted[0], "{list:?}");
        }
    }
}
