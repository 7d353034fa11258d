//! One step of a node: shed what waited past its deadline, serve the
//! rest with batched model calls, and turn the results into responses and
//! error records. Owned (`StepCtx`), so that it can run on the node's
//! compute thread.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use grflow_connectors::{ErrorRow, ResponseRow};
use grflow_operators::allocator::oracle::{
    OracleRecorder, OwnedRank, OwnedRetrieve, RecordedBatch,
};
use grflow_operators::node::{
    DeadlineCheck, DeadlineShedder, Deadlined, RankRequest, RankWork, RetrieveRequest,
    RetrieveWork, Served, ServingNode,
};
use grflow_operators::windows::TelemetrySample;

use super::{SharedNode, lock};
use crate::config::{Clock, SloMs};
use crate::events::{ErrorKind, NodeEvent, Origin, Routed, Telemetry};
use crate::side::SideTables;

/// Everything a step needs, owned, so that it can run on another thread.
#[derive(Clone)]
pub(super) struct StepCtx {
    pub(super) node: SharedNode,
    pub(super) side: Arc<SideTables>,
    pub(super) slo_ms: SloMs,
    pub(super) clock: Clock,
    pub(super) shedder: DeadlineShedder,
    pub(super) wall_ns: fn() -> u64,
}

/// A request of one activation with the output slot of its event time.
pub(super) struct Slotted {
    pub(super) slot: usize,
    pub(super) time: u64,
    pub(super) routed: Routed,
}

impl Deadlined for Slotted {
    fn admitted_ns(&self) -> u64 {
        self.routed.admitted_ns()
    }
    fn produced_ms(&self) -> u64 {
        self.routed.produced_ms()
    }
    fn recovered(&self) -> bool {
        self.routed.recovered()
    }
}

/// Wall time each request waited from admission to the start of its batch.
fn record_waits<'r>(node: &mut ServingNode, now: u64, batch: impl IntoIterator<Item = &'r Routed>) {
    for r in batch {
        node.record_wait(now.saturating_sub(r.admitted.admitted_ns) as f64 / 1e6);
    }
}

impl StepCtx {
    /// Answers the requests whose deadline has passed with a `shed` error
    /// and returns the rest, each with whether it is served late after a
    /// restart. Overload degrades this way instead of spending compute on
    /// requests nobody waits for any more.
    pub(super) fn shed_expired(
        &self,
        batch: Vec<Slotted>,
        out: &mut [Vec<NodeEvent>],
    ) -> Vec<(Slotted, bool)> {
        let split = self.shedder.split(batch, (self.wall_ns)());
        for (s, check) in split.shed {
            self.answer_shed(&s, check, &mut out[s.slot]);
        }
        split
            .serve
            .into_iter()
            .map(|(s, check)| (s, matches!(check, DeadlineCheck::ServeRecovered { .. })))
            .collect()
    }

    /// Answers `s`, which `check` sheds (`Shed` or `Stale`), with its error
    /// record and a failed sample: the one way an expired request is
    /// answered, whether a batch or a sweep of the queue found it.
    pub(super) fn answer_shed(&self, s: &Slotted, check: DeadlineCheck, out: &mut Vec<NodeEvent>) {
        let (kind, reason) = match check {
            DeadlineCheck::Shed {
                waited_ms,
                deadline_ms,
            } => (
                ErrorKind::Shed,
                format!("shed: waited {waited_ms:.1} ms, past the deadline of {deadline_ms} ms"),
            ),
            DeadlineCheck::Stale { age_ms, max_age_ms } => (
                ErrorKind::Stale,
                format!(
                    "stale: produced {age_ms:.0} ms ago (its ts_ms), past kafka.max_age_ms = \
                         {max_age_ms}"
                ),
            ),
            _ => unreachable!("only shed requests are here"),
        };
        self.fail(s, false, reason, kind, out);
    }

