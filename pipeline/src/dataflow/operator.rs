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
//!
//! In arrival mode data waits in a queue the wrapper owns and the operator
//! takes from ([`EventOperator::on_queue`]): it may handle a bounded step
//! per activation (the node serves one batch, so that the router on the
//! same worker keeps routing between batches) or wait for a batch to fill.
//! A time is not complete while queued data at it remains.
//!
//! A step may also run off the worker thread ([`Step::Pending`]): the
//! operator keeps the times of the data it took ([`EventOperator::in_flight`])
//! and calls its [`Waker`] when the step is done. Meanwhile the worker runs
//! the rest of the dataflow (the source admits, the router routes). Work off
//! the worker that holds no data (a model loading) makes the operator
//! [`EventOperator::busy`] without holding back any time.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use timely::dataflow::StreamVec;
use timely::dataflow::channels::pact::ParallelizationContract;
use timely::dataflow::operators::Capability;
use timely::dataflow::operators::generic::Operator;
use timely::scheduling::SyncActivator;

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

    /// `arrival` mode: data not yet handled, oldest arrival first, each
    /// with its event time. The operator removes what it handles now and
    /// pushes outputs with the time each is emitted at (the time of the
    /// record that caused it); [`Step`] says when to call again if anything
    /// is left. The default hands everything to `on_data`, per time.
    fn on_queue(
        &mut self,
        queue: &mut VecDeque<(u64, Self::Data)>,
        out: &mut Vec<(u64, Self::Output)>,
    ) -> Step {
        // Grouped per time in order of first arrival; indexed, since a
        // Kafka poll brings hundreds of records at distinct times.
        let mut times: Vec<(u64, Vec<Self::Data>)> = Vec::new();
        let mut at: std::collections::HashMap<u64, usize> = std::collections::HashMap::new();
        for (time, datum) in queue.drain(..) {
            let i = *at.entry(time).or_insert_with(|| {
                times.push((time, Vec::new()));
                times.len() - 1
            });
            times[i].1.push(datum);
        }
        let mut outs = Vec::new();
        for (time, data) in times {
            self.on_data(time, data, &mut outs);
            out.extend(outs.drain(..).map(|o| (time, o)));
        }
        Step::Idle
    }

    /// Every input has passed `time` (a time this operator saw records at).
    fn on_complete(&mut self, time: u64, out: &mut Vec<Self::Output>) {
        let _ = (time, out);
    }

    /// Both inputs are closed and nothing is held: called once.
    fn on_close(&mut self) {}

    /// `arrival` mode: the data input is closed (the end of a trace, a
    /// stop), so nothing queued can be joined by more: an operator waiting
    /// for more (a batch filling) should stop waiting. Called once, before
    /// the queue is offered again.
    fn on_input_closed(&mut self) {}

    /// Called once before any data: what calls the operator again from
    /// another thread (see [`Step::Pending`]).
    fn on_start(&mut self, waker: Waker) {
        let _ = waker;
    }

    /// `arrival` mode: times of data taken from the queue whose outputs
    /// are still to come (a step running elsewhere). They stay held: none
    /// of them completes until it leaves this list. Only times of records.
    fn in_flight(&self) -> &[u64] {
        &[]
    }

    /// `arrival` mode: work is under way off the worker (a step, a model
    /// loading) that the operator finishes in [`EventOperator::on_queue`]
    /// once its [`Waker`] says it is done. While busy, the queue is offered
    /// on every activation even when empty, and the operator is not
    /// closed; unlike [`EventOperator::in_flight`], busy holds back no time.
    /// So once both inputs close with nothing held, timely drops the
    /// operator: work still under way then is never finished and
    /// `on_close` never runs (a swap loading at the end of a job). Must be
    /// true while any time is in flight (the default says exactly that).
    fn busy(&self) -> bool {
        !self.in_flight().is_empty()
    }
}

/// Schedules an operator from any thread.
#[derive(Clone)]
pub struct Waker(Arc<SyncActivator>);

impl Waker {
    /// Runs the operator at the worker's next step (unparks the worker).
    pub fn wake(&self) {
        // Fails only once the worker has shut down: nothing left to wake.
        let _ = self.0.activate();
    }
}

impl std::fmt::Debug for Waker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Waker")
    }
}

/// What an arrival-mode operator wants after [`EventOperator::on_queue`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Call again when more data arrives (whatever is queued waits for it).
    Idle,
    /// More is ready: call again as soon as the worker has run the rest of
    /// the dataflow once.
    Again,
    /// Call again after this long even if nothing arrives (a batch's wait
    /// bound).
    After(Duration),
    /// A step runs off this thread: call again when the operator's
    /// [`Waker`] says it is done (or more data arrives).
    Pending,
}

