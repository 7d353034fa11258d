//! Runs the cache bench on a key file of one u64 per line (or the built-in
//! synthetic trace): `cargo run --release -p grflow-operators --example
//! cache_bench -- KEYS_FILE [ratios] [policies] [noise]`. The `grflow bench
//! cache` command is the product entry point; this example drives the same
//! logic without the CLI crate.

use grflow_operators::cachebench::{BenchConfig, run};
use grflow_operators::eviction::PolicyName;

fn list<T>(arg: Option<&String>, parse: impl Fn(&str) -> T) -> Option<Vec<T>> {
    arg.map(|s| s.split(',').map(|x| parse(x.trim())).collect())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(path) = args.first() else {
        eprintln!("usage: cache_bench KEYS_FILE [ratios] [policies] [noise]");
        std::process::exit(2);
    };
    let keys: Vec<u64> = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{path}: {e}"))
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            l.trim()
                .parse()
                .unwrap_or_else(|_| panic!("{path}: bad key {l:?}"))
        })
        .collect();
    let mut cfg = BenchConfig::default();
    if let Some(r) = list(args.get(1), |x| x.parse::<f64>().expect("ratio")) {
        cfg.ratios = r;
    }
    if let Some(p) = list(args.get(2), |x| PolicyName::parse(x).expect("policy")) {
        cfg.policies = p;
    }
    if let Some(n) = list(args.get(3), |x| x.parse::<f64>().expect("noise")) {
        cfg.noise = n;
    }
    let rows = run(path, keys, &cfg);
    println!(
        "{}",
        serde_json::to_string_pretty(&rows).expect("rows serialize")
    );
}
