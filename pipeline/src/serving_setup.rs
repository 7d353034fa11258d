//! What a worker of `replay` or `serve` needs to build its serving part
//! (router, node, allocator), in one place: both commands used to spell
//! out the same fifteen fields, and a new one had to be added twice.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Instant;

use grflow_operators::allocator::ppo::ActorCritic;
use grflow_operators::allocator::{Allocator, AllocatorPolicy, Learned};

use crate::config::{Config, Release, Speed};
use crate::dataflow::allocator::AllocatorStats;
use crate::dataflow::source::Pacing;
use crate::dataflow::{self, ServingParts};
use crate::job::{Job, NodeHandout};
use crate::side::SideTables;

/// Shared by every worker of a process (cheap to clone).
#[derive(Clone)]
pub struct ServingSetup {
    pub cfg: Config,
    pub side: Arc<SideTables>,
    nodes: NodeHandout,
    policy: Option<Arc<ActorCritic>>,
    pool_pages: usize,
    max_positions: usize,
}

impl std::fmt::Debug for ServingSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServingSetup")
            .field("nodes", &self.nodes)
            .field("pool_pages", &self.pool_pages)
            .finish_non_exhaustive()
    }
}

impl ServingSetup {
    pub fn of(job: &Job) -> Self {
        Self {
            cfg: job.cfg.clone(),
            side: job.side.clone(),
            nodes: job.nodes(),
            policy: job.allocator_policy.clone(),
            pool_pages: job.pool_pages,
            max_positions: job.max_positions,
        }
    }

    /// This process's nodes (a look at the first one before the workers start).
    pub fn nodes(&self) -> &NodeHandout {
        &self.nodes
    }

    /// The serving part of global worker `index` (its node is taken, so
    /// once per worker) under `release`: the config's SLO, windows, batching
    /// and allocator, and nothing that only one command sets (no deadline
    /// or age limit, no scheduled or live commands, no oracle; commands
    /// paced at full speed). `stats` receives what the allocator did.
    pub fn parts(
        &self,
        index: usize,
        peers: usize,
        release: Release,
        stats: Rc<RefCell<AllocatorStats>>,
    ) -> ServingParts {
        let cfg = &self.cfg;
        ServingParts {
            router: Job::router(cfg, peers),
            node: self.nodes.take(index),
            side: self.side.clone(),
            slo_ms: cfg.run.slo_ms,
            clock: cfg.run.clock,
            deadline: None,
            max_age: None,
            window_ms: cfg.windows.epoch_ms,
            release,
            batch: cfg.batch_policy(),
            token_capacity: cfg.node.token_capacity,
            commands: Vec::new(),
            command_pacing: Pacing {
                speed: Speed::Max,
                origin_ts_ms: 0,
                start: Instant::now(),
            },
            controller: allocator_controller(
                cfg,
                release,
                self.policy.clone(),
                self.pool_pages,
                self.max_positions,
                stats,
            ),
            live: None,
            models: None,
            oracle: None,
        }
    }
}

/// The allocator as the nodes' controller when α moves at runtime;
/// `policy` is the job's PPO policy (`ppo-only`, `smart`).
fn allocator_controller(
    cfg: &Config,
    release: Release,
    policy: Option<Arc<ActorCritic>>,
    pool_pages: usize,
    max_positions: usize,
    stats: Rc<RefCell<AllocatorStats>>,
) -> Option<dataflow::Controller> {
    if !cfg.allocator.moves() {
        return None;
    }
    let allocator = cfg.allocator.clone();
    let slo_ms = cfg.run.slo_ms.rank;
    // Where each node starts (`memory.node_alpha`), as the job built it.
    let start = cfg.clone();
    let alpha = move |node: u32| start.start_alpha(node as usize);
    let make = move |node: u32| {
        let made = match &policy {
            Some(p) if allocator.learned() => {
                Allocator::with_learned(allocator.clone(), slo_ms, alpha(node), {
                    let learned = Learned::new(
                        p.clone(),
                        max_positions,
                        slo_ms,
                        allocator.policy == AllocatorPolicy::Smart,
                        allocator.sample,
                        allocator.seed.wrapping_add(u64::from(node)),
                    );
                    // `complete` runs stay reproducible: updates at the
                    // epoch boundary, on the worker.
                    match release {
                        Release::Arrival => learned.train_off_path(),
                        Release::Complete => learned,
                    }
                })
            }
            _ => Allocator::new(allocator.clone(), slo_ms, alpha(node)),
        };
        made.with_pool_pages(pool_pages)
    };
    Some(Box::new(move |_events, windows| {
        dataflow::allocator::allocate(windows, make, stats)
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_controller_unless_alpha_moves() {
        let cfg = Config::default();
        assert!(!cfg.allocator.moves());
        let stats = Rc::default();
        assert!(allocator_controller(&cfg, Release::Complete, None, 64, 512, stats).is_none());
    }
}
