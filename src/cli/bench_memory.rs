//! `grflow bench memory`: does a long replay run in bounded memory? A
//! steady trace from many distinct users is written to Parquet and replayed
//! at `--speed max` on the event clock, responses dropped once counted;
//! resident memory (VmRSS) is sampled every `--interval-s` seconds and
//! compared at 20% and at 100% of the requests answered.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use anyhow::Context;
use grflow_kernels::bench::gemm_peak_gflops;
use grflow_pipeline::dataflow::JobCounters;
use grflow_pipeline::replay::ResponseOutput;
use grflow_pipeline::{Clock, Config, ReplayOptions, TraceInput};
use grflow_traces::{GenConfig, Regime, WriteOptions, generate, write_trace};
use serde::Serialize;

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Requests in the trace.
    #[arg(long, default_value_t = 1_000_000)]
    pub requests: u64,
    /// Users of the generator (its default activity skew makes about a
    /// third of them appear in 1M requests).
    #[arg(long, default_value_t = 1_500_000)]
    pub users: u64,
    /// Base request rate of the steady trace (event time).
    #[arg(long, default_value_t = 200.0)]
    pub rps: f64,
    /// Candidates per rank request.
    #[arg(long, default_value_t = 100)]
    pub candidates: usize,
    /// Timely workers (= serving nodes).
    #[arg(long, default_value_t = 2)]
    pub workers: usize,
    /// Seconds between VmRSS samples.
    #[arg(long, default_value_t = 10.0)]
    pub interval_s: f64,
    /// TOML config (bounds such as router.max_users); default the embedded one.
    #[arg(long)]
    pub config: Option<std::path::PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Sample {
    wall_s: f64,
    answered: u64,
    rss_kib: u64,
}

#[derive(Debug, Serialize)]
struct MemoryBench {
    requests: u64,
    distinct_users: usize,
    workers: usize,
    wall_s: f64,
    throughput_rps: f64,
    /// After the trace was written and before the replay started.
    rss_before_kib: u64,
    /// At the first sample with at least 20% and fewer than 100% of the
    /// requests answered (one is taken when 20% are).
    rss_at_20_kib: u64,
    /// When the last request was answered, before the job's state is freed.
    rss_at_100_kib: u64,
    /// rss_at_100_kib / rss_at_20_kib.
    growth_ratio: f64,
    rss_peak_kib: u64,
    affinity_evictions: u64,
    hotness_evictions: u64,
    user_head_evictions: u64,
    errors: u64,
    /// This machine's f32 GEMM rate (one core), measured before the replay.
    gemm_gflops: f64,
    samples: Vec<Sample>,
}

/// The longest `--interval-s` (s): one day.
const MAX_INTERVAL_S: f64 = 86_400.0;

/// How often the sampler looks at the answered count.
const POLL: Duration = Duration::from_millis(10);

/// A scratch directory removed when dropped, on every path out.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.requests == 0
        || args.users == 0
        || args.workers == 0
        // NaN is not positive either.
        || args.rps.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
        || args.interval_s.partial_cmp(&0.0) != Some(std::cmp::Ordering::Greater)
    {
        return Err(InputError::from_display(
            "--requests, --users, --workers, --rps and --interval-s must be > 0",
        ));
    }
    super::check_count("--workers", args.workers, super::MAX_THREADS)?;
    if args.interval_s > MAX_INTERVAL_S {
        return Err(InputError::from_display(format!(
            "--interval-s {} is over the limit of {MAX_INTERVAL_S} s (one day)",
            args.interval_s
        )));
    }
    let mut config = match &args.config {
        Some(path) => Config::load(path).map_err(InputError::from_display)?,
        None => Config::embedded(),
    };
    config.run.workers = args.workers;
    config.run.speed = "max".into();
    config.run.clock = Clock::Event;

    let gemm_gflops = gemm_peak_gflops();
    eprintln!(
        "generating {} requests from {} users...",
        args.requests, args.users
    );
    let gen_cfg = GenConfig {
        regime: Regime::Steady,
        users: args.users,
        requests: args.requests,
        rps: args.rps,
        candidates: args.candidates,
        ..GenConfig::default()
    };
    // The flags, checked; the error names the flag.
    gen_cfg.validate().map_err(InputError::from_display)?;
    let trace = generate(&gen_cfg);
    let distinct_users = trace
        .requests
        .iter()
        .map(|r| r.user_id)
        .collect::<HashSet<_>>()
        .len();
    let dir =
        TempDir(std::env::temp_dir().join(format!("grflow-bench-memory-{}", std::process::id())));
    let _ = std::fs::remove_dir_all(&dir.0);
    write_trace(&dir.0, &trace, &WriteOptions::default()).context("writing the bench trace")?;
    drop(trace);
    let report = measure(&args, config, &dir.0, distinct_users, gemm_gflops)?;
    drop(dir);
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        let mut v = serde_json::to_value(&report)?;
        let samples = v
            .as_object_mut()
            .context("object")?
            .remove("samples")
            .unwrap_or_default();
        for (k, v) in v.as_object().context("object")? {
            println!("{k:<22} {v}");
        }
        println!("samples (wall_s, answered, rss_kib):");
        for s in samples.as_array().into_iter().flatten() {
            println!(
                "  {:>8.1} {:>9} {:>9}",
                s["wall_s"], s["answered"], s["rss_kib"]
            );
        }
    }
    Ok(())
}

