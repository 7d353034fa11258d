//! errors.parquet, in position order and in bounded memory. Error rows
//! arrive in no useful order (every worker's, as produced); the sink holds
//! at most `run_rows` of them, sorts each full buffer and spills it as a run
//! into a folder beside the file, and `finish` merges the runs (at most
//! `FAN_IN` at a time, in as few passes as that allows) into the file. A
//! job with fewer error rows than one buffer never touches the disk but
//! for the file itself.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::fs::File;
use std::path::{Path, PathBuf};

use arrow::array::{Array, AsArray, RecordBatch};
use arrow::datatypes::UInt64Type;
use parquet::arrow::ProjectionMask;
use parquet::arrow::arrow_reader::{ParquetRecordBatchReader, ParquetRecordBatchReaderBuilder};
use parquet::basic::{Compression, ZstdLevel};
use parquet::errors::ParquetError;
use parquet::file::properties::WriterProperties;

use super::{ParquetSink, output_properties};
use crate::records::ErrorRow;
use crate::sink::SinkError;

/// Rows held before a sorted run is spilled (~340 bytes each: ~5.5 MB).
const RUN_ROWS: usize = 16 * 1024;
/// Runs merged at once (each holds a batch and a page per column);
/// more are merged in passes first: 512 Ki rows in one pass, 16 Mi in two.
const FAN_IN: usize = 32;
/// Rows each run being merged holds decoded.
const MERGE_BATCH: usize = 256;
/// Rows handed to the writer at a time.
const OUT_BATCH: usize = 4 * 1024;

/// errors.parquet: rows in position order (see [`ErrorSink::sort`]),
/// whatever order they were written in.
pub struct ErrorSink {
    path: PathBuf,
    /// Rows not yet in a run: fewer than `run_rows` between calls.
    buffer: Vec<ErrorRow>,
    run_rows: usize,
    /// Sorted runs on disk, oldest first.
    runs: Vec<Spilled>,
    next_run: usize,
    rows: u64,
    held_peak: usize,
}

impl std::fmt::Debug for ErrorSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ErrorSink")
            .field("path", &self.path)
            .field("rows", &self.rows)
            .field("buffered", &self.buffer.len())
            .field("runs", &self.runs.len())
            .finish()
    }
}

impl ErrorSink {
    /// A sink whose file is written at `path` by `finish`: a job that
    /// fails before then leaves no errors.parquet. Its folder must exist.
    pub fn create(path: &Path) -> Result<Self, SinkError> {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        std::fs::metadata(dir)
            .and_then(|m| {
                m.is_dir()
                    .then_some(())
                    .ok_or_else(|| std::io::Error::other("not a directory"))
            })
            .map_err(|source| SinkError::Io {
                file: dir.to_path_buf(),
                source,
            })?;
        Ok(Self {
            path: path.to_path_buf(),
            buffer: Vec::new(),
            run_rows: RUN_ROWS,
            runs: Vec::new(),
            next_run: 0,
            rows: 0,
            held_peak: 0,
        })
    }

    /// Spills a sorted run every `rows` rows (at least 1) instead of
    /// every 16 Ki: the rows held in memory at once.
    pub fn with_run_rows(mut self, rows: usize) -> Self {
        self.run_rows = rows.max(1);
        self
    }

    /// Takes copies of `rows`.
    pub fn write(&mut self, rows: &[ErrorRow]) -> Result<(), SinkError> {
        for chunk in rows.chunks(self.run_rows) {
            self.append(&mut chunk.to_vec())?;
        }
        Ok(())
    }

    /// Takes `rows`, leaving the vector empty.
    pub fn append(&mut self, rows: &mut Vec<ErrorRow>) -> Result<(), SinkError> {
        self.rows += rows.len() as u64;
        let mut rows = rows.drain(..);
        loop {
            let room = self.run_rows - self.buffer.len();
            self.buffer.extend(rows.by_ref().take(room));
            self.held_peak = self.held_peak.max(self.buffer.len());
            if self.buffer.len() < self.run_rows {
                return Ok(());
            }
            self.spill()?;
        }
    }

