//! From the workers' results to `serve`'s summary: one process's as they
//! are; in cluster mode process 0 merges every process's part and names
//! the processes whose results did not arrive.

use std::collections::HashSet;

use grflow_connectors::kafka::{KafkaSettings, SharedState};

use super::summary::{AnswerLatency, ProcessPart, ServeSummary};
use super::worker::WorkerResult;
use crate::cluster::Topology;
use crate::config::Config;
use crate::dataflow::allocator::AllocatorStats;

/// What the summary is made from besides the workers' results.
pub(super) struct Made<'a> {
    pub cfg: &'a Config,
    pub topo: Topology,
    pub settings: &'a KafkaSettings,
    pub shared: &'a SharedState,
    pub latency: &'a AnswerLatency,
    /// Windows the window log could not write.
    pub windows_lost: u64,
    pub wall_s: f64,
}

/// The job's summary (process 0 in cluster mode) or this process's own.
pub(super) fn summary(made: Made<'_>, mut results: Vec<WorkerResult>) -> ServeSummary {
    let Made {
        cfg,
        topo,
        settings,
        shared,
        latency,
        windows_lost,
        wall_s,
    } = made;
    if !topo.is_cluster() {
        let part = ProcessPart::of(shared, latency, windows_lost);
        return summarise(cfg, topo, settings, &part, &results, wall_s);
    }
    // Cluster mode: process 0 received every worker's result and every
    // process's part; the others report their own process.
    let mut part = ProcessPart::default();
    let gathered = results.iter().any(|r| r.process_part.is_some());
    let mut missing = Vec::new();
    if topo.is_leader() && gathered {
        for p in results.iter().filter_map(|r| r.process_part.as_ref()) {
            part.merge(p);
        }
        missing = missing_processes(topo, &results);
        if !missing.is_empty() {
            tracing::warn!(
                ?missing,
                "the results of some processes did not reach process 0 in time: this \
                 summary leaves their counts out (each printed its own)"
            );
        }
    } else {
        part = ProcessPart::of(shared, latency, windows_lost);
        results.retain(|r| topo.local(r.worker).is_some());
    }
    let mut summary = summarise(cfg, topo, settings, &part, &results, wall_s);
    summary.processes_missing = missing;
    summary
}

/// The processes none of whose results arrived at process 0.
fn missing_processes(topo: Topology, results: &[WorkerResult]) -> Vec<usize> {
    let reported: HashSet<usize> = results
        .iter()
        .filter(|r| r.process_part.is_some())
        .map(|r| r.worker / topo.threads.max(1))
        .collect();
    (0..topo.processes)
        .filter(|p| !reported.contains(p))
        .collect()
}

fn summarise(
    cfg: &Config,
    topo: Topology,
    settings: &KafkaSettings,
    part: &ProcessPart,
    results: &[WorkerResult],
    wall_s: f64,
) -> ServeSummary {
    let c = &part.counts;
    ServeSummary {
        brokers: settings.brokers.clone(),
        request_topic: cfg.kafka.request_topic.clone(),
        response_topic: cfg.kafka.response_topic.clone(),
        dead_letter_topic: cfg.kafka.dead_letter_topic.clone(),
        workers: topo.total(),
        process: topo.process,
        processes: topo.processes,
        processes_missing: Vec::new(),
        release: cfg.run.serve_release().as_str().to_string(),
        wall_s,
        requests_in: c.consumed,
        responses_out: c.responses,
        errors: c.shed + c.stale + c.unservable + c.dead_lettered,
        throughput_rps: c.responses as f64 / wall_s.max(1e-9),
        shed: c.shed,
        stale: c.stale,
        skipped_offsets: c.skipped_offsets,
        log_resets: c.log_resets,
        recovered_unshed: c.recovered_unshed,
        unservable: c.unservable,
        dead_lettered: c.dead_lettered,
        duplicates_skipped: c.duplicates,
        repeated_req_ids: c.repeated_req_ids,
        already_answered: c.already_answered,
        late: c.late,
        clamped_ts: c.clamped_ts,
        delivered: c.delivered,
        resent: c.resent,
        produce_failures: c.produce_failures,
        undeliverable: c.undeliverable,
        commit_failures: c.commit_failures,
        read_errors: c.read_errors,
        drain_timed_out: part.drain_timed_out,
        windows_lost: part.windows_lost,
        pauses: c.pauses,
        oov_items: results.iter().map(|r| r.oov_items).sum(),
        // Counted by the nodes, once per request served: one cut at decode
        // and again by a node still on a shorter model is one request.
        truncated_histories: results.iter().map(|r| r.truncated_histories).sum(),
        unknown_user_histories: results.iter().map(|r| r.unknown_user_histories).sum(),
        in_flight_at_exit: part.in_flight,
        latency_ms: crate::summary::LatencySummary::from_histogram(&part.latency),
        by_mode: part.by_mode.summaries(&cfg.run.slo_ms),
        lag: part.lag.clone(),
        committed: results
            .iter()
            .flat_map(|r| r.committed.iter().copied())
            .collect(),
        // The lowest node's; nodes on different models are warned about.
        model_version: crate::models::version_at_exit(
            results.iter().map(|r| (r.worker, r.model_version.as_str())),
        ),
        alpha_at_exit: results.iter().map(|r| (r.worker, r.alpha)).collect(),
        refill: results.iter().map(|r| (r.worker, r.refill)).collect(),
        allocator: cfg.allocator.moves().then(|| {
            let mut stats = AllocatorStats::default();
            for r in results {
                stats.merge(&r.allocator);
            }
            stats.summary(cfg.allocator.policy)
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn processes_whose_parts_did_not_arrive_are_named() {
        let topo = crate::cluster::Topology {
            processes: 3,
            process: 0,
            threads: 2,
        };
        // Every worker's result from processes 0 and 2, process 1's one
        // worker without its process's part: process 1 is missing.
        let results: Vec<WorkerResult> = [(0, true), (1, false), (3, false), (4, true), (5, false)]
            .into_iter()
            .map(|(worker, part)| WorkerResult {
                worker,
                process_part: part.then(ProcessPart::default),
                ..WorkerResult::default()
            })
            .collect();
        assert_eq!(missing_processes(topo, &results), vec![1]);
        assert!(missing_processes(topo, &[]).len() == 3);
    }
}
