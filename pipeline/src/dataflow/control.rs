//! The nodes' control input from a schedule: worker 0 emits each
//! scheduled command at its event time, paced like the requests (a command
//! at t enters when requests at t may), so that `arrival` mode applies it
//! about when its time comes, and `complete` mode exactly at it.

use std::cell::Cell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use timely::dataflow::operators::generic::operator::source;
use timely::dataflow::{Scope, StreamVec};

use crate::dataflow::source::Pacing;
use crate::events::{NodeControl, ScheduledCommand};

pub fn scheduled_commands<'s>(
    scope: Scope<'s, u64>,
    mut schedule: Vec<ScheduledCommand>,
    pacing: Pacing,
) -> StreamVec<'s, u64, NodeControl> {
    if scope.index() != 0 {
        schedule.clear();
    }
    // Stable: commands of one time keep the schedule's order (their seq).
    schedule.sort_by_key(|c| c.at_ms);
    let mut pending: VecDeque<(u64, ScheduledCommand)> = schedule
        .into_iter()
        .enumerate()
        .map(|(seq, c)| (seq as u64, c))
        .collect();
    source(scope, "Commands", move |capability, info| {
        let activator = scope.activator_for(info.address);
        let mut cap = Some(capability);
        move |output| {
            let Some(c) = cap.as_mut() else { return };
            let allowed = pacing.allowed();
            while let Some((_, next)) = pending.front()
                && next.at_ms <= allowed
            {
                let (seq, next) = pending.pop_front().expect("not empty");
                let at = next.at_ms.max(*c.time());
                output.session(&c.delayed(&at)).give(NodeControl {
                    target: next.target,
                    seq,
                    command: next.command,
                });
            }
            match pending.front() {
                None => cap = None,
                Some((_, next)) => {
                    c.downgrade(&next.at_ms.max(*c.time()));
                    activator.activate_after(pacing.wait_for(next.at_ms));
                }
            }
        }
    })
}

/// The event time a live source (Kafka) has reached, shared on one worker
/// with the operator that stamps commands made while the job runs.
#[derive(Debug)]
pub struct SourceClock {
    pub now: Cell<u64>,
    /// False once the source dropped its capability (the job drains).
    pub open: Cell<bool>,
}

impl Default for SourceClock {
    fn default() -> Self {
        Self {
            now: Cell::new(0),
            open: Cell::new(true),
        }
    }
}

/// Commands made while a job runs (an admin's model swap), for one worker.
#[derive(Clone, Debug)]
pub struct LiveControl {
    pub inbox: Arc<Mutex<VecDeque<NodeControl>>>,
    pub clock: Rc<SourceClock>,
}

/// How often the live command source looks at its inbox.
const LIVE_POLL: Duration = Duration::from_millis(20);

/// Emits what arrives in the inbox at the source's current event time.
/// Under `complete` release the command applies between the requests read
/// before it and those after. Under `arrival` (serve's default) a node
/// applies it between two steps: requests read before it but still queued
/// at the node are served after it (by the new model, after a swap). Its
/// capability follows the source's, so it holds back nothing.
pub fn live_commands<'s>(
    scope: Scope<'s, u64>,
    live: LiveControl,
) -> StreamVec<'s, u64, NodeControl> {
    source(scope, "LiveCommands", move |capability, info| {
        let activator = scope.activator_for(info.address);
        let mut cap = Some(capability);
        move |output| {
            let Some(c) = cap.as_mut() else { return };
            let now = live.clock.now.get().max(*c.time());
            c.downgrade(&now);
            let pending: Vec<NodeControl> =
                live.inbox.lock().expect("inbox lock").drain(..).collect();
            if !pending.is_empty() {
                output.session(&*c).give_iterator(pending.into_iter());
            }
            if live.clock.open.get() {
                activator.activate_after(LIVE_POLL);
            } else {
                cap = None;
            }
        }
    })
}