    /// Rows written so far.
    pub fn rows(&self) -> u64 {
        self.rows
    }

    /// The most rows this sink held in memory at once so far; what the
    /// merge holds is known once finished (`finish_with_peak`).
    pub fn held_peak(&self) -> usize {
        self.held_peak
    }

    /// Sorted runs spilled so far.
    pub fn runs(&self) -> usize {
        self.runs.len()
    }

    /// Puts rows in errors.parquet's order: by position, with its numbers
    /// compared as numbers (row 3 before row 17, row group 2 before row
    /// group 10: a Parquet trace's order), then by reason and req_id, so
    /// that rows at one position come in the same order every run.
    pub fn sort(rows: &mut [ErrorRow]) {
        // Stable sort finds the sorted stretches a buffer is made of (each
        // worker's rows come in trace order) and merges them.
        rows.sort_by(order);
    }

    /// Writes the file, every row in order, and removes the runs; returns
    /// the rows written.
    pub fn finish(self) -> Result<u64, SinkError> {
        self.finish_with_peak().map(|(rows, _)| rows)
    }

    /// As `finish`, and returns the most rows held in memory at once as
    /// well, sorting or merging.
    pub fn finish_with_peak(mut self) -> Result<(u64, usize), SinkError> {
        if !self.runs.is_empty() && !self.buffer.is_empty() {
            self.spill()?;
        }
        // Until one merge can take every run, merge the smallest ones, the
        // first time just enough of them that each later merge takes
        // FAN_IN and the last takes FAN_IN too: no row is merged more
        // often than it must be.
        let mut take = first_merge(self.runs.len());
        while self.runs.len() > FAN_IN {
            // Stable: the oldest first among runs of one size.
            self.runs.sort_by_key(|r| r.rows);
            let path = self.run_path()?;
            let rows = self.runs[..take].iter().map(|r| r.rows).sum();
            let mut run = ParquetSink::<ErrorRow>::create_with(&path, run_properties())?;
            // Tracked before it is whole, so that a failure removes it too.
            self.runs.push(Spilled { path, rows });
            merge(&self.runs[..take], &mut run, &mut self.held_peak)?;
            run.finish()?;
            for merged in self.runs.drain(..take) {
                discard(&merged.path);
            }
            take = FAN_IN;
        }
        let mut out = ParquetSink::<ErrorRow>::create(&self.path)?;
        if self.runs.is_empty() {
            Self::sort(&mut self.buffer);
            for chunk in self.buffer.chunks(OUT_BATCH) {
                out.write(chunk)?;
            }
        } else {
            merge(&self.runs, &mut out, &mut self.held_peak)?;
        }
        let written = out.finish()?;
        debug_assert_eq!(written, self.rows, "every row written once");
        self.remove_runs();
        Ok((written, self.held_peak))
    }

    /// Sorts the buffer and writes it as a run.
    fn spill(&mut self) -> Result<(), SinkError> {
        Self::sort(&mut self.buffer);
        let path = self.run_path()?;
        let mut run = ParquetSink::<ErrorRow>::create_with(&path, run_properties())?;
        self.runs.push(Spilled {
            path,
            rows: self.buffer.len() as u64,
        });
        for chunk in self.buffer.chunks(OUT_BATCH) {
            run.write(chunk)?;
        }
        run.finish()?;
        self.buffer.clear();
        Ok(())
    }

    /// The folder of the runs: `errors.parquet.runs` beside the file, on
    /// its disk and not in a temp folder that may be memory.
    fn runs_dir(&self) -> PathBuf {
        let mut name = self.path.file_name().unwrap_or_default().to_os_string();
        name.push(".runs");
        self.path.with_file_name(name)
    }