    /// Serves rank requests with batched model calls and retrieve
    /// requests as one group (one prefill, one beam decode), which runs in
    /// a lane beside them when the node has two lanes or more (else before
    /// them).
    pub(super) fn serve_batch(
        &self,
        batch: Vec<Slotted>,
        retrieve: Vec<Slotted>,
        oracle: Option<&Rc<RefCell<OracleRecorder>>>,
        out: &mut [Vec<NodeEvent>],
    ) {
        let batch = self.shed_expired(batch, out);
        let retrieve = self.shed_expired(retrieve, out);
        let side = &*self.side;
        let (members, histories) = self.with_histories(&batch, side, out);
        let work: Vec<RankWork<'_>> = members
            .iter()
            .zip(histories)
            .map(|((s, _), history)| {
                let req = &s.routed.admitted.request;
                RankWork {
                    req: RankRequest {
                        req_id: req.req_id,
                        user_id: req.user_id,
                        candidates: &req.candidates,
                    },
                    history,
                    cut_before: s.routed.admitted.history_cut,
                }
            })
            .collect();
        let (retrieving, histories) = self.with_histories(&retrieve, side, out);
        let retrieve_work: Vec<RetrieveWork<'_>> = retrieving
            .iter()
            .zip(histories)
            .map(|((s, _), history)| {
                let req = &s.routed.admitted.request;
                RetrieveWork {
                    req: RetrieveRequest {
                        req_id: req.req_id,
                        user_id: req.user_id,
                    },
                    history,
                    cut_before: s.routed.admitted.history_cut,
                }
            })
            .collect();
        if members.is_empty() && retrieving.is_empty() {
            return;
        }
        // One event time per batch: the latest of its requests (all equal
        // in `complete` mode).
        let now_ms = members
            .iter()
            .chain(&retrieving)
            .map(|(s, _)| s.time)
            .max()
            .unwrap_or(0);
        let mut node = lock(&self.node);
        if let Some(o) = oracle {
            o.borrow_mut().enter(&node, now_ms, side, &side.retrieval);
        }
        let alpha = node.alpha();
        record_waits(
            &mut node,
            (self.wall_ns)(),
            members.iter().chain(&retrieving).map(|(s, _)| &s.routed),
        );
        let gemm = grflow_kernels::gemm_tally();
        let (results, retrieved) = if retrieve_work.is_empty() {
            (node.serve_rank_batch(now_ms, &work, side), Vec::new())
        } else {
            node.serve_step(now_ms, &work, &retrieve_work, side, &side.retrieval)
        };
        node.count_gemm(grflow_kernels::gemm_tally().since(gemm));
        drop(node);
        if let Some(o) = oracle {
            let batch = RecordedBatch {
                now_ms,
                alpha,
                rank: work
                    .iter()
                    .map(|w| OwnedRank {
                        req_id: w.req.req_id,
                        user_id: w.req.user_id,
                        candidates: w.req.candidates.to_vec(),
                        history: w.history.to_vec(),
                    })
                    .collect(),
                retrieve: retrieve_work
                    .iter()
                    .map(|w| OwnedRetrieve {
                        req_id: w.req.req_id,
                        user_id: w.req.user_id,
                        history: w.history.to_vec(),
                    })
                    .collect(),
            };
            let answered: Vec<_> = results
                .iter()
                .chain(&retrieved)
                .filter_map(|r| r.as_ref().ok())
                .collect();
            let latencies: Vec<f64> = answered.iter().map(|s| s.modelled_latency_ms).collect();
            let truncated = answered.iter().filter(|s| s.truncated).count() as u64;
            o.borrow_mut().record(batch, &latencies, truncated);
        }
        for ((s, recovered_late), result) in members.into_iter().zip(results) {
            let served = result.map_err(|e| e.to_string());
            self.emit(s, recovered_late, served, &mut out[s.slot]);
        }
        for ((s, recovered_late), served) in retrieving.into_iter().zip(retrieved) {
            let served = served.map_err(|e| e.to_string());
            self.emit(s, recovered_late, served, &mut out[s.slot]);
        }
    }

