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
    /// When the last request was answered, before the job's state is
    /// freed: see [`Sampling::look`].
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
    let mut sampling = Sampling::new(args.requests, Duration::from_secs_f64(args.interval_s));
    while !job.is_finished() {
        std::thread::sleep(POLL);
        if let Some(s) = sampling.look(start.elapsed(), answered(), vm_rss_kib)? {
            // Progress of a long soak, on stderr beside the JSON on stdout.
            eprintln!(
                "  {:>8.1} s {:>9} answered {:>9} KiB resident",
                s.wall_s, s.answered, s.rss_kib
            );
        }
    }
    let out = job
        .join()
        .map_err(|_| anyhow::anyhow!("replay thread panicked"))?
        .context("replay")?;
    let s = &out.summary;
    let rss_at_100_kib = sampling.at_100(answered()).context(
        "the job ended before answering every request, or before its first sample: \
         raise --requests",
    )?;
    let samples = sampling.samples;
    let twenty = args.requests.div_ceil(5);
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

/// What the sampler makes of its looks at the answered count, apart from
/// reading memory: which become samples, and which reading stands for 100%.
#[derive(Debug)]
struct Sampling {
    requests: u64,
    twenty: u64,
    interval: Duration,
    /// When the next periodic sample is due, since the start.
    next_sample: Duration,
    at_20_taken: bool,
    /// The latest reading while requests were still unanswered: the job
    /// surely held its state then (it frees it only after the last answer).
    before_last: Option<u64>,
    at_100: Option<u64>,
    samples: Vec<Sample>,
}

impl Sampling {
    fn new(requests: u64, interval: Duration) -> Self {
        Self {
            requests,
            twenty: requests.div_ceil(5),
            interval,
            next_sample: interval,
            at_20_taken: false,
            before_last: None,
            at_100: None,
            samples: Vec::new(),
        }
    }

    /// One look, `elapsed` after the start, with `done` requests answered;
    /// `rss` reads resident memory (KiB). Returns the sample it took, if
    /// any: every `interval`, once at 20% and once at 100%.
    ///
    /// Memory is read at every look until the last answer, so the 100%
    /// figure is the larger of the last reading before it (one look, 10 ms,
    /// earlier) and the first after it. The look after it alone may fall
    /// in the job's teardown and measure memory already freed; the replay
    /// may even end between two looks, and then the reading before stands.
    fn look(
        &mut self,
        elapsed: Duration,
        done: u64,
        rss: impl FnOnce() -> anyhow::Result<u64>,
    ) -> anyhow::Result<Option<&Sample>> {
        let running = self.at_100.is_none() && done < self.requests;
        let last = self.at_100.is_none() && done >= self.requests;
        // The 20% one as soon as 20% are answered (unless the look missed
        // the stretch between 20% and 100%: then there is none).
        let first_20 = !self.at_20_taken && done >= self.twenty && done < self.requests;
        self.at_20_taken |= first_20;
        let due = elapsed >= self.next_sample;
        if due {
            self.next_sample += self.interval;
        }
        if !(running || last || due) {
            return Ok(None);
        }
        let rss_kib = rss()?;
        if running {
            self.before_last = Some(rss_kib);
        }
        if last {
            self.at_100 = Some(self.before_last.map_or(rss_kib, |b| b.max(rss_kib)));
        }
        if !(due || first_20 || last) {
            return Ok(None);
        }
        self.samples.push(Sample {
            wall_s: elapsed.as_secs_f64(),
            answered: done,
            rss_kib,
        });
        Ok(self.samples.last())
    }

    /// The 100% figure once the job ended with `done` answered; `None` if
    /// it did not answer every request or ended before the first look.
    fn at_100(&self, done: u64) -> Option<u64> {
        self.at_100
            .or(self.before_last.filter(|_| done >= self.requests))
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(10);

    /// Looks at `done` answered with `kib` resident, one poll apart.
    fn looks(sampling: &mut Sampling, looks: &[(u64, u64)]) {
        for (i, &(done, kib)) in looks.iter().enumerate() {
            sampling
                .look(MS * (i as u32 + 1), done, || Ok(kib))
                .unwrap();
        }
    }

    #[test]
    fn the_100_percent_figure_is_not_read_in_the_teardown() {
        let mut sampling = Sampling::new(100, Duration::from_secs(1_000));
        // 20% at 1200 KiB, 1300 KiB just before the end; the look after the
        // last answer finds the job's state freed.
        looks(
            &mut sampling,
            &[(0, 1_000), (30, 1_200), (99, 1_300), (100, 400), (100, 300)],
        );
        assert_eq!(sampling.at_100(100), Some(1_300));
        // The log has the 20% and 100% samples as read, nothing after.
        let logged: Vec<(u64, u64)> = sampling
            .samples
            .iter()
            .map(|s| (s.answered, s.rss_kib))
            .collect();
        assert_eq!(logged, [(30, 1_200), (100, 400)]);
    }

    #[test]
    fn the_first_reading_after_the_last_answer_counts_when_it_is_higher() {
        let mut sampling = Sampling::new(100, Duration::from_secs(1_000));
        looks(&mut sampling, &[(50, 1_000), (99, 1_100), (100, 1_150)]);
        assert_eq!(sampling.at_100(100), Some(1_150));
    }

    #[test]
    fn a_job_that_ends_between_two_looks_keeps_the_reading_before() {
        let mut sampling = Sampling::new(100, Duration::from_secs(1_000));
        looks(&mut sampling, &[(30, 1_200), (99, 1_300)]);
        assert_eq!(sampling.at_100(100), Some(1_300));
        // Unless it did not answer everything, or ended before any look.
        assert_eq!(sampling.at_100(99), None);
        assert_eq!(Sampling::new(100, Duration::from_secs(1)).at_100(100), None);
    }

    #[test]
    fn samples_are_logged_every_interval_and_at_20_and_100_percent() {
        let mut sampling = Sampling::new(100, MS * 2);
        looks(
            &mut sampling,
            &[
                (0, 1),
                (10, 2),
                (25, 3),
                (40, 4),
                (100, 5),
                (100, 6),
                (100, 7),
            ],
        );
        let logged: Vec<u64> = sampling.samples.iter().map(|s| s.rss_kib).collect();
        // Due at 20, 40, 60 ms; 20% at the 3rd look, 100% at the 5th.
        assert_eq!(logged, [2, 3, 4, 5, 6]);
    }
}
