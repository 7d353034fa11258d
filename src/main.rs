//! The `grflow` command line. Everything here is argument parsing and
//! wiring; the engine lives in the workspace crates.

mod cli;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "grflow",
    version,
    about = "A streaming engine that serves generative recommenders"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Replay a Parquet trace (or the embedded default) through the serving dataflow.
    Replay(cli::replay::Args),
    /// Serve requests from a Kafka topic until SIGINT/SIGTERM (configs/kafka.toml).
    Serve(cli::serve::Args),
    /// Send a trace's requests to a `serve` job's request topic, paced; with --answers, read the answers back.
    Send(cli::send::Args),
    /// Generate a synthetic trace (Steady / Trend / Burst regimes of HLEM §V).
    GenTrace(cli::gen_trace::Args),
    /// Convert a public dataset into a grflow trace.
    Import(cli::import::Args),
    /// Train the GR transformer on a trace's user sequences; writes a model directory.
    Train(cli::train::Args),
    /// Evaluate a trained model (SASRec's sampled-100 protocol) beside a popularity baseline.
    Eval(cli::eval::Args),
    /// Train the allocator's PPO base policy on the virtual clock; writes a safetensors file.
    TrainAllocator(cli::train_allocator::Args),
    /// Fit the virtual clock's cost model (`--clock virtual`) on this machine.
    Calibrate(cli::calibrate::Args),
    /// Benchmarks.
    #[command(subcommand)]
    Bench(BenchCommand),
}

#[derive(Subcommand, Debug)]
enum BenchCommand {
    /// Model kernels: GEMM peak, prefill, prefix reuse, staged attention, beam KV, top-k.
    Kernels(cli::bench_kernels::Args),
    /// Eviction policies on the key stream of a real trace.
    Cache(cli::bench_cache::Args),
    /// The same trace through a Kafka broker and replayed from Parquet.
    Kafka(cli::bench_kafka::Args),
    /// Resident memory over a long replay from many users (bounded per-user state).
    Memory(cli::bench_memory::Args),
    /// Goodput under a latency SLO, one request per model call vs batched.
    Serve(cli::bench_serve::Args),
    /// Allocator policies per regime on the virtual clock (and a static-alpha sweep).
    Allocator(cli::bench_allocator::Args),
    /// Throughput of 2 processes × 1 worker (cluster mode) vs 1 × 1 and 1 × 2.
    Cluster(cli::bench_cluster::Args),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // A long-lived job reports its metrics at info; one-shot commands stay quiet.
    cli::init_tracing(match cli.command {
        Command::Serve(_) => "info",
        _ => "warn",
    });
    let result = match cli.command {
        Command::Replay(a) => cli::replay::run(a),
        Command::Calibrate(a) => cli::calibrate::run(a),
        Command::Serve(a) => cli::serve::run(a),
        Command::Send(a) => cli::send::run(a),
        Command::GenTrace(a) => cli::gen_trace::run(a),
        Command::Import(a) => cli::import::run(a),
        Command::Train(a) => cli::train::run(a),
        Command::TrainAllocator(a) => cli::train_allocator::run(a),
        Command::Eval(a) => cli::eval::run(a),
        Command::Bench(BenchCommand::Kernels(a)) => cli::bench_kernels::run(a),
        Command::Bench(BenchCommand::Cache(a)) => cli::bench_cache::run(a),
        Command::Bench(BenchCommand::Kafka(a)) => cli::bench_kafka::run(a),
        Command::Bench(BenchCommand::Memory(a)) => cli::bench_memory::run(a),
        Command::Bench(BenchCommand::Serve(a)) => cli::bench_serve::run(a),
        Command::Bench(BenchCommand::Allocator(a)) => cli::bench_allocator::run(a),
        Command::Bench(BenchCommand::Cluster(a)) => cli::bench_cluster::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            if let Some(stopped) = err.downcast_ref::<cli::StoppedBySignal>() {
                // The command said what it did before it stopped.
                return ExitCode::from(stopped.exit_code());
            }
            eprintln!("error: {err:#}");
            if err.downcast_ref::<cli::InputError>().is_some() {
                ExitCode::from(2)
            } else {
                ExitCode::from(1)
            }
        }
    }
}
