//! The comparison helpers of `common` fail on NaN and on mismatched
//! lengths, so a kernel that outputs NaN or too few values cannot pass a
//! `<= TOL` check.

mod common;

use common::{Pool, kv_diff, max_diff, nan_max, rng, small_model};
use grflow_kernels::{KvBlockStore, kv_row};

#[test]
fn max_diff_reports_the_largest_difference() {
    assert_eq!(max_diff(&[1.0, 2.0, 3.0], &[1.5, 2.0, 1.0]), 2.0);
    assert_eq!(max_diff(&[], &[]), 0.0);
}

#[test]
fn max_diff_of_a_nan_fails_a_tolerance_check() {
    for (a, b) in [
        (vec![f32::NAN, 1.0, 1.0], vec![1.0; 3]),
        (vec![1.0, 1.0, 1.0], vec![1.0, f32::NAN, 5.0]),
        (vec![1.0, 5.0, f32::NAN], vec![1.0; 3]),
        (vec![f32::INFINITY], vec![f32::INFINITY]),
    ] {
        let d = max_diff(&a, &b);
        let passes = d <= 1e-3;
        assert!(!passes, "{a:?} vs {b:?} passed with {d}");
    }
}

#[test]
#[should_panic(expected = "differ in length")]
fn max_diff_of_a_short_slice_panics() {
    max_diff(&[1.0, 2.0], &[1.0, 2.0, 3.0]);
}

#[test]
fn nan_max_keeps_a_nan_from_either_side() {
    assert!(nan_max(f32::NAN, 1.0).is_nan());
    assert!(nan_max(1.0, f32::NAN).is_nan());
    assert_eq!(nan_max(1.0, 2.0), 2.0);
}

#[test]
fn kv_diff_of_a_nan_in_the_store_fails_a_tolerance_check() {
    let cfg = small_model(1).config().clone();
    let d = cfg.d_model;
    let zeros = vec![vec![0f32; d]; cfg.n_layers];
    let mut pool = Pool::new(&cfg, 1, &mut rng(1));
    let table = pool.alloc(1);
    assert_eq!(
        kv_diff(&cfg, &pool.store, &table, 1, &zeros, &zeros, 0),
        0.0
    );

    // Element 3 of token 0's V row in the last layer (layout
    // `[layer][K|V][slot][d_model]`): the last row kv_diff compares.
    let at = ((cfg.n_layers - 1) * 2 + 1) * cfg.block_size * d + 3;
    pool.store.block_mut(table[0])[at] = f32::NAN;
    assert!(kv_row(&cfg, &pool.store, &table, 0, cfg.n_layers - 1, 1)[3].is_nan());
    let diff = kv_diff(&cfg, &pool.store, &table, 1, &zeros, &zeros, 0);
    let passes = diff <= 1e-3;
    assert!(!passes, "a NaN in the KV passed with {diff}");

    // A finite difference in an earlier row is still the one reported.
    pool.store.block_mut(table[0])[at] = 0.0;
    pool.store.block_mut(table[0])[5] = 0.25;
    assert_eq!(
        kv_diff(&cfg, &pool.store, &table, 1, &zeros, &zeros, 0),
        0.25
    );
}
