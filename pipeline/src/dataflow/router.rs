//! The router in the dataflow: requests arrive exchanged by user, node
//! reports arrive broadcast through the feedback edge as its control input.
//! In `complete` mode a decision at t sees every report made before t; in
//! `arrival` mode the reports applied so far.

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::{Exchange, Pipeline};

use grflow_operators::router::{NodeReport, Router};

use crate::config::Release;
use crate::dataflow::operator::{EventOperator, event_operator};
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

/// The router as an event-time operator: reports are its control input.
struct RouterOp {
    router: Rc<RefCell<Router>>,
    side: Arc<SideTables>,
    /// This worker's index: the replica a node reports finished work to.
    replica: u32,
}

impl EventOperator for RouterOp {
    type Data = Admitted;
    type Control = NodeReport;
    type Output = Routed;

    fn on_control(&mut self, _time: u64, mut reports: Vec<NodeReport>) {
        // Reports of one time in a fixed order; each node's are applied in
        // the order it made them (`seq`), which may not be time order.
        reports.sort_by_key(|r| (r.at_ms, r.node, r.seq));
        let mut router = self.router.borrow_mut();
        for report in &reports {
            router.apply_report(report);
        }
    }

    fn on_data(&mut self, _time: u64, mut batch: Vec<Admitted>, out: &mut Vec<Routed>) {
        batch.sort_by_key(|a| (a.request.ts_ms, a.request.user_id, a.request.req_id));
        let mut router = self.router.borrow_mut();
        for admitted in batch {
            let req = &admitted.request;
            let history = admitted.history(&self.side).unwrap_or(&[]);
            let profile = self
                .side
                .shard_profile(history, router.config().profile_shards);
            let tokens = self.side.request_tokens(req, history);
            let decision = router.route(req.ts_ms, req.user_id, &profile, tokens);
            out.push(Routed {
                admitted,
                decision,
                router: self.replica,
                tokens: tokens as u32,
            });
        }
    }
}

/// Routes requests (exchanged by user) with the residency and load the
/// nodes reported (broadcast through the feedback edge), under `release`.
pub fn route<'s>(
    requests: StreamVec<'s, u64, Admitted>,
    reports: StreamVec<'s, u64, NodeReport>,
    router: Rc<RefCell<Router>>,
    side: Arc<SideTables>,
    release: Release,
) -> StreamVec<'s, u64, Routed> {
    let by_user = Exchange::new(|a: &Admitted| user_hash(a.request.user_id));
    let replica = requests.scope().index() as u32;
    event_operator(
        requests,
        reports,
        by_user,
        Pipeline,
        "Router",
        release,
        RouterOp {
            router,
            side,
            replica,
        },
    )
}