    /// The response (with its telemetry) or the error of one request.
    fn emit(
        &self,
        s: &Slotted,
        recovered_late: bool,
        served: Result<Served, String>,
        out: &mut Vec<NodeEvent>,
    ) {
        let served = match served {
            Ok(served) => served,
            Err(reason) => {
                self.fail(s, recovered_late, reason, ErrorKind::Unservable, out);
                return;
            }
        };
        let routed = &s.routed;
        let req = &routed.admitted.request;
        let origin = origin(routed, recovered_late);
        let node = lock(&self.node);
        let latency_ms = match self.clock {
            Clock::Wall => {
                (self.wall_ns)().saturating_sub(routed.admitted.admitted_ns) as f64 / 1e6
            }
            Clock::Event | Clock::Virtual => served.modelled_latency_ms,
        };
        // Exactly the latency when the kinds' SLOs are equal.
        let to_rank_slo = self.slo_ms.rank / self.slo_ms.for_mode(req.mode);
        let sample = TelemetrySample {
            latency_ns: (latency_ms * 1e6).round() as u64,
            scaled_latency_ns: Some((latency_ms * to_rank_slo * 1e6).round() as u64),
            hot_user: routed.decision.hot_user,
            emb_hits: served.emb_hits,
            emb_lookups: served.emb_lookups,
            kv_reused_tokens: served.kv_reused_tokens,
            kv_total_tokens: served.kv_total_tokens,
            seq_len: served.seq_len,
            slo_violated: latency_ms > self.slo_ms.for_mode(req.mode),
            alpha_milli: (node.alpha() * 1000.0).round() as u32,
            truncated: served.truncated,
            alpha_pinned: node.alpha_pinned(),
            failed: false,
        };
        let labels = [
            ("node", node.id().to_string()),
            ("mode", req.mode.as_str().to_string()),
        ];
        metrics::counter!("grflow_responses_total", &labels).increment(1);
        metrics::histogram!("grflow_latency_ms", &labels).record(latency_ms);
        out.push(NodeEvent::Telemetry(Telemetry {
            node: node.id(),
            ts_ms: s.time,
            sample,
        }));
        let row = ResponseRow {
            req_id: req.req_id,
            node: node.id(),
            prefix: served.prefix.as_str().to_string(),
            items: served.items,
            scores: served.scores,
            latency_ms,
            model_version: node.model_version().to_string(),
            history_len: served.kv_total_tokens,
            kv_reused_tokens: served.kv_reused_tokens,
        };
        out.push(NodeEvent::Response(Box::new((row, origin))));
    }
}

fn origin(routed: &Routed, recovered_late: bool) -> Origin {
    Origin {
        position: routed.admitted.position.clone(),
        ts_ms: routed.admitted.request.ts_ms,
        admitted_ns: routed.admitted.admitted_ns,
        recovered_late,
        mode: routed.admitted.request.mode,
    }
}

/// Requests (with whether each is served late after a restart) and their
/// histories, in the same order.
type WithHistories<'a> = (Vec<(&'a Slotted, bool)>, Vec<&'a [u32]>);

impl StepCtx {
    /// The requests whose history can be read, with it; the others are
    /// answered `unservable` here.
    fn with_histories<'a>(
        &self,
        requests: &'a [(Slotted, bool)],
        side: &'a SideTables,
        out: &mut [Vec<NodeEvent>],
    ) -> WithHistories<'a> {
        let mut kept = Vec::with_capacity(requests.len());
        let mut histories = Vec::with_capacity(requests.len());
        let mut unknown_users = 0;
        for (s, recovered_late) in requests {
            if s.routed.admitted.asks_unknown_user(side) {
                unknown_users += 1;
            }
            match s.routed.admitted.history(side) {
                Ok(history) => {
                    kept.push((s, *recovered_late));
                    histories.push(history);
                }
                Err(e) => self.fail(
                    s,
                    *recovered_late,
                    e.to_string(),
                    ErrorKind::Unservable,
                    &mut out[s.slot],
                ),
            }
        }
        if unknown_users > 0 {
            lock(&self.node).count_unknown_user_histories(unknown_users);
        }
        (kept, histories)
    }

    /// Answers `s` with an error record, and gives its window a failed
    /// sample: the windows (and the allocator reading them) see a shed or
    /// unservable request as one that missed its SLO, not as no request.
    fn fail(
        &self,
        s: &Slotted,
        recovered_late: bool,
        reason: String,
        kind: ErrorKind,
        out: &mut Vec<NodeEvent>,
    ) {
        let req_id = s.routed.admitted.request.req_id;
        out.push(error_event(
            origin(&s.routed, recovered_late),
            req_id,
            reason,
            kind,
        ));
        let node = lock(&self.node);
        out.push(NodeEvent::Telemetry(Telemetry {
            node: node.id(),
            ts_ms: s.time,
            sample: TelemetrySample::failed(
                s.routed.decision.hot_user,
                (node.alpha() * 1000.0).round() as u32,
                node.alpha_pinned(),
            ),
        }));
    }
}

/// An error record in place of a response.
fn error_event(origin: Origin, req_id: u64, reason: String, kind: ErrorKind) -> NodeEvent {
    metrics::counter!("grflow_errors_total", "kind" => kind.as_str()).increment(1);
    let row = ErrorRow {
        position: origin.position.to_string(),
        reason,
        req_id: Some(req_id),
    };
    NodeEvent::Error(Box::new((row, kind, origin)))
}
