//! Same config → byte-identical trace files, and a pinned digest of a small
//! trace so that a crate upgrade that changes the bytes is noticed.

use std::path::{Path, PathBuf};

use grflow_traces::{GenConfig, Regime, WriteOptions, generate, write_trace};

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grflow-traces-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    ["requests.parquet", "users.parquet", "items.parquet"]
        .iter()
        .map(|f| {
            (
                f.to_string(),
                std::fs::read(dir.join(f)).expect("trace file written"),
            )
        })
        .collect()
}

/// FNV-1a, 64 bit: enough to notice any change in the bytes.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

fn small() -> GenConfig {
    GenConfig {
        regime: Regime::Burst,
        users: 100,
        items: 2_000,
        requests: 1_500,
        rps: 40.0,
        seed: 7,
        retrieve_share: 0.1,
        ..GenConfig::default()
    }
}

#[test]
fn generating_twice_gives_identical_bytes() {
    let (a, b) = (tmp("a"), tmp("b"));
    let opts = WriteOptions {
        row_group_rows: 256,
        ..WriteOptions::default()
    };
    write_trace(&a, &generate(&small()), &opts).unwrap();
    write_trace(&b, &generate(&small()), &opts).unwrap();
    assert_eq!(files(&a), files(&b));
    let c = tmp("c");
    write_trace(&c, &generate(&GenConfig { seed: 8, ..small() }), &opts).unwrap();
    assert_ne!(files(&a)[0], files(&c)[0], "another seed, another trace");
    for d in [a, b, c] {
        std::fs::remove_dir_all(d).unwrap();
    }
}

/// If this fails after a dependency or generator change, traces written
/// before are no longer reproducible bit for bit: say so in the change,
/// then update the digests.
#[test]
fn pinned_digest_of_a_small_trace() {
    let dir = tmp("pinned");
    write_trace(
        &dir,
        &generate(&small()),
        &WriteOptions {
            row_group_rows: 256,
            ..WriteOptions::default()
        },
    )
    .unwrap();
    let digests: Vec<(String, String)> = files(&dir)
        .into_iter()
        .map(|(name, bytes)| (name, format!("{:016x}", fnv1a(&bytes))))
        .collect();
    std::fs::remove_dir_all(&dir).unwrap();
    let expected: Vec<(String, String)> = PINNED
        .iter()
        .map(|(n, d)| (n.to_string(), d.to_string()))
        .collect();
    assert_eq!(digests, expected);
}

/// items.parquet changed on 2026-12-01 (was 3598736b2ae7290b), its footer
/// alone: this Burst trace spans 37.5 s, too short for a burst, and its
/// `source` now says "no burst fits"; the rows are the same bytes.
const PINNED: [(&str, &str); 3] = [
    ("requests.parquet", "f008e5cf84d31ded"),
    ("users.parquet", "034e8a4672925535"),
    ("items.parquet", "0f90c5a894c3191b"),
];

/// Rewriting a trace that fails partway (here: items.parquet cannot be
/// created) leaves the trace that was there, not a new requests.parquet
/// beside the old users and items; a complete write leaves no temporary
/// files.
#[test]
fn a_rewrite_that_fails_partway_leaves_the_old_trace() {
    let dir = tmp("rewrite");
    let opts = WriteOptions::default();
    write_trace(&dir, &generate(&small()), &opts).unwrap();
    let before = files(&dir);
    let blocker = dir.join("items.parquet.tmp");
    std::fs::create_dir(&blocker).unwrap();
    let mut other = small();
    other.seed = 8;
    assert!(write_trace(&dir, &generate(&other), &opts).is_err());
    assert_eq!(files(&dir), before, "the old trace, whole");
    std::fs::remove_dir(&blocker).unwrap();
    write_trace(&dir, &generate(&other), &opts).unwrap();
    assert_ne!(files(&dir), before);
    let left: Vec<String> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    std::fs::remove_dir_all(&dir).ok();
}
