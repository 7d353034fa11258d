//! One event-time operator: the lifecycle every stateful operator of the
//! dataflow implements (router and node now, the allocator later), and the
//! one timely wrapper that drives it.
//!
//! An operator has a data input and a control input (reports, commands) and
//! one output. The wrapper hands them over by the release policy:
//! - [`Release::Complete`]: a time's control and data are held until both
//!   inputs' frontiers have passed it, then handed over together, control
//!   first, in time order. Deterministic.
//! - [`Release::Arrival`]: control and data are handed over as they arrive,
//!   so data is handled with the state known so far.
//!
//! In both modes output is emitted at the event time of what caused it, and
//! `on_complete(t)` runs once the frontiers have passed `t`: the only point
//! at which an operator waits on a frontier in arrival mode.

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::ParallelizationContract;
use timely::dataflow::operators::Capability;
use timely::dataflow::operators::generic::Operator;

use crate::config::Release;
use crate::dataflow::stash::TimeStash;

/// The lifecycle of an event-time operator. Implementations hold domain
/// logic from operators/ and know no timely type beyond this trait.
pub trait EventOperator: 'static {
    type Data: Clone + 'static;
    type Control: Clone + 'static;
    type Output: Clone + 'static;

    /// Control records stamped `time` (in arrival order). In `complete`
    /// mode they are applied after all data before `time` and before any
    /// data at `time`.
    fn on_control(&mut self, time: u64, control: Vec<Self::Control>);

    /// Data records at `time`: in `complete` mode all of them at once, in
    /// `arrival` mode each batch as it arrives. Output goes to `out`, which
    /// is emitted at `time`.
    fn on_data(&mut self, time: u64, data: Vec<Self::Data>, out: &mut Vec<Self::Output>);

    /// `arrival` mode: all data that arrived in one activation, per time
    /// (so that an operator can batch across times); `out[i]` is emitted
    /// at `arrivals[i].0`. The default hands each time to `on_data`.
    fn on_arrivals(
        &mut self,
        arrivals: Vec<(u64, Vec<Self::Data>)>,
        out: &mut [Vec<Self::Output>],
    ) {
        for ((time, data), out) in arrivals.into_iter().zip(out) {
            self.on_data(time, data, out);
        }
    }

    /// Every input has passed `time` (a time this operator saw records at).
    fn on_complete(&mut self, time: u64, out: &mut Vec<Self::Output>) {
        let _ = (time, out);
    }

    /// Both inputs are closed and nothing is held: called once.
    fn on_close(&mut self) {}
}

