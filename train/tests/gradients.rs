//! The hand-written backward pass against finite differences, and every
//! trained tensor receiving a gradient.

use grflow_kernels::{CpuBackend, ModelConfig};
use grflow_train::net::{Dropout, loss, loss_and_grad};
use grflow_train::{Params, Sequence, Target};

fn tiny() -> ModelConfig {
    ModelConfig {
        d_model: 8,
        n_layers: 2,
        n_heads: 2,
        d_ff: 16,
        block_size: 4,
        n_tables: 1,
        codebook_size: 4,
        max_positions: 16,
    }
}

fn batch() -> Vec<Sequence> {
    let t = |prefix, cands: &[u32]| Target {
        prefix,
        cands: cands.to_vec(),
    };
    vec![
        Sequence {
            history: vec![1, 4, 2, 7],
            targets: vec![t(1, &[4, 9]), t(3, &[7, 0, 5]), t(4, &[3, 11])],
        },
        Sequence {
            history: vec![10, 3],
            targets: vec![t(0, &[10, 6]), t(2, &[8, 2])],
        },
    ]
}

#[test]
fn every_trained_tensor_gets_a_nonzero_gradient() {
    let p = Params::init(tiny(), 12, 3).unwrap();
    let (l, g) = loss_and_grad(&p, &batch(), &CpuBackend::default(), None).unwrap();
    assert!(l.is_finite() && l > 0.0);
    for (name, t) in g.trainable() {
        assert!(
            t.iter().any(|v| *v != 0.0),
            "{name} has an all-zero gradient"
        );
        assert!(t.iter().all(|v| v.is_finite()), "{name} not finite");
    }
}

#[test]
fn gradients_match_finite_differences() {
    check_finite_differences(None);
}

/// With dropout the masks are a function of the seed, so the loss is a
/// fixed function of the weights and the same check applies.
#[test]
fn gradients_with_dropout_match_finite_differences() {
    check_finite_differences(Some(Dropout {
        rate: 0.3,
        seed: 11,
    }));
}

fn check_finite_differences(drop: Option<Dropout>) {
    let be = CpuBackend::default();
    let seqs = batch();
    let mut p = Params::init(tiny(), 12, 5).unwrap();
    // Gains off 1 so their gradients are generic.
    for l in &mut p.layers {
        l.ln1
            .iter_mut()
            .enumerate()
            .for_each(|(i, v)| *v = 0.8 + 0.05 * i as f32);
    }
    let (_, g) = loss_and_grad(&p, &seqs, &be, drop).unwrap();
    let grads: Vec<Vec<f32>> = g.trainable().into_iter().map(|(_, t)| t.clone()).collect();
    let names: Vec<String> = g.trainable().into_iter().map(|(n, _)| n).collect();
    let eps = 1e-2f32;
    let mut checked = 0;
    for (ti, gt) in grads.iter().enumerate() {
        // The three largest gradient entries of each tensor.
        let mut idx: Vec<usize> = (0..gt.len()).collect();
        idx.sort_by(|&a, &b| gt[b].abs().total_cmp(&gt[a].abs()));
        for &i in idx.iter().take(3) {
            let at = |delta: f32| {
                let mut q = p.clone();
                q.trainable_mut()[ti][i] += delta;
                loss(&q, &seqs, &be, drop).unwrap()
            };
            let num = ((at(eps) - at(-eps)) / (2.0 * eps as f64)) as f32;
            let ana = gt[i];
            let err = (num - ana).abs() / (num.abs().max(ana.abs()).max(1e-3));
            assert!(
                err < 0.03,
                "{}[{i}]: analytic {ana}, numeric {num} (rel err {err})",
                names[ti]
            );
            checked += 1;
        }
    }
    assert_eq!(checked, grads.len() * 3);
}

/// Tokens per second of one training step at the Games shape: 128 users
/// with 50-item histories, every position a target with 4 negatives, on
/// the `small` dimensions and 2 gradient threads (a measurement aid).
#[test]
#[ignore = "throughput measurement"]
fn step_throughput() {
    use grflow_train::data::{User, train_sequence};
    use rand::SeedableRng;
    let mut cfg = ModelConfig::preset("small").unwrap();
    cfg.n_tables = 1;
    let p = Params::init(cfg, 20_000, 1).unwrap();
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(1);
    let seqs: Vec<Sequence> = (0..128u32)
        .map(|u| {
            let items: Vec<u32> = (0..53).map(|i| (u * 131 + i * 17) % 20_000).collect();
            train_sequence(&User::new(u as u64, items), 20_000, 50, 4, &mut rng).unwrap()
        })
        .collect();
    let tokens: usize = seqs
        .iter()
        .map(|s| s.history.len() + s.targets.iter().map(|t| t.cands.len() + 1).sum::<usize>())
        .sum();
    let halves: Vec<&[Sequence]> = seqs.chunks(64).collect();
    let t0 = std::time::Instant::now();
    for _ in 0..3 {
        std::thread::scope(|s| {
            for h in &halves {
                let p = &p;
                s.spawn(move || loss_and_grad(p, h, &CpuBackend::default(), None).unwrap());
            }
        });
    }
    let secs = t0.elapsed().as_secs_f64() / 3.0;
    eprintln!(
        "{tokens} tokens per step, {secs:.3} s per step, {:.0} tokens/s",
        tokens as f64 / secs
    );
}
