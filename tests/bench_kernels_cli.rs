//! `grflow bench kernels` through the real binary at tiny sizes: the JSON
//! names the GEMM shapes it timed and carries both attention baselines and
//! both top-k baselines; a malformed shape is a clear error.

use std::process::Command;

use serde_json::Value;

fn bench(shapes: &str) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_grflow"))
        .args(["bench", "kernels", "--json", "--reps", "1"])
        .args(["--gemm-shapes", shapes])
        .args(["--prefill-tokens", "20", "--beam-width", "8"])
        .args(["--codebook-size", "32", "--beam-prompt", "18"])
        .output()
        .unwrap()
}

#[test]
fn bench_kernels_json_names_gemm_shapes_and_baselines() {
    let out = bench("16x8x4,8x8x8");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let shapes: Vec<[u64; 3]> = v["gemm_shapes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| ["m", "n", "k"].map(|x| g[x].as_u64().unwrap()))
        .collect();
    assert_eq!(shapes, [[16, 8, 4], [8, 8, 8]]);
    let best = v["gemm_shape"].as_array().unwrap();
    assert!(
        shapes
            .iter()
            .any(|s| best.iter().zip(s).all(|(a, b)| a.as_u64() == Some(*b)))
    );
    for field in [
        "per_beam_attention_ms",
        "concat_attention_ms",
        "staged_attention_speedup",
        "staged_attention_speedup_vs_copy",
        "topk_select_nth_us",
        "topk_early_termination_speedup",
        "topk_presorted_vs_full_sort_speedup",
        "beam_kv_prompt_bytes",
        "beam_kv_unshared_bytes",
    ] {
        assert!(v[field].as_f64().is_some(), "{field} missing: {v}");
    }
}

#[test]
fn bench_kernels_rejects_a_malformed_gemm_shape() {
    let out = bench("16x8x4,8x8");
    assert_eq!(out.status.code(), Some(2), "an input error");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--gemm-shapes[1]") && err.contains("8x8"),
        "{err}"
    );
}

/// The tiny flags of `bench` with `flag` set to `value` instead.
fn bench_with(flag: &str, value: &str) -> std::process::Output {
    let mut args = vec![
        ("--reps", "1"),
        ("--threads", "1"),
        ("--gemm-shapes", "8x8x8"),
        ("--prefill-tokens", "20"),
        ("--beam-width", "8"),
        ("--codebook-size", "32"),
        ("--beam-prompt", "18"),
    ];
    args.retain(|(f, _)| *f != flag);
    args.push((flag, value));
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_grflow"));
    cmd.args(["bench", "kernels", "--json"]);
    for (f, v) in args {
        cmd.arg(format!("{f}={v}"));
    }
    cmd.output().unwrap()
}

#[test]
fn bench_kernels_rejects_bad_flags_by_name_as_input_errors() {
    for (flag, value) in [
        ("--reps", "0"),
        ("--threads", "0"),
        ("--beam-width", "0"),
        ("--prefill-tokens", "5"),
        ("--codebook-size", "16"),
        ("--codebook-size", "65537"),
    ] {
        let out = bench_with(flag, value);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flag} {value}: {err}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
        assert!(out.stdout.is_empty(), "{flag} {value}: nothing measured");
    }
    // A codebook below the beam width names both flags.
    let out = bench_with("--beam-width", "64");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--codebook-size") && err.contains("--beam-width"),
        "{err}"
    );
}
