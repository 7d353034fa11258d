//! The requests `send` reads: a Parquet trace a batch at a time, or a
//! generated one.

use std::path::Path;

use grflow_connectors::parquet::ParquetRequestSource;
use grflow_connectors::{RequestSource, SourceRecord, SourceState};
use grflow_traces::Request;

use crate::cli::InputError;

/// A trace's requests in order: generated in memory, or read from Parquet
/// a batch at a time; [`Self::rewind`] starts again (`--loop`).
pub enum TraceRequests {
    Memory {
        requests: Vec<Request>,
        next: usize,
    },
    Parquet {
        dir: std::path::PathBuf,
        max_candidates: usize,
        source: Box<ParquetRequestSource>,
        pending: std::collections::VecDeque<SourceRecord>,
        done: bool,
    },
}

impl TraceRequests {
    /// The next request, or the position and reason of an unreadable row.
    pub fn next(&mut self) -> Option<Result<Request, String>> {
        match self {
            TraceRequests::Memory { requests, next } => {
                let r = requests.get(*next).cloned().map(Ok);
                *next += 1;
                r
            }
            TraceRequests::Parquet {
                source,
                pending,
                done,
                ..
            } => loop {
                if let Some(rec) = pending.pop_front() {
                    return Some(match rec {
                        SourceRecord::Request { request, .. } => Ok(request),
                        SourceRecord::Bad {
                            position, reason, ..
                        } => Err(format!("{position}: {reason}")),
                    });
                }
                if *done {
                    return None;
                }
                match source.poll(1024, 0) {
                    Ok(p) => {
                        pending.extend(p.records);
                        *done = p.state == SourceState::Exhausted;
                    }
                    Err(e) => return Some(Err(e.to_string())),
                }
            },
        }
    }

    /// Back to the first request.
    pub fn rewind(&mut self) -> anyhow::Result<()> {
        match self {
            TraceRequests::Memory { next, .. } => *next = 0,
            TraceRequests::Parquet {
                dir,
                max_candidates,
                ..
            } => *self = open_parquet(&dir.clone(), *max_candidates)?,
        }
        Ok(())
    }
}

/// The requests to send and a name for them: `trace`, else the job's
/// catalog (`kafka.catalog`), else the config's generated `[trace]` (which
/// the job then serves), warning when `trace` is not the job's catalog.
pub fn requests_for(
    trace: Option<&Path>,
    config: &grflow_pipeline::Config,
) -> anyhow::Result<(TraceRequests, String)> {
    let catalog = config.kafka.catalog.clone();
    Ok(match (trace, catalog.is_empty()) {
        (Some(dir), _) => {
            let dir_source = open_parquet(dir, config.model.max_candidates)?;
            if !catalog.is_empty() && !same_dir(dir, Path::new(&catalog)) {
                eprintln!(
                    "warning: the job's catalog is kafka.catalog = {catalog:?}; the requests of {} \
                     name that trace's users and items",
                    dir.display()
                );
            } else if catalog.is_empty() {
                eprintln!(
                    "warning: kafka.catalog is empty, so the job serves the [trace] section's \
                     generated users and items; the requests of {} name its own (set \
                     kafka.catalog = {:?} in the job's config)",
                    dir.display(),
                    dir.display().to_string()
                );
            }
            (dir_source, dir.display().to_string())
        }
        (None, false) => (
            open_parquet(Path::new(&catalog), config.model.max_candidates)?,
            format!("{catalog} (kafka.catalog)"),
        ),
        (None, true) => {
            let gen_cfg = config
                .trace
                .gen_config()
                .map_err(InputError::from_display)?;
            // As replay: every generated request would be refused.
            if gen_cfg.candidates > config.model.max_candidates {
                return Err(InputError::from_display(format!(
                    "trace.candidates ({}) is more than model.max_candidates ({}): the job \
                     would refuse every generated request",
                    gen_cfg.candidates, config.model.max_candidates
                )));
            }
            let trace = grflow_traces::generate(&gen_cfg);
            (
                TraceRequests::Memory {
                    requests: trace.requests,
                    next: 0,
                },
                "the config's [trace] section (generated)".to_string(),
            )
        }
    })
}

/// A Parquet trace whose rows with more candidates than the job takes
/// (`model.max_candidates`) are unreadable rows: skipped and named, not
/// sent to be dead-lettered.
fn open_parquet(dir: &Path, max_candidates: usize) -> anyhow::Result<TraceRequests> {
    let source = ParquetRequestSource::open(dir, 0, 1)
        .map_err(|e| InputError::from_display(format!("--trace {}: {e}", dir.display())))?
        .with_max_candidates(max_candidates);
    Ok(TraceRequests::Parquet {
        max_candidates,
        dir: dir.to_path_buf(),
        source: Box::new(source),
        pending: Default::default(),
        done: false,
    })
}

fn same_dir(a: &Path, b: &Path) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => a == b,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use grflow_traces::{GenConfig, Regime, WriteOptions, generate, write_trace};

    fn all(t: &mut TraceRequests) -> Vec<u64> {
        std::iter::from_fn(|| t.next())
            .map(|r| r.expect("readable").req_id)
            .collect()
    }

    #[test]
    fn a_rewound_trace_gives_its_requests_again_from_parquet_and_from_memory() {
        let trace = generate(&GenConfig {
            regime: Regime::Steady,
            users: 20,
            items: 300,
            requests: 2_500,
            candidates: 4,
            ..GenConfig::default()
        });
        let ids: Vec<u64> = trace.requests.iter().map(|r| r.req_id).collect();
        let dir = std::env::temp_dir().join(format!("grflow-send-rewind-{}", std::process::id()));
        // Several row groups, so a rewind must start over across them.
        let opts = WriteOptions {
            row_group_rows: 1_000,
            ..WriteOptions::default()
        };
        write_trace(&dir, &trace, &opts).unwrap();
        let mut parquet = open_parquet(&dir, 100).unwrap();
        let mut memory = TraceRequests::Memory {
            requests: trace.requests.clone(),
            next: 0,
        };
        for t in [&mut parquet, &mut memory] {
            assert_eq!(all(t), ids);
            assert!(t.next().is_none(), "stays at its end");
            t.rewind().unwrap();
            assert_eq!(all(t), ids, "the same requests again");
        }
        // More candidates (4) than the job takes (3): every row is skipped
        // with its reason, before and after a rewind, instead of being sent
        // to be dead-lettered.
        let mut narrow = open_parquet(&dir, 3).unwrap();
        for _ in 0..2 {
            let rows: Vec<_> = std::iter::from_fn(|| narrow.next()).collect();
            assert_eq!(rows.len(), ids.len());
            let reason = rows[0].as_ref().unwrap_err();
            assert!(reason.contains("too_many_candidates"), "{reason}");
            assert!(rows.iter().all(|r| r.is_err()));
            narrow.rewind().unwrap();
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_generated_trace_the_job_would_refuse_is_not_sent() {
        let mut config = grflow_pipeline::Config::default();
        config.kafka.catalog.clear();
        config.model.max_candidates = 50;
        config.trace.candidates = 100;
        let Err(e) = requests_for(None, &config) else {
            panic!("a trace of 100 candidates against max_candidates 50 was accepted");
        };
        assert!(e.to_string().contains("model.max_candidates"), "{e}");
    }
}