/// Counts of queued records per time: a time with queued data is not
/// complete, so its emit token stays held.
#[derive(Debug, Default)]
struct Queued(BTreeMap<u64, usize>);

impl Queued {
    fn add(&mut self, time: u64) {
        *self.0.entry(time).or_default() += 1;
    }
    /// Recounts after the operator took from the queue.
    fn recount<D>(&mut self, queue: &VecDeque<(u64, D)>) {
        self.0.clear();
        for (t, _) in queue {
            self.add(*t);
        }
    }
    fn holds(&self, time: u64) -> bool {
        self.0.contains_key(&time)
    }
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
    let scope = data.scope();
    data.binary_frontier(control, data_pact, control_pact, name, move |_cap, info| {
        op.on_start(Waker(Arc::new(
            scope.worker().sync_activator_for(info.address.to_vec()),
        )));
        let activator = scope.activator_for(info.address);
        // Every arrival during a batch's wait asks for a wake: one timer.
        let mut timer = crate::dataflow::wake::WakeTimer::default();
        // Per time: the capability to emit at it, and in complete mode its records.
        let mut held: TimeStash<Capability<u64>, Op::Control, Op::Data> = TimeStash::default();
        let mut out: Vec<Op::Output> = Vec::new();
        // Arrival mode: data not yet handled, and outputs tagged by time.
        let mut queue: VecDeque<(u64, Op::Data)> = VecDeque::new();
        let mut queued = Queued::default();
        let mut tagged: Vec<(u64, Op::Output)> = Vec::new();
        let mut closed = false;
        let mut input_closed = false;
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
            data_in.for_each_stamp(|cap, batches| {
                let cap = cap.retain_least(0).expect("data comes with a time");
                let time = *cap.time();
                let records = batches.flat_map(|b| b.drain(..));
                match release {
                    Release::Complete => held.push_data(time, cap, records),
                    Release::Arrival => {
                        for r in records {
                            queued.add(time);
                            queue.push_back((time, r));
                        }
                        held.hold(time, cap);
                    }
                }
            });
            if release == Release::Arrival && !input_closed && data_frontier.is_empty() {
                input_closed = true;
                op.on_input_closed();
            }
            if release == Release::Arrival && (!queue.is_empty() || op.busy()) {
                let before = queue.len();
                match op.on_queue(&mut queue, &mut tagged) {
                    Step::Idle | Step::Pending => {}
                    Step::Again => activator.activate(),
                    Step::After(wait) => timer.activate_after(&activator, wait),
                }
                // `on_queue` only removes: the same length is the same
                // queue, and a node waiting on a step takes nothing on most
                // activations (a recount walks the whole queue).
                if queue.len() != before {
                    queued.recount(&queue);
                }
                // Outputs of one time together, in the order made.
                tagged.sort_by_key(|(t, _)| *t);
                let mut drained = tagged.drain(..).peekable();
                while let Some((time, first)) = drained.next() {
                    let token = &held.token(time).expect("queued times are held").clone();
                    let mut session = output.session(token);
                    session.give(first);
                    while let Some((_, o)) = drained.next_if(|(t, _)| *t == time) {
                        session.give(o);
                    }
                }
            }
            let in_flight = op.in_flight().to_vec();
            let busy = op.busy();
            debug_assert!(busy || in_flight.is_empty(), "times in flight, not busy");
            let passed = |t: u64| {
                !data_frontier.less_equal(&t)
                    && !control_frontier.less_equal(&t)
                    && !queued.holds(t)
                    && !in_flight.contains(&t)
            };
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
                && queue.is_empty()
                && !busy
                && data_frontier.is_empty()
                && control_frontier.is_empty()
            {
                closed = true;
                op.on_close();
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::rc::Rc;
    use std::time::Instant;

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
        /// A load off the worker ended and its value was taken.
        Loaded(i64),
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
    /// `make(calls)` between a data and a control input.
    fn wire<Op>(worker: &mut Worker, release: Release, make: impl FnOnce(Calls) -> Op) -> Wired
    where
        Op: EventOperator<Data = u32, Control = i64, Output = (u32, i64)>,
    {
        let mut data = InputHandleVec::new();
        let mut control = InputHandleVec::new();
        let probe = ProbeHandle::new();
        let calls: Calls = Rc::default();
        let outputs: Outputs = Rc::default();
        worker.dataflow::<u64, _, _>(|scope| {
            let data = scope.input_from(&mut data);
            let control = scope.input_from(&mut control);
            let op = make(calls.clone());
            let out = event_operator(data, control, Pipeline, Pipeline, "Test", release, op);
            collect(out, &outputs, &probe);
        });
        (data, control, probe, calls, outputs)
    }

    /// The recorder between a data and a control input.
    fn two_inputs(worker: &mut Worker, release: Release) -> Wired {
        wire(worker, release, |calls| Recorder { calls, offset: 0 })
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

    /// Handles one record per call and asks to be called again; with
    /// `wait_below = n`, waits until 20 ms after its first record while
    /// fewer than n are queued.
    struct Stepper {
        calls: Calls,
        wait_below: usize,
        wait: Duration,
        waiting_since: Option<Instant>,
    }

    impl EventOperator for Stepper {
        type Data = u32;
        type Control = i64;
        type Output = (u32, i64);

        fn on_control(&mut self, _time: u64, _control: Vec<i64>) {}

        fn on_data(&mut self, _time: u64, _data: Vec<u32>, _out: &mut Vec<(u32, i64)>) {
            unreachable!("arrival mode only")
        }

        fn on_queue(
            &mut self,
            queue: &mut VecDeque<(u64, u32)>,
            out: &mut Vec<(u64, (u32, i64))>,
        ) -> Step {
            // Like a batch's wait bound: measured from the first record
            // seen, however often the wrapper calls (frontier changes too).
            let since = *self.waiting_since.get_or_insert_with(Instant::now);
            let wait = self.wait.saturating_sub(since.elapsed());
            if queue.len() < self.wait_below && !wait.is_zero() {
                return Step::After(wait);
            }
            let (time, d) = queue.pop_front().expect("called with data");
            self.calls.borrow_mut().push(Call::Data(time, vec![d]));
            out.push((time, (d, 0)));
            if queue.is_empty() {
                Step::Idle
            } else {
                Step::Again
            }
        }

        fn on_complete(&mut self, time: u64, _out: &mut Vec<(u32, i64)>) {
            self.calls.borrow_mut().push(Call::Complete(time));
        }

        fn on_input_closed(&mut self) {
            self.wait_below = 0;
        }
    }

    fn stepper(worker: &mut Worker, wait_below: usize) -> Wired {
        stepper_waiting(worker, wait_below, Duration::from_millis(20))
    }

    fn stepper_waiting(worker: &mut Worker, wait_below: usize, wait: Duration) -> Wired {
        wire(worker, Release::Arrival, |calls| Stepper {
            calls,
            wait_below,
            wait,
            waiting_since: None,
        })
    }

    #[test]
    fn a_closed_data_input_ends_the_wait_for_more() {
        timely::execute_directly(|worker| {
            let (mut data, control, probe, _calls, outputs) =
                stepper_waiting(worker, 2, Duration::from_secs(3_600));
            data.advance_to(3);
            data.send(30);
            data.flush();
            steps(worker, 5);
            assert!(outputs.borrow().is_empty(), "waiting for a second record");
            // No second record can come: served now, not in an hour.
            drop(data);
            drop(control);
            let started = Instant::now();
            while !probe.done() {
                worker.step_or_park(Some(Duration::from_millis(5)));
                assert!(started.elapsed() < Duration::from_secs(5), "still waiting");
            }
            assert_eq!(*outputs.borrow(), vec![(3, (30, 0))]);
        });
    }

    #[test]
    fn arrival_queue_is_taken_in_steps_and_a_time_completes_only_when_its_queue_is_empty() {
        timely::execute_directly(|worker| {
            let (mut data, mut control, probe, calls, outputs) = stepper(worker, 0);
            data.advance_to(1);
            for d in [10, 11, 12] {
                data.send(d);
            }
            data.advance_to(2);
            control.advance_to(2);
            while probe.less_than(&2) {
                worker.step();
            }
            // One record per call; time 1 completes after its last record,
            // though both frontiers passed it at once.
            assert_eq!(
                *calls.borrow(),
                vec![
                    Call::Data(1, vec![10]),
                    Call::Data(1, vec![11]),
                    Call::Data(1, vec![12]),
                    Call::Complete(1),
                ]
            );
            assert_eq!(
                *outputs.borrow(),
                vec![(1, (10, 0)), (1, (11, 0)), (1, (12, 0))]
            );
        });
    }

    #[test]
    fn arrival_queue_waits_as_told_and_is_called_again_without_new_data() {
        timely::execute_directly(|worker| {
            let (mut data, mut control, probe, calls, outputs) = stepper(worker, 2);
            data.advance_to(3);
            data.send(30);
            data.flush();
            let started = std::time::Instant::now();
            steps(worker, 5);
            assert!(calls.borrow().is_empty(), "waiting for a second record");
            // Nothing else arrives: after the wait it is called again (the
            // stepper then serves what it has).
            while outputs.borrow().is_empty() {
                worker.step_or_park(Some(Duration::from_millis(5)));
                assert!(started.elapsed() < Duration::from_secs(5), "never woke");
            }
            assert!(started.elapsed() >= Duration::from_millis(20));
            assert_eq!(*outputs.borrow(), vec![(3, (30, 0))]);
            data.advance_to(4);
            control.advance_to(4);
            while probe.less_than(&4) {
                worker.step();
            }
            assert_eq!(calls.borrow().last(), Some(&Call::Complete(3)));
        });
    }

    type Answers = std::sync::mpsc::Receiver<Vec<(u64, u32)>>;

    /// Hands everything queued to a thread that answers after 30 ms and
    /// wakes the operator: the worker is free meanwhile.
    struct Offloader {
        calls: Calls,
        waker: Option<Waker>,
        running: Option<(Vec<u64>, Answers)>,
    }

    impl EventOperator for Offloader {
        type Data = u32;
        type Control = i64;
        type Output = (u32, i64);

        fn on_control(&mut self, _time: u64, _control: Vec<i64>) {}

        fn on_data(&mut self, _time: u64, _data: Vec<u32>, _out: &mut Vec<(u32, i64)>) {
            unreachable!("arrival mode only")
        }

        fn on_start(&mut self, waker: Waker) {
            self.waker = Some(waker);
        }

        fn in_flight(&self) -> &[u64] {
            self.running.as_ref().map_or(&[], |(times, _)| times)
        }

        fn on_queue(
            &mut self,
            queue: &mut VecDeque<(u64, u32)>,
            out: &mut Vec<(u64, (u32, i64))>,
        ) -> Step {
            if let Some((_, done)) = &self.running {
                let Ok(answers) = done.try_recv() else {
                    return Step::Pending;
                };
                self.running = None;
                for (time, d) in answers {
                    self.calls.borrow_mut().push(Call::Data(time, vec![d]));
                    out.push((time, (d, 1)));
                }
            }
            if queue.is_empty() {
                return Step::Idle;
            }
            let taken: Vec<(u64, u32)> = queue.drain(..).collect();
            let times = taken.iter().map(|(t, _)| *t).collect();
            let (tx, rx) = std::sync::mpsc::channel();
            let waker = self.waker.clone().expect("started");
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                tx.send(taken).unwrap();
                waker.wake();
            });
            self.running = Some((times, rx));
            Step::Pending
        }

        fn on_complete(&mut self, time: u64, _out: &mut Vec<(u32, i64)>) {
            self.calls.borrow_mut().push(Call::Complete(time));
        }
    }

    #[test]
    fn a_step_off_the_worker_holds_its_times_and_wakes_the_worker_when_done() {
        timely::execute_directly(|worker| {
            let (mut data, mut control, probe, calls, outputs) =
                wire(worker, Release::Arrival, |calls| Offloader {
                    calls,
                    waker: None,
                    running: None,
                });
            data.advance_to(1);
            data.send(10);
            data.send(11);
            data.advance_to(2);
            control.advance_to(2);
            let started = Instant::now();
            steps(worker, 20);
            // Both frontiers passed 1, but its step is still running.
            assert!(outputs.borrow().is_empty());
            assert!(probe.less_than(&2), "time 1 was released early");
            assert!(calls.borrow().is_empty(), "{:?}", calls.borrow());
            // The worker parks; the step's thread wakes it long before the
            // park's timeout.
            while probe.less_than(&2) {
                worker.step_or_park(Some(Duration::from_secs(10)));
            }
            assert!(started.elapsed() < Duration::from_secs(5), "never woken");
            assert!(started.elapsed() >= Duration::from_millis(30));
            assert_eq!(*outputs.borrow(), vec![(1, (10, 1)), (1, (11, 1))]);
            assert_eq!(
                *calls.borrow(),
                vec![
                    Call::Data(1, vec![10]),
                    Call::Data(1, vec![11]),
                    Call::Complete(1)
                ]
            );
        });
    }

    /// A control record starts a load off the worker (its value, once the
    /// test opens the gate); meanwhile data is served with the offset it
    /// has. Busy while it loads, with no time in flight: a node's model
    /// swap.
    struct Loader {
        calls: Calls,
        offset: i64,
        waker: Option<Waker>,
        gate: Option<std::sync::mpsc::Receiver<()>>,
        loading: Option<std::sync::mpsc::Receiver<i64>>,
    }

    impl EventOperator for Loader {
        type Data = u32;
        type Control = i64;
        type Output = (u32, i64);

        fn on_control(&mut self, time: u64, control: Vec<i64>) {
            let value = control.iter().sum();
            self.calls.borrow_mut().push(Call::Control(time, control));
            let gate = self.gate.take().expect("one load per test");
            let waker = self.waker.clone().expect("started");
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                // A dropped gate ends the load too.
                let _ = gate.recv();
                let _ = tx.send(value);
                waker.wake();
            });
            self.loading = Some(rx);
        }

        fn on_data(&mut self, _time: u64, _data: Vec<u32>, _out: &mut Vec<(u32, i64)>) {
            unreachable!("arrival mode only")
        }

        fn on_start(&mut self, waker: Waker) {
            self.waker = Some(waker);
        }

        fn busy(&self) -> bool {
            self.loading.is_some()
        }

        fn on_queue(
            &mut self,
            queue: &mut VecDeque<(u64, u32)>,
            out: &mut Vec<(u64, (u32, i64))>,
        ) -> Step {
            if let Some(done) = &self.loading
                && let Ok(value) = done.try_recv()
            {
                self.loading = None;
                self.offset = value;
                self.calls.borrow_mut().push(Call::Loaded(value));
            }
            for (time, d) in queue.drain(..) {
                self.calls.borrow_mut().push(Call::Data(time, vec![d]));
                out.push((time, (d, self.offset)));
            }
            Step::Idle
        }

        fn on_complete(&mut self, time: u64, _out: &mut Vec<(u32, i64)>) {
            self.calls.borrow_mut().push(Call::Complete(time));
        }

        fn on_close(&mut self) {
            self.calls.borrow_mut().push(Call::Close);
        }
    }

