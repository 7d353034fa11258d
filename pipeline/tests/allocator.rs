//! The allocator moves α at runtime: each node's closed windows reach its
//! allocator, whose `SetAlpha` commands reach the node's control input
//! through the controller feedback edge. On the event clock with
//! `complete` release the α of every window is the same on every run.

use std::sync::Arc;

use grflow_operators::allocator::AllocatorPolicy;
use grflow_pipeline::replay::ResponseOutput;
use grflow_pipeline::{
    Clock, Config, ReleaseSetting, ReplayOptions, ReplayOutput, SloMs, TraceInput, replay,
};
use grflow_traces::{GenConfig, Regime, Trace};

fn trace() -> Arc<Trace> {
    Arc::new(grflow_traces::generate(&GenConfig {
        regime: Regime::Steady,
        users: 300,
        requests: 3_000,
        rps: 200.0,
        seed: 31,
        candidates: 16,
        ..GenConfig::default()
    }))
}

fn run(trace: &Arc<Trace>, policy: AllocatorPolicy, slo_ms: f64) -> ReplayOutput {
    run_edited(trace, policy, slo_ms, |_| {}).unwrap()
}

fn run_edited(
    trace: &Arc<Trace>,
    policy: AllocatorPolicy,
    slo_ms: f64,
    edit: impl FnOnce(&mut Config),
) -> Result<ReplayOutput, grflow_pipeline::replay::ReplayError> {
    replay(options(trace, policy, slo_ms, edit))
}

/// Two workers on the event clock, `complete` release, 1 s windows.
fn options(
    trace: &Arc<Trace>,
    policy: AllocatorPolicy,
    slo_ms: f64,
    edit: impl FnOnce(&mut Config),
) -> ReplayOptions {
    let mut cfg = Config::embedded();
    cfg.run.workers = 2;
    cfg.run.speed = "max".into();
    cfg.run.clock = Clock::Event;
    cfg.run.release = ReleaseSetting::Complete;
    cfg.run.slo_ms = SloMs::both(slo_ms);
    cfg.windows.epoch_ms = 1_000;
    cfg.allocator.policy = policy;
    cfg.allocator.min_requests = 5;
    edit(&mut cfg);
    ReplayOptions {
        responses: ResponseOutput::Drop,
        ..ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg)
    }
}

/// (node, window start, α) of every window.
fn alphas(o: &ReplayOutput) -> Vec<(u32, u64, f64)> {
    o.windows
        .iter()
        .map(|w| (w.node, w.window_start_ms, w.alpha))
        .collect()
}

#[test]
fn pid_moves_alpha_toward_kv_while_p99_is_over_the_slo_the_same_on_every_run() {
    let trace = trace();
    // An SLO no request meets: every window asks for more KV.
    let a = run(&trace, AllocatorPolicy::Pid, 0.001);
    let summary = a.summary.allocator.clone().expect("pid reports");
    assert!(summary.alpha_moves > 0, "{summary:?}");
    assert!(summary.windows >= summary.decisions);
    assert!(summary.decisions >= summary.alpha_moves);
    assert!(summary.decision_us_p99 > 0.0);
    assert_eq!(a.summary.responses_out, trace.requests.len() as u64);
    // Nodes that served (the event-time router may favour one).
    let mut checked = 0;
    for node in 0..2 {
        let per_node: Vec<f64> = alphas(&a)
            .into_iter()
            .filter(|w| w.0 == node)
            .map(|w| w.2)
            .collect();
        if per_node.len() < 5 {
            continue;
        }
        checked += 1;
        assert!(
            per_node.windows(2).all(|p| p[1] <= p[0] + 1e-9),
            "never back up: {per_node:?}"
        );
        let (first, last) = (per_node[0], *per_node.last().unwrap());
        assert!(
            (first - 0.25).abs() < 1e-9,
            "the first window ran at memory.alpha"
        );
        assert!(last < first - 0.1, "moved toward KV: {per_node:?}");
        assert!(last >= 0.1 - 1e-9, "floored at min_alpha: {per_node:?}");
        let node_alpha = a.summary.nodes[node as usize].alpha;
        assert!(node_alpha < first, "{node_alpha}");
    }
    assert!(checked >= 1, "{:?}", alphas(&a));
    let b = run(&trace, AllocatorPolicy::Pid, 0.001);
    assert_eq!(alphas(&a), alphas(&b), "the same α per window on every run");
}

