//! Traces written by other tools: without the nullable `label` column, or
//! with strings and lists in Arrow's large layouts (what pyarrow writes for
//! large_string / large_list), read as the plain trace does.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use arrow::compute::cast;
use arrow::datatypes::{DataType, Field, Schema};
use grflow_connectors::parquet::{
    ParquetRequestSource, RequestSource, SourceRecord, SourceState, load_side_tables,
};
use grflow_traces::columnar::{requests_to_batch, users_to_batch};
use grflow_traces::{GenConfig, Regime, Request, Trace, WriteOptions, generate, write_trace};
use parquet::arrow::ArrowWriter;
use parquet::file::properties::WriterProperties;

const ROW_GROUP: usize = 256;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grflow-pqlay-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A trace written by grflow in row groups of `ROW_GROUP`.
fn written(name: &str) -> (PathBuf, Trace) {
    let trace = generate(&GenConfig {
        regime: Regime::Burst,
        users: 120,
        items: 1_500,
        requests: 2_000,
        rps: 60.0,
        seed: 3,
        retrieve_share: 0.1,
        ..GenConfig::default()
    });
    let dir = tmp(name);
    let options = WriteOptions {
        row_group_rows: ROW_GROUP,
        ..WriteOptions::default()
    };
    write_trace(&dir, &trace, &options).unwrap();
    (dir, trace)
}

/// Overwrites `path` with `batch` in row groups of `ROW_GROUP`.
fn write(path: &Path, batch: &RecordBatch) {
    let props = WriterProperties::builder()
        .set_max_row_group_row_count(Some(ROW_GROUP))
        .build();
    let mut w =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// `batch` with column `name` cast to `to` (None: dropped).
fn recast(batch: &RecordBatch, name: &str, to: Option<DataType>) -> RecordBatch {
    let mut fields: Vec<Field> = Vec::new();
    let mut columns: Vec<ArrayRef> = Vec::new();
    for (field, column) in batch.schema().fields().iter().zip(batch.columns()) {
        if field.name() != name {
            fields.push(field.as_ref().clone());
            columns.push(column.clone());
        } else if let Some(to) = &to {
            fields.push(Field::new(name, to.clone(), field.is_nullable()));
            columns.push(cast(column, to).unwrap());
        }
    }
    RecordBatch::try_new(Arc::new(Schema::new(fields)), columns).unwrap()
}

/// Every request of worker 0 of 1, in order; panics on a bad record.
fn requests_of(dir: &Path) -> Vec<Request> {
    let mut source = ParquetRequestSource::open(dir, 0, 1).unwrap();
    let mut out = Vec::new();
    loop {
        let polled = source.poll(500, 0).unwrap();
        if polled.state == SourceState::Exhausted {
            return out;
        }
        for r in polled.records {
            match r {
                SourceRecord::Request { request, .. } => out.push(request),
                SourceRecord::Bad {
                    position, reason, ..
                } => panic!("{position}: {reason}"),
            }
        }
    }
}

/// `label` is nullable and serving never reads it: a trace without the
/// column opens, inspects and serves every request, label null. A
/// required column stays required.
#[test]
fn a_trace_without_label_is_served() {
    let (dir, trace) = written("no-label");
    let path = dir.join("requests.parquet");
    let batch = requests_to_batch(&trace.requests);
    write(&path, &recast(&batch, "label", None));
    let info = ParquetRequestSource::inspect(&dir).unwrap();
    assert_eq!(info.rows, trace.requests.len() as u64);
    let unlabelled: Vec<Request> = trace
        .requests
        .iter()
        .map(|r| Request {
            label: None,
            ..r.clone()
        })
        .collect();
    assert!(trace.requests.iter().any(|r| r.label.is_some()));
    let mut served = requests_of(&dir);
    served.sort_by_key(|r| r.req_id);
    assert_eq!(served, unlabelled);

    write(&path, &recast(&batch, "user_id", None));
    let err = ParquetRequestSource::open(&dir, 0, 1).unwrap_err();
    assert!(
        err.to_string().contains("missing column `user_id`"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `mode` as LargeUtf8, `candidates` and users' `items` as LargeList: the
/// same requests and side tables as the plain trace.
#[test]
fn large_string_and_list_columns_read_as_the_plain_ones() {
    let (dir, trace) = written("large");
    let plain = requests_of(&dir);
    let item = Arc::new(Field::new("element", DataType::UInt32, false));
    let batch = requests_to_batch(&trace.requests);
    let batch = recast(&batch, "mode", Some(DataType::LargeUtf8));
    let batch = recast(
        &batch,
        "candidates",
        Some(DataType::LargeList(item.clone())),
    );
    write(&dir.join("requests.parquet"), &batch);
    let users = recast(
        &users_to_batch(&trace.users),
        "items",
        Some(DataType::LargeList(item)),
    );
    write(&dir.join("users.parquet"), &users);
    assert_eq!(requests_of(&dir), plain);
    assert_eq!(plain.len(), trace.requests.len());
    assert_eq!(load_side_tables(&dir).unwrap().users, trace.users);
    std::fs::remove_dir_all(&dir).unwrap();
}
