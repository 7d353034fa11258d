//! KV-EMB-aware request routing (HLEM §IV-C, Alg. 1, Eq. 9).
//!
//! A router replica owns the users hashed to it (affinity, shard profile,
//! hotness) and keeps a replicated view of every node's KV residency (users),
//! EMB residency (shards) and load, fed by node reports that arrive through
//! the event-time feedback edge. Given the same reports in the same order it
//! makes the same decisions: no clocks, no hash-map iteration order, ties to
//! the lowest node index (under the `InFlight` load signal of `arrival`
//! release, to the first node from the replica's own, so that replicas
//! with nothing to tell nodes apart spread their requests).
//!
//! Per-user state is bounded: at most `max_users` affinity entries per
//! replica (the least recently routed user is dropped first; a dropped user
//! just loses the affinity bonus once), so months of traffic fit a fixed
//! table.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashSet};

use crate::hotness::HotUsers;
use crate::lru::LruMap;
use crate::shards::ShardId;

/// Router parameters; defaults are the paper's (τ = 0.85, ε = 0.05, K = 20).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RouterConfig {
    /// Cost of a KV miss (recomputing the user's prefix), e.g. in ms.
    pub miss_cost_kv: f64,
    /// Cost of an embedding miss (H2D fetch of the user's rows).
    pub miss_cost_emb: f64,
    /// Marginal queueing cost of a loaded node.
    pub miss_cost_load: f64,
    /// τ: if the best node's load exceeds this, fall back to the least-loaded node.
    pub overload_threshold: f64,
    /// ε: bonus for the user's previous (affinity) node.
    pub affinity_bonus: f64,
    /// K: hot shards per user profile.
    pub profile_shards: usize,
    /// Affinity entries (user → last node) per replica at most.
    pub max_users: usize,
}

impl Default for RouterConfig {
    fn default() -> Self {
        Self {
            miss_cost_kv: 4.0,
            miss_cost_emb: 2.0,
            miss_cost_load: 4.0,
            overload_threshold: 0.85,
            affinity_bonus: 0.05,
            profile_shards: 20,
            max_users: 100_000,
        }
    }
}

/// Why a routing config is unusable.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum RouterConfigError {
    #[error("router.{field} must be a finite number >= 0 (got {value})")]
    Negative { field: &'static str, value: f64 },
    #[error("router: miss_cost_kv + miss_cost_emb + miss_cost_load must be > 0")]
    ZeroCosts,
    #[error("router.profile_shards must be >= 1")]
    EmptyProfile,
    #[error("router.max_users must be >= 1")]
    NoUsers,
    #[error(
        "router.overload_threshold must be < 1 (got {0}): the load is capped at 1, so the \
         overload fallback would never run"
    )]
    OverloadThreshold(f64),
}

impl RouterConfig {
    pub fn validate(&self) -> Result<(), RouterConfigError> {
        for (field, value) in [
            ("miss_cost_kv", self.miss_cost_kv),
            ("miss_cost_emb", self.miss_cost_emb),
            ("miss_cost_load", self.miss_cost_load),
            ("overload_threshold", self.overload_threshold),
            ("affinity_bonus", self.affinity_bonus),
        ] {
            if !value.is_finite() || value < 0.0 {
                return Err(RouterConfigError::Negative { field, value });
            }
        }
        // The load l(n) is capped at 1: at τ >= 1 no node is ever over it
        // and the fallback never runs, however deep a node's queue.
        if self.overload_threshold >= 1.0 {
            return Err(RouterConfigError::OverloadThreshold(
                self.overload_threshold,
            ));
        }
        if self.miss_cost_kv + self.miss_cost_emb + self.miss_cost_load <= 0.0 {
            return Err(RouterConfigError::ZeroCosts);
        }
        if self.profile_shards == 0 {
            return Err(RouterConfigError::EmptyProfile);
        }
        if self.max_users == 0 {
            return Err(RouterConfigError::NoUsers);
        }
        Ok(())
    }

    /// w_i = C_i / Z (Eq. 9 weights), in the order (kv, emb, load).
    pub fn weights(&self) -> (f64, f64, f64) {
        let z = self.miss_cost_kv + self.miss_cost_emb + self.miss_cost_load;
        (
            self.miss_cost_kv / z,
            self.miss_cost_emb / z,
            self.miss_cost_load / z,
        )
    }
}

