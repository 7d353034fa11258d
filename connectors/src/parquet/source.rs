//! The request source: a trace's requests.parquet, row groups sharded over
//! workers (row group g goes to worker g mod workers), in batches with a
//! watermark. No pacing and no timely types here: the pipeline does both.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, UInt64Array};
use arrow::datatypes::UInt64Type;
use grflow_traces::Request;
use grflow_traces::columnar::{REQUEST_COLUMNS, REQUESTS_FILE, RowError, decode_requests};
use parquet::arrow::arrow_reader::statistics::StatisticsConverter;

use super::files::{CheckedFile, open_checked};
use super::salvage::{Stretch, read_rows};
use crate::error::SourceError;
use crate::records::SourcePosition;
use crate::source::{Polled, RequestSource, SourceRecord, SourceState};

/// Records handed out per batch at most.
pub const DEFAULT_BATCH_ROWS: usize = 1024;

/// Summary of a requests.parquet from its footer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TraceInfo {
    pub rows: u64,
    pub row_groups: usize,
    /// Smallest and largest `ts_ms` of a valid request (bad rows left
    /// out); `max_ts_ms` is `u64::MAX` where a row group's range is
    /// unknown, both are 0 when there is no request.
    pub min_ts_ms: u64,
    pub max_ts_ms: u64,
}

/// Which of `passes` passes of [`ParquetRequestSource::duplicate_req_ids`]
/// checks `id`: a multiplicative hash, so that consecutive ids spread over
/// the passes.
fn id_pass(id: u64, passes: u64) -> u64 {
    (id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % passes
}

/// What [`ParquetRequestSource::duplicate_req_ids`] found.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DuplicateIds {
    /// Rows whose req_id an earlier row already carries.
    pub rows: u64,
    /// The smallest such id and the first two rows that carry it.
    pub example: Option<(u64, u64, u64)>,
    /// Row groups whose req_id column could not be read in full, so not
    /// wholly checked (the source reports those rows one by one).
    pub unreadable_groups: Vec<usize>,
}

/// Records of one row group being handed out in batches, with the suffix
/// minimum of event time for exact watermarks.
#[derive(Debug, Default)]
pub(crate) struct Staged {
    records: std::collections::VecDeque<SourceRecord>,
    /// `suffix_min[i]` = least ts_ms of the requests from the i-th record on.
    suffix_min: Vec<u64>,
    /// Records handed out so far.
    taken: usize,
    /// Runs of rows that could not be read, in row order, made one by one
    /// as they are handed out, after the group's records: a run's length
    /// comes from the footer and may be huge.
    missing: VecDeque<MissingRows>,
}

/// Rows `next..end` of a row group that could not be read, and why.
#[derive(Debug)]
pub(crate) struct MissingRows {
    pub file: String,
    pub row_group: u32,
    pub next: u64,
    pub end: u64,
    pub reason: String,
    /// Their req_ids, where the req_id column alone could be read.
    pub ids: ReqIds,
}

/// req_ids of some rows: runs of the req_id column, each with its first
/// row (in the file), ascending.
#[derive(Debug, Default)]
pub(crate) struct ReqIds(Vec<(u64, UInt64Array)>);

impl ReqIds {
    fn get(&self, row: u64) -> Option<u64> {
        let k = self.0.partition_point(|(first, _)| *first <= row);
        let (first, ids) = self.0.get(k.checked_sub(1)?)?;
        let i = usize::try_from(row - first).ok()?;
        (i < ids.len() && ids.is_valid(i)).then(|| ids.value(i))
    }
}

impl Staged {
    /// Sorts a row group's records by event time (bad records first, each
    /// kind in file order): the pipeline moves its time to the first
    /// pending record's, so a record behind it in the group would count as
    /// late and be served at a later time, in the wrong window.
    pub fn new(records: Vec<SourceRecord>) -> Self {
        Self::with_missing(records, Vec::new())
    }

