//! `grflow bench cluster`: `--speed max` throughput in `arrival` mode of
//! one process with one worker, one process with two workers, and two
//! processes of one worker each (timely's cluster mode on loopback), in one
//! run on the same trace. Each job is a `grflow replay` child process of
//! this binary; throughput is responses / wall time from process 0's summary.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::Context;
use grflow_kernels::bench::gemm_peak_gflops;
use grflow_pipeline::{Clock, Config, ReleaseSetting};
use serde::Serialize;
use serde_json::Value;

use super::InputError;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Model preset: small | hstu-3l | hstu-6l.
    #[arg(long, default_value = "hstu-3l")]
    pub preset: String,
    /// Requests of the trace each job replays.
    #[arg(long, default_value_t = 600)]
    pub requests: u64,
    /// Share of generative-retrieval requests in the trace.
    #[arg(long, default_value_t = 0.2)]
    pub retrieve_share: f64,
    /// `run.max_ahead_ms` of every job: how far (event ms) the source may
    /// run ahead of the oldest unanswered request. The default config's
    /// 2,000 idles nodes with hstu-3l (a slow retrieve request holds the
    /// frontier back), the more so across processes, where the frontier
    /// moves with the network's progress messages.
    #[arg(long, default_value_t = 5_000)]
    pub max_ahead_ms: u64,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
    /// Write bench.json here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct Job {
    processes: usize,
    workers_per_process: usize,
    throughput_rps: f64,
    wall_s: f64,
    /// Responses per node: how evenly the router spread the work.
    responses_per_node: Vec<u64>,
}

