//! Reading what can be read of a row group: a page that cannot be decoded
//! costs the rows it holds, not the rest of its group.

use arrow::array::RecordBatch;

use super::files::CheckedFile;

/// Rows per batch while reads succeed.
const BATCH_ROWS: usize = 8192;

/// Each narrowing after a failed batch divides the batch by this.
const NARROWING: usize = 8;

/// A stretch of a row group, rows counted from the group's first.
#[derive(Debug)]
pub(crate) enum Stretch {
    /// Rows `start..start + batch.num_rows()`.
    Read { start: u64, batch: RecordBatch },
    /// Rows `start..end`, which could not be read, and why.
    Unreadable {
        start: u64,
        end: u64,
        reason: String,
    },
}

/// Reads rows `from..to` of row group `g` (top-level columns `roots`),
/// handing `each` stretches in row order that cover every row once.
///
/// A failed batch is read again in smaller ones, down to a single row. A
/// row that cannot be read alone starts an unreadable stretch, which ends
/// at the next row that can be: found by probes at doubling distances, then
/// bisection, so a long run costs O(log n) reads, not one per row (a run is
/// taken to be contiguous, as the rows of a damaged page are). Data that
/// ends before `to` (a footer counting more rows than the group holds) is
/// one unreadable stretch to `to`.
pub(crate) fn read_rows(
    file: &CheckedFile,
    g: usize,
    roots: &[usize],
    from: u64,
    to: u64,
    mut each: impl FnMut(Stretch),
) {
    let mut pos = from;
    let mut batch_rows = BATCH_ROWS;
    while pos < to {
        let failure = match file.read_rows(g, roots, pos, to - pos, batch_rows) {
            Err(message) => message,
            Ok(batches) => {
                let mut failure = None;
                for batch in batches {
                    match batch {
                        Ok(batch) => {
                            let n = batch.num_rows() as u64;
                            each(Stretch::Read { start: pos, batch });
                            pos += n;
                        }
                        Err(message) => {
                            failure = Some(message);
                            break;
                        }
                    }
                }
                match failure {
                    Some(message) => message,
                    None if pos < to => {
                        each(Stretch::Unreadable {
                            start: pos,
                            end: to,
                            reason: format!(
                                "the footer says {} rows, the data holds {pos}",
                                file.row_group_rows()[g]
                            ),
                        });
                        return;
                    }
                    None => return,
                }
            }
        };
        if batch_rows > 1 {
            batch_rows = (batch_rows / NARROWING).max(1);
            continue;
        }
        let end = next_readable(file, g, roots, pos, to);
        each(Stretch::Unreadable {
            start: pos,
            end,
            reason: failure,
        });
        pos = end;
        batch_rows = BATCH_ROWS;
    }
}

/// The first row after `bad` (which cannot be read) that can be read
/// alone, or `to`.
fn next_readable(file: &CheckedFile, g: usize, roots: &[usize], bad: u64, to: u64) -> u64 {
    let readable = |row: u64| {
        file.read_rows(g, roots, row, 1, 1)
            .ok()
            .and_then(|mut batches| batches.next())
            .is_some_and(|b| b.is_ok_and(|b| b.num_rows() == 1))
    };
    // `lo` cannot be read; `hi` can, or is `to`.
    let (mut lo, mut step) = (bad, 1u64);
    let mut hi = loop {
        let row = lo.saturating_add(step);
        if row >= to {
            break to;
        }
        if readable(row) {
            break row;
        }
        lo = row;
        step = step.saturating_mul(2);
    };
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if readable(mid) {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    hi
}
