//! `grflow replay --out` draws the run: a latency CDF with one line of as
//! many points as quantiles computed, EMB and KV hit rates per window, and
//! α per node with one point per window (here a `pid` allocator moves it),
//! axis labels present; one picture is rendered to pixels.

use std::path::Path;

use serde_json::Value;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/temp.rs"]
mod temp;
use cli::{grflow, ok};
use temp::tmp_dir;

/// The `points` attribute of every series polyline, as coordinate counts.
fn series(svg: &str) -> Vec<(String, usize)> {
    svg.lines()
        .filter(|l| l.contains("class=\"series\""))
        .map(|l| {
            let name = l
                .split("data-name=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let points = l
                .split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let n = points.split(' ').filter(|p| !p.is_empty()).count();
            (name.to_string(), n)
        })
        .collect()
}

fn read(dir: &Path, name: &str) -> String {
    std::fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

#[test]
fn replay_out_draws_the_latency_cdf_hit_rates_and_alpha_per_node() {
    let dir = tmp_dir("replay-pictures");
    let config = dir.join("pid.toml");
    std::fs::write(
        &config,
        "[run]\nworkers = 2\nspeed = \"max\"\nclock = \"event\"\nslo_ms = 0.5\n\
         [trace]\nregime = \"steady\"\nrequests = 2000\nrps = 200.0\ncandidates = 16\n\
         [windows]\nepoch_ms = 1000\n\
         [allocator]\npolicy = \"pid\"\nmin_requests = 5\n",
    )
    .unwrap();
    let out = dir.join("out");
    ok(grflow()
        .args(["replay", "--quiet", "--config"])
        .arg(&config)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap());
    let summary: Value = serde_json::from_str(&read(&out, "summary.json")).unwrap();
    let windows = summary["windows"].as_u64().unwrap() as usize;
    assert!(windows >= 10, "{summary}");
    let moves = summary["allocator"]["alpha_moves"].as_u64().unwrap();
    assert!(moves > 0);
    // Every command sent moved a node's boundary (none rounded to the
    // pages the node already held).
    let node_moves: u64 = summary["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["alpha_moves"].as_u64().unwrap())
        .sum();
    assert_eq!(moves, node_moves, "{summary}");

    let cdf = read(&out, "latency_cdf.svg");
    assert_eq!(
        series(&cdf),
        vec![(
            "all responses".to_string(),
            grflow_pipeline::replay::CDF_POINTS
        )]
    );
    assert!(cdf.contains(">latency (ms)</text>"));
    assert!(cdf.contains(">share of responses at or below</text>"));

    let hits = read(&out, "hit_rates.svg");
    let names: Vec<String> = series(&hits).into_iter().map(|s| s.0).collect();
    assert_eq!(names, ["EMB", "KV"]);
    assert!(hits.contains(">hit rate</text>"));

    let alpha = read(&out, "alpha.svg");
    let per_node = series(&alpha);
    assert!(!per_node.is_empty());
    assert!(per_node.iter().all(|(name, _)| name.starts_with("node ")));
    // One point per window of each node: together, every window row.
    assert_eq!(per_node.iter().map(|s| s.1).sum::<usize>(), windows);
    assert!(
        alpha.contains(">alpha</text>") && alpha.contains(">event time (s, window start)</text>")
    );

    // Rendered: the lines are there in pixels, not only in the markup.
    let tree = resvg::usvg::Tree::from_str(&alpha, &resvg::usvg::Options::default()).unwrap();
    let size = tree.size().to_int_size();
    let mut pixmap = resvg::tiny_skia::Pixmap::new(size.width(), size.height()).unwrap();
    resvg::render(
        &tree,
        resvg::tiny_skia::Transform::default(),
        &mut pixmap.as_mut(),
    );
    let colored = pixmap
        .pixels()
        .iter()
        .filter(|p| {
            // Series colours (not white background, not black axes, not grey grid).
            let (r, g, b) = (p.red(), p.green(), p.blue());
            r.abs_diff(g) > 40 || g.abs_diff(b) > 40 || r.abs_diff(b) > 40
        })
        .count();
    assert!(colored > 200, "{colored} coloured pixels");
}
