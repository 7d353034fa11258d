//! Timely wrapper of the router: requests arrive exchanged by user, node
//! reports arrive broadcast through the feedback edge; each event time is
//! routed once both inputs are complete up to it.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::{Exchange, Pipeline};
use timely::dataflow::operators::generic::Operator;

use grflow_operators::router::{NodeReport, Router};

use crate::dataflow::stash::TimeStash;
use crate::events::{Admitted, Routed};
use crate::side::SideTables;

/// Stable hash of a user id (same on every worker and run).
pub fn user_hash(user: u64) -> u64 {
    // SplitMix64 finaliser: spreads sequential ids over workers.
    let mut z = user.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

pub fn route<'s>(
    requests: StreamVec<'s, u64, Admitted>,
    reports: StreamVec<'s, u64, NodeReport>,
    router: Rc<RefCell<Router>>,
    side: Arc<SideTables>,
) -> StreamVec<'s, u64, Routed> {
    let by_user = Exchange::new(|a: &Admitted| user_hash(a.request.user_id));
    requests.binary_frontier(reports, by_user, Pipeline, "Router", move |_cap, _info| {
        let mut waiting: TimeStash<Admitted> = TimeStash::default();
        let mut reports_waiting: TimeStash<NodeReport> = TimeStash::default();
        move |(requests, f_req), (reports, f_rep), output| {
            requests.for_each_stamp(|cap, data| {
                let cap = cap.retain_least(0);
                let time = *cap.as_ref().expect("data comes with a time").time();
                waiting.push(time, cap, data.flat_map(|d| d.drain(..)));
            });
            reports.for_each_stamp(|cap, data| {
                let time = *cap.least().expect("data comes with a time");
                reports_waiting.push(time, None, data.flat_map(|d| d.drain(..)));
            });
            let frontiers = [f_req, f_rep];
            let mut router = router.borrow_mut();
            loop {
                let next = match (waiting.first_time(), reports_waiting.first_time()) {
                    (Some(a), Some(b)) => a.min(b),
                    (Some(a), None) | (None, Some(a)) => a,
                    (None, None) => break,
                };
                if frontiers.iter().any(|f| f.less_equal(&next)) {
                    break;
                }
                // Reports first: a decision at t sees every report made before t.
                if let Some((_, mut batch)) = reports_waiting.take(next) {
                    batch.sort_by_key(|r| (r.at_ms, r.node));
                    for report in &batch {
                        router.apply_report(report);
                    }
                }
                if let Some((cap, mut batch)) = waiting.take(next) {
                    let cap = cap.expect("requests keep their capability");
                    batch.sort_by_key(|a| (a.request.ts_ms, a.request.user_id, a.request.req_id));
                    let mut session = output.session(&cap);
                    for admitted in batch {
                        let req = &admitted.request;
                        let history = admitted.history(&side).unwrap_or(&[]);
                        let profile = side.shard_profile(history, router.config().profile_shards);
                        let tokens = side.request_tokens(req, history);
                        let decision = router.route(req.ts_ms, req.user_id, &profile, tokens);
                        session.give(Routed { admitted, decision });
                    }
                }
            }
        }
    })
}
