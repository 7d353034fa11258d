//! Timely wrapper of a request source: paces event time against wall time
//! and turns the source's watermarks into capability downgrades.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use timely::dataflow::operators::generic::operator::source;
use timely::dataflow::{ProbeHandle, Scope, StreamVec};

use grflow_connectors::{ErrorRow, RequestSource, SourceError, SourceRecord, SourceState};

use crate::config::Speed;
use crate::events::{Admitted, Ingest, now_ns};
use crate::stop::StopRequest;

/// Records emitted per activation before yielding to other operators.
const MAX_PER_ACTIVATION: usize = 512;

/// How soon a live source with nothing ready looks again.
const IDLE_POLL: Duration = Duration::from_millis(1);

/// How soon a source held back by [`Ahead`] looks at the frontier again.
const AHEAD_RECHECK: Duration = Duration::from_micros(200);

/// The longest a source with a stop flag sleeps (waiting for a paced
/// request's due time) before it looks at the flag again.
const STOP_POLL: Duration = Duration::from_millis(50);

/// Maps event time to the wall time at which it may enter.
#[derive(Clone, Copy, Debug)]
pub struct Pacing {
    pub speed: Speed,
    /// Event time that enters at `start`.
    pub origin_ts_ms: u64,
    pub start: Instant,
}

impl Pacing {
    /// The latest event time allowed in now.
    pub(crate) fn allowed(&self) -> u64 {
        match self.speed {
            Speed::Max => u64::MAX,
            Speed::Factor(f) => {
                let elapsed_ms = self.start.elapsed().as_secs_f64() * 1000.0;
                self.origin_ts_ms.saturating_add((elapsed_ms * f) as u64)
            }
        }
    }

    /// How long after its due time `ts_ms` enters now: zero on time or
    /// unpaced. The source shares its worker thread with a node, so a
    /// request due while that node computes enters only after the step.
    /// Latency counts from the due time, as a client that sent the request
    /// then would see it; counting from entry would hide that wait and
    /// flatter exactly the runs with the longest steps.
    pub(crate) fn lateness(&self, ts_ms: u64) -> Duration {
        self.due(ts_ms).map_or(Duration::ZERO, |due| {
            self.start.elapsed().saturating_sub(due)
        })
    }

    /// Wall time to wait until `ts_ms` is allowed in.
    pub(crate) fn wait_for(&self, ts_ms: u64) -> Duration {
        self.due(ts_ms).map_or(Duration::ZERO, |due| {
            due.saturating_sub(self.start.elapsed())
        })
    }

    /// Wall time from the start at which `ts_ms` is due; `None` unpaced.
    fn due(&self, ts_ms: u64) -> Option<Duration> {
        self.speed
            .wall_time(ts_ms.saturating_sub(self.origin_ts_ms))
    }
}

/// Backpressure for unpaced runs: the source emits a record only while its
/// event time is at most `max_ms` past the probe's frontier (the oldest
/// time not yet fully answered). Without it `--speed max` pours the whole
/// trace into the channels at once: memory grows with the trace, and every
/// distinct time in flight is a pointstamp that timely's progress tracking
/// sorts on each change, so the job slows quadratically.
#[derive(Clone, Debug)]
pub struct Ahead {
    pub probe: ProbeHandle<u64>,
    pub max_ms: u64,
}

impl Ahead {
    /// The latest event time the source may emit now.
    fn allowed(&self) -> u64 {
        self.probe.with_frontier(|f| match f.iter().min() {
            Some(&t) => t.saturating_add(self.max_ms),
            // Nothing in flight anywhere: nothing to wait for.
            None => u64::MAX,
        })
    }

    /// Whether the job has answered everything before `time` (this
    /// source's capability): then waiting cannot move the frontier past it.
    fn caught_up(&self, time: u64) -> bool {
        self.probe
            .with_frontier(|f| f.iter().min().is_none_or(|&t| t >= time))
    }
}

