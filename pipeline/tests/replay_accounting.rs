//! Exact accounting over broken Parquet input (issue 28, item 4): every
//! record the source meets counts in `requests_in` and gets exactly one
//! response or error, a row that fails to decode as well as each row of a
//! row group that cannot be read at all (its row count from the footer).

use std::fs::File;
use std::path::PathBuf;

use grflow_pipeline::{Config, ReplayOptions, TraceInput, replay};
use grflow_traces::{GenConfig, Regime, WriteOptions, generate, write_trace};
use parquet::file::reader::{FileReader, SerializedFileReader};

const ROW_GROUP: usize = 64;
const REQUESTS: usize = 320;
/// A rank request without candidates: row 30 fails to decode.
const BAD_ROW: usize = 30;
/// Row group 2 (rows 128..192) has its first column chunk overwritten.
const BAD_GROUP: usize = 2;

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grflow-acct-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Overwrites the first column chunk of row group `g` (its page headers),
/// leaving the footer intact.
fn corrupt_row_group(path: &std::path::Path, g: usize) {
    let (start, len) = {
        let reader = SerializedFileReader::new(File::open(path).unwrap()).unwrap();
        let (start, len) = reader.metadata().row_group(g).column(0).byte_range();
        (start as usize, len as usize)
    };
    let mut bytes = std::fs::read(path).unwrap();
    for b in &mut bytes[start..start + len] {
        *b = 0xA5;
    }
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn a_bad_row_and_an_unreadable_row_group_are_counted_in_and_answered_per_row() {
    let mut trace = generate(&GenConfig {
        regime: Regime::Steady,
        users: 60,
        items: 800,
        requests: REQUESTS as u64,
        rps: 100.0,
        seed: 5,
        ..GenConfig::default()
    });
    trace.requests[BAD_ROW].candidates.clear();
    let dir = tmp("broken");
    write_trace(
        &dir,
        &trace,
        &WriteOptions {
            row_group_rows: ROW_GROUP,
            ..WriteOptions::default()
        },
    )
    .unwrap();
    let file = dir.join("requests.parquet");
    corrupt_row_group(&file, BAD_GROUP);

    let mut config = Config::embedded();
    config.run.speed = "max".into();
    let out = replay(ReplayOptions {
        trace: TraceInput::Parquet(dir.clone()),
        config,
        show_progress: false,
        responses: grflow_pipeline::replay::ResponseOutput::Collect,
        counters: None,
        commands: Vec::new(),
        oracle_step: None,
    })
    .unwrap();
    let s = &out.summary;
    assert_eq!(
        s.requests_in, REQUESTS as u64,
        "every row of the file counts in"
    );
    assert_eq!(s.requests_in, s.responses_out + s.errors, "{s:?}");
    assert_eq!(s.errors, 1 + ROW_GROUP as u64);
    assert_eq!(out.errors.len() as u64, s.errors);

    let name = file.display().to_string();
    let mut bad_group_rows = Vec::new();
    let mut bad_row = None;
    for e in &out.errors {
        assert!(e.position.starts_with(&name), "{}", e.position);
        if e.position.contains(&format!("row group {BAD_GROUP},")) {
            assert!(e.reason.contains("unreadable"), "{}", e.reason);
            let row: usize = e.position.rsplit("row ").next().unwrap().parse().unwrap();
            bad_group_rows.push(row);
        } else {
            assert!(e.reason.contains("candidates"), "{}", e.reason);
            bad_row = Some(e.position.clone());
        }
    }
    bad_group_rows.sort_unstable();
    let expected: Vec<usize> = (BAD_GROUP * ROW_GROUP..(BAD_GROUP + 1) * ROW_GROUP).collect();
    assert_eq!(
        bad_group_rows, expected,
        "one error per row, with its position"
    );
    assert_eq!(bad_row, Some(format!("{name}: row group 0, row {BAD_ROW}")));
    let answered: std::collections::HashSet<u64> = out.responses.iter().map(|r| r.req_id).collect();
    for (row, r) in trace.requests.iter().enumerate() {
        let readable = row != BAD_ROW && row / ROW_GROUP != BAD_GROUP;
        assert_eq!(answered.contains(&r.req_id), readable, "row {row}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}