fn measure(
    args: &Args,
    config: Config,
    dir: &std::path::Path,
    distinct_users: usize,
    gemm_gflops: f64,
) -> anyhow::Result<MemoryBench> {
    let counters = Arc::new(JobCounters::default());
    let answered = {
        let c = counters.clone();
        move || c.responses_out.load(Ordering::Relaxed) + c.errors.load(Ordering::Relaxed)
    };
    let rss_before_kib = vm_rss_kib()?;
    eprintln!(
        "replaying at --speed max on {} workers, sampling VmRSS every {} s...",
        args.workers, args.interval_s
    );
    let start = Instant::now();
    let job_counters = counters.clone();
    let trace = TraceInput::Parquet(dir.to_path_buf());
    let job = std::thread::spawn(move || {
        grflow_pipeline::replay(ReplayOptions {
            trace,
            config,
            show_progress: false,
            responses: ResponseOutput::Drop,
            counters: Some(job_counters),
            commands: Vec::new(),
            oracle_step: None,
            stop: None,
        })
    });
    let interval = Duration::from_secs_f64(args.interval_s);
    let mut samples = Vec::new();
    let mut next_sample = start + interval;
    let mut at_100 = None;
    let twenty = args.requests.div_ceil(5);
    let mut at_20_taken = false;
    while !job.is_finished() {
        std::thread::sleep(POLL);
        let done = answered();
        // The 100% figure is taken once, as soon as the last answer is out;
        // the 20% one as soon as 20% are (unless the poll missed the
        // stretch between 20% and 100%: then there is none).
        let last = at_100.is_none() && done >= args.requests;
        let first_20 = !at_20_taken && done >= twenty && done < args.requests;
        at_20_taken |= first_20;
        if Instant::now() >= next_sample || last || first_20 {
            let s = Sample {
                wall_s: start.elapsed().as_secs_f64(),
                answered: done,
                rss_kib: vm_rss_kib()?,
            };
            if last {
                at_100 = Some(s.rss_kib);
            }
            // Progress of a long soak, on stderr beside the JSON on stdout.
            eprintln!(
                "  {:>8.1} s {:>9} answered {:>9} KiB resident",
                s.wall_s, s.answered, s.rss_kib
            );
            samples.push(s);
            if Instant::now() >= next_sample {
                next_sample += interval;
            }
        }
    }
    let out = job
        .join()
        .map_err(|_| anyhow::anyhow!("replay thread panicked"))?
        .context("replay")?;
    let s = &out.summary;
    // Not the 100% sample: a run shorter than the interval has only that
    // one, and its growth would read 1.0.
    let rss_at_20_kib = samples
        .iter()
        .find(|s| s.answered >= twenty && s.answered < args.requests)
        .map(|s| s.rss_kib)
        .context(
            "no sample between 20% and 100% of the requests: the run was too short to sample; \
             raise --requests",
        )?;
    let rss_at_100_kib = at_100.context("the job ended before answering every request")?;
    Ok(MemoryBench {
        requests: s.requests_in,
        distinct_users,
        workers: args.workers,
        wall_s: s.wall_s,
        throughput_rps: s.throughput_rps,
        rss_before_kib,
        rss_at_20_kib,
        rss_at_100_kib,
        growth_ratio: rss_at_100_kib as f64 / rss_at_20_kib as f64,
        rss_peak_kib: samples.iter().map(|s| s.rss_kib).max().unwrap_or(0),
        affinity_evictions: s.router.affinity_evictions,
        hotness_evictions: s.router.hotness_evictions,
        user_head_evictions: s.nodes.iter().map(|n| n.user_head_evictions).sum(),
        errors: s.errors,
        gemm_gflops,
        samples,
    })
}

/// Resident memory of this process, from /proc/self/status (Linux).
fn vm_rss_kib() -> anyhow::Result<u64> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .context("no VmRSS in /proc/self/status")
}
