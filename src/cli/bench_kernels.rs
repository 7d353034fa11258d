//! `grflow bench kernels`: measures the compute core (kernels/) and prints
//! one JSON object (`--json`) or a table.

use anyhow::Context;
use grflow_kernels::bench::{BenchOptions, run as run_bench};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Threads for the CPU backend's matmuls (a serving node uses 1).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// Prompt length of the prefill measurement (hstu-3l).
    #[arg(long, default_value_t = 2048)]
    pub prefill_tokens: usize,
    /// Beam width (= per-beam top-K) of the beam measurements.
    #[arg(long, default_value_t = 512)]
    pub beam_width: usize,
    /// Repetitions per timing; the best is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let opts = BenchOptions {
        threads: args.threads.max(1),
        prefill_tokens: args.prefill_tokens,
        beam_width: args.beam_width,
        reps: args.reps.max(1),
    };
    eprintln!(
        "benchmarking kernels on {} thread(s) (a few seconds)...",
        opts.threads
    );
    let report = run_bench(&opts).context("kernel benchmark")?;
    let value = serde_json::to_value(&report)?;
    if args.json {
        println!("{}", serde_json::to_string(&value)?);
        return Ok(());
    }
    let fields = value.as_object().context("report is an object")?;
    let width = fields.keys().map(|k| k.len()).max().unwrap_or(0);
    for (name, v) in fields {
        let shown = match v.as_f64() {
            Some(x) if v.is_f64() => format!("{x:.3}"),
            _ => v.to_string().trim_matches('"').to_string(),
        };
        println!("{name:<width$}  {shown}");
    }
    Ok(())
}
