//! Deadline shedding: under overload a node answers requests that waited
//! past their deadline with an error instead of spending compute on them.
//! Expired requests are taken out of a batch before any of it is served,
//! and swept out of a node's whole queue before the next batch is formed
//! ([`DeadlineShedder::sweep`]), so a backlog of expired requests is
//! answered at once rather than one batch's worth per step.
//!
//! Two limits: the time since the job admitted a request (`kafka.deadline_ms`)
//! and, optionally, its age since the producer stamped it
//! (`kafka.max_age_ms`), which also counts the time it waited in the broker
//! while the job was behind. Without the second, a job that fell behind
//! serves its whole backlog at full cost, answers nobody waits for any
//! more, and stays behind for as long again.

use std::collections::VecDeque;
use std::time::Duration;

/// When a request entered the job, and whether it may be shed.
pub trait Deadlined {
    /// Wall time of admission, ns since the Unix epoch.
    fn admitted_ns(&self) -> u64;
    /// The producer's stamp (`ts_ms`), ms since the Unix epoch.
    fn produced_ms(&self) -> u64;
    /// A request recovered after a restart: a previous incarnation may have
    /// answered it already, so it is served late rather than shed (a shed
    /// error beside a ranking for one request would contradict it).
    fn recovered(&self) -> bool;
}

/// What the deadline says about a request a node is about to serve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum DeadlineCheck {
    /// In time, or no deadline.
    Serve,
    /// Past the deadline but recovered: served anyway.
    ServeRecovered { waited_ms: f64 },
    /// Past the deadline: answered with a `shed` error record.
    Shed { waited_ms: f64, deadline_ms: u128 },
    /// Older than the age limit since the producer stamped it: answered
    /// with a `stale` error record.
    Stale { age_ms: f64, max_age_ms: u128 },
}

impl DeadlineCheck {
    /// Whether the request is answered with an error record (`Shed` or
    /// `Stale`) instead of served.
    pub fn sheds(&self) -> bool {
        matches!(
            self,
            DeadlineCheck::Shed { .. } | DeadlineCheck::Stale { .. }
        )
    }
}

/// A batch after shedding: what to serve (with its check, `Serve` or
/// `ServeRecovered`) and what was shed, each in the batch's order.
#[derive(Debug)]
pub struct Shedding<R> {
    pub serve: Vec<(R, DeadlineCheck)>,
    pub shed: Vec<(R, DeadlineCheck)>,
}

/// The shedding policy of a node: requests waiting longer than `limit`
/// since admission, or older than `max_age` since they were produced, are
/// shed; `None` never sheds by that limit (replays set neither).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DeadlineShedder {
    limit: Option<Duration>,
    max_age: Option<Duration>,
}

impl DeadlineShedder {
    pub fn new(limit: Option<Duration>) -> Self {
        Self {
            limit,
            max_age: None,
        }
    }

    /// Also sheds requests produced more than `max_age` ago.
    pub fn with_max_age(self, max_age: Option<Duration>) -> Self {
        Self { max_age, ..self }
    }

    /// The decision for one request at wall time `now_ns`.
    pub fn check(&self, request: &impl Deadlined, now_ns: u64) -> DeadlineCheck {
        // A clock that stepped back (or a stamp from the future) never
        // sheds.
        let waited_ns = now_ns.saturating_sub(request.admitted_ns());
        let age_ns = now_ns.saturating_sub(request.produced_ms().saturating_mul(1_000_000));
        let past = |limit: Option<Duration>, ns: u64| limit.filter(|l| ns > l.as_nanos() as u64);
        let verdict = if let Some(limit) = past(self.limit, waited_ns) {
            DeadlineCheck::Shed {
                waited_ms: waited_ns as f64 / 1e6,
                deadline_ms: limit.as_millis(),
            }
        } else if let Some(max_age) = past(self.max_age, age_ns) {
            DeadlineCheck::Stale {
                age_ms: age_ns as f64 / 1e6,
                max_age_ms: max_age.as_millis(),
            }
        } else {
            return DeadlineCheck::Serve;
        };
        match request.recovered() {
            true => DeadlineCheck::ServeRecovered {
                waited_ms: waited_ns as f64 / 1e6,
            },
            false => verdict,
        }
    }

    /// Splits `batch` at wall time `now_ns` before any of it is served.
    pub fn split<R: Deadlined>(&self, batch: Vec<R>, now_ns: u64) -> Shedding<R> {
        let mut out = Shedding {
            serve: Vec::with_capacity(batch.len()),
            shed: Vec::new(),
        };
        for request in batch {
            let check = self.check(&request, now_ns);
            if check.sheds() {
                out.shed.push((request, check));
            } else {
                out.serve.push((request, check));
            }
        }
        out
    }

