//! Users with thousands of ratings (issue 28, item 2), through the real
//! binary: a synthetic MovieLens ratings.csv with users of 3,000 ratings is
//! imported and replayed. Every request is answered, the model sees the
//! most recent items that fit, and heavy users keep reusing their prefix KV.

use std::collections::HashMap;
use std::path::Path;

use arrow::array::AsArray;
use arrow::datatypes::{DataType, UInt32Type, UInt64Type};
use serde_json::Value;

#[path = "common/cli.rs"]
mod cli;
#[path = "common/temp.rs"]
mod temp;
use cli::{grflow, ok};
use temp::tmp_dir;

/// Users with 3,000 ratings each, and lighter users around them.
const HEAVY_USERS: u64 = 2;
const HEAVY_RATINGS: u64 = 3_000;
const LIGHT_USERS: u64 = 40;
const LIGHT_RATINGS: u64 = 12;
const ITEMS: u64 = 600;
/// The small preset: 1,024 positions, rank needs 2 past the history.
const LIMIT: u64 = 1_022;
/// A quarter of the smaller (retrieve) limit 1,021, in whole 16-token blocks.
const CHUNK: u64 = 240;

/// GroupLens `userId,movieId,rating,timestamp` (seconds). Heavy users rate
/// in turns (one every 2 s, staggered by 1 s); light users every 250 s.
fn ratings_csv() -> String {
    let mut csv = String::from("userId,movieId,rating,timestamp\n");
    let t0 = 1_000_000_000u64;
    for u in 0..HEAVY_USERS {
        for j in 0..HEAVY_RATINGS {
            let item = (j * 7 + u * 131) % ITEMS + 1;
            csv += &format!("{},{item},4.0,{}\n", u + 1, t0 + 2 * j + u);
        }
    }
    for u in 0..LIGHT_USERS {
        for j in 0..LIGHT_RATINGS {
            let item = (u * 37 + j * 11) % ITEMS + 1;
            let user = HEAVY_USERS + u + 1;
            csv += &format!("{user},{item},3.5,{}\n", t0 + 500 * j + u * 7);
        }
    }
    csv
}

/// The history a request with `hist_len` items is served with, from first
/// principles: the oldest items go in whole chunks until it fits.
fn expected_served(hist_len: u64) -> u64 {
    if hist_len <= LIMIT {
        hist_len
    } else {
        hist_len - (hist_len - LIMIT).div_ceil(CHUNK) * CHUNK
    }
}

fn u64_column(path: &Path, column: &str) -> Vec<u64> {
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let col = batch
            .column_by_name(column)
            .unwrap_or_else(|| panic!("{column} in {}", path.display()));
        match col.data_type() {
            DataType::UInt32 => out.extend(
                col.as_primitive::<UInt32Type>()
                    .values()
                    .iter()
                    .map(|&v| v as u64),
            ),
            _ => out.extend(col.as_primitive::<UInt64Type>().values().iter().copied()),
        }
    }
    out
}

#[test]
fn users_with_3000_ratings_are_served_with_their_most_recent_items_and_reuse_kv() {
    let dir = tmp_dir("long-histories");
    let csv = dir.join("ratings.csv");
    std::fs::write(&csv, ratings_csv()).unwrap();
    let trace = dir.join("trace");
    // Few candidates keep the test fast; the history is what is under test.
    ok(grflow()
        .args([
            "import",
            "--format",
            "movielens",
            "--quiet",
            "--candidates",
            "4",
        ])
        .arg("--input")
        .arg(&csv)
        .arg("--out")
        .arg(&trace)
        .output()
        .unwrap());
    let out = dir.join("out");
    let o = ok(grflow()
        .args(["replay", "--speed", "max", "--clock", "event", "--json"])
        .arg("--trace")
        .arg(&trace)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap());
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    let n = |k: &str| {
        summary[k]
            .as_u64()
            .unwrap_or_else(|| panic!("{k}: {summary}"))
    };

    // The same import in process: req_id -> (user, hist_len).
    let imported = grflow_traces::import::import_str(
        &ratings_csv(),
        "ratings.csv",
        &grflow_traces::ImportConfig {
            format: grflow_traces::ImportFormat::Movielens,
            candidates: 4,
            ..Default::default()
        },
    )
    .unwrap();
    let requests: HashMap<u64, (u64, u64)> = imported
        .requests
        .iter()
        .map(|r| (r.req_id, (r.user_id, r.hist_len as u64)))
        .collect();
    let longest = imported.users.iter().map(|u| u.items.len()).max();
    assert_eq!(longest, Some(HEAVY_RATINGS as usize));

    assert_eq!(n("requests_in"), requests.len() as u64, "{summary}");
    assert_eq!(n("errors"), 0, "{summary}");
    assert_eq!(n("responses_out"), n("requests_in"));
    let over = requests.values().filter(|(_, h)| *h > LIMIT).count() as u64;
    assert_eq!(
        over,
        HEAVY_USERS * (HEAVY_RATINGS - 1 - LIMIT),
        "heavy users' requests past the limit"
    );
    assert_eq!(n("truncated_histories"), over, "{summary}");
    let per_node: u64 = summary["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|node| node["truncated_histories"].as_u64().unwrap())
        .sum();
    assert_eq!(per_node, over);

    let responses = out.join("responses.parquet");
    let req_ids = u64_column(&responses, "req_id");
    let served = u64_column(&responses, "history_len");
    let reused = u64_column(&responses, "kv_reused_tokens");
    assert_eq!(req_ids.len() as u64, n("responses_out"));
    // user -> (hist_len, served, reused), for the KV check below.
    let mut by_user: HashMap<u64, Vec<(u64, u64, u64)>> = HashMap::new();
    for ((req, served), reused) in req_ids.iter().zip(&served).zip(&reused) {
        let (user, hist_len) = requests[req];
        assert_eq!(
            *served,
            expected_served(hist_len),
            "req {req}: history of {hist_len} served as {served}"
        );
        assert!(*served <= hist_len.min(LIMIT));
        by_user
            .entry(user)
            .or_default()
            .push((hist_len, *served, *reused));
    }

    // Chunked truncation keeps the first kept item still for CHUNK requests,
    // so heavy users reuse their prefix even past the limit.
    let mut truncated_users = 0;
    for (user, mut rows) in by_user {
        if rows.iter().all(|(h, _, _)| *h <= LIMIT) {
            continue;
        }
        truncated_users += 1;
        rows.sort();
        let last = &rows[rows.len() - 500..];
        assert!(last.iter().all(|(h, _, _)| *h > LIMIT));
        let reused: u64 = last.iter().map(|r| r.2).sum();
        let total: u64 = last.iter().map(|r| r.1).sum();
        let rate = reused as f64 / total as f64;
        assert!(
            rate > 0.5,
            "user {user}: KV hit rate {rate:.3} over the last 500 requests"
        );
    }
    assert_eq!(truncated_users, HEAVY_USERS);
    std::fs::remove_dir_all(&dir).unwrap();
}