/// Counters the source shares with the progress display.
#[derive(Debug, Default)]
pub struct SourceCounters {
    /// Every record the source met, readable or not: each one is answered
    /// by a response or an error, so `requests_in == responses_out + errors`.
    pub requests_in: AtomicU64,
    /// Records that could not be read (also in `requests_in`).
    pub bad_records: AtomicU64,
    /// Records whose event time was behind this worker's watermark.
    pub late: AtomicU64,
    /// The newest event time (ms) of a request admitted: how far a replay
    /// stopped early got into its trace.
    pub newest_ts_ms: AtomicU64,
}

impl SourceCounters {
    /// Counts a record that entered but cannot be served (its error row
    /// answers it): in `requests_in` and as an error record, here and on
    /// /metrics, so that requests in = responses + errors in both.
    fn count_bad(&self) {
        self.requests_in.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("grflow_requests_in_total").increment(1);
        self.bad_records.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("grflow_errors_total", "kind" => "bad_record").increment(1);
    }

    /// Counts an unreadable batch of the input and names it: it entered,
    /// and its error row answers it.
    fn unreadable(&self, e: SourceError) -> Ingest {
        self.count_bad();
        Ingest::Bad(ErrorRow {
            position: e.position(),
            reason: e.to_string(),
            req_id: None,
        })
    }
}

/// What the source wrapper knows of its [`RequestSource`] between polls.
#[derive(Debug, Default)]
struct Reader {
    /// The least event time the source may still hand over (monotone).
    watermark: u64,
    exhausted: bool,
    /// A live source had nothing ready at the last poll.
    idle: bool,
    /// This activation has read ahead once already.
    ahead_done: bool,
}

impl Reader {
    fn poll(
        &mut self,
        records: &mut dyn RequestSource,
        pending: &mut VecDeque<SourceRecord>,
        floor_ms: u64,
    ) -> Result<(), SourceError> {
        let polled = records.poll(MAX_PER_ACTIVATION, floor_ms)?;
        pending.extend(polled.records);
        self.watermark = self.watermark.max(polled.watermark_ms);
        match polled.state {
            SourceState::Ready => {}
            SourceState::Idle => self.idle = true,
            SourceState::Exhausted => self.exhausted = true,
        }
        Ok(())
    }

    /// Reads on until no record still unread can be older than the oldest
    /// pending one (or the source ends), then puts `pending` in time order,
    /// unreadable records first. For a trace whose row groups run backwards
    /// this holds what lies between in memory: the price of serving it in
    /// event time. Returns the unreadable batches met on the way.
    fn ahead(
        &mut self,
        records: &mut dyn RequestSource,
        pending: &mut VecDeque<SourceRecord>,
        floor_ms: u64,
    ) -> Vec<SourceError> {
        self.ahead_done = true;
        let ts = |r: &SourceRecord| match r {
            SourceRecord::Request { request, .. } => request.ts_ms,
            SourceRecord::Bad { .. } => 0,
        };
        let mut oldest = pending.iter().map(ts).min().unwrap_or(u64::MAX);
        let mut unreadable = Vec::new();
        while !self.exhausted && !self.idle && oldest > self.watermark {
            let before = pending.len();
            if let Err(e) = self.poll(records, pending, floor_ms) {
                unreadable.push(e);
            }
            oldest = pending.range(before..).map(ts).fold(oldest, u64::min);
        }
        pending.make_contiguous().sort_by_key(ts);
        unreadable
    }
}

