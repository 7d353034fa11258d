//! Token-capacity batching with a bounded wait (xGR's xSchedule): which
//! queued requests a node serves next, in how many lanes, or how long it
//! waits for a batch to fill. Pure: the queue is described by kind, tokens
//! and wait, and the answer is indices into it.

/// One queued request as the batcher sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Queued {
    /// Generative retrieval (batched with other retrieve requests) rather
    /// than ranking.
    pub retrieve: bool,
    /// Tokens it adds to a batch (history, candidates, instruction).
    pub tokens: usize,
    /// Wall time it has waited since admission (ms).
    pub waited_ms: f64,
}

/// Batching settings of a node.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchPolicy {
    /// Token budget of one batch; a request larger than it is served alone.
    pub max_tokens: usize,
    /// How long the oldest request may wait for a batch to fill (ms); 0
    /// serves what is there.
    pub max_wait_ms: f64,
    /// Batches served at once (execution lanes).
    pub lanes: usize,
}

/// What to do next.
#[derive(Clone, Debug, PartialEq)]
pub enum Next {
    /// Serve these together: retrieve requests (one group: one prefill and
    /// one beam decode, beside the rank batch when there are two lanes or
    /// more) and rank requests (one batch the node splits over its lanes),
    /// as indices in queue order.
    Serve {
        retrieve: Vec<usize>,
        rank: Vec<usize>,
    },
    /// Nothing yet: call again after this many ms (or when more arrives).
    Wait(f64),
    /// The queue is empty.
    Nothing,
}

impl BatchPolicy {
    /// The next step for `queue` (oldest arrival first).
    /// - One lane: a retrieve request at the front goes with the retrieve
    ///   requests behind it, in queue order up to `max_tokens` (passing
    ///   over rank ones); otherwise rank requests are taken in queue order
    ///   (passing over retrieve ones) up to `max_tokens`.
    /// - Two lanes or more: retrieve requests up to `lanes × max_tokens`
    ///   run beside rank requests up to `lanes × max_tokens` (the node's
    ///   lanes take the retrieve group and the rank batches as they come
    ///   free).
    ///
    /// The first request of a kind is always taken, however large.
    ///
    /// Should the rank requests alone be less than one batch's budget while
    /// the oldest of them has waited less than `max_wait_ms`, the node
    /// waits instead, unless the batch cannot grow (the next queued rank
    /// request does not fit: waiting would only delay it) or, with one
    /// lane, retrieve requests are queued (they are served meanwhile).
    pub fn next(&self, queue: &[Queued]) -> Next {
        let Some(first) = queue.first() else {
            return Next::Nothing;
        };
        let lanes = self.lanes.max(1);
        let budget = self.max_tokens.max(1).saturating_mul(lanes);
        if lanes == 1 && first.retrieve {
            return Next::Serve {
                retrieve: take_kind(queue, true, budget).0,
                rank: Vec::new(),
            };
        }
        let retrieve = take_kind(queue, true, budget).0;
        let (rank, tokens, full) = take_kind(queue, false, budget);
        let oldest = rank.iter().map(|&i| queue[i].waited_ms).fold(0.0, f64::max);
        let short = !full && tokens < self.max_tokens && oldest < self.max_wait_ms;
        if short && retrieve.is_empty() {
            return Next::Wait(self.max_wait_ms - oldest);
        }
        match (lanes, short) {
            // The one lane runs the retrieve group while the rank batch fills.
            (1, true) => Next::Serve {
                retrieve,
                rank: Vec::new(),
            },
            // One lane, a rank front: the rank batch alone.
            (1, false) => Next::Serve {
                retrieve: Vec::new(),
                rank,
            },
            _ => Next::Serve { retrieve, rank },
        }
    }