/// What a node tells every router replica after an event-time tick: changes
/// of its residency since its previous report and its current load.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeReport {
    pub node: u32,
    /// The node's count of reports made, from 1. Reports are changes since
    /// the node's previous one, so a replica applies them in this order:
    /// under `arrival` release a node's steps can report at event times
    /// that go backwards, and timely hands a replica its waiting control
    /// messages sorted by time. 0 (a report built by hand) applies at once.
    #[serde(default)]
    pub seq: u64,
    /// Users whose history prefix KV became resident on the node.
    pub kv_users_added: Vec<u64>,
    /// Users whose prefix KV left the node.
    pub kv_users_removed: Vec<u64>,
    pub shards_added: Vec<ShardId>,
    pub shards_removed: Vec<ShardId>,
    /// Event time (ms) the backlog below was measured at.
    pub at_ms: u64,
    /// In-flight tokens on the node (event-time backlog) at `at_ms`.
    pub inflight_tokens: f64,
    /// Token capacity the load is normalised by.
    pub token_capacity: f64,
    /// Tokens the node serves per ms of event time, so a replica can let the
    /// backlog drain between reports exactly as the node does.
    pub service_tokens_per_ms: f64,
    /// Tokens of the requests the node has finished (served, failed or
    /// shed) since it started, by the router replica that routed them:
    /// [`LoadSignal::InFlight`] subtracts them from what a replica sent.
    #[serde(default)]
    pub completed_tokens: Vec<f64>,
    /// Tokens waiting in the node's queue when it reported, by the router
    /// replica that sent them (`arrival` mode; empty otherwise): a replica
    /// adds the other replicas' share to its own work in flight.
    #[serde(default)]
    pub queued_tokens: Vec<f64>,
}

/// What l(n) measures.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum LoadSignal {
    /// The node's event-time backlog drained at its service rate: the same
    /// on every run (`complete` release, `--clock event`).
    #[default]
    EventBacklog,
    /// Work sent and not yet finished, as replica `replica` of `replicas`
    /// sees it: the tokens it routed to the node minus those the node
    /// reported finished, plus what the node last reported queued from the
    /// other replicas (before a node's first report with a queue, its own
    /// share scaled by the replica count: every replica routes a like share
    /// of the users). Real queues on real time (`arrival`
    /// release): an event-time model drains at a made-up rate, and at
    /// `--speed max` it let one node take nearly every request. Normalised
    /// by `token_capacity` (`node.token_capacity`), known before any report
    /// so that the first burst is spread too.
    InFlight {
        replica: usize,
        replicas: usize,
        token_capacity: f64,
    },
}

/// The router's replicated view of one node.
#[derive(Clone, Debug, Default)]
struct NodeView {
    kv_users: HashSet<u64>,
    emb_shards: HashSet<ShardId>,
    /// Backlog at `backlog_at_ms`: the node's last report plus what this
    /// replica dispatched since (the report does not include those yet, and
    /// ignoring them would send a whole tick's burst to one node).
    backlog_tokens: f64,
    backlog_at_ms: u64,
    service_tokens_per_ms: f64,
    token_capacity: f64,
    /// Tokens this replica routed to the node, ever.
    sent_tokens: f64,
    /// Of those, the tokens the node reported finished.
    finished_tokens: f64,
    /// Tokens queued at the node from the other replicas, at its last
    /// report that said (`InFlight`).
    others_queued: Option<f64>,
    /// The `seq` of the last report applied.
    applied_seq: u64,
    /// Reports that arrived before one the node made earlier, by `seq`.
    early: BTreeMap<u64, NodeReport>,
}

/// Reports held for an earlier one at most: a channel delivers a node's
/// reports in order, so a gap closes within one activation; a longer one is
/// a report lost, and waiting for it would stop the view for good.
const MAX_EARLY_REPORTS: usize = 1_024;

impl NodeView {
    fn backlog(&self, now_ms: u64) -> f64 {
        let drained = self.service_tokens_per_ms * now_ms.saturating_sub(self.backlog_at_ms) as f64;
        (self.backlog_tokens - drained).max(0.0)
    }

