//! The predictor never sees the future: two traces equal up to position t
//! give identical features, model versions and predictions up to t.

use grflow_operators::predictor::{
    AccessContext, GbdtConfig, OnlinePredictor, PredictorConfig, Training,
};

fn trace(n: usize, seed: u64) -> Vec<u64> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            ((x >> 33) % 97) * ((x >> 20) % 3 + 1)
        })
        .collect()
}

fn predictions(keys: &[u64]) -> Vec<Option<f64>> {
    let cfg = PredictorConfig {
        retrain_every: 200,
        window: 1_000,
        gbdt: GbdtConfig {
            trees: 8,
            ..GbdtConfig::default()
        },
        training: Training::Inline { lag: 50 },
    };
    let mut p = OnlinePredictor::new(cfg);
    keys.iter()
        .enumerate()
        .map(|(t, &k)| {
            // Requests of 4 keys: the context is part of what is observed.
            let row = p.observe(k, t as u64, AccessContext::block(t % 4, 4));
            p.predict_next(&[row], &[t as u64]).map(|v| v[0])
        })
        .collect()
}

#[test]
fn changing_the_trace_after_t_leaves_predictions_up_to_t_unchanged() {
    let t = 1_500;
    let a = trace(2_500, 1);
    let mut b = a.clone();
    b[t + 1..].copy_from_slice(&trace(2_500 - t - 1, 99));
    let (pa, pb) = (predictions(&a), predictions(&b));
    assert_eq!(pa[..=t], pb[..=t]);
    assert!(
        pa[..=t].iter().filter(|p| p.is_some()).count() > 1_000,
        "models were trained and used"
    );
    assert_ne!(
        pa[t + 1..],
        pb[t + 1..],
        "the futures differ, so later predictions may too"
    );
}
