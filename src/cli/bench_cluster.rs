//! `grflow bench cluster`: `--speed max` throughput in `arrival` mode of
//! one process with one worker, one process with two workers, and two
//! processes of one worker each (timely's cluster mode on loopback), in one
//! run on the same trace. Each job is a `grflow replay` child process of
//! this binary; throughput is responses / wall time from process 0's summary.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

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
    // Before measuring: a bad --out must not cost the whole run.
    if let Some(out) = &args.out {
        super::check_out_dir(out)?;
    }
    let started = std::time::Instant::now();
    let dir = std::env::temp_dir().join(format!("grflow-bench-cluster-{}", std::process::id()));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = measure(&args, &dir, started);
    let _ = std::fs::remove_dir_all(&dir);
    let bench = result?;

    // Printed first, so that a failed write does not lose the figures.
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
    if let Some(out) = &args.out {
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let path = out.join("bench.json");
        super::bench_serve::write_file(&path, serde_json::to_string_pretty(&bench)?)?;
        eprintln!("wrote {}", path.display());
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
    std::fs::write(&hosts, text).with_context(|| format!("writing {}", hosts.display()))?;
    let mut follower = replay(config, 1)?;
    follower
        .arg("--hostfile")
        .arg(&hosts)
        .args(["--process", "1"])
        .stdout(Stdio::null());
    let mut leader = replay(config, 1)?;
    leader
        .arg("--hostfile")
        .arg(&hosts)
        .args(["--process", "0"]);
    let leader = run_pair(leader, follower, FOLLOWER_GRACE)?;
    job(&leader, 2, 1)
}

/// How long the second process of a pair may run on after the first ended
/// (either way round) before it is killed and the job reported as failed.
const FOLLOWER_GRACE: Duration = Duration::from_secs(60);

/// A child process whose piped output is drained by threads (so that a full
/// pipe cannot block it), killed and reaped when dropped unless it exited:
/// an error on any path leaves no process behind.
struct Running {
    name: &'static str,
    child: Child,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
}

impl Running {
    fn spawn(name: &'static str, mut cmd: Command) -> anyhow::Result<Self> {
        let mut child = cmd
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        fn drain(pipe: Option<impl Read + Send + 'static>) -> Option<JoinHandle<Vec<u8>>> {
            pipe.map(|mut p| {
                std::thread::spawn(move || {
                    let mut bytes = Vec::new();
                    let _ = p.read_to_end(&mut bytes);
                    bytes
                })
            })
        }
        let stdout = drain(child.stdout.take());
        let stderr = drain(child.stderr.take());
        Ok(Self {
            name,
            child,
            stdout,
            stderr,
        })
    }

    fn try_wait(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        self.child
            .try_wait()
            .with_context(|| format!("waiting for {}", self.name))
    }