#[test]
fn growing_the_emb_share_queues_refill_bounded_by_the_pages_that_moved() {
    let trace = trace();
    // An SLO every request meets: pid moves α toward EMB, which refills.
    let a = run(&trace, AllocatorPolicy::Pid, 1e6);
    let pool_bytes = Config::embedded().memory.pool_mib * 1024.0 * 1024.0;
    let max_step = Config::embedded().allocator.max_step;
    let mut refilled = 0;
    for n in &a.summary.nodes {
        if n.refill_bytes > 0 {
            refilled += 1;
            assert!(n.alpha_moves > 0, "{n:?}");
        }
        assert!(n.refill_bytes_max_per_move <= n.refill_bytes);
        // One move changes at most max_step of the pool (plus a page of
        // rounding), and refill only fills what moved.
        let bound = max_step * pool_bytes + 64.0 * 1024.0;
        assert!(
            (n.refill_bytes_max_per_move as f64) <= bound,
            "{} > {bound}",
            n.refill_bytes_max_per_move
        );
    }
    // A node that served more than a handful had rows to refill.
    assert!(refilled >= 1, "{:?}", a.summary.nodes);
}

#[test]
fn windows_too_small_to_decide_on_are_not_timed_as_decisions() {
    let trace = trace();
    let o = run_edited(&trace, AllocatorPolicy::Pid, 0.001, |c| {
        c.allocator.min_requests = u64::MAX;
    })
    .unwrap();
    let summary = o.summary.allocator.expect("pid reports");
    assert!(summary.windows > 0, "{summary:?}");
    assert_eq!(summary.decisions, 0, "{summary:?}");
    assert_eq!(summary.alpha_moves, 0, "{summary:?}");
    assert_eq!(summary.decision_us_mean, 0.0, "{summary:?}");
}

#[test]
fn an_operators_pin_holds_alpha_and_the_allocator_sends_nothing_meanwhile() {
    use grflow_operators::node::NodeCommand;
    use grflow_pipeline::events::{ScheduledCommand, Target};
    let trace = trace();
    let pin_ms = trace.requests[trace.requests.len() / 3].ts_ms;
    let opts = ReplayOptions {
        commands: vec![ScheduledCommand {
            at_ms: pin_ms,
            target: Target::All,
            command: NodeCommand::PinAlpha(Some(0.2)),
        }],
        ..options(&trace, AllocatorPolicy::Pid, 0.001, |_| {})
    };
    let o = replay(opts).unwrap();
    let summary = o.summary.allocator.clone().expect("pid reports");
    // Windows wholly after the pin run at 0.2 on every node, and none of
    // them got a decision: before, each sent a SetAlpha the node refused.
    let pinned: Vec<_> = alphas(&o)
        .into_iter()
        .filter(|w| w.1 > pin_ms + 1_000)
        .collect();
    assert!(pinned.len() >= 4, "{:?}", alphas(&o));
    for w in &pinned {
        assert!((w.2 - 0.2).abs() < 0.01, "held at the pin: {w:?}");
    }
    let windows_before = alphas(&o).iter().filter(|w| w.1 < pin_ms).count() as u64;
    assert!(
        summary.decisions <= windows_before,
        "decided while pinned: {summary:?}, {windows_before} windows before the pin"
    );
    assert!(summary.alpha_moves > 0, "moved before the pin: {summary:?}");
    assert!(summary.windows > windows_before + 4, "{summary:?}");
}

#[test]
fn static_leaves_alpha_and_kv_opt_starts_at_zero() {
    let trace = trace();
    let s = run(&trace, AllocatorPolicy::Static, 0.001);
    assert!(s.summary.allocator.is_none());
    assert!(alphas(&s).len() >= 5);
    assert!(alphas(&s).iter().all(|w| (w.2 - 0.25).abs() < 1e-9));
    let k = run(&trace, AllocatorPolicy::KvOpt, 0.001);
    assert!(alphas(&k).len() >= 5);
    assert!(alphas(&k).iter().all(|w| w.2.abs() < 1e-9));
}