    /// [`Self::new`], with `missing` rows handed out as bad records after
    /// the records.
    pub fn with_missing(mut records: Vec<SourceRecord>, missing: Vec<MissingRows>) -> Self {
        records.sort_by_key(|r| match r {
            SourceRecord::Bad { .. } => (0, 0),
            SourceRecord::Request { request, .. } => (1, request.ts_ms),
        });
        let mut suffix_min = vec![u64::MAX; records.len() + 1];
        for i in (0..records.len()).rev() {
            let ts = match &records[i] {
                SourceRecord::Request { request, .. } => request.ts_ms,
                SourceRecord::Bad { .. } => u64::MAX,
            };
            suffix_min[i] = suffix_min[i + 1].min(ts);
        }
        Self {
            records: records.into(),
            suffix_min,
            taken: 0,
            missing: missing.into_iter().filter(|m| m.next < m.end).collect(),
        }
    }

    pub fn is_done(&self) -> bool {
        self.records.is_empty() && self.missing.is_empty()
    }

    /// Up to `n` records and the least ts_ms of what stays staged.
    pub fn take(&mut self, n: usize) -> (Vec<SourceRecord>, u64) {
        let k = n.min(self.records.len());
        let mut out: Vec<SourceRecord> = self.records.drain(..k).collect();
        self.taken += k;
        while let Some(m) = self.missing.front_mut().filter(|_| out.len() < n) {
            let k = ((n - out.len()) as u64).min(m.end - m.next);
            out.extend((m.next..m.next + k).map(|row| SourceRecord::Bad {
                position: SourcePosition::Parquet {
                    file: m.file.clone(),
                    row_group: m.row_group,
                    row,
                },
                reason: m.reason.clone(),
                req_id: m.ids.get(row),
            }));
            m.next += k;
            if m.next == m.end {
                self.missing.pop_front();
            }
        }
        (out, self.suffix_min[self.taken])
    }
}

/// `later[k]` = least of `mins[k..]`, with `later[len] = u64::MAX`.
pub(crate) fn suffix_mins(mins: &[u64]) -> Vec<u64> {
    let mut later = vec![u64::MAX; mins.len() + 1];
    for k in (0..mins.len()).rev() {
        later[k] = later[k + 1].min(mins[k]);
    }
    later
}

/// A worker's share of a trace's requests.parquet.
#[derive(Debug)]
pub struct ParquetRequestSource {
    file: CheckedFile,
    /// Display name used in positions (the file's path).
    name: String,
    /// This worker's row groups, ascending.
    groups: Vec<usize>,
    /// First row (in the file) of every row group.
    group_start: Vec<u64>,
    /// `later_min[k]`: least ts_ms of groups[k..] by the statistics.
    later_min: Vec<u64>,
    next_group: usize,
    staged: Staged,
    batch_rows: usize,
    /// More candidates than this makes a row bad (`too_many_candidates`).
    max_candidates: usize,
}

impl ParquetRequestSource {
    /// Opens `dir/requests.parquet` for worker `worker` of `workers`.
    /// Checks the footer and the columns now, so a wrong file fails here.
    pub fn open(dir: &Path, worker: usize, workers: usize) -> Result<Self, SourceError> {
        assert!(
            workers > 0 && worker < workers,
            "worker {worker} of {workers}"
        );
        let file = open_checked(dir, REQUESTS_FILE, &REQUEST_COLUMNS)?;
        let rows = file.row_group_rows();
        let mut group_start = Vec::with_capacity(rows.len());
        let mut acc = 0;
        for r in &rows {
            group_start.push(acc);
            acc += r;
        }
        let (mins, _) = ts_stats(&file)?;
        let groups: Vec<usize> = (worker..rows.len()).step_by(workers).collect();
        let later_min = suffix_mins(&groups.iter().map(|&g| mins[g]).collect::<Vec<_>>());
        Ok(Self {
            name: file.path.display().to_string(),
            file,
            groups,
            group_start,
            later_min,
            next_group: 0,
            staged: Staged::default(),
            batch_rows: DEFAULT_BATCH_ROWS,
            max_candidates: usize::MAX,
        })
    }

    /// Rows with more than `n` candidates become bad records (default: no
    /// bound), checked as the row is decoded.
    pub fn with_max_candidates(mut self, n: usize) -> Self {
        self.max_candidates = n;
        self
    }