    /// Queued work over capacity, not clamped (1.0 = at capacity).
    fn pressure(&self, signal: LoadSignal, now_ms: u64) -> f64 {
        let (queued, capacity) = match signal {
            LoadSignal::EventBacklog => (self.backlog(now_ms), self.token_capacity),
            LoadSignal::InFlight {
                replicas,
                token_capacity,
                ..
            } => {
                let own = (self.sent_tokens - self.finished_tokens).max(0.0);
                let queued = match self.others_queued {
                    Some(others) => own + others,
                    None => own * replicas as f64,
                };
                (queued, token_capacity)
            }
        };
        if capacity <= 0.0 {
            return 0.0;
        }
        queued / capacity
    }

    fn load(&self, signal: LoadSignal, now_ms: u64) -> f64 {
        self.pressure(signal, now_ms).clamp(0.0, 1.0)
    }

    fn dispatch(&mut self, now_ms: u64, tokens: f64) {
        self.backlog_tokens = self.backlog(now_ms) + tokens;
        self.backlog_at_ms = self.backlog_at_ms.max(now_ms);
        self.sent_tokens += tokens;
    }
}

/// One routing decision and why it was made.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    pub node: u32,
    /// The chosen node already held the user's prefix KV.
    pub kv_hit: bool,
    /// The affinity bonus changed the winner.
    pub affinity_win: bool,
    /// The best node was above τ and the least-loaded node was taken instead.
    pub overload_fallback: bool,
    /// h_emb of the chosen node.
    pub emb_coverage: f64,
    /// The user is hot (top share by recent requests) at decision time.
    pub hot_user: bool,
}

/// Counters over all decisions of a replica.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RouterStats {
    pub decisions: u64,
    pub kv_hits: u64,
    pub affinity_wins: u64,
    pub overload_fallbacks: u64,
    /// Affinity entries dropped because the table was full (router.max_users).
    #[serde(default)]
    pub affinity_evictions: u64,
    /// The most affinity entries one replica ever held.
    #[serde(default)]
    pub affinity_users_peak: u64,
    /// Hot-user counters dropped because the table was full (hotness.max_users).
    #[serde(default)]
    pub hotness_evictions: u64,
    /// The most users with hot-user counters one replica ever held.
    #[serde(default)]
    pub hotness_users_peak: u64,
}

impl RouterStats {
    /// Counters add up; peaks are per replica, so the merge keeps the largest.
    pub fn merge(&mut self, other: &RouterStats) {
        self.decisions += other.decisions;
        self.kv_hits += other.kv_hits;
        self.affinity_wins += other.affinity_wins;
        self.overload_fallbacks += other.overload_fallbacks;
        self.affinity_evictions += other.affinity_evictions;
        self.affinity_users_peak = self.affinity_users_peak.max(other.affinity_users_peak);
        self.hotness_evictions += other.hotness_evictions;
        self.hotness_users_peak = self.hotness_users_peak.max(other.hotness_users_peak);
    }
}

/// One router replica (Alg. 1).
#[derive(Debug)]
pub struct Router {
    cfg: RouterConfig,
    weights: (f64, f64, f64),
    nodes: Vec<NodeView>,
    affinity: LruMap<u32>,
    hot: HotUsers,
    stats: RouterStats,
    signal: LoadSignal,
}

impl Router {
    pub fn new(cfg: RouterConfig, nodes: usize, hot: HotUsers) -> Result<Self, RouterConfigError> {
        cfg.validate()?;
        Ok(Self {
            affinity: LruMap::new(cfg.max_users),
            weights: cfg.weights(),
            cfg,
            nodes: vec![NodeView::default(); nodes],

            hot,
            stats: RouterStats::default(),
            signal: LoadSignal::default(),
        })
    }

    /// Chooses what l(n) measures (the event-time backlog by default).
    pub fn set_load_signal(&mut self, signal: LoadSignal) {
        self.signal = signal;
    }

    /// The configured capacity of every node that has not reported yet:
    /// without it the first tick's burst saw every node at load 0 and all
    /// of it went to one node.
    pub fn seed_token_capacity(&mut self, token_capacity: f64) {
        for view in self.nodes.iter_mut().filter(|v| v.token_capacity == 0.0) {
            view.token_capacity = token_capacity;
        }
    }

    pub fn config(&self) -> &RouterConfig {
        &self.cfg
    }

    pub fn stats(&self) -> &RouterStats {
        &self.stats
    }

    /// Users with an affinity entry now (at most `max_users`).
    pub fn affinity_users(&self) -> usize {
        self.affinity.len()
    }

