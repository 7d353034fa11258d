//! A small trace for the train/eval/serve tests, imported through the real
//! binary from SASRec-style `user item` lines, and readers of what the
//! binary writes.

#![allow(dead_code)] // each test binary uses a different part

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::cli::{grflow, ok};

/// Writes `users` walks (user u visits i, i+3, i+6, ... over `items` items,
/// 8-12 steps) to `dir/name.txt` and imports them with `tables` embedding
/// tables into `dir/name`.
pub fn import_walks(dir: &Path, name: &str, users: u32, items: u32, tables: u32) -> PathBuf {
    let input = dir.join(format!("{name}.txt"));
    let mut text = String::new();
    for u in 0..users {
        for s in 0..8 + u % 5 {
            writeln!(text, "{} {}", u + 1, (u * 7 + s * 3) % items + 1).unwrap();
        }
    }
    std::fs::write(&input, text).unwrap();
    let trace = dir.join(name);
    ok(grflow()
        .args(["import", "--format", "seq", "--quiet", "--tables"])
        .arg(tables.to_string())
        .arg("--input")
        .arg(&input)
        .arg("--out")
        .arg(&trace)
        .output()
        .unwrap());
    trace
}

/// Every record batch of a Parquet file.
pub fn batches(path: &Path) -> Vec<arrow::record_batch::RecordBatch> {
    let file = std::fs::File::open(path).unwrap();
    parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap())
        .collect()
}

/// Every request of a trace directory by req_id.
pub fn trace_requests(trace: &Path) -> HashMap<u64, grflow_traces::Request> {
    let mut out = HashMap::new();
    for entry in std::fs::read_dir(trace).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        if !name.starts_with("requests") || !name.ends_with(".parquet") {
            continue;
        }
        for b in batches(&path) {
            for r in grflow_traces::columnar::decode_requests(&b).unwrap() {
                let r = r.unwrap();
                out.insert(r.req_id, r);
            }
        }
    }
    out
}

/// Trains a model on `trace` into `model` with the CLI: one epoch, seed 5.
pub fn train_one_epoch(trace: &Path, model: &Path) {
    train_with_seed(trace, model, 5);
}

/// `train_one_epoch` with another seed (another model of the same items).
pub fn train_with_seed(trace: &Path, model: &Path, seed: u64) {
    ok(grflow()
        .args(["train", "--quiet", "--seed", &seed.to_string()])
        .args(["--max-epochs", "1", "--trace"])
        .arg(trace)
        .arg("--out")
        .arg(model)
        .output()
        .unwrap());
}
