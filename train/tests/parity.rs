//! The trainer's forward against the serving kernels on the same weights,
//! and a model whose weights were written by hand in the documented format.

use std::collections::HashMap;

use grflow_kernels::history::HistoryCut;
use grflow_kernels::{CpuBackend, GrModel, ModelConfig};
use grflow_train::eval::Served;
use grflow_train::net::logits;
use grflow_train::params::CONFIG_KEY;
use grflow_train::{Params, Sequence, Target};
use rand::{RngExt, SeedableRng};
use rand_chacha::ChaCha8Rng;
use safetensors::{Dtype, tensor::TensorView};

fn softmax(s: &[f32]) -> Vec<f32> {
    let m = s.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let z: f32 = s.iter().map(|v| (v - m).exp()).sum();
    s.iter().map(|v| (v - m).exp() / z).collect()
}

/// Largest elementwise `|a - b|`, NaN when any difference is NaN
/// (`f32::max` would drop it and let a NaN output pass `< TOL`). Panics
/// when the lengths differ, so a short result cannot pass either.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "compared slices differ in length");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, |m, d| {
            if m.is_nan() || d.is_nan() {
                f32::NAN
            } else {
                m.max(d)
            }
        })
}

#[test]
fn max_diff_fails_a_tolerance_on_nan_and_reports_finite_differences() {
    assert_eq!(max_diff(&[1.0, 2.0, 3.0], &[1.5, 2.0, 1.0]), 2.0);
    for (a, b) in [
        ([f32::NAN, 1.0, 1.0], [1.0; 3]),
        ([1.0, 1.0, 5.0], [1.0, f32::NAN, 1.0]),
        ([1.0, 5.0, f32::NAN], [1.0; 3]),
    ] {
        let d = max_diff(&a, &b);
        let passes = d < 1e-4;
        assert!(!passes, "{a:?} vs {b:?} passed with {d}");
    }
}

#[test]
#[should_panic(expected = "differ in length")]
fn max_diff_of_a_short_result_panics() {
    max_diff(&[], &[0.5]);
}

fn small() -> ModelConfig {
    let mut cfg = ModelConfig::preset("small").unwrap();
    cfg.n_tables = 1;
    cfg
}

/// Perturbs every trained tensor so the gains are not all 1.
fn jitter(p: &mut Params, seed: u64) {
    let mut r = ChaCha8Rng::seed_from_u64(seed);
    for t in p.trainable_mut() {
        for v in t.iter_mut() {
            *v += r.random_range(-0.05f32..0.05);
        }
    }
}

/// Items of the catalog the served-model tests draw from.
const N_ITEMS: usize = 300;

/// A jittered model over `N_ITEMS` items, served with histories of at
/// most 50.
fn served_model(init_seed: u64, jitter_seed: u64) -> (Params, Served) {
    let mut p = Params::init(small(), N_ITEMS, init_seed).unwrap();
    jitter(&mut p, jitter_seed);
    let served = Served::new(&p, 50).unwrap();
    (p, served)
}

/// `n` random item ids of the catalog.
fn item_ids(r: &mut ChaCha8Rng, n: usize) -> Vec<u32> {
    (0..n).map(|_| r.random_range(0..N_ITEMS as u32)).collect()
}

#[test]
fn trainer_forward_equals_kernels_forward() {
    let (p, mut served) = served_model(9, 1);
    let mut r = ChaCha8Rng::seed_from_u64(4);
    for (h, n) in [(1usize, 5usize), (7, 101), (50, 30), (23, 2)] {
        let history = item_ids(&mut r, h);
        let cands = item_ids(&mut r, n);
        let seq = Sequence {
            history: history.clone(),
            targets: vec![Target {
                prefix: h,
                cands: cands.clone(),
            }],
        };
        let ours = softmax(&logits(&p, &[seq], &CpuBackend::default()).unwrap()[0]);
        let theirs = grflow_kernels::rank_softmax(&served.rank(&history, &cands).unwrap());
        assert_eq!(ours.len(), n, "history {h}: trainer scores");
        let diff = max_diff(&ours, &theirs);
        assert!(
            diff < 1e-4,
            "history {h}, {n} candidates: trainer and kernels differ by {diff}"
        );
    }
}

#[test]
fn a_long_history_is_ranked_as_serving_cuts_it() {
    // 51 items at a limit of 50: serving drops a whole chunk of the oldest,
    // not the one item that a last-50 cut drops.
    let (p, mut served) = served_model(5, 5);
    let mut r = ChaCha8Rng::seed_from_u64(6);
    let history = item_ids(&mut r, 51);
    let cands = item_ids(&mut r, 20);
    let cut = HistoryCut::new(50, p.cfg.block_size);
    let kept = cut.keep(&history);
    assert!(kept.len() < 50, "{} kept", kept.len());
    let whole = served.rank(&history, &cands).unwrap();
    assert_eq!(whole, served.rank(kept, &cands).unwrap());
    assert_ne!(whole, served.rank(&history[1..], &cands).unwrap());
}

#[test]
fn every_prefix_of_one_pass_equals_its_own_request() {
    // Training scores all targets of a sequence in one pass; each must
    // equal the request made of its prefix alone.
    let mut p = Params::init(small(), 50, 2).unwrap();
    jitter(&mut p, 2);
    let history: Vec<u32> = vec![3, 9, 27, 4, 11, 8];
    let targets: Vec<Target> = (0..=history.len())
        .map(|t| Target {
            prefix: t,
            cands: vec![(t as u32 * 7) % 50, 13, 21],
        })
        .collect();
    let be = CpuBackend::default();
    let one = logits(
        &p,
        &[Sequence {
            history: history.clone(),
            targets: targets.clone(),
        }],
        &be,
    )
    .unwrap();
    assert_eq!(one.len(), targets.len());
    for (t, target) in targets.into_iter().enumerate() {
        let n = target.cands.len();
        let alone = logits(
            &p,
            &[Sequence {
                history: history[..t].to_vec(),
                targets: vec![target],
            }],
            &be,
        )
        .unwrap();
        assert_eq!(one[t].len(), n, "target {t}");
        let diff = max_diff(&one[t], &alone[0]);
        assert!(diff < 1e-4, "target {t}: {:?} vs {:?}", one[t], alone[0]);
    }
}

