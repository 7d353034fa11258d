//! Where a replay worker's outputs go: closed windows into its rows,
//! responses and error rows tallied (latency per node and kind, counters)
//! and handed to the job's sinks in batches, or in cluster mode exchanged
//! to worker 0, which alone writes them.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;
use timely::dataflow::operators::vec::Map;
use timely::dataflow::operators::{Concat, Exchange};

use grflow_connectors::{ErrorRow, ResponseRow};

use super::{
    BatchSink, ErrorBatchSink, JobCounters, RESPONSE_BATCH, ResponseBatchSink, WorkerOutputs,
};
use crate::config::SloMs;
use crate::events::{ClosedWindow, NodeEvent};

/// The job's response and error sinks, shared by this worker's operators.
pub(super) struct Sinks {
    pub responses: Rc<RefCell<ResponseBatchSink>>,
    pub errors: Rc<RefCell<ErrorBatchSink>>,
}

/// Keeps the node's closed windows as rows (windows.parquet, the summary's
/// event-time span).
pub(super) fn window_rows<'s>(
    windows: StreamVec<'s, u64, ClosedWindow>,
    outputs: Rc<RefCell<WorkerOutputs>>,
) {
    windows.sink(Pipeline, "WindowRows", move |(input, _)| {
        let mut out = outputs.borrow_mut();
        input.for_each(|_, data| {
            out.windows.extend(data.drain(..).map(|w| w.to_row()));
        });
    });
}

/// A row on its way to worker 0's sinks (cluster mode).
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
enum Gathered {
    Response(ResponseRow),
    Error(ErrorRow),
}

/// Cluster mode: every worker's responses and error rows (the node's and
/// the source's bad records) go to worker 0, which hands them to the sinks
/// in batches.
pub(super) fn gather_outputs<'s>(
    events: StreamVec<'s, u64, NodeEvent>,
    bad: StreamVec<'s, u64, ErrorRow>,
    sinks: &Sinks,
    outputs: Rc<RefCell<WorkerOutputs>>,
) {
    let (mut responses, mut errors) = (Vec::new(), Vec::new());
    let response_sink = sinks.responses.clone();
    let error_sink = sinks.errors.clone();
    events
        .flat_map(|e| match e {
            NodeEvent::Response(r) => Some(Gathered::Response(r.0)),
            NodeEvent::Error(e) => Some(Gathered::Error(e.0)),
            _ => None,
        })
        .concat(bad.map(Gathered::Error))
        .exchange(|_| 0)
        .sink(Pipeline, "GatherOutputs", move |(input, frontier)| {
            input.for_each(|_, data| {
                for row in data.drain(..) {
                    match row {
                        Gathered::Response(r) => responses.push(r),
                        Gathered::Error(e) => errors.push(e),
                    }
                }
            });
            let done = frontier.frontier().is_empty();
            flush_batch(&mut responses, done, &response_sink);
            let peak = &mut outputs.borrow_mut().pending_errors_peak;
            flush_errors(&mut errors, peak, done, &error_sink);
        });
}

/// What [`tally`] records into.
pub(super) struct Tally {
    pub outputs: Rc<RefCell<WorkerOutputs>>,
    pub counters: Arc<JobCounters>,
    pub slo_ms: SloMs,
    /// Hand the rows to the sinks here (not in cluster mode, where worker
    /// 0 gathers them).
    pub write: bool,
}

/// Counts and tallies every response and error of this worker's node
/// (latency per node and kind against its SLO; an error is a miss of its
/// kind) and, outside cluster mode, hands the rows to the sinks: a full
/// batch, or the last one once no more can come.
pub(super) fn tally<'s>(events: StreamVec<'s, u64, NodeEvent>, t: Tally, sinks: &Sinks) {
    let response_sink = sinks.responses.clone();
    let error_sink = sinks.errors.clone();
    let Tally {
        outputs,
        counters,
        slo_ms,
        write,
    } = t;
    events.sink(Pipeline, "Outputs", move |(input, frontier)| {
        let mut out = outputs.borrow_mut();
        input.for_each(|_, data| {
            for event in data.drain(..) {
                match event {
                    NodeEvent::Response(r) => {
                        counters.responses_out.fetch_add(1, Ordering::Relaxed);
                        let (row, origin) = *r;
                        out.latency
                            .entry(row.node)
                            .or_default()
                            .record(row.latency_ms, slo_ms.for_mode(origin.mode));
                        out.by_mode.record(origin.mode, row.latency_ms, &slo_ms);
                        if write {
                            out.pending_responses.push(row);
                        }
                    }
                    NodeEvent::Error(e) => {
                        counters.errors.fetch_add(1, Ordering::Relaxed);
                        let (row, _, origin) = *e;
                        out.by_mode.record_failure(origin.mode);
                        if write {
                            out.pending_errors.push(row);
                        }
                    }
                    NodeEvent::Telemetry(_) | NodeEvent::Report(_) => {}
                }
            }
        });
        if !write {
            return;
        }
        let done = frontier.frontier().is_empty();
        flush_batch(&mut out.pending_responses, done, &response_sink);
        out.flush_pending_errors(done, &error_sink);
    });
}

/// Counts the source's bad records (rows that failed to decode) and,
/// outside cluster mode, hands them to the error sink with the node's.
pub(super) fn bad_records<'s>(
    bad: StreamVec<'s, u64, ErrorRow>,
    outputs: Rc<RefCell<WorkerOutputs>>,
    counters: Arc<JobCounters>,
    write: bool,
    sinks: &Sinks,
) {
    let error_sink = sinks.errors.clone();
    bad.sink(Pipeline, "BadRecords", move |(input, frontier)| {
        let mut out = outputs.borrow_mut();
        input.for_each(|_, data| {
            counters
                .errors
                .fetch_add(data.len() as u64, Ordering::Relaxed);
            if write {
                out.pending_errors.append(data);
            }
        });
        if write {
            out.flush_pending_errors(frontier.frontier().is_empty(), &error_sink);
        }
    });
}

/// Hands `rows` to `sink` once a batch is full, or once no more can come
/// (`done`) and some are left.
fn flush_batch<R>(rows: &mut Vec<R>, done: bool, sink: &RefCell<BatchSink<R>>) {
    if rows.len() >= RESPONSE_BATCH || (done && !rows.is_empty()) {
        (sink.borrow_mut())(rows);
    }
}

/// As [`flush_batch`] for error rows, noting in `peak` the most `pending`
/// held. Outside cluster mode the node's errors and the source's bad
/// records share one buffer, and the operator that finishes last hands
/// over what is left.
fn flush_errors(
    pending: &mut Vec<ErrorRow>,
    peak: &mut usize,
    done: bool,
    sink: &RefCell<ErrorBatchSink>,
) {
    *peak = (*peak).max(pending.len());
    flush_batch(pending, done, sink);
}

impl WorkerOutputs {
    /// This worker's held error rows, by [`flush_errors`].
    fn flush_pending_errors(&mut self, done: bool, sink: &RefCell<ErrorBatchSink>) {
        flush_errors(
            &mut self.pending_errors,
            &mut self.pending_errors_peak,
            done,
            sink,
        );
    }
}