    /// Users with hot-user counters now (at most `hotness.max_users`).
    pub fn hotness_users(&self) -> usize {
        self.hot.tracked_users()
    }

    /// Load l(n) at event time `now_ms` as this replica sees it.
    pub fn load(&self, node: u32, now_ms: u64) -> f64 {
        self.nodes[node as usize].load(self.signal, now_ms)
    }

    /// Whether the replica believes `node` holds `user`'s prefix KV.
    pub fn has_kv(&self, node: u32, user: u64) -> bool {
        self.nodes[node as usize].kv_users.contains(&user)
    }

    /// Folds a node's report into the replicated view, in the order the
    /// node made its reports (see [`NodeReport::seq`]).
    pub fn apply_report(&mut self, report: &NodeReport) {
        let Some(view) = self.nodes.get_mut(report.node as usize) else {
            return;
        };
        if report.seq == 0 {
            return self.apply_now(report);
        }
        if report.seq <= view.applied_seq {
            return; // seen already
        }
        view.early.insert(report.seq, report.clone());
        loop {
            let view = &mut self.nodes[report.node as usize];
            let next = match view.early.first_key_value() {
                Some((&seq, _)) if seq == view.applied_seq + 1 => seq,
                Some((&seq, _)) if view.early.len() > MAX_EARLY_REPORTS => seq,
                _ => return,
            };
            let held = view.early.remove(&next).expect("first key");
            view.applied_seq = next;
            self.apply_now(&held);
        }
    }

    fn apply_now(&mut self, report: &NodeReport) {
        let Some(view) = self.nodes.get_mut(report.node as usize) else {
            return;
        };
        for u in &report.kv_users_removed {
            view.kv_users.remove(u);
        }
        view.kv_users.extend(report.kv_users_added.iter().copied());
        for s in &report.shards_removed {
            view.emb_shards.remove(s);
        }
        view.emb_shards.extend(report.shards_added.iter().copied());
        view.backlog_tokens = report.inflight_tokens;
        view.backlog_at_ms = report.at_ms;
        view.token_capacity = report.token_capacity;
        view.service_tokens_per_ms = report.service_tokens_per_ms;
        if let LoadSignal::InFlight { replica, .. } = self.signal {
            // Reports may overtake each other: finished work only grows.
            let finished = report.completed_tokens.get(replica).copied().unwrap_or(0.0);
            view.finished_tokens = view.finished_tokens.max(finished);
            // An empty list is an empty queue (the node sends one entry per
            // replica that has tokens queued): ignoring it kept the last
            // queue's tokens as phantom load once the queue had drained.
            let others = report
                .queued_tokens
                .iter()
                .enumerate()
                .filter(|&(r, _)| r != replica)
                .map(|(_, t)| t)
                .sum();
            view.others_queued = Some(others);
        }
    }

    /// Routes one request of `user` at event time `ts_ms` whose user profile
    /// (top-K hot shards) is `profile` and which brings `tokens` of work.
    pub fn route(&mut self, ts_ms: u64, user: u64, profile: &[ShardId], tokens: f64) -> Decision {
        let hot_user = self.hot.observe(ts_ms, user);
        let (w_kv, w_emb, w_ld) = self.weights;
        let n_aff = self.affinity.get(user).copied();

        let mut best: Option<(u32, f64)> = None;
        let mut best_without_bonus: Option<(u32, f64)> = None;
        // Ties go to the first node visited (see `scan_order`).
        for n in self.scan_order() {
            let view = &self.nodes[n];
            let n = n as u32;
            let h_kv = if view.kv_users.contains(&user) {
                1.0
            } else {
                0.0
            };
            let h_emb = coverage(profile, &view.emb_shards);
            let base = w_kv * h_kv + w_emb * h_emb + w_ld * (1.0 - view.load(self.signal, ts_ms));
            let bonus = if Some(n) == n_aff {
                self.cfg.affinity_bonus
            } else {
                0.0
            };
            // Strict `>` keeps ties on the lowest node index.
            if best.is_none_or(|(_, s)| base + bonus > s) {
                best = Some((n, base + bonus));
            }
            if best_without_bonus.is_none_or(|(_, s)| base > s) {
                best_without_bonus = Some((n, base));
            }
        }
        let (mut chosen, _) = best.expect("router has at least one node");
        let affinity_win = Some(chosen) == n_aff && best_without_bonus.map(|b| b.0) != n_aff;

        let mut overload_fallback = false;
        if self.load(chosen, ts_ms) > self.cfg.overload_threshold {
            let least = self.least_loaded(ts_ms);
            overload_fallback = least != chosen;
            chosen = least;
        }

        let view = &mut self.nodes[chosen as usize];
        let kv_hit = view.kv_users.contains(&user);
        let emb_coverage = coverage(profile, &view.emb_shards);
        view.dispatch(ts_ms, tokens);
        self.affinity.insert(user, chosen);

        self.stats.decisions += 1;
        self.stats.affinity_evictions = self.affinity.evictions();
        self.stats.affinity_users_peak = self.affinity.peak_len() as u64;
        self.stats.hotness_evictions = self.hot.evictions();
        self.stats.hotness_users_peak = self.hot.tracked_users_peak() as u64;
        self.stats.kv_hits += kv_hit as u64;
        self.stats.affinity_wins += (affinity_win && !overload_fallback) as u64;
        self.stats.overload_fallbacks += overload_fallback as u64;
        Decision {
            node: chosen,
            kv_hit,
            affinity_win: affinity_win && !overload_fallback,
            overload_fallback,
            emb_coverage,
            hot_user,
        }
    }

