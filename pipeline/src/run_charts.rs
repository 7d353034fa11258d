//! The pictures of a replay (`replay --out`): the latency CDF, EMB and KV
//! hit rates per window, and α per node per window. Pure: a run's output
//! in, charts out; the CLI writes them beside summary.json.

use std::collections::BTreeMap;

use grflow_connectors::WindowRow;

use crate::plot::{LineChart, Series};
use crate::replay::ReplayOutput;

/// (file name, chart) of every picture of a run.
pub fn run_charts(output: &ReplayOutput) -> Vec<(&'static str, LineChart)> {
    vec![
        ("latency_cdf.svg", latency_cdf(output)),
        ("hit_rates.svg", hit_rates(&output.windows)),
        ("alpha.svg", alpha(&output.windows)),
    ]
}

fn latency_cdf(output: &ReplayOutput) -> LineChart {
    let s = &output.summary;
    LineChart {
        title: format!(
            "latency CDF: {} responses, p99 {} ({} clock)",
            s.responses_out,
            s.latency_ms
                .as_ref()
                .map_or_else(|| "-".into(), |l| format!("{:.2} ms", l.p99)),
            s.clock
        ),
        x_label: "latency (ms)".into(),
        y_label: "share of responses at or below".into(),
        series: vec![Series {
            name: "all responses".into(),
            points: output.latency_cdf.clone(),
        }],
        y_range: Some((0.0, 1.0)),
        reference: None,
        markers: false,
    }
}

/// Event time of a window's start, in seconds.
fn at_s(w: &WindowRow) -> f64 {
    w.window_start_ms as f64 / 1000.0
}

/// EMB and KV hit rates of the whole job per window (nodes weighted by
/// the requests they served in it; failed requests have no hit rates).
fn hit_rates(windows: &[WindowRow]) -> LineChart {
    let mut per_window: BTreeMap<u64, (f64, f64, f64)> = BTreeMap::new();
    for w in windows {
        let e = per_window.entry(w.window_start_ms).or_default();
        let n = w.requests.saturating_sub(w.failed) as f64;
        e.0 += w.emb_hit_rate * n;
        e.1 += w.kv_hit_rate * n;
        e.2 += n;
    }
    let series = |name: &str, pick: fn(&(f64, f64, f64)) -> f64| Series {
        name: name.into(),
        points: per_window
            .iter()
            .filter(|(_, v)| v.2 > 0.0)
            .map(|(&start, v)| (start as f64 / 1000.0, pick(v) / v.2))
            .collect(),
    };
    LineChart {
        title: "EMB and KV hit rates per window".into(),
        x_label: "event time (s, window start)".into(),
        y_label: "hit rate".into(),
        series: vec![series("EMB", |v| v.0), series("KV", |v| v.1)],
        y_range: Some((0.0, 1.0)),
        reference: None,
        markers: true,
    }
}

/// α of each node per window: one series per node.
fn alpha(windows: &[WindowRow]) -> LineChart {
    let mut nodes: BTreeMap<u32, Vec<(f64, f64)>> = BTreeMap::new();
    for w in windows {
        nodes.entry(w.node).or_default().push((at_s(w), w.alpha));
    }
    LineChart {
        title: "alpha (EMB share of the pool) per node and window".into(),
        x_label: "event time (s, window start)".into(),
        y_label: "alpha".into(),
        series: nodes
            .into_iter()
            .map(|(node, mut points)| {
                points.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series {
                    name: format!("node {node}"),
                    points,
                }
            })
            .collect(),
        y_range: Some((0.0, 1.0)),
        reference: None,
        markers: true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(node: u32, start: u64, requests: u64, emb: f64, kv: f64, alpha: f64) -> WindowRow {
        WindowRow {
            node,
            window_start_ms: start,
            requests,
            hot_user_share: 0.0,
            emb_hit_rate: emb,
            kv_hit_rate: kv,
            mean_seq_len: 0.0,
            slo_violation_share: 0.0,
            p99_ms: 0.0,
            alpha,
            failed: 0,
            truncated_share: 0.0,
            alpha_end: Some(alpha),
            pinned_end: false,
        }
    }

    #[test]
    fn hit_rates_weigh_nodes_by_requests_and_alpha_has_a_series_per_node() {
        let windows = vec![
            row(0, 0, 30, 1.0, 0.0, 0.25),
            row(1, 0, 10, 0.0, 1.0, 0.25),
            row(0, 5000, 10, 0.5, 0.5, 0.2),
        ];
        let h = hit_rates(&windows);
        assert_eq!(h.series[0].points, vec![(0.0, 0.75), (5.0, 0.5)]);
        assert_eq!(h.series[1].points, vec![(0.0, 0.25), (5.0, 0.5)]);
        let a = alpha(&windows);
        assert_eq!(a.series.len(), 2);
        assert_eq!(a.series[0].points, vec![(0.0, 0.25), (5.0, 0.2)]);
        assert_eq!(a.series[1].name, "node 1");
    }
}
