//! A requests.parquet with one damaged page: the rows of that page are bad
//! records (with their req_id where that column is intact), every other
//! row of its row group is served.

use std::fs::File;
use std::path::{Path, PathBuf};

use grflow_connectors::SourcePosition;
use grflow_connectors::parquet::{ParquetRequestSource, RequestSource, SourceRecord, SourceState};
use grflow_traces::columnar::requests_to_batch;
use grflow_traces::{GenConfig, Regime, Request, generate};
use parquet::arrow::ArrowWriter;
use parquet::basic::{Compression, ZstdLevel};
use parquet::file::metadata::{PageIndexPolicy, ParquetMetaDataReader};
use parquet::file::properties::WriterProperties;

const ROW_GROUP: usize = 1024;
/// Rows per data page: several pages per column chunk.
const PAGE_ROWS: usize = 128;
/// zstd's frame magic, which starts every compressed page's payload.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xB5, 0x2F, 0xFD];

fn tmp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("grflow-pqdmg-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn requests() -> Vec<Request> {
    generate(&GenConfig {
        regime: Regime::Burst,
        users: 120,
        items: 1_500,
        requests: 3_000,
        rps: 60.0,
        seed: 5,
        retrieve_share: 0.1,
        ..GenConfig::default()
    })
    .requests
}

/// `rows` in row groups of `ROW_GROUP`, pages of `PAGE_ROWS`, zstd, with
/// or without an offset index (pyarrow writes none by default).
fn write(path: &Path, rows: &[Request], offset_index: bool) {
    let props = WriterProperties::builder()
        .set_compression(Compression::ZSTD(ZstdLevel::default()))
        .set_max_row_group_row_count(Some(ROW_GROUP))
        .set_data_page_row_count_limit(PAGE_ROWS)
        .set_write_batch_size(PAGE_ROWS / 2)
        .set_offset_index_disabled(!offset_index)
        .build();
    let batch = requests_to_batch(rows);
    let mut w =
        ArrowWriter::try_new(File::create(path).unwrap(), batch.schema(), Some(props)).unwrap();
    w.write(&batch).unwrap();
    w.close().unwrap();
}

/// Damages data page `page` of leaf column `column` in row group `g` (its
/// zstd magic, so that it cannot be decompressed; its header stays) and
/// returns the rows of that page, in the file. The page is found in a copy
/// written with an offset index: the data lies at the same offsets.
fn damage_page(
    path: &Path,
    rows: &[Request],
    g: usize,
    column: usize,
    page: usize,
) -> std::ops::Range<u64> {
    let indexed = path.with_extension("indexed");
    write(&indexed, rows, true);
    let meta = ParquetMetaDataReader::new()
        .with_page_index_policy(PageIndexPolicy::Required)
        .parse_and_finish(&File::open(&indexed).unwrap())
        .unwrap();
    std::fs::remove_file(&indexed).unwrap();
    let index = meta.page_index_for_row_group(g);
    let pages = index.offset_index(column).unwrap().page_locations();
    assert!(pages.len() > page + 1, "{} pages", pages.len());
    let (at, len) = (
        pages[page].offset as usize,
        pages[page].compressed_page_size as usize,
    );
    let mut bytes = std::fs::read(path).unwrap();
    let magic = bytes[at..at + len]
        .windows(4)
        .position(|w| w == ZSTD_MAGIC)
        .expect("a zstd page");
    bytes[at + magic..at + magic + 4].fill(0);
    std::fs::write(path, &bytes).unwrap();
    let first = (g * ROW_GROUP) as u64;
    first + pages[page].first_row_index as u64..first + pages[page + 1].first_row_index as u64
}

/// Every record of worker 0 of 1.
fn drain(dir: &Path) -> Vec<SourceRecord> {
    let mut source = ParquetRequestSource::open(dir, 0, 1).unwrap();
    let mut records = Vec::new();
    loop {
        let polled = source.poll(700, 0).unwrap();
        if polled.state == SourceState::Exhausted {
            return records;
        }
        records.extend(polled.records);
    }
}

/// Pages damaged in row group 1, as (leaf column, page): leaf columns 1
/// req_id, 2 user_id, 4 candidates (a list); with and without an offset
/// index; two pages of one group in the last case.
#[test]
fn a_damaged_page_costs_its_rows_only() {
    let rows = requests();
    let cases: [(&[(usize, usize)], bool); 5] = [
        (&[(2, 3)], true),
        (&[(2, 3)], false),
        (&[(4, 3)], true),
        (&[(1, 3)], true),
        (&[(2, 1), (4, 5)], true),
    ];
    for (k, (pages, offset_index)) in cases.into_iter().enumerate() {
        let case = format!("pages {pages:?}, offset index {offset_index}");
        let dir = tmp(&format!("case{k}"));
        let path = dir.join("requests.parquet");
        write(&path, &rows, offset_index);
        let mut damaged = Vec::new();
        let mut id_damaged = Vec::new();
        for &(column, page) in pages {
            let run = damage_page(&path, &rows, 1, column, page);
            if column == 1 {
                id_damaged.extend(run.clone());
            }
            damaged.extend(run);
        }
        damaged.sort_unstable();
        let records = drain(&dir);
        let mut seen = Vec::new();
        let mut bad = Vec::new();
        for r in &records {
            let SourcePosition::Parquet { row, row_group, .. } = r.position() else {
                panic!("parquet position")
            };
            seen.push(*row);
            let expected = &rows[*row as usize];
            match r {
                SourceRecord::Request { request, .. } => assert_eq!(request, expected, "{case}"),
                SourceRecord::Bad { reason, req_id, .. } => {
                    assert_eq!(*row_group, 1, "{case}: {reason}");
                    assert!(
                        reason.contains("row group 1 unreadable"),
                        "{case}: {reason}"
                    );
                    // The req_id column alone gives the ids, unless it is
                    // the damaged one.
                    let id = (!id_damaged.contains(row)).then_some(expected.req_id);
                    assert_eq!(*req_id, id, "{case}: row {row}");
                    bad.push(*row);
                }
            }
        }
        // One record per row (requests_in = served + errors), and the bad
        // ones exactly the damaged pages' rows.
        seen.sort_unstable();
        assert!(seen == (0..rows.len() as u64).collect::<Vec<_>>(), "{case}");
        bad.sort_unstable();
        assert!(
            bad == damaged,
            "{case}: bad rows {:?}..{:?} ({}), damaged {:?}..{:?} ({})",
            bad.first(),
            bad.last(),
            bad.len(),
            damaged.first(),
            damaged.last(),
            damaged.len()
        );
        assert!(!bad.is_empty() && bad.len() < ROW_GROUP, "{case}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

/// The damaged page's rows leave the event-time range to the rest of
/// their group (decoded past the damage).
#[test]
fn a_damaged_page_leaves_the_rest_of_its_group_in_the_event_time_range() {
    // Rows are in event-time order: the least stamp of a valid request is
    // in group 0, just after the damaged page.
    let rows = requests();
    let dir = tmp("range");
    let path = dir.join("requests.parquet");
    write(&path, &rows, true);
    // The whole first page of user_id: its rows are bad.
    damage_page(&path, &rows, 0, 2, 0);
    let info = ParquetRequestSource::inspect(&dir).unwrap();
    let valid = &rows[PAGE_ROWS..];
    let expected = (
        valid.iter().map(|r| r.ts_ms).min().unwrap(),
        valid.iter().map(|r| r.ts_ms).max().unwrap(),
    );
    assert_eq!((info.min_ts_ms, info.max_ts_ms), expected, "{info:?}");
    std::fs::remove_dir_all(&dir).unwrap();
}
