//! What `train-allocator` writes: the learning curve beside the policy,
//! both replaced whole (never truncated in place), and the scratch
//! directory the episodes read the current policy from.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use serde::Serialize;

use crate::cli::InputError;

#[derive(Debug, Serialize)]
pub(super) struct CurvePoint {
    pub(super) iteration: usize,
    /// Mean Eq. 5 reward of the iteration's decisions.
    pub(super) mean_reward: f64,
    /// Share of them at the best reward (1): near 1 the reward is flat.
    pub(super) best_reward_share: f64,
    /// Mean p99 (ms) of the iteration's episodes.
    pub(super) mean_p99_ms: f64,
    pub(super) decisions: usize,
    pub(super) entropy: f64,
    pub(super) approx_kl: f64,
    /// Mean p99 (ms) of the greedy policy before this iteration's update,
    /// from the config's α, on the traces selection scores (the training
    /// traces, or the held-out ones of `--validation-seeds`; selection
    /// points only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) greedy_p99_ms: Option<f64>,
    /// The same per regime, and the score selection compared.
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(super) greedy_p99_ms_by_regime: BTreeMap<String, f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(super) selection_score: Option<f64>,
    pub(super) wall_s: f64,
}

/// An iteration with at least this share of its decisions at Eq. 5's best
/// reward is told apart: its advantages are noise.
pub(super) const FLAT_REWARD_SHARE: f64 = 0.9;

/// Why an iteration whose windows nearly all met the SLO teaches nothing,
/// and what to pass instead.
pub(super) fn flat_reward_warning(point: &CurvePoint, slo_ms: f64) -> String {
    format!(
        "{:.0}% of iteration {}'s decisions earned Eq. 5's best reward (the window met the SLO of \
         {slo_ms} ms with nothing truncated), so the reward hardly depends on alpha and PPO has \
         little to learn; the episodes' p99 averaged {:.4} ms: train for an SLO that the windows' \
         p99 crosses (--slo-ms near {:.4})",
        point.best_reward_share * 100.0,
        point.iteration,
        point.mean_p99_ms,
        point.mean_p99_ms
    )
}

/// Where the learning curve of the policy at `out` goes.
pub(super) fn curve_path(out: &std::path::Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".curve.json");
    PathBuf::from(name)
}

/// The curve is written with the policy, so it is refused as `--out` is:
/// an earlier run's curve is replaced only with `--force`.
pub(super) fn check_curve_path(
    out: &std::path::Path,
    curve: &std::path::Path,
    force: bool,
) -> anyhow::Result<()> {
    let bad = |why: &str| {
        InputError::from_display(format!(
            "--out {}: its learning curve {} {why}",
            out.display(),
            curve.display()
        ))
    };
    if curve.is_dir() {
        return Err(bad("is a directory; name another --out"));
    }
    if !force && curve.symlink_metadata().is_ok() {
        return Err(bad(
            "already exists; pass --force to replace it, or name another file",
        ));
    }
    Ok(())
}

/// Writes `bytes` to a temporary file beside `path` and renames it over
/// `path`: a failed write leaves the old file whole, and `--force` replaces
/// the file rather than truncating it in place (under a reader, or a hard
/// link to the old one).
pub(super) fn write_replacing(path: &std::path::Path, bytes: &[u8]) -> anyhow::Result<()> {
    use std::io::Write;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(format!(".tmp-{}", std::process::id()));
    let tmp = PathBuf::from(tmp);
    let written = std::fs::File::create(&tmp)
        .and_then(|mut f| f.write_all(bytes).and_then(|()| f.sync_all()))
        .and_then(|()| std::fs::rename(&tmp, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.with_context(|| format!("writing {}", path.display()))
}

/// A scratch directory beside `out` for the current policy of each
/// iteration (the runs read it as `allocator.policy_file`), removed when
/// dropped: on success and on every error.
pub(super) struct Scratch(pub(super) PathBuf);

impl Scratch {
    /// Made in `out`'s directory, which `check_out_file` has checked.
    pub(super) fn beside(out: &std::path::Path) -> anyhow::Result<Self> {
        let parent = out
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        let dir = parent.join(format!(".train-allocator-{}", std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| {
            InputError::from_display(format!(
                "--out {}: cannot write in {}: {e}",
                out.display(),
                parent.display()
            ))
        })?;
        Ok(Scratch(dir))
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}