    /// The order nodes are compared in, so where ties go: from node 0 on
    /// event time, as always; on real time (`InFlight`) replica r starts
    /// at node r, since a replica sees only the work it sent itself, so
    /// equal loads are common (all zero when traffic is light), and ties
    /// at node 0 for every replica sent most of that traffic to one node.
    fn scan_order(&self) -> impl Iterator<Item = usize> + use<> {
        let count = self.nodes.len();
        let home = match self.signal {
            LoadSignal::InFlight { replica, .. } => replica % count,
            LoadSignal::EventBacklog => 0,
        };
        (0..count).map(move |i| (home + i) % count)
    }

    /// The node with the least queued work; unclamped, so that among nodes
    /// all past capacity the least overloaded one is taken, not node 0.
    fn least_loaded(&self, now_ms: u64) -> u32 {
        let pressure = |n: usize| self.nodes[n].pressure(self.signal, now_ms);
        let mut order = self.scan_order();
        let mut least = order.next().expect("router has at least one node");
        for n in order {
            if pressure(n) < pressure(least) {
                least = n;
            }
        }
        least as u32
    }
}

/// h_emb: the fraction of the profile's shards resident on a node.
fn coverage(profile: &[ShardId], resident: &HashSet<ShardId>) -> f64 {
    if profile.is_empty() {
        return 0.0;
    }
    let hits = profile.iter().filter(|s| resident.contains(s)).count();
    hits as f64 / profile.len() as f64
}

