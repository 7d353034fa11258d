//! The nodes' control input from a schedule: worker 0 emits each
//! scheduled command at its event time, paced like the requests (a command
//! at t enters when requests at t may), so that `arrival` mode applies it
//! about when its time comes, and `complete` mode exactly at it.

use std::collections::VecDeque;

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