#[test]
fn node_alpha_starts_each_node_at_its_own_share_and_its_controller_there() {
    let trace = trace();
    let split = |c: &mut Config| c.memory.node_alpha = Some(vec![0.1, 0.8]);
    // The pool moves whole pages, so α lands within a page of the setting.
    let near = |a: f64, b: f64| (a - b).abs() < 0.01;
    let s = run_edited(&trace, AllocatorPolicy::Static, 0.001, split).unwrap();
    for (node, want) in [(0u32, 0.1), (1, 0.8)] {
        let per_node: Vec<f64> = alphas(&s)
            .into_iter()
            .filter(|w| w.0 == node)
            .map(|w| w.2)
            .collect();
        assert!(!per_node.is_empty(), "node {node} served");
        assert!(
            per_node.iter().all(|&a| near(a, want)),
            "node {node}: {per_node:?}"
        );
        assert!(near(s.summary.nodes[node as usize].alpha, want));
    }
    // pid under an SLO every request meets moves node 0 (which serves most
    // here) up from its own α, not from memory.alpha.
    let p = run_edited(&trace, AllocatorPolicy::Pid, 1e6, split).unwrap();
    let first_of = |node: u32| alphas(&p).into_iter().find(|w| w.0 == node).map(|w| w.2);
    assert!(near(first_of(0).unwrap(), 0.1), "{:?}", alphas(&p));
    assert!(near(first_of(1).unwrap(), 0.8), "{:?}", alphas(&p));
    assert!(
        p.summary.nodes[0].alpha > 0.1 + 0.05,
        "{:?}",
        p.summary.nodes[0]
    );
    // One value per node of the job, or the job does not start.
    let err = run_edited(&trace, AllocatorPolicy::Static, 0.001, |c| {
        c.memory.node_alpha = Some(vec![0.1, 0.8, 0.5]);
    })
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("memory.node_alpha") && err.contains("3 values for 2 nodes"),
        "{err}"
    );
}

/// A policy taught (by PPO updates on made-up decisions) that moving α by
/// −0.06 pays and everything else does not.
fn down_policy(path: &std::path::Path) {
    use grflow_operators::allocator::ppo::{ActorCritic, PpoConfig, Step};
    let mut p = ActorCritic::new(5);
    let cfg = PpoConfig {
        learning_rate: 3e-3,
        ..PpoConfig::default()
    };
    for i in 0..30 {
        let mut t = Vec::new();
        for k in 0..64 {
            let action = k % 7;
            let state = [0.2, 0.5, 0.5, 0.1, 0.2, (k % 9) as f64 / 10.0, 0.5];
            t.push(Step {
                state,
                action,
                logp: p.probs(&state, true)[action].ln(),
                value: p.value(&state),
                reward: if action == 0 { 1.0 } else { 0.0 },
                allow_up: true,
            });
        }
        p.update(&[t], &cfg, i);
    }
    std::fs::write(path, p.to_safetensors()).unwrap();
}