/// Prof\[u\]: the K shards a history touches most (ties to the lower shard id).
/// Counted by sorting: a history touches a few hundred shards, and a sort
/// of them beats hashing each (this runs on every routed request).
pub fn shard_profile(shards_touched: impl IntoIterator<Item = ShardId>, k: usize) -> Vec<ShardId> {
    let mut touched: Vec<ShardId> = shards_touched.into_iter().collect();
    touched.sort_unstable();
    let mut ranked: Vec<(u32, ShardId)> = Vec::new();
    for run in touched.chunk_by(|a, b| a == b) {
        ranked.push((run.len() as u32, run[0]));
    }
    ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    let mut top: Vec<ShardId> = ranked.into_iter().take(k).map(|(_, s)| s).collect();
    top.sort_unstable();
    top
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_overload_threshold_the_capped_load_cannot_pass_is_refused() {
        for tau in [1.0, 2.5] {
            let cfg = RouterConfig {
                overload_threshold: tau,
                ..Default::default()
            };
            assert!(
                matches!(cfg.validate(), Err(RouterConfigError::OverloadThreshold(t)) if t == tau),
                "{tau}"
            );
        }
        let ok = RouterConfig {
            overload_threshold: 0.99,
            ..Default::default()
        };
        assert!(ok.validate().is_ok());
    }
    use crate::hotness::HotnessConfig;

    fn router(nodes: usize) -> Router {
        Router::new(
            RouterConfig::default(),
            nodes,
            HotUsers::new(HotnessConfig::default()),
        )
        .unwrap()
    }

    #[test]
    fn a_nodes_reports_apply_in_the_order_it_made_them() {
        // Report 1 adds user 7 (stamped 101), report 2 removes it (stamped
        // 91, a later step of older requests): timely hands over 2 first.
        let added = NodeReport {
            node: 1,
            seq: 1,
            at_ms: 101,
            kv_users_added: vec![7],
            ..Default::default()
        };
        let removed = NodeReport {
            node: 1,
            seq: 2,
            at_ms: 91,
            kv_users_removed: vec![7],
            ..Default::default()
        };
        let mut r = router(2);
        r.apply_report(&removed);
        assert!(!r.has_kv(1, 7), "held until report 1 arrives");
        r.apply_report(&added);
        assert!(!r.has_kv(1, 7), "added, then removed: not resident");
        // A report seen again changes nothing.
        r.apply_report(&added);
        assert!(!r.has_kv(1, 7));
        // In order, as before.
        let mut r = router(2);
        r.apply_report(&added);
        assert!(r.has_kv(1, 7));
        r.apply_report(&removed);
        assert!(!r.has_kv(1, 7));
    }

    #[test]
    fn a_lost_report_does_not_stop_the_view_for_good() {
        let mut r = router(1);
        // Report 1 never arrives.
        for seq in 2..=(MAX_EARLY_REPORTS as u64 + 2) {
            r.apply_report(&NodeReport {
                node: 0,
                seq,
                kv_users_added: vec![seq],
                ..Default::default()
            });
        }
        assert!(r.has_kv(0, 2) && r.has_kv(0, MAX_EARLY_REPORTS as u64 + 2));
    }

    /// A router on real time: replica `replica` of `replicas`, loads over
    /// 1,000 tokens of capacity.
    fn in_flight_router(nodes: usize, replica: usize, replicas: usize) -> Router {
        let mut r = router(nodes);
        r.set_load_signal(LoadSignal::InFlight {
            replica,
            replicas,
            token_capacity: 1000.0,
        });
        r
    }

    fn report(node: u32, kv: &[u64], shards: &[ShardId], tokens: f64) -> NodeReport {
        NodeReport {
            node,
            kv_users_added: kv.to_vec(),
            shards_added: shards.to_vec(),
            inflight_tokens: tokens,
            token_capacity: 1000.0,
            service_tokens_per_ms: 10.0,
            ..Default::default()
        }
    }

    #[test]
    fn weights_are_normalised_miss_costs() {
        let (a, b, c) = RouterConfig::default().weights();
        assert!((a + b + c - 1.0).abs() < 1e-12);
        assert!((a - 0.4).abs() < 1e-12 && (b - 0.2).abs() < 1e-12);
    }

    #[test]
    fn kv_hit_wins_over_emb_coverage() {
        let mut r = router(3);
        r.apply_report(&report(0, &[], &[1, 2, 3, 4], 0.0));
        r.apply_report(&report(2, &[7], &[], 0.0));
        let d = r.route(0, 7, &[1, 2, 3, 4], 10.0);
        assert_eq!(d.node, 2);
        assert!(d.kv_hit);
        assert!(!d.overload_fallback);
    }

    #[test]
    fn emb_coverage_decides_without_kv() {
        let mut r = router(3);
        r.apply_report(&report(1, &[], &[1, 2], 0.0));
        r.apply_report(&report(2, &[], &[1, 2, 3, 4], 0.0));
        let d = r.route(0, 9, &[1, 2, 3, 4], 1.0);
        assert_eq!(d.node, 2);
        assert_eq!(d.emb_coverage, 1.0);
    }

    #[test]
    fn overload_falls_back_to_least_loaded() {
        let mut r = router(3);
        r.apply_report(&report(0, &[5], &[], 900.0)); // l = 0.9 > τ
        r.apply_report(&report(1, &[], &[], 300.0));
        r.apply_report(&report(2, &[], &[], 100.0));
        let d = r.route(0, 5, &[], 1.0);
        assert!(d.overload_fallback);
        assert_eq!(d.node, 2);
        assert_eq!(r.stats().overload_fallbacks, 1);
    }

    #[test]
    fn affinity_breaks_a_tie() {
        let mut r = router(2);
        // First request: all equal, lowest index wins, no affinity yet.
        let d0 = r.route(0, 3, &[], 0.0);
        assert_eq!(d0.node, 0);
        assert!(!d0.affinity_win);
        // Make node 1 slightly better on load than node 0 but by less than ε.
        r.apply_report(&report(0, &[], &[], 20.0));
        r.apply_report(&report(1, &[], &[], 0.0));
        let d1 = r.route(1, 3, &[], 0.0);
        assert_eq!(d1.node, 0, "affinity bonus keeps the user on node 0");
        assert!(d1.affinity_win);
        assert_eq!(r.stats().affinity_wins, 1);
    }

    #[test]
    fn ties_go_to_lowest_index() {
        let mut r = router(4);
        for u in 0..10 {
            assert_eq!(r.route(0, 100 + u, &[], 0.0).node, 0);
        }
    }

    #[test]
    fn on_real_time_ties_go_to_the_replicas_own_node() {
        // Every replica sees equal loads here: ties spread over the nodes.
        for replica in 0..3 {
            let mut r = in_flight_router(3, replica, 3);
            assert_eq!(r.route(0, 100, &[], 0.0).node, replica as u32);
            // Past capacity everywhere, equally: the fallback keeps it too.
            for n in 0..3 {
                r.route(0, 200 + n, &[], 2_000.0);
            }
            assert_eq!(r.route(0, 101, &[], 0.0).node, replica as u32);
        }
    }

    #[test]
    fn dispatched_tokens_count_as_load_until_the_next_report() {
        let mut r = router(2);
        r.apply_report(&report(0, &[], &[], 0.0));
        r.apply_report(&report(1, &[], &[], 0.0));
        r.route(0, 1, &[], 500.0);
        assert!((r.load(0, 0) - 0.5).abs() < 1e-12);
        // Next user prefers node 1 (lower load).
        assert_eq!(r.route(0, 2, &[], 10.0).node, 1);
        r.apply_report(&report(0, &[], &[], 100.0));
        assert!((r.load(0, 0) - 0.1).abs() < 1e-12);
    }

    #[test]
    fn backlog_drains_in_event_time_between_reports() {
        let mut r = router(1);
        r.apply_report(&report(0, &[], &[], 500.0));
        assert!((r.load(0, 0) - 0.5).abs() < 1e-12);
        // 10 tokens/ms: after 20 ms, 300 tokens remain.
        assert!((r.load(0, 20) - 0.3).abs() < 1e-12);
        assert_eq!(r.load(0, 1_000), 0.0);
    }

    #[test]
    fn removals_in_reports_clear_residency() {
        let mut r = router(2);
        r.apply_report(&report(1, &[4], &[], 0.0));
        assert!(r.has_kv(1, 4));
        r.apply_report(&NodeReport {
            node: 1,
            kv_users_removed: vec![4],
            token_capacity: 1000.0,
            ..Default::default()
        });
        assert!(!r.has_kv(1, 4));
    }

    #[test]
    fn a_burst_before_the_first_report_is_spread_by_the_configured_capacity() {
        // Event-time backlog, no report yet: every node read load 0 and
        // the whole burst went to node 0.
        let mut r = router(2);
        r.seed_token_capacity(1000.0);
        let nodes: Vec<u32> = (0..4).map(|u| r.route(0, u, &[], 600.0).node).collect();
        assert!(nodes.contains(&0) && nodes.contains(&1), "{nodes:?}");
        // A report's own figures replace the seed.
        r.apply_report(&report(0, &[], &[], 0.0));
        assert_eq!(r.nodes[0].token_capacity, 1000.0);
    }

    #[test]
    fn profile_takes_the_most_touched_shards() {
        let p = shard_profile([5, 5, 5, 1, 1, 9, 2, 2], 2);
        assert_eq!(p, vec![1, 5]);
        let p = shard_profile([3, 2, 1], 2);
        assert_eq!(p, vec![1, 2], "ties go to the lower shard id");
    }

    #[test]
    fn invalid_config_is_rejected() {
        let cfg = RouterConfig {
            miss_cost_kv: -1.0,
            ..Default::default()
        };
        assert!(matches!(
            cfg.validate(),
            Err(RouterConfigError::Negative {
                field: "miss_cost_kv",
                ..
            })
        ));
    }

    #[test]
    fn affinity_is_bounded_by_max_users_and_evictions_are_counted() {
        let cfg = RouterConfig {
            max_users: 3,
            ..Default::default()
        };
        let hot = HotUsers::new(HotnessConfig {
            max_users: 4,
            ..Default::default()
        });
        let mut r = Router::new(cfg, 2, hot).unwrap();
        for u in 0..50 {
            r.route(u, u, &[], 1.0);
            assert!(r.affinity_users() <= 3);
            assert!(r.hotness_users() <= 4);
        }
        let s = r.stats();
        assert_eq!(s.affinity_evictions, 47);
        assert_eq!(s.affinity_users_peak, 3);
        assert_eq!(s.hotness_evictions, 46);
        assert_eq!(s.hotness_users_peak, 4);
        let zero = RouterConfig {
            max_users: 0,
            ..Default::default()
        };
        assert_eq!(zero.validate(), Err(RouterConfigError::NoUsers));
    }

    #[test]
    fn in_flight_load_is_what_was_sent_minus_what_the_node_finished() {
        let mut r = in_flight_router(2, 1, 2);
        // No report yet: the configured capacity already counts, so a
        // burst before the first report is spread too (the tie goes to
        // replica 1's own node).
        assert_eq!(r.route(0, 99, &[], 600.0).node, 1);
        assert_eq!(r.route(0, 98, &[], 10.0).node, 0);
        let mut r = in_flight_router(2, 0, 2);
        // With no report yet, 300 tokens sent to node 0 (replica 0's own,
        // where the tie goes) count × 2 replicas over a capacity of 1000 =
        // 0.6, however much event time passes (an event-time backlog would
        // have drained by now).
        assert_eq!(r.route(0, 9, &[], 300.0).node, 0);
        assert!((r.load(0, 1_000_000) - 0.6).abs() < 1e-9);
        assert_eq!(r.load(1, 1_000_000), 0.0);
        // The node finished 200 of replica 0's tokens (and some of
        // replica 1's, which this replica does not count), and has nothing
        // of replica 1's queued: 100 left in flight.
        let mut done = report(0, &[9], &[], 0.0);
        done.completed_tokens = vec![200.0, 5_000.0];
        r.apply_report(&done);
        assert!((r.load(0, 0) - 0.1).abs() < 1e-9);
        // An older report arriving late does not undo finished work.
        let mut stale = report(0, &[], &[], 0.0);
        stale.completed_tokens = vec![100.0, 0.0];
        r.apply_report(&stale);
        assert!((r.load(0, 0) - 0.1).abs() < 1e-9);
    }

    #[test]
    fn in_flight_load_adds_what_the_node_reported_queued_from_other_replicas() {
        let mut r = in_flight_router(2, 0, 2);
        // Before any queue report: own work in flight × 2 replicas.
        r.route(0, 1, &[], 100.0);
        assert!((r.load(0, 0) - 0.2).abs() < 1e-9);
        // Node 0 has 700 tokens queued from replica 1 (and 100 from this
        // one, which this replica counts itself).
        let mut queued = report(0, &[], &[], 0.0);
        queued.queued_tokens = vec![100.0, 700.0];
        r.apply_report(&queued);
        assert!((r.load(0, 0) - 0.8).abs() < 1e-9);
        // So a new user goes to node 1, which this replica sees empty.
        assert_eq!(r.route(0, 2, &[], 50.0).node, 1);
        // The queue drained: the next report says so, as the node does,
        // with no entry at all (it read as load 0.7 before).
        let mut drained = report(0, &[], &[], 0.0);
        drained.completed_tokens = vec![100.0, 700.0];
        r.apply_report(&drained);
        assert_eq!(r.load(0, 0), 0.0);
    }

    #[test]
    fn past_capacity_everywhere_the_least_overloaded_node_is_taken() {
        let mut r = in_flight_router(3, 0, 1);
        for n in 0..3 {
            r.apply_report(&report(n, &[], &[], 0.0));
        }
        r.apply_report(&report(0, &[7], &[], 0.0));
        // Every node past capacity: 3000, 1500 and 2000 tokens queued.
        assert_eq!(r.route(0, 100, &[], 3_000.0).node, 0);
        assert_eq!(r.route(0, 101, &[], 1_500.0).node, 1);
        assert_eq!(r.route(0, 102, &[], 2_000.0).node, 2);
        // User 7's KV is on node 0, which is overloaded.
        let d = r.route(0, 7, &[], 10.0);
        assert!(d.overload_fallback);
        assert_eq!(d.node, 1, "1500 is the least past capacity, not node 0");
    }
}