    /// Whether this policy can shed anything at all (replays set neither
    /// limit).
    pub fn sheds_any(&self) -> bool {
        self.limit.is_some() || self.max_age.is_some()
    }

    /// Takes every request of `queue` that would be shed at wall time
    /// `now_ns` out of it, with its check ([`Self::check`], the same
    /// verdict [`Self::split`] gives), in queue order; the rest keep their
    /// order. `request` finds the request in a queue entry. The queue is
    /// rebuilt only when something is shed.
    pub fn sweep<T, R: Deadlined>(
        &self,
        queue: &mut VecDeque<T>,
        now_ns: u64,
        request: impl Fn(&T) -> &R,
    ) -> Vec<(T, DeadlineCheck)> {
        if !self.sheds_any() {
            return Vec::new();
        }
        let checks: Vec<DeadlineCheck> = queue
            .iter()
            .map(|t| self.check(request(t), now_ns))
            .collect();
        let shed = checks.iter().filter(|c| c.sheds()).count();
        if shed == 0 {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(shed);
        let mut kept = VecDeque::with_capacity(queue.len() - shed);
        for (item, check) in queue.drain(..).zip(checks) {
            if check.sheds() {
                out.push((item, check));
            } else {
                kept.push_back(item);
            }
        }
        *queue = kept;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct Req {
        id: u32,
        admitted_ns: u64,
        recovered: bool,
        produced_ms: u64,
    }

    impl Deadlined for Req {
        fn admitted_ns(&self) -> u64 {
            self.admitted_ns
        }
        fn produced_ms(&self) -> u64 {
            self.produced_ms
        }
        fn recovered(&self) -> bool {
            self.recovered
        }
    }

    fn req(id: u32, admitted_ns: u64, recovered: bool) -> Req {
        Req {
            id,
            admitted_ns,
            recovered,
            // Produced as admitted (to the ms).
            produced_ms: admitted_ns / 1_000_000,
        }
    }

    #[test]
    fn a_recovered_request_past_its_deadline_is_served_and_a_new_one_is_shed() {
        let shedder = DeadlineShedder::new(Some(Duration::from_millis(2_000)));
        let admitted_ns = 1_000_000_000;
        let late = admitted_ns + 2_500_000_000;
        assert_eq!(
            shedder.check(&req(1, admitted_ns, false), late),
            DeadlineCheck::Shed {
                waited_ms: 2_500.0,
                deadline_ms: 2_000
            }
        );
        assert_eq!(
            shedder.check(&req(1, admitted_ns, true), late),
            DeadlineCheck::ServeRecovered { waited_ms: 2_500.0 }
        );
        // In time, or without a deadline, both are simply served.
        let in_time = admitted_ns + 2_000_000_000;
        for recovered in [false, true] {
            let r = req(1, admitted_ns, recovered);
            assert_eq!(shedder.check(&r, in_time), DeadlineCheck::Serve);
            assert_eq!(
                DeadlineShedder::new(None).check(&r, late),
                DeadlineCheck::Serve
            );
            // A clock that stepped back never sheds.
            assert_eq!(shedder.check(&r, 0), DeadlineCheck::Serve);
        }
    }

    #[test]
    fn split_takes_expired_requests_out_of_the_batch_in_order() {
        let shedder = DeadlineShedder::new(Some(Duration::from_millis(10)));
        let now = 100_000_000; // 100 ms
        let batch = vec![
            req(1, 95_000_000, false), // waited 5 ms
            req(2, 50_000_000, false), // 50 ms: shed
            req(3, 40_000_000, true),  // 60 ms, recovered: served late
            req(4, 89_000_000, false), // 11 ms: shed
            req(5, 90_000_000, false), // exactly 10 ms: in time
        ];
        let split = shedder.split(batch, now);
        let ids = |v: &[(Req, DeadlineCheck)]| v.iter().map(|(r, _)| r.id).collect::<Vec<_>>();
        assert_eq!(ids(&split.serve), vec![1, 3, 5]);
        assert_eq!(ids(&split.shed), vec![2, 4]);
        assert_eq!(
            split.serve[1].1,
            DeadlineCheck::ServeRecovered { waited_ms: 60.0 }
        );
        assert!(split.shed.iter().all(|(_, c)| matches!(
            c,
            DeadlineCheck::Shed {
                deadline_ms: 10,
                ..
            }
        )));
        // Without a deadline nothing is shed.
        let all = DeadlineShedder::new(None).split(vec![req(6, 0, false)], u64::MAX);
        assert_eq!((all.serve.len(), all.shed.len()), (1, 0));
    }

    #[test]
    fn sweep_takes_every_expired_request_out_of_the_queue_as_split_would() {
        let shedder = DeadlineShedder::new(Some(Duration::from_millis(10)))
            .with_max_age(Some(Duration::from_millis(1_000)));
        let now = 2_000_000_000; // 2 s
        let mut stale = req(6, now - 1_000_000, false);
        stale.produced_ms = 500; // 1.5 s old
        let make = |stale: Req| {
            VecDeque::from(vec![
                (10, req(1, now - 5_000_000, false)),  // 5 ms: kept
                (10, req(2, now - 50_000_000, false)), // shed
                (11, req(3, now - 60_000_000, true)),  // recovered: kept
                (11, req(4, now - 11_000_000, false)), // shed
                (12, req(5, now - 10_000_000, false)), // exactly 10 ms: kept
                (12, stale),                           // stale
            ])
        };
        let mut queue = make(stale);
        let swept = shedder.sweep(&mut queue, now, |(_, r)| r);
        let swept_ids: Vec<u32> = swept.iter().map(|((_, r), _)| r.id).collect();
        let kept_ids: Vec<u32> = queue.iter().map(|(_, r)| r.id).collect();
        assert_eq!(swept_ids, vec![2, 4, 6]);
        assert_eq!(kept_ids, vec![1, 3, 5]);
        // The same verdicts `split` gives the same requests.
        let mut again = req(6, now - 1_000_000, false);
        again.produced_ms = 500;
        let split = shedder.split(make(again).into_iter().map(|(_, r)| r).collect(), now);
        let checks: Vec<DeadlineCheck> = swept.iter().map(|(_, c)| *c).collect();
        assert_eq!(
            checks,
            split.shed.iter().map(|(_, c)| *c).collect::<Vec<_>>()
        );
        assert!(matches!(checks[2], DeadlineCheck::Stale { .. }));
        // Nothing expired, or no limits: the queue is left as it is.
        assert!(shedder.sweep(&mut queue, now, |(_, r)| r).is_empty());
        assert_eq!(queue.len(), 3);
        let mut all = make(req(7, 0, false));
        assert!(
            DeadlineShedder::default()
                .sweep(&mut all, u64::MAX, |(_, r)| r)
                .is_empty()
        );
        assert_eq!(all.len(), 6);
    }

    #[test]
    fn a_request_produced_too_long_ago_is_shed_however_recently_admitted() {
        let shedder = DeadlineShedder::new(Some(Duration::from_millis(2_000)))
            .with_max_age(Some(Duration::from_millis(1_000)));
        let now = 100_000_000_000; // 100 s
        // Admitted just now, but produced 5 s ago (it waited in the broker).
        let mut stale = req(1, now - 1_000_000, false);
        stale.produced_ms = 95_000;
        assert_eq!(
            shedder.check(&stale, now),
            DeadlineCheck::Stale {
                age_ms: 5_000.0,
                max_age_ms: 1_000
            }
        );
        // Recovered after a restart: served however old (see `recovered`).
        stale.recovered = true;
        assert_eq!(
            shedder.check(&stale, now),
            DeadlineCheck::ServeRecovered { waited_ms: 1.0 }
        );
        // Within the age limit, or a stamp from the future: served.
        let mut fresh = req(2, now - 1_000_000, false);
        fresh.produced_ms = 99_500;
        assert_eq!(shedder.check(&fresh, now), DeadlineCheck::Serve);
        fresh.produced_ms = 200_000;
        assert_eq!(shedder.check(&fresh, now), DeadlineCheck::Serve);
        // Without an age limit the same stale request is served.
        stale.recovered = false;
        assert_eq!(
            DeadlineShedder::new(Some(Duration::from_millis(2_000))).check(&stale, now),
            DeadlineCheck::Serve
        );
        // Past both limits: the deadline is named.
        let mut both = req(3, now - 3_000_000_000, false);
        both.produced_ms = 90_000;
        assert!(matches!(
            shedder.check(&both, now),
            DeadlineCheck::Shed { .. }
        ));
        let split = shedder.split(vec![stale, fresh, both], now);
        assert_eq!(
            split.shed.iter().map(|(r, _)| r.id).collect::<Vec<_>>(),
            vec![1, 3]
        );
    }
}
