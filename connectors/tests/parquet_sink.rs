//! Sinks write what they are given, in batches, and the files read back.

use std::fs::File;

use arrow::array::{Array, AsArray};
use arrow::datatypes::{Float64Type, UInt32Type, UInt64Type};
use grflow_connectors::parquet::{ErrorSink, ResponseSink, WindowSink};
use grflow_connectors::{ErrorRow, ResponseRow, WindowRow};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn read(path: &std::path::Path) -> Vec<arrow::array::RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

fn response(i: u64) -> ResponseRow {
    ResponseRow {
        req_id: i,
        node: (i % 2) as u32,
        prefix: if i.is_multiple_of(3) {
            "item".into()
        } else {
            "user".into()
        },
        items: vec![i as u32, 5, 9],
        scores: vec![0.5, 0.25, -1.0],
        latency_ms: i as f64 / 4.0,
        model_version: "v1".into(),
        history_len: 40 + i as u32,
        kv_reused_tokens: 32,
    }
}

#[test]
fn responses_windows_and_errors_round_trip() {
    let dir = std::env::temp_dir().join(format!("grflow-sinks-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();

    let mut s = ResponseSink::create(&dir.join("responses.parquet")).unwrap();
    s.write(&(0..10).map(response).collect::<Vec<_>>()).unwrap();
    s.write(&[]).unwrap();
    s.write(&(10..25).map(response).collect::<Vec<_>>())
        .unwrap();
    assert_eq!(s.finish().unwrap(), 25);
    let batches = read(&dir.join("responses.parquet"));
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, 25);
    let b = &batches[0];
    let req = b
        .column_by_name("req_id")
        .unwrap()
        .as_primitive::<UInt64Type>();
    assert!(
        req.values().iter().enumerate().all(|(i, &r)| r == i as u64),
        "rows in write order"
    );
    let items = b.column_by_name("items").unwrap().as_list::<i32>();
    assert_eq!(
        items.value(3).as_primitive::<UInt32Type>().values(),
        &[3, 5, 9]
    );
    assert_eq!(
        b.column_by_name("prefix")
            .unwrap()
            .as_string::<i32>()
            .value(3),
        "item"
    );
    let history = b
        .column_by_name("history_len")
        .unwrap()
        .as_primitive::<UInt32Type>();
    assert_eq!(history.value(3), 43);

    let window = WindowRow {
        node: 1,
        window_start_ms: 5_000,
        requests: 42,
        hot_user_share: 0.2,
        emb_hit_rate: 0.5,
        kv_hit_rate: 0.3,
        mean_seq_len: 80.0,
        slo_violation_share: 0.01,
        p99_ms: 12.5,
        alpha: 0.6,
        failed: 3,
        truncated_share: 0.0,
        alpha_end: None,
        pinned_end: true,
    };
    let mut w = WindowSink::create(&dir.join("windows.parquet")).unwrap();
    w.write(std::slice::from_ref(&window)).unwrap();
    assert_eq!(w.finish().unwrap(), 1);
    let b = &read(&dir.join("windows.parquet"))[0];
    assert_eq!(
        b.column_by_name("p99_ms")
            .unwrap()
            .as_primitive::<Float64Type>()
            .value(0),
        12.5
    );
    assert_eq!(
        b.column_by_name("failed")
            .unwrap()
            .as_primitive::<UInt64Type>()
            .value(0),
        3
    );
    // Unknown α at the end is null, not 0.
    assert!(b.column_by_name("alpha_end").unwrap().is_null(0));
    assert!(
        b.column_by_name("pinned_end")
            .unwrap()
            .as_boolean()
            .value(0)
    );

    let mut e = ErrorSink::create(&dir.join("errors.parquet")).unwrap();
    e.write(&[
        ErrorRow {
            position: "requests.parquet: row group 0, row 3".into(),
            reason: "column `ts_ms`: null".into(),
            req_id: None,
        },
        ErrorRow {
            position: "x".into(),
            reason: "y".into(),
            req_id: Some(7),
        },
    ])
    .unwrap();
    e.finish().unwrap();
    let b = &read(&dir.join("errors.parquet"))[0];
    let req = b
        .column_by_name("req_id")
        .unwrap()
        .as_primitive::<UInt64Type>();
    assert!(req.is_null(0));
    assert_eq!(req.value(1), 7);

    // An empty sink still makes a valid file with the schema.
    ErrorSink::create(&dir.join("empty.parquet"))
        .unwrap()
        .finish()
        .unwrap();
    let builder =
        ParquetRecordBatchReaderBuilder::try_new(File::open(dir.join("empty.parquet")).unwrap())
            .unwrap();
    assert_eq!(builder.metadata().file_metadata().num_rows(), 0);
    assert!(builder.schema().field_with_name("position").is_ok());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A window in which the node served nothing (every request shed) has no
/// latency: its p99 is null, not a perfect 0; the row itself stays.
#[test]
fn a_window_that_served_nothing_has_a_null_p99() {
    let dir = std::env::temp_dir().join(format!("grflow-sink-p99-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let row = |requests, failed, p99_ms| WindowRow {
        node: 0,
        window_start_ms: 0,
        requests,
        hot_user_share: 0.0,
        emb_hit_rate: 0.0,
        kv_hit_rate: 0.0,
        mean_seq_len: 0.0,
        slo_violation_share: 1.0,
        p99_ms,
        alpha: 0.5,
        failed,
        truncated_share: 0.0,
        alpha_end: Some(0.5),
        pinned_end: false,
    };
    let path = dir.join("windows.parquet");
    let mut w = WindowSink::create(&path).unwrap();
    // All shed; some shed and some served; nothing at all.
    w.write(&[row(4, 4, 0.0), row(5, 2, 7.5), row(0, 0, 0.0)])
        .unwrap();
    assert_eq!(w.finish().unwrap(), 3);
    let b = &read(&path)[0];
    let p99 = b
        .column_by_name("p99_ms")
        .unwrap()
        .as_primitive::<Float64Type>();
    assert!(b.schema().field_with_name("p99_ms").unwrap().is_nullable());
    assert!(p99.is_null(0), "served nothing: no latency");
    assert_eq!((p99.is_null(1), p99.value(1)), (false, 7.5));
    assert!(p99.is_null(2));
    let requests = b
        .column_by_name("requests")
        .unwrap()
        .as_primitive::<UInt64Type>();
    assert_eq!(requests.value(0), 4, "the row is kept");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn creating_in_a_missing_directory_names_the_file() {
    let err = ResponseSink::create(std::path::Path::new("/nonexistent/dir/responses.parquet"))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("/nonexistent/dir/responses.parquet"),
        "{err}"
    );
}
