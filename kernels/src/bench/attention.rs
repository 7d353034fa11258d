//! Decode attention figures, one layer at step 2: staged (the prompt's KV
//! read once for all beams) against per-beam and against the round-1 copy.

use std::sync::Arc;

use super::beam::WideSearch;
use super::{best_secs, rows};
use crate::backend::Backend;
use crate::beam::SID_STEPS;
use crate::error::KernelError;
use crate::staged::{
    SharedPrompt, StagedScratch, UnsharedKv, concat_attention, per_beam_attention, staged_attention,
};

/// Seconds of each way of attending.
pub(super) struct Attention {
    pub staged_s: f64,
    pub per_beam_s: f64,
    pub concat_s: f64,
}

/// Times the three over `wide`'s prompt with `wide.width` beams; staged
/// and per-beam must agree within 1e-4 (a NaN fails too).
pub(super) fn attention(
    backend: &Arc<dyn Backend>,
    wide: &WideSearch,
    reps: usize,
) -> Result<Attention, KernelError> {
    let (cfg, bw) = (&wide.cfg, wide.width);
    let cur = 2;
    let mut un = UnsharedKv::new(cfg, bw, SID_STEPS);
    let fill = rows(bw * SID_STEPS, cfg.d_model, 11);
    for l in 0..cfg.n_layers {
        for k in 0..2 {
            for b in 0..bw {
                for s in 0..cur {
                    let i = b * SID_STEPS + s;
                    un.row_mut(l, k, b, s)
                        .copy_from_slice(&fill[i * cfg.d_model..(i + 1) * cfg.d_model]);
                }
            }
        }
    }
    let q = rows(bw, cfg.d_model, 12);
    let shared = SharedPrompt {
        store: &wide.store,
        blocks: &wide.table,
        len: wide.prompt,
    };
    let mut scratch = StagedScratch::new(cfg, bw, wide.prompt);
    let mut out = vec![0f32; bw * cfg.d_model];
    let staged_s = best_secs(reps, || {
        staged_attention(
            backend.as_ref(),
            cfg,
            0,
            &q,
            cfg.d_model,
            bw,
            shared,
            &un,
            cur,
            &mut scratch,
            &mut out,
        )
    });
    let mut beam_scores = vec![0f32; wide.prompt + cur];
    let mut out_per_beam = vec![0f32; bw * cfg.d_model];
    let per_beam_s = best_secs(reps, || {
        per_beam_attention(
            backend.as_ref(),
            cfg,
            0,
            &q,
            cfg.d_model,
            bw,
            shared,
            &un,
            cur,
            &mut beam_scores,
            &mut out_per_beam,
        )
    });
    let diff = out
        .iter()
        .zip(&out_per_beam)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, |m, d| if d.is_nan() || d > m { d } else { m });
    if diff.is_nan() || diff > 1e-4 {
        return Err(KernelError::Beam(format!(
            "staged and per-beam attention differ by {diff}"
        )));
    }
    let concat_s = best_secs(reps, || {
        concat_attention(cfg, 0, &q, cfg.d_model, bw, shared, &un, cur, &mut out);
    });
    Ok(Attention {
        staged_s,
        per_beam_s,
        concat_s,
    })
}
