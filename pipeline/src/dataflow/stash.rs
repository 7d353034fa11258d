//! What an event-time operator holds per time until every input's frontier
//! has passed it: the token that lets it emit at that time (a timely
//! capability in the wrapper, anything in tests), and in `complete` mode the
//! control and data records of the time. Releasing each time only once it
//! is complete, in time order, is what makes router and node decisions
//! deterministic. No timely types here: the wrapper supplies the tokens and
//! says which times the frontiers have passed.

use std::collections::BTreeMap;

/// One held time: its emit token and the records not yet handed over.
#[derive(Debug)]
pub struct Held<K, C, D> {
    pub token: K,
    pub control: Vec<C>,
    pub data: Vec<D>,
}

/// Held times, least first.
#[derive(Debug)]
pub struct TimeStash<K, C, D> {
    pending: BTreeMap<u64, Held<K, C, D>>,
}

impl<K, C, D> Default for TimeStash<K, C, D> {
    fn default() -> Self {
        Self {
            pending: BTreeMap::new(),
        }
    }
}

impl<K, C, D> TimeStash<K, C, D> {
    /// Holds `time` with `token` unless it is held already (the first token
    /// of a time is kept; later ones are dropped, which releases them).
    pub fn hold(&mut self, time: u64, token: K) -> &mut Held<K, C, D> {
        self.pending.entry(time).or_insert_with(|| Held {
            token,
            control: Vec::new(),
            data: Vec::new(),
        })
    }

    /// Holds control records at `time` until it is complete.
    pub fn push_control(&mut self, time: u64, token: K, records: impl IntoIterator<Item = C>) {
        self.hold(time, token).control.extend(records);
    }

    /// Holds data records at `time` until it is complete.
    pub fn push_data(&mut self, time: u64, token: K, records: impl IntoIterator<Item = D>) {
        self.hold(time, token).data.extend(records);
    }

    /// The emit token of a held time.
    pub fn token(&self, time: u64) -> Option<&K> {
        self.pending.get(&time).map(|h| &h.token)
    }

    /// The least time held, if any.
    pub fn first_time(&self) -> Option<u64> {
        self.pending.keys().next().copied()
    }

    /// Removes and returns the least time held if `passed` says every
    /// frontier has passed it.
    pub fn pop_complete(&mut self, passed: impl Fn(u64) -> bool) -> Option<(u64, Held<K, C, D>)> {
        let time = self.first_time()?;
        if !passed(time) {
            return None;
        }
        self.pending.remove_entry(&time)
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }

    /// Times held now (bounded by the times in flight, not by the run).
    pub fn len(&self) -> usize {
        self.pending.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Stash = TimeStash<&'static str, char, u32>;

    #[test]
    fn releases_times_in_order_once_passed_and_keeps_the_first_token() {
        let mut s = Stash::default();
        s.push_data(5, "d5", [50, 51]);
        s.push_control(3, "c3", ['a']);
        s.push_data(3, "d3", [30]);
        s.push_control(5, "c5", ['b']);
        assert_eq!(s.len(), 2);
        // Nothing has passed 3: nothing comes out.
        assert!(s.pop_complete(|t| t < 3).is_none());
        let (t, held) = s.pop_complete(|t| t < 4).unwrap();
        assert_eq!((t, held.token), (3, "c3"));
        assert_eq!((held.control, held.data), (vec!['a'], vec![30]));
        // 5 is held until passed, even though 3 went.
        assert!(s.pop_complete(|t| t < 5).is_none());
        let (t, held) = s.pop_complete(|_| true).unwrap();
        assert_eq!((t, held.token), (5, "d5"));
        assert_eq!((held.control, held.data), (vec!['b'], vec![50, 51]));
        assert!(s.is_empty());
        assert!(s.pop_complete(|_| true).is_none());
    }

    #[test]
    fn a_held_time_without_records_still_comes_out() {
        // Arrival mode holds only the token, to tell the operator when a
        // time is over.
        let mut s = Stash::default();
        s.hold(7, "t7");
        s.hold(7, "again");
        let (t, held) = s.pop_complete(|_| true).unwrap();
        assert_eq!((t, held.token), (7, "t7"));
        assert!(held.control.is_empty() && held.data.is_empty());
    }
}