/// Runs `op` over `data` and `control` (partitioned by the two pacts) under
/// the `release` policy.
pub fn event_operator<'s, Op, P1, P2>(
    data: StreamVec<'s, u64, Op::Data>,
    control: StreamVec<'s, u64, Op::Control>,
    data_pact: P1,
    control_pact: P2,
    name: &str,
    release: Release,
    mut op: Op,
) -> StreamVec<'s, u64, Op::Output>
where
    Op: EventOperator,
    P1: ParallelizationContract<u64, Vec<Op::Data>>,
    P2: ParallelizationContract<u64, Vec<Op::Control>>,
{
    data.binary_frontier(
        control,
        data_pact,
        control_pact,
        name,
        move |_cap, _info| {
            // Per time: the capability to emit at it, and in complete mode its records.
            let mut held: TimeStash<Capability<u64>, Op::Control, Op::Data> = TimeStash::default();
            let mut out: Vec<Op::Output> = Vec::new();
            let mut closed = false;
            move |(data_in, data_frontier), (control_in, control_frontier), output| {
                // Control before data: in arrival mode a command that arrived in
                // the same activation already applies to the data.
                control_in.for_each_stamp(|cap, batches| {
                    let cap = cap.retain_least(0).expect("control comes with a time");
                    let time = *cap.time();
                    let records = batches.flat_map(|b| b.drain(..));
                    match release {
                        Release::Complete => held.push_control(time, cap, records),
                        Release::Arrival => {
                            op.on_control(time, records.collect());
                            held.hold(time, cap);
                        }
                    }
                });
                // Arrival mode: everything that arrived now, handed over at once.
                let mut arrived: Vec<(Capability<u64>, Vec<Op::Data>)> = Vec::new();
                data_in.for_each_stamp(|cap, batches| {
                    let cap = cap.retain_least(0).expect("data comes with a time");
                    let time = *cap.time();
                    let records = batches.flat_map(|b| b.drain(..));
                    match release {
                        Release::Complete => held.push_data(time, cap, records),
                        Release::Arrival => arrived.push((cap, records.collect())),
                    }
                });
                if !arrived.is_empty() {
                    let mut outs: Vec<Vec<Op::Output>> =
                        arrived.iter().map(|_| Vec::new()).collect();
                    let data = arrived
                        .iter_mut()
                        .map(|(cap, records)| (*cap.time(), std::mem::take(records)))
                        .collect();
                    op.on_arrivals(data, &mut outs);
                    for ((cap, _), records) in arrived.into_iter().zip(outs) {
                        if !records.is_empty() {
                            output.session(&cap).give_iterator(records.into_iter());
                        }
                        held.hold(*cap.time(), cap);
                    }
                }
                let passed =
                    |t: u64| !data_frontier.less_equal(&t) && !control_frontier.less_equal(&t);
                while let Some((time, h)) = held.pop_complete(passed) {
                    if !h.control.is_empty() {
                        op.on_control(time, h.control);
                    }
                    if !h.data.is_empty() {
                        op.on_data(time, h.data, &mut out);
                    }
                    op.on_complete(time, &mut out);
                    if !out.is_empty() {
                        output.session(&h.token).give_iterator(out.drain(..));
                    }
                }
                if !closed
                    && held.is_empty()
                    && data_frontier.is_empty()
                    && control_frontier.is_empty()
                {
                    closed = true;
                    op.on_close();
                }
            }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;

    use timely::dataflow::channels::pact::Pipeline;
    use timely::dataflow::operators::core::Inspect;
    use timely::dataflow::operators::vec::Map;
    use timely::dataflow::operators::{ConnectLoop, Feedback, Input, Probe};
    use timely::dataflow::{InputHandleVec, ProbeHandle};
    use timely::worker::Worker;

    /// What the operator under test was told, in order.
    #[derive(Clone, Debug, PartialEq)]
    enum Call {
        Control(u64, Vec<i64>),
        Data(u64, Vec<u32>),
        Complete(u64),
        Close,
    }

    /// Adds the sum of the control records seen so far to each datum: its
    /// output shows exactly which commands a record was handled after.
    struct Recorder {
        calls: Rc<RefCell<Vec<Call>>>,
        offset: i64,
    }

    impl EventOperator for Recorder {
        type Data = u32;
        type Control = i64;
        type Output = (u32, i64);

        fn on_control(&mut self, time: u64, control: Vec<i64>) {
            self.offset += control.iter().sum::<i64>();
            self.calls.borrow_mut().push(Call::Control(time, control));
        }

        fn on_data(&mut self, time: u64, mut data: Vec<u32>, out: &mut Vec<(u32, i64)>) {
            data.sort();
            out.extend(data.iter().map(|&d| (d, self.offset)));
            self.calls.borrow_mut().push(Call::Data(time, data));
        }

        fn on_complete(&mut self, time: u64, _out: &mut Vec<(u32, i64)>) {
            self.calls.borrow_mut().push(Call::Complete(time));
        }

        fn on_close(&mut self) {
            self.calls.borrow_mut().push(Call::Close);
        }
    }

    type Outputs = Rc<RefCell<Vec<(u64, (u32, i64))>>>;
    type DataInput = InputHandleVec<u64, u32>;
    type ControlInput = InputHandleVec<u64, i64>;
    type Calls = Rc<RefCell<Vec<Call>>>;
    /// The inputs, the probe, the operator's calls and its outputs.
    type Wired = (DataInput, ControlInput, ProbeHandle<u64>, Calls, Outputs);

    /// Collects the output's records with the time each was emitted at.
    fn collect<'s>(
        stream: StreamVec<'s, u64, (u32, i64)>,
        outputs: &Outputs,
        probe: &ProbeHandle<u64>,
    ) {
        let sink = outputs.clone();
        stream
            .inspect_core(move |event| {
                if let Ok((stamp, records)) = event {
                    let time = *stamp.least().expect("emitted at a time");
                    sink.borrow_mut()
                        .extend(records.iter().map(|&r: &(u32, i64)| (time, r)));
                }
            })
            .probe_with(probe);
    }

    /// The operator between a data and a control input.
    fn two_inputs(worker: &mut Worker, release: Release) -> Wired {
        let mut data = InputHandleVec::new();
        let mut control = InputHandleVec::new();
        let probe = ProbeHandle::new();
        let calls: Calls = Rc::default();
        let outputs: Outputs = Rc::default();
        worker.dataflow::<u64, _, _>(|scope| {
            let data = scope.input_from(&mut data);
            let control = scope.input_from(&mut control);
            let op = Recorder {
                calls: calls.clone(),
                offset: 0,
            };
            let out = event_operator(data, control, Pipeline, Pipeline, "Test", release, op);
            collect(out, &outputs, &probe);
        });
        (data, control, probe, calls, outputs)
    }

    fn steps(worker: &mut Worker, n: usize) {
        for _ in 0..n {
            worker.step();
        }
    }

    #[test]
    fn complete_holds_a_time_until_both_inputs_pass_it_and_applies_its_control_first() {
        timely::execute_directly(|worker| {
            let (mut data, mut control, _probe, calls, outputs) =
                two_inputs(worker, Release::Complete);
            data.advance_to(1);
            data.send(11);
            data.advance_to(2);
            data.send(22);
            data.send(21);
            data.advance_to(3);
            control.advance_to(2);
            control.send(100);
            steps(worker, 20);
            // Time 1 is complete (control is at 2); time 2 is not.
            assert_eq!(
                *calls.borrow(),
                vec![Call::Data(1, vec![11]), Call::Complete(1)]
            );
            assert_eq!(*outputs.borrow(), vec![(1, (11, 0))]);

            control.advance_to(3);
            steps(worker, 20);
            assert_eq!(
                calls.borrow()[2..],
                [
                    Call::Control(2, vec![100]),
                    Call::Data(2, vec![21, 22]),
                    Call::Complete(2)
                ]
            );
            // The command stamped 2 reached both records at 2, none before.
            assert_eq!(
                *outputs.borrow(),
                vec![(1, (11, 0)), (2, (21, 100)), (2, (22, 100))]
            );

            drop((data, control));
            steps(worker, 20);
            assert_eq!(calls.borrow().last(), Some(&Call::Close));
            assert_eq!(calls.borrow().len(), 6, "{:?}", calls.borrow());
        });
    }

    #[test]
    fn complete_releases_out_of_order_times_in_time_order() {
        timely::execute_directly(|worker| {
            let (mut data, mut control, probe, calls, outputs) =
                two_inputs(worker, Release::Complete);
            // Control at 5 arrives before data at 3: time 3 still goes first.
            control.advance_to(5);
            control.send(7);
            data.advance_to(3);
            data.send(3);
            data.advance_to(6);
            control.advance_to(6);
            while probe.less_than(&6) {
                worker.step();
            }
            assert_eq!(
                *calls.borrow(),
                vec![
                    Call::Data(3, vec![3]),
                    Call::Complete(3),
                    Call::Control(5, vec![7]),
                    Call::Complete(5)
                ]
            );
            assert_eq!(*outputs.borrow(), vec![(3, (3, 0))]);
        });
    }

    #[test]
    fn arrival_handles_data_before_its_time_is_complete_with_the_control_seen_so_far() {
        timely::execute_directly(|worker| {
            let (mut data, mut control, probe, calls, outputs) =
                two_inputs(worker, Release::Arrival);
            data.advance_to(1);
            data.send(11);
            data.flush();
            // The control input is still at 0: complete mode would wait.
            steps(worker, 20);
            assert_eq!(*calls.borrow(), vec![Call::Data(1, vec![11])]);
            assert_eq!(*outputs.borrow(), vec![(1, (11, 0))]);

            control.send(5);
            control.flush();
            steps(worker, 20);
            data.send(12);
            data.flush();
            steps(worker, 20);
            // Emitted at its own event time, with the command applied on arrival.
            assert_eq!(*outputs.borrow(), vec![(1, (11, 0)), (1, (12, 5))]);
            assert!(
                !calls
                    .borrow()
                    .iter()
                    .any(|c| matches!(c, Call::Complete(_))),
                "nothing is complete yet: {:?}",
                calls.borrow()
            );

            data.advance_to(2);
            control.advance_to(2);
            while probe.less_than(&2) {
                worker.step();
            }
            assert_eq!(
                *calls.borrow(),
                vec![
                    Call::Data(1, vec![11]),
                    Call::Control(0, vec![5]),
                    Call::Data(1, vec![12]),
                    Call::Complete(0),
                    Call::Complete(1),
                ]
            );
            drop((data, control));
            steps(worker, 20);
            assert_eq!(calls.borrow().last(), Some(&Call::Close));
        });
    }

    /// Commands made from the output at t travel a feedback edge and are
    /// stamped t + 1 (how window-driven commands reach a node): in complete
    /// mode they apply to every record at t + 1 and to none at t.
    #[test]
    fn commands_fed_back_apply_from_the_next_time_on() {
        timely::execute_directly(|worker| {
            let mut data: DataInput = InputHandleVec::new();
            let probe = ProbeHandle::new();
            let outputs: Outputs = Rc::default();
            let calls: Rc<RefCell<Vec<Call>>> = Rc::default();
            worker.dataflow::<u64, _, _>(|scope| {
                let (loop_handle, commands) = scope.feedback::<Vec<i64>>(1);
                let input = scope.input_from(&mut data);
                let op = Recorder {
                    calls: calls.clone(),
                    offset: 0,
                };
                let out = event_operator(
                    input,
                    commands,
                    Pipeline,
                    Pipeline,
                    "Test",
                    Release::Complete,
                    op,
                );
                out.clone()
                    .map(|(d, _)| 1_000 * d as i64)
                    .connect_loop(loop_handle);
                collect(out, &outputs, &probe);
            });
            for t in 1..=3u64 {
                data.advance_to(t);
                data.send(t as u32);
                data.send(10 * t as u32);
            }
            data.advance_to(4);
            while probe.less_than(&4) {
                worker.step();
            }
            assert_eq!(
                *outputs.borrow(),
                vec![
                    (1, (1, 0)),
                    (1, (10, 0)),
                    (2, (2, 11_000)),
                    (2, (20, 11_000)),
                    (3, (3, 33_000)),
                    (3, (30, 33_000)),
                ]
            );
            assert!(
                calls
                    .borrow()
                    .contains(&Call::Control(2, vec![1_000, 10_000])),
                "{:?}",
                calls.borrow()
            );
        });
    }
}
