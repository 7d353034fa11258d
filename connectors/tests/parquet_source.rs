//! The Parquet request source and side-table loader against traces written
//! by grflow-traces, and against broken files.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use arrow::array::{ArrayRef, Int64Array, RecordBatch, StringArray, UInt64Array};
use arrow::datatypes::{DataType, Field, Schema};
use grflow_connectors::parquet::{
    DEFAULT_BATCH_ROWS, MemoryRequestSource, ParquetRequestSource, RequestSource, SourceError,
    SourceRecord, load_side_tables,
};
use grflow_connectors::{Polled, SourcePosition, SourceState};
use grflow_traces::columnar::{MAX_TS_MS, REQUEST_COLUMNS, requests_to_batch};
use grflow_traces::{GenConfig, Regime, Request, Trace, WriteOptions, generate, write_trace};
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader, ParquetMetaDataWriter};
use parquet::file::properties::{EnabledStatistics, WriterProperties};

const ROW_GROUP: usize = 256;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grflow-pq-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn small_trace() -> Trace {
    generate(&GenConfig {
        regime: Regime::Burst,
        users: 120,
        items: 1_500,
        requests: 3_000,
        rps: 60.0,
        seed: 11,
        retrieve_share: 0.1,
        ..GenConfig::default()
    })
}

fn written(name: &str) -> (PathBuf, Trace) {
    written_with(name, small_trace())
}

/// `trace` written to a fresh directory in row groups of `ROW_GROUP`.
fn written_with(name: &str, trace: Trace) -> (PathBuf, Trace) {
    let dir = tmp(name);
    write_trace(
        &dir,
        &trace,
        &WriteOptions {
            row_group_rows: ROW_GROUP,
            ..WriteOptions::default()
        },
    )
    .unwrap();
    (dir, trace)
}

/// Drains a source, checking the watermark promise batch by batch.
fn drain(source: &mut dyn RequestSource) -> (Vec<SourceRecord>, Vec<SourceError>) {
    let (mut records, mut errors) = (Vec::new(), Vec::new());
    let mut watermark = 0u64;
    let mut last = None;
    loop {
        // 700: batches and chunks of 1,024 rows are handed out in parts.
        match source.poll(700, 0) {
            Ok(b) if b.state == SourceState::Exhausted => {
                assert!(b.records.is_empty() && b.watermark_ms == u64::MAX, "{b:?}");
                break;
            }
            Ok(b) => {
                assert!(b.records.len() <= 700);
                for r in &b.records {
                    if let SourceRecord::Request { request, .. } = r {
                        assert!(
                            request.ts_ms >= watermark,
                            "ts {} behind watermark {watermark}",
                            request.ts_ms
                        );
                    }
                }
                assert!(b.watermark_ms >= watermark, "watermarks are monotone");
                watermark = b.watermark_ms;
                last = Some(b.watermark_ms);
                records.extend(b.records);
            }
            Err(e) => errors.push(e),
        }
    }
    if last.is_some() {
        assert_eq!(last, Some(u64::MAX), "the last batch closes the stream");
    }
    (records, errors)
}

fn check_shards(
    records_by_worker: Vec<Vec<SourceRecord>>,
    trace: &Trace,
    workers: usize,
    file_ends_with: &str,
) {
    let mut seen = BTreeMap::new();
    for (w, records) in records_by_worker.into_iter().enumerate() {
        for r in records {
            let SourceRecord::Request {
                request, position, ..
            } = r
            else {
                panic!("no bad rows expected")
            };
            let SourcePosition::Parquet {
                file,
                row_group,
                row,
            } = position
            else {
                panic!("parquet position")
            };
            assert!(file.ends_with(file_ends_with), "{file}");
            assert_eq!(
                row_group as usize % workers,
                w,
                "row group g goes to worker g mod workers"
            );
            assert_eq!(row as usize / ROW_GROUP, row_group as usize);
            assert_eq!(
                &request, &trace.requests[row as usize],
                "row {row} comes back as written"
            );
            assert!(
                seen.insert(request.req_id, w).is_none(),
                "req {} seen twice",
                request.req_id
            );
        }
    }
    assert_eq!(
        seen.len(),
        trace.requests.len(),
        "every row comes back once"
    );
}

