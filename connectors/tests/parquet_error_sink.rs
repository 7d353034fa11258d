//! errors.parquet: rows come out in position order whatever order they
//! went in, with the position's parts as columns, while the sink holds a
//! bounded number of rows; every output file carries its layout version.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::{UInt32Type, UInt64Type};
use grflow_connectors::parquet::{ErrorSink, ResponseSink, WindowSink};
use grflow_connectors::{ErrorRow, ResponseRow, SourcePosition, WindowRow};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grflow-errsink-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Row `row` of a trace in row groups of 64.
fn bad_row(row: u64) -> ErrorRow {
    ErrorRow {
        position: SourcePosition::Parquet {
            file: "t/requests.parquet".into(),
            row_group: (row / 64) as u32,
            row,
        }
        .to_string(),
        reason: format!("column `mode`: bad {}", row % 7),
        req_id: (!row.is_multiple_of(5)).then_some(row),
    }
}

/// `n` rows, each row index once, in a scrambled order.
fn scrambled(n: u64) -> Vec<ErrorRow> {
    // 7919 is prime and does not divide n: i -> i * 7919 mod n is a permutation.
    assert!(!n.is_multiple_of(7919));
    (0..n).map(|i| bad_row(i * 7919 % n)).collect()
}

fn read(path: &Path) -> Vec<RecordBatch> {
    ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap())
        .unwrap()
        .build()
        .unwrap()
        .map(Result::unwrap)
        .collect()
}

/// The `row` column of the file, in file order.
fn rows_column(path: &Path) -> Vec<u64> {
    read(path)
        .iter()
        .flat_map(|b| {
            let row = b
                .column_by_name("row")
                .unwrap()
                .as_primitive::<UInt64Type>();
            assert_eq!(row.null_count(), 0);
            row.values().to_vec()
        })
        .collect()
}