#[test]
fn learned_policies_move_alpha_from_a_policy_file_the_same_on_every_run() {
    let trace = trace();
    let dir = std::env::temp_dir().join(format!("grflow-alloc-policy-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("down.safetensors");
    down_policy(&file);
    let run_with = |policy| {
        let mut cfg = Config::embedded();
        cfg.run.workers = 2;
        cfg.run.speed = "max".into();
        cfg.run.clock = Clock::Event;
        cfg.run.release = ReleaseSetting::Complete;
        cfg.windows.epoch_ms = 1_000;
        cfg.memory.alpha = 0.8;
        cfg.allocator.policy = policy;
        cfg.allocator.min_requests = 5;
        cfg.allocator.policy_file = file.display().to_string();
        replay(ReplayOptions {
            responses: ResponseOutput::Drop,
            ..ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg)
        })
        .unwrap()
    };
    for policy in [AllocatorPolicy::PpoOnly, AllocatorPolicy::Smart] {
        let a = run_with(policy);
        let s = a
            .summary
            .allocator
            .clone()
            .expect("learned policies report");
        assert!(s.alpha_moves > 0, "{policy:?}: {s:?}");
        // The policy moves toward KV: α ends at the lower bound.
        let last = a.windows.iter().map(|w| w.alpha).fold(1.0, f64::min);
        assert!(last < 0.5, "{policy:?}: lowest window alpha {last}");
        assert_eq!(alphas(&a), alphas(&run_with(policy)), "{policy:?}");
        assert!(a.allocator_steps.is_empty(), "recorded only when training");
    }
    // A missing policy file is refused by name before the job starts.
    let mut cfg = Config::embedded();
    cfg.allocator.policy = AllocatorPolicy::PpoOnly;
    cfg.allocator.policy_file = dir.join("absent.safetensors").display().to_string();
    let err = replay(ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg))
        .expect_err("no policy, no job");
    assert!(err.to_string().contains("allocator.policy_file"), "{err}");
    // The policy as a config spells it, not as Rust debug-prints it.
    assert!(
        err.to_string().contains("allocator.policy \"ppo-only\""),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_shipped_policy_loads_with_its_provenance() {
    use grflow_operators::allocator::mdp::ACTIONS;
    use grflow_operators::allocator::ppo::ActorCritic;
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../configs/allocator-ppo.safetensors"
    );
    let p = ActorCritic::from_safetensors(&std::fs::read(path).unwrap()).unwrap();
    assert!(p.parameters() < 25_000);
    let made = &p.provenance.trained_with;
    assert!(made.starts_with("grflow train-allocator"), "{made}");
    assert!(made.contains("SLO 6.5 ms"), "{made}");
    assert_eq!(p.provenance.slo_ms, Some(6.5));
    // Trained where less EMB is better: from a high α with a p99 over the
    // SLO it moves toward KV.
    let state = [0.3, 0.4, 0.8, 0.2, 0.3, 0.8, 0.9];
    assert!(ACTIONS[p.greedy(&state, true)] < 0.0);
}

/// A fixed cost model (no calibration in tests): 0.05 ms per new token
/// of prefill and 0.01 per cached one, 0.5 ms to rank, 2 ms of beam search.
fn cost() -> grflow_kernels::cost::CostModel {
    grflow_kernels::cost::CostModel {
        prefill_ms: [0.1, 0.05, 0.01],
        rank_ms: [0.5, 0.0, 0.0],
        beam_ms: [2.0, 0.0],
        ..grflow_kernels::cost::CostModel::given("small", 32, 32)
    }
}

fn oracle_run(trace: &Arc<Trace>, edit: impl FnOnce(&mut Config)) -> Result<ReplayOutput, String> {
    oracle_run_commanded(trace, Vec::new(), edit)
}

/// [`oracle_run`] with `commands` scheduled for the nodes.
fn oracle_run_commanded(
    trace: &Arc<Trace>,
    commands: Vec<grflow_pipeline::events::ScheduledCommand>,
    edit: impl FnOnce(&mut Config),
) -> Result<ReplayOutput, String> {
    let mut cfg = Config::embedded();
    cfg.run.workers = 2;
    cfg.run.speed = "max".into();
    cfg.run.clock = Clock::Virtual;
    cfg.run.release = ReleaseSetting::Complete;
    cfg.run.slo_ms = SloMs::both(0.001);
    cfg.windows.epoch_ms = 1_000;
    cfg.allocator.policy = AllocatorPolicy::Pid;
    cfg.allocator.min_requests = 5;
    cfg.cost.model = Some(cost());
    edit(&mut cfg);
    let opts = ReplayOptions {
        oracle_step: Some(0.1),
        commands,
        ..ReplayOptions::new(TraceInput::Memory(trace.clone()), cfg)
    };
    replay(opts).map_err(|e| e.to_string())
}

#[test]
fn the_oracle_replays_each_epoch_of_a_run_and_reproduces_its_p99_at_the_runs_alpha() {
    let trace = trace();
    let out = oracle_run(&trace, |_| {}).unwrap();
    assert!(out.oracle.len() >= 10, "{} epochs", out.oracle.len());
    let served: u64 = out.oracle.iter().map(|e| e.requests).sum();
    assert_eq!(served, trace.requests.len() as u64);
    for e in &out.oracle {
        // The copy of the node at the epoch's start, replaying the run's
        // own α moves, is the run (through the dataflow, command timing
        // included).
        assert_eq!(e.p99_at_alpha_ms, e.run_p99_ms, "{e:?}");
        assert!((0.0..=1.0).contains(&e.alpha_star), "{e:?}");
        assert!(e.p99_at_star_ms > 0.0, "{e:?}");
    }
    // pid moved α (the SLO is never met), so the run's α varies by epoch.
    assert!(out.oracle.iter().any(|e| (e.alpha - 0.25).abs() > 0.01));
    // Epochs are ordered by node, then time.
    assert!(
        out.oracle
            .windows(2)
            .all(|w| (w[0].node, w[0].epoch_start_ms) < (w[1].node, w[1].epoch_start_ms))
    );
}

/// α first shrinks (evicting EMB rows), then grows at the epoch's second
/// millisecond, 300 ms ahead of the epoch's first batch: the refill of the
/// evicted rows runs on the idle link from the command on, in the run and
/// in the replay (which moves α at the command's time, not at the first
/// batch). On a slow link the refill takes long enough for every request
/// of that epoch (the trace keeps its first 30 ms after the quiet spell:
/// its P99 is their maximum) to notice when it started, and a cheaper
/// prefill keeps the node out of saturation, where a request's wait in the
/// queue would hide its link time.
#[test]
fn the_oracle_reproduces_a_run_whose_commands_grow_alpha_before_the_first_batch() {
    use grflow_operators::node::NodeCommand;
    use grflow_pipeline::events::{ScheduledCommand, Target};
    let mut trace = (*trace()).clone();
    trace
        .requests
        .retain(|r| !(7_000..7_300).contains(&r.ts_ms) && !(7_330..8_000).contains(&r.ts_ms));
    let trace = Arc::new(trace);
    let at = |at_ms, command| ScheduledCommand {
        at_ms,
        target: Target::All,
        command,
    };
    let commands = vec![
        at(4_001, NodeCommand::SetAlpha(0.05)),
        at(7_001, NodeCommand::SetAlpha(0.7)),
        at(10_001, NodeCommand::PinAlpha(Some(0.9))),
    ];
    let out = oracle_run_commanded(&trace, commands, |c| {
        c.allocator.policy = AllocatorPolicy::Static;
        c.link.bandwidth_gbps = 1.0;
        c.link.refill_share = 0.01;
        c.cost.model = Some(grflow_kernels::cost::CostModel {
            prefill_ms: [0.1, 0.005, 0.0],
            ..cost()
        });
    })
    .unwrap();
    let served: u64 = out.oracle.iter().map(|e| e.requests).sum();
    assert_eq!(served, trace.requests.len() as u64);
    for e in &out.oracle {
        assert_eq!(e.p99_at_alpha_ms, e.run_p99_ms, "{e:?}");
    }
    // The epochs of the moves were served at the moved α (the router may
    // keep every request on one node).
    for (start, alpha) in [(4_000, 0.05), (7_000, 0.7), (10_000, 0.9)] {
        let epochs: Vec<_> = out
            .oracle
            .iter()
            .filter(|e| e.epoch_start_ms == start)
            .collect();
        assert!(!epochs.is_empty(), "{start}: {:?}", out.oracle);
        for e in epochs {
            assert!((e.alpha - alpha).abs() < 0.01, "{e:?}");
        }
    }
}

#[test]
fn the_oracle_refuses_a_nondeterministic_node_by_name() {
    let trace = trace();
    let e = oracle_run(&trace, |c| c.run.clock = Clock::Event).unwrap_err();
    assert!(e.contains("run.clock = \"virtual\""), "{e}");
    let e = oracle_run(&trace, |c| c.memory.user_kv_policy = "laru".into()).unwrap_err();
    assert!(e.contains("memory.user_kv_policy = \"laru\""), "{e}");
}