/// Builds a model file tensor by tensor from the names and shapes of
/// train/README.md, without the trainer's writer.
fn hand_written(cfg: &ModelConfig, n_items: usize, emb_row: impl Fn(usize) -> Vec<f32>) -> Vec<u8> {
    let (d, f, c) = (cfg.d_model, cfg.d_ff, cfg.codebook_size);
    let fill = |n: usize, v: f32| vec![v; n];
    let ramp = |n: usize, a: f32| {
        (0..n)
            .map(|i| ((i % 17) as f32 - 8.0) * a)
            .collect::<Vec<f32>>()
    };
    let mut t: Vec<(String, Vec<usize>, Vec<f32>)> = vec![
        (
            "emb.0".into(),
            vec![n_items, d],
            (0..n_items).flat_map(&emb_row).collect(),
        ),
        (
            "pos_emb".into(),
            vec![cfg.max_positions, d],
            ramp(cfg.max_positions * d, 0.01),
        ),
        ("instr_token".into(), vec![d], ramp(d, 0.1)),
        ("gen_token".into(), vec![d], fill(d, 0.0)),
        ("ln_f".into(), vec![d], fill(d, 1.0)),
        ("w_rank".into(), vec![d, d], ramp(d * d, 0.02)),
        ("sid_emb".into(), vec![2, c, d], fill(2 * c * d, 0.0)),
        ("sid_head".into(), vec![3, d, c], fill(3 * d * c, 0.0)),
    ];
    for l in 0..cfg.n_layers {
        let n = |s: &str| format!("layers.{l}.{s}");
        t.push((n("ln1"), vec![d], fill(d, 1.0)));
        t.push((n("wqkv"), vec![d, 3 * d], ramp(d * 3 * d, 0.01)));
        t.push((n("wo"), vec![d, d], ramp(d * d, 0.01)));
        t.push((n("ln2"), vec![d], fill(d, 1.0)));
        t.push((n("w1"), vec![d, f], ramp(d * f, 0.01)));
        t.push((n("w2"), vec![f, d], ramp(f * d, 0.01)));
    }
    let bytes: Vec<(String, Vec<usize>, Vec<u8>)> = t
        .into_iter()
        .map(|(n, s, v)| (n, s, v.iter().flat_map(|x| x.to_le_bytes()).collect()))
        .collect();
    let views: Vec<(String, TensorView<'_>)> = bytes
        .iter()
        .map(|(n, s, b)| {
            (
                n.clone(),
                TensorView::new(Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let meta = HashMap::from([(CONFIG_KEY.to_string(), serde_json::to_string(cfg).unwrap())]);
    safetensors::serialize(views, Some(meta)).unwrap()
}

#[test]
fn weights_written_by_hand_in_the_documented_format_load_and_serve() {
    let cfg = ModelConfig {
        d_model: 8,
        n_layers: 1,
        n_heads: 2,
        d_ff: 16,
        block_size: 4,
        n_tables: 1,
        codebook_size: 4,
        max_positions: 12,
    };
    let n_items = 5;
    // Item i's row is i in every coordinate: easy to find after loading.
    let bytes = hand_written(&cfg, n_items, |i| vec![i as f32; 8]);
    let p = Params::from_safetensors(&bytes, "hand-written").unwrap();
    assert_eq!(p.n_items(), n_items);
    assert_eq!(p.item_row(3), &[3.0; 8]);
    assert_eq!(p.layers.len(), 1);
    assert_eq!(p.layers[0].wqkv.len(), 8 * 24);
    // The same bytes are a kernels model with its tables, and they serve.
    GrModel::from_safetensors(&bytes).unwrap();
    let tables = grflow_kernels::EmbeddingTables::from_safetensors(&cfg, &bytes).unwrap();
    assert_eq!(tables.row(0, 3).unwrap(), &[3.0; 8]);
    let logits = Served::new(&p, 8)
        .unwrap()
        .rank(&[1, 2], &[0, 3, 4])
        .unwrap();
    let scores = grflow_kernels::rank_softmax(&logits);
    assert!((scores.iter().sum::<f32>() - 1.0).abs() < 1e-5);
    // A table of the wrong width is named in the error.
    let mut wide = cfg.clone();
    wide.d_model = 16;
    wide.n_heads = 2;
    let err = Params::from_safetensors(&hand_written_with_cfg(&wide, &cfg, n_items), "bad")
        .unwrap_err()
        .to_string();
    assert!(err.contains("emb.0"), "{err}");
}

/// Tensors shaped for `real` under a header claiming `claimed`.
fn hand_written_with_cfg(claimed: &ModelConfig, real: &ModelConfig, n_items: usize) -> Vec<u8> {
    let ok = hand_written(real, n_items, |_| vec![0.0; real.d_model]);
    let st = safetensors::SafeTensors::deserialize(&ok).unwrap();
    let views: Vec<(String, TensorView<'_>)> = st
        .tensors()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                TensorView::new(v.dtype(), v.shape().to_vec(), v.data()).unwrap(),
            )
        })
        .collect();
    let meta = HashMap::from([(
        CONFIG_KEY.to_string(),
        serde_json::to_string(claimed).unwrap(),
    )]);
    safetensors::serialize(views, Some(meta)).unwrap()
}
