//! Time of one learned allocator decision in a tight loop (warm caches):
//! `cargo run --release -p grflow-operators --example allocator_decision
//! [POLICY_FILE]`. A run's `decision_us_*` are measured between serving
//! work, with colder caches.

use std::sync::Arc;
use std::time::Instant;

use grflow_operators::allocator::Learned;
use grflow_operators::allocator::ppo::ActorCritic;
use grflow_operators::windows::WindowStats;

fn main() {
    let path = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "configs/allocator-ppo.safetensors".into());
    let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("reading {path}: {e}"));
    let policy = Arc::new(ActorCritic::from_safetensors(&bytes).expect("a policy file"));
    let decisions = 2_000;
    for smart in [false, true] {
        let mut learned = Learned::new(policy.clone(), 1024, 3.0, smart, false, 7);
        let mut spent = std::time::Duration::ZERO;
        let mut moved = 0.0;
        for i in 0..decisions {
            let w = WindowStats {
                requests: 100,
                hot_user_share: 0.3,
                emb_hit_rate: 0.8,
                kv_hit_rate: 0.5,
                mean_seq_len: 256.0,
                slo_violation_share: 0.0,
                p99_ms: 2.0 + (i % 7) as f64 * 0.1,
                alpha: 0.3,
                truncated_share: 0.0,
            };
            let started = Instant::now();
            moved += learned.decide(&w, 0.3);
            spent += started.elapsed();
            // The adapter's update runs after the decision, untimed.
            learned.learn();
        }
        let name = if smart { "smart" } else { "ppo-only" };
        println!(
            "{name}: {:.2} us per decision (sum of moves {moved:.3})",
            spent.as_secs_f64() * 1e6 / decisions as f64
        );
    }
}
