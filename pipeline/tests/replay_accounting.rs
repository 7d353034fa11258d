//! Exact accounting over broken Parquet input (issue 28, item 4): every
//! record the source meets counts in `requests_in` and gets exactly one
//! response or error, a row that fails to decode as well as each row of a
//! row group that cannot be read at all (its row count from the footer).

use std::fs::File;
use std::path::{Path, PathBuf};

use grflow_pipeline::{Config, ReplayOptions, ReplayOutput, SloMs, TraceInput, replay};
use grflow_traces::{GenConfig, Mode, Regime, Trace, WriteOptions, generate, write_trace};
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

/// A Steady trace of `REQUESTS` requests from 60 users.
fn small_trace(seed: u64, retrieve_share: f64) -> Trace {
    generate(&GenConfig {
        regime: Regime::Steady,
        users: 60,
        items: 800,
        requests: REQUESTS as u64,
        rps: 100.0,
        seed,
        retrieve_share,
        ..GenConfig::default()
    })
}

/// Replays the Parquet trace in `dir`, responses collected.
fn replay_parquet(dir: &Path, config: Config) -> ReplayOutput {
    replay(ReplayOptions {
        trace: TraceInput::Parquet(dir.to_path_buf()),
        config,
        show_progress: false,
        responses: grflow_pipeline::replay::ResponseOutput::Collect,
        counters: None,
        commands: Vec::new(),
        oracle_step: None,
        stop: None,
    })
    .unwrap()
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
    let mut trace = small_trace(5, 0.0);
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
    let out = replay_parquet(&dir, config);
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

/// A request the node cannot serve (its history is longer than the user
/// has) is answered with an error record and counts as an SLO miss, in the
/// run's figure and in its kind's; a row that fails to decode is not a
/// request and does not.
#[test]
fn an_unservable_request_is_an_slo_miss_of_its_kind() {
    let mut trace = small_trace(9, 0.25);
    let history_of = |user: u64| {
        trace
            .users
            .iter()
            .find(|u| u.user_id == user)
            .map_or(0, |u| u.items.len())
    };
    // Two rank requests and one retrieve request ask for more history than
    // their users have.
    let mut unservable = Vec::new();
    for want in [Mode::Rank, Mode::Rank, Mode::Retrieve] {
        let row = (0..REQUESTS)
            .find(|&i| {
                let r = &trace.requests[i];
                r.mode == want && history_of(r.user_id) > 0 && !unservable.contains(&i)
            })
            .expect("a request of each kind from a known user");
        trace.requests[row].hist_len = history_of(trace.requests[row].user_id) as u32 + 1;
        unservable.push(row);
    }
    let bad_row = (0..REQUESTS)
        .find(|&i| trace.requests[i].mode == Mode::Rank && !unservable.contains(&i))
        .unwrap();
    trace.requests[bad_row].candidates.clear();
    let dir = tmp("unservable");
    write_trace(&dir, &trace, &WriteOptions::default()).unwrap();

    let mut config = Config::embedded();
    config.run.speed = "max".into();
    // Every response meets an SLO this loose, so misses are the failures.
    config.run.slo_ms = SloMs {
        rank: 1e9,
        retrieve: 1e9,
    };
    let out = replay_parquet(&dir, config);
    let s = &out.summary;
    assert_eq!(s.requests_in, REQUESTS as u64);
    assert_eq!(s.errors, 4, "{:?}", out.errors);
    assert_eq!(s.responses_out, REQUESTS as u64 - 4);
    assert_eq!(s.by_mode.rank.failed, 2, "{:?}", s.by_mode);
    assert_eq!(s.by_mode.retrieve.failed, 1, "{:?}", s.by_mode);
    let answered = s.responses_out as f64;
    assert_eq!(s.slo_satisfaction, Some(answered / (answered + 3.0)));
    let rank = &s.by_mode.rank;
    assert_eq!(
        rank.slo_satisfaction,
        Some(rank.responses as f64 / (rank.responses + 2) as f64)
    );
    let retrieve = &s.by_mode.retrieve;
    assert_eq!(
        retrieve.slo_satisfaction,
        Some(retrieve.responses as f64 / (retrieve.responses + 1) as f64)
    );
    // A node's figure covers its responses only: the record names no node.
    for n in &s.nodes {
        assert_eq!(n.slo_satisfaction, Some(1.0), "node {}", n.node);
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A trace whose rows repeat req_ids: every row is served (nothing is
/// dropped), and the summary counts the rows whose id an earlier row
/// already carries; a trace without repeats says 0.
#[test]
fn repeated_req_ids_are_served_and_counted() {
    let mut trace = small_trace(11, 0.0);
    let ids: Vec<u64> = trace.requests.iter().map(|r| r.req_id).collect();
    // Rows 5 and 9 reuse row 2's id, row 40 reuses row 7's.
    for (row, from) in [(5, 2), (9, 2), (40, 7)] {
        trace.requests[row].req_id = ids[from];
    }
    let dir = tmp("repeated-ids");
    write_trace(&dir, &trace, &WriteOptions::default()).unwrap();
    let mut config = Config::embedded();
    config.run.speed = "max".into();
    let out = replay_parquet(&dir, config.clone());
    assert_eq!(out.summary.requests_in, REQUESTS as u64);
    assert_eq!(
        out.summary.responses_out + out.summary.errors,
        REQUESTS as u64
    );
    assert_eq!(out.summary.duplicate_req_ids, Some(3));
    let twice = out.responses.iter().filter(|r| r.req_id == ids[2]).count();
    assert_eq!(twice, 3, "the three rows of one id are all answered");

    let clean = tmp("unique-ids");
    write_trace(&clean, &small_trace(11, 0.0), &WriteOptions::default()).unwrap();
    assert_eq!(
        replay_parquet(&clean, config).summary.duplicate_req_ids,
        Some(0)
    );
    std::fs::remove_dir_all(&dir).unwrap();
    std::fs::remove_dir_all(&clean).unwrap();
}
