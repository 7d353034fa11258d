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

/// One row of a responses.parquet.
pub struct Response {
    pub req_id: u64,
    pub node: u32,
    pub items: Vec<u32>,
    pub scores: Vec<f32>,
    pub model_version: String,
}

/// Every row of a responses.parquet, in file order.
pub fn responses(path: &Path) -> Vec<Response> {
    use arrow::array::AsArray;
    use arrow::datatypes::{Float32Type, UInt32Type, UInt64Type};
    let mut out = Vec::new();
    for b in batches(path) {
        let col = |n: &str| b.column_by_name(n).unwrap_or_else(|| panic!("{n}")).clone();
        let req = col("req_id");
        let req = req.as_primitive::<UInt64Type>();
        let node = col("node");
        let node = node.as_primitive::<UInt32Type>();
        let items = col("items");
        let items = items.as_list::<i32>();
        let scores = col("scores");
        let scores = scores.as_list::<i32>();
        let version =
            arrow::compute::cast(&col("model_version"), &arrow::datatypes::DataType::Utf8).unwrap();
        let version = version.as_string::<i32>();
        for i in 0..b.num_rows() {
            out.push(Response {
                req_id: req.value(i),
                node: node.value(i),
                items: items
                    .value(i)
                    .as_primitive::<UInt32Type>()
                    .values()
                    .to_vec(),
                scores: scores
                    .value(i)
                    .as_primitive::<Float32Type>()
                    .values()
                    .to_vec(),
                model_version: version.value(i).to_string(),
            });
        }
    }
    out
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