/// Admits a record taken from the front of the pending queue: counts it
/// and returns the time it enters at (a request behind the capability
/// `now` enters at `now`, counted late, never dropped; an unreadable
/// record at `now`) with what enters.
fn admit(
    record: SourceRecord,
    now: u64,
    pacing: &Pacing,
    counters: &SourceCounters,
) -> (u64, Ingest) {
    match record {
        SourceRecord::Bad {
            position,
            reason,
            req_id,
        } => {
            counters.count_bad();
            let row = ErrorRow {
                position: position.to_string(),
                reason,
                req_id,
            };
            (now, Ingest::Bad(row))
        }
        SourceRecord::Request {
            request,
            position,
            inline_history,
            recovered,
            history_cut,
        } => {
            let ts = request.ts_ms.max(now);
            if ts != request.ts_ms {
                counters.late.fetch_add(1, Ordering::Relaxed);
            }
            counters.requests_in.fetch_add(1, Ordering::Relaxed);
            counters.newest_ts_ms.fetch_max(ts, Ordering::Relaxed);
            metrics::counter!("grflow_requests_in_total").increment(1);
            let late_ns = pacing.lateness(request.ts_ms).as_nanos() as u64;
            let admitted_ns = now_ns().saturating_sub(late_ns);
            let admitted = Admitted {
                request,
                position,
                admitted_ns,
                inline_history,
                recovered,
                history_cut,
            };
            (ts, Ingest::Request(Box::new(admitted)))
        }
    }
}

/// The time the source's capability may move to: nothing earlier than the
/// pending requests and the watermark (which covers what the source has
/// not handed over yet, e.g. later row groups) can still come from this
/// worker; an unreadable record at the front holds it at `now`. The front
/// alone made earlier requests behind it or in later row groups late, and
/// how many depended on the pace.
fn next_time(pending: &VecDeque<SourceRecord>, watermark: u64, now: u64) -> u64 {
    match pending.front() {
        Some(SourceRecord::Bad { .. }) => now,
        _ => pending
            .iter()
            .filter_map(|r| match r {
                SourceRecord::Request { request, .. } => Some(request.ts_ms),
                SourceRecord::Bad { .. } => None,
            })
            .fold(watermark, u64::min),
    }
}

/// When the source runs again: `None` at once, else after the wait. A
/// paced request not yet due waits for its due time (at most
/// [`STOP_POLL`] when a stop can be asked for); one held back by `ahead`
/// looks again after the nodes have made progress (parking, not spinning,
/// meanwhile); a live source that found nothing polls again shortly.
fn wake(
    front: Option<&SourceRecord>,
    paced: u64,
    allowed: u64,
    pacing: &Pacing,
    stoppable: bool,
    idle: bool,
) -> Option<Duration> {
    match front {
        Some(SourceRecord::Request { request, .. }) if request.ts_ms > paced => {
            let wait = pacing.wait_for(request.ts_ms);
            Some(if stoppable { wait.min(STOP_POLL) } else { wait })
        }
        Some(SourceRecord::Request { request, .. }) if request.ts_ms > allowed => {
            Some(AHEAD_RECHECK)
        }
        None if idle => Some(IDLE_POLL),
        _ => None,
    }
}

