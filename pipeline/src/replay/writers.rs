//! Where a replay's responses and error rows go: one writer of each,
//! shared by the workers, each of which hands it batches as its sinks
//! produce them (a Parquet file, memory, or nowhere once counted).

use std::sync::{Arc, Mutex};

use grflow_connectors::parquet::{ErrorSink, ResponseSink, SinkError};
use grflow_connectors::{ErrorRow, ResponseRow};

use super::ResponseOutput;
use crate::dataflow::BatchSink;

/// A file sink the job's workers hand batches of rows to.
pub(super) trait RowFile<R> {
    /// Takes `rows`, leaving the vector empty.
    fn append(&mut self, rows: &mut Vec<R>) -> Result<(), SinkError>;
    /// Closes the file; returns the most rows the sink held at once
    /// besides what its writer encoded.
    fn close(self) -> Result<usize, SinkError>;
}

impl RowFile<ResponseRow> for ResponseSink {
    fn append(&mut self, rows: &mut Vec<ResponseRow>) -> Result<(), SinkError> {
        let written = self.write(rows);
        rows.clear();
        written
    }

    fn close(self) -> Result<usize, SinkError> {
        // Each batch goes straight to the writer.
        self.finish().map(|_| 0)
    }
}

impl RowFile<ErrorRow> for ErrorSink {
    fn append(&mut self, rows: &mut Vec<ErrorRow>) -> Result<(), SinkError> {
        ErrorSink::append(self, rows)
    }

    fn close(self) -> Result<usize, SinkError> {
        self.finish_with_peak().map(|(_, peak)| peak)
    }
}

/// One of the job's row sinks, shared by the workers (each hands it batches).
pub(super) enum RowWriter<R, F> {
    Drop,
    File {
        // Boxed: one per job, and it dwarfs the other variants.
        sink: Box<F>,
        /// The first write error; later batches are dropped and replay fails.
        failed: Option<SinkError>,
    },
    Collect(Vec<R>),
}

pub(super) type ResponseWriter = RowWriter<ResponseRow, ResponseSink>;
pub(super) type ErrorWriter = RowWriter<ErrorRow, ErrorSink>;

/// The job's response and error writers. `ParquetReplacing` removes the
/// stale files as the responses file is opened.
pub(super) fn open_writers(
    output: &ResponseOutput,
) -> Result<(ResponseWriter, ErrorWriter), SinkError> {
    Ok(match output {
        ResponseOutput::Drop => (RowWriter::Drop, RowWriter::Drop),
        ResponseOutput::Parquet { responses, errors } => (
            RowWriter::file(ResponseSink::create(responses)?),
            RowWriter::file(ErrorSink::create(errors)?),
        ),
        ResponseOutput::ParquetReplacing {
            responses,
            errors,
            stale,
        } => {
            for file in stale.iter().filter(|f| f.exists()) {
                std::fs::remove_file(file).map_err(|source| SinkError::Io {
                    file: file.clone(),
                    source,
                })?;
            }
            (
                RowWriter::file(ResponseSink::create(responses)?),
                RowWriter::file(ErrorSink::create(errors)?),
            )
        }
        ResponseOutput::Collect => (
            RowWriter::Collect(Vec::new()),
            RowWriter::Collect(Vec::new()),
        ),
    })
}

impl<R, F: RowFile<R>> RowWriter<R, F> {
    fn file(sink: F) -> Self {
        Self::File {
            sink: Box::new(sink),
            failed: None,
        }
    }

    pub(super) fn write(&mut self, rows: &mut Vec<R>) {
        match self {
            Self::Drop => rows.clear(),
            Self::File { sink, failed } => {
                if failed.is_none()
                    && let Err(e) = sink.append(rows)
                {
                    *failed = Some(e);
                }
                rows.clear();
            }
            Self::Collect(all) => all.append(rows),
        }
    }

    /// Closes the file; returns what was collected (Collect only) and the
    /// most rows the file's sink held at once (`RowFile::close`).
    pub(super) fn finish(self) -> Result<(Vec<R>, usize), SinkError> {
        match self {
            Self::Drop => Ok((Vec::new(), 0)),
            Self::File { sink, failed } => match failed {
                Some(e) => Err(e),
                None => sink.close().map(|peak| (Vec::new(), peak)),
            },
            Self::Collect(all) => Ok((all, 0)),
        }
    }
}

/// Hands a worker's batches to a shared writer.
pub(super) fn batch_sink<R: 'static, F: RowFile<R> + 'static>(
    writer: &Arc<Mutex<RowWriter<R, F>>>,
) -> BatchSink<R> {
    let writer = writer.clone();
    Box::new(move |rows| writer.lock().expect("lock").write(rows))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A file that fails its second append (fault injection), counting
    /// what it took.
    #[derive(Default)]
    struct Flaky {
        appends: usize,
        rows: usize,
    }

    impl RowFile<u32> for Flaky {
        fn append(&mut self, rows: &mut Vec<u32>) -> Result<(), SinkError> {
            self.appends += 1;
            if self.appends == 2 {
                return Err(SinkError::Io {
                    file: "flaky.parquet".into(),
                    source: std::io::Error::other("disk full"),
                });
            }
            self.rows += rows.len();
            rows.clear();
            Ok(())
        }

        fn close(self) -> Result<usize, SinkError> {
            Ok(self.rows)
        }
    }

    #[test]
    fn drop_empties_batches_and_collect_keeps_them_in_order() {
        let mut dropped: RowWriter<u32, Flaky> = RowWriter::Drop;
        let mut batch = vec![1, 2];
        dropped.write(&mut batch);
        assert!(batch.is_empty());
        assert_eq!(dropped.finish().unwrap(), (Vec::new(), 0));
        let mut kept: RowWriter<u32, Flaky> = RowWriter::Collect(Vec::new());
        kept.write(&mut vec![1, 2]);
        kept.write(&mut vec![3]);
        assert_eq!(kept.finish().unwrap(), (vec![1, 2, 3], 0));
    }

    #[test]
    fn a_file_that_failed_once_takes_nothing_more_and_fails_the_finish() {
        let mut w = RowWriter::file(Flaky::default());
        w.write(&mut vec![1, 2, 3]);
        let mut failing = vec![4];
        w.write(&mut failing);
        // Cleared either way: the worker's batch buffer is reused.
        assert!(failing.is_empty());
        w.write(&mut vec![5, 6]);
        match &w {
            RowWriter::File { sink, failed } => {
                assert_eq!((sink.appends, sink.rows), (2, 3));
                assert!(failed.is_some());
            }
            _ => unreachable!(),
        }
        let e = w.finish().unwrap_err();
        assert!(e.to_string().contains("flaky.parquet"), "{e}");
    }

    #[test]
    fn replacing_removes_the_stale_outputs_only_when_the_writers_open() {
        let dir = std::env::temp_dir().join(format!("grflow-writers-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let stale = dir.join("windows.parquet");
        std::fs::write(&stale, b"old").unwrap();
        let output = ResponseOutput::ParquetReplacing {
            responses: dir.join("responses.parquet"),
            errors: dir.join("errors.parquet"),
            stale: vec![stale.clone(), dir.join("never-there.parquet")],
        };
        assert!(stale.exists());
        let (responses, errors) = open_writers(&output).unwrap();
        assert!(!stale.exists());
        assert!(responses.finish().is_ok() && errors.finish().is_ok());
        assert!(dir.join("responses.parquet").exists());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