    /// A new run's path, making the folder for the first one (and removing
    /// the runs a killed run left there).
    fn run_path(&mut self) -> Result<PathBuf, SinkError> {
        let dir = self.runs_dir();
        let io = |source| SinkError::Io {
            file: dir.clone(),
            source,
        };
        if self.next_run == 0 {
            if dir.is_dir() {
                for entry in std::fs::read_dir(&dir).map_err(io)? {
                    let entry = entry.map_err(io)?.path();
                    if is_run(&entry) {
                        std::fs::remove_file(&entry).map_err(|source| SinkError::Io {
                            file: entry.clone(),
                            source,
                        })?;
                    }
                }
            } else {
                std::fs::create_dir(&dir).map_err(io)?;
            }
        }
        let path = dir.join(format!("run-{}.parquet", self.next_run));
        self.next_run += 1;
        Ok(path)
    }

    /// Removes the runs and their folder; what cannot go is said, since
    /// the file itself is whole.
    fn remove_runs(&mut self) {
        for run in std::mem::take(&mut self.runs) {
            discard(&run.path);
        }
        if self.next_run > 0 {
            let dir = self.runs_dir();
            if let Err(e) = std::fs::remove_dir(&dir) {
                tracing::warn!("{}: could not remove: {e}", dir.display());
            }
            self.next_run = 0;
        }
    }
}

impl Drop for ErrorSink {
    /// A sink dropped unfinished (the run failed) leaves no runs behind.
    fn drop(&mut self) {
        self.remove_runs();
    }
}

/// How many of `runs` runs the first merge pass takes so that every
/// later pass takes `FAN_IN` and the last merge has `FAN_IN` inputs.
fn first_merge(runs: usize) -> usize {
    if runs <= FAN_IN {
        return 0;
    }
    (runs - 2) % (FAN_IN - 1) + 2
}

/// A sorted run on disk.
struct Spilled {
    path: PathBuf,
    rows: u64,
}

fn discard(run: &Path) {
    if let Err(e) = std::fs::remove_file(run) {
        tracing::warn!("{}: could not remove: {e}", run.display());
    }
}

fn is_run(path: &Path) -> bool {
    path.file_name()
        .and_then(|n| n.to_str())
        .is_some_and(|n| n.starts_with("run-") && n.ends_with(".parquet"))
}

/// Runs are read back by pages, a few of each at a time: small pages and
/// dictionaries keep what each open run holds small.
fn run_properties() -> WriterProperties {
    output_properties::<ErrorRow>()
        .set_compression(Compression::ZSTD(
            ZstdLevel::try_new(1).expect("valid level"),
        ))
        .set_data_page_size_limit(64 * 1024)
        .set_dictionary_page_size_limit(64 * 1024)
        .build()
}

fn order(a: &ErrorRow, b: &ErrorRow) -> Ordering {
    natural_cmp(&a.position, &b.position)
        .then_with(|| a.reason.cmp(&b.reason))
        .then_with(|| a.req_id.cmp(&b.req_id))
}