#[derive(Debug, Serialize)]
struct ClusterBench {
    preset: String,
    requests: u64,
    max_ahead_ms: u64,
    gemm_gflops: f64,
    one_process_one_worker: Job,
    one_process_two_workers: Job,
    two_processes_one_worker: Job,
    /// Two processes × one worker over one × one (target ≥ 1.7 on 2 cores).
    ratio_2x1_over_1x1: f64,
    /// Two processes × one worker over one process × two workers.
    ratio_2x1_over_1x2: f64,
    wall_s: f64,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    if args.requests == 0 {
        return Err(InputError::from_display("--requests must be > 0"));
    }
    if grflow_kernels::ModelConfig::preset(&args.preset).is_none() {
        return Err(InputError::from_display(format!(
            "--preset {:?} is not one of {:?}",
            args.preset,
            grflow_kernels::ModelConfig::PRESETS
        )));
    }
    if !(0.0..=1.0).contains(&args.retrieve_share) {
        return Err(InputError::from_display(
            "--retrieve-share must be in 0..=1",
        ));
    }
    let started = std::time::Instant::now();
    let dir = std::env::temp_dir().join(format!("grflow-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = measure(&args, &dir, started);
    let _ = std::fs::remove_dir_all(&dir);
    let bench = result?;

    if let Some(out) = &args.out {
        std::fs::create_dir_all(out)?;
        std::fs::write(
            out.join("bench.json"),
            serde_json::to_string_pretty(&bench)?,
        )?;
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        println!(
            "bench cluster: {} requests, preset {}, GEMM {:.1} GFLOP/s (one core)",
            bench.requests, bench.preset, bench.gemm_gflops
        );
        for (name, job) in [
            ("1 process × 1 worker ", &bench.one_process_one_worker),
            ("1 process × 2 workers", &bench.one_process_two_workers),
            ("2 processes × 1 worker", &bench.two_processes_one_worker),
        ] {
            println!(
                "  {name}: {:7.1} req/s  ({:.1} s; per node {:?})",
                job.throughput_rps, job.wall_s, job.responses_per_node
            );
        }
        println!(
            "  2×1 / 1×1 = {:.2}   2×1 / 1×2 = {:.2}   ({:.0} s)",
            bench.ratio_2x1_over_1x1, bench.ratio_2x1_over_1x2, bench.wall_s
        );
    }
    Ok(())
}

fn measure(args: &Args, dir: &Path, started: std::time::Instant) -> anyhow::Result<ClusterBench> {
    let gemm_gflops = gemm_peak_gflops();
    let mut config = Config::embedded();
    config.model.preset = args.preset.clone();
    config.run.speed = "max".into();
    config.run.max_ahead_ms = args.max_ahead_ms;
    config.run.clock = Clock::Wall;
    config.run.release = ReleaseSetting::Arrival;
    config.trace.requests = args.requests;
    config.trace.retrieve_share = args.retrieve_share;
    config.trace.regime = "steady".into();
    let path = dir.join("bench.toml");
    std::fs::write(
        &path,
        toml::to_string(&config).context("writing the bench config")?,
    )?;

    let one_one = one_process(&path, 1)?;
    let one_two = one_process(&path, 2)?;
    let two_one = two_processes(&path, dir)?;
    let ratio = |a: &Job, b: &Job| a.throughput_rps / b.throughput_rps.max(1e-9);
    Ok(ClusterBench {
        preset: args.preset.clone(),
        requests: args.requests,
        max_ahead_ms: args.max_ahead_ms,
        gemm_gflops,
        ratio_2x1_over_1x1: ratio(&two_one, &one_one),
        ratio_2x1_over_1x2: ratio(&two_one, &one_two),
        one_process_one_worker: one_one,
        one_process_two_workers: one_two,
        two_processes_one_worker: two_one,
        wall_s: started.elapsed().as_secs_f64(),
    })
}

fn replay(config: &Path, workers: usize) -> anyhow::Result<Command> {
    let mut cmd = Command::new(std::env::current_exe().context("finding this binary")?);
    cmd.args([
        "replay",
        "--quiet",
        "--json",
        "--metrics-addr",
        "none",
        "--config",
    ])
    .arg(config)
    .args(["--workers", &workers.to_string()])
    .stdin(Stdio::null());
    Ok(cmd)
}

fn one_process(config: &Path, workers: usize) -> anyhow::Result<Job> {
    let out = replay(config, workers)?.output()?;
    job(&out, 1, workers)
}

fn two_processes(config: &Path, dir: &Path) -> anyhow::Result<Job> {
    let ports: Vec<_> = (0..2)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<_, _>>()?;
    let hosts = dir.join("hosts");
    let mut text = String::new();
    for l in &ports {
        text.push_str(&format!("127.0.0.1:{}\n", l.local_addr()?.port()));
    }
    drop(ports);
    std::fs::write(&hosts, text)?;
    let follower = replay(config, 1)?
        .arg("--hostfile")
        .arg(&hosts)
        .args(["--process", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()?;
    let leader = replay(config, 1)?
        .arg("--hostfile")
        .arg(&hosts)
        .args(["--process", "0"])
        .output()?;
    let follower = follower.wait_with_output()?;
    if !follower.status.success() {
        anyhow::bail!(
            "process 1 failed ({}): {}",
            follower.status,
            String::from_utf8_lossy(&follower.stderr)
        );
    }
    job(&leader, 2, 1)
}

fn job(out: &std::process::Output, processes: usize, workers: usize) -> anyhow::Result<Job> {
    if !out.status.success() {
        anyhow::bail!(
            "replay ({processes} × {workers}) failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let s: Value = serde_json::from_slice(&out.stdout).context("replay summary JSON")?;
    let n = |k: &str| s[k].as_f64().unwrap_or(0.0);
    let answered = n("responses_out");
    if answered as u64 != s["requests_in"].as_u64().unwrap_or(0) {
        anyhow::bail!("replay ({processes} × {workers}) left requests unanswered: {s}");
    }
    Ok(Job {
        processes,
        workers_per_process: workers,
        throughput_rps: answered / n("wall_s").max(1e-9),
        wall_s: n("wall_s"),
        responses_per_node: s["nodes"]
            .as_array()
            .map(|nodes| {
                nodes
                    .iter()
                    .map(|n| n["responses_out"].as_u64().unwrap_or(0))
                    .collect()
            })
            .unwrap_or_default(),
    })
}