    /// Hands out at most `n` records per batch (default 1,024).
    pub fn with_batch_rows(mut self, n: usize) -> Self {
        self.batch_rows = n.max(1);
        self
    }

    /// Row count, row groups and event-time range of `dir/requests.parquet`,
    /// from its footer (checks the columns too).
    pub fn inspect(dir: &Path) -> Result<TraceInfo, SourceError> {
        let file = open_checked(dir, REQUESTS_FILE, &REQUEST_COLUMNS)?;
        let rows = file.row_group_rows();
        let (mins, maxes) = ts_stats(&file)?;
        let (min_ts_ms, max_ts_ms) = request_ts_range(&file, &mins, &maxes);
        Ok(TraceInfo {
            rows: rows.iter().sum(),
            row_groups: rows.len(),
            min_ts_ms,
            max_ts_ms,
        })
    }

    /// `req_id`s that more than one row of the trace in `dir` carries:
    /// each such row is served, and its answer shares the id with
    /// another's. Exact for any length: the ids are split by hash into
    /// passes of about `ids_per_pass` distinct ids each (one read of the
    /// req_id column per pass, ~20 bytes per id held), so memory stays
    /// bounded however long the trace is. None when the req_id column
    /// cannot be read (the source reports those rows one by one).
    pub fn duplicate_req_ids(
        dir: &Path,
        ids_per_pass: u64,
    ) -> Result<Option<DuplicateIds>, SourceError> {
        let file = open_checked(dir, REQUESTS_FILE, &REQUEST_COLUMNS)?;
        let rows = file.row_group_rows().iter().sum::<u64>();
        let passes = rows.div_ceil(ids_per_pass.max(1)).max(1);
        let mut found = DuplicateIds::default();
        for pass in 0..passes {
            // id -> first row; repeats are counted, never stored.
            // rows / passes <= ids_per_pass, by the choice of `passes`.
            let mut first_rows: HashMap<u64, u64> =
                HashMap::with_capacity(rows.div_ceil(passes) as usize);
            let read = file.each_u64(None, "req_id", |id, row| {
                if id_pass(id, passes) != pass {
                    return;
                }
                match first_rows.entry(id) {
                    Entry::Vacant(v) => {
                        v.insert(row);
                    }
                    Entry::Occupied(o) => {
                        found.rows += 1;
                        let first = *o.get();
                        // Rows come in order, so this is the id's second
                        // row; keep the smallest id's.
                        if found.example.is_none_or(|(e, _, _)| id < e) {
                            found.example = Some((id, first, row));
                        }
                    }
                }
            });
            let Some(unreadable) = read else {
                return Ok(None);
            };
            found.unreadable_groups = unreadable;
        }
        Ok(Some(found))
    }

    /// The row groups this worker reads.
    pub fn row_groups(&self) -> &[usize] {
        &self.groups
    }

    /// The trace file being read.
    pub fn path(&self) -> &PathBuf {
        &self.file.path
    }

    /// Decodes row group `g` into records: one per row, always. Rows that
    /// cannot be read (a damaged page, rows the footer counts but the data
    /// lacks) become bad records, with their req_id where that column
    /// alone can be read; the rest of the group is served.
    fn stage(&mut self, g: usize) {
        let first = self.group_start[g];
        let rows = self.file.row_group_rows()[g];
        // Capped: the count comes from the footer (a huge one aborted here).
        let mut records = Vec::with_capacity(rows.min(8192) as usize);
        let mut missing = Vec::new();
        decode_group(&self.file, g, |part| match part {
            Part::Decoded { start, rows } => {
                for (i, r) in rows.into_iter().enumerate() {
                    let position = SourcePosition::Parquet {
                        file: self.name.clone(),
                        row_group: g as u32,
                        row: first + start + i as u64,
                    };
                    records.push(match r {
                        Ok(request) if request.candidates.len() > self.max_candidates => {
                            SourceRecord::Bad {
                                position,
                                reason: too_many_candidates(
                                    request.candidates.len(),
                                    self.max_candidates,
                                ),
                                req_id: Some(request.req_id),
                            }
                        }
                        Ok(request) => SourceRecord::request(request, position),
                        Err(e) => SourceRecord::Bad {
                            position,
                            reason: e.to_string(),
                            req_id: e.req_id,
                        },
                    });
                }
            }
            Part::Unreadable { start, end, reason } => missing.push(MissingRows {
                file: self.name.clone(),
                row_group: g as u32,
                next: first + start,
                end: first.saturating_add(end),
                reason: format!("row group {g} unreadable: {reason}"),
                ids: req_ids(&self.file, g, first, start, end),
            }),
        });
        self.staged = Staged::with_missing(records, missing);
    }
}

