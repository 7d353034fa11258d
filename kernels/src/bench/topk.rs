//! Top-BW figures on the model's last-step candidates: early termination
//! from unordered per-beam lists against the ways it replaced.

use super::{best_secs, best_secs_with_setup, shuffled};
use crate::error::KernelError;
use crate::topk::{Candidate, TopBw, select_full_sort, select_nth_then_sort, sort_beam};

/// Shuffles each beam's valid candidates (deterministically), standing in
/// for the unordered top-K that `select_nth_unstable` leaves per beam.
fn unordered(cands: &[Candidate], stride: usize, lens: &[usize]) -> Vec<Candidate> {
    let mut out = cands.to_vec();
    for (b, &len) in lens.iter().enumerate() {
        let beam = &mut out[b * stride..b * stride + len];
        for (i, j) in shuffled(len, 13 + b as u64).into_iter().enumerate() {
            beam[i] = cands[b * stride + j as usize];
        }
    }
    out
}

/// Seconds of each selection, and how far early termination looked.
pub(super) struct TopK {
    pub candidates: usize,
    pub visited: usize,
    pub beams_visited: usize,
    pub early_s: f64,
    pub sort_then_select_s: f64,
    pub select_nth_s: f64,
    pub presorted_heap_s: f64,
    pub full_sort_s: f64,
}

/// Every timed region starts from the same unordered per-beam lists (the
/// baseline's contiguous) and ends with the `bw` selected in selection
/// order; the selections must agree, or the figures are refused.
pub(super) fn top_k(
    last: &[Candidate],
    stride: usize,
    lens: &[usize],
    bw: usize,
    reps: usize,
) -> Result<TopK, KernelError> {
    // The search leaves its lists in no order; the presorted figures need
    // them sorted, the others start from a shuffle of each list.
    let mut cand = last.to_vec();
    for (b, &len) in lens.iter().enumerate() {
        sort_beam(&mut cand[b * stride..b * stride + len]);
    }
    let cand = &cand[..];
    let candidates: usize = lens.iter().sum();
    let loose = unordered(cand, stride, lens);
    let loose_all: Vec<Candidate> = lens
        .iter()
        .enumerate()
        .flat_map(|(b, &len)| loose[b * stride..b * stride + len].iter().copied())
        .collect();
    let mut top = TopBw::with_capacity(bw);
    let mut work = loose.clone();
    let mut all = loose_all.clone();
    let early_s = best_secs_with_setup(
        reps,
        &mut work[..],
        |w| w.copy_from_slice(&loose),
        |w| {
            std::hint::black_box(top.select_unordered(w, stride, lens, bw));
        },
    );
    let sort_then_select_s = best_secs_with_setup(
        reps,
        &mut work[..],
        |w| w.copy_from_slice(&loose),
        |w| {
            std::hint::black_box(top.sort_and_select(w, stride, lens, bw));
        },
    );
    let select_nth_s = best_secs_with_setup(
        reps,
        &mut all[..],
        |a| a.copy_from_slice(&loose_all),
        |a| {
            std::hint::black_box(select_nth_then_sort(a, bw));
        },
    );
    all.copy_from_slice(&loose_all);
    let want = select_nth_then_sort(&mut all, bw).to_vec();
    work.copy_from_slice(&loose);
    if top.sort_and_select(&mut work, stride, lens, bw) != want {
        return Err(KernelError::Beam(
            "sort-then-select and select_nth disagree".into(),
        ));
    }
    work.copy_from_slice(&loose);
    if top.select_unordered(&mut work, stride, lens, bw) != want {
        return Err(KernelError::Beam(
            "early termination and select_nth disagree".into(),
        ));
    }
    let (visited, beams_visited) = (top.visited(), top.beams_visited());
    let presorted_heap_s = best_secs(reps, || {
        std::hint::black_box(top.select(cand, stride, lens, bw));
    });
    let mut buf: Vec<Candidate> = Vec::with_capacity(candidates);
    let full_sort_s = best_secs(reps, || {
        std::hint::black_box(select_full_sort(cand, stride, lens, bw, &mut buf));
    });
    Ok(TopK {
        candidates,
        visited,
        beams_visited,
        early_s,
        sort_then_select_s,
        select_nth_s,
        presorted_heap_s,
        full_sort_s,
    })
}