#[test]
fn round_trip_over_1_2_and_4_workers() {
    let (dir, trace) = written("roundtrip");
    let info = ParquetRequestSource::inspect(&dir).unwrap();
    assert_eq!(info.rows, 3_000);
    assert_eq!(info.row_groups, 3_000usize.div_ceil(ROW_GROUP));
    assert_eq!(info.min_ts_ms, trace.requests[0].ts_ms);
    assert_eq!(info.max_ts_ms, trace.requests.last().unwrap().ts_ms);
    for workers in [1, 2, 4] {
        let per_worker: Vec<_> = (0..workers)
            .map(|w| {
                // Batches smaller than a row group exercise mid-group watermarks.
                let mut s = ParquetRequestSource::open(&dir, w, workers)
                    .unwrap()
                    .with_batch_rows(100);
                let (records, errors) = drain(&mut s);
                assert!(errors.is_empty(), "{errors:?}");
                records
            })
            .collect();
        check_shards(per_worker, &trace, workers, "requests.parquet");
    }
    let side = load_side_tables(&dir).unwrap();
    assert_eq!(Some(side.meta), trace.meta);
    assert_eq!(side.users, trace.users);
    assert_eq!(side.items, trace.items);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn memory_source_shards_like_row_groups() {
    let trace = small_trace();
    let requests = Arc::new(trace.requests.clone());
    for workers in [1, 2, 4] {
        let per_worker: Vec<_> = (0..workers)
            .map(|w| {
                let mut s =
                    MemoryRequestSource::with_chunk_rows(requests.clone(), w, workers, ROW_GROUP);
                drain(&mut s).0
            })
            .collect();
        check_shards(per_worker, &trace, workers, "<memory>");
    }
    // A worker with no chunk ends at once.
    let few = Arc::new(trace.requests[..10].to_vec());
    let polled = MemoryRequestSource::new(few, 1, 2).poll(100, 0).unwrap();
    assert_eq!(polled, Polled::exhausted());
}

#[test]
fn missing_directory_and_file_are_named() {
    let err = ParquetRequestSource::open(Path::new("/nonexistent/grflow-trace"), 0, 1).unwrap_err();
    assert!(matches!(err, SourceError::MissingDir { .. }), "{err}");
    assert!(
        err.to_string().contains("/nonexistent/grflow-trace"),
        "{err}"
    );
    let dir = tmp("missing");
    let err = load_side_tables(&dir).unwrap_err();
    assert!(
        err.to_string().contains("users.parquet") && err.to_string().contains("missing"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn truncated_file_is_a_clear_error() {
    let (dir, _) = written("truncated");
    let path = dir.join("requests.parquet");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let err = ParquetRequestSource::open(&dir, 0, 1).unwrap_err();
    assert!(matches!(err, SourceError::Corrupt { .. }), "{err}");
    assert!(
        err.to_string().contains("requests.parquet"),
        "names the file: {err}"
    );
    std::fs::write(dir.join("items.parquet"), b"not parquet at all").unwrap();
    let err = load_side_tables(&dir).unwrap_err();
    assert!(err.to_string().contains("items.parquet"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn corrupted_row_group_is_one_bad_record_per_row_and_the_rest_still_comes() {
    let (dir, trace) = written("corrupt");
    let path = dir.join("requests.parquet");
    let mut bytes = std::fs::read(&path).unwrap();
    // Overwrite the start of the data (row group 0's first pages); the footer stays intact.
    for b in &mut bytes[4..600] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let mut s = ParquetRequestSource::open(&dir, 0, 1).unwrap();
    let (records, errors) = drain(&mut s);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(records.len(), trace.requests.len(), "one record per row");
    let mut bad_rows = Vec::new();
    for r in &records {
        let SourcePosition::Parquet { row_group, row, .. } = r.position() else {
            panic!("parquet position")
        };
        match r {
            SourceRecord::Bad { reason, .. } => {
                assert_eq!(*row_group, 0);
                assert!(reason.contains("row group 0 unreadable"), "{reason}");
                bad_rows.push(*row);
            }
            SourceRecord::Request { request, .. } => {
                assert_ne!(*row_group, 0);
                assert_eq!(request, &trace.requests[*row as usize]);
            }
        }
    }
    // Row count of the damaged group from the footer.
    assert_eq!(bad_rows, (0..ROW_GROUP as u64).collect::<Vec<_>>());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn rows_with_too_many_candidates_are_bad_records_with_positions() {
    let mut trace = small_trace();
    trace.requests[7].candidates = (0..1_001).collect();
    let limit = 1_000;
    let (dir, trace) = written_with("max-candidates", trace);
    let mut s = ParquetRequestSource::open(&dir, 0, 1)
        .unwrap()
        .with_max_candidates(limit);
    let (records, _) = drain(&mut s);
    assert_eq!(records.len(), trace.requests.len());
    let bad: Vec<_> = records
        .iter()
        .filter_map(|r| match r {
            SourceRecord::Bad {
                position,
                reason,
                req_id,
            } => Some((position.to_string(), reason, *req_id)),
            SourceRecord::Request { .. } => None,
        })
        .collect();
    assert_eq!(bad.len(), 1, "{bad:?}");
    // Readable, so its error row names the request.
    assert_eq!(bad[0].2, Some(trace.requests[7].req_id));
    assert!(
        bad[0].0.ends_with("requests.parquet: row group 0, row 7"),
        "{}",
        bad[0].0
    );
    assert!(
        bad[0].1.starts_with("too_many_candidates")
            && bad[0].1.contains("`candidates`")
            && bad[0].1.contains("1001")
            && bad[0].1.contains("1000"),
        "{}",
        bad[0].1
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn write_batch(path: &Path, batch: &RecordBatch) {
    let mut w = ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), None).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

#[test]
fn nulls_in_required_columns_are_bad_rows_with_positions() {
    let dir = tmp("nulls");
    let rows: Vec<Request> = small_trace().requests[..6].to_vec();
    let good = requests_to_batch(&rows);
    // Same columns, all nullable, with holes in two required columns.
    let schema = Arc::new(Schema::new(
        REQUEST_COLUMNS
            .iter()
            .map(|c| {
                Field::new(
                    c.name,
                    good.schema()
                        .field_with_name(c.name)
                        .unwrap()
                        .data_type()
                        .clone(),
                    true,
                )
            })
            .collect::<Vec<_>>(),
    ));
    let mut columns: Vec<ArrayRef> = good.columns().to_vec();
    let ts: Vec<Option<u64>> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| (i != 2).then_some(r.ts_ms))
        .collect();
    columns[0] = Arc::new(UInt64Array::from(ts));
    let modes: Vec<Option<&str>> = (0..6)
        .map(|i| if i == 4 { None } else { Some("rank") })
        .collect();
    columns[5] = Arc::new(StringArray::from(modes));
    write_batch(
        &dir.join("requests.parquet"),
        &RecordBatch::try_new(schema, columns).unwrap(),
    );

    let mut s = ParquetRequestSource::open(&dir, 0, 1).unwrap();
    let (records, errors) = drain(&mut s);
    assert!(errors.is_empty());
    assert_eq!(records.len(), 6);
    let bad: Vec<(u64, String, Option<u64>)> = records
        .iter()
        .filter_map(|r| match r {
            SourceRecord::Bad {
                position: SourcePosition::Parquet { row, .. },
                reason,
                req_id,
            } => Some((*row, reason.clone(), *req_id)),
            _ => None,
        })
        .collect();
    assert_eq!(bad.len(), 2);
    // Their req_id column is readable: the error rows name the requests.
    assert_eq!(bad[0].2, Some(rows[2].req_id));
    assert_eq!(bad[1].2, Some(rows[4].req_id));
    assert_eq!(bad[0].0, 2);
    assert!(
        bad[0].1.contains("ts_ms") && bad[0].1.contains("null"),
        "{}",
        bad[0].1
    );
    assert_eq!(bad[1].0, 4);
    assert!(bad[1].1.contains("mode"), "{}", bad[1].1);
    let good_rows: Vec<u64> = records
        .iter()
        .filter_map(|r| match r {
            SourceRecord::Request {
                position: SourcePosition::Parquet { row, .. },
                ..
            } => Some(*row),
            _ => None,
        })
        .collect();
    assert_eq!(good_rows, [0, 1, 3, 5]);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn wrong_schema_names_the_column() {
    let dir = tmp("schema");
    let schema = Arc::new(Schema::new(vec![Field::new(
        "ts_ms",
        DataType::Int64,
        false,
    )]));
    let batch = RecordBatch::try_new(schema, vec![Arc::new(Int64Array::from(vec![1, 2]))]).unwrap();
    write_batch(&dir.join("requests.parquet"), &batch);
    let err = ParquetRequestSource::open(&dir, 0, 1).unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::Schema {
                column: "ts_ms",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("requests.parquet") && err.to_string().contains("Int64"),
        "{err}"
    );

    let schema = Arc::new(Schema::new(vec![Field::new(
        "ts_ms",
        DataType::UInt64,
        false,
    )]));
    let batch =
        RecordBatch::try_new(schema, vec![Arc::new(UInt64Array::from(vec![1, 2]))]).unwrap();
    write_batch(&dir.join("requests.parquet"), &batch);
    let err = ParquetRequestSource::inspect(&dir).unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::Schema {
                column: "req_id",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("missing column `req_id`"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_catalog_without_items_is_refused() {
    let (dir, mut trace) = written("no-items");
    trace.items.clear();
    write_trace(&dir, &trace, &WriteOptions::default()).unwrap();
    let err = load_side_tables(&dir).unwrap_err();
    assert!(matches!(err, SourceError::NoRows { .. }), "{err}");
    assert!(err.to_string().contains("items.parquet: no rows"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn side_table_rows_are_checked_against_the_metadata() {
    let (dir, mut trace) = written("side");
    trace.items[7].feature_ids[1] = u32::MAX;
    write_trace(&dir, &trace, &WriteOptions::default()).unwrap();
    let err = load_side_tables(&dir).unwrap_err();
    assert!(
        matches!(
            err,
            SourceError::BadRow {
                row: 7,
                column: "feature_ids",
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("items.parquet: row 7"), "{err}");
    // Two items with one semantic ID: the second could never be retrieved.
    let (dir2, mut dup) = written("side-dup-sid");
    dup.items[9].sid = dup.items[3].sid;
    write_trace(&dir2, &dup, &WriteOptions::default()).unwrap();
    let err = load_side_tables(&dir2).unwrap_err().to_string();
    assert!(
        err.contains("row 9") && err.contains("semantic IDs must be unique"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir2).unwrap();
    // A table larger than memory could hold is refused by name: u32::MAX
    // rows panicked the nodes (a row index wrapped).
    trace.items[7].feature_ids[1] = 0;
    trace.meta.as_mut().unwrap().table_rows[1] = u32::MAX;
    write_trace(&dir, &trace, &WriteOptions::default()).unwrap();
    let err = load_side_tables(&dir).unwrap_err().to_string();
    assert!(err.contains("table_rows[1] = 4294967295"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn imported_trace_round_trips() {
    let mut text = String::from("user_id:token\titem_id:token\trating:float\ttimestamp:float\n");
    for i in 0..600u64 {
        text += &format!("{}\t{}\t1\t{}\n", i % 37, (i * 7919) % 211, 1_000 + i / 3);
    }
    let trace = grflow_traces::import::import_str(
        &text,
        "inline.inter",
        &grflow_traces::ImportConfig::default(),
    )
    .unwrap();
    let dir = tmp("imported");
    write_trace(
        &dir,
        &trace,
        &WriteOptions {
            row_group_rows: ROW_GROUP,
            ..WriteOptions::default()
        },
    )
    .unwrap();
    for workers in [1, 2, 4] {
        let per_worker: Vec<_> = (0..workers)
            .map(|w| drain(&mut ParquetRequestSource::open(&dir, w, workers).unwrap()).0)
            .collect();
        check_shards(per_worker, &trace, workers, "requests.parquet");
    }
    assert_eq!(load_side_tables(&dir).unwrap().users, trace.users);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A requests.parquet written without column statistics: the event-time
/// range comes from the column itself (it was 0, so a paced replay of epoch
/// timestamps waited decades for its first request), and watermarks still
/// hold.
#[test]
fn a_file_without_statistics_reports_its_true_event_time_range() {
    let (dir, trace) = written("no-stats");
    let path = dir.join("requests.parquet");
    // Rewrite it with statistics off, in row groups as before.
    let props = parquet::file::properties::WriterProperties::builder()
        .set_statistics_enabled(parquet::file::properties::EnabledStatistics::None)
        .set_max_row_group_row_count(Some(ROW_GROUP))
        .build();
    let batch = requests_to_batch(&trace.requests);
    let mut w =
        ArrowWriter::try_new(File::create(&path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
    let info = ParquetRequestSource::inspect(&dir).unwrap();
    let (lo, hi) = (
        trace.requests.iter().map(|r| r.ts_ms).min().unwrap(),
        trace.requests.iter().map(|r| r.ts_ms).max().unwrap(),
    );
    assert_eq!((info.min_ts_ms, info.max_ts_ms), (lo, hi));
    assert!(info.row_groups > 1, "{info:?}");
    let mut source = ParquetRequestSource::open(&dir, 0, 1).unwrap();
    let (records, errors) = drain(&mut source);
    assert!(errors.is_empty());
    assert_eq!(records.len(), trace.requests.len());
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A row group whose ts_ms are all null holds no request (each row is a bad
/// row): it must not pull the trace's event-time range down to 0, which
/// made a paced replay of epoch timestamps wait decades for its first
/// request.
#[test]
fn a_row_group_without_a_valid_ts_ms_does_not_start_the_trace_at_zero() {
    let dir = tmp("null-group");
    let rows: Vec<Request> = small_trace().requests[..6].to_vec();
    let good = requests_to_batch(&rows);
    let schema = Arc::new(Schema::new(
        good.schema()
            .fields()
            .iter()
            .map(|f| Field::new(f.name(), f.data_type().clone(), true))
            .collect::<Vec<_>>(),
    ));
    let first = RecordBatch::try_new(schema.clone(), good.slice(0, 3).columns().to_vec()).unwrap();
    let mut columns: Vec<ArrayRef> = good.slice(3, 3).columns().to_vec();
    columns[0] = Arc::new(UInt64Array::from(vec![None::<u64>; 3]));
    let second = RecordBatch::try_new(schema.clone(), columns).unwrap();
    let mut w = ArrowWriter::try_new(
        File::create(dir.join("requests.parquet")).unwrap(),
        schema,
        None,
    )
    .unwrap();
    w.write(&first).unwrap();
    w.flush().unwrap();
    w.write(&second).unwrap();
    w.close().unwrap();
    let info = ParquetRequestSource::inspect(&dir).unwrap();
    assert_eq!(info.row_groups, 2);
    let lo = rows[..3].iter().map(|r| r.ts_ms).min().unwrap();
    assert!(lo > 0);
    assert_eq!(info.min_ts_ms, lo, "{info:?}");
    let mut s = ParquetRequestSource::open(&dir, 0, 1).unwrap();
    let (records, errors) = drain(&mut s);
    assert!(errors.is_empty());
    let bad = records
        .iter()
        .filter(|r| matches!(r, SourceRecord::Bad { .. }))
        .count();
    assert_eq!((records.len(), bad), (6, 3));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn repeated_req_ids_are_counted_exactly_in_one_pass_or_many() {
    let mut trace = small_trace();
    let ids: Vec<u64> = trace.requests.iter().map(|r| r.req_id).collect();
    // Rows 900 and 2,500 repeat row 300's id (in two other row groups);
    // row 1,000 repeats row 10's, whose id is smaller.
    for (row, from) in [(900, 300), (2_500, 300), (1_000, 10)] {
        trace.requests[row].req_id = ids[from];
    }
    let (dir, _) = written_with("repeated-ids", trace);
    let expected = grflow_connectors::parquet::DuplicateIds {
        rows: 3,
        example: Some((ids[10].min(ids[300]), 10, 1_000)),
        unreadable_groups: Vec::new(),
    };
    assert!(
        ids[10] < ids[300],
        "the example is the smallest repeated id"
    );
    // One pass holds every id; 7 per pass takes ~430 passes.
    for per_pass in [1_000_000, 1_000, 7] {
        let found = ParquetRequestSource::duplicate_req_ids(&dir, per_pass)
            .unwrap()
            .expect("a readable req_id column");
        assert_eq!(found, expected, "{per_pass} ids per pass");
    }
    let (clean, _) = written("unique-ids");
    let found = ParquetRequestSource::duplicate_req_ids(&clean, 7)
        .unwrap()
        .unwrap();
    assert_eq!((found.rows, found.example), (0, None));
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&clean).unwrap();
}

/// One unreadable row group leaves the others' req_ids checked, and says
/// which group went unchecked.
#[test]
fn an_unreadable_row_group_leaves_the_rest_checked_for_repeated_ids() {
    let mut trace = small_trace();
    let ids: Vec<u64> = trace.requests.iter().map(|r| r.req_id).collect();
    // Row 2,500 (row group 9) and row 1,000 (group 3) repeat earlier ids.
    for (row, from) in [(2_500, 300), (1_000, 10)] {
        trace.requests[row].req_id = ids[from];
    }
    let (dir, _) = written_with("repeated-ids-corrupt", trace);
    let path = dir.join("requests.parquet");
    let meta = ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Skip)
        .parse_and_finish(&File::open(&path).unwrap())
        .unwrap();
    let chunk = meta
        .row_group(9)
        .columns()
        .iter()
        .find(|c| c.column_path().string() == "req_id")
        .unwrap();
    let (at, len) = (
        chunk.data_page_offset() as usize,
        chunk.compressed_size() as usize,
    );
    let mut bytes = std::fs::read(&path).unwrap();
    for b in &mut bytes[at..at + len] {
        *b ^= 0x5A;
    }
    std::fs::write(&path, &bytes).unwrap();
    let found = ParquetRequestSource::duplicate_req_ids(&dir, 1_000_000)
        .unwrap()
        .expect("a u64 req_id column");
    assert_eq!(found.rows, 1, "{found:?}");
    assert_eq!(found.example, Some((ids[10], 10, 1_000)));
    assert_eq!(found.unreadable_groups, vec![9]);
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `batch` written to `path` in row groups of `ROW_GROUP`.
fn write_groups(path: &Path, batch: &RecordBatch, statistics: EnabledStatistics) {
    let props = WriterProperties::builder()
        .set_statistics_enabled(statistics)
        .set_max_row_group_row_count(Some(ROW_GROUP))
        .build();
    let mut w =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(batch).unwrap();
    w.close().unwrap();
}

/// Statistics count bad rows too: one row with ts_ms 0 (a bad row, its
/// mode unknown) started a 1x replay of epoch-ms stamps ~50 years before
/// its first request. The range is that of the valid requests.
#[test]
fn bad_rows_do_not_move_the_event_time_range() {
    let dir = tmp("bad-row-range");
    let path = dir.join("requests.parquet");
    let mut rows = small_trace().requests;
    for r in &mut rows {
        r.ts_ms += 1_600_000_000_000;
    }
    let range = |rows: &[Request]| {
        let ts = rows.iter().map(|r| r.ts_ms);
        (ts.clone().min().unwrap(), ts.max().unwrap())
    };
    // Row 1,000 (row group 3): ts_ms 0 and mode "browse"; row 2,000:
    // after the year 9999. Both are bad rows.
    let valid = range(&[&rows[..1_000], &rows[1_001..2_000], &rows[2_001..]].concat());
    rows[1_000].ts_ms = 0;
    rows[2_000].ts_ms = MAX_TS_MS + 1;
    let batch = requests_to_batch(&rows);
    let mut columns = batch.columns().to_vec();
    let modes: Vec<&str> = rows
        .iter()
        .enumerate()
        .map(|(i, r)| {
            if i == 1_000 {
                "browse"
            } else {
                r.mode.as_str()
            }
        })
        .collect();
    columns[5] = Arc::new(StringArray::from(modes));
    let batch = RecordBatch::try_new(batch.schema(), columns).unwrap();
    write_groups(&path, &batch, EnabledStatistics::Chunk);
    let info = ParquetRequestSource::inspect(&dir).unwrap();
    assert!(info.row_groups > 8, "{info:?}");
    assert_eq!((info.min_ts_ms, info.max_ts_ms), valid, "{info:?}");

    // Without statistics and with row group 0 unreadable, its range is
    // unknown: it leaves the minimum to the others (it was 0) and makes
    // the maximum unknown.
    write_groups(&path, &batch, EnabledStatistics::None);
    let mut bytes = std::fs::read(&path).unwrap();
    for b in &mut bytes[4..600] {
        *b = 0xA5;
    }
    std::fs::write(&path, &bytes).unwrap();
    let info = ParquetRequestSource::inspect(&dir).unwrap();
    let rest = range(&rows[ROW_GROUP..1_000]);
    assert_eq!(
        (info.min_ts_ms, info.max_ts_ms),
        (rest.0, u64::MAX),
        "{info:?}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Bad rows in many row groups: one with ts_ms 0 and one with a stamp
/// after every request (both mode "browse") in each of the 12 groups. Only
/// 4 groups were decoded, the 5th group's statistics taken, so a paced
/// replay of epoch-ms stamps waited ~54 years for its first request.
#[test]
fn bad_rows_in_every_row_group_do_not_move_the_event_time_range() {
    let dir = tmp("bad-rows-everywhere");
    let path = dir.join("requests.parquet");
    let mut rows = small_trace().requests;
    for r in &mut rows {
        r.ts_ms += 1_700_000_000_000;
    }
    let groups = rows.len().div_ceil(ROW_GROUP);
    assert!(groups > 5);
    let bad: Vec<usize> = (0..groups)
        .flat_map(|g| [g * ROW_GROUP + 7, g * ROW_GROUP + 9])
        .filter(|&i| i < rows.len())
        .collect();
    let valid: Vec<u64> = (0..rows.len())
        .filter(|i| !bad.contains(i))
        .map(|i| rows[i].ts_ms)
        .collect();
    let valid = (*valid.iter().min().unwrap(), *valid.iter().max().unwrap());
    for (k, &i) in bad.iter().enumerate() {
        rows[i].ts_ms = if k % 2 == 0 { 0 } else { valid.1 + 86_400_000 };
    }
    let batch = requests_to_batch(&rows);
    let mut columns = batch.columns().to_vec();
    let modes: Vec<&str> = (0..rows.len())
        .map(|i| {
            if bad.contains(&i) {
                "browse"
            } else {
                rows[i].mode.as_str()
            }
        })
        .collect();
    columns[5] = Arc::new(StringArray::from(modes));
    let batch = RecordBatch::try_new(batch.schema(), columns).unwrap();
    write_groups(&path, &batch, EnabledStatistics::Chunk);
    let info = ParquetRequestSource::inspect(&dir).unwrap();
    assert_eq!(info.row_groups, groups);
    assert_eq!((info.min_ts_ms, info.max_ts_ms), valid, "{info:?}");
    let (records, errors) = drain(&mut ParquetRequestSource::open(&dir, 0, 1).unwrap());
    assert!(errors.is_empty(), "{errors:?}");
    let served = records
        .iter()
        .filter(|r| matches!(r, SourceRecord::Request { .. }))
        .count();
    assert_eq!(
        (records.len(), served),
        (rows.len(), rows.len() - bad.len())
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Rewrites the footer of `path` with row group `g` claiming `rows` rows
/// (the file's total follows); the data stays as it was.
fn rewrite_row_count(path: &Path, g: usize, rows: i64) {
    let bytes = std::fs::read(path).unwrap();
    let meta = ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Skip)
        .parse_and_finish(&File::open(path).unwrap())
        .unwrap();
    // The file ends in the footer, its length (4 bytes) and "PAR1".
    let footer = u32::from_le_bytes(bytes[bytes.len() - 8..bytes.len() - 4].try_into().unwrap());
    let mut out = bytes[..bytes.len() - 8 - footer as usize].to_vec();
    let mut builder = meta.into_builder();
    let mut groups = builder.take_row_groups();
    groups[g] = groups[g]
        .clone()
        .into_builder()
        .set_num_rows(rows)
        .build()
        .unwrap();
    let meta = builder.set_row_groups(groups).build();
    ParquetMetaDataWriter::new(&mut out, &meta)
        .finish()
        .unwrap();
    std::fs::write(path, out).unwrap();
}

/// A negative row count in the footer made the source allocate
/// `usize::MAX` records (a panic); it is a corrupt file, named.
#[test]
fn a_negative_row_count_in_the_footer_is_a_corrupt_file() {
    let (dir, _) = written("negative-rows");
    rewrite_row_count(&dir.join("requests.parquet"), 1, -1);
    let errors = [
        ParquetRequestSource::open(&dir, 0, 1).unwrap_err(),
        ParquetRequestSource::inspect(&dir).unwrap_err(),
    ];
    for err in errors {
        assert!(matches!(err, SourceError::Corrupt { .. }), "{err}");
        let message = err.to_string();
        assert!(
            message.contains("requests.parquet") && message.contains("row group 1"),
            "{message}"
        );
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A row group whose data holds fewer rows than its footer says: the
/// missing rows are bad rows, not silently gone.
#[test]
fn rows_missing_from_a_row_group_are_bad_rows() {
    let (dir, trace) = written("short-group");
    rewrite_row_count(&dir.join("requests.parquet"), 0, ROW_GROUP as i64 + 5);
    let mut s = ParquetRequestSource::open(&dir, 0, 1).unwrap();
    let (records, errors) = drain(&mut s);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(records.len(), trace.requests.len() + 5);
    let bad: Vec<String> = records
        .iter()
        .filter_map(|r| match r {
            SourceRecord::Bad {
                position, reason, ..
            } => Some(format!("{position}: {reason}")),
            SourceRecord::Request { .. } => None,
        })
        .collect();
    assert_eq!(bad.len(), 5, "{bad:?}");
    assert!(
        bad[0].contains("row group 0, row 256: row group 0 unreadable")
            && bad[0].contains("261 rows"),
        "{}",
        bad[0]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A footer that claims 2^40 rows for a short row group (consistently,
/// so the file opens): the group's requests come first and the missing
/// rows follow as bad rows, made as they are handed out (one record per
/// claimed row used to be built at once, exhausting memory).
#[test]
fn a_huge_row_count_in_the_footer_is_handed_out_lazily() {
    let (dir, trace) = written("huge-rows");
    let huge = 1i64 << 40;
    rewrite_row_count(&dir.join("requests.parquet"), 0, huge);
    let mut s = ParquetRequestSource::open(&dir, 0, 1).unwrap();
    let mut requests = 0;
    let mut bad = Vec::new();
    // A few polls: the 256 requests of group 0, then missing rows.
    for _ in 0..4 {
        for r in s.poll(DEFAULT_BATCH_ROWS, 0).unwrap().records {
            match r {
                SourceRecord::Request { .. } => requests += 1,
                SourceRecord::Bad {
                    position, reason, ..
                } => bad.push(format!("{position}: {reason}")),
            }
        }
    }
    assert_eq!(requests, ROW_GROUP.min(trace.requests.len()));
    assert!(bad.len() >= DEFAULT_BATCH_ROWS, "{}", bad.len());
    assert!(
        bad[0].contains("row group 0, row 256: row group 0 unreadable"),
        "{}",
        bad[0]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}
