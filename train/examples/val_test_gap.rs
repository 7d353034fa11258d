//! Validation against test questions of a checkpoint's best weights over
//! every user, through the served path (the figures behind README's
//! "the last item is harder to predict"):
//!
//! cargo run --release -p grflow-train --example val_test_gap -- TRACE CHECKPOINT
//!
//! Prints sampled-100 HR@10 / NDCG@10 for the validation items, the test
//! items, and the test items with the validation item removed from the
//! history (a question two steps ahead).

use std::path::Path;

use grflow_train::checkpoint::Checkpoint;
use grflow_train::data::{Dataset, eval_question};
use grflow_train::eval::{EvalOptions, Served, score_served, test_questions};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, trace, checkpoint] = &args[..] else {
        return Err("usage: val_test_gap TRACE CHECKPOINT".into());
    };
    let data = Dataset::from_trace(Path::new(trace))?;
    let ck = Checkpoint::load(Path::new(checkpoint))?;
    let max_history = ck.state.config.max_history;
    let block_size = ck.best.cfg.block_size;
    let opts = EvalOptions::default();
    let mut served = Served::new(&ck.best, max_history)?;
    let question = |history: &[u32], target, user, seed| {
        eval_question(
            user,
            history,
            target,
            data.n_items,
            grflow_kernels::history::HistoryCut::new(max_history, block_size),
            opts.negatives,
            seed,
        )
    };
    let mut valid = Vec::new();
    let mut ahead = Vec::new();
    for (u, user) in data.users.iter().enumerate() {
        if let (Some((h, t)), Some((_, test))) = (user.valid(), user.test()) {
            valid.push((u, question(h, t, user, opts.seed ^ 1)));
            ahead.push((u, question(h, test, user, opts.seed)));
        }
    }
    let test = test_questions(&data, max_history, block_size, &opts);
    for (name, qs) in [
        ("valid", &valid),
        ("test", &test),
        ("test without the valid item", &ahead),
    ] {
        let (m, _) = score_served(&mut served, qs, &mut |_| {})?;
        println!(
            "{name}: {} users, HR@10 {:.4}, NDCG@10 {:.4}",
            qs.len(),
            m.hr_at_10,
            m.ndcg_at_10
        );
    }
    Ok(())
}