    /// The whole of `queue` as the steps [`next`](Self::next) would take
    /// from it one after another without waiting (`complete` mode: every
    /// request of an event time is there at once, and results must not
    /// depend on timing). Each step is (retrieve, rank) as indices into
    /// `queue`, each in queue order; every request is in exactly one step.
    pub fn steps(&self, queue: &[Queued]) -> Vec<(Vec<usize>, Vec<usize>)> {
        let now = BatchPolicy {
            max_wait_ms: 0.0,
            ..*self
        };
        let mut left: Vec<usize> = (0..queue.len()).collect();
        let mut steps = Vec::new();
        while !left.is_empty() {
            let view: Vec<Queued> = left.iter().map(|&i| queue[i]).collect();
            let Next::Serve { retrieve, rank } = now.next(&view) else {
                unreachable!("a non-empty queue without a wait always yields a step")
            };
            let mut taken = vec![false; left.len()];
            for &j in retrieve.iter().chain(&rank) {
                taken[j] = true;
            }
            steps.push((
                retrieve.iter().map(|&j| left[j]).collect(),
                rank.iter().map(|&j| left[j]).collect(),
            ));
            left = left
                .into_iter()
                .zip(taken)
                .filter(|&(_, t)| !t)
                .map(|(i, _)| i)
                .collect();
        }
        steps
    }
}

