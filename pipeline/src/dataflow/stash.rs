//! Holds records by event time until every input's frontier has passed that
//! time, then releases them in time order. Processing each time only once it
//! is complete is what makes router and node decisions deterministic.

use std::collections::BTreeMap;
use timely::dataflow::operators::Capability;
use timely::progress::frontier::MutableAntichain;

/// Records of one input, by time, each time with the capability to emit at it.
#[derive(Debug)]
pub struct TimeStash<D> {
    pending: BTreeMap<u64, (Option<Capability<u64>>, Vec<D>)>,
}

impl<D> Default for TimeStash<D> {
    fn default() -> Self {
        Self {
            pending: BTreeMap::new(),
        }
    }
}

impl<D> TimeStash<D> {
    /// Adds records at `time`; `cap` (when the caller emits at this time) is kept
    /// until the time is released.
    pub fn push(
        &mut self,
        time: u64,
        cap: Option<Capability<u64>>,
        data: impl IntoIterator<Item = D>,
    ) {
        let entry = self
            .pending
            .entry(time)
            .or_insert_with(|| (None, Vec::new()));
        if entry.0.is_none() {
            entry.0 = cap;
        }
        entry.1.extend(data);
    }

    /// The least time held, if any.
    pub fn first_time(&self) -> Option<u64> {
        self.pending.keys().next().copied()
    }

    /// Removes and returns the records at the least time if no frontier can
    /// still deliver data at or before it.
    pub fn pop_complete(
        &mut self,
        frontiers: &[&MutableAntichain<u64>],
    ) -> Option<(u64, Option<Capability<u64>>, Vec<D>)> {
        let time = self.first_time()?;
        if frontiers.iter().any(|f| f.less_equal(&time)) {
            return None;
        }
        let (cap, data) = self.pending.remove(&time)?;
        Some((time, cap, data))
    }

    /// Removes and returns the records at `time`, if any.
    pub fn take(&mut self, time: u64) -> Option<(Option<Capability<u64>>, Vec<D>)> {
        self.pending.remove(&time)
    }

    pub fn is_empty(&self) -> bool {
        self.pending.is_empty()
    }
}