/// What [`decode_group`] hands out, in row order; rows counted from the
/// group's first.
enum Part {
    /// Rows `start..start + rows.len()`, each a request or a row error.
    Decoded {
        start: u64,
        rows: Vec<Result<Request, RowError>>,
    },
    /// Rows `start..end`, which could not be read.
    Unreadable {
        start: u64,
        end: u64,
        reason: String,
    },
}

/// Reads and decodes every row of row group `g`, what can be read of a
/// damaged one included (see [`read_rows`]).
fn decode_group(file: &CheckedFile, g: usize, mut each: impl FnMut(Part)) {
    let names: Vec<&str> = REQUEST_COLUMNS.iter().map(|c| c.name).collect();
    let roots = file.roots(&names);
    let rows = file.row_group_rows()[g];
    read_rows(file, g, &roots, 0, rows, |stretch| {
        each(match stretch {
            Stretch::Read { start, batch } => match decode_requests(&batch) {
                Ok(rows) => Part::Decoded { start, rows },
                Err(e) => Part::Unreadable {
                    start,
                    end: start + batch.num_rows() as u64,
                    reason: format!("column `{}`: {e}", e.column()),
                },
            },
            Stretch::Unreadable { start, end, reason } => Part::Unreadable { start, end, reason },
        })
    });
}

/// The req_ids of rows `start..end` of row group `g` (whose first row in
/// the file is `first`), from the req_id column read alone: what it gives.
fn req_ids(file: &CheckedFile, g: usize, first: u64, start: u64, end: u64) -> ReqIds {
    let mut ids = Vec::new();
    read_rows(file, g, &file.roots(&["req_id"]), start, end, |stretch| {
        if let Stretch::Read { start, batch } = stretch
            && let Some(column) = batch.column(0).as_primitive_opt::<UInt64Type>()
        {
            ids.push((first + start, column.clone()));
        }
    });
    ReqIds(ids)
}

/// The reason of a row with too many candidates; names the kind, the
/// column and the limit.
fn too_many_candidates(count: usize, limit: usize) -> String {
    format!(
        "too_many_candidates: column `candidates`: {count} candidates, more than the limit of {limit} (model.max_candidates)"
    )
}

impl RequestSource for ParquetRequestSource {
    fn poll(&mut self, max: usize, _floor_ms: u64) -> Result<Polled, SourceError> {
        while self.staged.is_done() {
            let Some(&g) = self.groups.get(self.next_group) else {
                return Ok(Polled::exhausted());
            };
            self.next_group += 1;
            self.stage(g);
        }
        let (records, staged_min) = self.staged.take(self.batch_rows.min(max.max(1)));
        Ok(Polled {
            records,
            watermark_ms: staged_min.min(self.later_min[self.next_group]),
            state: SourceState::Ready,
        })
    }
}

