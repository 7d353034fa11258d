//! Exact hit counts of lru and opt on the shared real traces (issue 4's
//! table). Skips when ../shared/data is absent. The key streams are read by
//! a few lines here (the product parsers live in grflow-traces::keystream
//! and are unit-tested there).

use grflow_operators::cachebench::{self, BenchConfig};
use grflow_operators::eviction::PolicyName;

/// The dataset file's text, or `None` after a visible skip.
fn read(test: &str, rel: &str) -> Option<String> {
    let path = grflow_testkit::shared_data(test, rel)?;
    Some(
        std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("reading {}: {e}", path.display())),
    )
}

fn hits(keys: Vec<u64>) -> Vec<(String, u64)> {
    let cfg = BenchConfig {
        policies: vec![PolicyName::Lru, PolicyName::Opt],
        ..BenchConfig::default()
    };
    cachebench::run("t", keys, &cfg)
        .into_iter()
        .map(|r| (r.policy, r.hits))
        .collect()
}

fn expect(lru: [u64; 3], opt: [u64; 3]) -> Vec<(String, u64)> {
    let l = lru.iter().map(|&h| ("lru".to_string(), h));
    l.chain(opt.iter().map(|&h| ("opt".to_string(), h)))
        .collect()
}

#[test]
fn mooncake_part1_lru_and_opt_counts() {
    let Some(text) = read(
        "mooncake_part1_lru_and_opt_counts",
        "mooncake/conversation_trace_part1.jsonl",
    ) else {
        return;
    };
    let mut keys = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("json line");
        keys.extend(
            v["hash_ids"]
                .as_array()
                .expect("hash_ids")
                .iter()
                .map(|h| h.as_u64().expect("id")),
        );
    }
    assert_eq!(keys.len(), 153_002);
    assert_eq!(
        hits(keys),
        expect([16_914, 31_879, 42_800], [50_247, 52_871, 52_871])
    );
}

#[test]
fn ml100k_lru_and_opt_counts() {
    let Some(text) = read("ml100k_lru_and_opt_counts", "ml-100k/ml-100k.inter") else {
        return;
    };
    let mut rows: Vec<(f64, u64, u64)> = text
        .lines()
        .skip(1)
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (
                f[3].parse().unwrap(),
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
            )
        })
        .collect();
    rows.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)).then(a.2.cmp(&b.2)));
    let keys: Vec<u64> = rows.into_iter().map(|r| r.2).collect();
    assert_eq!(keys.len(), 100_000);
    assert_eq!(
        hits(keys),
        expect([8_756, 20_982, 45_354], [39_532, 56_470, 75_326])
    );
}
