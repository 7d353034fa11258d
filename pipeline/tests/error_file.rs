//! errors.parquet of a replay with many bad rows: the rows stream to a
//! sink that holds a bounded number of them (sorted runs on disk), and the
//! file has every error once, in trace order, with columns that join it
//! back to the trace.

use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::{AsArray, RecordBatch};
use arrow::datatypes::{UInt32Type, UInt64Type};
use grflow_pipeline::replay::ResponseOutput;
use grflow_pipeline::{Config, ReplayOptions, TraceInput, replay};
use grflow_traces::{GenConfig, Regime, WriteOptions, generate, write_trace};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;

const REQUESTS: u64 = 40_000;
const ROW_GROUP: u64 = 4_096;
/// One request in this many is good; the others cannot be decoded.
const GOOD_EVERY: u64 = 40;
const WORKERS: usize = 2;
/// Error rows the job may hold in memory at once: the error sink's sort
/// buffer, and on each worker less than two batches of 1 Ki waiting for it.
const HELD_BOUND: usize = 16 * 1024 + WORKERS * 2 * 1024;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grflow-errfile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn read(path: &Path) -> (Vec<RecordBatch>, Option<String>) {
    let builder = ParquetRecordBatchReaderBuilder::try_new(File::open(path).unwrap()).unwrap();
    let version = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .and_then(|kv| {
            kv.iter()
                .find(|kv| kv.key == grflow_traces::columnar::VERSION_KEY)
        })
        .and_then(|kv| kv.value.clone());
    let batches = builder.build().unwrap().map(Result::unwrap).collect();
    (batches, version)
}

#[test]
fn many_bad_rows_stream_to_a_sorted_file_in_bounded_memory() {
    let mut trace = generate(&GenConfig {
        regime: Regime::Steady,
        users: 60,
        items: 800,
        candidates: 20,
        requests: REQUESTS,
        rps: 1_000.0,
        seed: 11,
        retrieve_share: 0.0,
        ..GenConfig::default()
    });
    // A rank request without candidates fails to decode.
    for (i, r) in trace.requests.iter_mut().enumerate() {
        if !(i as u64).is_multiple_of(GOOD_EVERY) {
            r.candidates.clear();
        }
    }
    let dir = tmp("many");
    let path = dir.join("trace");
    write_trace(
        &path,
        &trace,
        &WriteOptions {
            row_group_rows: ROW_GROUP as usize,
            ..WriteOptions::default()
        },
    )
    .unwrap();
    let (responses, errors) = (dir.join("responses.parquet"), dir.join("errors.parquet"));
    let mut config = Config::embedded();
    config.run.speed = "max".into();
    config.run.workers = WORKERS;
    let mut opts = ReplayOptions::new(TraceInput::Parquet(path.clone()), config);
    opts.responses = ResponseOutput::Parquet {
        responses: responses.clone(),
        errors: errors.clone(),
    };
    let out = replay(opts).unwrap();

    let s = &out.summary;
    let bad = REQUESTS - REQUESTS / GOOD_EVERY;
    assert_eq!(s.requests_in, REQUESTS);
    assert_eq!(s.requests_in, s.responses_out + s.errors, "nothing lost");
    assert_eq!(s.errors, bad);
    assert!(out.errors.is_empty(), "rows went to the file, not memory");
    assert!(
        out.errors_held_peak > 0 && out.errors_held_peak <= HELD_BOUND,
        "the job held {} error rows at once, of {bad}",
        out.errors_held_peak
    );
    assert!(
        !dir.join("errors.parquet.runs").exists(),
        "runs removed once merged"
    );

    let (batches, version) = read(&errors);
    assert_eq!(version.as_deref(), Some("1"));
    let trace_file = path.join("requests.parquet").display().to_string();
    let mut rows = Vec::new();
    for b in &batches {
        let position = b.column_by_name("position").unwrap().as_string::<i32>();
        let reason = b.column_by_name("reason").unwrap().as_string::<i32>();
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
            assert!(
                reason.value(i).contains("candidates"),
                "{}",
                reason.value(i)
            );
            // The columns say what the text says.
            assert_eq!(file.value(i), trace_file);
            assert_eq!(u64::from(group.value(i)), row.value(i) / ROW_GROUP);
            assert_eq!(
                position.value(i),
                format!(
                    "{trace_file}: row group {}, row {}",
                    group.value(i),
                    row.value(i)
                )
            );
            rows.push(row.value(i));
        }
    }
    assert_eq!(rows.len() as u64, s.errors, "one row per error");
    let want: Vec<u64> = (0..REQUESTS)
        .filter(|i| !i.is_multiple_of(GOOD_EVERY))
        .collect();
    assert_eq!(rows, want, "every bad row once, in trace order");

    let (batches, version) = read(&responses);
    assert_eq!(version.as_deref(), Some("1"));
    let served: usize = batches.iter().map(|b| b.num_rows()).sum();
    assert_eq!(served as u64, s.responses_out);
    std::fs::remove_dir_all(&dir).unwrap();
}
