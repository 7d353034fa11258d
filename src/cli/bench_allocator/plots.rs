//! The pictures of `grflow bench allocator --out DIR`: α against α* per
//! regime, P99 per window and policy, the static sweep, and the oracle's
//! numbers behind them.

use std::collections::BTreeMap;
use std::path::PathBuf;

use anyhow::Context;
use grflow_operators::allocator::oracle::OracleEpoch;
use grflow_pipeline::plot::{LineChart, Series};
use grflow_pipeline::replay::ReplayOutput;

/// The bench's pictures, gathered as the runs finish.
#[derive(Default)]
pub(super) struct Plots {
    /// Per regime: α over time of each policy that moves it and α* of
    /// each node (from `smart`'s run, else `pid`'s).
    alpha: BTreeMap<String, LineChart>,
    /// Per regime: P99 per window (mean over nodes) of every policy.
    p99: BTreeMap<String, LineChart>,
    sweep: Option<LineChart>,
    /// Per regime and policy: the oracle's verdict on every node-epoch.
    oracle: BTreeMap<String, BTreeMap<String, Vec<OracleEpoch>>>,
}

/// `(node, event ms, value)` as one line per node, named by `name(node)`,
/// in node order, its points in time order, x in seconds.
fn per_node(
    points: impl Iterator<Item = (u32, u64, f64)>,
    name: impl Fn(u32) -> String,
) -> Vec<Series> {
    let mut by_node: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    for (node, ms, v) in points {
        by_node.entry(node).or_default().push((ms as f64 / 1e3, v));
    }
    by_node
        .into_iter()
        .map(|(node, mut points)| {
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            Series {
                name: name(node),
                points,
            }
        })
        .collect()
}

impl Plots {
    pub(super) fn policy_run(&mut self, regime: &str, policy: &str, out: &ReplayOutput) {
        let mean_by_window = |f: fn(&grflow_connectors::WindowRow) -> f64| {
            let mut by: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
            for w in &out.windows {
                let e = by.entry(w.window_start_ms).or_default();
                e.0 += f(w);
                e.1 += 1.0;
            }
            by.into_iter()
                .map(|(t, (sum, n))| (t as f64 / 1e3, sum / n))
                .collect::<Vec<_>>()
        };
        if !out.oracle.is_empty() {
            self.oracle
                .entry(regime.into())
                .or_default()
                .insert(policy.into(), out.oracle.clone());
        }
        let p99 = self.p99.entry(regime.into()).or_insert_with(|| LineChart {
            title: format!("{regime}: P99 per window (mean over nodes)"),
            x_label: "event time (s)".into(),
            y_label: "P99 (ms)".into(),
            ..LineChart::default()
        });
        p99.series.push(Series {
            name: policy.into(),
            points: mean_by_window(|w| w.p99_ms),
        });
        let with_oracle = !out.oracle.is_empty();
        let chart = self
            .alpha
            .entry(regime.into())
            .or_insert_with(|| LineChart {
                title: if with_oracle {
                    format!("{regime}: alpha per epoch and node against the oracle alpha*")
                } else {
                    format!("{regime}: alpha per epoch and node")
                },
                x_label: "event time (s)".into(),
                y_label: "alpha (EMB share)".into(),
                y_range: Some((0.0, 1.0)),
                ..LineChart::default()
            });
        if !matches!(policy, "static" | "kv-opt" | "kv-emb-opt") {
            // Per node, not the mean: a learned policy's gain on allocator-tight
            // is the two nodes' α moving apart, which a mean hides.
            let windows = out.windows.iter();
            chart.series.extend(per_node(
                windows.map(|w| (w.node, w.window_start_ms, w.alpha)),
                |node| format!("{policy} node {node}"),
            ));
        }
        if policy == "smart" || (policy == "pid" && with_oracle) {
            chart.series.retain(|s| !s.name.starts_with("alpha* "));
            let epochs = out.oracle.iter();
            chart.series.extend(per_node(
                epochs.map(|e| (e.node, e.epoch_start_ms, e.alpha_star)),
                |node| format!("alpha* node {node} ({policy})"),
            ));
        }
    }

    pub(super) fn sweep(&mut self, regime: &str, runs: &[(f64, ReplayOutput)]) {
        let chart = self.sweep.get_or_insert_with(|| LineChart {
            title: "static alpha sweep: P99 against alpha".into(),
            x_label: "alpha (EMB share)".into(),
            y_label: "P99 (ms)".into(),
            markers: true,
            ..LineChart::default()
        });
        chart.series.push(Series {
            name: regime.into(),
            points: runs
                .iter()
                .filter(|(_, o)| o.summary.truncated_histories == 0)
                .filter_map(|(a, o)| Some((*a, o.summary.latency_ms.as_ref()?.p99)))
                .collect(),
        });
    }

    pub(super) fn write(&self, dir: &std::path::Path) -> anyhow::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let mut charts: Vec<(String, &LineChart)> = Vec::new();
        for (regime, c) in &self.alpha {
            charts.push((format!("alpha-{regime}.svg"), c));
        }
        for (regime, c) in &self.p99 {
            charts.push((format!("p99-{regime}.svg"), c));
        }
        if let Some(c) = &self.sweep {
            charts.push(("sweep.svg".into(), c));
        }
        let mut paths = Vec::new();
        for (file, chart) in charts {
            let path = dir.join(file);
            std::fs::write(&path, chart.to_svg())
                .with_context(|| format!("writing {}", path.display()))?;
            paths.push(path);
        }
        // The numbers behind the α plots, for whoever audits the gap.
        for (regime, by_policy) in &self.oracle {
            let path = dir.join(format!("oracle-{regime}.json"));
            std::fs::write(&path, serde_json::to_string_pretty(by_policy)?)
                .with_context(|| format!("writing {}", path.display()))?;
            paths.push(path);
        }
        Ok(paths)
    }
}

#[cfg(test)]
mod tests {
    use super::per_node;

    #[test]
    fn per_node_lines_are_split_by_node_in_time_order_in_seconds() {
        let lines = per_node(
            [
                (1, 10_000, 0.5),
                (0, 5_000, 0.2),
                (1, 5_000, 0.4),
                (0, 0, 0.25),
            ]
            .into_iter(),
            |node| format!("n{node}"),
        );
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[0].name, "n0");
        assert_eq!(lines[0].points, vec![(0.0, 0.25), (5.0, 0.2)]);
        assert_eq!(lines[1].name, "n1");
        assert_eq!(lines[1].points, vec![(5.0, 0.4), (10.0, 0.5)]);
    }
}
