//! `grflow bench cache`: replays a real trace's key stream through one cache
//! per (policy, capacity ratio, noise) and prints hit counts and costs.

use std::path::PathBuf;

use grflow_kernels::bench::gemm_peak_gflops;
use grflow_kernels::cost::machine_name;
use grflow_operators::cachebench::{AccessStream, BenchConfig, BenchRow, run as run_bench};
use grflow_operators::eviction::PolicyName;
use grflow_operators::predictor::AccessContext;
use grflow_traces::keystream::{KeyFormat, read_stream};

use crate::cli::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Trace file to replay.
    #[arg(long)]
    pub trace: PathBuf,
    /// mooncake | recbole | movielens | seq.
    #[arg(long)]
    pub format: String,
    /// Cache capacity as a share of the trace's distinct keys (comma list).
    #[arg(long, value_delimiter = ',', default_value = "0.05,0.1,0.2")]
    pub capacity_ratio: Vec<f64>,
    /// Policies (comma list): lru, laru (Async), laru-sync, fpb, hf, opt.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "lru,laru,laru-sync,fpb,hf,opt"
    )]
    pub policies: Vec<String>,
    /// Prediction noise probabilities (LCR §5.2), comma list.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub noise: Vec<f64>,
    /// Replays per cell, taking turns across cells; each row reports its
    /// fastest replay (per-access costs on a shared machine are noisy).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
    pub repeat: u32,
    /// Print a JSON array instead of a table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let format: KeyFormat = args.format.parse().map_err(InputError::from_display)?;
    let policies = args
        .policies
        .iter()
        .map(|p| PolicyName::parse(p))
        .collect::<Result<Vec<_>, _>>()
        .map_err(InputError::from_display)?;
    if let Some(r) = args
        .capacity_ratio
        .iter()
        .find(|r| !(r.is_finite() && **r > 0.0 && **r <= 1.0))
    {
        return Err(InputError::from_display(format!(
            "--capacity-ratio {r}: must be in (0, 1]"
        )));
    }
    if let Some(p) = args.noise.iter().find(|p| !(0.0..=1.0).contains(*p)) {
        return Err(InputError::from_display(format!(
            "--noise {p}: must be in [0, 1]"
        )));
    }
    let stream = read_stream(&args.trace, format).map_err(InputError::from_display)?;
    let accesses = AccessStream {
        contexts: stream
            .places
            .iter()
            .map(|p| AccessContext::block(p.position as usize, p.request_len as usize))
            .collect(),
        keys: stream.keys,
    };
    let distinct = accesses
        .keys
        .iter()
        .collect::<std::collections::HashSet<_>>()
        .len();
    if let Some(r) = args
        .capacity_ratio
        .iter()
        .find(|&&r| grflow_operators::cachebench::capacity(r, distinct) == 0)
    {
        // A cache of no entries hits nothing under every policy.
        return Err(InputError::from_display(format!(
            "--capacity-ratio {r}: holds no key of this trace's {distinct} distinct keys \
             (at least {:.6})",
            1.0 / distinct.max(1) as f64
        )));
    }
    let name = args.trace.file_name().map_or_else(
        || args.trace.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    eprintln!(
        "replaying {} accesses of {name} through {} cell(s), {} time(s) each...",
        accesses.keys.len(),
        policies.len() * args.capacity_ratio.len() * args.noise.len(),
        args.repeat
    );
    let cfg = BenchConfig {
        ratios: args.capacity_ratio,
        policies,
        noise: args.noise,
        repeat: args.repeat as usize,
        ..BenchConfig::default()
    };
    let rows = run_bench(&name, accesses, &cfg);
    // After the replays, so that it disturbs none of them.
    let (machine, gemm_gflops) = (machine_name(), gemm_peak_gflops());
    if args.json {
        let rows: Vec<HostRow> = rows
            .iter()
            .map(|row| HostRow {
                row,
                machine: &machine,
                gemm_gflops,
            })
            .collect();
        println!("{}", serde_json::to_string_pretty(&rows)?);
    } else {
        print_table(&rows);
        println!("costs measured on {machine} (GEMM {gemm_gflops:.1} GFLOP/s, one core)");
    }
    Ok(())
}

/// A row with the machine whose costs (`ns_per_access`, `predict_ns`,
/// `train_ms`) it reports.
#[derive(serde::Serialize)]
struct HostRow<'a> {
    #[serde(flatten)]
    row: &'a BenchRow,
    machine: &'a str,
    gemm_gflops: f64,
}

fn print_table(rows: &[BenchRow]) {
    println!(
        "{:<10} {:>6} {:>8} {:>5} {:>9} {:>9} {:>8} {:>8} {:>10} {:>9}",
        "policy",
        "ratio",
        "capacity",
        "noise",
        "accesses",
        "hits",
        "hit_rate",
        "ns/acc",
        "predict_ns",
        "train_ms"
    );
    for r in rows {
        println!(
            "{:<10} {:>6.3} {:>8} {:>5.2} {:>9} {:>9} {:>8.4} {:>8.1} {:>10.1} {:>9.0}",
            r.policy,
            r.capacity_ratio,
            r.capacity,
            r.noise,
            r.accesses,
            r.hits,
            r.hit_rate,
            r.ns_per_access,
            r.predict_ns,
            r.train_ms
        );
    }
}