pub fn request_source<'s>(
    scope: Scope<'s, u64>,
    mut records: Box<dyn RequestSource>,
    pacing: Pacing,
    ahead: Option<Ahead>,
    counters: Arc<SourceCounters>,
    stop: Option<StopRequest>,
) -> StreamVec<'s, u64, Ingest> {
    source(scope, "RequestSource", move |capability, info| {
        let activator = scope.activator_for(info.address);
        let mut cap = Some(capability);
        let mut pending: VecDeque<SourceRecord> = VecDeque::new();
        let mut read = Reader::default();

        move |output| {
            let Some(c) = cap.as_mut() else { return };
            if let Some(stop) = stop.as_ref().filter(|s| s.requested()) {
                // Stopped (`replay` on SIGINT/SIGTERM): read nothing more,
                // tell the other workers, and let what was admitted drain.
                // Records polled but not yet due never entered the job
                // (`requests_in` counts at admission), so dropping them
                // loses nothing that entered. Not ready any more (/readyz).
                crate::ops::state().set_draining();
                output.session(&*c).give(Ingest::Stopped(stop.signal()));
                pending.clear();
                cap = None;
                return;
            }
            let paced = pacing.allowed();
            let allowed = ahead.as_ref().map_or(paced, |a| paced.min(a.allowed()));
            read.ahead_done = false;
            let mut emitted = 0;
            loop {
                if pending.is_empty() {
                    if read.exhausted {
                        cap = None;
                        return;
                    }
                    if read.idle {
                        break;
                    }
                    if let Err(e) = read.poll(&mut *records, &mut pending, *c.time()) {
                        output.session(&*c).give(counters.unreadable(e));
                    }
                    continue;
                }
                if emitted >= MAX_PER_ACTIVATION {
                    break;
                }
                if let Some(SourceRecord::Request { request, .. }) = pending.front()
                    && request.ts_ms > allowed
                {
                    // Held back by `ahead` although the job has answered
                    // everything before this source's capability: what
                    // pins the capability below the front is a record not
                    // read yet (a later row group that starts earlier), so
                    // waiting would never end. Read on until it is in hand
                    // and go on in time order.
                    let stuck = request.ts_ms <= paced
                        && !read.ahead_done
                        && ahead.as_ref().is_some_and(|a| a.caught_up(*c.time()));
                    if !stuck {
                        break;
                    }
                    for e in read.ahead(&mut *records, &mut pending, *c.time()) {
                        output.session(&*c).give(counters.unreadable(e));
                    }
                    continue;
                }
                let record = pending.pop_front().expect("not empty");
                let (ts, ingest) = admit(record, *c.time(), &pacing, &counters);
                output.session(&c.delayed(&ts)).give(ingest);
                emitted += 1;
            }
            let next = next_time(&pending, read.watermark, *c.time());
            if next > *c.time() {
                c.downgrade(&next);
            }
            // The idle flag is spent only when nothing is pending.
            let idle = pending.is_empty() && std::mem::take(&mut read.idle);
            match wake(
                pending.front(),
                paced,
                allowed,
                &pacing,
                stop.is_some(),
                idle,
            ) {
                Some(after) => activator.activate_after(after),
                None => activator.activate(),
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use grflow_connectors::parquet::MemoryRequestSource;
    use grflow_traces::{Mode, Request};

    #[test]
    fn reading_ahead_stops_once_nothing_unread_is_older_and_sorts_by_time() {
        // Chunks of 2 running backwards: [50, 51], [30, 31], [10, 11], [0, 1].
        let requests: Vec<Request> = [50, 51, 30, 31, 10, 11, 0, 1]
            .into_iter()
            .enumerate()
            .map(|(i, ts_ms)| Request {
                ts_ms,
                req_id: i as u64,
                user_id: 1,
                hist_len: 1,
                candidates: vec![1],
                mode: Mode::Rank,
                label: None,
            })
            .collect();
        let mut source = MemoryRequestSource::with_chunk_rows(Arc::new(requests), 0, 1, 2);
        let mut read = Reader::default();
        let mut pending = VecDeque::new();
        read.poll(&mut source, &mut pending, 0).unwrap();
        // The first chunk's watermark is the last chunk's start.
        assert_eq!(pending.len(), 2);
        assert_eq!(read.watermark, 0);
        assert!(read.ahead(&mut source, &mut pending, 0).is_empty());
        assert!(read.ahead_done);
        let times: Vec<u64> = pending
            .iter()
            .map(|r| match r {
                SourceRecord::Request { request, .. } => request.ts_ms,
                SourceRecord::Bad { .. } => unreachable!(),
            })
            .collect();
        // Every chunk had to be read to reach ts 0; all of it in time order.
        assert_eq!(times, vec![0, 1, 10, 11, 30, 31, 50, 51]);
    }

    #[test]
    fn lateness_counts_from_the_due_time_of_a_paced_request() {
        let start = Instant::now() - Duration::from_millis(500);
        let paced = Pacing {
            speed: Speed::Factor(2.0),
            origin_ts_ms: 1_000,
            start,
        };
        // Due 100 ms after start (200 event ms at 2x): ~400 ms late now.
        let late = paced.lateness(1_200);
        assert!(
            late >= Duration::from_millis(400) && late < Duration::from_millis(450),
            "{late:?}"
        );
        // Not due yet: not late.
        assert_eq!(paced.lateness(10_000), Duration::ZERO);
        // Unpaced runs have no due times.
        let unpaced = Pacing {
            speed: Speed::Max,
            ..paced
        };
        assert_eq!(unpaced.lateness(1_200), Duration::ZERO);
    }

    fn at(ts_ms: u64) -> SourceRecord {
        SourceRecord::request(
            Request {
                ts_ms,
                req_id: ts_ms,
                user_id: 1,
                hist_len: 1,
                candidates: vec![1],
                mode: Mode::Rank,
                label: None,
            },
            grflow_connectors::SourcePosition::Parquet {
                file: "t".into(),
                row_group: 0,
                row: ts_ms,
            },
        )
    }

    fn bad() -> SourceRecord {
        SourceRecord::Bad {
            position: grflow_connectors::SourcePosition::Parquet {
                file: "t".into(),
                row_group: 0,
                row: 7,
            },
            reason: "unreadable".into(),
            req_id: Some(7),
        }
    }

    #[test]
    fn a_request_behind_the_capability_enters_at_it_counted_late() {
        let counters = SourceCounters::default();
        let unpaced = Pacing {
            speed: Speed::Max,
            origin_ts_ms: 0,
            start: Instant::now(),
        };
        let (ts, ingest) = admit(at(40), 50, &unpaced, &counters);
        assert_eq!(ts, 50);
        assert!(matches!(ingest, Ingest::Request(a) if a.request.ts_ms == 40));
        let (ts, _) = admit(at(60), 50, &unpaced, &counters);
        assert_eq!(ts, 60);
        assert_eq!(counters.late.load(Ordering::Relaxed), 1);
        assert_eq!(counters.requests_in.load(Ordering::Relaxed), 2);
        assert_eq!(counters.newest_ts_ms.load(Ordering::Relaxed), 60);
        // An unreadable record enters now, counted in and as bad.
        let (ts, ingest) = admit(bad(), 50, &unpaced, &counters);
        assert_eq!(ts, 50);
        assert!(matches!(ingest, Ingest::Bad(row) if row.req_id == Some(7)));
        assert_eq!(counters.requests_in.load(Ordering::Relaxed), 3);
        assert_eq!(counters.bad_records.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn the_capability_moves_to_the_oldest_pending_request_or_the_watermark() {
        let pending: VecDeque<SourceRecord> = [at(30), at(20), at(40)].into();
        // Not the front (30): a request behind it is older.
        assert_eq!(next_time(&pending, 100, 0), 20);
        assert_eq!(next_time(&pending, 10, 0), 10);
        assert_eq!(next_time(&VecDeque::new(), 100, 0), 100);
        // An unreadable record at the front is given at the capability.
        let held: VecDeque<SourceRecord> = [bad(), at(30)].into();
        assert_eq!(next_time(&held, 100, 5), 5);
    }

    #[test]
    fn the_source_wakes_for_the_due_time_the_frontier_or_the_next_poll() {
        let paced = Pacing {
            speed: Speed::Factor(1.0),
            origin_ts_ms: 0,
            start: Instant::now(),
        };
        let not_due = at(10_000);
        // Paced: until the due time, or the stop poll when one can come.
        let wait = wake(Some(&not_due), 0, 0, &paced, false, false).unwrap();
        assert!(wait > Duration::from_secs(9), "{wait:?}");
        assert_eq!(
            wake(Some(&not_due), 0, 0, &paced, true, false),
            Some(STOP_POLL)
        );
        // Due but held back by the frontier.
        assert_eq!(
            wake(Some(&at(5)), 10, 1, &paced, false, false),
            Some(AHEAD_RECHECK)
        );
        // Allowed in: at once; nothing pending from a live source: poll soon.
        assert_eq!(wake(Some(&at(5)), 10, 10, &paced, false, false), None);
        assert_eq!(wake(None, 10, 10, &paced, false, true), Some(IDLE_POLL));
        assert_eq!(wake(None, 10, 10, &paced, false, false), None);
    }
}
