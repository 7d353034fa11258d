//! `cargo run --release -p grflow-kernels --example bench [threads]`: the
//! same measurements as `grflow bench kernels --json`, without the binary.
fn main() {
    let threads = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1);
    let opts = grflow_kernels::bench::BenchOptions {
        threads,
        ..Default::default()
    };
    match grflow_kernels::bench::run(&opts) {
        Ok(report) => println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("report serialises")
        ),
        Err(e) => {
            eprintln!("bench failed: {e}");
            std::process::exit(1);
        }
    }
}