    fn loader(worker: &mut Worker, gate: std::sync::mpsc::Receiver<()>) -> Wired {
        wire(worker, Release::Arrival, |calls| Loader {
            calls,
            offset: 0,
            waker: None,
            gate: Some(gate),
            loading: None,
        })
    }

    #[test]
    fn a_busy_operator_holds_back_no_time_and_is_offered_the_queue_when_its_work_ends() {
        timely::execute_directly(|worker| {
            let (gate, gate_rx) = std::sync::mpsc::channel();
            let (mut data, mut control, probe, calls, outputs) = loader(worker, gate_rx);
            control.send(7);
            data.advance_to(1);
            data.send(10);
            data.advance_to(2);
            control.advance_to(2);
            // The load is under way throughout: busy holds back no time.
            for _ in 0..1_000 {
                if !probe.less_than(&2) {
                    break;
                }
                worker.step();
            }
            assert!(!probe.less_than(&2), "a busy operator held a time back");
            assert_eq!(
                *calls.borrow(),
                vec![
                    Call::Control(0, vec![7]),
                    Call::Data(1, vec![10]),
                    Call::Complete(0),
                    Call::Complete(1),
                ]
            );
            assert_eq!(*outputs.borrow(), vec![(1, (10, 0))]);
            // The load ends and nothing else happens: only the wrapper
            // offering the empty queue on the wake hands its value over.
            // The worker parks up to 10 s at a time unless woken.
            gate.send(()).unwrap();
            let started = Instant::now();
            while !calls.borrow().contains(&Call::Loaded(7)) {
                worker.step_or_park(Some(Duration::from_secs(10)));
                assert!(
                    started.elapsed() < Duration::from_secs(5),
                    "the end of the load was never offered: {:?}",
                    calls.borrow()
                );
            }
            data.send(20);
            data.advance_to(3);
            control.advance_to(3);
            while probe.less_than(&3) {
                worker.step();
            }
            assert_eq!(outputs.borrow()[1..], [(2, (20, 7))]);
            drop((data, control));
            steps(worker, 20);
            assert_eq!(
                calls.borrow()[4..],
                [
                    Call::Loaded(7),
                    Call::Data(2, vec![20]),
                    Call::Complete(2),
                    Call::Close
                ]
            );
        });
    }

    #[test]
    fn a_busy_operator_is_not_closed() {
        timely::execute_directly(|worker| {
            let (gate, gate_rx) = std::sync::mpsc::channel();
            let (data, mut control, _probe, calls, _outputs) = loader(worker, gate_rx);
            control.send(7);
            drop((data, control));
            steps(worker, 20);
            // Both inputs closed and nothing held, but the load is still
            // under way.
            assert_eq!(
                *calls.borrow(),
                vec![Call::Control(0, vec![7]), Call::Complete(0)]
            );
            drop(gate);
        });
    }
}