#[test]
fn rows_come_out_in_position_order_through_several_merge_passes() {
    let dir = tmp("order");
    let path = dir.join("errors.parquet");
    const N: u64 = 6_000;
    // 97 rows a run: 62 runs, more than one merge takes at once.
    let mut sink = ErrorSink::create(&path).unwrap().with_run_rows(97);
    let rows = scrambled(N);
    for batch in rows.chunks(333) {
        sink.append(&mut batch.to_vec()).unwrap();
    }
    assert_eq!(sink.runs(), (N / 97) as usize);
    assert!(dir.join("errors.parquet.runs").is_dir());
    assert!(!path.exists(), "the file waits for finish");
    assert_eq!(sink.finish().unwrap(), N);
    assert!(
        !dir.join("errors.parquet.runs").exists(),
        "runs removed once merged"
    );

    assert_eq!(rows_column(&path), (0..N).collect::<Vec<_>>());
    for b in read(&path) {
        let position = b.column_by_name("position").unwrap().as_string::<i32>();
        let reason = b.column_by_name("reason").unwrap().as_string::<i32>();
        let req_id = b
            .column_by_name("req_id")
            .unwrap()
            .as_primitive::<UInt64Type>();
        let file = b.column_by_name("file").unwrap().as_string::<i32>();
        let group = b
            .column_by_name("row_group")
            .unwrap()
            .as_primitive::<UInt32Type>();
        let row = b
            .column_by_name("row")
            .unwrap()
            .as_primitive::<UInt64Type>();
        for i in 0..b.num_rows() {
            let want = bad_row(row.value(i));
            assert_eq!(position.value(i), want.position);
            assert_eq!(reason.value(i), want.reason);
            assert_eq!(req_id.is_valid(i).then(|| req_id.value(i)), want.req_id);
            // The text and the columns name the same row.
            assert_eq!(file.value(i), "t/requests.parquet");
            assert_eq!(group.value(i) as u64, row.value(i) / 64);
            assert_eq!(
                position.value(i),
                format!(
                    "t/requests.parquet: row group {}, row {}",
                    group.value(i),
                    row.value(i)
                )
            );
        }
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_hundred_thousand_rows_are_sorted_holding_sixteen_ki_at_most() {
    let dir = tmp("bounded");
    let path = dir.join("errors.parquet");
    const N: u64 = 100_000;
    let mut sink = ErrorSink::create(&path).unwrap();
    // Last row first, in the batches the job hands over.
    let mut rows: Vec<ErrorRow> = (0..N).rev().map(bad_row).collect();
    for batch in rows.chunks_mut(1_024) {
        sink.append(&mut batch.to_vec()).unwrap();
        assert!(sink.held_peak() <= 16 * 1024, "{}", sink.held_peak());
    }
    rows.clear();
    assert_eq!(sink.rows(), N);
    assert_eq!(sink.finish().unwrap(), N);
    assert_eq!(rows_column(&path), (0..N).collect::<Vec<_>>());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_peak_counts_what_the_merge_holds_too() {
    let dir = tmp("peak");
    let path = dir.join("errors.parquet");
    let mut sink = ErrorSink::create(&path).unwrap().with_run_rows(10);
    sink.write(&scrambled(95)).unwrap();
    assert_eq!(sink.held_peak(), 10, "the buffer never holds more");
    assert_eq!(sink.runs(), 9);
    // The merge reads the ten runs (the last five rows spilled at finish)
    // a batch at a time, each of them whole here: 95 rows at the first
    // hand-off to the writer.
    let (rows, peak) = sink.finish_with_peak().unwrap();
    assert_eq!((rows, peak), (95, 95));
    assert_eq!(rows_column(&path), (0..95).collect::<Vec<_>>());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rows_at_one_position_come_in_one_order() {
    let dir = tmp("ties");
    let path = dir.join("errors.parquet");
    let at = |reason: &str, req_id| ErrorRow {
        position: "requests[0]@7".into(),
        reason: reason.into(),
        req_id,
    };
    let rows = [
        at("b", Some(2)),
        at("a", Some(9)),
        at("b", None),
        at("a", Some(1)),
    ];
    let mut sink = ErrorSink::create(&path).unwrap().with_run_rows(1);
    sink.write(&rows).unwrap();
    sink.finish().unwrap();
    let b = &read(&path)[0];
    let reason = b.column_by_name("reason").unwrap().as_string::<i32>();
    let req_id = b
        .column_by_name("req_id")
        .unwrap()
        .as_primitive::<UInt64Type>();
    let got: Vec<(String, Option<u64>)> = (0..4)
        .map(|i| {
            (
                reason.value(i).to_string(),
                req_id.is_valid(i).then(|| req_id.value(i)),
            )
        })
        .collect();
    assert_eq!(
        got,
        [
            ("a".to_string(), Some(1)),
            ("a".to_string(), Some(9)),
            ("b".to_string(), None),
            ("b".to_string(), Some(2)),
        ]
    );
    // A Kafka position has no file, row group or row.
    for name in ["file", "row_group", "row"] {
        assert_eq!(b.column_by_name(name).unwrap().null_count(), 4, "{name}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_sink_dropped_unfinished_leaves_neither_file_nor_runs() {
    let dir = tmp("dropped");
    let path = dir.join("errors.parquet");
    let mut sink = ErrorSink::create(&path).unwrap().with_run_rows(8);
    sink.write(&scrambled(100)).unwrap();
    assert!(sink.runs() > 0);
    drop(sink);
    assert_eq!(
        std::fs::read_dir(&dir).unwrap().count(),
        0,
        "nothing left in {}",
        dir.display()
    );
    // A folder that is not there is said at once, not after the run.
    assert!(ErrorSink::create(&dir.join("missing/errors.parquet")).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

fn version(path: &Path) -> Option<String> {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    builder
        .metadata()
        .file_metadata()
        .key_value_metadata()?
        .iter()
        .find(|kv| kv.key == grflow_traces::columnar::VERSION_KEY)
        .and_then(|kv| kv.value.clone())
}

#[test]
fn every_output_file_carries_its_schema_version() {
    let dir = tmp("version");
    let response = ResponseRow {
        req_id: 1,
        node: 0,
        prefix: "user".into(),
        items: vec![3],
        scores: vec![0.5],
        latency_ms: 1.0,
        model_version: "v".into(),
        history_len: 1,
        kv_reused_tokens: 0,
    };
    let mut r = ResponseSink::create(&dir.join("responses.parquet")).unwrap();
    r.write(&[response]).unwrap();
    r.finish().unwrap();
    // An empty windows file still says its version.
    WindowSink::create(&dir.join("windows.parquet"))
        .unwrap()
        .finish()
        .unwrap();
    let mut e = ErrorSink::create(&dir.join("errors.parquet"))
        .unwrap()
        .with_run_rows(2);
    e.write(&scrambled(5)).unwrap();
    e.finish().unwrap();
    for (file, want) in [
        (
            "responses.parquet",
            <ResponseRow as grflow_connectors::parquet::SinkRow>::SCHEMA_VERSION,
        ),
        (
            "windows.parquet",
            <WindowRow as grflow_connectors::parquet::SinkRow>::SCHEMA_VERSION,
        ),
        (
            "errors.parquet",
            <ErrorRow as grflow_connectors::parquet::SinkRow>::SCHEMA_VERSION,
        ),
    ] {
        assert_eq!(want, "1");
        assert_eq!(version(&dir.join(file)).as_deref(), Some(want), "{file}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