/// Compares positions such as "t/requests.parquet: row group 2, row 17"
/// with their numbers as numbers, so that row 3 comes before row 17 and
/// row group 2 before row group 10: as strings cut into chunks (runs of
/// ASCII digits, runs of anything else) compared chunk by chunk, digits
/// by value and the rest as text. One pass over the bytes, since it
/// orders every error row (several times each in a long run).
fn natural_cmp(a: &str, b: &str) -> Ordering {
    let (x, y) = (a.as_bytes(), b.as_bytes());
    // Rows of one trace share a long prefix: start past it, or at the
    // start of the number it ends in.
    let mut i = common_prefix(x, y);
    while i > 0 && x[i - 1].is_ascii_digit() {
        i -= 1;
    }
    let mut j = i;
    // Inside a text chunk both sides still share (its start is behind).
    let mut in_text = i > 0;
    loop {
        let (p, q) = match (x.get(i), y.get(j)) {
            (None, None) => return Ordering::Equal,
            // A string, or a chunk, that ends first is the smaller.
            (None, Some(_)) => return Ordering::Less,
            (Some(_), None) => return Ordering::Greater,
            (Some(&p), Some(&q)) => (p, q),
        };
        match (p.is_ascii_digit(), q.is_ascii_digit()) {
            (true, true) => {
                let (end_i, end_j) = (digits_end(x, i), digits_end(y, j));
                let (m, n) = (trim_zeros(&x[i..end_i]), trim_zeros(&y[j..end_j]));
                // Leading zeros aside, the longer run is the larger number.
                let order = m.len().cmp(&n.len()).then_with(|| m.cmp(n));
                if order != Ordering::Equal {
                    return order;
                }
                (i, j, in_text) = (end_i, end_j, false);
            }
            (false, false) => {
                if p != q {
                    return p.cmp(&q);
                }
                (i, j, in_text) = (i + 1, j + 1, true);
            }
            // One text chunk ends where the other goes on: the shorter is
            // the smaller. At the start of chunks, they differ here.
            (true, false) if in_text => return Ordering::Less,
            (false, true) if in_text => return Ordering::Greater,
            _ => return p.cmp(&q),
        }
    }
}

