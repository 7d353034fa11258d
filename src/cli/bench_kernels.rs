//! `grflow bench kernels`: measures the compute core (kernels/) and prints
//! one JSON object (`--json`) or a table.

use anyhow::Context;
use grflow_kernels::bench::{BenchOptions, DEFAULT_GEMM_SHAPES, MAX_CODEBOOK, run as run_bench};

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Threads for the CPU backend's matmuls (a serving node uses 1).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// GEMM shapes MxNxK timed for gemm_gflops, comma-separated (the best
    /// is reported, with every shape's rate).
    #[arg(long, value_delimiter = ',', default_values_t = DEFAULT_GEMM_SHAPES.map(shape_name))]
    pub gemm_shapes: Vec<String>,
    /// Prompt length of the prefill measurement (hstu-3l).
    #[arg(long, default_value_t = 2048)]
    pub prefill_tokens: usize,
    /// Beam width (= per-beam top-K) of the beam measurements.
    #[arg(long, default_value_t = 512)]
    pub beam_width: usize,
    /// Codebook size of the beam measurements (>= 32, >= beam width and
    /// <= 65536).
    #[arg(long, default_value_t = 1024)]
    pub codebook_size: usize,
    /// Prompt length of the beam measurements.
    #[arg(long, default_value_t = 200)]
    pub beam_prompt: usize,
    /// Repetitions per timing; the best is reported.
    #[arg(long, default_value_t = 3)]
    pub reps: usize,
}

fn shape_name([m, n, k]: [usize; 3]) -> String {
    format!("{m}x{n}x{k}")
}

/// Parses `MxNxK` (each >= 1); `i` is the shape's position in the list.
fn parse_shape(i: usize, text: &str) -> Result<[usize; 3], InputError> {
    let dims: Vec<usize> = text
        .trim()
        .split('x')
        .map(|d| d.parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|e| InputError(format!("--gemm-shapes[{i}] = {text:?} is not MxNxK: {e}")))?;
    match dims[..] {
        [m, n, k] if m > 0 && n > 0 && k > 0 => Ok([m, n, k]),
        _ => Err(InputError(format!(
            "--gemm-shapes[{i}] = {text:?} is not MxNxK with every size >= 1"
        ))),
    }
}

/// The flags as the benchmark's options; a bad one is an input error
/// naming it.
fn options(args: &Args) -> Result<BenchOptions, InputError> {
    let at_least = |flag: &str, value: usize, min: usize| {
        if value < min {
            Err(InputError(format!("{flag} must be >= {min} (got {value})")))
        } else {
            Ok(())
        }
    };
    super::check_count("--threads", args.threads, super::MAX_THREADS)?;
    at_least("--reps", args.reps, 1)?;
    at_least("--beam-width", args.beam_width, 1)?;
    if args.prefill_tokens < 10 {
        return Err(InputError(format!(
            "--prefill-tokens must be >= 10 to leave a 10% suffix to time (got {})",
            args.prefill_tokens
        )));
    }
    let min_codebook = 32.max(args.beam_width);
    if !(min_codebook..=MAX_CODEBOOK).contains(&args.codebook_size) {
        return Err(InputError(format!(
            "--codebook-size must be in {min_codebook}..={MAX_CODEBOOK} (>= 32 and >= --beam-width {}; got {})",
            args.beam_width, args.codebook_size
        )));
    }
    if args.gemm_shapes.is_empty() {
        return Err(InputError("--gemm-shapes names no shape".into()));
    }
    let gemm_shapes = args
        .gemm_shapes
        .iter()
        .enumerate()
        .map(|(i, s)| parse_shape(i, s))
        .collect::<Result<_, _>>()?;
    Ok(BenchOptions {
        threads: args.threads,
        gemm_shapes,
        prefill_tokens: args.prefill_tokens,
        beam_width: args.beam_width,
        codebook_size: args.codebook_size,
        beam_prompt: args.beam_prompt,
        reps: args.reps,
    })
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let opts = options(&args)?;
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
        if name == "gemm_shapes" {
            for g in &report.gemm_shapes {
                let shape = shape_name([g.m, g.n, g.k]);
                println!(
                    "{:<width$}  {:.3}",
                    format!("gemm_gflops[{shape}]"),
                    g.gflops
                );
            }
            continue;
        }
        let shown = match v.as_f64() {
            Some(x) if v.is_f64() => format!("{x:.3}"),
            _ => v.to_string().trim_matches('"').to_string(),
        };
        println!("{name:<width$}  {shown}");
    }
    Ok(())
}
