//! Time of one learned allocator decision, warm (a tight loop), cold
//! (8 MiB of other memory touched before each decision, as serving work
//! does between two closed windows) and colder (64 MiB, past a 32 MiB
//! shared L3):
//! `cargo run --release -p grflow-operators --example allocator_decision
//! [POLICY_FILE]`. For `smart` it also times the adapter's update that
//! follows each decision once the update's 1K buffer is full. A run's
//! `decision_us_*` are measured between real serving work.

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
    for (caches, touched_mib, decisions) in
        [("warm", 0, 2_000), ("cold", 8, 2_000), ("64 MiB", 64, 300)]
    {
        let mut other = vec![0u64; touched_mib << 17];
        let cold = touched_mib > 0;
        for smart in [false, true] {
            let mut learned = Learned::new(policy.clone(), 1024, 3.0, smart, false, 7);
            let mut us = Vec::with_capacity(decisions);
            let mut moved = 0.0;
            // The adapter's updates once its 1K buffer is full.
            let mut update_us = Vec::new();
            for i in 0..decisions {
                let w = WindowStats {
                    requests: 100,
                    failed: 0,
                    hot_user_share: 0.3,
                    emb_hit_rate: 0.8,
                    kv_hit_rate: 0.5,
                    mean_seq_len: 256.0,
                    slo_violation_share: 0.0,
                    p99_ms: 2.0 + (i % 7) as f64 * 0.1,
                    alpha: 0.3,
                    truncated_share: 0.0,
                    alpha_end: None,
                    pinned_end: false,
                    p99_scaled_ms: None,
                };
                if cold {
                    other.iter_mut().for_each(|v| *v = v.wrapping_add(i as u64));
                }
                let started = Instant::now();
                moved += learned.decide(&w, 0.3);
                us.push(started.elapsed().as_secs_f64() * 1e6);
                // The adapter's update runs after the decision, timed apart.
                let started = Instant::now();
                learned.learn();
                if i >= 1_000 {
                    update_us.push(started.elapsed().as_secs_f64() * 1e6);
                }
            }
            std::hint::black_box(&other);
            us.sort_by(f64::total_cmp);
            let name = if smart { "smart" } else { "ppo-only" };
            println!(
                "{name} ({caches}): mean {:.2} us, p99 {:.2} us per decision (sum of moves {moved:.3})",
                us.iter().sum::<f64>() / us.len() as f64,
                us[us.len() * 99 / 100],
            );
            if smart && !update_us.is_empty() {
                println!(
                    "  adapter update after it, full buffer: mean {:.0} us",
                    update_us.iter().sum::<f64>() / update_us.len() as f64
                );
            }
        }
    }
}
