//! The allocator in the dataflow: each closed window of a node goes to
//! that node's [`Allocator`] (on the node's own worker: windows are
//! computed where the node's telemetry is), and a decision becomes a
//! `SetAlpha` command for the node's control input, emitted at the window's
//! end. Through the controller feedback edge it applies from W_end + 1.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::rc::Rc;
use std::time::Instant;

use serde::Serialize;
use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::Pipeline;
use timely::dataflow::operators::generic::Operator;

use grflow_operators::allocator::ppo::Step;
use grflow_operators::allocator::{Allocator, AllocatorPolicy};
use grflow_operators::node::NodeCommand;
use grflow_operators::windows::percentile;

use crate::events::{ClosedWindow, NodeControl, Target};

/// The allocator's commands come after a job's scheduled commands of the
/// same time (whose `seq` counts from 0), whichever input delivers first:
/// runs in `complete` mode stay reproducible.
const ALLOCATOR_SEQ: u64 = u64::MAX;

/// Decisions kept for the decision-time percentiles (the most recent).
const DECISION_SAMPLES: usize = 65_536;

/// What one worker's allocators did.
#[derive(Clone, Debug, Default, serde::Serialize, serde::Deserialize)]
pub struct AllocatorStats {
    pub windows: u64,
    /// Windows with enough requests to decide on (`allocator.min_requests`).
    #[serde(default)]
    pub decisions: u64,
    pub moves: u64,
    /// Decision times (µs), from the closed window's arrival to the command.
    decision_us: Vec<f64>,
    next: usize,
    /// Training (`allocator.sample`): each node's decisions with their
    /// rewards, in order.
    pub steps: Vec<(u32, Step)>,
}

impl AllocatorStats {
    fn record(&mut self, us: f64) {
        if self.decision_us.len() < DECISION_SAMPLES {
            self.decision_us.push(us);
        } else {
            self.decision_us[self.next] = us;
            self.next = (self.next + 1) % DECISION_SAMPLES;
        }
    }

    pub fn merge(&mut self, other: &AllocatorStats) {
        self.windows += other.windows;
        self.decisions += other.decisions;
        self.moves += other.moves;
        for &us in &other.decision_us {
            self.record(us);
        }
        self.steps.extend(other.steps.iter().cloned());
    }

    pub fn summary(&self, policy: AllocatorPolicy) -> AllocatorSummary {
        let mut us = self.decision_us.clone();
        us.sort_by(f64::total_cmp);
        AllocatorSummary {
            policy,
            windows: self.windows,
            decisions: self.decisions,
            alpha_moves: self.moves,
            decision_us_mean: if us.is_empty() {
                0.0
            } else {
                us.iter().sum::<f64>() / us.len() as f64
            },
            // Nearest rank, as every other p99 of grflow.
            decision_us_p99: percentile(&us, 0.99),
        }
    }
}

/// The allocator's part of a run summary.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct AllocatorSummary {
    pub policy: AllocatorPolicy,
    /// Closed windows the allocators saw.
    pub windows: u64,
    /// Of those, the windows with enough requests to decide on; the
    /// decision times are theirs.
    #[serde(default)]
    pub decisions: u64,
    /// `SetAlpha` commands they sent.
    pub alpha_moves: u64,
    /// Over the timed decisions; 0 when `decisions` is 0 (nothing timed:
    /// a report should show no figure, not 0 µs).
    pub decision_us_mean: f64,
    pub decision_us_p99: f64,
}

/// `SetAlpha` commands from closed windows; `make` builds a node's
/// allocator when its first window arrives.
pub fn allocate<'s>(
    windows: StreamVec<'s, u64, ClosedWindow>,
    make: impl Fn(u32) -> Allocator + 'static,
    stats: Rc<RefCell<AllocatorStats>>,
) -> StreamVec<'s, u64, NodeControl> {
    windows.unary(Pipeline, "Allocator", move |_cap, _info| {
        let mut allocators: BTreeMap<u32, Allocator> = BTreeMap::new();
        move |input, output| {
            input.for_each_stamp(|cap, data| {
                let cap = cap.retain_least(0).expect("windows come with a time");
                let mut session = output.session(&cap);
                let mut stats = stats.borrow_mut();
                let mut decided = Vec::new();
                for w in data.flat_map(|d| d.drain(..)) {
                    // A node's allocator is built once, at its first window:
                    // setup, not part of a decision.
                    let allocator = allocators.entry(w.node).or_insert_with(|| make(w.node));
                    let started = Instant::now();
                    let decides = allocator.decides(&w.stats);
                    let decision = allocator.decide(&w.stats);
                    if let Some(alpha) = decision {
                        session.give(NodeControl {
                            target: Target::Node(w.node),
                            seq: ALLOCATOR_SEQ,
                            command: NodeCommand::SetAlpha(alpha),
                        });
                    }
                    // The command is out: the log line is not decision time.
                    // A window too small to decide on is not a decision.
                    if decides {
                        stats.record(started.elapsed().as_secs_f64() * 1e6);
                        stats.decisions += 1;
                    }
                    stats.windows += 1;
                    if let Some(alpha) = decision {
                        stats.moves += 1;
                        // A no-op without a recorder (replay, bench).
                        metrics::counter!("grflow_alpha_moves_total", "node" => w.node.to_string())
                            .increment(1);
                        tracing::info!(
                            node = w.node,
                            window_start_ms = w.window_start_ms,
                            p99_ms = w.stats.p99_ms,
                            alpha,
                            "allocator moves alpha"
                        );
                    }
                    decided.push(w.node);
                }
                // Off the decision path, once every node of the batch has
                // its command: the adapters' updates (between two nodes'
                // decisions, one node's update would evict the shared
                // policy's weights from cache before the next decision) and
                // the training records.
                for node in decided {
                    let allocator = allocators.get_mut(&node).expect("decided above");
                    allocator.learn();
                    let steps = allocator.take_steps();
                    stats.steps.extend(steps.into_iter().map(|s| (node, s)));
                }
            });
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decision_p99_is_the_nearest_rank() {
        let mut stats = AllocatorStats::default();
        // 60 samples: rank ceil(0.99 × 60) = 60, the largest (rounding
        // (n − 1) × q picked the 59th).
        for us in 1..=60 {
            stats.record(us as f64);
        }
        let s = stats.summary(AllocatorPolicy::Pid);
        assert_eq!(s.decision_us_p99, 60.0);
        assert_eq!(s.decision_us_mean, 30.5);
    }
}