/// How many bytes `x` and `y` start with in common, eight at a time.
fn common_prefix(x: &[u8], y: &[u8]) -> usize {
    let words = x.chunks_exact(8).zip(y.chunks_exact(8));
    let mut i = 0;
    for (p, q) in words {
        let (p, q) = (
            u64::from_le_bytes(p.try_into().expect("8 bytes")),
            u64::from_le_bytes(q.try_into().expect("8 bytes")),
        );
        if p != q {
            // Little-endian: the first byte that differs is the lowest.
            return i + ((p ^ q).trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    i + x[i..]
        .iter()
        .zip(&y[i..])
        .take_while(|(p, q)| p == q)
        .count()
}

/// Where the run of digits starting at `from` ends.
fn digits_end(s: &[u8], from: usize) -> usize {
    from + s[from..].iter().take_while(|b| b.is_ascii_digit()).count()
}

fn trim_zeros(digits: &[u8]) -> &[u8] {
    let zeros = digits.iter().take_while(|&&b| b == b'0').count();
    &digits[zeros..]
}

/// One run being merged: its reader and the rows of its current batch.
struct Run<'a> {
    path: &'a Path,
    reader: ParquetRecordBatchReader,
    rows: std::vec::IntoIter<ErrorRow>,
}

impl<'a> Run<'a> {
    fn open(path: &'a Path) -> Result<Self, SinkError> {
        let parquet = |source| SinkError::Parquet {
            file: path.to_path_buf(),
            source,
        };
        let file = File::open(path).map_err(|source| SinkError::Io {
            file: path.to_path_buf(),
            source,
        })?;
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).map_err(parquet)?;
        // position, reason, req_id: the rest is made again from position.
        let mask = ProjectionMask::roots(builder.parquet_schema(), [0, 1, 2]);
        let reader = builder
            .with_projection(mask)
            .with_batch_size(MERGE_BATCH)
            .build()
            .map_err(parquet)?;
        Ok(Self {
            path,
            reader,
            rows: Vec::new().into_iter(),
        })
    }

    /// The run's next row, reading its next batch when one is used up.
    fn next(&mut self) -> Result<Option<ErrorRow>, SinkError> {
        loop {
            if let Some(row) = self.rows.next() {
                return Ok(Some(row));
            }
            match self.reader.next() {
                None => return Ok(None),
                Some(batch) => {
                    let batch = batch.map_err(|e| SinkError::Parquet {
                        file: self.path.to_path_buf(),
                        source: e.into(),
                    })?;
                    self.rows = rows_of(&batch).map_err(|source| SinkError::Parquet {
                        file: self.path.to_path_buf(),
                        source,
                    })?;
                }
            }
        }
    }
}

/// Error rows back from a run's (position, reason, req_id) batch.
fn rows_of(batch: &RecordBatch) -> Result<std::vec::IntoIter<ErrorRow>, ParquetError> {
    let wrong = |name| ParquetError::General(format!("column `{name}` has another type"));
    let position = batch
        .column(0)
        .as_string_opt::<i32>()
        .ok_or_else(|| wrong("position"))?;
    let reason = batch
        .column(1)
        .as_string_opt::<i32>()
        .ok_or_else(|| wrong("reason"))?;
    let req_id = batch
        .column(2)
        .as_primitive_opt::<UInt64Type>()
        .ok_or_else(|| wrong("req_id"))?;
    Ok((0..batch.num_rows())
        .map(|i| ErrorRow {
            position: position.value(i).to_string(),
            reason: reason.value(i).to_string(),
            req_id: req_id.is_valid(i).then(|| req_id.value(i)),
        })
        .collect::<Vec<_>>()
        .into_iter())
}

/// A run's smallest row not yet merged; the heap's greatest is the
/// smallest row (`BinaryHeap` pops its greatest).
struct Head {
    row: ErrorRow,
    run: usize,
}

impl Ord for Head {
    fn cmp(&self, other: &Self) -> Ordering {
        order(&other.row, &self.row).then_with(|| other.run.cmp(&self.run))
    }
}

impl PartialOrd for Head {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl PartialEq for Head {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}

impl Eq for Head {}

/// Merges sorted runs into `out`, recording in `held_peak` the rows held.
fn merge(
    spilled: &[Spilled],
    out: &mut ParquetSink<ErrorRow>,
    held_peak: &mut usize,
) -> Result<(), SinkError> {
    let mut runs = spilled
        .iter()
        .map(|s| Run::open(&s.path))
        .collect::<Result<Vec<_>, _>>()?;
    let mut heap = BinaryHeap::with_capacity(runs.len());
    for (run, r) in runs.iter_mut().enumerate() {
        if let Some(row) = r.next()? {
            heap.push(Head { row, run });
        }
    }
    let mut batch = Vec::with_capacity(OUT_BATCH);
    while let Some(Head { row, run }) = heap.pop() {
        batch.push(row);
        if let Some(next) = runs[run].next()? {
            heap.push(Head { row: next, run });
        }
        if batch.len() == OUT_BATCH || heap.is_empty() {
            let held = batch.len() + heap.len() + runs.iter().map(|r| r.rows.len()).sum::<usize>();
            *held_peak = (*held_peak).max(held);
            out.write(&batch)?;
            batch.clear();
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::natural_cmp;
    use std::cmp::Ordering;

    #[test]
    fn after_the_first_merge_every_merge_takes_fan_in_runs() {
        use super::{FAN_IN, first_merge};
        for runs in 0..=FAN_IN {
            assert_eq!(first_merge(runs), 0, "one merge takes {runs}");
        }
        for runs in FAN_IN + 1..5_000 {
            let take = first_merge(runs);
            assert!((2..=FAN_IN).contains(&take), "{runs}: {take}");
            let mut left = runs - take + 1;
            while left > FAN_IN {
                left -= FAN_IN - 1;
            }
            assert_eq!(left, FAN_IN, "{runs} runs: the last merge is full");
        }
    }

    #[test]
    fn error_positions_sort_by_their_numbers() {
        let mut positions = vec![
            "t/requests.parquet: row group 10, row 2600",
            "t/requests.parquet: row group 0, row 17",
            "t/requests.parquet: row group 2, row 600",
            "t/requests.parquet: row group 0, row 3",
            "t/requests.parquet: row group 0, row 15",
        ];
        positions.sort_by(|a, b| natural_cmp(a, b));
        assert_eq!(
            positions,
            [
                "t/requests.parquet: row group 0, row 3",
                "t/requests.parquet: row group 0, row 15",
                "t/requests.parquet: row group 0, row 17",
                "t/requests.parquet: row group 2, row 600",
                "t/requests.parquet: row group 10, row 2600",
            ]
        );
        assert_eq!(natural_cmp("a007", "a7"), Ordering::Equal);
        assert_eq!(natural_cmp("topic[1]@9", "topic[1]@10"), Ordering::Less);
    }

    /// The order by its definition: chunk by chunk from the start.
    fn whole(a: &str, b: &str) -> Ordering {
        let (mut x, mut y) = (chunks(a), chunks(b));
        loop {
            let order = match (x.next(), y.next()) {
                (None, None) => return Ordering::Equal,
                (None, Some(_)) => return Ordering::Less,
                (Some(_), None) => return Ordering::Greater,
                (Some((true, p)), Some((true, q))) => {
                    let (p, q) = (p.trim_start_matches('0'), q.trim_start_matches('0'));
                    p.len().cmp(&q.len()).then_with(|| p.cmp(q))
                }
                (Some((_, p)), Some((_, q))) => p.cmp(q),
            };
            if order != Ordering::Equal {
                return order;
            }
        }
    }

    /// `s` as runs of ASCII digits and runs of anything else, each
    /// flagged with whether it is digits.
    fn chunks(s: &str) -> impl Iterator<Item = (bool, &str)> {
        let mut rest = s;
        std::iter::from_fn(move || {
            let first = rest.chars().next()?;
            let digit = first.is_ascii_digit();
            let end = rest
                .find(|c: char| c.is_ascii_digit() != digit)
                .unwrap_or(rest.len());
            let (chunk, tail) = rest.split_at(end);
            rest = tail;
            Some((digit, chunk))
        })
    }

    /// The one-pass comparison orders as cutting both strings into chunks
    /// and comparing them one by one does.
    #[test]
    fn the_one_pass_comparison_is_the_chunk_by_chunk_one() {
        let words = [
            "",
            "a",
            "ab",
            "ab5",
            "ab ",
            "abc",
            "ab12",
            "ab012",
            "ab9x",
            "ab10",
            "ab10x",
            "ab010",
            "ab1",
            "ab1 ",
            "ab1~",
            "r 7",
            "r 70",
            "r 07",
            "r 7 ",
            "é1",
            "é10",
            "é",
            "éa",
            "e1",
            "1",
            "10",
            "01a",
            "0",
            "00",
            "9",
            "x:1",
            "x:10 ",
            "x:1:2",
            "x:01:2",
            "x:1:10",
            "t/a.parquet: row group 2, row 17",
            "t/a.parquet: row group 10, row 3",
            "t/a.parquet: row group 2, row 170",
            "t/a.parquet: row group 2",
            "t/a.parquet",
            "t/b.parquet: row group 2, row 17",
            "t/a2.parquet: row 1",
            "t/a10.parquet: row 1",
        ];
        for a in words {
            for b in words {
                assert_eq!(natural_cmp(a, b), whole(a, b), "{a:?} vs {b:?}");
            }
        }
    }

    proptest::proptest! {
        #[test]
        fn the_one_pass_comparison_orders_any_strings_as_defined(
            a in "[0-9a :é~/]{0,10}",
            b in "[0-9a :é~/]{0,10}",
            tail in "[0-9a ~]{0,4}",
        ) {
            proptest::prop_assert_eq!(natural_cmp(&a, &b), whole(&a, &b));
            // Strings that share a prefix, as the positions of one trace do.
            for (x, y) in [(format!("{a}{b}"), a.clone()), (format!("{a}{b}"), format!("{a}{tail}"))] {
                proptest::prop_assert_eq!(natural_cmp(&x, &y), whole(&x, &y), "{:?} vs {:?}", x, y);
            }
        }
    }
}