    /// Its output, once it has exited (`status` from `try_wait`).
    fn output(mut self, status: ExitStatus) -> std::process::Output {
        let join =
            |h: Option<JoinHandle<Vec<u8>>>| h.and_then(|h| h.join().ok()).unwrap_or_default();
        std::process::Output {
            status,
            stdout: join(self.stdout.take()),
            stderr: join(self.stderr.take()),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs the two processes of a cluster job: the follower (process 1)
/// first, then the leader (process 0, whose stdout is piped). Fails with
/// the stderr of whichever fails first (the other is killed), and when one
/// is still running `grace` after the other exited. The leader's output
/// when both succeed.
fn run_pair(
    mut leader: Command,
    follower: Command,
    grace: Duration,
) -> anyhow::Result<std::process::Output> {
    let mut follower = Running::spawn("process 1", follower)?;
    leader.stdout(Stdio::piped());
    let mut leader = Running::spawn("process 0", leader)?;
    let mut first_exit: Option<Instant> = None;
    let (mut leader_status, mut follower_status) = (None, None);
    loop {
        if leader_status.is_none() {
            leader_status = leader.try_wait()?;
        }
        if follower_status.is_none() {
            follower_status = follower.try_wait()?;
        }
        // The leader's failure first: it is the one the report is about.
        for (status, p) in [
            (leader_status, &mut leader),
            (follower_status, &mut follower),
        ] {
            if let Some(status) = status.filter(|s| !s.success()) {
                let name = p.name;
                // Dropping `p` would not kill it (it exited); the other
                // one is killed when this returns.
                let err = std::mem::take(&mut p.stderr)
                    .and_then(|h| h.join().ok())
                    .unwrap_or_default();
                anyhow::bail!(
                    "{name} of the 2-process job failed ({status}): {}",
                    String::from_utf8_lossy(&err).trim_end()
                );
            }
        }
        match (leader_status, follower_status) {
            (Some(l), Some(_)) => return Ok(leader.output(l)),
            (None, None) => {}
            _ => {
                let since = *first_exit.get_or_insert_with(Instant::now);
                if since.elapsed() > grace {
                    let (done, late) = if leader_status.is_some() {
                        ("process 0", "process 1")
                    } else {
                        ("process 1", "process 0")
                    };
                    // Both are dropped (the late one killed) on return.
                    anyhow::bail!(
                        "{late} of the 2-process job was still running {} s after {done} exited; killed it",
                        grace.as_secs()
                    );
                }
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn sh(script: &str) -> Command {
        let mut c = Command::new("sh");
        c.args(["-c", script]).stdin(Stdio::null());
        c
    }

    /// A child that writes its pid to a file and sleeps 10 minutes; the
    /// file's path and a reader of the pid.
    fn sleeper(name: &str) -> (Command, impl Fn() -> u32) {
        let path = std::env::temp_dir().join(format!(
            "grflow-bench-cluster-test-{}-{name}",
            std::process::id()
        ));
        let cmd = sh(&format!("echo $$ > {}; exec sleep 600", path.display()));
        let pid = move || {
            let pid = std::fs::read_to_string(&path)
                .unwrap()
                .trim()
                .parse()
                .unwrap();
            let _ = std::fs::remove_file(&path);
            pid
        };
        (cmd, pid)
    }

    /// Whether process `pid` still exists (a reaped child does not).
    fn alive(pid: u32) -> bool {
        Path::new(&format!("/proc/{pid}")).exists()
    }

    #[test]
    fn a_failing_leader_is_reported_and_the_follower_killed() {
        let (follower, pid) = sleeper("follower");
        let started = Instant::now();
        // The follower has written its pid before the leader fails.
        let leader = sh("sleep 0.3; echo leader broke >&2; exit 3");
        let err = run_pair(leader, follower, Duration::from_secs(600))
            .unwrap_err()
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(
            err.contains("process 0") && err.contains("leader broke"),
            "{err}"
        );
        let pid = pid();
        assert!(!alive(pid), "process 1 ({pid}) was left running");
    }

    #[test]
    fn a_failing_follower_is_reported_and_the_leader_killed() {
        let (leader, pid) = sleeper("leader");
        let started = Instant::now();
        let follower = sh("sleep 0.3; echo follower broke >&2; exit 4");
        let err = run_pair(leader, follower, Duration::from_secs(600))
            .unwrap_err()
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(
            err.contains("process 1") && err.contains("follower broke"),
            "{err}"
        );
        let pid = pid();
        assert!(!alive(pid), "process 0 ({pid}) was left running");
    }

    #[test]
    fn a_follower_that_outlives_the_leader_by_the_grace_is_killed() {
        let (follower, pid) = sleeper("late");
        let started = Instant::now();
        let err = run_pair(sh("echo summary"), follower, Duration::from_millis(500))
            .unwrap_err()
            .to_string();
        assert!(started.elapsed() < Duration::from_secs(10));
        assert!(
            err.contains("process 1") && err.contains("still running"),
            "{err}"
        );
        let pid = pid();
        assert!(!alive(pid), "process 1 ({pid}) was left running");
    }

    #[test]
    fn both_succeeding_give_the_leaders_output_even_when_stderr_is_large() {
        // 1 MiB of stderr from each: more than a pipe holds.
        let noisy = "head -c 1048576 /dev/zero >&2";
        let out = run_pair(
            sh(&format!("{noisy}; echo summary")),
            sh(noisy),
            Duration::from_secs(30),
        )
        .unwrap();
        assert!(out.status.success());
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "summary");
        assert_eq!(out.stderr.len(), 1 << 20);
    }
}