/// Least and greatest ts_ms of a valid request. Statistics count bad rows
/// too (one row with ts_ms 0 and an unknown mode in each of a few row
/// groups started a paced replay of epoch stamps decades early), so groups
/// are decoded, the most extreme statistics first, while the next one's
/// could still beat what was found: at worst every group once (one pass,
/// as the req_id check makes), each decoded group kept for both ends. A
/// group of unknown range (0, u64::MAX) says nothing of the minimum and
/// makes the maximum unknown (u64::MAX).
fn request_ts_range(file: &CheckedFile, mins: &[u64], maxes: &[u64]) -> (u64, u64) {
    let n = mins.len();
    let unknown = |g: usize| (mins[g], maxes[g]) == (0, u64::MAX);
    let mut decoded = HashMap::new();
    let mut range = |g: usize| *decoded.entry(g).or_insert_with(|| valid_ts_range(file, g));
    // Known groups with some ts_ms ((u64::MAX, 0): none).
    let mut order: Vec<usize> = (0..n)
        .filter(|&g| !unknown(g) && mins[g] <= maxes[g])
        .collect();

    order.sort_by_key(|&g| mins[g]);
    let mut lo = u64::MAX;
    for &g in &order {
        if mins[g] >= lo {
            break;
        }
        if let Some((a, _)) = range(g) {
            lo = lo.min(a);
        }
    }

    let hi = if (0..n).any(unknown) {
        u64::MAX
    } else {
        order.sort_by_key(|&g| std::cmp::Reverse(maxes[g]));
        let mut hi = None;
        for &g in &order {
            if hi.is_some_and(|h| maxes[g] <= h) {
                break;
            }
            if let Some((_, b)) = range(g) {
                hi = Some(hi.map_or(b, |h: u64| h.max(b)));
            }
        }
        hi.unwrap_or(0)
    };
    (if lo == u64::MAX { 0 } else { lo }, hi)
}

/// Least and greatest ts_ms of the valid requests of row group `g`, decoded
/// as the source does (what can be read of a damaged group); None when it
/// holds none.
fn valid_ts_range(file: &CheckedFile, g: usize) -> Option<(u64, u64)> {
    let mut range: Option<(u64, u64)> = None;
    decode_group(file, g, |part| {
        if let Part::Decoded { rows, .. } = part {
            for ts in rows.into_iter().filter_map(|r| r.ok().map(|r| r.ts_ms)) {
                range = Some(range.map_or((ts, ts), |(a, b)| (a.min(ts), b.max(ts))));
            }
        }
    });
    range
}

/// Per-row-group (min, max) of ts_ms from the statistics, or read from the
/// column where a group has none (a trace written without statistics
/// would otherwise start its paced replay at event time 0, decades before
/// its first request). A group that cannot be read either gets (0,
/// u64::MAX), which keeps watermarks correct. A group with no rows, or no
/// valid ts_ms (each such row is a bad row, not a request), gets
/// (u64::MAX, 0): it holds no event time back (its (0, u64::MAX) started
/// an epoch-stamped trace's paced replay at 0, decades before its first
/// request).
fn ts_stats(file: &CheckedFile) -> Result<(Vec<u64>, Vec<u64>), SourceError> {
    let (mut mins, mut maxes) = ts_statistics(file)?;
    let rows = file.row_group_rows();
    for g in 0..mins.len() {
        if rows[g] == 0 {
            (mins[g], maxes[g]) = (u64::MAX, 0);
        } else if mins[g] == 0 && maxes[g] == u64::MAX {
            match file.u64_range(g, "ts_ms") {
                Some(Some((lo, hi))) => (mins[g], maxes[g]) = (lo, hi),
                Some(None) => (mins[g], maxes[g]) = (u64::MAX, 0),
                None => {}
            }
        }
    }
    Ok((mins, maxes))
}

/// Per-row-group (min, max) of ts_ms from the statistics; (0, u64::MAX)
/// where a group has none.
fn ts_statistics(file: &CheckedFile) -> Result<(Vec<u64>, Vec<u64>), SourceError> {
    let meta = file.metadata.metadata();
    let n = meta.num_row_groups();
    let fallback = || (vec![0; n], vec![u64::MAX; n]);
    let Ok(conv) = StatisticsConverter::try_new(
        "ts_ms",
        file.metadata.schema(),
        meta.file_metadata().schema_descr(),
    ) else {
        return Ok(fallback());
    };
    let (Ok(mins), Ok(maxes)) = (
        conv.row_group_mins(meta.row_groups()),
        conv.row_group_maxes(meta.row_groups()),
    ) else {
        return Ok(fallback());
    };
    let (mins, maxes) = (
        mins.as_primitive::<UInt64Type>(),
        maxes.as_primitive::<UInt64Type>(),
    );
    Ok((
        (0..n)
            .map(|g| if mins.is_null(g) { 0 } else { mins.value(g) })
            .collect(),
        (0..n)
            .map(|g| {
                if maxes.is_null(g) {
                    u64::MAX
                } else {
                    maxes.value(g)
                }
            })
            .collect(),
    ))
}