/// Requests of one kind in queue order while their tokens fit `budget`
/// (the first always), their tokens, and whether one of that kind was left
/// out for want of room.
fn take_kind(queue: &[Queued], retrieve: bool, budget: usize) -> (Vec<usize>, usize, bool) {
    let mut taken = Vec::new();
    let mut tokens = 0;
    for (i, q) in queue.iter().enumerate() {
        if q.retrieve != retrieve {
            continue;
        }
        if !taken.is_empty() && tokens + q.tokens > budget {
            return (taken, tokens, true);
        }
        taken.push(i);
        tokens += q.tokens;
    }
    (taken, tokens, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(tokens: usize, waited_ms: f64) -> Queued {
        Queued {
            retrieve: false,
            tokens,
            waited_ms,
        }
    }

    fn retrieve() -> Queued {
        Queued {
            retrieve: true,
            tokens: 100,
            waited_ms: 0.0,
        }
    }

    fn policy(max_tokens: usize, max_wait_ms: f64, lanes: usize) -> BatchPolicy {
        BatchPolicy {
            max_tokens,
            max_wait_ms,
            lanes,
        }
    }

    fn rank_only(rank: Vec<usize>) -> Next {
        Next::Serve {
            retrieve: Vec::new(),
            rank,
        }
    }

    #[test]
    fn rank_requests_fill_a_batch_up_to_the_token_budget() {
        let q = [rank(100, 0.0), rank(100, 0.0), rank(100, 0.0)];
        assert_eq!(policy(250, 0.0, 1).next(&q), rank_only(vec![0, 1]));
        // One request per call.
        assert_eq!(policy(1, 0.0, 1).next(&q), rank_only(vec![0]));
        // Larger than the budget: alone.
        assert_eq!(
            policy(50, 0.0, 1).next(&[rank(80, 0.0), rank(10, 0.0)]),
            rank_only(vec![0])
        );
        assert_eq!(policy(50, 0.0, 1).next(&[]), Next::Nothing);
    }

    #[test]
    fn one_lane_serves_the_retrieve_requests_of_a_retrieve_front_together() {
        let q = [retrieve(), rank(10, 0.0), retrieve(), retrieve()];
        let retrieve_only = |retrieve| Next::Serve {
            retrieve,
            rank: vec![],
        };
        // Retrieve requests of 100 tokens, passing over the rank one.
        assert_eq!(policy(1000, 0.0, 1).next(&q), retrieve_only(vec![0, 2, 3]));
        assert_eq!(policy(250, 0.0, 1).next(&q), retrieve_only(vec![0, 2]));
        // One request per call, or larger than the budget: alone.
        assert_eq!(policy(1, 0.0, 1).next(&q), retrieve_only(vec![0]));
        assert_eq!(policy(50, 0.0, 1).next(&q), retrieve_only(vec![0]));
        // A rank request in front: the rank batch passes over retrieve ones.
        let q = [rank(10, 0.0), retrieve(), rank(10, 0.0)];
        assert_eq!(policy(1000, 0.0, 1).next(&q), rank_only(vec![0, 2]));
    }

    #[test]
    fn with_lanes_retrieve_requests_run_beside_the_rank_batch() {
        let q = [rank(100, 0.0), retrieve(), rank(100, 0.0), retrieve()];
        // Two lanes: retrieve and rank work each up to 2 × max_tokens.
        assert_eq!(
            policy(150, 0.0, 2).next(&q),
            Next::Serve {
                retrieve: vec![1, 3],
                rank: vec![0, 2]
            }
        );
        assert_eq!(
            policy(100, 0.0, 2).next(&q),
            Next::Serve {
                retrieve: vec![1, 3],
                rank: vec![0, 2]
            }
        );
        assert_eq!(
            policy(60, 0.0, 2).next(&q),
            Next::Serve {
                retrieve: vec![1],
                rank: vec![0]
            }
        );
        // No retrieve request: every lane ranks, up to lanes × max_tokens.
        let q = [rank(100, 0.0); 5];
        assert_eq!(policy(200, 0.0, 2).next(&q), rank_only(vec![0, 1, 2, 3]));
    }

    #[test]
    fn steps_cover_the_queue_once_in_the_order_next_takes_them() {
        let q = [
            rank(100, 0.0),
            retrieve(),
            rank(100, 0.0),
            retrieve(),
            rank(100, 0.0),
        ];
        // One lane: the rank front passes over the retrieve requests, which
        // then go as one group; a wait setting changes nothing here.
        assert_eq!(
            policy(1000, 5.0, 1).steps(&q),
            vec![(vec![], vec![0, 2, 4]), (vec![1, 3], vec![])]
        );
        assert_eq!(
            policy(250, 0.0, 1).steps(&q),
            vec![
                (vec![], vec![0, 2]),
                (vec![1, 3], vec![]),
                (vec![], vec![4])
            ]
        );
        // One request per call: every request alone, in queue order.
        let alone: Vec<_> = policy(1, 0.0, 1)
            .steps(&q)
            .into_iter()
            .map(|(r, k)| [r, k].concat())
            .collect();
        assert_eq!(alone, vec![vec![0], vec![1], vec![2], vec![3], vec![4]]);
        // Two lanes: the retrieve group beside each rank batch.
        assert_eq!(
            policy(100, 0.0, 2).steps(&q),
            vec![(vec![1, 3], vec![0, 2]), (vec![], vec![4])]
        );
        assert!(policy(100, 0.0, 1).steps(&[]).is_empty());
    }

    #[test]
    fn a_short_batch_waits_until_its_oldest_request_has_waited_max_wait() {
        let p = policy(300, 5.0, 1);
        assert_eq!(p.next(&[rank(100, 1.0), rank(100, 0.5)]), Next::Wait(4.0));
        assert_eq!(
            p.next(&[rank(100, 5.0), rank(100, 0.5)]),
            rank_only(vec![0, 1])
        );
        // Full: no wait.
        assert_eq!(
            p.next(&[rank(200, 0.0), rank(100, 0.0)]),
            rank_only(vec![0, 1])
        );
        // The next request does not fit: waiting cannot grow the batch.
        assert_eq!(
            p.next(&[rank(150, 0.0), rank(151, 0.0)]),
            rank_only(vec![0])
        );
        assert_eq!(p.next(&[rank(400, 0.0)]), rank_only(vec![0]));
        // One lane: queued retrieve requests are served while the rank
        // batch fills, then the rank batch waits out the rest.
        assert_eq!(
            p.next(&[rank(100, 1.0), retrieve(), retrieve()]),
            Next::Serve {
                retrieve: vec![1, 2],
                rank: vec![]
            }
        );
        assert_eq!(p.next(&[rank(100, 2.0)]), Next::Wait(3.0));
        // A retrieve request to serve: no wait either.
        let p = policy(300, 5.0, 2);
        assert_eq!(
            p.next(&[rank(100, 0.0), retrieve()]),
            Next::Serve {
                retrieve: vec![1],
                rank: vec![0]
            }
        );
    }
}
